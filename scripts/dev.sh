#!/usr/bin/env bash
# dev.sh: the main job in one command (`make dev`).
#
# Builds the plugin and the STS emulator, starts the emulator and a Vault dev
# server on loopback, registers the plugin by sha256 and version, mounts it at
# aws-resilient/, points config/root at the emulator, creates the role "demo",
# prints `vault read aws-resilient/creds/demo` and what to try next, then stays
# up until Ctrl-C and stops everything it started.
#
# Usage: scripts/dev.sh [--once]        (make dev runs it without arguments)
#   --once (or DEV_ONCE=1)  exit after the demo read: `./scripts/dev.sh --once`, or
#                           `DEV_ONCE=1 make dev` (make takes no --once)
# Environment (all optional; each is checked before anything starts):
#   DEV_VAULT_PORT   Vault API port, 1 to 65534 (default 8200; the dev cluster listener takes the next port)
#   DEV_STS_PORT     STS emulator port, 1 to 65535 (default 8599)
#   DEV_STS_TRUST_FILE  a JSON file of roles in any account and their trust policies, given
#                    to the emulator as -trust-file (sts-emulator -h: "Accounts and trust")
#   DEV_ONCE         1 for --once, 0 (the default) to stay up until Ctrl-C
#   PLUGIN_VERSION   version compiled into and registered for the plugin, a v-prefixed
#                    semantic version (default v0.1.0-dev)
#   VAULT_BIN        a Vault v1.19.0 binary to use instead of building one
#   DEV_DIR          work directory (default /tmp/aws-resilient-dev-<DEV_VAULT_PORT>, made
#                    afresh and removed on exit; a DEV_DIR you give is kept): the Prometheus
#                    token and config, logs. make dev prints it among the lines to paste
#                    (VAULT_ADDR, VAULT_TOKEN, STS_ADDR, DEV_DIR, PATH); a make dev started
#                    again from that shell then keeps the directory, as a DEV_DIR you give
set -euo pipefail

caller_dir=$(pwd)
cd "$(dirname "$0")/.."
root=$(pwd)

# bad_option: an option that cannot work, said before anything starts (a
# bad port used to end in bash's "unbound variable").
bad_option() {
	printf 'dev.sh: %s (./scripts/dev.sh --help lists the options)\n' "$*" >&2
	exit 2
}
once=${DEV_ONCE:-0}
[[ "$once" == 0 || "$once" == 1 ]] || bad_option "DEV_ONCE must be 1 (exit after the demo read) or 0; got '$once'"
for arg in "$@"; do
	case "$arg" in
	--once) once=1 ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "dev.sh: unknown argument $arg (try --help)" >&2
		exit 2
		;;
	esac
done

vault_port=${DEV_VAULT_PORT:-8200}
sts_port=${DEV_STS_PORT:-8599}
version=${PLUGIN_VERSION:-v0.1.0-dev}
# check_port NAME VALUE MAX: a decimal port number, 1 to MAX.
check_port() {
	if [[ ! "$2" =~ ^[1-9][0-9]{0,4}$ ]] || (($2 > $3)); then
		bad_option "$1 must be a port number from 1 to $3; got '$2'"
	fi
}
check_port DEV_VAULT_PORT "$vault_port" 65534 # Vault's cluster listener takes the next port
check_port DEV_STS_PORT "$sts_port" 65535
if ((sts_port == vault_port || sts_port == vault_port + 1)); then
	bad_option "DEV_STS_PORT=$sts_port collides with Vault's ports (DEV_VAULT_PORT=$vault_port and $((vault_port + 1))): choose another"
fi
if [[ ! "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
	bad_option "PLUGIN_VERSION must be a v-prefixed semantic version such as v0.1.0-dev (Vault registers the plugin under it); got '$version'"
fi
if [[ -n "${VAULT_BIN:-}" && ! (-f "$VAULT_BIN" && -x "$VAULT_BIN") ]]; then
	bad_option "VAULT_BIN=$VAULT_BIN is not an executable file: point it at a Vault v1.19.0 binary, or unset it and one is built"
fi
if [[ -n "${DEV_DIR:-}" ]]; then
	# Relative to where dev.sh was started, not to the repository.
	[[ "$DEV_DIR" == /* ]] || DEV_DIR="$caller_dir/$DEV_DIR"
	if [[ -e "$DEV_DIR" && ! -d "$DEV_DIR" ]]; then
		bad_option "DEV_DIR=$DEV_DIR exists and is not a directory: give a directory (it is created if missing)"
	fi
fi
if [[ -n "${DEV_STS_TRUST_FILE:-}" ]]; then
	[[ "$DEV_STS_TRUST_FILE" == /* ]] || DEV_STS_TRUST_FILE="$caller_dir/$DEV_STS_TRUST_FILE"
	[[ -f "$DEV_STS_TRUST_FILE" && -r "$DEV_STS_TRUST_FILE" ]] ||
		bad_option "DEV_STS_TRUST_FILE=$DEV_STS_TRUST_FILE is not a readable file: give the emulator's -trust-file (a JSON list of roles)"
fi
# A mistyped option would be ignored without a word.
for var in $(compgen -e DEV_); do
	case "$var" in
	DEV_VAULT_PORT | DEV_STS_PORT | DEV_STS_TRUST_FILE | DEV_ONCE | DEV_DIR) ;;
	*) printf 'dev.sh: warning: %s is not an option and is ignored (the options: DEV_VAULT_PORT, DEV_STS_PORT, DEV_STS_TRUST_FILE, DEV_ONCE, DEV_DIR, PLUGIN_VERSION, VAULT_BIN)\n' "$var" >&2 ;;
	esac
done
plugin_name="aws-resilient"
plugin_bin="vault-plugin-secrets-aws-resilient"
# A dev server, on loopback, torn down on exit: a fixed root token is harmless
# here and lets the hint below be copied as is.
dev_token=root
# The emulator's default root pair: AWS's published documentation example
# keys. They are passed to Vault but never printed.
sts_access_key=AKIAIOSFODNN7EXAMPLE
sts_secret_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY

say() { printf '\n==> %s\n' "$*" >&2; }
die() {
	printf 'dev.sh: %s\n' "$*" >&2
	exit 1
}

port_busy() {
	# Connecting succeeds only if something listens there.
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}
for p in "$vault_port" "$((vault_port + 1))" "$sts_port"; do
	if port_busy "$p"; then
		die "port 127.0.0.1:$p is already in use (Vault uses DEV_VAULT_PORT=$vault_port and $((vault_port + 1)), the emulator DEV_STS_PORT=$sts_port); stop what listens there or choose other ports, e.g. DEV_VAULT_PORT=18200 DEV_STS_PORT=18599 make dev"
	fi
done

if [[ -n "${DEV_DIR:-}" ]]; then
	work=$DEV_DIR
	mkdir -p "$work"
	keep_work=1
else
	# A fixed path, so that the docs can name the files in it; the ports
	# checked above are free, so no other dev server of this port uses it.
	work=/tmp/aws-resilient-dev-$vault_port
	rm -rf "$work"
	(umask 077 && mkdir -p "$work")
	keep_work=0
fi
mkdir -p "$work/plugins"

pids=()
# shellcheck disable=SC2317 # invoked through the EXIT trap
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if ((${#pids[@]})); then
		say "stopping (Vault, then the emulator)"
		# Vault first: it stops its plugin process itself on SIGTERM.
		for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
			kill -TERM "${pids[i]}" 2>/dev/null || true
			for _ in $(seq 1 100); do
				kill -0 "${pids[i]}" 2>/dev/null || break
				sleep 0.1
			done
			kill -KILL "${pids[i]}" 2>/dev/null || true
			wait "${pids[i]}" 2>/dev/null || true
		done
	fi
	# Ctrl-C (130) and SIGTERM (143) are the normal way out: no log dump then.
	if ((rc != 0 && rc != 130 && rc != 143)); then
		for log in "$work"/*.log; do
			[[ -f "$log" ]] || continue
			printf '\n--- last lines of %s ---\n' "$log" >&2
			# The dev banner prints the root token and unseal key; leave them out.
			tail -n 40 "$log" | grep -viE 'root token|unseal key' >&2 || true
		done
	fi
	if ((keep_work == 0)); then
		rm -rf "$work"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ -n "${VAULT_BIN:-}" ]]; then
	say "Vault binary: VAULT_BIN=$VAULT_BIN (its version is checked)"
else
	say "Vault binary (built once into your cache directory: 15 to 30 minutes the first time, with its progress below; VAULT_BIN=/path/to/vault make dev skips the build with a Vault you have)"
fi
vault=$("$root/scripts/vault.sh")
echo "$vault" >&2

say "building the plugin ($version) and the STS emulator"
go build -ldflags "-X main.version=$version" -o "$work/plugins/$plugin_bin" "./cmd/$plugin_bin"
go build -o "$work/sts-emulator" ./cmd/sts-emulator

say "starting the STS emulator on 127.0.0.1:$sts_port"
# The log exists before the emulator starts: the loop below reads it at
# once, and the background shell may not have opened it yet (under load,
# sed's "can't read" then ended the script through set -e).
: >"$work/sts-emulator.log"
"$work/sts-emulator" -listen "127.0.0.1:$sts_port" ${DEV_STS_TRUST_FILE:+-trust-file "$DEV_STS_TRUST_FILE"} >"$work/sts-emulator.log" 2>&1 &
pids+=($!)
sts_url=
for _ in $(seq 1 100); do
	sts_url=$(sed -n 's/^sts-emulator listening on \(http:[^ ]*\).*/\1/p' "$work/sts-emulator.log" | head -n 1)
	[[ -n "$sts_url" ]] && break
	kill -0 "${pids[0]}" 2>/dev/null || die "the STS emulator exited; see above"
	sleep 0.1
done
[[ -n "$sts_url" ]] || die "the STS emulator did not start within 10s"
echo "$sts_url" >&2

say "starting Vault (dev server) on 127.0.0.1:$vault_port"
# plugin_directory in a config file rather than -dev-plugin-dir: the latter
# registers every binary found there without a version; here the plugin is
# registered explicitly by sha256 and version, the way an operator does it.
cat >"$work/vault.hcl" <<HCL
plugin_directory = "$work/plugins"
HCL
env -u VAULT_TOKEN -u VAULT_ADDR "$vault" server -dev \
	-dev-listen-address="127.0.0.1:$vault_port" \
	-dev-root-token-id="$dev_token" \
	-dev-no-store-token \
	-config="$work/vault.hcl" >"$work/vault.log" 2>&1 &
pids+=($!)

export VAULT_ADDR="http://127.0.0.1:$vault_port"
export VAULT_TOKEN="$dev_token"
unset VAULT_NAMESPACE VAULT_FORMAT
for _ in $(seq 1 300); do
	"$vault" status >/dev/null 2>&1 && break
	kill -0 "${pids[1]}" 2>/dev/null || die "Vault exited; see above"
	sleep 0.1
done
"$vault" status >/dev/null 2>&1 || die "Vault did not come up within 30s"

say "registering the plugin by sha256 and version, mounting it at $plugin_name/"
sha=$(sha256sum "$work/plugins/$plugin_bin" | cut -d' ' -f1)
"$vault" plugin register -sha256="$sha" -version="$version" -command="$plugin_bin" secret "$plugin_name"
# allowed_response_headers: Vault passes a plugin's response headers only
# when the mount lists them; without it a 503's Retry-After is dropped (the
# message still says when). docs/operations.md, "Retry-After on 503s".
"$vault" secrets enable -path="$plugin_name" -plugin-version="$version" \
	-allowed-response-headers=Retry-After "$plugin_name"

say "pointing config/root at the emulator, creating role demo"
"$vault" write "$plugin_name/config/root" \
	access_key="$sts_access_key" secret_key="$sts_secret_key" \
	region=us-east-1 sts_endpoint="$sts_url" iam_endpoint="$sts_url" >/dev/null
"$vault" write "$plugin_name/roles/demo" \
	credential_type=assumed_role role_arn=arn:aws:iam::123456789012:role/demo >/dev/null

say "vault read $plugin_name/creds/demo"
"$vault" read "$plugin_name/creds/demo"

say "a token for Prometheus that may read only $plugin_name/metrics"
"$vault" policy write "$plugin_name-metrics" - >/dev/null <<POLICY
path "$plugin_name/metrics" {
  capabilities = ["read"]
}
POLICY
# Into a file, never onto the terminal.
(umask 077 && "$vault" token create -policy="$plugin_name-metrics" -field=token >"$work/prometheus-token")
echo "$work/prometheus-token" >&2
# A complete Prometheus config for this server, with the alert rules beside
# it (Prometheus reads rule_files relative to the config file).
mkdir -p "$work/prometheus"
install -m 0644 "$root/deploy/prometheus/aws-resilient-rules.yml" "$work/prometheus/"
cat >"$work/prometheus/prometheus.yml" <<PROM
global:
  scrape_interval: 15s
scrape_configs:
  - job_name: vault-$plugin_name
    metrics_path: /v1/$plugin_name/metrics
    scheme: http
    authorization:
      type: Bearer
      credentials_file: $work/prometheus-token
    static_configs:
      - targets: ['127.0.0.1:$vault_port']
rule_files:
  - aws-resilient-rules.yml
PROM

cat <<HINT

Vault is running at $VAULT_ADDR with the plugin mounted at $plugin_name/,
talking to the STS emulator at $sts_url. In another shell, paste these
lines: the examples of README.md and docs/ use them, so they run as
written on these ports:

  export VAULT_ADDR=$VAULT_ADDR
  export VAULT_TOKEN=$dev_token   # dev server root token, local only
  export STS_ADDR=$sts_url   # the STS emulator
  export DEV_DIR=$(printf %q "$work")   # make dev's work directory: tokens, configs, logs
  export PATH="$(dirname "$vault"):\$PATH"   # the vault CLI make dev uses

  vault read $plugin_name/creds/demo            # served from the cache: no STS call
  vault read $plugin_name/status/demo           # state, expiration, next_refresh, last_error
  vault write -f $plugin_name/refresh/demo      # run one refresh cycle now
  vault read $plugin_name/config/refresh        # retry window, attempts, refresh fraction, rate limit
  vault write $plugin_name/roles/other credential_type=session_token
  vault path-help $plugin_name/creds/demo
  curl -s $sts_url/_emulator/stats   # STS calls the plugin made
  curl -s $sts_url/_emulator/roles   # roles in other accounts and their trust (DEV_STS_TRUST_FILE)

Prometheus metrics, through Vault, with the metrics-only token:

  curl -s -H "Authorization: Bearer \$(cat $work/prometheus-token)" $VAULT_ADDR/v1/$plugin_name/metrics

A complete Prometheus config for it, $work/prometheus/prometheus.yml,
with the alert rules beside it (check it with promtool check config):

$(sed 's/^/  /' "$work/prometheus/prometheus.yml")

STS outage on demand (the emulator's fault control; see the README's quick start):

  curl -s -X POST -d '{"probability":{"ServiceUnavailable":1}}' $sts_url/_emulator/faults
  curl -s -X DELETE $sts_url/_emulator/faults

Logs: $work/vault.log and $work/sts-emulator.log
HINT

if ((once)); then
	say "one-shot mode: done"
	exit 0
fi
say "press Ctrl-C to stop"
# Wait for either child: if one dies, stop the other and say so.
wait -n "${pids[@]}" || true
die "a process exited unexpectedly; see the logs above"
