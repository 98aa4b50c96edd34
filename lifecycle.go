package awsresilient

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/hashicorp/vault/sdk/logical"
)

// lifecycle owns what the backend's goroutines share about the backend's own
// life: whether this node runs the refresher, whether its work has ended
// (Clean began, or storage said this node lost the active role), the
// context that end cancels, the count of goroutines Clean waits for, and
// the end of Initialize's first pass. Its fields are touched only by its
// methods, below.
//
// A node that lost the active role makes no new STS or IAM call and starts
// no storage write: it learns of the loss from Clean (Vault stepping down,
// sealing, unmounting) or, sooner when Vault is slow to step down, from a
// storage write that fails because this node is no longer the leader
// (fence). So that it learns before it calls rather than after, every STS
// call is preceded by such a write (canStore): on a node cut off from its
// quorum it blocks, then fails. Either ends the work at once (end):
// nothing more starts, every goroutine's context is cancelled, so a call
// on the wire is abandoned and its result never committed, and the
// owners' timers stop.
//
// Its lock is taken last: nothing is called while it is held, so any
// owner's lock may be held while the lifecycle is asked (the rotator's and
// the reconciler's are).
type lifecycle struct {
	// ctx is cancelled by end; every background goroutine gets it.
	ctx    context.Context
	cancel context.CancelFunc
	// wg counts every goroutine run by spawn or run; close waits for it.
	wg sync.WaitGroup

	// startDone is closed (once, by started) when Initialize's first pass
	// (reconciler or, on a standby, mirror warm-up) has ended.
	startDone chan struct{}
	startOnce sync.Once

	// mu guards refreshing, closed, why and stops. wg.Add happens under
	// it too, so that no goroutine is counted after close began to wait.
	mu sync.RWMutex
	// refreshing: the refresher schedules cycles (write-safe node, started).
	refreshing bool
	// closed: the work has ended (end); nothing more is started.
	closed bool
	// why is what ended it: "clean", or "deposed" (storage said this node
	// is no longer the leader).
	why string
	// stops are the owners' own stops (their timers), run once by end.
	stops []func()

	// askMu guards asking: the question to Vault whether this node may
	// write storage that is out now (writeSafe), nil when none is.
	askMu  sync.Mutex
	asking *writeSafeAnswer

	// probeMu guards probing: the write out now that confirms this node
	// can still store an attempt's result (canStore), nil when none is.
	probeMu sync.Mutex
	probing *storeProbe
}

// storeProbe is one write canStore made: err is its outcome once done is
// closed; waiting counts the attempts sharing it.
type storeProbe struct {
	done    chan struct{}
	err     error
	waiting int
}

// errProbeUnfinished is a probe's outcome when it never returned (it
// panicked): the attempts sharing it make no call.
var errProbeUnfinished = errors.New("the storage write before the STS call did not complete")

// writeSafeAnswer is one question writeSafe put to Vault: safe is its
// answer once done is closed; waiting counts the callers sharing it.
type writeSafeAnswer struct {
	done    chan struct{}
	safe    bool
	waiting int
}

// writeSafe answers whether this node may write storage, by ask (the
// backend's WriteSafeReplicationState: two round trips to Vault), with
// every caller that arrives while a question is out sharing its answer
// instead of asking again. A burst of cold reads (100 readers of a role
// with nothing cached) then puts one question to Vault instead of 100,
// each queued behind the others and behind Vault's work on the very
// requests, which delayed the first reader's STS call by 5 to 20 ms
// (BENCHMARKS.md, section d). A shared answer is as fresh as the caller's
// own would be: it was asked while the caller waited. Nothing is kept
// once it is given.
func (l *lifecycle) writeSafe(ask func() bool) bool {
	l.askMu.Lock()
	if a := l.asking; a != nil {
		a.waiting++
		l.askMu.Unlock()
		<-a.done
		return a.safe
	}
	a := &writeSafeAnswer{done: make(chan struct{})}
	l.asking = a
	l.askMu.Unlock()
	defer func() {
		// Even if ask panics: the callers sharing it are let go (with
		// false, so none writes).
		l.askMu.Lock()
		l.asking = nil
		l.askMu.Unlock()
		close(a.done)
	}()
	a.safe = ask()
	return a.safe
}

// sharingWriteSafe is how many callers wait for the question out now.
func (l *lifecycle) sharingWriteSafe() int {
	l.askMu.Lock()
	defer l.askMu.Unlock()
	if l.asking == nil {
		return 0
	}
	return l.asking.waiting
}

// canStore confirms, right before an attempt calls STS, that this node can
// still store what the call fetches, by one storage write (probe, given the
// lifecycle's context); nil means the write committed and the call may go.
//
// writeSafe cannot tell: it tests replication flags only, true on an active
// node that lost its raft quorum and does not know it yet. Only a write
// tells: on such a node raft's Put blocks until the leader lease runs out,
// then fails as "leadership lost" or "node is not the leader", which the
// fence (below) turns into the end of the work, cancelling the attempt's
// context. So no STS call starts after the cut except one whose probe
// committed before it: at most one write's return trip late.
//
// Attempts that arrive while a probe is out share it instead of writing
// again (as writeSafe shares its question): its commit came after they
// asked, or at most its return trip before, so it is as fresh as their
// own would be; nothing is kept once it is given. A herd's attempts,
// paced by sts_rate_limit, then cost one write per call (or fewer when
// calls cluster), and a burst of cold reads of one role none more than
// the one attempt they join. A caller whose ctx ends stops waiting; the
// probe goes on for the others.
func (l *lifecycle) canStore(ctx context.Context, probe func(context.Context) error) error {
	l.probeMu.Lock()
	p := l.probing
	if p != nil {
		p.waiting++
		l.probeMu.Unlock()
		select {
		case <-p.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	} else {
		p = &storeProbe{done: make(chan struct{}), err: errProbeUnfinished}
		l.probing = p
		l.probeMu.Unlock()
		func() {
			defer func() {
				// Even if probe panics: the attempts sharing it are let
				// go (with errProbeUnfinished, so none calls).
				l.probeMu.Lock()
				l.probing = nil
				l.probeMu.Unlock()
				close(p.done)
			}()
			p.err = probe(l.ctx)
		}()
	}
	if p.err == nil && l.isClosed() {
		// The work ended (Clean, or another write refused) while the
		// probe was out: nothing more starts.
		return errShuttingDown
	}
	return p.err
}

// sharingProbe is how many attempts wait for the probe out now.
func (l *lifecycle) sharingProbe() int {
	l.probeMu.Lock()
	defer l.probeMu.Unlock()
	if l.probing == nil {
		return 0
	}
	return l.probing.waiting
}

func newLifecycle() *lifecycle {
	l := &lifecycle{startDone: make(chan struct{})}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l
}

// spawn runs f in a goroutine that close waits for, with the context end
// cancels. It returns false, without running f, once the work has ended.
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
// for, with the context end cancels. It returns false, without running
// f, once the work has ended.
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

// bgContext is the context end cancels, for work that outlives the
// goroutine that starts it (a refresh cycle's own context derives from it).
func (l *lifecycle) bgContext() context.Context { return l.ctx }

// setRunning marks the refresher running on this node, unless the work has
// ended; it reports whether it did.
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

// isClosed reports whether the work has ended (Clean began, or this node
// lost the active role).
func (l *lifecycle) isClosed() bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.closed
}

// onEnd registers an owner's stop (its timers), which end runs once.
func (l *lifecycle) onEnd(stop func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stops = append(l.stops, stop)
}

// end ends the backend's work, once, for why ("clean" or "deposed"):
// nothing more is started, the refresher no longer runs, every
// goroutine's context is cancelled (a call on the wire is abandoned; the
// commits check the context under the store lock, so nothing it fetched
// is written), and the owners' timers are stopped. It does not wait:
// close does. It reports whether this call ended it.
func (l *lifecycle) end(why string) bool {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false
	}
	l.closed, l.refreshing, l.why = true, false, why
	stops := l.stops
	l.mu.Unlock()
	l.cancel()
	for _, stop := range stops {
		stop()
	}
	return true
}

// ended returns what ended the work ("" while it goes on).
func (l *lifecycle) ended() string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.why
}

// close is Clean's: it ends the work (if storage had not already) and
// waits for every goroutine.
func (l *lifecycle) close() {
	l.end("clean")
	l.wg.Wait()
}

// fence returns s with every write watched: a Put or Delete that fails
// because this node is no longer the raft leader (Vault has not stepped
// down yet, or is slow to) ends the work, as Clean would, and calls
// deposed with the error. Reads are not watched: a deposed node still
// reads its own copy.
func (l *lifecycle) fence(s logical.Storage, deposed func(error)) logical.Storage {
	if s == nil {
		return nil
	}
	return &fencedStorage{Storage: s, lost: func(err error) {
		if l.end("deposed") {
			deposed(err)
		}
	}}
}

// fencedStorage is fence's storage.
type fencedStorage struct {
	logical.Storage
	lost func(error)
}

func (f *fencedStorage) Put(ctx context.Context, e *logical.StorageEntry) error {
	err := f.Storage.Put(ctx, e)
	if lostLeadership(err) {
		f.lost(err)
	}
	return err
}

func (f *fencedStorage) Delete(ctx context.Context, key string) error {
	err := f.Storage.Delete(ctx, key)
	if lostLeadership(err) {
		f.lost(err)
	}
	return err
}

// lostLeadership reports whether a storage error says this node is no
// longer the raft leader: hashicorp/raft's ErrNotLeader and
// ErrLeadershipLost, which Vault's raft storage returns as they are and the
// plugin receives as text. Vault steps down on such a loss without
// exception, and a later active term gets a new backend (a new process),
// so this backend's work is over for good.
func lostLeadership(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "node is not the leader") || strings.Contains(msg, "leadership lost while committing log")
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
