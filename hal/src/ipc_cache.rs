//! The IPC handle cache: every import of peer memory goes through it.
//!
//! On ROCm, opening a handle that is already open in the process fails or leaks, and the
//! number of open handles is limited, so imports are shared by handle identity and
//! reference-counted ([`CachePolicy::Shared`]); the handle is closed exactly once, when the
//! last user drops. The CUDA driver reference-counts imports itself, so there the cache is a
//! pass-through ([`CachePolicy::PassThrough`]): each import opens and each drop closes,
//! behind the same interface.
//!
//! Close runs with the cache lock held, so a re-import of the same handle never races an
//! unfinished close.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::ipc::{IpcHandle, IpcKey};

/// A backend's way of opening and closing imported handles.
pub trait IpcOpener: Send + Sync + 'static {
    /// What an open handle yields (a mapped address, a backend object).
    type Mapping: fmt::Debug + Send + Sync;

    /// Opens (maps) a handle. Called once per distinct handle under `Shared`.
    fn open(&self, handle: &IpcHandle) -> Result<Self::Mapping>;

    /// Closes a mapping made by [`IpcOpener::open`]. Called exactly once per mapping, after
    /// its last user is gone; mappings are plain data (addresses), not owners.
    fn close(&self, mapping: &Self::Mapping) -> Result<()>;
}

/// How imports of the same handle are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CachePolicy {
    /// One mapping per distinct handle, shared and reference-counted; at most `max_live`
    /// distinct handles open at once when set.
    Shared {
        /// Bound on distinct open handles.
        max_live: Option<usize>,
    },
    /// Every import opens, every drop closes (the driver counts references).
    PassThrough,
}

struct Slot<M> {
    mapping: Arc<M>,
    users: usize,
}

struct Inner<O: IpcOpener> {
    opener: O,
    policy: CachePolicy,
    state: Mutex<State<O::Mapping>>,
}

struct State<M> {
    slots: HashMap<(IpcKey, u64), Slot<M>>,
    next_serial: u64,
}

/// The cache. Cheap to clone; clones share state.
pub struct IpcCache<O: IpcOpener> {
    inner: Arc<Inner<O>>,
}

impl<O: IpcOpener> Clone for IpcCache<O> {
    fn clone(&self) -> Self {
        IpcCache {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<O: IpcOpener> fmt::Debug for IpcCache<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcCache")
            .field("policy", &self.inner.policy)
            .field("live", &self.live())
            .finish()
    }
}

fn lock<M>(m: &Mutex<State<M>>) -> MutexGuard<'_, State<M>> {
    // A panic while holding the lock cannot leave the map half-updated (every update is a
    // single insert/remove), so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<O: IpcOpener> IpcCache<O> {
    /// A cache over `opener` with the given policy.
    pub fn new(opener: O, policy: CachePolicy) -> Self {
        IpcCache {
            inner: Arc::new(Inner {
                opener,
                policy,
                state: Mutex::new(State {
                    slots: HashMap::new(),
                    next_serial: 1,
                }),
            }),
        }
    }

    /// The policy this cache was made with.
    pub fn policy(&self) -> CachePolicy {
        self.inner.policy
    }

    /// The opener (for backends that need it to build their mapping type).
    pub fn opener(&self) -> &O {
        &self.inner.opener
    }

    /// Number of mappings open now.
    pub fn live(&self) -> usize {
        lock(&self.inner.state).slots.len()
    }

    /// Imports `handle`: returns the existing mapping if it is open (`Shared`), else opens it.
    pub fn import(&self, handle: &IpcHandle) -> Result<CachedImport<O>> {
        let key = handle.key();
        let mut state = lock(&self.inner.state);
        let serial = match self.inner.policy {
            CachePolicy::Shared { max_live } => {
                if let Some(slot) = state.slots.get_mut(&(key.clone(), 0)) {
                    slot.users += 1;
                    tracing::debug!(id = handle.id, users = slot.users, "IPC cache hit");
                    return Ok(CachedImport {
                        cache: Arc::clone(&self.inner),
                        key: (key, 0),
                        mapping: Arc::clone(&slot.mapping),
                    });
                }
                if let Some(limit) = max_live {
                    if state.slots.len() >= limit {
                        return Err(Error::IpcCacheFull {
                            live: state.slots.len(),
                            limit,
                        });
                    }
                }
                0
            }
            CachePolicy::PassThrough => {
                let s = state.next_serial;
                state.next_serial += 1;
                s
            }
        };
        let mapping = Arc::new(self.inner.opener.open(handle)?);
        tracing::debug!(
            id = handle.id,
            owner = handle.owner_pid,
            "IPC handle opened"
        );
        state.slots.insert(
            (key.clone(), serial),
            Slot {
                mapping: Arc::clone(&mapping),
                users: 1,
            },
        );
        Ok(CachedImport {
            cache: Arc::clone(&self.inner),
            key: (key, serial),
            mapping,
        })
    }
}

/// One user's reference to an imported mapping. Clones are further users of the same
/// mapping; the mapping is closed when the last one drops.
pub struct CachedImport<O: IpcOpener> {
    cache: Arc<Inner<O>>,
    key: (IpcKey, u64),
    mapping: Arc<O::Mapping>,
}

impl<O: IpcOpener> CachedImport<O> {
    /// The mapping.
    pub fn mapping(&self) -> &O::Mapping {
        &self.mapping
    }
}

impl<O: IpcOpener> fmt::Debug for CachedImport<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedImport")
            .field("mapping", &self.mapping)
            .finish()
    }
}

impl<O: IpcOpener> Clone for CachedImport<O> {
    fn clone(&self) -> Self {
        let mut state = lock(&self.cache.state);
        if let Some(slot) = state.slots.get_mut(&self.key) {
            slot.users += 1;
        }
        CachedImport {
            cache: Arc::clone(&self.cache),
            key: self.key.clone(),
            mapping: Arc::clone(&self.mapping),
        }
    }
}

impl<O: IpcOpener> Drop for CachedImport<O> {
    fn drop(&mut self) {
        let mut state = lock(&self.cache.state);
        let last = match state.slots.get_mut(&self.key) {
            Some(slot) => {
                slot.users -= 1;
                slot.users == 0
            }
            None => false,
        };
        if !last {
            return;
        }
        if let Some(slot) = state.slots.remove(&self.key) {
            if let Err(e) = self.cache.opener.close(&slot.mapping) {
                tracing::warn!(error = %e, "closing an imported IPC handle failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipc::IpcHandleKind;
    use crate::types::BackendKind;
    use proptest::prelude::*;
    use std::collections::{HashMap, HashSet};

    /// Counts opens and closes, and records every protocol violation it sees.
    #[derive(Default)]
    struct Books {
        next_serial: u64,
        /// Open mappings: serial -> handle id.
        open: HashMap<u64, u64>,
        opens: u64,
        closes: u64,
        violations: Vec<String>,
    }

    #[derive(Clone, Default)]
    struct FakeOpener {
        books: Arc<Mutex<Books>>,
        fail_ids: Arc<HashSet<u64>>,
        /// Under `Shared`, a key must never be open twice at once.
        one_per_key: bool,
    }

    #[derive(Debug, PartialEq, Eq)]
    struct FakeMapping {
        serial: u64,
        id: u64,
    }

    impl FakeOpener {
        fn books(&self) -> MutexGuard<'_, Books> {
            self.books.lock().unwrap()
        }
        fn open_count(&self) -> usize {
            self.books().open.len()
        }
    }

    impl IpcOpener for FakeOpener {
        type Mapping = FakeMapping;

        fn open(&self, handle: &IpcHandle) -> Result<FakeMapping> {
            if self.fail_ids.contains(&handle.id) {
                return Err(Error::Ipc(format!("fake open of {} fails", handle.id)));
            }
            let mut b = self.books();
            if self.one_per_key && b.open.values().any(|&id| id == handle.id) {
                b.violations
                    .push(format!("key {} opened while already open", handle.id));
            }
            b.next_serial += 1;
            let serial = b.next_serial;
            b.open.insert(serial, handle.id);
            b.opens += 1;
            Ok(FakeMapping {
                serial,
                id: handle.id,
            })
        }

        fn close(&self, mapping: &FakeMapping) -> Result<()> {
            let mut b = self.books();
            b.closes += 1;
            if b.open.remove(&mapping.serial).is_none() {
                b.violations.push(format!(
                    "mapping {} of key {} closed twice or while not open",
                    mapping.serial, mapping.id
                ));
            }
            Ok(())
        }
    }

    fn handle(id: u64) -> IpcHandle {
        IpcHandle {
            backend: BackendKind::Host,
            kind: IpcHandleKind::HostMemfd,
            owner_pid: 4321,
            owner_nonce: 0x1234_5678_9abc_def0,
            id,
            len: 4096,
            payload: Vec::new(),
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Import(u64),
        Clone(usize),
        Drop(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u64..=5).prop_map(Op::Import),
            any::<usize>().prop_map(Op::Clone),
            any::<usize>().prop_map(Op::Drop),
        ]
    }

    /// Runs `ops` against a cache with `policy`, checking the open count after every step.
    fn run_model(policy: CachePolicy, ops: &[Op]) -> std::result::Result<(), TestCaseError> {
        let opener = FakeOpener {
            one_per_key: matches!(policy, CachePolicy::Shared { .. }),
            ..FakeOpener::default()
        };
        let cache = IpcCache::new(opener.clone(), policy);
        // Live imports with the group they belong to (the import() call that opened them).
        let mut live: Vec<(CachedImport<FakeOpener>, u64, usize)> = Vec::new();
        let mut next_group = 0usize;
        for op in ops {
            match *op {
                Op::Import(id) => {
                    let imp = cache.import(&handle(id)).unwrap();
                    prop_assert_eq!(imp.mapping().id, id);
                    if let CachePolicy::Shared { .. } = policy {
                        if let Some((other, _, _)) = live.iter().find(|(_, k, _)| *k == id) {
                            prop_assert_eq!(other.mapping().serial, imp.mapping().serial);
                        }
                    }
                    next_group += 1;
                    live.push((imp, id, next_group));
                }
                Op::Clone(i) if !live.is_empty() => {
                    let (imp, id, group) = &live[i % live.len()];
                    let copy = imp.clone();
                    prop_assert_eq!(copy.mapping().serial, imp.mapping().serial);
                    live.push((copy, *id, *group));
                }
                Op::Drop(i) if !live.is_empty() => {
                    let n = live.len();
                    drop(live.swap_remove(i % n));
                }
                _ => {}
            }
            let expected = match policy {
                CachePolicy::Shared { .. } => live
                    .iter()
                    .map(|(_, k, _)| *k)
                    .collect::<HashSet<_>>()
                    .len(),
                CachePolicy::PassThrough => live
                    .iter()
                    .map(|(_, _, g)| *g)
                    .collect::<HashSet<_>>()
                    .len(),
            };
            prop_assert_eq!(opener.open_count(), expected, "after {:?}", op);
            prop_assert_eq!(cache.live(), expected);
        }
        live.clear();
        let b = opener.books();
        prop_assert!(b.violations.is_empty(), "{:?}", b.violations);
        prop_assert!(b.open.is_empty(), "still open: {:?}", b.open);
        prop_assert_eq!(b.opens, b.closes);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn open_count_matches_the_model(ops in proptest::collection::vec(op(), 1..64)) {
            run_model(CachePolicy::Shared { max_live: None }, &ops)?;
            run_model(CachePolicy::PassThrough, &ops)?;
        }
    }

    #[test]
    fn threads_importing_and_dropping_end_with_nothing_open() {
        for policy in [
            CachePolicy::Shared { max_live: None },
            CachePolicy::PassThrough,
        ] {
            let opener = FakeOpener {
                one_per_key: matches!(policy, CachePolicy::Shared { .. }),
                ..FakeOpener::default()
            };
            let cache = IpcCache::new(opener.clone(), policy);
            let threads: Vec<_> = (0..8u64)
                .map(|t| {
                    let cache = cache.clone();
                    std::thread::spawn(move || {
                        let mut held = Vec::new();
                        for i in 0..500u64 {
                            let id = 1 + (i * 7 + t) % 3;
                            held.push(cache.import(&handle(id)).unwrap());
                            if i % 3 == 0 {
                                held.push(held[held.len() - 1].clone());
                            }
                            if held.len() > 4 {
                                held.remove((i as usize * 5) % held.len());
                            }
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            let b = opener.books();
            assert!(b.violations.is_empty(), "{policy:?}: {:?}", b.violations);
            assert!(b.open.is_empty(), "{policy:?}");
            assert!(b.opens > 0 && b.opens == b.closes, "{policy:?}");
            assert_eq!(cache.live(), 0);
        }
    }

    #[test]
    fn max_live_bounds_distinct_handles_only() {
        let opener = FakeOpener {
            one_per_key: true,
            ..FakeOpener::default()
        };
        let cache = IpcCache::new(opener.clone(), CachePolicy::Shared { max_live: Some(2) });
        let a = cache.import(&handle(1)).unwrap();
        let b = cache.import(&handle(2)).unwrap();
        // A handle already open is a hit, not a new entry.
        let a2 = cache.import(&handle(1)).unwrap();
        let err = cache.import(&handle(3)).unwrap_err();
        assert!(
            matches!(err, Error::IpcCacheFull { live: 2, limit: 2 }),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.contains("2 live imports") && text.contains("limit 2"),
            "{text}"
        );
        drop(a);
        // Still held through `a2`.
        assert!(cache.import(&handle(3)).is_err());
        drop(a2);
        let c = cache.import(&handle(3)).unwrap();
        assert_eq!(opener.open_count(), 2);
        drop((b, c));
        assert_eq!(opener.open_count(), 0);
    }

    #[test]
    fn failed_open_registers_nothing() {
        for policy in [
            CachePolicy::Shared { max_live: Some(1) },
            CachePolicy::PassThrough,
        ] {
            let opener = FakeOpener {
                fail_ids: Arc::new([9u64].into_iter().collect()),
                ..FakeOpener::default()
            };
            let cache = IpcCache::new(opener.clone(), policy);
            let err = cache.import(&handle(9)).unwrap_err();
            assert!(err.to_string().contains("fake open of 9 fails"), "{err}");
            assert_eq!(cache.live(), 0, "{policy:?}");
            // The failed attempt took no slot of the bound.
            let ok = cache.import(&handle(1)).unwrap();
            assert_eq!(cache.live(), 1);
            drop(ok);
            let b = opener.books();
            assert_eq!((b.opens, b.closes), (1, 1), "{policy:?}");
            assert!(b.violations.is_empty());
        }
    }
}
