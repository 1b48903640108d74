//! A delay-based controller through the same [`CongestionControl`] seam as
//! DCQCN (issue 19): TIMELY (Mittal et al., SIGCOMM 2015), rate-based on
//! the round-trip time and its gradient, for networks that never mark ECN.
//!
//! The controller measures RTTs itself from what the trait already gives
//! it: the time each request packet went out (`on_sent`) and the time its
//! PSN was acknowledged (`on_ack`). Retransmitted packets give no sample
//! (Karn). Per sample, with `new_rtt`:
//!
//! - below `t_low`: additive increase, `rate += delta`;
//! - above `t_high`: `rate *= 1 − beta·(1 − t_high / new_rtt)`;
//! - otherwise, on the smoothed gradient `g = ewma(rtt_diff) / min_rtt`:
//!   - `g ≤ 0`: `rate += n·delta`, where `n` is `hai_n` after `hai_after`
//!     such samples in a row (hyper-active increase), else 1;
//!   - `g > 0`: `rate *= 1 − beta·g`.
//!
//! Packets are paced at the rate ("not before"), and the engine's window
//! still bounds what is in flight. It sends `NotEct` and no CNPs.

use std::collections::VecDeque;
use std::time::Duration;

use softrdma_wire::Psn;

use crate::congestion::{CcCounters, CongestionControl, SendVerdict, SentPacket};
use crate::time::Instant;

/// TIMELY's parameters (per device).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimelyParams {
    /// The line rate (b/s): the starting and the highest rate.
    pub line_rate_bps: u64,
    /// The lowest rate (b/s).
    pub min_rate_bps: u64,
    /// Additive step (b/s).
    pub delta_bps: u64,
    /// Multiplicative decrease factor.
    pub beta: f64,
    /// EWMA weight of a new RTT difference.
    pub ewma: f64,
    /// Below this RTT: always increase.
    pub t_low: Duration,
    /// Above this RTT: always decrease.
    pub t_high: Duration,
    /// The propagation RTT the gradient is normalised by.
    pub min_rtt: Duration,
    /// Negative-gradient samples in a row before hyper-active increase.
    pub hai_after: u32,
    /// The hyper-active increase multiple of `delta`.
    pub hai_n: u32,
    /// PSNs that may be unacknowledged besides the rate (the engine's
    /// `max_inflight` when built through `CongestionConfig::timely`).
    pub window: u32,
}

impl TimelyParams {
    /// Values in the range the TIMELY paper reports for datacenter links,
    /// scaled to `line_rate_bps`, with thresholds for a `min_rtt` path.
    pub fn new(line_rate_bps: u64, min_rtt: Duration) -> Self {
        TimelyParams {
            line_rate_bps,
            // A floor of 5 % of the line: a sample comes with an ACK, and at
            // a lower rate ACKs (and so recovery) come too rarely.
            min_rate_bps: line_rate_bps / 20,
            // 50 Mb/s per sample on a 10 Gb/s link, scaled.
            delta_bps: (line_rate_bps / 200).max(1_000_000),
            beta: 0.8,
            ewma: 0.3,
            t_low: min_rtt * 2,
            t_high: min_rtt * 10,
            min_rtt,
            hai_after: 5,
            hai_n: 5,
            window: 256,
        }
    }
}

/// The TIMELY controller of one QP.
#[derive(Debug, Clone)]
pub struct Timely {
    p: TimelyParams,
    rate: f64,
    next_send: Instant,
    /// Send times of PSNs in flight (None: retransmitted, no sample).
    sent: VecDeque<(Psn, Option<Instant>)>,
    prev_rtt: Option<f64>,
    diff_ewma: f64,
    negative_run: u32,
    counters: CcCounters,
}

impl Timely {
    pub fn new(p: TimelyParams) -> Self {
        let rate = p.line_rate_bps.max(1) as f64;
        Timely {
            p,
            rate,
            next_send: Instant(0),
            sent: VecDeque::new(),
            prev_rtt: None,
            diff_ewma: 0.0,
            negative_run: 0,
            counters: CcCounters {
                rate_bps: rate as u64,
                ..Default::default()
            },
        }
    }

    /// The current rate (b/s).
    pub fn rate_bps(&self) -> u64 {
        self.rate as u64
    }

    /// One RTT sample, in ns.
    fn sample(&mut self, rtt: f64) {
        let p = self.p;
        let line = p.line_rate_bps.max(1) as f64;
        let diff = self.prev_rtt.map_or(0.0, |prev| rtt - prev);
        self.prev_rtt = Some(rtt);
        self.diff_ewma = (1.0 - p.ewma) * self.diff_ewma + p.ewma * diff;
        let t_low = p.t_low.as_nanos() as f64;
        let t_high = p.t_high.as_nanos() as f64;
        let before = self.rate;
        if rtt < t_low {
            self.negative_run = 0;
            self.rate += p.delta_bps as f64;
        } else if rtt > t_high {
            self.negative_run = 0;
            self.rate *= 1.0 - p.beta * (1.0 - t_high / rtt);
        } else {
            let g = self.diff_ewma / (p.min_rtt.as_nanos().max(1) as f64);
            if g <= 0.0 {
                self.negative_run += 1;
                let n = if self.negative_run >= p.hai_after {
                    p.hai_n
                } else {
                    1
                };
                self.rate += f64::from(n) * p.delta_bps as f64;
            } else {
                self.negative_run = 0;
                self.rate *= 1.0 - (p.beta * g).min(0.5);
            }
        }
        self.rate = self.rate.clamp(p.min_rate_bps as f64, line);
        if self.rate < before {
            self.counters.rate_cuts += 1;
        }
        self.counters.rate_bps = self.rate as u64;
    }
}

impl CongestionControl for Timely {
    fn window(&self) -> u32 {
        self.p.window
    }

    fn can_send(&self, now: Instant, inflight: u32, _bytes: usize) -> SendVerdict {
        if inflight >= self.p.window {
            SendVerdict::Blocked
        } else if now < self.next_send {
            SendVerdict::NotBefore(self.next_send)
        } else {
            SendVerdict::Now
        }
    }

    fn on_sent(&mut self, now: Instant, sent: &SentPacket) {
        let ns = (sent.bytes as f64 * 8.0 * 1e9 / self.rate.max(1.0)) as u64;
        self.next_send = Instant(self.next_send.max(now).0.saturating_add(ns));
        let last = sent.psn.add(sent.span.max(1) - 1);
        if sent.retransmit {
            // Karn: no sample from anything sent again.
            for e in self.sent.iter_mut() {
                if e.0 == last {
                    e.1 = None;
                }
            }
        } else if self.sent.len() < 1 << 16 {
            self.sent.push_back((last, Some(now)));
        }
    }

    fn on_ack(&mut self, now: Instant, first: Psn, count: u32) {
        let end = first.add(count);
        let mut newest = None;
        while let Some(&(psn, at)) = self.sent.front() {
            if !psn.is_before(end) {
                break;
            }
            self.sent.pop_front();
            newest = Some(at);
        }
        if let Some(Some(at)) = newest {
            self.sample(now.0.saturating_sub(at.0) as f64);
        }
    }

    fn on_timeout(&mut self, _now: Instant) {
        // Everything outstanding may go again: no sample from it.
        for e in self.sent.iter_mut() {
            e.1 = None;
        }
    }

    fn counters(&self) -> CcCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(t: &mut Timely, now: u64, psn: u32) {
        let s = SentPacket {
            psn: Psn::new(psn),
            span: 1,
            bytes: 1000,
            retransmit: false,
        };
        t.on_sent(Instant(now), &s);
    }

    #[test]
    fn rtt_above_t_high_cuts_and_low_rtt_climbs() {
        let p = TimelyParams::new(10_000_000_000, Duration::from_micros(10));
        let mut t = Timely::new(p);
        // 200 µs RTT against a 100 µs t_high: rate × (1 − 0.8 × 0.5).
        sent(&mut t, 1_000, 0);
        t.on_ack(Instant(201_000), Psn::new(0), 1);
        assert_eq!(t.rate_bps(), 6_000_000_000);
        assert_eq!(t.counters().rate_cuts, 1);
        // Below t_low (20 µs): + delta (50 Mb/s at 10 Gb/s).
        sent(&mut t, 300_000, 1);
        t.on_ack(Instant(310_000), Psn::new(1), 1);
        assert_eq!(t.rate_bps(), 6_050_000_000);
        // A retransmitted PSN gives no sample.
        sent(&mut t, 400_000, 2);
        t.on_sent(
            Instant(500_000),
            &SentPacket {
                psn: Psn::new(2),
                span: 1,
                bytes: 1000,
                retransmit: true,
            },
        );
        t.on_ack(Instant(900_000), Psn::new(2), 1);
        assert_eq!(t.rate_bps(), 6_050_000_000);
        // Pacing: 1,000 bytes at 6.05 Gb/s is 1,322 ns.
        let now = Instant(1_000_000);
        assert_eq!(t.can_send(now, 0, 0), SendVerdict::Now);
        sent(&mut t, now.0, 3);
        assert_eq!(
            t.can_send(now, 0, 0),
            SendVerdict::NotBefore(Instant(now.0 + 1_322))
        );
    }
}
