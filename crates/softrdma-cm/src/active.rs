//! The active side: REQ out, REP in, RTU out; and the MRA and REJ
//! handlers, which both sides share.

use std::hash::Hash;

use softrdma_wire::cm::{
    CmMessage, MessageKind, MraRepr, RejReason, RejRepr, RepRepr, ReqRepr, RtuRepr, TransportType,
    ADDITIONAL_INFO_LEN, EXTENDED_XRC,
};
use softrdma_wire::Psn;

use crate::conn::{Conn, Exchange, State, Timer, Timers};
use crate::limits::Message;
use crate::time::{ack_timeout, iba_time, Instant};
use crate::{CmAgent, ConnId, ConnectParams, Event, Result};

/// The transaction-ID sequence numbers of the requests a connection sends
/// (the answers reuse the request's TID).
pub(crate) mod tid {
    pub const REQ: u64 = 1;
    pub const DREQ: u64 = 2;
    pub const SIDR_REQ: u64 = 3;
}

/// The TID of request `seq` of connection `id`.
pub(crate) fn tid_of(id: ConnId, seq: u64) -> u64 {
    (u64::from(id.0) << 32) | seq
}

impl<A: Copy + Eq + Hash + std::fmt::Debug> CmAgent<A> {
    /// Starts a connection to `peer`: sends a REQ, resent every
    /// 2 × packet lifetime + remote CM response timeout, `max_cm_retries`
    /// times, until a REP, REJ or MRA answers.
    pub fn connect(&mut self, now: Instant, peer: A, p: &ConnectParams) -> Result<ConnId> {
        let id = self.new_conn_id();
        let req = self.build_req(id, p)?;
        let mad = Self::encode_ece(tid_of(id, tid::REQ), CmMessage::Req(req), p.ece)?;
        let conn = Conn {
            id,
            peer,
            state: State::ReqSent,
            active: true,
            remote_comm_id: 0,
            remote_ca_guid: 0,
            service_id: p.service_id,
            tid: tid_of(id, tid::REQ),
            pending: None,
            last_reply: None,
            timers: Timers::default(),
            response_wait: 2 * iba_time(p.packet_life_time)
                + iba_time(p.remote_cm_response_timeout),
            max_retries: p.max_cm_retries,
            ack_timeout: req.primary_path.local_ack_timeout,
            packet_life_time: p.packet_life_time,
            confirm_rep: p.confirm_rep,
            exchange: Exchange::from_connect(p),
            destroyed: false,
            remote_ece: Default::default(),
        };
        self.conns.insert(id, conn);
        self.send_retried(id, now, mad);
        Ok(id)
    }

    fn build_req(&self, id: ConnId, p: &ConnectParams) -> Result<ReqRepr> {
        let mut path = p.path;
        path.local_ack_timeout = ack_timeout(self.config.ack_delay, p.packet_life_time);
        // An XRC initiator has no responder and sends no READ depth,
        // retry counts or SRQ bit: the kernel's CM leaves them zero.
        let xrc = p.transport == TransportType::Extended;
        let unless_xrc = |v: u8| if xrc { 0 } else { v };
        Ok(ReqRepr {
            local_comm_id: id.0,
            vendor_id: p.ece.vendor_id,
            service_id: p.service_id,
            local_ca_guid: self.config.ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: unless_xrc(p.responder_resources),
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: p.remote_cm_response_timeout,
            transport: p.transport,
            end_to_end_flow_control: false,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: p.local_cm_response_timeout,
            retry_count: unless_xrc(p.retry_count),
            pkey: p.pkey,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: unless_xrc(p.rnr_retry_count),
            max_cm_retries: p.max_cm_retries,
            srq: p.srq && !xrc,
            extended_transport: if xrc { EXTENDED_XRC } else { 0 },
            primary_path: path,
            alternate_path: Default::default(),
            sap_supported: false,
            private_data: Message::Req.fill(&p.private_data)?,
        })
    }

    pub(crate) fn on_rep(&mut self, rep: &RepRepr, ece: softrdma_wire::cm::Ece) {
        let Some(id) = self.matching(rep.remote_comm_id, rep.local_comm_id) else {
            self.stats.unmatched += 1;
            return;
        };
        match self.conns[&id].state {
            State::ReqSent | State::MraReqRcvd => self.rep_arrived(id, rep, ece),
            // Our RTU (or MRA) was lost: the passive side resends its REP.
            State::Established | State::MraRepSent | State::DreqSent => self.duplicate(id),
            _ => self.stats.unmatched += 1,
        }
    }

    fn rep_arrived(&mut self, id: ConnId, rep: &RepRepr, ece: softrdma_wire::cm::Ece) {
        self.answered(id);
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.remote_ece = ece;
        c.remote_comm_id = rep.local_comm_id;
        c.remote_ca_guid = rep.local_ca_guid;
        c.ack_timeout = ack_timeout(rep.target_ack_delay, c.packet_life_time);
        c.exchange.adopt_rep(rep);
        let (guid, qpn, confirm) = (c.remote_ca_guid, rep.local_qpn, c.confirm_rep);
        self.by_remote_id.insert((guid, rep.local_comm_id), id);
        self.by_remote_qpn.insert((guid, qpn), id);
        if confirm {
            self.set_state(id, State::RepRcvd);
            let rep = Box::new(*rep);
            self.event(id, Event::ConnectResponse { conn: id, rep });
        } else {
            self.send_rtu(id);
            self.event(id, Event::Established { conn: id });
        }
    }

    /// Confirms a connection held at [`Event::ConnectResponse`]: the RTU
    /// goes out and the connection is established (no further event, as
    /// with `rdma_establish`).
    pub fn establish(&mut self, conn: ConnId) -> Result<()> {
        self.conn_in(conn, &[State::RepRcvd, State::MraRepSent], "establish")?;
        self.send_rtu(conn);
        Ok(())
    }

    fn send_rtu(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let rtu = RtuRepr {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            private_data: [0; softrdma_wire::cm::RTU_PRIVATE_DATA_LEN],
        };
        let Ok(mad) = Self::encode(c.tid, CmMessage::Rtu(rtu)) else {
            return;
        };
        c.state = State::Established;
        c.last_reply = Some(mad);
        let peer = c.peer;
        self.send(peer, mad);
    }

    /// A duplicate of what we already answered: resend the answer.
    pub(crate) fn duplicate(&mut self, id: ConnId) {
        self.stats.duplicates += 1;
        let Some(c) = self.conns.get(&id) else { return };
        if let Some(mad) = c.last_reply {
            let peer = c.peer;
            self.send(peer, mad);
        }
    }

    pub(crate) fn on_mra(&mut self, now: Instant, mra: &MraRepr) {
        let Some(id) = self.matching(mra.remote_comm_id, mra.local_comm_id) else {
            self.stats.unmatched += 1;
            return;
        };
        let next = match (self.conns[&id].state, mra.message_mraed) {
            (State::ReqSent, MessageKind::Req) => State::MraReqRcvd,
            (State::RepSent, MessageKind::Rep) => State::MraRepRcvd,
            (State::MraReqRcvd | State::MraRepRcvd, _) => {
                self.stats.duplicates += 1;
                return;
            }
            _ => {
                self.stats.unmatched += 1;
                return;
            }
        };
        self.extend_wait(id, now, mra.service_timeout);
        self.set_state(id, next);
        let e = Event::MraReceived {
            conn: id,
            service_timeout: mra.service_timeout,
        };
        self.event(id, e);
    }

    /// The peer needs longer: each wait becomes its service timeout plus
    /// the path's ACK timeout (as the kernel's `cm_mra_handler` computes),
    /// starting now; the retries left stay.
    fn extend_wait(&mut self, id: ConnId, now: Instant, service_timeout: u8) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let wait = iba_time(service_timeout) + iba_time(c.ack_timeout);
        if let Some(p) = c.pending.as_mut() {
            p.wait = wait;
            self.arm(id, Timer::Resend, now + wait);
        }
    }

    /// The connection a REJ is for. An active side that gives up before
    /// the REP does not know our ID: its Timeout REJ names itself instead,
    /// by its ID and its CA GUID in the ARI (as the kernel looks it up).
    fn rejected_conn(&self, rej: &RejRepr) -> Option<ConnId> {
        if rej.remote_comm_id != 0 {
            return self.matching(rej.remote_comm_id, rej.local_comm_id);
        }
        if rej.reason != RejReason::Timeout || rej.reject_info_len < 8 {
            return None;
        }
        let mut guid = [0u8; 8];
        guid.copy_from_slice(&rej.ari[..8]);
        let key = (u64::from_be_bytes(guid), rej.local_comm_id);
        self.by_remote_id.get(&key).copied()
    }

    pub(crate) fn on_rej(&mut self, now: Instant, rej: &RejRepr) {
        let Some(id) = self.rejected_conn(rej) else {
            self.stats.unmatched += 1;
            return;
        };
        let state = self.conns[&id].state;
        let stale = rej.reason == RejReason::StaleConnection;
        let timewait = match state {
            State::ReqSent
            | State::MraReqRcvd
            | State::ReqRcvd
            | State::MraReqSent
            | State::RepSent
            | State::MraRepRcvd => stale,
            State::RepRcvd | State::MraRepSent | State::Established => true,
            _ => {
                self.stats.unmatched += 1;
                return;
            }
        };
        let e = Event::Rejected {
            conn: id,
            reason: rej.reason,
            private_data: rej.private_data.to_vec(),
        };
        self.event(id, e);
        if timewait {
            self.enter_timewait(id, now);
        } else {
            self.forget(id);
        }
    }

    /// A REJ answering `rejected` from a peer we keep no connection for.
    pub(crate) fn rej_to(
        &mut self,
        peer: A,
        tid: u64,
        remote_comm_id: u32,
        rejected: MessageKind,
        reason: RejReason,
    ) {
        let rej = RejRepr {
            local_comm_id: 0,
            remote_comm_id,
            message_rejected: rejected,
            reject_info_len: 0,
            reason,
            ari: [0; ADDITIONAL_INFO_LEN],
            private_data: [0; softrdma_wire::cm::REJ_PRIVATE_DATA_LEN],
        };
        if let Ok(mad) = Self::encode(tid, CmMessage::Rej(rej)) {
            self.send(peer, mad);
        }
    }
}

impl Exchange {
    /// The active side's numbers before the REP.
    fn from_connect(p: &ConnectParams) -> Self {
        Exchange {
            transport: p.transport,
            local_qpn: p.qpn,
            remote_qpn: 0,
            local_psn: p.starting_psn,
            remote_psn: Psn::new(0),
            remote_qkey: 0,
            path_mtu: p.path_mtu,
            pkey: p.pkey,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            path: p.path,
        }
    }

    /// What the REP settles: the peer's QP and PSN, and the READ/atomic
    /// depths the passive side chose, mirrored (its responder resources
    /// are our initiator depth and the other way round).
    fn adopt_rep(&mut self, rep: &RepRepr) {
        // An XRC target's QPN comes in the Local EECN field.
        self.remote_qpn = match self.transport {
            TransportType::Extended => rep.local_eecn,
            _ => rep.local_qpn,
        };
        self.remote_psn = rep.starting_psn;
        self.remote_qkey = rep.local_qkey;
        self.initiator_depth = rep.responder_resources;
        self.responder_resources = rep.initiator_depth;
        self.rnr_retry_count = rep.rnr_retry_count;
    }
}
