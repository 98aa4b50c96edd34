package stsemu

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/smithy-go"
)

// newFakeClock is the module's one fake clock (clocktest.Fake), reading the
// real time when made; a test hands its Now to Config.Now.
func newFakeClock() *clocktest.Fake { return clocktest.NewFake(time.Now()) }

// startEmulator starts an emulator for the test and closes it afterwards.
func startEmulator(tb testing.TB, cfg Config) *Emulator {
	tb.Helper()
	e, err := Start(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(e.Close)
	return e
}

// newClient is the real aws-sdk-go-v2 STS client pointed at e with static
// credentials and SDK retries off, so every call is exactly one request.
func newClient(e *Emulator, akid, secret, token string) *sts.Client {
	return sts.New(sts.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(e.URL()),
		Credentials:  credentials.NewStaticCredentialsProvider(akid, secret, token),
		Retryer:      aws.NopRetryer{},
	})
}

// rootClient signs with the emulator's default root key pair.
func rootClient(e *Emulator) *sts.Client {
	return newClient(e, DefaultAccessKey, DefaultSecretKey, "")
}

// errorCode returns the AWS error code the SDK surfaced, or "" for none.
func errorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// httpStatus returns the HTTP status the SDK saw, or 0 without a response.
func httpStatus(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// assumeInput is a valid AssumeRole request for role in the default account.
func assumeInput(role string) *sts.AssumeRoleInput {
	return &sts.AssumeRoleInput{
		RoleArn:         aws.String("arn:aws:iam::" + DefaultAccount + ":role/" + role),
		RoleSessionName: aws.String("test-session"),
	}
}

var ctx = context.Background()

func bufioReader(r io.Reader) *bufio.Reader { return bufio.NewReader(r) }

// decodeXML reads an XML response body into v.
func decodeXML(resp *http.Response, v any) error {
	return xml.NewDecoder(resp.Body).Decode(v)
}

func sha256Sum(b []byte) [32]byte { return sha256.Sum256(b) }

func newBody(s string) io.ReadCloser { return io.NopCloser(strings.NewReader(s)) }

// controlCall sends a control API request to e and returns the answer's
// body, failing t unless its status is wantStatus.
func controlCall(t *testing.T, e *Emulator, method, path, body string, wantStatus int) []byte {
	t.Helper()
	req, _ := http.NewRequest(method, e.URL()+path, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != wantStatus {
		t.Fatalf("%s %s: status %d (%s), want %d", method, path, resp.StatusCode, raw, wantStatus)
	}
	return raw
}

// wireCalls is GET /_emulator/calls as JSON objects, with its raw body for
// messages.
func wireCalls(t *testing.T, e *Emulator) ([]map[string]any, []byte) {
	t.Helper()
	raw := controlCall(t, e, http.MethodGet, "/_emulator/calls", "", http.StatusOK)
	var wire []map[string]any
	if err := json.Unmarshal(raw, &wire); err != nil {
		t.Fatalf("GET /_emulator/calls: %v in %s", err, raw)
	}
	return wire, raw
}
