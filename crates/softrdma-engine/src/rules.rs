//! The verbs rules, in one place.
//!
//! Every check the engine makes before it touches memory or accepts work —
//! which rights an operation needs, which operations a QP type has, what a
//! QP may do in each state, whether a local SGE or a remote range is
//! allowed — is one small pure function here. The engine's own paths
//! (`post_send`, the requester's checks when a WQE starts, the responder)
//! and the same-host direct path ([`crate::Engine::plan_direct`],
//! [`crate::Engine::check_direct_target`]) call these functions and
//! nothing else, so a driver that executes an operation itself applies
//! exactly the rules the wire path applies.
//!
//! "IBTA" is the InfiniBand Architecture Specification, Volume 1, cited by
//! chapter (9: transport layer, 10: software transport verbs, 11: verbs
//! interface), and the man pages are libibverbs'; where the engine differs
//! from either, the function's comment says so. `docs/engine.md` ("Rules")
//! lists every function with its callers.

use crate::handle::{PdHandle, Qpn};
use crate::VerbsError;
use softrdma_wire::NakCode;
use softrdma_wire::OpKind;

use crate::qp_attr::{AccessFlags, QpCap, QpState, QpType};
use crate::wr::{MwBind, MwType, SendFlags, SendOp, SendWr, Sge, WcStatus};

/// Largest message a WQE may carry (2^31 bytes, as on real HCAs).
pub const MAX_MSG_SIZE: u64 = 1 << 31;

/// Bytes an atomic operates on.
pub const ATOMIC_LEN: u64 = 8;

/// A memory region as the rules see it: its protection domain, access
/// flags, virtual address and length. The engine makes one from each of
/// its own regions; the direct path gets one from a peer's published
/// table ([`crate::PeerRegion`] is this type), where every value is
/// untrusted — the rules only compare and do checked arithmetic on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionView {
    pub pd: PdHandle,
    pub access: AccessFlags,
    pub iova: u64,
    pub len: u64,
}

// ----- which rights an operation needs -----

/// The right the *target* must grant for a send WR's operation (IBTA
/// ch. 9 and 10, `ibv_post_send(3)`, `ibv_modify_qp(3)` access flags): RDMA WRITE and WRITE with immediate
/// need REMOTE_WRITE, RDMA READ needs REMOTE_READ, the atomics need
/// REMOTE_ATOMIC; SENDs need none (an empty set): they land in a receive
/// WQE the target posted itself.
#[inline]
pub const fn remote_access(op: &SendOp) -> AccessFlags {
    match op {
        SendOp::Write { .. } | SendOp::WriteWithImm { .. } => AccessFlags::REMOTE_WRITE,
        SendOp::Read { .. } => AccessFlags::REMOTE_READ,
        SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => AccessFlags::REMOTE_ATOMIC,
        SendOp::Send
        | SendOp::SendWithImm { .. }
        | SendOp::SendWithInv { .. }
        | SendOp::BindMw { .. }
        | SendOp::LocalInv { .. } => AccessFlags::empty(),
    }
}

/// [`remote_access`] for a request as the responder receives it (the
/// opcode's kind): WRITE → REMOTE_WRITE, READ request → REMOTE_READ,
/// CmpSwap/FetchAdd → REMOTE_ATOMIC, anything else none.
#[inline]
pub const fn request_access(kind: OpKind) -> AccessFlags {
    match kind {
        OpKind::Write => AccessFlags::REMOTE_WRITE,
        OpKind::ReadRequest => AccessFlags::REMOTE_READ,
        OpKind::CompareSwap | OpKind::FetchAdd => AccessFlags::REMOTE_ATOMIC,
        _ => AccessFlags::empty(),
    }
}

/// The right the *local* regions of a send WR's SGEs must grant (IBTA
/// ch. 10 memory access rights, `ibv_reg_mr(3)`): the HCA writes into the SGEs of a READ (the
/// data) and of an atomic (the original value), so those need
/// LOCAL_WRITE; the SGEs of SENDs and WRITEs are only read, which every
/// region allows.
#[inline]
pub const fn local_access(op: &SendOp) -> AccessFlags {
    if op.is_read_or_atomic() {
        AccessFlags::LOCAL_WRITE
    } else {
        AccessFlags::empty()
    }
}

// ----- which operations a QP type has -----

/// Whether a QP of `qp_type` has the operation at all (IBTA ch. 9, the
/// operations each transport service supports; `ibv_post_send(3)`): RC has
/// every one; UC has SEND (with or without immediate) and RDMA WRITE (with
/// or without immediate) — no READ, no atomics, no SEND with invalidate;
/// UD has SEND with or without immediate only. Memory-window binds and
/// local invalidations ([`SendOp::is_local`]) go through the send queue of
/// RC and UC QPs (IBTA ch. 10: a type-2 window is bound to a connected
/// QP; rxe and mlx5 take them on RC and UC). Anything else is EINVAL at
/// post time.
#[inline]
pub const fn op_allowed(qp_type: QpType, op: &SendOp) -> bool {
    match qp_type {
        // The XRC initiator is RC's send side; the target has no send queue.
        QpType::Rc | QpType::XrcIni => true,
        QpType::XrcTgt => false,
        QpType::Uc => matches!(
            op,
            SendOp::Send
                | SendOp::SendWithImm { .. }
                | SendOp::Write { .. }
                | SendOp::WriteWithImm { .. }
                | SendOp::BindMw { .. }
                | SendOp::LocalInv { .. }
        ),
        QpType::Ud => matches!(op, SendOp::Send | SendOp::SendWithImm { .. }),
    }
}

// ----- XRC -----

/// Whether a QP of `qp_type` sends requests on a reliable connection and
/// takes their ACKs and responses: RC and the XRC initiator (the XRC
/// target only answers).
#[inline]
pub const fn sends_requests_reliably(qp_type: QpType) -> bool {
    matches!(qp_type, QpType::Rc | QpType::XrcIni)
}

/// Whether a QP of `qp_type` executes incoming requests: every type but
/// the XRC initiator, which has no responder (its peer is an XRC target).
#[inline]
pub const fn takes_requests(qp_type: QpType) -> bool {
    !matches!(qp_type, QpType::XrcIni)
}

/// Whether a QP of `qp_type` has a receive queue of its own that
/// `ibv_post_recv` may fill: neither XRC type has one (the initiator
/// receives nothing; the target's receives come from XRC SRQs), and
/// `ibv_post_recv` on them is EINVAL.
#[inline]
pub const fn has_recv_queue(qp_type: QpType) -> bool {
    !qp_type.is_xrc()
}

/// Whether a QP of `qp_type` may execute one-sided WRs on the same-host
/// direct path: not an XRC QP (the target's PD is that of the XRC SRQ
/// each request names, which the grants do not carry).
#[inline]
pub const fn direct_path_allowed(qp_type: QpType) -> bool {
    !qp_type.is_xrc()
}

/// The largest XRC SRQ number an XRCETH carries (24 bits).
pub const MAX_XRC_SRQN: u32 = 0x00FF_FFFF;

/// What the XRC rule needs to know of the SRQ a request's XRCETH names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XrcSrqFacts {
    /// The SRQ's XRC domain; `None` for an ordinary (basic) SRQ.
    pub xrcd: Option<crate::handle::XrcdHandle>,
}

/// The XRC target's check of each request (IBTA annex A14, XRC; rdma-core
/// and the kernel's mlx5 behave so): the request carries an XRCETH, the
/// SRQ it names exists (`srq`, `None` when the lookup found nothing), is
/// an XRC SRQ, and belongs to the target QP's XRC domain `qp_xrcd`.
/// Any failure is answered with an invalid request NAK (and the target
/// goes to ERR, as after every such NAK).
#[inline]
pub fn check_xrc_target(
    qp_xrcd: Option<crate::handle::XrcdHandle>,
    srqn: Option<u32>,
    srq: impl FnOnce(u32) -> Option<XrcSrqFacts>,
) -> Result<(), NakCode> {
    let n = srqn.ok_or(NakCode::InvalidRequest)?;
    let facts = srq(n).ok_or(NakCode::InvalidRequest)?;
    match (facts.xrcd, qp_xrcd) {
        (Some(s), Some(q)) if s == q => Ok(()),
        _ => Err(NakCode::InvalidRequest),
    }
}

// ----- what a QP may do in each state -----

/// Whether `ibv_post_send` accepts a WR in `state` (IBTA ch. 10, the QP
/// states and the work they permit; `ibv_post_send(3)`): RTS and SQD queue it; SQE and ERR
/// accept it and flush it at once ([`posted_sends_flush`]); RESET, INIT
/// and RTR refuse it (EINVAL).
#[inline]
pub const fn can_post_send(state: QpState) -> bool {
    matches!(
        state,
        QpState::Rts | QpState::Sqd | QpState::Err | QpState::Sqe
    )
}

/// Whether a send WR accepted in `state` is flushed at once with
/// WR_FLUSH_ERR instead of executing (SQE and ERR, IBTA ch. 10).
#[inline]
pub const fn posted_sends_flush(state: QpState) -> bool {
    matches!(state, QpState::Err | QpState::Sqe)
}

/// Whether `ibv_post_recv` accepts a WR in `state` (IBTA ch. 10): in
/// every state but RESET (receives may be posted from INIT on).
#[inline]
pub const fn can_post_recv(state: QpState) -> bool {
    !matches!(state, QpState::Reset)
}

/// Whether a receive WR accepted in `state` is completed at once with
/// WR_FLUSH_ERR (ERR only: SQE stops the send queue, not the receive queue).
#[inline]
pub const fn posted_recvs_flush(state: QpState) -> bool {
    matches!(state, QpState::Err)
}

/// Whether the requester runs in `state`: transmits WQEs that have
/// started and takes their responses (RTS, and SQD, which lets started
/// WQEs finish; IBTA ch. 10, the SQ drain state).
#[inline]
pub const fn requester_active(state: QpState) -> bool {
    matches!(state, QpState::Rts | QpState::Sqd)
}

/// Whether the requester may *start* a new WQE in `state`: RTS only (in
/// SQD no new WQE starts). A WR executed outside the engine
/// starts as it executes, so the direct path requires this too.
#[inline]
pub const fn requester_may_start(state: QpState) -> bool {
    matches!(state, QpState::Rts)
}

/// Whether the responder executes incoming requests in `state` (IBTA
/// ch. 10: from RTR on; SQD and SQE keep the receive side working): RTR,
/// RTS, SQD, SQE. RESET, INIT and ERR drop them.
#[inline]
pub const fn responder_receives(state: QpState) -> bool {
    matches!(
        state,
        QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
    )
}

// ----- ranges -----

/// The offset of `[va, va + n)` in a region of `len` bytes at `iova`, when
/// the range lies inside it (the whole range must be in the region, IBTA
/// ch. 9 and 10). Computed with checked arithmetic: a `va` below `iova`, or
/// a range whose end overflows u64, is outside — never wrapped around.
#[inline]
pub const fn range_offset(iova: u64, len: u64, va: u64, n: u64) -> Option<u64> {
    let Some(off) = va.checked_sub(iova) else {
        return None;
    };
    let Some(end) = off.checked_add(n) else {
        return None;
    };
    if end <= len {
        Some(off)
    } else {
        None
    }
}

// ----- local SGEs -----

/// The local SGE check (IBTA ch. 10, L_Key checks; `ibv_post_send(3)`): the lkey
/// names a region of this engine (`region`, None when the lookup found
/// nothing), the region is in the QP's protection domain `qp_pd`, it
/// grants `need` (LOCAL_WRITE where the engine writes,
/// [`local_access`]), and `[addr, addr + length)` lies inside it
/// ([`range_offset`], overflow-safe). Returns the SGE's offset in the
/// region, or the completion status the WR fails with: LOC_PROT_ERR for
/// each of these, as real HCAs report them.
#[inline]
pub fn check_local_sge(
    region: Option<&RegionView>,
    qp_pd: PdHandle,
    sge: &Sge,
    need: AccessFlags,
) -> Result<u64, WcStatus> {
    let r = region.ok_or(WcStatus::LocProtErr)?;
    if r.pd != qp_pd || !r.access.contains(need) {
        return Err(WcStatus::LocProtErr);
    }
    range_offset(r.iova, r.len, sge.addr, u64::from(sge.length)).ok_or(WcStatus::LocProtErr)
}

// ----- remote access -----

/// Why a remote access is refused. The responder answers every one with a
/// remote access error NAK (RC; UC drops the packet); the direct path
/// reports it in [`crate::NotDirect::Target`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RemoteDenied {
    /// The target QP's access flags lack the right.
    QpAccess,
    /// No valid region has the rkey.
    NoRegion,
    /// The region is in another protection domain than the target QP.
    Pd,
    /// The region's access flags lack the right.
    RegionAccess,
    /// `[va, va + len)` is not inside the region (overflow included).
    Range,
    /// A type-2 window reached through another QP than the one it was
    /// bound through.
    WindowQp,
}

/// The region half of the remote access check (IBTA ch. 9, R_Key checks):
/// the rkey found a region (`region`), it is in the target QP's protection
/// domain `qp_pd`, it grants `need`, and `[va, va + len)` lies inside it
/// ([`range_offset`]). Returns the offset of `va` in the region. The
/// responder re-checks this alone for every READ response packet and every
/// later packet of a WRITE (the region may have gone meanwhile).
#[inline]
pub fn check_region(
    region: Option<&RegionView>,
    qp_pd: PdHandle,
    need: AccessFlags,
    va: u64,
    len: u64,
) -> Result<u64, RemoteDenied> {
    let r = region.ok_or(RemoteDenied::NoRegion)?;
    if r.pd != qp_pd {
        return Err(RemoteDenied::Pd);
    }
    if !r.access.contains(need) {
        return Err(RemoteDenied::RegionAccess);
    }
    range_offset(r.iova, r.len, va, len).ok_or(RemoteDenied::Range)
}

/// The whole remote access check of a request, as the responder makes it
/// when a WRITE, READ or atomic starts (IBTA ch. 9):
/// the target QP's access flags `qp_access` contain `need`; a zero-length
/// access needs nothing more — no valid rkey, no region (a zero-length
/// RDMA operation does not check its R_Key and virtual address); otherwise the
/// region rules of [`check_region`]. `region` looks the rkey up and is
/// called only when the rule needs the region. Returns the offset of `va`
/// in the region (0 for a zero-length access).
#[inline]
pub fn check_remote(
    qp_access: AccessFlags,
    qp_pd: PdHandle,
    need: AccessFlags,
    va: u64,
    len: u64,
    region: impl FnOnce() -> Option<RegionView>,
) -> Result<u64, RemoteDenied> {
    if !qp_access.contains(need) {
        return Err(RemoteDenied::QpAccess);
    }
    if len == 0 {
        return Ok(0);
    }
    check_region(region().as_ref(), qp_pd, need, va, len)
}

// ----- memory windows -----

/// A memory window as the rules see it: its protection domain and type,
/// the QP a type-2 window was bound through, and what the bind gave it
/// (`None` while unbound: a type-2 window that is free, a type-1 window
/// never bound or unbound with a zero-length bind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowView {
    pub pd: PdHandle,
    pub mw_type: MwType,
    pub qp: Option<Qpn>,
    pub bound: Option<WindowBound>,
}

/// A bound window: the remote rights `access` (ZERO_BASED among them for a
/// window addressed from 0), over `len` bytes at virtual address `addr` of
/// its region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowBound {
    pub access: AccessFlags,
    pub addr: u64,
    pub len: u64,
}

/// What an rkey names, for [`check_remote_key`]: a region, or a window
/// and the region it is bound to (`None` when that region is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyTarget {
    Region(RegionView),
    Window(WindowView, Option<RegionView>),
}

/// The access bits a bind may give a window: the remote rights,
/// ZERO_BASED, and LOCAL_WRITE (which means nothing for a window and is
/// ignored, as rxe and mlx5 ignore it).
pub const WINDOW_ACCESS: AccessFlags = AccessFlags::from_bits_retain(
    AccessFlags::LOCAL_WRITE.bits()
        | AccessFlags::REMOTE_WRITE.bits()
        | AccessFlags::REMOTE_READ.bits()
        | AccessFlags::REMOTE_ATOMIC.bits()
        | AccessFlags::ZERO_BASED.bits(),
);

/// Why a bind fails. Every reason completes the bind WR with
/// IBV_WC_MW_BIND_ERR and moves the QP to the error state (IBTA ch. 10,
/// the bind errors; rxe does the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BindDenied {
    /// No such window.
    NoWindow,
    /// The new rkey's index (its upper 24 bits) is not the window's.
    OtherIndex,
    /// Access bits outside [`WINDOW_ACCESS`].
    Access,
    /// A type-1 window cannot be zero-based (IBTA o10-36.2.2).
    Type1ZeroBased,
    /// A type-2 window is bound only while free: invalidate it first
    /// (o10-37.2.30).
    Type2NotFree,
    /// A type-2 window binds only through a QP of its own PD (C10-72).
    Type2Pd,
    /// A type-2 window is not unbound by a bind: zero length or no region
    /// (o10-37.2.40; invalidate it instead).
    Type2Unbind,
    /// The lkey names no region.
    NoRegion,
    /// The region is in another PD than the window.
    RegionPd,
    /// The region was not registered with IBV_ACCESS_MW_BIND (C10-73).
    RegionNoBind,
    /// A writable window (REMOTE_WRITE or REMOTE_ATOMIC) over a region
    /// without LOCAL_WRITE (C10-74).
    NeedsLocalWrite,
    /// The window is not inside the region (C10-75), overflow included.
    Range,
}

/// The bind rule (IBTA ch. 10, bind memory window; the rules rxe checks,
/// in its order): `window` is the window as it is now, `qp_pd` the PD of
/// the QP the bind WR was posted to, `index_ok` whether the new rkey keeps
/// the window's index, `region` the region the bind's lkey names (looked
/// up only for a non-zero length). A zero-length bind of a type-1 window
/// unbinds it whatever region it names.
#[inline]
pub fn check_bind(
    window: Option<&WindowView>,
    qp_pd: PdHandle,
    index_ok: bool,
    bind: &MwBind,
    region: Option<&RegionView>,
) -> Result<(), BindDenied> {
    let w = window.ok_or(BindDenied::NoWindow)?;
    if !index_ok {
        return Err(BindDenied::OtherIndex);
    }
    if !WINDOW_ACCESS.contains(bind.access) {
        return Err(BindDenied::Access);
    }
    match w.mw_type {
        MwType::One => {
            if bind.access.contains(AccessFlags::ZERO_BASED) {
                return Err(BindDenied::Type1ZeroBased);
            }
        }
        MwType::Two => {
            if w.bound.is_some() {
                return Err(BindDenied::Type2NotFree);
            }
            if w.pd != qp_pd {
                return Err(BindDenied::Type2Pd);
            }
            if bind.mr.is_none() || bind.length == 0 {
                return Err(BindDenied::Type2Unbind);
            }
        }
    }
    if bind.length == 0 {
        return Ok(());
    }
    let r = region.ok_or(BindDenied::NoRegion)?;
    if r.pd != w.pd {
        return Err(BindDenied::RegionPd);
    }
    if !r.access.contains(AccessFlags::MW_BIND) {
        return Err(BindDenied::RegionNoBind);
    }
    if bind
        .access
        .intersects(AccessFlags::REMOTE_WRITE.union(AccessFlags::REMOTE_ATOMIC))
        && !r.access.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(BindDenied::NeedsLocalWrite);
    }
    range_offset(r.iova, r.len, bind.addr, bind.length)
        .map(|_| ())
        .ok_or(BindDenied::Range)
}

/// The window half of the remote access check (IBTA ch. 9 and 10, R_Key
/// checks of a window; rxe's lookup makes the same ones): the window is
/// bound, in the target QP's PD `qp_pd`, a type-2 window was bound through
/// this QP (`qpn`), it grants `need`, and `[va, va + len)` — from the
/// window's start when it is zero-based — lies inside it; then the region
/// it is bound to is still there, in the window's PD, and holds that range
/// (a region re-registered or deregistered under a window fails here).
/// Returns the offset of the range in the region.
#[inline]
pub fn check_window(
    window: &WindowView,
    region: Option<&RegionView>,
    qp_pd: PdHandle,
    qpn: Qpn,
    need: AccessFlags,
    va: u64,
    len: u64,
) -> Result<u64, RemoteDenied> {
    let b = window.bound.ok_or(RemoteDenied::NoRegion)?;
    if b.len == 0 {
        return Err(RemoteDenied::NoRegion);
    }
    if window.pd != qp_pd {
        return Err(RemoteDenied::Pd);
    }
    if window.mw_type == MwType::Two && window.qp != Some(qpn) {
        return Err(RemoteDenied::WindowQp);
    }
    if !b.access.contains(need) {
        return Err(RemoteDenied::RegionAccess);
    }
    let abs = if b.access.contains(AccessFlags::ZERO_BASED) {
        b.addr.checked_add(va).ok_or(RemoteDenied::Range)?
    } else {
        va
    };
    range_offset(b.addr, b.len, abs, len).ok_or(RemoteDenied::Range)?;
    let r = region.ok_or(RemoteDenied::NoRegion)?;
    if r.pd != window.pd {
        return Err(RemoteDenied::Pd);
    }
    range_offset(r.iova, r.len, abs, len).ok_or(RemoteDenied::Range)
}

/// [`check_remote`] for an rkey that may name a window as well as a
/// region: the target QP's rights, the zero-length rule, then
/// [`check_region`] or [`check_window`]. The responder makes every remote
/// access check through this (the direct path takes regions only: a
/// window's rkey is never published to peers, so its WRs go to the
/// engine). `qpn` is the target QP (a type-2 window answers only its own).
#[inline]
#[allow(clippy::too_many_arguments)]
pub fn check_remote_key(
    qp_access: AccessFlags,
    qp_pd: PdHandle,
    qpn: Qpn,
    need: AccessFlags,
    va: u64,
    len: u64,
    target: impl FnOnce() -> Option<KeyTarget>,
) -> Result<u64, RemoteDenied> {
    if !qp_access.contains(need) {
        return Err(RemoteDenied::QpAccess);
    }
    if len == 0 {
        return Ok(0);
    }
    match target() {
        None => Err(RemoteDenied::NoRegion),
        Some(KeyTarget::Region(r)) => check_region(Some(&r), qp_pd, need, va, len),
        Some(KeyTarget::Window(w, r)) => check_window(&w, r.as_ref(), qp_pd, qpn, need, va, len),
    }
}

/// Why an invalidation fails: locally (IBV_WR_LOCAL_INV) the WR completes
/// with IBV_WC_LOC_QP_OP_ERR, remotely (SEND with invalidate) the receive
/// completes with IBV_WC_REM_INV_REQ_ERR and the sender gets an invalid
/// request NAK (rxe's statuses; IBTA ch. 9, responder class J).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvalidateDenied {
    /// The rkey names no window (softrdma has no fast-registration
    /// regions, the only regions invalidation applies to).
    NotWindow,
    /// A type-1 window is not invalidated by work requests (o10-37.2.26):
    /// it is unbound with a zero-length bind.
    Type1,
    /// The window is not bound.
    NotBound,
    /// The window is in another PD than the QP.
    Pd,
    /// A remote invalidation arrived on another QP than the one the
    /// window was bound through.
    OtherQp,
}

/// The invalidation rule: `window` is what the rkey named (`None`: no
/// window has exactly this rkey), `qp_pd`/`qpn` the QP the invalidation
/// came through, `remote` true for a SEND with invalidate.
#[inline]
pub fn check_invalidate(
    window: Option<&WindowView>,
    qp_pd: PdHandle,
    qpn: Qpn,
    remote: bool,
) -> Result<(), InvalidateDenied> {
    let w = window.ok_or(InvalidateDenied::NotWindow)?;
    if w.mw_type == MwType::One {
        return Err(InvalidateDenied::Type1);
    }
    if w.bound.is_none() {
        return Err(InvalidateDenied::NotBound);
    }
    if w.pd != qp_pd {
        return Err(InvalidateDenied::Pd);
    }
    if remote && w.qp != Some(qpn) {
        return Err(InvalidateDenied::OtherQp);
    }
    Ok(())
}

// ----- atomics -----

/// Whether an atomic's target address is allowed (IBTA ch. 9, atomic
/// operations: the virtual address must be 8-byte aligned; otherwise an
/// invalid request NAK). The rule is on the virtual address, not on its offset in the
/// region: a region registered at an iova that is not 8-aligned has
/// aligned atomics at unaligned offsets (memory implementations cope).
#[inline]
pub const fn atomic_va_aligned(va: u64) -> bool {
    va.is_multiple_of(ATOMIC_LEN)
}

/// Whether an atomic WR's SGE list is acceptable at post time
/// (`ibv_post_send(3)`: exactly one SGE of exactly 8 bytes; EINVAL
/// otherwise). `len` is the sum of the SGE lengths.
#[inline]
pub const fn atomic_sges_ok(num_sge: usize, len: u64) -> bool {
    num_sge == 1 && len == ATOMIC_LEN
}

/// Whether a starting atomic WQE's local buffer is long enough for the
/// original value (LOC_LEN_ERR otherwise).
#[inline]
pub const fn atomic_local_len_ok(len: u64) -> bool {
    len >= ATOMIC_LEN
}

// ----- messages -----

/// Whether a starting WQE's message length is allowed (at most 2^31 bytes,
/// the port's max message size; LOC_LEN_ERR otherwise).
#[inline]
pub const fn message_len_ok(len: u64) -> bool {
    len <= MAX_MSG_SIZE
}

// ----- posting -----

/// Why `ibv_post_send` refuses a WR (before anything is queued).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PostSendError {
    /// The QP's state does not take sends ([`can_post_send`]): EINVAL.
    State,
    /// The QP type does not have the operation ([`op_allowed`]): EINVAL.
    OpNotSupported,
    /// More SGEs than the QP's `max_send_sge`: EINVAL.
    TooManySges,
    /// The send queue holds `max_send_wr` WRs already: ENOMEM.
    QueueFull,
    /// A UD WR without a destination (`wr.ud`): EINVAL.
    UdWithoutDest,
    /// An atomic without exactly one 8-byte SGE ([`atomic_sges_ok`]): EINVAL.
    AtomicSges,
    /// A WR on an XRC initiator without a remote XRC SRQ number of at
    /// most 24 bits (`wr.xrc_srqn`): EINVAL.
    XrcWithoutSrqn,
}

/// The checks of `ibv_post_send` that do not depend on memory contents, in
/// the order the engine makes them: state, operation for the QP type, SGE
/// count, queue room, UD destination, atomic SGE. Returns the message
/// length (the sum of the SGE lengths). Inline data is checked by
/// `post_send` itself (the direct path takes no inline WRs).
#[inline]
pub fn check_post_send(
    qp_type: QpType,
    state: QpState,
    cap: &QpCap,
    sq_len: usize,
    wr: &SendWr,
) -> Result<u64, PostSendError> {
    if !can_post_send(state) {
        return Err(PostSendError::State);
    }
    if !op_allowed(qp_type, &wr.op) {
        return Err(PostSendError::OpNotSupported);
    }
    if wr.sg_list.len() > cap.max_send_sge as usize {
        return Err(PostSendError::TooManySges);
    }
    if sq_len >= cap.max_send_wr as usize {
        return Err(PostSendError::QueueFull);
    }
    if qp_type == QpType::Ud && wr.ud.is_none() {
        return Err(PostSendError::UdWithoutDest);
    }
    if qp_type == QpType::XrcIni && !matches!(wr.xrc_srqn, Some(n) if n <= MAX_XRC_SRQN) {
        return Err(PostSendError::XrcWithoutSrqn);
    }
    let len: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
    if wr.op.is_atomic() && !atomic_sges_ok(wr.sg_list.len(), len) {
        return Err(PostSendError::AtomicSges);
    }
    Ok(len)
}

// ----- completions -----

/// Whether a send WR is signaled (`ibv_create_qp(3)` `sq_sig_all`,
/// IBV_SEND_SIGNALED): every WR of a QP created with `sq_sig_all`, else
/// those posted with SIGNALED.
#[inline]
pub const fn wr_signaled(sq_sig_all: bool, flags: SendFlags) -> bool {
    sq_sig_all || flags.contains(SendFlags::SIGNALED)
}

/// Whether a finished send WR produces a completion (IBTA ch. 10, work
/// completions): signaled WRs always, unsignaled ones only when they fail.
#[inline]
pub const fn send_completes(signaled: bool, status: WcStatus) -> bool {
    signaled || !status.is_ok()
}

/// The `byte_len` of a successful send completion: 8 for atomics (the
/// original value returned), else the message length (saturated to u32;
/// messages are at most 2^31 bytes).
#[inline]
pub const fn send_byte_len(atomic: bool, len: u64) -> u32 {
    if atomic {
        ATOMIC_LEN as u32
    } else if len > u32::MAX as u64 {
        u32::MAX
    } else {
        len as u32
    }
}

// ----- multicast -----

/// The DQPN of every multicast datagram (IBA 9.6.1.3: the multicast QPN).
pub const MCAST_QPN: u32 = 0x00FF_FFFF;
/// Groups one device may have QPs attached to (`max_mcast_grp`); each is a
/// socket joined to the group on the UDP port.
pub const MAX_MCAST_GRP: usize = 64;
/// QPs one group may have attached on one device (`max_mcast_qp_attach`,
/// rxe's number).
pub const MAX_MCAST_QP_ATTACH: usize = 56;
/// Attachments on one device in all (`max_total_mcast_qp_attach`).
pub const MAX_TOTAL_MCAST_QP_ATTACH: usize = MAX_MCAST_GRP * MAX_MCAST_QP_ATTACH;

/// Whether `gid` is a multicast GID, as the kernel's
/// `rdma_is_multicast_addr`: IPv6 `ff00::/8`, or an IPv4-mapped
/// `224.0.0.0/4` address.
pub fn is_multicast_gid(gid: crate::qp_attr::Gid) -> bool {
    is_multicast_ip(gid.to_ip())
}

/// Whether `ip` is a multicast address (the IP form of a multicast GID).
#[inline]
pub fn is_multicast_ip(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.is_multicast(),
        std::net::IpAddr::V6(v6) => v6.octets()[0] == 0xFF,
    }
}

/// `ibv_attach_mcast`'s checks (the kernel's `ib_attach_mcast`): a UD QP
/// and a multicast GID, EINVAL otherwise. The LID is not looked at on
/// RoCE.
pub fn check_mcast_attach(qp_type: QpType, gid: crate::qp_attr::Gid) -> Result<(), VerbsError> {
    if qp_type != QpType::Ud {
        return Err(VerbsError::InvalidArgument(format!(
            "attach_mcast: only UD QPs join multicast groups, not {qp_type:?}"
        )));
    }
    if !is_multicast_gid(gid) {
        return Err(VerbsError::InvalidArgument(format!(
            "attach_mcast: {gid} is not a multicast GID"
        )));
    }
    Ok(())
}

/// The device's multicast limits, for an attach that would make `groups`
/// groups, `in_group` QPs in its group and `total` attachments (ENOMEM past
/// any, as rxe).
pub fn check_mcast_limits(groups: usize, in_group: usize, total: usize) -> Result<(), VerbsError> {
    if groups > MAX_MCAST_GRP {
        return Err(VerbsError::NoMemory(format!(
            "attach_mcast: the device has {MAX_MCAST_GRP} groups already (max_mcast_grp)"
        )));
    }
    if in_group > MAX_MCAST_QP_ATTACH {
        return Err(VerbsError::NoMemory(format!(
            "attach_mcast: the group has {MAX_MCAST_QP_ATTACH} QPs attached (max_mcast_qp_attach)"
        )));
    }
    if total > MAX_TOTAL_MCAST_QP_ATTACH {
        return Err(VerbsError::NoMemory(
            "attach_mcast: max_total_mcast_qp_attach reached".into(),
        ));
    }
    Ok(())
}

/// Whether a UD datagram arriving for `dest_qp` at IP `dst` is a
/// multicast one: DQPN [`MCAST_QPN`] and a multicast destination address
/// (a datagram with one but not the other is dropped).
#[inline]
pub fn is_mcast_datagram(dest_qp: u32, dst: std::net::IpAddr) -> Option<bool> {
    let group = is_multicast_ip(dst);
    match (dest_qp == MCAST_QPN, group) {
        (true, true) => Some(true),
        (false, false) => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::{Lkey, Rkey};

    fn region(iova: u64, len: u64, access: AccessFlags) -> RegionView {
        RegionView {
            pd: PdHandle::from_raw(1),
            access,
            iova,
            len,
        }
    }

    #[test]
    fn range_offset_is_overflow_safe_at_both_ends() {
        assert_eq!(range_offset(0, 4096, 0, 4096), Some(0));
        assert_eq!(range_offset(0, 4096, 4096, 0), Some(4096));
        assert_eq!(range_offset(0, 4096, 4095, 2), None);
        // The wrap-around: u64::MAX - 7 + 16 overflows.
        assert_eq!(range_offset(0, 4096, u64::MAX - 7, 16), None);
        // Below the region.
        assert_eq!(range_offset(0x1000, 4096, 0xFF8, 8), None);
        // A region ending at 2^64.
        let iova = u64::MAX - 4095;
        assert_eq!(range_offset(iova, 4096, u64::MAX - 7, 8), Some(4088));
        assert_eq!(range_offset(iova, 4096, u64::MAX - 7, 9), None);
    }

    #[test]
    fn local_sge_rule() {
        let r = region(0, 4096, AccessFlags::LOCAL_WRITE);
        let sge = |addr, length| Sge {
            addr,
            length,
            lkey: Lkey::from_raw(7),
        };
        let w = AccessFlags::LOCAL_WRITE;
        assert_eq!(
            check_local_sge(Some(&r), PdHandle::from_raw(1), &sge(8, 8), w),
            Ok(8)
        );
        assert_eq!(
            check_local_sge(
                Some(&r),
                PdHandle::from_raw(1),
                &sge(u64::MAX - 7, 16),
                AccessFlags::empty()
            ),
            Err(WcStatus::LocProtErr)
        );
        assert_eq!(
            check_local_sge(None, PdHandle::from_raw(1), &sge(8, 8), w),
            Err(WcStatus::LocProtErr)
        );
        assert_eq!(
            check_local_sge(Some(&r), PdHandle::from_raw(2), &sge(8, 8), w),
            Err(WcStatus::LocProtErr)
        );
        let ro = region(0, 4096, AccessFlags::empty());
        assert_eq!(
            check_local_sge(Some(&ro), PdHandle::from_raw(1), &sge(8, 8), w),
            Err(WcStatus::LocProtErr)
        );
        assert_eq!(
            check_local_sge(
                Some(&ro),
                PdHandle::from_raw(1),
                &sge(8, 8),
                AccessFlags::empty()
            ),
            Ok(8)
        );
    }

    #[test]
    fn remote_rule_order_and_zero_length() {
        let all = AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE;
        let r = region(0x1000, 64, all);
        let w = AccessFlags::REMOTE_WRITE;
        let never = || -> Option<RegionView> { panic!("looked up a region it does not need") };
        assert_eq!(
            check_remote(
                AccessFlags::empty(),
                PdHandle::from_raw(1),
                w,
                0x1000,
                8,
                never
            ),
            Err(RemoteDenied::QpAccess)
        );
        // Zero length: only the QP's right.
        assert_eq!(
            check_remote(w, PdHandle::from_raw(1), w, 0, 0, never),
            Ok(0)
        );
        assert_eq!(
            check_remote(w, PdHandle::from_raw(1), w, 0x1000, 8, || None),
            Err(RemoteDenied::NoRegion)
        );
        assert_eq!(
            check_remote(w, PdHandle::from_raw(2), w, 0x1000, 8, || Some(r)),
            Err(RemoteDenied::Pd)
        );
        assert_eq!(
            check_remote(
                AccessFlags::REMOTE_READ,
                PdHandle::from_raw(1),
                AccessFlags::REMOTE_READ,
                0x1000,
                8,
                || Some(r)
            ),
            Err(RemoteDenied::RegionAccess)
        );
        assert_eq!(
            check_remote(w, PdHandle::from_raw(1), w, 0x1000 + 60, 8, || Some(r)),
            Err(RemoteDenied::Range)
        );
        assert_eq!(
            check_remote(w, PdHandle::from_raw(1), w, u64::MAX - 3, 8, || Some(r)),
            Err(RemoteDenied::Range)
        );
        assert_eq!(
            check_remote(w, PdHandle::from_raw(1), w, 0x1008, 8, || Some(r)),
            Ok(8)
        );
    }

    #[test]
    fn access_tables_agree() {
        let ops = [
            (
                SendOp::Write {
                    remote_addr: 0,
                    rkey: Rkey::from_raw(0),
                },
                OpKind::Write,
            ),
            (
                SendOp::WriteWithImm {
                    remote_addr: 0,
                    rkey: Rkey::from_raw(0),
                    imm: 0,
                },
                OpKind::Write,
            ),
            (
                SendOp::Read {
                    remote_addr: 0,
                    rkey: Rkey::from_raw(0),
                },
                OpKind::ReadRequest,
            ),
            (
                SendOp::CompareSwap {
                    remote_addr: 0,
                    rkey: Rkey::from_raw(0),
                    compare: 0,
                    swap: 0,
                },
                OpKind::CompareSwap,
            ),
            (
                SendOp::FetchAdd {
                    remote_addr: 0,
                    rkey: Rkey::from_raw(0),
                    add: 0,
                },
                OpKind::FetchAdd,
            ),
            (SendOp::Send, OpKind::Send),
        ];
        for (op, kind) in ops {
            assert_eq!(remote_access(&op), request_access(kind), "{op:?}");
            assert_eq!(
                local_access(&op).contains(AccessFlags::LOCAL_WRITE),
                op.is_read_or_atomic()
            );
        }
        assert!(!op_allowed(
            QpType::Uc,
            &SendOp::Read {
                remote_addr: 0,
                rkey: Rkey::from_raw(0)
            }
        ));
        assert!(!op_allowed(
            QpType::Ud,
            &SendOp::Write {
                remote_addr: 0,
                rkey: Rkey::from_raw(0)
            }
        ));
    }

    #[test]
    fn window_rules() {
        let pd = PdHandle::from_raw(1);
        let q = Qpn::from_raw(0x42);
        let w = AccessFlags::REMOTE_WRITE;
        let r = RegionView {
            pd,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
            iova: 0x1000,
            len: 0x1000,
        };
        let mut win = WindowView {
            pd,
            mw_type: MwType::Two,
            qp: Some(q),
            bound: Some(WindowBound {
                access: w,
                addr: 0x1100,
                len: 0x100,
            }),
        };
        assert_eq!(
            check_window(&win, Some(&r), pd, q, w, 0x1100, 0x100),
            Ok(0x100)
        );
        assert_eq!(
            check_window(&win, Some(&r), pd, Qpn::from_raw(7), w, 0x1100, 8),
            Err(RemoteDenied::WindowQp)
        );
        assert_eq!(
            check_window(&win, Some(&r), pd, q, AccessFlags::REMOTE_READ, 0x1100, 8),
            Err(RemoteDenied::RegionAccess)
        );
        assert_eq!(
            check_window(&win, Some(&r), pd, q, w, 0x10FF, 8),
            Err(RemoteDenied::Range)
        );
        assert_eq!(
            check_window(&win, Some(&r), pd, q, w, u64::MAX, 8),
            Err(RemoteDenied::Range)
        );
        assert_eq!(
            check_window(&win, None, pd, q, w, 0x1100, 8),
            Err(RemoteDenied::NoRegion)
        );
        assert_eq!(
            check_window(&win, Some(&r), PdHandle::from_raw(2), q, w, 0x1100, 8),
            Err(RemoteDenied::Pd)
        );
        // Zero-based: from the window's start; an offset that overflows is outside.
        win.bound = Some(WindowBound {
            access: w | AccessFlags::ZERO_BASED,
            addr: 0x1100,
            len: 0x100,
        });
        assert_eq!(check_window(&win, Some(&r), pd, q, w, 0xF8, 8), Ok(0x1F8));
        assert_eq!(
            check_window(&win, Some(&r), pd, q, w, u64::MAX - 4, 8),
            Err(RemoteDenied::Range)
        );
        // The bind rule.
        let bind = MwBind {
            mr: Some(crate::handle::Lkey::from_raw(9)),
            addr: 0x1000,
            length: 0x1000,
            access: w,
        };
        let free = WindowView { bound: None, ..win };
        assert_eq!(check_bind(Some(&free), pd, true, &bind, Some(&r)), Ok(()));
        assert_eq!(
            check_bind(Some(&win), pd, true, &bind, Some(&r)),
            Err(BindDenied::Type2NotFree)
        );
        assert_eq!(
            check_bind(Some(&free), pd, false, &bind, Some(&r)),
            Err(BindDenied::OtherIndex)
        );
        let long = MwBind {
            length: 0x1001,
            ..bind
        };
        assert_eq!(
            check_bind(Some(&free), pd, true, &long, Some(&r)),
            Err(BindDenied::Range)
        );
        let ro = RegionView {
            access: AccessFlags::MW_BIND,
            ..r
        };
        assert_eq!(
            check_bind(Some(&free), pd, true, &bind, Some(&ro)),
            Err(BindDenied::NeedsLocalWrite)
        );
        // The invalidation rule.
        assert_eq!(check_invalidate(Some(&win), pd, q, true), Ok(()));
        assert_eq!(
            check_invalidate(Some(&win), pd, Qpn::from_raw(7), true),
            Err(InvalidateDenied::OtherQp)
        );
        assert_eq!(
            check_invalidate(Some(&win), pd, Qpn::from_raw(7), false),
            Ok(())
        );
        assert_eq!(
            check_invalidate(Some(&free), pd, q, false),
            Err(InvalidateDenied::NotBound)
        );
        let one = WindowView {
            mw_type: MwType::One,
            ..win
        };
        assert_eq!(
            check_invalidate(Some(&one), pd, q, false),
            Err(InvalidateDenied::Type1)
        );
        assert_eq!(
            check_invalidate(None, pd, q, false),
            Err(InvalidateDenied::NotWindow)
        );
    }

    #[test]
    fn state_predicates() {
        use QpState::*;
        for s in [Reset, Init, Rtr, Rts, Sqd, Sqe, Err] {
            assert_eq!(can_post_send(s), matches!(s, Rts | Sqd | Sqe | Err));
            assert!(!posted_sends_flush(s) || can_post_send(s));
            assert!(!posted_recvs_flush(s) || can_post_recv(s));
            assert!(!requester_may_start(s) || requester_active(s));
            assert!(!requester_active(s) || responder_receives(s));
        }
    }
}
