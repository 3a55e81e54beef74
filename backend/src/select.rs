//! Which backend a process uses.
//!
//! `OXCCL_BACKEND` (`host`, `cuda`, `rocm`) decides when set. Otherwise the first GPU
//! backend that was built and finds a device wins; a build with no GPU backend uses the host
//! backend. A build with GPU backends on a machine with no GPU runtime fails with an error
//! that says what each backend reported, rather than silently running on the host.

use oxccl_hal::{BackendKind, Error, Result};

/// Environment variable that forces a backend.
pub const BACKEND_VAR: &str = "OXCCL_BACKEND";

/// The backends compiled into this build, GPU backends first.
pub fn built() -> &'static [BackendKind] {
    &[
        #[cfg(feature = "cuda")]
        BackendKind::Cuda,
        #[cfg(feature = "rocm")]
        BackendKind::Rocm,
        BackendKind::Host,
    ]
}

/// Parses a backend name as `OXCCL_BACKEND` takes it.
pub fn parse(name: &str) -> Result<BackendKind> {
    match name.trim().to_ascii_lowercase().as_str() {
        "host" => Ok(BackendKind::Host),
        "cuda" => Ok(BackendKind::Cuda),
        "rocm" | "hip" => Ok(BackendKind::Rocm),
        other => Err(Error::InvalidArgument(format!(
            "{BACKEND_VAR}='{other}' is not a backend (host, cuda, rocm)"
        ))),
    }
}

/// The decision, from a request and what each built GPU backend's probe answered.
///
/// `probes` holds, for each built GPU backend in preference order, its device count or
/// the error its runtime gave.
pub fn decide(
    requested: Option<&str>,
    built: &[BackendKind],
    probes: &[(BackendKind, Result<u32>)],
) -> Result<BackendKind> {
    if let Some(name) = requested.filter(|s| !s.trim().is_empty()) {
        let kind = parse(name)?;
        if !built.contains(&kind) {
            return Err(Error::Unsupported(format!(
                "{BACKEND_VAR} asks for the {kind} backend, but this build has only {}; \
                 rebuild with `--features {}`",
                names(built),
                kind.to_string().to_ascii_lowercase()
            )));
        }
        return Ok(kind);
    }
    let mut reasons = Vec::new();
    for (kind, probe) in probes {
        match probe {
            Ok(n) if *n > 0 => return Ok(*kind),
            Ok(_) => reasons.push(format!("{kind}: no devices")),
            Err(e) => reasons.push(format!("{kind}: {e}")),
        }
    }
    if probes.is_empty() {
        return Ok(BackendKind::Host);
    }
    Err(Error::RuntimeMissing(format!(
        "no GPU runtime found ({}); set {BACKEND_VAR}=host to run on the host backend",
        reasons.join("; ")
    )))
}

fn names(kinds: &[BackendKind]) -> String {
    kinds
        .iter()
        .map(|k| k.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [BackendKind; 3] = [BackendKind::Cuda, BackendKind::Rocm, BackendKind::Host];

    #[test]
    fn request_wins_and_must_be_built() {
        assert_eq!(decide(Some("HOST"), &ALL, &[]).unwrap(), BackendKind::Host);
        assert_eq!(decide(Some("hip"), &ALL, &[]).unwrap(), BackendKind::Rocm);
        let err = decide(Some("cuda"), &[BackendKind::Host], &[]).unwrap_err();
        assert!(err.to_string().contains("--features cuda"), "{err}");
        assert!(decide(Some("tpu"), &ALL, &[]).is_err());
    }

    #[test]
    fn first_gpu_backend_with_devices_wins() {
        let probes = [
            (
                BackendKind::Cuda,
                Err(Error::RuntimeMissing("no CUDA driver found".into())),
            ),
            (BackendKind::Rocm, Ok(8)),
        ];
        assert_eq!(decide(None, &ALL, &probes).unwrap(), BackendKind::Rocm);
    }

    #[test]
    fn gpu_build_without_gpu_says_why() {
        let probes = [
            (
                BackendKind::Cuda,
                Err(Error::RuntimeMissing("no CUDA driver found".into())),
            ),
            (BackendKind::Rocm, Ok(0)),
        ];
        let err = decide(None, &ALL, &probes).unwrap_err().to_string();
        assert!(err.contains("no GPU runtime found"), "{err}");
        assert!(err.contains("no CUDA driver found"), "{err}");
        assert!(err.contains("ROCm: no devices"), "{err}");
        assert!(err.contains("OXCCL_BACKEND=host"), "{err}");
    }

    #[test]
    fn host_only_build_uses_host() {
        assert_eq!(
            decide(None, &[BackendKind::Host], &[]).unwrap(),
            BackendKind::Host
        );
    }
}
