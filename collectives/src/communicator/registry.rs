//! User buffers registered on every rank ([`super::Communicator::register`]): each rank's
//! own, the peers' as mapped here, and the per-call view zero-copy algorithms take.

use std::collections::BTreeMap;
use std::sync::Mutex;

use oxccl_backend::AnyImported;
use oxccl_hal::DevicePtr;
use oxccl_kernels::abi::OXCCL_ALLREDUCE_MAX_RANKS;

use crate::algorithms::PeerBuffers;

/// One buffer registered on every rank.
#[derive(Debug)]
pub(crate) struct Registered {
    /// Bytes of this rank's buffer.
    pub(crate) len: usize,
    /// Every rank's buffer as mapped here (index = rank; this rank's own at `rank`).
    pub(crate) bases: [DevicePtr; OXCCL_ALLREDUCE_MAX_RANKS as usize],
    /// Every rank's buffer length.
    pub(crate) lens: [u64; OXCCL_ALLREDUCE_MAX_RANKS as usize],
    /// The peers' mappings (kept while registered).
    pub(crate) _imports: Vec<AnyImported>,
}

/// The registered buffers of a communicator, by base address on this rank.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    buffers: Mutex<BTreeMap<u64, Registered>>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Registered>> {
        self.buffers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `base` is registered with `len` bytes already.
    pub(crate) fn contains(&self, base: DevicePtr, len: usize) -> bool {
        self.lock().get(&base.0).is_some_and(|r| r.len == len)
    }

    /// Adds (or replaces) the registration of `base`.
    pub(crate) fn insert(&self, base: DevicePtr, registered: Registered) {
        self.lock().insert(base.0, registered);
    }

    /// Removes the registration of `base` (its peers' mappings are released when the
    /// returned value drops).
    pub(crate) fn remove(&self, base: DevicePtr) -> Option<Registered> {
        self.lock().remove(&base.0)
    }

    /// Number of registered buffers.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Every rank's input and output (`(pointer, bytes)`, each when asked for) as mapped
    /// here, when each asked for lies 16-byte aligned inside a registered buffer that is
    /// long enough on every rank; `None` when any does not, or neither is asked for. The
    /// views of a buffer not asked for are null, its offset `u64::MAX`.
    pub(crate) fn peer_buffers(
        &self,
        input: Option<(DevicePtr, usize)>,
        output: Option<(DevicePtr, usize)>,
        world: u32,
    ) -> Option<PeerBuffers> {
        if input.is_none() && output.is_none() {
            return None;
        }
        let reg = self.lock();
        let find = |(p, bytes): (DevicePtr, usize)| {
            if !p.is_aligned(16) {
                return None;
            }
            let (base, r) = reg.range(..=p.0).next_back()?;
            let off = p.0 - base;
            let end = off.checked_add(bytes as u64)?;
            (end <= r.len as u64 && r.lens[..world as usize].iter().all(|l| end <= *l))
                .then_some((r, off))
        };
        let view = |b: Option<(DevicePtr, usize)>| match b {
            Some(b) => find(b).map(Some),
            None => Some(None),
        };
        let (inputs, outputs) = (view(input)?, view(output)?);
        let mut z = PeerBuffers {
            inputs: [DevicePtr::NULL; OXCCL_ALLREDUCE_MAX_RANKS as usize],
            outputs: [DevicePtr::NULL; OXCCL_ALLREDUCE_MAX_RANKS as usize],
            offsets: (
                inputs.map_or(u64::MAX, |(_, o)| o),
                outputs.map_or(u64::MAX, |(_, o)| o),
            ),
        };
        for r in 0..world as usize {
            if let Some((ri, oi)) = inputs {
                z.inputs[r] = DevicePtr(ri.bases[r].0.checked_add(oi)?);
            }
            if let Some((ro, oo)) = outputs {
                z.outputs[r] = DevicePtr(ro.bases[r].0.checked_add(oo)?);
            }
        }
        Some(z)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registered(bases: [u64; 2], lens: [u64; 2]) -> Registered {
        let mut b = [DevicePtr::NULL; OXCCL_ALLREDUCE_MAX_RANKS as usize];
        let mut l = [0u64; OXCCL_ALLREDUCE_MAX_RANKS as usize];
        for r in 0..2 {
            b[r] = DevicePtr(bases[r]);
            l[r] = lens[r];
        }
        Registered {
            len: lens[0] as usize,
            bases: b,
            lens: l,
            _imports: Vec::new(),
        }
    }

    #[test]
    fn views_need_alignment_and_room_on_every_rank() {
        let reg = Registry::default();
        reg.insert(
            DevicePtr(0x1000),
            registered([0x1000, 0x9000], [4096, 2048]),
        );
        assert!(reg.contains(DevicePtr(0x1000), 4096));
        assert!(!reg.contains(DevicePtr(0x1000), 100));
        let v = reg
            .peer_buffers(
                Some((DevicePtr(0x1010), 1024)),
                Some((DevicePtr(0x1100), 1024)),
                2,
            )
            .unwrap();
        assert_eq!(v.inputs[1], DevicePtr(0x9010));
        assert_eq!(v.outputs[1], DevicePtr(0x9100));
        assert_eq!(v.offsets, (0x10, 0x100));
        // Unaligned, past the peer's shorter buffer, or not registered: no view.
        assert!(reg
            .peer_buffers(
                Some((DevicePtr(0x1002), 16)),
                Some((DevicePtr(0x1100), 16)),
                2
            )
            .is_none());
        assert!(reg
            .peer_buffers(
                Some((DevicePtr(0x1000), 3000)),
                Some((DevicePtr(0x1000), 3000)),
                2
            )
            .is_none());
        assert!(reg
            .peer_buffers(
                Some((DevicePtr(0x100), 16)),
                Some((DevicePtr(0x1000), 16)),
                2
            )
            .is_none());
        // Output only (all-gather): no input view.
        let v = reg
            .peer_buffers(None, Some((DevicePtr(0x1100), 1024)), 2)
            .unwrap();
        assert_eq!(
            (v.inputs[1], v.outputs[1]),
            (DevicePtr::NULL, DevicePtr(0x9100))
        );
        assert_eq!(v.offsets, (u64::MAX, 0x100));
        // Input only (reduce-scatter); neither: no view.
        let v = reg
            .peer_buffers(Some((DevicePtr(0x1010), 1024)), None, 2)
            .unwrap();
        assert_eq!(
            (v.inputs[1], v.outputs[1]),
            (DevicePtr(0x9010), DevicePtr::NULL)
        );
        assert!(reg.peer_buffers(None, None, 2).is_none());
        assert!(reg.remove(DevicePtr(0x1000)).is_some());
        assert_eq!(reg.len(), 0);
    }
}
