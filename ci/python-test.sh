#!/usr/bin/env bash
# The Python package on the host backend (CI row "python [host]"): builds the wheel with
# maturin (debug profile, sharing CARGO_TARGET_DIR with the cargo rows), installs it into the
# venv ci/install.sh made, and runs python/tests with pytest from outside python/ (so the
# installed package, not the source folder, is imported). pytest exits non-zero when no test
# ran (exit 5), so an empty collection fails the row too.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
VENV="${OXCCL_PY_VENV:-$CARGO_TARGET_DIR/python-venv}"
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "ci/python-test.sh: no venv at $VENV (run ci/install.sh)"; exit 1; }
WHEELS="$CARGO_TARGET_DIR/wheels"
rm -rf "$WHEELS"
"$VENV/bin/maturin" build --manifest-path python/Cargo.toml --out "$WHEELS" --interpreter "$PY"
"$PY" -m pip install --quiet --force-reinstall --no-deps "$WHEELS"/oxccl-*.whl
cd "$CARGO_TARGET_DIR"
OXCCL_BACKEND=host OXCCL_TIMEOUT_MS=20000 timeout --kill-after=10 600 \
    "$PY" -m pytest -p no:cacheprovider -q "$ROOT/python/tests" --ignore="$ROOT/python/tests/gpu"
