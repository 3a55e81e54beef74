//! PortChannel allreduce (multi-node: a proxy thread drives copy engines or RDMA).
//! Not built yet: the entry exists so the selector and `OXCCL_ALGO` know the name.

use oxccl_hal::{Error, Result};

use super::{CallShape, Plan};

/// Always `Unsupported("not built yet")`.
pub fn plan(_: &CallShape<'_>) -> Result<Plan> {
    Err(Error::Unsupported(
        "port_channel: the PortChannel allreduce is not built yet".into(),
    ))
}
