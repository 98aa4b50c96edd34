package awsresilient

import (
	"bytes"
	"context"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// partitionFixture is a rotation fixture whose emulator plays partition and
// whose config/root names region; STS and IAM both go to the emulator.
func partitionFixture(t *testing.T, partition, region string, o fixtureOpts) *fixture {
	t.Helper()
	clk := newFakeClock(time.Now().Truncate(time.Second))
	emu := startEmulator(t, stsemu.Config{MaxLifetime: 10 * time.Minute, Now: clk.Now, Partition: partition})
	o.noRole = true // its ARN is in the aws partition
	f := newFixtureWith(t, o, clk, emu)
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"iam_endpoint": emu.URL(), "region": region})
	return f
}

// TestRotation_EveryPartition rotates the root key against an emulator
// playing each partition, through the real SDK: IAM is signed for the
// partition's IAM region (the emulator refuses any other, as IAM does), and
// the new key verifies as the partition's user ARN.
func TestRotation_EveryPartition(t *testing.T) {
	for _, tc := range []struct{ partition, region string }{
		{"aws", "eu-west-1"},
		{"aws-us-gov", "us-gov-east-1"},
		{"aws-cn", "cn-northwest-1"},
	} {
		t.Run(tc.partition, func(t *testing.T) {
			f := partitionFixture(t, tc.partition, tc.region, fixtureOpts{})
			resp, err := f.rotate()
			if err != nil || resp.IsError() {
				t.Fatalf("rotate-root in %s: err=%v resp=%v", tc.partition, err, respErr(resp))
			}
			id, _ := resp.Data["access_key"].(string)
			if keys := userKeys(t, f.emu); len(keys) != 1 || keys[0] != id || rootKeyID(t, f) != id {
				t.Fatalf("after the rotation the user has %v and config/root %s, want only %s", keys, rootKeyID(t, f), id)
			}
			if arn := f.emu.IAMUsers()[0].Arn; !strings.HasPrefix(arn, "arn:"+tc.partition+":iam::") {
				t.Fatalf("the emulator's user is %s: the test proves nothing about partitions", arn)
			}
		})
	}
}

// TestRotation_IAMRegion: an explicit iam_region is what IAM calls are
// signed for; one IAM does not accept fails the rotation with a 400 naming
// SignatureDoesNotMatch, and changes nothing.
func TestRotation_IAMRegion(t *testing.T) {
	f := partitionFixture(t, "aws-us-gov", "us-gov-west-1", fixtureOpts{})
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"iam_region": "us-gov-east-1"})
	resp, err := f.rotate()
	wantBadRequest(t, resp, err, "iam:GetUser", "SignatureDoesNotMatch")
	if keys := userKeys(t, f.emu); len(keys) != 1 || keys[0] != stsemu.DefaultAccessKey {
		t.Fatalf("a refused rotation left keys %v", keys)
	}
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"iam_region": "us-gov-west-1"})
	if got := mustDo(t, f.b, f.s, logical.ReadOperation, "config/root", nil).Data["iam_region"]; got != "us-gov-west-1" {
		t.Fatalf("config/root iam_region = %v", got)
	}
	if resp, err := f.rotate(); err != nil || resp.IsError() {
		t.Fatalf("rotate-root with iam_region us-gov-west-1: err=%v resp=%v", err, respErr(resp))
	}
}

// TestConfigRoot_IAMRegionValidation: iam_region must be a region of
// region's partition.
func TestConfigRoot_IAMRegionValidation(t *testing.T) {
	b, s := getTestBackend(t)
	for _, tc := range []struct {
		data map[string]interface{}
		want string
	}{
		{map[string]interface{}{"iam_region": "moon"}, "iam_region must be an AWS region name"},
		{map[string]interface{}{"region": "us-east-1", "iam_region": "us-gov-west-1"}, "is in partition aws-us-gov but region us-east-1 is in aws"},
		{map[string]interface{}{"region": "cn-north-1", "iam_region": "us-east-1"}, "is in partition aws but region cn-north-1 is in aws-cn"},
	} {
		resp, err := do(t, b, s, logical.UpdateOperation, "config/root", tc.data)
		wantBadRequest(t, resp, err, tc.want)
	}
	mustDo(t, b, s, logical.UpdateOperation, "config/root", map[string]interface{}{"region": "cn-northwest-1", "iam_region": "cn-north-1"})
}

func TestIAMTargetOf(t *testing.T) {
	for _, tc := range []struct {
		cfg  rootConfig
		want iamTarget
		ok   bool
	}{
		{rootConfig{Region: "us-east-1"}, iamTarget{"us-east-1", "https://iam.amazonaws.com"}, true},
		{rootConfig{Region: "ap-southeast-2"}, iamTarget{"us-east-1", "https://iam.amazonaws.com"}, true},
		{rootConfig{Region: "us-gov-east-1"}, iamTarget{"us-gov-west-1", "https://iam.us-gov.amazonaws.com"}, true},
		{rootConfig{Region: "cn-northwest-1"}, iamTarget{"cn-north-1", "https://iam.cn-north-1.amazonaws.com.cn"}, true},
		{rootConfig{Region: "us-gov-west-1", IAMRegion: "us-gov-east-1"}, iamTarget{"us-gov-east-1", "https://iam.us-gov.amazonaws.com"}, true},
		{rootConfig{Region: "cn-north-1", IAMEndpoint: "https://vpce.example.com.cn"}, iamTarget{"cn-north-1", "https://vpce.example.com.cn"}, true},
		{rootConfig{Region: "us-iso-east-1"}, iamTarget{}, false},
		{rootConfig{Region: "us-iso-east-1", IAMRegion: "us-iso-east-1", IAMEndpoint: "https://iam.example.ic.gov"}, iamTarget{"us-iso-east-1", "https://iam.example.ic.gov"}, true},
	} {
		got, ok := iamTargetOf(&tc.cfg)
		if got != tc.want || ok != tc.ok {
			t.Errorf("iamTargetOf(%+v) = %+v, %v; want %+v, %v", tc.cfg, got, ok, tc.want, tc.ok)
		}
	}
}

// capture is an HTTP client that records each request and answers 500.
type capture struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (c *capture) Do(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.reqs = append(c.reqs, r)
	c.mu.Unlock()
	return &http.Response{StatusCode: 500, Body: io.NopCloser(strings.NewReader("")), Header: http.Header{}, Request: r}, nil
}

// TestNewIAMClient_SendsAndSignsPerPartition: the real SDK client the
// rotation builds sends to the partition's IAM host and scopes its
// signature to the partition's IAM region (no request leaves the process).
func TestNewIAMClient_SendsAndSignsPerPartition(t *testing.T) {
	for region, want := range map[string]struct{ host, scope string }{
		"eu-central-1":  {"iam.amazonaws.com", "/us-east-1/iam/aws4_request"},
		"us-gov-west-1": {"iam.us-gov.amazonaws.com", "/us-gov-west-1/iam/aws4_request"},
		"cn-north-1":    {"iam.cn-north-1.amazonaws.com.cn", "/cn-north-1/iam/aws4_request"},
	} {
		target, ok := iamTargetOf(&rootConfig{Region: region})
		if !ok {
			t.Fatalf("no IAM target for %s", region)
		}
		c := &capture{}
		awsCfg := aws.Config{
			Region:      target.region,
			Credentials: credentials.NewStaticCredentialsProvider("AKIAIOSFODNN7EXAMPLE", "secret", ""),
			Retryer:     func() aws.Retryer { return aws.NopRetryer{} },
			HTTPClient:  c,
		}
		_, _ = newIAMClient(awsCfg, newAWSClocks(clock.Real{}, "test"), target).GetUser(context.Background(), &iam.GetUserInput{})
		if len(c.reqs) != 1 {
			t.Fatalf("%s: %d requests", region, len(c.reqs))
		}
		r := c.reqs[0]
		if r.URL.Scheme != "https" || r.URL.Host != want.host || !strings.Contains(r.Header.Get("Authorization"), want.scope) {
			t.Errorf("%s: request to %s://%s scoped %q; want https://%s and %s", region, r.URL.Scheme, r.URL.Host, r.Header.Get("Authorization"), want.host, want.scope)
		}
	}
}

// TestRotation_VerifiesAheadOfAQueuedHerd (issue 21, defect 6): with every
// rate limiter slot of the next minutes reserved by queued refreshes, the
// rotation's verification still gets its call at once instead of failing
// 503 RateLimited.
func TestRotation_VerifiesAheadOfAQueuedHerd(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{refresh: map[string]interface{}{"sts_rate_limit": 1, "sts_burst": 1}})
	now := f.clock.Now()
	for range 600 { // ten minutes of slots at 1/s: longer than any verification
		if _, ok := f.b.limiter.Reserve(now, now.Add(time.Hour)); !ok {
			t.Fatal("reserving the herd's slots failed")
		}
	}
	resp, err := f.rotate()
	if err != nil || resp.IsError() {
		t.Fatalf("rotate-root behind a queued herd: err=%v resp=%v", err, respErr(resp))
	}
	var verified []time.Duration
	for _, c := range f.emu.Calls() {
		if c.Action == "GetCallerIdentity" && c.Outcome == "ok" {
			verified = append(verified, c.Time.Sub(now))
		}
	}
	if len(verified) != 1 || verified[0] > time.Second {
		t.Errorf("the new key was verified at %v after the start: want one call, at once, not behind the queue", verified)
	}
}

// refusingProxy forwards to the emulator, but answers GetCallerIdentity
// signed with any key other than the emulator's configured one with
// InvalidClientTokenId while refuse is positive (or always when it is
// negative): an STS endpoint that has not seen a new key yet.
type refusingProxy struct {
	mu      sync.Mutex
	refuse  int
	refused int
	passed  int
}

func (p *refusingProxy) start(t *testing.T, target string) string {
	t.Helper()
	u, _ := url.Parse(target)
	rp := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		isNew := strings.Contains(string(body), "Action=GetCallerIdentity") &&
			!strings.Contains(r.Header.Get("Authorization"), "Credential="+stsemu.DefaultAccessKey+"/")
		if isNew {
			p.mu.Lock()
			refuse := p.refuse != 0
			if refuse {
				p.refuse--
				p.refused++
			} else {
				p.passed++
			}
			p.mu.Unlock()
			if refuse {
				w.Header().Set("Content-Type", "text/xml")
				w.WriteHeader(http.StatusForbidden)
				_, _ = io.WriteString(w, `<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type>`+
					`<Code>InvalidClientTokenId</Code><Message>The security token included in the request is invalid.</Message></Error>`+
					`<RequestId>0</RequestId></ErrorResponse>`)
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func (p *refusingProxy) counts() (refused, passed int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused, p.passed
}

// TestRotation_VerifiesOnEveryEndpoint (issue 21, defect 10): the new key
// is verified on the fallback STS endpoints too, until each accepts it; a
// fallback that never does fails the rotation, names it, and leaves
// config/root and the user's keys as they were.
func TestRotation_VerifiesOnEveryEndpoint(t *testing.T) {
	t.Run("the fallback catches up", func(t *testing.T) {
		f := rotationFixture(t, fixtureOpts{})
		p := &refusingProxy{refuse: 2}
		mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"sts_fallback_endpoints": p.start(t, f.emu.URL())})
		resp, err := f.rotate()
		if err != nil || resp.IsError() {
			t.Fatalf("rotate-root: err=%v resp=%v", err, respErr(resp))
		}
		if refused, passed := p.counts(); refused != 2 || passed != 1 {
			t.Fatalf("the fallback refused %d and accepted %d verifications, want 2 and 1", refused, passed)
		}
	})
	t.Run("the fallback never accepts", func(t *testing.T) {
		f := rotationFixture(t, fixtureOpts{})
		p := &refusingProxy{refuse: -1}
		mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"sts_fallback_endpoints": p.start(t, f.emu.URL())})
		resp, err := f.rotate()
		if err == nil || !strings.Contains(err.Error(), "at the fallback_1 endpoint") || !strings.Contains(err.Error(), "InvalidClientTokenId") {
			t.Fatalf("rotate-root with a fallback refusing the new key: err=%v resp=%v", err, respErr(resp))
		}
		if keys := userKeys(t, f.emu); len(keys) != 1 || keys[0] != stsemu.DefaultAccessKey || rootKeyID(t, f) != stsemu.DefaultAccessKey {
			t.Fatalf("after the failed rotation the user has %v, config/root %s", keys, rootKeyID(t, f))
		}
	})
}
