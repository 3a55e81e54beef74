#!/usr/bin/env bash
# The Python package on GPUs (issue #18): python/tests/gpu under torchrun with 2 ranks (torch's
# own launcher; the suite sets up dist.init_process_group("cpu:gloo,cuda:oxccl") itself).
# With 2+ GPUs each rank has its own GPU; with 1 GPU both ranks are time-sliced on GPU 0 (the
# suite maps LOCAL_RANK onto the GPUs there are). Checks every collective bit for bit against a
# CPU reference, registration, the custom ops eagerly / in CUDA graph capture / under
# torch.compile(fullgraph=True), the process-group route and bad input; prints per-call times
# (eager and graph-replayed) from rank 0.
#
#     ci/gpu/python.sh                      (wheel from .gpu/wheels, results in .gpu/results/python)
#     WHEELS=dir OUT=dir RANKS=2 ci/gpu/python.sh
#     PYTEST_K=eager_overhead ci/gpu/python.sh   (only the tests pytest -k selects)
#
# The wheel is built here (no GPU needed) and carried with the call:
#     . .toolchains/cuda/env.sh && maturin build --release --features cuda \
#         --manifest-path python/Cargo.toml --out .gpu/wheels
# It is one abi3 wheel (CPython >= 3.10), installed with pip --no-deps into a folder of its own on
# PYTHONPATH, so the machine's torch and Python (3.12) are used as they are. NVLS stays off.
set -uo pipefail
cd "$(dirname "$0")/../.."
WHEELS=${WHEELS:-.gpu/wheels}
OUT=${OUT:-$PWD/.gpu/results/python}
RANKS=${RANKS:-2}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OXCCL_NVLS=0 OXCCL_TIMEOUT_MS=${OXCCL_TIMEOUT_MS:-20000}
wheel=$(ls "$WHEELS"/oxccl-*.whl 2>/dev/null | head -1)
if [[ -z "$wheel" ]]; then
    echo "ci/gpu/python.sh: no oxccl wheel in $WHEELS (build it with --features cuda, see above)" >&2
    exit 2
fi
SITE="$OUT/site"
rm -rf "$SITE"
# pip's --target skips the PEP 668 check; without pip, a wheel is a zip of the same files.
python3 -m pip install --quiet --no-deps --target "$SITE" "$wheel" ||
    python3 -m zipfile -e "$wheel" "$SITE" || exit 2
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null || true
python3 -c 'import sys, oxccl, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "oxccl backends", oxccl.backends(), "gpus", torch.cuda.device_count())' || exit 2
# From $OUT, so python/oxccl (the source folder) cannot shadow the installed package.
cd "$OUT"
timeout --kill-after=20 "${STEP_TIMEOUT:-540}" torchrun --standalone --nproc_per_node="$RANKS" \
    -m pytest -p no:cacheprovider -q -s -x ${PYTEST_K:+-k "$PYTEST_K"} "$OLDPWD/python/tests/gpu" 2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}
echo "ci/gpu/python.sh: exit $rc (log $OUT/pytest.log)"
exit "$rc"
