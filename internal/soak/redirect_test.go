package soak_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The soak's requests follow one 307 to the node its Location names, with
// the token and the body, as Vault's client does; the answer there is the
// answer, and the node that gave it is named.
func TestVaultDoFollowsOneRedirect(t *testing.T) {
	var gotToken, gotBody, gotMethod string
	active := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		gotToken, gotMethod = req.Header.Get("X-Vault-Token"), req.Method
		b, _ := io.ReadAll(req.Body)
		gotBody = string(b)
		io.WriteString(w, `{"data":{"access_key":"AKIA1"}}`)
	}))
	defer active.Close()
	standby := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		http.Redirect(w, req, active.URL+req.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	defer standby.Close()

	a := vaultDo(httpClient, standby.URL, "tok", http.MethodPost, "m/roles/r", map[string]string{"role_arn": "x"})
	if a.err != nil || a.code != 200 || !strings.Contains(string(a.body), "AKIA1") {
		t.Fatalf("answer %d %q %v, want the active node's 200", a.code, a.body, a.err)
	}
	if !a.redirected || a.served != active.URL {
		t.Errorf("redirected=%v served=%q, want true and %q", a.redirected, a.served, active.URL)
	}
	if gotToken != "tok" || gotMethod != http.MethodPost || gotBody != `{"role_arn":"x"}` {
		t.Errorf("the active node got token %q method %s body %q: the redirect must resend all three", gotToken, gotMethod, gotBody)
	}

	// No redirect: the first node's answer, not marked.
	a = vaultDo(httpClient, active.URL, "tok", http.MethodGet, "m/creds/r", nil)
	if a.err != nil || a.code != 200 || a.redirected || a.served != active.URL {
		t.Errorf("direct: %d %v redirected=%v served=%q", a.code, a.err, a.redirected, a.served)
	}
}

// What a client would not complete stays a failure: a second 307, a
// Location that refuses connections, a 5xx at the Location.
func TestVaultDoFailsWhatAClientWouldNot(t *testing.T) {
	var other *httptest.Server
	hits := 0
	loop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		hits++
		http.Redirect(w, req, other.URL+req.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	defer loop.Close()
	other = loop // redirects to itself: a second 307
	a := vaultDo(httpClient, loop.URL, "tok", http.MethodGet, "m/creds/r", nil)
	if a.err == nil || a.code != http.StatusTemporaryRedirect || !a.redirected {
		t.Errorf("two 307s: %d %v redirected=%v, want a failure with status 307", a.code, a.err, a.redirected)
	}
	if hits != 2 {
		t.Errorf("%d requests through redirects, want 2: one redirect is followed, not more", hits)
	}

	gone := httptest.NewServer(http.NotFoundHandler())
	goneURL := gone.URL
	gone.Close()
	toGone := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		http.Redirect(w, req, goneURL+req.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	defer toGone.Close()
	a = vaultDo(httpClient, toGone.URL, "secret-token", http.MethodGet, "m/creds/r", nil)
	if a.err == nil || a.code != 0 || a.served != goneURL {
		t.Errorf("refused at the Location: %d %v served=%q, want an error, no status, %s", a.code, a.err, a.served, goneURL)
	}
	if strings.Contains(a.err.Error(), "secret-token") {
		t.Errorf("the error holds the token: %v", a.err)
	}

	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		http.Error(w, `{"errors":["local node not active but active cluster node not found"]}`, http.StatusInternalServerError)
	}))
	defer failing.Close()
	toFailing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		http.Redirect(w, req, failing.URL+req.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	defer toFailing.Close()
	a = vaultDo(httpClient, toFailing.URL, "tok", http.MethodGet, "m/creds/r", nil)
	if a.code != 500 || !a.redirected || a.served != failing.URL {
		t.Errorf("5xx at the Location: %d %v redirected=%v served=%q, want 500 from %s", a.code, a.err, a.redirected, a.served, failing.URL)
	}
}
