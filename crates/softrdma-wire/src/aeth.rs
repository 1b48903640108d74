//! ACK Extended Transport Header (4 bytes): syndrome and MSN.
//! Carried by ACK, ATOMIC_ACK and READ_RESPONSE_FIRST/LAST/ONLY.
//!
//! The syndrome's top three bits say ACK (000), RNR NAK (001) or NAK (011);
//! the low five bits are a credit count, an RNR timer code or a NAK code.

use crate::util::{be32, check, put32};
use crate::{Error, Msn, Result};

/// AETH length in bytes.
pub const HEADER_LEN: usize = 4;

/// Credit-count code meaning "invalid / unlimited" (e.g. responders using an SRQ).
pub const CREDITS_INVALID: u8 = 0x1F;

/// The NAK codes of IBTA table 44.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// The PSN is ahead of the expected one (a packet was lost); the requester rewinds.
    PsnSequenceError,
    /// The request is malformed or not supported (e.g. a misaligned atomic).
    InvalidRequest,
    /// The rkey, address range or access rights do not allow the operation.
    RemoteAccessError,
    /// The responder could not complete the operation (e.g. a local error).
    RemoteOperationalError,
    /// Invalid RD request (RD only; kept so every IBTA code decodes).
    InvalidRdRequest,
}

impl NakCode {
    /// The 5-bit code carried in the low bits of a NAK syndrome.
    pub const fn value(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
        }
    }
    /// Decodes the low 5 bits of a NAK syndrome; `None` for reserved codes.
    pub const fn from_value(v: u8) -> Option<Self> {
        Some(match v {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            _ => return None,
        })
    }
    /// Human-readable name for logs and decoders.
    pub const fn name(self) -> &'static str {
        match self {
            NakCode::PsnSequenceError => "PSN sequence error",
            NakCode::InvalidRequest => "invalid request",
            NakCode::RemoteAccessError => "remote access error",
            NakCode::RemoteOperationalError => "remote operational error",
            NakCode::InvalidRdRequest => "invalid RD request",
        }
    }
}

/// A decoded AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement with an end-to-end credit code (0x1F = invalid).
    Ack {
        /// End-to-end credit code (IBTA table 46); 0x1F = invalid / unlimited.
        credits: u8,
    },
    /// Receiver not ready: retry after the time of `timer` (IBTA table 45).
    RnrNak {
        /// RNR timer code, see [`rnr_timer_micros`].
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
}

impl Syndrome {
    /// Encodes to the syndrome byte.
    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1F,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1F),
            Syndrome::Nak(code) => 0x60 | code.value(),
        }
    }

    /// Decodes a syndrome byte; reserved encodings are an error.
    pub fn from_byte(b: u8) -> Result<Self> {
        match b >> 5 {
            0b000 => Ok(Syndrome::Ack { credits: b & 0x1F }),
            0b001 => Ok(Syndrome::RnrNak { timer: b & 0x1F }),
            0b011 => NakCode::from_value(b & 0x1F)
                .map(Syndrome::Nak)
                .ok_or(Error::BadField {
                    header: "AETH",
                    field: "syndrome",
                    value: u64::from(b),
                }),
            _ => Err(Error::BadField {
                header: "AETH",
                field: "syndrome",
                value: u64::from(b),
            }),
        }
    }
}

/// Microseconds of an RNR NAK timer code (IBTA table 45: code 0 = 655.36 ms,
/// 1 = 0.01 ms, ... 31 = 491.52 ms).
pub const fn rnr_timer_micros(code: u8) -> u64 {
    const TABLE: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    TABLE[(code & 0x1F) as usize]
}

/// Number of receive credits an AETH credit code stands for (IBTA table 46:
/// 0, 1, 2, 3, 4, 6, 8, 12, ... 32768); `None` for the invalid code 0x1F.
pub const fn credits_from_code(code: u8) -> Option<u32> {
    if code & 0x1F == CREDITS_INVALID {
        return None;
    }
    let c = (code & 0x1F) as u32;
    Some(match c {
        0..=4 => c,
        _ => {
            // 5 -> 6, 6 -> 8, 7 -> 12, 8 -> 16 ...: alternating 1.5x and 2x steps.
            let k = (c - 5) / 2;
            if (c - 5) & 1 == 0 {
                6 << k
            } else {
                8 << k
            }
        }
    })
}

/// The largest credit code whose count does not exceed `n`.
pub const fn code_from_credits(n: u32) -> u8 {
    let mut code: u8 = 0;
    let mut c: u8 = 1;
    while c < CREDITS_INVALID {
        match credits_from_code(c) {
            Some(v) if v <= n => code = c,
            _ => break,
        }
        c += 1;
    }
    code
}

/// A view of an AETH.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length; accessors panic if it is short.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }
    /// Wraps a buffer after checking that it holds a whole AETH.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check("AETH", buffer.as_ref(), HEADER_LEN)?;
        Ok(Packet { buffer })
    }
    /// The raw syndrome byte (decode with [`Syndrome::from_byte`]).
    pub fn syndrome_raw(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// The 24-bit message sequence number.
    pub fn msn(&self) -> Msn {
        Msn::new(be32(&self.buffer.as_ref()[0..4]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Writes the syndrome byte and MSN together (they share one 32-bit word).
    pub fn set(&mut self, syndrome: u8, msn: Msn) {
        put32(
            &mut self.buffer.as_mut()[0..4],
            (u32::from(syndrome) << 24) | msn.value(),
        )
    }
}

/// A parsed AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// ACK, RNR NAK or NAK, with its credit count, timer or code.
    pub syndrome: Syndrome,
    /// Sequence number of the last message the responder completed.
    pub msn: Msn,
}

impl AethRepr {
    /// Parses a view; reserved syndromes are an [`Error::BadField`].
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self> {
        check("AETH", p.buffer.as_ref(), HEADER_LEN)?;
        Ok(AethRepr {
            syndrome: Syndrome::from_byte(p.syndrome_raw())?,
            msn: p.msn(),
        })
    }
    /// Always [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header; the view must hold [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set(self.syndrome.to_byte(), self.msn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndrome_round_trip() {
        for b in 0u8..=255 {
            if let Ok(s) = Syndrome::from_byte(b) {
                assert_eq!(s.to_byte(), b);
            }
        }
        assert_eq!(
            Syndrome::from_byte(0x1F).unwrap(),
            Syndrome::Ack { credits: 31 }
        );
        assert_eq!(
            Syndrome::from_byte(0x61).unwrap(),
            Syndrome::Nak(NakCode::InvalidRequest)
        );
        assert!(Syndrome::from_byte(0x65).is_err());
        assert!(Syndrome::from_byte(0x40).is_err(), "010 is reserved");
    }

    #[test]
    fn credit_table() {
        let want = [
            0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256,
        ];
        for (code, w) in want.iter().enumerate() {
            assert_eq!(credits_from_code(code as u8), Some(*w), "code {code}");
        }
        assert_eq!(credits_from_code(30), Some(32768));
        assert_eq!(credits_from_code(31), None);
        assert_eq!(code_from_credits(0), 0);
        assert_eq!(code_from_credits(5), 4);
        assert_eq!(code_from_credits(7), 5);
        assert_eq!(code_from_credits(1_000_000), 30);
    }

    #[test]
    fn rnr_timer_table_ends() {
        assert_eq!(rnr_timer_micros(0), 655_360);
        assert_eq!(rnr_timer_micros(1), 10);
        assert_eq!(rnr_timer_micros(14), 1_280);
        assert_eq!(rnr_timer_micros(31), 491_520);
    }
}
