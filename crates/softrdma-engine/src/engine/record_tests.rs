//! The send records are enough to rebuild any packet in flight: what a
//! selective repeat will retransmit from.

use crate::handle::{Lkey, Qpn, Rkey};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use softrdma_wire::{PacketRepr, Psn};

use super::*;
use crate::memory::VecMemory;
use crate::qp_attr::Gid;
use crate::sim::{node_addr, NetConfig, SimNet, TapStage, Tapped, Verdict};
use crate::wr::{SendOp, SendWr, Sge};

struct Side {
    qpn: Qpn,
    lkey: Lkey,
    rkey: Rkey,
    base: u64,
}

fn side(e: &mut Engine, node: usize) -> Side {
    let pd = e.alloc_pd();
    let cq = e.create_cq(64).unwrap();
    let base = 0x1000 * (node as u64 + 1);
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let keys = e
        .reg_mr(pd, base, access, Arc::new(VecMemory::new(1 << 16)))
        .unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let init = QpInit {
        pd,
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap,
        sq_sig_all: true,
    };
    let qpn = e.create_qp(init).unwrap();
    Side {
        qpn,
        lkey: keys.lkey,
        rkey: keys.rkey,
        base,
    }
}

fn connect(e: &mut Engine, me: &Side, peer: &Side, peer_node: usize) {
    let now = Instant::ZERO;
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        port_num: 1,
        ..Default::default()
    };
    let m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
    e.modify_qp(now, me.qpn, &a, m).unwrap();
    a.qp_state = QpState::Rtr;
    a.ah_attr = AhAttr {
        dgid: Gid::from_ip(node_addr(peer_node).ip()),
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..Default::default()
    };
    a.path_mtu = Mtu::Mtu1024;
    a.dest_qp_num = peer.qpn;
    a.rq_psn = Psn::new(0x40);
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 1;
    let m = AttrMask::STATE
        | AttrMask::AV
        | AttrMask::PATH_MTU
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER;
    e.modify_qp(now, me.qpn, &a, m).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = Psn::new(0x40);
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    let m = AttrMask::STATE
        | AttrMask::SQ_PSN
        | AttrMask::TIMEOUT
        | AttrMask::RETRY_CNT
        | AttrMask::RNR_RETRY
        | AttrMask::MAX_QP_RD_ATOMIC;
    e.modify_qp(now, me.qpn, &a, m).unwrap();
}

#[test]
fn every_packet_in_flight_is_rebuilt_from_its_send_record() {
    let mut net = SimNet::new(2, 5, NetConfig::perfect());
    let a = side(&mut net.nodes[0], 0);
    let b = side(&mut net.nodes[1], 1);
    connect(&mut net.nodes[0], &a, &b, 1);
    connect(&mut net.nodes[1], &b, &a, 0);
    // Record what a sends; lose everything b answers, so nothing is
    // acknowledged and every packet stays in flight.
    let sent: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
    let log = sent.clone();
    net.set_tap(Some(Box::new(move |t: &Tapped<'_>| {
        if t.from == 1 {
            return Verdict::Drop;
        }
        if t.stage == TapStage::Transmit {
            log.borrow_mut().push(t.data.to_vec());
        }
        Verdict::Pass
    })));
    let sge = |len| Sge {
        addr: a.base,
        length: len,
        lkey: a.lkey,
    };
    let remote_addr = b.base + 64;
    let ops = [
        (
            SendOp::Write {
                remote_addr,
                rkey: b.rkey,
            },
            3000,
        ),
        (
            SendOp::Read {
                remote_addr,
                rkey: b.rkey,
            },
            2048,
        ),
        (
            SendOp::FetchAdd {
                remote_addr,
                rkey: b.rkey,
                add: 1,
            },
            8,
        ),
    ];
    for (i, (op, len)) in ops.into_iter().enumerate() {
        let wr = SendWr::new(i as u64, op, vec![sge(len)]);
        net.nodes[0].post_send(net.now, a.qpn, &wr).unwrap();
    }
    // Well before the ACK timeout (67 ms).
    net.advance_to(net.now + Duration::from_micros(50));
    let sent = sent.borrow();
    // 3 WRITE packets, one READ request (2 responses), one FETCH_ADD.
    assert_eq!(sent.len(), 5);

    let now = net.now;
    let e = &mut net.nodes[0];
    let qp = e.qps.get_mut(&a.qpn).unwrap();
    assert!(qp.req.records.cover(qp.comp.una, qp.req.high));
    assert_eq!(
        qp.req.high.distance_from(qp.comp.una),
        6,
        "six PSNs in flight"
    );
    assert_eq!(
        qp.req.records.find(Psn::new(0x44)).unwrap().psn,
        Psn::new(0x43),
        "a READ response's PSN"
    );
    let mut buf = vec![0u8; 4200];
    for original in sent.iter() {
        let orig = PacketRepr::parse(original).unwrap();
        let psn = orig.bth.psn;
        let rec = *qp.req.records.find(psn).unwrap();
        assert_eq!((rec.psn, rec.opcode), (psn, orig.bth.opcode));
        let (idx, offset) = qp.position_of(psn);
        let mut ctx = TxCtx {
            buf: &mut buf,
            local: e.cfg.local,
            ack_req_every: e.cfg.ack_req_every,
            ack_delay_ns: 0,
            hold_needs_answer: false,
            now,
            gather: false,
        };
        let built = qp
            .build_request(&mut e.res, &mut ctx, idx, offset, psn)
            .unwrap();
        assert_eq!(built.span, rec.span);
        let dst = qp.dest.unwrap();
        let t = qp
            .finish_packet(
                &mut e.res,
                &mut ctx,
                built.bth,
                built.headers,
                built.payload_len,
                dst,
            )
            .unwrap();
        let again = PacketRepr::parse(&buf[..t.len]).unwrap();
        // The same packet (only AckReq may differ: it depends on what
        // went out since the last request for an ACK).
        assert_eq!(again.bth.opcode, orig.bth.opcode);
        assert_eq!(again.bth.psn, psn);
        assert_eq!(again.headers, orig.headers);
        assert_eq!(again.payload, orig.payload);
        let carried = orig.headers.reth().filter(|_| orig.payload.is_empty());
        let want = carried.map_or(orig.payload.len() as u32, |r| r.dma_len);
        assert_eq!(
            (rec.offset, rec.len),
            (offset, want),
            "where in the message"
        );
    }
}
