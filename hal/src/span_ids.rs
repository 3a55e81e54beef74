//! Identities of ranges across several allocations mapped side by side (CUDA VMM chunks,
//! the host backend's `HostChunks`): a caller's buffer may cross allocations, and the range
//! that holds it is found, exported and mapped as one allocation
//! ([`crate::Device::find_allocation`]), so it needs an identity of its own: the same while
//! the same allocations lie there, a new one when any of them was freed and mapped again.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Most ranges remembered per table: past it the table starts again (a range found again
/// then gets a new identity, and is exported again once).
const MAX_SPANS: usize = 4096;

/// Identities handed out, process-wide: the top bit set, so they never equal an
/// allocation's own (the backends count those from 1), and never reused.
static NEXT_SPAN_ID: AtomicU64 = AtomicU64::new(1 << 63);

/// Range identities by the identities of the allocations they cover, in address order.
#[derive(Debug, Default)]
pub struct SpanIds {
    table: Mutex<BTreeMap<Vec<u64>, u64>>,
}

impl SpanIds {
    /// An empty table (usable in a `static`).
    pub const fn new() -> SpanIds {
        SpanIds {
            table: Mutex::new(BTreeMap::new()),
        }
    }

    /// The identity of the range across the allocations `ids` (in address order).
    pub fn id_of(&self, ids: &[u64]) -> u64 {
        // Each update is one insert or a clear: a poisoned lock still holds a usable table.
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&id) = table.get(ids) {
            return id;
        }
        if table.len() >= MAX_SPANS {
            table.clear();
        }
        let id = NEXT_SPAN_ID.fetch_add(1, Ordering::Relaxed);
        table.insert(ids.to_vec(), id);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_identity_per_sequence_of_allocations() {
        let spans = SpanIds::new();
        let a = spans.id_of(&[3, 4]);
        assert_eq!(spans.id_of(&[3, 4]), a);
        let b = spans.id_of(&[4, 3]);
        let c = spans.id_of(&[3, 4, 5]);
        assert!(a != b && b != c && a != c);
        assert!([a, b, c].iter().all(|id| id >> 63 == 1));
        // Another table never hands out an identity this one did.
        assert!(![a, b, c].contains(&SpanIds::new().id_of(&[3, 4])));
    }
}
