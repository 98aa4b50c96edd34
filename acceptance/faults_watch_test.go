package acceptance

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// This file holds the observers of the fault matrix: goroutines that poll a
// role's creds, its raw storage entry and its status over plain HTTP for the
// whole case and record what they saw. They never call t.Fatal (that is only
// allowed on the test goroutine); the case asserts on the records afterwards.

// fmHTTP talks to Vault for the observers. The timeout is long because a
// cold read of an expired role waits for a whole refresh cycle.
var fmHTTP = &http.Client{Timeout: 60 * time.Second}

// fmGet sends GET /v1/<path> and decodes {"data":...} into data. It returns
// the status code and Vault's error messages.
func fmGet(ctx context.Context, v *vaulttest.Server, path string, data any) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.Addr+"/v1/"+path, nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("X-Vault-Token", v.RootToken())
	resp, err := fmHTTP.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, "", err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Errors []string `json:"errors"`
		}
		_ = json.Unmarshal(b, &e)
		return resp.StatusCode, strings.Join(e.Errors, "; "), nil
	}
	var env struct {
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return resp.StatusCode, "", fmt.Errorf("decoding response: %w", err)
	}
	if data != nil {
		if err := json.Unmarshal(env.Data, data); err != nil {
			return resp.StatusCode, "", fmt.Errorf("decoding data: %w", err)
		}
	}
	return resp.StatusCode, "", nil
}

// credRead is one read of creds/<role> as a client saw it.
type credRead struct {
	Sent, Recv time.Time
	Code       int
	Err        string // Vault's error text on a non-200, or the transport error
	AccessKey  string
	Complete   bool // access key, secret key and session token all present
	Expiration time.Time
}

// storeRead is one read of the role's cache entry through sys/raw: what the
// plugin really stored, not only what it serves.
type storeRead struct {
	// At is when the read was sent, Recv when its answer came: a read sent
	// before a write may still return it.
	At, Recv   time.Time
	Present    bool
	Err        string
	AccessKey  string
	Complete   bool
	Expiration time.Time
}

// statusRead is one read of status/<role>.
type statusRead struct {
	At               time.Time
	State            string
	Attempts, Failed int
	LastError        string
	NextRefresh      time.Time
	LastAttempt      time.Time
	LastSuccess      time.Time
	IssuedAt         time.Time
	CredExpiration   time.Time
	// ClockError is the plugin's own bound on its estimate of AWS's clock
	// (aws_clock_error, seconds), which its serve check allows for.
	ClockError float64
	Err        string
}

func (s statusRead) String() string {
	return fmt.Sprintf("state=%s attempts_last_cycle=%d failed_cycles=%d last_error=%q next_refresh=%s last_attempt=%s",
		s.State, s.Attempts, s.Failed, s.LastError, fmtT(s.NextRefresh), fmtT(s.LastAttempt))
}

func fmtT(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("15:04:05.000")
}

// watcher polls one role of one mount until stopped.
type watcher struct {
	v          *vaulttest.Server
	mount      string
	role       string
	rawPath    string // sys/raw path of the role's cache entry
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	mu         sync.Mutex // guards the three slices
	creds      []credRead
	store      []storeRead
	statuses   []statusRead
	credPeriod time.Duration
}

// startWatcher starts polling creds every 100 ms, and the stored entry and
// the status every 200 ms.
func startWatcher(v *vaulttest.Server, mount, mountUUID, role string) *watcher {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{
		v: v, mount: mount, role: role, cancel: cancel,
		rawPath:    "sys/raw/logical/" + mountUUID + "/cache/" + role,
		credPeriod: 100 * time.Millisecond,
	}
	w.loop(ctx, w.credPeriod, w.readCreds)
	w.loop(ctx, 200*time.Millisecond, w.readStore)
	w.loop(ctx, 200*time.Millisecond, w.readStatus)
	return w
}

func (w *watcher) loop(ctx context.Context, every time.Duration, fn func(context.Context)) {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			fn(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// stop ends polling and waits for the observers.
func (w *watcher) stop() {
	w.cancel()
	w.wg.Wait()
}

func (w *watcher) readCreds(ctx context.Context) {
	var d struct {
		AccessKey     string `json:"access_key"`
		SecretKey     string `json:"secret_key"`
		SecurityToken string `json:"security_token"`
		Expiration    string `json:"expiration"`
	}
	r := credRead{Sent: time.Now()}
	code, msg, err := fmGet(ctx, w.v, w.mount+"/creds/"+w.role, &d)
	r.Recv = time.Now()
	if ctx.Err() != nil {
		return // stopped mid-request: not an observation
	}
	r.Code, r.Err = code, msg
	if err != nil {
		r.Err = err.Error()
	}
	if code == http.StatusOK {
		r.AccessKey = d.AccessKey
		r.Complete = d.AccessKey != "" && d.SecretKey != "" && d.SecurityToken != ""
		r.Expiration, _ = time.Parse(time.RFC3339, d.Expiration)
	}
	w.mu.Lock()
	w.creds = append(w.creds, r)
	w.mu.Unlock()
}

func (w *watcher) readStore(ctx context.Context) {
	var d struct {
		Value string `json:"value"`
	}
	r := storeRead{At: time.Now()}
	code, msg, err := fmGet(ctx, w.v, w.rawPath, &d)
	r.Recv = time.Now()
	if ctx.Err() != nil {
		return
	}
	switch {
	case err != nil:
		r.Err = err.Error()
	case code == http.StatusNotFound:
	case code != http.StatusOK:
		r.Err = fmt.Sprintf("HTTP %d: %s", code, msg)
	default:
		var e struct {
			AccessKey    string    `json:"access_key"`
			SecretKey    string    `json:"secret_key"`
			SessionToken string    `json:"session_token"`
			Expiration   time.Time `json:"expiration"`
		}
		if err := json.Unmarshal([]byte(d.Value), &e); err != nil {
			r.Err = "stored cache entry is not the expected JSON: " + err.Error()
			break
		}
		r.Present = true
		r.AccessKey, r.Expiration = e.AccessKey, e.Expiration
		r.Complete = e.AccessKey != "" && e.SecretKey != "" && e.SessionToken != ""
	}
	w.mu.Lock()
	w.store = append(w.store, r)
	w.mu.Unlock()
}

func (w *watcher) readStatus(ctx context.Context) {
	var d struct {
		State      string  `json:"state"`
		Attempts   int     `json:"attempts_last_cycle"`
		Failed     int     `json:"failed_cycles"`
		LastError  string  `json:"last_error"`
		Next       string  `json:"next_refresh"`
		LastAtt    string  `json:"last_attempt"`
		LastSucc   string  `json:"last_success"`
		IssuedAt   string  `json:"issued_at"`
		Expiration string  `json:"expiration"`
		ClockError float64 `json:"aws_clock_error"`
	}
	r := statusRead{At: time.Now()}
	code, msg, err := fmGet(ctx, w.v, w.mount+"/status/"+w.role, &d)
	if ctx.Err() != nil {
		return
	}
	switch {
	case err != nil:
		r.Err = err.Error()
	case code != http.StatusOK:
		r.Err = fmt.Sprintf("HTTP %d: %s", code, msg)
	default:
		r.State, r.Attempts, r.Failed, r.LastError = d.State, d.Attempts, d.Failed, d.LastError
		r.NextRefresh = parseRFC3339(d.Next)
		r.LastAttempt = parseRFC3339(d.LastAtt)
		r.LastSuccess = parseRFC3339(d.LastSucc)
		r.IssuedAt = parseRFC3339(d.IssuedAt)
		r.CredExpiration = parseRFC3339(d.Expiration)
		r.ClockError = d.ClockError
	}
	w.mu.Lock()
	w.statuses = append(w.statuses, r)
	w.mu.Unlock()
}

func parseRFC3339(s string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

// lastStatus returns the newest successful status read.
func (w *watcher) lastStatus() (statusRead, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.statuses) - 1; i >= 0; i-- {
		if w.statuses[i].Err == "" {
			return w.statuses[i], true
		}
	}
	return statusRead{}, false
}

// findStatus returns the first status read, in order, that matches.
func (w *watcher) findStatus(match func(statusRead) bool) (statusRead, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.statuses {
		if s.Err == "" && match(s) {
			return s, true
		}
	}
	return statusRead{}, false
}

// snapshot returns copies of the records.
func (w *watcher) snapshot() ([]credRead, []storeRead, []statusRead) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]credRead(nil), w.creds...), append([]storeRead(nil), w.store...), append([]statusRead(nil), w.statuses...)
}
