#!/usr/bin/env bash
# Runs the CUDA GPU suite built by ci/gpu/build-cuda.sh (.gpu/bin/oxccl-gpu-suite):
#   1. the kernels' self-test on one GPU;
#   2. the multi-process suite with torchrun on 2 GPUs, then on all GPUs (when more than 2).
# Every step has a timeout; NVLS stays off (NCCL_NVLS_ENABLE=0, OXCCL_NVLS unset), so no
# multicast object is ever created. Exit code: non-zero when any step failed.
#
#     ci/gpu/run-cuda.sh [BINARY]
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${1:-${repo_root}/.gpu/bin/oxccl-gpu-suite}"
step_timeout="${OXCCL_STEP_TIMEOUT:-300}"
export NCCL_NVLS_ENABLE=0
unset OXCCL_NVLS

if [[ ! -x "${bin}" ]]; then
    echo "run-cuda.sh: ${bin} not found; build it with ci/gpu/build-cuda.sh" >&2
    exit 2
fi
ngpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
echo "run-cuda.sh: ${ngpus} GPUs; binary ${bin}"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>/dev/null || true

launcher=()
if command -v torchrun >/dev/null 2>&1; then
    launcher=(torchrun --standalone --no-python)
fi

status=0
step() {
    local name="$1"
    shift
    echo
    echo "=== ${name}"
    timeout --kill-after=20 "${step_timeout}" "$@"
    local rc=$?
    if [[ ${rc} -ne 0 ]]; then
        echo "=== ${name}: FAILED (exit ${rc}$([[ ${rc} -eq 124 ]] && echo ', timed out'))"
        status=1
    else
        echo "=== ${name}: ok"
    fi
}

# Without torchrun, start the ranks by hand with the same environment torchrun sets.
spawn_ranks() {
    local n="$1"
    shift
    local pids=() r rc=0
    for ((r = 0; r < n; r++)); do
        RANK=${r} WORLD_SIZE=${n} LOCAL_RANK=${r} LOCAL_WORLD_SIZE=${n} "$@" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do
        wait "${pid}" || rc=1
    done
    return ${rc}
}

run_suite() {
    local n="$1"
    local dir
    dir="$(mktemp -d /tmp/oxccl-suite.XXXXXX)"
    if [[ ${#launcher[@]} -gt 0 ]]; then
        step "suite on ${n} GPUs (torchrun)" \
            env OXCCL_SUITE_DIR="${dir}" OXCCL_SUITE_RUN_ID="n${n}" \
            "${launcher[@]}" --nproc_per_node="${n}" "${bin}" suite --timeout 120
    else
        step "suite on ${n} GPUs (spawned ranks)" \
            env OXCCL_SUITE_DIR="${dir}" OXCCL_SUITE_RUN_ID="n${n}" \
            bash -c "$(declare -f spawn_ranks); spawn_ranks ${n} '${bin}' suite --timeout 120"
    fi
    rm -rf "${dir}"
}

step "self-test on GPU 0" env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 "${bin}" selftest
if [[ "${ngpus}" -ge 2 ]]; then
    run_suite 2
    if [[ "${ngpus}" -gt 2 ]]; then
        run_suite "${ngpus}"
    fi
else
    echo "run-cuda.sh: fewer than 2 GPUs, multi-process suite skipped"
fi
echo
if [[ ${status} -eq 0 ]]; then echo "run-cuda.sh: all steps passed"; else echo "run-cuda.sh: some steps FAILED"; fi
exit ${status}
