#!/usr/bin/env bash
# Does the CPU a rank runs on decide PyTorch's eager small-call time? The small sizes of
# ci/gpu/torch_nccl_api.py (up to 12345 elements), 2 ranks, timed under several CPU
# bindings (OXCCL_TORCH_CPUS, one list per rank), each binding run twice per side,
# alternating the real NCCL and liboxccl_nccl.so; one line per run.
#
#     ci/gpu/torch-pinning.sh [LIB] [BINDING...]   (default: none, "0-7;8-15", "0-7;32-39")
#
# Output: $OUT/torch-pinning/ (each run's timing.json and log). NVLS stays off.
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
lib="$(realpath "${1:-${repo_root}/.gpu/bin/liboxccl_nccl.so}")"
shift || true
bindings=("$@")
[[ ${#bindings[@]} -gt 0 ]] || bindings=(none "0-7;8-15" "0-7;32-39")
script="${repo_root}/ci/gpu/torch_nccl_api.py"
results="${OUT:-${repo_root}/.gpu/results}/torch-pinning"
export NCCL_NVLS_ENABLE=0
unset OXCCL_NVLS
if [[ -z "${OXCCL_NCCL_LIB_PATH:-}" ]]; then
    guess="$(python3 -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)"
    [[ -n "${guess}" && -f "${guess}" ]] && export OXCCL_NCCL_LIB_PATH="${guess}"
fi
mkdir -p "${results}"
lscpu | grep -E '^(CPU\(s\)|Thread|Core|Socket|NUMA|Model name)' || true
echo "cpu0 siblings: $(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list 2>/dev/null)"

# One line per run: bf16 burst / host / graph / single at 1, 1000 and 12345 elements.
summarize() { # summarize LABEL DIR
    python3 - "$1" "$2/timing.json" <<'PY'
import json, sys
label, path = sys.argv[1], sys.argv[2]
try:
    t = json.load(open(path))["timing"]
except (OSError, ValueError, KeyError) as e:
    print(f"{label}: no timing ({e})")
    sys.exit(0)
cells = []
for n in (1, 1000, 12345):
    c = t.get(f"bf16/{n}")
    if c:
        cells.append(f"{n}: burst {c['burst']:.1f} host {c['host']:.1f} graph {c['graph']:.1f} single {c['single']:.1f}")
print(f"{label}: " + " | ".join(cells))
PY
}

status=0
for binding in "${bindings[@]}"; do
    cpus="${binding}"
    [[ ${binding} == none ]] && cpus=""
    tag="$(tr -c 'A-Za-z0-9' '_' <<<"${binding}")"
    for again in 1 2; do
        for side in nccl oxccl; do
            dir="${results}/${tag}-${side}-${again}"
            preload=()
            [[ ${side} == oxccl ]] && preload=(LD_PRELOAD="${lib}")
            env "${preload[@]}" OXCCL_TORCH_CPUS="${cpus}" timeout --kill-after=20 120 \
                torchrun --standalone --nproc_per_node=2 "${script}" run --out "${dir}" --max-elems 12345 \
                >"${dir}.log" 2>&1 || status=1
            summarize "binding ${binding} ${side} run ${again}" "${dir}"
        done
    done
done
exit "${status}"
