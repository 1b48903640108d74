//! rdma_cm, in rdma-core librdmacm's model, inside this library: the
//! drop-in `librdmacm.so.1` (crate softrdma-rdmacm) forwards its `rdma_*`
//! entry points to the `softrdma_rdmacm_rdma_*` functions exported here,
//! so that the devices, PDs, CQs and QPs of the CM are the very objects
//! the program's verbs see (one copy of softrdma per process; see
//! docs/rdmacm.md).
//!
//! Shape: an [`Id`] (`rdma_cm_id`) and a [`Channel`]
//! (`rdma_event_channel`) are objects like the verbs' (the C struct
//! first). The devices' connection managers (`softrdma::rdma_cm::Cm`) raise
//! events per device; one thread per device (the pump) takes them and
//! routes each to the id it concerns ([`Registry`]: connections and
//! listeners by device), as `rdma_cm_event`s queued on that id's channel,
//! whose fd (an eventfd in semaphore mode) is readable exactly while
//! events wait. A synchronous id (made without a channel, as
//! `rdma_create_ep` makes them) gets a private channel, and its calls wait
//! for their own event (`complete`), as librdmacm's `ucma_complete`.
//!
//! Modules: `abi` (the rdma_cma.h structs, layout asserts), `events`
//! (channels and events), `exports` (the C entry points), `addr`
//! (sockaddr conversions, rdma_getaddrinfo), `rsocket` (rsockets: stream
//! sockets over RC QPs, rdma-core's protocol).

pub mod abi;
mod addr;
pub mod ece;
mod events;
pub mod exports;
mod mcast;
pub mod options;
mod qp;
pub mod rsocket;

use std::collections::HashMap;
use std::ffi::c_int;
use std::net::{IpAddr, SocketAddr};
use std::ptr::null_mut;
use std::sync::{Mutex, MutexGuard, OnceLock};

use softrdma::per_process::{lock_here, PerProcess};
use std::time::Duration;

use softrdma::rdma_cm::{CmEvent, ConnId, ConnParam, PortSpace};

use self::abi::*;
use self::events::{EventData, Param};
use crate::abi::*;
use crate::objects::{self, Ctx};

/// An `rdma_cm_id`: the C struct the application reads, then ours.
#[repr(C)]
pub struct Id {
    pub c: rdma_cm_id,
    pub st: Mutex<IdState>,
}

/// What librdmacm keeps in its `cma_id_private`.
#[derive(Default)]
pub struct IdState {
    /// The channel is the id's own (made for a synchronous id).
    pub sync: bool,
    /// The connection, once connecting or requested.
    pub conn: Option<ConnId>,
    /// The port it listens on.
    pub listening: Option<u16>,
    /// The port `rdma_bind_addr` reserved, and on which devices: their CMs
    /// hold a REQ for it until it is listened on (`CmAgent::reserve`).
    pub reserved: Option<(u16, Vec<usize>)>,
    /// `rdma_create_ep`'s QP attributes for the requests of a listener.
    pub qp_init: Option<ibv_qp_init_attr>,
    /// The QP's CQs and their channels were made by `rdma_create_qp`.
    pub own_cqs: (bool, bool),
    /// A request's READ/atomic depths, as the event gave them (the
    /// defaults of `rdma_accept` without parameters).
    pub req_depths: Option<(u8, u8)>,
    /// What `rdma_set_option` set.
    pub options: options::CmOptions,
    /// The multicast groups joined (`rdma_join_multicast`).
    pub mcast: Vec<mcast::Joined>,
    /// What `rdma_set_local_ece` set (an id without a QP offers it).
    pub local_ece: softrdma::Ece,
}

impl Id {
    /// The id behind an application's pointer (NULL → None).
    ///
    /// # Safety
    /// `p` is NULL or an id of this module not destroyed yet.
    pub unsafe fn from_ptr<'a>(p: *mut rdma_cm_id) -> Option<&'a mut Id> {
        // SAFETY: per the contract; Id is repr(C) with the C struct first.
        unsafe { p.cast::<Id>().as_mut() }
    }

    /// The id behind an application's pointer, if it is one this module
    /// made and has not destroyed: a program that passes an id after
    /// destroying it (perftest's rdma_cm retry does) gets EINVAL, not a
    /// read of freed memory.
    pub fn live<'a>(p: *mut rdma_cm_id) -> Option<&'a mut Id> {
        if !live_ids().contains(&(p as usize)) {
            return None;
        }
        // SAFETY: in the live set: made by `new_id`, not yet freed
        // (`destroy_id` takes it out first).
        unsafe { Id::from_ptr(p) }
    }

    pub fn state(&self) -> MutexGuard<'_, IdState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The device the id is bound to.
    pub fn ctx(&self) -> Option<&'static Ctx> {
        if self.c.verbs.is_null() {
            return None;
        }
        // SAFETY: `verbs` is only ever set to a context of `contexts()`,
        // which stay open for the rest of the process.
        Some(unsafe { Ctx::from_ptr(self.c.verbs) })
    }

    pub fn as_ptr(&mut self) -> *mut rdma_cm_id {
        &mut self.c
    }
}

/// The addresses of the ids that exist (made by [`new_id`], not yet
/// freed).
pub fn live_ids() -> MutexGuard<'static, PerProcess<std::collections::HashSet<usize>>> {
    static LIVE: OnceLock<Mutex<PerProcess<std::collections::HashSet<usize>>>> = OnceLock::new();
    lock_here(LIVE.get_or_init(Default::default))
}

/// Connections and listeners by device (the address of its `Ctx`), so
/// that the pump finds the id an event is for.
#[derive(Default)]
pub struct Registry {
    pub conns: HashMap<(usize, u32), usize>,
    pub listeners: HashMap<(usize, u16), usize>,
}

pub fn registry() -> MutexGuard<'static, PerProcess<Registry>> {
    static R: OnceLock<Mutex<PerProcess<Registry>>> = OnceLock::new();
    lock_here(R.get_or_init(Default::default))
}

/// Every device (the addresses of their `Ctx`), opened once per process
/// (as librdmacm opens them all at its first call) and never closed; each
/// with its pump thread. A child made by fork(2) opens its own: the
/// parent's have no pump or progress thread in the child, and their locks
/// may be held by threads that did not come along.
pub fn contexts() -> &'static [usize] {
    static CTXS: Mutex<PerProcess<Option<&'static [usize]>>> = Mutex::new(PerProcess::new(None));
    let mut g = lock_here(&CTXS);
    if let Some(v) = **g {
        return v;
    }
    let first = !EXIT_HANDLER.swap(true, std::sync::atomic::Ordering::Relaxed);
    let v: &'static [usize] = Box::leak(open_contexts(first).into_boxed_slice());
    **g = Some(v);
    v
}

/// Whether the exit handler is registered (a forked child inherits it).
static EXIT_HANDLER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Opens every device and starts its pump; registers the exit handler
/// when `first`.
fn open_contexts(first: bool) -> Vec<usize> {
    let mut n: c_int = 0;
    // SAFETY: this library's own device list; `n` is a live int.
    let list = unsafe { crate::device::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let mut v = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: i < n entries of the list; each is a device of ours.
        let ctx = unsafe { crate::device::ibv_open_device(*list.add(i)) };
        if ctx.is_null() {
            continue;
        }
        // SAFETY: just opened; contexts of this list are never closed.
        let c: &'static Ctx = unsafe { Ctx::from_ptr(ctx) };
        v.push(c as *const Ctx as usize);
        start_pump(c);
    }
    // SAFETY: the list came from ibv_get_device_list.
    unsafe { crate::device::ibv_free_device_list(list) };
    // SAFETY: registers a function of this library, which stays
    // loaded for the process's life (it is never dlclose'd while
    // devices are open).
    if first && unsafe { libc::atexit(disconnect_at_exit) } != 0 {
        eprintln!("softrdma: rdma_cm: cannot register the exit handler");
    }
    v
}

/// At `exit`, every connection still up is ended as the kernel ends those
/// of a process that exits: its id destroyed, so the peer gets a DREQ
/// (or a REJ for one still connecting) and sees DISCONNECTED instead of
/// waiting out its retries (qperf's server exits with its connection up).
/// `_exit` and fatal signals run no handler: the peer then times out.
extern "C" fn disconnect_at_exit() {
    crate::ffi::guard((), || {
        let ids: Vec<usize> = live_ids().iter().copied().collect();
        for key in ids {
            // SAFETY: in the live set: an id not freed (the application's
            // other threads may still run, but exit is under way).
            let id = unsafe { &*(key as *const Id) };
            let conn = id.state().conn.take();
            if let (Some(conn), Some(ctx)) = (conn, id.ctx()) {
                let _ = ctx.dev.cm().destroy(conn);
            }
        }
    })
}

/// A context of [`contexts`] from its address (the registry's key).
pub fn ctx_at(a: usize) -> &'static Ctx {
    // SAFETY: addresses of `contexts()`' Ctxs, open for the rest of the
    // process.
    unsafe { &*(a as *const Ctx) }
}

/// Puts `id` on device `ctx`: its `verbs`, and its `pd` the device's
/// default PD, as librdmacm sets both once an id has a device (UCX's
/// rdmacm transport creates its QPs in `id->pd`). NULL when that PD
/// cannot be made; `rdma_create_qp` then reports why.
pub fn set_device(id: &mut Id, ctx: &'static Ctx) {
    id.c.verbs = ctx.as_ibv();
    id.c.pd = qp::default_pd(ctx).unwrap_or(std::ptr::null_mut());
}

/// The device for a local address: the one with that IP; the first (the
/// default device) for a wildcard, or for a loopback address no device
/// has, as the kernel's rdma_cm binds a loopback address to the first
/// device (libfabric's verbs provider binds "localhost" so).
pub fn ctx_for(ip: Option<IpAddr>) -> Option<&'static Ctx> {
    let all = contexts();
    let first = all.first().map(|&a| ctx_at(a));
    match ip {
        None => first,
        Some(ip) if ip.is_unspecified() => first,
        Some(ip) => all
            .iter()
            .map(|&a| ctx_at(a))
            .find(|c| c.dev.addr().ip() == ip)
            .or_else(|| if ip.is_loopback() { first } else { None }),
    }
}

/// The port space of `ps`, for the CM's service IDs.
pub fn port_space(ps: u32) -> Option<PortSpace> {
    match ps {
        RDMA_PS_TCP => Some(PortSpace::Tcp),
        RDMA_PS_UDP => Some(PortSpace::Udp),
        RDMA_PS_IB => Some(PortSpace::Ib),
        _ => None,
    }
}

/// The pump: waits for the device's CM events and routes each one.
fn start_pump(ctx: &'static Ctx) {
    let cm = ctx.dev.cm();
    // The context goes by address: it is never closed.
    let key = ctx as *const Ctx as usize;
    let spawned = std::thread::Builder::new()
        .name("softrdma-rdmacm".into())
        .spawn(move || loop {
            // The fd is signalled when events wait; the timeout only
            // bounds a missed wake-up.
            if crate::ffi::wait_readable(cm.fd(), 200) {
                crate::ffi::drain_eventfd(cm.fd());
            }
            while let Ok(Some(ev)) = cm.get_event(Duration::ZERO) {
                route(ctx_at(key), ev);
            }
        });
    if let Err(e) = spawned {
        eprintln!("softrdma: rdma_cm: cannot start the event thread: {e}");
    }
}

/// Queues a device event for the id it concerns.
fn route(ctx: &'static Ctx, ev: CmEvent<SocketAddr>) {
    if let CmEvent::ConnectRequest { conn, req, .. } = ev {
        let r = Request {
            port: (req.service_id & 0xFFFF) as u16,
            private_data: req.private_data.to_vec(),
            initiator_depth: req.initiator_depth,
            responder_resources: req.responder_resources,
            flow_control: req.end_to_end_flow_control,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            qpn: req.local_qpn,
        };
        return request(ctx, conn, &r);
    }
    let ev = match ev {
        CmEvent::SidrRequest {
            conn,
            service_id,
            private_data,
            ..
        } => return ud_request(ctx, conn, (service_id & 0xFFFF) as u16, &private_data),
        CmEvent::SidrResolved {
            conn,
            status,
            qpn,
            qkey,
            private_data,
        } => return ud_resolved(ctx, conn, status, (qpn, qkey), private_data),
        other => other,
    };
    let Some((conn, kind, status, mut private_data)) = conn_event(ev) else {
        return;
    };
    if kind == RDMA_CM_EVENT_ESTABLISHED {
        // The active side's ESTABLISHED carries the REP's private data.
        if let Some(d) = ctx.dev.cm().take_rep_private_data(conn) {
            private_data = d;
        }
    }
    let reg = registry();
    let Some(&id) = reg.conns.get(&(ctx as *const Ctx as usize, conn.0)) else {
        return;
    };
    // SAFETY: registered ids are live (destroy unregisters first, under
    // this lock, which is held until the event is queued).
    let id = unsafe { &mut *(id as *mut Id) };
    let ev = EventData {
        kind,
        status,
        listen_id: null_mut(),
        private_data,
        param: Param::None,
    };
    events::push(id.c.channel, id.as_ptr(), ev);
    drop(reg);
}

/// A connection's event as rdma_cm reports it: (connection, type,
/// status, private data). REJECTED's status is the IB reject reason,
/// UNREACHABLE's -ETIMEDOUT, as the kernel's.
fn conn_event(ev: CmEvent<SocketAddr>) -> Option<(ConnId, u32, c_int, Vec<u8>)> {
    Some(match ev {
        CmEvent::Established { conn } => (conn, RDMA_CM_EVENT_ESTABLISHED, 0, Vec::new()),
        // Only an id without a QP sees the REP (one with a QP is moved
        // to RTS and established by the device).
        CmEvent::ConnectResponse { conn, rep } => (
            conn,
            RDMA_CM_EVENT_CONNECT_RESPONSE,
            0,
            rep.private_data.to_vec(),
        ),
        CmEvent::Rejected {
            conn,
            reason,
            private_data,
        } => (
            conn,
            RDMA_CM_EVENT_REJECTED,
            c_int::from(reason.code()),
            private_data,
        ),
        CmEvent::Unreachable { conn } => (
            conn,
            RDMA_CM_EVENT_UNREACHABLE,
            -libc::ETIMEDOUT,
            Vec::new(),
        ),
        CmEvent::Disconnected { conn, private_data } => {
            (conn, RDMA_CM_EVENT_DISCONNECTED, 0, private_data)
        }
        CmEvent::TimewaitExit { conn } => (conn, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0, Vec::new()),
        _ => return None,
    })
}

/// What a connection request's event needs of the REQ.
struct Request {
    port: u16,
    private_data: Vec<u8>,
    initiator_depth: u8,
    responder_resources: u8,
    flow_control: bool,
    retry_count: u8,
    rnr_retry_count: u8,
    qpn: u32,
}

/// A connection request for `listener`: a new id on the listener's
/// channel (a synchronous listener's requests are taken by
/// `rdma_get_request`) and its CONNECT_REQUEST event.
fn request(ctx: &'static Ctx, conn: ConnId, req: &Request) {
    let key = ctx as *const Ctx as usize;
    let mut reg = registry();
    let Some(&listener) = reg.listeners.get(&(key, req.port)) else {
        // The listener went away after the CM took the REQ.
        drop(reg);
        let _ = ctx.dev.cm().reject(conn, &[]);
        return;
    };
    // SAFETY: a registered listener is live (see `route`).
    let l = unsafe { &mut *(listener as *mut Id) };
    if l.c.qp_type == IBV_QPT_UD {
        // A REQ for a UD listener's service: refused, as the kernel's
        // rdma_cm refuses a request of the wrong QP type.
        drop(reg);
        let _ = ctx.dev.cm().reject(conn, &[]);
        return;
    }
    let (src, user) = match softrdma::rdma_cm::parse_req_private_data(&req.private_data) {
        Ok((h, user)) => (Some(SocketAddr::new(h.src, h.src_port)), user.to_vec()),
        Err(_) => (None, Vec::new()),
    };
    let local = SocketAddr::new(ctx.dev.addr().ip(), req.port);
    let id = new_id(l.c.channel, l.c.context, l.c.ps, l.c.qp_type);
    // SAFETY: just made.
    let idr = unsafe { &mut *id };
    set_device(idr, ctx);
    addr::set_route(&mut idr.c.route, Some(local), src);
    // The event's depths are the receiver's: what the requester keeps
    // outstanding is what we must accept, and the other way round.
    let depths = (req.initiator_depth, req.responder_resources);
    {
        let mut st = idr.state();
        st.conn = Some(conn);
        st.req_depths = Some(depths);
    }
    reg.conns.insert((key, conn.0), id as usize);
    let p = rdma_conn_param {
        private_data: std::ptr::null(),
        private_data_len: 0,
        responder_resources: depths.0,
        initiator_depth: depths.1,
        flow_control: u8::from(req.flow_control),
        retry_count: req.retry_count,
        rnr_retry_count: req.rnr_retry_count,
        srq: 0,
        qp_num: req.qpn,
    };
    let ev = EventData {
        kind: RDMA_CM_EVENT_CONNECT_REQUEST,
        status: 0,
        listen_id: l.as_ptr(),
        private_data: user,
        param: Param::Conn(p),
    };
    events::push(l.c.channel, idr.as_ptr(), ev);
    drop(reg);
}

/// A SIDR request for a UD listener: a new UD id and its CONNECT_REQUEST
/// (`param.ud` with the consumer's private data, after the CMA header).
fn ud_request(ctx: &'static Ctx, conn: ConnId, port: u16, private_data: &[u8]) {
    let key = ctx as *const Ctx as usize;
    let mut reg = registry();
    let Some(&listener) = reg.listeners.get(&(key, port)) else {
        drop(reg);
        let _ = ctx.dev.cm().reject(conn, &[]);
        return;
    };
    // SAFETY: a registered listener is live (see `route`).
    let l = unsafe { &mut *(listener as *mut Id) };
    if l.c.qp_type != IBV_QPT_UD {
        // A SIDR_REQ for a connected listener's service: refused.
        drop(reg);
        let _ = ctx.dev.cm().reject(conn, &[]);
        return;
    }
    let (src, user) = match softrdma::rdma_cm::parse_req_private_data(private_data) {
        Ok((h, user)) => (Some(SocketAddr::new(h.src, h.src_port)), user.to_vec()),
        Err(_) => (None, Vec::new()),
    };
    let id = new_id(l.c.channel, l.c.context, l.c.ps, l.c.qp_type);
    // SAFETY: just made.
    let idr = unsafe { &mut *id };
    set_device(idr, ctx);
    let local = SocketAddr::new(ctx.dev.addr().ip(), port);
    addr::set_route(&mut idr.c.route, Some(local), src);
    idr.state().conn = Some(conn);
    reg.conns.insert((key, conn.0), id as usize);
    let ev = EventData {
        kind: RDMA_CM_EVENT_CONNECT_REQUEST,
        status: 0,
        listen_id: l.as_ptr(),
        private_data: user,
        param: Param::Ud(ud_param(None, 0, 0)),
    };
    events::push(l.c.channel, idr.as_ptr(), ev);
    drop(reg);
}

/// A SIDR_REP for a UD id: ESTABLISHED with the peer's QP, Q_Key and
/// address handle attributes (`param.ud`), or UNREACHABLE with the SIDR
/// status, as the kernel's rdma_cm reports them.
fn ud_resolved(
    ctx: &'static Ctx,
    conn: ConnId,
    status: softrdma::rdma_cm::SidrStatus,
    (qpn, qkey): (u32, u32),
    private_data: Vec<u8>,
) {
    let mut reg = registry();
    let Some(id) = reg.conns.remove(&(ctx as *const Ctx as usize, conn.0)) else {
        return;
    };
    // SAFETY: registered ids are live (see `route`).
    let id = unsafe { &mut *(id as *mut Id) };
    // The SIDR exchange is over: nothing to destroy later.
    id.state().conn = None;
    let ok = status == softrdma::rdma_cm::SidrStatus::Success;
    let dst = addr::route_addr(&id.c.route, true).map(|a| a.ip());
    let ev = EventData {
        kind: if ok {
            RDMA_CM_EVENT_ESTABLISHED
        } else {
            RDMA_CM_EVENT_UNREACHABLE
        },
        status: if ok { 0 } else { status as c_int },
        listen_id: null_mut(),
        private_data,
        param: Param::Ud(ud_param(dst.filter(|_| ok), qpn, qkey)),
    };
    events::push(id.c.channel, id.as_ptr(), ev);
    drop(reg);
}

/// `rdma_ud_param` for a peer at `dst` (an address handle to reach it:
/// RoCEv2 always carries a GRH) serving QP `qpn` with `qkey`.
fn ud_param(dst: Option<IpAddr>, qpn: u32, qkey: u32) -> rdma_ud_param {
    // SAFETY: all-zero is a valid ibv_ah_attr (integers and a GID union).
    let mut ah: ibv_ah_attr = unsafe { std::mem::zeroed() };
    if let Some(ip) = dst {
        ah.grh.dgid = addr::gid(ip);
        ah.grh.hop_limit = 64;
        ah.is_global = 1;
        ah.port_num = 1;
    }
    rdma_ud_param {
        private_data: std::ptr::null(),
        private_data_len: 0,
        ah_attr: ah,
        qp_num: qpn,
        qkey,
    }
}

/// A new id (not yet bound), leaked; freed by `free_id`.
pub fn new_id(
    channel: *mut rdma_event_channel,
    context: *mut std::ffi::c_void,
    ps: u32,
    qp_type: u32,
) -> *mut Id {
    // SAFETY: all-zero is a valid rdma_route (integers, NULL pointers and
    // sockaddr_storage bytes, family AF_UNSPEC).
    let route: rdma_route = unsafe { std::mem::zeroed() };
    let id = objects::leak(Id {
        c: rdma_cm_id {
            verbs: null_mut(),
            channel,
            context,
            qp: null_mut(),
            route,
            ps,
            port_num: 1,
            event: null_mut(),
            send_cq_channel: null_mut(),
            send_cq: null_mut(),
            recv_cq_channel: null_mut(),
            recv_cq: null_mut(),
            srq: null_mut(),
            pd: null_mut(),
            qp_type,
        },
        st: Mutex::new(IdState::default()),
    });
    // The C struct is the first field: its address is the id's.
    live_ids().insert(id as usize);
    id
}

/// `rdma_conn_param` → softrdma's, with librdmacm's defaults for NULL.
/// As librdmacm's: a READ/atomic depth of 0xFF (RDMA_MAX_RESP_RES,
/// RDMA_MAX_INIT_DEPTH; libfabric's verbs provider passes them) keeps the
/// default in `defaults` — the caller's "as many as allowed" — and a depth
/// above the device's limit (`max_qp_rd_atom`, `max_qp_init_rd_atom`) is
/// EINVAL.
///
/// # Safety
/// `p` is NULL or readable, its private data readable for its length.
pub unsafe fn conn_param(
    p: *const rdma_conn_param,
    defaults: ConnParam,
    max_resp: u8,
    max_init: u8,
) -> Result<ConnParam, c_int> {
    const MAX_DEPTH: u8 = 0xFF;
    // SAFETY: per the contract.
    let Some(p) = (unsafe { p.as_ref() }) else {
        return Ok(defaults);
    };
    let depth = |v: u8, max: u8, default: u8| match v {
        MAX_DEPTH => Ok(default.min(max)),
        v if v > max => Err(libc::EINVAL),
        v => Ok(v),
    };
    let responder_resources = depth(
        p.responder_resources,
        max_resp,
        defaults.responder_resources,
    )?;
    let initiator_depth = depth(p.initiator_depth, max_init, defaults.initiator_depth)?;
    // SAFETY: per the contract, private_data_len readable bytes or NULL.
    let data = unsafe { private_data(p.private_data, p.private_data_len) }.to_vec();
    Ok(ConnParam {
        private_data: data,
        responder_resources,
        initiator_depth,
        retry_count: p.retry_count.min(7),
        rnr_retry_count: p.rnr_retry_count.min(7),
        ..defaults
    })
}

/// Waits for a synchronous id's next event, as librdmacm's
/// `ucma_complete`: keeps it in `id->event` (acking the one before) and
/// fails with its status (ECONNREFUSED for a reject). Asynchronous ids
/// return at once.
pub fn complete(id: &mut Id) -> Result<(), c_int> {
    if !id.state().sync {
        return Ok(());
    }
    if !id.c.event.is_null() {
        events::free(id.c.event);
        id.c.event = null_mut();
    }
    let ev = events::pop(id.c.channel, true)?;
    id.c.event = ev;
    // SAFETY: a live event just taken.
    let e = unsafe { &*ev };
    match (e.event, e.status) {
        (_, 0) => Ok(()),
        (RDMA_CM_EVENT_REJECTED, _) => Err(libc::ECONNREFUSED),
        (_, s) if s < 0 => Err(-s),
        (_, s) => Err(s),
    }
}

/// A C caller's private data: `len` bytes at `data`, none when it is NULL
/// or `len` is 0.
///
/// # Safety
/// `data` is NULL or points to `len` readable bytes that outlive `'a`.
pub(super) unsafe fn private_data<'a>(data: *const std::ffi::c_void, len: u8) -> &'a [u8] {
    if data.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: per this function's contract.
    unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len.into()) }
}
