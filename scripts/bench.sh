#!/usr/bin/env bash
# bench.sh: the benchmark (`make bench`). Builds the plugin, the STS emulator
# and cmd/aws-resilient-bench, then runs the driver, which starts its own
# Vault dev server(s) and emulators, prints one table with every target's
# pass/fail, and writes the charts, table.txt and results.json to docs/bench/
# (change with -out). Arguments go to the driver: -quick for a ~3 minute
# smoke run, -sections a,c to pick sections, -h for every knob.
#
# Not run by CI, and a missed target never fails it: the exit status is
# non-zero only when the bench cannot run. A full run takes about 10 minutes
# on 2 cores; it needs the pinned Vault (scripts/vault.sh builds it once).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
	export PATH="$PATH:/usr/local/go/bin"
fi

VAULT_BIN=$(./scripts/vault.sh)
export VAULT_BIN

work=$(mktemp -d "${TMPDIR:-/tmp}/aws-resilient-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
# Everything the driver creates (server directories, logs, plugin sockets)
# lives under $work and goes with it.
mkdir "$work/tmp"

# The harness registers the plugin as v0.1.0-dev; the compiled-in version
# must match (Vault checks).
go build -ldflags "-X main.version=v0.1.0-dev" -o "$work/vault-plugin-secrets-aws-resilient" ./cmd/vault-plugin-secrets-aws-resilient
go build -o "$work/sts-emulator" ./cmd/sts-emulator
go build -o "$work/aws-resilient-bench" ./cmd/aws-resilient-bench
export PLUGIN_BIN="$work/vault-plugin-secrets-aws-resilient"
export STS_EMULATOR_BIN="$work/sts-emulator"

TMPDIR="$work/tmp" "$work/aws-resilient-bench" "$@"
