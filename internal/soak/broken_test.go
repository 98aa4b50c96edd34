package soak_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// TestBrokenBuildsStillApply: every BROKEN=<mode> of scripts/soak.sh that
// patches the plugin still changes the file it names and still builds
// (scripts/soak.sh --check-broken). A patch written against code that has
// since changed fails here, in the unit tests, rather than on the day
// someone runs the break-it (three had rotted unnoticed by 2026-12-05:
// serve-expired and cycle-per-read after the credential's life moved to
// AWS's clock, forget-storage after the typed storage reads).
func TestBrokenBuildsStillApply(t *testing.T) {
	cmd := exec.Command("bash", "scripts/soak.sh", "--check-broken")
	cmd.Dir = vaulttest.RepoRoot(t)
	cmd.Env = append(os.Environ(), "OUT="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/soak.sh --check-broken: %v\n%s", err, out)
	}
}
