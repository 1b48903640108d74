//! # softrdma
//!
//! RDMA verbs in userspace Rust. A [`Context`] is an open soft HCA: a
//! RoCEv2 device on a UDP socket, driven by the sans-I/O protocol engine of
//! `softrdma-engine`. On it you allocate protection domains, register memory
//! regions, create completion queues and queue pairs (RC, UC, UD, with shared
//! receive queues), connect them, and post SEND/RECV, RDMA WRITE/READ and
//! atomics, with the states, error completions and limits of real hardware.
//!
//! ```no_run
//! use softrdma::{Context, AccessFlags, QpType};
//! let ctx = Context::open_default()?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(64)?;
//! let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! let qp = pd.create_qp(QpType::Rc, &cq, &cq).build()?;
//! println!("my endpoint: {}", qp.endpoint());
//! # Ok::<(), softrdma::Error>(())
//! ```
//!
//! Memory regions own their memory (or borrow it through an `unsafe`
//! constructor). Remote peers write it at any time, so the safe API never
//! hands out references into it: [`Mr::read`] and [`Mr::write`] copy, and
//! [`Mr::as_ptr`] is the raw escape hatch for zero-copy users.
//!
//! Devices come from `SOFTRDMA_DEVICES` (see [`config`]); the default is one
//! loopback device, `srx0`, on the first free 127.0.0.N.

#![warn(missing_docs)]

pub mod cm;
pub mod config;
mod device;
pub mod ecn_marker;
mod ecn_marker_prog;
mod fence;
pub mod rdma_cm;
mod shm_port;
mod udp_port;
mod xdp_port;
mod xdp_prog;
mod xsk;
/// The atomics `fence.rs` is written against (loom's in its model check).
mod fence_atomic {
    pub use std::sync::atomic::{AtomicU32, Ordering};
}
mod grant;
mod keymap;
pub mod linkmsg;
mod paging;
pub mod per_process;
mod region;
pub mod rundir;
mod segment;
pub mod shm;
pub mod stats;
mod sys;
mod verbs;

use std::fmt;

pub use config::{devices, Congestion, DeviceConfig};
pub use device::{active_mtu_for, DriverCounters};
pub use paging::OdpRegion;
pub use region::{OwnedRegion, RawRegion};
pub use softrdma_core::{FaultSpec, FaultSpecError};
/// How the engine reads and writes the bytes of a region: what
/// [`OwnedRegion`] and [`RawRegion`] implement (to use them, or memory of
/// your own, with `softrdma-engine` directly).
pub use softrdma_engine::RegionMemory;
pub use softrdma_engine::{
    errno, AccessFlags, AhAttr, AttrMask, Counters, Ece, Event, Gid, GidParseError, ModifyQpError,
    Mtu, MwBind, MwType, NetworkHdr, QpAttr, QpCap, QpState, QpType, RecvWr, SendFlags, SendOp,
    SendWr, Sge, SrqInit, UdDest, VerbsError, WcFlags, WcOpcode, WcStatus, WorkCompletion, GRH_LEN,
};
/// Typed handles of the engine's objects: what [`Pd::handle`], [`Cq::handle`],
/// [`Qp::qpn`], [`Mr::lkey`], [`Mr::rkey`] and friends return, and what
/// [`Sge`], [`SendOp`] and [`WorkCompletion`] hold (`.raw()` gives the number).
pub use softrdma_engine::{
    AhHandle, CqHandle, Lkey, MwHandle, PdHandle, Qpn, Rkey, SrqHandle, XrcdHandle,
};
/// The multicast QPN (the remote QPN of a datagram to a group) and the
/// device's multicast limits.
pub use softrdma_engine::{
    MAX_MCAST_GRP, MAX_MCAST_QP_ATTACH, MAX_TOTAL_MCAST_QP_ATTACH, MCAST_QPN,
};
/// Packet sequence numbers (24 bits), as [`QpAttr`]'s `sq_psn` and `rq_psn` hold them.
pub use softrdma_wire::Psn;
pub use verbs::{
    next_rkey, Ah, CompChannel, ConnectOptions, Context, Cq, DeviceAttr, Mr, Mw, OdpCaps, Pd,
    PortAttr, Qp, QpBuilder, QpEndpoint, RemoteRegion, Srq, Xrcd,
};

/// Errors of the softrdma API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A verbs call failed as it would on real hardware (with its errno).
    Verbs(VerbsError),
    /// Bad configuration (environment or builder); the message names the setting.
    Config(String),
    /// An operating-system failure (sockets, threads, files).
    Io(String),
    /// No device with that name.
    NoDevice(String),
    /// A wait ran out of time.
    Timeout(String),
    /// A completion carried an error status.
    Completion(WcStatus, u64),
    /// Memory that is not mapped, or not with the access asked for
    /// (EFAULT, as `ibv_reg_mr` and `ibv_advise_mr` report it).
    Fault(String),
    /// The connection manager refused a command (its errno, as rdma_cm's).
    Cm {
        /// The errno rdma_cm gives for it.
        errno: i32,
        /// What was refused and why.
        message: String,
    },
}

impl Error {
    /// The errno the C library reports for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Verbs(v) => v.errno(),
            Error::Config(_) | Error::NoDevice(_) => errno::EINVAL,
            Error::Io(_) => 5,
            Error::Timeout(_) => 110,
            Error::Completion(..) => 5,
            Error::Fault(_) => 14,
            Error::Cm { errno, .. } => *errno,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Verbs(v) => write!(f, "{v}"),
            Error::Config(m) => write!(f, "configuration: {m}"),
            Error::Io(m) => write!(f, "I/O: {m}"),
            Error::NoDevice(n) => {
                write!(f, "no softrdma device named {n:?} (see SOFTRDMA_DEVICES)")
            }
            Error::Timeout(m) => write!(f, "timed out: {m}"),
            Error::Completion(s, id) => {
                write!(f, "work request {id} completed with status {s:?} ({s})")
            }
            Error::Cm { message, .. } => write!(f, "connection manager: {message}"),
            Error::Fault(m) => write!(f, "bad address: {m}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<VerbsError> for Error {
    fn from(e: VerbsError) -> Self {
        Error::Verbs(e)
    }
}

/// Result of the softrdma API.
pub type Result<T> = std::result::Result<T, Error>;

impl From<softrdma_core::FaultSpecError> for Error {
    fn from(e: softrdma_core::FaultSpecError) -> Self {
        Error::Config(e.0)
    }
}
