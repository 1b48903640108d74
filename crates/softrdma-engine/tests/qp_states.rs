//! The QP state machine through the engine: which modify_qp calls are
//! accepted and what the refusals say, which posts each state allows, and
//! what entering ERR, SQD, SQE and RESET does to outstanding work.

mod common;
use common::*;
use softrdma_engine::sim::NetConfig;
use softrdma_engine::*;
use softrdma_wire::{OpKind, Psn};

fn engine_with_qp(qp_type: QpType) -> (Engine, PdHandle, CqHandle, Qpn) {
    let mut e = Engine::new(EngineConfig::new(softrdma_engine::sim::node_addr(0)));
    let pd = e.alloc_pd();
    let cq = e.create_cq(64).unwrap();
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
    (e, pd, cq, qpn)
}

fn t0() -> Instant {
    Instant(1_000)
}

fn init_attr() -> (QpAttr, AttrMask) {
    (
        QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: all_access(),
            ..Default::default()
        },
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
}

fn rtr_attr() -> (QpAttr, AttrMask) {
    (
        QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: av_for(1),
            path_mtu: Mtu::Mtu1024,
            dest_qp_num: Qpn::from_raw(0x42),
            rq_psn: Psn::new(7),
            max_dest_rd_atomic: 4,
            min_rnr_timer: 12,
            ..Default::default()
        },
        AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER,
    )
}

fn rts_attr() -> (QpAttr, AttrMask) {
    (
        QpAttr {
            qp_state: QpState::Rts,
            sq_psn: Psn::new(9),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 4,
            ..Default::default()
        },
        AttrMask::STATE
            | AttrMask::SQ_PSN
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC,
    )
}

/// Expects a refusal with EINVAL whose message names every string in `names`.
fn refused(r: softrdma_engine::Result<()>, names: &[&str]) -> String {
    let e = r.expect_err("modify_qp must fail");
    assert_eq!(e.errno(), errno::EINVAL, "{e}");
    let msg = e.to_string();
    for n in names {
        assert!(msg.contains(n), "message {msg:?} does not name {n}");
    }
    msg
}

/// Leaving out any one of `required` from the transition `(attr, mask)`
/// is refused with a message naming it, and the QP stays in `state`.
fn each_required_is_named(
    e: &mut Engine,
    q: Qpn,
    (attr, mask): (&QpAttr, AttrMask),
    required: &[AttrMask],
    state: QpState,
) {
    for &missing in required {
        refused(
            e.modify_qp(t0(), q, attr, mask.difference(missing)),
            &[&format!("missing: {}", missing.names()[0])],
        );
        assert_eq!(e.qp_state(q), Some(state));
    }
}

#[test]
fn rc_walks_every_state_through_the_engine() {
    let (mut e, _, _, q) = engine_with_qp(QpType::Rc);
    assert_eq!(e.qp_state(q), Some(QpState::Reset));
    // RESET→INIT: each required attribute, when missing, is named.
    let (a, m) = init_attr();
    for missing in [AttrMask::PKEY_INDEX, AttrMask::PORT, AttrMask::ACCESS_FLAGS] {
        let msg = refused(
            e.modify_qp(t0(), q, &a, m.difference(missing)),
            &missing.names(),
        );
        assert!(msg.contains("RESET→INIT"), "{msg}");
        assert!(
            msg.contains(&format!("missing: {}", missing.names()[0])),
            "{msg}"
        );
        assert_eq!(
            e.qp_state(q),
            Some(QpState::Reset),
            "a refused modify changes nothing"
        );
    }
    // An attribute the transition does not take is named too.
    refused(
        e.modify_qp(t0(), q, &a, m | AttrMask::SQ_PSN),
        &["does not accept", "SQ_PSN"],
    );
    // Transitions that do not exist.
    for to in [QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Err] {
        let bad = QpAttr {
            qp_state: to,
            ..Default::default()
        };
        refused(
            e.modify_qp(t0(), q, &bad, AttrMask::STATE),
            &["not a valid transition"],
        );
    }
    e.modify_qp(t0(), q, &a, m).unwrap();
    assert_eq!(e.qp_state(q), Some(QpState::Init));
    // INIT→RTR
    let (a, m) = rtr_attr();
    each_required_is_named(
        &mut e,
        q,
        (&a, m),
        &[
            AttrMask::AV,
            AttrMask::PATH_MTU,
            AttrMask::DEST_QPN,
            AttrMask::RQ_PSN,
            AttrMask::MAX_DEST_RD_ATOMIC,
            AttrMask::MIN_RNR_TIMER,
        ],
        QpState::Init,
    );
    // A path MTU above the port's active MTU.
    let mut big = a;
    big.path_mtu = Mtu::Mtu4096;
    let mut e2 = {
        let mut c = EngineConfig::new(softrdma_engine::sim::node_addr(0));
        c.active_mtu = Mtu::Mtu1024;
        Engine::new(c)
    };
    let pd2 = e2.alloc_pd();
    let cq2 = e2.create_cq(4).unwrap();
    let q2 = e2
        .create_qp(QpInit {
            pd: pd2,
            qp_type: QpType::Rc,
            send_cq: cq2,
            recv_cq: cq2,
            srq: None,
            cap: qp_cap(),
            sq_sig_all: false,
        })
        .unwrap();
    let (ia, im) = init_attr();
    e2.modify_qp(t0(), q2, &ia, im).unwrap();
    refused(e2.modify_qp(t0(), q2, &big, m), &["PATH_MTU", "4096"]);
    e.modify_qp(t0(), q, &a, m).unwrap();
    assert_eq!(e.qp_state(q), Some(QpState::Rtr));
    // RTR→RTS
    let (a, m) = rts_attr();
    each_required_is_named(
        &mut e,
        q,
        (&a, m),
        &[
            AttrMask::SQ_PSN,
            AttrMask::TIMEOUT,
            AttrMask::RETRY_CNT,
            AttrMask::RNR_RETRY,
            AttrMask::MAX_QP_RD_ATOMIC,
        ],
        QpState::Rtr,
    );
    // Out-of-range values name the attribute.
    let mut bad = a;
    bad.retry_cnt = 8;
    refused(e.modify_qp(t0(), q, &bad, m), &["RETRY_CNT", "8"]);
    e.modify_qp(t0(), q, &a, m).unwrap();
    assert_eq!(e.qp_state(q), Some(QpState::Rts));
    let (qa, _) = e.query_qp(q).unwrap();
    assert_eq!(
        (qa.qp_state, qa.timeout, qa.retry_cnt),
        (QpState::Rts, 14, 7)
    );
    assert_eq!(qa.sq_psn, Psn::new(9));
    // RTS→SQD→RTS, then ERR, then RESET, then INIT again.
    let to = |s| QpAttr {
        qp_state: s,
        ..Default::default()
    };
    e.modify_qp(t0(), q, &to(QpState::Sqd), AttrMask::STATE)
        .unwrap();
    assert_eq!(e.qp_state(q), Some(QpState::Sqd));
    e.modify_qp(t0(), q, &to(QpState::Rts), AttrMask::STATE)
        .unwrap();
    assert_eq!(e.qp_state(q), Some(QpState::Rts));
    // RC never enters SQE, and there is no RTS→SQE.
    refused(
        e.modify_qp(t0(), q, &to(QpState::Sqe), AttrMask::STATE),
        &["not a valid transition"],
    );
    e.modify_qp(t0(), q, &to(QpState::Err), AttrMask::STATE)
        .unwrap();
    assert_eq!(e.qp_state(q), Some(QpState::Err));
    refused(
        e.modify_qp(t0(), q, &to(QpState::Rts), AttrMask::STATE),
        &["ERR→RTS", "not a valid transition"],
    );
    e.modify_qp(t0(), q, &to(QpState::Reset), AttrMask::STATE)
        .unwrap();
    assert_eq!(e.qp_state(q), Some(QpState::Reset));
    let (a, m) = init_attr();
    e.modify_qp(t0(), q, &a, m).unwrap();
    assert_eq!(e.qp_state(q), Some(QpState::Init));
    // CUR_STATE must match.
    let mut c = to(QpState::Init);
    c.cur_qp_state = QpState::Rtr;
    refused(
        e.modify_qp(t0(), q, &c, AttrMask::STATE | AttrMask::CUR_STATE),
        &["CUR_STATE"],
    );
}

#[test]
fn ud_needs_a_qkey_and_uc_no_rdma_limits() {
    let (mut e, _, _, q) = engine_with_qp(QpType::Ud);
    let a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey: 5,
        ..Default::default()
    };
    refused(
        e.modify_qp(
            t0(),
            q,
            &a,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT,
        ),
        &["missing: QKEY"],
    );
    refused(
        e.modify_qp(
            t0(),
            q,
            &a,
            AttrMask::STATE
                | AttrMask::PKEY_INDEX
                | AttrMask::PORT
                | AttrMask::QKEY
                | AttrMask::ACCESS_FLAGS,
        ),
        &["ACCESS_FLAGS"],
    );
    let (mut e, _, _, q) = engine_with_qp(QpType::Uc);
    let (a, m) = init_attr();
    e.modify_qp(t0(), q, &a, m).unwrap();
    let (a, m) = rtr_attr();
    // UC takes no read/atomic depth.
    refused(e.modify_qp(t0(), q, &a, m), &["MAX_DEST_RD_ATOMIC"]);
}

#[test]
fn posting_needs_the_right_state() {
    let (mut e, _, _, q) = engine_with_qp(QpType::Rc);
    let wr = SendWr::new(1, SendOp::Send, vec![]);
    let rwr = RecvWr {
        wr_id: 2,
        sg_list: vec![],
    };
    let check = |r: softrdma_engine::Result<()>, state: &str| {
        let err = r.expect_err("must be refused");
        assert_eq!(err.errno(), errno::EINVAL);
        assert!(err.to_string().contains(state), "{err}");
    };
    // RESET: neither sends nor receives.
    check(e.post_send(t0(), q, &wr), "RESET");
    check(e.post_recv(q, &rwr), "RESET");
    let (a, m) = init_attr();
    e.modify_qp(t0(), q, &a, m).unwrap();
    // INIT: receives only.
    check(e.post_send(t0(), q, &wr), "INIT");
    e.post_recv(q, &rwr).unwrap();
    let (a, m) = rtr_attr();
    e.modify_qp(t0(), q, &a, m).unwrap();
    // RTR: still receives only.
    check(e.post_send(t0(), q, &wr), "RTR");
    e.post_recv(q, &rwr).unwrap();
    let (a, m) = rts_attr();
    e.modify_qp(t0(), q, &a, m).unwrap();
    e.post_send(t0(), q, &wr).unwrap();
}

#[test]
fn receives_posted_in_init_are_used_later() {
    let mut net = softrdma_engine::sim::SimNet::new(2, 3, net5());
    let a = make_side(&mut net, 0, QpType::Rc);
    let b = make_side(&mut net, 1, QpType::Rc);
    let o = ConnOpts::default();
    // b gets its receive while still in INIT.
    let (ia, im) = init_attr();
    let now = net.now;
    net.nodes[1].modify_qp(now, b.qpn, &ia, im).unwrap();
    recv(&mut net, &b, 50, 0, 100);
    // Now finish bringing b up (RESET→INIT again is not needed: INIT→INIT).
    let mut a_init = ia;
    a_init.qp_state = QpState::Init;
    net.nodes[1]
        .modify_qp(now, b.qpn, &a_init, AttrMask::STATE)
        .unwrap();
    bring_up(&mut net, &a, &b, o.psn_a, o.psn_b, &o, QpType::Rc);
    // b: INIT→RTR→RTS by hand (bring_up starts from RESET).
    let (mut r, rm) = rtr_attr();
    r.ah_attr = av_for(0);
    r.dest_qp_num = a.qpn;
    r.rq_psn = Psn::new(o.psn_a);
    net.nodes[1].modify_qp(now, b.qpn, &r, rm).unwrap();
    let (mut s, sm) = rts_attr();
    s.sq_psn = Psn::new(o.psn_b);
    net.nodes[1].modify_qp(now, b.qpn, &s, sm).unwrap();
    a.mem.fill_from(0, &pattern(1, 60));
    post_ok(&mut net, &a, send_wr(1, &a, 0, 60));
    let w = wait_wcs(&mut net, &b, 1, LONG);
    assert_eq!(statuses(&w), vec![(50, WcStatus::Success)]);
    assert_eq!(mem(&b, 0, 60), pattern(1, 60));
}

#[test]
fn entering_err_flushes_everything_in_order() {
    let (mut net, a, b) = pair(4, net5(), QpType::Rc, &ConnOpts::default());
    // Nothing gets through: the sends stay outstanding.
    net.set_partition(0, 1, true);
    post_ok(&mut net, &a, write_wr(1, &a, 0, 3000, &b, 0));
    post_ok(&mut net, &a, unsignaled(write_wr(2, &a, 0, 10, &b, 0)));
    post_ok(&mut net, &a, send_wr(3, &a, 0, 10));
    post_ok(&mut net, &a, unsignaled(read_wr(4, &a, 100, 10, &b, 0)));
    recv(&mut net, &a, 10, 500, 10);
    recv(&mut net, &a, 11, 600, 10);
    run_for(&mut net, std::time::Duration::from_millis(1));
    assert!(poll(&mut net, &a).is_empty());
    let now = net.now;
    net.nodes[0]
        .modify_qp(
            now,
            a.qpn,
            &QpAttr {
                qp_state: QpState::Err,
                ..Default::default()
            },
            AttrMask::STATE,
        )
        .unwrap();
    assert_eq!(net.nodes[0].qp_state(a.qpn), Some(QpState::Err));
    let wcs = poll(&mut net, &a);
    // Unsignaled WRs get a completion too when they are flushed.
    assert_eq!(
        statuses(&wcs),
        vec![
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr),
            (4, WcStatus::WrFlushErr),
            (10, WcStatus::WrFlushErr),
            (11, WcStatus::WrFlushErr),
        ]
    );
    assert_eq!(wcs[4].opcode, WcOpcode::Recv);
    // The application's own move to ERR is not an asynchronous error.
    assert!(!events(&mut net, 0).contains(&Event::QpFatal { qpn: a.qpn }));
    // Posting in ERR is accepted and flushed at once.
    post_ok(&mut net, &a, unsignaled(send_wr(5, &a, 0, 10)));
    recv(&mut net, &a, 12, 0, 10);
    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![(5, WcStatus::WrFlushErr), (12, WcStatus::WrFlushErr)]
    );
    // Nothing was sent after the flush, and the timer is gone.
    net.set_partition(0, 1, false);
    let wire = sniff(&mut net);
    settle(&mut net);
    assert!(
        sent_where(&wire, |p| p.from == 0).is_empty(),
        "a QP in ERR sent {:?}",
        wire.borrow()
    );
    assert!(mem(&b, 0, 10).iter().all(|&x| x == 0));
}

#[test]
fn sqd_drains_started_work_then_resumes() {
    // A window of 4 packets: the first WRITE (8 packets) is still going
    // when the QP moves to SQD; the second has not started.
    let (mut net, a, b) = pair_cfg(5, net5(), QpType::Rc, &ConnOpts::default(), |c| {
        c.max_inflight = 4
    });
    let wire = sniff(&mut net);
    a.mem.fill_from(0, &pattern(3, 8192));
    post_ok(&mut net, &a, write_wr(1, &a, 0, 8192, &b, 0));
    post_ok(&mut net, &a, write_wr(2, &a, 0, 100, &b, 20_000));
    net.step(); // the first 4 packets leave
    assert_eq!(sent_where(&wire, |p| p.from == 0).len(), 4);
    let now = net.now;
    net.nodes[0]
        .modify_qp(
            now,
            a.qpn,
            &QpAttr {
                qp_state: QpState::Sqd,
                en_sqd_async_notify: true,
                ..Default::default()
            },
            AttrMask::STATE | AttrMask::EN_SQD_ASYNC_NOTIFY,
        )
        .unwrap();
    assert!(net.nodes[0].query_qp(a.qpn).unwrap().0.sq_draining);
    assert!(events(&mut net, 0).is_empty(), "drained too early");
    // Posting in SQD is allowed; the WR waits.
    post_ok(&mut net, &a, write_wr(3, &a, 0, 100, &b, 30_000));
    settle(&mut net);
    assert_eq!(statuses(&poll(&mut net, &a)), vec![(1, WcStatus::Success)]);
    assert_eq!(mem(&b, 0, 8192), pattern(3, 8192));
    assert_eq!(events(&mut net, 0), vec![Event::SqDrained { qpn: a.qpn }]);
    // Only the first WRITE's 8 packets went out.
    let writes = sent_where(&wire, |p| p.from == 0 && p.is(OpKind::Write));
    assert_eq!(writes.len(), 8, "{writes:?}");
    assert!(writes.iter().all(|p| p.reth.is_none_or(|r| r.va == b.base)));
    assert!(!net.nodes[0].query_qp(a.qpn).unwrap().0.sq_draining);
    // Back to RTS: the rest goes.
    let now = net.now;
    net.nodes[0]
        .modify_qp(
            now,
            a.qpn,
            &QpAttr {
                qp_state: QpState::Rts,
                ..Default::default()
            },
            AttrMask::STATE,
        )
        .unwrap();
    let wcs = wait_wcs(&mut net, &a, 2, LONG);
    assert_eq!(
        statuses(&wcs),
        vec![(2, WcStatus::Success), (3, WcStatus::Success)]
    );
    assert_eq!(mem(&b, 20_000, 100), pattern(3, 100));
}

#[test]
fn sqd_with_nothing_in_flight_drains_at_once() {
    let (mut net, a, _b) = pair(6, net5(), QpType::Rc, &ConnOpts::default());
    let now = net.now;
    net.nodes[0]
        .modify_qp(
            now,
            a.qpn,
            &QpAttr {
                qp_state: QpState::Sqd,
                en_sqd_async_notify: true,
                ..Default::default()
            },
            AttrMask::STATE | AttrMask::EN_SQD_ASYNC_NOTIFY,
        )
        .unwrap();
    assert_eq!(events(&mut net, 0), vec![Event::SqDrained { qpn: a.qpn }]);
}

fn to_rts(net: &mut softrdma_engine::sim::SimNet, s: &Side) {
    let now = net.now;
    net.nodes[s.node]
        .modify_qp(
            now,
            s.qpn,
            &QpAttr {
                qp_state: QpState::Rts,
                ..Default::default()
            },
            AttrMask::STATE,
        )
        .unwrap();
}

#[test]
fn uc_send_error_goes_to_sqe_and_back() {
    let (mut net, a, b) = pair(7, net5(), QpType::Uc, &ConnOpts::default());
    // A bad lkey: local protection error, the send queue stops (SQE).
    let mut bad = send_wr(1, &a, 0, 10);
    bad.sg_list[0].lkey = Lkey::from_raw(bad.sg_list[0].lkey.raw() ^ 0x55);
    post_ok(&mut net, &a, bad);
    post_ok(&mut net, &a, unsignaled(send_wr(2, &a, 0, 10)));
    settle(&mut net);
    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(net.nodes[0].qp_state(a.qpn), Some(QpState::Sqe));
    // Sends posted in SQE are flushed at once.
    post_ok(&mut net, &a, send_wr(3, &a, 0, 10));
    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![(3, WcStatus::WrFlushErr)]
    );
    // The receive side still works in SQE.
    recv(&mut net, &a, 70, 1000, 100);
    b.mem.fill_from(0, &pattern(9, 33));
    post_ok(&mut net, &b, send_wr(8, &b, 0, 33));
    settle(&mut net);
    let w = poll(&mut net, &a);
    assert_eq!(statuses(&w), vec![(70, WcStatus::Success)]);
    assert_eq!(mem(&a, 1000, 33), pattern(9, 33));
    // SQE→RTS: sending works again.
    to_rts(&mut net, &a);
    recv(&mut net, &b, 71, 2000, 100);
    a.mem.fill_from(0, &pattern(4, 20));
    post_ok(&mut net, &a, send_wr(4, &a, 0, 20));
    settle(&mut net);
    assert_eq!(statuses(&poll(&mut net, &a)), vec![(4, WcStatus::Success)]);
    let w = poll(&mut net, &b);
    assert_eq!(
        statuses(&w),
        vec![(8, WcStatus::Success), (71, WcStatus::Success)]
    );
    assert_eq!(mem(&b, 2000, 20), pattern(4, 20));
}

#[test]
fn reset_discards_everything_and_the_qp_can_start_over() {
    let (mut net, a, b) = pair(8, net5(), QpType::Rc, &ConnOpts::default());
    net.set_partition(0, 1, true);
    post_ok(&mut net, &a, write_wr(1, &a, 0, 100, &b, 0));
    recv(&mut net, &a, 2, 0, 10);
    run_for(&mut net, std::time::Duration::from_millis(1));
    for s in [&a, &b] {
        let now = net.now;
        net.nodes[s.node]
            .modify_qp(
                now,
                s.qpn,
                &QpAttr {
                    qp_state: QpState::Reset,
                    ..Default::default()
                },
                AttrMask::STATE,
            )
            .unwrap();
    }
    // No completions: RESET discards.
    assert!(poll(&mut net, &a).is_empty());
    assert_eq!(net.nodes[0].qp_state(a.qpn), Some(QpState::Reset));
    assert!(net.nodes[0]
        .post_recv(
            a.qpn,
            &RecvWr {
                wr_id: 3,
                sg_list: vec![]
            }
        )
        .is_err());
    // The old retransmission timer is gone.
    net.set_partition(0, 1, false);
    let wire = sniff(&mut net);
    settle(&mut net);
    assert!(sent_where(&wire, |_| true).is_empty());
    // Bring both up again with fresh PSNs: it works.
    let o = ConnOpts {
        psn_a: 0x500,
        psn_b: 0x600,
        ..Default::default()
    };
    bring_up(&mut net, &a, &b, o.psn_a, o.psn_b, &o, QpType::Rc);
    bring_up(&mut net, &b, &a, o.psn_b, o.psn_a, &o, QpType::Rc);
    a.mem.fill_from(0, &pattern(5, 100));
    post_ok(&mut net, &a, write_wr(4, &a, 0, 100, &b, 0));
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(4, WcStatus::Success)]);
    assert_eq!(mem(&b, 0, 100), pattern(5, 100));
    assert_eq!(
        sent_where(&wire, |p| p.from == 0)[0].psn,
        0x500,
        "the new SQ_PSN is used"
    );
}

#[test]
fn ud_error_goes_to_sqe() {
    let mut net = softrdma_engine::sim::SimNet::new(2, 9, NetConfig::perfect());
    let a = make_side(&mut net, 0, QpType::Ud);
    let b = make_side(&mut net, 1, QpType::Ud);
    let o = ConnOpts::default();
    bring_up(&mut net, &a, &b, 1, 1, &o, QpType::Ud);
    bring_up(&mut net, &b, &a, 1, 1, &o, QpType::Ud);
    let ah = net.nodes[0].create_ah(a.pd, av_for(1)).unwrap();
    let ud = |wr_id, len| {
        let mut w = send_wr(wr_id, &a, 0, len);
        w.ud = Some(UdDest {
            ah,
            remote_qpn: b.qpn,
            remote_qkey: 0x1111_2222,
        });
        w
    };
    post_ok(&mut net, &a, ud(1, 5000));
    settle(&mut net);
    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![(1, WcStatus::LocLenErr)]
    );
    assert_eq!(net.nodes[0].qp_state(a.qpn), Some(QpState::Sqe));
    post_ok(&mut net, &a, ud(2, 10));
    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![(2, WcStatus::WrFlushErr)]
    );
    to_rts(&mut net, &a);
    recv(&mut net, &b, 9, 0, 100);
    post_ok(&mut net, &a, ud(3, 10));
    settle(&mut net);
    assert_eq!(statuses(&poll(&mut net, &a)), vec![(3, WcStatus::Success)]);
    assert_eq!(statuses(&poll(&mut net, &b)), vec![(9, WcStatus::Success)]);
}
