//! The collectives oxccl-perf measures, one [`Collective`] entry each in [`COLLECTIVES`]:
//! everything the run loop, the checks and the report need to know about one of them.
//! Adding a collective is one entry here, its reference check in [`crate::check`] and its
//! NCCL/RCCL call in `crate::vendor`.
//!
//! Sizes and bandwidths follow nccl-tests exactly (its `src/<collective>.cu`:
//! `GetCollByteCount` and `GetBw`; `doc/PERFORMANCE.md`), so a row of ours reads like a
//! row of its `*_perf` at the same `-b/-e`:
//! * the swept size (`-b`, `-e`, `-f`) is nccl-tests' size: the larger of one rank's send
//!   and receive buffers. The per-rank count is derived from it the way nccl-tests does
//!   (allgather: `size / element / ranks`, rounded down), and the size column then shows
//!   the larger buffer of that count (so 1001 bytes of bf16 on 2 ranks prints 1000);
//! * the count column is the count passed to the call (allgather: per rank);
//! * algbw = size / time; busbw = algbw x a factor per collective, which makes the number
//!   comparable to the hardware's bandwidth: allreduce 2(n-1)/n, allgather, reducescatter
//!   and alltoall (n-1)/n, broadcast and reduce 1;
//! * in place: both buffers lie in the receive buffer, at nccl-tests' in-place offsets
//!   (allgather: the input is this rank's slot, `recv + rank * count`, NCCL's rule).

use oxccl_collectives::backend::AnyStream;
use oxccl_collectives::hal::{AccumType, DataType, DevicePtr, ReduceOp, Result};
use oxccl_collectives::Communicator;

use crate::check::{self, Expect, Verdict};

/// One call's arguments (the op and accumulation type are ignored by collectives that do
/// not reduce).
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub input: DevicePtr,
    pub output: DevicePtr,
    pub count: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub accum: AccumType,
    /// The root (broadcast, reduce).
    pub root: u32,
    pub stream: &'a AnyStream,
}

/// Buffer sizes of one row: nccl-tests' `GetCollByteCount` for a swept size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Elements passed to the call.
    pub count: usize,
    /// Bytes of one rank's send buffer.
    pub send_bytes: usize,
    /// Bytes of one rank's receive buffer.
    pub recv_bytes: usize,
    /// The size column: the larger of the two.
    pub size: usize,
}

/// (wrong elements, first of them as (index, got bits, want bits)).
pub type Mismatches = (usize, Option<(usize, u64, u64)>);

/// One collective as oxccl-perf measures it.
#[derive(Debug)]
pub struct Collective {
    /// Its name on the command line (`-c`), in the header, the JSON file and the plot.
    pub name: &'static str,
    /// The library's name for it (selection, whether it reduces).
    pub kind: oxccl_collectives::Collective,
    /// Whether `--tune` measures its selector (`Communicator::tune` tunes allreduce only).
    pub tunable: bool,
    /// The call's count for a swept size of `elements` elements on `world` ranks.
    pub count_for: fn(elements: usize, world: u32) -> usize,
    /// Elements of one rank's send buffer for a call of `count`.
    pub send_elements: fn(count: usize, world: u32) -> usize,
    /// Slots of `count` elements in one rank's receive buffer.
    pub recv_slots: fn(world: u32) -> usize,
    /// busbw / algbw on `world` ranks.
    pub bus_factor: fn(world: u32) -> f64,
    /// In place: the input's and the output's offsets in the receive buffer, in elements
    /// per rank (nccl-tests' `sendInplaceOffset` and `recvInplaceOffset`).
    pub in_place_strides: fn(count: usize) -> (usize, usize),
    /// Checks one rank's output against the host reference (`exact`: count elements that
    /// differ; otherwise only the error is measured).
    pub check: fn(&Expect, out: &[u8], exact: bool) -> Verdict,
    /// Checks the output after `calls` more in-place calls on an output whose checked
    /// elements were `first` ([`check::checked_values`]).
    pub check_repeated: fn(&Expect, first: &[u64], out: &[u8], calls: usize) -> Mismatches,
    /// Whether the back-to-back check repeats the call in place on its own output
    /// (allreduce, allgather: the output stays where it is in place). Otherwise it repeats
    /// the checked call itself, whose output must then stay as it was; that needs the
    /// input untouched by the call, so a reduce-scatter in place (its output is a chunk of
    /// its input) gets no back-to-back check.
    pub repeat_in_place: bool,
    /// Whether NCCL defines an in-place form (`--in-place` is refused without one).
    pub has_in_place: bool,
    /// Queues one oxccl call.
    ///
    /// # Safety
    /// The call's buffers hold what it reads and writes (see [`Collective::shape`]) on the
    /// communicator's device and outlive the stream's work.
    pub oxccl: unsafe fn(&Communicator, &Call<'_>) -> Result<()>,
    /// Whether NCCL can run it for this type and accumulation.
    pub nccl_supports: fn(&crate::vendor::Nccl, DataType, AccumType) -> bool,
    /// Queues one NCCL call (buffers as for `oxccl`).
    pub nccl: fn(&crate::vendor::Nccl, &Call<'_>) -> Result<()>,
    /// Whether NCCL (2.27+) has symmetric-memory kernels for it, so `--compare nccl` also
    /// measures it on buffers in symmetric windows (allreduce, allgather, reducescatter).
    pub nccl_symmetric: bool,
}

/// Allreduce: send and receive `count` elements; nothing moves in place.
pub const ALL_REDUCE: Collective = Collective {
    name: "allreduce",
    kind: oxccl_collectives::Collective::AllReduce,
    tunable: true,
    count_for: |elements, _| elements,
    send_elements: |count, _| count,
    recv_slots: |_| 1,
    bus_factor: |world| {
        let n = f64::from(world.max(1));
        2.0 * (n - 1.0) / n
    },
    in_place_strides: |_| (0, 0),
    check: check::reduced,
    check_repeated: check::repeated_reduction,
    repeat_in_place: true,
    has_in_place: true,
    oxccl: all_reduce,
    nccl_supports: crate::vendor::Nccl::supports_reduction,
    nccl: crate::vendor::Nccl::all_reduce,
    nccl_symmetric: true,
};

/// Allgather: send `count` elements, receive `world * count` (every rank's input in rank
/// order); in place the input is this rank's slot of the output.
pub const ALL_GATHER: Collective = Collective {
    name: "allgather",
    kind: oxccl_collectives::Collective::AllGather,
    tunable: false,
    count_for: |elements, world| elements / world.max(1) as usize,
    send_elements: |count, _| count,
    recv_slots: |world| world as usize,
    bus_factor: |world| {
        let n = f64::from(world.max(1));
        (n - 1.0) / n
    },
    in_place_strides: |count| (count, 0),
    check: check::gathered,
    check_repeated: check::unchanged,
    repeat_in_place: true,
    has_in_place: true,
    oxccl: all_gather,
    nccl_supports: crate::vendor::Nccl::supports_move,
    nccl: crate::vendor::Nccl::all_gather,
    nccl_symmetric: true,
};

/// Reduce-scatter: send `world * count` elements, receive `count` (the reduction of chunk
/// `rank` of every rank's input); nccl-tests' size is the send buffer. In place the output
/// is this rank's chunk of the input (nccl-tests' recvInplaceOffset).
pub const REDUCE_SCATTER: Collective = Collective {
    name: "reducescatter",
    kind: oxccl_collectives::Collective::ReduceScatter,
    tunable: false,
    count_for: |elements, world| elements / world.max(1) as usize,
    send_elements: |count, world| count * world as usize,
    recv_slots: |_| 1,
    bus_factor: |world| {
        let n = f64::from(world.max(1));
        (n - 1.0) / n
    },
    in_place_strides: |count| (0, count),
    check: check::reduced_chunk,
    check_repeated: check::unchanged,
    repeat_in_place: false,
    has_in_place: true,
    oxccl: reduce_scatter,
    nccl_supports: crate::vendor::Nccl::supports_reduction,
    nccl: crate::vendor::Nccl::reduce_scatter,
    nccl_symmetric: true,
};

/// All-to-all: send and receive `world * count` elements (chunk p goes to rank p, slot r
/// comes from rank r); nccl-tests' size is either buffer. No in-place form.
pub const ALL_TO_ALL: Collective = Collective {
    name: "alltoall",
    kind: oxccl_collectives::Collective::AllToAll,
    tunable: false,
    count_for: |elements, world| elements / world.max(1) as usize,
    send_elements: |count, world| count * world as usize,
    recv_slots: |world| world as usize,
    bus_factor: |world| {
        let n = f64::from(world.max(1));
        (n - 1.0) / n
    },
    in_place_strides: |_| (0, 0),
    check: check::exchanged,
    check_repeated: check::unchanged,
    repeat_in_place: false,
    has_in_place: false,
    oxccl: all_to_all,
    nccl_supports: crate::vendor::Nccl::supports_move,
    nccl: crate::vendor::Nccl::all_to_all,
    nccl_symmetric: false,
};

/// All-to-all-v: the all-to-all's buffers (`world * count` elements, chunk p at `p *
/// count`), but rank r sends rank p only [`v_count`]`(count, r, p)` elements of its chunk,
/// between half of `count` and all of it, so every pair moves its own size; the rest of each
/// receive slot keeps the poison. The size column and the bus bandwidth are the
/// all-to-all's (the buffers'), so they overstate the bytes moved by up to a quarter; the
/// comparison is NCCL's grouped send/receive of exactly the same counts (what PyTorch's
/// `all_to_all_single` with uneven splits issues).
pub const ALL_TO_ALL_V: Collective = Collective {
    name: "alltoallv",
    kind: oxccl_collectives::Collective::AllToAllV,
    check: check::exchanged_v,
    oxccl: all_to_all_v,
    nccl: crate::vendor::Nccl::all_to_all_v,
    ..ALL_TO_ALL
};

/// Elements rank `from` sends rank `to` in an `alltoallv` row of `count`: `count` less
/// 0, 1 or 2 quarters of it, by `(from + 2 * to) % 3`.
pub fn v_count(count: usize, from: u32, to: u32) -> usize {
    count - (((from + 2 * to) % 3) as usize) * (count / 4)
}

/// Broadcast from `--root`: send and receive `count` elements; busbw = algbw (nccl-tests:
/// every byte crosses a link once). In place one buffer.
pub const BROADCAST: Collective = Collective {
    name: "broadcast",
    kind: oxccl_collectives::Collective::Broadcast,
    tunable: false,
    count_for: |elements, _| elements,
    send_elements: |count, _| count,
    recv_slots: |_| 1,
    bus_factor: |_| 1.0,
    in_place_strides: |_| (0, 0),
    check: check::broadcasted,
    check_repeated: check::unchanged,
    repeat_in_place: false,
    has_in_place: true,
    oxccl: broadcast,
    nccl_supports: crate::vendor::Nccl::supports_move,
    nccl: crate::vendor::Nccl::broadcast,
    nccl_symmetric: false,
};

/// Reduce to `--root`: send and receive `count` elements (the receive buffer matters at the
/// root only); busbw = algbw (nccl-tests: every byte crosses a link once). In place one
/// buffer.
pub const REDUCE: Collective = Collective {
    name: "reduce",
    kind: oxccl_collectives::Collective::Reduce,
    tunable: false,
    count_for: |elements, _| elements,
    send_elements: |count, _| count,
    recv_slots: |_| 1,
    bus_factor: |_| 1.0,
    in_place_strides: |_| (0, 0),
    check: check::reduced_at_root,
    check_repeated: check::unchanged,
    repeat_in_place: false,
    has_in_place: true,
    oxccl: reduce,
    nccl_supports: crate::vendor::Nccl::supports_reduction,
    nccl: crate::vendor::Nccl::reduce,
    nccl_symmetric: false,
};

/// Every collective `-c` takes; the first is the default.
pub const COLLECTIVES: &[&Collective] = &[
    &ALL_REDUCE,
    &ALL_GATHER,
    &REDUCE_SCATTER,
    &ALL_TO_ALL,
    &ALL_TO_ALL_V,
    &BROADCAST,
    &REDUCE,
];

/// The collective called `name` ("allgather", also "all_gather", "all-gather", any case).
pub fn by_name(name: &str) -> Option<&'static Collective> {
    let plain: String = name
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .collect::<String>()
        .to_ascii_lowercase();
    COLLECTIVES.iter().copied().find(|c| c.name == plain)
}

/// The names `-c` takes, for messages.
pub fn names() -> String {
    COLLECTIVES
        .iter()
        .map(|c| c.name)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Collective {
    /// Whether it takes an op and an accumulation type.
    pub fn reduces(&self) -> bool {
        self.kind.reduces()
    }

    /// The buffers of one row for a swept size of `bytes` on `world` ranks: at least one
    /// element per call (nccl-tests would run an empty call below that).
    pub fn shape(&self, bytes: usize, dtype: DataType, world: u32) -> Result<Shape> {
        let count = (self.count_for)(bytes / dtype.size(), world).max(1);
        let send_bytes = dtype.bytes((self.send_elements)(count, world))?;
        let recv_bytes =
            dtype.bytes(count.checked_mul((self.recv_slots)(world)).ok_or_else(|| {
                oxccl_collectives::hal::Error::InvalidArgument(format!(
                    "{}: {count} elements x {world} ranks overflow",
                    self.name
                ))
            })?)?;
        Ok(Shape {
            count,
            send_bytes,
            recv_bytes,
            size: send_bytes.max(recv_bytes),
        })
    }

    /// This rank's (input, output) for a call of `count`: the two buffers out of place;
    /// in place both inside the receive buffer at the in-place offsets.
    pub fn pointers(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        rank: u32,
        in_place: bool,
    ) -> Result<(DevicePtr, DevicePtr)> {
        if !in_place {
            return Ok((send, recv));
        }
        let (si, ri) = (self.in_place_strides)(count);
        let at = |stride: usize| -> Result<DevicePtr> {
            let elements = stride.checked_mul(rank as usize).ok_or_else(|| {
                oxccl_collectives::hal::Error::InvalidArgument(format!(
                    "{}: in-place offset overflows",
                    self.name
                ))
            })?;
            recv.offset(dtype.bytes(elements)?)
        };
        Ok((at(si)?, at(ri)?))
    }
}

/// # Safety
/// As [`Collective::oxccl`].
unsafe fn all_reduce(comm: &Communicator, c: &Call<'_>) -> Result<()> {
    // SAFETY: the caller's obligations: both buffers hold `count` elements.
    unsafe { comm.all_reduce(c.input, c.output, c.count, c.dtype, c.op, c.accum, c.stream) }
}

/// # Safety
/// As [`Collective::oxccl`].
unsafe fn all_gather(comm: &Communicator, c: &Call<'_>) -> Result<()> {
    // SAFETY: the caller's obligations: the input holds `count` elements, the output
    // `world * count`.
    unsafe { comm.all_gather(c.input, c.output, c.count, c.dtype, c.stream) }
}

/// # Safety
/// As [`Collective::oxccl`].
unsafe fn reduce_scatter(comm: &Communicator, c: &Call<'_>) -> Result<()> {
    // SAFETY: the caller's obligations: the input holds `world * count` elements, the
    // output `count`.
    unsafe { comm.reduce_scatter(c.input, c.output, c.count, c.dtype, c.op, c.accum, c.stream) }
}

/// # Safety
/// As [`Collective::oxccl`].
unsafe fn all_to_all(comm: &Communicator, c: &Call<'_>) -> Result<()> {
    // SAFETY: the caller's obligations: both buffers hold `world * count` elements.
    unsafe { comm.all_to_all(c.input, c.output, c.count, c.dtype, c.stream) }
}

/// # Safety
/// As [`Collective::oxccl`].
unsafe fn all_to_all_v(comm: &Communicator, c: &Call<'_>) -> Result<()> {
    let (me, world) = (comm.rank(), comm.world_size());
    let send: Vec<usize> = (0..world).map(|p| v_count(c.count, me, p)).collect();
    let recv: Vec<usize> = (0..world).map(|q| v_count(c.count, q, me)).collect();
    let slots: Vec<usize> = (0..world as usize).map(|p| p * c.count).collect();
    // SAFETY: the caller's obligations: both buffers hold `world * count` elements, and
    // every range lies inside its chunk.
    unsafe {
        comm.all_to_all_v(
            c.input, &send, &slots, c.output, &recv, &slots, c.dtype, c.stream,
        )
    }
}

/// # Safety
/// As [`Collective::oxccl`].
unsafe fn broadcast(comm: &Communicator, c: &Call<'_>) -> Result<()> {
    // SAFETY: the caller's obligations: both buffers hold `count` elements.
    unsafe { comm.broadcast(c.input, c.output, c.count, c.dtype, c.root, c.stream) }
}

/// # Safety
/// As [`Collective::oxccl`].
unsafe fn reduce(comm: &Communicator, c: &Call<'_>) -> Result<()> {
    // SAFETY: the caller's obligations: both buffers hold `count` elements.
    unsafe {
        comm.reduce(
            c.input, c.output, c.count, c.dtype, c.op, c.accum, c.root, c.stream,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve() {
        for (s, want) in [
            ("allreduce", "allreduce"),
            ("AllReduce", "allreduce"),
            ("all_gather", "allgather"),
            ("all-gather", "allgather"),
            ("ALLGATHER", "allgather"),
        ] {
            assert_eq!(by_name(s).map(|c| c.name), Some(want), "{s}");
        }
        assert_eq!(by_name("reduce").map(|c| c.name), Some("reduce"));
        assert!(by_name("gather").is_none());
        assert!(by_name("").is_none());
        assert_eq!(
            names(),
            "allreduce, allgather, reducescatter, alltoall, alltoallv, broadcast, reduce"
        );
        assert_eq!(by_name("all_to_all_v").map(|c| c.name), Some("alltoallv"));
        assert_eq!(COLLECTIVES[0].name, "allreduce");
        assert!(ALL_REDUCE.reduces() && !ALL_GATHER.reduces() && REDUCE.reduces());
    }

    #[test]
    fn alltoallv_counts_are_uneven_and_within_the_chunk() {
        // count less 0, 1 or 2 quarters, by (from + 2 * to) % 3.
        assert_eq!(v_count(1000, 0, 0), 1000);
        assert_eq!(v_count(1000, 1, 0), 750);
        assert_eq!(v_count(1000, 0, 1), 500);
        assert_eq!(v_count(1000, 1, 1), 1000);
        // Tiny counts keep every element (a quarter rounds to nothing).
        assert_eq!(v_count(3, 0, 1), 3);
        for from in 0..8 {
            for to in 0..8 {
                let c = v_count(12_345, from, to);
                assert!((12_345 / 2..=12_345).contains(&c), "{from} -> {to}: {c}");
            }
        }
    }

    #[test]
    fn shapes_follow_nccl_tests() {
        let bf16 = DataType::Bf16;
        // Allreduce: the swept size is the message; odd bytes round down to elements.
        let s = ALL_REDUCE.shape(1001, bf16, 4).unwrap();
        assert_eq!(
            (s.count, s.send_bytes, s.recv_bytes, s.size),
            (500, 1000, 1000, 1000)
        );
        // Allgather: the swept size is the gathered output; the count per rank rounds down.
        let s = ALL_GATHER.shape(1000, bf16, 4).unwrap();
        assert_eq!(
            (s.count, s.send_bytes, s.recv_bytes, s.size),
            (125, 250, 1000, 1000)
        );
        let s = ALL_GATHER.shape(1006, bf16, 4).unwrap();
        assert_eq!((s.count, s.size), (125, 1000));
        let s = ALL_GATHER.shape(100_000, DataType::F32, 3).unwrap();
        assert_eq!((s.count, s.send_bytes, s.size), (8333, 33_332, 99_996));
        // Below one element per rank: one element each.
        let s = ALL_GATHER.shape(2, DataType::F32, 8).unwrap();
        assert_eq!((s.count, s.send_bytes, s.recv_bytes), (1, 4, 32));
    }

    #[test]
    fn bus_factors() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        for (n, ar, ag) in [
            (1, 0.0, 0.0),
            (2, 1.0, 0.5),
            (4, 1.5, 0.75),
            (8, 1.75, 0.875),
        ] {
            assert!(close((ALL_REDUCE.bus_factor)(n), ar), "allreduce {n}");
            assert!(close((ALL_GATHER.bus_factor)(n), ag), "allgather {n}");
        }
    }

    #[test]
    fn in_place_pointers() {
        let (send, recv) = (DevicePtr(0x10_0000), DevicePtr(0x20_0000));
        let f32 = DataType::F32;
        // Out of place: the two buffers, whatever the collective.
        for c in COLLECTIVES {
            assert_eq!(
                c.pointers(send, recv, 100, f32, 3, false).unwrap(),
                (send, recv)
            );
        }
        // In place: allreduce on the receive buffer; allgather's input is the rank's slot.
        assert_eq!(
            ALL_REDUCE.pointers(send, recv, 100, f32, 3, true).unwrap(),
            (recv, recv)
        );
        assert_eq!(
            ALL_GATHER.pointers(send, recv, 100, f32, 3, true).unwrap(),
            (DevicePtr(0x20_0000 + 3 * 400), recv)
        );
        assert_eq!(
            ALL_GATHER.pointers(send, recv, 100, f32, 0, true).unwrap(),
            (recv, recv)
        );
    }
}
