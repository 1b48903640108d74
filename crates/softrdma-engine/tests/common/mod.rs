//! Helpers shared by the engine's integration tests: two (or more) engines on
//! a simulated network, with connected QPs and registered regions.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use softrdma_engine::sim::{node_addr, NetConfig, SimNet};
use softrdma_engine::*;
use softrdma_wire::Psn;

pub const REGION: usize = 1 << 20;

/// One side of a connection.
pub struct Side {
    pub node: usize,
    pub pd: PdHandle,
    pub cq: CqHandle,
    pub qpn: Qpn,
    pub mem: Arc<VecMemory>,
    pub keys: MrKeys,
    pub base: u64,
}

pub fn qp_cap() -> QpCap {
    QpCap {
        max_send_wr: 1024,
        max_recv_wr: 1024,
        max_send_sge: 8,
        max_recv_sge: 8,
        max_inline_data: 64,
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

pub fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// Creates PD, CQ, a region of `REGION` bytes at a node-specific address, and a QP.
pub fn make_side(net: &mut SimNet, node: usize, qp_type: QpType) -> Side {
    make_side_with(net, node, qp_type, VecMemory::new(REGION))
}

/// [`make_side`] with the region's memory given.
pub fn make_side_with(net: &mut SimNet, node: usize, qp_type: QpType, mem: VecMemory) -> Side {
    let e = &mut net.nodes[node];
    let pd = e.alloc_pd();
    let cq = e.create_cq(4096).unwrap();
    let mem = Arc::new(mem);
    let base = 0x10_0000_0000 * (node as u64 + 1) + 0x1000;
    let keys = e.reg_mr(pd, base, all_access(), mem.clone()).unwrap();
    let qpn = e
        .create_qp(QpInit {
            pd,
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: qp_cap(),
            sq_sig_all: false,
        })
        .unwrap();
    Side {
        node,
        pd,
        cq,
        qpn,
        mem,
        keys,
        base,
    }
}

pub struct ConnOpts {
    pub mtu: Mtu,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub rd_atomic: u8,
    pub psn_a: u32,
    pub psn_b: u32,
}

impl Default for ConnOpts {
    fn default() -> Self {
        ConnOpts {
            mtu: Mtu::Mtu1024,
            timeout: 12,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            rd_atomic: 16,
            psn_a: 0x100,
            psn_b: 0xFFFF00,
        }
    }
}

/// Moves a QP through INIT, RTR and RTS towards `remote`.
pub fn bring_up(
    net: &mut SimNet,
    s: &Side,
    remote: &Side,
    my_psn: u32,
    their_psn: u32,
    o: &ConnOpts,
    qp_type: QpType,
) {
    let now = net.now;
    let e = &mut net.nodes[s.node];
    let mut a = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: all_access(),
        ..Default::default()
    };
    let m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
    let m = if qp_type == QpType::Ud {
        a.qkey = 0x1111_2222;
        m | AttrMask::QKEY
    } else {
        m | AttrMask::ACCESS_FLAGS
    };
    e.modify_qp(now, s.qpn, &a, m).unwrap();
    a.qp_state = QpState::Rtr;
    let m = match qp_type {
        QpType::Ud => AttrMask::STATE,
        QpType::Uc | QpType::XrcIni => {
            a.ah_attr = av_for(remote.node);
            a.path_mtu = o.mtu;
            a.dest_qp_num = remote.qpn;
            a.rq_psn = Psn::new(their_psn);
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
        }
        QpType::Rc | QpType::XrcTgt => {
            a.ah_attr = av_for(remote.node);
            a.path_mtu = o.mtu;
            a.dest_qp_num = remote.qpn;
            a.rq_psn = Psn::new(their_psn);
            a.max_dest_rd_atomic = o.rd_atomic;
            a.min_rnr_timer = o.min_rnr_timer;
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
                | AttrMask::MAX_DEST_RD_ATOMIC
                | AttrMask::MIN_RNR_TIMER
        }
    };
    e.modify_qp(now, s.qpn, &a, m).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = Psn::new(my_psn);
    let m = match qp_type {
        QpType::XrcTgt => {
            a.timeout = o.timeout;
            AttrMask::STATE | AttrMask::SQ_PSN | AttrMask::TIMEOUT
        }
        QpType::Rc | QpType::XrcIni => {
            a.timeout = o.timeout;
            a.retry_cnt = o.retry_cnt;
            a.rnr_retry = o.rnr_retry;
            a.max_rd_atomic = o.rd_atomic;
            AttrMask::STATE
                | AttrMask::SQ_PSN
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC
        }
        _ => AttrMask::STATE | AttrMask::SQ_PSN,
    };
    e.modify_qp(now, s.qpn, &a, m).unwrap();
}

/// Two nodes with a connected pair of QPs of `qp_type`.
pub fn pair(seed: u64, net_cfg: NetConfig, qp_type: QpType, o: &ConnOpts) -> (SimNet, Side, Side) {
    let mut net = SimNet::new(2, seed, net_cfg);
    let a = make_side(&mut net, 0, qp_type);
    let b = make_side(&mut net, 1, qp_type);
    bring_up(&mut net, &a, &b, o.psn_a, o.psn_b, o, qp_type);
    bring_up(&mut net, &b, &a, o.psn_b, o.psn_a, o, qp_type);
    (net, a, b)
}

/// [`pair`] whose regions offer sends by reference
/// ([`VecMemory::by_reference`]), on a network that uses them
/// ([`SimNet::set_gather`]) when `gather` is set; plain regions and
/// copies otherwise.
pub fn pair_gather(
    seed: u64,
    net_cfg: NetConfig,
    qp_type: QpType,
    o: &ConnOpts,
    gather: bool,
) -> (SimNet, Side, Side) {
    let mut net = SimNet::new(2, seed, net_cfg);
    let mem = || {
        if gather {
            VecMemory::by_reference(REGION)
        } else {
            VecMemory::new(REGION)
        }
    };
    let a = make_side_with(&mut net, 0, qp_type, mem());
    let b = make_side_with(&mut net, 1, qp_type, mem());
    net.set_gather(gather);
    bring_up(&mut net, &a, &b, o.psn_a, o.psn_b, o, qp_type);
    bring_up(&mut net, &b, &a, o.psn_b, o.psn_a, o, qp_type);
    (net, a, b)
}

pub fn sge(s: &Side, off: u64, len: u32) -> Sge {
    Sge {
        addr: s.base + off,
        length: len,
        lkey: s.keys.lkey,
    }
}

/// Polls `n` completions from a side's CQ, running the network as needed.
pub fn wait_wcs(net: &mut SimNet, s: &Side, n: usize, limit: Duration) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let node = s.node;
    let cq = s.cq;
    net.run_until(limit, |net| {
        net.nodes[node]
            .poll_cq(cq, n - out.len(), &mut out)
            .unwrap();
        out.len() >= n
    });
    out
}

pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

// ----- more helpers for the focused tests -----

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;

use softrdma_engine::sim::{TapStage, Tapped, Verdict};
use softrdma_wire::{BthRepr, Endpoints, Headers, OpKind, Opcode, PacketRepr, RethRepr, Syndrome};

/// A generous limit for runs that must finish.
pub const LONG: Duration = Duration::from_secs(10);

/// Like `pair`, with the engines' configuration adjusted by `tweak`.
pub fn pair_cfg(
    seed: u64,
    net_cfg: NetConfig,
    qp_type: QpType,
    o: &ConnOpts,
    tweak: impl Fn(&mut EngineConfig),
) -> (SimNet, Side, Side) {
    let cfgs: Vec<EngineConfig> = (0..2)
        .map(|i| {
            let mut c = EngineConfig::new(node_addr(i));
            c.seed = seed.wrapping_mul(31).wrapping_add(i as u64);
            tweak(&mut c);
            c
        })
        .collect();
    let mut net = SimNet::with_configs(cfgs, seed, net_cfg);
    let a = make_side(&mut net, 0, qp_type);
    let b = make_side(&mut net, 1, qp_type);
    bring_up(&mut net, &a, &b, o.psn_a, o.psn_b, o, qp_type);
    bring_up(&mut net, &b, &a, o.psn_b, o.psn_a, o, qp_type);
    (net, a, b)
}

/// A perfect network with 5 µs of delay.
pub fn net5() -> NetConfig {
    NetConfig {
        delay: Duration::from_micros(5),
        ..NetConfig::perfect()
    }
}

pub fn post(net: &mut SimNet, s: &Side, wr: &SendWr) -> softrdma_engine::Result<()> {
    let now = net.now;
    net.nodes[s.node].post_send(now, s.qpn, wr)
}

pub fn post_ok(net: &mut SimNet, s: &Side, wr: SendWr) {
    post(net, s, &wr).unwrap_or_else(|e| panic!("post_send {}: {e}", wr.op.name()));
}

pub fn unsignaled(mut wr: SendWr) -> SendWr {
    wr.flags = SendFlags(wr.flags.0 & !SendFlags::SIGNALED.0);
    wr
}

pub fn with_flags(mut wr: SendWr, f: SendFlags) -> SendWr {
    wr.flags = wr.flags | f;
    wr
}

pub fn write_wr(wr_id: u64, s: &Side, off: u64, len: u32, remote: &Side, roff: u64) -> SendWr {
    SendWr::new(
        wr_id,
        SendOp::Write {
            remote_addr: remote.base + roff,
            rkey: remote.keys.rkey,
        },
        vec![sge(s, off, len)],
    )
}

pub fn read_wr(wr_id: u64, s: &Side, off: u64, len: u32, remote: &Side, roff: u64) -> SendWr {
    SendWr::new(
        wr_id,
        SendOp::Read {
            remote_addr: remote.base + roff,
            rkey: remote.keys.rkey,
        },
        vec![sge(s, off, len)],
    )
}

pub fn send_wr(wr_id: u64, s: &Side, off: u64, len: u32) -> SendWr {
    SendWr::new(wr_id, SendOp::Send, vec![sge(s, off, len)])
}

pub fn recv(net: &mut SimNet, s: &Side, wr_id: u64, off: u64, len: u32) {
    net.nodes[s.node]
        .post_recv(
            s.qpn,
            &RecvWr {
                wr_id,
                sg_list: vec![sge(s, off, len)],
            },
        )
        .unwrap();
}

/// Everything waiting on a side's CQ, without running the network.
pub fn poll(net: &mut SimNet, s: &Side) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    net.nodes[s.node]
        .poll_cq(s.cq, usize::MAX, &mut out)
        .unwrap();
    out
}

/// Every asynchronous event a node raised so far.
pub fn events(net: &mut SimNet, node: usize) -> Vec<Event> {
    let mut v = Vec::new();
    while let Some(e) = net.nodes[node].poll_event() {
        v.push(e);
    }
    v
}

/// Runs the network for exactly `d` of virtual time.
pub fn run_for(net: &mut SimNet, d: Duration) {
    let t = net.now + d;
    net.advance_to(t);
}

/// Runs until nothing is left to happen (no packet, no timer); panics after `LONG`.
pub fn settle(net: &mut SimNet) {
    let end = net.now + LONG;
    while net.step() {
        assert!(net.now <= end, "the network never went quiet");
    }
}

pub fn mem(s: &Side, off: usize, len: usize) -> Vec<u8> {
    s.mem.snapshot()[off..off + len].to_vec()
}

pub fn u64_at(s: &Side, off: usize) -> u64 {
    u64::from_ne_bytes(mem(s, off, 8).try_into().unwrap())
}

pub fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

pub fn qp_counters(net: &SimNet, s: &Side) -> Counters {
    *net.nodes[s.node].qp_counters(s.qpn).unwrap()
}

/// One packet seen by the tap.
#[derive(Debug, Clone)]
pub struct Pkt {
    pub stage: TapStage,
    pub now: Instant,
    pub from: usize,
    pub to: usize,
    pub ep: Endpoints,
    pub opcode: Opcode,
    pub kind: OpKind,
    pub psn: u32,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub solicited: bool,
    pub syndrome: Option<Syndrome>,
    pub reth: Option<RethRepr>,
    pub atomic_orig: Option<u64>,
    pub payload_len: usize,
    /// The ECN codepoint of its IP header at this stage.
    pub ecn: softrdma_wire::Ecn,
    /// The whole UDP payload, to inject again later.
    pub bytes: Vec<u8>,
}

impl Pkt {
    pub fn sent(&self) -> bool {
        self.stage == TapStage::Transmit
    }
    pub fn is(&self, k: OpKind) -> bool {
        self.kind == k
    }
    pub fn is_nak(&self) -> bool {
        matches!(self.syndrome, Some(Syndrome::Nak(_)))
    }
}

pub type Wire = Rc<RefCell<Vec<Pkt>>>;

fn parse_pkt(t: &Tapped<'_>) -> Option<Pkt> {
    let p = PacketRepr::parse(t.data).ok()?;
    let info = p.bth.opcode.info();
    Some(Pkt {
        stage: t.stage,
        now: t.now,
        from: t.from,
        to: t.to,
        ep: t.endpoints,
        opcode: p.bth.opcode,
        kind: info.kind,
        psn: p.bth.psn.value(),
        dest_qp: p.bth.dest_qp,
        ack_req: p.bth.ack_req,
        solicited: p.bth.solicited,
        syndrome: p.headers.aeth().map(|a| a.syndrome),
        reth: p.headers.reth(),
        atomic_orig: match p.headers {
            Headers::AtomicAck(_, o) => Some(o),
            _ => None,
        },
        payload_len: p.payload.len(),
        ecn: t.ecn,
        bytes: t.data.to_vec(),
    })
}

/// Records every packet at both stages; `verdict` decides, at transmission,
/// what the network does with each.
pub fn tap(net: &mut SimNet, mut verdict: impl FnMut(&Pkt) -> Verdict + 'static) -> Wire {
    let wire: Wire = Rc::new(RefCell::new(Vec::new()));
    let w = wire.clone();
    net.set_tap(Some(Box::new(move |t: &Tapped<'_>| {
        let Some(p) = parse_pkt(t) else {
            return Verdict::Pass;
        };
        let v = if p.sent() { verdict(&p) } else { Verdict::Pass };
        w.borrow_mut().push(p);
        v
    })));
    wire
}

/// Records every packet.
pub fn sniff(net: &mut SimNet) -> Wire {
    tap(net, |_| Verdict::Pass)
}

/// Drops the `n`-th (from 0) transmitted packet that `pred` selects, once.
pub fn drop_nth(net: &mut SimNet, n: usize, pred: impl Fn(&Pkt) -> bool + 'static) -> Wire {
    let mut seen = 0;
    tap(net, move |p| {
        if pred(p) {
            seen += 1;
            if seen == n + 1 {
                return Verdict::Drop;
            }
        }
        Verdict::Pass
    })
}

/// Transmitted packets that `pred` selects.
pub fn sent_where(wire: &Wire, pred: impl Fn(&Pkt) -> bool) -> Vec<Pkt> {
    wire.borrow()
        .iter()
        .filter(|p| p.sent() && pred(p))
        .cloned()
        .collect()
}

/// Delivers `bytes` to `to` as if `from` had sent them, now.
pub fn inject(net: &mut SimNet, to: usize, ep: Endpoints, bytes: &[u8]) {
    let now = net.now;
    net.nodes[to].handle_packet(now, ep, bytes);
}

/// Builds a packet with a correct ICRC as `from` would send it to `to`, and
/// hands it to `to`'s engine.
pub fn forge(
    net: &mut SimNet,
    from: &Side,
    to: &Side,
    bth: BthRepr,
    headers: Headers,
    payload: &[u8],
) {
    let ep = Endpoints::new(
        SocketAddr::new(node_addr(from.node).ip(), 0xC123),
        node_addr(to.node),
    );
    let pkt = PacketRepr {
        bth,
        headers,
        payload,
    };
    let mut buf = vec![0u8; pkt.buffer_len()];
    pkt.emit(&mut buf, &ep).unwrap();
    inject(net, to.node, ep, &buf);
}

/// Registers another region of `len` bytes on `s`'s node, in `pd`.
pub fn extra_mr(
    net: &mut SimNet,
    s: &Side,
    pd: PdHandle,
    iova: u64,
    len: usize,
    access: AccessFlags,
) -> (Arc<VecMemory>, MrKeys) {
    let m = Arc::new(VecMemory::new(len));
    let k = net.nodes[s.node]
        .reg_mr(pd, iova, access, m.clone())
        .unwrap();
    (m, k)
}
