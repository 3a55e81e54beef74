//! `oxccl._oxccl.Communicator`: one rank's [`Communicator`], its collectives on Python
//! arrays, registration and teardown. The Python package (`oxccl/__init__.py`) wraps it
//! with the conveniences (the caller's current stream, default outputs, torch stores).
//!
//! GPU backends run each call on the caller's stream, asynchronously, as the Rust API does.
//! The host backend cannot run on a caller's arbitrary host memory (its peers map only
//! host-backend allocations), so there every call copies the input into a staging
//! allocation of the communicator's, runs there, waits, and copies the result out: the call
//! is synchronous and the stream is ignored (as the NCCL API does on the host backend).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use oxccl_collectives::backend::{self, AnyDevice, AnyMemory, AnyStream};
use oxccl_collectives::channels::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_collectives::hal::{
    AccumType, BackendKind, DataType, Device, DeviceId, DevicePtr, Error, Memory, MemoryKind,
    ReduceOp, Result, Stream,
};
use oxccl_collectives::{Collective, CommConfig, Communicator};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::buffer::{self, Place, View};
use crate::OxcclError;

/// A collective and its own arguments.
#[derive(Debug, Clone, Copy)]
enum Kind {
    AllReduce(ReduceOp, AccumType),
    AllGather,
    ReduceScatter(ReduceOp, AccumType),
    AllToAll,
    Broadcast(u32),
    Reduce(ReduceOp, AccumType, u32),
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::AllReduce(..) => "all_reduce",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter(..) => "reduce_scatter",
            Kind::AllToAll => "all_to_all",
            Kind::Broadcast(_) => "broadcast",
            Kind::Reduce(..) => "reduce",
        }
    }

    fn collective(self) -> Collective {
        match self {
            Kind::AllReduce(..) => Collective::AllReduce,
            Kind::AllGather => Collective::AllGather,
            Kind::ReduceScatter(..) => Collective::ReduceScatter,
            Kind::AllToAll => Collective::AllToAll,
            Kind::Broadcast(_) => Collective::Broadcast,
            Kind::Reduce(..) => Collective::Reduce,
        }
    }
}

/// The host backend's per-communicator state (see the module docs).
#[derive(Debug)]
struct Host {
    stream: AnyStream,
    staging: Mutex<Option<AnyMemory>>,
    /// Buffers registered on the host backend: recorded only, since calls stage anyway.
    registered: Mutex<HashSet<(u64, usize)>>,
}

impl Host {
    /// The staging buffer, grown to at least `need` bytes, and its address; the guard
    /// keeps it from another call until the caller's call has completed.
    fn staging(
        &self,
        comm: &Communicator,
        need: usize,
    ) -> Result<(MutexGuard<'_, Option<AnyMemory>>, DevicePtr)> {
        let mut staging = self.staging.lock().unwrap_or_else(PoisonError::into_inner);
        if staging.as_ref().is_none_or(|m| m.len() < need) {
            *staging = None;
            *staging = Some(comm.device().alloc(need.max(4096), MemoryKind::Plain)?);
        }
        let ptr = staging
            .as_ref()
            .map(|m| m.ptr())
            .ok_or_else(|| Error::InvalidArgument("no staging buffer".into()))?;
        Ok((staging, ptr))
    }
}

#[derive(Debug)]
struct Inner {
    comm: Communicator,
    host: Option<Host>,
}

/// Names the call and rank in every message.
#[derive(Debug, Clone, Copy)]
struct Ctx {
    call: &'static str,
    rank: u32,
    world: u32,
}

impl Ctx {
    fn head(&self) -> String {
        format!("oxccl {} (rank {} of {})", self.call, self.rank, self.world)
    }

    fn arg(&self, name: &str) -> String {
        format!("{}: {name}", self.head())
    }

    fn value(&self, msg: impl std::fmt::Display) -> PyErr {
        PyValueError::new_err(format!("{}: {msg}", self.head()))
    }

    /// A failure of the Rust core: `ValueError` for arguments it refused, `OxcclError`
    /// for everything else (timeouts, peers, the driver).
    fn fail(&self, e: &Error) -> PyErr {
        let root = e.root();
        let msg = format!("{} failed: {root}", self.head());
        match root {
            Error::InvalidArgument(_) => PyValueError::new_err(msg),
            _ => OxcclError::new_err(msg),
        }
    }
}

fn parse_op(ctx: &Ctx, op: &str) -> PyResult<ReduceOp> {
    op.parse::<ReduceOp>().map_err(|_| {
        ctx.value(format!(
            "op '{op}' is not a reduction (sum, prod, min, max, avg)"
        ))
    })
}

fn parse_accum(ctx: &Ctx, accum: &str) -> PyResult<AccumType> {
    Ok(match accum.trim().to_ascii_lowercase().as_str() {
        "auto" | "" => AccumType::Auto,
        "native" => AccumType::Native,
        "f16" | "float16" | "half" => AccumType::F16,
        "f32" | "float32" | "float" => AccumType::F32,
        other => {
            return Err(ctx.value(format!(
                "accum '{other}' is not an accumulation type (auto, native, f16, f32)"
            )))
        }
    })
}

fn backend_name(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Host => "host",
        BackendKind::Cuda => "cuda",
        BackendKind::Rocm => "rocm",
    }
}

/// One rank of an oxccl communicator (see the Python package for the documented API).
#[pyclass(module = "oxccl._oxccl", name = "Communicator", frozen)]
#[derive(Debug)]
pub struct PyCommunicator {
    inner: RwLock<Option<Arc<Inner>>>,
    rank: u32,
    world: u32,
    backend: BackendKind,
    device: u32,
}

/// Settings for a new communicator: the environment's, with the caller's timeout.
fn config(timeout_ms: Option<u64>) -> Result<CommConfig> {
    let mut c = CommConfig::from_env()?;
    if let Some(ms) = timeout_ms {
        c.timeout = Duration::from_millis(ms);
    }
    Ok(c)
}

fn backend_kind(name: Option<&str>) -> Result<BackendKind> {
    match name {
        Some(n) => {
            let kind = backend::select::parse(n)?;
            if !backend::select::built().contains(&kind) {
                return Err(Error::Unsupported(format!(
                    "this oxccl wheel was built without the {n} backend (build it with \
                     `maturin build --release --features {n}`)"
                )));
            }
            Ok(kind)
        }
        None => backend::chosen(),
    }
}

impl PyCommunicator {
    fn build(
        bootstrap: Bootstrap,
        kind: BackendKind,
        device: u32,
        cfg: CommConfig,
    ) -> Result<Self> {
        let rank = bootstrap.rank();
        let world = bootstrap.world_size();
        let dev = AnyDevice::open_with(kind, DeviceId(device)).map_err(|e| e.at_rank(rank))?;
        let comm = Communicator::new(bootstrap, dev, cfg)?;
        let host = match kind {
            BackendKind::Host => Some(Host {
                stream: comm.device().create_stream()?,
                staging: Mutex::new(None),
                registered: Mutex::new(HashSet::new()),
            }),
            _ => None,
        };
        Ok(PyCommunicator {
            inner: RwLock::new(Some(Arc::new(Inner { comm, host }))),
            rank,
            world,
            backend: kind,
            device,
        })
    }

    fn ctx(&self, call: &'static str) -> Ctx {
        Ctx {
            call,
            rank: self.rank,
            world: self.world,
        }
    }

    fn live(&self, ctx: &Ctx) -> PyResult<Arc<Inner>> {
        self.inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| {
                OxcclError::new_err(format!("{}: the communicator was destroyed", ctx.head()))
            })
    }

    /// Whether memory at `place` is on this communicator's device.
    fn on_this_device(&self, place: Place) -> bool {
        match (self.backend, place) {
            (BackendKind::Host, Place::Host) => true,
            (BackendKind::Cuda, Place::Cuda(d)) => d < 0 || d as u32 == self.device,
            (BackendKind::Rocm, Place::Rocm(d)) => d as u32 == self.device,
            _ => false,
        }
    }

    fn elsewhere(&self, ctx: &Ctx, name: &str, place: Place) -> PyErr {
        let mine = match self.backend {
            BackendKind::Host => "host memory (the host backend)".to_string(),
            other => format!("{}:{}", backend_name(other), self.device),
        };
        ctx.value(format!(
            "{name} is in {place}, but this communicator runs on {mine}"
        ))
    }

    /// The array `obj` as a view on this communicator's device.
    fn take(&self, ctx: &Ctx, obj: &Bound<'_, PyAny>, name: &str, write: bool) -> PyResult<View> {
        // The device first, before the producer is asked to export.
        if let Some(place) = buffer::dlpack_place(obj)? {
            if !self.on_this_device(place) {
                return Err(self.elsewhere(ctx, name, place));
            }
        }
        let v = buffer::view(obj, &ctx.arg(name))?;
        if !self.on_this_device(v.place) {
            return Err(self.elsewhere(ctx, name, v.place));
        }
        if write {
            self.writable(ctx, v, name)
        } else {
            Ok(v)
        }
    }

    fn writable(&self, ctx: &Ctx, v: View, name: &str) -> PyResult<View> {
        if v.readonly {
            return Err(ctx.value(format!("{name} is read-only")));
        }
        Ok(v)
    }

    fn collective(
        &self,
        py: Python<'_>,
        kind: Kind,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        stream: u64,
    ) -> PyResult<()> {
        let ctx = self.ctx(kind.name());
        let inner = self.live(&ctx)?;
        let i = self.take(&ctx, input, "input", false)?;
        let o = if output.is(input) {
            self.writable(&ctx, i, "output")?
        } else {
            self.take(&ctx, output, "output", true)?
        };
        same_dtype(&ctx, &i, &o)?;
        let n = self.world as usize;
        let count = match kind {
            Kind::AllReduce(..) | Kind::Broadcast(_) | Kind::Reduce(..) => {
                if i.count != o.count {
                    return Err(ctx.value(format!(
                        "input has {} elements but output {} (they must be equal)",
                        i.count, o.count
                    )));
                }
                i.count
            }
            Kind::AllGather => {
                if Some(o.count) != i.count.checked_mul(n) {
                    return Err(ctx.value(format!(
                        "output has {} elements; it must hold world_size ({n}) x input ({})",
                        o.count, i.count
                    )));
                }
                i.count
            }
            Kind::ReduceScatter(..) => {
                if Some(i.count) != o.count.checked_mul(n) {
                    return Err(ctx.value(format!(
                        "input has {} elements; it must hold world_size ({n}) x output ({})",
                        i.count, o.count
                    )));
                }
                o.count
            }
            Kind::AllToAll => {
                if i.count != o.count || i.count % n != 0 {
                    return Err(ctx.value(format!(
                        "input ({}) and output ({}) must have the same number of elements, a \
                         multiple of world_size ({n})",
                        i.count, o.count
                    )));
                }
                i.count / n
            }
        };
        if let Kind::Broadcast(root) | Kind::Reduce(.., root) = kind {
            if root >= self.world {
                return Err(ctx.value(format!("root {root} is not a rank (0..{n})")));
            }
        }
        let rank = self.rank;
        py.detach(move || match &inner.host {
            Some(host) => host_call(&inner.comm, host, kind, rank, n, i, o, count),
            None => device_call(&inner.comm, kind, i, o, count, stream),
        })
        .map_err(|e| ctx.fail(&e))
    }
}

/// Refuses an input and an output of different element types.
fn same_dtype(ctx: &Ctx, i: &View, o: &View) -> PyResult<()> {
    if i.dtype != o.dtype {
        return Err(PyTypeError::new_err(format!(
            "{}: input is {} but output is {}",
            ctx.head(),
            i.dtype,
            o.dtype
        )));
    }
    Ok(())
}

/// The host backend's call: stage, run, wait, copy out (see the module docs).
#[allow(clippy::too_many_arguments)]
fn host_call(
    comm: &Communicator,
    host: &Host,
    kind: Kind,
    rank: u32,
    n: usize,
    i: View,
    o: View,
    count: usize,
) -> Result<()> {
    let (inp, out, dtype) = (DevicePtr(i.ptr), DevicePtr(o.ptr), i.dtype);
    // The caller's buffers get the entry checks (overlap, in-place rules); the call runs
    // on the staging copy.
    comm.check_buffers(kind.collective(), inp, out, count, dtype)?;
    if count == 0 {
        return Ok(());
    }
    let bytes = dtype.bytes(count)?;
    let total = bytes
        .checked_mul(n)
        .ok_or_else(|| Error::InvalidArgument("size overflows".into()))?;
    let slot = bytes * rank as usize;
    // (input bytes, where they go in staging), (output bytes, where they come from).
    let (send, recv) = match kind {
        Kind::AllReduce(..) | Kind::Broadcast(_) => ((bytes, 0), Some((bytes, 0))),
        Kind::Reduce(.., root) => ((bytes, 0), (rank == root).then_some((bytes, 0))),
        Kind::AllGather => ((bytes, slot), Some((total, 0))),
        Kind::ReduceScatter(..) => ((total, 0), Some((bytes, slot))),
        Kind::AllToAll => ((total, 0), Some((total, total))),
    };
    let need = match kind {
        Kind::AllToAll => 2 * total,
        Kind::AllGather | Kind::ReduceScatter(..) => total,
        _ => bytes,
    };
    // The guard holds the staging until this call has completed.
    let (_staging, buf) = host.staging(comm, need)?;
    // SAFETY: the view was read from a live array the caller holds for the whole call,
    // spanning at least `send.0` bytes from its address (checked against the counts).
    let src = unsafe { std::slice::from_raw_parts(i.ptr as usize as *const u8, send.0) };
    host.stream.write(buf.offset(send.1)?, src)?;
    let s = &host.stream;
    // SAFETY: the staging allocation holds `need` bytes laid out as each collective's
    // in-place form expects, and lives until the stream is synchronized below.
    let run = unsafe {
        match kind {
            Kind::AllReduce(op, acc) => comm.all_reduce(buf, buf, count, dtype, op, acc, s),
            Kind::AllGather => comm.all_gather(buf.offset(slot)?, buf, count, dtype, s),
            Kind::ReduceScatter(op, acc) => {
                comm.reduce_scatter(buf, buf.offset(slot)?, count, dtype, op, acc, s)
            }
            Kind::AllToAll => comm.all_to_all(buf, buf.offset(total)?, count, dtype, s),
            Kind::Broadcast(root) => comm.broadcast(buf, buf, count, dtype, root, s),
            Kind::Reduce(op, acc, root) => comm.reduce(buf, buf, count, dtype, op, acc, root, s),
        }
    };
    run.and_then(|()| s.synchronize())
        .and_then(|()| comm.check_error(s))?;
    if let Some((len, at)) = recv {
        // SAFETY: as for `src`: the output array is live, writable and spans `len` bytes.
        let dst = unsafe { std::slice::from_raw_parts_mut(o.ptr as usize as *mut u8, len) };
        s.read(buf.offset(at)?, dst)?;
    }
    Ok(())
}

/// An all_to_all_v call's counts and displacements (elements): (counts, displacements)
/// of the send side and of the receive side.
struct VLayoutArgs {
    send: (Vec<usize>, Vec<usize>),
    recv: (Vec<usize>, Vec<usize>),
}

/// The host backend's all_to_all_v: the input and the output (its current contents, so
/// that bytes no range covers come back unchanged) staged, the call run there, the output
/// copied back.
fn host_call_v(comm: &Communicator, host: &Host, i: View, o: View, l: &VLayoutArgs) -> Result<()> {
    let dtype = i.dtype;
    let (in_bytes, out_bytes) = (dtype.bytes(i.count)?, dtype.bytes(o.count)?);
    // The output's part of the staging starts 16-byte aligned after the input's.
    let out_at = in_bytes.next_multiple_of(16);
    let need = out_at
        .checked_add(out_bytes)
        .ok_or_else(|| Error::InvalidArgument("size overflows".into()))?;
    // The guard holds the staging until this call has completed.
    let (_staging, buf) = host.staging(comm, need)?;
    let out = buf.offset(out_at)?;
    let s = &host.stream;
    // SAFETY: both views were read from live arrays the caller holds for the whole call,
    // spanning their `count` elements.
    let (src, dst) = unsafe {
        (
            std::slice::from_raw_parts(i.ptr as usize as *const u8, in_bytes),
            std::slice::from_raw_parts_mut(o.ptr as usize as *mut u8, out_bytes),
        )
    };
    s.write(buf, src)?;
    s.write(out, dst)?;
    // SAFETY: the staging allocation holds both arrays (checked against every range by
    // the caller) and lives until the stream is synchronized below.
    let run = unsafe {
        comm.all_to_all_v(
            buf, &l.send.0, &l.send.1, out, &l.recv.0, &l.recv.1, dtype, s,
        )
    };
    run.and_then(|()| s.synchronize())
        .and_then(|()| comm.check_error(s))?;
    s.read(out, dst)
}

/// A GPU backend's all_to_all_v: on the caller's stream, asynchronous.
fn device_call_v(
    comm: &Communicator,
    i: View,
    o: View,
    l: &VLayoutArgs,
    stream: u64,
) -> Result<()> {
    let s = borrow_stream(comm, stream)?;
    // SAFETY: the views were read from live arrays on this communicator's device that the
    // caller keeps (and does not write) until the stream's work completes, each holding
    // every range (checked); the caller names a live stream of this device.
    unsafe {
        comm.all_to_all_v(
            DevicePtr(i.ptr),
            &l.send.0,
            &l.send.1,
            DevicePtr(o.ptr),
            &l.recv.0,
            &l.recv.1,
            i.dtype,
            &s,
        )
    }
}

/// A GPU backend's call: on the caller's stream, asynchronous.
fn device_call(
    comm: &Communicator,
    kind: Kind,
    i: View,
    o: View,
    count: usize,
    stream: u64,
) -> Result<()> {
    let s = borrow_stream(comm, stream)?;
    let (inp, out, dtype) = (DevicePtr(i.ptr), DevicePtr(o.ptr), i.dtype);
    // SAFETY: the views were read from live arrays on this communicator's device that the
    // caller keeps (and does not write) until the stream's work completes, with the counts
    // checked above; the caller names a live stream of this device.
    unsafe {
        match kind {
            Kind::AllReduce(op, acc) => comm.all_reduce(inp, out, count, dtype, op, acc, &s),
            Kind::AllGather => comm.all_gather(inp, out, count, dtype, &s),
            Kind::ReduceScatter(op, acc) => {
                comm.reduce_scatter(inp, out, count, dtype, op, acc, &s)
            }
            Kind::AllToAll => comm.all_to_all(inp, out, count, dtype, &s),
            Kind::Broadcast(root) => comm.broadcast(inp, out, count, dtype, root, &s),
            Kind::Reduce(op, acc, root) => comm.reduce(inp, out, count, dtype, op, acc, root, &s),
        }
    }
}

#[cfg(feature = "cuda")]
fn borrow_stream(comm: &Communicator, stream: u64) -> Result<AnyStream> {
    match comm.device() {
        AnyDevice::Cuda(d) => {
            let raw = stream as usize as *mut std::ffi::c_void;
            // SAFETY: the caller names a live stream of this device (or 0, the legacy
            // default stream); the borrowed wrapper destroys nothing when dropped.
            Ok(AnyStream::Cuda(unsafe { d.borrow_stream(raw.cast()) }))
        }
        _ => Err(Error::Unsupported(
            "a GPU call on a communicator without a CUDA device".into(),
        )),
    }
}

#[cfg(not(feature = "cuda"))]
fn borrow_stream(comm: &Communicator, _stream: u64) -> Result<AnyStream> {
    Err(Error::Unsupported(format!(
        "callers' streams are taken on CUDA only; this communicator runs on {}",
        comm.device().backend()
    )))
}

#[pymethods]
impl PyCommunicator {
    /// Joins the job named by `unique_id` (bytes from `oxccl.unique_id()` on one rank) as
    /// `rank` of `world_size` (collective), on device `device` of `backend`.
    #[staticmethod]
    #[pyo3(signature = (unique_id, rank, world_size, device=None, backend=None, timeout_ms=None))]
    fn from_unique_id(
        py: Python<'_>,
        unique_id: &[u8],
        rank: u32,
        world_size: u32,
        device: Option<u32>,
        backend: Option<&str>,
        timeout_ms: Option<u64>,
    ) -> PyResult<Self> {
        let ctx = Ctx {
            call: "Communicator",
            rank,
            world: world_size,
        };
        let id = UniqueId::from_bytes(unique_id).map_err(|e| ctx.fail(&e))?;
        let backend = backend.map(str::to_owned);
        let device = device.unwrap_or_else(|| {
            std::env::var("LOCAL_RANK")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(rank)
        });
        py.detach(move || {
            let kind = backend_kind(backend.as_deref())?;
            let bootstrap = Bootstrap::new(&id, rank, world_size, &BootstrapConfig::from_env()?)?;
            PyCommunicator::build(bootstrap, kind, device, config(timeout_ms)?)
        })
        .map_err(|e| ctx.fail(&e))
    }

    /// Joins the job the launcher describes (torchrun, mpirun, srun: `RANK`, `WORLD_SIZE`,
    /// `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`); collective.
    #[staticmethod]
    #[pyo3(signature = (device=None, backend=None, timeout_ms=None))]
    fn from_env(
        py: Python<'_>,
        device: Option<u32>,
        backend: Option<&str>,
        timeout_ms: Option<u64>,
    ) -> PyResult<Self> {
        let backend = backend.map(str::to_owned);
        py.detach(move || {
            let kind = backend_kind(backend.as_deref())?;
            let (bootstrap, info) = Bootstrap::from_env(&BootstrapConfig::from_env()?)?;
            let device = device.unwrap_or(info.local_rank);
            PyCommunicator::build(bootstrap, kind, device, config(timeout_ms)?)
        })
        .map_err(|e| {
            OxcclError::new_err(format!("oxccl Communicator.from_env failed: {}", e.root()))
        })
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    #[getter]
    fn world_size(&self) -> u32 {
        self.world
    }

    /// `"host"`, `"cuda"` or `"rocm"`.
    #[getter]
    fn backend(&self) -> &'static str {
        backend_name(self.backend)
    }

    /// The device ordinal this rank runs on.
    #[getter]
    fn device(&self) -> u32 {
        self.device
    }

    /// Whether `destroy()` was called.
    #[getter]
    fn destroyed(&self) -> bool {
        self.inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }

    #[pyo3(signature = (input, output, op="sum", accum="auto", stream=0))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        op: &str,
        accum: &str,
        stream: u64,
    ) -> PyResult<()> {
        let ctx = self.ctx("all_reduce");
        let kind = Kind::AllReduce(parse_op(&ctx, op)?, parse_accum(&ctx, accum)?);
        self.collective(py, kind, input, output, stream)
    }

    #[pyo3(signature = (input, output, stream=0))]
    fn all_gather(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        stream: u64,
    ) -> PyResult<()> {
        self.collective(py, Kind::AllGather, input, output, stream)
    }

    #[pyo3(signature = (input, output, op="sum", accum="auto", stream=0))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        op: &str,
        accum: &str,
        stream: u64,
    ) -> PyResult<()> {
        let ctx = self.ctx("reduce_scatter");
        let kind = Kind::ReduceScatter(parse_op(&ctx, op)?, parse_accum(&ctx, accum)?);
        self.collective(py, kind, input, output, stream)
    }

    #[pyo3(signature = (input, output, stream=0))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        stream: u64,
    ) -> PyResult<()> {
        self.collective(py, Kind::AllToAll, input, output, stream)
    }

    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (input, send_counts, send_displs, output, recv_counts, recv_displs, stream=0))]
    fn all_to_all_v(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        send_counts: Vec<usize>,
        send_displs: Vec<usize>,
        output: &Bound<'_, PyAny>,
        recv_counts: Vec<usize>,
        recv_displs: Vec<usize>,
        stream: u64,
    ) -> PyResult<()> {
        let ctx = self.ctx("all_to_all_v");
        let inner = self.live(&ctx)?;
        if output.is(input) {
            return Err(ctx
                .value("input and output are the same array (all_to_all_v has no in-place form)"));
        }
        let i = self.take(&ctx, input, "input", false)?;
        let o = self.take(&ctx, output, "output", true)?;
        same_dtype(&ctx, &i, &o)?;
        // The arrays must hold every range (the communicator checks the rest).
        for (name, view, counts, displs) in [
            ("input", &i, &send_counts, &send_displs),
            ("output", &o, &recv_counts, &recv_displs),
        ] {
            let extent = counts
                .iter()
                .zip(displs.iter())
                .filter(|(c, _)| **c > 0)
                .map(|(c, d)| c.checked_add(*d))
                .try_fold(0usize, |m, e| e.map(|e| m.max(e)));
            match extent {
                Some(e) if e <= view.count => {}
                Some(e) => {
                    return Err(ctx.value(format!(
                        "{name} has {} elements but its ranges reach element {e}",
                        view.count
                    )))
                }
                None => return Err(ctx.value(format!("the {name} ranges overflow"))),
            }
        }
        let layout = VLayoutArgs {
            send: (send_counts, send_displs),
            recv: (recv_counts, recv_displs),
        };
        py.detach(move || match &inner.host {
            Some(host) => host_call_v(&inner.comm, host, i, o, &layout),
            None => device_call_v(&inner.comm, i, o, &layout, stream),
        })
        .map_err(|e| ctx.fail(&e))
    }

    #[pyo3(signature = (input, output, root=0, stream=0))]
    fn broadcast(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        root: u32,
        stream: u64,
    ) -> PyResult<()> {
        self.collective(py, Kind::Broadcast(root), input, output, stream)
    }

    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (input, output, root=0, op="sum", accum="auto", stream=0))]
    fn reduce(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        root: u32,
        op: &str,
        accum: &str,
        stream: u64,
    ) -> PyResult<()> {
        let ctx = self.ctx("reduce");
        let kind = Kind::Reduce(parse_op(&ctx, op)?, parse_accum(&ctx, accum)?, root);
        self.collective(py, kind, input, output, stream)
    }

    /// Registers `array` for zero-copy calls (collective: every rank, same order, same
    /// length). GPU backends register the range as a window; the host backend records it
    /// (its calls are staged anyway).
    fn register(&self, py: Python<'_>, array: &Bound<'_, PyAny>) -> PyResult<()> {
        let ctx = self.ctx("register");
        let inner = self.live(&ctx)?;
        let v = self.take(&ctx, array, "array", false)?;
        if v.count == 0 {
            return Err(ctx.value("an empty array cannot be registered"));
        }
        match &inner.host {
            Some(host) => {
                host.registered
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert((v.ptr, v.bytes()));
                Ok(())
            }
            None => py
                .detach(|| inner.comm.register_window(DevicePtr(v.ptr), v.bytes()))
                .map_err(|e| ctx.fail(&e)),
        }
    }

    /// Undoes `register(array)` (collective); an array that is not registered is an error.
    fn deregister(&self, py: Python<'_>, array: &Bound<'_, PyAny>) -> PyResult<()> {
        let ctx = self.ctx("deregister");
        let inner = self.live(&ctx)?;
        let v = self.take(&ctx, array, "array", false)?;
        match &inner.host {
            Some(host) => {
                let known = host
                    .registered
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&(v.ptr, v.bytes()));
                if known {
                    Ok(())
                } else {
                    Err(ctx.value(format!(
                        "{} bytes at {:#x} are not a registered array",
                        v.bytes(),
                        v.ptr
                    )))
                }
            }
            None => py
                .detach(|| inner.comm.deregister_window(DevicePtr(v.ptr)))
                .map_err(|e| ctx.fail(&e)),
        }
    }

    /// Number of registered arrays.
    #[getter]
    fn registered(&self) -> PyResult<usize> {
        let inner = self.live(&self.ctx("registered"))?;
        Ok(match &inner.host {
            Some(h) => h
                .registered
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len(),
            None => inner.comm.registered_buffers(),
        })
    }

    /// Waits for `stream` (a GPU stream handle; ignored on the host backend, whose calls
    /// are synchronous) and raises the failure a kernel recorded (a peer's timeout, ...).
    /// Not allowed while capturing a CUDA graph.
    #[pyo3(signature = (stream=0))]
    fn check(&self, py: Python<'_>, stream: u64) -> PyResult<()> {
        let ctx = self.ctx("check");
        let inner = self.live(&ctx)?;
        if inner.host.is_some() {
            return Ok(());
        }
        py.detach(|| {
            let s = borrow_stream(&inner.comm, stream)?;
            inner.comm.check_error(&s)
        })
        .map_err(|e| ctx.fail(&e))
    }

    /// Tears the communicator down (collective: waits for every rank); later calls raise.
    /// Destroying twice does nothing.
    fn destroy(&self, py: Python<'_>) -> PyResult<()> {
        let ctx = self.ctx("destroy");
        let mut slot = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        let Some(arc) = slot.take() else {
            return Ok(());
        };
        let inner = match Arc::try_unwrap(arc) {
            Ok(inner) => inner,
            Err(arc) => {
                *slot = Some(arc);
                return Err(OxcclError::new_err(format!(
                    "{}: a call on another thread is still running",
                    ctx.head()
                )));
            }
        };
        drop(slot);
        py.detach(move || {
            inner.comm.device().synchronize()?;
            let Inner { comm, host } = inner;
            drop(host);
            comm.destroy()
        })
        .map_err(|e| ctx.fail(&e))
    }

    fn __repr__(&self) -> String {
        format!(
            "<oxccl.Communicator rank {} of {} on {}:{}{}>",
            self.rank,
            self.world,
            backend_name(self.backend),
            self.device,
            if self.destroyed() { " (destroyed)" } else { "" }
        )
    }
}

/// A new unique id (128 bytes): starts the bootstrap root in this process, which must
/// live until every rank has joined.
#[pyfunction]
pub fn unique_id(py: Python<'_>) -> PyResult<Vec<u8>> {
    py.detach(|| {
        let id = UniqueId::create(&BootstrapConfig::from_env()?)?;
        Ok::<_, Error>(id.to_bytes().to_vec())
    })
    .map_err(|e| OxcclError::new_err(format!("oxccl unique_id failed: {}", e.root())))
}

/// The backends this build holds, GPU backends first.
#[pyfunction]
pub fn backends() -> Vec<&'static str> {
    backend::select::built()
        .iter()
        .map(|k| backend_name(*k))
        .collect()
}

/// Every data type name oxccl serves.
#[pyfunction]
pub fn dtypes() -> Vec<String> {
    DataType::ALL.iter().map(|d| d.to_string()).collect()
}

/// The code of data type `name` (a name `dtypes()` lists), as a described array carries it.
#[pyfunction]
pub fn dtype_code(name: &str) -> PyResult<u32> {
    name.parse::<DataType>()
        .map(DataType::code)
        .map_err(|e| PyValueError::new_err(format!("oxccl: {e}")))
}
