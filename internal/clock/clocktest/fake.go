// Package clocktest has the one fake clock every test of the module uses: a
// clock.Clock that moves only when the test says so. Timers fire in deadline
// order as it advances; a test waits with BlockUntil (or WaitUntil, or
// DriveUntil) until the goroutines under test have reached their timers, so
// schedules are driven exactly and without real sleeps.
package clocktest

import (
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
)

// WaitLimit bounds how long (in real time) a test waits for goroutines to
// reach a state before it fails. It is a deadlock guard, never a way to let
// behaviour happen: every wait below returns as soon as its condition holds.
const WaitLimit = 20 * time.Second

// Fake is a clock.Clock that moves only when the test says so. It is safe
// for concurrent use. The zero value is not usable: call NewFake.
type Fake struct {
	// busy counts AfterFunc callbacks that fired and have not returned;
	// started counts every one that fired.
	busy    atomic.Int32
	started atomic.Uint64
	mu      sync.Mutex
	now     time.Time
	seq     int
	timers  []*fakeTimer
	changed chan struct{} // closed and replaced whenever timers change
}

type fakeTimer struct {
	c        *Fake
	deadline time.Time
	seq      int
	ch       chan time.Time
	fn       func()
}

// NewFake returns a fake clock reading start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, changed: make(chan struct{})}
}

// Now returns the fake time.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer returns a timer whose channel receives once the clock reaches
// now+d.
func (c *Fake) NewTimer(d time.Duration) clock.Timer {
	return c.add(d, nil)
}

// AfterFunc runs f in its own goroutine once the clock reaches now+d.
func (c *Fake) AfterFunc(d time.Duration, f func()) clock.Timer {
	return c.add(d, f)
}

func (c *Fake) add(d time.Duration, fn func()) *fakeTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, deadline: c.now.Add(d), fn: fn}
	if fn == nil {
		t.ch = make(chan time.Time, 1)
	}
	if d <= 0 {
		t.fire(c.now)
		return t
	}
	c.seq++
	t.seq = c.seq
	c.timers = append(c.timers, t)
	c.notifyLocked()
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range c.timers {
		if x == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			c.notifyLocked()
			return true
		}
	}
	return false
}

func (t *fakeTimer) fire(now time.Time) {
	if t.fn != nil {
		t.c.started.Add(1)
		t.c.busy.Add(1)
		go func() {
			defer func() {
				t.c.busy.Add(-1)
				t.c.Poke() // waiters may be waiting for the callback to end
			}()
			t.fn()
		}()
		return
	}
	t.ch <- now
}

func (c *Fake) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Busy returns the number of AfterFunc callbacks that fired and have not
// returned yet.
func (c *Fake) Busy() int { return int(c.busy.Load()) }

// Settled wraps cond for WaitUntil so that it holds only when no callback
// ran while cond was evaluated: none was running when it began or when it
// ended, and none fired in between. A cond that reads several things at
// different moments (how many roles are planned, how many sleep) could
// otherwise see one of them before a callback and another after it, and
// hold in a state that never was.
func (c *Fake) Settled(cond func() bool) func() bool {
	return func() bool {
		before := c.started.Load()
		if c.busy.Load() != 0 {
			return false
		}
		ok := cond()
		return ok && c.busy.Load() == 0 && c.started.Load() == before
	}
}

// Poke wakes every waiter so that it checks its condition again. Code under
// test that changes state a waiter looks at without touching the clock's
// timers (a plan change) calls it through a hook.
func (c *Fake) Poke() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.notifyLocked()
}

// Sleepers returns the number of timers a goroutine is blocked on
// (NewTimer), leaving scheduled callbacks (AfterFunc) aside.
func (c *Fake) Sleepers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, x := range c.timers {
		if x.fn == nil {
			n++
		}
	}
	return n
}

// WaitUntil waits until cond holds. Unlike BlockUntil, cond runs without the
// clock's lock, so it may look at the backend; it is checked again after
// every change of the clock and every Poke.
func (c *Fake) WaitUntil(tb testing.TB, cond func() bool, describe func() string) {
	tb.Helper()
	deadline := time.NewTimer(WaitLimit)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		ch := c.changed
		c.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			tb.Fatalf("fake clock: gave up waiting: %s", describe())
		}
	}
}

// Pending returns the number of timers waiting to fire.
func (c *Fake) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Next returns the earliest pending deadline.
func (c *Fake) Next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.timers) == 0 {
		return time.Time{}, false
	}
	return c.earliestLocked().deadline, true
}

// NextSleeper returns the earliest deadline of a timer that a goroutine is
// blocked on (NewTimer), leaving scheduled callbacks (AfterFunc) aside.
func (c *Fake) NextSleeper() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var at time.Time
	found := false
	for _, x := range c.timers {
		if x.fn == nil && (!found || x.deadline.Before(at)) {
			at, found = x.deadline, true
		}
	}
	return at, found
}

func (c *Fake) earliestLocked() *fakeTimer {
	sort.Slice(c.timers, func(i, j int) bool {
		if !c.timers[i].deadline.Equal(c.timers[j].deadline) {
			return c.timers[i].deadline.Before(c.timers[j].deadline)
		}
		return c.timers[i].seq < c.timers[j].seq
	})
	return c.timers[0]
}

// AdvanceTo moves the clock to t, firing every timer due by then in
// deadline order, with the clock at each timer's deadline as it fires.
func (c *Fake) AdvanceTo(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.timers) > 0 {
		next := c.earliestLocked()
		if next.deadline.After(t) {
			break
		}
		c.timers = c.timers[1:]
		if next.deadline.After(c.now) {
			c.now = next.deadline
		}
		next.fire(c.now)
	}
	if t.After(c.now) {
		c.now = t
	}
	c.notifyLocked()
}

// Advance moves the clock forward by d.
func (c *Fake) Advance(d time.Duration) { c.AdvanceTo(c.Now().Add(d)) }

// AdvanceToNext moves the clock to the earliest pending deadline and fires
// the timers due then. It returns that deadline.
func (c *Fake) AdvanceToNext(tb testing.TB) time.Time {
	tb.Helper()
	next, ok := c.Next()
	if !ok {
		tb.Fatal("fake clock: no pending timer to advance to")
	}
	c.AdvanceTo(next)
	return next
}

// BlockUntil waits until at least n timers are pending.
func (c *Fake) BlockUntil(tb testing.TB, n int) {
	tb.Helper()
	c.waitFor(tb, func() bool { return len(c.timers) >= n }, func() string {
		return "timers pending: " + strconv.Itoa(len(c.timers)) + ", want " + strconv.Itoa(n)
	})
}

// BlockUntilAfter waits until a timer is pending with a deadline after t.
func (c *Fake) BlockUntilAfter(tb testing.TB, t time.Time) {
	tb.Helper()
	c.waitFor(tb, func() bool {
		for _, x := range c.timers {
			if x.deadline.After(t) {
				return true
			}
		}
		return false
	}, func() string { return "no timer after " + t.String() })
}

// waitFor waits, without polling, until cond (called with c.mu held) holds.
func (c *Fake) waitFor(tb testing.TB, cond func() bool, describe func() string) {
	tb.Helper()
	deadline := time.NewTimer(WaitLimit)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		if cond() {
			c.mu.Unlock()
			return
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			c.mu.Lock()
			msg := describe()
			c.mu.Unlock()
			tb.Fatalf("fake clock: gave up waiting: %s", msg)
		}
	}
}

// DriveUntil advances the clock from one sleeping goroutine's timer to the
// next until done is closed. It only ever fires timers that a goroutine is
// blocked on (NewTimer: attempt times, rate-limit slots), never a scheduled
// refresh (AfterFunc): the test keeps control of when background cycles run,
// and fails if reaching the next sleeper would fire one.
func (c *Fake) DriveUntil(tb testing.TB, done <-chan struct{}) {
	tb.Helper()
	deadline := time.NewTimer(WaitLimit)
	defer deadline.Stop()
	for {
		select {
		case <-done:
			return
		default:
		}
		c.mu.Lock()
		var sleeper, scheduled *fakeTimer
		if len(c.timers) > 0 {
			c.earliestLocked()
			for _, x := range c.timers {
				if x.fn == nil {
					sleeper = x
					break
				}
				if scheduled == nil {
					scheduled = x
				}
			}
		}
		ch := c.changed
		c.mu.Unlock()
		if sleeper != nil {
			if scheduled != nil && !scheduled.deadline.After(sleeper.deadline) {
				tb.Fatalf("fake clock: advancing to %s would fire the refresh scheduled at %s", sleeper.deadline, scheduled.deadline)
			}
			c.AdvanceTo(sleeper.deadline)
			continue
		}
		select {
		case <-done:
			return
		case <-ch:
		case <-deadline.C:
			tb.Fatal("fake clock: gave up driving: the goroutine under test neither finished nor slept")
		}
	}
}
