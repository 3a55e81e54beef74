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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::host_kernels::PORT_OP;
    use crate::semaphore::testing::*;
    use oxccl_hal::Device;
    use oxccl_kernels::abi::{OxcclPortChannelArgs, OXCCL_WAIT_OK};

    const SIZES: [usize; 4] = [1, 999, 4097, 300_001];
    const REGION: usize = 310_000;

    /// Both directions at once over IPC and TCP, 4-slot FIFOs and small chunks (many
    /// triggers, the FIFO wraps): host-thread producers and the host kernels push
    /// put+signal, the peers wait for the signal and check every byte.
    #[test]
    fn put_with_signal_end_to_end_through_the_proxy() {
        for transport in [Transport::Ipc, Transport::Tcp] {
            with_ranks(2, |b, d| {
                let me = b.rank();
                let peer = 1 - me;
                let (buf, reg) = buffer(&b, &d, 2 * REGION * SIZES.len());
                let conn = Arc::new(Connection::connect(&b, &d, peer, transport, 40).unwrap());
                let mut builder = ProxyBuilder::new(&d, Some(4)).unwrap();
                let h = PortChannel::connect(&b, &d, &mut builder, conn, &reg, 50).unwrap();
                let proxy = builder.start().unwrap();
                let stream = d.create_stream().unwrap();
                for (i, &n) in SIZES.iter().enumerate() {
                    let mine = random_nonzero((u64::from(me) << 32) | i as u64 | 0x77 << 40, n);
                    let theirs = random_nonzero((u64::from(peer) << 32) | i as u64 | 0x77 << 40, n);
                    let src = i * REGION + 1;
                    let dst = (SIZES.len() + i) * REGION + 3 + 2 * me as usize;
                    let dst_theirs = (SIZES.len() + i) * REGION + 3 + 2 * peer as usize;
                    write(&buf, src, &mine);
                    let chunk = 1000 + 13 * i as u64;
                    if i % 2 == 0 {
                        // SAFETY: live host-backend channel; ranges inside the buffers.
                        unsafe {
                            host_put_with_signal(&h, dst as u64, src as u64, n as u64, chunk)
                        }
                        .unwrap();
                        // SAFETY: as above.
                        unsafe { host_flush(&h) }.unwrap();
                    } else {
                        let a = OxcclPortChannelArgs {
                            channel: h,
                            op: abi::OXCCL_PORT_OP_PUT_WITH_SIGNAL_AND_FLUSH,
                            dst_offset: dst as u64,
                            src_offset: src as u64,
                            bytes: n as u64,
                            chunk,
                            iterations: 1,
                            ..Default::default()
                        };
                        launch(&d, &stream, PORT_OP, 1, &a).unwrap();
                    }
                    let mut status = 0u32;
                    let w = OxcclPortChannelArgs {
                        channel: h,
                        op: abi::OXCCL_PORT_OP_WAIT,
                        iterations: 1,
                        status: &mut status,
                        ..Default::default()
                    };
                    launch(&d, &stream, PORT_OP, 1, &w).unwrap();
                    assert_eq!(status, OXCCL_WAIT_OK);
                    assert_eq!(
                        read(&buf, dst_theirs, n),
                        theirs,
                        "{transport}: {n} bytes from rank {peer}"
                    );
                    assert_eq!(
                        read(&buf, dst_theirs + n, 1),
                        [0],
                        "{transport}: byte after"
                    );
                }
                // Ping-pong through both proxies.
                let mut ns = 0u64;
                let a = OxcclPortChannelArgs {
                    channel: h,
                    op: abi::OXCCL_PORT_OP_PINGPONG,
                    iterations: 50,
                    initiator: u32::from(me == 0),
                    elapsed_ns: &mut ns,
                    ..Default::default()
                };
                launch(&d, &stream, PORT_OP, 1, &a).unwrap();
                assert!(ns > 0);
                b.barrier().unwrap();
                assert!(proxy.error().is_none());
                drop(proxy); // stops the thread
            });
        }
    }

    /// The peer's process is gone: the proxy's operations fail and are reported, the
    /// producer is not stalled (triggers are still retired), and nothing hangs.
    #[test]
    fn dead_peer_poisons_the_proxy_instead_of_hanging() {
        with_ranks(2, |b, d| {
            let me = b.rank();
            let (_buf, reg) = buffer(&b, &d, 4096);
            let conn = Arc::new(Connection::connect(&b, &d, 1 - me, Transport::Tcp, 41).unwrap());
            let mut builder = ProxyBuilder::new(&d, Some(4)).unwrap();
            let h = PortChannel::connect(&b, &d, &mut builder, conn, &reg, 51).unwrap();
            b.barrier().unwrap();
            if me == 1 {
                return; // drops its connection, registrations and bootstrap
            }
            let proxy = builder.start().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(300));
            let start = std::time::Instant::now();
            let mut failed = false;
            for _ in 0..20 {
                // SAFETY: live host-backend channel; range inside the buffers.
                let r = unsafe { host_put_with_signal(&h, 0, 0, 1000, 0) }.and_then(|()| {
                    // SAFETY: as above.
                    unsafe { host_flush(&h) }
                });
                failed |= r.is_err();
                if proxy.error().is_some() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let e = proxy.error();
            assert!(
                e.is_some() || failed,
                "a write to a dead peer went unnoticed"
            );
            assert!(start.elapsed() < std::time::Duration::from_secs(60));
        });
    }
}
