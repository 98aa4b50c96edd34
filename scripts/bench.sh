#!/usr/bin/env bash
# bench.sh: the benchmark (`make bench`). Builds the plugin, the STS emulator
# and cmd/aws-resilient-bench, then runs the driver, which starts its own
# Vault dev server(s) and emulators, prints one table with every target's
# pass/fail, and writes the charts, table.txt and results.json to docs/bench/
# (change with -out). Arguments go to the driver: -quick for a ~8 minute
# smoke run, -sections a,c to pick sections, -roles 10000 for section f's
# size, -entities 100 -entity-roles 10 for section g's (per-entity
# credentials), -doc BENCHMARKS.md to put a full run's table in BENCHMARKS.md's
# "Latest run", -h for every knob. A run of some sections only replaces
# their rows in table.txt and results.json and keeps the others'.
#
# Not run by CI, and a missed target never fails it: the exit status is
# non-zero only when the bench cannot run (CI runs the verdicts on recorded
# figures instead: cmd/aws-resilient-bench's tests). A full run takes about
# 38 minutes on 2 idle cores (section f, scale, about 6 of them at its
# default -roles 2000; section g, per-entity credentials, about 7 with its
# second size; section i, chaining, about 7; section j, a hub outage
# behind 1 000 targets, about 5; section e about 4); it needs the pinned
# Vault
# (scripts/vault.sh builds it once).
#
# Environment:
#   PLUGIN_REF  build the plugin from this commit (git archive) instead of
#               the working tree, and report that commit: what another
#               engineer has not committed yet is then not measured
#   PLUGIN_BASE_REF  section a also mounts the plugin built from this commit
#               and reads it in the same rounds: a change's cost to the
#               cached read, side by side (e.g. PLUGIN_BASE_REF=HEAD~5);
#               the driver's -base-plugin PATH does the same with a binary
#               built elsewhere (-ldflags "-X main.version=v0.1.0-dev")
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
# must match (Vault checks). build_plugin SRC OUT [go build flags...] builds
# the plugin from the tree SRC into OUT; src_of REF DIR puts commit REF's
# tree in DIR and prints DIR.
build_plugin() {
	local src=$1 out=$2
	shift 2
	(cd "$src" && go build "$@" -ldflags "-X main.version=v0.1.0-dev" -o "$out" ./cmd/vault-plugin-secrets-aws-resilient)
}
src_of() {
	mkdir "$2"
	git archive "$1" | tar -x -C "$2"
	echo "$2"
}
src=.
if [[ -n "${PLUGIN_REF:-}" ]]; then
	PLUGIN_COMMIT=$(git rev-parse --short "$PLUGIN_REF^{commit}")
	export PLUGIN_COMMIT
	src=$(src_of "$PLUGIN_COMMIT" "$work/plugin-src")
fi
build_plugin "$src" "$work/vault-plugin-secrets-aws-resilient"
# Section h's baseline: the same plugin without the read budget.
build_plugin "$src" "$work/vault-plugin-secrets-aws-resilient-nobudget" -tags nobudget
export PLUGIN_NOBUDGET_BIN="$work/vault-plugin-secrets-aws-resilient-nobudget"
if [[ -n "${PLUGIN_BASE_REF:-}" ]]; then
	PLUGIN_BASE_COMMIT=$(git rev-parse --short "$PLUGIN_BASE_REF^{commit}")
	export PLUGIN_BASE_COMMIT
	build_plugin "$(src_of "$PLUGIN_BASE_COMMIT" "$work/base-src")" "$work/aws-resilient-base"
	export PLUGIN_BASE_BIN="$work/aws-resilient-base"
fi
go build -o "$work/sts-emulator" ./cmd/sts-emulator
go build -o "$work/aws-resilient-bench" ./cmd/aws-resilient-bench
export PLUGIN_BIN="$work/vault-plugin-secrets-aws-resilient"
export STS_EMULATOR_BIN="$work/sts-emulator"

TMPDIR="$work/tmp" "$work/aws-resilient-bench" "$@"
