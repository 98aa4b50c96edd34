package awsresilient

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/logical"
)

// gateStorage holds every List of roles/ until gate is closed, and says on
// listing when the first one began.
type gateStorage struct {
	logical.Storage
	gate    chan struct{}
	listing chan struct{}
	once    sync.Once
}

func (g *gateStorage) List(ctx context.Context, prefix string) ([]string, error) {
	if prefix == rolePrefix {
		g.once.Do(func() { close(g.listing) })
		select {
		case <-g.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Storage.List(ctx, prefix)
}

// Vault waits on Initialize before the mount serves anything, so the first
// pass over every role must not hold it: Initialize returns while the pass
// is still listing roles, a cached credential is served meanwhile (from
// storage, with no STS call), and the role is scheduled once the pass ends.
func TestInitializeDoesNotWaitForTheFirstPass(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	want := f.mustReadCreds(testRole).Data["access_key"]
	plan, _ := f.b.scheduledAt(testRole)
	calls := len(f.log.all())

	g := &gateStorage{Storage: f.s, gate: make(chan struct{}), listing: make(chan struct{})}
	config := logical.TestBackendConfig()
	config.StorageView = g
	config.Logger = hclog.NewNullLogger()
	b, err := newBackendWith(context.Background(), config, backendOptions{clock: f.clock, rand: randMin, wrapSTS: f.log.wrap})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Cleanup(context.Background()) })
	returned := make(chan error, 1)
	go func() { returned <- b.Initialize(context.Background(), &logical.InitializationRequest{Storage: g}) }()
	select {
	case err := <-returned:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Initialize waits for the first pass, which is held listing roles")
	}
	<-g.listing

	resp, err := b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: g})
	if err != nil || resp.IsError() {
		t.Fatalf("creds read during the first pass: %v %v", resp, err)
	}
	if got := resp.Data["access_key"]; got != want {
		t.Fatalf("served %v during the first pass, want the cached %v", got, want)
	}
	if n := len(f.log.all()); n != calls {
		t.Fatalf("%d STS calls during the first pass, want none", n-calls)
	}
	if _, ok := b.scheduledAt(testRole); ok {
		t.Fatal("the role is scheduled before the pass that schedules it has listed it")
	}

	close(g.gate)
	if err := b.waitStarted(context.Background()); err != nil {
		t.Fatal(err)
	}
	if at, ok := b.scheduledAt(testRole); !ok || !at.Equal(plan) {
		t.Fatalf("after the first pass the role is scheduled at %v (%v), want %v, its recorded plan", at, ok, plan)
	}
}
