//! Communication Management messages (IBTA vol. 1, ch. 12): the attributes
//! of the CM MAD class, each a typed `Repr` parsed from and emitted into the
//! 232 bytes of class data that follow the common MAD header.
//!
//! Offsets below count from the start of the class data (byte 24 of the
//! MAD), as the spec's message tables do. A field "at byte B, bit S, width W"
//! starts S bits below the top bit of byte B and runs W bits towards the
//! least significant end, so a 24-bit QPN at byte 32 fills bytes 32..35.
//! Reserved bits are written as zero and ignored on parse. Every message
//! fills the whole data area: the private data is a fixed-size array (the
//! wire carries no length for it; rdma_cm consumers say how much they use).
//!
//! [`CmMad`] is a whole 256-byte CM MAD: header plus one [`CmMessage`].

use crate::bth::{read_u24, write_u24};
use crate::mad::{self, method, Mad, MadRepr, DATA_LEN, MAD_LEN};
use crate::util::{be16, be32, be64, check, put16, put32, put64};
use crate::{Error, Psn, Result};

/// CM attribute IDs (the MAD's AttributeID).
pub mod attr {
    /// ClassPortInfo, read with Get.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// MsgRcptAck.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResReq.
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResReqResp.
    pub const SIDR_REP: u16 = 0x0018;
}

/// Private data bytes of a REQ.
pub const REQ_PRIVATE_DATA_LEN: usize = 92;
/// Private data bytes of an MRA.
pub const MRA_PRIVATE_DATA_LEN: usize = 222;
/// Private data bytes of a REJ.
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Private data bytes of a REP.
pub const REP_PRIVATE_DATA_LEN: usize = 196;
/// Private data bytes of an RTU.
pub const RTU_PRIVATE_DATA_LEN: usize = 224;
/// Private data bytes of a DREQ.
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;
/// Private data bytes of a DREP.
pub const DREP_PRIVATE_DATA_LEN: usize = 224;
/// Private data bytes of a SIDR_REQ.
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;
/// Private data bytes of a SIDR_REP.
pub const SIDR_REP_PRIVATE_DATA_LEN: usize = 136;
/// Bytes of REJ's ARI and SIDR_REP's additional information.
pub const ADDITIONAL_INFO_LEN: usize = 72;

/// Reads `width` bits of `b`, starting `from_top` bits below its top bit.
fn bits(b: u8, from_top: u32, width: u32) -> u8 {
    (b >> (8 - from_top - width)) & ((1u16 << width) - 1) as u8
}

/// Writes `v` into `width` bits of `b`, starting `from_top` bits below its top bit.
fn put_bits(b: &mut u8, from_top: u32, width: u32, v: u8) {
    let shift = 8 - from_top - width;
    let mask = ((1u16 << width) - 1) as u8;
    *b = (*b & !(mask << shift)) | ((v & mask) << shift);
}

/// Fails unless `value` fits in `width` bits: `emit` would truncate it
/// silently and the peer would read another value.
fn fits(header: &'static str, field: &'static str, value: u64, width: u32) -> Result<()> {
    if value >> width != 0 {
        return Err(Error::BadField {
            header,
            field,
            value,
        });
    }
    Ok(())
}

/// Checks that the class data holds the whole message and returns it.
fn data<'a>(header: &'static str, b: &'a [u8]) -> Result<&'a [u8]> {
    check(header, b, DATA_LEN)?;
    Ok(&b[..DATA_LEN])
}

/// Zeroes the data area (so reserved bits go out as zero) and returns it.
fn data_mut(b: &mut [u8]) -> Result<&mut [u8]> {
    if b.len() < DATA_LEN {
        return Err(Error::BufferTooSmall {
            need: DATA_LEN,
            have: b.len(),
        });
    }
    let d = &mut b[..DATA_LEN];
    d.fill(0);
    Ok(d)
}

fn array<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}

/// Transport Service Type of a REQ (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportType {
    /// Reliable Connection.
    Rc = 0,
    /// Unreliable Connection.
    Uc = 1,
    /// Reliable Datagram.
    Rd = 2,
    /// Extended: the REQ's Extended Transport Type says which. Its one
    /// value, 1, is XRC (IBTA annex A14): the requester is an XRC
    /// initiator, the responder answers for an XRC target, whose QPN its
    /// REP carries in the Local EECN field ([`EXTENDED_XRC`]).
    Extended = 3,
}

/// The Extended Transport Type of an XRC REQ (with [`TransportType::Extended`]).
pub const EXTENDED_XRC: u8 = 1;

impl TransportType {
    fn from_bits(v: u8) -> Result<Self> {
        match v {
            0 => Ok(TransportType::Rc),
            1 => Ok(TransportType::Uc),
            2 => Ok(TransportType::Rd),
            3 => Ok(TransportType::Extended),
            _ => Err(Error::BadField {
                header: "CM REQ",
                field: "TransportServiceType",
                value: v.into(),
            }),
        }
    }
}

/// A path as a REQ describes it (the primary and the alternate have the
/// same 44-byte layout). For RoCEv2 the GIDs are the IP addresses (IPv4 ones
/// IPv4-mapped), and the LIDs are unused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmPath {
    /// The requester's LID.
    pub local_lid: u16,
    /// The responder's LID.
    pub remote_lid: u16,
    /// The requester's GID.
    pub local_gid: [u8; 16],
    /// The responder's GID.
    pub remote_gid: [u8; 16],
    /// GRH flow label (20 bits).
    pub flow_label: u32,
    /// Static rate code (6 bits).
    pub packet_rate: u8,
    /// GRH traffic class (for RoCEv2, the IP DSCP and ECN byte).
    pub traffic_class: u8,
    /// GRH hop limit (for RoCEv2, the IP TTL).
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Both ends are in the same subnet.
    pub subnet_local: bool,
    /// Local ACK timeout exponent (5 bits): 4.096 µs × 2^value.
    pub local_ack_timeout: u8,
}

impl CmPath {
    /// Bytes a path takes in a REQ.
    pub const LEN: usize = 44;

    fn parse(b: &[u8]) -> Self {
        CmPath {
            local_lid: be16(&b[0..]),
            remote_lid: be16(&b[2..]),
            local_gid: array(&b[4..]),
            remote_gid: array(&b[20..]),
            flow_label: be32(&b[36..]) >> 12,
            packet_rate: bits(b[39], 2, 6),
            traffic_class: b[40],
            hop_limit: b[41],
            sl: bits(b[42], 0, 4),
            subnet_local: bits(b[42], 4, 1) != 0,
            local_ack_timeout: bits(b[43], 0, 5),
        }
    }

    fn check(&self) -> Result<()> {
        fits("CM REQ", "FlowLabel", self.flow_label.into(), 20)?;
        fits("CM REQ", "PacketRate", self.packet_rate.into(), 6)?;
        fits("CM REQ", "SL", self.sl.into(), 4)?;
        fits(
            "CM REQ",
            "LocalACKTimeout",
            self.local_ack_timeout.into(),
            5,
        )
    }

    /// Writes the path into 44 zeroed bytes.
    fn emit(&self, b: &mut [u8]) {
        put16(&mut b[0..], self.local_lid);
        put16(&mut b[2..], self.remote_lid);
        b[4..20].copy_from_slice(&self.local_gid);
        b[20..36].copy_from_slice(&self.remote_gid);
        put32(&mut b[36..], self.flow_label << 12);
        put_bits(&mut b[39], 2, 6, self.packet_rate);
        b[40] = self.traffic_class;
        b[41] = self.hop_limit;
        put_bits(&mut b[42], 0, 4, self.sl);
        put_bits(&mut b[42], 4, 1, self.subnet_local.into());
        put_bits(&mut b[43], 0, 5, self.local_ack_timeout);
    }
}

/// ConnectRequest (REQ), attribute 0x0010.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReqRepr {
    /// The requester's communication ID.
    pub local_comm_id: u32,
    /// ECE: the vendor whose options the MAD's AttributeModifier offers
    /// (24 bits at byte 5, as the kernel's `CM_REQ_VENDOR_ID`; 0: none).
    pub vendor_id: u32,
    /// The service the requester connects to (rdma_cm: see [`crate::cma`]).
    pub service_id: u64,
    /// The requester's CA GUID.
    pub local_ca_guid: u64,
    /// The requester's Q_Key (UD/RD only).
    pub local_qkey: u32,
    /// The requester's QPN (24 bits).
    pub local_qpn: u32,
    /// RDMA READ/atomic requests the requester accepts at once.
    pub responder_resources: u8,
    /// The requester's local EECN (RD only, 24 bits).
    pub local_eecn: u32,
    /// RDMA READ/atomic requests the requester will have outstanding.
    pub initiator_depth: u8,
    /// The responder's EECN (RD only, 24 bits).
    pub remote_eecn: u32,
    /// How long the responder's CM takes to answer (5-bit exponent).
    pub remote_cm_response_timeout: u8,
    /// RC, UC or RD.
    pub transport: TransportType,
    /// The requester generates end-to-end credits.
    pub end_to_end_flow_control: bool,
    /// The first PSN the requester will send.
    pub starting_psn: Psn,
    /// How long the requester's CM takes to answer (5-bit exponent).
    pub local_cm_response_timeout: u8,
    /// Transport retries on timeout (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU code (4 bits: 1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// RD only: an RDC exists.
    pub rdc_exists: bool,
    /// Retries on RNR NAK (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// Times the CM resends the REQ (4 bits).
    pub max_cm_retries: u8,
    /// The requester's QP uses an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits; XRC = 1).
    pub extended_transport: u8,
    /// The primary path.
    pub primary_path: CmPath,
    /// The alternate path (all zero when there is none).
    pub alternate_path: CmPath,
    /// Service-Aware Path supported.
    pub sap_supported: bool,
    /// Private data (rdma_cm puts a [`crate::cma::CmaHeader`] first).
    pub private_data: [u8; REQ_PRIVATE_DATA_LEN],
}

impl ReqRepr {
    /// Whether the REQ asks for an XRC connection (transport Extended,
    /// extended type XRC).
    pub fn is_xrc(&self) -> bool {
        self.transport == TransportType::Extended && self.extended_transport == EXTENDED_XRC
    }

    /// Parses the 232 bytes of class data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        let d = data("CM REQ", b)?;
        Ok(ReqRepr {
            local_comm_id: be32(&d[0..]),
            vendor_id: read_u24(&d[5..]),
            service_id: be64(&d[8..]),
            local_ca_guid: be64(&d[16..]),
            local_qkey: be32(&d[28..]),
            local_qpn: read_u24(&d[32..]),
            responder_resources: d[35],
            local_eecn: read_u24(&d[36..]),
            initiator_depth: d[39],
            remote_eecn: read_u24(&d[40..]),
            remote_cm_response_timeout: bits(d[43], 0, 5),
            transport: TransportType::from_bits(bits(d[43], 5, 2))?,
            end_to_end_flow_control: bits(d[43], 7, 1) != 0,
            starting_psn: Psn::new(read_u24(&d[44..])),
            local_cm_response_timeout: bits(d[47], 0, 5),
            retry_count: bits(d[47], 5, 3),
            pkey: be16(&d[48..]),
            path_mtu: bits(d[50], 0, 4),
            rdc_exists: bits(d[50], 4, 1) != 0,
            rnr_retry_count: bits(d[50], 5, 3),
            max_cm_retries: bits(d[51], 0, 4),
            srq: bits(d[51], 4, 1) != 0,
            extended_transport: bits(d[51], 5, 3),
            primary_path: CmPath::parse(&d[52..96]),
            alternate_path: CmPath::parse(&d[96..140]),
            sap_supported: bits(d[139], 5, 1) != 0,
            private_data: array(&d[140..]),
        })
    }

    fn check(&self) -> Result<()> {
        let h = "CM REQ";
        fits(h, "VendorID", self.vendor_id.into(), 24)?;
        fits(h, "LocalQPN", self.local_qpn.into(), 24)?;
        fits(h, "LocalEECN", self.local_eecn.into(), 24)?;
        fits(h, "RemoteEECN", self.remote_eecn.into(), 24)?;
        fits(
            h,
            "RemoteCMResponseTimeout",
            self.remote_cm_response_timeout.into(),
            5,
        )?;
        fits(
            h,
            "LocalCMResponseTimeout",
            self.local_cm_response_timeout.into(),
            5,
        )?;
        fits(h, "RetryCount", self.retry_count.into(), 3)?;
        fits(h, "PathMTU", self.path_mtu.into(), 4)?;
        fits(h, "RNRRetryCount", self.rnr_retry_count.into(), 3)?;
        fits(h, "MaxCMRetries", self.max_cm_retries.into(), 4)?;
        fits(
            h,
            "ExtendedTransportType",
            self.extended_transport.into(),
            3,
        )?;
        self.primary_path.check()?;
        self.alternate_path.check()
    }

    /// Writes the message into the class data (at least 232 bytes).
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        self.check()?;
        let d = data_mut(b)?;
        put32(&mut d[0..], self.local_comm_id);
        write_u24(&mut d[5..], self.vendor_id);
        put64(&mut d[8..], self.service_id);
        put64(&mut d[16..], self.local_ca_guid);
        put32(&mut d[28..], self.local_qkey);
        write_u24(&mut d[32..], self.local_qpn);
        d[35] = self.responder_resources;
        write_u24(&mut d[36..], self.local_eecn);
        d[39] = self.initiator_depth;
        write_u24(&mut d[40..], self.remote_eecn);
        put_bits(&mut d[43], 0, 5, self.remote_cm_response_timeout);
        put_bits(&mut d[43], 5, 2, self.transport as u8);
        put_bits(&mut d[43], 7, 1, self.end_to_end_flow_control.into());
        write_u24(&mut d[44..], self.starting_psn.value());
        put_bits(&mut d[47], 0, 5, self.local_cm_response_timeout);
        put_bits(&mut d[47], 5, 3, self.retry_count);
        put16(&mut d[48..], self.pkey);
        put_bits(&mut d[50], 0, 4, self.path_mtu);
        put_bits(&mut d[50], 4, 1, self.rdc_exists.into());
        put_bits(&mut d[50], 5, 3, self.rnr_retry_count);
        put_bits(&mut d[51], 0, 4, self.max_cm_retries);
        put_bits(&mut d[51], 4, 1, self.srq.into());
        put_bits(&mut d[51], 5, 3, self.extended_transport);
        self.primary_path.emit(&mut d[52..96]);
        self.alternate_path.emit(&mut d[96..140]);
        put_bits(&mut d[139], 5, 1, self.sap_supported.into());
        d[140..].copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// Which message an MRA or REJ answers (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKind {
    /// The REQ.
    Req = 0,
    /// The REP.
    Rep = 1,
    /// MRA: the LAP; REJ: no message (the REJ is unsolicited).
    Other = 2,
}

impl MessageKind {
    fn from_bits(header: &'static str, field: &'static str, v: u8) -> Result<Self> {
        match v {
            0 => Ok(MessageKind::Req),
            1 => Ok(MessageKind::Rep),
            2 => Ok(MessageKind::Other),
            _ => Err(Error::BadField {
                header,
                field,
                value: v.into(),
            }),
        }
    }
}

/// MsgRcptAck (MRA), attribute 0x0011: "your message arrived, the answer
/// will take longer".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MraRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The message being acknowledged.
    pub message_mraed: MessageKind,
    /// How long until the answer (5-bit exponent).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; MRA_PRIVATE_DATA_LEN],
}

impl MraRepr {
    /// Parses the 232 bytes of class data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        let d = data("CM MRA", b)?;
        Ok(MraRepr {
            local_comm_id: be32(&d[0..]),
            remote_comm_id: be32(&d[4..]),
            message_mraed: MessageKind::from_bits("CM MRA", "MessageMRAed", bits(d[8], 0, 2))?,
            service_timeout: bits(d[9], 0, 5),
            private_data: array(&d[10..]),
        })
    }

    /// Writes the message into the class data (at least 232 bytes).
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        fits("CM MRA", "ServiceTimeout", self.service_timeout.into(), 5)?;
        let d = data_mut(b)?;
        put32(&mut d[0..], self.local_comm_id);
        put32(&mut d[4..], self.remote_comm_id);
        put_bits(&mut d[8], 0, 2, self.message_mraed as u8);
        put_bits(&mut d[9], 0, 5, self.service_timeout);
        d[10..].copy_from_slice(&self.private_data);
        Ok(())
    }
}

macro_rules! rej_reasons {
    ($($name:ident = $code:literal, $doc:literal;)*) => {
        /// Why a REJ rejects (IBTA table 109; codes as the spec numbers them).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum RejReason {
            $(#[doc = $doc] $name,)*
            /// A code the spec does not define (kept so the bytes round-trip).
            Other(u16),
        }

        impl RejReason {
            /// The reason for a code.
            pub const fn from_code(code: u16) -> Self {
                match code {
                    $($code => RejReason::$name,)*
                    c => RejReason::Other(c),
                }
            }
            /// The code on the wire.
            pub const fn code(self) -> u16 {
                match self {
                    $(RejReason::$name => $code,)*
                    RejReason::Other(c) => c,
                }
            }
        }
    };
}

rej_reasons! {
    NoQp = 1, "No QP available.";
    NoEec = 2, "No EE context available.";
    NoResources = 3, "No resources available.";
    Timeout = 4, "The CM timed out waiting for an answer.";
    Unsupported = 5, "Request unsupported.";
    InvalidCommId = 6, "Invalid communication ID.";
    InvalidCommInstance = 7, "Invalid communication instance.";
    InvalidServiceId = 8, "No listener on the service ID.";
    InvalidTransportType = 9, "Invalid transport service type.";
    StaleConnection = 10, "Stale connection (the QPN is in timewait).";
    RdcNotExist = 11, "RDC does not exist.";
    InvalidGid = 12, "Primary remote port GID rejected.";
    InvalidLid = 13, "Primary remote port LID rejected.";
    InvalidSl = 14, "Invalid primary SL.";
    InvalidTrafficClass = 15, "Invalid primary traffic class.";
    InvalidHopLimit = 16, "Invalid primary hop limit.";
    InvalidPacketRate = 17, "Invalid primary packet rate.";
    InvalidAltGid = 18, "Alternate remote port GID rejected.";
    InvalidAltLid = 19, "Alternate remote port LID rejected.";
    InvalidAltSl = 20, "Invalid alternate SL.";
    InvalidAltTrafficClass = 21, "Invalid alternate traffic class.";
    InvalidAltHopLimit = 22, "Invalid alternate hop limit.";
    InvalidAltPacketRate = 23, "Invalid alternate packet rate.";
    PortCmRedirect = 24, "Port and CM redirection.";
    PortRedirect = 25, "Port redirection.";
    InvalidMtu = 26, "Invalid path MTU.";
    InsufficientRespResources = 27, "Insufficient responder resources.";
    ConsumerDefined = 28, "Rejected by the consumer (rdma_reject, or rdma_cm's own reasons).";
    InvalidRnrRetry = 29, "Invalid RNR NAK retry count.";
    DuplicateLocalCommId = 30, "Duplicate local communication ID.";
    InvalidClassVersion = 31, "Unsupported CM class version.";
    InvalidFlowLabel = 32, "Invalid primary flow label.";
    InvalidAltFlowLabel = 33, "Invalid alternate flow label.";
    VendorOptionNotSupported = 35, "Vendor option not supported.";
}

/// ConnectReject (REJ), attribute 0x0012.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RejRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID (0 when unknown).
    pub remote_comm_id: u32,
    /// The message rejected.
    pub message_rejected: MessageKind,
    /// Bytes of `ari` that count (7 bits, at most 72).
    pub reject_info_len: u8,
    /// The reason.
    pub reason: RejReason,
    /// Additional Rejection Information.
    pub ari: [u8; ADDITIONAL_INFO_LEN],
    /// Private data.
    pub private_data: [u8; REJ_PRIVATE_DATA_LEN],
}

impl RejRepr {
    /// Parses the 232 bytes of class data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        let d = data("CM REJ", b)?;
        let reject_info_len = bits(d[9], 0, 7);
        if usize::from(reject_info_len) > ADDITIONAL_INFO_LEN {
            return Err(Error::BadLength {
                header: "CM REJ",
                field: "RejectedInfoLength",
                value: reject_info_len.into(),
                have: ADDITIONAL_INFO_LEN,
            });
        }
        Ok(RejRepr {
            local_comm_id: be32(&d[0..]),
            remote_comm_id: be32(&d[4..]),
            message_rejected: MessageKind::from_bits(
                "CM REJ",
                "MessageRejected",
                bits(d[8], 0, 2),
            )?,
            reject_info_len,
            reason: RejReason::from_code(be16(&d[10..])),
            ari: array(&d[12..]),
            private_data: array(&d[84..]),
        })
    }

    /// Writes the message into the class data (at least 232 bytes).
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        if usize::from(self.reject_info_len) > ADDITIONAL_INFO_LEN {
            return Err(Error::BadField {
                header: "CM REJ",
                field: "RejectedInfoLength",
                value: self.reject_info_len.into(),
            });
        }
        let d = data_mut(b)?;
        put32(&mut d[0..], self.local_comm_id);
        put32(&mut d[4..], self.remote_comm_id);
        put_bits(&mut d[8], 0, 2, self.message_rejected as u8);
        put_bits(&mut d[9], 0, 7, self.reject_info_len);
        put16(&mut d[10..], self.reason.code());
        d[12..84].copy_from_slice(&self.ari);
        d[84..].copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// ConnectReply (REP), attribute 0x0013.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepRepr {
    /// The responder's communication ID.
    pub local_comm_id: u32,
    /// The requester's communication ID.
    pub remote_comm_id: u32,
    /// The responder's Q_Key (UD/RD only).
    pub local_qkey: u32,
    /// The responder's QPN (24 bits).
    pub local_qpn: u32,
    /// ECE: the vendor whose options the MAD's AttributeModifier answers
    /// with (24 bits, one byte after each of the QPN, EECN and PSN: the
    /// kernel's `CM_REP_VENDOR_ID_H/_M/_L` at bytes 15, 19 and 23; 0: none).
    pub vendor_id: u32,
    /// The responder's EE context (RD only, 24 bits).
    pub local_eecn: u32,
    /// The first PSN the responder will send.
    pub starting_psn: Psn,
    /// RDMA READ/atomic requests the responder accepts at once.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests the responder will have outstanding.
    pub initiator_depth: u8,
    /// The responder's ACK delay (5-bit exponent).
    pub target_ack_delay: u8,
    /// Alternate path: 0 accepted, 1 unsupported, 2 rejected (2 bits).
    pub failover_accepted: u8,
    /// The responder generates end-to-end credits.
    pub end_to_end_flow_control: bool,
    /// Retries on RNR NAK the requester should use (3 bits).
    pub rnr_retry_count: u8,
    /// The responder's QP uses an SRQ.
    pub srq: bool,
    /// The responder's CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; REP_PRIVATE_DATA_LEN],
}

impl RepRepr {
    /// Parses the 232 bytes of class data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        let d = data("CM REP", b)?;
        Ok(RepRepr {
            local_comm_id: be32(&d[0..]),
            remote_comm_id: be32(&d[4..]),
            local_qkey: be32(&d[8..]),
            local_qpn: read_u24(&d[12..]),
            vendor_id: u32::from_be_bytes([0, d[15], d[19], d[23]]),
            local_eecn: read_u24(&d[16..]),
            starting_psn: Psn::new(read_u24(&d[20..])),
            responder_resources: d[24],
            initiator_depth: d[25],
            target_ack_delay: bits(d[26], 0, 5),
            failover_accepted: bits(d[26], 5, 2),
            end_to_end_flow_control: bits(d[26], 7, 1) != 0,
            rnr_retry_count: bits(d[27], 0, 3),
            srq: bits(d[27], 3, 1) != 0,
            local_ca_guid: be64(&d[28..]),
            private_data: array(&d[36..]),
        })
    }

    fn check(&self) -> Result<()> {
        let h = "CM REP";
        fits(h, "VendorID", self.vendor_id.into(), 24)?;
        fits(h, "LocalQPN", self.local_qpn.into(), 24)?;
        fits(h, "LocalEECN", self.local_eecn.into(), 24)?;
        fits(h, "TargetACKDelay", self.target_ack_delay.into(), 5)?;
        fits(h, "FailoverAccepted", self.failover_accepted.into(), 2)?;
        fits(h, "RNRRetryCount", self.rnr_retry_count.into(), 3)
    }

    /// Writes the message into the class data (at least 232 bytes).
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        self.check()?;
        let d = data_mut(b)?;
        put32(&mut d[0..], self.local_comm_id);
        put32(&mut d[4..], self.remote_comm_id);
        put32(&mut d[8..], self.local_qkey);
        write_u24(&mut d[12..], self.local_qpn);
        write_u24(&mut d[16..], self.local_eecn);
        write_u24(&mut d[20..], self.starting_psn.value());
        let [_, h, m, l] = self.vendor_id.to_be_bytes();
        (d[15], d[19], d[23]) = (h, m, l);
        d[24] = self.responder_resources;
        d[25] = self.initiator_depth;
        put_bits(&mut d[26], 0, 5, self.target_ack_delay);
        put_bits(&mut d[26], 5, 2, self.failover_accepted);
        put_bits(&mut d[26], 7, 1, self.end_to_end_flow_control.into());
        put_bits(&mut d[27], 0, 3, self.rnr_retry_count);
        put_bits(&mut d[27], 3, 1, self.srq.into());
        put64(&mut d[28..], self.local_ca_guid);
        d[36..].copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// The messages that are two communication IDs and private data: RTU
/// (0x0014) and DREP (0x0016) share this layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommIdsRepr<const N: usize> {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; N],
}

/// ReadyToUse (RTU), attribute 0x0014.
pub type RtuRepr = CommIdsRepr<RTU_PRIVATE_DATA_LEN>;
/// DisconnectReply (DREP), attribute 0x0016.
pub type DrepRepr = CommIdsRepr<DREP_PRIVATE_DATA_LEN>;

impl<const N: usize> CommIdsRepr<N> {
    /// Parses the 232 bytes of class data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        let d = data("CM RTU/DREP", b)?;
        Ok(CommIdsRepr {
            local_comm_id: be32(&d[0..]),
            remote_comm_id: be32(&d[4..]),
            private_data: array(&d[8..]),
        })
    }

    /// Writes the message into the class data (at least 232 bytes).
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        let d = data_mut(b)?;
        put32(&mut d[0..], self.local_comm_id);
        put32(&mut d[4..], self.remote_comm_id);
        d[8..8 + N].copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// DisconnectRequest (DREQ), attribute 0x0015.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DreqRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QPN (or EECN for RD), 24 bits.
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: [u8; DREQ_PRIVATE_DATA_LEN],
}

impl DreqRepr {
    /// Parses the 232 bytes of class data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        let d = data("CM DREQ", b)?;
        Ok(DreqRepr {
            local_comm_id: be32(&d[0..]),
            remote_comm_id: be32(&d[4..]),
            remote_qpn: read_u24(&d[8..]),
            private_data: array(&d[12..]),
        })
    }

    /// Writes the message into the class data (at least 232 bytes).
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        fits("CM DREQ", "RemoteQPN/EECN", self.remote_qpn.into(), 24)?;
        let d = data_mut(b)?;
        put32(&mut d[0..], self.local_comm_id);
        put32(&mut d[4..], self.remote_comm_id);
        write_u24(&mut d[8..], self.remote_qpn);
        d[12..].copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// ServiceIDResReq (SIDR_REQ), attribute 0x0017: "which UD QP serves this
/// service ID?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReqRepr {
    /// The requester's ID for this request.
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// The service asked for.
    pub service_id: u64,
    /// Private data.
    pub private_data: [u8; SIDR_REQ_PRIVATE_DATA_LEN],
}

impl SidrReqRepr {
    /// Parses the 232 bytes of class data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        let d = data("CM SIDR_REQ", b)?;
        Ok(SidrReqRepr {
            request_id: be32(&d[0..]),
            pkey: be16(&d[4..]),
            service_id: be64(&d[8..]),
            private_data: array(&d[16..]),
        })
    }

    /// Writes the message into the class data (at least 232 bytes).
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        let d = data_mut(b)?;
        put32(&mut d[0..], self.request_id);
        put16(&mut d[4..], self.pkey);
        put64(&mut d[8..], self.service_id);
        d[16..].copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// SIDR_REP status (IBTA table 120).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SidrStatus {
    /// The QPN and Q_Key are valid.
    Success = 0,
    /// The service ID is not supported.
    Unsupported = 1,
    /// Rejected by the service provider.
    Reject = 2,
    /// No QP available.
    NoQp = 3,
    /// Redirected (the additional information says where).
    Redirect = 4,
    /// The SIDR_REQ's class version is not supported.
    UnsupportedVersion = 5,
}

impl SidrStatus {
    fn from_u8(v: u8) -> Result<Self> {
        Ok(match v {
            0 => SidrStatus::Success,
            1 => SidrStatus::Unsupported,
            2 => SidrStatus::Reject,
            3 => SidrStatus::NoQp,
            4 => SidrStatus::Redirect,
            5 => SidrStatus::UnsupportedVersion,
            _ => {
                return Err(Error::BadField {
                    header: "CM SIDR_REP",
                    field: "Status",
                    value: v.into(),
                })
            }
        })
    }
}

/// ServiceIDResReqResp (SIDR_REP), attribute 0x0018.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrRepRepr {
    /// The request ID of the SIDR_REQ answered.
    pub request_id: u32,
    /// The outcome.
    pub status: SidrStatus,
    /// Bytes of `additional_info` that count (at most 72).
    pub additional_info_len: u8,
    /// The UD QP serving the service (24 bits).
    pub qpn: u32,
    /// The service ID resolved.
    pub service_id: u64,
    /// The Q_Key of that QP.
    pub qkey: u32,
    /// Additional information (a ClassPortInfo on redirect).
    pub additional_info: [u8; ADDITIONAL_INFO_LEN],
    /// Private data.
    pub private_data: [u8; SIDR_REP_PRIVATE_DATA_LEN],
}

impl SidrRepRepr {
    /// Parses the 232 bytes of class data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        let d = data("CM SIDR_REP", b)?;
        if usize::from(d[5]) > ADDITIONAL_INFO_LEN {
            return Err(Error::BadLength {
                header: "CM SIDR_REP",
                field: "AdditionalInformationLength",
                value: d[5].into(),
                have: ADDITIONAL_INFO_LEN,
            });
        }
        Ok(SidrRepRepr {
            request_id: be32(&d[0..]),
            status: SidrStatus::from_u8(d[4])?,
            additional_info_len: d[5],
            qpn: read_u24(&d[8..]),
            service_id: be64(&d[12..]),
            qkey: be32(&d[20..]),
            additional_info: array(&d[24..]),
            private_data: array(&d[96..]),
        })
    }

    /// Writes the message into the class data (at least 232 bytes).
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        fits("CM SIDR_REP", "QPN", self.qpn.into(), 24)?;
        if usize::from(self.additional_info_len) > ADDITIONAL_INFO_LEN {
            return Err(Error::BadField {
                header: "CM SIDR_REP",
                field: "AdditionalInformationLength",
                value: self.additional_info_len.into(),
            });
        }
        let d = data_mut(b)?;
        put32(&mut d[0..], self.request_id);
        d[4] = self.status as u8;
        d[5] = self.additional_info_len;
        write_u24(&mut d[8..], self.qpn);
        put64(&mut d[12..], self.service_id);
        put32(&mut d[20..], self.qkey);
        d[24..96].copy_from_slice(&self.additional_info);
        d[96..].copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// Where a class's redirect or trap target lives (part of ClassPortInfo).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortTarget {
    /// GID.
    pub gid: [u8; 16],
    /// Traffic class.
    pub traffic_class: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// LID.
    pub lid: u16,
    /// Partition key.
    pub pkey: u16,
    /// Redirect: reserved (0). Trap: the hop limit.
    pub hop_limit: u8,
    /// QPN (24 bits).
    pub qp: u32,
    /// Q_Key.
    pub qkey: u32,
}

impl PortTarget {
    /// Bytes a target takes: GID, TC/SL/FL, LID, P_Key, hop limit/QP, Q_Key.
    const LEN: usize = 32;

    fn parse(b: &[u8]) -> Self {
        let tc_sl_fl = be32(&b[16..]);
        PortTarget {
            gid: array(&b[0..]),
            traffic_class: (tc_sl_fl >> 24) as u8,
            sl: ((tc_sl_fl >> 20) & 0xF) as u8,
            flow_label: tc_sl_fl & 0xF_FFFF,
            lid: be16(&b[20..]),
            pkey: be16(&b[22..]),
            hop_limit: b[24],
            qp: read_u24(&b[25..]),
            qkey: be32(&b[28..]),
        }
    }

    fn check(&self) -> Result<()> {
        fits("CM ClassPortInfo", "SL", self.sl.into(), 4)?;
        fits("CM ClassPortInfo", "FL", self.flow_label.into(), 20)?;
        fits("CM ClassPortInfo", "QP", self.qp.into(), 24)
    }

    fn emit(&self, b: &mut [u8]) {
        b[0..16].copy_from_slice(&self.gid);
        let tc_sl_fl =
            (u32::from(self.traffic_class) << 24) | (u32::from(self.sl) << 20) | self.flow_label;
        put32(&mut b[16..], tc_sl_fl);
        put16(&mut b[20..], self.lid);
        put16(&mut b[22..], self.pkey);
        b[24] = self.hop_limit;
        write_u24(&mut b[25..], self.qp);
        put32(&mut b[28..], self.qkey);
    }
}

/// ClassPortInfo (attribute 0x0001, IBTA 13.4.8.1): what a port's CM
/// supports and where to redirect. 72 bytes; the rest of the data is reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClassPortInfoRepr {
    /// Highest MAD base version supported.
    pub base_version: u8,
    /// Highest class version supported.
    pub class_version: u8,
    /// Capability mask.
    pub capability_mask: u16,
    /// Capability mask 2 (27 bits).
    pub capability_mask2: u32,
    /// Response time exponent (5 bits).
    pub resp_time_value: u8,
    /// Where requests are redirected.
    pub redirect: PortTarget,
    /// Where traps are sent.
    pub trap: PortTarget,
}

impl ClassPortInfoRepr {
    /// Bytes the attribute takes.
    pub const LEN: usize = 8 + 2 * PortTarget::LEN;

    /// Parses the class data (at least 232 bytes).
    pub fn parse(b: &[u8]) -> Result<Self> {
        let d = data("CM ClassPortInfo", b)?;
        let cap2_resp = be32(&d[4..]);
        Ok(ClassPortInfoRepr {
            base_version: d[0],
            class_version: d[1],
            capability_mask: be16(&d[2..]),
            capability_mask2: cap2_resp >> 5,
            resp_time_value: (cap2_resp & 0x1F) as u8,
            redirect: PortTarget::parse(&d[8..40]),
            trap: PortTarget::parse(&d[40..72]),
        })
    }

    /// Writes the attribute into the class data (at least 232 bytes).
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        fits(
            "CM ClassPortInfo",
            "CapabilityMask2",
            self.capability_mask2.into(),
            27,
        )?;
        fits(
            "CM ClassPortInfo",
            "RespTimeValue",
            self.resp_time_value.into(),
            5,
        )?;
        self.redirect.check()?;
        self.trap.check()?;
        let d = data_mut(b)?;
        d[0] = self.base_version;
        d[1] = self.class_version;
        put16(&mut d[2..], self.capability_mask);
        put32(
            &mut d[4..],
            (self.capability_mask2 << 5) | u32::from(self.resp_time_value),
        );
        self.redirect.emit(&mut d[8..40]);
        self.trap.emit(&mut d[40..72]);
        Ok(())
    }
}

/// One CM attribute, typed by its AttributeID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmMessage {
    /// ClassPortInfo (0x0001).
    ClassPortInfo(ClassPortInfoRepr),
    /// REQ (0x0010).
    Req(ReqRepr),
    /// MRA (0x0011).
    Mra(MraRepr),
    /// REJ (0x0012).
    Rej(RejRepr),
    /// REP (0x0013).
    Rep(RepRepr),
    /// RTU (0x0014).
    Rtu(RtuRepr),
    /// DREQ (0x0015).
    Dreq(DreqRepr),
    /// DREP (0x0016).
    Drep(DrepRepr),
    /// SIDR_REQ (0x0017).
    SidrReq(SidrReqRepr),
    /// SIDR_REP (0x0018).
    SidrRep(SidrRepRepr),
}

impl CmMessage {
    /// The AttributeID this message travels under.
    pub const fn attribute_id(&self) -> u16 {
        match self {
            CmMessage::ClassPortInfo(_) => attr::CLASS_PORT_INFO,
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
            CmMessage::SidrReq(_) => attr::SIDR_REQ,
            CmMessage::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// Parses the class data of a MAD with this AttributeID. LAP and APR
    /// (alternate path loading) are not supported and fail as unknown.
    pub fn parse(attribute_id: u16, d: &[u8]) -> Result<Self> {
        Ok(match attribute_id {
            attr::CLASS_PORT_INFO => CmMessage::ClassPortInfo(ClassPortInfoRepr::parse(d)?),
            attr::REQ => CmMessage::Req(ReqRepr::parse(d)?),
            attr::MRA => CmMessage::Mra(MraRepr::parse(d)?),
            attr::REJ => CmMessage::Rej(RejRepr::parse(d)?),
            attr::REP => CmMessage::Rep(RepRepr::parse(d)?),
            attr::RTU => CmMessage::Rtu(RtuRepr::parse(d)?),
            attr::DREQ => CmMessage::Dreq(DreqRepr::parse(d)?),
            attr::DREP => CmMessage::Drep(DrepRepr::parse(d)?),
            attr::SIDR_REQ => CmMessage::SidrReq(SidrReqRepr::parse(d)?),
            attr::SIDR_REP => CmMessage::SidrRep(SidrRepRepr::parse(d)?),
            id => {
                return Err(Error::BadField {
                    header: "MAD",
                    field: "AttributeID",
                    value: id.into(),
                })
            }
        })
    }

    /// Writes the message into the class data (at least 232 bytes).
    pub fn emit(&self, d: &mut [u8]) -> Result<()> {
        match self {
            CmMessage::ClassPortInfo(m) => m.emit(d),
            CmMessage::Req(m) => m.emit(d),
            CmMessage::Mra(m) => m.emit(d),
            CmMessage::Rej(m) => m.emit(d),
            CmMessage::Rep(m) => m.emit(d),
            CmMessage::Rtu(m) => m.emit(d),
            CmMessage::Dreq(m) => m.emit(d),
            CmMessage::Drep(m) => m.emit(d),
            CmMessage::SidrReq(m) => m.emit(d),
            CmMessage::SidrRep(m) => m.emit(d),
        }
    }
}

/// Enhanced Connection Establishment as a REQ or REP carries it (the
/// kernel's `struct rdma_ucm_ece`): the vendor in the message's VendorID
/// field (24 bits) and that vendor's option bits in the MAD header's
/// AttributeModifier. All zero (no vendor) means no ECE, which is what a
/// peer without ECE sends. What the options mean, and which both ends
/// agree to, is the transport's business (`softrdma_engine::Ece`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Ece {
    /// The vendor (an IEEE OUI, 24 bits; 0: none).
    pub vendor_id: u32,
    /// The vendor's option bits (the AttributeModifier).
    pub options: u32,
}

/// A whole CM MAD: the common header and the message its AttributeID names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmMad {
    /// The common header; `attribute_id` must match `message`.
    pub header: MadRepr,
    /// The message.
    pub message: CmMessage,
}

impl CmMad {
    /// A CM message sent with method Send (as every CM message but
    /// ClassPortInfo is).
    pub const fn send(transaction_id: u64, message: CmMessage) -> Self {
        CmMad {
            header: MadRepr::cm(method::SEND, transaction_id, message.attribute_id()),
            message,
        }
    }

    /// Parses a MAD received on QP1: exactly [`MAD_LEN`] bytes, BaseVersion
    /// 1, class CM, class version 2, a known attribute.
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() != MAD_LEN {
            check("MAD", b, MAD_LEN)?;
            return Err(Error::BadLength {
                header: "MAD",
                field: "length",
                value: b.len(),
                have: MAD_LEN,
            });
        }
        let m = Mad::new_checked(b)?;
        let header = MadRepr::parse(&m)?;
        let bad = |field, value: u8| Error::BadField {
            header: "MAD",
            field,
            value: value.into(),
        };
        if header.mgmt_class != mad::MGMT_CLASS_CM {
            return Err(bad("MgmtClass", header.mgmt_class));
        }
        if header.class_version != mad::CM_CLASS_VERSION {
            return Err(bad("ClassVersion", header.class_version));
        }
        let message = CmMessage::parse(header.attribute_id, m.data())?;
        Ok(CmMad { header, message })
    }

    /// Writes the whole 256-byte MAD into `out[..MAD_LEN]`.
    pub fn emit(&self, out: &mut [u8]) -> Result<()> {
        if self.header.attribute_id != self.message.attribute_id() {
            return Err(Error::BadField {
                header: "MAD",
                field: "AttributeID",
                value: self.header.attribute_id.into(),
            });
        }
        if out.len() < MAD_LEN {
            return Err(Error::BufferTooSmall {
                need: MAD_LEN,
                have: out.len(),
            });
        }
        let mut m = Mad::new_unchecked(&mut out[..MAD_LEN]);
        self.header.emit(&mut m);
        self.message.emit(m.data_mut())
    }

    /// The ECE a REQ or REP carries (its VendorID and the header's
    /// AttributeModifier); `None` for the other messages, which carry none.
    pub fn ece(&self) -> Option<Ece> {
        let vendor_id = match &self.message {
            CmMessage::Req(r) => r.vendor_id,
            CmMessage::Rep(r) => r.vendor_id,
            _ => return None,
        };
        Some(Ece {
            vendor_id,
            options: self.header.attribute_modifier,
        })
    }

    /// Puts `ece` into a REQ or REP (VendorID and AttributeModifier). Other
    /// messages carry no ECE: a non-zero value for them, or a vendor ID
    /// wider than 24 bits, is an error and nothing changes.
    pub fn set_ece(&mut self, ece: Ece) -> Result<()> {
        let bad = |value: u64| Error::BadField {
            header: "CM",
            field: "VendorID",
            value,
        };
        fits("CM", "VendorID", ece.vendor_id.into(), 24)?;
        match &mut self.message {
            CmMessage::Req(r) => r.vendor_id = ece.vendor_id,
            CmMessage::Rep(r) => r.vendor_id = ece.vendor_id,
            _ if ece == Ece::default() => return Ok(()),
            _ => return Err(bad(ece.vendor_id.into())),
        }
        self.header.attribute_modifier = ece.options;
        Ok(())
    }

    /// The MAD as a new 256-byte array.
    pub fn to_bytes(&self) -> Result<[u8; MAD_LEN]> {
        let mut b = [0u8; MAD_LEN];
        self.emit(&mut b)?;
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_helpers_count_from_the_top() {
        assert_eq!(bits(0b1010_0110, 0, 5), 0b10100);
        assert_eq!(bits(0b1010_0110, 5, 2), 0b11);
        assert_eq!(bits(0b1010_0111, 7, 1), 1);
        let mut b = 0xFF;
        put_bits(&mut b, 5, 2, 0);
        assert_eq!(b, 0b1111_1001);
    }

    #[test]
    fn rej_reason_codes_are_the_spec_numbers() {
        assert_eq!(RejReason::InvalidServiceId.code(), 8);
        assert_eq!(RejReason::ConsumerDefined.code(), 28);
        assert_eq!(
            RejReason::from_code(35),
            RejReason::VendorOptionNotSupported
        );
        assert_eq!(RejReason::from_code(34), RejReason::Other(34));
        for c in 0..=40 {
            assert_eq!(RejReason::from_code(c).code(), c);
        }
    }
}
