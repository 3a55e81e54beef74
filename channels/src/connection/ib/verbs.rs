//! The InfiniBand transport on rdma-core's verbs (see the parent module for the design).

use std::ffi::CStr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;
use oxccl_hal::{DevicePtr, Error, Result};

use super::{GID_INDEX_VAR, HCA_VAR, NO_DEVICE};
use crate::bootstrap::Bootstrap;
use crate::connection::{check_update, check_write, Transport};
use crate::registered_memory::{Reader, RegisteredMemory, RemoteMemory};

/// Send requests a queue pair may have outstanding; `write` waits for completions beyond.
const MAX_SEND_WR: u32 = 512;
/// Completion queue entries (at least the send queue depth).
const CQ_DEPTH: i32 = 1024;
/// Largest single RDMA write; longer writes are split.
const MAX_MESSAGE: usize = 1 << 30;
/// Bytes the queue pair must be able to send inline (the update value).
const INLINE_BYTES: u32 = 64;
const ENDPOINT_MAGIC: &[u8; 4] = b"OXIB";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the state consistent between statements.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn errno(call: &'static str, code: i32) -> Error {
    Error::Os {
        call,
        source: std::io::Error::from_raw_os_error(code),
    }
}

/// The process's RDMA device: context, port and protection domain, opened once.
struct IbContext {
    ctx: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
    port: u8,
    lid: u16,
    mtu: ffi::ibv_mtu,
    /// The GID to route by (RoCE, or a fabric that needs global routing).
    gid: Option<([u8; 16], u8)>,
    name: String,
}

// SAFETY: verbs objects may be used from any thread (rdma-core's verbs are thread-safe);
// the context is never closed while the process runs.
unsafe impl Send for IbContext {}
// SAFETY: as above; no method mutates the struct.
unsafe impl Sync for IbContext {}

fn context() -> Result<Arc<IbContext>> {
    static CONTEXT: OnceLock<std::result::Result<Arc<IbContext>, String>> = OnceLock::new();
    CONTEXT
        .get_or_init(|| open_context().map(Arc::new))
        .clone()
        .map_err(Error::Unsupported)
}

/// Whether this process has a usable RDMA device.
pub fn available() -> bool {
    context().is_ok()
}

fn open_context() -> std::result::Result<IbContext, String> {
    let wanted = std::env::var(HCA_VAR).ok();
    let (wanted_name, wanted_port) = match wanted.as_deref().map(|w| w.split_once(':')) {
        Some(Some((n, p))) => (
            Some(n.to_string()),
            Some(
                p.parse::<u8>()
                    .map_err(|_| format!("{HCA_VAR}: bad port '{p}'"))?,
            ),
        ),
        Some(None) => (wanted.clone(), None),
        None => (None, None),
    };
    let mut count = 0i32;
    // SAFETY: `count` is a valid out-pointer; the list is freed below.
    let list = unsafe { ffi::ibv_get_device_list(&mut count) };
    if list.is_null() {
        return Err(format!(
            "{NO_DEVICE} (ibv_get_device_list: {})",
            std::io::Error::last_os_error()
        ));
    }
    let count = usize::try_from(count).unwrap_or(0);
    let mut chosen = None;
    let mut names = Vec::new();
    for i in 0..count {
        // SAFETY: the list holds `count` device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: a device of the list; the name is a NUL-terminated string owned by it.
        let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(dev)) }
            .to_string_lossy()
            .into_owned();
        if chosen.is_none() && wanted_name.as_ref().is_none_or(|w| *w == name) {
            chosen = Some((dev, name.clone()));
        }
        names.push(name);
    }
    let opened = chosen.map(|(dev, name)| {
        // SAFETY: a device of the list, opened before the list is freed.
        (unsafe { ffi::ibv_open_device(dev) }, name)
    });
    // SAFETY: the list came from ibv_get_device_list and is freed once; the opened context
    // stays valid after it.
    unsafe { ffi::ibv_free_device_list(list) };
    let Some((ctx, name)) = opened else {
        return Err(match wanted_name {
            Some(w) if count > 0 => format!("{NO_DEVICE}: {HCA_VAR}={w}, devices are {names:?}"),
            _ => NO_DEVICE.to_string(),
        });
    };
    if ctx.is_null() {
        return Err(format!(
            "{NO_DEVICE}: opening {name} failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    let port = wanted_port.unwrap_or(1);
    let mut attr = ffi::ibv_port_attr::default();
    // SAFETY: an open context and a zeroed attribute struct to fill (the exported symbol
    // fills the fields of the compatible prefix, which are the ones read below).
    let rc = unsafe {
        ffi::ibv_query_port(
            ctx,
            port,
            (&mut attr as *mut ffi::ibv_port_attr).cast::<ffi::_compat_ibv_port_attr>(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "{NO_DEVICE}: querying {name} port {port} failed (errno {rc})"
        ));
    }
    if attr.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
        return Err(format!("{NO_DEVICE}: {name} port {port} is not active"));
    }
    let roce = u32::from(attr.link_layer) == ffi::IBV_LINK_LAYER_ETHERNET;
    let gid = if roce || std::env::var(GID_INDEX_VAR).is_ok() {
        let index: u8 = std::env::var(GID_INDEX_VAR)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let mut gid = ffi::ibv_gid::default();
        // SAFETY: an open context and a valid out-pointer.
        let rc = unsafe { ffi::ibv_query_gid(ctx, port, i32::from(index), &mut gid) };
        if rc != 0 {
            return Err(format!(
                "{NO_DEVICE}: {name} has no GID {index} on port {port}"
            ));
        }
        // SAFETY: every bit pattern is a valid `raw` view of the union.
        Some((unsafe { gid.raw }, index))
    } else {
        None
    };
    // SAFETY: an open context.
    let pd = unsafe { ffi::ibv_alloc_pd(ctx) };
    if pd.is_null() {
        return Err(format!("{NO_DEVICE}: ibv_alloc_pd on {name} failed"));
    }
    tracing::info!(device = %name, port, roce, "InfiniBand device opened");
    Ok(IbContext {
        ctx,
        pd,
        port,
        lid: attr.lid,
        mtu: attr.active_mtu,
        gid,
        name,
    })
}

/// A memory range registered with the RDMA device; deregistered on drop.
pub struct IbRegion {
    mr: *mut ffi::ibv_mr,
    addr: u64,
    _ctx: Arc<IbContext>,
}

// SAFETY: the MR handle may be used and deregistered from any thread.
unsafe impl Send for IbRegion {}
// SAFETY: the struct is only read after registration.
unsafe impl Sync for IbRegion {}

impl std::fmt::Debug for IbRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbRegion")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("rkey", &self.rkey())
            .finish()
    }
}

impl IbRegion {
    /// Registers `len` bytes at `ptr` for local and remote reads, writes and atomics.
    pub fn register(ptr: DevicePtr, len: usize) -> Result<IbRegion> {
        let ctx = context()?;
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
        // SAFETY: the protection domain is live for the process; `ptr`/`len` name memory the
        // caller's registration keeps allocated while this region lives (it owns it).
        let mr = unsafe {
            ffi::ibv_reg_mr(
                ctx.pd,
                oxccl_kernels::abi::ptr::<std::ffi::c_void>(ptr),
                len,
                access.0 as i32,
            )
        };
        if mr.is_null() {
            return Err(Error::Os {
                call: "ibv_reg_mr",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(IbRegion {
            mr,
            addr: ptr.0,
            _ctx: ctx,
        })
    }

    /// Address of the first registered byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The remote key peers write with.
    pub fn rkey(&self) -> u32 {
        // SAFETY: `mr` is a live registration until drop.
        unsafe { (*self.mr).rkey }
    }

    /// The local key this process posts with.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `mr` is a live registration until drop.
        unsafe { (*self.mr).lkey }
    }
}

impl Drop for IbRegion {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered exactly once here.
        let rc = unsafe { ffi::ibv_dereg_mr(self.mr) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_dereg_mr failed");
        }
    }
}

/// What two queue pairs tell each other to connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Endpoint {
    qpn: u32,
    psn: u32,
    lid: u16,
    mtu: u32,
    gid: Option<[u8; 16]>,
}

impl Endpoint {
    fn to_bytes(self) -> Vec<u8> {
        let mut out = ENDPOINT_MAGIC.to_vec();
        out.extend_from_slice(&self.qpn.to_le_bytes());
        out.extend_from_slice(&self.psn.to_le_bytes());
        out.extend_from_slice(&u32::from(self.lid).to_le_bytes());
        out.extend_from_slice(&self.mtu.to_le_bytes());
        match self.gid {
            Some(g) => {
                out.push(1);
                out.extend_from_slice(&g);
            }
            None => out.push(0),
        }
        out
    }

    fn from_bytes(bytes: &[u8]) -> Result<Endpoint> {
        let mut r = Reader::new(bytes, "queue pair endpoint");
        if r.take(4)? != ENDPOINT_MAGIC {
            return Err(Error::InvalidArgument("not a queue pair endpoint".into()));
        }
        let qpn = r.u32()?;
        let psn = r.u32()?;
        let lid = u16::try_from(r.u32()?)
            .map_err(|_| Error::InvalidArgument("queue pair endpoint: bad LID".into()))?;
        let mtu = r.u32()?;
        let gid = match r.u8()? {
            0 => None,
            _ => {
                let mut g = [0u8; 16];
                g.copy_from_slice(r.take(16)?);
                Some(g)
            }
        };
        r.finish()?;
        Ok(Endpoint {
            qpn,
            psn,
            lid,
            mtu,
            gid,
        })
    }
}

struct SendState {
    /// Requests posted and not yet completed.
    outstanding: u32,
    /// The first failed completion, reported by every later call.
    failed: Option<String>,
}

/// An RC queue pair to one peer.
pub struct IbConnection {
    rank: u32,
    peer: u32,
    /// The bootstrap's timeout: bounds waits for room in the send queue.
    timeout: Duration,
    ctx: Arc<IbContext>,
    cq: *mut ffi::ibv_cq,
    qp: *mut ffi::ibv_qp,
    state: Mutex<SendState>,
}

// SAFETY: queue pairs and completion queues may be used from any thread; every post and
// poll happens under `state`'s lock.
unsafe impl Send for IbConnection {}
// SAFETY: as above.
unsafe impl Sync for IbConnection {}

impl std::fmt::Debug for IbConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbConnection")
            .field("rank", &self.rank)
            .field("peer", &self.peer)
            .field("device", &self.ctx.name)
            .finish()
    }
}

fn random_psn() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (nanos ^ std::process::id().rotate_left(8)) & 0x00ff_ffff
}

impl IbConnection {
    /// Creates a queue pair, trades endpoints with `peer` over the bootstrap and moves the
    /// pair to ready-to-send (collective between the two ranks).
    pub fn connect(bootstrap: &Bootstrap, peer: u32, tag: u32) -> Result<IbConnection> {
        let ctx = context()?;
        let rank = bootstrap.rank();
        // SAFETY: an open context; no completion channel.
        let cq = unsafe {
            ffi::ibv_create_cq(
                ctx.ctx,
                CQ_DEPTH,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(Error::Os {
                call: "ibv_create_cq",
                source: std::io::Error::last_os_error(),
            });
        }
        let mut init = ffi::ibv_qp_init_attr {
            send_cq: cq,
            recv_cq: cq,
            cap: ffi::ibv_qp_cap {
                max_send_wr: MAX_SEND_WR,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: INLINE_BYTES,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
            ..Default::default()
        };
        // SAFETY: a live protection domain and a filled init struct.
        let qp = unsafe { ffi::ibv_create_qp(ctx.pd, &mut init) };
        // From here on, `conn`'s drop destroys what was created.
        let conn = IbConnection {
            rank,
            peer,
            timeout: bootstrap.timeout(),
            ctx: Arc::clone(&ctx),
            cq,
            qp,
            state: Mutex::new(SendState {
                outstanding: 0,
                failed: None,
            }),
        };
        if qp.is_null() {
            return Err(Error::Os {
                call: "ibv_create_qp",
                source: std::io::Error::last_os_error(),
            });
        }
        if init.cap.max_inline_data < 8 {
            return Err(Error::Unsupported(format!(
                "{} cannot send 8 bytes inline",
                ctx.name
            )));
        }
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: ctx.port,
            qp_access_flags: access.0,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ffi::ibv_qp_attr_mask::IBV_QP_PORT
            | ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        conn.modify(&mut attr, mask, "ibv_modify_qp (INIT)")?;

        // SAFETY: `qp` is a live queue pair.
        let qpn = unsafe { (*qp).qp_num };
        let mine = Endpoint {
            qpn,
            psn: random_psn(),
            lid: ctx.lid,
            mtu: ctx.mtu,
            gid: ctx.gid.map(|(g, _)| g),
        };
        bootstrap.send(peer, tag, &mine.to_bytes())?;
        let theirs = Endpoint::from_bytes(&bootstrap.recv(peer, tag)?)?;

        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: mine.mtu.min(theirs.mtu),
            dest_qp_num: theirs.qpn,
            rq_psn: theirs.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ..Default::default()
        };
        attr.ah_attr.dlid = theirs.lid;
        attr.ah_attr.port_num = ctx.port;
        if let (Some(dgid), Some((_, index))) = (theirs.gid, ctx.gid) {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid = ffi::ibv_gid { raw: dgid };
            attr.ah_attr.grh.sgid_index = index;
            attr.ah_attr.grh.hop_limit = 0xff;
        }
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_AV
            | ffi::ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ffi::ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ffi::ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ffi::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        conn.modify(&mut attr, mask, "ibv_modify_qp (RTR)")?;

        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            sq_psn: mine.psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ffi::ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ffi::ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        conn.modify(&mut attr, mask, "ibv_modify_qp (RTS)")?;
        // Neither side posts before the other's queue pair can receive.
        bootstrap.send(peer, tag, b"ready")?;
        bootstrap.recv(peer, tag)?;
        tracing::debug!(rank, peer, qpn, remote_qpn = theirs.qpn, "queue pair ready");
        Ok(conn)
    }

    fn modify(
        &self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
        call: &'static str,
    ) -> Result<()> {
        // SAFETY: a live queue pair and a filled attribute struct.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(errno(call, rc));
        }
        Ok(())
    }

    /// The peer's rank.
    pub fn peer(&self) -> u32 {
        self.peer
    }

    /// Posts RDMA writes of `bytes` from `src` to the peer's `dst` (see
    /// [`crate::connection::Connection::write`]).
    pub fn write(
        &self,
        dst: &RemoteMemory,
        dst_offset: usize,
        src: &RegisteredMemory,
        src_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        check_write(
            Transport::Ib,
            self.peer,
            dst,
            dst_offset,
            src,
            src_offset,
            bytes,
        )?;
        let remote = dst
            .ib()
            .ok_or_else(|| Error::InvalidArgument("destination has no IB registration".into()))?;
        let region = src.registration().ib.as_ref().ok_or_else(|| {
            Error::InvalidArgument("the source was registered without InfiniBand".into())
        })?;
        let mut state = self.ready()?;
        let mut done = 0;
        while done < bytes {
            let n = MAX_MESSAGE.min(bytes - done);
            let mut sge = ffi::ibv_sge {
                addr: src.ptr().offset(src_offset + done)?.0,
                length: u32::try_from(n).unwrap_or(u32::MAX),
                lkey: region.lkey(),
            };
            let remote_addr = DevicePtr(remote.addr).offset(dst_offset + done)?.0;
            self.post(&mut state, &mut sge, remote_addr, remote.rkey, false)?;
            done += n;
        }
        Ok(())
    }

    /// Posts an inline RDMA write of `value` behind the earlier writes (see
    /// [`crate::connection::Connection::update_and_sync`]).
    pub fn update_and_sync(&self, dst: &RemoteMemory, dst_offset: usize, value: u64) -> Result<()> {
        check_update(Transport::Ib, self.peer, dst, dst_offset)?;
        let remote = dst
            .ib()
            .ok_or_else(|| Error::InvalidArgument("destination has no IB registration".into()))?;
        let mut state = self.ready()?;
        let staged = value;
        let mut sge = ffi::ibv_sge {
            addr: &staged as *const u64 as u64,
            length: 8,
            lkey: 0,
        };
        let remote_addr = DevicePtr(remote.addr).offset(dst_offset)?.0;
        // Inline: the value is copied when posting, so `staged` may go right after.
        self.post(&mut state, &mut sge, remote_addr, remote.rkey, true)
    }

    /// Polls completions until every posted request is done (see
    /// [`crate::connection::Connection::flush`]).
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut state = lock(&self.state);
        while state.outstanding > 0 {
            self.poll(&mut state)?;
            if state.outstanding > 0 {
                if Instant::now() >= deadline {
                    return Err(Error::Timeout {
                        what: format!(
                            "{} RDMA requests from rank {} to rank {} to complete",
                            state.outstanding, self.rank, self.peer
                        ),
                        waited: timeout,
                    });
                }
                std::hint::spin_loop();
            }
        }
        self.failed(&state)
    }

    fn failed(&self, state: &SendState) -> Result<()> {
        match &state.failed {
            Some(why) => Err(Error::PeerLost(format!("rank {}: {why}", self.peer))),
            None => Ok(()),
        }
    }

    fn ready(&self) -> Result<MutexGuard<'_, SendState>> {
        let state = lock(&self.state);
        self.failed(&state)?;
        Ok(state)
    }

    fn post(
        &self,
        state: &mut SendState,
        sge: &mut ffi::ibv_sge,
        remote_addr: u64,
        rkey: u32,
        inline: bool,
    ) -> Result<()> {
        // Keep the send queue from overflowing: wait for room, bounded.
        let deadline = Instant::now() + self.timeout;
        while state.outstanding >= MAX_SEND_WR {
            self.poll(state)?;
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!("room in the send queue to rank {}", self.peer),
                    waited: self.timeout,
                });
            }
        }
        let mut flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED;
        if inline {
            flags |= ffi::ibv_send_flags::IBV_SEND_INLINE;
        }
        let mut wr = ffi::ibv_send_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: sge,
            num_sge: 1,
            opcode: ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            send_flags: flags.0,
            ..Default::default()
        };
        wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: `qp` is live and its context's ops table is filled by the provider; the
        // work request and its scatter entry live across the call (inline data is copied,
        // and other sources are registered memory the caller keeps until a flush).
        let rc = unsafe {
            let ops = &(*(*self.qp).context).ops;
            match ops.post_send {
                Some(post) => post(self.qp, &mut wr, &mut bad),
                None => libc_enosys(),
            }
        };
        if rc != 0 {
            return Err(errno("ibv_post_send", rc));
        }
        state.outstanding += 1;
        Ok(())
    }

    fn poll(&self, state: &mut SendState) -> Result<()> {
        const BATCH: usize = 16;
        // SAFETY: `ibv_wc` is plain integers; all-zero is a valid value.
        let mut wcs: [ffi::ibv_wc; BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: `cq` is live, its context's ops table is filled by the provider, and `wcs`
        // has room for BATCH entries.
        let n = unsafe {
            let ops = &(*(*self.cq).context).ops;
            match ops.poll_cq {
                Some(poll) => poll(self.cq, BATCH as i32, wcs.as_mut_ptr()),
                None => -1,
            }
        };
        let n = usize::try_from(n).map_err(|_| Error::Os {
            call: "ibv_poll_cq",
            source: std::io::Error::other("polling the completion queue failed"),
        })?;
        for wc in &wcs[..n.min(BATCH)] {
            state.outstanding = state.outstanding.saturating_sub(1);
            if let Some((status, vendor)) = wc.error() {
                state.failed.get_or_insert_with(|| {
                    format!(
                        "RDMA completion failed with status {status} (vendor error {vendor:#x})"
                    )
                });
            }
        }
        self.failed(state)
    }
}

/// The error code for an operation the provider does not implement.
fn libc_enosys() -> i32 {
    38
}

impl Drop for IbConnection {
    fn drop(&mut self) {
        // SAFETY: created in `connect` (null when creation failed), destroyed once here, the
        // queue pair before the completion queue it uses.
        unsafe {
            if !self.qp.is_null() && ffi::ibv_destroy_qp(self.qp) != 0 {
                tracing::warn!(peer = self.peer, "ibv_destroy_qp failed");
            }
            if !self.cq.is_null() && ffi::ibv_destroy_cq(self.cq) != 0 {
                tracing::warn!(peer = self.peer, "ibv_destroy_cq failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_round_trip() {
        for gid in [None, Some([7u8; 16])] {
            let e = Endpoint {
                qpn: 0x1234,
                psn: 0xab_cdef,
                lid: 9,
                mtu: 5,
                gid,
            };
            assert_eq!(Endpoint::from_bytes(&e.to_bytes()).unwrap(), e);
        }
        assert!(Endpoint::from_bytes(b"OXIBshort").is_err());
    }
}
