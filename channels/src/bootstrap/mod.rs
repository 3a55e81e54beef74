//! Bootstrap: how the processes of a job find each other and exchange setup data.
//!
//! One process creates a [`UniqueId`] (which starts the rendezvous root in that process) and
//! hands its bytes to the others by any means; or every process reads its rank and the root
//! address from the launcher ([`Bootstrap::from_env`]). Each rank connects to the root, which
//! answers with every rank's listening address; the ranks then connect to each other (a full
//! mesh of TCP connections). A reader thread per peer files incoming frames by tag, so
//! `recv` can wait with a deadline and name the rank it waited for, and a peer that dies is
//! reported as [`Error::PeerLost`] instead of a hang.
//!
//! Collectives (`all_gather`, `barrier`) must be called by all ranks in the same order.
//! A rank that calls a different collective at the same point is reported as a mismatch.

mod launcher;
mod root;
mod unique_id;
mod wire;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use launcher::{free_rendezvous_port, LaunchInfo, RENDEZVOUS_PORTS};
pub use unique_id::{UniqueId, UNIQUE_ID_BYTES};

use oxccl_hal::{Error, Result};
use wire::{put_string, read_frame, write_frame, Reader};

/// Environment variable naming the network interface to bootstrap over.
pub const IFNAME_VAR: &str = "OXCCL_SOCKET_IFNAME";
/// Environment variable with the bootstrap timeout in seconds.
pub const TIMEOUT_VAR: &str = "OXCCL_BOOTSTRAP_TIMEOUT";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
const ROOT_GRACE: Duration = Duration::from_secs(3);

const TAG_PEER_HELLO: u64 = 0x5045_4552_0000_0004;
const INTERNAL: u64 = 1 << 63;
const KIND_SHIFT: u32 = 48;
const SEQ_MASK: u64 = (1 << KIND_SHIFT) - 1;

/// Which internal collective a frame belongs to (encoded in its tag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Collective {
    AllGather = 1,
    Barrier = 2,
}

impl Collective {
    fn name(code: u64) -> &'static str {
        match code {
            1 => "all_gather",
            2 => "barrier",
            _ => "an unknown collective",
        }
    }
}

fn internal_tag(kind: Collective, seq: u64) -> u64 {
    INTERNAL | ((kind as u64) << KIND_SHIFT) | (seq & SEQ_MASK)
}

/// Settings of a bootstrap.
#[derive(Debug, Clone)]
pub struct BootstrapConfig {
    /// How long any blocking call waits before it reports a timeout.
    pub timeout: Duration,
}

impl BootstrapConfig {
    /// From the environment: `OXCCL_BOOTSTRAP_TIMEOUT` seconds (default 120).
    pub fn from_env() -> Result<Self> {
        let timeout = match std::env::var(TIMEOUT_VAR) {
            Ok(v) => Duration::from_secs_f64(
                v.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|s| *s > 0.0)
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "{TIMEOUT_VAR}='{v}' is not a positive number of seconds"
                        ))
                    })?,
            ),
            Err(_) => DEFAULT_TIMEOUT,
        };
        Ok(BootstrapConfig { timeout })
    }
}

impl Default for BootstrapConfig {
    fn default() -> Self {
        BootstrapConfig {
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl UniqueId {
    /// Creates an id whose root listens on the interface named by `OXCCL_SOCKET_IFNAME`
    /// (else the first non-loopback IPv4 interface, else loopback) and starts the root.
    pub fn create(config: &BootstrapConfig) -> Result<UniqueId> {
        UniqueId::create_on(pick_ip()?, config)
    }

    /// Creates an id whose root listens on `ip` (an ephemeral port) and starts the root.
    pub fn create_on(ip: IpAddr, config: &BootstrapConfig) -> Result<UniqueId> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| Error::Os {
            call: "bind (bootstrap root)",
            source: e,
        })?;
        let root = listener.local_addr().map_err(|e| Error::Os {
            call: "getsockname",
            source: e,
        })?;
        let id = UniqueId {
            root,
            nonce: unique_id::random_u64(),
        };
        start_root(listener, id.nonce, config.timeout)?;
        Ok(id)
    }
}

fn start_root(listener: TcpListener, nonce: u64, timeout: Duration) -> Result<()> {
    std::thread::Builder::new()
        .name("oxccl-bootstrap-root".into())
        .spawn(move || root::serve(listener, nonce, timeout))
        .map(|_| ())
        .map_err(|e| Error::Os {
            call: "spawn (bootstrap root)",
            source: e,
        })
}

fn pick_ip() -> Result<IpAddr> {
    let wanted = std::env::var(IFNAME_VAR).ok();
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| Error::errno("getifaddrs", e))?;
    let mut fallback = None;
    for ifa in addrs {
        let Some(v4) = ifa
            .address
            .as_ref()
            .and_then(|a| a.as_sockaddr_in())
            .map(|s| s.ip())
        else {
            continue;
        };
        match &wanted {
            Some(name) if &ifa.interface_name == name => return Ok(IpAddr::V4(v4)),
            Some(_) => {}
            None if !v4.is_loopback() && fallback.is_none() => fallback = Some(IpAddr::V4(v4)),
            None => {}
        }
    }
    match wanted {
        Some(name) => Err(Error::InvalidArgument(format!(
            "{IFNAME_VAR}={name}: no IPv4 address on that interface"
        ))),
        None => Ok(fallback.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))),
    }
}

#[derive(Default)]
struct MailState {
    queues: HashMap<(u32, u64), VecDeque<Vec<u8>>>,
    dead: HashMap<u32, String>,
    /// Set by [`Bootstrap::abort`]: every wait ends with it.
    aborted: Option<String>,
}

struct Mailbox {
    state: Mutex<MailState>,
    arrived: Condvar,
}

impl Mailbox {
    fn lock(&self) -> MutexGuard<'_, MailState> {
        // Every update is a single insert or push; a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A connected job: rank, world size and a connection to every other rank.
pub struct Bootstrap {
    rank: u32,
    world_size: u32,
    timeout: Duration,
    local_ip: IpAddr,
    writers: Vec<Option<Mutex<TcpStream>>>,
    mailbox: Arc<Mailbox>,
    seq: AtomicU64,
}

impl std::fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bootstrap")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish()
    }
}

fn connect_with_retry(addr: SocketAddr, deadline: Instant, what: &str) -> Result<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                what: format!("connecting to {what} at {addr}"),
                waited: Duration::ZERO,
            });
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(s) => return Ok(s),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::TimedOut
                ) =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                return Err(Error::Os {
                    call: "connect",
                    source: e,
                })
            }
        }
    }
}

impl Bootstrap {
    /// Joins the job named by `id` as `rank` of `world_size`.
    pub fn new(
        id: &UniqueId,
        rank: u32,
        world_size: u32,
        config: &BootstrapConfig,
    ) -> Result<Bootstrap> {
        if world_size == 0 || rank >= world_size {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} is not below world size {world_size}"
            )));
        }
        let _span = tracing::info_span!("bootstrap", rank, world_size).entered();
        let deadline = Instant::now() + config.timeout;
        let at_rank = |e: Error| e.at_rank(rank);

        // Rendezvous: say where we listen, learn where everyone listens.
        let mut to_root =
            connect_with_retry(id.root, deadline, "the bootstrap root").map_err(at_rank)?;
        let my_ip = to_root
            .local_addr()
            .map_err(|e| Error::Os {
                call: "getsockname",
                source: e,
            })?
            .ip();
        let listener = TcpListener::bind(SocketAddr::new(my_ip, 0)).map_err(|e| Error::Os {
            call: "bind (bootstrap peer)",
            source: e,
        })?;
        let my_addr = listener.local_addr().map_err(|e| Error::Os {
            call: "getsockname",
            source: e,
        })?;
        let mut hello = Vec::new();
        hello.extend_from_slice(&id.nonce.to_le_bytes());
        hello.extend_from_slice(&rank.to_le_bytes());
        hello.extend_from_slice(&world_size.to_le_bytes());
        put_string(&mut hello, &my_addr.to_string());
        let io = |e: std::io::Error| Error::PeerLost(format!("bootstrap root: {e}"));
        write_frame(&mut to_root, root::TAG_HELLO, &hello).map_err(io)?;
        // The root knows which ranks are missing and says so when its own deadline passes;
        // wait a little past ours so that its message, not a bare timeout, reaches us.
        to_root
            .set_read_timeout(Some(
                deadline.saturating_duration_since(Instant::now()) + ROOT_GRACE,
            ))
            .map_err(|e| Error::Os {
                call: "setsockopt",
                source: e,
            })?;
        let (tag, payload) = read_frame(&mut to_root)
            .map_err(|e| {
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) {
                    Error::Timeout {
                        what: "the bootstrap root's address table".into(),
                        waited: config.timeout,
                    }
                } else {
                    io(e)
                }
            })
            .map_err(at_rank)?;
        match tag {
            root::TAG_TABLE => {}
            root::TAG_ERROR => {
                return Err(Error::PeerLost(format!(
                    "bootstrap root refused: {}",
                    String::from_utf8_lossy(&payload)
                ))
                .at_rank(rank))
            }
            other => {
                return Err(
                    Error::PeerLost(format!("bootstrap root sent tag {other:#x}")).at_rank(rank),
                )
            }
        }
        let mut r = Reader::new(&payload, "address table");
        let mut table = Vec::with_capacity(world_size as usize);
        for _ in 0..world_size {
            let s = r.string()?;
            let addr = s
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| Error::PeerLost(format!("bad address '{s}' in the table")))?;
            table.push(addr);
        }

        // Mesh: connect to lower ranks, accept from higher ranks.
        let mut streams: Vec<Option<TcpStream>> = (0..world_size).map(|_| None).collect();
        for (peer, addr) in table.iter().enumerate().take(rank as usize) {
            let mut s =
                connect_with_retry(*addr, deadline, &format!("rank {peer}")).map_err(at_rank)?;
            let mut h = Vec::new();
            h.extend_from_slice(&id.nonce.to_le_bytes());
            h.extend_from_slice(&rank.to_le_bytes());
            write_frame(&mut s, TAG_PEER_HELLO, &h)
                .map_err(|e| Error::PeerLost(format!("rank {peer}: {e}")).at_rank(rank))?;
            streams[peer] = Some(s);
        }
        listener.set_nonblocking(true).map_err(|e| Error::Os {
            call: "set_nonblocking",
            source: e,
        })?;
        let mut expected: Vec<u32> = (rank + 1..world_size).collect();
        while !expected.is_empty() {
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!("ranks {expected:?} to connect"),
                    waited: config.timeout,
                }
                .at_rank(rank));
            }
            let mut s = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
                Err(e) => {
                    return Err(Error::Os {
                        call: "accept",
                        source: e,
                    }
                    .at_rank(rank))
                }
            };
            let _ = s.set_nonblocking(false);
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            let Ok((tag, payload)) = read_frame(&mut s) else {
                continue;
            };
            let mut r = Reader::new(&payload, "peer hello");
            let (Ok(nonce), Ok(peer)) = (r.u64(), r.u32()) else {
                continue;
            };
            if tag != TAG_PEER_HELLO || nonce != id.nonce || !expected.contains(&peer) {
                continue; // a stranger or a stale job: not ours
            }
            expected.retain(|p| *p != peer);
            streams[peer as usize] = Some(s);
        }

        let mailbox = Arc::new(Mailbox {
            state: Mutex::new(MailState::default()),
            arrived: Condvar::new(),
        });
        let mut writers = Vec::with_capacity(world_size as usize);
        for (peer, stream) in streams.into_iter().enumerate() {
            let Some(stream) = stream else {
                writers.push(None);
                continue;
            };
            let _ = stream.set_read_timeout(None);
            let _ = stream.set_write_timeout(Some(config.timeout));
            let _ = stream.set_nodelay(true);
            let reader = stream.try_clone().map_err(|e| Error::Os {
                call: "dup (socket)",
                source: e,
            })?;
            let mb = Arc::clone(&mailbox);
            let peer = peer as u32;
            std::thread::Builder::new()
                .name(format!("oxccl-bootstrap-{rank}<-{peer}"))
                .spawn(move || read_loop(reader, peer, mb))
                .map_err(|e| Error::Os {
                    call: "spawn (bootstrap reader)",
                    source: e,
                })?;
            writers.push(Some(Mutex::new(stream)));
        }
        tracing::debug!("bootstrap connected");
        Ok(Bootstrap {
            rank,
            world_size,
            timeout: config.timeout,
            local_ip: my_ip,
            writers,
            mailbox,
            seq: AtomicU64::new(0),
        })
    }

    /// Joins the job described by the launcher environment (torchrun, mpirun, srun). Rank 0
    /// starts the root on the rendezvous port.
    pub fn from_env(config: &BootstrapConfig) -> Result<(Bootstrap, LaunchInfo)> {
        let info = LaunchInfo::from_env()?;
        let root = (info.root_host.as_str(), info.root_port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                Error::InvalidArgument(format!("cannot resolve MASTER_ADDR '{}'", info.root_host))
            })?;
        // Every rank must present the same nonce without talking first: derive it from what
        // they share (the rendezvous address and the world size).
        let nonce =
            u64::from(info.root_port) << 32 ^ u64::from(info.world_size) ^ 0x6f78_6363_6c00_0000;
        if info.rank == 0 {
            let listener = TcpListener::bind(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                info.root_port,
            ))
            .map_err(|e| Error::Os {
                call: "bind (bootstrap root on the rendezvous port)",
                source: e,
            })?;
            start_root(listener, nonce, config.timeout)?;
        }
        let id = UniqueId { root, nonce };
        let bootstrap = Bootstrap::new(&id, info.rank, info.world_size, config)?;
        Ok((bootstrap, info))
    }

    /// This process's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u32 {
        self.world_size
    }

    /// The address of this host that the other ranks reach it on (the interface it used to
    /// reach the root). Transports listen here for peers on other nodes.
    pub fn local_ip(&self) -> IpAddr {
        self.local_ip
    }

    /// How long blocking calls wait; transports set up over this bootstrap use it too.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn writer(&self, peer: u32) -> Result<&Mutex<TcpStream>> {
        self.writers
            .get(peer as usize)
            .and_then(|w| w.as_ref())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "rank {peer} is not a peer of rank {} in a world of {}",
                    self.rank, self.world_size
                ))
            })
    }

    fn send_raw(&self, peer: u32, tag: u64, data: &[u8]) -> Result<()> {
        let writer = self.writer(peer)?;
        let mut stream = writer.lock().unwrap_or_else(|p| p.into_inner());
        write_frame(&mut stream, tag, data)
            .map_err(|e| Error::PeerLost(format!("sending to rank {peer}: {e}")).at_rank(self.rank))
    }

    /// Sends `data` to `peer` under a user tag.
    pub fn send(&self, peer: u32, tag: u32, data: &[u8]) -> Result<()> {
        self.send_raw(peer, u64::from(tag), data)
    }

    /// Receives the next message from `peer` under a user tag, waiting up to the timeout.
    pub fn recv(&self, peer: u32, tag: u32) -> Result<Vec<u8>> {
        self.writer(peer)?;
        let deadline = Instant::now() + self.timeout;
        self.recv_raw(peer, u64::from(tag), deadline)
            .map_err(|e| e.at_rank(self.rank))
    }

    fn recv_raw(&self, peer: u32, tag: u64, deadline: Instant) -> Result<Vec<u8>> {
        let mut state = self.mailbox.lock();
        loop {
            if let Some(msg) = state
                .queues
                .get_mut(&(peer, tag))
                .and_then(VecDeque::pop_front)
            {
                return Ok(msg);
            }
            if tag & INTERNAL != 0 {
                if let Some(other) = mismatched(&state, peer, tag) {
                    return Err(Error::InvalidArgument(format!(
                        "mismatched collectives: rank {peer} called {} where this rank called {}",
                        Collective::name(other),
                        Collective::name((tag & !INTERNAL) >> KIND_SHIFT)
                    )));
                }
            }
            if let Some(why) = &state.aborted {
                return Err(Error::Aborted(format!("waiting for rank {peer}: {why}")));
            }
            if let Some(why) = state.dead.get(&peer) {
                return Err(Error::PeerLost(format!("rank {peer}: {why}")));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout {
                    what: format!("rank {peer}"),
                    waited: self.timeout,
                });
            }
            state = self
                .mailbox
                .arrived
                .wait_timeout(state, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Ends every wait of this bootstrap, now and later, with [`Error::Aborted`] naming
    /// `why` (a communicator aborted while a host-side exchange waits on a dead peer).
    /// Sends still go out; the connections stay open for the peers.
    pub fn abort(&self, why: &str) {
        let mut state = self.mailbox.lock();
        if state.aborted.is_none() {
            state.aborted = Some(why.to_string());
        }
        drop(state);
        self.mailbox.arrived.notify_all();
    }

    /// Why waiting on `peer` is futile: this bootstrap was aborted, or the peer's
    /// connection closed (it exited or died). `None` while neither happened. For waits
    /// outside the bootstrap, e.g. [`crate::local_exchange::LocalExchange`]'s.
    pub fn peer_failure(&self, peer: u32) -> Option<Error> {
        let state = self.mailbox.lock();
        if let Some(why) = &state.aborted {
            return Some(Error::Aborted(format!("waiting for rank {peer}: {why}")));
        }
        state
            .dead
            .get(&peer)
            .map(|why| Error::PeerLost(format!("rank {peer}: {why}")))
    }

    /// Gathers every rank's `data` (lengths may differ); entry `r` is rank `r`'s.
    pub fn all_gather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.collective(Collective::AllGather, data, self.timeout)
    }

    /// [`Bootstrap::all_gather`] bounded by `timeout` instead of the bootstrap's own (a
    /// caller whose peers answer within a shorter bound, e.g. a collective call's).
    pub fn all_gather_within(&self, data: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        self.collective(Collective::AllGather, data, timeout)
    }

    /// Returns once every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        self.collective(Collective::Barrier, &[], self.timeout)
            .map(|_| ())
    }

    fn collective(&self, kind: Collective, data: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let tag = internal_tag(kind, seq);
        for peer in (0..self.world_size).filter(|p| *p != self.rank) {
            self.send_raw(peer, tag, data)?;
        }
        let deadline = Instant::now() + timeout;
        let mut out: Vec<Vec<u8>> = vec![Vec::new(); self.world_size as usize];
        out[self.rank as usize] = data.to_vec();
        let mut missing = Vec::new();
        for peer in (0..self.world_size).filter(|p| *p != self.rank) {
            match self.recv_raw(peer, tag, deadline) {
                Ok(v) => out[peer as usize] = v,
                Err(Error::Timeout { .. }) => missing.push(peer),
                Err(e) => return Err(e.at_rank(self.rank)),
            }
        }
        if !missing.is_empty() {
            return Err(Error::Timeout {
                what: format!(
                    "ranks {missing:?} in {} #{seq}",
                    Collective::name(kind as u64)
                ),
                waited: timeout,
            }
            .at_rank(self.rank));
        }
        Ok(out)
    }
}

/// A queued frame from `peer` for the same collective number but of another kind.
fn mismatched(state: &MailState, peer: u32, tag: u64) -> Option<u64> {
    let seq = tag & SEQ_MASK;
    state.queues.iter().find_map(|((p, t), q)| {
        (*p == peer && t & INTERNAL != 0 && t & SEQ_MASK == seq && *t != tag && !q.is_empty())
            .then_some((t & !INTERNAL) >> KIND_SHIFT)
    })
}

fn read_loop(mut stream: TcpStream, peer: u32, mailbox: Arc<Mailbox>) {
    loop {
        match read_frame(&mut stream) {
            Ok((tag, payload)) => {
                mailbox
                    .lock()
                    .queues
                    .entry((peer, tag))
                    .or_default()
                    .push_back(payload);
                mailbox.arrived.notify_all();
            }
            Err(e) => {
                let why = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    "closed its connection (exited or failed)".to_string()
                } else {
                    format!("connection failed: {e}")
                };
                mailbox.lock().dead.insert(peer, why);
                mailbox.arrived.notify_all();
                return;
            }
        }
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        for w in self.writers.iter().flatten() {
            let s = w.lock().unwrap_or_else(|p| p.into_inner());
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests;
