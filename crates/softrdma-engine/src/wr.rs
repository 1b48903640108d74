//! Work requests and work completions, with the numeric values of
//! libibverbs so that the C library can pass them straight through.

use core::fmt;

use crate::handle::{AhHandle, Lkey, MwHandle, Qpn, Rkey};
use crate::qp_attr::{AccessFlags, Gid};

/// One scatter/gather element: `length` bytes at virtual address `addr` of
/// the region with local key `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: Lkey,
}

/// Send work request flags (`IBV_SEND_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SendFlags(pub u32);

impl SendFlags {
    pub const FENCE: SendFlags = SendFlags(1);
    pub const SIGNALED: SendFlags = SendFlags(2);
    pub const SOLICITED: SendFlags = SendFlags(4);
    pub const INLINE: SendFlags = SendFlags(8);
    /// True when every bit of `o` is set.
    pub const fn contains(self, o: SendFlags) -> bool {
        self.0 & o.0 == o.0
    }
}

impl core::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, o: SendFlags) -> SendFlags {
        SendFlags(self.0 | o.0)
    }
}

/// What a send work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    Send,
    SendWithImm {
        imm: u32,
    },
    SendWithInv {
        invalidate_rkey: Rkey,
    },
    Write {
        remote_addr: u64,
        rkey: Rkey,
    },
    WriteWithImm {
        remote_addr: u64,
        rkey: Rkey,
        imm: u32,
    },
    Read {
        remote_addr: u64,
        rkey: Rkey,
    },
    CompareSwap {
        remote_addr: u64,
        rkey: Rkey,
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        remote_addr: u64,
        rkey: Rkey,
        add: u64,
    },
    /// Binds memory window `mw` (`IBV_WR_BIND_MW`): from the WR's turn in
    /// the send queue on, the window's rkey is `rkey` (its index, the upper
    /// 24 bits, must be the window's; the low 8 bits are the consumer's
    /// key) and it reaches what `bind` says. A type-1 window with a
    /// zero-length bind is unbound.
    BindMw {
        mw: MwHandle,
        rkey: Rkey,
        bind: MwBind,
    },
    /// Invalidates the type-2 window of `rkey` (`IBV_WR_LOCAL_INV`).
    LocalInv {
        rkey: Rkey,
    },
}

/// The type of a memory window (`enum ibv_mw_type`): type 1 is bound with
/// `ibv_bind_mw` and belongs to its PD; type 2 (2B) is bound by a work
/// request and then belongs to the QP that bound it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MwType {
    One = 1,
    Two = 2,
}

impl MwType {
    /// The type for `enum ibv_mw_type`'s value, if it is one.
    pub const fn from_ibv(v: u32) -> Option<MwType> {
        match v {
            1 => Some(MwType::One),
            2 => Some(MwType::Two),
            _ => None,
        }
    }
}

/// What a bind gives a window (`struct ibv_mw_bind_info`): `length` bytes
/// at virtual address `addr` of the region whose lkey is `mr`, with the
/// remote rights of `access` (IBV_ACCESS_REMOTE_READ, _WRITE, _ATOMIC, and
/// ZERO_BASED for a type-2 window addressed from 0). `mr: None` with
/// `length` 0 unbinds a type-1 window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MwBind {
    pub mr: Option<Lkey>,
    pub addr: u64,
    pub length: u64,
    pub access: AccessFlags,
}

impl SendOp {
    /// The completion opcode a successful WR of this kind reports.
    pub const fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => {
                WcOpcode::Send
            }
            SendOp::Write { .. } | SendOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::BindMw { .. } => WcOpcode::BindMw,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
        }
    }

    /// Memory-window binds and local invalidations: work the HCA does
    /// itself when the WR's turn comes, with no packet.
    pub const fn is_local(&self) -> bool {
        matches!(self, SendOp::BindMw { .. } | SendOp::LocalInv { .. })
    }

    /// READ and atomics: the operations that use responder resources and
    /// that a fenced WR waits for.
    pub const fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        )
    }

    /// Atomics.
    pub const fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    /// rdma-core style name for messages.
    pub const fn name(&self) -> &'static str {
        match self {
            SendOp::Send => "SEND",
            SendOp::SendWithImm { .. } => "SEND_WITH_IMM",
            SendOp::SendWithInv { .. } => "SEND_WITH_INV",
            SendOp::Write { .. } => "RDMA_WRITE",
            SendOp::WriteWithImm { .. } => "RDMA_WRITE_WITH_IMM",
            SendOp::Read { .. } => "RDMA_READ",
            SendOp::CompareSwap { .. } => "ATOMIC_CMP_AND_SWP",
            SendOp::FetchAdd { .. } => "ATOMIC_FETCH_AND_ADD",
            SendOp::BindMw { .. } => "BIND_MW",
            SendOp::LocalInv { .. } => "LOCAL_INV",
        }
    }
}

/// Where a UD send goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// Address handle from `create_ah`.
    pub ah: AhHandle,
    pub remote_qpn: Qpn,
    /// Q_Key; a value with the high bit set means "use the QP's own Q_Key".
    pub remote_qkey: u32,
}

/// A send work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub op: SendOp,
    pub sg_list: Vec<Sge>,
    pub flags: SendFlags,
    /// Required for UD QPs, ignored otherwise.
    pub ud: Option<UdDest>,
    /// The remote XRC SRQ number (24 bits) a WR on an XRC initiator QP is
    /// for (`wr.qp_type.xrc.remote_srqn`, `ibv_wr_set_xrc_srqn`); required
    /// there, ignored on other QPs.
    pub xrc_srqn: Option<u32>,
}

impl SendWr {
    /// A signaled WR of `op` over `sg_list`.
    pub fn new(wr_id: u64, op: SendOp, sg_list: Vec<Sge>) -> Self {
        SendWr {
            xrc_srqn: None,
            wr_id,
            op,
            sg_list,
            flags: SendFlags::SIGNALED,
            ud: None,
        }
    }
}

/// A receive work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sg_list: Vec<Sge>,
}

/// Completion status (`IBV_WC_*`), numbered as in libibverbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocProtErr = 4,
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    RemAbortErr = 16,
    FatalErr = 19,
    GeneralErr = 21,
}

impl WcStatus {
    /// The text `ibv_wc_status_str` gives.
    pub const fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory window bind error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::RemAbortErr => "remote abort error",
            WcStatus::FatalErr => "fatal error",
            WcStatus::GeneralErr => "general error",
        }
    }

    /// True for `Success`.
    pub const fn is_ok(self) -> bool {
        matches!(self, WcStatus::Success)
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Completion opcode (`IBV_WC_*`), numbered as in libibverbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    Send = 0,
    RdmaWrite = 1,
    RdmaRead = 2,
    CompSwap = 3,
    FetchAdd = 4,
    BindMw = 5,
    LocalInv = 6,
    Recv = 128,
    RecvRdmaWithImm = 129,
}

/// Completion flags (`IBV_WC_*` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WcFlags(pub u32);

impl WcFlags {
    pub const GRH: WcFlags = WcFlags(1);
    pub const WITH_IMM: WcFlags = WcFlags(2);
    pub const WITH_INV: WcFlags = WcFlags(8);
    /// True when every bit of `o` is set.
    pub const fn contains(self, o: WcFlags) -> bool {
        self.0 & o.0 == o.0
    }
}

/// The network header a received RoCEv2 packet came with (the kernel's
/// `ib_wc.network_hdr_type`): it decides what the 40 bytes in front of a UD
/// receive hold (docs/engine.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NetworkHdr {
    /// Not a receive of a packet from the network (send completions,
    /// errors and flushes).
    #[default]
    None,
    /// IPv4: the 40 bytes hold 20 unused bytes, then the IPv4 header.
    Ipv4,
    /// IPv6: the 40 bytes are the IPv6 header.
    Ipv6,
}

/// One work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// Vendor error: for errors, a softrdma-specific code saying why.
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Immediate data (valid with `WcFlags::WITH_IMM`), or the invalidated rkey.
    pub imm_data: u32,
    pub qp_num: Qpn,
    /// Source QP (UD receives).
    pub src_qp: Qpn,
    pub wc_flags: WcFlags,
    /// The sender's GID (UD receives).
    pub sgid: Gid,
    /// The receive was for a message with the solicited event bit.
    pub solicited: bool,
    /// The network header of the packet (UD receives).
    pub network_hdr: NetworkHdr,
}

impl WorkCompletion {
    /// A completion with zero length, flags and immediate.
    pub fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: Qpn) -> Self {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            qp_num,
            src_qp: Qpn::default(),
            wc_flags: WcFlags::default(),
            sgid: Gid::default(),
            solicited: false,
            network_hdr: NetworkHdr::None,
        }
    }
}
