//! Host-side atomic access to 8-byte flags in host-visible memory.
//!
//! Semaphores and proxy FIFOs live in memory that several agents write: GPUs, proxy threads,
//! other processes mapping the same pages. The host side touches such a flag only through
//! [`HostFlag`], whose operations are the acquire/release atomics the device code pairs
//! with (system-scope loads, stores and fetch-adds).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::api::{HostVisible, Memory};
use crate::error::{Error, Result};

/// Spins before a waiter starts yielding the CPU: long enough to catch a peer that is a
/// few hundred nanoseconds behind, short enough not to starve it on an oversubscribed host.
const SPINS_BEFORE_YIELD: u32 = 1 << 10;

/// An 8-byte flag in host-visible memory, accessed atomically.
///
/// ```
/// # use oxccl_hal::{atomics::HostFlag, Backend, Device, host::HostBackend};
/// # fn main() -> oxccl_hal::Result<()> {
/// let dev = HostBackend::open_device(oxccl_hal::DeviceId(0))?;
/// let mem = dev.alloc_host(64)?;
/// let flag = HostFlag::new(&mem, 8)?;
/// flag.fetch_add_release(1);
/// assert_eq!(flag.wait_at_least(1, std::time::Duration::from_secs(1))?, 1);
/// # Ok(()) }
/// ```
pub struct HostFlag<'a> {
    cell: &'a AtomicU64,
    name: String,
}

impl fmt::Debug for HostFlag<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostFlag")
            .field("name", &self.name)
            .field("value", &self.load_acquire())
            .finish()
    }
}

impl<'a> HostFlag<'a> {
    /// The flag at byte `offset` of `mem`.
    ///
    /// Fails with [`Error::InvalidArgument`] when the 8 bytes do not fit in `mem` or the
    /// address is not 8-byte aligned.
    pub fn new<M: Memory + HostVisible>(mem: &'a M, offset: usize) -> Result<Self> {
        let end = offset.checked_add(8).filter(|&end| end <= mem.len());
        if end.is_none() {
            return Err(Error::InvalidArgument(format!(
                "flag at offset {offset} does not fit in {} bytes of memory",
                mem.len()
            )));
        }
        let base = mem.host_ptr();
        if base.is_null() {
            return Err(Error::InvalidArgument("memory has no host address".into()));
        }
        let addr = (base as usize).wrapping_add(offset);
        if addr % 8 != 0 {
            return Err(Error::InvalidArgument(format!(
                "flag at offset {offset} (address {addr:#x}) is not 8-byte aligned"
            )));
        }
        // SAFETY: `offset + 8 <= mem.len()` was checked, so the pointer stays inside the
        // allocation that `host_ptr` names.
        let ptr = unsafe { base.add(offset) };
        // SAFETY: the 8 bytes are inside `mem`, aligned (checked), and stay mapped for 'a
        // because `mem` is borrowed for 'a. Host-visible memory is shared with other agents
        // by design and is only ever accessed through atomics by oxccl's protocols.
        let cell = unsafe { AtomicU64::from_ptr(ptr.cast::<u64>()) };
        Ok(HostFlag {
            cell,
            name: format!("flag at offset {offset} ({addr:#x})"),
        })
    }

    /// The flag at `ptr`, for memory that is not a HAL object (e.g. a mapping made by hand).
    ///
    /// Fails with [`Error::InvalidArgument`] when `ptr` is null or not 8-byte aligned.
    ///
    /// # Safety
    /// - `ptr` must point to 8 bytes that stay mapped, readable and writable for `'a`;
    /// - during `'a`, every access to those bytes, from any thread or process, must be
    ///   atomic (no plain reads or writes racing with the flag's operations).
    pub unsafe fn from_ptr(ptr: *mut u8) -> Result<Self> {
        if ptr.is_null() {
            return Err(Error::InvalidArgument("flag pointer is null".into()));
        }
        let addr = ptr as usize;
        if addr % 8 != 0 {
            return Err(Error::InvalidArgument(format!(
                "flag address {addr:#x} is not 8-byte aligned"
            )));
        }
        // SAFETY: non-null and aligned (checked); validity for 'a and atomic-only access
        // are the caller's obligations stated above.
        let cell = unsafe { AtomicU64::from_ptr(ptr.cast::<u64>()) };
        Ok(HostFlag {
            cell,
            name: format!("flag at {addr:#x}"),
        })
    }

    /// Names the flag in timeout errors (e.g. "signal from rank 3").
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The flag's name as used in errors.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host address of the flag.
    pub fn as_ptr(&self) -> *mut u64 {
        self.cell.as_ptr()
    }

    /// Reads the flag; later reads and writes of the data it guards see what the writer
    /// wrote before its release.
    pub fn load_acquire(&self) -> u64 {
        self.cell.load(Ordering::Acquire)
    }

    /// Writes the flag, publishing every write made before it.
    pub fn store_release(&self, value: u64) {
        self.cell.store(value, Ordering::Release);
    }

    /// Adds `value` (wrapping) and returns the previous value; publishes earlier writes and
    /// sees those published before the previous value.
    pub fn fetch_add_release(&self, value: u64) -> u64 {
        self.cell.fetch_add(value, Ordering::AcqRel)
    }

    /// Waits until the flag is at least `target` and returns the value seen.
    ///
    /// Spins briefly, then yields between polls. Fails with [`Error::Timeout`], naming the
    /// flag, the target and the last value seen, after `timeout`.
    pub fn wait_at_least(&self, target: u64, timeout: Duration) -> Result<u64> {
        let start = Instant::now();
        let mut polls: u32 = 0;
        loop {
            let v = self.load_acquire();
            if v >= target {
                return Ok(v);
            }
            polls = polls.saturating_add(1);
            if polls < SPINS_BEFORE_YIELD {
                std::hint::spin_loop();
                continue;
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(Error::Timeout {
                    what: format!("{} to reach {target} (last seen {v})", self.name),
                    waited,
                });
            }
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostBackend;
    use crate::{Backend, Device, DeviceId};
    use std::sync::Arc;

    #[test]
    fn bounds_and_alignment_are_checked() {
        let dev = HostBackend::open_device(DeviceId(0)).unwrap();
        let mem = dev.alloc_host(24).unwrap();
        assert!(HostFlag::new(&mem, 16).is_ok());
        let e = HostFlag::new(&mem, 17).unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
        let e = HostFlag::new(&mem, 20).unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
        let e = HostFlag::new(&mem, usize::MAX - 3).unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
        let e = HostFlag::new(&mem, 4).unwrap_err();
        assert!(e.to_string().contains("not 8-byte aligned"), "{e}");
        // SAFETY: null is refused before any access.
        let e = unsafe { HostFlag::from_ptr(std::ptr::null_mut()) }.unwrap_err();
        assert!(e.to_string().contains("null"), "{e}");
        // SAFETY: misaligned is refused before any access.
        let e = unsafe { HostFlag::from_ptr(mem.host_ptr().wrapping_add(3)) }.unwrap_err();
        assert!(e.to_string().contains("aligned"), "{e}");
    }

    #[test]
    fn operations_see_each_other_and_timeout_names_the_flag() {
        let dev = HostBackend::open_device(DeviceId(0)).unwrap();
        let mem = dev.alloc_host(64).unwrap();
        let a = HostFlag::new(&mem, 8).unwrap();
        // SAFETY: the same 8 bytes of a live allocation, accessed only atomically.
        let b = unsafe { HostFlag::from_ptr(mem.host_ptr().add(8)) }.unwrap();
        let x = 0x1234_5678_9abc_def1u64;
        a.store_release(x);
        assert_eq!(b.load_acquire(), x);
        assert_eq!(b.fetch_add_release(5), x);
        assert_eq!(a.load_acquire(), x + 5);
        let e = a
            .with_name("signal from rank 3")
            .wait_at_least(x + 6, Duration::from_millis(20))
            .unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::Timeout { .. }), "{text}");
        assert!(text.contains("signal from rank 3"), "{text}");
        assert!(text.contains(&format!("last seen {}", x + 5)), "{text}");
    }

    #[test]
    fn threads_signal_through_fetch_add_and_publish_data() {
        let dev = HostBackend::open_device(DeviceId(0)).unwrap();
        let mem = Arc::new(dev.alloc_host(4096).unwrap());
        let threads = 4u64;
        let adds = 1000u64;
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let mem = Arc::clone(&mem);
                std::thread::spawn(move || {
                    let flag = HostFlag::new(&*mem, 0).unwrap();
                    let slot = HostFlag::new(&*mem, 64 + 8 * t as usize).unwrap();
                    for i in 0..adds {
                        slot.store_release(t * 1_000_000 + i + 1);
                        flag.fetch_add_release(1);
                    }
                })
            })
            .collect();
        let flag = HostFlag::new(&*mem, 0).unwrap();
        let seen = flag
            .wait_at_least(threads * adds, Duration::from_secs(30))
            .unwrap();
        assert_eq!(seen, threads * adds);
        for h in handles {
            h.join().unwrap();
        }
        for t in 0..threads {
            let slot = HostFlag::new(&*mem, 64 + 8 * t as usize).unwrap();
            assert_eq!(slot.load_acquire(), t * 1_000_000 + adds);
        }
    }
}
