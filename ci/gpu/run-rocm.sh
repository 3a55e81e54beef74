#!/usr/bin/env bash
# Runs oxccl's GPU suite on an AMD Instinct MI300X node: the single-GPU self-test, then the
# multi-GPU suite with one process per GPU (torchrun when available, else plain processes
# with torchrun's RANK / WORLD_SIZE / LOCAL_RANK variables). Same suite as on CUDA.
#
# NOT RUN BY THIS PROJECT: no AMD GPU has been available to it, so there are no MI300X
# results; this script is for a user who has the hardware. Build first with
# ci/gpu/build-rocm.sh.
#
# Usage:   ci/gpu/run-rocm.sh [NGPUS]     (default: every GPU rocminfo lists)
# Env:     OXCCL_SUITE_BIN   the suite binary (default $CARGO_TARGET_DIR/release/oxccl-gpu-suite)
#          ROCM_PATH         ROCm prefix (default /opt/rocm)
#          OXCCL_SUITE_TIMEOUT  seconds a rank waits for the others (default 120)
set -euo pipefail
cd "$(dirname "$0")/../.."

export ROCM_PATH="${ROCM_PATH:-/opt/rocm}"
bin="${OXCCL_SUITE_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/oxccl-gpu-suite}"
timeout="${OXCCL_SUITE_TIMEOUT:-120}"
[[ -x "${bin}" ]] || { echo "run-rocm.sh: ${bin} not found; run ci/gpu/build-rocm.sh first" >&2; exit 1; }

if [[ $# -ge 1 ]]; then
    ngpus="$1"
else
    # One "Name: gfxNNN" line per GPU agent.
    ngpus="$("${ROCM_PATH}/bin/rocminfo" 2>/dev/null | grep -cE '^[[:space:]]*Name:[[:space:]]+gfx' || true)"
fi
if [[ -z "${ngpus}" || "${ngpus}" -lt 1 ]]; then
    echo "run-rocm.sh: no AMD GPU found (rocminfo lists none); pass NGPUS to override" >&2
    exit 1
fi
# The multicast gate stays closed; MI300X has no multicast anyway.
unset OXCCL_NVLS
# Let the runtime be found even where ROCm's lib directory is not on the loader path.
export LD_LIBRARY_PATH="${ROCM_PATH}/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"

echo "run-rocm.sh: self-test on GPU 0"
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 "${bin}" selftest

rdv="$(mktemp -d "${TMPDIR:-/tmp}/oxccl-rocm-suite.XXXXXX")"
trap 'rm -rf "${rdv}"' EXIT
echo "run-rocm.sh: suite on ${ngpus} GPU(s), rendezvous ${rdv}"
if command -v torchrun >/dev/null; then
    torchrun --standalone --nproc-per-node="${ngpus}" --no-python \
        "${bin}" suite --rendezvous "${rdv}" --timeout "${timeout}"
else
    pids=()
    for ((r = 0; r < ngpus; r++)); do
        RANK="${r}" WORLD_SIZE="${ngpus}" LOCAL_RANK="${r}" \
            "${bin}" suite --rendezvous "${rdv}" --timeout "${timeout}" &
        pids+=("$!")
    done
    status=0
    for p in "${pids[@]}"; do
        wait "${p}" || status=1
    done
    exit "${status}"
fi
