//! QP1, the General Services Interface: MADs sent with `send_gsi` arrive
//! intact through `poll_gsi` at the peer, and everything QP1 must not take
//! (another Q_Key, another length, another opcode, another partition, a
//! flood past its queue) is dropped and counted, never delivered.

use std::net::SocketAddr;

use softrdma_engine::*;
use softrdma_wire::frame::ROCE_PORT;
use softrdma_wire::mad::{gmp_packet, GSI_QKEY, GSI_QPN, MAD_LEN};
use softrdma_wire::{DethRepr, Endpoints, Headers, Opcode, PacketRepr, Psn};

fn addr(last: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, last], ROCE_PORT))
}

fn engine(last: u8) -> Engine {
    Engine::new(EngineConfig::new(addr(last)))
}

fn mad(seed: u8) -> [u8; MAD_LEN] {
    let mut m = [0u8; MAD_LEN];
    for (i, b) in m.iter_mut().enumerate() {
        *b = seed.wrapping_mul(31).wrapping_add(i as u8);
    }
    m
}

/// Everything `e` sends now, as (endpoints, bytes).
fn drain(e: &mut Engine) -> Vec<(Endpoints, Vec<u8>)> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 4200];
    while let Some(t) = e.poll_transmit(Instant(0), &mut buf) {
        out.push((t.endpoints, buf[..t.len].to_vec()));
        assert!(out.len() <= GSI_TX_MAX, "keeps transmitting");
    }
    out
}

/// Delivers what `from` sends to `to`.
fn deliver(from: &mut Engine, to: &mut Engine) -> usize {
    let sent = drain(from);
    for (ep, bytes) in &sent {
        to.handle_packet(Instant(0), *ep, bytes);
    }
    sent.len()
}

#[test]
fn a_mad_goes_to_the_peers_qp1_and_the_answer_comes_back() {
    let (mut a, mut b) = (engine(1), engine(2));
    a.send_gsi(addr(2), &mad(1)).unwrap();
    let sent = drain(&mut a);
    assert_eq!(sent.len(), 1);
    let (ep, bytes) = &sent[0];
    assert_eq!(ep.dst, addr(2));
    let p = PacketRepr::parse(bytes).unwrap();
    assert_eq!(
        (p.bth.opcode, p.bth.dest_qp, p.bth.pkey),
        (Opcode::UD_SEND_ONLY, 1, 0xFFFF)
    );
    let deth = p.headers.deth().unwrap();
    assert_eq!((deth.qkey, deth.src_qp), (GSI_QKEY, 1));
    assert_eq!(p.payload, &mad(1)[..]);

    b.handle_packet(Instant(0), *ep, bytes);
    let got = b.poll_gsi().expect("b's QP1 took the MAD");
    assert_eq!((*got.mad, got.src_qpn, got.pkey), (mad(1), 1, 0xFFFF));
    assert_eq!(got.from.ip(), addr(1).ip());
    assert!(b.poll_gsi().is_none());
    assert_eq!(b.counters().gsi_mads_rcvd, 1);

    // The answer goes to where the MAD came from.
    b.send_gsi(got.from, &mad(2)).unwrap();
    let back = drain(&mut b);
    assert_eq!(back[0].0.dst, got.from);
    for (ep, bytes) in &back {
        a.handle_packet(Instant(0), *ep, bytes);
    }
    assert_eq!(*a.poll_gsi().unwrap().mad, mad(2));
    assert_eq!(a.counters().gsi_mads_sent, 1);
}

/// A packet for QP1 built by hand (what a hostile or broken peer may send).
fn to_qp1(opcode: Opcode, qkey: u32, pkey: u16, payload: &[u8]) -> Vec<u8> {
    let m = mad(9);
    let mut repr = gmp_packet(GSI_QPN, Psn::new(5), &m);
    repr.bth.opcode = opcode;
    repr.bth.pkey = pkey;
    repr.headers = if opcode == Opcode::UD_SEND_ONLY {
        Headers::Deth(DethRepr { qkey, src_qp: 7 })
    } else {
        Headers::None
    };
    repr.payload = payload;
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr
        .emit(&mut buf, &Endpoints::new(addr(1), addr(2)))
        .unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn qp1_takes_only_gsi_mads() {
    let m = mad(3);
    let cases: [(&str, Vec<u8>, u64); 5] = [
        (
            "another Q_Key",
            to_qp1(Opcode::UD_SEND_ONLY, 0x1234, 0xFFFF, &m),
            0,
        ),
        (
            "a short MAD",
            to_qp1(Opcode::UD_SEND_ONLY, GSI_QKEY, 0xFFFF, &m[..255]),
            0,
        ),
        (
            "a long MAD",
            to_qp1(Opcode::UD_SEND_ONLY, GSI_QKEY, 0xFFFF, &[0; 300]),
            0,
        ),
        (
            "an RC SEND",
            to_qp1(Opcode::RC_SEND_ONLY, GSI_QKEY, 0xFFFF, &m),
            0,
        ),
        (
            "another partition",
            to_qp1(Opcode::UD_SEND_ONLY, GSI_QKEY, 0x8123, &m),
            1,
        ),
    ];
    for (what, bytes, pkey_violations) in cases {
        let mut b = engine(2);
        b.handle_packet(Instant(0), Endpoints::new(addr(1), addr(2)), &bytes);
        assert!(b.poll_gsi().is_none(), "{what} was delivered");
        let c = b.counters();
        assert_eq!((c.gsi_mads_rcvd, c.gsi_mads_dropped), (0, 1), "{what}");
        assert_eq!(c.pkey_violations, pkey_violations, "{what}");
    }
    // The limited member key of the default partition is taken.
    let mut b = engine(2);
    let limited = to_qp1(Opcode::UD_SEND_ONLY, GSI_QKEY, 0x7FFF, &m);
    b.handle_packet(Instant(0), Endpoints::new(addr(1), addr(2)), &limited);
    assert_eq!(b.poll_gsi().map(|g| (g.src_qpn, g.pkey)), Some((7, 0x7FFF)));
}

#[test]
fn a_flood_fills_qp1s_queues_and_no_further() {
    let (mut a, mut b) = (engine(1), engine(2));
    let mut refused = 0;
    for i in 0..GSI_TX_MAX + 10 {
        if a.send_gsi(addr(2), &mad(i as u8)).is_err() {
            refused += 1;
        }
    }
    assert_eq!(refused, 10, "the send queue holds GSI_TX_MAX MADs");
    assert_eq!(deliver(&mut a, &mut b), GSI_TX_MAX);
    for i in 0..10 {
        a.send_gsi(addr(2), &mad(i)).unwrap();
    }
    deliver(&mut a, &mut b);
    let c = b.counters();
    assert_eq!(
        (c.gsi_mads_rcvd, c.gsi_mads_dropped),
        (GSI_RX_MAX as u64, 10)
    );
    let mut n = 0;
    while let Some(g) = b.poll_gsi() {
        assert_eq!(*g.mad, mad(n as u8), "in order, intact");
        n += 1;
    }
    assert_eq!(n, GSI_RX_MAX);
}
