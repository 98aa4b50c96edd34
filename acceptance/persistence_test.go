package acceptance

import (
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// TestPersistenceAcrossRestart: on a raft-backed server the cached
// credential survives a restart; after it the same credential is served with
// no STS call, and the background refresh still happens on schedule.
func TestPersistenceAcrossRestart(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	const lifetime = 60 * time.Second
	emu := vaulttest.StartEmulator(t, "-max-lifetime", lifetime.String())
	v := vaulttest.StartServer(t, vaulttest.ServerOptions{Storage: "raft"})
	v.SetupPlugin(t, vaulttest.DefaultPluginVersion)
	// refresh_fraction 0.5: due 30s after issue (plus up to 3s start delay).
	v.ConfigureEmulator(t, emu, map[string]string{"retry_window": "4s", "max_retries": "2", "refresh_fraction": "0.5"})
	s := &stack{emu: emu, vault: v}
	s.createRole(t, "app")

	before := s.readCreds(t, "app")
	nextRefresh := parseTime(t, s.statusOf(t, "app"), "next_refresh")
	if nextRefresh.IsZero() {
		t.Fatal("status/app has no next_refresh")
	}
	calls := s.assumeRoleCalls(t, "")
	if calls != 1 {
		t.Fatalf("%d AssumeRole calls before the restart, want 1", calls)
	}

	start := time.Now()
	v.Restart(t)
	t.Logf("restart (stop, start, unseal, active) took %s", time.Since(start).Round(time.Millisecond))
	if time.Now().After(nextRefresh) {
		t.Fatalf("the restart took until after the scheduled refresh (%s); the test cannot tell a resumed refresh from a cold start", nextRefresh)
	}

	after := s.readCreds(t, "app")
	if after.AccessKey != before.AccessKey || !after.Expiration.Equal(before.Expiration) {
		t.Fatalf("after restart: served %s (expires %s), before %s (expires %s)", after.AccessKey, after.Expiration, before.AccessKey, before.Expiration)
	}
	if n := s.assumeRoleCalls(t, ""); n != calls {
		t.Fatalf("the restart and read made %d STS calls, want none", n-calls)
	}
	if st := s.statusOf(t, "app"); !parseTime(t, st, "next_refresh").Equal(nextRefresh) {
		t.Logf("next_refresh after restart %s (was %s)", st.Str("next_refresh"), nextRefresh.Format(time.RFC3339))
	}

	// The refresher picked the entry up at start-up: a new credential
	// appears once the refresh is due, well before the old one expires,
	// without anyone reading it.
	var refreshed creds
	eventually(t, time.Until(before.Expiration), 250*time.Millisecond, func() (bool, string) {
		if s.assumeRoleCalls(t, "ok") == calls {
			return false, "no refresh after the restart"
		}
		refreshed = s.readCreds(t, "app")
		return refreshed.AccessKey != before.AccessKey, "the refreshed credential is not served"
	})
	at := time.Now()
	// Due time plus one retry window plus polling slack.
	// next_refresh may or may not include the start delay (up to 10% of the
	// 30s margin); the cycle may take up to one 4s retry window.
	if d := at.Sub(nextRefresh); d < -4*time.Second || d > 4*time.Second+2*time.Second {
		t.Fatalf("refresh happened at %s, %s from its scheduled time %s", at.UTC().Format(time.RFC3339Nano), d.Round(time.Millisecond), nextRefresh.Format(time.RFC3339))
	}
	if !refreshed.Expiration.After(before.Expiration) {
		t.Fatalf("the refreshed credential expires %s, not after the old one (%s)", refreshed.Expiration, before.Expiration)
	}
	if n := s.assumeRoleCalls(t, ""); n != calls+1 {
		t.Fatalf("%d STS calls for one refresh, want 1", n-calls)
	}
	s.mustBeValid(t, refreshed)
	t.Logf("refreshed %s after the scheduled time, %s before the old credential expired", at.Sub(nextRefresh).Round(time.Millisecond), before.Expiration.Sub(at).Round(time.Second))
}
