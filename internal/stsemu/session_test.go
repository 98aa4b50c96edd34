package stsemu

import (
	"net/http"
	"regexp"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/aws-sdk-go-v2/service/sts/types"
)

// TestSessionNameAndSourceIdentity follows one AssumeRole's RoleSessionName
// and SourceIdentity into the response, the call log (Go and control API)
// and GetCallerIdentity signed with the credential it issued.
func TestSessionNameAndSourceIdentity(t *testing.T) {
	e := startEmulator(t, Config{})
	roleArn := "arn:aws:iam::123456789012:role/team/a/app"
	out, err := rootClient(e).AssumeRole(ctx, &sts.AssumeRoleInput{
		RoleArn:         aws.String(roleArn),
		RoleSessionName: aws.String("entity-42"),
		SourceIdentity:  aws.String("alice@example.com"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := aws.ToString(out.SourceIdentity); got != "alice@example.com" {
		t.Errorf("AssumeRole SourceIdentity = %q, want the one sent", got)
	}
	// AWS: arn:aws:sts::ACCOUNT:assumed-role/ROLE-NAME/SESSION (the role's
	// path dropped) and UserId ROLE-ID:SESSION, the role id AROA + 17.
	wantArn := "arn:aws:sts::123456789012:assumed-role/app/entity-42"
	if got := aws.ToString(out.AssumedRoleUser.Arn); got != wantArn {
		t.Errorf("AssumedRoleUser.Arn = %q, want %q", got, wantArn)
	}
	wantID := stableID("AROA", roleArn) + ":entity-42"
	if got := aws.ToString(out.AssumedRoleUser.AssumedRoleId); got != wantID || !regexp.MustCompile(`^AROA[A-Z2-7]{17}:entity-42$`).MatchString(got) {
		t.Errorf("AssumedRoleId = %q, want %q", got, wantID)
	}

	c := out.Credentials
	id, err := newClient(e, aws.ToString(c.AccessKeyId), aws.ToString(c.SecretAccessKey), aws.ToString(c.SessionToken)).
		GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if err != nil {
		t.Fatal(err)
	}
	if aws.ToString(id.Arn) != wantArn || aws.ToString(id.UserId) != wantID || aws.ToString(id.Account) != DefaultAccount {
		t.Errorf("GetCallerIdentity = {Arn %q, UserId %q, Account %q}, want {%q, %q, %q}",
			aws.ToString(id.Arn), aws.ToString(id.UserId), aws.ToString(id.Account), wantArn, wantID, DefaultAccount)
	}

	// Without SourceIdentity the response has none and the log records "".
	if out, err := rootClient(e).AssumeRole(ctx, assumeInput("app")); err != nil || out.SourceIdentity != nil {
		t.Errorf("AssumeRole without SourceIdentity: %v, SourceIdentity %v; want none", err, out.SourceIdentity)
	}

	calls := e.Calls()
	want := []struct{ action, session, source string }{
		{"AssumeRole", "entity-42", "alice@example.com"},
		{"GetCallerIdentity", "", ""},
		{"AssumeRole", "test-session", ""},
	}
	if len(calls) != len(want) {
		t.Fatalf("%d calls, want %d: %+v", len(calls), len(want), calls)
	}
	for i, w := range want {
		if c := calls[i]; c.Action != w.action || c.RoleSessionName != w.session || c.SourceIdentity != w.source {
			t.Errorf("call %d = %+v, want %s with session %q, source identity %q", i, c, w.action, w.session, w.source)
		}
	}

	// The control API carries the same fields, under snake_case names.
	wire, raw := wireCalls(t, e)
	if len(wire) != len(want) || wire[0]["role_session_name"] != "entity-42" || wire[0]["source_identity"] != "alice@example.com" ||
		wire[1]["role_session_name"] != "" || wire[1]["source_identity"] != "" {
		t.Errorf("GET /_emulator/calls = %s", raw)
	}
}

// TestSourceIdentityRecordedWhenRejected checks that the call log keeps the
// value a failed call sent, which is what a test needs to see why it failed.
func TestSourceIdentityRecordedWhenRejected(t *testing.T) {
	e := startEmulator(t, Config{})
	in := assumeInput("app")
	in.SourceIdentity = aws.String("aws:alice")
	_, err := rootClient(e).AssumeRole(ctx, in)
	if code := errorCode(err); code != "ValidationError" {
		t.Fatalf("SourceIdentity aws:alice: code %q (%v), want ValidationError", code, err)
	}
	calls := e.Calls()
	if len(calls) != 1 || calls[0].Outcome != "ValidationError" || calls[0].SourceIdentity != "aws:alice" || calls[0].RoleSessionName != "test-session" {
		t.Errorf("calls = %+v, want the rejected AssumeRole with its parameters", calls)
	}
}

// TestSourceIdentityChaining checks AWS's rule for role chaining: a source
// identity set on a session is inherited by roles it assumes, may be
// repeated, and may not be changed.
func TestSourceIdentityChaining(t *testing.T) {
	e := startEmulator(t, Config{})
	withCreds := func(c *types.Credentials) *sts.Client {
		return newClient(e, aws.ToString(c.AccessKeyId), aws.ToString(c.SecretAccessKey), aws.ToString(c.SessionToken))
	}
	assume := func(t *testing.T, client *sts.Client, role, session, source string) (*sts.AssumeRoleOutput, error) {
		t.Helper()
		in := assumeInput(role)
		in.RoleSessionName = aws.String(session)
		if source != "" {
			in.SourceIdentity = aws.String(source)
		}
		return client.AssumeRole(ctx, in)
	}
	first, err := assume(t, rootClient(e), "first", "s1", "alice")
	if err != nil {
		t.Fatal(err)
	}
	plain, err := assume(t, rootClient(e), "plain", "p1", "")
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name       string
		caller     *types.Credentials
		source     string // sent; "" sends none
		wantCode   string
		wantSource string // in the response
	}{
		{"inherited when not sent", first.Credentials, "", "", "alice"},
		{"the same value", first.Credentials, "alice", "", "alice"},
		{"another value", first.Credentials, "bob", "AccessDenied", ""},
		{"set on a chained session without one", plain.Credentials, "bob", "", "bob"},
		{"none to inherit", plain.Credentials, "", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := assume(t, withCreds(tc.caller), "second", "s2", tc.source)
			if code := errorCode(err); code != tc.wantCode {
				t.Fatalf("code %q (%v), want %q", code, err, tc.wantCode)
			}
			if err != nil {
				if status := httpStatus(err); status != http.StatusForbidden {
					t.Errorf("status %d, want 403", status)
				}
				return
			}
			if got := aws.ToString(out.SourceIdentity); got != tc.wantSource {
				t.Errorf("SourceIdentity = %q, want %q", got, tc.wantSource)
			}
			// The new session carries it on: a third hop inherits it too.
			third, err := assume(t, withCreds(out.Credentials), "third", "s3", "")
			if err != nil {
				t.Fatal(err)
			}
			if got := aws.ToString(third.SourceIdentity); got != tc.wantSource {
				t.Errorf("third hop SourceIdentity = %q, want %q", got, tc.wantSource)
			}
			if got, want := aws.ToString(third.AssumedRoleUser.Arn), "arn:aws:sts::123456789012:assumed-role/third/s3"; got != want {
				t.Errorf("third hop Arn = %q, want %q", got, want)
			}
		})
	}

	// The call log records the parameter as sent, not the inherited value.
	for _, c := range e.Calls() {
		if c.RoleSessionName == "s3" && c.SourceIdentity != "" {
			t.Errorf("call %+v: records an inherited source identity as sent", c)
		}
	}
}
