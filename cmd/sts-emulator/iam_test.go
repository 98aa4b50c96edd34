package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/smithy-go"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

func TestParseIAMFlags(t *testing.T) {
	tests := []struct {
		name            string
		args            []string
		wantUser        string
		wantPropagation time.Duration
		wantActions     []string
		wantErr         bool
	}{
		{name: "defaults leave Config to stsemu", args: nil},
		{name: "user and propagation", args: []string{"-iam-user", "vault-root", "-iam-propagation", "8s"},
			wantUser: "vault-root", wantPropagation: 8 * time.Second},
		{name: "fault on IAM actions", args: []string{"-faults", "reset_after:1,action=CreateAccessKey,action=iam:DeleteAccessKey"},
			wantActions: []string{"CreateAccessKey", "iam:DeleteAccessKey"}},
		{name: "negative propagation", args: []string{"-iam-propagation", "-1s"}, wantErr: true},
		{name: "bad user name", args: []string{"-iam-user", "has space"}, wantErr: true},
		{name: "user name too long", args: []string{"-iam-user", strings.Repeat("u", 65)}, wantErr: true},
		{name: "unknown fault action", args: []string{"-faults", "Throttling:1,action=ListUsers"}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, io.Discard)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if err != nil {
				if !errors.As(err, new(usageError)) {
					t.Errorf("err %v is not a usageError (exit status 2)", err)
				}
				return
			}
			if o.cfg.IAMUser != tc.wantUser || o.cfg.IAMPropagation != tc.wantPropagation {
				t.Errorf("IAMUser %q, IAMPropagation %s; want %q, %s", o.cfg.IAMUser, o.cfg.IAMPropagation, tc.wantUser, tc.wantPropagation)
			}
			if strings.Join(o.faults.Actions, ",") != strings.Join(tc.wantActions, ",") {
				t.Errorf("fault actions %v, want %v", o.faults.Actions, tc.wantActions)
			}
		})
	}
}

func TestHelpDocumentsIAM(t *testing.T) {
	var out bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{
		"-iam-user", "-iam-propagation", "sts-emulator", "GetUser", "ListAccessKeys", "CreateAccessKey", "DeleteAccessKey",
		"UpdateAccessKey", "us-east-1", "LimitExceeded", "NoSuchEntity", "InvalidClientTokenId", "action=SEL", "reset_after",
		"/_emulator/iam/users", "iam_propagation", `"actions"`, "aws iam create-access-key",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-h output lacks %q", want)
		}
	}
}

// TestRunIAM rotates the root key through the binary's run with
// -iam-user and -iam-propagation, using the SDK's IAM and STS clients.
func TestRunIAM(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := startRun(ctx, "-listen", "127.0.0.1:0", "-iam-user", "vault-root", "-iam-propagation", "1s")
	url := listeningURL(t, r.line(t))
	creds := func(id, secret string) aws.CredentialsProvider {
		return credentials.NewStaticCredentialsProvider(id, secret, "")
	}
	iamClient := func(id, secret string) *iam.Client {
		return iam.New(iam.Options{Region: "us-east-1", BaseEndpoint: aws.String(url), Credentials: creds(id, secret), Retryer: aws.NopRetryer{}})
	}
	stsClient := func(id, secret string) *sts.Client {
		return sts.New(sts.Options{Region: "us-east-1", BaseEndpoint: aws.String(url), Credentials: creds(id, secret), Retryer: aws.NopRetryer{}})
	}

	u, err := iamClient(stsemu.DefaultAccessKey, stsemu.DefaultSecretKey).GetUser(ctx, &iam.GetUserInput{})
	if err != nil || aws.ToString(u.User.Arn) != "arn:aws:iam::123456789012:user/vault-root" {
		t.Fatalf("GetUser: %v, %v", u, err)
	}
	out, err := iamClient(stsemu.DefaultAccessKey, stsemu.DefaultSecretKey).CreateAccessKey(ctx, &iam.CreateAccessKeyInput{})
	if err != nil {
		t.Fatal(err)
	}
	id, secret := aws.ToString(out.AccessKey.AccessKeyId), aws.ToString(out.AccessKey.SecretAccessKey)
	// Within -iam-propagation the new key is refused; then it is the user.
	_, err = stsClient(id, secret).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != "InvalidClientTokenId" {
		t.Errorf("right after CreateAccessKey: %v, want InvalidClientTokenId", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		id, err := stsClient(id, secret).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
		if err == nil {
			if aws.ToString(id.Arn) != "arn:aws:iam::123456789012:user/vault-root" {
				t.Errorf("Arn %q", aws.ToString(id.Arn))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("new key still refused after 10s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := iamClient(id, secret).DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(stsemu.DefaultAccessKey)}); err != nil {
		t.Fatal(err)
	}

	cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("run after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not stop after cancel")
	}
	logged := r.stderr.String()
	if !strings.Contains(logged, "action=CreateAccessKey outcome=ok") || !strings.Contains(logged, "action=DeleteAccessKey outcome=ok") {
		t.Errorf("stderr log:\n%s\nwant a line per IAM call", logged)
	}
	if strings.Contains(logged, secret) || strings.Contains(logged, stsemu.DefaultSecretKey) {
		t.Error("stderr log contains a secret key")
	}
}
