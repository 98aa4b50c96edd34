package bench

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/testtool"
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
	sys := &entities{ents: map[string]*logical.Entity{}}
	p := newInProcessWith(t, func(v logical.SystemView) logical.SystemView { sys.SystemView = v; return sys })
	p.must(t, logical.UpdateOperation, "config/refresh", map[string]any{"sts_rate_limit": 0})
	for r := 0; r < roles; r++ {
		p.must(t, logical.UpdateOperation, fmt.Sprintf("roles/g-role-%02d", r), map[string]any{"credential_type": "assumed_role",
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
	h0 := liveHeap()
	start := time.Now()
	testtool.Parallel(t, n*roles, 64, func(i int) error {
		u := users[i/roles]
		return p.read(fmt.Sprintf("creds/g-role-%02d", i%roles), u.id, u.display)
	})
	h1 := liveHeap()
	t.Logf("%d entities x %d roles: live heap +%d B per entity credential (in-memory storage included: the profile tells the plugin's share apart); fill %s",
		n, roles, (h1-h0)/uint64(n*roles), time.Since(start))
	testtool.WriteHeapProfile(t, out)
}
