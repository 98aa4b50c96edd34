package stsemu

import (
	"encoding/xml"
	"errors"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/smithy-go"
)

// TestFaultPlanSelectsCalls checks which calls a plan applies to: STS only
// without Actions (as plans always did), else what Actions names.
func TestFaultPlanSelectsCalls(t *testing.T) {
	tests := []struct {
		name    string
		actions []string
		wantSTS bool // GetCallerIdentity faulted
		wantIAM bool // CreateAccessKey faulted
		wantGet bool // GetUser faulted
	}{
		{"no Actions: STS only", nil, true, false, false},
		{"one IAM action", []string{"CreateAccessKey"}, false, true, false},
		{"service-scoped action", []string{"iam:CreateAccessKey"}, false, true, false},
		{"every IAM call", []string{"iam:*"}, false, true, true},
		{"every STS call", []string{"sts:*"}, true, false, false},
		{"everything", []string{"*"}, true, true, true},
		{"a mix", []string{"GetCallerIdentity", "iam:GetUser"}, true, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := startEmulator(t, Config{})
			e.SetFaults(FaultPlan{Probability: map[Fault]float64{FaultServiceUnavailable: 1}, Actions: tc.actions})
			_, err := rootClient(e).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
			if got := errorCode(err) == "ServiceUnavailable"; got != tc.wantSTS {
				t.Errorf("GetCallerIdentity faulted %v (%v), want %v", got, err, tc.wantSTS)
			}
			_, err = rootIAM(e).CreateAccessKey(ctx, &iam.CreateAccessKeyInput{})
			if got := errorCode(err) == "ServiceUnavailable"; got != tc.wantIAM {
				t.Errorf("CreateAccessKey faulted %v (%v), want %v", got, err, tc.wantIAM)
			}
			_, err = rootIAM(e).GetUser(ctx, &iam.GetUserInput{})
			if got := errorCode(err) == "ServiceUnavailable"; got != tc.wantGet {
				t.Errorf("GetUser faulted %v (%v), want %v", got, err, tc.wantGet)
			}
		})
	}

	t.Run("unselected calls do not use up the sequence", func(t *testing.T) {
		e := startEmulator(t, Config{})
		e.SetFaults(FaultPlan{Sequence: []FaultStep{{Fault: FaultThrottling, Count: 1}}, Actions: []string{"DeleteAccessKey"}})
		for range 3 {
			if _, err := rootIAM(e).GetUser(ctx, &iam.GetUserInput{}); err != nil {
				t.Fatal(err)
			}
		}
		id, _ := createKey(t, e)
		_, err := rootIAM(e).DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(id)})
		if code := errorCode(err); code != "Throttling" {
			t.Errorf("DeleteAccessKey: %q (%v), want the Throttling step", code, err)
		}
		if n := len(keyStatuses(t, e)); n != 2 {
			t.Errorf("%d keys, want 2: a faulted delete deletes nothing", n)
		}
	})

	t.Run("Match leaves IAM calls alone", func(t *testing.T) {
		e := startEmulator(t, Config{})
		e.SetFaults(FaultPlan{Probability: map[Fault]float64{FaultInternalFailure: 1}, Match: "app", Actions: []string{"*"}})
		if _, err := rootIAM(e).GetUser(ctx, &iam.GetUserInput{}); err != nil {
			t.Errorf("GetUser: %v; IAM calls have no RoleArn to match", err)
		}
	})

	t.Run("unknown action selector", func(t *testing.T) {
		for _, sel := range []string{"ListUsers", "iam:AssumeRole", "s3:*", "iam:"} {
			if err := (FaultPlan{Actions: []string{sel}}).Validate(); err == nil {
				t.Errorf("Validate accepted action %q", sel)
			}
		}
	})
}

// TestIAMFaults runs every fault kind on CreateAccessKey with the SDK and
// checks what the client sees and whether a key was made.
func TestIAMFaults(t *testing.T) {
	tests := []struct {
		fault      Fault
		wantCode   string
		wantStatus int
		wantKeys   int // keys on the user afterwards
		check      func(t *testing.T, out *iam.CreateAccessKeyOutput, err error)
	}{
		{fault: FaultThrottling, wantCode: "Throttling", wantStatus: 400, wantKeys: 1},
		{fault: FaultRequestLimitExceeded, wantCode: "RequestLimitExceeded", wantStatus: 400, wantKeys: 1},
		{fault: FaultInternalFailure, wantCode: "InternalFailure", wantStatus: 500, wantKeys: 1},
		{fault: FaultServiceUnavailable, wantCode: "ServiceUnavailable", wantStatus: 503, wantKeys: 1},
		{fault: FaultAccessDenied, wantCode: "AccessDenied", wantStatus: 403, wantKeys: 1, check: func(t *testing.T, _ *iam.CreateAccessKeyOutput, err error) {
			want := "User: arn:aws:iam::123456789012:user/sts-emulator is not authorized to perform: iam:CreateAccessKey on resource: user sts-emulator " +
				"because no identity-based policy allows the iam:CreateAccessKey action"
			if !strings.Contains(err.Error(), want) {
				t.Errorf("message %q, want IAM's %q", err, want)
			}
		}},
		{fault: FaultReset, wantKeys: 1, check: func(t *testing.T, _ *iam.CreateAccessKeyOutput, err error) {
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("err = %v, want connection reset by peer", err)
			}
		}},
		{fault: FaultResetAfter, wantKeys: 2, check: func(t *testing.T, _ *iam.CreateAccessKeyOutput, err error) {
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("err = %v, want connection reset by peer", err)
			}
		}},
		{fault: FaultMalformed, wantStatus: 200, wantKeys: 1, check: func(t *testing.T, _ *iam.CreateAccessKeyOutput, err error) {
			var de *smithy.DeserializationError
			var se *xml.SyntaxError
			if !errors.As(err, &de) && !errors.As(err, &se) {
				t.Errorf("err = %v (%T), want a deserialization or XML syntax error", err, errors.Unwrap(err))
			}
		}},
		{fault: FaultExpired, wantCode: "ExpiredToken", wantStatus: 400, wantKeys: 1},
		{fault: FaultEmptyKey, wantKeys: 2, check: func(t *testing.T, out *iam.CreateAccessKeyOutput, err error) {
			if err != nil {
				t.Fatal(err)
			}
			if id := aws.ToString(out.AccessKey.AccessKeyId); id != "" {
				t.Errorf("AccessKeyId = %q, want empty", id)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(string(tc.fault), func(t *testing.T) {
			e := startEmulator(t, Config{})
			e.SetFaults(FaultPlan{Sequence: []FaultStep{{Fault: tc.fault, Count: 1}}, Actions: []string{"CreateAccessKey"}})
			out, err := rootIAM(e).CreateAccessKey(ctx, &iam.CreateAccessKeyInput{})
			if tc.wantStatus >= 400 && err == nil {
				t.Fatal("want an error, got success")
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
			if got := e.IAMUsers()[0].AccessKeys; len(got) != tc.wantKeys {
				t.Errorf("%d keys after the call, want %d", len(got), tc.wantKeys)
			}
			if calls := e.Calls(); len(calls) != 1 || calls[0].Action != "CreateAccessKey" || calls[0].Outcome != string(tc.fault) {
				t.Errorf("calls = %+v, want one CreateAccessKey with outcome %s", calls, tc.fault)
			}
		})
	}
}

// TestIAMMalformedOnEveryAction checks the truncated documents: the actions
// with a result fail to parse, the two without one pass, as with AWS.
func TestIAMMalformedOnEveryAction(t *testing.T) {
	e := startEmulator(t, Config{})
	e.SetFaults(FaultPlan{Probability: map[Fault]float64{FaultMalformed: 1}, Actions: []string{"iam:*"}})
	root := rootIAM(e)
	calls := map[string]func() error{
		"GetUser": func() error { _, err := root.GetUser(ctx, &iam.GetUserInput{}); return err },
		"ListAccessKeys": func() error {
			_, err := root.ListAccessKeys(ctx, &iam.ListAccessKeysInput{})
			return err
		},
		"CreateAccessKey": func() error {
			_, err := root.CreateAccessKey(ctx, &iam.CreateAccessKeyInput{})
			return err
		},
	}
	for name, call := range calls {
		if err := call(); err == nil {
			t.Errorf("%s: a truncated document parsed as success", name)
		}
	}
	// The SDK ignores the body of DeleteAccessKey; a truncated one is a 200.
	_, err := root.DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(DefaultAccessKey)})
	if err != nil && !strings.Contains(err.Error(), "deserializ") {
		t.Errorf("DeleteAccessKey: %v", err)
	}
}

func TestParseFaultPlanActions(t *testing.T) {
	p, err := ParseFaultPlan("reset_after:1,InternalFailure=0.5,action=CreateAccessKey,action=iam:DeleteAccessKey")
	if err != nil {
		t.Fatal(err)
	}
	want := FaultPlan{
		Sequence:    []FaultStep{{Fault: FaultResetAfter, Count: 1}},
		Probability: map[Fault]float64{FaultInternalFailure: 0.5},
		Actions:     []string{"CreateAccessKey", "iam:DeleteAccessKey"},
	}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("got %+v, want %+v", p, want)
	}
	if _, err := ParseFaultPlan(`{"sequence":[{"fault":"reset","count":1}],"actions":["iam:*","sts:AssumeRole","*"]}`); err != nil {
		t.Errorf("JSON plan with actions: %v", err)
	}
	for _, bad := range []string{"reset,action=ListUsers", `{"actions":["sts:GetUser"]}`} {
		if _, err := ParseFaultPlan(bad); err == nil {
			t.Errorf("ParseFaultPlan(%q) accepted an unknown action", bad)
		}
	}
}
