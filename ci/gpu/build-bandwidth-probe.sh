#!/usr/bin/env bash
# Compiles the bandwidth probe (ci/gpu/probe/bandwidth_probe.cu) for sm_90 into
# <repo>/.gpu/probe/bandwidth_probe.o; `ci/gpu/session.sh bwprobe` links and runs it on a
# machine with 2 GPUs. The probe is self-contained (no oxccl kernels), so this is quick,
# but it happens here all the same, off the GPU machine's clock.
#
#     ci/gpu/build-bandwidth-probe.sh
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${repo_root}"
if [[ ! -f .toolchains/cuda/env.sh ]]; then
    ci/toolchains/cuda.sh
fi
# shellcheck disable=SC1091
. .toolchains/cuda/env.sh
mkdir -p .gpu/probe
nvcc -c -std=c++20 -O3 -arch=sm_90 ci/gpu/probe/bandwidth_probe.cu -o .gpu/probe/bandwidth_probe.o
ls -l .gpu/probe/bandwidth_probe.o
