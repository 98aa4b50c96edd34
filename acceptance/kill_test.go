package acceptance

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// TestPluginSIGKILLMidCycle: the plugin process is killed with SIGKILL while
// a refresh cycle is failing part-way through; Vault restarts it on the next
// request, which succeeds with a credential the emulator really issued, and
// nothing from the failed attempts was stored.
func TestPluginSIGKILLMidCycle(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	// Six 3-second blocks: the cycle is still running when the kill lands.
	s := newDevStack(t, nil, map[string]string{"retry_window": "18s", "max_retries": "6"})
	v := s.vault
	s.createRole(t, "app")
	before := s.readCreds(t, "app")

	// Every call now returns a credential that is already expired or has no
	// access key: exactly what a plugin that stores failures would end up
	// serving.
	s.emu.SetFaults(t, vaulttest.FaultPlan{Sequence: []vaulttest.FaultStep{{Fault: "expired", Count: 1}, {Fault: "empty_key", Count: 1}, {Fault: "expired", Count: 1000}}})
	s.emu.Reset(t)

	refreshDone := make(chan vaulttest.Result, 1)
	go func() { refreshDone <- v.Exec(t, v.RootToken(), "", "write", "-f", mount+"/refresh/app") }()

	eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		n := s.assumeRoleCalls(t, "expired") + s.assumeRoleCalls(t, "empty_key")
		return n >= 2, "the refresh cycle has not made two attempts yet"
	})
	pids := v.PluginPIDs(t)
	if len(pids) == 0 {
		t.Fatal("no plugin process found under the Vault server")
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("SIGKILL %d: %v", pid, err)
		}
	}
	t.Logf("killed plugin process(es) %v after %d failed attempts", pids, s.assumeRoleCalls(t, "expired")+s.assumeRoleCalls(t, "empty_key"))
	s.emu.ClearFaults(t)
	select {
	case r := <-refreshDone:
		t.Logf("the interrupted refresh request ended with exit %d", r.Code)
	case <-time.After(60 * time.Second):
		t.Fatal("the refresh request did not end after the plugin was killed")
	}

	// Until Vault notices that the plugin process is gone, a request can
	// still be sent to its dead socket: Vault answers 500 with the gRPC
	// dial error, and starts the plugin again on a later request. That
	// error, and only that one, is waited out.
	eventually(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		r := v.Exec(t, v.RootToken(), "", "read", "-format=json", mount+"/creds/app")
		if r.Code == 0 {
			return true, ""
		}
		if !strings.Contains(r.Stderr, "transport: error while dialing") {
			t.Fatalf("read after the kill: exit %d: %s", r.Code, r.Stderr)
		}
		return false, "Vault still sends requests to the killed plugin's socket: " + r.Stderr
	})
	// Whatever is served is the old credential or one from a successful
	// call, never one of the already-expired or keyless ones the emulator
	// handed out during the cycle: readCreds rejects those, and the emulator
	// itself must still accept what is served.
	after := s.readCreds(t, "app")
	s.mustBeValid(t, after)
	if after.AccessKey != before.AccessKey && !after.Expiration.After(before.Expiration) {
		t.Fatalf("replaced by a credential that expires no later (%s vs %s)", after.Expiration, before.Expiration)
	}
	st := s.statusOf(t, "app")
	if state := st.Str("state"); state == "expired" || state == "empty" {
		t.Fatalf("status after the kill: state %q", state)
	}
	if again := v.PluginPIDs(t); len(again) == 0 || again[0] == pids[0] {
		t.Fatalf("plugin processes after restart: %v (killed %v)", again, pids)
	}
}
