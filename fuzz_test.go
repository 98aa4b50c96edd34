package awsresilient

import (
	"context"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"
)

// The fuzz targets send arbitrary input through HandleRequest and check the
// validation contract: never a Go error (a 500) or a panic; a rejected write
// is a 400 that changes nothing; an accepted write stores exactly a value
// that validates and reads back. The test command runs each for a few
// seconds: go test -run '^$' -fuzz '^FuzzRoleWrite$' -fuzztime 5s .

func FuzzRoleWrite(f *testing.F) {
	f.Add("assumed_role", testRoleARN, "", "", "", "", "", "", int64(3600))
	f.Add("assumed_role", "arn:aws-cn:iam::123456789012:role/path/to/r", "ext:id/1", "sess@x", `{"Version":"2012-10-17"}`, "arn:aws:iam::aws:policy/P", "team", "core", int64(900))
	f.Add("federation_token", "", "", "fed", `{}`, "", "k", "", int64(43200))
	f.Add("session_token", "", "", "", "", "", "", "", int64(899))
	f.Add("assumed_role", "arn:aws:iam::1:role/x", "x", "a b", "[1]", "arn:aws:iam::aws:role/x", "a*b", "v", int64(-1))
	f.Add("iam_user", "\x00", "\xff", strings.Repeat("s", 70), "{", ",,", "", strings.Repeat("v", 300), int64(1<<40))

	b, s := getTestBackend(f)
	f.Fuzz(func(t *testing.T, credType, arn, extID, session, policy, policyARNs, tagKey, tagVal string, ttl int64) {
		ctx := context.Background()
		if err := s.Delete(ctx, rolePrefix+"fuzz"); err != nil {
			t.Fatal(err)
		}
		data := map[string]interface{}{
			"credential_type": credType, "role_arn": arn, "external_id": extID, "role_session_name": session,
			"policy_document": policy, "policy_arns": policyARNs, "ttl": ttl,
		}
		if tagKey != "" {
			data["session_tags"] = map[string]interface{}{tagKey: tagVal}
		}
		before := snapshot(t, s)
		resp, err := do(t, b, s, logical.CreateOperation, "roles/fuzz", data)
		if err != nil {
			t.Fatalf("Go error (a 500) for %v: %v", data, err)
		}
		if resp.IsError() {
			if !sameSnapshot(before, snapshot(t, s)) {
				t.Fatalf("rejected write changed storage: %v", data)
			}
			return
		}
		role, err := getRole(ctx, s, "fuzz")
		if err != nil || role == nil {
			t.Fatalf("accepted write stored nothing: %v %v", role, err)
		}
		if msg := role.validate("fuzz"); msg != "" {
			t.Fatalf("stored role does not validate (%s): %+v", msg, role)
		}
		if role.CredentialType != credType || role.RoleARN != strings.TrimSpace(arn) || role.TTL != time.Duration(ttl)*time.Second {
			t.Fatalf("stored %+v for input %v", role, data)
		}
		read := mustDo(t, b, s, logical.ReadOperation, "roles/fuzz", nil)
		if read.Data["ttl"] != ttl || read.Data["credential_type"] != credType {
			t.Fatalf("read back %v for input %v", read.Data, data)
		}
	})
}

func FuzzConfigRefreshWrite(f *testing.F) {
	f.Add(int64(6), "30s", 0.33, 10.0, int64(10))
	f.Add(int64(0), "0", 0.0, -1.0, int64(-1))
	f.Add(int64(21), "10m1s", 0.91, 10001.0, int64(10001))
	f.Add(int64(1), "1", 0.05, 0.0, int64(0))
	f.Add(int64(20), "600", 0.9, 0.5, int64(1))
	f.Add(int64(3), "-5", 1e308, 1e-300, int64(1<<62))
	f.Add(int64(20), "1", 0.33, 10.0, int64(10))    // a 50 ms block: the cross-field rule names its range
	f.Add(int64(6), "30s", 0.33, 1.0/144, int64(1)) // under the 0.01/s floor: its 400 names the range too

	b, s := getTestBackend(f)
	f.Fuzz(func(t *testing.T, retries int64, window string, fraction, rate float64, burst int64) {
		data := map[string]interface{}{
			"max_retries": retries, "retry_window": window, "refresh_fraction": fraction,
			"sts_rate_limit": rate, "sts_burst": burst,
		}
		before := snapshot(t, s)
		resp, err := do(t, b, s, logical.UpdateOperation, "config/refresh", data)
		if err != nil {
			t.Fatalf("Go error (a 500) for %v: %v", data, err)
		}
		if resp.IsError() {
			msg := resp.Error().Error()
			if !strings.Contains(msg, " to ") && !strings.Contains(msg, "between") {
				t.Fatalf("400 without a range: %q", msg)
			}
			if !sameSnapshot(before, snapshot(t, s)) {
				t.Fatalf("rejected write changed storage: %v", data)
			}
			return
		}
		cfg, err := getRefreshConfig(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		if msg := cfg.validate(); msg != "" {
			t.Fatalf("stored config does not validate (%s): %+v", msg, cfg)
		}
		if cfg != b.settings.policy() {
			t.Fatalf("stored %+v, in memory %+v", cfg, b.settings.policy())
		}
		if int64(cfg.MaxRetries) != retries || cfg.RefreshFraction != fraction || cfg.STSRateLimit != rate || int64(cfg.STSBurst) != burst {
			t.Fatalf("stored %+v for input %v", cfg, data)
		}
	})
}

func FuzzConfigRootWrite(f *testing.F) {
	f.Add("AKIAIOSFODNN7EXAMPLE", "secret", "us-east-1", "https://sts.amazonaws.com", "", "", "")
	f.Add("", "", "eu-west-1", "http://127.0.0.1:8599", "us-east-1", "http://[::1]:1,https://a.example", "us-west-2,eu-west-1")
	f.Add("AKIA", "s", "moon", "http://example.com", "x", "ftp://x", "a")
	f.Add("", "", "us-east-1", "http://localhost.evil.com", "", "http://127.0.0.1@evil.com", "")
	f.Add("", "", "us-east-1", "https://user:pass@host/?q#f", "", "", "")

	b, s := getTestBackend(f)
	f.Fuzz(func(t *testing.T, access, secret, region, endpoint, stsRegion, fallbacks, fallbackRegions string) {
		data := map[string]interface{}{
			"access_key": access, "secret_key": secret, "region": region, "sts_endpoint": endpoint,
			"sts_region": stsRegion, "sts_fallback_endpoints": fallbacks, "sts_fallback_regions": fallbackRegions,
		}
		before := snapshot(t, s)
		resp, err := do(t, b, s, logical.UpdateOperation, "config/root", data)
		if err != nil {
			t.Fatalf("Go error (a 500) for %q: %v", data, err)
		}
		if resp.IsError() {
			if !sameSnapshot(before, snapshot(t, s)) {
				t.Fatalf("rejected write changed storage: %q", data)
			}
			return
		}
		cfg, err := getRootConfig(context.Background(), s)
		if err != nil || cfg == nil {
			t.Fatalf("accepted write stored nothing: %v", err)
		}
		if msg := cfg.validate(); msg != "" {
			t.Fatalf("stored config does not validate (%s): %+v", msg, cfg)
		}
		for _, ep := range append([]string{cfg.STSEndpoint}, cfg.STSFallbackEndpoints...) {
			if ep == "" {
				continue
			}
			u, err := url.Parse(ep)
			if err != nil {
				t.Fatalf("accepted an unparsable endpoint %q", ep)
			}
			host := u.Hostname()
			ip := net.ParseIP(host)
			loopback := strings.EqualFold(host, "localhost") || (ip != nil && ip.IsLoopback())
			if u.Scheme != "https" && !(u.Scheme == "http" && loopback) {
				t.Fatalf("accepted %q: neither https nor http on loopback", ep)
			}
		}
		read := mustDo(t, b, s, logical.ReadOperation, "config/root", nil)
		if _, ok := read.Data["secret_key"]; ok {
			t.Fatal("read returned the secret key")
		}
	})
}
