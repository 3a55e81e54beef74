//! Rank, world size and rendezvous address from the launcher's environment.
//!
//! torchrun sets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR` and
//! `MASTER_PORT`; Open MPI sets `OMPI_COMM_WORLD_*`; Slurm sets `SLURM_PROCID`,
//! `SLURM_NTASKS`, `SLURM_LOCALID`. torchrun's own store already listens on `MASTER_PORT`,
//! so the bootstrap root listens on `OXCCL_BOOTSTRAP_PORT`, or `MASTER_PORT + 1`.

use std::collections::HashMap;

use oxccl_hal::{Error, Result};

/// What a process learns about its place in the job from its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    /// Global rank.
    pub rank: u32,
    /// Number of ranks.
    pub world_size: u32,
    /// Rank within this node (selects the GPU).
    pub local_rank: u32,
    /// Ranks on this node.
    pub local_world_size: u32,
    /// Host of the rendezvous root.
    pub root_host: String,
    /// Port of the rendezvous root.
    pub root_port: u16,
}

/// Default rendezvous host and port when the launcher names none (single node).
const DEFAULT_HOST: &str = "127.0.0.1";
const DEFAULT_MASTER_PORT: u16 = 29500;

fn first<'a>(env: &'a HashMap<String, String>, names: &[&str]) -> Option<(&'a str, String)> {
    names
        .iter()
        .find_map(|n| env.get(*n).map(|v| (v.as_str(), (*n).to_string())))
}

fn number(env: &HashMap<String, String>, names: &[&str]) -> Result<Option<u32>> {
    match first(env, names) {
        None => Ok(None),
        Some((value, name)) => value.trim().parse::<u32>().map(Some).map_err(|_| {
            Error::InvalidArgument(format!("{name}='{value}' is not a non-negative integer"))
        }),
    }
}

impl LaunchInfo {
    /// Reads the process environment.
    pub fn from_env() -> Result<LaunchInfo> {
        LaunchInfo::from_map(&std::env::vars().collect())
    }

    /// Reads a given environment (testable).
    pub fn from_map(env: &HashMap<String, String>) -> Result<LaunchInfo> {
        let rank = number(
            env,
            &["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"],
        )?;
        let world = number(
            env,
            &[
                "WORLD_SIZE",
                "OMPI_COMM_WORLD_SIZE",
                "PMI_SIZE",
                "SLURM_NTASKS",
            ],
        )?;
        let (rank, world_size) =
            match (rank, world) {
                (Some(r), Some(w)) => (r, w),
                _ => return Err(Error::InvalidArgument(
                    "no launcher environment found: set RANK and WORLD_SIZE (torchrun), or run \
                     under mpirun or srun"
                        .into(),
                )),
            };
        if world_size == 0 || rank >= world_size {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} is not below world size {world_size}"
            )));
        }
        let local_rank = number(
            env,
            &["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"],
        )?
        .unwrap_or(rank);
        let local_world_size = number(
            env,
            &[
                "LOCAL_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
                "SLURM_NTASKS_PER_NODE",
            ],
        )?
        .unwrap_or(world_size);
        let root_host = env
            .get("MASTER_ADDR")
            .cloned()
            .unwrap_or_else(|| DEFAULT_HOST.to_string());
        let root_port = match env.get("OXCCL_BOOTSTRAP_PORT") {
            Some(p) => p.trim().parse::<u16>().map_err(|_| {
                Error::InvalidArgument(format!("OXCCL_BOOTSTRAP_PORT='{p}' is not a port"))
            })?,
            None => {
                let master = match env.get("MASTER_PORT") {
                    Some(p) => p.trim().parse::<u16>().map_err(|_| {
                        Error::InvalidArgument(format!("MASTER_PORT='{p}' is not a port"))
                    })?,
                    None => DEFAULT_MASTER_PORT,
                };
                master.checked_add(1).ok_or_else(|| {
                    Error::InvalidArgument("MASTER_PORT is 65535; set OXCCL_BOOTSTRAP_PORT".into())
                })?
            }
        };
        Ok(LaunchInfo {
            rank,
            world_size,
            local_rank,
            local_world_size,
            root_host,
            root_port,
        })
    }
}

/// Ports [`free_rendezvous_port`] chooses from: below Linux's ephemeral range (32768-60999),
/// so no process's outgoing connection can be given the port between the check and the
/// root's bind, as happens with a port from bind(0) on a busy machine.
pub const RENDEZVOUS_PORTS: std::ops::Range<u16> = 20000..32000;

/// A port of [`RENDEZVOUS_PORTS`] (and the one above it, which the bootstrap root uses next
/// to torchrun's `MASTER_PORT`) free on 127.0.0.1 now, for launchers that start ranks on
/// this machine (`oxccl-perf -N`, tests). Starts at a per-process offset; `None` when none
/// is free.
pub fn free_rendezvous_port() -> Option<u16> {
    let span = u32::from(RENDEZVOUS_PORTS.end - RENDEZVOUS_PORTS.start);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let start = (std::process::id().wrapping_mul(7919) ^ nanos) % span;
    (0..span).step_by(2).find_map(|k| {
        let port = RENDEZVOUS_PORTS.start + ((start + k) % (span - 1)) as u16;
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        (free(port) && free(port + 1)).then_some(port)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn torchrun_variables() {
        let info = LaunchInfo::from_map(&env(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "29400"),
        ]))
        .unwrap();
        assert_eq!((info.rank, info.world_size, info.local_rank), (5, 8, 1));
        assert_eq!(info.local_world_size, 4);
        assert_eq!(
            (info.root_host.as_str(), info.root_port),
            ("10.1.2.3", 29401)
        );
    }

    #[test]
    fn mpi_and_slurm_variables_and_port_override() {
        let mpi = LaunchInfo::from_map(&env(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
            ("OXCCL_BOOTSTRAP_PORT", "40000"),
        ]))
        .unwrap();
        assert_eq!(
            (mpi.rank, mpi.world_size, mpi.local_rank, mpi.root_port),
            (2, 3, 2, 40000)
        );
        let slurm =
            LaunchInfo::from_map(&env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")])).unwrap();
        assert_eq!((slurm.rank, slurm.world_size), (0, 1));
    }

    #[test]
    fn bad_environments_are_named() {
        assert!(LaunchInfo::from_map(&env(&[])).is_err());
        let e = LaunchInfo::from_map(&env(&[("RANK", "x"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(e.to_string().contains("RANK='x'"), "{e}");
        assert!(LaunchInfo::from_map(&env(&[("RANK", "2"), ("WORLD_SIZE", "2")])).is_err());
        let e = LaunchInfo::from_map(&env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "65535"),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("OXCCL_BOOTSTRAP_PORT"), "{e}");
    }

    #[test]
    fn rendezvous_ports_are_free_and_below_the_ephemeral_range() {
        let p = free_rendezvous_port().unwrap();
        assert!(RENDEZVOUS_PORTS.contains(&p) && RENDEZVOUS_PORTS.contains(&(p + 1)));
        std::net::TcpListener::bind(("127.0.0.1", p)).unwrap();
    }
}
