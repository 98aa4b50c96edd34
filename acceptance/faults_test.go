package acceptance

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/bench"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// The fault matrix: every fault the STS emulator can inject, plus a storage
// failure after a successful STS call and a credential shorter-lived than the
// cached one, each hitting one refresh cycle of one role in a real Vault dev
// server. A watcher polls the role's creds (what clients get), its raw
// storage entry (sys/raw: what the plugin really stored) and its status for
// the whole case, and the emulator's call log gives the time of every attempt.
//
// Each case has its own emulator (a fault plan is per emulator) and its own
// mount of the plugin pointed at it, all in one Vault server, so the cases
// run side by side: the whole matrix takes about as long as its slowest case.

const (
	// fmLifetime is what the emulator issues; with fmFraction 0.5 the first
	// refresh is due 20 s after issue (+ up to 2 s start delay), and a failed
	// cycle ends with at least 12 s of validity left. The pause after one
	// failed cycle (U[window/2, window]) then fits before the credential
	// expires, so the failed cycle's status stays readable for >= 3 s.
	fmLifetime = 40 * time.Second
	fmFraction = "0.5"
	fmWindow   = 6 * time.Second
	fmRetries  = 3
	// fmSlack is how late an attempt may reach the emulator after the end of
	// its block: the refresher's timer firing and goroutine start plus one
	// loopback round trip, on a 2-core runner busy with other Vault servers.
	// Lower bounds are exact (the emulator stamps a call after the plugin
	// made it; both read the same clock).
	fmSlack = 300 * time.Millisecond
)

// faultCase is one row of the matrix.
type faultCase struct {
	name string
	// fault is the emulator fault the case's cycle meets ("" for none).
	fault string
	// outcome is how the emulator records the faulted calls.
	outcome string
	// code is the AWS or plugin error code status/<role> must report.
	code string
	// nonRetryable: the cycle must stop after one attempt.
	nonRetryable bool
	// retries, when set, is written to config/refresh max_retries after the
	// first credential is cached, so the faulted cycle must use it.
	retries int
	// storage: the STS calls succeed but the cache write after each fails
	// (the plugin's test hook), so nothing new may be stored or served.
	storage bool
	// shorter: STS answers with credentials that expire before the cached
	// one (emulator max_lifetime lowered for the cycle).
	shorter bool
	// expire: the fault outlasts the credential, reads must answer 503
	// until the fault clears, and then recover within one retry window.
	expire bool
}

var faultCases = []faultCase{
	{name: "throttling", fault: "Throttling", outcome: "Throttling", code: "Throttling"},
	// This case also changes max_retries through config/refresh (3 -> 4).
	{name: "request-limit-exceeded", fault: "RequestLimitExceeded", outcome: "RequestLimitExceeded", code: "RequestLimitExceeded", retries: 4},
	{name: "internal-failure-500", fault: "InternalFailure", outcome: "InternalFailure", code: "InternalFailure"},
	{name: "service-unavailable-503", fault: "ServiceUnavailable", outcome: "ServiceUnavailable", code: "ServiceUnavailable"},
	{name: "connection-reset", fault: "reset", outcome: "reset", code: "ConnectionError"},
	{name: "hang-past-call-timeout", fault: "hang", outcome: "hang", code: "Timeout"},
	{name: "malformed-xml", fault: "malformed", outcome: "malformed", code: "MalformedResponse"},
	{name: "already-expired-credentials", fault: "expired", outcome: "expired", code: "InvalidCredential"},
	{name: "empty-access-key", fault: "empty_key", outcome: "empty_key", code: "InvalidCredential"},
	{name: "access-denied", fault: "AccessDenied", outcome: "AccessDenied", code: "AccessDenied", nonRetryable: true},
	{name: "storage-failure-after-sts", outcome: "ok", code: "StorageError", storage: true},
	{name: "shorter-lived-credential", outcome: "ok", code: "InvalidCredential", shorter: true},
	{name: "expiry-then-recovery", fault: "ServiceUnavailable", outcome: "ServiceUnavailable", code: "ServiceUnavailable", expire: true},
}

// TestFaultMatrix runs every case of faultCases against one Vault dev server.
func TestFaultMatrix(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	// sys/raw lets the watcher read what the plugin stored, not only what it
	// serves: the claim under test is about storage.
	v := vaulttest.StartServer(t, vaulttest.ServerOptions{Dev: true, ExtraConfig: "raw_storage_endpoint = true\n"})
	// The storage failure case needs test/storage-faults: a build with
	// -tags testhooks, run with AWS_RESILIENT_TEST_HOOKS=1.
	v.RegisterPlugin(t, vaulttest.PluginBinTestHooks(t), vaulttest.PluginOptions{
		Env: []string{"AWS_RESILIENT_TEST_HOOKS=1"},
	})
	for _, tc := range faultCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runFaultCase(t, v, tc)
		})
	}
}

// fmStack is one case's emulator, mount and role.
type fmStack struct {
	v     *vaulttest.Server
	emu   *vaulttest.Emulator
	mount string
	role  string
	arn   string
}

func (s *fmStack) status(t *testing.T) statusRead {
	t.Helper()
	var d map[string]any
	code, msg, err := fmGet(context.Background(), s.v, s.mount+"/status/"+s.role, &d)
	if err != nil || code != http.StatusOK {
		t.Fatalf("status/%s: HTTP %d %s %v", s.role, code, msg, err)
	}
	str := func(k string) string { x, _ := d[k].(string); return x }
	num := func(k string) int { x, _ := d[k].(float64); return int(x) }
	return statusRead{
		At: time.Now(), State: str("state"), Attempts: num("attempts_last_cycle"), Failed: num("failed_cycles"),
		LastError: str("last_error"), NextRefresh: parseRFC3339(str("next_refresh")), LastAttempt: parseRFC3339(str("last_attempt")),
		LastSuccess: parseRFC3339(str("last_success")), IssuedAt: parseRFC3339(str("issued_at")), CredExpiration: parseRFC3339(str("expiration")),
	}
}

// roleCalls returns the emulator's AssumeRole calls for the case's role, in
// order.
func (s *fmStack) roleCalls(t *testing.T) []vaulttest.EmulatorCall {
	t.Helper()
	var out []vaulttest.EmulatorCall
	for _, c := range s.emu.Calls(t) {
		if c.Action == "AssumeRole" && c.RoleArn == s.arn {
			out = append(out, c)
		}
	}
	return out
}

func mountUUID(t *testing.T, v *vaulttest.Server, mount string) string {
	t.Helper()
	var d struct {
		UUID string `json:"uuid"`
	}
	code, msg, err := fmGet(context.Background(), v, "sys/mounts/"+mount, &d)
	if err != nil || code != http.StatusOK || d.UUID == "" {
		t.Fatalf("sys/mounts/%s: HTTP %d %s %v (uuid %q)", mount, code, msg, err, d.UUID)
	}
	return d.UUID
}

// waitFor polls cond every 100 ms until it holds or the deadline passes.
func waitFor(t *testing.T, deadline time.Time, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out at %s waiting for %s", fmtT(deadline), what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func runFaultCase(t *testing.T, v *vaulttest.Server, tc faultCase) {
	s := &fmStack{v: v, mount: "fm-" + tc.name, role: "fm-" + tc.name}
	s.arn = "arn:aws:iam::" + vaulttest.EmulatorAccount + ":role/" + s.role
	s.emu = vaulttest.StartEmulator(t, "-max-lifetime", fmLifetime.String())
	v.EnablePlugin(t, s.mount, vaulttest.DefaultPluginVersion)
	// The shared Vault's log tail is mostly other cases': on a failure,
	// this role's own refresher lines (each attempt's drawn and woken
	// times, its outcome) say what its cycles did.
	t.Cleanup(func() {
		if t.Failed() {
			lines, err := bench.LogLines(v.Process.LogPath, "role="+s.role+" ")
			var text []string
			for _, l := range lines[max(0, len(lines)-40):] {
				text = append(text, l.Text)
			}
			t.Logf("the plugin's log lines for role %s (%v):\n%s", s.role, err, strings.Join(text, "\n"))
		}
	})
	v.CLI(t, "write", s.mount+"/config/root", "access_key="+s.emu.AccessKey, "secret_key="+s.emu.SecretKey,
		"region=us-east-1", "sts_endpoint="+s.emu.URL)
	v.CLI(t, "write", s.mount+"/config/refresh", "max_retries="+strconv.Itoa(fmRetries),
		"retry_window="+fmWindow.String(), "refresh_fraction="+fmFraction)
	v.CLI(t, "write", s.mount+"/roles/"+s.role, "credential_type=assumed_role", "role_arn="+s.arn)

	// The first credential, through the real CLI.
	c0 := s.readCredsVia(t)
	if life := time.Until(c0.Expiration); life > fmLifetime || life < fmLifetime-5*time.Second {
		t.Fatalf("first credential lives %s, want about the emulator's %s", life, fmLifetime)
	}
	st0 := s.status(t)
	n1 := st0.NextRefresh // the faulted cycle starts here
	if st0.State != "fresh" || n1.IsZero() || !n1.Before(c0.Expiration) {
		t.Fatalf("after the first read: %s", st0)
	}
	// creds shows the expiration in whole seconds, status exactly (STS
	// sends milliseconds); the schedule checks below need the exact one.
	if d := st0.CredExpiration.Sub(c0.Expiration); d < 0 || d >= time.Second {
		t.Fatalf("status expiration %s is not creds' %s to the second", st0.CredExpiration.Format(time.RFC3339Nano), fmtT(c0.Expiration))
	}
	c0.Expiration = st0.CredExpiration

	w := startWatcher(v, s.mount, mountUUID(t, v, s.mount), s.role)
	t.Cleanup(w.stop)

	retries := fmRetries
	if tc.retries != 0 {
		retries = tc.retries
		v.CLI(t, "write", s.mount+"/config/refresh", "max_retries="+strconv.Itoa(retries))
		var rc struct {
			Data struct {
				MaxRetries int `json:"max_retries"`
			} `json:"data"`
		}
		v.CLIJSON(t, &rc, "read", "-format=json", s.mount+"/config/refresh")
		if rc.Data.MaxRetries != retries {
			t.Fatalf("config/refresh max_retries = %d after writing %d", rc.Data.MaxRetries, retries)
		}
	}
	block := fmWindow / time.Duration(retries)
	attempts := retries
	if tc.nonRetryable {
		attempts = 1
	}

	// Arm the fault for the cycle due at n1, scoped to this role's ARN.
	switch {
	case tc.storage:
		v.CLI(t, "write", s.mount+"/test/storage-faults", "cache_write_failures="+strconv.Itoa(attempts))
	case tc.shorter:
		// 5 s < the >= 18 s the cached credential still has at n1.
		s.emu.SetConfig(t, map[string]any{"max_lifetime": "5s"})
	case tc.expire:
		s.emu.SetFaults(t, vaulttest.FaultPlan{Sequence: []vaulttest.FaultStep{{Fault: tc.fault, Count: 100000}}, Match: s.arn})
	default:
		s.emu.SetFaults(t, vaulttest.FaultPlan{Sequence: []vaulttest.FaultStep{{Fault: tc.fault, Count: attempts}}, Match: s.arn, Hang: "20s"})
	}
	if !time.Now().Before(n1) {
		t.Fatalf("the fault was armed after the cycle it is for was due (%s)", fmtT(n1))
	}
	t.Logf("credential %s expires %s; faulted cycle due %s, %d attempts in %s blocks",
		c0.AccessKey, fmtT(c0.Expiration), fmtT(n1), attempts, block)

	if tc.expire {
		runExpiryCase(t, s, w, tc, c0, n1, block, attempts)
		return
	}

	// The faulted cycle fails, and status says so.
	var failed statusRead
	waitFor(t, n1.Add(fmWindow+20*time.Second), "the faulted cycle to fail", func() bool {
		var ok bool
		failed, ok = w.findStatus(func(s statusRead) bool { return s.Failed > 0 })
		return ok
	})
	switch {
	case tc.shorter:
		s.emu.SetConfig(t, map[string]any{"max_lifetime": fmLifetime.String()})
	case tc.storage:
		var d struct {
			N int `json:"cache_write_failures"`
		}
		if code, msg, err := fmGet(context.Background(), v, s.mount+"/test/storage-faults", &d); err != nil || code != 200 || d.N != 0 {
			t.Errorf("test/storage-faults after the cycle: HTTP %d %s %v, %d failures left (want 0)", code, msg, err, d.N)
		}
	}
	t.Logf("failed cycle: %s", failed)
	if failed.Attempts != attempts || failed.Failed != 1 || !strings.HasPrefix(failed.LastError, tc.code+":") || failed.State != "stale" {
		t.Errorf("status after the faulted cycle: %s; want stale, %d attempts, 1 failed cycle, last_error %s: ...", failed, attempts, tc.code)
	}
	if !failed.LastAttempt.After(n1) || failed.LastAttempt.After(n1.Add(fmWindow+fmSlack)) {
		t.Errorf("last_attempt %s is outside the faulted cycle [%s, %s]", fmtT(failed.LastAttempt), fmtT(n1), fmtT(n1.Add(fmWindow)))
	}
	if !failed.CredExpiration.Equal(c0.Expiration) {
		t.Errorf("status expiration %s changed from the cached %s by a failed cycle", fmtT(failed.CredExpiration), fmtT(c0.Expiration))
	}
	n2 := failed.NextRefresh
	// The pause after a first failed cycle is at most one retry window (plus
	// the last call's own duration), and leaves a window before expiry.
	if n2.Before(failed.LastAttempt) || n2.After(failed.LastAttempt.Add(fmWindow+block)) || n2.After(c0.Expiration.Add(-fmWindow)) {
		t.Errorf("next cycle at %s: want within one retry window after the last attempt %s and >= %s before expiry %s",
			fmtT(n2), fmtT(failed.LastAttempt), fmWindow, fmtT(c0.Expiration))
	}

	// Recovery: the next cycle, with the fault gone, succeeds at once.
	var fresh statusRead
	waitFor(t, n2.Add(fmWindow+20*time.Second), "the role to be fresh again", func() bool {
		var ok bool
		fresh, ok = w.findStatus(func(s statusRead) bool {
			return s.State == "fresh" && s.Failed == 0 && s.IssuedAt.After(n1)
		})
		return ok
	})
	t.Logf("recovered: %s issued %s", fresh, fmtT(fresh.IssuedAt))
	if fresh.Attempts != 1 || fresh.LastError != "" {
		t.Errorf("recovery cycle: %s; want 1 attempt and no error", fresh)
	}
	if fresh.IssuedAt.Before(n2) || fresh.IssuedAt.After(n2.Add(fmWindow)) {
		t.Errorf("fresh at %s: want within one retry window of the recovery cycle's start %s", fmtT(fresh.IssuedAt), fmtT(n2))
	}
	c1 := s.readCredsVia(t)
	if c1.AccessKey == c0.AccessKey || !c1.Expiration.After(c0.Expiration) {
		t.Errorf("after recovery: credential %s expiring %s, want a new one expiring after %s", c1.AccessKey, fmtT(c1.Expiration), fmtT(c0.Expiration))
	}
	s.mustBeAccepted(t, c1)
	w.stop()

	// The emulator's view: the first call, exactly `attempts` faulted calls,
	// each inside its block of the cycle that started at n1, and one
	// successful call in the first block of the cycle that started at n2.
	calls := s.roleCalls(t)
	if len(calls) != attempts+2 {
		t.Fatalf("emulator saw %d AssumeRole calls for %s, want %d (1 first + %d in the faulted cycle + 1 recovery):\n%s",
			len(calls), s.role, attempts+2, attempts, callsString(calls))
	}
	if calls[0].Outcome != "ok" || calls[0].Time.After(n1) {
		t.Errorf("first call: %s at %s, want ok before %s", calls[0].Outcome, fmtT(calls[0].Time), fmtT(n1))
	}
	checkBlocks(t, calls[1:1+attempts], n1, block, tc.outcome)
	rec := calls[len(calls)-1]
	if rec.Outcome != "ok" || rec.Time.Before(n2) || rec.Time.After(n2.Add(block+fmSlack)) {
		t.Errorf("recovery call %s at %s, want ok in [%s, %s]", rec.Outcome, fmtT(rec.Time), fmtT(n2), fmtT(n2.Add(block)))
	}

	checkServed(t, w, servedExpect{c0: c0, c1: c1, switchAt: rec.Time})
	creds, store, _ := w.snapshot()
	t.Logf("watched %d creds reads, %d storage reads; fault to fresh: last faulted call %s, fresh %s (%.1fs)",
		len(creds), len(store), fmtT(calls[attempts].Time), fmtT(fresh.IssuedAt), fresh.IssuedAt.Sub(calls[attempts].Time).Seconds())
}

// runExpiryCase: the fault outlasts the credential. Reads are served until
// the credential expires, then answer 503 while nothing valid exists, and the
// role is fresh again within one retry window of the fault clearing.
func runExpiryCase(t *testing.T, s *fmStack, w *watcher, tc faultCase, c0 fmCred, n1 time.Time, block time.Duration, attempts int) {
	// Let reads meet the expired credential for a few seconds: each cold
	// read starts (or joins) a cycle that fails.
	waitFor(t, c0.Expiration.Add(40*time.Second), "503s after the credential expired", func() bool {
		creds, _, _ := w.snapshot()
		n := 0
		for _, r := range creds {
			if r.Code == http.StatusServiceUnavailable && r.Sent.After(c0.Expiration) {
				n++
			}
		}
		return n >= 2 && time.Now().After(c0.Expiration.Add(4*time.Second))
	})
	cleared := time.Now()
	s.emu.ClearFaults(t)
	// Between expiry and the fault clearing, status says expired, or
	// refreshing while a cycle (started by a cold read) runs; never fresh
	// or stale, which would claim a servable credential.
	_, _, statuses := w.snapshot()
	states := map[string]int{}
	for _, st := range statuses {
		if st.Err == "" && st.At.After(c0.Expiration) && st.At.Before(cleared) {
			states[st.State]++
			if st.State != "expired" && st.State != "refreshing" {
				t.Errorf("status at %s after the credential expired: %s", fmtT(st.At), st)
			}
		}
	}
	if len(states) == 0 {
		t.Errorf("no status read between expiry and the fault clearing")
	}
	t.Logf("states between expiry and clearing: %v", states)

	var fresh statusRead
	waitFor(t, cleared.Add(fmWindow+20*time.Second), "the role to be fresh after the fault cleared", func() bool {
		var ok bool
		fresh, ok = w.findStatus(func(s statusRead) bool { return s.State == "fresh" && s.IssuedAt.After(n1) })
		return ok
	})
	took := fresh.IssuedAt.Sub(cleared)
	t.Logf("fault cleared %s, fresh %s (%.1fs): %s", fmtT(cleared), fmtT(fresh.IssuedAt), took.Seconds(), fresh)
	if took > fmWindow {
		t.Errorf("fresh %.1fs after the fault cleared, want within one retry window (%s)", took.Seconds(), fmWindow)
	}
	c1 := s.readCredsVia(t)
	s.mustBeAccepted(t, c1)
	// A moment for the watcher to see the recovered credential too.
	time.Sleep(300 * time.Millisecond)
	w.stop()

	calls := s.roleCalls(t)
	if len(calls) < 2+attempts {
		t.Fatalf("emulator saw %d calls:\n%s", len(calls), callsString(calls))
	}
	checkBlocks(t, calls[1:1+attempts], n1, block, tc.outcome)
	var switchAt time.Time
	for i, c := range calls[1:] {
		if c.Time.Before(cleared) && c.Outcome != tc.outcome {
			t.Errorf("call %d at %s before the fault cleared: %s", i+1, fmtT(c.Time), c.Outcome)
		}
		if c.Outcome == "ok" && switchAt.IsZero() {
			switchAt = c.Time
		}
	}
	_, _, statuses = w.snapshot()
	maxFailed := 0
	for _, st := range statuses {
		if st.Err == "" && st.Failed > 0 && st.Attempts != attempts && st.State != "refreshing" {
			t.Errorf("failed cycle with %d attempts, want %d: %s", st.Attempts, attempts, st)
		}
		maxFailed = max(maxFailed, st.Failed)
	}
	t.Logf("%d failed cycles during the outage; %d faulted calls", maxFailed, len(calls)-2)
	checkServed(t, w, servedExpect{c0: c0, c1: c1, switchAt: switchAt, expiry: true, errCode: tc.code})
}

// fmCred is a credential as `vault read -format=json` shows it.
type fmCred struct {
	AccessKey, SecretKey, SessionToken string
	Expiration                         time.Time
}

// readCredsVia reads the role's creds with the real CLI and checks that the
// credential is complete and unexpired.
func (s *fmStack) readCredsVia(t *testing.T) fmCred {
	t.Helper()
	sec := s.v.Read(t, s.mount+"/creds/"+s.role)
	c := fmCred{AccessKey: sec.Str("access_key"), SecretKey: sec.Str("secret_key"), SessionToken: sec.Str("security_token")}
	exp, err := time.Parse(time.RFC3339, sec.Str("expiration"))
	if err != nil || !strings.HasPrefix(c.AccessKey, "ASIA") || c.SecretKey == "" || c.SessionToken == "" {
		t.Fatalf("creds/%s: incomplete credential (access key %q, expiration %q)", s.role, c.AccessKey, sec.Str("expiration"))
	}
	if !exp.After(time.Now()) {
		t.Fatalf("creds/%s: credential %s expired at %s", s.role, c.AccessKey, fmtT(exp))
	}
	c.Expiration = exp
	return c
}

// mustBeAccepted checks with the emulator (GetCallerIdentity signed with the
// credential, through the real SDK) that it issued c and still accepts it.
func (s *fmStack) mustBeAccepted(t *testing.T, c fmCred) {
	t.Helper()
	if _, err := callerIdentityAt(s.emu.URL, c.AccessKey, c.SecretKey, c.SessionToken); err != nil {
		t.Fatalf("credential %s is not accepted by the emulator: %v", c.AccessKey, err)
	}
}

// checkBlocks asserts that call i was made inside block i of the cycle that
// started at start: [start + i*block, start + (i+1)*block + fmSlack).
func checkBlocks(t *testing.T, calls []vaulttest.EmulatorCall, start time.Time, block time.Duration, outcome string) {
	t.Helper()
	var offsets []string
	for i, c := range calls {
		offsets = append(offsets, fmt.Sprintf("%+.3fs", c.Time.Sub(start).Seconds()))
		lo := start.Add(time.Duration(i) * block)
		hi := lo.Add(block)
		if c.Outcome != outcome {
			t.Errorf("attempt %d: emulator outcome %q, want %q", i, c.Outcome, outcome)
		}
		// 10 ms below: the plugin's wall clock (status) and the emulator's
		// are the same clock, but time.Now rounds differently in each.
		if c.Time.Before(lo.Add(-10*time.Millisecond)) || !c.Time.Before(hi.Add(fmSlack)) {
			t.Errorf("attempt %d at %s (+%.3fs): outside its block [%s, %s)", i, fmtT(c.Time), c.Time.Sub(start).Seconds(), fmtT(lo), fmtT(hi))
		}
	}
	t.Logf("attempts at %s after the cycle was due (blocks of %s)", strings.Join(offsets, " "), block)
}

func callsString(calls []vaulttest.EmulatorCall) string {
	var b strings.Builder
	for _, c := range calls {
		b.WriteString("  " + fmtT(c.Time) + " " + c.Outcome + "\n")
	}
	return b.String()
}

// servedExpect is what the watcher must have seen.
type servedExpect struct {
	c0, c1 fmCred
	// switchAt is when the STS call that issued c1 reached the emulator:
	// nothing else may be stored or served before it.
	switchAt time.Time
	// expiry: c0 expired during the fault; reads may then answer errCode
	// as a 503, and only while nothing valid exists.
	expiry  bool
	errCode string
}

// maxLoopbackClockError bounds the error the plugin may report for its
// estimate of a loopback emulator's clock: the Date header's whole second
// plus a round trip on a loaded machine.
const maxLoopbackClockError = 2 * time.Second

// checkServed asserts the claims about what clients got and what was stored:
// zero errors while a valid credential exists, never an expired or
// incomplete credential, only c0 and then c1 (never a credential from a
// failed attempt), expirations that never go backwards.
func checkServed(t *testing.T, w *watcher, want servedExpect) {
	t.Helper()
	creds, store, statuses := w.snapshot()
	if len(creds) < 50 {
		t.Fatalf("the watcher made only %d creds reads", len(creds))
	}
	// The plugin stops serving a credential once less than a second is
	// left at the late edge of its estimate of AWS's clock: a second plus
	// its error (the Date header's whole second and the round trip) before
	// the expiration. That error, as its status reports it, must stay
	// within what a loopback emulator allows.
	var clockErr time.Duration
	for _, st := range statuses {
		clockErr = max(clockErr, time.Duration(st.ClockError*float64(time.Second)))
	}
	if clockErr > maxLoopbackClockError {
		t.Errorf("the plugin's estimate of AWS's clock was off by up to %s, want at most %s against a loopback emulator", clockErr, maxLoopbackClockError)
	}
	var (
		served, errs503 int
		lastExp         time.Time
		seenC1          bool
		maxGap          time.Duration
	)
	for i, r := range creds {
		if i > 0 {
			maxGap = max(maxGap, r.Sent.Sub(creds[i-1].Recv))
		}
		if r.Code != http.StatusOK {
			// Only when no unexpired credential existed: the plugin stops
			// serving one with less than a second left (plus its error).
			if !want.expiry || r.Code != http.StatusServiceUnavailable || r.Recv.Before(want.c0.Expiration.Add(-time.Second-clockErr)) ||
				(seenC1 && r.Sent.After(want.switchAt)) || !strings.Contains(r.Err, want.errCode) {
				t.Errorf("read sent %s answered HTTP %d %q while credential %s was valid until %s",
					fmtT(r.Sent), r.Code, r.Err, want.c0.AccessKey, fmtT(want.c0.Expiration))
			}
			errs503++
			continue
		}
		served++
		if !r.Complete || !r.Expiration.After(r.Sent) {
			t.Errorf("read sent %s got credential %s, complete %v, expiring %s: incomplete or expired",
				fmtT(r.Sent), r.AccessKey, r.Complete, fmtT(r.Expiration))
		}
		switch r.AccessKey {
		case want.c0.AccessKey:
			if seenC1 {
				t.Errorf("read sent %s got the old credential back after the new one", fmtT(r.Sent))
			}
		case want.c1.AccessKey:
			seenC1 = true
			if r.Recv.Before(want.switchAt) {
				t.Errorf("read got the new credential at %s, before STS issued it at %s", fmtT(r.Recv), fmtT(want.switchAt))
			}
		default:
			t.Errorf("read sent %s got credential %s, neither the first nor the recovered one", fmtT(r.Sent), r.AccessKey)
		}
		if r.Expiration.Before(lastExp) {
			t.Errorf("read sent %s: expiration %s went back from %s", fmtT(r.Sent), fmtT(r.Expiration), fmtT(lastExp))
		}
		lastExp = r.Expiration
	}
	if !want.expiry && maxGap > 2*time.Second {
		t.Errorf("the watcher was blind for %s between two reads", maxGap)
	}
	if want.expiry && errs503 == 0 {
		t.Errorf("no read answered 503 after the credential expired")
	}

	var stored int
	lastExp = time.Time{}
	for _, r := range store {
		if r.Err != "" || !r.Present {
			t.Errorf("storage read at %s: present %v, error %q", fmtT(r.At), r.Present, r.Err)
			continue
		}
		stored++
		if !r.Complete {
			t.Errorf("storage at %s holds an incomplete credential %s", fmtT(r.At), r.AccessKey)
		}
		switch r.AccessKey {
		case want.c0.AccessKey:
		case want.c1.AccessKey:
			if r.Recv.Before(want.switchAt) {
				t.Errorf("storage read answered %s holds the new credential, issued only at %s", fmtT(r.Recv), fmtT(want.switchAt))
			}
		default:
			t.Errorf("storage at %s holds credential %s, neither the first nor the recovered one", fmtT(r.At), r.AccessKey)
		}
		if r.Expiration.Before(lastExp) {
			t.Errorf("stored expiration went back from %s to %s at %s", fmtT(lastExp), fmtT(r.Expiration), fmtT(r.At))
		}
		lastExp = r.Expiration
	}
	t.Logf("creds reads: %d served, %d answered 503, longest gap %s; storage reads: %d", served, errs503, maxGap.Round(time.Millisecond), stored)
}
