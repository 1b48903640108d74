//! Fault injection on receive, on any port: [`Faulty`] wraps a port and
//! drops, corrupts, reorders, duplicates and delays what it delivers, after a
//! [`FaultSpec`] (`SOFTRDMA_FAULT=loss=0.01,reorder=0.01,dup=0.005,corrupt=0.001,seed=7`
//! in the softrdma driver; `delay_us=50,jitter_us=10` adds a one-way delay
//! on receive, for kernels without `tc netem`). Faults act on packets as they arrive, before
//! the ICRC check, so a corrupted packet is caught and counted like one
//! damaged on a real wire — over UDP and shared memory alike. Faults act
//! on packets only, so a faulty port offers no direct path: every
//! operation goes through the engine and its packets.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use softrdma_engine::Rng;

use crate::port::{Outgoing, Port, PortCounters, Received, Sources};
use softrdma_engine::{Instant, RxMeta};

/// A fault spec that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultSpecError(pub String);

impl std::fmt::Display for FaultSpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FaultSpecError {}

/// Fault probabilities (each 0.0..=1.0) and the generator seed.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultSpec {
    /// Probability a packet is dropped.
    pub loss: f64,
    /// Probability a packet is held back behind the next one.
    pub reorder: f64,
    /// Probability a packet is delivered twice.
    pub dup: f64,
    /// Probability one bit of a packet is flipped.
    pub corrupt: f64,
    /// Seed of the generator (runs replay exactly).
    pub seed: u64,
    /// Every packet that gets through is delivered this long after it
    /// arrived (`delay_us`).
    pub delay: Duration,
    /// Plus a uniform random extra delay up to this (`jitter_us`). Packets
    /// keep their order: one never overtakes an earlier one.
    pub jitter: Duration,
}

/// The largest delay or jitter a spec may ask for (1 s).
pub const MAX_DELAY: Duration = Duration::from_secs(1);

impl FromStr for FaultSpec {
    type Err = FaultSpecError;
    fn from_str(s: &str) -> Result<Self, FaultSpecError> {
        let mut f = FaultSpec {
            seed: 1,
            ..Default::default()
        };
        for kv in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| {
                FaultSpecError(format!("fault spec item {kv:?} is not key=value"))
            })?;
            if k == "delay_us" || k == "jitter_us" {
                let us: f64 = match v.trim().parse::<f64>() {
                    Ok(us) if (0.0..=MAX_DELAY.as_micros() as f64).contains(&us) => us,
                    _ => {
                        return Err(FaultSpecError(format!(
                            "fault spec {k}={v}: give microseconds from 0 to 1000000, e.g. {k}=50"
                        )))
                    }
                };
                let d = Duration::from_nanos((us * 1000.0) as u64);
                if k == "delay_us" {
                    f.delay = d;
                } else {
                    f.jitter = d;
                }
                continue;
            }
            if k == "seed" {
                f.seed = v.parse().map_err(|_| {
                    FaultSpecError(format!("fault spec seed {v:?} is not an integer"))
                })?;
                continue;
            }
            let p: f64 = match v.trim().parse::<f64>() {
                Ok(p) if (0.0..=1.0).contains(&p) => p,
                Ok(_) => {
                    return Err(FaultSpecError(format!(
                        "fault spec {k}={v}: {v} is not a probability (give 0 to 1, e.g. {k}=0.01)"
                    )))
                }
                Err(_) if v.contains([';', ' ', ':']) => {
                    return Err(FaultSpecError(format!(
                        "fault spec {k}={v}: items are separated by commas, e.g. loss=0.1,seed=3"
                    )))
                }
                Err(_) => {
                    return Err(FaultSpecError(format!(
                        "fault spec {k}={v}: {v:?} is not a number (give a probability 0 to 1, e.g. {k}=0.01)"
                    )))
                }
            };
            match k {
                "loss" => f.loss = p,
                "reorder" => f.reorder = p,
                "dup" => f.dup = p,
                "corrupt" => f.corrupt = p,
                _ => {
                    return Err(FaultSpecError(format!(
                        "fault spec key {k:?} is unknown (loss, reorder, dup, corrupt, delay_us, jitter_us, seed)"
                    )))
                }
            }
        }
        Ok(f)
    }
}

/// Applies a [`FaultSpec`] to a stream of packets.
#[derive(Debug)]
pub struct FaultInjector {
    spec: FaultSpec,
    rng: Rng,
    held: Option<(std::net::SocketAddr, Vec<u8>)>,
    /// Faults injected so far.
    pub injected: u64,
}

impl FaultInjector {
    /// An injector for `spec`.
    pub fn new(spec: FaultSpec) -> Self {
        FaultInjector {
            spec,
            rng: Rng::new(spec.seed),
            held: None,
            injected: 0,
        }
    }

    /// Feeds one received packet; `deliver` gets what comes out (zero, one or
    /// more packets, possibly an earlier held one).
    pub fn apply(
        &mut self,
        src: std::net::SocketAddr,
        data: &[u8],
        mut deliver: impl FnMut(std::net::SocketAddr, &[u8]),
    ) {
        if self.rng.chance(self.spec.loss) {
            self.injected += 1;
            return;
        }
        let mut pkt = data.to_vec();
        if self.rng.chance(self.spec.corrupt) && !pkt.is_empty() {
            self.injected += 1;
            let bit = self.rng.below(pkt.len() as u64 * 8);
            pkt[(bit / 8) as usize] ^= 1 << (bit % 8);
        }
        if self.held.is_none() && self.rng.chance(self.spec.reorder) {
            // Hold it back: it goes out after the next packet.
            self.injected += 1;
            self.held = Some((src, pkt));
            return;
        }
        deliver(src, &pkt);
        if self.rng.chance(self.spec.dup) {
            self.injected += 1;
            deliver(src, &pkt);
        }
        if let Some((s, p)) = self.held.take() {
            deliver(s, &p);
        }
    }

    /// Releases a held packet (when the stream goes quiet).
    pub fn flush(&mut self, mut deliver: impl FnMut(std::net::SocketAddr, &[u8])) {
        if let Some((s, p)) = self.held.take() {
            deliver(s, &p);
        }
    }
}

/// A port whose receives go through a [`FaultInjector`].
#[derive(Debug)]
pub struct Faulty<P> {
    inner: P,
    inj: FaultInjector,
    /// Packets waiting out the spec's delay: (due, source, meta, bytes), in
    /// arrival order with non-decreasing due times.
    delayed: VecDeque<(Instant, SocketAddr, RxMeta, Vec<u8>)>,
}

impl<P> Faulty<P> {
    /// `inner` with faults after `spec`.
    pub fn new(inner: P, spec: FaultSpec) -> Self {
        Faulty {
            inner,
            inj: FaultInjector::new(spec),
            delayed: VecDeque::new(),
        }
    }
    /// The port inside.
    pub fn inner(&self) -> &P {
        &self.inner
    }
    /// The port inside.
    pub fn inner_mut(&mut self) -> &mut P {
        &mut self.inner
    }
}

impl<P: Port> Port for Faulty<P> {
    type Peers = P::Peers;

    fn receive<F>(&mut self, now: Instant, from: Sources, budget: usize, mut rx: F) -> Received
    where
        F: FnMut(SocketAddr, RxMeta, &[u8]),
    {
        let inj = &mut self.inj;
        let (delay, jitter) = (inj.spec.delay, inj.spec.jitter);
        if delay.is_zero() && jitter.is_zero() {
            let got = self.inner.receive(now, from, budget, |src, meta, d| {
                inj.apply(src, d, |s, d| rx(s, meta, d))
            });
            if got.slow + got.fast == 0 {
                // The stream went quiet: a packet held back goes now.
                inj.flush(|s, d| rx(s, RxMeta::default(), d));
            }
            return got;
        }
        // Delayed: what gets through waits in `delayed` until it is due.
        let q = &mut self.delayed;
        let due = |rng: &mut Rng, last: Option<Instant>| {
            let extra = if jitter.is_zero() {
                0
            } else {
                rng.below(jitter.as_nanos() as u64 + 1)
            };
            let at = Instant(now.0 + delay.as_nanos() as u64 + extra);
            last.map_or(at, |l| at.max(l))
        };
        let mut got = self.inner.receive(now, from, budget, |src, meta, d| {
            let mut out: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
            inj.apply(src, d, |s, d| out.push((s, d.to_vec())));
            for (s, d) in out {
                let at = due(&mut inj.rng, q.back().map(|b| b.0));
                q.push_back((at, s, meta, d));
            }
        });
        if got.slow + got.fast == 0 {
            let mut out: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
            inj.flush(|s, d| out.push((s, d.to_vec())));
            for (s, d) in out {
                let at = due(&mut inj.rng, q.back().map(|b| b.0));
                q.push_back((at, s, RxMeta::default(), d));
            }
        }
        // Deliver what is due; count it as fast (no system call).
        let mut n = 0;
        while q.front().is_some_and(|f| f.0 <= now) {
            let (_, s, m, d) = q.pop_front().expect("front checked");
            rx(s, m, &d);
            n += 1;
        }
        got.fast += n;
        got.more |= !q.is_empty();
        got
    }

    fn next_due(&self) -> Option<Instant> {
        let mine = self.delayed.front().map(|f| f.0);
        match (mine, self.inner.next_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn send(&mut self, now: Instant, out: &mut Outgoing<'_>) {
        self.inner.send(now, out)
    }

    fn has_fast(&self) -> bool {
        self.inner.has_fast()
    }

    fn fast_pending(&self) -> bool {
        // A packet held back or delayed is pending: inline polls must not
        // go idle on it (`next_due` wakes a sleeping device for it; without
        // the polls, a loaded machine's wake-ups came 1–14 ms late).
        self.inj.held.is_some() || !self.delayed.is_empty() || self.inner.fast_pending()
    }

    fn maintain(&mut self) {
        self.inner.maintain()
    }

    /// Off: faults act on packets, and the direct path has none.
    fn direct_allowed(&self) -> bool {
        false
    }

    fn peers(&mut self) -> Option<&mut P::Peers> {
        self.inner.peers()
    }

    fn counters(&self, c: &mut PortCounters) {
        self.inner.counters(c);
        c.faults_injected += self.inj.injected;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_spec() {
        let f: FaultSpec = "loss=0.01,reorder=0.01,dup=0.005,corrupt=0.001,seed=7"
            .parse()
            .unwrap();
        assert_eq!(
            f,
            FaultSpec {
                loss: 0.01,
                reorder: 0.01,
                dup: 0.005,
                corrupt: 0.001,
                seed: 7,
                ..Default::default()
            }
        );
        assert!("loss=2"
            .parse::<FaultSpec>()
            .unwrap_err()
            .to_string()
            .contains("2 is not a probability (give 0 to 1"));
        let e = "loss=0.1;seed=3"
            .parse::<FaultSpec>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("separated by commas"), "{e}");
        let e = "loss=lots".parse::<FaultSpec>().unwrap_err().to_string();
        assert!(e.contains("\"lots\" is not a number"), "{e}");
        assert!("jitter=0.1"
            .parse::<FaultSpec>()
            .unwrap_err()
            .to_string()
            .contains("unknown"));
    }

    #[test]
    fn parses_delay_and_jitter() {
        let f: FaultSpec = "loss=0.01,delay_us=50,jitter_us=2.5".parse().unwrap();
        assert_eq!(f.delay, Duration::from_micros(50));
        assert_eq!(f.jitter, Duration::from_nanos(2500));
        for bad in ["delay_us=-1", "delay_us=2000000", "jitter_us=soon"] {
            let e = bad.parse::<FaultSpec>().unwrap_err().to_string();
            assert!(
                e.contains("give microseconds from 0 to 1000000"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn loss_rate_is_roughly_right() {
        let mut inj = FaultInjector::new(FaultSpec {
            loss: 0.1,
            seed: 3,
            ..Default::default()
        });
        let src = "127.0.0.1:1".parse().unwrap();
        let mut n = 0;
        for _ in 0..10_000 {
            inj.apply(src, &[1, 2, 3], |_, _| n += 1);
        }
        assert!(
            (8_700..9_300).contains(&n),
            "{n} of 10000 delivered at 10% loss"
        );
    }
}
