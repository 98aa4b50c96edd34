package awsresilient

import (
	"context"
	"errors"
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
