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
    pub pd: u32,
    pub cq: u32,
    pub qpn: u32,
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
    let e = &mut net.nodes[node];
    let pd = e.alloc_pd();
    let cq = e.create_cq(4096).unwrap();
    let mem = Arc::new(VecMemory::new(REGION));
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
        QpType::Uc => {
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
        QpType::Rc => {
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
        QpType::Rc => {
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
