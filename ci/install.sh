#!/usr/bin/env bash
# Installs what a fresh Debian bookworm machine lacks to build and test oxccl without a GPU:
# libclang (bindgen), rustfmt/clippy, the CUDA compiler from PyPI and the HIP toolchain from
# Debian packages (ci/toolchains/). Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

need_apt=()
# cmake, make, libnl, python3 and libibverbs-dev: the `ib` feature (ibverbs-sys configures rdma-core
# with cmake to generate its bindings and links the system libibverbs). python3-venv: the venv the
# Python package's row builds and tests in (ci/python-test.sh).
for pkg in libclang-dev clang pkg-config cmake make libnl-3-dev libnl-route-3-dev libibverbs-dev python3 python3-venv; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "ci/install.sh: apt-get install ${need_apt[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

if command -v rustup >/dev/null 2>&1; then
    rustup component list --installed | grep -q '^rustfmt' || rustup component add rustfmt
    rustup component list --installed | grep -q '^clippy' || rustup component add clippy
fi

for script in ci/toolchains/cuda.sh ci/toolchains/hip.sh; do
    if [ -f "$script" ]; then
        echo "ci/install.sh: $script"
        bash "$script"
    fi
done

# The Python package's row (ci/python-test.sh): maturin, pytest and numpy from PyPI, in a venv
# under the target directory (Debian's pip refuses system-wide installs, PEP 668).
PY_VENV="${OXCCL_PY_VENV:-${CARGO_TARGET_DIR:-$PWD/target}/python-venv}"
if ! "$PY_VENV/bin/python" -c 'import maturin, pytest, numpy' >/dev/null 2>&1; then
    echo "ci/install.sh: python venv $PY_VENV (maturin, pytest, numpy)"
    python3 -m venv "$PY_VENV"
    "$PY_VENV/bin/python" -m pip install --quiet --upgrade pip
    "$PY_VENV/bin/python" -m pip install --quiet "maturin>=1.5,<2" pytest numpy
fi
