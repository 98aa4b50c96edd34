package awsresilient

import (
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// TestClock_NextRefreshStoredOnAWSClock: the next refresh is stored as an
// instant of AWS's clock, and a node on a host 4 minutes fast that did not
// plan it (a new active node after a failover) turns it into its own clock
// with its own estimate: its refresh fires when the writer's would have,
// not 4 minutes early (nor capped late), and status/ says so on its clock.
func TestClock_NextRefreshStoredOnAWSClock(t *testing.T) {
	const awsOffset = 3 * time.Minute
	f := clockFixture(t, awsOffset)
	firstCredential(t, f, awsOffset)
	key := roleKey(testRole)
	planned, ok := f.b.refresher.plannedAt(key)
	if !ok {
		t.Fatal("nothing planned after the first credential")
	}
	st, err := getStatus(t.Context(), f.s, key)
	if err != nil || st == nil {
		t.Fatalf("status: %v %v", st, err)
	}
	if !st.NextRefreshAWS {
		t.Fatal("the stored next refresh is not marked as an instant of AWS's clock")
	}
	within(t, "stored next_refresh less the plan on the writer's clock", st.NextRefresh.Sub(planned), awsOffset, time.Second)
	if it := storedIndex(t, f.s)[testRole]; !it.Next().Equal(st.NextRefresh) {
		t.Fatalf("index next %v, want the AWS instant status stores %v", it.Next(), st.NextRefresh)
	}

	const hostOffset = 4 * time.Minute
	other := failover(t, f, hostOffset)
	at, ok := other.refresher.plannedAt(key)
	if !ok {
		t.Fatal("the new node planned no refresh")
	}
	// On the shared clock: the new node's host reads 4 minutes ahead.
	within(t, "the new node's plan less the writer's, on one clock", at.Add(-hostOffset).Sub(planned), 0, time.Second)
	// A standby reports the stored plan on its own clock.
	standby, _ := newTestBackend(t, testOpts{clock: f.clock, storage: f.s, rand: randMin, hostOffset: hostOffset, standby: true})
	shown := statusTime(t, mustDo(t, standby, f.s, "read", "status/"+testRole, nil).Data, "next_refresh")
	within(t, "a standby's next_refresh less the writer's plan, on one clock", shown.Add(-hostOffset).Sub(planned), 0, time.Second)
}

// TestClock_NextRefreshOfOldRecordsStillRead: a status record written
// before next refreshes were stored on AWS's clock (the writer's local
// time, no next_refresh_aws) is still planned by, bounded by the node's
// own judgement of the credential as before; and a compacted record gives
// back its marking.
func TestClock_NextRefreshOfOldRecordsStillRead(t *testing.T) {
	f := clockFixture(t, 0)
	firstCredential(t, f, 0)
	key := roleKey(testRole)
	st, err := getStatus(t.Context(), f.s, key)
	if err != nil || st == nil {
		t.Fatalf("status: %v %v", st, err)
	}
	old := *st
	old.NextRefresh, old.NextRefreshAWS = f.clock.Now().Add(2*time.Minute).Truncate(time.Second), false
	if err := putStatus(t.Context(), f.s, key, &old); err != nil {
		t.Fatal(err)
	}
	other := failover(t, f, 0)
	if at, _ := other.refresher.plannedAt(key); !at.Equal(old.NextRefresh) {
		t.Fatalf("an old record's plan read as %v, want its local time %v", at, old.NextRefresh)
	}

	rs := &roleState{cred: cached(t, f.s, testRole), fullStatus: &statusEntry{NextRefresh: time.Unix(0, 1e18).UTC(), NextRefreshAWS: true}}
	rs.fullStatus.LastAttempt, rs.fullStatus.LastSuccess = rs.cred.IssuedAt, rs.cred.IssuedAt
	want := *rs.fullStatus
	rs.compactStatus()
	if rs.fullStatus != nil || rs.status() != want {
		t.Fatalf("compacted status %+v, want %+v", rs.status(), want)
	}
}

// TestClock_NextRefreshAfterFailureOnAWSClock: a failed cycle's next
// attempt is stored on AWS's clock too, and the index with it.
func TestClock_NextRefreshAfterFailureOnAWSClock(t *testing.T) {
	const awsOffset = -2 * time.Minute
	f := clockFixture(t, awsOffset)
	firstCredential(t, f, awsOffset)
	key := roleKey(testRole)
	f.emu.SetFaults(alwaysFail(stsemu.FaultServiceUnavailable))
	f.fireScheduled(key)
	planned, _ := f.b.refresher.plannedAt(key)
	st, err := getStatus(t.Context(), f.s, key)
	if err != nil || st == nil || st.FailedCycles != 1 {
		t.Fatalf("status after a failed cycle: %+v %v", st, err)
	}
	if !st.NextRefreshAWS {
		t.Fatal("a failure's next refresh is not stored on AWS's clock")
	}
	within(t, "stored next_refresh less the plan", st.NextRefresh.Sub(planned), awsOffset, time.Second)
	if it := storedIndex(t, f.s)[testRole]; !it.Next().Equal(st.NextRefresh) {
		t.Fatalf("index next %v, want %v", it.Next(), st.NextRefresh)
	}
}
