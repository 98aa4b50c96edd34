// Package root is a fixture: fake_clocks 2, mechanisms 2.
package root

// fakeClock counts.
type fakeClock struct{}

// FakeTimer and clockFake do not match [Ff]ake*[Cc]lock.
type (
	FakeTimer struct{}
	clockFake struct{}
)
