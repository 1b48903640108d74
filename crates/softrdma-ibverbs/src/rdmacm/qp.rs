//! The QP of an id (`rdma_create_qp`, `rdma_destroy_qp`): made with this
//! library's own verbs, on the device's default PD when none is given,
//! with a CQ and completion channel of its own for each queue the caller
//! gave none for (their context is the id, as `rdma_get_send_comp` and
//! `rdma_get_recv_comp` of `<rdma/rdma_verbs.h>` check), and moved to INIT
//! at once so that receives can be posted before the connection exists.

use std::collections::HashMap;
use std::ffi::c_int;
use std::ptr::null_mut;
use std::sync::{Mutex, OnceLock};

use super::Id;
use crate::abi::*;
use crate::objects::{self, Ctx};
use crate::qp_ex::{
    ibv_qp_init_attr_ex, IBV_QPT_XRC_RECV, IBV_QPT_XRC_SEND, INIT_ATTR_PD, INIT_ATTR_XRCD,
};
use crate::xrc::{
    ibv_srq_init_attr_ex, ibv_xrcd, ibv_xrcd_init_attr, IBV_SRQT_BASIC, IBV_SRQT_XRC,
    IBV_SRQ_INIT_ATTR_CQ, IBV_SRQ_INIT_ATTR_PD, IBV_SRQ_INIT_ATTR_TYPE, IBV_SRQ_INIT_ATTR_XRCD,
    IBV_XRCD_INIT_ATTR_FD, IBV_XRCD_INIT_ATTR_OFLAGS,
};
use crate::{device, verbs};

/// `ibv_qp_attr_mask` bits and `ibv_qp_state` values used here.
const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
const IBV_QP_PORT: c_int = 1 << 5;
const IBV_QP_QKEY: c_int = 1 << 6;
const IBV_QP_SQ_PSN: c_int = 1 << 16;
const IBV_QPS_INIT: u32 = 1;
const IBV_QPS_RTR: u32 = 2;
const IBV_QPS_RTS: u32 = 3;
const IBV_QPS_ERR: u32 = 6;
/// The Q_Key of rdma_cm's UDP port space (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// Local write, remote write, remote read, remote atomic.
const RDMA_CM_ACCESS: u32 = 0xF;

fn last_errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .filter(|&e| e != 0)
        .unwrap_or(libc::EINVAL)
}

/// The object `table` keeps for `ctx`'s device, made by `make` (NULL:
/// failed, errno set) on the first call for that device.
fn per_device<T>(
    table: &OnceLock<Mutex<HashMap<usize, usize>>>,
    ctx: &'static Ctx,
    make: impl FnOnce() -> *mut T,
) -> Result<*mut T, c_int> {
    let mut made = table
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let key = ctx as *const Ctx as usize;
    if let Some(&p) = made.get(&key) {
        return Ok(p as *mut T);
    }
    let p = make();
    if p.is_null() {
        return Err(last_errno());
    }
    made.insert(key, p as usize);
    Ok(p)
}

/// The device's default PD (librdmacm's per-device PD), made once.
pub(super) fn default_pd(ctx: &'static Ctx) -> Result<*mut ibv_pd, c_int> {
    static PDS: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    // SAFETY: an open context of this library.
    per_device(&PDS, ctx, || unsafe { verbs::ibv_alloc_pd(ctx.as_ibv()) })
}

/// A completion channel and a CQ of `cqe` entries on it, for `id`.
fn new_cq(id: &mut Id, cqe: u32) -> Result<(*mut ibv_comp_channel, *mut ibv_cq), c_int> {
    let verbs_ctx = id.c.verbs;
    // SAFETY: an open context of this library.
    let ch = unsafe { device::ibv_create_comp_channel(verbs_ctx) };
    if ch.is_null() {
        return Err(last_errno());
    }
    let cqe = cqe.clamp(1, i32::MAX as u32) as c_int;
    let me: *mut Id = id;
    // SAFETY: an open context and its live channel.
    let cq = unsafe { verbs::ibv_create_cq(verbs_ctx, cqe, me.cast(), ch, 0) };
    if cq.is_null() {
        let e = last_errno();
        // SAFETY: the channel just made, unused.
        unsafe { device::ibv_destroy_comp_channel(ch) };
        return Err(e);
    }
    Ok((ch, cq))
}

/// Destroys a CQ and its channel made by [`new_cq`] (NULLs skipped).
fn free_cq(ch: *mut ibv_comp_channel, cq: *mut ibv_cq) {
    if !cq.is_null() {
        // SAFETY: a CQ of this library no QP uses any more.
        unsafe { verbs::ibv_destroy_cq(cq) };
    }
    if !ch.is_null() {
        // SAFETY: its channel, unused once the CQ is gone.
        unsafe { device::ibv_destroy_comp_channel(ch) };
    }
}

/// `rdma_create_qp`: [`create_qp_ex`] with the PD (or the device's).
///
/// # Safety
/// `pd` is NULL or a live PD of the id's device; `attr`'s CQs and SRQ
/// are NULL or live.
pub unsafe fn create_qp(
    id: &mut Id,
    pd: *mut ibv_pd,
    attr: &mut ibv_qp_init_attr,
) -> Result<(), c_int> {
    let mut ex = ex_of(attr);
    ex.comp_mask = INIT_ATTR_PD;
    ex.pd = pd;
    // SAFETY: per the contract.
    let r = unsafe { create_qp_ex(id, &mut ex) };
    // As librdmacm: the caller sees the QP's type, CQs and capacities.
    (attr.send_cq, attr.recv_cq, attr.srq) = (ex.send_cq, ex.recv_cq, ex.srq);
    (attr.cap, attr.qp_type) = (ex.cap, ex.qp_type);
    r
}

fn ex_of(a: &ibv_qp_init_attr) -> ibv_qp_init_attr_ex {
    // SAFETY: all-zero is a valid ibv_qp_init_attr_ex (integers and
    // NULL pointers).
    let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    (ex.qp_context, ex.send_cq, ex.recv_cq, ex.srq) = (a.qp_context, a.send_cq, a.recv_cq, a.srq);
    (ex.cap, ex.qp_type, ex.sq_sig_all) = (a.cap, a.qp_type, a.sq_sig_all);
    ex
}

/// `rdma_create_qp_ex`: the QP on the given PD (or the device's default
/// PD), with a CQ and completion channel of the id's own for each queue
/// the caller gave none for, the id's SRQ when it has one and the caller
/// named none, and for an XRC target (`IBV_QPT_XRC_RECV`) the device's
/// XRC domain unless the caller gave one; then INIT (UD: RTS).
///
/// # Safety
/// `attr`'s PD, XRC domain, CQs and SRQ are NULL or live objects of the
/// id's device.
pub unsafe fn create_qp_ex(id: &mut Id, attr: &mut ibv_qp_init_attr_ex) -> Result<(), c_int> {
    let ctx = id.ctx().ok_or(libc::EINVAL)?;
    if !id.c.qp.is_null() {
        return Err(libc::EINVAL);
    }
    if attr.comp_mask & INIT_ATTR_PD == 0 || attr.pd.is_null() {
        attr.pd = default_pd(ctx)?;
        attr.comp_mask |= INIT_ATTR_PD;
    }
    if attr.qp_type == 0 {
        attr.qp_type = id.c.qp_type;
    }
    if attr.qp_type == IBV_QPT_XRC_RECV
        && (attr.comp_mask & INIT_ATTR_XRCD == 0 || attr.xrcd.is_null())
    {
        attr.xrcd = default_xrcd(ctx)?.cast();
        attr.comp_mask |= INIT_ATTR_XRCD;
    }
    if attr.srq.is_null() {
        attr.srq = id.c.srq;
    }
    let own_send = attr.send_cq.is_null();
    let own_recv = attr.recv_cq.is_null();
    if own_send {
        let (ch, cq) = new_cq(id, attr.cap.max_send_wr)?;
        (id.c.send_cq_channel, id.c.send_cq, attr.send_cq) = (ch, cq, cq);
    }
    if own_recv {
        match new_cq(id, attr.cap.max_recv_wr) {
            Ok((ch, cq)) => (id.c.recv_cq_channel, id.c.recv_cq, attr.recv_cq) = (ch, cq, cq),
            Err(e) => {
                free_own_cqs(id, own_send, false);
                return Err(e);
            }
        }
    }
    let xrc = matches!(attr.qp_type, IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV);
    let qp = if xrc || attr.comp_mask != INIT_ATTR_PD {
        // SAFETY: a live context; attributes with live objects (the contract).
        unsafe { crate::qp_ex::create_qp_ex(ctx.as_ibv(), attr) }
    } else {
        // SAFETY: a live PD, attributes with live CQs (per the contract);
        // ibv_qp_init_attr is the start of ibv_qp_init_attr_ex.
        unsafe { verbs::ibv_create_qp(attr.pd, (attr as *mut ibv_qp_init_attr_ex).cast()) }
    };
    if qp.is_null() {
        let e = last_errno();
        free_own_cqs(id, own_send, own_recv);
        return Err(e);
    }
    id.c.qp = qp;
    id.c.pd = attr.pd;
    id.state().own_cqs = (own_send, own_recv);
    let ready = match attr.qp_type {
        IBV_QPT_RC_C | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV => to_init(qp),
        IBV_QPT_UD_C => to_rts_ud(qp),
        _ => Ok(()),
    };
    if let Err(e) = ready {
        destroy_qp(id);
        return Err(e);
    }
    Ok(())
}

/// The device's XRC domain (librdmacm's per-device one, opened without a
/// file), made once.
pub(super) fn default_xrcd(ctx: &'static Ctx) -> Result<*mut ibv_xrcd, c_int> {
    static XRCDS: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    per_device(&XRCDS, ctx, || {
        let mut attr = ibv_xrcd_init_attr {
            comp_mask: IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
            fd: -1,
            oflags: libc::O_CREAT,
        };
        // SAFETY: an open context of this library and live attributes.
        unsafe { crate::xrc::open_xrcd(ctx.as_ibv(), &mut attr) }
    })
}

/// `rdma_create_srq_ex`: the SRQ on the given PD (or the id's, or the
/// device's default); an XRC SRQ also in the device's XRC domain and on
/// the id's receive CQ (made, with its channel, if the id has none) unless
/// the caller gave them. The id keeps it (`id->srq`), and its QP, made
/// later, uses it.
///
/// # Safety
/// `attr`'s PD, XRC domain and CQ are NULL or live objects of the id's
/// device.
pub unsafe fn create_srq_ex(id: &mut Id, attr: &mut ibv_srq_init_attr_ex) -> Result<(), c_int> {
    let ctx = id.ctx().ok_or(libc::EINVAL)?;
    if attr.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 || !id.c.srq.is_null() {
        return Err(libc::EINVAL);
    }
    if attr.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || attr.pd.is_null() {
        attr.pd = if id.c.pd.is_null() {
            default_pd(ctx)?
        } else {
            id.c.pd
        };
        attr.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    }
    let mut made_cq = false;
    if attr.srq_type == IBV_SRQT_XRC {
        if attr.comp_mask & IBV_SRQ_INIT_ATTR_XRCD == 0 || attr.xrcd.is_null() {
            attr.xrcd = default_xrcd(ctx)?;
        }
        if attr.comp_mask & IBV_SRQ_INIT_ATTR_CQ == 0 || attr.cq.is_null() {
            if id.c.recv_cq.is_null() {
                let (ch, cq) = new_cq(id, attr.attr.max_wr)?;
                (id.c.recv_cq_channel, id.c.recv_cq) = (ch, cq);
                made_cq = true;
            }
            attr.cq = id.c.recv_cq;
        }
        attr.comp_mask |= IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    }
    // SAFETY: a live context; attributes with live objects (the contract).
    let srq = unsafe { crate::xrc::create_srq_ex(ctx.as_ibv(), attr) };
    if srq.is_null() {
        let e = last_errno();
        if made_cq {
            free_own_cqs(id, false, true);
        }
        return Err(e);
    }
    if made_cq {
        id.state().own_cqs.1 = true;
    }
    if id.c.pd.is_null() {
        id.c.pd = attr.pd;
    }
    id.c.srq = srq;
    Ok(())
}

/// `rdma_create_srq`: [`create_srq_ex`] of the type the id's QP type
/// asks for (XRC for an XRC target id, basic otherwise).
///
/// # Safety
/// `pd` is NULL or a live PD of the id's device.
pub unsafe fn create_srq(
    id: &mut Id,
    pd: *mut ibv_pd,
    attr: &mut ibv_srq_init_attr,
) -> Result<(), c_int> {
    // SAFETY: all-zero is a valid ibv_srq_init_attr_ex (integers and NULLs).
    let mut ex: ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
    (ex.srq_context, ex.attr) = (attr.srq_context, attr.attr);
    ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
    ex.srq_type = if id.c.qp_type == IBV_QPT_XRC_RECV {
        IBV_SRQT_XRC
    } else {
        IBV_SRQT_BASIC
    };
    ex.pd = pd;
    // SAFETY: per the contract.
    let r = unsafe { create_srq_ex(id, &mut ex) };
    attr.attr = ex.attr;
    r
}

/// `rdma_destroy_srq`: the SRQ, then the CQs made for the id if its QP
/// is gone too (an XRC SRQ completes on the id's receive CQ).
pub fn destroy_srq(id: &mut Id) {
    if id.c.srq.is_null() {
        return;
    }
    // SAFETY: the id's live SRQ, used by no QP of the id's any more (the
    // caller destroys the QP first, as librdmacm's users do).
    unsafe { verbs::ibv_destroy_srq(id.c.srq) };
    id.c.srq = null_mut();
    if id.c.qp.is_null() {
        let (send, recv) = std::mem::take(&mut id.state().own_cqs);
        free_own_cqs(id, send, recv);
    }
}

const IBV_QPT_UD_C: u32 = super::abi::IBV_QPT_UD;

/// A UD QP straight to RTS with rdma_cm's UDP Q_Key, as librdmacm readies
/// the QPs of UD ids: it can send and receive before (and without) SIDR.
fn to_rts_ud(qp: *mut ibv_qp) -> Result<(), c_int> {
    let steps = [
        (
            IBV_QPS_INIT,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
        ),
        (IBV_QPS_RTR, IBV_QP_STATE),
        (IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_SQ_PSN),
    ];
    for (state, mask) in steps {
        // SAFETY: all-zero is a valid ibv_qp_attr (integers and a GID union).
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = state;
        a.port_num = 1;
        a.qkey = RDMA_UDP_QKEY;
        // SAFETY: a live QP of this library and a live attribute struct.
        match unsafe { verbs::ibv_modify_qp(qp, &mut a, mask) } {
            0 => {}
            e => return Err(e),
        }
    }
    Ok(())
}

const IBV_QPT_RC_C: u32 = super::abi::IBV_QPT_RC;

/// The QP to INIT with rdma_cm's access rights (port 1, P_Key index 0).
fn to_init(qp: *mut ibv_qp) -> Result<(), c_int> {
    // SAFETY: all-zero is a valid ibv_qp_attr (integers and a GID union).
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.pkey_index = 0;
    a.qp_access_flags = RDMA_CM_ACCESS;
    let mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    // SAFETY: a live QP of this library and a live attribute struct.
    match unsafe { verbs::ibv_modify_qp(qp, &mut a, mask) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// Moves the id's QP (if any) to ERR, flushing its work requests.
pub fn to_error(id: &mut Id) {
    if id.c.qp.is_null() {
        return;
    }
    // SAFETY: as in `to_init`.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = IBV_QPS_ERR;
    // SAFETY: the id's live QP.
    let _ = unsafe { verbs::ibv_modify_qp(id.c.qp, &mut a, IBV_QP_STATE) };
}

fn free_own_cqs(id: &mut Id, send: bool, recv: bool) {
    if send {
        free_cq(id.c.send_cq_channel, id.c.send_cq);
        (id.c.send_cq_channel, id.c.send_cq) = (null_mut(), null_mut());
    }
    if recv {
        free_cq(id.c.recv_cq_channel, id.c.recv_cq);
        (id.c.recv_cq_channel, id.c.recv_cq) = (null_mut(), null_mut());
    }
}

/// `rdma_destroy_qp`: the QP, then the CQs made for it (unless the id's
/// SRQ still uses them).
pub fn destroy_qp(id: &mut Id) {
    if id.c.qp.is_null() {
        return;
    }
    // SAFETY: the id's live QP.
    unsafe { verbs::ibv_destroy_qp(id.c.qp) };
    id.c.qp = null_mut();
    // An SRQ of the id's may complete on its receive CQ: the CQs then go
    // with the SRQ (`destroy_srq`).
    if id.c.srq.is_null() {
        let (send, recv) = std::mem::take(&mut id.state().own_cqs);
        free_own_cqs(id, send, recv);
    }
}

/// The softrdma QP behind the id's QP.
///
/// # Safety
/// The id's QP is NULL or live.
pub unsafe fn soft_qp(id: &Id) -> Option<&softrdma::Qp> {
    let qp = id.c.qp.cast::<objects::Qp>();
    // SAFETY: per the contract; a live Qp object whose `qp` is set.
    unsafe { qp.as_ref()?.qp.as_ref() }
}
