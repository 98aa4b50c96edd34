package stsemu

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/aws-sdk-go-v2/service/sts/types"
)

// checkCreds asserts AWS-shaped temporary credentials expiring at want.
func checkCreds(t *testing.T, c *types.Credentials, want time.Time) {
	t.Helper()
	if c == nil {
		t.Fatal("no Credentials in response")
	}
	id := aws.ToString(c.AccessKeyId)
	if !strings.HasPrefix(id, "ASIA") || len(id) != 20 {
		t.Errorf("AccessKeyId = %q, want ASIA + 16 characters", id)
	}
	if n := len(aws.ToString(c.SecretAccessKey)); n != 40 {
		t.Errorf("SecretAccessKey has %d characters, want 40", n)
	}
	if n := len(aws.ToString(c.SessionToken)); n < 400 {
		t.Errorf("SessionToken has %d characters, want a long AWS-like token", n)
	}
	if c.Expiration == nil || !c.Expiration.Equal(want) {
		t.Errorf("Expiration = %v, want %v", c.Expiration, want)
	}
}

func TestActionsWithSDK(t *testing.T) {
	clock := newFakeClock()
	e := startEmulator(t, Config{Now: clock.Now})
	client := rootClient(e)
	now := clock.Now().Truncate(time.Millisecond)

	t.Run("AssumeRole", func(t *testing.T) {
		in := assumeInput("app/reader")
		in.DurationSeconds = aws.Int32(900)
		in.ExternalId = aws.String("ext-123")
		in.Policy = aws.String(`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"*"}]}`)
		in.PolicyArns = []types.PolicyDescriptorType{{Arn: aws.String("arn:aws:iam::aws:policy/ReadOnlyAccess")}}
		in.Tags = []types.Tag{{Key: aws.String("team"), Value: aws.String("core")}}
		in.TransitiveTagKeys = []string{"team"}
		out, err := client.AssumeRole(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		checkCreds(t, out.Credentials, now.Add(900*time.Second))
		u := out.AssumedRoleUser
		if got, want := aws.ToString(u.Arn), "arn:aws:sts::123456789012:assumed-role/reader/test-session"; got != want {
			t.Errorf("AssumedRoleUser.Arn = %q, want %q", got, want)
		}
		if id := aws.ToString(u.AssumedRoleId); !strings.HasPrefix(id, "AROA") || !strings.HasSuffix(id, ":test-session") || len(id) != 21+len(":test-session") {
			t.Errorf("AssumedRoleId = %q, want AROA<17>:test-session", id)
		}
		if out.PackedPolicySize == nil || *out.PackedPolicySize < 1 {
			t.Errorf("PackedPolicySize = %v, want a percentage for a request with a session policy", out.PackedPolicySize)
		}
	})

	t.Run("AssumeRole default duration and no packed size", func(t *testing.T) {
		out, err := client.AssumeRole(ctx, assumeInput("plain"))
		if err != nil {
			t.Fatal(err)
		}
		checkCreds(t, out.Credentials, now.Add(time.Hour))
		if out.PackedPolicySize != nil {
			t.Errorf("PackedPolicySize = %d, want absent without session policies or tags", *out.PackedPolicySize)
		}
	})

	t.Run("GetSessionToken", func(t *testing.T) {
		out, err := client.GetSessionToken(ctx, &sts.GetSessionTokenInput{
			DurationSeconds: aws.Int32(3600),
			SerialNumber:    aws.String("arn:aws:iam::123456789012:mfa/user"),
			TokenCode:       aws.String("123456"),
		})
		if err != nil {
			t.Fatal(err)
		}
		checkCreds(t, out.Credentials, now.Add(time.Hour))
	})

	t.Run("GetSessionToken default 12h", func(t *testing.T) {
		out, err := client.GetSessionToken(ctx, &sts.GetSessionTokenInput{})
		if err != nil {
			t.Fatal(err)
		}
		checkCreds(t, out.Credentials, now.Add(12*time.Hour))
	})

	t.Run("GetFederationToken", func(t *testing.T) {
		out, err := client.GetFederationToken(ctx, &sts.GetFederationTokenInput{
			Name:            aws.String("Bob"),
			DurationSeconds: aws.Int32(1800),
			Policy:          aws.String(`{"Version":"2012-10-17","Statement":[]}`),
		})
		if err != nil {
			t.Fatal(err)
		}
		checkCreds(t, out.Credentials, now.Add(30*time.Minute))
		if got, want := aws.ToString(out.FederatedUser.Arn), "arn:aws:sts::123456789012:federated-user/Bob"; got != want {
			t.Errorf("FederatedUser.Arn = %q, want %q", got, want)
		}
		if got, want := aws.ToString(out.FederatedUser.FederatedUserId), "123456789012:Bob"; got != want {
			t.Errorf("FederatedUserId = %q, want %q", got, want)
		}
		if out.PackedPolicySize == nil {
			t.Error("PackedPolicySize absent for a request with a policy")
		}
	})

	t.Run("GetCallerIdentity", func(t *testing.T) {
		out, err := client.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := aws.ToString(out.Arn), "arn:aws:iam::123456789012:user/sts-emulator"; got != want {
			t.Errorf("Arn = %q, want %q", got, want)
		}
		if got := aws.ToString(out.Account); got != DefaultAccount {
			t.Errorf("Account = %q, want %q", got, DefaultAccount)
		}
		if id := aws.ToString(out.UserId); !strings.HasPrefix(id, "AIDA") || len(id) != 21 {
			t.Errorf("UserId = %q, want AIDA + 17 characters", id)
		}
	})
}

func TestMaxLifetimeCapsDuration(t *testing.T) {
	clock := newFakeClock()
	e := startEmulator(t, Config{Now: clock.Now, MaxLifetime: 2 * time.Second})
	now := clock.Now().Truncate(time.Millisecond)
	out, err := rootClient(e).AssumeRole(ctx, assumeInput("short"))
	if err != nil {
		t.Fatal(err)
	}
	checkCreds(t, out.Credentials, now.Add(2*time.Second))

	e.SetMaxLifetime(time.Minute)
	gst, err := rootClient(e).GetSessionToken(ctx, &sts.GetSessionTokenInput{})
	if err != nil {
		t.Fatal(err)
	}
	checkCreds(t, gst.Credentials, now.Add(time.Minute))
}

func TestIssuedCredentialsSign(t *testing.T) {
	e := startEmulator(t, Config{})
	root := rootClient(e)
	withCreds := func(c *types.Credentials) *sts.Client {
		return newClient(e, aws.ToString(c.AccessKeyId), aws.ToString(c.SecretAccessKey), aws.ToString(c.SessionToken))
	}

	role, err := root.AssumeRole(ctx, assumeInput("path/to/app"))
	if err != nil {
		t.Fatal(err)
	}
	session, err := root.GetSessionToken(ctx, &sts.GetSessionTokenInput{})
	if err != nil {
		t.Fatal(err)
	}
	fed, err := root.GetFederationToken(ctx, &sts.GetFederationTokenInput{Name: aws.String("carol")})
	if err != nil {
		t.Fatal(err)
	}

	identities := []struct {
		name    string
		creds   *types.Credentials
		wantArn string
		wantID  string
	}{
		{"assumed role", role.Credentials, "arn:aws:sts::123456789012:assumed-role/app/test-session", aws.ToString(role.AssumedRoleUser.AssumedRoleId)},
		{"session token", session.Credentials, "arn:aws:iam::123456789012:user/sts-emulator", ""},
		{"federated user", fed.Credentials, "arn:aws:sts::123456789012:federated-user/carol", "123456789012:carol"},
	}
	for _, tc := range identities {
		t.Run("GetCallerIdentity as "+tc.name, func(t *testing.T) {
			out, err := withCreds(tc.creds).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
			if err != nil {
				t.Fatal(err)
			}
			if got := aws.ToString(out.Arn); got != tc.wantArn {
				t.Errorf("Arn = %q, want %q", got, tc.wantArn)
			}
			if tc.wantID != "" && aws.ToString(out.UserId) != tc.wantID {
				t.Errorf("UserId = %q, want %q", aws.ToString(out.UserId), tc.wantID)
			}
		})
	}

	t.Run("role chaining", func(t *testing.T) {
		chained := withCreds(role.Credentials)
		out, err := chained.AssumeRole(ctx, assumeInput("next"))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := aws.ToString(out.AssumedRoleUser.Arn), "arn:aws:sts::123456789012:assumed-role/next/test-session"; got != want {
			t.Errorf("Arn = %q, want %q", got, want)
		}
		in := assumeInput("next")
		in.DurationSeconds = aws.Int32(7200)
		_, err = chained.AssumeRole(ctx, in)
		if code := errorCode(err); code != "ValidationError" {
			t.Errorf("chained AssumeRole for 2h: code %q (%v), want ValidationError (1h chaining limit)", code, err)
		}
	})

	session2 := []struct {
		name  string
		call  func(*sts.Client) error
		creds *types.Credentials
	}{
		{"GetSessionToken with session credentials", func(c *sts.Client) error {
			_, err := c.GetSessionToken(ctx, &sts.GetSessionTokenInput{})
			return err
		}, role.Credentials},
		{"GetFederationToken with session credentials", func(c *sts.Client) error {
			_, err := c.GetFederationToken(ctx, &sts.GetFederationTokenInput{Name: aws.String("dave")})
			return err
		}, session.Credentials},
	}
	for _, tc := range session2 {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(withCreds(tc.creds))
			if code, status := errorCode(err), httpStatus(err); code != "AccessDenied" || status != http.StatusForbidden {
				t.Errorf("got %q/%d (%v), want AccessDenied/403", code, status, err)
			}
		})
	}
}

func TestSignatureFailures(t *testing.T) {
	e := startEmulator(t, Config{})
	role, err := rootClient(e).AssumeRole(ctx, assumeInput("app"))
	if err != nil {
		t.Fatal(err)
	}
	issuedID := aws.ToString(role.Credentials.AccessKeyId)
	issuedSecret := aws.ToString(role.Credentials.SecretAccessKey)
	issuedToken := aws.ToString(role.Credentials.SessionToken)
	// Another emulator's token is well-formed but sealed with another key.
	other := startEmulator(t, Config{})
	foreign, err := rootClient(other).AssumeRole(ctx, assumeInput("app"))
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name                 string
		akid, secret, token  string
		wantCode             string
		wantStatus           int
		wantMessageSubstring string
	}{
		{"wrong secret", DefaultAccessKey, "not-the-secret", "", "SignatureDoesNotMatch", 403, "signature we calculated does not match"},
		{"unknown key id", "AKIAUNKNOWNUNKNOWN00", DefaultSecretKey, "", "InvalidClientTokenId", 403, "security token included in the request is invalid"},
		{"root key with a session token", DefaultAccessKey, DefaultSecretKey, issuedToken, "InvalidClientTokenId", 403, "invalid"},
		{"issued key without its token", issuedID, issuedSecret, "", "InvalidClientTokenId", 403, "invalid"},
		{"issued key with another key's token", issuedID, issuedSecret, aws.ToString(foreign.Credentials.SessionToken), "InvalidClientTokenId", 403, "invalid"},
		{"issued key with a garbage token", issuedID, issuedSecret, "Zm9v", "InvalidClientTokenId", 403, "invalid"},
		{"issued key with wrong secret", issuedID, DefaultSecretKey, issuedToken, "SignatureDoesNotMatch", 403, "does not match"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newClient(e, tc.akid, tc.secret, tc.token).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
			if code, status := errorCode(err), httpStatus(err); code != tc.wantCode || status != tc.wantStatus {
				t.Fatalf("got %q/%d (%v), want %s/%d", code, status, err, tc.wantCode, tc.wantStatus)
			}
			if !strings.Contains(err.Error(), tc.wantMessageSubstring) {
				t.Errorf("error %q lacks %q", err, tc.wantMessageSubstring)
			}
		})
	}

	t.Run("issued credentials verify", func(t *testing.T) {
		if _, err := newClient(e, issuedID, issuedSecret, issuedToken).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
			t.Fatal(err)
		}
	})
}

// TestSigningNow checks that a separate signing clock lets the emulator's
// own clock run far ahead of the signer's: the skew check uses SigningNow,
// while issue and expiry still follow Now.
func TestSigningNow(t *testing.T) {
	ahead := func() time.Time { return time.Now().Add(5 * time.Hour) }
	e := startEmulator(t, Config{Now: ahead, SigningNow: time.Now})
	out, err := rootClient(e).AssumeRole(ctx, assumeInput("app"))
	if err != nil {
		t.Fatalf("with SigningNow = time.Now: %v", err)
	}
	if exp := aws.ToTime(out.Credentials.Expiration); exp.Before(time.Now().Add(5 * time.Hour)) {
		t.Fatalf("expiration %v does not follow the emulator's clock, 5h ahead", exp)
	}
	skewed := startEmulator(t, Config{Now: ahead})
	if _, err := rootClient(skewed).AssumeRole(ctx, assumeInput("app")); errorCode(err) != "SignatureDoesNotMatch" {
		t.Fatalf("without SigningNow: got %v, want SignatureDoesNotMatch (skew)", err)
	}
}

func TestClockSkew(t *testing.T) {
	tests := []struct {
		name        string
		serverAhead time.Duration // server clock minus the client's
		wantCode    string
		wantMessage string
	}{
		{"server 6 min ahead", 6 * time.Minute, "SignatureDoesNotMatch", "Signature expired:"},
		{"server 6 min behind", -6 * time.Minute, "SignatureDoesNotMatch", "Signature not yet current:"},
		{"server 4 min ahead", 4 * time.Minute, "", ""},
		{"server 4 min behind", -4 * time.Minute, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := startEmulator(t, Config{Now: func() time.Time { return time.Now().Add(tc.serverAhead) }})
			_, err := rootClient(e).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
			if tc.wantCode == "" {
				if err != nil {
					t.Fatalf("want success, got %v", err)
				}
				return
			}
			if code, status := errorCode(err), httpStatus(err); code != tc.wantCode || status != http.StatusForbidden {
				t.Fatalf("got %q/%d (%v), want %s/403", code, status, err, tc.wantCode)
			}
			if !strings.Contains(err.Error(), tc.wantMessage) || !strings.Contains(err.Error(), " 5 min.)") {
				t.Errorf("message %q, want STS's %q ... 5 min. wording", err, tc.wantMessage)
			}
		})
	}
}

func TestExpiry(t *testing.T) {
	clock := newFakeClock()
	e := startEmulator(t, Config{Now: clock.Now, MaxLifetime: time.Second})
	out, err := rootClient(e).AssumeRole(ctx, assumeInput("short-lived"))
	if err != nil {
		t.Fatal(err)
	}
	c := out.Credentials
	if want := clock.Now().Truncate(time.Millisecond).Add(time.Second); !c.Expiration.Equal(want) {
		t.Fatalf("Expiration = %v, want %v (MaxLifetime caps the 1h request)", c.Expiration, want)
	}
	client := newClient(e, aws.ToString(c.AccessKeyId), aws.ToString(c.SecretAccessKey), aws.ToString(c.SessionToken))

	steps := []struct {
		name     string
		advance  time.Duration
		wantCode string
	}{
		{"fresh", 0, ""},
		{"just before expiry", 998 * time.Millisecond, ""},
		{"at expiry", 2 * time.Millisecond, "ExpiredToken"},
		{"long after expiry", time.Hour, "ExpiredToken"},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			clock.Advance(st.advance)
			// The SDK signs with the real clock; an hour of fake drift would
			// trip the skew check, so the long step checks expiry first.
			id, err := client.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
			if st.wantCode == "" {
				if err != nil {
					t.Fatal(err)
				}
				if got, want := aws.ToString(id.Arn), "arn:aws:sts::123456789012:assumed-role/short-lived/test-session"; got != want {
					t.Errorf("Arn = %q, want %q", got, want)
				}
				return
			}
			if code, status := errorCode(err), httpStatus(err); code != st.wantCode || status != http.StatusBadRequest {
				t.Fatalf("got %q/%d (%v), want %s/400", code, status, err, st.wantCode)
			}
			// Any action signed with expired credentials is refused.
			_, err = client.AssumeRole(ctx, assumeInput("other"))
			if code := errorCode(err); code != "ExpiredToken" {
				t.Errorf("AssumeRole with expired credentials: %q (%v), want ExpiredToken", code, err)
			}
		})
	}
}
