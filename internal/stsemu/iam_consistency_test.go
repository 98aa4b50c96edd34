package stsemu

import (
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// acceptance returns, for n GetCallerIdentity calls with the key, which
// were accepted ('+') and which refused with InvalidClientTokenId ('-').
func acceptance(t *testing.T, e *Emulator, id, secret string, n int) string {
	t.Helper()
	c := newClient(e, id, secret, "")
	return pattern(t, "GetCallerIdentity", n, func() error {
		_, err := c.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
		return err
	})
}

// pattern makes n calls of action with call and returns which succeeded
// ('+') and which were refused with InvalidClientTokenId ('-'); any other
// error fails t.
func pattern(t *testing.T, action string, n int, call func() error) string {
	t.Helper()
	var out []byte
	for range n {
		switch err := call(); {
		case err == nil:
			out = append(out, '+')
		case errorCode(err) == "InvalidClientTokenId":
			out = append(out, '-')
		default:
			t.Fatalf("%s: %v", action, err)
		}
	}
	return string(out)
}

// TestIAMInconsistencyWindow: after the propagation delay, a new key is
// accepted by some calls and refused by others until the window ends, in
// an order that the seed fixes; then it is always accepted.
func TestIAMInconsistencyWindow(t *testing.T) {
	run := func(seed uint64) (inWindow, after string, view IAMAccessKey) {
		clock := newFakeClock()
		e := startEmulator(t, Config{Now: clock.Now, SigningNow: time.Now, Seed: seed, IAMPropagation: time.Second,
			IAMWindows: IAMWindows{Inconsistency: 10 * time.Second, Refusal: 0.5}})
		id, secret := createKey(t, e)
		if got := acceptance(t, e, id, secret, 3); got != "---" {
			t.Fatalf("during propagation: %s, want every call refused", got)
		}
		clock.Advance(time.Second) // propagated: the window starts
		inWindow = acceptance(t, e, id, secret, 40)
		clock.Advance(10*time.Second - time.Nanosecond)
		inWindow += acceptance(t, e, id, secret, 20)
		clock.Advance(time.Nanosecond) // the window is over
		after = acceptance(t, e, id, secret, 20)
		for _, k := range e.IAMUsers()[0].AccessKeys {
			if k.AccessKeyID == id {
				view = k
			}
		}
		if got, want := view.SettledAt.Sub(view.CreateDate), 11*time.Second; got != want {
			t.Errorf("settled_at is %s after creation, want %s", got, want)
		}
		return inWindow, after, view
	}
	in1, after1, _ := run(42)
	var accepted, refused int
	for _, c := range in1 {
		if c == '+' {
			accepted++
		} else {
			refused++
		}
	}
	// 60 draws at 0.5: both outcomes, neither overwhelming.
	if accepted < 15 || refused < 15 {
		t.Errorf("in the window %d accepted and %d refused (%s), want a mix", accepted, refused, in1)
	}
	if after1 != "++++++++++++++++++++" {
		t.Errorf("after the window: %s, want every call accepted", after1)
	}
	if in2, _, _ := run(42); in2 != in1 {
		t.Errorf("the same seed drew %s, then %s", in1, in2)
	}
	if in3, _, _ := run(43); in3 == in1 {
		t.Errorf("seeds 42 and 43 drew the same %s", in1)
	}
}

// TestIAMInconsistencyRefusalBounds: probability 1 refuses every call of
// the window, and no window means none is refused; the configured key
// never has a window.
func TestIAMInconsistencyRefusalBounds(t *testing.T) {
	clock := newFakeClock()
	e := startEmulator(t, Config{Now: clock.Now, SigningNow: time.Now, Seed: 1, IAMWindows: IAMWindows{Inconsistency: time.Minute, Refusal: 1}})
	id, secret := createKey(t, e)
	if got := acceptance(t, e, id, secret, 5); got != "-----" {
		t.Errorf("refusal 1: %s", got)
	}
	if got := acceptance(t, e, DefaultAccessKey, DefaultSecretKey, 5); got != "+++++" {
		t.Errorf("the configured key: %s", got)
	}
	e.SetIAMWindows(IAMWindows{}) // applies to keys made from now on
	if got := acceptance(t, e, id, secret, 3); got != "---" {
		t.Errorf("a key made under the window keeps it: %s", got)
	}
	if _, err := rootIAM(e).DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(id)}); err != nil {
		t.Fatal(err)
	}
	id2, secret2 := createKey(t, e)
	if got := acceptance(t, e, id2, secret2, 5); got != "+++++" {
		t.Errorf("a key made without a window: %s", got)
	}
}

// TestIAMRevocationWindow: a deleted key is unlisted and no longer counts
// against the quota at once, cannot be deleted again, but still signs STS
// and IAM calls until the revocation delay has passed.
func TestIAMRevocationWindow(t *testing.T) {
	clock := newFakeClock()
	e := startEmulator(t, Config{Now: clock.Now, SigningNow: time.Now, IAMWindows: IAMWindows{Revocation: 5 * time.Second}})
	id, secret := createKey(t, e)
	if _, err := newIAMClient(e, id, secret, "").DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(DefaultAccessKey)}); err != nil {
		t.Fatalf("deleting the configured key with the new one: %v", err)
	}
	if got := keyStatuses(t, e); !reflect.DeepEqual(got, []string{id + "=Active"}) {
		t.Errorf("after the delete the user lists %v", got)
	}
	_, err := newIAMClient(e, id, secret, "").DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(DefaultAccessKey)})
	if errorCode(err) != "NoSuchEntity" {
		t.Errorf("deleting it again: %v, want NoSuchEntity", err)
	}
	// A second key fits: the deleted one no longer counts.
	id3, _ := createKey(t, e)
	clock.Advance(5*time.Second - time.Nanosecond)
	wantAccepted(t, e, DefaultAccessKey, DefaultSecretKey)
	clock.Advance(time.Nanosecond)
	wantRejected(t, e, DefaultAccessKey, DefaultSecretKey)
	if got := len(e.IAMUsers()[0].AccessKeys); got != 2 {
		t.Errorf("the user has %d keys (%s and %s expected)", got, id, id3)
	}
}

// TestIAMWindowsControlAPI sets the windows over the control API.
func TestIAMWindowsControlAPI(t *testing.T) {
	e := startEmulator(t, Config{})
	var cv ConfigView
	postJSON(t, e, "/_emulator/config", `{"iam_inconsistency":"3s","iam_inconsistency_refusal":0.25,"iam_revocation":"2s"}`, 200, &cv)
	if cv.IAMInconsistency != "3s" || cv.IAMInconsistencyRefusal != 0.25 || cv.IAMRevocation != "2s" {
		t.Errorf("config view %+v", cv)
	}
	if got, want := e.IAMWindows(), (IAMWindows{Inconsistency: 3 * time.Second, Refusal: 0.25, Revocation: 2 * time.Second}); got != want {
		t.Errorf("windows %+v, want %+v", got, want)
	}
	for _, bad := range []string{`{"iam_inconsistency_refusal":1.5}`, `{"iam_revocation":"-1s"}`, `{"iam_inconsistency":"x"}`} {
		postJSON(t, e, "/_emulator/config", bad, 400, nil)
	}
	if got := e.IAMWindows(); got.Refusal != 0.25 {
		t.Errorf("a refused update changed the windows: %+v", got)
	}
}

// postJSON posts body to the control API path and decodes the answer into
// out (when not nil), failing unless the status is want.
func postJSON(t *testing.T, e *Emulator, path, body string, want int, out any) {
	t.Helper()
	resp, err := http.Post(e.URL()+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("POST %s %s: status %d (%s), want %d", path, body, resp.StatusCode, raw, want)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatal(err)
		}
	}
}

// issuing returns, for n AssumeRole calls signed with the key, which were
// served ('+') and which refused with InvalidClientTokenId ('-').
func issuing(t *testing.T, e *Emulator, id, secret string, n int) string {
	t.Helper()
	c := newClient(e, id, secret, "")
	return pattern(t, "AssumeRole", n, func() error {
		_, err := c.AssumeRole(ctx, assumeInput("app"))
		return err
	})
}

// refusalsLeft is the key's refusals_left in the control API's view.
func refusalsLeft(t *testing.T, e *Emulator, id string) int {
	t.Helper()
	for _, u := range e.IAMUsers() {
		for _, k := range u.AccessKeys {
			if k.AccessKeyID == id {
				return k.RefusalsLeft
			}
		}
	}
	t.Fatalf("no key %s", id)
	return 0
}

// TestIAMRefuseFirst: with RefuseFirst 3, the first three calls issuing
// credentials with a new key, once it propagated, are refused whenever they
// come, whichever of the three actions they are; calls refused for another
// reason (not propagated yet, a bad signature) and GetCallerIdentity do
// not count; the configured key and keys made without the setting are
// never refused; the control API sets and shows it.
func TestIAMRefuseFirst(t *testing.T) {
	clock := newFakeClock()
	e := startEmulator(t, Config{Now: clock.Now, SigningNow: time.Now, IAMPropagation: time.Second,
		IAMWindows: IAMWindows{RefuseFirst: 3}})
	id, secret := createKey(t, e)
	if got := issuing(t, e, id, secret, 2); got != "--" {
		t.Fatalf("before propagation: %s, want refused", got)
	}
	if n := refusalsLeft(t, e, id); n != 3 {
		t.Fatalf("propagation's refusals counted: %d left, want 3", n)
	}
	clock.Advance(time.Hour) // long past any window: the count has no end in time
	if got := acceptance(t, e, id, secret, 2); got != "++" {
		t.Errorf("GetCallerIdentity: %s, want accepted (a rotation's verification passes)", got)
	}
	_, err := newClient(e, id, "not-the-secret", "").AssumeRole(ctx, assumeInput("app"))
	if errorCode(err) != "SignatureDoesNotMatch" {
		t.Errorf("a mis-signed AssumeRole: %v, want SignatureDoesNotMatch", err)
	}
	if n := refusalsLeft(t, e, id); n != 3 {
		t.Fatalf("after GetCallerIdentity and a bad signature %d refusals left, want 3", n)
	}

	c := newClient(e, id, secret, "")
	_, err = c.GetSessionToken(ctx, &sts.GetSessionTokenInput{})
	if errorCode(err) != "InvalidClientTokenId" {
		t.Errorf("first GetSessionToken: %v, want InvalidClientTokenId", err)
	}
	_, err = c.GetFederationToken(ctx, &sts.GetFederationTokenInput{Name: aws.String("fed")})
	if errorCode(err) != "InvalidClientTokenId" {
		t.Errorf("first GetFederationToken: %v, want InvalidClientTokenId", err)
	}
	if got := issuing(t, e, id, secret, 3); got != "-++" {
		t.Errorf("AssumeRole after two refusals: %s, want the third refused, then served", got)
	}
	if _, err := c.GetSessionToken(ctx, &sts.GetSessionTokenInput{}); err != nil {
		t.Errorf("GetSessionToken after the refusals: %v", err)
	}
	if n := refusalsLeft(t, e, id); n != 0 {
		t.Errorf("%d refusals left, want 0", n)
	}
	var refused int
	for _, call := range e.Calls() {
		if call.AccessKeyID == id && call.Outcome == "InvalidClientTokenId" && issuingActions[call.Action] {
			refused++
		}
	}
	if refused != 5 { // 2 before propagation, 3 counted
		t.Errorf("the call log has %d refused issuing calls with the key, want 5", refused)
	}

	if got := issuing(t, e, DefaultAccessKey, DefaultSecretKey, 3); got != "+++" {
		t.Errorf("the configured key: %s, want never refused", got)
	}

	// The control API: the setting applies to keys made from now on.
	var cv ConfigView
	postJSON(t, e, "/_emulator/config", `{"iam_refuse_first":1}`, 200, &cv)
	if cv.IAMRefuseFirst != 1 || e.IAMWindows().RefuseFirst != 1 {
		t.Errorf("config view %+v, windows %+v; want iam_refuse_first 1", cv, e.IAMWindows())
	}
	postJSON(t, e, "/_emulator/config", `{"iam_refuse_first":-1}`, 400, nil)
	if _, err := rootIAM(e).DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(id)}); err != nil {
		t.Fatal(err)
	}
	id2, secret2 := createKey(t, e)
	clock.Advance(time.Second)
	if got := issuing(t, e, id2, secret2, 2); got != "-+" {
		t.Errorf("a key made with iam_refuse_first 1: %s, want one refusal", got)
	}
	e.SetIAMWindows(IAMWindows{})
	if _, err := rootIAM(e).DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(id2)}); err != nil {
		t.Fatal(err)
	}
	id3, secret3 := createKey(t, e)
	clock.Advance(time.Second)
	if got := issuing(t, e, id3, secret3, 2); got != "++" {
		t.Errorf("a key made without the setting: %s, want never refused", got)
	}
}
