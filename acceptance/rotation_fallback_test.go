package acceptance

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

const (
	// fbRefusals is the emulator's -iam-refuse-first: the first calls
	// issuing credentials with the new key that it refuses, whenever they
	// come, while the rotation's verification (GetCallerIdentity) passes.
	fbRefusals = 3
	// fbRoles are forced to refresh inside the settle, more of them than
	// there are refusals, so that every refusal falls inside it whatever
	// the background refresher does.
	fbRoles = 8
)

// TestRotateRootFallsBackToOldKey proves, through a real Vault, the real
// vault CLI and the emulator, the refreshes' fallback to the old root key
// while a rotated key settles (issue 21, defect 10): IAM is eventually
// consistent, and an endpoint may refuse a new key after another accepted
// it.
//
// The emulator refuses the first fbRefusals AssumeRole calls signed with
// the new key (-iam-refuse-first), wherever they fall, and accepts its
// GetCallerIdentity, so the rotation verifies and stores the key. As soon
// as config/root holds it, `vault write -f .../refresh/<role>` forces a
// cycle for every role while the rotation keeps the old key as the
// fallback (keySwitchSettle). The emulator's call log must then show: each
// refusal of the new key after the verification and before the old key's
// deletion, followed in the same attempt by the old key's success for the
// same role (fbRefusals refusals, as many fallbacks); the old key deleted
// one settle after the verification, with the new key; from then on only
// the new key, every call served. No reader and no forced refresh sees an
// error, and the plugin's metrics count the refusals and fallbacks.
func TestRotateRootFallsBackToOldKey(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	testStart := time.Now()

	emu := vaulttest.StartEmulator(t, "-max-lifetime", rotLifetime.String(), "-iam-propagation", rotPropagation.String(),
		"-iam-refuse-first", strconv.Itoa(fbRefusals), "-latency", "5ms-50ms")
	v := vaulttest.StartServer(t, vaulttest.ServerOptions{Dev: true})
	v.SetupPlugin(t, vaulttest.DefaultPluginVersion)
	v.CLI(t, "write", mount+"/config/root", "access_key="+emu.AccessKey, "secret_key="+emu.SecretKey,
		"region=us-east-1", "sts_endpoint="+emu.URL, "iam_endpoint="+emu.URL)
	v.CLI(t, "write", mount+"/config/refresh", "retry_window=4s", "max_retries=2", "refresh_fraction=0.5")
	oldKey := emu.AccessKey

	roles := make([]string, fbRoles)
	for i := range roles {
		roles[i] = fmt.Sprintf("fb-%02d", i)
		v.CLI(t, "write", mount+"/roles/"+roles[i], "credential_type=assumed_role", "role_arn="+roleARN(roles[i]))
	}
	client := haClient(10 * time.Second)
	for _, role := range roles {
		if _, err := readCredsHTTP(client, v, role); err != nil {
			t.Fatal(err)
		}
	}
	readers := startRotReaders(t, v, roles, 2, 100*time.Millisecond)

	// The rotation runs in the background; the test watches config/root
	// for the switch to the new key.
	rotStart := time.Now()
	rotDone := make(chan vaulttest.Result, 1)
	go func() { rotDone <- v.Exec(t, v.RootToken(), "", "write", "-f", mount+"/config/rotate-root") }()
	var switched time.Time
	for switched.IsZero() {
		var sec vaulttest.Secret
		if code := v.API(t, http.MethodGet, mount+"/config/root", nil, &sec); code != http.StatusOK {
			t.Fatalf("reading config/root during the rotation: HTTP %d", code)
		}
		select {
		case r := <-rotDone:
			t.Fatalf("the rotation ended (exit %d: %s) before the test saw config/root switch keys", r.Code, strings.TrimSpace(r.Stderr))
		default:
		}
		switch {
		case sec.Str("access_key") != oldKey:
			switched = time.Now()
		case time.Since(rotStart) > time.Minute:
			t.Fatal("config/root still holds the old key a minute into the rotation")
		default:
			time.Sleep(20 * time.Millisecond)
		}
	}

	// Inside the settle: one forced cycle per role, through the CLI.
	for _, role := range roles {
		var sec vaulttest.Secret
		v.CLIJSON(t, &sec, "write", "-format=json", "-f", mount+"/refresh/"+role)
		if sec.Int("failed_cycles") != 0 || sec.Str("last_error") != "" {
			t.Errorf("vault write -f refresh/%s inside the settle: failed_cycles %d, last_error %q", role, sec.Int("failed_cycles"), sec.Str("last_error"))
		}
	}
	forcedEnd := time.Now()

	r := <-rotDone
	rotEnd := time.Now()
	if r.Code != 0 {
		t.Fatalf("vault write -f config/rotate-root: exit %d: %s", r.Code, strings.TrimSpace(r.Stderr))
	}
	newKey := cliTable(r.Stdout)["access_key"]
	if !regexp.MustCompile(`^AKIA[A-Z2-7]{16}$`).MatchString(newKey) || newKey == oldKey {
		t.Fatalf("config/rotate-root returned access_key %q, want a new AKIA id", newKey)
	}
	t.Logf("rotation %s -> %s took %s; config/root switched %s in, the forced refreshes ended %s after the switch",
		oldKey, newKey, rotEnd.Sub(rotStart).Round(time.Millisecond), switched.Sub(rotStart).Round(time.Millisecond),
		forcedEnd.Sub(switched).Round(time.Millisecond))

	// After the rotation: every role refreshed again, with the new key only.
	for _, role := range roles {
		var sec vaulttest.Secret
		v.CLIJSON(t, &sec, "write", "-format=json", "-f", mount+"/refresh/"+role)
		if sec.Int("failed_cycles") != 0 || sec.Str("last_error") != "" {
			t.Errorf("vault write -f refresh/%s after the rotation: failed_cycles %d, last_error %q", role, sec.Int("failed_cycles"), sec.Str("last_error"))
		}
	}
	readers.halt()

	// --- The emulator's call log.
	calls := emu.Calls(t)
	var verified, deleted time.Time
	deletes := 0
	for _, c := range calls {
		switch {
		case c.Action == "GetCallerIdentity" && c.AccessKeyID == newKey && c.Outcome == "ok":
			verified = c.Time
		case c.Action == "DeleteAccessKey":
			deletes++
			deleted = c.Time
			if c.AccessKeyID != newKey || c.Outcome != "ok" || c.IssuedKeyID != oldKey {
				t.Errorf("DeleteAccessKey of %s signed with %s: %s; want the old key %s deleted with the new one", c.IssuedKeyID, c.AccessKeyID, c.Outcome, oldKey)
			}
		}
	}
	if verified.IsZero() || deletes != 1 {
		t.Fatalf("the call log has verification at %s and %d DeleteAccessKey calls; want a verified key and one delete", fmtT(verified), deletes)
	}
	if kept := deleted.Sub(verified); kept < rotSettle {
		t.Errorf("the old key was deleted %s after the new one was verified, want at least the %s settle", kept.Round(time.Millisecond), rotSettle)
	}

	var refused, fellBack, newBefore, oldAfter, newAfter int
	bad := map[string]int{}
	for i, c := range calls {
		if c.Action != "AssumeRole" {
			continue
		}
		switch {
		case c.AccessKeyID == newKey && c.Outcome == "InvalidClientTokenId":
			refused++
			if c.Time.Before(verified) || !c.Time.Before(deleted) {
				bad["new key refused outside the settle"]++
			}
			if fellBackToOldKey(calls[i+1:], c, oldKey) {
				fellBack++
				t.Logf("%s: the new key refused at %s (%s into the settle), the old key's success next, in the same attempt",
					c.RoleArn, fmtT(c.Time), c.Time.Sub(verified).Round(time.Millisecond))
			} else {
				bad["new key refused without the old key's success next, in the same attempt"]++
			}
		case c.Outcome != "ok":
			bad["AssumeRole "+c.Outcome]++
		case c.AccessKeyID == newKey:
			if c.Time.Before(verified) {
				newBefore++
			}
			if c.Time.After(deleted) {
				newAfter++
			}
		case c.AccessKeyID == oldKey:
			if c.Time.After(deleted) {
				oldAfter++
			}
		default:
			bad["AssumeRole signed with neither key"]++
		}
	}
	t.Logf("call log: %d refusals of the new key inside the settle, %d fallbacks to the old key; deleted %s after the verification; %d AssumeRole calls with the new key after",
		refused, fellBack, deleted.Sub(verified).Round(time.Millisecond), newAfter)
	if len(bad) > 0 {
		t.Errorf("the call log shows %v", bad)
	}
	if refused != fbRefusals || fellBack != fbRefusals {
		t.Errorf("%d refusals of the new key and %d fallbacks to the old key, want %d of each", refused, fellBack, fbRefusals)
	}
	if newBefore > 0 || oldAfter > 0 {
		t.Errorf("%d AssumeRole calls used the new key before it was verified, %d the old key after its deletion", newBefore, oldAfter)
	}
	if newAfter < fbRoles {
		t.Errorf("only %d AssumeRole calls after the old key's deletion, want at least the %d forced refreshes", newAfter, fbRoles)
	}
	for _, u := range emu.IAMUsers(t) {
		for _, k := range u.AccessKeys {
			if k.AccessKeyID == newKey && k.RefusalsLeft != 0 {
				t.Errorf("the emulator still has %d refusals of the new key to make: the test did not meet them all", k.RefusalsLeft)
			}
		}
	}

	// --- Through Vault: readers, statuses, metrics, the rotation record.
	rs := readers.result()
	t.Logf("readers: %d reads, %d errors, %d expired served", rs.ok, rs.errors, rs.expired)
	if rs.errors > 0 || rs.expired > 0 || rs.ok == 0 {
		t.Errorf("readers: %d ok, %d errors, %d expired (first error: %s)", rs.ok, rs.errors, rs.expired, rs.firstErr)
	}
	for _, role := range roles {
		st := v.Read(t, mount+"/status/"+role)
		if st.Int("failed_cycles") != 0 || st.Str("last_error") != "" {
			t.Errorf("status/%s: failed_cycles %d, last_error %q", role, st.Int("failed_cycles"), st.Str("last_error"))
		}
	}
	fams := parseExposition(t, rotMetrics(t, v))
	// The old key's clients follow the new key's in each attempt: its
	// endpoint is the attempt's second, which the metrics call fallback_1.
	wantGauge(t, fams, "aws_resilient_sts_calls_total", `action="AssumeRole",endpoint="primary",outcome="InvalidClientTokenId"`, fbRefusals)
	wantGauge(t, fams, "aws_resilient_sts_calls_total", `action="AssumeRole",endpoint="fallback_1",outcome="ok"`, fbRefusals)
	for _, m := range fams["aws_resilient_refresh_cycles_total"].GetMetric() {
		if l := labelsOf(m); l["result"] != "success" && m.GetCounter().GetValue() > 0 {
			t.Errorf("the plugin counted %v refresh cycles with result %s", m.GetCounter().GetValue(), l["result"])
		}
	}
	rec := readRotation(t, v)
	if rec.Outcome != "success" || rec.Failures != 0 || rec.Error != "" || rec.RetiredKeyID != "" {
		t.Errorf("config/rotation after the rotation: %+v", rec)
	}
	checkOnlyKey(t, emu, newKey)
	checkKeyRejected(t, emu, oldKey, emu.SecretKey)

	t.Logf("FALLBACK-SUMMARY refusals=%d fallbacks=%d settle_observed=%s assume_role_new_after_delete=%d reads=%d read_errors=%d total=%s",
		refused, fellBack, deleted.Sub(verified).Round(time.Millisecond), newAfter, rs.ok, rs.errors, time.Since(testStart).Round(time.Second))
}
