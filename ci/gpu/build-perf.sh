#!/usr/bin/env bash
# Builds oxccl-perf for CUDA (release, stripped) into <repo>/.gpu/oxccl-perf for the GPU
# machine; then run ci/gpu/run-allreduce.sh there.
#
#     ci/gpu/build-perf.sh
#
# nvcc is needed for the kernels crate's fatbin: ci/toolchains/cuda.sh installs it into
# .toolchains/cuda, whose env.sh is sourced here (and the script run when it is missing).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${repo_root}"
if [[ ! -f .toolchains/cuda/env.sh ]]; then
    ci/toolchains/cuda.sh
fi
# shellcheck disable=SC1091
. .toolchains/cuda/env.sh
target_dir="${CARGO_TARGET_DIR:-${repo_root}/target}"
cargo build --release -p oxccl-perf --features cuda
mkdir -p .gpu
install -m 0755 "${target_dir}/release/oxccl-perf" .gpu/oxccl-perf
strip .gpu/oxccl-perf 2>/dev/null || true
ls -l .gpu/oxccl-perf
