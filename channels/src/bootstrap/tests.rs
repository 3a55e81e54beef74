//! Bootstrap tests with threads as ranks, on loopback only.

use std::net::{IpAddr, Ipv4Addr};
use std::thread;
use std::time::{Duration, Instant};

use super::*;

fn config(secs: f64) -> BootstrapConfig {
    BootstrapConfig {
        timeout: Duration::from_secs_f64(secs),
    }
}

fn loopback_id(cfg: &BootstrapConfig) -> UniqueId {
    UniqueId::create_on(IpAddr::V4(Ipv4Addr::LOCALHOST), cfg).unwrap()
}

/// Runs `f` on `world` threads, each joining the job after a per-rank delay.
fn with_ranks<T: Send + 'static>(
    world: u32,
    cfg: BootstrapConfig,
    delays_ms: Vec<u64>,
    f: impl Fn(Result<Bootstrap>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let id = loopback_id(&cfg);
    let f = Arc::new(f);
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let (cfg, f, delay) = (cfg.clone(), Arc::clone(&f), delays_ms[rank as usize]);
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(delay));
                f(Bootstrap::new(&id, rank, world, &cfg))
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn all_gather_send_recv_and_barrier_under_random_arrival() {
    for trial in 0..4u64 {
        let world = 5;
        // A fixed pseudo-random arrival order per trial.
        let delays: Vec<u64> = (0..world)
            .map(|r| (r as u64 * 37 + trial * 53) % 120)
            .collect();
        let results = with_ranks(world, config(20.0), delays, move |b| {
            let b = b.unwrap();
            let rank = b.rank();
            let mine: Vec<u8> = (0..(rank as usize + 3))
                .map(|i| (i as u8) ^ (rank as u8 + 0x5a))
                .collect();
            let all = b.all_gather(&mine).unwrap();
            for (r, got) in all.iter().enumerate() {
                let want: Vec<u8> = (0..(r + 3)).map(|i| (i as u8) ^ (r as u8 + 0x5a)).collect();
                assert_eq!(got, &want, "rank {rank} got a wrong piece from rank {r}");
            }
            // A ring of tagged messages, two tags interleaved out of order.
            let next = (rank + 1) % world;
            let prev = (rank + world - 1) % world;
            b.send(next, 7, &[rank as u8; 3]).unwrap();
            b.send(next, 9, &[rank as u8 + 100]).unwrap();
            assert_eq!(b.recv(prev, 9).unwrap(), vec![prev as u8 + 100]);
            assert_eq!(b.recv(prev, 7).unwrap(), vec![prev as u8; 3]);
            b.barrier().unwrap();
            rank
        });
        assert_eq!(results, (0..world).collect::<Vec<_>>());
    }
}

#[test]
fn a_rank_that_never_arrives_is_named() {
    let cfg = config(1.5);
    let id = loopback_id(&cfg);
    // Ranks 0, 1, 3 of 4 come; rank 2 never does.
    let handles: Vec<_> = [0u32, 1, 3]
        .into_iter()
        .map(|rank| {
            let cfg = cfg.clone();
            thread::spawn(move || Bootstrap::new(&id, rank, 4, &cfg).map(|_| ()))
        })
        .collect();
    let t0 = Instant::now();
    for h in handles {
        let err = h.join().unwrap().unwrap_err().to_string();
        assert!(err.contains("[2]"), "the error should name rank 2: {err}");
    }
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "timeouts must bound the wait"
    );
}

#[test]
fn a_rank_that_dies_is_reported_not_waited_for() {
    // The survivors keep their own bootstraps alive until both have seen the failure, so
    // each error is about rank 2 and not about a survivor that already gave up.
    let survivors = Arc::new(std::sync::Barrier::new(2));
    let results = with_ranks(3, config(30.0), vec![0, 0, 0], move |b| {
        let b = b.unwrap();
        b.barrier().unwrap();
        if b.rank() == 2 {
            drop(b); // dies: its sockets close
            return None;
        }
        let t0 = Instant::now();
        let err = b.all_gather(&[1, 2, 3]).unwrap_err();
        let waited = t0.elapsed();
        survivors.wait();
        Some((err.to_string(), waited))
    });
    for (err, waited) in results.into_iter().flatten() {
        assert!(err.contains("rank 2") && err.contains("peer lost"), "{err}");
        assert!(
            waited < Duration::from_secs(10),
            "a dead peer must not cost the whole timeout"
        );
    }
}

#[test]
fn mismatched_collectives_are_reported() {
    let results = with_ranks(2, config(5.0), vec![0, 0], |b| {
        let b = b.unwrap();
        if b.rank() == 0 {
            b.barrier().map(|_| ()).map_err(|e| e.to_string())
        } else {
            b.all_gather(&[42]).map(|_| ()).map_err(|e| e.to_string())
        }
    });
    for r in results {
        let err = r.unwrap_err();
        assert!(err.contains("mismatched collectives"), "{err}");
    }
}

#[test]
fn wrong_job_world_and_rank_are_refused() {
    let cfg = config(2.0);
    assert!(Bootstrap::new(&loopback_id(&cfg), 3, 3, &cfg).is_err());
    // A rank with a nonce of another job is refused by the root, not admitted.
    let id = loopback_id(&cfg);
    let stranger = UniqueId {
        nonce: id.nonce ^ 1,
        ..id
    };
    let err = Bootstrap::new(&stranger, 0, 1, &cfg)
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not match this job"), "{err}");
    // Two ranks that disagree on the world size.
    let id = loopback_id(&cfg);
    let a = thread::spawn(move || Bootstrap::new(&id, 0, 2, &config(2.0)).map(|_| ()));
    thread::sleep(Duration::from_millis(100));
    let err = Bootstrap::new(&id, 1, 3, &cfg).unwrap_err().to_string();
    assert!(err.contains("world size"), "{err}");
    assert!(a.join().unwrap().is_err());
}

#[test]
fn single_rank_job_works() {
    let cfg = config(5.0);
    let b = Bootstrap::new(&loopback_id(&cfg), 0, 1, &cfg).unwrap();
    assert_eq!(b.all_gather(b"solo").unwrap(), vec![b"solo".to_vec()]);
    b.barrier().unwrap();
    assert!(b.send(0, 1, b"x").is_err(), "a rank is not its own peer");
}
