//! Settings of the PortChannel algorithms ([`PortConfig`], part of [`crate::CommConfig`]):
//! the transport to every peer and the bytes of one round.

use oxccl_channels::connection::Transport;
use oxccl_hal::{Error, Result};

/// Environment variable forcing the transport of every peer: `ipc`, `tcp`, `ib` (or
/// `auto`, the default: IPC on one node, else InfiniBand where both ends have it, else TCP).
pub const TRANSPORT_VAR: &str = "OXCCL_PORT_TRANSPORT";
/// Environment variable: bytes of one round (one slot of the scratch), in KiB.
pub const CHUNK_VAR: &str = "OXCCL_PORT_CHUNK_KB";
/// Default bytes of one round.
pub const DEFAULT_CHUNK: usize = 4 << 20;

/// Settings of the PortChannel algorithms (the bound of their waits is the communicator's
/// timeout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortConfig {
    /// Bytes of one round (rounded up to 16); messages above it take several rounds.
    pub chunk_bytes: usize,
    /// Transport for every peer; `None`: chosen per peer from the nodes and IB presence.
    pub transport: Option<Transport>,
    /// Slots of the proxy FIFO (power of two); `None`: the channels crate's default.
    pub fifo_size: Option<u32>,
}

/// The name the settings had when only the allreduce used them.
pub type PortAllreduceConfig = PortConfig;

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
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

impl PortConfig {
    /// From the environment: `OXCCL_PORT_TRANSPORT`, `OXCCL_PORT_CHUNK_KB`.
    pub fn from_env() -> Result<Self> {
        let mut c = PortConfig::default();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_names() {
        assert_eq!(parse_transport("TCP").ok(), Some(Some(Transport::Tcp)));
        assert_eq!(parse_transport("auto").ok(), Some(None));
        assert!(parse_transport("carrier-pigeon").is_err());
    }
}
