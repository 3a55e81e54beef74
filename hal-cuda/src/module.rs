//! Loaded fatbins and their kernels.

use std::ffi::CString;
use std::sync::Arc;

use cudarc::driver::sys;
use oxccl_hal::{Error, Module, Result};

use crate::device::{Context, CudaBackend};
use crate::result;

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
        let params = unsafe { result::func_param_count(func) };
        // SAFETY: as above.
        let param_size = unsafe { result::func_param_size(func, 0) };
        Ok(CudaKernel {
            module: Arc::clone(&self.inner),
            func,
            name: Arc::from(name),
            params,
            param_size,
        })
    }
}

/// A kernel of a loaded module. Keeps the module loaded.
#[derive(Debug, Clone)]
pub struct CudaKernel {
    module: Arc<ModuleInner>,
    func: sys::CUfunction,
    name: Arc<str>,
    /// Number of parameters, when the driver can tell (CUDA 12.4+).
    params: Option<usize>,
    /// Size of the first parameter, when the driver can tell.
    param_size: Option<usize>,
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
        self.param_size
    }

    /// Checks `args` against the kernel's parameter list where the driver reports it: one
    /// parameter of exactly `args.len()` bytes (or none for an empty block).
    pub(crate) fn check_args(&self, args: &[u8]) -> Result<()> {
        match (self.params, self.param_size) {
            (Some(0), _) if !args.is_empty() => Err(Error::InvalidArgument(format!(
                "kernel {} takes no parameters but got a {}-byte argument block",
                self.name,
                args.len()
            ))),
            (Some(n), _) if n > 1 => Err(Error::InvalidArgument(format!(
                "kernel {} takes {n} parameters; oxccl kernels take one argument struct",
                self.name
            ))),
            (Some(1), Some(size)) if size != args.len() => Err(Error::InvalidArgument(format!(
                "kernel {} takes a {size}-byte argument block, got {} bytes",
                self.name,
                args.len()
            ))),
            _ => Ok(()),
        }
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
