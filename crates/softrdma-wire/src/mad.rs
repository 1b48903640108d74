//! Management Datagrams (IBTA vol. 1, 13.4): the 24-byte common MAD header,
//! and how a General Services MAD travels over RoCEv2.
//!
//! Layout of the common header: BaseVersion / MgmtClass / ClassVersion /
//! R Method / Status (16) / ClassSpecific (16) / TransactionID (64) /
//! AttributeID (16) / reserved (16) / AttributeModifier (32). The class's own
//! data (for the CM, one message) fills the remaining 232 bytes.
//!
//! A MAD on QP1 (the GSI) is exactly [`MAD_LEN`] bytes of UD SEND payload,
//! carried with a DETH whose Q_Key is [`GSI_QKEY`]; [`gmp_packet`] builds
//! such a packet and [`gmp_payload`] finds the MAD in a parsed one.

use crate::bth::{self, BthRepr};
use crate::util::{be16, be32, be64, check, put16, put32, put64};
use crate::{DethRepr, Error, Headers, Opcode, PacketRepr, Psn, Result};

mod field {
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: usize = 4;
    pub const CLASS_SPECIFIC: usize = 6;
    pub const TID: usize = 8;
    pub const ATTR_ID: usize = 16;
    pub const RESERVED: usize = 18;
    pub const ATTR_MOD: usize = 20;
}

/// Length of the common MAD header.
pub const HEADER_LEN: usize = 24;
/// Every MAD sent to or from a GSI or SMI QP is exactly this long.
pub const MAD_LEN: usize = 256;
/// Bytes after the common header: the class data.
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;
/// BaseVersion of every IBA MAD.
pub const BASE_VERSION: u8 = 1;
/// MgmtClass of the Communication Management class.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// ClassVersion of the CM class (IBA 1.2 and later).
pub const CM_CLASS_VERSION: u8 = 2;
/// The GSI's queue pair: every General Services MAD is sent to QP1.
pub const GSI_QPN: u32 = 1;
/// The well-known Q_Key of QP1.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// MAD methods (the low seven bits of the Method byte) and the response bit.
pub mod method {
    /// Read an attribute.
    pub const GET: u8 = 0x01;
    /// Write an attribute.
    pub const SET: u8 = 0x02;
    /// A datagram that needs no response (every CM message).
    pub const SEND: u8 = 0x03;
    /// An unsolicited notice.
    pub const TRAP: u8 = 0x05;
    /// Forward a notice to a subscriber.
    pub const REPORT: u8 = 0x06;
    /// Silence a trap.
    pub const TRAP_REPRESS: u8 = 0x07;
    /// Set in the Method byte of every response.
    pub const RESPONSE: u8 = 0x80;
    /// The response to GET and SET.
    pub const GET_RESP: u8 = RESPONSE | GET;
    /// The response to REPORT.
    pub const REPORT_RESP: u8 = RESPONSE | REPORT;
}

/// A read/write view of a MAD (header and whatever class data follows).
#[derive(Debug, Clone)]
pub struct Mad<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Mad<T> {
    /// Wraps a buffer without checking its length; accessors panic if it is short.
    pub const fn new_unchecked(buffer: T) -> Self {
        Mad { buffer }
    }
    /// Wraps a buffer after checking that it holds the whole common header.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check("MAD", buffer.as_ref(), HEADER_LEN)?;
        Ok(Mad { buffer })
    }
    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// BaseVersion: 1 for every IBA MAD.
    pub fn base_version(&self) -> u8 {
        self.b()[field::BASE_VERSION]
    }
    /// MgmtClass: which class interprets the data (0x07 for the CM).
    pub fn mgmt_class(&self) -> u8 {
        self.b()[field::MGMT_CLASS]
    }
    /// ClassVersion.
    pub fn class_version(&self) -> u8 {
        self.b()[field::CLASS_VERSION]
    }
    /// The Method byte, response bit included.
    pub fn method(&self) -> u8 {
        self.b()[field::METHOD]
    }
    /// Status (0 in requests and in successful responses).
    pub fn status(&self) -> u16 {
        be16(&self.b()[field::STATUS..])
    }
    /// ClassSpecific.
    pub fn class_specific(&self) -> u16 {
        be16(&self.b()[field::CLASS_SPECIFIC..])
    }
    /// TransactionID: matches a response to its request.
    pub fn transaction_id(&self) -> u64 {
        be64(&self.b()[field::TID..])
    }
    /// AttributeID: which attribute (for the CM, which message) follows.
    pub fn attribute_id(&self) -> u16 {
        be16(&self.b()[field::ATTR_ID..])
    }
    /// AttributeModifier.
    pub fn attribute_modifier(&self) -> u32 {
        be32(&self.b()[field::ATTR_MOD..])
    }
    /// The class data after the header (all of it, however long the buffer).
    pub fn data(&self) -> &[u8] {
        &self.b()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Mad<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Sets BaseVersion.
    pub fn set_base_version(&mut self, v: u8) {
        self.bm()[field::BASE_VERSION] = v;
    }
    /// Sets MgmtClass.
    pub fn set_mgmt_class(&mut self, v: u8) {
        self.bm()[field::MGMT_CLASS] = v;
    }
    /// Sets ClassVersion.
    pub fn set_class_version(&mut self, v: u8) {
        self.bm()[field::CLASS_VERSION] = v;
    }
    /// Sets the Method byte.
    pub fn set_method(&mut self, v: u8) {
        self.bm()[field::METHOD] = v;
    }
    /// Sets Status.
    pub fn set_status(&mut self, v: u16) {
        put16(&mut self.bm()[field::STATUS..], v);
    }
    /// Sets ClassSpecific.
    pub fn set_class_specific(&mut self, v: u16) {
        put16(&mut self.bm()[field::CLASS_SPECIFIC..], v);
    }
    /// Sets TransactionID.
    pub fn set_transaction_id(&mut self, v: u64) {
        put64(&mut self.bm()[field::TID..], v);
    }
    /// Sets AttributeID; the reserved 16 bits after it are written as zero.
    pub fn set_attribute_id(&mut self, v: u16) {
        put16(&mut self.bm()[field::ATTR_ID..], v);
        put16(&mut self.bm()[field::RESERVED..], 0);
    }
    /// Sets AttributeModifier.
    pub fn set_attribute_modifier(&mut self, v: u32) {
        put32(&mut self.bm()[field::ATTR_MOD..], v);
    }
    /// The class data after the header, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.bm()[HEADER_LEN..]
    }
}

/// A parsed common MAD header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadRepr {
    /// MgmtClass.
    pub mgmt_class: u8,
    /// ClassVersion.
    pub class_version: u8,
    /// The Method byte, response bit included (see [`method`]).
    pub method: u8,
    /// Status.
    pub status: u16,
    /// ClassSpecific.
    pub class_specific: u16,
    /// TransactionID.
    pub transaction_id: u64,
    /// AttributeID.
    pub attribute_id: u16,
    /// AttributeModifier.
    pub attribute_modifier: u32,
}

impl MadRepr {
    /// A CM-class header (class version 2, status 0) for `attribute_id`.
    pub const fn cm(method: u8, transaction_id: u64, attribute_id: u16) -> Self {
        MadRepr {
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            attribute_modifier: 0,
        }
    }

    /// True when the Method byte has the response bit set.
    pub const fn is_response(&self) -> bool {
        self.method & method::RESPONSE != 0
    }

    /// Parses the header. BaseVersion must be 1; the class fields are left
    /// to the class (see [`crate::cm::CmMad`]).
    pub fn parse<T: AsRef<[u8]>>(m: &Mad<T>) -> Result<Self> {
        check("MAD", m.b(), HEADER_LEN)?;
        if m.base_version() != BASE_VERSION {
            return Err(Error::BadField {
                header: "MAD",
                field: "BaseVersion",
                value: m.base_version().into(),
            });
        }
        Ok(MadRepr {
            mgmt_class: m.mgmt_class(),
            class_version: m.class_version(),
            method: m.method(),
            status: m.status(),
            class_specific: m.class_specific(),
            transaction_id: m.transaction_id(),
            attribute_id: m.attribute_id(),
            attribute_modifier: m.attribute_modifier(),
        })
    }

    /// Always [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header (BaseVersion 1, reserved bits zero); the view must
    /// hold [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, m: &mut Mad<T>) {
        m.set_base_version(BASE_VERSION);
        m.set_mgmt_class(self.mgmt_class);
        m.set_class_version(self.class_version);
        m.set_method(self.method);
        m.set_status(self.status);
        m.set_class_specific(self.class_specific);
        m.set_transaction_id(self.transaction_id);
        m.set_attribute_id(self.attribute_id);
        m.set_attribute_modifier(self.attribute_modifier);
    }
}

/// The UD SEND_ONLY packet that carries `mad` to the GSI (QP1) of the peer:
/// P_Key 0xFFFF (the default partition), DETH with [`GSI_QKEY`] and the
/// sender's QPN (1 when the sender is itself the GSI).
pub fn gmp_packet(src_qp: u32, psn: Psn, mad: &[u8; MAD_LEN]) -> PacketRepr<'_> {
    PacketRepr {
        bth: BthRepr::new(Opcode::UD_SEND_ONLY, GSI_QPN, psn),
        headers: Headers::Deth(DethRepr {
            qkey: GSI_QKEY,
            src_qp: src_qp & bth::QPN_MASK,
        }),
        payload: mad,
    }
}

/// The MAD in a packet sent to the GSI. Checks what QP1 requires: a UD
/// SEND_ONLY to QP1, the GSI Q_Key, and exactly [`MAD_LEN`] bytes of payload.
pub fn gmp_payload<'a>(p: &PacketRepr<'a>) -> Result<&'a [u8; MAD_LEN]> {
    let bad = |field, value: u64| Error::BadField {
        header: "GMP",
        field,
        value,
    };
    if p.bth.opcode != Opcode::UD_SEND_ONLY {
        return Err(bad("opcode", p.bth.opcode.value().into()));
    }
    if p.bth.dest_qp != GSI_QPN {
        return Err(bad("DestQP", p.bth.dest_qp.into()));
    }
    let deth = p.headers.deth().ok_or(bad("DETH", 0))?;
    if deth.qkey != GSI_QKEY {
        return Err(bad("Q_Key", deth.qkey.into()));
    }
    p.payload.try_into().map_err(|_| Error::BadLength {
        header: "GMP",
        field: "payload",
        value: p.payload.len(),
        have: MAD_LEN,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_fields_sit_at_their_offsets() {
        let mut b = [0u8; HEADER_LEN];
        let r = MadRepr {
            attribute_modifier: 0x0A0B_0C0D,
            status: 0x1234,
            class_specific: 0x5678,
            ..MadRepr::cm(method::GET_RESP, 0x0102_0304_0506_0708, 0x0010)
        };
        r.emit(&mut Mad::new_unchecked(&mut b[..]));
        assert_eq!(
            b,
            [
                1, 0x07, 2, 0x81, 0x12, 0x34, 0x56, 0x78, 1, 2, 3, 4, 5, 6, 7, 8, 0x00, 0x10, 0, 0,
                0x0A, 0x0B, 0x0C, 0x0D
            ]
        );
        let back = MadRepr::parse(&Mad::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(back, r);
        assert!(back.is_response());
    }

    #[test]
    fn base_version_is_checked() {
        let mut b = [0u8; HEADER_LEN];
        b[0] = 2;
        assert_eq!(
            MadRepr::parse(&Mad::new_checked(&b[..]).unwrap()).unwrap_err(),
            Error::BadField {
                header: "MAD",
                field: "BaseVersion",
                value: 2
            }
        );
    }
}
