//! Selective repeat (issue 19), negotiated per QP through ECE: a lost
//! packet is the only one sent again, the responder keeps what came after
//! it and acknowledges it with a SACK, completions stay in order and
//! exactly once, and a receive never completes over a hole. A QP without
//! the option is go-back-N, as `reliability.rs` and the wire digests pin.

mod common;
use std::time::Duration;

use common::*;
use softrdma_engine::sim::{NetConfig, SimNet};
use softrdma_engine::*;
use softrdma_wire::{NakCode, OpKind, PacketRepr, SackRepr, Syndrome};

const PSN_A: u32 = 0x100;
const WAIT: Duration = Duration::from_secs(5);

/// Two RC QPs that agreed to selective repeat (each end's query, agreed,
/// set before RTR), or plain go-back-N ones.
fn sr_pair(seed: u64, cfg: NetConfig, sr: bool) -> (SimNet, Side, Side) {
    let o = ConnOpts::default();
    let mut net = SimNet::new(2, seed, cfg);
    let a = make_side(&mut net, 0, QpType::Rc);
    let b = make_side(&mut net, 1, QpType::Rc);
    if sr {
        let ea = net.nodes[0].query_ece(a.qpn).unwrap();
        let eb = net.nodes[1].query_ece(b.qpn).unwrap();
        let agreed = ea.agree(eb);
        assert!(agreed.selective_repeat());
        net.nodes[0].set_ece(a.qpn, agreed).unwrap();
        net.nodes[1].set_ece(b.qpn, agreed).unwrap();
    }
    bring_up(&mut net, &a, &b, o.psn_a, o.psn_b, &o, QpType::Rc);
    bring_up(&mut net, &b, &a, o.psn_b, o.psn_a, &o, QpType::Rc);
    (net, a, b)
}

fn sack_of(p: &Pkt) -> Option<SackRepr> {
    let pkt = PacketRepr::parse(&p.bytes).ok()?;
    (p.kind == OpKind::Ack && !pkt.payload.is_empty())
        .then(|| SackRepr::parse(pkt.payload).unwrap())
}

#[test]
fn one_lost_write_packet_is_the_only_one_sent_again() {
    let (mut net, a, b) = sr_pair(21, net5(), true);
    let wire = drop_nth(&mut net, 3, |p| p.from == 0 && p.is(OpKind::Write));
    a.mem.fill_from(0, &pattern(1, 10 * 1024));
    post_ok(&mut net, &a, write_wr(1, &a, 0, 10 * 1024, &b, 0));
    let w = wait_wcs(&mut net, &a, 1, WAIT);
    assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);
    assert_eq!(mem(&b, 0, 10 * 1024), pattern(1, 10 * 1024));
    let psns: Vec<u32> = sent_where(&wire, |p| p.from == 0)
        .iter()
        .map(|p| p.psn)
        .collect();
    let want: Vec<u32> = (0..10).chain([3]).map(|i| PSN_A + i).collect();
    assert_eq!(psns, want, "PSN 3 alone goes again");
    let ca = qp_counters(&net, &a);
    let cb = qp_counters(&net, &b);
    assert_eq!((ca.retransmits, ca.sr_retransmits, ca.timeouts), (1, 1, 0));
    assert_eq!((cb.ooo_held, cb.seq_naks_sent), (6, 0));
    // No NAK; the ACKs sent while 4..9 were held say so, bit by bit.
    let from_b = sent_where(&wire, |p| p.from == 1);
    assert!(from_b.iter().all(|p| !p.is_nak()));
    let sacks: Vec<(u32, SackRepr)> = from_b
        .iter()
        .filter_map(|p| sack_of(p).map(|s| (p.psn, s)))
        .collect();
    assert!(!sacks.is_empty());
    let (psn, last) = sacks.last().unwrap();
    assert_eq!(*psn, PSN_A + 2, "cumulative up to the hole");
    let held: Vec<u32> = last
        .held_psns(softrdma_wire::Psn::new(*psn))
        .map(|p| p.value())
        .collect();
    assert_eq!(held, (4..10).map(|i| PSN_A + i).collect::<Vec<_>>());
    // The last ACK, after the hole is filled, is a plain one for everything.
    let last_ack = from_b.iter().rev().find(|p| p.is(OpKind::Ack)).unwrap();
    assert_eq!(last_ack.psn, PSN_A + 9);
    assert!(sack_of(last_ack).is_none());
}

/// The last packet of a window is lost: nothing follows it to reveal the
/// hole in a SACK. The tail-loss probe (an eighth of the local ACK
/// timeout after the last progress, IRN's short RTO) sends it again; the
/// local ACK timeout never fires. Go-back-N still waits for the timeout.
#[test]
fn a_lost_tail_packet_goes_again_after_the_probe_not_the_timeout() {
    let timeout = Duration::from_nanos(4096 << ConnOpts::default().timeout);
    for sr in [true, false] {
        let (mut net, a, b) = sr_pair(23, net5(), sr);
        let wire = drop_nth(&mut net, 9, |p| p.from == 0 && p.is(OpKind::Write));
        a.mem.fill_from(0, &pattern(4, 10 * 1024));
        let t0 = net.now;
        post_ok(&mut net, &a, write_wr(1, &a, 0, 10 * 1024, &b, 0));
        let w = wait_wcs(&mut net, &a, 1, WAIT);
        let took = net.now - t0;
        assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);
        assert_eq!(mem(&b, 0, 10 * 1024), pattern(4, 10 * 1024));
        let c = qp_counters(&net, &a);
        let psns: Vec<u32> = sent_where(&wire, |p| p.from == 0)
            .iter()
            .map(|p| p.psn)
            .collect();
        if sr {
            assert_eq!((c.retransmits, c.sr_retransmits, c.timeouts), (1, 1, 0));
            let want: Vec<u32> = (0..10).chain([9]).map(|i| PSN_A + i).collect();
            assert_eq!(psns, want, "PSN 9 alone goes again");
            assert!(
                took < timeout / 4,
                "{took:?}: the probe, not the {timeout:?} timeout"
            );
        } else {
            assert_eq!(c.timeouts, 1, "go-back-N waits for the local ACK timeout");
            assert!(took >= timeout, "{took:?}");
        }
    }
}

#[test]
fn go_back_n_is_unchanged_without_the_option() {
    let (mut net, a, b) = sr_pair(21, net5(), false);
    let wire = drop_nth(&mut net, 3, |p| p.from == 0 && p.is(OpKind::Write));
    a.mem.fill_from(0, &pattern(1, 10 * 1024));
    post_ok(&mut net, &a, write_wr(1, &a, 0, 10 * 1024, &b, 0));
    let w = wait_wcs(&mut net, &a, 1, WAIT);
    assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);
    assert_eq!(qp_counters(&net, &a).retransmits, 7);
    let nak = sent_where(&wire, |p| p.from == 1 && p.is_nak());
    assert_eq!(
        nak[0].syndrome,
        Some(Syndrome::Nak(NakCode::PsnSequenceError))
    );
    assert!(sent_where(&wire, |p| sack_of(p).is_some()).is_empty());
}

#[test]
fn a_send_never_completes_over_its_hole() {
    let (mut net, a, b) = sr_pair(22, net5(), true);
    // The 2nd packet of an 8-packet SEND is lost: the receive completes
    // once, after the retransmission arrived, with all its bytes.
    let wire = drop_nth(&mut net, 1, |p| p.from == 0 && p.is(OpKind::Send));
    recv(&mut net, &b, 7, 0, 8 * 1024);
    a.mem.fill_from(0, &pattern(3, 8 * 1024));
    b.mem.fill_from(0, &[0xEE; 8 * 1024]);
    post_ok(&mut net, &a, send_wr(1, &a, 0, 8 * 1024));
    let mut recvs = Vec::new();
    let t0 = net.now;
    while net.now - t0 < WAIT && recvs.is_empty() {
        net.step();
        recvs.extend(poll(&mut net, &b));
    }
    assert_eq!(recvs.len(), 1);
    assert_eq!(recvs[0].status, WcStatus::Success);
    assert_eq!(recvs[0].byte_len, 8 * 1024);
    assert_eq!(mem(&b, 0, 8 * 1024), pattern(3, 8 * 1024));
    // The retransmission had reached b before the receive completed.
    let resent = wire
        .borrow()
        .iter()
        .filter(|p| !p.sent() && p.from == 0 && p.psn == PSN_A + 1)
        .map(|p| p.now)
        .next()
        .expect("the lost PSN arrived again");
    assert!(resent <= net.now);
    let w = wait_wcs(&mut net, &a, 1, WAIT);
    assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);
    assert_eq!(qp_counters(&net, &a).retransmits, 1);
    settle(&mut net);
    assert!(poll(&mut net, &b).is_empty(), "exactly once");
}

#[test]
fn a_lost_read_response_re_requests_only_that_read() {
    let (mut net, a, b) = sr_pair(23, net5(), true);
    let wire = drop_nth(&mut net, 2, |p| p.from == 1 && p.is(OpKind::ReadResponse));
    b.mem.fill_from(0, &pattern(4, 6 * 1024));
    a.mem.fill_from(64 << 10, &pattern(5, 4 * 1024));
    post_ok(&mut net, &a, read_wr(1, &a, 0, 6 * 1024, &b, 0));
    post_ok(
        &mut net,
        &a,
        write_wr(2, &a, 64 << 10, 4 * 1024, &b, 64 << 10),
    );
    let w = wait_wcs(&mut net, &a, 2, WAIT);
    assert_eq!(
        statuses(&w),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(mem(&a, 0, 6 * 1024), pattern(4, 6 * 1024));
    assert_eq!(mem(&b, 64 << 10, 4 * 1024), pattern(5, 4 * 1024));
    // The READ went again from its third response; the WRITE never did.
    let reqs = sent_where(&wire, |p| p.from == 0);
    let reads: Vec<u32> = reqs
        .iter()
        .filter(|p| p.is(OpKind::ReadRequest))
        .map(|p| p.psn)
        .collect();
    assert_eq!(reads, vec![PSN_A, PSN_A + 2]);
    assert_eq!(reqs.iter().filter(|p| p.is(OpKind::Write)).count(), 4);
}

#[test]
fn random_loss_reorder_and_duplicates_keep_every_rule() {
    for seed in 0..12u64 {
        let cfg = NetConfig {
            loss: 0.05,
            duplicate: 0.02,
            delay: Duration::from_micros(5),
            jitter: Duration::from_micros(4),
            ..NetConfig::perfect()
        };
        let (mut net, a, b) = sr_pair(100 + seed, cfg, true);
        let mut rng = Rng::new(seed);
        let mut expect_b = vec![0u8; 256 << 10];
        let mut last_read = std::collections::HashMap::new();
        b.mem.fill_from(512 << 10, &pattern(9, 128 << 10));
        b.mem.fill_from(900 << 10, &0u64.to_ne_bytes());
        for i in 0..40u64 {
            recv(&mut net, &b, 1000 + i, (300 << 10) + i * 4096, 4096);
        }
        let mut sends = 0;
        let mut adds = 0u64;
        let n = 120u64;
        for i in 0..n {
            let len = 1 + (rng.next_u64() % (9 * 1024)) as u32;
            let off = (rng.next_u64() % (128 << 10)) & !7;
            let wr = match rng.next_u64() % 5 {
                0 | 1 => {
                    // A source buffer is not reused while its WR may be in flight.
                    let src = (i % 32) * 9216;
                    let data = pattern(i as u8, len as usize);
                    a.mem.fill_from(src as usize, &data);
                    // Later WRITEs of the same bytes win: completions are in order.
                    expect_b[off as usize..off as usize + len as usize].copy_from_slice(&data);
                    write_wr(i, &a, src, len, &b, off)
                }
                2 if sends < 40 => {
                    sends += 1;
                    let len = len.min(4096);
                    a.mem.fill_from(300 << 10, &pattern(200, len as usize));
                    send_wr(i, &a, 300 << 10, len)
                }
                3 => {
                    adds += i;
                    SendWr::new(
                        i,
                        SendOp::FetchAdd {
                            remote_addr: b.base + (900 << 10),
                            rkey: b.keys.rkey,
                            add: i,
                        },
                        vec![sge(&a, (900 << 10) + i * 8, 8)],
                    )
                }
                _ => {
                    let dst = (400 << 10) + (i % 8) * (16 << 10);
                    let len = len.min(16 << 10);
                    let src = off.min(100 << 10);
                    last_read.insert(dst, (src, len));
                    read_wr(i, &a, dst, len, &b, (512 << 10) + src)
                }
            };
            post_ok(&mut net, &a, wr);
            // Keep a window's worth in flight: wait for some completions now and then.
            if i % 30 == 29 {
                let w = wait_wcs(&mut net, &a, 30, WAIT * 4);
                assert_eq!(w.len(), 30, "seed {seed}: {:?}", statuses(&w));
                assert!(
                    w.iter().all(|c| c.status == WcStatus::Success),
                    "seed {seed}: {:?}",
                    statuses(&w)
                );
                let ids: Vec<u64> = w.iter().map(|c| c.wr_id).collect();
                assert_eq!(
                    ids,
                    (i - 29..=i).collect::<Vec<_>>(),
                    "seed {seed}: in order"
                );
            }
        }
        settle(&mut net);
        // Every WRITE landed (the last writer of each byte), the atomics
        // ran exactly once each, the receives completed in order and once.
        let got = mem(&b, 0, (128 << 10) + 9 * 1024);
        let bad = got.iter().zip(&expect_b).position(|(x, y)| x != y);
        assert_eq!(bad, None, "seed {seed}: WRITE target differs");
        assert_eq!(u64_at(&b, 900 << 10), adds, "seed {seed}");
        let src = pattern(9, 128 << 10);
        for (dst, (off, len)) in &last_read {
            let (d, o, l) = (*dst as usize, *off as usize, *len as usize);
            assert!(
                mem(&a, d, l) == src[o..o + l],
                "seed {seed}: READ into {d:#x}"
            );
        }
        let r = poll(&mut net, &b);
        assert_eq!(r.len(), sends, "seed {seed}");
        let ids: Vec<u64> = r.iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, (1000..1000 + sends as u64).collect::<Vec<_>>());
        for (k, c) in r.iter().enumerate() {
            assert_eq!(c.status, WcStatus::Success);
            let at = (300 << 10) + k * 4096;
            assert!(mem(&b, at, c.byte_len as usize) == pattern(200, c.byte_len as usize));
        }
        let ca = qp_counters(&net, &a);
        let cb = qp_counters(&net, &b);
        assert!(
            ca.sr_retransmits > 0 && cb.ooo_held > 0,
            "seed {seed}: {ca:?} {cb:?}"
        );
        assert_eq!(cb.seq_naks_sent, 0);
    }
}

#[test]
fn ece_is_negotiated_before_rtr_and_checked() {
    let mut net = SimNet::new(2, 1, net5());
    let a = make_side(&mut net, 0, QpType::Rc);
    let u = make_side(&mut net, 1, QpType::Uc);
    let e = &mut net.nodes[0];
    let sup = e.query_ece(a.qpn).unwrap();
    assert_eq!(sup, Ece::SUPPORTED);
    // Another vendor, or an unknown option: nothing agreed or refused.
    let other = Ece {
        vendor_id: 0x02c9,
        options: 1,
    };
    assert_eq!(sup.agree(other), Ece::default());
    assert!(e.set_ece(a.qpn, other).is_err());
    assert!(e.set_ece(a.qpn, Ece { options: 2, ..sup }).is_err());
    assert!(net.nodes[1].set_ece(u.qpn, sup).is_err(), "RC only");
    let e = &mut net.nodes[0];
    e.set_ece(a.qpn, sup).unwrap();
    assert_eq!(e.query_ece(a.qpn).unwrap(), sup);
    e.set_ece(a.qpn, Ece::default()).unwrap();
    let b = make_side(&mut net, 1, QpType::Rc);
    let o = ConnOpts::default();
    bring_up(&mut net, &a, &b, o.psn_a, o.psn_b, &o, QpType::Rc);
    let err = net.nodes[0].set_ece(a.qpn, sup).unwrap_err();
    assert_eq!(err.errno(), errno::EINVAL);
}

#[test]
fn an_rnr_in_the_middle_of_held_requests_keeps_them_in_place() {
    // Found by the simulation suite: SEND 0 is lost, SENDs 1..6 are held;
    // when 0 arrives again it takes the only receive, 1 draws an RNR NAK,
    // and the held 2..6 must stay at their PSNs (a slot dropped there ran
    // each later SEND one PSN early, into the wrong receive).
    let (mut net, a, b) = sr_pair(24, net5(), true);
    let _wire = drop_nth(&mut net, 0, |p| p.from == 0 && p.is(OpKind::Send));
    recv(&mut net, &b, 100, 0, 1024);
    for i in 0..7u64 {
        let len = 100 + i as usize * 10;
        a.mem
            .fill_from(i as usize * 1024, &pattern(10 + i as u8, len));
        post_ok(&mut net, &a, send_wr(i, &a, i * 1024, len as u32));
    }
    run_for(&mut net, Duration::from_micros(40));
    for k in 1..7u64 {
        recv(&mut net, &b, 100 + k, k * 1024, 1024);
    }
    let w = wait_wcs(&mut net, &a, 7, WAIT);
    assert!(
        w.iter().all(|c| c.status == WcStatus::Success),
        "{:?}",
        statuses(&w)
    );
    let r = poll(&mut net, &b);
    assert_eq!(r.len(), 7);
    for (k, c) in r.iter().enumerate() {
        let len = 100 + k * 10;
        assert_eq!(
            (c.wr_id, c.status, c.byte_len),
            (100 + k as u64, WcStatus::Success, len as u32)
        );
        assert!(
            mem(&b, k * 1024, len) == pattern(10 + k as u8, len),
            "receive {k}"
        );
    }
    assert!(qp_counters(&net, &b).rnr_naks_sent > 0, "the RNR happened");
    assert!(qp_counters(&net, &b).ooo_held >= 6);
}
