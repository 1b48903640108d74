//! 24-bit packet and message sequence numbers.
//!
//! PSNs and MSNs wrap at 2^24. Ordering is defined the way IBTA defines it:
//! `b` is "after" `a` when `(b - a) mod 2^24` is in the lower half of the
//! space. Keeping this in one small type stops off-by-wrap bugs from spreading
//! through the transport.

use core::fmt;

/// Mask of the 24 significant bits.
pub const SEQ_MASK: u32 = 0x00FF_FFFF;
const HALF: u32 = 1 << 23;

macro_rules! seq24 {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(u32);

        impl $name {
            /// Builds a value, keeping only the low 24 bits.
            pub const fn new(v: u32) -> Self {
                Self(v & SEQ_MASK)
            }
            /// The raw 24-bit value.
            pub const fn value(self) -> u32 {
                self.0
            }
            /// `self + n`, wrapping at 2^24.
            #[allow(clippy::should_implement_trait)]
            pub const fn add(self, n: u32) -> Self {
                Self(self.0.wrapping_add(n) & SEQ_MASK)
            }
            /// `self - n`, wrapping at 2^24.
            #[allow(clippy::should_implement_trait)]
            pub const fn sub(self, n: u32) -> Self {
                Self(self.0.wrapping_sub(n) & SEQ_MASK)
            }
            /// The next value.
            pub const fn next(self) -> Self {
                self.add(1)
            }
            /// Distance from `earlier` forward to `self`, in `0..2^24`.
            pub const fn distance_from(self, earlier: Self) -> u32 {
                self.0.wrapping_sub(earlier.0) & SEQ_MASK
            }
            /// Signed distance `self - other` in `-2^23..2^23`.
            pub const fn diff(self, other: Self) -> i32 {
                let d = self.distance_from(other);
                if d >= HALF {
                    d as i32 - (1 << 24)
                } else {
                    d as i32
                }
            }
            /// True when `self` comes strictly before `other` (within half the space).
            pub const fn is_before(self, other: Self) -> bool {
                self.diff(other) < 0
            }
            /// True when `self` comes strictly after `other`.
            pub const fn is_after(self, other: Self) -> bool {
                self.diff(other) > 0
            }
            /// True when `self` lies in the half-open window `[start, start + len)`.
            pub const fn in_window(self, start: Self, len: u32) -> bool {
                self.distance_from(start) < len
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:#08x})", stringify!($name), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

seq24!(
    Psn,
    "A 24-bit packet sequence number with wrap-around ordering."
);
seq24!(Msn, "A 24-bit message sequence number carried in the AETH.");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_24_bits() {
        let p = Psn::new(0xFF_FFFF);
        assert_eq!(p.next(), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), p);
        assert_eq!(Psn::new(0x1FF_FFFF), p, "new keeps only 24 bits");
    }

    #[test]
    fn ordering_across_wrap() {
        let before = Psn::new(0xFF_FFF0);
        let after = Psn::new(0x10);
        assert!(before.is_before(after));
        assert!(after.is_after(before));
        assert_eq!(after.diff(before), 0x20);
        assert_eq!(before.diff(after), -0x20);
        assert_eq!(after.distance_from(before), 0x20);
        assert!(!after.is_before(after));
    }

    #[test]
    fn window_membership() {
        let start = Psn::new(0xFF_FFFE);
        assert!(Psn::new(0xFF_FFFE).in_window(start, 4));
        assert!(Psn::new(1).in_window(start, 4));
        assert!(!Psn::new(2).in_window(start, 4));
        assert!(!Psn::new(0xFF_FFFD).in_window(start, 4));
    }

    #[test]
    fn half_space_boundary() {
        let a = Psn::new(0);
        assert_eq!(Psn::new(HALF - 1).diff(a), (HALF - 1) as i32);
        assert_eq!(Psn::new(HALF).diff(a), -(HALF as i32));
    }
}
