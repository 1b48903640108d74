//! [`DeviceCore`]: the one client of the engine.
//!
//! It runs progress (receive, timers, transmit), decides when an inline
//! poll may skip it (the idle policy), reacts to what the engine reports
//! (events, resource changes: grants revalidated, routes forgotten) and
//! runs the direct path. It owns no socket, thread or clock: a driver
//! passes the time in and sleeps until the deadline it gets back.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use softrdma_engine::{
    AccessFlags, DirectPlan, Engine, Event, Instant, Qpn, ResourceChange, SendOp, SendWr,
};
use softrdma_wire::Endpoints;

use crate::port::{
    GrantAsk, NotGranted, PeerMemory, Port, PortCounters, Sources, Standing, TxBatch,
};

/// Packets a receive delivers per source before progress sends what they
/// produced (ACKs, READ responses), so the peer's next window overlaps
/// with this one.
pub const RX_BUDGET: usize = 32;
/// Receive rounds per progress at most (a busy device still returns).
const RX_ROUNDS: usize = 64;
/// After this many empty reads of the slow sources, inline progress reads
/// them only every this many calls (a driver's background thread still
/// wakes on them).
const SLOW_IDLE_POLLS: u32 = 64;
/// While idle, one inline poll in this many runs full progress (about every
/// 10 µs of a polling loop): its system calls (the UDP read, the link
/// sockets) took a quarter of an idle loop's time at one in 64, delaying
/// the notice of a peer's WRITE.
const IDLE_FULL_POLLS: u32 = 256;
/// Routes the direct path keeps (one per QPN modulo this).
const DIRECT_ROUTES: usize = 8;
/// Waits of [`GRANT_WAIT_STEP`] for the answer to a grant request.
const GRANT_WAIT_STEPS: u32 = 20;
const GRANT_WAIT_STEP: Duration = Duration::from_micros(100);
/// Posts in a row whose packets may wait in the engine for a batch
/// ([`DeviceCore::post`]): 32 small WRITEs leave in one `sendmmsg` (about
/// 16 per GSO send) instead of a system call each.
pub const DEFER_POSTS: u32 = 32;
/// How long the packets of a deferred post wait at most for the next poll
/// or post to take them out (the driver's background thread sends them
/// then): far inside any ACK timeout, and about the time 32 small posts
/// take on a loaded machine.
pub const DEFER_WAIT: Duration = Duration::from_micros(20);

/// Where a QP's direct operations go, kept between operations: the route to
/// its destination. Valid while the core's `routes_epoch` and the port's
/// `routes_gen` are those it was made under; the initiator's rules and the
/// grant are checked on every operation.
#[derive(Clone, Copy)]
struct DirectRoute {
    qpn: Qpn,
    epoch: u64,
    routes_gen: u64,
    route: usize,
    /// The engine's last plan on this QP: `Engine::replan_direct` reuses
    /// what it found about the QP and its local region while the epoch says
    /// nothing changed them.
    plan: DirectPlan,
}

/// How one try of a direct operation ended.
enum Direct {
    /// Executed and completed.
    Done,
    /// Not for the direct path: the engine takes the WR.
    Refused,
    /// The grant was missing and is asked for on this route.
    Asked(GrantAsk, usize),
}

/// Counters of the core and its port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreCounters {
    pub port: PortCounters,
    /// WRITE/READ/atomics executed directly in a same-host peer's memory.
    pub direct_ops: u64,
}

/// The sans-I/O device: an engine driven over a port.
pub struct DeviceCore<P: Port> {
    /// The engine. Whoever changes it directly leaves the core to notice
    /// through its change queue (at the next progress, command or direct
    /// operation) — or calls [`DeviceCore::forget_routes`] at once.
    pub engine: Engine,
    pub port: P,
    local: SocketAddr,
    tx: TxBatch,
    /// Engine events for the driver (completion channels, async events).
    events: VecDeque<Event>,
    direct_ops: u64,
    /// Progress calls so far, and how many reads of the slow sources in a
    /// row found nothing.
    polls: u32,
    slow_idle: u32,
    /// Idle inline polls in a row.
    idle_polls: u32,
    /// Posts since the last transmit whose packets wait in the engine
    /// ([`Self::post`]), and when the first of them came.
    deferred: u32,
    deferred_since: Instant,
    routes: [Option<DirectRoute>; DIRECT_ROUTES],
    /// Advanced by everything that may change a QP or a local region; a
    /// route of another epoch is looked up again.
    routes_epoch: u64,
    /// Kept between uses so that answering grants allocates nothing.
    requests: Vec<(SocketAddr, GrantAsk)>,
    standing: Vec<(SocketAddr, Standing)>,
    /// The IB CM on QP1, once enabled ([`Self::enable_cm`]).
    cm: Option<crate::cm::DeviceCm>,
}

impl<P: Port> std::fmt::Debug for DeviceCore<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCore")
            .field("engine", &self.engine)
            .field("local", &self.local)
            .finish()
    }
}

impl<P: Port> DeviceCore<P> {
    /// A core running `engine` over `port`.
    pub fn new(engine: Engine, port: P) -> Self {
        DeviceCore {
            local: engine.config().local,
            engine,
            port,
            tx: TxBatch::new(),
            events: VecDeque::new(),
            direct_ops: 0,
            polls: 0,
            slow_idle: 0,
            idle_polls: 0,
            deferred: 0,
            deferred_since: Instant(0),
            routes: [None; DIRECT_ROUTES],
            routes_epoch: 0,
            requests: Vec::new(),
            standing: Vec::new(),
            cm: None,
        }
    }

    /// Runs the IB CM on this device's QP1 (`cm.rs`): MADs QP1 receives go
    /// to it, its timers join the deadline. Without it, QP1's MADs wait
    /// unread in the engine's bounded queue.
    pub fn enable_cm(&mut self, cm: crate::cm::DeviceCm) {
        self.cm = Some(cm);
    }

    /// Whether the CM has events for the consumer.
    pub fn has_cm_events(&self) -> bool {
        self.cm.as_ref().is_some_and(|c| c.has_events())
    }

    /// Runs a CM command (`f` gets the CM, the engine and the time), then
    /// what it set off, as [`Self::command`] does; `None` without a CM.
    pub fn cm_command<R>(
        &mut self,
        now: Instant,
        f: impl FnOnce(&mut crate::cm::DeviceCm, &mut Engine, Instant) -> R,
    ) -> Option<R> {
        let cm = self.cm.as_mut()?;
        let r = f(cm, &mut self.engine, now);
        cm.progress(&mut self.engine, now);
        self.follow_changes();
        self.transmit(now);
        Some(r)
    }

    /// Makes the direct path look up every route again.
    pub fn forget_routes(&mut self) {
        self.routes_epoch = self.routes_epoch.wrapping_add(1);
    }

    /// Whether [`Self::poll_event`] has anything (a driver skips routing
    /// after a direct operation that raised no event).
    #[inline]
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The next engine event (completion on an armed CQ, async event).
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Counters of the core and its port.
    pub fn counters(&self) -> CoreCounters {
        let mut port = PortCounters::default();
        self.port.counters(&mut port);
        CoreCounters {
            port,
            direct_ops: self.direct_ops,
        }
    }

    /// When progress must run next: the engine's timers, and the packets
    /// of deferred posts ([`Self::post`]).
    pub fn next_deadline(&mut self) -> Option<Instant> {
        let engine = self.engine.poll_timeout();
        let cm = self.cm.as_ref().and_then(|c| c.next_deadline());
        let timer = match (engine, cm) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timer = match (timer, self.port.next_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match self.defer_deadline() {
            Some(d) => Some(timer.map_or(d, |t| t.min(d))),
            None => timer,
        }
    }

    /// When the packets of deferred posts must go out, if any wait.
    fn defer_deadline(&self) -> Option<Instant> {
        (self.deferred > 0).then(|| Instant(self.deferred_since.0 + DEFER_WAIT.as_nanos() as u64))
    }

    /// Posts a send WR (`f` posts it on QP `qpn`). When the QP already has
    /// two packets or more in flight, their ACKs will bring progress back soon, so the
    /// packets of this post may wait in the engine for those of the next
    /// posts: a burst of small posts leaves in one batch (one `sendmmsg`,
    /// GSO sends of many datagrams) and each post costs no system call.
    /// They go out with the next progress — an inline poll, or the
    /// receive of the ACK for the packets in flight (the last packet sent
    /// asked for one) — or the [`DEFER_POSTS`]-th post, whichever comes
    /// first; [`Self::next_deadline`] also says [`DEFER_WAIT`] after the
    /// first of them. A QP with nothing in flight (a ping-pong) sends at
    /// once, as [`Self::command`] does. The packets are the same either
    /// way; only when they leave differs. Returns `f`'s result and the
    /// engine's next timer (not the deferral's: a driver need not wake
    /// a sleeping thread for it, the ACK will).
    pub fn post<R>(
        &mut self,
        now: Instant,
        qpn: Qpn,
        f: impl FnOnce(&mut Engine, Instant) -> R,
    ) -> (R, Option<Instant>) {
        // One packet in flight is a ping-pong's (its ACK is on the way with
        // the answer): that post goes at once.
        if self.engine.unacked_packets(qpn) < 2 || self.deferred + 1 >= DEFER_POSTS {
            return self.command(now, f);
        }
        let r = f(&mut self.engine, now);
        self.follow_changes();
        if self.deferred == 0 {
            self.deferred_since = now;
        }
        self.deferred += 1;
        (r, self.engine.poll_timeout())
    }

    /// Runs an application command on the engine, then what it set off:
    /// its packets first (a read before them would put a system call
    /// between a post and its packet), then receive as a poll does (a
    /// program busy posting consumes its ACKs itself). Returns `f`'s result
    /// and the next deadline.
    pub fn command<R>(
        &mut self,
        now: Instant,
        f: impl FnOnce(&mut Engine, Instant) -> R,
    ) -> (R, Option<Instant>) {
        let r = f(&mut self.engine, now);
        self.follow_changes();
        self.transmit(now);
        self.progress(now, false);
        (r, self.engine.poll_timeout())
    }

    /// Whether an inline poll that found nothing should run progress now.
    ///
    /// False when nothing can be pending — a fast source is attached, the
    /// slow ones have been idle (so progress would skip them anyway), no
    /// timer is armed, the fast sources are empty: the poll then costs no
    /// clock read and no system call. Every `IDLE_FULL_POLLS`-th idle poll
    /// still runs full progress, reading the slow sources and looking for
    /// new and dead peers.
    pub fn poll_wanted(&mut self) -> bool {
        let idle = self.port.has_fast()
            && self.deferred == 0
            && self.slow_idle >= SLOW_IDLE_POLLS
            && !self.port.fast_pending()
            && self.engine.poll_timeout().is_none();
        if !idle {
            self.idle_polls = 0;
            return true;
        }
        self.idle_polls = self.idle_polls.wrapping_add(1);
        if !self.idle_polls.is_multiple_of(IDLE_FULL_POLLS) {
            return false;
        }
        // Make this progress the one that reads the idle slow sources.
        self.polls |= SLOW_IDLE_POLLS - 1;
        true
    }

    /// Receives what is waiting, runs timers, sends what is ready, follows
    /// changes and events. The next deadline is [`Self::next_deadline`]'s:
    /// asked for only when needed (it costs a look at the timer heap, a
    /// few percent of an inline poll).
    ///
    /// `all_sources` reads the slow sources even when they have been idle:
    /// a driver's background thread passes it when it woke on them. Inline
    /// progress skips most reads of an idle slow source while a fast one is
    /// attached, so polling a same-host peer costs no system call.
    pub fn progress(&mut self, now: Instant, all_sources: bool) {
        self.polls = self.polls.wrapping_add(1);
        let slow = all_sources
            || !self.port.has_fast()
            || self.slow_idle < SLOW_IDLE_POLLS
            || self.polls.is_multiple_of(SLOW_IDLE_POLLS);
        let from = if slow { Sources::All } else { Sources::Fast };
        if slow {
            // New same-host peers wait for this; cheap enough at the slow cadence.
            self.port.maintain();
            self.forget_routes();
        }
        let local = self.local;
        for _ in 0..RX_ROUNDS {
            let engine = &mut self.engine;
            let got = self.port.receive(now, from, RX_BUDGET, |src, meta, d| {
                // A datagram sent to a multicast group was addressed to it.
                let dst = match meta.group {
                    None => local,
                    Some(g) => SocketAddr::new(g, local.port()),
                };
                engine.handle_packet_meta(now, Endpoints::new(src, dst), meta, d)
            });
            if got.slow > 0 {
                self.slow_idle = 0;
            } else if slow {
                self.slow_idle = self.slow_idle.saturating_add(1);
            }
            if slow {
                self.answer_grants();
            }
            self.engine.handle_timeout(now);
            if let Some(cm) = self.cm.as_mut() {
                cm.progress(&mut self.engine, now);
            }
            self.transmit(now);
            if !got.more {
                break;
            }
        }
        self.follow_changes();
        self.route_events();
    }

    /// Runs the engine's timers if one is due (a held ACK, a retransmission)
    /// and sends what they produced; true when one was.
    pub fn run_due_timers(&mut self, now: Instant) -> bool {
        if self.next_deadline().is_none_or(|t| t > now) {
            return false;
        }
        if self.port.next_due().is_some_and(|t| t <= now) {
            // Packets the port held back (a fault injector's delay) are
            // due: a receive delivers them, and runs the timers too.
            self.progress(now, false);
            return true;
        }
        self.forget_routes();
        self.engine.handle_timeout(now);
        if let Some(cm) = self.cm.as_mut() {
            cm.progress(&mut self.engine, now);
        }
        self.follow_changes();
        self.transmit(now);
        self.route_events();
        true
    }

    /// The port's housekeeping (new peers, messages on links, dead peers)
    /// and the grant requests that came with it.
    pub fn maintain(&mut self) {
        self.forget_routes();
        self.port.maintain();
        self.answer_grants();
    }

    /// Sends the ACKs the engine holds back for a next answer to ride with
    /// (at close and exit: the peers are owed their completions).
    pub fn release_held_acks(&mut self, now: Instant) {
        self.forget_routes();
        self.engine.release_held_acks();
        self.transmit(now);
    }

    /// Sends everything the engine has ready, in batches.
    pub fn transmit(&mut self, now: Instant) {
        self.deferred = 0;
        loop {
            let full = self.tx.fill(&mut self.engine, now);
            if self.tx.is_empty() {
                return;
            }
            let mut out = self.tx.outgoing(&self.engine);
            self.port.send(now, &mut out);
            out.clear();
            if !full {
                return;
            }
        }
    }

    /// Follows the engine's resource changes: grants made through a changed
    /// QP or on a deregistered region that the rules no longer allow are
    /// taken back, and routes are looked up again.
    #[inline]
    pub fn follow_changes(&mut self) {
        while let Some(c) = self.engine.poll_change() {
            match c {
                ResourceChange::MrRegistered { .. } => {}
                ResourceChange::QpModified { qpn } | ResourceChange::QpDestroyed { qpn } => {
                    self.forget_routes();
                    self.revalidate_grants(Some(qpn));
                }
                ResourceChange::MrDeregistered { rkey } => {
                    self.forget_routes();
                    if let Some(p) = self.port.peers() {
                        p.region_gone(rkey);
                    }
                }
                ResourceChange::Lost => {
                    self.forget_routes();
                    self.revalidate_grants(None);
                }
            }
        }
    }

    /// Moves the engine's events to the output queue; a QP or CQ that went
    /// to error also forgets routes and the grants it no longer allows.
    fn route_events(&mut self) {
        while let Some(ev) = self.engine.poll_event() {
            if !matches!(ev, Event::Completion { .. }) {
                self.forget_routes();
                if let Event::QpFatal { qpn } = ev {
                    self.revalidate_grants(Some(qpn));
                }
            }
            self.events.push_back(ev);
        }
    }

    /// Answers the grant requests same-host peers sent: with the engine's
    /// rules (`Engine::check_grant`); the port grants only memory it can
    /// share, and nothing at all when the direct path is off.
    fn answer_grants(&mut self) {
        let allowed = self.port.direct_allowed();
        let Some(peers) = self.port.peers() else {
            return;
        };
        peers.take_requests(&mut self.requests);
        for (peer, ask) in self.requests.drain(..) {
            let need = AccessFlags(ask.access);
            let one_right = [
                AccessFlags::REMOTE_WRITE,
                AccessFlags::REMOTE_READ,
                AccessFlags::REMOTE_ATOMIC,
            ]
            .contains(&need);
            let facts = (allowed && one_right)
                .then(|| {
                    self.engine
                        .check_grant(ask.target_qpn, peer.ip(), ask.requester_qpn, ask.rkey, need)
                        .ok()
                })
                .flatten();
            peers.answer(peer, &ask, facts);
        }
    }

    /// Takes back the grants made through QP `qpn` (every QP when `None`)
    /// that the engine's rules no longer allow (the QP changed state or
    /// rights, was destroyed, or the region went away).
    pub fn revalidate_grants(&mut self, qpn: Option<Qpn>) {
        let Some(peers) = self.port.peers() else {
            return;
        };
        self.standing.clear();
        peers.standing(&mut self.standing);
        let engine = &self.engine;
        self.standing.retain(|(peer, g)| {
            let now = engine.check_grant(
                g.target_qpn,
                peer.ip(),
                g.requester_qpn,
                g.rkey,
                AccessFlags(g.access),
            );
            qpn.is_none_or(|q| q == g.target_qpn)
                && !now.is_ok_and(|f| {
                    (f.access.bits(), f.qp_access.bits()) == (g.region_access, g.qp_access)
                })
        });
        if !self.standing.is_empty() {
            let stale = &self.standing;
            peers.revoke(&mut |peer, g| stale.contains(&(peer, *g)));
        }
    }

    /// Executes an RDMA WRITE, READ or atomic directly in a same-host peer's
    /// memory when that is exactly what the engine would do: the QP is RTS
    /// with nothing outstanding, the local SGEs are in regions of this
    /// device with an address, and the peer granted this QP the target
    /// region (the first operations on a region ask for the grant and go
    /// through the engine). False: the caller posts the WR to the engine
    /// (which also produces every error completion).
    #[inline]
    pub fn try_direct(&mut self, qpn: Qpn, wr: &SendWr) -> bool {
        let one_sided = matches!(
            wr.op,
            SendOp::Write { .. }
                | SendOp::Read { .. }
                | SendOp::CompareSwap { .. }
                | SendOp::FetchAdd { .. }
        );
        if !one_sided || !self.port.direct_allowed() {
            return false;
        }
        self.follow_changes();
        // At most two tries: the second after asking for a missing grant.
        let done = match self.direct_once(qpn, wr, true) {
            Direct::Done => true,
            Direct::Refused => false,
            Direct::Asked(ask, link) => {
                self.await_grant(&ask, link)
                    && matches!(self.direct_once(qpn, wr, false), Direct::Done)
            }
        };
        if done {
            self.direct_ops += 1;
            // An armed CQ's completion event goes out now, not at the next
            // progress.
            self.route_events();
        }
        done
    }

    /// One try of [`Self::try_direct`]: the initiator's rules and where the
    /// local bytes are — a full plan on a new route, else the last plan's QP
    /// and region reused (planned in place in the route: a plan is a few
    /// hundred bytes, and copying it in and out cost more than the lookups
    /// it saves) — then the grant entered, the target's rules, the copy or
    /// atomic and the completion. A missing grant is asked for on the
    /// first try. Everything is borrowed once: this is the post's hot path.
    #[inline]
    fn direct_once(&mut self, qpn: Qpn, wr: &SendWr, first: bool) -> Direct {
        let epoch = self.routes_epoch;
        let DeviceCore {
            engine,
            port,
            routes,
            ..
        } = self;
        let Some(peers) = port.peers() else {
            return Direct::Refused;
        };
        let routes_gen = peers.routes_gen();
        let r = match &mut routes[qpn.raw() as usize % DIRECT_ROUTES] {
            Some(r) if r.qpn == qpn && r.epoch == epoch && r.routes_gen == routes_gen => {
                if engine.replan_direct(qpn, wr, &mut r.plan).is_err() {
                    return Direct::Refused;
                }
                r
            }
            slot => {
                let mut plan = DirectPlan::new();
                if engine.plan_direct_into(qpn, wr, &mut plan).is_err() {
                    return Direct::Refused;
                }
                let Some(route) = peers.route(plan.dest()) else {
                    return Direct::Refused;
                };
                slot.insert(DirectRoute {
                    qpn,
                    epoch,
                    routes_gen,
                    route,
                    plan,
                })
            }
        };
        let (link, rkey, dest_qpn) = (r.route, r.plan.rkey(), r.plan.dest_qpn());
        let plan = &r.plan;
        match peers.enter(link, rkey, dest_qpn, |w| {
            crate::direct::execute(engine, w, plan)
        }) {
            Ok(true) => {
                engine.complete_direct(plan);
                Direct::Done
            }
            Ok(false) => Direct::Refused,
            Err(NotGranted::Missing) if first => {
                let ask = GrantAsk {
                    rkey,
                    requester_qpn: qpn,
                    target_qpn: dest_qpn,
                    access: plan.access().bits(),
                };
                if peers.ask_grant(link, &ask) {
                    Direct::Asked(ask, link)
                } else {
                    Direct::Refused
                }
            }
            Err(NotGranted::Missing) => Direct::Refused,
            Err(NotGranted::Revoked) => {
                peers.forget_grant(link, rkey, dest_qpn);
                Direct::Refused
            }
        }
    }

    /// Waits (bounded) for the answer to a grant request just sent on
    /// `link`, so that the operation that asked can go direct — without it,
    /// a stream that keeps its send queue full would never find it empty
    /// again, and stay on the engine's path. Meanwhile this device answers
    /// its peers' own requests (two devices asking each other at once do
    /// not wait each other out). True when granted.
    fn await_grant(&mut self, ask: &GrantAsk, link: usize) -> bool {
        for _ in 0..GRANT_WAIT_STEPS {
            self.answer_grants();
            let Some(peers) = self.port.peers() else {
                return false;
            };
            match peers.enter(link, ask.rkey, ask.target_qpn, |_| ()) {
                Ok(()) => return true,
                Err(NotGranted::Revoked) => return false,
                Err(NotGranted::Missing) => {}
            }
            if peers.grant_refused(link, ask.rkey, ask.target_qpn) {
                return false;
            }
            peers.wait_links(GRANT_WAIT_STEP);
        }
        false
    }
}
