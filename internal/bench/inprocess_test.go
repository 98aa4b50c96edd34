package bench

import (
	"context"
	"fmt"
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

func newInProcess(t testing.TB) *inProcess {
	t.Helper()
	emu, err := stsemu.Start(stsemu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	ctx := context.Background()
	conf := logical.TestBackendConfig()
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
