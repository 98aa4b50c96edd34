package awsresilient

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
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

// fakeRoot is config/root as the STS clients' owner reads it, without a
// backend: a test changes it, makes reads fail, and counts them.
type fakeRoot struct {
	mu    sync.Mutex
	cfg   *rootConfig
	err   error
	reads int
}

func (f *fakeRoot) read(context.Context) (*rootConfig, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if f.err != nil {
		return nil, f.err
	}
	if f.cfg == nil {
		return nil, nil
	}
	c := *f.cfg
	return &c, nil
}

func (f *fakeRoot) set(cfg *rootConfig, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cfg, f.err = cfg, err
}

func (f *fakeRoot) readCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

// testRootConfig is a config/root whose clients sign with key (no call is
// made: building a client does not reach AWS).
func testRootConfig(key string) *rootConfig {
	return &rootConfig{AccessKey: key, SecretKey: key + "secret", Region: "us-east-1", STSEndpoint: "http://127.0.0.1:1"}
}

// Concurrent first users build the clients once: users that all found no
// set under the read lock queue for the write lock, and there the re-check
// finds the set the first of them built.
func TestSTSClients_BuiltOnceForConcurrentUsers(t *testing.T) {
	const users = 16
	concurrently := func(f func() (*stsEndpoint, error)) []*stsEndpoint {
		t.Helper()
		start := make(chan struct{})
		got := make([]*stsEndpoint, users)
		var wg sync.WaitGroup
		for i := range users {
			wg.Go(func() {
				<-start
				ep, err := f()
				if err != nil {
					t.Errorf("acquire: %v", err)
				}
				got[i] = ep
			})
		}
		close(start)
		wg.Wait()
		return got
	}
	sameSet := func(what string, got []*stsEndpoint) {
		t.Helper()
		for i := range got {
			if got[i] == nil || got[i] != got[0] {
				t.Fatalf("%s: user %d got a different client set than user 0", what, i)
			}
		}
	}
	root := &fakeRoot{cfg: testRootConfig("AKIAONE")}
	c := newSTSClients(time.Now, newAWSClocks(clock.Real{}, "test"), root.read, nil)

	// Every user past the read lock at once: the re-check alone builds once.
	sameSet("past the read lock", concurrently(func() (*stsEndpoint, error) {
		eps, release, err := c.acquireSlow(context.Background())
		if err != nil {
			return nil, err
		}
		release()
		return eps[0], nil
	}))
	if n := root.readCount(); n != 1 {
		t.Fatalf("%d builds for %d users who found no set, want 1", n, users)
	}

	// And through acquire, after a reset: one more build.
	c.reset()
	sameSet("through acquire", concurrently(func() (*stsEndpoint, error) {
		eps, release, err := c.acquire(context.Background())
		if err != nil {
			return nil, err
		}
		release()
		return eps[0], nil
	}))
	if n := root.readCount(); n != 2 {
		t.Fatalf("%d builds in all, want 2 (one before the reset, one after)", n)
	}
}

// reset drops the clients; until then a changed config/root is not read,
// and the next acquire after it builds from the new one, each client wrapped
// by the seam given to the constructor.
func TestSTSClients_ResetRebuildsFromNewConfig(t *testing.T) {
	root := &fakeRoot{cfg: testRootConfig("AKIAONE")}
	var wrapped []string
	c := newSTSClients(time.Now, newAWSClocks(clock.Real{}, "test"), root.read, func(endpoint string, api stsAPI) stsAPI {
		wrapped = append(wrapped, endpoint) // builds hold the write lock
		return api
	})
	key := func() string {
		t.Helper()
		eps, release, err := c.acquire(context.Background())
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
		defer release()
		return eps[0].secretKey
	}

	if k := key(); k != "AKIAONEsecret" {
		t.Fatalf("first build signs with %q", k)
	}
	two := testRootConfig("AKIATWO")
	two.STSFallbackEndpoints = []string{"http://127.0.0.1:2"}
	root.set(two, nil)
	if k := key(); k != "AKIAONEsecret" || root.readCount() != 1 {
		t.Fatalf("before reset: signs with %q after %d reads, want the cached AKIAONE after 1", k, root.readCount())
	}
	c.reset()
	eps, release, err := c.acquire(context.Background())
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	release()
	if len(eps) != 2 || eps[0].secretKey != "AKIATWOsecret" || eps[1].url != "http://127.0.0.1:2" || root.readCount() != 2 {
		t.Fatalf("after reset: %d endpoints, first signs with %q, after %d reads", len(eps), eps[0].secretKey, root.readCount())
	}
	if want := []string{"http://127.0.0.1:1", "http://127.0.0.1:1", "http://127.0.0.1:2"}; !slices.Equal(wrapped, want) {
		t.Fatalf("wrapped %v, want %v", wrapped, want)
	}
}

// A set that an attempt still uses when reset drops it is retired: drainKey
// waits for the attempt, and the set is forgotten once it has ended. A
// current set, or a dropped one nobody used, is not waited for.
func TestSTSClients_RetiredUntilReleased(t *testing.T) {
	root := &fakeRoot{cfg: testRootConfig("AKIAONE")}
	c := newSTSClients(time.Now, newAWSClocks(clock.Real{}, "test"), root.read, nil)
	ctx := context.Background()

	_, releaseOne, err := c.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	root.set(testRootConfig("AKIATWO"), nil)
	c.reset()
	// The bound is real time; the attempt holds its set far longer.
	if c.drainKey(ctx, "AKIAONE", 20*time.Millisecond) {
		t.Fatal("drainKey says the attempt on the dropped set ended while it runs")
	}

	_, releaseTwo, err := c.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !c.drainKey(ctx, "AKIATWO", time.Hour) {
		t.Fatal("drainKey waited for the current set's attempt")
	}
	releaseTwo()
	c.reset() // AKIATWO's set is dropped with no user: not retired

	ended := make(chan bool)
	go func() { ended <- c.drainKey(ctx, "AKIAONE", time.Hour) }()
	select {
	case <-ended:
		t.Fatal("drainKey returned before the attempt released its set")
	default:
	}
	releaseOne()
	if !<-ended {
		t.Fatal("drainKey did not see the attempt end")
	}
	if len(c.retired) != 1 || c.retired[0].accessKey != "AKIAONE" {
		t.Fatalf("retired sets %d, want only AKIAONE's until the next reset", len(c.retired))
	}
	c.reset()
	if len(c.retired) != 0 {
		t.Fatalf("%d retired sets kept after their attempts ended", len(c.retired))
	}
}

// A failed config/root read builds nothing: the caller gets a retryable
// storage error, and the next acquire reads again and builds.
func TestSTSClients_FailedReadRetried(t *testing.T) {
	root := &fakeRoot{}
	root.set(testRootConfig("AKIAONE"), errors.New("storage down"))
	c := newSTSClients(time.Now, newAWSClocks(clock.Real{}, "test"), root.read, nil)

	_, release, err := c.acquire(context.Background())
	var re *refreshError
	if !errors.As(err, &re) || re.Code != "StorageError" || !re.Retryable || release != nil {
		t.Fatalf("acquire with config/root unreadable = %v, want a retryable StorageError and no release", err)
	}
	root.set(testRootConfig("AKIAONE"), nil)
	eps, release, err := c.acquire(context.Background())
	if err != nil {
		t.Fatalf("acquire after storage recovered: %v", err)
	}
	release()
	if eps[0].secretKey != "AKIAONEsecret" || root.readCount() != 2 {
		t.Fatalf("built signing with %q after %d reads, want AKIAONE after 2", eps[0].secretKey, root.readCount())
	}
}
