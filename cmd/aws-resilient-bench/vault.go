package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/bench"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// api is a plain HTTP client for one Vault server. Unlike vaulttest's
// helpers it returns errors instead of failing a TB, so many goroutines can
// use it at once.
type api struct {
	addr, token string
	c           *http.Client
}

func newAPI(s *vaulttest.Server) *api {
	return &api{addr: s.Addr, token: s.RootToken(), c: bench.NewHTTPClient(128)}
}

// do sends method /v1/path with a JSON body and decodes a JSON answer into
// out. A non-2xx answer is an error carrying Vault's messages (never the
// body, which may hold a credential).
func (a *api) do(method, path string, body, out any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, a.addr+"/v1/"+path, r)
	if err != nil {
		return err
	}
	// No token for a login (section g's userpass logins).
	if a.token != "" {
		req.Header.Set("X-Vault-Token", a.token)
	}
	resp, err := a.c.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Errors []string `json:"errors"`
		}
		_ = json.Unmarshal(b, &e)
		return fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, strings.Join(e.Errors, "; "))
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: decoding answer: %w", method, path, err)
		}
	}
	return nil
}

func (a *api) write(path string, body any) error { return a.do(http.MethodPut, path, body, nil) }

// getRaw sends GET /v1/path and returns the body as sent, for a path that
// answers with a raw body (the metrics path) rather than Vault's JSON.
func (a *api) getRaw(path string) ([]byte, error) {
	req, err := http.NewRequest(http.MethodGet, a.addr+"/v1/"+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Vault-Token", a.token)
	resp, err := a.c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: HTTP %d", path, resp.StatusCode)
	}
	return b, nil
}

// secret is the envelope of a Vault read.
type secret struct {
	LeaseID       string         `json:"lease_id"`
	LeaseDuration int            `json:"lease_duration"`
	Data          map[string]any `json:"data"`
}

func (a *api) read(path string) (*secret, error) {
	var s secret
	if err := a.do(http.MethodGet, path, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// statusInfo is one role's entry in LIST status/.
type statusInfo struct {
	State       string `json:"state"`
	Expiration  string `json:"expiration"`
	NextRefresh string `json:"next_refresh"`
}

// listStatus returns LIST <mount>/status/ key_info.
func (a *api) listStatus(mount string) (map[string]statusInfo, error) {
	var out struct {
		Data struct {
			KeyInfo map[string]statusInfo `json:"key_info"`
		} `json:"data"`
	}
	if err := a.do("LIST", mount+"/status/", nil, &out); err != nil {
		return nil, err
	}
	return out.Data.KeyInfo, nil
}

// parallel runs fn(0..n-1) on `workers` goroutines and returns the first
// error.
func parallel(n, workers int, fn func(i int) error) error {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
					next.Store(int64(n)) // stop handing out work
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

func roleARN(name string) string {
	return "arn:aws:iam::" + vaulttest.EmulatorAccount + ":role/" + name
}

// setupMount mounts the plugin at mount, points config/root at emu and
// writes the config/refresh fields given.
func setupMount(tb *bench.TB, s *vaulttest.Server, a *api, mount string, emu *vaulttest.Emulator, refresh map[string]any) {
	s.EnablePlugin(tb, mount, vaulttest.DefaultPluginVersion)
	must(tb, a.write(mount+"/config/root", map[string]any{
		"access_key": emu.AccessKey, "secret_key": emu.SecretKey,
		"region": "us-east-1", "sts_endpoint": emu.URL,
	}))
	if len(refresh) > 0 {
		must(tb, a.write(mount+"/config/refresh", refresh))
	}
}

// createRoles writes assumed_role roles named names[i] and then reads each
// one's creds once, so every role has a cached credential.
func createRoles(tb *bench.TB, a *api, mount string, names []string, warm bool) {
	must(tb, parallel(len(names), 16, func(i int) error {
		return a.write(mount+"/roles/"+names[i], map[string]any{"credential_type": "assumed_role", "role_arn": roleARN(names[i])})
	}))
	if warm {
		must(tb, parallel(len(names), 64, func(i int) error {
			_, err := a.read(mount + "/creds/" + names[i])
			return err
		}))
	}
}

func must(tb *bench.TB, err error) {
	if err != nil {
		tb.Fatal(err)
	}
}

// waitUntil polls cond every interval until it holds or timeout passes.
// every runs f in a goroutine that wg counts, once per period (the first
// after one period), until stop is closed.
func every(wg *sync.WaitGroup, stop <-chan struct{}, period time.Duration, f func()) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(period):
			}
			f()
		}
	}()
}

func waitUntil(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

// saveProfile writes a CPU profile of Vault over d (sys/pprof/profile,
// root token) to path.
func (a *api) saveProfile(path string, d time.Duration) error {
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/v1/sys/pprof/profile?seconds=%d", a.addr, int(d.Seconds())), nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-Vault-Token", a.token)
	resp, err := a.c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("sys/pprof/profile: HTTP %d", resp.StatusCode)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
