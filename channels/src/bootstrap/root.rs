//! The rendezvous root: a thread in the process that created the unique id. Every rank
//! (rank 0 too) connects to it and says who it is and where it listens; once all have come,
//! the root sends everyone the table of addresses and exits.

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::wire::{put_string, read_frame, write_frame, Reader};
use oxccl_hal::{Error, Result};

/// Frame tags of the rendezvous protocol.
pub const TAG_HELLO: u64 = 0x4845_4c4c_4f00_0001;
/// The address table.
pub const TAG_TABLE: u64 = 0x5441_424c_4500_0002;
/// A refusal or failure, with a message.
pub const TAG_ERROR: u64 = 0x4552_524f_5200_0003;

/// Serves one job's rendezvous on `listener` until every rank came or `timeout` passed.
pub fn serve(listener: TcpListener, nonce: u64, timeout: Duration) {
    if let Err(e) = serve_inner(&listener, nonce, timeout) {
        tracing::warn!(error = %e, "bootstrap root gave up");
    }
}

struct Arrival {
    stream: TcpStream,
    addr: String,
}

fn refuse(mut stream: TcpStream, why: &str) {
    let _ = write_frame(&mut stream, TAG_ERROR, why.as_bytes());
}

fn serve_inner(listener: &TcpListener, nonce: u64, timeout: Duration) -> Result<()> {
    listener.set_nonblocking(true).map_err(|e| Error::Os {
        call: "set_nonblocking",
        source: e,
    })?;
    let deadline = Instant::now() + timeout;
    let mut world: Option<u32> = None;
    let mut arrived: BTreeMap<u32, Arrival> = BTreeMap::new();
    loop {
        if let Some(w) = world {
            if arrived.len() as u32 == w {
                break;
            }
        }
        if Instant::now() >= deadline {
            let w = world.unwrap_or(0);
            let missing: Vec<u32> = (0..w).filter(|r| !arrived.contains_key(r)).collect();
            let why = format!(
                "bootstrap root timed out after {timeout:?}: ranks {missing:?} of {w} never arrived"
            );
            for (_, a) in arrived {
                refuse(a.stream, &why);
            }
            return Err(Error::Timeout {
                what: why,
                waited: timeout,
            });
        }
        let (mut stream, _) = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => {
                return Err(Error::Os {
                    call: "accept",
                    source: e,
                })
            }
        };
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let Ok((tag, payload)) = read_frame(&mut stream) else {
            continue; // a client that vanished or spoke garbage: ignore it
        };
        if tag != TAG_HELLO {
            refuse(stream, "expected a bootstrap hello");
            continue;
        }
        let mut r = Reader::new(&payload, "hello");
        let (their_nonce, rank, their_world, addr) =
            match (|| Ok::<_, Error>((r.u64()?, r.u32()?, r.u32()?, r.string()?)))() {
                Ok(v) => v,
                Err(_) => {
                    refuse(stream, "malformed bootstrap hello");
                    continue;
                }
            };
        if their_nonce != nonce {
            refuse(stream, "unique id does not match this job (nonce differs)");
            continue;
        }
        let w = *world.get_or_insert(their_world);
        if their_world != w {
            refuse(
                stream,
                &format!("rank {rank} says world size {their_world}, others said {w}"),
            );
            continue;
        }
        if rank >= w {
            refuse(stream, &format!("rank {rank} is not below world size {w}"));
            continue;
        }
        if arrived.contains_key(&rank) {
            refuse(stream, &format!("rank {rank} arrived twice"));
            continue;
        }
        tracing::debug!(rank, world = w, "bootstrap root: rank arrived");
        arrived.insert(rank, Arrival { stream, addr });
    }
    let mut table = Vec::new();
    for a in arrived.values() {
        put_string(&mut table, &a.addr);
    }
    for (rank, mut a) in arrived {
        if let Err(e) = write_frame(&mut a.stream, TAG_TABLE, &table) {
            tracing::warn!(rank, error = %e, "bootstrap root could not send the table");
        }
    }
    Ok(())
}
