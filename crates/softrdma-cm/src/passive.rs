//! The passive side: REQ in (new, duplicate, stale or unlistened), the
//! consumer's accept, reject or MRA, RTU in.

use std::hash::Hash;

use softrdma_wire::cm::{
    CmMessage, CmPath, Ece, MessageKind, MraRepr, RejReason, RejRepr, RepRepr, ReqRepr,
    TransportType, ADDITIONAL_INFO_LEN,
};

use crate::agent::{HeldReq, MAX_HELD};
use crate::conn::{Conn, Exchange, State, Timers};
use crate::limits::Message;
use crate::time::{iba_time, Instant};
use crate::{AcceptParams, CmAgent, ConnId, Error, Event, Result};

impl<A: Copy + Eq + Hash + std::fmt::Debug> CmAgent<A> {
    pub(crate) fn on_req(&mut self, from: A, tid: u64, req: &ReqRepr, ece: Ece) {
        let guid = req.local_ca_guid;
        if let Some(&id) = self.by_remote_id.get(&(guid, req.local_comm_id)) {
            return self.duplicate_req(id, from, tid, req);
        }
        let reject = |reason| (reason, req.local_comm_id);
        let refusal = if self.by_remote_qpn.contains_key(&(guid, req.local_qpn)) {
            // The QP is still connected to, or in timewait with, one of ours.
            Some(reject(RejReason::StaleConnection))
        } else if !self.listeners.contains(&req.service_id) {
            if self.reserved.contains(&req.service_id) {
                // A resent REQ replaces the one held.
                let held = HeldReq {
                    from,
                    tid,
                    req: *req,
                    ece,
                };
                let same = |h: &&mut HeldReq<A>| {
                    (h.req.local_ca_guid, h.req.local_comm_id) == (guid, req.local_comm_id)
                };
                if let Some(h) = self.held.iter_mut().find(same) {
                    *h = held;
                    return;
                }
                if self.held.len() < MAX_HELD {
                    self.held.push(held);
                    return;
                }
            }
            // As the kernel's cm.c: no listener → invalid service ID.
            Some(reject(RejReason::InvalidServiceId))
        } else if req.transport == TransportType::Rd
            || (req.transport == TransportType::Extended && !req.is_xrc())
        {
            Some(reject(RejReason::InvalidTransportType))
        } else {
            None
        };
        if let Some((reason, remote)) = refusal {
            self.rej_to(from, tid, remote, MessageKind::Req, reason);
            return;
        }
        self.new_passive(from, tid, req, ece);
    }

    fn new_passive(&mut self, from: A, tid: u64, req: &ReqRepr, ece: Ece) {
        let id = self.new_conn_id();
        let conn = Conn {
            id,
            peer: from,
            state: State::ReqRcvd,
            active: false,
            remote_comm_id: req.local_comm_id,
            remote_ca_guid: req.local_ca_guid,
            service_id: req.service_id,
            tid,
            pending: None,
            last_reply: None,
            timers: Timers::default(),
            response_wait: iba_time(req.local_cm_response_timeout),
            max_retries: req.max_cm_retries,
            ack_timeout: req.primary_path.local_ack_timeout,
            packet_life_time: req.primary_path.local_ack_timeout.saturating_sub(1),
            confirm_rep: false,
            exchange: Exchange::from_req(req),
            destroyed: false,
            remote_ece: ece,
        };
        self.conns.insert(id, conn);
        let guid = req.local_ca_guid;
        self.by_remote_id.insert((guid, req.local_comm_id), id);
        self.by_remote_qpn.insert((guid, req.local_qpn), id);
        let e = Event::ConnectRequest {
            conn: id,
            peer: from,
            req: Box::new(*req),
        };
        self.event(id, e);
    }

    /// A REQ for a connection we already have: the requester missed our
    /// answer. An MRA or REP is resent; in timewait the REQ is stale.
    fn duplicate_req(&mut self, id: ConnId, from: A, tid: u64, req: &ReqRepr) {
        self.stats.duplicates += 1;
        let Some(c) = self.conns.get(&id) else { return };
        let resend = match c.state {
            State::MraReqSent => c.last_reply,
            State::RepSent | State::MraRepRcvd => c.pending.as_ref().map(|p| p.mad),
            State::Timewait => {
                let (remote, kind) = (req.local_comm_id, MessageKind::Req);
                self.rej_to(from, tid, remote, kind, RejReason::StaleConnection);
                return;
            }
            _ => None,
        };
        if let Some(mad) = resend {
            let peer = c.peer;
            self.send(peer, mad);
        }
    }

    /// Accepts a connection request (REP, resent until the RTU) or a SIDR
    /// request (SIDR_REP with the QPN and Q_Key).
    pub fn accept(&mut self, now: Instant, conn: ConnId, p: &AcceptParams) -> Result<()> {
        let allowed = [State::ReqRcvd, State::MraReqSent, State::SidrReqRcvd];
        let c = self.conn_in(conn, &allowed, "accept")?;
        if c.state == State::SidrReqRcvd {
            return self.sidr_answer(conn, softrdma_wire::cm::SidrStatus::Success, p);
        }
        // For an XRC request the REP answers for an XRC target: its QPN
        // goes in the Local EECN field, the SRQ bit is set and there is no
        // initiator depth (as the kernel's cm_format_rep).
        let xrc = c.exchange.transport == TransportType::Extended;
        let rep = RepRepr {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            local_qkey: p.qkey,
            local_qpn: if xrc { 0 } else { p.qpn },
            vendor_id: p.ece.vendor_id,
            local_eecn: if xrc { p.qpn } else { 0 },
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: if xrc { 0 } else { p.initiator_depth },
            target_ack_delay: self.config.ack_delay,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq || xrc,
            local_ca_guid: self.config.ca_guid,
            private_data: Message::Rep.fill(&p.private_data)?,
        };
        let mad = Self::encode_ece(c.tid, CmMessage::Rep(rep), p.ece)?;
        let Some(c) = self.conns.get_mut(&conn) else {
            return Err(Error::NoSuchConn(conn));
        };
        c.exchange.adopt_accept(p);
        c.state = State::RepSent;
        self.send_retried(conn, now, mad);
        Ok(())
    }

    /// Rejects a connection request (or, on the active side, a REP) with
    /// `reason` and up to 148 bytes of private data; a SIDR request is
    /// answered with status Reject.
    pub fn reject(
        &mut self,
        now: Instant,
        conn: ConnId,
        reason: RejReason,
        private_data: &[u8],
    ) -> Result<()> {
        let allowed = [
            State::ReqRcvd,
            State::MraReqSent,
            State::RepRcvd,
            State::MraRepSent,
            State::SidrReqRcvd,
        ];
        let c = self.conn_in(conn, &allowed, "reject")?;
        if c.state == State::SidrReqRcvd {
            let p = AcceptParams {
                private_data: private_data.to_vec(),
                ..AcceptParams::default()
            };
            return self.sidr_answer(conn, softrdma_wire::cm::SidrStatus::Reject, &p);
        }
        let after_rep = matches!(c.state, State::RepRcvd | State::MraRepSent);
        let kind = if after_rep {
            MessageKind::Rep
        } else {
            MessageKind::Req
        };
        let mad = self.rej_mad(c, kind, reason, private_data)?;
        let peer = c.peer;
        self.send(peer, mad);
        // After a REP the peer's QP may already send: wait out its packets.
        if after_rep {
            self.enter_timewait(conn, now);
        } else {
            self.forget(conn);
        }
        Ok(())
    }

    pub(crate) fn rej_mad(
        &self,
        c: &Conn<A>,
        kind: MessageKind,
        reason: RejReason,
        private_data: &[u8],
    ) -> Result<[u8; softrdma_wire::mad::MAD_LEN]> {
        let mut ari = [0; ADDITIONAL_INFO_LEN];
        let mut ari_len = 0;
        if reason == RejReason::Timeout {
            // A timeout REJ names the CA that timed out (IBTA 12.6.7.2).
            ari[..8].copy_from_slice(&self.config.ca_guid.to_be_bytes());
            ari_len = 8;
        }
        let rej = RejRepr {
            local_comm_id: c.id.0,
            remote_comm_id: c.remote_comm_id,
            message_rejected: kind,
            reject_info_len: ari_len,
            reason,
            ari,
            private_data: Message::Rej.fill(private_data)?,
        };
        Self::encode(c.tid, CmMessage::Rej(rej))
    }

    /// Tells the requester (REQ) or the responder (REP) that the answer
    /// will take up to 4.096 µs × 2^`service_timeout`.
    pub fn send_mra(&mut self, conn: ConnId, service_timeout: u8) -> Result<()> {
        let allowed = [State::ReqRcvd, State::RepRcvd];
        let c = self.conn_in(conn, &allowed, "send_mra")?;
        let (kind, next) = match c.state {
            State::ReqRcvd => (MessageKind::Req, State::MraReqSent),
            _ => (MessageKind::Rep, State::MraRepSent),
        };
        let mra = MraRepr {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            message_mraed: kind,
            service_timeout,
            private_data: [0; softrdma_wire::cm::MRA_PRIVATE_DATA_LEN],
        };
        let mad = Self::encode(c.tid, CmMessage::Mra(mra))?;
        let peer = c.peer;
        if let Some(c) = self.conns.get_mut(&conn) {
            c.state = next;
            c.last_reply = Some(mad);
        }
        self.send(peer, mad);
        Ok(())
    }

    pub(crate) fn on_rtu(&mut self, rtu: &softrdma_wire::cm::RtuRepr) {
        let Some(id) = self.matching(rtu.remote_comm_id, rtu.local_comm_id) else {
            self.stats.unmatched += 1;
            return;
        };
        match self.conns[&id].state {
            State::RepSent | State::MraRepRcvd => self.passive_established(id),
            State::Established => self.stats.duplicates += 1,
            _ => self.stats.unmatched += 1,
        }
    }

    /// The QP saw the peer's first packet before the RTU (the verbs
    /// COMM_EST event, `ib_cm_notify`): the connection is established.
    pub fn notify_established(&mut self, conn: ConnId) -> Result<()> {
        let allowed = [State::RepSent, State::MraRepRcvd, State::Established];
        if self.conn_in(conn, &allowed, "notify_established")?.state != State::Established {
            self.passive_established(conn);
        }
        Ok(())
    }

    fn passive_established(&mut self, id: ConnId) {
        self.answered(id);
        self.set_state(id, State::Established);
        self.event(id, Event::Established { conn: id });
    }
}

impl Exchange {
    /// The passive side's numbers from the REQ: the peer's QP and PSN, and
    /// its READ/atomic depths mirrored, until the accept sets our own.
    fn from_req(req: &ReqRepr) -> Self {
        let p = &req.primary_path;
        Exchange {
            transport: req.transport,
            local_qpn: 0,
            remote_qpn: req.local_qpn,
            local_psn: softrdma_wire::Psn::new(0),
            remote_psn: req.starting_psn,
            remote_qkey: req.local_qkey,
            path_mtu: req.path_mtu,
            pkey: req.pkey,
            responder_resources: req.initiator_depth,
            initiator_depth: req.responder_resources,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            path: CmPath {
                local_lid: p.remote_lid,
                remote_lid: p.local_lid,
                local_gid: p.remote_gid,
                remote_gid: p.local_gid,
                ..*p
            },
        }
    }

    fn adopt_accept(&mut self, p: &AcceptParams) {
        self.local_qpn = p.qpn;
        self.local_psn = p.starting_psn;
        self.responder_resources = p.responder_resources;
        self.initiator_depth = p.initiator_depth;
    }
}
