#!/usr/bin/env bash
# Compiles the bandwidth probes (ci/gpu/probe/bandwidth_probe.cu, ce_overlap_probe.cu) for
# sm_90 into <repo>/.gpu/probe/*.o; `ci/gpu/session.sh bwprobe` and `ceoverlap` link and run
# them on a machine with 2 GPUs. The probes are self-contained (no oxccl kernels), so this is
# quick, but it happens here all the same, off the GPU machine's clock.
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
for probe in bandwidth_probe ce_overlap_probe; do
    nvcc -c -std=c++20 -O3 -arch=sm_90 "ci/gpu/probe/${probe}.cu" -o ".gpu/probe/${probe}.o"
done
ls -l .gpu/probe/
