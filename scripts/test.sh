#!/usr/bin/env bash
# test.sh: every test, from a fresh clone (`make test`; .ci/run calls it).
#
#  1. tools      awscli (apt-get, only when `aws` is missing) and python3 botocore,
#                the independent STS clients the emulator is checked against;
#                Debian's prometheus (prometheus and promtool) and nftables
#                (the network tests' and the soak's partitions) when missing
#  2. rules      promtool check/test of the shipped alert rules
#  3. gofmt      formatting check; no binary or file over 1 MiB tracked
#  4. vet        go vet ./...
#  5. unit       go test -race -count=1 ./... (acceptance tests skip here),
#                including the seeded fault simulation (TestSimulation), and
#                the test-hook build's own tests (-tags testhooks)
#  6. fuzz       every FuzzXxx target for 8000 executions each
#  7. vault      every Vault in tools/vault-versions, each built once into
#                the cache (~11 min cold each): the suite runs on the first,
#                the upgrade test moves from the first to the last
#  8. build      plugin (and its -tags testhooks build) and STS emulator
#  9. acceptance VAULT_ACC=1: real Vault, vault CLI, Vault Agent, emulator,
#                a real Prometheus
# 10. soak       a 2-minute chaos soak (fixed seed) on a 3-node cluster, its
#                history checked by cmd/soak-check (`make soak` runs longer)
#
# Exits non-zero at the first failing section.
set -euo pipefail
cd "$(dirname "$0")/.."

# A login shell may not have Go on PATH yet on a fresh machine.
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
	export PATH="$PATH:/usr/local/go/bin"
fi

t0=$(date +%s)
sec_start=$t0
sec_name=
summary=()
section() {
	local now
	now=$(date +%s)
	if [[ -n "$sec_name" ]]; then
		summary+=("$(printf '%-11s %5ss' "$sec_name" $((now - sec_start)))")
	fi
	sec_name=$1
	sec_start=$now
	printf '\n==================== %s: %s ====================\n' "$1" "$2"
}
# shellcheck disable=SC2317 # invoked through the EXIT trap
finish() {
	local rc=$? now
	now=$(date +%s)
	[[ -n "$sec_name" ]] && summary+=("$(printf '%-11s %5ss' "$sec_name" $((now - sec_start)))")
	printf '\n==================== summary ====================\n'
	printf '%s\n' "${summary[@]}"
	if ((rc == 0)); then
		printf 'ALL PASSED in %ss\n' $((now - t0))
	else
		printf 'FAILED in section "%s" (exit %s) after %ss\n' "$sec_name" "$rc" $((now - t0))
	fi
	rm -rf "${bindir:-}" "${shims:-}"
	exit "$rc"
}
trap finish EXIT
# A signal must not end in "ALL PASSED": exit with the signal's status, so
# finish reports the section it stopped in.
trap 'exit 143' TERM
trap 'exit 130' INT

as_root() {
	if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

section tools "awscli and botocore for the emulator's independent-client tests"
# The emulator's tests run `aws` and `python3 -c 'import botocore'` from PATH
# and fail in CI without them. A PATH entry can exist and still not work (a
# pyenv shim for a Python without the package): then install Debian's package
# and put Debian's binary first on PATH through a shim directory.
shims=$(mktemp -d "${TMPDIR:-/tmp}/aws-resilient-shims.XXXXXX")
apt_updated=0
apt_install() {
	if ((apt_updated == 0)); then
		as_root apt-get update
		apt_updated=1
	fi
	DEBIAN_FRONTEND=noninteractive as_root apt-get install -y --no-install-recommends "$@"
}
if ! aws --version >/dev/null 2>&1; then
	echo "no working aws on PATH: installing Debian's awscli"
	apt_install awscli
	if ! aws --version >/dev/null 2>&1 && /usr/bin/aws --version >/dev/null 2>&1; then
		ln -s /usr/bin/aws "$shims/aws"
	fi
fi
if ! python3 -c 'import botocore' 2>/dev/null; then
	echo "python3 on PATH cannot import botocore: installing Debian's python3-botocore"
	apt_install python3-botocore
	if ! python3 -c 'import botocore' 2>/dev/null && /usr/bin/python3 -c 'import botocore' 2>/dev/null; then
		ln -s /usr/bin/python3 "$shims/python3"
	fi
fi
# A real Prometheus scrapes the plugin in the acceptance tests, and promtool
# checks the exposition and tests the alert rules.
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
	echo "no prometheus/promtool on PATH: installing Debian's prometheus"
	apt_install prometheus
fi
# The network tests (internal/vaulttest, acceptance/partition_*) and the
# soak cut nodes apart with nft in their network namespaces.
if ! command -v nft >/dev/null; then
	echo "no nft on PATH: installing Debian's nftables"
	apt_install nftables
fi
export PATH="$shims:$PATH"
aws --version
python3 -c 'import botocore, sys; print("botocore", botocore.__version__, "for", sys.executable)'
promtool --version 2>&1 | head -1
prometheus --version 2>&1 | head -1
go version
# The exposition test must not skip for want of promtool here.
export AWS_RESILIENT_REQUIRE_PROMTOOL=1
PROMETHEUS_BIN=$(command -v prometheus)
export PROMETHEUS_BIN

section rules "promtool check and test of deploy/prometheus"
promtool check rules deploy/prometheus/aws-resilient-rules.yml
(cd deploy/prometheus && promtool test rules aws-resilient-rules_test.yml)

section gofmt "gofmt -l; no build output tracked"
unformatted=$(git ls-files -z --cached --others --exclude-standard '*.go' | xargs -0 -r gofmt -l)
if [[ -n "$unformatted" ]]; then
	echo "not gofmt-formatted (run make fmt):"
	echo "$unformatted"
	exit 1
fi
# A `go build ./cmd/<name>` in the root once left a 39 MB binary in a
# commit: no tracked file may be an executable (ELF) or over 1 MiB.
built=$(git ls-files -z --cached | python3 -c '
import os, sys
for f in sys.stdin.buffer.read().split(b"\0"):
    if f and os.path.isfile(f):
        with open(f, "rb") as fh:
            if fh.read(4) == b"\x7fELF" or os.path.getsize(f) > 1 << 20:
                print(f.decode(errors="replace"))
')
if [[ -n "$built" ]]; then
	echo "tracked build output or oversized files (remove them; .gitignore lists the usual binaries):"
	echo "$built"
	exit 1
fi
echo ok

section vet "go vet ./... (and the -tags testhooks build)"
go vet ./...
go vet -tags testhooks .
echo ok

section unit "go test -race -count=1 ./... (with the seeded fault simulation), then the test-hook build"
env -u VAULT_ACC go test -race -count=1 ./...
# The storage-fault test hook exists only in a build with -tags testhooks;
# its own tests run there.
env -u VAULT_ACC go test -race -count=1 -tags testhooks -run 'TestHooks|TestBackend_TestHooksEnv|TestBackend_PathDefinitions' .

section fuzz "each fuzz target for 8000 executions"
# A count, not a duration: with -fuzztime=5s Go 1.26's coordinator can report
# "context deadline exceeded" as a failure when the deadline fires while a
# worker is mid-call (golang/go#75804, fixed in Go 1.27), with no failing
# input. A count has no deadline to race; a real finding still writes its
# input under testdata/fuzz and fails. 8000 is 3-6 s of each target here.
fuzzed=0
for pkg in $(go list ./...); do
	for name in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
		echo "--- $pkg $name"
		go test -run '^$' -fuzz "^${name}\$" -fuzztime=8000x "$pkg"
		fuzzed=$((fuzzed + 1))
	done
done
echo "$fuzzed fuzz targets run"

section vault "Vault binaries (scripts/vault.sh), every supported version"
for v in $(grep -v '^#' tools/vault-versions); do
	"$(./scripts/vault.sh "$v")" version
done

section build "plugin and STS emulator"
bindir=$(mktemp -d "${TMPDIR:-/tmp}/aws-resilient-test.XXXXXX")
# The acceptance harness registers this binary as version v0.1.0-dev, so the
# version compiled in must match (Vault checks).
go build -ldflags "-X main.version=v0.1.0-dev" -o "$bindir/vault-plugin-secrets-aws-resilient" ./cmd/vault-plugin-secrets-aws-resilient
go build -o "$bindir/sts-emulator" ./cmd/sts-emulator
# The fault matrix's storage case uses the test-hook build; production
# binaries (the one above, make build, make dev) never carry the hook.
go build -tags testhooks -ldflags "-X main.version=v0.1.0-dev" -o "$bindir/vault-plugin-secrets-aws-resilient_testhooks" ./cmd/vault-plugin-secrets-aws-resilient
export PLUGIN_BIN="$bindir/vault-plugin-secrets-aws-resilient"
export PLUGIN_TESTHOOKS_BIN="$bindir/vault-plugin-secrets-aws-resilient_testhooks"
export STS_EMULATOR_BIN="$bindir/sts-emulator"
ls -la "$bindir"

section acceptance "VAULT_ACC=1 go test ./acceptance/..."
./scripts/testacc.sh

section soak "a 2-minute chaos soak with a fixed seed, checked by cmd/soak-check"
DURATION=2m SEED=5 OUT="$(mktemp -d)" ./scripts/soak.sh
