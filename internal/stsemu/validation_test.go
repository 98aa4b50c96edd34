package stsemu

import (
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/aws-sdk-go-v2/service/sts/types"
)

func TestAssumeRoleValidation(t *testing.T) {
	valid := func() *sts.AssumeRoleInput { return assumeInput("app") }
	tests := []struct {
		name     string
		mutate   func(in *sts.AssumeRoleInput)
		wantCode string
		wantMsg  string
	}{
		{"valid", func(in *sts.AssumeRoleInput) {}, "", ""},
		{"duration 900", func(in *sts.AssumeRoleInput) { in.DurationSeconds = aws.Int32(900) }, "", ""},
		{"duration 43200", func(in *sts.AssumeRoleInput) { in.DurationSeconds = aws.Int32(43200) }, "", ""},
		{"duration 899", func(in *sts.AssumeRoleInput) { in.DurationSeconds = aws.Int32(899) }, "ValidationError", "greater than or equal to 900"},
		{"duration 43201", func(in *sts.AssumeRoleInput) { in.DurationSeconds = aws.Int32(43201) }, "ValidationError", "less than or equal to 43200"},
		{"session name too short", func(in *sts.AssumeRoleInput) { in.RoleSessionName = aws.String("a") }, "ValidationError", "roleSessionName"},
		{"session name 64", func(in *sts.AssumeRoleInput) { in.RoleSessionName = aws.String(strings.Repeat("s", 64)) }, "", ""},
		{"session name 65", func(in *sts.AssumeRoleInput) { in.RoleSessionName = aws.String(strings.Repeat("s", 65)) }, "ValidationError", "less than or equal to 64"},
		{"session name all allowed characters", func(in *sts.AssumeRoleInput) { in.RoleSessionName = aws.String("aZ09_+=,.@-") }, "", ""},
		{"session name with space", func(in *sts.AssumeRoleInput) { in.RoleSessionName = aws.String("my session") }, "ValidationError", "regular expression"},
		{"session name with slash", func(in *sts.AssumeRoleInput) { in.RoleSessionName = aws.String("a/b") }, "ValidationError", "regular expression"},
		{"source identity 2", func(in *sts.AssumeRoleInput) { in.SourceIdentity = aws.String("ab") }, "", ""},
		{"source identity all allowed characters", func(in *sts.AssumeRoleInput) { in.SourceIdentity = aws.String("aZ09_+=,.@-") }, "", ""},
		{"source identity 64", func(in *sts.AssumeRoleInput) { in.SourceIdentity = aws.String(strings.Repeat("i", 64)) }, "", ""},
		{"source identity too short", func(in *sts.AssumeRoleInput) { in.SourceIdentity = aws.String("a") }, "ValidationError", "at 'sourceIdentity' failed to satisfy constraint: Member must have length greater than or equal to 2"},
		{"source identity 65", func(in *sts.AssumeRoleInput) { in.SourceIdentity = aws.String(strings.Repeat("i", 65)) }, "ValidationError", "less than or equal to 64"},
		{"source identity with space", func(in *sts.AssumeRoleInput) { in.SourceIdentity = aws.String("alice smith") }, "ValidationError", "regular expression"},
		// AWS reserves the "aws:" prefix, in any case.
		{"source identity aws: prefix", func(in *sts.AssumeRoleInput) { in.SourceIdentity = aws.String("aws:alice") }, "ValidationError", "at 'sourceIdentity' failed to satisfy constraint: Member must satisfy regular expression pattern"},
		{"source identity AWS: prefix", func(in *sts.AssumeRoleInput) { in.SourceIdentity = aws.String("AWS:alice") }, "ValidationError", "sourceIdentity"},
		{"role ARN not an ARN", func(in *sts.AssumeRoleInput) { in.RoleArn = aws.String("this-is-not-an-arn-at-all") }, "ValidationError", "invalid"},
		{"role ARN too short", func(in *sts.AssumeRoleInput) { in.RoleArn = aws.String("arn:aws:iam::1:r") }, "ValidationError", "greater than or equal to 20"},
		{"role ARN 11-digit account", func(in *sts.AssumeRoleInput) { in.RoleArn = aws.String("arn:aws:iam::12345678901:role/app") }, "ValidationError", "invalid"},
		{"role ARN user not role", func(in *sts.AssumeRoleInput) { in.RoleArn = aws.String("arn:aws:iam::123456789012:user/app") }, "ValidationError", "invalid"},
		{"role ARN with path", func(in *sts.AssumeRoleInput) { in.RoleArn = aws.String("arn:aws:iam::123456789012:role/a/b/c/app") }, "", ""},
		{"role ARN sts service", func(in *sts.AssumeRoleInput) { in.RoleArn = aws.String("arn:aws:sts::123456789012:role/app") }, "ValidationError", "invalid"},
		{"policy not JSON", func(in *sts.AssumeRoleInput) { in.Policy = aws.String("{not json") }, "MalformedPolicyDocument", "JSON"},
		{"policy JSON array", func(in *sts.AssumeRoleInput) { in.Policy = aws.String("[1,2]") }, "MalformedPolicyDocument", "JSON"},
		{"policy 2048", func(in *sts.AssumeRoleInput) {
			in.Policy = aws.String(`{"Version":"2012-10-17","Sid":"` + strings.Repeat("x", 2048-33) + `"}`)
		}, "", ""},
		{"policy 2049", func(in *sts.AssumeRoleInput) {
			in.Policy = aws.String(`{"Version":"2012-10-17","Sid":"` + strings.Repeat("x", 2049-33) + `"}`)
		}, "ValidationError", "less than or equal to 2048"},
		{"external id too short", func(in *sts.AssumeRoleInput) { in.ExternalId = aws.String("x") }, "ValidationError", "externalId"},
		{"token code not digits", func(in *sts.AssumeRoleInput) {
			in.SerialNumber = aws.String("arn:aws:iam::123456789012:mfa/u")
			in.TokenCode = aws.String("12345a")
		}, "ValidationError", "tokenCode"},
		{"eleven policy ARNs", func(in *sts.AssumeRoleInput) {
			for range 11 {
				in.PolicyArns = append(in.PolicyArns, types.PolicyDescriptorType{Arn: aws.String("arn:aws:iam::aws:policy/ReadOnlyAccess")})
			}
		}, "ValidationError", "policyArns"},
		{"tag key empty", func(in *sts.AssumeRoleInput) {
			in.Tags = []types.Tag{{Key: aws.String(""), Value: aws.String("v")}}
		}, "ValidationError", "key"},
		{"duplicate tag keys", func(in *sts.AssumeRoleInput) {
			in.Tags = []types.Tag{{Key: aws.String("Team"), Value: aws.String("a")}, {Key: aws.String("team"), Value: aws.String("b")}}
		}, "InvalidParameterValue", "Duplicate tag keys"},
	}
	e := startEmulator(t, Config{})
	client := rootClient(e)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := valid()
			tc.mutate(in)
			_, err := client.AssumeRole(ctx, in)
			if code := errorCode(err); code != tc.wantCode {
				t.Fatalf("code %q (%v), want %q", code, err, tc.wantCode)
			}
			if err == nil {
				return
			}
			if status := httpStatus(err); status != http.StatusBadRequest {
				t.Errorf("status %d, want 400", status)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("message %q lacks %q", err, tc.wantMsg)
			}
		})
	}
}

func TestSessionAndFederationValidation(t *testing.T) {
	e := startEmulator(t, Config{})
	client := rootClient(e)
	tests := []struct {
		name     string
		call     func() error
		wantCode string
	}{
		{"GetSessionToken 129600s", func() error {
			_, err := client.GetSessionToken(ctx, &sts.GetSessionTokenInput{DurationSeconds: aws.Int32(129600)})
			return err
		}, ""},
		{"GetSessionToken 129601s", func() error {
			_, err := client.GetSessionToken(ctx, &sts.GetSessionTokenInput{DurationSeconds: aws.Int32(129601)})
			return err
		}, "ValidationError"},
		{"GetSessionToken 899s", func() error {
			_, err := client.GetSessionToken(ctx, &sts.GetSessionTokenInput{DurationSeconds: aws.Int32(899)})
			return err
		}, "ValidationError"},
		{"GetSessionToken token code without serial", func() error {
			_, err := client.GetSessionToken(ctx, &sts.GetSessionTokenInput{TokenCode: aws.String("123456")})
			return err
		}, "AccessDenied"},
		{"GetFederationToken name too long", func() error {
			_, err := client.GetFederationToken(ctx, &sts.GetFederationTokenInput{Name: aws.String(strings.Repeat("n", 33))})
			return err
		}, "ValidationError"},
		{"GetFederationToken bad policy", func() error {
			_, err := client.GetFederationToken(ctx, &sts.GetFederationTokenInput{Name: aws.String("bob"), Policy: aws.String("nope")})
			return err
		}, "MalformedPolicyDocument"},
		{"GetFederationToken 899s", func() error {
			_, err := client.GetFederationToken(ctx, &sts.GetFederationTokenInput{Name: aws.String("bob"), DurationSeconds: aws.Int32(899)})
			return err
		}, "ValidationError"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if code := errorCode(tc.call()); code != tc.wantCode {
				t.Errorf("code %q, want %q", code, tc.wantCode)
			}
		})
	}
}

func TestDenyAndCrossAccount(t *testing.T) {
	e := startEmulator(t, Config{Deny: []string{"forbidden-*", "arn:aws:iam::123456789012:role/locked/*"}})
	client := rootClient(e)
	tests := []struct {
		name       string
		roleArn    string
		wantDenied bool
	}{
		{"own account", "arn:aws:iam::123456789012:role/app", false},
		{"other account", "arn:aws:iam::210987654321:role/app", true},
		{"deny by role name", "arn:aws:iam::123456789012:role/forbidden-app", true},
		{"deny by role name under a path", "arn:aws:iam::123456789012:role/team/forbidden-x", true},
		{"deny by ARN pattern", "arn:aws:iam::123456789012:role/locked/app", true},
		{"pattern does not cross path segments", "arn:aws:iam::123456789012:role/locked/deeper/app", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.AssumeRole(ctx, &sts.AssumeRoleInput{RoleArn: aws.String(tc.roleArn), RoleSessionName: aws.String("s1")})
			if !tc.wantDenied {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if code, status := errorCode(err), httpStatus(err); code != "AccessDenied" || status != http.StatusForbidden {
				t.Fatalf("got %q/%d (%v), want AccessDenied/403", code, status, err)
			}
			want := "User: arn:aws:iam::123456789012:user/sts-emulator is not authorized to perform: sts:AssumeRole on resource: " + tc.roleArn
			if !strings.Contains(err.Error(), want) {
				t.Errorf("message %q, want AWS's wording %q", err, want)
			}
		})
	}

	t.Run("SetDeny at runtime", func(t *testing.T) {
		e.SetDeny([]string{"app"})
		_, err := client.AssumeRole(ctx, assumeInput("app"))
		if code := errorCode(err); code != "AccessDenied" {
			t.Errorf("code %q, want AccessDenied", code)
		}
		e.SetDeny(nil)
		if _, err := client.AssumeRole(ctx, assumeInput("app")); err != nil {
			t.Error(err)
		}
	})
}
