#!/usr/bin/env bash
# Runs the README's test command N times and prints, per test, how many runs it passed — so a
# test that holds only on a quiet or a fast machine shows up before CI meets it.
#
#   bench/suite_repeat.sh [-n RUNS] [--hog] [-- EXTRA CARGO TEST ARGS]
#
#   -n RUNS   runs (default 10)
#   --hog     a CPU hog beside every run: one busy process per CPU but one (`nice`d 0, as a
#             user's compile would be), so the suite shares the machine as it does on a busy
#             CI host
#
# Output: one line per test that failed at least once (passes/runs, binary, name), then the
# totals; the logs of each run stay in $OUT (default a fresh directory under /tmp). Exit 0 when
# every test passed every run, 1 otherwise. Needs root for the namespace tests, as the suite.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=10
hog=0
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        -n) runs="$2"; shift 2 ;;
        --hog) hog=1; shift ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "suite_repeat: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
out="${OUT:-$(mktemp -d /tmp/flowlane-suite.XXXXXX)}"
mkdir -p "$out"

# Build once, so every run measures the tests and not the compiler.
cargo test --workspace --no-run -q >/dev/null 2>&1 || cargo test --workspace --no-run

hogs=()
stop_hogs() {
    for p in "${hogs[@]}"; do kill "$p" 2>/dev/null || true; done
    hogs=()
}
trap stop_hogs EXIT
start_hogs() {
    local n
    n=$(( $(nproc) - 1 ))
    [ "$n" -ge 1 ] || n=1
    for _ in $(seq "$n"); do
        ( while :; do :; done ) &
        hogs+=("$!")
    done
}

for i in $(seq "$runs"); do
    [ "$hog" = 1 ] && start_hogs
    start=$(date +%s)
    cargo test --workspace --no-fail-fast "${extra[@]}" >"$out/run$i.log" 2>&1 && rc=0 || rc=$?
    stop_hogs
    printf 'run %d of %d: exit %d in %d s\n' "$i" "$runs" "$rc" "$(( $(date +%s) - start ))" >&2
done

# `Running tests/x.rs (target/…)` names the binary; `test NAME ... ok|FAILED` each result.
awk -v runs="$runs" '
    /^     Running / { bin = $2; next }
    /^test .* \.\.\. (ok|FAILED)$/ {
        name = bin " " $2
        seen[name]++
        if ($NF == "ok") ok[name]++
    }
    END {
        total = 0; flaky = 0
        for (t in seen) {
            total++
            if (ok[t] + 0 < runs) {
                flaky++
                printf "%d/%d passed  %s\n", ok[t] + 0, runs, t
            }
        }
        printf "%d tests, %d passed every one of %d runs, %d did not\n", total, total - flaky, runs, flaky
        exit flaky > 0
    }
' "$out"/run*.log && status=0 || status=1
echo "logs: $out" >&2
exit "$status"
