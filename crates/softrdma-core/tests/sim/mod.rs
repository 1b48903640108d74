//! The deterministic simulation harness.
//!
//! One seed decides everything ([`scenario::Scenario`]): two or three nodes
//! on a [`SimNet`] with loss, duplication, corruption, jitter and link cuts.
//! Each node is the production device core (`softrdma_core::DeviceCore`)
//! over a simulated port: packets go through its progress loop (receive
//! budget, timers, batched transmit, held ACKs), and the application posts
//! as a driver does (`try_direct` first, then `command`). In same-host
//! seeds ([`scenario::SAME_HOST`]) every port is on one `SimHost`: one-sided
//! WRs on an idle QP run through the direct path, executed in the peer's
//! memory after the engine's rules, and are checked like all others;
//! RC, UC and UD QPs (RC receivers sometimes on an SRQ; in XRC seeds
//! ([`scenario::XRC`]) those become XRC targets sharing their node's XRC
//! SRQ, reached by XRC initiators); and an application
//! that posts a random mix of SEND, SEND_WITH_IMM, WRITE, WRITE_WITH_IMM,
//! READ, CMP_AND_SWAP and FETCH_AND_ADD of 0 B to 1 MiB from unaligned,
//! scattered buffers, signaled or not, fenced or not, and keeps receive
//! queues topped up (sometimes lazily, to provoke RNR NAKs).
//!
//! After every network step the harness polls every CQ and checks:
//!
//! * each send WR completes exactly once, in posting order per send queue,
//!   with the status a correct HCA gives: success, or (RC) a
//!   RETRY_EXC_ERR that the wire justifies (see [`oracle`]) followed by
//!   WR_FLUSH_ERR for the rest;
//! * an RC success was acknowledged on the wire, and the memory it touched
//!   equals a reference model applied in posting order (READ data, atomic
//!   original values, WRITE targets);
//! * RC receives match the peer's receive-consuming messages one for one, in
//!   order, with the right length, immediate, solicited bit and data, and
//!   every acknowledged message has been received;
//! * UC and UD receives carry intact messages that were really sent (UD: to
//!   this QP with the right Q_Key, from the QP and GID reported, behind a GRH);
//!   UC WRITE targets hold, byte for byte, either the old or the new data;
//! * no unexpected asynchronous event; the ICRC catches every corrupted
//!   packet it covers; nothing is malformed;
//! * liveness: the work finishes within a virtual-time bound, and a cut path
//!   fails with RETRY_EXC_ERR within the retry budget.
//! * a WR the core executed directly never appears on the wire (it is taken
//!   out of the wire oracle), and its completion is checked against the
//!   same reference model (READ data, original values, WRITE targets).

#![allow(dead_code)]

pub mod alloc;
pub mod node;
pub mod oracle;
pub mod scenario;

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use softrdma_core::sim_port::{HostMemory, SimHost, SimPort};
use softrdma_core::DeviceCore;
use softrdma_engine::sim::{
    node_addr, LinkChange, LinkConfig, QueueState, SimNet, TapStage, Tapped, Verdict,
};
use softrdma_engine::*;
use softrdma_wire::{icrc, NakCode, OpKind, Opcode, PacketRepr, Psn, Syndrome, Transport};

use alloc::Ring;
use oracle::{OKind, Oracle};
use scenario::{Mode, Poison, Scenario};

/// The suite's node: the production device core over a simulated port.
pub type Core = DeviceCore<SimPort>;

use node::HarnessNode;

/// Local buffer pieces: (offset in a node's L region, length).
type Pieces = Vec<(u64, u32)>;

pub type Check<T = ()> = std::result::Result<T, String>;

macro_rules! ensure {
    ($c:expr, $($fmt:tt)*) => {
        if !$c {
            return Err(format!($($fmt)*));
        }
    };
}

const QKEY: u32 = 0x0BAD_CAFE;
const SLOTS: u64 = 8;
const SLOT_AREA: u64 = SLOTS * 8;
const UD_MAX: u32 = 4096;

/// Message bytes for message `id`: never zero (so that zero means "old" in
/// the UC byte check), different for every message.
pub fn gen_data(id: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD474);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        for b in r.next_u64().to_le_bytes() {
            v.push(if b == 0 { 0x5A } else { b });
        }
    }
    v.truncate(len);
    v
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    Cas,
    Faa,
    /// A memory-window bind (no packet; completes with IBV_WC_BIND_MW).
    Bind,
}

impl Op {
    fn consumes_rq(self) -> bool {
        matches!(self, Op::Send | Op::SendImm | Op::WriteImm)
    }
    fn writes_remote(self) -> bool {
        matches!(self, Op::Write | Op::WriteImm)
    }
    fn wc_opcode(self) -> WcOpcode {
        match self {
            Op::Send | Op::SendImm => WcOpcode::Send,
            Op::Write | Op::WriteImm => WcOpcode::RdmaWrite,
            Op::Read => WcOpcode::RdmaRead,
            Op::Cas => WcOpcode::CompSwap,
            Op::Faa => WcOpcode::FetchAdd,
            Op::Bind => WcOpcode::BindMw,
        }
    }
}

/// A receive-consuming message, as the receiver must see it.
#[derive(Debug)]
struct Msg {
    id: u64,
    op: Op,
    data: Rc<Vec<u8>>,
    imm: Option<u32>,
    solicited: bool,
    /// WRITE_WITH_IMM: offset of the target in the sender's remote area.
    roff: u64,
    /// Sender (harness QP index) and its WR.
    from: usize,
    wr_id: u64,
    received: std::cell::Cell<bool>,
}

#[derive(Debug)]
enum Expect {
    None,
    Data(Rc<Vec<u8>>),
    Orig(u64),
}

#[derive(Debug)]
struct Wr {
    wr_id: u64,
    op: Op,
    len: u64,
    signaled: bool,
    /// Local pieces: (offset in the node's L region, length).
    local: Vec<(u64, u32)>,
    /// The pieces belong to this WR (a fenced WR may borrow a READ's buffer).
    owns_local: bool,
    roff: u64,
    expect: Expect,
    msg: Option<Rc<Msg>>,
    posted_at: Instant,
    /// A deliberately invalid WR: the error it must complete with.
    poison: Option<WcStatus>,
    /// The device core executed it directly in the peer's memory.
    direct: bool,
}

#[derive(Debug)]
struct RecvBuf {
    wr_id: u64,
    pieces: Vec<(u64, u32)>,
    /// Owner of the pieces' allocator: a QP index, or None for the node's SRQ area.
    owner: Option<usize>,
}

impl RecvBuf {
    fn cap(&self) -> u64 {
        self.pieces.iter().map(|p| u64::from(p.1)).sum()
    }
}

struct Region {
    mem: Arc<dyn RegionMemory>,
    keys: MrKeys,
    base: u64,
}

impl Region {
    fn read(&self, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        if len > 0 {
            self.mem.read(off as usize, &mut v);
        }
        v
    }
    fn gather(&self, pieces: &[(u64, u32)], len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len);
        for &(o, l) in pieces {
            if v.len() >= len {
                break;
            }
            let n = (l as usize).min(len - v.len());
            v.extend(self.read(o, n));
        }
        v
    }
}

struct SrqH {
    id: SrqHandle,
    cap: u32,
    depth: usize,
    posted: HashMap<u64, RecvBuf>,
    ring: Ring,
    l_off: u64,
    /// An XRC SRQ's number, which initiators name in their XRCETHs.
    srqn: Option<u32>,
}

struct NodeH {
    pd: PdHandle,
    scq: CqHandle,
    rcq: CqHandle,
    l: Region,
    r: Region,
    srq: Option<SrqH>,
    /// The XRC domain of the node's XRC SRQ and target QPs.
    xrcd: Option<XrcdHandle>,
    /// UD address handles by destination node.
    ahs: Vec<AhHandle>,
}

struct QpH {
    node: usize,
    qpn: Qpn,
    qp_type: QpType,
    conn: Option<usize>,
    peer: Option<usize>,
    uses_srq: bool,
    mtu: u32,
    timeout: Duration,
    retry_cnt: u8,
    max_rnr_wait: Duration,
    // local buffers
    l_off: u64,
    ring: Ring,
    // requester
    ops_left: usize,
    sq: VecDeque<Wr>,
    next_wr_id: u64,
    unsignaled_run: usize,
    errored: Option<(Instant, WcStatus)>,
    oracle: Option<Oracle>,
    /// RC/UC: my area in the peer's R region.
    r_off: u64,
    r_size: u64,
    mirror: Vec<u8>,
    uc_next: u64,
    uc_writes: Vec<(u64, Rc<Vec<u8>>)>,
    /// RC: every WRITE posted, in posting order: (WR id, offset, length).
    /// A WRITE retired with an error may still have been executed by the
    /// responder (a flush says nothing about the remote side).
    rc_writes: Vec<(u64, u64, u64)>,
    /// UC/UD messages sent that a receiver may match, by length.
    sent: HashMap<u64, Vec<Rc<Msg>>>,
    // responder
    rq: VecDeque<RecvBuf>,
    recv_depth: usize,
    recv_cap: u32,
    /// RC: messages the peer sent to me, in order, not yet received.
    incoming: VecDeque<Rc<Msg>>,
    posted_count: u64,
    completed: u64,
    /// RC requester: post the scenario's poisoned WR as this (0-based) WR.
    poison_at: Option<u64>,
    /// Highest request PSN transmitted so far.
    max_tx: Option<Psn>,
    first_psn: Psn,
    /// A receive was flushed: no receive may succeed after it.
    recv_flushed: bool,
    /// When the QP last went back from SQD to RTS (work waits while in SQD).
    resumed_at: Instant,
    /// Memory windows: the type-2 window over the area the peer works in
    /// (bound through this QP by its first WR), its rkey, and whether the
    /// bind completed (only then does the peer use it).
    win: Option<(MwHandle, Rkey, WinState)>,
    /// Memory windows: this QP's own type-1 window that `Op::Bind` WRs
    /// rebind over its local area (and unbind), with its next rkey.
    scratch: Option<(MwHandle, Rkey)>,
    /// In SQD: the last PSN of the WQEs started before the drain; nothing
    /// after it may be transmitted until the QP is back in RTS.
    sqd: Option<Psn>,
    /// An XRC initiator: the number of the XRC SRQ at its peer's node that
    /// every WR it posts names.
    xrc_srqn: Option<u32>,
}

/// `ibv_inc_rkey`: the same window index, the next key byte.
fn next_rkey(r: Rkey) -> Rkey {
    Rkey::from_raw((r.raw() & !0xff) | (r.raw().wrapping_add(1) & 0xff))
}

/// Where a QP's type-2 window stands (memory-window scenarios).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WinState {
    /// The bind is still to be posted.
    Unposted,
    /// The bind WR with this id is posted.
    Posted(u64),
    /// The bind completed: the peer may use the window.
    Bound,
}

#[derive(Debug, Clone, Copy)]
struct WireEv {
    stage: TapStage,
    now: Instant,
    from: usize,
    to: usize,
    opcode: Opcode,
    dest_qp: u32,
    psn: Psn,
    syndrome: Option<Syndrome>,
    bad_qkey: bool,
}

#[derive(Default)]
struct WireLog {
    events: Vec<WireEv>,
    bad_qkey_tx: u64,
    /// Every transmitted packet (time, nodes, endpoints, bytes) folded in
    /// order: two runs with the same digest put the same bytes on the
    /// wire at the same instants (`tests/wire_digest.rs`).
    digest: WireDigest,
}

/// FNV-1a (64-bit) over the packets the engines transmit, and their number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireDigest {
    pub hash: u64,
    pub packets: u64,
}

impl Default for WireDigest {
    fn default() -> Self {
        WireDigest {
            hash: 0xCBF2_9CE4_8422_2325,
            packets: 0,
        }
    }
}

impl WireDigest {
    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.hash = (self.hash ^ u64::from(x)).wrapping_mul(0x0000_0100_0000_01B3);
        }
    }

    /// Folds in one transmitted packet.
    pub fn packet(&mut self, t: &Tapped<'_>) {
        self.packets += 1;
        self.bytes(&t.now.nanos().to_le_bytes());
        self.bytes(&[t.from as u8, t.to as u8]);
        self.bytes(t.endpoints.src.to_string().as_bytes());
        self.bytes(t.endpoints.dst.to_string().as_bytes());
        self.bytes(&(t.data.len() as u32).to_le_bytes());
        self.bytes(t.data);
    }
}

/// What one seed did.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub mode: Option<Mode>,
    pub ops: u64,
    pub completions: u64,
    pub recvs: u64,
    pub excused_retry_exc: u64,
    /// RETRY_EXC_ERR because the peer QP had failed (poisoned WR or cascade).
    pub peer_failures: u64,
    /// Invalid WRs that completed with their error.
    pub poisoned: u64,
    /// SQD drains completed.
    pub drains: u64,
    pub cut_failures: u64,
    pub packets: u64,
    pub corrupted: u64,
    pub virtual_ms: u64,
    /// One-sided WRs the device core executed directly in a same-host
    /// peer's memory, and of those, the signaled ones whose completion the
    /// oracle checked (data read, original value, target bytes).
    pub direct: u64,
    pub direct_verified: u64,
    /// On a fabric: packets its queues dropped, and CE marks its ports made
    /// (each counted by its receiver).
    pub tail_drops: u64,
    pub ce_marks: u64,
    /// Selective repeat: packets sent again alone, and requests held out
    /// of order by responders (device counters of every node).
    pub sr_retransmits: u64,
    pub ooo_held: u64,
    /// CNPs the nodes sent (DCQCN's notification point).
    pub cnp_sent: u64,
    /// Memory windows: binds that completed successfully, and WRITEs,
    /// READs and atomics posted through a window's rkey.
    pub mw_binds: u64,
    pub mw_ops: u64,
    /// XRC: WRs XRC initiators posted, and receives completed through an
    /// XRC SRQ (by target QPs).
    pub xrc_wrs: u64,
    pub xrc_recvs: u64,
}

pub struct World<N: HarnessNode> {
    sc: Scenario,
    net: SimNet<N>,
    rng: Rng,
    nodes: Vec<NodeH>,
    qps: Vec<QpH>,
    by_qpn: HashMap<(usize, Qpn), usize>,
    wire: Rc<RefCell<WireLog>>,
    next_msg: u64,
    start: Instant,
    /// When each cut takes effect: an event of the network's own, applied
    /// at exactly this instant (see `softrdma_engine::sim`).
    cut_at: Vec<Instant>,
    pending_recv_checks: Vec<Rc<Msg>>,
    trace: Option<Vec<String>>,
    summary: Summary,
    wrong_qkey_sent: u64,
}

fn npkts(len: u64, mtu: u32) -> u32 {
    len.div_ceil(u64::from(mtu)).max(1) as u32
}

impl<N: HarnessNode> World<N> {
    pub fn new(sc: Scenario, trace: bool) -> Check<Self> {
        let mut cfgs = Vec::new();
        for i in 0..sc.nodes {
            let mut c = EngineConfig::new(node_addr(i));
            c.seed = sc.seed.wrapping_mul(31).wrapping_add(i as u64);
            c.max_inflight = sc.max_inflight;
            c.ack_req_every = sc.ack_req_every;
            c.ack_delay_ns = sc.ack_delay_ns;
            if sc.dcqcn {
                let line = match (sc.fabric, sc.fabric_model) {
                    (Some(f), _) => f.rate_bps,
                    (None, Some(m)) => m.link_gbps * 1_000_000_000,
                    (None, None) => 100_000_000_000,
                };
                c.congestion = CongestionConfig::dcqcn(DcqcnParams::new(line));
            }
            cfgs.push(c);
        }
        // Same host: every port on one host, whose direct path reaches the
        // regions each node shares (its R region).
        let host = SimHost::new();
        let on = sc.same_host.then_some(&host);
        let nodes = cfgs.into_iter().map(|c| N::build(c, on)).collect();
        let mut net = SimNet::from_nodes(nodes, sc.seed, sc.net);
        net.set_jitter_fraction(sc.jitter_fraction);
        if let Some(f) = sc.fabric {
            let star = net.star(LinkConfig {
                queue_bytes: f.queue_bytes,
                ..LinkConfig::ethernet(f.rate_bps, f.delay)
            });
            for &l in star.down.iter().filter(|_| f.ecn_from.is_some()) {
                let k = f.ecn_from.unwrap_or(0);
                let mark = move |q: &QueueState| {
                    if q.queued_bytes >= k {
                        softrdma_wire::Ecn::Ce
                    } else {
                        q.ecn
                    }
                };
                net.set_ecn_hook(l, Some(Box::new(mark)));
            }
        }
        if let Some(m) = sc.fabric_model {
            let fsc: softrdma_fabric::Scenario = serde_json::from_str(&m.scenario_json(sc.seed))
                .map_err(|e| format!("the fabric model's scenario: {e}"))?;
            let carrier = softrdma_fabric::Carrier::new(&fsc, sc.nodes, net.now)?;
            net.set_fabric(Box::new(carrier));
        }
        let mut w = World {
            rng: Rng::new(sc.seed ^ 0xA99),
            net,
            nodes: Vec::new(),
            qps: Vec::new(),
            by_qpn: HashMap::new(),
            wire: Rc::new(RefCell::new(WireLog::default())),
            next_msg: 1,
            start: Instant::ZERO,
            cut_at: Vec::new(),
            pending_recv_checks: Vec::new(),
            trace: trace.then(Vec::new),
            summary: Summary::default(),
            wrong_qkey_sent: 0,
            sc,
        };
        w.start = w.net.now;
        w.setup()?;
        w.install_tap();
        w.schedule_cuts();
        Ok(w)
    }

    /// Hands the scenario's cuts and heals to the network as events.
    fn schedule_cuts(&mut self) {
        for c in self.sc.cuts.clone() {
            let on = self.start + c.start;
            self.cut_at.push(on);
            self.log(|| {
                format!(
                    "cut {}->{} both={} scheduled at {:?} until {:?}",
                    c.from, c.to, c.both, c.start, c.end
                )
            });
            let mut links = vec![(c.from, c.to)];
            if c.both {
                links.push((c.to, c.from));
            }
            for &(a, b) in &links {
                self.net.schedule_link(on, a, b, LinkChange::Cut);
                if let Some(end) = c.end {
                    self.net
                        .schedule_link(self.start + end, a, b, LinkChange::Heal);
                }
            }
        }
    }

    /// Posts a send WR as an application does through the device core:
    /// the direct path first (a same-host peer's granted memory), else the
    /// engine through the core's command path. True when it went direct.
    fn submit(&mut self, node: usize, qpn: Qpn, wr: &SendWr) -> softrdma_engine::Result<bool> {
        let now = self.net.now;
        let xrc_srqn = self
            .by_qpn
            .get(&(node, qpn))
            .and_then(|&qi| self.qps[qi].xrc_srqn);
        if let Some(srqn) = xrc_srqn {
            self.summary.xrc_wrs += 1;
            let wr = SendWr {
                xrc_srqn: Some(srqn),
                ..wr.clone()
            };
            return self.net.nodes[node].submit(now, qpn, &wr);
        }
        self.net.nodes[node].submit(now, qpn, wr)
    }

    /// The next event of node `n`: those the core has routed already, then
    /// any the engine still holds.
    fn next_event(&mut self, n: usize) -> Option<Event> {
        self.net.nodes[n].next_event()
    }

    fn log(&mut self, f: impl FnOnce() -> String) {
        if let Some(t) = self.trace.as_mut() {
            let s = f();
            t.push(format!("[{:>12}ns] {s}", self.net.now.nanos()));
        }
    }

    pub fn trace_dump(&self) -> Option<String> {
        self.trace.as_ref().map(|t| t.join("\n"))
    }

    fn setup(&mut self) -> Check {
        let sc = self.sc.clone();
        let local_area: u64 = if sc.large { 6 << 20 } else { 1 << 20 };
        let remote_area: u64 = if sc.large {
            (2 << 20) + SLOT_AREA
        } else {
            256 << 10
        };
        // Plan QPs: (node, type, conn, is_a)
        struct Plan {
            node: usize,
            t: QpType,
            conn: Option<usize>,
            a_side: bool,
        }
        let mut plan = Vec::new();
        for (ci, c) in sc.conns.iter().enumerate() {
            let (ta, tb) = if c.xrc {
                (QpType::XrcIni, QpType::XrcTgt)
            } else {
                (c.qp_type, c.qp_type)
            };
            plan.push(Plan {
                node: c.a,
                t: ta,
                conn: Some(ci),
                a_side: true,
            });
            plan.push(Plan {
                node: c.b,
                t: tb,
                conn: Some(ci),
                a_side: false,
            });
        }
        if sc.ud {
            for n in 0..sc.nodes {
                plan.push(Plan {
                    node: n,
                    t: QpType::Ud,
                    conn: None,
                    a_side: true,
                });
            }
        }
        // Region sizes.
        let mut l_size = vec![0u64; sc.nodes];
        let mut r_size = vec![0u64; sc.nodes];
        for p in &plan {
            l_size[p.node] += local_area;
            if let Some(ci) = p.conn {
                let c = &sc.conns[ci];
                let peer = if p.a_side { c.b } else { c.a };
                r_size[peer] += remote_area;
            }
        }
        let srq_area = (sc.srq_cap as u64 + 64) * (sc.srq_depth as u64 + 1) + 4096;
        for n in 0..sc.nodes {
            l_size[n] += srq_area;
            r_size[n] += 64;
        }
        for n in 0..sc.nodes {
            let e = self.net.nodes[n].engine_mut();
            let pd = e.alloc_pd();
            let scq = e.create_cq(1 << 16).map_err(|e| e.to_string())?;
            let rcq = e.create_cq(1 << 16).map_err(|e| e.to_string())?;
            // The direct path needs memory with addresses; the others keep
            // the checked model.
            let (lmem, rmem, shared): (Arc<dyn RegionMemory>, Arc<dyn RegionMemory>, _) =
                if self.sc.same_host {
                    let r = HostMemory::new(r_size[n] as usize);
                    (HostMemory::new(l_size[n] as usize), r.clone(), Some(r))
                } else {
                    (
                        Arc::new(VecMemory::new(l_size[n] as usize)),
                        Arc::new(VecMemory::new(r_size[n] as usize)),
                        None,
                    )
                };
            // Unaligned local base; remote base 8-aligned for atomics.
            let lbase = 0x1000_0000_0000 * (n as u64 + 1) + 0x123;
            let rbase = 0x2000_0000_0000 * (n as u64 + 1) + 0x1000;
            // Windows bind only to regions registered for it.
            let bind = if sc.mw {
                AccessFlags::MW_BIND
            } else {
                AccessFlags::empty()
            };
            let lkeys = e
                .reg_mr(pd, lbase, AccessFlags::LOCAL_WRITE | bind, lmem.clone())
                .map_err(|e| e.to_string())?;
            let rkeys = e
                .reg_mr(
                    pd,
                    rbase,
                    AccessFlags::LOCAL_WRITE
                        | AccessFlags::REMOTE_WRITE
                        | AccessFlags::REMOTE_READ
                        | AccessFlags::REMOTE_ATOMIC
                        | bind,
                    rmem.clone(),
                )
                .map_err(|e| e.to_string())?;
            if let Some(mem) = shared {
                self.net.nodes[n].share(rkeys.rkey, mem);
            }
            let e = self.net.nodes[n].engine_mut();
            let uses_srq = sc.conns.iter().any(|c| c.srq_b && c.b == n);
            // In XRC seeds every SRQ receiver is an XRC target (make_xrc).
            let xrcd = sc
                .conns
                .iter()
                .any(|c| c.xrc && c.b == n)
                .then(|| e.alloc_xrcd());
            let srq = if uses_srq {
                let init = SrqInit {
                    max_wr: 1024,
                    max_sge: 8,
                    limit: 0,
                };
                let id = match xrcd {
                    Some(x) => e.create_xrc_srq(pd, x, rcq, init),
                    None => e.create_srq(pd, init),
                }
                .map_err(|e| e.to_string())?;
                let srqn = match xrcd {
                    Some(_) => Some(e.srq_num(id).map_err(|e| e.to_string())?),
                    None => None,
                };
                Some(SrqH {
                    srqn,
                    id,
                    cap: sc.srq_cap,
                    depth: sc.srq_depth,
                    posted: HashMap::new(),
                    ring: Ring::new(srq_area),
                    l_off: l_size[n] - srq_area,
                })
            } else {
                None
            };
            let mut ahs = Vec::new();
            if sc.ud {
                for m in 0..sc.nodes {
                    ahs.push(
                        e.create_ah(pd, av_for(m))
                            .map_err(|e| format!("create_ah: {e}"))?,
                    );
                }
            }
            self.nodes.push(NodeH {
                pd,
                scq,
                rcq,
                l: Region {
                    mem: lmem,
                    keys: lkeys,
                    base: lbase,
                },
                r: Region {
                    mem: rmem,
                    keys: rkeys,
                    base: rbase,
                },
                srq,
                xrcd,
                ahs,
            });
        }
        // Create QPs.
        let mut l_used = vec![0u64; sc.nodes];
        let mut r_used = vec![64u64; sc.nodes];
        let n_requesters = plan
            .iter()
            .filter(|p| match p.conn {
                Some(ci) => p.a_side || sc.conns[ci].both_ways,
                None => true,
            })
            .count()
            .max(1);
        for p in &plan {
            let node = p.node;
            let c = p.conn.map(|ci| sc.conns[ci].clone());
            let uses_srq = c.as_ref().is_some_and(|c| c.srq_b && !p.a_side);
            let n = &self.nodes[node];
            let init = QpInit {
                pd: n.pd,
                qp_type: p.t,
                send_cq: n.scq,
                recv_cq: n.rcq,
                srq: if uses_srq {
                    n.srq.as_ref().map(|s| s.id)
                } else {
                    None
                },
                cap: QpCap {
                    max_send_wr: 1024,
                    max_recv_wr: 1024,
                    max_send_sge: 8,
                    max_recv_sge: 8,
                    max_inline_data: 64,
                },
                sq_sig_all: false,
            };
            let xrcd = n.xrcd;
            let e = self.net.nodes[node].engine_mut();
            let qpn = match (p.t, xrcd) {
                (QpType::XrcTgt, Some(x)) => e.create_xrc_tgt_qp(x),
                _ => e.create_qp(init),
            }
            .map_err(|e| format!("create_qp ({}): {e}", p.t))?;
            let xrc_srqn = match &c {
                Some(c) if p.t == QpType::XrcIni => {
                    self.nodes[c.b].srq.as_ref().and_then(|s| s.srqn)
                }
                _ => None,
            };
            let l_off = l_used[node];
            l_used[node] += local_area;
            let (r_off, peer_node) = match &c {
                Some(c) => {
                    let peer = if p.a_side { c.b } else { c.a };
                    let o = r_used[peer];
                    r_used[peer] += remote_area;
                    (o, Some(peer))
                }
                None => (0, None),
            };
            let _ = peer_node;
            let requester = match &c {
                Some(c) => p.a_side || c.both_ways,
                None => true,
            };
            let (mtu, timeout, retry_cnt, rnr) = match &c {
                Some(c) => (
                    c.mtu.bytes(),
                    local_ack_timeout(c.timeout).unwrap(),
                    c.retry_cnt,
                    Duration::from_micros(softrdma_wire::aeth::rnr_timer_micros(c.min_rnr_timer)),
                ),
                None => (UD_MAX, Duration::ZERO, 0, Duration::ZERO),
            };
            let (recv_depth, recv_cap) = match &c {
                Some(c) => {
                    let cap = c.send_max + 63;
                    let fit = (local_area / 2 / u64::from(cap)).max(1) as usize;
                    (c.recv_depth.min(fit), cap)
                }
                None => (self.sc.ud_recv_depth, UD_MAX + GRH_LEN as u32 + 16),
            };
            let idx = self.qps.len();
            self.by_qpn.insert((node, qpn), idx);
            self.qps.push(QpH {
                node,
                qpn,
                qp_type: p.t,
                conn: p.conn,
                peer: None,
                uses_srq,
                mtu,
                timeout,
                retry_cnt,
                max_rnr_wait: rnr,
                l_off,
                ring: Ring::new(local_area),
                ops_left: if requester {
                    (sc.ops / n_requesters).max(4)
                } else {
                    0
                },
                sq: VecDeque::new(),
                next_wr_id: (idx as u64) << 40 | 1,
                unsignaled_run: 0,
                errored: None,
                oracle: None,
                r_off,
                r_size: if c.is_some() { remote_area } else { 0 },
                mirror: if c.as_ref().is_some_and(|c| c.qp_type == QpType::Rc) {
                    vec![0u8; remote_area as usize]
                } else {
                    Vec::new()
                },
                uc_next: SLOT_AREA,
                uc_writes: Vec::new(),
                rc_writes: Vec::new(),
                sent: HashMap::new(),
                rq: VecDeque::new(),
                recv_depth,
                recv_cap,
                incoming: VecDeque::new(),
                posted_count: 0,
                completed: 0,
                poison_at: None,
                max_tx: None,
                first_psn: Psn::new(0),
                sqd: None,
                recv_flushed: false,
                resumed_at: Instant::ZERO,
                win: None,
                scratch: None,
                xrc_srqn,
            });
        }
        // Pair up connected QPs and bring them up.
        for ci in 0..sc.conns.len() {
            let a = 2 * ci;
            let b = 2 * ci + 1;
            self.qps[a].peer = Some(b);
            self.qps[b].peer = Some(a);
        }
        let now = self.net.now;
        for i in 0..self.qps.len() {
            self.bring_up(i)?;
            if self.qps[i].qp_type.is_reliable() {
                let c = &sc.conns[self.qps[i].conn.unwrap()];
                let psn = if i % 2 == 0 { c.psn_a } else { c.psn_b };
                self.qps[i].oracle = Some(Oracle::new(Psn::new(psn), now));
                self.qps[i].first_psn = Psn::new(psn);
            }
        }
        if sc.mw {
            for i in 0..self.qps.len() {
                let q = &self.qps[i];
                // An XRC target has no send queue to bind through, and the
                // windows stay on the QP types they were written for.
                if q.conn.is_none() || q.qp_type.is_xrc() {
                    continue;
                }
                let (node, requester) = (q.node, q.ops_left > 0);
                let pd = self.nodes[node].pd;
                let e = self.net.nodes[node].engine_mut();
                let (h, k) = e.alloc_mw(pd, MwType::Two).map_err(|e| e.to_string())?;
                self.qps[i].win = Some((h, next_rkey(k), WinState::Unposted));
                if requester {
                    let e = self.net.nodes[node].engine_mut();
                    let (h, k) = e.alloc_mw(pd, MwType::One).map_err(|e| e.to_string())?;
                    self.qps[i].scratch = Some((h, k));
                }
            }
        }
        if sc.poison.is_some() {
            // The first RC requester (the a end of the first connection).
            if let Some(q) = self.qps.first_mut().filter(|q| q.qp_type.is_reliable()) {
                q.poison_at = Some(q.ops_left as u64 / 2);
            }
        }
        Ok(())
    }

    fn bring_up(&mut self, i: usize) -> Check {
        let now = self.net.now;
        let q = &self.qps[i];
        let (node, qpn, t) = (q.node, q.qpn, q.qp_type);
        let e = self.net.nodes[node].engine_mut();
        let mut a = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            qkey: QKEY,
            ..Default::default()
        };
        let m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
        let m = if t == QpType::Ud {
            m | AttrMask::QKEY
        } else {
            m | AttrMask::ACCESS_FLAGS
        };
        e.modify_qp(now, qpn, &a, m).map_err(|e| e.to_string())?;
        let Some(ci) = q.conn else {
            a.qp_state = QpState::Rtr;
            e.modify_qp(now, qpn, &a, AttrMask::STATE)
                .map_err(|e| e.to_string())?;
            a.qp_state = QpState::Rts;
            a.sq_psn = Psn::new(self.sc.seed as u32 & 0xFF_FFFF);
            return e
                .modify_qp(now, qpn, &a, AttrMask::STATE | AttrMask::SQ_PSN)
                .map_err(|e| e.to_string());
        };
        if self.sc.selective_repeat && t == QpType::Rc {
            let ece = e.query_ece(qpn).map_err(|e| e.to_string())?;
            e.set_ece(qpn, ece).map_err(|e| e.to_string())?;
        }
        let c = &self.sc.conns[ci];
        let peer = &self.qps[q.peer.unwrap()];
        let is_a = i.is_multiple_of(2);
        let (my_psn, their_psn) = if is_a {
            (c.psn_a, c.psn_b)
        } else {
            (c.psn_b, c.psn_a)
        };
        a.qp_state = QpState::Rtr;
        a.ah_attr = av_for(peer.node);
        a.path_mtu = c.mtu;
        a.dest_qp_num = peer.qpn;
        a.rq_psn = Psn::new(their_psn);
        let mut m = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN;
        // An XRC QP takes RC's attributes; the engine drops those its side
        // has no use for (qp_attr::xrc_modify_mask), as the kernel does.
        if t.is_reliable() {
            a.max_dest_rd_atomic = c.rd_atomic;
            a.min_rnr_timer = c.min_rnr_timer;
            m = m | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
        }
        e.modify_qp(now, qpn, &a, m).map_err(|e| e.to_string())?;
        a.qp_state = QpState::Rts;
        a.sq_psn = Psn::new(my_psn);
        let mut m = AttrMask::STATE | AttrMask::SQ_PSN;
        if t.is_reliable() {
            a.timeout = c.timeout;
            a.retry_cnt = c.retry_cnt;
            a.rnr_retry = c.rnr_retry;
            a.max_rd_atomic = c.rd_atomic;
            m = m
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC;
        }
        e.modify_qp(now, qpn, &a, m).map_err(|e| e.to_string())
    }

    fn install_tap(&mut self) {
        let log = self.wire.clone();
        self.net.set_tap(Some(Box::new(move |t: &Tapped<'_>| {
            if t.stage == TapStage::Transmit {
                log.borrow_mut().digest.packet(t);
            }
            if t.stage == TapStage::Deliver
                && t.corrupted
                && icrc::verify(&t.endpoints, t.data).is_err()
            {
                return Verdict::Pass;
            }
            let Ok(p) = PacketRepr::parse(t.data) else {
                return Verdict::Pass;
            };
            let info = p.bth.opcode.info();
            let bad_qkey = p.headers.deth().is_some_and(|d| d.qkey != QKEY);
            let mut l = log.borrow_mut();
            if bad_qkey && t.stage == TapStage::Transmit {
                l.bad_qkey_tx += 1;
            }
            if matches!(info.transport, Transport::Rc | Transport::Xrc) {
                l.events.push(WireEv {
                    stage: t.stage,
                    now: t.now,
                    from: t.from,
                    to: t.to,
                    opcode: p.bth.opcode,
                    dest_qp: p.bth.dest_qp,
                    psn: p.bth.psn,
                    syndrome: p.headers.aeth().map(|a| a.syndrome),
                    bad_qkey,
                });
            }
            Verdict::Pass
        })));
    }

    // ----- the wire oracle -----

    fn process_wire(&mut self) -> Check {
        let evs = std::mem::take(&mut self.wire.borrow_mut().events);
        for ev in evs {
            let info = ev.opcode.info();
            if let Some(tr) = self.trace.as_mut() {
                let t = format!(
                    "wire {:?} {}->{} {} qp {:#x} psn {} {:?}",
                    ev.stage,
                    ev.from,
                    ev.to,
                    ev.opcode.name(),
                    ev.dest_qp,
                    ev.psn.value(),
                    ev.syndrome
                );
                tr.push(format!("[{:>12}ns] {t}", ev.now.nanos()));
            }
            match ev.stage {
                TapStage::Transmit if info.is_request => {
                    // A request from the peer of the QP it is addressed to.
                    let Some(&r) = self.by_qpn.get(&(ev.to, Qpn::from_raw(ev.dest_qp))) else {
                        continue;
                    };
                    let Some(q) = self.qps[r].peer else { continue };
                    if let Some(o) = self.qps[q].oracle.as_mut() {
                        o.on_transmit();
                    }
                    let qq = &mut self.qps[q];
                    if qq.max_tx.is_none_or(|m| ev.psn.is_after(m)) {
                        qq.max_tx = Some(ev.psn);
                    }
                    if let Some(b) = qq.sqd {
                        ensure!(
                            !ev.psn.is_after(b),
                            "q{q}: in SQD it sent PSN {:?}, after {:?}, the last PSN of the work started before the drain",
                            ev.psn,
                            b
                        );
                    }
                }
                TapStage::Deliver if !info.is_request => {
                    let Some(&q) = self.by_qpn.get(&(ev.to, Qpn::from_raw(ev.dest_qp))) else {
                        continue;
                    };
                    let Some(o) = self.qps[q].oracle.as_mut() else {
                        continue;
                    };
                    match info.kind {
                        OpKind::ReadResponse => o.on_read_response(ev.psn, ev.now),
                        OpKind::Ack | OpKind::AtomicAck => match ev.syndrome {
                            Some(Syndrome::Ack { .. }) if info.kind == OpKind::AtomicAck => {
                                o.on_atomic_ack(ev.psn, ev.now)
                            }
                            Some(Syndrome::Ack { .. }) => o.on_ack(ev.psn, ev.now),
                            Some(Syndrome::Nak(NakCode::PsnSequenceError)) => {
                                o.on_nak(ev.psn, true, ev.now)
                            }
                            Some(_) => o.on_nak(ev.psn, false, ev.now),
                            None => {}
                        },
                        _ => {}
                    }
                    o.record(ev.now);
                    if let Some(b) = o.bogus.take() {
                        return Err(format!("QP {q}: {b}"));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    // ----- posting -----

    fn split(&mut self, len: u64) -> Vec<u32> {
        let k = 1 + self.rng.below(4.min(len + 1)) as usize;
        let mut cuts: Vec<u64> = (0..k - 1).map(|_| self.rng.below(len + 1)).collect();
        cuts.sort_unstable();
        let mut out = Vec::new();
        let mut prev = 0;
        for c in cuts {
            out.push((c - prev) as u32);
            prev = c;
        }
        out.push((len - prev) as u32);
        out
    }

    /// Allocates pieces of `len` bytes in QP `qi`'s local area, returning
    /// offsets in the node's L region.
    fn alloc_local(&mut self, qi: usize, len: u64, single: bool) -> Option<Vec<(u64, u32)>> {
        let parts = if single {
            vec![len as u32]
        } else {
            self.split(len)
        };
        let mut got = Vec::new();
        for p in parts {
            match self.qps[qi].ring.alloc(u64::from(p), &mut self.rng) {
                Some(o) => got.push((o, p)),
                None => {
                    for (o, l) in got {
                        self.qps[qi].ring.free(o, u64::from(l));
                    }
                    return None;
                }
            }
        }
        let base = self.qps[qi].l_off;
        Some(got.into_iter().map(|(o, l)| (base + o, l)).collect())
    }

    fn free_local(&mut self, qi: usize, pieces: &[(u64, u32)]) {
        let base = self.qps[qi].l_off;
        for &(o, l) in pieces {
            self.qps[qi].ring.free(o - base, u64::from(l));
        }
    }

    fn sges(&self, node: usize, pieces: &[(u64, u32)]) -> Vec<Sge> {
        let l = &self.nodes[node].l;
        pieces
            .iter()
            .map(|&(o, len)| Sge {
                addr: l.base + o,
                length: len,
                lkey: l.keys.lkey,
            })
            .collect()
    }

    fn fill(&self, node: usize, pieces: &[(u64, u32)], data: &[u8]) {
        let mut at = 0usize;
        for &(o, l) in pieces {
            let l = l as usize;
            self.nodes[node].l.mem.write(o as usize, &data[at..at + l]);
            at += l;
        }
    }

    fn pick_len(&mut self, mtu: u32, max: u64) -> u64 {
        let big = if self.sc.large { 1 << 20 } else { 128 << 10 };
        let l = match self.rng.below(100) {
            0..=19 => self.rng.below(17),
            20..=64 => 1 + self.rng.below(3 * u64::from(mtu)),
            65..=89 => self.rng.below(32 << 10),
            _ => self.rng.below(big + 1),
        };
        l.min(max)
    }

    fn post_some(&mut self, qi: usize) -> Check<bool> {
        let q = &self.qps[qi];
        if q.ops_left == 0 || q.sq.len() >= self.sc.max_outstanding {
            return Ok(false);
        }
        match q.qp_type {
            QpType::Rc | QpType::Uc | QpType::XrcIni => self.post_connected(qi),
            QpType::Ud => self.post_ud(qi),
            QpType::XrcTgt => Err(format!("q{qi}: an XRC target has no send queue")),
        }
    }

    fn signaled(&mut self, qi: usize) -> bool {
        let q = &self.qps[qi];
        // The application only learns that unsignaled WRs finished from a
        // later signaled one: signal the last WR, and the one that fills the
        // outstanding limit.
        let s = q.ops_left == 1
            || q.unsignaled_run >= 7
            || q.sq.len() + 1 >= self.sc.max_outstanding
            || !self.rng.chance(self.sc.unsignaled_p);
        let q = &mut self.qps[qi];
        if s {
            q.unsignaled_run = 0;
        } else {
            q.unsignaled_run += 1;
        }
        s
    }

    fn post_connected(&mut self, qi: usize) -> Check<bool> {
        if self.qps[qi].poison_at == Some(self.qps[qi].posted_count) {
            return self.post_poison(qi);
        }
        if self.qps[qi].scratch.is_some() && self.rng.chance(0.05) {
            return self.post_scratch_bind(qi);
        }
        let rc = self.qps[qi].qp_type.is_reliable();
        let ci = self.qps[qi].conn.unwrap();
        let send_max = u64::from(self.sc.conns[ci].send_max);
        let mtu = self.qps[qi].mtu;
        let r_size = self.qps[qi].r_size;
        let op = loop {
            let op = match self.rng.below(100) {
                0..=19 => Op::Send,
                20..=29 => Op::SendImm,
                30..=49 => Op::Write,
                50..=59 => Op::WriteImm,
                60..=84 => Op::Read,
                85..=92 => Op::Cas,
                _ => Op::Faa,
            };
            if rc || matches!(op, Op::Send | Op::SendImm | Op::Write | Op::WriteImm) {
                break op;
            }
        };
        let mut len = match op {
            Op::Cas | Op::Faa => 8,
            Op::Send | Op::SendImm => self.pick_len(mtu, send_max),
            _ => self.pick_len(mtu, r_size - SLOT_AREA),
        };
        let mut op = op;
        if !rc && op.writes_remote() {
            let q = &self.qps[qi];
            if q.uc_next + len + 8 > q.r_size {
                op = Op::Send;
                len = len.min(send_max);
            }
        }
        let id = self.next_msg;
        self.next_msg += 1;
        let mut flags = SendFlags(0);
        // Fenced WR that sends what an outstanding READ brings in.
        let mut borrowed: Option<(Pieces, Rc<Vec<u8>>)> = None;
        if rc && self.rng.chance(self.sc.fence_p) {
            flags = flags | SendFlags::FENCE;
            if matches!(op, Op::Send | Op::SendImm | Op::Write | Op::WriteImm) {
                let limit = if op.consumes_rq() && op != Op::WriteImm {
                    send_max
                } else {
                    r_size - SLOT_AREA
                };
                if let Some(rw) = self.qps[qi]
                    .sq
                    .iter_mut()
                    .rev()
                    .find(|w| w.op == Op::Read && w.owns_local && w.len > 0 && w.len <= limit)
                {
                    rw.owns_local = false;
                    if let Expect::Data(d) = &rw.expect {
                        borrowed = Some((rw.local.clone(), d.clone()));
                        len = rw.len;
                    }
                }
            }
        }
        let (local, data, owns) = match borrowed {
            Some((l, d)) => (l, d, true),
            None => {
                let Some(l) = self.alloc_local(qi, len, matches!(op, Op::Cas | Op::Faa)) else {
                    return Ok(false);
                };
                let d = if matches!(op, Op::Read | Op::Cas | Op::Faa) {
                    Rc::new(Vec::new())
                } else {
                    let d = gen_data(id, len as usize);
                    self.fill(self.qps[qi].node, &l, &d);
                    Rc::new(d)
                };
                (l, d, true)
            }
        };
        let signaled = self.signaled(qi);
        if signaled {
            flags = flags | SendFlags::SIGNALED;
        }
        let solicited = op.consumes_rq() && self.rng.chance(0.3);
        if solicited {
            flags = flags | SendFlags::SOLICITED;
        }
        let node = self.qps[qi].node;
        let peer = self.qps[qi].peer.unwrap();
        let peer_node = self.qps[peer].node;
        let r = &self.nodes[peer_node].r;
        let (rbase, mut rkey) = (r.base + self.qps[qi].r_off, r.keys.rkey);
        // Through the peer QP's window (over exactly this area) once bound.
        if let Some((_, k, WinState::Bound)) = self.qps[peer].win {
            if !matches!(op, Op::Send | Op::SendImm) && self.rng.chance(0.4) {
                rkey = k;
                self.summary.mw_ops += 1;
            }
        }
        let imm = (op == Op::SendImm || op == Op::WriteImm).then_some(id as u32);
        let q = &mut self.qps[qi];
        let roff = match op {
            Op::Cas | Op::Faa => 8 * self.rng.below(SLOTS),
            Op::Write | Op::WriteImm | Op::Read if rc => {
                SLOT_AREA + self.rng.below(q.r_size - SLOT_AREA - len + 1)
            }
            Op::Write | Op::WriteImm => {
                let o = q.uc_next + self.rng.below(8);
                q.uc_next = o + len;
                o
            }
            _ => 0,
        };
        // Without a fence, a WRITE may overtake an earlier READ of the same
        // bytes at the responder (IBTA ordering rules; a READ may also be
        // re-executed after a retry): fence a WRITE onto bytes an outstanding
        // READ is reading.
        if rc
            && op.writes_remote()
            && q.sq
                .iter()
                .any(|w| w.op == Op::Read && w.roff < roff + len && roff < w.roff + w.len)
        {
            flags = flags | SendFlags::FENCE;
        }
        let mut expect = Expect::None;
        let sop = match op {
            Op::Send => SendOp::Send,
            Op::SendImm => SendOp::SendWithImm { imm: imm.unwrap() },
            Op::Write => SendOp::Write {
                remote_addr: rbase + roff,
                rkey,
            },
            Op::WriteImm => SendOp::WriteWithImm {
                remote_addr: rbase + roff,
                rkey,
                imm: imm.unwrap(),
            },
            Op::Read => {
                expect = Expect::Data(Rc::new(
                    q.mirror[roff as usize..(roff + len) as usize].to_vec(),
                ));
                SendOp::Read {
                    remote_addr: rbase + roff,
                    rkey,
                }
            }
            Op::Cas => {
                let o = roff as usize;
                let cur = u64::from_ne_bytes(q.mirror[o..o + 8].try_into().unwrap());
                let compare = if self.rng.chance(0.5) {
                    cur
                } else {
                    self.rng.next_u64()
                };
                let swap = self.rng.next_u64();
                if cur == compare {
                    q.mirror[o..o + 8].copy_from_slice(&swap.to_ne_bytes());
                }
                expect = Expect::Orig(cur);
                SendOp::CompareSwap {
                    remote_addr: rbase + roff,
                    rkey,
                    compare,
                    swap,
                }
            }
            Op::Faa => {
                let o = roff as usize;
                let cur = u64::from_ne_bytes(q.mirror[o..o + 8].try_into().unwrap());
                let add = self.rng.next_u64() >> self.rng.below(64);
                q.mirror[o..o + 8].copy_from_slice(&cur.wrapping_add(add).to_ne_bytes());
                expect = Expect::Orig(cur);
                SendOp::FetchAdd {
                    remote_addr: rbase + roff,
                    rkey,
                    add,
                }
            }
            Op::Bind => unreachable!("binds are posted by post_bind"),
        };
        if rc && op.writes_remote() {
            q.mirror[roff as usize..(roff + len) as usize].copy_from_slice(&data);
        }
        if !rc && op.writes_remote() {
            q.uc_writes.push((roff, data.clone()));
        }
        let wr_id = q.next_wr_id;
        q.next_wr_id += 1;
        let msg = op.consumes_rq().then(|| {
            Rc::new(Msg {
                id,
                op,
                data: data.clone(),
                imm,
                solicited,
                roff,
                from: qi,
                wr_id,
                received: std::cell::Cell::new(false),
            })
        });
        if let Some(m) = &msg {
            if rc {
                self.qps[peer].incoming.push_back(m.clone());
            } else {
                self.qps[qi]
                    .sent
                    .entry(m.data.len() as u64)
                    .or_default()
                    .push(m.clone());
            }
        }
        let now = self.net.now;
        if rc {
            let kind = match op {
                Op::Read => OKind::Read,
                Op::Cas | Op::Faa => OKind::Atomic,
                _ => OKind::Msg,
            };
            let n = if kind == OKind::Atomic {
                1
            } else {
                npkts(len, mtu)
            };
            if let Some(o) = self.qps[qi].oracle.as_mut() {
                o.push(wr_id, kind, n);
            }
        }
        let sg_list = self.sges(node, &local);
        let wr = SendWr {
            xrc_srqn: None,
            wr_id,
            op: sop,
            sg_list,
            flags,
            ud: None,
        };
        let q = &mut self.qps[qi];
        if rc && op.writes_remote() {
            q.rc_writes.push((wr_id, roff, len));
        }
        q.sq.push_back(Wr {
            wr_id,
            op,
            len,
            signaled,
            local,
            owns_local: owns,
            roff,
            expect,
            msg,
            posted_at: now,
            poison: None,
            direct: false,
        });
        q.ops_left -= 1;
        q.posted_count += 1;
        self.summary.ops += 1;
        let qpn = self.qps[qi].qpn;
        self.log(|| format!("post q{qi} wr {wr_id:#x} {op:?} len {len} roff {roff} {flags:?}"));
        let direct = self
            .submit(node, qpn, &wr)
            .map_err(|e| format!("q{qi}: post_send {op:?} failed: {e}"))?;
        if direct {
            // Executed in the peer's memory and completed at once: nothing
            // of it will ever be on the wire.
            self.log(|| format!("q{qi} wr {wr_id:#x} went direct"));
            self.summary.direct += 1;
            let q = &mut self.qps[qi];
            if let Some(o) = q.oracle.as_mut() {
                o.unpush(wr_id);
            }
            if let Some(w) = q.sq.back_mut().filter(|w| w.wr_id == wr_id) {
                w.direct = true;
            }
        }
        Ok(true)
    }

    /// Posts a bind WR (`Op::Bind`: no packet, IBV_WC_BIND_MW, byte_len 0)
    /// on `qi`, as one of its WRs.
    fn post_bind(&mut self, qi: usize, sop: SendOp, signaled: bool) -> Check<u64> {
        let now = self.net.now;
        let q = &mut self.qps[qi];
        let wr_id = q.next_wr_id;
        q.next_wr_id += 1;
        q.sq.push_back(Wr {
            wr_id,
            op: Op::Bind,
            len: 0,
            signaled,
            local: Vec::new(),
            owns_local: false,
            roff: 0,
            expect: Expect::None,
            msg: None,
            posted_at: now,
            poison: None,
            direct: false,
        });
        let (node, qpn) = (q.node, q.qpn);
        let flags = if signaled {
            SendFlags::SIGNALED
        } else {
            SendFlags(0)
        };
        let wr = SendWr {
            xrc_srqn: None,
            wr_id,
            op: sop,
            sg_list: Vec::new(),
            flags,
            ud: None,
        };
        self.log(|| format!("post q{qi} wr {wr_id:#x} {}", sop.name()));
        let direct = self
            .submit(node, qpn, &wr)
            .map_err(|e| format!("q{qi}: post_send BIND_MW failed: {e}"))?;
        ensure!(!direct, "q{qi}: a bind went direct");
        Ok(wr_id)
    }

    /// Binds `qi`'s type-2 window over the area its peer works in, with
    /// every remote right: its first WR.
    fn post_window_bind(&mut self, qi: usize) -> Check {
        let q = &self.qps[qi];
        let Some((mw, rkey, WinState::Unposted)) = q.win else {
            return Ok(());
        };
        let peer = q.peer.unwrap();
        let r = &self.nodes[q.node].r;
        let bind = MwBind {
            mr: Some(r.keys.lkey),
            addr: r.base + self.qps[peer].r_off,
            length: self.qps[peer].r_size,
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        };
        let wr_id = self.post_bind(qi, SendOp::BindMw { mw, rkey, bind }, true)?;
        self.qps[qi].win = Some((mw, rkey, WinState::Posted(wr_id)));
        Ok(())
    }

    /// Rebinds `qi`'s own type-1 window over a page of its local area (or,
    /// one time in three, unbinds it), with the next key: a WR with no
    /// packet between the others, completing in order.
    fn post_scratch_bind(&mut self, qi: usize) -> Check<bool> {
        let q = &self.qps[qi];
        let Some((mw, cur)) = q.scratch else {
            return Ok(false);
        };
        let l = &self.nodes[q.node].l;
        let bind = if self.rng.chance(0.33) {
            MwBind::default()
        } else {
            MwBind {
                mr: Some(l.keys.lkey),
                addr: l.base + q.l_off + 4096 * self.rng.below(16),
                length: 4096,
                access: AccessFlags::REMOTE_READ,
            }
        };
        let rkey = next_rkey(cur);
        let signaled = self.signaled(qi);
        self.post_bind(qi, SendOp::BindMw { mw, rkey, bind }, signaled)?;
        let q = &mut self.qps[qi];
        q.scratch = Some((mw, rkey));
        q.ops_left -= 1;
        q.posted_count += 1;
        self.summary.ops += 1;
        Ok(true)
    }

    /// Posts the scenario's invalid WR (signaled).
    fn post_poison(&mut self, qi: usize) -> Check<bool> {
        let kind = self.sc.poison.unwrap();
        let len = if kind == Poison::MisalignedAtomic {
            8
        } else {
            16
        };
        let Some(local) = self.alloc_local(qi, len, true) else {
            return Ok(false);
        };
        let node = self.qps[qi].node;
        let peer_node = self.qps[self.qps[qi].peer.unwrap()].node;
        let r = &self.nodes[peer_node].r;
        let (rbase, rkey, rlen) = (r.base + self.qps[qi].r_off, r.keys.rkey, r.mem.len() as u64);
        let region_end = r.base + rlen;
        let mut sg_list = self.sges(node, &local);
        let (op, sop, status) = match kind {
            Poison::BadRkeyWrite => (
                Op::Write,
                SendOp::Write {
                    remote_addr: rbase + SLOT_AREA,
                    rkey: Rkey::from_raw(rkey.raw() ^ 0x5A5A_0000),
                },
                WcStatus::RemAccessErr,
            ),
            Poison::ReadPastTheEnd => (
                Op::Read,
                SendOp::Read {
                    remote_addr: region_end - 8,
                    rkey,
                },
                WcStatus::RemAccessErr,
            ),
            Poison::MisalignedAtomic => (
                Op::Faa,
                SendOp::FetchAdd {
                    remote_addr: rbase + 4,
                    rkey,
                    add: 1,
                },
                WcStatus::RemInvReqErr,
            ),
            Poison::BadLkey => {
                sg_list[0].lkey = Lkey::from_raw(sg_list[0].lkey.raw() ^ 1);
                (
                    Op::Write,
                    SendOp::Write {
                        remote_addr: rbase + SLOT_AREA,
                        rkey,
                    },
                    WcStatus::LocProtErr,
                )
            }
        };
        let q = &mut self.qps[qi];
        let wr_id = q.next_wr_id;
        q.next_wr_id += 1;
        q.unsignaled_run = 0;
        if kind != Poison::BadLkey {
            // A local error is found before a PSN is assigned.
            let okind = match op {
                Op::Read => OKind::Read,
                Op::Faa => OKind::Atomic,
                _ => OKind::Msg,
            };
            if let Some(o) = q.oracle.as_mut() {
                o.push(wr_id, okind, 1);
            }
        }
        let now = self.net.now;
        q.sq.push_back(Wr {
            wr_id,
            op,
            len,
            signaled: true,
            local,
            owns_local: true,
            roff: SLOT_AREA,
            expect: Expect::None,
            msg: None,
            posted_at: now,
            poison: Some(status),
            direct: false,
        });
        q.ops_left -= 1;
        q.posted_count += 1;
        self.summary.ops += 1;
        let qpn = q.qpn;
        self.log(|| format!("post q{qi} POISON wr {wr_id:#x} {kind:?}"));
        let wr = SendWr {
            xrc_srqn: None,
            wr_id,
            op: sop,
            sg_list,
            flags: SendFlags::SIGNALED,
            ud: None,
        };
        self.submit(node, qpn, &wr)
            .map_err(|e| format!("q{qi}: post_send of the poisoned WR failed: {e}"))?;
        Ok(true)
    }

    /// Moves an RC requester to SQD, noting what it may still send.
    fn start_drain(&mut self, qi: usize) -> Check {
        let q = &self.qps[qi];
        let node = q.node;
        if self.net.nodes[node].engine().qp_state(q.qpn) != Some(QpState::Rts) {
            return Ok(());
        }
        // What a core sent (into its port's outbox) counts as started: see
        // it on the wire first.
        if N::SENDS_AT_POST {
            self.net.flush();
            self.process_wire()?;
        }
        let q = &self.qps[qi];
        let boundary = match q.max_tx {
            None => q.first_psn.sub(1),
            Some(m) => q
                .oracle
                .as_ref()
                .and_then(|o| o.wrs.iter().find(|w| m.in_window(w.first, w.npkts)))
                .map_or(m, |w| w.first.add(w.npkts - 1)),
        };
        let qpn = q.qpn;
        let now = self.net.now;
        self.net.nodes[node]
            .engine_mut()
            .modify_qp(
                now,
                qpn,
                &QpAttr {
                    qp_state: QpState::Sqd,
                    en_sqd_async_notify: true,
                    ..Default::default()
                },
                AttrMask::STATE | AttrMask::EN_SQD_ASYNC_NOTIFY,
            )
            .map_err(|e| format!("q{qi}: RTS->SQD refused: {e}"))?;
        self.qps[qi].sqd = Some(boundary);
        self.log(|| format!("q{qi} SQD, started work ends at PSN {boundary:?}"));
        Ok(())
    }

    fn ud_qps(&self) -> Vec<usize> {
        (0..self.qps.len())
            .filter(|&i| self.qps[i].qp_type == QpType::Ud)
            .collect()
    }

    fn post_ud(&mut self, qi: usize) -> Check<bool> {
        let uds = self.ud_qps();
        let dst = uds[self.rng.below(uds.len() as u64) as usize];
        let len = self.pick_len(UD_MAX, u64::from(UD_MAX));
        let Some(local) = self.alloc_local(qi, len, false) else {
            return Ok(false);
        };
        let id = self.next_msg;
        self.next_msg += 1;
        let node = self.qps[qi].node;
        let data = Rc::new(gen_data(id, len as usize));
        self.fill(node, &local, &data);
        let op = if self.rng.chance(0.4) {
            Op::SendImm
        } else {
            Op::Send
        };
        let imm = (op == Op::SendImm).then_some(id as u32);
        let wrong = self.rng.chance(0.05);
        let qkey = if wrong {
            QKEY ^ 0x10
        } else if self.rng.chance(0.3) {
            0x8000_0000
        } else {
            QKEY
        };
        let signaled = self.signaled(qi);
        let solicited = self.rng.chance(0.3);
        let mut flags = SendFlags(0);
        if signaled {
            flags = flags | SendFlags::SIGNALED;
        }
        if solicited {
            flags = flags | SendFlags::SOLICITED;
        }
        let dnode = self.qps[dst].node;
        let wr_id = self.qps[qi].next_wr_id;
        self.qps[qi].next_wr_id += 1;
        let msg = Rc::new(Msg {
            id,
            op,
            data: data.clone(),
            imm,
            solicited,
            roff: dst as u64,
            from: qi,
            wr_id,
            received: std::cell::Cell::new(false),
        });
        if wrong {
            self.wrong_qkey_sent += 1;
        } else {
            self.qps[qi].sent.entry(len).or_default().push(msg.clone());
        }
        let wr = SendWr {
            xrc_srqn: None,
            wr_id,
            op: match imm {
                Some(imm) => SendOp::SendWithImm { imm },
                None => SendOp::Send,
            },
            sg_list: self.sges(node, &local),
            flags,
            ud: Some(UdDest {
                ah: self.nodes[node].ahs[dnode],
                remote_qpn: self.qps[dst].qpn,
                remote_qkey: qkey,
            }),
        };
        let now = self.net.now;
        let q = &mut self.qps[qi];
        q.sq.push_back(Wr {
            wr_id,
            op,
            len,
            signaled,
            local,
            owns_local: true,
            roff: 0,
            expect: Expect::None,
            msg: None,
            posted_at: now,
            poison: None,
            direct: false,
        });
        q.ops_left -= 1;
        q.posted_count += 1;
        self.summary.ops += 1;
        let qpn = q.qpn;
        self.log(|| {
            format!("post q{qi} UD wr {wr_id:#x} {op:?} len {len} -> q{dst} qkey {qkey:#x}")
        });
        self.submit(node, qpn, &wr)
            .map_err(|e| format!("q{qi}: UD post_send failed: {e}"))?;
        Ok(true)
    }

    fn post_recvs(&mut self) -> Check<bool> {
        let mut did = false;
        for qi in 0..self.qps.len() {
            let q = &self.qps[qi];
            // An XRC initiator has no receive queue; a target takes its SRQ's.
            if q.uses_srq
                || q.qp_type == QpType::XrcIni
                || q.errored.is_some()
                || q.rq.len() >= q.recv_depth
            {
                continue;
            }
            if q.qp_type != QpType::Ud && q.conn.is_none() {
                continue;
            }
            if !self.rng.chance(self.sc.repost_p) {
                continue;
            }
            while self.qps[qi].rq.len() < self.qps[qi].recv_depth {
                let cap = u64::from(self.qps[qi].recv_cap) - self.rng.below(16);
                let Some(pieces) = self.alloc_local(qi, cap, false) else {
                    break;
                };
                let wr_id = self.qps[qi].next_wr_id;
                self.qps[qi].next_wr_id += 1;
                let node = self.qps[qi].node;
                let wr = RecvWr {
                    wr_id,
                    sg_list: self.sges(node, &pieces),
                };
                let qpn = self.qps[qi].qpn;
                let now = self.net.now;
                self.net.nodes[node]
                    .post_recv(now, qpn, &wr)
                    .map_err(|e| format!("q{qi}: post_recv failed: {e}"))?;
                self.qps[qi].rq.push_back(RecvBuf {
                    wr_id,
                    pieces,
                    owner: Some(qi),
                });
                did = true;
            }
        }
        for n in 0..self.nodes.len() {
            let Some(s) = self.nodes[n].srq.as_ref() else {
                continue;
            };
            if s.posted.len() >= s.depth || !self.rng.chance(self.sc.repost_p) {
                continue;
            }
            loop {
                let s = self.nodes[n].srq.as_ref().unwrap();
                if s.posted.len() >= s.depth {
                    break;
                }
                let cap = u64::from(s.cap) + self.rng.below(64);
                let parts = self.split(cap);
                let mut pieces = Vec::new();
                let mut ok = true;
                for p in parts {
                    let s = self.nodes[n].srq.as_mut().unwrap();
                    match s.ring.alloc(u64::from(p), &mut self.rng) {
                        Some(o) => pieces.push((s.l_off + o, p)),
                        None => {
                            ok = false;
                            break;
                        }
                    }
                }
                let s = self.nodes[n].srq.as_mut().unwrap();
                if !ok {
                    for &(o, l) in &pieces {
                        s.ring.free(o - s.l_off, u64::from(l));
                    }
                    break;
                }
                let wr_id = (0xFFu64 << 40) | (n as u64) << 32 | self.next_msg;
                self.next_msg += 1;
                let wr = RecvWr {
                    wr_id,
                    sg_list: self.sges(n, &pieces),
                };
                let id = self.nodes[n].srq.as_ref().unwrap().id;
                let now = self.net.now;
                self.net.nodes[n]
                    .post_srq_recv(now, id, &wr)
                    .map_err(|e| format!("node {n}: post_srq_recv failed: {e}"))?;
                self.nodes[n].srq.as_mut().unwrap().posted.insert(
                    wr_id,
                    RecvBuf {
                        wr_id,
                        pieces,
                        owner: None,
                    },
                );
                did = true;
            }
        }
        Ok(did)
    }

    fn free_recv(&mut self, node: usize, b: &RecvBuf) {
        match b.owner {
            Some(qi) => self.free_local(qi, &b.pieces),
            None => {
                let s = self.nodes[node].srq.as_mut().unwrap();
                for &(o, l) in &b.pieces {
                    s.ring.free(o - s.l_off, u64::from(l));
                }
            }
        }
    }

    // ----- checking completions -----

    /// Bytes of `qi`'s remote area `[roff, roff+len)` equal the model, except
    /// where a WR posted after position `pos` of its send queue and still
    /// outstanding writes.
    fn check_remote(&self, qi: usize, roff: u64, len: u64, pos: usize, what: &str) -> Check {
        self.check_remote_skip(qi, roff, len, pos + 1, what)
    }

    /// Like `check_remote`, excluding the writes of the WRs after the first
    /// `skip` of the send queue.
    fn check_remote_skip(&self, qi: usize, roff: u64, len: u64, skip: usize, what: &str) -> Check {
        if len == 0 {
            return Ok(());
        }
        let q = &self.qps[qi];
        let peer_node = self.qps[q.peer.unwrap()].node;
        let actual = self.nodes[peer_node].r.read(q.r_off + roff, len as usize);
        let mut excluded: Vec<(u64, u64)> =
            q.sq.iter()
                .skip(skip)
                .filter(|w| w.op.writes_remote() || matches!(w.op, Op::Cas | Op::Faa))
                .map(|w| (w.roff, w.roff + w.len))
                .collect();
        excluded.sort_unstable();
        // Compare the stretches between excluded ranges.
        let end = roff + len;
        let mut at = roff;
        let mut stretches = Vec::new();
        for (s, e) in excluded {
            if s > at {
                stretches.push((at, s.min(end)));
            }
            at = at.max(e);
            if at >= end {
                break;
            }
        }
        if at < end {
            stretches.push((at, end));
        }
        for (s, e) in stretches {
            if s >= e {
                continue;
            }
            let got = &actual[(s - roff) as usize..(e - roff) as usize];
            let want = &q.mirror[s as usize..e as usize];
            if got != want {
                let i = got.iter().zip(want).position(|(g, w)| g != w).unwrap();
                let a = s + i as u64;
                return Err(format!(
                    "q{qi} {what}: remote byte at area offset {a} is {:#04x}, model says {:#04x} \
                     (range {roff}+{len})",
                    got[i], want[i]
                ));
            }
        }
        Ok(())
    }

    /// Checks what a successfully completed WR at position `pos` of `qi`'s
    /// send queue did.
    fn verify_success(&mut self, qi: usize, pos: usize) -> Check {
        let q = &self.qps[qi];
        let w = &q.sq[pos];
        let node = q.node;
        let direct = w.direct;
        if q.qp_type.is_reliable() {
            if let Some(o) = q.oracle.as_ref() {
                ensure!(
                    !o.unacked(w.wr_id),
                    "q{qi}: WR {:#x} ({:?}) completed successfully but the wire never \
                     acknowledged it",
                    w.wr_id,
                    w.op
                );
            }
            match (&w.expect, w.op) {
                (Expect::Data(d), Op::Read) => {
                    let got = self.nodes[node].l.gather(&w.local, w.len as usize);
                    if got != **d {
                        let i = got.iter().zip(d.iter()).position(|(a, b)| a != b);
                        return Err(format!(
                            "q{qi}: READ WR {:#x} len {} brought wrong data (first difference at {i:?})",
                            w.wr_id, w.len
                        ));
                    }
                }
                (Expect::Orig(v), _) => {
                    let got = self.nodes[node].l.gather(&w.local, 8);
                    let got = u64::from_ne_bytes(got.try_into().unwrap());
                    ensure!(
                        got == *v,
                        "q{qi}: {:?} WR {:#x} returned original value {got:#x}, model says {v:#x}",
                        w.op,
                        w.wr_id
                    );
                }
                _ => {}
            }
            if w.op.writes_remote() {
                let (roff, len) = (w.roff, w.len);
                self.check_remote(qi, roff, len, pos, "WRITE completion")?;
            }
            if let Some(m) = &w.msg {
                self.pending_recv_checks.push(m.clone());
            }
        }
        if direct {
            self.summary.direct_verified += 1;
        }
        Ok(())
    }

    fn retire(&mut self, qi: usize, n: usize) {
        for _ in 0..n {
            let w = self.qps[qi].sq.pop_front().unwrap();
            if w.owns_local {
                // A READ whose buffer a later fenced WR borrowed: that WR frees it.
                self.free_local(qi, &w.local);
            }
            self.qps[qi].completed += 1;
        }
    }

    /// A clean network without a fabric loses nothing and delays nothing
    /// past a few tens of microseconds: no RC QP may time out there. A clean
    /// fabric loses nothing either, but its queues can hold a packet for
    /// longer than the shortest local ACK timeout (a window of 1 MiB
    /// messages each way on 10 Gb/s links, behind a go-back-N resend), so
    /// there the wire must justify a RETRY_EXC_ERR as on a lossy network.
    fn never_late(&self) -> bool {
        self.sc.mode == Mode::Clean && self.sc.fabric.is_none() && self.sc.fabric_model.is_none()
    }

    fn excuse_retry_exc(&mut self, qi: usize, wr_id: u64, peer_failed: bool) -> Check {
        let now = self.net.now;
        let q = &self.qps[qi];
        let o = q.oracle.as_ref().unwrap();
        let r = u32::from(q.retry_cnt) + 1;
        ensure!(
            !self.never_late() || peer_failed,
            "q{qi}: RETRY_EXC_ERR for WR {wr_id:#x} on a network that loses nothing"
        );
        // The engine may have given up on any one response delivered in
        // this instant (a later one may bring news it never saw): the
        // excuse must hold in the state after one of them.
        let why_not = |&(t_prog, naks, tx): &(Instant, u32, u32)| -> Option<String> {
            let timeouts = r.saturating_sub(naks);
            let stalled = now - t_prog;
            let need = q.timeout * timeouts;
            if stalled < need {
                return Some(format!(
                    "after only {stalled:?} without news from the wire; {timeouts} timeouts of {:?} \
                     ({} retries, {naks} NAKs) take {need:?}",
                    q.timeout, q.retry_cnt
                ));
            }
            if tx + 1 < timeouts {
                return Some(format!(
                    "but only {tx} requests were sent since the last news from the wire, \
                     {timeouts} timeouts should have retransmitted"
                ));
            }
            None
        };
        let reasons: Vec<String> = o.states_at(now).iter().filter_map(why_not).collect();
        let states = o.states_at(now).len();
        ensure!(
            reasons.len() < states,
            "q{qi}: RETRY_EXC_ERR for WR {wr_id:#x} {} (wire una {:?}, oldest {:?})",
            reasons.last().map_or("", |s| s.as_str()),
            o.una(),
            o.wrs.front()
        );
        Ok(())
    }

    fn on_send_wc(&mut self, node: usize, wc: WorkCompletion) -> Check {
        let Some(&qi) = self.by_qpn.get(&(node, wc.qp_num)) else {
            return Err(format!(
                "node {node}: send completion for unknown QP {:#x}",
                wc.qp_num
            ));
        };
        self.summary.completions += 1;
        let Some(pos) = self.qps[qi].sq.iter().position(|w| w.wr_id == wc.wr_id) else {
            return Err(format!(
                "q{qi}: completion {:?} for WR {:#x}, which is not outstanding (duplicate or unknown)",
                wc.status, wc.wr_id
            ));
        };
        self.log(|| {
            format!(
                "wc q{qi} wr {:#x} {:?} len {}",
                wc.wr_id, wc.status, wc.byte_len
            )
        });
        for i in 0..pos {
            let w = &self.qps[qi].sq[i];
            ensure!(
                !w.signaled,
                "q{qi}: WR {:#x} completed before signaled WR {:#x} posted earlier (out of order or lost)",
                wc.wr_id,
                w.wr_id
            );
            self.verify_success(qi, i)?;
        }
        let w = &self.qps[qi].sq[pos];
        let (op, len, wr_id, poison) = (w.op, w.len, w.wr_id, w.poison);
        let state = self.net.nodes[node].engine().qp_state(wc.qp_num);
        match wc.status {
            WcStatus::Success => {
                ensure!(
                    self.qps[qi].errored.is_none(),
                    "q{qi}: WR {wr_id:#x} succeeded after the QP failed"
                );
                ensure!(
                    poison.is_none(),
                    "q{qi}: the invalid WR {wr_id:#x} succeeded"
                );
                ensure!(
                    wc.opcode == op.wc_opcode(),
                    "q{qi}: WR {wr_id:#x} {op:?} completed with opcode {:?}",
                    wc.opcode
                );
                let want_len = if matches!(op, Op::Cas | Op::Faa) {
                    8
                } else {
                    len as u32
                };
                ensure!(
                    wc.byte_len == want_len,
                    "q{qi}: WR {wr_id:#x} {op:?} byte_len {} != {want_len}",
                    wc.byte_len
                );
                self.verify_success(qi, pos)?;
                if op == Op::Bind {
                    self.summary.mw_binds += 1;
                    let q = &mut self.qps[qi];
                    if let Some((h, k, WinState::Posted(id))) = q.win {
                        if id == wr_id {
                            q.win = Some((h, k, WinState::Bound));
                        }
                    }
                }
                let rc = self.qps[qi].qp_type.is_reliable();
                if let Some(c) = self.cut_for(qi).filter(|_| rc && op != Op::Bind) {
                    // What was on the wire at the cut still arrives, and its
                    // answer may be an ACK held for the ACK delay.
                    let delay = self.sc.net.delay + self.sc.net.jitter;
                    let held = Duration::from_nanos(self.sc.ack_delay_ns);
                    ensure!(
                        self.net.now < c + (delay + Duration::from_micros(1)) * 2 + held,
                        "q{qi}: WR {wr_id:#x} succeeded at {:?} although its path was cut for good at {:?}",
                        self.net.now - self.start,
                        c - self.start
                    );
                }
            }
            WcStatus::RetryExcErr => {
                ensure!(
                    self.qps[qi].qp_type.is_reliable(),
                    "q{qi}: RETRY_EXC_ERR on a {} QP",
                    self.qps[qi].qp_type
                );
                ensure!(
                    self.qps[qi].errored.is_none(),
                    "q{qi}: second error completion {:?} for WR {wr_id:#x}; after the first only WR_FLUSH_ERR may follow",
                    wc.status
                );
                let peer_failed = self.qps[qi].peer.is_some_and(|p| {
                    let pq = &self.qps[p];
                    self.net.nodes[pq.node].engine().qp_state(pq.qpn) == Some(QpState::Err)
                });
                self.excuse_retry_exc(qi, wr_id, peer_failed)?;
                if peer_failed {
                    // The peer is in ERR and drops everything: expected.
                    self.summary.peer_failures += 1;
                } else if let Some(c) = self.cut_for(qi) {
                    let q = &self.qps[qi];
                    let t_ref = c.max(q.sq[pos].posted_at).max(q.resumed_at);
                    let bound = q.timeout * (u32::from(q.retry_cnt) + 2)
                        + q.max_rnr_wait * 2
                        + Duration::from_millis(1);
                    ensure!(
                        self.net.now - t_ref <= bound,
                        "q{qi}: RETRY_EXC_ERR for WR {wr_id:#x} came {:?} after the path was cut; \
                         the retry budget is about {:?}",
                        self.net.now - t_ref,
                        q.timeout * (u32::from(q.retry_cnt) + 1)
                    );
                    self.summary.cut_failures += 1;
                } else {
                    self.summary.excused_retry_exc += 1;
                }
                self.qps[qi].errored = Some((self.net.now, wc.status));
                self.qps[qi].oracle = None;
            }
            WcStatus::WrFlushErr => {
                ensure!(
                    self.qps[qi].errored.is_some()
                        || matches!(state, Some(QpState::Err | QpState::Sqe)),
                    "q{qi}: WR {wr_id:#x} flushed although the QP is {state:?}"
                );
                self.qps[qi]
                    .errored
                    .get_or_insert((self.net.now, wc.status));
                self.qps[qi].oracle = None;
            }
            s if Some(s) == poison => {
                ensure!(
                    self.qps[qi].errored.is_none(),
                    "q{qi}: the invalid WR {wr_id:#x} completed with {s:?} after the QP had failed"
                );
                ensure!(
                    state == Some(QpState::Err),
                    "q{qi}: after {s:?} the QP is {state:?}, not ERR"
                );
                if s == WcStatus::RemAccessErr && op == Op::Write {
                    // Nothing was written.
                    let roff = self.qps[qi].sq[pos].roff;
                    self.check_remote(qi, roff, len, pos, "target of a refused WRITE")?;
                }
                self.summary.poisoned += 1;
                self.qps[qi].errored = Some((self.net.now, s));
                self.qps[qi].oracle = None;
            }
            s => {
                return Err(format!(
                    "q{qi}: WR {wr_id:#x} {op:?} len {len} completed with {s:?} ({s})"
                ))
            }
        }
        if let Some(o) = self.qps[qi].oracle.as_mut() {
            o.retire_through(wr_id);
        }
        self.retire(qi, pos + 1);
        // Now and then the whole area: nothing outside the WRs' ranges
        // changed, and what is not being written equals the model.
        let q = &self.qps[qi];
        if q.qp_type.is_reliable() && q.errored.is_none() && q.completed.is_multiple_of(8) {
            let peer_ok = self.qps[q.peer.unwrap()].errored.is_none();
            if peer_ok {
                self.check_remote_skip(qi, 0, q.r_size, 0, "whole area")?;
            }
        }
        Ok(())
    }

    /// When `qi`'s path was cut for good, if it was.
    fn cut_for(&self, qi: usize) -> Option<Instant> {
        let q = &self.qps[qi];
        let peer = q.peer?;
        let (a, b) = (q.node, self.qps[peer].node);
        self.sc
            .cuts
            .iter()
            .zip(&self.cut_at)
            .filter(|(c, &at)| c.end.is_none() && at <= self.net.now)
            .find(|(c, _)| (c.from == a && c.to == b) || (c.from == b && c.to == a))
            .map(|(_, &at)| at)
    }

    fn on_recv_wc(&mut self, node: usize, wc: WorkCompletion) -> Check {
        let Some(&qi) = self.by_qpn.get(&(node, wc.qp_num)) else {
            return Err(format!(
                "node {node}: receive completion for unknown QP {:#x}",
                wc.qp_num
            ));
        };
        self.summary.recvs += 1;
        if self.qps[qi].qp_type == QpType::XrcTgt {
            self.summary.xrc_recvs += 1;
        }
        self.log(|| {
            format!(
                "rwc q{qi} wr {:#x} {:?} {:?} len {} imm {:#x}",
                wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data
            )
        });
        let buf = if self.qps[qi].uses_srq {
            let s = self.nodes[node].srq.as_mut().unwrap();
            match s.posted.remove(&wc.wr_id) {
                Some(b) => b,
                None => {
                    return Err(format!(
                        "q{qi}: receive completion for SRQ WR {:#x}, which is not posted",
                        wc.wr_id
                    ))
                }
            }
        } else {
            let front = self.qps[qi].rq.front().map(|b| b.wr_id);
            ensure!(
                front == Some(wc.wr_id),
                "q{qi}: receive completion for WR {:#x} but the oldest posted receive is {front:x?}",
                wc.wr_id
            );
            self.qps[qi].rq.pop_front().unwrap()
        };
        let r = self.check_recv(qi, node, &wc, &buf);
        self.free_recv(node, &buf);
        r
    }

    fn check_recv(&mut self, qi: usize, node: usize, wc: &WorkCompletion, buf: &RecvBuf) -> Check {
        match wc.status {
            WcStatus::Success => {}
            WcStatus::WrFlushErr => {
                let st = self.net.nodes[node].engine().qp_state(wc.qp_num);
                ensure!(
                    st == Some(QpState::Err),
                    "q{qi}: receive WR {:#x} flushed while the QP is {st:?}",
                    wc.wr_id
                );
                self.qps[qi]
                    .errored
                    .get_or_insert((self.net.now, WcStatus::WrFlushErr));
                self.qps[qi].recv_flushed = true;
                return Ok(());
            }
            s => {
                return Err(format!(
                    "q{qi}: receive WR {:#x} completed with {s:?}",
                    wc.wr_id
                ))
            }
        }
        ensure!(
            !self.qps[qi].recv_flushed,
            "q{qi}: a receive succeeded after receives were flushed"
        );
        let imm_flag = wc.wc_flags.contains(WcFlags::WITH_IMM);
        match self.qps[qi].qp_type {
            QpType::Rc | QpType::XrcTgt => {
                let Some(m) = self.qps[qi].incoming.pop_front() else {
                    return Err(format!(
                        "q{qi}: receive completion {:#x} but the peer sent no message for it",
                        wc.wr_id
                    ));
                };
                let want_op = if m.op == Op::WriteImm {
                    WcOpcode::RecvRdmaWithImm
                } else {
                    WcOpcode::Recv
                };
                ensure!(
                    wc.opcode == want_op && wc.byte_len as usize == m.data.len(),
                    "q{qi}: receive {:#x} is {:?} of {} bytes; expected {want_op:?} of {} bytes \
                     (message {} {:?} WR {:#x})",
                    wc.wr_id,
                    wc.opcode,
                    wc.byte_len,
                    m.data.len(),
                    m.id,
                    m.op,
                    m.wr_id
                );
                ensure!(
                    imm_flag == m.imm.is_some() && (!imm_flag || Some(wc.imm_data) == m.imm),
                    "q{qi}: receive {:#x} immediate {:?}/{:#x}, expected {:?}",
                    wc.wr_id,
                    imm_flag,
                    wc.imm_data,
                    m.imm
                );
                ensure!(
                    wc.solicited == m.solicited,
                    "q{qi}: receive {:#x} solicited={} but the SEND had SOLICITED={}",
                    wc.wr_id,
                    wc.solicited,
                    m.solicited
                );
                if m.op == Op::WriteImm {
                    self.check_remote_msg(m.from, m.roff, &m.data, m.wr_id)?;
                } else {
                    ensure!(
                        buf.cap() >= m.data.len() as u64,
                        "q{qi}: test bug: receive buffer smaller than message"
                    );
                    let got = self.nodes[node].l.gather(&buf.pieces, m.data.len());
                    ensure!(
                        got == *m.data,
                        "q{qi}: receive {:#x} data differs from message {} ({} bytes)",
                        wc.wr_id,
                        m.id,
                        m.data.len()
                    );
                }
                m.received.set(true);
            }
            QpType::Uc => {
                let from = self.qps[qi].peer.unwrap();
                if wc.opcode == WcOpcode::RecvRdmaWithImm {
                    ensure!(imm_flag, "q{qi}: RECV_RDMA_WITH_IMM without WITH_IMM flag");
                    let m = self.qps[from]
                        .sent
                        .get(&u64::from(wc.byte_len))
                        .and_then(|v| {
                            v.iter()
                                .find(|m| m.op == Op::WriteImm && m.imm == Some(wc.imm_data))
                        })
                        .cloned();
                    let Some(m) = m else {
                        return Err(format!(
                            "q{qi}: UC WRITE_WITH_IMM receive (imm {:#x}, {} bytes) matches no message sent",
                            wc.imm_data, wc.byte_len
                        ));
                    };
                    let pnode = self.qps[qi].node;
                    let got = self.nodes[pnode]
                        .r
                        .read(self.qps[from].r_off + m.roff, m.data.len());
                    ensure!(
                        got == *m.data,
                        "q{qi}: UC WRITE_WITH_IMM {} completed at the receiver but its data is not all there",
                        m.id
                    );
                } else {
                    ensure!(
                        wc.opcode == WcOpcode::Recv,
                        "q{qi}: UC receive opcode {:?}",
                        wc.opcode
                    );
                    let got = self.nodes[node].l.gather(&buf.pieces, wc.byte_len as usize);
                    let ok = self.qps[from]
                        .sent
                        .get(&u64::from(wc.byte_len))
                        .is_some_and(|v| {
                            v.iter().any(|m| {
                                m.op != Op::WriteImm
                                    && m.imm.is_some() == imm_flag
                                    && (!imm_flag || m.imm == Some(wc.imm_data))
                                    && *m.data == got
                            })
                        });
                    ensure!(
                        ok,
                        "q{qi}: UC receive {:#x} ({} bytes, imm {:?}) matches no message the peer sent intact",
                        wc.wr_id,
                        wc.byte_len,
                        imm_flag.then_some(wc.imm_data)
                    );
                }
            }
            QpType::Ud => {
                ensure!(
                    wc.opcode == WcOpcode::Recv && wc.wc_flags.contains(WcFlags::GRH),
                    "q{qi}: UD receive opcode {:?} flags {:?}",
                    wc.opcode,
                    wc.wc_flags
                );
                ensure!(
                    wc.byte_len as usize >= GRH_LEN,
                    "q{qi}: UD receive shorter than a GRH"
                );
                let Some(src_node) =
                    (0..self.nodes.len()).find(|&n| Gid::from_ip(node_addr(n).ip()) == wc.sgid)
                else {
                    return Err(format!("q{qi}: UD receive from unknown GID {}", wc.sgid));
                };
                let Some(&from) = self.by_qpn.get(&(src_node, wc.src_qp)) else {
                    return Err(format!(
                        "q{qi}: UD receive from unknown QP {:#x}",
                        wc.src_qp
                    ));
                };
                let all = self.nodes[node].l.gather(&buf.pieces, wc.byte_len as usize);
                let (grh, got) = all.split_at(GRH_LEN);
                let src_ip = match node_addr(src_node).ip() {
                    std::net::IpAddr::V4(a) => a.octets(),
                    _ => unreachable!(),
                };
                let dst_ip = match node_addr(node).ip() {
                    std::net::IpAddr::V4(a) => a.octets(),
                    _ => unreachable!(),
                };
                ensure!(
                    grh[32..36] == src_ip && grh[36..40] == dst_ip,
                    "q{qi}: UD GRH carries {:?} -> {:?}",
                    &grh[32..36],
                    &grh[36..40]
                );
                let len = got.len() as u64;
                let ok = self.qps[from].sent.get(&len).is_some_and(|v| {
                    v.iter().any(|m| {
                        m.roff == qi as u64
                            && m.imm.is_some() == imm_flag
                            && (!imm_flag || m.imm == Some(wc.imm_data))
                            && m.solicited == wc.solicited
                            && *m.data == got
                    })
                });
                ensure!(
                    ok,
                    "q{qi}: UD receive {:#x} ({len} bytes from q{from}) matches no message sent to it with the right Q_Key",
                    wc.wr_id
                );
            }
            QpType::XrcIni => return Err(format!("q{qi}: an XRC initiator has no receive queue")),
        }
        Ok(())
    }

    /// At the receive of a WRITE_WITH_IMM (WR `wr_id`): its target holds
    /// its data, except where a WRITE the same QP posted later may have
    /// written since. That is every later WRITE, retired or not: those still
    /// outstanding may have been executed already, and so may those the
    /// requester flushed when its QP failed (seed 90035607: the requester's
    /// own responder refused the peer's READ in the same instant as its
    /// later WRITEs were executed at the peer).
    fn check_remote_msg(&self, from: usize, roff: u64, data: &[u8], wr_id: u64) -> Check {
        let q = &self.qps[from];
        let peer_node = self.qps[q.peer.unwrap()].node;
        let actual = self.nodes[peer_node].r.read(q.r_off + roff, data.len());
        let mut later: Vec<(u64, u64)> = q
            .rc_writes
            .iter()
            .skip_while(|&&(id, _, _)| id != wr_id)
            .skip(1)
            .map(|&(_, woff, wlen)| (woff.max(roff) - roff, (woff + wlen).max(roff) - roff))
            .collect();
        later.sort_unstable();
        let mut at = 0u64;
        let n = data.len() as u64;
        let check = |s: u64, e: u64| -> Check {
            let (s, e) = (s.min(n) as usize, e.min(n) as usize);
            if s < e && actual[s..e] != data[s..e] {
                let i = s + actual[s..e]
                    .iter()
                    .zip(&data[s..e])
                    .position(|(g, d)| g != d)
                    .unwrap();
                return Err(format!(
                    "q{from}: WRITE_WITH_IMM target byte {i} is {:#04x}, expected {:#04x} when the receive completed",
                    actual[i], data[i]
                ));
            }
            Ok(())
        };
        for (ls, le) in later {
            if ls > at {
                check(at, ls)?;
            }
            at = at.max(le);
        }
        check(at, n)
    }

    fn poll_all(&mut self) -> Check<bool> {
        let mut any = false;
        let mut wcs = Vec::new();
        for n in 0..self.nodes.len() {
            wcs.clear();
            let (scq, now) = (self.nodes[n].scq, self.net.now);
            self.net.nodes[n].poll_cq(now, scq, &mut wcs).unwrap();
            for wc in wcs.drain(..) {
                any = true;
                self.on_send_wc(n, wc)?;
            }
            let rcq = self.nodes[n].rcq;
            self.net.nodes[n].poll_cq(now, rcq, &mut wcs).unwrap();
            for wc in wcs.drain(..) {
                any = true;
                self.on_recv_wc(n, wc)?;
            }
            while let Some(ev) = self.next_event(n) {
                match ev {
                    Event::QpFatal { qpn } | Event::LastWqeReached { qpn } => {
                        let qi = self.by_qpn[&(n, qpn)];
                        let st = self.net.nodes[n].engine().qp_state(qpn);
                        ensure!(
                            st == Some(QpState::Err),
                            "q{qi}: {ev:?} while the QP is {st:?}"
                        );
                        ensure!(
                            matches!(ev, Event::QpFatal { .. }) || self.qps[qi].uses_srq,
                            "q{qi}: {ev:?} on a QP without SRQ"
                        );
                        self.qps[qi]
                            .errored
                            .get_or_insert((self.net.now, WcStatus::WrFlushErr));
                    }
                    Event::SqDrained { qpn } => {
                        let qi = self.by_qpn[&(n, qpn)];
                        ensure!(
                            self.qps[qi].sqd.take().is_some(),
                            "q{qi}: SqDrained without a drain"
                        );
                        self.summary.drains += 1;
                        self.log(|| format!("q{qi} drained"));
                        if self.net.nodes[n].engine().qp_state(qpn) == Some(QpState::Sqd) {
                            let now = self.net.now;
                            self.net.nodes[n]
                                .engine_mut()
                                .modify_qp(
                                    now,
                                    qpn,
                                    &QpAttr {
                                        qp_state: QpState::Rts,
                                        ..Default::default()
                                    },
                                    AttrMask::STATE,
                                )
                                .map_err(|e| format!("q{qi}: SQD->RTS refused: {e}"))?;
                            self.qps[qi].resumed_at = now;
                        }
                    }
                    ev => return Err(format!("node {n}: unexpected event {ev:?}")),
                }
            }
        }
        // Every RC message acknowledged to its sender has been received.
        for m in std::mem::take(&mut self.pending_recv_checks) {
            ensure!(
                m.received.get(),
                "q{}: message {} ({:?}, WR {:#x}) completed at the sender but no receive completed for it",
                m.from,
                m.id,
                m.op,
                m.wr_id
            );
        }
        Ok(any)
    }

    fn done(&self) -> bool {
        self.qps.iter().enumerate().all(|(i, q)| {
            let mut ok = q.ops_left == 0 && q.sq.is_empty();
            if q.qp_type.is_reliable() && !q.incoming.is_empty() {
                // Messages still to arrive, unless one end failed.
                let peer = q.peer.unwrap();
                ok &= q.errored.is_some() || self.qps[peer].errored.is_some();
            }
            let _ = i;
            ok
        })
    }

    fn outstanding(&self) -> String {
        let mut s = String::new();
        for (i, q) in self.qps.iter().enumerate() {
            if !q.sq.is_empty() || q.ops_left > 0 || !q.incoming.is_empty() {
                let _ = write!(
                    s,
                    "\n  q{i} {} node {} qpn {:#x} state {:?}: {} WRs outstanding (oldest {:?}), {} to post, {} incoming, {} receives posted, errored {:?}",
                    q.qp_type,
                    q.node,
                    q.qpn,
                    self.net.nodes[q.node].engine().qp_state(q.qpn),
                    q.sq.len(),
                    q.sq.front().map(|w| (w.wr_id, w.op, w.len)),
                    q.ops_left,
                    q.incoming.len(),
                    q.rq.len(),
                    q.errored
                );
                if let Some(c) = self.net.nodes[q.node].engine().qp_counters(q.qpn) {
                    let _ = write!(s, "\n     counters {c:?}");
                }
            }
        }
        s
    }

    /// Runs the workload to the end and checks everything.
    pub fn run(&mut self) -> Check<Summary> {
        let limit = Duration::from_secs(60);
        let deadline = self.start + limit;
        let mut idle_turns = 0u32;
        loop {
            self.process_wire()?;
            let completed = self.poll_all()?;
            if self.done() {
                break;
            }
            let mut posted = false;
            if self.sc.mw {
                for qi in 0..self.qps.len() {
                    if matches!(self.qps[qi].win, Some((_, _, WinState::Unposted))) {
                        self.post_window_bind(qi)?;
                        posted = true;
                    }
                }
            }
            for qi in 0..self.qps.len() {
                if self.qps[qi].ops_left > 0 && self.rng.chance(self.sc.post_p) {
                    for _ in 0..1 + self.rng.below(4) {
                        posted |= self.post_some(qi)?;
                    }
                }
            }
            posted |= self.post_recvs()?;
            if self.sc.sqd_p > 0.0 {
                for qi in 0..self.qps.len() {
                    let q = &self.qps[qi];
                    if q.qp_type.is_reliable()
                        && q.sqd.is_none()
                        && q.errored.is_none()
                        && q.ops_left > 0
                        && self.rng.chance(self.sc.sqd_p)
                    {
                        self.start_drain(qi)?;
                    }
                }
            }
            ensure!(
                self.net.now <= deadline,
                "liveness: work not finished after {limit:?} of virtual time; outstanding:{}",
                self.outstanding()
            );
            if !self.net.step() {
                if posted || completed {
                    idle_turns = 0;
                } else {
                    idle_turns += 1;
                    ensure!(
                        idle_turns < 10_000,
                        "liveness: nothing left to happen (no packet in flight, no timer) but work is outstanding:{}",
                        self.outstanding()
                    );
                }
            }
        }
        // Drain: the engines must go quiet.
        let quiet_by = self.net.now + Duration::from_secs(10);
        while self.net.step() {
            self.process_wire()?;
            self.poll_all()?;
            ensure!(
                self.net.now <= quiet_by,
                "liveness: engines still busy 10 s after all work completed (timers or traffic that never stop):{}",
                self.outstanding()
            );
        }
        self.process_wire()?;
        self.poll_all()?;
        self.final_checks()?;
        let mut s = self.summary.clone();
        s.mode = Some(self.sc.mode);
        s.packets = self.net.stats.sent;
        s.corrupted = self.net.stats.corrupted;
        s.tail_drops = self.net.stats.tail_drops;
        s.ce_marks = self.net.stats.ecn_marked;
        for n in &self.net.nodes {
            let c = n.engine().counters();
            s.sr_retransmits += c.sr_retransmits;
            s.ooo_held += c.ooo_held;
            s.cnp_sent += c.cnp_sent;
        }
        s.virtual_ms = (self.net.now - self.start).as_millis() as u64;
        Ok(s)
    }

    fn final_checks(&mut self) -> Check {
        ensure!(
            self.net.in_flight() == 0,
            "packets still in flight after draining"
        );
        // ICRC: every corrupted packet it covers was caught; nothing malformed.
        let icrc: u64 = self
            .net
            .nodes
            .iter()
            .map(|c| c.engine().counters().icrc_errors)
            .sum();
        let malformed: u64 = self
            .net
            .nodes
            .iter()
            .map(|c| c.engine().counters().malformed)
            .sum();
        let st = self.net.stats;
        ensure!(
            icrc == st.corrupted_delivered - st.corrupted_undetectable,
            "ICRC errors counted {icrc}, but {} corrupted packets were delivered ({} with the flip in the masked BTH byte)",
            st.corrupted_delivered,
            st.corrupted_undetectable
        );
        ensure!(malformed == 0, "{malformed} packets counted malformed");
        // Every CE mark the switch made reached a receiver, which counted it.
        let ce: u64 = self
            .net
            .nodes
            .iter()
            .map(|c| c.engine().counters().ecn_ce_rcvd)
            .sum();
        ensure!(
            ce == st.ecn_marked,
            "the receivers counted {ce} CE marks, the fabric made {}",
            st.ecn_marked
        );
        // Q_Key violations: never more than the wrong-key packets sent (and
        // their duplicates); exactly that many on a perfect network.
        let qv: u64 = self
            .net
            .nodes
            .iter()
            .map(|c| c.engine().counters().qkey_violations)
            .sum();
        let bad_tx = self.wire.borrow().bad_qkey_tx;
        ensure!(
            qv <= 2 * bad_tx,
            "{qv} Q_Key violations counted but only {bad_tx} wrong-Q_Key packets were sent"
        );
        if self.sc.mode == Mode::Clean {
            ensure!(
                qv == bad_tx,
                "{qv} Q_Key violations counted, {bad_tx} wrong-Q_Key packets sent"
            );
        }
        for qi in 0..self.qps.len() {
            let q = &self.qps[qi];
            ensure!(q.sq.is_empty(), "q{qi}: WRs never completed");
            match q.qp_type {
                QpType::Rc | QpType::XrcIni | QpType::XrcTgt => {
                    let peer = q.peer.unwrap();
                    if q.errored.is_none() && self.qps[peer].errored.is_none() {
                        // The whole remote area equals the model.
                        let size = q.r_size;
                        self.check_remote_skip(qi, 0, size, 0, "final state")?;
                        ensure!(
                            q.incoming.is_empty(),
                            "q{qi}: {} messages never received",
                            q.incoming.len()
                        );
                    }
                }
                QpType::Uc => {
                    let pnode = self.qps[q.peer.unwrap()].node;
                    for (roff, data) in &q.uc_writes {
                        let got = self.nodes[pnode].r.read(q.r_off + roff, data.len());
                        for (i, (&g, &d)) in got.iter().zip(data.iter()).enumerate() {
                            ensure!(
                                g == 0 || g == d,
                                "q{qi}: UC WRITE target at {roff}+{i} holds {g:#04x}, neither old (0) nor new ({d:#04x})"
                            );
                        }
                    }
                }
                QpType::Ud => {}
            }
        }
        if self.never_late() && self.sc.poison.is_none() {
            for (qi, q) in self.qps.iter().enumerate() {
                ensure!(
                    q.errored.is_none(),
                    "q{qi}: failed on a clean network: {:?}",
                    q.errored
                );
            }
        }
        Ok(())
    }
}

pub fn av_for(node: usize) -> AhAttr {
    AhAttr {
        dgid: Gid::from_ip(node_addr(node).ip()),
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..Default::default()
    }
}

/// Runs one seed; `Err` describes the first violated invariant.
pub fn run_seed<N: HarnessNode>(seed: u64, trace: bool) -> (Check<Summary>, Option<String>) {
    let sc = Scenario::from_seed(seed);
    let mut w = match World::<N>::new(sc, trace) {
        Ok(w) => w,
        Err(e) => return (Err(format!("setup: {e}")), None),
    };
    let r = w.run();
    (r, w.trace_dump())
}

/// Runs one seed and returns, with its result, the digest of every packet
/// the engines transmitted.
pub fn run_seed_digest<N: HarnessNode>(seed: u64) -> (Check<Summary>, WireDigest) {
    let sc = Scenario::from_seed(seed);
    let mut w = match World::<N>::new(sc, false) {
        Ok(w) => w,
        Err(e) => return (Err(format!("setup: {e}")), WireDigest::default()),
    };
    let r = w.run();
    let d = w.wire.borrow().digest;
    (r, d)
}
