//! The agent: one per port. It owns every connection of the port, the
//! listeners, the queues of MADs to send and events to deliver, and the
//! lookup tables that route a received MAD to its connection.
//!
//! The message handlers live next to their side of the protocol
//! (`passive.rs`, `active.rs`, `disconnect.rs`, `sidr.rs`); this file
//! holds what they share: sending (once, or with retries), timers,
//! timewait, and forgetting a connection.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::hash::Hash;

use chacha20::ChaCha20Rng;
use rand_core::{Rng as _, SeedableRng as _};
use softrdma_wire::cm::{CmMad, CmMessage, Ece, ReqRepr};
use softrdma_wire::mad::{method, MAD_LEN};

use crate::conn::{Conn, Pending, State, Timer};
use crate::time::{iba_time, Instant};
use crate::{AgentConfig, ConnId, Error, Event, Result};

/// Counters of what the agent dropped, for diagnosis.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// MADs that did not parse as CM messages.
    pub malformed: u64,
    /// Well-formed MADs that matched no connection or state.
    pub unmatched: u64,
    /// Duplicates recognised (and answered if their state says so).
    pub duplicates: u64,
}

/// A REQ waiting for its reserved service to be listened on.
#[derive(Debug)]
pub(crate) struct HeldReq<A> {
    pub(crate) from: A,
    pub(crate) tid: u64,
    pub(crate) req: ReqRepr,
    pub(crate) ece: Ece,
}

/// The most REQs held for reserved services (more are rejected).
pub(crate) const MAX_HELD: usize = 64;

/// The CM of one port, sans I/O. `A` is how a peer is addressed (a GID
/// and UDP port, a socket address, a test's node number): the agent only
/// copies and compares it.
#[derive(Debug)]
pub struct CmAgent<A> {
    pub(crate) config: AgentConfig,
    rng: ChaCha20Rng,
    pub(crate) conns: HashMap<ConnId, Conn<A>>,
    /// (remote CA GUID, remote communication ID) → connection.
    pub(crate) by_remote_id: HashMap<(u64, u32), ConnId>,
    /// (remote CA GUID, remote QPN) → connection, for stale REQs.
    pub(crate) by_remote_qpn: HashMap<(u64, u32), ConnId>,
    /// (peer, request ID) → SIDR request, for duplicate SIDR_REQs.
    pub(crate) sidr_by_remote: HashMap<(A, u32), ConnId>,
    pub(crate) listeners: HashSet<u64>,
    /// Services bound but not listened on yet, and the REQs for them held
    /// until they are (see [`CmAgent::reserve`]).
    pub(crate) reserved: HashSet<u64>,
    pub(crate) held: Vec<HeldReq<A>>,
    transmits: VecDeque<(A, [u8; MAD_LEN])>,
    events: VecDeque<Event<A>>,
    pub(crate) stats: Stats,
    /// Every deadline armed, earliest first; an entry whose connection no
    /// longer has that timer at that time is stale and skipped (a thousand
    /// connections in timewait must not make every deadline a scan).
    deadlines: BinaryHeap<Reverse<(Instant, ConnId, bool)>>,
}

impl<A: Copy + Eq + Hash + std::fmt::Debug> CmAgent<A> {
    /// A new agent; `seed` (32 bytes from a CSPRNG) keys the generator of
    /// local communication IDs, which a peer must not be able to guess.
    pub fn new(config: AgentConfig, seed: [u8; 32]) -> Self {
        CmAgent {
            config,
            rng: ChaCha20Rng::from_seed(seed),
            conns: HashMap::new(),
            by_remote_id: HashMap::new(),
            by_remote_qpn: HashMap::new(),
            sidr_by_remote: HashMap::new(),
            listeners: HashSet::new(),
            reserved: HashSet::new(),
            held: Vec::new(),
            deadlines: BinaryHeap::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: Stats::default(),
        }
    }

    /// What the agent dropped so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The state of `conn`, if it exists.
    pub fn state(&self, conn: ConnId) -> Option<State> {
        self.conns.get(&conn).map(|c| c.state)
    }

    /// Every connection the agent holds and its state.
    pub fn conns(&self) -> impl Iterator<Item = (ConnId, State)> + '_ {
        self.conns.values().map(|c| (c.id, c.state))
    }

    /// Number of connections the agent holds (timewait included).
    pub fn conn_count(&self) -> usize {
        self.conns.len()
    }

    /// Accepts REQs and SIDR_REQs for `service_id`, and takes up the REQs
    /// held for it since it was reserved.
    pub fn listen(&mut self, service_id: u64) -> Result<()> {
        if !self.listeners.insert(service_id) {
            return Err(Error::ServiceInUse(service_id));
        }
        self.replay_held(service_id);
        Ok(())
    }

    /// Handles again the REQs held for `service_id` (now listened on, or
    /// no longer reserved).
    fn replay_held(&mut self, service_id: u64) {
        let (mine, rest): (Vec<HeldReq<A>>, _) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.req.service_id == service_id);
        self.held = rest;
        for h in mine {
            self.on_req(h.from, h.tid, &h.req, h.ece);
        }
    }

    /// `service_id` is bound and about to be listened on: until it is (or
    /// [`CmAgent::release`]), a REQ for it is held, not rejected. The
    /// kernel rejects it, but its address and route resolution give the
    /// listener milliseconds to get there first; ours are immediate, and
    /// a program that hands its port to the peer between rdma_bind_addr
    /// and rdma_listen (qperf) would lose the race on a loaded machine.
    pub fn reserve(&mut self, service_id: u64) {
        self.reserved.insert(service_id);
    }

    /// Ends a reservation: the REQs held for `service_id` are rejected
    /// (invalid service ID) unless it is listened on.
    pub fn release(&mut self, service_id: u64) {
        self.reserved.remove(&service_id);
        self.replay_held(service_id);
    }

    /// Stops accepting requests for `service_id`.
    pub fn unlisten(&mut self, service_id: u64) -> Result<()> {
        if !self.listeners.remove(&service_id) {
            return Err(Error::NotListening(service_id));
        }
        Ok(())
    }

    /// The next MAD to send, and to whom (to the peer's QP1).
    pub fn poll_transmit(&mut self) -> Option<(A, [u8; MAD_LEN])> {
        self.transmits.pop_front()
    }

    /// The next event for the consumer.
    pub fn poll_event(&mut self) -> Option<Event<A>> {
        self.events.pop_front()
    }

    /// When [`CmAgent::on_timeout`] must next be called (possibly early,
    /// for a timer stopped since: that call then only forgets it).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Runs every timer that expired by `now`.
    pub fn on_timeout(&mut self, now: Instant) {
        while let Some(&Reverse((at, id, timewait))) = self.deadlines.peek() {
            if at > now {
                break;
            }
            self.deadlines.pop();
            let t = if timewait {
                Timer::Timewait
            } else {
                Timer::Resend
            };
            let armed = self.conns.get(&id).and_then(|c| c.timers.get(t));
            if armed != Some(at) {
                continue; // stopped or moved since
            }
            match t {
                Timer::Resend => self.resend_due(id, now),
                Timer::Timewait => self.timewait_over(id),
            }
        }
    }

    /// Arms timer `t` of connection `id` at `at`.
    pub(crate) fn arm(&mut self, id: ConnId, t: Timer, at: Instant) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.timers.set(t, at);
            self.deadlines
                .push(Reverse((at, id, matches!(t, Timer::Timewait))));
        }
    }

    /// Handles a MAD received on QP1 from `from`. Anything malformed or
    /// unexpected is counted and dropped; nothing from the wire panics.
    pub fn on_mad(&mut self, now: Instant, from: A, mad: &[u8]) {
        let Ok(m) = CmMad::parse(mad) else {
            self.stats.malformed += 1;
            return;
        };
        if m.header.method != method::SEND {
            // Every CM message travels as Send; ClassPortInfo Gets are
            // answered by the MAD layer, not the CM (as in the kernel).
            self.stats.unmatched += 1;
            return;
        }
        let tid = m.header.transaction_id;
        let ece = m.ece().unwrap_or_default();
        match m.message {
            CmMessage::Req(r) => self.on_req(from, tid, &r, ece),
            CmMessage::Mra(r) => self.on_mra(now, &r),
            CmMessage::Rej(r) => self.on_rej(now, &r),
            CmMessage::Rep(r) => self.on_rep(&r, ece),
            CmMessage::Rtu(r) => self.on_rtu(&r),
            CmMessage::Dreq(r) => self.on_dreq(now, from, tid, &r),
            CmMessage::Drep(r) => self.on_drep(now, &r),
            CmMessage::SidrReq(r) => self.on_sidr_req(from, tid, &r),
            CmMessage::SidrRep(r) => self.on_sidr_rep(&r),
            CmMessage::ClassPortInfo(_) => self.stats.unmatched += 1,
        }
    }

    // ---- shared by the handlers ----

    /// A fresh local communication ID: random, non-zero, unused.
    pub(crate) fn new_conn_id(&mut self) -> ConnId {
        loop {
            let id = ConnId(self.rng.next_u32());
            if id.0 != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    /// Encodes `message` under transaction `tid`.
    pub(crate) fn encode(tid: u64, message: CmMessage) -> Result<[u8; MAD_LEN]> {
        Ok(CmMad::send(tid, message).to_bytes()?)
    }

    /// Encodes a REQ or REP with its ECE (zero: the bytes of a REQ or REP
    /// without ECE).
    pub(crate) fn encode_ece(tid: u64, message: CmMessage, ece: Ece) -> Result<[u8; MAD_LEN]> {
        let mut m = CmMad::send(tid, message);
        m.set_ece(ece)?;
        Ok(m.to_bytes()?)
    }

    /// The ECE options the peer sent for `conn`: its REQ's offer (passive
    /// side, from the connection request on) or its REP's answer (active
    /// side, once the REP came; zero before). Zero when the peer sent none.
    pub fn remote_ece(&self, conn: ConnId) -> Option<Ece> {
        self.conns.get(&conn).map(|c| c.remote_ece)
    }

    /// The transport `conn` connects: its REQ's (RC, UC, or `Extended`
    /// for XRC); `None` for an unknown connection.
    pub fn transport(&self, conn: ConnId) -> Option<softrdma_wire::cm::TransportType> {
        self.conns.get(&conn).map(|c| c.exchange.transport)
    }

    /// Queues `mad` for `to`, sent once.
    pub(crate) fn send(&mut self, to: A, mad: [u8; MAD_LEN]) {
        self.transmits.push_back((to, mad));
    }

    /// Queues an event unless the consumer destroyed the connection.
    pub(crate) fn event(&mut self, conn: ConnId, e: Event<A>) {
        if self.conns.get(&conn).is_some_and(|c| !c.destroyed) {
            self.events.push_back(e);
        }
    }

    /// Sends `mad` on `conn` and resends it every `wait` until answered,
    /// `max_retries` times at most.
    pub(crate) fn send_retried(&mut self, id: ConnId, now: Instant, mad: [u8; MAD_LEN]) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let wait = c.response_wait;
        c.pending = Some(Pending {
            mad,
            retries_left: c.max_retries,
            wait,
        });
        let peer = c.peer;
        self.arm(id, Timer::Resend, now + wait);
        self.send(peer, mad);
    }

    /// The answer came: stop resending.
    pub(crate) fn answered(&mut self, id: ConnId) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.pending = None;
            c.timers.stop(Timer::Resend);
        }
    }

    /// The resend timer of `id` expired: resend, or give up.
    fn resend_due(&mut self, id: ConnId, now: Instant) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let Some(p) = c.pending.as_mut() else {
            c.timers.stop(Timer::Resend);
            return;
        };
        if p.retries_left == 0 {
            c.pending = None;
            c.timers.stop(Timer::Resend);
            self.retries_exhausted(id, now);
            return;
        }
        p.retries_left -= 1;
        let (mad, wait, peer) = (p.mad, p.wait, c.peer);
        self.arm(id, Timer::Resend, now + wait);
        self.send(peer, mad);
    }

    /// Every resend went unanswered (the kernel's `cm_process_send_error`
    /// and DREQ timeout): a REQ, REP or SIDR_REQ fails as unreachable and
    /// the connection goes; an unanswered DREQ still disconnects.
    fn retries_exhausted(&mut self, id: ConnId, now: Instant) {
        let Some(state) = self.state(id) else { return };
        match state {
            State::DreqSent => {
                self.event(
                    id,
                    Event::Disconnected {
                        conn: id,
                        private_data: Vec::new(),
                    },
                );
                self.enter_timewait(id, now);
            }
            _ => {
                self.event(id, Event::Unreachable { conn: id });
                self.forget(id);
            }
        }
    }

    /// Enters timewait: the IDs and QPN stay reserved for the local ACK
    /// timeout, so late packets of this connection cannot reach a new one.
    pub(crate) fn enter_timewait(&mut self, id: ConnId, now: Instant) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.state = State::Timewait;
        c.pending = None;
        c.timers.stop(Timer::Resend);
        let at = now + iba_time(c.ack_timeout);
        self.arm(id, Timer::Timewait, at);
    }

    fn timewait_over(&mut self, id: ConnId) {
        self.event(id, Event::TimewaitExit { conn: id });
        self.forget(id);
    }

    /// Removes `id` and every lookup entry pointing at it.
    pub(crate) fn forget(&mut self, id: ConnId) {
        let Some(c) = self.conns.remove(&id) else {
            return;
        };
        let guid = c.remote_ca_guid;
        if self.by_remote_id.get(&(guid, c.remote_comm_id)) == Some(&id) {
            self.by_remote_id.remove(&(guid, c.remote_comm_id));
        }
        let qpn = c.exchange.remote_qpn;
        if self.by_remote_qpn.get(&(guid, qpn)) == Some(&id) {
            self.by_remote_qpn.remove(&(guid, qpn));
        }
        self.sidr_by_remote.retain(|_, v| *v != id);
    }

    /// The connection `id` if the peer's message names it rightly: our ID
    /// in `remote_comm_id`, and its own ID, once known, in `local_comm_id`.
    pub(crate) fn matching(&self, our_id: u32, their_id: u32) -> Option<ConnId> {
        let id = ConnId(our_id);
        let c = self.conns.get(&id)?;
        (c.remote_comm_id == 0 || c.remote_comm_id == their_id).then_some(id)
    }

    /// The connection for a command, in one of `allowed` states.
    pub(crate) fn conn_in(
        &self,
        id: ConnId,
        allowed: &[State],
        op: &'static str,
    ) -> Result<&Conn<A>> {
        let c = self.conns.get(&id).ok_or(Error::NoSuchConn(id))?;
        if c.destroyed || !allowed.contains(&c.state) {
            return Err(Error::BadState {
                conn: id,
                state: c.state,
                op,
            });
        }
        Ok(c)
    }

    pub(crate) fn set_state(&mut self, id: ConnId, s: State) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = s;
        }
    }
}
