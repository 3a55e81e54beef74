//! The allreduce algorithm collection: each algorithm is a named entry that says which
//! sizes, world sizes and capabilities it serves and how it is launched.
//!
//! | name | kernel | serves |
//! |---|---|---|
//! | `oneshot_ll` | `allreduce_oneshot_ll` | small messages (latency): every rank writes its input as LL16 packets into every peer's scratch, then reduces all ranks' packets locally; one kernel, no barrier |
//! | `oneshot_ll128` | `allreduce_oneshot_ll128` | the one-shot with 128-byte lines (7 data units + a flag) instead of 16-byte packets: 1.75x less NVLink traffic, CUDA only |
//! | `twoshot` | `allreduce_twoshot` | medium and large on unregistered buffers: reduce-scatter then all-gather through the staging buffers, per-block barriers between the phases |
//! | `twoshot_zc` | `allreduce_twoshot_zc` | medium and large on registered buffers ([`crate::Communicator::register`]): reduce-scatter reads the peers' inputs, all-gather stores into the peers' outputs; no staging copy, one pass |
//! | `twoshot_push` | `allreduce_twoshot_push` | medium and large, registered or not: the two-shot with peer stores only (inputs pushed into the owner's staging, results pushed into the peers' outputs or staging) |
//! | `nvls` | (not built) | NVLink SHARP multicast reduce; gated by `OXCCL_NVLS` and never run on the lent machines |
//! | `port_channel` | `allreduce_port` | multi-node: every byte that leaves a rank is moved by its proxy (IPC copies, TCP, InfiniBand); built only when forced |

pub mod nvls;
pub mod one_shot;
pub mod one_shot_ll128;
pub mod port_channel;
pub mod two_shot;
pub mod two_shot_push;
pub mod two_shot_zc;

use std::fmt;
use std::str::FromStr;

use oxccl_hal::{Capabilities, DataType, Error, LaunchConfig, Result};

/// One allreduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// One-shot all-pairs LL16 packets.
    OneShotLl,
    /// One-shot all-pairs LL128 lines.
    OneShotLl128,
    /// Two-shot reduce-scatter + all-gather through staging buffers.
    TwoShot,
    /// Zero-copy two-shot on registered buffers.
    TwoShotZc,
    /// Two-shot with peer stores only.
    TwoShotPush,
    /// NVLS multicast (gated; not built).
    Nvls,
    /// PortChannel (multi-node, through the proxy).
    PortChannel,
}

/// What an algorithm needs to know to decide whether it can serve a call and how to
/// launch it.
#[derive(Debug, Clone, Copy)]
pub struct CallShape<'a> {
    /// Elements.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Bytes of one rank's input.
    pub bytes: usize,
    /// Ranks.
    pub world_size: u32,
    /// The device's capabilities.
    pub caps: &'a Capabilities,
    /// Bytes of one parity half of the packet region.
    pub packet_half_bytes: usize,
    /// Bytes of one parity half of the LL128 line region.
    pub ll128_half_bytes: usize,
    /// Every pair of ranks is connected by NVLink (agreed at setup; LL128 needs it).
    pub nvlink: bool,
    /// Whether the kernels run as host functions (host backend).
    pub host: bool,
    /// Whether input and output are 16-byte aligned inside buffers registered on every
    /// rank (the zero-copy two-shot can serve the call).
    pub zero_copy: bool,
}

/// A launch plan: which kernel and which grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Kernel name in the module.
    pub kernel: &'static str,
    /// Grid and block.
    pub config: LaunchConfig,
}

/// An entry of the collection.
#[derive(Debug, Clone, Copy)]
pub struct AlgorithmInfo {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Name as `OXCCL_ALGO` takes it.
    pub name: &'static str,
    /// Where it wins and what it needs.
    pub serves: &'static str,
}

/// Every algorithm, in the selector's order of preference for small messages.
pub const ALGORITHMS: [AlgorithmInfo; 7] = [
    AlgorithmInfo {
        algorithm: Algorithm::OneShotLl,
        name: "oneshot_ll",
        serves: "small messages (up to the one-shot threshold), any world size 1..=8; needs \
                 world_size * 2 * bytes of packet scratch",
    },
    AlgorithmInfo {
        algorithm: Algorithm::TwoShot,
        name: "twoshot",
        serves: "medium and large messages, world size 1..=8; any size (processed in rounds \
                 of the staging buffer)",
    },
    AlgorithmInfo {
        algorithm: Algorithm::TwoShotZc,
        name: "twoshot_zc",
        serves: "medium and large messages on registered buffers (Communicator::register), \
                 world size 1..=8, any size; input and output 16-byte aligned at the same \
                 offset of every rank's registered buffer",
    },
    AlgorithmInfo {
        algorithm: Algorithm::TwoShotPush,
        name: "twoshot_push",
        serves: "medium and large messages, registered or not, world size 1..=8, any size; \
                 every NVLink transfer is a store (registered outputs are written directly)",
    },
    AlgorithmInfo {
        algorithm: Algorithm::Nvls,
        name: "nvls",
        serves: "NVSwitch multicast reduce (hardware multicast, OXCCL_NVLS=1); not built",
    },
    AlgorithmInfo {
        algorithm: Algorithm::PortChannel,
        name: "port_channel",
        serves: "multi-node (proxy: IPC copies, TCP or InfiniBand), any world size 1..=8; \
                 slower than the NVLink algorithms within a node, so only when forced \
                 (OXCCL_ALGO=port_channel)",
    },
    AlgorithmInfo {
        algorithm: Algorithm::OneShotLl128,
        name: "oneshot_ll128",
        serves: "small and medium messages (up to the one-shot capacity), any world size \
                 1..=8, CUDA only; needs world_size * 128/112 * bytes of line scratch",
    },
];

impl Algorithm {
    /// The algorithm's name (as `OXCCL_ALGO` takes it).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::OneShotLl => "oneshot_ll",
            Algorithm::OneShotLl128 => "oneshot_ll128",
            Algorithm::TwoShot => "twoshot",
            Algorithm::TwoShotZc => "twoshot_zc",
            Algorithm::TwoShotPush => "twoshot_push",
            Algorithm::Nvls => "nvls",
            Algorithm::PortChannel => "port_channel",
        }
    }

    /// Stable code (exchanged between ranks to detect mismatched calls).
    pub fn code(self) -> u32 {
        match self {
            Algorithm::OneShotLl => 1,
            Algorithm::TwoShot => 2,
            Algorithm::Nvls => 3,
            Algorithm::PortChannel => 4,
            Algorithm::TwoShotZc => 5,
            Algorithm::TwoShotPush => 6,
            Algorithm::OneShotLl128 => 7,
        }
    }

    /// The launch of this algorithm for a call, or why it cannot serve it.
    pub fn plan(self, shape: &CallShape<'_>) -> Result<Plan> {
        match self {
            Algorithm::OneShotLl => one_shot::plan(shape),
            Algorithm::OneShotLl128 => one_shot_ll128::plan(shape),
            Algorithm::TwoShot => two_shot::plan(shape),
            Algorithm::TwoShotZc => two_shot_zc::plan(shape),
            Algorithm::TwoShotPush => two_shot_push::plan(shape),
            Algorithm::Nvls => nvls::plan(shape),
            Algorithm::PortChannel => port_channel::plan(shape),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        let alias = match s.as_str() {
            "oneshot" | "one_shot" | "allpairs" => "oneshot_ll",
            "ll128" | "oneshot_ll128" | "one_shot_ll128" => "oneshot_ll128",
            "two_shot" => "twoshot",
            "zc" | "zerocopy" | "zero_copy" | "twoshot_zero_copy" => "twoshot_zc",
            "push" | "two_shot_push" => "twoshot_push",
            "port" | "portchannel" => "port_channel",
            other => other,
        };
        ALGORITHMS
            .iter()
            .find(|a| a.name == alias)
            .map(|a| a.algorithm)
            .ok_or_else(|| {
                let names: Vec<&str> = ALGORITHMS.iter().map(|a| a.name).collect();
                Error::InvalidArgument(format!(
                    "unknown allreduce algorithm '{s}'; known: {}",
                    names.join(", ")
                ))
            })
    }
}

/// Threads per block of the device kernels.
pub(crate) const THREADS: u32 = 512;

/// Blocks the device kernels may use: the multiprocessor count, at most the sync area's
/// per-block slots (every block must be resident: blocks spin on each other across GPUs).
pub(crate) fn max_blocks(caps: &Capabilities) -> u32 {
    caps.multiprocessors
        .clamp(1, oxccl_kernels::abi::OXCCL_ALLREDUCE_MAX_BLOCKS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in ALGORITHMS {
            assert_eq!(a.algorithm.name(), a.name);
            assert_eq!(a.name.parse::<Algorithm>().ok(), Some(a.algorithm));
        }
        assert_eq!(
            "ONESHOT".parse::<Algorithm>().ok(),
            Some(Algorithm::OneShotLl)
        );
        let e = "ring".parse::<Algorithm>().unwrap_err().to_string();
        assert!(
            e.contains("oneshot_ll, twoshot, twoshot_zc, twoshot_push"),
            "{e}"
        );
    }
}
