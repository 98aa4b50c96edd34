package vaulttest

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// TestEmulatorControl checks the harness's view of the emulator's control
// API (stats, calls, faults, config, reset) with real SDK calls.
func TestEmulatorControl(t *testing.T) {
	SkipUnlessEnabled(t)
	t.Parallel()
	e := StartEmulator(t, "-max-lifetime", "30s")
	client := sts.New(sts.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(e.URL),
		Credentials:  credentials.NewStaticCredentialsProvider(e.AccessKey, e.SecretKey, ""),
		Retryer:      aws.NopRetryer{},
	})
	assume := func() (*sts.AssumeRoleOutput, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return client.AssumeRole(ctx, &sts.AssumeRoleInput{
			RoleArn:         aws.String("arn:aws:iam::" + EmulatorAccount + ":role/app"),
			RoleSessionName: aws.String("harness"),
			DurationSeconds: aws.Int32(3600),
		})
	}

	out, err := assume()
	if err != nil {
		t.Fatal(err)
	}
	if life := time.Until(*out.Credentials.Expiration); life > 31*time.Second {
		t.Fatalf("-max-lifetime 30s not applied: credential valid for %s", life)
	}
	// access_key_id is the key that signed the call, not the one issued;
	// the session name comes through the binary's JSON as sent.
	calls := e.Calls(t)
	if len(calls) != 1 || calls[0].Action != "AssumeRole" || calls[0].Outcome != "ok" || calls[0].AccessKeyID != e.AccessKey ||
		calls[0].RoleSessionName != "harness" || calls[0].SourceIdentity != "" {
		t.Fatalf("calls: %+v", calls)
	}

	e.SetFaults(t, FaultPlan{Sequence: []FaultStep{{Fault: "Throttling", Count: 1}}})
	if _, err := assume(); err == nil {
		t.Fatal("a scripted Throttling fault did not fail the call")
	}
	if _, err := assume(); err != nil {
		t.Fatalf("the call after the scripted fault: %v", err)
	}
	st := e.Stats(t)
	if st.Total != 3 || st.Count("AssumeRole", "ok") != 2 || st.Count("AssumeRole", "Throttling") != 1 || st.Count("AssumeRole", "") != 3 {
		t.Fatalf("stats: %+v", st)
	}
	if len(st.Timeline) == 0 {
		t.Fatal("stats timeline empty")
	}

	e.SetFaults(t, FaultPlan{Probability: map[string]float64{"InternalFailure": 1}})
	if _, err := assume(); err == nil {
		t.Fatal("probability 1 fault did not fail the call")
	}
	e.ClearFaults(t)
	e.SetConfig(t, map[string]any{"max_lifetime": "20s"})
	out, err = assume()
	if err != nil {
		t.Fatal(err)
	}
	if life := time.Until(*out.Credentials.Expiration); life > 21*time.Second {
		t.Fatalf("max_lifetime 20s not applied: credential valid for %s", life)
	}
	e.Reset(t)
	if st := e.Stats(t); st.Total != 0 {
		t.Fatalf("stats after reset: %+v", st)
	}
}

// TestEmulatorListeners: the harness starts the emulator with a second
// listener, refuses the first (its control API then goes through the
// second) and brings it back; each call names the listener it came through.
func TestEmulatorListeners(t *testing.T) {
	SkipUnlessEnabled(t)
	t.Parallel()
	e := StartEmulatorListeners(t, 1)
	if len(e.AlsoURLs) != 1 || e.AlsoURLs[0] == e.URL {
		t.Fatalf("AlsoURLs %v (URL %s)", e.AlsoURLs, e.URL)
	}
	identity := func(url string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := sts.New(sts.Options{
			Region: "us-east-1", BaseEndpoint: aws.String(url), Retryer: aws.NopRetryer{},
			Credentials: credentials.NewStaticCredentialsProvider(e.AccessKey, e.SecretKey, ""),
		}).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
		return err
	}
	e.SetListener(t, e.URL, ListenerRefused)
	if err := identity(e.URL); err == nil {
		t.Fatal("the refused listener answered")
	}
	if err := identity(e.AlsoURLs[0]); err != nil {
		t.Fatalf("the second listener while the first is refused: %v", err)
	}
	calls := e.Calls(t) // through the second listener
	e.SetListener(t, e.URL, ListenerUp)
	if err := identity(e.URL); err != nil {
		t.Fatalf("the first listener back up: %v", err)
	}
	if len(calls) != 1 || "http://"+calls[0].Listener != e.AlsoURLs[0] {
		t.Fatalf("calls while refused: %+v, want one through %s", calls, e.AlsoURLs[0])
	}
}
