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
	// issuing credentials with each new key that it refuses, whenever they
	// come, while the rotation's verification (GetCallerIdentity) passes.
	fbRefusals = 3
	// fbRoles are forced to refresh inside each settle, more of them than
	// there are refusals, so that every refusal falls inside it.
	fbRoles = 8
	// fbLifetime keeps the background refresher out of the way (a role is
	// due 60 s after its last fetch): the refreshes the test forces are
	// the only ones, so that none builds clients between the config/root
	// write and the second rotation's switch.
	fbLifetime = 2 * time.Minute
	// fbRepeatWindow is past the plugin's rotationRepeatWindow (10 s).
	fbRepeatWindow = 11 * time.Second
)

// TestRotateRootFallsBackToOldKey proves, through a real Vault, the real
// vault CLI and the emulator, the refreshes' fallback to the old root key
// while a rotated key settles (issue 21, defect 10): IAM is eventually
// consistent, and an endpoint may refuse a new key after another accepted
// it.
//
// The emulator refuses the first fbRefusals AssumeRole calls signed with
// each new key (-iam-refuse-first), wherever they fall, and accepts its
// GetCallerIdentity, so the rotation verifies and stores the key. As soon
// as config/root holds it, `vault write -f .../refresh/<role>` forces a
// cycle for every role while the rotation keeps the old key as the
// fallback (keySwitchSettle). Two rotations: the first after refreshes
// built the old key's clients, the second right after an operator's
// config/root write, before any refresh (the old key's clients must be
// built for it). For each, the emulator's call log must show every refusal
// of the new key after its verification and before the old key's
// deletion, followed in the same attempt by the old key's success for the
// same role; the old key deleted with the new one, a settle after the
// verification; no call with the old key after that. No reader and no
// forced refresh sees an error, and the plugin's metrics count the
// refusals and fallbacks.
func TestRotateRootFallsBackToOldKey(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	testStart := time.Now()

	emu := vaulttest.StartEmulator(t, "-max-lifetime", fbLifetime.String(), "-iam-propagation", rotPropagation.String(),
		"-iam-refuse-first", strconv.Itoa(fbRefusals), "-latency", "5ms-50ms")
	v := vaulttest.StartServer(t, vaulttest.ServerOptions{Dev: true})
	v.SetupPlugin(t, vaulttest.DefaultPluginVersion)
	v.CLI(t, "write", mount+"/config/root", "access_key="+emu.AccessKey, "secret_key="+emu.SecretKey,
		"region=us-east-1", "sts_endpoint="+emu.URL, "iam_endpoint="+emu.URL)
	v.CLI(t, "write", mount+"/config/refresh", "retry_window=4s", "max_retries=2", "refresh_fraction=0.5")

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

	key0 := emu.AccessKey
	key1, ended := rotateForcingRefreshes(t, v, roles, key0)
	// A rotate-root request within 10 s of a rotation's end gets that
	// rotation's result (the CLI's retries must not rotate again).
	time.Sleep(time.Until(ended.Add(fbRepeatWindow)))
	// An operator writes config/root (any field; here iam_endpoint again)
	// and rotates at once: no refresh has built clients since the write.
	rewrote := time.Now()
	v.CLI(t, "write", mount+"/config/root", "iam_endpoint="+emu.URL)
	key2, _ := rotateForcingRefreshes(t, v, roles, key1)

	// After the rotations: every role refreshed again, with the last key.
	forceRefreshes(t, v, roles, "after the rotations")
	readers.halt()

	// --- The emulator's call log, rotation by rotation.
	calls := emu.Calls(t)
	r1 := checkFallbackCalls(t, calls, key0, key1)
	r2 := checkFallbackCalls(t, calls, key1, key2)
	for _, c := range calls {
		if c.Action == "AssumeRole" && c.Time.After(rewrote) && c.Time.Before(r2.verified) {
			t.Errorf("an AssumeRole (%s) came between the config/root write and the second rotation's verification: "+
				"the test proves nothing about a rotation before any refresh", c.RoleArn)
			break
		}
	}
	var bad []string
	newAfter := 0
	for _, c := range calls {
		if c.Action != "AssumeRole" {
			continue
		}
		switch {
		case c.Outcome == "InvalidClientTokenId" && (c.AccessKeyID == key1 || c.AccessKeyID == key2):
			// The refusals, checked rotation by rotation.
		case c.Outcome != "ok":
			bad = append(bad, fmt.Sprintf("%s %s with %s", c.RoleArn, c.Outcome, c.AccessKeyID))
		case c.AccessKeyID != key0 && c.AccessKeyID != key1 && c.AccessKeyID != key2:
			bad = append(bad, fmt.Sprintf("%s signed with %s, none of the keys", c.RoleArn, c.AccessKeyID))
		case c.AccessKeyID == key2 && c.Time.After(r2.deleted):
			newAfter++
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d AssumeRole calls no rotation explains, first: %s", len(bad), bad[0])
	}
	if newAfter < fbRoles {
		t.Errorf("only %d AssumeRole calls after the last rotation, want at least the %d forced refreshes", newAfter, fbRoles)
	}
	for _, u := range emu.IAMUsers(t) {
		for _, k := range u.AccessKeys {
			if k.RefusalsLeft != 0 {
				t.Errorf("the emulator still has %d refusals of %s to make: the test did not meet them all", k.RefusalsLeft, k.AccessKeyID)
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
	// The old key's clients follow the new key's in each attempt; the
	// metrics name its endpoint old_key_primary.
	wantGauge(t, fams, "aws_resilient_sts_calls_total", `action="AssumeRole",endpoint="primary",outcome="InvalidClientTokenId"`, 2*fbRefusals)
	wantGauge(t, fams, "aws_resilient_sts_calls_total", `action="AssumeRole",endpoint="old_key_primary",outcome="ok"`, 2*fbRefusals)
	for _, m := range fams["aws_resilient_refresh_cycles_total"].GetMetric() {
		if l := labelsOf(m); l["result"] != "success" && m.GetCounter().GetValue() > 0 {
			t.Errorf("the plugin counted %v refresh cycles with result %s", m.GetCounter().GetValue(), l["result"])
		}
	}
	wantGauge(t, fams, "aws_resilient_root_rotations_total", `result="success",trigger="manual"`, 2)
	rec := readRotation(t, v)
	if rec.Outcome != "success" || rec.Failures != 0 || rec.Error != "" || rec.RetiredKeyID != "" || rec.PendingKeyID != "" {
		t.Errorf("config/rotation after the rotations: %+v", rec)
	}
	checkOnlyKey(t, emu, key2)
	checkKeyRejected(t, emu, key0, emu.SecretKey)

	t.Logf("FALLBACK-SUMMARY rotation1: refusals=%d fallbacks=%d settle_observed=%s; rotation2 (right after a config/root write): refusals=%d fallbacks=%d settle_observed=%s; "+
		"assume_role_after_last_delete=%d reads=%d read_errors=%d total=%s",
		r1.refused, r1.fellBack, r1.deleted.Sub(r1.verified).Round(time.Millisecond),
		r2.refused, r2.fellBack, r2.deleted.Sub(r2.verified).Round(time.Millisecond),
		newAfter, rs.ok, rs.errors, time.Since(testStart).Round(time.Second))
}

// rotateForcingRefreshes runs `vault write -f config/rotate-root` in the
// background, waits for config/root to leave oldKey, forces a refresh of
// every role through the CLI inside the settle, and returns the new key
// the rotation printed and when the command ended.
func rotateForcingRefreshes(t *testing.T, v *vaulttest.Server, roles []string, oldKey string) (newKey string, ended time.Time) {
	t.Helper()
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
			t.Fatalf("the rotation ended (exit %d: %s) before the test saw config/root leave %s", r.Code, strings.TrimSpace(r.Stderr), oldKey)
		default:
		}
		switch {
		case sec.Str("access_key") != oldKey:
			switched = time.Now()
		case time.Since(rotStart) > time.Minute:
			t.Fatalf("config/root still holds %s a minute into the rotation", oldKey)
		default:
			time.Sleep(20 * time.Millisecond)
		}
	}
	forceRefreshes(t, v, roles, "inside the settle")
	forcedEnd := time.Now()

	r := <-rotDone
	rotEnd := time.Now()
	if r.Code != 0 {
		t.Fatalf("vault write -f config/rotate-root: exit %d: %s", r.Code, strings.TrimSpace(r.Stderr))
	}
	newKey = cliTable(r.Stdout)["access_key"]
	if !regexp.MustCompile(`^AKIA[A-Z2-7]{16}$`).MatchString(newKey) || newKey == oldKey {
		t.Fatalf("config/rotate-root returned access_key %q, want a new AKIA id", newKey)
	}
	t.Logf("rotation %s -> %s took %s; config/root switched %s in; the forced refreshes ended %s after the switch",
		oldKey, newKey, rotEnd.Sub(rotStart).Round(time.Millisecond), switched.Sub(rotStart).Round(time.Millisecond),
		forcedEnd.Sub(switched).Round(time.Millisecond))
	return newKey, rotEnd
}

// forceRefreshes runs `vault write -f refresh/<role>` for every role and
// checks that each cycle succeeded.
func forceRefreshes(t *testing.T, v *vaulttest.Server, roles []string, when string) {
	t.Helper()
	for _, role := range roles {
		var sec vaulttest.Secret
		v.CLIJSON(t, &sec, "write", "-format=json", "-f", mount+"/refresh/"+role)
		if sec.Int("failed_cycles") != 0 || sec.Str("last_error") != "" {
			t.Errorf("vault write -f refresh/%s %s: failed_cycles %d, last_error %q", role, when, sec.Int("failed_cycles"), sec.Str("last_error"))
		}
	}
}

// fallbackRotation is what the call log shows of one rotation.
type fallbackRotation struct {
	verified, deleted time.Time // the new key's last verification; the old key's delete
	refused, fellBack int       // refusals of the new key; those followed by the old key's success
}

// checkFallbackCalls checks the rotation from oldKey to newKey in the
// emulator's call log: the old key deleted, with the new one, at least a
// settle after the new key's verification; fbRefusals AssumeRole calls
// with the new key refused, each inside that settle and followed in the
// same attempt by the old key's success; no AssumeRole with the new key
// before its verification, none with the old key after its deletion.
func checkFallbackCalls(t *testing.T, calls []vaulttest.EmulatorCall, oldKey, newKey string) fallbackRotation {
	t.Helper()
	var r fallbackRotation
	deletes := 0
	for _, c := range calls {
		switch {
		case c.Action == "GetCallerIdentity" && c.AccessKeyID == newKey && c.Outcome == "ok":
			r.verified = c.Time
		case c.Action == "DeleteAccessKey" && c.IssuedKeyID == oldKey:
			deletes++
			r.deleted = c.Time
			if c.AccessKeyID != newKey || c.Outcome != "ok" {
				t.Errorf("DeleteAccessKey of %s signed with %s: %s; want it deleted with the new key %s", oldKey, c.AccessKeyID, c.Outcome, newKey)
			}
		}
	}
	if r.verified.IsZero() || deletes != 1 {
		t.Fatalf("rotation %s -> %s: the call log has its verification at %s and %d deletes of the old key; want a verification and one delete",
			oldKey, newKey, fmtT(r.verified), deletes)
	}
	if kept := r.deleted.Sub(r.verified); kept < rotSettle {
		t.Errorf("rotation %s -> %s: the old key was deleted %s after the new one was verified, want at least the %s settle",
			oldKey, newKey, kept.Round(time.Millisecond), rotSettle)
	}
	bad := map[string]int{}
	for i, c := range calls {
		if c.Action != "AssumeRole" {
			continue
		}
		switch {
		case c.AccessKeyID == newKey && c.Outcome == "InvalidClientTokenId":
			r.refused++
			if c.Time.Before(r.verified) || !c.Time.Before(r.deleted) {
				bad["the new key refused outside the settle"]++
			}
			if fellBackToOldKey(calls[i+1:], c, oldKey) {
				r.fellBack++
				t.Logf("%s: %s refused at %s (%s into the settle), then %s served it in the same attempt",
					c.RoleArn, newKey, fmtT(c.Time), c.Time.Sub(r.verified).Round(time.Millisecond), oldKey)
			} else {
				bad["the new key refused without the old key's success next, in the same attempt"]++
			}
		case c.AccessKeyID == newKey && c.Time.Before(r.verified):
			bad["the new key used before its verification"]++
		case c.AccessKeyID == oldKey && c.Time.After(r.deleted):
			bad["the old key used after its deletion"]++
		}
	}
	if len(bad) > 0 {
		t.Errorf("rotation %s -> %s: the call log shows %v", oldKey, newKey, bad)
	}
	if r.refused != fbRefusals || r.fellBack != fbRefusals {
		t.Errorf("rotation %s -> %s: %d refusals of the new key and %d fallbacks to the old key, want %d of each",
			oldKey, newKey, r.refused, r.fellBack, fbRefusals)
	}
	t.Logf("rotation %s -> %s: %d refusals of the new key inside the settle, %d fallbacks to the old key; the old key deleted %s after the verification",
		oldKey, newKey, r.refused, r.fellBack, r.deleted.Sub(r.verified).Round(time.Millisecond))
	return r
}
