//! File-based rendezvous between the ranks of one suite run.
//!
//! Each exchange has a tag; rank `r` writes `<dir>/<run>.<tag>.rank<r>` atomically (a
//! temporary file renamed into place) and polls for every other rank's file until a
//! timeout, so a dead peer makes the survivors fail that step instead of hanging.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use oxccl_hal::{Error, Result};

/// Where ranks meet, and who this one is.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    dir: PathBuf,
    run: String,
    rank: u32,
    world: u32,
    timeout: Duration,
}

fn io(call: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Os { call, source }
}

impl Rendezvous {
    /// A rendezvous in `dir` (created if missing) for `rank` of `world`.
    pub fn new(dir: &Path, run: &str, rank: u32, world: u32, timeout: Duration) -> Result<Self> {
        if rank >= world {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} >= world size {world}"
            )));
        }
        std::fs::create_dir_all(dir).map_err(io("create_dir_all"))?;
        let clean: String = run
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        Ok(Rendezvous {
            dir: dir.to_path_buf(),
            run: clean,
            rank,
            world,
            timeout,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    pub fn world(&self) -> u32 {
        self.world
    }

    fn path(&self, tag: &str, rank: u32) -> PathBuf {
        self.dir.join(format!("{}.{tag}.rank{rank}", self.run))
    }

    /// Publishes `data` under `tag` and returns every rank's data, in rank order.
    pub fn all_gather(&self, tag: &str, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mine = self.path(tag, self.rank);
        let tmp = self.dir.join(format!(
            ".{}.{tag}.rank{}.{}.tmp",
            self.run,
            self.rank,
            std::process::id()
        ));
        std::fs::write(&tmp, data).map_err(io("write"))?;
        std::fs::rename(&tmp, &mine).map_err(io("rename"))?;
        let start = Instant::now();
        let mut out = Vec::with_capacity(self.world as usize);
        for r in 0..self.world {
            let path = self.path(tag, r);
            let mut pause = Duration::from_millis(1);
            loop {
                match std::fs::read(&path) {
                    Ok(bytes) => {
                        out.push(bytes);
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        if start.elapsed() > self.timeout {
                            return Err(Error::Timeout {
                                what: format!(
                                    "rank {r} to reach step '{tag}' (file {})",
                                    path.display()
                                ),
                                waited: start.elapsed(),
                            });
                        }
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(Duration::from_millis(20));
                    }
                    Err(e) => {
                        return Err(Error::Os {
                            call: "read",
                            source: e,
                        })
                    }
                }
            }
        }
        Ok(out)
    }

    /// Like [`Rendezvous::all_gather`], but a rank that does not arrive in time is `None`
    /// instead of an error (for collecting reports from survivors).
    pub fn gather_partial(&self, tag: &str, data: &[u8]) -> Result<Vec<Option<Vec<u8>>>> {
        match self.all_gather(tag, data) {
            Ok(all) => Ok(all.into_iter().map(Some).collect()),
            Err(Error::Timeout { .. }) => Ok((0..self.world)
                .map(|r| std::fs::read(self.path(tag, r)).ok())
                .collect()),
            Err(e) => Err(e),
        }
    }

    /// Waits until every rank reached `tag`.
    pub fn barrier(&self, tag: &str) -> Result<()> {
        self.all_gather(tag, &[]).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("oxccl-rdv-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn ranks_in_threads_exchange_data() {
        let dir = scratch("gather");
        let world = 3;
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let dir = dir.clone();
                std::thread::spawn(move || {
                    let rdv =
                        Rendezvous::new(&dir, "t", r, world, Duration::from_secs(10)).unwrap();
                    let got = rdv.all_gather("x", &[r as u8; 3]).unwrap();
                    rdv.barrier("done").unwrap();
                    got
                })
            })
            .collect();
        for h in handles {
            let got = h.join().unwrap();
            assert_eq!(got, vec![vec![0u8; 3], vec![1u8; 3], vec![2u8; 3]]);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_peer_times_out() {
        let dir = scratch("timeout");
        let rdv = Rendezvous::new(&dir, "t", 0, 2, Duration::from_millis(50)).unwrap();
        let err = rdv.barrier("never").unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(err.to_string().contains("rank 1"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
