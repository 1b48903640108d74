//! Completion queue and asynchronous events (CQ overrun, solicited and
//! next-completion notification, SRQ limit, last WQE reached), and the
//! unreliable transports: UD's GRH and Q_Key, UC's silent loss.

mod common;
use std::sync::Arc;

use common::*;
use softrdma_engine::sim::{SimNet, Verdict};
use softrdma_engine::*;
use softrdma_wire::OpKind;

fn rc() -> (SimNet, Side, Side) {
    pair(31, net5(), QpType::Rc, &ConnOpts::default())
}

#[test]
fn cq_overrun_is_reported() {
    let (mut net, a, b) = rc();
    // A second, tiny CQ for a second QP on a.
    let e = &mut net.nodes[0];
    let small = e.create_cq(2).unwrap();
    let q = e
        .create_qp(QpInit {
            pd: a.pd,
            qp_type: QpType::Rc,
            send_cq: small,
            recv_cq: small,
            srq: None,
            cap: qp_cap(),
            sq_sig_all: true,
        })
        .unwrap();
    let a2 = Side {
        qpn: q,
        cq: small,
        ..clone_side(&a)
    };
    let b2 = Side {
        qpn: net.nodes[1]
            .create_qp(QpInit {
                pd: b.pd,
                qp_type: QpType::Rc,
                send_cq: b.cq,
                recv_cq: b.cq,
                srq: None,
                cap: qp_cap(),
                sq_sig_all: false,
            })
            .unwrap(),
        ..clone_side(&b)
    };
    let o = ConnOpts::default();
    bring_up(&mut net, &a2, &b2, o.psn_a, o.psn_b, &o, QpType::Rc);
    bring_up(&mut net, &b2, &a2, o.psn_b, o.psn_a, &o, QpType::Rc);
    // sq_sig_all: unsignaled WRs complete too.
    for i in 0..3 {
        post_ok(&mut net, &a2, unsignaled(write_wr(i, &a2, 0, 10, &b2, 0)));
    }
    settle(&mut net);
    assert!(net.nodes[0].cq_overrun(small));
    assert!(!net.nodes[0].cq_overrun(a.cq));
    assert_eq!(events(&mut net, 0), vec![Event::CqOverrun { cq: small }]);
    assert_eq!(net.nodes[0].counters().cq_overruns, 1);
    let mut out = Vec::new();
    net.nodes[0].poll_cq(small, 10, &mut out).unwrap();
    assert_eq!(
        statuses(&out),
        vec![(0, WcStatus::Success), (1, WcStatus::Success)]
    );
    // Reported once, not for every lost completion.
    post_ok(&mut net, &a2, write_wr(3, &a2, 0, 10, &b2, 0));
    post_ok(&mut net, &a2, write_wr(4, &a2, 0, 10, &b2, 0));
    post_ok(&mut net, &a2, write_wr(5, &a2, 0, 10, &b2, 0));
    settle(&mut net);
    assert!(events(&mut net, 0).is_empty());
    assert_eq!(net.nodes[0].counters().cq_overruns, 2);
}

fn clone_side(s: &Side) -> Side {
    Side {
        node: s.node,
        pd: s.pd,
        cq: s.cq,
        qpn: s.qpn,
        mem: s.mem.clone(),
        keys: s.keys,
        base: s.base,
    }
}

#[test]
fn solicited_only_notification() {
    let (mut net, a, b) = rc();
    for i in 0..4 {
        recv(&mut net, &b, 10 + i, 100 * i, 100);
    }
    net.nodes[1].req_notify_cq(b.cq, true).unwrap();
    // An unsolicited SEND completes without an event.
    post_ok(&mut net, &a, send_wr(1, &a, 0, 10));
    settle(&mut net);
    let r = poll(&mut net, &b);
    assert_eq!(statuses(&r), vec![(10, WcStatus::Success)]);
    assert!(!r[0].solicited);
    assert!(events(&mut net, 1).is_empty());
    // A solicited one raises it, and its completion says so.
    let wire = sniff(&mut net);
    post_ok(
        &mut net,
        &a,
        with_flags(send_wr(2, &a, 0, 10), SendFlags::SOLICITED),
    );
    settle(&mut net);
    assert!(sent_where(&wire, |p| p.from == 0 && p.is(OpKind::Send))[0].solicited);
    assert_eq!(events(&mut net, 1), vec![Event::Completion { cq: b.cq }]);
    let r = poll(&mut net, &b);
    assert!(r[0].solicited);
    // Armed once: the next solicited completion raises nothing until re-armed.
    post_ok(
        &mut net,
        &a,
        with_flags(send_wr(3, &a, 0, 10), SendFlags::SOLICITED),
    );
    settle(&mut net);
    assert!(events(&mut net, 1).is_empty());
    // Next-completion mode fires on any completion, sends included.
    poll(&mut net, &b);
    net.nodes[1].req_notify_cq(b.cq, false).unwrap();
    assert!(events(&mut net, 1).is_empty(), "an empty CQ arms quietly");
    assert_eq!(net.nodes[1].armed_cqs(), 1);
    post_ok(&mut net, &b, write_wr(9, &b, 0, 10, &a, 0));
    settle(&mut net);
    assert_eq!(events(&mut net, 1), vec![Event::Completion { cq: b.cq }]);
    assert_eq!(net.nodes[1].armed_cqs(), 0, "the event disarmed it");
}

#[test]
fn arming_a_cq_that_holds_a_completion_raises_the_event_at_once() {
    // A completion that landed between the program's last (empty) poll and
    // its arm: hardware arming at the consumer index raises the event at
    // once, so a program that then sleeps on its channel is woken.
    let (mut net, a, b) = rc();
    for i in 0..3 {
        recv(&mut net, &b, 10 + i, 100 * i, 100);
    }
    post_ok(&mut net, &a, send_wr(1, &a, 0, 10));
    settle(&mut net);
    assert!(events(&mut net, 1).is_empty(), "not armed: no event");
    net.nodes[1].req_notify_cq(b.cq, false).unwrap();
    assert_eq!(events(&mut net, 1), vec![Event::Completion { cq: b.cq }]);
    assert_eq!(net.nodes[1].armed_cqs(), 0, "raised, so not armed");
    assert_eq!(statuses(&poll(&mut net, &b)), vec![(10, WcStatus::Success)]);
    // Solicited-only arming counts only a solicited (or failed) completion
    // already there: an unsolicited one leaves the CQ armed.
    post_ok(&mut net, &a, send_wr(2, &a, 0, 10));
    settle(&mut net);
    net.nodes[1].req_notify_cq(b.cq, true).unwrap();
    assert!(events(&mut net, 1).is_empty());
    assert_eq!(net.nodes[1].armed_cqs(), 1);
    poll(&mut net, &b);
    net.nodes[1].req_notify_cq(b.cq, false).unwrap();
    net.nodes[1].req_notify_cq(b.cq, false).unwrap();
    assert_eq!(net.nodes[1].armed_cqs(), 1, "arming twice is one arm");
    post_ok(
        &mut net,
        &a,
        with_flags(send_wr(3, &a, 0, 10), SendFlags::SOLICITED),
    );
    settle(&mut net);
    assert_eq!(events(&mut net, 1), vec![Event::Completion { cq: b.cq }]);
    // Re-armed before the program polled the completion that woke it: that
    // completion raised its event already and raises no second one.
    net.nodes[1].req_notify_cq(b.cq, true).unwrap();
    assert!(events(&mut net, 1).is_empty(), "one event per completion");
    assert_eq!(net.nodes[1].armed_cqs(), 1);
    assert_eq!(statuses(&poll(&mut net, &b)), vec![(12, WcStatus::Success)]);
}

#[test]
fn destroying_an_armed_cq_disarms_it() {
    let (mut net, _a, _b) = rc();
    let e = &mut net.nodes[0];
    let cq = e.create_cq(4).unwrap();
    e.req_notify_cq(cq, false).unwrap();
    assert_eq!(e.armed_cqs(), 1);
    e.destroy_cq(cq).unwrap();
    assert_eq!(e.armed_cqs(), 0);
    assert!(e.req_notify_cq(cq, false).is_err());
}

#[test]
fn solicited_only_notification_fires_for_errors() {
    let (mut net, a, b) = rc();
    recv(&mut net, &b, 10, 0, 5);
    net.nodes[1].req_notify_cq(b.cq, true).unwrap();
    post_ok(&mut net, &a, send_wr(1, &a, 0, 10));
    settle(&mut net);
    assert_eq!(
        statuses(&poll(&mut net, &b)),
        vec![(10, WcStatus::LocLenErr)]
    );
    assert!(events(&mut net, 1).contains(&Event::Completion { cq: b.cq }));
}

#[test]
fn write_with_immediate_consumes_a_receive_and_can_be_solicited() {
    let (mut net, a, b) = rc();
    recv(&mut net, &b, 10, 0, 0); // no buffer needed
    net.nodes[1].req_notify_cq(b.cq, true).unwrap();
    a.mem.fill_from(0, &pattern(1, 3000));
    post_ok(
        &mut net,
        &a,
        with_flags(
            SendWr::new(
                1,
                SendOp::WriteWithImm {
                    remote_addr: b.base + 5000,
                    rkey: b.keys.rkey,
                    imm: 0xfeed,
                },
                vec![sge(&a, 0, 3000)],
            ),
            SendFlags::SOLICITED,
        ),
    );
    settle(&mut net);
    let r = poll(&mut net, &b);
    assert_eq!(statuses(&r), vec![(10, WcStatus::Success)]);
    assert_eq!(r[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!((r[0].imm_data, r[0].byte_len), (0xfeed, 3000));
    assert!(r[0].wc_flags.contains(WcFlags::WITH_IMM) && r[0].solicited);
    assert_eq!(mem(&b, 5000, 3000), pattern(1, 3000));
    assert_eq!(events(&mut net, 1), vec![Event::Completion { cq: b.cq }]);
}

/// b's QP takes its receives from an SRQ.
fn rc_with_srq(limit: u32) -> (SimNet, Side, Side, u32) {
    let mut net = SimNet::new(2, 32, net5());
    let a = make_side(&mut net, 0, QpType::Rc);
    let e = &mut net.nodes[1];
    let pd = e.alloc_pd();
    let cq = e.create_cq(64).unwrap();
    let srq = e
        .create_srq(
            pd,
            SrqInit {
                max_wr: 16,
                max_sge: 4,
                limit,
            },
        )
        .unwrap();
    let m = Arc::new(VecMemory::new(1 << 16));
    let keys = e.reg_mr(pd, 0x5000_0000, all_access(), m.clone()).unwrap();
    let qpn = e
        .create_qp(QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: Some(srq),
            cap: qp_cap(),
            sq_sig_all: false,
        })
        .unwrap();
    let b = Side {
        node: 1,
        pd,
        cq,
        qpn,
        mem: m,
        keys,
        base: 0x5000_0000,
    };
    let o = ConnOpts::default();
    bring_up(&mut net, &a, &b, o.psn_a, o.psn_b, &o, QpType::Rc);
    bring_up(&mut net, &b, &a, o.psn_b, o.psn_a, &o, QpType::Rc);
    (net, a, b, srq.raw())
}

fn srq_recv(net: &mut SimNet, b: &Side, srq: SrqHandle, wr_id: u64, off: u64) {
    net.nodes[1]
        .post_srq_recv(
            srq,
            &RecvWr {
                wr_id,
                sg_list: vec![sge(b, off, 100)],
            },
        )
        .unwrap();
}

#[test]
fn srq_limit_event_fires_once_below_the_limit() {
    let (mut net, a, b, srq) = rc_with_srq(3);
    for i in 0..5 {
        srq_recv(&mut net, &b, SrqHandle::from_raw(srq), 50 + i, 100 * i);
    }
    // 5 -> 4 -> 3: not below the limit yet.
    for i in 0..2 {
        post_ok(&mut net, &a, send_wr(i, &a, 0, 10));
    }
    settle(&mut net);
    assert_eq!(net.nodes[1].srq_len(SrqHandle::from_raw(srq)), 3);
    assert!(events(&mut net, 1).is_empty());
    // 3 -> 2: below; the event fires and the limit disarms.
    post_ok(&mut net, &a, send_wr(2, &a, 0, 10));
    settle(&mut net);
    assert_eq!(
        events(&mut net, 1),
        vec![Event::SrqLimitReached {
            srq: SrqHandle::from_raw(srq)
        }]
    );
    post_ok(&mut net, &a, send_wr(3, &a, 0, 10));
    settle(&mut net);
    assert!(events(&mut net, 1).is_empty(), "fires once per arming");
    // Re-armed (ibv_modify_srq) it fires again.
    assert!(
        net.nodes[1]
            .arm_srq_limit(SrqHandle::from_raw(srq), 17)
            .is_err(),
        "limit above max_wr"
    );
    net.nodes[1]
        .arm_srq_limit(SrqHandle::from_raw(srq), 2)
        .unwrap();
    post_ok(&mut net, &a, send_wr(4, &a, 0, 10));
    settle(&mut net);
    assert_eq!(
        events(&mut net, 1),
        vec![Event::SrqLimitReached {
            srq: SrqHandle::from_raw(srq)
        }]
    );
    assert_eq!(poll(&mut net, &b).len(), 5);
    // The SRQ is full at max_wr.
    for i in 0..16 {
        srq_recv(&mut net, &b, SrqHandle::from_raw(srq), 100 + i, 0);
    }
    let e = net.nodes[1]
        .post_srq_recv(
            SrqHandle::from_raw(srq),
            &RecvWr {
                wr_id: 1,
                sg_list: vec![],
            },
        )
        .unwrap_err();
    assert_eq!(e.errno(), errno::ENOMEM);
}

#[test]
fn an_srq_qp_in_error_reports_last_wqe_reached() {
    let (mut net, a, b, srq) = rc_with_srq(0);
    srq_recv(&mut net, &b, SrqHandle::from_raw(srq), 50, 0);
    srq_recv(&mut net, &b, SrqHandle::from_raw(srq), 51, 100);
    // A SEND that does not fit: b's QP fails.
    post_ok(&mut net, &a, send_wr(1, &a, 0, 200));
    settle(&mut net);
    assert_eq!(
        statuses(&poll(&mut net, &b)),
        vec![(50, WcStatus::LocLenErr)]
    );
    let ev = events(&mut net, 1);
    assert!(ev.contains(&Event::QpFatal { qpn: b.qpn }), "{ev:?}");
    assert!(ev.contains(&Event::LastWqeReached { qpn: b.qpn }), "{ev:?}");
    // The SRQ's other WQE is not flushed: it belongs to the SRQ.
    assert_eq!(net.nodes[1].srq_len(SrqHandle::from_raw(srq)), 1);
}

fn ud_pair(seed: u64) -> (SimNet, Side, Side, u32) {
    let mut net = SimNet::new(2, seed, net5());
    let a = make_side(&mut net, 0, QpType::Ud);
    let b = make_side(&mut net, 1, QpType::Ud);
    let o = ConnOpts::default();
    bring_up(&mut net, &a, &b, 1, 1, &o, QpType::Ud);
    bring_up(&mut net, &b, &a, 1, 1, &o, QpType::Ud);
    let ah = net.nodes[0].create_ah(a.pd, av_for(1)).unwrap();
    (net, a, b, ah.raw())
}

fn ud_send(
    wr_id: u64,
    a: &Side,
    len: u32,
    ah: AhHandle,
    qpn: Qpn,
    qkey: u32,
    op: SendOp,
) -> SendWr {
    let mut w = SendWr::new(wr_id, op, vec![sge(a, 0, len)]);
    w.ud = Some(UdDest {
        ah,
        remote_qpn: qpn,
        remote_qkey: qkey,
    });
    w
}

#[test]
fn ud_receives_carry_a_grh_in_front_of_the_payload() {
    let (mut net, a, b, ah) = ud_pair(33);
    a.mem.fill_from(0, &pattern(2, 1000));
    // The GRH straddles two SGEs: 10 bytes, then the rest.
    net.nodes[1]
        .post_recv(
            b.qpn,
            &RecvWr {
                wr_id: 7,
                sg_list: vec![sge(&b, 0, 10), sge(&b, 4096, 2000)],
            },
        )
        .unwrap();
    post_ok(
        &mut net,
        &a,
        ud_send(
            1,
            &a,
            1000,
            AhHandle::from_raw(ah),
            b.qpn,
            0x1111_2222,
            SendOp::SendWithImm { imm: 0xabc },
        ),
    );
    settle(&mut net);
    assert_eq!(statuses(&poll(&mut net, &a)), vec![(1, WcStatus::Success)]);
    let r = poll(&mut net, &b);
    assert_eq!(statuses(&r), vec![(7, WcStatus::Success)]);
    let wc = r[0];
    assert_eq!(wc.byte_len, 1000 + GRH_LEN as u32);
    assert!(wc.wc_flags.contains(WcFlags::GRH) && wc.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(wc.imm_data, 0xabc);
    assert_eq!(wc.src_qp, a.qpn);
    assert_eq!(
        wc.sgid,
        Gid::from_ip(softrdma_engine::sim::node_addr(0).ip())
    );
    assert_eq!(wc.opcode, WcOpcode::Recv);
    let mut grh = mem(&b, 0, 10);
    grh.extend(mem(&b, 4096, 30));
    // RoCEv2 over IPv4: 20 unused bytes, then the IPv4 header.
    let ip = &grh[20..40];
    assert_eq!(ip[0], 0x45);
    assert_eq!(ip[9], 17, "UDP");
    assert_eq!(ip[12..16], [127, 0, 10, 1], "source address");
    assert_eq!(ip[16..20], [127, 0, 10, 2], "destination address");
    assert_eq!(mem(&b, 4096 + 30, 1000), pattern(2, 1000));
}

#[test]
fn ud_qkey_mismatch_is_dropped() {
    let (mut net, a, b, ah) = ud_pair(34);
    recv(&mut net, &b, 7, 0, 200);
    post_ok(
        &mut net,
        &a,
        ud_send(
            1,
            &a,
            10,
            AhHandle::from_raw(ah),
            b.qpn,
            0x1111_2223,
            SendOp::Send,
        ),
    );
    settle(&mut net);
    // The sender cannot know: success.
    assert_eq!(statuses(&poll(&mut net, &a)), vec![(1, WcStatus::Success)]);
    assert!(poll(&mut net, &b).is_empty());
    assert_eq!(net.nodes[1].counters().qkey_violations, 1);
    assert_eq!(qp_counters(&net, &b).qkey_violations, 1);
    // The receive is still there; "use my own Q_Key" (high bit) needs a's
    // Q_Key to match, which it does.
    a.mem.fill_from(0, &pattern(3, 10));
    post_ok(
        &mut net,
        &a,
        ud_send(
            2,
            &a,
            10,
            AhHandle::from_raw(ah),
            b.qpn,
            0x8000_0000,
            SendOp::Send,
        ),
    );
    settle(&mut net);
    let r = poll(&mut net, &b);
    assert_eq!(statuses(&r), vec![(7, WcStatus::Success)]);
    assert_eq!(mem(&b, GRH_LEN, 10), pattern(3, 10));
}

#[test]
fn ud_without_a_receive_drops_silently() {
    let (mut net, a, b, ah) = ud_pair(35);
    post_ok(
        &mut net,
        &a,
        ud_send(
            1,
            &a,
            10,
            AhHandle::from_raw(ah),
            b.qpn,
            0x1111_2222,
            SendOp::Send,
        ),
    );
    settle(&mut net);
    assert_eq!(statuses(&poll(&mut net, &a)), vec![(1, WcStatus::Success)]);
    assert_eq!(qp_counters(&net, &b).dropped, 1);
    assert_eq!(net.nodes[1].qp_state(b.qpn), Some(QpState::Rts));
}

#[test]
fn uc_lost_packet_drops_the_message_silently() {
    let (mut net, a, b) = pair(36, net5(), QpType::Uc, &ConnOpts::default());
    recv(&mut net, &b, 7, 0, 8192);
    recv(&mut net, &b, 8, 8192, 8192);
    // Lose the 3rd packet of a 5-packet SEND.
    drop_nth(&mut net, 2, |p| p.from == 0 && p.is(OpKind::Send));
    a.mem.fill_from(0, &pattern(4, 5000));
    post_ok(&mut net, &a, send_wr(1, &a, 0, 5000));
    settle(&mut net);
    assert_eq!(statuses(&poll(&mut net, &a)), vec![(1, WcStatus::Success)]);
    assert!(
        poll(&mut net, &b).is_empty(),
        "a partial message is never delivered"
    );
    assert!(qp_counters(&net, &b).out_of_sequence >= 1);
    // The next message arrives whole, into the same (first) receive.
    a.mem.fill_from(0, &pattern(5, 3000));
    post_ok(
        &mut net,
        &a,
        SendWr::new(2, SendOp::SendWithImm { imm: 9 }, vec![sge(&a, 0, 3000)]),
    );
    settle(&mut net);
    let r = poll(&mut net, &b);
    assert_eq!(statuses(&r), vec![(7, WcStatus::Success)]);
    assert_eq!((r[0].byte_len, r[0].imm_data), (3000, 9));
    assert_eq!(mem(&b, 0, 3000), pattern(5, 3000));
}

#[test]
fn uc_lost_write_with_immediate_completes_nothing() {
    let (mut net, a, b) = pair(37, net5(), QpType::Uc, &ConnOpts::default());
    recv(&mut net, &b, 7, 0, 0);
    // The last packet (with the immediate) of a 3-packet WRITE is lost.
    drop_nth(&mut net, 2, |p| p.from == 0 && p.is(OpKind::Write));
    a.mem.fill_from(0, &pattern(6, 2100));
    post_ok(
        &mut net,
        &a,
        SendWr::new(
            1,
            SendOp::WriteWithImm {
                remote_addr: b.base + 10_000,
                rkey: b.keys.rkey,
                imm: 5,
            },
            vec![sge(&a, 0, 2100)],
        ),
    );
    settle(&mut net);
    assert!(poll(&mut net, &b).is_empty());
    // What arrived was placed (UC has no rollback); the rest is untouched.
    let got = mem(&b, 10_000, 2100);
    assert_eq!(got[..2048], pattern(6, 2100)[..2048]);
    assert!(got[2048..].iter().all(|&x| x == 0));
    // A whole one afterwards completes the receive.
    post_ok(
        &mut net,
        &a,
        SendWr::new(
            2,
            SendOp::WriteWithImm {
                remote_addr: b.base + 20_000,
                rkey: b.keys.rkey,
                imm: 6,
            },
            vec![sge(&a, 0, 2100)],
        ),
    );
    settle(&mut net);
    let r = poll(&mut net, &b);
    assert_eq!(statuses(&r), vec![(7, WcStatus::Success)]);
    assert_eq!((r[0].opcode, r[0].imm_data), (WcOpcode::RecvRdmaWithImm, 6));
    assert_eq!(mem(&b, 20_000, 2100), pattern(6, 2100));
}

#[test]
fn uc_send_without_a_receive_is_dropped_and_the_qp_lives_on() {
    let (mut net, a, b) = pair(38, net5(), QpType::Uc, &ConnOpts::default());
    post_ok(&mut net, &a, send_wr(1, &a, 0, 3000));
    settle(&mut net);
    assert!(poll(&mut net, &b).is_empty());
    assert_eq!(net.nodes[1].qp_state(b.qpn), Some(QpState::Rts));
    recv(&mut net, &b, 7, 0, 4000);
    a.mem.fill_from(0, &pattern(7, 3000));
    post_ok(&mut net, &a, send_wr(2, &a, 0, 3000));
    settle(&mut net);
    assert_eq!(statuses(&poll(&mut net, &b)), vec![(7, WcStatus::Success)]);
    assert_eq!(mem(&b, 0, 3000), pattern(7, 3000));
}

#[test]
fn corrupted_packets_are_caught_by_the_icrc() {
    let (mut net, a, b) = rc();
    // Flip one bit in every packet a sends, once each, by replaying a
    // corrupted copy ahead of the real one.
    let wire = tap(&mut net, |_| Verdict::Pass);
    a.mem.fill_from(0, &pattern(8, 4000));
    post_ok(&mut net, &a, write_wr(1, &a, 0, 4000, &b, 0));
    settle(&mut net);
    let pkts = sent_where(&wire, |p| p.from == 0);
    let before = net.nodes[1].counters().icrc_errors;
    for (i, p) in pkts.iter().enumerate() {
        // Every byte the ICRC covers (not BTH byte 4, nor the ICRC itself here).
        for byte in [0usize, 2, 5, 8, 11, 12, 20, p.bytes.len() - 5] {
            let mut bad = p.bytes.clone();
            bad[byte] ^= 1 << (i % 8);
            inject(&mut net, 1, p.ep, &bad);
        }
    }
    assert_eq!(
        net.nodes[1].counters().icrc_errors - before,
        8 * pkts.len() as u64
    );
    // BTH byte 4 (FECN/BECN/reserved) is outside the ICRC by design.
    let mut masked = pkts[0].bytes.clone();
    masked[4] ^= 0x80;
    inject(&mut net, 1, pkts[0].ep, &masked);
    assert_eq!(
        net.nodes[1].counters().icrc_errors - before,
        8 * pkts.len() as u64
    );
    settle(&mut net);
    assert_eq!(mem(&b, 0, 4000), pattern(8, 4000));
    assert_eq!(net.nodes[1].counters().malformed, 0);
}
