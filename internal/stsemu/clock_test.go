package stsemu

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// The emulator's clock, offset from its host's, is AWS's one clock: it
// dates every answer (errors too), issues and expires by it, and checks
// signatures against it.
func TestClockOffset_DatesIssuesAndExpires(t *testing.T) {
	clk := newFakeClock()
	e := startEmulator(t, Config{Now: clk.Now, SigningNow: time.Now, ClockOffset: 90 * time.Second})
	out, err := rootClient(e).AssumeRole(ctx, assumeInput("app"))
	if err != nil {
		t.Fatal(err)
	}
	want := clk.Now().Add(90 * time.Second)
	// Dated by the signing clock (real time here) plus the offset.
	if date, ok := awsmiddleware.GetServerTime(out.ResultMetadata); !ok || time.Until(date) < 88*time.Second || time.Until(date) > 91*time.Second {
		t.Fatalf("Date = %v (%v), want the emulator's signing clock, 90 s ahead of this host's", date, ok)
	}
	if exp := aws.ToTime(out.Credentials.Expiration); !exp.Equal(want.Add(time.Hour).Truncate(time.Millisecond)) {
		t.Fatalf("Expiration = %v, want an hour after the emulator's clock (%v)", exp, want.Add(time.Hour))
	}

	// Stepped back while it runs: the next answer follows.
	e.SetClockOffset(-4 * time.Minute)
	out, err = rootClient(e).AssumeRole(ctx, assumeInput("app"))
	if err != nil {
		t.Fatal(err)
	}
	if exp := aws.ToTime(out.Credentials.Expiration); !exp.Equal(clk.Now().Add(-4*time.Minute + time.Hour).Truncate(time.Millisecond)) {
		t.Fatalf("after the step, Expiration = %v", exp)
	}
	// The issued credential expires by the emulator's clock: 4 minutes
	// left by it, until the clock steps 5 minutes ahead.
	c := newClient(e, aws.ToString(out.Credentials.AccessKeyId), aws.ToString(out.Credentials.SecretAccessKey), aws.ToString(out.Credentials.SessionToken))
	clk.Advance(56 * time.Minute)
	if _, err := c.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
		t.Fatalf("by the emulator's clock the credential has 4 minutes left: %v", err)
	}
	e.SetClockOffset(time.Minute)
	if _, err := c.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); errorCode(err) != "ExpiredToken" {
		t.Fatalf("a minute past its expiry by the stepped clock: %v, want ExpiredToken", err)
	}
}

// A signature 10 minutes off the emulator's clock is refused with STS's
// words, in an answer dated by that clock, from which a client corrects
// its signing clock: the SDK's own correction (on here) succeeds with the
// next call.
func TestClockOffset_SignatureSkewAndCorrection(t *testing.T) {
	e := startEmulator(t, Config{ClockOffset: -10 * time.Minute})
	c := rootClient(e)
	_, err := c.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if code, status := errorCode(err), httpStatus(err); code != "SignatureDoesNotMatch" || status != http.StatusForbidden ||
		!strings.Contains(err.Error(), "Signature not yet current:") || !strings.Contains(err.Error(), " + 5 min.)") {
		t.Fatalf("signed 10 minutes ahead of the emulator: %v (%s/%d), want 403 SignatureDoesNotMatch \"Signature not yet current ... + 5 min.)\"", err, code, status)
	}
	if _, err := c.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
		t.Fatalf("the SDK corrects its clock by the error's Date: %v", err)
	}
}

func TestClockOffset_SkewTolerance(t *testing.T) {
	e := startEmulator(t, Config{ClockOffset: 10 * time.Minute, SkewTolerance: 15 * time.Minute})
	if _, err := rootClient(e).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
		t.Fatalf("10 minutes off with a 15-minute tolerance: %v", err)
	}
	e = startEmulator(t, Config{ClockOffset: 16 * time.Minute, SkewTolerance: 15 * time.Minute})
	if _, err := rootClient(e).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err == nil || !strings.Contains(err.Error(), " - 15 min.)") {
		t.Fatalf("16 minutes off with a 15-minute tolerance: %v, want \"- 15 min.)\"", err)
	}
}

func TestClockOffset_ControlAPI(t *testing.T) {
	e := startEmulator(t, Config{})
	var cv ConfigView
	postJSON(t, e, "/_emulator/config", `{"clock_offset":"-4m"}`, 200, &cv)
	if cv.ClockOffset != "-4m0s" || e.ClockOffset() != -4*time.Minute || cv.SkewTolerance != "5m0s" {
		t.Fatalf("after clock_offset -4m: view %+v, offset %s", cv, e.ClockOffset())
	}
	postJSON(t, e, "/_emulator/config", `{"clock_offset":"soon"}`, 400, nil)
	if e.ClockOffset() != -4*time.Minute {
		t.Fatalf("a bad clock_offset changed it to %s", e.ClockOffset())
	}
	resp, err := http.Get(e.URL() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	date, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		t.Fatalf("answer without a Date: %v", err)
	}
	if d := time.Until(date); d > -3*time.Minute || d < -5*time.Minute {
		t.Fatalf("an STS answer dated %v, %s from now; want the emulator's clock, 4 minutes behind", date, d)
	}
}
