//! Host-backend modules: tables of host kernels standing in for device code images.

use std::fmt;

use super::HostBackend;
use crate::api::Module;
use crate::error::{Error, Result};
use crate::launch::{HostKernelFn, HostKernelTable, ModuleImage};

/// A loaded host kernel table.
#[derive(Debug, Clone, Copy)]
pub struct HostModule {
    table: HostKernelTable,
}

impl HostModule {
    pub(crate) fn load(image: &ModuleImage<'_>) -> Result<HostModule> {
        match image {
            ModuleImage::Host(table) => Ok(HostModule { table: **table }),
            ModuleImage::Cuda(_) => Err(Error::Unsupported(
                "the host backend runs host kernels only; it cannot load a CUDA fatbin".into(),
            )),
            ModuleImage::Rocm(_) => Err(Error::Unsupported(
                "the host backend runs host kernels only; it cannot load an AMD code object".into(),
            )),
        }
    }
}

impl Module<HostBackend> for HostModule {
    fn kernel(&self, name: &str) -> Result<HostKernel> {
        self.table
            .kernels
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(name, f)| HostKernel { name, f })
            .ok_or_else(|| {
                let known: Vec<&str> = self.table.kernels.iter().map(|(n, _)| *n).collect();
                Error::InvalidArgument(format!(
                    "no kernel '{name}' in host module '{}'; known kernels: [{}]",
                    self.table.name,
                    known.join(", ")
                ))
            })
    }
}

/// A host kernel entry point: what [`crate::Stream::launch`] runs on the stream's worker.
#[derive(Clone, Copy)]
pub struct HostKernel {
    /// The kernel's name in its table.
    pub name: &'static str,
    /// The function that does the whole grid's work.
    pub f: HostKernelFn,
}

impl fmt::Debug for HostKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostKernel")
            .field("name", &self.name)
            .finish()
    }
}
