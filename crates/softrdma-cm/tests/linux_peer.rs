//! The agent's passive side against the Linux kernel's own MADs: the REQs
//! of `rping` and the SIDR_REQs of `udaddy` captured from the rxe guest's
//! kernel CM (the wire crate's fixture, `interop/rxe/run.sh --capture-cm`,
//! docs/interop.md). A listener gets one connection request however often
//! the kernel retried, answers it with a REP naming the kernel's
//! communication ID and our QP; without a listener the kernel's REQ gets the
//! REJ its CM expects (invalid service ID); a UD service answers the SIDR_REQ.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use softrdma_cm::rdma_cm::{parse_req_private_data, PortSpace};
use softrdma_cm::{AcceptParams, AgentConfig, CmAgent, Event, Instant, RejReason};
use softrdma_pcap::CaptureReader;
use softrdma_wire::cm::{CmMad, CmMessage, SidrStatus};
use softrdma_wire::mad::{gmp_payload, MAD_LEN};
use softrdma_wire::{PacketRepr, Psn};

const GUEST: Ipv4Addr = Ipv4Addr::new(10, 213, 91, 2);
const HOST: Ipv4Addr = Ipv4Addr::new(10, 213, 91, 1);
const PORT: u16 = 7174;

/// (sender, MAD) of every frame of the fixture, in order.
fn kernel_mads() -> Vec<(SocketAddr, [u8; MAD_LEN])> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../softrdma-wire/tests/fixtures/linux-cm.pcap"
    );
    let mut r = CaptureReader::open(path).expect("the fixture capture");
    let mut out = Vec::new();
    while let Some(f) = r.next_frame().unwrap() {
        let ip = f.ip().unwrap();
        let ihl = usize::from(ip[0] & 0xF) * 4;
        let src = IpAddr::V4(Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]));
        let sport = u16::from_be_bytes([ip[ihl], ip[ihl + 1]]);
        let pkt = PacketRepr::parse(&ip[ihl + 8..]).unwrap();
        out.push((SocketAddr::new(src, sport), *gmp_payload(&pkt).unwrap()));
    }
    out
}

fn of_kind(want: fn(&CmMessage) -> bool) -> Vec<(SocketAddr, [u8; MAD_LEN])> {
    kernel_mads()
        .into_iter()
        .filter(|(_, m)| want(&CmMad::parse(m).unwrap().message))
        .collect()
}

fn agent() -> CmAgent<SocketAddr> {
    CmAgent::new(AgentConfig::default(), [7; 32])
}

fn sent(a: &mut CmAgent<SocketAddr>) -> Vec<(SocketAddr, CmMad)> {
    std::iter::from_fn(|| a.poll_transmit())
        .map(|(to, m)| (to, CmMad::parse(&m).expect("we emit valid MADs")))
        .collect()
}

fn accept() -> AcceptParams {
    AcceptParams {
        qpn: 0x12_3456,
        starting_psn: Psn::new(0x65_4321),
        qkey: 0x1111_2222,
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        ..AcceptParams::default()
    }
}

#[test]
fn a_listener_takes_the_kernels_req_once_and_answers_with_a_rep() {
    let reqs = of_kind(|m| matches!(m, CmMessage::Req(_)));
    assert!(reqs.len() >= 2, "the fixture has a REQ and its retry");
    let mut a = agent();
    a.listen(PortSpace::Tcp.service_id(PORT)).unwrap();
    let mut now = Instant(1_000);
    a.on_mad(now, reqs[0].0, &reqs[0].1);
    let Some(Event::ConnectRequest { conn, peer, req }) = a.poll_event() else {
        panic!("no connection request");
    };
    assert_eq!(peer, reqs[0].0);
    let (h, _user) = parse_req_private_data(&req.private_data).unwrap();
    assert_eq!((h.src, h.dst), (IpAddr::V4(GUEST), IpAddr::V4(HOST)));
    a.accept(now, conn, &accept()).unwrap();
    let out = sent(&mut a);
    let [(to, rep)] = &out[..] else {
        panic!("one REP, not {out:?}")
    };
    assert_eq!(*to, reqs[0].0);
    // rxe has no ECE: the kernel's REQ offers none, and the REP to it
    // carries none (its bytes are the REP of before ECE).
    assert_eq!(a.remote_ece(conn), Some(softrdma_cm::Ece::default()));
    assert_eq!(rep.ece(), Some(softrdma_cm::Ece::default()));
    assert_eq!(rep.header.attribute_modifier, 0);
    let CmMessage::Rep(rep) = rep.message else {
        panic!("{rep:?}")
    };
    assert_eq!(rep.remote_comm_id, req.local_comm_id, "the kernel's ID");
    assert_eq!(
        (rep.local_qpn, rep.starting_psn),
        (0x12_3456, Psn::new(0x65_4321))
    );
    // The kernel's retry is the same REQ: no second request, the REP again.
    for (from, m) in &reqs[1..] {
        now = Instant(now.0 + 6_000_000_000);
        a.on_mad(now, *from, m);
        assert!(a.poll_event().is_none(), "a retry made a second connection");
        let again = sent(&mut a);
        assert!(
            again
                .iter()
                .all(|(_, m)| matches!(m.message, CmMessage::Rep(_))),
            "{again:?}"
        );
    }
    assert_eq!(a.conn_count(), 1);
}

#[test]
fn without_a_listener_the_kernels_req_is_rejected_as_an_invalid_service() {
    let reqs = of_kind(|m| matches!(m, CmMessage::Req(_)));
    let CmMessage::Req(kreq) = CmMad::parse(&reqs[0].1).unwrap().message else {
        unreachable!()
    };
    let mut a = agent();
    a.on_mad(Instant(1_000), reqs[0].0, &reqs[0].1);
    assert!(a.poll_event().is_none());
    let out = sent(&mut a);
    let [(to, rej)] = &out[..] else {
        panic!("one REJ, not {out:?}")
    };
    assert_eq!(*to, reqs[0].0);
    let CmMessage::Rej(rej) = rej.message else {
        panic!("{rej:?}")
    };
    assert_eq!(rej.reason, RejReason::InvalidServiceId);
    assert_eq!(rej.remote_comm_id, kreq.local_comm_id);
    assert_eq!(a.conn_count(), 0);
}

#[test]
fn a_ud_service_answers_the_kernels_sidr_req() {
    let sidrs = of_kind(|m| matches!(m, CmMessage::SidrReq(_)));
    let CmMessage::SidrReq(kreq) = CmMad::parse(&sidrs[0].1).unwrap().message else {
        unreachable!()
    };
    let mut a = agent();
    a.listen(PortSpace::Udp.service_id(PORT)).unwrap();
    a.on_mad(Instant(1_000), sidrs[0].0, &sidrs[0].1);
    let Some(Event::SidrRequest {
        conn, service_id, ..
    }) = a.poll_event()
    else {
        panic!("no SIDR request");
    };
    assert_eq!(service_id, kreq.service_id);
    a.accept(Instant(2_000), conn, &accept()).unwrap();
    let out = sent(&mut a);
    let [(_, rep)] = &out[..] else {
        panic!("one SIDR_REP, not {out:?}")
    };
    let CmMessage::SidrRep(rep) = rep.message else {
        panic!("{rep:?}")
    };
    assert_eq!(rep.request_id, kreq.request_id);
    assert_eq!(rep.status, SidrStatus::Success);
    assert_eq!((rep.qpn, rep.qkey), (0x12_3456, 0x1111_2222));
}
