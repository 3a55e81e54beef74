#!/usr/bin/env bash
# Issue #16 item 6: the multi-node paths on one machine. With OXCCL_SEPARATE_HOSTS=1 every
# rank (one process each) is its own "node": no IPC, no NVLink algorithm, the PortChannel
# allreduce / all-gather / reduce-scatter over TCP (IB where a device exists), chosen by the
# selector with nothing forced. Then the same sizes timed against NCCL forced onto its
# socket transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1
# NCCL_NVLS_ENABLE=0) in the same run (--compare nccl, graph replay off: the proxy path is
# what is measured, both libraries alike).
#
#     OUT=dir ci/gpu/multinode.sh               # 2 ranks, one per GPU (correctness + timing)
#     MN_GPUS=1 OUT=dir ci/gpu/multinode.sh     # 2 ranks time-sliced on GPU 0 (correctness
#                                               # only: NCCL refuses two ranks on one GPU)
#     OXCCL_BACKEND=host MN_MAX=1M ci/gpu/multinode.sh   # the host backend (no GPU)
#     MN_TIMING_ONLY=1 BIN=.gpu/prev OUT=dir ci/gpu/multinode.sh   # only the timing against
#                                               # NCCL (e.g. of an earlier build, for an A/B)
#     MN_TIMELINE=1 ...                         # and where a 1 KB call's time goes
#                                               # (ci/gpu/tcp_timeline.py)
#     MN_TIME_ARGS='--iters 30' MN_TIMELINE_ARGS=--graph ...  # more oxccl-perf arguments for
#                                               # the timing against NCCL / the timeline
#     MN_TIMING=0 ...                           # no timing against NCCL
#
# Every size is checked against the host reference with the output poisoned first
# (oxccl-perf's check); the algorithm column must name the PortChannel algorithm; the
# collectives without a multi-node algorithm must be refused with the clear error. Binaries
# come from .gpu/bin (cargo build --release -p oxccl-perf --features cuda). Writes one log
# per step to $OUT (default ./multinode-out) and exits non-zero when a step failed.
# NVLS stays off: nothing here creates a multicast object.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.gpu/bin}
OUT=${OUT:-$PWD/multinode-out}
WORLD=${MN_WORLD:-2}
if [[ -n ${MN_GPUS:-} ]]; then
    GPUS=$MN_GPUS
elif [[ ${OXCCL_BACKEND:-} == host ]]; then
    GPUS=$WORLD
else
    GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    ((GPUS > WORLD)) && GPUS=$WORLD
    ((GPUS >= 1)) || { echo "no GPU found (set OXCCL_BACKEND=host to run on the host backend)"; exit 1; }
fi
MAX=${MN_MAX:-64M}
export OXCCL_SEPARATE_HOSTS=1 NCCL_NVLS_ENABLE=0 OXCCL_NVLS=0
export OXCCL_TIMEOUT_MS=${OXCCL_TIMEOUT_MS:-60000}
unset OXCCL_ALGO
mkdir -p "$OUT"
FAILED=0
bound=${MN_STEP_TIMEOUT:-300}

# launch NAME CMD...: WORLD ranks of CMD, rank r on GPU r % GPUS, each its own process (the
# switch makes each its own node); waits for all; fails when a rank failed.
launch() {
    local name=$1 port=$((20000 + RANDOM % 20000)) r ok=0
    shift
    local pids=()
    for ((r = 0; r < WORLD; r++)); do
        RANK=$r WORLD_SIZE=$WORLD LOCAL_RANK=$((r % GPUS)) LOCAL_WORLD_SIZE=$WORLD \
            MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            timeout -k 5 "$bound" "$@" >"$OUT/$name.$r.log" 2>&1 &
        pids+=($!)
    done
    for ((r = 0; r < WORLD; r++)); do
        wait "${pids[$r]}" || ok=1
    done
    return $ok
}

# step NAME WANT_ALGO CMD...: a checked run whose every row must have taken WANT_ALGO.
step() {
    local name=$1 want=$2
    shift 2
    echo "=== $name: $*"
    if ! launch "$name" "$@"; then
        echo "FAIL $name"
        tail -15 "$OUT/$name.0.log"
        FAILED=1
        return
    fi
    # Rows are the lines that start with a size; the algorithm column names what ran.
    local rows others
    rows=$(grep -cE '^ *[0-9]+ ' "$OUT/$name.0.log" || true)
    others=$(grep -E '^ *[0-9]+ ' "$OUT/$name.0.log" | grep -vcw "$want" || true)
    if ((rows == 0 || others != 0)); then
        echo "FAIL $name: $rows rows, $others not served by $want"
        grep -E '^ *[0-9]+ ' "$OUT/$name.0.log" | grep -vw "$want" | head -5
        FAILED=1
        return
    fi
    echo "PASS $name ($rows sizes, all $want)"
}

# refused NAME CMD...: must fail on every rank with the multi-node refusal.
refused() {
    local name=$1
    shift
    echo "=== $name (must be refused): $*"
    if launch "$name" "$@"; then
        echo "FAIL $name: it ran"
        FAILED=1
    elif grep -q "no multi-node algorithm" "$OUT/$name.0.log"; then
        echo "PASS $name: $(grep -m1 -o 'no multi-node algorithm[^;]*' "$OUT/$name.0.log")"
    else
        echo "FAIL $name: not the multi-node refusal"
        tail -5 "$OUT/$name.0.log"
        FAILED=1
    fi
}

# The PortChannel algorithm of a collective (what the selector must take across nodes).
port_algo() {
    case $1 in
    allreduce) echo port_channel ;;
    *) echo "${1}_port" ;;
    esac
}

nvidia-smi -L 2>/dev/null || true
echo "# $WORLD ranks on $GPUS GPU(s), OXCCL_SEPARATE_HOSTS=1, sizes up to $MAX"
q=(-w 1 --iters 2)
perf=("$BIN/oxccl-perf")
for c in allreduce allgather reducescatter; do
    [[ ${MN_TIMING_ONLY:-0} == 1 ]] && break
    algo=$(port_algo "$c")
    for dtype in bf16 f32 fp8_e4m3; do
        step "$c-$dtype" "$algo" "${perf[@]}" -c "$c" -b 1 -e "$MAX" -f 7 -d "$dtype" "${q[@]}"
    done
    step "$c-bf16-inplace-odd" "$algo" "${perf[@]}" -c "$c" -b 1003 -e "$MAX" -f 9 -d bf16 --in-place "${q[@]}"
    if [[ $c != allgather ]]; then
        step "$c-i32-max" "$algo" "${perf[@]}" -c "$c" -b 999 -e 4M -f 9 -d i32 -o max "${q[@]}"
        step "$c-f16-avg-inplace" "$algo" "${perf[@]}" -c "$c" -b 1001 -e 4M -f 9 -d f16 -o avg --in-place "${q[@]}"
    fi
    step "$c-bf16-unregistered" "$algo" "${perf[@]}" -c "$c" -b 1000 -e 4M -f 9 -d bf16 --no-register "${q[@]}"
    step "$c-bf16-graph" "$algo" "${perf[@]}" -c "$c" -b 1K -e 4M -f 8 -d bf16 --graph "${q[@]}"
done
for c in alltoall broadcast reduce; do
    [[ ${MN_TIMING_ONLY:-0} == 1 ]] && break
    refused "$c-refused" "${perf[@]}" -c "$c" -b 1K -e 1K "${q[@]}"
done

# Timing against NCCL on its socket transport, same GPUs, same sizes, one run each.
if [[ ${MN_TIMING:-1} == 0 ]]; then
    echo "# timing against NCCL skipped: MN_TIMING=0"
elif ((GPUS >= WORLD)) && [[ ${OXCCL_BACKEND:-} != host ]]; then
    for c in allreduce allgather reducescatter; do
        algo=$(port_algo "$c")
        step "$c-vs-nccl-sockets" "$algo" env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 \
            NCCL_NVLS_ENABLE=0 "${perf[@]}" -c "$c" -b 1K -e "${MN_TIME_MAX:-256M}" -f 4 -d bf16 -w 3 --iters 10 \
            --compare nccl --nccl-default-only --json "$OUT/$c-bf16-${WORLD}rank-sockets.json" ${MN_TIME_ARGS:-}
        grep -E '^#|^ *[0-9]+ ' "$OUT/$c-vs-nccl-sockets.0.log" | tail -12
    done
else
    echo "# timing against NCCL skipped: ${OXCCL_BACKEND:-GPU} backend, $WORLD ranks on $GPUS GPU(s) (NCCL needs a GPU per rank)"
fi
# MN_TIMELINE=1: where a small call's time goes (channels/src/timeline.rs): 1 KB calls
# with the channel timeline on, lined up by ci/gpu/tcp_timeline.py.
if [[ ${MN_TIMELINE:-0} == 1 ]]; then
    for c in ${MN_TIMELINE_COLLECTIVES:-allgather allreduce}; do
        rm -f "$OUT/timeline-$c".*.csv
        step "$c-timeline" "$(port_algo "$c")" env OXCCL_CHANNEL_TIMELINE="$OUT/timeline-$c" \
            "${perf[@]}" -c "$c" -b 1K -e 1K -d bf16 -w 50 --iters 500 ${MN_TIMELINE_ARGS:-}
        python3 ci/gpu/tcp_timeline.py "$OUT/timeline-$c".*.csv | tee "$OUT/timeline-$c.txt"
    done
fi
if ((FAILED)); then
    echo "multinode: FAILED (logs in $OUT)"
    exit 1
fi
echo "multinode: all steps passed (logs in $OUT)"
