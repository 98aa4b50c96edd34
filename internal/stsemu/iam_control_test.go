package stsemu

import (
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
)

// TestIAMControlAPI covers the IAM part of the control API: the user list,
// the propagation setting and a fault plan with actions.
func TestIAMControlAPI(t *testing.T) {
	clock := newFakeClock()
	e := startEmulator(t, Config{Now: clock.Now})
	do := func(t *testing.T, method, path, body string, wantStatus int) []byte {
		t.Helper()
		return controlCall(t, e, method, path, body, wantStatus)
	}

	t.Run("propagation through config", func(t *testing.T) {
		var cv ConfigView
		if err := json.Unmarshal(do(t, "POST", "/_emulator/config", `{"iam_propagation":"5s"}`, 200), &cv); err != nil {
			t.Fatal(err)
		}
		if cv.IAMPropagation != "5s" || cv.MaxLifetime != "12h0m0s" {
			t.Errorf("config = %+v, want iam_propagation 5s and the rest untouched", cv)
		}
		do(t, "POST", "/_emulator/config", `{"iam_propagation":"-1s"}`, 400)
		do(t, "POST", "/_emulator/config", `{"iam_propagation":"soon"}`, 400)
	})

	id, secret := createKey(t, e)

	t.Run("users list keys without secrets", func(t *testing.T) {
		raw := do(t, "GET", "/_emulator/iam/users", "", 200)
		if strings.Contains(string(raw), DefaultSecretKey) || strings.Contains(string(raw), secret) {
			t.Fatalf("the control API shows a secret key: %s", raw)
		}
		var generic []map[string]any
		if err := json.Unmarshal(raw, &generic); err != nil {
			t.Fatal(err)
		}
		wantKeys := []string{"access_keys", "arn", "create_date", "path", "user_id", "user_name"}
		if len(generic) != 1 || !reflect.DeepEqual(sortedKeys(generic[0]), wantKeys) {
			t.Fatalf("users = %s, want one user with fields %v", raw, wantKeys)
		}
		keys, _ := generic[0]["access_keys"].([]any)
		if len(keys) != 2 || !reflect.DeepEqual(sortedKeys(keys[1].(map[string]any)),
			[]string{"access_key_id", "create_date", "refusals_left", "settled_at", "status", "usable", "usable_at"}) {
			t.Fatalf("access_keys = %v", generic[0]["access_keys"])
		}
		var users []IAMUser
		if err := json.Unmarshal(raw, &users); err != nil {
			t.Fatal(err)
		}
		u := users[0]
		now := clock.Now()
		if u.UserName != "sts-emulator" || u.Arn != "arn:aws:iam::123456789012:user/sts-emulator" || u.Path != "/" ||
			u.AccessKeys[0].AccessKeyID != DefaultAccessKey || !u.AccessKeys[0].Usable ||
			u.AccessKeys[1].AccessKeyID != id || u.AccessKeys[1].Status != "Active" || u.AccessKeys[1].Usable ||
			!u.AccessKeys[1].UsableAt.Equal(now.Add(5*time.Second)) || !u.AccessKeys[1].CreateDate.Equal(now) {
			t.Errorf("users = %+v (now %v)", users, now)
		}
		do(t, "POST", "/_emulator/iam/users", "", 405)
	})

	t.Run("fault plan with actions", func(t *testing.T) {
		raw := do(t, "POST", "/_emulator/faults", `{"sequence":[{"fault":"reset_after","count":1}],"actions":["iam:DeleteAccessKey"]}`, 200)
		var plan map[string]any
		if err := json.Unmarshal(raw, &plan); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(plan["actions"], []any{"iam:DeleteAccessKey"}) {
			t.Errorf("plan = %s", raw)
		}
		do(t, "POST", "/_emulator/faults", `{"actions":["iam:Nope"]}`, 400)
		_, err := rootIAM(e).DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(id)})
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("DeleteAccessKey: %v, want a reset", err)
		}
		if n := len(e.IAMUsers()[0].AccessKeys); n != 1 {
			t.Errorf("%d keys: the delete behind the reset must have happened", n)
		}
		if s := e.Stats(); s.Count("DeleteAccessKey", "reset_after") != 1 || s.Count("CreateAccessKey", "ok") != 1 {
			t.Errorf("stats = %v", s.ByAction)
		}
	})
}

func sortedKeys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }
