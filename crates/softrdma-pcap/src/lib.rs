//! # softrdma-pcap
//!
//! Capture files for softrdma.
//!
//! * [`PcapWriter`] writes classic pcap (Ethernet, microsecond timestamps,
//!   snap length 65535), which every tool opens: tcpdump, Wireshark, tshark,
//!   scapy. [`PcapWriter::write_roce`] frames a RoCEv2 UDP payload in
//!   Ethernet/IP/UDP exactly as a RoCE sender emits it, so the invariant CRC
//!   in the payload checks out against the written headers.
//!   [`SharedPcapWriter`] is the same behind a mutex, for drivers that log
//!   from several threads.
//! * [`CaptureReader`] reads classic pcap (both byte orders, micro- and
//!   nanosecond) and pcapng (several sections and interfaces, each with its
//!   own link type and timestamp resolution), yielding [`Frame`]s.
//! * [`ip_of_frame`] finds the IP packet in a frame of each supported
//!   [`LinkType`]: Ethernet, raw IP, Linux cooked (SLL, SLL2), BSD loopback.
//!
//! Nothing here panics on malformed input: the reader returns an [`Error`]
//! naming the structure and byte offset at fault.
//!
//! ```
//! use softrdma_pcap::{CaptureReader, PcapWriter};
//! use std::time::Duration;
//!
//! let mut w = PcapWriter::new(Vec::new()).unwrap();
//! let src = "10.0.0.1:49152".parse().unwrap();
//! let dst = "10.0.0.2:4791".parse().unwrap();
//! w.write_roce(Duration::from_secs(1), src, dst, &[0u8; 16]).unwrap();
//! let bytes = w.into_inner().unwrap();
//!
//! let frames: Vec<_> = CaptureReader::from_bytes(&bytes).unwrap().collect();
//! let frame = frames[0].as_ref().unwrap();
//! assert_eq!(frame.timestamp, Some(Duration::from_secs(1)));
//! assert_eq!(frame.ip().unwrap().len(), 20 + 8 + 16);
//! ```

#![forbid(unsafe_code)]
#![warn(missing_debug_implementations)]

mod error;
mod linktype;
mod reader;
mod writer;

pub use error::{Error, Result};
pub use linktype::{ip_of_frame, FrameError, LinkType};
pub use reader::{CaptureReader, Format, Frame, MAX_RECORD_LEN};
pub use writer::{
    roce_frame, PcapWriter, SharedPcapWriter, Timestamp, PCAP_MAGIC_MICROS, PCAP_MAGIC_NANOS,
    SNAPLEN,
};
