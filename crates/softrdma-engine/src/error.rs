//! Errors returned by verbs calls (as opposed to error completions).
//!
//! Each carries the errno the C library reports and a message that names the
//! object and attribute at fault.

use core::fmt;

use crate::qp_attr::ModifyQpError;

/// errno values the C library hands back.
pub mod errno {
    pub const EPERM: i32 = 1;
    pub const ENOENT: i32 = 2;
    pub const ENOMEM: i32 = 12;
    pub const EBUSY: i32 = 16;
    pub const EINVAL: i32 = 22;
    pub const ENOSYS: i32 = 38;
    pub const EOPNOTSUPP: i32 = 95;
}

/// Why a verbs call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerbsError {
    /// A bad argument; the message names it.
    InvalidArgument(String),
    /// A handle (PD, CQ, QP, MR key, SRQ, AH) that does not exist.
    NotFound { kind: &'static str, handle: u32 },
    /// The object is still used by others.
    Busy(String),
    /// A queue is full or a limit is reached.
    NoMemory(String),
    /// Not supported by softrdma.
    NotSupported(String),
    /// An invalid `modify_qp`.
    ModifyQp(ModifyQpError),
}

impl VerbsError {
    /// The errno real verbs return for this failure.
    pub fn errno(&self) -> i32 {
        match self {
            VerbsError::InvalidArgument(_) | VerbsError::NotFound { .. } => errno::EINVAL,
            VerbsError::Busy(_) => errno::EBUSY,
            VerbsError::NoMemory(_) => errno::ENOMEM,
            VerbsError::NotSupported(_) => errno::EOPNOTSUPP,
            VerbsError::ModifyQp(e) => e.errno(),
        }
    }

    pub(crate) fn inval(msg: impl Into<String>) -> Self {
        VerbsError::InvalidArgument(msg.into())
    }
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsError::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            VerbsError::NotFound { kind, handle } => write!(f, "no {kind} with handle {handle:#x}"),
            VerbsError::Busy(m) => write!(f, "busy: {m}"),
            VerbsError::NoMemory(m) => write!(f, "out of resources: {m}"),
            VerbsError::NotSupported(m) => write!(f, "not supported: {m}"),
            VerbsError::ModifyQp(e) => write!(f, "modify_qp: {e}"),
        }
    }
}

impl std::error::Error for VerbsError {}

impl From<ModifyQpError> for VerbsError {
    fn from(e: ModifyQpError) -> Self {
        VerbsError::ModifyQp(e)
    }
}

/// Result of a verbs call.
pub type Result<T> = core::result::Result<T, VerbsError>;
