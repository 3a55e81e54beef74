//! PortChannel: the GPU asks its proxy to move data (copy engine, RDMA, TCP) and to signal.
//!
//! [`PortChannel::connect`] wires one channel to a peer through a [`ProxyBuilder`]: it
//! builds the host-to-device semaphore over the connection, exchanges the channel's buffer
//! registration with the peer and registers both with the proxy; the result is the
//! `OxcclPortChannel` device handle (`port_channel_device.hpp`). Start the proxy after
//! connecting every channel.
//!
//! The `host_*` functions are the device operations in Rust over the same handle, for
//! producers that are host threads on the host backend (the FIFO protocol is identical).

use std::sync::Arc;

use oxccl_backend::AnyDevice;
use oxccl_hal::{Error, Result};
use oxccl_kernels::abi::{self, OxcclPortChannel, OxcclProxyTrigger};

use crate::bootstrap::Bootstrap;
use crate::connection::{Connection, Transport};
use crate::fifo::{host_push, host_sync, Trigger, TriggerKind};
use crate::proxy::ProxyBuilder;
use crate::registered_memory::RegisteredMemory;
use crate::semaphore::{host_wait, swap_registrations, HostDeviceSemaphore};

/// Constructors of PortChannel device handles.
#[derive(Debug, Clone, Copy)]
pub struct PortChannel;

impl PortChannel {
    /// Connects a channel from `local` (this rank's buffer, registered for the
    /// connection's transport) to the peer's buffer of the same call, over `connection`.
    /// Collective between the two ranks (same `tag`; it uses `tag` and `tag + 1`).
    pub fn connect(
        bootstrap: &Bootstrap,
        device: &AnyDevice,
        proxy: &mut ProxyBuilder,
        connection: Arc<Connection>,
        local: &RegisteredMemory,
        tag: u32,
    ) -> Result<OxcclPortChannel> {
        let peer = connection.peer();
        let transport = connection.transport();
        if !local.transports().contains(transport) {
            return Err(Error::InvalidArgument(format!(
                "the channel's buffer is not registered for {transport} (it has {:?})",
                local.transports()
            )));
        }
        let semaphore = HostDeviceSemaphore::connect(bootstrap, device, &connection, tag)?;
        let remote = swap_registrations(bootstrap, device, peer, tag.wrapping_add(1), local)?;
        if transport == Transport::Ipc && !remote.is_imported() {
            return Err(Error::InvalidArgument(format!(
                "rank {peer}'s buffer is not mapped here; an IPC PortChannel needs it"
            )));
        }
        let sem = proxy.add_semaphore(connection, Arc::new(semaphore))?;
        let dst = proxy.add_remote_memory(remote)?;
        let src = proxy.add_local_memory(local.clone())?;
        proxy.port_channel(sem, dst, src)
    }
}

fn trigger(
    h: &OxcclPortChannel,
    kind: TriggerKind,
    dst: u64,
    src: u64,
    size: u64,
) -> Result<OxcclProxyTrigger> {
    let narrow = |v: u64, what: &str| {
        u32::try_from(v).map_err(|_| {
            Error::InvalidArgument(format!("PortChannel {what} {v} does not fit 32 bits"))
        })
    };
    Trigger {
        kind,
        semaphore_id: h.semaphore_id,
        dst_memory_id: h.dst_memory_id,
        src_memory_id: h.src_memory_id,
        dst_offset: narrow(dst, "destination offset")?,
        src_offset: narrow(src, "source offset")?,
        size: narrow(size, "size")?,
    }
    .encode()
}

/// `put_kinds` of port_channel_device.hpp: DATA triggers of at most `chunk` bytes, `last`
/// OR-ed into the final one. Returns the last slot (None: nothing pushed).
///
/// # Safety
/// `h` must be the handle of a live channel of the host backend (its FIFO addresses are
/// host addresses).
unsafe fn put_kinds(
    h: &OxcclPortChannel,
    dst_offset: u64,
    src_offset: u64,
    bytes: u64,
    chunk: u64,
    last: u32,
) -> Result<Option<u64>> {
    if bytes == 0 && last == 0 {
        return Ok(None);
    }
    let max = u64::from(abi::OXCCL_TRIGGER_MAX_SIZE);
    let chunk = if chunk == 0 || chunk > max {
        max
    } else {
        chunk
    };
    let mut slot = None;
    let mut done = 0u64;
    loop {
        let n = (bytes - done).min(chunk);
        let is_last = done + n >= bytes;
        let kind =
            if n != 0 { abi::OXCCL_TRIGGER_DATA } else { 0 } | if is_last { last } else { 0 };
        if kind != 0 {
            let t = trigger(
                h,
                TriggerKind(kind),
                dst_offset + done,
                src_offset + done,
                n,
            )?;
            // SAFETY: the caller's obligations.
            slot = Some(unsafe { host_push(&h.fifo, t, h.semaphore.max_spins) }?);
        }
        done += n;
        if done >= bytes {
            return Ok(slot);
        }
    }
}

/// `PortChannelDevice::put` on the host: copy `bytes` (split into `chunk`-byte triggers;
/// 0 = the largest) from source offset `src_offset` to destination offset `dst_offset`.
///
/// # Safety
/// `h` must be the handle of a live channel of the host backend.
pub unsafe fn host_put(
    h: &OxcclPortChannel,
    dst_offset: u64,
    src_offset: u64,
    bytes: u64,
    chunk: u64,
) -> Result<()> {
    // SAFETY: the caller's obligations.
    unsafe { put_kinds(h, dst_offset, src_offset, bytes, chunk, 0) }.map(|_| ())
}

/// `PortChannelDevice::signal` on the host.
///
/// # Safety
/// As [`host_put`].
pub unsafe fn host_signal(h: &OxcclPortChannel) -> Result<()> {
    // SAFETY: the caller's obligations.
    unsafe { put_kinds(h, 0, 0, 0, 0, abi::OXCCL_TRIGGER_FLAG) }.map(|_| ())
}

/// `PortChannelDevice::put_with_signal` on the host.
///
/// # Safety
/// As [`host_put`].
pub unsafe fn host_put_with_signal(
    h: &OxcclPortChannel,
    dst_offset: u64,
    src_offset: u64,
    bytes: u64,
    chunk: u64,
) -> Result<()> {
    // SAFETY: the caller's obligations.
    unsafe {
        put_kinds(
            h,
            dst_offset,
            src_offset,
            bytes,
            chunk,
            abi::OXCCL_TRIGGER_FLAG,
        )
    }
    .map(|_| ())
}

/// `PortChannelDevice::put_with_signal_and_flush` on the host.
///
/// # Safety
/// As [`host_put`].
pub unsafe fn host_put_with_signal_and_flush(
    h: &OxcclPortChannel,
    dst_offset: u64,
    src_offset: u64,
    bytes: u64,
    chunk: u64,
) -> Result<()> {
    let kinds = abi::OXCCL_TRIGGER_FLAG | abi::OXCCL_TRIGGER_SYNC;
    // SAFETY: the caller's obligations.
    let slot = unsafe { put_kinds(h, dst_offset, src_offset, bytes, chunk, kinds) }?;
    match slot {
        // SAFETY: the caller's obligations.
        Some(slot) => unsafe { host_sync(&h.fifo, slot, h.semaphore.max_spins) },
        None => Ok(()),
    }
}

/// `PortChannelDevice::flush` on the host: waits until the proxy performed (and the
/// connection completed) everything pushed before.
///
/// # Safety
/// As [`host_put`].
pub unsafe fn host_flush(h: &OxcclPortChannel) -> Result<()> {
    // SAFETY: the caller's obligations.
    let slot = unsafe { put_kinds(h, 0, 0, 0, 0, abi::OXCCL_TRIGGER_SYNC) }?;
    match slot {
        // SAFETY: the caller's obligations.
        Some(slot) => unsafe { host_sync(&h.fifo, slot, h.semaphore.max_spins) },
        None => Ok(()),
    }
}

/// `PortChannelDevice::wait` on the host: waits for the peer's next signal.
///
/// # Safety
/// As [`host_put`]; one waiter per channel at a time.
pub unsafe fn host_wait_signal(h: &OxcclPortChannel) -> Result<()> {
    let s = &h.semaphore;
    // SAFETY: the caller's obligations.
    unsafe { host_wait(s.inbound, s.expected_inbound, s.max_spins) }
}
