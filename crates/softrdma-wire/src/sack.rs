//! The selective-acknowledgement extension of an RC ACK (softrdma's
//! selective repeat, used only on QPs whose two ends negotiated it).
//!
//! It rides in an ordinary RC ACKNOWLEDGE packet (opcode 0x11) between the
//! AETH and the ICRC, where a standard ACK has nothing. The ACK keeps its
//! standard meaning (its PSN acknowledges every PSN up to it, its AETH
//! carries the syndrome, credits and MSN); the extension adds which later
//! PSNs the responder also holds. Field by field (big-endian):
//!
//! | bytes | field | value |
//! |---|---|---|
//! | 0–1 | magic | `0x5352` ("SR") |
//! | 2 | version | 1 |
//! | 3 | words | bitmap length in 32-bit words, 1 … [`MAX_WORDS`] |
//! | 4 … 4 + 4·words | bitmap | bit *i* (byte *i*/8, mask `0x80 >> i%8`) set: the responder holds PSN `ack_psn + 1 + i` |
//!
//! Bit 0 describes the first PSN the ACK does not cover, which is missing
//! by definition, so it is always clear. The extension is a multiple of
//! four bytes, so the BTH pad count stays 0. tshark dissects such an ACK as
//! a plain ACK (it does not look past the AETH of an ACK) without a
//! malformed-frame warning.

use crate::{Error, Psn, Result};

/// Bytes before the bitmap.
pub const HEADER_LEN: usize = 4;
/// The magic that opens the extension.
pub const MAGIC: u16 = 0x5352;
/// The only version.
pub const VERSION: u8 = 1;
/// The longest bitmap, in 32-bit words: 1,024 PSNs past the ACK.
pub const MAX_WORDS: usize = 32;
/// PSNs one extension can describe.
pub const MAX_BITS: u32 = (MAX_WORDS * 32) as u32;
/// The largest extension on the wire.
pub const MAX_LEN: usize = HEADER_LEN + MAX_WORDS * 4;

/// A parsed SACK extension: which PSNs after an ACK's PSN the responder holds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SackRepr {
    words: usize,
    bits: [u8; MAX_WORDS * 4],
}

impl core::fmt::Debug for SackRepr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SackRepr")
            .field("words", &self.words)
            .field("held", &self.held().collect::<Vec<_>>())
            .finish()
    }
}

impl Default for SackRepr {
    fn default() -> Self {
        SackRepr {
            words: 1,
            bits: [0; MAX_WORDS * 4],
        }
    }
}

impl SackRepr {
    /// An empty bitmap (one word, nothing held).
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks offset `i` (PSN `ack_psn + 1 + i`) held; false when `i` is
    /// beyond [`MAX_BITS`] (nothing changes).
    pub fn set(&mut self, i: u32) -> bool {
        if i >= MAX_BITS {
            return false;
        }
        let i = i as usize;
        self.bits[i / 8] |= 0x80 >> (i % 8);
        self.words = self.words.max(i / 32 + 1);
        true
    }

    /// Whether offset `i` is marked held.
    pub fn get(&self, i: u32) -> bool {
        let i = i as usize;
        i < self.words * 32 && self.bits[i / 8] & (0x80 >> (i % 8)) != 0
    }

    /// The offsets marked held, lowest first.
    pub fn held(&self) -> impl Iterator<Item = u32> + '_ {
        (0..(self.words * 32) as u32).filter(|&i| self.get(i))
    }

    /// The PSNs marked held after an ACK for `ack_psn`.
    pub fn held_psns(&self, ack_psn: Psn) -> impl Iterator<Item = Psn> + '_ {
        self.held().map(move |i| ack_psn.add(1 + i))
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN + self.words * 4
    }

    /// Parses the bytes after an ACK's AETH. Anything but exactly one
    /// well-formed extension is an error.
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated {
                header: "SACK",
                need: HEADER_LEN,
                have: b.len(),
            });
        }
        let magic = u16::from_be_bytes([b[0], b[1]]);
        if magic != MAGIC {
            return Err(Error::BadField {
                header: "SACK",
                field: "magic",
                value: u64::from(magic),
            });
        }
        if b[2] != VERSION {
            return Err(Error::BadField {
                header: "SACK",
                field: "version",
                value: u64::from(b[2]),
            });
        }
        let words = usize::from(b[3]);
        if words == 0 || words > MAX_WORDS {
            return Err(Error::BadField {
                header: "SACK",
                field: "words",
                value: words as u64,
            });
        }
        let need = HEADER_LEN + words * 4;
        if b.len() != need {
            return Err(Error::Truncated {
                header: "SACK",
                need,
                have: b.len(),
            });
        }
        let mut s = SackRepr {
            words,
            bits: [0; MAX_WORDS * 4],
        };
        s.bits[..words * 4].copy_from_slice(&b[HEADER_LEN..need]);
        Ok(s)
    }

    /// Writes the extension into the start of `b` (at least
    /// [`Self::buffer_len`] bytes); returns its length.
    pub fn emit(&self, b: &mut [u8]) -> Result<usize> {
        let need = self.buffer_len();
        if b.len() < need {
            return Err(Error::BufferTooSmall {
                need,
                have: b.len(),
            });
        }
        b[0..2].copy_from_slice(&MAGIC.to_be_bytes());
        b[2] = VERSION;
        b[3] = self.words as u8;
        b[HEADER_LEN..need].copy_from_slice(&self.bits[..self.words * 4]);
        Ok(need)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_bounds() {
        let mut s = SackRepr::new();
        assert!(s.set(1) && s.set(5) && s.set(40) && s.set(MAX_BITS - 1));
        assert!(!s.set(MAX_BITS));
        let mut buf = [0u8; MAX_LEN];
        let n = s.emit(&mut buf).unwrap();
        assert_eq!(n, MAX_LEN);
        assert_eq!(&buf[..4], &[0x53, 0x52, 1, 32]);
        assert_eq!(buf[4], 0b0100_0100);
        let p = SackRepr::parse(&buf[..n]).unwrap();
        assert_eq!(p, s);
        assert_eq!(p.held().collect::<Vec<_>>(), vec![1, 5, 40, MAX_BITS - 1]);
        let psns: Vec<u32> = p
            .held_psns(Psn::new(0xFF_FFFF))
            .map(|p| p.value())
            .collect();
        assert_eq!(psns, vec![1, 5, 40, MAX_BITS - 1]);
        // Short, long, bad magic, bad version, zero or too many words.
        assert!(SackRepr::parse(&buf[..n - 1]).is_err());
        assert!(SackRepr::parse(&buf[..3]).is_err());
        let mut b = buf;
        b[0] = 0;
        assert!(SackRepr::parse(&b[..n]).is_err());
        let mut b = buf;
        b[2] = 2;
        assert!(SackRepr::parse(&b[..n]).is_err());
        let mut b = buf;
        b[3] = 0;
        assert!(SackRepr::parse(&b[..4]).is_err());
        let mut long = vec![0u8; 4 + 33 * 4];
        long[..4].copy_from_slice(&[0x53, 0x52, 1, 33]);
        assert!(SackRepr::parse(&long).is_err());
        let small = SackRepr::new();
        assert_eq!(small.buffer_len(), 8);
        assert!(small.emit(&mut [0u8; 7]).is_err());
    }
}
