//! # softrdma-fabric
//!
//! A deterministic discrete-event simulator of an AI cluster's network
//! whose endpoints run softrdma's own sans-I/O transport
//! ([`softrdma_engine::Engine`]: go-back-N, selective repeat, DCQCN).
//! A [`Scenario`] (JSON) names the topology ([`topology`]: two- and
//! three-tier fat-trees, rail-optimised leaves), the link layer
//! ([`link`]: InfiniBand credits, lossy Ethernet, PFC, RED/ECN,
//! corruption loss), the transport and the workload ([`workload`]);
//! [`run`] simulates it and returns a [`report::Report`].
//!
//! See docs/fabric.md for the model, the scenario format and the
//! validation table.

#![forbid(unsafe_code)]

pub mod carrier;
pub mod html;
pub mod link;
mod part;
pub mod queue;
pub mod report;
pub mod scenario;
pub mod sim;
pub mod topology;
pub mod workload;

pub use carrier::Carrier;
pub use report::{run, Report};
pub use scenario::Scenario;
