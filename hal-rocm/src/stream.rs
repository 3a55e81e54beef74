//! Streams and events.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use oxccl_hal::{Device, DevicePtr, Error, Event, LaunchConfig, Result, Stream};

use crate::device::{RocmBackend, RocmDevice};
use crate::module::RocmKernel;
use crate::result::Raw;
use crate::runtime::Hip;
use crate::sys;

/// A HIP stream on one device: a non-blocking stream made here (destroyed on drop), or a
/// stream another library made, wrapped by [`RocmStream::borrowed`] (never destroyed here).
#[derive(Debug)]
pub struct RocmStream {
    hip: Arc<Hip>,
    device: c_int,
    raw: Raw<sys::ihipStream_t>,
    owned: bool,
}

impl RocmStream {
    pub(crate) fn new(hip: &Arc<Hip>, device: c_int) -> Result<RocmStream> {
        Ok(RocmStream {
            hip: Arc::clone(hip),
            device,
            raw: Raw(hip.stream_create()?),
            owned: true,
        })
    }

    /// Wraps a stream another library made (a caller's `hipStream_t`; `NULL` is the
    /// device's null stream) so oxccl work can be queued on it, on `device`, which it must
    /// belong to. The wrapper never destroys the stream: the ROCm counterpart of
    /// `CudaDevice::borrow_stream`, used where a C API hands oxccl its caller's stream
    /// (RCCL's ABI, served by `liboxccl_nccl.so`).
    ///
    /// # Safety
    /// `raw` must be a live stream of `device` (or `NULL`, or one of HIP's special
    /// per-thread handles) for as long as the returned value is used; its owner destroys
    /// it, after the last use.
    pub unsafe fn borrowed(device: &RocmDevice, raw: sys::hipStream_t) -> Result<RocmStream> {
        let id = device.id();
        let ordinal = c_int::try_from(id.0)
            .map_err(|_| Error::InvalidArgument(format!("{id} is out of range")))?;
        Ok(RocmStream {
            hip: Arc::clone(device.hip()),
            device: ordinal,
            raw: Raw(raw),
            owned: false,
        })
    }

    /// Whether this value destroys its stream on drop (made here, not borrowed).
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// The raw `hipStream_t`, for code that calls HIP directly (valid while `self` lives).
    pub fn as_raw(&self) -> sys::hipStream_t {
        self.raw.0
    }

    /// Work queued from a thread makes the stream's device current first: the runtime
    /// resolves some calls (copies from pageable memory, launches) against it.
    fn bind(&self) -> Result<()> {
        self.hip.set_device(self.device)
    }
}

impl Drop for RocmStream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: we own the stream; nothing can queue on it after drop.
        if let Err(e) = unsafe { self.hip.stream_destroy(self.raw.0) } {
            tracing::warn!(error = %e, "destroying a HIP stream failed");
        }
    }
}

impl Stream<RocmBackend> for RocmStream {
    fn synchronize(&self) -> Result<()> {
        // SAFETY: `self`'s stream is live (owned, or borrowed under `borrowed`'s contract).
        unsafe { self.hip.stream_synchronize(self.raw.0) }
    }

    fn record(&self, event: &RocmEvent) -> Result<()> {
        // SAFETY: both are live: `event` owns its event, `self`'s stream is live.
        unsafe { self.hip.event_record(event.raw.0, self.raw.0) }
    }

    fn wait_event(&self, event: &RocmEvent) -> Result<()> {
        // SAFETY: both are live: `self`'s stream, `event`'s own event.
        unsafe { self.hip.stream_wait_event(self.raw.0, event.raw.0) }
    }

    fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `src` is alive until the synchronize below returns; `dst` is device
        // memory by the trait's contract (HIP rejects addresses it does not know).
        unsafe {
            self.hip.memcpy_async(
                dst.0 as *mut c_void,
                src.as_ptr().cast(),
                src.len(),
                sys::MemcpyKind::HostToDevice,
                self.raw.0,
            )
        }?;
        // SAFETY: `self`'s stream is live (owned, or borrowed under `borrowed`'s contract).
        unsafe { self.hip.stream_synchronize(self.raw.0) }
    }

    fn read(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` is borrowed mutably until the synchronize below returns.
        unsafe {
            self.hip.memcpy_async(
                dst.as_mut_ptr().cast(),
                src.0 as *const c_void,
                dst.len(),
                sys::MemcpyKind::DeviceToHost,
                self.raw.0,
            )
        }?;
        // SAFETY: `self`'s stream is live (owned, or borrowed under `borrowed`'s contract).
        unsafe { self.hip.stream_synchronize(self.raw.0) }
    }

    unsafe fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // hipMemcpyDefault: the runtime tells local from peer memory by address (UVA).
        // SAFETY: both ranges are live device memory per the caller.
        unsafe {
            self.hip.memcpy_async(
                dst.0 as *mut c_void,
                src.0 as *const c_void,
                bytes,
                sys::MemcpyKind::Default,
                self.raw.0,
            )
        }
    }

    unsafe fn fill(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` is live device memory per the caller.
        unsafe {
            self.hip
                .memset_d8_async(dst.0 as *mut c_void, value, bytes, self.raw.0)
        }
    }

    unsafe fn launch(&self, kernel: &RocmKernel, config: &LaunchConfig, args: &[u8]) -> Result<()> {
        self.bind()?;
        // SAFETY: the argument block and its pointers are the caller's obligation; the
        // function handle is kept alive by `kernel`'s reference to its module.
        unsafe {
            self.hip.launch_kernel(
                kernel.raw(),
                config.grid,
                config.block,
                config.shared_mem_bytes,
                self.raw.0,
                args,
            )
        }
    }

    fn is_capturing(&self) -> Result<bool> {
        // SAFETY: `self`'s stream is live (owned, or borrowed under `borrowed`'s contract).
        unsafe { self.hip.stream_is_capturing(self.raw.0) }
    }
}

/// A timing event; destroyed on drop.
#[derive(Debug)]
pub struct RocmEvent {
    hip: Arc<Hip>,
    raw: Raw<sys::ihipEvent_t>,
}

impl RocmEvent {
    pub(crate) fn new(hip: &Arc<Hip>) -> Result<RocmEvent> {
        Ok(RocmEvent {
            hip: Arc::clone(hip),
            raw: Raw(hip.event_create()?),
        })
    }
}

impl Drop for RocmEvent {
    fn drop(&mut self) {
        // SAFETY: we own the event; nothing records or waits on it after drop.
        if let Err(e) = unsafe { self.hip.event_destroy(self.raw.0) } {
            tracing::warn!(error = %e, "destroying a HIP event failed");
        }
    }
}

impl Event<RocmBackend> for RocmEvent {
    fn synchronize(&self) -> Result<()> {
        // SAFETY: `self` owns the live event.
        unsafe { self.hip.event_synchronize(self.raw.0) }
    }

    fn elapsed_ms_since(&self, start: &Self) -> Result<f32> {
        // SAFETY: both events are live, owned by `start` and `self`.
        unsafe { self.hip.event_elapsed(start.raw.0, self.raw.0) }
    }
}
