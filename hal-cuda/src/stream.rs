//! Streams and events.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;
use oxccl_hal::{DevicePtr, Error, LaunchConfig, Result, Stream};

use crate::device::{Context, CudaBackend};
use crate::module::CudaKernel;
use crate::result;

/// Most threads a CUDA block may have.
pub const MAX_THREADS_PER_BLOCK: u64 = 1024;

/// Checks a launch shape: every grid and block dimension non-zero, at most 1024 threads per
/// block.
pub fn validate_launch(config: &LaunchConfig) -> Result<()> {
    if config.grid.contains(&0) || config.block.contains(&0) {
        return Err(Error::InvalidArgument(format!(
            "launch with a zero dimension: grid {:?}, block {:?}",
            config.grid, config.block
        )));
    }
    let threads: u64 = config.block.iter().map(|&b| u64::from(b)).product();
    if threads > MAX_THREADS_PER_BLOCK {
        return Err(Error::InvalidArgument(format!(
            "block {:?} has {threads} threads, more than {MAX_THREADS_PER_BLOCK}",
            config.block
        )));
    }
    Ok(())
}

/// A stream on one device: a non-blocking stream made here (destroyed on drop), or a
/// stream borrowed from another library ([`crate::CudaDevice::borrow_stream`], never
/// destroyed here).
#[derive(Debug)]
pub struct CudaStream {
    ctx: Arc<Context>,
    stream: sys::CUstream,
    owned: bool,
}

// SAFETY: a CUstream is a driver handle usable from any thread; the driver API is
// thread-safe.
unsafe impl Send for CudaStream {}
// SAFETY: as above.
unsafe impl Sync for CudaStream {}

impl CudaStream {
    pub(crate) fn new(ctx: Arc<Context>) -> Result<CudaStream> {
        let stream = result::stream_create()?;
        Ok(CudaStream {
            ctx,
            stream,
            owned: true,
        })
    }

    pub(crate) fn borrowed_in(ctx: Arc<Context>, stream: sys::CUstream) -> CudaStream {
        CudaStream {
            ctx,
            stream,
            owned: false,
        }
    }

    /// The raw driver stream (for interop with other CUDA libraries).
    pub fn raw(&self) -> sys::CUstream {
        self.stream
    }

    fn refuse_while_capturing(&self, what: &'static str) -> Result<()> {
        // SAFETY: `self.stream` is live.
        if unsafe { result::stream_is_capturing(self.stream) }? {
            return Err(Error::Capturing(what));
        }
        Ok(())
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        if let Err(e) = self.ctx.bind() {
            tracing::warn!(error = %e, "binding the context to destroy a stream");
        }
        // SAFETY: the stream is ours and not used after this.
        if let Err(e) = unsafe { result::stream_destroy(self.stream) } {
            tracing::warn!(error = %e, "destroying a stream failed");
        }
    }
}

impl Stream<CudaBackend> for CudaStream {
    fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        self.refuse_while_capturing("stream synchronize")?;
        // SAFETY: `self.stream` is live.
        unsafe { result::stream_synchronize(self.stream) }
    }

    fn record(&self, event: &CudaEvent) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: both handles are live.
        unsafe { result::event_record(event.event, self.stream) }
    }

    fn wait_event(&self, event: &CudaEvent) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: both handles are live.
        unsafe { result::stream_wait_event(self.stream, event.event) }
    }

    fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        self.refuse_while_capturing("write")?;
        // SAFETY: the trait's contract makes `dst` device memory of `src.len()` bytes; the
        // stream is synchronized before `src` is released.
        unsafe { result::memcpy_htod_async(dst.0, src, self.stream) }?;
        // SAFETY: `self.stream` is live.
        unsafe { result::stream_synchronize(self.stream) }
    }

    fn read(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        self.refuse_while_capturing("read")?;
        // SAFETY: as in `write`; `dst` is read only after the synchronization.
        unsafe { result::memcpy_dtoh_async(dst, src.0, self.stream) }?;
        // SAFETY: `self.stream` is live.
        unsafe { result::stream_synchronize(self.stream) }
    }

    unsafe fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the caller guarantees both ranges (unified addressing makes peer and
        // imported addresses valid here).
        unsafe { result::memcpy_async(dst.0, src.0, bytes, self.stream) }
    }

    unsafe fn fill(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the caller guarantees the range.
        unsafe { result::memset_d8_async(dst.0, value, bytes, self.stream) }
    }

    unsafe fn launch(&self, kernel: &CudaKernel, config: &LaunchConfig, args: &[u8]) -> Result<()> {
        validate_launch(config)?;
        kernel.check_args(args)?;
        if kernel.context_raw() != self.ctx.raw() {
            return Err(Error::InvalidArgument(format!(
                "kernel {} was loaded on another device than this stream's",
                kernel.name()
            )));
        }
        self.ctx.bind()?;
        // The driver reads the parameter's bytes through this pointer at launch time (and
        // copies them when capturing), so the slice only has to live for the call.
        let mut params = [args.as_ptr().cast_mut().cast::<c_void>()];
        let params_ptr = if args.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        let dims = result::Dims {
            grid: config.grid,
            block: config.block,
            shared_mem_bytes: config.shared_mem_bytes,
            early_launch: config.early_launch && self.ctx.early_launch(),
        };
        // SAFETY: the function and stream are live; the caller guarantees `args` is the
        // kernel's argument block with valid pointers.
        unsafe { result::launch_kernel(kernel.raw(), dims, self.stream, params_ptr) }
    }

    fn is_capturing(&self) -> Result<bool> {
        self.ctx.bind()?;
        // SAFETY: `self.stream` is live.
        unsafe { result::stream_is_capturing(self.stream) }
    }
}

/// A timing event; destroyed on drop.
#[derive(Debug)]
pub struct CudaEvent {
    ctx: Arc<Context>,
    event: sys::CUevent,
}

// SAFETY: a CUevent is a driver handle usable from any thread.
unsafe impl Send for CudaEvent {}
// SAFETY: as above.
unsafe impl Sync for CudaEvent {}

impl CudaEvent {
    /// An event in `ctx`, with timing data when `timed`.
    pub(crate) fn new(ctx: Arc<Context>, timed: bool) -> Result<CudaEvent> {
        let event = result::event_create(timed)?;
        Ok(CudaEvent { ctx, event })
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind() {
            tracing::warn!(error = %e, "binding the context to destroy an event");
        }
        // SAFETY: the event is ours and not used after this.
        if let Err(e) = unsafe { result::event_destroy(self.event) } {
            tracing::warn!(error = %e, "destroying an event failed");
        }
    }
}

impl oxccl_hal::Event<CudaBackend> for CudaEvent {
    fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the event is live.
        unsafe { result::event_synchronize(self.event) }
    }

    fn elapsed_ms_since(&self, start: &Self) -> Result<f32> {
        self.ctx.bind()?;
        // SAFETY: both events are live.
        unsafe { result::event_elapsed_ms(start.event, self.event) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_shapes_are_validated() {
        assert!(validate_launch(&LaunchConfig::linear(1, 1)).is_ok());
        assert!(validate_launch(&LaunchConfig::linear(132, 1024)).is_ok());
        assert!(validate_launch(&LaunchConfig::linear(0, 256)).is_err());
        assert!(validate_launch(&LaunchConfig::linear(1, 0)).is_err());
        assert!(validate_launch(&LaunchConfig::linear(1, 1025)).is_err());
        let cube = LaunchConfig {
            grid: [1, 1, 1],
            block: [16, 16, 8],
            shared_mem_bytes: 0,
            early_launch: false,
        };
        assert!(validate_launch(&cube).is_err());
        let flat = LaunchConfig {
            grid: [4, 2, 0],
            block: [32, 1, 1],
            shared_mem_bytes: 0,
            early_launch: false,
        };
        assert!(validate_launch(&flat).is_err());
    }
}
