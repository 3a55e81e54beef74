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
        tracing::debug!(id = handle.id, owner = handle.owner_pid, "IPC handle opened");
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
