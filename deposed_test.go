package awsresilient

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
)

// leaderStorage is Vault's raft storage on a node that may lose its
// leadership: once deposed, every write fails as raft's does on a node
// that is no longer the leader, and the writes still tried are recorded.
type leaderStorage struct {
	logical.Storage
	deposed atomic.Bool
	mu      sync.Mutex
	tried   []string // writes tried once deposed, as "put key" / "delete key"
}

var errNotLeader = errors.New("node is not the leader")

func (l *leaderStorage) write(op, key string) error {
	if !l.deposed.Load() {
		return nil
	}
	l.mu.Lock()
	l.tried = append(l.tried, op+" "+key)
	l.mu.Unlock()
	return errNotLeader
}

func (l *leaderStorage) Put(ctx context.Context, e *logical.StorageEntry) error {
	if err := l.write("put", e.Key); err != nil {
		return err
	}
	return l.Storage.Put(ctx, e)
}

func (l *leaderStorage) Delete(ctx context.Context, key string) error {
	if err := l.write("delete", key); err != nil {
		return err
	}
	return l.Storage.Delete(ctx, key)
}

func (l *leaderStorage) writesTried() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.tried...)
}

// heldSTS holds the AssumeRole calls of one role ARN on the wire until
// released, then completes them whatever their context says: a call
// already sent, whose answer arrives after the node lost its role.
type heldSTS struct {
	stsAPI
	arn     string
	entered chan struct{}
	release chan struct{}
}

func (h *heldSTS) AssumeRole(ctx context.Context, in *sts.AssumeRoleInput, o ...func(*sts.Options)) (*sts.AssumeRoleOutput, error) {
	if in.RoleArn != nil && *in.RoleArn == h.arn {
		h.entered <- struct{}{}
		<-h.release
		ctx = context.WithoutCancel(ctx)
	}
	return h.stsAPI.AssumeRole(ctx, in, o...)
}

// Issue 34: a node whose storage says it is no longer the leader (raft's
// "node is not the leader": a partitioned active node that Vault has not
// stepped down yet) stops at once: no new STS call, no storage write, and
// the answer of a call already on the wire is never written; the refresher
// no longer runs, and Clean, when Vault gets to it, returns at once.
func TestDeposed_StorageRefusalSilencesTheNode(t *testing.T) {
	mem := new(logical.InmemStorage)
	ls := &leaderStorage{Storage: mem}
	const otherARN = "arn:aws:iam::123456789012:role/other"
	held := &heldSTS{arn: otherARN, entered: make(chan struct{}, 1), release: make(chan struct{})}
	var arm atomic.Bool
	f := newFixture(t, fixtureOpts{storage: ls, wrapSTS: func(_ string, api stsAPI) stsAPI {
		return stsFunc(func() stsAPI {
			if arm.Load() {
				return &heldSTS{stsAPI: api, arn: held.arn, entered: held.entered, release: held.release}
			}
			return api
		})
	}})
	// Registered after the fixture's: runs before the backend's cleanup,
	// which would otherwise wait for the held call when the test fails.
	release := sync.OnceFunc(func() { close(held.release) })
	t.Cleanup(release)
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/other", map[string]interface{}{"role_arn": otherARN})
	f.mustReadCreds(testRole)
	f.mustReadCreds("other")
	appDue, _ := f.b.refresher.plannedAt(roleKey(testRole))
	otherDue, _ := f.b.refresher.plannedAt(roleKey("other"))

	// other's refresh goes out and stays on the wire.
	arm.Store(true)
	otherRefresh := f.start(logical.UpdateOperation, "refresh/other")
	select {
	case <-held.entered:
	case <-time.After(clocktest.WaitLimit):
		t.Fatal("other's refresh never called STS")
	}
	// The node loses its leadership; app's refresh is the first to write.
	ls.deposed.Store(true)
	before := len(f.log.all())
	resp, err := f.driven(logical.UpdateOperation, "refresh/"+testRole)
	if err == nil && !resp.IsError() {
		t.Fatalf("refresh/%s on a deposed node succeeded: %v", testRole, resp.Data)
	}
	if got := f.b.life.ended(); got != "deposed" {
		t.Fatalf("after storage refused a write as not the leader, the lifecycle says %q, want deposed", got)
	}
	if f.b.life.running() {
		t.Error("the refresher still runs on the deposed node")
	}
	// Issue 42: its attempt's write before the call (the probe) is
	// refused, so it learns it lost the role before calling, not after.
	if n := len(f.log.all()) - before; n != 0 {
		t.Errorf("app's refresh made %d STS calls on the deposed node, want none: the write before its call was refused", n)
	}
	tried := len(ls.writesTried())

	// The call on the wire answers now: its credential is never written.
	release()
	<-otherRefresh.done
	// No timer is left to start anything (the plan's, the reconciler's, a
	// rotation's): every role falls due, and expires, and nothing calls.
	f.clock.WaitUntil(t, f.clock.Settled(func() bool { return f.clock.Pending() == 0 }),
		func() string { return "timers still armed on the deposed node" })
	f.clock.AdvanceTo(later(appDue, otherDue).Add(15 * time.Minute))
	// The call log sees other's held call when it is let go (the hold is
	// outside it): app's attempt and that one, nothing after.
	// other's held call and nothing else.
	if n := len(f.log.all()) - before; n != 1 {
		t.Errorf("the deposed node made %d STS calls after it knew, want none: %v", n-1, f.log.all()[before:])
	}
	if late := ls.writesTried()[tried:]; len(late) > 0 {
		t.Errorf("the deposed node tried storage writes after it knew: %v", late)
	}
	if c := cached(t, mem, "other"); c == nil || c.AccessKey == "" {
		t.Fatal("other's first credential is gone")
	} else if got := f.emu.Calls(); len(got) > 0 {
		last := got[len(got)-1]
		if last.IssuedKeyID == c.AccessKey {
			t.Errorf("the answer of the call on the wire (%s) was written by the deposed node", last.IssuedKeyID)
		}
	}
	// Clean, when Vault gets to it, does not wait for anything.
	done := make(chan struct{})
	go func() { f.b.Cleanup(context.Background()); close(done) }()
	select {
	case <-done:
	case <-time.After(clocktest.WaitLimit):
		t.Fatal("Clean on the deposed node did not return")
	}
}

// stsFunc builds the STS client at each call, so that a test can switch
// the wrapper while the backend holds the client.
type stsFunc func() stsAPI

func (f stsFunc) AssumeRole(ctx context.Context, in *sts.AssumeRoleInput, o ...func(*sts.Options)) (*sts.AssumeRoleOutput, error) {
	return f().AssumeRole(ctx, in, o...)
}

func (f stsFunc) GetSessionToken(ctx context.Context, in *sts.GetSessionTokenInput, o ...func(*sts.Options)) (*sts.GetSessionTokenOutput, error) {
	return f().GetSessionToken(ctx, in, o...)
}

func (f stsFunc) GetFederationToken(ctx context.Context, in *sts.GetFederationTokenInput, o ...func(*sts.Options)) (*sts.GetFederationTokenOutput, error) {
	return f().GetFederationToken(ctx, in, o...)
}

// Issue 34: a rotation on a node that loses the active role during its
// verification makes no more IAM calls and writes nothing: the new key
// stays in IAM and on record (config/rotation's pending key, written
// before), for the active node's reconciler to delete. (Clean alone, on a
// node that still holds the lock, still deletes it:
// TestRotation_CleanDuringVerificationDeletesTheNewKey.)
func TestDeposed_RotationLeavesItsKeyOnRecord(t *testing.T) {
	mem := new(logical.InmemStorage)
	ls := &leaderStorage{Storage: mem}
	f := rotationFixture(t, fixtureOpts{storage: ls})
	f.mustReadCreds(testRole)
	f.emu.SetIAMPropagation(time.Hour)
	rotation := f.start(logical.UpdateOperation, "config/rotate-root")
	waitFor(t, "the rotation to sleep in its verification", func() bool { _, ok := f.clock.NextSleeper(); return ok && len(userKeys(t, f.emu)) == 2 })
	keys := userKeys(t, f.emu)
	iamCalls := len(f.emu.Calls())

	ls.deposed.Store(true)
	deposedAt := len(f.emu.Calls())
	// The first write after the loss (a refresh's probe before its STS
	// call) tells the node;
	// the refresh's cycle and the rotation end at once, with no clock
	// driven.
	refresh := f.start(logical.UpdateOperation, "refresh/"+testRole)
	for _, p := range []*pending{refresh, rotation} {
		select {
		case <-p.done:
		case <-time.After(clocktest.WaitLimit):
			t.Fatal("the refresh or the rotation went on on the deposed node: it did not learn it lost the role")
		}
	}
	if rotation.r.err == nil && !rotation.r.resp.IsError() {
		t.Fatalf("the rotation succeeded on a deposed node: %v", rotation.r.resp.Data)
	}
	if got := userKeys(t, f.emu); strings.Join(got, ",") != strings.Join(keys, ",") {
		t.Errorf("the deposed node changed IAM's keys from %v to %v", keys, got)
	}
	for i, c := range f.emu.Calls()[iamCalls:] {
		if c.Action != "AssumeRole" || iamCalls+i >= deposedAt {
			t.Errorf("the deposed node called %s after it lost the role", c.Action)
		}
	}
	for _, w := range ls.writesTried() {
		if w != "put "+probePath {
			t.Errorf("the deposed node tried to write %s after it knew", w)
		}
	}
	if st := rotationRecord(t, mem); st.PendingKeyID != keys[1] {
		t.Errorf("config/rotation names %q to delete, want the new key %s", st.PendingKeyID, keys[1])
	}
}

// Issue 42: writeSafe (the sdk's WriteSafeReplicationState) tests
// replication flags only, so it says yes on an active node that lost its
// quorum. A node whose storage refuses writes as not the leader must still
// make no STS call, neither for a cold read nor for a refresh: each attempt
// writes before it calls (refresher.canStore), and the refused write ends
// the work first. The reader gets a 503 saying this node is not active,
// which Vault's clients retry (the new active node serves it).
func TestDeposed_RefusedWriteComesBeforeAnySTSCall(t *testing.T) {
	for _, first := range []string{"cold read", "refresher"} {
		t.Run(first, func(t *testing.T) {
			mem := new(logical.InmemStorage)
			ls := &leaderStorage{Storage: mem}
			f := newFixture(t, fixtureOpts{storage: ls})
			f.mustReadCreds(testRole)
			mustDo(t, f.b, f.s, logical.CreateOperation, "roles/other", map[string]interface{}{"role_arn": "arn:aws:iam::123456789012:role/other"})
			due, _ := f.b.refresher.plannedAt(roleKey(testRole))
			before := len(f.log.all())

			ls.deposed.Store(true)
			if first == "refresher" {
				// app's scheduled refresh is the first to write.
				f.drainFlights()
				f.clock.AdvanceTo(due)
				f.clock.DriveUntil(t, f.nextFlight().done)
				if got := f.b.life.ended(); got != "deposed" {
					t.Fatalf("after app's refresh on a node refusing writes, the lifecycle says %q, want deposed", got)
				}
			}
			// other has nothing cached: a cold read.
			resp, err := f.readCreds("other")
			wantCoded(t, resp, err, http.StatusServiceUnavailable, `role "other"`, "no longer the active node")
			if got := f.b.life.ended(); got != "deposed" {
				t.Fatalf("the lifecycle says %q, want deposed", got)
			}
			if calls := f.log.all()[before:]; len(calls) > 0 {
				t.Errorf("a node refusing writes made %d STS calls, want none: %v", len(calls), calls)
			}
			if tried := ls.writesTried(); len(tried) != 1 || tried[0] != "put "+probePath {
				t.Errorf("writes tried on the deposed node: %v, want the one probe before the first call", tried)
			}
			// Nothing calls later either: every role falls due and expires.
			f.clock.AdvanceTo(due.Add(15 * time.Minute))
			if calls := f.log.all()[before:]; len(calls) > 0 {
				t.Errorf("the deposed node made %d STS calls later, want none: %v", len(calls), calls)
			}
		})
	}
}

// cutStorage is raft storage on an active node cut off from its quorum:
// once cut, a write blocks (raft's Apply waits for a commit that cannot
// come) until lose is closed, when it fails as hashicorp/raft's does when
// the leader lease runs out and the node steps down.
type cutStorage struct {
	logical.Storage
	cut     atomic.Bool
	blocked chan string // each write that blocks, by key
	lose    chan struct{}
	mu      sync.Mutex
	tried   []string
}

var errLeadershipLost = errors.New("leadership lost while committing log")

func (c *cutStorage) write(key string) error {
	if !c.cut.Load() {
		return nil
	}
	c.mu.Lock()
	c.tried = append(c.tried, key)
	c.mu.Unlock()
	c.blocked <- key
	<-c.lose
	return errLeadershipLost
}

func (c *cutStorage) Put(ctx context.Context, e *logical.StorageEntry) error {
	if err := c.write(e.Key); err != nil {
		return err
	}
	return c.Storage.Put(ctx, e)
}

func (c *cutStorage) Delete(ctx context.Context, key string) error {
	if err := c.write(key); err != nil {
		return err
	}
	return c.Storage.Delete(ctx, key)
}

func (c *cutStorage) writesTried() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.tried...)
}

// Issue 42: after the cut (quorum lost, the node not yet told), a write
// blocks rather than fails. No STS call is made while it blocks: a cold
// read's attempt and the refresher's wait on the one write before their
// calls (sharing it), and the time passing meanwhile starts nothing. When
// the write fails as leadership lost, none is made after.
func TestDeposed_CutNodeCallsNothingWhileItsWriteBlocks(t *testing.T) {
	mem := new(logical.InmemStorage)
	cs := &cutStorage{Storage: mem, blocked: make(chan string, 100), lose: make(chan struct{})}
	f := newFixture(t, fixtureOpts{storage: cs})
	lose := sync.OnceFunc(func() { close(cs.lose) })
	t.Cleanup(lose) // before the backend's cleanup, which waits for the write
	f.mustReadCreds(testRole)
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/other", map[string]interface{}{"role_arn": "arn:aws:iam::123456789012:role/other"})
	due, _ := f.b.refresher.plannedAt(roleKey(testRole))
	before := len(f.log.all())

	cs.cut.Store(true)
	read := f.start(logical.ReadOperation, "creds/other")
	select {
	case key := <-cs.blocked:
		if key != probePath {
			t.Fatalf("the cold read's first write after the cut was %q, want the probe", key)
		}
	case <-time.After(clocktest.WaitLimit):
		t.Fatal("the cold read's attempt never wrote before its call")
	}
	// app falls due: its attempt joins the write out rather than call.
	f.drainFlights()
	f.clock.AdvanceTo(due)
	refresh := f.nextFlight()
	waitFor(t, "app's attempt to wait on the probe out", func() bool {
		if next, ok := f.clock.NextSleeper(); ok {
			f.clock.AdvanceTo(next)
		}
		return f.b.life.sharingProbe() == 1
	})
	// The cut lasts (raft's leader lease, Vault's slowness): nothing calls.
	f.clock.Advance(20 * time.Second)
	if calls := f.log.all()[before:]; len(calls) > 0 {
		t.Fatalf("the cut-off node made %d STS calls while its write blocked, want none: %v", len(calls), calls)
	}
	select {
	case <-read.done:
		t.Fatalf("the cold read answered while the write blocked: %v %v", read.r.resp, read.r.err)
	default:
	}

	// The leader lease runs out: the write fails.
	lose()
	<-read.done
	wantCoded(t, read.r.resp, read.r.err, http.StatusServiceUnavailable, "no longer the active node")
	select {
	case <-refresh.done:
	case <-time.After(clocktest.WaitLimit):
		t.Fatal("app's refresh cycle went on after its write failed as leadership lost")
	}
	if got := f.b.life.ended(); got != "deposed" {
		t.Fatalf("the lifecycle says %q after a write failed as leadership lost, want deposed", got)
	}
	f.clock.AdvanceTo(due.Add(15 * time.Minute))
	if calls := f.log.all()[before:]; len(calls) > 0 {
		t.Errorf("the deposed node made %d STS calls, want none: %v", len(calls), calls)
	}
	if tried := cs.writesTried(); len(tried) != 1 {
		t.Errorf("writes tried after the cut: %v, want the one shared probe", tried)
	}
}

// Issue 42: a rotation's verification is the first to learn: its next
// sts:GetCallerIdentity waits for the probe write, which the deposed node's
// storage refuses, so it calls nothing more; the key stays on record.
func TestDeposed_RotationVerificationCallsNothingOnceWritesAreRefused(t *testing.T) {
	mem := new(logical.InmemStorage)
	ls := &leaderStorage{Storage: mem}
	f := rotationFixture(t, fixtureOpts{storage: ls})
	f.mustReadCreds(testRole)
	f.emu.SetIAMPropagation(time.Hour)
	rotation := f.start(logical.UpdateOperation, "config/rotate-root")
	waitFor(t, "the rotation to sleep in its verification", func() bool { _, ok := f.clock.NextSleeper(); return ok && len(userKeys(t, f.emu)) == 2 })
	keys := userKeys(t, f.emu)
	ls.deposed.Store(true)
	calls := len(f.emu.Calls())
	// The verification's next attempt comes: no refresh is due before it.
	f.clock.DriveUntil(t, rotation.done)
	if rotation.r.err == nil && !rotation.r.resp.IsError() {
		t.Fatalf("the rotation succeeded on a deposed node: %v", rotation.r.resp.Data)
	}
	for _, c := range f.emu.Calls()[calls:] {
		t.Errorf("the deposed node called %s after its storage refused writes", c.Action)
	}
	if got := f.b.life.ended(); got != "deposed" {
		t.Fatalf("the lifecycle says %q, want deposed", got)
	}
	if got := userKeys(t, f.emu); strings.Join(got, ",") != strings.Join(keys, ",") {
		t.Errorf("the deposed node changed IAM's keys from %v to %v", keys, got)
	}
	if tried := ls.writesTried(); len(tried) != 1 || tried[0] != "put "+probePath {
		t.Errorf("writes tried on the deposed node: %v, want the one probe", tried)
	}
	if st := rotationRecord(t, mem); st.PendingKeyID != keys[1] {
		t.Errorf("config/rotation names %q to delete, want the new key %s", st.PendingKeyID, keys[1])
	}
}

// Issue 42: a rotation started on a node whose storage refuses writes
// makes no IAM call at all: its first call (iam:GetUser) waits for the
// probe write, which is refused.
func TestDeposed_RotationMakesNoIAMCallOnceWritesAreRefused(t *testing.T) {
	mem := new(logical.InmemStorage)
	ls := &leaderStorage{Storage: mem}
	f := rotationFixture(t, fixtureOpts{storage: ls})
	f.mustReadCreds(testRole)
	keys := userKeys(t, f.emu)
	calls := len(f.emu.Calls())
	ls.deposed.Store(true)
	resp, err := f.driven(logical.UpdateOperation, "config/rotate-root")
	if err == nil && !resp.IsError() {
		t.Fatalf("the rotation succeeded on a deposed node: %v", resp.Data)
	}
	for _, c := range f.emu.Calls()[calls:] {
		t.Errorf("the deposed node called %s after its storage refused writes", c.Action)
	}
	if got := f.b.life.ended(); got != "deposed" {
		t.Fatalf("the lifecycle says %q, want deposed", got)
	}
	if got := userKeys(t, f.emu); strings.Join(got, ",") != strings.Join(keys, ",") {
		t.Errorf("the deposed node changed IAM's keys from %v to %v", keys, got)
	}
}
