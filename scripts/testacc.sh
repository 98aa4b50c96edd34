#!/usr/bin/env bash
# testacc.sh: the acceptance tests (`make testacc`): the plugin in a real
# Vault through the real vault CLI, HTTP API and Vault Agent, against the STS
# emulator. Builds every supported Vault on first use (scripts/vault.sh). Extra arguments go
# to `go test` (for example -run TestPaths).
set -euo pipefail
cd "$(dirname "$0")/.."

# Every supported Vault (tools/vault-versions): the suite runs on the
# first, the pinned one; the upgrade test starts on the first and moves to
# the last. Each is built once into the cache (about 11 minutes cold).
VAULT_BIN=$(./scripts/vault.sh)
export VAULT_BIN
for v in $(grep -v '^#' tools/vault-versions); do
	bin=$(./scripts/vault.sh "$v")
	export "VAULT_BIN_${v//./_}=$bin"
done
export VAULT_ACC=1
# Each test starts its own servers and mostly waits on timers, so they run
# side by side regardless of the core count; -parallel defaults to GOMAXPROCS.
# Their Vault logs fill the output, so a failure's message can sit far above
# the end: cmd/test-failures repeats each failed test's own lines there
# (pipefail keeps go test's exit status).
go build -o "${TMPDIR:-/tmp}/aws-resilient-test-failures" ./cmd/test-failures
go test -count=1 -v -parallel 8 -timeout 40m "$@" ./acceptance/... ./internal/vaulttest/... 2>&1 |
	"${TMPDIR:-/tmp}/aws-resilient-test-failures"
