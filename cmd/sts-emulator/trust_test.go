package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/smithy-go"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// hubTrustFile is a -trust-file for a hub trusting the IAM user and a
// spoke trusting the hub.
const hubTrustFile = `[
  {"role_arn": "arn:aws:iam::111111111111:role/hub", "trust": ["arn:aws:iam::123456789012:user/sts-emulator"]},
  {"role_arn": "arn:aws:iam::222222222222:role/app", "trust": ["arn:aws:iam::111111111111:role/hub"],
   "set_source_identity": true, "max_session_duration": 3600}
]`

// writeFile writes content to a file of the test's own directory.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestParseTrustFlags(t *testing.T) {
	good := writeFile(t, "trust.json", hubTrustFile)
	tests := []struct {
		name         string
		args         []string
		wantAccounts []string
		wantRoles    []stsemu.RoleTrust
		wantErr      string // in the error; "" for none
	}{
		{name: "none", args: nil},
		{name: "accounts", args: []string{"-accounts", "111111111111, 222222222222", "-accounts", "333333333333"},
			wantAccounts: []string{"111111111111", "222222222222", "333333333333"}},
		{name: "trust file", args: []string{"-trust-file", good}, wantRoles: []stsemu.RoleTrust{
			{RoleArn: "arn:aws:iam::111111111111:role/hub", Trust: []string{"arn:aws:iam::123456789012:user/sts-emulator"}},
			{RoleArn: "arn:aws:iam::222222222222:role/app", Trust: []string{"arn:aws:iam::111111111111:role/hub"}, SetSourceIdentity: true, MaxSessionDuration: 3600},
		}},
		{name: "bad account", args: []string{"-accounts", "1111"}, wantErr: "12-digit"},
		{name: "missing file", args: []string{"-trust-file", filepath.Join(t.TempDir(), "nope.json")}, wantErr: "no such file"},
		{name: "not JSON", args: []string{"-trust-file", writeFile(t, "bad.json", "{")}, wantErr: "decoding roles"},
		{name: "unknown field", args: []string{"-trust-file", writeFile(t, "typo.json", `[{"role_arn":"arn:aws:iam::111111111111:role/hub","trusted":[]}]`)}, wantErr: "unknown field"},
		{name: "bad principal", args: []string{"-trust-file", writeFile(t, "p.json", `[{"role_arn":"arn:aws:iam::111111111111:role/hub","trust":["hub"]}]`)}, wantErr: `principal "hub"`},
		// The file is checked against the -partition, wherever the flag is.
		{name: "another partition", args: []string{"-trust-file", good, "-partition", "aws-cn"}, wantErr: `partition "aws"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.As(err, new(usageError)) {
					t.Fatalf("err = %v, want a usage error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(o.cfg.Accounts, tc.wantAccounts) || !reflect.DeepEqual(o.cfg.Roles, tc.wantRoles) {
				t.Errorf("Accounts %q, Roles %+v; want %q, %+v", o.cfg.Accounts, o.cfg.Roles, tc.wantAccounts, tc.wantRoles)
			}
		})
	}
}

func TestHelpDocumentsTrust(t *testing.T) {
	var out bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{
		"-accounts", "-trust-file", "/_emulator/roles", `"role_arn"`, `"trust"`, `"set_source_identity"`, `"max_session_duration"`,
		`"accounts"`, "caller_arn", "?role_arn=ARN", ":root", "assumed-role/ROLE/SESSION",
		"1 hour session", "limit for roles assumed by role chaining.", "sts:SetSourceIdentity", "MaxSessionDuration set for this role",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-h output lacks %q", want)
		}
	}
}

// TestRunTrustFile: run with -trust-file and -accounts serves the trust
// policies the file configures, the accounts played, and the call log's
// attribution, as make dev would start it.
func TestRunTrustFile(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := startRun(ctx, "-listen", "127.0.0.1:0", "-trust-file", writeFile(t, "trust.json", hubTrustFile), "-accounts", "444444444444")
	url := listeningURL(t, r.line(t))
	client := func(akid, secret, token string) *sts.Client {
		return sts.New(sts.Options{Region: "us-east-1", BaseEndpoint: aws.String(url), Retryer: aws.NopRetryer{},
			Credentials: credentials.NewStaticCredentialsProvider(akid, secret, token)})
	}
	assume := func(c *sts.Client, roleArn string, seconds int32) (*sts.AssumeRoleOutput, error) {
		return c.AssumeRole(ctx, &sts.AssumeRoleInput{RoleArn: aws.String(roleArn), RoleSessionName: aws.String("dev"), DurationSeconds: aws.Int32(seconds)})
	}
	code := func(err error) string {
		var ae smithy.APIError
		if errors.As(err, &ae) {
			return ae.ErrorCode()
		}
		return ""
	}
	root := client(stsemu.DefaultAccessKey, stsemu.DefaultSecretKey, "")
	hub, err := assume(root, "arn:aws:iam::111111111111:role/hub", 43200)
	if err != nil {
		t.Fatal(err)
	}
	hc := hub.Credentials
	chained := client(aws.ToString(hc.AccessKeyId), aws.ToString(hc.SecretAccessKey), aws.ToString(hc.SessionToken))
	if _, err := assume(root, "arn:aws:iam::222222222222:role/app", 900); code(err) != "AccessDenied" {
		t.Errorf("the spoke with the user's key: %v, want AccessDenied", err)
	}
	if _, err := assume(chained, "arn:aws:iam::222222222222:role/app", 7200); code(err) != "ValidationError" {
		t.Errorf("the spoke chained for 2 h: %v, want ValidationError", err)
	}
	if _, err := assume(chained, "arn:aws:iam::222222222222:role/app", 3600); err != nil {
		t.Errorf("the spoke chained for 1 h: %v", err)
	}
	if _, err := assume(chained, "arn:aws:iam::444444444444:role/any", 900); err != nil {
		t.Errorf("an unconfigured role of an -accounts account: %v", err)
	}

	resp, err := http.Get(url + "/_emulator/calls")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var calls []stsemu.Call
	if err := json.NewDecoder(resp.Body).Decode(&calls); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 5 || calls[3].AccessKeyID != aws.ToString(hc.AccessKeyId) || calls[3].CallerArn != "arn:aws:sts::111111111111:assumed-role/hub/dev" {
		t.Errorf("calls = %+v, want the chained call signed by the hub's key as its session", calls)
	}
	cancel()
	if err := <-r.done; err != nil {
		t.Errorf("run after cancel: %v", err)
	}
	if logged := r.stderr.String(); !strings.Contains(logged, "caller_arn=arn:aws:sts::111111111111:assumed-role/hub/dev") {
		t.Errorf("the log names no call by the hub's session:\n%s", logged)
	}
}
