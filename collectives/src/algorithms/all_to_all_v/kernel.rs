//! The argument block of all_to_all_v's SM kernels ([`OxcclAlltoallvArgs`]: the scratch
//! kernels' block and the call's layout in bytes): its launch, shared by
//! `alltoallv_oneshot_ll` and `alltoallv_direct`, and its reading by their host stand-ins.

use std::ffi::c_void;

use oxccl_backend::AnyStream;
use oxccl_hal::{DataType, Error, Result};
use oxccl_kernels::abi::{self, OxcclAlltoallvArgs, OXCCL_ALLREDUCE_MAX_RANKS};

use super::{needs_layout, VInstance, VLayout};
use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{Algorithm, Call, Instance, Plan, SetupContext};
use crate::host_kernels;
use crate::scratch::FlagRegion;

/// An all_to_all_v algorithm whose one kernel takes the layout in its argument block.
#[derive(Debug)]
pub(crate) struct VKernel {
    kernel: ScratchKernel,
}

impl VKernel {
    /// The setup of both SM algorithms, unless another one is forced: their kernel,
    /// launched through the shared scratch like every scratch kernel.
    pub(crate) fn setup(
        ctx: &SetupContext<'_>,
        me: Algorithm,
    ) -> Result<Option<Box<dyn Instance>>> {
        if !ctx.wanted(me) {
            return Ok(None);
        }
        let kernel = ScratchKernel::load(ctx, me, FlagRegion::Packets)?;
        Ok(Some(Box::new(VKernel { kernel })))
    }
}

/// The layout's arrays as the argument block carries them (index = peer), or why a value
/// does not fit (a world larger than the block's ranks).
fn arrays(layout: &VLayout) -> Result<[[u64; OXCCL_ALLREDUCE_MAX_RANKS as usize]; 5]> {
    let n = layout.send.len();
    if n > OXCCL_ALLREDUCE_MAX_RANKS as usize || layout.recv.len() != n || layout.remote.len() != n
    {
        return Err(Error::InvalidArgument(format!(
            "all_to_all_v: a layout of {n} ranks (at most {OXCCL_ALLREDUCE_MAX_RANKS})"
        )));
    }
    let mut a = [[0u64; OXCCL_ALLREDUCE_MAX_RANKS as usize]; 5];
    let chunks = layout.send.iter().zip(&layout.recv).zip(&layout.remote);
    for (p, ((send, recv), remote)) in chunks.enumerate() {
        a[0][p] = send.0 as u64;
        a[1][p] = send.1 as u64;
        a[2][p] = recv.0 as u64;
        a[3][p] = recv.1 as u64;
        a[4][p] = *remote as u64;
    }
    Ok(a)
}

impl Instance for VKernel {
    unsafe fn launch(&self, call: &Call, _: &Plan, _: &AnyStream) -> Result<()> {
        Err(needs_layout(call, "this all_to_all_v kernel"))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl VInstance for VKernel {
    unsafe fn launch_v(
        &self,
        call: &Call,
        plan: &Plan,
        layout: &VLayout,
        stream: &AnyStream,
    ) -> Result<()> {
        let mut base = self.kernel.args(call)?;
        // The kernels move bytes: `count` is what this rank sends in all (abi_allreduce.h).
        base.count = layout.send.iter().map(|s| s.1 as u64).sum();
        base.dtype = DataType::U8.code();
        let [send_offset, send_bytes, recv_offset, recv_bytes, remote_offset] = arrays(layout)?;
        let args = OxcclAlltoallvArgs {
            base,
            send_offset,
            send_bytes,
            recv_offset,
            recv_bytes,
            remote_offset,
        };
        // SAFETY: the caller's obligations (this trait method's contract) cover the call's
        // buffers and the layout's ranges inside them; the block is the one both kernels
        // take.
        unsafe { self.kernel.launch_args(&args, plan, stream) }
    }
}

/// A host stand-in's view of an all_to_all_v argument block: the checked base block and
/// the layout.
pub(crate) struct VCall {
    pub(crate) c: host_kernels::Call,
    pub(crate) v: OxcclAlltoallvArgs,
}

impl VCall {
    /// Parses and checks a launch's bytes (the base block as [`host_kernels::Call::new`]
    /// does, and every chunk's size against the address space).
    pub(crate) fn new(bytes: &[u8], kernel: &'static str) -> Result<VCall> {
        let v: OxcclAlltoallvArgs = abi::parse_args(bytes, kernel)?;
        let c = host_kernels::Call::from_args(v.base, kernel)?;
        let fields = [
            v.send_offset,
            v.send_bytes,
            v.recv_offset,
            v.recv_bytes,
            v.remote_offset,
        ];
        if fields
            .iter()
            .flatten()
            .any(|x| usize::try_from(*x).is_err())
        {
            return Err(Error::InvalidArgument(format!(
                "{kernel}: a layout value beyond this machine's address space"
            )));
        }
        Ok(VCall { c, v })
    }

    /// Bytes this rank sends to rank `p`.
    pub(crate) fn send_bytes(&self, p: usize) -> usize {
        self.v.send_bytes[p] as usize
    }

    /// Bytes this rank receives from rank `r`.
    pub(crate) fn recv_bytes(&self, r: usize) -> usize {
        self.v.recv_bytes[r] as usize
    }

    /// Bytes [off, off + 16) of this rank's chunk for `p`; bytes past it are zero.
    pub(crate) fn load_send(&self, p: usize, off: usize) -> [u8; 16] {
        let base = self
            .c
            .a
            .input
            .cast::<u8>()
            .wrapping_add(self.v.send_offset[p] as usize);
        // SAFETY: launch contract: the chunk for p, send_bytes[p] long at send_offset[p],
        // lies inside this rank's input.
        unsafe { host_kernels::read_unit(base.cast(), self.send_bytes(p), off) }
    }

    /// Stores the part of `v` inside the chunk from rank `r` in this rank's output.
    pub(crate) fn store_recv(&self, r: usize, off: usize, v: &[u8; 16]) {
        let base = self
            .c
            .a
            .output
            .cast::<u8>()
            .wrapping_add(self.v.recv_offset[r] as usize);
        // SAFETY: launch contract: the chunk from r, recv_bytes[r] long at recv_offset[r],
        // lies inside this rank's output, which only this call writes while it runs.
        unsafe { host_kernels::write_unit(base.cast(), self.recv_bytes(r), off, v) }
    }

    /// Where this rank's chunk lands in rank `p`'s output as mapped here (`peer_output[p]`
    /// at `remote_offset[p]`).
    pub(crate) fn remote(&self, p: usize) -> *mut c_void {
        self.c.a.peer_output[p]
            .cast::<u8>()
            .wrapping_add(self.v.remote_offset[p] as usize)
            .cast()
    }
}
