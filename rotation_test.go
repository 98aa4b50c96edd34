package awsresilient

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/iam"
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

func (f *fixture) rotate() (*logical.Response, error) {
	f.t.Helper()
	return f.driven(logical.UpdateOperation, "config/rotate-root")
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
	sc.want("aws_resilient_root_key_age_seconds", nil, 0) // the fake clock stood still
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
		rotated bool // the new key is stored (the old one may linger, recorded)
	}{
		{name: "GetUser denied", faults: iamFault("GetUser", stsemu.FaultAccessDenied), status: 400, want: "iam:GetUser: AccessDenied"},
		{name: "GetUser unavailable", faults: iamFault("GetUser", stsemu.FaultServiceUnavailable), status: 503, want: "iam:GetUser: ServiceUnavailable"},
		{name: "ListAccessKeys throttled", faults: iamFault("ListAccessKeys", stsemu.FaultThrottling), status: 503, want: "iam:ListAccessKeys: Throttling"},
		{name: "CreateAccessKey unavailable", faults: iamFault("CreateAccessKey", stsemu.FaultServiceUnavailable), status: 503, want: "iam:CreateAccessKey: ServiceUnavailable"},
		{name: "verification never succeeds", faults: stsemu.FaultPlan{Actions: []string{"sts:GetCallerIdentity"}, Probability: map[stsemu.Fault]float64{stsemu.FaultServiceUnavailable: 1}},
			status: 503, want: "verification: STS did not accept the new key within 6 attempts"},
		{name: "recording the new key fails", storage: func(fs *faultStorage) { fs.failNext("put", configRotationPath, 1, false) }, status: 500, want: "config/rotation"},
		{name: "storing the new key fails", storage: func(fs *faultStorage) { fs.failNext("put", configRootPath, 1, false) }, status: 500, want: "writing config/root"},
		{name: "storing the new key fails after it landed", storage: func(fs *faultStorage) { fs.failNext("put", configRootPath, 1, true) }, status: 200, rotated: true},
		{name: "deleting the old key fails", faults: iamFault("DeleteAccessKey", stsemu.FaultServiceUnavailable), status: 200, rotated: true},
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
			resp, err := f.rotate()
			f.emu.ClearFaults()
			switch {
			case tc.status == 200:
				if err != nil || resp.IsError() {
					t.Fatalf("rotate-root: err=%v resp=%v", err, respErr(resp))
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
			if !tc.rotated {
				if keys := userKeys(t, f.emu); len(keys) != 1 || keys[0] != old {
					t.Fatalf("after a failed rotation the user's keys are %v, want only %s", keys, old)
				}
			}
			wantWorkingKey(t, f)
			rot := mustDo(t, f.b, f.s, logical.ReadOperation, "config/rotation", nil).Data
			if tc.status != 200 && tc.status != 500 && (rot["outcome"] != rotationFailure || rot["failures"] != 1) {
				t.Fatalf("config/rotation after a failure: %v", rot)
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
		Region:       iamRegion,
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
	done := make(chan result, 1)
	go func() {
		resp, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.UpdateOperation, Path: "config/rotate-root", Storage: f.s})
		done <- result{resp, err}
	}()
	// The rotation sleeps in its verification: the operator writes.
	waitFor(t, "the rotation to sleep in its verification", func() bool { _, ok := f.clock.NextSleeper(); return ok })
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"access_key": "AKIAOPERATORWRITE000", "secret_key": "operator/secret"})
	var r result
	for r.resp == nil && r.err == nil {
		select {
		case r = <-done:
		default:
			if at, ok := f.clock.NextSleeper(); ok {
				f.clock.AdvanceTo(at)
			}
			time.Sleep(time.Millisecond)
		}
	}
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
	rotated := make(chan result, 1)
	go func() {
		resp, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.UpdateOperation, Path: "config/rotate-root", Storage: f.s})
		rotated <- result{resp, err}
	}()
	waitFor(t, "the rotation to store the new key", func() bool { return rootKeyID(t, f) != old })
	select {
	case <-rotated:
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
	r := <-rotated
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
	emu := startEmulator(t, stsemu.Config{Now: clk.Now, SigningNow: time.Now, MaxLifetime: 10 * time.Minute})
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
	resp, err := f.b.HandleRequest(ctx, &logical.Request{Operation: logical.UpdateOperation, Path: "config/rotate-root", Storage: f.s})
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
		wantCoded(t, resp, err, http.StatusServiceUnavailable, "iam:CreateAccessKey")
		if keys := userKeys(t, f.emu); len(keys) != 2 {
			t.Fatalf("keys %v: the lost answer's key should exist", keys)
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
