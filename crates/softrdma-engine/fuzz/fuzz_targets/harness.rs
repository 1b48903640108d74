//! The responder fuzz harness, shared by the cargo-fuzz target
//! (`fuzz_targets/responder.rs`) and the bounded deterministic run of the
//! normal suite (`tests/responder_fuzz.rs`), so the fuzz body is compiled and
//! run by `cargo test` on stable even where cargo-fuzz is not available.
//!
//! One input drives one responder engine that holds:
//!
//! - memory regions with every mix of access flags (including none, a
//!   zero-length one, one ending just below `u64::MAX`, two adjacent ones,
//!   one in a second protection domain at the same address as one in the
//!   first, one deregistered during setup and one the input may deregister);
//! - QPs of every type in RTS with known destination QPN and PSNs (RC with a
//!   receive queue, RC on an SRQ, UC, UD, an RC QP left in RTR, one left in
//!   INIT, and QPs in the second PD), with posted receive WQEs pointing at
//!   good and bad buffers;
//! - two guard regions that are never registered.
//!
//! The input is read as a sequence of commands: mostly packets built with
//! `softrdma_wire` from input-chosen opcode, header fields and payload (with a
//! valid ICRC, so they reach execution), plus multi-packet messages with
//! optional defects, mutated and raw packets, receive posts, clock advances,
//! QP resets and errors, and deregistration.
//!
//! Every region is a [`ModelMemory`] that asserts each access is inside the
//! region and records it. After each step the harness checks every recorded
//! access against what the step may legitimately touch:
//!
//! - a packet that fails the ICRC, does not parse, goes to a QP that does not
//!   exist or is not receiving, of the wrong transport, from the wrong peer
//!   or with a P_Key that does not match the port's touches nothing (and
//!   every packet the engine sends carries the port's P_Key);
//! - RDMA WRITE payloads land only in a region whose rkey the message named,
//!   that grants REMOTE_WRITE, in the QP's PD, on a QP whose access flags
//!   allow remote writes, inside `[reth.va, reth.va + dma_len)`, contiguously
//!   packet after packet, and the bytes written are the packet's payload;
//! - SEND payloads (and the UD GRH) land only in regions with LOCAL_WRITE, in
//!   the QP's PD, inside an SGE posted to that QP's receive queue (or its
//!   SRQ) with that region's lkey, in payload order;
//! - atomics touch 8 aligned bytes at the AtomicETH address of a region with
//!   REMOTE_ATOMIC whose rkey the packet named, on a QP allowing atomics;
//! - reads happen only while producing a READ response, in a region with
//!   REMOTE_READ on a QP allowing remote reads, inside a range some READ
//!   request to that QP asked for, and the response carries exactly the
//!   bytes read;
//! - a deregistered region, and every region of the other PD except through
//!   that PD's QPs, sees no access; the guard regions see none at all;
//! - every packet the engine sends has a valid ICRC and parses.
//!
//! A violation panics with a description: the fuzzer reports it as a crash,
//! the bounded test as a failure with the input that caused it.

#![allow(dead_code)] // the fuzz target does not read the statistics

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use softrdma_engine::{
    AccessFlags, AhAttr, AttrMask, CqHandle, Engine, EngineConfig, Gid, Instant, Lkey, MrKeys, Mtu,
    PdHandle, QpAttr, QpCap, QpInit, QpState, QpType, Qpn, RecvWr, RegionMemory, Rkey, Sge,
    SrqHandle, SrqInit, WcStatus, WorkCompletion, GRH_LEN,
};
use softrdma_wire::{
    icrc, AethRepr, AtomicEthRepr, BthRepr, DethRepr, Endpoints, HeaderLayout, Headers, Msn,
    NakCode, OpKind, Opcode, OpcodeInfo, PacketRepr, Position, Psn, RethRepr, Syndrome, Transport,
    OPCODE_TABLE,
};

// ---------------------------------------------------------------------------
// Input
// ---------------------------------------------------------------------------

/// Reads fuzz input as numbers; past the end everything reads as zero.
#[derive(Debug)]
pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    /// Reads `data` from the start.
    pub fn new(data: &'a [u8]) -> Self {
        Input { data, pos: 0 }
    }
    /// True once every byte was read.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }
    /// The next byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    /// Two bytes, little endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    /// Four bytes, little endian.
    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }
    /// Eight bytes, little endian.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    /// Up to `n` bytes (fewer at the end).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = start.saturating_add(n).min(self.data.len());
        self.pos = self.pos.saturating_add(n);
        &self.data[start..end]
    }
}

// ---------------------------------------------------------------------------
// The memory model
// ---------------------------------------------------------------------------

/// What the engine did to a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessKind {
    Read,
    Write,
    Atomic,
}

/// One recorded access.
#[derive(Debug, Clone)]
pub struct Access {
    /// Index of the region in [`REGIONS`] (or a guard: `GUARD_BASE + i`).
    pub region: usize,
    pub kind: AccessKind,
    pub offset: usize,
    pub len: usize,
    /// Bytes read or written; for atomics compare (or 0) then swap/add.
    pub data: Vec<u8>,
}

type Log = Arc<Mutex<Vec<Access>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A region that asserts every access is in bounds and records it in a
/// shared log for the harness to check against the step's permissions.
#[derive(Debug)]
pub struct ModelMemory {
    id: usize,
    len: usize,
    bytes: Mutex<Vec<u8>>,
    log: Log,
    accesses: AtomicU64,
}

impl ModelMemory {
    fn new(id: usize, len: usize, log: Log) -> Self {
        ModelMemory {
            id,
            len,
            bytes: Mutex::new(initial_contents(id, len)),
            log,
            accesses: AtomicU64::new(0),
        }
    }

    /// Accesses so far.
    pub fn accesses(&self) -> u64 {
        self.accesses.load(Ordering::Relaxed)
    }

    fn check(&self, offset: usize, len: usize, what: &str) {
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= self.len),
            "engine {what} outside region {}: offset {offset} len {len}, region length {}",
            region_name(self.id),
            self.len
        );
        self.accesses.fetch_add(1, Ordering::Relaxed);
    }

    fn record(&self, kind: AccessKind, offset: usize, len: usize, data: Vec<u8>) {
        lock(&self.log).push(Access {
            region: self.id,
            kind,
            offset,
            len,
            data,
        });
    }

    fn word(&self, offset: usize) -> u64 {
        let b = lock(&self.bytes);
        u64::from_ne_bytes(b[offset..offset + 8].try_into().unwrap())
    }

    fn set_word(&self, offset: usize, v: u64) {
        lock(&self.bytes)[offset..offset + 8].copy_from_slice(&v.to_ne_bytes());
    }
}

impl RegionMemory for ModelMemory {
    fn len(&self) -> usize {
        self.len
    }
    fn read(&self, offset: usize, dst: &mut [u8]) {
        self.check(offset, dst.len(), "read");
        dst.copy_from_slice(&lock(&self.bytes)[offset..offset + dst.len()]);
        self.record(AccessKind::Read, offset, dst.len(), dst.to_vec());
    }
    fn write(&self, offset: usize, src: &[u8]) {
        self.check(offset, src.len(), "write");
        lock(&self.bytes)[offset..offset + src.len()].copy_from_slice(src);
        self.record(AccessKind::Write, offset, src.len(), src.to_vec());
    }
    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> u64 {
        self.check(offset, 8, "compare-swap");
        let old = self.word(offset);
        if old == compare {
            self.set_word(offset, swap);
        }
        let mut d = compare.to_ne_bytes().to_vec();
        d.extend_from_slice(&swap.to_ne_bytes());
        self.record(AccessKind::Atomic, offset, 8, d);
        old
    }
    fn fetch_add(&self, offset: usize, add: u64) -> u64 {
        self.check(offset, 8, "fetch-add");
        let old = self.word(offset);
        self.set_word(offset, old.wrapping_add(add));
        let mut d = 0u64.to_ne_bytes().to_vec();
        d.extend_from_slice(&add.to_ne_bytes());
        self.record(AccessKind::Atomic, offset, 8, d);
        old
    }
}

// ---------------------------------------------------------------------------
// The fixture: regions and QPs
// ---------------------------------------------------------------------------

/// A registered region of the fixture.
#[derive(Debug, Clone, Copy)]
pub struct RegionSpec {
    pub name: &'static str,
    /// 0 or 1: which of the two protection domains.
    pub pd: usize,
    pub iova: u64,
    pub len: usize,
    pub access: AccessFlags,
}

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;
const RW: AccessFlags = AccessFlags::REMOTE_WRITE;
const RR: AccessFlags = AccessFlags::REMOTE_READ;
const RA: AccessFlags = AccessFlags::REMOTE_ATOMIC;
const NONE: AccessFlags = AccessFlags(0);
const ALL: AccessFlags = AccessFlags(LW.0 | RW.0 | RR.0 | RA.0);

/// Index of the region the input may deregister.
pub const DEREG_VICTIM: usize = 8;
/// Index of the region deregistered during setup.
pub const STALE: usize = 10;
/// Region ids of the never-registered guards start here.
pub const GUARD_BASE: usize = 100;

/// The regions.
#[rustfmt::skip]
pub const REGIONS: [RegionSpec; 12] = [
    RegionSpec { name: "all", pd: 0, iova: 0x1000_0000, len: 8192, access: ALL },
    // Starts right where "all" ends: a range crossing the boundary is in neither.
    RegionSpec { name: "write", pd: 0, iova: 0x1000_2000, len: 4096, access: AccessFlags(LW.0 | RW.0) },
    RegionSpec { name: "read", pd: 0, iova: 0x2000_0000, len: 4096, access: RR },
    RegionSpec { name: "atomic", pd: 0, iova: 0x3000_0000, len: 64, access: AccessFlags(LW.0 | RA.0) },
    RegionSpec { name: "local", pd: 0, iova: 0x4000_0000, len: 16384, access: LW },
    RegionSpec { name: "none", pd: 0, iova: 0x5000_0000, len: 4096, access: NONE },
    // Ends 4 KiB below 2^64: address arithmetic near the top must not wrap.
    RegionSpec { name: "high", pd: 0, iova: u64::MAX - 0x2FFF, len: 8192, access: ALL },
    // Same address as "all" but in the other PD.
    RegionSpec { name: "otherpd", pd: 1, iova: 0x1000_0000, len: 4096, access: ALL },
    RegionSpec { name: "dereg", pd: 0, iova: 0x6000_0000, len: 4096, access: ALL },
    RegionSpec { name: "empty", pd: 0, iova: 0x7000_0000, len: 0, access: ALL },
    RegionSpec { name: "stale", pd: 0, iova: 0x8000_0000, len: 4096, access: ALL },
    // Starts 4 bytes past an 8-byte boundary: aligned atomics land at offsets 4 mod 8.
    RegionSpec { name: "odd", pd: 0, iova: 0x9000_0004, len: 260, access: ALL },
];

fn region_name(id: usize) -> String {
    match REGIONS.get(id) {
        Some(r) => r.name.to_string(),
        None => format!("guard{}", id - GUARD_BASE),
    }
}

/// A QP of the fixture.
#[derive(Debug, Clone, Copy)]
pub struct QpSpec {
    pub qp_type: QpType,
    pub pd: usize,
    /// Remote access rights of the QP (ignored for UD).
    pub access: AccessFlags,
    pub mtu: Mtu,
    pub srq: bool,
    /// The state the fixture leaves it in.
    pub state: QpState,
    pub max_dest_rd_atomic: u8,
}

#[rustfmt::skip]
pub const QPS: [QpSpec; 10] = [
    QpSpec { qp_type: QpType::Rc, pd: 0, access: ALL, mtu: Mtu::Mtu1024, srq: false, state: QpState::Rts, max_dest_rd_atomic: 4 },
    QpSpec { qp_type: QpType::Rc, pd: 0, access: RR, mtu: Mtu::Mtu256, srq: false, state: QpState::Rts, max_dest_rd_atomic: 1 },
    QpSpec { qp_type: QpType::Rc, pd: 0, access: AccessFlags(RW.0 | RA.0), mtu: Mtu::Mtu512, srq: true, state: QpState::Rts, max_dest_rd_atomic: 2 },
    QpSpec { qp_type: QpType::Uc, pd: 0, access: RW, mtu: Mtu::Mtu256, srq: false, state: QpState::Rts, max_dest_rd_atomic: 0 },
    QpSpec { qp_type: QpType::Uc, pd: 0, access: NONE, mtu: Mtu::Mtu1024, srq: true, state: QpState::Rts, max_dest_rd_atomic: 0 },
    QpSpec { qp_type: QpType::Ud, pd: 0, access: NONE, mtu: Mtu::Mtu4096, srq: false, state: QpState::Rts, max_dest_rd_atomic: 0 },
    QpSpec { qp_type: QpType::Rc, pd: 0, access: ALL, mtu: Mtu::Mtu4096, srq: false, state: QpState::Rtr, max_dest_rd_atomic: 16 },
    QpSpec { qp_type: QpType::Rc, pd: 0, access: ALL, mtu: Mtu::Mtu1024, srq: false, state: QpState::Init, max_dest_rd_atomic: 4 },
    QpSpec { qp_type: QpType::Rc, pd: 1, access: ALL, mtu: Mtu::Mtu1024, srq: false, state: QpState::Rts, max_dest_rd_atomic: 4 },
    QpSpec { qp_type: QpType::Ud, pd: 1, access: NONE, mtu: Mtu::Mtu4096, srq: false, state: QpState::Rts, max_dest_rd_atomic: 0 },
];

/// The UD Q_Key of the fixture.
pub const QKEY: u32 = 0x1111_2222;

fn local_addr() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), 4791)
}

fn peer_ip() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))
}

/// The responder's one P_Key (the port's table entry 0).
const PORT_PKEY: u16 = 0xFFFF;

/// The IBTA P_Key rule, written out here as the model: equal low 15 bits,
/// not the invalid P_Key, and one of the two a full member.
fn pkey_ok(pkey: u16) -> bool {
    let low = pkey & 0x7FFF;
    low != 0 && low == PORT_PKEY & 0x7FFF && (pkey | PORT_PKEY) & 0x8000 != 0
}

/// The QPN of the remote end of fixture QP `i`.
fn remote_qpn(i: usize) -> u32 {
    0x100 + i as u32
}

/// How far the run got, so a bounded run can show it was not vacuous.
#[derive(Debug, Default, Clone, Copy)]
pub struct Reached {
    pub commands: u64,
    pub packets: u64,
    /// Packets that passed the ICRC and parsed.
    pub valid_packets: u64,
    pub remote_writes: u64,
    pub recv_writes: u64,
    pub atomics: u64,
    pub reads: u64,
    pub transmitted: u64,
    pub acks: u64,
    pub seq_naks: u64,
    pub rnr_naks: u64,
    pub error_naks: u64,
    pub read_responses: u64,
    pub atomic_acks: u64,
    pub recv_ok: u64,
    pub recv_err: u64,
    pub qp_errors: u64,
    pub resets: u64,
    pub multi_packet_messages: u64,
    pub deregs: u64,
}

/// The live state of one fixture QP as the harness tracks it.
#[derive(Debug, Clone)]
struct QpTrack {
    qpn: Qpn,
    /// The PSN the responder most likely expects next.
    epsn: Psn,
    /// `(rkey, start, end, cursor)` of the WRITE in progress.
    write: Option<(u32, u64, u64, u64)>,
    /// `(rkey, va, len)` of every READ request sent to it.
    read_windows: Vec<(u32, u64, u64)>,
}

/// One engine with the fixture, plus everything the checks need.
pub struct Harness {
    pub engine: Engine,
    now: Instant,
    log: Log,
    mems: Vec<Arc<ModelMemory>>,
    guards: Vec<Arc<ModelMemory>>,
    keys: Vec<MrKeys>,
    registered: Vec<bool>,
    pds: [PdHandle; 2],
    cq: CqHandle,
    srq: SrqHandle,
    qps: Vec<QpTrack>,
    /// `(lkey, addr, len)` of every SGE posted, by receive queue: QP index,
    /// or `QPS.len()` for the SRQ.
    recv_sges: Vec<Vec<(Lkey, u64, u64)>>,
    last_packet: Vec<u8>,
    last_ep: Endpoints,
    undrained: usize,
    buf: Vec<u8>,
    wcs: Vec<WorkCompletion>,
    pub reached: Reached,
}

fn sge_template(h: &Harness, t: u8, pd: usize) -> Sge {
    let k = |r: usize| h.keys[r].lkey;
    let at = |r: usize, off: u64, len: u32| Sge {
        addr: REGIONS[r].iova.wrapping_add(off),
        length: len,
        lkey: k(r),
    };
    let local = if pd == 0 { 4 } else { 7 };
    match t % 12 {
        0 => at(local, 0, 2048),
        1 => at(local, 2048, 100),
        2 => at(local, 4096, 3000),
        3 => at(0, 0, 1000),
        4 => at(5, 0, 1024),     // no LOCAL_WRITE
        5 => at(2, 0, 512),      // REMOTE_READ only
        6 => at(4, 16000, 1000), // runs past the end
        7 => Sge {
            addr: 0x4000_0000,
            length: 64,
            lkey: Lkey::from_raw(0xDEAD_BEEF),
        },
        8 => at(7, 0, 4096), // other PD for PD-0 QPs
        9 => at(local, 0, 4096),
        10 => at(6, 4096, 4096), // "high", ending 4 KiB below 2^64
        _ => at(STALE, 0, 64),   // deregistered
    }
}

impl Harness {
    /// Builds the fixture.
    pub fn new() -> Self {
        let mut cfg = EngineConfig::new(local_addr());
        cfg.seed = 0xF022;
        let mut engine = Engine::new(cfg);
        let log: Log = Arc::new(Mutex::new(Vec::new()));
        let pds = [engine.alloc_pd(), engine.alloc_pd()];
        let cq = engine.create_cq(1 << 16).unwrap();
        let mut mems = Vec::new();
        let mut keys = Vec::new();
        for (i, r) in REGIONS.iter().enumerate() {
            let m = Arc::new(ModelMemory::new(i, r.len, log.clone()));
            let k = engine
                .reg_mr(pds[r.pd], r.iova, r.access, m.clone())
                .unwrap_or_else(|e| panic!("reg_mr {}: {e}", r.name));
            mems.push(m);
            keys.push(k);
        }
        engine.dereg_mr(keys[STALE].lkey).unwrap();
        let mut registered = vec![true; REGIONS.len()];
        registered[STALE] = false;
        let guards = (0..2)
            .map(|i| Arc::new(ModelMemory::new(GUARD_BASE + i, 4096, log.clone())))
            .collect();
        let srq = engine
            .create_srq(
                pds[0],
                SrqInit {
                    max_wr: 64,
                    max_sge: 4,
                    limit: 0,
                },
            )
            .unwrap();
        let mut qps = Vec::new();
        for s in QPS.iter() {
            let qpn = engine
                .create_qp(QpInit {
                    pd: pds[s.pd],
                    qp_type: s.qp_type,
                    send_cq: cq,
                    recv_cq: cq,
                    srq: s.srq.then_some(srq),
                    cap: QpCap {
                        max_send_wr: 16,
                        max_recv_wr: 64,
                        max_send_sge: 4,
                        max_recv_sge: 4,
                        max_inline_data: 64,
                    },
                    sq_sig_all: false,
                })
                .unwrap();
            qps.push(QpTrack {
                qpn,
                epsn: Psn::new(0),
                write: None,
                read_windows: Vec::new(),
            });
        }
        let mut h = Harness {
            engine,
            now: Instant(1_000_000),
            log,
            mems,
            guards,
            keys,
            registered,
            pds,
            cq,
            srq,
            qps,
            recv_sges: vec![Vec::new(); QPS.len() + 1],
            last_packet: Vec::new(),
            last_ep: Endpoints::new(SocketAddr::new(peer_ip(), 0xC000), local_addr()),
            undrained: 0,
            buf: vec![0u8; 8192],
            wcs: Vec::new(),
            reached: Reached::default(),
        };
        for i in 0..QPS.len() {
            h.bring_up(i, 0x10_0000 * i as u32 + 0x77);
        }
        // Receive WQEs of every template; QP 1 gets just one, so that SENDs
        // to it meet an empty receive queue (RNR) unless the input posts more.
        for (i, spec) in QPS.iter().enumerate() {
            if spec.srq {
                continue;
            }
            for t in 0..if i == 1 { 1 } else { 12u8 } {
                h.post_recv(i, &[t, t.wrapping_add(5)], t % 2 + 1);
            }
        }
        for t in 0..12u8 {
            h.post_recv(usize::MAX, &[t, t.wrapping_add(3)], 2 - t % 2);
        }
        h.expect_no_access("setup");
        h
    }

    /// Moves QP `i` from RESET to its fixture state with responder PSN `rq_psn`.
    fn bring_up(&mut self, i: usize, rq_psn: u32) {
        let s = QPS[i];
        let qpn = self.qps[i].qpn;
        let now = self.now;
        let mut a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: s.access,
            qkey: QKEY,
            ..Default::default()
        };
        let base = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
        let m = if s.qp_type == QpType::Ud {
            base | AttrMask::QKEY
        } else {
            base | AttrMask::ACCESS_FLAGS
        };
        self.engine.modify_qp(now, qpn, &a, m).unwrap();
        if s.state == QpState::Init {
            return;
        }
        a.qp_state = QpState::Rtr;
        a.ah_attr = AhAttr {
            dgid: Gid::from_ip(peer_ip()),
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        };
        a.path_mtu = s.mtu;
        a.dest_qp_num = Qpn::from_raw(remote_qpn(i));
        a.rq_psn = Psn::new(rq_psn);
        a.max_dest_rd_atomic = s.max_dest_rd_atomic;
        a.min_rnr_timer = 1;
        let conn = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN;
        let m = match s.qp_type {
            QpType::Ud => AttrMask::STATE,
            QpType::Uc => conn,
            QpType::Rc => conn | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER,
            // The harness makes no XRC QPs (tests/xrc.rs covers them).
            QpType::XrcIni | QpType::XrcTgt => conn,
        };
        self.engine.modify_qp(now, qpn, &a, m).unwrap();
        self.qps[i].epsn = Psn::new(rq_psn);
        if s.state == QpState::Rtr {
            return;
        }
        a.qp_state = QpState::Rts;
        a.sq_psn = Psn::new(0x42);
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 4;
        let m = match s.qp_type {
            QpType::Rc => {
                AttrMask::STATE
                    | AttrMask::SQ_PSN
                    | AttrMask::TIMEOUT
                    | AttrMask::RETRY_CNT
                    | AttrMask::RNR_RETRY
                    | AttrMask::MAX_QP_RD_ATOMIC
            }
            _ => AttrMask::STATE | AttrMask::SQ_PSN,
        };
        self.engine.modify_qp(now, qpn, &a, m).unwrap();
    }

    /// Posts a receive WQE built from SGE templates to QP `i` (usize::MAX: the SRQ).
    fn post_recv(&mut self, i: usize, templates: &[u8], nsge: u8) {
        let pd = if i == usize::MAX { 0 } else { QPS[i].pd };
        let sges: Vec<Sge> = (0..usize::from(nsge.clamp(1, 4)))
            .map(|j| sge_template(self, templates[j % templates.len()], pd))
            .collect();
        self.post_recv_sges(i, sges);
    }

    fn post_recv_sges(&mut self, i: usize, sges: Vec<Sge>) {
        let wr = RecvWr {
            wr_id: 0x5000 + self.reached.commands,
            sg_list: sges.clone(),
        };
        let (slot, r) = if i == usize::MAX {
            (QPS.len(), self.engine.post_srq_recv(self.srq, &wr))
        } else {
            (i, self.engine.post_recv(self.qps[i].qpn, &wr))
        };
        if r.is_ok() {
            self.recv_sges[slot].extend(sges.iter().map(|s| (s.lkey, s.addr, u64::from(s.length))));
        }
    }

    fn take_log(&self) -> Vec<Access> {
        std::mem::take(&mut *lock(&self.log))
    }

    fn expect_no_access(&self, what: &str) {
        let log = self.take_log();
        assert!(
            log.is_empty(),
            "{what} touched memory: {:?}",
            log.iter().map(brief).collect::<Vec<_>>()
        );
    }

    fn qp_index(&self, qpn: Qpn) -> Option<usize> {
        self.qps.iter().position(|q| q.qpn == qpn)
    }

    /// The region whose remote key is `rkey`, if registered now.
    fn region_of_rkey(&self, rkey: Rkey) -> Option<usize> {
        (0..REGIONS.len()).find(|&r| self.registered[r] && self.keys[r].rkey == rkey)
    }

    /// Runs one whole input.
    pub fn run(&mut self, data: &[u8]) {
        let mut inp = Input::new(data);
        // Bound the work one input can cause.
        let mut budget = 400usize;
        while !inp.is_empty() && budget > 0 {
            budget -= 1;
            self.command(&mut inp);
        }
        self.drain();
        self.finish();
    }

    /// The final checks of a run.
    pub fn finish(&mut self) {
        self.expect_no_access("the end of the run");
        for g in &self.guards {
            assert_eq!(g.accesses(), 0, "an unregistered guard region was accessed");
            assert!(
                *lock(&g.bytes) == initial_contents(g.id, 4096),
                "a guard region changed"
            );
        }
        assert_eq!(
            self.mems[STALE].accesses(),
            0,
            "a region deregistered at setup was accessed"
        );
        assert!(*lock(&self.mems[STALE].bytes) == initial_contents(STALE, 4096));
    }

    fn command(&mut self, inp: &mut Input<'_>) {
        self.reached.commands += 1;
        self.now = self.now + Duration::from_micros(1);
        let c = inp.u8();
        match c {
            0..=159 => self.structured_packet(inp),
            160..=179 => self.message(inp),
            180..=194 => self.mutated_packet(inp),
            195..=199 => self.raw_packet(inp),
            200..=214 => {
                let q = usize::from(inp.u8()) % (QPS.len() + 1);
                let q = if q == QPS.len() { usize::MAX } else { q };
                let n = inp.u8() % 4 + 1;
                if inp.u8() < 200 {
                    let t = [inp.u8(), inp.u8(), inp.u8(), inp.u8()];
                    self.post_recv(q, &t, n);
                } else {
                    // Arbitrary SGEs.
                    let sges = (0..n)
                        .map(|_| {
                            let r = usize::from(inp.u8()) % REGIONS.len();
                            Sge {
                                addr: REGIONS[r]
                                    .iova
                                    .wrapping_add(u64::from(inp.u16()))
                                    .wrapping_sub(u64::from(inp.u8())),
                                length: u32::from(inp.u16()),
                                lkey: if inp.u8() < 240 {
                                    self.keys[r].lkey
                                } else {
                                    Lkey::from_raw(inp.u32())
                                },
                            }
                        })
                        .collect();
                    self.post_recv_sges(q, sges);
                }
                self.expect_no_access("post_recv");
            }
            215..=224 => {
                let us = u64::from(inp.u16()) * 16;
                self.now = self.now + Duration::from_micros(us);
                self.engine.handle_timeout(self.now);
                self.expect_no_access("handle_timeout");
                self.drain();
            }
            225..=231 => {
                let i = usize::from(inp.u8()) % QPS.len();
                let psn = inp.u32() & 0xFF_FFFF;
                self.reset_qp(i, psn);
            }
            232..=234 => {
                let i = usize::from(inp.u8()) % QPS.len();
                let a = QpAttr {
                    qp_state: QpState::Err,
                    ..Default::default()
                };
                let qpn = self.qps[i].qpn;
                let _ = self.engine.modify_qp(self.now, qpn, &a, AttrMask::STATE);
                self.expect_no_access("modify to ERR");
            }
            235..=236 => {
                if self.registered[DEREG_VICTIM] {
                    self.engine.dereg_mr(self.keys[DEREG_VICTIM].lkey).unwrap();
                    self.registered[DEREG_VICTIM] = false;
                    self.reached.deregs += 1;
                    self.expect_no_access("dereg_mr");
                }
            }
            _ => self.drain(),
        }
        self.poll_cq();
    }

    fn reset_qp(&mut self, i: usize, psn: u32) {
        let qpn = self.qps[i].qpn;
        let a = QpAttr {
            qp_state: QpState::Reset,
            ..Default::default()
        };
        self.engine
            .modify_qp(self.now, qpn, &a, AttrMask::STATE)
            .unwrap();
        self.bring_up(i, psn);
        self.qps[i].write = None;
        self.reached.resets += 1;
        if !QPS[i].srq {
            let n = if i == 1 { 1 } else { 4 };
            for t in [0u8, 3, 9, 1].into_iter().take(n) {
                self.post_recv(i, &[t, t + 1], 1 + t % 2);
            }
        }
        self.expect_no_access("reset");
    }

    fn poll_cq(&mut self) {
        self.wcs.clear();
        let _ = self.engine.poll_cq(self.cq, 4096, &mut self.wcs);
        for wc in &self.wcs {
            if matches!(
                wc.opcode,
                softrdma_engine::WcOpcode::Recv | softrdma_engine::WcOpcode::RecvRdmaWithImm
            ) {
                if wc.status == WcStatus::Success {
                    self.reached.recv_ok += 1;
                } else {
                    self.reached.recv_err += 1;
                }
            }
        }
        while let Some(e) = self.engine.poll_event() {
            if let softrdma_engine::Event::QpFatal { .. } = e {
                self.reached.qp_errors += 1;
            }
        }
    }

    // ----- building packets -----

    fn pick_psn(&self, inp: &mut Input<'_>, i: Option<usize>) -> Psn {
        let base = i.map_or(Psn::new(0), |i| self.qps[i].epsn);
        let s = inp.u8();
        match s {
            0..=179 => base,
            180..=199 => base.sub(1 + u32::from(s % 4)),
            200..=219 => base.add(1 + u32::from(s % 4)),
            220..=239 => base.sub(u32::from(inp.u16())),
            _ => Psn::new(inp.u32()),
        }
    }

    /// An rkey: mostly that of a region of PD `pd` granting `need`
    /// (registered or not), else any region's, an lkey, zero or random.
    fn pick_rkey(&self, inp: &mut Input<'_>, need: AccessFlags, pd: usize) -> (u32, Option<usize>) {
        let s = inp.u8();
        match s {
            0..=139 => {
                let fit: Vec<usize> = (0..REGIONS.len())
                    .filter(|&r| REGIONS[r].pd == pd && REGIONS[r].access.contains(need))
                    .collect();
                let r = fit[usize::from(inp.u8()) % fit.len()];
                (self.keys[r].rkey.raw(), Some(r))
            }
            140..=219 => {
                let r = usize::from(s) % REGIONS.len();
                (self.keys[r].rkey.raw(), Some(r))
            }
            220..=229 => {
                let r = usize::from(s) % REGIONS.len();
                (self.keys[r].lkey.raw(), Some(r))
            }
            230..=239 => (0, None),
            _ => (inp.u32(), None),
        }
    }

    /// A virtual address for `len` bytes, mostly inside region `r`.
    fn pick_va(inp: &mut Input<'_>, r: Option<usize>, len: u64, align8: bool) -> u64 {
        let r = REGIONS[r.unwrap_or(0)];
        let rlen = r.len as u64;
        let s = inp.u8();
        match s {
            0..=169 => {
                let room = rlen.saturating_sub(len) + 1;
                let va = r.iova.wrapping_add(u64::from(inp.u16()) % room);
                if align8 {
                    // The virtual address is what must be aligned, not the offset.
                    va & !7
                } else {
                    va
                }
            }
            170..=199 => r
                .iova
                .wrapping_add(rlen.wrapping_sub(len))
                .wrapping_add(1 + u64::from(s % 16)),
            200..=219 => r.iova.wrapping_sub(1 + u64::from(inp.u8())),
            220..=229 => r.iova.wrapping_add(u64::from(inp.u8() % 8)),
            _ => inp.u64(),
        }
    }

    fn pick_len(inp: &mut Input<'_>, pos: Position, mtu: usize) -> usize {
        let s = inp.u8();
        match s {
            0..=109 => match pos {
                Position::First | Position::Middle => mtu,
                Position::Last => 1 + usize::from(inp.u16()) % mtu,
                Position::Only => usize::from(inp.u16()) % (mtu + 1),
            },
            110..=149 => mtu,
            150..=179 => 0,
            180..=209 => mtu + 1 + usize::from(s % 16),
            _ => usize::from(inp.u16()) % 4200,
        }
    }

    fn endpoints(&self, inp: &mut Input<'_>, wrong_src: bool) -> Endpoints {
        let port = 0xC000 | (inp.u16() & 0x3FFF);
        let src = if !wrong_src {
            peer_ip()
        } else if inp.u8() & 1 == 0 {
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, inp.u8()))
        } else {
            IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1))
        };
        Endpoints::new(SocketAddr::new(src, port), local_addr())
    }

    /// One packet from input-chosen opcode, header fields and payload.
    fn structured_packet(&mut self, inp: &mut Input<'_>) {
        let flags = inp.u8();
        let qsel = inp.u8();
        let qi = (qsel < 240).then(|| usize::from(qsel) % QPS.len());
        let dest_qp = match qi {
            Some(i) => self.qps[i].qpn,
            None => Qpn::from_raw(inp.u32() & 0xFF_FFFF),
        };
        if let Some(i) = qi {
            if flags & 1 != 0 && self.engine.qp_state(dest_qp) == Some(QpState::Err) {
                let psn = self.qps[i].epsn.value();
                self.reset_qp(i, psn);
            }
        }
        let spec = qi.map(|i| QPS[i]);
        let transport = match spec.map(|s| s.qp_type) {
            Some(QpType::Uc) => Transport::Uc,
            Some(QpType::Ud) => Transport::Ud,
            _ => Transport::Rc,
        };
        let osel = inp.u8();
        let info = if osel < 140 {
            // A whole message in one packet: the likeliest to execute.
            let only: Vec<_> = OPCODE_TABLE
                .iter()
                .filter(|o| {
                    o.transport == transport && o.is_request && o.position == Position::Only
                })
                .collect();
            only[usize::from(inp.u8()) % only.len()]
        } else if osel < 210 {
            let requests: Vec<_> = OPCODE_TABLE
                .iter()
                .filter(|o| o.transport == transport && o.is_request)
                .collect();
            requests[usize::from(inp.u8()) % requests.len()]
        } else {
            &OPCODE_TABLE[usize::from(inp.u8()) % OPCODE_TABLE.len()]
        };
        let opcode = Opcode::from_u8(info.code).unwrap();
        let mtu = spec.map_or(1024, |s| s.mtu.bytes() as usize);
        let mut bth = BthRepr::new(opcode, dest_qp.raw(), self.pick_psn(inp, qi));
        bth.solicited = flags & 0x10 != 0;
        bth.ack_req = flags & 0x20 == 0;
        bth.mig_req = flags & 0x40 != 0 && inp.u8() & 1 == 1;
        if flags & 0x80 != 0 {
            // Mostly P_Keys that pass (full and limited members), so that
            // the packets still reach execution; sometimes any value.
            bth.pkey = match inp.u8() {
                0..=95 => PORT_PKEY,
                96..=175 => 0x7FFF,
                _ => inp.u16(),
            };
            bth.fecn = inp.u8() & 1 == 1;
            bth.becn = inp.u8() & 1 == 1;
        }
        let plen = if info.has_payload {
            Self::pick_len(inp, info.position, mtu)
        } else {
            0
        };
        let pd = spec.map_or(0, |s| s.pd);
        let headers = self.pick_headers(inp, info, plen, mtu, pd);
        let payload = make_payload(inp.u8(), plen);
        let ep = self.endpoints(inp, flags & 8 != 0);
        let pkt = PacketRepr {
            bth,
            headers,
            payload: &payload,
        };
        let mut bytes = vec![0u8; pkt.buffer_len()];
        // An IPv6 source towards this IPv4 device cannot be sealed: send it anyway.
        let _ = pkt.emit(&mut bytes, &ep);
        if flags & 4 != 0 && inp.u8() < 64 {
            // Corrupt after sealing: the ICRC must catch it.
            let at = usize::from(inp.u16()) % bytes.len();
            bytes[at] ^= 1 << (inp.u8() % 8);
        }
        self.deliver(ep, &bytes);
        if flags & 2 != 0 || self.undrained >= 8 {
            self.drain();
        }
    }

    fn pick_headers(
        &self,
        inp: &mut Input<'_>,
        info: &OpcodeInfo,
        plen: usize,
        mtu: usize,
        pd: usize,
    ) -> Headers {
        // An XRC request: RC's headers, then an XRCETH in front (below).
        let (layout, kind, pos) = (info.layout.without_xrceth(), info.kind, info.position);
        let reth = |inp: &mut Input<'_>| -> RethRepr {
            let dma_len: u32 = match inp.u8() {
                0..=149 => match (kind, pos) {
                    (OpKind::ReadRequest, _) => match inp.u8() % 4 {
                        0 => u32::from(inp.u8()),
                        1 => (mtu as u32) * u32::from(1 + inp.u8() % 4),
                        2 => u32::from(inp.u16()) % 9000,
                        _ => u32::from(inp.u16()) % (mtu as u32 * 3 + 1),
                    },
                    (_, Position::First) => ((plen as u32) * u32::from(2 + inp.u8() % 3))
                        .saturating_sub(u32::from(inp.u8()) % (mtu as u32)),
                    _ => plen as u32,
                },
                150..=179 => 0,
                180..=219 => u32::from(inp.u16()),
                _ => inp.u32(),
            };
            let need = if kind == OpKind::ReadRequest { RR } else { RW };
            let (rkey, r) = self.pick_rkey(inp, need, pd);
            let va = Self::pick_va(inp, r, u64::from(dma_len), false);
            RethRepr { va, rkey, dma_len }
        };
        let h = match layout {
            HeaderLayout::None => Headers::None,
            HeaderLayout::Imm => Headers::Imm(inp.u32()),
            HeaderLayout::Ieth => Headers::Ieth(inp.u32()),
            HeaderLayout::Reth => Headers::Reth(reth(inp)),
            HeaderLayout::RethImm => Headers::RethImm(reth(inp), inp.u32()),
            HeaderLayout::Aeth => Headers::Aeth(aeth(inp)),
            HeaderLayout::AtomicAck => Headers::AtomicAck(aeth(inp), inp.u64()),
            HeaderLayout::Atomic => {
                let (rkey, r) = self.pick_rkey(inp, RA, pd);
                let va = Self::pick_va(inp, r, 8, true);
                Headers::Atomic(AtomicEthRepr {
                    va,
                    rkey,
                    swap_add: inp.u64(),
                    compare: inp.u64(),
                })
            }
            HeaderLayout::Deth | HeaderLayout::DethImm => {
                let qkey = if inp.u8() < 220 { QKEY } else { inp.u32() };
                let d = DethRepr {
                    qkey,
                    src_qp: inp.u32() & 0xFF_FFFF,
                };
                if layout == HeaderLayout::Deth {
                    Headers::Deth(d)
                } else {
                    Headers::DethImm(d, inp.u32())
                }
            }
            HeaderLayout::Cnp => Headers::Cnp,
            // `without_xrceth` left none of these.
            _ => Headers::None,
        };
        if info.layout.has_xrceth() {
            let srqn = inp.u32() & 0xFF_FFFF;
            h.with_xrceth(srqn).unwrap_or(h)
        } else {
            h
        }
    }

    /// A whole SEND or WRITE message to a connected QP, packet by packet with
    /// the right PSNs and lengths, with an optional defect.
    fn message(&mut self, inp: &mut Input<'_>) {
        let connected: Vec<usize> = (0..QPS.len())
            .filter(|&i| QPS[i].qp_type != QpType::Ud)
            .collect();
        let i = connected[usize::from(inp.u8()) % connected.len()];
        if self.engine.qp_state(self.qps[i].qpn) == Some(QpState::Err) && inp.u8() < 200 {
            let psn = self.qps[i].epsn.value();
            self.reset_qp(i, psn);
        }
        let spec = QPS[i];
        let transport = if spec.qp_type == QpType::Uc {
            Transport::Uc
        } else {
            Transport::Rc
        };
        let mtu = spec.mtu.bytes() as usize;
        let kind = inp.u8() % 4;
        let len = usize::from(inp.u16()) % (4 * mtu + 1);
        let npkts = len.div_ceil(mtu).max(1);
        let (rkey, r) = self.pick_rkey(inp, RW, spec.pd);
        let va = Self::pick_va(inp, r, len as u64, false);
        let imm = inp.u32();
        let defect = inp.u8();
        let victim = usize::from(inp.u8()) % npkts;
        let ep = self.endpoints(inp, false);
        let data = make_payload(inp.u8(), len);
        let mut psn = self.qps[i].epsn;
        let mut pkts = Vec::new();
        for p in 0..npkts {
            let pos = match (p == 0, p + 1 == npkts) {
                (true, true) => Position::Only,
                (true, false) => Position::First,
                (false, false) => Position::Middle,
                (false, true) => Position::Last,
            };
            let reth = RethRepr {
                va,
                rkey,
                dma_len: len as u32,
            };
            let (op, headers) = match kind {
                0 => (OpKind::Send, Headers::None),
                1 if pos.ends_message() => (OpKind::Send, Headers::Imm(imm)),
                1 => (OpKind::Send, Headers::None),
                2 if pos.starts_message() => (OpKind::Write, Headers::Reth(reth)),
                2 => (OpKind::Write, Headers::None),
                _ => match pos {
                    Position::Only => (OpKind::Write, Headers::RethImm(reth, imm)),
                    Position::First => (OpKind::Write, Headers::Reth(reth)),
                    Position::Middle => (OpKind::Write, Headers::None),
                    Position::Last => (OpKind::Write, Headers::Imm(imm)),
                },
            };
            let Some(opcode) = Opcode::find(transport, op, pos, headers.layout()) else {
                return;
            };
            let mut bth = BthRepr::new(opcode, self.qps[i].qpn.raw(), psn);
            bth.ack_req = pos.ends_message() || p % 4 == 3;
            psn = psn.next();
            let chunk = &data[p * mtu..((p + 1) * mtu).min(len)];
            let pkt = PacketRepr {
                bth,
                headers,
                payload: chunk,
            };
            let mut bytes = vec![0u8; pkt.buffer_len()];
            if pkt.emit(&mut bytes, &ep).is_err() {
                return;
            }
            pkts.push(bytes);
        }
        match defect {
            0..=199 => {}
            200..=209 => {
                pkts.remove(victim);
            }
            210..=219 if npkts > 1 => pkts.swap(victim, (victim + 1) % npkts),
            220..=229 => {
                let d = pkts[victim].clone();
                pkts.insert(victim, d);
            }
            230..=239 => {
                let n = pkts[victim].len();
                pkts[victim][n / 2] ^= 0x10;
            }
            _ => {
                // Reseal after a change to a header byte: a well-formed lie.
                let b = &mut pkts[victim];
                let at = usize::from(inp.u8()) % 12.min(b.len());
                b[at] ^= inp.u8() | 1;
                let _ = icrc::seal(&ep, b);
            }
        }
        if npkts > 1 {
            self.reached.multi_packet_messages += 1;
        }
        for p in pkts {
            self.deliver(ep, &p);
        }
        self.drain();
    }

    /// The last packet with some bytes changed, resealed or not.
    fn mutated_packet(&mut self, inp: &mut Input<'_>) {
        if self.last_packet.is_empty() {
            return self.raw_packet(inp);
        }
        let mut b = self.last_packet.clone();
        let ep = self.last_ep;
        let n = inp.u8() % 4 + 1;
        for _ in 0..n {
            if b.is_empty() {
                break;
            }
            match inp.u8() % 6 {
                0 | 1 => {
                    let at = usize::from(inp.u16()) % b.len();
                    b[at] ^= inp.u8() | 1;
                }
                2 => {
                    let at = usize::from(inp.u8()) % b.len().min(44);
                    b[at] = inp.u8();
                }
                3 => {
                    let keep = usize::from(inp.u16()) % (b.len() + 1);
                    b.truncate(keep);
                }
                4 => {
                    let extra = inp.u8();
                    b.resize(b.len() + usize::from(extra % 64), extra);
                }
                _ => {
                    // Move the PSN to the expected one of the target, if known.
                    if b.len() >= 12 {
                        let qpn = u32::from_be_bytes([0, b[5], b[6], b[7]]);
                        if let Some(i) = self.qp_index(Qpn::from_raw(qpn)) {
                            let p = self.qps[i].epsn.value();
                            b[9..12].copy_from_slice(&p.to_be_bytes()[1..]);
                        }
                    }
                }
            }
        }
        if inp.u8() < 200 && b.len() >= 16 {
            let _ = icrc::seal(&ep, &mut b);
        }
        self.deliver(ep, &b);
        if inp.u8() & 1 == 0 {
            self.drain();
        }
    }

    /// Bytes straight from the input, usually sealed with a valid ICRC.
    fn raw_packet(&mut self, inp: &mut Input<'_>) {
        let n = usize::from(inp.u16()) % 600;
        let seal = inp.u8() < 200;
        let ep = self.endpoints(inp, false);
        let mut b = inp.bytes(n).to_vec();
        if seal && b.len() >= 16 {
            let _ = icrc::seal(&ep, &mut b);
        }
        self.deliver(ep, &b);
        self.drain();
    }

    // ----- running the engine and checking what it did -----

    fn deliver(&mut self, ep: Endpoints, bytes: &[u8]) {
        self.reached.packets += 1;
        self.undrained += 1;
        let parsed = if icrc::verify(&ep, bytes).is_ok() {
            PacketRepr::parse(bytes).ok()
        } else {
            None
        };
        let target =
            parsed.and_then(|p| self.qp_index(Qpn::from_raw(p.bth.dest_qp)).map(|i| (p, i)));
        let state = target.map(|(_, i)| self.engine.qp_state(self.qps[i].qpn));
        self.engine.handle_packet(self.now, ep, bytes);
        let log = self.take_log();
        self.last_packet = bytes.to_vec();
        self.last_ep = ep;
        if parsed.is_some() {
            self.reached.valid_packets += 1;
        }
        let Some((pkt, i)) = target else {
            assert!(
                log.is_empty(),
                "a packet that is invalid or for no QP touched memory: {:?}",
                log.iter().map(brief).collect::<Vec<_>>()
            );
            return;
        };
        let spec = QPS[i];
        let info = pkt.bth.opcode.info();
        let receiving = matches!(
            state,
            Some(Some(
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            ))
        );
        let transport_ok = info.transport
            == match spec.qp_type {
                QpType::Rc => Transport::Rc,
                QpType::Uc => Transport::Uc,
                QpType::Ud => Transport::Ud,
                QpType::XrcIni | QpType::XrcTgt => Transport::Xrc,
            };
        let peer_ok = spec.qp_type == QpType::Ud || ep.src.ip() == peer_ip();
        let reaches =
            receiving && transport_ok && peer_ok && pkey_ok(pkt.bth.pkey) && info.is_request;
        // Expected-PSN bookkeeping (corrected later from the ACKs the responder sends).
        if reaches {
            let t = &mut self.qps[i];
            match spec.qp_type {
                QpType::Uc => t.epsn = pkt.bth.psn.next(),
                QpType::Rc if pkt.bth.psn == t.epsn => {
                    t.epsn = match pkt.headers.reth() {
                        Some(r) if info.kind == OpKind::ReadRequest => pkt.bth.psn.add(
                            (u64::from(r.dma_len)
                                .div_ceil(u64::from(spec.mtu.bytes()))
                                .max(1)) as u32,
                        ),
                        _ => pkt.bth.psn.next(),
                    };
                }
                _ => {}
            }
            if info.kind == OpKind::ReadRequest {
                if let Some(r) = pkt.headers.reth() {
                    t.read_windows.push((r.rkey, r.va, u64::from(r.dma_len)));
                }
            }
        }
        if log.is_empty() {
            return;
        }
        let what = format!(
            "{} psn {} to QP {i} ({:?} {:?})",
            pkt.bth.opcode.name(),
            pkt.bth.psn.value(),
            spec.qp_type,
            state
        );
        assert!(
            reaches,
            "{what}: a packet the QP must not execute touched memory: {:?}",
            log.iter().map(brief).collect::<Vec<_>>()
        );
        for a in &log {
            self.check_common(a, i, &what);
        }
        match info.kind {
            OpKind::Write => self.check_remote_write(&log, i, &pkt, &what),
            OpKind::Send => self.check_recv_writes(&log, i, &pkt, &what),
            OpKind::CompareSwap | OpKind::FetchAdd => {
                assert_eq!(log.len(), 1, "{what}: one atomic access expected");
                let a = &log[0];
                assert_eq!(a.kind, AccessKind::Atomic, "{what}: {}", brief(a));
                let Headers::Atomic(h) = pkt.headers else {
                    panic!("{what}: atomic without AtomicETH");
                };
                let r = REGIONS[a.region];
                assert!(
                    r.access.contains(RA),
                    "{what}: atomic on {} without REMOTE_ATOMIC",
                    r.name
                );
                assert!(
                    spec.access.contains(RA),
                    "{what}: atomic on a QP without REMOTE_ATOMIC"
                );
                assert_eq!(
                    self.keys[a.region].rkey,
                    Rkey::from_raw(h.rkey),
                    "{what}: atomic on a region of another rkey"
                );
                assert_eq!(
                    r.iova.wrapping_add(a.offset as u64),
                    h.va,
                    "{what}: atomic at the wrong address"
                );
                assert_eq!(h.va % 8, 0, "{what}: unaligned atomic executed");
                let compare = if info.kind == OpKind::CompareSwap {
                    h.compare
                } else {
                    0
                };
                assert_eq!(a.data[..8], compare.to_ne_bytes(), "{what}");
                assert_eq!(a.data[8..], h.swap_add.to_ne_bytes(), "{what}");
                self.reached.atomics += 1;
            }
            _ => panic!(
                "{what}: this opcode touches no memory on receipt: {:?}",
                log.iter().map(brief).collect::<Vec<_>>()
            ),
        }
    }

    /// Checks that hold for any access on behalf of QP `i`.
    fn check_common(&self, a: &Access, i: usize, what: &str) {
        assert!(
            a.region < REGIONS.len(),
            "{what}: unregistered guard region accessed: {}",
            brief(a)
        );
        let r = REGIONS[a.region];
        assert!(
            self.registered[a.region],
            "{what}: deregistered region {} accessed: {}",
            r.name,
            brief(a)
        );
        assert_eq!(
            r.pd,
            QPS[i].pd,
            "{what}: region {} of another PD accessed: {}",
            r.name,
            brief(a)
        );
        assert!(a.offset + a.len <= r.len);
    }

    fn check_remote_write(&mut self, log: &[Access], i: usize, pkt: &PacketRepr<'_>, what: &str) {
        let spec = QPS[i];
        assert_eq!(log.len(), 1, "{what}: one write per WRITE packet expected");
        let a = &log[0];
        let r = REGIONS[a.region];
        assert_eq!(a.kind, AccessKind::Write, "{what}: {}", brief(a));
        assert!(
            r.access.contains(RW),
            "{what}: remote write to {} without REMOTE_WRITE",
            r.name
        );
        assert!(
            spec.access.contains(RW),
            "{what}: remote write on a QP without REMOTE_WRITE"
        );
        assert_eq!(
            a.data, pkt.payload,
            "{what}: written bytes differ from the payload"
        );
        let va = r.iova.wrapping_add(a.offset as u64);
        let end = va + a.len as u64;
        let t = &mut self.qps[i];
        let (rkey, start, stop, cursor) = match pkt.headers.reth() {
            Some(h) => (h.rkey, h.va, h.va.wrapping_add(u64::from(h.dma_len)), h.va),
            None => t.write.unwrap_or_else(|| {
                panic!(
                    "{what}: a WRITE continuation with no message in progress wrote {}",
                    brief(a)
                )
            }),
        };
        assert_eq!(
            self.keys[a.region].rkey,
            Rkey::from_raw(rkey),
            "{what}: write to a region of another rkey"
        );
        assert_eq!(va, cursor, "{what}: write not where the message continues");
        assert!(
            va >= start && end <= stop,
            "{what}: write [{va:#x}, {end:#x}) outside the message [{start:#x}, {stop:#x})"
        );
        t.write = Some((rkey, start, stop, end));
        self.reached.remote_writes += 1;
    }

    fn check_recv_writes(&mut self, log: &[Access], i: usize, pkt: &PacketRepr<'_>, what: &str) {
        let slot = if QPS[i].srq { QPS.len() } else { i };
        let mut got = Vec::new();
        for a in log {
            let r = REGIONS[a.region];
            assert_eq!(a.kind, AccessKind::Write, "{what}: {}", brief(a));
            assert!(
                r.access.contains(LW),
                "{what}: receive into {} without LOCAL_WRITE",
                r.name
            );
            let va = r.iova.wrapping_add(a.offset as u64);
            let lkey = self.keys[a.region].lkey;
            assert!(
                self.recv_sges[slot]
                    .iter()
                    .any(|&(k, s, l)| k == lkey && va >= s && va - s + a.len as u64 <= l),
                "{what}: receive write {} is in no posted SGE",
                brief(a)
            );
            got.extend_from_slice(&a.data);
        }
        let payload_part = if QPS[i].qp_type == QpType::Ud {
            assert!(got.len() >= GRH_LEN.min(got.len()));
            &got[GRH_LEN.min(got.len())..]
        } else {
            &got[..]
        };
        assert!(
            pkt.payload.starts_with(payload_part),
            "{what}: received bytes are not the payload"
        );
        self.reached.recv_writes += 1;
    }

    /// Takes every packet the engine wants to send, checking each.
    pub fn drain(&mut self) {
        self.undrained = 0;
        let mut buf = std::mem::take(&mut self.buf);
        for _ in 0..10_000 {
            let Some(tx) = self.engine.poll_transmit(self.now, &mut buf) else {
                break;
            };
            let log = self.take_log();
            self.check_transmit(&buf[..tx.len], tx, &log);
        }
        self.expect_no_access("a poll_transmit that sent nothing");
        self.buf = buf;
    }

    fn check_transmit(&mut self, bytes: &[u8], tx: softrdma_engine::Transmit, log: &[Access]) {
        self.reached.transmitted += 1;
        assert!(
            icrc::verify(&tx.endpoints, bytes).is_ok(),
            "the engine sent a packet with a bad ICRC"
        );
        let pkt = PacketRepr::parse(bytes).expect("the engine sent a packet that does not parse");
        assert_eq!(tx.endpoints.src.ip(), local_addr().ip());
        let i = self
            .qp_index(tx.qpn)
            .unwrap_or_else(|| panic!("a packet from unknown QP {:#x}", tx.qpn));
        let spec = QPS[i];
        assert_eq!(
            pkt.bth.dest_qp,
            remote_qpn(i),
            "sent to the wrong remote QP"
        );
        assert_eq!(tx.endpoints.dst.ip(), peer_ip());
        assert_eq!(pkt.bth.pkey, PORT_PKEY, "sent without the QP's P_Key");
        let info = pkt.bth.opcode.info();
        let what = format!(
            "{} psn {} from QP {i}",
            pkt.bth.opcode.name(),
            pkt.bth.psn.value()
        );
        assert!(
            !info.is_request,
            "{what}: the responder fixture sent a request"
        );
        let t = &mut self.qps[i];
        match (info.kind, pkt.headers.aeth().map(|a| a.syndrome)) {
            (OpKind::Ack, Some(Syndrome::Ack { .. })) => {
                t.epsn = pkt.bth.psn.next();
                self.reached.acks += 1;
            }
            (OpKind::Ack, Some(Syndrome::RnrNak { .. })) => {
                t.epsn = pkt.bth.psn;
                self.reached.rnr_naks += 1;
            }
            (OpKind::Ack, Some(Syndrome::Nak(NakCode::PsnSequenceError))) => {
                t.epsn = pkt.bth.psn;
                self.reached.seq_naks += 1;
            }
            (OpKind::Ack, _) => self.reached.error_naks += 1,
            (OpKind::ReadResponse, _) => {
                if pkt.bth.psn.next().is_after(t.epsn) {
                    t.epsn = pkt.bth.psn.next();
                }
                self.reached.read_responses += 1;
            }
            (OpKind::AtomicAck, _) => {
                if pkt.bth.psn.next().is_after(t.epsn) {
                    t.epsn = pkt.bth.psn.next();
                }
                self.reached.atomic_acks += 1;
            }
            _ => panic!("{what}: unexpected opcode from a responder"),
        }
        if log.is_empty() {
            if info.kind == OpKind::ReadResponse {
                assert!(
                    pkt.payload.is_empty(),
                    "{what}: READ response data came from nowhere"
                );
            }
            return;
        }
        assert_eq!(
            info.kind,
            OpKind::ReadResponse,
            "{what}: only READ responses read memory"
        );
        assert_eq!(
            log.len(),
            1,
            "{what}: one read per response packet expected"
        );
        let a = &log[0];
        self.check_common(a, i, &what);
        let r = REGIONS[a.region];
        assert_eq!(a.kind, AccessKind::Read, "{what}: {}", brief(a));
        assert!(
            r.access.contains(RR),
            "{what}: READ response from {} without REMOTE_READ",
            r.name
        );
        assert!(
            spec.access.contains(RR),
            "{what}: READ response on a QP without REMOTE_READ"
        );
        let va = r.iova.wrapping_add(a.offset as u64);
        let rkey = self.keys[a.region].rkey;
        assert!(
            self.qps[i]
                .read_windows
                .iter()
                .any(|&(k, s, l)| k == rkey.raw() && va >= s && va - s + a.len as u64 <= l),
            "{what}: read {} outside every READ request to this QP",
            brief(a)
        );
        assert_eq!(
            pkt.payload,
            &a.data[..],
            "{what}: response payload is not what was read"
        );
        self.reached.reads += 1;
    }
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

fn aeth(inp: &mut Input<'_>) -> AethRepr {
    let b = inp.u8();
    let syndrome = match b >> 6 {
        0 => Syndrome::Ack { credits: b & 0x1F },
        1 => Syndrome::RnrNak { timer: b & 0x1F },
        _ => Syndrome::Nak(NakCode::from_value(b % 5).unwrap_or(NakCode::InvalidRequest)),
    };
    AethRepr {
        syndrome,
        msn: Msn::new(inp.u32()),
    }
}

/// Recognisable non-zero contents of region `id`, so READ responses carry data.
fn initial_contents(id: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8) ^ (id as u8).wrapping_mul(37))
        .collect()
}

fn make_payload(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(151).wrapping_add(seed))
        .collect()
}

fn brief(a: &Access) -> String {
    format!(
        "{:?} {} [{}..{})",
        a.kind,
        region_name(a.region),
        a.offset,
        a.offset + a.len
    )
}

/// Runs one input against a fresh fixture; returns how far it got.
pub fn run_one(data: &[u8]) -> Reached {
    let mut h = Harness::new();
    h.run(data);
    h.reached
}
