//! The extended QP and its work-request builder API: `ibv_create_qp_ex`
//! (the `create_qp_ex` slot of `verbs_context`), `ibv_qp_to_qp_ex`, and
//! the `ibv_wr_*` functions, which the header's inline functions call
//! through the function pointers of `struct ibv_qp_ex`.
//!
//! Every QP object (`objects::Qp`) is laid out as an `ibv_qp_ex`: its
//! `ibv_qp` is followed by [`QpExTail`], the rest of that struct. The
//! pointers are filled only for a QP created with
//! IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, and only such a QP is an extended one
//! for `ibv_qp_to_qp_ex` (as in rdma-core).
//!
//! The builder collects the WRs between `ibv_wr_start` and
//! `ibv_wr_complete` as classic `ibv_send_wr`s — inline data copied at the
//! `ibv_wr_set_inline_data*` call, as the API promises — and
//! `ibv_wr_complete` posts them with the library's own `ibv_post_send`, so
//! both APIs share every check and the same path into softrdma
//! (`Qp::post_send`). A builder call that cannot be honoured (no WR
//! started, more SGEs than the QP takes, an operation the QP was not
//! created for) makes `ibv_wr_complete` fail with EINVAL or EOPNOTSUPP and
//! post nothing; a WR `ibv_post_send` refuses is reported with its errno,
//! the WRs before it having been posted.

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::{self, null_mut};
use std::sync::Mutex;

use crate::abi::*;
use crate::ffi::{fail_with, guard};
use crate::objects::Qp;

type QpX = *mut Qp;

/// `struct ibv_qp_ex` after its `qp_base` (offset 160 in the C struct).
#[repr(C)]
pub struct QpExTail {
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(QpX, u32, u64, u64, u64)>,
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(QpX, u32, u64, u64)>,
    pub wr_bind_mw: Option<unsafe extern "C" fn(QpX, *mut c_void, u32, *const c_void)>,
    pub wr_local_inv: Option<unsafe extern "C" fn(QpX, u32)>,
    pub wr_rdma_read: Option<unsafe extern "C" fn(QpX, u32, u64)>,
    pub wr_rdma_write: Option<unsafe extern "C" fn(QpX, u32, u64)>,
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(QpX, u32, u64, u32)>,
    pub wr_send: Option<unsafe extern "C" fn(QpX)>,
    pub wr_send_imm: Option<unsafe extern "C" fn(QpX, u32)>,
    pub wr_send_inv: Option<unsafe extern "C" fn(QpX, u32)>,
    pub wr_send_tso: Option<unsafe extern "C" fn(QpX, *mut c_void, u16, u16)>,
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(QpX, *mut ibv_ah, u32, u32)>,
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(QpX, u32)>,
    pub wr_set_inline_data: Option<unsafe extern "C" fn(QpX, *mut c_void, usize)>,
    pub wr_set_inline_data_list: Option<unsafe extern "C" fn(QpX, usize, *const IbvDataBuf)>,
    pub wr_set_sge: Option<unsafe extern "C" fn(QpX, u32, u64, u32)>,
    pub wr_set_sge_list: Option<unsafe extern "C" fn(QpX, usize, *const ibv_sge)>,
    pub wr_start: Option<unsafe extern "C" fn(QpX)>,
    pub wr_complete: Option<unsafe extern "C" fn(QpX) -> c_int>,
    pub wr_abort: Option<unsafe extern "C" fn(QpX)>,
    pub wr_atomic_write: Option<unsafe extern "C" fn(QpX, u32, u64, *const c_void)>,
}

/// `struct ibv_data_buf`.
#[repr(C)]
pub struct IbvDataBuf {
    pub addr: *mut c_void,
    pub length: usize,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    // gdb ptype /o struct ibv_qp_ex (rdma-core v44, x86-64), less 160.
    assert!(offset_of!(Qp, ex) == 160);
    assert!(offset_of!(QpExTail, wr_id) == 168 - 160);
    assert!(offset_of!(QpExTail, wr_flags) == 176 - 160);
    assert!(offset_of!(QpExTail, wr_atomic_cmp_swp) == 184 - 160);
    assert!(offset_of!(QpExTail, wr_send) == 240 - 160);
    assert!(offset_of!(QpExTail, wr_set_sge) == 304 - 160);
    assert!(offset_of!(QpExTail, wr_start) == 320 - 160);
    assert!(offset_of!(QpExTail, wr_atomic_write) == 344 - 160);
    assert!(size_of::<QpExTail>() == 352 - 160);
    assert!(size_of::<IbvDataBuf>() == 16);
};

impl QpExTail {
    /// A classic QP's: no builder.
    pub const fn none() -> Self {
        QpExTail {
            comp_mask: 0,
            wr_id: 0,
            wr_flags: 0,
            wr_atomic_cmp_swp: None,
            wr_atomic_fetch_add: None,
            wr_bind_mw: None,
            wr_local_inv: None,
            wr_rdma_read: None,
            wr_rdma_write: None,
            wr_rdma_write_imm: None,
            wr_send: None,
            wr_send_imm: None,
            wr_send_inv: None,
            wr_send_tso: None,
            wr_set_ud_addr: None,
            wr_set_xrc_srqn: None,
            wr_set_inline_data: None,
            wr_set_inline_data_list: None,
            wr_set_sge: None,
            wr_set_sge_list: None,
            wr_start: None,
            wr_complete: None,
            wr_abort: None,
            wr_atomic_write: None,
        }
    }

    /// An extended QP's: the builder, every operation present (those it
    /// was not created for fail at `ibv_wr_complete`).
    fn builder() -> Self {
        QpExTail {
            wr_atomic_cmp_swp: Some(wr_atomic_cmp_swp),
            wr_atomic_fetch_add: Some(wr_atomic_fetch_add),
            wr_bind_mw: Some(wr_bind_mw),
            wr_local_inv: Some(wr_local_inv),
            wr_rdma_read: Some(wr_rdma_read),
            wr_rdma_write: Some(wr_rdma_write),
            wr_rdma_write_imm: Some(wr_rdma_write_imm),
            wr_send: Some(wr_send),
            wr_send_imm: Some(wr_send_imm),
            wr_send_inv: Some(wr_send_inv),
            wr_send_tso: Some(wr_send_tso),
            wr_set_ud_addr: Some(wr_set_ud_addr),
            wr_set_xrc_srqn: Some(wr_set_xrc_srqn),
            wr_set_inline_data: Some(wr_set_inline_data),
            wr_set_inline_data_list: Some(wr_set_inline_data_list),
            wr_set_sge: Some(wr_set_sge),
            wr_set_sge_list: Some(wr_set_sge_list),
            wr_start: Some(wr_start),
            wr_complete: Some(wr_complete),
            wr_abort: Some(wr_abort),
            wr_atomic_write: Some(wr_atomic_write),
            ..Self::none()
        }
    }
}

/// One WR being built.
struct Building {
    wr: ibv_send_wr,
    sges: Vec<ibv_sge>,
    /// Inline data, copied at the builder call.
    inline: Vec<u8>,
}

/// The WRs between `ibv_wr_start` and `ibv_wr_complete`.
#[derive(Default)]
pub struct Builder {
    /// The send operations the QP was created for (IBV_QP_EX_WITH_*).
    ops: u64,
    wrs: Vec<Building>,
    /// The first builder call that failed: `ibv_wr_complete` reports it.
    error: Option<c_int>,
}

// SAFETY: the raw pointers in the WRs being built are the application's
// (AHs, addresses) and point into the Builder's own vectors; they are only
// read by `ibv_post_send` on the thread that completes the list.
unsafe impl Send for Builder {}

pub type Pending = Mutex<Builder>;

const WITH_RDMA_WRITE: u64 = 1 << 0;
const WITH_RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
const WITH_SEND: u64 = 1 << 2;
const WITH_SEND_WITH_IMM: u64 = 1 << 3;
const WITH_RDMA_READ: u64 = 1 << 4;
const WITH_ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
const WITH_ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;
const WITH_LOCAL_INV: u64 = 1 << 7;
const WITH_BIND_MW: u64 = 1 << 8;
const WITH_SEND_WITH_INV: u64 = 1 << 9;

/// The operations each QP type offers through the builder.
fn ops_for(qp_type: c_uint) -> u64 {
    match qp_type {
        IBV_QPT_RC | IBV_QPT_XRC_SEND => {
            WITH_RDMA_WRITE
                | WITH_RDMA_WRITE_WITH_IMM
                | WITH_SEND
                | WITH_SEND_WITH_IMM
                | WITH_RDMA_READ
                | WITH_ATOMIC_CMP_AND_SWP
                | WITH_ATOMIC_FETCH_AND_ADD
                | WITH_SEND_WITH_INV
                | WITH_LOCAL_INV
                | WITH_BIND_MW
        }
        IBV_QPT_UC => {
            WITH_RDMA_WRITE
                | WITH_RDMA_WRITE_WITH_IMM
                | WITH_SEND
                | WITH_SEND_WITH_IMM
                | WITH_LOCAL_INV
                | WITH_BIND_MW
        }
        IBV_QPT_UD => WITH_SEND | WITH_SEND_WITH_IMM,
        _ => 0,
    }
}

const IBV_QPT_RC: c_uint = 2;
const IBV_QPT_UC: c_uint = 3;
const IBV_QPT_UD: c_uint = 4;
pub(crate) const IBV_QPT_XRC_SEND: c_uint = 9;
pub(crate) const IBV_QPT_XRC_RECV: c_uint = 10;

pub(crate) const INIT_ATTR_PD: u32 = 1 << 0;
pub(crate) const INIT_ATTR_XRCD: u32 = 1 << 1;
const INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
const INIT_ATTR_MAX_TSO_HEADER: u32 = 1 << 3;
const INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

/// `struct ibv_qp_init_attr_ex`.
#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    /// The fields of `struct ibv_qp_init_attr`, which this one starts with.
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(offset_of!(ibv_qp_init_attr_ex, comp_mask) == 60);
    assert!(offset_of!(ibv_qp_init_attr_ex, pd) == 64);
    assert!(offset_of!(ibv_qp_init_attr_ex, create_flags) == 80);
    assert!(offset_of!(ibv_qp_init_attr_ex, source_qpn) == 120);
    assert!(offset_of!(ibv_qp_init_attr_ex, send_ops_flags) == 128);
    assert!(size_of::<ibv_qp_init_attr_ex>() == 136);
};

/// The `create_qp_ex` slot: `ibv_create_qp_ex` with a comp_mask beyond
/// IBV_QP_INIT_ATTR_PD. Takes a PD (XRC is not offered), no create flags
/// (EOPNOTSUPP, as on rxe), no TSO (the device has none), and send ops
/// among those of the QP type (EOPNOTSUPP otherwise, e.g. TSO).
pub unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    const VERB: &str = "ibv_create_qp_ex";
    guard(null_mut(), || {
        if context.is_null() || attr.is_null() {
            fail_with(VERB, libc::EINVAL, "NULL context or attributes");
            return null_mut();
        }
        // SAFETY: readable and writable attributes (the verb's contract).
        let a = unsafe { &mut *attr };
        let known =
            INIT_ATTR_PD | INIT_ATTR_XRCD | INIT_ATTR_CREATE_FLAGS | INIT_ATTR_MAX_TSO_HEADER;
        if a.comp_mask & !(known | INIT_ATTR_SEND_OPS_FLAGS) != 0 {
            fail_with(
                VERB,
                libc::EOPNOTSUPP,
                "RSS and WQ indirection tables are not supported",
            );
            return null_mut();
        }
        if a.qp_type == IBV_QPT_XRC_RECV {
            // An XRC target: in its domain, with no PD, CQs or send ops.
            if a.comp_mask & INIT_ATTR_XRCD == 0 || a.xrcd.is_null() {
                fail_with(VERB, libc::EINVAL, "an XRC_RECV QP needs an XRC domain");
                return null_mut();
            }
            if a.comp_mask & INIT_ATTR_SEND_OPS_FLAGS != 0 && a.send_ops_flags != 0 {
                fail_with(VERB, libc::EOPNOTSUPP, "an XRC_RECV QP sends nothing");
                return null_mut();
            }
            // SAFETY: a live context and attributes (the verb's contract).
            return unsafe { crate::xrc::create_tgt_qp(context, a) };
        }
        if a.comp_mask & INIT_ATTR_PD == 0 || a.pd.is_null() {
            fail_with(VERB, libc::EINVAL, "a QP needs a PD");
            return null_mut();
        }
        if a.comp_mask & INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
            fail_with(VERB, libc::EOPNOTSUPP, "no QP create flags are supported");
            return null_mut();
        }
        if a.comp_mask & INIT_ATTR_MAX_TSO_HEADER != 0 && a.max_tso_header != 0 {
            fail_with(VERB, libc::EOPNOTSUPP, "the device has no TSO");
            return null_mut();
        }
        let want_ops = a.comp_mask & INIT_ATTR_SEND_OPS_FLAGS != 0;
        let (pd, send_ops) = (a.pd, a.send_ops_flags);
        if want_ops {
            let offered = ops_for(a.qp_type);
            if send_ops & !offered != 0 {
                fail_with(
                    VERB,
                    libc::EOPNOTSUPP,
                    &format!(
                        "send ops {:#x} are not offered on this QP type",
                        send_ops & !offered
                    ),
                );
                return null_mut();
            }
        }
        // SAFETY: a live PD; the extended attributes start with the classic
        // ones (as rdma-core passes them), which ibv_create_qp reads and
        // whose `cap` it writes.
        let qp = unsafe { crate::verbs::ibv_create_qp(pd, attr.cast::<ibv_qp_init_attr>()) };
        if qp.is_null() || !want_ops {
            return qp;
        }
        // SAFETY: just created, a Qp object no other thread knows yet.
        unsafe {
            let q = qp.cast::<Qp>();
            (*q).ex = QpExTail::builder();
            (*q).pending.lock().unwrap_or_else(|e| e.into_inner()).ops = send_ops;
        }
        qp
    })
}

/// `ibv_qp_to_qp_ex`: the QP as an extended one, if it was created with
/// send ops; NULL otherwise.
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut c_void {
    guard(null_mut(), || {
        if qp.is_null() {
            return null_mut();
        }
        let q = qp.cast::<Qp>();
        // SAFETY: a live QP of this library; `ex` is set once at creation.
        if unsafe { ptr::addr_of!((*q).ex.wr_start).read() }.is_some() {
            qp.cast()
        } else {
            null_mut()
        }
    })
}

/// Runs `f` on the QP's builder.
///
/// # Safety
/// `qp` is a live extended QP of this library.
unsafe fn with_builder<R>(qp: QpX, f: impl FnOnce(&mut Builder) -> R) -> R {
    // SAFETY: per the contract.
    let p = unsafe { &(*qp).pending };
    f(&mut p.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Starts a WR of `opcode` (the operation bit it needs in `op`), with the
/// QP's current `wr_id` and `wr_flags`, and lets `fill` set its fields.
///
/// # Safety
/// `qp` is a live extended QP of this library.
unsafe fn begin(qp: QpX, opcode: c_uint, op: u64, fill: impl FnOnce(&mut ibv_send_wr)) {
    // SAFETY: per the contract; the program does not write wr_id/wr_flags
    // while it calls the builder.
    let (wr_id, flags) = unsafe { ((*qp).ex.wr_id, (*qp).ex.wr_flags) };
    // SAFETY: per the contract.
    unsafe {
        with_builder(qp, |b| {
            if b.ops & op == 0 {
                b.error.get_or_insert(libc::EOPNOTSUPP);
            }
            // SAFETY: ibv_send_wr is plain data: all zero is a valid WR
            // (NULL pointers, no SGEs).
            let mut wr: ibv_send_wr = std::mem::zeroed();
            wr.wr_id = wr_id;
            wr.opcode = opcode;
            wr.send_flags = flags;
            fill(&mut wr);
            b.wrs.push(Building {
                wr,
                sges: Vec::new(),
                inline: Vec::new(),
            });
        })
    }
}

/// Lets `f` change the WR being built; EINVAL at completion when there is
/// none.
///
/// # Safety
/// `qp` is a live extended QP of this library.
unsafe fn current(qp: QpX, f: impl FnOnce(&mut Building, u32)) {
    // SAFETY: per the contract; `cap` never changes after creation.
    let cap = unsafe { (*qp).qp.as_ref().map(|q| q.cap()) };
    // SAFETY: per the contract.
    unsafe {
        with_builder(qp, |b| match (b.wrs.last_mut(), cap) {
            (Some(w), Some(cap)) => f(w, cap.max_inline_data.max(cap.max_send_sge)),
            _ => {
                b.error.get_or_insert(libc::EINVAL);
            }
        })
    }
}

unsafe extern "C" fn wr_start(qp: QpX) {
    // SAFETY: the builder's contract: a live extended QP.
    guard((), || unsafe {
        with_builder(qp, |b| {
            b.wrs.clear();
            b.error = None;
        })
    })
}

unsafe extern "C" fn wr_abort(qp: QpX) {
    // SAFETY: as wr_start.
    guard((), || unsafe {
        with_builder(qp, |b| {
            b.wrs.clear();
            b.error = None;
        })
    })
}

unsafe extern "C" fn wr_complete(qp: QpX) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live extended QP.
        let (mut wrs, error) =
            unsafe { with_builder(qp, |b| (std::mem::take(&mut b.wrs), b.error.take())) };
        if let Some(e) = error {
            return fail_with("ibv_wr_complete", e, "a builder call failed");
        }
        if wrs.is_empty() {
            return 0;
        }
        // Link the list: each WR's SGEs are its own vector's.
        let n = wrs.len();
        for i in 0..n {
            let next = if i + 1 < n {
                ptr::addr_of_mut!(wrs[i + 1].wr)
            } else {
                null_mut()
            };
            let w = &mut wrs[i];
            w.wr.sg_list = w.sges.as_mut_ptr();
            w.wr.num_sge = w.sges.len() as c_int;
            w.wr.next = next;
        }
        let mut bad: *mut ibv_send_wr = null_mut();
        // SAFETY: a live QP and a well-formed list of WRs whose SGEs and
        // inline bytes live in `wrs` until the call returns.
        unsafe { crate::verbs::post_send(qp.cast(), &mut wrs[0].wr, &mut bad) }
    })
}

unsafe extern "C" fn wr_send(qp: QpX) {
    // SAFETY: the builder's contract: a live extended QP.
    guard((), || unsafe { begin(qp, IBV_WR_SEND, WITH_SEND, |_| {}) })
}

unsafe extern "C" fn wr_send_imm(qp: QpX, imm: u32) {
    // SAFETY: as wr_send.
    guard((), || unsafe {
        begin(qp, IBV_WR_SEND_WITH_IMM, WITH_SEND_WITH_IMM, |w| {
            w.imm_data = imm
        })
    })
}

unsafe extern "C" fn wr_send_inv(qp: QpX, rkey: u32) {
    // SAFETY: as wr_send.
    guard((), || unsafe {
        begin(qp, IBV_WR_SEND_WITH_INV, WITH_SEND_WITH_INV, |w| {
            w.imm_data = rkey
        })
    })
}

unsafe extern "C" fn wr_rdma_write(qp: QpX, rkey: u32, addr: u64) {
    // SAFETY: as wr_send.
    guard((), || unsafe {
        begin(qp, IBV_WR_RDMA_WRITE, WITH_RDMA_WRITE, |w| {
            w.wr.rdma = ibv_send_wr_rdma {
                remote_addr: addr,
                rkey,
            }
        })
    })
}

unsafe extern "C" fn wr_rdma_write_imm(qp: QpX, rkey: u32, addr: u64, imm: u32) {
    // SAFETY: as wr_send.
    guard((), || unsafe {
        begin(
            qp,
            IBV_WR_RDMA_WRITE_WITH_IMM,
            WITH_RDMA_WRITE_WITH_IMM,
            |w| {
                w.imm_data = imm;
                w.wr.rdma = ibv_send_wr_rdma {
                    remote_addr: addr,
                    rkey,
                };
            },
        )
    })
}

unsafe extern "C" fn wr_rdma_read(qp: QpX, rkey: u32, addr: u64) {
    // SAFETY: as wr_send.
    guard((), || unsafe {
        begin(qp, IBV_WR_RDMA_READ, WITH_RDMA_READ, |w| {
            w.wr.rdma = ibv_send_wr_rdma {
                remote_addr: addr,
                rkey,
            }
        })
    })
}

unsafe extern "C" fn wr_atomic_cmp_swp(qp: QpX, rkey: u32, addr: u64, compare: u64, swap: u64) {
    // SAFETY: as wr_send.
    guard((), || unsafe {
        begin(
            qp,
            IBV_WR_ATOMIC_CMP_AND_SWP,
            WITH_ATOMIC_CMP_AND_SWP,
            |w| {
                w.wr.atomic = ibv_send_wr_atomic {
                    remote_addr: addr,
                    compare_add: compare,
                    swap,
                    rkey,
                }
            },
        )
    })
}

unsafe extern "C" fn wr_atomic_fetch_add(qp: QpX, rkey: u32, addr: u64, add: u64) {
    // SAFETY: as wr_send.
    guard((), || unsafe {
        begin(
            qp,
            IBV_WR_ATOMIC_FETCH_AND_ADD,
            WITH_ATOMIC_FETCH_AND_ADD,
            |w| {
                w.wr.atomic = ibv_send_wr_atomic {
                    remote_addr: addr,
                    compare_add: add,
                    swap: 0,
                    rkey,
                }
            },
        )
    })
}

/// Operations the QP can never be created for (TSO, atomic write): `ibv_wr_complete` fails with EOPNOTSUPP.
unsafe fn unsupported(qp: QpX) {
    // SAFETY: the builder's contract: a live extended QP.
    unsafe {
        with_builder(qp, |b| {
            b.error.get_or_insert(libc::EOPNOTSUPP);
        })
    }
}

unsafe extern "C" fn wr_bind_mw(qp: QpX, mw: *mut c_void, rkey: u32, info: *const c_void) {
    // SAFETY: as wr_send; `info` is NULL or a readable ibv_mw_bind_info.
    guard((), || unsafe {
        if info.is_null() || mw.is_null() {
            with_builder(qp, |b| {
                b.error.get_or_insert(libc::EINVAL);
            });
            return;
        }
        let bind_info = *info.cast::<ibv_mw_bind_info>();
        begin(qp, IBV_WR_BIND_MW, WITH_BIND_MW, |w| {
            w.ext.bind_mw = ibv_send_wr_bind_mw {
                mw,
                rkey,
                bind_info,
            }
        })
    })
}

unsafe extern "C" fn wr_local_inv(qp: QpX, rkey: u32) {
    // SAFETY: as wr_send.
    guard((), || unsafe {
        begin(qp, IBV_WR_LOCAL_INV, WITH_LOCAL_INV, |w| w.imm_data = rkey)
    })
}

unsafe extern "C" fn wr_send_tso(qp: QpX, _hdr: *mut c_void, _sz: u16, _mss: u16) {
    // SAFETY: as wr_send.
    guard((), || unsafe { unsupported(qp) })
}

unsafe extern "C" fn wr_atomic_write(qp: QpX, _rkey: u32, _addr: u64, _wr: *const c_void) {
    // SAFETY: as wr_send.
    guard((), || unsafe { unsupported(qp) })
}

unsafe extern "C" fn wr_set_xrc_srqn(qp: QpX, srqn: u32) {
    // SAFETY: as wr_send.
    guard((), || unsafe {
        current(qp, |w, _| w.wr.remote_srqn = srqn)
    })
}

unsafe extern "C" fn wr_set_ud_addr(qp: QpX, ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32) {
    // SAFETY: as wr_send.
    guard((), || unsafe {
        current(qp, |w, _| {
            w.wr.wr.ud = ibv_send_wr_ud {
                ah,
                remote_qpn,
                remote_qkey,
            }
        })
    })
}

unsafe extern "C" fn wr_set_sge(qp: QpX, lkey: u32, addr: u64, length: u32) {
    // SAFETY: as wr_send.
    guard((), || unsafe {
        current(qp, |w, _| {
            w.sges.clear();
            w.sges.push(ibv_sge { addr, length, lkey });
        })
    })
}

unsafe extern "C" fn wr_set_sge_list(qp: QpX, n: usize, list: *const ibv_sge) {
    // SAFETY: as wr_send; `list` holds `n` SGEs (the builder's contract),
    // read only once `n` passed the QP's limit.
    guard((), || unsafe {
        let max = (*qp).qp.as_ref().map_or(0, |q| q.cap().max_send_sge) as usize;
        if n > max || (n > 0 && list.is_null()) {
            with_builder(qp, |b| {
                b.error.get_or_insert(libc::EINVAL);
            });
            return;
        }
        current(qp, |w, _| {
            w.sges.clear();
            if n > 0 {
                w.sges
                    .extend_from_slice(std::slice::from_raw_parts(list, n));
            }
        })
    })
}

/// Copies inline data into the WR being built (at most the QP's
/// `max_inline_data` bytes; more is EINVAL at completion, nothing read).
///
/// # Safety
/// `qp` is a live extended QP; each (addr, len) is readable.
unsafe fn set_inline(qp: QpX, bufs: &[(*const u8, usize)]) {
    // SAFETY: per the contract.
    let max = unsafe { (*qp).qp.as_ref().map_or(0, |q| q.cap().max_inline_data) } as usize;
    let total = bufs.iter().try_fold(0usize, |s, &(_, l)| s.checked_add(l));
    if total.is_none_or(|t| t > max) || bufs.iter().any(|&(p, l)| l > 0 && p.is_null()) {
        // SAFETY: per the contract.
        unsafe {
            with_builder(qp, |b| {
                b.error.get_or_insert(libc::EINVAL);
            })
        };
        return;
    }
    // SAFETY: per the contract.
    unsafe {
        current(qp, |w, _| {
            w.inline.clear();
            for &(p, l) in bufs {
                if l > 0 {
                    w.inline.extend_from_slice(std::slice::from_raw_parts(p, l));
                }
            }
            w.sges.clear();
            w.sges.push(ibv_sge {
                addr: w.inline.as_ptr() as u64,
                length: w.inline.len() as u32,
                lkey: 0,
            });
            w.wr.send_flags |= IBV_SEND_INLINE;
        })
    }
}

unsafe extern "C" fn wr_set_inline_data(qp: QpX, addr: *mut c_void, length: usize) {
    // SAFETY: as wr_send; addr..+length readable (the builder's contract).
    guard((), || unsafe {
        set_inline(qp, &[(addr.cast_const().cast(), length)])
    })
}

unsafe extern "C" fn wr_set_inline_data_list(qp: QpX, n: usize, list: *const IbvDataBuf) {
    // SAFETY: as wr_send; `list` holds `n` buffers, each readable (the
    // builder's contract); `n` is bounded before the list is read.
    guard((), || unsafe {
        let max = (*qp).qp.as_ref().map_or(0, |q| q.cap().max_inline_data) as usize;
        if n > max.max(1) || (n > 0 && list.is_null()) {
            with_builder(qp, |b| {
                b.error.get_or_insert(libc::EINVAL);
            });
            return;
        }
        let bufs: Vec<(*const u8, usize)> = (0..n)
            .map(|i| {
                let b = &*list.add(i);
                (b.addr.cast_const().cast::<u8>(), b.length)
            })
            .collect();
        set_inline(qp, &bufs)
    })
}
