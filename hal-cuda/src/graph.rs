//! CUDA graphs: capture a stream's work into a graph, instantiate it, replay it.
//!
//! Inherent methods (not part of the HAL trait family: only CUDA has graphs here), used by
//! `oxccl-perf --graph` and by callers that capture collectives:
//!
//! ```no_run
//! # fn demo(stream: &oxccl_hal_cuda::CudaStream) -> oxccl_hal::Result<()> {
//! stream.begin_capture()?;
//! // ... queue kernels on `stream` (they are recorded, not run) ...
//! let graph = stream.end_capture()?.instantiate(stream)?;
//! graph.launch(stream)?; // runs everything that was captured
//! # Ok(()) }
//! ```

use cudarc::driver::sys;
use oxccl_hal::{Result, Stream};

use crate::result;
use crate::stream::CudaStream;

/// Makes the stream's context current on this thread (`is_capturing` binds it first).
fn bind(stream: &CudaStream) -> Result<()> {
    stream.is_capturing().map(|_| ())
}

impl CudaStream {
    /// Starts capturing this stream's work into a graph (relaxed mode: other threads may
    /// keep using the driver meanwhile). Work queued until [`CudaStream::end_capture`] is
    /// recorded, not run.
    pub fn begin_capture(&self) -> Result<()> {
        bind(self)?;
        // SAFETY: the stream is live and its context is bound (above).
        unsafe { result::stream_begin_capture(self.raw()) }
    }

    /// Ends the capture started by [`CudaStream::begin_capture`] and returns the graph.
    pub fn end_capture(&self) -> Result<CudaGraph> {
        bind(self)?;
        // SAFETY: the stream is live; a stream that is not capturing is the driver's error.
        let graph = unsafe { result::stream_end_capture(self.raw()) }?;
        Ok(CudaGraph { graph })
    }
}

/// A captured graph; destroyed on drop.
#[derive(Debug)]
pub struct CudaGraph {
    graph: sys::CUgraph,
}

// SAFETY: graph handles are driver objects usable from any thread (the driver API is
// thread-safe; oxccl never mutates a graph from two threads).
unsafe impl Send for CudaGraph {}
// SAFETY: as above.
unsafe impl Sync for CudaGraph {}

impl CudaGraph {
    /// Instantiates the graph for launching on `stream`'s device.
    pub fn instantiate(&self, stream: &CudaStream) -> Result<CudaGraphExec> {
        bind(stream)?;
        // SAFETY: the graph is live (owned by `self`).
        let exec = unsafe { result::graph_instantiate(self.graph) }?;
        Ok(CudaGraphExec { exec })
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: the graph is ours and not used after this (no current context needed).
        if let Err(e) = unsafe { result::graph_destroy(self.graph) } {
            tracing::warn!(error = %e, "destroying a graph failed");
        }
    }
}

/// An instantiated graph; destroyed on drop.
#[derive(Debug)]
pub struct CudaGraphExec {
    exec: sys::CUgraphExec,
}

// SAFETY: as for CudaGraph.
unsafe impl Send for CudaGraphExec {}
// SAFETY: as above.
unsafe impl Sync for CudaGraphExec {}

impl CudaGraphExec {
    /// Queues one replay of the graph on `stream`.
    pub fn launch(&self, stream: &CudaStream) -> Result<()> {
        bind(stream)?;
        // SAFETY: the executable graph and the stream are live, the context bound.
        unsafe { result::graph_launch(self.exec, stream.raw()) }
    }
}

impl Drop for CudaGraphExec {
    fn drop(&mut self) {
        // SAFETY: the executable graph is ours and not used after this.
        if let Err(e) = unsafe { result::graph_exec_destroy(self.exec) } {
            tracing::warn!(error = %e, "destroying a graph exec failed");
        }
    }
}
