//! Extended CQs: `ibv_create_cq_ex` (the `create_cq_ex` slot of
//! `verbs_context`) and the polling API the header's inline functions call
//! through `struct ibv_cq_ex`'s pointers: `ibv_start_poll`,
//! `ibv_next_poll`, `ibv_end_poll`, `ibv_wc_read_*`.
//!
//! Every CQ object (`objects::Cq`) is laid out as an `ibv_cq_ex`: its
//! `ibv_cq` is followed by [`CqExTail`]. `start_poll` and `next_poll` take
//! one completion with the classic poll (same progress, same conversion)
//! into the object; the accessors read it. Completion timestamps are not
//! offered (the device reports no `hca_core_clock`): asking for them is
//! EOPNOTSUPP, as are parent domains and IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN.

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;

use crate::abi::*;
use crate::ffi::{fail_with, guard};
use crate::objects::Cq;

type CqX = *mut Cq;

/// `struct ibv_cq_ex` after the part it shares with `struct ibv_cq`
/// (offset 128).
#[repr(C)]
pub struct CqExTail {
    pub comp_mask: u32,
    pub status: c_uint,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(CqX, *mut c_void) -> c_int>,
    pub next_poll: Option<unsafe extern "C" fn(CqX) -> c_int>,
    pub end_poll: Option<unsafe extern "C" fn(CqX)>,
    pub read_opcode: Option<unsafe extern "C" fn(CqX) -> c_uint>,
    pub read_vendor_err: Option<unsafe extern "C" fn(CqX) -> u32>,
    pub read_byte_len: Option<unsafe extern "C" fn(CqX) -> u32>,
    pub read_imm_data: Option<unsafe extern "C" fn(CqX) -> u32>,
    pub read_qp_num: Option<unsafe extern "C" fn(CqX) -> u32>,
    pub read_src_qp: Option<unsafe extern "C" fn(CqX) -> u32>,
    pub read_wc_flags: Option<unsafe extern "C" fn(CqX) -> c_uint>,
    pub read_slid: Option<unsafe extern "C" fn(CqX) -> u32>,
    pub read_sl: Option<unsafe extern "C" fn(CqX) -> u8>,
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(CqX) -> u8>,
    pub read_completion_ts: Option<unsafe extern "C" fn(CqX) -> u64>,
    pub read_cvlan: Option<unsafe extern "C" fn(CqX) -> u16>,
    pub read_flow_tag: Option<unsafe extern "C" fn(CqX) -> u32>,
    pub read_tm_info: Option<unsafe extern "C" fn(CqX, *mut c_void)>,
    pub read_completion_wallclock_ns: Option<unsafe extern "C" fn(CqX) -> u64>,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    // gdb ptype /o struct ibv_cq_ex (rdma-core v44, x86-64), less 128.
    assert!(offset_of!(Cq, ex) == 128);
    assert!(offset_of!(CqExTail, status) == 132 - 128);
    assert!(offset_of!(CqExTail, wr_id) == 136 - 128);
    assert!(offset_of!(CqExTail, start_poll) == 144 - 128);
    assert!(offset_of!(CqExTail, read_opcode) == 168 - 128);
    assert!(offset_of!(CqExTail, read_completion_ts) == 248 - 128);
    assert!(offset_of!(CqExTail, read_completion_wallclock_ns) == 280 - 128);
    assert!(size_of::<CqExTail>() == 288 - 128);
};

impl CqExTail {
    /// A classic CQ's: no extended polling.
    pub const fn none() -> Self {
        CqExTail {
            comp_mask: 0,
            status: 0,
            wr_id: 0,
            start_poll: None,
            next_poll: None,
            end_poll: None,
            read_opcode: None,
            read_vendor_err: None,
            read_byte_len: None,
            read_imm_data: None,
            read_qp_num: None,
            read_src_qp: None,
            read_wc_flags: None,
            read_slid: None,
            read_sl: None,
            read_dlid_path_bits: None,
            read_completion_ts: None,
            read_cvlan: None,
            read_flow_tag: None,
            read_tm_info: None,
            read_completion_wallclock_ns: None,
        }
    }

    fn poller() -> Self {
        CqExTail {
            start_poll: Some(start_poll),
            next_poll: Some(next_poll),
            end_poll: Some(end_poll),
            read_opcode: Some(read_opcode),
            read_vendor_err: Some(read_vendor_err),
            read_byte_len: Some(read_byte_len),
            read_imm_data: Some(read_imm_data),
            read_qp_num: Some(read_qp_num),
            read_src_qp: Some(read_src_qp),
            read_wc_flags: Some(read_wc_flags),
            read_slid: Some(read_slid),
            read_sl: Some(read_sl),
            read_dlid_path_bits: Some(read_dlid_path_bits),
            ..Self::none()
        }
    }
}

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(offset_of!(ibv_cq_init_attr_ex, wc_flags) == 32);
    assert!(offset_of!(ibv_cq_init_attr_ex, flags) == 44);
    assert!(size_of::<ibv_cq_init_attr_ex>() == 56);
};

/// IBV_WC_STANDARD_FLAGS: byte_len, imm, qp_num, src_qp, slid, sl,
/// dlid_path_bits.
const WC_STANDARD_FLAGS: u64 = 0x7f;
const CQ_INIT_ATTR_MASK_FLAGS: u32 = 1;
/// `IBV_CQ_INIT_ATTR_MASK_PD`: `parent_domain` is set.
const CQ_INIT_ATTR_MASK_PD: u32 = 2;
const CREATE_CQ_ATTR_SINGLE_THREADED: u32 = 1;

/// The `create_cq_ex` slot.
pub unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq {
    const VERB: &str = "ibv_create_cq_ex";
    guard(null_mut(), || {
        if context.is_null() || attr.is_null() {
            fail_with(VERB, libc::EINVAL, "NULL context or attributes");
            return null_mut();
        }
        // SAFETY: readable attributes (the verb's contract).
        let a = unsafe { &*attr };
        if a.comp_mask & !(CQ_INIT_ATTR_MASK_FLAGS | CQ_INIT_ATTR_MASK_PD) != 0 {
            let why = format!("comp_mask {:#x} has unknown bits", a.comp_mask);
            fail_with(VERB, libc::EINVAL, &why);
            return null_mut();
        }
        // A CQ in a parent domain: it must be one (as mlx5 checks); its
        // thread domain changes nothing here (docs/ibverbs.md).
        if a.comp_mask & CQ_INIT_ATTR_MASK_PD != 0
            && (a.parent_domain.is_null()
                // SAFETY: a live PD of this library when not NULL.
                || unsafe { (*a.parent_domain.cast::<crate::objects::Pd>()).domain.is_none() })
        {
            fail_with(VERB, libc::EINVAL, "parent_domain is not a parent domain");
            return null_mut();
        }
        if a.comp_mask & CQ_INIT_ATTR_MASK_FLAGS != 0
            && a.flags & !CREATE_CQ_ATTR_SINGLE_THREADED != 0
        {
            fail_with(
                VERB,
                libc::EOPNOTSUPP,
                "only IBV_CREATE_CQ_ATTR_SINGLE_THREADED is supported",
            );
            return null_mut();
        }
        if a.wc_flags & !WC_STANDARD_FLAGS != 0 {
            fail_with(
                VERB,
                libc::EOPNOTSUPP,
                "completion timestamps, CVLAN, flow tags and TM info are not offered",
            );
            return null_mut();
        }
        let Ok(cqe) = c_int::try_from(a.cqe) else {
            fail_with(VERB, libc::EINVAL, "cqe above max_cqe");
            return null_mut();
        };
        let Ok(vector) = c_int::try_from(a.comp_vector) else {
            fail_with(VERB, libc::EINVAL, "comp_vector out of range");
            return null_mut();
        };
        // SAFETY: a live context; the channel NULL or live.
        let cq =
            unsafe { crate::verbs::ibv_create_cq(context, cqe, a.cq_context, a.channel, vector) };
        if !cq.is_null() {
            // SAFETY: just created, a Cq object no other thread knows yet.
            unsafe { (*cq.cast::<Cq>()).ex = CqExTail::poller() };
        }
        cq
    })
}

/// Takes the next completion into the object; ENOENT when there is none.
///
/// # Safety
/// `cq` is a live extended CQ, polled by one thread at a time (the API's
/// contract between start_poll and end_poll).
unsafe fn take(cq: CqX) -> c_int {
    // SAFETY: per the contract; the current completion is only touched by
    // the polling thread.
    unsafe {
        let cur = (*cq).cur.get();
        match crate::verbs::poll_cq(cq.cast(), 1, cur) {
            1 => {
                (*cq).ex.status = (*cur).status;
                (*cq).ex.wr_id = (*cur).wr_id;
                0
            }
            0 => libc::ENOENT,
            n => -n,
        }
    }
}

unsafe extern "C" fn start_poll(cq: CqX, attr: *mut c_void) -> c_int {
    // `struct ibv_poll_cq_attr { uint32_t comp_mask; }`: no bit is defined.
    // SAFETY: attr is readable (the API's contract).
    if !attr.is_null() && unsafe { attr.cast::<u32>().read() } != 0 {
        return libc::EINVAL;
    }
    // SAFETY: forwarded contract.
    guard(libc::EIO, || unsafe { take(cq) })
}

unsafe extern "C" fn next_poll(cq: CqX) -> c_int {
    // SAFETY: forwarded contract.
    guard(libc::EIO, || unsafe { take(cq) })
}

unsafe extern "C" fn end_poll(_cq: CqX) {}

/// The current completion.
///
/// # Safety
/// `cq` is a live extended CQ between a successful start/next_poll and
/// end_poll, on the polling thread.
unsafe fn cur<'a>(cq: CqX) -> &'a ibv_wc {
    // SAFETY: per the contract.
    unsafe { &*(*cq).cur.get() }
}

macro_rules! readers {
    ($($name:ident -> $t:ty = |$w:ident| $e:expr;)*) => {$(
        unsafe extern "C" fn $name(cq: CqX) -> $t {
            // SAFETY: the accessors' contract, as `cur`'s.
            let $w = unsafe { cur(cq) };
            $e
        }
    )*};
}

readers! {
    read_opcode -> c_uint = |w| w.opcode;
    read_vendor_err -> u32 = |w| w.vendor_err;
    read_byte_len -> u32 = |w| w.byte_len;
    read_imm_data -> u32 = |w| w.imm_data;
    read_qp_num -> u32 = |w| w.qp_num;
    read_src_qp -> u32 = |w| w.src_qp;
    read_wc_flags -> c_uint = |w| w.wc_flags;
    read_slid -> u32 = |w| u32::from(w.slid);
    read_sl -> u8 = |w| w.sl;
    read_dlid_path_bits -> u8 = |w| w.dlid_path_bits;
}
