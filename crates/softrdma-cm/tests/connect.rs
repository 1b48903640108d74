//! Connection establishment and rejection between two agents.

mod common;

use std::time::Duration;

use common::{Faults, Net};
use softrdma_cm::limits::Message;
use softrdma_cm::rdma_cm::{self, ConnParam, PortSpace};
use softrdma_cm::time::iba_time;
use softrdma_cm::{AcceptParams, ConnectParams, Event, QpState, RejReason, State};
use softrdma_wire::cm::attr;
use softrdma_wire::Psn;

const SERVICE: u64 = 0x0000_0000_0106_1D2F;
const ACTIVE: usize = 0;
const PASSIVE: usize = 1;

fn connect_params() -> ConnectParams {
    ConnectParams {
        service_id: SERVICE,
        qpn: 0x11_2233,
        starting_psn: Psn::new(0x00_4455),
        responder_resources: 4,
        initiator_depth: 2,
        retry_count: 6,
        rnr_retry_count: 5,
        path_mtu: 5,
        max_cm_retries: 3,
        private_data: b"active says hi".to_vec(),
        ..ConnectParams::default()
    }
}

fn accept_params() -> AcceptParams {
    AcceptParams {
        qpn: 0x66_7788,
        starting_psn: Psn::new(0x99_AABB),
        responder_resources: 2,
        initiator_depth: 4,
        rnr_retry_count: 3,
        private_data: b"passive says hi".to_vec(),
        ..AcceptParams::default()
    }
}

/// Two nodes, the passive one listening on SERVICE and accepting.
fn pair(seed: u64, faults: Faults) -> Net {
    let mut net = Net::new(2, seed, faults);
    net.agents[PASSIVE].listen(SERVICE).unwrap();
    net.consumers[PASSIVE].accept = Some(accept_params());
    net.consumers[PASSIVE].drep = true;
    net.consumers[ACTIVE].drep = true;
    net
}

fn established(net: &Net, n: usize) -> bool {
    net.find(n, |e| matches!(e, Event::Established { .. }))
        .is_some()
}

/// The REQ's resend interval for `connect_params()`:
/// 2 × packet lifetime + remote CM response timeout.
fn req_wait() -> Duration {
    let p = connect_params();
    2 * iba_time(p.packet_life_time) + iba_time(p.remote_cm_response_timeout)
}

#[test]
fn connect_accept_rtu_establishes_with_mirrored_qp_attributes() {
    let mut net = pair(1, Faults::default());
    let now = net.now;
    let a = net.agents[ACTIVE]
        .connect(now, PASSIVE as u8, &connect_params())
        .unwrap();
    assert!(
        net.run_until(Duration::from_secs(1), |n| established(n, ACTIVE)
            && established(n, PASSIVE))
    );
    let (_, req) = net
        .find(PASSIVE, |e| matches!(e, Event::ConnectRequest { .. }))
        .unwrap();
    let Event::ConnectRequest { conn: p, req, .. } = req else {
        unreachable!()
    };
    assert_eq!(&req.private_data[..14], b"active says hi");
    assert_eq!(net.agents[ACTIVE].state(a), Some(State::Established));
    assert_eq!(net.agents[PASSIVE].state(p), Some(State::Established));

    let act = |s| net.agents[ACTIVE].init_qp_attr(a, s).unwrap();
    let pas = |s| net.agents[PASSIVE].init_qp_attr(p, s).unwrap();
    let (ar, at, pr, pt) = (
        act(QpState::Rtr),
        act(QpState::Rts),
        pas(QpState::Rtr),
        pas(QpState::Rts),
    );
    // Each side's remote QPN and receive PSN are the other's QPN and send PSN.
    assert_eq!(ar.dest_qp_num, accept_params().qpn);
    assert_eq!(pr.dest_qp_num, connect_params().qpn);
    assert_eq!(ar.rq_psn, pt.sq_psn);
    assert_eq!(pr.rq_psn, at.sq_psn);
    // As Linux's CM: a Starting PSN is what its sender expects to receive.
    assert_eq!(ar.rq_psn, connect_params().starting_psn);
    assert_eq!(pr.rq_psn, accept_params().starting_psn);
    // READ/atomic depth: what one side keeps outstanding, the other serves.
    assert_eq!(at.max_rd_atomic, pr.max_dest_rd_atomic);
    assert_eq!(pt.max_rd_atomic, ar.max_dest_rd_atomic);
    assert_eq!(ar.path_mtu, 5);
    assert_eq!(pr.path_mtu, 5);
    // RNR retries: each uses the count the other asked for.
    assert_eq!(pt.rnr_retry, connect_params().rnr_retry_count);
    assert_eq!(at.rnr_retry, accept_params().rnr_retry_count);
    assert_eq!(pt.retry_cnt, connect_params().retry_count);
    assert_eq!(at.retry_cnt, connect_params().retry_count);
    // Local ACK timeout: 2 × lifetime (16) against ACK delay 15 → 17 on both.
    assert_eq!((at.timeout, pt.timeout), (17, 17));
    // The paths are each other's mirror.
    assert_eq!(ar.path.local_gid, pr.path.remote_gid);
    // One REQ, one REP, one RTU and nothing else.
    assert_eq!(net.sent_count(0, attr::REQ), 1);
    assert_eq!(net.sent_count(1, attr::REP), 1);
    assert_eq!(net.sent_count(0, attr::RTU), 1);
    assert_eq!(net.sent.len(), 3);
}

/// Connects with `p` (which holds the RTU: `confirm_rep`) and runs until
/// the REP has come; the active side's connection.
fn connect_until_rep(net: &mut Net, p: &ConnectParams) -> softrdma_cm::ConnId {
    let now = net.now;
    let a = net.agents[ACTIVE].connect(now, PASSIVE as u8, p).unwrap();
    assert!(net.run_until(Duration::from_secs(1), |n| n
        .find(ACTIVE, |e| matches!(e, Event::ConnectResponse { .. }))
        .is_some()));
    a
}

/// The REP the active side's ConnectResponse carried.
fn rep_of(net: &Net) -> softrdma_wire::cm::RepRepr {
    match net.find(ACTIVE, |e| matches!(e, Event::ConnectResponse { .. })) {
        Some((_, Event::ConnectResponse { rep, .. })) => *rep,
        other => panic!("no ConnectResponse: {other:?}"),
    }
}

#[test]
fn confirm_rep_holds_the_rtu_until_establish() {
    let mut net = pair(2, Faults::default());
    let p = ConnectParams {
        confirm_rep: true,
        ..connect_params()
    };
    let a = connect_until_rep(&mut net, &p);
    let rep = rep_of(&net);
    assert_eq!(&rep.private_data[..15], b"passive says hi");
    assert_eq!(net.agents[ACTIVE].state(a), Some(State::RepRcvd));
    assert_eq!(net.sent_count(0, attr::RTU), 0);
    net.agents[ACTIVE].establish(a).unwrap();
    assert!(net.run_until(Duration::from_secs(1), |n| established(n, PASSIVE)));
    assert_eq!(net.agents[ACTIVE].state(a), Some(State::Established));
}

/// XRC (IBTA annex A14, as the kernel's cm.c): the REQ says Extended
/// transport, type XRC, without the initiator's responder resources,
/// retry counts or SRQ bit; the REP carries the XRC target's QPN in its
/// Local EECN field (its Local QPN zero, SRQ set, no initiator depth), and
/// the initiator's RTR takes its destination QPN from there.
#[test]
fn xrc_request_and_reply_carry_the_target_qpn_in_the_eecn() {
    use softrdma_wire::cm::{TransportType, EXTENDED_XRC};
    let mut net = pair(30, Faults::default());
    let p = ConnectParams {
        transport: TransportType::Extended,
        confirm_rep: true,
        ..connect_params()
    };
    let a = connect_until_rep(&mut net, &p);
    let (_, Event::ConnectRequest { req, .. }) = net
        .find(PASSIVE, |e| matches!(e, Event::ConnectRequest { .. }))
        .unwrap()
    else {
        unreachable!()
    };
    assert!(req.is_xrc());
    assert_eq!(
        (req.transport, req.extended_transport),
        (TransportType::Extended, EXTENDED_XRC)
    );
    assert_eq!(req.local_qpn, connect_params().qpn);
    assert_eq!(
        (
            req.responder_resources,
            req.retry_count,
            req.rnr_retry_count,
            req.srq
        ),
        (0, 0, 0, false)
    );
    assert_eq!(req.initiator_depth, connect_params().initiator_depth);
    let rep = rep_of(&net);
    assert_eq!((rep.local_qpn, rep.local_eecn), (0, accept_params().qpn));
    assert!(rep.srq);
    assert_eq!(rep.initiator_depth, 0);
    let rtr = net.agents[ACTIVE].init_qp_attr(a, QpState::Rtr).unwrap();
    assert_eq!(rtr.dest_qp_num, accept_params().qpn);
    net.agents[ACTIVE].establish(a).unwrap();
    assert!(net.run_until(Duration::from_secs(1), |n| established(n, PASSIVE)));
}

/// A REQ with the Extended transport but an extended type other than XRC
/// is refused with reason 9 (invalid transport type).
#[test]
fn an_unknown_extended_transport_is_rejected() {
    use softrdma_wire::cm::TransportType;
    let mut net = pair(31, Faults::default());
    let p = ConnectParams {
        transport: TransportType::Extended,
        ..connect_params()
    };
    net.drop_all.push(attr::REQ);
    let now = net.now;
    net.agents[ACTIVE].connect(now, PASSIVE as u8, &p).unwrap();
    net.run_until(Duration::from_millis(1), |n| !n.captured.is_empty());
    // The REQ as sent, with extended type 2 (none is defined): the low
    // three bits of the class data's byte 51, after the 24-byte MAD header.
    let mut mad = net.captured[0];
    assert_eq!(u16::from_be_bytes([mad[16], mad[17]]), attr::REQ);
    assert_eq!(mad[24 + 51] & 0x07, 1);
    mad[24 + 51] = (mad[24 + 51] & 0xF8) | 2;
    let now = net.now;
    net.agents[PASSIVE].on_mad(now, ACTIVE as u8, &mad);
    assert!(net.run_until(Duration::from_secs(1), |n| n
        .find(ACTIVE, |e| matches!(e, Event::Rejected { .. }))
        .is_some()));
    let (_, Event::Rejected { reason, .. }) = net
        .find(ACTIVE, |e| matches!(e, Event::Rejected { .. }))
        .unwrap()
    else {
        unreachable!()
    };
    assert_eq!(reason, RejReason::InvalidTransportType);
    assert!(net
        .find(PASSIVE, |e| matches!(e, Event::ConnectRequest { .. }))
        .is_none());
}

#[test]
fn no_listener_is_rejected_with_invalid_service_id() {
    let mut net = pair(3, Faults::default());
    let p = ConnectParams {
        service_id: SERVICE + 1,
        ..connect_params()
    };
    let now = net.now;
    let a = net.agents[ACTIVE].connect(now, PASSIVE as u8, &p).unwrap();
    net.settle();
    let (_, e) = net
        .find(ACTIVE, |e| matches!(e, Event::Rejected { .. }))
        .unwrap();
    assert!(
        matches!(e, Event::Rejected { conn, reason: RejReason::InvalidServiceId, .. } if conn == a)
    );
    assert_eq!(RejReason::InvalidServiceId.code(), 8);
    assert_eq!(net.agents[ACTIVE].state(a), None);
    assert_eq!(net.agents[PASSIVE].conn_count(), 0);
}

#[test]
fn a_req_for_a_reserved_service_waits_for_the_listen() {
    // Bound but not listening yet (qperf hands its port to the peer
    // between rdma_bind_addr and rdma_listen): the REQ is held, not
    // rejected, and the listen takes it up.
    let mut net = pair(5, Faults::default());
    let late = SERVICE + 2;
    net.agents[PASSIVE].reserve(late);
    let p = ConnectParams {
        service_id: late,
        ..connect_params()
    };
    let now = net.now;
    net.agents[ACTIVE].connect(now, PASSIVE as u8, &p).unwrap();
    // The REQ arrives (and is resent once) well within the active side's
    // retries.
    let wait = iba_time(p.local_cm_response_timeout) + Duration::from_micros(10);
    net.run_until(wait, |_| false);
    assert_eq!(net.agents[PASSIVE].conn_count(), 0);
    let rejected = |net: &Net| {
        net.find(ACTIVE, |e| matches!(e, Event::Rejected { .. }))
            .is_some()
    };
    assert!(!rejected(&net));
    assert!(!established(&net, ACTIVE));
    net.agents[PASSIVE].listen(late).unwrap();
    net.settle();
    assert!(established(&net, ACTIVE) && established(&net, PASSIVE));
    assert!(!rejected(&net));

    // A reservation that ends without a listen rejects what it held.
    let mut net = pair(6, Faults::default());
    net.agents[PASSIVE].reserve(late);
    let now = net.now;
    net.agents[ACTIVE].connect(now, PASSIVE as u8, &p).unwrap();
    net.run_until(wait, |_| false);
    assert!(!rejected(&net));
    net.agents[PASSIVE].release(late);
    net.settle();
    let (_, e) = net
        .find(ACTIVE, |e| matches!(e, Event::Rejected { .. }))
        .unwrap();
    assert!(matches!(
        e,
        Event::Rejected {
            reason: RejReason::InvalidServiceId,
            ..
        }
    ));
}

#[test]
fn consumer_reject_delivers_reason_and_private_data() {
    let mut net = pair(4, Faults::default());
    net.consumers[PASSIVE].accept = None;
    let now = net.now;
    let a = net.agents[ACTIVE]
        .connect(now, PASSIVE as u8, &connect_params())
        .unwrap();
    assert!(net.run_until(Duration::from_secs(1), |n| n.count(PASSIVE, |_| true) == 1));
    let (_, Event::ConnectRequest { conn: p, .. }) = net.events[PASSIVE][0].clone() else {
        panic!("expected a ConnectRequest")
    };
    let pd: Vec<u8> = (0..148u8).map(|i| i ^ 0x5A).collect();
    let now = net.now;
    net.agents[PASSIVE]
        .reject(now, p, RejReason::ConsumerDefined, &pd)
        .unwrap();
    net.settle();
    let (
        _,
        Event::Rejected {
            conn,
            reason,
            private_data,
        },
    ) = net
        .find(ACTIVE, |e| matches!(e, Event::Rejected { .. }))
        .unwrap()
    else {
        unreachable!()
    };
    assert_eq!((conn, reason.code()), (a, 28));
    assert_eq!(private_data, pd);
    assert_eq!(
        net.agents[ACTIVE].conn_count() + net.agents[PASSIVE].conn_count(),
        0
    );
}

#[test]
fn private_data_over_the_limit_is_einval_and_sends_nothing() {
    let mut net = pair(5, Faults::default());
    let now = net.now;
    let big = ConnectParams {
        private_data: vec![1; 93],
        ..connect_params()
    };
    let e = net.agents[ACTIVE].connect(now, 1, &big).unwrap_err();
    assert_eq!(e.errno(), 22);
    // rdma_cm: 56 user bytes after the CMA header.
    let src = "10.0.0.1:5000".parse().unwrap();
    let dst = "10.0.0.2:7471".parse().unwrap();
    let cp = |n| ConnParam {
        private_data: vec![7; n],
        ..ConnParam::default()
    };
    let ps = PortSpace::Tcp;
    assert_eq!(
        rdma_cm::connect_params(ps, src, dst, 1, Psn::new(0), &cp(57))
            .unwrap_err()
            .errno(),
        22
    );
    let ok = rdma_cm::connect_params(ps, src, dst, 1, Psn::new(0), &cp(56)).unwrap();
    assert_eq!(ok.service_id, SERVICE);
    assert_eq!(ok.private_data.len(), 92);
    assert_eq!(net.agents[ACTIVE].poll_transmit(), None);

    // REP, REJ, DREQ limits on a live connection.
    net.consumers[PASSIVE].accept = None;
    let a = net.agents[ACTIVE]
        .connect(now, 1, &connect_params())
        .unwrap();
    assert!(net.run_until(Duration::from_secs(1), |n| n.count(PASSIVE, |_| true) == 1));
    let p = common::conn_of(&net.events[PASSIVE][0].1);
    let over = |m: Message| vec![0u8; m.user_len() + 1];
    let rep = AcceptParams {
        private_data: over(Message::Rep),
        ..accept_params()
    };
    let now = net.now;
    assert_eq!(
        net.agents[PASSIVE]
            .accept(now, p, &rep)
            .unwrap_err()
            .errno(),
        22
    );
    let rej = over(Message::Rej);
    let e = net.agents[PASSIVE].reject(now, p, RejReason::ConsumerDefined, &rej);
    assert_eq!(e.unwrap_err().errno(), 22);
    assert_eq!(net.agents[PASSIVE].state(p), Some(State::ReqRcvd));
    net.agents[PASSIVE]
        .accept(now, p, &accept_params())
        .unwrap();
    assert!(net.run_until(Duration::from_secs(1), |n| established(n, PASSIVE)));
    let dreq = over(Message::Dreq);
    let now = net.now;
    assert_eq!(
        net.agents[ACTIVE]
            .disconnect(now, a, &dreq)
            .unwrap_err()
            .errno(),
        22
    );
    assert_eq!(net.agents[ACTIVE].state(a), Some(State::Established));
}

#[test]
fn lost_req_is_resent_after_the_req_timeout() {
    let mut net = pair(6, Faults::default());
    net.drop_nth.push((attr::REQ, 0));
    let t0 = net.now;
    net.agents[ACTIVE]
        .connect(t0, 1, &connect_params())
        .unwrap();
    assert!(net.run_until(Duration::from_secs(60), |n| established(n, ACTIVE)));
    let reqs: Vec<_> = net.sent.iter().filter(|s| s.attr == attr::REQ).collect();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[1].at, t0 + req_wait());
    assert_eq!(
        net.count(PASSIVE, |e| matches!(e, Event::ConnectRequest { .. })),
        1
    );
}

#[test]
fn lost_rep_and_lost_rtu_still_establish_one_connection() {
    for lost in [attr::REP, attr::RTU] {
        let mut net = pair(7, Faults::default());
        net.drop_nth.push((lost, 0));
        let now = net.now;
        net.agents[ACTIVE]
            .connect(now, 1, &connect_params())
            .unwrap();
        assert!(
            net.run_until(Duration::from_secs(60), |n| established(n, ACTIVE)
                && established(n, PASSIVE))
        );
        assert_eq!(
            net.count(PASSIVE, |e| matches!(e, Event::ConnectRequest { .. })),
            1
        );
        assert_eq!(
            net.count(ACTIVE, |e| matches!(e, Event::Established { .. })),
            1
        );
        assert_eq!(net.agents[PASSIVE].conn_count(), 1);
        assert!(
            net.sent_count(1, attr::REP) >= 2,
            "REP resent after losing a {lost:#x}"
        );
    }
}

#[test]
fn every_req_lost_is_unreachable_after_all_retries() {
    let mut net = pair(8, Faults::default());
    net.drop_all.push(attr::REQ);
    let t0 = net.now;
    let a = net.agents[ACTIVE]
        .connect(t0, 1, &connect_params())
        .unwrap();
    net.settle();
    let (at, e) = net
        .find(ACTIVE, |e| matches!(e, Event::Unreachable { .. }))
        .unwrap();
    assert_eq!(e, Event::Unreachable { conn: a });
    // One send and max_cm_retries resends, each waited out.
    let tries = u32::from(connect_params().max_cm_retries) + 1;
    assert_eq!(at, t0 + req_wait() * tries);
    assert_eq!(net.sent_count(0, attr::REQ), tries as usize);
    assert_eq!(net.agents[ACTIVE].conn_count(), 0);
}

#[test]
fn every_rtu_lost_leaves_the_passive_side_unreachable_on_time() {
    let mut net = pair(9, Faults::default());
    net.drop_all.push(attr::RTU);
    let now = net.now;
    net.agents[ACTIVE]
        .connect(now, 1, &connect_params())
        .unwrap();
    net.settle();
    let (accepted, _) = net
        .find(PASSIVE, |e| matches!(e, Event::ConnectRequest { .. }))
        .unwrap();
    let (at, _) = net
        .find(PASSIVE, |e| matches!(e, Event::Unreachable { .. }))
        .unwrap();
    // The REP waits the REQ's local CM response timeout each time.
    let p = connect_params();
    let tries = u32::from(p.max_cm_retries) + 1;
    assert_eq!(at, accepted + iba_time(p.local_cm_response_timeout) * tries);
    assert!(established(&net, ACTIVE));
}

#[test]
fn duplicated_messages_make_one_connection() {
    let faults = Faults {
        duplicate: 1.0,
        jitter: Duration::from_micros(50),
        ..Faults::default()
    };
    let mut net = pair(10, faults);
    let now = net.now;
    net.agents[ACTIVE]
        .connect(now, 1, &connect_params())
        .unwrap();
    assert!(
        net.run_until(Duration::from_secs(1), |n| established(n, ACTIVE)
            && established(n, PASSIVE))
    );
    net.run_until(Duration::from_millis(10), |_| false);
    assert_eq!(
        net.count(PASSIVE, |e| matches!(e, Event::ConnectRequest { .. })),
        1
    );
    assert_eq!(
        net.count(PASSIVE, |e| matches!(e, Event::Established { .. })),
        1
    );
    assert_eq!(
        net.count(ACTIVE, |e| matches!(e, Event::Established { .. })),
        1
    );
    assert_eq!(net.agents[PASSIVE].conn_count(), 1);
    assert!(net.agents[PASSIVE].stats().duplicates >= 1);
    assert!(net.agents[ACTIVE].stats().duplicates >= 1);
}

#[test]
fn mra_extends_the_wait_past_the_req_retries() {
    let mut net = pair(11, Faults::default());
    net.consumers[PASSIVE].accept = None;
    let t0 = net.now;
    let a = net.agents[ACTIVE]
        .connect(t0, 1, &connect_params())
        .unwrap();
    assert!(net.run_until(Duration::from_secs(1), |n| n.count(PASSIVE, |_| true) == 1));
    let p = common::conn_of(&net.events[PASSIVE][0].1);
    // About 65 s: far beyond the REQ's 4 × 4.6 s.
    net.agents[PASSIVE].send_mra(p, 24).unwrap();
    assert!(net.run_until(Duration::from_secs(1), |n| n
        .find(ACTIVE, |e| matches!(e, Event::MraReceived { .. }))
        .is_some()));
    assert_eq!(net.agents[ACTIVE].state(a), Some(State::MraReqRcvd));
    let later = Duration::from_secs(40);
    assert!(!net.run_until(later, |n| n.count(ACTIVE, |_| true) > 1));
    assert_eq!(net.sent_count(0, attr::REQ), 1, "no REQ resent while MRA'd");
    let now = net.now;
    net.agents[PASSIVE]
        .accept(now, p, &accept_params())
        .unwrap();
    assert!(
        net.run_until(Duration::from_secs(1), |n| established(n, ACTIVE)
            && established(n, PASSIVE))
    );
}

#[test]
fn mra_then_silence_is_unreachable_after_the_extended_waits() {
    let mut net = pair(12, Faults::default());
    net.consumers[PASSIVE].accept = None;
    let now = net.now;
    net.agents[ACTIVE]
        .connect(now, 1, &connect_params())
        .unwrap();
    assert!(net.run_until(Duration::from_secs(1), |n| n.count(PASSIVE, |_| true) == 1));
    let p = common::conn_of(&net.events[PASSIVE][0].1);
    net.agents[PASSIVE].send_mra(p, 18).unwrap();
    net.drop_all.push(attr::REQ);
    net.settle();
    let (mra_at, _) = net
        .find(ACTIVE, |e| matches!(e, Event::MraReceived { .. }))
        .unwrap();
    let (at, _) = net
        .find(ACTIVE, |e| matches!(e, Event::Unreachable { .. }))
        .unwrap();
    // Each wait is now service timeout + ACK timeout (17), for the 1 + 3
    // sends still owed.
    let wait = iba_time(18) + iba_time(17);
    assert_eq!(at, mra_at + wait * 4);
}

#[test]
fn destroy_before_the_rep_rejects_with_timeout() {
    let mut net = pair(13, Faults::default());
    net.consumers[PASSIVE].accept = None;
    let now = net.now;
    let a = net.agents[ACTIVE]
        .connect(now, 1, &connect_params())
        .unwrap();
    assert!(net.run_until(Duration::from_secs(1), |n| n.count(PASSIVE, |_| true) == 1));
    let now = net.now;
    net.agents[ACTIVE].destroy(now, a).unwrap();
    net.settle();
    let (_, e) = net
        .find(PASSIVE, |e| matches!(e, Event::Rejected { .. }))
        .unwrap();
    assert!(matches!(
        e,
        Event::Rejected {
            reason: RejReason::Timeout,
            ..
        }
    ));
    assert_eq!(net.agents[PASSIVE].conn_count(), 0);
    assert!(net.events[ACTIVE].is_empty());
}

/// ECE through the exchange: the REQ's offer reaches the passive side
/// (`remote_ece` from the connection request on), the REP's answer the
/// active side, both on the wire where the kernel puts them; a REQ and
/// REP without ECE carry zeros (the bytes of before), so each side reads
/// zero; and a vendor ID wider than 24 bits is refused before anything
/// is sent.
#[test]
fn ece_offer_and_answer_travel_in_req_and_rep() {
    use softrdma_cm::Ece;
    use softrdma_wire::CmMad;
    let offer = Ece {
        vendor_id: 0x53_5201,
        options: 0b11,
    };
    let answer = Ece {
        vendor_id: 0x53_5201,
        options: 0b01,
    };
    let mut net = pair(21, Faults::default());
    net.consumers[PASSIVE].accept = None;
    let p = ConnectParams {
        ece: offer,
        ..connect_params()
    };
    let now = net.now;
    let a = net.agents[ACTIVE].connect(now, PASSIVE as u8, &p).unwrap();
    assert_eq!(net.agents[ACTIVE].remote_ece(a), Some(Ece::default()));
    assert!(net.run_until(Duration::from_secs(1), |n| n.count(PASSIVE, |_| true) == 1));
    let (_, Event::ConnectRequest { conn: pc, req, .. }) = net.events[PASSIVE][0].clone() else {
        panic!("expected a ConnectRequest")
    };
    assert_eq!(req.vendor_id, offer.vendor_id);
    assert_eq!(net.agents[PASSIVE].remote_ece(pc), Some(offer));
    let now = net.now;
    let ap = AcceptParams {
        ece: answer,
        ..accept_params()
    };
    net.agents[PASSIVE].accept(now, pc, &ap).unwrap();
    assert!(
        net.run_until(Duration::from_secs(1), |n| established(n, ACTIVE)
            && established(n, PASSIVE))
    );
    assert_eq!(net.agents[ACTIVE].remote_ece(a), Some(answer));
    let wire: Vec<_> = net
        .captured
        .iter()
        .filter_map(|m| CmMad::parse(m).unwrap().ece())
        .collect();
    assert_eq!(wire, [offer, answer], "the REQ's offer, the REP's answer");

    // Without ECE: zero both ways, and nothing in the bytes.
    let mut net = pair(22, Faults::default());
    let now = net.now;
    let a = net.agents[ACTIVE]
        .connect(now, PASSIVE as u8, &connect_params())
        .unwrap();
    assert!(
        net.run_until(Duration::from_secs(1), |n| established(n, ACTIVE)
            && established(n, PASSIVE))
    );
    assert_eq!(net.agents[ACTIVE].remote_ece(a), Some(Ece::default()));
    for m in &net.captured {
        let mad = CmMad::parse(m).unwrap();
        assert_eq!(mad.header.attribute_modifier, 0);
        assert!(mad.ece().is_none_or(|e| e == Ece::default()));
    }

    // A vendor ID the REQ cannot carry: EINVAL, nothing sent.
    let mut net = pair(23, Faults::default());
    let p = ConnectParams {
        ece: Ece {
            vendor_id: 1 << 24,
            options: 1,
        },
        ..connect_params()
    };
    let now = net.now;
    let e = net.agents[ACTIVE]
        .connect(now, PASSIVE as u8, &p)
        .unwrap_err();
    assert_eq!(e.errno(), 22);
    net.settle();
    assert!(net.sent.is_empty());
    assert_eq!(net.agents[ACTIVE].conn_count(), 0);
}

/// rdma_reject_ece's REJ: reason 35 (vendor option not supported) reaches
/// the active side as the kernel's rdma_cm reports it.
#[test]
fn reject_for_an_unsupported_vendor_option() {
    let mut net = pair(24, Faults::default());
    net.consumers[PASSIVE].accept = None;
    let now = net.now;
    let a = net.agents[ACTIVE]
        .connect(now, PASSIVE as u8, &connect_params())
        .unwrap();
    assert!(net.run_until(Duration::from_secs(1), |n| n.count(PASSIVE, |_| true) == 1));
    let (_, Event::ConnectRequest { conn: p, .. }) = net.events[PASSIVE][0].clone() else {
        panic!("expected a ConnectRequest")
    };
    let now = net.now;
    net.agents[PASSIVE]
        .reject(now, p, RejReason::VendorOptionNotSupported, b"no SR")
        .unwrap();
    net.settle();
    let (_, e) = net
        .find(ACTIVE, |e| matches!(e, Event::Rejected { .. }))
        .unwrap();
    let Event::Rejected {
        conn,
        reason,
        private_data,
    } = e
    else {
        unreachable!()
    };
    assert_eq!((conn, reason.code()), (a, 35));
    assert_eq!(&private_data[..5], b"no SR");
    assert_eq!(net.agents[ACTIVE].state(a), None);
}
