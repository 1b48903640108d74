//! Shared memory for one region: the bytes of a region that same-host
//! peers may reach directly live in a memfd of their own, so that what a
//! peer is handed is that region and nothing else.
//!
//! A region gets a segment when it has a remote access right and its
//! memory can be shared: [`Segment::alloc`] for `Pd::alloc_mr`, and
//! [`Segment::adopt`] for caller memory (`ibv_reg_mr`) made of whole pages
//! of private anonymous memory, whose bytes move into the memfd, mapped
//! over the same addresses. A peer receives the memfd only when the owner
//! grants it (`grant.rs`): after it showed that it holds the region's rkey
//! on a connected QP with the needed right.
//!
//! A segment is never reused. When its region is deregistered, the owner
//! keeps the bytes it still needs (adopted memory gets private pages with
//! its current contents again) and punches the whole memfd out: a peer's
//! mapping, even one left by a peer stalled or hostile past every fence,
//! then reaches zero pages that belong to nothing. Sizes are sealed, so no
//! mapping of a segment can fault.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

const PAGE: usize = 4096;

/// The memfd behind one shareable region, and this process's mapping of it.
#[derive(Debug)]
pub struct Segment {
    fd: OwnedFd,
    /// Where this process sees the bytes: a mapping made for
    /// [`Segment::alloc`], the caller's own pages for [`Segment::adopt`].
    base: NonNull<u8>,
    /// Bytes of the memfd (whole pages).
    len: usize,
    adopted: bool,
}

// SAFETY: the mapping is shared memory reached through raw copies and
// atomics only; nothing in it is tied to a thread.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

fn round_up(len: usize) -> Option<usize> {
    len.max(1).checked_next_multiple_of(PAGE)
}

impl Segment {
    /// A zero-filled segment of at least `len` bytes.
    pub fn alloc(len: usize) -> io::Result<Segment> {
        let size = round_up(len).ok_or_else(|| io::Error::other("region too large"))?;
        let fd = crate::sys::sealed_memfd(c"softrdma-region", size)?;
        let p = crate::sys::map_shared(fd.as_raw_fd(), size)?;
        Ok(Segment {
            fd,
            base: NonNull::new(p).ok_or_else(|| io::Error::other("mmap returned null"))?,
            len: size,
            adopted: false,
        })
    }

    /// Moves caller memory into a segment of its own: its bytes are copied
    /// into a new memfd, which is then mapped over the very same addresses
    /// (`MAP_FIXED`), so the process sees the same bytes at the same place,
    /// now shareable. Only whole pages of private anonymous read-write
    /// memory (heap, `malloc`/`memalign`, anonymous `mmap`) move: `ptr`
    /// and `len` page-aligned, so no byte outside the registration shares
    /// its pages. Anything else — files, hugetlb, shared memory, stacks,
    /// partial pages, pages an earlier registration already moved — stays
    /// where it is (`None`), and peers reach it through the target's engine.
    ///
    /// # Safety
    /// `ptr..ptr+len` is the caller's memory, valid for reads and writes
    /// until the segment is dropped, and no other thread writes it during
    /// the call (a write between the copy and the remapping would be lost).
    pub unsafe fn adopt(ptr: *mut u8, len: usize) -> Option<Segment> {
        let lo = ptr as usize;
        let hi = lo.checked_add(len)?;
        if len == 0 || !lo.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
            return None;
        }
        let anonymous = mappings_cover(lo, hi, |_, perms, _, inode, path| {
            perms == "rw-p" && inode == "0" && (path.is_empty() || path == "[heap]")
        });
        if !anonymous {
            return None;
        }
        let fd = crate::sys::sealed_memfd(c"softrdma-region", len).ok()?;
        // A temporary mapping of the new memfd, to fill it.
        let tmp = crate::sys::map_shared(fd.as_raw_fd(), len)
            .ok()?
            .cast::<libc::c_void>();
        // SAFETY: the caller's range is valid for reads (contract) and the
        // temporary mapping holds `len` bytes; then the temporary mapping
        // is dropped and the memfd mapped over exactly the caller's pages
        // (whole pages of private anonymous memory, checked above), which
        // now holds the same contents.
        let p = unsafe {
            std::ptr::copy_nonoverlapping(ptr, tmp.cast::<u8>(), len);
            libc::munmap(tmp, len);
            libc::mmap(
                ptr.cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p != ptr.cast() {
            // MAP_FIXED returns the address asked for or fails.
            return None;
        }
        Some(Segment {
            fd,
            base: NonNull::new(ptr)?,
            len,
            adopted: true,
        })
    }

    /// The memfd, to hand to a peer.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Where this process sees byte 0.
    pub fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Bytes of the memfd.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Gives adopted pages private memory with their current bytes again,
    /// unless the caller already unmapped or replaced them. False when the
    /// pages are still the segment's (the remapping failed).
    fn give_back(&self) -> bool {
        let (lo, len) = (self.base.as_ptr() as usize, self.len);
        let ours = mappings_cover(lo, lo + len, |start, _, offset, _, path| {
            path.starts_with("/memfd:softrdma-region")
                && offset + (start.max(lo) - start) as u64 == (start.max(lo) - lo) as u64
        });
        if !ours {
            return true;
        }
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
        // SAFETY: copies the `len` bytes of our mapping (checked above to
        // be this segment) into the fresh mapping, then moves that mapping
        // over exactly the span; on failure the temporary one is unmapped.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.as_ptr(), tmp.cast::<u8>(), len);
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
}

impl Drop for Segment {
    fn drop(&mut self) {
        let unmapped = if self.adopted {
            self.give_back()
        } else {
            // SAFETY: unmaps exactly the mapping `alloc` made, once.
            unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) == 0 }
        };
        if unmapped {
            // Whatever a peer still maps of it reaches zeros from now on.
            // SAFETY: punches our own memfd; no pointer arguments.
            unsafe {
                libc::fallocate(
                    self.fd.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    0,
                    self.len as libc::off_t,
                )
            };
        }
    }
}

/// The bytes of a region allocated in a segment (`Pd::alloc_mr`).
#[derive(Debug)]
pub struct SegmentRegion {
    pub seg: std::sync::Arc<Segment>,
    pub len: usize,
}

impl SegmentRegion {
    fn ptr_raw(&self) -> *mut u8 {
        self.seg.base()
    }
}

crate::region::region_memory!(SegmentRegion);

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deregistered_segment_reaches_nothing_through_an_old_mapping() {
        let seg = Segment::alloc(10_000).unwrap();
        assert_eq!(seg.len(), 12_288);
        // SAFETY: inside the segment's own mapping.
        unsafe { seg.base().write_bytes(0x5A, seg.len()) };
        // A peer's mapping, made from the descriptor it was handed.
        let peer = crate::sys::map_shared(seg.fd(), seg.len()).unwrap();
        // SAFETY: inside the peer mapping.
        assert_eq!(unsafe { *peer.add(100) }, 0x5A);
        drop(seg);
        // SAFETY: the peer's mapping stays valid (the memfd lives on with
        // it) and now holds zeros only.
        let after = unsafe { std::slice::from_raw_parts(peer, 12_288) };
        assert!(after.iter().all(|&b| b == 0));
        // SAFETY: unmaps the test's own mapping.
        unsafe { libc::munmap(peer.cast(), 12_288) };
    }

    #[test]
    fn adopted_pages_keep_their_bytes_and_get_private_pages_back() {
        let len = 3 * PAGE;
        // SAFETY: a private anonymous mapping for the test.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        }
        .cast::<u8>();
        // SAFETY: inside the mapping.
        unsafe { p.write_bytes(7, len) };
        // SAFETY: the test's own pages, no other thread.
        let seg = unsafe { Segment::adopt(p, len) }.expect("anonymous pages move");
        // SAFETY: inside the mapping.
        unsafe { *p.add(5) = 9 };
        let peer = crate::sys::map_shared(seg.fd(), len).unwrap();
        // SAFETY: inside the peer mapping.
        assert_eq!(unsafe { *peer.add(5) }, 9, "the peer sees the same bytes");
        assert!(
            // SAFETY: the range is inside the adopted pages.
            unsafe { Segment::adopt(p, PAGE) }.is_none(),
            "moved pages do not move twice"
        );
        drop(seg);
        // SAFETY: the caller's pages are private again, with their bytes.
        unsafe {
            assert_eq!(*p.add(5), 9);
            assert_eq!(*p.add(len - 1), 7);
            assert_eq!(*peer.add(5), 0, "the peer's old mapping reaches nothing");
            libc::munmap(peer.cast(), len);
            libc::munmap(p.cast(), len);
        }
    }
}
