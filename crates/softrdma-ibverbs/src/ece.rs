//! `ibv_query_ece` / `ibv_set_ece`: Enhanced Connection Establishment
//! options of a QP, the negotiation of softrdma's selective repeat
//! (docs/transport.md, "Negotiation: ECE options"). The values are the
//! engine's `Ece`: vendor `0x00535201`, option bit 0 selective repeat.

use std::ffi::c_int;
use std::ptr;

use crate::abi::{ibv_ece, ibv_qp};
use crate::ffi::{fail, fail_with, guard};
use crate::objects::Qp;
use crate::verbs::live;

/// The softrdma QP of `qp`.
///
/// # Safety
/// `qp` is a live QP of this library.
unsafe fn soft_qp<'a>(verb: &str, qp: *mut ibv_qp) -> Result<&'a softrdma::Qp, c_int> {
    // SAFETY: per the contract, a live Qp object; only its `qp` field is
    // borrowed.
    live(verb, unsafe { &*ptr::addr_of!((*qp.cast::<Qp>()).qp) })
}

/// `ibv_query_ece`: what the QP offers (every option the engine can do)
/// until `ibv_set_ece` sets the agreed ones, then those. Returns 0, or
/// EINVAL for a NULL argument.
pub unsafe extern "C" fn ibv_query_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    const VERB: &str = "ibv_query_ece";
    guard(libc::EIO, || {
        if qp.is_null() || ece.is_null() {
            return fail_with(VERB, libc::EINVAL, "NULL argument");
        }
        // SAFETY: a live QP; `ece` points to a writable struct ibv_ece.
        unsafe {
            let q = match soft_qp(VERB, qp) {
                Ok(q) => q,
                Err(n) => return n,
            };
            match q.query_ece() {
                Ok(e) => {
                    ece.write(ibv_ece {
                        vendor_id: e.vendor_id,
                        options: e.options,
                        comp_mask: 0,
                    });
                    0
                }
                Err(e) => fail(VERB, &e),
            }
        }
    })
}

/// `ibv_set_ece`: the options both ends agreed to, on an RC QP in RESET
/// or INIT. As rdma-core: a vendor ID of 0 is EOPNOTSUPP. Another
/// vendor's ID, an option bit the engine does not know, a `comp_mask`,
/// a UC or UD QP and a QP past INIT are EINVAL. On success `*ece` holds
/// the options accepted (all that were asked).
pub unsafe extern "C" fn ibv_set_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    const VERB: &str = "ibv_set_ece";
    guard(libc::EIO, || {
        if qp.is_null() || ece.is_null() {
            return fail_with(VERB, libc::EINVAL, "NULL argument");
        }
        // SAFETY: a live QP; `ece` points to a readable and writable
        // struct ibv_ece.
        unsafe {
            let want = ece.read();
            if want.vendor_id == 0 {
                return fail_with(VERB, libc::EOPNOTSUPP, "vendor_id 0");
            }
            if want.comp_mask != 0 {
                return fail_with(VERB, libc::EINVAL, "comp_mask is not 0");
            }
            let q = match soft_qp(VERB, qp) {
                Ok(q) => q,
                Err(n) => return n,
            };
            let e = softrdma::Ece {
                vendor_id: want.vendor_id,
                options: want.options,
            };
            match q.set_ece(e) {
                Ok(()) => 0,
                Err(e) => fail(VERB, &e),
            }
        }
    })
}
