//! Disconnection: DREQ (resent until the DREP), DREP, timewait, and what
//! destroying a connection sends in each state.

use std::hash::Hash;

use softrdma_wire::cm::{CmMessage, DrepRepr, DreqRepr, MessageKind, RejReason};
use softrdma_wire::mad::MAD_LEN;

use crate::active::{tid, tid_of};
use crate::conn::State;
use crate::limits::Message;
use crate::time::Instant;
use crate::{CmAgent, ConnId, Event, Result};

impl<A: Copy + Eq + Hash + std::fmt::Debug> CmAgent<A> {
    /// Disconnects: from Established a DREQ goes out (resent until the
    /// DREP; unanswered, the connection still disconnects); after the
    /// peer's DREQ ([`Event::Disconnected`]) the DREP goes out. Either way
    /// the connection then waits out timewait.
    pub fn disconnect(&mut self, now: Instant, conn: ConnId, private_data: &[u8]) -> Result<()> {
        let c = self.conn_in(conn, &[State::Established, State::DreqRcvd], "disconnect")?;
        if c.state == State::DreqRcvd {
            let mad = self.drep_mad(conn, private_data)?;
            self.send_reply(conn, mad);
            self.enter_timewait(conn, now);
            return Ok(());
        }
        let mad = self.dreq_mad(conn, private_data)?;
        self.set_state(conn, State::DreqSent);
        self.send_retried(conn, now, mad);
        Ok(())
    }

    fn dreq_mad(&self, id: ConnId, private_data: &[u8]) -> Result<[u8; MAD_LEN]> {
        let c = &self.conns[&id];
        let dreq = DreqRepr {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            remote_qpn: c.exchange.remote_qpn,
            private_data: Message::Dreq.fill(private_data)?,
        };
        Self::encode(tid_of(id, tid::DREQ), CmMessage::Dreq(dreq))
    }

    fn drep_mad(&self, id: ConnId, private_data: &[u8]) -> Result<[u8; MAD_LEN]> {
        let c = &self.conns[&id];
        let drep = DrepRepr {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            private_data: Message::Drep.fill(private_data)?,
        };
        Self::encode(c.tid, CmMessage::Drep(drep))
    }

    /// Sends a one-shot answer and keeps it for duplicates.
    fn send_reply(&mut self, id: ConnId, mad: [u8; MAD_LEN]) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.last_reply = Some(mad);
            let peer = c.peer;
            self.send(peer, mad);
        }
    }

    pub(crate) fn on_dreq(&mut self, now: Instant, from: A, tid: u64, dreq: &DreqRepr) {
        let Some(id) = self.matching(dreq.remote_comm_id, dreq.local_comm_id) else {
            // Gone already (timewait over): the peer only lost our DREP.
            // Answer, as the kernel's `cm_issue_drep` does, or it waits out
            // every retry.
            self.stats.unmatched += 1;
            let drep = DrepRepr {
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                private_data: [0; softrdma_wire::cm::DREP_PRIVATE_DATA_LEN],
            };
            if let Ok(mad) = Self::encode(tid, CmMessage::Drep(drep)) {
                self.send(from, mad);
            }
            return;
        };
        let c = &self.conns[&id];
        if c.remote_comm_id == 0 || c.exchange.local_qpn != dreq.remote_qpn {
            // Not for this connection's QP (as the kernel checks).
            self.stats.unmatched += 1;
            return;
        }
        match c.state {
            // A lost RTU: the peer is established and already leaving.
            State::Established | State::RepSent | State::MraRepRcvd => {
                self.answered(id);
                self.peer_disconnected(id, tid, &dreq.private_data);
            }
            // Both sides disconnect at once: answer, and both wait out timewait.
            State::DreqSent => {
                self.peer_disconnected(id, tid, &dreq.private_data);
                if let Ok(mad) = self.drep_mad(id, &[]) {
                    self.send_reply(id, mad);
                }
                self.enter_timewait(id, now);
            }
            State::DreqRcvd => self.stats.duplicates += 1,
            // Our DREP was lost.
            State::Timewait => self.duplicate(id),
            _ => self.stats.unmatched += 1,
        }
    }

    fn peer_disconnected(&mut self, id: ConnId, tid: u64, private_data: &[u8]) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.tid = tid;
            c.state = State::DreqRcvd;
        }
        let e = Event::Disconnected {
            conn: id,
            private_data: private_data.to_vec(),
        };
        self.event(id, e);
    }

    pub(crate) fn on_drep(&mut self, now: Instant, drep: &DrepRepr) {
        let Some(id) = self.matching(drep.remote_comm_id, drep.local_comm_id) else {
            self.stats.unmatched += 1;
            return;
        };
        if self.conns[&id].state != State::DreqSent {
            self.stats.unmatched += 1;
            return;
        }
        let e = Event::Disconnected {
            conn: id,
            private_data: drep.private_data.to_vec(),
        };
        self.event(id, e);
        self.enter_timewait(id, now);
    }

    /// Destroys a connection, telling the peer as the kernel's
    /// `cm_destroy_id` does: a REJ (Timeout on the active side before the
    /// REP, consumer-defined otherwise), a DREQ or a DREP, each sent once.
    /// A connection that was up still waits out timewait, silently.
    pub fn destroy(&mut self, now: Instant, conn: ConnId) -> Result<()> {
        let c = self.conn_in(conn, &all_states(), "destroy")?;
        let state = c.state;
        let rej = |s: &Self, kind, reason| s.rej_mad(&s.conns[&conn], kind, reason, &[]).ok();
        let (mad, timewait) = match state {
            State::ReqSent | State::MraReqRcvd => {
                (rej(self, MessageKind::Req, RejReason::Timeout), false)
            }
            State::ReqRcvd | State::MraReqSent | State::RepSent | State::MraRepRcvd => (
                rej(self, MessageKind::Req, RejReason::ConsumerDefined),
                false,
            ),
            State::RepRcvd | State::MraRepSent => (
                rej(self, MessageKind::Rep, RejReason::ConsumerDefined),
                true,
            ),
            State::Established => (self.dreq_mad(conn, &[]).ok(), true),
            State::DreqRcvd => (self.drep_mad(conn, &[]).ok(), true),
            State::DreqSent | State::Timewait => (None, true),
            State::SidrReqRcvd => {
                let p = crate::AcceptParams::default();
                let status = softrdma_wire::cm::SidrStatus::Reject;
                let _ = self.sidr_answer(conn, status, &p);
                return Ok(());
            }
            State::Idle | State::SidrReqSent => (None, false),
        };
        if let Some(mad) = mad {
            let peer = self.conns[&conn].peer;
            self.send(peer, mad);
        }
        if timewait {
            if state != State::Timewait {
                self.enter_timewait(conn, now);
            }
            if let Some(c) = self.conns.get_mut(&conn) {
                c.destroyed = true;
            }
        } else {
            self.forget(conn);
        }
        Ok(())
    }
}

fn all_states() -> [State; 15] {
    [
        State::Idle,
        State::ReqSent,
        State::MraReqRcvd,
        State::ReqRcvd,
        State::MraReqSent,
        State::RepSent,
        State::MraRepRcvd,
        State::RepRcvd,
        State::MraRepSent,
        State::Established,
        State::DreqSent,
        State::DreqRcvd,
        State::Timewait,
        State::SidrReqSent,
        State::SidrReqRcvd,
    ]
}
