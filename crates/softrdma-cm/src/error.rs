//! What a CM command can fail with, and the errno the rdma_cm API maps it to.

use crate::{ConnId, State};

/// The failure of a command given to [`crate::CmAgent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// No connection has this ID (never created, destroyed, or out of timewait).
    NoSuchConn(ConnId),
    /// The command makes no sense in the connection's state.
    BadState {
        /// The connection.
        conn: ConnId,
        /// Its state.
        state: State,
        /// The command refused.
        op: &'static str,
    },
    /// More private data than the message (or the rdma_cm convention) carries.
    PrivateDataTooLong {
        /// The message.
        message: &'static str,
        /// The most it carries.
        max: usize,
        /// What was given.
        len: usize,
    },
    /// Another listener already has this service ID.
    ServiceInUse(u64),
    /// No listener has this service ID.
    NotListening(u64),
    /// A parameter does not fit its field on the wire.
    Wire(softrdma_wire::Error),
}

impl Error {
    /// The errno rdma_cm returns for this failure.
    pub const fn errno(&self) -> i32 {
        const ENOENT: i32 = 2;
        const EINVAL: i32 = 22;
        const EADDRINUSE: i32 = 98;
        match self {
            Error::NoSuchConn(_) | Error::NotListening(_) => ENOENT,
            Error::ServiceInUse(_) => EADDRINUSE,
            Error::BadState { .. } | Error::PrivateDataTooLong { .. } | Error::Wire(_) => EINVAL,
        }
    }
}

impl From<softrdma_wire::Error> for Error {
    fn from(e: softrdma_wire::Error) -> Self {
        Error::Wire(e)
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::NoSuchConn(c) => write!(f, "no connection {c:?}"),
            Error::BadState { conn, state, op } => {
                write!(f, "{op} not allowed on {conn:?} in state {state:?}")
            }
            Error::PrivateDataTooLong { message, max, len } => {
                write!(f, "{len} bytes of private data, a {message} carries {max}")
            }
            Error::ServiceInUse(s) => write!(f, "service ID {s:#018x} already has a listener"),
            Error::NotListening(s) => write!(f, "no listener on service ID {s:#018x}"),
            Error::Wire(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

/// A command's result.
pub type Result<T> = core::result::Result<T, Error>;
