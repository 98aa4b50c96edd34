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
	// The refresher re-read the entry at start-up and scheduled it again:
	// due when less than half the lifetime is left, plus a start delay of
	// up to a tenth of that margin (drawn anew, so it may differ from the
	// schedule before the restart).
	rescheduled := parseTime(t, s.statusOf(t, "app"), "next_refresh")
	margin := lifetime / 2
	due := before.Expiration.Add(-margin)
	if rescheduled.Before(due.Add(-time.Second)) || rescheduled.After(due.Add(margin/10+time.Second)) {
		t.Fatalf("next_refresh after restart %s, want within [%s, %s]", rescheduled.Format(time.RFC3339Nano),
			due.Format(time.RFC3339), due.Add(margin/10).Format(time.RFC3339))
	}
	t.Logf("next_refresh %s before the restart, %s after", nextRefresh.Format(time.RFC3339Nano), rescheduled.Format(time.RFC3339Nano))

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
	// When the emulator received the refresh's call, not when polling saw
	// it: the first attempt falls inside the first 2s block after
	// next_refresh, plus the call's own latency on a loaded machine.
	var call *vaulttest.EmulatorCall
	for _, c := range emu.Calls(t) {
		if c.Action == "AssumeRole" && c.Outcome == "ok" && c.Time.After(start) {
			c := c
			call = &c
			break
		}
	}
	if call == nil {
		t.Fatal("the emulator logged no AssumeRole after the restart")
	}
	if d := call.Time.Sub(rescheduled); d < -500*time.Millisecond || d > 2*time.Second+time.Second {
		t.Fatalf("refresh call at %s, %s from its scheduled time %s", call.Time.UTC().Format(time.RFC3339Nano), d.Round(time.Millisecond), rescheduled.Format(time.RFC3339Nano))
	}
	if !refreshed.Expiration.After(before.Expiration) {
		t.Fatalf("the refreshed credential expires %s, not after the old one (%s)", refreshed.Expiration, before.Expiration)
	}
	if n := s.assumeRoleCalls(t, ""); n != calls+1 {
		t.Fatalf("%d STS calls for one refresh, want 1", n-calls)
	}
	s.mustBeValid(t, refreshed)
	t.Logf("refreshed %s after the scheduled time, %s before the old credential expired", at.Sub(rescheduled).Round(time.Millisecond), before.Expiration.Sub(at).Round(time.Second))
}
