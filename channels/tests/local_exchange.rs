//! The node-local exchange with threads as ranks (each maps the region through the same
//! descriptor passing that separate processes use): records of every length, the slots'
//! reuse while ranks run ahead or lag, the bootstrap path for records too large, and the
//! ends of a wait (a peer that never comes, an abort, a peer that leaves).

// The whole file is test code: its helpers fail the test by unwrapping, like the tests do.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use oxccl_channels::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_channels::local_exchange::{LocalExchange, MAX_LOCAL_RECORD};
use oxccl_hal::Error;

fn config(secs: u64) -> BootstrapConfig {
    BootstrapConfig {
        timeout: Duration::from_secs(secs),
    }
}

/// Runs `f(bootstrap, exchange)` on `world` threads, one rank each.
fn with_ranks<T: Send + 'static>(
    world: u32,
    secs: u64,
    f: impl Fn(Bootstrap, LocalExchange) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let cfg = config(secs);
    let id = UniqueId::create_on(IpAddr::V4(Ipv4Addr::LOCALHOST), &cfg).unwrap();
    let f = Arc::new(f);
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let (cfg, f) = (cfg.clone(), Arc::clone(&f));
            thread::spawn(move || {
                let b = Bootstrap::new(&id, rank, world, &cfg).unwrap();
                let x = LocalExchange::new(&b)
                    .unwrap()
                    .expect("threads of one process can always share the region");
                f(b, x)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Rank `rank`'s record of exchange `k`: a length that sweeps 0..=MAX_LOCAL_RECORD + 1
/// (the last goes through the bootstrap), bytes that name rank and exchange.
fn record(rank: u32, k: u64) -> Vec<u8> {
    let len = ((k * 7919 + u64::from(rank) * 104_729) % (MAX_LOCAL_RECORD as u64 + 2)) as usize;
    (0..len)
        .map(|i| (i as u64 ^ k.wrapping_mul(31) ^ u64::from(rank) << 5) as u8)
        .collect()
}

#[test]
fn every_record_arrives_while_ranks_run_ahead_and_lag() {
    const ROUNDS: u64 = 600;
    let world = 3;
    let checked = with_ranks(world, 30, move |b, x| {
        let rank = b.rank();
        let mut checked = 0u64;
        for k in 0..ROUNDS {
            // Uneven pacing: each rank sleeps on different rounds, so the others run
            // ahead into the other slot and wait on the one that lags.
            if (k + u64::from(rank) * 5) % 41 == 0 {
                thread::sleep(Duration::from_micros(300 * u64::from(rank + 1)));
            }
            let all = x
                .all_gather(&b, &record(rank, k), Duration::from_secs(30))
                .unwrap();
            for (r, got) in all.iter().enumerate() {
                assert_eq!(
                    got,
                    &record(r as u32, k),
                    "rank {rank}, exchange {k}, from rank {r}"
                );
                checked += 1;
            }
            // The bootstrap's own exchanges interleave with the local ones.
            if k % 97 == 0 {
                let all = b.all_gather(&k.to_le_bytes()).unwrap();
                assert!(all.iter().all(|v| v.as_slice() == k.to_le_bytes()));
            }
        }
        checked
    });
    assert_eq!(checked, vec![ROUNDS * u64::from(world); world as usize]);
}

#[test]
fn a_peer_that_never_comes_is_a_timeout_naming_it() {
    let done = Arc::new(Barrier::new(2));
    let results = with_ranks(2, 30, move |b, x| {
        if b.rank() == 1 {
            // Rank 1 skips the exchange; it stays connected until rank 0 is done.
            done.wait();
            return None;
        }
        let t0 = Instant::now();
        let err = x
            .all_gather(&b, b"hello", Duration::from_millis(300))
            .unwrap_err();
        let took = t0.elapsed();
        done.wait();
        Some((err, took))
    });
    let (err, took) = results[0].as_ref().unwrap();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("rank 1"), "{err}");
    assert!(
        *took >= Duration::from_millis(300) && *took < Duration::from_secs(5),
        "{took:?}"
    );
}

#[test]
fn abort_ends_a_wait_at_once() {
    let done = Arc::new(Barrier::new(2));
    let results = with_ranks(2, 30, move |b, x| {
        let b = Arc::new(b);
        if b.rank() == 1 {
            done.wait();
            return None;
        }
        let go = Arc::new(Barrier::new(2));
        let aborter = {
            let (b, go) = (Arc::clone(&b), Arc::clone(&go));
            thread::spawn(move || {
                go.wait();
                thread::sleep(Duration::from_millis(200));
                b.abort("test abort");
            })
        };
        go.wait();
        let t0 = Instant::now();
        let err = x
            .all_gather(&b, b"hello", Duration::from_secs(20))
            .unwrap_err();
        let took = t0.elapsed();
        aborter.join().unwrap();
        done.wait();
        Some((err, took))
    });
    let (err, took) = results[0].as_ref().unwrap();
    assert!(matches!(err, Error::Aborted(_)), "{err}");
    assert!(err.to_string().contains("test abort"), "{err}");
    assert!(*took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn a_peer_that_leaves_is_reported_lost() {
    let results = with_ranks(2, 30, |b, x| {
        if b.rank() == 1 {
            drop(x);
            drop(b); // closes its connections, as a process that exits does
            return None;
        }
        let t0 = Instant::now();
        let err = x
            .all_gather(&b, b"hello", Duration::from_secs(20))
            .unwrap_err();
        Some((err, t0.elapsed()))
    });
    let (err, took) = results[0].as_ref().unwrap();
    assert!(matches!(err, Error::PeerLost(_)), "{err}");
    assert!(err.to_string().contains("rank 1"), "{err}");
    assert!(*took < Duration::from_secs(5), "{took:?}");
}
