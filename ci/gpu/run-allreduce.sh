#!/usr/bin/env bash
# Allreduce on the GPU machine with .gpu/bin/oxccl-perf (built by ci/gpu/build-cuda.sh):
#   1. correctness matrix on 2 and 4 GPUs: every algorithm forced through OXCCL_ALGO x data
#      types x out-of-place/in-place, sizes from 2 bytes (1 element) to 64 MB plus odd
#      counts, one 256 MB run, every op and an f32 accumulator on the auto selection;
#      every size is checked bit for bit against the host reference (non-zero exit = wrong);
#   2. bf16 sum tables against NCCL in the same run (graph replay), 1 KB .. 1 GB, factor 2,
#      on 2 and on 4 GPUs; JSON under $OUT (or .gpu/results).
# NVLS stays off (NCCL_NVLS_ENABLE=0, OXCCL_NVLS unset). Each step has a timeout.
#
#     ci/gpu/run-allreduce.sh [BINARY]
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${1:-${repo_root}/.gpu/bin/oxccl-perf}"
step_timeout="${OXCCL_STEP_TIMEOUT:-240}"
results="${OUT:-${repo_root}/.gpu/results}"
export NCCL_NVLS_ENABLE=0
unset OXCCL_NVLS
export OXCCL_TIMEOUT_MS="${OXCCL_TIMEOUT_MS:-20000}"
mkdir -p "${results}"

if [[ ! -x "${bin}" ]]; then
    echo "run-allreduce.sh: ${bin} not found; build it with ci/gpu/build-cuda.sh" >&2
    exit 2
fi
ngpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
echo "run-allreduce.sh: ${ngpus} GPUs; binary ${bin}; results in ${results}"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null || true

status=0
failed=()
step() {
    local name="$1"
    shift
    echo
    echo "=== ${name}"
    timeout --kill-after=20 "${step_timeout}" "$@"
    local rc=$?
    if [[ ${rc} -ne 0 ]]; then
        echo "=== ${name}: FAILED (exit ${rc}$([[ ${rc} -eq 124 ]] && echo ', timed out'))"
        failed+=("${name}")
        status=1
    fi
}

worlds=()
for w in 2 4; do
    if [[ "${ngpus}" -ge "${w}" ]]; then worlds+=("${w}"); fi
done
devices() { seq -s, 0 $(("$1" - 1)); }

# ---- 1. correctness -----------------------------------------------------------------------
quick=(-w 1 --iters 1)
for w in "${worlds[@]}"; do
    export CUDA_VISIBLE_DEVICES="$(devices "${w}")"
    for algo in oneshot_ll twoshot; do
        # One-shot's packet scratch holds 1 MiB per rank.
        if [[ ${algo} == oneshot_ll ]]; then max=1M; odd_max=256K; else max=64M; odd_max=16M; fi
        for dtype in bf16 f16 f32 fp8_e4m3 fp8_e5m2 fp8_e4m3b15; do
            step "check ${w} GPUs ${algo} ${dtype} out-of-place 2B..${max}" \
                env OXCCL_ALGO="${algo}" "${bin}" -N "${w}" -b 2 -e "${max}" -f 8 -d "${dtype}" "${quick[@]}"
            step "check ${w} GPUs ${algo} ${dtype} in-place odd counts 1003B..${odd_max}" \
                env OXCCL_ALGO="${algo}" "${bin}" -N "${w}" -b 1003 -e "${odd_max}" -f 8 -d "${dtype}" --in-place "${quick[@]}"
        done
    done
    step "check ${w} GPUs twoshot bf16 256M" \
        env OXCCL_ALGO=twoshot "${bin}" -N "${w}" -b 256M -e 256M -d bf16 "${quick[@]}"
    for op in prod min max avg; do
        step "check ${w} GPUs auto bf16 ${op}" "${bin}" -N "${w}" -b 4 -e 16M -f 16 -d bf16 -o "${op}" "${quick[@]}"
    done
    step "check ${w} GPUs auto bf16 accum f32" "${bin}" -N "${w}" -b 4 -e 16M -f 16 -d bf16 --accum f32 "${quick[@]}"
    step "check ${w} GPUs auto fp8_e4m3b15 accum native" "${bin}" -N "${w}" -b 4 -e 16M -f 16 -d fp8_e4m3b15 --accum native "${quick[@]}"
done

# ---- 2. performance against NCCL (bf16 sum, graph replay) ----------------------------------
for w in "${worlds[@]}"; do
    export CUDA_VISIBLE_DEVICES="$(devices "${w}")"
    step "perf ${w} GPUs bf16 sum vs NCCL (graph)" \
        "${bin}" -N "${w}" -b 1K -e 1G -f 2 -d bf16 -w 5 --iters 20 --graph --compare nccl \
        --json "${results}/allreduce-bf16-${w}gpu.json"
done

echo
if [[ ${status} -ne 0 ]]; then
    echo "run-allreduce.sh: FAILED steps:"
    printf '  %s\n' "${failed[@]}"
else
    echo "run-allreduce.sh: all steps passed"
fi
exit ${status}
