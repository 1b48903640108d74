//! Memory behind registered regions.
//!
//! Two kinds: [`OwnedRegion`], page-aligned memory softrdma allocates and
//! owns (what [`crate::Pd::alloc_mr`] hands out), and [`RawRegion`], memory
//! the caller owns and promises to keep alive (the C library's
//! `ibv_reg_mr`). Remote peers write these bytes while the application may
//! be using them, so nothing here hands out `&[u8]`: every access is a copy
//! through a raw pointer, and atomics are real CPU atomics on the 8-byte
//! word, so they stay atomic with respect to any other process or thread
//! doing atomics on the same memory.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

const PAGE: usize = 4096;

/// Page-aligned, zero-initialised memory owned by a region.
#[derive(Debug)]
pub struct OwnedRegion {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: the region is plain bytes; all access goes through raw-pointer
// copies and atomics, never through shared references, so it may be used
// from any thread.
unsafe impl Send for OwnedRegion {}
// SAFETY: as above.
unsafe impl Sync for OwnedRegion {}

impl OwnedRegion {
    /// Allocates `len` zeroed bytes (at least one page is reserved so that
    /// zero-length regions still have a valid address).
    pub fn new(len: usize) -> std::io::Result<Self> {
        let size = len.max(1).div_ceil(PAGE) * PAGE;
        let layout = Layout::from_size_align(size, PAGE)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        // SAFETY: layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr =
            NonNull::new(p).ok_or_else(|| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
        Ok(OwnedRegion { ptr, len, layout })
    }

    /// The address of the first byte (the region's default virtual address).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Raw pointer to the bytes.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for OwnedRegion {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Memory owned by the caller, registered by address (C programs' `ibv_reg_mr`).
#[derive(Debug)]
pub struct RawRegion {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the creator of a RawRegion promised (see `new`) that the memory
// stays valid while registered; access is by raw-pointer copies and atomics only.
unsafe impl Send for RawRegion {}
// SAFETY: as above.
unsafe impl Sync for RawRegion {}

impl RawRegion {
    /// Wraps `len` bytes at `ptr`.
    ///
    /// # Safety
    /// The memory must stay valid for reads and writes for as long as the
    /// region is registered (until `dereg` returns), like ibv_reg_mr's contract.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        RawRegion { ptr, len }
    }
}

pub(crate) fn copy_out(base: *mut u8, len: usize, offset: usize, dst: &mut [u8]) {
    assert!(
        offset.checked_add(dst.len()).is_some_and(|e| e <= len),
        "region read out of bounds"
    );
    // SAFETY: bounds checked above; `base` is valid for `len` bytes (type
    // invariants of both region kinds); dst is a distinct, exclusive buffer.
    unsafe { std::ptr::copy_nonoverlapping(base.add(offset), dst.as_mut_ptr(), dst.len()) }
}

pub(crate) fn copy_in(base: *mut u8, len: usize, offset: usize, src: &[u8]) {
    assert!(
        offset.checked_add(src.len()).is_some_and(|e| e <= len),
        "region write out of bounds"
    );
    // SAFETY: as in copy_out, with the roles swapped.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), base.add(offset), src.len()) }
}

/// The CRC-32 from `crc` over `head` and the region's `len` bytes at
/// `offset`, read in place with raw-pointer loads (never as a slice).
pub(crate) fn crc_in_place(
    base: *mut u8,
    size: usize,
    crc: u32,
    head: &[u8],
    offset: usize,
    len: usize,
) -> u32 {
    assert!(
        offset.checked_add(len).is_some_and(|e| e <= size),
        "region read out of bounds"
    );
    // SAFETY: bounds checked above; `base` is valid for `size` bytes (type
    // invariants of both region kinds); crc32_raw only loads through the pointer.
    unsafe { softrdma_wire::icrc::crc32_raw(crc, head, base.add(offset), len) }
}

/// Serialises atomics on words that are not 8-byte aligned in process
/// memory (possible when a region is registered at an iova that differs from
/// its address): CPU atomics need alignment, so these fall back to a lock.
static MISALIGNED_ATOMICS: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub(crate) fn atomic_rmw(
    base: *mut u8,
    len: usize,
    offset: usize,
    f: impl Fn(u64) -> Option<u64>,
) -> u64 {
    assert!(
        offset.checked_add(8).is_some_and(|e| e <= len),
        "atomic out of bounds"
    );
    // SAFETY: in bounds (checked above) of memory valid for `len` bytes.
    let p = unsafe { base.add(offset) };
    if (p as usize) & 7 == 0 {
        // SAFETY: p is valid and 8-aligned; this memory is only accessed by
        // raw copies and atomics, never through Rust references.
        let a = unsafe { AtomicU64::from_ptr(p.cast()) };
        match a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, f) {
            Ok(v) | Err(v) => v,
        }
    } else {
        let _g = MISALIGNED_ATOMICS.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: p is valid for 8 bytes; unaligned accesses are used.
        let old = unsafe { std::ptr::read_unaligned(p.cast::<u64>()) };
        if let Some(new) = f(old) {
            // SAFETY: as above.
            unsafe { std::ptr::write_unaligned(p.cast::<u64>(), new) };
        }
        old
    }
}

macro_rules! region_memory {
    ($t:ty) => {
        impl softrdma_engine::RegionMemory for $t {
            fn len(&self) -> usize {
                self.len
            }
            fn read(&self, offset: usize, dst: &mut [u8]) {
                $crate::region::copy_out(self.ptr_raw(), self.len, offset, dst)
            }
            fn write(&self, offset: usize, src: &[u8]) {
                $crate::region::copy_in(self.ptr_raw(), self.len, offset, src)
            }
            fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> u64 {
                $crate::region::atomic_rmw(self.ptr_raw(), self.len, offset, |v| {
                    (v == compare).then_some(swap)
                })
            }
            fn fetch_add(&self, offset: usize, add: u64) -> u64 {
                $crate::region::atomic_rmw(self.ptr_raw(), self.len, offset, |v| {
                    Some(v.wrapping_add(add))
                })
            }
            fn tx_addr(&self, offset: usize) -> Option<usize> {
                (offset <= self.len).then(|| self.ptr_raw() as usize + offset)
            }
            fn crc32(&self, crc: u32, head: &[u8], offset: usize, len: usize) -> u32 {
                $crate::region::crc_in_place(self.ptr_raw(), self.len, crc, head, offset, len)
            }
        }
    };
}

impl OwnedRegion {
    fn ptr_raw(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}
impl RawRegion {
    fn ptr_raw(&self) -> *mut u8 {
        self.ptr
    }
}
region_memory!(OwnedRegion);
region_memory!(RawRegion);
pub(crate) use region_memory;
