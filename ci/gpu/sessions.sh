#!/usr/bin/env bash
# Several phases of ci/gpu/session.sh in one device call, inside one overall time limit,
# with everything they write packed into one $OUT/results-<phases>.tar.gz (the device tool
# returns at most 8 files, 16 MiB each: PyTorch's saved tensors stay out). Each phase gets what is left of the limit as its budget, so a
# slow phase makes the later ones skip steps instead of overrunning the call.
#
#     OXCCL_SESSION_GPUS=4 ci/gpu/sessions.sh 560 allreduce perf tune torch
#     ci/gpu/sessions.sh 560 hal 'allreduce=bf16 in-place|graph'   # PHASE=REGEX: only the
#                                  # steps of that phase whose names match (OXCCL_SESSION_MATCH)
#
# OXCCL_SESSION_DMON=1 records `nvidia-smi dmon` (power, temperature, SM clock, utilization,
# throttling, once a second) over the whole call into dmon.txt, to place a slower phase.
#
# NVLS stays off (session.sh exports NCCL_NVLS_ENABLE=0 and unsets OXCCL_NVLS).
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
total="${1:?usage: ci/gpu/sessions.sh SECONDS PHASE...}"
shift
final_out="${OUT:-${repo_root}/.gpu/results}"
work="$(mktemp -d /tmp/oxccl-sessions.XXXXXX)"
mkdir -p "${final_out}"
start=${SECONDS}
status=0
dmon_pid=""
if [[ ${OXCCL_SESSION_DMON:-0} == 1 ]] && command -v nvidia-smi >/dev/null; then
    nvidia-smi dmon -s pucv -o T -d 1 >"${work}/dmon.txt" 2>&1 &
    dmon_pid=$!
fi
for arg in "$@"; do
    phase=${arg%%=*}
    match=()
    [[ ${arg} == *=* ]] && match=(OXCCL_SESSION_MATCH="${arg#*=}")
    left=$((total - (SECONDS - start)))
    if ((left < 30)); then
        echo "== phase ${phase}: skipped, ${left}s left" | tee -a "${work}/skipped.txt"
        continue
    fi
    env OUT="${work}" OXCCL_SESSION_BUDGET="${left}" "${match[@]}" bash "${repo_root}/ci/gpu/session.sh" "${phase}" || status=1
done
[[ -n ${dmon_pid} ]] && kill "${dmon_pid}" 2>/dev/null
echo "== all phases: $((SECONDS - start))s"
cat "${work}"/summary-*.txt 2>/dev/null | grep -E '^(==|FAIL|SKIP)' || true
phases=()
for arg in "$@"; do phases+=("${arg%%=*}"); done
name="$(IFS=-; echo "${phases[*]}")"
tar czf "${final_out}/results-${name}.tar.gz" --exclude='*.pt' -C "${work}" .
exit "${status}"
