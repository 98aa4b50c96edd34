#!/usr/bin/env bash
# vault.sh [VERSION] builds a Vault server pinned in tools/vault-VERSION once,
# into a cache directory outside the repository, and prints the binary's
# path on stdout. Later runs reuse it. The same binary is the `vault` CLI and
# `vault agent`. Without VERSION: the first version in tools/vault-versions,
# the one the tests, the dev server and the benchmarks use.
#
# Why build it: these machines reach only package registries, so Vault comes
# from the Go module proxy like any other module. A cold build takes 15 to
# 30 minutes on 2 cores (more under load); everything else in the repo is
# quick.
#
# A build shows its progress on stderr: packages compiled of the total,
# the time elapsed and an estimate of the time left, every
# VAULT_SH_PROGRESS_EVERY seconds (default 15). A caller that finds another
# process building the same version says so and waits for it, showing that
# build's progress.
#
# Environment:
#   VAULT_BIN    use this binary instead for the default version (it is
#                checked, not built): VAULT_BIN=$(command -v vault) make dev
#                skips the build with a Vault you already have, of a
#                version tools/vault-versions lists
#   XDG_CACHE_HOME / HOME  decide the cache directory (binaries, and the
#                build cache their compilation uses)
#   VAULT_SH_PROGRESS_EVERY  seconds between progress lines (0: every package)
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
# run) wait for one build instead of starting a second one; the builder
# writes its progress beside the lock, for them to show.
exec 9>"$cache/.lock"
progress_file="$cache/.build-progress"
every=${VAULT_SH_PROGRESS_EVERY:-15}
[[ "$every" =~ ^[0-9]+$ ]] || {
	echo "vault.sh: VAULT_SH_PROGRESS_EVERY must be a whole number of seconds; got '$every'" >&2
	exit 2
}
if ! flock -n 9; then
	waited_from=$(date +%s)
	echo "vault.sh: another process is building Vault v${version} (it holds $cache/.lock); waiting for its build instead of starting a second one" >&2
	until flock -w "$((every > 0 ? every : 1))" 9; do
		line=$(tail -n 1 "$progress_file" 2>/dev/null || true)
		echo "vault.sh: still waiting for the other build ($(($(date +%s) - waited_from))s)${line:+; it says: $line}" >&2
	done
fi

if [[ -x "$bin" ]] && check "$bin"; then
	echo "$bin"
	exit 0
fi

# fmt_secs N: N seconds as 1h2m3s, 4m5s or 6s.
fmt_secs() {
	local n=$1
	if ((n >= 3600)); then
		printf '%dh%dm%ds' $((n / 3600)) $((n % 3600 / 60)) $((n % 60))
	elif ((n >= 60)); then
		printf '%dm%ds' $((n / 60)) $((n % 60))
	else
		printf '%ds' "$n"
	fi
}

# progress TOTAL START: reads `go build -v`'s stderr, in which each package
# compiled is a line naming it, and says every $every seconds how many of
# TOTAL were compiled, the time since START and an estimate of the time
# left (packages already in the build cache are not compiled again, so a
# warm build ends before the count does). Every other line (an error) is
# passed on.
progress() {
	local total=$1 start=$2 n=0 last=0 now elapsed left line msg
	local pkg='^[A-Za-z0-9_.~/-]+$' # an import path: go build -v's line for a package compiled
	while IFS= read -r line; do
		if [[ "$line" =~ $pkg ]]; then
			n=$((n + 1))
		else
			printf '%s\n' "$line" >&2
			continue
		fi
		now=$(date +%s)
		if ((now - last < every && n < total)); then
			continue
		fi
		last=$now
		elapsed=$((now - start))
		msg="$n of $total packages compiled ($((n * 100 / total))%), $(fmt_secs "$elapsed") elapsed"
		# An estimate from the rate so far, once there is one to speak of.
		if ((n * 20 >= total && n < total)); then
			left=$((elapsed * (total - n) / n))
			msg+=", about $(fmt_secs "$left") left"
		fi
		echo "vault.sh: $msg" >&2
		echo "$msg" >"$progress_file"
	done
}

start=$(date +%s)
tmp=$(mktemp "$cache/.vault-build.XXXXXX")
trap 'rm -f "$tmp" "$progress_file"' EXIT
# -mod=readonly: go.sum is committed, so a fresh clone builds without tidy and
# a drifted go.mod fails loudly instead of being rewritten.
# Vault's compiled packages go to a build cache of their own beside the
# binaries, shared by the versions (they have much in common): an empty
# Vault cache then really means a cold build, and the repository's own
# tests do not evict it from the user's Go cache, nor it theirs.
export GOCACHE="${XDG_CACHE_HOME:-$HOME/.cache}/aws-resilient/go-build"
cd "$root/$mod"
echo "vault.sh: Vault v${version} is not built yet: building it into $bin, once (15 to 30 minutes cold on 2 cores; VAULT_BIN=/path/to/vault skips it with a Vault you have)" >&2
echo "vault.sh: listing the packages to compile (the first time, this downloads Vault's modules)..." >&2
echo "listing the packages to compile" >"$progress_file"
total=$(go list -mod=readonly -deps github.com/hashicorp/vault | wc -l)
((total > 0)) || total=1
echo "vault.sh: compiling $total packages (progress every ${every}s)" >&2
go build -v -mod=readonly -o "$tmp" github.com/hashicorp/vault 2>&1 >/dev/null | progress "$total" "$start"
cd "$root"
chmod 0755 "$tmp"
if ! check "$tmp"; then
	echo "vault.sh: the built binary does not report Vault v${version}" >&2
	exit 1
fi
# Rename is atomic on one filesystem: a reader sees the old state or a complete binary.
mv -f "$tmp" "$bin"
trap - EXIT
rm -f "$progress_file"
echo "vault.sh: built in $(fmt_secs $(($(date +%s) - start)))" >&2
echo "$bin"
