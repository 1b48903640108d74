//! What the wire says about an RC requester, computed independently of the
//! engine from the packets the network delivered: which WRs have been
//! acknowledged (so that a successful completion of an unacknowledged WR is
//! caught), and when acknowledgement information last arrived (so that a
//! RETRY_EXC_ERR can be checked against the retry budget).

use std::collections::VecDeque;

use softrdma_engine::Instant;
use softrdma_wire::Psn;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OKind {
    /// SEND or WRITE: acknowledged by an ACK (or NAK) covering its last PSN.
    Msg,
    /// READ: acknowledged once every response arrived in order.
    Read,
    /// Atomic: acknowledged by its ATOMIC ACKNOWLEDGE.
    Atomic,
}

#[derive(Debug, Clone)]
pub struct OWr {
    pub wr_id: u64,
    pub first: Psn,
    pub npkts: u32,
    pub kind: OKind,
    got: Vec<bool>,
    ngot: u32,
}

impl OWr {
    fn last(&self) -> Psn {
        self.first.add(self.npkts - 1)
    }
    fn acked(&self, hi_ack: Option<Psn>) -> bool {
        match self.kind {
            OKind::Msg => hi_ack.is_some_and(|h| !self.last().is_after(h)),
            _ => self.ngot == self.npkts,
        }
    }
}

#[derive(Debug)]
pub struct Oracle {
    /// Not yet acknowledged on the wire, oldest first.
    pub wrs: VecDeque<OWr>,
    pub next_psn: Psn,
    /// Highest PSN an ACK (or NAK - 1) acknowledged.
    hi_ack: Option<Psn>,
    /// When the wire last brought new acknowledgement information.
    pub t_prog: Instant,
    /// PSN-sequence NAKs delivered since then that brought nothing new.
    pub naks: u32,
    /// Requests the requester transmitted since then.
    pub tx: u32,
    /// A response for a PSN the requester never used for that kind of request.
    pub bogus: Option<String>,
    /// `(t_prog, naks, tx)` after each response delivered at instant
    /// `instant`: the engine takes the packets of one instant one at a
    /// time and may give up on one of them, before a later one in the same
    /// instant brings news, so a RETRY_EXC_ERR is judged against each of
    /// these states (see `excuse_retry_exc`).
    pub instant: Option<Instant>,
    pub states: Vec<(Instant, u32, u32)>,
}

impl Oracle {
    pub fn new(psn: Psn, now: Instant) -> Self {
        Oracle {
            wrs: VecDeque::new(),
            next_psn: psn,
            hi_ack: None,
            t_prog: now,
            naks: 0,
            tx: 0,
            bogus: None,
            instant: None,
            states: Vec::new(),
        }
    }

    /// Notes the state after a response delivered at `now`.
    pub fn record(&mut self, now: Instant) {
        if self.instant != Some(now) {
            self.instant = Some(now);
            self.states.clear();
        }
        self.states.push((self.t_prog, self.naks, self.tx));
    }

    /// The states a decision taken at `now` may have been taken in: after
    /// each response delivered then, or the present one.
    pub fn states_at(&self, now: Instant) -> Vec<(Instant, u32, u32)> {
        let mut v = if self.instant == Some(now) {
            self.states.clone()
        } else {
            Vec::new()
        };
        v.push((self.t_prog, self.naks, self.tx));
        v
    }

    pub fn push(&mut self, wr_id: u64, kind: OKind, npkts: u32) {
        let n = if kind == OKind::Read {
            npkts as usize
        } else {
            0
        };
        self.wrs.push_back(OWr {
            wr_id,
            first: self.next_psn,
            npkts,
            kind,
            got: vec![false; n],
            ngot: 0,
        });
        self.next_psn = self.next_psn.add(npkts);
    }

    /// Takes back the last [`Oracle::push`] of `wr_id`: the WR never went
    /// on the wire (the device core executed it directly).
    pub fn unpush(&mut self, wr_id: u64) {
        if self.wrs.back().is_some_and(|w| w.wr_id == wr_id) {
            if let Some(w) = self.wrs.pop_back() {
                self.next_psn = w.first;
            }
        }
    }

    fn oldest(&self) -> Psn {
        self.wrs.front().map_or(self.next_psn, |w| w.first)
    }

    /// True when `p` lies in the window of PSNs the requester has used and
    /// not seen acknowledged in full.
    fn in_window(&self, p: Psn) -> bool {
        p.in_window(self.oldest(), self.next_psn.distance_from(self.oldest()))
    }

    /// The oldest PSN the wire has not acknowledged (READ responses count
    /// from the first one in order, as a requester must consume them).
    pub fn una(&self) -> Psn {
        let hi = self.hi_ack;
        for w in &self.wrs {
            if w.acked(hi) {
                continue;
            }
            return match w.kind {
                OKind::Msg => match hi {
                    Some(h) if h.in_window(w.first, w.npkts) => h.next(),
                    _ => w.first,
                },
                OKind::Read => w.first.add(w.got.iter().take_while(|&&g| g).count() as u32),
                OKind::Atomic => w.first,
            };
        }
        self.next_psn
    }

    /// Records progress if `una` moved; returns whether it did.
    fn update(&mut self, before: Psn, now: Instant) -> bool {
        let hi = self.hi_ack;
        while self.wrs.front().is_some_and(|w| w.acked(hi)) {
            self.wrs.pop_front();
        }
        if self.una() != before {
            self.t_prog = now;
            self.naks = 0;
            self.tx = 0;
            true
        } else {
            false
        }
    }

    fn raise_hi(&mut self, p: Psn) {
        if !self.in_window(p) {
            return;
        }
        let newer = match self.hi_ack {
            None => true,
            Some(h) => p.is_after(h) || !self.in_window(h),
        };
        if newer {
            self.hi_ack = Some(p);
        }
    }

    pub fn on_ack(&mut self, p: Psn, now: Instant) {
        let before = self.una();
        self.raise_hi(p);
        self.update(before, now);
    }

    /// Any NAK acknowledges what comes before its PSN.
    pub fn on_nak(&mut self, p: Psn, seq: bool, now: Instant) {
        let before = self.una();
        self.raise_hi(p.sub(1));
        if !self.update(before, now) && seq {
            self.naks += 1;
        }
    }

    /// Index of the WR holding `p`, and whether every READ and atomic before
    /// it has its responses: a requester consumes responses in order and
    /// discards those that arrive ahead of a missing one.
    fn holder(&self, p: Psn) -> Option<(usize, bool)> {
        let i = self
            .wrs
            .iter()
            .position(|w| p.in_window(w.first, w.npkts))?;
        let hi = self.hi_ack;
        let in_order = self
            .wrs
            .iter()
            .take(i)
            .all(|w| w.kind == OKind::Msg || w.acked(hi));
        Some((i, in_order))
    }

    pub fn on_read_response(&mut self, p: Psn, now: Instant) {
        let before = self.una();
        let Some((i, in_order)) = self.holder(p) else {
            return;
        };
        if !in_order {
            let first = self.wrs[i].first;
            self.raise_hi(first.sub(1));
            self.update(before, now);
            return;
        }
        let w = &mut self.wrs[i];
        if w.kind != OKind::Read {
            self.bogus = Some(format!("READ response PSN {p:?} inside a {:?} WR", w.kind));
            return;
        }
        // Responses are consumed in order, as an IBTA requester does: one
        // that arrives ahead of a missing one is discarded and asked for again.
        let first = w.first;
        if p == w.first.add(w.ngot) {
            w.got[w.ngot as usize] = true;
            w.ngot += 1;
        }
        // A response for a later request acknowledges the SENDs and WRITEs before it.
        self.raise_hi(first.sub(1));
        self.update(before, now);
    }

    pub fn on_atomic_ack(&mut self, p: Psn, now: Instant) {
        let before = self.una();
        let Some((i, in_order)) = self.holder(p) else {
            return;
        };
        if !in_order {
            let first = self.wrs[i].first;
            self.raise_hi(first.sub(1));
            self.update(before, now);
            return;
        }
        let w = &mut self.wrs[i];
        if w.kind != OKind::Atomic {
            self.bogus = Some(format!("ATOMIC ACK PSN {p:?} inside a {:?} WR", w.kind));
            return;
        }
        let first = w.first;
        w.ngot = 1;
        self.raise_hi(first.sub(1));
        self.update(before, now);
    }

    pub fn on_transmit(&mut self) {
        self.tx += 1;
    }

    /// Is `wr_id` still waiting for acknowledgement on the wire?
    pub fn unacked(&self, wr_id: u64) -> bool {
        let hi = self.hi_ack;
        self.wrs.iter().any(|w| w.wr_id == wr_id && !w.acked(hi))
    }

    /// The harness saw `wr_id` complete: forget it and everything older.
    pub fn retire_through(&mut self, wr_id: u64) {
        if let Some(i) = self.wrs.iter().position(|w| w.wr_id == wr_id) {
            self.wrs.drain(..=i);
        }
    }
}
