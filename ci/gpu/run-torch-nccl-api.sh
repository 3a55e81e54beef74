#!/usr/bin/env bash
# PyTorch (backend="nccl") on liboxccl_nccl.so, on the GPU machine: for each world size,
# ci/gpu/torch_nccl_api.py runs under torchrun twice, without and with
# LD_PRELOAD=liboxccl_nccl.so (OXCCL_NCCL_LOG=info), then its `compare` step checks the
# results (forwarded all_gather/broadcast bit for bit, all-reduces within a dtype tolerance,
# both runs against a float64 reference) and prints the allreduce timings side by side; the
# log shows which calls oxccl served.
#
#     ci/gpu/run-torch-nccl-api.sh [LIB] [WORLD SIZES...]      (default: .gpu/bin/liboxccl_nccl.so 2 4)
#
# One world size takes a few minutes: three torchrun jobs with 64Mi-element tensors and their
# float64 references (the real NCCL, the preload logged, the preload quiet), then
# OXCCL_TORCH_PAIRS short pairs up to 2^20+7 elements (see below); on a machine with a
# 10-minute limit per command, run one world size per command. OXCCL_TORCH_ARGS adds arguments to the script's `run` (e.g.
# "--max-elems 1048583 --iters 10" for a quick pass).
# Build LIB here with: cargo build --release -p oxccl-nccl-api --features cuda, copied into
# .gpu/bin/ by ci/gpu/build-cuda.sh (see docs/nccl-api.md). NVLS stays off: NCCL_NVLS_ENABLE=0, OXCCL_NVLS never set.
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
lib="$(realpath "${1:-${repo_root}/.gpu/bin/liboxccl_nccl.so}")"
shift || true
worlds=("$@")
[[ ${#worlds[@]} -gt 0 ]] || worlds=(2 4)
results="${OUT:-${repo_root}/.gpu/results}/torch-nccl-api"
step_timeout="${OXCCL_STEP_TIMEOUT:-540}"
script="${repo_root}/ci/gpu/torch_nccl_api.py"
export NCCL_NVLS_ENABLE=0
unset OXCCL_NVLS
export OXCCL_TIMEOUT_MS="${OXCCL_TIMEOUT_MS:-20000}"

if [[ ! -f "${lib}" ]]; then
    echo "run-torch-nccl-api.sh: ${lib} not found (build it with --features cuda and copy it to .gpu/bin/)" >&2
    exit 2
fi
# The real NCCL oxccl forwards to: the one PyTorch uses (its pip package), unless set.
if [[ -z "${OXCCL_NCCL_LIB_PATH:-}" ]]; then
    guess="$(python3 -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)"
    [[ -n "${guess}" && -f "${guess}" ]] && export OXCCL_NCCL_LIB_PATH="${guess}"
fi
echo "run-torch-nccl-api.sh: lib ${lib}; real NCCL ${OXCCL_NCCL_LIB_PATH:-libnccl.so.2 (default search)}; results ${results}"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null || true
ngpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"

# timed_pair N NCCL_DIR OXCCL_DIR [RUN ARGS...]: the script's `run` on N ranks with the real
# NCCL into NCCL_DIR, then right after with the preload (logging off) into OXCCL_DIR, each
# logged beside its folder; fails unless both ran and wrote their timing.json.
timed_pair() {
    local ranks="$1" nccl_dir="$2" oxccl_dir="$3"
    shift 3
    # shellcheck disable=SC2086
    timeout --kill-after=20 "${step_timeout}" torchrun --standalone --nproc_per_node="${ranks}" \
        "${script}" run --out "${nccl_dir}" ${OXCCL_TORCH_ARGS:-} "$@" >"${nccl_dir}.log" 2>&1 \
        && LD_PRELOAD="${lib}" timeout --kill-after=20 "${step_timeout}" torchrun --standalone \
            --nproc_per_node="${ranks}" "${script}" run --out "${oxccl_dir}" ${OXCCL_TORCH_ARGS:-} "$@" \
            >"${oxccl_dir}.log" 2>&1 \
        && [[ -f "${nccl_dir}/timing.json" && -f "${oxccl_dir}/timing.json" ]]
}

status=0
for n in "${worlds[@]}"; do
    if [[ "${ngpus}" -lt "${n}" ]]; then
        echo "=== world ${n}: skipped (${ngpus} GPUs)"
        continue
    fi
    dir="${results}/n${n}"
    rm -rf "${dir}"
    mkdir -p "${dir}"
    echo
    echo "=== world ${n}: without the preload (real NCCL)"
    timeout --kill-after=20 "${step_timeout}" torchrun --standalone --nproc_per_node="${n}" \
        "${script}" run --out "${dir}/baseline" ${OXCCL_TORCH_ARGS:-} 2>&1 | tee "${dir}/baseline.log" | grep -v '^oxccl-nccl:' | tail -20
    rc_base=${PIPESTATUS[0]}
    echo
    echo "=== world ${n}: LD_PRELOAD=${lib}"
    LD_PRELOAD="${lib}" OXCCL_NCCL_LOG=info timeout --kill-after=20 "${step_timeout}" \
        torchrun --standalone --nproc_per_node="${n}" "${script}" run --out "${dir}/oxccl" ${OXCCL_TORCH_ARGS:-} \
        >"${dir}/oxccl.log" 2>&1
    rc_ox=$?
    grep -v '^oxccl-nccl:' "${dir}/oxccl.log" | tail -20
    echo
    echo "--- which side served the calls (OXCCL_NCCL_LOG=info, all ranks):"
    grep -c -- '-> oxccl' "${dir}/oxccl.log" | sed 's/^/calls served by oxccl: /'
    echo "served by oxccl, per function:"
    grep -o -- 'rank [0-9]* nccl[A-Za-z]* [^>]*-> oxccl' "${dir}/oxccl.log" | awk '{print $3}' | sort | uniq -c
    grep -o -- 'nccl[A-Za-z]* count=[0-9]* dtype=[a-z0-9]* op=[a-z0-9]* -> oxccl ([^)]*)' "${dir}/oxccl.log" \
        | sed 's/count=[0-9]* //' | sort | uniq -c | sort -rn | head -20
    # Why calls staged, by size: anything but the one-shots (which work through the
    # scratch by design) names a buffer that was not served zero-copy, and why.
    echo "through oxccl's scratch, other than the one-shots (elements, why):"
    grep -o -- 'count=[0-9]* dtype=[a-z0-9]* op=[a-z0-9]* -> oxccl ([a-z0-9_]*, through .*' "${dir}/oxccl.log" \
        | grep -v 'oxccl (oneshot' | sed -e 's/ dtype=[a-z0-9]* op=[a-z0-9]* -> oxccl (/ /' -e 's/, through oxccl.s scratch//' -e 's/0x[0-9a-f]*/0x./g' \
        | sort | uniq -c | sort -rn | head -20
    echo "forwarded to the real NCCL:"
    grep -o -- 'rank [0-9]* nccl[A-Za-z]*.*-> nccl (forwarded: .*)' "${dir}/oxccl.log" \
        | sed -e 's/^rank [0-9]* //' -e 's/count=[0-9]* //' | sort | uniq -c | sort -rn | head -20
    grep -E 'oxccl-nccl: (rank [0-9]+/|real NCCL|error)' "${dir}/oxccl.log" | head -12
    # The logged run above writes a line per call, which the per-call timing would include:
    # time the preload again without logging and compare that run's timings.
    echo
    echo "=== world ${n}: LD_PRELOAD=${lib}, logging off (timing; OXCCL_NCCL_PROFILE=1: host time in each function)"
    LD_PRELOAD="${lib}" OXCCL_NCCL_PROFILE=1 timeout --kill-after=20 "${step_timeout}" \
        torchrun --standalone --nproc_per_node="${n}" "${script}" run --out "${dir}/oxccl-quiet" ${OXCCL_TORCH_ARGS:-} \
        >"${dir}/oxccl-quiet.log" 2>&1
    rc_quiet=$?
    grep -v '^oxccl-nccl:' "${dir}/oxccl-quiet.log" | tail -3
    # The last report of each process (at its communicators' finalize or destroy).
    echo "--- host time inside liboxccl_nccl.so per function (each process's last report):"
    awk '/oxccl-nccl: profile of process/ {pid=$5; n[pid]=0} /oxccl-nccl: profile   / {last[pid, n[pid]++]=$0} END {for (p in n) for (i = 0; i < n[p] && i < 12; i++) print "[" p "] " last[p, i]}' \
        "${dir}/oxccl-quiet.log" | sed 's/oxccl-nccl: profile   //'

    if [[ ${rc_quiet} -eq 0 && -f "${dir}/oxccl-quiet/timing.json" ]]; then
        cp "${dir}/oxccl/timing.json" "${dir}/oxccl/timing-logged.json" 2>/dev/null || true
        cp "${dir}/oxccl-quiet/timing.json" "${dir}/oxccl/timing.json"
    else
        echo "=== world ${n}: the quiet run failed (exit ${rc_quiet}); timings below are with logging"
        status=1
    fi
    # OXCCL_TORCH_TIMING_RUNS (default 1): time each whole side again, alternating, and
    # compare each cell's best run.
    for ((again = 2; again <= ${OXCCL_TORCH_TIMING_RUNS:-1}; again++)); do
        echo
        echo "=== world ${n}: timing run ${again} of each side (real NCCL, then the preload)"
        if ! timed_pair "${n}" "${dir}/baseline-${again}" "${dir}/oxccl-quiet-${again}"; then
            echo "=== world ${n}: timing run ${again} failed; logs in ${dir}"
            status=1
            continue
        fi
        [[ -f "${dir}/baseline/timing-first.json" ]] || cp "${dir}/baseline/timing.json" "${dir}/baseline/timing-first.json"
        [[ -f "${dir}/oxccl/timing-first.json" ]] || cp "${dir}/oxccl/timing.json" "${dir}/oxccl/timing-first.json"
        grep -h "GPUs around the timing" "${dir}/baseline-${again}.log" "${dir}/oxccl-quiet-${again}.log" | sed 's/^/timing run '"${again}"': /'
        python3 "${script}" best "${dir}/baseline" "${dir}/baseline" "${dir}/baseline-${again}" || status=1
        python3 "${script}" best "${dir}/oxccl" "${dir}/oxccl" "${dir}/oxccl-quiet-${again}" || status=1
    done
    # Eager calls up to 2^20+7 elements are bound by PyTorch's host time, which changes by
    # up to 1.5x from one minute to the next on these machines, for both sides alike and
    # pinned or not (ci/gpu/torch-pinning.sh, 2 H200s, 2026-11-28). So those sizes are timed
    # again in OXCCL_TORCH_PAIRS (default 3) short pairs of runs, the preload right after
    # the real NCCL, and judged by the median ratio within a pair.
    pair_dirs=()
    for ((p = 1; p <= ${OXCCL_TORCH_PAIRS:-3}; p++)); do
        if ! timed_pair "${n}" "${dir}/pair${p}-nccl" "${dir}/pair${p}-oxccl" --max-elems 1048583; then
            echo "=== world ${n}: pair ${p} failed; logs in ${dir}"
            status=1
            continue
        fi
        pair_dirs+=("${dir}/pair${p}-nccl" "${dir}/pair${p}-oxccl")
    done
    if [[ ${#pair_dirs[@]} -gt 0 ]]; then
        echo
        echo "=== world ${n}: eager and graph calls up to 2^20+7 elements, $((${#pair_dirs[@]} / 2)) pairs of runs"
        python3 "${script}" pairs --out "${dir}/pairs.json" "${pair_dirs[@]}" || status=1
    fi
    echo
    echo "=== world ${n}: compare"
    if [[ ${rc_base} -ne 0 || ${rc_ox} -ne 0 ]]; then
        echo "=== world ${n}: a run failed (without preload: exit ${rc_base}, with: exit ${rc_ox}); logs in ${dir}"
        status=1
    fi
    python3 "${script}" compare "${dir}/baseline" "${dir}/oxccl" --world "${n}" || status=1
done
echo
echo "run-torch-nccl-api.sh: $([[ ${status} -eq 0 ]] && echo PASS || echo FAIL)"
exit ${status}
