//! `oxccl-gpu-suite channels`: the channel table (issue 6).
//!
//! One process per GPU (torchrun); ranks pair up as (0,1), (2,3), ...; in each pair the
//! lower rank sends. Per pair:
//! - signal+wait ping-pong round trip of a MemoryChannel and of a PortChannel (timed in
//!   the kernel, the first round excluded);
//! - put bandwidth from 1 KiB to `OXCCL_BENCH_MAX_BYTES` (default 1 GiB; 16 MiB on the host
//!   backend) in powers of 4: MemoryChannel (GPU stores to the peer), PortChannel (the proxy
//!   drives the copy engine; put+signal+flush per repetition) and the copy engine's own peer
//!   copy measured in the same run, every moved byte checked by the receiver against the
//!   pattern (destination poisoned before each method).
//!
//! Runs on the backend `oxccl_backend::chosen()` picks, so the host backend exercises the
//! same code in CI (threads or processes as ranks).

use std::sync::Arc;
use std::time::Duration;

use oxccl_backend::{AnyDevice, AnyKernel, AnyMemory, AnyStream};
use oxccl_channels::bootstrap::{Bootstrap, BootstrapConfig};
use oxccl_channels::connection::{Connection, Transport, TransportSet};
use oxccl_channels::host_kernels;
use oxccl_channels::memory_channel::MemoryChannel;
use oxccl_channels::port_channel::PortChannel;
use oxccl_channels::proxy::ProxyBuilder;
use oxccl_channels::registered_memory::RegisteredMemory;
use oxccl_hal::{
    BackendKind, Device, DeviceId, DevicePtr, Error, Event, LaunchConfig, Memory, MemoryKind,
    Module, Result, Stream,
};
use oxccl_kernels::abi::{
    self, KernelArgs, OxcclMemoryChannelArgs, OxcclPatternArgs, OxcclPortChannelArgs,
};

/// Environment variable: largest put size in bytes.
pub const MAX_BYTES_VAR: &str = "OXCCL_BENCH_MAX_BYTES";
/// Environment variable: blocks of the MemoryChannel put kernel (default: by size).
pub const BLOCKS_VAR: &str = "OXCCL_BENCH_BLOCKS";
const PINGPONG_MEMORY: u32 = 20_000;
const PINGPONG_PORT: u32 = 2_000;
const THREADS: u32 = 1024;

struct Kernels {
    memory: AnyKernel,
    port: AnyKernel,
    fill: AnyKernel,
    check: AnyKernel,
}

struct Pair<'a> {
    b: &'a Bootstrap,
    d: &'a AnyDevice,
    stream: AnyStream,
    k: Kernels,
    sender: bool,
    mc: oxccl_kernels::abi::OxcclMemoryChannel,
    pc: oxccl_kernels::abi::OxcclPortChannel,
    buf: Arc<AnyMemory>,
    half: usize,
    sms: u32,
    scratch: AnyMemory,
}

/// One row of the bandwidth table.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// Bytes per put.
    pub bytes: usize,
    /// GB/s of MemoryChannel, PortChannel and the copy engine.
    pub gbps: [f64; 3],
}

fn fail(msg: String) -> Error {
    Error::Unsupported(msg)
}

fn env_usize(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| Error::InvalidArgument(format!("{name}={v} is not a number"))),
        Err(_) => Ok(default),
    }
}

impl Pair<'_> {
    fn launch(&self, k: &AnyKernel, blocks: u32, threads: u32, args: &[u8]) -> Result<()> {
        // SAFETY: every argument block built here names live memory of this pair (the
        // buffer, the scratch word, the channels' memories), kept alive until the stream
        // is synchronized by the caller.
        unsafe {
            self.stream
                .launch(k, &LaunchConfig::linear(blocks, threads), args)
        }
    }

    fn scratch_u64(&self) -> Result<u64> {
        self.stream.synchronize()?;
        let mut out = [0u8; 8];
        self.stream.read(self.scratch.ptr(), &mut out)?;
        Ok(u64::from_le_bytes(out))
    }

    fn set_scratch(&self, v: u64) -> Result<()> {
        self.stream.write(self.scratch.ptr(), &v.to_le_bytes())
    }

    fn status_ptr(&self) -> Result<*mut u32> {
        Ok(abi::ptr(self.scratch.ptr().offset(8)?))
    }

    fn check_status(&self, what: &str) -> Result<()> {
        self.stream.synchronize()?;
        let mut s = [0u8; 4];
        self.stream.read(self.scratch.ptr().offset(8)?, &mut s)?;
        match u32::from_le_bytes(s) {
            abi::OXCCL_WAIT_OK => Ok(()),
            abi::OXCCL_WAIT_TIMEOUT => Err(fail(format!("{what}: a wait timed out"))),
            other => Err(fail(format!("{what}: kernel status {other}"))),
        }
    }

    fn pattern(&self, k: &AnyKernel, at: DevicePtr, bytes: usize, seed: u32) -> Result<u64> {
        self.set_scratch(0)?;
        let a = OxcclPatternArgs {
            data: abi::ptr(at),
            count: (bytes / 4) as u64,
            seed,
            _pad0: 0,
            mismatches: abi::ptr(self.scratch.ptr()),
        };
        self.launch(k, self.sms.max(1), 256, a.as_bytes())?;
        self.scratch_u64()
    }

    /// Round trip in microseconds of `iterations` signal+wait exchanges.
    fn pingpong(&self, port: bool) -> Result<f64> {
        let iterations = if port { PINGPONG_PORT } else { PINGPONG_MEMORY };
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            self.stream.write(self.scratch.ptr(), &[0u8; 16])?;
            self.b.barrier()?;
            let elapsed = abi::ptr(self.scratch.ptr());
            let status = self.status_ptr()?;
            let initiator = u32::from(self.sender);
            if port {
                let a = OxcclPortChannelArgs {
                    channel: self.pc,
                    op: abi::OXCCL_PORT_OP_PINGPONG,
                    iterations,
                    initiator,
                    status,
                    elapsed_ns: elapsed,
                    ..Default::default()
                };
                self.launch(&self.k.port, 1, 32, a.as_bytes())?;
            } else {
                let a = OxcclMemoryChannelArgs {
                    channel: self.mc,
                    op: abi::OXCCL_MEMORY_OP_PINGPONG,
                    iterations,
                    initiator,
                    status,
                    elapsed_ns: elapsed,
                    ..Default::default()
                };
                self.launch(&self.k.memory, 1, 32, a.as_bytes())?;
            }
            self.check_status(if port {
                "PortChannel ping-pong"
            } else {
                "MemoryChannel ping-pong"
            })?;
            let ns = self.scratch_u64()?;
            best = best.min(ns as f64 / 1e3 / f64::from(iterations - 1));
        }
        Ok(best)
    }

    fn blocks_for(&self, bytes: usize) -> Result<u32> {
        let by_size = bytes.div_ceil(THREADS as usize * 16 * 4).clamp(1, 1024);
        let default = by_size.min(self.sms.max(1) as usize * 2);
        Ok(env_usize(BLOCKS_VAR, default)?.clamp(1, 65_535) as u32)
    }

    /// One method at one size: receiver poisons, sender times `reps` puts, receiver checks.
    fn bandwidth(&self, method: usize, bytes: usize, seed: u32) -> Result<f64> {
        let src = self.buf.ptr();
        let dst_off = self.half;
        let dst_local = self.buf.ptr().offset(dst_off)?;
        if !self.sender {
            // SAFETY: the destination half of this rank's live buffer.
            unsafe { self.stream.fill(dst_local, 0, bytes)? };
            self.stream.synchronize()?;
        } else {
            let a = OxcclPatternArgs {
                data: abi::ptr(src),
                count: (bytes / 4) as u64,
                seed,
                _pad0: 0,
                mismatches: std::ptr::null_mut(),
            };
            self.launch(&self.k.fill, self.sms.max(1), 256, a.as_bytes())?;
            self.stream.synchronize()?;
        }
        let reps = ((4usize << 30) / bytes).clamp(5, 100);
        self.b.barrier()?;
        let mut ms = 0.0f32;
        if self.sender {
            let start = self.d.create_event()?;
            let end = self.d.create_event()?;
            let one = |p: &Self| -> Result<()> {
                match method {
                    0 => {
                        let a = OxcclMemoryChannelArgs {
                            channel: p.mc,
                            op: abi::OXCCL_MEMORY_OP_PUT,
                            dst_offset: dst_off as u64,
                            src_offset: 0,
                            bytes: bytes as u64,
                            ..Default::default()
                        };
                        p.launch(&p.k.memory, p.blocks_for(bytes)?, THREADS, a.as_bytes())
                    }
                    1 => {
                        let a = OxcclPortChannelArgs {
                            channel: p.pc,
                            op: abi::OXCCL_PORT_OP_PUT_WITH_SIGNAL_AND_FLUSH,
                            dst_offset: dst_off as u64,
                            src_offset: 0,
                            bytes: bytes as u64,
                            status: p.status_ptr()?,
                            ..Default::default()
                        };
                        p.launch(&p.k.port, 1, 32, a.as_bytes())
                    }
                    _ => {
                        let remote = DevicePtr(p.mc.remote as u64).offset(dst_off)?;
                        // SAFETY: the peer's destination half (mapped) and this rank's
                        // source half, both live and `bytes` long, disjoint.
                        unsafe { p.stream.copy(remote, src, bytes) }
                    }
                }
            };
            one(self)?; // warm-up
            self.stream.record(&start)?;
            for _ in 0..reps {
                one(self)?;
            }
            self.stream.record(&end)?;
            end.synchronize()?;
            ms = end.elapsed_ms_since(&start)?;
            if method == 1 {
                self.check_status("PortChannel put")?;
            }
        } else if method == 1 {
            // Consume the signals (warm-up + reps), which also checks they all arrived.
            self.stream
                .write(self.scratch.ptr().offset(8)?, &[0u8; 4])?;
            let a = OxcclPortChannelArgs {
                channel: self.pc,
                op: abi::OXCCL_PORT_OP_WAIT,
                iterations: reps as u32 + 1,
                status: self.status_ptr()?,
                ..Default::default()
            };
            self.launch(&self.k.port, 1, 32, a.as_bytes())?;
            self.check_status("PortChannel signals")?;
        }
        self.stream.synchronize()?;
        self.b.barrier()?;
        if !self.sender {
            let bad = self.pattern(&self.k.check, dst_local, bytes, seed)?;
            if bad != 0 {
                return Err(fail(format!(
                    "{} put of {bytes} bytes: {bad} of {} words differ",
                    METHODS[method],
                    bytes / 4
                )));
            }
        }
        // Everyone learns the sender's time (and that the check passed).
        let all = self.b.all_gather(&ms.to_le_bytes())?;
        let sender_rank = self.b.rank() & !1;
        let t = all
            .get(sender_rank as usize)
            .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
            .map(f32::from_le_bytes)
            .ok_or_else(|| fail("no time from the sender".into()))?;
        Ok(bytes as f64 * reps as f64 / (f64::from(t) * 1e-3) / 1e9)
    }
}

/// Names of the put methods, in table order.
pub const METHODS: [&str; 3] = ["MemoryChannel", "PortChannel", "copy engine"];

fn sizes(max: usize) -> Vec<usize> {
    std::iter::successors(Some(1024usize), |s| s.checked_mul(4))
        .take_while(|s| *s <= max)
        .collect()
}

/// Runs the table on `device` as one rank of `b`; returns the rendered report of this
/// rank's pair (None on a rank without a partner).
pub fn run_on(b: &Bootstrap, d: &AnyDevice) -> Result<Option<String>> {
    let rank = b.rank();
    let world = b.world_size();
    if world < 2 {
        return Err(Error::InvalidArgument(
            "the channel table needs at least 2 ranks".into(),
        ));
    }
    let kind = d.backend();
    let default_max = if kind == BackendKind::Host {
        16 << 20
    } else {
        1 << 30
    };
    let max = env_usize(MAX_BYTES_VAR, default_max)?.max(1024);
    // Every rank takes part in the collectives; a rank without partner only follows them.
    let peer = rank ^ 1;
    let paired = peer < world;
    let kmod = d.load_module(&oxccl_kernels::module_image(kind)?)?;
    let cmod = d.load_module(&host_kernels::module_image(kind)?)?;
    let k = Kernels {
        memory: cmod.kernel(host_kernels::MEMORY_OP)?,
        port: cmod.kernel(host_kernels::PORT_OP)?,
        fill: kmod.kernel("oxccl_test_fill_pattern")?,
        check: kmod.kernel("oxccl_test_check_pattern")?,
    };
    let half = max;
    let buf = Arc::new(d.alloc(2 * half, MemoryKind::Physical)?);
    let ipc = TransportSet::of(&[Transport::Ipc]);
    let reg = RegisteredMemory::new(d, rank, Arc::clone(&buf), ipc)?;
    if !paired {
        // Follow the pair ranks' collectives, in their order: 3 barriers per ping-pong,
        // then per size and method two barriers and the all-gather of the time.
        for _ in 0..6 {
            b.barrier()?;
        }
        for _ in 0..sizes(max).len() * METHODS.len() {
            b.barrier()?;
            b.barrier()?;
            b.all_gather(&0f32.to_le_bytes())?;
        }
        return Ok(None);
    }
    let mc = MemoryChannel::connect(b, d, peer, &reg, None, 600)?;
    let conn = Arc::new(Connection::connect(b, d, peer, Transport::Ipc, 610)?);
    let mut builder = ProxyBuilder::new(d, None)?;
    let pc = PortChannel::connect(b, d, &mut builder, conn, &reg, 620)?;
    let proxy = builder.start()?;
    let pair = Pair {
        b,
        d,
        stream: d.create_stream()?,
        k,
        sender: rank < peer,
        mc: mc.handle()?,
        pc,
        buf,
        half,
        sms: d.capabilities().multiprocessors,
        scratch: d.alloc(64, MemoryKind::Plain)?,
    };
    let mem_rtt = pair.pingpong(false)?;
    let port_rtt = pair.pingpong(true)?;
    let mut rows = Vec::new();
    for (i, &bytes) in sizes(max).iter().enumerate() {
        let mut gbps = [0.0; 3];
        for (m, g) in gbps.iter_mut().enumerate() {
            *g = pair.bandwidth(m, bytes, 0x0c0f_fee0 ^ (i as u32) << 8 ^ m as u32)?;
        }
        rows.push(Row { bytes, gbps });
    }
    if let Some(e) = proxy.error() {
        return Err(e);
    }
    drop(proxy);
    Ok(Some(render(rank, peer, d, mem_rtt, port_rtt, &rows)))
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b => format!("{} KiB", b >> 10),
    }
}

fn render(rank: u32, peer: u32, d: &AnyDevice, mem: f64, port: f64, rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "channels, ranks {rank} -> {peer} on {} ({})",
        d.capabilities().name,
        d.backend()
    );
    let _ = writeln!(
        s,
        "signal+wait round trip: MemoryChannel {mem:.2} us, PortChannel {port:.2} us"
    );
    let _ = writeln!(
        s,
        "{:>9} | {:>16} | {:>16} | {:>16} | {:>9}",
        "bytes", "MemoryChannel GB/s", "PortChannel GB/s", "copy engine GB/s", "MC / CE"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:>9} | {:>18.2} | {:>16.2} | {:>16.2} | {:>8.1}%",
            human(r.bytes),
            r.gbps[0],
            r.gbps[1],
            r.gbps[2],
            100.0 * r.gbps[0] / r.gbps[2].max(1e-9)
        );
    }
    let at256 = rows.iter().find(|r| r.bytes == 256 << 20);
    let _ = writeln!(
        s,
        "targets: MemoryChannel round trip < 3 us: {} ({mem:.2} us); MemoryChannel put 256 MiB >= 85% of copy engine: {}",
        if mem < 3.0 { "met" } else { "NOT met" },
        match at256 {
            Some(r) if r.gbps[0] >= 0.85 * r.gbps[2] => format!("met ({:.1}%)", 100.0 * r.gbps[0] / r.gbps[2]),
            Some(r) => format!("NOT met ({:.1}%)", 100.0 * r.gbps[0] / r.gbps[2]),
            None => "not measured (max size below 256 MiB)".into(),
        }
    );
    s
}

/// The `channels` subcommand: bootstrap from the launcher environment, open the GPU of
/// `LOCAL_RANK`, print the table on the pair leaders. True when every check passed.
pub fn run(timeout: Duration) -> Result<bool> {
    let config = BootstrapConfig { timeout };
    let (b, info) = Bootstrap::from_env(&config)?;
    let kind = oxccl_backend::chosen()?;
    let d = AnyDevice::open_with(kind, DeviceId(info.local_rank))?;
    match run_on(&b, &d) {
        Ok(Some(table)) => {
            if b.rank() % 2 == 0 {
                println!("{table}");
            }
            Ok(true)
        }
        Ok(None) => Ok(true),
        Err(e) => {
            eprintln!("rank {}: channels: {e}", b.rank());
            Ok(false)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use oxccl_channels::bootstrap::UniqueId;
    use std::net::{IpAddr, Ipv4Addr};

    #[test]
    fn sizes_are_powers_of_four_from_1k() {
        assert_eq!(sizes(16 << 10), vec![1024, 4096, 16384]);
        assert_eq!(sizes(1 << 30).len(), 11);
    }

    /// The whole table on the host backend, two threads as ranks, small sizes: every byte
    /// is checked by the receiver, so a protocol or offset bug fails here before a GPU run.
    #[test]
    fn table_runs_on_the_host_backend() {
        let cfg = BootstrapConfig {
            timeout: Duration::from_secs(60),
        };
        let id = UniqueId::create_on(IpAddr::V4(Ipv4Addr::LOCALHOST), &cfg).unwrap();
        std::env::set_var(MAX_BYTES_VAR, "65536");
        let out: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let cfg = cfg.clone();
                    s.spawn(move || {
                        let b = Bootstrap::new(&id, r, 2, &cfg).unwrap();
                        let d = AnyDevice::open_with(BackendKind::Host, DeviceId(r)).unwrap();
                        run_on(&b, &d).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let table = out[0].clone().unwrap();
        assert!(table.contains("64 KiB"), "{table}");
        assert!(table.contains("round trip"), "{table}");
    }
}
