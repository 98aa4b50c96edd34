package awsresilient

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/logical"
)

// settings is the one owner of config/refresh in memory: the refresh policy
// in force, and whether storage changed it since it was read. Storage is the
// truth (getRefreshConfig, putRefreshConfig); this is its cache. Nothing
// else takes its locks or changes the policy:
//
//   - load and write read storage and put what they read in force as one
//     step (under loadMu), so an older read is never put in force after a
//     newer one.
//   - forget (Invalidate) only marks the policy stale; the next policy()
//     reads it again. A read clears the mark before it reads, and sets it
//     again when the read fails, so an invalidation that arrives during the
//     read is never lost: what the read returned may be older.
//   - A policy goes in force only after storage said yes, and onChange is
//     told of each one.
//
// Lock order: loadMu, then mu; onChange runs under loadMu, not mu.
type settings struct {
	// storage is the mount's storage view, for the reads that have no
	// request (loads, reloads). Read at each call: the backend gets it after
	// construction.
	storage func() logical.Storage
	// logger is the backend's, which Setup sets after construction.
	logger func() hclog.Logger
	// onChange is told of every policy put in force (the limiter's rate).
	onChange func(refreshConfig)

	// mu guards cfg, the policy in force.
	mu  sync.RWMutex
	cfg refreshConfig
	// loadMu makes "read config/refresh, put it in force" (and a write's
	// "read, change, store, put in force") one step; it guards warned.
	loadMu sync.Mutex
	// stale: forget was called since the last read of config/refresh began.
	stale atomic.Bool
	// warned is the rule a stored config breaks, once logged (loadMu).
	warned string
	// read: a policy read from storage (or written to it) is in force, not
	// only the defaults newSettings starts with.
	read atomic.Bool
}

// newSettings returns the owner with the default policy in force, not
// stale. onChange is not called for the defaults.
func newSettings(storage func() logical.Storage, logger func() hclog.Logger, onChange func(refreshConfig)) *settings {
	return &settings{storage: storage, logger: logger, onChange: onChange, cfg: defaultRefreshConfig()}
}

// policy returns the refresh policy in force, reading config/refresh again
// first when forget said storage changed it. A reload that fails leaves the
// previous policy in force, still marked, and is logged.
func (st *settings) policy() refreshConfig {
	if st.stale.Load() {
		if err := st.load(context.Background()); err != nil {
			// Still marked: the next use tries again.
			st.logger().Warn("reloading refresh config failed; the previous one stays in force", "error", err)
		}
	}
	st.mu.RLock()
	defer st.mu.RUnlock()
	return st.cfg
}

// known reports whether the policy in force was read from storage (or
// written to it), rather than the defaults of a node that has not yet been
// able to read config/refresh: what is exported as the mount's policy must
// be it.
func (st *settings) known() bool { return st.read.Load() }

// load reads config/refresh from storage and puts it in force. A read that
// fails leaves the current policy in force, and the stale mark as it was.
// A stored config that breaks a rule (written before the rule existed) is
// put in force as written, and the operator told once.
func (st *settings) load(ctx context.Context) error {
	st.loadMu.Lock()
	defer st.loadMu.Unlock()
	stale := st.stale.Swap(false)
	cfg, err := getRefreshConfig(ctx, st.storage())
	if err != nil {
		if stale {
			st.stale.Store(true)
		}
		return err
	}
	if msg := cfg.validate(); msg != st.warned {
		if msg != "" {
			st.logger().Warn("stored config/refresh breaks a rule; write config/refresh to fix it", "rule", msg)
		}
		st.warned = msg
	}
	st.set(cfg)
	return nil
}

// forget marks the policy stale: storage changed config/refresh under this
// node. The next policy() reads it again.
func (st *settings) forget() {
	st.stale.Store(true)
}

// write reads config/refresh from s, lets change edit it, stores it and
// puts it in force, as one step against loads. change returns the rule the
// edited config breaks ("" when none); write then returns that rule and
// stores nothing. Nothing is put in force unless storage said yes; a write
// that puts nothing in force leaves the stale mark as it was.
func (st *settings) write(ctx context.Context, s logical.Storage, change func(cfg *refreshConfig) string) (rule string, err error) {
	st.loadMu.Lock()
	defer st.loadMu.Unlock()
	// Cleared before the read, as by load, and set again when nothing is
	// put in force.
	stale, applied := st.stale.Swap(false), false
	defer func() {
		if stale && !applied {
			st.stale.Store(true)
		}
	}()
	cfg, err := getRefreshConfig(ctx, s)
	if err != nil {
		return "", err
	}
	if msg := change(&cfg); msg != "" {
		return msg, nil
	}
	if err := putRefreshConfig(ctx, s, cfg); err != nil {
		return "", err
	}
	st.set(cfg)
	applied = true
	return "", nil
}

// set puts cfg in force and tells onChange; loadMu must be held, and the
// stale mark cleared before cfg was read.
func (st *settings) set(cfg refreshConfig) {
	st.mu.Lock()
	st.cfg = cfg
	st.mu.Unlock()
	st.read.Store(true)
	st.onChange(cfg)
}
