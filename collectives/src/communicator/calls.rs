//! The collectives a [`Communicator`] serves, one public method each with NCCL's
//! semantics, and the PreMulSum forms of the reducing ones ([`super::premul`]): every one
//! checks its arguments and runs through the one path (entry check, selector, first-call
//! signature check, launch).

use oxccl_hal::{AccumType, DataType, DevicePtr, ReduceOp, Result};

use super::premul::PreMul;
use super::Communicator;
use crate::algorithms::Collective;
use crate::backend::AnyStream;

impl Communicator {
    /// Allreduce of `count` elements: `output[i] = op(input_0[i], ..., input_{n-1}[i])` on
    /// every rank, reduced in rank order with the accumulation type (so every rank gets
    /// the same bits). In place when `input == output`. `count == 0` does nothing.
    ///
    /// Errors (before any launch): overflowing sizes, null or element-misaligned pointers,
    /// partially overlapping buffers, unsupported type combinations (f32 data with an f16
    /// accumulator), a forced algorithm that cannot serve the call, and, on the first call
    /// of a signature, a different call on another rank. Non-16-byte-aligned buffers are
    /// served (the kernels fall back to byte accesses for those units), only slower.
    ///
    /// # Safety
    /// `input` and `output` must be device memory of this communicator's device holding
    /// `count` elements of `dtype`, live until the work queued on `stream` completes; no
    /// other work may write them meanwhile. Every rank must make the same sequence of
    /// calls, ordered on one stream per rank.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        accum: AccumType,
        stream: &AnyStream,
    ) -> Result<()> {
        // SAFETY: the caller's obligations (this function's contract).
        unsafe {
            self.run(
                Collective::AllReduce,
                input,
                output,
                count,
                dtype,
                (op, accum, 0),
                None,
                stream,
            )
        }
    }

    /// All-gather of `count` elements per rank: rank r's input lands at element
    /// `r * count` of every rank's output, which holds `world_size * count` elements. In
    /// place when `input` is this rank's slot of the output (`output + rank * count`
    /// elements), as NCCL defines it. Data only moves, so every data type is served alike.
    /// `count == 0` does nothing.
    ///
    /// Errors (before any launch): as [`Communicator::all_reduce`]; an input that overlaps
    /// the output anywhere but at this rank's slot is refused.
    ///
    /// # Safety
    /// `input` must be device memory of this communicator's device holding `count`
    /// elements, `output` `world_size * count`, both live until the work queued on
    /// `stream` completes; no other work may write them meanwhile. Every rank must make
    /// the same sequence of calls, ordered on one stream per rank.
    pub unsafe fn all_gather(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DataType,
        stream: &AnyStream,
    ) -> Result<()> {
        // SAFETY: the caller's obligations (this function's contract).
        unsafe {
            self.run(
                Collective::AllGather,
                input,
                output,
                count,
                dtype,
                (ReduceOp::Sum, AccumType::Auto, 0),
                None,
                stream,
            )
        }
    }

    /// Reduce-scatter: rank r's output (`count` elements) gets the reduction, in rank
    /// order, of elements `[r * count, (r + 1) * count)` of every rank's input, which holds
    /// `world_size * count` elements (every rank gets the bits of the host reference). In
    /// place when `output` is this rank's chunk of the input (`input + rank * count`
    /// elements), as NCCL defines it. `count == 0` does nothing.
    ///
    /// Errors (before any launch): as [`Communicator::all_reduce`]; an output that overlaps
    /// the input anywhere but at this rank's chunk is refused.
    ///
    /// # Safety
    /// `input` must be device memory of this communicator's device holding
    /// `world_size * count` elements, `output` `count`, both live until the work queued on
    /// `stream` completes; no other work may write them meanwhile. Every rank must make
    /// the same sequence of calls, ordered on one stream per rank.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_scatter(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        accum: AccumType,
        stream: &AnyStream,
    ) -> Result<()> {
        // SAFETY: the caller's obligations (this function's contract).
        unsafe {
            self.run(
                Collective::ReduceScatter,
                input,
                output,
                count,
                dtype,
                (op, accum, 0),
                None,
                stream,
            )
        }
    }

    /// All-to-all with equal counts: chunk p (elements `[p * count, (p + 1) * count)`) of
    /// every rank r's input lands in slot r (the same elements) of rank p's output; both
    /// hold `world_size * count` elements and must not overlap (NCCL defines no in-place
    /// all-to-all). Data only moves, so every data type is served alike. `count == 0` does
    /// nothing.
    ///
    /// Errors (before any launch): as [`Communicator::all_reduce`], and overlapping buffers.
    ///
    /// # Safety
    /// `input` and `output` must be device memory of this communicator's device holding
    /// `world_size * count` elements each, live until the work queued on `stream`
    /// completes; no other work may write them meanwhile. Every rank must make the same
    /// sequence of calls, ordered on one stream per rank.
    pub unsafe fn all_to_all(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DataType,
        stream: &AnyStream,
    ) -> Result<()> {
        // SAFETY: the caller's obligations (this function's contract).
        unsafe {
            self.run(
                Collective::AllToAll,
                input,
                output,
                count,
                dtype,
                (ReduceOp::Sum, AccumType::Auto, 0),
                None,
                stream,
            )
        }
    }

    /// Broadcast: every rank's output (`count` elements) gets the input of rank `root`. In
    /// place when `input == output` (NCCL's `ncclBcast`); only the root's input is read,
    /// the other ranks' is ignored (it may be null). `count == 0` does nothing.
    ///
    /// Errors (before any launch): as [`Communicator::all_reduce`], and a root that is not
    /// a rank.
    ///
    /// # Safety
    /// `output` (and on the root `input`) must be device memory of this communicator's
    /// device holding `count` elements, live until the work queued on `stream` completes;
    /// no other work may write them meanwhile. Every rank must make the same sequence of
    /// calls, with the same root, ordered on one stream per rank.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn broadcast(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DataType,
        root: u32,
        stream: &AnyStream,
    ) -> Result<()> {
        // SAFETY: the caller's obligations (this function's contract).
        unsafe {
            self.run(
                Collective::Broadcast,
                input,
                output,
                count,
                dtype,
                (ReduceOp::Sum, AccumType::Auto, root),
                None,
                stream,
            )
        }
    }

    /// Reduce: the output of rank `root` (`count` elements) gets the reduction, in rank
    /// order, of every rank's input (`count` elements each) with the accumulation type, so
    /// the root gets the bits of the host reference (as [`Communicator::all_reduce`]). In
    /// place when `input == output` on the root; only the root's output is written, the
    /// other ranks' is ignored (it may be null). `count == 0` does nothing.
    ///
    /// Errors (before any launch): as [`Communicator::all_reduce`], and a root that is not
    /// a rank.
    ///
    /// # Safety
    /// `input` (and on the root `output`) must be device memory of this communicator's
    /// device holding `count` elements of `dtype`, live until the work queued on `stream`
    /// completes; no other work may write them meanwhile. Every rank must make the same
    /// sequence of calls, with the same root, ordered on one stream per rank.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        accum: AccumType,
        root: u32,
        stream: &AnyStream,
    ) -> Result<()> {
        // SAFETY: the caller's obligations (this function's contract).
        unsafe {
            self.run(
                Collective::Reduce,
                input,
                output,
                count,
                dtype,
                (op, accum, root),
                None,
                stream,
            )
        }
    }

    /// [`Communicator::all_reduce`] with NCCL's PreMulSum operator: `output[i] =
    /// scalar_0 * input_0[i] + ... + scalar_{n-1} * input_{n-1}[i]`, each rank's own input
    /// times its own scalar (an element of `dtype`, on the host or in device memory, see
    /// [`PreMul`]), each product rounded to `dtype` (integers wrap), then summed as
    /// [`Communicator::all_reduce`] sums with `accum`. The products are written into
    /// `output` first (no memory of its own); in place when `input == output`.
    ///
    /// Errors: as [`Communicator::all_reduce`].
    ///
    /// # Safety
    /// As [`Communicator::all_reduce`]; a [`PreMul::Device`] scalar must be device memory
    /// of this communicator's device holding one element of `dtype`, live until the work
    /// queued on `stream` completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce_premul(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DataType,
        scalar: PreMul,
        accum: AccumType,
        stream: &AnyStream,
    ) -> Result<()> {
        // SAFETY: the caller's obligations (this function's contract).
        unsafe {
            self.run(
                Collective::AllReduce,
                input,
                output,
                count,
                dtype,
                (ReduceOp::Sum, accum, 0),
                Some(scalar),
                stream,
            )
        }
    }

    /// [`Communicator::reduce_scatter`] with NCCL's PreMulSum operator: every rank's whole
    /// input is multiplied by its own scalar (see [`Communicator::all_reduce_premul`]) into
    /// a buffer of the communicator's (the caller's input is not written), then
    /// reduce-scattered as a sum. In place as [`Communicator::reduce_scatter`].
    ///
    /// Errors: as [`Communicator::reduce_scatter`].
    ///
    /// # Safety
    /// As [`Communicator::reduce_scatter`], and the scalar as in
    /// [`Communicator::all_reduce_premul`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_scatter_premul(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DataType,
        scalar: PreMul,
        accum: AccumType,
        stream: &AnyStream,
    ) -> Result<()> {
        // SAFETY: the caller's obligations (this function's contract).
        unsafe {
            self.run(
                Collective::ReduceScatter,
                input,
                output,
                count,
                dtype,
                (ReduceOp::Sum, accum, 0),
                Some(scalar),
                stream,
            )
        }
    }

    /// [`Communicator::reduce`] with NCCL's PreMulSum operator: every rank's input is
    /// multiplied by its own scalar (see [`Communicator::all_reduce_premul`]) into a buffer
    /// of the communicator's (the caller's input is not written), then reduced to `root`
    /// as a sum. Only the root's output is written, as [`Communicator::reduce`].
    ///
    /// Errors: as [`Communicator::reduce`].
    ///
    /// # Safety
    /// As [`Communicator::reduce`], and the scalar as in
    /// [`Communicator::all_reduce_premul`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_premul(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DataType,
        scalar: PreMul,
        accum: AccumType,
        root: u32,
        stream: &AnyStream,
    ) -> Result<()> {
        // SAFETY: the caller's obligations (this function's contract).
        unsafe {
            self.run(
                Collective::Reduce,
                input,
                output,
                count,
                dtype,
                (ReduceOp::Sum, accum, root),
                Some(scalar),
                stream,
            )
        }
    }
}
