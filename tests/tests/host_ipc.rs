//! Multi-process IPC on the host backend: export, import, signal through flags in peer
//! memory, survive the exporter, and reject stale, dead and foreign handles.
//!
//! The test binary re-executes itself; `child_entry` plays the role named by `ROLE_VAR`.

// The whole file is test code: its helpers fail the test by unwrapping, like the tests do.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use oxccl_hal::atomics::HostFlag;
use oxccl_hal::host::{HostBackend, HostDevice};
use oxccl_hal::{
    Backend, BackendKind, DataType, Device, DeviceId, Error, IpcHandle, Memory, MemoryKind,
    ReduceOp, Stream,
};
use oxccl_tests::{from_hex, next_command, pattern, say, to_hex, Child, CHILD_TIMEOUT};

const ROLE_VAR: &str = "OXCCL_HOST_IPC_ROLE";
const RANK_VAR: &str = "OXCCL_HOST_IPC_RANK";
const WORLD_VAR: &str = "OXCCL_HOST_IPC_WORLD";
const SEED_VAR: &str = "OXCCL_HOST_IPC_SEED";
const MC_VAR: &str = "OXCCL_HOST_IPC_MC";

/// Peer buffer layout: a signal flag, then one slot per rank.
const SLOTS_AT: usize = 64;
const SLOT: usize = 3000;
const SIGNAL_TIMEOUT: Duration = Duration::from_secs(30);
const MC_COUNT: usize = 2048;

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} not set"))
}

fn env_u64(name: &str) -> Result<u64, String> {
    env(name)?.parse().map_err(|e| format!("{name}: {e}"))
}

fn device(rank: u64) -> Result<HostDevice, String> {
    let count = HostBackend::device_count().map_err(|e| e.to_string())?;
    HostBackend::open_device(DeviceId((rank % u64::from(count)) as u32)).map_err(|e| e.to_string())
}

fn handle_from_hex(s: &str) -> Result<IpcHandle, String> {
    IpcHandle::from_bytes(&from_hex(s)?).map_err(|e| e.to_string())
}

/// Stream id of the bytes rank `src` writes into rank `dst`'s buffer.
fn slot_stream(src: u64, dst: u64) -> u64 {
    src * 1000 + dst
}

/// Small integers, so sums are exact in any order.
fn mc_input(seed: u64, rank: u64) -> Vec<f32> {
    pattern(seed, 500 + rank, MC_COUNT)
        .iter()
        .map(|b| f32::from(b % 9) - 4.0)
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Entry point of every child process; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return;
    };
    let outcome = match role.as_str() {
        "rank" => rank_role(),
        "owner" => owner_role(),
        "mc_member" => mc_member_role(),
        other => Err(format!("unknown role {other}")),
    };
    if let Err(why) = outcome {
        say(&format!("FAIL {why}"));
        std::process::exit(1);
    }
}

fn rank_role() -> Result<(), String> {
    let rank = env_u64(RANK_VAR)?;
    let world = env_u64(WORLD_VAR)?;
    let seed = env_u64(SEED_VAR)?;
    let e = |e: Error| e.to_string();
    let dev = device(rank)?;
    let buf = dev
        .alloc(SLOTS_AT + SLOT * world as usize, MemoryKind::Coherent)
        .map_err(e)?;
    let handle = dev.export_memory(&buf).map_err(e)?;
    say(&format!("HANDLE {}", to_hex(&handle.to_bytes())));

    let cmd = next_command().ok_or("parent closed stdin before PEERS")?;
    let list = cmd
        .strip_prefix("PEERS ")
        .ok_or(format!("expected PEERS, got {cmd}"))?;
    let handles = list
        .split_whitespace()
        .map(handle_from_hex)
        .collect::<Result<Vec<_>, _>>()?;
    if handles.len() as u64 != world {
        return Err(format!("{} handles for {world} ranks", handles.len()));
    }
    let mut peers = Vec::new();
    for (p, h) in handles.iter().enumerate() {
        if p as u64 == rank {
            continue;
        }
        let imp = dev.import_memory(h).map_err(e)?;
        let again = dev.import_memory(h).map_err(e)?;
        if again.ptr() != imp.ptr() || imp.len() != buf.len() {
            return Err(format!("second import of rank {p} differs"));
        }
        peers.push((p as u64, imp));
    }
    if dev.ipc_cache_live() != peers.len() {
        return Err(format!(
            "{} live imports for {} peers",
            dev.ipc_cache_live(),
            peers.len()
        ));
    }

    let stream = dev.create_stream().map_err(e)?;
    for (p, imp) in &peers {
        let at = imp
            .ptr()
            .offset(SLOTS_AT + SLOT * rank as usize)
            .map_err(e)?;
        stream
            .write(at, &pattern(seed, slot_stream(rank, *p), SLOT))
            .map_err(e)?;
        // `write` has returned, so the data is in place before the signal is released.
        HostFlag::new(imp, 0).map_err(e)?.fetch_add_release(1);
    }
    let flag = HostFlag::new(&buf, 0)
        .map_err(e)?
        .with_name(format!("rank {rank}'s arrival counter"));
    flag.wait_at_least(world - 1, SIGNAL_TIMEOUT).map_err(e)?;

    let mut mine = vec![0u8; buf.len()];
    stream.read(buf.ptr(), &mut mine).map_err(e)?;
    for q in 0..world {
        let got = &mine[SLOTS_AT + SLOT * q as usize..SLOTS_AT + SLOT * (q as usize + 1)];
        let ok = if q == rank {
            got.iter().all(|&b| b == 0)
        } else {
            got == pattern(seed, slot_stream(q, rank), SLOT).as_slice()
        };
        if !ok {
            return Err(format!("rank {rank}: slot written by rank {q} is wrong"));
        }
    }
    if flag.load_acquire() != world - 1 {
        return Err(format!("flag is {} after all signals", flag.load_acquire()));
    }
    say("OK");
    // Keep our memory exported until the parent says everyone is done.
    while let Some(cmd) = next_command() {
        if cmd == "EXIT" {
            break;
        }
    }
    Ok(())
}

fn owner_role() -> Result<(), String> {
    let seed = env_u64(SEED_VAR)?;
    let e = |e: Error| e.to_string();
    let dev = device(0)?;
    let stream = dev.create_stream().map_err(e)?;
    let a = dev.alloc(10_000, MemoryKind::Physical).map_err(e)?;
    stream
        .write(a.ptr(), &pattern(seed, 1, 10_000))
        .map_err(e)?;
    let mut b = Some(dev.alloc(500, MemoryKind::Plain).map_err(e)?);
    let hb = match &b {
        Some(b) => dev.export_memory(b).map_err(e)?,
        None => return Err("unreachable".into()),
    };
    let ha = dev.export_memory(&a).map_err(e)?;
    say(&format!(
        "HANDLES {} {}",
        to_hex(&ha.to_bytes()),
        to_hex(&hb.to_bytes())
    ));
    while let Some(cmd) = next_command() {
        match cmd.as_str() {
            "FREE_B" => {
                b.take();
                say("FREED");
            }
            "EXIT" => break,
            other => return Err(format!("unknown command {other}")),
        }
    }
    Ok(())
}

fn mc_member_role() -> Result<(), String> {
    let rank = env_u64(RANK_VAR)?;
    let world = env_u64(WORLD_VAR)?;
    let seed = env_u64(SEED_VAR)?;
    let e = |e: Error| e.to_string();
    let dev = device(rank)?;
    let mc = dev
        .import_multicast(&handle_from_hex(&env(MC_VAR)?)?)
        .map_err(e)?;
    oxccl_hal::Multicast::add_device(&mc, dev.id()).map_err(e)?;
    let mem = dev.alloc(MC_COUNT * 4, MemoryKind::Physical).map_err(e)?;
    let stream = dev.create_stream().map_err(e)?;
    stream
        .write(mem.ptr(), &f32_bytes(&mc_input(seed, rank)))
        .map_err(e)?;
    oxccl_hal::Multicast::bind(&mc, &mem, 0).map_err(e)?;
    say("BOUND");
    match next_command().as_deref() {
        Some("GO") => {}
        other => return Err(format!("expected GO, got {other:?}")),
    }
    if mc.bound_members() as u64 != world {
        return Err(format!("{} of {world} members bound", mc.bound_members()));
    }
    let mut out = vec![0u8; MC_COUNT * 4];
    mc.reduce(0, MC_COUNT, DataType::F32, ReduceOp::Sum, &mut out)
        .map_err(e)?;
    let inputs: Vec<Vec<f32>> = (0..world).map(|r| mc_input(seed, r)).collect();
    for i in 0..MC_COUNT {
        let want: f32 = inputs.iter().map(|v| v[i]).sum();
        let got = f32::from_le_bytes([out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]]);
        if got != want {
            return Err(format!(
                "rank {rank}: element {i} is {got}, expected {want}"
            ));
        }
    }
    say("OK");
    while let Some(cmd) = next_command() {
        if cmd == "EXIT" {
            break;
        }
    }
    Ok(())
}

fn spawn(name: &str, role: &str, vars: &[(&str, String)]) -> Child {
    let mut env = vec![(ROLE_VAR, role.to_string())];
    env.extend(vars.iter().cloned());
    Child::spawn_test(name, "child_entry", &env).unwrap()
}

fn finish(mut children: Vec<Child>) {
    for c in &mut children {
        c.send("EXIT").unwrap();
    }
    for c in &mut children {
        let status = c.wait(CHILD_TIMEOUT).unwrap();
        assert!(status.success(), "child exited with {status}");
    }
}

#[test]
fn ranks_exchange_data_and_signals_through_imported_memory() {
    let world = 4u64;
    let seed: u64 = rand::random();
    let mut children: Vec<Child> = (0..world)
        .map(|r| {
            spawn(
                &format!("rank {r}"),
                "rank",
                &[
                    (RANK_VAR, r.to_string()),
                    (WORLD_VAR, world.to_string()),
                    (SEED_VAR, seed.to_string()),
                ],
            )
        })
        .collect();
    let handles: Vec<String> = children
        .iter()
        .map(|c| c.expect("HANDLE").unwrap())
        .collect();
    for (r, h) in handles.iter().enumerate() {
        let parsed = IpcHandle::from_bytes(&from_hex(h).unwrap()).unwrap();
        assert_eq!(parsed.owner_pid, children[r].pid());
        assert_eq!(parsed.backend, BackendKind::Host);
    }
    let peers = format!("PEERS {}", handles.join(" "));
    for c in &mut children {
        c.send(&peers).unwrap();
    }
    for c in &children {
        assert_eq!(c.recv(CHILD_TIMEOUT).unwrap(), "OK");
    }
    finish(children);
}

#[test]
fn imported_memory_outlives_its_exporter_and_bad_handles_fail() {
    let seed: u64 = rand::random();
    let mut owner = spawn("owner", "owner", &[(SEED_VAR, seed.to_string())]);
    let line = owner.expect("HANDLES").unwrap();
    let mut parts = line.split_whitespace();
    let ha = handle_from_hex(parts.next().unwrap()).unwrap();
    let hb = handle_from_hex(parts.next().unwrap()).unwrap();
    let pid = owner.pid();
    assert_eq!((ha.owner_pid, hb.owner_pid), (pid, pid));

    let dev = HostBackend::open_device(DeviceId(0)).unwrap();
    let a1 = dev.import_memory(&ha).unwrap();
    let a2 = dev.import_memory(&ha).unwrap();
    assert_eq!(a1.ptr(), a2.ptr());
    assert_eq!(a1.len(), 10_000);
    assert_eq!(dev.ipc_cache_live(), 1, "one open for two imports");

    // Stale: the exporter freed the allocation.
    owner.send("FREE_B").unwrap();
    assert_eq!(owner.recv(CHILD_TIMEOUT).unwrap(), "FREED");
    let err = dev.import_memory(&hb).unwrap_err();
    assert!(matches!(err.root(), Error::Ipc(_)), "{err}");
    assert!(err.to_string().contains("stale handle"), "{err}");
    // Stale: an export id the owner never made.
    let mut never = ha.clone();
    never.id += 1_000_000;
    let err = dev.import_memory(&never).unwrap_err();
    assert!(matches!(err.root(), Error::Ipc(_)), "{err}");
    // Foreign and garbage handles.
    let mut foreign = ha.clone();
    foreign.backend = BackendKind::Rocm;
    let err = dev.import_memory(&foreign).unwrap_err();
    assert!(matches!(err.root(), Error::Ipc(_)), "{err}");
    let mut garbage = rand::random::<[u8; 64]>().to_vec();
    garbage[0] ^= 0xff; // never the handle magic's first byte
    assert!(matches!(
        IpcHandle::from_bytes(&garbage),
        Err(Error::Ipc(_))
    ));
    let mut truncated = ha.to_bytes();
    truncated.truncate(truncated.len() - 3);
    assert!(IpcHandle::from_bytes(&truncated).is_err());
    assert_eq!(dev.ipc_cache_live(), 1, "failed imports leave nothing open");

    // The exporter exits; the mapping we hold keeps the memory.
    owner.send("EXIT").unwrap();
    let status = owner.wait(CHILD_TIMEOUT).unwrap();
    assert!(status.success(), "owner exited with {status}");
    let stream = dev.create_stream().unwrap();
    let mut got = vec![0u8; 10_000];
    stream.read(a1.ptr(), &mut got).unwrap();
    assert_eq!(got, pattern(seed, 1, 10_000));
    let flag = HostFlag::new(&a2, 16).unwrap();
    let before = flag.load_acquire();
    assert_eq!(flag.fetch_add_release(3), before);
    stream.read(a1.ptr(), &mut got).unwrap();
    assert_eq!(got[16..24], before.wrapping_add(3).to_le_bytes());

    // A device that never imported it cannot reach the dead owner...
    let other = HostBackend::open_device(DeviceId(1)).unwrap();
    let err = other.import_memory(&ha).unwrap_err();
    assert!(matches!(err.root(), Error::PeerLost(_)), "{err}");
    assert!(err.to_string().contains(&pid.to_string()), "{err}");
    assert_eq!(other.ipc_cache_live(), 0);
    // ...while the cache that holds it still hands out the live mapping.
    let a3 = dev.import_memory(&ha).unwrap();
    assert_eq!(a3.ptr(), a1.ptr());
    drop((a1, a2, a3));
    assert_eq!(dev.ipc_cache_live(), 0);
}

#[test]
fn multicast_members_in_separate_processes_reduce() {
    let world = 3u64;
    let seed: u64 = rand::random();
    let dev = HostBackend::open_device(DeviceId(0)).unwrap();
    let mc = dev.create_multicast(MC_COUNT * 4, world as u32).unwrap();
    let handle = dev.export_multicast(&mc).unwrap();
    let hex = to_hex(&handle.to_bytes());
    let mut children: Vec<Child> = (0..world)
        .map(|r| {
            spawn(
                &format!("member {r}"),
                "mc_member",
                &[
                    (RANK_VAR, r.to_string()),
                    (WORLD_VAR, world.to_string()),
                    (SEED_VAR, seed.to_string()),
                    (MC_VAR, hex.clone()),
                ],
            )
        })
        .collect();
    for c in &children {
        assert_eq!(c.recv(CHILD_TIMEOUT).unwrap(), "BOUND");
    }
    assert_eq!(mc.bound_members() as u64, world);
    for c in &mut children {
        c.send("GO").unwrap();
    }
    for c in &children {
        assert_eq!(c.recv(CHILD_TIMEOUT).unwrap(), "OK");
    }
    // The creator, which bound nothing, sees the members' data too.
    let mut out = vec![0u8; MC_COUNT * 4];
    mc.reduce(0, MC_COUNT, DataType::F32, ReduceOp::Max, &mut out)
        .unwrap();
    for i in (0..MC_COUNT).step_by(97) {
        let want = (0..world)
            .map(|r| mc_input(seed, r)[i])
            .fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(out[4 * i..4 * i + 4], want.to_le_bytes(), "element {i}");
    }
    finish(children);
}
