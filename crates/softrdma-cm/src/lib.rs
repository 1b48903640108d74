//! # softrdma-cm
//!
//! The InfiniBand Communication Manager (IBTA vol. 1, ch. 12) as a sans-I/O
//! state machine, and the rdma_cm conventions on top of it.
//!
//! One [`CmAgent`] serves one port. It is fed received CM MADs
//! ([`CmAgent::on_mad`]), the consumer's commands ([`CmAgent::listen`],
//! [`CmAgent::connect`], [`CmAgent::accept`], [`CmAgent::reject`],
//! [`CmAgent::disconnect`], [`CmAgent::destroy`], [`CmAgent::sidr_resolve`])
//! and time ([`CmAgent::on_timeout`]); it hands back MADs to send to the
//! peer's QP1 ([`CmAgent::poll_transmit`]), events ([`CmAgent::poll_event`])
//! and its next deadline ([`CmAgent::next_deadline`]). It reads no clock,
//! opens no socket, starts no thread: the engine's GSI QP carries its MADs
//! and the rdma_cm API drives it. The messages themselves are
//! `softrdma_wire::cm`'s; the protocol follows the Linux kernel's
//! `drivers/infiniband/core/cm.c` (see docs/cm.md for where it differs).

#![forbid(unsafe_code)]

mod active;
mod agent;
mod conn;
mod disconnect;
mod error;
pub mod limits;
mod params;
mod passive;
mod qp_attr;
pub mod rdma_cm;
mod sidr;
pub mod time;

pub use agent::{CmAgent, Stats};
pub use conn::State;
pub use error::{Error, Result};
pub use params::{AcceptParams, AgentConfig, ConnId, ConnectParams, Event, SidrParams};
pub use qp_attr::{QpAttr, QpState};
pub use time::Instant;

pub use softrdma_wire::cm::{Ece, RejReason, SidrStatus, TransportType};
