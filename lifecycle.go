package awsresilient

import (
	"context"
	"sync"
)

// lifecycle owns what the backend's goroutines share about the backend's own
// life: whether this node runs the refresher, whether Clean has begun, the
// context Clean cancels, the count of goroutines Clean waits for, and the
// end of Initialize's first pass. Its fields are touched only by its
// methods, below.
//
// Its lock is taken last: nothing is called while it is held, so any
// owner's lock may be held while the lifecycle is asked (the rotator's and
// the reconciler's are).
type lifecycle struct {
	// ctx is cancelled by close; every background goroutine gets it.
	ctx    context.Context
	cancel context.CancelFunc
	// wg counts every goroutine run by spawn or run; close waits for it.
	wg sync.WaitGroup

	// startDone is closed (once, by started) when Initialize's first pass
	// (reconciler or, on a standby, mirror warm-up) has ended.
	startDone chan struct{}
	startOnce sync.Once

	// mu guards refreshing and closed. wg.Add happens under it too, so
	// that no goroutine is counted after close began to wait.
	mu sync.RWMutex
	// refreshing: the refresher schedules cycles (write-safe node, started).
	refreshing bool
	// closed: Clean has begun; nothing more is started.
	closed bool
}

func newLifecycle() *lifecycle {
	l := &lifecycle{startDone: make(chan struct{})}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l
}

// spawn runs f in a goroutine that close waits for, with the context close
// cancels. It returns false, without running f, once Clean has begun.
func (l *lifecycle) spawn(f func(ctx context.Context)) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f(l.ctx)
	}()
	return true
}

// run runs f in the calling goroutine, counted among those close waits
// for, with the context close cancels. It returns false, without running
// f, once Clean has begun.
func (l *lifecycle) run(f func(ctx context.Context)) bool {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false
	}
	l.wg.Add(1)
	l.mu.Unlock()
	defer l.wg.Done()
	f(l.ctx)
	return true
}

// bgContext is the context close cancels, for work that outlives the
// goroutine that starts it (a refresh cycle's own context derives from it).
func (l *lifecycle) bgContext() context.Context { return l.ctx }

// setRunning marks the refresher running on this node, unless Clean has
// begun; it reports whether it did.
func (l *lifecycle) setRunning() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.refreshing = true
	return true
}

// running reports whether this node runs the refresher.
func (l *lifecycle) running() bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.refreshing
}

// isClosed reports whether Clean has begun.
func (l *lifecycle) isClosed() bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.closed
}

// shut is Clean's first step: nothing more is started, and the refresher
// no longer runs. Goroutines already started go on until close.
func (l *lifecycle) shut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.refreshing = false
}

// close shuts the lifecycle (if Clean has not already), cancels the
// context every background goroutine got, and waits for them all.
func (l *lifecycle) close() {
	l.shut()
	l.cancel()
	l.wg.Wait()
}

// started records that Initialize's first pass has ended (or never began).
func (l *lifecycle) started() {
	l.startOnce.Do(func() { close(l.startDone) })
}

// waitStarted waits until the first pass that Initialize began has ended
// (successfully or not), or ctx is done.
func (l *lifecycle) waitStarted(ctx context.Context) error {
	select {
	case <-l.startDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
