//! Errors for everything that can be wrong with bytes from the wire.
//!
//! Each variant names the header or field at fault so that a log line or a
//! `softrdma decode` report tells an engineer exactly which byte to look at.

use core::fmt;

/// Why a buffer could not be parsed or emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer ends before header `header` does.
    Truncated {
        /// The header being read.
        header: &'static str,
        /// Bytes the header needs (counted from where it starts).
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// The BTH opcode is not one softrdma knows (RD and reserved opcodes land here).
    UnknownOpcode(u8),
    /// BTH.TVer is not 0.
    BadTransportVersion(u8),
    /// BTH.PadCnt is larger than the bytes that follow the headers.
    PadExceedsPayload {
        /// BTH.PadCnt.
        pad: u8,
        /// Bytes between the headers and the ICRC.
        payload: usize,
    },
    /// The opcode carries no payload but bytes follow its headers.
    UnexpectedPayload {
        /// The opcode byte.
        opcode: u8,
        /// Bytes found (or offered) after the headers.
        len: usize,
    },
    /// The computed invariant CRC differs from the one in the packet.
    IcrcMismatch {
        /// The ICRC stored in the packet.
        got: u32,
        /// The ICRC computed over the packet.
        want: u32,
    },
    /// The extension headers handed to `emit` do not match the opcode's layout.
    HeadersDoNotMatchOpcode {
        /// The opcode byte.
        opcode: u8,
    },
    /// The output buffer is too small for what is being emitted.
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A field holds a value the format forbids (e.g. a 25-bit QPN).
    BadField {
        /// The header holding the field.
        header: &'static str,
        /// The field's name.
        field: &'static str,
        /// The offending value.
        value: u64,
    },
    /// Not an IPv4/IPv6 packet, or not UDP.
    NotRoce(&'static str),
    /// A length field disagrees with the bytes present.
    BadLength {
        /// The header holding the length field.
        header: &'static str,
        /// The length field's name.
        field: &'static str,
        /// What the field says.
        value: usize,
        /// What is actually present (or the largest value allowed).
        have: usize,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::Truncated { header, need, have } => {
                write!(f, "truncated {header}: need {need} bytes, have {have}")
            }
            Error::UnknownOpcode(op) => write!(f, "unknown opcode 0x{op:02x}"),
            Error::BadTransportVersion(v) => write!(f, "BTH.TVer is {v}, expected 0"),
            Error::PadExceedsPayload { pad, payload } => write!(
                f,
                "pad count {pad} exceeds the {payload} payload bytes after the headers"
            ),
            Error::UnexpectedPayload { opcode, len } => write!(
                f,
                "opcode 0x{opcode:02x} carries no payload but {len} bytes follow its headers"
            ),
            Error::IcrcMismatch { got, want } => {
                write!(f, "ICRC mismatch: got 0x{got:08x}, want 0x{want:08x}")
            }
            Error::HeadersDoNotMatchOpcode { opcode } => write!(
                f,
                "extension headers do not match the layout of opcode 0x{opcode:02x}"
            ),
            Error::BufferTooSmall { need, have } => {
                write!(f, "buffer too small: need {need} bytes, have {have}")
            }
            Error::BadField {
                header,
                field,
                value,
            } => write!(f, "{header}.{field} has invalid value {value:#x}"),
            Error::NotRoce(why) => write!(f, "not a RoCEv2 packet: {why}"),
            Error::BadLength {
                header,
                field,
                value,
                have,
            } => write!(
                f,
                "{header}.{field} says {value} bytes but {have} are present"
            ),
        }
    }
}

impl std::error::Error for Error {}

/// Result alias used throughout the crate.
pub type Result<T> = core::result::Result<T, Error>;
