//! QP attributes and the `ibv_modify_qp` transition validator.
//!
//! This module models `struct ibv_qp_attr` and `enum ibv_qp_attr_mask`, and
//! decides, before the engine touches any QP state, whether a modify request
//! is one that real verbs would accept. The rules come from three places:
//!
//! * the Linux kernel's QP state transition table (`qp_state_table`, consulted
//!   by `ib_modify_qp_is_ok` in `drivers/infiniband/core/verbs.c`): which
//!   transitions exist and, per QP type, which attributes each one requires
//!   and which it merely allows. [`allowed_masks`] is that table for RC, UC
//!   and UD;
//! * the uverbs and core checks that run before a driver sees the request
//!   (port numbers, the alternate path ban on RoCE);
//! * the soft-RoCE driver's value checks (`rxe_qp_chk_attr`): timeouts, retry
//!   counts, RDMA read/atomic depths and so on.
//!
//! Every rejection maps to `EINVAL`, which is what the C library returns.
//!
//! # Where this module deliberately differs from the kernel
//!
//! * **RESET→ERR is rejected.** The kernel table has no such entry (a QP that
//!   was never initialised has nothing to flush), so every driver that uses
//!   `ib_modify_qp_is_ok` fails it. Every other state can move to RESET and
//!   ERR with no attributes.
//! * **SQE→RTS is not a transition for RC.** The kernel's "valid" flag is not
//!   per QP type, so it would accept SQE→RTS for RC with no attributes, but an
//!   RC QP never enters SQE (send errors on RC go straight to ERR) and the
//!   table row lists no RC attributes at all.
//! * **`CUR_STATE` must name the actual state.** The table only allows it on
//!   transitions out of RTR, RTS, SQD and SQE. rxe trusts the value blindly
//!   and validates the transition from the *claimed* state; hardware drivers
//!   such as mlx5 send the firmware the command for the claimed state, which
//!   then fails if the QP is elsewhere. This module reports the mismatch.
//! * **`ALT_PATH` is refused** with [`ModifyQpError::Unsupported`] although
//!   the table lists it as optional: the core refuses alternate paths (APM)
//!   on RoCE ports, and softrdma only does RoCE.
//! * **`RATE_LIMIT` is never accepted** for RC, UC or UD. For most of the
//!   kernel's history the table allowed it only for raw packet QPs; recent
//!   kernels add it for RC on some transitions or leave it to drivers, and
//!   softrdma does not pace traffic.
//! * **An AV `port_num` of 0 is accepted** and means "the QP's port"; uverbs
//!   has required a real port number there since Linux 3.14.
//!
//! Not modelled here because the validator does not see the QP's live state:
//! rxe refuses anything but SQD→ERR while the send queue is still draining,
//! and uverbs requires the INIT→RTR AV's port to equal the port chosen at
//! RESET→INIT (with a single port this only means both are 1).

use crate::handle::Qpn;
use softrdma_wire::Psn;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::ops::{BitAnd, BitAndAssign, BitOr, BitOrAssign, Not};

/// `EINVAL`, the errno every modify-QP validation failure maps to.
const EINVAL: i32 = 22;

/// Transport service type of a queue pair (`enum ibv_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable Connected (`IBV_QPT_RC`).
    Rc,
    /// Unreliable Connected (`IBV_QPT_UC`).
    Uc,
    /// Unreliable Datagram (`IBV_QPT_UD`).
    Ud,
    /// XRC initiator (`IBV_QPT_XRC_SEND`): an RC send queue whose every WR
    /// names the XRC SRQ it is for; no receive queue.
    XrcIni,
    /// XRC target (`IBV_QPT_XRC_RECV`): an RC responder in an XRC domain,
    /// with no send or receive queue of its own; incoming SENDs take their
    /// WQEs from the XRC SRQ each request's XRCETH names.
    XrcTgt,
}

impl QpType {
    /// The QP types of the non-XRC transports (the XRC ones are [`Self::XRC`]).
    pub const ALL: [QpType; 3] = [QpType::Rc, QpType::Uc, QpType::Ud];
    /// The two XRC QP types.
    pub const XRC: [QpType; 2] = [QpType::XrcIni, QpType::XrcTgt];

    /// The libibverbs `enum ibv_qp_type` value.
    pub const fn to_ibv(self) -> u32 {
        match self {
            QpType::Rc => 2,
            QpType::Uc => 3,
            QpType::Ud => 4,
            QpType::XrcIni => 9,
            QpType::XrcTgt => 10,
        }
    }

    /// Parses a libibverbs `enum ibv_qp_type` value; `None` for types
    /// softrdma does not implement (raw packet, driver-specific).
    pub const fn from_ibv(v: u32) -> Option<QpType> {
        match v {
            2 => Some(QpType::Rc),
            3 => Some(QpType::Uc),
            4 => Some(QpType::Ud),
            9 => Some(QpType::XrcIni),
            10 => Some(QpType::XrcTgt),
            _ => None,
        }
    }

    /// The short upper-case name: `"RC"`, `"UC"`, `"UD"`, `"XRC_INI"`, `"XRC_TGT"`.
    pub const fn name(self) -> &'static str {
        match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
            QpType::XrcIni => "XRC_INI",
            QpType::XrcTgt => "XRC_TGT",
        }
    }

    /// RC and both XRC types: acknowledged, with READ, atomics, RNR and
    /// transport retries (XRC is RC's transport with an XRCETH).
    pub const fn is_reliable(self) -> bool {
        matches!(self, QpType::Rc | QpType::XrcIni | QpType::XrcTgt)
    }

    /// The XRC initiator or target.
    pub const fn is_xrc(self) -> bool {
        matches!(self, QpType::XrcIni | QpType::XrcTgt)
    }
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Queue pair state (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum QpState {
    /// Freshly created or reset; nothing is processed.
    #[default]
    Reset,
    /// Initialised: receives may be posted, nothing is sent or received.
    Init,
    /// Ready To Receive: inbound packets are processed.
    Rtr,
    /// Ready To Send: fully operational.
    Rts,
    /// Send Queue Drained: no new send requests are started.
    Sqd,
    /// Send Queue Error (UC and UD only): the send queue stopped after an
    /// error, the receive side keeps working.
    Sqe,
    /// Error: all outstanding work requests are flushed.
    Err,
}

impl QpState {
    /// All states, in `enum ibv_qp_state` order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    /// The libibverbs `enum ibv_qp_state` value (`IBV_QPS_RESET` = 0 …
    /// `IBV_QPS_ERR` = 6).
    pub const fn to_ibv(self) -> u32 {
        match self {
            QpState::Reset => 0,
            QpState::Init => 1,
            QpState::Rtr => 2,
            QpState::Rts => 3,
            QpState::Sqd => 4,
            QpState::Sqe => 5,
            QpState::Err => 6,
        }
    }

    /// Parses a libibverbs `enum ibv_qp_state` value (`IBV_QPS_UNKNOWN` and
    /// anything larger give `None`).
    pub const fn from_ibv(v: u32) -> Option<QpState> {
        match v {
            0 => Some(QpState::Reset),
            1 => Some(QpState::Init),
            2 => Some(QpState::Rtr),
            3 => Some(QpState::Rts),
            4 => Some(QpState::Sqd),
            5 => Some(QpState::Sqe),
            6 => Some(QpState::Err),
            _ => None,
        }
    }

    /// The upper-case IBTA name: `"RESET"`, `"INIT"`, `"RTR"`, `"RTS"`,
    /// `"SQD"`, `"SQE"` or `"ERR"`.
    pub const fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Defines a `u32` bit-set newtype with the usual set operations.
macro_rules! bit_set {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub u32);

        impl $name {
            /// The empty set.
            pub const fn empty() -> Self {
                $name(0)
            }

            /// The raw bits.
            pub const fn bits(self) -> u32 {
                self.0
            }

            /// Wraps raw bits, keeping bits that have no named constant.
            pub const fn from_bits_retain(bits: u32) -> Self {
                $name(bits)
            }

            /// True when no bit is set.
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }

            /// True when every bit of `other` is also set in `self`.
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// True when `self` and `other` share at least one bit.
            pub const fn intersects(self, other: Self) -> bool {
                self.0 & other.0 != 0
            }

            /// The bits of `self` or `other`.
            pub const fn union(self, other: Self) -> Self {
                $name(self.0 | other.0)
            }

            /// The bits of `self` that are not in `other`.
            pub const fn difference(self, other: Self) -> Self {
                $name(self.0 & !other.0)
            }

            /// Sets or clears the bits of `other`.
            pub fn set(&mut self, other: Self, value: bool) {
                if value {
                    self.0 |= other.0;
                } else {
                    self.0 &= !other.0;
                }
            }
        }

        impl BitOr for $name {
            type Output = Self;
            fn bitor(self, rhs: Self) -> Self {
                $name(self.0 | rhs.0)
            }
        }

        impl BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: Self) {
                self.0 |= rhs.0;
            }
        }

        impl BitAnd for $name {
            type Output = Self;
            fn bitand(self, rhs: Self) -> Self {
                $name(self.0 & rhs.0)
            }
        }

        impl BitAndAssign for $name {
            fn bitand_assign(&mut self, rhs: Self) {
                self.0 &= rhs.0;
            }
        }

        impl Not for $name {
            type Output = Self;
            fn not(self) -> Self {
                $name(!self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}(", stringify!($name))?;
                let names = self.names();
                if names.is_empty() {
                    f.write_str("empty")?;
                } else {
                    f.write_str(&names.join(" | "))?;
                }
                f.write_str(")")
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let names = self.names();
                if names.is_empty() {
                    f.write_str("none")
                } else {
                    f.write_str(&names.join(", "))
                }
            }
        }
    };
}

/// Names for bits without a named constant, indexed by bit number.
const BIT_NAMES: [&str; 32] = [
    "BIT0", "BIT1", "BIT2", "BIT3", "BIT4", "BIT5", "BIT6", "BIT7", "BIT8", "BIT9", "BIT10",
    "BIT11", "BIT12", "BIT13", "BIT14", "BIT15", "BIT16", "BIT17", "BIT18", "BIT19", "BIT20",
    "BIT21", "BIT22", "BIT23", "BIT24", "BIT25", "BIT26", "BIT27", "BIT28", "BIT29", "BIT30",
    "BIT31",
];

/// Lists the names of `bits` following `table`, then any remaining bits as
/// `BITn` in ascending order.
fn names_in_order(bits: u32, table: &[(u32, &'static str)]) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut rest = bits;
    for &(bit, name) in table {
        if bits & bit != 0 {
            out.push(name);
            rest &= !bit;
        }
    }
    for (i, name) in BIT_NAMES.iter().enumerate() {
        if rest & (1 << i) != 0 {
            out.push(*name);
        }
    }
    out
}

bit_set!(
    /// Which fields of a [`QpAttr`] a modify request sets
    /// (`enum ibv_qp_attr_mask`; the bit values are the libibverbs ones).
    AttrMask
);

impl AttrMask {
    /// `IBV_QP_STATE`: move to [`QpAttr::qp_state`].
    pub const STATE: AttrMask = AttrMask(1 << 0);
    /// `IBV_QP_CUR_STATE`: assert the current state is [`QpAttr::cur_qp_state`].
    pub const CUR_STATE: AttrMask = AttrMask(1 << 1);
    /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`: [`QpAttr::en_sqd_async_notify`].
    pub const EN_SQD_ASYNC_NOTIFY: AttrMask = AttrMask(1 << 2);
    /// `IBV_QP_ACCESS_FLAGS`: [`QpAttr::qp_access_flags`].
    pub const ACCESS_FLAGS: AttrMask = AttrMask(1 << 3);
    /// `IBV_QP_PKEY_INDEX`: [`QpAttr::pkey_index`].
    pub const PKEY_INDEX: AttrMask = AttrMask(1 << 4);
    /// `IBV_QP_PORT`: [`QpAttr::port_num`].
    pub const PORT: AttrMask = AttrMask(1 << 5);
    /// `IBV_QP_QKEY`: [`QpAttr::qkey`].
    pub const QKEY: AttrMask = AttrMask(1 << 6);
    /// `IBV_QP_AV`: the primary path, [`QpAttr::ah_attr`].
    pub const AV: AttrMask = AttrMask(1 << 7);
    /// `IBV_QP_PATH_MTU`: [`QpAttr::path_mtu`].
    pub const PATH_MTU: AttrMask = AttrMask(1 << 8);
    /// `IBV_QP_TIMEOUT`: [`QpAttr::timeout`].
    pub const TIMEOUT: AttrMask = AttrMask(1 << 9);
    /// `IBV_QP_RETRY_CNT`: [`QpAttr::retry_cnt`].
    pub const RETRY_CNT: AttrMask = AttrMask(1 << 10);
    /// `IBV_QP_RNR_RETRY`: [`QpAttr::rnr_retry`].
    pub const RNR_RETRY: AttrMask = AttrMask(1 << 11);
    /// `IBV_QP_RQ_PSN`: [`QpAttr::rq_psn`].
    pub const RQ_PSN: AttrMask = AttrMask(1 << 12);
    /// `IBV_QP_MAX_QP_RD_ATOMIC`: [`QpAttr::max_rd_atomic`].
    pub const MAX_QP_RD_ATOMIC: AttrMask = AttrMask(1 << 13);
    /// `IBV_QP_ALT_PATH`: [`QpAttr::alt_ah_attr`] and the other `alt_` fields.
    pub const ALT_PATH: AttrMask = AttrMask(1 << 14);
    /// `IBV_QP_MIN_RNR_TIMER`: [`QpAttr::min_rnr_timer`].
    pub const MIN_RNR_TIMER: AttrMask = AttrMask(1 << 15);
    /// `IBV_QP_SQ_PSN`: [`QpAttr::sq_psn`].
    pub const SQ_PSN: AttrMask = AttrMask(1 << 16);
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`: [`QpAttr::max_dest_rd_atomic`].
    pub const MAX_DEST_RD_ATOMIC: AttrMask = AttrMask(1 << 17);
    /// `IBV_QP_PATH_MIG_STATE`: [`QpAttr::path_mig_state`].
    pub const PATH_MIG_STATE: AttrMask = AttrMask(1 << 18);
    /// `IBV_QP_CAP`: [`QpAttr::cap`].
    pub const CAP: AttrMask = AttrMask(1 << 19);
    /// `IBV_QP_DEST_QPN`: [`QpAttr::dest_qp_num`].
    pub const DEST_QPN: AttrMask = AttrMask(1 << 20);
    /// `IBV_QP_RATE_LIMIT`: [`QpAttr::rate_limit`].
    pub const RATE_LIMIT: AttrMask = AttrMask(1 << 25);

    /// Every bit that has a named constant.
    pub const KNOWN: AttrMask = AttrMask(((1 << 21) - 1) | (1 << 25));

    /// Readable order used by [`AttrMask::names`]: state first, then
    /// addressing, PSNs, path, reliability and the rarely used rest.
    const ORDER: [(u32, &'static str); 22] = [
        (Self::STATE.0, "STATE"),
        (Self::CUR_STATE.0, "CUR_STATE"),
        (Self::PKEY_INDEX.0, "PKEY_INDEX"),
        (Self::PORT.0, "PORT"),
        (Self::QKEY.0, "QKEY"),
        (Self::ACCESS_FLAGS.0, "ACCESS_FLAGS"),
        (Self::DEST_QPN.0, "DEST_QPN"),
        (Self::RQ_PSN.0, "RQ_PSN"),
        (Self::SQ_PSN.0, "SQ_PSN"),
        (Self::PATH_MTU.0, "PATH_MTU"),
        (Self::AV.0, "AV"),
        (Self::TIMEOUT.0, "TIMEOUT"),
        (Self::RETRY_CNT.0, "RETRY_CNT"),
        (Self::RNR_RETRY.0, "RNR_RETRY"),
        (Self::MAX_QP_RD_ATOMIC.0, "MAX_QP_RD_ATOMIC"),
        (Self::MAX_DEST_RD_ATOMIC.0, "MAX_DEST_RD_ATOMIC"),
        (Self::MIN_RNR_TIMER.0, "MIN_RNR_TIMER"),
        (Self::ALT_PATH.0, "ALT_PATH"),
        (Self::PATH_MIG_STATE.0, "PATH_MIG_STATE"),
        (Self::EN_SQD_ASYNC_NOTIFY.0, "EN_SQD_ASYNC_NOTIFY"),
        (Self::CAP.0, "CAP"),
        (Self::RATE_LIMIT.0, "RATE_LIMIT"),
    ];

    /// The attribute names in the mask, spelled like the `IBV_QP_*`
    /// constants without the prefix (`"STATE"`, `"DEST_QPN"`, `"RQ_PSN"`,
    /// `"PATH_MTU"`, `"AV"`, …).
    ///
    /// Names come in a fixed readable order (state, addressing, PSNs, path,
    /// reliability, the rest), not in bit order. Bits without a libibverbs
    /// name are listed last as `"BIT21"` and so on.
    pub fn names(self) -> Vec<&'static str> {
        names_in_order(self.0, &Self::ORDER)
    }

    /// Iterates over the single-bit masks of `self` in [`AttrMask::names`]
    /// order.
    pub fn iter(self) -> impl Iterator<Item = AttrMask> {
        let known = Self::ORDER
            .iter()
            .map(|&(bit, _)| bit)
            .filter(move |&bit| self.0 & bit != 0);
        let unknown = (0..32)
            .map(|i| 1u32 << i)
            .filter(move |&bit| self.0 & bit != 0 && Self::KNOWN.0 & bit == 0);
        known.chain(unknown).map(AttrMask)
    }
}

bit_set!(
    /// Access rights (`enum ibv_access_flags`; the bit values are the
    /// libibverbs ones). On a QP only the remote rights and `MW_BIND` mean
    /// anything; the memory-region flags exist so the same type serves both.
    AccessFlags
);

impl AccessFlags {
    /// `IBV_ACCESS_LOCAL_WRITE`.
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(1);
    /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA WRITE.
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(1 << 1);
    /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA READ.
    pub const REMOTE_READ: AccessFlags = AccessFlags(1 << 2);
    /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may issue atomics.
    pub const REMOTE_ATOMIC: AccessFlags = AccessFlags(1 << 3);
    /// `IBV_ACCESS_MW_BIND`: memory windows may be bound.
    pub const MW_BIND: AccessFlags = AccessFlags(1 << 4);
    /// `IBV_ACCESS_ZERO_BASED` (memory regions only).
    pub const ZERO_BASED: AccessFlags = AccessFlags(1 << 5);
    /// `IBV_ACCESS_ON_DEMAND` (memory regions only).
    pub const ON_DEMAND: AccessFlags = AccessFlags(1 << 6);
    /// `IBV_ACCESS_HUGETLB` (memory regions only).
    pub const HUGETLB: AccessFlags = AccessFlags(1 << 7);
    /// `IBV_ACCESS_RELAXED_ORDERING` (memory regions only).
    pub const RELAXED_ORDERING: AccessFlags = AccessFlags(1 << 20);

    /// The flags [`validate_modify`] accepts in [`QpAttr::qp_access_flags`]:
    /// the QP's rights, and ON_DEMAND, which programs that give a QP their
    /// ODP region's flags pass (rdma-core's ODP tests do) and the kernel's
    /// modify_qp takes without complaint; it grants nothing on a QP.
    pub const QP_VALID: AccessFlags = AccessFlags(0x1f | Self::ON_DEMAND.0);

    /// Bit order, which is also the readable order for these flags.
    const ORDER: [(u32, &'static str); 9] = [
        (Self::LOCAL_WRITE.0, "LOCAL_WRITE"),
        (Self::REMOTE_WRITE.0, "REMOTE_WRITE"),
        (Self::REMOTE_READ.0, "REMOTE_READ"),
        (Self::REMOTE_ATOMIC.0, "REMOTE_ATOMIC"),
        (Self::MW_BIND.0, "MW_BIND"),
        (Self::ZERO_BASED.0, "ZERO_BASED"),
        (Self::ON_DEMAND.0, "ON_DEMAND"),
        (Self::HUGETLB.0, "HUGETLB"),
        (Self::RELAXED_ORDERING.0, "RELAXED_ORDERING"),
    ];

    /// The flag names (`"LOCAL_WRITE"`, `"REMOTE_READ"`, …) in bit order;
    /// unnamed bits are listed as `"BITn"`.
    pub fn names(self) -> Vec<&'static str> {
        names_in_order(self.0, &Self::ORDER)
    }
}

/// Path MTU (`enum ibv_mtu`; the discriminants are the libibverbs values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes (`IBV_MTU_256`).
    Mtu256 = 1,
    /// 512 bytes (`IBV_MTU_512`).
    Mtu512 = 2,
    /// 1024 bytes (`IBV_MTU_1024`), the default.
    #[default]
    Mtu1024 = 3,
    /// 2048 bytes (`IBV_MTU_2048`).
    Mtu2048 = 4,
    /// 4096 bytes (`IBV_MTU_4096`).
    Mtu4096 = 5,
}

impl Mtu {
    /// The MTU in bytes (256 … 4096).
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// The libibverbs `enum ibv_mtu` value (1 … 5).
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }

    /// Parses a libibverbs `enum ibv_mtu` value; `None` outside 1 … 5.
    pub const fn from_ibv(v: u32) -> Option<Mtu> {
        match v {
            1 => Some(Mtu::Mtu256),
            2 => Some(Mtu::Mtu512),
            3 => Some(Mtu::Mtu1024),
            4 => Some(Mtu::Mtu2048),
            5 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }

    /// The MTU of exactly `bytes` bytes; `None` unless `bytes` is 256, 512,
    /// 1024, 2048 or 4096.
    pub const fn from_bytes(bytes: u32) -> Option<Mtu> {
        match bytes {
            256 => Some(Mtu::Mtu256),
            512 => Some(Mtu::Mtu512),
            1024 => Some(Mtu::Mtu1024),
            2048 => Some(Mtu::Mtu2048),
            4096 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }
}

/// A 128-bit global identifier. For RoCEv2 it is the IP address of a port:
/// IPv6 as is, IPv4 in the IPv4-mapped form `::ffff:a.b.c.d`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of an IP address (IPv4 becomes `::ffff:a.b.c.d`).
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address this GID stands for: IPv4-mapped GIDs give
    /// [`IpAddr::V4`], everything else [`IpAddr::V6`].
    pub fn to_ip(self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// True for an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn is_ipv4_mapped(self) -> bool {
        Ipv6Addr::from(self.0).to_ipv4_mapped().is_some()
    }

    /// The raw 16 bytes, network order.
    pub const fn octets(self) -> [u8; 16] {
        self.0
    }
}

impl From<IpAddr> for Gid {
    fn from(ip: IpAddr) -> Gid {
        Gid::from_ip(ip)
    }
}

impl From<[u8; 16]> for Gid {
    fn from(raw: [u8; 16]) -> Gid {
        Gid(raw)
    }
}

impl fmt::Display for Gid {
    /// The usual IPv6 text form (`fe80::1`, `::ffff:192.0.2.1`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Ipv6Addr::from(self.0), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

impl std::str::FromStr for Gid {
    type Err = GidParseError;

    /// The inverse of [`Display`](fmt::Display): any IPv6 text form
    /// (`fe80::1`, `::ffff:192.0.2.1`, or ibverbs' eight groups
    /// `0000:0000:0000:0000:0000:ffff:c000:0201`). A plain IPv4 address
    /// (`192.0.2.1`) gives its IPv4-mapped GID, as [`Gid::from_ip`] does.
    fn from_str(s: &str) -> Result<Gid, GidParseError> {
        let t = s.trim();
        if let Ok(v6) = t.parse::<Ipv6Addr>() {
            return Ok(Gid(v6.octets()));
        }
        if let Ok(v4) = t.parse::<std::net::Ipv4Addr>() {
            return Ok(Gid::from_ip(IpAddr::V4(v4)));
        }
        Err(GidParseError(s.to_string()))
    }
}

/// Text that is not a GID ([`Gid`]'s `FromStr`); it holds the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidParseError(pub String);

impl fmt::Display for GidParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a GID: expected an IPv6 address (fe80::1, ::ffff:192.0.2.1, \
             0000:0000:0000:0000:0000:ffff:c000:0201) or an IPv4 address",
            self.0
        )
    }
}

impl std::error::Error for GidParseError {}

/// Address vector of a path (`struct ibv_ah_attr` with its GRH folded in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AhAttr {
    /// Destination GID (the peer's IP address on RoCEv2).
    pub dgid: Gid,
    /// Index of the local source GID in the port's GID table.
    pub sgid_index: u8,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
    /// IP traffic class (DSCP and ECN).
    pub traffic_class: u8,
    /// IPv6 flow label; only the low 20 bits go on the wire.
    pub flow_label: u32,
    /// Service level.
    pub sl: u8,
    /// Local port; 0 means the QP's port.
    pub port_num: u8,
    /// The path has a GRH. RoCE always needs one.
    pub is_global: bool,
    /// Destination LID (InfiniBand only; ignored on RoCE).
    pub dlid: u16,
    /// Source path bits (InfiniBand only; ignored on RoCE).
    pub src_path_bits: u8,
    /// Static rate limit (`enum ibv_rate`); 0 is "port current rate".
    pub static_rate: u8,
}

/// Queue sizes (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpCap {
    /// Outstanding send work requests.
    pub max_send_wr: u32,
    /// Outstanding receive work requests.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send work request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive work request.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send work request.
    pub max_inline_data: u32,
}

/// QP attributes (`struct ibv_qp_attr`). A modify request only looks at the
/// fields its [`AttrMask`] names; a query fills them all in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpAttr {
    /// State to move to ([`AttrMask::STATE`]).
    pub qp_state: QpState,
    /// State the caller believes the QP is in ([`AttrMask::CUR_STATE`]).
    pub cur_qp_state: QpState,
    /// Path MTU ([`AttrMask::PATH_MTU`]).
    pub path_mtu: Mtu,
    /// Path migration state, `enum ibv_mig_state`: 0 MIGRATED, 1 REARM,
    /// 2 ARMED ([`AttrMask::PATH_MIG_STATE`]).
    pub path_mig_state: u8,
    /// Q_Key for UD ([`AttrMask::QKEY`]).
    pub qkey: u32,
    /// First PSN the responder expects ([`AttrMask::RQ_PSN`]).
    pub rq_psn: Psn,
    /// First PSN the requester sends ([`AttrMask::SQ_PSN`]).
    pub sq_psn: Psn,
    /// Remote QP number, 24 bits ([`AttrMask::DEST_QPN`]).
    pub dest_qp_num: Qpn,
    /// Rights granted to remote requests ([`AttrMask::ACCESS_FLAGS`]).
    pub qp_access_flags: AccessFlags,
    /// Queue sizes ([`AttrMask::CAP`]).
    pub cap: QpCap,
    /// Primary path ([`AttrMask::AV`]).
    pub ah_attr: AhAttr,
    /// Alternate path ([`AttrMask::ALT_PATH`]).
    pub alt_ah_attr: AhAttr,
    /// P_Key table index ([`AttrMask::PKEY_INDEX`]).
    pub pkey_index: u16,
    /// Alternate path P_Key index ([`AttrMask::ALT_PATH`]).
    pub alt_pkey_index: u16,
    /// Raise an async event once the send queue has drained
    /// ([`AttrMask::EN_SQD_ASYNC_NOTIFY`]).
    pub en_sqd_async_notify: bool,
    /// Query output: the QP is in SQD and still draining.
    pub sq_draining: bool,
    /// Outstanding RDMA READ/atomic requests this QP may initiate
    /// ([`AttrMask::MAX_QP_RD_ATOMIC`]).
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READ/atomic requests this QP accepts as responder
    /// ([`AttrMask::MAX_DEST_RD_ATOMIC`]).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code, 0 … 31 ([`AttrMask::MIN_RNR_TIMER`]).
    pub min_rnr_timer: u8,
    /// Local port ([`AttrMask::PORT`]).
    pub port_num: u8,
    /// Local ACK timeout exponent, 4.096 µs × 2^timeout, 0 … 31; 0 waits
    /// forever ([`AttrMask::TIMEOUT`]).
    pub timeout: u8,
    /// Transport retries, 0 … 7 ([`AttrMask::RETRY_CNT`]).
    pub retry_cnt: u8,
    /// RNR retries, 0 … 7 with 7 meaning "forever" ([`AttrMask::RNR_RETRY`]).
    pub rnr_retry: u8,
    /// Alternate path port ([`AttrMask::ALT_PATH`]).
    pub alt_port_num: u8,
    /// Alternate path ACK timeout ([`AttrMask::ALT_PATH`]).
    pub alt_timeout: u8,
    /// Packet pacing rate in kbit/s ([`AttrMask::RATE_LIMIT`]).
    pub rate_limit: u32,
}

/// Device limits the value checks compare against (the relevant fields of
/// `struct ibv_device_attr` and `struct ibv_port_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AttrLimits {
    /// Largest [`QpAttr::max_dest_rd_atomic`] (`max_qp_rd_atom`).
    pub max_qp_rd_atom: u8,
    /// Largest [`QpAttr::max_rd_atomic`] (`max_qp_init_rd_atom`).
    pub max_qp_init_rd_atom: u8,
    /// Largest send or receive queue depth.
    pub max_qp_wr: u32,
    /// Largest scatter/gather list.
    pub max_sge: u32,
    /// Largest inline data size.
    pub max_inline_data: u32,
    /// P_Key table length; valid indices are below it.
    pub max_pkeys: u16,
    /// Number of ports; valid port numbers are 1 … `num_ports`.
    pub num_ports: u8,
    /// GID table length; valid `sgid_index` values are below it.
    pub gid_table_len: u8,
}

impl Default for AttrLimits {
    /// softrdma's limits: 16 outstanding reads/atomics each way, 16384-deep
    /// queues, 32 SGEs, 256 bytes inline, one P_Key, one port, one GID.
    fn default() -> Self {
        AttrLimits {
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            max_qp_wr: 16384,
            max_sge: 32,
            max_inline_data: 256,
            max_pkeys: 1,
            num_ports: 1,
            gid_table_len: 1,
        }
    }
}

/// Why a modify request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModifyQpError {
    /// No `from`→`to` transition exists for this QP type.
    InvalidTransition {
        /// The QP's type.
        qp_type: QpType,
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
    },
    /// The transition needs attributes the mask lacks.
    MissingAttributes {
        /// The QP's type.
        qp_type: QpType,
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// Everything the transition requires.
        required: AttrMask,
        /// The required attributes that were not given.
        missing: AttrMask,
    },
    /// The mask names attributes the transition does not take.
    UnexpectedAttributes {
        /// The QP's type.
        qp_type: QpType,
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// Required plus optional attributes ([`AttrMask::STATE`] is always
        /// allowed and not listed).
        allowed: AttrMask,
        /// The attributes that are not allowed.
        unexpected: AttrMask,
    },
    /// [`AttrMask::CUR_STATE`] named a state the QP is not in.
    CurStateMismatch {
        /// The state the caller claimed.
        given: QpState,
        /// The state the QP is in.
        actual: QpState,
    },
    /// An attribute value is out of range.
    InvalidValue {
        /// The attribute, as a mask name (`"TIMEOUT"`) or a field inside one
        /// (`"AV.sgid_index"`).
        attribute: &'static str,
        /// The offending value.
        value: u64,
        /// What it must be instead (`"must be at most 31"`).
        reason: &'static str,
    },
    /// The attribute is legal in verbs but softrdma cannot honour it.
    Unsupported {
        /// The attribute, as a mask name.
        attribute: &'static str,
        /// Why it is refused.
        reason: &'static str,
    },
}

impl ModifyQpError {
    /// The errno the C library returns for this error: always `EINVAL` (22),
    /// as `ibv_modify_qp` does for every one of these checks.
    pub fn errno(&self) -> i32 {
        EINVAL
    }
}

/// Writes `names` separated by ", ".
fn write_names(f: &mut fmt::Formatter<'_>, names: &[&str]) -> fmt::Result {
    f.write_str(&names.join(", "))
}

impl fmt::Display for ModifyQpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ModifyQpError::InvalidTransition { qp_type, from, to } => {
                write!(f, "{from}→{to} is not a valid transition for {qp_type}")
            }
            ModifyQpError::MissingAttributes {
                qp_type,
                from,
                to,
                required,
                missing,
            } => {
                write!(f, "{from}→{to} for {qp_type} requires ")?;
                write_names(f, &required.names())?;
                f.write_str("; missing: ")?;
                write_names(f, &missing.names())
            }
            ModifyQpError::UnexpectedAttributes {
                qp_type,
                from,
                to,
                allowed,
                unexpected,
            } => {
                write!(f, "{from}→{to} for {qp_type} does not accept ")?;
                write_names(f, &unexpected.names())?;
                if allowed.is_empty() {
                    return f.write_str(" (no attributes besides STATE allowed)");
                }
                // Required attributes first, then the optional ones.
                let required = allowed_masks(qp_type, from, to)
                    .map(|(req, _)| req & allowed)
                    .unwrap_or_default();
                let mut names = required.names();
                names.extend(allowed.difference(required).names());
                f.write_str(" (allowed: ")?;
                write_names(f, &names)?;
                f.write_str(")")
            }
            ModifyQpError::CurStateMismatch { given, actual } => {
                write!(f, "CUR_STATE is {given} but the QP is in {actual}")
            }
            ModifyQpError::InvalidValue {
                attribute,
                value,
                reason,
            } => write!(f, "{attribute} is {value}; {reason}"),
            ModifyQpError::Unsupported { attribute, reason } => {
                write!(f, "{attribute} is not supported: {reason}")
            }
        }
    }
}

impl std::error::Error for ModifyQpError {}

/// The transition table: for `from`→`to` on a `qp_type` QP, the attributes
/// the transition requires and those it optionally takes, or `None` when
/// the transition does not exist.
///
/// [`AttrMask::STATE`] is implied and appears in neither mask. The content
/// follows the Linux kernel's `qp_state_table` for RC, UC and UD, except
/// that RESET→ERR and, for RC, SQE→RTS are absent (see the module
/// documentation).
///
/// | transition   | RC required                                                       | UC required                        | UD required                  |
/// |--------------|-------------------------------------------------------------------|------------------------------------|------------------------------|
/// | RESET→INIT   | PKEY_INDEX, PORT, ACCESS_FLAGS                                    | PKEY_INDEX, PORT, ACCESS_FLAGS     | PKEY_INDEX, PORT, QKEY       |
/// | INIT→RTR     | DEST_QPN, RQ_PSN, PATH_MTU, AV, MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER | DEST_QPN, RQ_PSN, PATH_MTU, AV     | —                            |
/// | RTR→RTS      | SQ_PSN, TIMEOUT, RETRY_CNT, RNR_RETRY, MAX_QP_RD_ATOMIC           | SQ_PSN                             | SQ_PSN                       |
///
/// Everything else requires nothing; the optional sets are in the code.
pub fn allowed_masks(qp_type: QpType, from: QpState, to: QpState) -> Option<(AttrMask, AttrMask)> {
    use QpState::{Err, Init, Reset, Rtr, Rts, Sqd, Sqe};
    type M = AttrMask;
    let none = M::empty();
    let rc = qp_type == QpType::Rc;
    let ud = qp_type == QpType::Ud;

    // Attributes a connected QP may change on the way to, or while in, RTS
    // (the XRC target, a responder, also its RNR timer; the initiator not).
    let connected_rts_opt = if rc || qp_type == QpType::XrcTgt {
        M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER
    } else {
        M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE
    };
    let ud_rts_opt = M::CUR_STATE | M::QKEY;
    let rts_opt = if ud { ud_rts_opt } else { connected_rts_opt };

    let masks = match (from, to) {
        // Leaving for RESET or ERR never takes attributes. RESET→ERR is not
        // a transition the kernel accepts.
        (Reset, Reset) => (none, none),
        (Init | Rtr | Rts | Sqd | Sqe | Err, Reset | Err) => (none, none),

        (Reset, Init) => {
            let third = if ud { M::QKEY } else { M::ACCESS_FLAGS };
            (M::PKEY_INDEX | M::PORT | third, none)
        }
        (Init, Init) => {
            let third = if ud { M::QKEY } else { M::ACCESS_FLAGS };
            (none, M::PKEY_INDEX | M::PORT | third)
        }
        (Init, Rtr) => match qp_type {
            QpType::Rc => (
                M::DEST_QPN
                    | M::RQ_PSN
                    | M::PATH_MTU
                    | M::AV
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
                M::PKEY_INDEX | M::ACCESS_FLAGS | M::ALT_PATH,
            ),
            // The kernel's table (ib_modify_qp_is_ok): the XRC target
            // needs the responder's two, the initiator (no responder) not.
            QpType::XrcTgt => (
                M::DEST_QPN
                    | M::RQ_PSN
                    | M::PATH_MTU
                    | M::AV
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
                M::PKEY_INDEX | M::ACCESS_FLAGS | M::ALT_PATH,
            ),
            QpType::Uc | QpType::XrcIni => (
                M::DEST_QPN | M::RQ_PSN | M::PATH_MTU | M::AV,
                M::PKEY_INDEX | M::ACCESS_FLAGS | M::ALT_PATH,
            ),
            QpType::Ud => (none, M::PKEY_INDEX | M::QKEY),
        },
        (Rtr, Rts) => {
            let req = match qp_type {
                QpType::Rc | QpType::XrcIni => {
                    M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC
                }
                // The target sends no requests: no retry counts, no READ depth.
                QpType::XrcTgt => M::SQ_PSN | M::TIMEOUT,
                QpType::Uc | QpType::Ud => M::SQ_PSN,
            };
            (req, rts_opt)
        }
        (Rts, Rts) | (Sqd, Rts) => (none, rts_opt),
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => {
            let opt = match qp_type {
                QpType::Rc | QpType::XrcIni | QpType::XrcTgt => {
                    M::PKEY_INDEX
                        | M::PORT
                        | M::ACCESS_FLAGS
                        | M::AV
                        | M::TIMEOUT
                        | M::RETRY_CNT
                        | M::RNR_RETRY
                        | M::MAX_QP_RD_ATOMIC
                        | M::MAX_DEST_RD_ATOMIC
                        | M::MIN_RNR_TIMER
                        | M::ALT_PATH
                        | M::PATH_MIG_STATE
                }
                QpType::Uc => {
                    M::PKEY_INDEX | M::ACCESS_FLAGS | M::AV | M::ALT_PATH | M::PATH_MIG_STATE
                }
                QpType::Ud => M::PKEY_INDEX | M::QKEY,
            };
            (none, opt)
        }
        (Sqe, Rts) => match qp_type {
            // An RC (or XRC) QP never enters SQE.
            QpType::Rc | QpType::XrcIni | QpType::XrcTgt => return None,
            QpType::Uc => (none, M::CUR_STATE | M::ACCESS_FLAGS),
            QpType::Ud => (none, ud_rts_opt),
        },
        _ => return None,
    };
    Some(masks)
}

/// The attribute mask `ibv_modify_qp` hands an XRC QP's modify: as the
/// kernel's uverbs (`modify_qp_mask`), an XRC initiator loses the
/// responder's MAX_DEST_RD_ATOMIC and MIN_RNR_TIMER, and an XRC target the
/// requester's MAX_QP_RD_ATOMIC, RETRY_CNT and RNR_RETRY, silently: so a
/// program may move both as RC QPs (perftest's `-c XRC` does). Other types
/// keep their mask.
pub fn xrc_modify_mask(qp_type: QpType, mask: AttrMask) -> AttrMask {
    type M = AttrMask;
    match qp_type {
        QpType::XrcIni => AttrMask(mask.0 & !(M::MAX_DEST_RD_ATOMIC.0 | M::MIN_RNR_TIMER.0)),
        QpType::XrcTgt => {
            AttrMask(mask.0 & !(M::MAX_QP_RD_ATOMIC.0 | M::RETRY_CNT.0 | M::RNR_RETRY.0))
        }
        _ => mask,
    }
}

/// Checks a modify request the way `ibv_modify_qp` would and returns the
/// state the QP ends up in.
///
/// `cur` is the QP's actual state, `attr` and `mask` the request. The checks
/// run in this order and the first failure is returned:
///
/// 1. The target state is `attr.qp_state` when `mask` has
///    [`AttrMask::STATE`], otherwise `cur` (an attribute-only modify).
/// 2. With [`AttrMask::CUR_STATE`], `attr.cur_qp_state` must equal `cur`
///    ([`ModifyQpError::CurStateMismatch`]).
/// 3. The transition must exist for `qp_type` ([`allowed_masks`];
///    [`ModifyQpError::InvalidTransition`]).
/// 4. Every required attribute must be present
///    ([`ModifyQpError::MissingAttributes`]) and nothing outside
///    required ∪ optional ∪ STATE may be
///    ([`ModifyQpError::UnexpectedAttributes`]).
/// 5. The value of every attribute in `mask` must be in range
///    ([`ModifyQpError::InvalidValue`]); `ALT_PATH` is refused
///    ([`ModifyQpError::Unsupported`]).
///
/// Value checks: `PORT` names a port (1 to `num_ports`); `PKEY_INDEX` is
/// below `max_pkeys`; `QKEY` and `PATH_MTU` take any value of their type
/// (every [`Mtu`] fits softrdma's 4096-byte maximum); `ACCESS_FLAGS` holds only
/// [`AccessFlags::QP_VALID`] bits; `DEST_QPN` fits 24 bits; the PSNs are
/// 24-bit by construction; `AV` has a GRH, a port of 0 (the QP's) or
/// 1 to `num_ports`, and an `sgid_index` below `gid_table_len`; `TIMEOUT`
/// and `MIN_RNR_TIMER` are at most 31, `RETRY_CNT` and `RNR_RETRY` at most 7;
/// `MAX_QP_RD_ATOMIC` is at most `max_qp_init_rd_atom` and
/// `MAX_DEST_RD_ATOMIC` at most `max_qp_rd_atom`; `PATH_MIG_STATE` is 0, 1
/// or 2; `CAP` (never allowed by the table, checked anyway) fits
/// `max_qp_wr`, `max_sge` and `max_inline_data`. The AV's flow label is not
/// checked: only its low 20 bits are sent.
pub fn validate_modify(
    qp_type: QpType,
    cur: QpState,
    attr: &QpAttr,
    mask: AttrMask,
    limits: &AttrLimits,
) -> Result<QpState, ModifyQpError> {
    let to = if mask.contains(AttrMask::STATE) {
        attr.qp_state
    } else {
        cur
    };

    if mask.contains(AttrMask::CUR_STATE) && attr.cur_qp_state != cur {
        return Err(ModifyQpError::CurStateMismatch {
            given: attr.cur_qp_state,
            actual: cur,
        });
    }

    let (required, optional) =
        allowed_masks(qp_type, cur, to).ok_or(ModifyQpError::InvalidTransition {
            qp_type,
            from: cur,
            to,
        })?;

    let missing = required.difference(mask);
    if !missing.is_empty() {
        return Err(ModifyQpError::MissingAttributes {
            qp_type,
            from: cur,
            to,
            required,
            missing,
        });
    }

    let allowed = required | optional;
    let unexpected = mask.difference(allowed | AttrMask::STATE);
    if !unexpected.is_empty() {
        return Err(ModifyQpError::UnexpectedAttributes {
            qp_type,
            from: cur,
            to,
            allowed,
            unexpected,
        });
    }

    check_values(attr, mask, limits)?;
    Ok(to)
}

/// Fails with [`ModifyQpError::InvalidValue`] unless `ok`.
fn ensure(
    ok: bool,
    attribute: &'static str,
    value: impl Into<u64>,
    reason: &'static str,
) -> Result<(), ModifyQpError> {
    if ok {
        Ok(())
    } else {
        Err(ModifyQpError::InvalidValue {
            attribute,
            value: value.into(),
            reason,
        })
    }
}

/// True when `port` is one of the device's ports.
fn port_exists(port: u8, limits: &AttrLimits) -> bool {
    (1..=limits.num_ports).contains(&port)
}

/// Range checks for every attribute named in `mask`, in
/// [`AttrMask::names`] order.
fn check_values(attr: &QpAttr, mask: AttrMask, limits: &AttrLimits) -> Result<(), ModifyQpError> {
    type M = AttrMask;
    for bit in mask.iter() {
        match bit {
            M::PKEY_INDEX => ensure(
                attr.pkey_index < limits.max_pkeys,
                "PKEY_INDEX",
                attr.pkey_index,
                "must be below the P_Key table length (max_pkeys)",
            )?,
            M::PORT => ensure(
                port_exists(attr.port_num, limits),
                "PORT",
                attr.port_num,
                "must be a port of the device (1 to num_ports)",
            )?,
            M::ACCESS_FLAGS => ensure(
                AccessFlags::QP_VALID.contains(attr.qp_access_flags),
                "ACCESS_FLAGS",
                attr.qp_access_flags.bits(),
                "must only combine LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC, \
                 MW_BIND and ON_DEMAND",
            )?,
            M::DEST_QPN => ensure(
                attr.dest_qp_num.raw() <= 0xFF_FFFF,
                "DEST_QPN",
                attr.dest_qp_num.raw(),
                "must fit in 24 bits (at most 16777215)",
            )?,
            M::AV => {
                let av = &attr.ah_attr;
                ensure(
                    av.port_num == 0 || port_exists(av.port_num, limits),
                    "AV.port_num",
                    av.port_num,
                    "must be 0 (the QP's port) or a port of the device (1 to num_ports)",
                )?;
                ensure(
                    av.is_global,
                    "AV.is_global",
                    u8::from(av.is_global),
                    "must be set: RoCE always carries a GRH",
                )?;
                ensure(
                    av.sgid_index < limits.gid_table_len,
                    "AV.sgid_index",
                    av.sgid_index,
                    "must be below the GID table length (gid_table_len)",
                )?;
            }
            M::TIMEOUT => ensure(
                attr.timeout <= 31,
                "TIMEOUT",
                attr.timeout,
                "must be at most 31",
            )?,
            M::RETRY_CNT => ensure(
                attr.retry_cnt <= 7,
                "RETRY_CNT",
                attr.retry_cnt,
                "must be at most 7",
            )?,
            M::RNR_RETRY => ensure(
                attr.rnr_retry <= 7,
                "RNR_RETRY",
                attr.rnr_retry,
                "must be at most 7",
            )?,
            M::MAX_QP_RD_ATOMIC => ensure(
                attr.max_rd_atomic <= limits.max_qp_init_rd_atom,
                "MAX_QP_RD_ATOMIC",
                attr.max_rd_atomic,
                "must be at most the device's max_qp_init_rd_atom",
            )?,
            M::MAX_DEST_RD_ATOMIC => ensure(
                attr.max_dest_rd_atomic <= limits.max_qp_rd_atom,
                "MAX_DEST_RD_ATOMIC",
                attr.max_dest_rd_atomic,
                "must be at most the device's max_qp_rd_atom",
            )?,
            M::MIN_RNR_TIMER => ensure(
                attr.min_rnr_timer <= 31,
                "MIN_RNR_TIMER",
                attr.min_rnr_timer,
                "must be at most 31",
            )?,
            M::ALT_PATH => {
                return Err(ModifyQpError::Unsupported {
                    attribute: "ALT_PATH",
                    reason: "alternate paths (APM) are not available on RoCE",
                })
            }
            M::PATH_MIG_STATE => ensure(
                attr.path_mig_state <= 2,
                "PATH_MIG_STATE",
                attr.path_mig_state,
                "must be MIGRATED (0), REARM (1) or ARMED (2)",
            )?,
            M::CAP => check_cap(&attr.cap, limits)?,
            // STATE and CUR_STATE were checked against the table; QKEY,
            // PATH_MTU, the PSNs and EN_SQD_ASYNC_NOTIFY accept any value of
            // their type; RATE_LIMIT and unnamed bits never reach this point.
            _ => {}
        }
    }
    Ok(())
}

/// Checks queue sizes against the device limits.
fn check_cap(cap: &QpCap, limits: &AttrLimits) -> Result<(), ModifyQpError> {
    ensure(
        cap.max_send_wr <= limits.max_qp_wr,
        "CAP.max_send_wr",
        cap.max_send_wr,
        "must be at most the device's max_qp_wr",
    )?;
    ensure(
        cap.max_recv_wr <= limits.max_qp_wr,
        "CAP.max_recv_wr",
        cap.max_recv_wr,
        "must be at most the device's max_qp_wr",
    )?;
    ensure(
        cap.max_send_sge <= limits.max_sge,
        "CAP.max_send_sge",
        cap.max_send_sge,
        "must be at most the device's max_sge",
    )?;
    ensure(
        cap.max_recv_sge <= limits.max_sge,
        "CAP.max_recv_sge",
        cap.max_recv_sge,
        "must be at most the device's max_sge",
    )?;
    ensure(
        cap.max_inline_data <= limits.max_inline_data,
        "CAP.max_inline_data",
        cap.max_inline_data,
        "must be at most the device's max_inline_data",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
    /// `QpState::Err`, under a name that leaves `Err` meaning `Result::Err`.
    const ERR: QpState = QpState::Err;
    use QpType::{Rc, Uc, Ud};
    type M = AttrMask;

    /// Shorthand for a mask from raw ibv bits.
    fn b(bits: u32) -> AttrMask {
        AttrMask::from_bits_retain(bits)
    }

    /// Every named attribute bit, listed independently of the module's
    /// ordering table.
    const ALL_BITS: [AttrMask; 22] = [
        M::STATE,
        M::CUR_STATE,
        M::EN_SQD_ASYNC_NOTIFY,
        M::ACCESS_FLAGS,
        M::PKEY_INDEX,
        M::PORT,
        M::QKEY,
        M::AV,
        M::PATH_MTU,
        M::TIMEOUT,
        M::RETRY_CNT,
        M::RNR_RETRY,
        M::RQ_PSN,
        M::MAX_QP_RD_ATOMIC,
        M::ALT_PATH,
        M::MIN_RNR_TIMER,
        M::SQ_PSN,
        M::MAX_DEST_RD_ATOMIC,
        M::PATH_MIG_STATE,
        M::CAP,
        M::DEST_QPN,
        M::RATE_LIMIT,
    ];

    /// The transitions expected to exist, written out by hand.
    fn expected_transitions(t: QpType) -> Vec<(QpState, QpState)> {
        let mut v = vec![
            (Reset, Reset),
            (Reset, Init),
            (Init, Init),
            (Init, Rtr),
            (Rtr, Rts),
            (Rts, Rts),
            (Rts, Sqd),
            (Sqd, Rts),
            (Sqd, Sqd),
        ];
        for from in [Init, Rtr, Rts, Sqd, Sqe, ERR] {
            v.push((from, Reset));
            v.push((from, ERR));
        }
        if t != Rc {
            v.push((Sqe, Rts));
        }
        v
    }

    /// Attributes whose every field is valid under the default limits.
    fn good_attr(from: QpState, to: QpState) -> QpAttr {
        QpAttr {
            qp_state: to,
            cur_qp_state: from,
            path_mtu: Mtu::Mtu4096,
            path_mig_state: 0,
            qkey: 0x1111_1111,
            rq_psn: Psn::new(0x12_3456),
            sq_psn: Psn::new(0xAB_CDEF),
            dest_qp_num: Qpn::from_raw(0x00_0042),
            qp_access_flags: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            cap: QpCap::default(),
            ah_attr: AhAttr {
                dgid: Gid::from_ip(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))),
                sgid_index: 0,
                hop_limit: 64,
                is_global: true,
                port_num: 1,
                ..AhAttr::default()
            },
            alt_ah_attr: AhAttr::default(),
            pkey_index: 0,
            alt_pkey_index: 0,
            en_sqd_async_notify: true,
            sq_draining: false,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            port_num: 1,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            alt_port_num: 0,
            alt_timeout: 0,
            rate_limit: 0,
        }
    }

    fn run(
        t: QpType,
        from: QpState,
        to: QpState,
        mask: AttrMask,
    ) -> Result<QpState, ModifyQpError> {
        validate_modify(t, from, &good_attr(from, to), mask, &AttrLimits::default())
    }

    fn masks(t: QpType, from: QpState, to: QpState) -> (AttrMask, AttrMask) {
        allowed_masks(t, from, to).unwrap_or_else(|| panic!("{from}→{to} for {t} missing"))
    }

    #[test]
    fn table_has_exactly_the_expected_transitions() {
        for t in QpType::ALL {
            let expected = expected_transitions(t);
            let mut count = 0;
            for from in QpState::ALL {
                for to in QpState::ALL {
                    let exists = allowed_masks(t, from, to).is_some();
                    assert_eq!(
                        exists,
                        expected.contains(&(from, to)),
                        "{from}→{to} for {t}"
                    );
                    count += usize::from(exists);
                }
            }
            assert_eq!(count, if t == Rc { 21 } else { 22 }, "{t}");
        }
    }

    #[test]
    fn key_required_masks_match_the_kernel_table() {
        let rc_rtr = M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        let rc_rts = M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
        let cases = [
            (Rc, Reset, Init, b(0x38), b(0)),
            (Uc, Reset, Init, b(0x38), b(0)),
            (Ud, Reset, Init, b(0x70), b(0)),
            (Rc, Init, Init, b(0), b(0x38)),
            (Ud, Init, Init, b(0), b(0x70)),
            (Rc, Init, Rtr, rc_rtr, b(0x4018)),
            (Uc, Init, Rtr, b(0x101180), b(0x4018)),
            (Ud, Init, Rtr, b(0), b(0x50)),
            (Rc, Rtr, Rts, rc_rts, b(0x4C00A)),
            (Uc, Rtr, Rts, b(0x10000), b(0x4400A)),
            (Ud, Rtr, Rts, b(0x10000), b(0x42)),
            (Rc, Rts, Rts, b(0), b(0x4C00A)),
            (Ud, Rts, Rts, b(0), b(0x42)),
            (Uc, Rts, Sqd, b(0), b(0x4)),
            (Rc, Sqd, Rts, b(0), b(0x4C00A)),
            (Rc, Sqd, Sqd, b(0), b(0x6EEB8)),
            (Uc, Sqd, Sqd, b(0), b(0x44098)),
            (Ud, Sqd, Sqd, b(0), b(0x50)),
            (Uc, Sqe, Rts, b(0), b(0xA)),
            (Ud, Sqe, Rts, b(0), b(0x42)),
            (Rc, Rts, ERR, b(0), b(0)),
            (Ud, ERR, Reset, b(0), b(0)),
        ];
        for (t, from, to, req, opt) in cases {
            assert_eq!(masks(t, from, to), (req, opt), "{from}→{to} for {t}");
        }
        // The example from the task: RC INIT→RTR in ibv terms.
        assert_eq!(rc_rtr.bits(), 0x0002_9180 | 0x0010_0000);
    }

    #[test]
    fn every_transition_succeeds_with_exactly_the_required_mask() {
        for t in QpType::ALL {
            for (from, to) in expected_transitions(t) {
                let (req, _) = masks(t, from, to);
                assert_eq!(
                    run(t, from, to, M::STATE | req),
                    Ok(to),
                    "{from}→{to} for {t}"
                );
            }
        }
    }

    #[test]
    fn every_transition_succeeds_with_required_and_all_optional() {
        for t in QpType::ALL {
            for (from, to) in expected_transitions(t) {
                let (req, opt) = masks(t, from, to);
                // ALT_PATH is in the table but always refused on RoCE.
                let mask = M::STATE | req | opt.difference(M::ALT_PATH);
                assert_eq!(run(t, from, to, mask), Ok(to), "{from}→{to} for {t}");
                if opt.contains(M::ALT_PATH) {
                    assert_eq!(
                        run(t, from, to, mask | M::ALT_PATH),
                        Err(ModifyQpError::Unsupported {
                            attribute: "ALT_PATH",
                            reason: "alternate paths (APM) are not available on RoCE",
                        }),
                        "{from}→{to} for {t}"
                    );
                }
            }
        }
    }

    #[test]
    fn dropping_any_required_attribute_names_exactly_it() {
        let mut checked = 0;
        for t in QpType::ALL {
            for (from, to) in expected_transitions(t) {
                let (req, opt) = masks(t, from, to);
                for bit in req.iter() {
                    let mask = (M::STATE | req | opt.difference(M::ALT_PATH)).difference(bit);
                    assert_eq!(
                        run(t, from, to, mask),
                        Err(ModifyQpError::MissingAttributes {
                            qp_type: t,
                            from,
                            to,
                            required: req,
                            missing: bit,
                        }),
                        "{from}→{to} for {t} without {bit}"
                    );
                    checked += 1;
                }
            }
        }
        // RESET→INIT 3+3+3, INIT→RTR 6+4+0, RTR→RTS 5+1+1.
        assert_eq!(checked, 26);
    }

    #[test]
    fn dropping_state_makes_it_an_attribute_only_modify() {
        // Without STATE the request is cur→cur, which INIT→RTR is not.
        let (req, _) = masks(Rc, Init, Rtr);
        assert_eq!(
            run(Rc, Init, Rtr, req),
            Err(ModifyQpError::UnexpectedAttributes {
                qp_type: Rc,
                from: Init,
                to: Init,
                allowed: M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
                unexpected: req,
            })
        );
        assert_eq!(
            run(Rc, Rts, Rts, M::MIN_RNR_TIMER | M::ACCESS_FLAGS),
            Ok(Rts)
        );
        assert_eq!(run(Ud, Init, Init, M::QKEY), Ok(Init));
        assert_eq!(run(Rc, Reset, Reset, M::empty()), Ok(Reset));
        assert_eq!(
            run(Rc, Rtr, Rtr, M::empty()),
            Err(ModifyQpError::InvalidTransition {
                qp_type: Rc,
                from: Rtr,
                to: Rtr
            })
        );
    }

    #[test]
    fn any_attribute_outside_the_table_is_named() {
        let mut checked = 0;
        for t in QpType::ALL {
            for (from, to) in expected_transitions(t) {
                let (req, opt) = masks(t, from, to);
                let base = M::STATE | req;
                for bit in ALL_BITS {
                    if (req | opt | M::STATE).contains(bit) {
                        continue;
                    }
                    assert_eq!(
                        run(t, from, to, base | bit),
                        Err(ModifyQpError::UnexpectedAttributes {
                            qp_type: t,
                            from,
                            to,
                            allowed: req | opt,
                            unexpected: bit,
                        }),
                        "{from}→{to} for {t} with {bit}"
                    );
                    checked += 1;
                }
                // A bit with no libibverbs name is refused as well.
                let stray = M::from_bits_retain(1 << 23);
                assert!(matches!(
                    run(t, from, to, base | stray),
                    Err(ModifyQpError::UnexpectedAttributes { unexpected, .. }) if unexpected == stray
                ));
            }
        }
        assert!(checked > 300, "{checked}");
    }

    #[test]
    fn specific_unexpected_attributes() {
        // UD has no path: AV and DEST_QPN are never accepted.
        for (from, to) in [(Init, Rtr), (Rtr, Rts), (Sqd, Sqd)] {
            let (req, _) = masks(Ud, from, to);
            for extra in [M::AV, M::DEST_QPN, M::PATH_MTU, M::RQ_PSN] {
                assert!(matches!(
                    run(Ud, from, to, M::STATE | req | extra),
                    Err(ModifyQpError::UnexpectedAttributes { unexpected, .. }) if unexpected == extra
                ));
            }
        }
        // QKEY is UD-only; ACCESS_FLAGS is connected-only.
        assert!(run(Rc, Reset, Init, b(0x38) | M::STATE | M::QKEY).is_err());
        assert!(run(Ud, Reset, Init, b(0x70) | M::STATE | M::ACCESS_FLAGS).is_err());
        // RATE_LIMIT and CAP are never accepted for RC, UC or UD.
        for t in QpType::ALL {
            for (from, to) in expected_transitions(t) {
                let (req, opt) = masks(t, from, to);
                assert!(!(req | opt).intersects(M::RATE_LIMIT | M::CAP | M::STATE));
            }
        }
        // CUR_STATE is only for transitions out of RTR, RTS, SQD and SQE.
        for t in QpType::ALL {
            for (from, to) in expected_transitions(t) {
                let (_, opt) = masks(t, from, to);
                if opt.contains(M::CUR_STATE) {
                    assert!(matches!(from, Rtr | Rts | Sqd | Sqe), "{from}→{to}");
                    assert_eq!(to, Rts);
                }
            }
        }
        // Leaving for RESET takes no attributes, not even ones valid elsewhere.
        assert!(matches!(
            run(Rc, Rts, Reset, M::STATE | M::CUR_STATE),
            Err(ModifyQpError::UnexpectedAttributes {
                unexpected: M::CUR_STATE,
                ..
            })
        ));
    }

    #[test]
    fn invalid_transitions_fail() {
        let cases = [
            (Rc, Reset, Rtr),
            (Rc, Reset, Rts),
            (Rc, Init, Rts),
            (Rc, Rts, Rtr),
            (Rc, Rts, Init),
            (Rc, Rtr, Init),
            (Rc, Rtr, Sqd),
            (Rc, Init, Sqd),
            (Rc, Sqd, Init),
            (Rc, ERR, Init),
            (Rc, ERR, Rts),
            (Rc, Rts, Sqe),
            (Uc, Rts, Sqe),
            (Ud, Rtr, Sqe),
            (Rc, Sqe, Rts),
            (Rc, Reset, ERR),
            (Ud, Reset, ERR),
            (Ud, Reset, Rtr),
            (Uc, Init, Rts),
            (Ud, Rtr, Rtr),
            (Ud, Sqe, Sqe),
            (Uc, Sqe, Init),
        ];
        for (t, from, to) in cases {
            assert_eq!(allowed_masks(t, from, to), None, "{from}→{to} for {t}");
            assert_eq!(
                run(t, from, to, M::STATE),
                Err(ModifyQpError::InvalidTransition {
                    qp_type: t,
                    from,
                    to
                }),
                "{from}→{to} for {t}"
            );
            // A full mask does not help.
            assert_eq!(
                run(t, from, to, M::KNOWN),
                Err(ModifyQpError::InvalidTransition {
                    qp_type: t,
                    from,
                    to
                }),
            );
        }
    }

    #[test]
    fn any_state_moves_to_reset_and_err_without_attributes() {
        for t in QpType::ALL {
            for from in QpState::ALL {
                assert_eq!(
                    run(t, from, Reset, M::STATE),
                    Ok(Reset),
                    "{from}→RESET for {t}"
                );
                if from == Reset {
                    // Not in the kernel table: a never-initialised QP has
                    // nothing to flush.
                    assert!(run(t, from, ERR, M::STATE).is_err());
                } else {
                    assert_eq!(run(t, from, ERR, M::STATE), Ok(ERR), "{from}→ERR for {t}");
                }
            }
        }
    }

    #[test]
    fn a_full_rc_bring_up_walks_the_states() {
        let limits = AttrLimits::default();
        let steps = [
            (Reset, Init, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
            (
                Init,
                Rtr,
                M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
            ),
            (
                Rtr,
                Rts,
                M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
            ),
            (Rts, Sqd, M::EN_SQD_ASYNC_NOTIFY),
            (Sqd, Sqd, M::TIMEOUT | M::AV),
            (Sqd, Rts, M::CUR_STATE),
            (Rts, ERR, M::empty()),
            (ERR, Reset, M::empty()),
        ];
        let mut state = Reset;
        for (from, to, mask) in steps {
            assert_eq!(state, from);
            let attr = good_attr(from, to);
            state = validate_modify(Rc, state, &attr, M::STATE | mask, &limits).unwrap();
            assert_eq!(state, to);
        }
    }

    #[test]
    fn cur_state_must_match() {
        let mut attr = good_attr(Rts, Rts);
        attr.cur_qp_state = Sqe;
        let limits = AttrLimits::default();
        assert_eq!(
            validate_modify(Uc, Rts, &attr, M::STATE | M::CUR_STATE, &limits),
            Err(ModifyQpError::CurStateMismatch {
                given: Sqe,
                actual: Rts
            })
        );
        attr.cur_qp_state = Rts;
        assert_eq!(
            validate_modify(Uc, Sqe, &attr, M::STATE | M::CUR_STATE, &limits),
            Err(ModifyQpError::CurStateMismatch {
                given: Rts,
                actual: Sqe
            })
        );
        // Without the CUR_STATE bit the field is ignored.
        assert_eq!(validate_modify(Uc, Sqe, &attr, M::STATE, &limits), Ok(Rts));
        // Matching CUR_STATE is accepted where the table allows it.
        attr.cur_qp_state = Sqe;
        assert_eq!(
            validate_modify(Uc, Sqe, &attr, M::STATE | M::CUR_STATE, &limits),
            Ok(Rts)
        );
        // A matching CUR_STATE out of INIT is still not in the table.
        let mut attr = good_attr(Init, Init);
        attr.cur_qp_state = Init;
        assert!(matches!(
            validate_modify(Rc, Init, &attr, M::STATE | M::CUR_STATE, &limits),
            Err(ModifyQpError::UnexpectedAttributes {
                unexpected: M::CUR_STATE,
                ..
            })
        ));
    }

    /// Runs `from`→`to` with `mask` after `tweak` and expects `InvalidValue`
    /// for `attribute` carrying `value`.
    fn expect_invalid(
        t: QpType,
        from: QpState,
        to: QpState,
        mask: AttrMask,
        tweak: impl Fn(&mut QpAttr),
        attribute: &str,
        value: u64,
    ) {
        let mut attr = good_attr(from, to);
        assert_eq!(
            validate_modify(t, from, &attr, mask, &AttrLimits::default()),
            Ok(to),
            "baseline for {attribute}"
        );
        tweak(&mut attr);
        match validate_modify(t, from, &attr, mask, &AttrLimits::default()) {
            Err(ModifyQpError::InvalidValue {
                attribute: got,
                value: got_value,
                ..
            }) => {
                assert_eq!(got, attribute);
                assert_eq!(got_value, value, "{attribute}");
            }
            other => panic!("{attribute}: expected InvalidValue, got {other:?}"),
        }
    }

    #[test]
    fn value_checks_name_the_attribute() {
        let rc_init = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
        let ud_init = M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY;
        let rc_rtr = M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        let rc_rts =
            M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;

        expect_invalid(Rc, Reset, Init, rc_init, |a| a.port_num = 0, "PORT", 0);
        expect_invalid(Rc, Reset, Init, rc_init, |a| a.port_num = 2, "PORT", 2);
        expect_invalid(
            Ud,
            Reset,
            Init,
            ud_init,
            |a| a.pkey_index = 1,
            "PKEY_INDEX",
            1,
        );
        expect_invalid(
            Rc,
            Reset,
            Init,
            rc_init,
            |a| a.qp_access_flags |= AccessFlags::HUGETLB,
            "ACCESS_FLAGS",
            0x8f,
        );
        expect_invalid(
            Uc,
            Init,
            Init,
            M::ACCESS_FLAGS,
            |a| a.qp_access_flags = AccessFlags::RELAXED_ORDERING,
            "ACCESS_FLAGS",
            1 << 20,
        );
        expect_invalid(
            Rc,
            Init,
            Rtr,
            rc_rtr,
            |a| a.dest_qp_num = Qpn::from_raw(1 << 24),
            "DEST_QPN",
            1 << 24,
        );
        expect_invalid(
            Rc,
            Init,
            Rtr,
            rc_rtr,
            |a| a.ah_attr.port_num = 2,
            "AV.port_num",
            2,
        );
        expect_invalid(
            Rc,
            Init,
            Rtr,
            rc_rtr,
            |a| a.ah_attr.is_global = false,
            "AV.is_global",
            0,
        );
        expect_invalid(
            Rc,
            Init,
            Rtr,
            rc_rtr,
            |a| a.ah_attr.sgid_index = 1,
            "AV.sgid_index",
            1,
        );
        expect_invalid(
            Rc,
            Init,
            Rtr,
            rc_rtr,
            |a| a.max_dest_rd_atomic = 17,
            "MAX_DEST_RD_ATOMIC",
            17,
        );
        expect_invalid(
            Rc,
            Init,
            Rtr,
            rc_rtr,
            |a| a.min_rnr_timer = 32,
            "MIN_RNR_TIMER",
            32,
        );
        expect_invalid(Rc, Rtr, Rts, rc_rts, |a| a.timeout = 32, "TIMEOUT", 32);
        expect_invalid(Rc, Rtr, Rts, rc_rts, |a| a.retry_cnt = 8, "RETRY_CNT", 8);
        expect_invalid(Rc, Rtr, Rts, rc_rts, |a| a.rnr_retry = 8, "RNR_RETRY", 8);
        expect_invalid(
            Rc,
            Rtr,
            Rts,
            rc_rts,
            |a| a.max_rd_atomic = 17,
            "MAX_QP_RD_ATOMIC",
            17,
        );
        expect_invalid(
            Uc,
            Rts,
            Rts,
            M::PATH_MIG_STATE,
            |a| a.path_mig_state = 3,
            "PATH_MIG_STATE",
            3,
        );
        expect_invalid(
            Rc,
            Sqd,
            Sqd,
            M::STATE | M::PORT | M::PKEY_INDEX,
            |a| a.pkey_index = 7,
            "PKEY_INDEX",
            7,
        );
        expect_invalid(
            Uc,
            Sqd,
            Sqd,
            M::STATE | M::AV,
            |a| a.ah_attr.sgid_index = 9,
            "AV.sgid_index",
            9,
        );
    }

    #[test]
    fn values_at_the_limits_are_accepted() {
        let limits = AttrLimits::default();
        let mut attr = good_attr(Rtr, Rts);
        attr.timeout = 31;
        attr.retry_cnt = 7;
        attr.rnr_retry = 7;
        attr.max_rd_atomic = limits.max_qp_init_rd_atom;
        let rc_rts =
            M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
        assert_eq!(validate_modify(Rc, Rtr, &attr, rc_rts, &limits), Ok(Rts));
        attr.timeout = 0;
        attr.retry_cnt = 0;
        attr.rnr_retry = 0;
        attr.max_rd_atomic = 0;
        assert_eq!(validate_modify(Rc, Rtr, &attr, rc_rts, &limits), Ok(Rts));

        let mut attr = good_attr(Init, Rtr);
        attr.dest_qp_num = Qpn::from_raw(0xFF_FFFF);
        attr.min_rnr_timer = 31;
        attr.max_dest_rd_atomic = 0;
        attr.ah_attr.port_num = 0; // the QP's own port
        attr.ah_attr.flow_label = 0xFFFF_FFFF; // masked to 20 bits, not checked
        let (req, _) = masks(Rc, Init, Rtr);
        assert_eq!(
            validate_modify(Rc, Init, &attr, M::STATE | req, &limits),
            Ok(Rtr)
        );

        // Out-of-range values in fields the mask does not name are ignored.
        let mut attr = good_attr(Rtr, Rts);
        attr.port_num = 9;
        attr.pkey_index = 9;
        attr.min_rnr_timer = 200;
        attr.ah_attr = AhAttr::default();
        attr.dest_qp_num = Qpn::from_raw(u32::MAX);
        assert_eq!(
            validate_modify(Ud, Rtr, &attr, M::STATE | M::SQ_PSN, &limits),
            Ok(Rts)
        );

        // Larger devices accept more.
        let big = AttrLimits {
            num_ports: 2,
            max_pkeys: 8,
            gid_table_len: 4,
            ..AttrLimits::default()
        };
        let mut attr = good_attr(Init, Rtr);
        attr.ah_attr.port_num = 2;
        attr.ah_attr.sgid_index = 3;
        attr.pkey_index = 7;
        let mask = M::STATE | req | M::PKEY_INDEX;
        assert_eq!(validate_modify(Rc, Init, &attr, mask, &big), Ok(Rtr));
        assert!(validate_modify(Rc, Init, &attr, mask, &limits).is_err());
    }

    /// Breaks one field of a [`QpCap`].
    type CapTweak = fn(&mut QpCap);

    #[test]
    fn cap_is_checked_against_the_limits() {
        let limits = AttrLimits::default();
        let ok = QpCap {
            max_send_wr: 16384,
            max_recv_wr: 16384,
            max_send_sge: 32,
            max_recv_sge: 32,
            max_inline_data: 256,
        };
        let mut attr = QpAttr {
            cap: ok,
            ..QpAttr::default()
        };
        assert_eq!(check_values(&attr, M::CAP, &limits), Ok(()));
        let cases: [(CapTweak, &str); 5] = [
            (|c| c.max_send_wr += 1, "CAP.max_send_wr"),
            (|c| c.max_recv_wr += 1, "CAP.max_recv_wr"),
            (|c| c.max_send_sge += 1, "CAP.max_send_sge"),
            (|c| c.max_recv_sge += 1, "CAP.max_recv_sge"),
            (|c| c.max_inline_data += 1, "CAP.max_inline_data"),
        ];
        for (tweak, name) in cases {
            attr.cap = ok;
            tweak(&mut attr.cap);
            assert!(matches!(
                check_values(&attr, M::CAP, &limits),
                Err(ModifyQpError::InvalidValue { attribute, .. }) if attribute == name
            ));
            assert_eq!(check_values(&attr, M::empty(), &limits), Ok(()));
        }
        // The table never lets CAP through, whatever its value.
        attr.cap = ok;
        assert!(matches!(
            validate_modify(Rc, Rts, &attr, M::CAP, &limits),
            Err(ModifyQpError::UnexpectedAttributes {
                unexpected: M::CAP,
                ..
            })
        ));
    }

    #[test]
    fn display_strings() {
        let (req, _) = masks(Rc, Init, Rtr);
        let err = run(Rc, Init, Rtr, (M::STATE | req).difference(M::RQ_PSN)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "INIT→RTR for RC requires DEST_QPN, RQ_PSN, PATH_MTU, AV, MAX_DEST_RD_ATOMIC, \
             MIN_RNR_TIMER; missing: RQ_PSN"
        );

        let err = run(Ud, Rtr, Rts, M::STATE | M::SQ_PSN | M::AV).unwrap_err();
        assert_eq!(
            err.to_string(),
            "RTR→RTS for UD does not accept AV (allowed: SQ_PSN, CUR_STATE, QKEY)"
        );

        let err = run(Rc, Rts, Rtr, M::STATE).unwrap_err();
        assert_eq!(err.to_string(), "RTS→RTR is not a valid transition for RC");

        let mut attr = good_attr(Rtr, Rts);
        attr.timeout = 40;
        let (req, _) = masks(Rc, Rtr, Rts);
        let err =
            validate_modify(Rc, Rtr, &attr, M::STATE | req, &AttrLimits::default()).unwrap_err();
        assert_eq!(err.to_string(), "TIMEOUT is 40; must be at most 31");

        let err = run(Rc, Reset, Init, M::STATE | M::PORT | M::PKEY_INDEX).unwrap_err();
        assert_eq!(
            err.to_string(),
            "RESET→INIT for RC requires PKEY_INDEX, PORT, ACCESS_FLAGS; missing: ACCESS_FLAGS"
        );

        let err = run(Rc, Rts, ERR, M::STATE | M::TIMEOUT | M::PORT).unwrap_err();
        assert_eq!(
            err.to_string(),
            "RTS→ERR for RC does not accept PORT, TIMEOUT (no attributes besides STATE allowed)"
        );

        let err = run(Rc, Rts, Sqd, M::STATE | M::SQ_PSN).unwrap_err();
        assert_eq!(
            err.to_string(),
            "RTS→SQD for RC does not accept SQ_PSN (allowed: EN_SQD_ASYNC_NOTIFY)"
        );

        let err = ModifyQpError::CurStateMismatch {
            given: Rts,
            actual: Sqe,
        };
        assert_eq!(err.to_string(), "CUR_STATE is RTS but the QP is in SQE");

        let err = run(Rc, Init, Rtr, M::STATE | req_rc_rtr() | M::ALT_PATH).unwrap_err();
        assert_eq!(
            err.to_string(),
            "ALT_PATH is not supported: alternate paths (APM) are not available on RoCE"
        );
    }

    fn req_rc_rtr() -> AttrMask {
        masks(Rc, Init, Rtr).0
    }

    #[test]
    fn every_error_maps_to_einval() {
        let errors = [
            run(Rc, Rts, Rtr, M::STATE).unwrap_err(),
            run(Rc, Init, Rtr, M::STATE).unwrap_err(),
            run(Rc, Rts, ERR, M::STATE | M::PORT).unwrap_err(),
            ModifyQpError::CurStateMismatch {
                given: Rts,
                actual: Sqe,
            },
            ModifyQpError::InvalidValue {
                attribute: "TIMEOUT",
                value: 40,
                reason: "must be at most 31",
            },
            run(Rc, Init, Rtr, M::STATE | req_rc_rtr() | M::ALT_PATH).unwrap_err(),
        ];
        for e in &errors {
            assert_eq!(e.errno(), 22, "{e}");
        }
        // It is a std error.
        let boxed: Box<dyn std::error::Error> = Box::new(errors[0].clone());
        assert!(boxed.to_string().contains("RTS→RTR"));
    }

    #[test]
    fn attr_mask_bits_match_libibverbs() {
        let expected: [(AttrMask, u32, &str); 22] = [
            (M::STATE, 1, "STATE"),
            (M::CUR_STATE, 2, "CUR_STATE"),
            (M::EN_SQD_ASYNC_NOTIFY, 4, "EN_SQD_ASYNC_NOTIFY"),
            (M::ACCESS_FLAGS, 8, "ACCESS_FLAGS"),
            (M::PKEY_INDEX, 16, "PKEY_INDEX"),
            (M::PORT, 32, "PORT"),
            (M::QKEY, 64, "QKEY"),
            (M::AV, 128, "AV"),
            (M::PATH_MTU, 256, "PATH_MTU"),
            (M::TIMEOUT, 512, "TIMEOUT"),
            (M::RETRY_CNT, 1024, "RETRY_CNT"),
            (M::RNR_RETRY, 2048, "RNR_RETRY"),
            (M::RQ_PSN, 4096, "RQ_PSN"),
            (M::MAX_QP_RD_ATOMIC, 8192, "MAX_QP_RD_ATOMIC"),
            (M::ALT_PATH, 16384, "ALT_PATH"),
            (M::MIN_RNR_TIMER, 32768, "MIN_RNR_TIMER"),
            (M::SQ_PSN, 65536, "SQ_PSN"),
            (M::MAX_DEST_RD_ATOMIC, 131072, "MAX_DEST_RD_ATOMIC"),
            (M::PATH_MIG_STATE, 262144, "PATH_MIG_STATE"),
            (M::CAP, 524288, "CAP"),
            (M::DEST_QPN, 1048576, "DEST_QPN"),
            (M::RATE_LIMIT, 33554432, "RATE_LIMIT"),
        ];
        let mut all = M::empty();
        for (mask, bits, name) in expected {
            assert_eq!(mask.bits(), bits, "{name}");
            assert_eq!(mask.names(), vec![name]);
            all |= mask;
        }
        assert_eq!(all, M::KNOWN);
        assert_eq!(M::KNOWN.names().len(), 22);
        assert_eq!(M::KNOWN.iter().count(), 22);
    }

    #[test]
    fn attr_mask_operations() {
        let a = M::STATE | M::PORT;
        assert!(a.contains(M::PORT));
        assert!(a.contains(M::STATE | M::PORT));
        assert!(!a.contains(M::PORT | M::QKEY));
        assert!(a.intersects(M::PORT | M::QKEY));
        assert!(!a.intersects(M::QKEY));
        assert_eq!(a & M::PORT, M::PORT);
        assert_eq!(a & M::QKEY, M::empty());
        assert!((a & M::QKEY).is_empty());
        assert!(!a.is_empty());
        assert_eq!(a.difference(M::STATE), M::PORT);
        assert_eq!(a.union(M::QKEY), a | M::QKEY);
        assert_eq!((!a).bits(), !0x21);
        let mut b = a;
        b &= M::STATE;
        assert_eq!(b, M::STATE);
        b.set(M::AV, true);
        assert_eq!(b, M::STATE | M::AV);
        b.set(M::STATE, false);
        assert_eq!(b, M::AV);
        assert_eq!(M::from_bits_retain(0x8000_0021).bits(), 0x8000_0021);
        assert_eq!(M::from_bits_retain(0x21), a);
        assert_eq!(M::default(), M::empty());
        // Readable order, not bit order; unnamed bits last.
        let m = M::MIN_RNR_TIMER | M::DEST_QPN | M::AV | M::RQ_PSN | M::from_bits_retain(1 << 22);
        assert_eq!(
            m.names(),
            ["DEST_QPN", "RQ_PSN", "AV", "MIN_RNR_TIMER", "BIT22"]
        );
        assert_eq!(
            m.iter().map(|b| b.bits()).collect::<Vec<_>>(),
            [1 << 20, 1 << 12, 1 << 7, 1 << 15, 1 << 22]
        );
        assert_eq!(m.to_string(), "DEST_QPN, RQ_PSN, AV, MIN_RNR_TIMER, BIT22");
        assert_eq!(M::empty().to_string(), "none");
        assert_eq!(
            format!("{:?}", M::STATE | M::PORT),
            "AttrMask(STATE | PORT)"
        );
        assert_eq!(format!("{:?}", M::empty()), "AttrMask(empty)");
    }

    #[test]
    fn access_flags() {
        let expected = [
            (AccessFlags::LOCAL_WRITE, 1, "LOCAL_WRITE"),
            (AccessFlags::REMOTE_WRITE, 2, "REMOTE_WRITE"),
            (AccessFlags::REMOTE_READ, 4, "REMOTE_READ"),
            (AccessFlags::REMOTE_ATOMIC, 8, "REMOTE_ATOMIC"),
            (AccessFlags::MW_BIND, 16, "MW_BIND"),
            (AccessFlags::ZERO_BASED, 32, "ZERO_BASED"),
            (AccessFlags::ON_DEMAND, 64, "ON_DEMAND"),
            (AccessFlags::HUGETLB, 128, "HUGETLB"),
            (AccessFlags::RELAXED_ORDERING, 1 << 20, "RELAXED_ORDERING"),
        ];
        for (flag, bits, name) in expected {
            assert_eq!(flag.bits(), bits);
            assert_eq!(flag.names(), vec![name]);
        }
        let f = AccessFlags::REMOTE_READ | AccessFlags::LOCAL_WRITE;
        assert_eq!(f.names(), ["LOCAL_WRITE", "REMOTE_READ"]);
        assert!(f.contains(AccessFlags::LOCAL_WRITE));
        assert!(!f.contains(AccessFlags::REMOTE_WRITE));
        assert_eq!(f & AccessFlags::REMOTE_READ, AccessFlags::REMOTE_READ);
        assert_eq!(AccessFlags::from_bits_retain(5), f);
        assert!(AccessFlags::default().is_empty());
        assert_eq!(
            AccessFlags::QP_VALID,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC
                | AccessFlags::MW_BIND
                | AccessFlags::ON_DEMAND
        );
        assert_eq!(format!("{f:?}"), "AccessFlags(LOCAL_WRITE | REMOTE_READ)");
    }

    #[test]
    fn mtu_conversions() {
        let table = [
            (Mtu::Mtu256, 1, 256),
            (Mtu::Mtu512, 2, 512),
            (Mtu::Mtu1024, 3, 1024),
            (Mtu::Mtu2048, 4, 2048),
            (Mtu::Mtu4096, 5, 4096),
        ];
        for (mtu, ibv, bytes) in table {
            assert_eq!(mtu.bytes(), bytes);
            assert_eq!(mtu.to_ibv(), ibv);
            assert_eq!(mtu as u32, ibv);
            assert_eq!(Mtu::from_ibv(ibv), Some(mtu));
            assert_eq!(Mtu::from_bytes(bytes), Some(mtu));
        }
        for bad in [0, 6, 7, u32::MAX] {
            assert_eq!(Mtu::from_ibv(bad), None);
        }
        for bad in [0, 1, 128, 1000, 1500, 8192, 9000] {
            assert_eq!(Mtu::from_bytes(bad), None);
        }
        assert_eq!(Mtu::default(), Mtu::Mtu1024);
        assert!(Mtu::Mtu256 < Mtu::Mtu4096);
    }

    #[test]
    fn gid_ip_round_trip_and_display() {
        let v4 = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let g = Gid::from_ip(v4);
        assert_eq!(
            g.0,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1]
        );
        assert!(g.is_ipv4_mapped());
        assert_eq!(g.to_ip(), v4);
        assert_eq!(g.to_string(), "::ffff:192.0.2.1");
        assert_eq!(format!("{g:?}"), "Gid(::ffff:192.0.2.1)");
        assert_eq!(Gid::from(v4), g);

        let v6 = IpAddr::V6("fe80::1:2".parse::<Ipv6Addr>().unwrap());
        let g6 = Gid::from_ip(v6);
        assert!(!g6.is_ipv4_mapped());
        assert_eq!(g6.to_ip(), v6);
        assert_eq!(g6.to_string(), "fe80::1:2");
        assert_eq!(Gid::from(g6.octets()), g6);

        // The all-zero GID is IPv6 "::", not IPv4 0.0.0.0.
        assert_eq!(Gid::default().to_ip(), IpAddr::V6(Ipv6Addr::UNSPECIFIED));
        assert_eq!(Gid::default().to_string(), "::");
        // IPv4-compatible (deprecated) addresses are not treated as IPv4.
        let compat = Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 1]);
        assert!(matches!(compat.to_ip(), IpAddr::V6(_)));
    }

    #[test]
    fn state_and_type_names() {
        let states = ["RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"];
        for (i, (s, name)) in QpState::ALL.iter().zip(states).enumerate() {
            assert_eq!(s.to_string(), name);
            assert_eq!(s.to_ibv(), i as u32);
            assert_eq!(QpState::from_ibv(i as u32), Some(*s));
        }
        assert_eq!(QpState::from_ibv(7), None);
        assert_eq!(QpState::default(), Reset);
        assert_eq!(Rc.to_string(), "RC");
        assert_eq!(Uc.to_string(), "UC");
        assert_eq!(Ud.to_string(), "UD");
        for t in QpType::ALL {
            assert_eq!(QpType::from_ibv(t.to_ibv()), Some(t));
        }
        assert_eq!(Rc.to_ibv(), 2);
        assert_eq!(Ud.to_ibv(), 4);
        assert_eq!(QpType::from_ibv(8), None);
    }

    #[test]
    fn defaults() {
        let a = QpAttr::default();
        assert_eq!(a.qp_state, Reset);
        assert_eq!(a.path_mtu, Mtu::Mtu1024);
        assert_eq!(a.rq_psn, Psn::new(0));
        assert_eq!(a.port_num, 0);
        assert!(a.qp_access_flags.is_empty());
        assert_eq!(a.ah_attr, AhAttr::default());
        assert_eq!(a.cap, QpCap::default());
        let l = AttrLimits::default();
        assert_eq!(
            (
                l.max_qp_rd_atom,
                l.max_qp_init_rd_atom,
                l.max_qp_wr,
                l.max_sge
            ),
            (16, 16, 16384, 32)
        );
        assert_eq!((l.max_inline_data, l.max_pkeys, l.num_ports), (256, 1, 1));
        assert!(l.gid_table_len >= 1);
    }

    #[test]
    fn gid_text_round_trips() {
        for text in [
            "::ffff:127.0.0.1",
            "fe80::1",
            "fd00::2",
            "::",
            "2001:db8::8:800:200c:417a",
        ] {
            let g: Gid = text.parse().unwrap();
            assert_eq!(g.to_string(), text);
            assert_eq!(g.to_string().parse::<Gid>(), Ok(g));
        }
        // ibverbs' eight 4-digit groups and a bare IPv4 address are GIDs too.
        let mapped = Gid::from_ip(Ipv4Addr::new(127, 0, 0, 3).into());
        assert_eq!(
            "0000:0000:0000:0000:0000:ffff:7f00:0003".parse(),
            Ok(mapped)
        );
        assert_eq!("127.0.0.3".parse(), Ok(mapped));
        assert_eq!(
            " fe80::1 ".parse::<Gid>(),
            Ok(Gid::from_ip(
                Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1).into()
            ))
        );
        for bad in [
            "",
            "fe80::1::2",
            "127.0.0.256",
            "srx0",
            "00:00:00:00:00:00:00:00:00:00:255:255:127:00:00:02",
        ] {
            let e = bad.parse::<Gid>().unwrap_err();
            assert_eq!(e, GidParseError(bad.to_string()));
            assert!(
                e.to_string().starts_with(&format!("{bad:?} is not a GID")),
                "{e}"
            );
        }
    }
}
