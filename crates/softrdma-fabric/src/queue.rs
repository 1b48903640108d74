//! The event queue: a calendar queue (a wheel of 2^18 buckets 4.1 ns wide
//! covering about a millisecond, with a heap for what lies further out).
//! Events come out in (time, sequence) order exactly as from one binary
//! heap, so the run does not depend on the queue's layout; pushing into a
//! future bucket costs O(1), only the bucket being drained is sorted
//! (a few events), and what is pushed into it meanwhile goes to a small
//! heap.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Bucket width: 2^12 ps (4.1 ns: a few events per bucket on a busy
/// 1,024-host fabric, so sorting one is cheap).
const SHIFT: u32 = 12;
/// Buckets in the wheel (2^18 × 4.1 ns ≈ 1.07 ms).
const BUCKETS: usize = 1 << 18;

/// A (time, sequence)-ordered queue of `T`.
#[derive(Debug)]
pub struct CalendarQueue<T: Ord> {
    buckets: Vec<Vec<(u64, u64, T)>>,
    /// The bucket being drained (absolute index).
    cur: u64,
    /// Its events, sorted latest first (popped from the end).
    now: Vec<(u64, u64, T)>,
    /// Events pushed into the bucket being drained after it was sorted.
    late: BinaryHeap<Reverse<(u64, u64, T)>>,
    /// Events beyond the wheel.
    far: BinaryHeap<Reverse<(u64, u64, T)>>,
    in_wheel: usize,
    len: usize,
    /// Drained vectors, reused by empty buckets (a bucket does not keep
    /// its vector once drained, so memory follows the events pending).
    spare: Vec<Vec<(u64, u64, T)>>,
}

impl<T: Ord> Default for CalendarQueue<T> {
    fn default() -> Self {
        CalendarQueue {
            buckets: (0..BUCKETS).map(|_| Vec::new()).collect(),
            cur: 0,
            now: Vec::new(),
            late: BinaryHeap::new(),
            far: BinaryHeap::new(),
            in_wheel: 0,
            len: 0,
            spare: Vec::new(),
        }
    }
}

impl<T: Ord> CalendarQueue<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `item` at time `t` with tie-breaker `seq` (unique, increasing).
    pub fn push(&mut self, t: u64, seq: u64, item: T) {
        self.len += 1;
        let b = t >> SHIFT;
        if b <= self.cur {
            self.late.push(Reverse((t, seq, item)));
        } else if b < self.cur + BUCKETS as u64 {
            let slot = &mut self.buckets[b as usize & (BUCKETS - 1)];
            if slot.capacity() == 0 {
                if let Some(v) = self.spare.pop() {
                    *slot = v;
                }
            }
            slot.push((t, seq, item));
            self.in_wheel += 1;
        } else {
            self.far.push(Reverse((t, seq, item)));
        }
    }

    /// The time of the earliest event, without taking it (it may move on
    /// to the bucket that holds it, as `pop` would).
    pub fn peek_time(&mut self) -> Option<u64> {
        loop {
            match (self.now.last(), self.late.peek()) {
                (Some(a), Some(Reverse(b))) => return Some(a.0.min(b.0)),
                (Some(a), None) => return Some(a.0),
                (None, Some(Reverse(b))) => return Some(b.0),
                (None, None) => {
                    if self.len == 0 {
                        return None;
                    }
                    self.advance();
                }
            }
        }
    }

    /// The earliest event.
    pub fn pop(&mut self) -> Option<(u64, u64, T)> {
        loop {
            let take_late = match (self.now.last(), self.late.peek()) {
                (Some(a), Some(Reverse(b))) => (b.0, b.1) < (a.0, a.1),
                (None, Some(_)) => true,
                (Some(_), None) => false,
                (None, None) => {
                    if self.len == 0 {
                        return None;
                    }
                    self.advance();
                    continue;
                }
            };
            self.len -= 1;
            return if take_late {
                self.late.pop().map(|Reverse(e)| e)
            } else {
                self.now.pop()
            };
        }
    }

    /// Moves on to the next bucket with events (or the first far event's).
    fn advance(&mut self) {
        if self.in_wheel == 0 {
            // Only far events: jump to the first.
            if let Some(Reverse((t, _, _))) = self.far.peek() {
                self.cur = t >> SHIFT;
            }
        } else {
            self.cur += 1;
        }
        let slot = std::mem::take(&mut self.buckets[self.cur as usize & (BUCKETS - 1)]);
        // The drained (empty) vector is kept for a bucket that needs one.
        let drained = std::mem::replace(&mut self.now, slot);
        if drained.capacity() > 0 && self.spare.len() < 4096 {
            self.spare.push(drained);
        }
        self.in_wheel -= self.now.len();
        while let Some(Reverse((t, _, _))) = self.far.peek() {
            if t >> SHIFT > self.cur {
                break;
            }
            let Some(Reverse(e)) = self.far.pop() else {
                break;
            };
            self.now.push(e);
        }
        if self.now.len() > 1 {
            self.now.sort_unstable_by_key(|e| Reverse((e.0, e.1)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_engine::Rng;

    #[test]
    fn pops_in_the_order_of_one_binary_heap() {
        let mut q = CalendarQueue::default();
        let mut h = BinaryHeap::new();
        let mut rng = Rng::new(5);
        let mut seq = 0;
        let mut now = 0;
        for round in 0..20_000 {
            for _ in 0..rng.below(4) {
                // Mostly near, some far (timers), some at `now`.
                let dt = match rng.below(10) {
                    0 => 0,
                    1 => rng.below(1 << 40),
                    _ => rng.below(1 << 22),
                };
                seq += 1;
                q.push(now + dt, seq, round);
                h.push(Reverse((now + dt, seq, round)));
            }
            if rng.below(3) > 0 {
                let a = q.pop();
                let b = h.pop().map(|Reverse(e)| e);
                assert_eq!(a, b);
                if let Some((t, _, _)) = a {
                    now = t;
                }
            }
            assert_eq!(q.len(), h.len());
        }
        while let Some(Reverse(e)) = h.pop() {
            assert_eq!(q.pop(), Some(e));
        }
        assert!(q.pop().is_none() && q.is_empty());
    }
}
