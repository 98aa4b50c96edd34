#!/usr/bin/env bash
# soak.sh: the chaos soak (`make soak DURATION=1h SEED=7`).
#
# A 3-node Vault cluster with integrated Raft storage and the plugin, the STS
# emulator, and a seeded schedule of overlapping faults (STS throttling,
# 5xx, resets, hangs, malformed and expired credentials, STS down; SIGKILL
# of the plugin, SIGKILL of the active node with its restart and rejoin),
# operator actions (role_arn changes, role deletes and re-creates,
# config/refresh changes, config/rotate-root) and clients (readers of
# role-scoped and entity-scoped roles through the HTTP API with their own
# tokens, a Vault Agent rendering a file). Every operation is recorded in
# OUT/history.jsonl and every STS and IAM call in OUT/calls.jsonl; then
# cmd/soak-check proves the guarantees offline and prints the figures
# (OUT/report.txt). Exits non-zero when a rule is broken.
#
#   DURATION  how long the schedule runs (default 2m)
#   SEED      the schedule's seed (default 1)
#   OUT       output directory (default soak-out/<seed>-<time>)
#   BROKEN    run a deliberately broken plugin build instead, to show the
#             checker catches it: serve-expired (the cache serves a
#             credential past its expiry) or cycle-per-read (every read
#             finds the cache stale and starts a new cycle)
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${DURATION:-2m}
seed=${SEED:-1}
out=${OUT:-soak-out/${seed}-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [[ -n "${BROKEN:-}" ]]; then
	# The broken build: path_creds.go's validity rule patched through a
	# build overlay; the working tree is not touched.
	tmp=$(mktemp -d)
	case "$BROKEN" in
	serve-expired) rule='return c != nil' ;;
	cycle-per-read) rule='return false' ;;
	*) echo "soak.sh: BROKEN must be serve-expired or cycle-per-read" >&2; exit 2 ;;
	esac
	sed "s/return c != nil \&\& c.Expiration.Sub(now) >= minServeValidity/${rule}/" path_creds.go >"$tmp/path_creds.go"
	if cmp -s path_creds.go "$tmp/path_creds.go"; then
		echo "soak.sh: the BROKEN patch no longer applies to path_creds.go (validAt changed); update scripts/soak.sh" >&2
		exit 2
	fi
	printf '{"Replace":{"%s":"%s"}}' "$PWD/path_creds.go" "$tmp/path_creds.go" >"$tmp/overlay.json"
	go build -overlay "$tmp/overlay.json" -ldflags "-X main.version=v0.1.0-dev" -o "$tmp/plugin" ./cmd/vault-plugin-secrets-aws-resilient
	export PLUGIN_BIN="$tmp/plugin"
	echo "soak: BROKEN=$BROKEN plugin build" >&2
fi
VAULT_BIN=$(./scripts/vault.sh)
export VAULT_BIN VAULT_ACC=1 SOAK=1 SOAK_DURATION="$duration" SOAK_SEED="$seed" SOAK_OUT="$out"
echo "soak: ${duration}, seed ${seed}, output in ${out}" >&2
# The run's own timeout: the schedule plus set-up and a last fault's end.
secs=$(go run ./cmd/soak-check -parse-duration "$duration")
status=0
go test -count=1 -v -run '^TestSoak$' -timeout "$((secs + 900))s" ./internal/soak/ >"$out/test.log" 2>&1 || status=$?
if [[ ! -s "$out/calls.jsonl" ]]; then
	tail -50 "$out/test.log" >&2
	exit 1
fi
go run ./cmd/soak-check -history "$out/history.jsonl" -calls "$out/calls.jsonl" -svg "$out/timeline.svg" | tee "$out/report.txt" || status=$?
exit $status
