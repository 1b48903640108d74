//! `ibv_rereg_mr`: changes a registered region's address range, PD or
//! access rights in place — the program keeps its `ibv_mr` and its keys
//! (`softrdma::Mr::rereg_raw`). Work requests and peers' operations see the
//! old region or the new one; grants same-host peers held on it are taken
//! back.
//!
//! Results, as rdma-core's: 0; IBV_REREG_MR_ERR_INPUT (errno EINVAL) for
//! flags outside IBV_REREG_MR_FLAGS_SUPPORTED, a new translation without an
//! address or length, access flags without IBV_REREG_MR_CHANGE_ACCESS, or a
//! new PD that is NULL or of another device; IBV_REREG_MR_ERR_CMD (errno
//! from the engine, EINVAL for REMOTE_WRITE or REMOTE_ATOMIC without
//! LOCAL_WRITE) when the change is refused. Either way the region stays as
//! it was (the man page allows less: after ERR_CMD "MR shouldn't be used").

use std::ffi::{c_int, c_void};

use crate::abi::*;
use crate::ffi::{fail, fail_with, guard};
use crate::objects::{Mr, Pd};
use crate::verbs::access_flags;

const CHANGE_TRANSLATION: c_int = 1;
const CHANGE_PD: c_int = 2;
const CHANGE_ACCESS: c_int = 4;
const FLAGS_SUPPORTED: c_int = 7;

const ERR_INPUT: c_int = -1;
const ERR_CMD: c_int = -4;

fn input_error(why: &str) -> c_int {
    fail_with("ibv_rereg_mr", libc::EINVAL, why);
    ERR_INPUT
}

pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    guard(ERR_INPUT, || {
        if mr.is_null() {
            return input_error("NULL mr");
        }
        if flags & !FLAGS_SUPPORTED != 0 {
            return input_error("unknown flags");
        }
        let translate = flags & CHANGE_TRANSLATION != 0;
        if translate && (addr.is_null() || length == 0) {
            return input_error("a new translation needs an address and a length");
        }
        if access != 0 && flags & CHANGE_ACCESS == 0 {
            return input_error("access flags without IBV_REREG_MR_CHANGE_ACCESS");
        }
        // SAFETY: a live MR of this library (the verb's contract), which
        // the program does not use from another thread meanwhile.
        let m = unsafe { &mut *mr.cast::<Mr>() };
        let new_pd = if flags & CHANGE_PD != 0 {
            if pd.is_null() {
                return input_error("IBV_REREG_MR_CHANGE_PD with a NULL pd");
            }
            // SAFETY: a live PD of this library (the verb's contract).
            if unsafe { (*pd).context } != m.ibv.context {
                return input_error("the new pd belongs to another context");
            }
            // SAFETY: as above.
            let p = unsafe { &*pd.cast::<Pd>() };
            match p.soft("ibv_rereg_mr") {
                Ok(p) => Some(p),
                Err(_) => return ERR_INPUT,
            }
        } else {
            None
        };
        let (rights, zero_based) = access_flags(access);
        let rights = (flags & CHANGE_ACCESS != 0).then_some(rights);
        let translation = translate.then(|| {
            let iova = if zero_based { 0 } else { addr as u64 };
            (addr.cast::<u8>(), length, iova)
        });
        let Some(soft) = m.mr.as_mut() else {
            return input_error("the region was released with its context");
        };
        // SAFETY: the program keeps addr..addr+length valid while it is
        // registered and does not write it during the call (the verb's
        // contract, as for ibv_reg_mr).
        match unsafe { soft.rereg_raw(new_pd, rights, translation) } {
            Ok(()) => {
                if !pd.is_null() && flags & CHANGE_PD != 0 {
                    m.ibv.pd = pd;
                }
                if translate {
                    m.ibv.addr = addr;
                    m.ibv.length = length;
                }
                0
            }
            Err(e) => {
                fail("ibv_rereg_mr", &e);
                ERR_CMD
            }
        }
    })
}
