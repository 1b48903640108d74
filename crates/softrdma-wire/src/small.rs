//! The small extension headers: AtomicAckETH (8 bytes), ImmDt (4), IETH (4),
//! DETH (8). Each is a fixed set of big-endian fields; they share one file
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
