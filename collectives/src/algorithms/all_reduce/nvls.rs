//! NVLS (NVLink SHARP) allreduce: multicast loads that reduce in the switch and multicast
//! stores that broadcast. Compiled and gated only: the lent machines forbid multicast
//! objects, so this entry refuses unless `OXCCL_NVLS=1` (and `NCCL_NVLS_ENABLE` is not 0),
//! and even then it reports that the kernel is not built.

use oxccl_hal::{Error, HostKernelTable, MulticastSupport, Result};

use crate::algorithms::{Algorithm, Buffers, CallShape, Collective, Descriptor, Plan};

/// The NVLS allreduce: gated, and without a kernel yet (its plan always refuses, so it is
/// never set up).
pub const NVLS: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::AllReduce,
    name: "nvls",
    aliases: &[],
    code: 3,
    serves: "NVSwitch multicast reduce (hardware multicast, OXCCL_NVLS=1); not built",
    kernel: "allreduce_nvls",
    host: HostKernelTable {
        name: "nvls (no kernel)",
        kernels: &[],
    },
    plan,
    buffers: Buffers::Own,
    maps_peers: true,
    tuning: None,
    setup: |_, _| Ok(None),
});

/// Always an error: the gate's refusal, no hardware multicast, or "not built".
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    oxccl_hal::multicast_gate::check()?;
    if s.caps.multicast != MulticastSupport::Hardware {
        return Err(Error::Unsupported(
            "nvls: the device has no hardware multicast".into(),
        ));
    }
    Err(Error::Unsupported(
        "nvls: the NVLS allreduce kernel is not built yet".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses() {
        let caps = oxccl_hal::Capabilities::default();
        let s = CallShape {
            collective: Collective::AllReduce,
            count: 1,
            dtype: oxccl_hal::DataType::F32,
            bytes: 4,
            world_size: 2,
            caps: &caps,
            packet_half_bytes: 0,
            ll128_half_bytes: 0,
            nvlink: false,
            multi_node: false,
            host: true,
            zero_copy: false,
        };
        assert!(plan(&s).is_err());
    }
}
