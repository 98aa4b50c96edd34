package awsresilient

import (
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

func TestConfigRoot_ReadWriteDelete(t *testing.T) {
	b, s := getTestBackend(t)

	defaults := map[string]interface{}{
		"access_key":             "",
		"secret_key_set":         false,
		"region":                 "us-east-1",
		"sts_endpoint":           "",
		"sts_region":             "",
		"sts_fallback_endpoints": []string{},
		"sts_fallback_regions":   []string{},
		"iam_endpoint":           "",
		"iam_region":             "",
		"rotation_period":        int64(0),
		"last_rotated":           "",
		"next_rotation":          "",
		"aws_clocks":             map[string]interface{}{},
	}
	if got := mustDo(t, b, s, logical.ReadOperation, "config/root", nil).Data; !reflect.DeepEqual(got, defaults) {
		t.Fatalf("read before write = %v, want defaults %v", got, defaults)
	}

	steps := []struct {
		name  string
		op    logical.Operation
		write map[string]interface{}
		want  map[string]interface{}
	}{
		{
			name: "create",
			op:   logical.CreateOperation,
			write: map[string]interface{}{
				"access_key":             "AKIAIOSFODNN7EXAMPLE",
				"secret_key":             "s3cr3t/KEY",
				"region":                 "eu-west-1",
				"sts_endpoint":           "https://sts.eu-west-1.amazonaws.com",
				"sts_region":             "eu-west-1",
				"sts_fallback_endpoints": "https://sts.eu-central-1.amazonaws.com,http://127.0.0.1:8599",
				"sts_fallback_regions":   []string{"eu-central-1", "us-east-1"},
			},
			want: map[string]interface{}{
				"access_key":             "AKIAIOSFODNN7EXAMPLE",
				"secret_key_set":         true,
				"region":                 "eu-west-1",
				"sts_endpoint":           "https://sts.eu-west-1.amazonaws.com",
				"sts_region":             "eu-west-1",
				"sts_fallback_endpoints": []string{"https://sts.eu-central-1.amazonaws.com", "http://127.0.0.1:8599"},
				"sts_fallback_regions":   []string{"eu-central-1", "us-east-1"},
				"iam_endpoint":           "",
				"iam_region":             "",
				"rotation_period":        int64(0),
				"last_rotated":           "",
				"next_rotation":          "",
			},
		},
		{
			name:  "update applies only the fields sent",
			op:    logical.UpdateOperation,
			write: map[string]interface{}{"region": "us-west-2", "sts_endpoint": "http://localhost:9000"},
			want: map[string]interface{}{
				"access_key":             "AKIAIOSFODNN7EXAMPLE",
				"secret_key_set":         true,
				"region":                 "us-west-2",
				"sts_endpoint":           "http://localhost:9000",
				"sts_region":             "eu-west-1",
				"sts_fallback_endpoints": []string{"https://sts.eu-central-1.amazonaws.com", "http://127.0.0.1:8599"},
				"sts_fallback_regions":   []string{"eu-central-1", "us-east-1"},
				"iam_endpoint":           "",
				"iam_region":             "",
				"rotation_period":        int64(0),
				"last_rotated":           "",
				"next_rotation":          "",
			},
		},
		{
			name:  "keys cleared together fall back to the default chain",
			op:    logical.UpdateOperation,
			write: map[string]interface{}{"access_key": "", "secret_key": "", "sts_fallback_endpoints": []string{}, "sts_fallback_regions": []string{}},
			want: map[string]interface{}{
				"access_key":             "",
				"secret_key_set":         false,
				"region":                 "us-west-2",
				"sts_endpoint":           "http://localhost:9000",
				"sts_region":             "eu-west-1",
				"sts_fallback_endpoints": []string{},
				"sts_fallback_regions":   []string{},
				"iam_endpoint":           "",
				"iam_region":             "",
				"rotation_period":        int64(0),
				"last_rotated":           "",
				"next_rotation":          "",
			},
		},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			mustDo(t, b, s, st.op, "config/root", st.write)
			got := mustDo(t, b, s, logical.ReadOperation, "config/root", nil).Data
			// No call has been made: no AWS clock is known yet.
			st.want["aws_clocks"] = map[string]interface{}{}
			if !reflect.DeepEqual(got, st.want) {
				t.Fatalf("read = %v, want %v", got, st.want)
			}
			if _, ok := got["secret_key"]; ok {
				t.Fatal("read returned secret_key")
			}
		})
	}

	t.Run("delete returns to defaults", func(t *testing.T) {
		mustDo(t, b, s, logical.DeleteOperation, "config/root", nil)
		if got := mustDo(t, b, s, logical.ReadOperation, "config/root", nil).Data; !reflect.DeepEqual(got, defaults) {
			t.Fatalf("read after delete = %v, want %v", got, defaults)
		}
	})
}

func TestConfigRoot_ExistenceCheck(t *testing.T) {
	b, s := getTestBackend(t)
	req := &logical.Request{Operation: logical.CreateOperation, Path: "config/root", Storage: s}
	_, exists, err := b.HandleExistenceCheck(t.Context(), req)
	if err != nil || exists {
		t.Fatalf("before write: exists=%v err=%v, want false", exists, err)
	}
	mustDo(t, b, s, logical.CreateOperation, "config/root", map[string]interface{}{"region": "us-east-2"})
	_, exists, err = b.HandleExistenceCheck(t.Context(), req)
	if err != nil || !exists {
		t.Fatalf("after write: exists=%v err=%v, want true", exists, err)
	}
}

func TestConfigRoot_BadInput(t *testing.T) {
	tests := []struct {
		name string
		data map[string]interface{}
		want string
	}{
		{"access key without secret", map[string]interface{}{"access_key": "AKIAIOSFODNN7EXAMPLE"}, "access_key and secret_key must be set together"},
		{"secret without access key", map[string]interface{}{"secret_key": "x"}, "access_key and secret_key must be set together"},
		{"malformed access key", map[string]interface{}{"access_key": "akia-lower", "secret_key": "x"}, "16 to 128 upper-case letters and digits"},
		{"secret with whitespace", map[string]interface{}{"access_key": "AKIAIOSFODNN7EXAMPLE", "secret_key": "a b"}, "at most 256 characters without whitespace"},
		{"bad region", map[string]interface{}{"region": "moon-1"}, "region must be an AWS region name such as us-east-1"},
		{"empty region", map[string]interface{}{"region": ""}, "region must be an AWS region name"},
		{"bad sts region", map[string]interface{}{"sts_region": "US_EAST_1"}, "sts_region must be an AWS region name"},
		{"http endpoint off loopback", map[string]interface{}{"sts_endpoint": "http://sts.amazonaws.com"}, "http is allowed only on a loopback address (127.0.0.0/8, ::1, localhost)"},
		{"http endpoint on a private address", map[string]interface{}{"sts_endpoint": "http://10.0.0.1:8599"}, "http is allowed only on a loopback address"},
		{"http endpoint on a name that merely starts with localhost", map[string]interface{}{"sts_endpoint": "http://localhost.example.com"}, "http is allowed only on a loopback address"},
		{"ftp endpoint", map[string]interface{}{"sts_endpoint": "ftp://127.0.0.1"}, `must use https (or http on a loopback address); got scheme "ftp"`},
		{"relative endpoint", map[string]interface{}{"sts_endpoint": "sts.amazonaws.com"}, "sts_endpoint must be an absolute URL"},
		{"endpoint with credentials", map[string]interface{}{"sts_endpoint": "https://user:pw@sts.amazonaws.com"}, "must not contain credentials"},
		{"endpoint with a query", map[string]interface{}{"sts_endpoint": "https://sts.amazonaws.com/?a=b"}, "must not contain credentials, a query or a fragment"},
		{"endpoint with a bad port", map[string]interface{}{"sts_endpoint": "https://sts.amazonaws.com:99999"}, "invalid port"},
		{"bad fallback endpoint", map[string]interface{}{"sts_fallback_endpoints": "https://ok.example.com,http://example.com"}, "sts_fallback_endpoints must use https"},
		{"too many fallbacks", map[string]interface{}{"sts_fallback_endpoints": "https://a.example,https://a.example,https://a.example,https://a.example,https://a.example,https://a.example,https://a.example,https://a.example,https://a.example,https://a.example,https://a.example"}, "at most 10 endpoints"},
		{"fallback regions do not match endpoints", map[string]interface{}{"sts_fallback_endpoints": "https://a.example", "sts_fallback_regions": "us-east-1,us-east-2"}, "one region per fallback endpoint (1)"},
		{"bad fallback region", map[string]interface{}{"sts_fallback_endpoints": "https://a.example", "sts_fallback_regions": "nowhere"}, "sts_fallback_regions must be AWS region names"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, s := getTestBackend(t)
			mustDo(t, b, s, logical.CreateOperation, "config/root", map[string]interface{}{"region": "us-east-2"})
			before := snapshot(t, s)
			resp, err := do(t, b, s, logical.UpdateOperation, "config/root", tc.data)
			wantBadRequest(t, resp, err, tc.want)
			if !sameSnapshot(before, snapshot(t, s)) {
				t.Fatal("a rejected write changed storage")
			}
		})
	}
}

func TestConfigRoot_LoopbackEndpoints(t *testing.T) {
	for _, ep := range []string{
		"http://127.0.0.1:8599", "http://127.1.2.3", "http://[::1]:8080", "http://localhost:9", "http://LOCALHOST",
		"https://sts.us-east-1.amazonaws.com", "https://10.0.0.1:8443/",
	} {
		t.Run(ep, func(t *testing.T) {
			b, s := getTestBackend(t)
			mustDo(t, b, s, logical.UpdateOperation, "config/root", map[string]interface{}{"sts_endpoint": ep})
		})
	}
}

// TestConfigRoot_ChangeResetsClient checks that a config/root write takes
// effect on the next STS call: the client built for the old endpoint is
// dropped rather than reused.
func TestConfigRoot_ChangeResetsClient(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	other := startEmulator(t, stsemu.Config{Now: f.clock.Now, MaxLifetime: 10 * time.Minute})
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"sts_endpoint": other.URL()})
	f.refresh(testRole)
	if n := other.Stats().Total; n != 1 {
		t.Fatalf("new endpoint got %d calls, want 1", n)
	}
	if calls := f.log.all(); calls[len(calls)-1].endpoint != other.URL() {
		t.Fatalf("last call went to %s, want %s", calls[len(calls)-1].endpoint, other.URL())
	}

	// Invalidate (a replicated config/root write) resets it the same way.
	entry, _ := logical.StorageEntryJSON(configRootPath, &rootConfig{
		AccessKey: stsemu.DefaultAccessKey, SecretKey: stsemu.DefaultSecretKey, Region: "us-east-1", STSEndpoint: f.emu.URL(),
	})
	if err := f.s.Put(t.Context(), entry); err != nil {
		t.Fatal(err)
	}
	f.b.InvalidateKey(t.Context(), configRootPath)
	before := f.emu.Stats().Total
	f.clock.Advance(time.Minute)
	f.refresh(testRole)
	if n := f.emu.Stats().Total - before; n != 1 {
		t.Fatalf("after invalidation the original endpoint got %d calls, want 1", n)
	}
}

func TestConfigRefresh_ReadWrite(t *testing.T) {
	b, s := getTestBackend(t)
	defaults := map[string]interface{}{
		"max_retries":       6,
		"retry_window":      int64(30),
		"retry_block":       5.0,
		"refresh_fraction":  0.33,
		"sts_rate_limit":    10.0,
		"sts_burst":         10,
		"metrics_max_roles": 1000,

		"max_entity_credentials": 100000,
	}
	if got := mustDo(t, b, s, logical.ReadOperation, "config/refresh", nil).Data; !reflect.DeepEqual(got, defaults) {
		t.Fatalf("read before write = %v, want defaults %v", got, defaults)
	}

	steps := []struct {
		name  string
		write map[string]interface{}
		want  map[string]interface{}
	}{
		{
			name:  "partial update",
			write: map[string]interface{}{"max_retries": 3, "retry_window": "10s"},
			want:  map[string]interface{}{"max_retries": 3, "retry_window": int64(10), "retry_block": (10 * time.Second / 3).Seconds(), "refresh_fraction": 0.33, "sts_rate_limit": 10.0, "sts_burst": 10, "metrics_max_roles": 1000, "max_entity_credentials": 100000},
		},
		{
			name:  "bounds are inclusive",
			write: map[string]interface{}{"max_retries": 20, "retry_window": "10m", "refresh_fraction": 0.9, "sts_rate_limit": 10000, "sts_burst": 10000, "metrics_max_roles": 100000, "max_entity_credentials": 10000000},
			want:  map[string]interface{}{"max_retries": 20, "retry_window": int64(600), "retry_block": 30.0, "refresh_fraction": 0.9, "sts_rate_limit": 10000.0, "sts_burst": 10000, "metrics_max_roles": 100000, "max_entity_credentials": 10000000},
		},
		{
			name:  "lower bounds and no rate cap",
			write: map[string]interface{}{"max_retries": 1, "retry_window": 1, "refresh_fraction": 0.05, "sts_rate_limit": 0, "sts_burst": 0, "metrics_max_roles": 0, "max_entity_credentials": 0},
			want:  map[string]interface{}{"max_retries": 1, "retry_window": int64(1), "retry_block": 1.0, "refresh_fraction": 0.05, "sts_rate_limit": 0.0, "sts_burst": 0, "metrics_max_roles": 0, "max_entity_credentials": 0},
		},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			mustDo(t, b, s, logical.UpdateOperation, "config/refresh", st.write)
			if got := mustDo(t, b, s, logical.ReadOperation, "config/refresh", nil).Data; !reflect.DeepEqual(got, st.want) {
				t.Fatalf("read = %v, want %v", got, st.want)
			}
		})
	}
}

func TestConfigRefresh_BadInput(t *testing.T) {
	tests := []struct {
		name string
		data map[string]interface{}
		want string
	}{
		{"max_retries 0", map[string]interface{}{"max_retries": 0}, "max_retries must be between 1 and 20; got 0"},
		{"max_retries 21", map[string]interface{}{"max_retries": 21}, "max_retries must be between 1 and 20; got 21"},
		{"max_retries negative", map[string]interface{}{"max_retries": -3}, "max_retries must be between 1 and 20"},
		{"max_retries not a number", map[string]interface{}{"max_retries": "six"}, "max_retries: Attempts per refresh cycle, 1 to 20"},
		{"retry_window 0", map[string]interface{}{"retry_window": 0}, "retry_window must be between 1s and 10m0s; got 0s"},
		{"retry_window 601s", map[string]interface{}{"retry_window": "601s"}, "retry_window must be between 1s and 10m0s; got 10m1s"},
		{"retry_window negative", map[string]interface{}{"retry_window": -5}, "1s to 10m"},
		{"retry_window garbage", map[string]interface{}{"retry_window": "soon"}, "1s to 10m"},
		{"refresh_fraction not a number", map[string]interface{}{"refresh_fraction": "a third"}, "0.05 to 0.9"},
		{"sts_rate_limit not a number", map[string]interface{}{"sts_rate_limit": "fast"}, "0.01 to 10000"},
		// A rate this low overflowed the limiter's arithmetic: 1e-10 gave no
		// cap at all, 1e-6 with a large burst never granted a slot.
		{"sts_rate_limit 1e-10", map[string]interface{}{"sts_rate_limit": 1e-10}, "sts_rate_limit must be 0 (no cap) or between 0.01 (one call per 100s) and 10000; got 1e-10"},
		{"sts_rate_limit 1e-6", map[string]interface{}{"sts_rate_limit": 1e-6, "sts_burst": 10000}, "between 0.01"},
		// Cross-field rules: each names itself.
		{"block under 1s", map[string]interface{}{"retry_window": 1, "max_retries": 20}, "retry_window / max_retries (the retry block) must be between 1s and 45s: at least 1s so that an STS call gets a timeout of at least 800ms, at most 45s so that a cold read sees a retry within Vault's 90s request timeout; got 1s / 20 = 50ms"},
		{"block over 45s", map[string]interface{}{"retry_window": "10m", "max_retries": 6, "refresh_fraction": 0.9}, "must be between 1s and 45s: at least 1s so that an STS call gets a timeout of at least 800ms, at most 45s so that a cold read sees a retry within Vault's 90s request timeout; got 10m0s / 6 = 1m40s"},
		{"window beyond the shortest margin", map[string]interface{}{"retry_window": "5m", "max_retries": 10, "refresh_fraction": 0.33}, "retry_window must be between 1s and the refresh margin of the shortest credential STS issues (refresh_fraction × 900s, less the 10% start delay = 4m27s)"},
		{"sts_burst not a number", map[string]interface{}{"sts_burst": "big"}, "1 to 10000"},
		{"refresh_fraction low", map[string]interface{}{"refresh_fraction": 0.04}, "refresh_fraction must be between 0.05 and 0.9; got 0.04"},
		{"refresh_fraction high", map[string]interface{}{"refresh_fraction": 0.91}, "refresh_fraction must be between 0.05 and 0.9; got 0.91"},
		{"refresh_fraction NaN", map[string]interface{}{"refresh_fraction": "NaN"}, "refresh_fraction must be between 0.05 and 0.9"},
		{"sts_rate_limit negative", map[string]interface{}{"sts_rate_limit": -1}, "sts_rate_limit must be between 0 and 10000 (0 means no cap); got -1"},
		{"sts_rate_limit too high", map[string]interface{}{"sts_rate_limit": 10001}, "sts_rate_limit must be between 0 and 10000"},
		{"sts_burst negative", map[string]interface{}{"sts_burst": -1}, "sts_burst must be between 0 and 10000; got -1"},
		{"sts_burst too high", map[string]interface{}{"sts_burst": 10001}, "sts_burst must be between 0 and 10000; got 10001"},
		{"burst 0 with a rate", map[string]interface{}{"sts_burst": 0}, "sts_burst must be between 1 and 10000 when sts_rate_limit is set; got 0"},
		{"metrics_max_roles negative", map[string]interface{}{"metrics_max_roles": -1}, "metrics_max_roles must be between 0 and 100000; got -1"},
		{"max_entity_credentials negative", map[string]interface{}{"max_entity_credentials": -1}, "max_entity_credentials must be between 0 and 10000000; got -1"},
		{"max_entity_credentials too high", map[string]interface{}{"max_entity_credentials": 10000001}, "max_entity_credentials must be between 0 and 10000000"},
		{"metrics_max_roles too high", map[string]interface{}{"metrics_max_roles": 100001}, "metrics_max_roles must be between 0 and 100000; got 100001"},
		{"metrics_max_roles not a number", map[string]interface{}{"metrics_max_roles": "many"}, "0 to 100000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, s := getTestBackend(t)
			mustDo(t, b, s, logical.UpdateOperation, "config/refresh", map[string]interface{}{"max_retries": 4})
			before := snapshot(t, s)
			resp, err := do(t, b, s, logical.UpdateOperation, "config/refresh", tc.data)
			wantBadRequest(t, resp, err, tc.want)
			if !sameSnapshot(before, snapshot(t, s)) {
				t.Fatal("a rejected write changed storage")
			}
			if got := b.settings.policy().MaxRetries; got != 4 {
				t.Fatalf("in-memory max_retries = %d after a rejected write, want 4", got)
			}
		})
	}
}

// TestConfigRoot_ChangeForgetsFailures: a change of config/root is a
// definition change for the failures it may have caused (issue 45, item 5):
// after a read failed for an unknown key and the key is fixed, the next
// read tries again at once instead of getting the old failure until the
// next attempt time, and the failing role gets a background attempt at
// once, as a rewritten role does.
func TestConfigRoot_ChangeForgetsFailures(t *testing.T) {
	f := newFixture(t, fixtureOpts{rand: randMax})
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"access_key": "AKIAUNKNOWNUNKNOWN00"})
	resp, err := f.readCreds(testRole)
	wantBadRequest(t, resp, err, "InvalidClientTokenId")
	calls := len(f.log.all())
	// Before the fix, a read again gets the same failure, without a call.
	resp, err = f.readCreds(testRole)
	wantBadRequest(t, resp, err, "InvalidClientTokenId")
	if n := len(f.log.all()); n != calls {
		t.Fatalf("%d STS calls for a read within the failure's block, want %d", n, calls)
	}
	if at, ok := f.b.refresher.plannedAt(roleKey(testRole)); !ok || !at.After(f.clock.Now()) {
		t.Fatalf("the failing role's next cycle is planned at %v (%v), want later than now %v", at, ok, f.clock.Now())
	}

	f.drainFlights()
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"access_key": stsemu.DefaultAccessKey})
	now := f.clock.Now()
	if n := f.b.flights.remembered(); n != 0 {
		t.Errorf("the read budget still remembers %d failures", n)
	}
	// The write started the failing role's attempt, which succeeds at once.
	var fl *flight
	select {
	case fl = <-f.flights:
	default:
		t.Fatal("the write of config/root started no cycle for the failing role")
	}
	f.clock.DriveUntil(t, fl.done)
	if fl.res.err != nil {
		t.Fatalf("the attempt after the fix failed: %v", fl.res.err)
	}
	if waited := f.clock.Now().Sub(now); waited != 0 {
		t.Errorf("the attempt after the fix waited %s, want at once", waited)
	}
	if n := len(f.log.all()); n != calls+1 {
		t.Errorf("%d STS calls, want %d: one attempt after the fix", n, calls+1)
	}
	if st := f.status(testRole); st["state"] != "fresh" {
		t.Errorf("status after the fix: %v", st)
	}
	f.mustReadCreds(testRole)
}
