//! The link-layer models, each a small state machine of its own that the
//! simulator ([`crate::sim`]) drives and the unit tests below pin.
//!
//! - [`SharedBuffer`]: a switch's shared packet memory with a per-port cap
//!   (lossy Ethernet: a packet that does not fit is dropped at the tail).
//! - [`PfcIngress`]: 802.1Qbb priority flow control at one ingress port of
//!   one priority: XOFF above a threshold, XON below another, headroom for
//!   what is still in flight when the pause takes effect.
//! - [`Credits`]: InfiniBand's credit-based flow control of one VL on one
//!   link: the sender sends only into buffer the receiver advertised, so
//!   nothing is ever dropped for want of buffer.
//! - [`Red`]: RED/ECN marking (Kmin, Kmax, Pmax) on an egress queue.
//! - [`ber_drop_rate`]: a bit error rate turned into a packet drop rate.

use serde::{Deserialize, Serialize};

/// Picoseconds.
pub type Ps = u64;

/// The time `bytes` take on a link of `bps` (rounded up to a picosecond).
pub fn serialisation_ps(bytes: u64, bps: u64) -> Ps {
    (u128::from(bytes) * 8 * 1_000_000_000_000).div_ceil(u128::from(bps)) as Ps
}

/// 802.1Qbb: one pause quantum is 512 bit times.
pub const PAUSE_QUANTUM_BITS: u64 = 512;
/// The largest pause a PFC frame can ask for (quanta field 0xFFFF).
pub const PAUSE_MAX_QUANTA: u16 = 0xFFFF;

/// How long `quanta` pause quanta last on a link of `bps`.
pub fn pause_ps(quanta: u16, bps: u64) -> Ps {
    serialisation_ps(u64::from(quanta) * PAUSE_QUANTUM_BITS / 8, bps)
}

/// The probability that a packet of `bytes` bytes has at least one bit
/// error at bit error rate `ber` (and so is dropped by the receiver's FCS
/// or the ICRC): 1 − (1 − BER)^bits.
pub fn ber_drop_rate(ber: f64, bytes: u64) -> f64 {
    if ber <= 0.0 {
        return 0.0;
    }
    1.0 - (1.0 - ber.min(1.0)).powf((bytes * 8) as f64)
}

/// RED/ECN marking parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Red {
    /// Below this queue depth (bytes) nothing is marked.
    pub kmin_bytes: u64,
    /// At or above this depth every ECN-capable packet is marked.
    pub kmax_bytes: u64,
    /// The marking probability just below `kmax_bytes`.
    pub pmax: f64,
}

impl Red {
    /// The probability that a packet joining a queue of `queued` bytes is
    /// marked CE.
    pub fn mark_probability(&self, queued: u64) -> f64 {
        if queued < self.kmin_bytes {
            0.0
        } else if queued >= self.kmax_bytes {
            1.0
        } else {
            let span = (self.kmax_bytes - self.kmin_bytes).max(1) as f64;
            self.pmax * (queued - self.kmin_bytes) as f64 / span
        }
    }
}

/// Why a packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropCause {
    /// Lossy Ethernet: the egress queue or the shared buffer was full.
    TailDrop,
    /// PFC: more arrived after XOFF than the headroom holds (a
    /// misconfiguration: headroom below the round trip).
    HeadroomOverflow,
    /// A bit error on the link (the BER of the link, or its loss rate).
    Corruption,
}

/// A switch's shared buffer.
#[derive(Debug, Clone)]
pub struct SharedBuffer {
    /// Total bytes of packet memory.
    pub capacity: u64,
    /// The most one egress queue may hold.
    pub port_cap: u64,
    /// Bytes held now.
    pub used: u64,
}

impl SharedBuffer {
    pub fn new(capacity: u64, port_cap: u64) -> Self {
        SharedBuffer {
            capacity,
            port_cap,
            used: 0,
        }
    }

    /// Takes `bytes` for a queue now holding `queued`, or refuses (tail drop).
    pub fn admit(&mut self, queued: u64, bytes: u64) -> bool {
        if self.used + bytes > self.capacity || queued + bytes > self.port_cap {
            return false;
        }
        self.used += bytes;
        true
    }

    /// Takes `bytes` whatever the limits (lossless layers, whose own flow
    /// control bounds the occupancy).
    pub fn force(&mut self, bytes: u64) {
        self.used += bytes;
    }

    pub fn release(&mut self, bytes: u64) {
        self.used = self.used.saturating_sub(bytes);
    }
}

/// PFC thresholds (bytes per ingress port and priority).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PfcParams {
    /// Above this the port sends XOFF (a pause of the maximum quanta).
    pub xoff_bytes: u64,
    /// Below this (after an XOFF) it sends XON (a pause of zero quanta).
    pub xon_bytes: u64,
    /// Room above XOFF for what is on the wire when the pause takes effect;
    /// a packet beyond it is dropped ([`DropCause::HeadroomOverflow`]).
    pub headroom_bytes: u64,
}

/// What an ingress port's PFC state machine asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PfcAction {
    /// Nothing.
    None,
    /// Send a pause frame with these quanta upstream (0: resume).
    Send(u16),
    /// Drop the packet (headroom exceeded).
    Drop,
}

/// One ingress port's PFC state for one priority.
#[derive(Debug, Clone, Default)]
pub struct PfcIngress {
    /// Bytes that came in through this port and are still in the switch.
    pub bytes: u64,
    /// Whether the upstream is paused by us (XOFF sent, XON not yet).
    pub xoff: bool,
    /// XOFF frames sent (refreshes included).
    pub pauses_sent: u64,
}

impl PfcIngress {
    /// A packet of `len` bytes arrived.
    pub fn on_arrival(&mut self, p: &PfcParams, len: u64) -> PfcAction {
        if self.bytes + len > p.xoff_bytes + p.headroom_bytes {
            return PfcAction::Drop;
        }
        self.bytes += len;
        if !self.xoff && self.bytes > p.xoff_bytes {
            self.xoff = true;
            self.pauses_sent += 1;
            return PfcAction::Send(PAUSE_MAX_QUANTA);
        }
        PfcAction::None
    }

    /// A packet of `len` bytes that came in here left the switch.
    pub fn on_departure(&mut self, p: &PfcParams, len: u64) -> PfcAction {
        self.bytes = self.bytes.saturating_sub(len);
        if self.xoff && self.bytes <= p.xon_bytes {
            self.xoff = false;
            return PfcAction::Send(0);
        }
        PfcAction::None
    }

    /// The pause sent earlier is about to run out: refresh it while the
    /// port is still above XON.
    pub fn on_refresh(&mut self) -> PfcAction {
        if self.xoff {
            self.pauses_sent += 1;
            PfcAction::Send(PAUSE_MAX_QUANTA)
        } else {
            PfcAction::None
        }
    }
}

/// The sender's view of one VL's credits on one IB link.
#[derive(Debug, Clone)]
pub struct Credits {
    /// Bytes the receiver's buffer for this VL can still take.
    pub available: u64,
    /// The advertised buffer (never exceeded).
    pub limit: u64,
}

impl Credits {
    pub fn new(limit: u64) -> Self {
        Credits {
            available: limit,
            limit,
        }
    }

    /// Whether a packet of `len` bytes may be sent now; if so, spends them.
    pub fn try_spend(&mut self, len: u64) -> bool {
        if len > self.available {
            return false;
        }
        self.available -= len;
        true
    }

    /// The receiver freed `len` bytes (a credit update arrived).
    pub fn refund(&mut self, len: u64) {
        self.available = (self.available + len).min(self.limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pfc_max_pause_is_83_9_us_at_400g_and_335_us_at_100g() {
        // 65535 quanta × 512 bit times.
        assert_eq!(pause_ps(PAUSE_MAX_QUANTA, 400_000_000_000), 83_884_800);
        assert_eq!(pause_ps(PAUSE_MAX_QUANTA, 100_000_000_000), 335_539_200);
        assert_eq!(pause_ps(0, 100_000_000_000), 0);
    }

    #[test]
    fn serialisation_of_a_4k_packet() {
        assert_eq!(serialisation_ps(4096, 400_000_000_000), 81_920);
        assert_eq!(serialisation_ps(1, 3), 2_666_666_666_667);
    }

    #[test]
    fn red_is_zero_below_kmin_linear_then_one() {
        let r = Red {
            kmin_bytes: 100,
            kmax_bytes: 300,
            pmax: 0.2,
        };
        assert_eq!(r.mark_probability(99), 0.0);
        assert_eq!(r.mark_probability(100), 0.0);
        assert!((r.mark_probability(200) - 0.1).abs() < 1e-12);
        assert_eq!(r.mark_probability(300), 1.0);
    }

    #[test]
    fn ber_to_drop_rate() {
        assert_eq!(ber_drop_rate(0.0, 4096), 0.0);
        // 1e-12 × 32768 bits ≈ 3.3e-8.
        let p = ber_drop_rate(1e-12, 4096);
        assert!((p - 3.2768e-8).abs() < 1e-12, "{p}");
        // Large BER saturates at 1.
        assert!(ber_drop_rate(0.5, 4096) > 0.999_999);
    }

    #[test]
    fn shared_buffer_tail_drops_at_either_limit() {
        let mut b = SharedBuffer::new(10_000, 6_000);
        assert!(b.admit(0, 5_000));
        assert!(!b.admit(5_000, 2_000), "port cap");
        assert!(b.admit(0, 5_000));
        assert!(!b.admit(0, 1), "buffer full");
        b.release(5_000);
        assert!(b.admit(0, 1));
        assert_eq!(b.used, 5_001);
    }

    #[test]
    fn pfc_xoff_xon_and_headroom() {
        let p = PfcParams {
            xoff_bytes: 10_000,
            xon_bytes: 5_000,
            headroom_bytes: 4_000,
        };
        let mut i = PfcIngress::default();
        assert_eq!(i.on_arrival(&p, 6_000), PfcAction::None);
        assert_eq!(
            i.on_arrival(&p, 4_000),
            PfcAction::None,
            "at XOFF, not above"
        );
        assert_eq!(i.on_arrival(&p, 1_000), PfcAction::Send(PAUSE_MAX_QUANTA));
        assert!(i.xoff);
        assert_eq!(i.on_arrival(&p, 2_000), PfcAction::None, "no second XOFF");
        assert_eq!(i.on_arrival(&p, 1_001), PfcAction::Drop, "beyond headroom");
        assert_eq!(i.bytes, 13_000);
        assert_eq!(i.on_refresh(), PfcAction::Send(PAUSE_MAX_QUANTA));
        assert_eq!(i.on_departure(&p, 6_000), PfcAction::None, "7000 > XON");
        assert_eq!(i.on_departure(&p, 2_000), PfcAction::Send(0));
        assert!(!i.xoff);
        assert_eq!(i.on_refresh(), PfcAction::None);
        assert_eq!(i.pauses_sent, 2);
    }

    #[test]
    fn credits_never_overrun() {
        let mut c = Credits::new(8192);
        assert!(c.try_spend(4096));
        assert!(c.try_spend(4096));
        assert!(!c.try_spend(1));
        c.refund(4096);
        assert!(!c.try_spend(4097));
        assert!(c.try_spend(4096));
        c.refund(100_000);
        assert_eq!(c.available, 8192, "never above the advertised buffer");
    }
}
