//! The same-host direct path: the rules a driver must follow to execute an
//! RDMA WRITE, READ or atomic itself, by copying straight into a same-host
//! peer's memory, and the completion it then delivers through the engine.
//!
//! The driver copies bytes or issues the CPU atomic; everything else is
//! decided here, with the functions of [`crate::rules`] the engine's own
//! paths use:
//!
//! 1. [`Engine::plan_direct`] (or [`Engine::plan_direct_into`], which fills
//!    a plan in place): the initiator's side — the QP, the WR as `post_send`
//!    would take it, the local SGEs — and where the local bytes are
//!    ([`DirectPlan::pieces`]);
//! 2. [`Engine::check_direct_target`]: the target's side, against what the
//!    peer published ([`PeerView`]): its QP and the region by rkey; gives the
//!    offset of the remote range in the region;
//! 3. the driver's copy or atomic;
//! 4. [`Engine::complete_direct`]: the completion, as the engine would make it.
//!
//! Anything refused ([`NotDirect`]) goes to the engine instead, which then
//! produces exactly what the wire path produces — including every error
//! completion and post error.

use crate::handle::{Lkey, PdHandle, Qpn, Rkey};
use std::net::SocketAddr;

use crate::qp_attr::{AccessFlags, QpState, QpType};
use crate::resources::Mr;
use crate::rules::{self, PostSendError, RegionView, RemoteDenied};
use crate::wr::{SendFlags, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion};

use super::Engine;

/// Most SGEs a direct operation takes (longer lists go to the engine).
pub const MAX_DIRECT_SGE: usize = 8;

/// What the target side published, as the driver found it. A trait so that
/// tests and a fuzz target can give crafted values; every value is untrusted.
pub trait PeerView {
    /// The target QP `qpn`, if published.
    fn qp(&mut self, qpn: Qpn) -> Option<PeerQp>;
    /// The valid region with remote key `rkey`, if any. An implementation
    /// may keep the region entered (a reader count) until it is dropped,
    /// so that the copy after the check reaches the region it checked.
    fn region(&mut self, rkey: Rkey) -> Option<PeerRegion>;
}

/// A target QP as published: protection domain, access flags, state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerQp {
    pub pd: PdHandle,
    pub access: AccessFlags,
    pub state: QpState,
}

/// A target region as published: protection domain, access flags,
/// virtual address and length (the rules' [`RegionView`]).
pub type PeerRegion = RegionView;

/// The operation of a direct WR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectOp {
    Write,
    Read,
    CompareSwap { compare: u64, swap: u64 },
    FetchAdd { add: u64 },
}

impl DirectOp {
    /// Atomics.
    pub const fn is_atomic(self) -> bool {
        matches!(
            self,
            DirectOp::CompareSwap { .. } | DirectOp::FetchAdd { .. }
        )
    }

    const fn wc_opcode(self) -> WcOpcode {
        match self {
            DirectOp::Write => WcOpcode::RdmaWrite,
            DirectOp::Read => WcOpcode::RdmaRead,
            DirectOp::CompareSwap { .. } => WcOpcode::CompSwap,
            DirectOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }
}

/// Why a WR is not executed directly. Every reason sends the WR to the
/// engine, which then does what it does for any WR (an error completion,
/// a post error, or the operation over the packet path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotDirect {
    /// Not an RDMA WRITE, READ or atomic, or with immediate data, or inline.
    NotOneSided,
    /// More than [`MAX_DIRECT_SGE`] SGEs.
    TooManySges,
    /// No such QP.
    NoQp,
    /// `post_send` refuses the WR ([`rules::check_post_send`]; UC READ and
    /// atomics, and every UD WR of these operations, are
    /// `Post(PostSendError::OpNotSupported)`).
    Post(PostSendError),
    /// The requester may not start a WQE now ([`rules::requester_may_start`]:
    /// not RTS).
    State,
    /// Send WQEs are outstanding: executing this one now could overtake them.
    SendQueueBusy,
    /// The message is longer than [`rules::MAX_MSG_SIZE`] (LOC_LEN_ERR).
    TooLong,
    /// The QP has no destination.
    NoDest,
    /// An XRC QP ([`rules::direct_path_allowed`]): which PD the target
    /// checks depends on the XRC SRQ each request names, which a grant does
    /// not carry; its WRs go as packets.
    Xrc,
    /// SGE `index` fails [`rules::check_local_sge`]; the engine completes
    /// the WR with `status`.
    LocalSge { index: u8, status: WcStatus },
    /// The region of SGE `index` offers no process address
    /// ([`crate::RegionMemory::tx_addr`]).
    NoAddress { index: u8 },
    /// The atomic's local word is not 8-aligned in process memory.
    AtomicLocalAlign,
    /// The target QP is not published.
    NoPeerQp,
    /// The target QP does not receive ([`rules::responder_receives`]).
    PeerState,
    /// The atomic's target address is not 8-aligned
    /// ([`rules::atomic_va_aligned`]; REM_INV_REQ_ERR on the packet path).
    AtomicRemoteAlign,
    /// The target refuses the access ([`rules::check_remote`];
    /// REM_ACCESS_ERR on the packet path for RC).
    Target(RemoteDenied),
    /// The plan given to [`Engine::check_direct_target`] was never filled
    /// in by a successful [`Engine::plan_direct_into`].
    NotPlanned,
}

/// A WR that [`Engine::plan_direct`] found executable directly, and on what.
/// Only the engine fills one in: [`DirectPlan::new`] is an empty plan for
/// [`Engine::plan_direct_into`], which nothing accepts until it is planned.
#[derive(Debug, Clone, Copy)]
pub struct DirectPlan {
    /// Filled in by a successful `plan_direct_into`.
    planned: bool,
    qpn: Qpn,
    wr_id: u64,
    flags: SendFlags,
    op: DirectOp,
    access: AccessFlags,
    remote_addr: u64,
    rkey: Rkey,
    len: u64,
    dest_qpn: Qpn,
    dest: SocketAddr,
    qp_type: QpType,
    npieces: u8,
    pieces: [(usize, usize); MAX_DIRECT_SGE],
    /// The QP's protection domain, and the one local region of a
    /// one-SGE plan (lkey, view, process address of its first byte), for
    /// [`Engine::replan_direct`].
    qp_pd: PdHandle,
    local: Option<(Lkey, RegionView, usize)>,
}

impl Default for DirectPlan {
    fn default() -> Self {
        Self::new()
    }
}

impl DirectPlan {
    /// An empty plan, to be filled by [`Engine::plan_direct_into`].
    pub const fn new() -> Self {
        DirectPlan {
            planned: false,
            qpn: Qpn::from_raw(0),
            wr_id: 0,
            flags: SendFlags(0),
            op: DirectOp::Write,
            access: AccessFlags::empty(),
            remote_addr: 0,
            rkey: Rkey::from_raw(0),
            len: 0,
            dest_qpn: Qpn::from_raw(0),
            dest: SocketAddr::V4(std::net::SocketAddrV4::new(
                std::net::Ipv4Addr::UNSPECIFIED,
                0,
            )),
            qp_type: QpType::Rc,
            npieces: 0,
            pieces: [(0, 0); MAX_DIRECT_SGE],
            qp_pd: PdHandle::from_raw(0),
            local: None,
        }
    }

    /// True once [`Engine::plan_direct_into`] (or `plan_direct`) filled it in.
    pub fn is_planned(&self) -> bool {
        self.planned
    }

    /// The QP posting the WR.
    pub fn qpn(&self) -> Qpn {
        self.qpn
    }
    /// The WR's id.
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }
    /// The WR's flags.
    pub fn flags(&self) -> SendFlags {
        self.flags
    }
    /// The operation.
    pub fn op(&self) -> DirectOp {
        self.op
    }
    /// The right the target must grant ([`rules::remote_access`]).
    pub fn access(&self) -> AccessFlags {
        self.access
    }
    /// The target virtual address.
    pub fn remote_addr(&self) -> u64 {
        self.remote_addr
    }
    /// The target region's remote key.
    pub fn rkey(&self) -> Rkey {
        self.rkey
    }
    /// The message length (8 for atomics).
    pub fn len(&self) -> u64 {
        self.len
    }
    /// True for a zero-length WRITE or READ.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The target QP (the QP's destination QPN).
    pub fn dest_qpn(&self) -> Qpn {
        self.dest_qpn
    }
    /// The QP's destination.
    pub fn dest(&self) -> SocketAddr {
        self.dest
    }
    /// RC or UC.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }
    /// The local bytes, in SGE order: (process address, length), from the
    /// regions' [`crate::RegionMemory::tx_addr`]. Inside the regions, which
    /// stay registered as long as the driver keeps them from being
    /// deregistered (it holds the device lock from plan to completion).
    pub fn pieces(&self) -> &[(usize, usize)] {
        &self.pieces[..usize::from(self.npieces)]
    }
}

impl Engine {
    /// Initiator side: whether WR `wr` on QP `qpn` can be executed directly
    /// now, and on what. It can when `post_send` would take it
    /// ([`rules::check_post_send`]), it is an RDMA WRITE, READ or atomic
    /// without immediate data, not inline, with at most [`MAX_DIRECT_SGE`]
    /// SGEs, on an RC or UC QP that may start it now
    /// ([`rules::requester_may_start`]: RTS) with no send WQE outstanding (so
    /// send-queue order is kept), its length allowed
    /// ([`rules::message_len_ok`]), every SGE valid
    /// ([`rules::check_local_sge`] with [`rules::local_access`]) in a region
    /// offering its address, and for an atomic a local word 8-aligned in
    /// process memory. A bad SGE is `NotDirect`: posted, the engine
    /// completes the WR with the error itself.
    ///
    /// One hash lookup for the QP and one per distinct lkey; no allocation.
    /// On the hot path, [`Self::plan_direct_into`] saves moving the plan.
    pub fn plan_direct(&self, qpn: Qpn, wr: &SendWr) -> Result<DirectPlan, NotDirect> {
        let mut plan = DirectPlan::new();
        self.plan_direct_into(qpn, wr, &mut plan)?;
        Ok(plan)
    }

    /// [`Self::plan_direct`], writing the plan into `plan` instead of
    /// returning it: a plan is about 240 bytes, and moving one that was
    /// just written costs the direct path a store-forwarding stall or a
    /// `memcpy` (a few ns of a 0.25 µs WRITE). On `Err`, `plan` is left
    /// unplanned: [`Self::check_direct_target`] refuses it and
    /// [`Self::complete_direct`] ignores it.
    #[inline(always)]
    pub fn plan_direct_into(
        &self,
        qpn: Qpn,
        wr: &SendWr,
        plan: &mut DirectPlan,
    ) -> Result<(), NotDirect> {
        plan.planned = false;
        plan.qpn = qpn;
        plan.wr_id = wr.wr_id;
        plan.flags = wr.flags;
        self.fill_plan(wr, plan)?;
        plan.planned = true;
        Ok(())
    }

    /// [`Self::plan_direct_into`]'s checks, filling `plan` (which holds the
    /// QPN and the WR's id and flags).
    #[inline(always)]
    fn fill_plan(&self, wr: &SendWr, plan: &mut DirectPlan) -> Result<(), NotDirect> {
        (plan.op, plan.remote_addr, plan.rkey) = direct_op(&wr.op).ok_or(NotDirect::NotOneSided)?;
        if wr.flags.contains(SendFlags::INLINE) {
            return Err(NotDirect::NotOneSided);
        }
        if wr.sg_list.len() > MAX_DIRECT_SGE {
            return Err(NotDirect::TooManySges);
        }
        let q = self.qps.get(&plan.qpn).ok_or(NotDirect::NoQp)?;
        if !rules::direct_path_allowed(q.qp_type) {
            return Err(NotDirect::Xrc);
        }
        let len = rules::check_post_send(q.qp_type, q.state, &q.cap, q.req.sq.len(), wr)
            .map_err(NotDirect::Post)?;
        // UD has none of these operations: check_post_send refused it.
        debug_assert!(q.qp_type != QpType::Ud);
        if !rules::requester_may_start(q.state) {
            return Err(NotDirect::State);
        }
        if !q.req.sq.is_empty() {
            return Err(NotDirect::SendQueueBusy);
        }
        if !rules::message_len_ok(len) {
            return Err(NotDirect::TooLong);
        }
        plan.dest = q.dest.ok_or(NotDirect::NoDest)?;
        plan.access = rules::remote_access(&wr.op);
        plan.len = len;
        plan.dest_qpn = q.attr.dest_qp_num;
        plan.qp_type = q.qp_type;
        let need = rules::local_access(&wr.op);
        // The regions found so far, by SGE: one lookup per distinct lkey.
        let mut found: [Option<&Mr>; MAX_DIRECT_SGE] = [None; MAX_DIRECT_SGE];
        for (i, (slot, sge)) in plan.pieces.iter_mut().zip(&wr.sg_list).enumerate() {
            let index = i as u8;
            let seen = wr.sg_list[..i].iter().position(|s| s.lkey == sge.lkey);
            let mr = match seen {
                Some(j) => found[j],
                None => self.res.mrs.get(&sge.lkey),
            };
            let off = rules::check_local_sge(mr.map(Mr::view).as_ref(), q.pd, sge, need)
                .map_err(|status| NotDirect::LocalSge { index, status })?;
            let Some(mr) = mr else {
                return Err(NotDirect::LocalSge {
                    index,
                    status: WcStatus::LocProtErr,
                });
            };
            found[i] = Some(mr);
            let addr = mr
                .mem
                .tx_addr(off as usize)
                .ok_or(NotDirect::NoAddress { index })?;
            *slot = (addr, sge.length as usize);
        }
        plan.npieces = wr.sg_list.len() as u8;
        if plan.op.is_atomic() && !plan.pieces[0].0.is_multiple_of(rules::ATOMIC_LEN as usize) {
            return Err(NotDirect::AtomicLocalAlign);
        }
        plan.qp_pd = q.pd;
        plan.local = match (wr.sg_list.first(), found[0]) {
            (Some(sge), Some(mr)) if wr.sg_list.len() == 1 => {
                mr.mem.tx_addr(0).map(|base| (sge.lkey, mr.view(), base))
            }
            _ => None,
        };
        Ok(())
    }

    /// Plans `wr` on QP `qpn` again, reusing what the previous plan in
    /// `plan` found about the QP and its one local region instead of
    /// looking them up — for a driver that knows nothing that could change
    /// them happened since (the softrdma driver's route epoch, which every
    /// call that could change a QP, a region or the send queue advances).
    /// Every rule of the WR itself is applied again: the operation and its
    /// right, the post rules of a one-SGE WR, the length, the local SGE
    /// against the region (`check_local_sge`), atomics' alignment. A WR of
    /// another shape (more SGEs, another lkey or QP, another kind of
    /// operation, inline) is planned in full.
    pub fn replan_direct(
        &self,
        qpn: Qpn,
        wr: &SendWr,
        plan: &mut DirectPlan,
    ) -> Result<(), NotDirect> {
        let same = plan.planned
            && plan.qpn == qpn
            && wr.sg_list.len() == 1
            && !wr.flags.contains(SendFlags::INLINE)
            && rules::remote_access(&wr.op) == plan.access;
        let Some((_, view, base)) = plan
            .local
            .filter(|(k, ..)| same && wr.sg_list[0].lkey == *k)
        else {
            return self.plan_direct_into(qpn, wr, plan);
        };
        plan.planned = false;
        (plan.op, plan.remote_addr, plan.rkey) = direct_op(&wr.op).ok_or(NotDirect::NotOneSided)?;
        let sge = &wr.sg_list[0];
        let len = u64::from(sge.length);
        if plan.op.is_atomic() && !rules::atomic_sges_ok(1, len) {
            return Err(NotDirect::Post(PostSendError::AtomicSges));
        }
        if !rules::message_len_ok(len) {
            return Err(NotDirect::TooLong);
        }
        let need = rules::local_access(&wr.op);
        let off = rules::check_local_sge(Some(&view), plan.qp_pd, sge, need)
            .map_err(|status| NotDirect::LocalSge { index: 0, status })?;
        // The region is one contiguous mapping (`RegionMemory::tx_addr`).
        let addr = base
            .checked_add(off as usize)
            .ok_or(NotDirect::NoAddress { index: 0 })?;
        if plan.op.is_atomic() && !addr.is_multiple_of(rules::ATOMIC_LEN as usize) {
            return Err(NotDirect::AtomicLocalAlign);
        }
        plan.wr_id = wr.wr_id;
        plan.flags = wr.flags;
        plan.len = len;
        plan.pieces[0] = (addr, sge.length as usize);
        plan.npieces = 1;
        plan.planned = true;
        Ok(())
    }

    /// Target side rules against the peer's published view: the target QP
    /// (the QP's dest_qpn) receives ([`rules::responder_receives`]), an
    /// atomic's address is 8-aligned ([`rules::atomic_va_aligned`]), and the
    /// access passes [`rules::check_remote`] — the target QP's rights, then
    /// (unless zero-length) the region by rkey: found, the target QP's PD,
    /// the right, the range inside (overflow-safe). Returns the byte offset
    /// of the remote range in the region (0 for a zero-length access, for
    /// which `peer.region` is not asked).
    #[inline]
    pub fn check_direct_target(
        &self,
        plan: &DirectPlan,
        peer: &mut dyn PeerView,
    ) -> Result<u64, NotDirect> {
        if !plan.planned {
            return Err(NotDirect::NotPlanned);
        }
        let tq = peer.qp(plan.dest_qpn).ok_or(NotDirect::NoPeerQp)?;
        if !rules::responder_receives(tq.state) {
            return Err(NotDirect::PeerState);
        }
        if plan.op.is_atomic() && !rules::atomic_va_aligned(plan.remote_addr) {
            return Err(NotDirect::AtomicRemoteAlign);
        }
        let rkey = plan.rkey;
        rules::check_remote(
            tq.access,
            tq.pd,
            plan.access,
            plan.remote_addr,
            plan.len,
            || peer.region(rkey),
        )
        .map_err(NotDirect::Target)
    }

    /// Completes a directly executed WR exactly as the engine would have
    /// completed it over the packet path: a completion with the WR's opcode
    /// and `byte_len` ([`rules::send_byte_len`]: 8 for atomics) on the send
    /// CQ when the WR is signaled ([`rules::wr_signaled`],
    /// [`rules::send_completes`]), with the CQ's events and overrun rules;
    /// the QP's `tx_bytes` counts the message. Call it with the plan
    /// `plan_direct` (or `plan_direct_into`) just made, with nothing else
    /// done on the engine since; an unplanned plan is ignored.
    #[inline]
    pub fn complete_direct(&mut self, plan: &DirectPlan) {
        if !plan.planned {
            return;
        }
        let Some(q) = self.qps.get_mut(&plan.qpn) else {
            return;
        };
        debug_assert!(rules::requester_may_start(q.state) && q.req.sq.is_empty());
        let status = WcStatus::Success;
        let mut wc = WorkCompletion::new(plan.wr_id, status, plan.op.wc_opcode(), plan.qpn);
        wc.byte_len = rules::send_byte_len(plan.op.is_atomic(), plan.len);
        q.counters.tx_bytes += u64::from(wc.byte_len);
        if rules::send_completes(rules::wr_signaled(q.sq_sig_all, plan.flags), status) {
            let cq = q.send_cq;
            self.res.complete(cq, wc);
        }
    }
}

/// The one-sided operation of `op` with its remote address and rkey.
fn direct_op(op: &SendOp) -> Option<(DirectOp, u64, Rkey)> {
    Some(match *op {
        SendOp::Write { remote_addr, rkey } => (DirectOp::Write, remote_addr, rkey),
        SendOp::Read { remote_addr, rkey } => (DirectOp::Read, remote_addr, rkey),
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => (DirectOp::CompareSwap { compare, swap }, remote_addr, rkey),
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => (DirectOp::FetchAdd { add }, remote_addr, rkey),
        _ => return None,
    })
}
