package soak_test

import (
	"os"
	"testing"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// TestMain removes what dead test processes left before the tests, and the
// binaries built for the soak after them (vaulttest.Main).
func TestMain(m *testing.M) { os.Exit(vaulttest.Main(m)) }
