package stsemu

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/testtool"
)

// TestAWSCLIRoleChaining checks the role-chaining cap and the trust
// policies with the awscli: a hub assumed with the IAM user's key, then a
// spoke assumed with the hub's session for more than an hour (refused with
// AWS's message), for one hour (served), and a role that does not trust the
// hub (AccessDenied naming the hub's session).
func TestAWSCLIRoleChaining(t *testing.T) {
	bin := testtool.Require(t, "aws", "--version")
	e := startEmulator(t, hubAndSpokes())
	type assumed struct {
		Credentials struct {
			AccessKeyID     string `json:"AccessKeyId"`
			SecretAccessKey string
			SessionToken    string
		}
		AssumedRoleUser struct{ Arn string }
	}
	assume := func(t *testing.T, akid, secret, token, roleArn string, extra ...string) (assumed, string, error) {
		t.Helper()
		args := append([]string{"sts", "assume-role", "--role-arn", roleArn, "--role-session-name", "cli-chain"}, extra...)
		out, stderr, err := awsCLI(t, bin, e, akid, secret, token, args...)
		var a assumed
		if err == nil {
			if jerr := json.Unmarshal([]byte(out), &a); jerr != nil {
				t.Fatalf("assume-role output %q: %v", out, jerr)
			}
		}
		return a, stderr, err
	}

	hub, stderr, err := assume(t, DefaultAccessKey, DefaultSecretKey, "", roleARN(hubAccount, "hubs/hub"), "--duration-seconds", "43200")
	if err != nil {
		t.Fatalf("assume the hub for 12 h with the user's key: %v\n%s", err, stderr)
	}
	h := hub.Credentials

	t.Run("chained over 1 h", func(t *testing.T) {
		_, stderr, err := assume(t, h.AccessKeyID, h.SecretAccessKey, h.SessionToken, roleARN(spokeAccount, "app"), "--duration-seconds", "7200")
		want := "An error occurred (ValidationError) when calling the AssumeRole operation: The requested DurationSeconds exceeds the 1 hour session limit for roles assumed by role chaining."
		if err == nil || !strings.Contains(stderr, want) {
			t.Errorf("err %v, stderr %q; want %q", err, stderr, want)
		}
	})
	t.Run("chained 1 h", func(t *testing.T) {
		spoke, stderr, err := assume(t, h.AccessKeyID, h.SecretAccessKey, h.SessionToken, roleARN(spokeAccount, "app"), "--duration-seconds", "3600")
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		if want := "arn:aws:sts::" + spokeAccount + ":assumed-role/app/cli-chain"; spoke.AssumedRoleUser.Arn != want {
			t.Errorf("Arn = %q, want %q", spoke.AssumedRoleUser.Arn, want)
		}
	})
	t.Run("not trusted", func(t *testing.T) {
		_, stderr, err := assume(t, h.AccessKeyID, h.SecretAccessKey, h.SessionToken, roleARN(spokeAccount, "locked"))
		want := "An error occurred (AccessDenied) when calling the AssumeRole operation: User: arn:aws:sts::" + hubAccount +
			":assumed-role/hub/cli-chain is not authorized to perform: sts:AssumeRole on resource: " + roleARN(spokeAccount, "locked")
		if err == nil || !strings.Contains(stderr, want) {
			t.Errorf("err %v, stderr %q; want %q", err, stderr, want)
		}
	})

	// The log attributes each spoke call to the hub's key and session.
	for _, c := range e.Calls()[1:] {
		if c.AccessKeyID != h.AccessKeyID || c.CallerArn != hub.AssumedRoleUser.Arn {
			t.Errorf("call %+v: want signed by the hub's %s as %s", c, h.AccessKeyID, hub.AssumedRoleUser.Arn)
		}
	}
}
