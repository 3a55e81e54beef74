#!/usr/bin/env bash
# One GPU-machine session, in phases that each fit a 10-minute call. Binaries come from
# $BIN (default .gpu/bin, built here by ci/gpu/build-cuda.sh). Logs go to $OUT (or
# .gpu/results).
#
#     ci/gpu/session.sh hal        # topology, hal-cuda GPU tests, kernels self-test,
#                                  # multi-process suite on 2 and 4 GPUs, channels tables
#     ci/gpu/session.sh allreduce  # correctness matrix (ci/gpu/run-allreduce.sh, part 1)
#     ci/gpu/session.sh collectives # all-gather, reduce-scatter, all-to-all, broadcast, reduce: every algorithm
#                                  # x type x placement checked (no timing: see collperf)
#     ci/gpu/session.sh collperf   # each of those five vs NCCL (graph replay; NCCL's default
#                                  # and symmetric modes where it has them)
#     ci/gpu/session.sh collsweep  # each of their algorithms forced over 1K..4M (thresholds)
#     ci/gpu/session.sh latency    # 1K..4M vs NCCL: early launch on/off, and an earlier
#                                  # build in .gpu/base/ when there is one
#     ci/gpu/session.sh ab         # one oxccl-perf command, this build against .gpu/base (or
#                                  # against itself under OXCCL_AB_BASE_ENV), interleaved twice,
#                                  # each vs NCCL (OXCCL_AB_ARGS, OXCCL_AB_ALGO, OXCCL_AB_NEW_ENV)
#     ci/gpu/session.sh probe      # where a small call's time goes (ci/gpu/probe/), 2 GPUs
#     ci/gpu/session.sh bwprobe    # how fast large data moves between 2 GPUs: SM stores / loads,
#                                  # copy engines, both (ci/gpu/probe/bandwidth_probe.cu)
#     ci/gpu/session.sh reduceprobe # the 2-rank reduce's root loop in several shapes (block or
#                                  # grid stride, units per thread, pipelined) vs a peer-load copy
#     ci/gpu/session.sh ceoverlap  # does a copy-engine pull overlap SM work, per memory setup:
#                                  # cudaMalloc / VMM / VMM+RDMA, one process / two with IPC
#                                  # (ci/gpu/probe/ce_overlap_probe.cu)
#     ci/gpu/session.sh trace      # GPU timelines (ci/gpu/probe/gpu_trace.c, CUPTI) of the
#                                  # copy-lane algorithms at 1 GiB and of ce_overlap_probe
#     ci/gpu/session.sh copyengine # broadcast_copy (copy engine) vs broadcast_direct, vs NCCL
#     ci/gpu/session.sh copylane   # the copy-lane algorithms with the copy engine and with the
#                                  # copy kernel for the peers (OXCCL_COPY_LANE_PEERS), the
#                                  # direct kernels and NCCL, 64M..1G, graph replay
#     ci/gpu/session.sh reducecopy # reduce_copy (copy-engine pull + local reduce) vs
#                                  # reduce_direct, vs NCCL, over chunk sizes and grids
#     ci/gpu/session.sh reducerelay # reduce_relay vs reduce_direct on 4 and 3 GPUs, vs NCCL;
#                                  # reduce_relay and the one-shot in place
#     ci/gpu/session.sh torchpin   # PyTorch's eager small calls under several CPU bindings
#     ci/gpu/session.sh smallgraph # 1K..1M graph replay vs NCCL in about 15 s (between phases)
#     ci/gpu/session.sh autoreg    # unregistered eager allreduce: zero-copy through a per-call
#                                  # exchange vs the scratch, each vs NCCL
#     ci/gpu/session.sh perf       # bf16 sum vs NCCL (default and symmetric), graph replay
#     ci/gpu/session.sh tune       # tuner (graph replay), then bf16 vs NCCL with the tuned
#                                  # table and checks of every dtype with it; port_channel
#     ci/gpu/session.sh torch      # PyTorch with liboxccl_nccl.so preloaded vs plain NCCL
#     ci/gpu/session.sh torchvmm   # the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
#     ci/gpu/session.sh callcost   # host cost of one ncclAllReduce: real NCCL vs liboxccl_nccl.so
#     ci/gpu/session.sh faults     # ci/gpu/faults.sh: injected faults, one per case
#     ci/gpu/session.sh multinode  # ci/gpu/multinode.sh: PortChannel paths vs NCCL on sockets
#     ci/gpu/session.sh python     # ci/gpu/python.sh: the Python package's GPU suite
#     ci/gpu/session.sh group      # nccl_group_test: one thread drives every GPU
#     ci/gpu/session.sh sanitizer  # compute-sanitizer over the 2-rank correctness sweep
#     ci/gpu/session.sh soak       # oxccl-perf --soak: random collectives, checked, with
#                                  # memory / fd / mapping figures per minute
#
# OXCCL_SESSION_MATCH (a regex) runs only the steps whose names match it, e.g. the ones an
# earlier call skipped. OXCCL_SESSION_GPUS picks the world sizes (default "2 4"); OXCCL_SESSION_DEVICES picks the
# GPUs (a comma list, default all in order), so two sessions can run side by side on one
# 4-GPU machine, e.g. OXCCL_SESSION_DEVICES=2,3.
#
# NVLS is never used: NCCL_NVLS_ENABLE=0 is exported and OXCCL_NVLS is unset, so no
# multicast object is created by NCCL or by oxccl. A step starts only while the phase's
# time budget (OXCCL_SESSION_BUDGET seconds, default 540) has room for its timeout.
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${repo_root}"
phase="${1:?usage: ci/gpu/session.sh PHASE (see the top of this file)}"
BIN="${BIN:-.gpu/bin}"
out="${OUT:-${repo_root}/.gpu/results}"
# Step logs go to one folder that is packed at the end: the device tool returns few files.
logs="$(mktemp -d /tmp/oxccl-session-logs.XXXXXX)"
mkdir -p "${out}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset OXCCL_NVLS
budget="${OXCCL_SESSION_BUDGET:-540}"
# The real NCCL: torch's nvidia.nccl package (NCCL 2.28.9 on the lent machines) unless named.
if [[ -z ${OXCCL_NCCL_LIB_PATH:-} ]]; then
    guess="$(python3 -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)"
    [[ -f ${guess} ]] && export OXCCL_NCCL_LIB_PATH="${guess}"
fi
# A phase run again within one call ($OUT shared) gets its own summary, logs and, for the
# PyTorch phases, results folder: torch, then torch-2, ...
run_tag="${phase}"
k=2
while [[ -e "${out}/summary-${run_tag}.txt" ]]; do
    run_tag="${phase}-${k}"
    k=$((k + 1))
done
start=${SECONDS}
all_gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
devices_list="${OXCCL_SESSION_DEVICES:-$(seq -s, 0 $((all_gpus - 1)))}"
ngpus="$(tr ',' '\n' <<<"${devices_list}" | grep -c .)"
# devices N: the first N GPUs of this session's list, as CUDA_VISIBLE_DEVICES wants them.
devices() { tr ',' '\n' <<<"${devices_list}" | head -n "$1" | paste -sd,; }
summary=()

step() { # step NAME TIMEOUT CMD...
    local name="$1" limit="$2"
    shift 2
    # OXCCL_SESSION_MATCH (an extended regex) runs only the steps whose names match it.
    if [[ -n ${OXCCL_SESSION_MATCH:-} ]] && ! grep -qE "${OXCCL_SESSION_MATCH}" <<<"${name}"; then
        return
    fi
    # A step gets its own limit, or what is left of the phase when that is less but still
    # 45 s or more (most steps finish well inside their limit); a shortened step that runs
    # out says so in its FAIL line.
    local left=$((budget - (SECONDS - start) - 10)) note=""
    if ((limit > left)); then
        if ((left < 45)); then
            summary+=("SKIP  ${name} (no time left in this phase)")
            return
        fi
        limit=${left}
        note=", limit shortened to ${left}s"
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
        summary+=("FAIL  ${name} (exit ${rc}$( ((rc == 124)) && echo ', timed out'), $((SECONDS - t0))s${note})")
    fi
}

suite_dir() { mktemp -d /tmp/oxccl-suite.XXXXXX; }
# kinds_of COLLECTIVE: its algorithms' suffixes (COLLECTIVE_KIND).
kinds_of() {
    case $1 in
    alltoall) echo "oneshot_ll staged direct copy" ;;
    alltoallv) echo "oneshot_ll direct copy staged" ;;
    broadcast) echo "oneshot_ll staged direct relay copy" ;;
    reduce) echo "oneshot_ll staged direct relay copy" ;;
    *) echo "oneshot_ll staged direct" ;;
    esac
}
torchrun_n() { # torchrun_n N CMD...
    local n="$1"
    shift
    torchrun --standalone --no-python --nproc_per_node="${n}" "$@"
}

case "${phase}" in
hal)
    export CUDA_VISIBLE_DEVICES="${devices_list}"
    nvidia-smi topo -m >"${logs}/topology.txt" 2>&1
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm --format=csv >>"${logs}/topology.txt" 2>&1
    cat "${logs}/topology.txt"
    step "hal-cuda GPU tests" 120 "${BIN}/hal-cuda-gpu-tests" --test-threads=1 --nocapture
    [[ -x ${BIN}/hal-cuda-gpu-integration ]] &&
        step "hal-cuda GPU integration tests" 120 "${BIN}/hal-cuda-gpu-integration" --test-threads=1 --nocapture
    step "kernels self-test on GPU $(devices 1)" 120 env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 "${BIN}/oxccl-gpu-suite" selftest
    for n in 2 4; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(devices "${n}")"
        step "suite on ${n} GPUs" 120 env OXCCL_SUITE_DIR="$(suite_dir)" OXCCL_SUITE_RUN_ID="n${n}" \
            bash -c "$(declare -f torchrun_n); torchrun_n ${n} ${BIN}/oxccl-gpu-suite suite --timeout 90"
    done
    for n in 2 4; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(devices "${n}")"
        step "channels on ${n} GPUs" 150 env MASTER_PORT=$((29600 + n + 10 * ${devices_list:0:1})) \
            bash -c "$(declare -f torchrun_n); torchrun_n ${n} ${BIN}/oxccl-gpu-suite channels --timeout 120"
    done
    ;;
allreduce)
    export OXCCL_TIMEOUT_MS=20000
    q=(-w 1 --iters 2)
    for n in ${OXCCL_SESSION_GPUS:-2 4}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(devices "${n}")"
        for algo in oneshot_ll oneshot_ll128 twoshot twoshot_zc twoshot_push; do
            if [[ ${algo} == oneshot_* ]]; then max=1M; else max=256M; fi
            # oxccl-perf registers its buffers: twoshot_zc runs zero-copy, twoshot_push
            # stores into the peers' outputs, twoshot forced still takes the staging path.
            for dtype in bf16 f32 fp8_e4m3b15; do
                step "check ${n}gpu ${algo} ${dtype} 2B..${max}" 60 env OXCCL_ALGO="${algo}" \
                    "${BIN}/oxccl-perf" -N "${n}" -b 2 -e "${max}" -f 4 -d "${dtype}" "${q[@]}"
                step "check ${n}gpu ${algo} ${dtype} in-place odd 1003B..${max}" 60 env OXCCL_ALGO="${algo}" \
                    "${BIN}/oxccl-perf" -N "${n}" -b 1003 -e "${max}" -f 7 -d "${dtype}" --in-place "${q[@]}"
            done
            for dtype in f16 fp8_e4m3 fp8_e5m2 i8 u32 i64 f64; do
                step "check ${n}gpu ${algo} ${dtype} 2B..${max}" 60 env OXCCL_ALGO="${algo}" \
                    "${BIN}/oxccl-perf" -N "${n}" -b 2 -e "${max}" -f 8 -d "${dtype}" "${q[@]}"
            done
        done
        for dtype in i32 u8 f64; do
            for op in sum prod min max avg; do
                step "check ${n}gpu auto ${dtype} ${op} odd in-place" 60 "${BIN}/oxccl-perf" -N "${n}" -b 1003 -e 16M -f 7 \
                    -d "${dtype}" -o "${op}" --in-place "${q[@]}"
            done
        done
        for op in prod min max avg; do
            step "check ${n}gpu auto bf16 ${op}" 60 "${BIN}/oxccl-perf" -N "${n}" -b 4 -e 16M -f 16 -d bf16 -o "${op}" "${q[@]}"
        done
        step "check ${n}gpu auto bf16 accum f32" 60 "${BIN}/oxccl-perf" -N "${n}" -b 4 -e 16M -f 16 -d bf16 --accum f32 "${q[@]}"
        step "check ${n}gpu auto e4m3b15 accum native" 60 "${BIN}/oxccl-perf" -N "${n}" -b 4 -e 16M -f 16 -d fp8_e4m3b15 --accum native "${q[@]}"
        step "check ${n}gpu auto bf16 graph" 60 "${BIN}/oxccl-perf" -N "${n}" -b 1K -e 64M -f 8 -d bf16 --graph "${q[@]}"
        step "check ${n}gpu auto bf16 unregistered" 60 "${BIN}/oxccl-perf" -N "${n}" -b 1K -e 64M -f 8 -d bf16 --no-register "${q[@]}"
        step "check ${n}gpu push unregistered bf16 odd in-place 1003B..256M" 60 env OXCCL_ALGO=twoshot_push \
            "${BIN}/oxccl-perf" -N "${n}" -b 1003 -e 256M -f 7 -d bf16 --in-place --no-register "${q[@]}"
        step "check ${n}gpu push unregistered f32 graph 1K..256M" 60 env OXCCL_ALGO=twoshot_push \
            "${BIN}/oxccl-perf" -N "${n}" -b 1K -e 256M -f 8 -d f32 --graph --no-register "${q[@]}"
    done
    ;;
collectives)
    # Every size checked bit for bit against the host reference, the output poisoned first.
    export OXCCL_TIMEOUT_MS=20000
    q=(-w 1 --iters 2)
    for n in ${OXCCL_SESSION_GPUS:-2 4}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(devices "${n}")"
        for c in allgather reducescatter alltoall alltoallv broadcast reduce; do
            for kind in $(kinds_of "${c}"); do
                algo="${c}_${kind}"
                # reduce_copy serves 1-2 ranks (its root's one link would carry every peer's input).
                [[ ${algo} == reduce_copy ]] && ((n > 2)) && continue
                if [[ ${kind} == oneshot_ll ]]; then max=1M; else max=256M; fi
                # oxccl-perf registers its buffers (direct needs that); staged gets them
                # unregistered.
                reg=(); [[ ${kind} == staged ]] && reg=(--no-register)
                for dtype in bf16 f32 fp8_e4m3; do
                    step "check ${n}gpu ${algo} ${dtype} 2B..${max}" 60 env OXCCL_ALGO="${algo}" \
                        "${BIN}/oxccl-perf" -c "${c}" -N "${n}" -b 2 -e "${max}" -f 4 -d "${dtype}" "${reg[@]}" "${q[@]}"
                done
                [[ ${c} == alltoall* ]] && continue # NCCL defines no in-place all-to-all
                step "check ${n}gpu ${algo} bf16 in-place odd 1003B..${max}" 60 env OXCCL_ALGO="${algo}" \
                    "${BIN}/oxccl-perf" -c "${c}" -N "${n}" -b 1003 -e "${max}" -f 7 -d bf16 --in-place "${reg[@]}" "${q[@]}"
                # Out of place reduce_copy's chunks shrink to a tail (default 8 MiB): a 64 KiB
                # one makes many chunks at odd sizes, the last rank as the root.
                [[ ${algo} == reduce_copy ]] && step "check ${n}gpu ${algo} tail 64K bf16 root $((n - 1)) odd 1003B..${max}" \
                    60 env OXCCL_ALGO="${algo}" OXCCL_REDUCE_COPY_TAIL_KB=64 "${BIN}/oxccl-perf" -c "${c}" -N "${n}" \
                    -b 1003 -e "${max}" -f 7 -d bf16 -r $((n - 1)) "${reg[@]}" "${q[@]}"
            done
            step "check ${n}gpu ${c} auto bf16 graph" 60 "${BIN}/oxccl-perf" -c "${c}" -N "${n}" -b 1K -e 64M -f 8 \
                -d bf16 --graph "${q[@]}"
            # The last rank as the root, and integer / f64 data, with the selector's choice.
            if [[ ${c} == broadcast || ${c} == reduce ]]; then
                step "check ${n}gpu ${c} auto bf16 root $((n - 1)) odd" 60 "${BIN}/oxccl-perf" -c "${c}" -N "${n}" \
                    -b 1003 -e 64M -f 7 -d bf16 -r $((n - 1)) "${q[@]}"
            fi
            for dtype in i32 u8 f64; do
                step "check ${n}gpu ${c} auto ${dtype} odd" 60 "${BIN}/oxccl-perf" -c "${c}" -N "${n}" \
                    -b 1003 -e 64M -f 7 -d "${dtype}" "${q[@]}"
            done
        done
    done
    ;;
collperf)
    # One table per collective against NCCL in the same run (default and symmetric modes).
    for n in ${OXCCL_SESSION_GPUS:-2 4}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(devices "${n}")"
        for c in ${OXCCL_SESSION_COLLECTIVES:-allgather reducescatter alltoall alltoallv broadcast reduce}; do
            step "perf ${n}gpu ${c} bf16 vs NCCL graph" 150 "${BIN}/oxccl-perf" -c "${c}" -N "${n}" -b 1K -e 1G -f 2 \
                -d bf16 -w 5 --iters 20 --graph --compare nccl --json "${out}/${c}-bf16-${n}gpu.json"
            # PyTorch's broadcast is in place, and in place the root of a large broadcast has no
            # local copy (broadcast_copy takes the copy engine then).
            if [[ ${c} == broadcast ]]; then
                step "perf ${n}gpu broadcast bf16 in place vs NCCL graph" 150 "${BIN}/oxccl-perf" -c broadcast \
                    -N "${n}" -b 1K -e 1G -f 4 -d bf16 -w 5 --iters 20 --graph --in-place --compare nccl \
                    --json "${out}/broadcast-bf16-inplace-${n}gpu.json"
            fi
        done
    done
    ;;
collsweep)
    # Where the one-shot should hand over to the direct kernels: every algorithm of every
    # collective but allreduce forced over 1K..4M (no NCCL), graph replay.
    for n in ${OXCCL_SESSION_GPUS:-2 4}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(devices "${n}")"
        for c in allgather reducescatter alltoall broadcast reduce; do
            for kind in $(kinds_of "${c}"); do
                # reduce_copy serves 1-2 ranks (it refuses more with its clear error).
                ((n > 2)) && [[ ${c}_${kind} == reduce_copy ]] && continue
                # The one-shot's packet capacity: 2 MiB per rank on 2 ranks (a broadcast or
                # reduce of size S needs S per rank; the others S / 2).
                max=4M
                [[ ${kind} == oneshot_ll && (${c} == broadcast || ${c} == reduce) ]] && max=2M
                ((n > 2)) && [[ ${kind} == oneshot_ll ]] && max=1M
                reg=()
                [[ ${kind} == staged ]] && reg=(--no-register)
                step "sweep ${n}gpu ${c}_${kind} 1K..${max}" 60 env OXCCL_ALGO="${c}_${kind}" \
                    "${BIN}/oxccl-perf" -c "${c}" -N "${n}" -b 1K -e "${max}" -f 2 -d bf16 -w 5 --iters 20 \
                    --graph "${reg[@]}" --json "${out}/sweep-${c}_${kind}-${n}gpu.json"
            done
        done
    done
    ;;
latency)
    # Small sizes against NCCL, the current build with early launch on and off, and, when
    # .gpu/base/oxccl-perf exists (a build of an earlier commit), that build too; twice,
    # interleaved, so drift between runs shows as the spread of each. OXCCL_LATENCY_COLLECTIVE
    # (default allreduce) names the collective.
    lc=${OXCCL_LATENCY_COLLECTIVE:-allreduce}
    for n in ${OXCCL_SESSION_GPUS:-2 4}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(devices "${n}")"
        for round in 1 2; do
            for variant in early plain base; do
                bin="${BIN}/oxccl-perf"
                env=(OXCCL_EARLY_LAUNCH=1)
                case ${variant} in
                plain) env=(OXCCL_EARLY_LAUNCH=0) ;;
                base)
                    bin=.gpu/base/oxccl-perf
                    [[ -x ${bin} ]] || continue
                    ;;
                esac
                step "latency ${n}gpu ${lc} ${variant} round ${round} bf16 1K..4M vs NCCL graph" 60 env "${env[@]}" \
                    "${bin}" -c "${lc}" -N "${n}" -b 1K -e 4M -f 2 -d bf16 -w 5 --iters 20 --graph --compare nccl \
                    --json "${out}/latency-${lc}-${variant}-${round}-${n}gpu.json"
            done
        done
    done
    ;;
ab)
    # One oxccl-perf command from this build and from .gpu/base/oxccl-perf (a build of an
    # earlier commit), each against NCCL in the same run, twice, interleaved, so drift shows
    # as the spread of each: OXCCL_AB_ARGS (default: reduce, 1M..1G), OXCCL_AB_ALGO (forced
    # algorithm, default the selector's), on the first OXCCL_SESSION_GPUS GPUs (default 2).
    # shellcheck disable=SC2206 # the arguments are words on purpose
    ab_args=(${OXCCL_AB_ARGS:--c reduce -b 1M -e 1G -f 2 -d bf16 -w 5 --iters 20 --graph})
    # An A/B of a knob instead: OXCCL_AB_NEW_ENV and OXCCL_AB_BASE_ENV (VAR=value words);
    # with OXCCL_AB_BASE_ENV set, the base is this build under those settings.
    ab_env=()
    [[ -n ${OXCCL_AB_ALGO:-} ]] && ab_env=(OXCCL_ALGO="${OXCCL_AB_ALGO}")
    # shellcheck disable=SC2206 # VAR=value words
    new_env=(${OXCCL_AB_NEW_ENV:-}) base_env=(${OXCCL_AB_BASE_ENV:-})
    n=${OXCCL_SESSION_GPUS:-2}
    n=${n%% *}
    export CUDA_VISIBLE_DEVICES="$(devices "${n}")"
    for round in 1 2; do
        for variant in new base; do
            bin="${BIN}/oxccl-perf" envs=("${ab_env[@]}" "${new_env[@]}")
            if [[ ${variant} == base ]]; then
                envs=("${ab_env[@]}" "${base_env[@]}")
                ((${#base_env[@]})) || bin=.gpu/base/oxccl-perf
                [[ -x ${bin} ]] || continue
            fi
            step "ab ${n}gpu ${OXCCL_AB_ALGO:-auto} ${variant} round ${round}" 150 env "${envs[@]}" "${bin}" \
                -N "${n}" "${ab_args[@]}" --compare nccl --json "${out}/ab-${OXCCL_AB_ALGO:-auto}-${variant}-${round}-${n}gpu.json"
        done
    done
    ;;
probe)
    # The probe's object is compiled here by ci/gpu/build-probe.sh (nvcc takes minutes on
    # the kernels it includes); the device links it with its own CUDA runtime.
    export CUDA_VISIBLE_DEVICES="$(devices 2)"
    if ((ngpus >= 2)) && [[ -f .gpu/probe/latency_probe.o ]]; then
        step "link latency probe" 60 nvcc -arch=sm_90 .gpu/probe/latency_probe.o -o "${logs}/latency_probe"
        step "latency probe 2gpu" 120 "${logs}/latency_probe" 2000 7
    else
        summary+=("SKIP  latency probe (needs 2 GPUs and .gpu/probe/latency_probe.o)")
    fi
    ;;
reduceprobe)
    # ci/gpu/probe/reduce_probe.cu (compiled here by ci/gpu/build-bandwidth-probe.sh): the
    # 2-rank reduce's root loop in several shapes against a peer-load copy, one process.
    export CUDA_VISIBLE_DEVICES="$(devices 2)"
    if ((ngpus >= 2)) && [[ -f .gpu/probe/reduce_probe.o ]]; then
        step "link reduce probe" 60 nvcc -arch=sm_90 .gpu/probe/reduce_probe.o -o "${logs}/reduce_probe"
        step "reduce probe 2gpu" 150 "${logs}/reduce_probe" "${OXCCL_REDUCE_PROBE_MIB:-64,128,1024}" 20
    else
        summary+=("SKIP  reduce probe (needs 2 GPUs and .gpu/probe/reduce_probe.o)")
    fi
    ;;
bwprobe)
    # The probe's object is compiled here by ci/gpu/build-bandwidth-probe.sh; the device
    # links it with its own CUDA runtime.
    export CUDA_VISIBLE_DEVICES="$(devices 2)"
    if ((ngpus >= 2)) && [[ -f .gpu/probe/bandwidth_probe.o ]]; then
        step "link bandwidth probe" 60 nvcc -arch=sm_90 .gpu/probe/bandwidth_probe.o -o "${logs}/bandwidth_probe"
        step "bandwidth probe 2gpu" 150 "${logs}/bandwidth_probe" 64,256,1024 5
    else
        summary+=("SKIP  bandwidth probe (needs 2 GPUs and .gpu/probe/bandwidth_probe.o)")
    fi
    ;;
ceoverlap)
    export CUDA_VISIBLE_DEVICES="$(devices 2)"
    if ((ngpus >= 2)) && [[ -f .gpu/probe/ce_overlap_probe.o ]]; then
        step "link ce overlap probe" 60 nvcc -arch=sm_90 .gpu/probe/ce_overlap_probe.o -lcuda -o "${logs}/ce_overlap_probe"
        # CE_OVERLAP_MODES: the memory setups to run (default all; e.g. "oxccl malloc").
        for mode in ${CE_OVERLAP_MODES:-all}; do
            step "ce overlap probe 2gpu ${mode}" 120 "${logs}/ce_overlap_probe" "${mode}" 1024 5
        done
    else
        summary+=("SKIP  ce overlap probe (needs 2 GPUs and .gpu/probe/ce_overlap_probe.o)")
    fi
    ;;
trace)
    # One timeline per process (trace-<pid>.txt: start end kind device stream channel): did
    # the copy engine's copies run beside the SM kernels, and on which work queues?
    export CUDA_VISIBLE_DEVICES="$(devices 2)"
    if ((ngpus >= 2)) && [[ -f .gpu/probe/libgpu_trace.so ]]; then
        shim="${repo_root}/.gpu/probe/libgpu_trace.so"
        lib="${repo_root}/.gpu/probe${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
        traced() { # traced NAME: the env prefix that traces a command into ${logs}/trace-NAME
            mkdir -p "${logs}/trace-$1"
            echo env OXCCL_TRACE_DIR="${logs}/trace-$1" LD_LIBRARY_PATH="${lib}" LD_PRELOAD="${shim}"
        }
        q=(-N 2 -b 1G -e 1G -d bf16 -w 1 --iters 2)
        # shellcheck disable=SC2046 # the prefix is words without spaces
        step "trace reduce_copy 1G" 60 $(traced reduce_copy) OXCCL_ALGO=reduce_copy "${BIN}/oxccl-perf" -c reduce "${q[@]}"
        # shellcheck disable=SC2046
        step "trace reduce_copy 128M graph" 60 $(traced reduce_copy_128M) OXCCL_ALGO=reduce_copy "${BIN}/oxccl-perf" \
            -c reduce -N 2 -b 128M -e 128M -d bf16 -w 2 --iters 3 --graph
        # shellcheck disable=SC2046
        step "trace broadcast_copy 1G out of place" 60 $(traced broadcast_copy) OXCCL_ALGO=broadcast_copy \
            "${BIN}/oxccl-perf" -c broadcast "${q[@]}"
        # shellcheck disable=SC2046
        step "trace broadcast_copy 1G in place" 60 $(traced broadcast_copy_inplace) OXCCL_ALGO=broadcast_copy \
            "${BIN}/oxccl-perf" -c broadcast --in-place "${q[@]}"
        if [[ -f .gpu/probe/ce_overlap_probe.o ]]; then
            step "link ce overlap probe" 60 nvcc -arch=sm_90 .gpu/probe/ce_overlap_probe.o -lcuda -o "${logs}/ce_overlap_probe"
            # shellcheck disable=SC2046
            step "trace ce overlap probe ipc-vmm" 60 $(traced ce_overlap_probe) "${logs}/ce_overlap_probe" ipc-vmm 1024 1
        fi
    else
        summary+=("SKIP  trace (needs 2 GPUs and .gpu/probe/libgpu_trace.so)")
    fi
    ;;
copyengine)
    # The copy-engine broadcast against the SM one on registered buffers, each vs NCCL in the
    # same run (graph replay), every size checked: where broadcast_copy should take over.
    export CUDA_VISIBLE_DEVICES="$(devices 2)"
    for algo in broadcast_copy broadcast_direct; do
        step "perf 2gpu ${algo} bf16 1M..1G vs NCCL graph" 150 env OXCCL_ALGO="${algo}" \
            "${BIN}/oxccl-perf" -c broadcast -N 2 -b 1M -e 1G -f 2 -d bf16 -w 5 --iters 20 --graph \
            --compare nccl --json "${out}/${algo}-2gpu.json"
    done
    step "check 2gpu broadcast_copy bf16 root 1 in-place odd 1003B..256M" 60 env OXCCL_ALGO=broadcast_copy \
        "${BIN}/oxccl-perf" -c broadcast -N 2 -b 1003 -e 256M -f 7 -d bf16 -r 1 --in-place -w 1 --iters 2
    ;;
copylane)
    # Out of place the copy-lane algorithms copy the rank's own data by the SMs beside the
    # peers' copies; OXCCL_COPY_LANE_PEERS picks what moves the peers' (ce | sm). Each
    # against its direct kernel and NCCL in the same run, every size checked.
    export CUDA_VISIBLE_DEVICES="$(devices 2)"
    cl=(-N 2 -b 64M -e 1G -f 4 -d bf16 -w 5 --iters 20 --graph --compare nccl)
    for c in broadcast alltoall alltoallv; do
        for peers in ce sm; do
            step "perf 2gpu ${c}_copy peers by ${peers} 64M..1G vs NCCL graph" 90 env OXCCL_ALGO="${c}_copy" \
                OXCCL_COPY_LANE_PEERS="${peers}" "${BIN}/oxccl-perf" -c "${c}" "${cl[@]}" \
                --json "${out}/${c}_copy-${peers}-2gpu.json"
        done
        step "perf 2gpu ${c}_direct 64M..1G vs NCCL graph" 90 env OXCCL_ALGO="${c}_direct" \
            "${BIN}/oxccl-perf" -c "${c}" "${cl[@]}" --json "${out}/${c}_direct-2gpu.json"
    done
    for algo in reduce_copy reduce_direct; do
        step "perf 2gpu ${algo} 64M..1G vs NCCL graph" 90 env OXCCL_ALGO="${algo}" \
            "${BIN}/oxccl-perf" -c reduce "${cl[@]}" --json "${out}/${algo}-2gpu.json"
    done
    ;;
reducecopy)
    # reduce_copy against reduce_direct on registered buffers, each vs NCCL in the same run
    # (graph replay), every size checked. The chunk is half the staging (OXCCL_STAGING_MB);
    # OXCCL_REDUCE_COPY_BLOCKS sets the local reduce's grid (default one block per SM).
    export CUDA_VISIBLE_DEVICES="$(devices 2)"
    rc=(-c reduce -N 2 -b 64M -e 1G -f 2 -d bf16 -w 5 --iters 20 --graph --compare nccl)
    step "perf 2gpu reduce_direct 64M..1G vs NCCL graph" 90 env OXCCL_ALGO=reduce_direct \
        "${BIN}/oxccl-perf" "${rc[@]}" --json "${out}/reduce_direct-2gpu.json"
    for v in ${OXCCL_REDUCECOPY_VARIANTS:-64:0 16:0 128:0 256:0 64:32 64:16 128:32}; do
        mb=${v%%:*} blocks=${v#*:}
        knob=(); ((blocks > 0)) && knob=(OXCCL_REDUCE_COPY_BLOCKS="${blocks}")
        step "perf 2gpu reduce_copy staging ${mb}M blocks ${blocks} 64M..1G vs NCCL graph" 90 env \
            OXCCL_ALGO=reduce_copy OXCCL_STAGING_MB="${mb}" "${knob[@]}" "${BIN}/oxccl-perf" "${rc[@]}" \
            --json "${out}/reduce_copy-${mb}M-${blocks}-2gpu.json"
    done
    # Out of place the chunks land in the output and shrink to a tail (OXCCL_REDUCE_COPY_TAIL_KB).
    for kb in ${OXCCL_REDUCECOPY_TAILS:-}; do
        step "perf 2gpu reduce_copy tail ${kb}K 64M..1G vs NCCL graph" 90 env OXCCL_ALGO=reduce_copy \
            OXCCL_REDUCE_COPY_TAIL_KB="${kb}" "${BIN}/oxccl-perf" "${rc[@]}" \
            --json "${out}/reduce_copy-tail${kb}K-2gpu.json"
    done
    step "perf 2gpu reduce_copy in place 64M..1G vs NCCL graph" 90 env OXCCL_ALGO=reduce_copy \
        "${BIN}/oxccl-perf" "${rc[@]}" --in-place --json "${out}/reduce_copy-inplace-2gpu.json"
    ;;
reducerelay)
    # reduce_relay against reduce_direct on registered buffers, 4 and 3 GPUs, each vs NCCL in
    # the same run (graph replay), every size checked: where the relay should take over.
    for n in ${OXCCL_SESSION_GPUS:-4 3}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(devices "${n}")"
        for algo in reduce_relay reduce_direct; do
            step "perf ${n}gpu ${algo} 64K..1G vs NCCL graph" 90 env OXCCL_ALGO="${algo}" "${BIN}/oxccl-perf" \
                -c reduce -N "${n}" -b 64K -e 1G -f 4 -d bf16 -w 5 --iters 20 --graph --compare nccl \
                --json "${out}/${algo}-${n}gpu.json"
        done
        # In place (the root's output is its input): the relay's owners store into it.
        for algo in reduce_relay reduce_oneshot_ll; do
            max=1G; [[ ${algo} == reduce_oneshot_ll ]] && max=1M
            step "perf ${n}gpu ${algo} in place 64K..${max} vs NCCL graph" 90 env OXCCL_ALGO="${algo}" \
                "${BIN}/oxccl-perf" -c reduce -N "${n}" -b 64K -e "${max}" -f 2 -d bf16 -w 5 --iters 20 --graph \
                --in-place --compare nccl --json "${out}/${algo}-inplace-${n}gpu.json"
        done
    done
    ;;
torchpin)
    # Eager small calls in PyTorch under several CPU bindings (ci/gpu/torch-pinning.sh);
    # OXCCL_TORCH_BINDINGS: the bindings, space separated (default: the script's).
    export CUDA_VISIBLE_DEVICES="$(devices 2)"
    # shellcheck disable=SC2086
    ((ngpus >= 2)) && step "torch 2gpu small calls under CPU bindings" 330 env OUT="${out}" \
        bash ci/gpu/torch-pinning.sh "${repo_root}/${BIN}/liboxccl_nccl.so" ${OXCCL_TORCH_BINDINGS:-}
    ;;
smallgraph)
    # A quick look at small-call latency (graph replay, 1K..1M, vs NCCL's default mode), to
    # tell whether the GPUs themselves got slower between two longer phases of one call.
    export CUDA_VISIBLE_DEVICES="$(devices 2)"
    tag="$(date +%H%M%S)"
    ((ngpus >= 2)) && step "smallgraph 2gpu 1K..1M vs NCCL graph (${tag})" 60 "${BIN}/oxccl-perf" -N 2 -b 1K -e 1M \
        -f 4 -d bf16 -w 5 --iters 20 --graph --compare nccl --nccl-default-only --json "${out}/smallgraph-${tag}.json"
    ;;
autoreg)
    # Unregistered buffers, eager calls (no graph): zero-copy with an exchange per call
    # (OXCCL_AUTO_REGISTER_MIN_BYTES=0: through the shared exchange region from the one-shot
    # sizes on; the default on one node is 1 MiB) against staging through the scratch (the
    # minimum above every size), each vs NCCL in the same run: where the exchange pays.
    # OXCCL_SESSION_GPUS picks the world sizes (default 2).
    for n in ${OXCCL_SESSION_GPUS:-2}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(devices "${n}")"
        for min in 0 1099511627776; do
            step "autoreg ${n}gpu bf16 eager unregistered min ${min}" 120 env OXCCL_AUTO_REGISTER_MIN_BYTES="${min}" \
                "${BIN}/oxccl-perf" -N "${n}" -b 256K -e 512M -f 2 -d bf16 -w 5 --iters 20 --no-register \
                --compare nccl --nccl-default-only --json "${out}/autoreg-min${min}-${n}gpu.json"
            step "autoreg ${n}gpu bf16 eager unregistered min ${min} 3M..24M" 120 env OXCCL_AUTO_REGISTER_MIN_BYTES="${min}" \
                "${BIN}/oxccl-perf" -N "${n}" -b 3M -e 24M -f 2 -d bf16 -w 5 --iters 20 --no-register \
                --compare nccl --nccl-default-only --json "${out}/autoreg-min${min}-odd-${n}gpu.json"
            # Above 2 ranks the one-shot ends at 512 KiB: a size between it and 1 MiB.
            ((n > 2)) && step "autoreg ${n}gpu bf16 eager unregistered min ${min} 768K" 60 env OXCCL_AUTO_REGISTER_MIN_BYTES="${min}" \
                "${BIN}/oxccl-perf" -N "${n}" -b 786432 -e 786432 -d bf16 -w 5 --iters 20 --no-register \
                --compare nccl --nccl-default-only --json "${out}/autoreg-min${min}-768K-${n}gpu.json"
        done
    done
    ;;
perf)
    for n in ${OXCCL_SESSION_GPUS:-2 4}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(devices "${n}")"
        step "perf ${n}gpu bf16 sum vs NCCL graph" 150 "${BIN}/oxccl-perf" -N "${n}" -b 1K -e 1G -f 2 -d bf16 \
            -w 5 --iters 20 --graph --compare nccl --json "${out}/allreduce-bf16-${n}gpu.json"
    done
    # Threshold data (no NCCL): one-shot vs zero-copy two-shot over the crossover range.
    for n in ${OXCCL_SESSION_GPUS:-4 2}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(devices "${n}")"
        for algo in oneshot_ll oneshot_ll128 twoshot_zc twoshot_push; do
            step "sweep ${n}gpu ${algo} 1K..2M" 60 env OXCCL_ALGO="${algo}" "${BIN}/oxccl-perf" -N "${n}" \
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
        export CUDA_VISIBLE_DEVICES="$(devices "${n}")"
        step "tune ${n}gpu bf16 (force) + perf vs NCCL graph" 180 "${BIN}/oxccl-perf" -N "${n}" -b 1K -e 1G -f 2 \
            -d bf16 -w 5 --iters 20 --graph --compare nccl --tune force \
            --json "${out}/allreduce-bf16-${n}gpu-tuned.json"
        step "tune ${n}gpu f32 + check" 120 "${BIN}/oxccl-perf" -N "${n}" -b 3 -e 256M -f 7 -d f32 --tune cache "${q[@]}"
        for dtype in bf16 f16 fp8_e4m3 fp8_e4m3b15; do
            step "check ${n}gpu tuned-bf16-table ${dtype} odd in-place graph" 60 "${BIN}/oxccl-perf" -N "${n}" \
                -b 1003 -e 256M -f 7 -d "${dtype}" --in-place --graph --tune cache "${q[@]}"
        done
        step "check ${n}gpu tuned bf16 unregistered" 60 "${BIN}/oxccl-perf" -N "${n}" -b 1K -e 64M -f 4 -d bf16 \
            --no-register --tune cache "${q[@]}"
        for dtype in bf16 f32 fp8_e4m3b15; do
            step "check ${n}gpu port_channel ${dtype} 2B..64M" 90 env OXCCL_ALGO=port_channel \
                "${BIN}/oxccl-perf" -N "${n}" -b 2 -e 64M -f 7 -d "${dtype}" "${q[@]}"
        done
        step "perf ${n}gpu port_channel bf16 graph" 90 env OXCCL_ALGO=port_channel "${BIN}/oxccl-perf" -N "${n}" \
            -b 1K -e 256M -f 4 -d bf16 -w 3 --iters 10 --graph --json "${out}/port-channel-bf16-${n}gpu.json"
    done
    ;;
torch | torchvmm)
    # torchvmm: the same with PyTorch's expandable segments (its caching allocator on cuMem
    # VMM chunks): zero-copy needs them exported as POSIX file descriptors (issue #17 item 4).
    alloc=() label="" results="${out}"
    [[ ${run_tag} != "${phase}" ]] && results="${out}/${run_tag}"
    if [[ ${phase} == torchvmm ]]; then
        alloc=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) label=" expandable_segments"
        results="${results}/vmm"
    fi
    for n in ${OXCCL_SESSION_GPUS:-2 4}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(devices "${n}")"
        step "torch ${n}gpu${label} with and without liboxccl_nccl.so" $((n > 2 ? 450 : 330)) env OXCCL_STEP_TIMEOUT=120 \
            "${alloc[@]}" OUT="${results}" bash ci/gpu/run-torch-nccl-api.sh "${repo_root}/${BIN}/liboxccl_nccl.so" "${n}"
    done
    ;;
faults)
    # Two ranks, one per GPU (4 when OXCCL_SESSION_GPUS names 4 and there are 4).
    for n in ${OXCCL_SESSION_GPUS:-2}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(devices "${n}")"
        step "faults ${n}gpu" 300 env FAULT_WORLD="${n}" FAULT_GPUS="${n}" BIN="${BIN}" \
            OUT="${logs}/faults-${n}gpu" bash ci/gpu/faults.sh
    done
    ;;
multinode)
    export CUDA_VISIBLE_DEVICES="$(devices 2)"
    ((ngpus >= 2)) && step "multinode 2gpu (PortChannel over TCP vs NCCL on sockets)" 420 \
        env BIN="${BIN}" OUT="${logs}/multinode" bash ci/gpu/multinode.sh
    cp "${logs}"/multinode/*.json "${out}/" 2>/dev/null || true
    ;;
python)
    export CUDA_VISIBLE_DEVICES="$(devices 2)"
    ((ngpus >= 2)) && step "python 2gpu" 240 env RANKS=2 STEP_TIMEOUT=220 OUT="${logs}/python" \
        bash ci/gpu/python.sh
    ;;
group)
    # One thread drives every GPU of the list through liboxccl_nccl.so (issue #17).
    for n in ${OXCCL_SESSION_GPUS:-2 4}; do
        ((ngpus >= n)) || continue
        export CUDA_VISIBLE_DEVICES="$(devices "${n}")"
        step "nccl_group_test ${n}gpu" 120 env OXCCL_NCCL_LOG=info "${BIN}/nccl_group_test"
    done
    ;;
callcost)
    # The host cost of one ncclAllReduce (one GPU, a one-rank communicator, calls back to
    # back): the real NCCL, then liboxccl_nccl.so in front of it.
    export CUDA_VISIBLE_DEVICES="$(devices 1)"
    step "call cost real NCCL" 60 "${BIN}/nccl_call_cost" "${OXCCL_NCCL_LIB_PATH}"
    step "call cost liboxccl_nccl.so" 60 env OXCCL_NCCL_PROFILE=1 "${BIN}/nccl_call_cost" "${repo_root}/${BIN}/liboxccl_nccl.so"
    step "call cost liboxccl_nccl.so, early launch off" 60 env OXCCL_EARLY_LAUNCH=0 \
        "${BIN}/nccl_call_cost" "${repo_root}/${BIN}/liboxccl_nccl.so"
    ;;
sanitizer)
    # compute-sanitizer over 2 ranks (it follows the children oxccl-perf -N starts): every
    # algorithm forced, small sizes that are not powers of two, each size checked; memcheck
    # also over every data type with the selector's choice. A reported error fails the step
    # (--error-exitcode), and so does a wrong result.
    # OXCCL_SANITIZER_GPUS (default 2): ranks of every step; broadcast_relay needs 3 or more
    # to take its second hop.
    sn=${OXCCL_SANITIZER_GPUS:-2}
    export CUDA_VISIBLE_DEVICES="$(devices "${sn}")" OXCCL_TIMEOUT_MS=120000
    san() { # san TOOL NAME ENV... -- PERF ARGS...
        local tool=$1 name=$2
        shift 2
        local envs=()
        while [[ $1 != -- ]]; do envs+=("$1"); shift; done
        shift
        step "${tool} ${name}" 150 env "${envs[@]}" compute-sanitizer --tool "${tool}" \
            --target-processes all --error-exitcode 9 "${BIN}/oxccl-perf" -N "${sn}" "$@" -w 1 --iters 1
    }
    algos=(allreduce:oneshot_ll allreduce:oneshot_ll128 allreduce:twoshot allreduce:twoshot_zc
        allreduce:twoshot_push allreduce:port_channel
        allgather:allgather_oneshot_ll allgather:allgather_staged allgather:allgather_direct
        reducescatter:reducescatter_oneshot_ll reducescatter:reducescatter_staged
        reducescatter:reducescatter_direct alltoall:alltoall_oneshot_ll alltoall:alltoall_staged
        alltoall:alltoall_direct alltoall:alltoall_copy broadcast:broadcast_oneshot_ll broadcast:broadcast_staged
        alltoallv:alltoallv_oneshot_ll alltoallv:alltoallv_direct alltoallv:alltoallv_copy
        broadcast:broadcast_direct broadcast:broadcast_relay broadcast:broadcast_copy
        reduce:reduce_oneshot_ll reduce:reduce_staged reduce:reduce_direct reduce:reduce_relay reduce:reduce_copy)
    for tool in ${OXCCL_SANITIZER_TOOLS:-memcheck racecheck synccheck initcheck}; do
        for a in "${algos[@]}"; do
            c=${a%%:*} algo=${a#*:}
            reg=()
            [[ ${algo} == *staged ]] && reg=(--no-register)
            sizes=(-b 1000 -e 300000 -f 17) envs=(OXCCL_ALGO="${algo}")
            # reduce_copy's pipeline over several chunks: 512 KiB slots of a 1 MiB staging.
            # Out of place its chunks land in the output and shrink to the tail: 64 KiB makes
            # several of them.
            [[ ${algo} == reduce_copy ]] && sizes=(-b 1000 -e 3000000 -f 7) \
                envs+=(OXCCL_STAGING_MB=1 OXCCL_REDUCE_COPY_TAIL_KB=64)
            san "${tool}" "${sn}gpu ${algo}" "${envs[@]}" -- -c "${c}" "${sizes[@]}" -d bf16 "${reg[@]}"
            # In place at the root, reduce_relay's owners store into the root's input instead.
            [[ ${algo} == reduce_relay ]] && san "${tool}" "${sn}gpu ${algo} in-place" "${envs[@]}" -- \
                -c "${c}" "${sizes[@]}" -d bf16 --in-place
        done
        [[ ${tool} == memcheck ]] || continue
        for dtype in f32 f16 fp8_e4m3 fp8_e4m3b15 i8 i32 u64 f64; do
            san memcheck "${sn}gpu allreduce auto ${dtype}" OXCCL_LOG=warn -- -b 1000 -e 300000 -f 17 -d "${dtype}"
        done
    done
    ;;
soak)
    # OXCCL_SOAK_SECONDS (default 600) of random collectives, sizes and types on 2 GPUs,
    # every call checked; the per-minute figures are in the log.
    export CUDA_VISIBLE_DEVICES="$(devices 2)" OXCCL_TIMEOUT_MS=20000
    secs=${OXCCL_SOAK_SECONDS:-600}
    # Device memory per process, from outside (the HAL has no query for it), each minute.
    (
        while sleep 60; do
            echo "# $(date +%T)"
            nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv,noheader
        done
    ) >"${out}/soak-device-memory.txt" 2>&1 &
    sampler=$!
    step "soak 2gpu ${secs}s" $((secs + 90)) "${BIN}/oxccl-perf" -N 2 --soak "${secs}" -b 1 -e 64M \
        --json "${out}/soak-2gpu.json"
    kill "${sampler}" 2>/dev/null
    ;;
*)
    echo "unknown phase ${phase}" >&2
    exit 2
    ;;
esac

{
    echo "== session ${run_tag}: ${ngpus} GPUs, $((SECONDS - start))s =="
    printf '%s\n' "${summary[@]}"
} | tee "${out}/summary-${run_tag}.txt"
tar czf "${out}/logs-${run_tag}.tar.gz" -C "${logs}" . && rm -rf "${logs}"
! grep -q '^FAIL' "${out}/summary-${run_tag}.txt"
