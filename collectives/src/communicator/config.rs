//! A communicator's settings: [`CommConfig`], from code or from the environment.

use std::time::Duration;

use oxccl_hal::{DataType, Error, Result};

use super::auto_register::{
    AUTO_REGISTER_MAX_VAR, AUTO_REGISTER_MIN_VAR, AUTO_REGISTER_VAR, DEFAULT_MAX_ENTRIES,
};
use crate::algorithms::port_channel::PortConfig;
use crate::algorithms::reduce::copy::{DEFAULT_TAIL, TAIL_VAR};
use crate::algorithms::Forced;
use crate::selector::{ALGO_VAR, ONESHOT_MAX_VAR, ZC_THRESHOLD_VAR};
use crate::tuner::{TuneMode, DEFAULT_TUNE_MAX, TUNE_DTYPES_VAR, TUNE_MAX_VAR, TUNE_VAR};

/// Environment variable: bound of every device wait, in milliseconds (0 = forever).
pub const TIMEOUT_VAR: &str = "OXCCL_TIMEOUT_MS";
/// Environment variable: bytes of each two-shot staging buffer, in MiB.
pub const STAGING_VAR: &str = "OXCCL_STAGING_MB";
/// Environment variable: `0` launches every allreduce kernel only after the previous
/// kernel on its stream has finished ([`CommConfig::early_launch`]).
pub const EARLY_LAUNCH_VAR: &str = "OXCCL_EARLY_LAUNCH";

pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
pub(crate) const DEFAULT_STAGING: usize = 64 << 20;
/// One-shot packet scratch is sized for at least this many bytes per rank, so that
/// `OXCCL_ALGO=oneshot_ll` can be forced up to it.
pub(crate) const MIN_ONESHOT_CAPACITY: usize = 1 << 20;

/// Settings of a communicator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommConfig {
    /// Bound of every wait inside a kernel (a dead or diverged peer becomes an error).
    pub timeout: Duration,
    /// Bytes of each two-shot staging buffer (rounded up to a multiple of 4 KiB).
    pub staging_bytes: usize,
    /// The algorithm every call of a collective must use, per collective (`OXCCL_ALGO`:
    /// a comma-separated list of names, at most one per collective).
    pub forced: Forced,
    /// Largest message (bytes per rank) the selector sends through one-shot; `None`: the
    /// world-size default ([`default_oneshot_max`]).
    pub oneshot_max_bytes: Option<usize>,
    /// On registered buffers, messages above this take the zero-copy two-shot; `None`:
    /// the world-size default ([`default_zc_threshold`]).
    pub zc_threshold_bytes: Option<usize>,
    /// Whether to tune at creation ([`crate::tuner`]).
    pub tune: TuneMode,
    /// Data types tuned at creation.
    pub tune_dtypes: Vec<DataType>,
    /// Largest size tuned (bytes per rank).
    pub tune_max_bytes: usize,
    /// Directory of cached tune tables; `None`: [`crate::tuner::cache_dir`] (`OXCCL_TUNE_DIR`, ...).
    pub tune_dir: Option<std::path::PathBuf>,
    /// Launch the allreduce kernels early where the device can
    /// ([`oxccl_hal::LaunchConfig::early_launch`]): each is scheduled while the kernel before
    /// it on the stream finishes and waits for it on the GPU, which takes the launch
    /// latency off the time of small calls. The result is the same either way.
    pub early_launch: bool,
    /// Settings of the PortChannel algorithms (used where they are set up: ranks on several
    /// nodes, or one of them forced).
    pub port: PortConfig,
    /// Zero-copy on buffers nobody registered (`OXCCL_AUTO_REGISTER`, default on): calls
    /// that would take a zero-copy algorithm map the allocations holding the peers'
    /// buffers ([`super::auto_register`]).
    pub auto_register: bool,
    /// Most allocations (all ranks' together) kept mapped for that (`OXCCL_AUTO_REGISTER_MAX`).
    pub auto_register_max: usize,
    /// Smallest call (bytes per rank) that does that (`OXCCL_AUTO_REGISTER_MIN_BYTES`):
    /// each such call exchanges a record about its buffers with the peers; smaller calls
    /// stage through the scratch. `None`:
    /// [`super::auto_register::DEFAULT_LOCAL_MIN_BYTES`] where the ranks of one node share
    /// the exchange region, [`super::auto_register::DEFAULT_MIN_BYTES`] where it goes
    /// through the bootstrap.
    pub auto_register_min_bytes: Option<usize>,
    /// The last chunk of `reduce_copy`'s out-of-place pull (`OXCCL_REDUCE_COPY_TAIL_KB`;
    /// see [`crate::algorithms::reduce::copy::tail_schedule`]).
    pub reduce_copy_tail_bytes: usize,
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            timeout: DEFAULT_TIMEOUT,
            staging_bytes: DEFAULT_STAGING,
            forced: Forced::NONE,
            oneshot_max_bytes: None,
            zc_threshold_bytes: None,
            tune: TuneMode::Off,
            tune_dtypes: vec![DataType::Bf16],
            tune_max_bytes: DEFAULT_TUNE_MAX,
            tune_dir: None,
            early_launch: true,
            port: PortConfig::default(),
            auto_register: true,
            auto_register_max: DEFAULT_MAX_ENTRIES,
            auto_register_min_bytes: None,
            reduce_copy_tail_bytes: DEFAULT_TAIL,
        }
    }
}

pub(crate) fn env_number(var: &str) -> Result<Option<u64>> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => v.trim().parse::<u64>().map(Some).map_err(|_| {
            Error::InvalidArgument(format!("{var}='{v}' is not a non-negative integer"))
        }),
        _ => Ok(None),
    }
}

/// An on/off variable: `1` or `0` (unset or empty: `None`).
fn env_switch(var: &str) -> Result<Option<bool>> {
    match env_number(var)? {
        None => Ok(None),
        Some(v @ (0 | 1)) => Ok(Some(v == 1)),
        Some(v) => Err(Error::InvalidArgument(format!("{var}={v} is not 0 or 1"))),
    }
}

impl CommConfig {
    /// From the environment: `OXCCL_ALGO`, `OXCCL_TIMEOUT_MS`, `OXCCL_STAGING_MB`,
    /// `OXCCL_ONESHOT_MAX_BYTES`, `OXCCL_ZC_THRESHOLD_BYTES`, `OXCCL_TUNE`,
    /// `OXCCL_TUNE_DTYPES`, `OXCCL_TUNE_MAX_BYTES`, `OXCCL_EARLY_LAUNCH`,
    /// `OXCCL_AUTO_REGISTER`, `OXCCL_AUTO_REGISTER_MAX`, `OXCCL_REDUCE_COPY_TAIL_KB`, and the
    /// PortChannel settings (`OXCCL_PORT_TRANSPORT`, `OXCCL_PORT_CHUNK_KB`).
    pub fn from_env() -> Result<Self> {
        let mut c = CommConfig {
            port: PortConfig::from_env()?,
            ..CommConfig::default()
        };
        if let Ok(names) = std::env::var(ALGO_VAR) {
            c.forced = names.parse()?;
        }
        if let Some(ms) = env_number(TIMEOUT_VAR)? {
            c.timeout = Duration::from_millis(ms);
        }
        if let Some(mb) = env_number(STAGING_VAR)? {
            if mb == 0 || mb > 4096 {
                return Err(Error::InvalidArgument(format!(
                    "{STAGING_VAR}={mb} is not in 1..=4096"
                )));
            }
            c.staging_bytes = (mb as usize) << 20;
        }
        if let Some(b) = env_number(ONESHOT_MAX_VAR)? {
            c.oneshot_max_bytes = Some(usize::try_from(b).unwrap_or(usize::MAX));
        }
        if let Some(b) = env_number(ZC_THRESHOLD_VAR)? {
            c.zc_threshold_bytes = Some(usize::try_from(b).unwrap_or(usize::MAX));
        }
        if let Ok(v) = std::env::var(TUNE_VAR) {
            c.tune = v.parse()?;
        }
        if let Ok(v) = std::env::var(TUNE_DTYPES_VAR) {
            c.tune_dtypes = v
                .split(',')
                .filter(|d| !d.trim().is_empty())
                .map(|d| d.trim().parse::<DataType>())
                .collect::<Result<_>>()?;
        }
        if let Some(b) = env_number(TUNE_MAX_VAR)? {
            c.tune_max_bytes = usize::try_from(b).unwrap_or(usize::MAX);
        }
        if let Some(on) = env_switch(EARLY_LAUNCH_VAR)? {
            c.early_launch = on;
        }
        if let Some(on) = env_switch(AUTO_REGISTER_VAR)? {
            c.auto_register = on;
        }
        if let Some(n) = env_number(AUTO_REGISTER_MAX_VAR)? {
            c.auto_register_max = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(n) = env_number(AUTO_REGISTER_MIN_VAR)? {
            c.auto_register_min_bytes = Some(usize::try_from(n).unwrap_or(usize::MAX));
        }
        if let Some(kb) = env_number(TAIL_VAR)? {
            c.reduce_copy_tail_bytes = usize::try_from(kb)
                .ok()
                .and_then(|kb| kb.checked_mul(1024))
                .filter(|&b| b >= 1024)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!("{TAIL_VAR}={kb} is not a size in KiB >= 1"))
                })?;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_take_only_zero_or_one() {
        // A variable of this test alone: tests run in parallel in one process.
        const VAR: &str = "OXCCL_TEST_SWITCH_ONLY_IN_THIS_TEST";
        std::env::remove_var(VAR);
        assert_eq!(env_switch(VAR).unwrap(), None);
        std::env::set_var(VAR, "0");
        assert_eq!(env_switch(VAR).unwrap(), Some(false));
        std::env::set_var(VAR, " 1 ");
        assert_eq!(env_switch(VAR).unwrap(), Some(true));
        std::env::set_var(VAR, "2");
        let e = env_switch(VAR).unwrap_err().to_string();
        assert!(e.contains("is not 0 or 1"), "{e}");
        std::env::set_var(VAR, "yes");
        assert!(env_switch(VAR).is_err());
        std::env::remove_var(VAR);
        assert!(CommConfig::default().early_launch);
    }
}
