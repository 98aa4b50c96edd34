package awsresilient

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
	"github.com/hashicorp/vault/sdk/logical"
)

// lifecycleStorage stops one storage call inside storage until the test lets it
// go, and records every call made after the test marked storage closed (as
// Vault's storage is once Clean has returned and the mount is gone).
type lifecycleStorage struct {
	logical.Storage

	mu       sync.Mutex
	op, key  string               // the call to stop
	armed    bool                 // the stop is still to happen
	entered  chan context.Context // receives the stopped call's context
	released chan struct{}        // closed to let it go
	release  func()               // closes released, once
	closed   bool                 // set by the test once Clean returned
	late     []string             // calls after closed, as "op key"
	// onCall, when set before any request, runs inside every call.
	onCall func(op, key string)
}

func newLifecycleStorage(s logical.Storage) *lifecycleStorage {
	g := &lifecycleStorage{Storage: s, entered: make(chan context.Context, 1), released: make(chan struct{})}
	var once sync.Once
	g.release = func() { once.Do(func() { close(g.released) }) }
	return g
}

// stopAt arms the stop: the next call of op on key waits inside storage.
func (g *lifecycleStorage) stopAt(op, key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.op, g.key, g.armed = op, key, true
}

// markClosed records that Clean has returned: storage is no longer the
// mount's, and any call from now on is a defect.
func (g *lifecycleStorage) markClosed() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
}

func (g *lifecycleStorage) lateCalls() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.late...)
}

// call records a call after closed and stops the armed one.
func (g *lifecycleStorage) call(ctx context.Context, op, key string) {
	g.mu.Lock()
	if g.closed {
		g.late = append(g.late, op+" "+key)
	}
	stop := g.armed && op == g.op && key == g.key
	if stop {
		g.armed = false
	}
	g.mu.Unlock()
	if g.onCall != nil {
		g.onCall(op, key)
	}
	if stop {
		g.entered <- ctx
		<-g.released
	}
}

func (g *lifecycleStorage) Get(ctx context.Context, key string) (*logical.StorageEntry, error) {
	g.call(ctx, "get", key)
	return g.Storage.Get(ctx, key)
}

func (g *lifecycleStorage) Put(ctx context.Context, e *logical.StorageEntry) error {
	g.call(ctx, "put", e.Key)
	return g.Storage.Put(ctx, e)
}

func (g *lifecycleStorage) Delete(ctx context.Context, key string) error {
	g.call(ctx, "delete", key)
	return g.Storage.Delete(ctx, key)
}

func (g *lifecycleStorage) List(ctx context.Context, prefix string) ([]string, error) {
	g.call(ctx, "list", prefix)
	return g.Storage.List(ctx, prefix)
}

// Defect 7: Vault runs the periodic function on its own goroutine with its
// own request context, so Clean neither cancelled nor waited for a
// reconciler pass under way, and the pass went on writing storage after
// Clean had returned. Now Clean cancels the pass and waits for it, the
// cancelled pass writes nothing more, and a pass that starts after Clean
// began does nothing at all.
func TestClean_StopsAndWaitsForThePeriodicPass(t *testing.T) {
	mem := new(logical.InmemStorage)
	g := newLifecycleStorage(mem)
	b, s := newTestBackend(t, testOpts{clock: newFakeClock(time.Now().Truncate(time.Second)), storage: g})
	t.Cleanup(g.release) // before the backend's own cleanup, should the test fail early
	// A status without a role: the pass deletes it, after it has listed
	// status/, which is where it is stopped.
	putJSON(t, mem, statusPrefix+"ghost", &statusEntry{})
	g.stopAt("list", statusPrefix)

	passDone := make(chan error, 1)
	go func() {
		_, err := b.HandleRequest(context.Background(), &logical.Request{Operation: logical.RollbackOperation, Storage: s})
		passDone <- err
	}()
	var passCtx context.Context
	select {
	case passCtx = <-g.entered:
	case <-time.After(clocktest.WaitLimit):
		t.Fatal("the periodic pass never listed status/")
	}

	cleaned := make(chan struct{})
	go func() {
		b.Cleanup(context.Background())
		close(cleaned)
	}()
	select {
	case <-cleaned:
		g.markClosed()
		t.Errorf("Clean returned while the periodic pass was still inside storage")
	case <-passCtx.Done():
		// Clean cancelled the pass; the pass is still inside storage, so
		// Clean must still be waiting for it.
		select {
		case <-cleaned:
			t.Errorf("Clean returned while the periodic pass was still inside storage")
		default:
		}
	case <-time.After(clocktest.WaitLimit):
		t.Fatal("Clean neither returned nor cancelled the periodic pass")
	}

	g.release()
	select {
	case <-cleaned:
	case <-time.After(clocktest.WaitLimit):
		t.Fatal("Clean did not return after the periodic pass left storage")
	}
	g.markClosed()
	select {
	case err := <-passDone:
		if err != nil {
			t.Errorf("periodic request: %v", err)
		}
	case <-time.After(clocktest.WaitLimit):
		t.Fatal("the periodic request did not return")
	}
	if late := g.lateCalls(); len(late) > 0 {
		t.Errorf("storage calls after Clean returned: %v", late)
	}
	if e, err := mem.Get(context.Background(), statusPrefix+"ghost"); err != nil || e == nil {
		t.Errorf("the pass that Clean cancelled went on and deleted status/ghost (err %v)", err)
	}

	// A pass that Vault starts after Clean does nothing, not even a read.
	n := len(g.lateCalls())
	if _, err := b.HandleRequest(context.Background(), &logical.Request{Operation: logical.RollbackOperation, Storage: s}); err != nil {
		t.Fatalf("periodic request after Clean: %v", err)
	}
	if late := g.lateCalls()[n:]; len(late) > 0 {
		t.Errorf("a periodic pass after Clean called storage: %v", late)
	}
}

// The lifecycle alone: close cancels the context of the goroutines it
// counted and waits for them; once closed, nothing more starts and the
// refresher is no longer running.
func TestLifecycle_CloseCancelsWaitsAndRefuses(t *testing.T) {
	l := newLifecycle()
	if !l.setRunning() || !l.running() {
		t.Fatal("setRunning on a fresh lifecycle did not mark the refresher running")
	}
	entered, release := make(chan context.Context), make(chan struct{})
	returned := make(chan struct{})
	if !l.spawn(func(ctx context.Context) {
		defer close(returned)
		entered <- ctx
		<-release
	}) {
		t.Fatal("spawn refused before close")
	}
	ctx := <-entered

	closed := make(chan struct{})
	go func() {
		l.close()
		close(closed)
	}()
	select {
	case <-ctx.Done():
	case <-time.After(clocktest.WaitLimit):
		t.Fatal("close did not cancel the running goroutine's context")
	}
	select {
	case <-closed:
		t.Fatal("close returned while a goroutine it counted was still running")
	default:
	}
	close(release)
	select {
	case <-closed:
	case <-time.After(clocktest.WaitLimit):
		t.Fatal("close did not return after the goroutine ended")
	}
	select {
	case <-returned:
	default:
		t.Fatal("close returned before the goroutine did")
	}

	if l.running() {
		t.Error("running after close")
	}
	if l.setRunning() || l.running() {
		t.Error("setRunning after close marked the refresher running")
	}
	ran := false
	if l.spawn(func(context.Context) { ran = true }) {
		t.Error("spawn after close accepted f")
	}
	if l.run(func(context.Context) { ran = true }) {
		t.Error("run after close accepted f")
	}
	l.close() // a second Clean returns at once
	if ran {
		t.Error("f ran after close")
	}
}

// TestLifecycle_WriteSafeSharesTheQuestionOut: callers that arrive while a
// question to Vault is out share its answer (one question for a burst of
// cold readers); the answer is not kept: the next caller asks again.
func TestLifecycle_WriteSafeSharesTheQuestionOut(t *testing.T) {
	for _, answer := range []bool{true, false} {
		l := newLifecycle()
		var asked atomic.Int32
		entered, release := make(chan struct{}), make(chan struct{})
		ask := func() bool {
			if asked.Add(1) == 1 {
				close(entered)
				<-release
			}
			return answer
		}
		const joiners = 9
		got := make(chan bool, joiners+1)
		go func() { got <- l.writeSafe(ask) }()
		<-entered
		for range joiners {
			go func() { got <- l.writeSafe(ask) }()
		}
		waitFor(t, "the joiners waiting on the question out", func() bool { return l.sharingWriteSafe() == joiners })
		close(release)
		for range joiners + 1 {
			if g := <-got; g != answer {
				t.Fatalf("answer %v, want %v", g, answer)
			}
		}
		if n := asked.Load(); n != 1 {
			t.Fatalf("asked Vault %d times for %d callers arriving together, want 1", n, joiners+1)
		}
		if l.writeSafe(ask) != answer || asked.Load() != 2 {
			t.Fatalf("a caller after the answer: asked %d times in all, want 2 (an answer is not kept)", asked.Load())
		}
	}
}

// TestLifecycle_CanStoreSharesTheWriteOut (issue 42): attempts that reach
// their call while a probe write is out share its outcome (one write for a
// batch); the outcome is not kept (the next attempt writes again); a
// caller whose context ends stops waiting; a probe that panics lets its
// sharers go with an error (no call); and once the work ended while the
// write was out, a committed write admits nothing.
func TestLifecycle_CanStoreSharesTheWriteOut(t *testing.T) {
	refused := errors.New("node is not the leader")
	for _, outcome := range []error{nil, refused} {
		l := newLifecycle()
		var writes atomic.Int32
		entered, release := make(chan struct{}), make(chan struct{})
		probe := func(ctx context.Context) error {
			if ctx != l.bgContext() {
				t.Error("the probe does not run on the lifecycle's context: one caller leaving would fail it for all")
			}
			if writes.Add(1) == 1 {
				close(entered)
				<-release
			}
			return outcome
		}
		const joiners = 9
		got := make(chan error, joiners+1)
		go func() { got <- l.canStore(context.Background(), probe) }()
		<-entered
		for range joiners {
			go func() { got <- l.canStore(context.Background(), probe) }()
		}
		gone, leave := context.WithCancel(context.Background())
		left := make(chan error, 1)
		go func() { left <- l.canStore(gone, probe) }()
		waitFor(t, "the joiners waiting on the write out", func() bool { return l.sharingProbe() == joiners+1 })
		leave()
		if err := <-left; !errors.Is(err, context.Canceled) {
			t.Fatalf("a caller whose context ended got %v, want context.Canceled", err)
		}
		close(release)
		for range joiners + 1 {
			if err := <-got; err != outcome {
				t.Fatalf("outcome %v, want %v", err, outcome)
			}
		}
		if n := writes.Load(); n != 1 {
			t.Fatalf("%d writes for %d attempts arriving together, want 1", n, joiners+2)
		}
		if err := l.canStore(context.Background(), probe); err != outcome || writes.Load() != 2 {
			t.Fatalf("an attempt after the outcome: %d writes in all, want 2 (an outcome is not kept)", writes.Load())
		}
	}

	t.Run("panic", func(t *testing.T) {
		l := newLifecycle()
		entered, release := make(chan struct{}), make(chan struct{})
		go func() {
			defer func() { _ = recover() }()
			_ = l.canStore(context.Background(), func(context.Context) error {
				close(entered)
				<-release
				panic("probe")
			})
		}()
		<-entered
		got := make(chan error, 1)
		go func() { got <- l.canStore(context.Background(), nil) }()
		waitFor(t, "the joiner", func() bool { return l.sharingProbe() == 1 })
		close(release)
		if err := <-got; err == nil {
			t.Fatal("a probe that panicked admitted its sharer's call")
		}
	})

	t.Run("ended while out", func(t *testing.T) {
		l := newLifecycle()
		err := l.canStore(context.Background(), func(context.Context) error {
			l.end("deposed") // another write refused meanwhile
			return nil
		})
		if !errors.Is(err, errShuttingDown) {
			t.Fatalf("a write committed after the work ended admitted a call: %v", err)
		}
	})
}
