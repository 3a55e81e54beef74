#!/usr/bin/env bash
# Issue #21 item 3: the host test suite RUNS times in a row while busy loops keep every core
# loaded, so that an assertion that depends on timing shows up as a failure. Builds the test
# binaries once, then runs `cargo test --workspace --no-fail-fast` RUNS times; prints each
# run's result and, at the end, every test that failed and how often.
#
#     ci/flaky.sh [RUNS]            (default 20; LOAD=0 runs without the busy loops)
#
# Not part of ci/test.sh: 20 runs take far longer than CI's budget.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
out=${OUT:-${CARGO_TARGET_DIR:-$PWD/target}/flaky}
mkdir -p "$out"
cargo test --workspace --no-run >"$out/build.log" 2>&1 || {
    tail -n 30 "$out/build.log"
    exit 2
}
loaders=()
if [[ ${LOAD:-1} != 0 ]]; then
    for _ in $(seq "$(nproc)"); do
        (while :; do :; done) &
        loaders+=($!)
    done
fi
stop_loaders() { ((${#loaders[@]})) && kill "${loaders[@]}" 2>/dev/null; }
trap stop_loaders EXIT
failed_runs=0
for ((k = 1; k <= runs; k++)); do
    t0=$SECONDS
    if cargo test --workspace --no-fail-fast >"$out/run-$k.log" 2>&1; then
        verdict=pass
    else
        verdict=FAIL
        failed_runs=$((failed_runs + 1))
    fi
    passed=$(grep -E '^test result:' "$out/run-$k.log" | awk '{s += $4} END {print s + 0}')
    echo "run $k/$runs: $verdict, $passed tests passed, $((SECONDS - t0)) s"
done
stop_loaders
echo "== $((runs - failed_runs)) of $runs runs passed under load"
grep -hE '^test .* \.\.\. FAILED$' "$out"/run-*.log | sort | uniq -c | sort -rn || true
((failed_runs == 0))
