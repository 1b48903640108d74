//! `cargo bench -p softrdma-engine`: the engine alone, in one thread, with
//! no I/O and no clock of its own.
//!
//! - **RDMA WRITE throughput.** Two engines; a requester posts 4 KiB RC
//!   WRITEs (path MTU 4096, one packet each) and the bench moves every packet
//!   straight from one engine's `poll_transmit` into the other's
//!   `handle_packet`, ACKs included, polling completions as it goes. Reported
//!   as data packets/s and payload GB/s, next to a memcpy baseline of 4 KiB
//!   copies measured in the same run, and the ratio between the two. Both
//!   have the same working set: a fixed 4 KiB source (every WRITE gathers
//!   the same 4 KiB of its source region) and a 1 MiB destination written
//!   at rotating 4 KiB offsets.
//! - **A breakdown of one WRITE** into the pieces it is made of (ICRC over a
//!   4 KiB packet, parse, 4 KiB copies), timed alone, so the remainder is the
//!   engine's own bookkeeping.
//! - **Memory.** A counting global allocator measures the bytes an idle RC
//!   QP in RTS costs (N QPs created and connected, the difference divided by
//!   N), and the total for 10,000 QPs in one engine.
//! - **The direct path's rules.** `plan_direct_into`, `check_direct_target`
//!   against a fixed peer view, `complete_direct` and the poll of the
//!   completion, for an 8-byte WRITE (no copy): nanoseconds each, and the
//!   allocations they make (none; the smoke run asserts it).
//!
//! Run without `--bench` (as `cargo test --benches` does) it only
//! smoke-tests each case briefly.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use softrdma_engine::{
    AccessFlags, AhAttr, AttrMask, CqHandle, DirectPlan, Engine, EngineConfig, Gid, Instant,
    MrKeys, Mtu, PdHandle, PeerQp, PeerRegion, PeerView, QpAttr, QpCap, QpInit, QpState, QpType,
    Qpn, RegionMemory, Rkey, SendFlags, SendOp, SendWr, Sge, VecMemory, WcStatus, WorkCompletion,
};
use softrdma_wire::packet::{emit_in_place, payload_offset};
use softrdma_wire::{crc32, icrc, BthRepr, Endpoints, Headers, Opcode, PacketRepr, Psn, RethRepr};

// ----- a counting allocator -----

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counters are only statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: `p` came from this allocator with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new, Ordering::Relaxed);
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

// ----- region memory as a driver has it -----

/// Plain bytes reached by raw-pointer copies, as the UDP driver's regions
/// are (`VecMemory` adds a lock, a bounds assertion and a counter per access).
struct RawMem {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the bench uses it from one thread; the engine only copies through it.
unsafe impl Send for RawMem {}
// SAFETY: as above.
unsafe impl Sync for RawMem {}

impl RawMem {
    fn new(len: usize) -> Self {
        let b: Box<[u8]> = vec![0x5A; len].into_boxed_slice();
        RawMem {
            ptr: Box::into_raw(b) as *mut u8,
            len,
        }
    }
}

impl Drop for RawMem {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from a boxed slice in `new`.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

impl RegionMemory for RawMem {
    fn len(&self) -> usize {
        self.len
    }
    fn read(&self, offset: usize, dst: &mut [u8]) {
        assert!(offset + dst.len() <= self.len);
        // SAFETY: in bounds (checked above); dst is a distinct buffer.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), dst.as_mut_ptr(), dst.len()) }
    }
    fn write(&self, offset: usize, src: &[u8]) {
        assert!(offset + src.len() <= self.len);
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(offset), src.len()) }
    }
    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> u64 {
        let mut w = [0u8; 8];
        self.read(offset, &mut w);
        let old = u64::from_ne_bytes(w);
        if old == compare {
            self.write(offset, &swap.to_ne_bytes());
        }
        old
    }
    fn fetch_add(&self, offset: usize, add: u64) -> u64 {
        let mut w = [0u8; 8];
        self.read(offset, &mut w);
        let old = u64::from_ne_bytes(w);
        self.write(offset, &old.wrapping_add(add).to_ne_bytes());
        old
    }
    fn tx_addr(&self, offset: usize) -> Option<usize> {
        (offset <= self.len).then(|| self.ptr as usize + offset)
    }
}

// ----- timing -----

struct Bench {
    full: bool,
    /// Only sections whose name contains this run (`cargo bench -- write`).
    filter: Option<String>,
}

impl Bench {
    fn wants(&self, section: &str) -> bool {
        match &self.filter {
            Some(f) => section.contains(f.as_str()),
            None => true,
        }
    }

    /// Runs `f` (which does `n` units of work per call and returns it) for
    /// about `dur` after a short warm-up; returns units per second.
    fn rate(&self, dur: Duration, mut f: impl FnMut() -> u64) -> f64 {
        if !self.full {
            f();
            return 0.0;
        }
        let warm = std::time::Instant::now();
        while warm.elapsed() < dur / 5 {
            f();
        }
        // Best of 60 slices: least disturbed by the other load on the
        // machine (short slices, so that some fall between its bursts).
        let mut best = 0.0f64;
        for _ in 0..60 {
            let t = std::time::Instant::now();
            let mut n = 0;
            while t.elapsed() < dur / 60 {
                n += f();
            }
            best = best.max(n as f64 / t.elapsed().as_secs_f64());
        }
        best
    }
}

// ----- fixtures -----

fn addr(i: u8) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, i)), 4791)
}

fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

fn cap(send: u32) -> QpCap {
    QpCap {
        max_send_wr: send,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// RESET → INIT → RTR → RTS towards `peer`'s QP `dest`.
fn connect(e: &mut Engine, qpn: Qpn, peer: SocketAddr, dest: u32, mtu: Mtu) {
    let now = Instant(0);
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: all_access(),
        ..Default::default()
    };
    e.modify_qp(
        now,
        qpn,
        &a,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    a.qp_state = QpState::Rtr;
    a.ah_attr = AhAttr {
        dgid: Gid::from_ip(peer.ip()),
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..Default::default()
    };
    a.path_mtu = mtu;
    a.dest_qp_num = Qpn::from_raw(dest);
    a.rq_psn = Psn::new(0);
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 1;
    e.modify_qp(
        now,
        qpn,
        &a,
        AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER,
    )
    .unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = Psn::new(0);
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    e.modify_qp(
        now,
        qpn,
        &a,
        AttrMask::STATE
            | AttrMask::SQ_PSN
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
}

const REGION: usize = 1 << 20;
const MSG: usize = 4096;
/// WRITEs kept posted and not yet completed.
const WINDOW: usize = 128;

struct Side {
    e: Engine,
    cq: CqHandle,
    qpn: Qpn,
    keys: MrKeys,
    base: u64,
}

fn side(i: u8, mem: Arc<dyn RegionMemory>) -> Side {
    let mut e = Engine::new(EngineConfig::new(addr(i)));
    let pd = e.alloc_pd();
    let cq = e.create_cq(4096).unwrap();
    let base = 0x1000_0000 * u64::from(i);
    let keys = e.reg_mr(pd, base, all_access(), mem).unwrap();
    let qpn = e
        .create_qp(QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: cap(1024),
            sq_sig_all: false,
        })
        .unwrap();
    Side {
        e,
        cq,
        qpn,
        keys,
        base,
    }
}

/// Two connected engines moving 4 KiB WRITEs from `a` to `b`.
struct WritePipe {
    a: Side,
    b: Side,
    buf: Vec<u8>,
    wcs: Vec<WorkCompletion>,
    posted: u64,
    completed: u64,
    data_pkts: u64,
    ack_pkts: u64,
    now: u64,
}

impl WritePipe {
    fn new(mem: impl Fn() -> Arc<dyn RegionMemory>) -> Self {
        let mut a = side(1, mem());
        let mut b = side(2, mem());
        connect(&mut a.e, a.qpn, addr(2), b.qpn.raw(), Mtu::Mtu4096);
        connect(&mut b.e, b.qpn, addr(1), a.qpn.raw(), Mtu::Mtu4096);
        WritePipe {
            a,
            b,
            buf: vec![0u8; 9000],
            wcs: Vec::with_capacity(256),
            posted: 0,
            completed: 0,
            data_pkts: 0,
            ack_pkts: 0,
            now: 1_000_000,
        }
    }

    /// Runs until `n` more WRITEs have completed; returns `n`.
    fn run(&mut self, n: u64) -> u64 {
        let target = self.completed + n;
        let slots = (REGION / MSG) as u64;
        while self.completed < target {
            let now = Instant(self.now);
            self.now += 100;
            while self.posted - self.completed < WINDOW as u64 {
                // The same working set as the memcpy baseline: every WRITE
                // reads the same 4 KiB of the source region (the baseline's
                // 4 KiB source buffer) and lands at rotating offsets of the
                // 1 MiB target region (the baseline's 1 MiB destination).
                let slot = self.posted % slots;
                let off = slot * MSG as u64;
                let wr = SendWr {
                    xrc_srqn: None,
                    wr_id: self.posted,
                    op: SendOp::Write {
                        remote_addr: self.b.base + off,
                        rkey: self.b.keys.rkey,
                    },
                    sg_list: vec![Sge {
                        addr: self.a.base,
                        length: MSG as u32,
                        lkey: self.a.keys.lkey,
                    }],
                    flags: SendFlags::SIGNALED,
                    ud: None,
                };
                self.a.e.post_send(now, self.a.qpn, &wr).unwrap();
                self.posted += 1;
            }
            while let Some(t) = self.a.e.poll_transmit(now, &mut self.buf) {
                self.b.e.handle_packet(now, t.endpoints, &self.buf[..t.len]);
                self.data_pkts += 1;
            }
            while let Some(t) = self.b.e.poll_transmit(now, &mut self.buf) {
                self.a.e.handle_packet(now, t.endpoints, &self.buf[..t.len]);
                self.ack_pkts += 1;
            }
            self.wcs.clear();
            let got = self.a.e.poll_cq(self.a.cq, 256, &mut self.wcs).unwrap();
            for wc in &self.wcs {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            }
            self.completed += got as u64;
            let _ = self.b.e.poll_cq(self.b.cq, 256, &mut self.wcs);
        }
        n
    }
}

/// 4 KiB copies into a 1 MiB buffer at rotating offsets, the same pattern
/// as the WRITEs' destinations.
struct Memcpy {
    src: Vec<u8>,
    dst: Vec<u8>,
    i: usize,
}

impl Memcpy {
    fn new() -> Self {
        Memcpy {
            src: vec![0xA5u8; MSG],
            dst: vec![0u8; REGION],
            i: 0,
        }
    }

    /// 256 copies; returns 256.
    fn run(&mut self) -> u64 {
        let slots = REGION / MSG;
        for _ in 0..256 {
            let off = (self.i % slots) * MSG;
            self.dst[off..off + MSG].copy_from_slice(black_box(&self.src));
            black_box(&mut self.dst);
            self.i += 1;
        }
        256
    }
}

/// Nanoseconds per call of `f`.
fn ns_per(b: &Bench, mut f: impl FnMut()) -> f64 {
    let r = b.rate(Duration::from_millis(300), || {
        for _ in 0..64 {
            f();
        }
        64
    });
    if r > 0.0 {
        1e9 / r
    } else {
        0.0
    }
}

fn breakdown(b: &Bench) -> Vec<(&'static str, f64)> {
    let ep = Endpoints::new(addr(1), addr(2));
    let payload = vec![0x3Cu8; MSG];
    let pkt = PacketRepr {
        bth: BthRepr::new(Opcode::RC_WRITE_ONLY, 0x11, Psn::new(7)),
        headers: Headers::Reth(RethRepr {
            va: 0x1000,
            rkey: 0x1234,
            dma_len: MSG as u32,
        }),
        payload: &payload,
    };
    let mut buf = vec![0u8; pkt.buffer_len()];
    pkt.emit(&mut buf, &ep).unwrap();
    let len = buf.len();
    let mut out = Vec::new();
    out.push((
        "icrc::verify of a 4 KiB WRITE_ONLY packet",
        ns_per(b, || {
            black_box(icrc::verify(&ep, black_box(&buf))).unwrap();
        }),
    ));
    out.push((
        "PacketRepr::parse",
        ns_per(b, || {
            black_box(PacketRepr::parse(black_box(&buf))).unwrap();
        }),
    ));
    let headers = pkt.headers;
    let mut tx = buf.clone();
    out.push((
        "emit_in_place (headers + ICRC seal)",
        ns_per(b, || {
            let n = emit_in_place(&pkt.bth, &headers, black_box(&mut tx), MSG, &ep).unwrap();
            black_box(n);
        }),
    ));
    let mem = RawMem::new(REGION);
    let off = payload_offset(&headers);
    let mut i = 0usize;
    out.push((
        "4 KiB copy out of a region (gather)",
        ns_per(b, || {
            // The WRITE bench reads its source at one offset.
            mem.read(0, &mut tx[off..off + MSG]);
            black_box(&mut tx);
        }),
    ));
    out.push((
        "4 KiB copy into a region (scatter)",
        ns_per(b, || {
            i = (i + 1) % (REGION / MSG);
            black_box(&mem).write(i * MSG, black_box(&buf[off..off + MSG]));
        }),
    ));
    let _ = len;
    out
}

/// Bytes per idle RC QP in RTS, measured over `n` QPs; and allocations per QP.
fn qp_bytes(n: u32) -> (f64, f64, usize) {
    let mut e = Engine::new(EngineConfig::new(addr(1)));
    let pd = e.alloc_pd();
    let cq = e.create_cq(16).unwrap();
    let mut buf = vec![0u8; 9000];
    // One QP first, so one-time growth of the engine's tables is not charged.
    let mk = |e: &mut Engine, i: u32| {
        let q = e
            .create_qp(QpInit {
                pd,
                qp_type: QpType::Rc,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: cap(128),
                sq_sig_all: false,
            })
            .unwrap();
        connect(e, q, addr(2), 0x100 + i, Mtu::Mtu4096);
    };
    mk(&mut e, 0);
    while e.poll_transmit(Instant(0), &mut buf).is_some() {}
    let (b0, a0) = (live(), ALLOCS.load(Ordering::Relaxed));
    for i in 1..=n {
        mk(&mut e, i);
    }
    // An idle QP has nothing to send: let the engine drop it from its ready list.
    while e.poll_transmit(Instant(0), &mut buf).is_some() {}
    let (b1, a1) = (live(), ALLOCS.load(Ordering::Relaxed));
    let per = (b1 - b0) as f64 / f64::from(n);
    let allocs = (a1 - a0) as f64 / f64::from(n);
    drop(e);
    (per, allocs, b1)
}

/// Total bytes of an engine holding `n` connected RC QPs.
fn engine_bytes(n: u32) -> usize {
    let before = live();
    let mut e = Engine::new(EngineConfig::new(addr(1)));
    let pd = e.alloc_pd();
    let cq = e.create_cq(1024).unwrap();
    for i in 0..n {
        let q = e
            .create_qp(QpInit {
                pd,
                qp_type: QpType::Rc,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: cap(128),
                sq_sig_all: false,
            })
            .unwrap();
        connect(&mut e, q, addr(2), 0x100 + i, Mtu::Mtu4096);
    }
    let mut buf = vec![0u8; 9000];
    while e.poll_transmit(Instant(0), &mut buf).is_some() {}
    let total = live() - before - buf.capacity();
    drop(e);
    total
}

/// A peer that published one QP and one region (what the driver reads from
/// a peer's tables, minus the shared-memory loads).
struct FixedPeer {
    qp: PeerQp,
    region: PeerRegion,
}

impl PeerView for FixedPeer {
    fn qp(&mut self, qpn: Qpn) -> Option<PeerQp> {
        (qpn == Qpn::from_raw(0x11)).then_some(self.qp)
    }
    fn region(&mut self, rkey: Rkey) -> Option<PeerRegion> {
        (rkey == Rkey::from_raw(0x5EED)).then_some(self.region)
    }
}

/// The direct path's engine calls for an 8-byte WRITE: ns for the plan,
/// the target check, completion plus poll, and all together; and the
/// allocations of 1000 whole operations.
fn direct(b: &Bench) -> ([f64; 4], u64) {
    let mut a = side(1, Arc::new(RawMem::new(REGION)));
    connect(&mut a.e, a.qpn, addr(2), 0x11, Mtu::Mtu4096);
    let target = 0x2000_0000;
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote_addr: target + 64,
            rkey: Rkey::from_raw(0x5EED),
        },
        vec![Sge {
            addr: a.base + 128,
            length: 8,
            lkey: a.keys.lkey,
        }],
    );
    let mut peer = FixedPeer {
        qp: PeerQp {
            pd: PdHandle::from_raw(7),
            access: all_access(),
            state: QpState::Rts,
        },
        region: PeerRegion {
            pd: PdHandle::from_raw(7),
            access: all_access(),
            iova: target,
            len: REGION as u64,
        },
    };
    let mut wcs = Vec::with_capacity(16);
    let (e, qpn, cq) = (&mut a.e, a.qpn, a.cq);
    // As the driver does it: the plan filled in place.
    let op = |e: &mut Engine, peer: &mut FixedPeer, wcs: &mut Vec<WorkCompletion>| {
        let mut plan = DirectPlan::new();
        e.plan_direct_into(qpn, &wr, &mut plan).unwrap();
        black_box(e.check_direct_target(&plan, peer).unwrap());
        e.complete_direct(&plan);
        wcs.clear();
        e.poll_cq(cq, 16, wcs).unwrap();
    };
    op(e, &mut peer, &mut wcs);
    let before = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..1000 {
        op(e, &mut peer, &mut wcs);
    }
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    let plan = e.plan_direct(qpn, &wr).unwrap();
    let mut into = DirectPlan::new();
    let t_plan = ns_per(b, || {
        e.plan_direct_into(qpn, black_box(&wr), &mut into).unwrap();
        black_box(&into);
    });
    let t_check = ns_per(b, || {
        black_box(e.check_direct_target(black_box(&plan), &mut peer).unwrap());
    });
    let t_complete = ns_per(b, || {
        e.complete_direct(black_box(&plan));
        wcs.clear();
        e.poll_cq(cq, 16, &mut wcs).unwrap();
    });
    let t_all = ns_per(b, || op(e, &mut peer, &mut wcs));
    ([t_plan, t_check, t_complete, t_all], allocs)
}

/// The 4 KiB RC WRITE against the memcpy baseline, on every CRC-32 path
/// this CPU supports (each forced in turn, so that this machine also shows
/// what a CPU without AVX-512 or without VPCLMULQDQ runs; only the one
/// `SOFTRDMA_CRC32` names if set), in interleaved rounds, best of each. Returns WRITEs/s on the native path, raw regions.
fn write_by_path(b: &Bench, full: bool) -> f64 {
    let native = crc32::active();
    let mut paths: Vec<crc32::Path> = vec![native];
    // SOFTRDMA_CRC32 set: that path alone (for profiles).
    if std::env::var_os("SOFTRDMA_CRC32").is_none() {
        paths.extend(
            crc32::Path::ALL
                .into_iter()
                .filter(|&p| p != native && p.supported()),
        );
    }
    let mut copy_step = Memcpy::new();
    let mut raw = WritePipe::new(|| Arc::new(RawMem::new(REGION)));
    let mut vec = WritePipe::new(|| Arc::new(VecMemory::new(REGION)));
    let mut copy = 0.0f64;
    let mut best = vec![(0.0f64, 0.0f64); paths.len()];
    for _ in 0..if full { 6 } else { 1 } {
        copy = copy.max(b.rate(Duration::from_millis(150), || copy_step.run()));
        for (p, w) in paths.iter().zip(&mut best) {
            crc32::force(*p);
            w.0 = w.0.max(b.rate(Duration::from_millis(300), || raw.run(256)));
            w.1 = w.1.max(b.rate(Duration::from_millis(150), || vec.run(256)));
        }
    }
    crc32::force(native);
    let copy_gbs = copy * MSG as f64 / 1e9;
    let acks_per_write = raw.ack_pkts as f64 / raw.data_pkts.max(1) as f64;
    println!();
    println!(
        "4 KiB copies (memcpy baseline): {copy_gbs:8.2} GB/s  ({:.2} M copies/s)",
        copy / 1e6
    );
    for (p, (w_raw, w_vec)) in paths.iter().zip(&best) {
        let tag = if *p == native { " (native)" } else { "" };
        for (name, w) in [
            ("raw-pointer regions", *w_raw),
            ("VecMemory regions  ", *w_vec),
        ] {
            let gbs = w * MSG as f64 / 1e9;
            println!(
                "RC WRITE 4 KiB, CRC-32 path {:<8} {name}: {gbs:6.2} GB/s  ({:.0} k data packets/s, {:.0} ns per WRITE) = {:.1}% of memcpy{tag}",
                p.name(),
                w / 1e3,
                if w > 0.0 { 1e9 / w } else { 0.0 },
                if copy > 0.0 { 100.0 * w / copy } else { 0.0 },
            );
        }
    }
    println!(
        "  ACK packets per data packet: {acks_per_write:.4} (a window of {WINDOW} WRITEs is moved per round; ACKs coalesce)"
    );
    best[0].0
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let b = Bench { full, filter };
    println!("softrdma-engine bench: one thread, no I/O, two engines joined by function calls");
    if !full {
        println!("(smoke run: pass --bench, as `cargo bench` does, for figures)");
    }

    println!("CPU: {}", softrdma_wire::crc32::cpu_flags());
    let native = crc32::active();
    let mut w_raw = 0.0f64;
    if b.wants("write") {
        w_raw = write_by_path(&b, full);
    }

    if b.wants("breakdown") {
        println!();
        println!(
            "Where one 4 KiB WRITE's time goes (CRC-32 path {native}, each piece timed alone):"
        );
        let parts = breakdown(&b);
        let mut sum = 0.0;
        for (what, ns) in &parts {
            println!("  {what:45} {ns:8.0} ns");
            sum += ns;
        }
        if w_raw > 0.0 {
            let total = 1e9 / w_raw;
            println!(
                "  {:45} {:8.0} ns (both ends, ACK share included)",
                "measured WRITE, raw-pointer regions", total
            );
            println!("  {:45} {:8.0} ns", "pieces above, once each", sum);
            println!(
                "  {:45} {:8.0} ns",
                "remainder: engine bookkeeping",
                total - sum
            );
        }
    }

    if b.wants("memory") {
        println!();
        let n = if full { 1000 } else { 50 };
        let (per, allocs, _) = qp_bytes(n);
        println!(
            "Idle RC QP in RTS (empty queues): {per:.0} bytes per QP ({allocs:.2} allocations), measured over {n} QPs"
        );
        let n10k = if full { 10_000 } else { 200 };
        let total = engine_bytes(n10k);
        println!(
            "{n10k} RC QPs in RTS in one engine: {total} bytes ({:.2} MB, {:.0} bytes per QP)",
            total as f64 / 1e6,
            total as f64 / f64::from(n10k)
        );
    }

    if b.wants("direct") {
        println!();
        let ([plan, check, complete, all], allocs) = direct(&b);
        assert_eq!(allocs, 0, "the direct path's engine calls allocated");
        println!("Direct 8-byte WRITE, the engine's part (no copy, no shared-memory loads):");
        println!("  {:45} {plan:8.1} ns", "plan_direct_into");
        println!(
            "  {:45} {check:8.1} ns",
            "check_direct_target (fixed peer view)"
        );
        println!("  {:45} {complete:8.1} ns", "complete_direct + poll_cq");
        println!(
            "  {:45} {all:8.1} ns ({allocs} allocations in 1000)",
            "all of it"
        );
    }
}
