package acceptance

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// agentTemplate renders an AWS shared-credentials file, the way users would
// feed the SDKs, plus the expiration so the test can check it.
const agentTemplate = `{{ with secret "aws-resilient/creds/app" -}}
[default]
aws_access_key_id = {{ .Data.access_key }}
aws_secret_access_key = {{ .Data.secret_key }}
aws_session_token = {{ .Data.security_token }}
# expiration = {{ .Data.expiration }}
{{- end }}
`

var renderedRe = regexp.MustCompile(`(?s)aws_access_key_id = (\S+)\naws_secret_access_key = (\S+)\naws_session_token = (\S+)\n# expiration = (\S+)`)

// TestAgentRerendersBeforeExpiry: Vault Agent renders the credentials file
// from creds/app; with 40-second emulator lifetimes it renders new
// credentials before the old ones expire, and the file never holds an
// expired credential.
func TestAgentRerendersBeforeExpiry(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	testAgentRerenders(t, true)
}

// TestAgentRerendersBeforeExpiryNoLease is the same with a lease=false role:
// no lease, so the agent schedules its next read from the response's ttl
// and rotation_period (a rotating secret, as for database static roles).
func TestAgentRerendersBeforeExpiryNoLease(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	testAgentRerenders(t, false)
}

func testAgentRerenders(t *testing.T, lease bool) {
	const lifetime = 40 * time.Second
	// refresh_fraction 0.5: the plugin refreshes with 20s left. With a lease
	// the agent re-reads at 85-95% of it (the remaining validity), by which
	// time the cache already holds the next credential; without one it
	// re-reads after ttl+1 seconds, ttl being when the plugin expects the
	// next credential in the cache (its refresh plus one 2s retry block).
	s := newDevStack(t, []string{"-max-lifetime", lifetime.String()},
		map[string]string{"retry_window": "4s", "max_retries": "2", "refresh_fraction": "0.5"})
	v := s.vault
	if lease {
		s.createRole(t, "app")
	} else {
		s.createRole(t, "app", "lease=false")
	}

	const policy = `path "` + mount + `/creds/app" { capabilities = ["read"] }`
	if r := v.Exec(t, v.RootToken(), policy, "policy", "write", "agent", "-"); r.Code != 0 {
		t.Fatalf("policy write: %s", r.Stderr)
	}
	var tok struct {
		Auth struct {
			ClientToken string `json:"client_token"`
		} `json:"auth"`
	}
	v.CLIJSON(t, &tok, "token", "create", "-format=json", "-policy=agent", "-ttl=1h")

	a := v.StartAgent(t, tok.Auth.ClientToken, []vaulttest.AgentTemplate{{Contents: agentTemplate}},
		"template_config {\n  exit_on_retry_failure = true\n}\n")
	file := a.Destinations[0]

	type seen struct {
		c     creds
		first time.Time
	}
	var history []seen
	observe := func() {
		b, err := os.ReadFile(file)
		now := time.Now()
		if err != nil {
			return // not rendered yet
		}
		m := renderedRe.FindSubmatch(b)
		if m == nil {
			t.Fatalf("rendered file has an unexpected shape (%d bytes)", len(b))
		}
		exp, err := time.Parse(time.RFC3339, string(m[4]))
		if err != nil {
			t.Fatalf("rendered expiration %q: %v", m[4], err)
		}
		c := creds{AccessKey: string(m[1]), SecretKey: string(m[2]), SecurityToken: string(m[3]), Expiration: exp}
		if !exp.After(now) {
			t.Fatalf("at %s the rendered file holds %s, expired at %s", now.UTC().Format(time.RFC3339Nano), c.AccessKey, exp.Format(time.RFC3339))
		}
		if len(history) == 0 || history[len(history)-1].c.AccessKey != c.AccessKey {
			if len(history) > 0 {
				prev := history[len(history)-1]
				t.Logf("re-rendered %s after %s, %s before the previous credential expired",
					c.AccessKey, now.Sub(prev.first).Round(time.Second), prev.c.Expiration.Sub(now).Round(time.Second))
			}
			s.mustBeValid(t, c)
			history = append(history, seen{c: c, first: now})
		}
	}

	// Three credentials (two re-renders) take about 60s; 100s leaves room.
	deadline := time.Now().Add(100 * time.Second)
	for time.Now().Before(deadline) {
		if !a.Process.Running() {
			t.Fatalf("vault agent exited: %v", a.Process.Err())
		}
		observe()
		if len(history) >= 3 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(history) < 3 {
		t.Fatalf("the agent rendered %d distinct credentials in 100s with %s lifetimes, want at least 3", len(history), lifetime)
	}
	if n := s.assumeRoleCalls(t, ""); n > len(history)+2 {
		t.Errorf("%d AssumeRole calls for %d credentials rendered", n, len(history))
	}
	// The agent's reads left leases behind only when the role asks for them.
	r := v.Exec(t, v.RootToken(), "", "list", "sys/leases/lookup/"+mount+"/creds/app")
	if hasLeases := r.Code == 0 && strings.Contains(r.Stdout, "Keys"); hasLeases != lease {
		t.Errorf("lease=%v: leases listed under creds/app: %v (exit %d): %s", lease, hasLeases, r.Code, redact(r.Stdout+r.Stderr))
	}
}
