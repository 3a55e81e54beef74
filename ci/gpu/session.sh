#!/usr/bin/env bash
# One GPU-machine session, in phases that each fit a 10-minute call. Binaries come from
# .gpu/ (built here by ci/gpu/build-cuda.sh, ci/gpu/build-perf.sh and the hal-cuda GPU test
# binary copied to .gpu/hal-cuda-gpu-tests). Logs go to $OUT (or .gpu/results).
#
#     ci/gpu/session.sh hal        # topology, hal-cuda GPU tests, kernels self-test,
#                                  # multi-process suite on 2 and 4 GPUs, channels tables
#     ci/gpu/session.sh allreduce  # correctness matrix (ci/gpu/run-allreduce.sh, part 1)
#     ci/gpu/session.sh collectives # all-gather, reduce-scatter, all-to-all, broadcast, reduce: every algorithm
#                                  # x type x placement checked, then each vs NCCL (graph)
#     ci/gpu/session.sh latency    # 1K..4M vs NCCL: early launch on/off, and an earlier
#                                  # build in .gpu/base/ when there is one
#     ci/gpu/session.sh probe      # where a small call's time goes (ci/gpu/probe/), 2 GPUs
#     ci/gpu/session.sh perf       # bf16 sum vs NCCL, graph replay, 2 and 4 GPUs
#     ci/gpu/session.sh tune       # tuner (graph replay), then bf16 vs NCCL with the tuned
#                                  # table and checks of every dtype with it; port_channel
#     ci/gpu/session.sh torch      # PyTorch with liboxccl_nccl.so preloaded vs plain NCCL
#
# NVLS is never used: NCCL_NVLS_ENABLE=0 is exported and OXCCL_NVLS is unset, so no
# multicast object is created by NCCL or by oxccl. A step starts only while the phase's
# time budget (OXCCL_SESSION_BUDGET seconds, default 540) has room for its timeout.
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${repo_root}"
phase="${1:?usage: ci/gpu/session.sh hal|allreduce|collectives|latency|probe|perf|tune|torch}"
out="${OUT:-${repo_root}/.gpu/results}"
# Step logs go to one folder that is packed at the end: the device tool returns few files.
logs="$(mktemp -d /tmp/oxccl-session-logs.XXXXXX)"
mkdir -p "${out}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset OXCCL_NVLS
budget="${OXCCL_SESSION_BUDGET:-540}"
start=${SECONDS}
ngpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
summary=()

step() { # step NAME TIMEOUT CMD...
    local name="$1" limit="$2"
    shift 2
    if ((SECONDS - start + limit > budget)); then
        summary+=("SKIP  ${name} (no time left in this phase)")
        return
    fi
    local log="${logs}/$(echo "${name}" | tr -c 'A-Za-z0-9._-' '_').log"
    echo
    echo "=== ${name}"
    local t0=${SECONDS}
    timeout --kill-after=15 "${limit}" "$@" >"${log}" 2>&1
    local rc=$?
    tail -n 60 "${log}"
    if ((rc == 0)); then
        summary+=("ok    ${name} ($((SECONDS - t0))s)")
    else
        summary+=("FAIL  ${name} (exit ${rc}$( ((rc == 124)) && echo ', timed out'), $((SECONDS - t0))s)")
    fi
}

suite_dir() { mktemp -d /tmp/oxccl-suite.XXXXXX; }
torchrun_n() { # torchrun_n N CMD...
    local n="$1"
    shift
    torchrun --standalone --no-python --nproc_per_node="${n}" "$@"
}

case "${phase}" in
hal)
    nvidia-smi topo -m >"${logs}/topology.txt" 2>&1
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm --format=csv >>"${logs}/topology.txt" 2>&1
    cat "${logs}/topology.txt"
    step "hal-cuda GPU tests" 120 .gpu/hal-cuda-gpu-tests --test-threads=1 --nocapture
    step "kernels self-test on GPU 0" 120 env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 .gpu/oxccl-gpu-suite selftest
    for n in 2 4; do
        ((ngpus >= n)) || continue
        step "suite on ${n} GPUs" 120 env OXCCL_SUITE_DIR="$(suite_dir)" OXCCL_SUITE_RUN_ID="n${n}" \
            bash -c "$(declare -f torchrun_n); torchrun_n ${n} .gpu/oxccl-gpu-suite suite --timeout 90"
    done
    for n in 2 4; do
        ((ngpus >= n)) || continue
        step "channels on ${n} GPUs" 150 env MASTER_PORT=$((29600 + n)) \
            bash -c "$(declare -f torchrun_n); torchrun_n ${n} .gpu/oxccl-gpu-suite channels --timeout 120"
    done
    ;;
allreduce)
    export OXCCL_TIMEOUT_MS=20000
    q=(-w 1 --iters 2)
    for n in ${OXCCL_SESSION_GPUS:-2 4}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((n - 1)))"
        for algo in oneshot_ll oneshot_ll128 twoshot twoshot_zc twoshot_push; do
            if [[ ${algo} == oneshot_* ]]; then max=1M; else max=256M; fi
            # oxccl-perf registers its buffers: twoshot_zc runs zero-copy, twoshot_push
            # stores into the peers' outputs, twoshot forced still takes the staging path.
            for dtype in bf16 f32 fp8_e4m3b15; do
                step "check ${n}gpu ${algo} ${dtype} 2B..${max}" 60 env OXCCL_ALGO="${algo}" \
                    .gpu/oxccl-perf -N "${n}" -b 2 -e "${max}" -f 4 -d "${dtype}" "${q[@]}"
                step "check ${n}gpu ${algo} ${dtype} in-place odd 1003B..${max}" 60 env OXCCL_ALGO="${algo}" \
                    .gpu/oxccl-perf -N "${n}" -b 1003 -e "${max}" -f 7 -d "${dtype}" --in-place "${q[@]}"
            done
            for dtype in f16 fp8_e4m3 fp8_e5m2 i8 u32 i64 f64; do
                step "check ${n}gpu ${algo} ${dtype} 2B..${max}" 60 env OXCCL_ALGO="${algo}" \
                    .gpu/oxccl-perf -N "${n}" -b 2 -e "${max}" -f 8 -d "${dtype}" "${q[@]}"
            done
        done
        for dtype in i32 u8 f64; do
            for op in sum prod min max avg; do
                step "check ${n}gpu auto ${dtype} ${op} odd in-place" 60 .gpu/oxccl-perf -N "${n}" -b 1003 -e 16M -f 7 \
                    -d "${dtype}" -o "${op}" --in-place "${q[@]}"
            done
        done
        for op in prod min max avg; do
            step "check ${n}gpu auto bf16 ${op}" 60 .gpu/oxccl-perf -N "${n}" -b 4 -e 16M -f 16 -d bf16 -o "${op}" "${q[@]}"
        done
        step "check ${n}gpu auto bf16 accum f32" 60 .gpu/oxccl-perf -N "${n}" -b 4 -e 16M -f 16 -d bf16 --accum f32 "${q[@]}"
        step "check ${n}gpu auto e4m3b15 accum native" 60 .gpu/oxccl-perf -N "${n}" -b 4 -e 16M -f 16 -d fp8_e4m3b15 --accum native "${q[@]}"
        step "check ${n}gpu auto bf16 graph" 60 .gpu/oxccl-perf -N "${n}" -b 1K -e 64M -f 8 -d bf16 --graph "${q[@]}"
        step "check ${n}gpu auto bf16 unregistered" 60 .gpu/oxccl-perf -N "${n}" -b 1K -e 64M -f 8 -d bf16 --no-register "${q[@]}"
        step "check ${n}gpu push unregistered bf16 odd in-place 1003B..256M" 60 env OXCCL_ALGO=twoshot_push \
            .gpu/oxccl-perf -N "${n}" -b 1003 -e 256M -f 7 -d bf16 --in-place --no-register "${q[@]}"
        step "check ${n}gpu push unregistered f32 graph 1K..256M" 60 env OXCCL_ALGO=twoshot_push \
            .gpu/oxccl-perf -N "${n}" -b 1K -e 256M -f 8 -d f32 --graph --no-register "${q[@]}"
    done
    ;;
collectives)
    # Correctness first (every size checked bit for bit against the host reference, the
    # output poisoned first), then one table per collective against NCCL in the same run.
    export OXCCL_TIMEOUT_MS=20000
    q=(-w 1 --iters 2)
    for n in ${OXCCL_SESSION_GPUS:-2 4}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((n - 1)))"
        for c in allgather reducescatter alltoall broadcast reduce; do
            kinds="oneshot_ll staged direct"
            # No LL one-shot (broadcast.cu, reduce.cu).
            [[ ${c} == broadcast || ${c} == reduce ]] && kinds="staged direct"
            for kind in ${kinds}; do
                algo="${c}_${kind}"
                if [[ ${kind} == oneshot_ll ]]; then max=1M; else max=256M; fi
                # oxccl-perf registers its buffers (direct needs that); staged gets them
                # unregistered.
                reg=(); [[ ${kind} == staged ]] && reg=(--no-register)
                for dtype in bf16 f32 fp8_e4m3; do
                    step "check ${n}gpu ${algo} ${dtype} 2B..${max}" 60 env OXCCL_ALGO="${algo}" \
                        .gpu/oxccl-perf -c "${c}" -N "${n}" -b 2 -e "${max}" -f 4 -d "${dtype}" "${reg[@]}" "${q[@]}"
                done
                [[ ${c} == alltoall ]] && continue # NCCL defines no in-place all-to-all
                step "check ${n}gpu ${algo} bf16 in-place odd 1003B..${max}" 60 env OXCCL_ALGO="${algo}" \
                    .gpu/oxccl-perf -c "${c}" -N "${n}" -b 1003 -e "${max}" -f 7 -d bf16 --in-place "${reg[@]}" "${q[@]}"
            done
            step "check ${n}gpu ${c} auto bf16 graph" 60 .gpu/oxccl-perf -c "${c}" -N "${n}" -b 1K -e 64M -f 8 \
                -d bf16 --graph "${q[@]}"
        done
        for c in allgather reducescatter alltoall broadcast reduce; do
            step "perf ${n}gpu ${c} bf16 vs NCCL graph" 150 .gpu/oxccl-perf -c "${c}" -N "${n}" -b 1K -e 1G -f 2 \
                -d bf16 -w 5 --iters 20 --graph --compare nccl --json "${out}/${c}-bf16-${n}gpu.json"
        done
    done
    ;;
latency)
    # Small sizes against NCCL, the current build with early launch on and off, and, when
    # .gpu/base/oxccl-perf exists (a build of an earlier commit), that build too; twice,
    # interleaved, so drift between runs shows as the spread of each.
    for n in ${OXCCL_SESSION_GPUS:-2 4}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((n - 1)))"
        for round in 1 2; do
            for variant in early plain base; do
                bin=.gpu/oxccl-perf
                env=(OXCCL_EARLY_LAUNCH=1)
                case ${variant} in
                plain) env=(OXCCL_EARLY_LAUNCH=0) ;;
                base)
                    bin=.gpu/base/oxccl-perf
                    [[ -x ${bin} ]] || continue
                    ;;
                esac
                step "latency ${n}gpu ${variant} round ${round} bf16 1K..4M vs NCCL graph" 60 env "${env[@]}" \
                    "${bin}" -N "${n}" -b 1K -e 4M -f 2 -d bf16 -w 5 --iters 20 --graph --compare nccl \
                    --json "${out}/latency-${variant}-${round}-${n}gpu.json"
            done
        done
    done
    ;;
probe)
    # The probe's object is compiled here by ci/gpu/build-probe.sh (nvcc takes minutes on
    # the kernels it includes); the device links it with its own CUDA runtime.
    export CUDA_VISIBLE_DEVICES=0,1
    if ((ngpus >= 2)) && [[ -f .gpu/probe/latency_probe.o ]]; then
        step "link latency probe" 60 nvcc -arch=sm_90 .gpu/probe/latency_probe.o -o "${logs}/latency_probe"
        step "latency probe 2gpu" 120 "${logs}/latency_probe" 2000 7
    else
        summary+=("SKIP  latency probe (needs 2 GPUs and .gpu/probe/latency_probe.o)")
    fi
    ;;
perf)
    for n in ${OXCCL_SESSION_GPUS:-2 4}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((n - 1)))"
        step "perf ${n}gpu bf16 sum vs NCCL graph" 150 .gpu/oxccl-perf -N "${n}" -b 1K -e 1G -f 2 -d bf16 \
            -w 5 --iters 20 --graph --compare nccl --json "${out}/allreduce-bf16-${n}gpu.json"
    done
    # Threshold data (no NCCL): one-shot vs zero-copy two-shot over the crossover range.
    for n in ${OXCCL_SESSION_GPUS:-4 2}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((n - 1)))"
        for algo in oneshot_ll oneshot_ll128 twoshot_zc twoshot_push; do
            step "sweep ${n}gpu ${algo} 1K..2M" 60 env OXCCL_ALGO="${algo}" .gpu/oxccl-perf -N "${n}" \
                -b 1K -e 2M -f 2 -d bf16 -w 5 --iters 20 --graph --json "${out}/sweep-${algo}-${n}gpu.json"
        done
    done
    ;;
tune)
    # Tables go to $OUT so they come back; every perf run below loads them (same build).
    export OXCCL_TUNE_DIR="${out}/tune" OXCCL_TIMEOUT_MS=20000
    q=(-w 1 --iters 2)
    for n in ${OXCCL_SESSION_GPUS:-2 4}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((n - 1)))"
        step "tune ${n}gpu bf16 (force) + perf vs NCCL graph" 180 .gpu/oxccl-perf -N "${n}" -b 1K -e 1G -f 2 \
            -d bf16 -w 5 --iters 20 --graph --compare nccl --tune force \
            --json "${out}/allreduce-bf16-${n}gpu-tuned.json"
        step "tune ${n}gpu f32 + check" 120 .gpu/oxccl-perf -N "${n}" -b 3 -e 256M -f 7 -d f32 --tune cache "${q[@]}"
        for dtype in bf16 f16 fp8_e4m3 fp8_e4m3b15; do
            step "check ${n}gpu tuned-bf16-table ${dtype} odd in-place graph" 60 .gpu/oxccl-perf -N "${n}" \
                -b 1003 -e 256M -f 7 -d "${dtype}" --in-place --graph --tune cache "${q[@]}"
        done
        step "check ${n}gpu tuned bf16 unregistered" 60 .gpu/oxccl-perf -N "${n}" -b 1K -e 64M -f 4 -d bf16 \
            --no-register --tune cache "${q[@]}"
        for dtype in bf16 f32 fp8_e4m3b15; do
            step "check ${n}gpu port_channel ${dtype} 2B..64M" 90 env OXCCL_ALGO=port_channel \
                .gpu/oxccl-perf -N "${n}" -b 2 -e 64M -f 7 -d "${dtype}" "${q[@]}"
        done
        step "perf ${n}gpu port_channel bf16 graph" 90 env OXCCL_ALGO=port_channel .gpu/oxccl-perf -N "${n}" \
            -b 1K -e 256M -f 4 -d bf16 -w 3 --iters 10 --graph --json "${out}/port-channel-bf16-${n}gpu.json"
    done
    ;;
torch)
    for n in ${OXCCL_SESSION_GPUS:-2 4}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((n - 1)))"
        step "torch ${n}gpu with and without liboxccl_nccl.so" 270 env OXCCL_STEP_TIMEOUT=120 \
            bash ci/gpu/run-torch-nccl-api.sh "${repo_root}/.gpu/liboxccl_nccl.so" "${n}"
    done
    ;;
*)
    echo "unknown phase ${phase}" >&2
    exit 2
    ;;
esac

{
    echo "== session ${phase}: ${ngpus} GPUs, $((SECONDS - start))s =="
    printf '%s\n' "${summary[@]}"
} | tee "${out}/summary-${phase}.txt"
tar czf "${out}/logs-${phase}.tar.gz" -C "${logs}" . && rm -rf "${logs}"
! grep -q '^FAIL' "${out}/summary-${phase}.txt"
