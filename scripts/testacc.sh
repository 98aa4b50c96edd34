#!/usr/bin/env bash
# testacc.sh: the acceptance tests (`make testacc`): the plugin in a real
# Vault through the real vault CLI, HTTP API and Vault Agent, against the STS
# emulator. Builds Vault on first use (scripts/vault.sh). Extra arguments go
# to `go test` (for example -run TestPaths).
set -euo pipefail
cd "$(dirname "$0")/.."

VAULT_BIN=$(./scripts/vault.sh)
export VAULT_BIN
# The Vault upgrade test runs when VAULT_BIN_<version> names the other
# versions' binaries (make compat sets them).
export VAULT_ACC=1
# Each test starts its own servers and mostly waits on timers, so they run
# side by side regardless of the core count; -parallel defaults to GOMAXPROCS.
exec go test -count=1 -v -parallel 8 -timeout 40m "$@" ./acceptance/... ./internal/vaulttest/...
