//! SwitchChannel: reduce over, and broadcast to, every member's buffer through one
//! multicast address (NVLink SHARP on NVIDIA; absent on ROCm).
//!
//! Construction is collective over the bootstrap's ranks and refused unless the device
//! reports multicast support: `Hardware` only when the multicast safety gate is open
//! ([`oxccl_hal::multicast_gate::check`]: `OXCCL_NVLS=1` and `NCCL_NVLS_ENABLE` not `0`),
//! or the host backend's `Emulated` multicast (which touches no GPU). Every rank checks
//! before any object is created and the ranks agree, so a closed gate is one error on
//! every rank, never a multicast object on some.
//!
//! The device handle drives `multimem.ld_reduce` / `multimem.st` (switch_channel_device.hpp);
//! on the host backend [`SwitchChannel::reduce`] and [`SwitchChannel::broadcast`] run the
//! emulation (`HostMulticast::reduce` / `broadcast`).

use std::sync::Arc;

use oxccl_backend::{AnyDevice, AnyMemory, AnyMulticast};
use oxccl_hal::{
    multicast_gate, DataType, Device, DevicePtr, Error, IpcHandle, Memory, Multicast,
    MulticastSupport, ReduceOp, Result,
};
use oxccl_kernels::abi::{self, OxcclSwitchChannel};

use crate::bootstrap::Bootstrap;

/// One member's view of a multicast group over the ranks' buffers.
#[derive(Debug)]
pub struct SwitchChannel {
    multicast: AnyMulticast,
    memory: Arc<AnyMemory>,
    address: DevicePtr,
}

/// Whether this device may build a SwitchChannel now (capability and gate).
pub fn allowed(device: &AnyDevice) -> Result<()> {
    match device.capabilities().multicast {
        MulticastSupport::Emulated => Ok(()),
        MulticastSupport::Hardware => multicast_gate::check(),
        MulticastSupport::None => Err(Error::Unsupported(format!(
            "{} has no multicast support: SwitchChannel is unavailable",
            device.capabilities().name
        ))),
    }
}

impl SwitchChannel {
    /// Joins every rank's `memory` (same length on every rank) into one multicast group.
    /// Collective over all ranks of `bootstrap`.
    pub fn connect(
        bootstrap: &Bootstrap,
        device: &AnyDevice,
        memory: Arc<AnyMemory>,
    ) -> Result<SwitchChannel> {
        let rank = bootstrap.rank();
        let world = bootstrap.world_size();
        let _span = tracing::info_span!("switch_channel", rank, world).entered();
        let at_rank = |e: Error| e.at_rank(rank);
        // Agree first: nobody creates anything unless every rank may.
        let verdict = allowed(device);
        let mut mine = vec![u8::from(verdict.is_ok())];
        mine.extend_from_slice(&(memory.len() as u64).to_le_bytes());
        let all = bootstrap.all_gather(&mine)?;
        verdict.map_err(at_rank)?;
        for (r, v) in all.iter().enumerate() {
            if v.first() != Some(&1) {
                return Err(at_rank(Error::Unsupported(format!(
                    "rank {r} cannot use multicast (capability or OXCCL_NVLS gate)"
                ))));
            }
            if v.get(1..9) != Some(&mine[1..9]) {
                return Err(at_rank(Error::InvalidArgument(format!(
                    "rank {r} joins the SwitchChannel with a buffer of another length"
                ))));
            }
        }
        let multicast = if rank == 0 {
            let mc = device.create_multicast(memory.len(), world)?;
            let handle = device.export_multicast(&mc)?;
            bootstrap.all_gather(&handle.to_bytes())?;
            mc
        } else {
            let all = bootstrap.all_gather(&[])?;
            let bytes = all
                .first()
                .ok_or_else(|| Error::InvalidArgument("no multicast handle from rank 0".into()))?;
            device.import_multicast(&IpcHandle::from_bytes(bytes)?)?
        };
        multicast.add_device(device.id()).map_err(at_rank)?;
        bootstrap.barrier()?; // every device added before anyone binds
        multicast.bind(&memory, 0).map_err(at_rank)?;
        bootstrap.barrier()?; // every member bound before anyone maps or reduces
        let address = multicast.map().map_err(at_rank)?;
        Ok(SwitchChannel {
            multicast,
            memory,
            address,
        })
    }

    /// The device handle (valid while `self` lives).
    pub fn handle(&self) -> OxcclSwitchChannel {
        OxcclSwitchChannel {
            multicast: abi::ptr(self.address),
            local: abi::ptr(self.memory.ptr()),
            bytes: self.memory.len() as u64,
            _pad0: 0,
        }
    }

    /// Reduces `count` elements at byte `offset` over every member into `out` (host
    /// backend: the emulation; GPU backends do this in a kernel through the handle).
    pub fn reduce(
        &self,
        offset: usize,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        out: &mut [u8],
    ) -> Result<()> {
        match &self.multicast {
            AnyMulticast::Host(m) => m.reduce(offset, count, dtype, op, out),
            #[allow(unreachable_patterns)]
            other => Err(Error::Unsupported(format!(
                "host-side reduce over a {} multicast object: launch channel_switch_op",
                other.backend()
            ))),
        }
    }

    /// Writes `src` at byte `offset` of every member (host backend: the emulation).
    pub fn broadcast(&self, offset: usize, src: &[u8]) -> Result<()> {
        match &self.multicast {
            AnyMulticast::Host(m) => m.broadcast(offset, src),
            #[allow(unreachable_patterns)]
            other => Err(Error::Unsupported(format!(
                "host-side broadcast over a {} multicast object: launch channel_switch_op",
                other.backend()
            ))),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::semaphore::testing::*;
    use oxccl_hal::MemoryKind;

    /// Three ranks on the host emulation: reduce sums every member's f32, broadcast lands
    /// in every member.
    #[test]
    fn reduce_and_broadcast_on_the_host_emulation() {
        const COUNT: usize = 1001;
        let f = |r: u32, i: usize| (r as f32 + 1.0) * 0.5 + i as f32;
        with_ranks(3, |b, d| {
            let me = b.rank();
            let mem = Arc::new(d.alloc(COUNT * 4, MemoryKind::Physical).unwrap());
            let data: Vec<u8> = (0..COUNT).flat_map(|i| f(me, i).to_le_bytes()).collect();
            write(&mem, 0, &data);
            let sc = SwitchChannel::connect(&b, &d, Arc::clone(&mem)).unwrap();
            assert!(!sc.handle().multicast.is_null());
            let mut out = vec![0u8; COUNT * 4];
            sc.reduce(0, COUNT, DataType::F32, ReduceOp::Sum, &mut out)
                .unwrap();
            for (i, c) in out.chunks_exact(4).enumerate() {
                let want: f32 = (0..3).map(|r| f(r, i)).sum();
                assert_eq!(
                    f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                    want,
                    "element {i}"
                );
            }
            b.barrier().unwrap();
            if me == 1 {
                sc.broadcast(8, &random_nonzero(5, 100)).unwrap();
            }
            b.barrier().unwrap();
            assert_eq!(read(&mem, 8, 100), random_nonzero(5, 100));
        });
    }

    #[test]
    fn the_gate_decides_for_hardware_only() {
        // The host device reports the emulation, which needs no gate.
        assert!(allowed(&device()).is_ok());
        assert!(multicast_gate::decide(None, None).is_err());
    }
}
