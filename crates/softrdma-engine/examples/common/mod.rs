//! Setup shared by the engine's simulator examples: a region and an RC QP
//! per side, connected for RDMA WRITEs with 4 KiB MTU.
#![allow(dead_code)]

use std::sync::Arc;

use softrdma_engine::sim::node_addr;
use softrdma_engine::*;
use softrdma_wire::Psn;

pub struct Side {
    pub qpn: Qpn,
    pub cq: CqHandle,
    pub keys: MrKeys,
    pub base: u64,
}

pub fn side(e: &mut Engine, node: usize) -> Side {
    let pd = e.alloc_pd();
    let cq = e.create_cq(4096).unwrap();
    let base = 0x10_0000_0000 * (node as u64 + 1);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let keys = e
        .reg_mr(pd, base, access, Arc::new(VecMemory::new(4 << 20)))
        .unwrap();
    let cap = QpCap {
        max_send_wr: 1024,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qpn = e
        .create_qp(QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap,
            sq_sig_all: true,
        })
        .unwrap();
    Side {
        qpn,
        cq,
        keys,
        base,
    }
}

pub fn connect(e: &mut Engine, now: Instant, s: &Side, peer: &Side, peer_node: usize) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        ..Default::default()
    };
    let m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
    e.modify_qp(now, s.qpn, &a, m).unwrap();
    a.qp_state = QpState::Rtr;
    a.ah_attr = AhAttr {
        dgid: Gid::from_ip(node_addr(peer_node).ip()),
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..Default::default()
    };
    a.path_mtu = Mtu::Mtu4096;
    a.dest_qp_num = peer.qpn;
    a.rq_psn = Psn::new(0);
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    let m = AttrMask::STATE
        | AttrMask::AV
        | AttrMask::PATH_MTU
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER;
    e.modify_qp(now, s.qpn, &a, m).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = Psn::new(0);
    // 4.096 µs × 2^6 = 262 µs: about 26 round trips.
    a.timeout = 6;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    let m = AttrMask::STATE
        | AttrMask::SQ_PSN
        | AttrMask::TIMEOUT
        | AttrMask::RETRY_CNT
        | AttrMask::RNR_RETRY
        | AttrMask::MAX_QP_RD_ATOMIC;
    e.modify_qp(now, s.qpn, &a, m).unwrap();
}

/// A 64 KiB (or `len`) RDMA WRITE from `a`'s slot `slot` to the same slot at `b`.
pub fn write(wr_id: u64, a: &Side, b: &Side, slot: u64, len: u32) -> SendWr {
    let off = slot * u64::from(len);
    SendWr::new(
        wr_id,
        SendOp::Write {
            remote_addr: b.base + off,
            rkey: b.keys.rkey,
        },
        vec![Sge {
            addr: a.base + off,
            length: len,
            lkey: a.keys.lkey,
        }],
    )
}
