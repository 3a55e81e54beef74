#!/usr/bin/env bash
# Checks oxccl on an AMD Instinct MI300X node in one command: builds against the node's
# ROCm (ci/gpu/build-rocm.sh), then runs what the H200 sessions run (ci/gpu/session.sh,
# one-gpu.sh, run-cuda.sh), adapted to ROCm, and writes the same tables:
#
#   build        ci/gpu/build-rocm.sh: hal-rocm's fake-runtime tests, then oxccl-gpu-suite,
#                oxccl-perf and liboxccl_nccl.so (--features rocm) into .gpu/rocm/
#   hal          the kernels' self-test on GPU 0; the channel table (MemoryChannel,
#                PortChannel, copy engine) on 2 and on all GPUs
#   allreduce    the correctness matrix: every ROCm allreduce algorithm forced x data types
#                x in place / out of place, odd counts, every operator, accumulation f32,
#                unregistered buffers; each size checked bit for bit against the host
#                reference (output poisoned first); on 2 and on all GPUs
#   collectives  all-gather, reduce-scatter, all-to-all, broadcast, reduce: every algorithm
#                x type x placement checked, then each against RCCL
#   perf         bf16 sum allreduce 1K..1G against RCCL in the same run (--compare nccl
#                loads librccl), JSON tables under $OUT, on 2 and on all GPUs
#   nccl-api     PyTorch (ROCm build, backend="nccl" = RCCL) with and without
#                liboxccl_nccl.so preloaded (ci/gpu/run-torch-nccl-api.sh), when torch is
#                importable
#
# Timing is eager (calls queued between two HIP events): HIP graphs are not in hal-rocm
# yet, so --graph would fall back to eager anyway; the CUDA tables use graph replay, so
# compare MI300X figures with RCCL's in the same table, not with the H200 tables.
# Not on ROCm (CUDA-only today): the hal-cuda GPU tests and the gpu-suite's multi-process
# HAL suite (cuda_suite.rs), oneshot_ll128 (NVLink line atomicity), compute-sanitizer.
#
# NOT RUN BY THIS PROJECT: no AMD GPU has been available to it, so there are no MI300X
# results; this script is for a user who has the hardware. Please send back $OUT.
#
# Usage:   ci/gpu/run-rocm.sh [PHASE...]    (default: build hal allreduce collectives perf nccl-api)
# Env:     ROCM_PATH            ROCm prefix (default /opt/rocm)
#          OUT                  where tables, logs and the summary go (default .gpu/results-rocm)
#          OXCCL_ROCM_BIN       binaries (default .gpu/rocm, written by the build phase)
#          OXCCL_ROCM_GPUS      world sizes (default "2 N" for N GPUs; 2 alone when N = 2)
#          OXCCL_NCCL_LIB_PATH  the RCCL to compare with and forward to (default: librccl.so.1,
#                               $ROCM_PATH/lib, /opt/rocm/lib; PyTorch's own for nccl-api)
#          OXCCL_STEP_TIMEOUT   seconds per step (default 300)
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${repo_root}"

export ROCM_PATH="${ROCM_PATH:-/opt/rocm}"
bin="${OXCCL_ROCM_BIN:-${repo_root}/.gpu/rocm}"
out="${OUT:-${repo_root}/.gpu/results-rocm}"
step_timeout="${OXCCL_STEP_TIMEOUT:-300}"
mkdir -p "${out}/logs"
phases=("$@")
[[ ${#phases[@]} -gt 0 ]] || phases=(build hal allreduce collectives perf nccl-api)

# The multicast gate stays closed (MI300X has none; the HAL refuses it on ROCm anyway).
unset OXCCL_NVLS
export NCCL_NVLS_ENABLE=0 OXCCL_TIMEOUT_MS="${OXCCL_TIMEOUT_MS:-20000}"
# The runtime and RCCL are found even where ROCm's lib directory is not on the loader path.
export LD_LIBRARY_PATH="${ROCM_PATH}/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"

summary=()
step() { # step NAME CMD...: runs with a timeout, log under $OUT/logs, verdict in the summary
    local name="$1"
    shift
    local log="${out}/logs/$(echo "${name}" | tr -c 'A-Za-z0-9._-' '_').log"
    echo
    echo "=== ${name}"
    local t0=${SECONDS}
    timeout --kill-after=20 "${step_timeout}" "$@" >"${log}" 2>&1
    local rc=$?
    tail -n 40 "${log}"
    if ((rc == 0)); then
        summary+=("ok    ${name} ($((SECONDS - t0))s)")
    else
        summary+=("FAIL  ${name} (exit ${rc}$( ((rc == 124)) && echo ', timed out'), $((SECONDS - t0))s)")
    fi
}
skip() { summary+=("SKIP  $1"); }

count_gpus() {
    # One "Name: gfxNNN" line per GPU agent (CPU agents have other names).
    "${ROCM_PATH}/bin/rocminfo" 2>/dev/null | grep -cE '^[[:space:]]*Name:[[:space:]]+gfx' || true
}
visible() { seq -s, 0 $(("$1" - 1)); }
torchrun_n() { # torchrun_n N CMD...: one process per GPU with torchrun's variables
    local n="$1" r rc=0
    shift
    if command -v torchrun >/dev/null 2>&1; then
        torchrun --standalone --no-python --nproc_per_node="${n}" "$@"
        return
    fi
    local pids=()
    for ((r = 0; r < n; r++)); do
        RANK=${r} WORLD_SIZE=${n} LOCAL_RANK=${r} LOCAL_WORLD_SIZE=${n} MASTER_ADDR=127.0.0.1 \
            MASTER_PORT="${MASTER_PORT:-29500}" "$@" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "${p}" || rc=1; done
    return ${rc}
}

ngpus="$(count_gpus)"
if [[ -n "${OXCCL_ROCM_GPUS:-}" ]]; then
    worlds=(${OXCCL_ROCM_GPUS})
elif ((ngpus > 2)); then
    worlds=(2 "${ngpus}")
else
    worlds=(2)
fi
{
    echo "run-rocm.sh: $(date -u '+%F %T UTC'), ${ngpus} GPU(s), phases ${phases[*]}, results ${out}"
    echo "ROCm: $(cat "${ROCM_PATH}/.info/version" 2>/dev/null || echo unknown) in ${ROCM_PATH}"
    "${ROCM_PATH}/bin/rocminfo" 2>/dev/null | grep -E '^[[:space:]]*(Marketing Name|Name):[[:space:]]+(gfx|AMD Instinct)' | sort | uniq -c
    "${ROCM_PATH}/bin/rocm-smi" --showtopo 2>/dev/null | head -40
} | tee "${out}/topology.txt"

perf=("${bin}/oxccl-perf")
q=(-w 1 --iters 2)
for phase in "${phases[@]}"; do
    case "${phase}" in
    build)
        step "build (ci/gpu/build-rocm.sh)" env OXCCL_ROCM_BIN="${bin}" bash ci/gpu/build-rocm.sh
        ;;
    hal)
        if ((ngpus < 1)); then skip "hal: no AMD GPU found (rocminfo lists none)"; continue; fi
        step "kernels self-test on GPU 0" env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 "${bin}/oxccl-gpu-suite" selftest
        for n in "${worlds[@]}"; do
            ((ngpus >= n)) || { skip "channels on ${n} GPUs (${ngpus} present)"; continue; }
            step "channels on ${n} GPUs" env HIP_VISIBLE_DEVICES="$(visible "${n}")" MASTER_PORT=$((29600 + n)) \
                bash -c "$(declare -f torchrun_n); torchrun_n ${n} '${bin}/oxccl-gpu-suite' channels --timeout 120"
        done
        skip "multi-process HAL suite (oxccl-gpu-suite suite is CUDA-only: ci/gpu-suite/src/cuda_suite.rs)"
        ;;
    allreduce)
        for n in "${worlds[@]}"; do
            ((ngpus >= n)) || { skip "allreduce on ${n} GPUs (${ngpus} present)"; continue; }
            export HIP_VISIBLE_DEVICES="$(visible "${n}")"
            # oneshot_ll128 is refused on ROCm (it needs NVLink's 128-byte store atomicity).
            for algo in oneshot_ll twoshot twoshot_zc twoshot_push port_channel; do
                if [[ ${algo} == oneshot_* ]]; then max=1M; else max=256M; fi
                for dtype in bf16 f32 fp8_e4m3b15; do
                    step "check ${n}gpu ${algo} ${dtype} 2B..${max}" env OXCCL_ALGO="${algo}" \
                        "${perf[@]}" -N "${n}" -b 2 -e "${max}" -f 4 -d "${dtype}" "${q[@]}"
                    step "check ${n}gpu ${algo} ${dtype} in-place odd 1003B..${max}" env OXCCL_ALGO="${algo}" \
                        "${perf[@]}" -N "${n}" -b 1003 -e "${max}" -f 7 -d "${dtype}" --in-place "${q[@]}"
                done
                for dtype in f16 fp8_e4m3 fp8_e5m2 fp8_e4m3fnuz fp8_e5m2fnuz i8 u32 i64 f64; do
                    step "check ${n}gpu ${algo} ${dtype} 2B..${max}" env OXCCL_ALGO="${algo}" \
                        "${perf[@]}" -N "${n}" -b 2 -e "${max}" -f 8 -d "${dtype}" "${q[@]}"
                done
            done
            step "check ${n}gpu oneshot_ll128 refused on ROCm" bash -c \
                "! OXCCL_ALGO=oneshot_ll128 '${bin}/oxccl-perf' -N ${n} -b 1K -e 1K 2>&1 | grep -q '^# PASS'"
            for dtype in i32 u8 f64; do
                for op in sum prod min max avg; do
                    step "check ${n}gpu auto ${dtype} ${op} odd in-place" "${perf[@]}" -N "${n}" -b 1003 -e 16M -f 7 \
                        -d "${dtype}" -o "${op}" --in-place "${q[@]}"
                done
            done
            for op in prod min max avg; do
                step "check ${n}gpu auto bf16 ${op}" "${perf[@]}" -N "${n}" -b 4 -e 16M -f 16 -d bf16 -o "${op}" "${q[@]}"
            done
            step "check ${n}gpu auto bf16 accum f32" "${perf[@]}" -N "${n}" -b 4 -e 16M -f 16 -d bf16 --accum f32 "${q[@]}"
            step "check ${n}gpu auto e4m3b15 accum native" "${perf[@]}" -N "${n}" -b 4 -e 16M -f 16 -d fp8_e4m3b15 --accum native "${q[@]}"
            step "check ${n}gpu auto bf16 unregistered" "${perf[@]}" -N "${n}" -b 1K -e 64M -f 8 -d bf16 --no-register "${q[@]}"
            step "check ${n}gpu auto f32 unregistered odd in-place" "${perf[@]}" -N "${n}" -b 1003 -e 256M -f 7 -d f32 \
                --in-place --no-register "${q[@]}"
        done
        unset HIP_VISIBLE_DEVICES
        ;;
    collectives)
        for n in "${worlds[@]}"; do
            ((ngpus >= n)) || { skip "collectives on ${n} GPUs (${ngpus} present)"; continue; }
            export HIP_VISIBLE_DEVICES="$(visible "${n}")"
            for c in allgather reducescatter alltoall broadcast reduce; do
                kinds="oneshot_ll staged direct"
                # No LL one-shot (broadcast.cu, reduce.cu).
                [[ ${c} == broadcast || ${c} == reduce ]] && kinds="staged direct"
                for kind in ${kinds}; do
                    algo="${c}_${kind}"
                    if [[ ${kind} == oneshot_ll ]]; then max=1M; else max=256M; fi
                    reg=()
                    [[ ${kind} == staged ]] && reg=(--no-register)
                    for dtype in bf16 f32 fp8_e4m3; do
                        step "check ${n}gpu ${algo} ${dtype} 2B..${max}" env OXCCL_ALGO="${algo}" \
                            "${perf[@]}" -c "${c}" -N "${n}" -b 2 -e "${max}" -f 4 -d "${dtype}" "${reg[@]}" "${q[@]}"
                    done
                    [[ ${c} == alltoall ]] && continue # NCCL/RCCL define no in-place all-to-all
                    step "check ${n}gpu ${algo} bf16 in-place odd 1003B..${max}" env OXCCL_ALGO="${algo}" \
                        "${perf[@]}" -c "${c}" -N "${n}" -b 1003 -e "${max}" -f 7 -d bf16 --in-place "${reg[@]}" "${q[@]}"
                done
            done
            for c in allgather reducescatter alltoall broadcast reduce; do
                step "perf ${n}gpu ${c} bf16 vs RCCL" "${perf[@]}" -c "${c}" -N "${n}" -b 1K -e 1G -f 2 \
                    -d bf16 -w 5 --iters 20 --compare nccl --json "${out}/${c}-bf16-${n}gpu.json"
            done
        done
        unset HIP_VISIBLE_DEVICES
        ;;
    perf)
        for n in "${worlds[@]}"; do
            ((ngpus >= n)) || { skip "perf on ${n} GPUs (${ngpus} present)"; continue; }
            export HIP_VISIBLE_DEVICES="$(visible "${n}")"
            step "perf ${n}gpu bf16 sum vs RCCL" "${perf[@]}" -N "${n}" -b 1K -e 1G -f 2 -d bf16 \
                -w 5 --iters 20 --compare nccl --json "${out}/allreduce-bf16-${n}gpu.json" \
                --plot "${out}/allreduce-bf16-${n}gpu.png"
            step "perf ${n}gpu f32 sum vs RCCL" "${perf[@]}" -N "${n}" -b 1K -e 256M -f 4 -d f32 \
                -w 5 --iters 20 --compare nccl --json "${out}/allreduce-f32-${n}gpu.json"
            # Threshold data (no RCCL): one-shot vs the two-shots over the crossover range.
            for algo in oneshot_ll twoshot_zc twoshot_push; do
                step "sweep ${n}gpu ${algo} 1K..2M" env OXCCL_ALGO="${algo}" "${perf[@]}" -N "${n}" \
                    -b 1K -e 2M -f 2 -d bf16 -w 5 --iters 20 --json "${out}/sweep-${algo}-${n}gpu.json"
            done
        done
        unset HIP_VISIBLE_DEVICES
        ;;
    nccl-api)
        if ! python3 -c 'import torch; assert torch.version.hip' >/dev/null 2>&1; then
            skip "nccl-api: no ROCm build of PyTorch importable by python3"
            continue
        fi
        # The real library oxccl forwards to: the RCCL PyTorch ships, unless set.
        rccl="${OXCCL_NCCL_LIB_PATH:-$(python3 -c 'import glob, os, torch; l = sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "librccl.so*"))); print(l[0] if l else "")' 2>/dev/null)}"
        for n in "${worlds[@]}"; do
            ((ngpus >= n)) || { skip "nccl-api on ${n} GPUs (${ngpus} present)"; continue; }
            step "torch ${n}gpu with and without liboxccl_nccl.so" env HIP_VISIBLE_DEVICES="$(visible "${n}")" \
                OUT="${out}" OXCCL_STEP_TIMEOUT=120 ${rccl:+OXCCL_NCCL_LIB_PATH="${rccl}"} \
                bash ci/gpu/run-torch-nccl-api.sh "${bin}/liboxccl_nccl.so" "${n}"
        done
        ;;
    *)
        echo "run-rocm.sh: unknown phase ${phase} (build hal allreduce collectives perf nccl-api)" >&2
        exit 2
        ;;
    esac
done

{
    echo
    echo "== run-rocm.sh: ${ngpus} GPU(s), $((SECONDS / 60)) min =="
    printf '%s\n' "${summary[@]}"
} | tee "${out}/summary.txt"
! grep -q '^FAIL' "${out}/summary.txt"
