//! The rdma_cm entry points, exported from libibverbs.so.1 as
//! `softrdma_rdmacm_<rdma-core name>` (version node SOFTRDMA_RDMACM_PRIVATE
//! of libibverbs.map) for librdmacm.so.1 to forward to. Each follows its
//! rdma-core v44 contract: 0 (or a pointer) on success, -1 (NULL) with
//! errno on failure; NULL pointers and bad lengths are EINVAL. The
//! synchronous behaviour of ids made without a channel (`rdma_create_ep`'s)
//! is `super::complete`.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::ptr::null_mut;

use softrdma::rdma_cm::ConnParam;

use super::abi::*;
use super::events::{self, Channel, EventData, Param};
use super::{addr, complete, contexts, ctx_for, new_id, port_space, registry, set_device, Id};
use crate::abi::*;
use crate::ffi::{self, guard};
use crate::objects::{self, Ctx};

type R = Result<(), c_int>;

/// 0, or -1 with errno (printed under SOFTRDMA_IBV_DEBUG).
fn ret(verb: &str, r: R) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            ffi::fail_with(verb, e, "refused");
            -1
        }
    }
}

/// The id behind `p`; EINVAL for NULL, or for what is not a live id.
///
/// # Safety
/// No other thread uses the id mutably at the same time (the
/// rdma_cm contract).
unsafe fn id_mut<'a>(p: *mut rdma_cm_id) -> Result<&'a mut Id, c_int> {
    Id::live(p).ok_or(libc::EINVAL)
}

// ----- devices -----

/// `rdma_get_devices`: the contexts of every device, opened once for the
/// rdma_cm (as librdmacm opens them all) and never closed, in a
/// NULL-terminated array the caller frees with `rdma_free_devices`;
/// `num_devices` (if not NULL) gets their number. libfabric's verbs
/// provider starts from this list.
pub unsafe extern "C" fn softrdma_rdmacm_rdma_get_devices(
    num_devices: *mut c_int,
) -> *mut *mut ibv_context {
    guard(null_mut(), || {
        let all = contexts();
        // SAFETY: calloc of len + 1 pointers; checked for NULL below.
        let arr = unsafe { libc::calloc(all.len() + 1, std::mem::size_of::<usize>()) }
            .cast::<*mut ibv_context>();
        if arr.is_null() {
            ffi::set_errno(libc::ENOMEM);
            return null_mut();
        }
        for (i, &a) in all.iter().enumerate() {
            // SAFETY: i < len + 1, inside the allocation.
            unsafe { *arr.add(i) = super::ctx_at(a).as_ibv() };
        }
        if !num_devices.is_null() {
            // SAFETY: the caller passes a valid int pointer or NULL.
            unsafe { *num_devices = all.len() as c_int };
        }
        arr
    })
}

/// `rdma_free_devices`: frees the array (the contexts stay open).
pub unsafe extern "C" fn softrdma_rdmacm_rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: list came from rdma_get_devices' calloc (or is NULL).
    guard((), || unsafe { libc::free(list.cast()) })
}

// ----- channels -----

pub unsafe extern "C" fn softrdma_rdmacm_rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(null_mut(), || match Channel::create() {
        Ok(c) => c.cast(),
        Err(e) => {
            ffi::fail_with("rdma_create_event_channel", e, "no eventfd");
            null_mut()
        }
    })
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_destroy_event_channel(
    channel: *mut rdma_event_channel,
) {
    if !channel.is_null() {
        // SAFETY: a live channel whose ids are gone (the contract).
        guard((), || unsafe { Channel::destroy(channel) })
    }
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard(-1, || {
        if channel.is_null() || event.is_null() {
            return ret("rdma_get_cm_event", Err(libc::EINVAL));
        }
        let r = events::pop(channel, true).map(|ev| {
            // SAFETY: a writable pointer (the contract).
            unsafe { *event = ev }
        });
        ret("rdma_get_cm_event", r)
    })
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard(-1, || {
        if event.is_null() {
            return ret("rdma_ack_cm_event", Err(libc::EINVAL));
        }
        events::free(event);
        0
    })
}

pub extern "C" fn softrdma_rdmacm_rdma_event_str(event: c_uint) -> *const c_char {
    EVENT_NAMES
        .get(event as usize)
        .copied()
        .unwrap_or(c"UNKNOWN EVENT")
        .as_ptr()
}

// ----- ids -----

pub unsafe extern "C" fn softrdma_rdmacm_rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_uint,
) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return ret("rdma_create_id", Err(libc::EINVAL));
        }
        // SAFETY: `id` is writable (the contract).
        let r = create_id(channel, context, ps).map(|p| unsafe { *id = p });
        ret("rdma_create_id", r)
    })
}

/// An id on `channel`, or synchronous with a channel of its own.
fn create_id(
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: c_uint,
) -> Result<*mut rdma_cm_id, c_int> {
    let qp_type = match ps {
        RDMA_PS_TCP | RDMA_PS_IB => IBV_QPT_RC,
        RDMA_PS_UDP | RDMA_PS_IPOIB => IBV_QPT_UD,
        _ => return Err(libc::EINVAL),
    };
    // Devices open (and their event threads start) with the first id.
    contexts();
    let (ch, sync) = if channel.is_null() {
        (Channel::create()?.cast(), true)
    } else {
        (channel, false)
    };
    let id = new_id(ch, context, ps, qp_type);
    // SAFETY: just made.
    let idr = unsafe { &mut *id };
    idr.state().sync = sync;
    Ok(idr.as_ptr())
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: a live id or NULL (the contract).
    guard(-1, || ret("rdma_destroy_id", unsafe { destroy_id(id) }))
}

/// Forgets the id's connection and listeners, its queued events, its own
/// channel, and frees it.
///
/// # Safety
/// `p` is NULL or a live id no other thread uses.
unsafe fn destroy_id(p: *mut rdma_cm_id) -> R {
    // SAFETY: per the contract.
    let id = unsafe { id_mut(p) }?;
    let key = id as *mut Id as usize;
    let st = std::mem::take(&mut *id.state());
    for j in &st.mcast {
        // SAFETY: the id's QP, if any, is live until rdma_destroy_qp.
        unsafe { super::mcast::detach(id, j) };
    }
    let mut reg = registry();
    reg.conns.retain(|_, v| *v != key);
    let mine: Vec<(usize, u16)> = reg
        .listeners
        .iter()
        .filter(|(_, v)| **v == key)
        .map(|(k, _)| *k)
        .collect();
    drop(reg);
    let space = port_space(id.c.ps);
    for (ctx, port) in mine {
        registry().listeners.remove(&(ctx, port));
        if let Some(space) = space {
            let c = super::ctx_at(ctx);
            let _ = c.dev.cm().unlisten(space, port);
        }
    }
    if let (Some((port, ctxs)), Some(space)) = (&st.reserved, space) {
        release(space, *port, ctxs);
    }
    if let (Some(conn), Some(ctx)) = (st.conn, id.ctx()) {
        let _ = ctx.dev.cm().destroy(conn);
    }
    events::forget(id.c.channel, p);
    events::free(id.c.event);
    if st.sync {
        // SAFETY: the id's own channel, used by nothing else.
        unsafe { Channel::destroy(id.c.channel) };
    }
    super::live_ids().remove(&key);
    // SAFETY: made by `new_id` (leak), not freed yet.
    unsafe { objects::free(key as *mut Id) };
    Ok(())
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live id or NULL (the contract).
        let r = unsafe { id_mut(id) }.and_then(|id| {
            let (new, sync) = if channel.is_null() {
                (Channel::create()?.cast(), true)
            } else {
                (channel, false)
            };
            let old = id.c.channel;
            let was_sync = {
                let _reg = registry();
                id.c.channel = new;
                std::mem::replace(&mut id.state().sync, sync)
            };
            events::forget(old, id.as_ptr());
            if was_sync {
                // SAFETY: the id's former own channel, now unused.
                unsafe { Channel::destroy(old) };
            }
            Ok(())
        });
        ret("rdma_migrate_id", r)
    })
}

// ----- addresses and routes -----

pub unsafe extern "C" fn softrdma_rdmacm_rdma_bind_addr(
    id: *mut rdma_cm_id,
    sa: *mut libc::sockaddr,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live id (or NULL) and a sockaddr (or NULL).
        let r = unsafe { id_mut(id) }.and_then(|id| {
            // SAFETY: per the contract.
            let a = unsafe { addr::from_c(sa) }.ok_or(libc::EINVAL)?;
            bind(id, a)?;
            reserve(id);
            Ok(())
        });
        ret("rdma_bind_addr", r)
    })
}

/// Reserves the bound port on the bound device (every device for a
/// wildcard bind), so that a REQ that comes before `rdma_listen` waits
/// for it instead of being rejected.
fn reserve(id: &mut Id) {
    let (Some(space), Some(a)) = (port_space(id.c.ps), addr::route_addr(&id.c.route, false)) else {
        return;
    };
    let ctxs: Vec<usize> = match id.ctx() {
        Some(c) => vec![c as *const Ctx as usize],
        None => contexts().to_vec(),
    };
    for &c in &ctxs {
        super::ctx_at(c).dev.cm().reserve(space, a.port());
    }
    if let Some((port, old)) = id.state().reserved.replace((a.port(), ctxs)) {
        release(space, port, &old);
    }
}

fn release(space: softrdma::rdma_cm::PortSpace, port: u16, ctxs: &[usize]) {
    for &c in ctxs {
        super::ctx_at(c).dev.cm().release(space, port);
    }
}

/// Binds to `a`: a specific address also binds the device that has it. A
/// loopback address no device has binds the first device (`ctx_for`) and
/// takes that device's address: each softrdma device is its own HCA, so
/// a peer reaches it at its address only (the kernel keeps 127.0.0.1,
/// which reaches every device of the host). Port 0 takes an ephemeral
/// port now, as the kernel's rdma_bind_addr does (qperf reads it with
/// rdma_get_src_port before rdma_listen).
fn bind(id: &mut Id, mut a: std::net::SocketAddr) -> R {
    if !a.ip().is_unspecified() {
        let ctx = ctx_for(Some(a.ip())).ok_or(libc::ENODEV)?;
        set_device(id, ctx);
        a.set_ip(ctx.dev.addr().ip());
    }
    if a.port() == 0 {
        a.set_port(ephemeral_port());
    }
    addr::set_route(&mut id.c.route, Some(a), None);
    Ok(())
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live id (or NULL); the sockaddrs are NULL or valid.
        let r = unsafe { id_mut(id) }.and_then(|id| unsafe { resolve_addr(id, src, dst) });
        ret("rdma_resolve_addr", r)
    })
}

/// Binds the device (the source's, else the default one) and records the
/// destination: there is no address resolution to wait for, so
/// ADDR_RESOLVED is queued at once.
///
/// # Safety
/// The sockaddrs are NULL or valid.
unsafe fn resolve_addr(id: &mut Id, src: *const libc::sockaddr, dst: *const libc::sockaddr) -> R {
    // SAFETY: per the contract.
    let dst = unsafe { addr::from_c(dst) }.ok_or(libc::EINVAL)?;
    // SAFETY: per the contract.
    if let Some(s) = unsafe { addr::from_c(src) } {
        bind(id, s)?;
    }
    let ctx = match id.ctx() {
        Some(c) => c,
        None => {
            let c = ctx_for(None).ok_or(libc::ENODEV)?;
            set_device(id, c);
            c
        }
    };
    let port = addr::route_addr(&id.c.route, false).map_or(0, |a| a.port());
    let src = std::net::SocketAddr::new(ctx.dev.addr().ip(), port);
    addr::set_route(&mut id.c.route, Some(src), Some(dst));
    queue(id, RDMA_CM_EVENT_ADDR_RESOLVED);
    complete(id)
}

/// Queues a local event (resolutions) for `id`.
pub(super) fn queue(id: &mut Id, kind: c_uint) {
    let ev = EventData {
        kind,
        status: 0,
        listen_id: null_mut(),
        private_data: Vec::new(),
        param: Param::None,
    };
    events::push(id.c.channel, id.as_ptr(), ev);
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_resolve_route(
    id: *mut rdma_cm_id,
    _timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live id or NULL.
        let r = unsafe { id_mut(id) }.and_then(resolve_route);
        ret("rdma_resolve_route", r)
    })
}

/// The path is the device's RoCE port: ROUTE_RESOLVED at once.
fn resolve_route(id: &mut Id) -> R {
    if id.ctx().is_none() || addr::route_addr(&id.c.route, true).is_none() {
        return Err(libc::EINVAL);
    }
    queue(id, RDMA_CM_EVENT_ROUTE_RESOLVED);
    complete(id)
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || match Id::live(id) {
        Some(id) => addr::route_addr(&id.c.route, false).map_or(0, |a| a.port().to_be()),
        None => 0,
    })
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || match Id::live(id) {
        Some(id) => addr::route_addr(&id.c.route, true).map_or(0, |a| a.port().to_be()),
        None => 0,
    })
}

// ----- QPs -----

pub unsafe extern "C" fn softrdma_rdmacm_rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live id (or NULL), PD (or NULL) and attributes.
        let r = unsafe { id_mut(id) }.and_then(|id| {
            // SAFETY: per the contract, readable and writable or NULL.
            let attr = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
            // SAFETY: per the contract.
            unsafe { super::qp::create_qp(id, pd, attr) }
        });
        ret("rdma_create_qp", r)
    })
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut crate::qp_ex::ibv_qp_init_attr_ex,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live id (or NULL) and attributes (or NULL).
        let r = unsafe { id_mut(id) }.and_then(|id| {
            // SAFETY: per the contract, readable and writable or NULL.
            let attr = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
            // SAFETY: per the contract.
            unsafe { super::qp::create_qp_ex(id, attr) }
        });
        ret("rdma_create_qp_ex", r)
    })
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut crate::abi::ibv_srq_init_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live id (or NULL), PD (or NULL) and attributes.
        let r = unsafe { id_mut(id) }.and_then(|id| {
            // SAFETY: per the contract, readable and writable or NULL.
            let attr = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
            // SAFETY: per the contract.
            unsafe { super::qp::create_srq(id, pd, attr) }
        });
        ret("rdma_create_srq", r)
    })
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut crate::xrc::ibv_srq_init_attr_ex,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live id (or NULL) and attributes (or NULL).
        let r = unsafe { id_mut(id) }.and_then(|id| {
            // SAFETY: per the contract, readable and writable or NULL.
            let attr = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
            // SAFETY: per the contract.
            unsafe { super::qp::create_srq_ex(id, attr) }
        });
        ret("rdma_create_srq_ex", r)
    })
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: a live id or NULL.
        if let Ok(id) = unsafe { id_mut(id) } {
            super::qp::destroy_srq(id)
        }
    })
}

/// `enum ibv_event_type`'s COMM_EST and LID_CHANGE.
const IBV_EVENT_COMM_EST: c_int = 4;
const IBV_EVENT_LID_CHANGE: c_int = 11;

pub unsafe extern "C" fn softrdma_rdmacm_rdma_notify(id: *mut rdma_cm_id, event: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: a live id or NULL.
        let r = unsafe { id_mut(id) }.and_then(|id| notify(id, event));
        ret("rdma_notify", r)
    })
}

/// As the kernel's `ib_cm_notify`: COMM_EST establishes a connection
/// whose RTU has not come yet (EINVAL before the accept), LID_CHANGE is
/// accepted and ignored, any other event is EINVAL.
fn notify(id: &mut Id, event: c_int) -> R {
    match event {
        IBV_EVENT_LID_CHANGE => Ok(()),
        IBV_EVENT_COMM_EST => {
            let ctx = id.ctx().ok_or(libc::EINVAL)?;
            let conn = id.state().conn.ok_or(libc::EINVAL)?;
            ctx.dev.cm().notify_established(conn).map_err(|e| e.errno())
        }
        _ => Err(libc::EINVAL),
    }
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: a live id or NULL.
        if let Ok(id) = unsafe { id_mut(id) } {
            super::qp::destroy_qp(id)
        }
    })
}

// ----- multicast -----

pub unsafe extern "C" fn softrdma_rdmacm_rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live id (or NULL); the sockaddr is NULL or valid.
        let r = unsafe { id_mut(id) }
            .and_then(|id| unsafe { super::mcast::join(id, addr, false, context) });
        ret("rdma_join_multicast", r)
    })
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live id (or NULL); the attributes are NULL or readable,
        // their sockaddr valid.
        let r = unsafe { id_mut(id) }.and_then(|id| {
            // SAFETY: per the contract, NULL or readable.
            let (addr, send_only) = unsafe { super::mcast::ex_attr(attr) }?;
            // SAFETY: the attributes' sockaddr, valid per the contract.
            unsafe { super::mcast::join(id, addr, send_only, context) }
        });
        ret("rdma_join_multicast_ex", r)
    })
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live id (or NULL); the sockaddr is NULL or valid.
        let r = unsafe { id_mut(id) }.and_then(|id| unsafe { super::mcast::leave(id, addr) });
        ret("rdma_leave_multicast", r)
    })
}

// ----- connections -----

pub unsafe extern "C" fn softrdma_rdmacm_rdma_connect(
    id: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live id or NULL; param NULL or readable.
        let r = unsafe { id_mut(id) }.and_then(|id| unsafe { connect(id, param) });
        ret("rdma_connect", r)
    })
}

/// Sends the REQ for the id's QP (to RTS when the REP comes), or for a UD
/// id the SIDR_REQ that asks which QP serves the port.
///
/// # Safety
/// `param` is NULL or readable.
unsafe fn connect(id: &mut Id, param: *const rdma_conn_param) -> R {
    let ctx = id.ctx().ok_or(libc::EINVAL)?;
    let dst = addr::route_addr(&id.c.route, true).ok_or(libc::EINVAL)?;
    // librdmacm checks the depths of TCP-space ids only.
    let (max_resp, max_init) = match id.c.ps {
        RDMA_PS_UDP => (u8::MAX, u8::MAX),
        _ => depth_limits(ctx),
    };
    let defaults = ConnParam {
        responder_resources: max_resp,
        initiator_depth: max_init,
        ..ConnParam::default()
    };
    // SAFETY: per the contract.
    let mut p = unsafe { super::conn_param(param, defaults, max_resp, max_init) }?;
    p.ece = super::ece::offer(id);
    let cm = ctx.dev.cm();
    {
        let mut reg = registry();
        let conn = match id.c.ps {
            // SIDR: which UD QP serves the port (no QP of ours moves).
            RDMA_PS_UDP => cm.resolve_ud(dst, &p),
            // SAFETY: the id's QP is NULL or live.
            // TCP: RC; IB (with IP addresses, as rdma_xclient -c x): RC
            // or an XRC initiator.
            RDMA_PS_TCP | RDMA_PS_IB => {
                let space = port_space(id.c.ps).ok_or(libc::EINVAL)?;
                // SAFETY: the id's QP is NULL or live.
                match unsafe { super::qp::soft_qp(id) } {
                    Some(qp) => cm.connect_in(space, qp, dst, &p),
                    // No QP: the caller's QP number, a PSN of ours (as the
                    // kernel picks one), CONNECT_RESPONSE, then
                    // rdma_establish.
                    None => {
                        // SAFETY: per the contract.
                        let qpn = unsafe { qpless_qpn(id, param) }?;
                        cm.connect_qpless(space, qpn, new_psn(), dst, &p)
                    }
                }
            }
            _ => return Err(libc::ENOSYS),
        }
        .map_err(|e| e.errno())?;
        reg.conns
            .insert((ctx as *const Ctx as usize, conn.0), id as *mut Id as usize);
        id.state().conn = Some(conn);
    }
    complete(id)
}

/// The device's READ/atomic depth limits: (`max_qp_rd_atom`,
/// `max_qp_init_rd_atom`).
fn depth_limits(ctx: &Ctx) -> (u8, u8) {
    let a = ctx.dev.query_device();
    (
        a.max_qp_rd_atom.min(u32::from(u8::MAX - 1)) as u8,
        a.max_qp_init_rd_atom.min(u32::from(u8::MAX - 1)) as u8,
    )
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_listen(
    id: *mut rdma_cm_id,
    _backlog: c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live id or NULL.
        let r = unsafe { id_mut(id) }.and_then(listen);
        ret("rdma_listen", r)
    })
}

/// Listens on the bound port (an ephemeral one if none) of the bound
/// device, or of every device for a wildcard bind.
fn listen(id: &mut Id) -> R {
    let space = match id.c.ps {
        RDMA_PS_TCP | RDMA_PS_IB | RDMA_PS_UDP => port_space(id.c.ps).ok_or(libc::EINVAL)?,
        _ => return Err(libc::ENOSYS),
    };
    let bound = addr::route_addr(&id.c.route, false)
        .unwrap_or_else(|| std::net::SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0));
    let port = match bound.port() {
        0 => ephemeral_port(),
        p => p,
    };
    addr::set_route(
        &mut id.c.route,
        Some(std::net::SocketAddr::new(bound.ip(), port)),
        None,
    );
    let ctxs: Vec<usize> = match id.ctx() {
        Some(c) => vec![c as *const Ctx as usize],
        None => contexts().to_vec(),
    };
    let me = id as *mut Id as usize;
    let mut reg = registry();
    for (i, &c) in ctxs.iter().enumerate() {
        let r = super::ctx_at(c).dev.cm().listen(space, port);
        if let Err(e) = r {
            for &done in &ctxs[..i] {
                reg.listeners.remove(&(done, port));
                let _ = super::ctx_at(done).dev.cm().unlisten(space, port);
            }
            return Err(e.errno());
        }
        reg.listeners.insert((c, port), me);
    }
    drop(reg);
    id.state().listening = Some(port);
    Ok(())
}

/// A port for a listener bound to port 0 (from the dynamic range).
fn ephemeral_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 32768 + (std::process::id() % 16384) as u16;
    base.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) | 0x8000
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live id or NULL.
        let r = unsafe { id_mut(listen) }.and_then(|l| {
            if id.is_null() {
                return Err(libc::EINVAL);
            }
            let new = get_request(l)?;
            // SAFETY: `id` is writable (the contract).
            unsafe { *id = new };
            Ok(())
        });
        ret("rdma_get_request", r)
    })
}

/// A synchronous listener's next request: the new id, synchronous too,
/// with a QP made from `rdma_create_ep`'s attributes; it holds the event.
fn get_request(l: &mut Id) -> Result<*mut rdma_cm_id, c_int> {
    let (sync, init) = {
        let st = l.state();
        (st.sync, st.qp_init)
    };
    if !sync {
        return Err(libc::EINVAL);
    }
    let ev = events::pop(l.c.channel, true)?;
    // SAFETY: a live event just taken.
    let e = unsafe { &*ev };
    if e.status != 0 || e.event != RDMA_CM_EVENT_CONNECT_REQUEST {
        let err = if e.status < 0 {
            -e.status
        } else {
            libc::EINVAL
        };
        events::free(ev);
        return Err(err);
    }
    // SAFETY: a request's id is live until destroyed by the application.
    let new = unsafe { &mut *e.id.cast::<Id>() };
    let ch: *mut rdma_event_channel = Channel::create()?.cast();
    {
        let _reg = registry();
        new.c.channel = ch;
        new.state().sync = true;
    }
    new.c.event = ev;
    if let Some(mut attr) = init {
        // SAFETY: the listener's PD is NULL or live.
        if let Err(err) = unsafe { super::qp::create_qp(new, l.c.pd, &mut attr) } {
            if let (Some(conn), Some(ctx)) = (new.state().conn, new.ctx()) {
                let _ = ctx.dev.cm().reject(conn, &[]);
            }
            // SAFETY: the new id, used by nothing else yet.
            let _ = unsafe { destroy_id(new.as_ptr()) };
            return Err(err);
        }
    }
    Ok(new.as_ptr())
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_accept(
    id: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live id or NULL; param NULL or readable.
        let r = unsafe { id_mut(id) }.and_then(|id| unsafe { accept(id, param) });
        ret("rdma_accept", r)
    })
}

/// Accepts the id's connection request on its QP (RTS, then the REP), or
/// answers a UD id's SIDR request with its QP and rdma_cm's Q_Key.
///
/// # Safety
/// `param` is NULL or readable.
unsafe fn accept(id: &mut Id, param: *const rdma_conn_param) -> R {
    let ctx = id.ctx().ok_or(libc::EINVAL)?;
    let (conn, depths) = {
        let st = id.state();
        (
            st.conn.ok_or(libc::EINVAL)?,
            st.req_depths.unwrap_or((16, 16)),
        )
    };
    // SAFETY: the id's QP is NULL or live.
    let qp = unsafe { super::qp::soft_qp(id) };
    if id.c.ps == RDMA_PS_UDP {
        let qp = qp.ok_or(libc::EINVAL)?;
        // Only the private data counts for UD; librdmacm checks no depths.
        // SAFETY: per the contract.
        let p = unsafe { super::conn_param(param, ConnParam::default(), u8::MAX, u8::MAX) }?;
        let qkey = super::qp::RDMA_UDP_QKEY;
        ctx.dev
            .cm()
            .accept_ud(conn, qp, qkey, &p.private_data)
            .map_err(|e| e.errno())?;
        // The SIDR_REP ends the exchange: no event follows on this side.
        id.state().conn = None;
        return Ok(());
    }
    let (max_resp, max_init) = depth_limits(ctx);
    let defaults = ConnParam {
        responder_resources: depths.0.min(max_resp),
        initiator_depth: depths.1.min(max_init),
        ..ConnParam::default()
    };
    // SAFETY: per the contract.
    let mut p = unsafe { super::conn_param(param, defaults, max_resp, max_init) }?;
    p.ece = super::ece::answer(id);
    let cm = ctx.dev.cm();
    match qp {
        Some(qp) => cm.accept(conn, qp, &p),
        // SAFETY: per the contract.
        None => cm.accept_qpless(conn, unsafe { qpless_qpn(id, param) }?, new_psn(), &p),
    }
    .map_err(|e| e.errno())?;
    complete(id)
}

/// The QP number an id without a QP connects or accepts for: the
/// caller's `qp_num` (librdmacm's QP-less ids; EINVAL without one).
///
/// # Safety
/// `param` is NULL or readable.
unsafe fn qpless_qpn(id: &Id, param: *const rdma_conn_param) -> Result<u32, c_int> {
    // SAFETY: per the contract.
    let qpn = unsafe { param.as_ref() }.map_or(0, |p| p.qp_num & 0xFF_FFFF);
    if qpn == 0 || id.c.qp_type != IBV_QPT_RC {
        return Err(libc::EINVAL);
    }
    Ok(qpn)
}

/// A starting PSN for a QP-less connection (24 bits, from the OS's
/// random source; the caller reads it back with rdma_init_qp_attr).
fn new_psn() -> u32 {
    let mut b = [0u8; 4];
    if getrandom::fill(&mut b).is_err() {
        b = (std::process::id() ^ 0x5a5a_5a5a).to_le_bytes();
    }
    u32::from_le_bytes(b) & 0xFF_FFFF
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live id or NULL.
        let r = unsafe { id_mut(id) }.and_then(|id| {
            let ctx = id.ctx().ok_or(libc::EINVAL)?;
            let conn = id.state().conn.ok_or(libc::EINVAL)?;
            // SAFETY: per the contract, `len` readable bytes or NULL.
            let data = unsafe { super::private_data(private_data, len) };
            ctx.dev.cm().reject(conn, data).map_err(|e| e.errno())
        });
        ret("rdma_reject", r)
    })
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        // SAFETY: a live id or NULL.
        let r = unsafe { id_mut(id) }.and_then(disconnect);
        ret("rdma_disconnect", r)
    })
}

/// The QP to ERR (flushing its work, as librdmacm does), then the DREQ
/// (or the DREP to the peer's); a synchronous id waits for DISCONNECTED.
/// A connection already down is not an error for an asynchronous id, as
/// with the kernel (whose rdma_disconnect tries a DREQ, then a DREP, and
/// returns 0); a synchronous one would wait for an event that never comes.
fn disconnect(id: &mut Id) -> R {
    let ctx = id.ctx().ok_or(libc::EINVAL)?;
    let (conn, sync) = {
        let st = id.state();
        (st.conn.ok_or(libc::EINVAL)?, st.sync)
    };
    super::qp::to_error(id);
    match ctx.dev.cm().disconnect(conn, &[]) {
        Ok(()) => complete(id),
        Err(e) if sync => Err(e.errno()),
        Err(_) => Ok(()),
    }
}

// ----- endpoints and address info -----

pub unsafe extern "C" fn softrdma_rdmacm_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
            return ret("rdma_getaddrinfo", Err(libc::EINVAL));
        }
        // SAFETY: strings NUL-terminated or NULL; hints NULL or readable.
        let r = unsafe { getaddrinfo(node, service, hints) }.map(|info| {
            // SAFETY: `res` is writable (the contract).
            unsafe { *res = info }
        });
        ret("rdma_getaddrinfo", r)
    })
}

/// One result: the passive side's local address, or the active side's
/// destination (and the hints' source, if any).
///
/// # Safety
/// As [`softrdma_rdmacm_rdma_getaddrinfo`].
unsafe fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
) -> Result<*mut rdma_addrinfo, c_int> {
    // SAFETY: per the contract.
    let h = unsafe { hints.as_ref() };
    let flags = h.map_or(0, |h| h.ai_flags);
    let family = h.map_or(0, |h| h.ai_family);
    let qp_type = h.map_or(0, |h| h.ai_qp_type);
    let ps = match h.map_or(0, |h| h.ai_port_space) {
        0 if qp_type == IBV_QPT_UD as c_int => RDMA_PS_UDP as c_int,
        0 => RDMA_PS_TCP as c_int,
        p => p,
    };
    let qp_type = match qp_type {
        0 if ps == RDMA_PS_UDP as c_int => IBV_QPT_UD as c_int,
        0 => IBV_QPT_RC as c_int,
        t => t,
    };
    let passive = flags & RAI_PASSIVE != 0;
    if node.is_null() && service.is_null() {
        // No name to resolve: as rdma-core's, the answer is the hints' own
        // addresses (libfabric's verbs provider asks so for a connection
        // to an address it already has); with neither, EINVAL.
        // SAFETY: the hints' addresses are NULL or valid sockaddrs.
        let src = h.and_then(|h| unsafe { addr::from_c(h.ai_src_addr) });
        // SAFETY: as above.
        let dst = h.and_then(|h| unsafe { addr::from_c(h.ai_dst_addr) });
        if src.is_none() && dst.is_none() {
            return Err(libc::EINVAL);
        }
        return addr::new_info(flags, qp_type, ps, src, dst);
    }
    // SAFETY: per the contract.
    let a = unsafe { addr::resolve(node, service, family, passive) }?;
    let (src, dst) = if passive {
        (Some(a), None)
    } else {
        // SAFETY: the hints' source is NULL or a valid sockaddr.
        let src = h.and_then(|h| unsafe { addr::from_c(h.ai_src_addr) });
        (src, Some(a))
    };
    addr::new_info(flags, qp_type, ps, src, dst)
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    // SAFETY: a list of rdma_getaddrinfo's or NULL.
    guard((), || unsafe { addr::free_info(res) })
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return ret("rdma_create_ep", Err(libc::EINVAL));
        }
        // SAFETY: res NULL or readable, pd NULL or live, attr NULL or
        // readable and writable.
        let r = unsafe { create_ep(res, pd, attr) }.map(|p| {
            // SAFETY: `id` is writable (the contract).
            unsafe { *id = p }
        });
        ret("rdma_create_ep", r)
    })
}

/// A synchronous id for `res`: bound (passive, keeping the QP attributes
/// for its requests) or resolved with its QP (active).
///
/// # Safety
/// As [`softrdma_rdmacm_rdma_create_ep`].
unsafe fn create_ep(
    res: *const rdma_addrinfo,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> Result<*mut rdma_cm_id, c_int> {
    // SAFETY: per the contract.
    let res = unsafe { res.as_ref() }.ok_or(libc::EINVAL)?;
    let ps = match res.ai_port_space {
        0 => RDMA_PS_TCP,
        p => p as c_uint,
    };
    let p = create_id(null_mut(), null_mut(), ps)?;
    // SAFETY: just made.
    let id = unsafe { &mut *p.cast::<Id>() };
    if res.ai_qp_type != 0 {
        id.c.qp_type = res.ai_qp_type as c_uint;
    }
    // SAFETY: per the contract.
    let r = unsafe { setup_ep(id, res, pd, attr) };
    if let Err(e) = r {
        // SAFETY: the id just made, used by nothing else.
        let _ = unsafe { destroy_id(p) };
        return Err(e);
    }
    Ok(p)
}

/// # Safety
/// As [`softrdma_rdmacm_rdma_create_ep`].
unsafe fn setup_ep(
    id: &mut Id,
    res: &rdma_addrinfo,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> R {
    if res.ai_flags & RAI_PASSIVE != 0 {
        // SAFETY: per the contract.
        let a = unsafe { addr::from_c(res.ai_src_addr) }.ok_or(libc::EINVAL)?;
        bind(id, a)?;
        // SAFETY: per the contract, NULL or readable.
        id.state().qp_init = unsafe { attr.as_ref() }.copied();
        id.c.pd = pd;
        return Ok(());
    }
    // SAFETY: per the contract.
    unsafe { resolve_addr(id, res.ai_src_addr, res.ai_dst_addr) }?;
    resolve_route(id)?;
    // SAFETY: per the contract, NULL or readable and writable.
    if let Some(attr) = unsafe { attr.as_mut() } {
        // SAFETY: pd NULL or live.
        unsafe { super::qp::create_qp(id, pd, attr) }?;
    }
    Ok(())
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: a live id or NULL.
        if let Ok(i) = unsafe { id_mut(id) } {
            super::qp::destroy_qp(i);
            super::qp::destroy_srq(i);
            // SAFETY: as above.
            let _ = unsafe { destroy_id(id) };
        }
    })
}
