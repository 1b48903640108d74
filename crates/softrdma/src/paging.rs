//! Page residency of registered memory: what "pinning" and "on-demand
//! paging" mean for a device that lives in the process.
//!
//! A hardware HCA reaches a region by physical address, so `ibv_reg_mr`
//! pins it: the kernel faults every page in and holds it in place until
//! deregistration, and the cost grows with the size. softrdma reaches a
//! region through the process's own virtual addresses, so nothing has to
//! hold pages in place — a page the kernel swapped out simply faults back
//! in. What it keeps of pinning is the part a program can observe: a
//! registration fault-in of every page ([`populate`], `MADV_POPULATE_READ`
//! or `_WRITE`), so that registration costs what it costs on hardware,
//! no access later takes a page fault on the data path, and registering
//! memory that is not mapped (or not writable, with LOCAL_WRITE) fails with
//! EFAULT as `ibv_reg_mr` does. It does not `mlock` (that would make every
//! registration count against RLIMIT_MEMLOCK, which the pages do not need).
//!
//! An on-demand-paging region ([`OdpRegion`], `IBV_ACCESS_ON_DEMAND`) does
//! none of this at registration. Its pages are resolved when an access
//! first needs them ([`softrdma_engine::RegionMemory::resolve`], the same
//! populate call for the touched bytes only), which is the first-touch
//! cost ODP has on hardware; an access to memory that is not mapped fails
//! with a remote access error (or a local protection error) instead of a
//! fault. Its addresses may name any memory — implicit ODP covers the whole
//! address space — so it never dereferences them: every copy goes through
//! `process_vm_readv`/`process_vm_writev` on the process itself, which the
//! kernel fails cleanly (EFAULT) on a page that is unmapped, even one
//! unmapped by another thread after `resolve` said yes.

use std::io;
use std::sync::Mutex;

/// `MADV_POPULATE_READ` (Linux 5.14).
const MADV_POPULATE_READ: libc::c_int = 22;
/// `MADV_POPULATE_WRITE` (Linux 5.14).
const MADV_POPULATE_WRITE: libc::c_int = 23;

fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no memory effects.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
    })
}

/// The whole pages around `[addr, addr + len)`, or None on overflow.
fn page_span(addr: usize, len: usize) -> Option<(usize, usize)> {
    let page = page_size();
    let start = addr & !(page - 1);
    let end = addr.checked_add(len)?.checked_next_multiple_of(page)?;
    Some((start, end - start))
}

/// Whether this kernel has `MADV_POPULATE_*` (Linux 5.14): asked once,
/// on a page of our own.
fn have_populate() -> bool {
    static HAVE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAVE.get_or_init(|| {
        let probe = vec![0u8; 2 * page_size()];
        let (start, _) = page_span(probe.as_ptr() as usize + page_size() - 1, 1).unwrap_or((0, 0));
        // SAFETY: a read populate of a page inside our own live buffer;
        // it changes nothing.
        unsafe { libc::madvise(start as *mut libc::c_void, page_size(), MADV_POPULATE_READ) == 0 }
    })
}

/// Faults in every page of `[addr, addr + len)` for reading, or for writing
/// (`write`: private copies made, zero pages replaced), as pinning does.
/// Fails with the kernel's error when part of the range is not mapped
/// (ENOMEM), not mapped with that access or not pageable memory (EINVAL),
/// or a page cannot be faulted in (EFAULT). On a kernel without
/// `MADV_POPULATE_*` it checks only that the pages are mapped (`mincore`)
/// and faults nothing in.
pub(crate) fn populate(addr: usize, len: usize, write: bool) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let (start, span) = page_span(addr, len).ok_or(io::ErrorKind::InvalidInput)?;
    if have_populate() {
        let advice = if write {
            MADV_POPULATE_WRITE
        } else {
            MADV_POPULATE_READ
        };
        // SAFETY: madvise with a POPULATE advice only asks the kernel to
        // fault pages in (as an access would, with the mapping's own
        // permissions, without changing their contents); it accepts any
        // address range and reports an unmapped one as ENOMEM, so no
        // memory is touched by this process.
        return if unsafe { libc::madvise(start as *mut libc::c_void, span, advice) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        };
    }
    // An older kernel: is every page at least mapped?
    let page = page_size();
    let mut vec = vec![0u8; 256];
    let mut at = start;
    while at < start + span {
        let n = ((start + span - at) / page).min(vec.len());
        // SAFETY: mincore reads page tables only and writes one byte per
        // page into `vec`, which holds `n` bytes; ENOMEM for unmapped pages.
        if unsafe { libc::mincore(at as *mut libc::c_void, n * page, vec.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        at += n * page;
    }
    Ok(())
}

/// Copies between `local` and `remote` (addresses in this process) with
/// `process_vm_readv`/`_writev`; returns the bytes moved, stopping at the
/// first page the kernel cannot reach.
fn vm_copy(local: *mut u8, remote: usize, len: usize, write: bool) -> usize {
    let mut done = 0usize;
    while done < len {
        let liov = libc::iovec {
            iov_base: local.wrapping_add(done).cast(),
            iov_len: len - done,
        };
        let riov = libc::iovec {
            iov_base: (remote + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: the local iovec is the caller's buffer of `len` bytes
        // (from `done` on); the remote one is only read or written by the
        // kernel, which checks that it is mapped with the right protection
        // and fails with EFAULT otherwise — this process never dereferences
        // it. Our own pid: no other process's memory is reached.
        let n = unsafe {
            let pid = libc::getpid();
            if write {
                libc::process_vm_writev(pid, &liov, 1, &riov, 1, 0)
            } else {
                libc::process_vm_readv(pid, &liov, 1, &riov, 1, 0)
            }
        };
        if n <= 0 {
            break;
        }
        done += n as usize;
    }
    done
}

/// Serialises the read-modify-write of atomics on ODP regions.
static ODP_ATOMICS: Mutex<()> = Mutex::new(());

/// An on-demand-paging region: `len` bytes of this process's address space
/// at `base` (implicit ODP: base 0, the whole address space), never
/// dereferenced, reached only through the kernel (see the module notes).
#[derive(Debug)]
pub struct OdpRegion {
    base: usize,
    len: usize,
}

impl OdpRegion {
    /// `len` bytes at `base`. Safe to construct: nothing is read or written
    /// until an access resolves its pages, and then only through the kernel.
    pub fn new(base: usize, len: usize) -> Self {
        OdpRegion { base, len }
    }

    /// The whole address space (implicit ODP: addr 0, length SIZE_MAX).
    pub fn implicit() -> Self {
        OdpRegion {
            base: 0,
            len: usize::MAX,
        }
    }

    fn addr(&self, offset: usize, len: usize) -> Option<usize> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        self.base.checked_add(offset)?.checked_add(len)?;
        Some(self.base + offset)
    }

    fn rmw(&self, offset: usize, f: impl Fn(u64) -> Option<u64>) -> u64 {
        let Some(at) = self.addr(offset, 8) else {
            return 0;
        };
        let _g = ODP_ATOMICS.lock().unwrap_or_else(|e| e.into_inner());
        let mut old = [0u8; 8];
        if vm_copy(old.as_mut_ptr(), at, 8, false) != 8 {
            return 0;
        }
        let v = u64::from_ne_bytes(old);
        if let Some(new) = f(v) {
            let mut b = new.to_ne_bytes();
            vm_copy(b.as_mut_ptr(), at, 8, true);
        }
        v
    }
}

impl softrdma_engine::RegionMemory for OdpRegion {
    fn len(&self) -> usize {
        self.len
    }
    fn resolve(&self, offset: usize, len: usize, write: bool) -> bool {
        let Some(at) = self.addr(offset, len) else {
            return false;
        };
        if populate(at, len, write).is_err() {
            return false;
        }
        // A read-only page fails the write populate (EINVAL); one made
        // read-only since is the copy's to find out (`try_write`).
        true
    }
    fn try_write(&self, offset: usize, src: &[u8]) -> bool {
        match self.addr(offset, src.len()) {
            // The kernel only reads `src` for a write.
            Some(at) => vm_copy(src.as_ptr().cast_mut(), at, src.len(), true) == src.len(),
            None => false,
        }
    }
    fn read(&self, offset: usize, dst: &mut [u8]) {
        let n = match self.addr(offset, dst.len()) {
            Some(at) => vm_copy(dst.as_mut_ptr(), at, dst.len(), false),
            None => 0,
        };
        // A page unmapped since `resolve`: what could not be read is zero.
        dst[n..].fill(0);
    }
    fn write(&self, offset: usize, src: &[u8]) {
        self.try_write(offset, src);
    }
    // Atomic with respect to every other RDMA atomic on ODP memory in this
    // process (IBV_ATOMIC_HCA semantics), not to CPU atomics of the program.
    // A page made read-only between `resolve` and here (the program racing
    // its own registration) gives the old value and is left as it was.
    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> u64 {
        self.rmw(offset, |v| (v == compare).then_some(swap))
    }
    fn fetch_add(&self, offset: usize, add: u64) -> u64 {
        self.rmw(offset, |v| Some(v.wrapping_add(add)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_engine::RegionMemory;

    /// A private anonymous mapping far below where the kernel places
    /// mappings (it allocates top-down from just under the stack), so that
    /// a hole the test unmaps in it stays a hole: another test thread's
    /// mmap, reusing a freed page, would make "unmapped" memory readable
    /// (a flaky failure under many test threads). Each call takes its own
    /// slot of the reserved range.
    fn map(len: usize, prot: libc::c_int) -> usize {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        for _ in 0..64 {
            let slot = NEXT.fetch_add(1, Ordering::Relaxed);
            let hint = 0x10_0000_0000usize + slot * (1 << 24);
            // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing
            // mapping: it fails instead, and another slot is tried.
            let p = unsafe {
                libc::mmap(
                    hint as *mut libc::c_void,
                    len,
                    prot,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                assert_eq!(p as usize, hint, "the kernel honours MAP_FIXED_NOREPLACE");
                return p as usize;
            }
        }
        panic!("no free slot for a test mapping at 64 GiB and above");
    }

    #[test]
    fn implicit_odp_never_touches_unmapped_or_read_only_pages() {
        let page = page_size();
        let base = map(3 * page, libc::PROT_READ | libc::PROT_WRITE);
        // SAFETY: the test's own mapping: page 1 unmapped, page 2 read-only.
        unsafe {
            assert_eq!(libc::munmap((base + page) as *mut _, page), 0);
            assert_eq!(
                libc::mprotect((base + 2 * page) as *mut _, page, libc::PROT_READ),
                0
            );
        }
        let r = OdpRegion::implicit();
        assert!(r.resolve(base, 64, true));
        r.write(base, b"odp");
        let mut got = [0u8; 3];
        r.read(base, &mut got);
        assert_eq!(&got, b"odp");
        assert!(r.resolve(base + 8, 8, true), "atomic on a writable page");
        assert_eq!(r.fetch_add(base + 8, 5), 0);
        assert_eq!(r.compare_swap(base + 8, 5, 9), 5);
        // Unmapped: refused, and the copies that never should happen are harmless.
        assert!(!r.resolve(base + page, 8, false));
        assert!(!r.resolve(base + page - 4, 8, true));
        let mut buf = [1u8; 8];
        r.read(base + page, &mut buf);
        assert_eq!(buf, [0; 8]);
        r.write(base + page, &buf);
        assert_eq!(r.fetch_add(base + page, 1), 0);
        // Read-only: readable, not writable.
        assert!(r.resolve(base + 2 * page, 8, false));
        assert!(
            !r.resolve(base + 2 * page, 8, true),
            "atomic on a read-only page"
        );
        assert!(!r.try_write(base + 2 * page, b"nope"));
        assert!(!r.try_write(base + page, b"nope"));
        r.read(base + 2 * page, &mut buf[..4]);
        assert_eq!(&buf[..4], &[0; 4]);
        // Address zero and the top of the address space.
        assert!(!r.resolve(0, 8, false));
        assert!(!r.resolve(usize::MAX - 3, 8, false));
        // SAFETY: unmaps what the test mapped.
        unsafe {
            libc::munmap(base as *mut _, page);
            libc::munmap((base + 2 * page) as *mut _, page);
        }
    }

    #[test]
    fn populate_refuses_unmapped_memory() {
        let page = page_size();
        let base = map(2 * page, libc::PROT_READ);
        assert!(populate(base, 2 * page, false).is_ok());
        assert!(
            populate(base, 2 * page, true).is_err(),
            "read-only for writing"
        );
        // SAFETY: the test's own mapping.
        unsafe { libc::munmap(base as *mut _, 2 * page) };
        assert!(populate(base, page, false).is_err());
    }
}
