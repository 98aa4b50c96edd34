package awsresilient

import (
	"context"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/logical"
)

// settingsFixture is a settings owner on its own storage, with no backend;
// changes records every policy onChange was told of.
type settingsFixture struct {
	st *settings
	s  logical.Storage

	mu      sync.Mutex
	changes []int // MaxRetries of each policy put in force
}

func newSettingsFixture(s logical.Storage) *settingsFixture {
	f := &settingsFixture{s: s}
	f.st = newSettings(func() logical.Storage { return f.s }, hclog.NewNullLogger, func(cfg refreshConfig) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.changes = append(f.changes, cfg.MaxRetries)
	})
	return f
}

func (f *settingsFixture) seen() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.changes...)
}

// storeRetries writes config/refresh with max_retries n straight to s.
func storeRetries(tb testing.TB, s logical.Storage, n int) {
	tb.Helper()
	cfg := defaultRefreshConfig()
	cfg.MaxRetries = n
	putJSON(tb, s, configRefreshPath, cfg)
}

func wantRetries(tb testing.TB, st *settings, want int) {
	tb.Helper()
	if got := st.policy().MaxRetries; got != want {
		tb.Fatalf("max_retries in force = %d, want %d", got, want)
	}
}

func wantSeen(tb testing.TB, f *settingsFixture, want ...int) {
	tb.Helper()
	got := f.seen()
	if len(got) != len(want) {
		tb.Fatalf("onChange saw max_retries %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			tb.Fatalf("onChange saw max_retries %v, want %v", got, want)
		}
	}
}

// TestSettings_FailedReloadKeepsPolicy: a reload that storage fails leaves
// the policy in force and the stale mark set, so the next use reads again;
// a failed load that was not stale does not become stale.
func TestSettings_FailedReloadKeepsPolicy(t *testing.T) {
	fs := newFaultStorage(new(logical.InmemStorage), 1)
	f := newSettingsFixture(fs)
	ctx := context.Background()
	storeRetries(t, fs, 4)
	if err := f.st.load(ctx); err != nil {
		t.Fatal(err)
	}

	storeRetries(t, fs, 5)
	fs.failNext("get", configRefreshPath, 1, false)
	if err := f.st.load(ctx); err == nil {
		t.Fatal("a load whose read failed succeeded")
	}
	if f.st.stale.Load() {
		t.Fatal("a failed load marked a fresh policy stale")
	}
	wantRetries(t, f.st, 4)

	f.st.forget()
	fs.failNext("get", configRefreshPath, 1, false)
	wantRetries(t, f.st, 4)
	if !f.st.stale.Load() {
		t.Fatal("a failed reload cleared the stale mark")
	}
	wantRetries(t, f.st, 5) // the next use reads again
	wantSeen(t, f, 4, 5)
}

// TestSettings_InvalidationDuringReadWins: an invalidation that arrives
// while a load or a write reads config/refresh is kept, because what the
// read returned may be older than the invalidated write.
func TestSettings_InvalidationDuringReadWins(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		// read starts the read that is held, and returns when it is done.
		read func(f *settingsFixture) error
	}{
		{"reload", func(f *settingsFixture) error { f.st.policy(); return nil }},
		{"load", func(f *settingsFixture) error { return f.st.load(ctx) }},
		{"write", func(f *settingsFixture) error {
			_, err := f.st.write(ctx, f.s, func(cfg *refreshConfig) string { cfg.STSBurst = 7; return "" })
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ps := &pausingStorage{Storage: new(logical.InmemStorage)}
			f := newSettingsFixture(ps)
			storeRetries(t, ps.Storage, 4)
			f.st.forget()

			reached, release := ps.pauseAfterGet(configRefreshPath)
			defer release()
			done := make(chan struct{})
			var err error
			go func() {
				defer close(done)
				err = tc.read(f)
			}()
			awaitChan(t, "the read of config/refresh", reached)
			storeRetries(t, ps.Storage, 5)
			f.st.forget()
			release()
			awaitChan(t, "the read to finish", done)
			if err != nil {
				t.Fatal(err)
			}
			if !f.st.stale.Load() {
				t.Fatal("the invalidation during the read was lost")
			}
			if tc.name != "write" {
				wantRetries(t, f.st, 5)
			}
		})
	}
}

// TestSettings_WritePutsInForceOnlyWhatStorageTook: a write changes the
// policy in force, and tells onChange, only after storage said yes; a
// write that puts nothing in force leaves the stale mark as it was.
func TestSettings_WritePutsInForceOnlyWhatStorageTook(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		fail     func(fs *faultStorage)
		rule     string // what change returns
		wantErr  bool
		wantRule bool
		// stored: max_retries in storage after the write.
		stored int
	}{
		{name: "read fails", fail: func(fs *faultStorage) { fs.failNext("get", configRefreshPath, 1, false) }, wantErr: true, stored: 4},
		{name: "put fails", fail: func(fs *faultStorage) { fs.failNext("put", configRefreshPath, 1, false) }, wantErr: true, stored: 4},
		{name: "put applied, answer lost", fail: func(fs *faultStorage) { fs.failNext("put", configRefreshPath, 1, true) }, wantErr: true, stored: 9},
		{name: "rule broken", rule: "max_retries too high", wantRule: true, stored: 4},
		{name: "stored", stored: 9},
	}
	for _, tc := range tests {
		for _, stale := range []bool{false, true} {
			name := tc.name
			if stale {
				name += ", stale"
			}
			t.Run(name, func(t *testing.T) {
				fs := newFaultStorage(new(logical.InmemStorage), 1)
				f := newSettingsFixture(fs)
				storeRetries(t, fs, 4)
				if err := f.st.load(ctx); err != nil {
					t.Fatal(err)
				}
				if stale {
					f.st.forget()
				}
				if tc.fail != nil {
					tc.fail(fs)
				}

				rule, err := f.st.write(ctx, fs, func(cfg *refreshConfig) string {
					cfg.MaxRetries = 9
					return tc.rule
				})
				if (err != nil) != tc.wantErr || (rule != "") != tc.wantRule {
					t.Fatalf("write = (%q, %v), want an error %v, a rule %v", rule, err, tc.wantErr, tc.wantRule)
				}
				stored, err := getRefreshConfig(ctx, fs.Storage)
				if err != nil {
					t.Fatal(err)
				}
				if stored.MaxRetries != tc.stored {
					t.Fatalf("stored max_retries = %d, want %d", stored.MaxRetries, tc.stored)
				}
				inForce := 4
				if !tc.wantErr && !tc.wantRule {
					inForce = 9
				}
				// Read without policy(), which would reload a stale mark.
				f.st.mu.RLock()
				got := f.st.cfg.MaxRetries
				f.st.mu.RUnlock()
				if got != inForce {
					t.Fatalf("max_retries in force = %d, want %d", got, inForce)
				}
				if inForce == 9 {
					wantSeen(t, f, 4, 9)
				} else {
					wantSeen(t, f, 4)
				}
				if wantStale := stale && inForce == 4; f.st.stale.Load() != wantStale {
					t.Fatalf("stale = %v after the write, want %v", f.st.stale.Load(), wantStale)
				}
			})
		}
	}
}

// TestSettings_OnChangeSeesEveryChange: every policy put in force, by a
// load, a write or a reload, reaches onChange, in order, and the owner
// never reads storage unless asked or marked stale.
func TestSettings_OnChangeSeesEveryChange(t *testing.T) {
	ctx := context.Background()
	fs := newFaultStorage(new(logical.InmemStorage), 1)
	f := newSettingsFixture(fs)
	wantRetries(t, f.st, defaultMaxRetries)
	wantSeen(t, f) // the defaults are in force from the start

	storeRetries(t, fs, 3)
	wantRetries(t, f.st, defaultMaxRetries) // not invalidated: not read
	if err := f.st.load(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.write(ctx, fs, func(cfg *refreshConfig) string { cfg.MaxRetries = 8; return "" }); err != nil {
		t.Fatal(err)
	}
	storeRetries(t, fs, 2)
	f.st.forget()
	wantRetries(t, f.st, 2)
	wantRetries(t, f.st, 2) // reloaded once
	wantSeen(t, f, 3, 8, 2)
}
