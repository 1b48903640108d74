//! The IB CM between two devices in one process, over UDP loopback and the
//! same-host transport: a listener, a connect, an accept, and the QPs the
//! CM moved carry a SEND and a WRITE; a connect to a port nobody listens on
//! is rejected as an invalid service; a disconnect reaches both sides and
//! ends in timewait exit; private data over the limit is EINVAL.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use softrdma::rdma_cm::{Cm, CmEvent, ConnId, ConnParam, PortSpace, RejReason};
use softrdma::*;

const T: Duration = Duration::from_secs(20);
const PORT: u16 = 7471;

fn device(t: softrdma::shm::Transport) -> Context {
    let mut c = DeviceConfig::default_loopback().transport(t);
    c.capture = None;
    c.fault = None;
    Context::open_with(&c).unwrap()
}

/// The next event of `cm` that `want` takes, within T (others are kept
/// out of the way: the test names what it waits for).
fn wait_for(cm: &Cm, want: impl Fn(&CmEvent<SocketAddr>) -> bool) -> CmEvent<SocketAddr> {
    let end = Instant::now() + T;
    let mut seen = Vec::new();
    while Instant::now() < end {
        if let Some(ev) = cm.get_event(Duration::from_millis(50)).unwrap() {
            if want(&ev) {
                return ev;
            }
            seen.push(ev);
        }
    }
    panic!("no such event within {T:?}; saw {seen:?}");
}

struct Side {
    ctx: Context,
    cq: Cq,
    mr: Mr,
    qp: Qp,
}

fn side(ctx: Context) -> Side {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = pd.alloc_mr(1 << 16, access).unwrap();
    let qp = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    Side { ctx, cq, mr, qp }
}

/// Connects `a` to `b` (listening on PORT) through the CM; returns both
/// connection IDs.
fn connect(a: &Side, b: &Side) -> (ConnId, ConnId) {
    let (cma, cmb) = (a.ctx.cm(), b.ctx.cm());
    cmb.listen(PortSpace::Tcp, PORT).unwrap();
    let dst = SocketAddr::new(b.ctx.addr().ip(), PORT);
    let p = ConnParam {
        private_data: b"hello from a".to_vec(),
        ..ConnParam::default()
    };
    let ca = cma.connect(&a.qp, dst, &p).unwrap();
    let CmEvent::ConnectRequest { conn: cb, req, .. } =
        wait_for(&cmb, |e| matches!(e, CmEvent::ConnectRequest { .. }))
    else {
        unreachable!()
    };
    let (h, user) = softrdma_cm::rdma_cm::parse_req_private_data(&req.private_data).unwrap();
    assert_eq!(
        h.src,
        a.ctx.addr().ip(),
        "the CMA header names the active side"
    );
    assert_eq!(&user[..12], b"hello from a");
    assert_eq!(req.local_qpn, a.qp.qpn().raw());
    cmb.accept(cb, &b.qp, &ConnParam::default()).unwrap();
    let est = |c: ConnId| move |e: &CmEvent<SocketAddr>| matches!(e, CmEvent::Established { conn } if *conn == c);
    wait_for(&cma, est(ca));
    wait_for(&cmb, est(cb));
    assert_eq!((a.qp.state(), b.qp.state()), (QpState::Rts, QpState::Rts));
    (ca, cb)
}

fn exchange_data(a: &Side, b: &Side) {
    b.qp.post_recv(&RecvWr {
        wr_id: 7,
        sg_list: vec![b.mr.sge(0, 4096)],
    })
    .unwrap();
    a.mr.write(0, b"over the CM's QPs").unwrap();
    a.qp.post_send(&SendWr::new(1, SendOp::Send, vec![a.mr.sge(0, 17)]))
        .unwrap();
    let r = b.cq.wait_ok(T).unwrap();
    assert_eq!((r.wr_id, r.byte_len), (7, 17));
    let mut got = [0u8; 17];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"over the CM's QPs");
    a.cq.wait_ok(T).unwrap();
    let rb = b.mr.remote();
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 13 + 1) as u8).collect();
    a.mr.write(8192, &data).unwrap();
    let op = SendOp::Write {
        remote_addr: rb.at(20_000),
        rkey: rb.rkey,
    };
    a.qp.post_send(&SendWr::new(2, op, vec![a.mr.sge(8192, 3000)]))
        .unwrap();
    a.cq.wait_ok(T).unwrap();
    let mut back = vec![0u8; 3000];
    b.mr.read(20_000, &mut back).unwrap();
    assert!(back == data, "WRITE data intact");
}

fn connect_exchange_disconnect(t: softrdma::shm::Transport) {
    let (a, b) = (side(device(t)), side(device(t)));
    let (ca, cb) = connect(&a, &b);
    exchange_data(&a, &b);
    a.ctx.cm().disconnect(ca, b"bye").unwrap();
    let gone = |c: ConnId| move |e: &CmEvent<SocketAddr>| matches!(e, CmEvent::Disconnected { conn, .. } if *conn == c);
    wait_for(&b.ctx.cm(), gone(cb));
    b.ctx.cm().disconnect(cb, b"").unwrap();
    wait_for(&a.ctx.cm(), gone(ca));
    let left = |c: ConnId| move |e: &CmEvent<SocketAddr>| matches!(e, CmEvent::TimewaitExit { conn } if *conn == c);
    wait_for(&a.ctx.cm(), left(ca));
}

#[test]
fn connect_exchange_and_disconnect_over_udp() {
    connect_exchange_disconnect(softrdma::shm::Transport::Udp);
}

#[test]
fn connect_exchange_and_disconnect_on_the_same_host() {
    connect_exchange_disconnect(softrdma::shm::Transport::Shm);
}

#[test]
fn a_port_nobody_listens_on_is_rejected_as_an_invalid_service() {
    let (a, b) = (
        side(device(softrdma::shm::Transport::Udp)),
        side(device(softrdma::shm::Transport::Udp)),
    );
    let cm = a.ctx.cm();
    let dst = SocketAddr::new(b.ctx.addr().ip(), PORT + 1);
    let c = cm.connect(&a.qp, dst, &ConnParam::default()).unwrap();
    match wait_for(&cm, |e| matches!(e, CmEvent::Rejected { .. })) {
        CmEvent::Rejected { conn, reason, .. } => {
            assert_eq!(conn, c);
            assert_eq!(reason, RejReason::InvalidServiceId);
        }
        _ => unreachable!(),
    }
}

#[test]
fn private_data_over_the_limit_is_einval() {
    let (a, b) = (
        side(device(softrdma::shm::Transport::Udp)),
        side(device(softrdma::shm::Transport::Udp)),
    );
    let dst = SocketAddr::new(b.ctx.addr().ip(), PORT);
    let p = ConnParam {
        private_data: vec![1; 57],
        ..ConnParam::default()
    };
    let e = a.ctx.cm().connect(&a.qp, dst, &p).unwrap_err();
    assert_eq!(e.errno(), 22, "{e}");
    assert_eq!(a.qp.state(), QpState::Reset, "nothing happened to the QP");
}

/// Fast CM retries: each REQ/DREQ waits ~0.6 s (twice the path's packet
/// lifetime, 268 ms, plus the 67 ms response timeout), sent 3 times.
fn quick() -> ConnParam {
    ConnParam {
        cm_response_timeout: 14,
        max_cm_retries: 2,
        ..ConnParam::default()
    }
}

#[test]
fn an_address_nobody_answers_at_is_unreachable_within_the_configured_time() {
    let a = side(device(softrdma::shm::Transport::Udp));
    let cm = a.ctx.cm();
    // A loopback address with no device: the REQs go nowhere.
    let dst: SocketAddr = "127.0.0.251:7471".parse().unwrap();
    let start = Instant::now();
    let c = cm.connect(&a.qp, dst, &quick()).unwrap();
    let ev = wait_for(&cm, |e| matches!(e, CmEvent::Unreachable { .. }));
    let took = start.elapsed();
    assert!(matches!(ev, CmEvent::Unreachable { conn } if conn == c));
    // Three sends ~0.6 s apart: not before the last wait ran out, and
    // well within what a loaded machine adds.
    assert!(
        took >= Duration::from_millis(1500),
        "gave up after {took:?}"
    );
    assert!(
        took < Duration::from_secs(15),
        "gave up only after {took:?}"
    );
}

#[test]
fn a_peer_gone_mid_connection_still_ends_in_disconnected_without_a_hang() {
    let a = side(device(softrdma::shm::Transport::Udp));
    let b = side(device(softrdma::shm::Transport::Udp));
    let (cma, cmb) = (a.ctx.cm(), b.ctx.cm());
    cmb.listen(PortSpace::Tcp, PORT + 2).unwrap();
    let dst = SocketAddr::new(b.ctx.addr().ip(), PORT + 2);
    let ca = cma.connect(&a.qp, dst, &quick()).unwrap();
    let CmEvent::ConnectRequest { conn: cb, .. } =
        wait_for(&cmb, |e| matches!(e, CmEvent::ConnectRequest { .. }))
    else {
        unreachable!()
    };
    cmb.accept(cb, &b.qp, &quick()).unwrap();
    wait_for(
        &cma,
        |e| matches!(e, CmEvent::Established { conn } if *conn == ca),
    );
    drop(cmb);
    drop(b); // the peer's device closes: nothing answers any more
    let start = Instant::now();
    cma.disconnect(ca, &[]).unwrap();
    wait_for(
        &cma,
        |e| matches!(e, CmEvent::Disconnected { conn, .. } if *conn == ca),
    );
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
    wait_for(
        &cma,
        |e| matches!(e, CmEvent::TimewaitExit { conn } if *conn == ca),
    );
}

#[test]
fn conn_params_the_wire_cannot_carry_are_einval() {
    let a = side(device(softrdma::shm::Transport::Udp));
    let dst: SocketAddr = "127.0.0.251:7471".parse().unwrap();
    for bad in [
        ConnParam {
            max_cm_retries: 16,
            ..ConnParam::default()
        },
        ConnParam {
            cm_response_timeout: 32,
            ..ConnParam::default()
        },
        ConnParam {
            retry_count: 8,
            ..ConnParam::default()
        },
    ] {
        let e = a.ctx.cm().connect(&a.qp, dst, &bad).unwrap_err();
        assert_eq!(e.errno(), 22, "{e}");
        assert!(e.to_string().contains("ConnParam."), "{e}");
    }
    assert_eq!(a.qp.state(), QpState::Reset);
}

/// SIDR: `b` listens in the UDP port space and answers `a`'s resolve with
/// its UD QP and Q_Key; `a` then sends a datagram to what it learnt, and
/// it arrives (with `a`'s QPN as source). The SIDR_REQ's private data
/// reaches `b` after the CMA header, the SIDR_REP's reaches `a`.
fn sidr_resolve_then_send(t: softrdma::shm::Transport) {
    const UD_PORT: u16 = 7174;
    const QKEY: u32 = 0x0123_4567;
    let (a, b) = (device(t), device(t));
    let (cma, cmb) = (a.cm(), b.cm());
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let ma = pa.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mb = pb.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mut qa = pa.create_qp(QpType::Ud, &ca, &ca).build().unwrap();
    let mut qb = pb.create_qp(QpType::Ud, &cb, &cb).build().unwrap();
    qa.set_qkey(QKEY);
    qb.set_qkey(QKEY);
    qa.ready_ud().unwrap();
    qb.ready_ud().unwrap();
    qb.post_recv(&RecvWr {
        wr_id: 7,
        sg_list: vec![mb.sge(0, (GRH_LEN + 1024) as u32)],
    })
    .unwrap();
    cmb.listen(PortSpace::Udp, UD_PORT).unwrap();

    let dst = SocketAddr::new(b.addr().ip(), UD_PORT);
    let p = ConnParam {
        private_data: b"which qp?".to_vec(),
        ..quick()
    };
    let asked = cma.resolve_ud(dst, &p).unwrap();
    let CmEvent::SidrRequest {
        conn, private_data, ..
    } = wait_for(&cmb, |e| matches!(e, CmEvent::SidrRequest { .. }))
    else {
        unreachable!()
    };
    let (h, user) = softrdma_cm::rdma_cm::parse_req_private_data(&private_data).unwrap();
    assert_eq!(h.src, a.addr().ip(), "the CMA header names the asker");
    assert_eq!(&user[..9], b"which qp?");
    cmb.accept_ud(conn, &qb, QKEY, b"this one").unwrap();
    let CmEvent::SidrResolved {
        conn,
        status,
        qpn,
        qkey,
        private_data,
    } = wait_for(&cma, |e| matches!(e, CmEvent::SidrResolved { .. }))
    else {
        unreachable!()
    };
    assert_eq!(conn, asked);
    assert_eq!(status, softrdma::rdma_cm::SidrStatus::Success);
    assert_eq!((qpn, qkey), (qb.qpn().raw(), QKEY));
    assert_eq!(&private_data[..8], b"this one");

    let ah = pa.create_ah(b.gid()).unwrap();
    ma.write(0, b"datagram").unwrap();
    let mut wr = SendWr::new(1, SendOp::Send, vec![ma.sge(0, 8)]);
    wr.ud = Some(UdDest {
        ah: ah.handle(),
        remote_qpn: Qpn::from_raw(qpn),
        remote_qkey: qkey,
    });
    qa.post_send(&wr).unwrap();
    let wc = cb.wait_ok(T).unwrap();
    assert_eq!(wc.src_qp, qa.qpn());
    let mut got = [0u8; 8];
    mb.read(GRH_LEN, &mut got).unwrap();
    assert_eq!(&got, b"datagram");
}

#[test]
fn sidr_resolves_a_ud_service_over_udp() {
    sidr_resolve_then_send(softrdma::shm::Transport::Udp);
}

#[test]
fn sidr_resolves_a_ud_service_on_the_same_host() {
    sidr_resolve_then_send(softrdma::shm::Transport::Shm);
}

/// A SIDR_REQ for a UDP-space port nobody listens on: the answer is
/// "service ID not supported" at once, not a timeout.
#[test]
fn sidr_for_a_port_nobody_serves_is_unsupported() {
    let t = softrdma::shm::Transport::Udp;
    let (a, b) = (device(t), device(t));
    let dst = SocketAddr::new(b.addr().ip(), 7175);
    let asked = a.cm().resolve_ud(dst, &quick()).unwrap();
    let ev = wait_for(&a.cm(), |e| matches!(e, CmEvent::SidrResolved { .. }));
    let CmEvent::SidrResolved { conn, status, .. } = ev else {
        unreachable!()
    };
    assert_eq!(conn, asked);
    assert_eq!(status, softrdma::rdma_cm::SidrStatus::Unsupported);
}

/// The active side's REP private data is kept for its ESTABLISHED (once),
/// and `init_qp_attr` gives each side the numbers its QP was moved with:
/// the peer's QPN, the PSNs crossed (our RTR's rq_psn is the peer's RTS
/// sq_psn), the depths asked for.
#[test]
fn rep_private_data_and_qp_attributes_after_the_exchange() {
    use softrdma::rdma_cm::CmQpState;
    let t = softrdma::shm::Transport::Udp;
    let (a, b) = (side(device(t)), side(device(t)));
    let (cma, cmb) = (a.ctx.cm(), b.ctx.cm());
    cmb.listen(PortSpace::Tcp, PORT + 2).unwrap();
    let dst = SocketAddr::new(b.ctx.addr().ip(), PORT + 2);
    let p = ConnParam {
        responder_resources: 2,
        initiator_depth: 3,
        ..ConnParam::default()
    };
    let ca = cma.connect(&a.qp, dst, &p).unwrap();
    let CmEvent::ConnectRequest { conn: cb, .. } =
        wait_for(&cmb, |e| matches!(e, CmEvent::ConnectRequest { .. }))
    else {
        unreachable!()
    };
    // As Linux's CM: RTR (the path, the peer's QP) is offered from the
    // REQ on; RTS waits for the accept.
    assert!(
        cmb.init_qp_attr(cb, CmQpState::Rtr).is_ok(),
        "RTR before accepting"
    );
    assert!(
        cmb.init_qp_attr(cb, CmQpState::Rts).is_err(),
        "RTS before accepting"
    );
    let reply = ConnParam {
        private_data: b"rep data".to_vec(),
        responder_resources: 3,
        initiator_depth: 2,
        ..ConnParam::default()
    };
    cmb.accept(cb, &b.qp, &reply).unwrap();
    let est = |c: ConnId| move |e: &CmEvent<SocketAddr>| matches!(e, CmEvent::Established { conn } if *conn == c);
    wait_for(&cma, est(ca));
    let rep = cma
        .take_rep_private_data(ca)
        .expect("the REP's private data");
    assert_eq!(&rep[..8], b"rep data");
    assert_eq!(rep.len(), 196, "padded to the REP's private data");
    assert_eq!(cma.take_rep_private_data(ca), None, "taken once");
    wait_for(&cmb, est(cb));
    let (ra, sa) = (
        cma.init_qp_attr(ca, CmQpState::Rtr).unwrap(),
        cma.init_qp_attr(ca, CmQpState::Rts).unwrap(),
    );
    let (rb, sb) = (
        cmb.init_qp_attr(cb, CmQpState::Rtr).unwrap(),
        cmb.init_qp_attr(cb, CmQpState::Rts).unwrap(),
    );
    assert_eq!(ra.dest_qp_num, b.qp.qpn().raw());
    assert_eq!(rb.dest_qp_num, a.qp.qpn().raw());
    assert_eq!(ra.rq_psn, sb.sq_psn, "a receives what b sends first");
    assert_eq!(rb.rq_psn, sa.sq_psn, "b receives what a sends first");
    assert_eq!((sa.max_rd_atomic, rb.max_dest_rd_atomic), (3, 3));
    assert_eq!((sb.max_rd_atomic, ra.max_dest_rd_atomic), (2, 2));
}

/// Connects `a` to `b` on `port` with ECE offers `ea` and `eb`; returns
/// both connection IDs once established, and what each side read of the
/// other's ECE (the passive side at the request, the active side after).
fn connect_ece(a: &Side, b: &Side, port: u16, ea: Ece, eb: Ece) -> ((ConnId, ConnId), (Ece, Ece)) {
    let (cma, cmb) = (a.ctx.cm(), b.ctx.cm());
    cmb.listen(PortSpace::Tcp, port).unwrap();
    let dst = SocketAddr::new(b.ctx.addr().ip(), port);
    let pa = ConnParam {
        ece: ea,
        ..ConnParam::default()
    };
    let ca = cma.connect(&a.qp, dst, &pa).unwrap();
    let CmEvent::ConnectRequest { conn: cb, .. } =
        wait_for(&cmb, |e| matches!(e, CmEvent::ConnectRequest { .. }))
    else {
        unreachable!()
    };
    let seen_by_b = cmb.remote_ece(cb).unwrap();
    let pb = ConnParam {
        ece: eb,
        ..ConnParam::default()
    };
    cmb.accept(cb, &b.qp, &pb).unwrap();
    let est = |c: ConnId| move |e: &CmEvent<SocketAddr>| matches!(e, CmEvent::Established { conn } if *conn == c);
    wait_for(&cma, est(ca));
    wait_for(&cmb, est(cb));
    let seen_by_a = cma.remote_ece(ca).unwrap();
    ((ca, cb), (seen_by_a, seen_by_b))
}

/// ECE through the CM: two sides that both offer `Ece::SUPPORTED` agree to
/// selective repeat, which the CM sets on both QPs before RTR, and the
/// data moves; an offer the other side does not share (or makes none)
/// ends with both QPs plain go-back-N; no offer at all, the
/// default, reads zero both ways; a reject for the offer is REJECTED with
/// reason 35.
fn ece_through_the_cm(t: softrdma::shm::Transport) {
    let sup = Ece::SUPPORTED;
    let (a, b) = (side(device(t)), side(device(t)));
    let (_, (seen_a, seen_b)) = connect_ece(&a, &b, PORT + 20, sup, sup);
    assert_eq!((seen_a, seen_b), (sup, sup));
    assert!(a.qp.selective_repeat() && b.qp.selective_repeat());
    assert_eq!(
        (a.qp.query_ece().unwrap(), b.qp.query_ece().unwrap()),
        (sup, sup)
    );
    exchange_data(&a, &b);

    let (a, b) = (side(device(t)), side(device(t)));
    let (_, (seen_a, seen_b)) = connect_ece(&a, &b, PORT + 21, sup, Ece::default());
    assert_eq!((seen_a, seen_b), (Ece::default(), sup));
    assert!(!a.qp.selective_repeat() && !b.qp.selective_repeat());
    exchange_data(&a, &b);

    let (a, b) = (side(device(t)), side(device(t)));
    let (_, seen) = connect_ece(&a, &b, PORT + 22, Ece::default(), sup);
    assert_eq!(seen, (Ece::default(), Ece::default()));
    assert!(!a.qp.selective_repeat() && !b.qp.selective_repeat());
    exchange_data(&a, &b);

    let (a, b) = (side(device(t)), side(device(t)));
    let (cma, cmb) = (a.ctx.cm(), b.ctx.cm());
    cmb.listen(PortSpace::Tcp, PORT + 23).unwrap();
    let p = ConnParam {
        ece: sup,
        ..ConnParam::default()
    };
    let dst = SocketAddr::new(b.ctx.addr().ip(), PORT + 23);
    let ca = cma.connect(&a.qp, dst, &p).unwrap();
    let CmEvent::ConnectRequest { conn: cb, .. } =
        wait_for(&cmb, |e| matches!(e, CmEvent::ConnectRequest { .. }))
    else {
        unreachable!()
    };
    cmb.reject_ece(cb, b"no").unwrap();
    match wait_for(&cma, |e| matches!(e, CmEvent::Rejected { .. })) {
        CmEvent::Rejected { conn, reason, .. } => {
            assert_eq!((conn, reason.code()), (ca, 35));
        }
        _ => unreachable!(),
    }
    assert!(cmb.remote_ece(cb).is_err(), "the request is gone");
}

#[test]
fn ece_through_the_cm_over_udp() {
    ece_through_the_cm(softrdma::shm::Transport::Udp);
}

#[test]
fn ece_through_the_cm_on_the_same_host() {
    ece_through_the_cm(softrdma::shm::Transport::Shm);
}

/// XRC through the CM (rdma_cm's IB port space, as `rdma_xserver -c x`
/// uses it): an XRC initiator connects, the listener accepts on an XRC
/// target QP and sends its XRC SRQ's number as private data; the initiator
/// reads the target's QPN from the REP, both QPs reach RTS, and SENDs
/// naming the SRQ arrive on it. The wrong kind of QP on either side is
/// EINVAL.
fn xrc_through_the_cm(t: softrdma::shm::Transport, port: u16) {
    let (a, b) = (device(t), device(t));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let (ma, mb) = (
        pa.alloc_mr(4096, access).unwrap(),
        pb.alloc_mr(4096, access).unwrap(),
    );
    let xrcd = b.open_xrcd().unwrap();
    let init = SrqInit {
        max_wr: 4,
        max_sge: 1,
        limit: 0,
    };
    let srq = pb.create_xrc_srq(&xrcd, &cb, init).unwrap();
    let ini = pa.create_qp(QpType::XrcIni, &ca, &ca).build().unwrap();
    let tgt = xrcd.create_tgt_qp().unwrap();
    let (cma, cmb) = (a.cm(), b.cm());
    cmb.listen(PortSpace::Ib, port).unwrap();
    let dst = SocketAddr::new(b.addr().ip(), port);
    // An XRC initiator connects in the IB port space only.
    let e = cma.connect(&ini, dst, &quick()).unwrap_err();
    assert!(e.to_string().contains("port space"), "{e}");
    let conn_a = cma.connect_in(PortSpace::Ib, &ini, dst, &quick()).unwrap();
    let CmEvent::ConnectRequest {
        conn: conn_b, req, ..
    } = wait_for(&cmb, |e| matches!(e, CmEvent::ConnectRequest { .. }))
    else {
        unreachable!()
    };
    assert!(req.is_xrc(), "the REQ asks for XRC");
    assert_eq!(req.local_qpn, ini.qpn().raw());
    // An RC QP cannot take an XRC request; the target can.
    let rc = pb.create_qp(QpType::Rc, &cb, &cb).build().unwrap();
    let e = cmb.accept(conn_b, &rc, &ConnParam::default()).unwrap_err();
    assert!(e.to_string().contains("XRC"), "{e}");
    let srqn = srq.srq_num().unwrap();
    let reply = ConnParam {
        private_data: srqn.to_be_bytes().to_vec(),
        ..ConnParam::default()
    };
    cmb.accept(conn_b, &tgt, &reply).unwrap();
    let est = |c: ConnId| move |e: &CmEvent<SocketAddr>| matches!(e, CmEvent::Established { conn } if *conn == c);
    wait_for(&cma, est(conn_a));
    wait_for(&cmb, est(conn_b));
    assert_eq!((ini.state(), tgt.state()), (QpState::Rts, QpState::Rts));
    let got = cma
        .take_rep_private_data(conn_a)
        .expect("the REP's private data");
    let srqn_seen = u32::from_be_bytes(got[..4].try_into().unwrap());
    assert_eq!(srqn_seen, srqn);
    srq.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: vec![mb.sge(0, 64)],
    })
    .unwrap();
    ma.write(0, b"xrc over the cm").unwrap();
    let mut wr = SendWr::new(1, SendOp::Send, vec![ma.sge(0, 15)]);
    wr.xrc_srqn = Some(srqn_seen);
    ini.post_send(&wr).unwrap();
    ca.wait_ok(T).unwrap();
    let w = cb.wait_ok(T).unwrap();
    assert_eq!((w.wr_id, w.byte_len, w.qp_num), (9, 15, tgt.qpn()));
    let mut back = [0u8; 15];
    mb.read(0, &mut back).unwrap();
    assert_eq!(&back, b"xrc over the cm");
}

#[test]
fn xrc_through_the_cm_over_udp() {
    xrc_through_the_cm(softrdma::shm::Transport::Udp, PORT + 40);
}

#[test]
fn xrc_through_the_cm_on_the_same_host() {
    xrc_through_the_cm(softrdma::shm::Transport::Shm, PORT + 41);
}
