package awsresilient

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"

	"github.com/hashicorp/vault/sdk/logical"
)

// faultStorage wraps logical.Storage so that any Get, Put, Delete or List
// can fail: by rule (the next n calls of an operation on a key prefix), or
// at random with a seeded source. A failed Put or Delete may have been
// applied before it failed (the answer was lost, as with a raft commit that
// timed out), which is the harder case for whoever called it.
type faultStorage struct {
	logical.Storage

	mu    sync.Mutex
	rules []*faultRule
	// rate is the probability that any call fails; applied is the share of
	// failed writes that were applied first.
	rate, applied float64
	rng           *rand.Rand
	// injected counts failures by operation.
	injected map[string]int
	// calls counts every call by operation.
	calls map[string]int
	// before, when set, runs before each call outside the lock (a test may
	// block a call there).
	before func(op, key string)
}

// faultRule fails the next count calls of op ("get", "put", "delete",
// "list" or "" for any) on keys starting with prefix.
type faultRule struct {
	op, prefix string
	count      int
	// applied: a Put or Delete is carried out, then reported failed.
	applied bool
	// skip: this many matching calls succeed before the rule fails any.
	skip int
}

func newFaultStorage(s logical.Storage, seed uint64) *faultStorage {
	return &faultStorage{
		Storage:  s,
		rng:      rand.New(rand.NewPCG(seed, seed^0x5eed)),
		injected: map[string]int{},
		calls:    map[string]int{},
	}
}

// failAfter adds a rule that lets skip matching calls through first.
func (f *faultStorage) failAfter(op, prefix string, skip, count int, applied bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append(f.rules, &faultRule{op: op, prefix: prefix, count: count, applied: applied, skip: skip})
}

// failNext adds a rule.
func (f *faultStorage) failNext(op, prefix string, count int, applied bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append(f.rules, &faultRule{op: op, prefix: prefix, count: count, applied: applied})
}

// setRate sets the random failure probability (0 heals the storage).
func (f *faultStorage) setRate(rate, applied float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rate, f.applied = rate, applied
}

// heal drops every rule and the random failures.
func (f *faultStorage) heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules, f.rate = nil, 0
}

func (f *faultStorage) injectedTotal() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, v := range f.injected {
		n += v
	}
	return n
}

// decide says whether this call fails, and whether a write is applied first.
func (f *faultStorage) decide(op, key string) (fail, apply bool) {
	if f.before != nil {
		f.before(op, key)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[op]++
	for _, r := range f.rules {
		if r.count > 0 && (r.op == "" || r.op == op) && strings.HasPrefix(key, r.prefix) {
			if r.skip > 0 {
				r.skip--
				continue
			}
			r.count--
			f.injected[op]++
			return true, r.applied
		}
	}
	if f.rate > 0 && f.rng.Float64() < f.rate {
		f.injected[op]++
		return true, f.rng.Float64() < f.applied
	}
	return false, false
}

func injected(op, key string) error {
	return fmt.Errorf("injected storage failure: %s %s", op, key)
}

func (f *faultStorage) Get(ctx context.Context, key string) (*logical.StorageEntry, error) {
	if fail, _ := f.decide("get", key); fail {
		return nil, injected("get", key)
	}
	return f.Storage.Get(ctx, key)
}

func (f *faultStorage) Put(ctx context.Context, e *logical.StorageEntry) error {
	fail, apply := f.decide("put", e.Key)
	if fail && !apply {
		return injected("put", e.Key)
	}
	if err := f.Storage.Put(ctx, e); err != nil {
		return err
	}
	if fail {
		return injected("put (applied)", e.Key)
	}
	return nil
}

func (f *faultStorage) Delete(ctx context.Context, key string) error {
	fail, apply := f.decide("delete", key)
	if fail && !apply {
		return injected("delete", key)
	}
	if err := f.Storage.Delete(ctx, key); err != nil {
		return err
	}
	if fail {
		return injected("delete (applied)", key)
	}
	return nil
}

func (f *faultStorage) List(ctx context.Context, prefix string) ([]string, error) {
	if fail, _ := f.decide("list", prefix); fail {
		return nil, injected("list", prefix)
	}
	return f.Storage.List(ctx, prefix)
}
