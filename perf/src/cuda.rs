//! CUDA-only part of oxccl-perf: NCCL on the same buffers (`--compare nccl`).

use cudarc::nccl::{result as nccl, sys as nccl_sys};
use oxccl_collectives::backend::{AnyDevice, AnyStream};
use oxccl_collectives::hal::{AccumType, DataType, Error, ReduceOp, Result};
use oxccl_collectives::Communicator;

use crate::collective::Call;

fn nccl_error(call: &'static str, e: nccl::NcclError) -> Error {
    Error::Backend {
        backend: oxccl_collectives::hal::BackendKind::Cuda,
        call,
        code: e.0 as i64,
        name: format!("{:?}", e.0),
        message: "NCCL call failed".into(),
    }
}

fn raw_stream(stream: &AnyStream) -> Result<nccl_sys::cudaStream_t> {
    match stream {
        // The runtime's cudaStream_t and the driver's CUstream are the same handle.
        AnyStream::Cuda(s) => Ok(s.raw() as nccl_sys::cudaStream_t),
        _ => Err(Error::Unsupported(
            "NCCL and graphs need a CUDA stream".into(),
        )),
    }
}

/// Whether libnccl loads under one of the names cudarc's loader tries. cudarc panics on
/// its first NCCL call when none does, so this is asked first; it is done here rather than
/// through cudarc's `nccl::sys::is_culib_present` because only the HAL calls functions of
/// cudarc's `sys` modules.
fn nccl_present() -> bool {
    cudarc::get_lib_name_candidates("nccl").iter().any(|name| {
        // SAFETY: loading libnccl runs its initializers, as cudarc's first NCCL call would;
        // the handle is dropped at once, leaving the loading to cudarc.
        unsafe { libloading::Library::new(name) }.is_ok()
    })
}

/// An NCCL communicator over the same ranks, initialised through the oxccl bootstrap.
#[derive(Debug)]
pub struct Nccl {
    comm: nccl_sys::ncclComm_t,
}

impl Nccl {
    /// Loads libnccl.so.2 and joins every rank (collective).
    pub fn new(comm: &Communicator, _stream: &AnyStream) -> Result<Nccl> {
        if !nccl_present() {
            return Err(Error::RuntimeMissing(
                "--compare nccl: libnccl.so.2 not found (set LD_LIBRARY_PATH)".into(),
            ));
        }
        match comm.device() {
            AnyDevice::Cuda(d) => d.bind_to_thread()?,
            _ => {
                return Err(Error::Unsupported(
                    "--compare nccl needs the CUDA backend".into(),
                ))
            }
        }
        let mine = if comm.rank() == 0 {
            let id = nccl::get_uniqueid().map_err(|e| nccl_error("ncclGetUniqueId", e))?;
            id.internal.iter().map(|&c| c as u8).collect::<Vec<u8>>()
        } else {
            Vec::new()
        };
        let all = comm.bootstrap().all_gather(&mine)?;
        let root = all
            .first()
            .filter(|b| b.len() == 128)
            .ok_or_else(|| Error::InvalidArgument("rank 0 sent no NCCL unique id".into()))?;
        let mut id = nccl_sys::ncclUniqueId { internal: [0; 128] };
        for (d, s) in id.internal.iter_mut().zip(root) {
            *d = *s as _;
        }
        let mut c: nccl_sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `c` receives the communicator; the id came from rank 0's ncclGetUniqueId.
        unsafe { nccl::comm_init_rank(&mut c, comm.world_size() as i32, id, comm.rank() as i32) }
            .map_err(|e| nccl_error("ncclCommInitRank", e))?;
        Ok(Nccl { comm: c })
    }

    fn dtype(dtype: DataType) -> Option<nccl_sys::ncclDataType_t> {
        use nccl_sys::ncclDataType_t as T;
        match dtype {
            DataType::F32 => Some(T::ncclFloat32),
            DataType::F16 => Some(T::ncclFloat16),
            DataType::Bf16 => Some(T::ncclBfloat16),
            DataType::Fp8E4m3 => Some(T::ncclFloat8e4m3),
            DataType::Fp8E5m2 => Some(T::ncclFloat8e5m2),
            DataType::I8 => Some(T::ncclInt8),
            DataType::U8 => Some(T::ncclUint8),
            DataType::I32 => Some(T::ncclInt32),
            DataType::U32 => Some(T::ncclUint32),
            DataType::I64 => Some(T::ncclInt64),
            DataType::U64 => Some(T::ncclUint64),
            DataType::F64 => Some(T::ncclFloat64),
            DataType::Fp8E4m3Fnuz | DataType::Fp8E5m2Fnuz | DataType::Fp8E4m3b15 => None,
        }
    }

    /// Whether NCCL reduces the type (it has no accumulation choice: only `Auto` compares).
    pub fn supports_reduction(dtype: DataType, accum: AccumType) -> bool {
        Nccl::dtype(dtype).is_some() && accum == AccumType::Auto
    }

    /// The type NCCL moves `dtype`'s elements as: its own, else an unsigned integer of the
    /// same size (collectives that only move data deliver every bit pattern unchanged;
    /// NCCL has no 16-bit integer, and every 2-byte type here has an NCCL type).
    fn moved_as(dtype: DataType) -> Option<nccl_sys::ncclDataType_t> {
        use nccl_sys::ncclDataType_t as T;
        Nccl::dtype(dtype).or(match dtype.size() {
            1 => Some(T::ncclUint8),
            4 => Some(T::ncclUint32),
            8 => Some(T::ncclUint64),
            _ => None,
        })
    }

    /// Whether NCCL can move the type (any accumulation: nothing is reduced).
    pub fn supports_move(dtype: DataType, _accum: AccumType) -> bool {
        Nccl::moved_as(dtype).is_some()
    }

    /// Queues ncclAllGather on the call's stream (`count` elements per rank).
    pub fn all_gather(&self, c: &Call<'_>) -> Result<()> {
        let dtype = c.dtype;
        let t = Nccl::moved_as(dtype)
            .ok_or_else(|| Error::Unsupported(format!("NCCL cannot move {dtype}")))?;
        let s = raw_stream(c.stream)?;
        // SAFETY: the caller's input holds `count` elements and its output `world *
        // count` on this communicator's device, both outliving the stream's work; the
        // stream is a live CUDA stream of that device.
        unsafe {
            nccl::all_gather(
                c.input.0 as usize as *const _,
                c.output.0 as usize as *mut _,
                c.count,
                t,
                self.comm,
                s,
            )
        }
        .map(|_| ())
        .map_err(|e| nccl_error("ncclAllGather", e))
    }

    /// NCCL's reduction operator for `op`.
    fn op(op: ReduceOp) -> nccl_sys::ncclRedOp_t {
        use nccl_sys::ncclRedOp_t as O;
        match op {
            ReduceOp::Sum => O::ncclSum,
            ReduceOp::Prod => O::ncclProd,
            ReduceOp::Min => O::ncclMin,
            ReduceOp::Max => O::ncclMax,
            ReduceOp::Avg => O::ncclAvg,
        }
    }

    /// Queues ncclReduceScatter on the call's stream (`count` output elements per rank).
    pub fn reduce_scatter(&self, c: &Call<'_>) -> Result<()> {
        let dtype = c.dtype;
        let t =
            Nccl::dtype(dtype).ok_or_else(|| Error::Unsupported(format!("NCCL has no {dtype}")))?;
        let s = raw_stream(c.stream)?;
        // SAFETY: the caller's input holds `world * count` elements and its output `count`
        // on this communicator's device, both outliving the stream's work; the stream is a
        // live CUDA stream of that device.
        unsafe {
            nccl::reduce_scatter(
                c.input.0 as usize as *const _,
                c.output.0 as usize as *mut _,
                c.count,
                t,
                Nccl::op(c.op),
                self.comm,
                s,
            )
        }
        .map(|_| ())
        .map_err(|e| nccl_error("ncclReduceScatter", e))
    }

    /// Queues ncclBroadcast from the call's root on its stream.
    pub fn broadcast(&self, c: &Call<'_>) -> Result<()> {
        let dtype = c.dtype;
        let t = Nccl::moved_as(dtype)
            .ok_or_else(|| Error::Unsupported(format!("NCCL cannot move {dtype}")))?;
        let root = i32::try_from(c.root)
            .map_err(|_| Error::InvalidArgument(format!("root {}", c.root)))?;
        let s = raw_stream(c.stream)?;
        // SAFETY: the caller's buffers hold `count` elements on this communicator's device
        // and outlive the stream's work; the stream is a live CUDA stream of that device.
        unsafe {
            nccl::broadcast(
                c.input.0 as usize as *const _,
                c.output.0 as usize as *mut _,
                c.count,
                t,
                root,
                self.comm,
                s,
            )
        }
        .map(|_| ())
        .map_err(|e| nccl_error("ncclBroadcast", e))
    }

    /// Queues ncclReduce to the call's root on its stream (`count` elements; the output is
    /// written on the root only).
    pub fn reduce(&self, c: &Call<'_>) -> Result<()> {
        let dtype = c.dtype;
        let t =
            Nccl::dtype(dtype).ok_or_else(|| Error::Unsupported(format!("NCCL has no {dtype}")))?;
        let root = i32::try_from(c.root)
            .map_err(|_| Error::InvalidArgument(format!("root {}", c.root)))?;
        let s = raw_stream(c.stream)?;
        // SAFETY: the caller's buffers hold `count` elements on this communicator's device
        // and outlive the stream's work; the stream is a live CUDA stream of that device.
        unsafe {
            nccl::reduce(
                c.input.0 as usize as *const _,
                c.output.0 as usize as *mut _,
                c.count,
                t,
                Nccl::op(c.op),
                root,
                self.comm,
                s,
            )
        }
        .map(|_| ())
        .map_err(|e| nccl_error("ncclReduce", e))
    }

    /// Queues an all-to-all as nccl-tests runs it: one group of a send of chunk p to every
    /// rank p and a receive of slot p from it (cudarc binds no ncclAlltoAll).
    pub fn all_to_all(&self, c: &Call<'_>) -> Result<()> {
        let dtype = c.dtype;
        let t = Nccl::moved_as(dtype)
            .ok_or_else(|| Error::Unsupported(format!("NCCL cannot move {dtype}")))?;
        let s = raw_stream(c.stream)?;
        // SAFETY: a live communicator.
        let world =
            unsafe { nccl::comm_count(self.comm) }.map_err(|e| nccl_error("ncclCommCount", e))?;
        let chunk = dtype.bytes(c.count)? as u64;
        nccl::group_start().map_err(|e| nccl_error("ncclGroupStart", e))?;
        let mut queued = Ok(());
        for p in 0..world {
            let at = chunk * p as u64;
            // SAFETY: both buffers hold `world * count` elements on this communicator's
            // device and outlive the stream's work; chunk p lies inside them.
            let r = unsafe {
                nccl::send(
                    (c.input.0 + at) as usize as *const _,
                    c.count,
                    t,
                    p,
                    self.comm,
                    s,
                )
                .and_then(|_| {
                    nccl::recv(
                        (c.output.0 + at) as usize as *mut _,
                        c.count,
                        t,
                        p,
                        self.comm,
                        s,
                    )
                })
            };
            if let Err(e) = r {
                queued = Err(nccl_error("ncclSend/ncclRecv", e));
                break;
            }
        }
        // The group is always closed, also after a failed call inside it.
        let ended = nccl::group_end().map_err(|e| nccl_error("ncclGroupEnd", e));
        queued.and(ended.map(|_| ()))
    }

    /// Queues ncclAllReduce on the call's stream.
    pub fn all_reduce(&self, c: &Call<'_>) -> Result<()> {
        let dtype = c.dtype;
        let t =
            Nccl::dtype(dtype).ok_or_else(|| Error::Unsupported(format!("NCCL has no {dtype}")))?;
        let o = Nccl::op(c.op);
        let s = raw_stream(c.stream)?;
        // SAFETY: the caller's buffers hold `count` elements on this communicator's device
        // and outlive the stream's work; the stream is a live CUDA stream of that device.
        unsafe {
            nccl::all_reduce(
                c.input.0 as usize as *const _,
                c.output.0 as usize as *mut _,
                c.count,
                t,
                o,
                self.comm,
                s,
            )
        }
        .map(|_| ())
        .map_err(|e| nccl_error("ncclAllReduce", e))
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // SAFETY: the communicator is ours; its work was synchronized by the caller.
        if let Err(e) = unsafe { nccl::comm_destroy(self.comm) } {
            eprintln!("oxccl-perf: ncclCommDestroy failed: {e:?}");
        }
    }
}
