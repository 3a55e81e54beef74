//! The vendor's library on the same buffers (`--compare nccl`): NCCL on CUDA, RCCL on ROCm,
//! loaded at run time with `libloading` through NCCL's C ABI, which RCCL shares (function
//! names, enum values, the 128-byte unique id). Only the file and the stream type differ:
//! the names come from `oxccl_backend::vendor` (`OXCCL_NCCL_LIB_PATH` overrides them) and
//! the stream is the HAL stream's raw `CUstream` / `hipStream_t`. Checking and timing are
//! the same code as oxccl's ([`crate::measure_side`]).

use std::ffi::{c_char, c_int, c_void, CStr};

use libloading::Library;
use oxccl_collectives::backend::{vendor, AnyDevice, AnyStream};
use oxccl_collectives::hal::{
    AccumType, BackendKind, DataType, Device, DevicePtr, Error, ReduceOp, Result,
};
use oxccl_collectives::Communicator;

use crate::collective::Call;

type Comm = *mut c_void;
type Stream = *mut c_void;
type Window = *mut c_void;
type Rc = c_int;

/// `NCCL_WIN_COLL_SYMMETRIC` of nccl.h (2.27+): the window is registered by every rank at
/// the same offsets, so NCCL may run its symmetric-memory kernels on it.
const WIN_COLL_SYMMETRIC: c_int = 0x01;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId([c_char; 128]);

// ncclDataType_t and ncclRedOp_t values of nccl.h (RCCL's are the same numbers).
const INT8: c_int = 0;
const UINT8: c_int = 1;
const INT32: c_int = 2;
const UINT32: c_int = 3;
const INT64: c_int = 4;
const UINT64: c_int = 5;
const FLOAT16: c_int = 6;
const FLOAT32: c_int = 7;
const FLOAT64: c_int = 8;
const BFLOAT16: c_int = 9;
const FLOAT8_E4M3: c_int = 10;
const FLOAT8_E5M2: c_int = 11;

fn input(c: &Call<'_>) -> *const c_void {
    c.input.0 as usize as *const c_void
}

fn output(c: &Call<'_>) -> *mut c_void {
    c.output.0 as usize as *mut c_void
}

/// The entry points `--compare` calls.
struct Fns {
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> Rc,
    comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> Rc,
    comm_destroy: unsafe extern "C" fn(Comm) -> Rc,
    get_error_string: unsafe extern "C" fn(Rc) -> *const c_char,
    all_reduce:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Rc,
    all_gather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> Rc,
    reduce_scatter:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Rc,
    broadcast:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Rc,
    reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> Rc,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> Rc,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> Rc,
    group_start: unsafe extern "C" fn() -> Rc,
    group_end: unsafe extern "C" fn() -> Rc,
    /// NCCL 2.27+'s symmetric-memory calls; `None` where the library lacks them (older
    /// NCCL, RCCL).
    windows: Option<WindowFns>,
}

/// `ncclMemAlloc`, `ncclMemFree`, `ncclCommWindowRegister`, `ncclCommWindowDeregister`.
#[derive(Clone, Copy)]
struct WindowFns {
    mem_alloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> Rc,
    mem_free: unsafe extern "C" fn(*mut c_void) -> Rc,
    register: unsafe extern "C" fn(Comm, *mut c_void, usize, *mut Window, c_int) -> Rc,
    deregister: unsafe extern "C" fn(Comm, Window) -> Rc,
}

impl WindowFns {
    fn resolve(lib: &Library, path: &str) -> Option<WindowFns> {
        Some(WindowFns {
            mem_alloc: symbol(lib, path, "ncclMemAlloc").ok()?,
            mem_free: symbol(lib, path, "ncclMemFree").ok()?,
            register: symbol(lib, path, "ncclCommWindowRegister").ok()?,
            deregister: symbol(lib, path, "ncclCommWindowDeregister").ok()?,
        })
    }
}

/// Resolves `name` from `lib` as a `T` (a function pointer type of nccl.h's prototype).
fn symbol<T: Copy>(lib: &Library, path: &str, name: &str) -> Result<T> {
    // SAFETY: the caller names T as the symbol's C prototype; the pointer is used only
    // while `lib` stays loaded (both live in `Nccl`).
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| Error::RuntimeMissing(format!("--compare: {path} has no {name} ({e})")))
}

impl Fns {
    fn resolve(lib: &Library, path: &str) -> Result<Fns> {
        Ok(Fns {
            get_unique_id: symbol(lib, path, "ncclGetUniqueId")?,
            comm_init_rank: symbol(lib, path, "ncclCommInitRank")?,
            comm_destroy: symbol(lib, path, "ncclCommDestroy")?,
            get_error_string: symbol(lib, path, "ncclGetErrorString")?,
            all_reduce: symbol(lib, path, "ncclAllReduce")?,
            all_gather: symbol(lib, path, "ncclAllGather")?,
            reduce_scatter: symbol(lib, path, "ncclReduceScatter")?,
            broadcast: symbol(lib, path, "ncclBroadcast")?,
            reduce: symbol(lib, path, "ncclReduce")?,
            send: symbol(lib, path, "ncclSend")?,
            recv: symbol(lib, path, "ncclRecv")?,
            group_start: symbol(lib, path, "ncclGroupStart")?,
            group_end: symbol(lib, path, "ncclGroupEnd")?,
            windows: WindowFns::resolve(lib, path),
        })
    }
}

/// Opens the first of `names` that loads; the error names every one tried.
fn open_first(names: &[String], vendor: &str) -> Result<(Library, String)> {
    let mut failures = Vec::new();
    for name in names {
        // SAFETY: loading NCCL/RCCL runs its initializers, which only set up its own state.
        match unsafe { Library::new(name.as_str()) } {
            Ok(lib) => return Ok((lib, name.clone())),
            Err(e) => failures.push(format!("{name} ({e})")),
        }
    }
    Err(Error::RuntimeMissing(format!(
        "--compare nccl: no {vendor} found: tried {}; set {} or LD_LIBRARY_PATH",
        failures.join(", "),
        vendor::LIBRARY_VAR
    )))
}

/// Makes the device current on the calling thread (the vendor library takes the current
/// device at its init).
fn bind(device: &AnyDevice) -> Result<()> {
    match device {
        #[cfg(feature = "cuda")]
        AnyDevice::Cuda(d) => d.bind_to_thread(),
        #[cfg(feature = "rocm")]
        AnyDevice::Rocm(d) => d.bind(),
        other => Err(Error::Unsupported(format!(
            "--compare nccl needs a GPU backend (CUDA or ROCm), not {}",
            other.backend()
        ))),
    }
}

/// The vendor's communicator over the same ranks, initialised through the oxccl
/// bootstrap.
pub struct Nccl {
    comm: Comm,
    /// This rank and the world size (the all-to-all-v's counts depend on them).
    rank: u32,
    world: u32,
    kind: BackendKind,
    fns: Fns,
    _lib: Library,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl")
            .field("comm", &self.comm)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl Nccl {
    /// Loads the backend's library (NCCL or RCCL) and joins every rank (collective).
    pub fn new(comm: &Communicator) -> Result<Nccl> {
        let kind = Device::backend(comm.device());
        bind(comm.device())?;
        let (lib, path) = open_first(
            &vendor::library_candidates_from_env(kind),
            vendor::name(kind),
        )?;
        let fns = Fns::resolve(&lib, &path)?;
        let mut nccl = Nccl {
            comm: std::ptr::null_mut(),
            rank: comm.rank(),
            world: comm.world_size(),
            kind,
            fns,
            _lib: lib,
        };
        let mine = if comm.rank() == 0 {
            let mut id = UniqueId([0; 128]);
            // SAFETY: `id` is a valid out-pointer of ncclUniqueId's size.
            nccl.check("ncclGetUniqueId", unsafe {
                (nccl.fns.get_unique_id)(&mut id)
            })?;
            id.0.iter().map(|&c| c as u8).collect::<Vec<u8>>()
        } else {
            Vec::new()
        };
        let all = comm.bootstrap().all_gather(&mine)?;
        let root = all
            .first()
            .filter(|b| b.len() == 128)
            .ok_or_else(|| Error::InvalidArgument("rank 0 sent no unique id".into()))?;
        let mut id = UniqueId([0; 128]);
        for (d, s) in id.0.iter_mut().zip(root) {
            *d = *s as c_char;
        }
        let mut c: Comm = std::ptr::null_mut();
        // SAFETY: `c` receives the communicator; the id came from rank 0's ncclGetUniqueId.
        let rc = unsafe {
            (nccl.fns.comm_init_rank)(&mut c, comm.world_size() as c_int, id, comm.rank() as c_int)
        };
        nccl.check("ncclCommInitRank", rc)?;
        nccl.comm = c;
        Ok(nccl)
    }

    fn check(&self, call: &'static str, rc: Rc) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString takes any code and returns a static string (or NULL).
        let p = unsafe { (self.fns.get_error_string)(rc) };
        let message = if p.is_null() {
            format!("{} call failed", vendor::name(self.kind))
        } else {
            // SAFETY: non-null, NUL-terminated, static in the library.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Err(Error::Backend {
            backend: self.kind,
            call,
            code: i64::from(rc),
            name: format!("ncclResult {rc}"),
            message,
        })
    }

    fn stream(&self, stream: &AnyStream) -> Result<Stream> {
        match stream {
            // The runtime's cudaStream_t and the driver's CUstream are the same handle.
            #[cfg(feature = "cuda")]
            AnyStream::Cuda(s) => Ok(s.raw().cast()),
            #[cfg(feature = "rocm")]
            AnyStream::Rocm(s) => Ok(s.as_raw().cast()),
            _ => Err(Error::Unsupported(
                "--compare nccl needs a CUDA or ROCm stream".into(),
            )),
        }
    }

    /// The library's type for `dtype` when it reduces it: NCCL's OCP fp8 on CUDA; on ROCm
    /// no fp8 (RCCL reduces its fp8 types in the GPU's encoding, FNUZ on MI300X, which is
    /// neither of the types oxccl-perf names `fp8e4m3`/`fp8e5m2`).
    fn dtype_on(kind: BackendKind, dtype: DataType) -> Option<c_int> {
        match dtype {
            DataType::F32 => Some(FLOAT32),
            DataType::F16 => Some(FLOAT16),
            DataType::Bf16 => Some(BFLOAT16),
            DataType::Fp8E4m3 if kind != BackendKind::Rocm => Some(FLOAT8_E4M3),
            DataType::Fp8E5m2 if kind != BackendKind::Rocm => Some(FLOAT8_E5M2),
            DataType::I8 => Some(INT8),
            DataType::U8 => Some(UINT8),
            DataType::I32 => Some(INT32),
            DataType::U32 => Some(UINT32),
            DataType::I64 => Some(INT64),
            DataType::U64 => Some(UINT64),
            DataType::F64 => Some(FLOAT64),
            _ => None,
        }
    }

    fn dtype(&self, dtype: DataType) -> Result<c_int> {
        Nccl::dtype_on(self.kind, dtype).ok_or_else(|| {
            Error::Unsupported(format!(
                "{} does not reduce {dtype}",
                vendor::name(self.kind)
            ))
        })
    }

    /// Whether the library reduces the type (it has no accumulation choice: only `Auto`
    /// compares).
    pub fn supports_reduction(&self, dtype: DataType, accum: AccumType) -> bool {
        Nccl::dtype_on(self.kind, dtype).is_some() && accum == AccumType::Auto
    }

    /// The type the library moves `dtype`'s elements as: its own where it has one, else an
    /// unsigned integer of the same size (collectives that only move data deliver every
    /// bit pattern unchanged; there is no 16-bit integer type, and every 2-byte type here
    /// has a library type).
    fn moved_as(kind: BackendKind, dtype: DataType) -> Option<c_int> {
        Nccl::dtype_on(kind, dtype).or(match dtype.size() {
            1 => Some(UINT8),
            4 => Some(UINT32),
            8 => Some(UINT64),
            _ => None,
        })
    }

    fn moved(&self, dtype: DataType) -> Result<c_int> {
        Nccl::moved_as(self.kind, dtype).ok_or_else(|| {
            Error::Unsupported(format!("{} cannot move {dtype}", vendor::name(self.kind)))
        })
    }

    /// Whether the library can move the type (any accumulation: nothing is reduced).
    pub fn supports_move(&self, dtype: DataType, _accum: AccumType) -> bool {
        Nccl::moved_as(self.kind, dtype).is_some()
    }

    /// The library's reduction operator for `op`.
    fn op(op: ReduceOp) -> c_int {
        match op {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Avg => 4,
        }
    }

    /// Queues ncclAllGather on the call's stream (`count` elements per rank).
    pub fn all_gather(&self, c: &Call<'_>) -> Result<()> {
        let (t, s) = (self.moved(c.dtype)?, self.stream(c.stream)?);
        // SAFETY: the caller's input holds `count` elements and its output `world *
        // count` on this communicator's device, both outliving the stream's work; the
        // stream is a live stream of that device.
        let rc = unsafe { (self.fns.all_gather)(input(c), output(c), c.count, t, self.comm, s) };
        self.check("ncclAllGather", rc)
    }

    /// Queues ncclReduceScatter on the call's stream (`count` output elements per rank).
    pub fn reduce_scatter(&self, c: &Call<'_>) -> Result<()> {
        let (t, s) = (self.dtype(c.dtype)?, self.stream(c.stream)?);
        // SAFETY: the caller's input holds `world * count` elements and its output `count`
        // on this communicator's device, both outliving the stream's work; the stream is a
        // live stream of that device.
        let rc = unsafe {
            (self.fns.reduce_scatter)(
                input(c),
                output(c),
                c.count,
                t,
                Nccl::op(c.op),
                self.comm,
                s,
            )
        };
        self.check("ncclReduceScatter", rc)
    }

    fn root(c: &Call<'_>) -> Result<c_int> {
        c_int::try_from(c.root).map_err(|_| Error::InvalidArgument(format!("root {}", c.root)))
    }

    /// Queues ncclBroadcast from the call's root on its stream.
    pub fn broadcast(&self, c: &Call<'_>) -> Result<()> {
        let (t, s, root) = (self.moved(c.dtype)?, self.stream(c.stream)?, Nccl::root(c)?);
        // SAFETY: the caller's buffers hold `count` elements on this communicator's device
        // and outlive the stream's work; the stream is a live stream of that device.
        let rc =
            unsafe { (self.fns.broadcast)(input(c), output(c), c.count, t, root, self.comm, s) };
        self.check("ncclBroadcast", rc)
    }

    /// Queues ncclReduce to the call's root on its stream (`count` elements; the output is
    /// written on the root only).
    pub fn reduce(&self, c: &Call<'_>) -> Result<()> {
        let (t, s, root) = (self.dtype(c.dtype)?, self.stream(c.stream)?, Nccl::root(c)?);
        // SAFETY: the caller's buffers hold `count` elements on this communicator's device
        // and outlive the stream's work; the stream is a live stream of that device.
        let rc = unsafe {
            (self.fns.reduce)(
                input(c),
                output(c),
                c.count,
                t,
                Nccl::op(c.op),
                root,
                self.comm,
                s,
            )
        };
        self.check("ncclReduce", rc)
    }

    /// Queues an all-to-all as nccl-tests runs it: one group of a send of chunk p to every
    /// rank p and a receive of slot p from it (RCCL names its own all-to-all differently,
    /// so neither library's is used).
    pub fn all_to_all(&self, c: &Call<'_>) -> Result<()> {
        self.exchange(c, |_| c.count, |_| c.count)
    }

    /// Queues the `alltoallv` row's exchange as PyTorch's `all_to_all_single` with uneven
    /// splits does: one group of a send of [`crate::collective::v_count`] elements of
    /// chunk p to every rank p and a receive of that rank's count into slot p.
    pub fn all_to_all_v(&self, c: &Call<'_>) -> Result<()> {
        let v = crate::collective::v_count;
        self.exchange(
            c,
            |p| v(c.count, self.rank, p),
            |q| v(c.count, q, self.rank),
        )
    }

    /// One group of a send of `sends(p)` elements from chunk p of the input and a receive
    /// of `recvs(p)` elements into slot p of the output, for every rank p (chunks and slots
    /// of `count` elements).
    fn exchange(
        &self,
        c: &Call<'_>,
        sends: impl Fn(u32) -> usize,
        recvs: impl Fn(u32) -> usize,
    ) -> Result<()> {
        let (t, s) = (self.moved(c.dtype)?, self.stream(c.stream)?);
        let chunk = c.dtype.bytes(c.count)? as u64;
        // SAFETY: no arguments.
        self.check("ncclGroupStart", unsafe { (self.fns.group_start)() })?;
        let mut queued = Ok(());
        for p in 0..self.world {
            let at = chunk * u64::from(p);
            let peer = p as c_int;
            // SAFETY: both buffers hold `world * count` elements on this communicator's
            // device and outlive the stream's work; chunk p lies inside them, and neither
            // count exceeds `count`.
            let r = unsafe {
                let send = (c.input.0 + at) as usize as *const c_void;
                let recv = (c.output.0 + at) as usize as *mut c_void;
                self.check(
                    "ncclSend",
                    (self.fns.send)(send, sends(p).min(c.count), t, peer, self.comm, s),
                )
                .and_then(|()| {
                    self.check(
                        "ncclRecv",
                        (self.fns.recv)(recv, recvs(p).min(c.count), t, peer, self.comm, s),
                    )
                })
            };
            if r.is_err() {
                queued = r;
                break;
            }
        }
        // The group is always closed, also after a failed call inside it.
        // SAFETY: no arguments; closes the group opened above.
        let ended = self.check("ncclGroupEnd", unsafe { (self.fns.group_end)() });
        queued.and(ended)
    }

    /// Queues ncclAllReduce on the call's stream.
    pub fn all_reduce(&self, c: &Call<'_>) -> Result<()> {
        let (t, s) = (self.dtype(c.dtype)?, self.stream(c.stream)?);
        // SAFETY: the caller's buffers hold `count` elements on this communicator's device
        // and outlive the stream's work; the stream is a live stream of that device.
        let rc = unsafe {
            (self.fns.all_reduce)(
                input(c),
                output(c),
                c.count,
                t,
                Nccl::op(c.op),
                self.comm,
                s,
            )
        };
        self.check("ncclAllReduce", rc)
    }
}

/// Send and receive buffers from `ncclMemAlloc`, each registered by every rank as a
/// symmetric window (`ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC)`): what NCCL
/// 2.27+ needs to run its symmetric-memory kernels. Deregistered and freed on drop, before
/// the communicator (it borrows it).
pub struct SymmetricBuffers<'a> {
    nccl: &'a Nccl,
    fns: WindowFns,
    /// (pointer, window) per buffer; the window is null until registered.
    buffers: Vec<(*mut c_void, Window)>,
}

impl std::fmt::Debug for SymmetricBuffers<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricBuffers")
            .field("buffers", &self.buffers)
            .finish_non_exhaustive()
    }
}

impl SymmetricBuffers<'_> {
    /// The send buffer's address.
    pub fn send(&self) -> DevicePtr {
        DevicePtr(self.buffers.first().map_or(0, |b| b.0 as u64))
    }

    /// The receive buffer's address.
    pub fn recv(&self) -> DevicePtr {
        DevicePtr(self.buffers.get(1).map_or(0, |b| b.0 as u64))
    }
}

impl Drop for SymmetricBuffers<'_> {
    fn drop(&mut self) {
        for &(ptr, win) in self.buffers.iter().rev() {
            if !win.is_null() {
                // SAFETY: the window was registered on this communicator by every rank,
                // which all drop it here in the same order; its work was synchronized.
                let rc = unsafe { (self.fns.deregister)(self.nccl.comm, win) };
                if let Err(e) = self.nccl.check("ncclCommWindowDeregister", rc) {
                    eprintln!("oxccl-perf: {e}");
                }
            }
            // SAFETY: `ptr` came from ncclMemAlloc and nothing uses it any more.
            let rc = unsafe { (self.fns.mem_free)(ptr) };
            if let Err(e) = self.nccl.check("ncclMemFree", rc) {
                eprintln!("oxccl-perf: {e}");
            }
        }
    }
}

impl Nccl {
    /// A send buffer of `send_bytes` and a receive buffer of `recv_bytes` in symmetric
    /// windows (collective: every rank calls it with the same sizes). `None` where the
    /// library has no windows.
    pub fn symmetric_buffers(
        &self,
        send_bytes: usize,
        recv_bytes: usize,
    ) -> Result<Option<SymmetricBuffers<'_>>> {
        let Some(fns) = self.fns.windows else {
            return Ok(None);
        };
        let mut bufs = SymmetricBuffers {
            nccl: self,
            fns,
            buffers: Vec::with_capacity(2),
        };
        for bytes in [send_bytes, recv_bytes] {
            let mut ptr: *mut c_void = std::ptr::null_mut();
            // SAFETY: a valid out-pointer; the current device is the communicator's.
            self.check("ncclMemAlloc", unsafe { (fns.mem_alloc)(&mut ptr, bytes) })?;
            bufs.buffers.push((ptr, std::ptr::null_mut()));
            let mut win: Window = std::ptr::null_mut();
            // SAFETY: `ptr` holds `bytes` from ncclMemAlloc; every rank registers the same
            // sizes in the same order (a collective call); `win` is a valid out-pointer.
            let rc = unsafe { (fns.register)(self.comm, ptr, bytes, &mut win, WIN_COLL_SYMMETRIC) };
            self.check("ncclCommWindowRegister", rc)?;
            if let Some(last) = bufs.buffers.last_mut() {
                last.1 = win;
            }
        }
        Ok(Some(bufs))
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        if self.comm.is_null() {
            return;
        }
        // SAFETY: the communicator is ours; its work was synchronized by the caller.
        let rc = unsafe { (self.fns.comm_destroy)(self.comm) };
        if let Err(e) = self.check("ncclCommDestroy", rc) {
            eprintln!("oxccl-perf: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_nccl_h_numbers_and_fp8_is_not_compared_on_rocm() {
        assert_eq!(Nccl::dtype_on(BackendKind::Cuda, DataType::Bf16), Some(9));
        assert_eq!(Nccl::dtype_on(BackendKind::Rocm, DataType::Bf16), Some(9));
        assert_eq!(Nccl::dtype_on(BackendKind::Cuda, DataType::F32), Some(7));
        assert_eq!(
            Nccl::dtype_on(BackendKind::Cuda, DataType::Fp8E4m3),
            Some(10)
        );
        assert_eq!(
            Nccl::dtype_on(BackendKind::Cuda, DataType::Fp8E5m2),
            Some(11)
        );
        for t in [DataType::Fp8E4m3, DataType::Fp8E5m2, DataType::Fp8E4m3Fnuz] {
            assert_eq!(Nccl::dtype_on(BackendKind::Rocm, t), None, "{t}");
        }
        assert_eq!(
            Nccl::dtype_on(BackendKind::Cuda, DataType::Fp8E4m3b15),
            None
        );
        assert_eq!(Nccl::op(ReduceOp::Max), 2);
        assert_eq!(Nccl::op(ReduceOp::Avg), 4);
    }

    #[test]
    fn every_type_moves_as_one_of_its_size() {
        let size_of = |t: c_int| match t {
            INT8 | UINT8 | FLOAT8_E4M3 | FLOAT8_E5M2 => 1,
            FLOAT16 | BFLOAT16 => 2,
            INT32 | UINT32 | FLOAT32 => 4,
            INT64 | UINT64 | FLOAT64 => 8,
            other => panic!("{other}"),
        };
        for kind in [BackendKind::Cuda, BackendKind::Rocm] {
            for t in [
                DataType::F32,
                DataType::Bf16,
                DataType::F16,
                DataType::Fp8E4m3,
                DataType::Fp8E4m3b15,
                DataType::Fp8E5m2Fnuz,
                DataType::U64,
            ] {
                let moved = Nccl::moved_as(kind, t).unwrap();
                assert_eq!(size_of(moved), t.size(), "{kind} {t}");
            }
        }
        // On ROCm fp8 moves as bytes, never as RCCL's fp8 type.
        assert_eq!(
            Nccl::moved_as(BackendKind::Rocm, DataType::Fp8E4m3),
            Some(UINT8)
        );
    }

    #[test]
    fn a_missing_library_is_a_clear_error_naming_every_file() {
        let names = [
            "/nonexistent/librccl.so.1".to_string(),
            "/nonexistent/x.so".into(),
        ];
        let err = open_first(&names, "RCCL").unwrap_err().to_string();
        assert!(err.contains("no RCCL found"), "{err}");
        assert!(
            err.contains("/nonexistent/librccl.so.1") && err.contains("/nonexistent/x.so"),
            "{err}"
        );
        assert!(err.contains(vendor::LIBRARY_VAR), "{err}");
    }
}
