//! The small extension headers: AtomicAckETH (8 bytes), ImmDt (4), IETH (4),
//! DETH (8), XRCETH (4). Each is a fixed set of big-endian fields; they share one file
//! because each is only a few lines.

use crate::bth::{read_u24, write_u24};
use crate::util::{be32, be64, check, put32, put64};
use crate::Result;

/// AtomicAckETH length in bytes.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;
/// ImmDt length in bytes.
pub const IMMDT_LEN: usize = 4;
/// IETH length in bytes.
pub const IETH_LEN: usize = 4;
/// DETH length in bytes.
pub const DETH_LEN: usize = 8;
/// XRCETH length in bytes.
pub const XRCETH_LEN: usize = crate::opcode::XRCETH_LEN;

/// The largest XRC SRQ number (24 bits).
pub const XRC_SRQN_MASK: u32 = 0x00FF_FFFF;

/// A checked view of an XRC Extended Transport Header: 8 reserved bits,
/// then the 24-bit number of the XRC SRQ the request is for. It follows the
/// BTH of every XRC request, before any RETH, AtomicETH, ImmDt or IETH.
#[derive(Debug, Clone, Copy)]
pub struct XrcEth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> XrcEth<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Self {
        XrcEth { buffer }
    }
    /// Wraps a buffer that must hold at least [`XRCETH_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check("XRCETH", buffer.as_ref(), XRCETH_LEN)?;
        Ok(XrcEth { buffer })
    }
    /// The XRC SRQ number (24 bits).
    pub fn srq_num(&self) -> u32 {
        read_u24(&self.buffer.as_ref()[1..4])
    }
    /// The reserved byte (sent as zero, ignored on receipt).
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> XrcEth<T> {
    /// Sets the XRC SRQ number (the low 24 bits of `srqn`) and clears the
    /// reserved byte.
    pub fn set_srq_num(&mut self, srqn: u32) {
        let b = self.buffer.as_mut();
        b[0] = 0;
        write_u24(&mut b[1..4], srqn & XRC_SRQN_MASK);
    }
}

/// Parses the XRC SRQ number of an XRCETH.
pub fn parse_xrceth(b: &[u8]) -> Result<u32> {
    Ok(XrcEth::new_checked(b)?.srq_num())
}
/// Emits an XRCETH (the caller checked that `srqn` fits in 24 bits).
pub fn emit_xrceth(b: &mut [u8], srqn: u32) {
    XrcEth::new_unchecked(&mut b[..XRCETH_LEN]).set_srq_num(srqn)
}

/// Parses the 64-bit original remote data of an AtomicAckETH.
pub fn parse_atomic_ack_eth(b: &[u8]) -> Result<u64> {
    check("AtomicAckETH", b, ATOMIC_ACK_ETH_LEN)?;
    Ok(be64(b))
}
/// Emits an AtomicAckETH.
pub fn emit_atomic_ack_eth(b: &mut [u8], orig: u64) {
    put64(b, orig)
}

/// Parses ImmDt. The value is the big-endian reading of the 4 bytes; drivers
/// hand the same 4 bytes to applications in network order.
pub fn parse_immdt(b: &[u8]) -> Result<u32> {
    check("ImmDt", b, IMMDT_LEN)?;
    Ok(be32(b))
}
/// Emits ImmDt.
pub fn emit_immdt(b: &mut [u8], imm: u32) {
    put32(b, imm)
}

/// Parses the rkey of an IETH.
pub fn parse_ieth(b: &[u8]) -> Result<u32> {
    check("IETH", b, IETH_LEN)?;
    Ok(be32(b))
}
/// Emits an IETH.
pub fn emit_ieth(b: &mut [u8], rkey: u32) {
    put32(b, rkey)
}

/// A parsed Datagram Extended Transport Header (UD).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DethRepr {
    /// Q_Key the receiving UD QP must hold.
    pub qkey: u32,
    /// The sender's QPN, 24 bits.
    pub src_qp: u32,
}

impl DethRepr {
    /// Parses a DETH at the start of `b`.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check("DETH", b, DETH_LEN)?;
        Ok(DethRepr {
            qkey: be32(&b[0..4]),
            src_qp: read_u24(&b[5..8]),
        })
    }
    /// Always [`DETH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        DETH_LEN
    }
    /// Writes Q_Key, a zero reserved byte, and the 24-bit source QP.
    pub fn emit(&self, b: &mut [u8]) {
        put32(&mut b[0..4], self.qkey);
        b[4] = 0;
        write_u24(&mut b[5..8], self.src_qp);
    }
}
