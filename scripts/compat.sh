#!/usr/bin/env bash
# compat.sh (`make compat`): the whole acceptance suite against every Vault
# version in tools/vault-versions, one version after the other, and the
# matrix (version x test: pass/fail, seconds) written to docs/compat.md with
# the date and the plugin commit. Not part of `make test` (which runs the
# suite on the pinned version only, plus the upgrade test); run it when a
# version is added, and commit docs/compat.md.
#
# Extra arguments go to `go test` (for example -run TestPaths).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
	export PATH="$PATH:/usr/local/go/bin"
fi

mapfile -t versions < <(grep -v '^#' tools/vault-versions | sed '/^$/d')
out=$(mktemp -d "${TMPDIR:-/tmp}/aws-resilient-compat.XXXXXX")

# Every version's binary first (each ~11 min cold, then cached), so that
# the upgrade test finds the ones it needs whichever version is under test.
for v in "${versions[@]}"; do
	bin=$(./scripts/vault.sh "$v")
	export "VAULT_BIN_${v//./_}=$bin"
done

export VAULT_ACC=1
rc=0
for v in "${versions[@]}"; do
	var="VAULT_BIN_${v//./_}"
	echo "==================== Vault $v ====================" >&2
	# go test -json keeps going after a failure; the matrix shows it.
	VAULT_BIN=${!var} go test -count=1 -json -parallel 8 -timeout 40m "$@" ./acceptance/... >"$out/$v.json" || rc=1
	grep -E '"Action":"(pass|fail|skip)"' "$out/$v.json" | grep -v '"Test":"[^"]*/' | grep '"Test"' |
		sed -E 's/.*"Action":"([a-z]+)".*"Test":"([^"]+)".*"Elapsed":([0-9.]+).*/  \1 \2 \3s/' >&2 || true
done

commit=$(git rev-parse --short HEAD)
if [[ -n "$(git status --porcelain -- ':!docs/compat.md')" ]]; then
	commit="$commit-dirty"
fi
python3 - "$out" "$commit" "${versions[@]}" >docs/compat.md <<'PY'
import json, sys, datetime
out, commit, versions = sys.argv[1], sys.argv[2], sys.argv[3:]
results = {}  # test -> version -> (action, elapsed)
for v in versions:
    with open(f"{out}/{v}.json") as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            t = e.get("Test")
            if not t or "/" in t or e.get("Action") not in ("pass", "fail", "skip"):
                continue
            results.setdefault(t, {})[v] = (e["Action"], e.get("Elapsed", 0))
print("# Vault compatibility matrix")
print()
print(f"`make compat` ({datetime.date.today().isoformat()}, plugin commit {commit}): the acceptance suite")
print("against every Vault version in `tools/vault-versions`. Each cell is the")
print("test's result and its wall time; the tests of one version run side by side.")
print()
print("| test | " + " | ".join(f"Vault {v}" for v in versions) + " |")
print("| --- | " + " | ".join("---" for _ in versions) + " |")
for t in sorted(results):
    cells = []
    for v in versions:
        a, s = results[t].get(v, ("not run", 0))
        cells.append(f"{a} ({s:.0f} s)" if a != "not run" else a)
    print(f"| {t} | " + " | ".join(cells) + " |")
totals = []
for v in versions:
    ok = sum(1 for t in results if results[t].get(v, ("",))[0] == "pass")
    totals.append(f"{ok}/{len(results)} pass")
print("| **all** | " + " | ".join(totals) + " |")
PY
echo "wrote docs/compat.md" >&2
if ((rc == 0)); then
	rm -rf "$out"
else
	# A failing test's output, from go test -json, stays for reading.
	echo "go test -json output kept in $out" >&2
fi
exit "$rc"
