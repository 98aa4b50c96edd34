package acceptance

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// TestVaultUpgradeUnderThePlugin: a raft-backed server on the oldest
// supported Vault, with the plugin mounted, roles defined and credentials
// cached, is stopped and started on the newest one, on the same data. The
// same credentials are served with no STS call, config, roles and status
// are intact, the refresher resumes on schedule, and a refresh cycle works.
func TestVaultUpgradeUnderThePlugin(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	versions := vaulttest.VaultVersions(t)
	from, to := versions[0], versions[len(versions)-1]
	if from == to {
		t.Skipf("only one supported Vault version (%s): nothing to upgrade to", from)
	}
	oldBin, newBin := vaulttest.VaultBinVersion(t, from), vaulttest.VaultBinVersion(t, to)

	// Long enough that the set-up, the upgrade and the checks after it fit
	// before the first plan even on a loaded machine (at 60 s, make compat
	// once read app after its refresh).
	const lifetime = 120 * time.Second
	emu := vaulttest.StartEmulator(t, "-max-lifetime", lifetime.String())
	v := vaulttest.StartServer(t, vaulttest.ServerOptions{Storage: "raft", Bin: oldBin})
	if got := v.Version(t); !strings.HasPrefix(got, "Vault v"+from) {
		t.Fatalf("started %q, want Vault v%s", got, from)
	}
	v.SetupPlugin(t, vaulttest.DefaultPluginVersion)
	v.ConfigureEmulator(t, emu, map[string]string{"retry_window": "4s", "max_retries": "2", "refresh_fraction": "0.5"})
	s := &stack{emu: emu, vault: v}
	roles := []string{"app", "batch", "web"}
	for _, r := range roles {
		s.createRole(t, r)
	}
	s.createRole(t, "cold") // defined, never read
	before := map[string]creds{}
	for _, r := range roles {
		before[r] = s.readCreds(t, r)
	}
	calls := s.assumeRoleCalls(t, "")
	rootBefore := v.Read(t, mount+"/config/root").Data
	refreshBefore := v.Read(t, mount+"/config/refresh").Data
	roleBefore := v.Read(t, mount+"/roles/app").Data
	statusBefore := s.statusOf(t, "app")
	nextBefore := parseTime(t, statusBefore, "next_refresh")

	start := time.Now()
	v.Stop(t)
	v.StartWith(t, newBin)
	t.Logf("Vault %s -> %s: stop, start, unseal, active in %s", from, to, time.Since(start).Round(time.Millisecond))
	if got := v.Version(t); !strings.HasPrefix(got, "Vault v"+to) {
		t.Fatalf("restarted as %q, want Vault v%s", got, to)
	}
	if time.Now().After(nextBefore) {
		t.Fatalf("the upgrade took until after the scheduled refresh (%s); the test cannot tell a resumed refresh from a cold start", nextBefore)
	}
	// Right away, before the slower checks below: on a loaded machine they
	// can outlast the plan, and the refresh would have run.
	resumed := s.statusOf(t, "app")

	// The same credentials, from storage, with no STS call.
	for _, r := range roles {
		after := s.readCreds(t, r)
		if after.AccessKey != before[r].AccessKey || !after.Expiration.Equal(before[r].Expiration) {
			t.Fatalf("%s after the upgrade: served %s, before %s", r, after.AccessKey, before[r].AccessKey)
		}
	}
	if n := s.assumeRoleCalls(t, ""); n != calls {
		t.Fatalf("the upgrade and reads made %d STS calls, want none", n-calls)
	}
	// AWS's clock as this node knows it is memory, not storage: after the
	// restart it stands on the offset stored with the credentials (basis
	// stored), the one measured before, until the next call measures it.
	rootAfter := v.Read(t, mount+"/config/root").Data
	clocksBefore, _ := rootBefore["aws_clocks"].(map[string]any)
	clocksAfter, _ := rootAfter["aws_clocks"].(map[string]any)
	for ep, b := range clocksBefore {
		a, _ := clocksAfter[ep].(map[string]any)
		if a["basis"] != "stored" || !equalJSON(a["offset"], b.(map[string]any)["offset"]) {
			t.Fatalf("config/root aws_clocks[%s] = %v after the upgrade, want basis stored with the offset measured before (%v)", ep, a, b)
		}
	}
	delete(rootBefore, "aws_clocks")
	// Config, roles and status intact.
	for name, pair := range map[string][2]map[string]any{
		"config/root":    {rootBefore, rootAfter},
		"config/refresh": {refreshBefore, v.Read(t, mount+"/config/refresh").Data},
		"roles/app":      {roleBefore, v.Read(t, mount+"/roles/app").Data},
	} {
		for k, want := range pair[0] {
			if got := pair[1][k]; !equalJSON(got, want) {
				t.Fatalf("%s %s = %v after the upgrade, %v before", name, k, got, want)
			}
		}
	}
	var listed []string
	v.CLIJSON(t, &listed, "list", "-format=json", mount+"/roles")
	if len(listed) != 4 {
		t.Fatalf("roles after the upgrade: %v", listed)
	}
	if st := s.statusOf(t, "cold"); st.Str("state") != "empty" {
		t.Fatalf("the never-read role is %s after the upgrade, want empty", st.Str("state"))
	}
	for _, r := range roles {
		st := s.statusOf(t, r)
		if st.Str("state") != "fresh" || st.Str("last_success") == "" || st.Int("failed_cycles") != 0 {
			t.Fatalf("status/%s after the upgrade: %v", r, st.Data)
		}
	}

	// The refresher resumed: app is refreshed on schedule, unread. Its
	// plan, read just after the upgrade, is the one made before it (or, if
	// the status read came after the plan, the refresh ran on time).
	margin := lifetime / 2
	due := before["app"].Expiration.Add(-margin)
	rescheduled := parseTime(t, resumed, "next_refresh")
	if resumed.Str("last_success") != statusBefore.Str("last_success") {
		rescheduled = parseTime(t, resumed, "last_success")
	}
	if rescheduled.Before(due.Add(-time.Second)) || rescheduled.After(due.Add(margin/10+time.Second)) {
		t.Fatalf("next_refresh after the upgrade %s, want within [%s, %s]", rescheduled.Format(time.RFC3339Nano),
			due.Format(time.RFC3339), due.Add(margin/10).Format(time.RFC3339))
	}
	eventually(t, time.Until(before["app"].Expiration), 250*time.Millisecond, func() (bool, string) {
		c := s.readCreds(t, "app")
		return c.AccessKey != before["app"].AccessKey, "app was not refreshed after the upgrade"
	})
	// When the refresh ran is the status's record, not when this test,
	// polling on a loaded machine, noticed it.
	if ran := parseTime(t, s.statusOf(t, "app"), "last_success"); ran.Before(rescheduled) || ran.Sub(rescheduled) > 5*time.Second {
		t.Fatalf("app refreshed at %s, want within 5s of its scheduled time %s", ran.Format(time.RFC3339Nano), rescheduled.Format(time.RFC3339Nano))
	}

	// And a cycle on demand works on the new Vault.
	out := v.CLI(t, "write", "-format=json", "-f", mount+"/refresh/batch")
	if !strings.Contains(out, `"failed_cycles": 0`) {
		t.Fatalf("refresh/batch on Vault %s: %s", to, out)
	}
	if c := s.readCreds(t, "batch"); c.AccessKey == before["batch"].AccessKey {
		t.Fatal("refresh/batch did not replace the credential")
	}
}

// equalJSON compares two values decoded from JSON.
func equalJSON(a, b any) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}
