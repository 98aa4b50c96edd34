package stsemu

// Tests that drive the emulator with independent clients nobody on this
// project wrote: the awscli (Debian's awscli package, 1.x) and Python's
// botocore. They check the XML shapes and the SigV4 verification against a
// second implementation of each.

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/testtool"
)

// awsCLI runs the aws command with the given credentials against e.
func awsCLI(t *testing.T, bin string, e *Emulator, akid, secret, token string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	env := testtool.Env([]string{"AWS_"},
		"AWS_ACCESS_KEY_ID="+akid,
		"AWS_SECRET_ACCESS_KEY="+secret,
		"AWS_DEFAULT_REGION=us-east-1",
		"AWS_CONFIG_FILE=/dev/null",
		"AWS_SHARED_CREDENTIALS_FILE=/dev/null",
		"AWS_EC2_METADATA_DISABLED=true",
		"AWS_MAX_ATTEMPTS=1",
		"AWS_PAGER=",
	)
	if token != "" {
		env = append(env, "AWS_SESSION_TOKEN="+token)
	}
	cmd := exec.Command(bin, append(args, "--endpoint-url", e.URL(), "--output", "json")...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

func TestAWSCLI(t *testing.T) {
	bin := testtool.Require(t, "aws", "--version")
	e := startEmulator(t, Config{})

	out, stderr, err := awsCLI(t, bin, e, DefaultAccessKey, DefaultSecretKey, "",
		"sts", "assume-role", "--role-arn", "arn:aws:iam::123456789012:role/cli/app", "--role-session-name", "cli-session",
		"--duration-seconds", "900")
	if err != nil {
		t.Fatalf("aws sts assume-role: %v\n%s", err, stderr)
	}
	var ar struct {
		Credentials struct {
			AccessKeyID     string `json:"AccessKeyId"`
			SecretAccessKey string
			SessionToken    string
			Expiration      string
		}
		AssumedRoleUser struct {
			Arn           string
			AssumedRoleID string `json:"AssumedRoleId"`
		}
	}
	if err := json.Unmarshal([]byte(out), &ar); err != nil {
		t.Fatalf("assume-role output: %v", err)
	}
	c := ar.Credentials
	if !strings.HasPrefix(c.AccessKeyID, "ASIA") || len(c.AccessKeyID) != 20 || len(c.SecretAccessKey) != 40 || len(c.SessionToken) < 400 {
		t.Errorf("credentials not AWS-shaped: key %q, secret %d chars, token %d chars", c.AccessKeyID, len(c.SecretAccessKey), len(c.SessionToken))
	}
	if exp, err := time.Parse(time.RFC3339, c.Expiration); err != nil || exp.Sub(time.Now()) > 15*time.Minute || exp.Before(time.Now()) {
		t.Errorf("Expiration %q (%v), want about 15 minutes ahead", c.Expiration, err)
	}
	if want := "arn:aws:sts::123456789012:assumed-role/app/cli-session"; ar.AssumedRoleUser.Arn != want {
		t.Errorf("AssumedRoleUser.Arn = %q, want %q", ar.AssumedRoleUser.Arn, want)
	}

	t.Run("get-caller-identity with the issued credentials", func(t *testing.T) {
		out, stderr, err := awsCLI(t, bin, e, c.AccessKeyID, c.SecretAccessKey, c.SessionToken, "sts", "get-caller-identity")
		if err != nil {
			t.Fatalf("aws sts get-caller-identity: %v\n%s", err, stderr)
		}
		var id struct{ Arn, Account, UserID string }
		if err := json.Unmarshal([]byte(out), &id); err != nil {
			t.Fatal(err)
		}
		if id.Arn != ar.AssumedRoleUser.Arn || id.Account != DefaultAccount {
			t.Errorf("identity %+v, want Arn %q in account %s", id, ar.AssumedRoleUser.Arn, DefaultAccount)
		}
	})

	t.Run("wrong secret", func(t *testing.T) {
		_, stderr, err := awsCLI(t, bin, e, DefaultAccessKey, "wrong"+DefaultSecretKey[5:], "", "sts", "get-caller-identity")
		if err == nil || !strings.Contains(stderr, "SignatureDoesNotMatch") {
			t.Errorf("err %v, stderr %q; want a failure with SignatureDoesNotMatch", err, stderr)
		}
	})

	t.Run("throttled", func(t *testing.T) {
		e.SetFaults(FaultPlan{Sequence: []FaultStep{{Fault: FaultThrottling, Count: 1}}})
		defer e.ClearFaults()
		_, stderr, err := awsCLI(t, bin, e, DefaultAccessKey, DefaultSecretKey, "", "sts", "get-caller-identity")
		if err == nil || !strings.Contains(stderr, "Throttling") || !strings.Contains(stderr, "Rate exceeded") {
			t.Errorf("err %v, stderr %q; want Throttling: Rate exceeded", err, stderr)
		}
	})

	if s := e.Stats(); s.Count("AssumeRole", "ok") != 1 || s.Count("GetCallerIdentity", "ok") != 1 ||
		s.Count("GetCallerIdentity", "SignatureDoesNotMatch") != 1 || s.Count("GetCallerIdentity", "Throttling") != 1 {
		t.Errorf("emulator saw %+v; want exactly one request per aws invocation (no hidden retries)", s.ByAction)
	}
}

// TestAWSCLISourceIdentity checks that the awscli sends --source-identity
// as the emulator reads it, and that the credential it gets back names the
// session in GetCallerIdentity's assumed-role ARN and UserId.
func TestAWSCLISourceIdentity(t *testing.T) {
	bin := testtool.Require(t, "aws", "--version")
	e := startEmulator(t, Config{})

	out, stderr, err := awsCLI(t, bin, e, DefaultAccessKey, DefaultSecretKey, "",
		"sts", "assume-role", "--role-arn", "arn:aws:iam::123456789012:role/cli/app", "--role-session-name", "entity-7",
		"--source-identity", "alice@example.com")
	if err != nil {
		t.Fatalf("aws sts assume-role --source-identity: %v\n%s", err, stderr)
	}
	var ar struct {
		Credentials struct {
			AccessKeyID     string `json:"AccessKeyId"`
			SecretAccessKey string
			SessionToken    string
		}
		AssumedRoleUser struct {
			AssumedRoleID string `json:"AssumedRoleId"`
		}
		SourceIdentity string
	}
	if err := json.Unmarshal([]byte(out), &ar); err != nil {
		t.Fatalf("assume-role output: %v", err)
	}
	if ar.SourceIdentity != "alice@example.com" {
		t.Errorf("assume-role SourceIdentity = %q, want alice@example.com", ar.SourceIdentity)
	}

	c := ar.Credentials
	out, stderr, err = awsCLI(t, bin, e, c.AccessKeyID, c.SecretAccessKey, c.SessionToken, "sts", "get-caller-identity")
	if err != nil {
		t.Fatalf("aws sts get-caller-identity: %v\n%s", err, stderr)
	}
	var id struct {
		Arn    string
		UserID string `json:"UserId"`
	}
	if err := json.Unmarshal([]byte(out), &id); err != nil {
		t.Fatal(err)
	}
	if want := "arn:aws:sts::123456789012:assumed-role/app/entity-7"; id.Arn != want {
		t.Errorf("get-caller-identity Arn = %q, want %q", id.Arn, want)
	}
	if !strings.HasPrefix(id.UserID, "AROA") || !strings.HasSuffix(id.UserID, ":entity-7") || id.UserID != ar.AssumedRoleUser.AssumedRoleID {
		t.Errorf("get-caller-identity UserId = %q, want the AssumedRoleId %q (AROA...:entity-7)", id.UserID, ar.AssumedRoleUser.AssumedRoleID)
	}

	calls := e.Calls()
	if len(calls) != 2 || calls[0].RoleSessionName != "entity-7" || calls[0].SourceIdentity != "alice@example.com" {
		t.Errorf("calls = %+v, want the AssumeRole with session entity-7 and source identity alice@example.com first", calls)
	}
}

func TestBotocore(t *testing.T) {
	py := testtool.Require(t, "python3", "-c", "import botocore")
	e := startEmulator(t, Config{})
	cmd := exec.Command(py, "testdata/botocore_client.py", e.URL(), DefaultAccessKey, DefaultSecretKey)
	cmd.Env = testtool.Env([]string{"AWS_"}, "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "AWS_EC2_METADATA_DISABLED=true")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("botocore_client.py: %v\n%s", err, stderr.String())
	}
	var got struct {
		AssumeRole struct {
			AccessKeyID      string `json:"access_key_id"`
			SecretLen        int    `json:"secret_len"`
			TokenLen         int    `json:"token_len"`
			Expiration       string `json:"expiration"`
			Arn              string `json:"arn"`
			AssumedRoleID    string `json:"assumed_role_id"`
			PackedPolicySize *int   `json:"packed_policy_size"`
			RequestID        string `json:"request_id"`
		} `json:"assume_role"`
		CallerAsRole          string `json:"caller_as_role"`
		SessionTokenKeyPrefix string `json:"session_token_key_prefix"`
		FederatedArn          string `json:"federated_arn"`
		WrongSecret           *struct {
			Code   string `json:"code"`
			Status int    `json:"status"`
		} `json:"wrong_secret"`
		InvalidSessionName *struct {
			Code   string `json:"code"`
			Status int    `json:"status"`
		} `json:"invalid_session_name"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("script output %q: %v", out, err)
	}
	ar := got.AssumeRole
	checks := []struct {
		name string
		ok   bool
	}{
		{"ASIA key id", strings.HasPrefix(ar.AccessKeyID, "ASIA") && len(ar.AccessKeyID) == 20},
		{"40-char secret", ar.SecretLen == 40},
		{"long session token", ar.TokenLen >= 400},
		{"expiration parsed", ar.Expiration != ""},
		{"assumed-role ARN", ar.Arn == "arn:aws:sts::123456789012:assumed-role/app/boto"},
		{"assumed role id", strings.HasPrefix(ar.AssumedRoleID, "AROA") && strings.HasSuffix(ar.AssumedRoleID, ":boto")},
		{"packed policy size", ar.PackedPolicySize != nil && *ar.PackedPolicySize >= 1},
		{"request id", len(ar.RequestID) == 36},
		{"GetCallerIdentity with issued credentials", got.CallerAsRole == ar.Arn},
		{"GetSessionToken key", got.SessionTokenKeyPrefix == "ASIA"},
		{"federated user ARN", got.FederatedArn == "arn:aws:sts::123456789012:federated-user/boto-fed"},
		{"wrong secret", got.WrongSecret != nil && got.WrongSecret.Code == "SignatureDoesNotMatch" && got.WrongSecret.Status == 403},
		{"invalid session name", got.InvalidSessionName != nil && got.InvalidSessionName.Code == "ValidationError" && got.InvalidSessionName.Status == 400},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: botocore saw %s", c.name, out)
		}
	}
	if n := e.Stats().Total; n != 6 {
		t.Errorf("emulator counted %d calls, want the script's 6", n)
	}
}
