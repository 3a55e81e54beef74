//! [`Communicator::all_to_all_v`]: all-to-all with per-peer counts and displacements. The
//! chunk sizes differ per pair of ranks, so every call exchanges its layout (host side,
//! through the node's shared region where there is one; fine while capturing): every rank
//! then checks the whole matrix (what rank r sends to p is what p expects from r), knows
//! where its chunks land in the peers' outputs, and makes the same choice of algorithm
//! ([`crate::algorithms::all_to_all_v`]).

use oxccl_hal::{AccumType, DataType, DevicePtr, Error, ReduceOp, Result};

use super::auto_register::AutoCall;
use super::call_record::{BufferPath, Staged};
use super::Communicator;
use crate::algorithms::all_to_all_v::{as_v, VLayout};
use crate::algorithms::{Call, Collective, PeerBuffers};
use crate::backend::AnyStream;
use oxccl_hal::Stream;

const COLLECTIVE: Collective = Collective::AllToAllV;
/// First word of a layout record ("OXAV").
const MAGIC: u64 = 0x5641_584f;
/// Words of a record before the per-rank arrays.
const HEADER: usize = 5;
/// A record's "not registered" offset.
const UNREGISTERED: u64 = u64::MAX;

/// One side (send or receive) of this rank's call, in bytes: (offset, bytes) per rank and
/// the end of the furthest non-empty range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Side {
    pub(crate) ranges: Vec<(usize, usize)>,
    pub(crate) extent: usize,
}

impl Side {
    /// The ranges of `counts` elements at `displs` (elements), or why they are refused.
    pub(crate) fn new(
        what: &str,
        counts: &[usize],
        displs: &[usize],
        dtype: DataType,
        world: u32,
    ) -> Result<Side> {
        let n = world as usize;
        if counts.len() != n || displs.len() != n {
            return Err(Error::InvalidArgument(format!(
                "{COLLECTIVE}: {} {what} counts and {} {what} displacements for {world} ranks",
                counts.len(),
                displs.len()
            )));
        }
        let mut ranges = Vec::with_capacity(n);
        let mut extent = 0usize;
        for (r, (&count, &displ)) in counts.iter().zip(displs).enumerate() {
            let range = dtype.bytes(count).and_then(|bytes| {
                let off = dtype.bytes(displ)?;
                let end = off.checked_add(bytes).ok_or_else(|| {
                    Error::InvalidArgument(format!("{off} + {bytes} bytes overflow"))
                })?;
                Ok((off, bytes, end))
            });
            let (off, bytes, end) = range.map_err(|e| {
                Error::InvalidArgument(format!(
                    "{COLLECTIVE}: {what} count {count} at displacement {displ} (rank {r}) of \
                     {dtype}: {e}"
                ))
            })?;
            if bytes > 0 {
                extent = extent.max(end);
            }
            ranges.push((off, bytes));
        }
        Ok(Side { ranges, extent })
    }

    /// Refuses ranges that overlap (a receive range written twice), naming the ranks.
    fn disjoint(&self, what: &str) -> Result<()> {
        let mut order: Vec<usize> = (0..self.ranges.len())
            .filter(|&r| self.ranges[r].1 > 0)
            .collect();
        order.sort_by_key(|&r| self.ranges[r].0);
        for w in order.windows(2) {
            let (a, b) = (self.ranges[w[0]], self.ranges[w[1]]);
            if a.0 + a.1 > b.0 {
                return Err(Error::InvalidArgument(format!(
                    "{COLLECTIVE}: the {what} ranges of ranks {} and {} overlap (bytes {}..{} \
                     and {}..{})",
                    w[0],
                    w[1],
                    a.0,
                    a.0 + a.1,
                    b.0,
                    b.0 + b.1
                )));
            }
        }
        Ok(())
    }
}

/// A buffer that a side reaches: not null and element-aligned when it reaches anything.
fn check_pointer(what: &str, ptr: DevicePtr, side: &Side, dtype: DataType) -> Result<()> {
    if side.extent == 0 {
        return Ok(());
    }
    if ptr == DevicePtr::NULL || !ptr.is_aligned(dtype.size() as u64) {
        return Err(Error::InvalidArgument(format!(
            "{COLLECTIVE}: the {what} buffer {ptr} is null or not aligned to {dtype}'s {} \
             bytes",
            dtype.size()
        )));
    }
    Ok(())
}

/// This rank's checks: the arrays, the pointers, overlap; returns (send, receive).
fn check_local(
    (input, send_counts, send_displs): (DevicePtr, &[usize], &[usize]),
    (output, recv_counts, recv_displs): (DevicePtr, &[usize], &[usize]),
    dtype: DataType,
    (rank, world): (u32, u32),
) -> Result<(Side, Side)> {
    let send = Side::new("send", send_counts, send_displs, dtype, world)?;
    let recv = Side::new("receive", recv_counts, recv_displs, dtype, world)?;
    recv.disjoint("receive")?;
    check_pointer("send", input, &send, dtype)?;
    check_pointer("receive", output, &recv, dtype)?;
    let me = rank as usize;
    if send_counts[me] != recv_counts[me] {
        return Err(Error::InvalidArgument(format!(
            "{COLLECTIVE}: rank {rank} sends {} elements to itself but expects {}",
            send_counts[me], recv_counts[me]
        )));
    }
    if send.extent > 0 && recv.extent > 0 {
        let (a, b) = (input.0, output.0);
        let overlap =
            a < b.saturating_add(recv.extent as u64) && b < a.saturating_add(send.extent as u64);
        if overlap {
            return Err(Error::InvalidArgument(format!(
                "{COLLECTIVE}: the send buffer ({input}, {} bytes) and the receive buffer \
                 ({output}, {} bytes) overlap; all_to_all_v has no in-place form",
                send.extent, recv.extent
            )));
        }
    }
    Ok((send, recv))
}

/// What every rank sends about its call.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LayoutRecord {
    dtype: u32,
    /// The algorithm forced here (its code; 0: none), so that every rank launches alike.
    forced: u32,
    /// The output's offset in a buffer registered on every rank ([`UNREGISTERED`]: not).
    registered_offset: u64,
    send_counts: Vec<u64>,
    recv_counts: Vec<u64>,
    recv_displs: Vec<u64>,
}

impl LayoutRecord {
    fn to_bytes(&self) -> Vec<u8> {
        let n = self.send_counts.len();
        let mut words = Vec::with_capacity(HEADER + 3 * n);
        words.extend([
            MAGIC,
            n as u64,
            u64::from(self.dtype),
            u64::from(self.forced),
            self.registered_offset,
        ]);
        words.extend(&self.send_counts);
        words.extend(&self.recv_counts);
        words.extend(&self.recv_displs);
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// A record of `world` ranks, or `None` when the bytes are not one (a peer that made
    /// another call).
    fn from_bytes(bytes: &[u8], world: u32) -> Option<LayoutRecord> {
        let n = world as usize;
        if bytes.len() != (HEADER + 3 * n) * 8 {
            return None;
        }
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| c.try_into().map(u64::from_le_bytes))
            .collect::<std::result::Result<_, _>>()
            .ok()?;
        if words[0] != MAGIC || words[1] != n as u64 {
            return None;
        }
        let array = |i: usize| words[HEADER + i * n..][..n].to_vec();
        Some(LayoutRecord {
            dtype: u32::try_from(words[2]).ok()?,
            forced: u32::try_from(words[3]).ok()?,
            registered_offset: words[4],
            send_counts: array(0),
            recv_counts: array(1),
            recv_displs: array(2),
        })
    }
}

/// Checks every rank's record against the others' and this rank's; returns the layout
/// this rank launches with (its `remote` offsets from the peers' receive displacements)
/// and the total bytes moved (the same on every rank).
fn agree(
    records: &[LayoutRecord],
    mine: &LayoutRecord,
    (send, recv): (&Side, &Side),
    dtype: DataType,
    rank: u32,
) -> Result<(VLayout, usize)> {
    let mismatch =
        |what: String| Error::InvalidArgument(format!("mismatched {COLLECTIVE} calls: {what}"));
    for (r, rec) in records.iter().enumerate() {
        if rec.dtype != mine.dtype || rec.forced != mine.forced {
            return Err(mismatch(format!(
                "rank {r} called with type code {} (forced algorithm {}), this rank with {} ({})",
                rec.dtype, rec.forced, mine.dtype, mine.forced
            )));
        }
    }
    let mut max_chunk = 0usize;
    let mut largest = 0usize;
    let mut total = 0usize;
    for (r, rec) in records.iter().enumerate() {
        for (p, peer) in records.iter().enumerate() {
            let (sent, expected) = (rec.send_counts[p], peer.recv_counts[r]);
            if sent != expected {
                return Err(mismatch(format!(
                    "rank {r} sends {sent} elements to rank {p}, which expects {expected} from it"
                )));
            }
            let bytes = usize::try_from(sent)
                .map_err(|_| mismatch(format!("rank {r} sends {sent} elements")))
                .and_then(|c| dtype.bytes(c))?;
            total = total.saturating_add(bytes);
            largest = largest.max(bytes);
            if r != p {
                max_chunk = max_chunk.max(bytes);
            }
        }
    }
    let me = rank as usize;
    let remote = records
        .iter()
        .map(|peer| {
            usize::try_from(peer.recv_displs[me])
                .map_err(|_| mismatch("a receive displacement beyond this machine's range".into()))
                .and_then(|d| dtype.bytes(d))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((
        VLayout {
            send: send.ranges.clone(),
            recv: recv.ranges.clone(),
            remote,
            max_chunk,
            largest,
        },
        total,
    ))
}

impl Communicator {
    /// All-to-all with per-peer counts and displacements (MPI's `Alltoallv`): rank r's
    /// `send_counts[p]` elements at `input + send_displs[p]` land at `output +
    /// recv_displs[r]` on rank p, whose `recv_counts[r]` must be that count. Counts and
    /// displacements are in elements of `dtype`, one per rank; zero counts are allowed
    /// (a rank may send or receive nothing), and receive ranges must not overlap. Output
    /// bytes no range covers are left as they were.
    ///
    /// Every call exchanges its layout between the ranks on the host (through the node's
    /// shared region; the bootstrap across nodes), then the copy engine moves the chunks:
    /// straight into the peers' outputs when every rank's output is registered at the same
    /// offset or reachable through auto-registration, else through the staging buffers.
    /// Graph-capturable (the exchange runs at capture; a replay moves the captured layout).
    ///
    /// Errors (before anything is queued, the same on every rank where the layouts
    /// disagree): arrays not one entry per rank, overflowing sizes, null or misaligned
    /// buffers that a range reaches, overlapping receive ranges, input and output that
    /// overlap (there is no in-place form), a rank whose send count to a peer differs from
    /// that peer's receive count, a different type or forced algorithm on another rank, a
    /// peer that does not make the call within the communicator's timeout, ranks on
    /// several nodes.
    ///
    /// # Safety
    /// `input` must be device memory of this communicator's device holding every send
    /// range, `output` every receive range, both live until the work queued on `stream`
    /// completes; no other work may write them meanwhile. Every rank must make the same
    /// sequence of calls, ordered on one stream per rank.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_to_all_v(
        &self,
        input: DevicePtr,
        send_counts: &[usize],
        send_displs: &[usize],
        output: DevicePtr,
        recv_counts: &[usize],
        recv_displs: &[usize],
        dtype: DataType,
        stream: &AnyStream,
    ) -> Result<()> {
        let at = |e: Error| e.at_rank(self.rank);
        self.check_not_aborted()?;
        let (send, recv) = check_local(
            (input, send_counts, send_displs),
            (output, recv_counts, recv_displs),
            dtype,
            (self.rank, self.world),
        )
        .map_err(at)?;
        let registered = self
            .registry
            .peer_buffers(None, Some((output, recv.extent)), self.world);
        let words = |v: &[usize]| v.iter().map(|&x| x as u64).collect::<Vec<_>>();
        let mine = LayoutRecord {
            dtype: dtype.code(),
            forced: self.selector.forced.of(COLLECTIVE).map_or(0, |a| a.code()),
            registered_offset: registered.map_or(UNREGISTERED, |z| z.offsets.1),
            send_counts: words(send_counts),
            recv_counts: words(recv_counts),
            recv_displs: words(recv_displs),
        };
        let ctx = self.exchange_ctx();
        let all = ctx.all_gather(&mine.to_bytes()).map_err(at)?;
        let records = all
            .iter()
            .enumerate()
            .map(|(r, b)| {
                LayoutRecord::from_bytes(b, self.world).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "mismatched {COLLECTIVE} calls: rank {r} did not make this call (its \
                         message is not an {COLLECTIVE} layout)"
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()
            .map_err(at)?;
        let (layout, total) =
            agree(&records, &mine, (&send, &recv), dtype, self.rank).map_err(at)?;
        if total == 0 {
            return Ok(());
        }
        let elements = total / dtype.size();
        let all_registered = records.iter().all(|r| {
            r.registered_offset != UNREGISTERED && r.registered_offset == mine.registered_offset
        });
        let refusal = self.auto_register_refusal(total);
        let (peers, path, refused): (Option<PeerBuffers>, BufferPath, Option<Staged>) =
            if all_registered {
                (registered, BufferPath::Registered, None)
            } else if refusal.is_none() {
                let call = AutoCall {
                    collective: COLLECTIVE,
                    count: elements as u64,
                    dtype: dtype.code(),
                    op: 0,
                    accum: 0,
                    root: 0,
                };
                let capturing = stream.is_capturing().map_err(at)?;
                match self.auto.peer_buffers(
                    &ctx,
                    call,
                    None,
                    Some((output, recv.extent)),
                    capturing,
                )? {
                    Ok(views) => (Some(views), BufferPath::Mapped, None),
                    Err(why) => (None, BufferPath::Scratch, Some(why)),
                }
            } else {
                (None, BufferPath::Scratch, refusal)
            };
        // The choice and the plan follow the largest chunk, which every rank knows alike
        // (the extents differ per rank).
        let largest = layout.largest;
        let shape = self.shape(
            COLLECTIVE,
            largest / dtype.size(),
            dtype,
            largest,
            peers.is_some(),
        );
        let choice = self.select(&shape).map_err(at)?;
        let count = send.extent.max(recv.extent) / dtype.size();
        let instance = self
            .instance(choice.algorithm)
            .and_then(as_v)
            .ok_or_else(|| {
                at(Error::Unsupported(format!(
                    "{}: not set up in this communicator ({})",
                    choice.algorithm,
                    choice.algorithm.descriptor().serves
                )))
            })?;
        let peers = peers.filter(|_| choice.algorithm.uses_registered());
        let call = Call {
            input,
            output,
            count: count.max(1),
            dtype,
            op: ReduceOp::Sum,
            accum: AccumType::Auto,
            root: 0,
            peers,
        };
        self.check_not_aborted()?;
        // SAFETY: the caller's obligations (this function's contract); the layout was
        // checked against every rank's, which chose the same algorithm (same forced one,
        // same registration outcome).
        unsafe { instance.launch_v(&call, &choice.plan, &layout, stream) }.map_err(at)?;
        self.note_call(COLLECTIVE, choice.algorithm, path, peers.is_some(), refused);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(counts: &[usize], displs: &[usize]) -> Result<Side> {
        Side::new(
            "receive",
            counts,
            displs,
            DataType::F32,
            counts.len() as u32,
        )
    }

    #[test]
    fn sides_and_their_errors() {
        let s = side(&[2, 0, 3], &[0, 100, 2]).unwrap();
        assert_eq!(s.ranges, [(0, 8), (400, 0), (8, 12)]);
        assert_eq!(s.extent, 20, "an empty range does not count");
        s.disjoint("receive").unwrap();
        let e = side(&[2, 1, 3], &[0, 1, 5]).unwrap().disjoint("receive");
        assert!(e.unwrap_err().to_string().contains("ranks 0 and 1 overlap"));
        let e = Side::new("send", &[1, 2], &[0], DataType::F32, 2).unwrap_err();
        assert!(
            e.to_string()
                .contains("2 send counts and 1 send displacements for 2 ranks"),
            "{e}"
        );
        let e = side(&[usize::MAX / 2, 0], &[0, 0]).unwrap_err();
        assert!(e.to_string().contains("overflow"), "{e}");
        let e = side(&[1, 1], &[usize::MAX / 4, 0]).unwrap_err();
        assert!(e.to_string().contains("overflow"), "{e}");
    }

    #[test]
    fn local_checks() {
        let f = DataType::F32;
        let (a, b) = (DevicePtr(0x1000), DevicePtr(0x2000));
        let ok = check_local((a, &[1, 2], &[0, 1]), (b, &[1, 5], &[0, 1]), f, (0, 2));
        assert!(ok.is_ok());
        // Overlap of input and output.
        let e = check_local(
            (a, &[1, 2], &[0, 1]),
            (DevicePtr(0x1004), &[1, 5], &[0, 1]),
            f,
            (0, 2),
        );
        assert!(e.unwrap_err().to_string().contains("no in-place form"));
        // Self-send mismatch.
        let e = check_local((a, &[2, 2], &[0, 2]), (b, &[1, 5], &[0, 1]), f, (0, 2));
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("sends 2 elements to itself but expects 1"));
        // Misaligned and null buffers are refused only where a range reaches them.
        let e = check_local(
            (DevicePtr(0x1002), &[1, 2], &[0, 1]),
            (b, &[1, 5], &[0, 1]),
            f,
            (0, 2),
        );
        assert!(e.unwrap_err().to_string().contains("not aligned"));
        let nothing = check_local(
            (DevicePtr::NULL, &[0, 0], &[0, 0]),
            (b, &[0, 5], &[0, 1]),
            f,
            (0, 2),
        );
        assert!(nothing.is_ok());
    }

    fn record(send: &[u64], recv: &[u64], displs: &[u64]) -> LayoutRecord {
        LayoutRecord {
            dtype: DataType::F32.code(),
            forced: 0,
            registered_offset: UNREGISTERED,
            send_counts: send.to_vec(),
            recv_counts: recv.to_vec(),
            recv_displs: displs.to_vec(),
        }
    }

    #[test]
    fn records_round_trip_and_agree() {
        let r0 = record(&[1, 2], &[1, 3], &[0, 10]);
        let r1 = record(&[3, 4], &[2, 4], &[5, 0]);
        assert_eq!(
            LayoutRecord::from_bytes(&r0.to_bytes(), 2),
            Some(r0.clone())
        );
        assert_eq!(LayoutRecord::from_bytes(&r0.to_bytes(), 3), None);
        assert_eq!(LayoutRecord::from_bytes(&r0.to_bytes()[1..], 2), None);
        let f = DataType::F32;
        let send = Side::new("send", &[1, 2], &[0, 1], f, 2).unwrap();
        let recv = Side::new("receive", &[1, 3], &[0, 10], f, 2).unwrap();
        let (layout, total) = agree(&[r0.clone(), r1.clone()], &r0, (&send, &recv), f, 0).unwrap();
        // Rank 0's chunk for rank 1 lands at rank 1's displacement for rank 0 (5 elements).
        assert_eq!(layout.remote, [0, 20]);
        assert_eq!(layout.max_chunk, 12, "3 elements from rank 1 to rank 0");
        assert_eq!(layout.largest, 16, "4 elements from rank 1 to itself");
        assert_eq!(total, 40);
        // Rank 1 expects 9 elements from rank 0, which sends 2.
        let bad = record(&[3, 4], &[9, 4], &[5, 0]);
        let e = agree(&[r0.clone(), bad], &r0, (&send, &recv), f, 0).unwrap_err();
        assert!(
            e.to_string()
                .contains("rank 0 sends 2 elements to rank 1, which expects 9"),
            "{e}"
        );
        let mut other = r1;
        other.dtype = DataType::Bf16.code();
        let e = agree(&[r0.clone(), other], &r0, (&send, &recv), f, 0).unwrap_err();
        assert!(
            e.to_string().contains("rank 1 called with type code"),
            "{e}"
        );
    }
}
