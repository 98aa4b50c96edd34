package stsemu

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// BenchmarkAssumeRoleSDK measures full round trips through the real SDK
// client over loopback HTTP, from parallel goroutines, and reports calls/s.
func BenchmarkAssumeRoleSDK(b *testing.B) {
	e := startEmulator(b, Config{})
	b.ReportAllocs()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		client := rootClient(e)
		for pb.Next() {
			if _, err := client.AssumeRole(ctx, assumeInput("bench")); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
}

// BenchmarkHandler measures the emulator alone (signature check, issuing,
// stats) without HTTP transport, on a pre-signed request.
func BenchmarkHandler(b *testing.B) {
	for _, action := range []string{"AssumeRole", "GetCallerIdentity"} {
		b.Run(action, func(b *testing.B) {
			e := New(Config{})
			body := "Action=" + action + "&Version=2011-06-15"
			if action == "AssumeRole" {
				body += "&RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fbench&RoleSessionName=bench"
			}
			req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8599/", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
			creds := aws.Credentials{AccessKeyID: DefaultAccessKey, SecretAccessKey: DefaultSecretKey}
			hash := fmt.Sprintf("%x", sha256Sum([]byte(body)))
			if err := v4.NewSigner().SignHTTP(ctx, creds, req, hash, "sts", "us-east-1", time.Now()); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				r := req.Clone(ctx)
				r.Body = newBody(body)
				rec := httptest.NewRecorder()
				e.ServeHTTP(rec, r)
				if rec.Code != http.StatusOK {
					b.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
			}
		})
	}
}

// BenchmarkThrottledSDK checks that throttled calls stay cheap: a tiny
// bucket means nearly every call is answered with Throttling.
func BenchmarkThrottledSDK(b *testing.B) {
	e := startEmulator(b, Config{Rate: 1, Burst: 1})
	client := rootClient(e)
	b.ReportAllocs()
	for range b.N {
		_, _ = client.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	}
	b.ReportMetric(float64(e.Stats().Count("", "Throttling")), "throttled")
}
