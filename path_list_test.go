package awsresilient

import (
	"context"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/helper/consts"
	"github.com/hashicorp/vault/sdk/logical"
)

// listKeys returns a LIST response's keys; nil when it has none, which is
// how an empty list (a 404 over HTTP) comes back.
func listKeys(t *testing.T, resp *logical.Response) []string {
	t.Helper()
	raw, ok := resp.Data["keys"]
	if !ok {
		return nil
	}
	keys, ok := raw.([]string)
	if !ok {
		t.Fatalf("keys is %T, want []string", raw)
	}
	return keys
}

// TestList_Paging runs the same after/limit table against LIST roles/ and
// LIST status/, which page the same sorted role names.
func TestList_Paging(t *testing.T) {
	b, s := getTestBackend(t)
	// Written out of order: the answer is sorted whatever the write order.
	all := []string{"alpha", "bravo", "charlie", "delta", "echo"}
	for _, name := range []string{"delta", "alpha", "echo", "charlie", "bravo"} {
		mustDo(t, b, s, logical.CreateOperation, "roles/"+name, map[string]interface{}{"credential_type": "session_token"})
	}

	cases := []struct {
		name string
		data map[string]interface{}
		want []string
	}{
		{"no parameters", nil, all},
		{"empty after", map[string]interface{}{"after": ""}, all},
		{"after a key", map[string]interface{}{"after": "bravo"}, all[2:]},
		{"after a key that does not exist", map[string]interface{}{"after": "bz"}, all[2:]},
		{"after a prefix of the first key", map[string]interface{}{"after": "a"}, all},
		{"after the last key", map[string]interface{}{"after": "echo"}, nil},
		{"after every key", map[string]interface{}{"after": "zulu"}, nil},
		{"limit", map[string]interface{}{"limit": 2}, all[:2]},
		{"after and limit", map[string]interface{}{"after": "alpha", "limit": 2}, all[1:3]},
		{"limit cut by the end", map[string]interface{}{"after": "charlie", "limit": 3}, all[3:]},
		{"limit equal to the count", map[string]interface{}{"limit": 5}, all},
		{"limit larger than the count", map[string]interface{}{"limit": 1000}, all},
		{"limit 0 means no limit", map[string]interface{}{"limit": 0}, all},
		{"negative limit means no limit", map[string]interface{}{"limit": -1}, all},
		// Over HTTP both arrive from the query string, as strings.
		{"limit as a query string", map[string]interface{}{"after": "alpha", "limit": "1"}, all[1:2]},
	}
	for _, path := range []string{"roles/", "status/"} {
		for _, tc := range cases {
			t.Run(path+tc.name, func(t *testing.T) {
				resp := mustDo(t, b, s, logical.ListOperation, path, tc.data)
				if got := listKeys(t, resp); !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("keys = %v, want %v", got, tc.want)
				}
				if path != "status/" {
					return
				}
				// key_info describes the page, no more and no less.
				info, _ := resp.Data["key_info"].(map[string]interface{})
				if len(info) != len(tc.want) {
					t.Fatalf("key_info has %d roles, want %d: %v", len(info), len(tc.want), info)
				}
				for _, name := range tc.want {
					if st, ok := info[name].(map[string]interface{}); !ok || st["state"] != stateEmpty {
						t.Fatalf("key_info[%s] = %v, want state %s", name, info[name], stateEmpty)
					}
				}
			})
		}
	}
}

// TestList_PagingBadValues: a value that is not of the field's type is a 400
// naming the field, before any listing. The message ends with the field's
// description, which is where the valid range is stated.
func TestList_PagingBadValues(t *testing.T) {
	b, s := getTestBackend(t)
	mustDo(t, b, s, logical.CreateOperation, "roles/alpha", map[string]interface{}{"credential_type": "session_token"})

	cases := []struct {
		name string
		data map[string]interface{}
		want []string
	}{
		{"limit not a number", map[string]interface{}{"limit": "ten"}, []string{`limit takes a whole number; got "ten"`, "an integer", "0 or less"}},
		{"limit not an integer", map[string]interface{}{"limit": "1.5"}, []string{`limit takes a whole number; got "1.5"`, "an integer"}},
		{"limit out of range", map[string]interface{}{"limit": "99999999999999999999"}, []string{"limit takes a whole number", "out of range"}},
		{"after not a string", map[string]interface{}{"after": map[string]interface{}{"a": 1}}, []string{"after takes a string", "sort after"}},
	}
	for _, path := range []string{"roles/", "status/"} {
		for _, tc := range cases {
			t.Run(path+tc.name, func(t *testing.T) {
				resp, err := do(t, b, s, logical.ListOperation, path, tc.data)
				wantBadRequest(t, resp, err, tc.want...)
			})
		}
	}
}

// TestList_PagingWalk pages through every role with after set to the last
// name of the previous page, the way a client walks a large mount, and
// gets each role exactly once, in order.
func TestList_PagingWalk(t *testing.T) {
	b, s := getTestBackend(t)
	var want []string
	for _, name := range []string{"a", "a-1", "a.b", "aa", "b", "b_c", "c", "z"} {
		mustDo(t, b, s, logical.CreateOperation, "roles/"+name, map[string]interface{}{"credential_type": "session_token"})
		want = append(want, name)
	}
	full := listKeys(t, mustDo(t, b, s, logical.ListOperation, "roles/", nil))
	if !reflect.DeepEqual(full, want) {
		t.Fatalf("full list = %v, want %v", full, want)
	}
	for _, path := range []string{"roles/", "status/"} {
		for _, limit := range []int{1, 3, len(want)} {
			var got []string
			after := ""
			for pages := 0; ; pages++ {
				if pages > len(want) {
					t.Fatalf("%s limit %d: no end after %d pages", path, limit, pages)
				}
				page := listKeys(t, mustDo(t, b, s, logical.ListOperation, path, map[string]interface{}{"after": after, "limit": limit}))
				if len(page) == 0 {
					break
				}
				if len(page) > limit {
					t.Fatalf("%s limit %d: page of %d", path, limit, len(page))
				}
				got = append(got, page...)
				after = page[len(page)-1]
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s limit %d: walked %v, want %v", path, limit, got, want)
			}
		}
	}
}

// TestList_HelpExplainsPaging: path help is where `vault path-help` users
// learn the parameters, since `vault list` cannot send them.
func TestList_HelpExplainsPaging(t *testing.T) {
	b, s := getTestBackend(t)
	for _, path := range []string{"roles/", "status/"} {
		resp, err := b.HandleRequest(t.Context(), &logical.Request{Operation: logical.HelpOperation, Path: path, Storage: s})
		if err != nil {
			t.Fatal(err)
		}
		help, _ := resp.Data["help"].(string)
		for _, want := range []string{"after=<name>", "limit=<n>", "list=true&after="} {
			if !strings.Contains(help, want) {
				t.Fatalf("help for %s does not mention %q:\n%s", path, want, help)
			}
		}
	}
}

// countingSystemView counts ReplicationState calls, each of which is a
// round trip to Vault when the backend runs as a plugin.
type countingSystemView struct {
	logical.SystemView
	calls atomic.Int64
}

func (c *countingSystemView) ReplicationState() consts.ReplicationState {
	c.calls.Add(1)
	return c.SystemView.ReplicationState()
}

// TestList_StatusAsksVaultPerList: LIST status/ asks for the replication
// state once per list, not once per listed role; per role, a 100 000-role
// list on a Vault 1.19 dev server ran past its 90 s request limit.
func TestList_StatusAsksVaultPerList(t *testing.T) {
	ctx := context.Background()
	sys := &countingSystemView{SystemView: logical.TestSystemView()}
	config := logical.TestBackendConfig()
	config.StorageView = new(logical.InmemStorage)
	config.Logger = hclog.NewNullLogger()
	config.System = sys
	b, err := newBackendWith(ctx, config, backendOptions{clock: newFakeClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))})
	if err != nil {
		t.Fatal(err)
	}
	s := config.StorageView
	if err := b.Initialize(ctx, &logical.InitializationRequest{Storage: s}); err != nil {
		t.Fatal(err)
	}
	// The first pass, in the background, asks for the state too.
	if err := b.life.waitStarted(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Cleanup(ctx) })
	const roles = 20
	for i := 0; i < roles; i++ {
		mustDo(t, b, s, logical.CreateOperation, "roles/r"+strings.Repeat("x", i), map[string]interface{}{"credential_type": "session_token"})
	}

	// The sdk asks once per request too (for forwarding), so compare a
	// page of one role with the whole list: the count must not grow.
	asks := func(data map[string]interface{}, want int) int64 {
		before := sys.calls.Load()
		resp := mustDo(t, b, s, logical.ListOperation, "status/", data)
		if n := len(listKeys(t, resp)); n != want {
			t.Fatalf("%d keys, want %d", n, want)
		}
		return sys.calls.Load() - before
	}
	one := asks(map[string]interface{}{"limit": 1}, 1)
	all := asks(nil, roles)
	if all != one || one > 2 {
		t.Fatalf("LIST status/ asked for the replication state %d times for 1 role and %d times for %d roles, want the same small number", one, all, roles)
	}
}
