//! A timeline of the proxy and the TCP transport, for finding where a small message's time
//! goes ([`TIMELINE_VAR`]`=<prefix>`, off by default): when the proxy picked a trigger up,
//! when its frames had left, when the peer's receiver had a write's header, when it stored
//! the signal. A process keeps its first [`CAPACITY`] events, stamped with CLOCK_MONOTONIC
//! (one clock for every process of a machine), and writes them to `<prefix>.<pid>.csv` each
//! time a TCP connection closes. `ci/gpu/tcp_timeline.py` lines the ranks' files up.
//!
//! Off, a record is one load of an initialized `OnceLock`.

use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Environment variable: the path prefix of the timeline files; unset or empty, none.
pub const TIMELINE_VAR: &str = "OXCCL_CHANNEL_TIMELINE";
/// Events a process keeps (16 bytes each).
pub const CAPACITY: usize = 1 << 18;
/// The rank and peer fields: 28 bits, all ones = not known.
const FIELD: u32 = 0x0fff_ffff;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Event {
    /// The proxy took a trigger for `peer` off the FIFO.
    Picked = 0,
    /// The proxy's operation for `peer` returned (its frames are in the socket).
    Sent = 1,
    /// This rank's receiver read the header of a write from `peer`.
    Header = 2,
    /// This rank's receiver stored a signal (an update) from `peer`.
    Signalled = 3,
}

impl Event {
    fn name(code: u64) -> &'static str {
        match code {
            0 => "picked",
            1 => "sent",
            2 => "header",
            3 => "signalled",
            _ => "?",
        }
    }
}

struct Timeline {
    path: String,
    next: AtomicUsize,
    /// (nanoseconds, event << 56 | rank << 28 | peer) per event.
    slots: Box<[[AtomicU64; 2]]>,
}

static TIMELINE: OnceLock<Option<Timeline>> = OnceLock::new();

fn timeline() -> Option<&'static Timeline> {
    TIMELINE
        .get_or_init(|| {
            let prefix = std::env::var(TIMELINE_VAR).ok().filter(|p| !p.is_empty())?;
            Some(Timeline {
                path: format!("{prefix}.{}.csv", std::process::id()),
                next: AtomicUsize::new(0),
                slots: (0..CAPACITY)
                    .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
                    .collect(),
            })
        })
        .as_ref()
}

fn now_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// Records `event` of `rank` (`u32::MAX` where the caller does not know it) about `peer`.
pub fn record(event: Event, rank: u32, peer: u32) {
    let Some(t) = timeline() else { return };
    let i = t.next.fetch_add(1, Ordering::Relaxed);
    if let Some(s) = t.slots.get(i) {
        s[0].store(now_ns(), Ordering::Relaxed);
        s[1].store(pack(event, rank, peer), Ordering::Relaxed);
    }
}

/// An event's second word: the event, then 28 bits each of rank and peer.
fn pack(event: Event, rank: u32, peer: u32) -> u64 {
    (event as u64) << 56 | u64::from(rank & FIELD) << 28 | u64::from(peer & FIELD)
}

/// The CSV line of one event (rank -1: not known where it was recorded).
fn line(ns: u64, what: u64) -> String {
    let field = |shift: u32| (what >> shift) & u64::from(FIELD);
    let rank = match field(28) {
        r if r == u64::from(FIELD) => -1,
        r => r as i64,
    };
    format!("{ns},{},{rank},{}\n", Event::name(what >> 56), field(0))
}

/// Writes the events recorded so far (a no-op when off). Failures are logged, not returned:
/// the timeline is a diagnostic.
pub fn write() {
    let Some(t) = timeline() else { return };
    let n = t.next.load(Ordering::Relaxed).min(CAPACITY);
    let mut out = String::with_capacity(32 * n + 32);
    out.push_str("ns,event,rank,peer\n");
    for s in &t.slots[..n] {
        out.push_str(&line(
            s[0].load(Ordering::Relaxed),
            s[1].load(Ordering::Relaxed),
        ));
    }
    let written = std::fs::File::create(&t.path).and_then(|mut f| f.write_all(out.as_bytes()));
    match written {
        Ok(()) => tracing::info!(path = %t.path, events = n, "channel timeline written"),
        Err(e) => tracing::warn!(path = %t.path, error = %e, "channel timeline not written"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_pack_into_csv_lines() {
        assert_eq!(line(12, pack(Event::Header, 3, 1)), "12,header,3,1\n");
        assert_eq!(line(7, pack(Event::Picked, u32::MAX, 5)), "7,picked,-1,5\n");
        assert_eq!(line(0, pack(Event::Signalled, 0, 0)), "0,signalled,0,0\n");
        assert!(now_ns() > 0);
    }
}
