package hidden

// In a hidden directory: skipped.
type fakeClock struct{}
