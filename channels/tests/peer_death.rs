//! A TCP peer process killed (SIGKILL) in the middle of a stream of writes: the surviving
//! rank gets `PeerLost` from its next write or flush, in bounded time.
//!
//! The test binary re-executes itself; `child_entry` plays rank 1 when `ROLE_VAR` is set.

// The whole file is test code: its helpers fail the test by unwrapping, like the tests do.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_backend::{AnyDevice, AnyMemory};
use oxccl_channels::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_channels::connection::{Connection, Transport, TransportSet};
use oxccl_channels::registered_memory::{exchange, RegisteredMemory};
use oxccl_hal::atomics::HostFlag;
use oxccl_hal::{BackendKind, Device, DeviceId, Error, HostVisible, MemoryKind};

const ROLE_VAR: &str = "OXCCL_TEST_PEER_DEATH_ID";
const WAIT: Duration = Duration::from_secs(30);
const LEN: usize = 1 << 20;

fn config() -> BootstrapConfig {
    BootstrapConfig { timeout: WAIT }
}

fn host(mem: &AnyMemory) -> &oxccl_hal::host::HostMemory {
    match mem {
        AnyMemory::Host(h) => h,
        #[allow(unreachable_patterns)]
        _ => panic!("host backend memory expected"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Rank `rank` of the two: bootstrap, a registered buffer, the exchange, a TCP connection.
fn join(
    id: &UniqueId,
    rank: u32,
) -> (
    Bootstrap,
    Arc<AnyMemory>,
    RegisteredMemory,
    Vec<oxccl_channels::registered_memory::RemoteMemory>,
    Connection,
) {
    let b = Bootstrap::new(id, rank, 2, &config()).unwrap();
    let d = AnyDevice::open_with(BackendKind::Host, DeviceId(0)).unwrap();
    let mem = Arc::new(d.alloc(LEN, MemoryKind::Physical).unwrap());
    let reg = RegisteredMemory::new(
        &d,
        rank,
        Arc::clone(&mem),
        TransportSet::of(&[Transport::Tcp]),
    )
    .unwrap();
    let remotes = exchange(&b, &d, &reg).unwrap();
    let conn = Connection::connect(&b, &d, 1 - rank, Transport::Tcp, 1).unwrap();
    (b, mem, reg, remotes, conn)
}

/// Rank 1 in a child process: take the first signal, tell the parent, then wait to be
/// killed (bounded, so an orphan never outlives the test by much).
#[test]
fn child_entry() {
    let Ok(id) = std::env::var(ROLE_VAR) else {
        return; // not a child: nothing to do
    };
    let id = UniqueId::from_bytes(&unhex(&id)).unwrap();
    let (b, mem, _reg, _remotes, _conn) = join(&id, 1);
    let h = host(&mem);
    HostFlag::new(h, 0).unwrap().wait_at_least(1, WAIT).unwrap();
    b.send(0, 2, b"streaming").unwrap();
    std::thread::sleep(WAIT);
}

#[test]
fn tcp_peer_killed_mid_transfer_is_peer_lost() {
    let id = UniqueId::create_on(IpAddr::V4(Ipv4Addr::LOCALHOST), &config()).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(ROLE_VAR, hex(&id.to_bytes()))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (b, mem, reg, remotes, conn) = join(&id, 0);
    let h = host(&mem);
    // SAFETY: the whole live allocation; no transfer reads it yet.
    unsafe { std::ptr::write_bytes(h.host_ptr(), 0xa7, LEN) };
    conn.update_and_sync(&remotes[1], 0, 1).unwrap();
    assert_eq!(b.recv(1, 2).unwrap(), b"streaming");
    let start = Instant::now();
    let mut killed = false;
    let mut writes = 0u32;
    let err = loop {
        assert!(
            start.elapsed() < WAIT,
            "no error {WAIT:?} after killing the peer"
        );
        if writes == 8 && !killed {
            child.kill().unwrap(); // SIGKILL, in the middle of the stream
            killed = true;
        }
        let step = conn
            .write(&remotes[1], 4096, &reg, 0, LEN - 4096)
            .and_then(|()| conn.flush(WAIT));
        writes += 1;
        if let Err(e) = step {
            break e;
        }
    };
    eprintln!("after {writes} writes (peer killed after 8): {err}");
    let status = child.wait().unwrap();
    assert!(killed, "failed before the peer was killed: {err}");
    assert!(
        matches!(err.root(), Error::PeerLost(_)),
        "expected PeerLost, got {err}"
    );
    assert!(err.to_string().contains("rank 1"), "{err}");
    assert!(!status.success());
}
