//! Picks the algorithm for a call: a tuned table's entry, else by collective, size, world
//! size, registration and capability, unless `OXCCL_ALGO` forces one for the call's
//! collective. Ranks on several nodes (or a forced PortChannel algorithm, which says they
//! may be) take their collective's algorithm that maps no peer memory, found by iterating
//! the descriptors; a collective without one is refused. Every decision is a
//! `tracing::debug!` event with its reason.

use oxccl_hal::{Error, Result};

use crate::algorithms::all_gather::{
    direct::ALLGATHER_DIRECT, one_shot::ALLGATHER_ONESHOT_LL, staged::ALLGATHER_STAGED,
};
use crate::algorithms::all_reduce::one_shot::ONESHOT_LL;
use crate::algorithms::all_reduce::one_shot_ll128::ONESHOT_LL128;
use crate::algorithms::all_reduce::two_shot_push::TWOSHOT_PUSH;
use crate::algorithms::all_reduce::two_shot_zc::TWOSHOT_ZC;
use crate::algorithms::all_to_all::{
    copy_engine::ALLTOALL_COPY, direct::ALLTOALL_DIRECT, one_shot::ALLTOALL_ONESHOT_LL,
    staged::ALLTOALL_STAGED,
};
use crate::algorithms::all_to_all_v::{
    copy::ALLTOALLV_COPY, direct::ALLTOALLV_DIRECT, one_shot::ALLTOALLV_ONESHOT_LL,
    staged::ALLTOALLV_STAGED,
};
use crate::algorithms::broadcast::{
    copy_engine::BROADCAST_COPY, direct::BROADCAST_DIRECT, one_shot::BROADCAST_ONESHOT_LL,
    relay::BROADCAST_RELAY, staged::BROADCAST_STAGED,
};
use crate::algorithms::reduce::{
    copy::REDUCE_COPY, direct::REDUCE_DIRECT, one_shot::REDUCE_ONESHOT_LL, relay::REDUCE_RELAY,
    staged::REDUCE_STAGED,
};
use crate::algorithms::reduce_scatter::{
    direct::REDUCESCATTER_DIRECT, one_shot::REDUCESCATTER_ONESHOT_LL, staged::REDUCESCATTER_STAGED,
};
use crate::algorithms::{Algorithm, CallShape, Collective, Forced, Plan};
use crate::tuner::{self, TuneTable};

/// Environment variable that forces algorithms by name, at most one per collective,
/// comma-separated (see [`crate::algorithms`]).
pub const ALGO_VAR: &str = "OXCCL_ALGO";
/// Environment variable with the largest message (bytes per rank) one-shot serves.
pub const ONESHOT_MAX_VAR: &str = "OXCCL_ONESHOT_MAX_BYTES";
/// Environment variable: on registered buffers, messages above this many bytes per rank
/// take the zero-copy two-shot (at or below it, one-shot).
pub const ZC_THRESHOLD_VAR: &str = "OXCCL_ZC_THRESHOLD_BYTES";

/// Default zero-copy threshold in bytes per rank (registered buffers): the zero-copy
/// two-shot moves each byte over NVLink twice with no staging copy, its fixed cost is two
/// per-block barriers; one-shot moves `world - 1` LL copies (twice the bytes) in one step.
pub fn default_zc_threshold(world_size: u32) -> usize {
    match world_size {
        // 2 H200s, tuned with LL128: one-shot up to 2 MiB, push above.
        0..=2 => 2 << 20,
        // 4 H200s with LL128 (2026-11-27): one-shot up to 512 KiB (8.99 us against the
        // two-shots' 11.11-11.64), push from 1 MiB (13.72 against 16.15).
        3..=4 => 512 << 10,
        _ => 32 << 10,
    }
}

/// Default one-shot threshold in bytes per rank: one-shot moves `world - 1` copies of the
/// whole message (doubled by the LL flags) into every GPU, two-shot about two; the more
/// ranks, the earlier two-shot's bandwidth wins over one-shot's single step.
pub fn default_oneshot_max(world_size: u32) -> usize {
    match world_size {
        // 2 H200s, tuned with LL128: one-shot up to 2 MiB, push from 4 MiB.
        0..=2 => 2 << 20,
        // 4 H200s with LL128 (2026-11-27, `session.sh perf` sweeps): one-shot up to 512 KiB
        // (registered or not), push above.
        3..=4 => 512 << 10,
        _ => 128 << 10,
    }
}

/// Without a tuned table, the two-shot for registered calls above the zero-copy
/// threshold. 2 H200s (tuned): zero-copy wins up to 2 MiB, push from 4 MiB. 4 H200s
/// (tuned): push at every size from 512 KiB, zero-copy never clearly ahead; more ranks
/// (not measured) follow the 4-rank finding. Unregistered calls above the one-shot
/// threshold take push at every size: it beat the staging two-shot at every size measured.
pub fn registered_two_shot(world_size: u32, bytes: usize) -> Algorithm {
    if world_size <= 2 && bytes <= ZC_MAX_BYTES_2_RANKS {
        TWOSHOT_ZC
    } else {
        TWOSHOT_PUSH
    }
}

/// The one-shot for a call: LL128 lines on up to 4 ranks where the backend has them (2
/// H200s, tuned: LL128 at or ahead of LL16 at every size from 1 KB, 1.75x less NVLink
/// traffic; 1 MB 10.9 us against LL16's 15.1; 4 H200s: 3.54 against 3.84 us at 1 KB, 6.30
/// against 12.94 at 256 KB, 16.15 against 33.69 at 1 MB), else LL16 packets (more ranks:
/// LL128 not measured there, the tuner tries it).
fn one_shot(shape: &CallShape<'_>) -> Result<(Algorithm, Plan)> {
    if shape.world_size <= 4 {
        if let Ok(plan) = ONESHOT_LL128.plan(shape) {
            return Ok((ONESHOT_LL128, plan));
        }
    }
    Ok((ONESHOT_LL, ONESHOT_LL.plan(shape)?))
}

/// The largest message (bytes per rank: an all-gather input, a reduce-scatter output, an
/// all-to-all chunk, a broadcast or reduce buffer) the one-shots of the other collectives
/// take by default. 2 H100s (`session.sh collsweep`, graph replay, bf16): the one-shot led
/// the direct kernels at every size up to its packet capacity of 2 MiB per rank, e.g.
/// all-gather 10.5 against 15.0 us at 1 MiB per rank and 17.1 against 18.2 at 2 MiB,
/// broadcast 14.2 against 17.7 at 2 MiB; so 2 ranks keep it up to 2 MiB (where its packets
/// fit). All-gather is the exception: on 2 H200s its direct kernel took 13.35 us at 2 MiB
/// per rank against the one-shot's 18.17 (10.84 against 10.73 at 1 MiB), so it hands over
/// above 1 MiB, which costs 6% at 2 MiB on H100s. More ranks move `world - 1` copies and
/// keep the 256 KiB that the allreduce one-shot held on 4 H200s, but reduce on 3-4 ranks,
/// whose one-shot took 11.1 us at 512 KiB on 4 H100s against `reduce_direct`'s 12.6-13.5
/// (`results/2026-11-27-late-h100x4-*`; its senders write and leave, the root reads).
pub fn collective_oneshot_max(collective: Collective, world_size: u32) -> usize {
    match (collective, world_size) {
        (Collective::AllGather, 0..=2) => 1 << 20,
        (_, 0..=2) => 2 << 20,
        (Collective::Reduce, 3..=4) => 512 << 10,
        _ => 256 << 10,
    }
}

/// The largest message (bytes per rank, as [`collective_oneshot_max`]) the one-shot takes
/// when the buffers are registered, so that a direct kernel could serve the call instead.
/// Since the direct kernels' first barrier is relaxed and the others lost their extra
/// fence (2026-11-27), their floor is 4.0-5.8 us instead of about 10 (2 and 4 H200s,
/// `session.sh collsweep`, graph replay, bf16), and they overtake the one-shot well below
/// its capacity: on 2 ranks all-gather at 256 KiB per rank (5.07 against 6.40 us), the
/// all-to-alls at 512 KiB per chunk (6.13 against 6.42), broadcast and reduce above 1 MiB
/// (broadcast 7.87 against 7.96 at 1 MiB, 10.65 against 14.66 at 2 MiB); on 4 ranks
/// all-gather at 128 KiB per rank (5.58 against 6.60) and the all-to-alls at 256 KiB per
/// chunk (7.03 against 8.22). Reduce-scatter's one-shot was not measured against the new
/// direct kernel, so it keeps its threshold; so do 4-rank broadcast and reduce (level at
/// 256 KiB). Unregistered calls keep the one-shot up to [`collective_oneshot_max`]: the
/// staged kernels copy twice.
pub fn registered_oneshot_max(collective: Collective, world_size: u32) -> usize {
    let registered = match (collective, world_size) {
        (Collective::AllGather, 0..=2) => 128 << 10,
        (Collective::AllGather, _) => 64 << 10,
        (Collective::AllToAll | Collective::AllToAllV, 0..=2) => 256 << 10,
        (Collective::AllToAll | Collective::AllToAllV, _) => 128 << 10,
        (Collective::Broadcast | Collective::Reduce, 0..=2) => 1 << 20,
        _ => usize::MAX,
    };
    registered.min(collective_oneshot_max(collective, world_size))
}

/// On more than 2 ranks, the largest registered broadcast `broadcast_direct` takes; above
/// it `broadcast_relay` (4 H200s: direct 9.02 against relay 10.23 us at 512 KiB, relay
/// 13.06 against 14.03 at 1 MiB and 17.71 against 22.93 at 2 MiB: the relay's extra
/// barrier costs more than the root's link saves until then).
pub const BROADCAST_DIRECT_MAX_BYTES: usize = 512 << 10;

/// On more than 2 ranks, the largest registered reduce `reduce_direct` takes; above it
/// `reduce_relay` (4 H200s: `reduce_direct` 11.45 us at 512 KiB against NCCL's 8.02, and
/// 0.32-0.37x NCCL from 16 MB, where its root's link carries every peer's input).
pub const REDUCE_DIRECT_MAX_BYTES: usize = 512 << 10;

/// The copy-lane algorithm ([`crate::algorithms::copy_lane`]: the peers' copies on a
/// second stream, this rank's own on the caller's) the selector takes for a collective on
/// registered buffers, and the smallest message (bytes per rank, as
/// [`collective_oneshot_max`]) it takes it from. Only on 2 ranks: with more, one rank's
/// copies to its peers follow each other on one stream, one link at a time. Measured on 2
/// GPUs (graph replay, bf16):
/// - broadcast: the root's copy engine moved 1 GiB in 2.72-2.76 ms in place and out of
///   place (its local copy by the SMs beside it) against `broadcast_direct`'s 3.11 and
///   NCCL's 2.93-2.94 (2 H200s); 64 MiB out of place 185 against 189 us.
/// - all-to-all: the copy engine for the peer's chunk 1388 against `alltoall_direct`'s 1608
///   us at 1 GiB, 361 against 410 at 256 MiB, 105 against 102 at 64 MiB (2 H200s; the copy
///   kernel instead: 1489, 380, 101): from 64 MiB per chunk (128 MiB buffers).
/// - all_to_all_v: 1042 against `alltoallv_direct`'s 1305 us at 1 GiB, 80 against 88 at
///   64 MiB (2 H200s), 26.2 against 27.3 at 16 MiB (copy kernels, H100): from 16 MiB
///   largest chunks.
/// - reduce: `reduce_copy` (the copy engine's pull beside the local reduce; out of place
///   into the output in shrinking chunks) 2769-2776 against `reduce_direct`'s 3085 us at
///   1 GiB, 731-737 against 774 at 256 MiB, 388-394 against 390 at 128 MiB, 214 against
///   192 at 64 MiB; in place (two staging slots) 767 against 774 at 256 MiB (2 H200s):
///   from 256 MiB.
pub fn copy_lane_min(collective: Collective, world_size: u32) -> Option<(Algorithm, usize)> {
    match (collective, world_size) {
        (Collective::Broadcast, 2) => Some((BROADCAST_COPY, 64 << 20)),
        (Collective::AllToAll, 2) => Some((ALLTOALL_COPY, 64 << 20)),
        (Collective::AllToAllV, 2) => Some((ALLTOALLV_COPY, 16 << 20)),
        (Collective::Reduce, 2) => Some((REDUCE_COPY, 256 << 20)),
        _ => None,
    }
}

/// On 2 ranks, the largest registered message (bytes per rank) the zero-copy two-shot takes.
pub const ZC_MAX_BYTES_2_RANKS: usize = 2 << 20;

/// The selector's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selector {
    /// The algorithm every call of a collective must use (`OXCCL_ALGO`).
    pub forced: Forced,
    /// Largest message one-shot serves when nothing is forced.
    pub oneshot_max_bytes: usize,
    /// On registered buffers: largest message one-shot serves; above, `twoshot_zc`.
    pub zc_threshold_bytes: usize,
}

/// A decision and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Its launch.
    pub plan: Plan,
    /// Why it was chosen.
    pub reason: String,
}

impl Selector {
    /// Chooses for a call. A forced algorithm that cannot serve the call is an error (never
    /// a silent fallback: ranks must agree, and a test that forces one must get it).
    pub fn choose(&self, shape: &CallShape<'_>) -> Result<Choice> {
        self.choose_tuned(shape, None)
    }

    /// Chooses for a call, preferring a tuned table's entry (when one applies and its
    /// algorithm can serve the call) over the size thresholds; `OXCCL_ALGO` wins over both.
    pub fn choose_tuned(&self, shape: &CallShape<'_>, table: Option<&TuneTable>) -> Result<Choice> {
        let forced = self.forced.of(shape.collective);
        let port_forced = self.forced.iter().any(|f| !f.descriptor().maps_peers);
        let across = shape.multi_node || port_forced;
        let tuned = if forced.is_none() && shape.world_size > 1 && !across {
            table.and_then(|t| Self::from_table(shape, t))
        } else {
            None
        };
        let choice = if let Some(choice) = tuned {
            choice
        } else if let Some(algorithm) = forced {
            if shape.multi_node && algorithm.descriptor().maps_peers {
                return Err(Error::Unsupported(format!(
                    "{}: {algorithm} (forced by {ALGO_VAR}) maps peer memory, which needs every \
                     rank on one node; the ranks are on several nodes ({})",
                    shape.collective,
                    oxccl_channels::registered_memory::SEPARATE_HOSTS_VAR
                )));
            }
            Choice {
                algorithm,
                plan: algorithm.plan(shape)?,
                reason: format!("forced by {ALGO_VAR}"),
            }
        } else if across {
            Self::across_nodes(shape, port_forced)?
        } else {
            match shape.collective {
                Collective::AllReduce => self.all_reduce(shape)?,
                Collective::AllGather => Self::one_shot_direct_staged(
                    shape,
                    [ALLGATHER_ONESHOT_LL, ALLGATHER_DIRECT, ALLGATHER_STAGED],
                )?,
                Collective::AllToAll => Self::one_shot_direct_staged(
                    shape,
                    [ALLTOALL_ONESHOT_LL, ALLTOALL_DIRECT, ALLTOALL_STAGED],
                )?,
                // On more than 2 ranks large broadcasts relay through the peers: the direct
                // kernel moves every byte through the root's link once per peer.
                Collective::Broadcast => Self::one_shot_direct_staged(
                    shape,
                    [
                        BROADCAST_ONESHOT_LL,
                        if shape.world_size > 2 && shape.bytes > BROADCAST_DIRECT_MAX_BYTES {
                            BROADCAST_RELAY
                        } else {
                            BROADCAST_DIRECT
                        },
                        BROADCAST_STAGED,
                    ],
                )?,
                // On more than 2 ranks large reduces relay through the peers: the direct
                // kernel moves every peer's input through the root's link.
                Collective::Reduce => Self::one_shot_direct_staged(
                    shape,
                    [
                        REDUCE_ONESHOT_LL,
                        if shape.world_size > 2 && shape.bytes > REDUCE_DIRECT_MAX_BYTES {
                            REDUCE_RELAY
                        } else {
                            REDUCE_DIRECT
                        },
                        REDUCE_STAGED,
                    ],
                )?,
                Collective::AllToAllV => Self::one_shot_direct_staged(
                    shape,
                    [ALLTOALLV_ONESHOT_LL, ALLTOALLV_DIRECT, ALLTOALLV_STAGED],
                )?,
                Collective::ReduceScatter => Self::one_shot_direct_staged(
                    shape,
                    [
                        REDUCESCATTER_ONESHOT_LL,
                        REDUCESCATTER_DIRECT,
                        REDUCESCATTER_STAGED,
                    ],
                )?,
            }
        };
        tracing::debug!(
            collective = %shape.collective,
            algorithm = %choice.algorithm,
            bytes = shape.bytes,
            world_size = shape.world_size,
            grid = choice.plan.config.grid[0],
            block = choice.plan.config.block[0],
            reason = %choice.reason,
            "algorithm"
        );
        Ok(choice)
    }

    /// The policy across nodes: the collective's algorithm that maps no peer memory (its
    /// PortChannel algorithm), or why there is none.
    fn across_nodes(shape: &CallShape<'_>, port_forced: bool) -> Result<Choice> {
        let why = if shape.multi_node {
            format!(
                "the ranks are on several nodes (or {}=1 made every process its own node)",
                oxccl_channels::registered_memory::SEPARATE_HOSTS_VAR
            )
        } else if port_forced {
            format!("a PortChannel algorithm is forced ({ALGO_VAR}), so the ranks may be on several nodes")
        } else {
            "the ranks are on one node".into()
        };
        let Some(algorithm) = Algorithm::of(shape.collective).find(|a| !a.descriptor().maps_peers)
        else {
            return Err(Error::Unsupported(format!(
                "{}: {why}, and {} has no multi-node algorithm yet (every one of its \
                 algorithms maps peer memory, which needs one node)",
                shape.collective, shape.collective
            )));
        };
        Ok(Choice {
            algorithm,
            plan: algorithm.plan(shape)?,
            reason: format!("{why}: the PortChannel algorithm"),
        })
    }

    /// The allreduce policy: one-shot up to its threshold (LL128 where it can), the
    /// registered two-shots above the zero-copy threshold, else the push two-shot.
    fn all_reduce(&self, shape: &CallShape<'_>) -> Result<Choice> {
        Ok(if shape.world_size == 1 {
            Choice {
                algorithm: ONESHOT_LL,
                plan: ONESHOT_LL.plan(shape)?,
                reason: "one rank: a local copy".into(),
            }
        } else if shape.zero_copy && shape.bytes > self.zc_threshold_bytes {
            let algorithm = registered_two_shot(shape.world_size, shape.bytes);
            Choice {
                algorithm,
                plan: algorithm.plan(shape)?,
                reason: format!(
                    "registered buffers, {} bytes > zero-copy threshold {} ({} on {} ranks)",
                    shape.bytes, self.zc_threshold_bytes, algorithm, shape.world_size
                ),
            }
        } else if shape.bytes <= self.oneshot_max_bytes || shape.zero_copy {
            match one_shot(shape) {
                Ok((algorithm, plan)) => Choice {
                    algorithm,
                    plan,
                    reason: if shape.zero_copy {
                        format!(
                            "registered buffers, {} bytes <= zero-copy threshold {}",
                            shape.bytes, self.zc_threshold_bytes
                        )
                    } else {
                        format!(
                            "{} bytes <= one-shot threshold {}",
                            shape.bytes, self.oneshot_max_bytes
                        )
                    },
                },
                Err(e) => {
                    let algorithm = if shape.zero_copy {
                        registered_two_shot(shape.world_size, shape.bytes)
                    } else {
                        TWOSHOT_PUSH
                    };
                    Choice {
                        algorithm,
                        plan: algorithm.plan(shape)?,
                        reason: format!("one-shot cannot serve it ({e})"),
                    }
                }
            }
        } else {
            Choice {
                algorithm: TWOSHOT_PUSH,
                plan: TWOSHOT_PUSH.plan(shape)?,
                reason: format!(
                    "{} bytes > one-shot threshold {}",
                    shape.bytes, self.oneshot_max_bytes
                ),
            }
        })
    }

    /// The policy of every collective but allreduce: the one-shot up to
    /// [`collective_oneshot_max`] (where its packets fit), above it the direct kernel on
    /// registered buffers, else the staged one. For all_to_all_v `shape.bytes` is the
    /// layout's largest chunk, the same on every rank, so every rank chooses alike (the
    /// copy-engine `alltoallv_copy` only when forced).
    fn one_shot_direct_staged(
        shape: &CallShape<'_>,
        [one_shot, direct, staged]: [Algorithm; 3],
    ) -> Result<Choice> {
        let choose = |algorithm: Algorithm, reason: String| -> Result<Choice> {
            Ok(Choice {
                algorithm,
                plan: algorithm.plan(shape)?,
                reason,
            })
        };
        if shape.world_size == 1 {
            return choose(one_shot, "one rank: a local copy".into());
        }
        let oneshot_max = if shape.zero_copy {
            registered_oneshot_max(shape.collective, shape.world_size)
        } else {
            collective_oneshot_max(shape.collective, shape.world_size)
        };
        if shape.bytes <= oneshot_max {
            if let Ok(plan) = one_shot.plan(shape) {
                return Ok(Choice {
                    algorithm: one_shot,
                    plan,
                    reason: format!(
                        "{} bytes <= one-shot threshold {oneshot_max}{}",
                        shape.bytes,
                        if shape.zero_copy { " (registered)" } else { "" }
                    ),
                });
            }
        }
        if shape.zero_copy {
            if let Some((copy, min)) = copy_lane_min(shape.collective, shape.world_size) {
                if shape.bytes >= min {
                    return choose(
                        copy,
                        format!(
                            "registered buffers, {} bytes >= copy-lane threshold {min} on {} ranks",
                            shape.bytes, shape.world_size
                        ),
                    );
                }
            }
            return choose(direct, format!("registered buffers, {} bytes", shape.bytes));
        }
        choose(
            staged,
            format!("unregistered buffers, {} bytes", shape.bytes),
        )
    }
}

impl Selector {
    fn from_table(shape: &CallShape<'_>, table: &TuneTable) -> Option<Choice> {
        let e = table.lookup(shape.bytes, shape.zero_copy)?;
        if e.algorithm.collective() != shape.collective {
            return None;
        }
        let plan = e
            .algorithm
            .plan(shape)
            .and_then(|p| tuner::with_launch(p, shape, e.grid, e.block))
            .ok()?;
        Some(Choice {
            algorithm: e.algorithm,
            plan,
            reason: format!(
                "tuned: {} x {} at {} bytes{} took {:.2} us",
                e.grid,
                e.block,
                e.bytes,
                if e.registered { " (registered)" } else { "" },
                e.us
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_hal::{Capabilities, DataType};

    fn shape(bytes: usize, world: u32, caps: &Capabilities) -> CallShape<'_> {
        CallShape {
            collective: Collective::AllReduce,
            count: bytes / 2,
            dtype: DataType::Bf16,
            bytes,
            world_size: world,
            caps,
            packet_half_bytes: 1 << 24,
            ll128_half_bytes: 1 << 24,
            nvlink: true,
            multi_node: false,
            host: false,
            zero_copy: false,
        }
    }

    #[test]
    fn by_size_and_forced() {
        let caps = Capabilities {
            multiprocessors: 132,
            ..Capabilities::default()
        };
        let s = Selector {
            forced: Forced::NONE,
            oneshot_max_bytes: 256 << 10,
            zc_threshold_bytes: 64 << 10,
        };
        // Up to 4 ranks the one-shot is LL128 where the backend has it; more take LL16.
        assert_eq!(
            s.choose(&shape(1024, 4, &caps)).unwrap().algorithm,
            ONESHOT_LL128
        );
        assert_eq!(
            s.choose(&shape(1024, 8, &caps)).unwrap().algorithm,
            ONESHOT_LL
        );
        assert_eq!(
            s.choose(&shape(1 << 20, 4, &caps)).unwrap().algorithm,
            TWOSHOT_PUSH
        );
        assert_eq!(
            s.choose(&shape(1 << 30, 1, &caps)).unwrap().algorithm,
            ONESHOT_LL
        );
        let c = s.choose(&shape(1 << 30, 8, &caps)).unwrap();
        assert_eq!(c.plan.config.grid[0], 132); // the whole chip
        let forced = Selector {
            forced: ONESHOT_LL.into(),
            ..s
        };
        let e = forced.choose(&shape(1 << 30, 8, &caps)).unwrap_err();
        assert!(e.to_string().contains("packet scratch"), "{e}");
        let mut reg = shape(1 << 20, 2, &caps);
        reg.zero_copy = true;
        assert_eq!(s.choose(&reg).unwrap().algorithm, TWOSHOT_ZC);
        reg.world_size = 4;
        assert_eq!(s.choose(&reg).unwrap().algorithm, TWOSHOT_PUSH);
        reg.bytes = 64 << 20;
        assert_eq!(s.choose(&reg).unwrap().algorithm, TWOSHOT_PUSH);
        reg.bytes = 64 << 10;
        assert_eq!(s.choose(&reg).unwrap().algorithm, ONESHOT_LL128);
        reg.bytes = 1 << 30;
        assert!(forced
            .choose(&reg)
            .unwrap_err()
            .to_string()
            .contains("packet"));
        // Two ranks take LL128 lines where the backend has them, LL16 on ROCm.
        let two = Selector {
            oneshot_max_bytes: default_oneshot_max(2),
            zc_threshold_bytes: default_zc_threshold(2),
            ..s
        };
        let mut sh = shape(1 << 20, 2, &caps);
        sh.ll128_half_bytes =
            2 * crate::algorithms::all_reduce::one_shot_ll128::slot_bytes(2 << 20);
        assert_eq!(two.choose(&sh).unwrap().algorithm, ONESHOT_LL128);
        let rocm = Capabilities {
            backend: Some(oxccl_hal::BackendKind::Rocm),
            ..caps.clone()
        };
        sh.caps = &rocm;
        assert_eq!(two.choose(&sh).unwrap().algorithm, ONESHOT_LL);
        sh.caps = &caps;
        sh.nvlink = false; // PCIe peers: LL16
        assert_eq!(two.choose(&sh).unwrap().algorithm, ONESHOT_LL);
        let nvls = Selector {
            forced: crate::algorithms::all_reduce::nvls::NVLS.into(),
            ..s
        };
        assert!(nvls.choose(&shape(1024, 4, &caps)).is_err());
    }

    #[test]
    fn across_nodes_each_collective_takes_its_port_channel_algorithm() {
        use crate::algorithms::all_gather::port_channel::ALLGATHER_PORT;
        use crate::algorithms::all_reduce::port_channel::PORT_CHANNEL;
        use crate::algorithms::reduce_scatter::port_channel::REDUCESCATTER_PORT;
        let caps = Capabilities {
            multiprocessors: 132,
            ..Capabilities::default()
        };
        let s = Selector {
            forced: Forced::NONE,
            oneshot_max_bytes: 256 << 10,
            zc_threshold_bytes: 64 << 10,
        };
        for bytes in [16, 1 << 20, 1 << 30] {
            for zero_copy in [false, true] {
                for (c, want) in [
                    (Collective::AllReduce, Some(PORT_CHANNEL)),
                    (Collective::AllGather, Some(ALLGATHER_PORT)),
                    (Collective::ReduceScatter, Some(REDUCESCATTER_PORT)),
                    (Collective::AllToAll, None),
                    (Collective::Broadcast, None),
                    (Collective::Reduce, None),
                ] {
                    let mut sh = shape(bytes, 4, &caps);
                    sh.collective = c;
                    sh.zero_copy = zero_copy;
                    // One node: never a PortChannel algorithm unless forced.
                    let local = s.choose(&sh).map(|x| x.algorithm);
                    assert!(local.is_ok_and(|a| a.descriptor().maps_peers), "{c}");
                    sh.multi_node = true;
                    match (s.choose(&sh), want) {
                        (Ok(choice), Some(a)) => {
                            assert_eq!(choice.algorithm, a);
                            assert!(choice.reason.contains("several nodes"), "{}", choice.reason);
                        }
                        (Err(e), None) => {
                            let e = e.to_string();
                            assert!(
                                e.contains(&c.to_string())
                                    && e.contains("no multi-node algorithm")
                                    && e.contains("OXCCL_SEPARATE_HOSTS"),
                                "{e}"
                            );
                        }
                        (other, _) => panic!("{c}: {other:?}"),
                    }
                }
            }
        }
        // A forced algorithm that maps peer memory cannot serve ranks on several nodes.
        let forced = Selector {
            forced: TWOSHOT_PUSH.into(),
            ..s
        };
        let mut sh = shape(1 << 20, 2, &caps);
        sh.multi_node = true;
        let e = forced.choose(&sh).unwrap_err().to_string();
        assert!(
            e.contains("twoshot_push") && e.contains("several nodes"),
            "{e}"
        );
        // Forcing a PortChannel algorithm on one node makes the other collectives take
        // theirs (the ranks may be on several nodes), and refuses the ones without.
        let port = Selector {
            forced: PORT_CHANNEL.into(),
            ..s
        };
        let mut sh = shape(1000, 2, &caps);
        sh.collective = Collective::AllGather;
        assert_eq!(port.choose(&sh).unwrap().algorithm, ALLGATHER_PORT);
        sh.collective = Collective::AllToAll;
        let e = port.choose(&sh).unwrap_err().to_string();
        assert!(
            e.contains("forced") && e.contains("no multi-node algorithm"),
            "{e}"
        );
    }

    #[test]
    fn one_shot_thresholds_of_the_other_collectives() {
        let caps = Capabilities::default();
        let s = Selector {
            forced: Forced::NONE,
            oneshot_max_bytes: 256 << 10,
            zc_threshold_bytes: 256 << 10,
        };
        // (collective, world, registered, largest one-shot bytes per rank): unregistered,
        // all-gather hands over above 1 MiB on 2 ranks (2 H200s), the others above 2 MiB,
        // more ranks above 256 KiB; registered, the direct kernels take over earlier.
        for (c, world, registered, max) in [
            (Collective::AllGather, 2, false, 1usize << 20),
            (Collective::ReduceScatter, 2, false, 2 << 20),
            (Collective::AllToAll, 2, false, 2 << 20),
            (Collective::AllGather, 4, false, 256 << 10),
            (Collective::Broadcast, 8, false, 256 << 10),
            (Collective::AllGather, 2, true, 128 << 10),
            (Collective::AllGather, 4, true, 64 << 10),
            (Collective::AllToAll, 2, true, 256 << 10),
            (Collective::AllToAll, 4, true, 128 << 10),
            (Collective::Broadcast, 2, true, 1 << 20),
            (Collective::Reduce, 2, true, 1 << 20),
            (Collective::ReduceScatter, 2, true, 2 << 20),
            (Collective::Broadcast, 8, true, 256 << 10),
            (Collective::Reduce, 4, true, 512 << 10),
            (Collective::Reduce, 3, false, 512 << 10),
            (Collective::Reduce, 8, true, 256 << 10),
        ] {
            for (bytes, one_shot) in [(max, true), (max + 2, false)] {
                let mut sh = shape(bytes, world, &caps);
                sh.collective = c;
                sh.zero_copy = registered;
                let choice = s.choose(&sh).unwrap();
                assert_eq!(
                    choice.algorithm.name().contains("oneshot"),
                    one_shot,
                    "{c} on {world} ranks, {bytes} bytes, registered {registered}: {choice:?}"
                );
            }
        }
        // Registered broadcasts on more than 2 ranks: direct, then the relay.
        for (bytes, want) in [
            (BROADCAST_DIRECT_MAX_BYTES, BROADCAST_DIRECT),
            (BROADCAST_DIRECT_MAX_BYTES + 2, BROADCAST_RELAY),
        ] {
            let mut sh = shape(bytes, 4, &caps);
            sh.collective = Collective::Broadcast;
            sh.zero_copy = true;
            assert_eq!(s.choose(&sh).unwrap().algorithm, want, "{bytes} bytes");
        }
        // Registered reduces: direct, then the relay on more than 2 ranks (2 ranks: direct,
        // above the one-shot, then the copy lane from its threshold, checked below; 3-4
        // ranks keep the one-shot up to where the relay starts).
        for (bytes, world, want) in [
            (REDUCE_DIRECT_MAX_BYTES, 8, REDUCE_DIRECT),
            (REDUCE_DIRECT_MAX_BYTES, 4, REDUCE_ONESHOT_LL),
            (REDUCE_DIRECT_MAX_BYTES + 2, 4, REDUCE_RELAY),
            (1 << 30, 3, REDUCE_RELAY),
            (4 << 20, 2, REDUCE_DIRECT),
        ] {
            let mut sh = shape(bytes, world, &caps);
            sh.collective = Collective::Reduce;
            sh.zero_copy = true;
            assert_eq!(
                s.choose(&sh).unwrap().algorithm,
                want,
                "{bytes} bytes on {world}"
            );
        }
        // Registered large calls on 2 ranks: the copy lane from its threshold; on more ranks
        // and unregistered, never.
        for c in [
            Collective::Broadcast,
            Collective::AllToAll,
            Collective::AllToAllV,
            Collective::Reduce,
        ] {
            let Some((copy, min)) = copy_lane_min(c, 2) else {
                panic!("{c} has a copy-lane threshold on 2 ranks");
            };
            for (bytes, world, registered, wants_copy) in [
                (min - 2, 2, true, false),
                (min, 2, true, true),
                (min, 4, true, false),
                (min, 2, false, false),
            ] {
                let mut sh = shape(bytes, world, &caps);
                sh.collective = c;
                sh.zero_copy = registered;
                let choice = s.choose(&sh).unwrap();
                assert_eq!(
                    choice.algorithm == copy,
                    wants_copy,
                    "{c} on {world} ranks, {bytes} bytes, registered {registered}: {choice:?}"
                );
            }
        }
        assert_eq!(copy_lane_min(Collective::AllReduce, 2), None);
    }
}
