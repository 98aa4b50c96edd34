package vaulttest

import "testing"

// TestResetCut: a reset mid-answer cuts the chunk that reaches ResetAfter,
// and a connection that carried more than ResetAfter before the fault was
// set (kept alive across faults: the soak's panic of 2026-12-04) is reset
// at its next chunk with nothing of it sent.
func TestResetCut(t *testing.T) {
	for _, c := range []struct {
		sent, size, after, n int
		cut                  bool
	}{
		{0, 4096, 0, 4096, false},  // no reset fault
		{0, 100, 300, 100, false},  // below the cut
		{200, 200, 300, 100, true}, // this chunk reaches it
		{300, 50, 300, 0, true},    // exactly at it already
		{1250, 4096, 300, 0, true}, // past it before the fault was set
		{0, 300, 300, 300, true},   // the whole chunk, then the reset
	} {
		n, cut := resetCut(c.sent, c.size, c.after)
		if n != c.n || cut != c.cut {
			t.Errorf("resetCut(sent %d, size %d, after %d) = %d, %v; want %d, %v", c.sent, c.size, c.after, n, cut, c.n, c.cut)
		}
	}
}
