//! The communicator's shared scratch: one allocation per rank with the same layout on
//! every rank (`kernels/include/oxccl/abi_allreduce.h`), mapped by every peer through IPC.
//! [`ScratchLayout`] says where each region lies; [`SharedScratch`] owns this rank's
//! allocation and its mappings of the peers', and gives every rank's base as mapped here,
//! which the scratch-protocol kernels receive in their argument block. It is made when the
//! first algorithm's setup asks for it ([`crate::algorithms::SetupContext::shared_scratch`]),
//! so a communicator whose algorithms need none (the PortChannel one, forced) maps no peer
//! memory at all.

use oxccl_backend::{AnyDevice, AnyImported, AnyMemory};
use oxccl_channels::bootstrap::Bootstrap;
use oxccl_hal::{
    BackendKind, Device, DevicePtr, Error, IpcHandle, Memory, MemoryKind, Result, Stream,
};
use oxccl_kernels::abi::{
    OXCCL_ALLREDUCE_MAX_RANKS, OXCCL_ALLREDUCE_SYNC_BYTES, OXCCL_ALLREDUCE_SYNC_ERROR,
};

use crate::algorithms::all_reduce::{one_shot, one_shot_ll128};

/// The flag-protocol region a one-shot kernel writes its packets or lines into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagRegion {
    /// LL16 packets (8 data bytes and the flag twice in 16 bytes).
    Packets,
    /// LL128 lines (112 data bytes and a 16-byte flag). A region of their own, so an LL16
    /// reader never meets user data where it expects a flag.
    Lines,
    /// LL16 packets of the one-shot reduce, whose senders do not wait for the root and so
    /// keep out of the epoch's halves (MAILBOX_SEQ in abi_allreduce.h). As large as
    /// `Packets`.
    Mailbox,
}

/// Byte offsets of the scratch layout (the same on every rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScratchLayout {
    /// Start of the LL16 packet region (two parity halves).
    pub packet_offset: usize,
    /// Bytes of one packet half.
    pub packet_half: usize,
    /// Start of the LL128 line region (two parity halves).
    pub ll128_offset: usize,
    /// Bytes of one line half.
    pub ll128_half: usize,
    /// Start of the one-shot reduce's mailbox (two halves of `packet_half` bytes).
    pub mailbox_offset: usize,
    /// Start of the two-shot staging ("in", then "out").
    pub data_offset: usize,
    /// Bytes of each staging buffer.
    pub staging: usize,
    /// Bytes of the whole allocation.
    pub total: usize,
}

impl ScratchLayout {
    /// The layout for `world` ranks, one-shots of up to `oneshot_capacity` bytes per rank
    /// and staging buffers of `staging` bytes (each region rounded up to 4 KiB).
    pub fn new(world: u32, oneshot_capacity: usize, staging: usize) -> Result<ScratchLayout> {
        let page = 4096usize;
        let overflow = || Error::InvalidArgument("scratch size overflows".into());
        let half = |slot: usize| {
            slot.checked_mul(world.max(1) as usize)
                .map(|b| b.next_multiple_of(page))
                .ok_or_else(overflow)
        };
        let packet_half = half(one_shot::slot_bytes(oneshot_capacity))?;
        let ll128_half = half(one_shot_ll128::slot_bytes(oneshot_capacity))?;
        let staging = staging.max(page).next_multiple_of(page);
        let packet_offset = OXCCL_ALLREDUCE_SYNC_BYTES as usize;
        let ll128_offset = packet_half
            .checked_mul(2)
            .and_then(|b| b.checked_add(packet_offset))
            .ok_or_else(overflow)?;
        let mailbox_offset = ll128_half
            .checked_mul(2)
            .and_then(|b| b.checked_add(ll128_offset))
            .ok_or_else(overflow)?;
        let data_offset = packet_half
            .checked_mul(2)
            .and_then(|b| b.checked_add(mailbox_offset))
            .ok_or_else(overflow)?;
        let total = staging
            .checked_mul(2)
            .and_then(|s| s.checked_add(data_offset))
            .ok_or_else(overflow)?;
        Ok(ScratchLayout {
            packet_offset,
            packet_half,
            ll128_offset,
            ll128_half,
            mailbox_offset,
            data_offset,
            staging,
            total,
        })
    }

    /// Bytes that must start at zero: the sync words and the flag regions (flag 0 never
    /// matches). The staging buffers need no initial value.
    pub fn zeroed_prefix(&self) -> usize {
        self.data_offset
    }

    /// Offset and half size of a flag region.
    pub fn flag_region(&self, region: FlagRegion) -> (usize, usize) {
        match region {
            FlagRegion::Packets => (self.packet_offset, self.packet_half),
            FlagRegion::Lines => (self.ll128_offset, self.ll128_half),
            FlagRegion::Mailbox => (self.mailbox_offset, self.packet_half),
        }
    }
}

/// Every rank's scratch as mapped on this rank, with its layout.
#[derive(Debug)]
pub struct SharedScratch {
    /// The layout (the same on every rank).
    pub layout: ScratchLayout,
    /// Every rank's base as mapped here (index = rank; this rank's own at `rank`).
    pub bases: [DevicePtr; OXCCL_ALLREDUCE_MAX_RANKS as usize],
    /// This rank.
    pub rank: u32,
    /// Ranks.
    pub world: u32,
    // Drop order: the peers' mappings before this rank's allocation.
    peers: Vec<AnyImported>,
    memory: AnyMemory,
}

impl SharedScratch {
    /// Makes the shared scratch (collective: every rank calls it with the same layout):
    /// allocate, zero what must start at zero, export, exchange the handles, import every
    /// peer's (through the IPC handle cache), and barrier so no rank writes into a peer's
    /// scratch before the peer zeroed it. `names` says which settings size the layout, for
    /// the error when ranks disagree.
    pub fn create(
        bootstrap: &Bootstrap,
        device: &AnyDevice,
        layout: ScratchLayout,
        names: &str,
    ) -> Result<SharedScratch> {
        let (rank, world) = (bootstrap.rank(), bootstrap.world_size());
        let memory = device.alloc(layout.total, MemoryKind::Coherent)?;
        // Host-backend memory is zero-filled already.
        if Device::backend(device) != BackendKind::Host {
            let stream = device.create_stream()?;
            // SAFETY: the range is inside the allocation just made, which outlives the
            // fill (synchronized right below).
            unsafe { stream.fill(memory.ptr(), 0, layout.zeroed_prefix()) }?;
            stream.synchronize()?;
        }
        let handle = device.export_memory(&memory)?;
        let all = bootstrap.all_gather(&handle.to_bytes())?;
        let mut peers = Vec::with_capacity(world as usize);
        let mut bases = [DevicePtr::NULL; OXCCL_ALLREDUCE_MAX_RANKS as usize];
        for (r, bytes) in all.iter().enumerate() {
            if r == rank as usize {
                bases[r] = memory.ptr();
                continue;
            }
            let h = IpcHandle::from_bytes(bytes)?;
            if h.len < layout.total as u64 {
                return Err(Error::InvalidArgument(format!(
                    "rank {r}'s scratch is {} bytes, this rank's layout needs {}: the ranks \
                     were configured differently ({names})",
                    h.len, layout.total
                )));
            }
            let imported = device.import_memory(&h)?;
            bases[r] = imported.ptr();
            peers.push(imported);
        }
        bootstrap.barrier()?;
        tracing::debug!(rank, world, bytes = layout.total, "shared scratch mapped");
        Ok(SharedScratch {
            layout,
            bases,
            rank,
            world,
            peers,
            memory,
        })
    }

    /// This rank's own base.
    pub fn own(&self) -> DevicePtr {
        self.bases[self.rank as usize]
    }

    /// The peers' scratch regions mapped here.
    pub fn peer_mappings(&self) -> usize {
        self.peers.len()
    }

    /// Where the kernels record their first failure in this rank's scratch.
    pub fn error_word(&self) -> Result<DevicePtr> {
        self.memory
            .ptr()
            .offset(OXCCL_ALLREDUCE_SYNC_ERROR as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_aligned_and_sized() {
        let l = ScratchLayout::new(4, 1 << 20, 64 << 20).unwrap();
        assert_eq!(l.packet_offset, 65536);
        assert_eq!(l.packet_half % 4096, 0);
        assert!(l.packet_half >= 4 * 2 * (1 << 20));
        assert_eq!(l.ll128_offset, l.packet_offset + 2 * l.packet_half);
        assert!(l.ll128_half >= 4 * one_shot_ll128::slot_bytes(1 << 20));
        assert_eq!(l.mailbox_offset, l.ll128_offset + 2 * l.ll128_half);
        assert_eq!(l.data_offset, l.mailbox_offset + 2 * l.packet_half);
        assert_eq!(l.total, l.data_offset + 2 * l.staging);
        assert_eq!(l.zeroed_prefix(), l.data_offset);
        assert_eq!(
            l.flag_region(FlagRegion::Lines),
            (l.ll128_offset, l.ll128_half)
        );
        assert_eq!(
            l.flag_region(FlagRegion::Mailbox),
            (l.mailbox_offset, l.packet_half)
        );
        assert!(ScratchLayout::new(8, usize::MAX / 4, 1).is_err());
    }
}
