#!/usr/bin/env bash
# Builds everything the CUDA GPU scripts run (release, stripped) into <repo>/.gpu/, the
# folder a device call carries (it is git-ignored):
#
#     .gpu/bin/oxccl-perf          oxccl-perf --features cuda
#     .gpu/bin/oxccl-gpu-suite     the multi-process suite, self-test, channels, faults
#     .gpu/bin/liboxccl_nccl.so    the NCCL-API library (PyTorch preload)
#     .gpu/bin/hal-cuda-gpu-tests  hal-cuda's lib tests (they skip without a GPU here)
#     .gpu/bin/hal-cuda-gpu-integration  hal-cuda's tests/gpu.rs (skip without a GPU)
#     .gpu/bin/nccl_group_test     ci/gpu/nccl_group_test.c linked to liboxccl_nccl.so
#     .gpu/bin/nccl_call_cost      ci/gpu/nccl_call_cost.c (loads either NCCL library)
#     .gpu/wheels/oxccl-*.whl      the Python package with CUDA (abi3)
#
#     ci/gpu/build-cuda.sh            # everything
#     ci/gpu/build-cuda.sh perf suite # only these parts (perf suite nccl hal group wheel)
#
# nvcc comes from ci/toolchains/cuda.sh (.toolchains/cuda). One target directory serves all
# parts, so the kernel image is compiled once.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${repo_root}"
if [[ ! -f .toolchains/cuda/env.sh ]]; then
    ci/toolchains/cuda.sh
fi
# shellcheck disable=SC1091
. .toolchains/cuda/env.sh
target_dir="${CARGO_TARGET_DIR:-${repo_root}/target}"
parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(perf suite nccl hal group wheel)
want() { [[ " ${parts[*]} " == *" $1 "* ]]; }
bin=.gpu/bin
mkdir -p "${bin}"
put() { # put SRC NAME: install stripped
    install -m 0755 "$1" "${bin}/$2"
    strip "${bin}/$2" 2>/dev/null || true
}

packages=()
want perf && packages+=(-p oxccl-perf)
want suite && packages+=(-p oxccl-gpu-suite)
{ want nccl || want group; } && packages+=(-p oxccl-nccl-api)
if [[ ${#packages[@]} -gt 0 ]]; then
    cargo build --release --features cuda "${packages[@]}"
fi
want perf && put "${target_dir}/release/oxccl-perf" oxccl-perf
want suite && put "${target_dir}/release/oxccl-gpu-suite" oxccl-gpu-suite
{ want nccl || want group; } && put "${target_dir}/release/liboxccl_nccl.so" liboxccl_nccl.so
if want hal; then
    # The test binaries' paths are printed by cargo as JSON: the hal-cuda lib tests and its
    # GPU integration tests (tests/gpu.rs).
    artifacts="$(cargo test --release -p oxccl-hal-cuda --no-run --message-format=json 2>/dev/null)"
    test_exe() { # test_exe TARGET: the executable cargo built for that test target
        python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1" <<<"${artifacts}" | tail -n1
    }
    exe="$(test_exe oxccl_hal_cuda)"
    gpu_exe="$(test_exe gpu)"
    [[ -n "${exe}" && -n "${gpu_exe}" ]] || { echo "build-cuda.sh: no hal-cuda test binary" >&2; exit 1; }
    put "${exe}" hal-cuda-gpu-tests
    put "${gpu_exe}" hal-cuda-gpu-integration
fi
if want group; then
    gcc -std=c11 -O1 -Wall -Wextra -Inccl-api/include -I"${CUDA_HOME}/include" \
        ci/gpu/nccl_group_test.c -L"${bin}" -loxccl_nccl -Wl,-rpath,'$ORIGIN' -ldl \
        -o "${bin}/nccl_group_test"
    gcc -std=c11 -O2 -Wall -Wextra -Inccl-api/include -I"${CUDA_HOME}/include" \
        ci/gpu/nccl_call_cost.c -ldl -o "${bin}/nccl_call_cost"
fi
if want wheel; then
    venv="${OXCCL_PY_VENV:-${target_dir}/python-venv}"
    [[ -x "${venv}/bin/maturin" ]] || bash ci/install.sh
    rm -rf .gpu/wheels
    "${venv}/bin/maturin" build --release --features cuda --manifest-path python/Cargo.toml \
        --out .gpu/wheels
fi
ls -l "${bin}" .gpu/wheels 2>/dev/null || true
du -sh .gpu
