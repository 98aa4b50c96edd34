#!/usr/bin/env bash
# mutate.sh: mutation testing of the mechanism packages (`make mutate`; not
# run by CI). A mechanism under internal/ is tested without a backend, so
# its tests should notice when its code changes: Gremlins flips its
# comparisons, arithmetic and increments one at a time and runs the
# package's tests against each change. A change the tests miss LIVED.
#
# For each of internal/{clock,ratelimit,dueplan,schedindex,memlimit} that
# exists (an absent one is skipped with a message), it prints the killed,
# lived, timed-out and not-covered mutant counts and the efficacy, killed /
# (killed + lived), and lists the mutants that lived. Only the package's own
# files are mutated, not those of packages below it (clock/clocktest).
#
# Exits non-zero if any package's efficacy is below the threshold (90 %),
# or if a package has mutants but no test covers any of them. A package
# with no mutants at all (say, a clock interface) passes.
#
# Usage: scripts/mutate.sh [--report-only] [DIR ...]
#   --report-only   print the figures, never fail on them
#   DIR ...         packages to run instead of the mechanisms (internal/bench)
# Environment:
#   MUTATE_MIN_EFFICACY  the threshold in percent (default 90)
#   MUTATE_REPORT_ONLY   1: as --report-only
#   MUTATE_WORKERS       Gremlins workers (default 1: the machine is shared;
#                        each runs `go test` on its own copy of the module)
#   MUTATE_TIMEOUT_COEFFICIENT
#                        a mutant's test run may take this many times the
#                        first, unmutated run (default 10, Gremlins' own 3):
#                        on a loaded machine a build alone can take longer,
#                        and a mutant that times out counts as neither killed
#                        nor lived, so it hides what the tests missed
#
# Survivors judged equivalent: mutants that no test can kill because the
# code behaves the same either way. Where the redundant construct could go
# without changing behaviour it went (dueplan's timer generation became the
# armed timer's identity; ratelimit's burst floor became max(burst, 1);
# schedindex's Repair adds what fit left out, 0 included, without a guard).
# What is left, with why:
#   internal/dueplan   dueplan.go, dueHeap.less: a.seq < b.seq as <=.
#                      Every entry's seq is unique and the heap never
#                      compares an entry with itself (up compares a child
#                      with its parent, down distinct children and a child
#                      with its parent), so < and <= agree on every call.
#                      dueplan.go, dueHeap.up: i > 0 as i >= 0. At the root
#                      the parent computed is the root itself ((0-1)/2 is 0
#                      in Go), and an item is never earlier than itself, so
#                      the extra turn returns at once.
#   internal/schedindex  schedindex.go, fit: 1+size <= MaxShardBytes as <.
#                      When the shard is exactly at the bound the slower
#                      path runs instead, keeps every entry (each fits as
#                      the running size never passes the total) and returns
#                      the same size with none left out.
#                      schedindex.go, quotedLen: c < 0x20 as <= (a space
#                      taken for a character JSON escapes). The check only
#                      picks the slow path, json.Marshal, which measures any
#                      key exactly, so a wider check returns the same length.
#
# Run it on a quiet machine: under load a mutant's test run can time out
# (neither killed nor lived), and Gremlins counts a run that ends on a
# signal (exit code other than 1 or 2) as LIVED, so a loaded machine shows
# survivors that the tests in fact kill.
#
# Gremlins v0.6.0 is installed from the Go module proxy, once, into
# ${XDG_CACHE_HOME:-$HOME/.cache}/aws-resilient/bin (outside the repository),
# and again whenever the binary there is not that version.
set -euo pipefail
cd "$(dirname "$0")/.."

GREMLINS_VERSION=v0.6.0
min_efficacy=${MUTATE_MIN_EFFICACY:-90}
report_only=${MUTATE_REPORT_ONLY:-0}
workers=${MUTATE_WORKERS:-1}
timeout_coefficient=${MUTATE_TIMEOUT_COEFFICIENT:-10}

while [ $# -gt 0 ]; do
	case $1 in
	--report-only) report_only=1; shift ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	--) shift; break ;;
	-*) echo "mutate.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
	*) break ;;
	esac
done
if [ $# -gt 0 ]; then
	pkgs=("$@")
else
	pkgs=(internal/clock internal/ratelimit internal/dueplan internal/schedindex internal/memlimit)
fi

bindir="${XDG_CACHE_HOME:-$HOME/.cache}/aws-resilient/bin"
gremlins="$bindir/gremlins"
# `go install` leaves "dev" in gremlins --version; the module version is in
# the binary's build info.
if ! go version -m "$gremlins" 2>/dev/null | grep -q "mod[[:space:]]*github.com/go-gremlins/gremlins[[:space:]]*$GREMLINS_VERSION"; then
	echo "installing gremlins $GREMLINS_VERSION into $bindir"
	start=$(date +%s)
	mkdir -p "$bindir"
	GOBIN="$bindir" nice go install "github.com/go-gremlins/gremlins/cmd/gremlins@$GREMLINS_VERSION"
	echo "installed in $(($(date +%s) - start))s"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# field prints a number from Gremlins' one-line JSON report.
field() { sed -nE "s/.*\"$1\":([0-9]+).*/\1/p" "$2"; }

failed=()
for pkg in "${pkgs[@]}"; do
	pkg=${pkg%/}
	if ! compgen -G "$pkg/*.go" >/dev/null; then
		echo "$pkg: absent, skipped"
		continue
	fi
	name=${pkg//\//_}
	echo "$pkg: running gremlins..."
	start=$(date +%s)
	# Gremlins needs an absolute path to find the package within the module;
	# -E / leaves out files in directories below the package. -S lt logs the
	# mutants that lived or timed out, each on a line of its own.
	if ! nice "$gremlins" unleash --workers "$workers" --timeout-coefficient "$timeout_coefficient" -S lt -E / -o "$out/$name.json" "$PWD/$pkg" >"$out/$name.log" 2>&1 ||
		[ ! -s "$out/$name.json" ]; then
		cat "$out/$name.log"
		echo "$pkg: gremlins failed"
		failed+=("$pkg")
		continue
	fi
	killed=$(field mutants_killed "$out/$name.json")
	lived=$(field mutants_lived "$out/$name.json")
	not_covered=$(field mutants_not_covered "$out/$name.json")
	timed_out=$(grep -o '"status":"TIMED OUT"' "$out/$name.json" | wc -l || true)
	grep -E '^[[:space:]]*(LIVED|TIMED OUT)' "$out/$name.log" | sed -E 's/^[[:space:]]*/  /' || true
	if [ $((killed + lived)) -gt 0 ]; then
		efficacy=$(awk -v k="$killed" -v l="$lived" 'BEGIN { printf "%.2f", 100 * k / (k + l) }')
		below=$(awk -v e="$efficacy" -v m="$min_efficacy" 'BEGIN { print (e < m) ? 1 : 0 }')
		shown="$efficacy %"
	else
		# No covered mutant: efficacy is undefined. Fine if there is nothing
		# to mutate, a failure if the tests cover none of what there is.
		below=$((not_covered > 0 ? 1 : 0))
		shown="n/a"
	fi
	echo "$pkg: killed $killed, lived $lived, timed out $timed_out, not covered $not_covered, efficacy $shown ($(($(date +%s) - start))s)"
	if [ "$timed_out" -gt 0 ]; then
		echo "$pkg: $timed_out mutants timed out and are not in the efficacy; on a quieter machine or with a higher MUTATE_TIMEOUT_COEFFICIENT they would be killed or lived"
	fi
	if [ "$below" = 1 ]; then
		failed+=("$pkg")
	fi
done

if [ ${#failed[@]} -gt 0 ]; then
	echo "below ${min_efficacy} % efficacy (or failed): ${failed[*]}"
	if [ "$report_only" != 1 ]; then
		exit 1
	fi
	echo "(report only: not failing)"
fi
