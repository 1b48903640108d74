//! The two ECN bits of the IP header (RFC 3168): the low bits of the IPv4
//! TOS byte and of the IPv6 traffic class. RoCEv2 congestion control
//! (DCQCN) reads CE marks on received packets and answers them with CNPs.
//! The ICRC masks the whole TOS / traffic-class byte, so ECN never changes
//! a packet's ICRC.

/// An ECN codepoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Ecn {
    /// Not ECN-capable transport (`00`): what softrdma sends by default.
    #[default]
    NotEct = 0b00,
    /// ECN-capable transport, ECT(1) (`01`).
    Ect1 = 0b01,
    /// ECN-capable transport, ECT(0) (`10`): what RoCEv2 NICs mark with DCQCN on.
    Ect0 = 0b10,
    /// Congestion experienced (`11`): set by a switch on an ECN-capable packet.
    Ce = 0b11,
}

impl Ecn {
    /// The codepoint in the low two bits of a TOS / traffic-class byte.
    pub const fn from_tos(tos: u8) -> Self {
        match tos & 0b11 {
            0b00 => Ecn::NotEct,
            0b01 => Ecn::Ect1,
            0b10 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }

    /// `tos` with its ECN bits replaced by this codepoint.
    pub const fn with_tos(self, tos: u8) -> u8 {
        (tos & !0b11) | self as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tos_round_trip_keeps_the_dscp() {
        for tos in 0..=255u8 {
            let e = Ecn::from_tos(tos);
            assert_eq!(e as u8, tos & 3);
            assert_eq!(e.with_tos(tos), tos);
            assert_eq!(Ecn::Ce.with_tos(tos) & !3, tos & !3);
        }
    }
}
