#!/usr/bin/env bash
# vault.sh builds the Vault server pinned in tools/vault once, into a cache
# directory outside the repository, and prints the binary's path on stdout.
# Later runs reuse it. The same binary is the `vault` CLI and `vault agent`.
#
# Why build it: these machines reach only package registries, so Vault comes
# from the Go module proxy like any other module. A cold build takes about
# 11 minutes on 2 cores; everything else in the repo is quick.
#
# Environment:
#   VAULT_BIN    use this binary instead (it is checked, not built)
#   XDG_CACHE_HOME / HOME  decide the cache directory
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)

# The version is whatever tools/vault/go.mod requires, so bumping Vault is a
# one-line change there and the cache directory follows it.
version=$(awk '$1 == "require" && $2 == "github.com/hashicorp/vault" { print $3 }' tools/vault/go.mod)
version=${version#v}
if [[ -z "$version" ]]; then
	echo "vault.sh: cannot find the github.com/hashicorp/vault requirement in tools/vault/go.mod" >&2
	exit 1
fi

check() {
	# A build that was interrupted never reaches the final name (see below),
	# so a file there is complete; `vault version` proves it runs.
	local out
	out=$("$1" version 2>/dev/null) || return 1
	[[ "$out" == "Vault v${version}"* ]]
}

if [[ -n "${VAULT_BIN:-}" ]]; then
	if ! check "$VAULT_BIN"; then
		echo "vault.sh: VAULT_BIN=$VAULT_BIN is not a working Vault v${version}" >&2
		exit 1
	fi
	echo "$VAULT_BIN"
	exit 0
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
(cd "$root/tools/vault" && go build -mod=readonly -o "$tmp" github.com/hashicorp/vault) >&2
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
