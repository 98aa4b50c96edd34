package awsresilient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	iamtypes "github.com/aws/aws-sdk-go-v2/service/iam/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// rotationFixture is the usual fixture with config/root's iam_endpoint
// pointed at the emulator, which serves IAM beside STS.
func rotationFixture(t *testing.T, o fixtureOpts) *fixture {
	t.Helper()
	f := newFixture(t, o)
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"iam_endpoint": f.emu.URL()})
	return f
}

// keys returns the emulator user's access key ids, in creation order.
func userKeys(t *testing.T, emu *stsemu.Emulator) []string {
	t.Helper()
	users := emu.IAMUsers()
	if len(users) != 1 {
		t.Fatalf("emulator has %d IAM users, want 1", len(users))
	}
	var ids []string
	for _, k := range users[0].AccessKeys {
		ids = append(ids, k.AccessKeyID)
	}
	return ids
}

// rootKeyID returns config/root's access key id as a read shows it.
func rootKeyID(t *testing.T, f *fixture) string {
	t.Helper()
	return mustDo(t, f.b, f.s, logical.ReadOperation, "config/root", nil).Data["access_key"].(string)
}

// rotate asks for a rotation, as a new request: past the repeat window of
// the last one, which would otherwise answer it (see
// TestRotation_RepeatedRequestSharesTheResult).
func (f *fixture) rotate() (*logical.Response, error) {
	f.t.Helper()
	f.pastRepeatWindow()
	return f.driven(logical.UpdateOperation, "config/rotate-root")
}

// pastRepeatWindow moves the fake clock past the repeat window of the last
// rotation, if it ended within it.
func (f *fixture) pastRepeatWindow() {
	unlock := f.b.rotator.lockRotations()
	ended := f.b.rotator.last.ended
	unlock()
	if end := ended.Add(rotationRepeatWindow); !ended.IsZero() && f.clock.Now().Before(end) {
		f.clock.AdvanceTo(end)
	}
}

// wantWorkingKey checks the invariant every rotation outcome keeps: the
// stored key is one of the user's keys, the user has at most one other,
// and a refresh cycle with the stored key succeeds.
func wantWorkingKey(t *testing.T, f *fixture) {
	t.Helper()
	stored := rootKeyID(t, f)
	keys := userKeys(t, f.emu)
	found := false
	for _, k := range keys {
		found = found || k == stored
	}
	if !found || len(keys) > 2 {
		t.Fatalf("stored key %s, user's keys %v: want the stored key among at most two", stored, keys)
	}
	f.emu.ClearFaults()
	st := f.refresh(testRole)
	if st["failed_cycles"] != 0 || st["last_error"] != "" {
		t.Fatalf("a refresh with the stored key failed: %v", st)
	}
	calls := f.emu.Calls()
	if last := calls[len(calls)-1]; last.AccessKeyID != stored || last.Outcome != "ok" {
		t.Fatalf("the last STS call used %s (%s), want the stored key %s", last.AccessKeyID, last.Outcome, stored)
	}
}

func TestRotation_ReplacesTheKey(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	old := rootKeyID(t, f)

	resp, err := f.rotate()
	if err != nil || resp.IsError() {
		t.Fatalf("rotate-root: err=%v resp=%v", err, respErr(resp))
	}
	id, _ := resp.Data["access_key"].(string)
	if !strings.HasPrefix(id, "AKIA") || id == old || len(resp.Data) != 1 {
		t.Fatalf("rotate-root answered %v, want only the new access_key", resp.Data)
	}
	if got := rootKeyID(t, f); got != id {
		t.Fatalf("config/root holds %s, want the new key %s", got, id)
	}
	if keys := userKeys(t, f.emu); len(keys) != 1 || keys[0] != id {
		t.Fatalf("user's keys after rotation %v, want only %s", keys, id)
	}
	// The old key is dead at AWS; the plugin refreshes with the new one.
	if _, err := callerIdentity(f.emu.URL(), old, stsemu.DefaultSecretKey); err == nil || !strings.Contains(err.Error(), "InvalidClientTokenId") {
		t.Fatalf("the old key still works: %v", err)
	}
	wantWorkingKey(t, f)

	rot := mustDo(t, f.b, f.s, logical.ReadOperation, "config/rotation", nil).Data
	if rot["outcome"] != rotationSuccess || rot["trigger"] != rotationManual || rot["failures"] != 0 || rot["last_rotated"] == "" {
		t.Fatalf("config/rotation = %v", rot)
	}
	root := mustDo(t, f.b, f.s, logical.ReadOperation, "config/root", nil).Data
	if root["last_rotated"] != rot["last_rotated"] || root["next_rotation"] != "" {
		t.Fatalf("config/root last_rotated %v next_rotation %v", root["last_rotated"], root["next_rotation"])
	}
	sc := scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_root_rotations_total", map[string]string{"trigger": "manual", "result": "success"}, 1)
	sc.want("aws_resilient_root_rotation_failures", nil, 0)
	sc.want("aws_resilient_root_last_rotation_timestamp_seconds", nil, unixSeconds(statusTime(t, rot, "last_rotated")))
	sc.want("aws_resilient_root_key_age_seconds", nil, keySwitchSettle.Seconds()) // the fake clock moved only through the settle
	if _, ok := sc.value("aws_resilient_root_next_rotation_timestamp_seconds", nil); ok {
		t.Fatal("a next-rotation series without rotation_period")
	}
	if strings.Contains(sc.body, id) {
		t.Fatal("the metrics name the access key")
	}
	// No secret in any answer.
	for _, d := range []map[string]interface{}{resp.Data, rot, root} {
		for k, v := range d {
			if s, ok := v.(string); ok && len(s) == 40 && k != "access_key" {
				t.Fatalf("%s looks like a secret key", k)
			}
		}
	}
}

// callerIdentity calls sts:GetCallerIdentity at url with a key pair.
func callerIdentity(url, accessKey, secretKey string) (string, error) {
	c := sts.New(sts.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(url),
		Credentials:  credentials.NewStaticCredentialsProvider(accessKey, secretKey, ""),
		Retryer:      aws.NopRetryer{},
	})
	out, err := c.GetCallerIdentity(context.Background(), &sts.GetCallerIdentityInput{})
	if err != nil {
		return "", err
	}
	return aws.ToString(out.Arn), nil
}

func TestRotation_NeedsStaticKeys(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"access_key": "", "secret_key": ""})
	resp, err := f.rotate()
	wantBadRequest(t, resp, err, "needs a static access_key and secret_key", "default AWS credential chain")
	resp, err = do(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"rotation_period": "24h"})
	wantBadRequest(t, resp, err, "rotation_period needs a static access_key")
}

func TestRotation_PeriodRange(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	for _, p := range []string{"30m", "8761h", "-1h"} {
		resp, err := do(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"rotation_period": p})
		wantBadRequest(t, resp, err, "rotation_period")
	}
	if got := mustDo(t, f.b, f.s, logical.ReadOperation, "config/root", nil).Data["rotation_period"]; got != int64(0) {
		t.Fatalf("rejected writes changed rotation_period to %v", got)
	}
}

// A failure at any step leaves a stored key that works and at most one
// other key on the user, and says why with the right status.
func TestRotation_EveryStepCanFail(t *testing.T) {
	iamFault := func(action string, fault stsemu.Fault) stsemu.FaultPlan {
		return stsemu.FaultPlan{Actions: []string{"iam:" + action}, Probability: map[stsemu.Fault]float64{fault: 1}}
	}
	tests := []struct {
		name    string
		faults  stsemu.FaultPlan
		storage func(fs *faultStorage)
		// status is the answer's HTTP status: 400 and 503 as coded, 500 a Go error.
		status  int
		want    string
		rotated bool // the new key is stored
		// kept: both keys live on, recorded, until the next rotation (a
		// failed config/root write, or an old key IAM would not delete).
		kept bool
	}{
		{name: "GetUser denied", faults: iamFault("GetUser", stsemu.FaultAccessDenied), status: 400, want: "iam:GetUser: AccessDenied"},
		{name: "GetUser unavailable", faults: iamFault("GetUser", stsemu.FaultServiceUnavailable), status: 503, want: "iam:GetUser: ServiceUnavailable"},
		{name: "ListAccessKeys throttled", faults: iamFault("ListAccessKeys", stsemu.FaultThrottling), status: 503, want: "iam:ListAccessKeys: Throttling"},
		{name: "CreateAccessKey unavailable", faults: iamFault("CreateAccessKey", stsemu.FaultServiceUnavailable), status: 503, want: "iam:CreateAccessKey: ServiceUnavailable"},
		{name: "verification never succeeds", faults: stsemu.FaultPlan{Actions: []string{"sts:GetCallerIdentity"}, Probability: map[stsemu.Fault]float64{stsemu.FaultServiceUnavailable: 1}},
			status: 503, want: "verification: STS did not accept the new key within 6 attempts"},
		// The intent's write passes; the record of the key just made fails:
		// the key is deleted at once.
		{name: "recording the new key fails", storage: func(fs *faultStorage) { fs.failAfter("put", configRotationPath, 1, 1, false) }, status: 500, want: "config/rotation"},
		// The write may commit later: neither key is deleted (defect 9).
		{name: "storing the new key fails", storage: func(fs *faultStorage) { fs.failNext("put", configRootPath, 1, false) }, status: 500, want: "both keys are kept", kept: true},
		{name: "storing the new key fails after it landed", storage: func(fs *faultStorage) { fs.failNext("put", configRootPath, 1, true) }, status: 200, rotated: true, kept: true,
			want: "config/root's write reported a failure"},
		// Never a silent 200 while the old key lives (defect 3).
		{name: "deleting the old key fails", faults: iamFault("DeleteAccessKey", stsemu.FaultServiceUnavailable), status: 200, rotated: true, kept: true,
			want: "iam:DeleteAccessKey failed: ServiceUnavailable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFaultStorage(new(logical.InmemStorage), 11)
			f := rotationFixture(t, fixtureOpts{storage: fs})
			f.mustReadCreds(testRole)
			old := rootKeyID(t, f)
			f.emu.SetFaults(tc.faults)
			if tc.storage != nil {
				tc.storage(fs)
			}
			creates := iamCalls(f.emu, "CreateAccessKey")
			resp, err := f.rotate()
			f.emu.ClearFaults()
			if tc.storage != nil && iamCalls(f.emu, "CreateAccessKey") != creates+1 {
				t.Fatal("the storage fault stopped the rotation before it created a key: the case does not test what it is named after")
			}
			switch {
			case tc.status == 200:
				if err != nil || resp.IsError() {
					t.Fatalf("rotate-root: err=%v resp=%v", err, respErr(resp))
				}
				if tc.kept && (len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], old) || !strings.Contains(resp.Warnings[0], tc.want)) {
					t.Fatalf("warnings %q, want one naming the old key %s and %q", resp.Warnings, old, tc.want)
				}
			case tc.status == 500:
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("rotate-root: err=%v resp=%v, want a storage error mentioning %q", err, respErr(resp), tc.want)
				}
			case tc.status == 400:
				wantBadRequest(t, resp, err, tc.want)
			default:
				wantCoded(t, resp, err, tc.status, tc.want)
			}
			if got := rootKeyID(t, f) != old; got != tc.rotated {
				t.Fatalf("config/root holds a new key: %v, want %v", got, tc.rotated)
			}
			keys := userKeys(t, f.emu)
			switch {
			case tc.kept:
				if len(keys) != 2 || keys[0] != old {
					t.Fatalf("the user's keys are %v, want the old key %s kept beside the new", keys, old)
				}
				if st := rotationRecord(t, f.s); st.RetiredKeyID != old || !tc.rotated && st.PendingKeyID != keys[1] {
					t.Fatalf("config/rotation %+v, want the kept keys recorded", st)
				}
			case len(keys) != 1 || keys[0] != old:
				t.Fatalf("after a failed rotation the user's keys are %v, want only %s", keys, old)
			}
			wantWorkingKey(t, f)
			rot := mustDo(t, f.b, f.s, logical.ReadOperation, "config/rotation", nil).Data
			if tc.status != 200 && tc.status != 500 && (rot["outcome"] != rotationFailure || rot["failures"] != 1) {
				t.Fatalf("config/rotation after a failure: %v", rot)
			}
			if tc.status == 200 && tc.kept && rot["outcome"] != rotationOldKeyKept {
				t.Fatalf("config/rotation after a rotation that kept the old key: %v", rot)
			}

			// The next rotation, with nothing failing, succeeds and leaves
			// only its own key: whatever the failed one left is cleaned up.
			resp, err = f.rotate()
			if err != nil || resp.IsError() {
				t.Fatalf("the rotation after: err=%v resp=%v", err, respErr(resp))
			}
			if keys := userKeys(t, f.emu); len(keys) != 1 || keys[0] != resp.Data["access_key"] {
				t.Fatalf("after the next rotation the user's keys are %v, want only %v", keys, resp.Data["access_key"])
			}
			wantWorkingKey(t, f)
		})
	}
}

// IAM's propagation delay: the new key is refused for a while, and the
// verification's later attempts, one per block, see it accepted.
func TestRotation_WaitsForPropagation(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	f.emu.SetIAMPropagation(12 * time.Second) // blocks of 5s: attempts at 0, 5, 10 refused, 15 accepted
	resp, err := f.rotate()
	if err != nil || resp.IsError() {
		t.Fatalf("rotate-root: err=%v resp=%v", err, respErr(resp))
	}
	var refused, ok int
	for _, c := range f.emu.Calls() {
		if c.Action == "GetCallerIdentity" && c.AccessKeyID == resp.Data["access_key"] {
			switch c.Outcome {
			case "ok":
				ok++
			default:
				refused++
			}
		}
	}
	if refused != 3 || ok != 1 {
		t.Fatalf("verification: %d refused, %d accepted; want 3 and 1", refused, ok)
	}
	wantWorkingKey(t, f)

	// Longer than the whole window: the rotation gives up, deletes its key.
	f.emu.SetIAMPropagation(time.Hour)
	before := rootKeyID(t, f)
	resp, err = f.rotate()
	wantCoded(t, resp, err, http.StatusServiceUnavailable, "InvalidClientTokenId", "config/root is unchanged")
	if rootKeyID(t, f) != before || len(userKeys(t, f.emu)) != 1 {
		t.Fatalf("a rotation that never verified changed something: stored %s, keys %v", rootKeyID(t, f), userKeys(t, f.emu))
	}
}

// A user whose second key the plugin did not create: a 400 naming
// LimitExceeded and the key, and nothing is deleted.
func TestRotation_SecondKeyNotOurs(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	other := createKey(t, f.emu, stsemu.DefaultAccessKey, stsemu.DefaultSecretKey)
	resp, err := f.rotate()
	wantBadRequest(t, resp, err, "LimitExceeded", other, "delete-access-key")
	if keys := userKeys(t, f.emu); len(keys) != 2 {
		t.Fatalf("keys after the refused rotation: %v", keys)
	}
}

// createKey makes an access key of the signing user with the real IAM client.
func createKey(t *testing.T, emu *stsemu.Emulator, accessKey, secretKey string) string {
	t.Helper()
	c := iam.New(iam.Options{
		Region:       partitionAWS.iamRegion,
		BaseEndpoint: aws.String(emu.URL()),
		Credentials:  credentials.NewStaticCredentialsProvider(accessKey, secretKey, ""),
		Retryer:      aws.NopRetryer{},
	})
	out, err := c.CreateAccessKey(context.Background(), &iam.CreateAccessKeyInput{})
	if err != nil {
		t.Fatal(err)
	}
	return aws.ToString(out.AccessKey.AccessKeyId)
}

// A key a rotation created and recorded but never stored (a failover in the
// middle) is deleted by the next rotation.
func TestRotation_CleansUpAfterAnInterruptedOne(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	left := createKey(t, f.emu, stsemu.DefaultAccessKey, stsemu.DefaultSecretKey)
	if err := putRotationState(context.Background(), f.s, &rotationState{PendingKeyID: left}); err != nil {
		t.Fatal(err)
	}
	resp, err := f.rotate()
	if err != nil || resp.IsError() {
		t.Fatalf("rotate-root: err=%v resp=%v", err, respErr(resp))
	}
	if keys := userKeys(t, f.emu); len(keys) != 1 || keys[0] != resp.Data["access_key"] {
		t.Fatalf("keys %v, want only the new %v", keys, resp.Data["access_key"])
	}
}

// An operator's config/root write during the rotation wins: the rotation
// stores nothing and deletes its own key.
func TestRotation_OperatorWriteWins(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"rotation_period": "720h"})
	f.emu.SetIAMPropagation(7 * time.Second) // the verification sleeps into block 2
	rotation := f.start(logical.UpdateOperation, "config/rotate-root")
	// The rotation sleeps in its verification: the operator writes.
	waitFor(t, "the rotation to sleep in its verification", func() bool { _, ok := f.clock.NextSleeper(); return ok })
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"access_key": "AKIAOPERATORWRITE000", "secret_key": "operator/secret"})
	r := f.await(rotation)
	wantCoded(t, r.resp, r.err, http.StatusConflict, "operator's write wins")
	if got := rootKeyID(t, f); got != "AKIAOPERATORWRITE000" {
		t.Fatalf("config/root holds %s, want the operator's key", got)
	}
	if keys := userKeys(t, f.emu); len(keys) != 1 || keys[0] != stsemu.DefaultAccessKey {
		t.Fatalf("the rotation's own key was left on the user: keys %v", keys)
	}
	// Nothing failed: the operator's new key is due a full period from its
	// write, not after a failure's pause.
	rot := mustDo(t, f.b, f.s, logical.ReadOperation, "config/rotation", nil).Data
	if rot["outcome"] != rotationSuperseded || rot["failures"] != 0 {
		t.Fatalf("config/rotation after an operator's write won: %v", rot)
	}
	if next := statusTime(t, rot, "next_rotation"); next.Before(f.clock.Now().Add(700 * time.Hour)) {
		t.Fatalf("next_rotation %s: the operator's new key would be rotated within %s", next, next.Sub(f.clock.Now()))
	}
}

// A cycle whose STS call is under way with the old key when the rotation
// stores the new one finishes with the old key: the old key is deleted
// only after it, and no attempt fails.
func TestRotation_WaitsForAttemptsUsingTheOldKey(t *testing.T) {
	for _, configWrite := range []bool{false, true} {
		name := "rotation alone"
		if configWrite {
			// A config/root write drops the clients while the attempt runs:
			// the rotation must still wait for it.
			name = "a config/root write in between"
		}
		t.Run(name, func(t *testing.T) { testRotationWaitsForAttempts(t, configWrite) })
	}
}

func testRotationWaitsForAttempts(t *testing.T, configWrite bool) {
	gate := make(chan struct{})
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	entered := make(chan struct{}, 10)
	var once sync.Once
	var armed atomic.Bool
	f := rotationFixture(t, fixtureOpts{wrapSTS: func(_ string, api stsAPI) stsAPI {
		return &gatedSTS{stsAPI: api, gate: gate, entered: entered, once: &once, armed: &armed}
	}})
	t.Cleanup(open) // before the backend's cleanup, which waits for the cycle
	f.mustReadCreds(testRole)
	armed.Store(true)
	old := rootKeyID(t, f)

	cycle := make(chan map[string]interface{}, 1)
	go func() {
		resp, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.UpdateOperation, Path: "refresh/" + testRole, Storage: f.s})
		if err != nil || resp.IsError() {
			t.Errorf("refresh: %v %v", err, respErr(resp))
			cycle <- nil
			return
		}
		cycle <- resp.Data
	}()
	<-entered // the cycle's AssumeRole is under way with the old key
	if configWrite {
		mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"rotation_period": "24h"})
	}
	rotated := f.start(logical.UpdateOperation, "config/rotate-root")
	waitFor(t, "the rotation to store the new key", func() bool { return rootKeyID(t, f) != old })
	select {
	case <-rotated.done:
		t.Fatal("the rotation ended while an attempt still used the old key")
	case <-time.After(50 * time.Millisecond):
	}
	if keys := userKeys(t, f.emu); len(keys) != 2 {
		t.Fatalf("the old key was deleted under a running attempt: keys %v", keys)
	}
	open()
	st := <-cycle
	if st["failed_cycles"] != 0 || st["last_error"] != "" {
		t.Fatalf("the cycle across the rotation failed: %v", st)
	}
	// The rotation keeps the old key as the fallback for keySwitchSettle
	// on the fake clock before it drains it.
	r := f.await(rotated)
	if r.err != nil || r.resp.IsError() {
		t.Fatalf("rotate-root: %v %v", r.err, respErr(r.resp))
	}
	if keys := userKeys(t, f.emu); len(keys) != 1 || keys[0] != r.resp.Data["access_key"] {
		t.Fatalf("after the attempt ended the keys are %v, want only the new one", keys)
	}
}

// gatedSTS holds the first AssumeRole made once armed until gate is closed.
type gatedSTS struct {
	stsAPI
	gate    chan struct{}
	entered chan struct{}
	once    *sync.Once
	armed   *atomic.Bool
}

func (g *gatedSTS) AssumeRole(ctx context.Context, in *sts.AssumeRoleInput, o ...func(*sts.Options)) (*sts.AssumeRoleOutput, error) {
	first := false
	if g.armed.Load() {
		g.once.Do(func() { first = true })
	}
	if first {
		g.entered <- struct{}{}
		<-g.gate
	}
	return g.stsAPI.AssumeRole(ctx, in, o...)
}

// Scheduled rotation: due at a random moment in the last tenth of the
// period after the key was stored; a failed one is tried again after a
// pause; config/root and config/rotation show the plan.
func TestRotation_Scheduled(t *testing.T) {
	clk := newFakeClock(time.Now().Truncate(time.Second))
	emu := startEmulator(t, stsemu.Config{Now: clk.Now, MaxLifetime: 10 * time.Minute})
	f := newFixtureWith(t, fixtureOpts{rand: randMin}, clk, emu)
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"iam_endpoint": emu.URL(), "rotation_period": "10h"})
	set := clk.Now()

	// randMin draws no jitter: due exactly 10h after the key was stored.
	root := mustDo(t, f.b, f.s, logical.ReadOperation, "config/root", nil).Data
	if root["rotation_period"] != int64(36000) || root["next_rotation"] != formatTime(set.Add(10*time.Hour)) {
		t.Fatalf("config/root rotation_period %v next_rotation %v, want 36000 and %s", root["rotation_period"], root["next_rotation"], formatTime(set.Add(10*time.Hour)))
	}
	if at := f.b.rotator.scheduled(); !at.Equal(set.Add(10 * time.Hour)) {
		t.Fatalf("timer armed for %v", at)
	}

	// The first scheduled attempt fails (IAM down); the retry comes after
	// the pause and succeeds.
	emu.SetFaults(stsemu.FaultPlan{Actions: []string{"iam:*"}, Probability: map[stsemu.Fault]float64{stsemu.FaultServiceUnavailable: 1}})
	clk.AdvanceTo(set.Add(10 * time.Hour))
	waitFor(t, "the scheduled rotation to fail", func() bool {
		st, err := getRotationState(context.Background(), f.s)
		return err == nil && st.Outcome == rotationFailure
	})
	rot := mustDo(t, f.b, f.s, logical.ReadOperation, "config/rotation", nil).Data
	retryAt := clk.Now().Add(rotationRetryBase / 2) // backoff(1m, 1) with randMin: the low end of [30s, 1m]
	if rot["trigger"] != rotationScheduled || rot["failures"] != 1 || rot["next_rotation"] != formatTime(retryAt) {
		t.Fatalf("after a failed scheduled rotation: %v, want a retry at %s", rot, formatTime(retryAt))
	}
	sc := scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_root_rotation_failures", nil, 1)
	sc.want("aws_resilient_root_rotations_total", map[string]string{"trigger": "scheduled", "result": "failure"}, 1)
	sc.want("aws_resilient_root_next_rotation_timestamp_seconds", nil, unixSeconds(retryAt))
	sc.want("aws_resilient_root_key_age_seconds", nil, (10 * time.Hour).Seconds())
	emu.ClearFaults()
	old := rootKeyID(t, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		waitFor(t, "the retried rotation to succeed", func() bool {
			st, err := getRotationState(context.Background(), f.s)
			return err == nil && st.Outcome == rotationSuccess
		})
	}()
	clk.AdvanceTo(retryAt)
	clk.DriveUntil(t, done)
	if rootKeyID(t, f) == old {
		t.Fatal("the scheduled rotation stored no new key")
	}
	rot = mustDo(t, f.b, f.s, logical.ReadOperation, "config/rotation", nil).Data
	if rot["failures"] != 0 || rot["next_rotation"] != formatTime(retryAt.Add(10*time.Hour)) {
		t.Fatalf("after the scheduled rotation: %v, want the next one 10h later", rot)
	}
	wantWorkingKey(t, f)

	// Off: no plan, no timer.
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"rotation_period": 0})
	if root := mustDo(t, f.b, f.s, logical.ReadOperation, "config/root", nil).Data; root["next_rotation"] != "" || !f.b.rotator.scheduled().IsZero() {
		t.Fatalf("rotation_period 0 left a plan: %v, timer %v", root["next_rotation"], f.b.rotator.scheduled())
	}
}

// A client that gives up does not stop a rotation half-way: it completes,
// and nothing is left on the user.
func TestRotation_OutlivesTheRequest(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var (
		resp *logical.Response
		err  error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err = f.b.HandleRequest(ctx, &logical.Request{Operation: logical.UpdateOperation, Path: "config/rotate-root", Storage: f.s})
	}()
	// Driven: the old key stays the refreshes' fallback for keySwitchSettle
	// on the fake clock, even before any refresh built its clients.
	f.clock.DriveUntil(t, done)
	if err != nil || resp.IsError() {
		t.Fatalf("rotate-root with a cancelled request: err=%v resp=%v", err, respErr(resp))
	}
	if keys := userKeys(t, f.emu); len(keys) != 1 || keys[0] != rootKeyID(t, f) {
		t.Fatalf("keys %v, stored %s", keys, rootKeyID(t, f))
	}
}

// iamHook calls before ahead of every IAM call a rotation makes.
type iamHook struct {
	iamAPI
	before func(action string)
}

func (h *iamHook) GetUser(ctx context.Context, in *iam.GetUserInput, o ...func(*iam.Options)) (*iam.GetUserOutput, error) {
	h.before("GetUser")
	return h.iamAPI.GetUser(ctx, in, o...)
}

func (h *iamHook) DeleteAccessKey(ctx context.Context, in *iam.DeleteAccessKeyInput, o ...func(*iam.Options)) (*iam.DeleteAccessKeyOutput, error) {
	h.before("DeleteAccessKey")
	return h.iamAPI.DeleteAccessKey(ctx, in, o...)
}

// Keys a rotation could not delete stay on record even when its last
// write is lost, so that the next rotation deletes them rather than refuse
// them as someone else's.
func TestRotation_RecordsBeforeEachRiskyStep(t *testing.T) {
	t.Run("the old key's delete and the final record both fail", func(t *testing.T) {
		fs := newFaultStorage(new(logical.InmemStorage), 12)
		f := rotationFixture(t, fixtureOpts{storage: fs})
		old := rootKeyID(t, f)
		f.emu.SetFaults(stsemu.FaultPlan{Actions: []string{"iam:DeleteAccessKey"}, Probability: map[stsemu.Fault]float64{stsemu.FaultServiceUnavailable: 1}})
		f.b.rotator.wrapIAM = func(api iamAPI) iamAPI {
			return &iamHook{iamAPI: api, before: func(action string) {
				if action == "DeleteAccessKey" {
					fs.failNext("put", configRotationPath, 1, false) // the outcome's record
				}
			}}
		}
		resp, err := f.rotate()
		if err != nil || resp.IsError() {
			t.Fatalf("rotate-root: err=%v resp=%v", err, respErr(resp))
		}
		f.b.rotator.wrapIAM = nil
		f.emu.ClearFaults()
		if keys := userKeys(t, f.emu); len(keys) != 2 || keys[0] != old {
			t.Fatalf("keys %v, want the old one left beside the new", keys)
		}
		resp, err = f.rotate()
		if err != nil || resp.IsError() {
			t.Fatalf("the next rotation: err=%v resp=%v", err, respErr(resp))
		}
		if keys := userKeys(t, f.emu); len(keys) != 1 || keys[0] != resp.Data["access_key"] {
			t.Fatalf("keys %v, want only %v", keys, resp.Data["access_key"])
		}
	})
	t.Run("storage cannot tell which key it holds", func(t *testing.T) {
		fs := newFaultStorage(new(logical.InmemStorage), 13)
		f := rotationFixture(t, fixtureOpts{storage: fs})
		f.mustReadCreds(testRole)
		old := rootKeyID(t, f)
		// The new key's write lands but reports a failure, and the read
		// back fails too (config/root is read twice before).
		fs.failNext("put", configRootPath, 1, true)
		fs.failAfter("get", configRootPath, 2, 1, false)
		resp, err := f.rotate()
		if err == nil || !strings.Contains(err.Error(), "both keys are kept") {
			t.Fatalf("rotate-root: err=%v resp=%v, want a storage error keeping both keys", err, respErr(resp))
		}
		stored := rootKeyID(t, f)
		if stored == old || len(userKeys(t, f.emu)) != 2 {
			t.Fatalf("stored %s, keys %v: want the new key stored and both kept", stored, userKeys(t, f.emu))
		}
		// The clients were rebuilt: refreshes sign with the stored key.
		wantWorkingKey(t, f)
		resp, err = f.rotate()
		if err != nil || resp.IsError() {
			t.Fatalf("the next rotation: err=%v resp=%v", err, respErr(resp))
		}
		if keys := userKeys(t, f.emu); len(keys) != 1 || keys[0] != resp.Data["access_key"] {
			t.Fatalf("keys %v, want only %v", keys, resp.Data["access_key"])
		}
	})
	t.Run("the answer to CreateAccessKey is lost", func(t *testing.T) {
		f := rotationFixture(t, fixtureOpts{})
		f.emu.SetFaults(stsemu.FaultPlan{Actions: []string{"iam:CreateAccessKey"}, Sequence: []stsemu.FaultStep{{Fault: stsemu.FaultResetAfter, Count: 1}}})
		resp, err := f.rotate()
		wantCoded(t, resp, err, http.StatusServiceUnavailable, "iam:CreateAccessKey", "which was deleted")
		if keys := userKeys(t, f.emu); len(keys) != 1 {
			t.Fatalf("keys %v: the lost answer's key should be found and deleted at once", keys)
		}
		resp, err = f.rotate()
		if err != nil || resp.IsError() {
			t.Fatalf("the next rotation: err=%v resp=%v", err, respErr(resp))
		}
		if keys := userKeys(t, f.emu); len(keys) != 1 || keys[0] != resp.Data["access_key"] {
			t.Fatalf("keys %v, want only %v", keys, resp.Data["access_key"])
		}
	})
}

// A scheduled rotation that another rotation made moot does nothing.
func TestRotation_ScheduledOnlyWhenDue(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"rotation_period": "24h"})
	old := rootKeyID(t, f)
	if _, err := f.b.rotator.rotateRoot(context.Background(), f.s, rotationScheduled); err != errNotDue {
		t.Fatalf("a scheduled rotation 24h early: %v, want errNotDue", err)
	}
	if rootKeyID(t, f) != old || len(userKeys(t, f.emu)) != 1 {
		t.Fatal("a rotation that was not due changed the key")
	}
}

// lateStopClock is a fake clock whose AfterFunc timers cannot be stopped:
// each behaves as a timer that fired just as it was stopped, whose
// callback runs anyway.
type lateStopClock struct{ *clocktest.Fake }

func (c lateStopClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	return lateTimer{c.Fake.AfterFunc(d, f)}
}

type lateTimer struct{ clock.Timer }

func (lateTimer) Stop() bool { return false }

// The rotator's schedule alone, on the fake clock: one timer, armed only
// where the refresher runs, replaced by each arm, gone for good after
// stop; a timer that fires after it was replaced or stopped does nothing.
func TestRotator_Schedule(t *testing.T) {
	start := time.Now().Truncate(time.Second)
	at := func(d time.Duration) time.Time { return start.Add(d) }
	setup := func(clk clock.Clock, refreshing bool) (*rotator, *atomic.Int32) {
		var due atomic.Int32
		return newRotator(rotatorOwners{clock: clk, refreshing: func() bool { return refreshing }, due: func() { due.Add(1) }}), &due
	}
	// advance moves the clock and waits for the callbacks it fired.
	advance := func(clk *clocktest.Fake, to time.Time) {
		clk.AdvanceTo(to)
		clk.WaitUntil(t, func() bool { return clk.Busy() == 0 }, func() string { return "the timers' callbacks to return" })
	}
	want := func(r *rotator, clk *clocktest.Fake, due *atomic.Int32, scheduled time.Time, pending int, fired int32) {
		t.Helper()
		if got := r.scheduled(); !got.Equal(scheduled) {
			t.Fatalf("scheduled %v, want %v", got, scheduled)
		}
		if got := clk.Pending(); got != pending {
			t.Fatalf("%d timers pending, want %d", got, pending)
		}
		if got := due.Load(); got != fired {
			t.Fatalf("due called %d times, want %d", got, fired)
		}
	}

	t.Run("armed where the refresher runs, due once at its time", func(t *testing.T) {
		clk := newFakeClock(start)
		r, due := setup(clk, true)
		r.arm(at(time.Hour))
		want(r, clk, due, at(time.Hour), 1, 0)
		advance(clk, at(time.Hour-time.Second))
		want(r, clk, due, at(time.Hour), 1, 0)
		advance(clk, at(time.Hour))
		want(r, clk, due, time.Time{}, 0, 1)
	})
	t.Run("not armed where the refresher does not run", func(t *testing.T) {
		clk := newFakeClock(start)
		r, due := setup(clk, false)
		r.arm(at(time.Hour))
		want(r, clk, due, time.Time{}, 0, 0)
	})
	t.Run("arming again replaces the timer; the zero time disarms", func(t *testing.T) {
		clk := newFakeClock(start)
		r, due := setup(clk, true)
		r.arm(at(time.Hour))
		r.arm(at(2 * time.Hour))
		want(r, clk, due, at(2*time.Hour), 1, 0)
		advance(clk, at(time.Hour))
		want(r, clk, due, at(2*time.Hour), 1, 0)
		r.arm(time.Time{})
		want(r, clk, due, time.Time{}, 0, 0)
	})
	t.Run("stop disarms for good", func(t *testing.T) {
		clk := newFakeClock(start)
		r, due := setup(clk, true)
		r.arm(at(time.Hour))
		r.stop()
		want(r, clk, due, time.Time{}, 0, 0)
		r.arm(at(2 * time.Hour))
		want(r, clk, due, time.Time{}, 0, 0)
		advance(clk, at(3*time.Hour))
		want(r, clk, due, time.Time{}, 0, 0)
	})
	t.Run("a timer that fires after it was replaced or stopped does nothing", func(t *testing.T) {
		clk := newFakeClock(start)
		r, due := setup(lateStopClock{clk}, true)
		r.arm(at(time.Hour))
		r.arm(at(2 * time.Hour))
		advance(clk, at(time.Hour))
		want(r, clk, due, at(2*time.Hour), 1, 0)
		advance(clk, at(2*time.Hour))
		want(r, clk, due, time.Time{}, 0, 1)
		r.arm(at(3 * time.Hour))
		r.stop()
		advance(clk, at(3*time.Hour))
		want(r, clk, due, time.Time{}, 0, 1)
	})
}

// ---- Issue 21: a rotation never deletes a key it did not create, and never
// reports success while the old key lives.

// faultIAM is an IAM seam whose fail, when set, may refuse a call before it
// is sent (an answer that never came, as far as the rotation knows).
type faultIAM struct {
	iamAPI
	mu    sync.Mutex
	calls []string
	fail  func(action string, calls []string) error
}

func (h *faultIAM) before(action string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, action)
	if h.fail != nil {
		return h.fail(action, h.calls)
	}
	return nil
}

func (h *faultIAM) GetUser(ctx context.Context, in *iam.GetUserInput, o ...func(*iam.Options)) (*iam.GetUserOutput, error) {
	if err := h.before("GetUser"); err != nil {
		return nil, err
	}
	return h.iamAPI.GetUser(ctx, in, o...)
}

func (h *faultIAM) ListAccessKeys(ctx context.Context, in *iam.ListAccessKeysInput, o ...func(*iam.Options)) (*iam.ListAccessKeysOutput, error) {
	if err := h.before("ListAccessKeys"); err != nil {
		return nil, err
	}
	return h.iamAPI.ListAccessKeys(ctx, in, o...)
}

func (h *faultIAM) CreateAccessKey(ctx context.Context, in *iam.CreateAccessKeyInput, o ...func(*iam.Options)) (*iam.CreateAccessKeyOutput, error) {
	if err := h.before("CreateAccessKey"); err != nil {
		return nil, err
	}
	return h.iamAPI.CreateAccessKey(ctx, in, o...)
}

func (h *faultIAM) DeleteAccessKey(ctx context.Context, in *iam.DeleteAccessKeyInput, o ...func(*iam.Options)) (*iam.DeleteAccessKeyOutput, error) {
	if err := h.before("DeleteAccessKey"); err != nil {
		return nil, err
	}
	return h.iamAPI.DeleteAccessKey(ctx, in, o...)
}

// failListsAfterCreate fails every ListAccessKeys that follows a
// CreateAccessKey in the same rotation: the rotation cannot see what its
// lost call made.
func failListsAfterCreate(action string, calls []string) error {
	if action != "ListAccessKeys" {
		return nil
	}
	for _, c := range calls {
		if c == "CreateAccessKey" {
			return errors.New("connection reset by peer")
		}
	}
	return nil
}

// rotationRecord reads config/rotation as stored.
func rotationRecord(t *testing.T, s logical.Storage) *rotationState {
	t.Helper()
	st, err := getRotationState(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// iamCalls counts the emulator's calls of an action (any outcome).
func iamCalls(emu *stsemu.Emulator, action string) int {
	n := 0
	for _, c := range emu.Calls() {
		if c.Action == action {
			n++
		}
	}
	return n
}

func wantRotated(t *testing.T, resp *logical.Response, err error) string {
	t.Helper()
	if err != nil || resp.IsError() {
		t.Fatalf("rotate-root: err=%v resp=%v", err, respErr(resp))
	}
	return resp.Data["access_key"].(string)
}

// wantOnlyKeys checks the IAM user's keys, in creation order.
func wantOnlyKeys(t *testing.T, emu *stsemu.Emulator, want ...string) {
	t.Helper()
	if got := userKeys(t, emu); !slices.Equal(got, want) {
		t.Fatalf("the user's keys are %v, want %v", got, want)
	}
}

// Defect 1: IAM refused CreateAccessKey, so no key exists and the intent is
// cleared; a key an operator adds afterwards for another application is
// not the plugin's, and the next rotation refuses to touch it.
func TestRotation_RefusedCreateLeavesNoIntent(t *testing.T) {
	for _, fault := range []stsemu.Fault{stsemu.FaultAccessDenied, stsemu.FaultThrottling, stsemu.FaultServiceUnavailable} {
		t.Run(string(fault), func(t *testing.T) {
			f := rotationFixture(t, fixtureOpts{})
			old := rootKeyID(t, f)
			f.emu.SetFaults(stsemu.FaultPlan{Actions: []string{"iam:CreateAccessKey"}, Probability: map[stsemu.Fault]float64{fault: 1}})
			resp, err := f.rotate()
			if err == nil && !resp.IsError() {
				t.Fatal("a refused CreateAccessKey answered success")
			}
			f.emu.ClearFaults()
			if st := rotationRecord(t, f.s); st.Creating != nil || st.PendingKeyID != "" {
				t.Fatalf("after a refused CreateAccessKey config/rotation keeps intent %+v, pending %q", st.Creating, st.PendingKeyID)
			}
			other := createKey(t, f.emu, stsemu.DefaultAccessKey, stsemu.DefaultSecretKey)
			resp, err = f.rotate()
			wantBadRequest(t, resp, err, "LimitExceeded", other)
			wantOnlyKeys(t, f.emu, old, other)
		})
	}
}

// Defect 1, the lost answer: the rotation lists the user's keys right after
// the call and deletes the key its lost call made (absent from the list it
// took just before).
func TestRotation_LostCreateAnswerFoundAtOnce(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	old := rootKeyID(t, f)
	f.emu.SetFaults(stsemu.FaultPlan{Actions: []string{"iam:CreateAccessKey"}, Sequence: []stsemu.FaultStep{{Fault: stsemu.FaultResetAfter, Count: 1}}})
	resp, err := f.rotate()
	wantCoded(t, resp, err, http.StatusServiceUnavailable, "iam:CreateAccessKey")
	wantOnlyKeys(t, f.emu, old)
	if st := rotationRecord(t, f.s); st.Creating != nil || st.PendingKeyID != "" {
		t.Fatalf("config/rotation keeps intent %+v, pending %q after the lost key was deleted", st.Creating, st.PendingKeyID)
	}
	wantWorkingKey(t, f)
}

// Defects 1 and 2: a lost answer the rotation could not resolve at once
// (every list after the call failed) is resolved by the next rotation with
// IAM's clock and key list: IAM's clock runs 5 minutes behind the node's,
// which must not strand the plugin's key; a key made long after the lost
// call is not the plugin's.
func TestRotation_LostCreateAnswerResolvedLater(t *testing.T) {
	for _, tc := range []struct {
		name string
		// skew is how far IAM's clock runs behind the node's.
		skew time.Duration
		// operatorKeyAfter: the lost key is deleted by someone and an
		// operator adds a key for another application this long after.
		operatorKeyAfter time.Duration
	}{
		{name: "IAM's clock behind the node's", skew: 5 * time.Minute},
		{name: "IAM's clock ahead of the node's", skew: -5 * time.Minute},
		{name: "a key made an hour later is not ours", skew: 5 * time.Minute, operatorKeyAfter: time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock(time.Now().Truncate(time.Second))
			var iamOffset atomic.Int64
			iamOffset.Store(int64(-tc.skew))
			iamNow := func() time.Time { return clk.Now().Add(time.Duration(iamOffset.Load())) }
			// STS's older 15 minutes of signature skew: the test's own IAM
			// calls (deleteUserKey, createKey) sign on the host's running
			// clock, up to a second past the fake one, against an IAM 5
			// minutes behind it; the plugin signs on the offset it measured.
			emu := startEmulator(t, stsemu.Config{Now: iamNow, MaxLifetime: 10 * time.Minute, SkewTolerance: 15 * time.Minute})
			f := newFixtureWith(t, fixtureOpts{}, clk, emu)
			mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"iam_endpoint": emu.URL()})
			old := rootKeyID(t, f)
			hook := &faultIAM{fail: failListsAfterCreate}
			f.b.rotator.wrapIAM = func(api iamAPI) iamAPI { hook.iamAPI = api; return hook }
			emu.SetFaults(stsemu.FaultPlan{Actions: []string{"iam:CreateAccessKey"}, Sequence: []stsemu.FaultStep{{Fault: stsemu.FaultResetAfter, Count: 1}}})
			resp, err := f.rotate()
			wantCoded(t, resp, err, http.StatusServiceUnavailable, "iam:CreateAccessKey")
			emu.ClearFaults()
			f.b.rotator.wrapIAM = nil
			keys := userKeys(t, emu)
			if len(keys) != 2 {
				t.Fatalf("keys %v: want the lost key on the user", keys)
			}
			lost := keys[1]
			if tc.operatorKeyAfter == 0 {
				id := f.mustRotate()
				wantOnlyKeys(t, emu, id)
				wantWorkingKey(t, f)
				return
			}
			// Someone deleted the lost key; much later an operator adds a
			// key for another application: the intent does not cover it.
			// (The intent is moved back rather than IAM's clock forward,
			// which SigV4's 15 minutes of skew would refuse.)
			deleteUserKey(t, emu, old, lost)
			st := rotationRecord(t, f.s)
			if st.Creating == nil {
				t.Fatal("no intent on record after a lost answer that could not be resolved")
			}
			st.Creating.IAMTime = st.Creating.IAMTime.Add(-tc.operatorKeyAfter)
			if err := putRotationState(context.Background(), f.s, st); err != nil {
				t.Fatal(err)
			}
			other := createKey(t, emu, stsemu.DefaultAccessKey, stsemu.DefaultSecretKey)
			resp, err = f.rotate()
			wantBadRequest(t, resp, err, "LimitExceeded", other)
			wantOnlyKeys(t, emu, old, other)
		})
	}
}

// deleteUserKey deletes an access key of the default user, signing with the
// configured key.
func deleteUserKey(t *testing.T, emu *stsemu.Emulator, signer, id string) {
	t.Helper()
	c := iam.New(iam.Options{
		Region:       "us-east-1", // the emulator's default partition
		BaseEndpoint: aws.String(emu.URL()),
		Credentials:  credentials.NewStaticCredentialsProvider(signer, stsemu.DefaultSecretKey, ""),
		Retryer:      aws.NopRetryer{},
	})
	if _, err := c.DeleteAccessKey(context.Background(), &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(id)}); err != nil {
		t.Fatal(err)
	}
}

// Defect 3: an old key that survives is never reported as success: 200
// with a warning naming it and why, outcome old_key_not_deleted in
// config/rotation and the metrics, and the reconciler deletes it on its
// own, with rotation_period 0.
func TestRotation_OldKeyNotDeleted(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	old := rootKeyID(t, f)
	f.emu.SetFaults(stsemu.FaultPlan{Actions: []string{"iam:DeleteAccessKey"}, Probability: map[stsemu.Fault]float64{stsemu.FaultServiceUnavailable: 1}})
	resp, err := f.rotate()
	id := wantRotated(t, resp, err)
	if len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], old) || !strings.Contains(resp.Warnings[0], "ServiceUnavailable") {
		t.Fatalf("warnings %q, want one naming the old key %s and ServiceUnavailable", resp.Warnings, old)
	}
	wantOnlyKeys(t, f.emu, old, id)
	rot := mustDo(t, f.b, f.s, logical.ReadOperation, "config/rotation", nil).Data
	if rot["outcome"] != rotationOldKeyKept || rot["retired_key_id"] != old || !strings.Contains(rot["error"].(string), "ServiceUnavailable") {
		t.Fatalf("config/rotation = %v, want outcome %s naming %s", rot, rotationOldKeyKept, old)
	}
	sc := scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_root_rotations_total", map[string]string{"trigger": "manual", "result": rotationOldKeyKept}, 1)
	sc.want("aws_resilient_root_rotations_total", map[string]string{"trigger": "manual", "result": "success"}, 0)
	sc.want("aws_resilient_root_keys_to_delete", nil, 1)

	// IAM still refuses: the reconciler's pass tries, and keeps the record.
	f.periodic()
	wantOnlyKeys(t, f.emu, old, id)
	// IAM heals: the next pass deletes the old key, no rotation needed.
	f.emu.ClearFaults()
	f.periodic()
	wantOnlyKeys(t, f.emu, id)
	rot = mustDo(t, f.b, f.s, logical.ReadOperation, "config/rotation", nil).Data
	if rot["retired_key_id"] != "" || rot["outcome"] != rotationSuccess {
		t.Fatalf("config/rotation after the reconciler deleted the old key: %v", rot)
	}
	scrapeMetrics(t, f.b, f.s, "").want("aws_resilient_root_keys_to_delete", nil, 0)
	wantWorkingKey(t, f)
}

// periodic runs Vault's periodic function (a reconciler pass) and waits
// for the key clean-up it may have started.
func (f *fixture) periodic() {
	f.t.Helper()
	if err := f.b.Backend.PeriodicFunc(context.Background(), &logical.Request{Storage: f.s}); err != nil {
		f.t.Fatal(err)
	}
	f.b.rotator.waitCleanup()
}

// Defect 4: a key an earlier rotation left behind is deleted only once the
// attempts still signing with it have ended.
func TestRotation_DrainsBeforeDeletingALeftKey(t *testing.T) {
	gate := make(chan struct{})
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	entered := make(chan struct{}, 10)
	var once sync.Once
	var armed atomic.Bool
	f := rotationFixture(t, fixtureOpts{wrapSTS: func(_ string, api stsAPI) stsAPI {
		return &gatedSTS{stsAPI: api, gate: gate, entered: entered, once: &once, armed: &armed}
	}})
	t.Cleanup(open)
	f.b.rotator.drainTimeout = 50 * time.Millisecond
	f.mustReadCreds(testRole)
	armed.Store(true)
	old := rootKeyID(t, f)
	cycle := make(chan result, 1)
	go func() {
		resp, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.UpdateOperation, Path: "refresh/" + testRole, Storage: f.s})
		cycle <- result{resp, err}
	}()
	<-entered // an attempt signs with the old key, and is held
	// The first rotation cannot wait long enough: it keeps the old key.
	// Driven: the old key stays the refreshes' fallback for keySwitchSettle
	// on the fake clock before the drain.
	resp, err := f.driven(logical.UpdateOperation, "config/rotate-root")
	first := wantRotated(t, resp, err)
	if len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], old) {
		t.Fatalf("warnings %q, want the old key %s named", resp.Warnings, old)
	}
	// The reconciler's retry, and a second rotation, while the attempt
	// still signs with the old key: neither deletes it.
	f.periodic()
	resp, err = f.rotate()
	wantCoded(t, resp, err, http.StatusServiceUnavailable, old)
	wantOnlyKeys(t, f.emu, old, first)
	open()
	if c := <-cycle; c.err != nil || c.resp.IsError() || c.resp.Data["failed_cycles"] != 0 || c.resp.Data["last_error"] != "" {
		t.Fatalf("the attempt that signed with the old key failed: %v %v", c.err, c.resp)
	}
	f.periodic()
	wantOnlyKeys(t, f.emu, first)
}

// Defect 5: Clean during the verification (unmount, seal, step-down) still
// deletes the unverified new key.
func TestRotation_CleanDuringVerificationDeletesTheNewKey(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	old := rootKeyID(t, f)
	f.emu.SetIAMPropagation(time.Hour)
	rotation := f.start(logical.UpdateOperation, "config/rotate-root")
	waitFor(t, "the rotation to sleep in its verification", func() bool { _, ok := f.clock.NextSleeper(); return ok && len(userKeys(t, f.emu)) == 2 })
	f.b.Cleanup(context.Background())
	<-rotation.done
	wantOnlyKeys(t, f.emu, old)
	if st := rotationRecord(t, f.s); st.PendingKeyID != "" {
		t.Fatalf("config/rotation still names %s to delete", st.PendingKeyID)
	}
}

// Defect 8: an operator writes the old key back into config/root while the
// rotation drains: the rotation deletes nothing, and both keys stay on
// record until a rotation deletes the one config/root does not hold.
func TestRotation_OperatorWriteDuringDrain(t *testing.T) {
	gate := make(chan struct{})
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	entered := make(chan struct{}, 10)
	var once sync.Once
	var armed atomic.Bool
	f := rotationFixture(t, fixtureOpts{wrapSTS: func(_ string, api stsAPI) stsAPI {
		return &gatedSTS{stsAPI: api, gate: gate, entered: entered, once: &once, armed: &armed}
	}})
	t.Cleanup(open)
	f.mustReadCreds(testRole)
	armed.Store(true)
	old := rootKeyID(t, f)
	go func() {
		_, _ = f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.UpdateOperation, Path: "refresh/" + testRole, Storage: f.s})
	}()
	<-entered
	rotated := make(chan result, 1)
	go func() {
		resp, err := f.driven(logical.UpdateOperation, "config/rotate-root")
		rotated <- result{resp, err}
	}()
	waitFor(t, "the rotation to store the new key", func() bool { return rootKeyID(t, f) != old })
	newKey := rootKeyID(t, f)
	// The rotation drains; the operator puts the old key back.
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"access_key": old, "secret_key": stsemu.DefaultSecretKey})
	open()
	r := <-rotated
	wantCoded(t, r.resp, r.err, http.StatusConflict, "nothing was deleted", old, newKey)
	wantOnlyKeys(t, f.emu, old, newKey)
	if st := rotationRecord(t, f.s); st.PendingKeyID != newKey || st.RetiredKeyID != old || st.Outcome != rotationSuperseded || st.Failures != 0 {
		t.Fatalf("config/rotation %+v, want both keys recorded and outcome superseded", st)
	}
	wantWorkingKey(t, f)
	// The next rotation deletes the key config/root does not hold (the
	// rotation's), keeps the operator's until its own new key is stored.
	id := f.mustRotate()
	wantOnlyKeys(t, f.emu, id)
}

// lateStorage reports the first armed put of key as failed without applying
// it, and keeps it so that the test can commit it later (a raft write whose
// leader was lost, committed by the next one).
type lateStorage struct {
	logical.Storage
	mu    sync.Mutex
	key   string
	armed bool
	held  *logical.StorageEntry
}

func (s *lateStorage) Put(ctx context.Context, e *logical.StorageEntry) error {
	s.mu.Lock()
	if s.armed && e.Key == s.key {
		s.armed, s.held = false, e
		s.mu.Unlock()
		return errors.New("raft: leadership lost while committing")
	}
	s.mu.Unlock()
	return s.Storage.Put(ctx, e)
}

func (s *lateStorage) commit(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	e := s.held
	s.mu.Unlock()
	if err := s.Storage.Put(context.Background(), e); err != nil {
		t.Fatal(err)
	}
}

// Defect 9: config/root's write reports a failure and commits later: the
// rotation deleted neither key, so the key storage holds in the end works,
// and the next rotation deletes the one it does not hold.
func TestRotation_FailedRootWriteCommitsLater(t *testing.T) {
	ls := &lateStorage{Storage: new(logical.InmemStorage), key: configRootPath}
	f := rotationFixture(t, fixtureOpts{storage: ls})
	f.mustReadCreds(testRole)
	old := rootKeyID(t, f)
	ls.mu.Lock()
	ls.armed = true
	ls.mu.Unlock()
	resp, err := f.rotate()
	if err == nil || !strings.Contains(err.Error(), "both keys are kept") {
		t.Fatalf("rotate-root: err=%v resp=%v, want a storage error keeping both keys", err, respErr(resp))
	}
	keys := userKeys(t, f.emu)
	if len(keys) != 2 || keys[0] != old {
		t.Fatalf("keys %v: want both the old and the new key kept", keys)
	}
	st := rotationRecord(t, f.s)
	if st.PendingKeyID != keys[1] || st.RetiredKeyID != old {
		t.Fatalf("config/rotation %+v, want both keys recorded", st)
	}
	ls.commit(t) // the write lands after all
	f.b.clients.reset()
	if rootKeyID(t, f) != keys[1] {
		t.Fatal("the late commit did not land")
	}
	wantWorkingKey(t, f)
	id := f.mustRotate()
	wantOnlyKeys(t, f.emu, id)
	wantWorkingKey(t, f)
}

// Defect 11: the pause after a failed scheduled rotation counts from the
// failure, not from the attempt's start: a verification that fails after
// 25 s is not retried 5 s later.
func TestRotation_PauseCountsFromTheFailure(t *testing.T) {
	// IAM dates keys on the fake clock, which moves 10h; signatures are
	// checked on the real one (SigV4 allows 15 minutes of skew).
	clk := newFakeClock(time.Now().Truncate(time.Second))
	emu := startEmulator(t, stsemu.Config{Now: clk.Now, MaxLifetime: 10 * time.Minute})
	f := newFixtureWith(t, fixtureOpts{}, clk, emu)
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"iam_endpoint": emu.URL(), "rotation_period": "10h"})
	st := rotationRecord(t, f.s)
	f.emu.SetIAMPropagation(time.Hour) // the verification never succeeds
	done := make(chan struct{})
	go func() {
		defer close(done)
		waitFor(t, "the scheduled rotation to fail", func() bool { return rotationRecord(t, f.s).Outcome == rotationFailure })
	}()
	f.clock.AdvanceTo(st.NextRotation)
	f.clock.DriveUntil(t, done)
	failed := f.clock.Now()
	st = rotationRecord(t, f.s)
	t.Logf("the scheduled rotation failed: %s", st.Error)
	if failed.Sub(st.LastAttempt) < 20*time.Second {
		t.Fatalf("the verification took %s, want its 6 blocks", failed.Sub(st.LastAttempt))
	}
	if want := failed.Add(rotationRetryBase / 2); !st.NextRotation.Equal(want) {
		t.Fatalf("next rotation %s after a failure at %s (attempt at %s), want %s", st.NextRotation, failed, st.LastAttempt, want)
	}
}

// Defect 12: an operator's new key supersedes a rotation: the failures of
// the old key's rotations no longer count.
func TestRotation_SupersededClearsFailures(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	f.emu.SetFaults(stsemu.FaultPlan{Actions: []string{"iam:GetUser"}, Probability: map[stsemu.Fault]float64{stsemu.FaultServiceUnavailable: 1}})
	resp, err := f.rotate()
	wantCoded(t, resp, err, http.StatusServiceUnavailable, "GetUser")
	f.emu.ClearFaults()
	if st := rotationRecord(t, f.s); st.Failures != 1 {
		t.Fatalf("failures %d after a failed rotation", st.Failures)
	}
	f.emu.SetIAMPropagation(7 * time.Second)
	f.pastRepeatWindow()
	rotation := f.start(logical.UpdateOperation, "config/rotate-root")
	waitFor(t, "the rotation to sleep in its verification", func() bool { _, ok := f.clock.NextSleeper(); return ok })
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"access_key": "AKIAOPERATORWRITE000", "secret_key": "operator/secret"})
	r := f.await(rotation)
	wantCoded(t, r.resp, r.err, http.StatusConflict, "operator's write wins")
	if st := rotationRecord(t, f.s); st.Failures != 0 || st.Outcome != rotationSuperseded {
		t.Fatalf("config/rotation %+v: the operator's new key still carries the old key's failures", st)
	}
	scrapeMetrics(t, f.b, f.s, "").want("aws_resilient_root_rotation_failures", nil, 0)
}

// Defect 13: a rotate-root request that arrives while a rotation runs, or
// within seconds of its end (the vault CLI retries a 5xx twice), gets that
// rotation's result instead of running another.
func TestRotation_RepeatedRequestSharesTheResult(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	f.emu.SetIAMPropagation(7 * time.Second)
	first := f.start(logical.UpdateOperation, "config/rotate-root")
	waitFor(t, "the rotation to sleep in its verification", func() bool { _, ok := f.clock.NextSleeper(); return ok })
	second := f.start(logical.UpdateOperation, "config/rotate-root")
	a := f.await(first)
	// Drives a second rotation too, if one (wrongly) runs.
	b := f.await(second)
	id := wantRotated(t, a.resp, a.err)
	if got := wantRotated(t, b.resp, b.err); got != id {
		t.Fatalf("the request that arrived during the rotation got %s, want the rotation's %s", got, id)
	}
	// A retry seconds later gets the same answer.
	f.clock.Advance(rotationRepeatWindow - time.Second)
	resp, err := f.driven(logical.UpdateOperation, "config/rotate-root")
	if got := wantRotated(t, resp, err); got != id {
		t.Fatalf("a request %s after the rotation got %s, want %s", rotationRepeatWindow-time.Second, got, id)
	}
	if n := iamCalls(f.emu, "CreateAccessKey"); n != 1 {
		t.Fatalf("%d CreateAccessKey calls, want 1", n)
	}
	// Later, a request is a new rotation.
	f.clock.Advance(time.Second)
	f.emu.SetIAMPropagation(0)
	resp, err = f.driven(logical.UpdateOperation, "config/rotate-root")
	if got := wantRotated(t, resp, err); got == id {
		t.Fatal("a request long after the rotation repeated its answer")
	}
	wantOnlyKeys(t, f.emu, rootKeyID(t, f))
}

// Issue 45, item 1: the repeat window ends when config/root changes (a
// refusal for want of keys is not the answer once the keys are written),
// and a repeated answer says that it is one, of which rotation, ended when.
func TestRotation_ReplayEndsWhenConfigRootChanges(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"access_key": "", "secret_key": ""})
	resp, err := f.rotate()
	wantBadRequest(t, resp, err, "needs a static access_key and secret_key")
	if strings.Contains(respErr(resp), "replayed") {
		t.Fatalf("the first answer calls itself a replay: %s", respErr(resp))
	}
	ended := f.clock.Now()
	f.clock.Advance(time.Second)
	resp, err = f.driven(logical.UpdateOperation, "config/rotate-root")
	wantBadRequest(t, resp, err, "needs a static access_key and secret_key",
		"this is the answer of the manual rotation that ended at "+ended.UTC().Format(time.RFC3339)+", 1s before this request, replayed",
		"a request after "+ended.Add(rotationRepeatWindow).UTC().Format(time.RFC3339)+", or after a change of config/root, starts a new rotation")

	// The keys written, a request at once is a new rotation.
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{
		"access_key": stsemu.DefaultAccessKey, "secret_key": stsemu.DefaultSecretKey})
	resp, err = f.driven(logical.UpdateOperation, "config/rotate-root")
	id := wantRotated(t, resp, err)
	if len(resp.Warnings) != 0 {
		t.Fatalf("a new rotation's answer has warnings %q", resp.Warnings)
	}
	if id == stsemu.DefaultAccessKey {
		t.Fatal("the rotation kept the key")
	}
	// Its retry is a replay of a success, said in a warning. The rotation
	// stored its new key: that is not a change that ends the window.
	f.clock.Advance(2 * time.Second)
	resp, err = f.driven(logical.UpdateOperation, "config/rotate-root")
	if got := wantRotated(t, resp, err); got != id {
		t.Fatalf("a retry 2s after the rotation got %s, want its %s", got, id)
	}
	if w := strings.Join(resp.Warnings, "\n"); !strings.Contains(w, "this is the answer of the manual rotation that ended at") || !strings.Contains(w, "2s before this request, replayed") {
		t.Fatalf("a replayed success does not say so: warnings %q", resp.Warnings)
	}
	if n := iamCalls(f.emu, "CreateAccessKey"); n != 1 {
		t.Fatalf("%d CreateAccessKey calls, want 1", n)
	}
}

// Breakage: the identity check of the verification. A new key that signs as
// another principal than the user GetUser named is never stored.
func TestRotation_VerificationChecksTheIdentity(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	old := rootKeyID(t, f)
	f.b.rotator.wrapIAM = func(api iamAPI) iamAPI { return &lyingUser{iamAPI: api} }
	resp, err := f.rotate()
	wantCoded(t, resp, err, http.StatusServiceUnavailable, "signs as", "user/someone-else")
	if rootKeyID(t, f) != old {
		t.Fatal("a key that signs as another principal was stored")
	}
	wantOnlyKeys(t, f.emu, old)
}

// lyingUser names another user in GetUser than the keys belong to.
type lyingUser struct{ iamAPI }

func (l *lyingUser) GetUser(ctx context.Context, in *iam.GetUserInput, o ...func(*iam.Options)) (*iam.GetUserOutput, error) {
	out, err := l.iamAPI.GetUser(ctx, in, o...)
	if err == nil && out.User != nil {
		out.User.Arn = aws.String("arn:aws:iam::" + stsemu.DefaultAccount + ":user/someone-else")
	}
	return out, err
}

// Breakage: the scheduled "due" check compares the plan's key and period
// with config/root's: a plan made for another key or period is not due.
func TestRotation_ScheduledDueOnlyForItsPlan(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(st *rotationState)
	}{
		{name: "planned for another key", change: func(st *rotationState) { st.PlanKeySetAt = st.PlanKeySetAt.Add(-time.Hour) }},
		{name: "planned for another period", change: func(st *rotationState) { st.PlanPeriod = 48 * time.Hour }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := rotationFixture(t, fixtureOpts{})
			mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"rotation_period": "24h"})
			old := rootKeyID(t, f)
			st := rotationRecord(t, f.s)
			st.NextRotation = f.clock.Now().Add(-time.Minute) // overdue
			tc.change(st)
			if err := putRotationState(context.Background(), f.s, st); err != nil {
				t.Fatal(err)
			}
			// Driven through the fixture's clock (issue 32 item 8): a due
			// check that let the rotation through would otherwise sleep on
			// the fake clock (settling the new key) until the package's
			// timeout, instead of failing here.
			done := make(chan struct{})
			var err error
			go func() {
				defer close(done)
				_, err = f.b.rotator.rotateRoot(context.Background(), f.s, rotationScheduled)
			}()
			f.clock.DriveUntil(t, done)
			if err != errNotDue {
				t.Fatalf("a scheduled rotation of a stale plan: %v, want errNotDue", err)
			}
			if rootKeyID(t, f) != old {
				t.Fatal("a stale plan rotated the key")
			}
		})
	}
}

// Breakage: the schedule resumes after a restart or failover: a new backend
// on the same storage arms the stored plan, and rotates when it is due.
func TestRotation_ScheduleResumesAfterRestart(t *testing.T) {
	clk := newFakeClock(time.Now().Truncate(time.Second))
	emu := startEmulator(t, stsemu.Config{Now: clk.Now, MaxLifetime: 10 * time.Minute})
	f := newFixtureWith(t, fixtureOpts{}, clk, emu)
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"iam_endpoint": emu.URL(), "rotation_period": "10h"})
	due := rotationRecord(t, f.s).NextRotation
	old := rootKeyID(t, f)
	f.b.Cleanup(context.Background())

	b2, _ := newTestBackend(t, testOpts{clock: f.clock, rand: randMin, storage: f.s})
	if at := b2.rotator.scheduled(); !at.Equal(due) {
		t.Fatalf("after a restart the rotation is armed for %v, want the stored %v", at, due)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		waitFor(t, "the resumed rotation", func() bool { return rotationRecord(t, f.s).Outcome == rotationSuccess })
	}()
	f.clock.AdvanceTo(due)
	f.clock.DriveUntil(t, done)
	if st := rotationRecord(t, f.s); st.Outcome != rotationSuccess {
		t.Fatalf("the resumed rotation: %+v", st)
	}
	if got := mustDo(t, b2, f.s, logical.ReadOperation, "config/root", nil).Data["access_key"]; got == old {
		t.Fatal("the resumed rotation stored no new key")
	}
}

// Breakage: scheduled rotation is armed only where the refresher runs: a
// performance standby over the same storage never arms it, nor rotates.
func TestRotation_StandbyNeverArms(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"rotation_period": "10h"})
	st := rotationRecord(t, f.s)
	f.b.Cleanup(context.Background()) // the active node is gone; nothing else rotates
	creates := iamCalls(f.emu, "CreateAccessKey")

	standby, _ := newTestBackend(t, testOpts{clock: f.clock, rand: randMin, storage: f.s, standby: true})
	standby.rotator.planRotation(context.Background(), f.s, st)
	if at := standby.rotator.scheduled(); !at.IsZero() {
		t.Fatalf("a standby armed the rotation for %v", at)
	}
	f.clock.AdvanceTo(st.NextRotation.Add(time.Hour))
	f.clock.WaitUntil(t, func() bool { return f.clock.Busy() == 0 }, func() string { return "timers to settle" })
	if n := iamCalls(f.emu, "CreateAccessKey"); n != creates {
		t.Fatalf("a standby rotated: %d CreateAccessKey calls, want %d", n, creates)
	}
}

// mustRotate rotates and returns the new key id; it must succeed.
func (f *fixture) mustRotate() string {
	f.t.Helper()
	resp, err := f.rotate()
	return wantRotated(f.t, resp, err)
}

// Every storage call of a rotation can fail, applied or not: whatever
// fails, no key is lost (config/root's key works, and every other key on
// the user is on record), and once storage heals, the reconciler's pass
// and one rotation leave exactly config/root's key.
func TestRotation_StorageFaultsNeverLoseAKey(t *testing.T) {
	for seed := uint64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			fs := newFaultStorage(new(logical.InmemStorage), seed)
			f := rotationFixture(t, fixtureOpts{storage: fs})
			f.mustReadCreds(testRole)
			for i := 0; i < 4; i++ {
				fs.setRate(0.25, 0.5)
				_, _ = f.rotate()
				fs.heal()
				root, err := getRootConfig(context.Background(), f.s)
				if err != nil || root == nil {
					t.Fatalf("config/root after rotation %d: %v", i, err)
				}
				st := rotationRecord(t, f.s)
				for _, k := range f.emu.IAMUsers()[0].AccessKeys {
					meta := iamtypes.AccessKeyMetadata{AccessKeyId: aws.String(k.AccessKeyID), CreateDate: aws.Time(k.CreateDate)}
					if id := k.AccessKeyID; id != root.AccessKey && id != st.PendingKeyID && id != st.RetiredKeyID && !st.Creating.covers(meta) {
						t.Fatalf("rotation %d left key %s on the user, on record nowhere (config/root %s, record %+v)", i, id, root.AccessKey, st)
					}
				}
				f.b.clients.reset() // as a storage fault's reload would
				wantWorkingKey(t, f)
			}
			t.Logf("%d storage faults injected", fs.injectedTotal())
			f.periodic()
			id := f.mustRotate()
			wantOnlyKeys(t, f.emu, id)
			wantWorkingKey(t, f)
		})
	}
}

// config/root records that its key was stored by a rotation (the grace a
// failover keeps, TestSTSClients_GraceSurvivesAFailover): a rotation sets
// the record, a write that keeps the key keeps it, and an operator's new
// key clears it.
func TestRotation_RecordsThatTheKeyWasRotated(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	rotated := func() bool {
		t.Helper()
		cfg, err := getRootConfig(context.Background(), f.s)
		if err != nil {
			t.Fatal(err)
		}
		return cfg.KeyRotated
	}
	if rotated() {
		t.Fatal("the operator's first key is recorded as rotated")
	}
	resp, err := f.rotate()
	wantRotated(t, resp, err)
	if !rotated() {
		t.Fatal("the rotated key is not recorded as rotated")
	}
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"rotation_period": "720h"})
	if !rotated() {
		t.Fatal("a write that kept the key cleared the record")
	}
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"access_key": "AKIAOPERATORWRITE000", "secret_key": "operator/secret"})
	if rotated() {
		t.Fatal("the operator's new key is recorded as rotated")
	}
}
