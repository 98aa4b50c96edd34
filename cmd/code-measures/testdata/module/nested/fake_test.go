package nested

// In a nested module: skipped.
type fakeClock struct{}
