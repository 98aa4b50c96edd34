package awsresilient

import (
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
	"github.com/hashicorp/vault/sdk/logical"
)

// malformedShapes are the credentials STS could plausibly answer a 200 with
// that must never be cached: each of the emulator's credential shapes, the
// rejection reason (aws_resilient_credentials_rejected_total) and the
// message status shows in last_error.
var malformedShapes = []struct {
	fault   stsemu.Fault
	reason  string
	message string
}{
	{stsemu.FaultEmptyKey, "empty_access_key", "InvalidCredential: STS returned an empty access key id"},
	{stsemu.FaultEmptySecret, "empty_secret_key", "InvalidCredential: STS returned an empty secret access key"},
	{stsemu.FaultEmptyToken, "empty_session_token", "InvalidCredential: STS returned an empty session token"},
	{stsemu.FaultNoExpiration, "no_expiration", "InvalidCredential: STS returned a credential without an expiration"},
	{stsemu.FaultExpired, "expired", "InvalidCredential: STS returned a credential that expired at "},
	{stsemu.FaultFarExpiration, "expiration_too_late", "InvalidCredential: STS returned a credential expiring at 21"},
	// Rejected, not trimmed (validateCredential says why); the access key id
	// is the first part checked, and the message never holds a value.
	{stsemu.FaultWhitespace, "whitespace", "InvalidCredential: STS returned a credential whose access key id is wrapped in whitespace"},
}

// TestMalformedCredential_CachedRole: with a good credential cached, the
// scheduled cycle's first attempt gets the malformed shape (the emulator's
// plan, for this role and one call). Between that attempt and the next
// block's: the attempt failed with its named reason, nothing changed in
// cache/, the last good credential is served without an STS call and
// status says why. The emulator heals, and the next block's attempt
// stores a whole credential.
func TestMalformedCredential_CachedRole(t *testing.T) {
	if len(malformedShapes) != len(stsemu.CredentialShapes()) {
		t.Fatalf("the emulator has %d credential shapes, this test %d", len(stsemu.CredentialShapes()), len(malformedShapes))
	}
	for _, tc := range malformedShapes {
		t.Run(string(tc.fault), func(t *testing.T) {
			f := newFixture(t, fixtureOpts{refresh: map[string]interface{}{"max_retries": 6, "retry_window": "30s"}})
			good := f.mustReadCreds(testRole)
			cacheBefore := cacheEntries(t, f.s)
			key := roleKey(testRole)
			f.emu.SetFaults(stsemu.FaultPlan{Sequence: []stsemu.FaultStep{{Fault: tc.fault, Count: 1}}, Match: "role/" + testRole})
			f.log.reset()
			f.emu.ResetStats()

			start, ok := f.b.refresher.plannedAt(key)
			if !ok {
				t.Fatal("no refresh planned")
			}
			f.drainFlights()
			f.clock.AdvanceTo(start)
			fl := f.nextFlight()
			failedAt := f.driveToFailedAttempt(key, fl)

			// The attempt failed, for the shape's reason.
			calls := f.emu.Calls()
			if len(calls) != 1 || calls[0].Outcome != string(tc.fault) {
				t.Fatalf("emulator calls %+v, want one answered with %s", calls, tc.fault)
			}
			if !strings.HasPrefix(failedAt.err.Error(), tc.message) || failedAt.err.rejected != tc.reason {
				t.Fatalf("attempt failed with %q (rejected %q), want %q (%s)", failedAt.err.Error(), failedAt.err.rejected, tc.message, tc.reason)
			}
			scrapeMetrics(t, f.b, f.s, "").want("aws_resilient_credentials_rejected_total", map[string]string{"reason": tc.reason}, 1)
			// Nothing stored: cache/ is as it was, byte for byte.
			if after := cacheEntries(t, f.s); !sameSnapshot(cacheBefore, after) {
				t.Fatalf("cache/ changed after a rejected credential:\nbefore %v\nafter  %v", cacheBefore, after)
			}
			// The last good credential keeps being served, from the cache.
			resp := mustDo(t, f.b, f.s, logical.ReadOperation, "creds/"+testRole, nil)
			if resp.Data["access_key"] != good.Data["access_key"] || resp.Data["session_token"] != good.Data["session_token"] {
				t.Fatalf("served %v, want the last good credential %v", resp.Data["access_key"], good.Data["access_key"])
			}
			if n := len(f.emu.Calls()); n != 1 {
				t.Fatalf("the read made an STS call (%d calls)", n)
			}
			// Status says why.
			st := f.status(testRole)
			if msg, _ := st["last_error"].(string); !strings.HasPrefix(msg, tc.message) || st["state"] != stateRefreshing {
				t.Fatalf("status %v, want state refreshing and last_error %q", st, tc.message)
			}

			// The emulator heals; the next block's attempt succeeds.
			f.emu.ClearFaults()
			f.clock.DriveUntil(t, fl.done)
			calls = f.emu.Calls()
			times := f.log.times()
			block := 5 * time.Second
			if len(calls) != 2 || calls[1].Outcome != "ok" || len(times) != 2 || times[1].Before(start.Add(block)) || !times[1].Before(start.Add(2*block)) {
				t.Fatalf("calls %+v at %v, want a second, successful one in the second block [%v, %v)", calls, times, start.Add(block), start.Add(2*block))
			}
			stored := cached(t, f.s, testRole)
			if stored == nil || stored.AccessKey != calls[1].IssuedKeyID || validateCredential(stored, mustRole(t, f), f.clock.Now()) != nil {
				t.Fatalf("stored %+v, want the second call's credential %s, whole", stored, calls[1].IssuedKeyID)
			}
			st = f.status(testRole)
			if st["state"] != stateFresh || st["last_error"] != "" || st["attempts_last_cycle"] != 2 || st["failed_cycles"] != 0 {
				t.Fatalf("status after the heal %v, want fresh, no error, 2 attempts, no failed cycle", st)
			}
			if resp := mustDo(t, f.b, f.s, logical.ReadOperation, "creds/"+testRole, nil); resp.Data["access_key"] != stored.AccessKey {
				t.Fatalf("served %v after the heal, want %s", resp.Data["access_key"], stored.AccessKey)
			}
		})
	}
}

// TestMalformedCredential_ColdRole: with nothing cached, a cycle whose every
// attempt gets the shape stores nothing, answers the read with a 503 naming
// the reason and records it as the failed cycle's last_error; once the
// emulator heals, the next cycle's first attempt caches a credential.
func TestMalformedCredential_ColdRole(t *testing.T) {
	for _, tc := range malformedShapes {
		t.Run(string(tc.fault), func(t *testing.T) {
			f := newFixture(t, fixtureOpts{refresh: map[string]interface{}{"max_retries": 3, "retry_window": "15s"}})
			f.emu.SetFaults(stsemu.FaultPlan{Probability: map[stsemu.Fault]float64{tc.fault: 1}, Match: "role/" + testRole})

			resp, err := f.coldCycle(testRole)
			wantCoded(t, resp, err, 503, `no valid credential for role "app"`, tc.message)
			if n := f.emu.Stats().Count("AssumeRole", string(tc.fault)); n != 3 {
				t.Fatalf("%d calls answered with %s, want 3", n, tc.fault)
			}
			scrapeMetrics(t, f.b, f.s, "").want("aws_resilient_credentials_rejected_total", map[string]string{"reason": tc.reason}, 3)
			if c := cacheEntries(t, f.s); len(c) != 0 {
				t.Fatalf("a failed cycle stored %v", c)
			}
			st := f.status(testRole)
			if msg, _ := st["last_error"].(string); !strings.HasPrefix(msg, tc.message) || st["state"] != stateEmpty || st["failed_cycles"] != 1 {
				t.Fatalf("status %v, want empty, 1 failed cycle, last_error %q", st, tc.message)
			}
			stored, err := getStatus(t.Context(), f.s, roleKey(testRole))
			if err != nil || stored == nil || !strings.HasPrefix(stored.LastError, tc.message) {
				t.Fatalf("status/ in storage %+v (%v), want last_error %q", stored, err, tc.message)
			}

			f.emu.ClearFaults()
			f.log.reset()
			f.fireScheduled(roleKey(testRole))
			c := cached(t, f.s, testRole)
			if n := len(f.log.all()); n != 1 || c == nil || validateCredential(c, mustRole(t, f), f.clock.Now()) != nil {
				t.Fatalf("after the heal: %d calls, cached %+v; want one call and a whole credential", n, c)
			}
			if st := f.status(testRole); st["state"] != stateFresh || st["last_error"] != "" {
				t.Fatalf("status after the heal %v", st)
			}
		})
	}
}

// driveToFailedAttempt drives the fake clock through fl's sleepers until an
// attempt of the cycle has failed and the cycle sleeps towards its next
// block, and returns that failure as the read budget recorded it.
func (f *fixture) driveToFailedAttempt(key credKey, fl *flight) lastFailure {
	f.t.Helper()
	for {
		var at time.Time
		var sleeping, failed bool
		var lf lastFailure
		f.clock.WaitUntil(f.t, func() bool {
			// The sleeper first: a cycle sleeps after recording its
			// failure, so a sleeper seen before the failure is looked up
			// is an earlier one.
			at, sleeping = f.clock.NextSleeper()
			lf, failed = f.b.flights.lastFailed(key, fl.gen)
			return sleeping || isClosed(fl.done)
		}, func() string { return "the cycle to sleep" })
		if isClosed(fl.done) {
			f.t.Fatalf("the cycle ended (%s, error %v) without a failed attempt", fl.res.outcome, fl.res.err)
		}
		if failed {
			return lf
		}
		f.clock.AdvanceTo(at)
	}
}

// cacheEntries is every entry under cache/, for "nothing stored" checks.
func cacheEntries(t *testing.T, s logical.Storage) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, v := range snapshot(t, s) {
		if strings.HasPrefix(k, cachePrefix) {
			out[k] = v
		}
	}
	return out
}

// mustRole is the fixture's role as stored.
func mustRole(t *testing.T, f *fixture) *roleEntry {
	t.Helper()
	r, err := getRole(t.Context(), f.s, testRole)
	if err != nil || r == nil {
		t.Fatalf("role %s: %v", testRole, err)
	}
	return r
}
