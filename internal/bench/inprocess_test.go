package bench

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/logical"

	awsresilient "github.com/aws-resilient/vault-plugin-secrets-aws-resilient"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// inProcess is the plugin as a backend in this process, with in-memory
// storage and config/root pointing at an STS emulator of its own. Both are
// stopped when the test ends.
type inProcess struct {
	b       logical.Backend
	storage logical.Storage
	emu     *stsemu.Emulator
}

func newInProcess(t testing.TB) *inProcess { return newInProcessWith(t, nil) }

// newInProcessWith is newInProcess with the backend's system view wrapped
// by system (nil: as logical.TestBackendConfig has it): Vault's identity
// store, for one, as EntityInfo sees it.
func newInProcessWith(t testing.TB, system func(logical.SystemView) logical.SystemView) *inProcess {
	t.Helper()
	emu, err := stsemu.Start(stsemu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	ctx := context.Background()
	conf := logical.TestBackendConfig()
	if system != nil {
		conf.System = system(conf.System)
	}
	storage := new(logical.InmemStorage)
	conf.StorageView = storage
	conf.Logger = hclog.NewNullLogger()
	b, err := awsresilient.Factory(ctx, conf)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Initialize(ctx, &logical.InitializationRequest{Storage: storage}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Cleanup(ctx) })
	p := &inProcess{b: b, storage: storage, emu: emu}
	if err := p.do(logical.UpdateOperation, "config/root", map[string]any{"access_key": "AKIAIOSFODNN7EXAMPLE",
		"secret_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "sts_endpoint": emu.URL()}); err != nil {
		t.Fatal(err)
	}
	return p
}

// do makes one request; an error response is an error.
func (p *inProcess) do(op logical.Operation, path string, data map[string]any) error {
	resp, err := p.b.HandleRequest(context.Background(), &logical.Request{Operation: op, Path: path, Data: data, Storage: p.storage})
	if err == nil && resp != nil && resp.IsError() {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, path, err)
	}
	return nil
}

// read makes one read with the given entity (none when entityID is ""); an
// error response is an error.
func (p *inProcess) read(path, entityID, displayName string) error {
	resp, err := p.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: path,
		Storage: p.storage, EntityID: entityID, DisplayName: displayName})
	if err == nil && resp != nil && resp.IsError() {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}

// liveHeap is the live heap after two GCs.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// must makes one request and fails the test on an error.
func (p *inProcess) must(t testing.TB, op logical.Operation, path string, data map[string]any) {
	t.Helper()
	if err := p.do(op, path, data); err != nil {
		t.Fatal(err)
	}
}
