//! The P_Key check on receive. The port has one P_Key, 0xFFFF (full member
//! of the default partition). A packet matches when the low 15 bits of its
//! BTH P_Key equal the QP's and one of the two is a full member; anything
//! else is dropped before the QP sees it and counted in `pkey_violations`.

mod common;
use std::time::Duration;

use common::*;
use softrdma_engine::sim::SimNet;
use softrdma_engine::*;
use softrdma_wire::{AethRepr, BthRepr, DethRepr, Headers, Opcode, PacketRepr, Psn, RethRepr};

fn rc() -> (SimNet, Side, Side) {
    pair(21, net5(), QpType::Rc, &ConnOpts::default())
}

/// The PSN `b` expects from `a` on a fresh pair.
fn epsn() -> Psn {
    Psn::new(ConnOpts::default().psn_a)
}

/// A WRITE_ONLY of `data` at the start of `to`'s region, with AckReq, as
/// `from` would send it, but with P_Key `pkey`.
fn forge_write(net: &mut SimNet, from: &Side, to: &Side, pkey: u16, data: &[u8], t: Opcode) {
    let mut bth = BthRepr::new(t, to.qpn.raw(), epsn());
    bth.pkey = pkey;
    bth.ack_req = true;
    let reth = RethRepr {
        va: to.base,
        rkey: to.keys.rkey.raw(),
        dma_len: data.len() as u32,
    };
    forge(net, from, to, bth, Headers::Reth(reth), data);
}

fn pkey_of(p: &Pkt) -> u16 {
    PacketRepr::parse(&p.bytes).unwrap().bth.pkey
}

#[test]
fn a_write_with_a_foreign_pkey_is_dropped_and_counted() {
    let (mut net, a, b) = rc();
    let wire = sniff(&mut net);
    forge_write(
        &mut net,
        &a,
        &b,
        0x1234,
        &pattern(1, 64),
        Opcode::RC_WRITE_ONLY,
    );
    settle(&mut net);
    assert_eq!(net.nodes[1].counters().pkey_violations, 1);
    let c = qp_counters(&net, &b);
    assert_eq!(c.pkey_violations, 1);
    assert_eq!(
        (
            c.dropped,
            c.out_of_sequence,
            c.duplicates,
            c.error_naks_sent
        ),
        (0, 0, 0, 0),
        "counted once, as a P_Key violation only: {c:?}"
    );
    assert!(mem(&b, 0, 64).iter().all(|&x| x == 0), "memory untouched");
    assert_eq!(net.nodes[1].qp_state(b.qpn), Some(QpState::Rts));
    assert!(
        sent_where(&wire, |p| p.from == 1).is_empty(),
        "no ACK or NAK for it"
    );
    assert!(events(&mut net, 1).is_empty());
    // The responder never saw it: its expected PSN did not move, so the real
    // WRITE with that PSN executes.
    a.mem.fill_from(0, &pattern(2, 64));
    post_ok(&mut net, &a, write_wr(1, &a, 0, 64, &b, 0));
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);
    assert_eq!(mem(&b, 0, 64), pattern(2, 64));
    assert_eq!(qp_counters(&net, &b).pkey_violations, 1);
}

#[test]
fn a_limited_member_pkey_is_accepted_by_the_full_member_port() {
    let (mut net, a, b) = rc();
    let wire = sniff(&mut net);
    forge_write(
        &mut net,
        &a,
        &b,
        0x7FFF,
        &pattern(3, 64),
        Opcode::RC_WRITE_ONLY,
    );
    settle(&mut net);
    assert_eq!(mem(&b, 0, 64), pattern(3, 64), "executed");
    assert_eq!(net.nodes[1].counters().pkey_violations, 0);
    // Its ACK goes out with the QP's own P_Key, the full member's.
    let acks = sent_where(&wire, |p| p.from == 1);
    assert_eq!(acks.len(), 1);
    assert_eq!(pkey_of(&acks[0]), 0xFFFF);
}

#[test]
fn every_other_mismatch_is_dropped() {
    // The invalid P_Keys (low bits zero), other partitions as full or
    // limited members: none matches 0xFFFF.
    let bad = [0x0000, 0x8000, 0x7FFE, 0xFFFE, 0x0001, 0x9234, 0x1234];
    let (mut net, a, b) = rc();
    for (i, &k) in bad.iter().enumerate() {
        forge_write(
            &mut net,
            &a,
            &b,
            k,
            &pattern(i as u8 + 1, 64),
            Opcode::RC_WRITE_ONLY,
        );
    }
    settle(&mut net);
    assert_eq!(qp_counters(&net, &b).pkey_violations, bad.len() as u64);
    assert!(mem(&b, 0, 64).iter().all(|&x| x == 0));
    assert_eq!(net.nodes[1].qp_state(b.qpn), Some(QpState::Rts));
}

#[test]
fn a_response_with_a_foreign_pkey_is_dropped() {
    let (mut net, a, b) = rc();
    // b's answers never reach a: only the forged ones do.
    net.set_partition(1, 0, true);
    post_ok(&mut net, &a, write_wr(1, &a, 0, 10, &b, 0));
    run_for(&mut net, Duration::from_micros(100));
    let ack = |pkey: u16| {
        let mut bth = BthRepr::new(Opcode::RC_ACK, a.qpn.raw(), epsn());
        bth.pkey = pkey;
        bth
    };
    let aeth = Headers::Aeth(AethRepr {
        syndrome: softrdma_wire::Syndrome::Ack { credits: 31 },
        msn: softrdma_wire::Msn::new(1),
    });
    forge(&mut net, &b, &a, ack(0x1234), aeth, &[]);
    assert!(
        poll(&mut net, &a).is_empty(),
        "the foreign ACK retired nothing"
    );
    assert_eq!(qp_counters(&net, &a).pkey_violations, 1);
    assert_eq!(net.nodes[0].counters().pkey_violations, 1);
    forge(&mut net, &b, &a, ack(0xFFFF), aeth, &[]);
    assert_eq!(statuses(&poll(&mut net, &a)), vec![(1, WcStatus::Success)]);
    assert_eq!(qp_counters(&net, &a).pkey_violations, 1);
}

#[test]
fn uc_and_ud_check_the_pkey_too() {
    // UC: a WRITE with a foreign P_Key writes nothing; the same with the
    // right one does (UC takes any PSN).
    let (mut net, a, b) = pair(22, net5(), QpType::Uc, &ConnOpts::default());
    forge_write(
        &mut net,
        &a,
        &b,
        0x1234,
        &pattern(4, 64),
        Opcode::UC_WRITE_ONLY,
    );
    assert!(mem(&b, 0, 64).iter().all(|&x| x == 0));
    assert_eq!(qp_counters(&net, &b).pkey_violations, 1);
    forge_write(
        &mut net,
        &a,
        &b,
        0xFFFF,
        &pattern(4, 64),
        Opcode::UC_WRITE_ONLY,
    );
    assert_eq!(mem(&b, 0, 64), pattern(4, 64));
    assert_eq!(qp_counters(&net, &b).pkey_violations, 1);

    // UD: a SEND with a foreign P_Key (and the right Q_Key) consumes no
    // receive and is no Q_Key violation; the same with the right one lands.
    let (mut net, a, b) = pair(23, net5(), QpType::Ud, &ConnOpts::default());
    recv(&mut net, &b, 7, 0, 4096);
    let send = |pkey: u16| {
        let mut bth = BthRepr::new(Opcode::UD_SEND_ONLY, b.qpn.raw(), Psn::new(5));
        bth.pkey = pkey;
        bth
    };
    let deth = Headers::Deth(DethRepr {
        qkey: 0x1111_2222,
        src_qp: a.qpn.raw(),
    });
    forge(&mut net, &a, &b, send(0x1234), deth, &pattern(5, 32));
    assert!(poll(&mut net, &b).is_empty());
    let c = qp_counters(&net, &b);
    assert_eq!((c.pkey_violations, c.qkey_violations), (1, 0));
    forge(&mut net, &a, &b, send(0xFFFF), deth, &pattern(5, 32));
    let w = poll(&mut net, &b);
    assert_eq!(statuses(&w), vec![(7, WcStatus::Success)]);
    assert_eq!(mem(&b, GRH_LEN, 32), pattern(5, 32));
}

#[test]
fn everything_softrdma_sends_carries_the_qps_pkey() {
    // Requests, ACKs, READ responses and atomic ACKs (RC), UC and UD
    // packets: all with P_Key 0xFFFF, and none of them is dropped.
    let (mut net, a, b) = rc();
    let wire = sniff(&mut net);
    a.mem.fill_from(0, &pattern(6, 8192));
    recv(&mut net, &b, 100, 0, 4096);
    post_ok(&mut net, &a, write_wr(1, &a, 0, 3000, &b, 0));
    post_ok(&mut net, &a, read_wr(2, &a, 4096, 3000, &b, 8192));
    post_ok(&mut net, &a, send_wr(3, &a, 0, 100));
    post_ok(
        &mut net,
        &a,
        SendWr::new(
            4,
            SendOp::FetchAdd {
                remote_addr: b.base + 16384,
                rkey: b.keys.rkey,
                add: 1,
            },
            vec![sge(&a, 8192, 8)],
        ),
    );
    let w = wait_wcs(&mut net, &a, 4, LONG);
    assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
    let mut uc = pair(24, net5(), QpType::Uc, &ConnOpts::default());
    let uc_wire = sniff(&mut uc.0);
    post_ok(&mut uc.0, &uc.1, write_wr(1, &uc.1, 0, 3000, &uc.2, 0));
    settle(&mut uc.0);
    let sent: Vec<Pkt> = sent_where(&wire, |_| true)
        .into_iter()
        .chain(sent_where(&uc_wire, |_| true))
        .collect();
    assert!(sent.len() >= 10, "{} packets", sent.len());
    for p in &sent {
        assert_eq!(pkey_of(p), 0xFFFF, "{:?} without the P_Key", p.opcode);
    }
    for n in [&net.nodes[0], &net.nodes[1], &uc.0.nodes[0], &uc.0.nodes[1]] {
        assert_eq!(n.counters().pkey_violations, 0);
    }
}
