package stsemu

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sts"
)

func TestThrottlingBurst(t *testing.T) {
	tests := []struct {
		rate   float64
		burst  int
		calls  int
		wantOK int
	}{
		{rate: 0.001, burst: 3, calls: 10, wantOK: 3},
		{rate: 1, burst: 1, calls: 5, wantOK: 1},
		{rate: 0, burst: 0, calls: 20, wantOK: 20}, // unlimited
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("rate %v burst %d", tc.rate, tc.burst), func(t *testing.T) {
			clock := newFakeClock() // frozen: no token is refilled during the burst
			e := startEmulator(t, Config{Now: clock.Now, Rate: tc.rate, Burst: tc.burst})
			client := rootClient(e)
			var codes []string
			for range tc.calls {
				_, err := client.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
				code := errorCode(err)
				if code != "" && (code != "Throttling" || httpStatus(err) != 400 || !strings.Contains(err.Error(), "Rate exceeded")) {
					t.Fatalf("unexpected error %v", err)
				}
				codes = append(codes, code)
			}
			for i, code := range codes {
				want := ""
				if i >= tc.wantOK {
					want = "Throttling"
				}
				if code != want {
					t.Fatalf("outcomes %q: want exactly %d ok first, then Throttling", codes, tc.wantOK)
				}
			}
			s := e.Stats()
			if s.Count("GetCallerIdentity", "ok") != tc.wantOK || s.Count("GetCallerIdentity", "Throttling") != tc.calls-tc.wantOK {
				t.Errorf("stats %+v disagree with the client", s.ByAction)
			}
		})
	}
}

// TestThrottlingRate drives the fake clock 50ms per call for 10 simulated
// seconds at 5 req/s: the bucket admits the burst, then exactly 5 per second.
func TestThrottlingRate(t *testing.T) {
	clock := newFakeClock()
	start := clock.Now().Truncate(time.Second).Add(time.Second)
	clock.Advance(start.Sub(clock.Now())) // begin on a second boundary for a tidy timeline
	e := startEmulator(t, Config{Now: clock.Now, Rate: 5, Burst: 1})
	client := rootClient(e)
	ok := 0
	for range 200 {
		if _, err := client.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err == nil {
			ok++
		} else if errorCode(err) != "Throttling" {
			t.Fatal(err)
		}
		clock.Advance(50 * time.Millisecond)
	}
	// One token at t=0, then one every 200ms up to t=9.95s.
	if ok != 50 {
		t.Errorf("%d calls admitted in 10s at 5/s with burst 1, want 50", ok)
	}
	s := e.Stats()
	if len(s.Timeline) != 10 {
		t.Fatalf("timeline has %d seconds, want 10: %+v", len(s.Timeline), s.Timeline)
	}
	for i, sec := range s.Timeline {
		if sec.Second != start.Unix()+int64(i) || sec.Outcomes["ok"] != 5 || sec.Outcomes["Throttling"] != 15 {
			t.Errorf("timeline[%d] = %+v, want second %d with 5 ok and 15 Throttling", i, sec, start.Unix()+int64(i))
		}
	}
}

func TestSetRate(t *testing.T) {
	clock := newFakeClock()
	e := startEmulator(t, Config{Now: clock.Now})
	client := rootClient(e)
	e.SetRate(0.001, 2)
	var codes []string
	for range 4 {
		_, err := client.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
		codes = append(codes, errorCode(err))
	}
	if fmt.Sprint(codes) != "[  Throttling Throttling]" {
		t.Errorf("outcomes %q, want 2 ok then Throttling", codes)
	}
	e.SetRate(0, 0)
	if _, err := client.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
		t.Errorf("after SetRate(0, 0): %v", err)
	}
}
