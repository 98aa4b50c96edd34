package stsemu

import (
	"context"
	"encoding/xml"
	"errors"
	"net/http"
	"reflect"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/smithy-go"
)

func TestFaultsWithSDK(t *testing.T) {
	tests := []struct {
		fault      Fault
		wantCode   string // AWS error code the SDK surfaces; "" for none
		wantStatus int    // HTTP status the SDK saw; 0 for no response
		check      func(t *testing.T, out *sts.AssumeRoleOutput, err error)
	}{
		{fault: FaultThrottling, wantCode: "Throttling", wantStatus: 400},
		{fault: FaultRequestLimitExceeded, wantCode: "RequestLimitExceeded", wantStatus: 400},
		{fault: FaultInternalFailure, wantCode: "InternalFailure", wantStatus: 500},
		{fault: FaultServiceUnavailable, wantCode: "ServiceUnavailable", wantStatus: 503},
		{fault: FaultAccessDenied, wantCode: "AccessDenied", wantStatus: 403},
		{fault: FaultReset, check: func(t *testing.T, _ *sts.AssumeRoleOutput, err error) {
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("err = %v, want connection reset by peer", err)
			}
		}},
		{fault: FaultMalformed, wantStatus: 200, check: func(t *testing.T, _ *sts.AssumeRoleOutput, err error) {
			// Depending on where the XML breaks off the SDK reports a
			// DeserializationError or the raw XML syntax error; either way
			// the 200 must not pass for success.
			var de *smithy.DeserializationError
			var se *xml.SyntaxError
			if !errors.As(err, &de) && !errors.As(err, &se) {
				t.Errorf("err = %v (%T), want a deserialization or XML syntax error", err, errors.Unwrap(err))
			}
		}},
		{fault: FaultExpired, check: func(t *testing.T, out *sts.AssumeRoleOutput, err error) {
			if err != nil {
				t.Fatal(err)
			}
			if exp := aws.ToTime(out.Credentials.Expiration); !exp.Before(time.Now()) {
				t.Errorf("Expiration = %v, want in the past", exp)
			}
		}},
		{fault: FaultEmptyKey, check: func(t *testing.T, out *sts.AssumeRoleOutput, err error) {
			if err != nil {
				t.Fatal(err)
			}
			if id := aws.ToString(out.Credentials.AccessKeyId); id != "" {
				t.Errorf("AccessKeyId = %q, want empty", id)
			}
			if aws.ToString(out.Credentials.SecretAccessKey) == "" {
				t.Error("SecretAccessKey empty; only the key id should be")
			}
		}},
	}
	for _, tc := range tests {
		t.Run(string(tc.fault), func(t *testing.T) {
			e := startEmulator(t, Config{})
			e.SetFaults(FaultPlan{Sequence: []FaultStep{{Fault: tc.fault, Count: 1}}})
			client := rootClient(e)

			out, err := client.AssumeRole(ctx, assumeInput("app"))
			if tc.wantCode != "" || tc.wantStatus >= 400 {
				if err == nil {
					t.Fatal("want an error, got success")
				}
			}
			if code := errorCode(err); code != tc.wantCode {
				t.Errorf("error code %q (%v), want %q", code, err, tc.wantCode)
			}
			if status := httpStatus(err); err != nil && status != tc.wantStatus {
				t.Errorf("HTTP status %d, want %d", status, tc.wantStatus)
			}
			if tc.check != nil {
				tc.check(t, out, err)
			}

			// The sequence had one step: the next call is normal.
			if _, err := client.AssumeRole(ctx, assumeInput("app")); err != nil {
				t.Errorf("call after the sequence: %v", err)
			}
			calls := e.Calls()
			if len(calls) != 2 || calls[0].Outcome != string(tc.fault) || calls[1].Outcome != "ok" {
				t.Errorf("calls = %+v, want outcomes [%s ok]", calls, tc.fault)
			}
		})
	}
}

func TestExpiredFaultCredentialsAreRefused(t *testing.T) {
	e := startEmulator(t, Config{})
	e.SetFaults(FaultPlan{Sequence: []FaultStep{{Fault: FaultExpired, Count: 1}}})
	out, err := rootClient(e).AssumeRole(ctx, assumeInput("app"))
	if err != nil {
		t.Fatal(err)
	}
	c := out.Credentials
	_, err = newClient(e, aws.ToString(c.AccessKeyId), aws.ToString(c.SecretAccessKey), aws.ToString(c.SessionToken)).
		GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if code := errorCode(err); code != "ExpiredToken" {
		t.Errorf("using already-expired credentials: %q (%v), want ExpiredToken", code, err)
	}
}

func TestFaultsOnGetCallerIdentity(t *testing.T) {
	tests := []struct {
		fault    Fault
		wantCode string
	}{
		{FaultExpired, "ExpiredToken"},
		{FaultEmptyKey, ""},
		{FaultInternalFailure, "InternalFailure"},
	}
	for _, tc := range tests {
		t.Run(string(tc.fault), func(t *testing.T) {
			e := startEmulator(t, Config{})
			e.SetFaults(FaultPlan{Sequence: []FaultStep{{Fault: tc.fault, Count: 1}}})
			out, err := rootClient(e).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
			if code := errorCode(err); code != tc.wantCode {
				t.Fatalf("code %q (%v), want %q", code, err, tc.wantCode)
			}
			if tc.fault == FaultEmptyKey && aws.ToString(out.UserId) != "" {
				t.Errorf("UserId = %q, want empty", aws.ToString(out.UserId))
			}
		})
	}
}

func TestHangFault(t *testing.T) {
	t.Run("client gives up", func(t *testing.T) {
		e := startEmulator(t, Config{})
		e.SetFaults(FaultPlan{Sequence: []FaultStep{{Fault: FaultHang, Count: 1}}, Hang: time.Hour})
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err := rootClient(e).AssumeRole(cctx, assumeInput("app"))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the client's deadline", err)
		}
		// The handler notices the client leaving asynchronously; wait for
		// that condition rather than for a fixed time.
		deadline := time.Now().Add(10 * time.Second)
		for e.Stats().Count("AssumeRole", "hang") != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("hang never recorded: %+v", e.Stats())
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	t.Run("answers after the hang", func(t *testing.T) {
		e := startEmulator(t, Config{})
		e.SetFaults(FaultPlan{Sequence: []FaultStep{{Fault: FaultHang, Count: 1}}, Hang: 50 * time.Millisecond})
		start := time.Now()
		if _, err := rootClient(e).AssumeRole(ctx, assumeInput("app")); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < 50*time.Millisecond {
			t.Errorf("answered after %v, before the 50ms hang ended", took)
		}
		if n := e.Stats().Count("AssumeRole", "hang"); n != 1 {
			t.Errorf("hang outcomes = %d, want 1", n)
		}
	})
	t.Run("Close releases a hang", func(t *testing.T) {
		e, err := Start(Config{})
		if err != nil {
			t.Fatal(err)
		}
		e.SetFaults(FaultPlan{Sequence: []FaultStep{{Fault: FaultHang, Count: 1}}, Hang: time.Hour})
		done := make(chan error, 1)
		go func() {
			_, err := rootClient(e).AssumeRole(ctx, assumeInput("app"))
			done <- err
		}()
		for e.Stats().Total == 0 && len(e.Faults().Sequence) == 1 {
			time.Sleep(time.Millisecond) // until the call has taken the fault
		}
		e.Close()
		select {
		case err := <-done:
			if err == nil {
				t.Error("want an error from a call cut off by Close")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not release the hanging call")
		}
	})
}

func TestFaultSequenceAndMatch(t *testing.T) {
	e := startEmulator(t, Config{})
	e.SetFaults(FaultPlan{
		Sequence: []FaultStep{{Fault: FaultThrottling, Count: 2}, {Fault: FaultInternalFailure, Count: 1}},
		Match:    "app",
	})
	client := rootClient(e)
	want := []string{"", "Throttling", "Throttling", "", "InternalFailure", "", ""}
	roles := []string{"other", "app", "app-2", "other", "my-app", "app", "other"}
	for i, role := range roles {
		_, err := client.AssumeRole(ctx, assumeInput(role))
		if code := errorCode(err); code != want[i] {
			t.Errorf("call %d (role %s): code %q (%v), want %q", i, role, code, err, want[i])
		}
	}
	// GetCallerIdentity has no RoleArn, so a Match plan never faults it.
	e.SetFaults(FaultPlan{Sequence: []FaultStep{{Fault: FaultThrottling, Count: 1}}, Match: "app"})
	if _, err := client.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
		t.Errorf("GetCallerIdentity with a Match plan: %v", err)
	}
	if got := e.Faults().Sequence; !reflect.DeepEqual(got, []FaultStep{{Fault: FaultThrottling, Count: 1}}) {
		t.Errorf("remaining sequence = %+v, want the unused step", got)
	}
	e.ClearFaults()
	if _, err := client.AssumeRole(ctx, assumeInput("app")); err != nil {
		t.Errorf("after ClearFaults: %v", err)
	}
}

func TestFaultProbability(t *testing.T) {
	tests := []struct {
		name        string
		probability map[Fault]float64
		check       func(t *testing.T, outcomes map[string]int)
	}{
		{"always", map[Fault]float64{FaultServiceUnavailable: 1}, func(t *testing.T, o map[string]int) {
			if o["ServiceUnavailable"] != 100 {
				t.Errorf("outcomes %v, want 100 ServiceUnavailable", o)
			}
		}},
		{"never", map[Fault]float64{FaultServiceUnavailable: 0}, func(t *testing.T, o map[string]int) {
			if o["ok"] != 100 {
				t.Errorf("outcomes %v, want 100 ok", o)
			}
		}},
		{"split", map[Fault]float64{FaultThrottling: 0.5, FaultInternalFailure: 0.5}, func(t *testing.T, o map[string]int) {
			// Every call draws one of the two; with a fixed seed the split is
			// reproducible, and both appear (all-one-kind has odds 2^-99).
			if o["ok"] != 0 || o["Throttling"] == 0 || o["InternalFailure"] == 0 || o["Throttling"]+o["InternalFailure"] != 100 {
				t.Errorf("outcomes %v, want only Throttling and InternalFailure, both present", o)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := startEmulator(t, Config{Seed: 42})
			e.SetFaults(FaultPlan{Probability: tc.probability})
			client := rootClient(e)
			for range 100 {
				_, _ = client.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
			}
			tc.check(t, e.Stats().ByOutcome)
		})
	}
}

func TestFaultsSkipControlAPI(t *testing.T) {
	e := startEmulator(t, Config{})
	e.SetFaults(FaultPlan{Probability: map[Fault]float64{FaultReset: 1}})
	resp, err := http.Get(e.URL() + "/_emulator/stats")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("control API status %d under a reset-everything plan", resp.StatusCode)
	}
}

func TestParseFaultPlan(t *testing.T) {
	tests := []struct {
		in      string
		want    FaultPlan
		wantErr bool
	}{
		{in: "", want: FaultPlan{}},
		{in: "Throttling:3,reset,InternalFailure=0.2,hang=5s,match=app", want: FaultPlan{
			Sequence:    []FaultStep{{Fault: FaultThrottling, Count: 3}, {Fault: FaultReset, Count: 1}},
			Probability: map[Fault]float64{FaultInternalFailure: 0.2},
			Hang:        5 * time.Second,
			Match:       "app",
		}},
		{in: `{"sequence":[{"fault":"hang","count":2}],"probability":{"malformed":0.1},"hang":"20s","match":"x"}`, want: FaultPlan{
			Sequence:    []FaultStep{{Fault: FaultHang, Count: 2}},
			Probability: map[Fault]float64{FaultMalformed: 0.1},
			Hang:        20 * time.Second,
			Match:       "x",
		}},
		{in: "Bogus:1", wantErr: true},
		{in: "Throttling:x", wantErr: true},
		{in: "Throttling=1.5", wantErr: true},
		{in: "Throttling=0.6,reset=0.6", wantErr: true},
		{in: "hang=forever", wantErr: true},
		{in: `{"sequence":[{"fault":"nope","count":1}]}`, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseFaultPlan(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if !tc.wantErr && !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
