//! A first-fit ring allocator for test buffers: never hands out a range that
//! overlaps one still in use, so that a buffer a WR reads from or writes to
//! stays untouched by the harness until that WR has completed.

use std::collections::BTreeMap;

use softrdma_engine::Rng;

pub struct Ring {
    size: u64,
    cursor: u64,
    /// start -> end of every live range (non-empty, pairwise disjoint).
    live: BTreeMap<u64, u64>,
}

impl Ring {
    pub fn new(size: u64) -> Self {
        Ring {
            size,
            cursor: 0,
            live: BTreeMap::new(),
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    fn first_fit_from(&self, mut s: u64, len: u64) -> Option<u64> {
        loop {
            if s + len > self.size {
                return None;
            }
            // Live ranges are disjoint and sorted, so the one starting last
            // before the end of [s, s+len) is the only one that can overlap it.
            match self.live.range(..s + len.max(1)).next_back() {
                Some((_, &b)) if b > s => s = b,
                _ => return Some(s),
            }
        }
    }

    /// A range of `len` bytes at an unaligned, slightly random offset.
    pub fn alloc(&mut self, len: u64, rng: &mut Rng) -> Option<u64> {
        if len > self.size {
            return None;
        }
        let gap = rng.below(40);
        let start = self
            .first_fit_from((self.cursor + gap).min(self.size), len)
            .or_else(|| self.first_fit_from(rng.below(8), len))
            .or_else(|| self.first_fit_from(0, len))?;
        if len > 0 {
            self.live.insert(start, start + len);
        }
        self.cursor = start + len;
        Some(start)
    }

    pub fn free(&mut self, start: u64, len: u64) {
        if len > 0 {
            let e = self.live.remove(&start);
            assert_eq!(e, Some(start + len), "freeing a range that is not live");
        }
    }
}
