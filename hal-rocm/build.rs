//! Generates the HIP runtime bindings (feature `hip`) with bindgen from installed headers.
//!
//! Only what oxccl calls is generated (allowlists below). The bindings describe a table of
//! function pointers filled at run time from libamdhip64 (`dynamic_library_name`): nothing
//! here links against the HIP runtime, so a machine with headers but no runtime builds.
//!
//! Where the headers are looked for, first match wins (each must hold
//! `hip/hip_runtime_api.h`):
//! 1. `HIP_INCLUDE_DIR` (the include directory itself),
//! 2. `$HIP_PATH/include`, `$ROCM_PATH/include`,
//! 3. `$OXCCL_HIP_TOOLCHAIN/{root/usr,usr,}/include` (the prefix `ci/toolchains/hip.sh` fills),
//! 4. `/opt/rocm/include`,
//! 5. `<workspace>/.toolchains/hip/root/usr/include` (hip.sh's default prefix).

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for var in [
        "HIP_INCLUDE_DIR",
        "HIP_PATH",
        "ROCM_PATH",
        "OXCCL_HIP_TOOLCHAIN",
        "LIBCLANG_PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    #[cfg(feature = "hip")]
    hip::generate();
}

/// Candidate include directories, in the order documented above.
#[cfg_attr(not(feature = "hip"), allow(dead_code))]
fn include_candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(dir) = env::var_os("HIP_INCLUDE_DIR") {
        out.push(PathBuf::from(dir));
    }
    for var in ["HIP_PATH", "ROCM_PATH"] {
        if let Some(dir) = env::var_os(var) {
            out.push(Path::new(&dir).join("include"));
        }
    }
    if let Some(dir) = env::var_os("OXCCL_HIP_TOOLCHAIN") {
        let p = PathBuf::from(dir);
        out.push(p.join("root/usr/include"));
        out.push(p.join("usr/include"));
        out.push(p.join("include"));
    }
    out.push(PathBuf::from("/opt/rocm/include"));
    if let Some(manifest) = env::var_os("CARGO_MANIFEST_DIR") {
        out.push(Path::new(&manifest).join("../.toolchains/hip/root/usr/include"));
    }
    out
}

#[cfg(feature = "hip")]
mod hip {
    use std::env;
    use std::path::PathBuf;
    use std::process::exit;

    /// Every HIP function oxccl calls. Keep in step with `src/result.rs`.
    const FUNCTIONS: &[&str] = &[
        "hipGetErrorName",
        "hipGetErrorString",
        "hipRuntimeGetVersion",
        "hipGetDeviceCount",
        "hipSetDevice",
        "hipGetDevice",
        "hipDeviceGetAttribute",
        "hipDeviceGetName",
        "hipDeviceTotalMem",
        "hipDeviceCanAccessPeer",
        "hipDeviceEnablePeerAccess",
        "hipDeviceSynchronize",
        "hipMalloc",
        "hipExtMallocWithFlags",
        "hipFree",
        "hipHostMalloc",
        "hipHostFree",
        "hipHostGetDevicePointer",
        "hipMemGetAllocationGranularity",
        "hipMemCreate",
        "hipMemRelease",
        "hipMemAddressReserve",
        "hipMemAddressFree",
        "hipMemMap",
        "hipMemUnmap",
        "hipMemSetAccess",
        "hipMemExportToShareableHandle",
        "hipMemImportFromShareableHandle",
        "hipIpcGetMemHandle",
        "hipIpcOpenMemHandle",
        "hipIpcCloseMemHandle",
        "hipStreamCreateWithFlags",
        "hipStreamDestroy",
        "hipStreamSynchronize",
        "hipStreamWaitEvent",
        "hipStreamIsCapturing",
        "hipEventCreateWithFlags",
        "hipEventDestroy",
        "hipEventRecord",
        "hipEventSynchronize",
        "hipEventElapsedTime",
        "hipMemcpyAsync",
        "hipMemsetD8Async",
        "hipModuleLoadData",
        "hipModuleUnload",
        "hipModuleGetFunction",
        "hipModuleLaunchKernel",
    ];

    /// Flag macros and version numbers oxccl uses.
    const VARS: &[&str] = &[
        "HIP_VERSION_MAJOR",
        "HIP_VERSION_MINOR",
        "HIP_IPC_HANDLE_SIZE",
        "hipIpcMemLazyEnablePeerAccess",
        "hipStreamNonBlocking",
        "hipEventDefault",
        "hipHostMallocPortable",
        "hipHostMallocMapped",
        "hipHostMallocCoherent",
        "hipDeviceMallocFinegrained",
        "hipDeviceMallocUncached",
    ];

    pub(super) fn generate() {
        let Some(include) = super::include_candidates()
            .into_iter()
            .find(|d| d.join("hip/hip_runtime_api.h").is_file())
        else {
            eprintln!(
                "error: oxccl-hal-rocm (feature `hip`, enabled by `--features rocm`) needs the \
                 HIP headers (hip/hip_runtime_api.h) to generate its bindings, and found none.\n\
                 Looked in: {}\n\
                 Install ROCm (https://rocm.docs.amd.com; headers land in /opt/rocm/include) and \
                 set ROCM_PATH if it is elsewhere, or on Debian/Ubuntu CI run \
                 `ci/toolchains/hip.sh && . .toolchains/hip/env.sh` (HIP headers from Debian's \
                 libamdhip64-dev, no runtime needed).",
                super::include_candidates()
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            exit(1);
        };
        println!("cargo:rerun-if-changed={}", include.join("hip").display());
        // The fake runtime of the tests is compiled against the same headers.
        println!(
            "cargo:rustc-env=OXCCL_HIP_INCLUDE_DIR={}",
            include.display()
        );

        let mut builder = bindgen::Builder::default()
            .header_contents(
                "oxccl_hip_wrapper.h",
                "#include <hip/hip_version.h>\n#include <hip/hip_runtime_api.h>\n",
            )
            .clang_arg(format!("-I{}", include.display()))
            .clang_arg("-D__HIP_PLATFORM_AMD__=1")
            .clang_arg("-xc")
            // Newtype enums: the runtime may return values these headers do not know, which
            // would be undefined behaviour in a Rust enum.
            .default_enum_style(bindgen::EnumVariation::NewType {
                is_bitfield: false,
                is_global: false,
            })
            .dynamic_library_name("HipApi")
            .dynamic_link_require_all(true)
            .derive_default(true)
            .layout_tests(true)
            .generate_comments(false)
            .allowlist_type("hipError_t")
            .allowlist_type("hipDeviceAttribute_t")
            .allowlist_type("hipStreamCaptureStatus")
            .allowlist_type("hipMemcpyKind")
            .allowlist_type("hipMemAllocationProp")
            .allowlist_type("hipMemAccessDesc")
            .allowlist_type("hipMemAllocationGranularity_flags")
            .allowlist_type("hipMemAllocationHandleType")
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
        for f in FUNCTIONS {
            builder = builder.allowlist_function(f);
        }
        for v in VARS {
            builder = builder.allowlist_var(v);
        }
        let bindings = match builder.generate() {
            Ok(b) => b,
            Err(e) => {
                eprintln!(
                    "error: bindgen could not parse the HIP headers in {}: {e}\n\
                     bindgen needs libclang: install libclang-dev (Debian) or set \
                     LIBCLANG_PATH.",
                    include.display()
                );
                exit(1);
            }
        };
        let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default()).join("hip_sys.rs");
        if let Err(e) = bindings.write_to_file(&out) {
            eprintln!("error: writing {}: {e}", out.display());
            exit(1);
        }
    }
}
