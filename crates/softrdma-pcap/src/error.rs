//! Errors of the capture reader.

use core::fmt;
use std::io;

/// Why a capture file could not be read. Every variant says what was being
/// read and, where it helps, the byte offset in the file.
#[derive(Debug)]
pub enum Error {
    /// The underlying reader failed.
    Io(io::Error),
    /// The file starts with neither a pcap nor a pcapng magic number.
    NotACapture { magic: [u8; 4] },
    /// The file ends inside `what`, which starts at byte `offset`.
    Truncated {
        what: &'static str,
        offset: u64,
        need: u64,
        have: u64,
    },
    /// A structure at byte `offset` holds something the format forbids or
    /// softrdma does not support; `what` says which field and why.
    Invalid { offset: u64, what: String },
}

impl Error {
    pub(crate) fn invalid(offset: u64, what: impl Into<String>) -> Self {
        Error::Invalid {
            offset,
            what: what.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "I/O error: {e}"),
            Error::NotACapture { magic } => write!(
                f,
                "not a pcap or pcapng file: it starts with {:02x} {:02x} {:02x} {:02x}",
                magic[0], magic[1], magic[2], magic[3]
            ),
            Error::Truncated {
                what,
                offset,
                need,
                have,
            } => write!(
                f,
                "file cut short in {what} at byte {offset}: need {need} bytes, have {have}"
            ),
            Error::Invalid { offset, what } => write!(f, "at byte {offset}: {what}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

/// Result alias of the reader.
pub type Result<T> = core::result::Result<T, Error>;
