//go:build testhooks

package awsresilient

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"
)

// TestBackend_TestHooksEnv checks that, in a binary built with -tags
// testhooks, test/storage-faults exists only with AWS_RESILIENT_TEST_HOOKS=1
// in the plugin's environment.
func TestBackend_TestHooksEnv(t *testing.T) {
	tests := []struct {
		env  string
		want bool
	}{
		{"", false},
		{"0", false},
		{"1", true},
	}
	for _, tc := range tests {
		t.Run("env="+tc.env, func(t *testing.T) {
			t.Setenv(testHooksEnv, tc.env)
			b, s := getTestBackend(t)
			resp, err := do(t, b, s, logical.UpdateOperation, "test/storage-faults", map[string]interface{}{"cache_write_failures": 2})
			if !tc.want {
				if err != logical.ErrUnsupportedPath {
					t.Fatalf("got resp=%v err=%v, want unsupported path", resp, err)
				}
				return
			}
			if err != nil || resp.IsError() {
				t.Fatalf("err=%v resp=%v", err, respErr(resp))
			}
			got := mustDo(t, b, s, logical.ReadOperation, "test/storage-faults", nil).Data["cache_write_failures"]
			if got != 2 {
				t.Fatalf("cache_write_failures = %v, want 2", got)
			}
			for _, bad := range []interface{}{-1, 1001, "x"} {
				resp, err := do(t, b, s, logical.UpdateOperation, "test/storage-faults", map[string]interface{}{"cache_write_failures": bad})
				wantBadRequest(t, resp, err)
			}
			resp, err = do(t, b, s, logical.UpdateOperation, "test/storage-faults", map[string]interface{}{})
			wantBadRequest(t, resp, err, "cache_write_failures is required")
		})
	}
}

// TestHooks_StorageFailureThenSuccess checks that a cache write failed by
// the hook costs one attempt and the next attempt stores the credential.
func TestHooks_StorageFailureThenSuccess(t *testing.T) {
	f := newFixture(t, fixtureOpts{testHooks: true})
	mustDo(t, f.b, f.s, logical.UpdateOperation, "test/storage-faults", map[string]interface{}{"cache_write_failures": 1})
	wantOneAttemptLost(t, f)
	if got := mustDo(t, f.b, f.s, logical.ReadOperation, "test/storage-faults", nil).Data["cache_write_failures"]; got != 0 {
		t.Fatalf("cache_write_failures = %v after use, want 0", got)
	}
}

// TestHooks_FailRefreshConfigReadsOutlivesTheBackend: the hook that fails
// config/refresh reads is kept in storage, so a backend created after it
// was set (as a plugin reload creates one, in a new process) cannot start
// its refresher: the scrape answers, with aws_resilient_refresher_running 0.
// Cleared through the new backend, the reconciler's retry starts it.
func TestHooks_FailRefreshConfigReadsOutlivesTheBackend(t *testing.T) {
	f := newFixture(t, fixtureOpts{testHooks: true})
	f.mustReadCreds(testRole)
	mustDo(t, f.b, f.s, logical.UpdateOperation, "test/storage-faults", map[string]interface{}{"fail_refresh_config_reads": true})
	f.b.Cleanup(context.Background())

	g, _ := newTestBackend(t, testOpts{clock: f.clock, rand: randMin, storage: f.s, wrapSTS: f.log.wrap, testHooks: true})
	if got := mustDo(t, g, f.s, logical.ReadOperation, "test/storage-faults", nil).Data["fail_refresh_config_reads"]; got != true {
		t.Fatalf("fail_refresh_config_reads = %v on the new backend, want true", got)
	}
	f.clock.Advance(maxStartBackoff) // a retry, failing too
	if g.life.running() {
		t.Fatal("the refresher started although config/refresh cannot be read")
	}
	sc := scrapeMetrics(t, g, f.s, "")
	sc.want("aws_resilient_refresher_running", nil, 0)
	sc.want("aws_resilient_roles_defined", nil, 1)
	// A request's own reads are not the background's: config/refresh reads.
	mustDo(t, g, f.s, logical.ReadOperation, "config/refresh", nil)

	mustDo(t, g, f.s, logical.UpdateOperation, "test/storage-faults", map[string]interface{}{"fail_refresh_config_reads": false})
	f.clock.Advance(maxStartBackoff)
	waitFor(t, "the refresher to start", g.life.running)
	if _, ok := g.refresher.plannedAt(roleKey(testRole)); !ok {
		t.Fatal("the refresher started without planning the role")
	}
}

// TestHooks_HostClockOffset: AWS_RESILIENT_TEST_HOST_CLOCK_OFFSET gives the
// plugin's backend a host clock that far off, under a host name of its
// own (clock/<host>); unset, the real clock and host.
func TestHooks_HostClockOffset(t *testing.T) {
	t.Setenv(testHostClockOffsetEnv, "-4m")
	b, err := FactoryWithVersion(DevVersion)(t.Context(), logical.TestBackendConfig())
	if err != nil {
		t.Fatal(err)
	}
	be := b.(*backend)
	if d := time.Until(be.clock.Now()); d > -4*time.Minute+time.Second || d < -4*time.Minute-time.Second {
		t.Fatalf("the backend's clock reads %s from the real one, want -4m", d)
	}
	if h := be.clients.awsTime().host; !strings.HasSuffix(h, "-clock-4m0s") {
		t.Fatalf("host %q: an offset clock is another host's", h)
	}
	t.Setenv(testHostClockOffsetEnv, "")
	if c, h := testHostClock(); c != nil || h != "" {
		t.Fatalf("without the variable: %v %q, want the real clock and host", c, h)
	}
}
