//! The tuner: times the candidate launches (algorithm x blocks x threads) of every size
//! class on this machine, agrees on the winners across ranks, and caches the table on disk.
//!
//! * **Candidates** ([`candidates`]): every algorithm of the collective with a
//!   [`crate::algorithms::Tuning`] whose plan accepts the call, with its default grid and
//!   the power-of-two block counts (down to an eighth of the default, up to the
//!   multiprocessor count) and the descriptor's thread counts, never more threads than its
//!   work items. The host backend runs kernels as host functions with a fixed grid, so
//!   there only the algorithms compete.
//! * **Measurement** ([`measure`]) runs on a [`TuneTarget`]: the communicator's launch path
//!   and exchange, behind a trait, so the tuner knows no communicator.
//! * **Timing** ([`crate::timing`]): graph replay on CUDA (eager launches elsewhere), the
//!   median of three repetitions, out of place on the tuner's own registered buffers, so
//!   the zero-copy algorithm competes for registered calls and the staging ones for the
//!   rest (two rows per size).
//! * **Agreement**: before launching, ranks exchange a hash of their candidate list (a
//!   mismatch is an error, never a hang); after, every rank's times, and a candidate's
//!   time is the slowest rank's. Every rank then picks the same winner.
//! * **Cache**: one text file per (device name, architecture, backend, world size, data
//!   type, build), in `OXCCL_TUNE_DIR`, else `$XDG_CACHE_HOME/oxccl`, else
//!   `~/.cache/oxccl`. A table is used only if every rank loaded the same one (hash
//!   exchanged); otherwise the ranks tune again together.
//!
//! The selector ([`crate::selector`]) consults a table for its data type: the entry of the
//! smallest tuned size at or above the call's bytes (the largest entry above the last),
//! provided the algorithm can serve the call; `OXCCL_ALGO` still wins over the table.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use oxccl_backend::{AnyEvent, AnyStream};
use oxccl_hal::{
    AccumType, BackendKind, Capabilities, DataType, DevicePtr, Error, LaunchConfig, ReduceOp,
    Result,
};

use crate::algorithms::{
    max_blocks, Algorithm, Call, CallShape, Collective, PeerBuffers, Plan, ALGORITHMS, THREADS,
};
use crate::timing::{time_calls, TimingMode};

/// Environment variable: `1` tunes (or loads the cached table) when a communicator is
/// created; `force` always measures again; `0` or unset leaves it to the communicator's `tune`.
pub const TUNE_VAR: &str = "OXCCL_TUNE";
/// Environment variable: data types tuned at creation (comma separated; default `bf16`).
pub const TUNE_DTYPES_VAR: &str = "OXCCL_TUNE_DTYPES";
/// Environment variable: the largest size tuned, in bytes per rank (default 256 MiB).
pub const TUNE_MAX_VAR: &str = "OXCCL_TUNE_MAX_BYTES";
/// Environment variable: directory of the cached tables.
pub const TUNE_DIR_VAR: &str = "OXCCL_TUNE_DIR";

/// Default largest tuned size (bytes per rank).
pub const DEFAULT_TUNE_MAX: usize = 256 << 20;
/// Smallest tuned size (bytes per rank).
pub const TUNE_MIN: usize = 1 << 10;

const MAGIC: &str = "oxccl-tune v1";

/// When the communicator tunes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TuneMode {
    /// Only on demand (the communicator's `tune`).
    #[default]
    Off,
    /// At creation: load the cached table, measure when there is none.
    Cached,
    /// At creation: always measure (and replace the cache).
    Force,
}

impl FromStr for TuneMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "0" | "off" | "no" => Ok(TuneMode::Off),
            "1" | "on" | "yes" | "cache" | "cached" => Ok(TuneMode::Cached),
            "force" | "2" => Ok(TuneMode::Force),
            other => Err(Error::InvalidArgument(format!(
                "{TUNE_VAR}='{other}': expected 0, 1 or force"
            ))),
        }
    }
}

/// Where a table in use came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TuneSource {
    /// Every rank loaded the same cached table.
    Cache,
    /// Measured now (no cache, a stale or unreadable one, ranks that disagreed, or forced).
    Measured,
}

/// What a table was measured for: it applies only to the same key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TuneKey {
    /// Device name ("NVIDIA H200").
    pub device: String,
    /// Architecture ("sm_90").
    pub arch: String,
    /// Backend.
    pub backend: BackendKind,
    /// Ranks.
    pub world: u32,
    /// Element type.
    pub dtype: DataType,
    /// The build: crate version and a hash of the kernel image.
    pub build: String,
}

impl TuneKey {
    /// The key of a device, world size and data type in this build.
    pub fn new(caps: &Capabilities, backend: BackendKind, world: u32, dtype: DataType) -> Self {
        TuneKey {
            device: caps.name.clone(),
            arch: caps.arch.clone(),
            backend,
            world,
            dtype,
            build: build_id(backend),
        }
    }

    /// The cache file name of this key.
    pub fn file_name(&self) -> String {
        let clean = |s: &str| -> String {
            s.chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                .collect()
        };
        format!(
            "tune-{}-{}-{}-w{}-{}.txt",
            clean(&self.device),
            clean(&self.arch),
            self.backend,
            self.world,
            self.dtype
        )
    }
}

/// Crate version and a hash of the kernel image of `backend` (a rebuilt kernel makes old
/// tables stale).
fn build_id(backend: BackendKind) -> String {
    let image = match oxccl_kernels::module_image(backend) {
        Ok(oxccl_hal::ModuleImage::Cuda(b)) | Ok(oxccl_hal::ModuleImage::Rocm(b)) => fnv1a(b),
        _ => 0,
    };
    format!("{}-{image:016x}", env!("CARGO_PKG_VERSION"))
}

/// FNV-1a, 64 bits.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The winner of one size class.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TuneEntry {
    /// Bytes per rank of the size class.
    pub bytes: usize,
    /// Whether measured on registered buffers (zero-copy eligible).
    pub registered: bool,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Blocks.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// Measured microseconds per call (slowest rank).
    pub us: f64,
}

/// A tuned table for one [`TuneKey`].
#[derive(Debug, Clone, PartialEq)]
pub struct TuneTable {
    /// What it was measured for.
    pub key: TuneKey,
    /// Entries sorted by (registered, bytes).
    pub entries: Vec<TuneEntry>,
}

impl TuneTable {
    /// The entry for a call of `bytes` per rank: the smallest tuned size at or above it,
    /// else the largest tuned size.
    pub fn lookup(&self, bytes: usize, registered: bool) -> Option<&TuneEntry> {
        let mut rows = self.entries.iter().filter(|e| e.registered == registered);
        let mut last = None;
        for e in rows.by_ref() {
            if e.bytes >= bytes {
                return Some(e);
            }
            last = Some(e);
        }
        last
    }

    /// The cache file text.
    pub fn to_text(&self) -> String {
        let k = &self.key;
        let mut s = format!(
            "{MAGIC}\ndevice {}\narch {}\nbackend {}\nworld {}\ndtype {}\nbuild {}\n",
            k.device, k.arch, k.backend, k.world, k.dtype, k.build
        );
        for e in &self.entries {
            let _ = writeln!(
                s,
                "entry {} {} {} {} {} {:.3}",
                e.bytes,
                u8::from(e.registered),
                e.algorithm.name(),
                e.grid,
                e.block,
                e.us
            );
        }
        s
    }

    /// Parses a cache file; errors say which line is wrong.
    pub fn from_text(text: &str) -> Result<TuneTable> {
        let bad = |line: usize, why: &str| {
            Error::InvalidArgument(format!("tune table line {}: {why}", line + 1))
        };
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, MAGIC)) => {}
            _ => return Err(bad(0, &format!("expected '{MAGIC}'"))),
        }
        let mut field = |name: &str| -> Result<String> {
            let (i, l) = lines
                .next()
                .ok_or_else(|| bad(0, &format!("missing '{name}'")))?;
            l.strip_prefix(name)
                .and_then(|r| r.strip_prefix(' '))
                .map(str::to_owned)
                .ok_or_else(|| bad(i, &format!("expected '{name} ...'")))
        };
        let device = field("device")?;
        let arch = field("arch")?;
        let backend = match field("backend")?.to_ascii_lowercase().as_str() {
            "host" => BackendKind::Host,
            "cuda" => BackendKind::Cuda,
            "rocm" => BackendKind::Rocm,
            other => return Err(bad(3, &format!("unknown backend '{other}'"))),
        };
        let world = field("world")?
            .parse::<u32>()
            .map_err(|_| bad(4, "world is not a number"))?;
        let dtype = field("dtype")?.parse::<DataType>()?;
        let build = field("build")?;
        let mut entries = Vec::new();
        for (i, l) in lines {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.is_empty() {
                continue;
            }
            if f.len() != 7 || f[0] != "entry" {
                return Err(bad(
                    i,
                    "expected 'entry bytes registered algorithm grid block us'",
                ));
            }
            let num = |s: &str| s.parse::<u64>().map_err(|_| bad(i, "not a number"));
            entries.push(TuneEntry {
                bytes: usize::try_from(num(f[1])?).map_err(|_| bad(i, "size too large"))?,
                registered: num(f[2])? != 0,
                algorithm: f[3].parse()?,
                grid: u32::try_from(num(f[4])?).map_err(|_| bad(i, "grid too large"))?,
                block: u32::try_from(num(f[5])?).map_err(|_| bad(i, "block too large"))?,
                us: f[6]
                    .parse::<f64>()
                    .map_err(|_| bad(i, "time is not a number"))?,
            });
        }
        entries.sort_by_key(|e| (e.registered, e.bytes));
        Ok(TuneTable {
            key: TuneKey {
                device,
                arch,
                backend,
                world,
                dtype,
                build,
            },
            entries,
        })
    }

    /// A hash of the table (ranks compare it before using a loaded table).
    pub fn fingerprint(&self) -> u64 {
        fnv1a(self.to_text().as_bytes())
    }
}

/// The cache directory: `OXCCL_TUNE_DIR`, else `$XDG_CACHE_HOME/oxccl`, else
/// `$HOME/.cache/oxccl`.
pub fn cache_dir() -> Option<PathBuf> {
    let from = |var: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    from(TUNE_DIR_VAR)
        .or_else(|| from("XDG_CACHE_HOME").map(|p| p.join("oxccl")))
        .or_else(|| from("HOME").map(|p| p.join(".cache").join("oxccl")))
}

/// Loads the cached table of `key` from `dir`: `None` when there is none, it does not
/// parse, or it was made for another key (each logged).
pub fn load(dir: &Path, key: &TuneKey) -> Option<TuneTable> {
    let path = dir.join(key.file_name());
    let text = std::fs::read_to_string(&path).ok()?;
    match TuneTable::from_text(&text) {
        Ok(t) if &t.key == key => Some(t),
        Ok(_) => {
            tracing::info!(path = %path.display(), "cached tune table is for another build; ignored");
            None
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cached tune table unreadable; ignored");
            None
        }
    }
}

/// Writes the table into `dir` (atomically: a unique temporary file, then a rename, so
/// ranks writing the same table at once never leave a torn file).
pub fn store(dir: &Path, table: &TuneTable) -> Result<PathBuf> {
    let io = |what: &str, p: &Path, e: std::io::Error| {
        Error::InvalidArgument(format!("tune cache: {what} {}: {e}", p.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| io("cannot create", dir, e))?;
    let path = dir.join(table.key.file_name());
    let tmp = dir.join(format!(
        ".{}.{}.{:x}",
        table.key.file_name(),
        std::process::id(),
        fnv1a(format!("{:?}", std::thread::current().id()).as_bytes())
    ));
    std::fs::write(&tmp, table.to_text()).map_err(|e| io("cannot write", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io("cannot rename into", &path, e))?;
    Ok(path)
}

/// The sizes tuned: powers of two from [`TUNE_MIN`] to `max`.
pub fn sizes(max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = TUNE_MIN;
    while s <= max.max(TUNE_MIN) {
        v.push(s);
        match s.checked_mul(2) {
            Some(n) => s = n,
            None => break,
        }
    }
    v
}

/// Checks a grid/block for an algorithm's kernel and returns the plan with it.
pub fn with_launch(plan: Plan, shape: &CallShape<'_>, grid: u32, block: u32) -> Result<Plan> {
    if shape.host {
        // Host kernels run as one host function: the grid is not a choice there.
        return Ok(plan);
    }
    let max = max_blocks(shape.caps);
    if grid == 0 || grid > max {
        return Err(Error::InvalidArgument(format!(
            "tuned grid {grid} is outside 1..={max} (blocks must all be resident)"
        )));
    }
    if block % 32 != 0 || !(32..=THREADS).contains(&block) || block < shape.world_size {
        return Err(Error::InvalidArgument(format!(
            "tuned block {block} is not a multiple of 32 in {}..={THREADS}",
            shape.world_size.max(32)
        )));
    }
    Ok(Plan {
        kernel: plan.kernel,
        config: LaunchConfig::linear(grid, block),
    })
}

/// Every candidate launch for a call of `collective`: (algorithm, plan), default plans
/// first.
pub fn candidates(collective: Collective, shape: &CallShape<'_>) -> Vec<(Algorithm, Plan)> {
    let mut out: Vec<(Algorithm, Plan)> = Vec::new();
    for &algorithm in ALGORITHMS.iter().filter(|a| a.collective() == collective) {
        let Some(tuning) = algorithm.descriptor().tuning else {
            continue;
        };
        if shape.zero_copy && !tuning.on_registered {
            continue;
        }
        let Ok(base) = algorithm.plan(shape) else {
            continue;
        };
        out.push((algorithm, base));
        if shape.host {
            continue;
        }
        let work = (tuning.work)(shape);
        let max = max_blocks(shape.caps);
        let min_grid = (base.config.grid[0] / 8).max(1);
        // Threads that cover `work` in one pass of one block (whole warps, at least 64).
        let one_pass = work.next_multiple_of(32).max(64);
        let mut launches: Vec<(u32, u32)> = Vec::new();
        for &t in tuning.threads {
            if t < shape.world_size || (t as usize) > one_pass {
                continue;
            }
            let mut grids: Vec<u32> = (0..8).map(|p| 1u32 << p).collect();
            grids.push(max);
            grids.retain(|&g| g >= min_grid && g <= max);
            grids.dedup();
            for g in grids {
                if (g as usize) * (t as usize) <= work.max(t as usize) {
                    launches.push((g, t));
                }
            }
        }
        // Small enough for one block in one pass: no count across blocks.
        if tuning.one_block && one_pass <= THREADS as usize {
            launches.push((1, one_pass as u32));
        }
        for (g, t) in launches {
            if let Ok(plan) = with_launch(base, shape, g, t) {
                if !out.iter().any(|(a, p)| *a == algorithm && *p == plan) {
                    out.push((algorithm, plan));
                }
            }
        }
    }
    out
}

/// A hash of a candidate list (ranks compare it before launching anything).
pub fn candidates_hash(list: &[(Algorithm, Plan)]) -> u64 {
    let mut bytes = Vec::with_capacity(list.len() * 16);
    for (a, p) in list {
        bytes.extend_from_slice(&a.code().to_le_bytes());
        bytes.extend_from_slice(&p.config.grid[0].to_le_bytes());
        bytes.extend_from_slice(&p.config.block[0].to_le_bytes());
    }
    fnv1a(&bytes)
}

/// The collective time of each candidate (the slowest rank) from every rank's times, after
/// checking that every rank timed the same list. Returns the index of the fastest.
pub fn agree(all: &[Vec<u8>], list_hash: u64, n: usize) -> Result<(usize, Vec<f64>)> {
    let mut worst = vec![0.0f64; n];
    for (r, msg) in all.iter().enumerate() {
        if msg.len() != 8 + 8 * n {
            return Err(Error::InvalidArgument(format!(
                "tuner: rank {r} timed {} candidates, this rank {n}",
                msg.len().saturating_sub(8) / 8
            )));
        }
        let mut w = [0u8; 8];
        w.copy_from_slice(&msg[..8]);
        if u64::from_le_bytes(w) != list_hash {
            return Err(Error::InvalidArgument(format!(
                "tuner: rank {r} timed different candidates (different device or settings)"
            )));
        }
        for (i, slot) in worst.iter_mut().enumerate() {
            w.copy_from_slice(&msg[8 + 8 * i..16 + 8 * i]);
            let t = f64::from_le_bytes(w);
            *slot = if t.is_nan() {
                f64::INFINITY
            } else {
                slot.max(t)
            };
        }
    }
    let best = worst
        .iter()
        .enumerate()
        .fold(0, |b, (i, t)| if *t < worst[b] { i } else { b });
    Ok((best, worst))
}

/// The message of one rank for [`agree`].
pub fn times_message(list_hash: u64, times: &[f64]) -> Vec<u8> {
    let mut m = Vec::with_capacity(8 + 8 * times.len());
    m.extend_from_slice(&list_hash.to_le_bytes());
    for t in times {
        m.extend_from_slice(&t.to_le_bytes());
    }
    m
}

/// Calls per timed repetition: enough that launch jitter does not dominate small sizes.
pub fn iters_for(bytes: usize) -> usize {
    match bytes {
        0..=65_536 => 20,
        65_537..=1_048_576 => 10,
        1_048_577..=16_777_216 => 5,
        _ => 2,
    }
}

/// What the tuner measures on: one rank's launch path and its exchange with the other
/// ranks (a communicator implements it).
pub trait TuneTarget {
    /// This rank.
    fn rank(&self) -> u32;
    /// Every rank's `bytes`, in rank order (collective).
    fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// The shape of a call of `count` elements on registered buffers or not.
    fn call_shape(&self, count: usize, dtype: DataType, registered: bool) -> Result<CallShape<'_>>;
    /// Every rank's view of registered `input`/`output` for a call of `bytes`.
    fn peer_buffers(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        bytes: usize,
    ) -> Option<PeerBuffers>;
    /// One launch of `algorithm` with `plan` (no selection, no cross-rank check).
    ///
    /// # Safety
    /// As [`crate::algorithms::Instance::launch`].
    unsafe fn launch(
        &self,
        algorithm: Algorithm,
        plan: &Plan,
        call: &Call,
        stream: &AnyStream,
    ) -> Result<()>;
    /// Whether `algorithm` is set up here (a candidate that is not cannot be launched).
    fn is_set_up(&self, algorithm: Algorithm) -> bool;
    /// The failure the kernels recorded, if any (synchronizes `stream`).
    fn check_error(&self, stream: &AnyStream) -> Result<()>;
    /// The key a table of `dtype` measured here is stored under.
    fn key(&self, dtype: DataType) -> TuneKey;
}

/// Buffers the tuner launches on: `input` and `output` of at least `max_bytes` each,
/// registered on every rank, live until the stream is synchronized.
#[derive(Debug, Clone, Copy)]
pub struct TuneBuffers {
    /// Input of every call.
    pub input: DevicePtr,
    /// Output of every call.
    pub output: DevicePtr,
}

/// Timed repetitions per candidate (the median is kept).
const REPS: usize = 3;

/// Measures the table of `dtype` for `collective` at every size of `list_sizes`
/// (collective; see the module docs), out of place on `buffers`, on `stream`.
pub fn measure(
    target: &dyn TuneTarget,
    collective: Collective,
    dtype: DataType,
    list_sizes: &[usize],
    buffers: TuneBuffers,
    stream: &AnyStream,
    events: &(AnyEvent, AnyEvent),
) -> Result<TuneTable> {
    let mut entries = Vec::new();
    for &bytes in list_sizes {
        let count = (bytes / dtype.size()).max(1);
        let bytes = dtype.bytes(count)?;
        for registered in [false, true] {
            let shape = target.call_shape(count, dtype, registered)?;
            let mut list = candidates(collective, &shape);
            list.retain(|(a, _)| target.is_set_up(*a));
            if list.is_empty() {
                continue;
            }
            let hash = candidates_hash(&list);
            let all = target.all_gather(&hash.to_le_bytes())?;
            if let Some(r) = all.iter().position(|h| h.as_slice() != hash.to_le_bytes()) {
                return Err(Error::InvalidArgument(format!(
                    "tuner: rank {r} has other candidates at {bytes} bytes (different device, \
                     world or settings); nothing was launched"
                )));
            }
            let peers = target.peer_buffers(buffers.input, buffers.output, bytes);
            let mut times = Vec::with_capacity(list.len());
            for (algorithm, plan) in &list {
                let call = Call {
                    input: buffers.input,
                    output: buffers.output,
                    count,
                    dtype,
                    op: ReduceOp::Sum,
                    accum: AccumType::Auto,
                    root: 0,
                    peers: peers.filter(|_| registered && algorithm.uses_registered()),
                };
                let launch = || {
                    // SAFETY: the buffers hold `bytes` bytes, stay allocated and registered
                    // until the stream is synchronized (the caller's obligation); every
                    // rank launches the same candidate list in the same order (hash checked).
                    unsafe { target.launch(*algorithm, plan, &call, stream) }
                };
                launch()?;
                target.check_error(stream)?;
                let us = time_calls(
                    stream,
                    events,
                    TimingMode::Graph,
                    iters_for(bytes),
                    REPS,
                    &launch,
                )?;
                target.check_error(stream)?;
                times.push(us);
            }
            let all = target.all_gather(&times_message(hash, &times))?;
            let (best, worst) = agree(&all, hash, list.len())?;
            let (algorithm, plan) = list[best];
            tracing::debug!(
                bytes,
                registered,
                %algorithm,
                grid = plan.config.grid[0],
                block = plan.config.block[0],
                us = worst[best],
                candidates = list.len(),
                "tuned size"
            );
            entries.push(TuneEntry {
                bytes,
                registered,
                algorithm,
                grid: plan.config.grid[0],
                block: plan.config.block[0],
                // Rounded as the cache file writes it, so a loaded table equals this one.
                us: (worst[best] * 1e3).round() / 1e3,
            });
        }
    }
    entries.sort_by_key(|e| (e.registered, e.bytes));
    Ok(TuneTable {
        key: target.key(dtype),
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::all_reduce::one_shot::ONESHOT_LL;
    use crate::algorithms::all_reduce::one_shot_ll128::ONESHOT_LL128;
    use crate::algorithms::all_reduce::two_shot::TWOSHOT;
    use crate::algorithms::all_reduce::two_shot_push::TWOSHOT_PUSH;
    use crate::algorithms::all_reduce::two_shot_zc::TWOSHOT_ZC;

    fn caps() -> Capabilities {
        Capabilities {
            name: "NVIDIA H200".into(),
            arch: "sm_90".into(),
            multiprocessors: 132,
            ..Capabilities::default()
        }
    }

    fn shape(bytes: usize, world: u32, caps: &Capabilities, zero_copy: bool) -> CallShape<'_> {
        CallShape {
            collective: Collective::AllReduce,
            count: bytes / 2,
            dtype: DataType::Bf16,
            bytes,
            world_size: world,
            caps,
            packet_half_bytes: 8 << 20,
            ll128_half_bytes: 8 << 20,
            nvlink: true,
            multi_node: false,
            host: false,
            zero_copy,
        }
    }

    #[test]
    fn candidates_are_valid_and_distinct() {
        let c = caps();
        for bytes in sizes(256 << 20) {
            for zc in [false, true] {
                let s = shape(bytes, 4, &c, zc);
                let list = candidates(Collective::AllReduce, &s);
                assert!(!list.is_empty(), "{bytes} {zc}");
                for (i, (a, p)) in list.iter().enumerate() {
                    assert!(p.config.grid[0] >= 1 && p.config.grid[0] <= 132);
                    let b = p.config.block[0];
                    assert!(b % 32 == 0 && (32..=512).contains(&b) && b >= 4);
                    assert!(a.plan(&s).is_ok());
                    assert!(!list[..i].contains(&(*a, *p)), "duplicate {a} {p:?}");
                    if zc {
                        assert_ne!(*a, TWOSHOT);
                    } else {
                        assert_ne!(*a, TWOSHOT_ZC);
                    }
                }
            }
        }
        // Small calls get few, large calls many; one-shot drops out where it cannot serve.
        assert!(candidates(Collective::AllReduce, &shape(1024, 4, &c, false)).len() <= 8);
        // One-shots that fit one block in one pass have that launch among them (2 KB:
        // 19 LL128 lines are 152 lanes, 1 x 160; 128 LL16 units, 1 x 128).
        let small = candidates(Collective::AllReduce, &shape(2048, 2, &c, false));
        let one_pass = |a: Algorithm, t: u32| {
            small
                .iter()
                .any(|(x, p)| *x == a && p.config.grid[0] == 1 && p.config.block[0] == t)
        };
        assert!(one_pass(ONESHOT_LL128, 160));
        assert!(one_pass(ONESHOT_LL, 128));
        let big = candidates(Collective::AllReduce, &shape(256 << 20, 4, &c, false));
        assert!(big.iter().all(|(a, _)| [TWOSHOT, TWOSHOT_PUSH].contains(a)));
        assert!(big.len() >= 6);
    }

    #[test]
    fn host_candidates_are_the_algorithms() {
        let c = caps();
        let mut s = shape(1 << 20, 2, &c, true);
        s.host = true;
        let list = candidates(Collective::AllReduce, &s);
        let names: Vec<&str> = list.iter().map(|(a, _)| a.name()).collect();
        assert_eq!(
            names,
            ["oneshot_ll", "oneshot_ll128", "twoshot_zc", "twoshot_push"]
        );
    }

    #[test]
    fn text_round_trip_and_lookup() {
        let t = TuneTable {
            key: TuneKey::new(&caps(), BackendKind::Cuda, 4, DataType::Bf16),
            entries: vec![
                TuneEntry {
                    bytes: 1024,
                    registered: false,
                    algorithm: ONESHOT_LL,
                    grid: 1,
                    block: 64,
                    us: 5.5,
                },
                TuneEntry {
                    bytes: 4096,
                    registered: false,
                    algorithm: TWOSHOT,
                    grid: 8,
                    block: 256,
                    us: 7.25,
                },
                TuneEntry {
                    bytes: 1024,
                    registered: true,
                    algorithm: TWOSHOT_ZC,
                    grid: 2,
                    block: 128,
                    us: 6.0,
                },
            ],
        };
        let back = TuneTable::from_text(&t.to_text()).unwrap();
        assert_eq!(back.key, t.key);
        assert_eq!(back.fingerprint(), t.fingerprint());
        assert_eq!(back.lookup(100, false).unwrap().bytes, 1024);
        assert_eq!(back.lookup(1025, false).unwrap().bytes, 4096);
        assert_eq!(back.lookup(1 << 30, false).unwrap().bytes, 4096);
        assert_eq!(back.lookup(1 << 30, true).unwrap().algorithm, TWOSHOT_ZC);
        let broken = t
            .to_text()
            .replace("entry 4096 0 twoshot", "entry 4096 0 ring");
        assert!(TuneTable::from_text(&broken).is_err());
        assert!(TuneTable::from_text("hello")
            .unwrap_err()
            .to_string()
            .contains("line 1"));
    }

    #[test]
    fn agreement_takes_the_slowest_rank() {
        let h = 42;
        let a = times_message(h, &[5.0, 3.0, 4.0]);
        let b = times_message(h, &[5.0, 6.0, 4.5]);
        let (best, worst) = agree(&[a.clone(), b], h, 3).unwrap();
        assert_eq!(worst, vec![5.0, 6.0, 4.5]);
        assert_eq!(best, 2);
        let other = times_message(7, &[1.0, 1.0, 1.0]);
        assert!(agree(&[a.clone(), other], h, 3).is_err());
        assert!(agree(&[a], h, 2).is_err());
    }

    #[test]
    fn with_launch_rejects_what_the_kernels_cannot_run() {
        let c = caps();
        let s = shape(1 << 20, 4, &c, false);
        let base = TWOSHOT.plan(&s).unwrap();
        assert!(with_launch(base, &s, 133, 512).is_err());
        assert!(with_launch(base, &s, 0, 512).is_err());
        assert!(with_launch(base, &s, 8, 100).is_err());
        assert!(with_launch(base, &s, 8, 1024).is_err());
        assert_eq!(with_launch(base, &s, 8, 256).unwrap().config.grid[0], 8);
    }

    #[test]
    fn store_and_load() {
        let dir = std::env::temp_dir().join(format!("oxccl-tune-test-{}", std::process::id()));
        let key = TuneKey::new(&caps(), BackendKind::Host, 2, DataType::F32);
        let t = TuneTable {
            key: key.clone(),
            entries: vec![],
        };
        let p = store(&dir, &t).unwrap();
        assert!(p.ends_with(key.file_name()));
        assert_eq!(load(&dir, &key), Some(t));
        // A table of another build under the same file name is ignored, as is garbage.
        let mut other = key.clone();
        other.build = "elsewhere".into();
        let stale = TuneTable {
            key: other,
            entries: vec![],
        };
        std::fs::write(dir.join(key.file_name()), stale.to_text()).unwrap();
        assert_eq!(load(&dir, &key), None);
        std::fs::write(dir.join(key.file_name()), "garbage").unwrap();
        assert_eq!(load(&dir, &key), None);
        let _ = std::fs::remove_dir_all(dir);
    }
}
