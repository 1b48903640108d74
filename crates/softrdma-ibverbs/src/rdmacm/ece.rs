//! ECE through the rdma_cm (`rdma_set_local_ece`, `rdma_get_remote_ece`,
//! `rdma_reject_ece`, and what `rdma_connect`/`rdma_accept` offer), in
//! rdma-core librdmacm's model: an id keeps a local ECE, which its REQ
//! (or REP) carries, and reads the peer's from the exchange.
//!
//! - An id **without a QP** (its owner moves its own QP, as UCX's rdmacm
//!   transport does) offers what `rdma_set_local_ece` set, nothing
//!   otherwise; its owner reads the peer's answer with
//!   `rdma_get_remote_ece` and sets its QP with `ibv_set_ece`.
//! - An id **with a QP** (`rdma_create_qp`): the device's CM applies the
//!   agreed options to the QP before RTR (`softrdma::rdma_cm`). Its REP
//!   answers a REQ's offer with what the QP can do (`ibv_query_ece`), as
//!   librdmacm's `init_ece` does. Its REQ offers the QP's options only under
//!   `SOFTRDMA_CM_ECE=1`: rdma-core's librdmacm always offers them (on a
//!   device that has ECE), but here the default keeps the REQ the bytes it
//!   was and the transport plain go-back-N, so that a program that never
//!   asked for selective repeat does not get it, and rxe and the kernel
//!   see what they saw before. Either way a REQ or REP to a peer that sent
//!   no ECE carries none.
//!
//! As rdma-core: `rdma_set_local_ece` and `rdma_get_remote_ece` are for ids
//! without a QP (EINVAL with one), a vendor ID of 0 or a `comp_mask` is
//! EINVAL; `rdma_reject_ece` is `rdma_reject` with reason 35 (vendor option
//! not supported).

use std::ffi::{c_int, c_void};

use softrdma::Ece;

use super::abi::rdma_cm_id;
use super::Id;
use crate::abi::ibv_ece;
use crate::ffi::{self, guard};

/// `SOFTRDMA_CM_ECE=1`: ids with a QP offer its ECE options in their REQ.
fn offer_by_default() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SOFTRDMA_CM_ECE").is_some_and(|v| v == "1"))
}

/// What the QP of `id` can do (`ibv_query_ece`), or nothing without one.
fn qp_options(id: &Id) -> Ece {
    // SAFETY: the id's QP is NULL or live.
    match unsafe { super::qp::soft_qp(id) } {
        Some(qp) => qp.query_ece().unwrap_or_default(),
        None => Ece::default(),
    }
}

/// The ECE `rdma_connect` offers for `id`: `rdma_set_local_ece`'s for an
/// id without a QP; the QP's options under `SOFTRDMA_CM_ECE=1`; else none.
pub(super) fn offer(id: &Id) -> Ece {
    if id.c.qp.is_null() {
        return id.state().local_ece;
    }
    if offer_by_default() {
        qp_options(id)
    } else {
        Ece::default()
    }
}

/// The ECE `rdma_accept` can do for `id` (the device's CM answers the
/// REQ's offer with the part both can do): `rdma_set_local_ece`'s for an
/// id without a QP, the QP's options otherwise.
pub(super) fn answer(id: &Id) -> Ece {
    if id.c.qp.is_null() {
        id.state().local_ece
    } else {
        qp_options(id)
    }
}

fn ret(verb: &str, r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            ffi::fail_with(verb, e, "refused");
            -1
        }
    }
}

/// `rdma_set_local_ece`: the ECE an id without a QP offers (or answers
/// with). EINVAL for a NULL or unknown id, an id with a QP, a NULL `ece`,
/// vendor ID 0 or a non-zero `comp_mask`, as rdma-core.
pub unsafe extern "C" fn softrdma_rdmacm_rdma_set_local_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    guard(-1, || {
        let r = (|| {
            let id = Id::live(id).ok_or(libc::EINVAL)?;
            // SAFETY: NULL or a readable struct ibv_ece (the contract).
            let e = unsafe { ece.as_ref() }.ok_or(libc::EINVAL)?;
            if !id.c.qp.is_null() || e.vendor_id == 0 || e.comp_mask != 0 {
                return Err(libc::EINVAL);
            }
            id.state().local_ece = Ece {
                vendor_id: e.vendor_id,
                options: e.options,
            };
            Ok(())
        })();
        ret("rdma_set_local_ece", r)
    })
}

/// `rdma_get_remote_ece`: the ECE the peer sent (its REQ's offer on the
/// passive side, its REP's answer on the active side once the REP came),
/// zero when it sent none or nothing came yet. EINVAL for a NULL or
/// unknown id, an id with a QP, or a NULL `ece`, as rdma-core.
pub unsafe extern "C" fn softrdma_rdmacm_rdma_get_remote_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    guard(-1, || {
        let r = (|| {
            let id = Id::live(id).ok_or(libc::EINVAL)?;
            if !id.c.qp.is_null() || ece.is_null() {
                return Err(libc::EINVAL);
            }
            let conn = id.state().conn;
            let got = match (conn, id.ctx()) {
                (Some(conn), Some(ctx)) => ctx.dev.cm().remote_ece(conn).unwrap_or_default(),
                _ => Ece::default(),
            };
            // SAFETY: a writable struct ibv_ece (checked non-NULL above).
            unsafe {
                ece.write(ibv_ece {
                    vendor_id: got.vendor_id,
                    options: got.options,
                    comp_mask: 0,
                })
            };
            Ok(())
        })();
        ret("rdma_get_remote_ece", r)
    })
}

/// `rdma_reject_ece`: rejects the id's connection request as
/// `rdma_reject` does, with reason 35 (vendor option not supported), which
/// the peer's REJECTED event carries as its status.
pub unsafe extern "C" fn softrdma_rdmacm_rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    guard(-1, || {
        let r = (|| {
            let id = Id::live(id).ok_or(libc::EINVAL)?;
            let ctx = id.ctx().ok_or(libc::EINVAL)?;
            let conn = id.state().conn.ok_or(libc::EINVAL)?;
            // SAFETY: per the contract, `len` readable bytes or NULL.
            let data = unsafe { super::private_data(private_data, len) };
            ctx.dev.cm().reject_ece(conn, data).map_err(|e| e.errno())
        })();
        ret("rdma_reject_ece", r)
    })
}
