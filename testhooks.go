//go:build testhooks

package awsresilient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"
)

// This file is compiled only into test binaries (go build -tags testhooks):
// the production plugin has no test path at all, whatever its environment
// says (Vault passes its own whole environment to every plugin). Even in a
// test binary the path appears only with AWS_RESILIENT_TEST_HOOKS=1.

// testHooksBuilt reports whether this binary carries the test hooks.
const testHooksBuilt = true

// testMinRotationPeriodEnv lowers the shortest rotation_period, so that an
// acceptance test can see a scheduled rotation happen (Vault passes its
// environment to the plugin).
const testMinRotationPeriodEnv = "AWS_RESILIENT_TEST_MIN_ROTATION_PERIOD"

// minRotationPeriod is the shortest rotation_period config/root accepts:
// an hour, or what the test environment says.
func minRotationPeriod() time.Duration {
	if d, err := time.ParseDuration(os.Getenv(testMinRotationPeriodEnv)); err == nil && d > 0 {
		return d
	}
	return defaultMinRotationPeriod
}

// testHostClockOffsetEnv gives the plugin process a host clock that far
// from the real one (a Go duration, "-4m"): an acceptance test runs one
// Vault node's plugin as if its host's clock were off, on one machine.
// Vault passes its own environment to the plugin, so it is set per node.
const testHostClockOffsetEnv = "AWS_RESILIENT_TEST_HOST_CLOCK_OFFSET"

// testHostClock is the host clock and host name the environment asks for
// (nil, "": the real ones). The host is named apart (clock/<host>), as
// another machine would be: this host's stored estimates are of the real
// clock, not of the offset one.
func testHostClock() (clock.Clock, string) {
	d, err := time.ParseDuration(os.Getenv(testHostClockOffsetEnv))
	if err != nil || d == 0 {
		return nil, ""
	}
	h, _ := os.Hostname()
	return offsetClock{d: d}, fmt.Sprintf("%s-clock%s", h, d)
}

// offsetClock is the real clock read d apart; timers count the same
// durations.
type offsetClock struct {
	clock.Real
	d time.Duration
}

func (c offsetClock) Now() time.Time { return time.Now().Add(c.d) }

func testHookPaths(b *backend) []*framework.Path {
	return []*framework.Path{pathTestStorageFaults(b), pathTestRefresher(b)}
}

// wrapStorage makes the mount's storage, as background work sees it, fail
// cache writes while the hook says so.
func (b *backend) wrapStorage(s logical.Storage) logical.Storage {
	if !b.opts.testHooks || s == nil {
		return s
	}
	return &hookStorage{Storage: s}
}

// hookFailConfigReadsKey, while it exists in the mount's storage, makes
// every read of config/refresh by the mount's background work fail (set by
// test/storage-faults fail_refresh_config_reads). It lives in storage, not
// in memory like the other hooks, because it must outlive the backend: a
// plugin reload re-creates the backend, and Vault re-launches the plugin
// process too (seen on 1.19, even with a second mount on that process, and
// on 1.21), so a new backend, in a new process, starts on storage that
// fails, as after a real storage fault at mount start.
const hookFailConfigReadsKey = "test-hooks/fail-refresh-config-reads"

// hookStorage fails the next cacheWriteFailures writes of cache/ entries,
// and every read of config/refresh while hookFailConfigReadsKey is stored.
type hookStorage struct {
	logical.Storage
	// cacheWriteFailures is the count of cache writes still to fail, set
	// by test/storage-faults.
	cacheWriteFailures atomic.Int64
	// failRoleLists makes every LIST of roles/ fail while set (by
	// test/storage-faults): the metrics path then answers 500.
	failRoleLists atomic.Bool
}

func (h *hookStorage) List(ctx context.Context, prefix string) ([]string, error) {
	if prefix == rolePrefix && h.failRoleLists.Load() {
		return nil, errors.New("listing roles failed (injected by test hook)")
	}
	return h.Storage.List(ctx, prefix)
}

// wrapRequestStorage makes a request's storage fail LISTs of roles/ while
// the hook says so, as the background's does (the metrics path then
// answers 500).
func (b *backend) wrapRequestStorage(s logical.Storage) logical.Storage {
	if h := b.hooks(); h != nil && h.failRoleLists.Load() {
		return &roleListFailing{Storage: s}
	}
	return s
}

// roleListFailing fails every LIST of roles/.
type roleListFailing struct{ logical.Storage }

func (r *roleListFailing) List(ctx context.Context, prefix string) ([]string, error) {
	if prefix == rolePrefix {
		return nil, errors.New("listing roles failed (injected by test hook)")
	}
	return r.Storage.List(ctx, prefix)
}

// Get fails a read of config/refresh while the stored hook says so: the
// refresher cannot start (its start and every reconciler pass read it
// first), while roles, credentials and the scrape's reads work.
func (h *hookStorage) Get(ctx context.Context, key string) (*logical.StorageEntry, error) {
	if key == configRefreshPath {
		fail, err := failConfigReads(ctx, h.Storage)
		if err != nil {
			return nil, err
		}
		if fail {
			return nil, errors.New("reading config/refresh failed (injected by test hook)")
		}
	}
	return h.Storage.Get(ctx, key)
}

// failConfigReads reports whether the hook that fails reads of
// config/refresh is set in s.
func failConfigReads(ctx context.Context, s logical.Storage) (bool, error) {
	e, err := s.Get(ctx, hookFailConfigReadsKey)
	return e != nil, err
}

func (h *hookStorage) Put(ctx context.Context, e *logical.StorageEntry) error {
	if strings.HasPrefix(e.Key, cachePrefix) && h.takeCacheWriteFailure() {
		return errors.New("writing the cached credential failed (injected by test hook)")
	}
	return h.Storage.Put(ctx, e)
}

// takeCacheWriteFailure consumes one injected cache write failure, if any.
func (h *hookStorage) takeCacheWriteFailure() bool {
	for {
		n := h.cacheWriteFailures.Load()
		if n <= 0 {
			return false
		}
		if h.cacheWriteFailures.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// hooks is the mount's hook storage, which the test path drives; nil
// before Setup gave the backend its storage.
func (b *backend) hooks() *hookStorage {
	s := b.storage
	if f, ok := s.(*fencedStorage); ok {
		s = f.Storage // the hooks sit behind the fence (backend.fence)
	}
	h, _ := s.(*hookStorage)
	return h
}

// pathTestStorageFaults lets the fault matrix make the cache write that
// follows a successful STS call fail, which Vault itself cannot inject.
func pathTestStorageFaults(b *backend) *framework.Path {
	return &framework.Path{
		Pattern: "test/storage-faults",
		DisplayAttrs: &framework.DisplayAttributes{
			OperationPrefix: operationPrefixAWSResilient,
			OperationSuffix: "test-storage-faults",
		},
		Fields: map[string]*framework.FieldSchema{
			"cache_write_failures": {
				Type:        framework.TypeInt,
				Description: "How many of the next cache writes fail, 0 to 1000.",
			},
			"fail_role_lists": {
				Type:        framework.TypeBool,
				Description: "While true, every LIST of roles/ fails (the metrics path answers 500).",
			},
			"fail_refresh_config_reads": {
				Type:        framework.TypeBool,
				Description: "While true, every read of config/refresh by the mount's background work fails, so a refresher that starts now (after a plugin reload) cannot. Kept in the mount's storage: it outlives the backend and the plugin process.",
			},
		},
		Operations: map[logical.Operation]framework.OperationHandler{
			logical.ReadOperation: &framework.PathOperation{
				Callback: b.pathTestStorageFaultsRead,
				Summary:  "Read the storage failures set.",
				Responses: map[int][]framework.Response{
					http.StatusOK: {{Description: "OK", Fields: map[string]*framework.FieldSchema{
						"cache_write_failures":      {Type: framework.TypeInt, Description: "Cache writes still set to fail.", Required: true},
						"fail_role_lists":           {Type: framework.TypeBool, Description: "Whether LISTs of roles/ fail.", Required: true},
						"fail_refresh_config_reads": {Type: framework.TypeBool, Description: "Whether the background's reads of config/refresh fail.", Required: true},
					}}},
				},
			},
			logical.UpdateOperation: &framework.PathOperation{
				Callback:                    b.pathTestStorageFaultsWrite,
				Summary:                     "Set storage failures: the next N cache writes, LISTs of roles/, reads of config/refresh.",
				ForwardPerformanceStandby:   true,
				ForwardPerformanceSecondary: true,
				Responses: map[int][]framework.Response{
					http.StatusNoContent: {{Description: "No Content"}},
				},
			},
		},
		HelpSynopsis:    "Test hook: inject storage failures.",
		HelpDescription: "Present only in a plugin built with -tags testhooks and run with AWS_RESILIENT_TEST_HOOKS=1. Makes the next cache_write_failures cache writes after a successful STS call fail, as a storage error would; fail_role_lists fails LISTs of roles/; fail_refresh_config_reads fails the background's reads of config/refresh, across plugin reloads.",
	}
}

func (b *backend) pathTestStorageFaultsRead(ctx context.Context, req *logical.Request, _ *framework.FieldData) (*logical.Response, error) {
	h := b.hooks()
	if h == nil {
		return nil, errors.New("the mount's storage is not set up")
	}
	failConfig, err := failConfigReads(ctx, req.Storage)
	if err != nil {
		return nil, err
	}
	return &logical.Response{Data: map[string]interface{}{
		"cache_write_failures":      int(h.cacheWriteFailures.Load()),
		"fail_role_lists":           h.failRoleLists.Load(),
		"fail_refresh_config_reads": failConfig,
	}}, nil
}

func (b *backend) pathTestStorageFaultsWrite(ctx context.Context, req *logical.Request, data *framework.FieldData) (*logical.Response, error) {
	n, setWrites := data.GetOk("cache_write_failures")
	fail, setLists := data.GetOk("fail_role_lists")
	failConfig, setConfig := data.GetOk("fail_refresh_config_reads")
	if !setWrites && !setLists && !setConfig {
		return logical.ErrorResponse("cache_write_failures is required (0 to 1000), or fail_role_lists, or fail_refresh_config_reads"), nil
	}
	if setWrites && (n.(int) < 0 || n.(int) > 1000) {
		return logical.ErrorResponse("cache_write_failures must be between 0 and 1000; got %d", n.(int)), nil
	}
	h := b.hooks()
	if h == nil {
		return nil, errors.New("the mount's storage is not set up")
	}
	if setConfig {
		var err error
		if failConfig.(bool) {
			err = req.Storage.Put(ctx, &logical.StorageEntry{Key: hookFailConfigReadsKey, Value: []byte("true")})
		} else {
			err = req.Storage.Delete(ctx, hookFailConfigReadsKey)
		}
		if err != nil {
			return nil, fmt.Errorf("storing the config/refresh read fault: %w", err)
		}
	}
	if setWrites {
		h.cacheWriteFailures.Store(int64(n.(int)))
	}
	if setLists {
		h.failRoleLists.Store(fail.(bool))
	}
	return nil, nil
}

// planHolds are the plan holds test/refresher keeps, by backend.
var planHolds sync.Map // *backend -> release func()

// pathTestRefresher lets an acceptance test stop the refresher's plan from
// firing, as a stuck scheduler would, and start it again.
func pathTestRefresher(b *backend) *framework.Path {
	return &framework.Path{
		Pattern: "test/refresher",
		DisplayAttrs: &framework.DisplayAttributes{
			OperationPrefix: operationPrefixAWSResilient,
			OperationSuffix: "test-refresher",
		},
		Fields: map[string]*framework.FieldSchema{
			"hold_plan": {
				Type:        framework.TypeBool,
				Description: "true: the plan fires no refresh cycle until set false again.",
				Required:    true,
			},
		},
		Operations: map[logical.Operation]framework.OperationHandler{
			logical.UpdateOperation: &framework.PathOperation{
				Callback:                    b.pathTestRefresherWrite,
				Summary:                     "Hold or release the refresher's plan.",
				ForwardPerformanceStandby:   true,
				ForwardPerformanceSecondary: true,
				Responses: map[int][]framework.Response{
					http.StatusNoContent: {{Description: "No Content"}},
				},
			},
		},
		HelpSynopsis:    "Test hook: stop the refresher's plan from firing.",
		HelpDescription: "Present only in a plugin built with -tags testhooks and run with AWS_RESILIENT_TEST_HOOKS=1. hold_plan=true keeps every planned refresh cycle from starting, as a stuck scheduler would; hold_plan=false lets the due ones start.",
	}
}

func (b *backend) pathTestRefresherWrite(_ context.Context, _ *logical.Request, data *framework.FieldData) (*logical.Response, error) {
	hold, ok := data.GetOk("hold_plan")
	if !ok {
		return logical.ErrorResponse("hold_plan is required"), nil
	}
	if hold.(bool) {
		if _, held := planHolds.Load(b); !held {
			planHolds.Store(b, b.refresher.holdPlan())
		}
		return nil, nil
	}
	if release, held := planHolds.LoadAndDelete(b); held {
		release.(func())()
	}
	return nil, nil
}
