#!/usr/bin/env bash
# Builds the CUDA GPU suite (release, stripped) into <repo>/.gpu/ for the GPU machine.
#
#     ci/gpu/build-cuda.sh          # then: ci/gpu/run-cuda.sh on the GPU machine
#
# nvcc is needed for the kernels crate's fatbin: ci/toolchains/cuda.sh installs it into
# .toolchains/cuda, whose env.sh is sourced here when present.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${repo_root}"
if [[ -f .toolchains/cuda/env.sh ]]; then
    # shellcheck disable=SC1091
    . .toolchains/cuda/env.sh
fi
target_dir="${CARGO_TARGET_DIR:-${repo_root}/target}"
cargo build --release -p oxccl-gpu-suite --features cuda
mkdir -p .gpu
install -m 0755 "${target_dir}/release/oxccl-gpu-suite" .gpu/oxccl-gpu-suite
strip .gpu/oxccl-gpu-suite 2>/dev/null || true
ls -l .gpu/oxccl-gpu-suite
