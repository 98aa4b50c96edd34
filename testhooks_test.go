//go:build testhooks

package awsresilient

import (
	"testing"

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
