package awsresilient

import (
	"context"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

func TestRoles_CRUD(t *testing.T) {
	b, s := getTestBackend(t)

	if resp, err := do(t, b, s, logical.ReadOperation, "roles/app", nil); err != nil || resp != nil {
		t.Fatalf("read of a missing role = %v, %v; want nil, nil (404)", resp, err)
	}

	steps := []struct {
		name  string
		op    logical.Operation
		write map[string]interface{}
		want  map[string]interface{}
	}{
		{
			name:  "create with defaults",
			op:    logical.CreateOperation,
			write: map[string]interface{}{"role_arn": testRoleARN},
			want: map[string]interface{}{
				"credential_type": "assumed_role", "role_arn": testRoleARN, "external_id": "",
				"role_session_name": "vault-app", "policy_document": "", "policy_arns": []string{},
				"session_tags": map[string]string{}, "ttl": int64(3600), "lease": true, "cache_scope": "role", "source_role": "",
			},
		},
		{
			name: "update every field",
			op:   logical.UpdateOperation,
			write: map[string]interface{}{
				"role_arn":          "arn:aws:iam::123456789012:role/team/app-admin",
				"external_id":       "ext-123:abc",
				"role_session_name": "svc@app",
				"policy_document":   `{ "Version": "2012-10-17", "Statement": [] }`,
				"policy_arns":       "arn:aws:iam::aws:policy/ReadOnlyAccess,arn:aws:iam::123456789012:policy/mine",
				"session_tags":      map[string]interface{}{"team": "core", "env": "prod"},
				"ttl":               "2h",
			},
			want: map[string]interface{}{
				"credential_type": "assumed_role", "role_arn": "arn:aws:iam::123456789012:role/team/app-admin",
				"external_id": "ext-123:abc", "role_session_name": "svc@app",
				"policy_document": `{"Version":"2012-10-17","Statement":[]}`,
				"policy_arns":     []string{"arn:aws:iam::aws:policy/ReadOnlyAccess", "arn:aws:iam::123456789012:policy/mine"},
				"session_tags":    map[string]string{"team": "core", "env": "prod"}, "ttl": int64(7200), "lease": true, "cache_scope": "role", "source_role": "",
			},
		},
		{
			name:  "partial update keeps the rest",
			op:    logical.UpdateOperation,
			write: map[string]interface{}{"ttl": 900},
			want: map[string]interface{}{
				"credential_type": "assumed_role", "role_arn": "arn:aws:iam::123456789012:role/team/app-admin",
				"external_id": "ext-123:abc", "role_session_name": "svc@app",
				"policy_document": `{"Version":"2012-10-17","Statement":[]}`,
				"policy_arns":     []string{"arn:aws:iam::aws:policy/ReadOnlyAccess", "arn:aws:iam::123456789012:policy/mine"},
				"session_tags":    map[string]string{"team": "core", "env": "prod"}, "ttl": int64(900), "lease": true, "cache_scope": "role", "source_role": "",
			},
		},
		{
			name: "switch to federation_token",
			op:   logical.UpdateOperation,
			write: map[string]interface{}{
				"credential_type": "federation_token", "role_arn": "", "external_id": "", "role_session_name": "",
			},
			want: map[string]interface{}{
				"credential_type": "federation_token", "role_arn": "", "external_id": "",
				"role_session_name": "vault-app", "policy_document": `{"Version":"2012-10-17","Statement":[]}`,
				"policy_arns":  []string{"arn:aws:iam::aws:policy/ReadOnlyAccess", "arn:aws:iam::123456789012:policy/mine"},
				"session_tags": map[string]string{"team": "core", "env": "prod"}, "ttl": int64(900), "lease": true, "cache_scope": "role", "source_role": "",
			},
		},
		{
			name: "switch to session_token",
			op:   logical.UpdateOperation,
			write: map[string]interface{}{
				"credential_type": "session_token", "policy_document": "", "policy_arns": "", "session_tags": map[string]interface{}{},
			},
			want: map[string]interface{}{
				"credential_type": "session_token", "role_arn": "", "external_id": "",
				"role_session_name": "", "policy_document": "", "policy_arns": []string{},
				"session_tags": map[string]string{}, "ttl": int64(900), "lease": true, "cache_scope": "role", "source_role": "",
			},
		},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			mustDo(t, b, s, st.op, "roles/app", st.write)
			got := mustDo(t, b, s, logical.ReadOperation, "roles/app", nil).Data
			if !reflect.DeepEqual(got, st.want) {
				t.Fatalf("read = %#v\nwant %#v", got, st.want)
			}
		})
	}

	t.Run("list", func(t *testing.T) {
		mustDo(t, b, s, logical.CreateOperation, "roles/b-role", map[string]interface{}{"credential_type": "session_token"})
		got := mustDo(t, b, s, logical.ListOperation, "roles/", nil).Data["keys"]
		if !reflect.DeepEqual(got, []string{"app", "b-role"}) {
			t.Fatalf("list = %v", got)
		}
	})
	t.Run("delete", func(t *testing.T) {
		mustDo(t, b, s, logical.DeleteOperation, "roles/app", nil)
		if resp, err := do(t, b, s, logical.ReadOperation, "roles/app", nil); err != nil || resp != nil {
			t.Fatalf("read after delete = %v, %v", resp, err)
		}
		got := mustDo(t, b, s, logical.ListOperation, "roles/", nil).Data["keys"]
		if !reflect.DeepEqual(got, []string{"b-role"}) {
			t.Fatalf("list after delete = %v", got)
		}
	})
}

func TestRoles_ExistenceCheck(t *testing.T) {
	b, s := getTestBackend(t)
	req := &logical.Request{Operation: logical.CreateOperation, Path: "roles/app", Storage: s}
	if _, exists, err := b.HandleExistenceCheck(t.Context(), req); err != nil || exists {
		t.Fatalf("before create: exists=%v err=%v", exists, err)
	}
	mustDo(t, b, s, logical.CreateOperation, "roles/app", map[string]interface{}{"role_arn": testRoleARN})
	if _, exists, err := b.HandleExistenceCheck(t.Context(), req); err != nil || !exists {
		t.Fatalf("after create: exists=%v err=%v", exists, err)
	}
}

func TestRoles_DerivedSessionName(t *testing.T) {
	long := strings.Repeat("n", 80)
	tests := []struct {
		name, credType, role, want string
	}{
		{"assumed_role", "assumed_role", "app", "vault-app"},
		{"assumed_role truncated to 64", "assumed_role", long, ("vault-" + long)[:64]},
		{"federation_token truncated to 32", "federation_token", long, ("vault-" + long)[:32]},
		{"session_token has none", "session_token", "app", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, s := getTestBackend(t)
			data := map[string]interface{}{"credential_type": tc.credType}
			if tc.credType == "assumed_role" {
				data["role_arn"] = testRoleARN
			}
			mustDo(t, b, s, logical.CreateOperation, "roles/"+tc.role, data)
			got := mustDo(t, b, s, logical.ReadOperation, "roles/"+tc.role, nil).Data["role_session_name"]
			if got != tc.want {
				t.Fatalf("role_session_name = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRoles_BadInput(t *testing.T) {
	arn := map[string]interface{}{"role_arn": testRoleARN}
	with := func(extra map[string]interface{}) map[string]interface{} {
		out := map[string]interface{}{"role_arn": testRoleARN}
		for k, v := range extra {
			out[k] = v
		}
		return out
	}
	tests := []struct {
		name string
		data map[string]interface{}
		want string
	}{
		{"unknown credential type", with(map[string]interface{}{"credential_type": "iam_user"}), "credential_type must be one of assumed_role, session_token, federation_token"},
		{"assumed_role without arn", map[string]interface{}{}, "role_arn is required for credential_type assumed_role"},
		{"not an arn", map[string]interface{}{"role_arn": "app"}, "role_arn must be an IAM role ARN such as arn:aws:iam::123456789012:role/app"},
		{"user arn", map[string]interface{}{"role_arn": "arn:aws:iam::123456789012:user/app"}, "role_arn must be an IAM role ARN"},
		{"short account", map[string]interface{}{"role_arn": "arn:aws:iam::12345:role/app"}, "role_arn must be an IAM role ARN"},
		{"role name too long", map[string]interface{}{"role_arn": "arn:aws:iam::123456789012:role/" + strings.Repeat("r", 65)}, "role_arn must be an IAM role ARN"},
		{"s3 arn", map[string]interface{}{"role_arn": "arn:aws:s3:::bucket"}, "role_arn must be an IAM role ARN"},
		{"arn on session_token", with(map[string]interface{}{"credential_type": "session_token"}), "role_arn is only valid for credential_type assumed_role, not session_token"},
		{"arn on federation_token", with(map[string]interface{}{"credential_type": "federation_token"}), "role_arn is only valid for credential_type assumed_role, not federation_token"},
		{"external id on federation_token", map[string]interface{}{"credential_type": "federation_token", "external_id": "abc"}, "external_id is only valid for credential_type assumed_role"},
		{"external id too short", with(map[string]interface{}{"external_id": "a"}), `external_id must be 2 to 1224 characters matching [\w+=,.@:/-]`},
		{"external id bad characters", with(map[string]interface{}{"external_id": "has space"}), "external_id must be 2 to 1224 characters"},
		{"external id too long", with(map[string]interface{}{"external_id": strings.Repeat("e", 1225)}), "external_id must be 2 to 1224 characters"},
		{"session name too short", with(map[string]interface{}{"role_session_name": "a"}), `role_session_name must be 2 to 64 characters matching [\w+=,.@-] for assumed_role; got "a"`},
		{"session name too long", with(map[string]interface{}{"role_session_name": strings.Repeat("s", 65)}), "role_session_name must be 2 to 64 characters"},
		{"session name bad characters", with(map[string]interface{}{"role_session_name": "a b"}), "role_session_name must be 2 to 64 characters"},
		{"federation name too long", map[string]interface{}{"credential_type": "federation_token", "role_session_name": strings.Repeat("s", 33)}, "role_session_name must be 2 to 32 characters matching [\\w+=,.@-] for federation_token"},
		{"session name on session_token", map[string]interface{}{"credential_type": "session_token", "role_session_name": "abc"}, "role_session_name is not valid for credential_type session_token"},
		{"policy not json", with(map[string]interface{}{"policy_document": "{not json"}), "policy_document must be a JSON object"},
		{"policy json array", with(map[string]interface{}{"policy_document": "[1,2]"}), "policy_document must be a JSON object"},
		{"policy json null", with(map[string]interface{}{"policy_document": "null"}), "policy_document must be a JSON object"},
		{"policy too long", with(map[string]interface{}{"policy_document": `{"a":"` + strings.Repeat("x", 2050) + `"}`}), "policy_document must be at most 2048 characters without whitespace"},
		{"policy on session_token", map[string]interface{}{"credential_type": "session_token", "policy_document": "{}"}, "policy_document and policy_arns are not valid for credential_type session_token"},
		{"policy arn malformed", with(map[string]interface{}{"policy_arns": "arn:aws:iam::aws:role/x"}), "policy_arns must be IAM policy ARNs such as arn:aws:iam::aws:policy/ReadOnlyAccess"},
		{"too many policy arns", with(map[string]interface{}{"policy_arns": strings.TrimSuffix(strings.Repeat("arn:aws:iam::aws:policy/P,", 11), ",")}), "policy_arns takes at most 10 ARNs; got 11"},
		{"policy arns on session_token", map[string]interface{}{"credential_type": "session_token", "policy_arns": "arn:aws:iam::aws:policy/P"}, "not valid for credential_type session_token"},
		{"tag key bad characters", with(map[string]interface{}{"session_tags": map[string]interface{}{"a*b": "v"}}), `session_tags key "a*b" must be 1 to 128 characters`},
		{"tag key too long", with(map[string]interface{}{"session_tags": map[string]interface{}{strings.Repeat("k", 129): "v"}}), "must be 1 to 128 characters"},
		{"tag value too long", with(map[string]interface{}{"session_tags": map[string]interface{}{"k": strings.Repeat("v", 257)}}), `session_tags value of key "k" must be at most 256 characters`},
		{"too many tags", with(map[string]interface{}{"session_tags": manyTags(51)}), "session_tags takes at most 50 tags; got 51"},
		{"tags not key=value", with(map[string]interface{}{"session_tags": []string{"novalue"}}), "up to 50"},
		{"tags on session_token", map[string]interface{}{"credential_type": "session_token", "session_tags": map[string]interface{}{"k": "v"}}, "session_tags are not valid for credential_type session_token"},
		{"ttl too short", with(map[string]interface{}{"ttl": 899}), "ttl must be between 15m0s and 12h0m0s; got 14m59s"},
		{"ttl too long", with(map[string]interface{}{"ttl": "12h1s"}), "ttl must be between 15m0s and 12h0m0s; got 12h0m1s"},
		{"lease not a bool", with(map[string]interface{}{"lease": "maybe"}), `lease takes true or false; got "maybe". lease: Whether creds/<name> returns a Vault lease`},
		{"ttl negative", with(map[string]interface{}{"ttl": -1}), "900s to 12h"},
		{"ttl garbage", with(map[string]interface{}{"ttl": "forever"}), "900s to 12h"},
		{"bad name", arn, `"-app-" is not a valid role name: a role name is ASCII letters, digits, _, - and ., beginning and ending with a letter, digit or _`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, s := getTestBackend(t)
			path := "roles/app"
			if tc.name == "bad name" {
				path = "roles/-app-"
			}
			before := snapshot(t, s)
			resp, err := do(t, b, s, logical.CreateOperation, path, tc.data)
			wantBadRequest(t, resp, err, tc.want)
			if !sameSnapshot(before, snapshot(t, s)) {
				t.Fatal("a rejected write changed storage")
			}
			if tc.name == "bad name" {
				return // no valid role of that name to update
			}

			// The same input as an update of a valid role changes nothing either.
			mustDo(t, b, s, logical.CreateOperation, path, map[string]interface{}{"role_arn": testRoleARN})
			before = snapshot(t, s)
			resp, err = do(t, b, s, logical.UpdateOperation, path, tc.data)
			if err != nil || !resp.IsError() {
				// Some inputs are only invalid without a role_arn already set.
				if tc.name == "assumed_role without arn" {
					return
				}
				t.Fatalf("update with %v: err=%v resp=%v, want 400", tc.data, err, resp)
			}
			if !sameSnapshot(before, snapshot(t, s)) {
				t.Fatal("a rejected update changed storage")
			}
		})
	}
}

func manyTags(n int) map[string]interface{} {
	out := map[string]interface{}{}
	for i := 0; i < n; i++ {
		out["k"+strings.Repeat("x", i)] = "v"
	}
	return out
}

// TestRoles_ChangeDropsCache checks that a change to what a role issues
// drops its cached credential and status (the next read fetches a new one),
// a write that changes nothing keeps them, and a delete removes everything.
func TestRoles_ChangeDropsCache(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	first := f.mustReadCreds(testRole)

	t.Run("same definition keeps the cache", func(t *testing.T) {
		mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+testRole, map[string]interface{}{"role_arn": testRoleARN, "ttl": "1h"})
		resp := f.mustReadCreds(testRole)
		if resp.Data["access_key"] != first.Data["access_key"] || len(f.log.all()) != 1 {
			t.Fatalf("an unchanged role lost its credential (%d STS calls)", len(f.log.all()))
		}
	})
	t.Run("lease alone keeps the cache", func(t *testing.T) {
		due, _ := f.b.refresher.plannedAt(roleKey(testRole))
		for _, lease := range []bool{false, true} {
			mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+testRole, map[string]interface{}{"lease": lease})
			if got := mustDo(t, f.b, f.s, logical.ReadOperation, "roles/"+testRole, nil).Data["lease"]; got != lease {
				t.Fatalf("lease = %v after writing %v", got, lease)
			}
			if c := cached(t, f.s, testRole); c == nil || c.AccessKey != first.Data["access_key"] {
				t.Fatalf("lease=%v dropped the cache entry", lease)
			}
			if at, ok := f.b.refresher.plannedAt(roleKey(testRole)); !ok || !at.Equal(due) {
				t.Fatalf("lease=%v moved the scheduled refresh: %v %v, want %v", lease, at, ok, due)
			}
			resp := f.mustReadCreds(testRole)
			if resp.Data["access_key"] != first.Data["access_key"] || len(f.log.all()) != 1 {
				t.Fatalf("lease=%v: read served %v after %d STS calls, want the cached credential and 1 call",
					lease, resp.Data["access_key"], len(f.log.all()))
			}
			if (resp.Secret == nil) != !lease {
				t.Fatalf("lease=%v: response secret = %+v", lease, resp.Secret)
			}
		}
	})
	t.Run("changed definition drops the cache", func(t *testing.T) {
		mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+testRole, map[string]interface{}{"ttl": "2h"})
		if c := cached(t, f.s, testRole); c != nil {
			t.Fatal("cache entry survived a role change")
		}
		if st, _ := getStatus(t.Context(), f.s, roleKey(testRole)); st != nil {
			t.Fatal("status survived a role change")
		}
		if _, ok := f.b.refresher.plannedAt(roleKey(testRole)); ok {
			t.Fatal("refresh of the old definition still scheduled")
		}
		if got := f.status(testRole)["state"]; got != stateEmpty {
			t.Fatalf("state = %v, want empty", got)
		}
		resp := f.mustReadCreds(testRole)
		if resp.Data["access_key"] == first.Data["access_key"] || len(f.log.all()) != 2 {
			t.Fatalf("read after a role change served the old credential (%d STS calls)", len(f.log.all()))
		}
	})
	t.Run("delete removes role, cache and status", func(t *testing.T) {
		mustDo(t, f.b, f.s, logical.DeleteOperation, "roles/"+testRole, nil)
		for _, key := range []string{rolePrefix + testRole, cachePrefix + testRole, statusPrefix + testRole} {
			if e, _ := f.s.Get(t.Context(), key); e != nil {
				t.Fatalf("%s survived the delete", key)
			}
		}
		if n := f.clock.Pending(); n != 0 {
			t.Fatalf("%d timers pending after the delete, want none", n)
		}
		resp, err := do(t, f.b, f.s, logical.ReadOperation, "creds/"+testRole, nil)
		wantBadRequest(t, resp, err, `role "app" not found`)
		resp, err = do(t, f.b, f.s, logical.ReadOperation, "status/"+testRole, nil)
		wantBadRequest(t, resp, err, `role "app" not found`)
	})
}

// TestRoles_ChangeDuringRefresh checks that a cycle that started for the old
// definition of a role cannot store its result after the role changed.
func TestRoles_ChangeDuringRefresh(t *testing.T) {
	for _, change := range []string{"update", "delete"} {
		t.Run(change, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{})
			inCall := make(chan struct{})
			release := make(chan struct{})
			f.log.before = func() {
				close(inCall)
				<-release
			}
			done := make(chan result, 1)
			go func() {
				resp, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.UpdateOperation, Path: "refresh/" + testRole, Storage: f.s})
				done <- result{resp, err}
			}()
			<-inCall
			if change == "update" {
				mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+testRole, map[string]interface{}{"ttl": "2h"})
			} else {
				mustDo(t, f.b, f.s, logical.DeleteOperation, "roles/"+testRole, nil)
			}
			close(release)
			<-done
			if c := cached(t, f.s, testRole); c != nil {
				t.Fatal("a cycle for the old definition stored its credential")
			}
			if st, _ := getStatus(t.Context(), f.s, roleKey(testRole)); st != nil {
				t.Fatal("a cycle for the old definition stored its status")
			}
		})
	}
}

// TestRoles_CredentialTypes fetches each credential type from the emulator
// through the real SDK.
func TestRoles_CredentialTypes(t *testing.T) {
	tests := []struct {
		name    string
		data    map[string]interface{}
		action  string
		wantARN string
	}{
		{
			"assumed_role", map[string]interface{}{
				"role_arn": testRoleARN, "external_id": "ext-1", "role_session_name": "sess",
				"policy_document": `{"Version":"2012-10-17","Statement":[]}`, "policy_arns": "arn:aws:iam::aws:policy/ReadOnlyAccess",
				"session_tags": map[string]interface{}{"team": "core"},
			}, "AssumeRole", "arn:aws:sts::" + stsemu.DefaultAccount + ":assumed-role/app/sess",
		},
		{"session_token", map[string]interface{}{"credential_type": "session_token", "ttl": "15m"}, "GetSessionToken", ""},
		{
			"federation_token", map[string]interface{}{"credential_type": "federation_token", "role_session_name": "fed-user", "policy_document": `{"Version":"2012-10-17","Statement":[]}`},
			"GetFederationToken", "arn:aws:sts::" + stsemu.DefaultAccount + ":federated-user/fed-user",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{noRole: true})
			mustDo(t, f.b, f.s, logical.CreateOperation, "roles/r", tc.data)
			resp := f.mustReadCreds("r")
			if got := resp.Data["arn"]; tc.wantARN != "" && got != tc.wantARN {
				t.Fatalf("arn = %v, want %v", got, tc.wantARN)
			}
			if _, ok := resp.Data["arn"]; tc.wantARN == "" && ok {
				t.Fatalf("arn = %v, want none", resp.Data["arn"])
			}
			calls := f.emu.Calls()
			if len(calls) != 1 || calls[0].Action != tc.action || calls[0].Outcome != "ok" {
				t.Fatalf("emulator calls = %+v, want one successful %s", calls, tc.action)
			}
			exp, _ := time.Parse(time.RFC3339, resp.Data["expiration"].(string))
			if !exp.After(f.clock.Now()) {
				t.Fatalf("expiration %v is not in the future", exp)
			}
		})
	}
}

// TestRoles_ChangeDuringColdRead checks that a cold reader whose cycle was
// overtaken by a role change gets a credential for the new definition.
func TestRoles_ChangeDuringColdRead(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	inCall := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	f.log.before = func() {
		once.Do(func() {
			close(inCall)
			<-release
		})
	}
	done := make(chan result, 1)
	go func() {
		resp, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: f.s})
		done <- result{resp, err}
	}()
	<-inCall
	mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+testRole, map[string]interface{}{"ttl": "2h"})
	close(release)
	r := <-done
	if r.err != nil || r.resp.IsError() {
		t.Fatalf("err=%v resp=%v", r.err, respErr(r.resp))
	}
	c := cached(t, f.s, testRole)
	if c == nil || r.resp.Data["access_key"] != c.AccessKey || len(f.log.all()) != 2 {
		t.Fatalf("reader got %v, cache holds %+v after %d calls; want the second call's credential", r.resp.Data["access_key"], c, len(f.log.all()))
	}
}
