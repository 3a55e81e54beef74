//! The bootstrap across real processes on loopback: ranks that arrive in random order, a
//! rank that exits mid-run, and a rank that never arrives. The parent owns the unique id
//! (so the rendezvous root runs in the parent); each rank is a re-executed child.

// The whole file is test code: its helpers fail the test by unwrapping, like the tests do.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use oxccl_collectives::channels::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_tests::{from_hex, pattern, say, to_hex, Child, CHILD_TIMEOUT};

const ROLE_VAR: &str = "OXCCL_BOOTSTRAP_ROLE";
const ID_VAR: &str = "OXCCL_BOOTSTRAP_ID";
const RANK_VAR: &str = "OXCCL_BOOTSTRAP_RANK";
const WORLD_VAR: &str = "OXCCL_BOOTSTRAP_WORLD";
const TIMEOUT_VAR: &str = "OXCCL_BOOTSTRAP_TEST_TIMEOUT";

fn env_u32(name: &str) -> u32 {
    std::env::var(name).unwrap().parse().unwrap()
}

/// Bytes rank `r` contributes: length and content depend on the rank.
fn contribution(r: u32) -> Vec<u8> {
    pattern(77, u64::from(r), 100 + 37 * r as usize)
}

#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return;
    };
    let id = UniqueId::from_bytes(&from_hex(&std::env::var(ID_VAR).unwrap()).unwrap()).unwrap();
    let (rank, world) = (env_u32(RANK_VAR), env_u32(WORLD_VAR));
    let config = BootstrapConfig {
        timeout: Duration::from_secs_f64(std::env::var(TIMEOUT_VAR).unwrap().parse().unwrap()),
    };
    let b = match Bootstrap::new(&id, rank, world, &config) {
        Ok(b) => b,
        Err(e) => {
            say(&format!("ERR {e}"));
            return;
        }
    };
    let all = b.all_gather(&contribution(rank)).unwrap();
    for (r, got) in all.iter().enumerate() {
        assert_eq!(
            got,
            &contribution(r as u32),
            "rank {rank}: wrong piece from rank {r}"
        );
    }
    let next = (rank + 1) % world;
    let prev = (rank + world - 1) % world;
    b.send(next, 5, &to_hex(&contribution(rank)).into_bytes())
        .unwrap();
    let got = b.recv(prev, 5).unwrap();
    assert_eq!(
        from_hex(std::str::from_utf8(&got).unwrap()).unwrap(),
        contribution(prev)
    );
    b.barrier().unwrap();
    if role == "dies" && rank == world - 1 {
        say("EXITING");
        std::process::exit(0);
    }
    if role == "dies" {
        let t0 = Instant::now();
        let err = b.all_gather(b"after the death").unwrap_err();
        say(&format!("LOST {:.1}s {err}", t0.elapsed().as_secs_f64()));
        // Stay until the parent has read every survivor's report.
        std::thread::sleep(Duration::from_secs(2));
        return;
    }
    say("OK");
}

fn spawn_rank(role: &str, id: &UniqueId, rank: u32, world: u32, timeout_s: f64) -> Child {
    Child::spawn_test(
        &format!("rank {rank}"),
        "child_entry",
        &[
            (ROLE_VAR, role.to_string()),
            (ID_VAR, to_hex(&id.to_bytes())),
            (RANK_VAR, rank.to_string()),
            (WORLD_VAR, world.to_string()),
            (TIMEOUT_VAR, timeout_s.to_string()),
        ],
    )
    .unwrap()
}

fn loopback_id(timeout_s: f64) -> UniqueId {
    let config = BootstrapConfig {
        timeout: Duration::from_secs_f64(timeout_s),
    };
    UniqueId::create_on(IpAddr::V4(Ipv4Addr::LOCALHOST), &config).unwrap()
}

#[test]
fn processes_arriving_in_random_order_exchange_data() {
    let world = 4;
    let id = loopback_id(30.0);
    // A shuffled arrival order with uneven gaps, different on every run.
    let mut order: Vec<u32> = (0..world).collect();
    let mut x = u64::from(std::process::id()) | 1;
    for i in (1..order.len()).rev() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        order.swap(i, (x >> 33) as usize % (i + 1));
    }
    let mut children = Vec::new();
    for rank in order {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        std::thread::sleep(Duration::from_millis((x >> 40) % 150));
        children.push(spawn_rank("ok", &id, rank, world, 30.0));
    }
    for c in &children {
        assert_eq!(c.recv(CHILD_TIMEOUT).unwrap(), "OK");
    }
    for c in &mut children {
        assert!(c.wait(CHILD_TIMEOUT).unwrap().success());
    }
}

#[test]
fn a_process_that_exits_is_reported_by_the_others() {
    let world = 3;
    let id = loopback_id(60.0);
    let mut children: Vec<Child> = (0..world)
        .map(|r| spawn_rank("dies", &id, r, world, 60.0))
        .collect();
    assert_eq!(children[2].recv(CHILD_TIMEOUT).unwrap(), "EXITING");
    for c in &children[..2] {
        let report = c.recv(CHILD_TIMEOUT).unwrap();
        assert!(report.starts_with("LOST "), "{report}");
        assert!(
            report.contains("rank 2") && report.contains("peer lost"),
            "{report}"
        );
        let secs: f64 = report[5..].split('s').next().unwrap().parse().unwrap();
        assert!(
            secs < 10.0,
            "the death must be noticed, not timed out: {report}"
        );
    }
    for c in &mut children {
        c.wait(CHILD_TIMEOUT).unwrap();
    }
}

#[test]
fn a_process_that_never_arrives_is_named() {
    let world = 3;
    let id = loopback_id(2.0);
    let mut children: Vec<Child> = [0, 1]
        .into_iter()
        .map(|r| spawn_rank("ok", &id, r, world, 2.0))
        .collect();
    for c in &children {
        let report = c.recv(CHILD_TIMEOUT).unwrap();
        assert!(
            report.starts_with("ERR ") && report.contains("[2]"),
            "{report}"
        );
    }
    for c in &mut children {
        c.wait(CHILD_TIMEOUT).unwrap();
    }
}
