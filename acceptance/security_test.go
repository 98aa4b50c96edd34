package acceptance

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// TestACL: a token whose policy allows only creds/app reads that and is
// denied every other path of the mount.
func TestACL(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	s := newDevStack(t, nil, nil)
	v := s.vault
	s.createRole(t, "app")
	s.createRole(t, "admin")

	const policy = `path "` + mount + `/creds/app" {
  capabilities = ["read"]
}
`
	if r := v.Exec(t, v.RootToken(), policy, "policy", "write", "app-only", "-"); r.Code != 0 {
		t.Fatalf("policy write: %s", r.Stderr)
	}
	var tok struct {
		Auth struct {
			ClientToken string `json:"client_token"`
		} `json:"auth"`
	}
	v.CLIJSON(t, &tok, "token", "create", "-format=json", "-policy=app-only", "-ttl=10m")
	app := tok.Auth.ClientToken
	if app == "" {
		t.Fatal("token create returned no token")
	}

	r := v.Exec(t, app, "", "read", "-format=json", mount+"/creds/app")
	if r.Code != 0 {
		t.Fatalf("read creds/app with the app-only token: exit %d: %s", r.Code, r.Stderr)
	}
	var sec vaulttest.Secret
	if err := json.Unmarshal([]byte(r.Stdout), &sec); err != nil {
		t.Fatal(err)
	}
	checkUsable(t, credsFrom(t, &sec))

	for _, args := range [][]string{
		{"read", mount + "/creds/admin"},
		{"read", mount + "/config/root"},
		{"write", mount + "/config/root", "region=eu-west-1"},
		{"read", mount + "/config/refresh"},
		{"read", mount + "/roles/app"},
		{"write", mount + "/roles/app", "ttl=2h"},
		{"read", mount + "/status/app"},
		{"write", "-f", mount + "/refresh/app"},
	} {
		r := v.Exec(t, app, "", args...)
		expectVaultError(t, r, "403", "permission denied")
	}
	// The denied writes changed nothing.
	if got := v.Read(t, mount+"/config/root").Str("region"); got != "us-east-1" {
		t.Fatalf("region = %q after a denied write", got)
	}
}

// TestAuditHMAC: with a file audit device on, secrets in requests
// (config/root secret_key) and responses (creds secret_key and
// security_token) appear in the audit log only as HMACs, and never in the
// server's log, which carries the plugin's log lines.
func TestAuditHMAC(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	emu := vaulttest.StartEmulator(t)
	v := vaulttest.StartDev(t)
	auditLog := filepath.Join(v.Dir, "audit.log")
	v.CLI(t, "audit", "enable", "file", "file_path="+auditLog)
	v.SetupPlugin(t, vaulttest.DefaultPluginVersion)
	v.ConfigureEmulator(t, emu, nil)
	s := &stack{emu: emu, vault: v}
	s.createRole(t, "app")
	c := s.readCreds(t, "app")

	// A refresh too, so the refresher's log lines are in the server log.
	v.CLI(t, "write", "-f", mount+"/refresh/app")
	c2 := s.readCreds(t, "app")

	raw, err := os.ReadFile(auditLog)
	if err != nil {
		t.Fatal(err)
	}
	// The server log (debug level) carries the plugin's own log lines.
	serverLog, err := os.ReadFile(v.Process.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(serverLog), "refresh succeeded") {
		t.Fatal("the server log has no plugin refresh line: the check below would prove nothing")
	}
	for name, secret := range map[string]string{
		"the emulator root secret key":       emu.SecretKey,
		"the credential's secret_key":        c.SecretKey,
		"its security_token":                 c.SecurityToken,
		"the refreshed one's secret_key":     c2.SecretKey,
		"the refreshed one's security_token": c2.SecurityToken,
	} {
		if strings.Contains(string(raw), secret) {
			t.Errorf("the audit log contains %s in clear", name)
		}
		if strings.Contains(string(serverLog), secret) {
			t.Errorf("the Vault server log (with the plugin's lines) contains %s", name)
		}
	}

	// Find the response to the creds read and check the fields are HMACs.
	found := false
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		var entry struct {
			Type    string `json:"type"`
			Request struct {
				Path string `json:"path"`
			} `json:"request"`
			Response struct {
				Data map[string]any `json:"data"`
			} `json:"response"`
		}
		if err := json.Unmarshal(sc.Bytes(), &entry); err != nil {
			t.Fatalf("audit log line is not JSON: %v", err)
		}
		if entry.Type != "response" || entry.Request.Path != mount+"/creds/app" {
			continue
		}
		found = true
		for _, f := range []string{"secret_key", "security_token"} {
			val, _ := entry.Response.Data[f].(string)
			if !strings.HasPrefix(val, "hmac-sha256:") {
				t.Errorf("audit response %s is not an HMAC (%d chars, prefix %q)", f, len(val), prefix(val, 12))
			}
		}
	}
	if !found {
		t.Fatal("no audit response entry for the creds read")
	}
}

func prefix(s string, n int) string {
	if len(s) < n {
		return s
	}
	return s[:n]
}
