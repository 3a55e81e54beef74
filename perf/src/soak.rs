//! `--soak SECONDS`: a long run of random collectives, every call checked bit for bit
//! against the host reference, with this process's resources sampled once a minute so a
//! leak shows as growth from the first minute to the last.
//!
//! Every rank draws the same sequence (collective, data type, op, size, placement, root)
//! from one seed that rank 0 chooses, so the ranks always make the same call; rank 0 also
//! decides when to stop, and the others follow at the same call. Sizes are drawn evenly
//! over the logarithm of the byte count between `-b` and `-e`, so small and large calls
//! both occur, and counts are rarely powers of two.
//!
//! Figures per sample (once a minute; `OXCCL_SOAK_SAMPLE_SECS` sets another period) and
//! rank: calls, wrong elements, a running checksum of every output
//! read back, resident host memory, open file descriptors, host memory mappings, and the
//! peer scratch mappings the communicator holds. The run fails on a wrong element, and
//! when descriptors or peer mappings differ between the first sample and the end, host
//! mappings grew by more than [`HOST_MAPPING_SLACK`], or resident memory by more than
//! [`RSS_SLACK_BYTES`]. Device memory is read
//! from outside the process (`ci/gpu/session.sh soak` samples `nvidia-smi`): the HAL has no
//! query for it.

use std::time::{Duration, Instant};

use oxccl_collectives::backend::AnyStream;
use oxccl_collectives::hal::{DataType, Error, Memory, ReduceOp, Result};
use oxccl_collectives::Communicator;
use serde::Serialize;

use crate::check::Expect;
use crate::collective::{Call, Collective, COLLECTIVES};
use crate::options::Options;
use crate::{check_once, Buffers, Host};

/// Growth of resident host memory from the first sample to the last that still counts as
/// flat: the allocator's arenas settle during the first minutes.
pub const RSS_SLACK_BYTES: u64 = 16 << 20;

/// Host memory mappings the last sample may have beyond the first: threads that come and
/// go (the bootstrap's, the proxy's) each hold a stack and a guard page while they live.
pub const HOST_MAPPING_SLACK: u64 = 8;

/// The data types the soak draws: every type oxccl serves.
const TYPES: [DataType; 15] = DataType::ALL;

/// The ops drawn for collectives that reduce.
const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod];

/// Send and receive bytes that hold any collective's buffers for sizes up to `max_bytes`
/// with any data type on `world` ranks.
pub fn buffer_bytes(max_bytes: usize, world: u32) -> Result<(usize, usize)> {
    let mut send = 0;
    let mut recv = 0;
    for c in COLLECTIVES {
        for t in TYPES {
            let s = c.shape(max_bytes, t, world)?;
            send = send.max(s.send_bytes);
            recv = recv.max(s.recv_bytes);
        }
    }
    Ok((send, recv))
}

/// splitmix64 (the input generator's mix): a small generator every rank runs from the same
/// seed.
#[derive(Debug, Clone)]
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        crate::check::mix(self.0)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A byte count between `lo` and `hi`, uniform in its logarithm.
    fn bytes(&mut self, lo: usize, hi: usize) -> usize {
        let (lo, hi) = (lo.max(1) as f64, hi.max(lo.max(1)) as f64);
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (lo * (hi / lo).powf(u)).round() as usize
    }
}

/// One call the soak makes.
#[derive(Debug, Clone, Copy)]
struct Pick {
    collective: &'static Collective,
    dtype: DataType,
    op: ReduceOp,
    bytes: usize,
    in_place: bool,
    root: u32,
}

fn pick(d: &mut Draw, opts: &Options, world: u32) -> Pick {
    let collective = COLLECTIVES[d.below(COLLECTIVES.len())];
    let dtype = TYPES[d.below(TYPES.len())];
    let op = OPS[d.below(OPS.len())];
    let bytes = d.bytes(opts.min_bytes, opts.max_bytes);
    let in_place = collective.has_in_place && d.below(2) == 1;
    let root = d.below(world as usize) as u32;
    Pick {
        collective,
        dtype,
        op,
        bytes,
        in_place,
        root,
    }
}

/// What one minute's sample holds (one rank).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Sample {
    /// Seconds since the soak started.
    pub at_seconds: u64,
    pub calls: u64,
    pub wrong: u64,
    pub checksum: u64,
    pub rss_bytes: u64,
    pub fds: u64,
    pub host_mappings: u64,
    pub peer_mappings: u64,
}

/// This process's resident memory, descriptors and mappings from /proc.
fn process_figures() -> Result<(u64, u64, u64)> {
    let os = |call: &'static str| move |e: std::io::Error| Error::Os { call, source: e };
    let status =
        std::fs::read_to_string("/proc/self/status").map_err(os("read /proc/self/status"))?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| Error::InvalidArgument("/proc/self/status has no VmRSS".into()))?;
    let fds = std::fs::read_dir("/proc/self/fd")
        .map_err(os("read /proc/self/fd"))?
        .count() as u64;
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(os("read /proc/self/maps"))?;
    Ok((rss_kib * 1024, fds, maps.lines().count() as u64))
}

/// This process's figures now, after `calls` calls.
fn sample(
    comm: &Communicator,
    at_seconds: u64,
    calls: u64,
    wrong: u64,
    checksum: u64,
) -> Result<Sample> {
    let (rss_bytes, fds, host_mappings) = process_figures()?;
    Ok(Sample {
        at_seconds,
        calls,
        wrong,
        checksum,
        rss_bytes,
        fds,
        host_mappings,
        peer_mappings: comm.peer_mappings() as u64,
    })
}

/// FNV-1a over the bytes, folded into `sum`.
fn fold(sum: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(sum, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether the last sample is flat against the first (see the module doc); the reasons
/// when not.
pub fn flat(first: &Sample, last: &Sample) -> std::result::Result<(), String> {
    let mut why = Vec::new();
    if last.fds != first.fds {
        why.push(format!("file descriptors {} -> {}", first.fds, last.fds));
    }
    if last.host_mappings > first.host_mappings + HOST_MAPPING_SLACK {
        why.push(format!(
            "host mappings {} -> {}",
            first.host_mappings, last.host_mappings
        ));
    }
    if last.peer_mappings != first.peer_mappings {
        why.push(format!(
            "peer mappings {} -> {}",
            first.peer_mappings, last.peer_mappings
        ));
    }
    if last.rss_bytes > first.rss_bytes + RSS_SLACK_BYTES {
        why.push(format!(
            "resident memory {} -> {} MiB",
            first.rss_bytes >> 20,
            last.rss_bytes >> 20
        ));
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(why.join(", "))
    }
}

/// The `--json` file of a soak (rank 0's samples and every rank's verdict).
#[derive(Debug, Serialize)]
struct Report<'a> {
    tool: &'static str,
    mode: &'static str,
    ranks: u32,
    device: String,
    seconds: u64,
    seed: u64,
    calls: u64,
    wrong: u64,
    flat_on_every_rank: bool,
    samples_rank0: &'a [Sample],
}

/// Runs the soak for `seconds`; true when every call matched and every rank stayed flat.
pub fn run(
    opts: &Options,
    comm: &Communicator,
    stream: &AnyStream,
    bufs: &Buffers,
    seconds: u64,
) -> Result<bool> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let boot = comm.bootstrap();
    // Rank 0's seed for everyone.
    let mine = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        .to_le_bytes();
    let seeds = boot.all_gather(&mine)?;
    let seed = seeds
        .first()
        .and_then(|b| b.get(..8))
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| Error::InvalidArgument("rank 0 sent no seed".into()))?;
    let mut draw = Draw(seed);
    let mut host = Host::default();
    // The largest buffers up front, so the host side allocates nothing while it runs.
    host.input.reserve(bufs.send.len());
    host.output.reserve(bufs.recv.len());
    if rank == 0 {
        println!(
            "# oxccl-perf soak: {world} ranks, {seconds} s of random collectives, types, ops and \
             sizes {}..{} bytes, every call checked; seed {seed:#x}",
            opts.min_bytes, opts.max_bytes
        );
    }
    let start = Instant::now();
    let deadline = Duration::from_secs(seconds);
    let (mut calls, mut wrong, mut checksum) = (0u64, 0u64, 0xcbf2_9ce4_8422_2325u64);
    let mut samples: Vec<Sample> = Vec::new();
    let period = Duration::from_secs(
        std::env::var("OXCCL_SOAK_SAMPLE_SECS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&v| v > 0)
            .unwrap_or(60),
    );
    let mut next_sample = period;
    loop {
        // Rank 0 decides whether another call is made; everyone follows.
        let go = [u8::from(rank != 0 || start.elapsed() < deadline)];
        let votes = boot.all_gather(&go)?;
        if votes.first().and_then(|v| v.first()) != Some(&1) {
            break;
        }
        let p = pick(&mut draw, opts, world);
        let c = p.collective;
        let shape = c.shape(p.bytes, p.dtype, world)?;
        let expect = Expect {
            dtype: p.dtype,
            op: p.op,
            accum: opts.accum,
            seed: seed ^ calls,
            world,
            count: shape.count,
            slots: (c.recv_slots)(world),
            rank,
            root: p.root,
            in_place: p.in_place,
        };
        host.input.resize(shape.send_bytes, 0);
        host.output.resize(shape.recv_bytes, 0);
        let call = |input, output| {
            let args = Call {
                input,
                output,
                count: shape.count,
                dtype: p.dtype,
                op: p.op,
                accum: opts.accum,
                root: p.root,
                stream,
            };
            // SAFETY: the buffers hold the largest call of any collective and type up to
            // `-e` (buffer_bytes) and outlive the stream's work (synchronized in
            // check_once and before they are dropped).
            unsafe { (c.oxccl)(comm, &args) }
        };
        let (_, _, verdict) = check_once(
            c,
            p.in_place,
            comm,
            stream,
            (bufs.send.ptr(), bufs.recv.ptr()),
            &mut host,
            &expect,
            &call,
            true,
        )
        .map_err(|e| {
            Error::InvalidArgument(format!(
                "soak call {calls} ({} {} {} {} bytes{}): {e}",
                c.name,
                p.dtype,
                p.op,
                p.bytes,
                if p.in_place { ", in place" } else { "" }
            ))
        })?;
        calls += 1;
        wrong += verdict.wrong as u64;
        checksum = fold(checksum, &host.output);
        if start.elapsed() >= next_sample {
            let s = sample(comm, next_sample.as_secs(), calls, wrong, checksum)?;
            println!(
                "# soak rank {rank} at {:>4} s: calls {:>8} wrong {} checksum {:016x} rss {} MiB \
                 fds {} host mappings {} peer mappings {}",
                s.at_seconds,
                s.calls,
                s.wrong,
                s.checksum,
                s.rss_bytes >> 20,
                s.fds,
                s.host_mappings,
                s.peer_mappings
            );
            samples.push(s);
            next_sample += period;
        }
    }
    // One last sample at the end, so even a short run compares a start and an end.
    let end = sample(comm, start.elapsed().as_secs(), calls, wrong, checksum)?;
    let first = samples.first().copied().unwrap_or(end);
    let verdict = flat(&first, &end);
    if let Err(why) = &verdict {
        eprintln!(
            "oxccl-perf: soak rank {rank}: not flat from {} s to the end: {why}",
            first.at_seconds
        );
    }
    samples.push(end);
    // Every rank's calls, wrong elements and flatness.
    let mut mine = Vec::with_capacity(17);
    mine.extend_from_slice(&calls.to_le_bytes());
    mine.extend_from_slice(&wrong.to_le_bytes());
    mine.push(u8::from(verdict.is_ok()));
    let all = boot.all_gather(&mine)?;
    let mut total_wrong = 0u64;
    let mut all_flat = true;
    for v in &all {
        let word = |i: usize| -> Result<u64> {
            v.get(8 * i..8 * i + 8)
                .and_then(|s| s.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| Error::InvalidArgument("short soak result from a rank".into()))
        };
        total_wrong += word(1)?;
        all_flat &= v.get(16) == Some(&1);
    }
    let ok = total_wrong == 0 && all_flat;
    if rank == 0 {
        println!(
            "# soak: {calls} calls in {:.0} s, {total_wrong} wrong elements on {world} ranks; \
             resources {} from {} s to the end",
            start.elapsed().as_secs_f64(),
            if all_flat {
                "flat on every rank"
            } else {
                "NOT flat"
            },
            first.at_seconds
        );
        println!(
            "# {}: soak {}",
            if ok { "PASS" } else { "FAIL" },
            if ok {
                "matched the reference at every call"
            } else {
                "failed (wrong results or growth above)"
            }
        );
        if let Some(path) = &opts.json {
            let report = Report {
                tool: "oxccl-perf",
                mode: "soak",
                ranks: world,
                device: oxccl_collectives::hal::Device::capabilities(comm.device())
                    .name
                    .clone(),
                seconds,
                seed,
                calls,
                wrong: total_wrong,
                flat_on_every_rank: all_flat,
                samples_rank0: &samples,
            };
            let text = serde_json::to_string_pretty(&report)
                .map_err(|e| Error::InvalidArgument(format!("JSON: {e}")))?;
            std::fs::write(path, text + "\n").map_err(|e| Error::Os {
                call: "write (--json)",
                source: e,
            })?;
        }
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(fds: u64, rss_mib: u64) -> Sample {
        Sample {
            at_seconds: 60,
            calls: 10,
            wrong: 0,
            checksum: 0,
            rss_bytes: rss_mib << 20,
            fds,
            host_mappings: 100,
            peer_mappings: 2,
        }
    }

    #[test]
    fn flat_allows_allocator_slack_but_no_new_descriptors_or_mappings() {
        assert!(flat(&sample(20, 100), &sample(20, 110)).is_ok());
        let e = flat(&sample(20, 100), &sample(21, 100)).unwrap_err();
        assert!(e.contains("file descriptors 20 -> 21"), "{e}");
        let e = flat(&sample(20, 100), &sample(20, 100 + 17)).unwrap_err();
        assert!(e.contains("resident memory 100 -> 117 MiB"), "{e}");
        let mut more = sample(20, 100);
        more.host_mappings = 100 + HOST_MAPPING_SLACK;
        assert!(flat(&sample(20, 100), &more).is_ok());
        more.peer_mappings = 3;
        more.host_mappings = 101 + HOST_MAPPING_SLACK;
        let e = flat(&sample(20, 100), &more).unwrap_err();
        assert!(
            e.contains("peer mappings 2 -> 3") && e.contains("host mappings 100 -> 109"),
            "{e}"
        );
    }

    #[test]
    fn every_rank_draws_the_same_calls_over_the_whole_range() {
        let opts = Options::parse(["-b", "1", "-e", "64M"].map(String::from)).unwrap();
        let (mut a, mut b) = (Draw(7), Draw(7));
        let mut seen_small = false;
        let mut seen_large = false;
        let mut collectives = std::collections::HashSet::new();
        for _ in 0..2000 {
            let (x, y) = (pick(&mut a, &opts, 4), pick(&mut b, &opts, 4));
            assert_eq!(
                (
                    x.collective.name,
                    x.dtype,
                    x.op,
                    x.bytes,
                    x.in_place,
                    x.root
                ),
                (
                    y.collective.name,
                    y.dtype,
                    y.op,
                    y.bytes,
                    y.in_place,
                    y.root
                )
            );
            assert!((1..=64 << 20).contains(&x.bytes), "{}", x.bytes);
            assert!(x.root < 4);
            seen_small |= x.bytes < 1024;
            seen_large |= x.bytes > 16 << 20;
            collectives.insert(x.collective.name);
            if x.in_place {
                assert!(x.collective.has_in_place, "{}", x.collective.name);
            }
        }
        assert!(seen_small && seen_large);
        assert_eq!(collectives.len(), COLLECTIVES.len());
    }

    #[test]
    fn buffers_hold_every_collective_and_type() {
        let (send, recv) = buffer_bytes(1000, 3).unwrap();
        for c in COLLECTIVES {
            for t in TYPES {
                let s = c.shape(1000, t, 3).unwrap();
                assert!(
                    s.send_bytes <= send && s.recv_bytes <= recv,
                    "{} {t}",
                    c.name
                );
            }
        }
    }

    #[test]
    fn process_figures_are_read() {
        let (rss, fds, maps) = process_figures().unwrap();
        assert!(rss > 0 && fds > 0 && maps > 0);
    }
}
