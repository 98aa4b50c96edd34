package vaulttest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// Emulator is a running cmd/sts-emulator process driven through its
// /_emulator/ control API.
type Emulator struct {
	// URL is the emulator's base URL, http://127.0.0.1:PORT; use it as the
	// plugin's sts_endpoint.
	URL string
	// AccessKey and SecretKey are the root pair the emulator accepts.
	AccessKey, SecretKey string
	// Process is the emulator process (its log holds one line per call).
	Process *Process
	// AlsoURLs are the emulator's other listeners (StartEmulatorListeners):
	// the same STS and IAM, for a fallback endpoint.
	AlsoURLs []string

	client *http.Client
	mu     sync.Mutex
	// refused are the listeners SetListener refused: the control API goes
	// through another one meanwhile.
	refused map[string]bool
}

// EmulatorStats is GET /_emulator/stats: the emulator's own type, decoded
// from its JSON.
type EmulatorStats = stsemu.Stats

// EmulatorCall is one entry of GET /_emulator/calls, including the
// RoleSessionName and SourceIdentity an AssumeRole sent.
type EmulatorCall = stsemu.Call

// EmulatorIAMUser is one entry of GET /_emulator/iam/users: an IAM user and
// its access keys (ids, status, propagation; never a secret).
type EmulatorIAMUser = stsemu.IAMUser

// FaultPlan is the body of POST /_emulator/faults.
type FaultPlan struct {
	Sequence    []FaultStep        `json:"sequence,omitempty"`
	Probability map[string]float64 `json:"probability,omitempty"`
	Hang        string             `json:"hang,omitempty"`
	Match       string             `json:"match,omitempty"`
	// Actions selects the calls the plan applies to; empty means every STS
	// call and no IAM call. Entries: "CreateAccessKey", "iam:GetUser",
	// "iam:*", "sts:*" or "*".
	Actions []string `json:"actions,omitempty"`
}

// FaultStep makes the next Count calls fail with Fault.
type FaultStep struct {
	Fault string `json:"fault"`
	Count int    `json:"count"`
}

var (
	emulatorListening = regexp.MustCompile(`sts-emulator listening on (http://127\.0\.0\.1:\d+)`)
	emulatorAlso      = regexp.MustCompile(`sts-emulator also listening on (http://127\.0\.0\.1:\d+)`)
)

// StartEmulator starts cmd/sts-emulator on a free loopback port with the
// given extra flags (for example "-max-lifetime", "40s") and waits until it
// listens. It is stopped in tb.Cleanup.
func StartEmulator(tb testing.TB, flags ...string) *Emulator {
	tb.Helper()
	return StartEmulatorListeners(tb, 0, flags...)
}

// StartEmulatorListeners is StartEmulator with also more listeners
// (-also-listen) on free loopback ports, sharing the emulator's state:
// their URLs are e.AlsoURLs, and SetListener takes any of them down.
func StartEmulatorListeners(tb testing.TB, also int, flags ...string) *Emulator {
	tb.Helper()
	bin := EmulatorBin(tb)
	dir := tb.TempDir()
	ports := freePorts(tb, 1+also)
	args := []string{"-listen", fmt.Sprintf("127.0.0.1:%d", ports[0])}
	for _, p := range ports[1:] {
		args = append(args, "-also-listen", fmt.Sprintf("127.0.0.1:%d", p))
	}
	p := StartProcess(tb, "sts-emulator", dir, cleanEnv(), bin, append(args, flags...)...)
	// The -also-listen lines come before the listening line.
	url := p.WaitLog(tb, emulatorListening, 30*time.Second)
	e := &Emulator{
		URL:       url,
		AccessKey: EmulatorAccessKey,
		SecretKey: EmulatorSecretKey,
		Process:   p,
		client:    &http.Client{Timeout: 10 * time.Second},
		refused:   map[string]bool{},
	}
	if also > 0 {
		b, err := os.ReadFile(p.LogPath)
		if err != nil {
			tb.Fatal(err)
		}
		for _, m := range emulatorAlso.FindAllSubmatch(b, -1) {
			e.AlsoURLs = append(e.AlsoURLs, string(m[1]))
		}
		if len(e.AlsoURLs) != also {
			tb.Fatalf("sts-emulator announced %d more listeners, want %d", len(e.AlsoURLs), also)
		}
	}
	for i := 0; i+1 < len(flags); i++ {
		switch flags[i] {
		case "-access-key", "--access-key":
			e.AccessKey = flags[i+1]
		case "-secret-key", "--secret-key":
			e.SecretKey = flags[i+1]
		}
	}
	return e
}

func (e *Emulator) control(tb testing.TB, method, path string, body, out any) {
	tb.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			tb.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, e.controlURL()+"/_emulator/"+path, r)
	if err != nil {
		tb.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e.client.Do(req)
	if err != nil {
		tb.Fatalf("emulator %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		tb.Fatalf("emulator %s %s: HTTP %d: %s", method, path, resp.StatusCode, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			tb.Fatalf("emulator %s %s: decoding %q: %v", method, path, b, err)
		}
	}
}

// controlURL is the first listener not refused.
func (e *Emulator) controlURL() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, u := range append([]string{e.URL}, e.AlsoURLs...) {
		if !e.refused[u] {
			return u
		}
	}
	return e.URL
}

// Listener states for SetListener (see cmd/sts-emulator -h).
const (
	ListenerUp          = stsemu.ListenerUp
	ListenerRefused     = stsemu.ListenerRefused
	ListenerUnavailable = stsemu.ListenerUnavailable
)

// SetListener sets the state of the listener at url (e.URL or one of
// e.AlsoURLs): ListenerRefused refuses connections, ListenerUnavailable
// answers every STS and IAM call 503, ListenerUp serves again. The control
// API goes through a listener that is not refused.
func (e *Emulator) SetListener(tb testing.TB, url, state string) {
	tb.Helper()
	mark := func() {
		e.mu.Lock()
		e.refused[url] = state == ListenerRefused
		e.mu.Unlock()
	}
	// The request goes through another listener while this one is refused
	// and while it is being refused: marked before a refusal, after the rest.
	if state == ListenerRefused {
		mark()
	}
	e.control(tb, http.MethodPost, "listeners", map[string]string{"addr": url, "state": state}, nil)
	mark()
}

// Stats returns the emulator's call counts.
func (e *Emulator) Stats(tb testing.TB) EmulatorStats {
	tb.Helper()
	var s EmulatorStats
	e.control(tb, http.MethodGet, "stats", nil, &s)
	return s
}

// Calls returns every STS and IAM call the emulator has answered since the
// last reset, oldest first.
func (e *Emulator) Calls(tb testing.TB) []EmulatorCall {
	tb.Helper()
	var c []EmulatorCall
	e.control(tb, http.MethodGet, "calls", nil, &c)
	return c
}

// Reset clears stats and calls.
func (e *Emulator) Reset(tb testing.TB) {
	tb.Helper()
	e.control(tb, http.MethodPost, "reset", nil, nil)
}

// SetFaults replaces the fault plan.
func (e *Emulator) SetFaults(tb testing.TB, plan FaultPlan) {
	tb.Helper()
	e.control(tb, http.MethodPost, "faults", plan, nil)
}

// ClearFaults removes every fault.
func (e *Emulator) ClearFaults(tb testing.TB) {
	tb.Helper()
	e.control(tb, http.MethodDelete, "faults", nil, nil)
}

// SetConfig applies the fields sent (rate, burst, latency_min, latency_max,
// max_lifetime, deny, iam_propagation), for example
// map[string]any{"max_lifetime": "40s"}.
func (e *Emulator) SetConfig(tb testing.TB, fields map[string]any) {
	tb.Helper()
	e.control(tb, http.MethodPost, "config", fields, nil)
}

// IAMUsers returns the emulator's IAM users with their access keys.
func (e *Emulator) IAMUsers(tb testing.TB) []EmulatorIAMUser {
	tb.Helper()
	var u []EmulatorIAMUser
	e.control(tb, http.MethodGet, "iam/users", nil, &u)
	return u
}

// SetIAMPropagation sets how long keys created from now on are refused
// (InvalidClientTokenId) after CreateAccessKey.
func (e *Emulator) SetIAMPropagation(tb testing.TB, d time.Duration) {
	tb.Helper()
	e.SetConfig(tb, map[string]any{"iam_propagation": d.String()})
}
