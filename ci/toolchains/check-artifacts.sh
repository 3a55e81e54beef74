#!/usr/bin/env bash
# Checks the kernel images that `cargo build -p oxccl-kernels --features cuda,rocm` built:
#   - the CUDA fatbin holds sm_90 SASS (cuobjdump --list-elf), and the signal kernel's SASS
#     has the system-scope release reduction: MEMBAR.*.SYS followed by RED(G).E.ADD.64...SYS
#     (nvcc 13.0 emits `MEMBAR.ALL.SYS` + `REDG.E.ADD.64.STRONG.SYS` for
#     `red.release.sys.global.add.u64`);
#   - the sm_90 registers and stack of every kernel of the fatbin are printed
#     (cuobjdump -res-usage), and every kernel keeps its STACK (bytes of local memory per
#     thread) within its bound in ci/toolchains/kernel-stack-sm90.txt: 0 for a kernel not
#     listed there;
#   - the gfx942 code object has the gfx942 ELF flag (llvm-readelf-19), and the signal
#     kernel's disassembly has the system-scope atomic add: `buffer_wbl2 sc0 sc1` (release
#     to system scope) then `global_atomic_add_x2 ... sc1`;
#   - every kernel of the gfx942 code object is scratch-free (.private_segment_fixed_size
#     0, no VGPR spilled to memory) and uses at most 128 VGPRs, ArchVGPRs and AccVGPRs
#     together (.vgpr_count of the AMDGPU metadata notes: on gfx90a/gfx942 the unified
#     count the hardware allocates, ArchVGPRs rounded up to 4 plus AGPRs), so a SIMD holds
#     4 waves of every kernel. SGPR spills to VGPR lanes are shown, not failed.
#
# The numbers are the real ones in any cargo profile: kernels/build.rs always compiles
# device code with -O3 (nvcc and clang), whatever the profile's opt-level.
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

max_vgprs=128
stack_bounds="${repo_root}/ci/toolchains/kernel-stack-sm90.txt"

# Per-kernel resources of the gfx942 code object, from its AMDGPU metadata note; fails when a
# kernel uses scratch, spills VGPRs, or needs more than ${max_vgprs} VGPRs.
check_gfx942_resources() { # readelf, code object
    "$1" --notes "$2" | awk -v max="${max_vgprs}" '
        function flush() {
            if (name == "") return
            bad = ""
            if (priv != 0) bad = bad " scratch"
            if (vspill != 0) bad = bad " vgpr-spill"
            if (vgpr > max) bad = bad " vgprs>" max
            if (vgpr < agpr) bad = bad " vgpr_count<agpr_count?"
            printf "%-36s %7d %6d %5d %6d %6d  %s\n", name, priv, vgpr, agpr, sspill, vspill, (bad == "" ? "ok" : "FAIL:" bad)
            if (bad != "") nbad++
            n++
            name = ""
        }
        BEGIN {
            printf "%-36s %7s %6s %5s %6s %6s\n", "gfx942 kernel", "scratch", "vgprs", "agprs", "sspill", "vspill"
        }
        # One kernel per "  - " entry of the amdhsa.kernels list; its keys are indented by four.
        /^[^ ]/ { flush(); in_kernels = ($0 ~ /^amdhsa\.kernels:/); next }
        in_kernels && /^  - / { flush(); priv = vgpr = agpr = sspill = vspill = -1; name = "?" }
        in_kernels {
            line = $0; sub(/^  - /, "    ", line)
            if (line !~ /^    \.[a-z_]+: /) next
            split(line, kv, /: +/); key = kv[1]; val = kv[2]; gsub(/ /, "", key)
            if (key == ".name") name = val
            else if (key == ".private_segment_fixed_size") priv = val + 0
            else if (key == ".vgpr_count") vgpr = val + 0
            else if (key == ".agpr_count") agpr = val + 0
            else if (key == ".sgpr_spill_count") sspill = val + 0
            else if (key == ".vgpr_spill_count") vspill = val + 0
        }
        END {
            flush()
            if (n == 0) { print "no kernels in the metadata note"; exit 1 }
            printf "%d kernels, %d over budget (scratch, VGPR spills, or more than %d VGPRs incl. AGPRs)\n", n, nbad, max
            exit nbad != 0
        }'
}

# Per-kernel sm_90 registers and stack (cuobjdump -res-usage); fails when a kernel's STACK
# exceeds its bound in ${stack_bounds} (0 for a kernel not listed there), or when a kernel
# listed there is not in the fatbin (a stale bound).
check_sm90_stack() { # cuobjdump, fatbin
    "$1" -res-usage "$2" | awk -v bounds="${stack_bounds}" '
        BEGIN {
            while ((getline line < bounds) > 0) {
                sub(/#.*/, "", line)
                if (split(line, f, " ") >= 2) bound[f[1]] = f[2] + 0
            }
            printf "%-36s %5s %6s %6s  %s\n", "sm_90 kernel", "REG", "STACK", "bound", ""
        }
        /Function [A-Za-z0-9_]+:/ { fn = $2; sub(/:$/, "", fn); next }
        fn != "" && /REG:[0-9]+/ {
            reg = $0; sub(/.*REG:/, "", reg); sub(/ .*/, "", reg)
            st = $0; sub(/.*STACK:/, "", st); sub(/ .*/, "", st)
            b = (fn in bound) ? bound[fn] : 0
            seen[fn] = 1
            ok = st + 0 <= b
            printf "%-36s %5d %6d %6d  %s\n", fn, reg, st, b, ok ? "ok" : "FAIL: stack above its bound"
            if (!ok) nbad++
            n++
            fn = ""
        }
        END {
            if (n == 0) { print "no kernels in cuobjdump -res-usage"; exit 1 }
            for (k in bound) if (!(k in seen)) { printf "%s: bound listed, but no such kernel\n", k; nbad++ }
            printf "%d kernels, %d over their stack bound (or stale bounds)\n", n, nbad
            exit nbad != 0
        }'
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
        check "sm_90 kernels within their stack bounds" check_sm90_stack "${cuobjdump}" "${fatbin}"
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
        check "gfx942 kernels scratch-free with at most ${max_vgprs} VGPRs" check_gfx942_resources "${readelf}" "${co}"
        ;;
    *) echo "unknown check '${w}' (cuda|rocm)"; exit 2 ;;
    esac
done
exit "${fail}"
