package x

// Under testdata: skipped.
type fakeClock struct{}
