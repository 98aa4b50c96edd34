package credhelper

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
)

// skewedVault is a Vault whose plugin judges by AWS's clock, offset from
// this host's (the fake clock's): it answers a credential with left to
// live by AWS's clock, whose expiration is an instant of AWS's clock, and
// expires_in (omitted when expiresIn is false, as an older plugin does).
// reads counts the reads it answered.
func skewedVault(t *testing.T, clk *clocktest.Fake, offset, left time.Duration, expiresIn bool) (r *Reader, reads *atomic.Int64) {
	t.Helper()
	reads = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reads.Add(1)
		data := map[string]any{"access_key": "AKSKEW", "secret_key": "secret-AKSKEW", "security_token": "token-AKSKEW",
			"expiration": clk.Now().Add(offset + left).UTC().Format(time.RFC3339)}
		if expiresIn {
			data["expires_in"] = int64(left / time.Second)
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"data": data})
	}))
	t.Cleanup(srv.Close)
	client, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	client.SetToken("vault-token")
	return &Reader{Client: client, Mount: "aws-resilient", Role: "app", Clock: clk}, reads
}

// TestSkew_ExpirationOnThisHostsClock: the helper's host is minutes off
// AWS's clock, as the plugin sees it. The credential's expiry is this
// host's now plus the plugin's expires_in, whatever the expiration (an
// instant of AWS's clock) says: the helper serves it, reads Vault again and
// hands the SDKs an Expiration that they compare with this host's clock.
// Taken from expiration instead, with AWS 10 minutes behind a 10-minute
// credential looks expired on arrival and is refused; with AWS ahead the
// SDKs would keep it past its end.
func TestSkew_ExpirationOnThisHostsClock(t *testing.T) {
	const left = 10 * time.Minute
	for _, offset := range []time.Duration{-2 * time.Hour, -10 * time.Minute, -4 * time.Minute, -time.Minute, 0,
		time.Minute, 4 * time.Minute, 10 * time.Minute, 2 * time.Hour} {
		t.Run("aws "+offset.String(), func(t *testing.T) {
			clk := clocktest.NewFake(t0)
			r, reads := skewedVault(t, clk, offset, left, true)
			c := NewCache(context.Background(), r.Read, clk, func() float64 { return 0 })
			cr, err := c.Get()
			if err != nil {
				t.Fatalf("Get of a credential with %s left by AWS's clock: %v", left, err)
			}
			if want := t0.Add(left); !cr.Expiration.Equal(want) {
				t.Fatalf("Expiration %s, want this host's now + expires_in = %s", cr.Expiration, want)
			}
			if want := t0.Add(offset + left); !cr.AWSExpiration.Equal(want) {
				t.Fatalf("AWSExpiration %s, want the plugin's %s", cr.AWSExpiration, want)
			}
			// The SDKs get the expiry on this host's clock, in both shapes.
			for name, render := range map[string]func(Credential) ([]byte, error){"credential_process": ProcessJSON, "container": containerJSON} {
				b, err := render(cr)
				if err != nil {
					t.Fatal(err)
				}
				var out struct{ Expiration string }
				if err := json.Unmarshal(b, &out); err != nil || out.Expiration != "2026-12-02T10:10:00Z" {
					t.Fatalf("%s Expiration %q (%v), want 2026-12-02T10:10:00Z, this host's clock", name, out.Expiration, err)
				}
			}
			// Read again after half the life left by AWS's clock.
			if want := t0.Add(left / 2); !c.NextRead().Equal(want) {
				t.Fatalf("next read %s, want %s", c.NextRead(), want)
			}
			// Served from memory until ExpirySafety before its end on this
			// host's clock; then Get reads Vault for a new one.
			clk.AdvanceTo(t0.Add(left - ExpirySafety - time.Second))
			if _, err := c.Get(); err != nil || reads.Load() != 1 {
				t.Fatalf("%s before its end: %v after %d reads, want the cached credential, 1 read", ExpirySafety+time.Second, err, reads.Load())
			}
			clk.AdvanceTo(t0.Add(left - ExpirySafety))
			if _, err := c.Get(); err != nil || reads.Load() != 2 {
				t.Fatalf("%s before its end on this host's clock: %v after %d reads, want a new read", ExpirySafety, err, reads.Load())
			}
		})
	}
}

// TestSkew_OlderPlugin: an answer without expires_in (an older plugin) is
// judged by its expiration, as before.
func TestSkew_OlderPlugin(t *testing.T) {
	clk := clocktest.NewFake(t0)
	r, _ := skewedVault(t, clk, 0, 10*time.Minute, false)
	cr, err := r.Read(context.Background())
	if err != nil || !cr.Expiration.Equal(t0.Add(10*time.Minute)) || !cr.Expiration.Equal(cr.AWSExpiration) {
		t.Fatalf("without expires_in: Expiration %s, AWSExpiration %s (%v), want both the answer's expiration", cr.Expiration, cr.AWSExpiration, err)
	}
}

// TestSkew_MalformedExpiresIn: an expires_in that is not a whole number
// of seconds is a malformed answer, not a credential of unknown life.
func TestSkew_MalformedExpiresIn(t *testing.T) {
	data := map[string]any{"access_key": "AK", "secret_key": "s", "security_token": "t", "expiration": "2026-12-02T11:00:00Z"}
	for _, v := range []any{"soon", json.Number("1.5"), json.Number("-3")} {
		data["expires_in"] = v
		_, err := credentialOf(&api.Secret{Data: data}, "aws-resilient/creds/app", t0)
		var e *Error
		if !errors.As(err, &e) || e.Kind != KindMalformed {
			t.Errorf("expires_in %v: %v, want a malformed answer", v, err)
		}
	}
}

// TestSkew_ExpirationFromTheRequestsSend: expires_in is counted from an
// instant of the exchange; on a 400 ms trip the expiry is dated from the
// request's send, never from the answer's arrival (400 ms late).
func TestSkew_ExpirationFromTheRequestsSend(t *testing.T) {
	clk := clocktest.NewFake(t0)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The plugin judged 10 s left as the request arrived; the answer
		// takes 400 ms back.
		clk.Advance(400 * time.Millisecond)
		data := map[string]any{"access_key": "AK", "secret_key": "s", "security_token": "t",
			"expiration": t0.Add(10 * time.Second).UTC().Format(time.RFC3339), "expires_in": int64(10)}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"data": data})
	}))
	t.Cleanup(srv.Close)
	client, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	r := &Reader{Client: client, Mount: "aws-resilient", Role: "app", Clock: clk}
	cr, err := r.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := t0.Add(10 * time.Second); !cr.Expiration.Equal(want) {
		t.Fatalf("Expiration %s, want the send's time + expires_in = %s", cr.Expiration, want)
	}
}
