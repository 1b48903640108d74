//! The timers of a QP, by name.
//!
//! Every deadline a QP can have is one entry of a small table keyed by
//! [`Timer`], instead of a field of its own wherever it was needed: the
//! earliest armed entry is what the QP registers with the engine's timer
//! heap ([`Timers::next`]), and `handle_timeout` asks the table which of
//! them expired. Adding a timer (a congestion controller's, a selective
//! repeat's) is one more name, not one more field to remember in
//! `deadline`, `reset` and the error path.

use crate::time::Instant;

/// A QP's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// The local ACK timeout of an RC requester (the retry timer): armed
    /// while packets are unacknowledged, re-armed on progress; on expiry
    /// the completer spends a retry and the requester goes back.
    Retransmit,
    /// The wait an RNR NAK asked for: no request goes out before it ends.
    RnrWait,
    /// The responder holds a lone positive ACK until then
    /// (`EngineConfig::ack_delay_ns`).
    AckDelay,
    /// The congestion controller allowed the next request no earlier than
    /// this ([`crate::SendVerdict::NotBefore`]): its expiry schedules the QP.
    Pacing,
    /// The congestion controller's own timer
    /// ([`crate::CongestionControl::timeout`]).
    Congestion,
    /// Selective repeat's tail-loss probe (IRN's short RTO): armed with the
    /// retry timer at an eighth of it; on expiry the few packets in flight
    /// and not known held go again, without spending a retry.
    TailProbe,
}

impl Timer {
    const COUNT: usize = 6;

    fn index(self) -> usize {
        match self {
            Timer::Retransmit => 0,
            Timer::RnrWait => 1,
            Timer::AckDelay => 2,
            Timer::Pacing => 3,
            Timer::Congestion => 4,
            Timer::TailProbe => 5,
        }
    }
}

/// A stopped timer: the end of time (where `Instant + Duration` saturates),
/// which no clock reaches, so a deadline there is the same as none; the
/// table is then 8 bytes a timer instead of 16.
const STOPPED: u64 = u64::MAX;

/// The deadline of each [`Timer`] in nanoseconds, or [`STOPPED`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timers([u64; Timer::COUNT]);

impl Default for Timers {
    fn default() -> Self {
        Timers([STOPPED; Timer::COUNT])
    }
}

impl Timers {
    /// When `t` expires, if armed.
    pub fn get(&self, t: Timer) -> Option<Instant> {
        let at = self.0[t.index()];
        (at != STOPPED).then_some(Instant(at))
    }

    /// Arms `t` for `at` (re-arms it if it was armed). A deadline at the
    /// end of time is the same as none.
    pub fn set(&mut self, t: Timer, at: Instant) {
        self.0[t.index()] = at.0;
    }

    /// Arms `t` for `at`, or stops it with `None`.
    pub fn set_opt(&mut self, t: Timer, at: Option<Instant>) {
        self.0[t.index()] = at.map_or(STOPPED, |i| i.0);
    }

    /// Stops `t`.
    pub fn stop(&mut self, t: Timer) {
        self.0[t.index()] = STOPPED;
    }

    pub fn is_armed(&self, t: Timer) -> bool {
        self.get(t).is_some()
    }

    /// Whether `t` is armed and due at `now`.
    pub fn expired(&self, t: Timer, now: Instant) -> bool {
        self.get(t).is_some_and(|at| at <= now)
    }

    /// The earliest armed deadline.
    pub fn next(&self) -> Option<Instant> {
        let at = self.0.iter().copied().min().unwrap_or(STOPPED);
        (at != STOPPED).then_some(Instant(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_is_the_earliest_armed() {
        let mut t = Timers::default();
        assert_eq!(t.next(), None);
        t.set(Timer::Retransmit, Instant(50));
        t.set(Timer::AckDelay, Instant(20));
        t.set(Timer::Pacing, Instant(30));
        assert_eq!(t.next(), Some(Instant(20)));
        t.stop(Timer::AckDelay);
        assert_eq!(t.next(), Some(Instant(30)));
        assert!(t.expired(Timer::Pacing, Instant(30)));
        assert!(!t.expired(Timer::Retransmit, Instant(30)));
        assert!(!t.expired(Timer::RnrWait, Instant(1000)));
        t.set_opt(Timer::Pacing, None);
        assert_eq!(t.next(), Some(Instant(50)));
        assert!(t.is_armed(Timer::Retransmit) && !t.is_armed(Timer::Pacing));
    }
}
