package awsresilient

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// sdkWrap wraps err the way the SDK does: an operation error around a
// response error with the given HTTP status.
func sdkWrap(status int, err error) error {
	resp := &smithyhttp.Response{Response: &http.Response{StatusCode: status}}
	return &smithy.OperationError{ServiceID: "STS", OperationName: "AssumeRole", Err: &awshttp.ResponseError{
		ResponseError: &smithyhttp.ResponseError{Response: resp, Err: err},
	}}
}

func TestClassify(t *testing.T) {
	api := func(code string) error { return &smithy.GenericAPIError{Code: code, Message: code + " happened"} }
	tests := []struct {
		name      string
		err       error
		code      string
		retryable bool
	}{
		{"Throttling", sdkWrap(400, api("Throttling")), "Throttling", true},
		{"RequestLimitExceeded", sdkWrap(400, api("RequestLimitExceeded")), "RequestLimitExceeded", true},
		{"InternalFailure", sdkWrap(500, api("InternalFailure")), "InternalFailure", true},
		{"ServiceUnavailable", sdkWrap(503, api("ServiceUnavailable")), "ServiceUnavailable", true},
		{"unknown AWS code", sdkWrap(400, api("SomethingNew")), "SomethingNew", true},
		{"AccessDenied", sdkWrap(403, api("AccessDenied")), "AccessDenied", false},
		{"InvalidClientTokenId", sdkWrap(403, api("InvalidClientTokenId")), "InvalidClientTokenId", false},
		{"SignatureDoesNotMatch", sdkWrap(403, api("SignatureDoesNotMatch")), "SignatureDoesNotMatch", false},
		{"ValidationError", sdkWrap(400, api("ValidationError")), "ValidationError", false},
		{"MalformedPolicyDocument", sdkWrap(400, api("MalformedPolicyDocument")), "MalformedPolicyDocument", false},
		{"RegionDisabledException", sdkWrap(403, api("RegionDisabledException")), "RegionDisabledException", false},
		{"ExpiredToken", sdkWrap(400, api("ExpiredToken")), "ExpiredToken", false},
		{"5xx without a body", sdkWrap(502, errors.New("no body")), "HTTP502", true},
		{"truncated XML", sdkWrap(200, &xml.SyntaxError{Msg: "unexpected EOF", Line: 1}), "MalformedResponse", true},
		{"deserialization error", sdkWrap(200, &smithy.DeserializationError{Err: errors.New("bad"), Snapshot: []byte("secret")}), "MalformedResponse", true},
		{"call timeout", sdkWrap(0, &smithy.CanceledError{Err: context.DeadlineExceeded}), "Timeout", true},
		{"connection reset", sdkWrap(0, &smithyhttp.RequestSendError{Err: &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}}), "ConnectionError", true},
		{"connection refused", &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, "ConnectionError", true},
		{"EOF", fmt.Errorf("reading: %w", io.ErrUnexpectedEOF), "ConnectionError", true},
		{"anything else", errors.New("surprise"), "UnknownError", true},
		{"ours passes through", &refreshError{Code: "RateLimited", Message: "m", Retryable: true}, "RateLimited", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := classify(tc.err, "")
			if got.Code != tc.code || got.Retryable != tc.retryable {
				t.Fatalf("classify = %s (retryable %v), want %s (retryable %v)", got.Code, got.Retryable, tc.code, tc.retryable)
			}
			if strings.Contains(got.Message, "secret") {
				t.Fatalf("message %q carries a response snapshot", got.Message)
			}
		})
	}
}

func TestSanitizeMessage(t *testing.T) {
	tests := []struct {
		name, in, secret, want string
	}{
		{"plain", "Rate exceeded", "", "Rate exceeded"},
		{"first line only", "User is not authorized\nmore detail", "", "User is not authorized"},
		{"signing detail cut", "The request signature we calculated does not match. The Canonical String for this request should have been 'POST / ...'", "", "The request signature we calculated does not match."},
		{"secret redacted", "bad key wJalr/SECRET in request", "wJalr/SECRET", "bad key [redacted] in request"},
		{"long message truncated", strings.Repeat("é", 200), "", strings.Repeat("é", 128) + "..."},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := sanitizeMessage(tc.in, tc.secret); got != tc.want {
				t.Fatalf("sanitizeMessage = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCallTimeout(t *testing.T) {
	tests := []struct{ block, want time.Duration }{
		{5 * time.Second, 4 * time.Second},
		{time.Second / 6, time.Second / 6 * 4 / 5},
		{30 * time.Second, 10 * time.Second},
	}
	for _, tc := range tests {
		if got := callTimeout(tc.block); got != tc.want || got >= tc.block {
			t.Fatalf("callTimeout(%v) = %v, want %v (shorter than the block)", tc.block, got, tc.want)
		}
	}
}

// syncBuffer is a log sink safe for the backend's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLogs checks one structured line per refresh outcome, with role,
// attempt, outcome and next refresh, and never a secret key, session token
// or signature, even when STS rejects a signature.
func TestLogs(t *testing.T) {
	buf := &syncBuffer{}
	logger := hclog.New(&hclog.LoggerOptions{Output: buf, Level: hclog.Trace, JSONFormat: true})
	f := newFixture(t, fixtureOpts{logger: logger})

	good := f.mustReadCreds(testRole)
	f.emu.SetFaults(throttle(1))
	f.clock.Advance(time.Minute)
	f.refresh(testRole)
	second := cached(t, f.s, testRole)
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"secret_key": "WRONGwrongWRONGwrong"})
	f.refresh(testRole)

	out := buf.String()
	for _, want := range []string{
		`"@message":"refresh succeeded"`, `"role":"app"`, `"attempt":1`, `"outcome":"ok"`, `"next_refresh"`,
		`"@message":"refresh attempt failed"`, `"outcome":"Throttling"`,
		`"@message":"refresh cycle failed"`, `"outcome":"SignatureDoesNotMatch"`,
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("log lacks %s:\n%s", want, out)
		}
	}
	if n := strings.Count(out, `"@message":"refresh succeeded"`); n != 2 {
		t.Fatalf("%d success lines for 2 successful cycles", n)
	}
	for name, secret := range map[string]string{
		"root secret key": stsemu.DefaultSecretKey, "wrong secret key": "WRONGwrongWRONGwrong",
		"issued secret": good.Data["secret_key"].(string), "issued token": good.Data["security_token"].(string),
		"second secret": second.SecretKey, "second token": second.SessionToken,
	} {
		if strings.Contains(out, secret) {
			t.Fatalf("the log contains the %s", name)
		}
	}
	for _, marker := range []string{"Signature=", "Canonical", "String-to-Sign"} {
		if strings.Contains(out, marker) {
			t.Fatalf("the log contains signing detail %q", marker)
		}
	}
}
