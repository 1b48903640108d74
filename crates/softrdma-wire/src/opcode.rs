//! The one opcode table: which headers follow the BTH, whether a payload
//! follows, where the packet sits in its message, and which transport it
//! belongs to. Both the parser and the emitter consult this table, so the two
//! can never disagree about a packet's shape.

use core::fmt;

/// The transport service an opcode belongs to (bits 7..5 of the opcode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected (base 0x00).
    Rc,
    /// Unreliable Connected (base 0x20).
    Uc,
    /// Unreliable Datagram (base 0x60).
    Ud,
    /// Congestion Notification Packet (0x81).
    Cnp,
    /// Extended Reliable Connected (base 0xA0): RC's opcodes (same low five
    /// bits), with an XRCETH after the BTH of every request.
    Xrc,
}

impl Transport {
    /// Short upper-case name used in logs and `softrdma decode`.
    pub const fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Ud => "UD",
            Transport::Cnp => "CNP",
            Transport::Xrc => "XRC",
        }
    }

    /// The opcode base of this transport.
    pub const fn base(self) -> u8 {
        match self {
            Transport::Rc => 0x00,
            Transport::Uc => 0x20,
            Transport::Ud => 0x60,
            Transport::Cnp => 0x80,
            Transport::Xrc => 0xA0,
        }
    }

    /// True for the reliable transports (RC and XRC): acknowledged requests,
    /// READ and atomics, go-back-N.
    pub const fn is_reliable(self) -> bool {
        matches!(self, Transport::Rc | Transport::Xrc)
    }
}

/// The extension headers that follow the BTH, in wire order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeaderLayout {
    /// BTH only.
    None,
    /// ImmDt.
    Imm,
    /// IETH.
    Ieth,
    /// RETH.
    Reth,
    /// RETH, ImmDt.
    RethImm,
    /// AETH.
    Aeth,
    /// AETH, AtomicAckETH.
    AtomicAck,
    /// AtomicETH.
    Atomic,
    /// DETH.
    Deth,
    /// DETH, ImmDt.
    DethImm,
    /// CNP: 16 reserved bytes.
    Cnp,
    /// XRCETH.
    Xrc,
    /// XRCETH, ImmDt.
    XrcImm,
    /// XRCETH, IETH.
    XrcIeth,
    /// XRCETH, RETH.
    XrcReth,
    /// XRCETH, RETH, ImmDt.
    XrcRethImm,
    /// XRCETH, AtomicETH.
    XrcAtomic,
}

impl HeaderLayout {
    /// Bytes of extension headers between the BTH and the payload.
    pub const fn len(self) -> usize {
        match self {
            HeaderLayout::None => 0,
            HeaderLayout::Imm | HeaderLayout::Ieth | HeaderLayout::Aeth => 4,
            HeaderLayout::Reth => 16,
            HeaderLayout::RethImm => 20,
            HeaderLayout::AtomicAck => 12,
            HeaderLayout::Atomic => 28,
            HeaderLayout::Deth => 8,
            HeaderLayout::DethImm => 12,
            HeaderLayout::Cnp => 16,
            HeaderLayout::Xrc
            | HeaderLayout::XrcImm
            | HeaderLayout::XrcIeth
            | HeaderLayout::XrcReth
            | HeaderLayout::XrcRethImm
            | HeaderLayout::XrcAtomic => XRCETH_LEN + self.without_xrceth().len(),
        }
    }

    /// This layout with an XRCETH in front (an XRC request's layout from
    /// the RC one); `None` for layouts no XRC request has (AETH, DETH, CNP).
    pub const fn with_xrceth(self) -> Option<HeaderLayout> {
        Some(match self {
            HeaderLayout::None => HeaderLayout::Xrc,
            HeaderLayout::Imm => HeaderLayout::XrcImm,
            HeaderLayout::Ieth => HeaderLayout::XrcIeth,
            HeaderLayout::Reth => HeaderLayout::XrcReth,
            HeaderLayout::RethImm => HeaderLayout::XrcRethImm,
            HeaderLayout::Atomic => HeaderLayout::XrcAtomic,
            _ => return None,
        })
    }

    /// This layout without its XRCETH (itself when it has none).
    pub const fn without_xrceth(self) -> HeaderLayout {
        match self {
            HeaderLayout::Xrc => HeaderLayout::None,
            HeaderLayout::XrcImm => HeaderLayout::Imm,
            HeaderLayout::XrcIeth => HeaderLayout::Ieth,
            HeaderLayout::XrcReth => HeaderLayout::Reth,
            HeaderLayout::XrcRethImm => HeaderLayout::RethImm,
            HeaderLayout::XrcAtomic => HeaderLayout::Atomic,
            other => other,
        }
    }

    /// True when the layout starts with an XRCETH.
    pub const fn has_xrceth(self) -> bool {
        matches!(
            self,
            HeaderLayout::Xrc
                | HeaderLayout::XrcImm
                | HeaderLayout::XrcIeth
                | HeaderLayout::XrcReth
                | HeaderLayout::XrcRethImm
                | HeaderLayout::XrcAtomic
        )
    }

    /// True for the BTH-only layout.
    pub const fn is_empty(self) -> bool {
        self.len() == 0
    }
}

/// The operation family of an opcode, independent of transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// SEND (two-sided: consumes a receive WQE).
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response.
    ReadResponse,
    /// ACK / NAK.
    Ack,
    /// Atomic acknowledge carrying the original value.
    AtomicAck,
    /// Atomic compare-and-swap request.
    CompareSwap,
    /// Atomic fetch-and-add request.
    FetchAdd,
    /// Congestion notification packet.
    Cnp,
}

/// Where a packet sits in a multi-packet message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// Neither first nor last.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The whole message in one packet.
    Only,
}

impl Position {
    /// First or only packet of a message.
    pub const fn starts_message(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }
    /// Last or only packet of a message.
    pub const fn ends_message(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// Everything the table knows about one opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The raw opcode byte.
    pub code: u8,
    /// rdma-core style name, e.g. `RDMA_WRITE_FIRST`.
    pub name: &'static str,
    /// RC, UC, UD or CNP.
    pub transport: Transport,
    /// The operation family.
    pub kind: OpKind,
    /// Where the packet sits in its message.
    pub position: Position,
    /// The extension headers between BTH and payload.
    pub layout: HeaderLayout,
    /// A data payload may follow the headers.
    pub has_payload: bool,
    /// Sent by a requester (as opposed to a responder's ACK/response).
    pub is_request: bool,
    /// The packet carries immediate data.
    pub has_imm: bool,
    /// The packet carries an invalidate rkey.
    pub has_inv: bool,
    /// An RC request whose execution is acknowledged (every RC request is).
    pub needs_ack: bool,
}

/// A BTH opcode. Only known opcodes can be built; parse untrusted bytes with
/// [`Opcode::from_u8`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Opcode(u8);

macro_rules! opcodes {
    ($( $konst:ident = $code:literal, $name:literal, $tr:ident, $kind:ident, $pos:ident, $layout:ident, $payload:literal, $req:literal; )*) => {
        impl Opcode {
            $(
                #[doc = concat!("`", $name, "` (", stringify!($code), ")")]
                pub const $konst: Opcode = Opcode($code);
            )*
        }

        /// Every opcode softrdma understands, in numeric order.
        pub const OPCODE_TABLE: &[OpcodeInfo] = &[
            $(
                OpcodeInfo {
                    code: $code,
                    name: $name,
                    transport: Transport::$tr,
                    kind: OpKind::$kind,
                    position: Position::$pos,
                    layout: HeaderLayout::$layout,
                    has_payload: $payload,
                    is_request: $req,
                    has_imm: matches!(HeaderLayout::$layout, HeaderLayout::Imm | HeaderLayout::RethImm | HeaderLayout::DethImm | HeaderLayout::XrcImm | HeaderLayout::XrcRethImm),
                    has_inv: matches!(HeaderLayout::$layout, HeaderLayout::Ieth | HeaderLayout::XrcIeth),
                    needs_ack: $req && Transport::$tr.is_reliable(),
                },
            )*
        ];
    };
}

opcodes! {
    RC_SEND_FIRST = 0x00, "RC_SEND_FIRST", Rc, Send, First, None, true, true;
    RC_SEND_MIDDLE = 0x01, "RC_SEND_MIDDLE", Rc, Send, Middle, None, true, true;
    RC_SEND_LAST = 0x02, "RC_SEND_LAST", Rc, Send, Last, None, true, true;
    RC_SEND_LAST_IMM = 0x03, "RC_SEND_LAST_WITH_IMMEDIATE", Rc, Send, Last, Imm, true, true;
    RC_SEND_ONLY = 0x04, "RC_SEND_ONLY", Rc, Send, Only, None, true, true;
    RC_SEND_ONLY_IMM = 0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", Rc, Send, Only, Imm, true, true;
    RC_WRITE_FIRST = 0x06, "RC_RDMA_WRITE_FIRST", Rc, Write, First, Reth, true, true;
    RC_WRITE_MIDDLE = 0x07, "RC_RDMA_WRITE_MIDDLE", Rc, Write, Middle, None, true, true;
    RC_WRITE_LAST = 0x08, "RC_RDMA_WRITE_LAST", Rc, Write, Last, None, true, true;
    RC_WRITE_LAST_IMM = 0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Rc, Write, Last, Imm, true, true;
    RC_WRITE_ONLY = 0x0A, "RC_RDMA_WRITE_ONLY", Rc, Write, Only, Reth, true, true;
    RC_WRITE_ONLY_IMM = 0x0B, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Rc, Write, Only, RethImm, true, true;
    RC_READ_REQUEST = 0x0C, "RC_RDMA_READ_REQUEST", Rc, ReadRequest, Only, Reth, false, true;
    RC_READ_RESPONSE_FIRST = 0x0D, "RC_RDMA_READ_RESPONSE_FIRST", Rc, ReadResponse, First, Aeth, true, false;
    RC_READ_RESPONSE_MIDDLE = 0x0E, "RC_RDMA_READ_RESPONSE_MIDDLE", Rc, ReadResponse, Middle, None, true, false;
    RC_READ_RESPONSE_LAST = 0x0F, "RC_RDMA_READ_RESPONSE_LAST", Rc, ReadResponse, Last, Aeth, true, false;
    RC_READ_RESPONSE_ONLY = 0x10, "RC_RDMA_READ_RESPONSE_ONLY", Rc, ReadResponse, Only, Aeth, true, false;
    RC_ACK = 0x11, "RC_ACKNOWLEDGE", Rc, Ack, Only, Aeth, false, false;
    RC_ATOMIC_ACK = 0x12, "RC_ATOMIC_ACKNOWLEDGE", Rc, AtomicAck, Only, AtomicAck, false, false;
    RC_COMPARE_SWAP = 0x13, "RC_COMPARE_SWAP", Rc, CompareSwap, Only, Atomic, false, true;
    RC_FETCH_ADD = 0x14, "RC_FETCH_ADD", Rc, FetchAdd, Only, Atomic, false, true;
    RC_SEND_LAST_INV = 0x16, "RC_SEND_LAST_WITH_INVALIDATE", Rc, Send, Last, Ieth, true, true;
    RC_SEND_ONLY_INV = 0x17, "RC_SEND_ONLY_WITH_INVALIDATE", Rc, Send, Only, Ieth, true, true;
    UC_SEND_FIRST = 0x20, "UC_SEND_FIRST", Uc, Send, First, None, true, true;
    UC_SEND_MIDDLE = 0x21, "UC_SEND_MIDDLE", Uc, Send, Middle, None, true, true;
    UC_SEND_LAST = 0x22, "UC_SEND_LAST", Uc, Send, Last, None, true, true;
    UC_SEND_LAST_IMM = 0x23, "UC_SEND_LAST_WITH_IMMEDIATE", Uc, Send, Last, Imm, true, true;
    UC_SEND_ONLY = 0x24, "UC_SEND_ONLY", Uc, Send, Only, None, true, true;
    UC_SEND_ONLY_IMM = 0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", Uc, Send, Only, Imm, true, true;
    UC_WRITE_FIRST = 0x26, "UC_RDMA_WRITE_FIRST", Uc, Write, First, Reth, true, true;
    UC_WRITE_MIDDLE = 0x27, "UC_RDMA_WRITE_MIDDLE", Uc, Write, Middle, None, true, true;
    UC_WRITE_LAST = 0x28, "UC_RDMA_WRITE_LAST", Uc, Write, Last, None, true, true;
    UC_WRITE_LAST_IMM = 0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Uc, Write, Last, Imm, true, true;
    UC_WRITE_ONLY = 0x2A, "UC_RDMA_WRITE_ONLY", Uc, Write, Only, Reth, true, true;
    UC_WRITE_ONLY_IMM = 0x2B, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Uc, Write, Only, RethImm, true, true;
    UD_SEND_ONLY = 0x64, "UD_SEND_ONLY", Ud, Send, Only, Deth, true, true;
    UD_SEND_ONLY_IMM = 0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", Ud, Send, Only, DethImm, true, true;
    CNP = 0x81, "CNP", Cnp, Cnp, Only, Cnp, false, false;
    XRC_SEND_FIRST = 0xA0, "XRC_SEND_FIRST", Xrc, Send, First, Xrc, true, true;
    XRC_SEND_MIDDLE = 0xA1, "XRC_SEND_MIDDLE", Xrc, Send, Middle, Xrc, true, true;
    XRC_SEND_LAST = 0xA2, "XRC_SEND_LAST", Xrc, Send, Last, Xrc, true, true;
    XRC_SEND_LAST_IMM = 0xA3, "XRC_SEND_LAST_WITH_IMMEDIATE", Xrc, Send, Last, XrcImm, true, true;
    XRC_SEND_ONLY = 0xA4, "XRC_SEND_ONLY", Xrc, Send, Only, Xrc, true, true;
    XRC_SEND_ONLY_IMM = 0xA5, "XRC_SEND_ONLY_WITH_IMMEDIATE", Xrc, Send, Only, XrcImm, true, true;
    XRC_WRITE_FIRST = 0xA6, "XRC_RDMA_WRITE_FIRST", Xrc, Write, First, XrcReth, true, true;
    XRC_WRITE_MIDDLE = 0xA7, "XRC_RDMA_WRITE_MIDDLE", Xrc, Write, Middle, Xrc, true, true;
    XRC_WRITE_LAST = 0xA8, "XRC_RDMA_WRITE_LAST", Xrc, Write, Last, Xrc, true, true;
    XRC_WRITE_LAST_IMM = 0xA9, "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Xrc, Write, Last, XrcImm, true, true;
    XRC_WRITE_ONLY = 0xAA, "XRC_RDMA_WRITE_ONLY", Xrc, Write, Only, XrcReth, true, true;
    XRC_WRITE_ONLY_IMM = 0xAB, "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Xrc, Write, Only, XrcRethImm, true, true;
    XRC_READ_REQUEST = 0xAC, "XRC_RDMA_READ_REQUEST", Xrc, ReadRequest, Only, XrcReth, false, true;
    XRC_READ_RESPONSE_FIRST = 0xAD, "XRC_RDMA_READ_RESPONSE_FIRST", Xrc, ReadResponse, First, Aeth, true, false;
    XRC_READ_RESPONSE_MIDDLE = 0xAE, "XRC_RDMA_READ_RESPONSE_MIDDLE", Xrc, ReadResponse, Middle, None, true, false;
    XRC_READ_RESPONSE_LAST = 0xAF, "XRC_RDMA_READ_RESPONSE_LAST", Xrc, ReadResponse, Last, Aeth, true, false;
    XRC_READ_RESPONSE_ONLY = 0xB0, "XRC_RDMA_READ_RESPONSE_ONLY", Xrc, ReadResponse, Only, Aeth, true, false;
    XRC_ACK = 0xB1, "XRC_ACKNOWLEDGE", Xrc, Ack, Only, Aeth, false, false;
    XRC_ATOMIC_ACK = 0xB2, "XRC_ATOMIC_ACKNOWLEDGE", Xrc, AtomicAck, Only, AtomicAck, false, false;
    XRC_COMPARE_SWAP = 0xB3, "XRC_COMPARE_SWAP", Xrc, CompareSwap, Only, XrcAtomic, false, true;
    XRC_FETCH_ADD = 0xB4, "XRC_FETCH_ADD", Xrc, FetchAdd, Only, XrcAtomic, false, true;
    XRC_SEND_LAST_INV = 0xB6, "XRC_SEND_LAST_WITH_INVALIDATE", Xrc, Send, Last, XrcIeth, true, true;
    XRC_SEND_ONLY_INV = 0xB7, "XRC_SEND_ONLY_WITH_INVALIDATE", Xrc, Send, Only, XrcIeth, true, true;
}

impl Opcode {
    /// Looks up a raw opcode byte; `None` for opcodes softrdma does not know.
    pub fn from_u8(code: u8) -> Option<Opcode> {
        info_of(code).map(|_| Opcode(code))
    }

    /// The raw byte.
    pub const fn value(self) -> u8 {
        self.0
    }

    /// The table entry (always present: an `Opcode` is only built from the table).
    pub fn info(self) -> &'static OpcodeInfo {
        // Every constructor validates against the table, and the table is static.
        info_of(self.0).unwrap_or(&OPCODE_TABLE[0])
    }

    /// rdma-core style name.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Finds the opcode for a transport, kind, position and layout, e.g. the
    /// UC opcode of a WRITE_LAST with immediate.
    pub fn find(
        transport: Transport,
        kind: OpKind,
        position: Position,
        layout: HeaderLayout,
    ) -> Option<Opcode> {
        match FIND_INDEX[find_key(transport, kind, position, layout)] {
            0 => None,
            i => Some(Opcode(OPCODE_TABLE[usize::from(i) - 1].code)),
        }
    }
}

const N_TRANSPORT: usize = 5;
const N_KIND: usize = 9;
const N_POSITION: usize = 4;
const N_LAYOUT: usize = 17;
// The counts above are those of the enums (each one's last variant).
const _: () = assert!(Transport::Xrc as usize + 1 == N_TRANSPORT);
const _: () = assert!(OpKind::Cnp as usize + 1 == N_KIND);
const _: () = assert!(Position::Only as usize + 1 == N_POSITION);
const _: () = assert!(HeaderLayout::XrcAtomic as usize + 1 == N_LAYOUT);

/// XRCETH length in bytes (8 reserved bits, the 24-bit XRC SRQ number).
pub const XRCETH_LEN: usize = 4;

const fn find_key(t: Transport, k: OpKind, p: Position, l: HeaderLayout) -> usize {
    ((t as usize * N_KIND + k as usize) * N_POSITION + p as usize) * N_LAYOUT + l as usize
}

/// Index (plus one) in [`OPCODE_TABLE`] of the first opcode with each
/// (transport, kind, position, layout); 0 = none. Every SEND and WRITE
/// packet built looks its opcode up this way.
static FIND_INDEX: [u8; N_TRANSPORT * N_KIND * N_POSITION * N_LAYOUT] = {
    let mut idx = [0u8; N_TRANSPORT * N_KIND * N_POSITION * N_LAYOUT];
    let mut i = 0;
    while i < OPCODE_TABLE.len() {
        let e = &OPCODE_TABLE[i];
        let k = find_key(e.transport, e.kind, e.position, e.layout);
        if idx[k] == 0 {
            idx[k] = (i + 1) as u8;
        }
        i += 1;
    }
    idx
};

/// Index (plus one) of each opcode byte in [`OPCODE_TABLE`]; 0 = unknown.
/// Every packet in and out looks its opcode up several times, so this is a
/// direct index rather than a search.
static INFO_INDEX: [u8; 256] = {
    let mut idx = [0u8; 256];
    let mut i = 0;
    while i < OPCODE_TABLE.len() {
        idx[OPCODE_TABLE[i].code as usize] = (i + 1) as u8;
        i += 1;
    }
    idx
};

fn info_of(code: u8) -> Option<&'static OpcodeInfo> {
    match INFO_INDEX[usize::from(code)] {
        0 => None,
        i => OPCODE_TABLE.get(usize::from(i) - 1),
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(0x{:02x})", self.name(), self.0)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn find_agrees_with_a_search_of_the_table() {
        use super::*;
        let ts = [
            Transport::Rc,
            Transport::Uc,
            Transport::Ud,
            Transport::Cnp,
            Transport::Xrc,
        ];
        let ks = [
            OpKind::Send,
            OpKind::Write,
            OpKind::ReadRequest,
            OpKind::ReadResponse,
            OpKind::Ack,
            OpKind::AtomicAck,
            OpKind::CompareSwap,
            OpKind::FetchAdd,
            OpKind::Cnp,
        ];
        let ps = [
            Position::First,
            Position::Middle,
            Position::Last,
            Position::Only,
        ];
        let ls = [
            HeaderLayout::None,
            HeaderLayout::Imm,
            HeaderLayout::Ieth,
            HeaderLayout::Reth,
            HeaderLayout::RethImm,
            HeaderLayout::Aeth,
            HeaderLayout::AtomicAck,
            HeaderLayout::Atomic,
            HeaderLayout::Deth,
            HeaderLayout::DethImm,
            HeaderLayout::Cnp,
            HeaderLayout::Xrc,
            HeaderLayout::XrcImm,
            HeaderLayout::XrcIeth,
            HeaderLayout::XrcReth,
            HeaderLayout::XrcRethImm,
            HeaderLayout::XrcAtomic,
        ];
        for t in ts {
            for k in ks {
                for p in ps {
                    for l in ls {
                        let want = OPCODE_TABLE
                            .iter()
                            .find(|i| {
                                i.transport == t && i.kind == k && i.position == p && i.layout == l
                            })
                            .map(|i| Opcode(i.code));
                        assert_eq!(Opcode::find(t, k, p, l), want, "{t:?} {k:?} {p:?} {l:?}");
                    }
                }
            }
        }
    }

    use super::*;

    #[test]
    fn table_sorted_and_consistent() {
        for pair in OPCODE_TABLE.windows(2) {
            assert!(
                pair[0].code < pair[1].code,
                "table must be sorted for binary search"
            );
        }
        for info in OPCODE_TABLE {
            let op = Opcode::from_u8(info.code).unwrap();
            assert_eq!(op.info(), info);
            assert_eq!(info.code & 0xE0, info.transport.base() & 0xE0);
        }
    }

    #[test]
    fn unknown_opcodes_rejected() {
        for code in [
            0x15u8, 0x18, 0x1f, 0x2c, 0x40, 0x41, 0x63, 0x66, 0x80, 0x82, 0xb5, 0xb8, 0xff,
        ] {
            assert!(Opcode::from_u8(code).is_none(), "0x{code:02x}");
        }
    }

    #[test]
    fn find_round_trips() {
        for info in OPCODE_TABLE {
            let op = Opcode::find(info.transport, info.kind, info.position, info.layout).unwrap();
            assert_eq!(op.value(), info.code);
        }
    }

    #[test]
    fn xrc_is_rc_with_an_xrceth_on_requests() {
        for x in OPCODE_TABLE
            .iter()
            .filter(|i| i.transport == Transport::Xrc)
        {
            let rc = Opcode::from_u8(x.code & 0x1F).unwrap().info();
            assert_eq!(rc.transport, Transport::Rc);
            assert_eq!((x.kind, x.position), (rc.kind, rc.position), "{}", x.name);
            assert_eq!(x.name.strip_prefix("XRC_"), rc.name.strip_prefix("RC_"));
            assert_eq!(
                (
                    x.has_payload,
                    x.is_request,
                    x.has_imm,
                    x.has_inv,
                    x.needs_ack
                ),
                (
                    rc.has_payload,
                    rc.is_request,
                    rc.has_imm,
                    rc.has_inv,
                    rc.needs_ack
                )
            );
            // Requests carry the XRCETH, responses do not.
            assert_eq!(x.layout.has_xrceth(), x.is_request, "{}", x.name);
            assert_eq!(x.layout.without_xrceth(), rc.layout, "{}", x.name);
            assert_eq!(
                x.layout.len(),
                rc.layout.len() + 4 * usize::from(x.is_request)
            );
        }
        // Every RC opcode has its XRC twin.
        let rc = OPCODE_TABLE.iter().filter(|i| i.transport == Transport::Rc);
        let xrc = OPCODE_TABLE
            .iter()
            .filter(|i| i.transport == Transport::Xrc);
        assert_eq!(rc.count(), xrc.count());
    }

    #[test]
    fn uc_has_no_reads_or_acks() {
        assert!(OPCODE_TABLE
            .iter()
            .filter(|i| i.transport == Transport::Uc)
            .all(|i| matches!(i.kind, OpKind::Send | OpKind::Write)));
    }
}
