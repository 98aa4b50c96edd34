package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/logical"

	awsresilient "github.com/aws-resilient/vault-plugin-secrets-aws-resilient"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// entities is Vault's identity store as EntityInfo sees it: userpass
// entities, named by Vault (entity_<8 hex>) with the user name as alias,
// as section g's are.
type entities struct {
	logical.SystemView
	mu   sync.Mutex
	ents map[string]*logical.Entity
}

func (v *entities) EntityInfo(id string) (*logical.Entity, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.ents[id], nil
}

// TestHeapPerEntity measures the plugin's live heap per entity credential,
// in process, with n entities (AWS_RESILIENT_HEAP_ENTITIES, e.g. 1000 or
// 10000) each reading 10 entity-scoped roles, and writes a heap profile of
// the end state to AWS_RESILIENT_HEAP_PROFILE: the detail behind section
// g's RSS per entity credential. It runs only when both are set.
//
//	AWS_RESILIENT_HEAP_ENTITIES=1000 AWS_RESILIENT_HEAP_PROFILE=/tmp/ent.pprof go test -run TestHeapPerEntity -v ./internal/bench/
//	go tool pprof -sample_index=inuse_space -top /tmp/ent.pprof
func TestHeapPerEntity(t *testing.T) {
	out := os.Getenv("AWS_RESILIENT_HEAP_PROFILE")
	n, _ := strconv.Atoi(os.Getenv("AWS_RESILIENT_HEAP_ENTITIES"))
	if out == "" || n == 0 {
		t.Skip("set AWS_RESILIENT_HEAP_ENTITIES=<n> and AWS_RESILIENT_HEAP_PROFILE=<file> to run")
	}
	const roles = 10
	runtime.MemProfileRate = 1024
	emu, err := stsemu.Start(stsemu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	ctx := context.Background()
	conf := logical.TestBackendConfig()
	sys := &entities{SystemView: conf.System, ents: map[string]*logical.Entity{}}
	conf.System = sys
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
	do := func(op logical.Operation, path string, data map[string]any) {
		t.Helper()
		if err := p.do(op, path, data); err != nil {
			t.Fatal(err)
		}
	}
	do(logical.UpdateOperation, "config/root", map[string]any{"access_key": "AKIAIOSFODNN7EXAMPLE",
		"secret_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "sts_endpoint": emu.URL()})
	do(logical.UpdateOperation, "config/refresh", map[string]any{"sts_rate_limit": 0})
	for r := 0; r < roles; r++ {
		do(logical.UpdateOperation, fmt.Sprintf("roles/g-role-%02d", r), map[string]any{"credential_type": "assumed_role",
			"cache_scope": "entity", "max_entities": n, "role_arn": fmt.Sprintf("arn:aws:iam::123456789012:role/g-role-%02d", r)})
	}
	type user struct{ id, display string }
	users := make([]user, n)
	for i := range users {
		id := fmt.Sprintf("0b7e1f52-%04x-4000-8000-%012x", i>>16, i)
		name := fmt.Sprintf("g-user-%04d", i)
		sys.ents[id] = &logical.Entity{ID: id, Name: fmt.Sprintf("entity_%08x", i),
			Aliases: []*logical.Alias{{MountAccessor: "auth_userpass_9f8e7d6c", MountType: "userpass", Name: name}}}
		users[i] = user{id, "userpass-" + name}
	}
	live := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	h0 := live()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n*roles; i += 64 {
				u := users[i/roles]
				resp, err := b.HandleRequest(ctx, &logical.Request{Operation: logical.ReadOperation, Path: fmt.Sprintf("creds/g-role-%02d", i%roles),
					Storage: storage, EntityID: u.id, DisplayName: u.display})
				if err == nil && resp.IsError() {
					err = resp.Error()
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	h1 := live()
	var stored int
	keys, _ := storage.List(ctx, "")
	for range keys {
		stored++
	}
	t.Logf("%d entities x %d roles: live heap +%d B per entity credential (in-memory storage included), %d top-level storage prefixes; fill %s",
		n, roles, (h1-h0)/uint64(n*roles), stored, time.Since(start))
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		t.Fatal(err)
	}
}
