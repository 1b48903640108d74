//! The library's objects behind the C structs it hands out.
//!
//! Each object is a `#[repr(C)]` Rust struct whose first field is the C
//! struct the application sees, so the application's pointer is also a
//! pointer to the whole object, and behind the C struct is the softrdma
//! object whose methods every verb calls (the hot paths need no lookups).
//! The objects with a destroy verb that can fail (EBUSY) hold theirs in an
//! `Option`: the destroy takes it out, and puts it back when it fails.
//! It is `None` only if a destroy panicked midway; the verbs then refuse
//! the object with EINVAL. A context is the exception to the layout: the
//! application gets `&vctx.context`, 320 bytes into a `verbs_context`,
//! because that is where the header's inline functions look for the
//! extended operations.

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::mem::offset_of;
use std::sync::Mutex;

use softrdma::per_process::PerProcess;
use softrdma::{CompChannel, Context, DeviceConfig};

use crate::abi::*;

/// A device of `ibv_get_device_list`: lives for the rest of the process.
#[repr(C)]
pub struct Dev {
    pub ibv: ibv_device,
    pub cfg: DeviceConfig,
    pub index: i32,
    /// `ibv_get_device_guid` (network order), stable per device name.
    pub guid_be: u64,
    /// The soft HCA while any context has it open, and those contexts
    /// (addresses of their [`Ctx`]): every `ibv_open_device` of one device in
    /// a process is a context on the same HCA (one address, one GID, one QP
    /// number space), as on hardware. Read with `lock_here`: a child made by
    /// fork(2) opens an HCA of its own (`softrdma::per_process`).
    pub open: Mutex<PerProcess<Option<SharedHca>>>,
}

/// A device's soft HCA and its open contexts (addresses of their [`Ctx`]).
pub type SharedHca = (Context, Vec<usize>);

/// An open device (`ibv_open_device`).
#[repr(C)]
pub struct Ctx {
    pub vctx: verbs_context,
    pub dev: Context,
    /// Engine handle → C object, to name the object of an async event.
    pub objs: Mutex<Objects>,
    /// Async events about this context's objects that another context of
    /// the same device took from the device's queue.
    pub pending_events: Mutex<std::collections::VecDeque<ibv_async_event>>,
}

/// The live objects of a context (addresses of their C structs): QPs,
/// CQs and SRQs by handle, to name the object of an event; all of them so
/// that closing the context releases what the program left open, as the
/// kernel does for rdma-core (perftest's `ib_send_bw`, for one, leaves
/// its receive CQ). Each softrdma object holds the device open.
#[derive(Default)]
pub struct Objects {
    pub qps: HashMap<u32, usize>,
    pub cqs: HashMap<u32, usize>,
    pub srqs: HashMap<u32, usize>,
    pub pds: HashSet<usize>,
    pub mrs: HashSet<usize>,
    pub mws: HashSet<usize>,
    pub ahs: HashSet<usize>,
    pub chans: HashSet<usize>,
}

/// A protection domain: softrdma's, so regions registered in it are
/// published for same-host peers. A parent domain
/// (`ibv_alloc_parent_domain`) is a `Pd` too, as rdma-core hands it out
/// where a PD goes: its `pd` is `None` and `domain` names the PD it was
/// made from, which every verb given it uses ([`Pd::soft`]).
#[repr(C)]
pub struct Pd {
    pub ibv: ibv_pd,
    pub pd: Option<softrdma::Pd>,
    pub domain: Option<crate::domains::ParentDomain>,
    /// Parent domains made from this PD: it cannot be deallocated while
    /// any exists (EBUSY, as the kernel refuses).
    pub children: std::sync::atomic::AtomicU32,
}

impl Pd {
    /// A plain PD around softrdma's.
    pub fn new(ibv: ibv_pd, pd: softrdma::Pd) -> Self {
        Pd {
            ibv,
            pd: Some(pd),
            domain: None,
            children: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// The softrdma PD a verb given this PD (or parent domain) works in,
    /// or EINVAL when it was destroyed.
    pub fn soft(&self, verb: &str) -> Result<&softrdma::Pd, std::ffi::c_int> {
        match &self.domain {
            // SAFETY: a parent domain's PD outlives it: deallocating the
            // PD fails (EBUSY) while `children` counts the domain.
            Some(d) => crate::verbs::live(verb, unsafe { &(*d.of).pd }),
            None => crate::verbs::live(verb, &self.pd),
        }
    }
}

/// A memory region: softrdma's, whose drop withdraws it from same-host
/// peers (waiting for any inside it) and deregisters it.
#[repr(C)]
pub struct Mr {
    pub ibv: ibv_mr,
    pub mr: Option<softrdma::Mr>,
    /// The device memory a region over it (`ibv_reg_dm_mr`) keeps
    /// mapped: the DM cannot be freed while such a region exists.
    pub dm: Option<std::sync::Arc<crate::dm::DmBuf>>,
}

/// A memory window: softrdma's, deallocated on drop.
#[repr(C)]
pub struct Mw {
    pub ibv: ibv_mw,
    pub mw: Option<softrdma::Mw>,
}

/// A completion queue.
#[repr(C)]
pub struct Cq {
    pub ibv: ibv_cq,
    /// The rest of `struct ibv_cq_ex`: set for `ibv_create_cq_ex`'s CQs.
    pub ex: crate::cq_ex::CqExTail,
    pub cq: Option<softrdma::Cq>,
    /// The completion `ibv_start_poll`/`ibv_next_poll` took, which the
    /// `ibv_wc_read_*` accessors read (only the polling thread touches it).
    pub cur: std::cell::UnsafeCell<ibv_wc>,
}

/// A queue pair. Its queue sizes ([`softrdma::Qp::cap`]) never change, so
/// the data path checks a caller's counts against them, with no lock,
/// before it reads the caller's arrays.
#[repr(C)]
pub struct Qp {
    pub ibv: ibv_qp,
    /// The rest of `struct ibv_qp_ex`: a QP made with send ops is one.
    pub ex: crate::qp_ex::QpExTail,
    pub qp: Option<softrdma::Qp>,
    /// The `ibv_wr_*` builder's WRs.
    pub pending: crate::qp_ex::Pending,
}

/// A shared receive queue; remembers its attributes for `ibv_query_srq`.
#[repr(C)]
pub struct Srq {
    pub ibv: ibv_srq,
    pub srq: Option<softrdma::Srq>,
    pub attr: Mutex<ibv_srq_attr>,
}

/// An address handle.
#[repr(C)]
pub struct Ah {
    pub ibv: ibv_ah,
    pub ah: Option<softrdma::Ah>,
}

/// A completion channel.
#[repr(C)]
pub struct Chan {
    pub ibv: ibv_comp_channel,
    pub ch: Option<CompChannel>,
}

/// Offset of the application's `ibv_context` inside [`Ctx`].
pub const CONTEXT_OFFSET: usize = offset_of!(verbs_context, context);
const _: () = assert!(CONTEXT_OFFSET == 320);
const _: () = assert!(offset_of!(Ctx, vctx) == 0);

impl Ctx {
    /// The context behind an application's `ibv_context` pointer.
    ///
    /// # Safety
    /// `ctx` must come from this library's `ibv_open_device` and not be
    /// closed yet (the libibverbs contract for every verb).
    pub unsafe fn from_ptr<'a>(ctx: *mut ibv_context) -> &'a Ctx {
        // SAFETY: per the contract, `ctx` is the `vctx.context` field of a
        // live, boxed Ctx whose first field is `vctx`; stepping back by the
        // field offset gives the Ctx itself.
        unsafe { &*ctx.cast::<u8>().sub(CONTEXT_OFFSET).cast::<Ctx>() }
    }

    /// The pointer the application gets.
    pub fn as_ibv(&self) -> *mut ibv_context {
        std::ptr::addr_of!(self.vctx.context).cast_mut()
    }

    /// The C object of a QP, CQ or SRQ handle (async events).
    pub fn lookup(&self, f: impl FnOnce(&Objects) -> Option<usize>) -> Option<*mut c_void> {
        let o = self.objs.lock().unwrap_or_else(|e| e.into_inner());
        f(&o).map(|a| a as *mut c_void)
    }

    /// Updates the handle maps.
    pub fn objects(&self) -> std::sync::MutexGuard<'_, Objects> {
        self.objs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// At `ibv_close_device`: destroys the softrdma objects the program
    /// left open, users before what they use (QPs, then SRQs, AHs, MWs, MRs,
    /// CQs, channels, PDs), so that the device closes with its context.
    /// The C structs stay allocated: a program that still uses one gets
    /// EINVAL, not freed memory.
    ///
    /// # Safety
    /// Every address in the maps is a live object of its kind, which no
    /// other thread uses meanwhile (using objects while their context
    /// closes breaks the libibverbs contract).
    pub unsafe fn release_objects(&self) {
        let o = std::mem::take(&mut *self.objects());
        // SAFETY: per the contract; each assignment drops the softrdma
        // object (its destroy), once, and leaves the C struct in place.
        unsafe {
            for &a in o.qps.values() {
                (*(a as *mut Qp)).qp = None;
            }
            for &a in o.srqs.values() {
                (*(a as *mut Srq)).srq = None;
            }
            for &a in &o.ahs {
                (*(a as *mut Ah)).ah = None;
            }
            for &a in &o.mws {
                (*(a as *mut Mw)).mw = None;
            }
            for &a in &o.mrs {
                (*(a as *mut Mr)).mr = None;
            }
            for &a in o.cqs.values() {
                (*(a as *mut Cq)).cq = None;
            }
            for &a in &o.chans {
                (*(a as *mut Chan)).ch = None;
            }
            for &a in &o.pds {
                (*(a as *mut Pd)).pd = None;
            }
        }
    }
}

/// A zeroed pthread mutex, which is PTHREAD_MUTEX_INITIALIZER on glibc.
pub fn new_mutex() -> libc::pthread_mutex_t {
    libc::PTHREAD_MUTEX_INITIALIZER
}

/// PTHREAD_COND_INITIALIZER.
pub fn new_cond() -> libc::pthread_cond_t {
    libc::PTHREAD_COND_INITIALIZER
}

/// Moves `v` to the heap and hands out its address (freed by [`free`]).
pub fn leak<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

/// Frees an object made by [`leak`].
///
/// # Safety
/// `p` must come from [`leak`] with the same `T` and not be freed already.
pub unsafe fn free<T>(p: *mut T) {
    // SAFETY: forwarded from this function's contract.
    drop(unsafe { Box::from_raw(p) });
}
