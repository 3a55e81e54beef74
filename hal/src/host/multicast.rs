//! Multicast emulation on the host backend.
//!
//! A hardware multicast object (NVLS) is one address whose loads reduce over, and whose
//! stores broadcast to, the memories its members bound. The host backend emulates the
//! group with a shared **member table**: a memfd that every member maps, where each member
//! publishes, when it binds, the IPC handle of its memory. Members in other processes see
//! each other's bindings through that shared memory and import each other's memory lazily,
//! through the device's IPC cache, the first time they reduce or broadcast.
//!
//! Table layout (little-endian `u64` words, all accessed atomically):
//! - header, [`HEADER_BYTES`]: magic, member count, object size, slots claimed;
//! - one slot of [`SLOT_BYTES`] per member: state (0 free or being written, 1 bound), bind
//!   offset, bound length, handle length, then the handle bytes packed into words.
//!
//! A member claims a slot with a fetch-add on the header, fills it, and publishes it with a
//! release store of the state; readers acquire the state before reading the rest.
//!
//! The multicast safety gate ([`crate::multicast_gate`]) does not apply here: it protects
//! NVSwitch hardware, and this emulation never touches a GPU.
//!
//! Device code never runs on the host backend, so there is no multicast *address* to load
//! from: [`Multicast::map`] returns this member's own bound memory (a view that stays valid
//! while the object lives), and host kernels use [`HostMulticast::reduce`] and
//! [`HostMulticast::broadcast`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::memory::{page_size, HostImport, HostMemory, HostOpener, MAX_ALLOCATION};
use super::HostBackend;
use crate::api::{HostVisible, Memory, Multicast};
use crate::error::{Error, Result};
use crate::ipc::{IpcHandle, IpcHandleKind};
use crate::ipc_cache::IpcCache;
use crate::types::{BackendKind, DataType, DeviceId, DevicePtr, ReduceOp};

/// Most members one emulated multicast object can have.
pub const MAX_MULTICAST_MEMBERS: u32 = 256;

const MAGIC: u64 = u64::from_le_bytes(*b"OXMCAST1");
const HEADER_BYTES: usize = 64;
const SLOT_BYTES: usize = 256;
const SLOT_HANDLE_AT: usize = 32;
const MAX_HANDLE_BYTES: usize = SLOT_BYTES - SLOT_HANDLE_AT;
const PAYLOAD_BYTES: usize = 12;

const H_MAGIC: usize = 0;
const H_MEMBERS: usize = 8;
const H_BYTES: usize = 16;
const H_CLAIMED: usize = 24;
const S_STATE: usize = 0;
const S_OFFSET: usize = 8;
const S_LEN: usize = 16;
const S_HANDLE_LEN: usize = 24;

const SLOT_BOUND: u64 = 1;

fn table_bytes(members: u32) -> usize {
    HEADER_BYTES + SLOT_BYTES * members as usize
}

/// The member table's backing: the creator owns it, joiners import it.
#[derive(Debug)]
enum TableMemory {
    Owned(HostMemory),
    Imported(HostImport),
}

impl TableMemory {
    fn base(&self) -> *mut u8 {
        match self {
            TableMemory::Owned(m) => m.host_ptr(),
            TableMemory::Imported(m) => m.host_ptr(),
        }
    }
    fn len(&self) -> usize {
        match self {
            TableMemory::Owned(m) => m.len(),
            TableMemory::Imported(m) => m.len(),
        }
    }
}

/// One member's bound memory as this process sees it.
#[derive(Debug, Clone)]
struct MemberView {
    memory: HostImport,
    /// Where the member's memory starts in the multicast object.
    offset: usize,
    /// How many bytes it covers.
    len: usize,
}

impl MemberView {
    /// Host address of multicast bytes `[offset, offset + bytes)` in this member.
    fn address(&self, offset: usize, bytes: usize, slot: usize) -> Result<*mut u8> {
        let end = offset.checked_add(bytes);
        let covered = offset >= self.offset && end.is_some_and(|e| e <= self.offset + self.len);
        if !covered {
            return Err(Error::InvalidArgument(format!(
                "multicast bytes {offset}..+{bytes} are not covered by member {slot}, which \
                 bound {}..{}",
                self.offset,
                self.offset + self.len
            )));
        }
        // SAFETY: the range lies within the member's bound length (checked), which is within
        // the imported mapping held by `self.memory`.
        Ok(unsafe { self.memory.host_ptr().add(offset - self.offset) })
    }
}

#[derive(Debug, Default)]
struct LocalState {
    devices: Vec<DeviceId>,
    own: Option<(usize, MemberView)>,
    views: Vec<Option<MemberView>>,
}

/// One member's handle on an emulated multicast object.
pub struct HostMulticast {
    device: DeviceId,
    cache: IpcCache<HostOpener>,
    table: TableMemory,
    table_handle: IpcHandle,
    len: usize,
    members: u32,
    local: Mutex<LocalState>,
}

impl fmt::Debug for HostMulticast {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMulticast")
            .field("device", &self.device)
            .field("len", &self.len)
            .field("members", &self.members)
            .field("bound", &self.bound_members())
            .finish()
    }
}

impl HostMulticast {
    pub(crate) fn create(
        device: DeviceId,
        cache: IpcCache<HostOpener>,
        bytes: usize,
        members: u32,
    ) -> Result<HostMulticast> {
        if members == 0 || members > MAX_MULTICAST_MEMBERS {
            return Err(Error::InvalidArgument(format!(
                "multicast with {members} members; the host emulation takes 1..={MAX_MULTICAST_MEMBERS}"
            )));
        }
        if bytes == 0 || bytes > MAX_ALLOCATION {
            return Err(Error::InvalidArgument(format!(
                "multicast of {bytes} bytes; it must be 1..={MAX_ALLOCATION}"
            )));
        }
        let len = bytes.checked_next_multiple_of(page_size()).ok_or_else(|| {
            Error::InvalidArgument(format!("{bytes} bytes overflow when rounded to pages"))
        })?;
        let table = HostMemory::allocate(table_bytes(members))?;
        let table_handle = table.export()?;
        let mc = HostMulticast {
            device,
            cache,
            table: TableMemory::Owned(table),
            table_handle,
            len,
            members,
            local: Mutex::new(LocalState::default()),
        };
        mc.word(H_MEMBERS)?
            .store(u64::from(members), Ordering::Relaxed);
        mc.word(H_BYTES)?.store(len as u64, Ordering::Relaxed);
        mc.word(H_MAGIC)?.store(MAGIC, Ordering::Release);
        Ok(mc)
    }

    pub(crate) fn import(
        device: DeviceId,
        cache: IpcCache<HostOpener>,
        handle: &IpcHandle,
    ) -> Result<HostMulticast> {
        handle.expect_backend(BackendKind::Host)?;
        if handle.kind != IpcHandleKind::HostMulticast {
            return Err(Error::Ipc(format!(
                "expected a host multicast handle, got {:?}",
                handle.kind
            )));
        }
        let payload: [u8; PAYLOAD_BYTES] = handle.payload.as_slice().try_into().map_err(|_| {
            Error::Ipc(format!(
                "host multicast handle payload is {} bytes, expected {PAYLOAD_BYTES}",
                handle.payload.len()
            ))
        })?;
        let members = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
        let mut tl = [0u8; 8];
        tl.copy_from_slice(&payload[4..]);
        let table_len = u64::from_le_bytes(tl);
        if members == 0
            || members > MAX_MULTICAST_MEMBERS
            || table_len != table_bytes(members) as u64
        {
            return Err(Error::Ipc(format!(
                "host multicast handle names {members} members and a {table_len}-byte table"
            )));
        }
        let len = usize::try_from(handle.len)
            .ok()
            .filter(|&l| l > 0 && l <= MAX_ALLOCATION)
            .ok_or_else(|| Error::Ipc(format!("multicast size {} is invalid", handle.len)))?;
        let table_handle = IpcHandle {
            backend: BackendKind::Host,
            kind: IpcHandleKind::HostMemfd,
            owner_pid: handle.owner_pid,
            owner_nonce: handle.owner_nonce,
            id: handle.id,
            len: table_len,
            payload: Vec::new(),
        };
        let table = HostImport(cache.import(&table_handle)?);
        let mc = HostMulticast {
            device,
            cache,
            table: TableMemory::Imported(table),
            table_handle,
            len,
            members,
            local: Mutex::new(LocalState::default()),
        };
        let ok = mc.word(H_MAGIC)?.load(Ordering::Acquire) == MAGIC
            && mc.word(H_MEMBERS)?.load(Ordering::Relaxed) == u64::from(members)
            && mc.word(H_BYTES)?.load(Ordering::Relaxed) == len as u64;
        if !ok {
            return Err(Error::Ipc(
                "the memory behind this multicast handle is not a matching member table".into(),
            ));
        }
        Ok(mc)
    }

    pub(crate) fn export(&self) -> Result<IpcHandle> {
        let mut payload = Vec::with_capacity(PAYLOAD_BYTES);
        payload.extend_from_slice(&self.members.to_le_bytes());
        payload.extend_from_slice(&(table_bytes(self.members) as u64).to_le_bytes());
        Ok(IpcHandle {
            backend: BackendKind::Host,
            kind: IpcHandleKind::HostMulticast,
            owner_pid: self.table_handle.owner_pid,
            owner_nonce: self.table_handle.owner_nonce,
            id: self.table_handle.id,
            len: self.len as u64,
            payload,
        })
    }

    /// Number of members the object was created for.
    pub fn members(&self) -> u32 {
        self.members
    }

    /// Number of members that have bound memory so far (in any process).
    pub fn bound_members(&self) -> u32 {
        (0..self.members as usize)
            .filter(|&s| {
                self.word(HEADER_BYTES + s * SLOT_BYTES + S_STATE)
                    .map(|w| w.load(Ordering::Acquire) == SLOT_BOUND)
                    .unwrap_or(false)
            })
            .count() as u32
    }

    /// The devices this member added.
    pub fn devices(&self) -> Vec<DeviceId> {
        self.lock().devices.clone()
    }

    /// The table word at byte `at`.
    fn word(&self, at: usize) -> Result<&AtomicU64> {
        if at % 8 != 0 || at.checked_add(8).is_none_or(|end| end > self.table.len()) {
            return Err(Error::InvalidArgument(format!(
                "multicast table word {at} is outside the {}-byte table",
                self.table.len()
            )));
        }
        // SAFETY: `at` is 8-aligned and inside the table (checked); the table mapping is
        // page-aligned and lives as long as `self`. Every process touches table words only
        // through atomics.
        Ok(unsafe { AtomicU64::from_ptr(self.table.base().add(at).cast::<u64>()) })
    }

    fn lock(&self) -> MutexGuard<'_, LocalState> {
        // Updates are single assignments, so a poisoned lock still holds consistent data.
        self.local.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn claim_slot(&self) -> Result<usize> {
        let members = u64::from(self.members);
        self.word(H_CLAIMED)?
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                (c < members).then_some(c + 1)
            })
            .map(|c| c as usize)
            .map_err(|_| {
                Error::InvalidArgument(format!(
                    "all {members} members of the multicast object have bound memory already"
                ))
            })
    }

    /// The view of member `slot`, importing its memory on first use.
    fn view(&self, state: &mut LocalState, slot: usize) -> Result<MemberView> {
        if state.views.len() < self.members as usize {
            state.views.resize(self.members as usize, None);
        }
        if let Some(Some(v)) = state.views.get(slot) {
            return Ok(v.clone());
        }
        let base = HEADER_BYTES + slot * SLOT_BYTES;
        if self.word(base + S_STATE)?.load(Ordering::Acquire) != SLOT_BOUND {
            return Err(Error::InvalidArgument(format!(
                "member {slot} of {} has not bound memory to the multicast object yet",
                self.members
            )));
        }
        let read = |at: usize| -> Result<usize> {
            usize::try_from(self.word(base + at)?.load(Ordering::Relaxed))
                .map_err(|_| Error::Ipc("multicast table entry does not fit usize".into()))
        };
        let offset = read(S_OFFSET)?;
        let len = read(S_LEN)?;
        let hlen = read(S_HANDLE_LEN)?;
        if hlen > MAX_HANDLE_BYTES {
            return Err(Error::Ipc(format!(
                "multicast member {slot} has a corrupt entry"
            )));
        }
        let mut bytes = Vec::with_capacity(MAX_HANDLE_BYTES);
        for w in 0..MAX_HANDLE_BYTES / 8 {
            let word = self
                .word(base + SLOT_HANDLE_AT + 8 * w)?
                .load(Ordering::Relaxed);
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.truncate(hlen);
        let handle = IpcHandle::from_bytes(&bytes)?;
        let memory = HostImport(self.cache.import(&handle)?);
        if offset.checked_add(len).is_none_or(|e| e > self.len) || len > memory.len() {
            return Err(Error::Ipc(format!(
                "multicast member {slot} has a corrupt entry"
            )));
        }
        let v = MemberView {
            memory,
            offset,
            len,
        };
        if let Some(entry) = state.views.get_mut(slot) {
            *entry = Some(v.clone());
        }
        Ok(v)
    }

    fn all_views(&self, state: &mut LocalState) -> Result<Vec<MemberView>> {
        (0..self.members as usize)
            .map(|s| self.view(state, s))
            .collect()
    }

    /// Reduces multicast bytes `[offset, offset + count elements)` over every member into
    /// `out` (exactly `count` elements long).
    ///
    /// Values are widened to f32, combined in member order, and rounded once at the end.
    /// Supports f32, f16 and bf16 with every [`ReduceOp`]; the caller orders this after the
    /// members' writes (flags), as a device kernel would.
    pub fn reduce(
        &self,
        offset: usize,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        out: &mut [u8],
    ) -> Result<()> {
        let codec = Codec::for_type(dtype)?;
        let bytes = dtype.bytes(count)?;
        if out.len() != bytes {
            return Err(Error::InvalidArgument(format!(
                "reduce of {count} {dtype} elements needs an output of {bytes} bytes, got {}",
                out.len()
            )));
        }
        let mut state = self.lock();
        let views = self.all_views(&mut state)?;
        // Copy every input first: `out` may itself be one member's memory.
        let mut inputs = Vec::with_capacity(views.len());
        for (slot, v) in views.iter().enumerate() {
            let src = v.address(offset, bytes, slot)?;
            let mut data = vec![0u8; bytes];
            // SAFETY: `src..src+bytes` is inside member `slot`'s live mapping (checked by
            // `address`), and `data` is a fresh buffer of that length.
            unsafe { std::ptr::copy_nonoverlapping(src, data.as_mut_ptr(), bytes) };
            inputs.push(data);
        }
        drop(state);
        let size = dtype.size();
        let n = inputs.len() as f32;
        for (i, dst) in out.chunks_exact_mut(size).enumerate() {
            let at = i * size;
            let mut acc = None;
            for input in &inputs {
                let x = codec.decode(&input[at..at + size]);
                acc = Some(match acc {
                    None => x,
                    Some(a) => combine(op, a, x),
                });
            }
            let mut v = acc.unwrap_or(0.0);
            if op == ReduceOp::Avg {
                v /= n;
            }
            codec.encode(v, dst);
        }
        Ok(())
    }

    /// Writes `src` at multicast byte `offset` of every member.
    pub fn broadcast(&self, offset: usize, src: &[u8]) -> Result<()> {
        let mut state = self.lock();
        let views = self.all_views(&mut state)?;
        let targets = views
            .iter()
            .enumerate()
            .map(|(slot, v)| v.address(offset, src.len(), slot))
            .collect::<Result<Vec<_>>>()?;
        for dst in targets {
            // SAFETY: each target range is inside a live member mapping (checked); `copy`
            // tolerates `src` being part of one of them.
            unsafe { std::ptr::copy(src.as_ptr(), dst, src.len()) };
        }
        Ok(())
    }
}

fn combine(op: ReduceOp, a: f32, b: f32) -> f32 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => a + b,
        ReduceOp::Prod => a * b,
        ReduceOp::Min => a.min(b),
        ReduceOp::Max => a.max(b),
    }
}

#[derive(Debug, Clone, Copy)]
enum Codec {
    F32,
    F16,
    Bf16,
}

impl Codec {
    fn for_type(dtype: DataType) -> Result<Codec> {
        match dtype {
            DataType::F32 => Ok(Codec::F32),
            DataType::F16 => Ok(Codec::F16),
            DataType::Bf16 => Ok(Codec::Bf16),
            other => Err(Error::Unsupported(format!(
                "the host multicast emulation reduces f32, f16 and bf16, not {other}"
            ))),
        }
    }

    fn decode(self, b: &[u8]) -> f32 {
        match self {
            Codec::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            Codec::F16 => f16_to_f32(u16::from_le_bytes([b[0], b[1]])),
            Codec::Bf16 => f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16),
        }
    }

    fn encode(self, v: f32, out: &mut [u8]) {
        match self {
            Codec::F32 => out.copy_from_slice(&v.to_le_bytes()),
            Codec::F16 => out.copy_from_slice(&f32_to_f16(v).to_le_bytes()),
            Codec::Bf16 => out.copy_from_slice(&f32_to_bf16(v).to_le_bytes()),
        }
    }
}

/// IEEE binary16 bits to f32 (exact).
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let negative = h & 0x8000 != 0;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let sign = u32::from(negative) << 31;
    match exp {
        0 => {
            // Subnormal: man * 2^-24, exact in f32.
            let v = man as f32 * (1.0 / 16_777_216.0);
            if negative {
                -v
            } else {
                v
            }
        }
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (man << 13)),
        _ => f32::from_bits(sign | ((exp + 112) << 23) | (man << 13)),
    }
}

/// Rounds to nearest-even at bit `shift` of `m`.
fn round_shift(m: u32, shift: u32) -> u32 {
    let r = m >> shift;
    let rem = m & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    if rem > half || (rem == half && r & 1 == 1) {
        r + 1
    } else {
        r
    }
}

/// f32 to IEEE binary16 bits, rounding to nearest even; overflow becomes infinity and NaN
/// stays NaN.
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        let nan = if man != 0 {
            0x200 | (man >> 13) as u16
        } else {
            0
        };
        return sign | 0x7c00 | nan;
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        // Subnormal result: value = m24 * 2^(e - 14 - 10) = (m24 >> (14 - e)) * 2^-24.
        let m = man | 0x80_0000;
        return sign | round_shift(m, (14 - e) as u32) as u16;
    }
    // A carry out of the mantissa correctly bumps the exponent (up to infinity).
    let r = round_shift(((e as u32) << 23) | man, 13);
    sign | r as u16
}

/// f32 to bfloat16 bits, rounding to nearest even; NaN stays NaN.
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x40;
    }
    round_shift(b, 16) as u16
}

impl Multicast<HostBackend> for HostMulticast {
    fn len(&self) -> usize {
        self.len
    }

    fn add_device(&self, device: DeviceId) -> Result<()> {
        let mut state = self.lock();
        if state.own.is_some() {
            return Err(Error::InvalidArgument(format!(
                "cannot add {device} to the multicast object after this member bound memory"
            )));
        }
        if !state.devices.contains(&device) {
            state.devices.push(device);
        }
        Ok(())
    }

    fn bind(&self, memory: &HostMemory, offset: usize) -> Result<()> {
        let fits = offset
            .checked_add(memory.len())
            .is_some_and(|end| end <= self.len);
        if !fits {
            return Err(Error::InvalidArgument(format!(
                "binding {} bytes at offset {offset} overflows the {}-byte multicast object",
                memory.len(),
                self.len
            )));
        }
        let mut state = self.lock();
        if state.own.is_some() {
            return Err(Error::InvalidArgument(
                "this member already bound memory to the multicast object".into(),
            ));
        }
        let handle = memory.export()?;
        let bytes = handle.to_bytes();
        if bytes.len() > MAX_HANDLE_BYTES {
            return Err(Error::Unsupported(format!(
                "a {}-byte memory handle does not fit a multicast table slot",
                bytes.len()
            )));
        }
        // Our own view keeps the bound pages alive for as long as the object lives, even if
        // the caller frees `memory` first (as a driver's bind holds its reference).
        let view = MemberView {
            memory: HostImport(self.cache.import(&handle)?),
            offset,
            len: memory.len(),
        };
        let slot = self.claim_slot()?;
        let base = HEADER_BYTES + slot * SLOT_BYTES;
        self.word(base + S_OFFSET)?
            .store(offset as u64, Ordering::Relaxed);
        self.word(base + S_LEN)?
            .store(memory.len() as u64, Ordering::Relaxed);
        self.word(base + S_HANDLE_LEN)?
            .store(bytes.len() as u64, Ordering::Relaxed);
        for (w, chunk) in bytes.chunks(8).enumerate() {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.word(base + SLOT_HANDLE_AT + 8 * w)?
                .store(u64::from_le_bytes(word), Ordering::Relaxed);
        }
        self.word(base + S_STATE)?
            .store(SLOT_BOUND, Ordering::Release);
        if state.views.len() < self.members as usize {
            state.views.resize(self.members as usize, None);
        }
        if let Some(entry) = state.views.get_mut(slot) {
            *entry = Some(view.clone());
        }
        state.own = Some((slot, view));
        tracing::debug!(slot, members = self.members, "host multicast member bound");
        Ok(())
    }

    fn map(&self) -> Result<DevicePtr> {
        self.lock()
            .own
            .as_ref()
            .map(|(_, v)| v.memory.ptr())
            .ok_or_else(|| {
                Error::InvalidArgument(
                    "bind memory to the multicast object before mapping it".into(),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trips_every_code_and_rounds_to_nearest_even() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            let back = f32_to_f16(f);
            if f.is_nan() {
                assert!(f16_to_f32(back).is_nan(), "{h:#06x}");
            } else {
                assert_eq!(back, h, "{h:#06x} -> {f}");
            }
        }
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(-2.0), 0xc000);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(2f32.powi(-24)), 0x0001);
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0x0000);
        assert_eq!(f32_to_f16(3.0 * 2f32.powi(-26)), 0x0001);
        assert_eq!(f32_to_f16(2f32.powi(-14)), 0x0400);
        // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even wins.
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert!(f32::from_bits(u32::from(f32_to_bf16(f32::NAN)) << 16).is_nan());
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
    }
}
