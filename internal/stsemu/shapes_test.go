package stsemu

import (
	"encoding/hex"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// signedPost sends a form body to e signed with the SDK's SigV4 signer and
// returns the raw response.
func signedPost(t *testing.T, e *Emulator, body, secret string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.URL()+"/", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
	sum := sha256Sum([]byte(body))
	creds := aws.Credentials{AccessKeyID: DefaultAccessKey, SecretAccessKey: secret}
	if err := v4.NewSigner().SignHTTP(ctx, creds, req, hex.EncodeToString(sum[:]), "sts", "us-east-1", time.Now()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(raw)
}

// TestResponseShapes pins the exact XML documents, element order included,
// to the shapes in the STS API reference.
func TestResponseShapes(t *testing.T) {
	const (
		ns    = `xmlns="https://sts.amazonaws.com/doc/2011-06-15/"`
		reqID = `[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}`
		creds = `<Credentials><AccessKeyId>ASIA[A-Z2-7]{16}</AccessKeyId><SecretAccessKey>[A-Za-z0-9+/]{40}</SecretAccessKey>` +
			`<SessionToken>[A-Za-z0-9+/=]{400,}</SessionToken><Expiration>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,3})?Z</Expiration></Credentials>`
		meta = `<ResponseMetadata><RequestId>(` + reqID + `)</RequestId></ResponseMetadata>`
	)
	tests := []struct {
		name       string
		body       string
		secret     string
		wantStatus int
		want       string // regexp of the whole document
	}{
		{"AssumeRole", "Action=AssumeRole&Version=2011-06-15&RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fapp&RoleSessionName=s1",
			DefaultSecretKey, 200,
			`<AssumeRoleResponse ` + ns + `><AssumeRoleResult><AssumedRoleUser><Arn>arn:aws:sts::123456789012:assumed-role/app/s1</Arn>` +
				`<AssumedRoleId>AROA[A-Z2-7]{17}:s1</AssumedRoleId></AssumedRoleUser>` + creds + `</AssumeRoleResult>` + meta + `</AssumeRoleResponse>`},
		{"AssumeRole with policy", "Action=AssumeRole&Version=2011-06-15&RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fapp&RoleSessionName=s1&SourceIdentity=me&Policy=%7B%7D",
			DefaultSecretKey, 200,
			`<AssumeRoleResponse ` + ns + `><AssumeRoleResult><SourceIdentity>me</SourceIdentity><AssumedRoleUser><Arn>[^<]+</Arn>` +
				`<AssumedRoleId>[^<]+</AssumedRoleId></AssumedRoleUser>` + creds + `<PackedPolicySize>\d+</PackedPolicySize></AssumeRoleResult>` + meta + `</AssumeRoleResponse>`},
		{"GetSessionToken", "Action=GetSessionToken&Version=2011-06-15", DefaultSecretKey, 200,
			`<GetSessionTokenResponse ` + ns + `><GetSessionTokenResult>` + creds + `</GetSessionTokenResult>` + meta + `</GetSessionTokenResponse>`},
		{"GetFederationToken", "Action=GetFederationToken&Version=2011-06-15&Name=Bob", DefaultSecretKey, 200,
			`<GetFederationTokenResponse ` + ns + `><GetFederationTokenResult>` + creds +
				`<FederatedUser><Arn>arn:aws:sts::123456789012:federated-user/Bob</Arn><FederatedUserId>123456789012:Bob</FederatedUserId></FederatedUser>` +
				`</GetFederationTokenResult>` + meta + `</GetFederationTokenResponse>`},
		{"GetCallerIdentity", "Action=GetCallerIdentity&Version=2011-06-15", DefaultSecretKey, 200,
			`<GetCallerIdentityResponse ` + ns + `><GetCallerIdentityResult><Arn>arn:aws:iam::123456789012:user/sts-emulator</Arn>` +
				`<UserId>AIDA[A-Z2-7]{17}</UserId><Account>123456789012</Account></GetCallerIdentityResult>` + meta + `</GetCallerIdentityResponse>`},
		{"sender error", "Action=GetCallerIdentity&Version=2011-06-15", "wrong", 403,
			`<ErrorResponse ` + ns + `><Error><Type>Sender</Type><Code>SignatureDoesNotMatch</Code><Message>The request signature we calculated ` +
				`does not match the signature you provided. Check your AWS Secret Access Key and signing method. Consult the service documentation for details.` +
				`</Message></Error><RequestId>(` + reqID + `)</RequestId></ErrorResponse>`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := startEmulator(t, Config{})
			resp, body := signedPost(t, e, tc.body, tc.secret)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.wantStatus, body)
			}
			m := regexp.MustCompile(`^` + tc.want + `$`).FindStringSubmatch(body)
			if m == nil {
				t.Fatalf("document\n%s\ndoes not match\n%s", body, tc.want)
			}
			if id := resp.Header.Get("x-amzn-RequestId"); id != m[len(m)-1] {
				t.Errorf("x-amzn-RequestId %q, body RequestId %q", id, m[len(m)-1])
			}
			if ct := resp.Header.Get("Content-Type"); ct != "text/xml" {
				t.Errorf("Content-Type %q, want text/xml", ct)
			}
		})
	}

	t.Run("server error is Receiver", func(t *testing.T) {
		e := startEmulator(t, Config{})
		e.SetFaults(FaultPlan{Sequence: []FaultStep{{Fault: FaultServiceUnavailable, Count: 1}}})
		resp, body := signedPost(t, e, "Action=GetCallerIdentity&Version=2011-06-15", DefaultSecretKey)
		if resp.StatusCode != 503 || !strings.Contains(body, "<Type>Receiver</Type><Code>ServiceUnavailable</Code>") {
			t.Errorf("got %d %s", resp.StatusCode, body)
		}
	})

	t.Run("malformed is truncated", func(t *testing.T) {
		e := startEmulator(t, Config{})
		e.SetFaults(FaultPlan{Sequence: []FaultStep{{Fault: FaultMalformed, Count: 1}}})
		resp, body := signedPost(t, e, "Action=GetCallerIdentity&Version=2011-06-15", DefaultSecretKey)
		want := `<GetCallerIdentityResponse ` + ns + `><GetCallerIdentityResult><Arn>arn:aws:sts::`
		if resp.StatusCode != 200 || body != want {
			t.Errorf("got %d %q, want 200 %q", resp.StatusCode, body, want)
		}
	})
}
