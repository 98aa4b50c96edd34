package other

// Fake is not in a package named clocktest: not counted.
type Fake struct{}
