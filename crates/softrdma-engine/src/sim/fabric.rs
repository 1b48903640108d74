//! The fabric: links with a rate, a propagation delay and an output queue.
//!
//! A [`Link`] is one direction of a wire, or a switch's output port: a
//! packet waits in its FIFO queue, is serialised at its rate (its bytes
//! plus a per-frame overhead) and then travels for its delay. A route is
//! the links a packet from one node to another passes, in order; a packet
//! enters each link at the instant it leaves the one before, as an event of
//! the network's own, so every queue sees its packets in the order they
//! really reach it. Without a route (the default) a packet takes
//! [`super::NetConfig::delay`] and never queues, as before links existed.

use std::collections::VecDeque;
use std::time::Duration;

use softrdma_wire::Ecn;

use crate::rng::Rng;
use crate::time::Instant;

/// Which link: an index handed out by [`super::SimNet::add_link`].
pub type LinkId = usize;

/// What a link is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkConfig {
    /// Bits per second; `None` serialises in no time (and nothing queues).
    pub rate_bps: Option<u64>,
    /// Propagation delay, after serialisation.
    pub delay: Duration,
    /// Bytes each packet costs on this link beyond its UDP payload (the
    /// frame's headers, FCS, preamble and gap: 66 for RoCEv2 over IPv4 on
    /// Ethernet); counted in serialisation and in the queue.
    pub overhead: usize,
    /// The most bytes the queue holds, the packet being serialised
    /// included; a packet that does not fit is dropped (tail drop).
    pub queue_bytes: Option<usize>,
}

impl LinkConfig {
    /// An Ethernet link of `rate_bps` and `delay` with an unbounded queue.
    pub fn ethernet(rate_bps: u64, delay: Duration) -> Self {
        LinkConfig {
            rate_bps: Some(rate_bps),
            delay,
            overhead: 66,
            queue_bytes: None,
        }
    }

    /// The time `bytes` take to serialise (rounded up to a nanosecond).
    pub fn serialisation(&self, bytes: usize) -> Duration {
        match self.rate_bps {
            Some(r) if r > 0 => {
                let ns = (bytes as u128 * 8 * 1_000_000_000).div_ceil(u128::from(r));
                Duration::from_nanos(ns.min(u128::from(u64::MAX)) as u64)
            }
            _ => Duration::ZERO,
        }
    }
}

/// What an ECN hook sees of a packet entering a link's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueState {
    /// The instant the packet reaches the link.
    pub now: Instant,
    /// Bytes already queued ahead of it (the one in serialisation included).
    pub queued_bytes: usize,
    /// Packets already queued ahead of it.
    pub queued_packets: usize,
    /// The packet's bytes on this link (overhead included).
    pub bytes: usize,
    /// Its ECN codepoint as it arrives.
    pub ecn: Ecn,
}

/// Decides the ECN codepoint a packet leaves a link with (a switch's
/// marking policy). Installed with [`super::SimNet::set_ecn_hook`].
pub type EcnHook = Box<dyn FnMut(&QueueState) -> Ecn>;

/// Marks ECN-capable packets CE when at least `threshold` bytes are queued
/// ahead of them (DCTCP's step marking); others pass unchanged.
pub fn ecn_threshold(threshold: usize) -> EcnHook {
    Box::new(move |q| {
        if q.ecn != Ecn::NotEct && q.queued_bytes >= threshold {
            Ecn::Ce
        } else {
            q.ecn
        }
    })
}

/// RED-style marking of ECN-capable packets: never below `min` queued
/// bytes, always from `max`, and in between with a probability rising
/// linearly to `pmax`. Draws from its own generator seeded with `seed`, so
/// it leaves the network's draws (and so every other seed's run) alone.
pub fn ecn_red(min: usize, max: usize, pmax: f64, seed: u64) -> EcnHook {
    let mut rng = Rng::new(seed);
    Box::new(move |q| {
        if q.ecn == Ecn::NotEct || q.queued_bytes < min {
            return q.ecn;
        }
        if q.queued_bytes >= max {
            return Ecn::Ce;
        }
        let p = pmax * (q.queued_bytes - min) as f64 / (max - min).max(1) as f64;
        if rng.chance(p) {
            Ecn::Ce
        } else {
            q.ecn
        }
    })
}

/// What a link did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Packets that entered the queue.
    pub packets: u64,
    /// Their bytes (overhead included).
    pub bytes: u64,
    /// Packets dropped because the queue was full.
    pub tail_drops: u64,
    /// Packets the ECN hook changed to CE.
    pub ecn_marked: u64,
    /// The most bytes ever queued (the packet entering included).
    pub max_queued_bytes: usize,
}

/// One link's state.
pub(super) struct Link {
    pub(super) cfg: LinkConfig,
    pub(super) ecn: Option<EcnHook>,
    /// When the packet now in serialisation is done.
    busy_until: Instant,
    /// Packets not yet fully serialised: when each is done, and its bytes.
    queue: VecDeque<(Instant, usize)>,
    queued_bytes: usize,
    pub(super) stats: LinkStats,
}

impl Link {
    pub(super) fn new(cfg: LinkConfig) -> Self {
        Link {
            cfg,
            ecn: None,
            busy_until: Instant::ZERO,
            queue: VecDeque::new(),
            queued_bytes: 0,
            stats: LinkStats::default(),
        }
    }

    /// Bytes queued at `now` (the packet in serialisation included).
    pub(super) fn queued_bytes(&mut self, now: Instant) -> usize {
        self.drain(now);
        self.queued_bytes
    }

    fn drain(&mut self, now: Instant) {
        while let Some(&(done, b)) = self.queue.front() {
            if done > now {
                break;
            }
            self.queue.pop_front();
            self.queued_bytes -= b;
        }
    }

    /// A packet of `len` payload bytes reaches the link at `now`: when it
    /// leaves the far end and with which codepoint, or `None` if the queue
    /// had no room for it.
    pub(super) fn enter(&mut self, now: Instant, len: usize, ecn: Ecn) -> Option<(Instant, Ecn)> {
        self.drain(now);
        let bytes = len + self.cfg.overhead;
        if self
            .cfg
            .queue_bytes
            .is_some_and(|cap| self.queued_bytes + bytes > cap)
        {
            self.stats.tail_drops += 1;
            return None;
        }
        let mut out = ecn;
        if let Some(hook) = self.ecn.as_mut() {
            out = hook(&QueueState {
                now,
                queued_bytes: self.queued_bytes,
                queued_packets: self.queue.len(),
                bytes,
                ecn,
            });
            if out == Ecn::Ce && ecn != Ecn::Ce {
                self.stats.ecn_marked += 1;
            }
        }
        let done = self.busy_until.max(now) + self.cfg.serialisation(bytes);
        self.busy_until = done;
        if done > now {
            self.queue.push_back((done, bytes));
            self.queued_bytes += bytes;
        }
        self.stats.packets += 1;
        self.stats.bytes += bytes as u64;
        self.stats.max_queued_bytes = self.stats.max_queued_bytes.max(self.queued_bytes);
        Some((done + self.cfg.delay, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(queued_bytes: usize, ecn: Ecn) -> QueueState {
        QueueState {
            now: Instant::ZERO,
            queued_bytes,
            queued_packets: queued_bytes / 1000,
            bytes: 1000,
            ecn,
        }
    }

    #[test]
    fn red_marks_none_below_min_all_from_max_and_some_between() {
        let mut red = ecn_red(10_000, 20_000, 0.5, 1);
        assert_eq!(red(&state(9_999, Ecn::Ect0)), Ecn::Ect0);
        assert_eq!(red(&state(20_000, Ecn::Ect0)), Ecn::Ce);
        assert_eq!(red(&state(50_000, Ecn::NotEct)), Ecn::NotEct);
        let marked = (0..1000)
            .filter(|_| red(&state(15_000, Ecn::Ect1)) == Ecn::Ce)
            .count();
        // p = 0.25 halfway: well inside 150..350 for any generator worth the name.
        assert!((150..350).contains(&marked), "{marked}");
    }

    #[test]
    fn a_link_serialises_back_to_back_and_drains() {
        let mut l = Link::new(LinkConfig {
            rate_bps: Some(8_000_000_000), // one byte per nanosecond
            delay: Duration::from_nanos(100),
            overhead: 0,
            queue_bytes: Some(2500),
        });
        let t0 = Instant(1000);
        assert_eq!(
            l.enter(t0, 1000, Ecn::NotEct),
            Some((Instant(2100), Ecn::NotEct))
        );
        assert_eq!(
            l.enter(t0, 1000, Ecn::NotEct),
            Some((Instant(3100), Ecn::NotEct))
        );
        assert_eq!(l.enter(t0, 1000, Ecn::NotEct), None, "2000 + 1000 > 2500");
        assert_eq!(l.stats.tail_drops, 1);
        assert_eq!(l.queued_bytes(Instant(2000)), 1000, "the first is out");
        assert_eq!(
            l.enter(Instant(5000), 1000, Ecn::NotEct),
            Some((Instant(6100), Ecn::NotEct))
        );
        assert_eq!(l.queued_bytes(Instant(6000)), 0);
    }
}
