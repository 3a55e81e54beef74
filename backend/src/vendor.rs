//! The vendor's collective library of each backend, loaded at run time by the layers that
//! compare with it or forward to it (`oxccl-perf --compare nccl`, `liboxccl_nccl.so`):
//! NCCL on CUDA, RCCL on ROCm. RCCL's C ABI is NCCL's (same function names, enums and
//! 128-byte unique id), so one set of bindings serves both; only the file differs.

use oxccl_hal::BackendKind;

/// Environment variable naming the vendor library's file; it replaces every default.
pub const LIBRARY_VAR: &str = "OXCCL_NCCL_LIB_PATH";
/// NCCL's file names, tried in order (CUDA, and the host backend's messages).
pub const NCCL_LIBS: [&str; 2] = ["libnccl.so.2", "libnccl.so"];
/// RCCL's file names, tried in order by name, then under `$ROCM_PATH/lib` and
/// `/opt/rocm/lib` (ROCm does not always put its libraries on the loader's path).
pub const RCCL_LIBS: [&str; 2] = ["librccl.so.1", "librccl.so"];

/// The vendor library's name for messages: "NCCL" or "RCCL".
pub fn name(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Rocm => "RCCL",
        _ => "NCCL",
    }
}

/// The files to try, in order: `library` (the value of [`LIBRARY_VAR`]) alone when set,
/// else NCCL's names, or on ROCm RCCL's names, then under `rocm_path` (the value of
/// `ROCM_PATH`) and `/opt/rocm`.
pub fn library_candidates(
    kind: BackendKind,
    library: Option<&str>,
    rocm_path: Option<&str>,
) -> Vec<String> {
    if let Some(p) = library.filter(|p| !p.trim().is_empty()) {
        return vec![p.to_string()];
    }
    if kind != BackendKind::Rocm {
        return NCCL_LIBS.iter().map(|n| n.to_string()).collect();
    }
    let mut names: Vec<String> = RCCL_LIBS.iter().map(|n| n.to_string()).collect();
    let roots = [
        rocm_path.filter(|r| !r.trim().is_empty()),
        Some("/opt/rocm"),
    ];
    for root in roots.into_iter().flatten() {
        for n in RCCL_LIBS {
            let p = format!("{}/lib/{n}", root.trim_end_matches('/'));
            if !names.contains(&p) {
                names.push(p);
            }
        }
    }
    names
}

/// [`library_candidates`] from this process's environment.
pub fn library_candidates_from_env(kind: BackendKind) -> Vec<String> {
    let library = std::env::var(LIBRARY_VAR).ok();
    let rocm_path = std::env::var("ROCM_PATH").ok();
    library_candidates(kind, library.as_deref(), rocm_path.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_is_the_default_and_the_variable_overrides_everything() {
        assert_eq!(library_candidates(BackendKind::Cuda, None, None), NCCL_LIBS);
        assert_eq!(
            library_candidates(BackendKind::Host, Some(" "), None),
            NCCL_LIBS
        );
        for kind in [BackendKind::Cuda, BackendKind::Rocm, BackendKind::Host] {
            assert_eq!(
                library_candidates(kind, Some("/x/libmine.so"), Some("/r")),
                ["/x/libmine.so"]
            );
        }
        assert_eq!(name(BackendKind::Cuda), "NCCL");
        assert_eq!(name(BackendKind::Rocm), "RCCL");
    }

    #[test]
    fn rocm_tries_rccl_by_name_then_under_rocm_path_and_opt_rocm() {
        assert_eq!(
            library_candidates(BackendKind::Rocm, None, Some("/opt/rocm-6.4.1/")),
            [
                "librccl.so.1",
                "librccl.so",
                "/opt/rocm-6.4.1/lib/librccl.so.1",
                "/opt/rocm-6.4.1/lib/librccl.so",
                "/opt/rocm/lib/librccl.so.1",
                "/opt/rocm/lib/librccl.so",
            ]
        );
        // ROCM_PATH=/opt/rocm adds nothing twice.
        assert_eq!(
            library_candidates(BackendKind::Rocm, None, Some("/opt/rocm")).len(),
            4
        );
        assert_eq!(
            library_candidates(BackendKind::Rocm, Some(""), None).len(),
            4
        );
    }
}
