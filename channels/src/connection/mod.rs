//! Connections: how one rank writes into a peer's registered memory.
//!
//! A [`Connection`] joins this rank to one peer over one [`Transport`] and offers three
//! operations, the ones a proxy thread turns channel triggers into:
//! - [`Connection::write`]: copy bytes from a local [`RegisteredMemory`] into a peer's
//!   [`RemoteMemory`];
//! - [`Connection::update_and_sync`]: store an 8-byte value into the peer's memory after
//!   every earlier write of this connection has landed (the signal primitive);
//! - [`Connection::flush`]: wait until everything issued so far is complete.
//!
//! The transports:
//! - [`Transport::Ipc`] (same node): the peer's allocation is mapped into this process and
//!   a stream owned by the connection copies into it (the copy engine on GPUs);
//! - [`Transport::Ib`]: InfiniBand RC queue pairs (RDMA write) behind the `ib` feature;
//!   builds without it get a stub whose every call says so;
//! - [`Transport::Tcp`]: for hosts without IB, a socket pair per connection and a receiver
//!   thread on each side that applies incoming writes in order.
//!
//! `Connection` is an enum, not a trait object: the proxy's hot path is a `match`.
//! Setup ([`Connection::connect`]) is collective between the two ranks and uses the
//! bootstrap; operations are one-sided.

pub mod ib;
pub mod ipc;
pub mod tcp;

use std::fmt;
use std::time::Duration;

use oxccl_backend::AnyDevice;
use oxccl_hal::{Error, Result};

use crate::bootstrap::Bootstrap;
use crate::registered_memory::{HostIdentity, Reader, RegisteredMemory, RemoteMemory};

pub use ib::IbConnection;
pub use ipc::IpcConnection;
pub use tcp::TcpConnection;

/// A way of moving bytes between two ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Same-node peer memory mapped through IPC; copies on a stream.
    Ipc,
    /// A TCP socket pair; the receiver applies writes.
    Tcp,
    /// InfiniBand RC queue pairs (RDMA write).
    Ib,
}

impl Transport {
    /// Every transport.
    pub const ALL: [Transport; 3] = [Transport::Ipc, Transport::Tcp, Transport::Ib];

    const fn bit(self) -> u8 {
        match self {
            Transport::Ipc => 1,
            Transport::Tcp => 2,
            Transport::Ib => 4,
        }
    }

    fn from_code(code: u8) -> Option<Transport> {
        Transport::ALL.into_iter().find(|t| t.bit() == code)
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Ipc => "IPC",
            Transport::Tcp => "TCP",
            Transport::Ib => "InfiniBand",
        })
    }
}

/// A set of transports (what a memory range is registered for).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TransportSet(u8);

impl TransportSet {
    /// No transport.
    pub const EMPTY: TransportSet = TransportSet(0);

    /// The set of the given transports.
    pub fn of(transports: &[Transport]) -> TransportSet {
        TransportSet(transports.iter().fold(0, |acc, t| acc | t.bit()))
    }

    /// Whether `t` is in the set.
    pub fn contains(self, t: Transport) -> bool {
        self.0 & t.bit() != 0
    }

    /// The set with `t` added.
    pub fn with(self, t: Transport) -> TransportSet {
        TransportSet(self.0 | t.bit())
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The set as bits (for serialization).
    pub fn bits(self) -> u8 {
        self.0
    }

    /// Inverse of [`TransportSet::bits`]; unknown bits are an error.
    pub fn from_bits(bits: u8) -> Result<TransportSet> {
        let all = TransportSet::of(&Transport::ALL).0;
        if bits & !all != 0 {
            return Err(Error::InvalidArgument(format!(
                "unknown transport bits {bits:#x}"
            )));
        }
        Ok(TransportSet(bits))
    }
}

impl fmt::Debug for TransportSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(Transport::ALL.into_iter().filter(|t| self.contains(*t)))
            .finish()
    }
}

/// The transport two ranks should use: IPC on one node, else InfiniBand where both ends
/// have it, else TCP.
pub fn choose_transport(
    local: &HostIdentity,
    peer: &HostIdentity,
    ib_on_both_ends: bool,
) -> Transport {
    if local.same_node(peer) {
        Transport::Ipc
    } else if ib_on_both_ends {
        Transport::Ib
    } else {
        Transport::Tcp
    }
}

/// A connection to one peer over one transport.
#[derive(Debug)]
pub enum Connection {
    /// Same-node copies through IPC mappings.
    Ipc(IpcConnection),
    /// TCP sockets with a receiver thread on each side.
    Tcp(TcpConnection),
    /// InfiniBand RC queue pair.
    Ib(IbConnection),
}

const HANDSHAKE_MAGIC: &[u8; 4] = b"OXCN";
const HANDSHAKE_VERSION: u8 = 1;

impl Connection {
    /// Connects this rank to `peer` over `transport`. Collective between the two ranks: the
    /// peer must call it with this rank, the same transport and the same `tag` (a bootstrap
    /// user tag; connections set up concurrently between one pair need distinct tags).
    ///
    /// Fails with [`Error::InvalidArgument`] when the two ranks asked for different
    /// transports, for IPC between two nodes, or for a connection to oneself; with
    /// [`Error::Unsupported`] for InfiniBand where it is not built or there is no device.
    pub fn connect(
        bootstrap: &Bootstrap,
        device: &AnyDevice,
        peer: u32,
        transport: Transport,
        tag: u32,
    ) -> Result<Connection> {
        let rank = bootstrap.rank();
        let _span = tracing::info_span!("connect", rank, peer, %transport).entered();
        if peer == rank || peer >= bootstrap.world_size() {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} cannot connect to rank {peer} (world size {})",
                bootstrap.world_size()
            ))
            .at_rank(rank));
        }
        let at_rank = |e: Error| e.at_rank(rank);
        let local = HostIdentity::local().map_err(at_rank)?;
        // Agree on the transport before building anything, so a mismatch is one clear error
        // on both sides instead of two different hangs.
        let mut hello = Vec::new();
        hello.extend_from_slice(HANDSHAKE_MAGIC);
        hello.push(HANDSHAKE_VERSION);
        hello.push(transport.bit());
        local.encode(&mut hello);
        bootstrap.send(peer, tag, &hello)?;
        let reply = bootstrap.recv(peer, tag)?;
        let mut r = Reader::new(&reply, "connection handshake");
        if r.take(HANDSHAKE_MAGIC.len())? != HANDSHAKE_MAGIC || r.u8()? != HANDSHAKE_VERSION {
            return Err(at_rank(Error::InvalidArgument(format!(
                "rank {peer} sent something else than a connection handshake on tag {tag}"
            ))));
        }
        let theirs = Transport::from_code(r.u8()?);
        let peer_host = HostIdentity::decode(&mut r)?;
        if theirs != Some(transport) {
            return Err(at_rank(Error::InvalidArgument(format!(
                "rank {peer} connects with {} where this rank asked for {transport} (tag {tag})",
                theirs.map_or_else(|| "an unknown transport".into(), |t| t.to_string())
            ))));
        }
        let conn = match transport {
            Transport::Ipc => {
                if !local.same_node(&peer_host) {
                    return Err(at_rank(Error::InvalidArgument(format!(
                        "IPC to rank {peer} on {peer_host}: it is not on this node ({local})"
                    ))));
                }
                IpcConnection::new(device, rank, peer).map(Connection::Ipc)
            }
            Transport::Tcp => TcpConnection::connect(bootstrap, device, peer, tag, &peer_host)
                .map(Connection::Tcp),
            Transport::Ib => IbConnection::connect(bootstrap, peer, tag).map(Connection::Ib),
        };
        conn.map_err(at_rank)
    }

    /// Connects to `peer` over the transport [`choose_transport`] picks: both ranks tell
    /// each other their node and whether they have InfiniBand, so both pick the same.
    pub fn connect_auto(
        bootstrap: &Bootstrap,
        device: &AnyDevice,
        peer: u32,
        tag: u32,
    ) -> Result<Connection> {
        let local = HostIdentity::local()?;
        let mut mine = Vec::new();
        local.encode(&mut mine);
        let ib_here = ib::available();
        mine.push(u8::from(ib_here));
        bootstrap.send(peer, tag, &mine)?;
        let theirs = bootstrap.recv(peer, tag)?;
        let mut r = Reader::new(&theirs, "transport choice");
        let peer_host = HostIdentity::decode(&mut r)?;
        let ib_there = r.u8()? != 0;
        r.finish()?;
        let transport = choose_transport(local, &peer_host, ib_here && ib_there);
        tracing::debug!(peer, %transport, "transport chosen");
        Connection::connect(bootstrap, device, peer, transport, tag)
    }

    /// The transport of this connection.
    pub fn transport(&self) -> Transport {
        match self {
            Connection::Ipc(_) => Transport::Ipc,
            Connection::Tcp(_) => Transport::Tcp,
            Connection::Ib(_) => Transport::Ib,
        }
    }

    /// The peer's rank.
    pub fn peer(&self) -> u32 {
        match self {
            Connection::Ipc(c) => c.peer(),
            Connection::Tcp(c) => c.peer(),
            Connection::Ib(c) => c.peer(),
        }
    }

    /// Copies `bytes` from byte `src_offset` of `src` to byte `dst_offset` of the peer's
    /// `dst`. Asynchronous: complete after a later [`Connection::flush`] (an IPC copy may
    /// still be running when this returns; both ranges must not be reused before).
    ///
    /// Fails with [`Error::InvalidArgument`] when a range runs past its end, `dst` is not
    /// the peer's or not reachable over this transport.
    pub fn write(
        &self,
        dst: &RemoteMemory,
        dst_offset: usize,
        src: &RegisteredMemory,
        src_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        match self {
            Connection::Ipc(c) => c.write(dst, dst_offset, src, src_offset, bytes),
            Connection::Tcp(c) => c.write(dst, dst_offset, src, src_offset, bytes),
            Connection::Ib(c) => c.write(dst, dst_offset, src, src_offset, bytes),
        }
    }

    /// [`Connection::write`] then [`Connection::update_and_sync`] of `flag` (the peer's
    /// registration, offset, value) as one operation, so a transport may send both at once
    /// (TCP: a small write and its update leave in one send). A PortChannel's
    /// put-with-signal.
    pub fn write_and_update(
        &self,
        dst: &RemoteMemory,
        dst_offset: usize,
        src: &RegisteredMemory,
        src_offset: usize,
        bytes: usize,
        flag: (&RemoteMemory, usize, u64),
    ) -> Result<()> {
        if let Connection::Tcp(c) = self {
            return c.write_and_update(dst, dst_offset, src, src_offset, bytes, flag);
        }
        self.write(dst, dst_offset, src, src_offset, bytes)?;
        self.update_and_sync(flag.0, flag.1, flag.2)
    }

    /// Stores `value` into the 8 bytes at `dst_offset` of the peer's `dst`, after every
    /// earlier write of this connection has landed there.
    ///
    /// Fails with [`Error::InvalidArgument`] when the offset is not 8-byte aligned or the
    /// 8 bytes run past the end.
    pub fn update_and_sync(&self, dst: &RemoteMemory, dst_offset: usize, value: u64) -> Result<()> {
        match self {
            Connection::Ipc(c) => c.update_and_sync(dst, dst_offset, value),
            Connection::Tcp(c) => c.update_and_sync(dst, dst_offset, value),
            Connection::Ib(c) => c.update_and_sync(dst, dst_offset, value),
        }
    }

    /// Waits until every operation issued on this connection so far is complete (written
    /// into the peer's memory), or reports [`Error::Timeout`] after `timeout`.
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        match self {
            Connection::Ipc(c) => c.flush(timeout),
            Connection::Tcp(c) => c.flush(timeout),
            Connection::Ib(c) => c.flush(timeout),
        }
    }
}

/// Checks a write's arguments, common to every transport.
pub(crate) fn check_write(
    transport: Transport,
    peer: u32,
    dst: &RemoteMemory,
    dst_offset: usize,
    src: &RegisteredMemory,
    src_offset: usize,
    bytes: usize,
) -> Result<()> {
    check_destination(transport, peer, dst)?;
    let fits = |offset: usize, len: usize| offset.checked_add(bytes).is_some_and(|e| e <= len);
    if !fits(dst_offset, dst.len()) {
        return Err(Error::InvalidArgument(format!(
            "write of {bytes} bytes at offset {dst_offset} runs past the end of rank {peer}'s \
             {}-byte registration",
            dst.len()
        )));
    }
    if !fits(src_offset, src.len()) {
        return Err(Error::InvalidArgument(format!(
            "write of {bytes} bytes from offset {src_offset} runs past the end of the \
             {}-byte source registration",
            src.len()
        )));
    }
    Ok(())
}

/// Checks an update's arguments, common to every transport.
pub(crate) fn check_update(
    transport: Transport,
    peer: u32,
    dst: &RemoteMemory,
    dst_offset: usize,
) -> Result<()> {
    check_destination(transport, peer, dst)?;
    if dst_offset % 8 != 0 || !dst.is_aligned8(dst_offset) {
        return Err(Error::InvalidArgument(format!(
            "update at offset {dst_offset} of rank {peer}'s registration is not 8-byte aligned"
        )));
    }
    if dst_offset.checked_add(8).is_none_or(|e| e > dst.len()) {
        return Err(Error::InvalidArgument(format!(
            "update of 8 bytes at offset {dst_offset} runs past the end of rank {peer}'s \
             {}-byte registration",
            dst.len()
        )));
    }
    Ok(())
}

fn check_destination(transport: Transport, peer: u32, dst: &RemoteMemory) -> Result<()> {
    if dst.rank() != peer {
        return Err(Error::InvalidArgument(format!(
            "destination memory belongs to rank {}, but this {transport} connection goes to \
             rank {peer}",
            dst.rank()
        )));
    }
    if !dst.transports().contains(transport) {
        return Err(Error::InvalidArgument(format!(
            "rank {peer} did not register the destination for {transport} (it has {:?})",
            dst.transports()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_sets_round_trip_and_refuse_unknown_bits() {
        let s = TransportSet::of(&[Transport::Ipc, Transport::Ib]);
        assert!(s.contains(Transport::Ipc) && s.contains(Transport::Ib));
        assert!(!s.contains(Transport::Tcp));
        assert_eq!(TransportSet::from_bits(s.bits()).unwrap(), s);
        assert!(TransportSet::from_bits(0x80).is_err());
        assert_eq!(format!("{s:?}"), "{Ipc, Ib}");
        for t in Transport::ALL {
            assert_eq!(Transport::from_code(t.bit()), Some(t));
        }
    }

    #[test]
    fn choice_prefers_ipc_then_ib_then_tcp() {
        let here = HostIdentity::local().unwrap().clone();
        let there = HostIdentity {
            hostname: "elsewhere".into(),
            boot_id: "x".into(),
        };
        assert_eq!(choose_transport(&here, &here, true), Transport::Ipc);
        assert_eq!(choose_transport(&here, &there, true), Transport::Ib);
        assert_eq!(choose_transport(&here, &there, false), Transport::Tcp);
        let unknown = HostIdentity {
            hostname: String::new(),
            boot_id: String::new(),
        };
        assert_eq!(choose_transport(&unknown, &unknown, false), Transport::Tcp);
    }
}
