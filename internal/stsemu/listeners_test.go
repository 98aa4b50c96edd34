package stsemu

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// clientAt is the real SDK's STS client pointed at url, SDK retries off.
func clientAt(url, akid, secret, token string) *sts.Client {
	return sts.New(sts.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(url),
		Credentials:  credentials.NewStaticCredentialsProvider(akid, secret, token),
		Retryer:      aws.NopRetryer{},
	})
}

// controlAt sends a control API request to the listener at url and
// returns the status and body.
func controlAt(t *testing.T, url, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url+"/_emulator/"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s through %s: %v", method, path, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestListenersShareState: a second listener is the same STS and IAM: a
// credential issued through one works through the other, and so does a key
// created through one; the call log names the listener of every call.
func TestListenersShareState(t *testing.T) {
	e := startEmulator(t, Config{})
	primary := e.URL()
	second, err := e.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if second == primary {
		t.Fatalf("the second listener has the first's URL %s", second)
	}

	out, err := clientAt(primary, DefaultAccessKey, DefaultSecretKey, "").AssumeRole(ctx, assumeInput("app"))
	if err != nil {
		t.Fatalf("AssumeRole through the first listener: %v", err)
	}
	c := out.Credentials
	id, err := clientAt(second, aws.ToString(c.AccessKeyId), aws.ToString(c.SecretAccessKey), aws.ToString(c.SessionToken)).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if err != nil {
		t.Fatalf("the credential issued through the first listener, used through the second: %v", err)
	}
	if !strings.Contains(aws.ToString(id.Arn), ":assumed-role/app/") {
		t.Fatalf("GetCallerIdentity through the second listener: Arn %s", aws.ToString(id.Arn))
	}

	// IAM: a key created through the second signs through the first.
	key, err := iam.New(iam.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(second),
		Credentials: credentials.NewStaticCredentialsProvider(DefaultAccessKey, DefaultSecretKey, ""), Retryer: aws.NopRetryer{},
	}).CreateAccessKey(ctx, &iam.CreateAccessKeyInput{})
	if err != nil {
		t.Fatalf("CreateAccessKey through the second listener: %v", err)
	}
	if _, err := clientAt(primary, aws.ToString(key.AccessKey.AccessKeyId), aws.ToString(key.AccessKey.SecretAccessKey), "").GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
		t.Fatalf("a key created through the second listener, used through the first: %v", err)
	}

	ls := e.Listeners()
	if len(ls) != 2 || ls[0].URL != primary || ls[1].URL != second || ls[0].State != ListenerUp || ls[1].State != ListenerUp {
		t.Fatalf("Listeners() = %+v", ls)
	}
	var got []string
	for _, call := range e.Calls() {
		got = append(got, call.Action+"@"+call.Listener)
	}
	want := []string{"AssumeRole@" + ls[0].Addr, "GetCallerIdentity@" + ls[1].Addr, "CreateAccessKey@" + ls[1].Addr, "GetCallerIdentity@" + ls[0].Addr}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("calls by listener:\n got %v\nwant %v", got, want)
	}
}

// TestListenerRefused: a refused listener refuses connections and cuts the
// open ones, and serves again on the same URL when brought back up; the
// other listener serves throughout and carries the control API.
func TestListenerRefused(t *testing.T) {
	e := startEmulator(t, Config{})
	primary := e.URL()
	second, err := e.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(primary, "http://")

	// A keep-alive connection opened before the outage.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	// Refusing a listener through itself would cut the request's own
	// answer: refused, with what to do.
	if code, body := controlAt(t, primary, http.MethodPost, "listeners", `{"addr":"`+addr+`","state":"refused"}`); code != http.StatusBadRequest || !strings.Contains(string(body), "through another listener") {
		t.Fatalf("refusing the listener through itself: %d %s", code, body)
	}
	code, body := controlAt(t, second, http.MethodPost, "listeners", `{"addr":"`+primary+`","state":"refused"}`)
	if code != http.StatusOK {
		t.Fatalf("refusing through the other listener: %d %s", code, body)
	}
	var ls []ListenerView
	if err := json.Unmarshal(body, &ls); err != nil || len(ls) != 2 || ls[0].State != ListenerRefused || ls[1].State != ListenerUp {
		t.Fatalf("listeners after the refusal: %s (%v)", body, err)
	}

	if _, err := net.Dial("tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dialling the refused listener: %v, want connection refused", err)
	}
	// The connection opened before is cut: a read ends at once.
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection to the refused listener is still open")
	}
	if _, err := rootClient(e).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err == nil {
		t.Fatal("an STS call to the refused listener succeeded")
	}
	if _, err := clientAt(second, DefaultAccessKey, DefaultSecretKey, "").GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
		t.Fatalf("the other listener during the outage: %v", err)
	}

	if code, body := controlAt(t, second, http.MethodPost, "listeners", `{"addr":"`+addr+`","state":"up"}`); code != http.StatusOK {
		t.Fatalf("bringing it back up: %d %s", code, body)
	}
	if _, err := rootClient(e).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
		t.Fatalf("the listener back up, same URL: %v", err)
	}
	// Nothing reached the refused listener: one call before nothing, one
	// through the other listener, one after.
	var got []string
	for _, c := range e.Calls() {
		got = append(got, c.Outcome+"@"+c.Listener)
	}
	if want := "ok@" + strings.TrimPrefix(second, "http://") + " ok@" + addr; strings.Join(got, " ") != want {
		t.Fatalf("calls %v, want %s", got, want)
	}
}

// TestListenerUnavailable: an unavailable listener answers every STS and
// IAM call 503 ServiceUnavailable, recorded under its address, without
// using the fault plan; its control API still answers.
func TestListenerUnavailable(t *testing.T) {
	e := startEmulator(t, Config{})
	primary := e.URL()
	second, err := e.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SetListenerState(primary, ListenerUnavailable); err != nil {
		t.Fatal(err)
	}
	e.SetFaults(FaultPlan{Sequence: []FaultStep{{Fault: FaultThrottling, Count: 1}}})

	_, err = rootClient(e).AssumeRole(ctx, assumeInput("app"))
	if errorCode(err) != "ServiceUnavailable" || httpStatus(err) != http.StatusServiceUnavailable {
		t.Fatalf("AssumeRole through the unavailable listener: %v, want 503 ServiceUnavailable", err)
	}
	if _, err := rootIAM(e).ListAccessKeys(ctx, &iam.ListAccessKeysInput{}); errorCode(err) != "ServiceUnavailable" {
		t.Fatalf("IAM through the unavailable listener: %v, want ServiceUnavailable", err)
	}
	// The plan's one Throttling was not used by the outage.
	other := clientAt(second, DefaultAccessKey, DefaultSecretKey, "")
	if _, err := other.AssumeRole(ctx, assumeInput("app")); errorCode(err) != "Throttling" {
		t.Fatalf("the first call through the other listener: %v, want the plan's Throttling", err)
	}
	if _, err := other.AssumeRole(ctx, assumeInput("app")); err != nil {
		t.Fatalf("the other listener: %v", err)
	}
	if code, body := controlAt(t, primary, http.MethodGet, "listeners", ""); code != http.StatusOK || !strings.Contains(string(body), `"unavailable"`) {
		t.Fatalf("the control API through the unavailable listener: %d %s", code, body)
	}

	if err := e.SetListenerState(primary, ListenerUp); err != nil {
		t.Fatal(err)
	}
	if _, err := rootClient(e).AssumeRole(ctx, assumeInput("app")); err != nil {
		t.Fatalf("back up: %v", err)
	}
	pa, sa := strings.TrimPrefix(primary, "http://"), strings.TrimPrefix(second, "http://")
	var got []string
	for _, c := range e.Calls() {
		got = append(got, c.Action+":"+c.Outcome+"@"+c.Listener)
	}
	want := []string{"AssumeRole:ServiceUnavailable@" + pa, "ListAccessKeys:ServiceUnavailable@" + pa,
		"AssumeRole:Throttling@" + sa, "AssumeRole:ok@" + sa, "AssumeRole:ok@" + pa}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("calls:\n got %v\nwant %v", got, want)
	}
}

// TestListenerStateErrors: an unknown state or address says what to do.
func TestListenerStateErrors(t *testing.T) {
	e := startEmulator(t, Config{})
	for _, tc := range []struct{ addr, state, says string }{
		{e.URL(), "down", `want up, refused or unavailable`},
		{"127.0.0.1:1", ListenerRefused, "GET /_emulator/listeners lists them"},
	} {
		code, body := controlAt(t, e.URL(), http.MethodPost, "listeners", `{"addr":"`+tc.addr+`","state":"`+tc.state+`"}`)
		if code != http.StatusBadRequest || !strings.Contains(string(body), tc.says) {
			t.Errorf("%s %s: %d %s, want 400 saying %q", tc.addr, tc.state, code, body, tc.says)
		}
	}
	if code, _ := controlAt(t, e.URL(), http.MethodDelete, "listeners", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("DELETE listeners: %d, want 405", code)
	}
	e.Close()
	if _, err := e.Listen("127.0.0.1:0"); err == nil {
		t.Error("Listen after Close succeeded")
	}
}
