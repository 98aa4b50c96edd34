package clocktest

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestFakeFiresInDeadlineOrderAtTheirDeadlines(t *testing.T) {
	c := NewFake(t0)
	got := make(chan string, 4)
	record := func(name string) func() { return func() { got <- name + "@" + c.Now().Sub(t0).String() } }
	c.AfterFunc(3*time.Second, record("c"))
	c.AfterFunc(time.Second, record("a"))
	c.AfterFunc(time.Second, record("b")) // same deadline: creation order
	stopped := c.AfterFunc(2*time.Second, record("x"))
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop: true once while pending, then false")
	}
	ch := c.NewTimer(2 * time.Second)
	if c.Sleepers() != 1 || c.Pending() != 4 {
		t.Fatalf("sleepers %d pending %d, want 1 and 4", c.Sleepers(), c.Pending())
	}
	if at, _ := c.NextSleeper(); !at.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("next sleeper at %v", at)
	}
	c.AdvanceTo(t0.Add(10 * time.Second))
	if at := <-ch.C(); !at.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("timer fired with %v, want its deadline", at)
	}
	c.WaitUntil(t, func() bool { return c.Busy() == 0 && len(got) == 3 }, func() string { return "callbacks" })
	// Callbacks run in goroutines of their own; each read the clock while
	// the fake held it at its own deadline or later, so only the set of
	// names is exact.
	seen := map[string]bool{}
	for range 3 {
		seen[(<-got)[:1]] = true
	}
	if !seen["a"] || !seen["b"] || !seen["c"] || seen["x"] {
		t.Fatalf("fired %v, want a, b and c", seen)
	}
	if !c.Now().Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("now %v, want t0+10s", c.Now())
	}
	if _, ok := c.Next(); ok {
		t.Fatal("a timer is left")
	}
}

func TestFakeZeroDurationFiresAtOnce(t *testing.T) {
	c := NewFake(t0)
	tm := c.NewTimer(0)
	select {
	case at := <-tm.C():
		if !at.Equal(t0) {
			t.Fatalf("fired with %v", at)
		}
	default:
		t.Fatal("a zero-duration timer did not fire at once")
	}
	if c.Pending() != 0 {
		t.Fatal("a fired timer is still pending")
	}
}

func TestFakeAdvanceToNextAndBlockUntil(t *testing.T) {
	c := NewFake(t0)
	go func() { <-c.NewTimer(time.Minute).C() }()
	c.BlockUntil(t, 1)
	c.BlockUntilAfter(t, t0.Add(59*time.Second))
	if at := c.AdvanceToNext(t); !at.Equal(t0.Add(time.Minute)) {
		t.Fatalf("advanced to %v", at)
	}
}

func TestFakeDriveUntilFiresSleepersOnly(t *testing.T) {
	c := NewFake(t0)
	c.AfterFunc(time.Hour, func() { t.Error("the scheduled callback fired") })
	done := make(chan struct{})
	go func() {
		<-c.NewTimer(time.Second).C()
		<-c.NewTimer(time.Second).C()
		close(done)
	}()
	c.DriveUntil(t, done)
	if !c.Now().Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("now %v, want t0+2s: driven from sleeper to sleeper", c.Now())
	}
}

// TestSettled: a condition holds only when no callback ran while it was
// evaluated: not when one runs, nor when one fired and finished during it.
func TestSettled(t *testing.T) {
	c := NewFake(t0)
	if !c.Settled(func() bool { return true })() {
		t.Fatal("no callback anywhere: want settled")
	}
	if c.Settled(func() bool { return false })() {
		t.Fatal("the condition itself is false: want not settled")
	}
	release := make(chan struct{})
	c.AfterFunc(0, func() { <-release })
	if c.Settled(func() bool { return true })() {
		t.Fatal("a callback is running: want not settled")
	}
	close(release)
	c.WaitUntil(t, func() bool { return c.Busy() == 0 }, func() string { return "the callback" })
	// A callback that fires and returns while the condition is read.
	during := c.Settled(func() bool {
		done := make(chan struct{})
		c.AfterFunc(0, func() { close(done) })
		<-done
		c.WaitUntil(t, func() bool { return c.Busy() == 0 }, func() string { return "the callback" })
		return true
	})
	if during() {
		t.Fatal("a callback ran while the condition was read: want not settled")
	}
}
