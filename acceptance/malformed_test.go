package acceptance

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// TestMalformedCredentials (issue 37): each malformed credential STS could
// answer a 200 with, armed through the emulator's control API for every
// attempt of one role's refresh cycle, in a real Vault. The cycle fails;
// what the plugin stored (sys/raw) and what `vault read` serves stay the
// last good credential; status names the reason; and once the emulator
// heals, the next cycle stores a new credential the emulator accepts.
// expired and empty_key, the older shapes, are in TestFaultMatrix.
func TestMalformedCredentials(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	v := vaulttest.StartServer(t, vaulttest.ServerOptions{Dev: true, ExtraConfig: "raw_storage_endpoint = true\n"})
	v.RegisterPlugin(t, vaulttest.PluginBin(t, vaulttest.DefaultPluginVersion), vaulttest.PluginOptions{})
	for _, tc := range []struct{ shape, reason string }{
		{"empty_token", "InvalidCredential: STS returned an empty session token"},
		{"no_expiration", "InvalidCredential: STS returned a credential without an expiration"},
		{"empty_secret", "InvalidCredential: STS returned an empty secret access key"},
		{"far_expiration", "InvalidCredential: STS returned a credential expiring at 21"},
		{"whitespace", "InvalidCredential: STS returned a credential whose access key id is wrapped in whitespace"},
	} {
		t.Run(tc.shape, func(t *testing.T) {
			t.Parallel()
			runMalformedCase(t, v, tc.shape, tc.reason)
		})
	}
}

// runMalformedCase is one shape, on its own emulator and mount; the timing
// is the fault matrix's (fmLifetime, fmWindow, fmRetries).
func runMalformedCase(t *testing.T, v *vaulttest.Server, shape, reason string) {
	name := "mf-" + strings.ReplaceAll(shape, "_", "-")
	s := &fmStack{v: v, mount: name, role: name}
	s.arn = "arn:aws:iam::" + vaulttest.EmulatorAccount + ":role/" + s.role
	s.emu = vaulttest.StartEmulator(t, "-max-lifetime", fmLifetime.String())
	v.EnablePlugin(t, s.mount, vaulttest.DefaultPluginVersion)
	v.CLI(t, "write", s.mount+"/config/root", "access_key="+s.emu.AccessKey, "secret_key="+s.emu.SecretKey,
		"region=us-east-1", "sts_endpoint="+s.emu.URL)
	v.CLI(t, "write", s.mount+"/config/refresh", "max_retries="+strconv.Itoa(fmRetries),
		"retry_window="+fmWindow.String(), "refresh_fraction="+fmFraction)
	v.CLI(t, "write", s.mount+"/roles/"+s.role, "credential_type=assumed_role", "role_arn="+s.arn)
	rawPath := "sys/raw/logical/" + mountUUID(t, v, s.mount) + "/cache/" + s.role

	good := s.readCredsVia(t)
	st0 := s.status(t)
	n1 := st0.NextRefresh
	if st0.State != "fresh" || n1.IsZero() {
		t.Fatalf("after the first read: %s", st0)
	}
	stored := rawEntry(t, v, rawPath)

	// Every attempt of the cycle due at n1 gets the shape, this role only.
	s.emu.SetFaults(t, vaulttest.FaultPlan{Sequence: []vaulttest.FaultStep{{Fault: shape, Count: fmRetries}}, Match: s.arn})
	if !time.Now().Before(n1) {
		t.Fatalf("the fault was armed after the cycle it is for was due (%s)", fmtT(n1))
	}
	var failed statusRead
	waitFor(t, n1.Add(fmWindow+20*time.Second), "the cycle to fail", func() bool {
		failed = s.status(t)
		return failed.Failed > 0
	})
	t.Logf("failed cycle: %s", failed)
	if failed.State != "stale" || failed.Attempts != fmRetries || !strings.HasPrefix(failed.LastError, reason) ||
		!failed.CredExpiration.Equal(st0.CredExpiration) {
		t.Errorf("status after the cycle: %s, expiration %s; want stale, %d attempts, last_error %q, the cached expiration %s",
			failed, fmtT(failed.CredExpiration), fmRetries, reason, fmtT(st0.CredExpiration))
	}
	calls := s.roleCalls(t)
	if len(calls) != 1+fmRetries {
		t.Fatalf("emulator saw %d AssumeRole calls, want 1 + %d:\n%s", len(calls), fmRetries, callsString(calls))
	}
	for _, c := range calls[1:] {
		if c.Outcome != shape {
			t.Errorf("a call of the failed cycle was answered %s, want %s", c.Outcome, shape)
		}
	}
	// The last good credential is what is stored and served, and it works.
	if now := rawEntry(t, v, rawPath); now != stored {
		t.Errorf("the stored cache entry changed after a rejected credential")
	}
	if c := s.readCredsVia(t); c.AccessKey != good.AccessKey || c.SessionToken != good.SessionToken || c.SecretKey != good.SecretKey {
		t.Errorf("served %s after the failed cycle, want the last good %s", c.AccessKey, good.AccessKey)
	}
	s.mustBeAccepted(t, good)

	// The emulator heals (the sequence is used up; the plan is cleared as
	// well): the next cycle succeeds at its first attempt.
	s.emu.ClearFaults(t)
	var fresh statusRead
	waitFor(t, failed.NextRefresh.Add(fmWindow+20*time.Second), "the role to be fresh again", func() bool {
		fresh = s.status(t)
		return fresh.State == "fresh" && fresh.IssuedAt.After(n1)
	})
	if fresh.Attempts != 1 || fresh.Failed != 0 || fresh.LastError != "" {
		t.Errorf("recovery: %s; want 1 attempt and no error", fresh)
	}
	renewed := s.readCredsVia(t)
	if renewed.AccessKey == good.AccessKey {
		t.Errorf("after the heal still served %s", good.AccessKey)
	}
	s.mustBeAccepted(t, renewed)
	if last := s.roleCalls(t); last[len(last)-1].Outcome != "ok" || last[len(last)-1].IssuedKeyID != renewed.AccessKey {
		t.Errorf("the recovery call: %+v, want ok issuing %s", last[len(last)-1], renewed.AccessKey)
	}
}

// rawEntry reads a storage entry through sys/raw: what the plugin stored.
func rawEntry(t *testing.T, v *vaulttest.Server, path string) string {
	t.Helper()
	var d struct {
		Value string `json:"value"`
	}
	code, msg, err := fmGet(context.Background(), v, path, &d)
	if err != nil || code != http.StatusOK || d.Value == "" {
		t.Fatalf("%s: HTTP %d %s %v", path, code, msg, err)
	}
	return d.Value
}
