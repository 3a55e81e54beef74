#!/usr/bin/env bash
# Builds oxccl for AMD Instinct MI300X (gfx942) against the node's own ROCm: the GPU suite,
# oxccl-perf and liboxccl_nccl.so (release, --features rocm), copied into .gpu/rocm/ for
# ci/gpu/run-rocm.sh, after the ROCm backend's unit tests against the fake HIP runtime.
#
# NOT RUN BY THIS PROJECT: no AMD GPU or ROCm installation has been available to it, so
# this script (and run-rocm.sh) has never been executed on an MI300X. It is written for a
# user who has one; please report what it prints.
#
# Usage:   ci/gpu/build-rocm.sh            (then ci/gpu/run-rocm.sh; or run-rocm.sh alone,
#                                           which calls this first)
# Needs:   ROCm in $ROCM_PATH (default /opt/rocm) with its headers and clang, a Rust
#          toolchain, a C compiler (cc) and libclang for bindgen (ROCm's own, or the
#          distribution's libclang-dev).
# Env:     ROCM_PATH         ROCm prefix (default /opt/rocm)
#          OXCCL_ROCM_ARCHS  GPU architectures for the kernels (default gfx942)
#          LIBCLANG_PATH     where bindgen finds libclang (default: ROCm's llvm/lib if present)
#          OXCCL_SKIP_FAKE_TESTS=1  skip the fake-runtime unit tests of oxccl-hal-rocm
#          OXCCL_ROCM_BIN    where the binaries go (default .gpu/rocm)
set -euo pipefail
cd "$(dirname "$0")/../.."

export ROCM_PATH="${ROCM_PATH:-/opt/rocm}"
if [[ ! -f "${ROCM_PATH}/include/hip/hip_runtime_api.h" ]]; then
    echo "build-rocm.sh: no HIP headers in ${ROCM_PATH}/include; install ROCm or set ROCM_PATH" >&2
    exit 1
fi
# The kernels are compiled with this ROCm's clang and headers (the HIP bindings of
# oxccl-hal-rocm are checked in and serve HIP 5.x, 6.x and 7.x). Drop anything that points
# the build at other headers (e.g. the CI prefix of ci/toolchains/hip.sh).
unset HIP_INCLUDE_DIR OXCCL_HIP_TOOLCHAIN HIP_CLANG ROCM_DEVICE_LIB_PATH
export HIP_PATH="${ROCM_PATH}"
export OXCCL_ROCM_ARCHS="${OXCCL_ROCM_ARCHS:-gfx942}"
if [[ -z "${LIBCLANG_PATH:-}" ]] && compgen -G "${ROCM_PATH}/llvm/lib/libclang.so*" >/dev/null; then
    export LIBCLANG_PATH="${ROCM_PATH}/llvm/lib"
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
bin="${OXCCL_ROCM_BIN:-$PWD/.gpu/rocm}"

echo "build-rocm.sh: ROCm $(cat "${ROCM_PATH}/.info/version" 2>/dev/null || echo '(version unknown)') in ${ROCM_PATH}, archs ${OXCCL_ROCM_ARCHS}"

if [[ "${OXCCL_SKIP_FAKE_TESTS:-0}" != 1 ]]; then
    # The backend against a fake HIP runtime compiled from these same headers (the fake
    # tests find them through ROCM_PATH): checks this generation's values, the stream wrap and the IPC cache
    # before anything touches a GPU.
    cargo test -p oxccl-hal-rocm --features rocm
fi

cargo build --release -p oxccl-gpu-suite -p oxccl-perf -p oxccl-nccl-api --features rocm
mkdir -p "${bin}"
install -m 0755 "${CARGO_TARGET_DIR}/release/oxccl-gpu-suite" "${CARGO_TARGET_DIR}/release/oxccl-perf" "${bin}/"
install -m 0755 "${CARGO_TARGET_DIR}/release/liboxccl_nccl.so" "${bin}/"
ls -l "${bin}"
