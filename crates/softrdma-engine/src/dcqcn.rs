//! DCQCN (Zhu et al., "Congestion Control for Large-Scale RDMA
//! Deployments", SIGCOMM 2015) as a [`CongestionControl`]: the three roles
//! of RoCEv2 congestion control on one QP.
//!
//! - **ECN-capable transport**: every packet the QP sends carries ECT(0),
//!   so that switches mark it CE instead of dropping it.
//! - **Notification point** (the receiver): a CE-marked packet draws a CNP
//!   to the sender's QP, at most one per `cnp_interval`.
//! - **Reaction point** (the sender): a rate limiter. A CNP cuts the
//!   current rate `Rc` by `alpha / 2` (at most once per
//!   `rate_reduce_interval`) after saving it as the target `Rt`, and
//!   raises `alpha`. Without CNPs, `alpha` decays every `alpha_interval`,
//!   and the rate climbs back on two clocks, a timer (`increase_interval`)
//!   and a byte counter (`byte_counter` bytes sent). The first `fast_stages`
//!   events of either are fast recovery (`Rc = (Rt + Rc) / 2`). After that
//!   comes additive increase (`Rt += ai_rate`). Once both clocks are past
//!   `fast_stages` it is hyper increase (`Rt += i · hai_rate`). Packets are
//!   paced at `Rc` with the "not before" verdict.
//!
//! The parameters ([`DcqcnParams`]) default to the DCQCN paper's values
//! (g = 1/256, 55 µs timers, 10 MB byte counter, F = 5, 40 Mb/s additive
//! and 100 Mb/s hyper increase), with a 50 µs CNP interval at the
//! notification point as in the paper. All are settable per device through
//! [`crate::CongestionConfig::dcqcn`].

use std::time::Duration;

use softrdma_wire::{Ecn, Psn, Syndrome};

use crate::congestion::{CcCounters, CongestionControl, EcnAction, SendVerdict, SentPacket};
use crate::time::Instant;

/// DCQCN's parameters (per device).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DcqcnParams {
    /// The line rate (b/s): the starting and the highest rate.
    pub line_rate_bps: u64,
    /// The lowest rate a cut may reach (b/s).
    pub min_rate_bps: u64,
    /// Alpha's gain g.
    pub g: f64,
    /// Alpha's starting value.
    pub initial_alpha: f64,
    /// Without a CNP for this long, alpha decays by (1 − g).
    pub alpha_interval: Duration,
    /// At most one rate cut per this interval (later CNPs only raise alpha).
    pub rate_reduce_interval: Duration,
    /// The rate-increase timer.
    pub increase_interval: Duration,
    /// The rate-increase byte counter (bytes sent per event).
    pub byte_counter: u64,
    /// Fast-recovery stages F.
    pub fast_stages: u32,
    /// Additive increase step (b/s).
    pub ai_rate_bps: u64,
    /// Hyper increase step (b/s).
    pub hai_rate_bps: u64,
    /// Notification point: at most one CNP per this interval per QP.
    pub cnp_interval: Duration,
    /// PSNs that may be unacknowledged besides the rate (the engine's
    /// `max_inflight` when built through `CongestionConfig::dcqcn`).
    pub window: u32,
}

impl DcqcnParams {
    /// The paper's values for a link of `line_rate_bps`.
    pub fn new(line_rate_bps: u64) -> Self {
        DcqcnParams {
            line_rate_bps,
            min_rate_bps: 10_000_000,
            g: 1.0 / 256.0,
            initial_alpha: 1.0,
            alpha_interval: Duration::from_micros(55),
            rate_reduce_interval: Duration::from_micros(50),
            increase_interval: Duration::from_micros(55),
            byte_counter: 10_000_000,
            fast_stages: 5,
            ai_rate_bps: 40_000_000,
            hai_rate_bps: 100_000_000,
            cnp_interval: Duration::from_micros(50),
            window: 256,
        }
    }
}

impl DcqcnParams {
    /// The DCQCN settings the ns-3 model of the HPCC paper's simulations
    /// is run with (its configuration files: alpha resume interval 1 µs,
    /// rate decrease interval 4 µs, rate-increase timer 300 µs, g = 1/256,
    /// 50 Mb/s additive and 100 Mb/s hyper increase, a 100 Mb/s floor,
    /// F = 5); the byte counter and CNP interval as in [`Self::new`].
    pub fn ns3_hpcc(line_rate_bps: u64) -> Self {
        DcqcnParams {
            min_rate_bps: 100_000_000,
            alpha_interval: Duration::from_micros(1),
            rate_reduce_interval: Duration::from_micros(4),
            increase_interval: Duration::from_micros(300),
            ai_rate_bps: 50_000_000,
            hai_rate_bps: 100_000_000,
            ..Self::new(line_rate_bps)
        }
    }
}

/// The DCQCN controller of one QP (both its roles).
#[derive(Debug, Clone)]
pub struct Dcqcn {
    p: DcqcnParams,
    /// Current and target rate (b/s).
    rc: f64,
    rt: f64,
    alpha: f64,
    /// Pacing: the next packet not before this.
    next_send: Instant,
    last_cut: Option<Instant>,
    last_cnp_rcvd: Option<Instant>,
    next_alpha: Option<Instant>,
    next_increase: Option<Instant>,
    bytes_since: u64,
    timer_stage: u32,
    byte_stage: u32,
    /// Notification point: when the last CNP was asked for.
    last_cnp_sent: Option<Instant>,
    counters: CcCounters,
}

impl Dcqcn {
    pub fn new(p: DcqcnParams) -> Self {
        let line = p.line_rate_bps.max(1) as f64;
        let mut d = Dcqcn {
            p,
            rc: line,
            rt: line,
            alpha: p.initial_alpha,
            next_send: Instant(0),
            last_cut: None,
            last_cnp_rcvd: None,
            next_alpha: None,
            next_increase: None,
            bytes_since: 0,
            timer_stage: 0,
            byte_stage: 0,
            last_cnp_sent: None,
            counters: CcCounters::default(),
        };
        d.counters.rate_bps = d.rc as u64;
        d
    }

    /// The current rate (b/s).
    pub fn rate_bps(&self) -> u64 {
        self.rc as u64
    }

    /// Alpha.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    fn line(&self) -> f64 {
        self.p.line_rate_bps.max(1) as f64
    }

    /// One rate-increase event (timer or byte counter).
    fn increase(&mut self) {
        let f = self.p.fast_stages;
        let (t, b) = (self.timer_stage, self.byte_stage);
        if t.max(b) < f {
            // Fast recovery: towards the target.
        } else if t.min(b) > f {
            let i = f64::from(t.min(b) - f);
            self.rt += i * self.p.hai_rate_bps as f64;
        } else {
            self.rt += self.p.ai_rate_bps as f64;
        }
        self.rt = self.rt.min(self.line());
        self.rc = ((self.rt + self.rc) / 2.0).min(self.line());
        self.counters.rate_bps = self.rc as u64;
    }

    fn recovering(&self) -> bool {
        self.rc < self.line()
    }
}

fn after(now: Instant, d: Duration) -> Instant {
    Instant(now.0.saturating_add(d.as_nanos() as u64))
}

impl CongestionControl for Dcqcn {
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
        // Paced at Rc; a packet on the wire's framing is the driver's.
        let ns = (sent.bytes as f64 * 8.0 * 1e9 / self.rc.max(1.0)) as u64;
        let from = self.next_send.max(now);
        self.next_send = Instant(from.0.saturating_add(ns));
        if self.recovering() {
            self.bytes_since += sent.bytes as u64;
            if self.bytes_since >= self.p.byte_counter {
                self.bytes_since = 0;
                self.byte_stage += 1;
                self.increase();
            }
        }
    }

    fn on_ack(&mut self, _now: Instant, _first: Psn, _count: u32) {}

    fn on_nak(&mut self, _now: Instant, _psn: Psn, _syndrome: Syndrome) {}

    fn on_ecn(&mut self, now: Instant, ecn: Ecn) -> EcnAction {
        if ecn != Ecn::Ce {
            return EcnAction::None;
        }
        let due = self
            .last_cnp_sent
            .is_none_or(|t| now.0.saturating_sub(t.0) >= self.p.cnp_interval.as_nanos() as u64);
        if due {
            self.last_cnp_sent = Some(now);
            self.counters.cnps_asked += 1;
            EcnAction::SendCnp
        } else {
            EcnAction::None
        }
    }

    fn on_cnp(&mut self, now: Instant) {
        self.last_cnp_rcvd = Some(now);
        self.alpha = (1.0 - self.p.g) * self.alpha + self.p.g;
        self.next_alpha = Some(after(now, self.p.alpha_interval));
        let may_cut = self.last_cut.is_none_or(|t| {
            now.0.saturating_sub(t.0) >= self.p.rate_reduce_interval.as_nanos() as u64
        });
        if may_cut {
            self.last_cut = Some(now);
            self.rt = self.rc;
            self.rc = (self.rc * (1.0 - self.alpha / 2.0)).max(self.p.min_rate_bps as f64);
            self.timer_stage = 0;
            self.byte_stage = 0;
            self.bytes_since = 0;
            self.next_increase = Some(after(now, self.p.increase_interval));
            self.counters.rate_cuts += 1;
            self.counters.rate_bps = self.rc as u64;
        }
    }

    fn ecn_to_send(&self) -> Ecn {
        Ecn::Ect0
    }

    fn timeout(&self) -> Option<Instant> {
        match (self.next_alpha, self.next_increase) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn on_timer(&mut self, now: Instant) {
        if self.next_alpha.is_some_and(|t| t <= now) {
            let quiet = self.last_cnp_rcvd.is_none_or(|t| {
                now.0.saturating_sub(t.0) >= self.p.alpha_interval.as_nanos() as u64
            });
            if quiet {
                self.alpha *= 1.0 - self.p.g;
            }
            // Alpha decays for as long as it matters.
            self.next_alpha =
                (self.alpha > 1e-3 || self.recovering()).then(|| after(now, self.p.alpha_interval));
        }
        if self.next_increase.is_some_and(|t| t <= now) {
            self.timer_stage += 1;
            self.increase();
            self.next_increase = self
                .recovering()
                .then(|| after(now, self.p.increase_interval));
        }
    }

    fn counters(&self) -> CcCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cnp_cuts_by_half_alpha_and_the_rate_recovers_in_stages() {
        let p = DcqcnParams::new(100_000_000_000);
        let mut d = Dcqcn::new(p);
        let t0 = Instant(1_000_000);
        d.on_cnp(t0);
        // alpha = (1 - g) * 1 + g = 1: the first cut halves the rate.
        assert_eq!(d.rate_bps(), 50_000_000_000);
        // A second CNP within the reduce interval only raises alpha.
        d.on_cnp(Instant(t0.0 + 10_000));
        assert_eq!(d.rate_bps(), 50_000_000_000);
        assert_eq!(d.counters().rate_cuts, 1);
        // Fast recovery: each timer event halves the gap to the target.
        // (the alpha timer runs between them and leaves the rate alone).
        let mut t = d.timeout().unwrap();
        let mut rates = Vec::new();
        while rates.len() < 3 {
            let before = d.rate_bps();
            d.on_timer(t);
            if d.rate_bps() != before {
                rates.push(d.rate_bps());
            }
            t = d.timeout().unwrap();
        }
        assert_eq!(rates, vec![75_000_000_000, 87_500_000_000, 93_750_000_000]);
        // Pacing at the current rate: 4,128 bytes at 93.75 Gb/s.
        let now = Instant(t.0);
        assert_eq!(d.can_send(now, 0, 4096), SendVerdict::Now);
        d.on_sent(
            now,
            &SentPacket {
                psn: Psn::new(0),
                span: 1,
                bytes: 4128,
                retransmit: false,
            },
        );
        assert_eq!(
            d.can_send(now, 0, 4096),
            SendVerdict::NotBefore(Instant(now.0 + 352))
        );
        // It climbs back to the line rate and stops its increase timer.
        for _ in 0..200 {
            match d.timeout() {
                Some(t) => d.on_timer(t),
                None => break,
            }
        }
        assert_eq!(d.rate_bps(), 100_000_000_000);
        assert_eq!(d.ecn_to_send(), Ecn::Ect0);
    }

    #[test]
    fn the_notification_point_sends_one_cnp_per_interval() {
        let mut d = Dcqcn::new(DcqcnParams::new(10_000_000_000));
        let t = |us: u64| Instant(1_000_000 + us * 1000);
        assert_eq!(d.on_ecn(t(0), Ecn::Ect0), EcnAction::None);
        assert_eq!(d.on_ecn(t(0), Ecn::Ce), EcnAction::SendCnp);
        assert_eq!(d.on_ecn(t(10), Ecn::Ce), EcnAction::None);
        assert_eq!(d.on_ecn(t(49), Ecn::Ce), EcnAction::None);
        assert_eq!(d.on_ecn(t(50), Ecn::Ce), EcnAction::SendCnp);
        assert_eq!(d.counters().cnps_asked, 2);
    }
}
