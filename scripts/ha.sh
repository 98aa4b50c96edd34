#!/usr/bin/env bash
# ha.sh: the plugin in a 3-node Vault HA cluster with integrated Raft storage
# (`make ha`), on loopback, against the STS emulator, step by step the way an
# operator sets it up, then a failover:
#
#  1. three `vault server`s, each with its own raft storage, API and cluster
#     ports and plugin directory (performance_multiplier = 1 for quick
#     elections); node 1 is initialised and unsealed, nodes 2 and 3 join it
#     with `vault operator raft join` and are unsealed;
#  2. the plugin binary is copied into every node's plugin directory (the
#     catalog is replicated, binaries are not), registered by sha256 and
#     version, mounted, pointed at the emulator (credentials live 60s);
#  3. 100 roles are created and read once; every role is read through every
#     node (standbys forward to the active node);
#  4. after one refresh wave, the active node is killed with SIGKILL while
#     the next wave is due; one reader per surviving node polls throughout;
#  5. the killed node is restarted, unsealed, rejoins, and serves the same
#     credentials.
# It prints the figures: election gap, reader errors, the STS calls around
# the failover (from the emulator's call log, role by role, so they do not
# depend on how fast the script runs; a role called again soon after the
# kill is lost in flight only if the killed node's log never said it stored
# the credential), rejoin time. The acceptance test
# TestHAScript (acceptance/ha_script_test.go) runs it and checks those
# figures; TestHA (acceptance/ha_test.go) asserts the same scenario step by
# step. The script exits non-zero only on a clear failure.
#
# Usage: scripts/ha.sh [--keep]
#   --keep (or HA_KEEP=1)  leave the cluster up after the demo, until Ctrl-C
# Environment (all optional):
#   HA_PORT         first port (default 8300): node N listens on HA_PORT+2(N-1)
#                   for the API and the next port for cluster traffic
#   HA_ROLES        number of roles (default 100)
#   HA_LIFETIME     emulator credential lifetime in seconds (default 60)
#   PLUGIN_VERSION  version compiled into and registered for the plugin (default v0.1.0-dev)
#   VAULT_BIN       a Vault v1.19.0 binary to use instead of building one
#   HA_DIR          work directory (default: a new temporary directory, removed on exit)
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)

# A login shell may not have Go on PATH yet on a fresh machine.
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
	export PATH="$PATH:/usr/local/go/bin"
fi

keep=${HA_KEEP:-0}
for arg in "$@"; do
	case "$arg" in
	--keep) keep=1 ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "ha.sh: unknown argument $arg (try --help)" >&2
		exit 2
		;;
	esac
done

base_port=${HA_PORT:-8300}
roles=${HA_ROLES:-100}
lifetime=${HA_LIFETIME:-60}
version=${PLUGIN_VERSION:-v0.1.0-dev}
plugin_name=aws-resilient
plugin_bin="vault-plugin-secrets-aws-resilient"
nodes=(1 2 3)
# Refresh when a third of the lifetime is left; 2s retry blocks. With 60s
# credentials a role is refreshed every ~40s and has ~20s of margin: room
# for an election and the refreshes that fell due during it.
refresh_fraction=0.33
# The emulator's default root pair: AWS's published documentation example
# keys, not a secret. Passed to Vault, never printed.
sts_access_key=AKIAIOSFODNN7EXAMPLE
sts_secret_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY

say() { printf '\n==> %s\n' "$*" >&2; }
die() {
	printf 'ha.sh: %s\n' "$*" >&2
	exit 1
}
now() { echo "$EPOCHREALTIME"; }
# secs A B: B - A in seconds with one decimal.
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

api_port() { echo $((base_port + 2 * ($1 - 1))); }
addr() { echo "http://127.0.0.1:$(api_port "$1")"; }

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for n in "${nodes[@]}"; do
	for p in "$(api_port "$n")" "$(($(api_port "$n") + 1))"; do
		if port_busy "$p"; then
			die "port 127.0.0.1:$p is in use (the cluster uses HA_PORT=$base_port to $((base_port + 5))); stop what listens there or choose another, e.g. HA_PORT=18300 make ha"
		fi
	done
done

if [[ -n "${HA_DIR:-}" ]]; then
	work=$HA_DIR
	mkdir -p "$work"
	keep_work=1
else
	work=$(mktemp -d "${TMPDIR:-/tmp}/aws-resilient-ha.XXXXXX")
	keep_work=0
fi
umask 077

declare -A vpid # node -> vault pid (its own process group: plugins die with it)
emu_pid=
readers=()
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if ((${#readers[@]})); then kill "${readers[@]}" 2>/dev/null || true; fi
	for n in "${!vpid[@]}"; do
		kill -TERM -- "-${vpid[$n]}" 2>/dev/null || true
	done
	for n in "${!vpid[@]}"; do
		for _ in $(seq 1 100); do
			kill -0 "${vpid[$n]}" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL -- "-${vpid[$n]}" 2>/dev/null || true
		wait "${vpid[$n]}" 2>/dev/null || true
	done
	if [[ -n "$emu_pid" ]]; then
		kill "$emu_pid" 2>/dev/null || true
		wait "$emu_pid" 2>/dev/null || true
	fi
	if ((rc != 0)); then
		for log in "$work"/*.log; do
			[[ -f "$log" ]] || continue
			printf '\n--- last lines of %s ---\n' "$log" >&2
			tail -n 30 "$log" | grep -viE 'root token|unseal key' >&2 || true
		done
	fi
	((keep_work == 0)) && rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "Vault binary (built once into your cache directory; about 11 minutes the first time)"
vault=$("$root/scripts/vault.sh")
echo "$vault" >&2
unset VAULT_TOKEN VAULT_ADDR VAULT_NAMESPACE VAULT_FORMAT
v() { # v NODE vault-args...: the vault CLI against node NODE
	local n=$1
	shift
	VAULT_ADDR=$(addr "$n") VAULT_TOKEN=$(cat "$work/token" 2>/dev/null || true) "$vault" "$@"
}
# setup NODE vault-args...: a set-up step through node NODE, tried again
# (up to 20 times, a second apart) while Vault answers that it has no
# active node to serve it: on a loaded machine raft may hold an election
# no one asked for while the cluster is being set up. Any other failure
# ends the script with Vault's message. An enable whose first answer was
# lost finds its path in use: done.
setup() {
	local out try
	for try in $(seq 1 20); do
		if out=$(v "$@" 2>&1); then
			printf '%s\n' "$out"
			return 0
		fi
		case $out in
		*"path is already in use"*) return 0 ;;
		*"not active"* | *"active cluster node not found"* | *"no active"* | *"Vault is sealed"* | *"connection refused"*) ;;
		*) die "vault $1 $2: $out" ;;
		esac
		printf 'ha.sh: vault %s: no active node to answer (try %d): %s\n' "$1" "$try" "$out" >&2
		sleep 1
	done
	die "vault $1 $2: $out"
}
health() { curl -s -o /dev/null --max-time 2 -w '%{http_code}' "$(addr "$1")/v1/sys/health" || true; }
# get NODE PATH: GET /v1/PATH with the root token (from a header file, so it
# never shows in the process list); prints the body, which may hold secrets:
# callers keep it in a variable and extract non-secret fields only.
get() { curl -s --max-time 5 -H @"$work/token.hdr" "$(addr "$1")/v1/$2"; }
json_field() { sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p"; }
# Conditions for wait_for.
answers() { [[ $(health "$1") != 000 ]]; }
is_active() { [[ $(health "$1") == 200 ]]; }
is_standby() { [[ $(health "$1") == 429 ]]; }
unsealed() { [[ $(curl -s -o /dev/null -w '%{http_code}' -X PUT --data @"$work/unseal.json" "$(addr "$1")/v1/sys/unseal") == 200 ]]; }
voters_are() { [[ $(v 1 operator raft list-peers -format=json 2>/dev/null | grep -c '"voter": true') == "$1" ]]; }
healthy_via() { v "$1" operator raft autopilot state 2>/dev/null | grep -q '^Healthy: *true'; }
calls_at_least() { (($(ok_calls) >= $1)); }
wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds
	local limit=$1 what=$2
	shift 2
	local deadline=$((SECONDS + limit))
	until "$@"; do
		((SECONDS < deadline)) || die "timed out after ${limit}s waiting for $what"
		sleep 0.2
	done
}

say "building the plugin ($version) and the STS emulator"
go build -ldflags "-X main.version=$version" -o "$work/$plugin_bin" "./cmd/$plugin_bin"
go build -o "$work/sts-emulator" ./cmd/sts-emulator

say "starting the STS emulator (credentials live ${lifetime}s)"
"$work/sts-emulator" -listen 127.0.0.1:0 -max-lifetime "${lifetime}s" >"$work/sts-emulator.log" 2>&1 &
emu_pid=$!
sts_url=
for _ in $(seq 1 100); do
	sts_url=$(sed -n 's/^sts-emulator listening on \(http:[^ ]*\).*/\1/p' "$work/sts-emulator.log" | head -n 1)
	[[ -n "$sts_url" ]] && break
	kill -0 "$emu_pid" 2>/dev/null || die "the STS emulator exited"
	sleep 0.1
done
[[ -n "$sts_url" ]] || die "the STS emulator did not start within 10s"
echo "$sts_url" >&2
# ok_calls: successful STS calls so far (the stats JSON is one field a line).
ok_calls() { curl -s "$sts_url/_emulator/stats" | awk '/"by_outcome"/ { f = 1 } f && /"ok":/ { gsub(/[^0-9]/, "", $2); print $2; exit } END { if (!f) print 0 }'; }
# call_figures KILL STORED: the failover's STS calls, role by role, from
# the emulator's call log (indented JSON, one field a line): prints "due
# refreshed duplicates lost late total". A role is due when its last
# successful call before KILL (epoch seconds) is more than half a refresh
# interval older; refreshed counts the due roles called within three
# quarters of an interval after KILL (before the next wave). A duplicate is
# a call within half an interval of the same role's previous one; late is
# a call more than a lifetime after it (the role's credential had expired).
# lost counts the duplicates that the failover explains: made after KILL,
# repeating a call made before it whose credential the killed node never
# reported stored. STORED is that report, "role expiration" a line, from
# the killed node's "refresh succeeded" log lines (logged once raft
# committed the credential): a credential STS issued that never reached
# raft died with the node, and the new active node rightly fetches it
# again. Any other duplicate repeats a credential the cluster had: a
# refresh storm, or a second refresher.
call_figures() {
	curl -s "$sts_url/_emulator/calls" | awk -v kill="$1" -v stored="$2" -v life="$lifetime" -v frac="$refresh_fraction" '
		# epoch converts an RFC 3339 time to seconds since 1970 (mawk has no
		# mktime): days from the civil date, then the time of day and offset.
		function epoch(ts,   y, mo, d, rest, sec, tz, off, era, yoe, doy, doe) {
			y = substr(ts, 1, 4) + 0; mo = substr(ts, 6, 2) + 0; d = substr(ts, 9, 2) + 0
			rest = substr(ts, 18)
			match(rest, /^[0-9.]+/)
			sec = substr(rest, 1, RLENGTH) + 0
			tz = substr(rest, RLENGTH + 1)
			off = 0
			if (tz != "Z") off = (substr(tz, 1, 1) == "-" ? -1 : 1) * (substr(tz, 2, 2) * 3600 + substr(tz, 5, 2) * 60)
			if (mo <= 2) y--
			era = int(y / 400); yoe = y - era * 400
			doy = int((153 * ((mo + 9) % 12) + 2) / 5) + d - 1
			doe = yoe * 365 + int(yoe / 4) - int(yoe / 100) + doy
			return (era * 146097 + doe - 719468) * 86400 + substr(ts, 12, 2) * 3600 + substr(ts, 15, 2) * 60 + sec - off
		}
		function field(line) { sub(/^[^:]*: *"/, "", line); sub(/".*$/, "", line); return line }
		BEGIN {
			interval = life * (1 - frac); half = interval / 2
			# Compared as whole epoch seconds, so that the zone each side
			# wrote them in does not matter: the node logs the expiration of
			# its credential to the second (RFC 3339), cut, not rounded, from
			# what STS sent, which the call log of the emulator has to the
			# millisecond. (No apostrophe: this program is single-quoted.)
			while ((getline line < stored) > 0) {
				split(line, f, " ")
				kept[f[1] " " int(epoch(f[2]))] = 1
			}
		}
		# One call an object: its fields are read, then judged at its end.
		/^ *\{/ { t = 0; action = outcome = role = ""; expires = -1 }
		/"time":/ { t = epoch(field($0)) }
		/"action":/ { action = field($0) }
		/"outcome":/ { outcome = field($0) }
		/"role_arn":/ { role = field($0) }
		/"issued_expiration":/ { expires = int(epoch(field($0))) }
		/^ *\}/ {
			if (action != "AssumeRole" || outcome != "ok") next
			total++
			if (role in prev) {
				if (t - prev[role] < half) {
					dup++
					name = role; sub(/.*\//, "", name)
					if (prev[role] <= kill && t > kill && !((name " " prevExp[role]) in kept)) lost++
				}
				if (t - prev[role] > life) late++
			}
			prev[role] = t; prevExp[role] = expires
			if (t <= kill) before[role] = t
			else if (t <= kill + 0.75 * interval) after[role]++
		}
		END {
			for (r in before) if (kill - before[r] > half) { due++; if (after[r] > 0) refreshed++ }
			printf "%d %d %d %d %d %d\n", due, refreshed, dup, lost, late, total
		}'
}

# stored_report LOG: the credentials a node reported stored, "role
# expiration" a line, from its "refresh succeeded" log lines (hclog writes
# their fields in any order).
stored_report() {
	grep -h 'refresh succeeded' "$1" | awk '{
		role = expires = ""
		for (i = 1; i <= NF; i++) {
			if ($i ~ /^role=/) role = substr($i, 6)
			else if ($i ~ /^expiration=/) expires = substr($i, 12)
		}
		if (role != "" && expires != "") print role, expires
	}' || true
}

start_node() {
	local n=$1
	setsid "$vault" server -config="$work/node$n/vault.hcl" -log-level=info >>"$work/vault-node$n.log" 2>&1 &
	vpid[$n]=$!
}

say "starting three Vault servers with raft storage"
for n in "${nodes[@]}"; do
	p=$(api_port "$n")
	mkdir -p "$work/node$n/raft" "$work/node$n/plugins"
	cat >"$work/node$n/vault.hcl" <<HCL
# node $n of 3: its own raft data, ports and plugin directory
plugin_directory = "$work/node$n/plugins"
api_addr         = "http://127.0.0.1:$p"
cluster_addr     = "https://127.0.0.1:$((p + 1))"
disable_mlock    = true
ui               = false

listener "tcp" {
  address         = "127.0.0.1:$p"
  cluster_address = "127.0.0.1:$((p + 1))"
  tls_disable     = true # loopback demo; use TLS everywhere else
}

storage "raft" {
  path    = "$work/node$n/raft"
  node_id = "node$n"
  # Vault's default of 5 suits busy WAN links; 1 makes an election take
  # about a second instead of five.
  performance_multiplier = 1
}
HCL
	start_node "$n"
	echo "node$n: API $(addr "$n"), cluster https://127.0.0.1:$((p + 1)), config $work/node$n/vault.hcl" >&2
done
for n in "${nodes[@]}"; do
	wait_for 60 "node$n to answer" answers "$n"
done

say "initialising node1 (one key share: a demo), unsealing it"
v 1 operator init -key-shares=1 -key-threshold=1 -format=json >"$work/init.json"
awk '/"unseal_keys_b64"/ { getline; gsub(/[ ",]/, ""); print; exit }' "$work/init.json" >"$work/unseal.key"
sed -n 's/.*"root_token": "\([^"]*\)".*/\1/p' "$work/init.json" >"$work/token"
rm -f "$work/init.json"
[[ -s "$work/unseal.key" && -s "$work/token" ]] || die "could not read the unseal key and root token from vault operator init"
printf 'X-Vault-Token: %s\n' "$(cat "$work/token")" >"$work/token.hdr"
printf '{"key":"%s"}' "$(cat "$work/unseal.key")" >"$work/unseal.json"
wait_for 60 "node1 to unseal" unsealed 1
wait_for 60 "node1 to become active" is_active 1
# Autopilot makes a joined node a voter after it has been healthy for
# server_stabilization_time (10s by default); until then losing the leader
# loses quorum. 2s is plenty on loopback.
v 1 operator raft autopilot set-config -server-stabilization-time=2s >/dev/null

say "joining node2 and node3 to node1 (vault operator raft join), unsealing them"
for n in 2 3; do
	v "$n" operator raft join "$(addr 1)"
	# Until the join has reached the leader the key is not accepted.
	wait_for 60 "node$n to unseal" unsealed "$n"
done
wait_for 90 "three raft voters" voters_are 3
v 1 operator raft list-peers

say "installing the plugin on every node, registering it once (the catalog is replicated)"
sha=$(sha256sum "$work/$plugin_bin" | cut -d' ' -f1)
for n in "${nodes[@]}"; do
	cp "$work/$plugin_bin" "$work/node$n/plugins/$plugin_bin"
done
setup 1 plugin register -sha256="$sha" -version="$version" -command="$plugin_bin" secret "$plugin_name"
setup 1 secrets enable -path="$plugin_name" -plugin-version="$version" -allowed-response-headers=Retry-After "$plugin_name"
setup 1 write "$plugin_name/config/root" access_key="$sts_access_key" secret_key="$sts_secret_key" \
	region=us-east-1 sts_endpoint="$sts_url" >/dev/null
setup 1 write "$plugin_name/config/refresh" refresh_fraction="$refresh_fraction" retry_window=6s max_retries=3
setup 1 read "$plugin_name/config/refresh"

say "creating $roles roles, reading each once (round robin through the three nodes)"
role_name() { printf 'ha-%03d' "$1"; }
for i in $(seq 0 $((roles - 1))); do
	printf '{"credential_type":"assumed_role","role_arn":"arn:aws:iam::123456789012:role/%s"}' "$(role_name "$i")" |
		curl -s -f -o /dev/null -H @"$work/token.hdr" -X POST --data @- "$(addr 1)/v1/$plugin_name/roles/$(role_name "$i")" ||
		die "creating role $(role_name "$i") failed"
done
fill_start=$(now)
export work plugin_name base_port
# shellcheck disable=SC2016 # expanded by the inner bash, from the exports
seq 0 $((roles - 1)) | xargs -P 10 -I{} bash -c '
	i={}; n=$((i % 3 + 1)); role=$(printf "ha-%03d" "$i")
	for try in $(seq 1 20); do
		code=$(curl -s -o /dev/null -w "%{http_code}" --max-time 30 -H @"$work/token.hdr" "http://127.0.0.1:$((base_port + 2 * (n - 1)))/v1/$plugin_name/creds/$role")
		[[ $code == 200 ]] && exit 0
		# 500/503: no active node to answer (an election on a loaded
		# machine, before any fault of the script): asked again.
		[[ $code == 500 || $code == 503 ]] || break
		echo "reading $role through node$n: HTTP $code (try $try; no active node to answer)" >&2
		sleep 1
	done
	echo "reading $role through node$n: HTTP $code" >&2; exit 255
' || die "a first read failed"
fill_end=$(now)
fill_calls=$(ok_calls)
echo "filled $roles roles in $(secs "$fill_start" "$fill_end")s with $fill_calls STS calls" >&2

say "reading every role through every node (standbys forward; no STS call)"
for n in "${nodes[@]}"; do
	fails=0
	for i in $(seq 0 $((roles - 1))); do
		code=$(curl -s -o /dev/null -w '%{http_code}' -H @"$work/token.hdr" "$(addr "$n")/v1/$plugin_name/creds/$(role_name "$i")")
		[[ $code == 200 ]] || fails=$((fails + 1))
	done
	echo "node$n ($( (($(health "$n") == 200)) && echo active || echo standby)): $((roles - fails))/$roles reads ok" >&2
	((fails == 0)) || die "reads through node$n failed"
done
# A slow machine may reach the first refresh wave meanwhile; a call a
# standby made for itself would show in the duplicates figure at the end.
echo "STS calls after reading through all nodes: $(ok_calls) (was $fill_calls; more only if refreshes fell due meanwhile)" >&2
echo "vault read through node2 (a standby):" >&2
v 2 read -field=expiration "$plugin_name/creds/$(role_name 0)" >&2
echo >&2

say "waiting for one refresh wave (~$(awk -v l="$lifetime" -v f="$refresh_fraction" 'BEGIN { printf "%d", l * (1 - f) }')s after the fill), then for 30% of the next"
wait_for $((2 * lifetime + 30)) "the first refresh wave" calls_at_least $((2 * roles))
active=
for n in "${nodes[@]}"; do
	[[ $(health "$n") == 200 ]] && active=$n
done
[[ -n "$active" ]] || die "no active node"
survivors=()
for n in "${nodes[@]}"; do
	[[ $n == "$active" ]] || survivors+=("$n")
done

# One reader per surviving node: a read every 0.1s through that node, cycling
# through the roles; one line per read: time, HTTP code (a standby that
# cannot forward answers 307; curl does not follow it), expired (1/0).
reader() {
	local n=$1 k=0 body code exp t
	while :; do
		t=$(now)
		body=$(curl -s --max-time 5 -w '\n%{http_code}' -H @"$work/token.hdr" "$(addr "$n")/v1/$plugin_name/creds/$(role_name $((k % roles)))" || true)
		code=${body##*$'\n'}
		exp=0
		if [[ $code == 200 ]]; then
			# RFC 3339 UTC timestamps of one format compare as strings.
			[[ $(printf '%s' "$body" | json_field expiration) > $(date -u +%Y-%m-%dT%H:%M:%SZ) ]] || exp=1
		fi
		echo "$t $code $exp"
		k=$((k + 1))
		sleep 0.1
	done
}
for n in "${survivors[@]}"; do
	reader "$n" >"$work/reader-node$n.txt" &
	readers+=($!)
done
wait_for $((lifetime + 30)) "30% of the second refresh wave" calls_at_least $((2 * roles + 3 * roles / 10))

say "SIGKILL node$active (the active node) while refreshes are due"
kill_at=$(now)
kill -KILL -- "-${vpid[$active]}"
wait "${vpid[$active]}" 2>/dev/null || true
unset "vpid[$active]"
calls_at_kill=$(ok_calls)
# What the killed node had stored, by its own log up to its death (the
# same log grows again once it is restarted).
stored_report "$work/vault-node$active.log" >"$work/stored-at-kill.txt"
stored_at_kill=$(wc -l <"$work/stored-at-kill.txt")
new_active=
while [[ -z "$new_active" ]]; do
	for n in "${survivors[@]}"; do
		[[ $(health "$n") == 200 ]] && new_active=$n
	done
	awk -v a="$kill_at" -v b="$(now)" 'BEGIN { exit !(b - a > 60) }' && die "no new active node within 60s"
	[[ -n "$new_active" ]] || sleep 0.05
done
elected_at=$(now)
election_gap=$(secs "$kill_at" "$elected_at")
echo "node$new_active is active ${election_gap}s after the kill" >&2
grep -h 'refresher started' "$work/vault-node$new_active.log" | tail -n 1 | sed 's/^/  /' >&2 || true

say "waiting for the new active node to refresh what fell due"
wait_for "$lifetime" "the second refresh wave to complete" calls_at_least $((3 * roles))
echo "second wave complete $(secs "$kill_at" "$(now)")s after the kill: $(($(ok_calls) - calls_at_kill)) STS calls since" >&2

say "restarting node$active: it rejoins from its raft data (the readers keep reading)"
restart_at=$(now)
start_node "$active"
wait_for 60 "node$active to answer" answers "$active"
wait_for 60 "node$active to unseal" unsealed "$active"
wait_for 60 "node$active to serve as a standby" is_standby "$active"
wait_for 60 "a healthy cluster" healthy_via "$new_active"
rejoin=$(secs "$restart_at" "$(now)")
v "$new_active" operator raft list-peers
same=0
for i in $(seq 0 $((roles - 1))); do
	# Twice at most: a refresh can land between the two reads.
	for _ in 1 2; do
		a=$(get "$active" "$plugin_name/creds/$(role_name "$i")" | json_field access_key)
		b=$(get "$new_active" "$plugin_name/creds/$(role_name "$i")" | json_field access_key)
		if [[ -n "$a" && "$a" == "$b" ]]; then
			same=$((same + 1))
			break
		fi
	done
done
echo "node$active back in ${rejoin}s; $same/$roles roles serve the same credential through it as through node$new_active" >&2

say "letting the readers run to the end of the minute around the failover"
while awk -v a="$kill_at" -v b="$(now)" 'BEGIN { exit !(b - a < 30) }'; do sleep 0.5; done
kill "${readers[@]}" 2>/dev/null || true
wait "${readers[@]}" 2>/dev/null || true
readers=()

read -r due refreshed dup lost late total < <(call_figures "$kill_at" "$work/stored-at-kill.txt")
((total >= roles)) || die "the emulator's call log ($sts_url/_emulator/calls) holds $total successful calls for $roles roles"
lost_note=
if ((dup > 0)); then
	lost_note=" ($lost repeating a credential node$active fetched before the kill and never stored: lost with it)"
fi
reads=0 errors=0 expired=0 first_err='' last_err=''
for f in "$work"/reader-node*.txt; do
	while read -r t code exp; do
		if [[ $code == 200 ]]; then
			reads=$((reads + 1))
			expired=$((expired + exp))
		else
			errors=$((errors + 1))
			if [[ -z "$first_err" ]] || awk -v a="$t" -v b="$first_err" 'BEGIN { exit !(a < b) }'; then first_err=$t; fi
			if [[ -z "$last_err" ]] || awk -v a="$t" -v b="$last_err" 'BEGIN { exit !(a > b) }'; then last_err=$t; fi
		fi
	done <"$f"
done
err_window="none"
if ((errors > 0)); then
	err_window="requests sent from kill$(secs "$kill_at" "$first_err" | sed 's/^[0-9]/+&/')s to kill+$(secs "$kill_at" "$last_err")s"
fi

cat <<EOF

==================== HA figures ====================
cluster                  3 nodes of Vault v$("$vault" version | sed -n 's/^Vault v\([0-9.]*\).*/\1/p'), integrated raft, performance_multiplier 1
roles                    $roles, credentials live ${lifetime}s, refreshed with ${refresh_fraction} of the lifetime left (~every $(awk -v l="$lifetime" -v f="$refresh_fraction" 'BEGIN { printf "%d", l * (1 - f) }')s)
one refresher            $total STS calls for $roles roles, $dup of them within $(awk -v l="$lifetime" -v f="$refresh_fraction" 'BEGIN { printf "%d", l * (1 - f) / 2 }')s of the same role's previous call$lost_note
election gap             ${election_gap}s (SIGKILL of node$active to node$new_active active)
reader errors            $errors of $((reads + errors)) reads through the survivors, $err_window
expired served           $expired
STS calls, failover      $due roles due at the kill, $refreshed of them refreshed by node$new_active; $late calls came after the role's credential expired
rejoin                   ${rejoin}s (restart, unseal, healthy raft voter); $same/$roles same credentials
EOF
echo "HA-FIGURES election_gap=${election_gap}s reader_errors=$errors reads=$((reads + errors)) expired_served=$expired roles_due=$due roles_due_refreshed=$refreshed duplicate_calls=$dup lost_in_flight=$lost stored_at_kill=$stored_at_kill late_calls=$late sts_calls=$total rejoin=${rejoin}s"

((expired == 0)) || die "readers were served $expired expired credentials"
((refreshed == due)) || die "only $refreshed of the $due roles due at the kill were refreshed after it"
((late == 0)) || die "$late refreshes came after the role's credential had expired"
((dup == lost)) || die "$((dup - lost)) STS calls repeated, within half a refresh interval, a credential the cluster had stored: a refresh storm or a second refresher"
((same == roles)) || die "only $same of $roles roles serve the same credential through the restarted node"

if ((keep)); then
	cat <<EOF

The cluster stays up (Ctrl-C stops it). In another shell:
  export VAULT_ADDR=$(addr "$new_active")
  export VAULT_TOKEN=\$(cat $work/token)   # root token of this throw-away cluster
  export PATH="$(dirname "$vault"):\$PATH"
  vault operator raft list-peers
  vault read $plugin_name/creds/$(role_name 0)
  VAULT_ADDR=$(addr "$active") vault read $plugin_name/status/$(role_name 0)   # through a standby
  curl -s $sts_url/_emulator/stats
Logs: $work/vault-node{1,2,3}.log
EOF
	wait
fi
