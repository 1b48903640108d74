//! The event core: a calendar queue of (time in picoseconds, sequence)
//! events, links with queues and the link-layer models of
//! [`crate::link`], and one softrdma [`Engine`] per host. A part runs the
//! whole fabric, or some pods of it when [`crate::sim::Sim`] splits it
//! (its effects on the other parts leave in [`Cross`] records).
//! Everything random comes from the part's own seeded generator consumed
//! in event order, so a seed always gives the same run.
//!
//! A host's NIC pulls one packet at a time from its engine
//! ([`Engine::poll_transmit`]) when its up-link is free (and not paused,
//! and has credits), so the engine's own pacing (DCQCN), windows, ACKs,
//! NAKs and timers decide what goes on the wire. Payload bytes are elided
//! by a region that reads as zeros and ignores writes ([`NullMemory`]):
//! packets still carry their real headers and ICRC, which the receiving
//! engine checks.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use softrdma_engine::*;
use softrdma_wire::{Ecn, Endpoints, Psn};

use crate::link::*;
use crate::queue::CalendarQueue;
use crate::scenario::{LinkKind, Routing, Scenario};
use crate::topology::{Node, Tree};
use crate::workload::Plan;

/// A region whose bytes read as zero and whose writes vanish: the payload
/// is elided, everything the transport does with it (lengths, bounds,
/// keys, ICRC) still happens.
#[derive(Debug)]
pub struct NullMemory(pub usize);

impl RegionMemory for NullMemory {
    fn len(&self) -> usize {
        self.0
    }
    fn read(&self, _offset: usize, dst: &mut [u8]) {
        dst.fill(0);
    }
    fn write(&self, _offset: usize, _src: &[u8]) {}
    fn compare_swap(&self, _offset: usize, _compare: u64, _swap: u64) -> u64 {
        0
    }
    fn fetch_add(&self, _offset: usize, _add: u64) -> u64 {
        0
    }
    /// A token, not an address: the engine never reads through it, and
    /// the simulator only uses it to learn that the payload (all zeros)
    /// was left out of the packet.
    fn tx_addr(&self, offset: usize) -> Option<usize> {
        Some(offset + 1)
    }
}

const REGION: usize = 1 << 32;
const IOVA: u64 = 0x1000_0000;
/// The engines' clock starts here (ns), the fabric's at 0.
const EPOCH_NS: u64 = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// Packet `pkt` has fully arrived at the far end of `link`.
    Arrive { link: u32, pkt: u32 },
    /// `link` finished serialising its packet.
    TxDone { link: u32 },
    /// `link` may transmit again (a pause ran out).
    Wake { link: u32 },
    /// A PFC frame for `link`'s transmitter.
    Pause { link: u32, class: u8, quanta: u16 },
    /// Refresh the XOFF that packets arriving on `link` caused.
    Refresh { link: u32, class: u8 },
    /// IB credits for `link`'s VL `class` come back while it waits for
    /// them (credits that come back while it does not are applied when it
    /// next looks: see `LinkState::credit_ret`).
    Credit { link: u32, class: u8 },
    /// A host's engine timer.
    Timer { host: u32 },
    /// A workload message is ready to be posted.
    Ready { msg: u32 },
    /// Sample queue occupancy.
    Sample,
    /// Switch `sw` finished reducing `chunk` of aggregation `op`.
    SharpEmit { sw: u32, op: u32, chunk: u32 },
}

/// A packet's stored bytes (its headers and ICRC, the payload elided):
/// inline when they fit — they always do for what the simulator sends, a
/// write's BTH, RETH and immediate, or an ACK — so a packet is one
/// allocation-free record.
#[derive(Debug)]
enum Bytes {
    Inline { len: u8, b: [u8; 54] },
    Heap(Vec<u8>),
}

impl Bytes {
    fn new(parts: [&[u8]; 2]) -> Bytes {
        let n = parts[0].len() + parts[1].len();
        if n <= 54 {
            let mut b = [0u8; 54];
            b[..parts[0].len()].copy_from_slice(parts[0]);
            b[parts[0].len()..n].copy_from_slice(parts[1]);
            Bytes::Inline { len: n as u8, b }
        } else {
            Bytes::Heap([parts[0], parts[1]].concat())
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Inline { len, b } => &b[..*len as usize],
            Bytes::Heap(v) => v,
        }
    }
}

/// A packet in the fabric: its bytes with the payload (zeros, from
/// [`NullMemory`]) left out — `data[..head]`, then `zeros` zero bytes,
/// then `data[head..]` — so a packet in a queue costs its headers only.
#[derive(Debug)]
pub(crate) struct Pkt {
    data: Bytes,
    head: u32,
    zeros: u32,
    dst: u32,
    src: u32,
    sport: u16,
    ecn: Ecn,
    class: u8,
    wire: u32,
    in_link: u32,
    /// In-network aggregation: 0, or the operation + 1.
    sharp: u32,
    chunk: u32,
    /// A result going down the tree (else a contribution going up).
    down: bool,
    /// A packet of an outside network's ([`Part::inject`]): its token, else 0.
    token: u64,
}

/// The aggregation tree (one for every in-network operation: all the
/// hosts, rooted at the lowest switch above all of them, reached by every
/// switch's first up-link).
#[derive(Debug, Default)]
struct SharpTree {
    /// Per switch: the up-link to its parent in the tree (MAX: root or
    /// not in the tree).
    parent: Vec<usize>,
    /// Per switch: the down-links to its children in the tree.
    down: Vec<Vec<usize>>,
    /// Per switch: contributions a chunk needs (its children).
    need: Vec<u32>,
    root: u32,
    /// (switch, op, chunk) → contributions so far.
    partial: HashMap<u64, u32>,
    /// Per switch: chunks being aggregated now.
    busy: Vec<u32>,
    alu_ps: Ps,
    slots: u32,
    chunk_bytes: u64,
    /// Per message: the next chunk to send, the result chunks received.
    next: Vec<u32>,
    got: Vec<u32>,
    /// Per host: its operations with chunks left to send; chunks outstanding.
    tx: Vec<VecDeque<u32>>,
    out: Vec<u32>,
}

/// BTH, an aggregation header and ICRC on an in-network aggregation packet.
const SHARP_HEADER: u32 = 12 + 16 + 4;

/// A directed link. `repr(C)` keeps the fields every packet touches
/// (arrival, enqueue, start of transmission) in the first two cache
/// lines; the statistics come last.
#[derive(Debug, Clone)]
#[repr(C)]
struct LinkState {
    /// The packet on the wire finishes serialising then.
    busy_until: Ps,
    qbytes: [u64; 2],
    dst: Node,
    src: Node,
    loss: f64,
    bps: u64,
    prop: Ps,
    q: [VecDeque<u32>; 2],
    paused_until: [Ps; 2],
    /// A TxDone event is queued.
    done_pending: bool,
    /// A Wake event is queued for this instant (0: none).
    wake_at: Ps,
    credits: [Credits; 2],
    /// IB credit updates on their way back: (arrival, bytes), in arrival
    /// order (one cable delay after each departure downstream). Applied
    /// when the transmitter next looks at its credits, so a credit costs
    /// an event only when the transmitter is waiting for it.
    credit_ret: [VecDeque<(Ps, u32)>; 2],
    /// The transmitter is out of credits for the class: 1 waiting with
    /// nothing on the way back, 2 a Credit event is queued.
    credit_wait: [u8; 2],
    pfc_in: [PfcIngress; 2],
    tx_pkts: u64,
    tx_bytes: u64,
    max_q: u64,
    pause_start: [Option<Ps>; 2],
    pause_total: Ps,
    pause_max: Ps,
    pause_frames: u64,
    drops: [u64; 3],
    /// The parts of the transmitter and the receiver.
    src_part: u8,
    dst_part: u8,
    /// Every pause this transmitter sat out: (start, end).
    pauses: Vec<(Ps, Ps)>,
}

impl LinkState {
    /// Ends class `c`'s pause (if one is open) at `end`.
    fn close_pause(&mut self, c: usize, end: Ps) {
        if let Some(s) = self.pause_start[c].take() {
            let end = end.max(s);
            self.pause_total += end - s;
            self.pause_max = self.pause_max.max(end - s);
            self.pauses.push((s, end));
        }
    }
}

struct HostState {
    engine: Engine,
    cq: CqHandle,
    rkey: Rkey,
    lkey: Lkey,
    /// peer → local QP.
    qps: HashMap<u32, Qpn>,
    timer_at: Ps,
}

/// Counters of the whole run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Totals {
    pub events: u64,
    pub packets_delivered: u64,
    pub drops_tail: u64,
    pub drops_headroom: u64,
    pub drops_corruption: u64,
    pub ecn_marked: u64,
    pub pause_frames: u64,
    pub retransmits: u64,
    pub sr_retransmits: u64,
    pub timeouts: u64,
    pub seq_naks: u64,
    pub cnps: u64,
    pub failed_wrs: u64,
    /// In-network aggregation: the most chunks one switch aggregated at once.
    pub sharp_max_slots: u64,
    /// In-network aggregation packets sent (up and down).
    pub sharp_packets: u64,
}

impl Totals {
    /// Adds another part's counters.
    pub(crate) fn add(&mut self, o: &Totals) {
        self.events += o.events;
        self.packets_delivered += o.packets_delivered;
        self.drops_tail += o.drops_tail;
        self.drops_headroom += o.drops_headroom;
        self.drops_corruption += o.drops_corruption;
        self.ecn_marked += o.ecn_marked;
        self.pause_frames += o.pause_frames;
        self.retransmits += o.retransmits;
        self.sr_retransmits += o.sr_retransmits;
        self.timeouts += o.timeouts;
        self.seq_naks += o.seq_naks;
        self.cnps += o.cnps;
        self.failed_wrs += o.failed_wrs;
        self.sharp_max_slots = self.sharp_max_slots.max(o.sharp_max_slots);
        self.sharp_packets += o.sharp_packets;
    }
}

/// What happened to one message.
#[derive(Debug, Clone, Copy, Default)]
pub struct MsgTimes {
    pub ready: Option<Ps>,
    pub delivered: Option<Ps>,
    pub acked: Option<Ps>,
}

/// One link's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LinkReport {
    pub id: usize,
    pub from: String,
    pub to: String,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub max_queue_bytes: u64,
    pub pause_us: f64,
    pub max_pause_us: f64,
    pub pause_frames: u64,
    pub drops_tail: u64,
    pub drops_headroom: u64,
    pub drops_corruption: u64,
}

/// The simulator.
pub struct Part {
    now: Ps,
    seq: u64,
    events: CalendarQueue<Ev>,
    pub tree: Arc<Tree>,
    links: Vec<LinkState>,
    bufs: Vec<SharedBuffer>,
    /// The hosts of this part (`None`: another part's).
    hosts: Vec<Option<HostState>>,
    pkts: Vec<Option<Pkt>>,
    free: Vec<u32>,
    rng: Rng,
    kind: LinkKind,
    pfc: PfcParams,
    red: Option<Red>,
    routing: Routing,
    switch_ps: Ps,
    overhead: u32,
    seed: u64,
    txbuf: Vec<u8>,
    rxbuf: Vec<u8>,
    wcs: Vec<WorkCompletion>,
    plan: Arc<Plan>,
    deps_left: Vec<u32>,
    /// When each message's latest dependency was delivered (+ host delay).
    ready_at: Vec<Ps>,
    dependents: Arc<Vec<Vec<u32>>>,
    /// Every host's rkey (a sender needs its receiver's).
    rkeys: Arc<Vec<Rkey>>,
    pub times: Vec<MsgTimes>,
    /// Halves of messages (delivered, acknowledged) this part has left to
    /// see: a message is done when both of its halves are.
    remaining: usize,
    pub totals: Totals,
    limit: Ps,
    sample_ps: Ps,
    /// (time µs, bytes in all switch buffers, deepest egress queue bytes).
    pub samples: Vec<(f64, u64, u64)>,
    spray: u64,
    host_ps: Ps,
    sh: SharpTree,
    /// Payload bytes that reached hosts, in bins of 2^`gp_shift` ps (the
    /// bins double in width to stay at most `GOODPUT_BINS`).
    pub goodput_bins: Vec<u64>,
    pub goodput_shift: u32,
    /// What happened to injected packets ([`Part::inject`]), not yet taken
    /// by [`Part::advance_until`].
    outside: Vec<Outside>,
    /// This part's index, how many there are, and each host's part.
    part: u8,
    parts: u8,
    host_part: Arc<Vec<u8>>,
    /// What this part's events did to other parts: (part, effect), in the
    /// order they happened, handed over at the end of the window.
    pub(crate) out: Vec<(u8, Cross)>,
}

/// An effect of one part's event on another part's state. Each is due
/// at or after the end of the window it was made in (the lookahead), so
/// handing it over then changes nothing the other part has simulated.
#[derive(Debug)]
pub(crate) enum Cross {
    /// A packet reaches the far end of a link into the other part.
    Arrive { at: Ps, link: u32, pkt: Pkt },
    /// IB credits for the upstream transmitter of `link`.
    Credit {
        at: Ps,
        link: u32,
        class: u8,
        bytes: u32,
    },
    /// A PFC frame for the upstream transmitter of `link`.
    Pause {
        at: Ps,
        link: u32,
        class: u8,
        quanta: u16,
    },
    /// The receiver of message `msg` posts its receive.
    PostRecv { msg: u32 },
    /// A dependency of message `msg` was delivered (at `at`, host delay included).
    DepDone { msg: u32, at: Ps },
}

/// What the fabric did with a packet handed to it by [`Sim::inject`](crate::sim::Sim::inject).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outside {
    /// It reached its host at `at` (ps), carrying `ecn`.
    Arrived { token: u64, at: Ps, ecn: Ecn },
    /// A queue, a headroom or a bad cable dropped it.
    Dropped { token: u64 },
}

/// Every host an event touches belongs to the part that runs the event.
const OWN_HOST: &str = "a host of this part";

/// The most bins of the goodput-over-time series.
const GOODPUT_BINS: usize = 1024;

/// What ECMP hashes of a packet (with the switch): its flow.
fn flow_hash(seed: u64, src: u32, dst: u32, sport: u16) -> u64 {
    seed ^ u64::from(src) ^ (u64::from(dst) << 24) ^ (u64::from(sport) << 48)
}

fn host_addr(h: u32) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(10, (h >> 16) as u8, (h >> 8) as u8, h as u8)),
        softrdma_wire::frame::ROCE_PORT,
    )
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn mtu_of(m: u32) -> Mtu {
    match m {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    }
}

/// ACKs, NAKs and CNPs travel in class (priority, VL) 1, data in 0.
fn class_of(data: &[u8]) -> u8 {
    match data.first() {
        Some(0x11) | Some(0x81) => 1,
        _ => 0,
    }
}

impl Part {
    /// The whole fabric as one part, every host's engine connected, no
    /// event queued yet ([`Part::start`] queues them, after any
    /// [`Part::split`]).
    pub(crate) fn with_plan(
        sc: &Scenario,
        tree: Tree,
        plan: Plan,
    ) -> std::result::Result<Part, String> {
        let ll = &sc.link_layer;
        let mut rng = Rng::new(sc.seed);
        let mut links = Vec::with_capacity(tree.links.len());
        for (i, l) in tree.links.iter().enumerate() {
            let chosen = match ll.loss.links.as_str() {
                "all" => true,
                "host" => l.host_cable,
                _ => i == tree.host_up[0],
            };
            let mtu = u64::from(sc.transport.mtu) + 64;
            let loss = if chosen {
                1.0 - (1.0 - ll.loss.rate) * (1.0 - ber_drop_rate(ll.loss.ber, mtu))
            } else {
                0.0
            };
            links.push(LinkState {
                src: l.src,
                dst: l.dst,
                bps: l.bps,
                prop: l.prop_ps,
                q: [VecDeque::new(), VecDeque::new()],
                qbytes: [0; 2],
                busy_until: 0,
                done_pending: false,
                paused_until: [0; 2],
                wake_at: 0,
                pause_start: [None; 2],
                pause_total: 0,
                pause_max: 0,
                pause_frames: 0,
                credits: [Credits::new(ll.credit_bytes), Credits::new(ll.credit_bytes)],
                credit_ret: [VecDeque::new(), VecDeque::new()],
                credit_wait: [0; 2],
                pfc_in: [PfcIngress::default(), PfcIngress::default()],
                loss,
                tx_pkts: 0,
                tx_bytes: 0,
                max_q: 0,
                drops: [0; 3],
                src_part: 0,
                dst_part: 0,
                pauses: Vec::new(),
            });
        }
        let bufs = (0..tree.switches.len())
            .map(|_| SharedBuffer::new(ll.buffer_bytes, ll.port_queue_bytes))
            .collect();
        let tr = &sc.transport;
        let host_bps = tree.links[tree.host_up[0]].bps;
        let mut hosts = Vec::with_capacity(tree.hosts as usize);
        for h in 0..tree.hosts {
            let mut c = EngineConfig::new(host_addr(h));
            c.seed = mix(sc.seed ^ u64::from(h).wrapping_mul(0x1_0000_0001));
            c.max_inflight = tr.window;
            c.active_mtu = Mtu::Mtu4096;
            if tr.dcqcn {
                let mut p = DcqcnParams::new(host_bps);
                p.window = tr.window;
                c.congestion = CongestionConfig::dcqcn(p);
            }
            let mut e = Engine::new(c);
            let pd = e.alloc_pd();
            let cq = e.create_cq(1 << 16).map_err(|e| e.to_string())?;
            let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
            let keys = e
                .reg_mr(pd, IOVA, access, Arc::new(NullMemory(REGION)))
                .map_err(|e| e.to_string())?;
            let _ = pd;
            hosts.push(Some(HostState {
                engine: e,
                cq,
                rkey: keys.rkey,
                lkey: keys.lkey,
                qps: HashMap::new(),
                timer_at: Ps::MAX,
            }));
        }
        let n_msgs = plan.msgs.len();
        let mut deps_left = vec![0u32; n_msgs];
        let mut dependents = vec![Vec::new(); n_msgs];
        for (i, m) in plan.msgs.iter().enumerate() {
            deps_left[i] = m.deps.len() as u32;
            for &d in &m.deps {
                dependents[d as usize].push(i as u32);
            }
        }
        let n_hosts = tree.hosts as usize;
        let mut sim = Part {
            now: 0,
            seq: 0,
            events: CalendarQueue::default(),
            tree: Arc::new(tree),
            links,
            bufs,
            hosts,
            pkts: Vec::new(),
            free: Vec::new(),
            rng: Rng::new(rng.next_u64()),
            kind: ll.kind,
            pfc: ll.pfc,
            red: ll.ecn,
            routing: sc.topology.routing,
            switch_ps: (sc.topology.switch_ns * 1000.0) as Ps,
            overhead: if ll.kind == LinkKind::IbCredit {
                10
            } else {
                66
            },
            seed: mix(sc.seed ^ 0xECAF),
            txbuf: vec![0; 4096 + 128],
            rxbuf: Vec::with_capacity(4096 + 128),
            wcs: Vec::new(),
            plan: Arc::new(plan),
            deps_left,
            ready_at: vec![0; n_msgs],
            dependents: Arc::new(dependents),
            rkeys: Arc::new(Vec::new()),
            times: vec![MsgTimes::default(); n_msgs],
            remaining: 2 * n_msgs,
            totals: Totals::default(),
            limit: sc.time_limit_us.saturating_mul(1_000_000),
            sample_ps: 0,
            samples: Vec::new(),
            spray: 0,
            host_ps: (sc.transport.host_ns * 1000.0) as Ps,
            sh: SharpTree::default(),
            goodput_bins: Vec::new(),
            goodput_shift: 20,
            outside: Vec::new(),
            part: 0,
            parts: 1,
            host_part: Arc::new(vec![0; n_hosts]),
            out: Vec::new(),
        };
        let rkeys = sim.hosts.iter().flatten().map(|h| h.rkey).collect();
        sim.rkeys = Arc::new(rkeys);
        sim.connect(sc)?;
        if !sim.plan.sharp_base.is_empty() {
            sim.build_sharp(sc);
        }
        Ok(sim)
    }

    /// Queues the messages with nothing to wait for (those this part sends).
    pub(crate) fn start(&mut self) {
        for i in 0..self.plan.msgs.len() {
            let src = self.plan.msgs[i].src as usize;
            if self.deps_left[i] == 0 && self.host_part[src] == self.part {
                let at = self.plan.msgs[i].delay_ps + self.host_ps;
                self.push(at, Ev::Ready { msg: i as u32 });
            }
        }
    }

    /// Splits the whole fabric into `parts` parts: `host_part` and
    /// `switch_part` say whose each node is. Each part keeps its own
    /// hosts' engines, a copy of every link (it uses those it transmits
    /// or receives on) and every switch buffer (it uses its own), and
    /// counts the halves of messages its hosts send or receive.
    pub(crate) fn split(
        mut self,
        parts: u8,
        host_part: Vec<u8>,
        switch_part: &[u8],
        seed: u64,
    ) -> Vec<Part> {
        let node_part = |n: Node| match n {
            Node::Host(h) => host_part[h as usize],
            Node::Switch(s) => switch_part[s as usize],
        };
        for l in &mut self.links {
            (l.src_part, l.dst_part) = (node_part(l.src), node_part(l.dst));
        }
        let host_part = Arc::new(host_part);
        self.host_part = Arc::clone(&host_part);
        self.parts = parts;
        let mut out: Vec<Part> = (1..parts).map(|p| self.sibling(p, seed)).collect();
        for (h, &p) in host_part.iter().enumerate() {
            if p > 0 {
                out[p as usize - 1].hosts[h] = self.hosts[h].take();
            }
        }
        out.insert(0, self);
        for part in &mut out {
            let me = part.part;
            part.remaining = part
                .plan
                .msgs
                .iter()
                .map(|m| {
                    usize::from(host_part[m.src as usize] == me)
                        + usize::from(host_part[m.dst as usize] == me)
                })
                .sum();
        }
        out
    }

    /// Part `p` of a split: this part's settings and links, no host yet.
    fn sibling(&self, p: u8, seed: u64) -> Part {
        Part {
            now: 0,
            seq: 0,
            events: CalendarQueue::default(),
            tree: Arc::clone(&self.tree),
            links: self.links.clone(),
            bufs: self.bufs.clone(),
            hosts: (0..self.hosts.len()).map(|_| None).collect(),
            pkts: Vec::new(),
            free: Vec::new(),
            rng: Rng::new(mix(seed ^ u64::from(p).wrapping_mul(0x9E37_79B9_7F4A_7C15))),
            kind: self.kind,
            pfc: self.pfc,
            red: self.red,
            routing: self.routing,
            switch_ps: self.switch_ps,
            overhead: self.overhead,
            seed: self.seed,
            txbuf: vec![0; self.txbuf.len()],
            rxbuf: Vec::with_capacity(self.rxbuf.capacity()),
            wcs: Vec::new(),
            plan: Arc::clone(&self.plan),
            deps_left: self.deps_left.clone(),
            ready_at: vec![0; self.ready_at.len()],
            dependents: Arc::clone(&self.dependents),
            rkeys: Arc::clone(&self.rkeys),
            times: vec![MsgTimes::default(); self.times.len()],
            remaining: 0,
            totals: Totals::default(),
            limit: self.limit,
            sample_ps: 0,
            samples: Vec::new(),
            spray: 0,
            host_ps: self.host_ps,
            sh: SharpTree::default(),
            goodput_bins: Vec::new(),
            goodput_shift: self.goodput_shift,
            outside: Vec::new(),
            part: p,
            parts: self.parts,
            host_part: Arc::clone(&self.host_part),
            out: Vec::new(),
        }
    }

    /// Packet `token` (`data`, `ecn`; `token` not 0) leaves host `from`
    /// for host `to` at `at` (ps, not before what already ran): it joins
    /// the host's NIC queue and crosses the fabric as the workload's
    /// packets do (its class, ECN marking, ECMP on its UDP source port).
    pub fn inject(&mut self, at: Ps, from: u32, to: u32, data: &[u8], ecn: Ecn, token: u64) {
        debug_assert!(token != 0);
        self.advance_until(at, None);
        self.now = self.now.max(at);
        // The UDP source port is not in the RoCE bytes: take it from the
        // BTH's destination QP, as a flow's port is fixed per QP pair.
        let sport = data
            .get(5..8)
            .map_or(0, |q| u16::from_be_bytes([q[1], q[2]]) | 0xC000);
        let kept = data.len().min(54);
        let p = Pkt {
            wire: data.len() as u32 + self.overhead,
            data: Bytes::new([&data[..kept], &[]]),
            head: kept as u32,
            zeros: (data.len() - kept) as u32,
            dst: to,
            src: from,
            sport,
            ecn,
            class: class_of(data),
            in_link: u32::MAX,
            sharp: 0,
            chunk: 0,
            down: false,
            token,
        };
        let (class, wire) = (p.class as usize, u64::from(p.wire));
        let li = self.tree.host_up[from as usize];
        let id = self.alloc(p);
        let l = &mut self.links[li];
        l.q[class].push_back(id);
        l.qbytes[class] += wire;
        self.kick(li);
    }

    /// When the next event is due (ps), if any: a queued event, or what
    /// became of an injected packet and was not taken yet.
    pub fn next_event_at(&mut self) -> Option<Ps> {
        let taken = self.outside.iter().map(|o| match o {
            Outside::Arrived { at, .. } => *at,
            Outside::Dropped { .. } => self.now,
        });
        taken.chain(self.events.peek_time()).min()
    }

    /// Runs every event due at or before `until` (ps); with `out`, moves
    /// what became of injected packets so far into it, in order.
    pub fn advance_until(&mut self, until: Ps, out: Option<&mut Vec<Outside>>) {
        while self.events.peek_time().is_some_and(|t| t <= until) {
            let Some((t, _, ev)) = self.events.pop() else {
                break;
            };
            self.now = t;
            self.totals.events += 1;
            self.dispatch(ev);
        }
        if let Some(out) = out {
            out.append(&mut self.outside);
        }
    }

    /// Sets the interval of queue samples (0: none).
    pub fn set_sample_interval(&mut self, ps: Ps) {
        self.sample_ps = ps;
        if ps > 0 {
            self.push(0, Ev::Sample);
        }
    }

    pub(crate) fn plan_arc(&self) -> Arc<Plan> {
        Arc::clone(&self.plan)
    }

    /// This part's index in its split.
    pub(crate) fn index(&self) -> usize {
        usize::from(self.part)
    }

    /// Whether host `h`'s engine is in this part.
    pub(crate) fn owns(&self, h: u32) -> bool {
        self.hosts.get(h as usize).is_some_and(Option::is_some)
    }

    pub fn now(&self) -> Ps {
        self.now
    }

    /// One RC QP pair for every pair of hosts that exchange messages.
    fn connect(&mut self, sc: &Scenario) -> std::result::Result<(), String> {
        let mut pairs: Vec<(u32, u32)> = self
            .plan
            .msgs
            .iter()
            .filter(|m| m.sharp.is_none())
            .map(|m| (m.src.min(m.dst), m.src.max(m.dst)))
            .collect();
        pairs.sort_unstable();
        pairs.dedup();
        let sr = sc.transport.recovery == "selective_repeat";
        let now = Instant(EPOCH_NS);
        let cap = QpCap {
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let err = |e: VerbsError| e.to_string();
        for (a, b) in pairs {
            let mut q = [Qpn::default(); 2];
            for (i, h) in [a, b].into_iter().enumerate() {
                let hs = self.hosts[h as usize].as_mut().expect(OWN_HOST);
                let pd = PdHandle::from_raw(1);
                q[i] = hs
                    .engine
                    .create_qp(QpInit {
                        pd,
                        qp_type: QpType::Rc,
                        send_cq: hs.cq,
                        recv_cq: hs.cq,
                        srq: None,
                        cap,
                        sq_sig_all: false,
                    })
                    .map_err(err)?;
            }
            if sr {
                let ea = self.hosts[a as usize]
                    .as_mut()
                    .expect(OWN_HOST)
                    .engine
                    .query_ece(q[0])
                    .map_err(err)?;
                let eb = self.hosts[b as usize]
                    .as_mut()
                    .expect(OWN_HOST)
                    .engine
                    .query_ece(q[1])
                    .map_err(err)?;
                let agreed = ea.agree(eb);
                self.hosts[a as usize]
                    .as_mut()
                    .expect(OWN_HOST)
                    .engine
                    .set_ece(q[0], agreed)
                    .map_err(err)?;
                self.hosts[b as usize]
                    .as_mut()
                    .expect(OWN_HOST)
                    .engine
                    .set_ece(q[1], agreed)
                    .map_err(err)?;
            }
            for (i, (h, peer)) in [(a, b), (b, a)].into_iter().enumerate() {
                let e = &mut self.hosts[h as usize].as_mut().expect(OWN_HOST).engine;
                let (mine, theirs) = (q[i], q[1 - i]);
                let mut at = QpAttr {
                    qp_state: QpState::Init,
                    pkey_index: 0,
                    port_num: 1,
                    qp_access_flags: AccessFlags::REMOTE_WRITE,
                    ..Default::default()
                };
                e.modify_qp(
                    now,
                    mine,
                    &at,
                    AttrMask::STATE
                        | AttrMask::PKEY_INDEX
                        | AttrMask::PORT
                        | AttrMask::ACCESS_FLAGS,
                )
                .map_err(err)?;
                at.qp_state = QpState::Rtr;
                at.ah_attr = AhAttr {
                    dgid: Gid::from_ip(host_addr(peer).ip()),
                    is_global: true,
                    hop_limit: 64,
                    port_num: 1,
                    ..Default::default()
                };
                at.path_mtu = mtu_of(sc.transport.mtu);
                at.dest_qp_num = theirs;
                at.rq_psn = Psn::new(0x100);
                at.max_dest_rd_atomic = 1;
                at.min_rnr_timer = 1;
                e.modify_qp(
                    now,
                    mine,
                    &at,
                    AttrMask::STATE
                        | AttrMask::AV
                        | AttrMask::PATH_MTU
                        | AttrMask::DEST_QPN
                        | AttrMask::RQ_PSN
                        | AttrMask::MAX_DEST_RD_ATOMIC
                        | AttrMask::MIN_RNR_TIMER,
                )
                .map_err(err)?;
                at.qp_state = QpState::Rts;
                at.sq_psn = Psn::new(0x100);
                at.timeout = sc.transport.timeout;
                at.retry_cnt = 7;
                at.rnr_retry = 7;
                at.max_rd_atomic = 1;
                e.modify_qp(
                    now,
                    mine,
                    &at,
                    AttrMask::STATE
                        | AttrMask::SQ_PSN
                        | AttrMask::TIMEOUT
                        | AttrMask::RETRY_CNT
                        | AttrMask::RNR_RETRY
                        | AttrMask::MAX_QP_RD_ATOMIC,
                )
                .map_err(err)?;
                self.hosts[h as usize]
                    .as_mut()
                    .expect(OWN_HOST)
                    .qps
                    .insert(peer, mine);
            }
        }
        Ok(())
    }

    fn push(&mut self, at: Ps, ev: Ev) {
        self.seq += 1;
        self.events.push(at, self.seq, ev);
    }

    fn eng_now(&self) -> Instant {
        Instant(EPOCH_NS + self.now / 1000)
    }

    /// The whole fabric in one part: runs until every message is
    /// delivered and acknowledged, nothing is left to happen, or the time
    /// limit. Returns whether all completed.
    pub(crate) fn run(&mut self) -> bool {
        while self.remaining > 0 {
            let Some((t, _, ev)) = self.events.pop() else {
                break;
            };
            if t > self.limit {
                break;
            }
            self.now = t;
            self.totals.events += 1;
            self.dispatch(ev);
        }
        self.finish();
        self.remaining == 0
    }

    /// One part of a split fabric: runs its events due before `end` (and
    /// not after the time limit). What they do to other parts collects in
    /// `out`.
    pub(crate) fn run_before(&mut self, end: Ps) {
        let end = end.min(self.limit.saturating_add(1));
        while self.events.peek_time().is_some_and(|t| t < end) {
            let Some((t, _, ev)) = self.events.pop() else {
                break;
            };
            self.now = t;
            self.totals.events += 1;
            self.dispatch(ev);
        }
    }

    /// When this part's next event is due.
    pub(crate) fn next_at(&mut self) -> Option<Ps> {
        self.events.peek_time()
    }

    /// Halves of messages this part has still to see.
    pub(crate) fn halves_left(&self) -> usize {
        self.remaining
    }

    /// Takes in another part's effect on this one (handed over between
    /// windows, due no earlier than the window now starting).
    pub(crate) fn apply(&mut self, c: Cross) {
        match c {
            Cross::Arrive { at, link, pkt } => {
                let pkt = self.alloc(pkt);
                self.push(at, Ev::Arrive { link, pkt });
            }
            Cross::Credit {
                at,
                link,
                class,
                bytes,
            } => self.credit_back(link as usize, class, at, bytes),
            Cross::Pause {
                at,
                link,
                class,
                quanta,
            } => self.push(
                at,
                Ev::Pause {
                    link,
                    class,
                    quanta,
                },
            ),
            Cross::PostRecv { msg } => {
                if !self.post_recv(msg) {
                    self.totals.failed_wrs += 1;
                }
            }
            Cross::DepDone { msg, at } => self.dependency_done(msg, at),
        }
    }

    pub(crate) fn finish(&mut self) {
        for l in &mut self.links {
            for c in 0..2 {
                let end = l.paused_until[c].min(self.now);
                l.close_pause(c, end);
            }
        }
        let t = &mut self.totals;
        (
            t.retransmits,
            t.sr_retransmits,
            t.timeouts,
            t.seq_naks,
            t.cnps,
        ) = (0, 0, 0, 0, 0);
        for h in self.hosts.iter().flatten() {
            let c = h.engine.counters();
            t.retransmits += c.retransmits;
            t.timeouts += c.timeouts;
            t.seq_naks += c.seq_naks_rcvd;
            t.cnps += c.cnp_rcvd;
            for q in h.engine.qp_numbers() {
                if let Some(c) = h.engine.qp_counters(q) {
                    t.sr_retransmits += c.sr_retransmits;
                }
            }
        }
        t.pause_frames = self.links.iter().map(|l| l.pause_frames).sum();
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Arrive { link, pkt } => self.arrive(link as usize, pkt),
            Ev::TxDone { link } => self.tx_done(link as usize),
            Ev::Wake { link } => self.kick(link as usize),
            Ev::Pause {
                link,
                class,
                quanta,
            } => self.pause(link as usize, class as usize, quanta),
            Ev::Refresh { link, class } => {
                if self.links[link as usize].pfc_in[class as usize].on_refresh()
                    == PfcAction::Send(PAUSE_MAX_QUANTA)
                {
                    self.send_pause(link as usize, class, PAUSE_MAX_QUANTA);
                }
            }
            Ev::Credit { link, class } => {
                self.links[link as usize].credit_wait[class as usize] = 0;
                self.kick(link as usize);
            }
            Ev::Timer { host } => {
                let now = self.eng_now();
                let h = self.hosts[host as usize].as_mut().expect(OWN_HOST);
                if h.timer_at != self.now {
                    return;
                }
                h.timer_at = Ps::MAX;
                h.engine.handle_timeout(now);
                self.host_after(host);
            }
            Ev::Ready { msg } => self.post(msg),
            Ev::SharpEmit { sw, op, chunk } => self.sharp_emit(sw, op, chunk),
            Ev::Sample => {
                let total: u64 = self.bufs.iter().map(|b| b.used).sum();
                let deepest = self.links.iter().map(|l| l.qbytes[0] + l.qbytes[1]).max();
                self.samples
                    .push((self.now as f64 / 1e6, total, deepest.unwrap_or(0)));
                // A part of a split whose hosts still wait keeps sampling
                // while its queue is empty (its work comes from the others).
                let waiting = !self.events.is_empty() || self.parts > 1 && self.remaining > 0;
                if waiting && self.samples.len() < 100_000 {
                    self.push(self.now + self.sample_ps, Ev::Sample);
                }
            }
        }
    }

    fn post(&mut self, msg: u32) {
        let m = &self.plan.msgs[msg as usize];
        let (src, dst, bytes) = (m.src, m.dst, m.bytes);
        self.times[msg as usize].ready = Some(self.now);
        if m.sharp.is_some() {
            self.sh.tx[src as usize].push_back(msg);
            return self.pump(src);
        }
        let now = self.eng_now();
        let rkey = self.rkeys[dst as usize];
        let dst_part = self.host_part[dst as usize];
        let ok = if dst_part == self.part {
            self.post_recv(msg)
        } else {
            self.out.push((dst_part, Cross::PostRecv { msg }));
            true
        };
        let s = self.hosts[src as usize].as_mut().expect(OWN_HOST);
        let sq = s.qps[&dst];
        let wr = SendWr::new(
            u64::from(msg),
            SendOp::WriteWithImm {
                remote_addr: IOVA,
                rkey,
                imm: msg,
            },
            vec![Sge {
                addr: IOVA,
                length: bytes as u32,
                lkey: s.lkey,
            }],
        );
        if !ok || s.engine.post_send(now, sq, &wr).is_err() {
            self.totals.failed_wrs += 1;
            return;
        }
        self.host_after(src);
    }

    /// Message `msg`'s receiver posts the receive its WRITE_WITH_IMM will
    /// consume; false if the engine refused it.
    fn post_recv(&mut self, msg: u32) -> bool {
        let m = &self.plan.msgs[msg as usize];
        let d = self.hosts[m.dst as usize].as_mut().expect(OWN_HOST);
        let wr = RecvWr {
            wr_id: u64::from(msg),
            sg_list: Vec::new(),
        };
        d.engine.post_recv(d.qps[&m.src], &wr).is_ok()
    }

    /// After a host's engine did something: completions, the NIC, the timer.
    fn host_after(&mut self, h: u32) {
        let mut wcs = std::mem::take(&mut self.wcs);
        loop {
            wcs.clear();
            let hs = self.hosts[h as usize].as_mut().expect(OWN_HOST);
            let n = hs.engine.poll_cq(hs.cq, 64, &mut wcs).unwrap_or(0);
            if n == 0 {
                break;
            }
            for wc in &wcs {
                let id = wc.wr_id as usize;
                if wc.status != WcStatus::Success {
                    self.totals.failed_wrs += 1;
                    continue;
                }
                let Some(t) = self.times.get_mut(id) else {
                    continue;
                };
                self.remaining -= 1;
                if wc.opcode == WcOpcode::RecvRdmaWithImm {
                    t.delivered = Some(self.now);
                    self.release_dependents(id, self.now + self.host_ps);
                } else {
                    t.acked = Some(self.now);
                }
            }
        }
        self.wcs = wcs;
        self.pump(h);
        self.arm_timer(h);
    }

    /// Message `id` was delivered: its dependents wait for one message
    /// fewer, and those with none left become ready at the latest of
    /// their dependencies' `at` plus their own delay.
    fn release_dependents(&mut self, id: usize, at: Ps) {
        let dependents = Arc::clone(&self.dependents);
        for &dep in &dependents[id] {
            self.dependency_done(dep, at);
        }
    }

    /// One dependency of message `msg` was delivered (`at`: then plus the
    /// host delay); the part that sends `msg` counts it.
    pub(crate) fn dependency_done(&mut self, msg: u32, at: Ps) {
        let m = &self.plan.msgs[msg as usize];
        let owner = self.host_part[m.src as usize];
        if owner != self.part {
            self.out.push((owner, Cross::DepDone { msg, at }));
            return;
        }
        let i = msg as usize;
        self.ready_at[i] = self.ready_at[i].max(at);
        self.deps_left[i] -= 1;
        if self.deps_left[i] == 0 {
            let when = self.ready_at[i] + m.delay_ps;
            self.push(when, Ev::Ready { msg });
        }
    }

    /// Queues a Timer event for the engine's next deadline (sending a
    /// packet, handling one, a post or a timeout may all move it).
    fn arm_timer(&mut self, h: u32) {
        let hs = self.hosts[h as usize].as_mut().expect(OWN_HOST);
        if let Some(t) = hs.engine.poll_timeout() {
            let mut at = t.0.saturating_sub(EPOCH_NS).saturating_mul(1000);
            if at <= self.now {
                // Due now (or in this nanosecond): run it after what is
                // queued for this instant, at the next nanosecond.
                at = (self.now / 1000 + 1) * 1000;
            }
            if at < hs.timer_at {
                hs.timer_at = at;
                self.push(at, Ev::Timer { host: h });
            }
        }
    }

    /// A host's NIC: pull a packet from the engine when its up-link is
    /// idle. One at a time: while its data waits (paused, or for IB
    /// credits), what the engine would send next (an ACK too) waits.
    fn pump(&mut self, h: u32) {
        let li = self.tree.host_up[h as usize];
        let l = &self.links[li];
        if l.busy_until > self.now || !l.q[0].is_empty() || !l.q[1].is_empty() {
            return self.kick(li);
        }
        if !self.sh.tx.is_empty() && self.sharp_pump(h, li) {
            return;
        }
        let now = self.eng_now();
        let Some(t) = self.hosts[h as usize]
            .as_mut()
            .expect(OWN_HOST)
            .engine
            .poll_transmit_gather(now, &mut self.txbuf)
        else {
            return;
        };
        let IpAddr::V4(ip) = t.endpoints.dst.ip() else {
            return;
        };
        let o = ip.octets();
        let dst = (u32::from(o[1]) << 16) | (u32::from(o[2]) << 8) | u32::from(o[3]);
        if dst >= self.tree.hosts {
            return;
        }
        let tb = &self.txbuf;
        let (data, head, zeros) = match t.payload {
            Some(pl) => (
                Bytes::new([&tb[..pl.offset], &tb[pl.offset + pl.len..t.len]]),
                pl.offset,
                pl.len,
            ),
            None => (Bytes::new([&tb[..t.len], &[]]), t.len, 0),
        };
        let class = class_of(data.as_slice());
        let p = Pkt {
            wire: t.len as u32 + self.overhead,
            data,
            head: head as u32,
            zeros: zeros as u32,
            dst,
            src: h,
            sport: t.endpoints.src.port(),
            ecn: t.ecn,
            class,
            in_link: u32::MAX,
            sharp: 0,
            chunk: 0,
            down: false,
            token: 0,
        };
        let wire = u64::from(p.wire);
        let id = self.alloc(p);
        let l = &mut self.links[li];
        l.q[class as usize].push_back(id);
        l.qbytes[class as usize] += wire;
        self.kick(li);
    }

    /// Counts payload bytes that reached a host now.
    fn count_goodput(&mut self, bytes: u32) {
        let mut i = (self.now >> self.goodput_shift) as usize;
        while i >= GOODPUT_BINS {
            let b = &mut self.goodput_bins;
            for j in 0..b.len() / 2 {
                b[j] = b[2 * j] + b.get(2 * j + 1).copied().unwrap_or(0);
            }
            let half = b.len().div_ceil(2);
            if b.len() % 2 == 1 {
                b[half - 1] = b[b.len() - 1];
            }
            b.truncate(half);
            self.goodput_shift += 1;
            i >>= 1;
        }
        if self.goodput_bins.len() <= i {
            self.goodput_bins.resize(i + 1, 0);
        }
        self.goodput_bins[i] += u64::from(bytes);
    }

    fn alloc(&mut self, p: Pkt) -> u32 {
        if let Some(i) = self.free.pop() {
            self.pkts[i as usize] = Some(p);
            i
        } else {
            self.pkts.push(Some(p));
            (self.pkts.len() - 1) as u32
        }
    }

    fn release(&mut self, id: u32) {
        if self.pkts[id as usize].take().is_some() {
            self.free.push(id);
        }
    }

    /// Starts the next packet on `li` if it is idle, not paused and (IB)
    /// has the credits. A packet leaves its switch's buffer (and its
    /// ingress port's PFC count, and returns its upstream credits) when it
    /// starts onto the wire. A TxDone event is queued only when something
    /// waits for the link (always for a host's NIC, which then pulls the
    /// engine's next packet).
    fn kick(&mut self, li: usize) {
        let now = self.now;
        let l = &mut self.links[li];
        let from_host = matches!(l.src, Node::Host(_));
        if l.busy_until > now {
            if !l.done_pending && (from_host || !l.q[0].is_empty() || !l.q[1].is_empty()) {
                l.done_pending = true;
                let at = l.busy_until;
                self.push(at, Ev::TxDone { link: li as u32 });
            }
            return;
        }
        let credit_checked = self.kind == LinkKind::IbCredit && matches!(l.dst, Node::Switch(_));
        for c in [1usize, 0] {
            let Some(&id) = l.q[c].front() else {
                continue;
            };
            if l.paused_until[c] > now {
                let at = l.paused_until[c];
                if l.wake_at <= now || l.wake_at > at {
                    l.wake_at = at;
                    self.seq += 1;
                    self.events.push(at, self.seq, Ev::Wake { link: li as u32 });
                }
                continue;
            }
            let p = self.pkts[id as usize].as_ref().expect("queued packet");
            let (wire, class, inl) = (u64::from(p.wire), p.class, p.in_link as usize);
            if credit_checked {
                while let Some(&(t, b)) = l.credit_ret[c].front() {
                    if t > now {
                        break;
                    }
                    l.credits[c].refund(u64::from(b));
                    l.credit_ret[c].pop_front();
                }
                if !l.credits[c].try_spend(wire) {
                    if l.credit_wait[c] != 2 {
                        if let Some(&(t, _)) = l.credit_ret[c].front() {
                            l.credit_wait[c] = 2;
                            self.seq += 1;
                            let ev = Ev::Credit {
                                link: li as u32,
                                class: c as u8,
                            };
                            self.events.push(t, self.seq, ev);
                        } else {
                            l.credit_wait[c] = 1;
                        }
                    }
                    continue;
                }
            }
            l.q[c].pop_front();
            l.qbytes[c] -= wire;
            l.tx_pkts += 1;
            l.tx_bytes += wire;
            let ser = serialisation_ps(wire, l.bps);
            l.busy_until = now + ser;
            let mut arrive = now + ser + l.prop;
            let (src, dst_part) = (l.src, l.dst_part);
            if matches!(l.dst, Node::Switch(_)) {
                arrive += self.switch_ps;
            }
            let waiting = from_host || !l.q[0].is_empty() || !l.q[1].is_empty();
            if waiting && !l.done_pending {
                l.done_pending = true;
                self.push(now + ser, Ev::TxDone { link: li as u32 });
            }
            if dst_part == self.part {
                let ev = Ev::Arrive {
                    link: li as u32,
                    pkt: id,
                };
                self.push(arrive, ev);
            } else {
                let pkt = self.pkts[id as usize].take().expect("queued packet");
                self.free.push(id);
                let link = li as u32;
                let cross = Cross::Arrive {
                    at: arrive,
                    link,
                    pkt,
                };
                self.out.push((dst_part, cross));
            }
            if let Node::Switch(s) = src {
                self.bufs[s as usize].release(wire);
                if inl != u32::MAX as usize {
                    self.free_ingress(inl, class, wire);
                }
            }
            return;
        }
    }

    fn tx_done(&mut self, li: usize) {
        self.links[li].done_pending = false;
        match self.links[li].src {
            Node::Host(h) => {
                self.pump(h);
                self.arm_timer(h);
            }
            Node::Switch(_) => self.kick(li),
        }
    }

    /// Bytes that came in on `inl` left the switch (or never entered it).
    fn free_ingress(&mut self, inl: usize, class: u8, wire: u64) {
        match self.kind {
            LinkKind::Pfc => {
                let pfc = self.pfc;
                if self.links[inl].pfc_in[class as usize].on_departure(&pfc, wire)
                    == PfcAction::Send(0)
                {
                    self.send_pause(inl, class, 0);
                }
            }
            LinkKind::IbCredit => {
                let l = &self.links[inl];
                let at = self.now + l.prop;
                if l.src_part == self.part {
                    self.credit_back(inl, class, at, wire as u32);
                } else {
                    let (link, bytes) = (inl as u32, wire as u32);
                    let cross = Cross::Credit {
                        at,
                        link,
                        class,
                        bytes,
                    };
                    self.out.push((l.src_part, cross));
                }
            }
            LinkKind::Lossy => {}
        }
    }

    /// `bytes` of IB credits for `li`'s transmitter, back at `at`.
    fn credit_back(&mut self, li: usize, class: u8, at: Ps, bytes: u32) {
        let l = &mut self.links[li];
        let c = class as usize;
        l.credit_ret[c].push_back((at, bytes));
        if l.credit_wait[c] == 1 {
            l.credit_wait[c] = 2;
            let link = li as u32;
            self.push(at, Ev::Credit { link, class });
        }
    }

    fn send_pause(&mut self, link: usize, class: u8, quanta: u16) {
        let l = &self.links[link];
        // The frame crosses the cable back to the transmitter.
        let at = self.now + serialisation_ps(64 + 20, l.bps) + l.prop;
        let (bps, tx_part) = (l.bps, l.src_part);
        let link32 = link as u32;
        if tx_part == self.part {
            let ev = Ev::Pause {
                link: link32,
                class,
                quanta,
            };
            self.push(at, ev);
        } else {
            let cross = Cross::Pause {
                at,
                link: link32,
                class,
                quanta,
            };
            self.out.push((tx_part, cross));
        }
        if quanta > 0 {
            let refresh = self.now + pause_ps(quanta, bps) / 2;
            self.push(
                refresh,
                Ev::Refresh {
                    link: link as u32,
                    class,
                },
            );
        }
    }

    fn pause(&mut self, li: usize, c: usize, quanta: u16) {
        let now = self.now;
        let l = &mut self.links[li];
        l.pause_frames += u64::from(quanta > 0);
        // Close a pause that ran out by itself.
        if l.paused_until[c] <= now {
            let end = l.paused_until[c];
            l.close_pause(c, end);
        }
        if quanta == 0 {
            l.close_pause(c, now);
            l.paused_until[c] = now;
            self.kick(li);
            return;
        }
        if l.pause_start[c].is_none() {
            l.pause_start[c] = Some(now);
        }
        l.paused_until[c] = now + pause_ps(quanta, l.bps);
    }

    fn drop_pkt(&mut self, li: usize, id: u32, cause: DropCause) {
        match cause {
            DropCause::TailDrop => self.totals.drops_tail += 1,
            DropCause::HeadroomOverflow => self.totals.drops_headroom += 1,
            DropCause::Corruption => self.totals.drops_corruption += 1,
        }
        self.links[li].drops[cause as usize] += 1;
        if let Some(token) = self.pkts[id as usize].as_ref().map(|p| p.token) {
            if token != 0 {
                self.outside.push(Outside::Dropped { token });
            }
        }
        self.release(id);
    }

    fn arrive(&mut self, li: usize, id: u32) {
        let loss = self.links[li].loss;
        if loss > 0.0 && self.rng.chance(loss) {
            // A bad FCS: the receiver discards it before buffering it.
            if self.kind == LinkKind::IbCredit && matches!(self.links[li].dst, Node::Switch(_)) {
                let p = self.pkts[id as usize].as_ref().expect("arriving");
                let (class, wire) = (p.class, u64::from(p.wire));
                self.free_ingress(li, class, wire);
            }
            return self.drop_pkt(li, id, DropCause::Corruption);
        }
        if self.pkts[id as usize]
            .as_ref()
            .is_some_and(|p| p.sharp != 0)
        {
            return self.sharp_arrive(li, id);
        }
        match self.links[li].dst {
            Node::Host(h) => {
                let p = self.pkts[id as usize].take().expect("arriving");
                self.free.push(id);
                self.totals.packets_delivered += 1;
                if p.token != 0 {
                    let (token, at, ecn) = (p.token, self.now, p.ecn);
                    self.outside.push(Outside::Arrived { token, at, ecn });
                    return;
                }
                if p.zeros > 0 {
                    self.count_goodput(p.zeros);
                }
                let ep = Endpoints::new(
                    SocketAddr::new(host_addr(p.src).ip(), p.sport),
                    host_addr(h),
                );
                let now = self.eng_now();
                let rx = &mut self.rxbuf;
                rx.clear();
                let d = p.data.as_slice();
                rx.extend_from_slice(&d[..p.head as usize]);
                rx.resize(rx.len() + p.zeros as usize, 0);
                rx.extend_from_slice(&d[p.head as usize..]);
                self.hosts[h as usize]
                    .as_mut()
                    .expect(OWN_HOST)
                    .engine
                    .handle_packet_meta(
                        now,
                        ep,
                        RxMeta {
                            ecn: p.ecn,
                            group: None,
                        },
                        rx,
                    );
                self.host_after(h);
            }
            Node::Switch(s) => self.switch_in(s, li, id),
        }
    }

    fn switch_in(&mut self, s: u32, li: usize, id: u32) {
        let p = self.pkts[id as usize].as_mut().expect("arriving");
        let mut h = flow_hash(self.seed, p.src, p.dst, p.sport);
        if self.routing == Routing::Spray {
            self.spray += 1;
            h ^= self.spray.wrapping_mul(0xD6E8_FEB8_6659_FD93);
        }
        let hash = mix(h ^ u64::from(s));
        let out = self.tree.next_link(s, p.dst, hash);
        let (wire, class) = (u64::from(p.wire), p.class as usize);
        p.in_link = li as u32;
        let queued = self.links[out].qbytes[class];
        match self.kind {
            LinkKind::Lossy => {
                if !self.bufs[s as usize].admit(queued, wire) {
                    return self.drop_pkt(li, id, DropCause::TailDrop);
                }
            }
            LinkKind::Pfc => {
                let pfc = self.pfc;
                match self.links[li].pfc_in[class].on_arrival(&pfc, wire) {
                    PfcAction::Drop => return self.drop_pkt(li, id, DropCause::HeadroomOverflow),
                    PfcAction::Send(q) => self.send_pause(li, class as u8, q),
                    PfcAction::None => {}
                }
                self.bufs[s as usize].force(wire);
            }
            LinkKind::IbCredit => self.bufs[s as usize].force(wire),
        }
        if let Some(red) = self.red {
            let p = self.pkts[id as usize].as_mut().expect("arriving");
            if matches!(p.ecn, Ecn::Ect0 | Ecn::Ect1) {
                let prob = red.mark_probability(queued);
                if prob > 0.0 && self.rng.chance(prob) {
                    p.ecn = Ecn::Ce;
                    self.totals.ecn_marked += 1;
                }
            }
        }
        let l = &mut self.links[out];
        l.q[class].push_back(id);
        l.qbytes[class] += wire;
        l.max_q = l.max_q.max(l.qbytes[0] + l.qbytes[1]);
        self.kick(out);
    }

    /// Builds the aggregation tree over all hosts: each host's leaf, then
    /// every switch's first up-link, up to the lowest level that holds
    /// every host below one switch.
    fn build_sharp(&mut self, sc: &Scenario) {
        let t = &self.tree;
        let ns = t.switches.len();
        let leaves: std::collections::BTreeSet<u32> = t.host_leaf.iter().copied().collect();
        let pods: std::collections::BTreeSet<u32> =
            leaves.iter().map(|&l| t.switches[l as usize].pod).collect();
        let top = if leaves.len() == 1 {
            0
        } else if t.tiers == 2 || pods.len() == 1 {
            1
        } else {
            2
        };
        let mut sh = SharpTree {
            parent: vec![usize::MAX; ns],
            down: vec![Vec::new(); ns],
            need: vec![0; ns],
            busy: vec![0; ns],
            alu_ps: (sc.sharp.alu_ns * 1000.0) as Ps,
            slots: sc.sharp.slots,
            chunk_bytes: u64::from(sc.transport.mtu),
            next: vec![0; self.plan.msgs.len()],
            got: vec![0; self.plan.msgs.len()],
            tx: vec![VecDeque::new(); t.hosts as usize],
            out: vec![0; t.hosts as usize],
            ..Default::default()
        };
        for h in 0..t.hosts as usize {
            let mut cur = t.host_leaf[h];
            // The leaf's down-link to the host is the cable's other half.
            sh.down[cur as usize].push(t.host_up[h] + 1);
            sh.need[cur as usize] += 1;
            while t.switches[cur as usize].level < top {
                let up = t.switches[cur as usize].up[0];
                let Node::Switch(parent) = t.links[up].dst else {
                    break;
                };
                if sh.parent[cur as usize] != usize::MAX {
                    cur = parent;
                    break;
                }
                sh.parent[cur as usize] = up;
                sh.down[parent as usize].push(up + 1);
                sh.need[parent as usize] += 1;
                cur = parent;
            }
            while t.switches[cur as usize].level < top {
                cur = match t.links[sh.parent[cur as usize]].dst {
                    Node::Switch(p) => p,
                    Node::Host(_) => break,
                };
            }
            sh.root = cur;
        }
        self.sh = sh;
    }

    fn sharp_chunks(&self, msg: u32) -> u32 {
        self.plan.msgs[msg as usize]
            .bytes
            .div_ceil(self.sh.chunk_bytes)
            .max(1) as u32
    }

    fn sharp_packet(&mut self, op: u32, chunk: u32, down: bool) -> u32 {
        let msg = self.plan.sharp_base[op as usize];
        let bytes = self.plan.msgs[msg as usize].bytes;
        let cb = self.sh.chunk_bytes;
        let len = (bytes - u64::from(chunk) * cb).min(cb) as u32;
        self.totals.sharp_packets += 1;
        self.alloc(Pkt {
            data: Bytes::Inline { len: 0, b: [0; 54] },
            head: 0,
            zeros: len,
            dst: 0,
            src: 0,
            sport: 0,
            ecn: Ecn::NotEct,
            class: 0,
            wire: len + SHARP_HEADER + self.overhead,
            in_link: u32::MAX,
            sharp: op + 1,
            chunk,
            down,
            token: 0,
        })
    }

    /// A host's NIC sends its next contribution if its window (the
    /// switches' aggregation slots) allows. Whether it sent one.
    fn sharp_pump(&mut self, h: u32, li: usize) -> bool {
        let hu = h as usize;
        let Some(&msg) = self.sh.tx[hu].front() else {
            return false;
        };
        if self.sh.out[hu] >= self.sh.slots {
            return false;
        }
        let chunk = self.sh.next[msg as usize];
        self.sh.next[msg as usize] += 1;
        if self.sh.next[msg as usize] >= self.sharp_chunks(msg) {
            self.sh.tx[hu].pop_front();
        }
        self.sh.out[hu] += 1;
        let op = self.plan.msgs[msg as usize].sharp.unwrap_or(0);
        let id = self.sharp_packet(op, chunk, false);
        let wire = u64::from(self.pkts[id as usize].as_ref().expect("new").wire);
        let l = &mut self.links[li];
        l.q[0].push_back(id);
        l.qbytes[0] += wire;
        self.kick(li);
        true
    }

    /// An in-network aggregation packet arrived at the end of `li`.
    fn sharp_arrive(&mut self, li: usize, id: u32) {
        let p = self.pkts[id as usize].take().expect("arriving");
        self.free.push(id);
        let (op, chunk) = (p.sharp - 1, p.chunk);
        match self.links[li].dst {
            Node::Host(h) => {
                self.count_goodput(p.zeros);
                let msg = self.plan.sharp_base[op as usize] + h;
                let m = msg as usize;
                self.sh.got[m] += 1;
                self.sh.out[h as usize] -= 1;
                if self.sh.got[m] == self.sharp_chunks(msg) {
                    let t = &mut self.times[m];
                    t.delivered = Some(self.now);
                    t.acked = Some(self.now);
                    self.remaining -= 2;
                    self.release_dependents(m, self.now + self.host_ps);
                }
                self.pump(h);
            }
            Node::Switch(s) => {
                // The packet is consumed here (reduced into the switch's
                // aggregation buffer, or replicated): on IB its credits go
                // back upstream at once.
                if self.kind == LinkKind::IbCredit {
                    self.free_ingress(li, p.class, u64::from(p.wire));
                }
                if p.down {
                    return self.sharp_down(s, op, chunk);
                }
                let key = (u64::from(s) << 44) | (u64::from(op) << 28) | u64::from(chunk);
                let n = self.sh.partial.entry(key).or_insert(0);
                *n += 1;
                let n = *n;
                if n == 1 {
                    self.sh.busy[s as usize] += 1;
                    let b = u64::from(self.sh.busy[s as usize]);
                    self.totals.sharp_max_slots = self.totals.sharp_max_slots.max(b);
                }
                if n == self.sh.need[s as usize] {
                    self.sh.partial.remove(&key);
                    self.sh.busy[s as usize] -= 1;
                    let at = self.now + self.sh.alu_ps;
                    self.push(at, Ev::SharpEmit { sw: s, op, chunk });
                }
            }
        }
    }

    /// Switch `s` has reduced `chunk`: up to its parent, or from the root
    /// down the tree.
    fn sharp_emit(&mut self, s: u32, op: u32, chunk: u32) {
        if s == self.sh.root {
            return self.sharp_down(s, op, chunk);
        }
        let up = self.sh.parent[s as usize];
        let id = self.sharp_packet(op, chunk, false);
        self.sharp_enqueue(s, up, id);
    }

    /// The result `chunk` goes out of `s` on every down-link of the tree.
    fn sharp_down(&mut self, s: u32, op: u32, chunk: u32) {
        for i in 0..self.sh.down[s as usize].len() {
            let out = self.sh.down[s as usize][i];
            let id = self.sharp_packet(op, chunk, true);
            self.sharp_enqueue(s, out, id);
        }
    }

    fn sharp_enqueue(&mut self, s: u32, out: usize, id: u32) {
        let wire = u64::from(self.pkts[id as usize].as_ref().expect("new").wire);
        self.bufs[s as usize].force(wire);
        let l = &mut self.links[out];
        l.q[0].push_back(id);
        l.qbytes[0] += wire;
        l.max_q = l.max_q.max(l.qbytes[0] + l.qbytes[1]);
        self.kick(out);
    }

    fn node_name(&self, n: Node) -> String {
        match n {
            Node::Host(h) => format!("host{h}"),
            Node::Switch(s) => {
                let sw = &self.tree.switches[s as usize];
                let kind = match (self.tree.tiers, sw.level) {
                    (_, 0) => "leaf",
                    (2, _) => "spine",
                    (_, 1) => "agg",
                    _ => "core",
                };
                format!("{kind}{s}")
            }
        }
    }

    /// Every link's figures.
    pub fn link_reports(&self) -> Vec<LinkReport> {
        self.links
            .iter()
            .enumerate()
            .map(|(i, l)| LinkReport {
                id: i,
                from: self.node_name(l.src),
                to: self.node_name(l.dst),
                tx_packets: l.tx_pkts,
                tx_bytes: l.tx_bytes,
                max_queue_bytes: l.max_q,
                pause_us: l.pause_total as f64 / 1e6,
                max_pause_us: l.pause_max as f64 / 1e6,
                pause_frames: l.pause_frames,
                drops_tail: l.drops[DropCause::TailDrop as usize],
                drops_headroom: l.drops[DropCause::HeadroomOverflow as usize],
                drops_corruption: l.drops[DropCause::Corruption as usize],
            })
            .collect()
    }

    /// Message `i` (times `t`), not completed, for diagnosis: its
    /// sender QP's state and unacknowledged packets (this part must hold
    /// its sender).
    pub(crate) fn describe(&mut self, i: usize, t: &MsgTimes) -> String {
        let m = &self.plan.msgs[i];
        if m.sharp.is_some() {
            return format!(
                "msg {i}: host {}'s part of in-network aggregation {:?}, {} B: ready {:?}, {} result chunks received",
                m.src, m.sharp, m.bytes, t.ready, self.sh.got[i]
            );
        }
        let hs = self.hosts[m.src as usize].as_mut().expect(OWN_HOST);
        let q = hs.qps[&m.dst];
        let deadline = hs.engine.poll_timeout();
        let e = &hs.engine;
        format!(
            "msg {i} {}→{} {} B: ready {:?} delivered {:?} acked {:?}; sender QP {:?}, {} unacked, (engine deadline, timer_at, now, events) {:?}",
            m.src,
            m.dst,
            m.bytes,
            t.ready,
            t.delivered,
            t.acked,
            e.qp_state(q),
            e.unacked_packets(q),
            (deadline, hs.timer_at, self.now, self.events.len()),
        )
    }

    /// The links the packets of host `from`'s QP to host `to` cross under
    /// ECMP (this part holds `from`); None when packets are sprayed.
    pub(crate) fn path(&self, from: u32, to: u32) -> Option<Vec<usize>> {
        if self.routing == Routing::Spray {
            return None;
        }
        let hs = self.hosts[from as usize].as_ref()?;
        let sport = hs.engine.qp_src_port(*hs.qps.get(&to)?);
        let h = flow_hash(self.seed, from, to, sport);
        let mut path = vec![self.tree.host_up[from as usize]];
        while let Node::Switch(s) = self.links[*path.last()?].dst {
            path.push(self.tree.next_link(s, to, mix(h ^ u64::from(s))));
            if path.len() > 16 {
                return None;
            }
        }
        Some(path)
    }

    /// Whether link `li`'s transmitter sat out a pause between `from` and
    /// `to` (as this part saw it: its own transmitters').
    pub(crate) fn paused_between(&self, li: usize, from: Ps, to: Ps) -> bool {
        self.links[li]
            .pauses
            .iter()
            .any(|&(s, e)| s < to && e > from)
    }

    /// When message `msg`'s last byte would reach its receiver after its
    /// post (ps) if it had `path` to itself: its packets (this
    /// fabric's framing, MTU `mtu`) back to back from the NIC, each
    /// stored and forwarded at every switch.
    pub(crate) fn ideal_ps(&self, msg: usize, path: &[usize], mtu: u64) -> Ps {
        let bytes = self.plan.msgs[msg].bytes;
        let n = bytes.div_ceil(mtu).max(1);
        // BTH and ICRC on every packet, RETH on the first, the immediate
        // on the last.
        let wire = |i: u64| {
            let payload = if i + 1 < n {
                mtu
            } else {
                bytes - mtu * (n - 1)
            };
            payload
                + 16
                + 16 * u64::from(i == 0)
                + 4 * u64::from(i + 1 == n)
                + u64::from(self.overhead)
        };
        let mut free = vec![0 as Ps; path.len()];
        let mut arrive = 0;
        for i in 0..n {
            let mut t = 0;
            for (j, &li) in path.iter().enumerate() {
                let l = &self.links[li];
                let start = t.max(free[j]);
                free[j] = start + serialisation_ps(wire(i), l.bps);
                t = free[j] + l.prop;
                if matches!(l.dst, Node::Switch(_)) {
                    t += self.switch_ps;
                }
            }
            arrive = t;
        }
        arrive
    }

    /// The link from host `h` to its leaf, and the leaf's link to it.
    pub fn host_links(&self, h: u32) -> (usize, usize) {
        let up = self.tree.host_up[h as usize];
        (up, up + 1)
    }
}
