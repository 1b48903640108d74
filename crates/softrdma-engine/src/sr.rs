//! Selective repeat for RC (issue 19), used only on QPs whose two ends
//! agreed to it through ECE-style options ([`Ece`], `Engine::set_ece`):
//! a QP without it is byte for byte the go-back-N transport.
//!
//! - **Responder**: a request ahead of the expected PSN is kept (up to
//!   [`softrdma_wire::sack::MAX_BITS`] PSNs ahead) instead of drawing a
//!   sequence NAK, and every ACK it sends while it holds any carries a
//!   SACK extension (`softrdma_wire::sack`) saying which PSNs past the
//!   ACK it has. When the missing PSN arrives, the held requests are
//!   executed in PSN order by the same `execute` as every in-order
//!   request: the same checks (one rule book), data placed at its address
//!   or against its receive WQE then, completions in order and exactly
//!   once, and a receive can never complete over a hole (its packets run
//!   in order, after the hole is filled).
//! - **Requester**: every send record carries a transmission sequence
//!   number. A SACK marks the records it covers held; a record not held
//!   while `DUP_THRESH` (3) packets sent after it were delivered is lost
//!   (RACK-style, so a lost retransmission is found the same way) and
//!   queued; queued PSNs go out before new packets, rebuilt from their
//!   records, and nothing else is sent again. Missing READ responses (or
//!   an atomic ACK) re-request only that READ (or atomic). A local ACK
//!   timeout sends the oldest unacknowledged PSN and every PSN not held
//!   again; an RNR NAK goes back as go-back-N does.

use std::collections::VecDeque;

use softrdma_wire::{sack, BthRepr, Headers, PacketRepr, Psn, SackRepr};

use crate::qp::Qp;
use crate::qp_attr::QpType;
use crate::requester::{Transmit, TxCtx};
use crate::resources::Resources;
use crate::timers::Timer;

/// An Enhanced Connection Establishment value, as `ibv_query_ece` /
/// `ibv_set_ece` carry it: a vendor and the options both ends agreed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Ece {
    /// The vendor the options belong to ([`Ece::SOFTRDMA_VENDOR`]; 0: none).
    pub vendor_id: u32,
    /// Option bits ([`Ece::SELECTIVE_REPEAT`]).
    pub options: u32,
}

impl Ece {
    /// softrdma's vendor ID in ECE (the IEEE OUI field is 24 bits; this is
    /// a private value, "SR" in its low bytes, that no OUI holder uses for ECE).
    pub const SOFTRDMA_VENDOR: u32 = 0x0053_5201;
    /// Selective repeat with SACK-carrying ACKs.
    pub const SELECTIVE_REPEAT: u32 = 1 << 0;
    /// Every option this engine can do.
    pub const SUPPORTED: Ece = Ece {
        vendor_id: Ece::SOFTRDMA_VENDOR,
        options: Ece::SELECTIVE_REPEAT,
    };

    /// What two ends offering `self` and `peer` agree to: the common
    /// options of the same vendor, nothing otherwise.
    pub fn agree(self, peer: Ece) -> Ece {
        if self.vendor_id != peer.vendor_id || self.vendor_id == 0 {
            return Ece::default();
        }
        Ece {
            vendor_id: self.vendor_id,
            options: self.options & peer.options,
        }
    }

    /// Whether selective repeat is on.
    pub fn selective_repeat(self) -> bool {
        self.vendor_id == Ece::SOFTRDMA_VENDOR && self.options & Ece::SELECTIVE_REPEAT != 0
    }
}

/// Packets sent after a missing one that must be delivered before it is
/// taken for lost (tolerates that much reordering).
pub(crate) const DUP_THRESH: u64 = 3;

/// A responder acknowledges at least every this many held requests.
pub(crate) const SACK_EVERY: usize = 4;

/// The tail-loss probe fires when no more than this many PSNs are in flight
/// and not known held (IRN's N for its short RTO).
pub(crate) const TAIL_PROBE_MAX: u32 = 3;

/// The tail-loss probe's wait after the last progress: an eighth of the
/// local ACK timeout, no less than 8 µs.
pub(crate) fn tail_probe_after(ack_timeout: std::time::Duration) -> std::time::Duration {
    (ack_timeout / 8).max(std::time::Duration::from_micros(8))
}

/// A request kept by a selective-repeat responder until the PSNs before it arrive.
#[derive(Debug, Clone)]
pub(crate) struct HeldPkt {
    bth: BthRepr,
    headers: Headers,
    payload: Box<[u8]>,
}

/// The responder's held requests: index *i* is PSN `epsn + i` (index 0 is
/// the missing one, always empty).
#[derive(Debug, Default)]
pub(crate) struct Held {
    slots: VecDeque<Option<HeldPkt>>,
    count: usize,
}

impl Held {
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn clear(&mut self) {
        self.slots.clear();
        self.count = 0;
    }

    /// `epsn` moved on by `n`: the slots it passed go.
    fn advance(&mut self, n: u32) {
        for _ in 0..n {
            match self.slots.pop_front() {
                Some(Some(_)) => self.count -= 1,
                Some(None) => {}
                None => break,
            }
        }
    }

    /// Takes the request at `epsn`, if held.
    fn take_front(&mut self) -> Option<HeldPkt> {
        let h = self.slots.front_mut()?.take()?;
        self.count -= 1;
        Some(h)
    }

    /// Offsets from `epsn` of the held requests.
    fn offsets(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .map(|(i, _)| i as u32)
    }
}

impl Qp {
    /// Whether this QP runs selective repeat (RC, and both ends agreed).
    pub(crate) fn sr(&self) -> bool {
        self.qp_type == QpType::Rc && self.ece.selective_repeat()
    }

    // ----- responder -----

    /// A request `d` PSNs ahead of the expected one: keep it, and say so.
    pub(crate) fn sr_hold(&mut self, res: &mut Resources, pkt: &PacketRepr<'_>, d: u32) {
        // Not every held request is acknowledged: one that starts a run
        // after a gap is (the sender learns of the hole at once), then
        // every `SACK_EVERY`th held, one asking for an ACK, a duplicate
        // and one that cannot be held. A SACK lists everything held, so
        // thinning loses nothing but per-packet ACK traffic.
        let mut ack = true;
        if d < sack::MAX_BITS && pkt.payload.len() <= self.mtu as usize {
            let d = d as usize;
            if self.resp.held.slots.len() <= d {
                self.resp.held.slots.resize(d + 1, None);
            }
            if self.resp.held.slots[d].is_none() {
                let after_gap = d == 0 || self.resp.held.slots[d - 1].is_none();
                ack = after_gap
                    || pkt.bth.ack_req
                    || (self.resp.held.count + 1).is_multiple_of(SACK_EVERY);
                self.resp.held.slots[d] = Some(HeldPkt {
                    bth: pkt.bth,
                    headers: pkt.headers,
                    payload: pkt.payload.into(),
                });
                self.resp.held.count += 1;
                self.counters.ooo_held += 1;
                res.counters.ooo_held += 1;
            } else {
                self.counters.duplicates += 1;
                res.counters.duplicates += 1;
            }
        }
        // Too far ahead to describe: dropped, the sender finds it lost.
        if ack {
            let last = self.resp.epsn.sub(1);
            self.queue_sr_ack(last);
        }
    }

    /// After an in-order request moved `epsn` on from `before`: drop the
    /// slots passed, then execute the held requests that are now in order.
    pub(crate) fn sr_after_execute(&mut self, res: &mut Resources, before: Psn) {
        self.resp.held.advance(self.resp.epsn.distance_from(before));
        let mut ran = false;
        while let Some(h) = self.resp.held.take_front() {
            let pkt = PacketRepr {
                bth: h.bth,
                headers: h.headers,
                payload: &h.payload,
            };
            let at = self.resp.epsn;
            if !self.execute_in_order(res, &pkt) {
                // RNR (the requester goes back; `epsn` did not move, and
                // its slot stays, empty) or an error (the QP is in ERR).
                break;
            }
            ran = true;
            self.resp.held.advance(self.resp.epsn.distance_from(at));
        }
        if ran && self.can_receive() {
            let last = self.resp.epsn.sub(1);
            self.queue_sr_ack(last);
        }
    }

    /// The SACK extension for an ACK of `psn`, or `None` when the
    /// responder holds nothing past it.
    pub(crate) fn sr_sack_for(&self, psn: Psn) -> Option<SackRepr> {
        if !self.sr() || self.resp.held.is_empty() {
            return None;
        }
        let mut s = SackRepr::new();
        let epsn = self.resp.epsn;
        // Executed after `psn` (an ACK queued before later requests ran).
        let done = epsn.distance_from(psn.next()).min(sack::MAX_BITS);
        for i in 0..done {
            s.set(i);
        }
        let base = epsn.distance_from(psn.next());
        for o in self.resp.held.offsets() {
            if !s.set(base + o) {
                break;
            }
        }
        Some(s)
    }

    /// Whether an ACK must go now because it carries a SACK (never held back).
    pub(crate) fn sr_acks_now(&self) -> bool {
        self.sr() && !self.resp.held.is_empty()
    }

    // ----- requester -----

    /// The PSNs the window counts: in flight and not known to be held.
    pub(crate) fn sr_window_inflight(&self, next: Psn) -> u32 {
        let d = next.distance_from(self.comp.una);
        d.saturating_sub(self.req.records.sacked())
    }

    /// A SACK extension came with an ACK of `psn`.
    pub(crate) fn sr_on_sack(&mut self, psn: Psn, s: &SackRepr) {
        let high = self.req.high;
        for p in s.held_psns(psn) {
            if !p.is_before(high) {
                break;
            }
            if let Some(seq) = self.req.records.sack(p) {
                self.req.delivered_seq = self.req.delivered_seq.max(seq);
            }
        }
    }

    /// An ACK for `psn` (SR): what it covers is delivered, including READ
    /// and atomic requests still waiting for their responses.
    pub(crate) fn sr_on_ack(&mut self, psn: Psn) {
        if let Some(seq) = self.req.records.sack_through(psn) {
            self.req.delivered_seq = self.req.delivered_seq.max(seq);
        }
    }

    /// Queues every record taken for lost (not held, and `DUP_THRESH`
    /// packets sent after it delivered) for one retransmission.
    pub(crate) fn sr_detect_losses(&mut self) {
        let delivered = self.req.delivered_seq;
        // Only news of a newer delivery makes another record lost.
        if delivered == self.req.lost_scan_at {
            return;
        }
        self.req.lost_scan_at = delivered;
        let sent_to = self.req.psn;
        for psn in self.req.records.mark_lost(delivered, DUP_THRESH, sent_to) {
            self.req.sr_queue.push_back((psn, false));
        }
    }

    /// Sends `psn` again even if it is held (missing READ responses or
    /// atomic ACK, or the head after a timeout).
    pub(crate) fn sr_force(&mut self, psn: Psn) {
        self.req.sr_queue.push_back((psn, true));
    }

    /// The local ACK timeout: the oldest unacknowledged PSN and every PSN
    /// not known held go again.
    pub(crate) fn sr_timeout(&mut self) {
        self.req.sr_queue.clear();
        self.req.records.clear_lost();
        self.req.lost_scan_at = 0;
        let una = self.comp.una;
        self.sr_force(una);
        let sent_to = self.req.psn;
        for psn in self.req.records.mark_lost(u64::MAX, 0, sent_to) {
            if psn != una {
                self.req.sr_queue.push_back((psn, false));
            }
        }
    }

    /// The tail-loss probe expired (no progress for [`tail_probe_after`]).
    /// When at most [`TAIL_PROBE_MAX`] PSNs are in flight and not known
    /// held (IRN's short RTO) — the tail of a window, where too few packets
    /// follow a loss for the SACKs to reveal it — they all go again. With
    /// more open (the lost packet may have been the one asking for the
    /// ACK, so nothing came back), the newest open one goes again alone
    /// (TCP's tail-loss probe): its ACK or SACK tells what is missing, and
    /// loss detection takes it from there. No retry is spent, and nothing
    /// changes on the wire but the retransmissions.
    pub(crate) fn sr_tail_probe(&mut self) {
        let open = self.sr_window_inflight(self.req.psn);
        if open == 0 {
            return;
        }
        let sent_to = self.req.psn;
        if open > TAIL_PROBE_MAX {
            if let Some(psn) = self.req.records.last_open(sent_to) {
                self.req.sr_queue.push_back((psn, false));
            }
            return;
        }
        self.req.records.clear_lost();
        self.req.lost_scan_at = 0;
        for psn in self.req.records.mark_lost(u64::MAX, 0, sent_to) {
            self.req.sr_queue.push_back((psn, false));
        }
    }

    /// The next selective retransmission, if one is queued and may go.
    pub(crate) fn sr_retransmit(
        &mut self,
        res: &mut Resources,
        ctx: &mut TxCtx<'_>,
    ) -> Option<Transmit> {
        while let Some(&(psn, force)) = self.req.sr_queue.front() {
            let una = self.comp.una;
            let wanted = !psn.is_before(una)
                && psn.is_before(self.req.psn)
                && self
                    .req
                    .records
                    .find(psn)
                    .is_some_and(|r| force || (!r.sacked && (r.psn == psn)));
            if !wanted {
                self.req.sr_queue.pop_front();
                continue;
            }
            let (idx, offset) = self.position_of(psn);
            if idx >= self.req.sq.len() {
                self.req.sr_queue.pop_front();
                continue;
            }
            let w = self.req.sq[idx].view();
            let bytes = if w.op.is_read_or_atomic() {
                0
            } else {
                w.len.saturating_sub(offset).min(u64::from(self.mtu)) as usize
            };
            // A retransmission replaces a packet the network lost: the
            // window does not count it, a rate does.
            if !self.congestion_allows_with(ctx.now, 0, bytes) {
                return None;
            }
            self.req.sr_queue.pop_front();
            let b = self.build_request(res, ctx, idx, offset, psn)?;
            if b.bth.ack_req {
                self.req.since_ack_req = 0;
            }
            self.record_sent(ctx.now, idx, offset, psn, &b, true);
            self.counters.retransmits += 1;
            res.counters.retransmits += 1;
            self.counters.sr_retransmits += 1;
            res.counters.sr_retransmits += 1;
            let dst = self.dest?;
            let (span, payload_len) = (b.span, b.payload_len);
            let tx = self.finish_packet_zc(res, ctx, b.bth, b.headers, payload_len, dst, b.zc);
            if let Some(t) = &tx {
                let sent = crate::congestion::SentPacket {
                    psn,
                    span,
                    bytes: t.len,
                    retransmit: true,
                };
                self.cc.on_sent(ctx.now, &sent);
            }
            if !self.timers.is_armed(Timer::Retransmit) {
                self.arm_ack_timer(ctx.now);
            }
            return tx;
        }
        None
    }
}
