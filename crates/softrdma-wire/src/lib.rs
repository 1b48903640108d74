//! # softrdma-wire
//!
//! The bottom layer of softrdma: RoCEv2 packet formats, byte for byte.
//!
//! Every InfiniBand transport header has its own module with a checked
//! zero-copy view (`Packet<T>`) and a `Repr` that parses from and emits into
//! it, in the manner of smoltcp's `wire` module. One [`opcode`] table says for
//! every opcode which headers follow and whether a payload does; the whole-
//! packet [`PacketRepr`] uses it both to parse and to emit, and seals the
//! invariant CRC ([`icrc`]). [`frame`] builds and finds the IP/UDP headers
//! around a packet (for captures and for the ICRC's pseudo-header), and
//! [`Psn`]/[`Msn`] are the 24-bit sequence numbers with wrap-around order.
//! [`mad`] is the Management Datagram header and how a MAD rides a UD packet
//! to QP1; [`cm`] the Communication Manager messages it carries, and [`cma`]
//! the rdma_cm conventions (service IDs, the private-data header) on top.
//! [`sack`] is the selective-acknowledgement extension an RC ACK carries
//! on QPs that negotiated selective repeat.
//!
//! Nothing here panics on any input: untrusted bytes go through `parse`,
//! which returns an [`Error`] naming the header or field at fault.
//!
//! Layers above: `softrdma-engine` (the transport state machines) builds and
//! consumes [`PacketRepr`]s; `softrdma-pcap` writes captures of frames built
//! by [`frame`].

// Unsafe code only in `crc32` (SIMD intrinsics behind runtime feature detection).
#![deny(unsafe_code)]
#![warn(missing_debug_implementations)]
#![warn(missing_docs)]

pub mod aeth;
pub mod atomic_eth;
pub mod bth;
pub mod cm;
pub mod cma;
pub mod crc32;
pub mod ecn;
mod error;
pub mod frame;
pub mod icrc;
pub mod mad;
pub mod opcode;
pub mod packet;
mod psn;
pub mod reth;
pub mod sack;
pub mod small;
mod util;

pub use aeth::{AethRepr, NakCode, Syndrome};
pub use atomic_eth::AtomicEthRepr;
pub use bth::BthRepr;
pub use cm::{CmMad, CmMessage, RejReason};
pub use ecn::Ecn;
pub use error::{Error, Result};
pub use icrc::Endpoints;
pub use mad::{Mad, MadRepr};
pub use opcode::{HeaderLayout, OpKind, Opcode, OpcodeInfo, Position, Transport, OPCODE_TABLE};
pub use packet::{Headers, PacketRepr};
pub use psn::{Msn, Psn, SEQ_MASK};
pub use reth::RethRepr;
pub use sack::SackRepr;
pub use small::DethRepr;
