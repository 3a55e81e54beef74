#!/usr/bin/env bash
# Compiles the bandwidth probes (ci/gpu/probe/bandwidth_probe.cu, ce_overlap_probe.cu,
# reduce_probe.cu) for
# sm_90 into <repo>/.gpu/probe/*.o, and the timeline shim gpu_trace.c (LD_PRELOAD, CUPTI); `ci/gpu/session.sh bwprobe` and `ceoverlap` link and run
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
for probe in bandwidth_probe ce_overlap_probe reduce_probe; do
    nvcc -c -std=c++20 -O3 -arch=sm_90 "ci/gpu/probe/${probe}.cu" -o ".gpu/probe/${probe}.o"
done
# The timeline shim (ci/gpu/probe/gpu_trace.c) needs CUPTI's headers and library, from
# PyPI beside the toolchain; the library travels in .gpu/probe (the device's own copy may
# not be on its library path).
cupti=".toolchains/cupti"
if [[ ! -f "${cupti}/.installed" ]]; then
    rm -rf "${cupti}"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "${cupti}" \
        "nvidia-cuda-cupti==13.0.85"
    touch "${cupti}/.installed"
fi
cupti_include="$(dirname "$(find "${cupti}" -name cupti.h | head -n1)")"
cupti_lib="$(dirname "$(find "${cupti}" -name 'libcupti.so.*' | head -n1)")"
install -m 0644 "${cupti_lib}/libcupti.so.13" .gpu/probe/libcupti.so.13
gcc -std=c11 -shared -fPIC -O2 -Wall -Wextra -I"${cupti_include}" -I"${CUDA_HOME}/include" \
    ci/gpu/probe/gpu_trace.c -L"${cupti_lib}" -l:libcupti.so.13 -o .gpu/probe/libgpu_trace.so
ls -l .gpu/probe/
