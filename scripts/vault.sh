#!/usr/bin/env bash
# vault.sh [VERSION] builds a Vault server pinned in tools/vault-VERSION once,
# into a cache directory outside the repository, and prints the binary's
# path on stdout. Later runs reuse it. The same binary is the `vault` CLI and
# `vault agent`. Without VERSION: the first version in tools/vault-versions,
# the one the tests, the dev server and the benchmarks use.
#
# Why build it: these machines reach only package registries, so Vault comes
# from the Go module proxy like any other module. A cold build takes about
# 11 minutes on 2 cores; everything else in the repo is quick.
#
# Environment:
#   VAULT_BIN    use this binary instead for the default version (it is
#                checked, not built)
#   XDG_CACHE_HOME / HOME  decide the cache directory (binaries, and the
#                build cache their compilation uses)
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)

default=$(grep -v '^#' tools/vault-versions | head -n 1)
version=${1:-$default}
version=${version#v}
mod="tools/vault-${version}"
if ! grep -qx "$version" <(grep -v '^#' tools/vault-versions) || [[ ! -f "$mod/go.mod" ]]; then
	echo "vault.sh: Vault $version is not supported; tools/vault-versions lists: $(grep -v '^#' tools/vault-versions | tr '\n' ' ')" >&2
	exit 2
fi
# The module must pin exactly that version: the cache directory follows it.
pinned=$(awk '$1 == "require" && $2 == "github.com/hashicorp/vault" { print $3 }' "$mod/go.mod")
if [[ "$pinned" != "v${version}" ]]; then
	echo "vault.sh: $mod/go.mod requires github.com/hashicorp/vault ${pinned:-nothing}, not v${version}" >&2
	exit 1
fi

check() {
	# A build that was interrupted never reaches the final name (see below),
	# so a file there is complete; `vault version` proves it runs.
	local out
	out=$("$1" version 2>/dev/null) || return 1
	[[ "$out" == "Vault v${version}"* ]]
}

# VAULT_BIN picks the binary when no version is asked for: any supported
# version (make compat runs the dev server test on each).
if [[ -n "${VAULT_BIN:-}" && -z "${1:-}" ]]; then
	for v in $(grep -v '^#' tools/vault-versions); do
		version=$v
		if check "$VAULT_BIN"; then
			echo "$VAULT_BIN"
			exit 0
		fi
	done
	echo "vault.sh: VAULT_BIN=$VAULT_BIN is not a working Vault of a supported version ($(grep -v '^#' tools/vault-versions | tr '\n' ' '))" >&2
	exit 1
fi

cache="${XDG_CACHE_HOME:-$HOME/.cache}/aws-resilient/vault-${version}"
bin="$cache/vault"
mkdir -p "$cache"

# Parallel callers (several test packages, a dev server started while tests
# run) wait for one build instead of starting a second 11-minute one.
exec 9>"$cache/.lock"
flock 9

if [[ -x "$bin" ]] && check "$bin"; then
	echo "$bin"
	exit 0
fi

echo "vault.sh: building Vault v${version} into $bin (about 11 minutes cold on 2 cores)..." >&2
start=$(date +%s)
tmp=$(mktemp "$cache/.vault-build.XXXXXX")
trap 'rm -f "$tmp"' EXIT
# -mod=readonly: go.sum is committed, so a fresh clone builds without tidy and
# a drifted go.mod fails loudly instead of being rewritten.
# Vault's compiled packages go to a build cache of their own beside the
# binaries, shared by the versions (they have much in common): an empty
# Vault cache then really means a cold build, and the repository's own
# tests do not evict it from the user's Go cache, nor it theirs.
(cd "$root/$mod" && GOCACHE="${XDG_CACHE_HOME:-$HOME/.cache}/aws-resilient/go-build" \
	go build -mod=readonly -o "$tmp" github.com/hashicorp/vault) >&2
chmod 0755 "$tmp"
if ! check "$tmp"; then
	echo "vault.sh: the built binary does not report Vault v${version}" >&2
	exit 1
fi
# Rename is atomic on one filesystem: a reader sees the old state or a complete binary.
mv -f "$tmp" "$bin"
trap - EXIT
echo "vault.sh: built in $(( $(date +%s) - start ))s" >&2
echo "$bin"
