//! The `-N` spawner and the single-rank defaults.

use std::process::{Command, ExitCode};

use oxccl_collectives::channels::bootstrap::{free_rendezvous_port, RENDEZVOUS_PORTS};

/// Starts `n` copies of this program as ranks 0..n on this machine with the launcher
/// environment torchrun would set, waits for all, and fails when any failed.
pub fn run(n: u32) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("oxccl-perf: cannot find this program's path: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(port) = free_rendezvous_port() else {
        eprintln!("oxccl-perf: no free port for the rendezvous in {RENDEZVOUS_PORTS:?}");
        return ExitCode::FAILURE;
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut children = Vec::new();
    for r in 0..n {
        let child = Command::new(&exe)
            .args(&args)
            .env("RANK", r.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("OXCCL_BOOTSTRAP_PORT", port.to_string())
            .env("NCCL_NVLS_ENABLE", "0")
            .spawn();
        match child {
            Ok(c) => children.push((r, c)),
            Err(e) => {
                eprintln!("oxccl-perf: starting rank {r}: {e}");
                for (_, mut c) in children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return ExitCode::FAILURE;
            }
        }
    }
    // Wait for every rank; the first that fails stops the others (they would otherwise
    // wait for it until the bootstrap timeout).
    let mut ok = true;
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            let (r, c) = &mut children[i];
            match c.try_wait() {
                Ok(None) => i += 1,
                Ok(Some(s)) => {
                    if !s.success() {
                        eprintln!("oxccl-perf: rank {r} failed ({s})");
                        ok = false;
                    }
                    children.swap_remove(i);
                }
                Err(e) => {
                    eprintln!("oxccl-perf: waiting for rank {r}: {e}");
                    ok = false;
                    children.swap_remove(i);
                }
            }
        }
        if !ok {
            for (r, c) in &mut children {
                eprintln!("oxccl-perf: stopping rank {r}");
                let _ = c.kill();
                let _ = c.wait();
            }
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Without any launcher variables this process is the only rank.
pub fn single_rank_defaults() {
    let launched = ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
    if !launched {
        let port = free_rendezvous_port().unwrap_or(29500);
        for (k, v) in [
            ("RANK", "0".to_string()),
            ("LOCAL_RANK", "0".to_string()),
            ("WORLD_SIZE", "1".to_string()),
            ("LOCAL_WORLD_SIZE", "1".to_string()),
            ("MASTER_ADDR", "127.0.0.1".to_string()),
            ("OXCCL_BOOTSTRAP_PORT", port.to_string()),
        ] {
            std::env::set_var(k, v);
        }
    }
}
