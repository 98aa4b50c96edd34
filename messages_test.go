package awsresilient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/vault/sdk/helper/errutil"
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

// TestMessages_BadRoleName: a role name that breaks the naming rule matches
// no path; instead of Vault's "unsupported path" the answer is a 400 that
// names the name and says the rule (issue 32, item 16), on every path that
// ends in a role name. A path that is not the plugin's stays unsupported.
func TestMessages_BadRoleName(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	tests := []struct {
		op   logical.Operation
		path string
		data map[string]interface{}
		name string
	}{
		{logical.UpdateOperation, "roles/bad name", map[string]interface{}{"role_arn": testRoleARN}, "bad name"},
		{logical.CreateOperation, "roles/-app", map[string]interface{}{"role_arn": testRoleARN}, "-app"},
		{logical.ReadOperation, "roles/app.", nil, "app."},
		{logical.DeleteOperation, "roles/a/b", nil, "a/b"},
		{logical.ReadOperation, "creds/bad name", nil, "bad name"},
		{logical.ReadOperation, "status/bad name", nil, "bad name"},
		{logical.UpdateOperation, "refresh/bad name", nil, "bad name"},
	}
	for _, tc := range tests {
		t.Run(string(tc.op)+" "+tc.path, func(t *testing.T) {
			before := snapshot(t, f.s)
			resp, err := do(t, f.b, f.s, tc.op, tc.path, tc.data)
			wantBadRequest(t, resp, err, strconv.Quote(tc.name)+" is not a valid role name",
				"ASCII letters, digits, _, - and .", "beginning and ending with a letter, digit or _")
			if !sameSnapshot(before, snapshot(t, f.s)) {
				t.Fatal("a request with a bad name changed storage")
			}
		})
	}
	if _, err := do(t, f.b, f.s, logical.ReadOperation, "nosuch/app", nil); err != logical.ErrUnsupportedPath {
		t.Fatalf("nosuch/app: err=%v, want unsupported path", err)
	}
}

// TestMessages_FieldConversion: a value that does not convert to its
// field's type is a 400 naming the field, the value given and what the
// field takes, with the field's help (issue 32, item 16), both from the
// request and from the existence check that Vault runs first for a write
// (of roles/ and config/root, the framework's answer there was the bare
// converter text).
func TestMessages_FieldConversion(t *testing.T) {
	tests := []struct {
		path, field string
		value       interface{}
		want        []string
	}{
		{"roles/app", "lease", "maybe", []string{`lease takes true or false; got "maybe"`, "lease: Whether creds/<name> returns a Vault lease"}},
		{"roles/app", "ttl", "2y", []string{`ttl takes a duration`, "whole seconds (3600)", "90s, 15m, 12h, 30d", "no unit for months or years", `got "2y"`, "ttl: Requested credential lifetime, 900s to 12h"}},
		{"roles/app", "max_entities", "many", []string{`max_entities takes a whole number; got "many"`, "max_entities: cache_scope=entity only"}},
		{"config/root", "rotation_period", "2y", []string{`rotation_period takes a duration`, `got "2y"`, "rotation_period: Rotate the static access key", "at most 8760h"}},
		{"config/refresh", "max_retries", "abc", []string{`max_retries takes a whole number; got "abc"`, "max_retries: Attempts per refresh cycle, 1 to 20."}},
		{"config/refresh", "max_retries", "99999999999999999999", []string{`max_retries takes a whole number; got "99999999999999999999", which is out of range`}},
		{"config/refresh", "refresh_fraction", "half", []string{`refresh_fraction takes a number, such as 0.5; got "half"`, "refresh_fraction: Refresh when"}},
		{"config/root", "secret_key", map[string]interface{}{"k": "hunter2"}, []string{"secret_key takes a string; got a value that is not (not shown: the field is secret)"}},
	}
	for _, tc := range tests {
		t.Run(tc.path+" "+tc.field, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{})
			data := map[string]interface{}{tc.field: tc.value}
			for _, op := range []logical.Operation{logical.CreateOperation, logical.UpdateOperation} {
				before := snapshot(t, f.s)
				resp, err := do(t, f.b, f.s, op, tc.path, data)
				wantBadRequest(t, resp, err, tc.want...)
				if msg := respErr(resp); strings.Contains(msg, "error converting input") || strings.Contains(msg, "hunter2") {
					t.Errorf("the message carries the converter's text or a secret: %s", msg)
				}
				if !sameSnapshot(before, snapshot(t, f.s)) {
					t.Fatal("a rejected write changed storage")
				}
			}
			_, _, err := f.b.HandleExistenceCheck(context.Background(),
				&logical.Request{Operation: logical.CreateOperation, Path: tc.path, Storage: f.s, Data: data})
			var ue errutil.UserError
			if !errors.As(err, &ue) {
				t.Fatalf("existence check: err=%v, want a user error (a 400)", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(ue.Err, w) {
					t.Errorf("existence check error %q lacks %q", ue.Err, w)
				}
			}
		})
	}
}

// TestMessages_SessionTemplate: a session_name_template that fails the
// role write's check says why in the template's own terms: a field that
// does not exist is named with the fields that do (not the Go type that
// holds them), and a failure found by running the template on the made-up
// entities of the check says so (issue 32, item 16).
func TestMessages_SessionTemplate(t *testing.T) {
	tests := []struct {
		name, template string
		want           []string
	}{
		{"unknown field", "vault-{{.Username}}", []string{"there is no field .Username; the fields are .Name, .EntityName, .EntityID, .RoleName, .Metadata, .LoginAlias, .Aliases, .AliasesByType"}},
		{"fails when run", `vault-{{.Name | printf "%5s"}}`, []string{"runs the template on two made-up entities", "on one of them (login user0, entity ID", "printf widths"}},
		{"names no entity", "vault-{{.Metadata.team}}", []string{"runs the template on two made-up entities (logins user0 and user1", "same metadata", `same session name "vault-m-team"`, "name the entity"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{})
			resp, err := do(t, f.b, f.s, logical.CreateOperation, "roles/app", map[string]interface{}{
				"role_arn": testRoleARN, "cache_scope": "entity", "session_name_template": tc.template})
			wantBadRequest(t, resp, err, append([]string{"session_name_template is not a valid template: "}, tc.want...)...)
			if msg := respErr(resp); strings.Contains(msg, "awsresilient") || strings.Contains(msg, "sessionVars") {
				t.Errorf("the message names the plugin's Go type: %s", msg)
			}
		})
	}
}

// TestMessages_BooleanForNumber: a JSON boolean for a number field is a 400
// naming the field, on every path, with storage unchanged (issue 45, item
// 2). The sdk's weak decoding took true as 1: {"max_retries": true} was
// stored as 1, {"sts_rate_limit": true} got a 400 about sts_burst, a field
// not sent, and {"refresh_fraction": true} said "got 1". The last subtest
// holds the table to every number field of every path, so that a new
// field gets a row.
func TestMessages_BooleanForNumber(t *testing.T) {
	tests := []struct {
		op          logical.Operation
		path, field string
		want        string // what the field takes, in fieldTakes's words
	}{
		{logical.UpdateOperation, "config/root", "rotation_period", "takes a duration"},
		{logical.UpdateOperation, "config/refresh", "max_retries", "takes a whole number"},
		{logical.UpdateOperation, "config/refresh", "retry_window", "takes a duration"},
		{logical.UpdateOperation, "config/refresh", "refresh_fraction", "takes a number, such as 0.5"},
		{logical.UpdateOperation, "config/refresh", "sts_rate_limit", "takes a number, such as 0.5"},
		{logical.UpdateOperation, "config/refresh", "sts_burst", "takes a whole number"},
		{logical.UpdateOperation, "config/refresh", "metrics_max_roles", "takes a whole number"},
		{logical.UpdateOperation, "config/refresh", "max_entity_credentials", "takes a whole number"},
		{logical.CreateOperation, "roles/app2", "ttl", "takes a duration"},
		{logical.UpdateOperation, "roles/app", "ttl", "takes a duration"},
		{logical.UpdateOperation, "roles/app", "entity_idle_ttl", "takes a duration"},
		{logical.UpdateOperation, "roles/app", "max_entities", "takes a whole number"},
		{logical.ListOperation, "roles/", "limit", "takes a whole number"},
		{logical.ListOperation, "status/", "limit", "takes a whole number"},
		{logical.UpdateOperation, "test/storage-faults", "cache_write_failures", "takes a whole number"},
	}
	f := newFixture(t, fixtureOpts{testHooks: true})
	covered := map[string]bool{}
	for _, tc := range tests {
		p := f.b.Route(tc.path)
		if p == nil {
			continue // test/ paths exist only in a build with the test hooks
		}
		covered[p.Pattern+" "+tc.field] = true
		for _, v := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s %s %s=%v", tc.op, tc.path, tc.field, v), func(t *testing.T) {
				before := snapshot(t, f.s)
				resp, err := do(t, f.b, f.s, tc.op, tc.path, map[string]interface{}{tc.field: v})
				wantBadRequest(t, resp, err, tc.field+" "+tc.want, fmt.Sprintf("got %v, which is a boolean, not a number", v))
				if msg := respErr(resp); !strings.HasPrefix(msg, tc.field+" ") {
					t.Errorf("the message does not start with the field sent: %s", msg)
				}
				if !sameSnapshot(before, snapshot(t, f.s)) {
					t.Fatal("a refused write changed storage")
				}
			})
		}
	}
	t.Run("every number field has a row", func(t *testing.T) {
		for _, p := range f.b.Paths {
			for name, fs := range p.Fields {
				if isNumberField(fs.Type) && !strings.Contains(p.Pattern, "(?P<"+name+">") && !covered[p.Pattern+" "+name] {
					t.Errorf("path %s: number field %s has no row", p.Pattern, name)
				}
			}
		}
	})
}

// TestMessages_RoleARNPartition: a role_arn in another partition than the
// region the mount calls STS in is refused at write, naming both
// partitions (issue 45, item 4); it was stored and failed at read with
// trust-policy advice.
func TestMessages_RoleARNPartition(t *testing.T) {
	tests := []struct {
		name string
		root map[string]interface{} // config/root written first
		arn  string
		want []string // nil: accepted
	}{
		{"China ARN, default region", nil, "arn:aws-cn:iam::123456789012:role/app",
			[]string{"role_arn arn:aws-cn:iam::123456789012:role/app is in partition aws-cn", "region us-east-1, of partition aws,", "arn:aws:iam::", "a region of partition aws-cn"}},
		{"GovCloud ARN, default region", nil, "arn:aws-us-gov:iam::123456789012:role/app",
			[]string{"partition aws-us-gov", "of partition aws,"}},
		{"aws ARN, China region", map[string]interface{}{"region": "cn-north-1"}, "arn:aws:iam::123456789012:role/app",
			[]string{"is in partition aws,", "region cn-north-1, of partition aws-cn"}},
		{"aws ARN, sts_region in GovCloud", map[string]interface{}{"sts_region": "us-gov-west-1"}, "arn:aws:iam::123456789012:role/app",
			[]string{"region us-gov-west-1, of partition aws-us-gov"}},
		{"China ARN, China region", map[string]interface{}{"region": "cn-north-1"}, "arn:aws-cn:iam::123456789012:role/app", nil},
		{"aws ARN, default region", nil, "arn:aws:iam::123456789012:role/app", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{})
			if tc.root != nil {
				mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", tc.root)
			}
			before := snapshot(t, f.s)
			resp, err := do(t, f.b, f.s, logical.CreateOperation, "roles/other", map[string]interface{}{"role_arn": tc.arn})
			if tc.want == nil {
				if err != nil || resp.IsError() {
					t.Fatalf("refused: err=%v resp=%v", err, respErr(resp))
				}
				return
			}
			wantBadRequest(t, resp, err, tc.want...)
			if !sameSnapshot(before, snapshot(t, f.s)) {
				t.Fatal("a refused role write changed storage")
			}
		})
	}
}

// TestMessages_UnsupportedOperation: an operation a path of the plugin does
// not take is still a 405, whose message names the operations the path
// takes and its help (issue 45, item 11), instead of Vault's bare
// "unsupported operation".
func TestMessages_UnsupportedOperation(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	tests := []struct {
		op   logical.Operation
		path string
		want []string
	}{
		{logical.ReadOperation, "config/rotate-root", []string{"config/rotate-root does not take read (vault read); it takes write (vault write)", "vault path-help "}},
		{logical.DeleteOperation, "creds/app", []string{"creds/app does not take delete (vault delete); it takes read (vault read)"}},
		{logical.ListOperation, "config/root", []string{"config/root does not take list (vault list); it takes delete (vault delete), read (vault read), write (vault write)"}},
		{logical.UpdateOperation, "status/app", []string{"status/app does not take write (vault write); it takes read (vault read)"}},
	}
	for _, tc := range tests {
		t.Run(string(tc.op)+" "+tc.path, func(t *testing.T) {
			resp, err := do(t, f.b, f.s, tc.op, tc.path, nil)
			wantCoded(t, resp, err, http.StatusMethodNotAllowed, tc.want...)
		})
	}
}
