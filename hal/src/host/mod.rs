//! The host backend: host memory shared between processes stands in for device memory.
//!
//! It is always built and needs no GPU, so the whole stack above the HAL (channels,
//! collectives, multi-process suites) runs in CI on it. It is deliberately as strict as the
//! strictest GPU backend where that matters for the layers above:
//! - every allocation is exportable (a sealed memfd), and imports are mapped through an
//!   [`IpcCache`] with [`CachePolicy::Shared`] — ROCm's behaviour, where the same handle
//!   must not be opened twice;
//! - streams are real asynchronous queues (one worker thread each), so missing
//!   synchronization shows up as wrong data rather than passing by luck;
//! - kernels are host functions ([`crate::HostKernelTable`]) that receive the same argument
//!   blocks as device kernels.
//!
//! Multicast is emulated ([`HostMulticast`]); see that module for why the safety gate does
//! not apply here.

mod device;
mod memory;
mod module;
mod multicast;
mod stream;

pub use device::HostDevice;
pub use memory::{
    page_size, HostChunks, HostImport, HostMapping, HostMemory, HostOpener, MAX_ALLOCATION,
};
pub use module::{HostKernel, HostModule};
pub use multicast::{HostMulticast, MAX_MULTICAST_MEMBERS};
pub use stream::{HostEvent, HostStream, WAIT_LIMIT};

use crate::api::Backend;
use crate::error::{Error, Result};
use crate::types::{BackendKind, DeviceId};

#[cfg(doc)]
use crate::ipc_cache::{CachePolicy, IpcCache};

/// Environment variable that sets the number of host devices (1..=64, default 8).
pub const DEVICES_VAR: &str = "OXCCL_HOST_DEVICES";
/// Host devices when [`DEVICES_VAR`] is not set: one node of eight GPUs.
pub const DEFAULT_DEVICES: u32 = 8;
/// Most host devices [`DEVICES_VAR`] may ask for.
pub const MAX_DEVICES: u32 = 64;

/// Pinned host memory is the same thing as device memory on the host backend.
pub type HostPinned = HostMemory;

/// The host backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostBackend;

/// Parses a device count as given in [`DEVICES_VAR`] (`None`: not set).
pub fn parse_device_count(value: Option<&str>) -> Result<u32> {
    let Some(raw) = value else {
        return Ok(DEFAULT_DEVICES);
    };
    raw.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=MAX_DEVICES).contains(n))
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{DEVICES_VAR}='{raw}' is not a device count in 1..={MAX_DEVICES}"
            ))
        })
}

impl Backend for HostBackend {
    const KIND: BackendKind = BackendKind::Host;
    type Device = HostDevice;
    type Memory = HostMemory;
    type HostMemory = HostPinned;
    type Imported = HostImport;
    type Stream = HostStream;
    type Event = HostEvent;
    type Module = HostModule;
    type Kernel = HostKernel;
    type Multicast = HostMulticast;

    fn device_count() -> Result<u32> {
        parse_device_count(std::env::var(DEVICES_VAR).ok().as_deref())
    }

    fn open_device(id: DeviceId) -> Result<HostDevice> {
        let count = Self::device_count()?;
        if id.0 >= count {
            return Err(Error::InvalidArgument(format!(
                "host {id} does not exist: there are {count} host devices (set {DEVICES_VAR})"
            )));
        }
        Ok(HostDevice::new(id))
    }
}

#[cfg(test)]
mod tests;
