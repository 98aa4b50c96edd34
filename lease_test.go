package awsresilient

import (
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"
)

// TestCreds_NoLease checks a lease=false role through HandleRequest: no
// lease, the same credential fields, and ttl/rotation_period with the
// values of the rule on the fake clock.
func TestCreds_NoLease(t *testing.T) {
	f := newFixture(t, fixtureOpts{refresh: map[string]interface{}{
		"refresh_fraction": 0.5, "retry_window": 30, "max_retries": 6,
	}})
	if got := mustDo(t, f.b, f.s, logical.ReadOperation, "roles/"+testRole, nil).Data["lease"]; got != true {
		t.Fatalf("default lease = %v, want true", got)
	}
	leased := f.mustReadCreds(testRole)
	if leased.Secret == nil {
		t.Fatal("lease=true response has no lease")
	}
	for _, k := range []string{"ttl", "rotation_period"} {
		if _, ok := leased.Data[k]; ok {
			t.Fatalf("lease=true response has %s", k)
		}
	}

	mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+testRole, map[string]interface{}{"lease": false})
	c := cached(t, f.s, testRole)
	if lifetime := c.Expiration.Sub(c.IssuedAt); lifetime != 10*time.Minute {
		t.Fatalf("issued lifetime %v, want the emulator's 10m", lifetime)
	}
	read := func(t *testing.T) *logical.Response {
		t.Helper()
		resp := mustDo(t, f.b, f.s, logical.ReadOperation, "creds/"+testRole, nil)
		if resp.Secret != nil {
			t.Fatalf("lease=false response has a lease: %+v", resp.Secret)
		}
		wantData := map[string]interface{}{
			"access_key": c.AccessKey, "secret_key": c.SecretKey, "security_token": c.SessionToken,
			"expiration": c.Expiration.UTC().Format(time.RFC3339), "arn": c.ARN, "rotation_period": int64(600),
		}
		for k, v := range wantData {
			if resp.Data[k] != v {
				t.Fatalf("%s = %v, want %v", k, resp.Data[k], v)
			}
		}
		return resp
	}
	wantTTL := func(t *testing.T, resp *logical.Response, want time.Duration) {
		t.Helper()
		if got := resp.Data["ttl"]; got != int64(want/time.Second) {
			t.Fatalf("ttl = %v, want %d", got, int64(want/time.Second))
		}
	}

	t.Run("scheduled refresh + block", func(t *testing.T) {
		due, ok := f.b.refresher.plannedAt(roleKey(testRole))
		if !ok || !due.Equal(c.Expiration.Add(-5*time.Minute)) {
			t.Fatalf("scheduled at %v (%v), want expiration - 5m (randMin: no start delay)", due, ok)
		}
		wantTTL(t, read(t), due.Add(5*time.Second).Sub(f.clock.Now()))
	})
	t.Run("nothing scheduled: latest due + block", func(t *testing.T) {
		f.b.refresher.unplan(roleKey(testRole))
		f.clock.Advance(100 * time.Second)
		// 300s margin, 30s start delay at most, 5s block.
		wantTTL(t, read(t), c.Expiration.Add(-300*time.Second+30*time.Second+5*time.Second).Sub(f.clock.Now()))
	})
	t.Run("refresh late: one block", func(t *testing.T) {
		f.clock.AdvanceTo(c.Expiration.Add(-200 * time.Second))
		wantTTL(t, read(t), 5*time.Second)
	})
	t.Run("no storage access", func(t *testing.T) {
		before := snapshot(t, f.s)
		read(t)
		if !sameSnapshot(before, snapshot(t, f.s)) {
			t.Fatal("a lease=false read changed storage")
		}
		if n := len(f.log.all()); n != 1 {
			t.Fatalf("%d STS calls, want the first one only", n)
		}
	})
}
