//! One connection's record: its state, its named timers, the message it
//! resends until answered and the numbers the exchange settled.

use std::time::Duration;

use softrdma_wire::cm::{CmPath, Ece, TransportType};
use softrdma_wire::mad::MAD_LEN;
use softrdma_wire::Psn;

use crate::time::Instant;
use crate::ConnId;

/// The CM states of IBTA vol. 1, 12.9 (alternate-path states left out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Not connected (a new active connection before its REQ).
    Idle,
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    /// Active: the peer MRA'd our REQ.
    MraReqRcvd,
    /// Passive: REQ received, the consumer decides.
    ReqRcvd,
    /// Passive: we MRA'd the REQ.
    MraReqSent,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Passive: the peer MRA'd our REP.
    MraRepRcvd,
    /// Active: REP received, the consumer confirms.
    RepRcvd,
    /// Active: we MRA'd the REP.
    MraRepSent,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received, the consumer answers with disconnect.
    DreqRcvd,
    /// Disconnected; the IDs and QPN stay reserved until the timer ends.
    Timewait,
    /// SIDR_REQ sent, waiting for SIDR_REP.
    SidrReqSent,
    /// SIDR_REQ received, the consumer decides.
    SidrReqRcvd,
}

/// A connection's timers, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// The wait for an answer to the pending message; on expiry it is
    /// resent, or, its retries spent, the exchange fails.
    Resend,
    /// The end of timewait.
    Timewait,
}

/// The deadline of each [`Timer`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Timers([Option<Instant>; 2]);

impl Timers {
    fn index(t: Timer) -> usize {
        match t {
            Timer::Resend => 0,
            Timer::Timewait => 1,
        }
    }
    pub fn set(&mut self, t: Timer, at: Instant) {
        self.0[Self::index(t)] = Some(at);
    }
    pub fn stop(&mut self, t: Timer) {
        self.0[Self::index(t)] = None;
    }
    pub fn get(&self, t: Timer) -> Option<Instant> {
        self.0[Self::index(t)]
    }
}

/// A message resent until its answer arrives.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub mad: [u8; MAD_LEN],
    pub retries_left: u8,
    /// The wait after each send (an MRA lengthens it).
    pub wait: Duration,
}

/// The QP numbers an exchange settles (what `init_qp_attr` reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exchange {
    pub transport: TransportType,
    pub local_qpn: u32,
    pub remote_qpn: u32,
    pub local_psn: Psn,
    pub remote_psn: Psn,
    pub remote_qkey: u32,
    pub path_mtu: u8,
    pub pkey: u16,
    /// RDMA READ/atomics we accept at once (max_dest_rd_atomic).
    pub responder_resources: u8,
    /// RDMA READ/atomics we keep outstanding (max_rd_atomic).
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// The path as the local side sees it (local GID first).
    pub path: CmPath,
}

/// One connection.
#[derive(Debug, Clone)]
pub(crate) struct Conn<A> {
    pub id: ConnId,
    pub peer: A,
    pub state: State,
    pub active: bool,
    pub remote_comm_id: u32,
    pub remote_ca_guid: u64,
    pub service_id: u64,
    /// The transaction ID of the exchange under way.
    pub tid: u64,
    pub pending: Option<Pending>,
    /// The last one-shot answer (MRA, RTU, DREP), resent on a duplicate.
    pub last_reply: Option<[u8; MAD_LEN]>,
    pub timers: Timers,
    /// The wait after a REQ, REP or DREQ.
    pub response_wait: Duration,
    pub max_retries: u8,
    /// The local ACK timeout exponent; timewait lasts as long.
    pub ack_timeout: u8,
    /// The path's packet lifetime exponent (active side; with the REP's
    /// target ACK delay it gives the ACK timeout).
    pub packet_life_time: u8,
    pub confirm_rep: bool,
    pub exchange: Exchange,
    /// Destroyed by the consumer: no more events, gone after timewait.
    pub destroyed: bool,
    /// The ECE the peer's REQ (passive side) or REP (active side) carried.
    pub remote_ece: Ece,
}
