//! The soft HCA as one sans-I/O state machine.
//!
//! In the manner of quinn-proto: verbs calls (`alloc_pd`, `reg_mr`,
//! `create_qp`, `modify_qp`, `post_send`, `post_recv`, `poll_cq`, …) are
//! commands; `handle_packet` and `handle_timeout` feed it the network and
//! the clock; `poll_transmit`, `poll_timeout` and `poll_event` hand out what
//! must happen next. A driver (UDP sockets, shared memory, the simulator)
//! only moves bytes and time.

use crate::handle::{
    AhHandle, CqHandle, Lkey, MwHandle, PdHandle, Qpn, Rkey, SrqHandle, XrcdHandle,
};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::fasthash::KeyMap;
use std::net::SocketAddr;
use std::sync::Arc;

use softrdma_wire::{icrc, Endpoints, OpKind, PacketRepr, Psn, Transport};

use crate::congestion::{CongestionConfig, CongestionQp, EcnAction};
use crate::counters::Counters;
use crate::error::{Result, VerbsError};
use crate::memory::RegionMemory;
use crate::qp::{AckHold, Qp, SendWqe, SgeList};
use crate::qp_attr::{
    validate_modify, AccessFlags, AhAttr, AttrLimits, AttrMask, Mtu, QpAttr, QpCap, QpState, QpType,
};
use crate::requester::{transport_of, Transmit, TxCtx};
use crate::resources::{
    push_change, Ah, Cq, Event, MrKeys, Notify, RecvWqe, ResourceChange, Resources, Srq,
};
use crate::rules::{self, PostSendError};
use crate::time::Instant;
use crate::timers::Timer;
use crate::wr::{MwType, RecvWr, SendWr, WcOpcode, WcStatus, WorkCompletion};

mod fastpath;
mod grant;
#[cfg(test)]
mod record_tests;
pub use fastpath::{DirectOp, DirectPlan, NotDirect, PeerQp, PeerRegion, PeerView, MAX_DIRECT_SGE};
pub use grant::{GrantFacts, GrantRefusal};

/// Largest CQ depth.
pub const MAX_CQE: u32 = 1 << 20;
/// Largest number of QPs per engine.
pub const MAX_QP: u32 = 1 << 18;

/// How the UDP source port of a QP's packets is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SrcPortPolicy {
    /// `0xC000 | (hash(qpn) & 0x3FFF)`: one flow per QP, as Linux does.
    PerQp,
    /// Every packet from this port (a driver with a single socket).
    Fixed(u16),
}

/// What a port knows about a received packet beyond its UDP payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RxMeta {
    /// The ECN bits of its IP header (`NotEct` where the port cannot read them).
    pub ecn: softrdma_wire::Ecn,
    /// The multicast group the datagram was sent to, when the port took it
    /// from a socket joined to one (its destination IP); `None`: sent to
    /// this device's own address.
    pub group: Option<std::net::IpAddr>,
}

/// Engine configuration.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// This device's IP address and RoCE UDP port.
    pub local: SocketAddr,
    /// UDP port of peers (4791 on a real network).
    pub remote_port: u16,
    pub src_port: SrcPortPolicy,
    /// The run's seed. When [`Self::key_seed`] is `None`, the secret
    /// generator of memory keys and QPNs is seeded from it (deterministic:
    /// the simulator and tests replay a run from this alone).
    pub seed: u64,
    /// 32 bytes that seed the ChaCha20 generator of lkeys, rkeys and QPNs.
    /// A driver on a real network passes bytes from the OS (the engine
    /// never reads OS randomness itself); the same bytes give the same keys
    /// and QPNs. `None` (the default) derives the 32 bytes from
    /// [`Self::seed`], so keys are then only as hard to guess as `seed`.
    pub key_seed: Option<[u8; 32]>,
    /// The port's active MTU (UD message limit and path MTU ceiling).
    pub active_mtu: Mtu,
    pub limits: AttrLimits,
    /// Unacknowledged packets an RC QP may have in flight: the window of
    /// the default congestion controller ([`crate::FixedWindow`]).
    pub max_inflight: u32,
    /// An RC requester asks for an ACK at least every this many packets.
    pub ack_req_every: u32,
    /// Accept IPv4 packets whose ICRC matches only under a non-zero IP ID
    /// recovered from the CRC (for peers like Linux rxe, when the driver
    /// cannot see the IP header). Costs 16 of the ICRC's 32 bits on those
    /// packets only; off by default and in simulation.
    pub recover_ipv4_id: bool,
    /// How long (ns) a responder may hold a lone positive ACK, hoping to
    /// send it right behind a request of its own QP (a ping-pong's answer):
    /// the peer then gets both in one receive batch, and a sender gets one
    /// system call per round trip instead of two. NAKs, READ responses and
    /// atomic ACKs never wait. 0 (the default) sends every ACK at once.
    /// Keep it far below any requester's ACK timeout (4.096 µs·2^timeout).
    pub ack_delay_ns: u64,
    /// Holds a lone ACK (`ack_delay_ns`) only on a QP that has sent a
    /// request since its last hold: a peer that answers. The ACKs of a
    /// one-way stream then go at once instead of each waiting out the
    /// delay with the sender's window stalled behind it. Off by default.
    pub ack_delay_answering_only: bool,
    /// The congestion controller of every QP (default: a fixed window of
    /// `max_inflight` PSNs, no rate control, no ECN).
    pub congestion: CongestionConfig,
}

impl EngineConfig {
    /// Defaults for a device at `local`.
    pub fn new(local: SocketAddr) -> Self {
        EngineConfig {
            local,
            remote_port: softrdma_wire::frame::ROCE_PORT,
            src_port: SrcPortPolicy::PerQp,
            seed: 0x5EED,
            key_seed: None,
            active_mtu: Mtu::Mtu4096,
            limits: AttrLimits::default(),
            max_inflight: 256,
            ack_req_every: 32,
            recover_ipv4_id: false,
            ack_delay_ns: 0,
            ack_delay_answering_only: false,
            congestion: CongestionConfig::default(),
        }
    }
}

/// What `create_qp` needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInit {
    pub pd: PdHandle,
    pub qp_type: QpType,
    pub send_cq: CqHandle,
    pub recv_cq: CqHandle,
    pub srq: Option<SrqHandle>,
    pub cap: QpCap,
    /// Every send WR completes with a CQE, whatever its SIGNALED flag.
    pub sq_sig_all: bool,
}

/// SRQ creation attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqInit {
    pub max_wr: u32,
    pub max_sge: u32,
    /// Raise `SrqLimitReached` when fewer WQEs than this remain (0 = off).
    pub limit: u32,
}

/// The soft HCA.
pub struct Engine {
    cfg: EngineConfig,
    res: Resources,
    qps: KeyMap<Qpn, Qp>,
    ready: VecDeque<Qpn>,
    timers: BinaryHeap<Reverse<(Instant, Qpn)>>,
    /// Held ACKs of QPs destroyed or reset before they went out, already
    /// built: a peer that received everything must still learn so.
    parting: VecDeque<(Transmit, Vec<u8>)>,
    /// QPs and regions changed since the driver last asked (`poll_change`).
    changes: VecDeque<ResourceChange>,
    /// QP1 (`gsi.rs`).
    gsi: crate::gsi::Gsi,
    /// Multicast groups and their attached QPs (`mcast.rs`).
    mcast: crate::mcast::McastTable,
    /// Scratch list of a multicast datagram's receivers.
    mcast_rx: Vec<Qpn>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("local", &self.cfg.local)
            .field("qps", &self.qps.len())
            .field("mrs", &self.res.mrs.len())
            .finish()
    }
}

impl Engine {
    /// A device with no objects.
    pub fn new(cfg: EngineConfig) -> Self {
        let secret_seed = cfg
            .key_seed
            .unwrap_or_else(|| crate::rng::derived_seed(cfg.seed));
        Engine {
            cfg,
            res: Resources::new(secret_seed),
            qps: KeyMap::default(),
            ready: VecDeque::new(),
            timers: BinaryHeap::new(),
            parting: VecDeque::new(),
            changes: VecDeque::new(),
            gsi: crate::gsi::Gsi::default(),
            mcast: Default::default(),
            mcast_rx: Vec::new(),
        }
    }

    /// The UDP source port of QP `qpn`'s packets.
    fn src_port_of(&self, qpn: Qpn) -> u16 {
        match self.cfg.src_port {
            SrcPortPolicy::Fixed(p) => p,
            SrcPortPolicy::PerQp => {
                0xC000 | (qpn.raw().wrapping_mul(0x9E37_79B1) >> 18) as u16 & 0x3FFF
            }
        }
    }

    /// The UDP source port QP `qpn`'s packets leave from (a fabric
    /// model's ECMP hashes it, as switches do).
    pub fn qp_src_port(&self, qpn: Qpn) -> u16 {
        self.src_port_of(qpn)
    }

    /// The next MAD QP1 received, for a management agent (the CM).
    pub fn poll_gsi(&mut self) -> Option<crate::gsi::GsiMad> {
        self.gsi.poll_rx()
    }

    /// Sends `mad` from QP1 to the GSI (QP1) of the port at `dst` (IP
    /// address and UDP port, normally 4791). Fails with `NoMemory` when
    /// [`crate::GSI_TX_MAX`] MADs already wait to go out.
    pub fn send_gsi(
        &mut self,
        dst: SocketAddr,
        mad: &[u8; softrdma_wire::mad::MAD_LEN],
    ) -> Result<()> {
        let gsi = Qpn::from_raw(softrdma_wire::mad::GSI_QPN);
        let src = SocketAddr::new(self.cfg.local.ip(), self.src_port_of(gsi));
        let ep = Endpoints::new(src, dst);
        if self.gsi.send(&mut self.res.counters, ep, mad) {
            Ok(())
        } else {
            Err(VerbsError::NoMemory(format!(
                "send_gsi: {} MADs already wait to be sent",
                crate::gsi::GSI_TX_MAX
            )))
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Turns recovery of non-zero IPv4 IDs on or off (see
    /// [`EngineConfig::recover_ipv4_id`]).
    pub fn set_recover_ipv4_id(&mut self, on: bool) {
        self.cfg.recover_ipv4_id = on;
    }

    /// Device-wide counters.
    pub fn counters(&self) -> &Counters {
        &self.res.counters
    }

    /// Counters of one QP.
    pub fn qp_counters(&self, qpn: Qpn) -> Option<&Counters> {
        self.qps.get(&qpn).map(|q| &q.counters)
    }

    /// QPNs of every QP.
    pub fn qp_numbers(&self) -> Vec<Qpn> {
        let mut v: Vec<Qpn> = self.qps.keys().copied().collect();
        v.sort_unstable();
        v
    }

    // ----- protection domains and memory regions -----

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&mut self) -> PdHandle {
        let h = PdHandle::from_raw(self.res.handle());
        self.res.pds.insert(h, 0);
        h
    }

    /// `ibv_dealloc_pd`: EBUSY while anything still uses it.
    pub fn dealloc_pd(&mut self, pd: PdHandle) -> Result<()> {
        match self.res.pds.get(&pd) {
            None => Err(VerbsError::NotFound {
                kind: "protection domain",
                handle: pd.raw(),
            }),
            Some(&users) if users > 0 => Err(VerbsError::Busy(format!(
                "protection domain {pd} still has {users} MRs, MWs, QPs, SRQs or AHs"
            ))),
            Some(_) => {
                self.res.pds.remove(&pd);
                Ok(())
            }
        }
    }

    /// `ibv_reg_mr`: registers `mem` at virtual address `iova`.
    pub fn reg_mr(
        &mut self,
        pd: PdHandle,
        iova: u64,
        access: AccessFlags,
        mem: Arc<dyn RegionMemory>,
    ) -> Result<MrKeys> {
        self.res.check_pd(pd)?;
        check_mr_access(access)?;
        let len = mem.len() as u64;
        if iova.checked_add(len).is_none() {
            return Err(VerbsError::inval("reg_mr: iova + length overflows"));
        }
        let lkey = Lkey::from_raw(self.res.new_key());
        self.res.mrs.insert(
            lkey,
            crate::resources::Mr {
                pd,
                iova,
                len,
                access,
                mem,
                lkey,
                rkey: Rkey::default(),
            },
        );
        let rkey = Rkey::from_raw(self.res.new_key());
        if let Some(mr) = self.res.mrs.get_mut(&lkey) {
            mr.rkey = rkey;
        }
        self.res.rkeys.insert(rkey, lkey);
        self.res.pd_ref(pd, 1);
        push_change(&mut self.changes, ResourceChange::MrRegistered { rkey });
        Ok(MrKeys { lkey, rkey })
    }

    /// `ibv_rereg_mr`: gives the region of `lkey` a new PD, new access
    /// rights and/or new memory at a new virtual address, keeping its keys
    /// (what is `None` stays). All or nothing: a refused change (a PD that
    /// does not exist, access rules as for [`Engine::reg_mr`]) changes
    /// nothing. From the return on, packets see only the new attributes; a
    /// driver learns of it as [`ResourceChange::MrDeregistered`] followed by
    /// [`ResourceChange::MrRegistered`] for the same rkey, so it takes back
    /// whatever it published of the old region.
    pub fn rereg_mr(
        &mut self,
        lkey: Lkey,
        pd: Option<PdHandle>,
        access: Option<AccessFlags>,
        translation: Option<(u64, Arc<dyn RegionMemory>)>,
    ) -> Result<()> {
        let mr = self.res.mrs.get(&lkey).ok_or(VerbsError::NotFound {
            kind: "memory region (lkey)",
            handle: lkey.raw(),
        })?;
        let (old_pd, rkey) = (mr.pd, mr.rkey);
        let windows = self
            .res
            .mws
            .values()
            .filter(|w| w.bound.is_some_and(|(k, _)| k == lkey))
            .count();
        if windows > 0 {
            // IBTA ch. 11 (reregister memory region): refused while memory
            // windows are bound to the region.
            return Err(VerbsError::Busy(format!(
                "rereg_mr: {windows} memory windows are bound to the region"
            )));
        }
        let new_pd = pd.unwrap_or(old_pd);
        self.res.check_pd(new_pd)?;
        let access = access.unwrap_or(mr.access);
        check_mr_access(access)?;
        if let Some((iova, mem)) = &translation {
            if iova.checked_add(mem.len() as u64).is_none() {
                return Err(VerbsError::inval("rereg_mr: iova + length overflows"));
            }
        }
        let Some(mr) = self.res.mrs.get_mut(&lkey) else {
            unreachable!("looked up above, under the same &mut self");
        };
        mr.pd = new_pd;
        mr.access = access;
        if let Some((iova, mem)) = translation {
            mr.iova = iova;
            mr.len = mem.len() as u64;
            mr.mem = mem;
        }
        self.res.pd_ref(old_pd, -1);
        self.res.pd_ref(new_pd, 1);
        push_change(&mut self.changes, ResourceChange::MrDeregistered { rkey });
        push_change(&mut self.changes, ResourceChange::MrRegistered { rkey });
        Ok(())
    }

    /// `ibv_dereg_mr`. Once this returns, no packet touches the region again:
    /// in-flight operations on it fail with access errors.
    pub fn dereg_mr(&mut self, lkey: Lkey) -> Result<()> {
        let mr = self.res.mrs.remove(&lkey).ok_or(VerbsError::NotFound {
            kind: "memory region (lkey)",
            handle: lkey.raw(),
        })?;
        self.res.rkeys.remove(&mr.rkey);
        // Windows bound to it reach nothing from now on (as on mlx5, the
        // deregistration is not refused): they are unbound, type 2 ones
        // free, so a later region with a recycled lkey is not reached.
        for w in self.res.mws.values_mut() {
            if w.bound.is_some_and(|(k, _)| k == lkey) {
                w.bound = None;
                w.qp = None;
            }
        }
        self.res.retire_key(mr.lkey.raw());
        self.res.retire_key(mr.rkey.raw());
        self.res.pd_ref(mr.pd, -1);
        push_change(
            &mut self.changes,
            ResourceChange::MrDeregistered { rkey: mr.rkey },
        );
        Ok(())
    }

    // ----- memory windows -----

    /// `ibv_alloc_mw`: an unbound window of `mw_type` in `pd`, and its
    /// first rkey (a random 24-bit index from the CSPRNG, which is also the
    /// window's handle, and a random key byte). A type-1 window is valid
    /// from now on, but reaches nothing until a bind gives it a range; a
    /// type-2 window is free until a bind work request binds it.
    pub fn alloc_mw(&mut self, pd: PdHandle, mw_type: MwType) -> Result<(MwHandle, Rkey)> {
        self.res.check_pd(pd)?;
        let (index, key) = self.res.new_mw_index();
        let h = MwHandle::from_raw(index);
        let rkey = Rkey::from_raw(index << 8 | u32::from(key));
        self.res.mws.insert(
            h,
            crate::resources::Mw {
                pd,
                mw_type,
                rkey,
                qp: None,
                bound: None,
            },
        );
        self.res.pd_ref(pd, 1);
        Ok((h, rkey))
    }

    /// `ibv_dealloc_mw`: the window and every rkey it had are gone; a
    /// request that names one fails with a remote access error.
    pub fn dealloc_mw(&mut self, mw: MwHandle) -> Result<()> {
        let w = self.res.mws.remove(&mw).ok_or(VerbsError::NotFound {
            kind: "memory window",
            handle: mw.raw(),
        })?;
        self.res.retire_mw_index(mw.raw());
        self.res.pd_ref(w.pd, -1);
        Ok(())
    }

    /// A window's rkey now, and whether it is bound (reaches any bytes).
    pub fn mw_info(&self, mw: MwHandle) -> Option<(Rkey, bool)> {
        self.res
            .mws
            .get(&mw)
            .map(|w| (w.rkey, w.bound.is_some_and(|(_, b)| b.len > 0)))
    }

    /// The next change to a QP or a region (modified, destroyed,
    /// registered, deregistered), oldest first: a driver that publishes
    /// them to peers (grants, cached routes) follows them from here
    /// instead of relying on every caller to tell it.
    #[inline]
    pub fn poll_change(&mut self) -> Option<ResourceChange> {
        self.changes.pop_front()
    }

    /// The access rights of a region.
    pub fn mr_access(&self, lkey: Lkey) -> Option<AccessFlags> {
        self.res.mrs.get(&lkey).map(|m| m.access)
    }

    /// Address, length and keys of a region.
    pub fn mr_info(&self, lkey: Lkey) -> Option<(u64, u64, MrKeys)> {
        self.res.mrs.get(&lkey).map(|m| {
            (
                m.iova,
                m.len,
                MrKeys {
                    lkey: m.lkey,
                    rkey: m.rkey,
                },
            )
        })
    }

    // ----- completion queues -----

    /// `ibv_create_cq` with room for `depth` completions.
    pub fn create_cq(&mut self, depth: u32) -> Result<CqHandle> {
        if depth == 0 || depth > MAX_CQE {
            return Err(VerbsError::inval(format!(
                "create_cq: cqe {depth} must be between 1 and {MAX_CQE}"
            )));
        }
        let h = CqHandle::from_raw(self.res.handle());
        self.res.cqs.insert(
            h,
            Cq {
                depth: depth as usize,
                entries: std::collections::VecDeque::new(),
                notify: Notify::Off,
                quiet: 0,
                overrun: false,
                users: 0,
            },
        );
        Ok(h)
    }

    /// `ibv_resize_cq`: a new depth, 1 … MAX_CQE and at least the
    /// completions the CQ holds now (EINVAL otherwise, as rxe); the waiting
    /// completions stay. Returns the depth, which is the one asked for.
    pub fn resize_cq(&mut self, cq: CqHandle, depth: u32) -> Result<u32> {
        let c = self.res.cqs.get_mut(&cq).ok_or(VerbsError::NotFound {
            kind: "completion queue",
            handle: cq.raw(),
        })?;
        if depth == 0 || depth > MAX_CQE {
            return Err(VerbsError::inval(format!(
                "resize_cq: cqe {depth} must be between 1 and {MAX_CQE}"
            )));
        }
        if (depth as usize) < c.entries.len() {
            return Err(VerbsError::inval(format!(
                "resize_cq: cqe {depth} is below the {} completions waiting",
                c.entries.len()
            )));
        }
        c.depth = depth as usize;
        Ok(depth)
    }

    /// `ibv_destroy_cq`: EBUSY while a QP uses it.
    pub fn destroy_cq(&mut self, cq: CqHandle) -> Result<()> {
        match self.res.cqs.get(&cq) {
            None => Err(VerbsError::NotFound {
                kind: "completion queue",
                handle: cq.raw(),
            }),
            Some(c) if c.users > 0 => Err(VerbsError::Busy(format!(
                "CQ {cq} is used by {} QPs",
                c.users
            ))),
            Some(_) => {
                if self
                    .res
                    .cqs
                    .remove(&cq)
                    .is_some_and(|c| c.notify != Notify::Off)
                {
                    self.res.armed_cqs -= 1;
                }
                Ok(())
            }
        }
    }

    /// `ibv_poll_cq`: moves up to `max` completions into `out`; returns how many.
    pub fn poll_cq(
        &mut self,
        cq: CqHandle,
        max: usize,
        out: &mut Vec<WorkCompletion>,
    ) -> Result<usize> {
        let c = self.res.cqs.get_mut(&cq).ok_or(VerbsError::NotFound {
            kind: "completion queue",
            handle: cq.raw(),
        })?;
        let n = max.min(c.entries.len());
        // Block copies of the (Copy) completions rather than one push each.
        let (a, b) = c.entries.as_slices();
        let na = n.min(a.len());
        out.extend_from_slice(&a[..na]);
        out.extend_from_slice(&b[..n - na]);
        c.entries.drain(..n);
        c.quiet = c.quiet.min(c.entries.len());
        Ok(n)
    }

    /// Completions waiting on a CQ.
    pub fn cq_len(&self, cq: CqHandle) -> usize {
        self.res.cqs.get(&cq).map_or(0, |c| c.entries.len())
    }

    /// True once a CQ has overflowed.
    pub fn cq_overrun(&self, cq: CqHandle) -> bool {
        self.res.cqs.get(&cq).is_some_and(|c| c.overrun)
    }

    /// `ibv_req_notify_cq`: the next completion (or next solicited one)
    /// raises `Event::Completion` — at once if the CQ holds one that came
    /// in unarmed, with no event (as hardware arming at the consumer index
    /// does; see `Resources::arm_cq`).
    pub fn req_notify_cq(&mut self, cq: CqHandle, solicited_only: bool) -> Result<()> {
        if self.res.arm_cq(cq, solicited_only) {
            Ok(())
        } else {
            Err(VerbsError::NotFound {
                kind: "completion queue",
                handle: cq.raw(),
            })
        }
    }

    /// How many CQs are armed (`req_notify_cq` with no event raised
    /// since): while one is, a driver must notice incoming packets at
    /// once, since the program may be asleep waiting for the event.
    pub fn armed_cqs(&self) -> usize {
        self.res.armed_cqs
    }

    // ----- shared receive queues and address handles -----

    /// `ibv_create_srq`.
    pub fn create_srq(&mut self, pd: PdHandle, init: SrqInit) -> Result<SrqHandle> {
        self.res.check_pd(pd)?;
        let l = &self.cfg.limits;
        if init.max_wr == 0 || init.max_wr > l.max_qp_wr {
            return Err(VerbsError::inval(format!(
                "create_srq: max_wr {} must be between 1 and {}",
                init.max_wr, l.max_qp_wr
            )));
        }
        if init.max_sge == 0 || init.max_sge > l.max_sge {
            return Err(VerbsError::inval(format!(
                "create_srq: max_sge {} must be between 1 and {}",
                init.max_sge, l.max_sge
            )));
        }
        let h = SrqHandle::from_raw(self.res.handle());
        self.res.srqs.insert(
            h,
            Srq {
                pd,
                xrc: None,
                wqes: std::collections::VecDeque::new(),
                max_wr: init.max_wr,
                max_sge: init.max_sge,
                limit: init.limit,
                users: 0,
            },
        );
        self.res.pd_ref(pd, 1);
        Ok(h)
    }

    // ----- XRC: domains, SRQs, target QPs -----

    /// `ibv_open_xrcd` (a new domain).
    pub fn alloc_xrcd(&mut self) -> XrcdHandle {
        let h = XrcdHandle::from_raw(self.res.handle());
        self.res.xrcds.insert(h, 0);
        h
    }

    /// `ibv_close_xrcd`: EBUSY while an XRC SRQ or target QP is in it.
    pub fn dealloc_xrcd(&mut self, xrcd: XrcdHandle) -> Result<()> {
        match self.res.xrcds.get(&xrcd) {
            None => Err(VerbsError::NotFound {
                kind: "XRC domain",
                handle: xrcd.raw(),
            }),
            Some(&users) if users > 0 => Err(VerbsError::Busy(format!(
                "XRC domain {xrcd} still has {users} XRC SRQs or target QPs"
            ))),
            Some(_) => {
                self.res.xrcds.remove(&xrcd);
                Ok(())
            }
        }
    }

    fn check_xrcd(&self, xrcd: XrcdHandle, what: &str) -> Result<()> {
        if self.res.xrcds.contains_key(&xrcd) {
            Ok(())
        } else {
            Err(VerbsError::inval(format!(
                "{what}: XRC domain {xrcd} does not exist"
            )))
        }
    }

    /// `ibv_create_srq_ex` with IBV_SRQT_XRC: an SRQ in XRC domain `xrcd`
    /// whose receives complete on `cq` (an XRC target has no CQ of its
    /// own), under `pd` (whose regions its WQEs and the requests for it
    /// reach). Its number for XRCETHs is [`Engine::srq_num`].
    pub fn create_xrc_srq(
        &mut self,
        pd: PdHandle,
        xrcd: XrcdHandle,
        cq: CqHandle,
        init: SrqInit,
    ) -> Result<SrqHandle> {
        self.check_xrcd(xrcd, "create_srq_ex")?;
        if !self.res.cqs.contains_key(&cq) {
            return Err(VerbsError::inval(format!(
                "create_srq_ex: cq {cq} does not exist"
            )));
        }
        let h = self.create_srq(pd, init)?;
        if h.raw() > rules::MAX_XRC_SRQN {
            let _ = self.destroy_srq(h);
            return Err(VerbsError::NoMemory(
                "create_srq_ex: no XRC SRQ number left (24 bits)".into(),
            ));
        }
        if let Some(s) = self.res.srqs.get_mut(&h) {
            s.xrc = Some((xrcd, cq));
        }
        if let Some(c) = self.res.cqs.get_mut(&cq) {
            c.users += 1;
        }
        if let Some(u) = self.res.xrcds.get_mut(&xrcd) {
            *u += 1;
        }
        Ok(h)
    }

    /// `ibv_get_srq_num`: the number an XRCETH names XRC SRQ `srq` by;
    /// EINVAL for an SRQ that is not an XRC SRQ.
    pub fn srq_num(&self, srq: SrqHandle) -> Result<u32> {
        match self.res.srqs.get(&srq) {
            None => Err(VerbsError::NotFound {
                kind: "shared receive queue",
                handle: srq.raw(),
            }),
            Some(s) if s.xrc.is_none() => Err(VerbsError::inval(format!(
                "get_srq_num: SRQ {srq} is not an XRC SRQ"
            ))),
            Some(_) => Ok(srq.raw()),
        }
    }

    /// `ibv_create_qp_ex` with IBV_QPT_XRC_RECV: an XRC target QP in
    /// `xrcd`. It has no PD, CQ, send or receive queue of its own: each
    /// request it takes runs against the XRC SRQ its XRCETH names (that
    /// SRQ's PD, WQEs and CQ), which must be in the same domain.
    pub fn create_xrc_tgt_qp(&mut self, xrcd: XrcdHandle) -> Result<Qpn> {
        self.check_xrcd(xrcd, "create_qp_ex")?;
        let init = QpInit {
            pd: PdHandle::from_raw(0),
            qp_type: QpType::XrcTgt,
            send_cq: CqHandle::from_raw(0),
            recv_cq: CqHandle::from_raw(0),
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        };
        let qpn = self.create_qp_in(init, Some(xrcd))?;
        if let Some(u) = self.res.xrcds.get_mut(&xrcd) {
            *u += 1;
        }
        Ok(qpn)
    }

    /// The XRC domain of an XRC target QP (`None` for other QPs).
    pub fn qp_xrcd(&self, qpn: Qpn) -> Option<XrcdHandle> {
        self.qps.get(&qpn).and_then(|q| q.xrcd)
    }

    /// `ibv_modify_srq` with IBV_SRQ_LIMIT: arm the low-watermark event.
    pub fn arm_srq_limit(&mut self, srq: SrqHandle, limit: u32) -> Result<()> {
        let s = self.res.srqs.get_mut(&srq).ok_or(VerbsError::NotFound {
            kind: "shared receive queue",
            handle: srq.raw(),
        })?;
        if limit > s.max_wr {
            return Err(VerbsError::inval(format!(
                "modify_srq: srq_limit {limit} exceeds max_wr {}",
                s.max_wr
            )));
        }
        s.limit = limit;
        Ok(())
    }

    /// WQEs posted to an SRQ and not yet consumed.
    pub fn srq_len(&self, srq: SrqHandle) -> usize {
        self.res.srqs.get(&srq).map_or(0, |s| s.wqes.len())
    }

    /// `ibv_destroy_srq`: EBUSY while a QP uses it.
    pub fn destroy_srq(&mut self, srq: SrqHandle) -> Result<()> {
        match self.res.srqs.get(&srq) {
            None => Err(VerbsError::NotFound {
                kind: "shared receive queue",
                handle: srq.raw(),
            }),
            Some(s) if s.users > 0 => Err(VerbsError::Busy(format!(
                "SRQ {srq} is used by {} QPs",
                s.users
            ))),
            Some(s) => {
                let pd = s.pd;
                let xrc = s.xrc;
                self.res.srqs.remove(&srq);
                self.res.pd_ref(pd, -1);
                if let Some((xrcd, cq)) = xrc {
                    if let Some(c) = self.res.cqs.get_mut(&cq) {
                        c.users = c.users.saturating_sub(1);
                    }
                    if let Some(u) = self.res.xrcds.get_mut(&xrcd) {
                        *u = u.saturating_sub(1);
                    }
                }
                Ok(())
            }
        }
    }

    /// `ibv_post_srq_recv`.
    pub fn post_srq_recv(&mut self, srq: SrqHandle, wr: &RecvWr) -> Result<()> {
        let s = self.res.srqs.get_mut(&srq).ok_or(VerbsError::NotFound {
            kind: "shared receive queue",
            handle: srq.raw(),
        })?;
        if wr.sg_list.len() > s.max_sge as usize {
            return Err(VerbsError::inval(format!(
                "post_srq_recv: num_sge {} exceeds max_sge {}",
                wr.sg_list.len(),
                s.max_sge
            )));
        }
        if s.wqes.len() >= s.max_wr as usize {
            return Err(VerbsError::NoMemory(format!(
                "post_srq_recv: SRQ {srq} is full ({} WQEs)",
                s.max_wr
            )));
        }
        s.wqes.push_back(RecvWqe {
            wr_id: wr.wr_id,
            sges: wr.sg_list.clone(),
        });
        Ok(())
    }

    /// `ibv_create_ah`.
    pub fn create_ah(&mut self, pd: PdHandle, attr: AhAttr) -> Result<AhHandle> {
        self.res.check_pd(pd)?;
        if attr.port_num > 1 {
            return Err(VerbsError::inval(format!(
                "create_ah: port_num {} is not 1",
                attr.port_num
            )));
        }
        let dest = self.dest_of(&attr)?;
        let h = AhHandle::from_raw(self.res.handle());
        self.res.ahs.insert(h, Ah { pd, attr, dest });
        self.res.pd_ref(pd, 1);
        Ok(h)
    }

    /// `ibv_destroy_ah`.
    pub fn destroy_ah(&mut self, ah: AhHandle) -> Result<()> {
        let a = self.res.ahs.remove(&ah).ok_or(VerbsError::NotFound {
            kind: "address handle",
            handle: ah.raw(),
        })?;
        self.res.pd_ref(a.pd, -1);
        Ok(())
    }

    fn dest_of(&self, attr: &AhAttr) -> Result<SocketAddr> {
        let ip = attr.dgid.to_ip();
        if ip.is_unspecified() {
            return Err(VerbsError::inval("address vector: dgid is all zeros"));
        }
        if ip.is_ipv4() != self.cfg.local.is_ipv4() {
            return Err(VerbsError::inval(format!(
                "address vector: dgid {ip} is not of this device's address family ({})",
                self.cfg.local.ip()
            )));
        }
        Ok(SocketAddr::new(ip, self.cfg.remote_port))
    }

    // ----- queue pairs -----

    /// `ibv_create_qp`: returns the QP number.
    pub fn create_qp(&mut self, init: QpInit) -> Result<Qpn> {
        if init.qp_type == QpType::XrcTgt {
            return Err(VerbsError::inval(
                "create_qp: an XRC target QP is created in its XRC domain (create_xrc_tgt_qp)",
            ));
        }
        self.create_qp_in(init, None)
    }

    /// [`Engine::create_qp`], and for an XRC target (`xrcd`) without the
    /// PD and CQ checks (it has neither).
    fn create_qp_in(&mut self, init: QpInit, xrcd: Option<XrcdHandle>) -> Result<Qpn> {
        let mut init = init;
        if init.qp_type.is_xrc() {
            // Neither XRC type has a receive queue (rules::has_recv_queue).
            init.srq = None;
            init.cap.max_recv_wr = 0;
            init.cap.max_recv_sge = 0;
        }
        if xrcd.is_none() {
            self.res.check_pd(init.pd)?;
            for (what, cq) in [("send_cq", init.send_cq), ("recv_cq", init.recv_cq)] {
                if !self.res.cqs.contains_key(&cq) {
                    return Err(VerbsError::inval(format!(
                        "create_qp: {what} {cq} does not exist"
                    )));
                }
            }
        }
        if let Some(s) = init.srq {
            match self.res.srqs.get(&s) {
                None => {
                    return Err(VerbsError::inval(format!(
                        "create_qp: srq {s} does not exist"
                    )))
                }
                Some(srq) if srq.pd != init.pd => {
                    return Err(VerbsError::inval(format!(
                        "create_qp: srq {s} belongs to another PD"
                    )))
                }
                _ => {}
            }
        }
        let l = &self.cfg.limits;
        let c = &init.cap;
        let checks = [
            ("max_send_wr", c.max_send_wr, l.max_qp_wr),
            ("max_send_sge", c.max_send_sge, l.max_sge),
            ("max_inline_data", c.max_inline_data, l.max_inline_data),
        ];
        for (name, v, max) in checks {
            if v > max {
                return Err(VerbsError::inval(format!(
                    "create_qp: cap.{name} {v} exceeds the device limit {max}"
                )));
            }
        }
        if init.srq.is_none() {
            for (name, v, max) in [
                ("max_recv_wr", c.max_recv_wr, l.max_qp_wr),
                ("max_recv_sge", c.max_recv_sge, l.max_sge),
            ] {
                if v > max {
                    return Err(VerbsError::inval(format!(
                        "create_qp: cap.{name} {v} exceeds the device limit {max}"
                    )));
                }
            }
        }
        if self.qps.len() as u32 >= MAX_QP {
            return Err(VerbsError::NoMemory(format!(
                "create_qp: {MAX_QP} QPs already exist"
            )));
        }
        // At most MAX_QP (2^18) of the 2^24 numbers are in use and 256 in
        // quarantine, so a draw is free with probability above 98%.
        let qps = &self.qps;
        let qpn = Qpn::from_raw(self.res.new_qpn(|q| qps.contains_key(&Qpn::from_raw(q))));
        let src_port = self.src_port_of(qpn);
        let mut cap = init.cap;
        if init.srq.is_some() {
            cap.max_recv_wr = 0;
            cap.max_recv_sge = 0;
        }
        // As rxe and mlx5 size a send WQE: the inline room is at least what
        // its scatter list takes (16 bytes an SGE), so a QP that asks for
        // none can still inline 16 bytes per SGE (rdma_xclient relies on
        // it); the caps the QP really has are what query_qp reports.
        cap.max_inline_data = cap
            .max_inline_data
            .max(cap.max_send_sge.saturating_mul(16))
            .min(l.max_inline_data);
        let mtu = match init.qp_type {
            QpType::Ud => self.cfg.active_mtu.bytes(),
            _ => Mtu::Mtu1024.bytes(),
        };
        let qp = Qp {
            qpn,
            qp_type: init.qp_type,
            pd: init.pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            xrcd,
            cap,
            sq_sig_all: init.sq_sig_all,
            state: QpState::Reset,
            attr: QpAttr::default(),
            dest: None,
            src_port,
            mtu,
            rq: Default::default(),
            req: Default::default(),
            comp: Default::default(),
            resp: Default::default(),
            counters: Counters::default(),
            scheduled: false,
            timers: Default::default(),
            cc: self.cfg.congestion.build(&CongestionQp {
                qpn,
                qp_type: init.qp_type,
                max_inflight: self.cfg.max_inflight,
            }),
            cnp_due: false,
            timer_registered: None,
            ece: Default::default(),
        };
        self.qps.insert(qpn, qp);
        self.res.pd_ref(init.pd, 1);
        for cq in [init.send_cq, init.recv_cq] {
            if let Some(c) = self.res.cqs.get_mut(&cq) {
                c.users += 1;
            }
        }
        if let Some(s) = init.srq.and_then(|s| self.res.srqs.get_mut(&s)) {
            s.users += 1;
        }
        Ok(qpn)
    }

    /// `ibv_destroy_qp`: outstanding work is discarded without completions.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<()> {
        self.build_held_ack(qpn);
        let qp = self.qps.remove(&qpn).ok_or(VerbsError::NotFound {
            kind: "QP",
            handle: qpn.raw(),
        })?;
        self.res.retire_qpn(qpn.raw());
        if let Some(xrcd) = qp.xrcd {
            // An XRC target's PD, CQ and SRQ were those of the last request's
            // XRC SRQ, which it never held a reference on.
            if let Some(u) = self.res.xrcds.get_mut(&xrcd) {
                *u = u.saturating_sub(1);
            }
            push_change(&mut self.changes, ResourceChange::QpDestroyed { qpn });
            return Ok(());
        }
        self.res.pd_ref(qp.pd, -1);
        // A destroyed QP leaves its groups (the kernel detaches it too).
        self.mcast.forget_qp(qpn);
        // Type-2 windows bound through it are invalidated with it (IBTA
        // ch. 10: they belong to the QP).
        for w in self.res.mws.values_mut() {
            if w.qp == Some(qpn) {
                w.bound = None;
                w.qp = None;
            }
        }
        push_change(&mut self.changes, ResourceChange::QpDestroyed { qpn });
        for cq in [qp.send_cq, qp.recv_cq] {
            if let Some(c) = self.res.cqs.get_mut(&cq) {
                c.users = c.users.saturating_sub(1);
            }
        }
        if let Some(s) = qp.srq.and_then(|s| self.res.srqs.get_mut(&s)) {
            s.users = s.users.saturating_sub(1);
        }
        Ok(())
    }

    /// `ibv_attach_mcast`: QP `qpn` (UD) receives every datagram sent to
    /// the multicast group `gid` from now on. Attaching twice succeeds.
    /// True when the group is new on this device (the driver then joins it
    /// on its port).
    pub fn attach_mcast(&mut self, qpn: Qpn, gid: crate::qp_attr::Gid) -> Result<bool> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::NotFound {
            kind: "QP",
            handle: qpn.raw(),
        })?;
        crate::rules::check_mcast_attach(qp.qp_type, gid)?;
        self.mcast.attach(qpn, gid.to_ip())
    }

    /// `ibv_detach_mcast` (EINVAL when the QP is not attached to `gid`).
    /// True when no QP of this device is left in the group (the driver
    /// then leaves it).
    pub fn detach_mcast(&mut self, qpn: Qpn, gid: crate::qp_attr::Gid) -> Result<bool> {
        if !self.qps.contains_key(&qpn) {
            return Err(VerbsError::NotFound {
                kind: "QP",
                handle: qpn.raw(),
            });
        }
        if !crate::rules::is_multicast_gid(gid) {
            return Err(VerbsError::inval(format!(
                "detach_mcast: {gid} is not a multicast GID"
            )));
        }
        self.mcast.detach(qpn, gid.to_ip())
    }

    /// The multicast groups (their IP addresses) that QPs of this device
    /// are attached to: what the port must receive.
    pub fn mcast_groups(&self) -> impl Iterator<Item = std::net::IpAddr> + '_ {
        self.mcast.groups()
    }

    fn qp_mut(&mut self, qpn: Qpn) -> Result<&mut Qp> {
        self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound {
            kind: "QP",
            handle: qpn.raw(),
        })
    }

    /// The QP's current attributes and state (`ibv_query_qp`).
    pub fn query_qp(&self, qpn: Qpn) -> Result<(QpAttr, QpInit)> {
        let q = self.qps.get(&qpn).ok_or(VerbsError::NotFound {
            kind: "QP",
            handle: qpn.raw(),
        })?;
        let mut attr = q.attr;
        attr.qp_state = q.state;
        attr.cur_qp_state = q.state;
        attr.cap = q.cap;
        // Draining while WQEs that started before SQD are still outstanding;
        // WQEs that never started stay queued after the drain.
        attr.sq_draining = q.state == QpState::Sqd && q.req.sq.iter().any(|w| w.assigned);
        if rules::requester_active(q.state) {
            attr.sq_psn = q.req.psn;
        }
        Ok((
            attr,
            QpInit {
                pd: q.pd,
                qp_type: q.qp_type,
                send_cq: q.send_cq,
                recv_cq: q.recv_cq,
                srq: q.srq,
                cap: q.cap,
                sq_sig_all: q.sq_sig_all,
            },
        ))
    }

    /// Whether the QP runs selective repeat (both ends agreed through
    /// [`Engine::set_ece`]), or `None` for an unknown QP.
    pub fn qp_selective_repeat(&self, qpn: Qpn) -> Option<bool> {
        self.qps.get(&qpn).map(|q| q.ece.selective_repeat())
    }

    /// What the QP's congestion controller reports (rate cuts, current
    /// rate, CNPs asked for), or `None` for an unknown QP.
    pub fn qp_congestion(&self, qpn: Qpn) -> Option<crate::CcCounters> {
        self.qps.get(&qpn).map(|q| q.cc.counters())
    }

    /// `ibv_query_ece`: the ECE options the QP would offer (what this
    /// engine supports) before they are set, and those set afterwards.
    pub fn query_ece(&self, qpn: Qpn) -> Result<crate::sr::Ece> {
        let q = self.qps.get(&qpn).ok_or(VerbsError::NotFound {
            kind: "QP",
            handle: qpn.raw(),
        })?;
        Ok(
            if q.ece == crate::sr::Ece::default() && q.qp_type == QpType::Rc {
                crate::sr::Ece::SUPPORTED
            } else {
                q.ece
            },
        )
    }

    /// `ibv_set_ece`: the options both ends agreed to (`Ece::agree` of
    /// the two ends' `query_ece`), set before the QP reaches RTR. Only an
    /// RC QP takes options; an option this engine does not know, another
    /// vendor's or a QP past INIT is EINVAL. `Ece::default()` turns them off.
    pub fn set_ece(&mut self, qpn: Qpn, ece: crate::sr::Ece) -> Result<()> {
        let q = self.qp_mut(qpn)?;
        if ece != crate::sr::Ece::default() {
            let sup = crate::sr::Ece::SUPPORTED;
            if q.qp_type != QpType::Rc {
                return Err(VerbsError::inval("set_ece: only RC QPs take ECE options"));
            }
            if ece.vendor_id != sup.vendor_id || ece.options & !sup.options != 0 {
                return Err(VerbsError::inval(format!(
                    "set_ece: vendor {:#x} options {:#x} are not supported (vendor {:#x}, options {:#x})",
                    ece.vendor_id, ece.options, sup.vendor_id, sup.options
                )));
            }
        }
        if !matches!(q.state, QpState::Reset | QpState::Init) {
            return Err(VerbsError::inval(
                "set_ece: the options are set before the QP reaches RTR",
            ));
        }
        q.ece = ece;
        Ok(())
    }

    /// The QP's state.
    pub fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        self.qps.get(&qpn).map(|q| q.state)
    }

    /// Packets the QP has sent that its peer has not acknowledged yet (0
    /// for an unknown QP, and for UC and UD, which are never acknowledged).
    /// A driver may hold a new post's packets back for a batch while this
    /// is non-zero: the ACKs on their way bring progress back.
    pub fn unacked_packets(&self, qpn: Qpn) -> u32 {
        self.qps
            .get(&qpn)
            .filter(|q| rules::sends_requests_reliably(q.qp_type))
            .map_or(0, |q| q.req.psn.distance_from(q.comp.una))
    }

    /// `ibv_modify_qp`: validates the transition and attribute mask exactly
    /// as real verbs do, then applies it.
    pub fn modify_qp(
        &mut self,
        now: Instant,
        qpn: Qpn,
        attr: &QpAttr,
        mask: AttrMask,
    ) -> Result<()> {
        let limits = self.cfg.limits;
        let active_mtu = self.cfg.active_mtu;
        let dest = if mask.contains(AttrMask::AV) {
            Some(self.dest_of(&attr.ah_attr)?)
        } else {
            None
        };
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound {
            kind: "QP",
            handle: qpn.raw(),
        })?;
        let mask = crate::qp_attr::xrc_modify_mask(qp.qp_type, mask);
        let new = validate_modify(qp.qp_type, qp.state, attr, mask, &limits)?;
        if mask.contains(AttrMask::PATH_MTU) && attr.path_mtu.bytes() > active_mtu.bytes() {
            return Err(VerbsError::inval(format!(
                "modify_qp: PATH_MTU {} exceeds the port's active MTU {}",
                attr.path_mtu.bytes(),
                active_mtu.bytes()
            )));
        }
        let a = &mut qp.attr;
        macro_rules! take {
            ($($m:ident => $f:ident),*) => {$( if mask.contains(AttrMask::$m) { a.$f = attr.$f; } )*};
        }
        take!(ACCESS_FLAGS => qp_access_flags, PKEY_INDEX => pkey_index, PORT => port_num,
              QKEY => qkey, AV => ah_attr, PATH_MTU => path_mtu, TIMEOUT => timeout,
              RETRY_CNT => retry_cnt, RNR_RETRY => rnr_retry, RQ_PSN => rq_psn,
              MAX_QP_RD_ATOMIC => max_rd_atomic, MIN_RNR_TIMER => min_rnr_timer,
              SQ_PSN => sq_psn, MAX_DEST_RD_ATOMIC => max_dest_rd_atomic, DEST_QPN => dest_qp_num);
        if mask.contains(AttrMask::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }
        if let Some(d) = dest {
            qp.dest = Some(d);
        }
        if mask.contains(AttrMask::PATH_MTU) {
            qp.mtu = attr.path_mtu.bytes();
        }
        if mask.contains(AttrMask::RQ_PSN) {
            qp.resp.epsn = attr.rq_psn;
        }
        if mask.contains(AttrMask::SQ_PSN) {
            let p: Psn = attr.sq_psn;
            qp.req.psn = p;
            qp.comp.una = p;
            qp.req.high = p;
            qp.req.records.clear();
        }
        if mask.contains(AttrMask::RETRY_CNT) {
            qp.comp.retry_left = attr.retry_cnt;
        }
        if mask.contains(AttrMask::RNR_RETRY) {
            qp.comp.rnr_retry_left = attr.rnr_retry;
        }
        let old = qp.state;
        // The requests its held ACK covers were executed and completed:
        // the peer hears of them before the responder stops (RESET and
        // ERR send nothing more; rdma_disconnect moves a QP to ERR).
        if matches!(new, QpState::Reset | QpState::Err) {
            self.build_held_ack(qpn);
        }
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return Err(VerbsError::NotFound {
                kind: "QP",
                handle: qpn.raw(),
            });
        };
        match new {
            QpState::Reset => {
                qp.reset();
                // Its completions still in its CQs go too, as mlx4/mlx5 clean
                // the CQs when a QP is reset: the next connection's
                // completions are not preceded by the old one's flushes.
                for cq in [qp.send_cq, qp.recv_cq] {
                    self.res.forget_completions(cq, qpn);
                }
                // A fresh controller: nothing it learnt applies to the next connection.
                qp.cc = self.cfg.congestion.build(&CongestionQp {
                    qpn,
                    qp_type: qp.qp_type,
                    max_inflight: self.cfg.max_inflight,
                });
            }
            QpState::Err if old != QpState::Err => qp.enter_error(&mut self.res, false),
            QpState::Sqd => {
                qp.state = new;
                qp.req.drained_notified = false;
            }
            _ => qp.state = new,
        }
        qp.attr.qp_state = qp.state;
        self.after(qpn, now);
        push_change(&mut self.changes, ResourceChange::QpModified { qpn });
        Ok(())
    }

    // ----- posting work -----

    /// `ibv_post_send` for one WR.
    pub fn post_send(&mut self, now: Instant, qpn: Qpn, wr: &SendWr) -> Result<()> {
        // Posting starts no timer: the first transmission arms the ACK timer.
        let _ = now;
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound {
            kind: "QP",
            handle: qpn.raw(),
        })?;
        let len = rules::check_post_send(qp.qp_type, qp.state, &qp.cap, qp.req.sq.len(), wr)
            .map_err(|e| post_send_error(e, qpn, qp, wr))?;
        let inline = if wr.flags.contains(crate::wr::SendFlags::INLINE)
            && !wr.op.is_read_or_atomic()
        {
            if len > u64::from(qp.cap.max_inline_data) {
                return Err(VerbsError::inval(format!(
                    "post_send: inline data of {len} bytes exceeds max_inline_data {}",
                    qp.cap.max_inline_data
                )));
            }
            let mut data = vec![0u8; len as usize];
            if self.res.gather(&wr.sg_list, qp.pd, 0, &mut data).is_err() {
                return Err(VerbsError::inval(
                    "post_send: inline data must come from a registered region (use post_send_inline for raw bytes)",
                ));
            }
            Some(data.into_boxed_slice())
        } else {
            None
        };
        enqueue_send(
            qp,
            &mut self.ready,
            &mut self.timers,
            &mut self.res,
            wr,
            inline,
            len,
        );
        Ok(())
    }

    /// `ibv_post_send` with IBV_SEND_INLINE where the driver already copied
    /// the bytes out of application memory.
    pub fn post_send_inline(
        &mut self,
        now: Instant,
        qpn: Qpn,
        wr: &SendWr,
        data: &[u8],
    ) -> Result<()> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::NotFound {
            kind: "QP",
            handle: qpn.raw(),
        })?;
        if data.len() as u64 > u64::from(qp.cap.max_inline_data) {
            return Err(VerbsError::inval(format!(
                "post_send: inline data of {} bytes exceeds max_inline_data {}",
                data.len(),
                qp.cap.max_inline_data
            )));
        }
        if wr.op.is_read_or_atomic() {
            return Err(VerbsError::inval(format!(
                "post_send: {} cannot be inline",
                wr.op.name()
            )));
        }
        let mut plain = wr.clone();
        plain.sg_list.clear();
        plain.flags = crate::wr::SendFlags(wr.flags.0 & !crate::wr::SendFlags::INLINE.0);
        // Reuse every check of post_send on an SGE-less copy, then attach the data.
        self.post_send(now, qpn, &plain)?;
        let qp = self.qp_mut(qpn)?;
        if let Some(w) = qp.req.sq.back_mut() {
            w.len = data.len() as u64;
            w.inline = Some(data.into());
        }
        Ok(())
    }

    /// `ibv_post_recv` for one WR.
    pub fn post_recv(&mut self, qpn: Qpn, wr: &RecvWr) -> Result<()> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound {
            kind: "QP",
            handle: qpn.raw(),
        })?;
        if !rules::has_recv_queue(qp.qp_type) {
            return Err(VerbsError::inval(format!(
                "post_recv: QP {qpn:#x} is an {} QP and has no receive queue",
                qp.qp_type
            )));
        }
        if qp.srq.is_some() {
            return Err(VerbsError::inval(format!(
                "post_recv: QP {qpn:#x} uses an SRQ; post to the SRQ"
            )));
        }
        if !rules::can_post_recv(qp.state) {
            return Err(VerbsError::inval(format!(
                "post_recv: QP {qpn:#x} is in state {}",
                qp.state
            )));
        }
        if wr.sg_list.len() > qp.cap.max_recv_sge as usize {
            return Err(VerbsError::inval(format!(
                "post_recv: num_sge {} exceeds the QP's max_recv_sge {}",
                wr.sg_list.len(),
                qp.cap.max_recv_sge
            )));
        }
        if qp.rq.len() >= qp.cap.max_recv_wr as usize {
            return Err(VerbsError::NoMemory(format!(
                "post_recv: receive queue of QP {qpn:#x} is full ({} WRs)",
                qp.cap.max_recv_wr
            )));
        }
        if rules::posted_recvs_flush(qp.state) {
            let wc = WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn);
            let cq = qp.recv_cq;
            self.res.complete(cq, wc);
            return Ok(());
        }
        qp.rq.push_back(RecvWqe {
            wr_id: wr.wr_id,
            sges: wr.sg_list.clone(),
        });
        Ok(())
    }

    // ----- the network and the clock -----

    /// A UDP datagram arrived at this device: `ep.src` is the sender, `ep.dst`
    /// this device. Bad ICRCs, malformed packets and strays are counted and dropped.
    pub fn handle_packet(&mut self, now: Instant, ep: Endpoints, data: &[u8]) {
        self.handle_packet_meta(now, ep, RxMeta::default(), data)
    }

    /// [`Engine::handle_packet`] with what the IP header said about the
    /// packet (a port that reads the TOS byte passes its ECN bits).
    pub fn handle_packet_meta(&mut self, now: Instant, ep: Endpoints, meta: RxMeta, data: &[u8]) {
        if meta.ecn == softrdma_wire::Ecn::Ce {
            self.res.counters.ecn_ce_rcvd += 1;
        }
        self.res.counters.rx_packets += 1;
        self.res.counters.rx_bytes += data.len() as u64;
        if let Err(e) = icrc::verify(&ep, data) {
            if !matches!(e, softrdma_wire::Error::IcrcMismatch { .. }) {
                self.res.counters.malformed += 1;
                return;
            }
            // A UDP socket does not show the IPv4 header: a sender that uses
            // non-zero IP IDs (Linux rxe does) needs the ID recovered.
            let recovered = if self.cfg.recover_ipv4_id {
                icrc::recover_ipv4_id(&ep, data)
            } else {
                None
            };
            match recovered {
                Some(id) if id != 0 => self.res.counters.icrc_ip_id_recovered += 1,
                _ => {
                    self.res.counters.icrc_errors += 1;
                    return;
                }
            }
        }
        let pkt = match PacketRepr::parse(data) {
            Ok(p) => p,
            Err(_) => {
                self.res.counters.malformed += 1;
                return;
            }
        };
        let info = pkt.bth.opcode.info();
        if info.transport == Transport::Cnp {
            self.res.counters.cnp_rcvd += 1;
            self.handle_cnp(now, ep, &pkt);
            return;
        }
        if pkt.bth.dest_qp == softrdma_wire::mad::GSI_QPN {
            self.gsi.receive(&mut self.res.counters, ep.src, &pkt);
            return;
        }
        match crate::rules::is_mcast_datagram(pkt.bth.dest_qp, ep.dst.ip()) {
            Some(false) => {
                let local_ip = self.cfg.local.ip();
                let qpn = Qpn::from_raw(pkt.bth.dest_qp);
                self.deliver(now, qpn, ep, meta, &pkt, data.len(), local_ip);
            }
            Some(true) => {
                // Every QP of this device attached to the group gets it.
                let group = ep.dst.ip();
                let mut members = std::mem::take(&mut self.mcast_rx);
                self.mcast.members(group, &mut members);
                if members.is_empty() {
                    self.res.counters.dropped += 1;
                }
                for &qpn in &members {
                    self.deliver(now, qpn, ep, meta, &pkt, data.len(), group);
                }
                self.mcast_rx = members;
            }
            // The multicast DQPN to a unicast address, or a unicast DQPN
            // to a group: no conforming sender makes either.
            None => self.res.counters.dropped += 1,
        }
    }

    /// A packet for QP `qpn`, which received it at `local` (this device's
    /// address, or the multicast group it was sent to).
    #[allow(clippy::too_many_arguments)]
    fn deliver(
        &mut self,
        now: Instant,
        qpn: Qpn,
        ep: Endpoints,
        meta: RxMeta,
        pkt: &PacketRepr<'_>,
        len: usize,
        local_ip: std::net::IpAddr,
    ) {
        let info = pkt.bth.opcode.info();
        let Some(qp) = self.qps.get_mut(&qpn) else {
            self.res.counters.dropped += 1;
            return;
        };
        qp.counters.rx_packets += 1;
        qp.counters.rx_bytes += len as u64;
        let connected_peer_ok =
            qp.qp_type == QpType::Ud || qp.dest.is_some_and(|d| d.ip() == ep.src.ip());
        if info.transport != transport_of(qp.qp_type) || !connected_peer_ok {
            qp.counters.dropped += 1;
            self.res.counters.dropped += 1;
            return;
        }
        // IBTA P_Key check, on requests and responses alike, before the QP
        // sees anything of the packet.
        if !pkey_matches(pkt.bth.pkey, qp.pkey()) {
            qp.counters.pkey_violations += 1;
            self.res.counters.pkey_violations += 1;
            return;
        }
        // Every packet the QP accepts tells its controller how congested
        // the path was (the notification point may answer with a CNP).
        if qp.cc.on_ecn(now, meta.ecn) == EcnAction::SendCnp && qp.qp_type != QpType::Ud {
            qp.cnp_due = true;
        }
        if info.is_request {
            qp.handle_request(&mut self.res, pkt, ep.src, local_ip);
        } else if info.kind != OpKind::Cnp {
            qp.handle_response(&mut self.res, pkt, now);
        }
        settle(qp, &mut self.ready, &mut self.timers, &mut self.res, true);
    }

    /// A CNP (already counted): the controller of the QP it names learns
    /// of congestion on the path to its peer, if it came from that peer.
    fn handle_cnp(&mut self, now: Instant, ep: Endpoints, pkt: &PacketRepr<'_>) {
        let Some(qp) = self.qps.get_mut(&Qpn::from_raw(pkt.bth.dest_qp)) else {
            return;
        };
        let from_peer = qp.qp_type != QpType::Ud && qp.dest.is_some_and(|d| d.ip() == ep.src.ip());
        if !from_peer || !pkey_matches(pkt.bth.pkey, qp.pkey()) {
            return;
        }
        qp.counters.cnp_rcvd += 1;
        qp.cc.on_cnp(now);
        settle(qp, &mut self.ready, &mut self.timers, &mut self.res, true);
    }

    /// Runs every timer that is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&Reverse((t, qpn))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            if qp.timer_registered != Some(t) {
                continue;
            }
            qp.timer_registered = None;
            if qp.timers.expired(Timer::AckDelay, now) {
                qp.ack_due();
            }
            // The QP is scheduled below: a paced request may go now.
            if qp.timers.expired(Timer::Pacing, now) {
                qp.timers.stop(Timer::Pacing);
            }
            if qp.timers.expired(Timer::Congestion, now) {
                qp.cc.on_timer(now);
            }
            qp.handle_completer_timeout(&mut self.res, now);
            self.after(qpn, now);
        }
    }

    /// When `handle_timeout` must next be called.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        while let Some(&Reverse((t, qpn))) = self.timers.peek() {
            match self.qps.get(&qpn) {
                Some(q) if q.timer_registered == Some(t) => return Some(t),
                _ => {
                    self.timers.pop();
                }
            }
        }
        None
    }

    /// Sends every held ACK with the next transmissions (a driver closing
    /// the device calls this, then drains `poll_transmit`).
    pub fn release_held_acks(&mut self) {
        let held: Vec<Qpn> = self
            .qps
            .iter()
            .filter(|(_, q)| q.resp.ack_hold != AckHold::None)
            .map(|(&n, _)| n)
            .collect();
        for qpn in held {
            if let Some(qp) = self.qps.get_mut(&qpn) {
                qp.ack_due();
            }
            self.after(qpn, Instant(0));
        }
    }

    /// Builds the ACK `qpn` holds back, if any, into `parting`: the QP is
    /// about to lose its responder state.
    fn build_held_ack(&mut self, qpn: Qpn) {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        if qp.resp.ack_hold == AckHold::None {
            return;
        }
        qp.ack_due();
        let mut buf = vec![0u8; 256];
        let mut ctx = TxCtx {
            buf: &mut buf,
            local: self.cfg.local,
            ack_req_every: self.cfg.ack_req_every,
            ack_delay_ns: 0,
            hold_needs_answer: false,
            now: Instant(0),
            gather: false,
        };
        if let Some(t) = qp.next_response(&mut self.res, &mut ctx) {
            buf.truncate(t.len);
            self.parting.push_back((t, buf));
        }
    }

    /// Writes the next packet to send into `buf` (at least 4096 + 64 bytes).
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        self.poll_transmit_inner(now, buf, false)
    }

    /// Like [`Self::poll_transmit`], but a request's payload that lies in
    /// one SGE of a region with a [`crate::RegionMemory::tx_addr`] stays
    /// there: the packet is `buf` with the hole that
    /// [`Transmit::payload`] describes filled from that address (headers,
    /// pad and an ICRC over the whole packet are in `buf`). The driver
    /// sends the pieces as one datagram (a gathering `sendmsg`) and so
    /// copies the payload once, into the kernel, instead of twice.
    pub fn poll_transmit_gather(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        self.poll_transmit_inner(now, buf, true)
    }

    /// Fills the hole of a packet from [`Self::poll_transmit_gather`]
    /// with its payload, copied out of the region (for paths that need
    /// the packet whole: captures, shared-memory rings). `buf` is the
    /// buffer `t` was built in. False (and nothing copied) when `t` has no
    /// payload by reference, the region is gone, or `buf` is too short.
    pub fn copy_payload(&self, t: &Transmit, buf: &mut [u8]) -> bool {
        let Some(p) = t.payload else { return false };
        let Some(mr) = self.res.mrs.get(&p.lkey) else {
            return false;
        };
        let Some(dst) = buf.get_mut(p.offset..p.offset + p.len) else {
            return false;
        };
        if p.region_offset
            .checked_add(p.len)
            .is_none_or(|e| e > mr.mem.len())
        {
            return false;
        }
        mr.mem.read(p.region_offset, dst);
        true
    }

    fn poll_transmit_inner(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        gather: bool,
    ) -> Option<Transmit> {
        if let Some((t, bytes)) = self.parting.pop_front().or_else(|| self.gsi.poll_tx()) {
            if let Some(dst) = buf.get_mut(..bytes.len()) {
                dst.copy_from_slice(&bytes);
                return Some(t);
            }
        }
        while let Some(&qpn) = self.ready.front() {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                self.ready.pop_front();
                continue;
            };
            let mut ctx = TxCtx {
                buf: &mut *buf,
                local: self.cfg.local,
                ack_req_every: self.cfg.ack_req_every,
                ack_delay_ns: self.cfg.ack_delay_ns,
                hold_needs_answer: self.cfg.ack_delay_answering_only,
                now,
                gather,
            };
            // With held ACKs on, a lone ACK always follows a request that
            // is ready with it, whether its hold has run out unseen or not:
            // the peer then receives the request with (or before) the ACK
            // it polls for — in one datagram with GSO — and never the ACK
            // alone first (an application that stops polling at that
            // completion and spins on memory would leave the request to a
            // background thread's wake-up).
            let ack_last = ctx.ack_delay_ns > 0 && qp.lone_plain_ack() && !qp.ack_is_due();
            let tx = qp
                .next_cnp(&mut self.res, &mut ctx)
                .or_else(|| {
                    (!ack_last)
                        .then(|| qp.next_response(&mut self.res, &mut ctx))
                        .flatten()
                })
                .or_else(|| {
                    let t = qp.next_request(&mut self.res, &mut ctx);
                    if t.is_some() {
                        qp.resp.answered = true;
                        // A held ACK follows this request out, in the same batch.
                        qp.ack_due();
                        if ack_last {
                            qp.ack_follows();
                        }
                    }
                    t
                })
                .or_else(|| {
                    ack_last
                        .then(|| qp.next_response(&mut self.res, &mut ctx))
                        .flatten()
                });
            self.ready.pop_front();
            match tx {
                Some(t) => {
                    // Round robin: the QP goes to the back while it has more to send.
                    self.ready.push_back(qpn);
                    settle(qp, &mut self.ready, &mut self.timers, &mut self.res, false);
                    return Some(t);
                }
                None => {
                    qp.scheduled = false;
                    settle(qp, &mut self.ready, &mut self.timers, &mut self.res, false);
                }
            }
        }
        None
    }

    /// The next asynchronous event or completion notification.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.res.events.pop_front()
    }

    /// Bookkeeping after anything touched a QP: schedule it for transmission,
    /// register its timer, raise SQ drained.
    fn after(&mut self, qpn: Qpn, now: Instant) {
        self.after_inner(qpn, now, true);
    }

    fn after_inner(&mut self, qpn: Qpn, _now: Instant, schedule: bool) {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        settle(
            qp,
            &mut self.ready,
            &mut self.timers,
            &mut self.res,
            schedule,
        );
    }
}

/// The IBTA P_Key match rule: the low 15 bits equal and not zero (0x0000
/// and 0x8000 are the invalid P_Key), and at least one of the two a full
/// member (bit 15 set). Two limited members cannot talk to each other.
pub(crate) fn pkey_matches(a: u16, b: u16) -> bool {
    let key = a & 0x7FFF;
    key != 0 && key == b & 0x7FFF && (a | b) & 0x8000 != 0
}

/// The error `post_send` returns for a WR that [`rules::check_post_send`] refused.
fn post_send_error(e: PostSendError, qpn: Qpn, qp: &Qp, wr: &SendWr) -> VerbsError {
    match e {
        PostSendError::State => VerbsError::inval(format!(
            "post_send: QP {qpn:#x} is in state {}; sends need RTS (or SQD)",
            qp.state
        )),
        PostSendError::OpNotSupported => VerbsError::inval(format!(
            "post_send: opcode {} is not supported on a {} QP",
            wr.op.name(),
            qp.qp_type
        )),
        PostSendError::TooManySges => VerbsError::inval(format!(
            "post_send: num_sge {} exceeds the QP's max_send_sge {}",
            wr.sg_list.len(),
            qp.cap.max_send_sge
        )),
        PostSendError::QueueFull => VerbsError::NoMemory(format!(
            "post_send: send queue of QP {qpn:#x} is full ({} WRs)",
            qp.cap.max_send_wr
        )),
        PostSendError::UdWithoutDest => {
            VerbsError::inval("post_send: a UD send needs wr.ud (ah, remote_qpn, remote_qkey)")
        }
        PostSendError::AtomicSges => {
            VerbsError::inval("post_send: atomics need exactly one 8-byte SGE")
        }
        PostSendError::XrcWithoutSrqn => VerbsError::inval(format!(
            "post_send: a WR on XRC initiator QP {qpn:#x} needs the remote XRC SRQ number (24 bits), not {:?}",
            wr.xrc_srqn
        )),
    }
}

/// `Engine::after` for a QP already at hand (sparing the lookup by QPN).
fn settle(
    qp: &mut Qp,
    ready: &mut VecDeque<Qpn>,
    timers: &mut BinaryHeap<Reverse<(Instant, Qpn)>>,
    res: &mut Resources,
    schedule: bool,
) {
    let qpn = qp.qpn;
    debug_assert!(
        !rules::sends_requests_reliably(qp.qp_type)
            || !rules::requester_active(qp.state)
            || qp.req.records.cover(qp.comp.una, qp.req.high),
        "QP {qpn:#x}: the send records do not cover [una {:?}, high {:?})",
        qp.comp.una,
        qp.req.high
    );
    if schedule && !qp.scheduled {
        qp.scheduled = true;
        ready.push_back(qpn);
    }
    if qp.state == QpState::Sqd && !qp.req.drained_notified && qp.req.sq.iter().all(|w| !w.assigned)
    {
        qp.req.drained_notified = true;
        if qp.attr.en_sqd_async_notify {
            res.events.push_back(Event::SqDrained { qpn });
        }
    }
    let cc_timer = qp.cc.timeout();
    qp.timers.set_opt(Timer::Congestion, cc_timer);
    let d = qp.deadline();
    if d != qp.timer_registered {
        qp.timer_registered = d;
        if let Some(t) = d {
            timers.push(Reverse((t, qpn)));
        }
    }
}

/// Queues a send WQE on `qp` (whose checks `post_send` made).
fn enqueue_send(
    qp: &mut Qp,
    ready: &mut VecDeque<Qpn>,
    timers: &mut BinaryHeap<Reverse<(Instant, Qpn)>>,
    res: &mut Resources,
    wr: &SendWr,
    inline: Option<Box<[u8]>>,
    len: u64,
) {
    let w = SendWqe {
        wr_id: wr.wr_id,
        op: wr.op,
        sges: if inline.is_some() {
            SgeList::Many(Vec::new())
        } else {
            SgeList::new(&wr.sg_list)
        },
        inline,
        len,
        flags: wr.flags,
        signaled: rules::wr_signaled(qp.sq_sig_all, wr.flags),
        ud: wr.ud.map(|u| (u.ah, u.remote_qpn, u.remote_qkey)),
        serial: qp.req.next_serial,
        assigned: false,
        first_psn: Psn::new(0),
        npkts: 0,
        read_done: 0,
        xrc_srqn: wr.xrc_srqn.unwrap_or(0),
    };
    qp.req.sq.push_back(w);
    qp.req.next_serial += 1;
    if rules::posted_sends_flush(qp.state) {
        // Real HCAs accept the post and flush it at once.
        qp.flush_sq(res);
    }
    settle(qp, ready, timers, res, true);
}

/// The access rules of `ibv_reg_mr` (and `ibv_rereg_mr`).
fn check_mr_access(access: AccessFlags) -> Result<()> {
    let known = AccessFlags::LOCAL_WRITE.bits()
        | AccessFlags::REMOTE_WRITE.bits()
        | AccessFlags::REMOTE_READ.bits()
        | AccessFlags::REMOTE_ATOMIC.bits()
        // Memory windows may be bound to the region (rules::check_bind).
        | AccessFlags::MW_BIND.bits()
        // The memory behind the region pages on demand
        // (RegionMemory::resolve); the rules are the same.
        | AccessFlags::ON_DEMAND.bits();
    if access.bits() & !known & 0xFFFF != 0 {
        return Err(VerbsError::inval(format!(
            "reg_mr: access flags {:#x} include unsupported bits {:#x}",
            access.bits(),
            access.bits() & !known & 0xFFFF
        )));
    }
    // IBTA: remote write or atomic access requires local write.
    if (access.contains(AccessFlags::REMOTE_WRITE) || access.contains(AccessFlags::REMOTE_ATOMIC))
        && !access.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(VerbsError::inval(
            "reg_mr: REMOTE_WRITE and REMOTE_ATOMIC access require LOCAL_WRITE",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::pkey_matches;

    #[test]
    fn pkey_match_rule() {
        // Same partition, at least one full member.
        assert!(pkey_matches(0xFFFF, 0xFFFF));
        assert!(pkey_matches(0x7FFF, 0xFFFF));
        assert!(pkey_matches(0xFFFF, 0x7FFF));
        assert!(pkey_matches(0x9234, 0x1234));
        // Two limited members never talk.
        assert!(!pkey_matches(0x7FFF, 0x7FFF));
        // Another partition.
        assert!(!pkey_matches(0x1234, 0xFFFF));
        assert!(!pkey_matches(0xFFFE, 0xFFFF));
        // The invalid P_Key matches nothing, not even itself.
        assert!(!pkey_matches(0x0000, 0x8000));
        assert!(!pkey_matches(0x8000, 0x8000));
    }
}
