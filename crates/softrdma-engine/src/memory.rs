//! How the engine reaches registered memory.
//!
//! A memory region's bytes belong to the application (or to shared memory),
//! not to the engine, and remote peers write them while the application may
//! be reading them. So the engine never holds a `&[u8]` into a region: it
//! copies in and out through this narrow trait, after checking keys, bounds
//! and access rights itself. Drivers implement it over real process memory;
//! tests implement it over a model that also asserts every access stays
//! inside the region ([`VecMemory`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The bytes behind one memory region, addressed by offset from its start.
///
/// The engine guarantees `offset + len <= self.len()` on every call, and
/// 8-byte alignment (relative to the region's virtual address) for atomics.
pub trait RegionMemory: Send + Sync {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True when the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `dst.len()` bytes starting at `offset` into `dst`.
    fn read(&self, offset: usize, dst: &mut [u8]);
    /// Copies `src` into the region at `offset`.
    fn write(&self, offset: usize, src: &[u8]);
    /// Atomically: `old = *p; if old == compare { *p = swap }; old` on the
    /// native-endian u64 at `offset`.
    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> u64;
    /// Atomically: `old = *p; *p = old + add; old` (wrapping).
    fn fetch_add(&self, offset: usize, add: u64) -> u64;

    /// On-demand paging: makes the `len` bytes at `offset` present for a
    /// read (or, with `write`, for a write), as an ODP HCA resolves a page
    /// fault before it touches the page. False when they cannot be made
    /// present — part of the range is not mapped in the process, or not
    /// writable for a write — and the access then fails as an unresolvable
    /// page fault fails on real hardware: the responder answers with a
    /// remote access error NAK, a local SGE completes with a local
    /// protection error. The engine calls it right before every read,
    /// write and atomic, for exactly the bytes it touches. Regions whose
    /// pages are all present while registered (pinned ones) keep the
    /// default: true.
    fn resolve(&self, offset: usize, len: usize, write: bool) -> bool {
        let _ = (offset, len, write);
        true
    }

    /// [`Self::write`], reporting whether every byte was written: false
    /// when part of the range turned out not writable (an on-demand-paging
    /// region over a read-only or since unmapped page, whose
    /// [`Self::resolve`] only faults pages in). The engine writes through
    /// this and fails the access like an unresolvable fault when it is
    /// false. Default: [`Self::write`], true.
    fn try_write(&self, offset: usize, src: &[u8]) -> bool {
        self.write(offset, src);
        true
    }

    /// For zero-copy sends ([`crate::Engine::poll_transmit_gather`]) and
    /// the direct path ([`crate::Engine::plan_direct`]): the address of the
    /// byte at `offset` in the driver's process, when the driver can let the
    /// kernel read the bytes from there while it sends. A region that
    /// offers addresses is one contiguous mapping: the address of `offset`
    /// is that of 0 plus `offset`.
    /// The engine never reads through it; it only hands it back in
    /// [`crate::TxPayload`]. `None` (the default): the engine copies the
    /// payload into the packet.
    fn tx_addr(&self, offset: usize) -> Option<usize> {
        let _ = offset;
        None
    }

    /// The CRC-32 continuing from `crc` over `head` and then the `len`
    /// bytes at `offset` (as `softrdma_wire::icrc::crc32` computes it):
    /// the ICRC of a payload sent by reference. The default reads the
    /// bytes out with [`Self::read`]; drivers read them in place.
    fn crc32(&self, crc: u32, head: &[u8], offset: usize, len: usize) -> u32 {
        let mut buf = vec![0u8; len];
        self.read(offset, &mut buf);
        softrdma_wire::icrc::crc32(crc, head, &buf)
    }
}

/// A region model backed by a `Vec`, for tests and simulation. Every access
/// is bounds-checked with an assertion: the engine must never ask for bytes
/// outside the region, and a test that makes it do so fails loudly.
#[derive(Debug)]
pub struct VecMemory {
    bytes: Mutex<Vec<u8>>,
    accesses: AtomicU64,
    /// Pretends to offer zero-copy sends ([`Self::by_reference`]).
    by_reference: bool,
}

/// The pretend address of byte 0 of a [`VecMemory::by_reference`] region.
pub const VEC_MEMORY_TX_BASE: usize = 0x5A00_0000_0000;

impl VecMemory {
    /// A zero-filled region of `len` bytes.
    pub fn new(len: usize) -> Self {
        Self::from_vec(vec![0; len])
    }

    /// A region holding `bytes`.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        VecMemory {
            bytes: Mutex::new(bytes),
            accesses: AtomicU64::new(0),
            by_reference: false,
        }
    }

    /// A zero-filled region that offers its bytes for sends by reference
    /// ([`RegionMemory::tx_addr`]) at the pretend address
    /// [`VEC_MEMORY_TX_BASE`]` + offset`: the engine then leaves payloads
    /// in it, and whoever carries the packets fills them in with
    /// [`crate::Engine::copy_payload`] (the simulator does).
    pub fn by_reference(len: usize) -> Self {
        VecMemory {
            by_reference: true,
            ..Self::new(len)
        }
    }

    /// A copy of the current contents.
    pub fn snapshot(&self) -> Vec<u8> {
        self.lock().clone()
    }

    /// Overwrites bytes from the application side.
    pub fn fill_from(&self, offset: usize, src: &[u8]) {
        self.lock()[offset..offset + src.len()].copy_from_slice(src);
    }

    /// Number of engine accesses so far.
    pub fn accesses(&self) -> u64 {
        self.accesses.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        // A poisoned lock only means another test thread panicked; the bytes are still valid.
        self.bytes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check(&self, offset: usize, len: usize, what: &str) {
        let size = self.lock().len();
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= size),
            "engine {what} outside region: offset {offset} len {len} region {size}"
        );
        self.accesses.fetch_add(1, Ordering::Relaxed);
    }

    fn word(&self, offset: usize) -> u64 {
        let b = self.lock();
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[offset..offset + 8]);
        u64::from_ne_bytes(w)
    }
}

impl RegionMemory for VecMemory {
    fn len(&self) -> usize {
        self.lock().len()
    }
    fn read(&self, offset: usize, dst: &mut [u8]) {
        self.check(offset, dst.len(), "read");
        dst.copy_from_slice(&self.lock()[offset..offset + dst.len()]);
    }
    fn write(&self, offset: usize, src: &[u8]) {
        self.check(offset, src.len(), "write");
        self.lock()[offset..offset + src.len()].copy_from_slice(src);
    }
    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> u64 {
        self.check(offset, 8, "atomic");
        let old = self.word(offset);
        if old == compare {
            self.lock()[offset..offset + 8].copy_from_slice(&swap.to_ne_bytes());
        }
        old
    }
    fn tx_addr(&self, offset: usize) -> Option<usize> {
        self.by_reference.then_some(VEC_MEMORY_TX_BASE + offset)
    }
    fn fetch_add(&self, offset: usize, add: u64) -> u64 {
        self.check(offset, 8, "atomic");
        let old = self.word(offset);
        self.lock()[offset..offset + 8].copy_from_slice(&old.wrapping_add(add).to_ne_bytes());
        old
    }
}
