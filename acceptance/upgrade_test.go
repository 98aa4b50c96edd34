package acceptance

import (
	"strings"
	"testing"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// TestPluginUpgrade: a second plugin version is registered, the mount is
// tuned to it and reloaded; the cached credential survives the switch.
func TestPluginUpgrade(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	const v1, v2 = "v0.1.0", "v0.2.0"
	emu := vaulttest.StartEmulator(t)
	v := vaulttest.StartDev(t)
	v.RegisterPlugin(t, vaulttest.PluginBin(t, v1), vaulttest.PluginOptions{Version: v1})
	v.RegisterPlugin(t, vaulttest.PluginBin(t, v2), vaulttest.PluginOptions{Version: v2})
	v.EnablePlugin(t, mount, v1)
	v.ConfigureEmulator(t, emu, nil)
	s := &stack{emu: emu, vault: v}
	s.createRole(t, "app")

	if got := runningVersion(t, v); got != v1 {
		t.Fatalf("running_plugin_version = %q, want %s", got, v1)
	}
	before := s.readCreds(t, "app")
	calls := s.assumeRoleCalls(t, "")

	v.CLI(t, "secrets", "tune", "-plugin-version="+v2, mount+"/")
	v.CLI(t, "plugin", "reload", "-plugin="+vaulttest.PluginName)
	if got := runningVersion(t, v); got != v2 {
		t.Fatalf("after tune and reload running_plugin_version = %q, want %s", got, v2)
	}

	after := s.readCreds(t, "app")
	if after.AccessKey != before.AccessKey {
		t.Fatal("the upgrade dropped the cached credential")
	}
	if n := s.assumeRoleCalls(t, ""); n != calls {
		t.Fatalf("the upgrade made %d STS calls, want none", n-calls)
	}
	for _, pid := range v.PluginPIDs(t) {
		name, err := vaulttest.ExeName(pid)
		if err == nil && !strings.HasSuffix(name, "_"+v2) {
			t.Errorf("plugin process %d runs %s after the upgrade", pid, name)
		}
	}
	var list []string
	v.CLIJSON(t, &list, "list", "-format=json", mount+"/roles")
	if len(list) != 1 || list[0] != "app" {
		t.Fatalf("roles after upgrade: %v", list)
	}
}

// runningVersion returns the plugin version Vault reports for the mount.
func runningVersion(t *testing.T, v *vaulttest.Server) string {
	t.Helper()
	var mounts map[string]struct {
		Type                 string `json:"type"`
		PluginVersion        string `json:"plugin_version"`
		RunningPluginVersion string `json:"running_plugin_version"`
	}
	v.CLIJSON(t, &mounts, "secrets", "list", "-format=json")
	m, ok := mounts[mount+"/"]
	if !ok {
		t.Fatalf("%s/ not mounted", mount)
	}
	return m.RunningPluginVersion
}
