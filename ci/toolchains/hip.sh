#!/usr/bin/env bash
# Installs what building oxccl-kernels with `--features rocm` needs on Debian bookworm
# (root): clang/lld 19 from bookworm, and HIP headers plus AMD device bitcode from Debian
# trixie's packages, unpacked (never installed) into <repo>/.toolchains/hip.
# Also unpacks the HIP 6.x and 7.x headers (pinned libamdhip64-dev packages of Debian sid
# and experimental) next to trixie's 5.7: oxccl-hal-rocm's tests build their fake HIP
# runtime once per ABI generation from them and check that regenerating the checked-in
# bindings (hal-rocm/src/sys/v{5,6,7}.rs) reproduces them.
#
# Usage:
#     ci/toolchains/hip.sh             # installs once; re-runs return at once
#     . .toolchains/hip/env.sh         # exports OXCCL_HIP_TOOLCHAIN, HIP_CLANG, LIBCLANG_PATH, ...
#
# Why trixie: bookworm's own ROCm (5.2) predates gfx942. Trixie's HIP 5.7 headers and
# rocm-device-libs 6.0 (with oclc_isa_version_942.bc) are enough for device-only builds.
# The trixie packages are fetched through a private apt configuration (its own sources
# list, lists and cache directories), so the system's apt state is not touched.
set -euo pipefail

# System packages from bookworm itself. libclang-dev is for bindgen (build.rs).
APT_PACKAGES=(clang-19 lld-19 llvm-19 libclang-dev dpkg-dev)

# ---- Packages taken from Debian trixie and unpacked into the prefix. -------------------
# Other crates (hal-rocm's bindgen of the HIP runtime API) may append names here.
TRIXIE_PACKAGES=(
    libamdhip64-dev
    libhsa-runtime-dev
    rocm-device-libs-17
)
# -----------------------------------------------------------------------------------------

# ---- HIP headers of the later ABI generations: pinned .debs (pool path and SHA256). -----
# Fetched by path, not through apt's sid/experimental indexes (tens of MB): the versions are
# pinned so that regenerating the bindings is reproducible. If the Debian mirror no longer
# carries one, snapshot.debian.org does.
HIP_GENERATION_DEBS=(
    "6 pool/main/r/rocm-hipamd/libamdhip64-dev_6.4.3-5_amd64.deb f2a3a542d41883f87a45e2d0554c1c84ccf350c836b9e8b35473dadbc34ced5e"
    "7 pool/main/r/rocm-hipamd/libamdhip64-dev_7.2.4-1~exp2_amd64.deb 28ae316c5be2d33b53fae8f2151e76a758f84aa3493abafeaef935e49cc5ba07"
)
SNAPSHOT="${OXCCL_DEBIAN_SNAPSHOT:-https://snapshot.debian.org/archive/debian/20261125T000000Z}"
# -----------------------------------------------------------------------------------------

TRIXIE_SUITE="${OXCCL_TRIXIE_SUITE:-trixie}"
DEBIAN_MIRROR="${OXCCL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
KEYRING="/usr/share/keyrings/debian-archive-keyring.gpg"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
prefix="${OXCCL_TOOLCHAINS:-${repo_root}/.toolchains}/hip"
stamp="${prefix}/.installed"
want="$(printf '%s\n' "${APT_PACKAGES[@]}" "--" "${TRIXIE_PACKAGES[@]}" "--" "${HIP_GENERATION_DEBS[@]}")"

if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${want}" && -f "${prefix}/env.sh" ]] \
    && command -v clang-19 >/dev/null; then
    echo "hip.sh: already installed in ${prefix}"
    cat "${prefix}/env.sh"
    exit 0
fi

sudo=""
[[ "$(id -u)" == 0 ]] || sudo="sudo"

missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    ${sudo} apt-get update -qq
    DEBIAN_FRONTEND=noninteractive ${sudo} apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# A private apt configuration that knows only trixie.
aptdir="${prefix}/.apt"
mkdir -p "${aptdir}/lists/partial" "${aptdir}/cache/archives/partial" "${aptdir}/debs"
signed=""
[[ -f "${KEYRING}" ]] && signed="[signed-by=${KEYRING}] "
echo "deb ${signed}${DEBIAN_MIRROR} ${TRIXIE_SUITE} main" > "${aptdir}/sources.list"
apt_opts=(
    -o "Dir::Etc::SourceList=${aptdir}/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=${aptdir}/lists"
    -o "Dir::Cache=${aptdir}/cache"
    -o "Dir::State::status=/dev/null"
    -o "APT::Architecture=amd64"
    -o "Debug::NoLocking=1"
    -o "APT::Sandbox::User=root"
)
apt-get "${apt_opts[@]}" update -qq
(cd "${aptdir}/debs" && rm -f ./*.deb && apt-get "${apt_opts[@]}" download "${TRIXIE_PACKAGES[@]}")

root="${prefix}/root"
rm -rf "${root}"
mkdir -p "${root}"
for deb in "${aptdir}"/debs/*.deb; do
    dpkg-deb -x "${deb}" "${root}"
done

# Where the pieces landed (paths differ between Debian releases: search, don't assume).
hip_header="$(find "${root}" -path '*/include/hip/hip_runtime.h' | head -n1)"
[[ -n "${hip_header}" ]] || { echo "hip.sh: hip/hip_runtime.h not found in ${TRIXIE_PACKAGES[*]}" >&2; exit 1; }
hip_include="$(dirname "$(dirname "${hip_header}")")"
isa_bc="$(find "${root}" -name 'oclc_isa_version_942.bc' | head -n1)"
[[ -n "${isa_bc}" ]] || { echo "hip.sh: oclc_isa_version_942.bc not found (rocm-device-libs too old?)" >&2; exit 1; }
bitcode="$(dirname "${isa_bc}")"

# clang's HIP driver wants a HIP "installation": <hip>/include/hip and a version file.
# Trixie puts headers in /usr/include, so give clang a small, self-describing prefix.
hip_path="${prefix}/hip-path"
rm -rf "${hip_path}"
mkdir -p "${hip_path}/bin" "${hip_path}/share/hip"
ln -s "${hip_include}" "${hip_path}/include"
hip_ver_h="${hip_include}/hip/hip_version.h"
major="$(sed -n 's/^#define HIP_VERSION_MAJOR \([0-9]*\).*/\1/p' "${hip_ver_h}" 2>/dev/null || true)"
minor="$(sed -n 's/^#define HIP_VERSION_MINOR \([0-9]*\).*/\1/p' "${hip_ver_h}" 2>/dev/null || true)"
patch="$(sed -n 's/^#define HIP_VERSION_PATCH \([0-9]*\).*/\1/p' "${hip_ver_h}" 2>/dev/null || true)"
printf 'HIP_VERSION_MAJOR=%s\nHIP_VERSION_MINOR=%s\nHIP_VERSION_PATCH=%s\n' \
    "${major:-5}" "${minor:-7}" "${patch:-0}" | tee "${hip_path}/bin/.hipVersion" > "${hip_path}/share/hip/version"

# The HIP 6.x and 7.x headers, each in its own root (only the headers are used).
declare -A gen_include=([5]="${hip_include}")
for entry in "${HIP_GENERATION_DEBS[@]}"; do
    read -r gen pool sha <<<"${entry}"
    deb="${aptdir}/debs/$(basename "${pool}")"
    if ! /usr/lib/apt/apt-helper -qq -o APT::Sandbox::User=root download-file "${DEBIAN_MIRROR}/${pool}" "${deb}" "SHA256:${sha}"; then
        /usr/lib/apt/apt-helper -qq -o APT::Sandbox::User=root download-file "${SNAPSHOT}/${pool}" "${deb}" "SHA256:${sha}"
    fi
    gen_root="${prefix}/hip${gen}"
    rm -rf "${gen_root}"
    mkdir -p "${gen_root}"
    dpkg-deb -x "${deb}" "${gen_root}"
    h="$(find "${gen_root}" -path '*/include/hip/hip_runtime_api.h' | head -n1)"
    [[ -n "${h}" ]] || { echo "hip.sh: hip/hip_runtime_api.h not found in $(basename "${pool}")" >&2; exit 1; }
    gen_include[${gen}]="$(dirname "$(dirname "${h}")")"
done

clang="$(command -v clang-19)"
libclang_dir="$(dirname "$(find /usr/lib/llvm-*/lib -maxdepth 1 -name 'libclang.so*' | sort -V | tail -n1)")"

cat > "${prefix}/env.sh" <<ENV
# Generated by ci/toolchains/hip.sh. Source it before \`cargo build --features rocm\`.
export OXCCL_HIP_TOOLCHAIN="${prefix}"
export HIP_CLANG="${clang}"
export HIP_PATH="${hip_path}"
export HIP_INCLUDE_DIR="${hip_include}"
export ROCM_DEVICE_LIB_PATH="${bitcode}"
export LIBCLANG_PATH="${libclang_dir}"
# One include directory per HIP ABI generation (oxccl-hal-rocm's fake runtimes and the
# check of its checked-in bindings); with ALL_GENERATIONS its tests fail if one is missing.
export OXCCL_HIP5_INCLUDE_DIR="${gen_include[5]}"
export OXCCL_HIP6_INCLUDE_DIR="${gen_include[6]}"
export OXCCL_HIP7_INCLUDE_DIR="${gen_include[7]}"
export OXCCL_HIP_ALL_GENERATIONS=1
ENV
printf '%s\n' "${want}" > "${stamp}"
cat "${prefix}/env.sh"
