//! TCP connection: for peers on other nodes without InfiniBand.
//!
//! Each connection has two sockets, one per direction of data. On the socket this rank
//! writes to, the peer's receiver thread reads write/update/flush frames and applies them
//! in arrival order; the only thing coming back on it is the acknowledgement of a flush,
//! which this rank reads inside [`TcpConnection::flush`]. With one socket per direction a
//! receiver never waits for its own side to read, so two ranks streaming to each other
//! cannot deadlock on full socket buffers.
//!
//! Frames (little-endian), sender to receiver: a 25-byte header `op u8, a u64, b u64, c u64`:
//! - write: `a` = the receiver's registration id, `b` = offset in it, `c` = length, then the
//!   bytes;
//! - update: `a` = registration id, `b` = offset, `c` = the 8-byte value;
//! - flush: `a` = sequence number.
//!
//! Receiver to sender, per flush: `seq u64, status u8, len u32, message` (status 0: every
//! earlier frame was applied; otherwise the message says what failed).
//!
//! A receiver applies an update with an 8-byte release store (host memory) or a stream
//! write issued after the earlier ones (device memory), so a waiter that sees the value
//! sees every earlier write. A peer that goes away shows up as [`Error::PeerLost`] on the
//! next operation; stalled sockets are bounded by the bootstrap timeout.
//!
//! Host-backend memory is sent and received in place. GPU memory goes through pinned
//! bounce buffers (`tcp/staging.rs`), pipelined so that the socket streams while the device
//! copies: the sender copies the next chunks out of device memory while the socket sends
//! the current one, and the receiver copies a chunk into device memory while it reads the
//! next one. The receiver's copies are queued on one stream, so a device update queued on
//! it after them lands after them; before a host update or a flush acknowledgement the
//! receiver waits for every queued copy. [`BOUNCE_VAR`] sends host-backend memory through
//! the bounce buffers too, so a run without a GPU (CI) exercises that path.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use oxccl_backend::AnyDevice;
use oxccl_hal::{BackendKind, Error, Result, Stream};

use super::{check_update, check_write, Transport};
use crate::bootstrap::Bootstrap;
use crate::registered_memory::{
    lookup, HostIdentity, Reader, RegisteredMemory, Registration, RemoteMemory,
};
use crate::timeline::{self, Event};
use spin_read::SpinRead;
use staging::{Staging, CHUNK, SLOTS};

mod spin_read;
mod staging;

const OP_WRITE: u8 = 1;
const OP_UPDATE: u8 = 2;
const OP_FLUSH: u8 = 3;
const HEADER: usize = 25;
const ACK_HEADER: usize = 13;
const HELLO_MAGIC: &[u8; 4] = b"OXTC";
/// Writes up to this size travel in one `send` with their header.
const SMALL_WRITE: usize = 4096;
/// Bytes the receiver reads ahead: a small write's whole frame and the update after it, so
/// one read takes a small put (see `spin_read`).
const READ_AHEAD: usize = 2 * HEADER + SMALL_WRITE;
/// Longest error message an acknowledgement carries.
const MAX_ACK_MESSAGE: usize = 4096;

/// Environment variable: `1` makes TCP connections move the data of host-backend memory the
/// way they move GPU memory (bounce buffers and a stream) instead of in place, so a run
/// without a GPU exercises that path; `0` or unset: off. Read when a connection is made.
/// Updates of host memory stay atomic stores (made after the earlier writes completed).
pub const BOUNCE_VAR: &str = "OXCCL_TCP_BOUNCE";

/// Parses the value of [`BOUNCE_VAR`] (`None`: unset): `1` on, `0` or empty off, anything
/// else an error naming the variable.
pub fn bounce_all(value: Option<&str>) -> std::result::Result<bool, String> {
    match value.map(str::trim) {
        None | Some("") | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(format!(
            "{BOUNCE_VAR}='{other}': want 1 (host memory through the bounce buffers) or 0"
        )),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the state consistent between statements.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn os(call: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Os { call, source }
}

/// What the receiver thread tells the rest of the connection.
#[derive(Default)]
struct Shared {
    /// Why the peer is gone, once it is.
    lost: Mutex<Option<String>>,
}

struct Out {
    sock: TcpStream,
    seq: u64,
    acks: Vec<u8>,
    /// Bounce slots and stream for device memory (GPU backends, or [`BOUNCE_VAR`]).
    staging: Option<Staging>,
    /// Set when a failed send left the byte stream in an unknown state.
    broken: Option<Error>,
}

/// A TCP connection to one peer (see the module docs).
pub struct TcpConnection {
    rank: u32,
    peer: u32,
    /// The bootstrap's timeout: bounds a send that the peer does not take.
    timeout: Duration,
    out: Mutex<Out>,
    /// The socket the receiver reads (kept to shut it down on drop).
    incoming: TcpStream,
    shared: Arc<Shared>,
    /// Host-backend memory takes the device path too ([`BOUNCE_VAR`]).
    bounce_all: bool,
    receiver: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TcpConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpConnection")
            .field("rank", &self.rank)
            .field("peer", &self.peer)
            .finish()
    }
}

fn random_nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // Not a secret: it only keeps a stray connection (another job, a stale peer) out.
    (oxccl_hal::fd_share::process_nonce() ^ nanos.rotate_left(17))
        .wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// The address to listen on: loopback for a peer on this node, else the address the other
/// ranks already reach this host on through the bootstrap.
fn listen_ip(peer_on_this_node: bool, bootstrap: &Bootstrap) -> IpAddr {
    if peer_on_this_node {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        bootstrap.local_ip()
    }
}

fn connect_until(
    addr: SocketAddr,
    deadline: Instant,
    timeout: Duration,
    peer: u32,
) -> Result<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                what: format!("TCP connection to rank {peer} at {addr}"),
                waited: timeout,
            });
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(s) => return Ok(s),
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::TimedOut) => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(os("connect (TCP connection)")(e)),
        }
    }
}

fn accept_until(
    listener: &TcpListener,
    deadline: Instant,
    timeout: Duration,
    peer: u32,
    nonce: u64,
) -> Result<TcpStream> {
    listener
        .set_nonblocking(true)
        .map_err(os("set_nonblocking"))?;
    loop {
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: format!("rank {peer} to open its TCP connection"),
                waited: timeout,
            });
        }
        let mut s = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Err(e) => return Err(os("accept (TCP connection)")(e)),
        };
        s.set_nonblocking(false).map_err(os("set_nonblocking"))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(os("setsockopt"))?;
        let mut hello = [0u8; 16];
        if s.read_exact(&mut hello).is_err() {
            continue;
        }
        let mut r = Reader::new(&hello, "TCP hello");
        let ok = r.take(4).ok() == Some(&HELLO_MAGIC[..])
            && r.u64().ok() == Some(nonce)
            && r.u32().ok() == Some(peer);
        if ok {
            return Ok(s);
        }
        // A stranger or a stale peer: not ours.
    }
}

/// Socket options of both sockets. The buffer sizes are left to the kernel: setting
/// SO_SNDBUF or SO_RCVBUF turns off its autotuning (up to `tcp_wmem` / `tcp_rmem`, 4 MiB
/// and more) and is capped by `net.core.wmem_max` / `rmem_max` (208 KiB on a default
/// kernel); fixed 1, 4 and 16 MiB buffers measured no better than autotuning on loopback.
fn tune(s: &TcpStream, timeout: Duration) -> Result<()> {
    // Small frames (updates, flushes, acknowledgements) must not wait for more data.
    s.set_nodelay(true).map_err(os("setsockopt(TCP_NODELAY)"))?;
    s.set_write_timeout(Some(timeout))
        .map_err(os("setsockopt(SO_SNDTIMEO)"))?;
    s.set_read_timeout(None)
        .map_err(os("setsockopt(SO_RCVTIMEO)"))
}

impl TcpConnection {
    /// Sets up the socket pair with `peer` (collective between the two; called by
    /// [`super::Connection::connect`] after the handshake).
    ///
    /// Fails with [`Error::InvalidArgument`] on a bad value of [`BOUNCE_VAR`].
    pub fn connect(
        bootstrap: &Bootstrap,
        device: &AnyDevice,
        peer: u32,
        tag: u32,
        peer_host: &HostIdentity,
    ) -> Result<TcpConnection> {
        let bounce = bounce_all(std::env::var(BOUNCE_VAR).ok().as_deref())
            .map_err(Error::InvalidArgument)?;
        TcpConnection::connect_with(bootstrap, device, peer, tag, peer_host, bounce)
    }

    /// [`TcpConnection::connect`] with [`BOUNCE_VAR`]'s setting given.
    pub(crate) fn connect_with(
        bootstrap: &Bootstrap,
        device: &AnyDevice,
        peer: u32,
        tag: u32,
        peer_host: &HostIdentity,
        bounce_all: bool,
    ) -> Result<TcpConnection> {
        let rank = bootstrap.rank();
        let timeout = bootstrap.timeout();
        let deadline = Instant::now() + timeout;
        let ip = listen_ip(HostIdentity::local()?.same_node(peer_host), bootstrap);
        let listener =
            TcpListener::bind(SocketAddr::new(ip, 0)).map_err(os("bind (TCP connection)"))?;
        let addr = listener.local_addr().map_err(os("getsockname"))?;
        let nonce = random_nonce();
        let mut msg = nonce.to_le_bytes().to_vec();
        msg.extend_from_slice(addr.to_string().as_bytes());
        bootstrap.send(peer, tag, &msg)?;
        let theirs = bootstrap.recv(peer, tag)?;
        let mut r = Reader::new(&theirs, "TCP listening address");
        let their_nonce = r.u64()?;
        let text = String::from_utf8_lossy(r.take(theirs.len().saturating_sub(8))?).into_owned();
        let their_addr = text
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| Error::PeerLost(format!("rank {peer} sent a bad address '{text}'")))?;

        // Connect first (the kernel completes it without an accept), then accept: neither
        // side waits for the other to reach a given step.
        let mut out = connect_until(their_addr, deadline, timeout, peer)?;
        let mut hello = HELLO_MAGIC.to_vec();
        hello.extend_from_slice(&their_nonce.to_le_bytes());
        hello.extend_from_slice(&rank.to_le_bytes());
        out.write_all(&hello)
            .map_err(|e| Error::PeerLost(format!("rank {peer} during TCP setup: {e}")))?;
        let incoming = accept_until(&listener, deadline, timeout, peer, nonce)?;
        tune(&out, timeout)?;
        tune(&incoming, timeout)?;

        let device_path = bounce_all || device.backend() != BackendKind::Host;
        let staging = || device_path.then(|| Staging::new(device)).transpose();
        let (send_staging, recv_staging) = (staging()?, staging()?);
        let shared = Arc::new(Shared::default());
        let receiver = Receiver {
            rank,
            peer,
            sock: SpinRead::new(
                incoming.try_clone().map_err(os("dup (socket)"))?,
                spin_read::SPIN,
                READ_AHEAD,
            ),
            out: out.try_clone().map_err(os("dup (socket)"))?,
            shared: Arc::clone(&shared),
            staging: recv_staging,
            bounce_all,
            bounce: Vec::new(),
            error: None,
        };
        let thread = std::thread::Builder::new()
            .name(format!("oxccl-tcp-{rank}<-{peer}"))
            .spawn(move || receiver.run())
            .map_err(os("spawn (TCP receiver)"))?;
        tracing::debug!(rank, peer, %addr, %their_addr, "TCP connection up");
        Ok(TcpConnection {
            rank,
            peer,
            timeout,
            out: Mutex::new(Out {
                sock: out,
                seq: 0,
                acks: Vec::new(),
                staging: send_staging,
                broken: None,
            }),
            incoming,
            shared,
            bounce_all,
            receiver: Some(thread),
        })
    }

    /// The peer's rank.
    pub fn peer(&self) -> u32 {
        self.peer
    }

    /// Locks the sending side after checking the connection can still send.
    fn sender(&self) -> Result<MutexGuard<'_, Out>> {
        let out = lock(&self.out);
        if let Some(e) = &out.broken {
            return Err(clone_error(e));
        }
        if let Some(why) = &*lock(&self.shared.lost) {
            return Err(Error::PeerLost(format!("rank {}: {why}", self.peer)));
        }
        Ok(out)
    }

    /// The error for a failed send; marks the sending side `broken`.
    fn send_failed(&self, broken: &mut Option<Error>, e: std::io::Error) -> Error {
        let lost = lock(&self.shared.lost).clone();
        let err = match (e.kind(), lost) {
            // The receiver saw the peer go and shut the socket: its reason is the clearer.
            (_, Some(why)) => Error::PeerLost(format!("rank {}: {why}", self.peer)),
            (ErrorKind::WouldBlock | ErrorKind::TimedOut, None) => Error::Timeout {
                what: format!("rank {} to take data on its TCP connection", self.peer),
                waited: self.timeout,
            },
            (_, None) => Error::PeerLost(format!("rank {}: sending failed: {e}", self.peer)),
        };
        // Part of a frame may have gone out: nothing more can be sent on this stream.
        *broken = Some(clone_error(&err));
        err
    }

    /// Sends a write (see [`super::Connection::write`]); the bytes are out of `src` when
    /// this returns.
    pub fn write(
        &self,
        dst: &RemoteMemory,
        dst_offset: usize,
        src: &RegisteredMemory,
        src_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        self.send_write(dst, dst_offset, src, src_offset, bytes, None)
    }

    /// A write then an update (see [`super::Connection::write_and_update`]). A small write
    /// of host memory leaves with its update in one send: one system call, and one wake-up
    /// of the peer's receiver instead of two.
    pub fn write_and_update(
        &self,
        dst: &RemoteMemory,
        dst_offset: usize,
        src: &RegisteredMemory,
        src_offset: usize,
        bytes: usize,
        flag: (&RemoteMemory, usize, u64),
    ) -> Result<()> {
        self.send_write(dst, dst_offset, src, src_offset, bytes, Some(flag))
    }

    /// A write frame, followed by an update frame of `update` (registration, offset, value)
    /// when there is one, under one hold of the sending socket. A write of up to
    /// [`SMALL_WRITE`] bytes of host memory leaves with its header (and the update) in one
    /// send; device memory goes through the bounce slots.
    fn send_write(
        &self,
        dst: &RemoteMemory,
        dst_offset: usize,
        src: &RegisteredMemory,
        src_offset: usize,
        bytes: usize,
        update: Option<(&RemoteMemory, usize, u64)>,
    ) -> Result<()> {
        check_write(
            Transport::Tcp,
            self.peer,
            dst,
            dst_offset,
            src,
            src_offset,
            bytes,
        )?;
        let mut update = update
            .map(|(flag, at, value)| {
                check_update(Transport::Tcp, self.peer, flag, at)?;
                Ok(header(OP_UPDATE, flag.id(), at as u64, value))
            })
            .transpose()?;
        if bytes == 0 && update.is_none() {
            return Ok(());
        }
        let mut out = self.sender()?;
        let out = &mut *out;
        let registration = src.registration();
        if bytes > 0 {
            let header = header(OP_WRITE, dst.id(), dst_offset as u64, bytes as u64);
            let Some(base) = in_place(registration, self.bounce_all) else {
                self.send_staged(out, &header, registration, src_offset, bytes)?;
                return self.send_update(out, update);
            };
            // SAFETY: `src_offset + bytes <= src.len()` (check_write) and the registered range
            // lies inside the allocation, which `registration` keeps mapped for this call. The
            // caller must not write the range while the write runs (the contract of every
            // transport's `write`), so nothing mutates these bytes.
            let data = unsafe { std::slice::from_raw_parts(base.add(src_offset), bytes) };
            let sent = if bytes <= SMALL_WRITE {
                let mut frame = Vec::with_capacity(2 * HEADER + bytes);
                frame.extend_from_slice(&header);
                frame.extend_from_slice(data);
                if let Some(u) = update.take() {
                    frame.extend_from_slice(&u);
                }
                out.sock.write_all(&frame)
            } else {
                out.sock
                    .write_all(&header)
                    .and_then(|()| out.sock.write_all(data))
            };
            sent.map_err(|e| self.send_failed(&mut out.broken, e))?;
        }
        self.send_update(out, update)
    }

    /// Sends an update frame (when there is one) on the held sending socket.
    fn send_update(&self, out: &mut Out, update: Option<[u8; HEADER]>) -> Result<()> {
        let Some(frame) = update else {
            return Ok(());
        };
        out.sock
            .write_all(&frame)
            .map_err(|e| self.send_failed(&mut out.broken, e))
    }

    /// Sends a write of device memory through the bounce slots: while the socket takes
    /// chunk `i`, the copies of the next chunks run. The first chunk carries the header,
    /// so a small write is one send. Every copy has completed when this returns.
    fn send_staged(
        &self,
        out: &mut Out,
        header: &[u8; HEADER],
        src: &Arc<Registration>,
        src_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        let Out {
            sock,
            staging,
            broken,
            ..
        } = out;
        let st = staging.as_mut().ok_or_else(|| {
            Error::InvalidArgument("device memory reached a connection without a stream".into())
        })?;
        let mut started = false;
        let outcome = pipeline_send(st, sock, header, src, src_offset, bytes, &mut started);
        let failure = match outcome {
            Ok(()) => return Ok(()),
            Err(f) => f,
        };
        // Nothing may still read the source once this returns.
        let _ = st.drain();
        Err(match failure {
            SendFailure::Socket(e) => self.send_failed(broken, e),
            SendFailure::Device(e) => {
                if started {
                    // The header promised bytes that will not come.
                    *broken = Some(clone_error(&e));
                }
                e
            }
        })
    }

    /// Sends an update (see [`super::Connection::update_and_sync`]); the receiver applies it
    /// after every earlier write of this connection.
    pub fn update_and_sync(&self, dst: &RemoteMemory, dst_offset: usize, value: u64) -> Result<()> {
        check_update(Transport::Tcp, self.peer, dst, dst_offset)?;
        let frame = header(OP_UPDATE, dst.id(), dst_offset as u64, value);
        self.send_update(&mut *self.sender()?, Some(frame))
    }

    /// Sends a flush marker and waits for its acknowledgement, which the peer sends after
    /// applying everything before it (see [`super::Connection::flush`]).
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut out = self.sender()?;
        out.seq += 1;
        let seq = out.seq;
        let frame = header(OP_FLUSH, seq, 0, 0);
        out.sock
            .write_all(&frame)
            .map_err(|e| self.send_failed(&mut out.broken, e))?;
        let mut earlier_failure = None;
        let mut buf = [0u8; 1024];
        loop {
            while let Some((acked, status)) = take_ack(&mut out.acks)? {
                if let Err(msg) = status {
                    earlier_failure.get_or_insert(msg);
                }
                if acked == seq {
                    return match earlier_failure {
                        None => Ok(()),
                        Some(msg) => Err(Error::InvalidArgument(format!(
                            "rank {} could not apply writes from rank {}: {msg}",
                            self.peer, self.rank
                        ))),
                    };
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout {
                    what: format!(
                        "rank {} to acknowledge flush {seq} of its TCP connection from rank {}",
                        self.peer, self.rank
                    ),
                    waited: timeout,
                });
            }
            out.sock
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .map_err(os("setsockopt(SO_RCVTIMEO)"))?;
            match out.sock.read(&mut buf) {
                Ok(0) => {
                    let e = Error::PeerLost(format!(
                        "rank {} closed its TCP connection before acknowledging flush {seq}",
                        self.peer
                    ));
                    out.broken = Some(clone_error(&e));
                    return Err(e);
                }
                Ok(n) => out.acks.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    let e = Error::PeerLost(format!(
                        "rank {}: TCP connection lost while waiting for flush {seq}: {e}",
                        self.peer
                    ));
                    out.broken = Some(clone_error(&e));
                    return Err(e);
                }
            }
        }
    }
}

impl Drop for TcpConnection {
    fn drop(&mut self) {
        // Data already sent still reaches the peer (FIN after it); the receiver wakes up.
        let _ = lock(&self.out).sock.shutdown(Shutdown::Write);
        let _ = self.incoming.shutdown(Shutdown::Both);
        if let Some(t) = self.receiver.take() {
            if t.join().is_err() {
                tracing::warn!(peer = self.peer, "TCP receiver thread panicked");
            }
        }
        timeline::write();
    }
}

fn header(op: u8, a: u64, b: u64, c: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0] = op;
    h[1..9].copy_from_slice(&a.to_le_bytes());
    h[9..17].copy_from_slice(&b.to_le_bytes());
    h[17..25].copy_from_slice(&c.to_le_bytes());
    h
}

/// Removes one complete acknowledgement from the front of `buf`, if there is one.
fn take_ack(buf: &mut Vec<u8>) -> Result<Option<(u64, std::result::Result<(), String>)>> {
    if buf.len() < ACK_HEADER {
        return Ok(None);
    }
    let mut r = Reader::new(buf, "flush acknowledgement");
    let seq = r.u64()?;
    let status = r.u8()?;
    let len = r.u32()? as usize;
    if len > MAX_ACK_MESSAGE {
        return Err(Error::PeerLost(format!(
            "malformed flush acknowledgement ({len}-byte message)"
        )));
    }
    if buf.len() < ACK_HEADER + len {
        return Ok(None);
    }
    let msg = String::from_utf8_lossy(&buf[ACK_HEADER..ACK_HEADER + len]).into_owned();
    buf.drain(..ACK_HEADER + len);
    Ok(Some((seq, if status == 0 { Ok(()) } else { Err(msg) })))
}

/// A copy of an error for the second place it is reported (errors are not `Clone`).
fn clone_error(e: &Error) -> Error {
    match e.root() {
        Error::Timeout { what, waited } => Error::Timeout {
            what: what.clone(),
            waited: *waited,
        },
        Error::PeerLost(m) => Error::PeerLost(m.clone()),
        other => Error::PeerLost(format!(
            "connection unusable after an earlier error: {other}"
        )),
    }
}

/// The receiving side: applies the peer's frames to this process's registered memory.
struct Receiver {
    rank: u32,
    peer: u32,
    /// Spins a little before it sleeps (`tcp/spin_read.rs`).
    sock: SpinRead,
    /// The connection's sending socket, shut down when the receiver stops.
    out: TcpStream,
    shared: Arc<Shared>,
    /// Bounce slots and stream for device memory (GPU backends, or [`BOUNCE_VAR`]).
    staging: Option<Staging>,
    /// Host-backend memory takes the device path too ([`BOUNCE_VAR`]).
    bounce_all: bool,
    /// Where bytes for host memory, or for no valid target, are read.
    bounce: Vec<u8>,
    /// The first frame that could not be applied, reported by the next acknowledgement.
    error: Option<String>,
}

impl Receiver {
    fn run(mut self) {
        let why = loop {
            let mut h = [0u8; HEADER];
            if let Err(e) = self.sock.read_exact(&mut h) {
                break if e.kind() == ErrorKind::UnexpectedEof {
                    "closed its TCP connection (exited or failed)".to_string()
                } else {
                    format!("TCP connection failed: {e}")
                };
            }
            let word = |at: usize| {
                let mut a = [0u8; 8];
                a.copy_from_slice(&h[at..at + 8]);
                u64::from_le_bytes(a)
            };
            let (a, b, c) = (word(1), word(9), word(17));
            let step = match h[0] {
                OP_WRITE => {
                    timeline::record(Event::Header, self.rank, self.peer);
                    self.apply_write(a, b, c)
                }
                OP_UPDATE => {
                    let outcome = self.apply_update(a, b, c);
                    timeline::record(Event::Signalled, self.rank, self.peer);
                    self.note(outcome);
                    Ok(())
                }
                OP_FLUSH => self.acknowledge(a),
                op => Err(format!("unknown frame type {op} (protocol error)")),
            };
            if let Err(why) = step {
                break why;
            }
        };
        tracing::debug!(rank = self.rank, peer = self.peer, %why, "TCP receiver stops");
        *lock(&self.shared.lost) = Some(why);
        let _ = self.sock.socket().shutdown(Shutdown::Both);
        // A peer that closed its side may never read again, and a peer socket closed after
        // a shutdown can sit at a zero window without resetting: a send blocked on it would
        // wait out the whole timeout. Shutting our sending side wakes it with an error.
        let _ = self.out.shutdown(Shutdown::Both);
    }

    fn note(&mut self, outcome: Result<()>) {
        if let Err(e) = outcome {
            tracing::debug!(peer = self.peer, error = %e, "TCP frame not applied");
            self.error.get_or_insert_with(|| e.to_string());
        }
    }

    /// Reads a write's bytes and puts them in place. A write that cannot be applied is
    /// still read off the socket (the stream stays in step) and reported by the next ack.
    fn apply_write(&mut self, id: u64, offset: u64, len: u64) -> std::result::Result<(), String> {
        let t = match self.write_target(id, offset, len) {
            Ok(t) => t,
            Err(e) => {
                self.note(Err(e));
                return self.discard(len);
            }
        };
        let Some(base) = in_place(&t.reg, self.bounce_all) else {
            return self.receive_staged(&t.reg, offset, len);
        };
        // Host memory is written by this thread: copies still queued must not land after it.
        let drained = self.drain();
        self.note(drained);
        // `offset + len <= reg.len` (write_target), so both fit a usize.
        let (at, n) = (offset as usize, len as usize);
        // Straight from the socket into place, with no copy out of a bounce buffer.
        // SAFETY: `at + n <= reg.len` (write_target checked the write), and `t.reg` keeps the
        // allocation mapped while this runs. Nothing else writes the range meanwhile: the
        // protocol leaves it to this write until the signal that follows it on this socket.
        let dst = unsafe { std::slice::from_raw_parts_mut(base.add(at), n) };
        self.sock
            .read_exact(dst)
            .map_err(|e| format!("TCP connection failed inside a write: {e}"))
    }

    /// Reads a write for device memory through the bounce slots: while the device copies
    /// one chunk out of its slot, the next chunk is read into another. The copies stay
    /// queued when this returns (see [`Receiver::drain`]).
    fn receive_staged(
        &mut self,
        reg: &Arc<Registration>,
        offset: u64,
        len: u64,
    ) -> std::result::Result<(), String> {
        let Some(st) = self.staging.as_mut() else {
            // Only a receiver with staging registers device memory; read and drop.
            self.note(Err(Error::Unsupported(
                "device memory reached a TCP receiver without a stream".into(),
            )));
            return self.discard(len);
        };
        let mut failed = None;
        let mut done = 0u64;
        while done < len {
            let n = CHUNK.min(usize::try_from(len - done).unwrap_or(CHUNK));
            let i = st.take_next();
            // The slot's previous copy must have left it before it is refilled.
            if let Err(e) = st.wait(i) {
                failed.get_or_insert(e);
            }
            if let Err(e) = self.sock.read_exact(st.bytes(i, 0, n)) {
                return Err(format!("TCP connection failed inside a write: {e}"));
            }
            if failed.is_none() {
                // `offset + len` fits the registration (write_target), hence a usize.
                let at = usize::try_from(offset + done).unwrap_or(usize::MAX);
                failed = st.empty(i, reg, at, n).err();
            }
            done += n as u64;
        }
        if let Some(e) = failed {
            self.note(Err(e));
        }
        Ok(())
    }

    /// Reads `len` bytes off the socket and drops them.
    fn discard(&mut self, len: u64) -> std::result::Result<(), String> {
        self.bounce.resize(CHUNK, 0);
        let mut left = len;
        while left > 0 {
            let n = CHUNK.min(usize::try_from(left).unwrap_or(CHUNK));
            if let Err(e) = self.sock.read_exact(&mut self.bounce[..n]) {
                return Err(format!("TCP connection failed inside a write: {e}"));
            }
            left -= n as u64;
        }
        Ok(())
    }

    /// Waits until every queued device copy has landed.
    fn drain(&mut self) -> Result<()> {
        match self.staging.as_mut() {
            Some(st) => st.drain(),
            None => Ok(()),
        }
    }

    fn write_target(&self, id: u64, offset: u64, len: u64) -> Result<Target> {
        let reg = lookup(id).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "no live TCP registration {id} on rank {} (freed, or never registered)",
                self.rank
            ))
        })?;
        if reg.rank != self.rank {
            return Err(Error::InvalidArgument(format!(
                "registration {id} belongs to rank {}, not to rank {}",
                reg.rank, self.rank
            )));
        }
        let fits = offset.checked_add(len).is_some_and(|e| e <= reg.len as u64);
        if !fits {
            return Err(Error::InvalidArgument(format!(
                "write of {len} bytes at offset {offset} runs past registration {id} ({} bytes)",
                reg.len
            )));
        }
        Ok(Target { reg })
    }

    fn apply_update(&mut self, id: u64, offset: u64, value: u64) -> Result<()> {
        let t = self.write_target(id, offset, 8)?;
        let at = usize::try_from(offset)
            .map_err(|_| Error::InvalidArgument(format!("offset {offset} does not fit")))?;
        match t.reg.host_base() {
            Some(base) => {
                // Earlier writes may still be being copied: they land first. A failed one
                // is reported by the next acknowledgement; the value is stored all the same,
                // as it would be after a write that failed to apply.
                let drained = self.drain();
                let p = base.wrapping_add(at);
                if (p as usize) % 8 != 0 {
                    return Err(Error::InvalidArgument(format!(
                        "update at offset {offset} of registration {id} is not 8-byte aligned"
                    )));
                }
                // SAFETY: the 8 bytes are inside the registration (write_target), aligned
                // (checked above) and kept mapped by `t.reg`. Flags are accessed atomically by
                // every oxccl agent, so an atomic store here does not race non-atomically.
                let cell = unsafe { AtomicU64::from_ptr(p.cast::<u64>()) };
                // Release: a waiter that acquires the value sees every earlier write, which
                // this thread made before.
                cell.store(value, Ordering::Release);
                drained
            }
            // Queued on the stream of the earlier writes' copies, so it lands after them.
            None => match &self.staging {
                Some(st) => st.stream().write(t.reg.ptr_at(at)?, &value.to_le_bytes()),
                None => Err(Error::Unsupported(
                    "device memory reached a TCP receiver without a stream".into(),
                )),
            },
        }
    }

    fn acknowledge(&mut self, seq: u64) -> std::result::Result<(), String> {
        // The acknowledgement says every earlier write landed: the copies must have run.
        let drained = self.drain();
        self.note(drained);
        let (status, mut msg) = match self.error.take() {
            None => (0u8, String::new()),
            Some(m) => (1u8, m),
        };
        if msg.len() > MAX_ACK_MESSAGE {
            let mut cut = MAX_ACK_MESSAGE;
            while !msg.is_char_boundary(cut) {
                cut -= 1;
            }
            msg.truncate(cut);
        }
        let mut ack = Vec::with_capacity(ACK_HEADER + msg.len());
        ack.extend_from_slice(&seq.to_le_bytes());
        ack.push(status);
        ack.extend_from_slice(&(msg.len() as u32).to_le_bytes());
        ack.extend_from_slice(msg.as_bytes());
        self.sock
            .write_all(&ack)
            .map_err(|e| format!("TCP connection failed acknowledging a flush: {e}"))
    }
}

/// Host address of a registration's first byte when its data moves in place (host-backend
/// memory, unless [`BOUNCE_VAR`] sends it through the device path).
fn in_place(reg: &Registration, bounce_all: bool) -> Option<*mut u8> {
    if bounce_all {
        None
    } else {
        reg.host_base()
    }
}

/// A registration a frame writes into.
struct Target {
    reg: Arc<Registration>,
}

/// Why a staged send stopped.
enum SendFailure {
    /// A device copy or its event failed.
    Device(Error),
    /// The socket failed.
    Socket(std::io::Error),
}

/// The pipeline of [`TcpConnection::send_staged`]: copies run `SLOTS` chunks ahead of the
/// socket; a chunk is sent once its copy's event has completed, and its slot is refilled
/// after the send has taken the bytes. `started` is set once any byte of the frame is sent.
fn pipeline_send(
    st: &mut Staging,
    sock: &mut TcpStream,
    header: &[u8; HEADER],
    src: &Arc<Registration>,
    src_offset: usize,
    bytes: usize,
    started: &mut bool,
) -> std::result::Result<(), SendFailure> {
    let chunks = bytes.div_ceil(CHUNK);
    let len = |i: usize| CHUNK.min(bytes - i * CHUNK);
    let fill = |st: &mut Staging, i: usize| {
        st.fill(i, src, src_offset + i * CHUNK, len(i))
            .map_err(SendFailure::Device)
    };
    for i in 0..chunks.min(SLOTS) {
        fill(st, i)?;
    }
    for i in 0..chunks {
        st.wait(i).map_err(SendFailure::Device)?;
        let frame = if i == 0 {
            let frame = st.bytes(i, HEADER, len(i));
            frame[..HEADER].copy_from_slice(header);
            frame
        } else {
            st.bytes(i, 0, len(i))
        };
        *started = true;
        sock.write_all(frame).map_err(SendFailure::Socket)?;
        if i + SLOTS < chunks {
            fill(st, i + SLOTS)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
