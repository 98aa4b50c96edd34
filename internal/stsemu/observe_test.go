package stsemu

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

func TestStatsAndCalls(t *testing.T) {
	clock := newFakeClock()
	e := startEmulator(t, Config{Now: clock.Now})
	client := rootClient(e)
	role, err := client.AssumeRole(ctx, assumeInput("app"))
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	_, _ = newClient(e, DefaultAccessKey, "wrong", "").GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	c := role.Credentials
	if _, err := newClient(e, aws.ToString(c.AccessKeyId), aws.ToString(c.SecretAccessKey), aws.ToString(c.SessionToken)).
		GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
		t.Fatal(err)
	}

	s := e.Stats()
	wantByAction := map[string]map[string]int{
		"AssumeRole":        {"ok": 1},
		"GetCallerIdentity": {"SignatureDoesNotMatch": 1, "ok": 1},
	}
	if s.Total != 3 || !reflect.DeepEqual(s.ByAction, wantByAction) ||
		!reflect.DeepEqual(s.ByOutcome, map[string]int{"ok": 2, "SignatureDoesNotMatch": 1}) {
		t.Errorf("stats = %+v", s)
	}
	sec := clock.Now().Unix()
	wantTimeline := []Second{
		{Second: sec - 1, Outcomes: map[string]int{"ok": 1}},
		{Second: sec, Outcomes: map[string]int{"ok": 1, "SignatureDoesNotMatch": 1}},
	}
	if !reflect.DeepEqual(s.Timeline, wantTimeline) {
		t.Errorf("timeline = %+v, want %+v", s.Timeline, wantTimeline)
	}
	if n := s.Count("GetCallerIdentity", ""); n != 2 {
		t.Errorf("Count(GetCallerIdentity) = %d, want 2", n)
	}

	calls := e.Calls()
	ln := strings.TrimPrefix(e.URL(), "http://")
	want := []Call{
		{Seq: 1, Action: "AssumeRole", Outcome: "ok", RoleArn: "arn:aws:iam::123456789012:role/app", AccessKeyID: DefaultAccessKey, RoleSessionName: "test-session",
			IssuedKeyID: aws.ToString(c.AccessKeyId), IssuedExpiration: aws.ToTime(c.Expiration).UTC(), CallerArn: "arn:aws:iam::123456789012:user/sts-emulator", Listener: ln, Source: "127.0.0.1"},
		// A signature that fails names no caller: nobody was verified.
		{Seq: 2, Action: "GetCallerIdentity", Outcome: "SignatureDoesNotMatch", AccessKeyID: DefaultAccessKey, Listener: ln, Source: "127.0.0.1"},
		{Seq: 3, Action: "GetCallerIdentity", Outcome: "ok", AccessKeyID: aws.ToString(c.AccessKeyId), CallerArn: "arn:aws:sts::123456789012:assumed-role/app/test-session", Listener: ln, Source: "127.0.0.1"},
	}
	for i := range calls {
		calls[i].Time = time.Time{}
	}
	if !reflect.DeepEqual(calls, want) {
		t.Errorf("calls = %+v\nwant %+v", calls, want)
	}

	e.ResetStats()
	if s := e.Stats(); s.Total != 0 || len(s.Timeline) != 0 || len(e.Calls()) != 0 {
		t.Errorf("after ResetStats: %+v, %d calls", s, len(e.Calls()))
	}
}

// TestControlAPI round-trips every control endpoint over HTTP.
func TestControlAPI(t *testing.T) {
	e := startEmulator(t, Config{Rate: 2, Burst: 4, Deny: []string{"x*"}})
	do := func(t *testing.T, method, path, body string, wantStatus int, out any) {
		t.Helper()
		raw := controlCall(t, e, method, path, body, wantStatus)
		if out != nil {
			if err := json.Unmarshal(raw, out); err != nil {
				t.Fatalf("%s %s: %v in %s", method, path, err, raw)
			}
		}
	}

	t.Run("config", func(t *testing.T) {
		var cv ConfigView
		do(t, "GET", "/_emulator/config", "", 200, &cv)
		want := ConfigView{Rate: 2, Burst: 4, LatencyMin: "0s", LatencyMax: "0s", MaxLifetime: "12h0m0s", Deny: []string{"x*"}, IAMPropagation: "0s",
			IAMInconsistency: "0s", IAMRevocation: "0s", Partition: "aws", IAMRegion: "us-east-1", ClockOffset: "0s", SkewTolerance: "5m0s",
			Accounts: []string{DefaultAccount}}
		if !reflect.DeepEqual(cv, want) {
			t.Errorf("GET config = %+v, want %+v", cv, want)
		}
		do(t, "POST", "/_emulator/config", `{"max_lifetime":"5s","latency_max":"1ms"}`, 200, &cv)
		want.MaxLifetime, want.LatencyMax = "5s", "1ms"
		if !reflect.DeepEqual(cv, want) {
			t.Errorf("after partial POST = %+v, want %+v (untouched fields kept)", cv, want)
		}
		do(t, "POST", "/_emulator/config", `{"rate":0,"latency_max":"0s","deny":[]}`, 200, &cv)
		want.Rate, want.Burst, want.LatencyMax, want.Deny = 0, 0, "0s", []string{}
		if !reflect.DeepEqual(cv, want) {
			t.Errorf("after POST = %+v, want %+v", cv, want)
		}
		do(t, "POST", "/_emulator/config", `{"max_lifetime":"soon"}`, 400, nil)
		do(t, "POST", "/_emulator/config", `{"unknown":1}`, 400, nil)
		do(t, "PUT", "/_emulator/config", `{}`, 405, nil)
		// The 5s lifetime applies to issued credentials.
		now := time.Now()
		out, err := rootClient(e).AssumeRole(ctx, assumeInput("app"))
		if err != nil {
			t.Fatal(err)
		}
		if exp := aws.ToTime(out.Credentials.Expiration); exp.Sub(now) > 6*time.Second {
			t.Errorf("Expiration %v is not capped by max_lifetime 5s", exp)
		}
	})

	t.Run("faults", func(t *testing.T) {
		var plan map[string]any
		do(t, "POST", "/_emulator/faults", `{"sequence":[{"fault":"Throttling","count":2}],"probability":{"InternalFailure":0.25},"hang":"20s","match":"app"}`, 200, &plan)
		want := map[string]any{
			"sequence":    []any{map[string]any{"fault": "Throttling", "count": 2.0}},
			"probability": map[string]any{"InternalFailure": 0.25},
			"hang":        "20s",
			"match":       "app",
		}
		if !reflect.DeepEqual(plan, want) {
			t.Errorf("POST faults = %v, want %v", plan, want)
		}
		_, err := rootClient(e).AssumeRole(ctx, assumeInput("app"))
		if errorCode(err) != "Throttling" {
			t.Fatalf("first call after POST faults: %v", err)
		}
		plan = nil
		do(t, "GET", "/_emulator/faults", "", 200, &plan)
		if got := plan["sequence"]; !reflect.DeepEqual(got, []any{map[string]any{"fault": "Throttling", "count": 1.0}}) {
			t.Errorf("GET faults sequence = %v, want one Throttling left", got)
		}
		plan = nil // json.Unmarshal would merge into the old map
		do(t, "DELETE", "/_emulator/faults", "", 200, &plan)
		if !reflect.DeepEqual(plan, map[string]any{"sequence": []any{}, "probability": map[string]any{}}) {
			t.Errorf("after DELETE = %v", plan)
		}
		do(t, "POST", "/_emulator/faults", `{"sequence":[{"fault":"Nope","count":1}]}`, 400, nil)
		do(t, "POST", "/_emulator/faults", `{"probability":{"reset":2}}`, 400, nil)
		if _, err := rootClient(e).AssumeRole(ctx, assumeInput("app")); err != nil {
			t.Errorf("after DELETE faults: %v", err)
		}
	})

	t.Run("stats calls reset", func(t *testing.T) {
		do(t, "POST", "/_emulator/reset", "", 200, nil)
		if _, err := rootClient(e).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
			t.Fatal(err)
		}
		var raw map[string]any
		do(t, "GET", "/_emulator/stats", "", 200, &raw)
		if raw["total"] != 1.0 || !reflect.DeepEqual(raw["by_action"], map[string]any{"GetCallerIdentity": map[string]any{"ok": 1.0}}) ||
			!reflect.DeepEqual(raw["by_outcome"], map[string]any{"ok": 1.0}) {
			t.Errorf("stats = %v", raw)
		}
		tl, _ := raw["timeline"].([]any)
		if len(tl) != 1 {
			t.Fatalf("timeline = %v", raw["timeline"])
		}
		if entry := tl[0].(map[string]any); entry["second"] == nil || !reflect.DeepEqual(entry["outcomes"], map[string]any{"ok": 1.0}) {
			t.Errorf("timeline entry = %v", entry)
		}
		var calls []map[string]any
		do(t, "GET", "/_emulator/calls", "", 200, &calls)
		if len(calls) != 1 || calls[0]["seq"] == nil || calls[0]["action"] != "GetCallerIdentity" || calls[0]["outcome"] != "ok" ||
			calls[0]["access_key_id"] != DefaultAccessKey || calls[0]["role_arn"] != "" {
			t.Errorf("calls = %v", calls)
		}
		if _, err := time.Parse(time.RFC3339Nano, calls[0]["time"].(string)); err != nil {
			t.Errorf("call time: %v", err)
		}
		do(t, "POST", "/_emulator/reset", "", 200, nil)
		do(t, "GET", "/_emulator/calls", "", 200, &calls)
		if len(calls) != 0 {
			t.Errorf("calls after reset = %v", calls)
		}
		do(t, "GET", "/_emulator/reset", "", 405, nil)
		do(t, "GET", "/_emulator/nothing", "", 404, nil)
	})

	t.Run("control calls are not STS calls", func(t *testing.T) {
		do(t, "POST", "/_emulator/reset", "", 200, nil)
		do(t, "GET", "/_emulator/stats", "", 200, nil)
		if n := e.Stats().Total; n != 0 {
			t.Errorf("control API calls counted as STS calls: %d", n)
		}
	})
}

func TestControlAPIRefusesRemoteClients(t *testing.T) {
	e := New(Config{})
	req := httptest.NewRequest(http.MethodGet, "/_emulator/stats", nil)
	req.RemoteAddr = "192.0.2.10:4242"
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, req)
	if rec.Code != http.StatusForbidden {
		t.Errorf("status %d for a non-loopback client, want 403", rec.Code)
	}
}

func TestLatency(t *testing.T) {
	e := startEmulator(t, Config{LatencyMin: 40 * time.Millisecond, LatencyMax: 60 * time.Millisecond})
	client := rootClient(e)
	// A lower bound only: the emulator must wait at least LatencyMin; how
	// much longer the machine takes is not this test's business.
	start := time.Now()
	if _, err := client.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 40*time.Millisecond {
		t.Errorf("call took %v, want >= 40ms latency", took)
	}
	e.SetLatency(0, 0)
	if cv := e.ConfigView(); cv.LatencyMin != "0s" || cv.LatencyMax != "0s" {
		t.Errorf("after SetLatency(0, 0): %+v", cv)
	}
}

// TestLogLines checks one line per call with action, outcome and latency,
// and that no secret, session token or signature leaks into it.
func TestLogLines(t *testing.T) {
	var buf syncBuffer
	e := startEmulator(t, Config{Logger: log.New(&buf, "", 0)})
	out, err := rootClient(e).AssumeRole(ctx, assumeInput("app"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = newClient(e, DefaultAccessKey, "bad-secret", "").GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	c := out.Credentials
	if _, err := newClient(e, aws.ToString(c.AccessKeyId), aws.ToString(c.SecretAccessKey), aws.ToString(c.SessionToken)).
		GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
		t.Fatal(err)
	}

	logged := buf.String()
	lines := strings.Split(strings.TrimSpace(logged), "\n")
	wantLines := []*regexp.Regexp{
		regexp.MustCompile(`^action=AssumeRole outcome=ok status=200 latency=\S+ role_arn="arn:aws:iam::123456789012:role/app" access_key_id=AKIAIOSFODNN7EXAMPLE caller_arn=arn:aws:iam::123456789012:user/sts-emulator role_session_name="test-session" source_identity="" issued_key_id=ASIA[A-Z0-9]+ issued_expiration=\S+Z listener=127\.0\.0\.1:\d+$`),
		regexp.MustCompile(`^action=GetCallerIdentity outcome=SignatureDoesNotMatch status=403 latency=\S+ role_arn="" access_key_id=AKIAIOSFODNN7EXAMPLE caller_arn=- listener=127\.0\.0\.1:\d+$`),
		regexp.MustCompile(`^action=GetCallerIdentity outcome=ok status=200 latency=\S+ role_arn="" access_key_id=ASIA\w{16} caller_arn=arn:aws:sts::123456789012:assumed-role/app/test-session listener=127\.0\.0\.1:\d+$`),
	}
	if len(lines) != len(wantLines) {
		t.Fatalf("%d log lines, want %d:\n%s", len(lines), len(wantLines), logged)
	}
	for i, re := range wantLines {
		if !re.MatchString(lines[i]) {
			t.Errorf("line %d = %q, want %s", i, lines[i], re)
		}
	}
	for _, secret := range []string{DefaultSecretKey, "bad-secret", aws.ToString(c.SecretAccessKey), aws.ToString(c.SessionToken), "Signature="} {
		if strings.Contains(logged, secret) {
			t.Errorf("log contains a secret %.12q...", secret)
		}
	}
}

// TestConcurrentUse hammers one emulator from many goroutines, each
// assuming a role and using the credentials, and checks the counts add up.
// Run with -race.
func TestConcurrentUse(t *testing.T) {
	e := startEmulator(t, Config{})
	const workers, perWorker = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers*perWorker)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := rootClient(e)
			for i := range perWorker {
				out, err := client.AssumeRole(ctx, &sts.AssumeRoleInput{
					RoleArn:         aws.String(fmt.Sprintf("arn:aws:iam::123456789012:role/r%d", w)),
					RoleSessionName: aws.String(fmt.Sprintf("s%d", i)),
				})
				if err != nil {
					errs <- err
					continue
				}
				c := out.Credentials
				id, err := newClient(e, aws.ToString(c.AccessKeyId), aws.ToString(c.SecretAccessKey), aws.ToString(c.SessionToken)).
					GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
				if err != nil {
					errs <- err
					continue
				}
				if want := fmt.Sprintf("arn:aws:sts::123456789012:assumed-role/r%d/s%d", w, i); aws.ToString(id.Arn) != want {
					errs <- fmt.Errorf("Arn %q, want %q", aws.ToString(id.Arn), want)
				}
			}
		}()
	}
	go func() {
		// Reconfigure while the calls run; the race detector checks the locking.
		for range 50 {
			e.SetRate(0, 0)
			e.SetLatency(0, 0)
			e.SetFaults(FaultPlan{})
			_ = e.Stats()
			_ = e.Calls()
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if s := e.Stats(); s.Count("AssumeRole", "ok") != workers*perWorker || s.Count("GetCallerIdentity", "ok") != workers*perWorker {
		t.Errorf("stats %+v, want %d ok of each action", s.ByAction, workers*perWorker)
	}
	seen := map[string]bool{}
	for _, c := range e.Calls() {
		if c.Action == "GetCallerIdentity" {
			if seen[c.AccessKeyID] {
				t.Errorf("access key id %s issued twice", c.AccessKeyID)
			}
			seen[c.AccessKeyID] = true
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestCallsNameIAMKeys: the call log names the IAM key CreateAccessKey made
// and the one DeleteAccessKey removed, so the soak's checker can prove the
// plugin deletes only keys it created.
func TestCallsNameIAMKeys(t *testing.T) {
	e := startEmulator(t, Config{})
	id, _ := createKey(t, e)
	if _, err := rootIAM(e).DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(id)}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range e.Calls() {
		got = append(got, c.Action+"="+c.IssuedKeyID)
	}
	if want := []string{"CreateAccessKey=" + id, "DeleteAccessKey=" + id}; !reflect.DeepEqual(got, want) {
		t.Fatalf("calls %v, want %v", got, want)
	}
}
