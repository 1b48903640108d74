//! Memory windows: the `alloc_mw`, `bind_mw` and `dealloc_mw` slots of
//! `struct ibv_context_ops`, which the header's inline `ibv_alloc_mw`,
//! `ibv_bind_mw` and `ibv_dealloc_mw` call. Each is softrdma's
//! [`softrdma::Pd::alloc_mw`], a bind work request on the QP's send queue
//! (`SendOp::BindMw`, as `IBV_WR_BIND_MW` posts one), and the window's
//! dealloc; the engine's rules decide every bind and every access through
//! a window (docs/engine.md, "Rules").

use std::ffi::{c_int, c_uint};
use std::ptr::null_mut;

use softrdma::{next_rkey, AccessFlags, MwBind, MwType, Rkey, SendOp, SendWr};

use crate::abi::*;
use crate::convert;
use crate::ffi::{fail, fail_with, guard};
use crate::objects::{self, Mw, Pd};
use crate::verbs::{ctx_of, live, soft_qp};

/// `ibv_alloc_mw` (the `alloc_mw` slot): a window of type 1 or 2 (any
/// other type: NULL, errno EINVAL, as the kernel answers).
pub unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: c_uint) -> *mut ibv_mw {
    const VERB: &str = "ibv_alloc_mw";
    guard(null_mut(), || {
        if pd.is_null() {
            fail_with(VERB, libc::EINVAL, "NULL pd");
            return null_mut();
        }
        let Some(t) = MwType::from_ibv(mw_type) else {
            fail_with(
                VERB,
                libc::EINVAL,
                &format!("no memory window type {mw_type}"),
            );
            return null_mut();
        };
        // SAFETY: a live PD (a Pd object).
        let p = unsafe { &*pd.cast::<Pd>() };
        let Ok(softpd) = live(VERB, &p.pd) else {
            return null_mut();
        };
        match softpd.alloc_mw(t) {
            Ok(mw) => {
                let m = objects::leak(Mw {
                    ibv: ibv_mw {
                        context: p.ibv.context,
                        pd,
                        rkey: mw.rkey().raw(),
                        handle: mw.handle().raw(),
                        type_: mw_type,
                    },
                    mw: Some(mw),
                });
                // SAFETY: a live PD.
                unsafe { ctx_of(pd) }.objects().mws.insert(m as usize);
                m.cast()
            }
            Err(e) => {
                fail(VERB, &e);
                null_mut()
            }
        }
    })
}

/// `ibv_dealloc_mw` (the `dealloc_mw` slot): the window's rkeys reach
/// nothing from now on.
pub unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    guard(libc::EIO, || {
        if mw.is_null() {
            return fail_with("ibv_dealloc_mw", libc::EINVAL, "NULL mw");
        }
        // SAFETY: a live MW (an Mw object), freed once; the drop of its
        // softrdma window deallocates it.
        unsafe {
            ctx_of(mw).objects().mws.remove(&(mw as usize));
            objects::free(mw.cast::<Mw>());
        }
        0
    })
}

/// `ibv_bind_mw` (the `bind_mw` slot; the header already refused a
/// type-2 window, a range without a region, and a region of another PD):
/// posts the bind as a work request with the next key byte and, once it
/// is posted, gives the window that rkey (`mw->rkey`), as rxe's provider
/// does — a bind that then completes in error leaves the program to undo
/// it. ZERO_BASED is refused (EINVAL): a type-1 window cannot be
/// zero-based.
pub unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    mw_bind: *mut ibv_mw_bind,
) -> c_int {
    const VERB: &str = "ibv_bind_mw";
    guard(libc::EIO, || {
        if qp.is_null() || mw.is_null() || mw_bind.is_null() {
            return fail_with(VERB, libc::EINVAL, "NULL argument");
        }
        // SAFETY: a readable ibv_mw_bind, a live MW and QP of this library.
        unsafe {
            let b = *mw_bind;
            let info = b.bind_info;
            if info.mw_access_flags & IBV_ACCESS_ZERO_BASED != 0 {
                return fail_with(VERB, libc::EINVAL, "a type-1 window cannot be zero-based");
            }
            if info.mr.is_null() && (info.addr != 0 || info.length != 0) {
                return fail_with(VERB, libc::EINVAL, "a range without a region");
            }
            let soft = match soft_qp(VERB, qp) {
                Ok(q) => q,
                Err(n) => return n,
            };
            let w = &mut *mw.cast::<Mw>();
            let Ok(win) = live(VERB, &w.mw) else {
                return libc::EINVAL;
            };
            let rkey = next_rkey(Rkey::from_raw(w.ibv.rkey));
            let wr = SendWr {
                xrc_srqn: None,
                wr_id: b.wr_id,
                op: SendOp::BindMw {
                    mw: win.handle(),
                    rkey,
                    bind: bind_of(&info),
                },
                sg_list: Vec::new(),
                flags: convert::send_flags(b.send_flags),
                ud: None,
            };
            match soft.post_send(&wr) {
                Ok(()) => {
                    w.ibv.rkey = rkey.raw();
                    0
                }
                Err(e) => fail(VERB, &e),
            }
        }
    })
}

/// `struct ibv_mw_bind_info` → softrdma's bind (the region by its lkey).
///
/// # Safety
/// `info.mr` is NULL or a live MR of this library.
pub unsafe fn bind_of(info: &ibv_mw_bind_info) -> MwBind {
    let mr = if info.mr.is_null() {
        None
    } else {
        // SAFETY: per the contract.
        Some(softrdma::Lkey::from_raw(unsafe { (*info.mr).lkey }))
    };
    MwBind {
        mr,
        addr: info.addr,
        length: info.length,
        access: AccessFlags::from_bits_retain(info.mw_access_flags),
    }
}
