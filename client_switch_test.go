package awsresilient

import (
	"context"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/smithy-go"
	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// After a rotation's switch the old key's set is the new one's fallback,
// with the new set's grace, until drainKey detaches it; a plain reset (an
// operator's write) keeps no fallback.
func TestSTSClients_SwitchKeepsTheOldKeyAsFallback(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	root := &fakeRoot{cfg: testRootConfig("AKIAONE")}
	root.cfg.KeySetAt = t0
	c := newSTSClients(func() time.Time { return t0 }, newAWSClocks(clock.Real{}, "test"), root.read, nil)
	acquire := func() ([]*stsEndpoint, func()) {
		t.Helper()
		eps, release, err := c.acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return eps, release
	}
	eps, release := acquire()
	release()
	if len(eps) != 1 || !eps[0].graceUntil.IsZero() {
		t.Fatalf("first set: %d endpoints, grace until %s; want 1 and no grace (no rotation switched to it)", len(eps), eps[0].graceUntil)
	}

	root.mu.Lock()
	root.cfg = testRootConfig("AKIATWO")
	root.cfg.KeySetAt = t0.Add(time.Hour)
	root.mu.Unlock()
	c.switchKey("AKIATWO")
	eps, releaseBoth := acquire()
	if len(eps) != 2 || eps[0].secretKey != "AKIATWOsecret" || eps[1].secretKey != "AKIAONEsecret" {
		t.Fatalf("after the switch: %d endpoints (%v), want the new key's then the old key's", len(eps), eps)
	}
	if eps[0].label != "primary" || eps[1].label != "old_key_primary" {
		t.Errorf("metrics labels %q, %q; want primary, old_key_primary (not fallback_1, a configured endpoint's name)", eps[0].label, eps[1].label)
	}
	if want := t0.Add(keySwitchGrace); !eps[0].graceUntil.Equal(want) || !eps[1].graceUntil.Equal(want) {
		t.Errorf("graces end %s and %s, want the switch's %s for both", eps[0].graceUntil, eps[1].graceUntil, want)
	}

	// The drain detaches the fallback at once and waits for its users.
	if c.drainKey(context.Background(), "AKIAONE", 10*time.Millisecond) {
		t.Fatal("drainKey reported the old key drained while an attempt still held it as its fallback")
	}
	if eps, release := acquire(); len(eps) != 1 {
		release()
		t.Fatalf("after the drain began an attempt got %d endpoints, want only the new key's", len(eps))
	} else {
		release()
	}
	releaseBoth()
	if !c.drainKey(context.Background(), "AKIAONE", time.Second) {
		t.Fatal("drainKey did not see the old key's last user end")
	}

	// An operator's write: no fallback.
	root.mu.Lock()
	root.cfg = testRootConfig("AKIATHREE")
	root.mu.Unlock()
	c.switchKey("AKIAFOUR")
	c.reset()
	if eps, release := acquire(); len(eps) != 1 || !eps[0].graceUntil.IsZero() {
		t.Errorf("after an operator's write: %d endpoints, grace until %s; want 1 and no grace", len(eps), eps[0].graceUntil)
		release()
	} else {
		release()
	}
}

// An InvalidClientTokenId is retryable only within the grace after a key
// change; other non-retryable codes never are.
func TestSTSEndpoint_ClassifyWithinGrace(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ep := &stsEndpoint{graceUntil: t0.Add(keySwitchGrace)}
	for _, tc := range []struct {
		code string
		at   time.Time
		want bool
	}{
		{"InvalidClientTokenId", t0, true},
		{"UnrecognizedClientException", t0.Add(keySwitchGrace - time.Nanosecond), true},
		{"InvalidClientTokenId", t0.Add(keySwitchGrace), false},
		{"AccessDenied", t0, false},
		{"SignatureDoesNotMatch", t0, false},
		{"Throttling", t0.Add(time.Hour), true},
	} {
		re := ep.classify(&smithy.GenericAPIError{Code: tc.code, Message: "m"}, tc.at)
		if re.Retryable != tc.want || re.Code != tc.code {
			t.Errorf("%s at +%s: %s retryable=%v, want %v", tc.code, tc.at.Sub(t0), re.Code, re.Retryable, tc.want)
		}
	}
	if classify(&smithy.GenericAPIError{Code: "InvalidClientTokenId"}, "").Retryable {
		t.Error("classify itself made InvalidClientTokenId retryable: only an endpoint within its grace may")
	}
}

// TestRefresh_AfterASwitch (issue 21, defect 10), against the emulator on
// the fake clock: a new key that IAM still refuses (the emulator's
// inconsistency window, refusing every call) fails no refresh while the old
// key is the fallback; once the rotation drains the old key, its refusals
// are retried on every block within the grace; after the grace one refusal
// ends the cycle, as any invalid key does.
func TestRefresh_AfterASwitch(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	f.emu.SetIAMWindows(stsemu.IAMWindows{Inconsistency: time.Hour, Refusal: 1})
	newID, newSecret := createKeyWithSecret(t, f.emu)
	if stored, err := f.b.rotator.storeRotatedKey(context.Background(), f.s, stsemu.DefaultAccessKey, newID, newSecret); err != nil || stored != keyNew {
		t.Fatalf("storing the new key: %v, %v", stored, err)
	}
	switched := f.clock.Now()

	count := func(from int) (newRefused, oldOK int) {
		for _, c := range f.emu.Calls()[from:] {
			switch {
			case c.Action != "AssumeRole":
			case c.AccessKeyID == newID && c.Outcome == "InvalidClientTokenId":
				newRefused++
			case c.AccessKeyID == stsemu.DefaultAccessKey && c.Outcome == "ok":
				oldOK++
			default:
				t.Errorf("unexpected AssumeRole call: %+v", c)
			}
		}
		return
	}

	// 1. The old key is the fallback: the cycle succeeds in its first attempt.
	mark := len(f.emu.Calls())
	if st := f.refresh(testRole); st["failed_cycles"] != 0 || st["last_error"] != "" {
		t.Fatalf("a refresh after the switch failed: %v", st)
	}
	if refused, ok := count(mark); refused != 1 || ok != 1 {
		t.Fatalf("after the switch: %d refusals of the new key and %d successes of the old one, want 1 and 1", refused, ok)
	}

	// 2. The rotation drains the old key: refusals are retried on each block.
	if !f.b.clients.drainKey(context.Background(), stsemu.DefaultAccessKey, time.Second) {
		t.Fatal("the old key did not drain")
	}
	attempts := f.b.settings.policy().MaxRetries
	mark = len(f.emu.Calls())
	st := f.refresh(testRole)
	if refused, ok := count(mark); refused != attempts || ok != 0 {
		t.Fatalf("within the grace: %d refusals, %d old-key calls; want %d attempts, each refused", refused, ok, attempts)
	}
	if st["failed_cycles"] != 1 {
		t.Fatalf("status after a cycle of refusals: %v", st)
	}

	// 3. After the grace, one refusal ends the cycle. The role's planned
	// refresh may fire as the clock jumps, beside refresh/'s cycle: each
	// cycle ends after one refusal.
	mark = len(f.emu.Calls())
	f.clock.AdvanceTo(switched.Add(keySwitchGrace))
	st = f.refresh(testRole)
	cycles := st["failed_cycles"].(int) - 1
	if refused, _ := count(mark); refused != cycles || cycles < 1 || st["attempts_last_cycle"] != 1 {
		t.Fatalf("after the grace: %d refusals in %d cycles, the last of %v attempts; want one refusal, one attempt, per cycle (InvalidClientTokenId is final again)",
			refused, cycles, st["attempts_last_cycle"])
	}
}

// createKeyWithSecret makes an access key of the emulator's root user with
// the real IAM client and returns it with its secret.
func createKeyWithSecret(t *testing.T, emu *stsemu.Emulator) (id, secret string) {
	t.Helper()
	c := iam.New(iam.Options{
		Region:       partitionAWS.iamRegion,
		BaseEndpoint: aws.String(emu.URL()),
		Credentials:  credentials.NewStaticCredentialsProvider(stsemu.DefaultAccessKey, stsemu.DefaultSecretKey, ""),
		Retryer:      aws.NopRetryer{},
	})
	out, err := c.CreateAccessKey(context.Background(), &iam.CreateAccessKeyInput{})
	if err != nil {
		t.Fatal(err)
	}
	return aws.ToString(out.AccessKey.AccessKeyId), aws.ToString(out.AccessKey.SecretAccessKey)
}

// TestRotation_OldKeyIsTheFallbackWhileItSettles: once config/root holds
// the new key, refreshes get the old key's endpoints after the new ones for
// keySwitchSettle on the fake clock; then the rotation drains and deletes
// the old key, and only the new key's endpoints remain. That holds whether
// or not a refresh built the old key's clients since config/root was last
// written: an operator who sets rotation_period and then rotates at once
// (before any refresh) must get the fallback too.
func TestRotation_OldKeyIsTheFallbackWhileItSettles(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before func(f *fixture)
	}{
		{"a refresh built the old key's clients", func(f *fixture) { f.mustReadCreds(testRole) }},
		{"config/root written since the last refresh", func(f *fixture) {
			f.mustReadCreds(testRole)
			mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"iam_endpoint": f.emu.URL()})
		}},
		{"no refresh yet", func(*fixture) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := rotationFixture(t, fixtureOpts{})
			tc.before(f)
			checkFallbackWhileSettling(t, f)
		})
	}
}

func checkFallbackWhileSettling(t *testing.T, f *fixture) {
	t.Helper()
	rotation := f.start(logical.UpdateOperation, "config/rotate-root")
	waitFor(t, "the rotation to store the new key", func() bool { return rootKeyID(t, f) != stsemu.DefaultAccessKey })
	settling := false
	waitFor(t, "the rotation to settle or end", func() bool {
		select {
		case <-rotation.done:
			return true
		default:
		}
		_, settling = f.clock.NextSleeper()
		return settling
	})
	if !settling {
		t.Fatalf("the rotation ended without keeping the old key as the fallback (rotate-root: %v %v; the user's keys: %v)",
			rotation.r.err, respErr(rotation.r.resp), userKeys(t, f.emu))
	}
	stored := f.clock.Now()
	eps, release, err := f.b.clients.acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 2 || eps[1].secretKey != stsemu.DefaultSecretKey {
		t.Fatalf("while the rotation settles refreshes get %d endpoints, want the new key's and the old key's", len(eps))
	}
	release()
	if keys := userKeys(t, f.emu); len(keys) != 2 {
		t.Fatalf("the old key was deleted before the settle ended: keys %v", keys)
	}
	r := f.await(rotation)
	if r.err != nil || r.resp.IsError() {
		t.Fatalf("rotate-root: %v %v", r.err, respErr(r.resp))
	}
	if settled := f.clock.Now().Sub(stored); settled != keySwitchSettle {
		t.Errorf("the old key was kept %s after the switch, want %s", settled, keySwitchSettle)
	}
	if eps, release, _ := f.b.clients.acquire(context.Background()); len(eps) != 1 {
		release()
		t.Fatalf("after the rotation refreshes get %d endpoints, want only the new key's", len(eps))
	} else {
		release()
	}
	if keys := userKeys(t, f.emu); len(keys) != 1 || keys[0] != r.resp.Data["access_key"] {
		t.Fatalf("after the rotation the user has %v", keys)
	}
}

// A node that did not run the rotation (the new active node after a
// failover, or the same node after a restart) gives the rotated key the
// grace from config/root's record: KeyRotated, from KeySetAt. A key an
// operator wrote gets none, whenever it was written.
func TestSTSClients_GraceSurvivesAFailover(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		rotated bool
		want    time.Time
	}{
		{"stored by a rotation", true, t0.Add(keySwitchGrace)},
		{"written by an operator", false, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := &fakeRoot{cfg: testRootConfig("AKIATWO")}
			root.cfg.KeySetAt, root.cfg.KeyRotated = t0, tc.rotated
			// A fresh owner: no switchKey ever ran on this node.
			c := newSTSClients(func() time.Time { return t0.Add(time.Minute) }, newAWSClocks(clock.Real{}, "test"), root.read, nil)
			eps, release, err := c.acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			release()
			if !eps[0].graceUntil.Equal(tc.want) {
				t.Fatalf("grace until %s, want %s", eps[0].graceUntil, tc.want)
			}
		})
	}
}
