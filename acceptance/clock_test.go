package acceptance

import (
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// AWS's clock is the truth (issue 33), through a real Vault: each case's
// emulator keeps a clock of its own, offset from the host's (Vault's), and
// a reader reads the case's role every 1 to 2 s over two credential
// lifetimes, as a client would, honouring Retry-After. What every case
// asserts, judging each answer by the emulator's clock at the read's
// return (host time + the emulator's offset then):
//
//   - no read returns a credential the emulator takes for expired;
//   - every read is served, but the first of a case whose clock is 10
//     minutes off (its one STS call is refused for its signature time; the
//     next, signed on AWS's clock, succeeds) and those of an STS outage
//     after the credential ends by AWS's clock: never earlier, so that with
//     AWS behind a credential is served past its end on the host's clock;
//   - the lease's TTL and expires_in are what the credential has left by
//     AWS's clock, once the plugin could know that clock (in the stepped
//     case, from the second answer after a step);
//   - STS calls per credential stay 1.000: every successful AssumeRole
//     issued a credential that reads were served (none looked expired on
//     arrival and was thrown away, none was fetched twice); the other
//     calls are named: the outage's faulted ones and a 10-minute case's one
//     refused skewed call;
//   - status, config/root and the metrics show the offset measured.

const (
	// clockLifetime is what the emulator issues: two lifetimes of reads
	// are about four minutes.
	clockLifetime = 120 * time.Second
	// clockSlack is how much earlier than AWS's end of a credential the
	// plugin may stop serving it: a second (minServeValidity) plus the
	// offset's error, which a few loopback answers put under a second.
	clockSlack = 4 * time.Second
	// clockRecovery bounds how long after an outage ends a read is served
	// again: the read after a failed block waits at most that block (5 s at
	// the default retry window) and the next read's gap (2 s).
	clockRecovery = 10 * time.Second
)

// clockCase is one emulator clock.
type clockCase struct {
	name string
	// offset is the emulator's clock from the host's at the start.
	offset time.Duration
	// steps change the emulator's clock while the reads run: stepped.
	steps []clockStep
	// outage: once the second credential is issued, STS fails every call
	// for the role until that credential has ended by AWS's clock; reads
	// must then fail, and not a moment before.
	outage bool
	// refresh are config/refresh fields for the case's mount.
	refresh []string
	// lifetime is what the emulator issues (clockLifetime when 0).
	lifetime time.Duration
	// helper: check the credentials helper's Expiration at the end.
	helper bool
}

// clockStep sets the emulator's clock to offset once the emulator has
// issued issued credentials.
type clockStep struct {
	issued int
	offset time.Duration
}

var clockCases = []clockCase{
	{name: "ahead-60s", offset: time.Minute, outage: true},
	{name: "behind-60s", offset: -time.Minute, outage: true},
	{name: "ahead-4m", offset: 4 * time.Minute, outage: true, helper: true},
	{name: "behind-4m", offset: -4 * time.Minute, outage: true, helper: true},
	// Beyond STS's 5-minute signature tolerance: the first call, signed
	// on the host's clock, is refused; its answer's Date corrects the
	// clock the next one is signed on.
	{name: "ahead-10m", offset: 10 * time.Minute, outage: true},
	{name: "behind-10m", offset: -10 * time.Minute, outage: true},
	// AWS's clock steps 20 s ahead as the first credential is issued,
	// then 40 s back (to 20 s behind) as the fourth is, each step known
	// to the plugin two answers later (one held as odd, one confirming
	// it): an NTP step, as the plugin sees one. A step ahead is seen at
	// the next STS call, not before: with 90-second credentials
	// refreshed at half their life, that call comes at least 35 s (the
	// margin less its 10 % jitter and a retry block) before the end, more
	// than the step, as it does for any credential whose refresh margin
	// exceeds the step. The step back (40 s) is shorter than the time
	// between two issues (at least 45 s): the emulator's clock, unlike
	// AWS's, steps back, and a credential expiring before the cached one
	// would be refused.
	{name: "stepped", steps: []clockStep{{issued: 1, offset: 20 * time.Second}, {issued: 4, offset: -20 * time.Second}},
		refresh: []string{"refresh_fraction=0.5"}, lifetime: 90 * time.Second},
}

// TestClockSkew runs every clock case side by side, each with its own
// emulator and its own mount of the plugin in one Vault dev server.
func TestClockSkew(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	v := vaulttest.StartDev(t)
	v.RegisterPlugin(t, vaulttest.PluginBin(t, vaulttest.DefaultPluginVersion), vaulttest.PluginOptions{})
	for i, tc := range clockCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runClockCase(t, v, tc, uint64(i))
		})
	}
}

// clockRun is one case as it runs: its stack, the emulator's clock as the
// test set it, and what the reads saw.
type clockRun struct {
	// fmStack: the Vault, the case's emulator, mount, role and its ARN,
	// as a fault matrix case has them.
	*fmStack
	tc clockCase
	// clocks are the emulator's offsets in the order set, each with the
	// host times around the control call that set it.
	clocks []clockSet
	reads  []clockRead
}

// clockSet is one setting of the emulator's clock: in force from some
// moment between from and to (host times).
type clockSet struct {
	from, to time.Time
	offset   time.Duration
	// issued counts the credentials issued before it; known is when the
	// reader saw two more, whose answers, dated by this clock, let the
	// plugin know it (zero until then, and for the clock at the start,
	// which the first answer measures).
	issued int
	known  time.Time
}

// clockRead is one read of creds/<role> as the reader saw it.
type clockRead struct {
	Sent, Recv time.Time
	Code       int
	Err        string
	RetryAfter time.Duration
	AccessKey  string
	// Expiration is the answer's, in whole seconds: at most AWS's.
	Expiration time.Time
	ExpiresIn  time.Duration
	Lease      time.Duration
}

func runClockCase(t *testing.T, v *vaulttest.Server, tc clockCase, seed uint64) {
	r := &clockRun{tc: tc, fmStack: &fmStack{v: v, mount: "clock-" + tc.name, role: "clock-" + tc.name}}
	r.arn = roleARN(r.role)
	if tc.lifetime == 0 {
		r.tc.lifetime = clockLifetime
	}
	r.emu = vaulttest.StartEmulator(t, "-max-lifetime", r.tc.lifetime.String(), "-clock-offset", tc.offset.String())
	r.clocks = []clockSet{{offset: tc.offset}}
	v.EnablePlugin(t, r.mount, vaulttest.DefaultPluginVersion)
	// Retry-After reaches the reader, which waits it out after a 503.
	v.CLI(t, "secrets", "tune", "-allowed-response-headers=Retry-After", r.mount+"/")
	v.CLI(t, "write", r.mount+"/config/root", "access_key="+r.emu.AccessKey, "secret_key="+r.emu.SecretKey,
		"region=us-east-1", "sts_endpoint="+r.emu.URL)
	if len(tc.refresh) > 0 {
		v.CLI(t, append([]string{"write", r.mount + "/config/refresh"}, tc.refresh...)...)
	}
	v.CLI(t, "write", r.mount+"/roles/"+r.role, "credential_type=assumed_role", "role_arn="+r.arn)

	o := r.readFor(t, rand.New(rand.NewPCG(seed, 33)))
	r.checkReads(t, o)
	r.checkCalls(t)
	r.checkClockShown(t)
	if tc.helper {
		r.checkHelper(t)
	}
}

// clockOutage is what the reader did to STS, and when (host times).
type clockOutage struct {
	// end is when the faulted credential ends by AWS's clock (AWS time).
	end              time.Time
	started, cleared time.Time
}

// readFor reads every 1 to 2 s (or after Retry-After) for two credential
// lifetimes from the first credential served, and past the outage and the
// steps; it sets the outage and the steps as the emulator issues.
func (r *clockRun) readFor(t *testing.T, rnd *rand.Rand) clockOutage {
	t.Helper()
	var (
		o        clockOutage
		start    time.Time // the first served read
		steps    = r.tc.steps
		begin    = time.Now()
		deadline = begin.Add(2*r.tc.lifetime + 3*time.Minute)
	)
	for {
		rd := r.read(t)
		r.reads = append(r.reads, rd)
		if rd.Code == http.StatusOK && start.IsZero() {
			start = rd.Recv
		}
		issued := r.issued(t)
		for len(steps) > 0 && len(issued) >= steps[0].issued {
			r.setClock(t, steps[0].offset, len(issued))
			steps = steps[1:]
		}
		if c := &r.clocks[len(r.clocks)-1]; len(r.clocks) > 1 && c.known.IsZero() && len(issued) >= c.issued+2 {
			c.known = time.Now()
		}
		switch {
		case r.tc.outage && o.started.IsZero() && len(issued) >= 2:
			// The second credential's refresh fails, and every cycle
			// after, until that credential has ended by AWS's clock.
			r.emu.SetFaults(t, vaulttest.FaultPlan{Probability: map[string]float64{"ServiceUnavailable": 1}, Match: r.arn})
			o.started, o.end = time.Now(), issued[1].IssuedExpiration
			t.Logf("STS down from %s; credential %s ends at %s by AWS's clock", fmtT(o.started), issued[1].IssuedKeyID, fmtT(o.end))
		case !o.started.IsZero() && o.cleared.IsZero() && r.awsNow(time.Now()).After(o.end.Add(8*time.Second)):
			r.emu.ClearFaults(t)
			o.cleared = time.Now()
			t.Logf("STS up again at %s", fmtT(o.cleared))
		}
		// The last step is done once two answers of its clock let the
		// plugin know it, and a few reads saw what came of it.
		last := r.clocks[len(r.clocks)-1]
		done := !start.IsZero() && time.Since(start) > 2*r.tc.lifetime &&
			(len(r.tc.steps) == 0 || len(steps) == 0 && !last.known.IsZero() && time.Since(last.known) > 2*clockRecovery) &&
			(!r.tc.outage || !o.cleared.IsZero() && time.Since(o.cleared) > 2*clockRecovery)
		if done {
			return o
		}
		if start.IsZero() && time.Since(begin) > 2*time.Minute {
			// A 10-minute case's second attempt is one retry block after
			// its first: this is no skew the plugin corrected.
			t.Fatalf("no credential served in 2 minutes of reads; the last answered HTTP %d: %s", rd.Code, rd.Err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the case did not run its course in time: first credential at %s, outage from %s to %s, %d steps left",
				fmtT(start), fmtT(o.started), fmtT(o.cleared), len(steps))
		}
		wait := time.Second + time.Duration(rnd.Int64N(int64(time.Second)))
		time.Sleep(max(wait, rd.RetryAfter))
	}
}

// read reads creds/<role> once over HTTP.
func (r *clockRun) read(t *testing.T) clockRead {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.v.Addr+"/v1/"+r.mount+"/creds/"+r.role, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Vault-Token", r.v.RootToken())
	rd := clockRead{Sent: time.Now()}
	resp, err := fmHTTP.Do(req)
	rd.Recv = time.Now()
	if err != nil {
		t.Fatalf("reading creds/%s: %v", r.role, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var body struct {
		Errors        []string `json:"errors"`
		LeaseDuration int64    `json:"lease_duration"`
		Data          struct {
			AccessKey  string      `json:"access_key"`
			Expiration string      `json:"expiration"`
			ExpiresIn  json.Number `json:"expires_in"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("creds/%s answered HTTP %d that is not JSON: %v", r.role, resp.StatusCode, err)
	}
	rd.Code, rd.Err = resp.StatusCode, strings.Join(body.Errors, "; ")
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
		rd.RetryAfter = time.Duration(s) * time.Second
	}
	if rd.Code != http.StatusOK {
		return rd
	}
	rd.AccessKey, rd.Lease = body.Data.AccessKey, time.Duration(body.LeaseDuration)*time.Second
	if rd.Expiration, err = time.Parse(time.RFC3339, body.Data.Expiration); err != nil {
		t.Fatalf("creds/%s: expiration %q: %v", r.role, body.Data.Expiration, err)
	}
	n, err := body.Data.ExpiresIn.Int64()
	if err != nil {
		t.Fatalf("creds/%s: expires_in %q: %v", r.role, body.Data.ExpiresIn, err)
	}
	rd.ExpiresIn = time.Duration(n) * time.Second
	return rd
}

// issued returns the emulator's successful AssumeRole calls for the role,
// oldest first.
func (r *clockRun) issued(t *testing.T) []vaulttest.EmulatorCall {
	t.Helper()
	var out []vaulttest.EmulatorCall
	for _, c := range r.roleCalls(t) {
		if c.Outcome == "ok" {
			out = append(out, c)
		}
	}
	return out
}

// setClock sets the emulator's clock to offset from the host's.
// issued is how many credentials the emulator has issued so far.
func (r *clockRun) setClock(t *testing.T, offset time.Duration, issued int) {
	t.Helper()
	from := time.Now()
	r.emu.SetConfig(t, map[string]any{"clock_offset": offset.String()})
	r.clocks = append(r.clocks, clockSet{from: from, to: time.Now(), offset: offset, issued: issued})
	t.Logf("AWS's clock set to %s from the host's at %s", offset, fmtT(from))
}

// offsetsAt returns the emulator's offset at the host time at: the
// setting in force, or while a setting was being made, both the old and
// the new one (lo <= hi).
func (r *clockRun) offsetsAt(at time.Time) (lo, hi time.Duration) {
	lo, hi = r.clocks[0].offset, r.clocks[0].offset
	for i, c := range r.clocks[1:] {
		switch {
		case !at.Before(c.to):
			lo, hi = c.offset, c.offset
		case !at.Before(c.from):
			prev := r.clocks[i].offset
			lo, hi = min(prev, c.offset), max(prev, c.offset)
		}
	}
	return lo, hi
}

// offsetKnown reports whether the plugin could know the emulator's clock
// for a read sent at sent and answered at recv, and which of r.clocks it
// was: no step since the two answers that showed the clock in force.
// Between a step and those answers, the plugin judges by the clock before
// the step, which nothing can tell it has moved.
func (r *clockRun) offsetKnown(sent, recv time.Time) (int, bool) {
	for i := len(r.clocks) - 1; i > 0; i-- {
		if c := r.clocks[i]; !recv.Before(c.from) {
			return i, !c.known.IsZero() && sent.After(c.known)
		}
	}
	return 0, true
}

// awsNow is AWS's time (the emulator's clock) at the host time at, at its
// latest.
func (r *clockRun) awsNow(at time.Time) time.Time {
	_, hi := r.offsetsAt(at)
	return at.Add(hi)
}

// checkReads asserts what the reads got, judged by the emulator's clock.
func (r *clockRun) checkReads(t *testing.T, o clockOutage) {
	t.Helper()
	skewed := r.tc.offset >= 5*time.Minute || r.tc.offset <= -5*time.Minute
	var served, failed, failedFirst, failedOutage int
	ttlChecked := make([]int, len(r.clocks)) // by clock
	firstServed := -1
	var recovered time.Time
	for i, rd := range r.reads {
		lo, hi := r.offsetsAt(rd.Recv)
		if rd.Code == http.StatusOK {
			served++
			if firstServed < 0 {
				firstServed = i
			}
			if !o.cleared.IsZero() && rd.Sent.After(o.cleared) && recovered.IsZero() {
				recovered = rd.Recv
			}
			// Its end by AWS's clock is not yet reached when the answer
			// arrives: the expiration shown is whole seconds, at most
			// AWS's.
			if !rd.Expiration.After(rd.Recv.Add(hi)) {
				t.Errorf("read %d answered at %s (AWS's clock %s) served credential %s that expired at %s by AWS's clock",
					i, fmtT(rd.Recv), fmtT(rd.Recv.Add(hi)), rd.AccessKey, fmtT(rd.Expiration))
			}
			// The lease and expires_in are the time left by AWS's clock,
			// in whole seconds, taken between the read's send and return,
			// once the plugin could know that clock.
			clk, known := r.offsetKnown(rd.Sent, rd.Recv)
			if !known {
				continue
			}
			ttlChecked[clk]++
			// From the late edge of the plugin's estimate: short by up
			// to its error (the Date's second and the trip) as well.
			least := rd.Expiration.Sub(rd.Recv.Add(hi)) - 3*time.Second
			most := rd.Expiration.Add(time.Second).Sub(rd.Sent.Add(lo)) + time.Second
			for what, got := range map[string]time.Duration{"lease_duration": rd.Lease, "expires_in": rd.ExpiresIn} {
				if got < least || got > most {
					t.Errorf("read %d at %s: %s %s, want the %s to %s the credential has left by AWS's clock",
						i, fmtT(rd.Recv), what, got, least.Round(time.Second), most.Round(time.Second))
				}
			}
			continue
		}
		failed++
		switch {
		case firstServed < 0 && skewed && failedFirst == 0 && strings.Contains(rd.Err, "RequestTimeTooSkewed"):
			// The first call, signed on the host's clock, refused.
			failedFirst++
		case !o.started.IsZero() && !rd.Recv.Add(hi).Before(o.end.Add(-clockSlack)) &&
			(o.cleared.IsZero() || recovered.IsZero()) && strings.Contains(rd.Err, "ServiceUnavailable"):
			failedOutage++
		default:
			t.Errorf("read %d sent %s answered at %s (AWS's clock %s) HTTP %d: %s; want a credential",
				i, fmtT(rd.Sent), fmtT(rd.Recv), fmtT(rd.Recv.Add(hi)), rd.Code, rd.Err)
		}
	}
	t.Logf("%d reads: %d served (with the lease and expires_in checked, by clock: %v), %d failed (%d refused for the clock at the start, %d after the credential ended in the outage)",
		len(r.reads), served, ttlChecked, failed, failedFirst, failedOutage)
	for i, n := range ttlChecked[1:] {
		if n < 5 {
			t.Errorf("only %d served reads came while the plugin could know AWS's clock at %s: the step's lease and expires_in are not checked", n, r.clocks[i+1].offset)
		}
	}
	if skewed && failedFirst != 1 {
		t.Errorf("with AWS's clock %s off, %d first reads failed for the clock, want the one whose call was refused", r.tc.offset, failedFirst)
	}
	if r.tc.outage {
		if failedOutage == 0 {
			t.Errorf("no read failed after the credential ended by AWS's clock (%s) while STS was down", fmtT(o.end))
		}
		if recovered.IsZero() || recovered.Sub(o.cleared) > clockRecovery {
			t.Errorf("STS up again at %s, first read served after it at %s: want within %s", fmtT(o.cleared), fmtT(recovered), clockRecovery)
		}
	}
}

// checkCalls asserts one STS call per credential: every successful
// AssumeRole issued a credential that reads were served, and every
// credential served was issued; the other calls are named.
func (r *clockRun) checkCalls(t *testing.T) {
	t.Helper()
	served := map[string]int{}
	for _, rd := range r.reads {
		if rd.Code == http.StatusOK {
			served[rd.AccessKey]++
		}
	}
	outcomes := map[string]int{}
	ok := 0
	for i, c := range r.roleCalls(t) {
		outcomes[c.Outcome]++
		switch {
		case c.Outcome == "ok":
			ok++
			if served[c.IssuedKeyID] == 0 {
				t.Errorf("call %d at %s issued credential %s, which no read was served: thrown away, or fetched again before use", i, fmtT(c.Time), c.IssuedKeyID)
			}
		case c.Outcome == "SignatureDoesNotMatch" && i == 0 && (r.tc.offset >= 5*time.Minute || r.tc.offset <= -5*time.Minute):
			// The one call signed on the host's clock.
		case c.Outcome == "ServiceUnavailable" && r.tc.outage:
		default:
			t.Errorf("call %d at %s (AWS's clock): outcome %s", i, fmtT(c.Time), c.Outcome)
		}
	}
	if ok != len(served) {
		t.Errorf("%d successful STS calls for %d distinct credentials served (%.3f calls per credential), want 1.000", ok, len(served), float64(ok)/float64(max(len(served), 1)))
	}
	t.Logf("STS calls per credential: %.3f (%d successful AssumeRole calls, %d distinct credentials served); all calls by outcome: %v",
		float64(ok)/float64(max(len(served), 1)), ok, len(served), outcomes)
}

// checkClockShown asserts that status, config/root and the metrics show
// the emulator's clock as it ended.
func (r *clockRun) checkClockShown(t *testing.T) {
	t.Helper()
	want := r.clocks[len(r.clocks)-1].offset
	near := func(what string, got float64) {
		t.Helper()
		if d := time.Duration(got*float64(time.Second)) - want; d > time.Second || d < -time.Second {
			t.Errorf("%s = %.3f s, want AWS's offset %s ± 1 s", what, got, want)
		}
	}
	var st struct {
		Offset float64 `json:"aws_clock_offset"`
		Basis  string  `json:"aws_clock_basis"`
	}
	if code, msg, err := fmGet(context.Background(), r.v, r.mount+"/status/"+r.role, &st); err != nil || code != http.StatusOK {
		t.Fatalf("status/%s: HTTP %d %s %v", r.role, code, msg, err)
	}
	near("status aws_clock_offset", st.Offset)
	if st.Basis != "measured" {
		t.Errorf("status aws_clock_basis %q, want measured", st.Basis)
	}
	var root struct {
		Clocks map[string]struct {
			Offset float64 `json:"offset"`
		} `json:"aws_clocks"`
	}
	if code, msg, err := fmGet(context.Background(), r.v, r.mount+"/config/root", &root); err != nil || code != http.StatusOK {
		t.Fatalf("config/root: HTTP %d %s %v", code, msg, err)
	}
	c, ok := root.Clocks[r.emu.URL]
	if !ok {
		t.Fatalf("config/root aws_clocks %v has no %s", root.Clocks, r.emu.URL)
	}
	near("config/root aws_clocks offset", c.Offset)
	code, page := getMetricsAt(t, r.v, r.mount)
	m := regexp.MustCompile(`(?m)^aws_resilient_aws_clock_offset_seconds\{[^}]*endpoint="primary"[^}]*\} (\S+)$`).FindStringSubmatch(page)
	if code != http.StatusOK || m == nil {
		t.Fatalf("metrics: HTTP %d without aws_resilient_aws_clock_offset_seconds{endpoint=\"primary\"}", code)
	}
	got, _ := strconv.ParseFloat(m[1], 64)
	near("aws_resilient_aws_clock_offset_seconds", got)
}

// getMetricsAt reads mount's metrics page with the root token.
func getMetricsAt(t *testing.T, v *vaulttest.Server, mount string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, v.Addr+"/v1/"+mount+"/metrics", nil)
	req.Header.Set("X-Vault-Token", v.RootToken())
	resp, err := fmHTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// checkHelper runs the credentials helper against the case's mount: the
// Expiration it gives the SDKs is on the host's clock, its time at the
// answer plus expires_in, not the plugin's expiration, which is AWS's.
func (r *clockRun) checkHelper(t *testing.T) {
	t.Helper()
	before := time.Now()
	res := runCmd(t, helperEnv(t, r.v.Addr, r.v.RootToken()), vaulttest.CredentialsHelperBin(t),
		"credential-process", "--mount", r.mount, "--role", r.role)
	after := time.Now()
	var pc processCreds
	if res.code != 0 || json.Unmarshal([]byte(res.stdout), &pc) != nil {
		t.Fatalf("credential-process: exit %d: %s", res.code, res.stderr)
	}
	// What the plugin says the credential has left now, by AWS's clock.
	var st struct {
		ExpiresIn int64 `json:"expires_in"`
	}
	if code, msg, err := fmGet(context.Background(), r.v, r.mount+"/status/"+r.role, &st); err != nil || code != http.StatusOK {
		t.Fatalf("status/%s: HTTP %d %s %v", r.role, code, msg, err)
	}
	left := time.Duration(st.ExpiresIn) * time.Second
	// Whole seconds on both sides: expires_in rounded down, the
	// Expiration printed too.
	lo, hi := before.Add(left-3*time.Second), time.Now().Add(left+time.Second)
	if pc.Expiration.Before(lo) || pc.Expiration.After(hi) {
		t.Errorf("credential-process Expiration %s, want the host's time plus what it has left by AWS's clock, in [%s, %s] (the plugin's expiration, on AWS's clock, %s off)",
			fmtT(pc.Expiration), fmtT(lo), fmtT(hi), r.tc.offset)
	}
	want := "behind"
	if r.tc.offset > 0 {
		want = "ahead of"
	}
	if !strings.Contains(res.stderr, "AWS's clock is") || !strings.Contains(res.stderr, want+" this host's") {
		t.Errorf("credential-process's stderr does not say AWS's clock is %s %s this host's: %q", r.tc.offset, want, res.stderr)
	}
	t.Logf("credential-process at %s gave Expiration %s (%s left by AWS's clock)", fmtT(after), fmtT(pc.Expiration), left)
}

// TestClockSkewAlert: a real Prometheus scrapes the plugin through Vault
// and evaluates the shipped rules (every for: cut to 2s): with AWS's clock
// agreeing with the host's, AWSResilientClockSkew stays quiet; stepped 60 s
// ahead (confirmed by a second answer), it fires for the primary endpoint;
// put back, it resolves.
func TestClockSkewAlert(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	s := newDevStack(t, nil, nil)
	s.createRole(t, "app")
	s.readCreds(t, "app")
	prom := startAlertingPrometheus(t, s.vault)
	a := &alertWatch{t: t, prom: prom}
	offsetIs := func(want float64) func() bool {
		return func() bool {
			got := prom.Query(t, `aws_resilient_aws_clock_offset_seconds{endpoint="primary"}`)
			return len(got) == 1 && got[0].Value > want-1 && got[0].Value < want+1
		}
	}
	vaulttest.WaitFor(t, time.Minute, "the offset series in Prometheus", offsetIs(0))
	// A few evaluations with the series at 0: nothing pending or firing.
	for i := 0; i < 5; i++ {
		if st := prom.AlertState(t, "AWSResilientClockSkew"); st != "" {
			t.Fatalf("AWSResilientClockSkew is %s with AWS's clock agreeing with the host's", st)
		}
		time.Sleep(time.Second)
	}
	// Two answers from the stepped clock: the first is held as odd, the
	// second confirms the step. They come from a role read for the first
	// time and refreshed: the emulator's clock, unlike AWS's, steps back,
	// and a credential of a role fetched before such a step would expire
	// before the cached one, which the plugin refuses.
	step := func(offset, role string) {
		t.Helper()
		s.emu.SetConfig(t, map[string]any{"clock_offset": offset})
		s.createRole(t, role)
		s.readCreds(t, role)
		s.vault.CLI(t, "write", "-f", mount+"/refresh/"+role)
	}
	step("60s", "ahead")
	vaulttest.WaitFor(t, time.Minute, "aws_resilient_aws_clock_offset_seconds 60 in Prometheus", offsetIs(60))
	a.waitFiring("AWSResilientClockSkew", "")
	firing := false
	for _, al := range prom.Alerts(t) {
		firing = firing || al.Labels["alertname"] == "AWSResilientClockSkew" && al.Labels["endpoint"] == "primary" && al.State == "firing"
	}
	if !firing {
		t.Fatalf("AWSResilientClockSkew fires, but not for endpoint primary: %v", prom.Alerts(t))
	}
	step("0s", "agreeing")
	vaulttest.WaitFor(t, time.Minute, "aws_resilient_aws_clock_offset_seconds 0 in Prometheus", offsetIs(0))
	a.waitResolved("AWSResilientClockSkew")
}
