//! The QP attributes a connection's exchange settles, for each state the
//! consumer moves its QP to (what `rdma_init_qp_attr` / the kernel's
//! `ib_cm_init_qp_attr` fill in). Only the numbers: the QP is the
//! consumer's.

use std::hash::Hash;

use softrdma_wire::cm::CmPath;
use softrdma_wire::Psn;

use crate::conn::State;
use crate::{CmAgent, ConnId, Error, Result};

/// The QP state the attributes are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// INIT: access rights.
    Init,
    /// RTR: the remote QP, its PSN, the path and the READ/atomic depth we serve.
    Rtr,
    /// RTS: our PSN, the ACK timeout, retry counts and the READ/atomic depth we use.
    Rts,
}

/// The attributes for one transition; fields a state does not set are
/// still filled with the exchange's value, the consumer applies those its
/// mask names (see [`QpState`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// The target state.
    pub qp_state: QpState,
    /// INIT: remote READ and atomics allowed (we serve at least one).
    pub remote_read_atomic: bool,
    /// RTR: path MTU code.
    pub path_mtu: u8,
    /// RTR: the peer's QPN.
    pub dest_qp_num: u32,
    /// RTR: the first PSN we expect (the Starting PSN we sent).
    pub rq_psn: Psn,
    /// RTR: READ/atomic requests we accept at once.
    pub max_dest_rd_atomic: u8,
    /// RTR: the address vector (local GID first).
    pub path: CmPath,
    /// RTR: partition key.
    pub pkey: u16,
    /// RTS: the first PSN we send (the Starting PSN the peer sent).
    pub sq_psn: Psn,
    /// RTS: the local ACK timeout exponent.
    pub timeout: u8,
    /// RTS: transport retries.
    pub retry_cnt: u8,
    /// RTS: RNR retries.
    pub rnr_retry: u8,
    /// RTS: READ/atomic requests we keep outstanding.
    pub max_rd_atomic: u8,
}

impl<A: Copy + Eq + Hash + std::fmt::Debug> CmAgent<A> {
    /// The attributes to move the QP of `conn` to `target`. RTR needs the
    /// peer's numbers (passive: from the REQ; active: from the REP) and our
    /// own starting PSN (passive: after accept).
    pub fn init_qp_attr(&self, conn: ConnId, target: QpState) -> Result<QpAttr> {
        let c = self.conns.get(&conn).ok_or(Error::NoSuchConn(conn))?;
        let known = if c.active {
            matches!(
                c.state,
                State::RepRcvd | State::MraRepSent | State::Established
            ) || target == QpState::Init
        } else {
            let accepted = matches!(
                c.state,
                State::RepSent | State::MraRepRcvd | State::Established
            );
            let requested = matches!(c.state, State::ReqRcvd | State::MraReqSent);
            // As Linux's CM, RTR is offered from the REQ on (a consumer
            // reads the path and the peer's QP there: UCX takes the
            // peer's GID from it before it accepts); its rq_psn, our own
            // starting PSN, is only known once the accept sets it (0
            // before). RTS waits for the accept.
            accepted || (requested && target != QpState::Rts)
        };
        if !known {
            return Err(Error::BadState {
                conn,
                state: c.state,
                op: "init_qp_attr",
            });
        }
        let x = &c.exchange;
        Ok(QpAttr {
            qp_state: target,
            remote_read_atomic: x.responder_resources > 0,
            path_mtu: x.path_mtu,
            dest_qp_num: x.remote_qpn,
            // As Linux's CM: a REQ's or REP's Starting PSN is the first PSN
            // its sender's QP expects to receive (cm.c sets the sender's
            // rq_psn and the receiver's sq_psn from it).
            rq_psn: x.local_psn,
            max_dest_rd_atomic: x.responder_resources,
            path: x.path,
            pkey: x.pkey,
            sq_psn: x.remote_psn,
            timeout: c.ack_timeout,
            retry_cnt: x.retry_count,
            rnr_retry: x.rnr_retry_count,
            max_rd_atomic: x.initiator_depth,
        })
    }
}
