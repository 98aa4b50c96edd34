#!/usr/bin/env bash
# soak.sh: the chaos soak (`make soak DURATION=1h SEED=7`).
#
# A 3-node Vault cluster with integrated Raft storage and the plugin, each
# node in its own network namespace (a bridge, veth pairs, nftables; the
# soak creates and removes them, and installs Debian's nftables if nft is
# missing), each node's STS traffic through a link proxy of its own, the STS
# emulator with a second listener (the mount's fallback endpoint), and a
# seeded schedule of faults (STS throttling, 5xx, resets, hangs, malformed
# and expired credentials, STS down, the primary STS region down with the
# fallback up; SIGKILL of the plugin, SIGKILL of the active node with its
# restart and rejoin, a step-down, a full cluster restart; a node cut off
# from the others, the active node's link to STS slowed, lossy, reset
# mid-answer, throttled or cut; AWS's clock stepping and back), operator
# actions (role_arn changes, role deletes and re-creates, config/refresh
# changes, config/rotate-root) and clients (readers of role-scoped and
# entity-scoped roles through the HTTP API with their own tokens, a Vault
# Agent rendering a shared-credentials file, the awscli calling STS with it). Every operation is recorded in
# OUT/history.jsonl and every STS and IAM call in OUT/calls.jsonl (Vault
# Agent's whole log in OUT/agent.log); then
# cmd/soak-check proves the guarantees offline and prints the figures
# (OUT/report.txt). Exits non-zero when a rule is broken.
#
#   DURATION  how long the schedule runs (default 2m)
#   SEED      the schedule's seed (default 1)
#   OUT       output directory (default soak-out/<seed>-<time>)
#   BROKEN    run a deliberately broken plugin build or soak instead, to show
#             the checker catches it:
#               serve-expired         the cache serves a credential past its expiry
#               cycle-per-read        every read finds the cache stale and
#                                     starts a new cycle
#               forget-storage        the plugin never reads the credentials it
#                                     stored: every start (a restart) is cold
#               no-fallback           the mount has no fallback STS endpoint,
#                                     so a region down leaves nothing to refresh through
#               aws-ignores-failures  the AWS client records every call as a success
#               deposed-keeps-refreshing  a node that lost the active role
#                                     carries on: its refresher ignores
#                                     storage's "not the leader" (also on
#                                     the write before each STS call), and Clean
#                                     (Vault's step-down) never gets done
#               keeps-late-answers    the per-call timeout no longer bounds
#                                     an STS call: an answer that came after
#                                     its attempt gave up is kept and served
#               deposed-refreshes-after-cut  a cut-off active node ignores
#                                     storage's "not the leader" and Clean
#                                     lets it refresh on for 20 s
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${DURATION:-2m}
seed=${SEED:-1}
out=${OUT:-soak-out/${seed}-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
out=$(cd "$out" && pwd)

# Everything the soak makes is removed by the test itself (its cleanups);
# every object is also noted in a state file as it is made
# (internal/vaulttest/state.go: process groups with their leader's start
# time, namespaces, links), so that a run that ends any other way (SIGINT,
# SIGTERM, a panic off the test's goroutine, the test's -timeout) leaves
# nothing behind: the exit trap stops the test, kills the process groups
# still running (the nodes, in their namespaces, and the STS emulator and
# Vault Agent, in the host's), deletes the namespaces (their nft tables go
# with them) and links, and removes the test's temporary directory.
export VAULTTEST_NET_STATE="$out/net-objects"
# The test's temporary directories (t.TempDir: the nodes' data, the
# agent's, the emulator's) live under one directory the trap removes.
soak_tmp=$(mktemp -d /tmp/soak-tmp.XXXXXX)
test_pid=""
# starttime PID: the process's start time in clock ticks since boot (field
# 22 of /proc/PID/stat), "" when it is gone.
starttime() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
	stat=${stat##*) }
	# shellcheck disable=SC2086 # split into fields on purpose
	set -- $stat
	echo "${20}"
}
# shellcheck disable=SC2317 # invoked through the trap
cleanup() {
	trap - EXIT INT TERM
	if [[ -n "$test_pid" ]] && kill -0 "$test_pid" 2>/dev/null; then
		# go test and the test binary are one process group (setsid below).
		kill -KILL -- "-$test_pid" 2>/dev/null || true
		wait "$test_pid" 2>/dev/null || true
		echo "soak: stopped the test; removing what it made" >&2
	fi
	if [[ -f "$VAULTTEST_NET_STATE" ]]; then
		local kind a b
		# What the test's own cleanups removed ("gone netns NAME") is not
		# the soak's any more.
		local -A gone=()
		while read -r kind a b; do
			[[ "$kind" == gone ]] && gone["$a $b"]=1
		done <"$VAULTTEST_NET_STATE"
		while read -r kind a b; do
			# A pid the kernel gave to another process since has another
			# start time: only the soak's own groups are killed.
			if [[ "$kind" == pgrp && -n "$b" && "$(starttime "$a")" == "$b" ]]; then
				kill -KILL -- "-$a" 2>/dev/null || true
			fi
		done <"$VAULTTEST_NET_STATE"
		while read -r kind a b; do
			if [[ "$kind" == netns && -z "${gone["netns $a"]:-}" && -e "/run/netns/$a" ]]; then
				ip netns pids "$a" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
				ip netns del "$a" 2>/dev/null || true
			fi
		done <"$VAULTTEST_NET_STATE"
		while read -r kind a b; do
			if [[ "$kind" == link && -z "${gone["link $a"]:-}" ]] && ip link show "$a" >/dev/null 2>&1; then
				ip link del "$a" 2>/dev/null || true
			fi
		done <"$VAULTTEST_NET_STATE"
	fi
	rm -rf "$soak_tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# broken_plugin FILE SED: build the plugin with FILE patched by the sed
# expression SED through a build overlay; the working tree is not touched.
broken_plugin() {
	local tmp
	tmp=$(mktemp -d)
	sed "$2" "$1" >"$tmp/$1"
	if cmp -s "$1" "$tmp/$1"; then
		echo "soak.sh: the BROKEN=$BROKEN patch no longer applies to $1; update scripts/soak.sh" >&2
		exit 2
	fi
	printf '{"Replace":{"%s":"%s"}}' "$PWD/$1" "$tmp/$1" >"$tmp/overlay.json"
	go build -overlay "$tmp/overlay.json" -ldflags "-X main.version=v0.1.0-dev" -o "$tmp/plugin" ./cmd/vault-plugin-secrets-aws-resilient
	export PLUGIN_BIN="$tmp/plugin"
	echo "soak: BROKEN=$BROKEN plugin build" >&2
}
# broken_patch NAME: the file and the sed expression of BROKEN=NAME's
# plugin build, tab-separated; nothing for a mode that breaks the soak's
# own side. Each must still change its file and build: `scripts/soak.sh
# --check-broken` checks them all, and the unit tests run it
# (internal/soak's TestBrokenBuildsStillApply).
valid_at='return c.remaining(now) >= minServeValidity'
broken_patch() {
	case "$1" in
	serve-expired) printf '%s\t%s\n' path_creds.go "s/${valid_at}/return c.remaining(now) >= -24*time.Hour \/\/ BROKEN/" ;;
	cycle-per-read) printf '%s\t%s\n' path_creds.go "s/${valid_at}/return false \&\& ${valid_at#return } \/\/ BROKEN/" ;;
	forget-storage) printf '%s\t%s\n' storage.go 's/^\treturn readNew\[cacheEntry\](ctx, .*$/\treturn nil, nil \/\/ BROKEN/' ;;
	# keeps-late-answers: the per-call timeout no longer bounds the call, so
	# an answer that arrives after the attempt should have given up (a slow
	# link) is committed and served: late_answer_never_served.
	keeps-late-answers) printf '%s\t%s\n' refresher.go 's/^\t\tcallCtx, cancel := context.WithTimeout(ctx, d)$/\t\tcallCtx, cancel := context.WithTimeout(ctx, d+time.Minute) \/\/ BROKEN: the per-call timeout no longer bounds the call/' ;;
	# deposed-refreshes-after-cut: storage's "not the leader" is ignored,
	# Clean lets the refresher run on for 20 s, and the storage probe before
	# each call (where the tree has one, lifecycle.canStore) always passes,
	# so a cut-off active node keeps calling STS for about 20 s after the
	# cut: deposed_node_silent.
	deposed-refreshes-after-cut) printf '%s\t%s\n' lifecycle.go 's/^\t"sync"$/&\n\t"time"/;s/^func (l \*lifecycle) canStore(ctx context.Context, probe func(context.Context) error) error {$/&\n\treturn nil \/\/ BROKEN: no probe before the call/;s/^func (l \*lifecycle) end(why string) bool {$/&\n\tif why == "deposed" {\n\t\treturn false \/\/ BROKEN: storage'"'"'s "not the leader" is ignored\n\t}\n\tif why == "clean" {\n\t\ttime.Sleep(20 * time.Second) \/\/ BROKEN: the refresher runs on for 20 s\n\t}/' ;;
	deposed-keeps-refreshing) printf '%s\t%s\n' lifecycle.go 's/^func (l \*lifecycle) end(why string) bool {$/&\n\tif why == "clean" {\n\t\tselect {} \/\/ BROKEN: Clean never gets done\n\t}\n\treturn false \/\/ BROKEN: storage'"'"'s "not the leader" is ignored/;s/^\t\t\tp.err = probe(l.ctx)$/&\n\t\t\tp.err = nil \/\/ BROKEN: a refused write before an STS call is ignored/' ;;
	esac
}
if [[ "${1:-}" == --check-broken ]]; then
	for name in serve-expired cycle-per-read forget-storage deposed-keeps-refreshing keeps-late-answers deposed-refreshes-after-cut; do
		IFS=$'\t' read -r file expr < <(broken_patch "$name")
		BROKEN=$name broken_plugin "$file" "$expr"
		rm -rf "$(dirname "$PLUGIN_BIN")"
	done
	exit 0
fi
case "${BROKEN:-}" in
"") ;;
serve-expired | cycle-per-read | forget-storage | deposed-keeps-refreshing | keeps-late-answers | deposed-refreshes-after-cut)
	IFS=$'\t' read -r file expr < <(broken_patch "$BROKEN")
	broken_plugin "$file" "$expr"
	;;
no-fallback | aws-ignores-failures)
	# The soak's own side (internal/soak's driver) breaks, not the plugin.
	export SOAK_BROKEN="$BROKEN"
	echo "soak: BROKEN=$BROKEN" >&2
	;;
*)
	echo "soak.sh: BROKEN must be serve-expired, cycle-per-read, forget-storage, deposed-keeps-refreshing, keeps-late-answers, deposed-refreshes-after-cut, no-fallback or aws-ignores-failures" >&2
	exit 2
	;;
esac
if ! command -v nft >/dev/null; then
	echo "soak: no nft on PATH: installing Debian's nftables" >&2
	if [[ $(id -u) -ne 0 ]]; then
		echo "soak.sh: the soak's network namespaces need root" >&2
		exit 2
	fi
	apt-get update >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nftables >&2
fi
VAULT_BIN=$(./scripts/vault.sh)
export VAULT_BIN VAULT_ACC=1 SOAK=1 SOAK_DURATION="$duration" SOAK_SEED="$seed" SOAK_OUT="$out"
echo "soak: ${duration}, seed ${seed}, output in ${out}" >&2
# The run's own timeout: the schedule plus set-up and a last fault's end.
secs=$(go run ./cmd/soak-check -parse-duration "$duration")
status=0
# In the background, in a process group of its own, so that a signal to
# this script is handled at once (bash runs a trap only once the
# foreground command ends) and the trap stops go test and its test binary
# together.
TMPDIR="$soak_tmp" setsid go test -count=1 -v -run '^TestSoak$' -timeout "$((secs + 900))s" ./internal/soak/ >"$out/test.log" 2>&1 &
test_pid=$!
wait "$test_pid" || status=$?
test_pid=""
if [[ ! -s "$out/calls.jsonl" ]]; then
	tail -50 "$out/test.log" >&2
	exit 1
fi
go run ./cmd/soak-check -history "$out/history.jsonl" -calls "$out/calls.jsonl" -links "$out/links.jsonl" -svg "$out/timeline.svg" | tee "$out/report.txt" || status=$?
exit $status
