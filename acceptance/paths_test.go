package acceptance

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// expectVaultError checks that a CLI command failed with Vault's error code
// and that stderr mentions each of want.
func expectVaultError(t *testing.T, r vaulttest.Result, code string, want ...string) {
	t.Helper()
	if r.Code == 0 {
		t.Fatalf("command succeeded, want a %s error", code)
	}
	if !strings.Contains(r.Stderr, "Code: "+code) {
		t.Fatalf("want Code: %s, stderr: %s", code, r.Stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.Stderr, w) {
			t.Fatalf("stderr does not mention %q: %s", w, r.Stderr)
		}
	}
}

// TestPaths drives every path of the plugin through the real CLI (text and
// -format=json) and the HTTP API, in one dev server. The subtests run in
// order: each builds on the state the previous one left.
func TestPaths(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	s := newDevStack(t, nil, nil)
	v := s.vault
	root := v.RootToken()

	t.Run("config/refresh defaults before any write", func(t *testing.T) {
		sec := v.Read(t, mount+"/config/refresh")
		want := map[string]float64{"max_retries": 6, "retry_window": 30, "retry_block": 5, "refresh_fraction": 0.33, "sts_rate_limit": 10, "sts_burst": 10}
		for k, w := range want {
			got, ok := sec.Data[k].(float64)
			if !ok || got != w {
				t.Errorf("config/refresh %s = %v, want %v", k, sec.Data[k], w)
			}
		}
	})

	t.Run("config/refresh rejects values out of range and stores nothing", func(t *testing.T) {
		for _, tc := range []struct{ field, value, mentions string }{
			{"max_retries", "0", "20"},
			{"max_retries", "21", "20"},
			{"retry_window", "0s", "10m"},
			{"retry_window", "11m", "10m"},
			{"refresh_fraction", "0.04", "0.9"},
			{"refresh_fraction", "0.95", "0.9"},
		} {
			r := v.Exec(t, root, "", "write", mount+"/config/refresh", tc.field+"="+tc.value)
			expectVaultError(t, r, "400", tc.field)
			if !strings.Contains(r.Stderr, tc.mentions) {
				t.Errorf("%s=%s: the error does not name the valid range (%s): %s", tc.field, tc.value, tc.mentions, r.Stderr)
			}
		}
		if got := v.Read(t, mount+"/config/refresh").Int("max_retries"); got != 6 {
			t.Fatalf("after rejected writes max_retries = %d, want the default 6", got)
		}
	})

	t.Run("config/refresh update applies only the fields sent", func(t *testing.T) {
		v.CLI(t, "write", mount+"/config/refresh", "max_retries=4", "retry_window=8s")
		sec := v.Read(t, mount+"/config/refresh")
		if sec.Int("max_retries") != 4 || sec.Int("retry_window") != 8 || sec.Int("retry_block") != 2 {
			t.Fatalf("config/refresh after update: max_retries %v retry_window %v retry_block %v, want 4 8 2",
				sec.Data["max_retries"], sec.Data["retry_window"], sec.Data["retry_block"])
		}
		if got, _ := sec.Data["refresh_fraction"].(float64); got != 0.33 {
			t.Fatalf("refresh_fraction changed to %v by a write that did not send it", sec.Data["refresh_fraction"])
		}
		if out := v.CLI(t, "read", mount+"/config/refresh"); !strings.Contains(out, "retry_block") {
			t.Fatalf("table output lacks retry_block:\n%s", out)
		}
	})

	t.Run("config/root read never returns the secret key", func(t *testing.T) {
		sec := v.Read(t, mount+"/config/root")
		if sec.Str("access_key") != s.emu.AccessKey || sec.Str("region") != "us-east-1" || sec.Str("sts_endpoint") != s.emu.URL {
			t.Fatalf("config/root read: access_key %q region %q sts_endpoint %q", sec.Str("access_key"), sec.Str("region"), sec.Str("sts_endpoint"))
		}
		for k, val := range sec.Data {
			if str, ok := val.(string); ok && str == s.emu.SecretKey {
				t.Fatalf("config/root read returns the secret key in field %q", k)
			}
		}
		out := v.CLI(t, "read", mount+"/config/root")
		if strings.Contains(out, s.emu.SecretKey) {
			t.Fatal("config/root table output contains the secret key")
		}
	})

	t.Run("config/root rejects plain http off loopback", func(t *testing.T) {
		r := v.Exec(t, root, "", "write", mount+"/config/root", "sts_endpoint=http://sts.example.com")
		expectVaultError(t, r, "400", "https")
		if got := v.Read(t, mount+"/config/root").Str("sts_endpoint"); got != s.emu.URL {
			t.Fatalf("sts_endpoint changed to %q by a rejected write", got)
		}
	})

	t.Run("roles write, read, list", func(t *testing.T) {
		s.createRole(t, "app", "ttl=1h")
		sec := v.Read(t, mount+"/roles/app")
		if sec.Str("credential_type") != "assumed_role" || sec.Str("role_arn") != roleARN("app") || sec.Int("ttl") != 3600 {
			t.Fatalf("roles/app read: %v", sec.Data)
		}
		var names []string
		v.CLIJSON(t, &names, "list", "-format=json", mount+"/roles")
		if len(names) != 1 || names[0] != "app" {
			t.Fatalf("list roles: %v, want [app]", names)
		}
	})

	t.Run("roles reject bad input and store nothing", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			args []string
		}{
			{"bad-type", []string{"credential_type=bogus"}},
			{"no-arn", []string{"credential_type=assumed_role"}},
			{"bad-arn", []string{"credential_type=assumed_role", "role_arn=not-an-arn"}},
			{"bad-policy", []string{"credential_type=assumed_role", "role_arn=" + roleARN("x"), "policy_document={not json"}},
			{"ttl-short", []string{"credential_type=assumed_role", "role_arn=" + roleARN("x"), "ttl=100s"}},
			{"ttl-long", []string{"credential_type=assumed_role", "role_arn=" + roleARN("x"), "ttl=13h"}},
			{"bad-session", []string{"credential_type=assumed_role", "role_arn=" + roleARN("x"), "role_session_name=has space!"}},
		} {
			r := v.Exec(t, root, "", append([]string{"write", mount + "/roles/" + tc.name}, tc.args...)...)
			expectVaultError(t, r, "400")
			if r := v.Exec(t, root, "", "read", mount+"/roles/"+tc.name); r.Code == 0 {
				t.Errorf("role %s was stored by a rejected write", tc.name)
			}
		}
	})

	var first creds
	t.Run("creds served from the cache", func(t *testing.T) {
		s.emu.Reset(t)
		first = s.readCreds(t, "app")
		if first.Renewable {
			t.Error("creds lease is renewable, want non-renewable")
		}
		// The lease is the credential's remaining validity, so Vault Agent
		// re-reads before it expires.
		if first.LeaseDuration <= 0 || first.LeaseDuration > time.Until(first.Expiration)+2*time.Second {
			t.Errorf("lease_duration %s, credential valid for %s", first.LeaseDuration, time.Until(first.Expiration).Round(time.Second))
		}
		if !strings.HasPrefix(first.LeaseID, mount+"/creds/app/") {
			t.Errorf("lease_id %q", first.LeaseID)
		}
		if first.ARN != "" && !strings.Contains(first.ARN, "assumed-role/app") {
			t.Errorf("arn %q", first.ARN)
		}
		arn, err := s.callerIdentity(t, first)
		if err != nil || !strings.Contains(arn, "assumed-role/app") {
			t.Fatalf("GetCallerIdentity with the served credential: %q, %v", arn, err)
		}
		if n := s.assumeRoleCalls(t, ""); n != 1 {
			t.Fatalf("cold read made %d AssumeRole calls, want 1", n)
		}
		again := s.readCreds(t, "app")
		var api vaulttest.Secret
		if code := v.API(t, http.MethodGet, mount+"/creds/app", nil, &api); code != 200 {
			t.Fatalf("GET creds/app: HTTP %d", code)
		}
		if again.AccessKey != first.AccessKey || api.Str("access_key") != first.AccessKey {
			t.Fatal("warm reads returned a different credential")
		}
		if n := s.assumeRoleCalls(t, ""); n != 1 {
			t.Fatalf("warm reads made STS calls: %d AssumeRole in total, want 1", n)
		}
		if out := v.CLI(t, "read", mount+"/creds/app"); !strings.Contains(out, "security_token") || !strings.Contains(out, "expiration") {
			t.Fatal("table output lacks security_token or expiration")
		}
	})

	t.Run("lease revoke is a no-op and renew is refused", func(t *testing.T) {
		v.CLI(t, "lease", "revoke", first.LeaseID)
		if c := s.readCreds(t, "app"); c.AccessKey != first.AccessKey {
			t.Fatal("revoking a lease dropped the cached credential")
		}
		s.mustBeValid(t, first)
		if r := v.Exec(t, root, "", "lease", "renew", first.LeaseID); r.Code == 0 {
			t.Fatal("lease renew succeeded on a non-renewable lease")
		}
	})

	t.Run("concurrent cold reads share one STS call", func(t *testing.T) {
		s.createRole(t, "herd")
		s.emu.Reset(t)
		const readers = 20
		keys := make([]string, readers)
		codes := make([]int, readers)
		var wg sync.WaitGroup
		for i := 0; i < readers; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				var sec vaulttest.Secret
				codes[i] = v.API(t, http.MethodGet, mount+"/creds/herd", nil, &sec)
				keys[i] = sec.Str("access_key")
			}(i)
		}
		wg.Wait()
		for i := range keys {
			if codes[i] != 200 || keys[i] != keys[0] || keys[i] == "" {
				t.Fatalf("reader %d: HTTP %d, key %q; reader 0 got %q", i, codes[i], keys[i], keys[0])
			}
		}
		if n := s.assumeRoleCalls(t, ""); n != 1 {
			t.Fatalf("%d concurrent cold reads made %d AssumeRole calls, want 1", readers, n)
		}
	})

	t.Run("other credential types", func(t *testing.T) {
		v.CLI(t, "write", mount+"/roles/session", "credential_type=session_token")
		v.CLI(t, "write", mount+"/roles/federated", "credential_type=federation_token", `policy_document={"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"*"}]}`)
		for _, role := range []string{"session", "federated"} {
			c := s.readCreds(t, role)
			s.mustBeValid(t, c)
		}
		st := s.emu.Stats(t)
		if st.Count("GetSessionToken", "ok") != 1 || st.Count("GetFederationToken", "ok") != 1 {
			t.Fatalf("emulator stats: %v", st.ByAction)
		}
	})

	t.Run("changing a role drops its cached credential", func(t *testing.T) {
		before := s.readCreds(t, "app")
		v.CLI(t, "write", mount+"/roles/app", "ttl=2h")
		after := s.readCreds(t, "app")
		if after.AccessKey == before.AccessKey {
			t.Fatal("after a role change the old credential is still served")
		}
	})

	t.Run("status read and list", func(t *testing.T) {
		c := s.readCreds(t, "app")
		st := s.statusOf(t, "app")
		if st.Str("state") != "fresh" {
			t.Fatalf("status/app state = %q, want fresh", st.Str("state"))
		}
		// creds gives whole seconds, status keeps STS's milliseconds.
		if d := parseTime(t, st, "expiration").Sub(c.Expiration); d < 0 || d >= time.Second {
			t.Fatalf("status expiration %s, creds expiration %s", st.Str("expiration"), c.Expiration)
		}
		next := parseTime(t, st, "next_refresh")
		if next.IsZero() || !next.Before(c.Expiration) {
			t.Fatalf("status next_refresh %q is not before the expiration %s", st.Str("next_refresh"), c.Expiration)
		}
		for _, f := range []string{"issued_at", "last_success", "last_attempt", "attempts_last_cycle", "failed_cycles"} {
			if _, ok := st.Data[f]; !ok {
				t.Errorf("status/app lacks %s", f)
			}
		}
		var names []string
		v.CLIJSON(t, &names, "list", "-format=json", mount+"/status")
		if !contains(names, "app") || !contains(names, "herd") {
			t.Fatalf("list status: %v", names)
		}
	})

	t.Run("refresh runs one cycle now", func(t *testing.T) {
		before := s.readCreds(t, "app")
		calls := s.assumeRoleCalls(t, "ok")
		var out vaulttest.Secret
		v.CLIJSON(t, &out, "write", "-format=json", "-f", mount+"/refresh/app")
		if out.Str("state") != "fresh" {
			t.Fatalf("refresh/app returned state %q, want fresh", out.Str("state"))
		}
		if n := s.assumeRoleCalls(t, "ok"); n != calls+1 {
			t.Fatalf("refresh made %d AssumeRole calls, want 1", n-calls)
		}
		after := s.readCreds(t, "app")
		if after.AccessKey == before.AccessKey || after.Expiration.Before(before.Expiration) {
			t.Fatalf("after refresh: key changed %v, expiration %s (was %s)", after.AccessKey != before.AccessKey, after.Expiration, before.Expiration)
		}
	})

	t.Run("a cold read that STS refuses is a 400 naming the permission problem", func(t *testing.T) {
		// A role in another account: the emulator answers AccessDenied.
		v.CLI(t, "write", mount+"/roles/denied", "credential_type=assumed_role", "role_arn=arn:aws:iam::999999999999:role/denied")
		var body struct {
			Errors []string `json:"errors"`
		}
		code := v.API(t, http.MethodGet, mount+"/creds/denied", nil, &body)
		msg := strings.Join(body.Errors, "; ")
		if code != 400 || !strings.Contains(msg, "AccessDenied") || !strings.Contains(msg, "permission problem") {
			t.Fatalf("GET creds/denied: HTTP %d %q, want 400 naming AccessDenied as a permission problem", code, msg)
		}
		if strings.Contains(msg, s.emu.SecretKey) {
			t.Fatal("the error carries the secret key")
		}
		r := v.Exec(t, root, "", "read", mount+"/creds/denied")
		expectVaultError(t, r, "400", "AccessDenied")
		st := s.statusOf(t, "denied")
		if !strings.Contains(st.Str("last_error"), "AccessDenied") {
			t.Fatalf("status/denied last_error = %q", st.Str("last_error"))
		}
		if st.Str("state") == "fresh" {
			t.Fatal("status/denied says fresh")
		}
	})

	t.Run("unknown role is a 400", func(t *testing.T) {
		expectVaultError(t, v.Exec(t, root, "", "read", mount+"/creds/nope"), "400")
	})

	t.Run("deleting a role deletes its cache and status", func(t *testing.T) {
		for _, role := range []string{"denied", "herd"} {
			v.CLI(t, "delete", mount+"/roles/"+role)
			if r := v.Exec(t, root, "", "read", mount+"/roles/"+role); r.Code == 0 {
				t.Fatalf("roles/%s still readable after delete", role)
			}
			if r := v.Exec(t, root, "", "read", mount+"/status/"+role); r.Code == 0 && strings.Contains(r.Stdout, "state") {
				t.Fatalf("status/%s still readable after delete", role)
			}
		}
		var names []string
		v.CLIJSON(t, &names, "list", "-format=json", mount+"/status")
		if contains(names, "herd") || contains(names, "denied") {
			t.Fatalf("list status after delete: %v", names)
		}
	})

	t.Run("path-help for every path", func(t *testing.T) {
		for _, tc := range []struct {
			path string
			want []string
		}{
			{"", nil},
			{"config/root", []string{"access_key", "secret_key", "region", "sts_endpoint", "sts_region", "sts_fallback_endpoints", "sts_fallback_regions"}},
			{"config/refresh", []string{"max_retries", "retry_window", "refresh_fraction", "sts_rate_limit", "sts_burst"}},
			{"roles/app", []string{"credential_type", "role_arn", "external_id", "role_session_name", "policy_document", "policy_arns", "session_tags", "ttl"}},
			{"roles/", nil},
			{"creds/app", nil},
			{"status/app", nil},
			{"status/", nil},
			{"refresh/app", nil},
		} {
			out := v.CLI(t, "path-help", mount+"/"+tc.path)
			if len(strings.TrimSpace(out)) < 40 {
				t.Errorf("path-help %s: almost empty: %q", tc.path, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("path-help %s does not document %s", tc.path, w)
				}
			}
		}
	})

	t.Run("config/root delete", func(t *testing.T) {
		v.CLI(t, "delete", mount+"/config/root")
		if r := v.Exec(t, root, "", "read", "-format=json", mount+"/config/root"); r.Code == 0 && strings.Contains(r.Stdout, s.emu.AccessKey) {
			t.Fatal("config/root still holds the access key after delete")
		}
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
