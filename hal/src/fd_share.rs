//! Passing file descriptors between processes.
//!
//! Memory that is shared through a file descriptor (host-backend memfds, CUDA and ROCm VMM
//! allocations exported as POSIX FDs) cannot travel inside an [`crate::IpcHandle`]: a
//! descriptor number means nothing in another process. Instead the exporter keeps a dup of
//! the descriptor under an export number ([`publish`]) and a per-process server thread hands
//! a copy to whoever asks ([`fetch`]) over the abstract Unix socket
//! `"\0oxccl-fd-{pid}-{nonce:016x}"`.
//!
//! The nonce ([`process_nonce`]) is random per process, so a handle from a process whose pid
//! has since been reused reaches no server and reports the owner as gone instead of being
//! answered by a stranger. Abstract sockets vanish with the process, so there is no file to
//! clean up after a crash.
//!
//! Protocol, one request per connection:
//! - client sends 16 bytes: the magic `b"OXFD"`, a little-endian `u32` version, the `u64` id;
//! - server answers one status byte; with [`STATUS_OK`] the descriptor rides along as
//!   `SCM_RIGHTS` in the same message.
//!
//! Processes that `fork` must `exec` before using this module: the server thread does not
//! survive a fork.

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::error::{Error, Result};

const REQUEST_MAGIC: &[u8; 4] = b"OXFD";
const PROTOCOL_VERSION: u32 = 1;
const REQUEST_LEN: usize = 16;

/// Reply status: the descriptor follows as `SCM_RIGHTS`.
const STATUS_OK: u8 = 0;
/// Reply status: nothing is published under that id (withdrawn or never published).
const STATUS_STALE: u8 = 1;
/// Reply status: the request was not understood.
const STATUS_MALFORMED: u8 = 2;
/// Reply status: the server could not duplicate the descriptor.
const STATUS_SERVER_ERROR: u8 = 3;

/// How long the server waits on one slow or silent client before dropping it.
const SERVER_CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Descriptors published by this process, by export id.
static TABLE: LazyLock<Mutex<HashMap<u64, OwnedFd>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Pid of the process whose server thread is running (absent until the first publish).
static SERVER_PID: Mutex<Option<u32>> = Mutex::new(None);

static NEXT_EXPORT_ID: AtomicU64 = AtomicU64::new(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here is a single map insert/remove/lookup, so a panic elsewhere
    // while the lock was held cannot leave the data half-updated.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A random number fixed for the life of the process (never zero).
///
/// Read from the kernel's random source; where that fails, mixed from the clock and the pid,
/// which still tells a reused pid apart in practice.
pub fn process_nonce() -> u64 {
    static NONCE: OnceLock<u64> = OnceLock::new();
    *NONCE.get_or_init(|| {
        let mut bytes = [0u8; 8];
        let random = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .map(|()| u64::from_le_bytes(bytes));
        let nonce = random.unwrap_or_else(|_| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            nanos ^ (u64::from(std::process::id()) << 32) ^ 0x9e37_79b9_7f4a_7c15
        });
        // Zero is kept free so that a zeroed handle never names a live process.
        nonce.max(1)
    })
}

/// A new export number, unique within this process; the first is 1.
pub fn next_export_id() -> u64 {
    NEXT_EXPORT_ID.fetch_add(1, Ordering::Relaxed)
}

fn socket_name(pid: u32, nonce: u64) -> String {
    format!("oxccl-fd-{pid}-{nonce:016x}")
}

fn stale(id: u64, pid: u32) -> Error {
    Error::Ipc(format!(
        "stale handle: export {id} of process {pid} was freed (or never exported)"
    ))
}

/// Serves a dup of `fd` under `id` until [`withdraw`]`(id)`.
///
/// Starts this process's descriptor server on first use. Publishing an id that is already
/// published is an error (it would silently replace what importers get).
pub fn publish(id: u64, fd: BorrowedFd<'_>) -> Result<()> {
    ensure_server()?;
    let dup = fd.try_clone_to_owned().map_err(|source| Error::Os {
        call: "fcntl(F_DUPFD_CLOEXEC)",
        source,
    })?;
    let mut table = lock(&TABLE);
    if table.contains_key(&id) {
        return Err(Error::InvalidArgument(format!(
            "export {id} is already published by this process"
        )));
    }
    table.insert(id, dup);
    tracing::debug!(id, "descriptor published");
    Ok(())
}

/// Stops serving `id`; later fetches report a stale handle. Unknown ids are ignored.
///
/// Importers that already hold the descriptor keep it: withdrawal only stops new fetches.
pub fn withdraw(id: u64) {
    if lock(&TABLE).remove(&id).is_some() {
        tracing::debug!(id, "descriptor withdrawn");
    }
}

/// Gets a descriptor that process `owner_pid` published under `id`.
///
/// In the owning process itself this is a plain dup. Elsewhere it asks the owner's server,
/// waiting at most `timeout` in all. A process that is gone (or a pid now owned by another
/// process) yields [`Error::PeerLost`]; a withdrawn id yields [`Error::Ipc`].
pub fn fetch(owner_pid: u32, owner_nonce: u64, id: u64, timeout: Duration) -> Result<OwnedFd> {
    if owner_pid == std::process::id() && owner_nonce == process_nonce() {
        let table = lock(&TABLE);
        let fd = table.get(&id).ok_or_else(|| stale(id, owner_pid))?;
        return fd.try_clone().map_err(|source| Error::Os {
            call: "fcntl(F_DUPFD_CLOEXEC)",
            source,
        });
    }
    fetch_remote(owner_pid, owner_nonce, id, timeout)
}

/// The socket path of [`fetch`], also used against this process's own server by the tests.
fn fetch_remote(owner_pid: u32, owner_nonce: u64, id: u64, timeout: Duration) -> Result<OwnedFd> {
    if timeout.is_zero() {
        return Err(Error::InvalidArgument(
            "fd_share::fetch needs a non-zero timeout".into(),
        ));
    }
    let deadline = Instant::now() + timeout;
    let what = || format!("descriptor of export {id} from process {owner_pid}");
    let timed_out = || Error::Timeout {
        what: what(),
        waited: timeout,
    };
    let io_err = |call: &'static str, e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => timed_out(),
        _ => Error::Os { call, source: e },
    };
    let name = socket_name(owner_pid, owner_nonce);
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(|source| Error::Os {
        call: "socket address",
        source,
    })?;
    let mut stream = UnixStream::connect_addr(&addr).map_err(|e| match e.raw_os_error() {
        Some(libc::ECONNREFUSED) | Some(libc::ENOENT) => Error::PeerLost(format!(
            "process {owner_pid} (nonce {owner_nonce:016x}) is gone: nothing listens on \
                 its descriptor socket, so export {id} cannot be fetched"
        )),
        _ => Error::Os {
            call: "connect",
            source: e,
        },
    })?;
    let remaining = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(timed_out)
    };
    stream
        .set_write_timeout(Some(remaining()?))
        .map_err(|e| io_err("setsockopt(SO_SNDTIMEO)", e))?;
    let mut request = [0u8; REQUEST_LEN];
    request[..4].copy_from_slice(REQUEST_MAGIC);
    request[4..8].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    request[8..].copy_from_slice(&id.to_le_bytes());
    stream.write_all(&request).map_err(|e| io_err("send", e))?;
    stream
        .set_read_timeout(Some(remaining()?))
        .map_err(|e| io_err("setsockopt(SO_RCVTIMEO)", e))?;

    let mut status = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut status)];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let (bytes, fds) = {
        let msg = socket::recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|errno| match errno {
            nix::errno::Errno::EAGAIN | nix::errno::Errno::ETIMEDOUT => timed_out(),
            other => Error::errno("recvmsg", other),
        })?;
        let mut fds = Vec::new();
        let cmsgs = msg
            .cmsgs()
            .map_err(|e| Error::errno("recvmsg (control data)", e))?;
        for c in cmsgs {
            if let ControlMessageOwned::ScmRights(received) = c {
                fds.extend(received);
            }
        }
        (msg.bytes, fds)
    };
    // Own every received descriptor first, so that none leaks whatever the reply says.
    let mut owned: Vec<OwnedFd> = fds
        .into_iter()
        // SAFETY: the kernel just installed these descriptors in this process for us
        // (SCM_RIGHTS); nothing else refers to them, so taking ownership is sound.
        .map(|raw| unsafe { OwnedFd::from_raw_fd(raw) })
        .collect();
    if bytes == 0 {
        return Err(Error::PeerLost(format!(
            "process {owner_pid} closed the connection before answering for export {id}"
        )));
    }
    match status[0] {
        STATUS_OK => match (owned.pop(), owned.is_empty()) {
            (Some(fd), true) => Ok(fd),
            _ => Err(Error::Ipc(format!(
                "process {owner_pid} answered for export {id} without exactly one descriptor"
            ))),
        },
        STATUS_STALE => Err(stale(id, owner_pid)),
        STATUS_MALFORMED => Err(Error::Ipc(format!(
            "process {owner_pid} did not understand the request for export {id} \
             (protocol version mismatch?)"
        ))),
        STATUS_SERVER_ERROR => Err(Error::Ipc(format!(
            "process {owner_pid} failed to duplicate the descriptor of export {id}"
        ))),
        other => Err(Error::Ipc(format!(
            "process {owner_pid} sent unknown status {other} for export {id}"
        ))),
    }
}

fn ensure_server() -> Result<()> {
    let pid = std::process::id();
    let mut running = lock(&SERVER_PID);
    if *running == Some(pid) {
        return Ok(());
    }
    let name = socket_name(pid, process_nonce());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(|source| Error::Os {
        call: "socket address",
        source,
    })?;
    let listener = UnixListener::bind_addr(&addr).map_err(|source| Error::Os {
        call: "bind",
        source,
    })?;
    std::thread::Builder::new()
        .name("oxccl-fd-server".into())
        .spawn(move || serve(listener))
        .map_err(|source| Error::Os {
            call: "spawn descriptor server thread",
            source,
        })?;
    *running = Some(pid);
    tracing::debug!(socket = %name, "descriptor server started");
    Ok(())
}

fn serve(listener: UnixListener) {
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                // Accept errors (EMFILE, ECONNABORTED) concern one client; back off briefly
                // so a descriptor shortage does not turn into a busy loop.
                tracing::warn!(error = %e, "descriptor server: accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        // One short-lived thread per client, so a silent client cannot delay the others.
        // If no thread can be made, serve inline through a second handle on the same
        // connection: slower, but the client still gets its answer.
        let backup = stream.try_clone();
        let spawned = std::thread::Builder::new()
            .name("oxccl-fd-client".into())
            .spawn(move || answer(stream));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "descriptor server: cannot spawn a client thread");
            if let Ok(s) = backup {
                answer(s);
            }
        }
    }
}

fn answer(mut stream: UnixStream) {
    if let Err(e) = try_answer(&mut stream) {
        tracing::debug!(error = %e, "descriptor server: client dropped");
    }
}

fn try_answer(stream: &mut UnixStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(SERVER_CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(SERVER_CLIENT_TIMEOUT))?;
    let mut request = [0u8; REQUEST_LEN];
    if let Err(e) = stream.read_exact(&mut request) {
        // Best effort: tell a confused client why, then drop it.
        let _ = stream.write_all(&[STATUS_MALFORMED]);
        return Err(e);
    }
    let mut version = [0u8; 4];
    version.copy_from_slice(&request[4..8]);
    let mut id = [0u8; 8];
    id.copy_from_slice(&request[8..]);
    if &request[..4] != REQUEST_MAGIC || u32::from_le_bytes(version) != PROTOCOL_VERSION {
        return stream.write_all(&[STATUS_MALFORMED]);
    }
    let id = u64::from_le_bytes(id);
    let dup = lock(&TABLE).get(&id).map(OwnedFd::try_clone);
    let fd = match dup {
        None => return stream.write_all(&[STATUS_STALE]),
        Some(Err(_)) => return stream.write_all(&[STATUS_SERVER_ERROR]),
        Some(Ok(fd)) => fd,
    };
    let raw = [fd.as_raw_fd()];
    let iov = [IoSlice::new(&[STATUS_OK])];
    socket::sendmsg::<()>(
        stream.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&raw)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(std::io::Error::from)?;
    // `fd` (our dup) closes here; the client has its own copy now.
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Seek, SeekFrom};
    use std::process::{Command, Stdio};

    const CHILD_ENV: &str = "OXCCL_FD_SHARE_TEST_CHILD";
    const T: Duration = Duration::from_secs(10);

    fn memfd_with(data: &[u8]) -> std::fs::File {
        let fd =
            nix::sys::memfd::memfd_create("fd-share-test", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
                .unwrap();
        let mut f = std::fs::File::from(fd);
        f.write_all(data).unwrap();
        f
    }

    fn contents(fd: OwnedFd) -> Vec<u8> {
        let mut f = std::fs::File::from(fd);
        f.seek(SeekFrom::Start(0)).unwrap();
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        v
    }

    fn random_bytes(n: usize) -> Vec<u8> {
        // Non-zero pattern from the kernel's random source: ids and nonces must not matter.
        let mut v = vec![0u8; n];
        std::fs::File::open("/dev/urandom")
            .unwrap()
            .read_exact(&mut v)
            .unwrap();
        v.iter_mut().for_each(|b| *b |= 1);
        v
    }

    #[test]
    fn nonce_and_ids_are_stable_and_distinct() {
        assert_eq!(process_nonce(), process_nonce());
        assert_ne!(process_nonce(), 0);
        let a = next_export_id();
        let b = next_export_id();
        assert!(a >= 1 && b > a);
    }

    #[test]
    fn same_process_fetch_is_a_dup_and_withdraw_makes_it_stale() {
        let data = random_bytes(4096);
        let f = memfd_with(&data);
        let id = next_export_id();
        publish(id, std::os::fd::AsFd::as_fd(&f)).unwrap();
        let err = publish(id, std::os::fd::AsFd::as_fd(&f)).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        let got = fetch(std::process::id(), process_nonce(), id, T).unwrap();
        assert_ne!(got.as_raw_fd(), f.as_raw_fd());
        assert_eq!(contents(got), data);
        withdraw(id);
        let err = fetch(std::process::id(), process_nonce(), id, T).unwrap_err();
        assert!(matches!(err, Error::Ipc(_)), "{err}");
        assert!(
            err.to_string()
                .contains(&format!("stale handle: export {id}")),
            "{err}"
        );
    }

    #[test]
    fn socket_path_serves_stale_and_survives_bad_clients() {
        let data = random_bytes(333);
        let f = memfd_with(&data);
        let id = next_export_id();
        publish(id, std::os::fd::AsFd::as_fd(&f)).unwrap();
        let (pid, nonce) = (std::process::id(), process_nonce());
        let addr = SocketAddr::from_abstract_name(socket_name(pid, nonce).as_bytes()).unwrap();

        // A client that sends garbage gets a "malformed" status.
        let mut bad = UnixStream::connect_addr(&addr).unwrap();
        bad.write_all(b"GARBAGE-GARBAGE!").unwrap();
        let mut status = [9u8; 1];
        bad.set_read_timeout(Some(T)).unwrap();
        bad.read_exact(&mut status).unwrap();
        assert_eq!(status[0], STATUS_MALFORMED);
        // A client that sends half a request and hangs up, and one that says nothing.
        let mut half = UnixStream::connect_addr(&addr).unwrap();
        half.write_all(b"OXFD").unwrap();
        drop(half);
        let silent = UnixStream::connect_addr(&addr).unwrap();

        // The server still answers a well-formed request, while the silent client waits.
        let got = fetch_remote(pid, nonce, id, T).unwrap();
        assert_eq!(contents(got), data);
        drop(silent);
        withdraw(id);
        let err = fetch_remote(pid, nonce, id, T).unwrap_err();
        assert!(err.to_string().contains("stale handle"), "{err}");
        assert!(matches!(err, Error::Ipc(_)));
    }

    #[test]
    fn unknown_owner_is_peer_lost_and_zero_timeout_is_refused() {
        // A nonce nobody uses names a socket nobody listens on.
        let err = fetch(std::process::id(), process_nonce() ^ 0x5a5a, 1, T).unwrap_err();
        assert!(matches!(err, Error::PeerLost(_)), "{err}");
        assert!(
            err.to_string().contains(&std::process::id().to_string()),
            "{err}"
        );
        let err = fetch(1, 77, 1, Duration::ZERO).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    }

    /// Child role: publish a memfd holding the bytes given in the environment, print
    /// `pid nonce id`, withdraw on "w", exit on end of input.
    #[test]
    fn child_role() {
        let Ok(hex) = std::env::var(CHILD_ENV) else {
            return;
        };
        let data: Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        let f = memfd_with(&data);
        let id = next_export_id();
        publish(id, std::os::fd::AsFd::as_fd(&f)).unwrap();
        println!("FDCHILD {} {} {}", std::process::id(), process_nonce(), id);
        std::io::stdout().flush().unwrap();
        for line in std::io::stdin().lock().lines() {
            if line.unwrap().trim() == "w" {
                withdraw(id);
                println!("FDCHILD withdrawn");
                std::io::stdout().flush().unwrap();
            }
        }
    }

    #[test]
    fn cross_process_fetch_stale_and_dead_owner() {
        let data = random_bytes(8192);
        let hex: String = data.iter().map(|b| format!("{b:02x}")).collect();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "fd_share::tests::child_role",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, hex)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        // Read the child's lines on a thread so that every wait below is bounded.
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                // libtest prints the test name on the same line as the child's first output.
                if let Some(at) = line.find("FDCHILD ") {
                    if tx.send(line[at + "FDCHILD ".len()..].to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        let recv = |what: &str| {
            rx.recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("child did not report {what}"))
        };
        let line = recv("its export");
        let mut it = line.split_whitespace().map(|s| s.parse::<u64>().unwrap());
        let (pid, nonce, id) = (
            it.next().unwrap() as u32,
            it.next().unwrap(),
            it.next().unwrap(),
        );
        assert_eq!(pid, child.id());

        let got = fetch(pid, nonce, id, T).unwrap();
        assert_eq!(contents(got), data);
        let err = fetch(pid, nonce, id + 1000, T).unwrap_err();
        assert!(err.to_string().contains("stale handle"), "{err}");

        writeln!(stdin, "w").unwrap();
        assert_eq!(recv("the withdrawal"), "withdrawn");
        let err = fetch(pid, nonce, id, T).unwrap_err();
        assert!(matches!(err, Error::Ipc(_)), "{err}");
        assert!(
            err.to_string()
                .contains(&format!("export {id} of process {pid}")),
            "{err}"
        );

        drop(stdin);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("child did not exit");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let err = fetch(pid, nonce, id, T).unwrap_err();
        assert!(matches!(err, Error::PeerLost(_)), "{err}");
        assert!(err.to_string().contains(&format!("process {pid}")), "{err}");
    }
}
