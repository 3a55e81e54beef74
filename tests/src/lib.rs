//! Shared helpers for oxccl integration tests (multi-process launch on the host backend).
//!
//! A multi-process test re-executes its own test binary: the child runs one named test
//! function with an environment variable saying which role it plays. Parent and child talk
//! in lines: the parent writes commands to the child's stdin; the child prints replies
//! prefixed with [`MARK`] (libtest's own output shares stdout, so only marked lines count).
//! Every wait on a child is bounded and a child is killed when its handle drops, so a
//! failing test cannot leave processes behind or hang CI.

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// Prefix of the lines a child sends to its parent.
pub const MARK: &str = "OXCCL-CHILD>";

/// The default bound on any wait for a child.
pub const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

/// A child process running one test function of the current test binary.
#[derive(Debug)]
pub struct Child {
    name: String,
    child: std::process::Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Child {
    /// Starts the current executable running only `test_name`, with `env` set.
    pub fn spawn_test(
        name: &str,
        test_name: &str,
        env: &[(&str, String)],
    ) -> Result<Child, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut cmd = Command::new(exe);
        cmd.args([test_name, "--exact", "--nocapture", "--test-threads=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().map_err(|e| format!("spawning {name}: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| format!("{name}: no stdout pipe"))?;
        let (tx, lines) = mpsc::channel();
        // Reading on a thread is what lets `recv` put a bound on every wait.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if let Some(at) = line.find(MARK) {
                    if tx.send(line[at + MARK.len()..].to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        Ok(Child {
            name: name.to_string(),
            child,
            stdin,
            lines,
        })
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one command line.
    pub fn send(&mut self, line: &str) -> Result<(), String> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| format!("{}: stdin already closed", self.name))?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("{}: writing '{line}': {e}", self.name))
    }

    /// The next line the child sent, waiting at most `timeout`. A line starting with
    /// `FAIL` is returned as an error.
    pub fn recv(&self, timeout: Duration) -> Result<String, String> {
        let line = self.lines.recv_timeout(timeout).map_err(|_| {
            format!(
                "{}: no reply within {timeout:?} (child crashed or hung)",
                self.name
            )
        })?;
        match line.strip_prefix("FAIL") {
            Some(why) => Err(format!("{} failed:{why}", self.name)),
            None => Ok(line),
        }
    }

    /// The next line, which must start with `word`; returns the rest.
    pub fn expect(&self, word: &str) -> Result<String, String> {
        let line = self.recv(CHILD_TIMEOUT)?;
        match line.strip_prefix(word) {
            Some(rest) => Ok(rest.trim().to_string()),
            None => Err(format!("{}: expected '{word}', got '{line}'", self.name)),
        }
    }

    /// Closes stdin and waits for the child to exit, killing it after `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> Result<ExitStatus, String> {
        self.stdin.take();
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(None) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return Err(format!(
                        "{}: did not exit within {timeout:?}; killed",
                        self.name
                    ));
                }
                Err(e) => return Err(format!("{}: waiting: {e}", self.name)),
            }
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Child side: sends one line to the parent.
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    // Start on a fresh line: libtest may have printed the test name without a newline.
    let _ = writeln!(out, "\n{MARK}{line}");
    let _ = out.flush();
}

/// Child side: the next command from the parent (`None` when the parent closed stdin).
pub fn next_command() -> Option<String> {
    let mut line = String::new();
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line.trim().to_string()),
    }
}

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Inverse of [`to_hex`].
pub fn from_hex(s: &str) -> Result<Vec<u8>, String> {
    if s.len() % 2 != 0 {
        return Err(format!("odd-length hex '{s}'"));
    }
    (0..s.len() / 2)
        .map(|i| {
            s.get(2 * i..2 * i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad hex at {i} in '{s}'"))
        })
        .collect()
}

/// A deterministic, never-zero byte stream from a seed: lets every process compute what
/// any other wrote without shipping the data.
pub fn pattern(seed: u64, stream: u64, len: usize) -> Vec<u8> {
    let mut x = seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xd1b5_4a32_d192_ed03;
    (0..len)
        .map(|_| {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let v = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8;
            v | 1
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        let b = pattern(7, 1, 100);
        assert_eq!(from_hex(&to_hex(&b)).unwrap(), b);
        assert!(from_hex("abc").is_err());
        assert!(from_hex("zz").is_err());
    }

    #[test]
    fn patterns_differ_by_stream_and_are_never_zero() {
        let a = pattern(42, 1, 4096);
        let b = pattern(42, 2, 4096);
        assert_ne!(a, b);
        assert!(a.iter().chain(&b).all(|&x| x != 0));
        assert_eq!(a, pattern(42, 1, 4096));
    }
}
