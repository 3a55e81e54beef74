//! Code objects, kernels, and the multicast type that cannot exist on ROCm.

use std::ffi::CString;
use std::sync::Arc;

use oxccl_hal::{DeviceId, DevicePtr, Error, Module, Multicast, Result};

use crate::device::RocmBackend;
use crate::memory::RocmMemory;
use crate::result::Raw;
use crate::runtime::Hip;
use crate::sys;

#[derive(Debug)]
struct ModuleInner {
    hip: Arc<Hip>,
    raw: Raw<sys::ihipModule_t>,
    /// Kernel names the image appears to define, for "unknown kernel" errors.
    names: Vec<String>,
}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        // SAFETY: we own the module, and every kernel holds this inner object, so no
        // kernel of it can be launched any more.
        if let Err(e) = unsafe { self.hip.module_unload(self.raw.0) } {
            tracing::warn!(error = %e, "unloading a HIP module failed");
        }
    }
}

/// A loaded AMD code object (or offload bundle); unloaded when it and all its kernels
/// are dropped.
#[derive(Debug, Clone)]
pub struct RocmModule {
    inner: Arc<ModuleInner>,
}

/// The names of kernel descriptors (`<name>.kd` symbols) found in an image's string
/// tables. Best effort: HIP has no call that lists a module's kernels, and this scan
/// works on plain and bundled (uncompressed) code objects without an ELF parser.
pub(crate) fn kernel_names(image: &[u8]) -> Vec<String> {
    let mut names: Vec<String> = image
        .split(|&b| b == 0)
        .filter_map(|s| s.strip_suffix(b".kd"))
        .filter(|s| {
            !s.is_empty()
                && s.iter()
                    .all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'$')
        })
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    names.sort();
    names.dedup();
    names
}

impl RocmModule {
    pub(crate) fn load(hip: &Arc<Hip>, image: &[u8]) -> Result<RocmModule> {
        // An ELF code object or a clang offload bundle: anything else would make HIP read
        // past the slice, since it takes no length.
        if !(image.starts_with(b"\x7fELF") || image.starts_with(b"__CLANG_OFFLOAD_BUNDLE__")) {
            return Err(Error::InvalidArgument(
                "not an AMD code object (neither ELF nor a clang offload bundle)".into(),
            ));
        }
        // SAFETY: the image starts with a recognised header and is complete (a slice).
        let raw = unsafe { hip.module_load_data(image) }?;
        Ok(RocmModule {
            inner: Arc::new(ModuleInner {
                hip: Arc::clone(hip),
                raw: Raw(raw),
                names: kernel_names(image),
            }),
        })
    }
}

impl Module<RocmBackend> for RocmModule {
    fn kernel(&self, name: &str) -> Result<RocmKernel> {
        let cname = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("kernel name {name:?} contains NUL")))?;
        // SAFETY: the module is live while `self.inner` is.
        match unsafe { self.inner.hip.module_get_function(self.inner.raw.0, &cname) }? {
            Some(f) => Ok(RocmKernel {
                raw: Raw(f),
                name: name.to_string(),
                _module: Arc::clone(&self.inner),
            }),
            None => Err(Error::InvalidArgument(format!(
                "no kernel '{name}' in this code object; it defines: {}",
                if self.inner.names.is_empty() {
                    "(no kernel names found)".to_string()
                } else {
                    self.inner.names.join(", ")
                }
            ))),
        }
    }
}

/// A kernel entry point; keeps its module loaded.
#[derive(Debug, Clone)]
pub struct RocmKernel {
    raw: Raw<sys::ihipModuleSymbol_t>,
    name: String,
    _module: Arc<ModuleInner>,
}

impl RocmKernel {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn raw(&self) -> sys::hipFunction_t {
        self.raw.0
    }
}

/// Multicast on ROCm: a type with no values, since MI300X has no NVLS-like hardware.
#[derive(Debug)]
pub enum RocmMulticast {}

impl RocmMulticast {
    pub(crate) fn unsupported() -> Error {
        Error::Unsupported(
            "MI300X has no multicast (NVLS) hardware: the ROCm backend cannot create or join \
             multicast objects; use the non-multicast algorithms"
                .into(),
        )
    }
}

impl Multicast<RocmBackend> for RocmMulticast {
    fn len(&self) -> usize {
        match *self {}
    }

    fn add_device(&self, _device: DeviceId) -> Result<()> {
        match *self {}
    }

    fn bind(&self, _memory: &RocmMemory, _offset: usize) -> Result<()> {
        match *self {}
    }

    fn map(&self) -> Result<DevicePtr> {
        match *self {}
    }
}
