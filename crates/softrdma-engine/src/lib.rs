//! # softrdma-engine
//!
//! The soft HCA's logic with no sockets, threads or clocks in it: verbs
//! objects (protection domains, memory regions, CQs, SRQs, address handles,
//! QPs of type RC, UC and UD), the QP state machine with the exact attribute
//! rules of `ibv_modify_qp`, and the reliable and unreliable transports.
//!
//! The interface follows quinn-proto. Commands come from the application
//! ([`Engine::post_send`], [`Engine::modify_qp`], …); the network and the clock
//! come from a driver ([`Engine::handle_packet`], [`Engine::handle_timeout`]);
//! what to do next goes back out ([`Engine::poll_transmit`],
//! [`Engine::poll_timeout`], [`Engine::poll_event`], [`Engine::poll_cq`]).
//! The same engine runs under the UDP driver, the shared-memory driver and
//! the deterministic network simulator of the test suite.
//!
//! Memory is reached through [`RegionMemory`], so the engine checks keys,
//! bounds and rights and then copies; it never holds references into memory
//! that remote peers write.

#![forbid(unsafe_code)]

mod completer;
mod congestion;
mod counters;
mod dcqcn;
mod engine;
mod error;
mod fasthash;
mod gsi;
mod handle;
mod mcast;
mod memory;
mod qp;
pub mod qp_attr;
mod requester;
mod resources;
mod responder;
mod rng;
pub mod rules;
mod send_records;
pub mod sim;
pub mod sr;
mod time;
mod timely;
mod timers;
mod wr;

pub use congestion::{
    CcCounters, CongestionConfig, CongestionControl, CongestionQp, EcnAction, FixedWindow,
    SendVerdict, SentPacket,
};
pub use counters::Counters;
pub use dcqcn::{Dcqcn, DcqcnParams};
pub use engine::{
    DirectOp, DirectPlan, Engine, EngineConfig, GrantFacts, GrantRefusal, NotDirect, PeerQp,
    PeerRegion, PeerView, QpInit, RxMeta, SrcPortPolicy, SrqInit, MAX_CQE, MAX_DIRECT_SGE, MAX_QP,
};
pub use error::{errno, Result, VerbsError};
pub use gsi::{GsiMad, DEFAULT_PKEY, GSI_RX_MAX, GSI_TX_MAX};
pub use handle::{AhHandle, CqHandle, Lkey, MwHandle, PdHandle, Qpn, Rkey, SrqHandle, XrcdHandle};
pub use mcast::{MAX_MCAST_GRP, MAX_MCAST_QP_ATTACH, MAX_TOTAL_MCAST_QP_ATTACH, MCAST_QPN};
pub use memory::{RegionMemory, VecMemory, VEC_MEMORY_TX_BASE};
pub use qp_attr::{
    AccessFlags, AhAttr, AttrLimits, AttrMask, Gid, GidParseError, ModifyQpError, Mtu, QpAttr,
    QpCap, QpState, QpType,
};
pub use requester::{Transmit, TxPayload};
pub use resources::{Event, MrKeys, ResourceChange};
pub use responder::GRH_LEN;
pub use rng::Rng;
pub use rules::MAX_MSG_SIZE;
pub use sr::Ece;
pub use time::{local_ack_timeout, Instant};
pub use timely::{Timely, TimelyParams};
pub use wr::{
    MwBind, MwType, NetworkHdr, RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest, WcFlags, WcOpcode,
    WcStatus, WorkCompletion,
};
