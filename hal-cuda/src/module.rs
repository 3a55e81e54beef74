//! Loaded fatbins and their kernels.

use std::ffi::CString;
use std::sync::Arc;

use cudarc::driver::sys;
use oxccl_hal::{Error, Module, Result};

use crate::device::{Context, CudaBackend};
use crate::result::{self, ParamSlot};

#[derive(Debug)]
struct ModuleInner {
    ctx: Arc<Context>,
    module: sys::CUmodule,
}

// SAFETY: a CUmodule is a driver handle usable from any thread.
unsafe impl Send for ModuleInner {}
// SAFETY: as above.
unsafe impl Sync for ModuleInner {}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind() {
            tracing::warn!(error = %e, "binding the context to unload a module");
        }
        // SAFETY: the module is ours; every kernel holds this value, so none is left.
        if let Err(e) = unsafe { result::module_unload(self.module) } {
            tracing::warn!(error = %e, "unloading a module failed");
        }
    }
}

/// A loaded code image; unloaded when it and every kernel taken from it are dropped.
#[derive(Debug, Clone)]
pub struct CudaModule {
    inner: Arc<ModuleInner>,
}

impl CudaModule {
    pub(crate) fn load(ctx: Arc<Context>, image: &[u8]) -> Result<CudaModule> {
        if image.is_empty() {
            return Err(Error::InvalidArgument("empty CUDA module image".into()));
        }
        // Embedded images (`include_bytes!`) have no alignment guarantee; the driver parses
        // fatbin headers in place, so hand it an 8-byte aligned copy with a trailing zero.
        let mut aligned = vec![0u64; image.len().div_ceil(8) + 1];
        // SAFETY: `aligned` has at least `image.len()` bytes; the regions do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                image.as_ptr(),
                aligned.as_mut_ptr().cast::<u8>(),
                image.len(),
            )
        };
        // SAFETY: `aligned` holds the complete image for the duration of the call.
        let module = unsafe { result::module_load_data(aligned.as_ptr().cast()) }?;
        Ok(CudaModule {
            inner: Arc::new(ModuleInner { ctx, module }),
        })
    }

    /// Names of the kernels in this module (empty when the driver cannot list them).
    pub fn kernel_names(&self) -> Result<Vec<String>> {
        self.inner.ctx.bind()?;
        // SAFETY: the module is live.
        unsafe { result::module_function_names(self.inner.module) }
    }
}

impl Module<CudaBackend> for CudaModule {
    fn kernel(&self, name: &str) -> Result<CudaKernel> {
        let cname = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("kernel name {name:?} contains NUL")))?;
        self.inner.ctx.bind()?;
        // SAFETY: the module is live.
        let func = match unsafe { result::module_get_function(self.inner.module, &cname) } {
            Ok(f) => f,
            Err(e) if result::is_code(&e, sys::CUresult::CUDA_ERROR_NOT_FOUND) => {
                let known = self.kernel_names().unwrap_or_default();
                let listed = if known.is_empty() {
                    "(the driver cannot list them)".to_string()
                } else {
                    known.join(", ")
                };
                return Err(Error::InvalidArgument(format!(
                    "kernel '{name}' is not in the CUDA module; it has: {listed}"
                )));
            }
            Err(e) => return Err(e),
        };
        // SAFETY: `func` belongs to the live module.
        let params = unsafe { param_layout(func) };
        Ok(CudaKernel {
            module: Arc::clone(&self.inner),
            func,
            name: Arc::from(name),
            params,
        })
    }
}

/// A kernel of a loaded module. Keeps the module loaded.
#[derive(Debug, Clone)]
pub struct CudaKernel {
    module: Arc<ModuleInner>,
    func: sys::CUfunction,
    name: Arc<str>,
    /// The parameter list as far as the driver reports it.
    params: ParamLayout,
}

// SAFETY: a CUfunction is a driver handle usable from any thread.
unsafe impl Send for CudaKernel {}
// SAFETY: as above.
unsafe impl Sync for CudaKernel {}

impl CudaKernel {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The raw driver function.
    pub fn raw(&self) -> sys::CUfunction {
        self.func
    }

    pub(crate) fn context_raw(&self) -> sys::CUcontext {
        self.module.ctx.raw()
    }

    /// Size in bytes of the kernel's argument block, when the driver can tell.
    pub fn argument_size(&self) -> Option<usize> {
        self.params.first_size()
    }

    /// Checks `args` against the kernel's parameter list where the driver reports it
    /// ([`check_params`]).
    pub(crate) fn check_args(&self, args: &[u8]) -> Result<()> {
        check_params(&self.name, self.params, args.len())
    }

    /// Most blocks of `block_size` threads (with `dynamic_smem` bytes of dynamic shared
    /// memory) that can be resident on one multiprocessor at once.
    pub fn max_active_blocks_per_multiprocessor(
        &self,
        block_size: u32,
        dynamic_smem: usize,
    ) -> Result<u32> {
        self.module.ctx.bind()?;
        // SAFETY: the function's module is live (held by `self`).
        unsafe { result::occupancy_max_active_blocks(self.func, block_size, dynamic_smem) }
    }
}

/// A kernel's parameter list as far as the driver reports it, read without ever asking
/// about a parameter that does not exist.
///
/// Counting by calling `cuFuncGetParamInfo` with growing indices until it fails made the
/// driver return `CUDA_ERROR_INVALID_VALUE` once per kernel lookup, which compute-sanitizer
/// reports as an API error and which hid real ones. Now the count comes from
/// `cuFuncGetParamCount` where the driver has it (CUDA 13.2+), and otherwise only index 0 is
/// asked for: every oxccl kernel takes exactly one by-value argument struct, so index 0
/// exists (a kernel without parameters still makes the driver fail there, but that kernel
/// breaks the one-struct rule and the error is a real one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ParamLayout {
    /// The driver cannot say (no `cuFuncGetParamInfo`: drivers before CUDA 12.4).
    Unknown,
    /// The exact number of parameters (`cuFuncGetParamCount`) and the first one's slot
    /// (`None` when there is none or the driver did not report it).
    Counted {
        count: usize,
        first: Option<ParamSlot>,
    },
    /// Only the first parameter was asked about (no `cuFuncGetParamCount`); `None`: the
    /// driver reports no parameter at index 0.
    FirstOnly(Option<ParamSlot>),
}

impl ParamLayout {
    fn first_size(self) -> Option<usize> {
        match self {
            ParamLayout::Counted { first, .. } | ParamLayout::FirstOnly(first) => {
                first.map(|p| p.size)
            }
            ParamLayout::Unknown => None,
        }
    }
}

/// Asks the driver about `func`'s parameters ([`ParamLayout`]).
///
/// # Safety
/// `func` must be a function of a live module.
unsafe fn param_layout(func: sys::CUfunction) -> ParamLayout {
    // SAFETY: the caller guarantees `func`.
    let count = match unsafe { result::func_param_count(func) } {
        Some(Ok(n)) => Some(n),
        Some(Err(e)) => {
            tracing::debug!(error = %e, "cuFuncGetParamCount failed; checking index 0 only");
            None
        }
        None => None,
    };
    if count == Some(0) {
        return ParamLayout::Counted {
            count: 0,
            first: None,
        };
    }
    // SAFETY: as above; index 0 exists when the count says so, and must exist for an oxccl
    // kernel otherwise.
    let first = match unsafe { result::func_param_info(func, 0) } {
        None => return ParamLayout::Unknown,
        Some(r) => r.ok(),
    };
    match count {
        Some(count) => ParamLayout::Counted { count, first },
        None => ParamLayout::FirstOnly(first),
    }
}

/// Whether an argument block of `len` bytes fits kernel `name`'s parameters: one by-value
/// struct at offset 0 of exactly `len` bytes, or no parameter for an empty block.
///
/// With [`ParamLayout::FirstOnly`] a parameter after a first one of the right size goes
/// unseen here (the driver would only reveal it through an error or `cuFuncGetParamCount`);
/// for oxccl's own kernels `kernels/build.rs` refuses a declaration with more than one
/// parameter. What the driver does not report at all ([`ParamLayout::Unknown`]) passes.
fn check_params(name: &str, params: ParamLayout, len: usize) -> Result<()> {
    let (count, first) = match params {
        ParamLayout::Unknown => return Ok(()),
        ParamLayout::Counted { count, first } => (Some(count), first),
        ParamLayout::FirstOnly(first) => (None, first),
    };
    let none = count == Some(0) || (count.is_none() && first.is_none());
    if none {
        return if len == 0 {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "kernel {name} takes no parameters but got a {len}-byte argument block"
            )))
        };
    }
    if let Some(n) = count.filter(|n| *n > 1) {
        return Err(Error::InvalidArgument(format!(
            "kernel {name} takes {n} parameters; oxccl kernels take one argument struct"
        )));
    }
    // One parameter (or at least one, when only index 0 was asked about).
    match first {
        Some(p) if p.offset != 0 => Err(Error::InvalidArgument(format!(
            "kernel {name}'s first parameter is at offset {} of its parameter layout, not 0",
            p.offset
        ))),
        Some(p) if p.size != len => Err(Error::InvalidArgument(format!(
            "kernel {name} takes a {}-byte argument block, got {len} bytes",
            p.size
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARGS: ParamSlot = ParamSlot {
        offset: 0,
        size: 112,
    };

    fn refused(params: ParamLayout, len: usize) -> String {
        match check_params("k", params, len) {
            Err(e) => e.to_string(),
            Ok(()) => panic!("{params:?} with {len} bytes was accepted"),
        }
    }

    #[test]
    fn one_struct_of_the_block_size_is_accepted() {
        let counted = ParamLayout::Counted {
            count: 1,
            first: Some(ARGS),
        };
        assert!(check_params("k", counted, 112).is_ok());
        assert!(check_params("k", ParamLayout::FirstOnly(Some(ARGS)), 112).is_ok());
        assert!(refused(counted, 104).contains("takes a 112-byte argument block, got 104"));
        assert!(refused(ParamLayout::FirstOnly(Some(ARGS)), 0).contains("112-byte"));
    }

    #[test]
    fn no_parameters_take_only_an_empty_block() {
        let counted = ParamLayout::Counted {
            count: 0,
            first: None,
        };
        assert!(check_params("k", counted, 0).is_ok());
        assert!(check_params("k", ParamLayout::FirstOnly(None), 0).is_ok());
        assert!(refused(counted, 8).contains("takes no parameters"));
        assert!(refused(ParamLayout::FirstOnly(None), 8).contains("takes no parameters"));
    }

    #[test]
    fn more_than_one_parameter_is_refused_when_counted() {
        let two = ParamLayout::Counted {
            count: 2,
            first: Some(ARGS),
        };
        assert!(refused(two, 112).contains("takes 2 parameters"));
    }

    #[test]
    fn a_first_parameter_away_from_offset_zero_is_refused() {
        let moved = ParamSlot {
            offset: 8,
            size: 112,
        };
        assert!(refused(ParamLayout::FirstOnly(Some(moved)), 112).contains("offset 8"));
    }

    #[test]
    fn what_the_driver_cannot_report_passes() {
        assert!(check_params("k", ParamLayout::Unknown, 112).is_ok());
        // Counted, but the size of the one parameter was not reported.
        let no_size = ParamLayout::Counted {
            count: 1,
            first: None,
        };
        assert!(check_params("k", no_size, 112).is_ok());
        assert_eq!(no_size.first_size(), None);
        assert_eq!(ParamLayout::FirstOnly(Some(ARGS)).first_size(), Some(112));
    }
}
