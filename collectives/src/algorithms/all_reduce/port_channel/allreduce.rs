//! The PortChannel allreduce's state in a communicator: usable across nodes, because every
//! byte that leaves a rank is moved by its proxy thread (IPC copies within a node, TCP or
//! InfiniBand across nodes).
//!
//! Its setup (collective, at communicator creation) picks a transport per peer (IPC when
//! both ranks are on one node, else InfiniBand where both ends have it, else TCP;
//! `OXCCL_PORT_TRANSPORT` or [`PortAllreduceConfig::transport`] forces one), allocates one
//! scratch region registered for those transports, connects one PortChannel per peer
//! through one proxy, starts the proxy and keeps the channels' device handles in device
//! memory. A launch is one kernel launch (`allreduce_port`), no host synchronization.
//!
//! Protocol (device: `kernels/src/device/allreduce_port.cu`; host backend: [`TABLE`], the
//! same steps on one host thread). Scratch layout in `abi_allreduce.h`:
//! sync area, `send[2]` (one chunk each), `recv[2][world]` (one chunk per rank). In rounds
//! of `chunk_bytes`, global round `g` (kept in the sync area, advanced by the kernel):
//! 1. copy my input chunk into `send[g & 1]`;
//! 2. for each peer p: `put_with_signal(send[g & 1] -> p.recv[g & 1][me])`, then wait for
//!    p's signal (p's chunk is in my `recv[g & 1][p]`, landed before the signal);
//! 3. reduce every rank's chunk in rank order (mine from the input) into the output.
//!
//! Flow control without extra signals: to finish round g a rank needs every peer's data of
//! round g, which a peer sends only after it finished reducing round g - 1. So when a rank
//! writes round g + 1 into `p.recv[(g + 1) & 1]`, p is done reading that slot (round g - 1),
//! and p has received (so the transport has read) my round g - 1 data from `send[(g+1) & 1]`.
//! Every wait is bounded (the call's timeout and the semaphores' spin limit); a timeout is
//! recorded in the sync area's error word ([`PortAllreduce::check_error`]) and, on the host
//! backend, returned by the stream.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_backend::{AnyKernel, AnyMemory, AnyStream};
use oxccl_channels::bootstrap::Bootstrap;
use oxccl_channels::connection::{choose_transport, ib, Connection, Transport, TransportSet};
use oxccl_channels::port_channel::{self as port, PortChannel};
use oxccl_channels::proxy::{Proxy, ProxyBuilder};
use oxccl_channels::registered_memory::{HostIdentity, RegisteredMemory};
use oxccl_hal::{
    AccumType, DataType, Device, Error, LaunchConfig, Memory, MemoryKind, ReduceOp, Result, Stream,
};
use oxccl_kernels::abi::{
    self, KernelArgs, OxcclPortAllreduceArgs, OxcclPortChannel, OXCCL_ALLREDUCE_ERR_ARGS,
    OXCCL_ALLREDUCE_ERR_TIMEOUT, OXCCL_ALLREDUCE_MAX_RANKS, OXCCL_PORT_ALLREDUCE_SYNC_BYTES,
    OXCCL_PORT_ALLREDUCE_SYNC_ERROR, OXCCL_PORT_ALLREDUCE_SYNC_ROUND,
};

use super::KERNEL as PORT_ALLREDUCE;
use crate::algorithms::{Algorithm, Call as LaunchCall, Instance, Plan, SetupContext};
use crate::host_kernels::{read_unit, reduce_unit, write_unit};
/// Environment variable forcing the transport of every peer: `ipc`, `tcp`, `ib` (or
/// `auto`, the default: IPC on one node, else InfiniBand where both ends have it, else TCP).
pub const TRANSPORT_VAR: &str = "OXCCL_PORT_TRANSPORT";
/// Environment variable: bytes of one round (one slot of the scratch), in KiB.
pub const CHUNK_VAR: &str = "OXCCL_PORT_CHUNK_KB";
/// Default bytes of one round.
pub const DEFAULT_CHUNK: usize = 4 << 20;
/// First bootstrap user tag of the setup (connections and channels, per peer pair).
const TAG_BASE: u32 = 0x5041_5200;

/// Settings of the PortChannel allreduce (part of [`crate::CommConfig`]; the bound of its
/// waits is the communicator's timeout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAllreduceConfig {
    /// Bytes of one round (rounded up to 16); messages above it take several rounds.
    pub chunk_bytes: usize,
    /// Transport for every peer; `None`: chosen per peer from the nodes and IB presence.
    pub transport: Option<Transport>,
    /// Slots of the proxy FIFO (power of two); `None`: the channels crate's default.
    pub fifo_size: Option<u32>,
}

impl Default for PortAllreduceConfig {
    fn default() -> Self {
        PortAllreduceConfig {
            chunk_bytes: DEFAULT_CHUNK,
            transport: None,
            fifo_size: None,
        }
    }
}

/// Parses a transport name (`ipc`, `tcp`, `ib`; `auto` or empty is `None`).
pub fn parse_transport(s: &str) -> Result<Option<Transport>> {
    match s.trim().to_ascii_lowercase().as_str() {
        "" | "auto" => Ok(None),
        "ipc" => Ok(Some(Transport::Ipc)),
        "tcp" => Ok(Some(Transport::Tcp)),
        "ib" | "infiniband" | "rdma" => Ok(Some(Transport::Ib)),
        other => Err(Error::InvalidArgument(format!(
            "{TRANSPORT_VAR}='{other}': want ipc, tcp, ib or auto"
        ))),
    }
}

impl PortAllreduceConfig {
    /// From the environment: `OXCCL_PORT_TRANSPORT`, `OXCCL_PORT_CHUNK_KB`.
    pub fn from_env() -> Result<Self> {
        let mut c = PortAllreduceConfig::default();
        if let Ok(t) = std::env::var(TRANSPORT_VAR) {
            c.transport = parse_transport(&t)?;
        }
        let number = |var: &str| -> Result<Option<u64>> {
            match std::env::var(var) {
                Ok(v) if !v.trim().is_empty() => v.trim().parse::<u64>().map(Some).map_err(|_| {
                    Error::InvalidArgument(format!("{var}='{v}' is not a non-negative integer"))
                }),
                _ => Ok(None),
            }
        };
        if let Some(kb) = number(CHUNK_VAR)? {
            if kb == 0 || kb > (1 << 20) {
                return Err(Error::InvalidArgument(format!(
                    "{CHUNK_VAR}={kb} is not in 1..=1048576"
                )));
            }
            c.chunk_bytes = (kb as usize) << 10;
        }
        Ok(c)
    }
}

/// Byte offsets of the scratch (the same on every rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    chunk: usize,
    send: usize,
    recv: usize,
    total: usize,
}

impl Layout {
    fn new(world: u32, chunk: usize) -> Result<Layout> {
        let chunk = chunk.max(16).next_multiple_of(16);
        let send = OXCCL_PORT_ALLREDUCE_SYNC_BYTES as usize;
        let overflow = || Error::InvalidArgument(format!("port allreduce: chunk {chunk} too big"));
        let recv = chunk
            .checked_mul(2)
            .and_then(|s| s.checked_add(send))
            .ok_or_else(overflow)?;
        let total = chunk
            .checked_mul(2 * world.max(1) as usize)
            .and_then(|r| r.checked_add(recv))
            .ok_or_else(overflow)?;
        // Trigger offsets are 32 bits.
        if total > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "port allreduce: {total} bytes of scratch ({world} ranks x chunk {chunk}); a \
                 PortChannel reaches 4 GiB: lower {CHUNK_VAR}"
            )));
        }
        Ok(Layout {
            chunk,
            send,
            recv,
            total,
        })
    }
}

/// The transport to each peer (None for this rank), the same on both ends of every pair.
fn transports(bootstrap: &Bootstrap, forced: Option<Transport>) -> Result<Vec<Option<Transport>>> {
    let me = HostIdentity::local();
    let ib_here = ib::available();
    let mut mine = Vec::new();
    for s in [&me.hostname, &me.boot_id] {
        mine.extend_from_slice(&(s.len() as u32).to_le_bytes());
        mine.extend_from_slice(s.as_bytes());
    }
    mine.push(u8::from(ib_here));
    let all = bootstrap.all_gather(&mine)?;
    let rank = bootstrap.rank() as usize;
    let mut out = Vec::with_capacity(all.len());
    for (r, bytes) in all.iter().enumerate() {
        if r == rank {
            out.push(None);
            continue;
        }
        let bad = || Error::InvalidArgument(format!("rank {r} sent a malformed host identity"));
        let mut at = 0usize;
        let mut field = || -> Result<String> {
            let n = bytes
                .get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
                .ok_or_else(bad)? as usize;
            let s = bytes.get(at + 4..at + 4 + n).ok_or_else(bad)?;
            at += 4 + n;
            String::from_utf8(s.to_vec()).map_err(|_| bad())
        };
        let peer = HostIdentity {
            hostname: field()?,
            boot_id: field()?,
        };
        let ib_there = bytes.get(at).copied().ok_or_else(bad)? != 0;
        out.push(Some(forced.unwrap_or_else(|| {
            choose_transport(me, &peer, ib_here && ib_there)
        })));
    }
    Ok(out)
}

/// The PortChannel allreduce's state in one communicator (made by its setup when the
/// algorithm is forced; see the module docs). Reached through
/// [`crate::Communicator::instance`] for what it reports about itself.
#[derive(Debug)]
pub struct PortAllreduce {
    rank: u32,
    world: u32,
    layout: Layout,
    timeout: Duration,
    transports: Vec<Option<Transport>>,
    kernel: AnyKernel,
    // Drop order: the proxy first (stops its thread, then releases channels, semaphores
    // and connections), then the handles, the registration and the scratch.
    proxy: Option<Proxy>,
    handles: Option<AnyMemory>,
    registration: RegisteredMemory,
    scratch: Arc<AnyMemory>,
}

impl PortAllreduce {
    /// Sets the algorithm up (collective: every rank calls it with the same
    /// configuration). World sizes 1..=8.
    pub(crate) fn new(ctx: &SetupContext<'_>, me: Algorithm) -> Result<PortAllreduce> {
        let (bootstrap, device, config) = (ctx.bootstrap, ctx.device, ctx.port);
        let rank = bootstrap.rank();
        let world = bootstrap.world_size();
        let at = |e: Error| e.at_rank(rank);
        let _span = tracing::info_span!("port_allreduce", rank, world).entered();
        if world == 0 || world > OXCCL_ALLREDUCE_MAX_RANKS {
            return Err(at(Error::Unsupported(format!(
                "port allreduce: world size {world}, it serves 1..={OXCCL_ALLREDUCE_MAX_RANKS}"
            ))));
        }
        let kernel = ctx.kernel(me).map_err(at)?;
        let layout = Layout::new(world, config.chunk_bytes).map_err(at)?;
        let transports = transports(bootstrap, config.transport).map_err(at)?;
        let set = transports
            .iter()
            .flatten()
            .fold(TransportSet::EMPTY, |s, t| s.with(*t));
        // World size 1 has no peer; registration needs one transport all the same.
        let set = if set.is_empty() {
            TransportSet::of(&[Transport::Tcp])
        } else {
            set
        };
        let scratch = Arc::new(
            device
                .alloc(layout.total, MemoryKind::Coherent)
                .map_err(at)?,
        );
        // The sync area must start at zero; slots need no initial value.
        if !ctx.host() {
            let stream = device.create_stream().map_err(at)?;
            // SAFETY: inside the allocation just made, which outlives the fill (synchronized
            // right below).
            unsafe { stream.fill(scratch.ptr(), 0, layout.send) }.map_err(at)?;
            stream.synchronize().map_err(at)?;
        }
        let registration =
            RegisteredMemory::new(device, rank, Arc::clone(&scratch), set).map_err(at)?;
        let mut proxy = None;
        let mut handles = None;
        if world > 1 {
            let mut builder = ProxyBuilder::new(device, config.fifo_size).map_err(at)?;
            let mut chans = vec![OxcclPortChannel::default(); world as usize];
            // Ascending peer order: every rank meets its pairs in the same global order.
            for (peer, t) in transports.iter().enumerate() {
                let Some(t) = *t else { continue };
                let conn =
                    Connection::connect(bootstrap, device, peer as u32, t, TAG_BASE).map_err(at)?;
                chans[peer] = PortChannel::connect(
                    bootstrap,
                    device,
                    &mut builder,
                    Arc::new(conn),
                    &registration,
                    TAG_BASE + 2,
                )
                .map_err(at)?;
            }
            let p = builder.start().map_err(at)?;
            let bytes = channel_bytes(&chans);
            let mem = device.alloc(bytes.len(), MemoryKind::Plain).map_err(at)?;
            let stream = device.create_stream().map_err(at)?;
            stream.write(mem.ptr(), &bytes).map_err(at)?;
            stream.synchronize().map_err(at)?;
            proxy = Some(p);
            handles = Some(mem);
        }
        // No rank's kernel signals before every peer's proxy runs.
        bootstrap.barrier().map_err(at)?;
        tracing::info!(
            rank,
            world,
            ?transports,
            chunk = layout.chunk,
            "port allreduce ready"
        );
        Ok(PortAllreduce {
            rank,
            world,
            layout,
            timeout: ctx.timeout,
            transports,
            kernel,
            proxy,
            handles,
            registration,
            scratch,
        })
    }

    /// The transport to each rank (`None` at this rank's index).
    pub fn transports(&self) -> &[Option<Transport>] {
        &self.transports
    }

    /// Bytes of one round.
    pub fn chunk_bytes(&self) -> usize {
        self.layout.chunk
    }

    /// Bytes of this rank's scratch allocation.
    pub fn scratch_bytes(&self) -> usize {
        self.registration.len()
    }
}

impl Instance for PortAllreduce {
    unsafe fn launch(&self, call: &LaunchCall, plan: &Plan, stream: &AnyStream) -> Result<()> {
        let channels = self.handles.as_ref().map_or(std::ptr::null(), |m| {
            abi::ptr::<OxcclPortChannel>(m.ptr()).cast_const()
        });
        let args = OxcclPortAllreduceArgs {
            input: abi::ptr::<std::ffi::c_void>(call.input).cast_const(),
            output: abi::ptr(call.output),
            scratch: abi::ptr(self.scratch.ptr()),
            channels,
            count: call.count as u64,
            chunk_bytes: self.layout.chunk as u64,
            send_offset: self.layout.send as u64,
            recv_offset: self.layout.recv as u64,
            timeout_ns: u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX),
            rank: self.rank,
            world_size: self.world,
            dtype: call.dtype.code(),
            op: call.op.code(),
            accum: call.accum.code(),
            _pad0: 0,
        };
        // SAFETY: the block matches the kernel (abi_allreduce.h); scratch and channel
        // handles are this object's live allocations (the proxy and its FIFO and
        // semaphores live as long as `self`); input, output and plan are the caller's
        // obligation (the trait method's contract).
        unsafe { stream.launch(&self.kernel, &plan.config, args.as_bytes()) }
    }

    /// The error word the kernel leaves in its own scratch (a wait that timed out, a bad
    /// argument block), then the proxy's first failure.
    fn check_error(&self, stream: &AnyStream) -> Result<()> {
        let word = self
            .scratch
            .ptr()
            .offset(OXCCL_PORT_ALLREDUCE_SYNC_ERROR as usize)?;
        let proxy = self.proxy.as_ref().and_then(Proxy::error);
        let what = match &proxy {
            Some(p) => format!("the port_channel allreduce (proxy: {p})"),
            None => "the port_channel allreduce".into(),
        };
        crate::device_error::read(stream, word, &what, self.timeout)?;
        proxy.map_or(Ok(()), Err)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn channel_bytes(chans: &[OxcclPortChannel]) -> Vec<u8> {
    chans
        .iter()
        .flat_map(|c| c.as_bytes().iter().copied())
        .collect()
}

// ---- host kernel ---------------------------------------------------------------------------

/// A checked view of the argument block, for the host kernel.
struct Call {
    a: OxcclPortAllreduceArgs,
    dtype: DataType,
    op: ReduceOp,
    accum: AccumType,
    total: usize,
    world: usize,
    me: usize,
    deadline: Option<Instant>,
}

impl Call {
    fn new(bytes: &[u8]) -> Result<Call> {
        let a: OxcclPortAllreduceArgs = abi::parse_args(bytes, PORT_ALLREDUCE)?;
        let world = a.world_size as usize;
        let me = a.rank as usize;
        let bad = |what: &str| Error::InvalidArgument(format!("{PORT_ALLREDUCE}: {what}"));
        if a.scratch.is_null() {
            return Err(bad("null scratch"));
        }
        let call = |r: Result<Call>| {
            if r.is_err() {
                // SAFETY: scratch non-null: the caller's live scratch (launch contract).
                unsafe { report(a.scratch.cast(), OXCCL_ALLREDUCE_ERR_ARGS, a.rank) };
            }
            r
        };
        call((|| {
            if world == 0 || world > OXCCL_ALLREDUCE_MAX_RANKS as usize || me >= world {
                return Err(bad(&format!("rank {me} of world {world}")));
            }
            if a.chunk_bytes == 0 || a.chunk_bytes % 16 != 0 {
                return Err(bad("chunk not a positive multiple of 16"));
            }
            if world > 1 && a.channels.is_null() {
                return Err(bad("null channels"));
            }
            let dtype = DataType::from_code(a.dtype)?;
            let op = ReduceOp::from_code(a.op)?;
            let accum = AccumType::from_code(a.accum)?;
            let count = usize::try_from(a.count).map_err(|_| bad("count"))?;
            let total = dtype.bytes(count)?;
            if total > 0 && (a.input.is_null() || a.output.is_null()) {
                return Err(bad("null input or output"));
            }
            let deadline = (a.timeout_ns != 0)
                .then(|| Instant::now().checked_add(Duration::from_nanos(a.timeout_ns)))
                .flatten();
            Ok(Call {
                a,
                dtype,
                op,
                accum,
                total,
                world,
                me,
                deadline,
            })
        })())
    }

    fn scratch(&self) -> *mut u8 {
        self.a.scratch.cast()
    }

    fn round_word(&self) -> &AtomicU64 {
        // SAFETY: launch contract: the scratch is live and its sync area's words are 8-byte
        // aligned; only this rank's kernels (one at a time, stream order) and check_error
        // touch them, atomically here.
        unsafe {
            AtomicU64::from_ptr(
                self.scratch()
                    .add(OXCCL_PORT_ALLREDUCE_SYNC_ROUND as usize)
                    .cast(),
            )
        }
    }

    fn channel(&self, p: usize) -> OxcclPortChannel {
        // SAFETY: launch contract: `channels` holds world_size handles (p < world) in
        // host-backend memory, written at setup and never changed.
        unsafe { std::ptr::read(self.a.channels.add(p)) }
    }

    fn fail(&self, peer: usize, what: &str) -> Error {
        // SAFETY: the live scratch (launch contract).
        unsafe { report(self.scratch(), OXCCL_ALLREDUCE_ERR_TIMEOUT, peer as u32) };
        Error::Timeout {
            what: format!(
                "{PORT_ALLREDUCE}: rank {} waiting for rank {peer} ({what}); the peer is dead, \
                 slow, or made a different call",
                self.me
            ),
            waited: Duration::from_nanos(self.a.timeout_ns),
        }
    }

    /// Waits for the next signal of `h`'s semaphore, bounded by the deadline and the
    /// semaphore's spin limit (the device's `wait_signal`).
    fn wait_signal(&self, h: &OxcclPortChannel, peer: usize) -> Result<()> {
        let s = &h.semaphore;
        // SAFETY: launch contract: the handle's counters are live host-backend memory,
        // accessed atomically by the peer's proxy and by this waiter alone.
        let (inbound, expected) = unsafe {
            (
                AtomicU64::from_ptr(s.inbound),
                AtomicU64::from_ptr(s.expected_inbound),
            )
        };
        let want = expected.load(Ordering::Relaxed) + 1;
        let mut polls = 0u64;
        while inbound.load(Ordering::Acquire) < want {
            polls += 1;
            if (s.max_spins != 0 && polls >= s.max_spins)
                || (polls % 64 == 0 && self.deadline.is_some_and(|d| Instant::now() >= d))
            {
                return Err(self.fail(peer, "its data signal"));
            }
            if polls < 256 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        expected.store(want, Ordering::Relaxed);
        Ok(())
    }

    /// Bytes [off, off + 16) of the input; bytes past the end are zero.
    fn load_input(&self, off: usize) -> [u8; 16] {
        // SAFETY: launch contract: the input holds `total` bytes.
        unsafe { read_unit(self.a.input, self.total, off) }
    }

    fn store_output(&self, off: usize, v: &[u8; 16]) {
        // SAFETY: launch contract: the output holds `total` bytes, written only here.
        unsafe { write_unit(self.a.output, self.total, off, v) }
    }

    /// Reduces one 16-byte unit of every rank in rank order with the reference reduction.
    fn reduce_unit(&self, inputs: &[[u8; 16]], valid: usize) -> Result<[u8; 16]> {
        reduce_unit(self.dtype, self.op, self.accum, inputs, valid)
    }
}

/// Records the first failure (code | peer << 32) in the scratch's error word.
///
/// # Safety
/// `scratch` must be a live port-allreduce scratch.
unsafe fn report(scratch: *mut u8, code: u32, peer: u32) {
    // SAFETY: the caller's obligation; the word is 8-byte aligned.
    let w = unsafe {
        AtomicU64::from_ptr(scratch.add(OXCCL_PORT_ALLREDUCE_SYNC_ERROR as usize).cast())
    };
    let _ = w.compare_exchange(
        0,
        u64::from(code) | (u64::from(peer) << 32),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
}

/// `allreduce_port` on the host backend: the device kernel's steps on one thread.
pub(crate) fn host_kernel(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes)?;
    let chunk = c.a.chunk_bytes as usize;
    let (send_off, recv_off) = (c.a.send_offset as usize, c.a.recv_offset as usize);
    let round0 = c.round_word().load(Ordering::Acquire);
    let rounds = c.total.div_ceil(chunk);
    let channels: Vec<OxcclPortChannel> = (0..c.world)
        .map(|p| {
            if p == c.me {
                OxcclPortChannel::default()
            } else {
                c.channel(p)
            }
        })
        .collect();
    let mut inputs = vec![[0u8; 16]; c.world];
    for k in 0..rounds {
        let parity = ((round0 + k as u64) & 1) as usize;
        let base = k * chunk;
        let len = (c.total - base).min(chunk);
        let units = len.div_ceil(16);
        if c.world > 1 {
            let send = send_off + parity * chunk;
            for u in 0..units {
                let v = c.load_input(base + u * 16);
                // SAFETY: send[parity] holds `chunk` >= 16 * units bytes of the live
                // scratch; the transports finished reading it (see the module docs).
                unsafe {
                    std::ptr::copy_nonoverlapping(v.as_ptr(), c.scratch().add(send + u * 16), 16)
                };
            }
            for k in 1..c.world {
                let p = (c.me + k) % c.world;
                let dst = recv_off + (parity * c.world + c.me) * chunk;
                // SAFETY: launch contract: a live channel of the host backend; both ranges
                // lie inside the registered scratches (same layout on every rank).
                unsafe {
                    port::host_put_with_signal(
                        &channels[p],
                        dst as u64,
                        send as u64,
                        (units * 16) as u64,
                        0,
                    )
                }
                .inspect_err(|_| {
                    // Recorded for check_error; the FIFO's own error is returned.
                    let _ = c.fail(p, "a FIFO slot");
                })?;
            }
            for k in 1..c.world {
                let p = (c.me + k) % c.world;
                c.wait_signal(&channels[p], p)?;
            }
        }
        let recv = recv_off + parity * c.world * chunk;
        for u in 0..units {
            for (r, input) in inputs.iter_mut().enumerate() {
                if r == c.me {
                    *input = c.load_input(base + u * 16);
                } else {
                    // SAFETY: recv[parity][r] of the live scratch: rank r's chunk, landed
                    // before its signal, which this rank acquired.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            c.scratch().add(recv + r * chunk + u * 16),
                            input.as_mut_ptr(),
                            16,
                        )
                    };
                }
            }
            let valid = len.saturating_sub(u * 16).min(16);
            c.store_output(base + u * 16, &c.reduce_unit(&inputs, valid)?);
        }
    }
    c.round_word()
        .store(round0 + rounds as u64, Ordering::Release);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_block_has_the_header_layout() {
        assert_eq!(size_of::<OxcclPortAllreduceArgs>(), 96);
        assert_eq!(size_of::<OxcclPortChannel>(), 80);
        let a = OxcclPortAllreduceArgs::default();
        assert_eq!(a.as_bytes().len(), 96);
        assert!(Call::new(&[0u8; 95]).is_err());
    }

    #[test]
    fn layout_and_names() {
        let l = Layout::new(8, 1000).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.chunk, 1008);
        assert_eq!(l.send, 4096);
        assert_eq!(l.recv, 4096 + 2 * 1008);
        assert_eq!(l.total, l.recv + 16 * 1008);
        assert!(Layout::new(8, 1 << 30).is_err());
        assert_eq!(parse_transport("TCP").ok(), Some(Some(Transport::Tcp)));
        assert_eq!(parse_transport("auto").ok(), Some(None));
        assert!(parse_transport("carrier-pigeon").is_err());
    }
}
