//! What the consumer gives the agent (connect, accept, SIDR parameters)
//! and what the agent gives back (events).

use softrdma_wire::cm::{CmPath, Ece, RejReason, RepRepr, ReqRepr, SidrStatus, TransportType};
use softrdma_wire::Psn;

/// A connection (and its local communication ID on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u32);

/// The agent's own settings (one agent per port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentConfig {
    /// This CA's GUID, sent in REQ and REP (and used, with the peer's, to
    /// tell connections apart).
    pub ca_guid: u64,
    /// The CA's ACK delay exponent (REP's target ACK delay; part of the
    /// local ACK timeout the active side computes).
    pub ack_delay: u8,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            ca_guid: 0x0002_c903_0000_0001,
            ack_delay: 15,
        }
    }
}

/// What the active side asks for in a REQ (`rdma_connect`'s parameters and
/// the route). Private data is raw: see [`crate::rdma_cm`] for the CMA
/// header rdma_cm puts first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// The service to connect to.
    pub service_id: u64,
    /// RC, UC, or `Extended` for an XRC initiator (the REQ then carries
    /// Extended Transport Type XRC, and the REP's target QPN is read from
    /// its Local EECN field).
    pub transport: TransportType,
    /// The local QP.
    pub qpn: u32,
    /// The REQ's Starting PSN: the first PSN the local QP expects to
    /// receive (as Linux's CM reads it: the peer sends from it).
    pub starting_psn: Psn,
    /// RDMA READ/atomic requests the local QP accepts at once.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests the local QP keeps outstanding.
    pub initiator_depth: u8,
    /// Transport retries on timeout (3 bits).
    pub retry_count: u8,
    /// Retries on RNR NAK the peer should use towards us (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// Path MTU code (1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// Partition key.
    pub pkey: u16,
    /// The local QP uses an SRQ.
    pub srq: bool,
    /// The primary path; its local ACK timeout is computed by the agent
    /// from `packet_life_time` and the CA's ACK delay.
    pub path: CmPath,
    /// The path's packet lifetime exponent (from route resolution).
    pub packet_life_time: u8,
    /// How long the peer's CM may take to answer (exponent).
    pub remote_cm_response_timeout: u8,
    /// How long this CM takes to answer (exponent).
    pub local_cm_response_timeout: u8,
    /// Times the REQ (and later the DREQ) is resent (4 bits).
    pub max_cm_retries: u8,
    /// When true a REP raises [`Event::ConnectResponse`] and the RTU waits
    /// for [`crate::CmAgent::establish`]; when false the RTU goes at once
    /// and [`Event::Established`] is raised.
    pub confirm_rep: bool,
    /// The ECE options the REQ offers (zero, the default: none; the REQ
    /// is then byte for byte what it was before ECE).
    pub ece: Ece,
    /// Raw REQ private data (at most 92 bytes).
    pub private_data: Vec<u8>,
}

impl Default for ConnectParams {
    /// rdma_cm's defaults: CM response timeouts 20 (about 4 s), 15 CM
    /// retries, RoCE packet lifetime 16 (about 268 ms), MTU 1024.
    fn default() -> Self {
        ConnectParams {
            service_id: 0,
            transport: TransportType::Rc,
            qpn: 0,
            starting_psn: Psn::new(0),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            path_mtu: 3,
            pkey: 0xFFFF,
            srq: false,
            path: CmPath::default(),
            packet_life_time: 16,
            remote_cm_response_timeout: 20,
            local_cm_response_timeout: 20,
            max_cm_retries: 15,
            confirm_rep: false,
            ece: Ece::default(),
            private_data: Vec::new(),
        }
    }
}

/// What the passive side answers with (`rdma_accept`'s parameters).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AcceptParams {
    /// The local QP.
    pub qpn: u32,
    /// The REP's Starting PSN: the first PSN the local QP expects to
    /// receive (RC/UC; the peer sends from it).
    pub starting_psn: Psn,
    /// The local Q_Key (SIDR: the UD QP's).
    pub qkey: u32,
    /// RDMA READ/atomic requests the local QP accepts at once.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests the local QP keeps outstanding.
    pub initiator_depth: u8,
    /// Retries on RNR NAK the peer should use towards us (3 bits).
    pub rnr_retry_count: u8,
    /// The local QP uses an SRQ.
    pub srq: bool,
    /// The ECE options the REP answers with (what this side agreed to of
    /// the REQ's offer; zero: none). Not sent in a SIDR_REP.
    pub ece: Ece,
    /// Raw REP (or SIDR_REP) private data.
    pub private_data: Vec<u8>,
}

/// A SIDR query (`rdma_resolve_route` + `rdma_connect` on a UD id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrParams {
    /// The service to resolve.
    pub service_id: u64,
    /// Partition key.
    pub pkey: u16,
    /// How long to wait for each SIDR_REP (exponent).
    pub timeout: u8,
    /// Times the SIDR_REQ is resent.
    pub max_retries: u8,
    /// Raw SIDR_REQ private data (at most 216 bytes).
    pub private_data: Vec<u8>,
}

/// What the agent tells its consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<A> {
    /// A REQ arrived for a listened service: accept, reject or MRA it.
    ConnectRequest {
        /// The new passive connection.
        conn: ConnId,
        /// Who sent it.
        peer: A,
        /// The REQ as received (its private data included).
        req: Box<ReqRepr>,
    },
    /// A REP arrived and the connection waits for [`crate::CmAgent::establish`].
    ConnectResponse {
        /// The connection.
        conn: ConnId,
        /// The REP as received.
        rep: Box<RepRepr>,
    },
    /// The connection is up (RTU sent or received).
    Established {
        /// The connection.
        conn: ConnId,
    },
    /// The peer rejected the connection.
    Rejected {
        /// The connection (now gone, or in timewait for a stale one).
        conn: ConnId,
        /// The reason.
        reason: RejReason,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// Every resend of a REQ, REP or SIDR_REQ went unanswered.
    Unreachable {
        /// The connection (now gone).
        conn: ConnId,
    },
    /// An MRA arrived: the peer needs longer; the wait was extended.
    MraReceived {
        /// The connection.
        conn: ConnId,
        /// The MRA's service timeout exponent.
        service_timeout: u8,
    },
    /// The connection is down (DREQ received, DREP received or DREQ unanswered).
    Disconnected {
        /// The connection.
        conn: ConnId,
        /// The DREQ's or DREP's private data (empty after a timeout).
        private_data: Vec<u8>,
    },
    /// The connection left timewait and is gone; its QP may be reused.
    TimewaitExit {
        /// The connection.
        conn: ConnId,
    },
    /// A SIDR_REQ arrived for a listened service: accept or reject it.
    SidrRequest {
        /// The request (answer it with accept or reject).
        conn: ConnId,
        /// Who sent it.
        peer: A,
        /// The service asked for.
        service_id: u64,
        /// The SIDR_REQ's private data.
        private_data: Vec<u8>,
    },
    /// A SIDR_REP answered our SIDR_REQ.
    SidrResolved {
        /// The request (now gone).
        conn: ConnId,
        /// Success or why not.
        status: SidrStatus,
        /// The UD QP serving the service.
        qpn: u32,
        /// Its Q_Key.
        qkey: u32,
        /// The SIDR_REP's private data.
        private_data: Vec<u8>,
    },
}
