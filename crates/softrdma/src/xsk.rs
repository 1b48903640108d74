//! The system calls of the AF_XDP port: the socket, its UMEM and four
//! rings, the XDP program (hand-assembled eBPF) with its XSKMAP and the BPF
//! link that attaches it, and the netlink neighbour dump. Everything unsafe
//! the port needs is here; `xdp_port.rs` holds the logic, in safe code.
//!
//! The program is attached with a BPF link, not with the netlink "set XDP
//! fd" request: the link belongs to its file descriptor, so when the process
//! exits or is killed the kernel closes it and detaches the program. No
//! program is left behind on the interface.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

/// Size of one UMEM frame (and the largest frame the port sends or takes).
pub const FRAME: usize = 4096;
/// Frames in the UMEM: the first half feeds the receive side (fill ring),
/// the second half is the send side's.
pub const FRAMES: usize = 4096;
/// Entries in each ring (a power of two).
const RING: u32 = 2048;

fn last_err() -> io::Error {
    io::Error::last_os_error()
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(last_err())
    } else {
        Ok(r)
    }
}

/// A shared ring (producer, consumer, flags and descriptors mapped from the
/// socket), seen from this side: `cached` is our own index.
struct Ring<T> {
    map: *mut libc::c_void,
    map_len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    desc: *mut T,
    mask: u32,
    /// Our next index: the producer's for rings we fill, the consumer's
    /// for rings we drain.
    cached: u32,
}

impl<T: Copy> Ring<T> {
    /// Maps the ring at page offset `pgoff` with the kernel's offsets `off`.
    fn map(
        fd: RawFd,
        off: &libc::xdp_ring_offset,
        pgoff: u64,
        ours_is_producer: bool,
    ) -> io::Result<Self> {
        let map_len = off.desc as usize + RING as usize * std::mem::size_of::<T>();
        // SAFETY: a shared mapping of the socket's ring at the offset the
        // kernel documents for it; the result is checked.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff as libc::off_t,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(last_err());
        }
        let at = |o: u64| map.cast::<u8>().wrapping_add(o as usize);
        let mut r = Ring {
            map,
            map_len,
            producer: at(off.producer).cast(),
            consumer: at(off.consumer).cast(),
            flags: at(off.flags).cast(),
            desc: at(off.desc).cast(),
            mask: RING - 1,
            cached: 0,
        };
        r.cached = if ours_is_producer {
            r.prod().load(Ordering::Relaxed)
        } else {
            r.cons().load(Ordering::Relaxed)
        };
        Ok(r)
    }

    fn prod(&self) -> &AtomicU32 {
        // SAFETY: the producer index lies in the mapping (the kernel's
        // offset), is 4-byte aligned and lives as long as the ring.
        unsafe { &*self.producer }
    }

    fn cons(&self) -> &AtomicU32 {
        // SAFETY: as `prod`, for the consumer index.
        unsafe { &*self.consumer }
    }

    fn needs_wakeup(&self) -> bool {
        // SAFETY: as `prod`, for the flags word.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    // Producer side (fill, tx).

    /// Free entries.
    fn free(&self) -> u32 {
        RING - self
            .cached
            .wrapping_sub(self.cons().load(Ordering::Acquire))
    }

    /// Writes the next entry (the caller checked `free`).
    fn put(&mut self, v: T) {
        let i = (self.cached & self.mask) as usize;
        // SAFETY: `i < RING` entries of the mapped descriptor array, an
        // entry the kernel does not read until the producer index passes it.
        unsafe { self.desc.add(i).write_volatile(v) };
        self.cached = self.cached.wrapping_add(1);
    }

    /// Publishes the entries written.
    fn submit(&self) {
        self.prod().store(self.cached, Ordering::Release);
    }

    // Consumer side (rx, completion).

    /// Entries waiting.
    fn ready(&self) -> u32 {
        self.prod()
            .load(Ordering::Acquire)
            .wrapping_sub(self.cached)
    }

    /// Entry `k` past our index (the caller checked `ready`).
    fn peek(&self, k: u32) -> T {
        let i = (self.cached.wrapping_add(k) & self.mask) as usize;
        // SAFETY: `i < RING`; the kernel wrote it before publishing the
        // producer index read with Acquire in `ready`.
        unsafe { self.desc.add(i).read_volatile() }
    }

    /// Gives `n` entries back to the kernel.
    fn release(&mut self, n: u32) {
        self.cached = self.cached.wrapping_add(n);
        self.cons().store(self.cached, Ordering::Release);
    }

    fn waiting(&self) -> bool {
        self.prod().load(Ordering::Acquire) != self.cached
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, not used after this.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// How the program runs and the socket copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// Native (driver) XDP; false: generic (SKB) XDP.
    pub native: bool,
    /// Zero-copy; false: the kernel copies frames into and out of the UMEM.
    pub zero_copy: bool,
    /// Bound with XDP_USE_NEED_WAKEUP (wake-up mode).
    pub need_wakeup: bool,
}

pub use crate::config::XdpAttach as Attach;

/// An AF_XDP socket bound to one queue of an interface, its UMEM and rings,
/// and the XDP program that steers RoCEv2 to it.
pub struct Xsk {
    // Drop order: the link (detaches the program) first, then the rest.
    _link: OwnedFd,
    _prog: OwnedFd,
    _map: OwnedFd,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    fill: Ring<u64>,
    comp: Ring<u64>,
    fd: OwnedFd,
    umem: *mut u8,
    pub mode: Mode,
}

// SAFETY: the raw pointers are to mappings owned by this value; it is used
// by one thread at a time (behind the device lock).
unsafe impl Send for Xsk {}

/// What went wrong opening the socket, for a message naming the cause.
#[derive(Debug)]
pub enum OpenError {
    /// A system call needs a capability the process lacks.
    Permission(&'static str, io::Error),
    /// The interface or its driver cannot run XDP (or AF_XDP) this way.
    Unsupported(&'static str, io::Error),
    Other(&'static str, io::Error),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Permission(what, e) => write!(
                f,
                "{what}: {e} (AF_XDP needs CAP_NET_RAW and CAP_NET_ADMIN, and loading the XDP \
                 program CAP_BPF or CAP_SYS_ADMIN: run as root or grant them)"
            ),
            OpenError::Unsupported(what, e) => {
                write!(
                    f,
                    "{what}: {e} (the interface's driver cannot run XDP this way)"
                )
            }
            OpenError::Other(what, e) => write!(f, "{what}: {e}"),
        }
    }
}

fn classify(what: &'static str, e: io::Error) -> OpenError {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => OpenError::Permission(what, e),
        Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => OpenError::Unsupported(what, e),
        _ => OpenError::Other(what, e),
    }
}

fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` is a live value of the size passed.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

impl Xsk {
    /// Opens a socket on queue `queue` of interface `ifindex`, with a
    /// program that steers UDP to `port` (IPv4 and IPv6) to it. Generic
    /// XDP when native is refused (in `Attach::Auto`).
    pub fn open(
        ifindex: u32,
        queue: u32,
        port: u16,
        attach: Attach,
        need_wakeup: bool,
    ) -> Result<Xsk, OpenError> {
        // SAFETY: plain socket creation; the fd is owned at once.
        let fd = cvt(unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })
            .map_err(|e| classify("AF_XDP socket", e))?;
        // SAFETY: a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        let umem_len = FRAME * FRAMES;
        // SAFETY: an anonymous private mapping; the result is checked.
        let umem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                umem_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if umem == libc::MAP_FAILED {
            return Err(OpenError::Other("UMEM mmap", last_err()));
        }
        let umem = umem.cast::<u8>();
        // From here the UMEM is unmapped by `Xsk::drop`, or on failure here.
        let fail = |e: OpenError| {
            // SAFETY: the mapping made above, not used after a failure.
            unsafe { libc::munmap(umem.cast(), umem_len) };
            e
        };
        let reg = libc::xdp_umem_reg_v1 {
            addr: umem as u64,
            len: umem_len as u64,
            chunk_size: FRAME as u32,
            headroom: 0,
        };
        setsockopt(raw, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg)
            .map_err(|e| fail(classify("XDP_UMEM_REG", e)))?;
        for opt in [
            libc::XDP_UMEM_FILL_RING,
            libc::XDP_UMEM_COMPLETION_RING,
            libc::XDP_RX_RING,
            libc::XDP_TX_RING,
        ] {
            setsockopt(raw, libc::SOL_XDP, opt, &RING)
                .map_err(|e| fail(classify("XDP ring size", e)))?;
        }
        // SAFETY: all-zero is a valid xdp_mmap_offsets.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: `off` is writable for `len` bytes.
        cvt(unsafe {
            libc::getsockopt(
                raw,
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut len,
            )
        })
        .map_err(|e| fail(classify("XDP_MMAP_OFFSETS", e)))?;
        let ring_err = |e| fail(OpenError::Other("ring mmap", e));
        let rx =
            Ring::map(raw, &off.rx, libc::XDP_PGOFF_RX_RING as u64, false).map_err(ring_err)?;
        let tx = Ring::map(raw, &off.tx, libc::XDP_PGOFF_TX_RING as u32 as u64, true)
            .map_err(ring_err)?;
        let fill =
            Ring::map(raw, &off.fr, libc::XDP_UMEM_PGOFF_FILL_RING, true).map_err(ring_err)?;
        let comp = Ring::map(raw, &off.cr, libc::XDP_UMEM_PGOFF_COMPLETION_RING, false)
            .map_err(ring_err)?;

        // The program and its map before the bind, so that a refusal to load
        // (no CAP_BPF) is reported before anything touches the interface.
        let map =
            create_xskmap(queue + 1).map_err(|e| fail(classify("BPF_MAP_CREATE (XSKMAP)", e)))?;
        let prog = load_program(map.as_raw_fd(), port)
            .map_err(|e| fail(classify("BPF_PROG_LOAD (XDP)", e)))?;
        let tries: &[bool] = match attach {
            Attach::Auto => &[true, false],
            Attach::Native => &[true],
            Attach::Generic => &[false],
        };
        let mut last = None;
        let mut linked = None;
        for &native in tries {
            match link_xdp(prog.as_raw_fd(), ifindex, native) {
                Ok(l) => {
                    linked = Some((l, native));
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let Some((link, native)) = linked else {
            let e = last.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EINVAL));
            let what = if tries.len() == 2 {
                "attaching the XDP program (native and generic)"
            } else {
                "attaching the XDP program"
            };
            return Err(fail(classify(what, e)));
        };
        // Zero-copy where the driver offers it, else copy mode.
        let wake = if need_wakeup {
            libc::XDP_USE_NEED_WAKEUP
        } else {
            0
        };
        let mut bound = None;
        let mut last = None;
        for copy in [libc::XDP_ZEROCOPY, libc::XDP_COPY] {
            if !native && copy == libc::XDP_ZEROCOPY {
                continue;
            }
            let sa = libc::sockaddr_xdp {
                sxdp_family: libc::AF_XDP as u16,
                sxdp_flags: copy | wake,
                sxdp_ifindex: ifindex,
                sxdp_queue_id: queue,
                sxdp_shared_umem_fd: 0,
            };
            // SAFETY: `sa` is a valid sockaddr_xdp of the size passed.
            let r = unsafe {
                libc::bind(
                    raw,
                    (&sa as *const libc::sockaddr_xdp).cast(),
                    std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            };
            if r == 0 {
                bound = Some(copy == libc::XDP_ZEROCOPY);
                break;
            }
            last = Some(last_err());
        }
        let Some(zero_copy) = bound else {
            let e = last.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EINVAL));
            return Err(fail(classify("binding the AF_XDP socket to the queue", e)));
        };
        map_update(map.as_raw_fd(), queue, raw).map_err(|e| fail(classify("XSKMAP update", e)))?;
        let mut x = Xsk {
            _link: link,
            _prog: prog,
            _map: map,
            rx,
            tx,
            fill,
            comp,
            fd,
            umem,
            mode: Mode {
                native,
                zero_copy,
                need_wakeup,
            },
        };
        // The receive half of the UMEM goes to the kernel.
        for f in 0..FRAMES / 2 {
            if x.fill.free() == 0 {
                break;
            }
            x.fill.put((f * FRAME) as u64);
        }
        x.fill.submit();
        Ok(x)
    }

    /// The socket, to wait on (POLLIN: the receive ring has frames).
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Asks for busy polling of the queue's NAPI context from this socket's
    /// system calls (SO_PREFER_BUSY_POLL, SO_BUSY_POLL 20 µs, budget 64).
    /// False when the kernel refuses any of them.
    pub fn busy_poll(&self) -> bool {
        const SO_PREFER_BUSY_POLL: libc::c_int = 69;
        const SO_BUSY_POLL_BUDGET: libc::c_int = 70;
        let fd = self.fd();
        setsockopt(fd, libc::SOL_SOCKET, SO_PREFER_BUSY_POLL, &1i32).is_ok()
            && setsockopt(fd, libc::SOL_SOCKET, libc::SO_BUSY_POLL, &20i32).is_ok()
            && setsockopt(fd, libc::SOL_SOCKET, SO_BUSY_POLL_BUDGET, &64i32).is_ok()
    }

    /// Frame `addr..addr + len` of the UMEM, if inside it.
    pub fn frame(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let a = usize::try_from(addr).ok()?;
        if a.checked_add(len)? > FRAME * FRAMES || len > FRAME {
            return None;
        }
        // SAFETY: inside the UMEM mapping (checked); the frame is ours (taken
        // from the receive ring and not yet given back), so the kernel does
        // not write it while the borrow of `self` lasts.
        Some(unsafe { std::slice::from_raw_parts(self.umem.add(a), len) })
    }

    /// The whole send frame at `addr` (a frame of the send half, ours).
    pub fn frame_mut(&mut self, addr: u64) -> Option<&mut [u8]> {
        let a = usize::try_from(addr).ok()?;
        if a.checked_add(FRAME)? > FRAME * FRAMES {
            return None;
        }
        // SAFETY: inside the UMEM (checked); a send frame not on the send or
        // completion rings belongs to this side alone.
        Some(unsafe { std::slice::from_raw_parts_mut(self.umem.add(a), FRAME) })
    }

    /// Received frames waiting.
    pub fn rx_ready(&self) -> u32 {
        self.rx.ready()
    }

    /// Whether the receive ring holds frames.
    pub fn rx_waiting(&self) -> bool {
        self.rx.waiting()
    }

    /// Received frame `k` past the consumer index: (UMEM address, length).
    pub fn rx_peek(&self, k: u32) -> (u64, u32) {
        let d = self.rx.peek(k);
        (d.addr, d.len)
    }

    /// Releases `n` received frames, giving their buffers (`addrs`) back to
    /// the fill ring.
    pub fn rx_release(&mut self, n: u32, addrs: impl Iterator<Item = u64>) {
        self.rx.release(n);
        for a in addrs {
            // The fill ring is as large as the receive half: never full.
            if self.fill.free() == 0 {
                break;
            }
            // Back to the start of its chunk (the kernel adds its offsets).
            self.fill.put(a - a % FRAME as u64);
        }
        self.fill.submit();
    }

    /// Whether the kernel wants a system call to refill (need-wakeup mode).
    pub fn fill_needs_wakeup(&self) -> bool {
        self.mode.need_wakeup && self.fill.needs_wakeup()
    }

    /// A non-blocking receive call: runs the kernel's receive side.
    pub fn wake_rx(&self) {
        // SAFETY: a zero-length receive on our socket; no buffer is written.
        unsafe {
            libc::recvfrom(
                self.fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
    }

    /// Free send slots.
    pub fn tx_free(&self) -> u32 {
        self.tx.free()
    }

    /// Queues frame `addr` of `len` bytes for sending (the caller checked
    /// `tx_free`).
    pub fn tx_put(&mut self, addr: u64, len: u32) {
        self.tx.put(libc::xdp_desc {
            addr,
            len,
            options: 0,
        });
    }

    /// Publishes the queued frames and, when the kernel needs it (always in
    /// copy mode), kicks it with a send call; retried (bounded) while the
    /// kernel stops part way (it sends a limited batch per call).
    pub fn tx_submit(&mut self) {
        self.tx.submit();
        if self.mode.need_wakeup && !self.tx.needs_wakeup() {
            return;
        }
        for _ in 0..64 {
            // SAFETY: a zero-length send on our socket: no buffer is read.
            let r = unsafe {
                libc::sendto(
                    self.fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            let again = r < 0
                && matches!(
                    io::Error::last_os_error().raw_os_error(),
                    Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::ENOBUFS)
                );
            if !again || self.tx.free() == RING {
                break;
            }
        }
    }

    /// The kernel's counters of the socket (XDP_STATISTICS): frames it
    /// dropped (no room: receive ring full or no fill buffer) and bad
    /// descriptors; `None` if the kernel does not say.
    pub fn statistics(&self) -> Option<libc::xdp_statistics> {
        // SAFETY: all-zero is a valid xdp_statistics.
        let mut st: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_statistics>() as libc::socklen_t;
        // SAFETY: `st` is writable for `len` bytes.
        let r = unsafe {
            libc::getsockopt(
                self.fd(),
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
                (&mut st as *mut libc::xdp_statistics).cast(),
                &mut len,
            )
        };
        (r == 0).then_some(st)
    }

    /// Takes the send frames the kernel is done with, appending them to `out`.
    pub fn completions(&mut self, out: &mut Vec<u64>) {
        let n = self.comp.ready();
        for k in 0..n {
            out.push(self.comp.peek(k));
        }
        if n > 0 {
            self.comp.release(n);
        }
    }
}

impl Drop for Xsk {
    fn drop(&mut self) {
        // The fields drop after this: the link first (detaching the
        // program), then the map, the rings and the socket. The socket keeps
        // the UMEM's pages pinned until it closes, so unmapping this
        // process's view of them first is harmless.
        // SAFETY: the mapping made in `open`; no frame borrow outlives `&self`.
        unsafe { libc::munmap(self.umem.cast(), FRAME * FRAMES) };
    }
}

/// Copies `dst.len()` bytes from `src` into `dst`.
///
/// # Safety
/// `src..src + dst.len()` must be readable memory of this process for the
/// duration of the call.
pub unsafe fn copy_in(dst: &mut [u8], src: *const u8) {
    // SAFETY: the caller's contract; `dst` is a distinct, writable slice.
    unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
}

// ---- BPF -------------------------------------------------------------------

const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const XDP_FLAGS_SKB_MODE: u32 = 2;
const XDP_FLAGS_DRV_MODE: u32 = 4;

/// `bpf(cmd, attr)` with `attr` a zero-padded attribute block.
pub(crate) fn bpf(cmd: libc::c_int, attr: &mut [u64; 18]) -> io::Result<libc::c_int> {
    // SAFETY: `attr` is a live, writable block of the size passed; the
    // kernel reads (and for some commands writes) only within it, and
    // within the buffers whose addresses the callers put in it (each a
    // live local of theirs of the size the command implies).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of::<[u64; 18]>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(last_err())
    } else {
        Ok(r as libc::c_int)
    }
}

pub(crate) fn put_u32(attr: &mut [u64; 18], off: usize, v: u32) {
    let w = &mut attr[off / 8];
    let shift = (off % 8) * 8;
    *w = (*w & !(0xFFFF_FFFFu64 << shift)) | (u64::from(v) << shift);
}

pub(crate) fn owned(fd: libc::c_int) -> OwnedFd {
    // SAFETY: a new fd the kernel just returned to us.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn create_xskmap(entries: u32) -> io::Result<OwnedFd> {
    let mut a = [0u64; 18];
    put_u32(&mut a, 0, BPF_MAP_TYPE_XSKMAP);
    put_u32(&mut a, 4, 4); // key size
    put_u32(&mut a, 8, 4); // value size
    put_u32(&mut a, 12, entries.max(1));
    bpf(BPF_MAP_CREATE, &mut a).map(owned)
}

fn map_update(map: RawFd, key: u32, value: RawFd) -> io::Result<()> {
    let k = key;
    let v = value as u32;
    let mut a = [0u64; 18];
    put_u32(&mut a, 0, map as u32);
    a[1] = &k as *const u32 as u64;
    a[2] = &v as *const u32 as u64;
    a[3] = 0; // BPF_ANY
    bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(drop)
}

fn load_program(map: RawFd, port: u16) -> io::Result<OwnedFd> {
    let insns = crate::xdp_prog::program(map, port);
    prog_load(BPF_PROG_TYPE_XDP, Some(BPF_XDP), &insns, b"softrdma_xdp")
}

/// `BPF_PROG_LOAD` of `insns` as a program of `prog_type` named `name` (at
/// most 15 bytes). When the verifier refuses it (EACCES, EINVAL), loads it
/// once more with the verifier's log, and the error ends with the log's
/// last lines; any other error comes back as the kernel gave it (its errno
/// says, for one, that a capability is missing).
pub(crate) fn prog_load(
    prog_type: u32,
    expected_attach: Option<u32>,
    insns: &[crate::xdp_prog::Insn],
    name: &[u8],
) -> io::Result<OwnedFd> {
    let license = b"Dual MIT/GPL\0";
    let mut a = [0u64; 18];
    put_u32(&mut a, 0, prog_type);
    put_u32(&mut a, 4, insns.len() as u32);
    a[1] = insns.as_ptr() as u64;
    a[2] = license.as_ptr() as u64;
    if let Some(t) = expected_attach {
        put_u32(&mut a, 68, t);
    }
    let mut padded = [0u8; 16];
    let n = name.len().min(15);
    padded[..n].copy_from_slice(&name[..n]);
    for (i, c) in padded.chunks(4).enumerate() {
        put_u32(
            &mut a,
            48 + 4 * i,
            u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
        );
    }
    match bpf(BPF_PROG_LOAD, &mut a) {
        Ok(fd) => return Ok(owned(fd)),
        Err(e) if !matches!(e.raw_os_error(), Some(libc::EACCES | libc::EINVAL)) => return Err(e),
        Err(_) => {}
    }
    // Load again with the verifier's log, to say why.
    let mut log = vec![0u8; 1 << 16];
    put_u32(&mut a, 24, 1); // log level
    put_u32(&mut a, 28, log.len() as u32);
    a[4] = log.as_mut_ptr() as u64;
    match bpf(BPF_PROG_LOAD, &mut a) {
        Ok(fd) => Ok(owned(fd)),
        Err(e) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let tail: String = text.lines().rev().take(6).collect::<Vec<_>>().join(" | ");
            Err(io::Error::new(e.kind(), format!("{e}; verifier: {tail}")))
        }
    }
}

fn link_xdp(prog: RawFd, ifindex: u32, native: bool) -> io::Result<OwnedFd> {
    let mut a = [0u64; 18];
    put_u32(&mut a, 0, prog as u32);
    put_u32(&mut a, 4, ifindex);
    put_u32(&mut a, 8, BPF_XDP);
    put_u32(
        &mut a,
        12,
        if native {
            XDP_FLAGS_DRV_MODE
        } else {
            XDP_FLAGS_SKB_MODE
        },
    );
    bpf(BPF_LINK_CREATE, &mut a).map(owned)
}

// ---- interfaces and neighbours ---------------------------------------------

/// The index of interface `name`.
pub fn ifindex(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: a NUL-terminated name.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

/// A netlink route socket's answer to a neighbour dump of `family`
/// (AF_INET or AF_INET6): the raw messages, parsed by the caller.
pub fn neighbour_dump(family: u8) -> io::Result<Vec<u8>> {
    // SAFETY: plain socket creation; owned at once.
    let fd = cvt(unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    })?;
    let fd = owned(fd);
    // SAFETY: timeval is plain data.
    let tv = libc::timeval {
        tv_sec: 1,
        tv_usec: 0,
    };
    setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)?;
    // nlmsghdr (16) + ndmsg (12).
    let mut req = [0u8; 28];
    req[0..4].copy_from_slice(&28u32.to_ne_bytes());
    req[4..6].copy_from_slice(&libc::RTM_GETNEIGH.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    req[6..8].copy_from_slice(&flags.to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    req[16] = family;
    // SAFETY: sending our buffer on our socket to the kernel (no address:
    // a netlink socket's default destination is the kernel).
    let r = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if r < 0 {
        return Err(last_err());
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    // A dump ends with NLMSG_DONE; bounded in case it never does.
    for _ in 0..1024 {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(last_err());
        }
        let n = n as usize;
        out.extend_from_slice(&buf[..n]);
        if n == 0 || crate::xdp_port::dump_done(&buf[..n]) {
            break;
        }
    }
    Ok(out)
}
