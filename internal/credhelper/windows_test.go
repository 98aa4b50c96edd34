package credhelper

import (
	"strings"
	"testing"
	"time"
)

// TestProcessRunWarning (issue 32 item 9): a credential printed with less
// than botocore's 15-minute window left gets a warning that botocore will
// run the helper at every call, what each run costs (a lease on a
// lease=true role) and what to do; one with the window or more left gets
// none.
func TestProcessRunWarning(t *testing.T) {
	for _, tc := range []struct {
		name   string
		left   time.Duration
		leased bool
		says   []string // empty: no warning
	}{
		{"an hour left", time.Hour, true, nil},
		{"exactly the window left", BotocoreAdvisoryWindow, true, nil},
		{"a second inside the window", BotocoreAdvisoryWindow - time.Second, false, []string{"AKWIN", "14m59s left", "every AWS call", "a Vault read;", "ttl", "serve"}},
		{"a 900 s role's fresh credential, leased", 900*time.Second - 2*time.Second, true, []string{"14m58s left", "a new Vault lease", "lease=false"}},
		{"a minute left", time.Minute, false, []string{"1m0s left"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cred("AKWIN", t0.Add(tc.left))
			c.Leased = tc.leased
			w := ProcessRunWarning(c, t0)
			if len(tc.says) == 0 {
				if w != "" {
					t.Fatalf("warned with %s left: %q", tc.left, w)
				}
				return
			}
			for _, s := range tc.says {
				if !strings.Contains(w, s) {
					t.Errorf("warning %q does not say %q", w, s)
				}
			}
			if !tc.leased && strings.Contains(w, "lease") {
				t.Errorf("a credential without a lease is warned about leases: %q", w)
			}
			if strings.Contains(w, c.SecretAccessKey) || strings.Contains(w, c.SessionToken) {
				t.Fatalf("the warning holds a secret: %q", w)
			}
		})
	}
}
