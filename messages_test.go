package awsresilient

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// The messages a newcomer meets on a bad input or a broken set-up (issue
// 23): each says what is wrong and what to do. One table per kind of
// answer; every row is one input and the words its message must carry.

// closedPort returns a loopback URL nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// noAWSIdentity leaves the SDK's default credential chain with nothing to
// find: no environment keys, no shared files, and an EC2 metadata endpoint
// that refuses connections (as on a machine outside AWS, minus the wait).
func noAWSIdentity(t *testing.T) {
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
		"AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_EC2_METADATA_DISABLED"} {
		t.Setenv(k, "")
	}
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", closedPort(t))
}

// TestMessages_ColdReadSetupErrors: a cold read that fails for a set-up
// error is a 400 after one attempt that names the problem and where to look;
// an outage stays a 503 (TestRefresh_Retryable and friends).
func TestMessages_ColdReadSetupErrors(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, f *fixture)
		want  []string
	}{
		{"no AWS identity at all", func(t *testing.T, f *fixture) {
			noAWSIdentity(t)
			mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"access_key": "", "secret_key": ""})
		}, []string{codeNoAWSIdentity, "no AWS identity", "access_key and secret_key", "config/root"}},
		{"AccessDenied", func(t *testing.T, f *fixture) {
			mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+testRole, map[string]interface{}{"role_arn": "arn:aws:iam::999999999999:role/app"})
		}, []string{"AccessDenied", "permission problem, not an outage", "trust policy", "status/app"}},
		{"InvalidClientTokenId", func(t *testing.T, f *fixture) {
			mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"access_key": "AKIAUNKNOWNUNKNOWN00"})
		}, []string{"InvalidClientTokenId", "key problem, not an outage", "access_key in config/root"}},
		{"SignatureDoesNotMatch", func(t *testing.T, f *fixture) {
			mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"secret_key": "wrong"})
		}, []string{"SignatureDoesNotMatch", "secret_key in config/root does not belong to access_key"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{rand: randMax})
			tc.setup(t, f)
			start := f.clock.Now()
			resp, err := f.readCreds(testRole)
			wantBadRequest(t, resp, err, tc.want...)
			if strings.Contains(respErr(resp), "upstream STS unavailable") {
				t.Errorf("a set-up error reads as an outage: %s", respErr(resp))
			}
			// At once: one attempt, no retry block waited for.
			if n := len(f.log.all()); n != 1 {
				t.Errorf("%d attempts, want 1", n)
			}
			if waited := f.clock.Now().Sub(start); waited != 0 {
				t.Errorf("the read waited %s on the clock, want an answer at once", waited)
			}
			if strings.Contains(respErr(resp), stsemu.DefaultSecretKey) {
				t.Error("the message carries the secret key")
			}
			// The metrics count it as what it was, a 400, not a 503.
			sc := scrapeMetrics(t, f.b, f.s, "")
			sc.want("aws_resilient_creds_reads_total", map[string]string{"result": "400"}, 1)
			sc.want("aws_resilient_creds_reads_total", map[string]string{"result": "503"}, 0)
		})
	}
}

// TestMessages_IAMErrorsNameIAM: a rotation that cannot reach IAM says IAM,
// not STS, and points at iam_endpoint.
func TestMessages_IAMErrorsNameIAM(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"iam_endpoint": closedPort(t)})
	resp, err := f.rotate()
	wantCoded(t, resp, err, 503, "iam:GetUser", "could not reach IAM", "iam_endpoint")
	if strings.Contains(err.Error(), "reach STS") {
		t.Errorf("an IAM failure names STS: %v", err)
	}
}

// TestMessages_Writes: every write answers with the object as stored, so
// that Vault keeps the sdk's warning naming ignored fields, and with the
// plugin's own warnings and refusals.
func TestMessages_Writes(t *testing.T) {
	tests := []struct {
		name     string
		path     string
		data     map[string]interface{}
		wantErr  []string // a 400 with these words
		wantWarn []string // success, with a warning holding these words
		wantData map[string]interface{}
	}{
		{name: "mistyped role field", path: "roles/app", data: map[string]interface{}{"tll": "2h"},
			wantWarn: []string{"ignored", "tll"}, wantData: map[string]interface{}{"ttl": int64(3600)}},
		{name: "mistyped refresh field", path: "config/refresh", data: map[string]interface{}{"max_retry": 3},
			wantWarn: []string{"ignored", "max_retry"}, wantData: map[string]interface{}{"max_retries": defaultMaxRetries}},
		{name: "mistyped root field", path: "config/root", data: map[string]interface{}{"regoin": "eu-west-1"},
			wantWarn: []string{"ignored", "regoin"}, wantData: map[string]interface{}{"region": defaultRegion}},
		{name: "session tags joined by a comma", path: "roles/app", data: map[string]interface{}{"session_tags": "team=payments,env=dev"},
			wantErr: []string{`key "team"`, "comma", "repeat the parameter", "session_tags=team=payments session_tags=env=dev"}},
		{name: "session tag key with a bad character", path: "roles/app", data: map[string]interface{}{"session_tags": map[string]interface{}{"a!": "x"}},
			wantErr: []string{`key "a!"`}},
		{name: "fractional JSON integer", path: "config/refresh", data: map[string]interface{}{"max_retries": 6.5},
			wantErr: []string{"whole number", "max_retries (got 6.5)"}},
		{name: "fractional JSON integer as json.Number", path: "config/refresh", data: map[string]interface{}{"sts_burst": json.Number("2.5")},
			wantErr: []string{"sts_burst"}},
		{name: "fractional duration seconds", path: "roles/app", data: map[string]interface{}{"ttl": 900.5},
			wantErr: []string{"whole number", "ttl"}},
		{name: "whole JSON number", path: "config/refresh", data: map[string]interface{}{"max_retries": 5.0},
			wantData: map[string]interface{}{"max_retries": 5}},
		{name: "idle ttl that defeats the cache", path: "roles/app", data: map[string]interface{}{"cache_scope": "entity", "entity_idle_ttl": "1s"},
			wantWarn: []string{"entity_idle_ttl (1s) is shorter than ttl (3600s)", "default (0) is 2 x ttl"}},
		{name: "max_entities past the bound", path: "roles/app", data: map[string]interface{}{"cache_scope": "entity", "max_entities": 100000000},
			wantErr: []string{"max_entities must be at most 100000", "got 100000000"}},
		{name: "max_entities large but allowed", path: "roles/app", data: map[string]interface{}{"cache_scope": "entity", "max_entities": 50000},
			wantWarn: []string{"max_entities (50000)", "2 KiB", "sts_rate_limit"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{})
			resp, err := do(t, f.b, f.s, logical.UpdateOperation, tc.path, tc.data)
			if tc.wantErr != nil {
				wantBadRequest(t, resp, err, tc.wantErr...)
				return
			}
			if err != nil || resp == nil || resp.IsError() {
				t.Fatalf("write %s: err=%v resp=%v, want the written object", tc.path, err, respErr(resp))
			}
			warnings := strings.Join(resp.Warnings, "\n")
			for _, w := range tc.wantWarn {
				if !strings.Contains(warnings, w) {
					t.Errorf("warnings %q lack %q", warnings, w)
				}
			}
			if tc.wantWarn == nil && len(resp.Warnings) != 0 {
				t.Errorf("unexpected warnings %q", resp.Warnings)
			}
			for k, v := range tc.wantData {
				if resp.Data[k] != v {
					t.Errorf("answer %s = %#v, want %#v", k, resp.Data[k], v)
				}
			}
			if _, ok := resp.Data["secret_key"]; ok {
				t.Error("a write answered with the secret key")
			}
		})
	}
}

// TestMessages_NoEntityMentionsVaultToken: the 400 for a token without an
// entity says that an exported VAULT_TOKEN overrides vault login.
func TestMessages_NoEntityMentionsVaultToken(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+testRole, map[string]interface{}{"cache_scope": "entity"})
	resp, err := f.readCreds(testRole)
	wantBadRequest(t, resp, err, "has no Vault entity", "log in through an auth method", "exported VAULT_TOKEN", "overrides", "unset VAULT_TOKEN")
}
