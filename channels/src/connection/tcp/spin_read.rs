//! The receiver's socket: a read that finds no data spins on non-blocking attempts for a
//! while before it blocks.
//!
//! Collectives send in bursts: a signal follows its data, the next round follows the last
//! one within microseconds. A receiver thread asleep in `read` takes a scheduler wake-up
//! for every frame that finds it idle (tens of microseconds on loopback, more than the
//! whole transfer of a small message); spinning for [`SPIN`] after the last byte keeps it
//! awake through a burst. Between bursts it blocks, so an idle connection costs no core.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How long a read spins on an empty socket before it blocks.
pub(super) const SPIN: Duration = Duration::from_micros(200);

/// A socket read as above. The socket is non-blocking while it spins and blocking while it
/// sleeps; every read leaves it non-blocking again.
pub(super) struct SpinRead {
    sock: TcpStream,
    nonblocking: bool,
    spin: Duration,
}

impl SpinRead {
    pub(super) fn new(sock: TcpStream, spin: Duration) -> SpinRead {
        SpinRead {
            sock,
            nonblocking: false,
            spin,
        }
    }

    /// The socket (to shut it down).
    pub(super) fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// Writes all of `data` (flush acknowledgements go back on this socket), blocking.
    pub(super) fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.set_nonblocking(false)?;
        self.sock.write_all(data)
    }

    fn set_nonblocking(&mut self, on: bool) -> std::io::Result<()> {
        if self.nonblocking != on {
            self.sock.set_nonblocking(on)?;
            self.nonblocking = on;
        }
        Ok(())
    }
}

impl Read for SpinRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.set_nonblocking(true)?;
        let mut since = None;
        loop {
            match self.sock.read(buf) {
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    let start = *since.get_or_insert_with(Instant::now);
                    if start.elapsed() < self.spin {
                        std::hint::spin_loop();
                        continue;
                    }
                    // Idle: sleep in the kernel until bytes come.
                    self.set_nonblocking(false)?;
                    return self.sock.read(buf);
                }
                other => return other,
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn reads_what_comes_while_spinning_and_after_blocking() {
        let (mut tx, rx) = pair();
        let mut r = SpinRead::new(rx, Duration::from_millis(5));
        let writer = std::thread::spawn(move || {
            tx.write_all(b"abc").unwrap();
            // Longer than the spin: the reader is blocked when these arrive.
            std::thread::sleep(Duration::from_millis(50));
            tx.write_all(b"defgh").unwrap();
            tx
        });
        let mut got = [0u8; 8];
        r.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"abcdefgh");
        // The peer closing is end of stream, not an error or a hang.
        drop(writer.join().unwrap());
        assert_eq!(r.read(&mut got).unwrap(), 0);
    }
}
