//! # softrdma-core
//!
//! The sans-I/O device: the one client of the engine, between the engine
//! and the drivers. [`DeviceCore`] runs progress with its idle policy,
//! follows the engine's events and resource changes (grants revalidated,
//! routes forgotten, so no caller has to remember to), and runs the
//! same-host direct path (plan, route cache, execution in a peer's
//! granted memory). It drives a [`Port`]: UDP, shared memory and the
//! simulator's queues are ports, and [`Capture`] and [`Faulty`] wrap any
//! port. No sockets, threads or clocks: the driver passes time in and
//! gets the next deadline back. See docs/core.md.

mod capture;
pub mod cm;
mod core;
mod direct;
mod fault;
mod port;
mod sim_node;
pub mod sim_port;

pub use crate::core::{CoreCounters, DeviceCore, DEFER_POSTS, DEFER_WAIT, RX_BUDGET};
pub use capture::Capture;
pub use fault::{FaultInjector, FaultSpec, FaultSpecError, Faulty};
pub use port::{
    GrantAsk, Granted, NoPeers, NotGranted, Outgoing, Parts, PeerMemory, Port, PortCounters,
    Received, Sources, Standing, TxBatch, Window, BUF_LEN, TX_BATCH,
};
