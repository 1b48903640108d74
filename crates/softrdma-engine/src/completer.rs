//! The completer of a QP (the part rxe keeps as `rxe_comp.c`): takes the
//! responses an RC requester gets back — ACKs, NAKs, RNR NAKs, READ
//! responses, atomic ACKs — and the retry timer, and retires send WQEs:
//! completions in order, the oldest unacknowledged PSN moved on, the
//! congestion controller told what was acknowledged. It decides what
//! happens after a loss (which PSN the requester goes back to, how many
//! retries are left, how long an RNR NAK makes it wait) and leaves the
//! sending to the requester (`requester.rs`).
//!
//! Its state is [`Completer`]; the WQEs are the requester's send queue,
//! which both halves share (the requester appends and transmits, the
//! completer retires from the front).

use std::time::Duration;

use softrdma_wire::{aeth, Headers, NakCode, OpKind, PacketRepr, Position, Psn, Syndrome};

use crate::qp::Qp;
use crate::requester::consumes_rq;
use crate::resources::Resources;
use crate::rules;
use crate::time::{local_ack_timeout, Instant};
use crate::timers::Timer;
use crate::wr::{SendOp, WcStatus};

/// What the completer knows of the peer's progress.
#[derive(Debug, Default)]
pub(crate) struct Completer {
    /// Oldest unacknowledged PSN.
    pub una: Psn,
    pub retry_left: u8,
    pub rnr_retry_left: u8,
    /// The oldest unacknowledged PSN at which missing READ responses (or a
    /// missing atomic ACK) were last asked for again; cleared on progress.
    pub read_gap: Option<Psn>,
    /// An error NAK for this PSN that arrived while an earlier READ or atomic
    /// still lacked its responses: the WQE holding the PSN fails with this
    /// status once those are in.
    pub pending_nak: Option<(Psn, WcStatus)>,
    /// End-to-end credits: receive-consuming messages acknowledged.
    pub rq_msgs_acked: u64,
    /// Selective repeat: the newest PSN a positive ACK covered. An ACK
    /// past a READ still missing responses cannot retire the WQEs behind
    /// it; once the READ completes, they are (go-back-N sends them again
    /// instead).
    pub sr_acked: Option<Psn>,
    /// Receive-consuming messages the responder can take, counted from `rq_msgs_acked`
    /// at the last ACK; `None` = unlimited (SRQ responders, or no ACK yet with credits).
    pub credit_limit: Option<u64>,
}

impl Qp {
    pub(crate) fn arm_ack_timer(&mut self, now: Instant) {
        let d = local_ack_timeout(self.attr.timeout);
        self.timers.set_opt(Timer::Retransmit, d.map(|d| now + d));
        // Selective repeat also arms its tail-loss probe (`sr.rs`).
        let probe = d
            .filter(|_| self.sr())
            .map(|d| now + crate::sr::tail_probe_after(d));
        self.timers.set_opt(Timer::TailProbe, probe);
    }

    fn progress(&mut self, now: Instant, new_una: Psn) {
        if new_una.is_after(self.comp.una) {
            let count = new_una.distance_from(self.comp.una);
            self.cc.on_ack(now, self.comp.una, count);
            self.comp.una = new_una;
            let seq = self.req.records.acked(new_una);
            if let Some(seq) = seq {
                self.req.delivered_seq = self.req.delivered_seq.max(seq);
            }
            self.comp.retry_left = self.attr.retry_cnt;
            self.comp.rnr_retry_left = self.attr.rnr_retry;
            self.comp.read_gap = None;
            if self.comp.una == self.req.high {
                self.timers.stop(Timer::Retransmit);
                self.timers.stop(Timer::TailProbe);
            } else {
                self.arm_ack_timer(now);
            }
        }
    }

    fn is_active(&self) -> bool {
        rules::requester_active(self.state)
    }

    /// Completes the head WQEs that an acknowledgement of every PSN up to and
    /// including `psn` finishes: SEND and WRITE WQEs whose last PSN it covers.
    /// READ and atomic WQEs finish only with their own responses, so the walk
    /// stops at the first one; if `psn` covers it, its responses went missing
    /// (lost, or overtaken) and `true` is returned.
    fn ack_through(&mut self, res: &mut Resources, psn: Psn) -> bool {
        while let Some(w) = self.req.sq.front() {
            if !w.assigned || w.first_psn.is_after(psn) {
                return false;
            }
            if w.op.is_read_or_atomic() {
                // Missing unless every response up to `psn` is in (a NAK in
                // the middle of a READ's responses follows those before it).
                return !w.first_psn.add(w.read_done).is_after(psn);
            }
            if w.last_psn().is_after(psn) {
                return false;
            }
            if consumes_rq(&w.op) {
                self.comp.rq_msgs_acked += 1;
            }
            self.complete_head(res, WcStatus::Success);
        }
        false
    }

    /// Bookkeeping once everything up to `acked` is acknowledged and the
    /// finished WQEs are completed: move `una`, fail a WQE an earlier error
    /// NAK was waiting for, and keep the send pointer at or after `una`.
    fn after_ack(&mut self, res: &mut Resources, acked: Psn, now: Instant) {
        let una = match self.req.sq.front() {
            Some(w) if w.assigned => {
                if w.op.is_read_or_atomic() {
                    w.first_psn.add(w.read_done)
                } else if w.first_psn.is_after(acked) {
                    w.first_psn
                } else {
                    acked.next()
                }
            }
            _ => acked.next(),
        };
        self.progress(now, una);
        if let Some((p, status)) = self.comp.pending_nak {
            if let Some(w) = self.req.sq.front() {
                if !w.assigned || w.first_psn.is_after(p) {
                    self.comp.pending_nak = None;
                } else if p.in_window(w.first_psn, w.npkts) {
                    self.comp.pending_nak = None;
                    self.fail_head(res, status);
                    return;
                }
            }
        }
        // Completing a WQE that was being retransmitted leaves the send
        // pointer behind `una`: skip what the peer already has.
        if self.req.psn.is_before(self.comp.una) {
            let una = self.comp.una;
            self.rewind(una);
        }
    }

    /// Responses of the READ or atomic at `una` are missing: ask again,
    /// once per gap (a timeout asks again if the re-request is lost too).
    fn resend_missing_responses(&mut self) {
        let una = self.comp.una;
        if self.comp.read_gap != Some(una) {
            self.comp.read_gap = Some(una);
            if self.sr() {
                // Selective repeat: only that READ (or atomic) goes again.
                self.sr_force(una);
            } else {
                self.rewind(una);
            }
        }
    }

    /// An ACK, NAK, RNR NAK, READ response or atomic ACK arrived. The
    /// steps, as in rxe's completer: is the QP an active RC requester, was
    /// the PSN ever sent; then by kind — an ACK or NAK
    /// ([`Self::handle_aeth`]: acknowledge, then act on the NAK), a READ
    /// response or an atomic ACK (acknowledge the WQEs before it, check it
    /// fits its WQE, deliver the data, complete) — and at the end of each,
    /// `una` moved on, the retry timer re-armed or stopped, the congestion
    /// controller told, and the requester sent back where anything is
    /// missing.
    pub(crate) fn handle_response(
        &mut self,
        res: &mut Resources,
        pkt: &PacketRepr<'_>,
        now: Instant,
    ) {
        if !self.is_active() || !crate::rules::sends_requests_reliably(self.qp_type) {
            self.counters.dropped += 1;
            res.counters.dropped += 1;
            return;
        }
        let psn = pkt.bth.psn;
        // A response for a PSN never sent is bogus.
        if !psn.is_before(self.req.high) {
            self.counters.dropped += 1;
            res.counters.dropped += 1;
            return;
        }
        let info = pkt.bth.opcode.info();
        match info.kind {
            OpKind::Ack => {
                let Some(a) = pkt.headers.aeth() else { return };
                if self.sr() {
                    if let Syndrome::Ack { .. } = a.syndrome {
                        self.sr_on_ack(psn);
                    }
                }
                self.handle_aeth(res, psn, a.syndrome, now);
                if self.sr() && self.is_active() && !pkt.payload.is_empty() {
                    if let Ok(s) = softrdma_wire::SackRepr::parse(pkt.payload) {
                        self.sr_on_sack(psn, &s);
                    }
                }
            }
            OpKind::ReadResponse => self.handle_read_response(res, pkt, now),
            OpKind::AtomicAck => {
                if let Headers::AtomicAck(a, orig) = pkt.headers {
                    if let Syndrome::Ack { .. } = a.syndrome {
                        self.handle_atomic_ack(res, psn, orig, now);
                    } else {
                        self.handle_aeth(res, psn, a.syndrome, now);
                    }
                }
            }
            _ => {}
        }
        if self.sr() && self.is_active() {
            self.sr_detect_losses();
        }
    }

    /// An ACK or NAK (alone, or in place of an atomic ACK's result).
    fn handle_aeth(&mut self, res: &mut Resources, psn: Psn, syn: Syndrome, now: Instant) {
        match syn {
            Syndrome::Ack { credits } => self.handle_ack(res, psn, credits, now),
            _ => self.handle_nak(res, psn, syn, now),
        }
    }

    /// A positive ACK of every PSN up to `psn`, with the responder's credits.
    fn handle_ack(&mut self, res: &mut Resources, psn: Psn, credits: u8, now: Instant) {
        if psn.next().is_before(self.comp.una) {
            // Older than anything outstanding: a stale duplicate.
            return;
        }
        if self.sr() && self.comp.sr_acked.is_none_or(|p| psn.is_after(p)) {
            self.comp.sr_acked = Some(psn);
        }
        let missing = self.ack_through(res, psn);
        self.after_ack(res, psn, now);
        if !self.is_active() {
            return;
        }
        if missing {
            self.resend_missing_responses();
        }
        if self.srq_peer_credits(credits) {
            self.comp.credit_limit =
                aeth::credits_from_code(credits).map(|c| self.comp.rq_msgs_acked + u64::from(c));
        }
    }

    /// A NAK for `psn`: every PSN before it is acknowledged, then the NAK
    /// itself is acted on.
    fn handle_nak(&mut self, res: &mut Resources, psn: Psn, syn: Syndrome, now: Instant) {
        // A NAK for a PSN before `una` comes from before a retransmission
        // that has since been acknowledged: stale, and acting on it would
        // rewind into completed work.
        if psn.is_before(self.comp.una) {
            return;
        }
        self.cc.on_nak(now, psn, syn);
        let before = self.comp.una;
        let missing = self.ack_through(res, psn.sub(1));
        self.after_ack(res, psn.sub(1), now);
        if !self.is_active() {
            return;
        }
        match syn {
            Syndrome::Ack { .. } => {}
            Syndrome::RnrNak { timer } => self.rnr_nak(res, timer, now),
            Syndrome::Nak(NakCode::PsnSequenceError) => self.sequence_nak(res, psn, before, now),
            Syndrome::Nak(code) => self.error_nak(res, psn, code, missing),
        }
    }

    /// The responder had no receive WQE: wait as long as it asked, then go
    /// back to the oldest unacknowledged PSN, while RNR retries last.
    fn rnr_nak(&mut self, res: &mut Resources, timer: u8, now: Instant) {
        self.counters.rnr_naks_rcvd += 1;
        res.counters.rnr_naks_rcvd += 1;
        if self.comp.rnr_retry_left == 0 {
            self.fail_head(res, WcStatus::RnrRetryExcErr);
            return;
        }
        // 7 means retry for ever.
        if self.comp.rnr_retry_left != 7 {
            self.comp.rnr_retry_left -= 1;
        }
        let una = self.comp.una;
        self.rewind(una);
        let wait = Duration::from_micros(aeth::rnr_timer_micros(timer));
        self.timers.set(Timer::RnrWait, now + wait);
        self.timers.stop(Timer::Retransmit);
        self.timers.stop(Timer::TailProbe);
    }

    /// The responder expected another PSN: go back (go-back-N), spending a
    /// retry when it still expects our oldest unacknowledged PSN. `before`
    /// is `una` as it was before the NAK's implied acknowledgement.
    fn sequence_nak(&mut self, res: &mut Resources, psn: Psn, before: Psn, now: Instant) {
        self.counters.seq_naks_rcvd += 1;
        res.counters.seq_naks_rcvd += 1;
        // A NAK for a later PSN shows the responder got everything before:
        // if una did not move, what is missing are our READ responses (or
        // atomic ACK), which are asked for again below; the local ACK
        // timeout still bounds a path that loses them all.
        if self.comp.una == before && psn == self.comp.una {
            if self.comp.retry_left == 0 {
                self.fail_head(res, WcStatus::RetryExcErr);
                return;
            }
            self.comp.retry_left -= 1;
        }
        // Go back to the oldest unacknowledged PSN: the NAKed one, or an
        // earlier READ whose responses are missing.
        let una = self.comp.una;
        self.rewind(una);
        self.arm_ack_timer(now);
    }

    /// The responder refused the request at `psn` (and went to ERR): its WQE
    /// fails, once the responses of earlier READs and atomics are in
    /// (`missing`: they are not).
    fn error_nak(&mut self, res: &mut Resources, psn: Psn, code: NakCode, missing: bool) {
        let status = match code {
            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
            NakCode::RemoteOperationalError => WcStatus::RemOpErr,
            _ => WcStatus::RemInvReqErr,
        };
        if missing {
            // The responder executed an earlier READ or atomic whose
            // responses have not arrived: get them, then fail the NAKed WQE.
            self.comp.pending_nak = Some((psn, status));
            self.resend_missing_responses();
        } else {
            // The head holds the NAKed PSN.
            self.fail_head(res, status);
        }
    }

    fn srq_peer_credits(&self, code: u8) -> bool {
        // 0x1F (invalid) means the responder does not count: no limit.
        code != aeth::CREDITS_INVALID || self.comp.credit_limit.is_some()
    }

    /// The WQE holding a response's PSN, if it was sent.
    fn wqe_holding(&self, psn: Psn) -> Option<usize> {
        self.req
            .sq
            .iter()
            .position(|w| w.assigned && psn.in_window(w.first_psn, w.npkts))
    }

    /// A response for WQE `idx` acknowledges the SEND and WRITE WQEs before it.
    /// Returns false when an earlier READ or atomic still lacks its responses
    /// (they are asked for again) or the QP failed: the response is then ignored.
    fn ack_before(&mut self, res: &mut Resources, idx: usize, now: Instant) -> bool {
        if idx == 0 {
            return true;
        }
        let before = self.req.sq[idx].first_psn.sub(1);
        let missing = self.ack_through(res, before);
        self.after_ack(res, before, now);
        if !self.is_active() {
            return false;
        }
        if missing {
            self.resend_missing_responses();
            return false;
        }
        true
    }

    /// A response that does not fit the WQE it is for (a READ response for a
    /// WRITE, an atomic ACK for a READ, a response of the wrong size): the
    /// WQE fails with BAD_RESP_ERR.
    fn bad_response(&mut self, res: &mut Resources, idx: usize, now: Instant) {
        if idx > 0 && !self.ack_before(res, idx, now) && !self.is_active() {
            return;
        }
        if self.is_active() {
            self.fail_head(res, WcStatus::BadRespErr);
        }
    }

    fn handle_read_response(&mut self, res: &mut Resources, pkt: &PacketRepr<'_>, now: Instant) {
        let psn = pkt.bth.psn;
        if psn.is_before(self.comp.una) {
            return; // duplicate of something already received
        }
        let Some(idx) = self.wqe_holding(psn) else {
            return;
        };
        if !matches!(self.req.sq[idx].op, SendOp::Read { .. }) {
            self.bad_response(res, idx, now);
            return;
        }
        if !self.ack_before(res, idx, now) {
            return;
        }
        // The READ is the head now.
        let w = &self.req.sq[0];
        let expected = w.first_psn.add(w.read_done);
        if psn != expected {
            if psn.is_after(expected) {
                // A response went missing (or is late): ask again from it.
                self.resend_missing_responses();
            }
            return;
        }
        let mtu = u64::from(self.mtu);
        let offset = u64::from(w.read_done) * mtu;
        let remaining = w.len - offset;
        let is_last_pkt = w.read_done + 1 == w.npkts;
        // A READ re-requested from the middle is answered starting with FIRST
        // (or ONLY), so the position only has to agree with "last or not".
        let pos = pkt.bth.opcode.info().position;
        let pos_ok = if is_last_pkt {
            matches!(pos, Position::Last | Position::Only)
        } else {
            matches!(pos, Position::First | Position::Middle)
        };
        let want_len = remaining.min(mtu) as usize;
        if !pos_ok || pkt.payload.len() != want_len {
            self.bad_response(res, 0, now);
            return;
        }
        let sges = w.sges.clone();
        if let Err(s) = res.scatter(&sges, self.pd, offset, pkt.payload) {
            self.fail_head(res, s);
            return;
        }
        self.req.sq[0].read_done += 1;
        if is_last_pkt {
            self.complete_head(res, WcStatus::Success);
        }
        self.after_ack(res, psn, now);
        if is_last_pkt {
            self.sr_catch_up(res, now);
        }
    }

    /// Selective repeat, after a READ or atomic completed: what an earlier
    /// ACK past it covered is acknowledged now.
    fn sr_catch_up(&mut self, res: &mut Resources, now: Instant) {
        let Some(p) = self.comp.sr_acked.filter(|_| self.sr() && self.is_active()) else {
            return;
        };
        if !p.is_before(self.comp.una) && p.is_before(self.req.high) {
            let missing = self.ack_through(res, p);
            self.after_ack(res, p, now);
            if missing && self.is_active() {
                self.resend_missing_responses();
            }
        }
    }

    fn handle_atomic_ack(&mut self, res: &mut Resources, psn: Psn, orig: u64, now: Instant) {
        if psn.is_before(self.comp.una) {
            return;
        }
        let Some(idx) = self.wqe_holding(psn) else {
            return;
        };
        if !self.req.sq[idx].op.is_atomic() {
            self.bad_response(res, idx, now);
            return;
        }
        if !self.ack_before(res, idx, now) {
            return;
        }
        let sges = self.req.sq[0].sges.clone();
        if let Err(s) = res.scatter(&sges, self.pd, 0, &orig.to_ne_bytes()) {
            self.fail_head(res, s);
            return;
        }
        self.req.sq[0].read_done = 1;
        self.complete_head(res, WcStatus::Success);
        self.after_ack(res, psn, now);
        self.sr_catch_up(res, now);
    }

    /// The local ACK timer or the RNR wait expired.
    pub(crate) fn handle_completer_timeout(&mut self, res: &mut Resources, now: Instant) {
        if self.timers.expired(Timer::RnrWait, now) {
            self.timers.stop(Timer::RnrWait);
            self.arm_ack_timer(now);
        }
        if self.timers.expired(Timer::TailProbe, now) {
            // Once per progress: `arm_ack_timer` arms it again.
            self.timers.stop(Timer::TailProbe);
            if self.sr()
                && self.is_active()
                && self.comp.una != self.req.high
                && self.req.psn == self.req.high
                && !self.timers.is_armed(Timer::RnrWait)
            {
                self.sr_tail_probe();
            }
        }
        if !self.timers.expired(Timer::Retransmit, now) {
            return;
        }
        if self.comp.una == self.req.high {
            self.timers.stop(Timer::Retransmit);
            self.timers.stop(Timer::TailProbe);
            return;
        }
        self.counters.timeouts += 1;
        res.counters.timeouts += 1;
        self.cc.on_timeout(now);
        if self.comp.retry_left == 0 {
            self.fail_head(res, WcStatus::RetryExcErr);
            return;
        }
        self.comp.retry_left -= 1;
        self.comp.read_gap = None;
        if self.sr() && self.req.psn == self.req.high {
            // Selective repeat: the head and whatever is not held go again.
            self.sr_timeout();
        } else {
            let una = self.comp.una;
            self.rewind(una);
        }
        self.arm_ack_timer(now);
    }
}
