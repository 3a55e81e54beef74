//! The multicast safety gate.
//!
//! Creating an NVLink multicast object on a shared machine can take its GPUs out of service
//! for days, so no backend creates one unless the user opted in with `OXCCL_NVLS=1` and has
//! not switched NVLS off for NCCL with `NCCL_NVLS_ENABLE=0`. Every multicast creation path
//! calls [`check`] first; the decision is made from the environment at the time of the call.

use crate::error::{Error, Result};

/// Environment variable that opens the gate when set to `1`.
pub const OPT_IN_VAR: &str = "OXCCL_NVLS";
/// NCCL's switch; `0` keeps the gate closed even with the opt-in.
pub const NCCL_VAR: &str = "NCCL_NVLS_ENABLE";

/// Decides from explicit values (testable without touching the process environment).
pub fn decide(opt_in: Option<&str>, nccl_nvls_enable: Option<&str>) -> Result<()> {
    if opt_in.map(str::trim) != Some("1") {
        return Err(Error::MulticastGated(format!(
            "{OPT_IN_VAR}=1 is not set; multicast objects are never created by default"
        )));
    }
    if nccl_nvls_enable.map(str::trim) == Some("0") {
        return Err(Error::MulticastGated(format!(
            "{NCCL_VAR}=0 is set, which oxccl honours as well"
        )));
    }
    Ok(())
}

/// Checks the gate against the process environment.
pub fn check() -> Result<()> {
    let opt_in = std::env::var(OPT_IN_VAR).ok();
    let nccl = std::env::var(NCCL_VAR).ok();
    decide(opt_in.as_deref(), nccl.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_is_closed_by_default_and_by_nccl_switch() {
        assert!(matches!(decide(None, None), Err(Error::MulticastGated(_))));
        assert!(decide(Some("0"), None).is_err());
        assert!(decide(Some("yes"), None).is_err());
        assert!(decide(Some("1"), Some("0")).is_err());
        assert!(decide(Some("1"), None).is_ok());
        assert!(decide(Some("1"), Some("1")).is_ok());
    }
}
