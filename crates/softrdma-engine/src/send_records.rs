//! What an RC requester has in flight, packet by packet.
//!
//! Every request packet an RC QP transmits leaves a [`SendRecord`] — its
//! PSN, the WQE and the part of the message it carries, its opcode, when it
//! went out and whether it was a retransmission — until every PSN it
//! occupies is acknowledged. The records are what a retransmission is
//! rebuilt from: go-back-N finds the packet to go back to in them, and a
//! selective repeat could rebuild any single missing PSN the same way.
//!
//! They cover `[una, high)` without gaps, oldest first: a new packet
//! starts where the last one ended, a retransmission replaces the record of
//! its PSN, and acknowledgements drop them from the front. So there are at
//! most as many as PSNs in flight, which the congestion controller's window
//! bounds (and `congestion::MAX_WINDOW` whatever it says).

use std::collections::VecDeque;

use softrdma_wire::{Opcode, Psn};

use crate::time::Instant;

/// One request packet in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendRecord {
    pub psn: Psn,
    /// PSNs it occupies: 1, or for a READ request the responses it asks for.
    pub span: u32,
    /// The WQE it belongs to, by serial number (`SendWqe::serial`).
    pub wqe: u64,
    /// Where its payload starts in the message (a READ request: the first
    /// byte it asks for).
    pub offset: u64,
    /// Payload bytes (a READ request: bytes asked for; an atomic: 0).
    pub len: u32,
    pub opcode: Opcode,
    /// When it last went out.
    pub sent_at: Instant,
    /// It went out more than once.
    pub retransmitted: bool,
    /// Its place in the order of transmissions (every RC request packet,
    /// new or again, takes the next number): selective repeat finds a
    /// packet lost when enough packets sent after it were delivered.
    pub tx_seq: u64,
    /// Selective repeat: the responder said it holds it (a SACK, or an ACK
    /// covering a READ or atomic still waiting for its responses).
    pub sacked: bool,
    /// Selective repeat: taken for lost and queued to go again.
    pub lost: bool,
}

impl SendRecord {
    /// One past the last PSN it occupies.
    pub fn end(&self) -> Psn {
        self.psn.add(self.span)
    }
}

/// The records of one requester, and where new transmission resumes.
#[derive(Debug, Default)]
pub(crate) struct SendRecords {
    recs: VecDeque<SendRecord>,
    /// The position (WQE serial, offset in its message) of the packet at
    /// `high`, the first PSN never sent: where the requester continues
    /// once it has gone back and caught up. `None` before anything is sent.
    resume: Option<(u64, u64)>,
    /// Records marked `sacked`.
    sacked: u32,
}

impl SendRecords {
    /// Records a packet that went out. `resume` is the position of the
    /// packet after it, which becomes the resume position when the packet
    /// was new (sent at `high`).
    pub fn sent(&mut self, rec: SendRecord, new: bool, resume: (u64, u64)) {
        if new {
            debug_assert!(
                self.recs.back().is_none_or(|r| r.end() == rec.psn),
                "a new packet at {:?} does not follow the last record {:?}",
                rec.psn,
                self.recs.back()
            );
            self.recs.push_back(rec);
            self.resume = Some(resume);
            return;
        }
        match self.index_of(rec.psn) {
            // A READ asked for again from the middle: the PSNs before it
            // are acknowledged, so its record now starts there.
            Some(i) => {
                let r = &mut self.recs[i];
                debug_assert!(
                    r.end() == rec.end(),
                    "a retransmission {rec:?} changed the extent of {r:?}"
                );
                if r.sacked {
                    self.sacked -= 1;
                }
                *r = SendRecord {
                    retransmitted: true,
                    sacked: false,
                    lost: false,
                    ..rec
                };
            }
            None => debug_assert!(false, "a retransmission of {:?} has no record", rec.psn),
        }
    }

    /// Every PSN before `una` is acknowledged: drops the records it
    /// covers. Returns the highest transmission number among them.
    pub fn acked(&mut self, una: Psn) -> Option<u64> {
        let mut seq = None;
        while let Some(r) = self.recs.front() {
            if r.end().is_after(una) {
                break;
            }
            seq = seq.max(Some(r.tx_seq));
            if r.sacked {
                self.sacked -= 1;
            }
            self.recs.pop_front();
        }
        seq
    }

    /// Forgets everything (the send queue was flushed, or the PSNs were reset).
    pub fn clear(&mut self) {
        self.recs.clear();
        self.resume = None;
        self.sacked = 0;
    }

    /// Records marked held.
    pub fn sacked(&self) -> u32 {
        self.sacked
    }

    /// The packet starting at `psn` is held by the responder: marks it, and
    /// returns its transmission number if it was not marked before.
    pub fn sack(&mut self, psn: Psn) -> Option<u64> {
        let i = self.index_of(psn)?;
        let r = &mut self.recs[i];
        if r.psn != psn || r.sacked {
            return None;
        }
        r.sacked = true;
        r.lost = false;
        self.sacked += 1;
        Some(r.tx_seq)
    }

    /// An ACK for `psn`: every record starting at or before it is held
    /// (those left are READs and atomics waiting for responses). Returns
    /// the highest transmission number newly marked.
    pub fn sack_through(&mut self, psn: Psn) -> Option<u64> {
        let mut seq = None;
        for r in self.recs.iter_mut() {
            if r.psn.is_after(psn) {
                break;
            }
            if !r.sacked {
                r.sacked = true;
                r.lost = false;
                self.sacked += 1;
                seq = seq.max(Some(r.tx_seq));
            }
        }
        seq
    }

    /// Marks lost, and returns, the records not held and not yet marked
    /// that were sent (before `sent_to`) at least `thresh` transmissions
    /// before `delivered`, the newest transmission delivered.
    pub fn mark_lost(&mut self, delivered: u64, thresh: u64, sent_to: Psn) -> Vec<Psn> {
        let mut out = Vec::new();
        for r in self.recs.iter_mut() {
            if !r.psn.is_before(sent_to) {
                break;
            }
            if !r.sacked && !r.lost && r.tx_seq.saturating_add(thresh) <= delivered {
                r.lost = true;
                out.push(r.psn);
            }
        }
        out
    }

    /// The newest packet sent before `sent_to` that is not known held.
    pub fn last_open(&self, sent_to: Psn) -> Option<Psn> {
        self.recs
            .iter()
            .rev()
            .find(|r| r.psn.is_before(sent_to) && !r.sacked)
            .map(|r| r.psn)
    }

    /// No record is marked lost any more.
    pub fn clear_lost(&mut self) {
        for r in self.recs.iter_mut() {
            r.lost = false;
        }
    }

    fn index_of(&self, psn: Psn) -> Option<usize> {
        let first = self.recs.front()?.psn;
        let d = psn.distance_from(first);
        // Contiguous and oldest first: the one whose extent holds `psn`.
        let i = self
            .recs
            .partition_point(|r| r.end().distance_from(first) <= d);
        let r = self.recs.get(i)?;
        psn.in_window(r.psn, r.span).then_some(i)
    }

    /// The record of the packet that holds `psn`.
    pub fn find(&self, psn: Psn) -> Option<&SendRecord> {
        self.index_of(psn).map(|i| &self.recs[i])
    }

    /// Where the packet at `high` (never sent) starts.
    pub fn resume(&self) -> Option<(u64, u64)> {
        self.resume
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.recs.len()
    }

    /// Whether the records cover `[una, high)` exactly: the first holds
    /// `una`, each starts where the one before ended, the last ends at
    /// `high` (none when everything is acknowledged).
    pub fn cover(&self, una: Psn, high: Psn) -> bool {
        let Some(first) = self.recs.front() else {
            return una == high;
        };
        let mut at = first.psn;
        for r in &self.recs {
            if r.psn != at || r.span == 0 {
                return false;
            }
            at = r.end();
        }
        una.in_window(first.psn, first.span) && at == high
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(psn: u32, span: u32, wqe: u64, offset: u64) -> SendRecord {
        SendRecord {
            psn: Psn::new(psn),
            span,
            wqe,
            offset,
            len: 1024,
            opcode: Opcode::RC_SEND_MIDDLE,
            sent_at: Instant(0),
            retransmitted: false,
            tx_seq: 0,
            sacked: false,
            lost: false,
        }
    }

    #[test]
    fn records_cover_the_psns_in_flight_across_the_wrap() {
        let mut r = SendRecords::default();
        // Two SEND packets, a READ of 4 responses, one more SEND: across
        // the 24-bit wrap.
        let start = 0xFF_FFFE;
        r.sent(rec(start, 1, 0, 0), true, (0, 1024));
        r.sent(rec(0xFF_FFFF, 1, 0, 1024), true, (1, 0));
        r.sent(rec(0, 4, 1, 0), true, (2, 0));
        r.sent(rec(4, 1, 2, 0), true, (3, 0));
        assert_eq!(r.len(), 4);
        assert_eq!(r.find(Psn::new(start)).unwrap().wqe, 0);
        assert_eq!(r.find(Psn::new(2)).unwrap().psn, Psn::new(0));
        assert_eq!(r.find(Psn::new(4)).unwrap().wqe, 2);
        assert!(r.find(Psn::new(5)).is_none(), "never sent");
        assert_eq!(r.resume(), Some((3, 0)));
        // The first two PSNs and two READ responses are acknowledged.
        r.acked(Psn::new(2));
        assert_eq!(r.len(), 2);
        assert!(r.find(Psn::new(0xFF_FFFF)).is_none());
        // The READ is asked for again from its third response.
        let mut again = rec(2, 2, 1, 2048);
        again.sent_at = Instant(77);
        r.sent(again, false, (2, 0));
        let got = r.find(Psn::new(3)).unwrap();
        assert_eq!(
            (got.psn, got.offset, got.retransmitted),
            (Psn::new(2), 2048, true)
        );
        assert_eq!(
            r.resume(),
            Some((3, 0)),
            "a retransmission does not move it"
        );
        assert!(r.cover(Psn::new(2), Psn::new(5)));
        assert!(!r.cover(Psn::new(2), Psn::new(6)));
        r.acked(Psn::new(5));
        assert_eq!(r.len(), 0);
        assert!(r.cover(Psn::new(5), Psn::new(5)));
        r.clear();
        assert_eq!(r.resume(), None);
    }
}
