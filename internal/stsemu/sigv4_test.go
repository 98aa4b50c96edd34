package stsemu

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// TestSignatureAWSExample checks the signer against the worked example in
// AWS's SigV4 documentation (IAM ListUsers, 2015-08-30).
func TestSignatureAWSExample(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "https://iam.amazonaws.com/?Action=ListUsers&Version=2010-05-08", nil)
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
	r.Header.Set("X-Amz-Date", "20150830T123600Z")
	auth := sigV4Auth{date: "20150830", region: "us-east-1", service: "iam",
		signedHeaders: []string{"content-type", "host", "x-amz-date"}}
	canonical := canonicalRequest(r, auth.signedHeaders, nil)
	wantCanonical := "GET\n/\nAction=ListUsers&Version=2010-05-08\n" +
		"content-type:application/x-www-form-urlencoded; charset=utf-8\nhost:iam.amazonaws.com\nx-amz-date:20150830T123600Z\n\n" +
		"content-type;host;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	if canonical != wantCanonical {
		t.Fatalf("canonical request:\n%s\nwant:\n%s", canonical, wantCanonical)
	}
	got := computeSignature("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", auth, "20150830T123600Z", canonical)
	if want := "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"; got != want {
		t.Errorf("signature %s, want %s", got, want)
	}
}

// TestSignatureMatchesSDKSigner signs assorted requests with the
// aws-sdk-go-v2 signer and checks that the emulator's own canonicalisation
// arrives at the same signature.
func TestSignatureMatchesSDKSigner(t *testing.T) {
	tests := []struct {
		name    string
		method  string
		target  string
		body    string
		headers map[string]string
		region  string
	}{
		{name: "form POST", method: "POST", target: "/", body: "Action=GetCallerIdentity&Version=2011-06-15",
			headers: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, region: "us-east-1"},
		{name: "GET with query needing escapes", method: "GET",
			target: "/?Version=2011-06-15&Action=AssumeRole&RoleSessionName=a%20b&Policy=%7B%22x%22%3A1%7D&RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fp%2Fn&Z=~tilde*star",
			region: "eu-west-2"},
		{name: "repeated query keys", method: "GET", target: "/?b=2&a=3&a=1&a=2", region: "ap-south-1"},
		{name: "path with escapes", method: "POST", target: "/some%20path/x+y/%C3%A9", body: "x=1", region: "us-west-2"},
		{name: "header whitespace and repeats", method: "POST", target: "/", body: "Action=GetCallerIdentity&Version=2011-06-15",
			headers: map[string]string{"X-Custom": "  a   b  c ", "X-Amz-Meta-Z": "z"}, region: "us-east-1"},
	}
	signer := v4.NewSigner()
	creds := aws.Credentials{AccessKeyID: DefaultAccessKey, SecretAccessKey: DefaultSecretKey, SessionToken: "tok"}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, "http://127.0.0.1:8599"+tc.target, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			sum := sha256.Sum256([]byte(tc.body))
			when := time.Date(2024, 2, 29, 23, 59, 59, 0, time.UTC)
			if err := signer.SignHTTP(ctx, creds, req, hex.EncodeToString(sum[:]), "sts", tc.region, when); err != nil {
				t.Fatal(err)
			}
			auth, ae := parseAuthorization(req.Header.Get("Authorization"))
			if ae != nil {
				t.Fatal(ae)
			}
			// Replay the request as a server receives it.
			var wire bytes.Buffer
			if err := req.Write(&wire); err != nil {
				t.Fatal(err)
			}
			srvReq, err := http.ReadRequest(bufioReader(&wire))
			if err != nil {
				t.Fatal(err)
			}
			got := computeSignature(DefaultSecretKey, auth, srvReq.Header.Get("X-Amz-Date"),
				canonicalRequest(srvReq, auth.signedHeaders, []byte(tc.body)))
			if got != auth.signature {
				t.Errorf("emulator signature %s, SDK signed %s\ncanonical:\n%s", got, auth.signature,
					canonicalRequest(srvReq, auth.signedHeaders, []byte(tc.body)))
			}
		})
	}
}

func TestParseAuthorization(t *testing.T) {
	tests := []struct {
		name     string
		header   string
		wantCode string
		wantKey  string
	}{
		{"valid", "AWS4-HMAC-SHA256 Credential=AKID/20240101/us-east-1/sts/aws4_request, SignedHeaders=host;x-amz-date, Signature=abc", "", "AKID"},
		{"no spaces after commas", "AWS4-HMAC-SHA256 Credential=AKID/20240101/any-region/sts/aws4_request,SignedHeaders=host,Signature=abc", "", "AKID"},
		{"other algorithm", "AWS AKID:sig", "IncompleteSignature", ""},
		{"missing signature", "AWS4-HMAC-SHA256 Credential=AKID/20240101/us-east-1/sts/aws4_request, SignedHeaders=host", "IncompleteSignature", ""},
		{"short scope", "AWS4-HMAC-SHA256 Credential=AKID/20240101/sts, SignedHeaders=host, Signature=abc", "IncompleteSignature", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, ae := parseAuthorization(tc.header)
			code := ""
			if ae != nil {
				code = ae.code
			}
			if code != tc.wantCode || a.accessKeyID != tc.wantKey {
				t.Errorf("got key %q code %q, want %q %q", a.accessKeyID, code, tc.wantKey, tc.wantCode)
			}
			if ae != nil && strings.Contains(ae.message, "Signature=abc") {
				t.Errorf("error message quotes the signature: %s", ae.message)
			}
		})
	}
}

// TestRawRequests covers requests the SDK would never send.
func TestRawRequests(t *testing.T) {
	e := startEmulator(t, Config{})
	tests := []struct {
		name       string
		body       string
		authz      string
		wantStatus int
		wantCode   string
	}{
		{"no Authorization", "Action=GetCallerIdentity&Version=2011-06-15", "", 403, "MissingAuthenticationToken"},
		{"garbage Authorization", "Action=GetCallerIdentity&Version=2011-06-15", "Bearer x", 400, "IncompleteSignature"},
		{"unknown action", "Action=DescribeThings&Version=2011-06-15", "", 400, "InvalidAction"},
		{"no action", "Version=2011-06-15", "", 400, "MissingAction"},
		{"wrong version", "Action=GetCallerIdentity&Version=2010-05-08", "", 400, "InvalidAction"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, e.URL()+"/", strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("X-Amz-Date", time.Now().UTC().Format(amzDateLayout))
			if tc.authz != "" {
				req.Header.Set("Authorization", tc.authz)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var doc errorResponse
			if err := decodeXML(resp, &doc); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.wantStatus || doc.Error.Code != tc.wantCode {
				t.Errorf("got %d %q, want %d %q", resp.StatusCode, doc.Error.Code, tc.wantStatus, tc.wantCode)
			}
			if resp.Header.Get("x-amzn-RequestId") == "" || doc.RequestID != resp.Header.Get("x-amzn-RequestId") {
				t.Errorf("request id header %q vs body %q", resp.Header.Get("x-amzn-RequestId"), doc.RequestID)
			}
		})
	}
}
