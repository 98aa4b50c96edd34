package acceptance

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// chainAccounts are the accounts of the hub-and-spoke estate: the hub role
// in the first, ten application roles in each of the others.
var chainAccounts = []string{"111111111111", "222222222222", "333333333333", "444444444444", "555555555555", "666666666666"}

// TestChainHubAndSpokes (issue 35): a hub role and 50 targets in 5 other
// accounts, whose trust policies (the emulator's) name the hub role alone,
// through a real Vault:
//   - every target's AssumeRole is signed by the hub's current credential
//     (the emulator's call log names the signing key and its caller);
//   - over several refresh rounds, STS calls per credential are 1.000 for
//     the hub and for the targets: no call of the hub on a target's behalf;
//   - with the hub denied for a while, the targets keep serving, make no
//     STS call, and their status names the hub; once it is allowed again
//     the hub is called once and each target once: no storm;
//   - LIST roles source_role=hub lists the 50, and the hub's delete is a
//     409 unless forced.
func TestChainHubAndSpokes(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	const (
		lifetime = 60 * time.Second // refresh due with 30 s left (fraction 0.5)
		margin   = lifetime / 2
		rounds   = 100 * time.Second
		// A denial from just before the hub's refresh is due, long enough
		// for the targets planned near it (their plans are spread, so
		// some of the 50) to fall due while its credential is due.
		denied  = 12 * time.Second
		targets = 50
	)
	hubARN := "arn:aws:iam::" + chainAccounts[0] + ":role/hub"
	type roleTrust struct {
		RoleArn string   `json:"role_arn"`
		Trust   []string `json:"trust"`
	}
	trust := []roleTrust{{RoleArn: hubARN, Trust: []string{"arn:aws:iam::" + vaulttest.EmulatorAccount + ":user/sts-emulator"}}}
	names := make([]string, targets)
	arns := map[string]string{}
	for i := range names {
		names[i] = fmt.Sprintf("app-%02d", i)
		arns[names[i]] = fmt.Sprintf("arn:aws:iam::%s:role/%s", chainAccounts[1+i%5], names[i])
		trust = append(trust, roleTrust{RoleArn: arns[names[i]], Trust: []string{hubARN}})
	}
	b, err := json.Marshal(trust)
	if err != nil {
		t.Fatal(err)
	}
	trustFile := filepath.Join(t.TempDir(), "trust.json")
	if err := os.WriteFile(trustFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s := newDevStack(t, []string{"-max-lifetime", lifetime.String(), "-trust-file", trustFile},
		map[string]string{"retry_window": "2", "max_retries": "2", "refresh_fraction": "0.5", "sts_rate_limit": "50", "sts_burst": "50"})
	v := s.vault
	v.CLI(t, "write", mount+"/roles/hub", "role_arn="+hubARN)
	for _, name := range names {
		v.CLI(t, "write", mount+"/roles/"+name, "role_arn="+arns[name], "source_role=hub")
	}
	var list vaulttest.Secret
	v.CLIJSON(t, &list, "read", "-format=json", mount+"/roles", "list=true", "source_role=hub")
	if keys, _ := list.Data["keys"].([]any); len(keys) != targets {
		t.Fatalf("LIST roles source_role=hub lists %d roles, want %d", len(keys), targets)
	}
	for _, name := range names {
		v.Read(t, mount+"/creds/"+name)
	}

	// Several refresh rounds, watched through LIST status: every
	// credential each role goes through (its expiration) is seen, the
	// first ones included (they live a minute).
	seen := watchExpirations(t, v, rounds)
	calls := s.emu.Calls(t)
	hubKeys := chainSignatures(t, calls, hubARN, arns)
	for _, role := range append([]string{"hub"}, names...) {
		arn := hubARN
		if role != "hub" {
			arn = arns[role]
		}
		n, creds := callsPerCredential(calls, arn, seen, role, seen.last.Add(-2*time.Second))
		if n != creds || creds < 2 {
			t.Errorf("role %s: %d STS calls for %d credentials over %s, want one per credential and at least 2 rounds", role, n, creds, rounds)
		}
	}
	t.Logf("%d refresh rounds of the hub, %d STS calls in all", len(hubKeys), len(calls))

	// The hub denied from a second before its refresh is due: the targets,
	// due then too, keep serving. Each asks for the hub's refresh first,
	// which fails, and then signs with the hub's credential still valid
	// (lastResort: a chained session's life does not depend on its
	// signer's); the denial ends before that credential does.
	var hubUnfit, hubExpires time.Time
	for {
		var st vaulttest.Secret
		v.API(t, http.MethodGet, mount+"/status/hub", nil, &st)
		exp, err := time.Parse(time.RFC3339Nano, st.Str("expiration"))
		if err != nil {
			t.Fatalf("status/hub expiration %q: %v", st.Str("expiration"), err)
		}
		if due := exp.Add(-margin - time.Second); time.Until(due) > 500*time.Millisecond {
			time.Sleep(time.Until(due))
			hubUnfit, hubExpires = exp.Add(-margin).Add(200*time.Millisecond), exp
			break
		}
		time.Sleep(2 * time.Second) // its refresh is under way: the next round
	}
	s.emu.Reset(t)
	s.emu.SetConfig(t, map[string]any{"deny": []string{"hub"}})
	deniedFrom := time.Now()
	plans := nextRefreshes(t, v)
	ctx, cancel := context.WithTimeout(context.Background(), denied)
	failedReads := readAll(ctx, t, v, names)
	cancel()
	if failedReads != "" {
		t.Errorf("a target's read failed while the hub was denied: %s", failedReads)
	}
	// Each target whose refresh was planned inside the denial, after the
	// hub's credential stopped being fit and early enough for its cycle
	// (retry_window 2 s) to end in it, was refreshed all the same, signed
	// by the hub's credential of before the denial.
	refreshed := map[string]bool{}
	for _, c := range s.emu.Calls(t) {
		switch {
		case c.Action != "AssumeRole" || c.RoleArn == hubARN:
		case c.Outcome != "ok" || c.CallerArn != "arn:aws:sts::"+chainAccounts[0]+":assumed-role/hub/vault-hub":
			t.Errorf("a target's call while the hub was denied: %+v, want it signed by the hub's session, and ok", c)
		case !c.Time.Before(hubExpires):
			t.Errorf("a target's call at %s was signed by the hub's credential expired at %s", c.Time, hubExpires)
		default:
			for name, arn := range arns {
				if arn == c.RoleArn {
					refreshed[name] = true
				}
			}
		}
	}
	due := 0
	for _, name := range names {
		if at := plans[name]; at.After(hubUnfit) && at.Before(deniedFrom.Add(denied-2*time.Second)) {
			due++
			if !refreshed[name] {
				var st vaulttest.Secret
				v.API(t, http.MethodGet, mount+"/status/"+name, nil, &st)
				t.Errorf("target %s was due at %s, inside the hub's denial while its credential was valid, and was not refreshed: status %q",
					name, at.Format(time.RFC3339Nano), st.Str("last_error"))
			}
		}
	}
	if due == 0 {
		t.Errorf("no target's refresh fell inside the hub's %s denial: the test proves nothing (plans %v)", denied, plans)
	}
	var hubSt vaulttest.Secret
	v.API(t, http.MethodGet, mount+"/status/hub", nil, &hubSt)
	if !strings.Contains(hubSt.Str("last_error"), "AccessDenied") {
		t.Errorf("status/hub while denied: last_error %q", hubSt.Str("last_error"))
	}
	t.Logf("%d of %d targets were due inside the hub's denial, %d refreshed with its credential still valid", due, targets, len(refreshed))

	// Allowed again: the hub once, and no target more than once, each
	// before the credential it serves expires (no storm).
	s.emu.Reset(t)
	s.emu.SetConfig(t, map[string]any{"deny": []string{}})
	allowed := time.Now()
	for {
		var failing []string
		var info struct {
			Data struct {
				KeyInfo map[string]map[string]any `json:"key_info"`
			} `json:"data"`
		}
		v.API(t, "LIST", mount+"/status", nil, &info)
		for name, ki := range info.Data.KeyInfo {
			if ki["state"] == "fresh" {
				continue
			}
			failing = append(failing, name)
			if exp, err := time.Parse(time.RFC3339Nano, fmt.Sprint(ki["expiration"])); err != nil || time.Now().After(exp) {
				t.Fatalf("role %s not fresh %s after the hub was allowed again, and its credential expired at %v (status %v)",
					name, time.Since(allowed).Round(time.Millisecond), ki["expiration"], ki)
			}
		}
		if len(failing) == 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("every role fresh %s after the hub was allowed again", time.Since(allowed).Round(100*time.Millisecond))
	perRole := map[string]int{}
	for _, c := range s.emu.Calls(t) {
		if c.Action == "AssumeRole" {
			perRole[c.RoleArn]++
			if c.Outcome != "ok" {
				t.Errorf("a call failed in the recovery: %+v", c)
			}
		}
	}
	if perRole[hubARN] != 1 {
		t.Errorf("the hub was called %d times in the recovery, want once", perRole[hubARN])
	}
	for arn, n := range perRole {
		if n > 1 {
			t.Errorf("%s was called %d times in the recovery, want at most once", arn, n)
		}
	}
	t.Logf("recovery: %d STS calls for %d roles", len(s.emu.Calls(t)), len(perRole))

	// The hub's delete: a 409 naming its targets, unless forced.
	r := v.Exec(t, v.RootToken(), "", "delete", mount+"/roles/hub")
	if r.Code == 0 || !strings.Contains(r.Stderr, `role "hub" is the source_role of 50 roles`) || !strings.Contains(r.Stderr, "Code: 409") {
		t.Fatalf("vault delete of the hub: exit %d, %s", r.Code, r.Stderr)
	}
	v.CLI(t, "delete", mount+"/roles/hub", "force=true")
	v.CLI(t, "write", "-f", mount+"/refresh/"+names[0])
	var st vaulttest.Secret
	v.API(t, http.MethodGet, mount+"/status/"+names[0], nil, &st)
	if !strings.Contains(st.Str("last_error"), `source role "hub": does not exist`) {
		t.Fatalf("status/%s after the hub's forced delete: %q", names[0], st.Str("last_error"))
	}
}

// expirations are, per role, the distinct expirations LIST status showed.
type expirations struct {
	by    map[string]map[time.Time]bool
	first time.Time // the first poll
	last  time.Time // the last poll
}

func (e expirations) of(role string) map[time.Time]bool { return e.by[role] }

// nextRefreshes is each role's next_refresh from LIST status.
func nextRefreshes(t *testing.T, v *vaulttest.Server) map[string]time.Time {
	t.Helper()
	var info struct {
		Data struct {
			KeyInfo map[string]map[string]any `json:"key_info"`
		} `json:"data"`
	}
	v.API(t, "LIST", mount+"/status", nil, &info)
	plans := map[string]time.Time{}
	for name, ki := range info.Data.KeyInfo {
		if at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(ki["next_refresh"])); err == nil {
			plans[name] = at
		}
	}
	return plans
}

// watchExpirations polls LIST status for d, far more often than
// credentials are replaced, and returns every expiration it showed.
func watchExpirations(t *testing.T, v *vaulttest.Server, d time.Duration) expirations {
	t.Helper()
	e := expirations{by: map[string]map[time.Time]bool{}}
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		var info struct {
			Data struct {
				KeyInfo map[string]map[string]any `json:"key_info"`
			} `json:"data"`
		}
		if e.first.IsZero() {
			e.first = time.Now()
		}
		v.API(t, "LIST", mount+"/status", nil, &info)
		e.last = time.Now()
		for name, ki := range info.Data.KeyInfo {
			exp, err := time.Parse(time.RFC3339Nano, fmt.Sprint(ki["expiration"]))
			if err != nil {
				continue
			}
			if e.by[name] == nil {
				e.by[name] = map[time.Time]bool{}
			}
			e.by[name][exp.Truncate(time.Millisecond)] = true
		}
		time.Sleep(300 * time.Millisecond)
	}
	return e
}

// callsPerCredential counts the AssumeRole calls of arn made before until,
// and how many of them issued a credential the role was seen to hold.
func callsPerCredential(calls []vaulttest.EmulatorCall, arn string, seen expirations, role string, until time.Time) (n, creds int) {
	for _, c := range calls {
		if c.Action != "AssumeRole" || c.RoleArn != arn || !c.Time.Before(until) {
			continue
		}
		switch {
		case c.Outcome == "ok" && seen.of(role)[c.IssuedExpiration.Truncate(time.Millisecond)]:
			n++
			creds++
		case !c.Time.Before(seen.first):
			n++ // made while watched, and its credential never showed
		}
		// Else: made before the watch began (the set-up's 100 CLI calls
		// take minutes on a busy runner), for a credential replaced
		// before the first poll: outside the watched period.
	}
	return n, creds
}

// chainSignatures checks that every target's call was signed by the hub's
// current credential, the one its last call issued (or the one before, when
// the hub's call came less than a second before, on a busy runner), and
// that the hub's were signed by config/root's key; it returns the hub's
// credentials in order.
func chainSignatures(t *testing.T, calls []vaulttest.EmulatorCall, hubARN string, targets map[string]string) []string {
	t.Helper()
	sort.Slice(calls, func(i, j int) bool { return calls[i].Seq < calls[j].Seq })
	type issued struct {
		key string
		at  time.Time
	}
	var hub []issued
	isTarget := map[string]bool{}
	for _, arn := range targets {
		isTarget[arn] = true
	}
	for _, c := range calls {
		switch {
		case c.Action != "AssumeRole" || c.Outcome != "ok":
		case c.RoleArn == hubARN:
			if c.AccessKeyID != vaulttest.EmulatorAccessKey {
				t.Errorf("the hub's call was signed by %s, want config/root's key", c.AccessKeyID)
			}
			hub = append(hub, issued{c.IssuedKeyID, c.Time})
		case isTarget[c.RoleArn]:
			cur := -1
			for i, h := range hub {
				if h.key == c.AccessKeyID {
					cur = i
				}
			}
			switch {
			case cur < 0:
				t.Errorf("%s was assumed with %s (caller %s), not with a credential of the hub issued in this window", c.RoleArn, c.AccessKeyID, c.CallerArn)
			case cur < len(hub)-1 && c.Time.Sub(hub[cur+1].at) > time.Second:
				t.Errorf("%s was assumed at %v with the hub's credential %s, replaced at %v", c.RoleArn, c.Time, c.AccessKeyID, hub[cur+1].at)
			case !strings.Contains(c.CallerArn, ":assumed-role/hub/"):
				t.Errorf("%s was assumed by %s, want a session of the hub", c.RoleArn, c.CallerArn)
			}
		}
	}
	keys := make([]string, len(hub))
	for i, h := range hub {
		keys[i] = h.key
	}
	return keys
}

// readAll reads every role's credential over and over until ctx ends, and
// returns the first failure ("" for none).
func readAll(ctx context.Context, t *testing.T, v *vaulttest.Server, names []string) string {
	t.Helper()
	var mu sync.Mutex
	first := ""
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				code, msg, err := fmGet(ctx, v, mount+"/creds/"+name, nil)
				if ctx.Err() != nil {
					return
				}
				if err != nil || code != http.StatusOK {
					mu.Lock()
					if first == "" {
						first = fmt.Sprintf("%s: HTTP %d %s %v", name, code, msg, err)
					}
					mu.Unlock()
				}
				sleepCtx(ctx, 500*time.Millisecond)
			}
		}()
	}
	wg.Wait()
	return first
}
