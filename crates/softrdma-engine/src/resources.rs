//! The verbs objects other than QPs: protection domains, memory regions,
//! completion queues, shared receive queues and address handles, plus the
//! engine's counters and event queue. QPs borrow this table mutably while
//! they run, which keeps the transport code free of lookups through `self`.

use std::collections::VecDeque;

use crate::fasthash::{KeyMap, KeySet};
use crate::handle::{AhHandle, CqHandle, Lkey, MwHandle, PdHandle, Qpn, Rkey, SrqHandle};
use std::net::SocketAddr;
use std::sync::Arc;

use crate::counters::Counters;
use crate::error::{Result, VerbsError};
use crate::memory::RegionMemory;
use crate::qp_attr::{AccessFlags, AhAttr};
use crate::rng::{Purpose, SecretRng};
use crate::rules::{self, KeyTarget, RegionView, WindowBound, WindowView};
use crate::wr::{MwType, Sge, WcStatus, WorkCompletion};

/// A change to a QP or a region that a driver publishing them to peers
/// must follow ([`crate::Engine::poll_change`]): the engine's rules answer
/// differently for them from now on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceChange {
    /// `modify_qp` succeeded on the QP.
    QpModified { qpn: Qpn },
    /// The QP was destroyed.
    QpDestroyed { qpn: Qpn },
    /// A region was registered.
    MrRegistered { rkey: Rkey },
    /// A region was deregistered.
    MrDeregistered { rkey: Rkey },
    /// More changes happened than the queue holds (nobody took them):
    /// anything may have changed.
    Lost,
}

/// Changes kept for [`crate::Engine::poll_change`]; past this the queue
/// collapses to one [`ResourceChange::Lost`], so an engine whose driver
/// never asks (the simulator, a fuzz target) does not grow without bound.
pub(crate) const MAX_CHANGES: usize = 256;

/// Queues `c` in `q`, bounded by [`MAX_CHANGES`].
pub(crate) fn push_change(q: &mut VecDeque<ResourceChange>, c: ResourceChange) {
    if q.len() >= MAX_CHANGES {
        q.clear();
        q.push_back(ResourceChange::Lost);
    }
    if q.back() != Some(&ResourceChange::Lost) {
        q.push_back(c);
    }
}

/// An asynchronous event, as `ibv_get_async_event` and completion channels report them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A completion arrived on a CQ that was armed with `req_notify_cq`.
    Completion { cq: CqHandle },
    /// A CQ overflowed: the completion was lost (`IBV_EVENT_CQ_ERR`).
    CqOverrun { cq: CqHandle },
    /// A QP entered the error state because of a transport or local error
    /// (`IBV_EVENT_QP_FATAL`, `..._REQ_ERR`, `..._ACCESS_ERR`).
    QpFatal { qpn: Qpn },
    /// A QP in SQD has no more outstanding send work (`IBV_EVENT_SQ_DRAINED`).
    SqDrained { qpn: Qpn },
    /// A QP on an SRQ entered the error state and will take no more WQEs
    /// (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    LastWqeReached { qpn: Qpn },
    /// An SRQ dropped below its limit (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    SrqLimitReached { srq: SrqHandle },
}

/// A registered memory region.
pub(crate) struct Mr {
    pub pd: PdHandle,
    pub iova: u64,
    pub len: u64,
    pub access: AccessFlags,
    pub mem: Arc<dyn RegionMemory>,
    pub lkey: Lkey,
    pub rkey: Rkey,
}

impl Mr {
    /// The region as the rules see it.
    pub fn view(&self) -> RegionView {
        RegionView {
            pd: self.pd,
            access: self.access,
            iova: self.iova,
            len: self.len,
        }
    }
}

/// A memory window: its index is its [`MwHandle`] and the upper 24 bits
/// of every rkey it has.
pub(crate) struct Mw {
    pub pd: PdHandle,
    pub mw_type: MwType,
    /// Its rkey now: `index << 8 | key`.
    pub rkey: Rkey,
    /// Type 2: the QP it was bound through, while bound.
    pub qp: Option<Qpn>,
    /// While bound: the region (lkey) and what the bind gave.
    pub bound: Option<(Lkey, WindowBound)>,
}

impl Mw {
    /// The window as the rules see it.
    pub fn view(&self) -> WindowView {
        WindowView {
            pd: self.pd,
            mw_type: self.mw_type,
            qp: self.qp,
            bound: self.bound.map(|(_, b)| b),
        }
    }
}

/// The keys of a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrKeys {
    pub lkey: Lkey,
    pub rkey: Rkey,
}

/// Whether and how a CQ asks for a completion event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notify {
    Off,
    Next,
    Solicited,
}

impl Notify {
    /// Whether completion `wc` raises the event of a CQ armed this way: any
    /// completion for `Next`; for `Solicited`, a solicited one or an error
    /// (`ibv_req_notify_cq(3)`).
    fn fires_for(self, wc: &WorkCompletion) -> bool {
        match self {
            Notify::Off => false,
            Notify::Next => true,
            Notify::Solicited => wc.solicited || !wc.status.is_ok(),
        }
    }
}

pub(crate) struct Cq {
    pub depth: usize,
    pub entries: VecDeque<WorkCompletion>,
    pub notify: Notify,
    /// How many of the last entries came in with no event (the CQ was
    /// not armed for them). Always the newest ones: an event covers every
    /// entry in the CQ.
    pub quiet: usize,
    pub overrun: bool,
    pub users: u32,
}

/// A receive WQE: where an incoming SEND (or the immediate of a WRITE) goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub sges: Vec<Sge>,
}

impl RecvWqe {
    pub fn capacity(&self) -> u64 {
        self.sges.iter().map(|s| u64::from(s.length)).sum()
    }
}

pub(crate) struct Srq {
    pub pd: PdHandle,
    /// An XRC SRQ's domain and the CQ its receives complete on.
    pub xrc: Option<(crate::handle::XrcdHandle, CqHandle)>,
    pub wqes: VecDeque<RecvWqe>,
    pub max_wr: u32,
    pub max_sge: u32,
    pub limit: u32,
    pub users: u32,
}

pub(crate) struct Ah {
    pub pd: PdHandle,
    #[allow(dead_code)] // kept for query_ah
    pub attr: AhAttr,
    pub dest: SocketAddr,
}

/// How many recently freed keys are kept out of reuse.
const KEY_QUARANTINE: usize = 4096;
/// How many recently destroyed QPs' numbers are kept out of reuse.
const QPN_QUARANTINE: usize = 256;

/// The last `cap` values retired, kept out of reuse: a value stays in until
/// `cap` newer ones have been retired.
pub(crate) struct Quarantine {
    cap: usize,
    order: VecDeque<u32>,
    members: KeySet<u32>,
}

impl Quarantine {
    pub fn new(cap: usize) -> Self {
        Quarantine {
            cap,
            order: VecDeque::new(),
            members: KeySet::default(),
        }
    }

    pub fn contains(&self, v: u32) -> bool {
        self.members.contains(&v)
    }

    pub fn retire(&mut self, v: u32) {
        if self.order.len() == self.cap {
            // A value cannot be handed out again while it is in here, so it
            // is never in the queue twice.
            if let Some(old) = self.order.pop_front() {
                self.members.remove(&old);
            }
        }
        self.order.push_back(v);
        self.members.insert(v);
    }
}

/// Everything but the QPs.
pub(crate) struct Resources {
    pub pds: KeyMap<PdHandle, u32>, // pd -> users
    /// XRC domains -> users (XRC SRQs and target QPs).
    pub xrcds: KeyMap<crate::handle::XrcdHandle, u32>,
    pub mrs: KeyMap<Lkey, Mr>,
    pub rkeys: KeyMap<Rkey, Lkey>,
    /// Memory windows by index (the upper 24 bits of their rkeys).
    pub mws: KeyMap<MwHandle, Mw>,
    pub cqs: KeyMap<CqHandle, Cq>,
    pub srqs: KeyMap<SrqHandle, Srq>,
    pub ahs: KeyMap<AhHandle, Ah>,
    pub events: VecDeque<Event>,
    /// CQs armed now (`Notify` other than `Off`), for `Engine::armed_cqs`.
    pub armed_cqs: usize,
    pub counters: Counters,
    /// lkeys and rkeys (ChaCha20).
    key_rng: SecretRng,
    /// QP numbers (ChaCha20, another stream).
    qpn_rng: SecretRng,
    next_handle: u32,
    key_quarantine: Quarantine,
    qpn_quarantine: Quarantine,
    /// Window indexes recently freed.
    mw_quarantine: Quarantine,
}

/// Why a local scatter/gather access failed.
pub(crate) type SgeResult<T> = core::result::Result<T, WcStatus>;

impl Resources {
    /// Resources whose keys and QPNs come from ChaCha20 under `secret_seed`.
    pub fn new(secret_seed: [u8; 32]) -> Self {
        Resources {
            pds: KeyMap::default(),
            xrcds: KeyMap::default(),
            mrs: KeyMap::default(),
            rkeys: KeyMap::default(),
            mws: KeyMap::default(),
            cqs: KeyMap::default(),
            srqs: KeyMap::default(),
            ahs: KeyMap::default(),
            events: VecDeque::new(),
            armed_cqs: 0,
            counters: Counters::default(),
            key_rng: SecretRng::new(secret_seed, Purpose::MemoryKeys),
            qpn_rng: SecretRng::new(secret_seed, Purpose::Qpns),
            next_handle: 1,
            key_quarantine: Quarantine::new(KEY_QUARANTINE),
            qpn_quarantine: Quarantine::new(QPN_QUARANTINE),
            mw_quarantine: Quarantine::new(QPN_QUARANTINE),
        }
    }

    pub fn handle(&mut self) -> u32 {
        let h = self.next_handle;
        self.next_handle = self.next_handle.wrapping_add(1).max(1);
        h
    }

    /// A fresh random key from the CSPRNG: non-zero, unused, and not freed
    /// recently, so that a stale or guessed key does not reach a new region
    /// and seen keys tell nothing about the others.
    pub fn new_key(&mut self) -> u32 {
        loop {
            let k = self.key_rng.next_u32();
            if k != 0
                && !self.mrs.contains_key(&Lkey::from_raw(k))
                && !self.rkeys.contains_key(&Rkey::from_raw(k))
                && !self.key_quarantine.contains(k)
                && !self.mws.contains_key(&MwHandle::from_raw(k >> 8))
                && !self.mw_quarantine.contains(k >> 8)
            {
                return k;
            }
        }
    }

    /// A fresh random window index (24 bits, not 0) from the CSPRNG: no
    /// window has it, no region's rkey starts with it (so an rkey names a
    /// region or a window, never both, whatever key byte a bind gives the
    /// window), and it was not freed recently. Returns the index and a
    /// random first key byte.
    pub fn new_mw_index(&mut self) -> (u32, u8) {
        loop {
            let r = self.key_rng.next_u32();
            let index = r >> 8;
            if index != 0
                && !self.mws.contains_key(&MwHandle::from_raw(index))
                && !self.mw_quarantine.contains(index)
                && !self.rkeys.keys().any(|k| k.raw() >> 8 == index)
            {
                return (index, r as u8);
            }
        }
    }

    pub fn retire_mw_index(&mut self, index: u32) {
        self.mw_quarantine.retire(index);
    }

    /// The window whose rkey is exactly `rkey`.
    pub fn mw_by_rkey(&self, rkey: Rkey) -> Option<&Mw> {
        self.mws
            .get(&MwHandle::from_raw(rkey.raw() >> 8))
            .filter(|w| w.rkey == rkey)
    }

    /// Executes a bind of window `mw` to the new `rkey` and `bind`, posted
    /// on the QP `qpn` of PD `qp_pd`, after [`rules::check_bind`].
    pub fn bind_mw(
        &mut self,
        qp_pd: PdHandle,
        qpn: Qpn,
        mw: MwHandle,
        rkey: Rkey,
        bind: &crate::wr::MwBind,
    ) -> core::result::Result<(), rules::BindDenied> {
        let window = self.mws.get(&mw).map(Mw::view);
        let region = match bind.mr {
            Some(k) if bind.length > 0 => self.mrs.get(&k).map(Mr::view),
            _ => None,
        };
        let index_ok = rkey.raw() >> 8 == mw.raw();
        rules::check_bind(window.as_ref(), qp_pd, index_ok, bind, region.as_ref())?;
        let w = self.mws.get_mut(&mw).ok_or(rules::BindDenied::NoWindow)?;
        w.rkey = rkey;
        match bind.mr {
            Some(lkey) if bind.length > 0 => {
                w.bound = Some((
                    lkey,
                    WindowBound {
                        access: bind.access,
                        addr: bind.addr,
                        len: bind.length,
                    },
                ));
                w.qp = (w.mw_type == MwType::Two).then_some(qpn);
            }
            _ => {
                w.bound = None;
                w.qp = None;
            }
        }
        Ok(())
    }

    /// Invalidates the window whose rkey is `rkey`, through the QP `qpn`
    /// of PD `qp_pd`, after [`rules::check_invalidate`] (`remote`: a SEND
    /// with invalidate). The window keeps its rkey, free for a new bind.
    pub fn invalidate_mw(
        &mut self,
        qp_pd: PdHandle,
        qpn: Qpn,
        rkey: Rkey,
        remote: bool,
    ) -> core::result::Result<(), rules::InvalidateDenied> {
        let window = self.mw_by_rkey(rkey).map(Mw::view);
        rules::check_invalidate(window.as_ref(), qp_pd, qpn, remote)?;
        if let Some(w) = self.mws.get_mut(&MwHandle::from_raw(rkey.raw() >> 8)) {
            w.bound = None;
            w.qp = None;
        }
        Ok(())
    }

    /// What an rkey names for the rules ([`rules::check_remote_key`]):
    /// the region with that rkey, or the window with exactly that rkey
    /// and the region it is bound to.
    pub fn key_target(&self, rkey: Rkey) -> Option<(KeyTarget, &Mr)> {
        if let Some(mr) = self.mr_by_rkey(rkey) {
            return Some((KeyTarget::Region(mr.view()), mr));
        }
        let w = self.mw_by_rkey(rkey)?;
        let (lkey, _) = w.bound?;
        let mr = self.mrs.get(&lkey)?;
        Some((KeyTarget::Window(w.view(), Some(mr.view())), mr))
    }

    pub fn retire_key(&mut self, k: u32) {
        self.key_quarantine.retire(k);
    }

    /// A fresh random 24-bit QPN from the CSPRNG: not 0 or 1 (reserved), not
    /// one `in_use` says is taken, and not one of the last
    /// [`QPN_QUARANTINE`] destroyed, so that a peer's stale packets do not
    /// reach a new QP and QPNs do not reveal how many QPs were made.
    pub fn new_qpn(&mut self, in_use: impl Fn(u32) -> bool) -> u32 {
        loop {
            let q = self.qpn_rng.next_u32() & softrdma_wire::bth::QPN_MASK;
            if q > 1 && !in_use(q) && !self.qpn_quarantine.contains(q) {
                return q;
            }
        }
    }

    pub fn retire_qpn(&mut self, qpn: u32) {
        self.qpn_quarantine.retire(qpn);
    }

    pub fn check_pd(&self, pd: PdHandle) -> Result<()> {
        if self.pds.contains_key(&pd) {
            Ok(())
        } else {
            Err(VerbsError::NotFound {
                kind: "protection domain",
                handle: pd.raw(),
            })
        }
    }

    pub fn pd_ref(&mut self, pd: PdHandle, delta: i32) {
        if let Some(u) = self.pds.get_mut(&pd) {
            *u = u.saturating_add_signed(delta);
        }
    }

    /// The region a remote key names, if any.
    pub fn mr_by_rkey(&self, rkey: Rkey) -> Option<&Mr> {
        let lkey = self.rkeys.get(&rkey)?;
        self.mrs.get(lkey)
    }

    /// The region and offset of a local SGE that passes
    /// [`rules::check_local_sge`] with the right `need`.
    fn local_mr(&self, sge: &Sge, pd: PdHandle, need: AccessFlags) -> SgeResult<(&Mr, usize)> {
        let mr = self.mrs.get(&sge.lkey);
        let off = rules::check_local_sge(mr.map(Mr::view).as_ref(), pd, sge, need)?;
        let mr = mr.ok_or(WcStatus::LocProtErr)?;
        Ok((mr, off as usize))
    }

    /// Checks every SGE of a list for access `need` (without touching memory).
    pub fn check_sges(&self, sges: &[Sge], pd: PdHandle, need: AccessFlags) -> SgeResult<()> {
        for s in sges {
            self.local_mr(s, pd, need)?;
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes starting `offset` bytes into the SGE list.
    pub fn gather(
        &self,
        sges: &[Sge],
        pd: PdHandle,
        mut offset: u64,
        dst: &mut [u8],
    ) -> SgeResult<()> {
        let mut done = 0usize;
        for s in sges {
            if done == dst.len() {
                break;
            }
            let l = u64::from(s.length);
            if offset >= l {
                offset -= l;
                continue;
            }
            let (mr, base) = self.local_mr(s, pd, AccessFlags::empty())?;
            let n = ((l - offset) as usize).min(dst.len() - done);
            if !mr.mem.resolve(base + offset as usize, n, false) {
                return Err(WcStatus::LocProtErr);
            }
            mr.mem
                .read(base + offset as usize, &mut dst[done..done + n]);
            done += n;
            offset = 0;
        }
        if done == dst.len() {
            Ok(())
        } else {
            Err(WcStatus::LocLenErr)
        }
    }

    /// Where the `len` bytes starting `offset` bytes into the SGE list lie,
    /// for a send by reference: `Some` when they lie inside one SGE whose
    /// region may be read in place ([`crate::RegionMemory::tx_addr`]) and
    /// the SGE passes the checks [`Self::gather`] makes. `None` otherwise,
    /// and the caller copies with `gather`, which reports any error.
    pub(crate) fn payload_ref(
        &self,
        sges: &[Sge],
        pd: PdHandle,
        mut offset: u64,
        len: usize,
    ) -> Option<crate::requester::ZcPiece> {
        for s in sges {
            let l = u64::from(s.length);
            if offset >= l {
                offset -= l;
                continue;
            }
            if offset + len as u64 > l {
                return None;
            }
            let (mr, base) = self.local_mr(s, pd, AccessFlags::empty()).ok()?;
            let at = base + offset as usize;
            let addr = mr.mem.tx_addr(at)?;
            return Some(crate::requester::ZcPiece {
                lkey: s.lkey,
                base: at,
                addr,
            });
        }
        None
    }

    /// Copies `src` into the SGE list starting `offset` bytes in.
    pub fn scatter(
        &self,
        sges: &[Sge],
        pd: PdHandle,
        mut offset: u64,
        src: &[u8],
    ) -> SgeResult<()> {
        let mut done = 0usize;
        for s in sges {
            if done == src.len() {
                break;
            }
            let l = u64::from(s.length);
            if offset >= l {
                offset -= l;
                continue;
            }
            let (mr, base) = self.local_mr(s, pd, AccessFlags::LOCAL_WRITE)?;
            let n = ((l - offset) as usize).min(src.len() - done);
            let at = base + offset as usize;
            if !mr.mem.resolve(at, n, true) || !mr.mem.try_write(at, &src[done..done + n]) {
                return Err(WcStatus::LocProtErr);
            }
            done += n;
            offset = 0;
        }
        if done == src.len() {
            Ok(())
        } else {
            Err(WcStatus::LocLenErr)
        }
    }

    /// Adds a completion to a CQ, raising the events real HCAs raise.
    /// Drops the completions of QP `qpn` that CQ `cq_id` still holds.
    pub fn forget_completions(&mut self, cq_id: CqHandle, qpn: Qpn) {
        if let Some(cq) = self.cqs.get_mut(&cq_id) {
            cq.entries.retain(|wc| wc.qp_num != qpn);
        }
    }

    pub fn complete(&mut self, cq_id: CqHandle, wc: WorkCompletion) {
        let Some(cq) = self.cqs.get_mut(&cq_id) else {
            return;
        };
        if cq.entries.len() >= cq.depth {
            // Reported, never silent: the CQ is marked overrun and an async
            // error event tells the application (IBV_EVENT_CQ_ERR).
            self.counters.cq_overruns += 1;
            if !cq.overrun {
                cq.overrun = true;
                self.events.push_back(Event::CqOverrun { cq: cq_id });
            }
            return;
        }
        let fire = cq.notify.fires_for(&wc);
        cq.entries.push_back(wc);
        if fire {
            cq.notify = Notify::Off;
            cq.quiet = 0;
            self.armed_cqs -= 1;
            self.events.push_back(Event::Completion { cq: cq_id });
        } else {
            cq.quiet += 1;
        }
    }

    /// Arms CQ `cq_id` (`ibv_req_notify_cq`); false if there is none.
    ///
    /// A completion that came in while the CQ was not armed (between the
    /// program's last poll and this arm) and is still in it raises the
    /// event now, if the arming wants it — as hardware arming at the
    /// consumer index does for what arrived before the arm. So no
    /// completion the program has not polled can be left with no event:
    /// the race of a completion landing between an empty poll and the
    /// arm cannot put the program to sleep on a completion that is there.
    /// A completion that raised an event already does not raise another
    /// one (programs that arm before they poll what woke them, as
    /// perftest's `-e` does, would otherwise be woken twice for it).
    pub fn arm_cq(&mut self, cq_id: CqHandle, solicited_only: bool) -> bool {
        let Some(cq) = self.cqs.get_mut(&cq_id) else {
            return false;
        };
        let want = if solicited_only {
            Notify::Solicited
        } else {
            Notify::Next
        };
        let was_armed = cq.notify != Notify::Off;
        let quiet = cq.quiet.min(cq.entries.len());
        let missed = cq
            .entries
            .iter()
            .rev()
            .take(quiet)
            .any(|wc| want.fires_for(wc));
        if missed {
            cq.notify = Notify::Off;
            cq.quiet = 0;
            if was_armed {
                self.armed_cqs -= 1;
            }
            self.events.push_back(Event::Completion { cq: cq_id });
        } else {
            cq.notify = want;
            if !was_armed {
                self.armed_cqs += 1;
            }
        }
        true
    }

    /// Takes the next receive WQE from an SRQ, raising the limit event.
    pub fn srq_pop(&mut self, srq_id: SrqHandle) -> Option<RecvWqe> {
        let srq = self.srqs.get_mut(&srq_id)?;
        let w = srq.wqes.pop_front()?;
        if srq.limit > 0 && (srq.wqes.len() as u32) < srq.limit {
            srq.limit = 0;
            self.events
                .push_back(Event::SrqLimitReached { srq: srq_id });
        }
        Some(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarantine_keeps_the_last_cap_values() {
        let mut q = Quarantine::new(3);
        for v in 1..=3 {
            q.retire(v);
        }
        assert!((1..=3).all(|v| q.contains(v)));
        q.retire(4);
        assert!(!q.contains(1), "the oldest left");
        assert!((2..=4).all(|v| q.contains(v)));
    }

    #[test]
    fn new_qpn_draws_again_past_taken_and_quarantined_numbers() {
        let mut r = Resources::new([9; 32]);
        // Only multiples of 4096 are free (and 0 is reserved): every QPN is
        // one of them, found by drawing again, about 4096 draws each.
        let free = |q: u32| q.is_multiple_of(4096);
        let mut drawn = std::collections::HashSet::new();
        let quarantined: Vec<u32> = (1..=QPN_QUARANTINE as u32).map(|k| k * 4096).collect();
        for &q in &quarantined {
            r.retire_qpn(q);
        }
        // A sixteenth of the free numbers are quarantined: the 200 draws
        // meet them about a dozen times and must pass them by.
        for _ in 0..200 {
            let q = r.new_qpn(|q| !free(q) || drawn.contains(&q));
            assert!(free(q) && q > 1 && q <= softrdma_wire::bth::QPN_MASK);
            assert!(!quarantined.contains(&q), "{q:#x} is quarantined");
            assert!(drawn.insert(q), "{q:#x} is in use");
        }
        // Once QPN_QUARANTINE newer numbers were retired, the old ones may
        // come back.
        for k in 0..QPN_QUARANTINE as u32 {
            r.retire_qpn(4096 * 3000 + k * 4096);
        }
        let back = (0..1000).any(|_| {
            let q = r.new_qpn(|q| !free(q));
            quarantined.contains(&q)
        });
        assert!(back, "numbers out of quarantine are drawn again");
    }
}
