//! CM time: nanoseconds on a clock the caller chooses, and the IBA time
//! exponents the CM messages carry.
//!
//! The agent never reads a clock; every call that can start or end a wait
//! is given "now". IBA encodes a time as an exponent `v` meaning
//! 4.096 µs × 2^v; [`iba_time`] converts it the way the Linux kernel's CM
//! does (whole milliseconds, 2^(v−8), at least 1 ms), so that retries and
//! timewait here last what they last against a kernel peer.

use core::ops::Add;
use std::time::Duration;

/// A point in time, in nanoseconds since an origin the caller picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(pub u64);

impl Instant {
    /// The origin.
    pub const ZERO: Instant = Instant(0);

    /// Nanoseconds since the origin.
    pub const fn nanos(self) -> u64 {
        self.0
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        let ns = d.as_nanos().min(u128::from(u64::MAX)) as u64;
        Instant(self.0.saturating_add(ns))
    }
}

/// The duration an IBA time exponent stands for, as the kernel's CM
/// rounds it (`cm_convert_to_ms`): 4.096 µs × 2^v is about 2^(v−8) ms, and
/// anything shorter than a millisecond becomes one. Exponents above 31 are
/// not on the wire (5-bit fields) and are clamped.
pub fn iba_time(v: u8) -> Duration {
    let exp = u32::from(v.min(31)).saturating_sub(8);
    Duration::from_millis(1u64 << exp)
}

/// The local ACK timeout exponent for a path: 4.096 µs × 2^t must cover the
/// target's ACK delay and the round trip (twice the packet lifetime). As
/// the kernel's `cm_ack_timeout`, it takes the larger of `ack_delay` and
/// `packet_life_time + 1` and adds one (doubles it) only when the other
/// term is within a factor of two of it.
pub fn ack_timeout(ack_delay: u8, packet_life_time: u8) -> u8 {
    let lifetime = packet_life_time.saturating_add(1);
    let t = if lifetime >= ack_delay {
        lifetime + u8::from(ack_delay >= lifetime - 1)
    } else {
        ack_delay + u8::from(lifetime >= ack_delay - 1)
    };
    t.min(31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iba_time_rounds_like_the_kernel() {
        assert_eq!(iba_time(0), Duration::from_millis(1));
        assert_eq!(iba_time(8), Duration::from_millis(1));
        assert_eq!(iba_time(9), Duration::from_millis(2));
        assert_eq!(iba_time(20), Duration::from_millis(4096));
        assert_eq!(iba_time(31), Duration::from_millis(1 << 23));
        assert_eq!(iba_time(200), iba_time(31));
    }

    #[test]
    fn ack_timeout_covers_both_terms() {
        // Lifetime dominates: 2 × 2^16 ≈ 2^17, the delay is far below.
        assert_eq!(ack_timeout(0, 16), 17);
        // Both close: round up once.
        assert_eq!(ack_timeout(17, 16), 18);
        // Delay dominates.
        assert_eq!(ack_timeout(20, 10), 20);
        assert_eq!(ack_timeout(31, 31), 31);
    }
}
