//! Service ID Resolution (IBTA 12.11): a UD client asks which QPN and
//! Q_Key serve a service ID; one SIDR_REQ (resent until answered), one
//! SIDR_REP, no connection.

use std::hash::Hash;

use softrdma_wire::cm::{CmMessage, SidrRepRepr, SidrReqRepr, SidrStatus, ADDITIONAL_INFO_LEN};

use crate::active::{tid, tid_of};
use crate::conn::{Conn, Exchange, State, Timers};
use crate::limits::Message;
use crate::time::{iba_time, Instant};
use crate::{AcceptParams, CmAgent, ConnId, Event, Result, SidrParams};

impl<A: Copy + Eq + Hash + std::fmt::Debug> CmAgent<A> {
    /// Asks `peer` which UD QP serves `p.service_id`; the answer is an
    /// [`Event::SidrResolved`], or [`Event::Unreachable`] once every resend
    /// (each after 4.096 µs × 2^`p.timeout`) went unanswered.
    pub fn sidr_resolve(&mut self, now: Instant, peer: A, p: &SidrParams) -> Result<ConnId> {
        let id = self.new_conn_id();
        let req = SidrReqRepr {
            request_id: id.0,
            pkey: p.pkey,
            service_id: p.service_id,
            private_data: Message::SidrReq.fill(&p.private_data)?,
        };
        let t = tid_of(id, tid::SIDR_REQ);
        let mad = Self::encode(t, CmMessage::SidrReq(req))?;
        let conn = Conn {
            state: State::SidrReqSent,
            active: true,
            service_id: p.service_id,
            response_wait: iba_time(p.timeout),
            max_retries: p.max_retries,
            ..self.sidr_conn(id, peer, t)
        };
        self.conns.insert(id, conn);
        self.send_retried(id, now, mad);
        Ok(id)
    }

    fn sidr_conn(&self, id: ConnId, peer: A, tid: u64) -> Conn<A> {
        Conn {
            id,
            peer,
            state: State::SidrReqRcvd,
            active: false,
            remote_comm_id: 0,
            remote_ca_guid: 0,
            service_id: 0,
            tid,
            pending: None,
            last_reply: None,
            timers: Timers::default(),
            response_wait: iba_time(0),
            max_retries: 0,
            ack_timeout: 0,
            packet_life_time: 0,
            confirm_rep: false,
            exchange: Exchange::none(),
            destroyed: false,
            remote_ece: Default::default(),
        }
    }

    pub(crate) fn on_sidr_req(&mut self, from: A, tid: u64, r: &SidrReqRepr) {
        if self.sidr_by_remote.contains_key(&(from, r.request_id)) {
            // Still being answered by the consumer.
            self.stats.duplicates += 1;
            return;
        }
        if !self.listeners.contains(&r.service_id) {
            // As the kernel: no listener → status Unsupported.
            let rep = sidr_rep(r.request_id, r.service_id, SidrStatus::Unsupported);
            if let Ok(mad) = Self::encode(tid, CmMessage::SidrRep(rep)) {
                self.send(from, mad);
            }
            return;
        }
        let id = self.new_conn_id();
        let conn = Conn {
            remote_comm_id: r.request_id,
            service_id: r.service_id,
            ..self.sidr_conn(id, from, tid)
        };
        self.conns.insert(id, conn);
        self.sidr_by_remote.insert((from, r.request_id), id);
        let e = Event::SidrRequest {
            conn: id,
            peer: from,
            service_id: r.service_id,
            private_data: r.private_data.to_vec(),
        };
        self.event(id, e);
    }

    /// Answers a SIDR request with `status` (the QPN and Q_Key of `p` when
    /// it is Success); the request is then gone.
    pub(crate) fn sidr_answer(
        &mut self,
        id: ConnId,
        status: SidrStatus,
        p: &AcceptParams,
    ) -> Result<()> {
        let c = &self.conns[&id];
        let mut rep = sidr_rep(c.remote_comm_id, c.service_id, status);
        if status == SidrStatus::Success {
            rep.qpn = p.qpn;
            rep.qkey = p.qkey;
        }
        rep.private_data = Message::SidrRep.fill(&p.private_data)?;
        let mad = Self::encode(c.tid, CmMessage::SidrRep(rep))?;
        let peer = c.peer;
        self.send(peer, mad);
        self.forget(id);
        Ok(())
    }

    pub(crate) fn on_sidr_rep(&mut self, r: &SidrRepRepr) {
        let id = ConnId(r.request_id);
        if self.state(id) != Some(State::SidrReqSent) {
            self.stats.unmatched += 1;
            return;
        }
        let e = Event::SidrResolved {
            conn: id,
            status: r.status,
            qpn: r.qpn,
            qkey: r.qkey,
            private_data: r.private_data.to_vec(),
        };
        self.event(id, e);
        self.forget(id);
    }
}

fn sidr_rep(request_id: u32, service_id: u64, status: SidrStatus) -> SidrRepRepr {
    SidrRepRepr {
        request_id,
        status,
        additional_info_len: 0,
        qpn: 0,
        service_id,
        qkey: 0,
        additional_info: [0; ADDITIONAL_INFO_LEN],
        private_data: [0; softrdma_wire::cm::SIDR_REP_PRIVATE_DATA_LEN],
    }
}

impl Exchange {
    /// No QP exchange (SIDR).
    pub(crate) fn none() -> Self {
        Exchange {
            transport: softrdma_wire::cm::TransportType::Rc,
            local_qpn: 0,
            remote_qpn: 0,
            local_psn: softrdma_wire::Psn::new(0),
            remote_psn: softrdma_wire::Psn::new(0),
            remote_qkey: 0,
            path_mtu: 0,
            pkey: 0,
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 0,
            rnr_retry_count: 0,
            path: Default::default(),
        }
    }
}
