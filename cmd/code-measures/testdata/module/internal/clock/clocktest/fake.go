package clocktest

// Fake counts: its package is named clocktest.
type Fake struct{}

// Timer does not.
type Timer struct{}
