package main

import (
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

func TestBusiestSecond(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms []int, roles []string) []vaulttest.EmulatorCall {
		var out []vaulttest.EmulatorCall
		for i, m := range ms {
			out = append(out, vaulttest.EmulatorCall{Time: t0.Add(time.Duration(m) * time.Millisecond), RoleArn: roles[i]})
		}
		return out
	}
	// Three calls 0-999 ms apart, then four within 1 s from 1500 ms: the
	// window ends before a call exactly 1 s after its first.
	calls := at([]int{0, 500, 999, 1500, 1600, 2000, 2499, 2500}, []string{"a", "b", "c", "d", "d", "e", "f", "g"})
	n, start, distinct := busiestSecond(calls)
	if n != 4 || !start.Equal(t0.Add(1500*time.Millisecond)) || distinct != 3 {
		t.Fatalf("busiestSecond = %d calls from %s, %d roles; want 4 from 1.5s, 3 roles", n, start.Sub(t0), distinct)
	}
	if n, _, _ := busiestSecond(nil); n != 0 {
		t.Fatalf("no calls: %d", n)
	}
}
