//! XRC: an initiator QP on one node sends to XRC SRQs on the other through
//! one target QP; each request's XRCETH names the SRQ, whose WQEs, PD and
//! CQ it uses. SEND (with immediate), WRITE, READ and atomics; the XRC
//! opcodes and XRCETH on the wire; an SRQ of another XRC domain (or none,
//! or a basic SRQ) refused with an invalid request NAK; the objects' rules
//! (EBUSY, EINVAL).

mod common;

use std::time::Duration;

use common::*;
use softrdma_engine::sim::{NetConfig, SimNet};
use softrdma_engine::*;
use softrdma_wire::{OpKind, Transport};

const T: Duration = Duration::from_secs(5);

struct Xrc {
    net: SimNet,
    /// The initiator (node 0): its QP is `ini.qpn`, completions on `ini.cq`.
    ini: Side,
    /// Node 1's PD, region and CQ; `tgt.qpn` is the target QP.
    tgt: Side,
    xrcd: XrcdHandle,
    srq: SrqHandle,
    srqn: u32,
}

fn setup() -> Xrc {
    let mut net = SimNet::new(2, 3, NetConfig::perfect());
    // Node 0: an XRC initiator with its PD, region and send CQ.
    let mut ini = make_side(&mut net, 0, QpType::Rc);
    let e0 = &mut net.nodes[0];
    e0.destroy_qp(ini.qpn).unwrap();
    ini.qpn = e0
        .create_qp(QpInit {
            pd: ini.pd,
            qp_type: QpType::XrcIni,
            send_cq: ini.cq,
            recv_cq: ini.cq,
            srq: None,
            cap: qp_cap(),
            sq_sig_all: false,
        })
        .unwrap();
    // Node 1: a domain, an XRC SRQ in it (PD, CQ of the side), a target QP.
    let mut tgt = make_side(&mut net, 1, QpType::Rc);
    let e1 = &mut net.nodes[1];
    e1.destroy_qp(tgt.qpn).unwrap();
    let xrcd = e1.alloc_xrcd();
    let srq = e1
        .create_xrc_srq(
            tgt.pd,
            xrcd,
            tgt.cq,
            SrqInit {
                max_wr: 64,
                max_sge: 4,
                limit: 0,
            },
        )
        .unwrap();
    let srqn = e1.srq_num(srq).unwrap();
    tgt.qpn = e1.create_xrc_tgt_qp(xrcd).unwrap();
    assert_eq!(e1.qp_xrcd(tgt.qpn), Some(xrcd));
    let o = ConnOpts::default();
    bring_up(&mut net, &ini, &tgt, o.psn_a, o.psn_b, &o, QpType::XrcIni);
    bring_up(&mut net, &tgt, &ini, o.psn_b, o.psn_a, &o, QpType::XrcTgt);
    Xrc {
        net,
        ini,
        tgt,
        xrcd,
        srq,
        srqn,
    }
}

fn xrc(mut wr: SendWr, srqn: u32) -> SendWr {
    wr.xrc_srqn = Some(srqn);
    wr
}

fn srq_recv(x: &mut Xrc, srq: SrqHandle, wr_id: u64, off: u64, len: u32) {
    let s = sge(&x.tgt, off, len);
    x.net.nodes[1]
        .post_srq_recv(
            srq,
            &RecvWr {
                wr_id,
                sg_list: vec![s],
            },
        )
        .unwrap();
}

#[test]
fn send_lands_in_the_xrc_srq_and_completes_on_its_cq() {
    let mut x = setup();
    let data = pattern(5, 3000);
    x.ini.mem.write(0, &data);
    let srq = x.srq;
    srq_recv(&mut x, srq, 77, 0x8000, 4096);
    let wire = sniff(&mut x.net);
    let mut wr = xrc(send_wr(1, &x.ini, 0, 3000), x.srqn);
    wr.op = SendOp::SendWithImm { imm: 0x1234_5678 };
    post_ok(&mut x.net, &x.ini, wr);
    let wcs = wait_wcs(&mut x.net, &x.ini, 1, T);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    let rx = wait_wcs(&mut x.net, &x.tgt, 1, T);
    assert_eq!(statuses(&rx), vec![(77, WcStatus::Success)]);
    assert_eq!(rx[0].byte_len, 3000);
    assert_eq!(rx[0].imm_data, 0x1234_5678);
    assert_eq!(rx[0].qp_num, x.tgt.qpn, "the receive names the target QP");
    assert_eq!(mem(&x.tgt, 0x8000, 3000), data);
    // On the wire: XRC SENDs (three packets at MTU 1024), each with the
    // XRCETH naming the SRQ; XRC ACKs back, without one.
    let pkts = wire.borrow();
    let srqn_of = |p: &&Pkt| {
        softrdma_wire::PacketRepr::parse(&p.bytes)
            .unwrap()
            .headers
            .xrc_srqn()
    };
    let reqs: Vec<_> = pkts
        .iter()
        .filter(|p| p.sent() && p.is(OpKind::Send))
        .collect();
    assert_eq!(reqs.len(), 3);
    for p in &reqs {
        assert_eq!(p.opcode.info().transport, Transport::Xrc, "{:?}", p.opcode);
        assert_eq!(srqn_of(p), Some(x.srqn));
    }
    let acks: Vec<_> = pkts
        .iter()
        .filter(|p| p.sent() && p.is(OpKind::Ack))
        .collect();
    assert!(!acks.is_empty());
    for p in &acks {
        assert_eq!(p.opcode, softrdma_wire::Opcode::XRC_ACK);
        assert_eq!(srqn_of(p), None);
    }
}

#[test]
fn write_read_and_atomics_go_through_the_srqs_pd() {
    let mut x = setup();
    let data = pattern(9, 5000);
    x.ini.mem.write(0, &data);
    post_ok(
        &mut x.net,
        &x.ini,
        xrc(write_wr(1, &x.ini, 0, 5000, &x.tgt, 0x1000), x.srqn),
    );
    post_ok(
        &mut x.net,
        &x.ini,
        xrc(read_wr(2, &x.ini, 0x10000, 5000, &x.tgt, 0x1000), x.srqn),
    );
    x.tgt.mem.write(0x4000, &40u64.to_le_bytes());
    let fa = SendWr::new(
        3,
        SendOp::FetchAdd {
            remote_addr: x.tgt.base + 0x4000,
            rkey: x.tgt.keys.rkey,
            add: 2,
        },
        vec![sge(&x.ini, 0x20000, 8)],
    );
    post_ok(&mut x.net, &x.ini, xrc(fa, x.srqn));
    let wcs = wait_wcs(&mut x.net, &x.ini, 3, T);
    assert_eq!(
        statuses(&wcs),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    assert_eq!(mem(&x.tgt, 0x1000, 5000), data);
    assert_eq!(mem(&x.ini, 0x10000, 5000), data);
    assert_eq!(u64_at(&x.ini, 0x20000), 40);
    assert_eq!(u64_at(&x.tgt, 0x4000), 42);
}

#[test]
fn an_srq_of_another_domain_is_an_invalid_request() {
    let init = SrqInit {
        max_wr: 8,
        max_sge: 1,
        limit: 0,
    };
    // An XRC SRQ of a second domain (the target, in the first, may not use
    // it), a basic SRQ, and an SRQ number that names nothing.
    for case in 0..3 {
        let mut x = setup();
        let e1 = &mut x.net.nodes[1];
        let other = e1.alloc_xrcd();
        let foreign = e1.create_xrc_srq(x.tgt.pd, other, x.tgt.cq, init).unwrap();
        let basic = e1.create_srq(x.tgt.pd, init).unwrap();
        assert!(e1.srq_num(basic).is_err(), "a basic SRQ has no XRC number");
        let n = match case {
            0 => e1.srq_num(foreign).unwrap(),
            1 => basic.raw(),
            _ => 0xFF_FFF0,
        };
        let srq = x.srq;
        srq_recv(&mut x, srq, 5, 0, 64);
        post_ok(&mut x.net, &x.ini, xrc(send_wr(1, &x.ini, 0, 16), n));
        let wcs = wait_wcs(&mut x.net, &x.ini, 1, T);
        assert_eq!(
            statuses(&wcs),
            vec![(1, WcStatus::RemInvReqErr)],
            "SRQ number {n:#x}"
        );
        // The target went to ERR after its NAK, and its own SRQ kept its WQE.
        assert_eq!(x.net.nodes[1].srq_len(x.srq), 1);
    }
}

#[test]
fn the_objects_rules() {
    let mut x = setup();
    let e1 = &mut x.net.nodes[1];
    // The domain is busy while its SRQ and target QP exist.
    assert!(matches!(e1.dealloc_xrcd(x.xrcd), Err(VerbsError::Busy(_))));
    // Neither XRC QP has a receive queue; the target has no send queue.
    let r = RecvWr {
        wr_id: 1,
        sg_list: vec![],
    };
    assert!(e1.post_recv(x.tgt.qpn, &r).is_err());
    let now = x.net.now;
    let e1 = &mut x.net.nodes[1];
    assert!(e1
        .post_send(now, x.tgt.qpn, &send_wr(1, &x.tgt, 0, 8))
        .is_err());
    assert!(x.net.nodes[0].post_recv(x.ini.qpn, &r).is_err());
    // An initiator's WR must name the remote SRQ, in 24 bits.
    assert!(post(&mut x.net, &x.ini, &send_wr(1, &x.ini, 0, 8)).is_err());
    assert!(post(&mut x.net, &x.ini, &xrc(send_wr(1, &x.ini, 0, 8), 1 << 24)).is_err());
    // A target QP is made in its domain, not by create_qp.
    let e1 = &mut x.net.nodes[1];
    let bad = e1.create_qp(QpInit {
        pd: x.tgt.pd,
        qp_type: QpType::XrcTgt,
        send_cq: x.tgt.cq,
        recv_cq: x.tgt.cq,
        srq: None,
        cap: qp_cap(),
        sq_sig_all: false,
    });
    assert!(bad.is_err());
    // Teardown order: QP and SRQ, then the domain (and the CQ the SRQ held).
    assert!(e1.destroy_cq(x.tgt.cq).is_err(), "the XRC SRQ holds its CQ");
    e1.destroy_qp(x.tgt.qpn).unwrap();
    assert!(matches!(e1.dealloc_xrcd(x.xrcd), Err(VerbsError::Busy(_))));
    e1.destroy_srq(x.srq).unwrap();
    e1.dealloc_xrcd(x.xrcd).unwrap();
    assert!(e1.dealloc_xrcd(x.xrcd).is_err());
    assert!(e1.create_xrc_tgt_qp(x.xrcd).is_err());
}

#[test]
fn the_kernels_modify_masks_for_xrc() {
    use QpState::*;
    let (req, _) = qp_attr::allowed_masks(QpType::XrcIni, Init, Rtr).unwrap();
    assert!(!req.contains(AttrMask::MAX_DEST_RD_ATOMIC) && !req.contains(AttrMask::MIN_RNR_TIMER));
    let (req, _) = qp_attr::allowed_masks(QpType::XrcTgt, Init, Rtr).unwrap();
    assert!(req.contains(AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER));
    let (req, _) = qp_attr::allowed_masks(QpType::XrcIni, Rtr, Rts).unwrap();
    assert!(req.contains(AttrMask::RETRY_CNT | AttrMask::MAX_QP_RD_ATOMIC));
    let (req, opt) = qp_attr::allowed_masks(QpType::XrcTgt, Rtr, Rts).unwrap();
    assert_eq!(req, AttrMask::SQ_PSN | AttrMask::TIMEOUT);
    assert!(opt.contains(AttrMask::MIN_RNR_TIMER));
    assert_eq!(QpType::from_ibv(9), Some(QpType::XrcIni));
    assert_eq!(QpType::from_ibv(10), Some(QpType::XrcTgt));
}
