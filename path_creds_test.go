package awsresilient

import (
	"bytes"
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

func TestCreds_Lease(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	resp := f.mustReadCreds(testRole)
	c := cached(t, f.s, testRole)

	if resp.Secret == nil || resp.Secret.Renewable {
		t.Fatalf("secret = %+v, want a non-renewable lease", resp.Secret)
	}
	// Its remaining validity at the late edge of the node's estimate of
	// AWS's clock: the Date's whole second leaves it up to 1 s ahead.
	maxErr := time.Duration(f.status(testRole)["aws_clock_error"].(float64) * float64(time.Second))
	if want := (c.Expiration.Sub(f.clock.Now()) - maxErr).Truncate(time.Second); resp.Secret.TTL != want || resp.Secret.MaxTTL != want {
		t.Fatalf("TTL = %v, MaxTTL = %v, want the remaining validity %v", resp.Secret.TTL, resp.Secret.MaxTTL, want)
	}
	wantData := map[string]interface{}{
		"access_key": c.AccessKey, "secret_key": c.SecretKey, "security_token": c.SessionToken,
		"expiration": c.Expiration.UTC().Format(time.RFC3339), "arn": c.ARN,
	}
	for k, v := range wantData {
		if resp.Data[k] != v {
			t.Fatalf("%s = %v, want %v", k, resp.Data[k], v)
		}
	}
	for k, v := range resp.Secret.InternalData {
		if v == c.SecretKey || v == c.SessionToken {
			t.Fatalf("lease internal data %s holds a secret", k)
		}
	}

	t.Run("TTL shrinks as the credential ages", func(t *testing.T) {
		f.clock.Advance(2*time.Minute + 500*time.Millisecond)
		resp := mustDo(t, f.b, f.s, logical.ReadOperation, "creds/"+testRole, nil)
		if want := f.b.state.peek(roleKey(testRole)).cred.remaining(f.clock.Now()).Truncate(time.Second); resp.Secret.TTL != want || want < 7*time.Minute+58*time.Second {
			t.Fatalf("TTL = %v, want %v", resp.Secret.TTL, want)
		}
	})
	t.Run("revoke is a no-op", func(t *testing.T) {
		before := snapshot(t, f.s)
		rresp, err := f.b.HandleRequest(context.Background(), &logical.Request{
			Operation: logical.RevokeOperation, Storage: f.s, Secret: resp.Secret,
		})
		if err != nil || rresp != nil {
			t.Fatalf("revoke = %v, %v; want nil, nil", rresp, err)
		}
		if !sameSnapshot(before, snapshot(t, f.s)) {
			t.Fatal("revoke changed storage")
		}
		again := mustDo(t, f.b, f.s, logical.ReadOperation, "creds/"+testRole, nil)
		if again.Data["access_key"] != c.AccessKey {
			t.Fatal("revoke dropped the shared credential")
		}
	})
	t.Run("renew is refused", func(t *testing.T) {
		_, err := f.b.HandleRequest(context.Background(), &logical.Request{
			Operation: logical.RenewOperation, Storage: f.s, Secret: resp.Secret,
		})
		if err != logical.ErrUnsupportedOperation {
			t.Fatalf("renew err = %v, want unsupported operation", err)
		}
	})
}

// TestCreds_CachedReadSkipsStorageAndSTS checks that a read served from the
// cache costs neither a storage read nor an STS call.
func TestCreds_CachedReadSkipsStorageAndSTS(t *testing.T) {
	store := &countingStorage{Storage: new(logical.InmemStorage)}
	f := newFixture(t, fixtureOpts{storage: store})
	f.mustReadCreds(testRole)
	store.reset()
	f.log.reset()
	for i := 0; i < 100; i++ {
		mustDo(t, f.b, f.s, logical.ReadOperation, "creds/"+testRole, nil)
	}
	if n := store.gets(); n != 0 {
		t.Fatalf("100 cached reads made %d storage reads, want 0", n)
	}
	if n := len(f.log.all()); n != 0 {
		t.Fatalf("100 cached reads made %d STS calls, want 0", n)
	}
}

func TestCreds_UnknownRole(t *testing.T) {
	b, s := getTestBackend(t)
	resp, err := do(t, b, s, logical.ReadOperation, "creds/nope", nil)
	wantBadRequest(t, resp, err, `role "nope" not found`)
}

// TestCreds_NeverServesExpired checks that a credential is served only
// while at least a second of it is left (a lease TTL of 0 would mean the
// mount's default), and that past that a read refreshes instead.
func TestCreds_NeverServesExpired(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	first := f.mustReadCreds(testRole)
	// STS is down from here on, so no cycle can replace the credential.
	// The background refresh is dropped: it would run its failing cycles
	// on its own while the clock jumps, and this test is about what reads
	// serve.
	f.emu.SetFaults(alwaysFail(stsemu.FaultThrottling))
	f.b.refresher.unplan(roleKey(testRole))

	// Left is judged at the late edge of the node's estimate of AWS's
	// clock (its offset and error).
	edge := judgedAt(t, f.b, roleKey(testRole), minServeValidity)
	f.clock.AdvanceTo(edge.Add(-time.Millisecond))
	resp := mustDo(t, f.b, f.s, logical.ReadOperation, "creds/"+testRole, nil)
	if resp.Data["access_key"] != first.Data["access_key"] || resp.Secret.TTL != time.Second {
		t.Fatalf("with just over 1s left: key %v TTL %v, want the cached one with TTL 1s", resp.Data["access_key"], resp.Secret.TTL)
	}

	f.clock.AdvanceTo(edge.Add(time.Millisecond))
	r, err := f.readCreds(testRole)
	wantCoded(t, r, err, 503, "Throttling")

	// Fixed: served from the next retry block on (the read budget).
	f.emu.ClearFaults()
	f.clock.Advance(f.b.settings.policy().block())
	resp = f.mustReadCreds(testRole)
	if resp.Data["access_key"] == first.Data["access_key"] {
		t.Fatal("served the credential that was about to expire")
	}
}

// TestCreds_ColdReadBoundedByRequest checks that a cold read gives up when
// its request context ends, while the cycle it started runs on and stores
// the credential for the next reader.
func TestCreds_ColdReadBoundedByRequest(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	release := make(chan struct{})
	f.log.before = func() { <-release }

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan result, 1)
	go func() {
		resp, err := f.b.HandleRequest(ctx, &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: f.s})
		done <- result{resp, err}
	}()
	fl := f.nextFlight()
	waitFor(t, "the reader to join", func() bool { return fl.waiters.Load() == 1 })
	cancel()
	r := <-done
	wantCoded(t, r.resp, r.err, 503, "the request ended while refreshing")

	close(release)
	<-fl.done
	f.log.before = nil
	resp := mustDo(t, f.b, f.s, logical.ReadOperation, "creds/"+testRole, nil)
	if resp.Data["access_key"] != cached(t, f.s, testRole).AccessKey || len(f.log.all()) != 1 {
		t.Fatal("the abandoned cycle did not finish and store its credential")
	}
}

// BenchmarkCredsRead measures a cached creds read through HandleRequest: the
// path Vault takes for every `vault read aws-resilient/creds/<role>`.
// The session token is base64 of 494 bytes, as long as the emulator's
// (AWS's run longer): the mirror holds it decoded, and each read encodes it.
func BenchmarkCredsRead(b *testing.B) {
	storage := new(logical.InmemStorage)
	now := time.Now()
	token := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("sts-session-token\x00\xff"), 26))
	for key, v := range map[string]interface{}{
		rolePrefix + testRole: &roleEntry{CredentialType: credentialTypeAssumedRole, RoleARN: testRoleARN, TTL: time.Hour},
		cachePrefix + testRole: &cacheEntry{AccessKey: "ASIAEXAMPLE", SecretKey: "secret", SessionToken: token,
			IssuedAt: now, Expiration: now.Add(time.Hour)},
	} {
		e, _ := logical.StorageEntryJSON(key, v)
		if err := storage.Put(context.Background(), e); err != nil {
			b.Fatal(err)
		}
	}
	bk, s := newTestBackend(b, testOpts{storage: storage})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: s}
		for pb.Next() {
			resp, err := bk.HandleRequest(context.Background(), req)
			if err != nil || resp.Data["access_key"] != "ASIAEXAMPLE" || resp.Data["security_token"] != token {
				b.Fatalf("%v %v", resp, err)
			}
		}
	})
}

// TestMirroredCredential: the mirror holds a canonical base64 session token
// decoded and serves it encoded exactly as STS issued it; any other token is
// held as it came; RoleHash is left to storage; the credential given is
// never changed.
func TestMirroredCredential(t *testing.T) {
	raw := bytes.Repeat([]byte{0, 0xff, 'a', 0x10}, 100)
	canonical := base64.StdEncoding.EncodeToString(raw)
	for _, tc := range []struct {
		name, token string
		decoded     bool
	}{
		{"canonical base64", canonical, true},
		{"one byte", "AA==", true},
		{"not base64", "old-token", false},
		{"unpadded", strings.TrimRight(base64.StdEncoding.EncodeToString(raw[:10]), "="), false},
		{"line breaks", canonical[:76] + "\n" + canonical[76:], false},
		{"non-zero trailing bits", "AB==", false},
		{"url alphabet", base64.URLEncoding.EncodeToString(raw), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &cacheEntry{AccessKey: "ASIAEXAMPLE", SecretKey: "secret", SessionToken: tc.token, RoleHash: "abc", Expiration: time.Now(),
				ARN: "arn:aws:sts::123456789012:assumed-role/app/s"}
			before := *c
			m := c.mirrored()
			if *c != before {
				t.Fatalf("mirrored changed its argument: %+v", *c)
			}
			if got := m.sessionToken(); got != tc.token {
				t.Fatalf("sessionToken() = %q, want %q", got, tc.token)
			}
			if m.RoleHash != "" || m.AccessKey != c.AccessKey || m.SecretKey != c.SecretKey || m.ARN != c.ARN || !m.Expiration.Equal(c.Expiration) {
				t.Fatalf("mirrored = %+v", *m)
			}
			// One allocation holds the access key, secret key and ARN, none of
			// them the caller's (the decoder's strings are left to the GC).
			base, offset := unsafe.StringData(m.AccessKey), 0
			for i, part := range []string{m.AccessKey, m.SecretKey, m.ARN} {
				if at := unsafe.Pointer(unsafe.StringData(part)); at != unsafe.Add(unsafe.Pointer(base), offset) {
					t.Fatalf("part %d of the mirrored credential is not at +%d of its one allocation", i, offset)
				}
				offset += len(part)
			}
			if unsafe.StringData(m.AccessKey) == unsafe.StringData(c.AccessKey) {
				t.Fatal("the mirror keeps the caller's access key string")
			}
			if (m.tokenRaw != "") != tc.decoded || (m.SessionToken == "") != tc.decoded {
				t.Fatalf("decoded = %v (raw %d bytes, token %q), want %v", m.tokenRaw != "", len(m.tokenRaw), m.SessionToken, tc.decoded)
			}
			if again := m.mirrored(); again != m && tc.decoded {
				t.Fatal("mirroring a mirrored credential copied it again")
			}
		})
	}
	var nilCred *cacheEntry
	if nilCred.mirrored() != nil {
		t.Fatal("a nil credential mirrored to non-nil")
	}
}
