//! Base Transport Header (12 bytes), present in every RoCEv2 packet.
//!
//! Layout: opcode / SE M PadCnt TVer / P_Key / F B resv6 / DestQP /
//! AckReq resv7 / PSN. Byte 4 (F, B, resv6) is masked to 0xFF in the ICRC.

use crate::{Error, Opcode, Psn, Result};

mod field {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: core::ops::Range<usize> = 2..4;
    pub const FB: usize = 4;
    pub const DESTQP: core::ops::Range<usize> = 5..8;
    pub const ACKREQ: usize = 8;
    pub const PSN: core::ops::Range<usize> = 9..12;
}

/// BTH length in bytes.
pub const HEADER_LEN: usize = 12;
/// The default partition key.
pub const DEFAULT_PKEY: u16 = 0xFFFF;
/// QPNs are 24 bits wide.
pub const QPN_MASK: u32 = 0x00FF_FFFF;

/// A read/write view of a BTH at the start of a buffer.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps a buffer after checking that it holds a whole BTH.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Fails unless the buffer holds a whole BTH.
    pub fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        if have < HEADER_LEN {
            return Err(Error::Truncated {
                header: "BTH",
                need: HEADER_LEN,
                have,
            });
        }
        Ok(())
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The raw opcode byte (validate with [`Opcode::from_u8`]).
    pub fn opcode_raw(&self) -> u8 {
        self.b()[field::OPCODE]
    }
    /// SE: the receiver should raise a solicited completion event.
    pub fn solicited(&self) -> bool {
        self.b()[field::FLAGS] & 0x80 != 0
    }
    /// M: path migration request state.
    pub fn mig_req(&self) -> bool {
        self.b()[field::FLAGS] & 0x40 != 0
    }
    /// PadCnt: pad bytes (0..=3) between the payload and the ICRC.
    pub fn pad_count(&self) -> u8 {
        (self.b()[field::FLAGS] >> 4) & 0x3
    }
    /// TVer: transport header version, 0 for every IBA packet.
    pub fn tver(&self) -> u8 {
        self.b()[field::FLAGS] & 0x0F
    }
    /// P_Key: the partition key.
    pub fn pkey(&self) -> u16 {
        u16::from_be_bytes([self.b()[field::PKEY.start], self.b()[field::PKEY.start + 1]])
    }
    /// F: forward explicit congestion notification (not covered by the ICRC).
    pub fn fecn(&self) -> bool {
        self.b()[field::FB] & 0x80 != 0
    }
    /// B: backward explicit congestion notification (not covered by the ICRC).
    pub fn becn(&self) -> bool {
        self.b()[field::FB] & 0x40 != 0
    }
    /// The 24-bit destination queue pair number.
    pub fn dest_qp(&self) -> u32 {
        read_u24(&self.b()[field::DESTQP])
    }
    /// A: the requester asks the responder to acknowledge this packet.
    pub fn ack_req(&self) -> bool {
        self.b()[field::ACKREQ] & 0x80 != 0
    }
    /// The 24-bit packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(read_u24(&self.b()[field::PSN]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Sets the opcode byte.
    pub fn set_opcode_raw(&mut self, v: u8) {
        self.bm()[field::OPCODE] = v;
    }
    /// Sets SE, M, PadCnt and TVer together.
    pub fn set_flags(&mut self, se: bool, mig_req: bool, pad: u8, tver: u8) {
        self.bm()[field::FLAGS] =
            (u8::from(se) << 7) | (u8::from(mig_req) << 6) | ((pad & 3) << 4) | (tver & 0xF);
    }
    /// Sets the partition key.
    pub fn set_pkey(&mut self, v: u16) {
        self.bm()[field::PKEY].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets F and B; the six reserved bits are written as zero.
    pub fn set_fecn_becn(&mut self, fecn: bool, becn: bool) {
        self.bm()[field::FB] = (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }
    /// Sets the destination QPN (only the low 24 bits are written).
    pub fn set_dest_qp(&mut self, v: u32) {
        write_u24(&mut self.bm()[field::DESTQP], v);
    }
    /// Sets AckReq; the seven reserved bits are written as zero.
    pub fn set_ack_req(&mut self, v: bool) {
        self.bm()[field::ACKREQ] = u8::from(v) << 7;
    }
    /// Sets the PSN.
    pub fn set_psn(&mut self, v: Psn) {
        write_u24(&mut self.bm()[field::PSN], v.value());
    }
}

pub(crate) fn read_u24(b: &[u8]) -> u32 {
    (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2])
}

pub(crate) fn write_u24(b: &mut [u8], v: u32) {
    b[0] = (v >> 16) as u8;
    b[1] = (v >> 8) as u8;
    b[2] = v as u8;
}

/// A parsed BTH. `pad_count` is derived from the payload when a whole packet
/// is emitted, so it is reported here but ignored by [`BthRepr::emit`]'s callers
/// in `packet`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BthRepr {
    /// The opcode; its table entry fixes the headers that follow.
    pub opcode: Opcode,
    /// SE: solicited event.
    pub solicited: bool,
    /// M: migration request state.
    pub mig_req: bool,
    /// PadCnt (0..=3); derived from the payload length when a packet is emitted.
    pub pad_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// F: forward ECN (masked out of the ICRC).
    pub fecn: bool,
    /// B: backward ECN (masked out of the ICRC).
    pub becn: bool,
    /// Destination QPN, 24 bits.
    pub dest_qp: u32,
    /// A: acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// A BTH with defaults: default P_Key, no flags, pad 0.
    pub fn new(opcode: Opcode, dest_qp: u32, psn: Psn) -> Self {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: dest_qp & QPN_MASK,
            ack_req: false,
            psn,
        }
    }

    /// Parses a checked view. Rejects unknown opcodes and TVer != 0.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self> {
        p.check_len()?;
        let opcode = Opcode::from_u8(p.opcode_raw()).ok_or(Error::UnknownOpcode(p.opcode_raw()))?;
        if p.tver() != 0 {
            return Err(Error::BadTransportVersion(p.tver()));
        }
        Ok(BthRepr {
            opcode,
            solicited: p.solicited(),
            mig_req: p.mig_req(),
            pad_count: p.pad_count(),
            pkey: p.pkey(),
            fecn: p.fecn(),
            becn: p.becn(),
            dest_qp: p.dest_qp(),
            ack_req: p.ack_req(),
            psn: p.psn(),
        })
    }

    /// Always [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header; the buffer must hold [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_opcode_raw(self.opcode.value());
        p.set_flags(self.solicited, self.mig_req, self.pad_count, 0);
        p.set_pkey(self.pkey);
        p.set_fecn_becn(self.fecn, self.becn);
        p.set_dest_qp(self.dest_qp);
        p.set_ack_req(self.ack_req);
        p.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // BTH of the UC SEND Only (pad 2) frame in shared/captures.
    const UC_SEND_ONLY_PAD2: [u8; 12] = [
        0x24, 0x20, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00, 0x00, 0x05,
    ];

    #[test]
    fn parse_real_bth() {
        let p = Packet::new_checked(&UC_SEND_ONLY_PAD2[..]).unwrap();
        let r = BthRepr::parse(&p).unwrap();
        assert_eq!(r.opcode, Opcode::UC_SEND_ONLY);
        assert_eq!(r.pad_count, 2);
        assert_eq!(r.pkey, 0xffff);
        assert_eq!(r.dest_qp, 0x11);
        assert_eq!(r.psn, Psn::new(5));
        assert!(!r.ack_req && !r.solicited);
        let mut out = [0u8; 12];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, UC_SEND_ONLY_PAD2);
    }

    #[test]
    fn truncated_is_an_error() {
        assert_eq!(
            Packet::new_checked(&UC_SEND_ONLY_PAD2[..11]).unwrap_err(),
            Error::Truncated {
                header: "BTH",
                need: 12,
                have: 11
            }
        );
    }

    #[test]
    fn unknown_opcode_named() {
        let mut b = UC_SEND_ONLY_PAD2;
        b[0] = 0x40;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(BthRepr::parse(&p).unwrap_err(), Error::UnknownOpcode(0x40));
    }
}
