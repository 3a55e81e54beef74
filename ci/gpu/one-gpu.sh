#!/usr/bin/env bash
# One GPU (e.g. the lent nvidia-h100-x1 / nvidia-h200 kinds): what a single rank can check
# on real hardware. Loads the device image through the communicator's setup (every
# algorithm's kernel looked up by its descriptor), runs the kernels' self-test, and runs
# oxccl-perf on one rank for the default selection and each algorithm forced, at sizes that
# are not powers of two, every size checked bit for bit against the host reference with the
# output poisoned first; then the tuner, and compute-sanitizer memcheck over a short sweep
# (memory and API errors: none allowed).
#
# Binaries come from .gpu/bin (built here with `cargo build -p oxccl-perf -p oxccl-gpu-suite
# --features cuda`, stripped, carried with the call). Writes logs to $OUT (or ./one-gpu-out).
# NVLS stays off: nothing here creates a multicast object.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.gpu/bin}
OUT=${OUT:-$PWD/one-gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OXCCL_NVLS=0 OXCCL_TIMEOUT_MS=20000 OXCCL_TUNE_DIR="$OUT/tune"
FAILED=0
step() {
    local name=$1
    shift
    echo "=== $name: $*"
    if "$@" >"$OUT/$name.log" 2>&1; then
        echo "PASS $name"
    else
        echo "FAIL $name (exit $?)"
        tail -20 "$OUT/$name.log"
        FAILED=1
    fi
    grep -E '^#|PASS|FAIL' "$OUT/$name.log" | tail -3
}
nvidia-smi -L
step selftest "$BIN/oxccl-gpu-suite" selftest
step default-bf16-graph "$BIN/oxccl-perf" -b 1000 -e 64M -f 7 -d bf16 --graph
step default-f32-inplace "$BIN/oxccl-perf" -b 999 -e 8M -f 9 -d f32 --in-place
step default-e4m3b15-unregistered "$BIN/oxccl-perf" -b 1001 -e 8M -f 9 -d fp8_e4m3b15 --accum f32 --no-register
# Integers and f64 (reduced in their own type; the self-test above checks their reducer
# against the host reference on several inputs).
step default-i32-sum "$BIN/oxccl-perf" -b 999 -e 8M -f 9 -d i32
step default-f64-avg-inplace "$BIN/oxccl-perf" -b 1001 -e 8M -f 9 -d f64 -o avg --in-place
step default-u8-max-unregistered "$BIN/oxccl-perf" -b 1000 -e 1M -f 7 -d u8 -o max --no-register
for algo in oneshot_ll twoshot twoshot_push twoshot_zc port_channel; do
    step "forced-$algo" env OXCCL_ALGO=$algo "$BIN/oxccl-perf" -b 1000 -e 4M -f 7 -d bf16
done
# One GPU has no NVLink peer, so LL128 must be refused with a clear error, not run.
step forced-oneshot_ll128-refused bash -c "! OXCCL_ALGO=oneshot_ll128 $BIN/oxccl-perf -b 1K -e 1K 2>&1 | tee /dev/stderr | grep -q PASS"
# The other collectives on one rank: every algorithm's kernel launched through its
# descriptor (one rank moves nothing between GPUs: this checks launch, arguments and the
# local copies, not the NVLink protocol, which needs 2 GPUs: ci/gpu/session.sh collectives).
for c in ${ONE_GPU_COLLECTIVES:-allgather reducescatter alltoall broadcast reduce}; do
    kinds="oneshot_ll staged direct"
    [[ $c == broadcast || $c == reduce ]] && kinds="staged direct" # no LL one-shot (see broadcast.cu, reduce.cu)
    for kind in $kinds; do
        reg=(); [[ ${kind} == staged ]] && reg=(--no-register)
        step "$c-$kind" env OXCCL_ALGO="${c}_${kind}" "$BIN/oxccl-perf" -c "$c" -b 1000 -e 4M -f 7 -d bf16 "${reg[@]}"
        [[ $c == alltoall ]] && continue
        step "$c-$kind-inplace" env OXCCL_ALGO="${c}_${kind}" "$BIN/oxccl-perf" -c "$c" -b 999 -e 1M -f 9 -d f32 --in-place "${reg[@]}"
    done
    step "memcheck-$c" compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$BIN/oxccl-perf" -c "$c" -b 1000 -e 300000 -f 7 -w 1 --iters 2
done
step tune "$BIN/oxccl-perf" -b 1000 -e 1M -f 7 --tune force
# Memory and API errors: the kernels' parameter check asks the driver only about parameters
# that exist (docs/architecture.md, "Kernel launch convention"), so a failed driver call is a
# real one and fails the step like a memory error.
for algo in auto twoshot twoshot_push port_channel; do
    step "memcheck-$algo" env OXCCL_ALGO=$algo compute-sanitizer --tool memcheck \
        --error-exitcode 9 "$BIN/oxccl-perf" -b 1000 -e 300000 -f 7 -w 1 --iters 2
done
# The API errors of one small run, listed, and none allowed.
no_api_errors() {
    local log=$OUT/api-errors.sanitizer.log rc
    compute-sanitizer --tool memcheck "$BIN/oxccl-perf" -b 1K -e 1K -w 1 --iters 1 >"$log" 2>&1
    rc=$?
    grep -E 'Program hit|ERROR SUMMARY' "$log" | sort | uniq -c
    if grep -q 'Program hit' "$log"; then
        grep -A4 'Program hit' "$log" | head -40
        return 1
    fi
    return $rc
}
step api-errors no_api_errors
# Two ranks time-sliced on this one GPU (two processes, both LOCAL_RANK=0): the HAL suite
# with a peer, and every collective on buffers nobody registered, which oxccl maps through
# the allocations' IPC exports (zero-copy, auto-registration). Timings mean nothing here
# (the two contexts take turns); every size is still checked against the host reference.
two_ranks() {
    timeout 200 torchrun --standalone --nproc-per-node 2 --no-python \
        bash -c "LOCAL_RANK=0 exec $*"
}
step two-ranks-hal-suite two_ranks env OXCCL_SUITE_DIR="$OUT/rdv-hal2" "$BIN/oxccl-gpu-suite" suite --timeout 120
step two-ranks-allreduce-unregistered two_ranks "$BIN/oxccl-perf" -b 1000 -e 64M -f 5 -d bf16 --no-register
step two-ranks-allreduce-graph-inplace two_ranks "$BIN/oxccl-perf" -b 4M -e 32M -f 2 -d f32 --no-register --in-place --graph
for c in allgather reducescatter alltoall broadcast reduce; do
    step "two-ranks-$c-unregistered" two_ranks "$BIN/oxccl-perf" -c $c -b 1M -e 16M -f 4 --no-register
done
echo "one-gpu: $([ $FAILED = 0 ] && echo all passed || echo FAILURES)"
exit $FAILED
