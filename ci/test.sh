#!/usr/bin/env bash
# The test command of README.md. Installs what is missing (ci/install.sh), then runs
# `cargo fmt --check`, clippy with -D warnings and the tests for every feature set, sharing
# one target directory so each feature build only recompiles what its features change.
# Prints a summary table of the matrix and exits non-zero if any row failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
export CARGO_TERM_COLOR=never
export RUST_BACKTRACE=1
START=$(date +%s)

bash ci/install.sh || { echo "ci/test.sh: installing the toolchains failed"; exit 1; }
# The toolchain scripts leave env files that point the builds at nvcc and the HIP prefix.
for env_file in .toolchains/cuda/env.sh .toolchains/hip/env.sh; do
    # shellcheck disable=SC1090
    [ -f "$env_file" ] && . "$env_file"
done

ROWS=()
FAILED=0
run() {
    local name=$1
    shift
    local t0=$SECONDS
    echo
    echo "=== $name: $*"
    "$@"
    record "$name" $? "$t0"
}

# Adds a row of the summary table: name, exit status, start (in $SECONDS).
record() {
    if [ "$2" -eq 0 ]; then
        ROWS+=("$(printf '%-28s %-5s %5ss' "$1" pass $((SECONDS - $3)))")
    else
        ROWS+=("$(printf '%-28s %-5s %5ss' "$1" FAIL $((SECONDS - $3)))")
        FAILED=1
    fi
}

# The feature matrix. "host" is the default build, which is also the no-IB build. The rows
# of IMAGE_MATRIX need the device images, which compile beside the others (IMAGE_CACHE below).
MATRIX=("host:" "ib:ib")
IMAGE_MATRIX=("cuda:cuda" "rocm:rocm" "cuda+rocm:cuda,rocm")

# Integration tests that pin the host backend (BackendKind::Host, OXCCL_BACKEND=host): the
# multi-process collective matrices. A feature adds backends they never open, so they run
# the same code in every row; the host row runs them, the feature rows build and link them
# (`--no-run`) and run every other target. About 170 s of each feature row's 250 s.
HOST_PINNED=(abort_host allgather_host allreduce_host alltoall_host alltoallv_host
    auto_register_cache broadcast_host premul_host reduce_host reducescatter_host host_run)

# The feature rows' test targets: --lib --bins --examples and every integration test not in
# HOST_PINNED. Fails if a pinned name is no longer a test target (the list went stale).
feature_row_selection() {
    cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
pinned = set(sys.argv[1:])
tests = {t["name"] for p in json.load(sys.stdin)["packages"] for t in p["targets"]
         if t["kind"] == ["test"]}
stale = sorted(pinned - tests)
if stale:
    sys.exit("ci/test.sh: HOST_PINNED names no test target: " + " ".join(stale))
print(" ".join(["--lib", "--bins", "--examples"] +
               [a for t in sorted(tests - pinned) for a in ("--test", t)]))
' "${HOST_PINNED[@]}"
}

feature_row_tests() {
    local features=$1 selection
    selection=$(feature_row_selection) || return 1
    cargo test --no-run --workspace --all-targets --features "$features" || return 1
    # shellcheck disable=SC2086 # the selection is a list of flags and target names
    cargo test --no-fail-fast --workspace --features "$features" $selection
}

# The two kernel images (nvcc for sm_90, clang for gfx942) are about 30 of the matrix's CPU
# minutes, each mostly one single-threaded pass over one translation unit, and they depend on
# no Rust code. So they compile from the start, side by side (kernels/build.rs), at the
# lowest priority beside the rows that need no image, in a target directory of their own
# (cargo locks one per build) but into the image cache the feature rows read
# (kernels/build.rs `run_cached`); those rows wait for them.
IMAGE_CACHE="$CARGO_TARGET_DIR/oxccl-kernel-cache"
IMAGES_LOG="$CARGO_TARGET_DIR/kernel-images.log"
mkdir -p "$IMAGE_CACHE"
IMAGES_T0=$SECONDS
OXCCL_KERNEL_CACHE="$IMAGE_CACHE" CARGO_TARGET_DIR="$CARGO_TARGET_DIR/kernel-images" \
    nice -n 19 cargo build -p oxccl-kernels --features cuda,rocm >"$IMAGES_LOG" 2>&1 &
IMAGES_PID=$!

# Waits for the images (a row of their own, timed from the start of their build); their log
# is printed either way.
wait_for_images() {
    local status=0
    wait "$IMAGES_PID" || status=$?
    echo
    echo "=== kernel images (built beside the rows above): $IMAGES_LOG"
    cat "$IMAGES_LOG"
    record "kernel images" "$status" "$IMAGES_T0"
}

# The rows that need no device image: they run while the images compile.
host_only_rows() {
    # Doc tests (--all-targets leaves them out): the README's Rust example among them.
    run "doc tests [host]" cargo test --workspace --doc

    # liboxccl_nccl.so (the NCCL C API) from C: a test program built against its nccl.h with
    # gcc, run on the host backend across forked processes (no GPU needed).
    run "nccl-api C test" bash ci/nccl-api-test.sh

    # The Python package (python/): the abi3 wheel built by maturin, installed in the venv of
    # ci/install.sh, and its host-backend pytest suite (2 and 3 processes).
    run "python [host]" bash ci/python-test.sh

    # Issue #21's faults phase on the host backend: a killed rank, a skipped call, a rank that
    # exits without destroying, mismatched calls, an abort from another thread (issue #17);
    # survivors must error within the bound and the next job must pass (the same script runs
    # on GPUs, ci/gpu/faults.sh).
    run "faults [host]" bash -c 'cargo build -q -p oxccl-gpu-suite -p oxccl-perf && \
        OXCCL_BACKEND=host BIN="$CARGO_TARGET_DIR/debug" OUT="$CARGO_TARGET_DIR/faults" \
        OXCCL_TIMEOUT_MS=10000 OXCCL_FAULT_ELEMS=1000000 NEXT_MAX=4M bash ci/gpu/faults.sh'
}

# clippy and the tests of one "label:features" entry of the matrix.
matrix_row() {
    local label=${1%%:*} features=${1#*:}
    local args=(--workspace --all-targets)
    [ -n "$features" ] && args+=(--features "$features")
    run "clippy [$label]" cargo clippy "${args[@]}" -- -D warnings
    if [ -z "$features" ]; then
        run "test [$label]" cargo test --no-fail-fast "${args[@]}"
    else
        run "test [$label]" feature_row_tests "$features"
    fi
}

run "fmt" cargo fmt --all --check
# Rows without a device image first, then the image rows once the images exist.
for entry in "${MATRIX[@]}"; do matrix_row "$entry"; done
host_only_rows
wait_for_images
for entry in "${IMAGE_MATRIX[@]}"; do matrix_row "$entry"; done

# The device images the cuda+rocm rows built: sm_90 SASS and the gfx942 ELF flag are there,
# and both disassemblies show the system-scope release add of the signal path.
run "kernel artifacts" env PROFILE=debug bash ci/toolchains/check-artifacts.sh cuda rocm

echo
echo "== oxccl CI matrix ($(( $(date +%s) - START ))s) =="
printf '%s\n' "${ROWS[@]}"
exit $FAILED
