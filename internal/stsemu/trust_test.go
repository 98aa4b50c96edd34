package stsemu

import (
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/aws-sdk-go-v2/service/sts/types"
	"github.com/aws/smithy-go"
)

// Accounts of the hub-and-spoke estate the trust tests play: the emulator's
// own (the IAM user's), a hub account and two spokes.
const (
	hubAccount    = "111111111111"
	spokeAccount  = "222222222222"
	spoke2Account = "333333333333"
	rootUserArn   = "arn:aws:iam::" + DefaultAccount + ":user/sts-emulator"
)

func roleARN(account, name string) string { return "arn:aws:iam::" + account + ":role/" + name }

// hubAndSpokes configures a hub (under a path, trusting the IAM user), a
// spoke role trusting the hub, one trusting the hub's whole account, one
// trusting nobody, one anybody, and an unconfigured account played.
func hubAndSpokes() Config {
	return Config{
		Accounts: []string{"666666666666"},
		Roles: []RoleTrust{
			{RoleArn: roleARN(hubAccount, "hubs/hub"), Trust: []string{rootUserArn}},
			{RoleArn: roleARN(hubAccount, "other"), Trust: []string{DefaultAccount}},
			{RoleArn: roleARN(spokeAccount, "app"), Trust: []string{roleARN(hubAccount, "hubs/hub")}},
			{RoleArn: roleARN(spoke2Account, "app"), Trust: []string{"arn:aws:iam::" + hubAccount + ":root"}},
			{RoleArn: roleARN(spokeAccount, "locked"), Trust: []string{}},
			{RoleArn: roleARN("444444444444", "public"), Trust: []string{"*"}},
		},
	}
}

// credsClient is a client signing with issued credentials.
func credsClient(e *Emulator, c *types.Credentials) *sts.Client {
	return newClient(e, aws.ToString(c.AccessKeyId), aws.ToString(c.SecretAccessKey), aws.ToString(c.SessionToken))
}

// assumeAs assumes roleArn with session name session and returns the
// output (nil on error).
func assumeAs(client *sts.Client, roleArn, session string, edit ...func(*sts.AssumeRoleInput)) (*sts.AssumeRoleOutput, error) {
	in := &sts.AssumeRoleInput{RoleArn: aws.String(roleArn), RoleSessionName: aws.String(session)}
	for _, f := range edit {
		f(in)
	}
	return client.AssumeRole(ctx, in)
}

// mustAssume is assumeAs that fails the test on error.
func mustAssume(t *testing.T, client *sts.Client, roleArn, session string, edit ...func(*sts.AssumeRoleInput)) *sts.AssumeRoleOutput {
	t.Helper()
	out, err := assumeAs(client, roleArn, session, edit...)
	if err != nil {
		t.Fatalf("AssumeRole %s: %v", roleArn, err)
	}
	return out
}

// errorMessage returns the AWS error message the SDK surfaced.
func errorMessage(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorMessage()
	}
	return ""
}

// TestTrustPolicies assumes roles of several accounts as several callers:
// the IAM user, its GetSessionToken session, and sessions of roles in the
// hub account; each role answers by its trust policy, an unconfigured one
// by whether its account is played.
func TestTrustPolicies(t *testing.T) {
	e := startEmulator(t, hubAndSpokes())
	root := rootClient(e)
	gst, err := root.GetSessionToken(ctx, &sts.GetSessionTokenInput{})
	if err != nil {
		t.Fatal(err)
	}
	hub := mustAssume(t, root, roleARN(hubAccount, "hubs/hub"), "vault")
	other := mustAssume(t, root, roleARN(hubAccount, "other"), "o1")
	spoke := mustAssume(t, credsClient(e, hub.Credentials), roleARN(spokeAccount, "app"), "s1")

	callers := map[string]struct {
		client *sts.Client
		arn    string
	}{
		"user":    {root, rootUserArn},
		"session": {credsClient(e, gst.Credentials), rootUserArn},
		"hub":     {credsClient(e, hub.Credentials), "arn:aws:sts::" + hubAccount + ":assumed-role/hub/vault"},
		"other":   {credsClient(e, other.Credentials), "arn:aws:sts::" + hubAccount + ":assumed-role/other/o1"},
		"spoke":   {credsClient(e, spoke.Credentials), "arn:aws:sts::" + spokeAccount + ":assumed-role/app/s1"},
	}
	tests := []struct {
		caller, role string
		trusted      bool
	}{
		{"user", roleARN(hubAccount, "hubs/hub"), true},                // names the user
		{"session", roleARN(hubAccount, "hubs/hub"), true},             // a user's session is the user
		{"hub", roleARN(hubAccount, "hubs/hub"), false},                // a role does not trust itself
		{"user", roleARN(hubAccount, "other"), true},                   // account id shorthand
		{"hub", roleARN(hubAccount, "other"), false},                   // ... of another account
		{"user", roleARN(spokeAccount, "app"), false},                  // the spoke trusts the hub only
		{"other", roleARN(spokeAccount, "app"), false},                 // another role of the hub's account
		{"hub", roleARN(spokeAccount, "app"), true},                    // role principal, path and all
		{"hub", roleARN(spoke2Account, "app"), true},                   // the hub account's root
		{"other", roleARN(spoke2Account, "app"), true},                 // ... any of its principals
		{"spoke", roleARN(spoke2Account, "app"), false},                // a principal of another account
		{"user", roleARN(spoke2Account, "app"), false},                 //
		{"hub", roleARN(spokeAccount, "locked"), false},                // trusts nobody
		{"spoke", roleARN("444444444444", "public"), true},             // "*"
		{"user", roleARN(DefaultAccount, "anything"), true},            // unconfigured in the home account
		{"spoke", roleARN(DefaultAccount, "anything"), true},           // ... open to any caller
		{"hub", roleARN("666666666666", "anything"), true},             // unconfigured in a played account
		{"user", roleARN("555555555555", "anything"), false},           // unconfigured, account not played
		{"hub", roleARN(spokeAccount, "unconfigured"), false},          // a spoke account is not played
		{"user", "arn:aws-cn:iam::" + hubAccount + ":role/hub", false}, // another partition
	}
	for _, tc := range tests {
		t.Run(tc.caller+" assumes "+tc.role, func(t *testing.T) {
			c := callers[tc.caller]
			out, err := assumeAs(c.client, tc.role, "t1")
			if !tc.trusted {
				want := "User: " + c.arn + " is not authorized to perform: sts:AssumeRole on resource: " + tc.role
				if errorCode(err) != "AccessDenied" || httpStatus(err) != http.StatusForbidden || errorMessage(err) != want {
					t.Fatalf("err = %v (message %q), want 403 AccessDenied %q", err, errorMessage(err), want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// The session is in the role's account, and says so.
			acct := strings.Split(tc.role, ":")[4]
			name := tc.role[strings.LastIndex(tc.role, "/")+1:]
			wantArn := "arn:aws:sts::" + acct + ":assumed-role/" + name + "/t1"
			if got := aws.ToString(out.AssumedRoleUser.Arn); got != wantArn {
				t.Errorf("AssumedRoleUser.Arn = %q, want %q", got, wantArn)
			}
			id, err := credsClient(e, out.Credentials).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
			if err != nil {
				t.Fatal(err)
			}
			if aws.ToString(id.Account) != acct || aws.ToString(id.Arn) != wantArn {
				t.Errorf("GetCallerIdentity = %s in %s, want %s in %s", aws.ToString(id.Arn), aws.ToString(id.Account), wantArn, acct)
			}
		})
	}
}

// TestRoleChainingDuration: AssumeRole signed with temporary credentials
// (a role session, or GetSessionToken's, as AWS counts them) is capped at
// one hour with AWS's message; other callers get the role's
// MaxSessionDuration, and a longer request its own message.
func TestRoleChainingDuration(t *testing.T) {
	clock := newFakeClock()
	cfg := hubAndSpokes()
	cfg.Now = clock.Now
	cfg.Roles = append(cfg.Roles, RoleTrust{RoleArn: roleARN(spokeAccount, "short"), Trust: []string{"*"}, MaxSessionDuration: 3600})
	e := startEmulator(t, cfg)
	root := rootClient(e)
	hub := mustAssume(t, root, roleARN(hubAccount, "hubs/hub"), "vault")
	gst, err := root.GetSessionToken(ctx, &sts.GetSessionTokenInput{})
	if err != nil {
		t.Fatal(err)
	}
	const chainMsg = "The requested DurationSeconds exceeds the 1 hour session limit for roles assumed by role chaining."
	const maxMsg = "The requested DurationSeconds exceeds the MaxSessionDuration set for this role."
	duration := func(s int32) func(*sts.AssumeRoleInput) {
		return func(in *sts.AssumeRoleInput) {
			if s != 0 {
				in.DurationSeconds = aws.Int32(s)
			}
		}
	}
	tests := []struct {
		name     string
		client   *sts.Client
		role     string
		seconds  int32 // 0 sends none
		wantMsg  string
		wantLife time.Duration
	}{
		{"chained over 1 h", credsClient(e, hub.Credentials), roleARN(spokeAccount, "app"), 3601, chainMsg, 0},
		{"chained 12 h", credsClient(e, hub.Credentials), roleARN(spokeAccount, "app"), 43200, chainMsg, 0},
		{"chained exactly 1 h", credsClient(e, hub.Credentials), roleARN(spokeAccount, "app"), 3600, "", time.Hour},
		{"chained within 1 h", credsClient(e, hub.Credentials), roleARN(spokeAccount, "app"), 900, "", 15 * time.Minute},
		{"chained default", credsClient(e, hub.Credentials), roleARN(spokeAccount, "app"), 0, "", time.Hour},
		{"chained in the home account", credsClient(e, hub.Credentials), roleARN(DefaultAccount, "x"), 7200, chainMsg, 0},
		{"from a GetSessionToken session", credsClient(e, gst.Credentials), roleARN(hubAccount, "hubs/hub"), 7200, chainMsg, 0},
		{"user 12 h", root, roleARN(hubAccount, "hubs/hub"), 43200, "", 12 * time.Hour},
		{"user over the role's maximum", root, roleARN(spokeAccount, "short"), 3601, maxMsg, 0},
		{"user at the role's maximum", root, roleARN(spokeAccount, "short"), 3600, "", time.Hour},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := assumeAs(tc.client, tc.role, "d1", duration(tc.seconds))
			if tc.wantMsg != "" {
				if errorCode(err) != "ValidationError" || httpStatus(err) != http.StatusBadRequest || errorMessage(err) != tc.wantMsg {
					t.Fatalf("err = %v, want 400 ValidationError %q", err, tc.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// The fake clock stands still; expiries are whole milliseconds.
			want := clock.Now().Add(tc.wantLife).Truncate(time.Millisecond)
			if got := aws.ToTime(out.Credentials.Expiration); !got.Equal(want) {
				t.Errorf("expiration %s, want %s (%s)", got, want, tc.wantLife)
			}
		})
	}
}

// TestSourceIdentityTrust: a configured role admits a source identity,
// sent or inherited through role chaining, only when its trust policy
// allows sts:SetSourceIdentity, as AWS requires; a session carries it on
// and may not change it.
func TestSourceIdentityTrust(t *testing.T) {
	cfg := hubAndSpokes()
	cfg.Roles = append(cfg.Roles,
		RoleTrust{RoleArn: roleARN(hubAccount, "hub-si"), Trust: []string{rootUserArn}, SetSourceIdentity: true},
		RoleTrust{RoleArn: roleARN(spokeAccount, "app-si"), Trust: []string{roleARN(hubAccount, "hub-si"), roleARN(hubAccount, "hubs/hub")}, SetSourceIdentity: true},
		RoleTrust{RoleArn: roleARN(spokeAccount, "app-plain"), Trust: []string{roleARN(hubAccount, "hub-si")}},
	)
	e := startEmulator(t, cfg)
	root := rootClient(e)
	withSI := func(v string) func(*sts.AssumeRoleInput) {
		return func(in *sts.AssumeRoleInput) { in.SourceIdentity = aws.String(v) }
	}
	const hubSessionArn = "arn:aws:sts::" + hubAccount + ":assumed-role/hub-si/vault"
	denied := func(caller, role string) string {
		return "User: " + caller + " is not authorized to perform: sts:SetSourceIdentity on resource: " + role
	}

	// The first hop sets it; the role must allow that.
	if _, err := assumeAs(root, roleARN(hubAccount, "hubs/hub"), "vault", withSI("alice")); errorMessage(err) != denied(rootUserArn, roleARN(hubAccount, "hubs/hub")) {
		t.Errorf("setting a source identity on a role without sts:SetSourceIdentity: %v", err)
	}
	hub := mustAssume(t, root, roleARN(hubAccount, "hub-si"), "vault", withSI("alice"))
	if got := aws.ToString(hub.SourceIdentity); got != "alice" {
		t.Fatalf("hub SourceIdentity = %q, want alice", got)
	}
	chained := credsClient(e, hub.Credentials)

	tests := []struct {
		name, role, sent string
		wantErr          string // "" for success
	}{
		{"inherited", roleARN(spokeAccount, "app-si"), "", ""},
		{"kept", roleARN(spokeAccount, "app-si"), "alice", ""},
		{"changed", roleARN(spokeAccount, "app-si"), "bob", denied(hubSessionArn, roleARN(spokeAccount, "app-si"))},
		{"inherited by a role without the permission", roleARN(spokeAccount, "app-plain"), "", denied(hubSessionArn, roleARN(spokeAccount, "app-plain"))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var edit []func(*sts.AssumeRoleInput)
			if tc.sent != "" {
				edit = append(edit, withSI(tc.sent))
			}
			out, err := assumeAs(chained, tc.role, "entity-1", edit...)
			if tc.wantErr != "" {
				if errorCode(err) != "AccessDenied" || errorMessage(err) != tc.wantErr {
					t.Fatalf("err = %v, want AccessDenied %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := aws.ToString(out.SourceIdentity); got != "alice" {
				t.Errorf("SourceIdentity = %q, want alice", got)
			}
			// The issued session carries it: the next hop inherits it, and
			// may not change it.
			next := credsClient(e, out.Credentials)
			// An unconfigured role allows sts:SetSourceIdentity.
			third := mustAssume(t, next, roleARN(DefaultAccount, "third"), "third")
			if got := aws.ToString(third.SourceIdentity); got != "alice" {
				t.Errorf("third hop SourceIdentity = %q, want alice", got)
			}
			if _, err := assumeAs(next, roleARN(DefaultAccount, "third"), "third", withSI("mallory")); errorCode(err) != "AccessDenied" {
				t.Errorf("third hop changing it: %v, want AccessDenied", err)
			}
		})
	}

	// A session without one may set one where the role allows it.
	plainHub := mustAssume(t, root, roleARN(hubAccount, "hubs/hub"), "vault")
	if out := mustAssume(t, credsClient(e, plainHub.Credentials), roleARN(spokeAccount, "app-si"), "entity-2", withSI("bob")); aws.ToString(out.SourceIdentity) != "bob" {
		t.Errorf("SourceIdentity set on the last hop = %q, want bob", aws.ToString(out.SourceIdentity))
	}
}

// TestCallLogAttribution: every call names the access key that signed it
// and the principal verified, so a test can tell which hub credential
// signed each spoke's AssumeRole, across a hub refresh.
func TestCallLogAttribution(t *testing.T) {
	e := startEmulator(t, hubAndSpokes())
	root := rootClient(e)
	hub1 := mustAssume(t, root, roleARN(hubAccount, "hubs/hub"), "vault")
	mustAssume(t, credsClient(e, hub1.Credentials), roleARN(spokeAccount, "app"), "a1")
	hub2 := mustAssume(t, root, roleARN(hubAccount, "hubs/hub"), "vault")
	mustAssume(t, credsClient(e, hub2.Credentials), roleARN(spoke2Account, "app"), "b1")
	if _, err := assumeAs(credsClient(e, hub2.Credentials), roleARN(spokeAccount, "locked"), "c1"); errorCode(err) != "AccessDenied" {
		t.Fatalf("locked: %v", err)
	}
	_, _ = newClient(e, aws.ToString(hub2.Credentials.AccessKeyId), "wrong", aws.ToString(hub2.Credentials.SessionToken)).
		AssumeRole(ctx, assumeInput("x"))

	const hubArn = "arn:aws:sts::" + hubAccount + ":assumed-role/hub/vault"
	key1, key2 := aws.ToString(hub1.Credentials.AccessKeyId), aws.ToString(hub2.Credentials.AccessKeyId)
	want := []struct{ role, outcome, key, caller string }{
		{roleARN(hubAccount, "hubs/hub"), "ok", DefaultAccessKey, rootUserArn},
		{roleARN(spokeAccount, "app"), "ok", key1, hubArn},
		{roleARN(hubAccount, "hubs/hub"), "ok", DefaultAccessKey, rootUserArn},
		{roleARN(spoke2Account, "app"), "ok", key2, hubArn},
		{roleARN(spokeAccount, "locked"), "AccessDenied", key2, hubArn},
		{roleARN(DefaultAccount, "x"), "SignatureDoesNotMatch", key2, ""}, // not verified: no caller
	}
	calls := e.Calls()
	if len(calls) != len(want) {
		t.Fatalf("%d calls, want %d: %+v", len(calls), len(want), calls)
	}
	for i, w := range want {
		if c := calls[i]; c.RoleArn != w.role || c.Outcome != w.outcome || c.AccessKeyID != w.key || c.CallerArn != w.caller {
			t.Errorf("call %d = %+v\nwant role %s, outcome %s, signed by %s as %q", i, c, w.role, w.outcome, w.key, w.caller)
		}
	}
	// Each spoke's signing key is the one its hub call issued: the chain
	// can be followed through the log alone.
	if calls[1].AccessKeyID != calls[0].IssuedKeyID || calls[3].AccessKeyID != calls[2].IssuedKeyID {
		t.Errorf("spoke calls signed by %s and %s, hub calls issued %s and %s",
			calls[1].AccessKeyID, calls[3].AccessKeyID, calls[0].IssuedKeyID, calls[2].IssuedKeyID)
	}

	// The control API carries the same attribution.
	wire, raw := wireCalls(t, e)
	if len(wire) != len(want) || wire[1]["access_key_id"] != key1 || wire[1]["caller_arn"] != hubArn || wire[5]["caller_arn"] != "" {
		t.Errorf("GET /_emulator/calls = %s", raw)
	}
}

// TestRolesControlAPI sets, lists, replaces and forgets roles over
// /_emulator/roles and the accounts over /_emulator/config, each change
// visible to the next AssumeRole; a bad request changes nothing.
func TestRolesControlAPI(t *testing.T) {
	e := startEmulator(t, Config{})
	do := func(t *testing.T, method, path, body string, wantStatus int) string {
		t.Helper()
		return string(controlCall(t, e, method, path, body, wantStatus))
	}
	list := func(t *testing.T, raw string) []RoleTrust {
		t.Helper()
		var roles []RoleTrust
		if err := json.Unmarshal([]byte(raw), &roles); err != nil || roles == nil {
			t.Fatalf("%v in %s, want a JSON list", err, raw)
		}
		return roles
	}
	root := rootClient(e)
	hubArn, appArn := roleARN(hubAccount, "hub"), roleARN(DefaultAccount, "app")
	assumeCode := func(roleArn string) string {
		_, err := assumeAs(root, roleArn, "ctl")
		return errorCode(err)
	}

	if got := list(t, do(t, "GET", "/_emulator/roles", "", 200)); len(got) != 0 {
		t.Fatalf("GET roles at start = %+v, want []", got)
	}
	if code := assumeCode(hubArn); code != "AccessDenied" {
		t.Fatalf("hub before it is configured: %q, want AccessDenied", code)
	}

	body := `[{"role_arn":"` + hubArn + `","trust":["` + rootUserArn + `"],"max_session_duration":3600},
	          {"role_arn":"` + appArn + `","trust":[]}]`
	got := list(t, do(t, "POST", "/_emulator/roles", body, 200))
	want := []RoleTrust{ // by ARN: account 111111111111 first
		{RoleArn: hubArn, Trust: []string{rootUserArn}, MaxSessionDuration: 3600},
		{RoleArn: appArn, Trust: []string{}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("after POST = %+v, want %+v sorted by ARN", got, want)
	}
	if assumeCode(hubArn) != "" || assumeCode(appArn) != "AccessDenied" {
		t.Errorf("after POST: hub %q, app %q; want the hub trusting the user, app nobody", assumeCode(hubArn), assumeCode(appArn))
	}

	// POST adds and replaces by ARN, keeping the others.
	do(t, "POST", "/_emulator/roles", `[{"role_arn":"`+appArn+`","trust":["*"],"set_source_identity":true}]`, 200)
	want[1] = RoleTrust{RoleArn: appArn, Trust: []string{"*"}, SetSourceIdentity: true}
	if got := e.Roles(); !reflect.DeepEqual(got, want) {
		t.Errorf("after a second POST = %+v", got)
	}

	// Invalid bodies: 400 naming the problem, and nothing changes.
	before := e.Roles()
	for _, tc := range []struct{ body, wantInError string }{
		{`[{"role_arn":"arn:aws:iam::1:role/x","trust":[]}]`, "not a role ARN"},
		{`[{"role_arn":"arn:aws-cn:iam::111111111111:role/x","trust":[]}]`, `partition "aws-cn"`},
		{`[{"role_arn":"` + hubArn + `"}]`, "trust is missing"},
		{`[{"role_arn":"` + hubArn + `","trust":["alice"]}]`, `principal "alice"`},
		{`[{"role_arn":"` + hubArn + `","trust":["arn:aws:iam::111111111111:group/g"]}]`, "none of"},
		{`[{"role_arn":"` + hubArn + `","trust":["arn:aws-us-gov:iam::111111111111:root"]}]`, `partition "aws-us-gov"`},
		{`[{"role_arn":"` + hubArn + `","trust":[],"max_session_duration":900}]`, "outside IAM's 3600 to 43200"},
		{`[{"role_arn":"` + appArn + `","trust":["*"]},{"role_arn":"` + appArn + `","trust":[]}]`, "listed twice"},
		{`[{"role_arn":"` + hubArn + `","trust":[],"trusted":[]}]`, "unknown field"},
		{`{"role_arn":"` + hubArn + `","trust":[]}`, "JSON list"},
	} {
		var answer struct{ Error string }
		if err := json.Unmarshal([]byte(do(t, "POST", "/_emulator/roles", tc.body, 400)), &answer); err != nil || !strings.Contains(answer.Error, tc.wantInError) {
			t.Errorf("POST %s: %q (%v), want an error containing %q", tc.body, answer.Error, err, tc.wantInError)
		}
	}
	if after := e.Roles(); !reflect.DeepEqual(after, before) {
		t.Errorf("a refused POST changed the roles: %+v, was %+v", after, before)
	}

	// PUT replaces the whole list.
	if got := list(t, do(t, "PUT", "/_emulator/roles", `[{"role_arn":"`+appArn+`","trust":[]}]`, 200)); len(got) != 1 || got[0].RoleArn != appArn {
		t.Errorf("after PUT = %+v, want app alone", got)
	}
	if assumeCode(hubArn) != "AccessDenied" {
		t.Error("the hub, no longer configured, is still assumable in an account not played")
	}

	// DELETE one: the role is unconfigured again, open in the home account.
	do(t, "DELETE", "/_emulator/roles?role_arn="+appArn, "", 200)
	do(t, "DELETE", "/_emulator/roles?role_arn="+appArn, "", 404)
	if assumeCode(appArn) != "" {
		t.Error("a forgotten role of the home account is not open again")
	}
	do(t, "POST", "/_emulator/roles", body, 200)
	if got := list(t, do(t, "DELETE", "/_emulator/roles", "", 200)); len(got) != 0 {
		t.Errorf("after DELETE = %+v, want []", got)
	}
	do(t, "PATCH", "/_emulator/roles", "", 405)

	// Accounts: a played account's unconfigured roles are open.
	var cv ConfigView
	if err := json.Unmarshal([]byte(do(t, "POST", "/_emulator/config", `{"accounts":["`+hubAccount+`","`+DefaultAccount+`"]}`, 200)), &cv); err != nil {
		t.Fatal(err)
	}
	if want := []string{DefaultAccount, hubAccount}; strings.Join(cv.Accounts, ",") != strings.Join(want, ",") {
		t.Errorf("accounts = %q, want %q (home first, once)", cv.Accounts, want)
	}
	if assumeCode(hubArn) != "" {
		t.Error("an unconfigured role of a played account is not open")
	}
	if raw := do(t, "POST", "/_emulator/config", `{"accounts":["12345"],"max_lifetime":"1s"}`, 400); !strings.Contains(raw, "12-digit") {
		t.Errorf("bad account: %s", raw)
	}
	if cv := e.ConfigView(); len(cv.Accounts) != 2 || cv.MaxLifetime != DefaultMaxLifetime.String() {
		t.Errorf("a refused config POST changed something: %+v", cv)
	}
	do(t, "POST", "/_emulator/config", `{"accounts":[]}`, 200)
	if assumeCode(hubArn) != "AccessDenied" {
		t.Error("an account no longer played is still open")
	}
}

// TestTrusts is the principal matching rule alone.
func TestTrusts(t *testing.T) {
	user := principal{kind: kindUser, arn: rootUserArn}
	session := principal{kind: kindSession, arn: rootUserArn}
	hubSession := principal{kind: kindRole, arn: "arn:aws:sts::" + hubAccount + ":assumed-role/hub/vault"}
	fed := principal{kind: kindFederated, arn: "arn:aws:sts::" + DefaultAccount + ":federated-user/carol"}
	tests := []struct {
		entry  string
		caller principal
		want   bool
	}{
		{"*", user, true},
		{"*", hubSession, true},
		{DefaultAccount, user, true},
		{DefaultAccount, hubSession, false},
		{hubAccount, hubSession, true},
		{"arn:aws:iam::" + hubAccount + ":root", hubSession, true},
		{"arn:aws:iam::" + DefaultAccount + ":root", fed, true},
		{rootUserArn, user, true},
		{rootUserArn, session, true},
		{rootUserArn, hubSession, false},
		{"arn:aws:iam::" + DefaultAccount + ":user/someone", user, false},
		{roleARN(hubAccount, "hub"), hubSession, true},
		{roleARN(hubAccount, "a/b/hub"), hubSession, true},
		{roleARN(hubAccount, "hub2"), hubSession, false},
		{roleARN(hubAccount, "hu"), hubSession, false},
		{roleARN(spokeAccount, "hub"), hubSession, false},
		// A user named like the role is no session of it.
		{roleARN(DefaultAccount, "sts-emulator"), user, false},
		{hubSession.arn, hubSession, true},
		{"arn:aws:sts::" + hubAccount + ":assumed-role/hub/other", hubSession, false},
		{fed.arn, fed, true},
	}
	for _, tc := range tests {
		if got := trusts(tc.entry, tc.caller); got != tc.want {
			t.Errorf("trusts(%q, %s %s) = %v, want %v", tc.entry, tc.caller.kind, tc.caller.arn, got, tc.want)
		}
	}
}

// TestConfigRolesChecked: New refuses an invalid Config.Roles or
// Config.Accounts loudly, and CheckRoles says why beforehand.
func TestConfigRolesChecked(t *testing.T) {
	bad := []RoleTrust{{RoleArn: roleARN(hubAccount, "hub"), Trust: []string{"nobody"}}}
	if err := CheckRoles("", bad); err == nil || !strings.Contains(err.Error(), `principal "nobody"`) {
		t.Errorf("CheckRoles = %v, want the bad principal named", err)
	}
	if err := CheckRoles("aws-us-gov", []RoleTrust{{RoleArn: "arn:aws-us-gov:iam::111111111111:role/x", Trust: []string{"arn:aws-us-gov:iam::111111111111:root"}}}); err != nil {
		t.Errorf("CheckRoles in aws-us-gov: %v", err)
	}
	for name, cfg := range map[string]Config{"roles": {Roles: bad}, "accounts": {Accounts: []string{"x"}}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("New with invalid %s did not panic", name)
				}
			}()
			New(cfg)
		}()
	}
}
