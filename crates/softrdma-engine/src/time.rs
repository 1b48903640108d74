//! Engine time: nanoseconds on a clock the driver chooses.
//!
//! The engine never reads a clock. Drivers pass "now" into every call (the UDP
//! driver a monotonic clock, the simulator a virtual one), which is what makes
//! simulations replay exactly from a seed.

use core::ops::{Add, Sub};
use std::time::Duration;

/// A point in time, in nanoseconds since an origin the driver picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(pub u64);

impl Instant {
    /// The origin.
    pub const ZERO: Instant = Instant(0);

    /// Nanoseconds since the origin.
    pub const fn nanos(self) -> u64 {
        self.0
    }

    /// Time elapsed since `earlier` (zero if `earlier` is later).
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(
            self.0
                .saturating_add(d.as_nanos().min(u128::from(u64::MAX)) as u64),
        )
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_since(rhs)
    }
}

/// The local ACK timeout of an RC QP: 4.096 µs × 2^timeout; 0 means infinite.
pub fn local_ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        None
    } else {
        Some(Duration::from_nanos(4096u64 << u32::from(timeout.min(31))))
    }
}
