#!/usr/bin/env bash
# Checks the kernel images that `cargo build -p oxccl-kernels --features cuda,rocm` built:
#   - the CUDA fatbin holds sm_90 SASS (cuobjdump --list-elf), and the signal kernel's SASS
#     has the system-scope release reduction: MEMBAR.*.SYS followed by RED(G).E.ADD.64...SYS
#     (nvcc 13.0 emits `MEMBAR.ALL.SYS` + `REDG.E.ADD.64.STRONG.SYS` for
#     `red.release.sys.global.add.u64`);
#   - the gfx942 code object has the gfx942 ELF flag (llvm-readelf-19), and the signal
#     kernel's disassembly has the system-scope atomic add: `buffer_wbl2 sc0 sc1` (release
#     to system scope) then `global_atomic_add_x2 ... sc1`.
#
# Usage: ci/toolchains/check-artifacts.sh [cuda] [rocm]       (default: both)
# Env:   CARGO_TARGET_DIR (default <repo>/target), PROFILE (default debug),
#        CUOBJDUMP (from .toolchains/cuda/env.sh), LLVM_READELF, LLVM_OBJDUMP.
# Sources .toolchains/{cuda,hip}/env.sh when present.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
target="${CARGO_TARGET_DIR:-${repo_root}/target}"
profile="${PROFILE:-debug}"
for env in "${repo_root}/.toolchains/cuda/env.sh" "${repo_root}/.toolchains/hip/env.sh"; do
    # shellcheck disable=SC1090
    [[ -f "${env}" ]] && . "${env}"
done
what=("$@")
((${#what[@]})) || what=(cuda rocm)
fail=0

# The newest image of that name among the crate's build-script outputs.
find_image() {
    find "${target}/${profile}/build" -path '*/oxccl-kernels-*/out/*' -name "$1" -printf '%T@ %p\n' 2>/dev/null \
        | sort -n | tail -n1 | cut -d' ' -f2-
}

check() { # description, command...
    local what="$1"; shift
    if "$@"; then echo "ok:   ${what}"; else echo "FAIL: ${what}"; fail=1; fi
}

for w in "${what[@]}"; do
    case "${w}" in
    cuda)
        fatbin="$(find_image oxccl_kernels.fatbin)"
        [[ -n "${fatbin}" ]] || { echo "FAIL: no oxccl_kernels.fatbin under ${target}/${profile} (build with --features cuda)"; fail=1; continue; }
        cuobjdump="${CUOBJDUMP:-cuobjdump}"
        echo "== CUDA fatbin ${fatbin}"
        elfs="$("${cuobjdump}" --list-elf "${fatbin}")"
        echo "${elfs}"
        check "fatbin holds sm_90 SASS" grep -q 'sm_90' <<<"${elfs}"
        ptx="$("${cuobjdump}" --list-ptx "${fatbin}" 2>/dev/null || true)"
        check "fatbin holds no PTX" test -z "${ptx}"
        sass="$("${cuobjdump}" --dump-sass --function oxccl_test_signal "${fatbin}")"
        ops="$(grep -oE '(MEMBAR|FENCE|REDG?|ATOMG?)\.[A-Z0-9_.]+' <<<"${sass}" || true)"
        echo "${ops}"
        check "oxccl_test_signal: system-scope release fence" grep -qE '^(MEMBAR|FENCE)\.[A-Z.]*SYS' <<<"${ops}"
        check "oxccl_test_signal: RED.E.ADD.64 ... .SYS" grep -qE '^REDG?\.E\.ADD\.64\.[A-Z.]*SYS' <<<"${ops}"
        ;;
    rocm)
        co="$(find_image 'oxccl_kernels.gfx942.co')"
        [[ -n "${co}" ]] || { echo "FAIL: no oxccl_kernels.gfx942.co under ${target}/${profile} (build with --features rocm)"; fail=1; continue; }
        readelf="${LLVM_READELF:-llvm-readelf-19}"
        objdump="${LLVM_OBJDUMP:-llvm-objdump-19}"
        echo "== gfx942 code object ${co}"
        flags="$("${readelf}" -h "${co}" | grep -i 'flags')"
        echo "${flags}"
        check "ELF flags name gfx942" grep -q 'gfx942' <<<"${flags}"
        check "kernel symbol oxccl_test_signal present" bash -c "'${readelf}' -s '${co}' | grep -q 'oxccl_test_signal\$'"
        dis="$("${objdump}" --mcpu=gfx942 -d --disassemble-symbols=oxccl_test_signal "${co}")"
        grep -E 'buffer_wbl2|global_atomic|flat_atomic' <<<"${dis}" | sed 's/^\s*//; s/\s*\/\/.*$//' || true
        check "oxccl_test_signal: release writeback to system scope (buffer_wbl2 sc0 sc1)" grep -qE 'buffer_wbl2 sc0 sc1' <<<"${dis}"
        check "oxccl_test_signal: global_atomic_add_x2 ... sc1 (system scope)" grep -qE '(global|flat)_atomic_add_x2 .*sc1' <<<"${dis}"
        ;;
    *) echo "unknown check '${w}' (cuda|rocm)"; exit 2 ;;
    esac
done
exit "${fail}"
