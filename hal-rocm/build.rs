//! Regenerates the checked-in HIP bindings (`src/sys/v{5,6,7}.rs`) when asked; a normal
//! build does nothing here and needs no HIP headers.
//!
//! The bindings of every supported HIP ABI generation live in git (see `src/sys/mod.rs`
//! for why). With feature `hip`, for each generation `N` whose headers are named by
//! `OXCCL_HIP<N>_INCLUDE_DIR` (the include directory holding `hip/hip_runtime_api.h`;
//! `ci/toolchains/hip.sh` exports all three), bindgen regenerates `v<N>.rs` into `OUT_DIR`
//! and `tests/bindings.rs` compares it with the checked-in file. With
//! `OXCCL_HIP_BINDGEN_WRITE=1` the result is written over `src/sys/v<N>.rs` instead
//! (`ci/toolchains/hip-bindgen.sh` does this).
//!
//! Only what oxccl calls is generated (allowlists below). The bindings describe a table of
//! function pointers filled at run time from libamdhip64 (`dynamic_library_name`): nothing
//! links against the HIP runtime.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/sys/functions.in");
    for var in [
        "OXCCL_HIP5_INCLUDE_DIR",
        "OXCCL_HIP6_INCLUDE_DIR",
        "OXCCL_HIP7_INCLUDE_DIR",
        "OXCCL_HIP_BINDGEN_WRITE",
        "LIBCLANG_PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    #[cfg(feature = "hip")]
    hip::regenerate();
}

#[cfg(feature = "hip")]
mod hip {
    use std::env;
    use std::path::{Path, PathBuf};
    use std::process::exit;

    /// The ABI generations with checked-in bindings (`src/sys/v<N>.rs`).
    const GENERATIONS: &[u32] = &[5, 6, 7];

    /// Every HIP function oxccl calls (shared with `sys::FUNCTIONS`).
    const FUNCTIONS: &[&str] = &include!("src/sys/functions.in");

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

    /// Enum types oxccl passes or compares (more come in through the signatures).
    const TYPES: &[&str] = &[
        "hipError_t",
        "hipDeviceAttribute_t",
        "hipStreamCaptureStatus",
        "hipMemcpyKind",
        "hipMemAllocationProp",
        "hipMemAccessDesc",
        "hipMemAllocationGranularity_flags",
        "hipMemAllocationHandleType",
        "hipPointer_attribute",
        "hipMemoryType",
    ];

    pub(super) fn regenerate() {
        let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default());
        // The test that compares regenerated and checked-in bindings reads them here.
        println!("cargo:rustc-env=OXCCL_HIP_BINDGEN_OUT={}", out.display());
        let write = env::var("OXCCL_HIP_BINDGEN_WRITE").is_ok_and(|v| v == "1");
        let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
        for &generation in GENERATIONS {
            // Nothing stale for the comparison test to find.
            let _ = std::fs::remove_file(out.join(format!("v{generation}.rs")));
            let Some(include) = env::var_os(format!("OXCCL_HIP{generation}_INCLUDE_DIR")) else {
                continue;
            };
            let include = PathBuf::from(include);
            let text = generate(generation, &include);
            let target = if write {
                manifest.join(format!("src/sys/v{generation}.rs"))
            } else {
                out.join(format!("v{generation}.rs"))
            };
            if let Err(e) = std::fs::write(&target, text) {
                eprintln!("error: writing {}: {e}", target.display());
                exit(1);
            }
        }
    }

    /// `#define HIP_VERSION_<part> <n>` from `hip/hip_version.h`.
    fn header_version(include: &Path, part: &str) -> Option<u32> {
        let text = std::fs::read_to_string(include.join("hip/hip_version.h")).ok()?;
        let key = format!("#define HIP_VERSION_{part} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&key))
            .and_then(|v| v.trim().parse().ok())
    }

    fn generate(generation: u32, include: &Path) -> String {
        if !include.join("hip/hip_runtime_api.h").is_file() {
            eprintln!(
                "error: OXCCL_HIP{generation}_INCLUDE_DIR={} holds no hip/hip_runtime_api.h \
                 (run ci/toolchains/hip.sh and source .toolchains/hip/env.sh)",
                include.display()
            );
            exit(1);
        }
        let (major, minor) = (
            header_version(include, "MAJOR"),
            header_version(include, "MINOR"),
        );
        if major != Some(generation) {
            eprintln!(
                "error: OXCCL_HIP{generation}_INCLUDE_DIR={} holds HIP {major:?}.{minor:?} \
                 headers, not HIP {generation}.x",
                include.display()
            );
            exit(1);
        }
        println!("cargo:rerun-if-changed={}", include.join("hip").display());
        let mut builder = bindgen::Builder::default()
            .header_contents(
                "oxccl_hip_wrapper.h",
                "#include <hip/hip_version.h>\n#include <hip/hip_runtime_api.h>\n",
            )
            .clang_arg(format!("-I{}", include.display()))
            .clang_arg("-D__HIP_PLATFORM_AMD__=1")
            .clang_arg("-xc")
            .raw_line(format!(
                "// HIP {generation}.x ABI: generated by bindgen from the HIP {}.{} headers \
                 (hal-rocm/build.rs,\n// ci/toolchains/hip-bindgen.sh). Do not edit; \
                 tests/bindings.rs checks that regenerating reproduces it.",
                generation,
                minor.unwrap_or(0)
            ))
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
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
        for t in TYPES {
            builder = builder.allowlist_type(t);
        }
        for f in FUNCTIONS {
            builder = builder.allowlist_function(f);
        }
        for v in VARS {
            builder = builder.allowlist_var(v);
        }
        match builder.generate() {
            Ok(b) => b.to_string(),
            Err(e) => {
                eprintln!(
                    "error: bindgen could not parse the HIP headers in {}: {e}\n\
                     bindgen needs libclang: install libclang-dev (Debian) or set \
                     LIBCLANG_PATH.",
                    include.display()
                );
                exit(1);
            }
        }
    }
}
