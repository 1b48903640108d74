//! The verbs on objects: protection domains, memory regions, completion
//! queues and their events, queue pairs, shared receive queues, address
//! handles, and the data path (`post_send`, `post_recv`, `post_srq_recv`,
//! `poll_cq`, `req_notify_cq`), which programs reach through the function
//! pointers in `ctx->ops` because the header makes them inline.
//!
//! Every verb runs on the device's engine under its lock
//! (`Context::with_engine`, which then transmits what the call queued);
//! `poll_cq` runs `Context::poll_engine`: the program's polling drives
//! receive, timers and transmit with no thread hand-off, and the device's
//! background thread,
//! which wakes when packets arrive, serves one-sided operations to a
//! program that is busy elsewhere (spinning on memory, blocked in
//! `ibv_get_cq_event`).

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::ptr::{self, null_mut};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use softrdma::{
    AccessFlags, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest, WorkCompletion,
};
use softrdma_engine::{QpInit, SrqInit};

use crate::abi::*;
use crate::convert;
use crate::ffi::{self, fail, fail_with, guard};
use crate::objects::{self, Chan, Ctx, Mr, Pd, Qp, Srq};

/// # Safety
/// `p` must be a live object of this library whose first field is an
/// `ibv_context *` (every verbs object is).
unsafe fn ctx_of<'a, T>(p: *mut T) -> &'a Ctx {
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
            Ok(pd) => objects::leak(Pd {
                ibv: ibv_pd {
                    context,
                    handle: pd.handle(),
                },
                pd,
            })
            .cast(),
            Err(e) => {
                fail_with("ibv_alloc_pd", e.errno(), &e.to_string());
                null_mut()
            }
        }
    })
}

/// What every destroy verb does: EINVAL for NULL, the engine's destroy on
/// the object's handle (its errno on refusal: EBUSY for an object in use),
/// then `release` drops the library's bookkeeping and frees the C object.
///
/// # Safety
/// `obj` is NULL or a live object of this library whose first field is an
/// `ibv_context *`; on success it is freed and must not be used again.
unsafe fn destroy<T>(
    verb: &str,
    obj: *mut T,
    handle: impl FnOnce(&T) -> u32,
    engine: impl FnOnce(&mut softrdma_engine::Engine, u32) -> softrdma_engine::Result<()>,
    release: impl FnOnce(&Ctx, *mut T, u32),
) -> c_int {
    guard(libc::EIO, || {
        if obj.is_null() {
            // "ibv_destroy_cq" → "NULL cq"
            let what = verb.rsplit('_').next().unwrap_or(verb);
            return fail_with(verb, libc::EINVAL, &format!("NULL {what}"));
        }
        // SAFETY: a live object, per the contract.
        unsafe {
            let c = ctx_of(obj);
            let h = handle(&*obj);
            if let Err(e) = c.dev.with_engine(|e, _| engine(e, h)) {
                return fail(verb, &e);
            }
            release(c, obj, h);
        }
        0
    })
}

/// EBUSY while MRs, QPs, SRQs or AHs still use it.
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    // EBUSY comes from the engine; on success the softrdma::Pd's own drop
    // finds the PD gone and has nothing left to do.
    // SAFETY: `destroy`'s contract is the verb's (a live object or NULL);
    // the release closure runs inside it on that live object, once.
    unsafe {
        destroy(
            "ibv_dealloc_pd",
            pd,
            |p| p.handle,
            |e, h| e.dealloc_pd(h),
            // A live Pd object, freed once.
            |_, p, _| objects::free(p.cast::<Pd>()),
        )
    }
}

// ----- memory regions -----

/// Registers `len` bytes at `addr` under virtual address `iova`. Hints a
/// soft device can ignore (`IBV_ACCESS_OPTIONAL_RANGE`, HUGETLB, MW_BIND)
/// are dropped; ZERO_BASED registers at iova 0.
unsafe fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    if pd.is_null() || (addr.is_null() && len > 0) {
        fail_with("ibv_reg_mr", libc::EINVAL, "NULL pd or address");
        return null_mut();
    }
    let mut bits = access as u32;
    let iova = if bits & IBV_ACCESS_ZERO_BASED != 0 {
        0
    } else {
        iova
    };
    bits &= !(IBV_ACCESS_OPTIONAL_RANGE
        | IBV_ACCESS_HUGETLB
        | IBV_ACCESS_MW_BIND
        | IBV_ACCESS_ZERO_BASED);
    // SAFETY: a live PD (a Pd object); the caller keeps addr..addr+len
    // valid until ibv_dereg_mr (the ibv_reg_mr contract), which
    // register_raw requires.
    unsafe {
        let p = &*pd.cast::<Pd>();
        let access = AccessFlags::from_bits_retain(bits);
        match p.pd.register_raw_shared(addr.cast(), len, iova, access) {
            Ok(mr) => objects::leak(Mr {
                ibv: ibv_mr {
                    context: p.ibv.context,
                    pd,
                    addr,
                    length: len,
                    handle: mr.lkey(),
                    lkey: mr.lkey(),
                    rkey: mr.rkey(),
                },
                mr,
            })
            .cast(),
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
        unsafe { objects::free(mr.cast::<Mr>()) };
        0
    })
}

// ----- completion queues -----

pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    _comp_vector: c_int,
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
        // SAFETY: live context; channel is NULL or a live channel.
        unsafe {
            let c = Ctx::from_ptr(context);
            let handle = match c.dev.with_engine(|e, _| e.create_cq(cqe as u32)) {
                Ok(h) => h,
                Err(e) => {
                    fail("ibv_create_cq", &e);
                    return null_mut();
                }
            };
            let cq = objects::leak(ibv_cq {
                context,
                channel,
                cq_context,
                handle,
                cqe,
                mutex: objects::new_mutex(),
                cond: objects::new_cond(),
                comp_events_completed: 0,
                async_events_completed: 0,
            });
            // Known before any event of it can be looked up.
            c.objects().cqs.insert(handle, cq as usize);
            if !channel.is_null() {
                let ch = &*channel.cast::<Chan>();
                c.dev.bind_cq_channel(handle, &ch.ch);
                AtomicU32::from_ptr(ptr::addr_of_mut!((*channel).refcnt).cast())
                    .fetch_add(1, Ordering::Relaxed);
            }
            cq
        }
    })
}

/// EBUSY while QPs use it.
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: `destroy`'s contract is the verb's (a live object or NULL);
    // the release closure runs inside it on that live object, once.
    unsafe {
        destroy(
            "ibv_destroy_cq",
            cq,
            |q| q.handle,
            |e, h| e.destroy_cq(h),
            |c, cq, h| {
                c.objects().cqs.remove(&h);
                // A live CQ (its channel, if any, outlives it), freed once.
                let channel = (*cq).channel;
                if !channel.is_null() {
                    c.dev.unbind_cq_channel(h);
                    AtomicU32::from_ptr(ptr::addr_of_mut!((*channel).refcnt).cast())
                        .fetch_sub(1, Ordering::Relaxed);
                }
                objects::free(cq);
            },
        )
    }
}

/// `ibv_resize_cq`: not supported (the depth is fixed at creation).
pub unsafe extern "C" fn ibv_resize_cq(_cq: *mut ibv_cq, _cqe: c_int) -> c_int {
    fail_with("ibv_resize_cq", libc::EOPNOTSUPP, "CQs cannot be resized")
}

thread_local! {
    /// Completions on their way from the engine to the caller's array.
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
        // SAFETY: a live CQ; wc has room for num_entries entries.
        unsafe {
            let c = ctx_of(cq);
            let h = (*cq).handle;
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
                match c.dev.poll_cq(h, num_entries as usize, &mut v, true) {
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
        // SAFETY: a live CQ.
        unsafe {
            let h = (*cq).handle;
            match ctx_of(cq)
                .dev
                .with_engine(|e, _| e.req_notify_cq(h, solicited_only != 0))
            {
                Ok(()) => 0,
                Err(e) => fail("ibv_req_notify_cq", &e),
            }
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
            let c = Ctx::from_ptr(ch.ibv.context);
            let fd = ch.ibv.fd;
            loop {
                let nonblocking = ffi::is_nonblocking(fd);
                if nonblocking {
                    // Drain before looking: a later event signals again.
                    ffi::drain_eventfd(fd);
                }
                while let Some(h) = ch.ch.try_get_event() {
                    // An event of a CQ destroyed since is dropped.
                    let Some(cq) = c.lookup(|o| o.cqs.get(&h).copied()) else {
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
                if ffi::wait_readable(fd, 100) {
                    ffi::drain_eventfd(fd);
                }
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
        // SAFETY: a live PD; init is readable and writable.
        unsafe {
            let c = ctx_of(pd);
            let a = (*init).attr;
            let p = (*pd).handle;
            let r = c.dev.with_engine(|e, _| {
                e.create_srq(
                    p,
                    SrqInit {
                        max_wr: a.max_wr,
                        max_sge: a.max_sge,
                        limit: a.srq_limit,
                    },
                )
            });
            match r {
                Ok(handle) => {
                    let srq = objects::leak(Srq {
                        ibv: ibv_srq {
                            context: c.as_ibv(),
                            srq_context: (*init).srq_context,
                            pd,
                            handle,
                            mutex: objects::new_mutex(),
                            cond: objects::new_cond(),
                            events_completed: 0,
                        },
                        attr: Mutex::new(a),
                        max_wr: a.max_wr,
                        max_sge: a.max_sge,
                    });
                    c.objects().srqs.insert(handle, srq as usize);
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
            let limit = (*attr).srq_limit;
            let h = s.ibv.handle;
            match ctx_of(srq)
                .dev
                .with_engine(|e, _| e.arm_srq_limit(h, limit))
            {
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
    // the release closure runs inside it on that live object, once.
    unsafe {
        destroy(
            "ibv_destroy_srq",
            srq,
            |q| q.handle,
            |e, h| e.destroy_srq(h),
            |c, srq, h| {
                c.objects().srqs.remove(&h);
                // A live Srq object, freed once.
                objects::free(srq.cast::<Srq>());
            },
        )
    }
}

// ----- queue pairs -----

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
            if a.send_cq.is_null() || a.recv_cq.is_null() {
                fail_with(
                    "ibv_create_qp",
                    libc::EINVAL,
                    "send_cq and recv_cq are required",
                );
                return null_mut();
            }
            let Some(qp_type) = QpType::from_ibv(a.qp_type) else {
                fail_with(
                    "ibv_create_qp",
                    libc::EOPNOTSUPP,
                    &format!("QP type {} (softrdma has RC, UC and UD)", a.qp_type),
                );
                return null_mut();
            };
            let qi = QpInit {
                pd: (*pd).handle,
                qp_type,
                send_cq: (*a.send_cq).handle,
                recv_cq: (*a.recv_cq).handle,
                srq: (!a.srq.is_null()).then(|| (*a.srq).handle),
                cap: convert::qp_cap(&a.cap),
                sq_sig_all: a.sq_sig_all != 0,
            };
            let r = c.dev.with_engine(|e, _| {
                let qpn = e.create_qp(qi)?;
                let cap = e.query_qp(qpn).map(|(_, i)| i.cap).unwrap_or(qi.cap);
                Ok::<_, softrdma::VerbsError>((qpn, cap))
            });
            match r {
                Ok((qpn, cap)) => {
                    a.cap = convert::cap_to_c(&cap);
                    let qp = objects::leak(Qp {
                        ibv: ibv_qp {
                            context: c.as_ibv(),
                            qp_context: a.qp_context,
                            pd,
                            send_cq: a.send_cq,
                            recv_cq: a.recv_cq,
                            srq: a.srq,
                            handle: qpn,
                            qp_num: qpn,
                            state: 0,
                            qp_type: a.qp_type,
                            mutex: objects::new_mutex(),
                            cond: objects::new_cond(),
                            events_completed: 0,
                        },
                        cap,
                    });
                    c.objects().qps.insert(qpn, qp as usize);
                    qp.cast()
                }
                Err(e) => {
                    fail("ibv_create_qp", &e);
                    null_mut()
                }
            }
        }
    })
}

/// `ibv_modify_qp`: the transition and attribute mask are checked as the
/// kernel checks them; every refusal is EINVAL (returned and in errno).
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        if qp.is_null() || attr.is_null() {
            return fail_with("ibv_modify_qp", libc::EINVAL, "NULL argument");
        }
        // SAFETY: a live QP; attr is readable.
        unsafe {
            let a = match convert::qp_attr(&*attr, mask) {
                Ok(a) => a,
                Err(why) => return fail_with("ibv_modify_qp", libc::EINVAL, &why),
            };
            let qpn = (*qp).qp_num;
            let c = ctx_of(qp);
            let r = c.dev.with_engine(|e, now| {
                e.modify_qp(now, qpn, &a, softrdma::AttrMask(mask as u32))?;
                Ok::<_, softrdma::VerbsError>(e.qp_state(qpn))
            });
            match r {
                Ok(state) => {
                    // Same-host peers see the new state (direct operations).
                    c.dev.publish_qp(qpn);
                    if let Some(s) = state {
                        (*qp).state = s.to_ibv();
                    }
                    0
                }
                Err(e) => fail("ibv_modify_qp", &e),
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
    guard(libc::EIO, || {
        if qp.is_null() || attr.is_null() {
            return fail_with("ibv_query_qp", libc::EINVAL, "NULL argument");
        }
        // SAFETY: a live QP; attr and init (if not NULL) are writable.
        unsafe {
            let qpn = (*qp).qp_num;
            match ctx_of(qp).dev.with_engine(|e, _| e.query_qp(qpn)) {
                Ok((a, i)) => {
                    attr.write(convert::qp_attr_to_c(&a));
                    (*qp).state = a.qp_state.to_ibv();
                    if !init.is_null() {
                        init.write(ibv_qp_init_attr {
                            qp_context: (*qp).qp_context,
                            send_cq: (*qp).send_cq,
                            recv_cq: (*qp).recv_cq,
                            srq: (*qp).srq,
                            cap: convert::cap_to_c(&i.cap),
                            qp_type: i.qp_type.to_ibv(),
                            sq_sig_all: c_int::from(i.sq_sig_all),
                        });
                    }
                    0
                }
                Err(e) => fail("ibv_query_qp", &e),
            }
        }
    })
}

/// Outstanding work is discarded without completions.
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: `destroy`'s contract is the verb's (a live object or NULL);
    // the release closure runs inside it on that live object, once.
    unsafe {
        destroy(
            "ibv_destroy_qp",
            qp,
            |q| q.qp_num,
            |e, qpn| e.destroy_qp(qpn),
            |c, qp, qpn| {
                // Withdrawn from same-host peers.
                c.dev.publish_qp(qpn);
                c.objects().qps.remove(&qpn);
                // A live Qp object, freed once.
                objects::free(qp.cast::<Qp>());
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
    // SAFETY: per the contract.
    unsafe {
        let c = ctx_of(pd);
        let p = (*pd).handle;
        match c.dev.with_engine(|e, _| e.create_ah(p, *a)) {
            Ok(handle) => objects::leak(ibv_ah {
                context: c.as_ibv(),
                pd,
                handle,
            }),
            Err(e) => {
                fail("ibv_create_ah", &e);
                null_mut()
            }
        }
    }
}

pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    // SAFETY: `destroy`'s contract is the verb's (a live object or NULL);
    // the release closure runs inside it on that live object, once.
    unsafe {
        destroy(
            "ibv_destroy_ah",
            ah,
            |a| a.handle,
            |e, h| e.destroy_ah(h),
            // A live AH, freed once.
            |_, ah, _| objects::free(ah),
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
struct SendQueue {
    qpn: u32,
    ud: bool,
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
            let c = ctx_of(qp);
            let q = SendQueue {
                qpn: (*qp).qp_num,
                ud: (*qp).qp_type == QpType::Ud.to_ibv(),
                // Fixed at creation; read through the raw pointer, as
                // ibv_modify_qp may write `state` meanwhile.
                cap: (*qp.cast::<Qp>()).cap,
            };
            let mut cur = wr;
            let mut posted = 0u32;
            while !cur.is_null() {
                let room = posted < q.cap.max_send_wr;
                if let Err(n) = post_one(c, q, &*cur, room) {
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
/// this call has not yet posted `max_send_wr` WRs): a WRITE, READ or
/// atomic to a same-host peer is done directly in its memory when softrdma
/// can (docs/shm.md), anything else goes to the engine (a direct
/// completion raises its CQ event at once).
///
/// # Safety
/// `w` is readable, its SGE list holds `num_sge` SGEs if that passes the
/// checks, and its AH (UD) is live.
unsafe fn post_one(c: &Ctx, q: SendQueue, w: &ibv_send_wr, room: bool) -> Result<(), c_int> {
    let mut sg = SEND_SGES.with(|v| std::mem::take(&mut *v.borrow_mut()));
    // SAFETY: per the contract.
    let r = unsafe { post_one_with(c, q, w, room, &mut sg) };
    SEND_SGES.with(|v| *v.borrow_mut() = sg);
    r
}

/// [`post_one`] with `buf` as the SGE list's buffer (given back after).
///
/// # Safety
/// As [`post_one`].
unsafe fn post_one_with(
    c: &Ctx,
    q: SendQueue,
    w: &ibv_send_wr,
    room: bool,
    buf: &mut Vec<Sge>,
) -> Result<(), c_int> {
    const VERB: &str = "ibv_post_send";
    let op = send_op_checked(w)?;
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
            ah: unsafe { (*u.ah).handle },
            remote_qpn: u.remote_qpn,
            remote_qkey: u.remote_qkey,
        })
    } else {
        None
    };
    let sg = std::mem::take(buf);
    let qpn = q.qpn;
    let mut swr = SendWr {
        wr_id: w.wr_id,
        op,
        sg_list: sg,
        flags,
        ud,
    };
    let direct = matches!(
        op,
        SendOp::Write { .. }
            | SendOp::Read { .. }
            | SendOp::CompareSwap { .. }
            | SendOp::FetchAdd { .. }
    ) && !inline_op
        && ud.is_none();
    let r = if direct && c.dev.try_direct(qpn, &swr) {
        Ok(())
    } else if inline_op {
        INLINE.with(|buf| {
            let mut data = buf.borrow_mut();
            // SAFETY: per the contract, the SGEs describe readable memory
            // (at most max_inline_data bytes, checked above).
            unsafe { gather_inline(&swr.sg_list, &mut data) };
            swr.sg_list.clear();
            c.dev
                .with_engine(|e, now| e.post_send_inline(now, qpn, &swr, &data))
        })
    } else {
        c.dev.with_engine(|e, now| e.post_send(now, qpn, &swr))
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

/// Posts a receive list: each WR is refused with ENOMEM once the call has
/// posted `q.max_wr` WRs, then with EINVAL when its `num_sge` is over the
/// limit (rxe's order), before its SGEs are read; `*bad_wr` is the WR that
/// failed, and nothing after it is read.
///
/// # Safety
/// `wr` is a NULL-terminated list of readable receive WRs, each with the
/// SGEs its num_sge counts when that passes; `bad_wr` is writable.
unsafe fn post_recv_list(
    verb: &str,
    c: &Ctx,
    q: RecvQueue,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    post: impl Fn(&mut softrdma_engine::Engine, &RecvWr) -> Result<(), softrdma::VerbsError>,
) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        let (err, bad) = c.dev.with_engine(|e, _| {
            let mut cur = wr;
            let mut posted = 0u32;
            while !cur.is_null() {
                let w = &*cur;
                let r = if posted >= q.max_wr {
                    Err(fail_with(
                        verb,
                        libc::ENOMEM,
                        &format!("the list is longer than the queue ({} WRs)", q.max_wr),
                    ))
                } else {
                    let mut sg_list = Vec::new();
                    sges_into(verb, w.sg_list, w.num_sge, q.max_sge, &mut sg_list).and_then(|()| {
                        post(
                            e,
                            &RecvWr {
                                wr_id: w.wr_id,
                                sg_list,
                            },
                        )
                        .map_err(|err| fail(verb, &err))
                    })
                };
                if let Err(n) = r {
                    return (n, cur);
                }
                posted += 1;
                cur = w.next;
            }
            (0, null_mut())
        });
        if err != 0 {
            *bad_wr = bad;
        }
        err
    }
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
            let qpn = (*qp).qp_num;
            // Fixed at creation (see post_send).
            let cap = (*qp.cast::<Qp>()).cap;
            let q = RecvQueue {
                max_wr: cap.max_recv_wr,
                max_sge: ("max_recv_sge", cap.max_recv_sge),
            };
            post_recv_list(VERB, ctx_of(qp), q, wr, bad_wr, |e, r| e.post_recv(qpn, r))
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
            let h = (*srq).handle;
            let s = srq.cast::<Srq>();
            let q = RecvQueue {
                max_wr: (*s).max_wr,
                max_sge: ("max_sge", (*s).max_sge),
            };
            post_recv_list(VERB, ctx_of(srq), q, wr, bad_wr, |e, r| {
                e.post_srq_recv(h, r)
            })
        }
    })
}
