#!/usr/bin/env bash
# Issue #21's faults phase: one injected fault per case (oxccl-gpu-suite faults CASE), each
# in its own process group with a time bound. Survivors must report an error naming the
# peer within OXCCL_TIMEOUT_MS + 2 s and exit 0; then the next job on the same GPUs must
# pass (a checked allreduce run). The abort cases (issue #17): a survivor's kernel waits on
# the silent victim and another thread aborts the communicator (ncclCommAbort's path) after
# 200 ms; the call must end with an abort within 2 s of it, then destroy must work.
#
#     OUT=dir ci/gpu/faults.sh              # 2 ranks, one per GPU
#     FAULT_GPUS=1 OUT=dir ci/gpu/faults.sh # 2 ranks time-sliced on GPU 0
#     OXCCL_BACKEND=host OXCCL_FAULT_ELEMS=1000000 NEXT_MAX=4M ci/gpu/faults.sh
#                                           # the host backend (no GPU)
#
# Ranks are started here, not by torchrun: torchrun tears every worker down when one dies,
# which is the very situation under test.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.gpu/bin}
OUT=${OUT:-$PWD/faults-out}
WORLD=${FAULT_WORLD:-2}
GPUS=${FAULT_GPUS:-$WORLD}
CASES=${FAULT_CASES:-"kill skip small-skip exit count small-count dtype small-dtype op small-op abort small-abort"}
export NCCL_NVLS_ENABLE=0 OXCCL_NVLS=0 OXCCL_TIMEOUT_MS=${OXCCL_TIMEOUT_MS:-5000}
mkdir -p "$OUT"
bound=$((OXCCL_TIMEOUT_MS / 1000 + 60))
FAILED=0

# launch NAME CMD...: WORLD ranks of CMD, rank r on GPU r % GPUS; waits for all; rank r's
# exit code in rc[r], its output in $OUT/NAME.r.log.
launch() {
    local name=$1 port=$((20000 + RANDOM % 20000)) r
    shift
    local pids=()
    for ((r = 0; r < WORLD; r++)); do
        RANK=$r WORLD_SIZE=$WORLD LOCAL_RANK=$((r % GPUS)) LOCAL_WORLD_SIZE=$WORLD \
            MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            setsid timeout -k 5 $bound "$@" >"$OUT/$name.$r.log" 2>&1 &
        pids+=($!)
    done
    rc=()
    for ((r = 0; r < WORLD; r++)); do
        wait "${pids[$r]}"
        rc[$r]=$?
    done
}

for case in $CASES; do
    start=$EPOCHREALTIME
    launch "fault-$case" "$BIN/oxccl-gpu-suite" faults "$case"
    secs=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    ok=1
    victim=$((WORLD - 1))
    for ((r = 0; r < victim; r++)); do
        if [[ ${rc[$r]} != 0 ]] || ! grep -q "^FAULT-OK" "$OUT/fault-$case.$r.log"; then
            ok=0
        fi
    done
    case $case in
        kill) [[ ${rc[$victim]} == 137 ]] || ok=0 ;; # SIGKILL
        *) [[ ${rc[$victim]} == 0 ]] || ok=0 ;;
    esac
    printf '%-12s %s  %5.1f s  exit codes %s\n' "$case" "$([[ $ok == 1 ]] && echo PASS || echo FAIL)" \
        "$secs" "${rc[*]}"
    grep -h "^FAULT" "$OUT"/fault-"$case".*.log | sed 's/^/    /' | cut -c1-220
    if [[ $ok != 1 ]]; then
        FAILED=1
        tail -n 5 "$OUT"/fault-"$case".*.log
    fi
    # The next job on the same GPUs passes.
    launch "after-$case" "$BIN/oxccl-perf" -b 1M -e "${NEXT_MAX:-64M}" -f 8 -d f32 -w 2 --iters 5
    if [[ " ${rc[*]} " =~ [^0\ ] ]] || ! grep -q "PASS" "$OUT/after-$case.0.log"; then
        echo "    next job after $case: FAIL (exit codes ${rc[*]})"
        tail -n 5 "$OUT/after-$case.0.log"
        FAILED=1
    else
        echo "    next job after $case: PASS"
    fi
done
echo "faults: $([[ $FAILED == 0 ]] && echo all passed || echo FAILURES)"
exit $FAILED
