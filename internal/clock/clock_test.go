package clock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// sleep runs SleepUntil in a goroutine and returns its result channel.
func sleep(ctx context.Context, c clock.Clock, at time.Time, hurry <-chan struct{}) <-chan error {
	done := make(chan error, 1)
	go func() { done <- clock.SleepUntil(ctx, c, at, hurry) }()
	return done
}

func TestSleepUntil(t *testing.T) {
	closed := make(chan struct{})
	close(closed)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	t.Run("past time returns at once without a timer", func(t *testing.T) {
		c := clocktest.NewFake(t0)
		if err := clock.SleepUntil(context.Background(), c, t0, nil); err != nil {
			t.Fatalf("err = %v", err)
		}
		// A done context is reported even for a time already reached:
		// a zero-length timer would race its channel against ctx.Done.
		for _, at := range []time.Time{t0.Add(-time.Second), t0} {
			for range 64 {
				if err := clock.SleepUntil(cancelled, c, at, nil); !errors.Is(err, context.Canceled) {
					t.Fatalf("a done context, time %v: err = %v, want context.Canceled", at.Sub(t0), err)
				}
			}
		}
		if n := c.Pending(); n != 0 {
			t.Fatalf("%d timers made, want 0", n)
		}
	})
	t.Run("hurry already closed returns at once without a timer", func(t *testing.T) {
		c := clocktest.NewFake(t0)
		if err := clock.SleepUntil(context.Background(), c, t0.Add(time.Hour), closed); err != nil {
			t.Fatalf("err = %v", err)
		}
		if n := c.Pending(); n != 0 {
			t.Fatalf("%d timers made, want 0", n)
		}
	})
	t.Run("wakes exactly at the time", func(t *testing.T) {
		c := clocktest.NewFake(t0)
		done := sleep(context.Background(), c, t0.Add(5*time.Second), nil)
		c.BlockUntil(t, 1)
		if at, _ := c.Next(); !at.Equal(t0.Add(5 * time.Second)) {
			t.Fatalf("timer at %v, want t0+5s", at)
		}
		c.Advance(5*time.Second - time.Nanosecond)
		select {
		case err := <-done:
			t.Fatalf("woke 1ns early: %v", err)
		default:
		}
		c.Advance(time.Nanosecond)
		if err := <-done; err != nil {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("hurry and context stop the wait and its timer", func(t *testing.T) {
		for _, name := range []string{"hurry", "ctx"} {
			c := clocktest.NewFake(t0)
			hurry := make(chan struct{})
			ctx, cancel := context.WithCancel(context.Background())
			done := sleep(ctx, c, t0.Add(time.Hour), hurry)
			c.BlockUntil(t, 1)
			if name == "hurry" {
				close(hurry)
			} else {
				cancel()
			}
			err := <-done
			if name == "hurry" && err != nil || name == "ctx" && !errors.Is(err, context.Canceled) {
				t.Fatalf("%s: err = %v", name, err)
			}
			if n := c.Pending(); n != 0 {
				t.Fatalf("%s: %d timers left, want the timer stopped", name, n)
			}
			cancel()
		}
	})
}

func TestRealClock(t *testing.T) {
	var c clock.Clock = clock.Real{}
	before := time.Now()
	if now := c.Now(); now.Before(before) {
		t.Fatalf("Now %v before %v", now, before)
	}
	tm := c.NewTimer(time.Hour)
	if tm.C() == nil || !tm.Stop() {
		t.Fatal("a real timer has a channel and stops while pending")
	}
	fired := make(chan struct{})
	c.AfterFunc(0, func() { close(fired) })
	<-fired
}
