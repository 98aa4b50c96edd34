package awsresilient

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
)

// slowRoleStorage advances the fake clock by step on every read of a role's
// own entries (roles/, cache/, status/), as a loaded raft store costs time
// per read, and counts them.
type slowRoleStorage struct {
	logical.Storage
	clock *clocktest.Fake
	step  time.Duration
	mu    sync.Mutex
	reads int
}

func (s *slowRoleStorage) Get(ctx context.Context, key string) (*logical.StorageEntry, error) {
	if strings.HasPrefix(key, rolePrefix) || strings.HasPrefix(key, cachePrefix) || strings.HasPrefix(key, statusPrefix) {
		s.mu.Lock()
		s.reads++
		s.mu.Unlock()
		s.clock.Advance(s.step)
	}
	return s.Storage.Get(ctx, key)
}

func (s *slowRoleStorage) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.reads
	s.reads = 0
	return n
}

// Right after a start (a reload, a restart, a failover) the schedule index
// has planned every warm role while the first pass, which reads every role,
// is still running. A scrape above metrics_max_roles then answers
// aws_resilient_roles_scheduled from the plan after reading roles for
// scrapeLoadBudget at most (by the backend's clock), counts the rest in
// aws_resilient_roles_unloaded, and leaves them out of the other
// aggregates; at 100 000 roles a scrape that read them all answered a
// minute after the start (BENCHMARKS.md, section f). With per-role series
// (metrics_max_roles at least the roles) a scrape still reads every role.
func TestMetrics_ScrapeAfterStartAnswersFromThePlan(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, refresh: map[string]interface{}{"metrics_max_roles": 0}})
	const n = 40
	for i := range n {
		name := fmt.Sprintf("r%02d", i)
		mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+name, map[string]interface{}{"role_arn": testRoleARN})
		f.mustReadCreds(name)
	}
	f.b.Cleanup(context.Background())

	// The new backend's first pass is held listing roles: nothing is
	// mirrored, every role is planned from the index.
	g := &gateStorage{Storage: f.s, gate: make(chan struct{}), listing: make(chan struct{})}
	b2 := startBackendOn(t, f, g)
	waitFor(t, "every role to be planned from the index", func() bool { return b2.refresher.rolesInPlan() == n })

	// Three reads per role at 20 ms each: the budget of 200 ms reads four
	// roles (the check is made before each role, at 0, 60, 120, 180 ms).
	const step = 20 * time.Millisecond
	slow := &slowRoleStorage{Storage: f.s, clock: f.clock, step: step}
	perRole := int(scrapeLoadBudget/(3*step)) + 1
	unloaded := float64(n)
	for scrape := 1; unloaded > 0; scrape++ {
		sc := scrapeMetrics(t, b2, slow, "")
		if reads := slow.count(); reads > 3*perRole {
			t.Fatalf("scrape %d read %d role entries with the first pass held, want at most %d (scrapeLoadBudget %v, %v a read)", scrape, reads, 3*perRole, scrapeLoadBudget, step)
		}
		sc.want("aws_resilient_roles_scheduled", nil, n)
		sc.want("aws_resilient_roles_defined", nil, n)
		left := sc.must("aws_resilient_roles_unloaded", nil)
		if want := max(0, unloaded-float64(perRole)); left != want {
			t.Fatalf("scrape %d: %v roles unloaded, want %v (each scrape reads a budget more)", scrape, left, want)
		}
		var tallied float64
		for _, st := range roleStateNames {
			tallied += sc.must("aws_resilient_roles", map[string]string{"state": st})
		}
		if tallied != n-left {
			t.Fatalf("scrape %d: %v roles in the state aggregate, want the %v read", scrape, tallied, n-left)
		}
		if left > 0 && !strings.Contains(sc.body, "roles not yet read on this node") {
			t.Fatalf("scrape %d leaves %v roles out without saying so:\n%s", scrape, left, sc.body)
		}
		unloaded = left
		if scrape > n {
			t.Fatal("the scrapes never read every role")
		}
	}
	sc := scrapeMetrics(t, b2, slow, "")
	sc.want("aws_resilient_roles_cached", nil, n)
	sc.want("aws_resilient_roles_unloaded", nil, 0)

	// With per-role series every role is read, whatever it costs: the
	// budget does not change what metrics_max_roles promises.
	for i := range n {
		b2.state.forget(roleKey(fmt.Sprintf("r%02d", i)), false)
	}
	mustDo(t, b2, f.s, logical.UpdateOperation, "config/refresh", map[string]interface{}{"metrics_max_roles": n})
	sc = scrapeMetrics(t, b2, slow, "")
	if reads := slow.count(); reads < n {
		t.Fatalf("a scrape with per-role series read %d role entries, want every role's", reads)
	}
	sc.want("aws_resilient_roles_unloaded", nil, 0)
	sc.want("aws_resilient_role_series_exported", nil, 1)
	for i := range n {
		sc.must("aws_resilient_role_failed_cycles", map[string]string{"role": fmt.Sprintf("r%02d", i)})
	}
	close(g.gate)
	if err := b2.life.waitStarted(context.Background()); err != nil {
		t.Fatal(err)
	}
}
