package stsemu

import (
	"testing"
	"time"
)

// The call log names each call's caller (its address, so a test that gives
// each caller an address of its own tells whose call it was) and the
// clock's offset when it arrived (so that the call's time, AWS's, can be
// put back on the host's clock).
func TestCallLog_SourceAndClockOffset(t *testing.T) {
	e := startEmulator(t, Config{})
	if _, err := rootClient(e).AssumeRole(ctx, assumeInput("app")); err != nil {
		t.Fatal(err)
	}
	e.SetClockOffset(-90 * time.Second)
	if _, err := rootClient(e).AssumeRole(ctx, assumeInput("app")); err != nil {
		t.Fatal(err)
	}
	calls := e.Calls()
	if len(calls) != 2 {
		t.Fatalf("%d calls logged, want 2", len(calls))
	}
	for i, want := range []time.Duration{0, -90 * time.Second} {
		c := calls[i]
		if c.Source != "127.0.0.1" {
			t.Errorf("call %d: source %q, want 127.0.0.1 (the test's address)", i, c.Source)
		}
		if c.ClockOffset != want {
			t.Errorf("call %d: clock offset %s, want %s", i, c.ClockOffset, want)
		}
		if host := c.Time.Add(-c.ClockOffset); time.Since(host) < 0 || time.Since(host) > time.Minute {
			t.Errorf("call %d: time %s less its offset is %s, not the host's time of the call", i, c.Time, host)
		}
	}
}
