package vaulttest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// AgentTemplate is one template stanza of a Vault Agent configuration.
type AgentTemplate struct {
	// Contents is the consul-template text, e.g.
	// {{ with secret "aws-resilient/creds/app" }}{{ .Data.access_key }}{{ end }}.
	Contents string
	// Destination is the rendered file (default <agent dir>/rendered-N).
	Destination string
}

// Agent is a running `vault agent`.
type Agent struct {
	Process *Process
	// Dir holds the agent's configuration, token file, log and (by default)
	// rendered files.
	Dir string
	// Destinations are the rendered files, in template order.
	Destinations []string
}

// StartAgent runs `vault agent` against the server, authenticated with token
// through the token_file auto-auth method, rendering templates. extraHCL is
// appended to the configuration (for example a template_config stanza).
// The agent exits on a template error rather than retrying forever, so a
// failing read shows up as an exited process.
func (s *Server) StartAgent(tb testing.TB, token string, templates []AgentTemplate, extraHCL string) *Agent {
	tb.Helper()
	dir := tb.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		tb.Fatal(err)
	}
	a := &Agent{Dir: dir}
	var hcl strings.Builder
	fmt.Fprintf(&hcl, "pid_file = %s\n", hclString(filepath.Join(dir, "agent.pid")))
	fmt.Fprintf(&hcl, "vault {\n  address = %s\n}\n", hclString(s.Addr))
	fmt.Fprintf(&hcl, "auto_auth {\n  method \"token_file\" {\n    config = {\n      token_file_path = %s\n    }\n  }\n}\n", hclString(tokenFile))
	for i, t := range templates {
		dst := t.Destination
		if dst == "" {
			dst = filepath.Join(dir, "rendered-"+strconv.Itoa(i))
		}
		a.Destinations = append(a.Destinations, dst)
		fmt.Fprintf(&hcl, "template {\n  destination = %s\n  contents = %s\n  perms = \"0600\"\n}\n", hclString(dst), hclString(t.Contents))
	}
	hcl.WriteString(extraHCL)
	cfg := filepath.Join(dir, "agent.hcl")
	if err := os.WriteFile(cfg, []byte(hcl.String()), 0o600); err != nil {
		tb.Fatal(err)
	}
	// trace: consul-template then logs each read of a secret (GET), the
	// wait the lease it got set before the next one, and each retry with
	// its backoff, what a stale rendered file is explained by.
	a.Process = StartProcess(tb, "vault-agent", dir, cleanEnv("HOME="+dir), s.bin, "agent", "-config="+cfg, "-log-level=trace")
	return a
}

// hclString quotes s as an HCL string. Go's quoting matches HCL's escapes for
// the printable ASCII, newlines and tabs that configurations here contain.
func hclString(s string) string {
	return strconv.Quote(s)
}
