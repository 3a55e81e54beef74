//! Which side serves a call of this library's communicators: oxccl or the real library
//! (NCCL on CUDA, RCCL on ROCm), and the reason, which `OXCCL_NCCL_LOG=info` prints with
//! every forwarded call.
//!
//! oxccl serves a communicator when it has an oxccl communicator (at most
//! [`OXCCL_ALLREDUCE_MAX_RANKS`] ranks) on a backend whose streams this build can take from
//! the caller: the host backend (calls stage host memory), CUDA (`cudaStream_t`, wrapped by
//! `CudaDevice::borrow_stream`) and ROCm (`hipStream_t`, wrapped by `RocmStream::borrowed`)
//! when built. On ROCm the fp8 reductions stay with RCCL (see [`dtype_refusal`]).

use oxccl_collectives::hal::BackendKind;
use oxccl_collectives::kernels::abi::OXCCL_ALLREDUCE_MAX_RANKS;

use crate::comm::{Oxccl, Ready};
use crate::types::*;

/// Why this build cannot run oxccl's work on a caller's stream of `kind`, or `None` when
/// it can.
pub fn backend_refusal(kind: BackendKind) -> Option<String> {
    let built = match kind {
        BackendKind::Host => true,
        BackendKind::Cuda => cfg!(feature = "cuda"),
        BackendKind::Rocm => cfg!(feature = "rocm"),
    };
    (!built).then(|| {
        format!(
            "this liboxccl_nccl was built without the {kind} backend (rebuild with \
             `--features {}`)",
            kind.to_string().to_ascii_lowercase()
        )
    })
}

/// Why oxccl does not serve the communicator `c`, or `None` when it does.
pub fn refusal(c: &Ready) -> Option<String> {
    if let Oxccl::BootstrapOnly(_) = c.oxccl {
        return Some(format!(
            "oxccl does not serve this communicator: {} ranks, it serves up to \
             {OXCCL_ALLREDUCE_MAX_RANKS}",
            c.nranks
        ));
    }
    backend_refusal(c.kind).map(|why| format!("oxccl does not serve this communicator: {why}"))
}

/// Why a reducing call of `datatype` on a communicator of `kind` goes to the real library
/// although oxccl serves the communicator, or `None` when the type is oxccl's.
///
/// On ROCm the two fp8 types are left to RCCL: RCCL reads `ncclFloat8e4m3`/`e5m2` in the
/// GPU's own fp8 encoding, which is FNUZ (bias 8/16, no infinities, one NaN) on gfx942 and
/// OCP on later parts, while oxccl's kernels reduce the OCP encoding NCCL defines. Forwarding
/// keeps RCCL's answer bit for bit; collectives that only move data serve every type.
pub fn dtype_refusal(kind: BackendKind, datatype: NcclDataType) -> Option<String> {
    let fp8 = matches!(datatype, NCCL_FLOAT8_E4M3 | NCCL_FLOAT8_E5M2);
    (kind == BackendKind::Rocm && fp8).then(|| {
        format!(
            "dtype {} on ROCm: RCCL reduces it in the GPU's fp8 encoding (FNUZ on MI300X), \
             oxccl in NCCL's OCP encoding",
            type_name(datatype)
        )
    })
}

/// Whether oxccl maps callers' buffers on `kind` (for registration, windows and
/// zero-copy): CUDA only. The host backend stages every call. The ROCm backend finds and
/// exports `hipMalloc` blocks (`RocmDevice::find_allocation`), but only against the fake
/// HIP runtime so far, never on AMD hardware, so there registrations and windows are
/// recorded (and passed to RCCL) and calls stage too, until it has run on an MI300X.
pub fn maps_callers_memory(kind: BackendKind) -> bool {
    kind == BackendKind::Cuda
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_built_backend_is_served_and_the_others_say_how_to_build_them() {
        assert_eq!(backend_refusal(BackendKind::Host), None);
        for (kind, built) in [
            (BackendKind::Cuda, cfg!(feature = "cuda")),
            (BackendKind::Rocm, cfg!(feature = "rocm")),
        ] {
            let why = backend_refusal(kind);
            assert_eq!(why.is_none(), built, "{kind}: {why:?}");
            if let Some(why) = why {
                let flag = format!("--features {}", kind.to_string().to_ascii_lowercase());
                assert!(why.contains(&flag), "{why}");
            }
        }
    }

    #[test]
    fn fp8_reductions_go_to_rccl_on_rocm_only() {
        for t in [NCCL_FLOAT8_E4M3, NCCL_FLOAT8_E5M2] {
            let why = dtype_refusal(BackendKind::Rocm, t).unwrap();
            assert!(why.contains(type_name(t)) && why.contains("FNUZ"), "{why}");
            assert_eq!(dtype_refusal(BackendKind::Cuda, t), None);
            assert_eq!(dtype_refusal(BackendKind::Host, t), None);
        }
        for t in [
            NCCL_INT8,
            NCCL_FLOAT16,
            NCCL_FLOAT32,
            NCCL_BFLOAT16,
            NCCL_FLOAT64,
            NCCL_UINT64,
        ] {
            assert_eq!(dtype_refusal(BackendKind::Rocm, t), None, "{t}");
        }
    }

    #[test]
    fn only_cuda_maps_callers_memory() {
        assert!(maps_callers_memory(BackendKind::Cuda));
        assert!(!maps_callers_memory(BackendKind::Rocm));
        assert!(!maps_callers_memory(BackendKind::Host));
    }
}
