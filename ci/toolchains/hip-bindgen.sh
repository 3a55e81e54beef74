#!/usr/bin/env bash
# Regenerates oxccl-hal-rocm's checked-in HIP bindings (hal-rocm/src/sys/v{5,6,7}.rs) from
# the HIP 5.7, 6.4 and 7.2 headers that ci/toolchains/hip.sh unpacks, through the bindgen
# run of hal-rocm/build.rs. Review the diff: a value or layout that changed for something
# oxccl uses needs a translation in hal-rocm/src/sys/mod.rs. CI does not run this; it runs
# tests/bindings.rs, which fails when regenerating would change a file.
#
# Usage:   ci/toolchains/hip-bindgen.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bash ci/toolchains/hip.sh >/dev/null
# shellcheck disable=SC1091
. "${OXCCL_TOOLCHAINS:-.toolchains}/hip/env.sh"
OXCCL_HIP_BINDGEN_WRITE=1 cargo check -q -p oxccl-hal-rocm --features rocm
# The next build regenerates into OUT_DIR again (not over src/), for the comparison test.
cargo check -q -p oxccl-hal-rocm --features rocm
git status --short hal-rocm/src/sys
