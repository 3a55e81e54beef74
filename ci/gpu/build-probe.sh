#!/usr/bin/env bash
# Compiles the latency probe (ci/gpu/probe/latency_probe.cu) for sm_90 into
# <repo>/.gpu/probe/latency_probe.o; `ci/gpu/session.sh probe` links and runs it on a
# machine with 2 GPUs. Compiling takes minutes (it includes every allreduce kernel), so it
# happens here, not on the GPU machine's clock.
#
#     ci/gpu/build-probe.sh
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${repo_root}"
if [[ ! -f .toolchains/cuda/env.sh ]]; then
    ci/toolchains/cuda.sh
fi
# shellcheck disable=SC1091
. .toolchains/cuda/env.sh
mkdir -p .gpu/probe
nvcc -c -std=c++20 -O3 --split-compile=0 -arch=sm_90 -Ikernels/include \
    ci/gpu/probe/latency_probe.cu -o .gpu/probe/latency_probe.o
ls -l .gpu/probe/latency_probe.o
