//! The verbs on objects: protection domains, memory regions, completion
//! queues and their events, queue pairs, shared receive queues, address
//! handles, and the data path (`post_send`, `post_recv`, `post_srq_recv`,
//! `poll_cq`, `req_notify_cq`), which programs reach through the function
//! pointers in `ctx->ops` because the header makes them inline.
//!
//! Every verb is a call of softrdma's public API on the object behind the
//! C struct (`softrdma::Qp::post_send`, `softrdma::Cq::poll`, …): this
//! module translates the C structs, checks what the C ABI lets a caller
//! get wrong (counts, NULLs), and reports errors the libibverbs way. The
//! API runs progress inline: the program's polling drives receive, timers
//! and transmit with no thread hand-off, and the device's background
//! thread, which wakes when packets arrive, serves one-sided operations to
//! a program that is busy elsewhere (spinning on memory, blocked in
//! `ibv_get_cq_event`).

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::ptr::{self, null_mut};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use softrdma::{
    AccessFlags, AhHandle, QpType, Qpn, RecvWr, SendFlags, SendOp, SendWr, Sge, SrqInit, UdDest,
    WorkCompletion,
};

use crate::abi::*;
use crate::convert;
use crate::ffi::{self, fail, fail_with, guard};
use crate::objects::{self, Ah, Chan, Cq, Ctx, Mr, Pd, Qp, Srq};

/// # Safety
/// `p` must be a live object of this library whose first field is an
/// `ibv_context *` (every verbs object is).
pub(crate) unsafe fn ctx_of<'a, T>(p: *mut T) -> &'a Ctx {
    // SAFETY: all verbs structs start with their `struct ibv_context *`,
    // which points into a live Ctx (contract of every verb).
    unsafe { Ctx::from_ptr(*p.cast::<*mut ibv_context>()) }
}

// ----- protection domains -----

pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard(null_mut(), || {
        if context.is_null() {
            fail_with("ibv_alloc_pd", libc::EINVAL, "NULL context");
            return null_mut();
        }
        // SAFETY: live context.
        let c = unsafe { Ctx::from_ptr(context) };
        match c.dev.alloc_pd() {
            Ok(pd) => {
                let p = objects::leak(Pd::new(
                    ibv_pd {
                        context,
                        handle: pd.handle().raw(),
                    },
                    pd,
                ));
                c.objects().pds.insert(p as usize);
                p.cast()
            }
            Err(e) => {
                fail_with("ibv_alloc_pd", e.errno(), &e.to_string());
                null_mut()
            }
        }
    })
}

/// The softrdma object inside a C object (see `objects`), or EINVAL.
pub(crate) fn live<'a, T>(verb: &str, slot: &'a Option<T>) -> Result<&'a T, c_int> {
    slot.as_ref()
        .ok_or_else(|| fail_with(verb, libc::EINVAL, "the object was destroyed"))
}

/// What every destroy verb does: EINVAL for NULL, then softrdma's destroy
/// of the object in `slot` (its errno on refusal, EBUSY for an object in
/// use, and the object stays as it was), then `release` drops the
/// library's bookkeeping and frees the C object.
///
/// # Safety
/// `obj` is NULL or a live object of this library whose first field is an
/// `ibv_context *`, and `slot` gives the address of its softrdma object;
/// on success it is freed and must not be used again.
pub(crate) unsafe fn destroy<O, T>(
    verb: &str,
    obj: *mut O,
    slot: impl FnOnce(*mut O) -> *mut Option<T>,
    destroy: impl FnOnce(T) -> Result<(), (T, softrdma::Error)>,
    release: impl FnOnce(&Ctx, *mut O),
) -> c_int {
    guard(libc::EIO, || {
        if obj.is_null() {
            // "ibv_destroy_cq" → "NULL cq"
            let what = verb.rsplit('_').next().unwrap_or(verb);
            return fail_with(verb, libc::EINVAL, &format!("NULL {what}"));
        }
        // SAFETY: a live object, per the contract, not used by another
        // thread while it is destroyed (the libibverbs contract).
        unsafe {
            let c = ctx_of(obj);
            let slot = slot(obj);
            let Some(inner) = (*slot).take() else {
                return fail_with(verb, libc::EINVAL, "the object was destroyed");
            };
            if let Err((inner, e)) = destroy(inner) {
                *slot = Some(inner);
                return fail(verb, &e);
            }
            release(c, obj);
        }
        0
    })
}

/// EBUSY while MRs, QPs, SRQs, AHs or parent domains still use it. A
/// parent domain is deallocated here too (`domains::dealloc_domain`).
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    // SAFETY: a live PD or parent domain of this library, or NULL (the
    // verb's contract).
    if !pd.is_null() && unsafe { (*pd.cast::<Pd>()).domain.is_some() } {
        // SAFETY: as above, a parent domain.
        return guard(libc::EIO, || unsafe {
            crate::domains::dealloc_domain(pd.cast())
        });
    }
    // SAFETY: as above.
    if !pd.is_null() && unsafe { (*pd.cast::<Pd>()).children.load(Ordering::Acquire) } > 0 {
        return fail_with(
            "ibv_dealloc_pd",
            libc::EBUSY,
            "parent domains still use the PD",
        );
    }
    // SAFETY: `destroy`'s contract is the verb's (a live object or NULL);
    // the closures run inside it on that live object, the last once.
    unsafe {
        destroy(
            "ibv_dealloc_pd",
            pd.cast::<Pd>(),
            |p| ptr::addr_of_mut!((*p).pd),
            softrdma::Pd::dealloc,
            |c, p| {
                c.objects().pds.remove(&(p as usize));
                objects::free(p);
            },
        )
    }
}

// ----- memory regions -----

/// The engine's access flags for a program's: hints a soft device can
/// ignore (`IBV_ACCESS_OPTIONAL_RANGE`, e.g. RELAXED_ORDERING; HUGETLB)
/// are dropped, MW_BIND is kept (memory windows bind only to regions that
/// have it), and ZERO_BASED (true in the second value) is a choice of
/// virtual address, not a right.
pub(crate) fn access_flags(access: c_int) -> (AccessFlags, bool) {
    let bits = access as u32;
    let zero_based = bits & IBV_ACCESS_ZERO_BASED != 0;
    let rights = bits & !(IBV_ACCESS_OPTIONAL_RANGE | IBV_ACCESS_HUGETLB | IBV_ACCESS_ZERO_BASED);
    (AccessFlags::from_bits_retain(rights), zero_based)
}

/// Registers `len` bytes at `addr` under virtual address `iova` (0 for
/// ZERO_BASED) in the softrdma PD `pd`, with [`access_flags`]. ON_DEMAND
/// registers with on-demand paging (`Pd::register_odp`), and with a NULL
/// address and length SIZE_MAX over the whole address space (implicit
/// ODP).
///
/// # Safety
/// The caller keeps addr..addr+len valid until the region is dropped (the
/// ibv_reg_mr contract), which register_raw_shared requires, and does not
/// write it meanwhile.
unsafe fn register(
    pd: &softrdma::Pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> softrdma::Result<softrdma::Mr> {
    let (access, zero_based) = access_flags(access);
    let iova = if zero_based { 0 } else { iova };
    let odp = access.contains(AccessFlags::ON_DEMAND);
    if odp && addr.is_null() && len == usize::MAX {
        // Implicit ODP: the whole address space (rdma-core's NULL, SIZE_MAX).
        // SAFETY: forwarded from this function's contract, for all of the
        // process's memory (what implicit ODP asks of its caller).
        return unsafe { pd.register_implicit_odp(access) };
    }
    if odp {
        // SAFETY: forwarded from this function's contract.
        return unsafe { pd.register_odp(addr.cast(), len, iova, access) };
    }
    // SAFETY: forwarded from this function's contract.
    unsafe { pd.register_raw_shared(addr.cast(), len, iova, access) }
}

/// `ibv_reg_mr` and its variants: [`register`] behind a new `ibv_mr`
/// (ON_DEMAND with a NULL address and length SIZE_MAX: implicit ODP).
unsafe fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    let odp = access as u32 & IBV_ACCESS_ON_DEMAND != 0;
    // Implicit ODP: the whole address space (rdma-core's NULL, SIZE_MAX).
    let implicit = odp && addr.is_null() && len == usize::MAX;
    if pd.is_null() || (addr.is_null() && len > 0 && !implicit) {
        fail_with("ibv_reg_mr", libc::EINVAL, "NULL pd or address");
        return null_mut();
    }
    // SAFETY: a live PD (a Pd object); the memory per the ibv_reg_mr
    // contract, which is `register`'s.
    unsafe {
        let p = &*pd.cast::<Pd>();
        let Ok(softpd) = p.soft("ibv_reg_mr") else {
            return null_mut();
        };
        match register(softpd, addr, len, iova, access) {
            Ok(mr) => {
                let m = objects::leak(Mr {
                    ibv: ibv_mr {
                        context: p.ibv.context,
                        pd,
                        addr,
                        length: len,
                        handle: mr.lkey().raw(),
                        lkey: mr.lkey().raw(),
                        rkey: mr.rkey().raw(),
                    },
                    mr: Some(mr),
                    dm: None,
                });
                ctx_of(pd).objects().mrs.insert(m as usize);
                m.cast()
            }
            Err(e) => {
                fail_with("ibv_reg_mr", e.errno(), &e.to_string());
                null_mut()
            }
        }
    }
}

pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    guard(null_mut(), || unsafe {
        reg_mr(pd, addr, len, addr as u64, access)
    })
}

pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    guard(null_mut(), || unsafe {
        reg_mr(pd, addr, len, iova, access)
    })
}

/// What the header's `ibv_reg_mr` macro calls when the access flags are
/// not a compile-time constant or include optional bits.
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    guard(null_mut(), || unsafe {
        reg_mr(pd, addr, len, iova, access as c_int)
    })
}

/// Deregisters at once, even while work requests still use the region:
/// later operations on its keys fail with access errors (local protection
/// errors for local use, remote access errors for peers).
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        if mr.is_null() {
            return fail_with("ibv_dereg_mr", libc::EINVAL, "NULL mr");
        }
        // SAFETY: a live MR (an Mr object), freed once: its drop
        // withdraws it from same-host peers and deregisters it.
        unsafe {
            ctx_of(mr).objects().mrs.remove(&(mr as usize));
            objects::free(mr.cast::<Mr>());
        }
        0
    })
}

/// The `advise_mr` slot of the verbs_context (`ibv_advise_mr`, an inline
/// of verbs.h that returns the errno): PREFETCH and PREFETCH_WRITE resolve
/// the pages of each SGE now (`Mr::prefetch`); PREFETCH_NO_FAULT, which
/// only maps pages that are present already, has nothing to do. Each SGE
/// must name a region of `pd` and lie inside it (EINVAL); memory that is
/// not mapped gives EFAULT.
pub unsafe extern "C" fn advise_mr(
    pd: *mut ibv_pd,
    advice: u32,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    guard(libc::EIO, || {
        if pd.is_null() || sg_list.is_null() || num_sge == 0 {
            return fail_with("ibv_advise_mr", libc::EINVAL, "NULL pd, no SGEs");
        }
        if advice > IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT || flags & !IBV_ADVISE_MR_FLAG_FLUSH != 0
        {
            return fail_with("ibv_advise_mr", libc::EINVAL, "unknown advice or flags");
        }
        // SAFETY: a live PD; the caller's array holds num_sge SGEs.
        let sges = unsafe { std::slice::from_raw_parts(sg_list, num_sge as usize) };
        // SAFETY: a live PD (a Pd object).
        let objs = unsafe { ctx_of(pd) }.objects();
        for s in sges {
            // SAFETY: the set holds live Mr objects of this context.
            let mr = objs
                .mrs
                .iter()
                .map(|&a| unsafe { &*(a as *const Mr) })
                .find(|m| m.ibv.pd == pd && m.ibv.lkey == s.lkey && m.mr.is_some());
            let Some(softmr) = mr.and_then(|m| m.mr.as_ref()) else {
                return fail_with(
                    "ibv_advise_mr",
                    libc::EINVAL,
                    "no region of the PD has the lkey",
                );
            };
            if advice == IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT {
                continue;
            }
            let write = advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE;
            if let Err(e) = softmr.prefetch(s.addr, s.length as usize, write) {
                return fail_with("ibv_advise_mr", e.errno(), &e.to_string());
            }
        }
        0
    })
}

// ----- completion queues -----

pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard(null_mut(), || {
        if context.is_null() || cqe < 0 {
            fail_with(
                "ibv_create_cq",
                libc::EINVAL,
                "NULL context or negative cqe",
            );
            return null_mut();
        }
        // The kernel's rule: a vector the device has (it has one).
        // SAFETY: live context.
        if !(0..unsafe { (*context).num_comp_vectors }).contains(&comp_vector) {
            fail_with(
                "ibv_create_cq",
                libc::EINVAL,
                "comp_vector is not below the context's num_comp_vectors",
            );
            return null_mut();
        }
        // SAFETY: live context; channel is NULL or a live channel.
        unsafe {
            let c = Ctx::from_ptr(context);
            let r = if channel.is_null() {
                c.dev.create_cq(cqe as u32)
            } else {
                let Ok(ch) = live("ibv_create_cq", &(*channel.cast::<Chan>()).ch) else {
                    return null_mut();
                };
                c.dev.create_cq_with_channel(cqe as u32, ch)
            };
            let soft = match r {
                Ok(cq) => cq,
                Err(e) => {
                    fail("ibv_create_cq", &e);
                    return null_mut();
                }
            };
            let handle = soft.handle();
            let cq = objects::leak(Cq {
                ibv: ibv_cq {
                    context,
                    channel,
                    cq_context,
                    handle: handle.raw(),
                    cqe,
                    mutex: objects::new_mutex(),
                    cond: objects::new_cond(),
                    comp_events_completed: 0,
                    async_events_completed: 0,
                },
                ex: crate::cq_ex::CqExTail::none(),
                cq: Some(soft),
                cur: Default::default(),
            });
            // Known before any event of it can be looked up.
            c.objects().cqs.insert(handle.raw(), cq as usize);
            if !channel.is_null() {
                AtomicU32::from_ptr(ptr::addr_of_mut!((*channel).refcnt).cast())
                    .fetch_add(1, Ordering::Relaxed);
            }
            cq.cast()
        }
    })
}

/// EBUSY while QPs use it.
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: `destroy`'s contract is the verb's (a live object or NULL);
    // the closures run inside it on that live object, the last once.
    unsafe {
        destroy(
            "ibv_destroy_cq",
            cq.cast::<Cq>(),
            |q| ptr::addr_of_mut!((*q).cq),
            softrdma::Cq::destroy,
            |c, cq| {
                let (h, channel) = ((*cq).ibv.handle, (*cq).ibv.channel);
                c.objects().cqs.remove(&h);
                // Its channel, if any, outlives it.
                if !channel.is_null() {
                    AtomicU32::from_ptr(ptr::addr_of_mut!((*channel).refcnt).cast())
                        .fetch_sub(1, Ordering::Relaxed);
                }
                objects::free(cq);
            },
        )
    }
}

/// `ibv_resize_cq`: `Cq::resize`; `cq->cqe` becomes the new depth. EINVAL
/// for a depth of 0 or above `max_cqe`, or below the completions waiting.
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard(libc::EIO, || {
        const VERB: &str = "ibv_resize_cq";
        if cq.is_null() || cqe <= 0 {
            return fail_with(VERB, libc::EINVAL, "NULL cq or cqe not positive");
        }
        // SAFETY: a live CQ (a Cq object); the program does not resize it
        // from two threads at once.
        unsafe {
            let q = match live(VERB, &(*cq.cast::<Cq>()).cq) {
                Ok(q) => q,
                Err(n) => return n,
            };
            match q.resize(cqe as u32) {
                Ok(n) => {
                    (*cq).cqe = n as c_int;
                    0
                }
                Err(e) => fail(VERB, &e),
            }
        }
    })
}

thread_local! {
    /// Completions on their way from softrdma to the caller's array.
    static WCS: RefCell<Vec<WorkCompletion>> = const { RefCell::new(Vec::new()) };
}

/// `ctx->ops.poll_cq`: takes up to `num_entries` completions; when none is
/// waiting, runs progress (receive, timers, transmit) and takes those.
/// `num_entries` zero or negative returns 0 and touches nothing, as rxe's
/// and mlx5's polls do (their loops run `num_entries` times); a NULL `wc`
/// with room for entries is -EINVAL.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-libc::EIO, || {
        if cq.is_null() || (wc.is_null() && num_entries > 0) {
            return -libc::EINVAL;
        }
        if num_entries <= 0 {
            return 0;
        }
        // SAFETY: a live CQ (a Cq object); wc has room for num_entries
        // entries.
        unsafe {
            let q = match live("ibv_poll_cq", &(*cq.cast::<Cq>()).cq) {
                Ok(q) => q,
                Err(n) => return -n,
            };
            WCS.with(|cell| {
                let mut v = cell.borrow_mut();
                v.clear();
                // Completions already waiting are returned without
                // progress; an empty CQ runs progress inline first (cheap
                // while nothing can be pending), as for a Rust application,
                // and tells the device's background thread the program is
                // polling. Programs like ib_write_lat poll for their send
                // completion, then spin on memory a peer WRITEs with no
                // library call: the responder's delayed ACK (see
                // `EngineConfig::ack_delay_ns`) brings that WRITE in the
                // same receive batch as the ACK this poll waits for, and a
                // WRITE that comes later is served by the background thread
                // once the program has stopped polling for its window.
                match q.poll(&mut v, num_entries as usize) {
                    Ok(n) => {
                        for (i, w) in v.iter().take(n).enumerate() {
                            wc.add(i).write(convert::wc(w));
                        }
                        n as c_int
                    }
                    Err(e) => -fail("ibv_poll_cq", &e),
                }
            })
        }
    })
}

/// `ctx->ops.req_notify_cq`.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        if cq.is_null() {
            return libc::EINVAL;
        }
        const VERB: &str = "ibv_req_notify_cq";
        // SAFETY: a live CQ (a Cq object).
        let q = match live(VERB, unsafe { &(*cq.cast::<Cq>()).cq }) {
            Ok(q) => q,
            Err(n) => return n,
        };
        match q.req_notify(solicited_only != 0) {
            Ok(()) => 0,
            Err(e) => fail(VERB, &e),
        }
    })
}

/// `ibv_get_cq_event`: the next CQ with an event on this channel. Blocks
/// unless the application made `channel->fd` non-blocking (then -1 with
/// EAGAIN when nothing is pending).
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard(-1, || {
        if channel.is_null() || cq_out.is_null() {
            ffi::set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: a live channel and context; out pointers are writable.
        unsafe {
            let ch = &*channel.cast::<Chan>();
            let Ok(soft) = live("ibv_get_cq_event", &ch.ch) else {
                return -1;
            };
            let c = Ctx::from_ptr(ch.ibv.context);
            let fd = ch.ibv.fd;
            loop {
                let nonblocking = ffi::is_nonblocking(fd);
                // The fd stays readable while events pend: a program that
                // polls it takes one event per readable poll.
                while let Some(h) = soft.take_event() {
                    // An event of a CQ destroyed since is dropped.
                    let Some(cq) = c.lookup(|o| o.cqs.get(&h.raw()).copied()) else {
                        continue;
                    };
                    let cq = cq.cast::<ibv_cq>();
                    *cq_out = cq;
                    if !cq_context.is_null() {
                        *cq_context = (*cq).cq_context;
                    }
                    return 0;
                }
                if nonblocking {
                    ffi::set_errno(libc::EAGAIN);
                    return -1;
                }
                // The waiting thread runs the device's progress itself,
                // so the completion wakes it directly.
                soft.wait(Some(std::time::Duration::from_millis(100)));
            }
        }
    })
}

/// `ibv_ack_cq_events`.
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    guard((), || {
        if cq.is_null() {
            return;
        }
        // SAFETY: a live CQ; the counter is only updated atomically here.
        unsafe {
            AtomicU32::from_ptr(ptr::addr_of_mut!((*cq).comp_events_completed))
                .fetch_add(nevents, Ordering::Relaxed);
        }
    })
}

// ----- shared receive queues -----

pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard(null_mut(), || {
        if pd.is_null() || init.is_null() {
            fail_with("ibv_create_srq", libc::EINVAL, "NULL pd or attributes");
            return null_mut();
        }
        // SAFETY: a live PD (a Pd object); init is readable.
        unsafe {
            let c = ctx_of(pd);
            let Ok(p) = (*pd.cast::<Pd>()).soft("ibv_create_srq") else {
                return null_mut();
            };
            let a = (*init).attr;
            let r = p.create_srq_with(SrqInit {
                max_wr: a.max_wr,
                max_sge: a.max_sge,
                limit: a.srq_limit,
            });
            match r {
                Ok(soft) => {
                    let handle = soft.handle();
                    let srq = objects::leak(Srq {
                        ibv: ibv_srq {
                            context: c.as_ibv(),
                            srq_context: (*init).srq_context,
                            pd,
                            handle: handle.raw(),
                            mutex: objects::new_mutex(),
                            cond: objects::new_cond(),
                            events_completed: 0,
                        },
                        srq: Some(soft),
                        attr: Mutex::new(a),
                    });
                    c.objects().srqs.insert(handle.raw(), srq as usize);
                    srq.cast()
                }
                Err(e) => {
                    fail("ibv_create_srq", &e);
                    null_mut()
                }
            }
        }
    })
}

/// `ibv_modify_srq`: IBV_SRQ_LIMIT arms the limit event; resizing
/// (IBV_SRQ_MAX_WR) is not supported.
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        if srq.is_null() || attr.is_null() {
            return fail_with("ibv_modify_srq", libc::EINVAL, "NULL argument");
        }
        if mask & IBV_SRQ_MAX_WR != 0 {
            return fail_with("ibv_modify_srq", libc::EINVAL, "SRQs cannot be resized");
        }
        if mask & !IBV_SRQ_LIMIT != 0 {
            return fail_with(
                "ibv_modify_srq",
                libc::EINVAL,
                "unknown attribute mask bits",
            );
        }
        if mask & IBV_SRQ_LIMIT == 0 {
            return 0;
        }
        // SAFETY: a live SRQ (a Srq object); attr is readable.
        unsafe {
            let s = &*srq.cast::<Srq>();
            let soft = match live("ibv_modify_srq", &s.srq) {
                Ok(q) => q,
                Err(n) => return n,
            };
            let limit = (*attr).srq_limit;
            match soft.arm_limit(limit) {
                Ok(()) => {
                    s.attr.lock().unwrap_or_else(|e| e.into_inner()).srq_limit = limit;
                    0
                }
                Err(e) => fail("ibv_modify_srq", &e),
            }
        }
    })
}

pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard(libc::EIO, || {
        if srq.is_null() || attr.is_null() {
            return fail_with("ibv_query_srq", libc::EINVAL, "NULL argument");
        }
        // SAFETY: a live Srq; attr is writable.
        unsafe {
            let s = &*srq.cast::<Srq>();
            attr.write(*s.attr.lock().unwrap_or_else(|e| e.into_inner()));
        }
        0
    })
}

/// EBUSY while QPs use it.
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    // SAFETY: `destroy`'s contract is the verb's (a live object or NULL);
    // the closures run inside it on that live object, the last once.
    unsafe {
        destroy(
            "ibv_destroy_srq",
            srq.cast::<Srq>(),
            |q| ptr::addr_of_mut!((*q).srq),
            softrdma::Srq::destroy,
            |c, srq| {
                c.objects().srqs.remove(&(*srq).ibv.handle);
                objects::free(srq);
            },
        )
    }
}

// ----- queue pairs -----

/// The softrdma CQ behind a C CQ, or EINVAL.
///
/// # Safety
/// `cq` is NULL or a live CQ of this library.
pub(crate) unsafe fn soft_cq<'a>(verb: &str, cq: *mut ibv_cq) -> Result<&'a softrdma::Cq, c_int> {
    if cq.is_null() {
        return Err(fail_with(
            verb,
            libc::EINVAL,
            "send_cq and recv_cq are required",
        ));
    }
    // SAFETY: per the contract, a live Cq object.
    live(verb, unsafe { &(*cq.cast::<Cq>()).cq })
}

/// Creates the softrdma QP that `a` describes.
///
/// # Safety
/// `pd` is a live PD; the CQs and SRQ of `a` are NULL or live objects.
unsafe fn new_qp(pd: *mut ibv_pd, a: &ibv_qp_init_attr) -> Result<softrdma::Qp, c_int> {
    const VERB: &str = "ibv_create_qp";
    // An XRC_SEND QP receives nothing: its recv_cq may be NULL (the send
    // CQ stands in, unused).
    let recv_cq = if a.qp_type == QpType::XrcIni.to_ibv() && a.recv_cq.is_null() {
        a.send_cq
    } else {
        a.recv_cq
    };
    // SAFETY: per the contract.
    let (p, scq, rcq) = unsafe {
        (
            (*pd.cast::<Pd>()).soft(VERB)?,
            soft_cq(VERB, a.send_cq)?,
            soft_cq(VERB, recv_cq)?,
        )
    };
    let Some(qp_type) = QpType::from_ibv(a.qp_type) else {
        return Err(fail_with(
            VERB,
            libc::EOPNOTSUPP,
            &format!(
                "QP type {} (softrdma has RC, UC, UD, XRC_SEND and XRC_RECV)",
                a.qp_type
            ),
        ));
    };
    if qp_type == QpType::XrcTgt {
        return Err(fail_with(
            VERB,
            libc::EINVAL,
            "an XRC_RECV QP is made by ibv_create_qp_ex in an XRC domain",
        ));
    }
    let mut b = p
        .create_qp(qp_type, scq, rcq)
        .cap(convert::qp_cap(&a.cap))
        .sq_sig_all(a.sq_sig_all != 0);
    if !a.srq.is_null() {
        // SAFETY: per the contract, a live Srq object.
        b = b.srq(live(VERB, unsafe { &(*a.srq.cast::<Srq>()).srq })?);
    }
    b.build().map_err(|e| fail(VERB, &e))
}

pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard(null_mut(), || {
        if pd.is_null() || init.is_null() {
            fail_with("ibv_create_qp", libc::EINVAL, "NULL pd or attributes");
            return null_mut();
        }
        // SAFETY: a live PD; init is readable and writable; its CQs and
        // SRQ are NULL or live objects.
        unsafe {
            let c = ctx_of(pd);
            let a = &mut *init;
            let Ok(soft) = new_qp(pd, a) else {
                return null_mut();
            };
            a.cap = convert::cap_to_c(&soft.cap());
            let qpn = soft.qpn();
            let qp = objects::leak(Qp {
                ibv: ibv_qp {
                    context: c.as_ibv(),
                    qp_context: a.qp_context,
                    pd,
                    send_cq: a.send_cq,
                    recv_cq: a.recv_cq,
                    srq: a.srq,
                    handle: qpn.raw(),
                    qp_num: qpn.raw(),
                    state: 0,
                    qp_type: a.qp_type,
                    mutex: objects::new_mutex(),
                    cond: objects::new_cond(),
                    events_completed: 0,
                },
                ex: crate::qp_ex::QpExTail::none(),
                qp: Some(soft),
                pending: Default::default(),
            });
            c.objects().qps.insert(qpn.raw(), qp as usize);
            qp.cast()
        }
    })
}

/// The softrdma QP behind a C QP, read without making a reference to the
/// `ibv_qp`, which the application may be reading (and `ibv_modify_qp`
/// writing, its `state`) on another thread.
///
/// # Safety
/// `qp` is a live QP of this library.
pub(crate) unsafe fn soft_qp<'a>(verb: &str, qp: *mut ibv_qp) -> Result<&'a softrdma::Qp, c_int> {
    // SAFETY: per the contract, a live Qp object; only its `qp` field is
    // borrowed.
    live(verb, unsafe { &*ptr::addr_of!((*qp.cast::<Qp>()).qp) })
}

/// `ibv_attach_mcast` (`attach`) and `ibv_detach_mcast`: 0 or the errno,
/// as rdma-core's (EINVAL for a NULL argument, a QP that is not UD, a GID
/// that is not multicast, or a detach of a QP not attached; ENOMEM past
/// the device's multicast limits). The LID is not used on RoCE.
unsafe fn mcast(verb: &str, qp: *mut ibv_qp, gid: *const ibv_gid, attach: bool) -> c_int {
    guard(libc::EIO, || {
        if qp.is_null() || gid.is_null() {
            return fail_with(verb, libc::EINVAL, "NULL argument");
        }
        // SAFETY: a live QP and a readable GID, per the verb's contract.
        unsafe {
            let soft = match soft_qp(verb, qp) {
                Ok(q) => q,
                Err(n) => return n,
            };
            let g = softrdma::Gid::from((*gid).raw);
            let r = if attach {
                soft.attach_mcast(g)
            } else {
                soft.detach_mcast(g)
            };
            match r {
                Ok(()) => 0,
                Err(e) => fail(verb, &e),
            }
        }
    })
}

/// # Safety
/// `qp` a live QP of this library and `gid` readable, or NULL.
pub unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    // SAFETY: the verb's contract, passed on.
    unsafe { mcast("ibv_attach_mcast", qp, gid, true) }
}

/// # Safety
/// `qp` a live QP of this library and `gid` readable, or NULL.
pub unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    // SAFETY: the verb's contract, passed on.
    unsafe { mcast("ibv_detach_mcast", qp, gid, false) }
}

/// `ibv_modify_qp`: the transition and attribute mask are checked as the
/// kernel checks them; every refusal is EINVAL (returned and in errno).
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    const VERB: &str = "ibv_modify_qp";
    guard(libc::EIO, || {
        if qp.is_null() || attr.is_null() {
            return fail_with(VERB, libc::EINVAL, "NULL argument");
        }
        // SAFETY: a live QP; attr is readable.
        unsafe {
            let soft = match soft_qp(VERB, qp) {
                Ok(q) => q,
                Err(n) => return n,
            };
            let a = match convert::qp_attr(&*attr, mask) {
                Ok(a) => a,
                Err(why) => return fail_with(VERB, libc::EINVAL, &why),
            };
            // Same-host peers see the new state: softrdma takes back the
            // grants it no longer allows.
            match soft.modify(&a, softrdma::AttrMask(mask as u32)) {
                Ok(()) => {
                    (*qp).state = soft.state().to_ibv();
                    0
                }
                Err(e) => fail(VERB, &e),
            }
        }
    })
}

/// `ibv_query_qp`: fills every attribute whatever the mask, and the
/// creation attributes.
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    const VERB: &str = "ibv_query_qp";
    guard(libc::EIO, || {
        if qp.is_null() || attr.is_null() {
            return fail_with(VERB, libc::EINVAL, "NULL argument");
        }
        // SAFETY: a live QP; attr and init (if not NULL) are writable.
        unsafe {
            let soft = match soft_qp(VERB, qp) {
                Ok(q) => q,
                Err(n) => return n,
            };
            let a = match soft.query() {
                Ok(a) => a,
                Err(e) => return fail(VERB, &e),
            };
            attr.write(convert::qp_attr_to_c(&a));
            (*qp).state = a.qp_state.to_ibv();
            if !init.is_null() {
                init.write(ibv_qp_init_attr {
                    qp_context: (*qp).qp_context,
                    send_cq: (*qp).send_cq,
                    recv_cq: (*qp).recv_cq,
                    srq: (*qp).srq,
                    cap: convert::cap_to_c(&soft.cap()),
                    qp_type: soft.qp_type().to_ibv(),
                    sq_sig_all: c_int::from(soft.sq_sig_all()),
                });
            }
            0
        }
    })
}

/// Outstanding work is discarded without completions; same-host peers
/// lose what they were granted through the QP (softrdma's `Qp::destroy`).
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: `destroy`'s contract is the verb's (a live object or NULL);
    // the closures run inside it on that live object, the last once.
    unsafe {
        destroy(
            "ibv_destroy_qp",
            qp.cast::<Qp>(),
            |q| ptr::addr_of_mut!((*q).qp),
            softrdma::Qp::destroy,
            |c, qp| {
                c.objects().qps.remove(&(*qp).ibv.qp_num);
                objects::free(qp);
            },
        )
    }
}

// ----- address handles -----

pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard(null_mut(), || {
        if pd.is_null() || attr.is_null() {
            fail_with("ibv_create_ah", libc::EINVAL, "NULL pd or attributes");
            return null_mut();
        }
        // SAFETY: a live PD; attr is readable.
        unsafe { create_ah(pd, &convert::ah_attr(&*attr)) }
    })
}

/// # Safety
/// `pd` is a live PD.
unsafe fn create_ah(pd: *mut ibv_pd, a: &softrdma::AhAttr) -> *mut ibv_ah {
    // SAFETY: per the contract, a live Pd object.
    let p = unsafe { &*pd.cast::<Pd>() };
    let Ok(soft) = p.soft("ibv_create_ah") else {
        return null_mut();
    };
    match soft.create_ah_attr(*a) {
        Ok(ah) => {
            let a = objects::leak(Ah {
                ibv: ibv_ah {
                    context: p.ibv.context,
                    pd,
                    handle: ah.handle().raw(),
                },
                ah: Some(ah),
            });
            // SAFETY: a live PD, per the contract.
            unsafe { ctx_of(pd) }.objects().ahs.insert(a as usize);
            a.cast()
        }
        Err(e) => {
            fail("ibv_create_ah", &e);
            null_mut()
        }
    }
}

pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    // SAFETY: `destroy`'s contract is the verb's (a live object or NULL);
    // the closures run inside it on that live object, the last once.
    unsafe {
        destroy(
            "ibv_destroy_ah",
            ah.cast::<Ah>(),
            |a| ptr::addr_of_mut!((*a).ah),
            softrdma::Ah::destroy,
            |c, ah| {
                c.objects().ahs.remove(&(ah as usize));
                objects::free(ah);
            },
        )
    }
}

/// `ibv_init_ah_from_wc`: the path back to the sender of a UD receive,
/// from the GRH in front of its data (RoCE receives always have one).
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    guard(-1, || {
        if context.is_null() || wc.is_null() || ah_attr.is_null() {
            ffi::set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: wc and grh readable (grh when the WC says GRH), ah_attr writable.
        unsafe {
            let w = &*wc;
            if w.wc_flags & IBV_WC_GRH == 0 || grh.is_null() {
                fail_with(
                    "ibv_init_ah_from_wc",
                    libc::EINVAL,
                    "a RoCE path needs the GRH of the receive",
                );
                return -1;
            }
            // RoCEv2 puts the IP header of the request in the 40 bytes: an
            // IPv6 header, or 20 unused bytes and then the IPv4 header.
            let raw = std::slice::from_raw_parts(grh.cast::<u8>(), 40);
            let (sgid, flow_label, traffic_class) = if raw[0] >> 4 == 6 {
                let g = &*grh;
                let vtf = u32::from_be(g.version_tclass_flow);
                (g.sgid.raw(), vtf & 0xF_FFFF, ((vtf >> 20) & 0xFF) as u8)
            } else if raw[20] >> 4 == 4 {
                let mut v4 = [0u8; 4];
                v4.copy_from_slice(&raw[32..36]);
                let ip = std::net::Ipv4Addr::from(v4).to_ipv6_mapped();
                (ip.octets(), 0, raw[21])
            } else {
                fail_with(
                    "ibv_init_ah_from_wc",
                    libc::EINVAL,
                    "the GRH holds neither an IPv6 nor an IPv4 header",
                );
                return -1;
            };
            ah_attr.write(ibv_ah_attr {
                grh: ibv_global_route {
                    dgid: ibv_gid::from_raw(sgid),
                    flow_label,
                    sgid_index: 0,
                    hop_limit: 0xFF,
                    traffic_class,
                },
                dlid: w.slid,
                sl: w.sl,
                src_path_bits: w.dlid_path_bits,
                static_rate: 0,
                is_global: 1,
                port_num: port,
            });
        }
        0
    })
}

pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port: u8,
) -> *mut ibv_ah {
    guard(null_mut(), || {
        if pd.is_null() {
            ffi::set_errno(libc::EINVAL);
            return null_mut();
        }
        let mut a = std::mem::MaybeUninit::<ibv_ah_attr>::uninit();
        // SAFETY: a live PD; ibv_init_ah_from_wc fully writes `a` on success.
        unsafe {
            if ibv_init_ah_from_wc((*pd).context, port, wc, grh, a.as_mut_ptr()) != 0 {
                return null_mut();
            }
            create_ah(pd, &convert::ah_attr(&a.assume_init()))
        }
    })
}

// ----- the data path -----
//
// Every count a caller passes is checked before the array it describes is
// read, and a list is walked no further than its queue holds WRs nor past
// the WR that failed (docs/ibverbs.md, "Validation of caller values"). The
// errnos and `bad_wr` are rxe's, the provider softrdma mimics.

/// Largest SGE list read from a work request whatever a queue's limit says
/// (a bound under the device's `max_sge`, 32, which caps every queue's).
const MAX_SGE_READ: u32 = 1024;

/// Reads the SGE list of a WR into `out` (cleared first, its allocation
/// reused) once its count has passed the checks: a negative `num_sge`, one
/// above the queue's `limit` (`.0` names it), or a NULL `sg_list` with
/// elements is EINVAL, and then nothing of the list is read.
///
/// # Safety
/// When the count passes, `sg_list` points to `num_sge` readable SGEs.
unsafe fn sges_into(
    verb: &str,
    sg_list: *const ibv_sge,
    num_sge: c_int,
    limit: (&str, u32),
    out: &mut Vec<Sge>,
) -> Result<(), c_int> {
    out.clear();
    let (what, max_sge) = limit;
    let n = match u32::try_from(num_sge) {
        Ok(n) if n <= max_sge.min(MAX_SGE_READ) => n as usize,
        _ => {
            return Err(fail_with(
                verb,
                libc::EINVAL,
                &format!("num_sge {num_sge} is not between 0 and the queue's {what} {max_sge}"),
            ))
        }
    };
    if n == 0 {
        return Ok(());
    }
    if sg_list.is_null() {
        return Err(fail_with(
            verb,
            libc::EINVAL,
            &format!("NULL sg_list with num_sge {n}"),
        ));
    }
    // SAFETY: per the contract, for a count that passed.
    let s = unsafe { std::slice::from_raw_parts(sg_list, n) };
    out.extend(s.iter().map(convert::sge));
    Ok(())
}

thread_local! {
    /// The SGE list of the WR being posted (its allocation is reused).
    static SEND_SGES: RefCell<Vec<Sge>> = const { RefCell::new(Vec::new()) };
}

/// Copies the bytes of an inline send out of application memory.
///
/// # Safety
/// Every SGE must describe readable memory (the IBV_SEND_INLINE contract).
unsafe fn gather_inline(sg: &[Sge], out: &mut Vec<u8>) {
    out.clear();
    for s in sg {
        if s.length > 0 {
            // SAFETY: per the contract.
            out.extend_from_slice(unsafe {
                std::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
            });
        }
    }
}

/// What `post_send` needs to know of its QP.
#[derive(Clone, Copy)]
struct SendQueue<'a> {
    qp: &'a softrdma::Qp,
    ud: bool,
    /// An XRC initiator: each WR's `qp_type.xrc.remote_srqn` names the SRQ.
    xrc: bool,
    cap: softrdma::QpCap,
}

/// `ctx->ops.post_send`. As rxe: a NULL `bad_wr` or an empty list is
/// EINVAL; `*bad_wr` is NULL unless a WR fails, and then that WR. A list
/// is walked for at most `max_send_wr` WRs (the first one past is ENOMEM,
/// as the queue cannot hold it), and never past the WR that failed.
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        if qp.is_null() || bad_wr.is_null() {
            return fail_with("ibv_post_send", libc::EINVAL, "NULL qp or bad_wr");
        }
        // SAFETY: a live QP (a Qp object) and a writable bad_wr; `wr` is
        // NULL or a NULL-terminated list of readable WRs, each with the
        // SGEs its num_sge counts (read only once the count passed) and,
        // for UD, a live AH.
        unsafe {
            *bad_wr = null_mut();
            if wr.is_null() {
                return fail_with("ibv_post_send", libc::EINVAL, "empty WR list");
            }
            let soft = match soft_qp("ibv_post_send", qp) {
                Ok(q) => q,
                Err(n) => return n,
            };
            let q = SendQueue {
                qp: soft,
                ud: soft.qp_type() == QpType::Ud,
                xrc: soft.qp_type() == QpType::XrcIni,
                cap: soft.cap(),
            };
            let mut cur = wr;
            let mut posted = 0u32;
            while !cur.is_null() {
                let room = posted < q.cap.max_send_wr;
                if let Err(n) = post_one(q, &*cur, room) {
                    *bad_wr = cur;
                    return n;
                }
                posted += 1;
                cur = (*cur).next;
            }
            0
        }
    })
}

thread_local! {
    /// The bytes of an inline send, copied at post time.
    static INLINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Posts one send WR, after checking it against the QP's limits (`room`:
/// this call has not yet posted `max_send_wr` WRs), with softrdma's
/// `Qp::post_send` (which does a WRITE, READ or atomic to a same-host peer
/// directly in its memory when it can, docs/shm.md) or, for
/// IBV_SEND_INLINE, `Qp::post_send_inline`.
///
/// # Safety
/// `w` is readable, its SGE list holds `num_sge` SGEs if that passes the
/// checks, and its AH (UD) is live.
unsafe fn post_one(q: SendQueue, w: &ibv_send_wr, room: bool) -> Result<(), c_int> {
    let mut sg = SEND_SGES.with(|v| std::mem::take(&mut *v.borrow_mut()));
    // SAFETY: per the contract.
    let r = unsafe { post_one_with(q, w, room, &mut sg) };
    SEND_SGES.with(|v| *v.borrow_mut() = sg);
    r
}

/// [`post_one`] with `buf` as the SGE list's buffer (given back after).
///
/// # Safety
/// As [`post_one`].
unsafe fn post_one_with(
    q: SendQueue,
    w: &ibv_send_wr,
    room: bool,
    buf: &mut Vec<Sge>,
) -> Result<(), c_int> {
    const VERB: &str = "ibv_post_send";
    let op = send_op_checked(w)?;
    if op.is_local() {
        // A bind or local invalidation has no SGEs: its list is ignored.
        buf.clear();
    } else {
        // SAFETY: per the contract; the count is checked first.
        unsafe {
            sges_into(
                VERB,
                w.sg_list,
                w.num_sge,
                ("max_send_sge", q.cap.max_send_sge),
                buf,
            )
        }?;
    }
    let flags = convert::send_flags(w.send_flags);
    let inline_op = flags.contains(SendFlags::INLINE) && !op.is_read_or_atomic();
    if inline_op {
        // Before a byte of it is copied.
        let len: u64 = buf.iter().map(|s| u64::from(s.length)).sum();
        if len > u64::from(q.cap.max_inline_data) {
            return Err(fail_with(
                VERB,
                libc::EINVAL,
                &format!(
                    "inline data of {len} bytes exceeds max_inline_data {}",
                    q.cap.max_inline_data
                ),
            ));
        }
    }
    if !room {
        return Err(fail_with(
            VERB,
            libc::ENOMEM,
            &format!(
                "the list is longer than the send queue ({} WRs)",
                q.cap.max_send_wr
            ),
        ));
    }
    let ud = if q.ud {
        // SAFETY: the union's members are plain data; UD uses `ud`.
        let u = unsafe { w.wr.ud };
        if u.ah.is_null() {
            return Err(fail_with(VERB, libc::EINVAL, "UD send without an AH"));
        }
        Some(UdDest {
            // SAFETY: a live AH, per the contract.
            ah: unsafe { AhHandle::from_raw((*u.ah).handle) },
            remote_qpn: Qpn::from_raw(u.remote_qpn),
            remote_qkey: u.remote_qkey,
        })
    } else {
        None
    };
    let sg = std::mem::take(buf);
    let mut swr = SendWr {
        xrc_srqn: q.xrc.then_some(w.remote_srqn),
        wr_id: w.wr_id,
        op,
        sg_list: sg,
        flags,
        ud,
    };
    let r = if inline_op {
        INLINE.with(|buf| {
            let mut data = buf.borrow_mut();
            // SAFETY: per the contract, the SGEs describe readable memory
            // (at most max_inline_data bytes, checked above).
            unsafe { gather_inline(&swr.sg_list, &mut data) };
            swr.sg_list.clear();
            q.qp.post_send_inline(&swr, &data)
        })
    } else {
        q.qp.post_send(&swr)
    };
    *buf = swr.sg_list;
    r.map_err(|err| fail(VERB, &err))
}

fn send_op_checked(w: &ibv_send_wr) -> Result<SendOp, c_int> {
    convert::send_op(w).map_err(|m| fail_with("ibv_post_send", libc::EINVAL, m))
}

/// The limits of a receive queue a list is checked against.
#[derive(Clone, Copy)]
struct RecvQueue {
    /// WRs one call may post (the queue cannot hold more).
    max_wr: u32,
    /// The largest `num_sge`, and the name of that limit.
    max_sge: (&'static str, u32),
}

/// Where a receive list stands while softrdma takes its WRs (see
/// [`post_recv_list`]).
struct RecvWalk {
    /// The next WR to read.
    cur: *mut ibv_recv_wr,
    /// The last WR read: the one refused, when one is.
    last: *mut ibv_recv_wr,
    /// WRs handed out so far.
    taken: u32,
    /// The errno of a WR refused by the checks here (before softrdma saw it).
    refused: Option<c_int>,
}

impl RecvWalk {
    /// The next WR of the list as softrdma's, unless the list ended or
    /// this WR fails the checks: ENOMEM once `q.max_wr` were taken, then
    /// EINVAL for a bad `num_sge` (rxe's order), before its SGEs are read.
    ///
    /// # Safety
    /// `cur` is NULL or a readable receive WR, with the SGEs its num_sge
    /// counts when that passes, whose `next` is the same.
    unsafe fn next_wr(&mut self, verb: &str, q: RecvQueue) -> Option<RecvWr> {
        if self.cur.is_null() || self.refused.is_some() {
            return None;
        }
        // SAFETY: per the contract.
        let w = unsafe { &*self.cur };
        self.last = self.cur;
        if self.taken >= q.max_wr {
            self.refused = Some(fail_with(
                verb,
                libc::ENOMEM,
                &format!("the list is longer than the queue ({} WRs)", q.max_wr),
            ));
            return None;
        }
        let mut sg_list = Vec::new();
        // SAFETY: per the contract; the count is checked first.
        if let Err(n) = unsafe { sges_into(verb, w.sg_list, w.num_sge, q.max_sge, &mut sg_list) } {
            self.refused = Some(n);
            return None;
        }
        self.taken += 1;
        self.cur = w.next;
        Some(RecvWr {
            wr_id: w.wr_id,
            sg_list,
        })
    }
}

/// Posts a receive list with `post` (softrdma's `post_recv_list` of a QP
/// or SRQ), which takes the WRs one by one under the device's lock: the
/// list is read no further than the WR that failed, the checks here or
/// softrdma's, and `*bad_wr` is that WR.
///
/// # Safety
/// `wr` is a NULL-terminated list of readable receive WRs, each with the
/// SGEs its num_sge counts when that passes; `bad_wr` is writable.
unsafe fn post_recv_list(
    verb: &str,
    q: RecvQueue,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    post: impl FnOnce(&mut dyn Iterator<Item = RecvWr>) -> Result<usize, (usize, softrdma::Error)>,
) -> c_int {
    let mut walk = RecvWalk {
        cur: wr,
        last: null_mut(),
        taken: 0,
        refused: None,
    };
    // SAFETY: per the contract, each `next` is NULL or the same.
    let r = post(&mut std::iter::from_fn(|| unsafe { walk.next_wr(verb, q) }));
    let err = match r {
        Err((_, e)) => fail(verb, &e),
        Ok(_) => walk.refused.unwrap_or(0),
    };
    if err != 0 {
        // SAFETY: writable, per the contract.
        unsafe { *bad_wr = walk.last };
    }
    err
}

/// `ctx->ops.post_recv`. As rxe: a NULL `bad_wr` or an empty list is
/// EINVAL, and `*bad_wr` is NULL unless a WR fails. A QP with an SRQ takes
/// no receives of its own: EINVAL at the first WR.
pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    const VERB: &str = "ibv_post_recv";
    guard(libc::EIO, || {
        if qp.is_null() || bad_wr.is_null() {
            return fail_with(VERB, libc::EINVAL, "NULL qp or bad_wr");
        }
        // SAFETY: a live QP (a Qp object); bad_wr is writable; wr as
        // post_recv_list requires.
        unsafe {
            *bad_wr = null_mut();
            if wr.is_null() {
                return fail_with(VERB, libc::EINVAL, "empty WR list");
            }
            if !(*qp).srq.is_null() {
                *bad_wr = wr;
                return fail_with(VERB, libc::EINVAL, "the QP uses an SRQ; post to the SRQ");
            }
            let soft = match soft_qp(VERB, qp) {
                Ok(q) => q,
                Err(n) => return n,
            };
            // Fixed at creation (see post_send).
            let cap = soft.cap();
            let q = RecvQueue {
                max_wr: cap.max_recv_wr,
                max_sge: ("max_recv_sge", cap.max_recv_sge),
            };
            post_recv_list(VERB, q, wr, bad_wr, |wrs| soft.post_recv_list(wrs))
        }
    })
}

/// `ctx->ops.post_srq_recv`. As rxe, an empty list posts nothing and
/// succeeds; a NULL `bad_wr` is EINVAL.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    const VERB: &str = "ibv_post_srq_recv";
    guard(libc::EIO, || {
        if srq.is_null() || bad_wr.is_null() {
            return fail_with(VERB, libc::EINVAL, "NULL srq or bad_wr");
        }
        // SAFETY: a live SRQ (a Srq object; its sizes are fixed); bad_wr
        // is writable; wr as post_recv_list requires.
        unsafe {
            *bad_wr = null_mut();
            if wr.is_null() {
                return 0;
            }
            let soft = match live(VERB, &*ptr::addr_of!((*srq.cast::<Srq>()).srq)) {
                Ok(s) => s,
                Err(n) => return n,
            };
            let q = RecvQueue {
                max_wr: soft.max_wr(),
                max_sge: ("max_sge", soft.max_sge()),
            };
            post_recv_list(VERB, q, wr, bad_wr, |wrs| soft.post_recv_list(wrs))
        }
    })
}
