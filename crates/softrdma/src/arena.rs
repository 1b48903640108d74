//! Shared memory for regions softrdma allocates, and the registration
//! table peers check keys against.
//!
//! Every device owns one arena: a large, sparse memfd mapped shared. Its first
//! [`TABLE_LEN`] bytes hold the published tables (memory regions by rkey,
//! QPs by number); the rest holds the bytes of regions made by
//! `Pd::alloc_mr`. A same-host peer maps the whole arena once (the memfd is
//! passed when the link is set up), so an RDMA WRITE, READ or atomic on such a
//! region is a direct copy or CPU atomic by the initiator, after it checked
//! the key, bounds, access flags and protection domain in the table.
//!
//! Deregistration marks the table entry dying, then waits until no peer is
//! inside an access (each access holds a reader count on the entry), so once
//! `dereg` returns no peer touches the region again. Freed arena space is
//! given back to the OS (hole punched) and reused only after that.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use softrdma_engine::{AccessFlags, QpState, RegionMemory};

/// Bytes of virtual space reserved per arena (sparse: costs nothing until used).
pub const ARENA_LEN: usize = 64 << 30;
const MR_SLOTS: usize = 1 << 16;
const MR_ENTRY: usize = 64;
const QP_SLOTS: usize = 1 << 16;
const QP_ENTRY: usize = 16;
/// Bytes at the start of the arena holding the tables.
pub const TABLE_LEN: usize = MR_SLOTS * MR_ENTRY + QP_SLOTS * QP_ENTRY;
const PAGE: usize = 4096;

const EMPTY: u32 = 0;
const VALID: u32 = 1;
const DYING: u32 = 2;
const DELETED: u32 = 3;

/// Multiply-and-fold hasher for the driver's small integer keys (lkeys,
/// source ports): the direct path looks one up per SGE and every UDP send
/// one per source port, and std's SipHash costs more than the rest of such
/// a lookup. The keys are the engine's, not a peer's choice.
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
}

/// A `HashMap` with [`KeyHasher`].
pub type KeyMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// A mapping of an arena (ours or a peer's).
#[derive(Debug)]
pub struct ArenaMap {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: shared memory accessed only through atomics and raw copies.
unsafe impl Send for ArenaMap {}
// SAFETY: as above.
unsafe impl Sync for ArenaMap {}

impl ArenaMap {
    /// Maps `len` bytes of the arena memfd `fd`.
    pub fn map(fd: &OwnedFd, len: usize) -> io::Result<ArenaMap> {
        // SAFETY: maps a shared memfd at a kernel-chosen address; checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(ArenaMap {
            base: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?,
            len,
        })
    }

    /// Address of byte `off`.
    pub fn ptr(&self, off: usize) -> *mut u8 {
        debug_assert!(off <= self.len);
        // SAFETY: callers pass offsets inside the mapping (checked against the table's bounds).
        unsafe { self.base.as_ptr().add(off) }
    }

    fn mr_entry(&self, i: usize) -> MrEntry<'_> {
        MrEntry {
            p: self.ptr((i % MR_SLOTS) * MR_ENTRY),
            _m: std::marker::PhantomData,
        }
    }

    fn qp_entry(&self, qpn: u32) -> *mut u8 {
        self.ptr(MR_SLOTS * MR_ENTRY + (qpn as usize % QP_SLOTS) * QP_ENTRY)
    }

    /// The published state of a QP, if present: (pd, access, state).
    pub fn lookup_qp(&self, qpn: u32) -> Option<(u32, AccessFlags, QpState)> {
        let p = self.qp_entry(qpn);
        // SAFETY: the QP table lies inside the mapping; 4-byte aligned words.
        let (n, pd, acc, st) = unsafe {
            (
                AtomicU32::from_ptr(p.cast()).load(Ordering::Acquire),
                AtomicU32::from_ptr(p.add(4).cast()).load(Ordering::Acquire),
                AtomicU32::from_ptr(p.add(8).cast()).load(Ordering::Acquire),
                AtomicU32::from_ptr(p.add(12).cast()).load(Ordering::Acquire),
            )
        };
        if n != qpn.wrapping_add(1) {
            return None;
        }
        let state = match st {
            2 => QpState::Rtr,
            3 => QpState::Rts,
            _ => QpState::Err,
        };
        Some((pd, AccessFlags(acc), state))
    }

    /// Publishes (or with `None`, withdraws) a QP.
    pub fn publish_qp(&self, qpn: u32, v: Option<(u32, AccessFlags, QpState)>) {
        let p = self.qp_entry(qpn);
        // SAFETY: as in lookup_qp; only the owning device writes its table.
        unsafe {
            let n = AtomicU32::from_ptr(p.cast());
            match v {
                None => {
                    if n.load(Ordering::Acquire) == qpn.wrapping_add(1) {
                        n.store(0, Ordering::Release);
                    }
                }
                Some((pd, acc, st)) => {
                    let code = match st {
                        QpState::Rtr => 2,
                        QpState::Rts | QpState::Sqd => 3,
                        _ => 0,
                    };
                    n.store(0, Ordering::Release);
                    AtomicU32::from_ptr(p.add(4).cast()).store(pd, Ordering::Release);
                    AtomicU32::from_ptr(p.add(8).cast()).store(acc.bits(), Ordering::Release);
                    AtomicU32::from_ptr(p.add(12).cast()).store(code, Ordering::Release);
                    n.store(qpn.wrapping_add(1), Ordering::Release);
                }
            }
        }
    }

    /// Finds a valid region by rkey and enters it (reader count held until
    /// the guard drops), trying table slot `*slot` first (where the rkey
    /// was found last time) and leaving there the slot it was found in.
    pub fn enter_mr(&self, rkey: u32, slot: &mut usize) -> Option<MrGuard<'_>> {
        if *slot < MR_SLOTS {
            let e = self.mr_entry(*slot);
            if e.state().load(Ordering::Acquire) == VALID && e.rkey() == rkey {
                if let Some(g) = Self::enter(e, rkey) {
                    return Some(g);
                }
            }
        }
        let start = hash(rkey);
        for i in start..start + MR_SLOTS {
            let e = self.mr_entry(i);
            match e.state().load(Ordering::Acquire) {
                EMPTY => return None,
                VALID if e.rkey() == rkey => {
                    *slot = i % MR_SLOTS;
                    return Self::enter(e, rkey);
                }
                _ => {}
            }
        }
        None
    }

    fn enter(e: MrEntry<'_>, rkey: u32) -> Option<MrGuard<'_>> {
        e.readers().fetch_add(1, Ordering::AcqRel);
        // Re-check after announcing ourselves: a deregistration that
        // began meanwhile waits for us or we back off.
        if e.state().load(Ordering::Acquire) != VALID || e.rkey() != rkey {
            e.readers().fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(MrGuard { e, info: e.info() })
    }
}

impl Drop for ArenaMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped, once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

fn hash(rkey: u32) -> usize {
    (rkey.wrapping_mul(0x9E37_79B1) >> 16) as usize
}

/// Table data of a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInfo {
    pub rkey: u32,
    pub pd: u32,
    pub access: AccessFlags,
    pub iova: u64,
    pub len: u64,
    /// Offset of the region's bytes in the owner's arena; `u64::MAX` for
    /// caller memory, reached by cross-memory attach instead.
    pub arena_off: u64,
    /// Owner process (cross-memory attach).
    pub pid: u32,
    /// Address of the region's first byte in the owner process.
    pub addr: u64,
}

impl MrInfo {
    /// True when the bytes live in the owner's arena (else caller memory).
    pub fn in_arena(&self) -> bool {
        self.arena_off != u64::MAX
    }
}

#[derive(Clone, Copy)]
struct MrEntry<'a> {
    p: *mut u8,
    _m: std::marker::PhantomData<&'a ArenaMap>,
}

impl MrEntry<'_> {
    fn state(&self) -> &AtomicU32 {
        // SAFETY: entry words are inside the mapped table, aligned.
        unsafe { AtomicU32::from_ptr(self.p.cast()) }
    }
    fn readers(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { AtomicU32::from_ptr(self.p.add(4).cast()) }
    }
    fn word32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as above, off < MR_ENTRY and 4-aligned.
        unsafe { AtomicU32::from_ptr(self.p.add(off).cast()) }
    }
    fn word64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: as above, off < MR_ENTRY and 8-aligned.
        unsafe { AtomicU64::from_ptr(self.p.add(off).cast()) }
    }
    fn rkey(&self) -> u32 {
        self.word32(8).load(Ordering::Acquire)
    }
    fn info(&self) -> MrInfo {
        MrInfo {
            rkey: self.rkey(),
            pd: self.word32(12).load(Ordering::Acquire),
            access: AccessFlags(self.word32(16).load(Ordering::Acquire)),
            iova: self.word64(24).load(Ordering::Acquire),
            len: self.word64(32).load(Ordering::Acquire),
            arena_off: self.word64(40).load(Ordering::Acquire),
            pid: self.word32(48).load(Ordering::Acquire),
            addr: self.word64(56).load(Ordering::Acquire),
        }
    }
}

/// A held reader count on a region's table entry.
pub struct MrGuard<'a> {
    e: MrEntry<'a>,
    /// The region's table data.
    pub info: MrInfo,
}

impl Drop for MrGuard<'_> {
    fn drop(&mut self) {
        self.e.readers().fetch_sub(1, Ordering::AcqRel);
    }
}

/// A device's own arena: the mapping, its memfd, and the allocator.
#[derive(Debug)]
pub struct Arena {
    pub map: ArenaMap,
    pub fd: OwnedFd,
    free: Mutex<Vec<(usize, usize)>>,
    /// Caller memory moved into the arena (see [`Arena::adopt`]).
    adopted: Mutex<Vec<Adopted>>,
}

/// A span of caller pages now backed by the arena.
#[derive(Debug, Clone, Copy)]
struct Adopted {
    /// Process address and length of the span (whole pages).
    lo: usize,
    len: usize,
    /// Its offset in the arena.
    off: usize,
    /// Registrations using it.
    refs: u32,
}

/// Walks this process's mappings covering `[lo, hi)`; true when they cover
/// it without a gap and `ok(start, perms, file offset, inode, path)` holds
/// for each.
fn mappings_cover(
    lo: usize,
    hi: usize,
    mut ok: impl FnMut(usize, &str, u64, &str, &str) -> bool,
) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    let mut at = lo;
    for line in text.lines() {
        let mut it = line.split_ascii_whitespace();
        let (Some(range), Some(perms), Some(offset), Some(_dev), Some(inode)) =
            (it.next(), it.next(), it.next(), it.next(), it.next())
        else {
            return false;
        };
        let path = it.next().unwrap_or("");
        let Some((s, e)) = range.split_once('-') else {
            return false;
        };
        let (Ok(s), Ok(e), Ok(offset)) = (
            usize::from_str_radix(s, 16),
            usize::from_str_radix(e, 16),
            u64::from_str_radix(offset, 16),
        ) else {
            return false;
        };
        if e <= at {
            continue;
        }
        if s > at || !ok(s, perms, offset, inode, path) {
            return false;
        }
        at = e;
        if at >= hi {
            return true;
        }
    }
    false
}

impl Arena {
    /// Creates a sparse arena.
    pub fn new() -> io::Result<Arena> {
        // SAFETY: valid NUL-terminated name; flags are plain.
        let fd = unsafe { libc::memfd_create(c"softrdma-arena".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sizing our own memfd (sparse).
        if unsafe { libc::ftruncate(fd.as_raw_fd(), ARENA_LEN as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let map = ArenaMap::map(&fd, ARENA_LEN)?;
        Ok(Arena {
            map,
            fd,
            free: Mutex::new(vec![(TABLE_LEN, ARENA_LEN - TABLE_LEN)]),
            adopted: Mutex::new(Vec::new()),
        })
    }

    /// Moves caller memory into the arena, so that same-host peers reach it
    /// with a plain copy instead of a cross-memory-attach system call:
    /// the pages' bytes are copied into arena space, which is then mapped
    /// over the very same addresses (`MAP_FIXED`), so the process sees the
    /// same bytes at the same place, now shared with peers that map the
    /// arena. Returns the arena offset of `ptr`.
    ///
    /// Only whole pages of private anonymous read-write memory (heap,
    /// `malloc`/`memalign`/anonymous `mmap`) are moved: `ptr` and `len`
    /// page-aligned, so no byte outside the registration shares its pages.
    /// A range inside memory adopted earlier is shared (counted). Anything
    /// else (files, hugetlb, shared memory, stacks, partial pages) stays
    /// where it is: `None`, and the caller uses cross-memory attach.
    ///
    /// # Safety
    /// `ptr..ptr+len` is the caller's memory, valid for reads and writes,
    /// and no other thread writes it during the call (writes between the
    /// copy and the remapping would be lost).
    pub unsafe fn adopt(&self, ptr: *mut u8, len: usize) -> Option<usize> {
        let lo = ptr as usize;
        let hi = lo.checked_add(len)?;
        let mut adopted = self.adopted.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = adopted
            .iter_mut()
            .find(|a| a.lo <= lo && hi <= a.lo + a.len)
        {
            a.refs += 1;
            return Some(a.off + (lo - a.lo));
        }
        if len == 0 || !lo.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
            return None;
        }
        let anonymous = mappings_cover(lo, hi, |_, perms, _, inode, path| {
            perms == "rw-p" && inode == "0" && (path.is_empty() || path == "[heap]")
        });
        if !anonymous {
            return None;
        }
        let off = self.alloc(len)?;
        // SAFETY: the caller's range is valid for reads (contract); the
        // arena range was just allocated to us, inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(ptr, self.map.ptr(off), len) };
        // SAFETY: replaces exactly the caller's pages (whole pages of
        // private anonymous memory, checked above) with a shared mapping
        // of the arena bytes that now hold the same contents.
        let p = unsafe {
            libc::mmap(
                ptr.cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                self.fd.as_raw_fd(),
                off as libc::off_t,
            )
        };
        if p != ptr.cast() {
            // The old pages may be gone: put private pages with the bytes back.
            if p == libc::MAP_FAILED && !self.restore_private(lo, len, off) {
                return None; // the space stays mapped by the caller: never reused
            }
            self.release(off, len);
            return None;
        }
        adopted.push(Adopted {
            lo,
            len,
            off,
            refs: 1,
        });
        Some(off)
    }

    /// Ends one use of memory adopted by [`Arena::adopt`]. The last one
    /// gives the span private pages again (with its current bytes) and
    /// frees the arena space — unless `reuse` is false (a peer may still
    /// be inside: the space is then never reused), or the caller already
    /// unmapped or replaced the span (then only the space is freed).
    pub fn unadopt(&self, ptr: *mut u8, len: usize, reuse: bool) {
        let lo = ptr as usize;
        let Some(hi) = lo.checked_add(len) else {
            return;
        };
        let mut adopted = self.adopted.lock().unwrap_or_else(|e| e.into_inner());
        let Some(i) = adopted
            .iter()
            .position(|a| a.lo <= lo && hi <= a.lo + a.len)
        else {
            return;
        };
        adopted[i].refs -= 1;
        if adopted[i].refs > 0 {
            return;
        }
        let a = adopted.swap_remove(i);
        // Still our pages at the caller's addresses: each mapping over the
        // span is the arena memfd at the matching offset.
        let ours = mappings_cover(a.lo, a.lo + a.len, |start, _, offset, _, path| {
            let x = start.max(a.lo);
            path == "/memfd:softrdma-arena"
                && offset + (x - start) as u64 == (a.off + (x - a.lo)) as u64
        });
        let restored = !ours || self.restore_private(a.lo, a.len, a.off);
        if restored && reuse {
            self.release(a.off, a.len);
        }
    }

    /// Maps private anonymous pages holding the arena bytes at `off` over
    /// `lo..lo+len`. False when that failed (the span is as it was).
    fn restore_private(&self, lo: usize, len: usize, off: usize) -> bool {
        // SAFETY: a fresh private anonymous mapping at a kernel-chosen address.
        let tmp = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if tmp == libc::MAP_FAILED {
            return false;
        }
        // SAFETY: copies `len` arena bytes (inside the mapping) into the
        // fresh mapping, then moves that mapping over exactly the span this
        // arena was mapped at; on failure the temporary one is unmapped.
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.ptr(off), tmp.cast::<u8>(), len);
            let r = libc::mremap(
                tmp,
                len,
                len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                lo as *mut libc::c_void,
            );
            if r == libc::MAP_FAILED {
                libc::munmap(tmp, len);
                return false;
            }
        }
        true
    }

    /// Reserves `len` bytes (page-rounded); returns the offset.
    pub fn alloc(&self, len: usize) -> Option<usize> {
        let size = len.max(1).div_ceil(PAGE) * PAGE;
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let i = free.iter().position(|&(_, l)| l >= size)?;
        let (off, l) = free[i];
        if l == size {
            free.remove(i);
        } else {
            free[i] = (off + size, l - size);
        }
        Some(off)
    }

    /// Returns space, punching it out of the memfd so it costs no memory.
    pub fn release(&self, off: usize, len: usize) {
        let size = len.max(1).div_ceil(PAGE) * PAGE;
        // SAFETY: punches a hole in our own memfd inside the arena.
        unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off as libc::off_t,
                size as libc::off_t,
            )
        };
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.push((off, size));
        free.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(free.len());
        for &(o, l) in free.iter() {
            match merged.last_mut() {
                Some((mo, ml)) if *mo + *ml == o => *ml += l,
                _ => merged.push((o, l)),
            }
        }
        *free = merged;
    }

    /// Publishes a region.
    pub fn publish_mr(&self, info: MrInfo) -> bool {
        let start = hash(info.rkey);
        for i in start..start + MR_SLOTS {
            let e = self.map.mr_entry(i);
            let s = e.state().load(Ordering::Acquire);
            if s == EMPTY || s == DELETED {
                e.word32(8).store(info.rkey, Ordering::Release);
                e.word32(12).store(info.pd, Ordering::Release);
                e.word32(16).store(info.access.bits(), Ordering::Release);
                e.word64(24).store(info.iova, Ordering::Release);
                e.word64(32).store(info.len, Ordering::Release);
                e.word64(40).store(info.arena_off, Ordering::Release);
                e.word32(48).store(info.pid, Ordering::Release);
                e.word64(56).store(info.addr, Ordering::Release);
                e.readers().store(0, Ordering::Release);
                e.state().store(VALID, Ordering::Release);
                return true;
            }
        }
        false
    }

    /// Withdraws a region and waits (bounded) until no peer is inside it.
    /// Returns false when a reader did not leave in time (a peer that died
    /// mid-access): the caller must then never reuse the region's space.
    pub fn withdraw_mr(&self, rkey: u32) -> bool {
        let start = hash(rkey);
        for i in start..start + MR_SLOTS {
            let e = self.map.mr_entry(i);
            match e.state().load(Ordering::Acquire) {
                EMPTY => return true,
                VALID if e.rkey() == rkey => {
                    e.state().store(DYING, Ordering::SeqCst);
                    let t = Instant::now();
                    while e.readers().load(Ordering::Acquire) != 0 {
                        if t.elapsed() > Duration::from_millis(200) {
                            e.state().store(DELETED, Ordering::Release);
                            return false;
                        }
                        std::thread::yield_now();
                    }
                    e.state().store(DELETED, Ordering::Release);
                    return true;
                }
                _ => {}
            }
        }
        true
    }
}

/// A region's bytes inside an arena.
#[derive(Debug)]
pub struct ArenaRegion {
    pub arena: std::sync::Arc<Arena>,
    pub off: usize,
    pub len: usize,
}

impl ArenaRegion {
    fn p(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= self.len),
            "region access out of bounds"
        );
        self.arena.map.ptr(self.off + offset)
    }
}

impl RegionMemory for ArenaRegion {
    fn len(&self) -> usize {
        self.len
    }
    fn read(&self, offset: usize, dst: &mut [u8]) {
        let p = self.p(offset, dst.len());
        // SAFETY: bounds checked; shared bytes copied out through a raw pointer.
        unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) }
    }
    fn write(&self, offset: usize, src: &[u8]) {
        let p = self.p(offset, src.len());
        // SAFETY: bounds checked; copied in through a raw pointer.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) }
    }
    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> u64 {
        let a = atomic_at(self.p(offset, 8));
        match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(v) | Err(v) => v,
        }
    }
    fn fetch_add(&self, offset: usize, add: u64) -> u64 {
        atomic_at(self.p(offset, 8)).fetch_add(add, Ordering::SeqCst)
    }
    fn tx_addr(&self, offset: usize) -> Option<usize> {
        (offset <= self.len).then(|| self.p(offset, 0) as usize)
    }
    fn crc32(&self, crc: u32, head: &[u8], offset: usize, len: usize) -> u32 {
        let p = self.p(offset, len);
        // SAFETY: bounds checked; crc32_raw only loads through the pointer.
        unsafe { softrdma_wire::icrc::crc32_raw(crc, head, p, len) }
    }
}

impl Drop for ArenaRegion {
    fn drop(&mut self) {
        self.arena.release(self.off, self.len);
    }
}

/// The u64 at `p` as an atomic. Arena regions start page-aligned and the
/// engine only does atomics at 8-aligned addresses of regions registered at
/// their own address, so `p` is aligned; a misaligned one is refused loudly.
pub fn atomic_at<'a>(p: *mut u8) -> &'a AtomicU64 {
    assert!((p as usize) & 7 == 0, "atomic on a misaligned address");
    // SAFETY: aligned, inside a live mapping, accessed only atomically or by raw copies.
    unsafe { AtomicU64::from_ptr(p.cast()) }
}
