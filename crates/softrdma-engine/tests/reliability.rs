//! The reliable transport's rules, observed on the wire: go-back-N on a
//! sequence NAK, retransmission on the local ACK timeout, duplicate
//! detection (SEND and WRITE re-acknowledged, atomics replayed, never
//! re-executed), READ retry from the first missing response, the
//! max_rd_atomic limit, the window, ACK coalescing, end-to-end credits and
//! PSN wrap-around; plus regressions for the completer bugs the simulation
//! found.

mod common;
use std::time::Duration;

use common::*;
use softrdma_engine::sim::{SimNet, Verdict};
use softrdma_engine::*;
use softrdma_wire::{aeth, AethRepr, BthRepr, Headers, NakCode, OpKind, Opcode, Psn, Syndrome};

const PSN_A: u32 = 0x100; // ConnOpts::default().psn_a: a's first PSN

fn rc() -> (SimNet, Side, Side) {
    pair(21, net5(), QpType::Rc, &ConnOpts::default())
}

fn from_a(p: &Pkt) -> bool {
    p.from == 0
}

fn from_b(p: &Pkt) -> bool {
    p.from == 1
}

fn is_ack(p: &Pkt) -> bool {
    p.kind == OpKind::Ack
}

#[test]
fn go_back_n_after_one_lost_packet() {
    let (mut net, a, b) = rc();
    // Drop the 4th packet of a 10-packet WRITE.
    let wire = drop_nth(&mut net, 3, |p| from_a(p) && p.is(OpKind::Write));
    a.mem.fill_from(0, &pattern(1, 10 * 1024));
    post_ok(&mut net, &a, write_wr(1, &a, 0, 10 * 1024, &b, 0));
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);
    assert_eq!(mem(&b, 0, 10 * 1024), pattern(1, 10 * 1024));
    // One NAK, for the lost PSN, although six packets came out of order.
    let naks = sent_where(&wire, |p| from_b(p) && p.is_nak());
    assert_eq!(naks.len(), 1, "{naks:?}");
    assert_eq!(naks[0].psn, PSN_A + 3);
    assert_eq!(
        naks[0].syndrome,
        Some(Syndrome::Nak(NakCode::PsnSequenceError))
    );
    let cb = qp_counters(&net, &b);
    assert_eq!((cb.seq_naks_sent, cb.out_of_sequence), (1, 6));
    let ca = qp_counters(&net, &a);
    assert_eq!(ca.seq_naks_rcvd, 1);
    assert_eq!(ca.timeouts, 0, "the NAK, not the timer, recovered");
    // Go back N: PSNs 3..9 again, nothing before.
    assert_eq!(ca.retransmits, 7);
    let psns: Vec<u32> = sent_where(&wire, from_a).iter().map(|p| p.psn).collect();
    let want: Vec<u32> = (0..10).chain(3..10).map(|i| PSN_A + i).collect();
    assert_eq!(psns, want);
}

#[test]
fn lost_last_packet_is_recovered_by_the_ack_timeout() {
    let (mut net, a, b) = rc();
    let wire = drop_nth(&mut net, 3, |p| from_a(p) && p.is(OpKind::Write));
    a.mem.fill_from(0, &pattern(2, 4096));
    let t0 = net.now;
    post_ok(&mut net, &a, write_wr(1, &a, 0, 4096, &b, 0));
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);
    let t = local_ack_timeout(ConnOpts::default().timeout).unwrap();
    let took = net.now - t0;
    assert!(
        took >= t && took < t + Duration::from_micros(50),
        "{took:?}"
    );
    let ca = qp_counters(&net, &a);
    assert_eq!((ca.timeouts, ca.seq_naks_rcvd), (1, 0));
    // Nothing asked for an ACK before the last packet: all four go again,
    // and the three that had arrived are duplicates at the responder.
    assert_eq!(ca.retransmits, 4);
    assert_eq!(qp_counters(&net, &b).duplicates, 3);
    assert_eq!(mem(&b, 0, 4096), pattern(2, 4096));
    // The four arrive together: one ACK for duplicates and new alike.
    assert_eq!(sent_where(&wire, |p| from_b(p) && is_ack(p)).len(), 1);
}

#[test]
fn lost_ack_is_recovered_by_the_ack_timeout() {
    let (mut net, a, b) = rc();
    let wire = drop_nth(&mut net, 0, |p| from_b(p) && is_ack(p));
    recv(&mut net, &b, 9, 0, 100);
    recv(&mut net, &b, 10, 100, 100);
    a.mem.fill_from(0, &pattern(3, 50));
    post_ok(&mut net, &a, send_wr(1, &a, 0, 50));
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);
    assert_eq!(qp_counters(&net, &a).timeouts, 1);
    // The retransmitted SEND was a duplicate: re-acknowledged, not delivered again.
    assert_eq!(qp_counters(&net, &b).duplicates, 1);
    assert_eq!(statuses(&poll(&mut net, &b)), vec![(9, WcStatus::Success)]);
    let acks = sent_where(&wire, |p| from_b(p) && is_ack(p));
    assert_eq!(acks.len(), 2);
    assert!(acks.iter().all(|p| p.psn == PSN_A));
    // The second receive is still there for the next message.
    post_ok(&mut net, &a, send_wr(2, &a, 0, 50));
    wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&poll(&mut net, &b)), vec![(10, WcStatus::Success)]);
}

/// Runs `wr` on a fresh pair, captures its (single) request packet, waits for
/// the completion and returns everything for a replay.
fn capture(wr: impl FnOnce(&Side, &Side) -> SendWr) -> (SimNet, Side, Side, Pkt, Wire) {
    let (mut net, a, b) = rc();
    let wire = sniff(&mut net);
    let wr = wr(&a, &b);
    post_ok(&mut net, &a, wr);
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(w[0].status, WcStatus::Success);
    let req = sent_where(&wire, from_a).remove(0);
    (net, a, b, req, wire)
}

#[test]
fn duplicate_send_is_acknowledged_not_delivered_again() {
    let (mut net, a, b) = rc();
    recv(&mut net, &b, 9, 0, 100);
    recv(&mut net, &b, 10, 100, 100);
    // The network delivers the SEND twice.
    let mut once = true;
    let wire = tap(&mut net, move |p| {
        if p.from == 0 && p.is(OpKind::Send) && std::mem::take(&mut once) {
            Verdict::Duplicate
        } else {
            Verdict::Pass
        }
    });
    a.mem.fill_from(0, &pattern(4, 60));
    post_ok(&mut net, &a, send_wr(1, &a, 0, 60));
    wait_wcs(&mut net, &a, 1, LONG);
    settle(&mut net);
    assert_eq!(statuses(&poll(&mut net, &b)), vec![(9, WcStatus::Success)]);
    assert_eq!(qp_counters(&net, &b).duplicates, 1);
    // Both copies arrived together: one (coalesced) ACK answers both.
    assert_eq!(sent_where(&wire, |p| from_b(p) && is_ack(p)).len(), 1);
    // A replay much later is a duplicate too, and acknowledged again.
    let req = sent_where(&wire, from_a).remove(0);
    inject(&mut net, 1, req.ep, &req.bytes);
    settle(&mut net);
    assert!(poll(&mut net, &b).is_empty());
    assert_eq!(qp_counters(&net, &b).duplicates, 2);
    let acks = sent_where(&wire, |p| from_b(p) && is_ack(p));
    assert_eq!(acks.len(), 2);
    assert_eq!(acks[1].psn, PSN_A);
    assert!(
        poll(&mut net, &a).is_empty(),
        "the extra ACK completes nothing"
    );
    // The next SEND gets the second receive.
    a.mem.fill_from(0, &pattern(5, 60));
    post_ok(&mut net, &a, send_wr(2, &a, 0, 60));
    wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&poll(&mut net, &b)), vec![(10, WcStatus::Success)]);
    assert_eq!(mem(&b, 100, 60), pattern(5, 60));
    assert_eq!(mem(&b, 0, 60), pattern(4, 60));
}

#[test]
fn duplicate_write_is_not_executed_again() {
    let (mut net, a, b, req, wire) = capture(|a, b| {
        a.mem.fill_from(0, &pattern(6, 200));
        write_wr(1, a, 0, 200, b, 1000)
    });
    assert_eq!(mem(&b, 1000, 200), pattern(6, 200));
    // The application on b reuses the buffer; then the old WRITE shows up again.
    b.mem.fill_from(1000, &[0x77; 200]);
    let acks_before = sent_where(&wire, |p| from_b(p) && is_ack(p)).len();
    inject(&mut net, 1, req.ep, &req.bytes);
    settle(&mut net);
    assert_eq!(
        mem(&b, 1000, 200),
        vec![0x77; 200],
        "duplicate WRITE executed"
    );
    assert_eq!(qp_counters(&net, &b).duplicates, 1);
    let acks = sent_where(&wire, |p| from_b(p) && is_ack(p));
    assert_eq!(
        acks.len(),
        acks_before + 1,
        "a duplicate is re-acknowledged"
    );
    assert_eq!(acks.last().unwrap().psn, PSN_A);
    assert!(poll(&mut net, &a).is_empty());
}

#[test]
fn duplicate_atomic_is_replayed_never_executed_again() {
    // FETCH_ADD +5 on 10, then CMP_SWAP 15 -> 99: each replayed afterwards.
    let (mut net, a, b) = rc();
    let wire = sniff(&mut net);
    b.mem.fill_from(8, &10u64.to_ne_bytes());
    post_ok(
        &mut net,
        &a,
        SendWr::new(
            1,
            SendOp::FetchAdd {
                remote_addr: b.base + 8,
                rkey: b.keys.rkey,
                add: 5,
            },
            vec![sge(&a, 0, 8)],
        ),
    );
    post_ok(
        &mut net,
        &a,
        SendWr::new(
            2,
            SendOp::CompareSwap {
                remote_addr: b.base + 8,
                rkey: b.keys.rkey,
                compare: 15,
                swap: 99,
            },
            vec![sge(&a, 8, 8)],
        ),
    );
    let w = wait_wcs(&mut net, &a, 2, LONG);
    assert_eq!(
        statuses(&w),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!((u64_at(&a, 0), u64_at(&a, 8), u64_at(&b, 8)), (10, 15, 99));
    let reqs = sent_where(&wire, from_a);
    assert_eq!(reqs.len(), 2);
    // The application changes the word; the old requests arrive again.
    b.mem.fill_from(8, &1000u64.to_ne_bytes());
    for r in &reqs {
        inject(&mut net, 1, r.ep, &r.bytes);
    }
    settle(&mut net);
    assert_eq!(u64_at(&b, 8), 1000, "a duplicate atomic was executed again");
    // The replies carry the saved original values.
    let acks: Vec<(u32, Option<u64>)> = sent_where(&wire, |p| from_b(p) && p.is(OpKind::AtomicAck))
        .iter()
        .map(|p| (p.psn, p.atomic_orig))
        .collect();
    assert_eq!(
        acks,
        vec![
            (PSN_A, Some(10)),
            (PSN_A + 1, Some(15)),
            (PSN_A, Some(10)),
            (PSN_A + 1, Some(15)),
        ]
    );
    assert_eq!(qp_counters(&net, &b).duplicates, 2);
    assert!(poll(&mut net, &a).is_empty());
}

#[test]
fn duplicate_atomic_older_than_the_saved_results_is_not_executed() {
    // Only one saved result (max_dest_rd_atomic 1): a duplicate of an older
    // atomic cannot be answered, and must still not execute.
    let o = ConnOpts {
        rd_atomic: 1,
        ..Default::default()
    };
    let (mut net, a, b) = pair(22, net5(), QpType::Rc, &o);
    let wire = sniff(&mut net);
    for i in 0..2 {
        post_ok(
            &mut net,
            &a,
            SendWr::new(
                i,
                SendOp::FetchAdd {
                    remote_addr: b.base,
                    rkey: b.keys.rkey,
                    add: 1,
                },
                vec![sge(&a, 8 * i, 8)],
            ),
        );
    }
    wait_wcs(&mut net, &a, 2, LONG);
    assert_eq!(u64_at(&b, 0), 2);
    let first = sent_where(&wire, from_a).remove(0);
    inject(&mut net, 1, first.ep, &first.bytes);
    settle(&mut net);
    assert_eq!(u64_at(&b, 0), 2);
    assert_eq!(
        sent_where(&wire, |p| from_b(p) && p.is(OpKind::AtomicAck)).len(),
        2
    );
}

#[test]
fn read_retry_resumes_at_the_first_missing_response() {
    let (mut net, a, b) = rc();
    b.mem.fill_from(0, &pattern(7, 10 * 1024));
    // Lose the 5th response (PSN_A + 4) once.
    let wire = drop_nth(&mut net, 0, |p| {
        from_b(p) && p.is(OpKind::ReadResponse) && p.psn == PSN_A + 4
    });
    post_ok(&mut net, &a, read_wr(1, &a, 0, 10 * 1024, &b, 0));
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);
    assert_eq!(w[0].byte_len, 10 * 1024);
    assert_eq!(mem(&a, 0, 10 * 1024), pattern(7, 10 * 1024));
    let reqs = sent_where(&wire, |p| from_a(p) && p.is(OpKind::ReadRequest));
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    let again = &reqs[1];
    assert_eq!(again.psn, PSN_A + 4);
    let reth = again.reth.unwrap();
    assert_eq!(reth.va, b.base + 4 * 1024);
    assert_eq!(reth.dma_len, 6 * 1024);
    assert_eq!(reth.rkey, b.keys.rkey.raw());
    // The responses before the gap were not asked for again.
    for i in 0..4 {
        let n = sent_where(&wire, |p| from_b(p) && p.psn == PSN_A + i).len();
        assert_eq!(n, 1, "response {i} sent {n} times");
    }
    assert_eq!(qp_counters(&net, &a).timeouts, 0);
}

#[test]
fn read_is_not_completed_by_a_later_reads_response() {
    // Regression: a response for READ 2 implicitly completed READ 1 whose
    // response was lost, with garbage in its buffer.
    let (mut net, a, b) = rc();
    b.mem.fill_from(0, &pattern(8, 200));
    let wire = drop_nth(&mut net, 0, |p| from_b(p) && p.is(OpKind::ReadResponse));
    post_ok(&mut net, &a, read_wr(1, &a, 0, 100, &b, 0));
    post_ok(&mut net, &a, read_wr(2, &a, 100, 100, &b, 100));
    let w = wait_wcs(&mut net, &a, 2, LONG);
    assert_eq!(
        statuses(&w),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(mem(&a, 0, 200), pattern(8, 200));
    // READ 1 was asked for again when READ 2's response showed the gap.
    let reqs = sent_where(&wire, |p| from_a(p) && p.is(OpKind::ReadRequest));
    assert_eq!(reqs[2].psn, PSN_A, "{reqs:?}");
    assert_eq!(qp_counters(&net, &a).timeouts, 0);
}

#[test]
fn atomic_is_not_completed_before_an_earlier_reads_response() {
    let (mut net, a, b) = rc();
    b.mem.fill_from(0, &pattern(9, 100));
    b.mem.fill_from(1024, &7u64.to_ne_bytes());
    drop_nth(&mut net, 0, |p| from_b(p) && p.is(OpKind::ReadResponse));
    post_ok(&mut net, &a, read_wr(1, &a, 0, 100, &b, 0));
    post_ok(
        &mut net,
        &a,
        SendWr::new(
            2,
            SendOp::FetchAdd {
                remote_addr: b.base + 1024,
                rkey: b.keys.rkey,
                add: 1,
            },
            vec![sge(&a, 200, 8)],
        ),
    );
    let w = wait_wcs(&mut net, &a, 2, LONG);
    assert_eq!(
        statuses(&w),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(mem(&a, 0, 100), pattern(9, 100));
    assert_eq!((u64_at(&a, 200), u64_at(&b, 1024)), (7, 8));
}

#[test]
fn max_rd_atomic_bounds_outstanding_reads_and_atomics() {
    for limit in [1u8, 2, 4] {
        let o = ConnOpts {
            rd_atomic: limit,
            ..Default::default()
        };
        let (mut net, a, b) = pair(23, net5(), QpType::Rc, &o);
        let wire = sniff(&mut net);
        b.mem.fill_from(0, &pattern(1, 64 * 1024));
        for i in 0..12u64 {
            let wr = if i % 4 == 3 {
                SendWr::new(
                    i,
                    SendOp::FetchAdd {
                        remote_addr: b.base + 0x10000,
                        rkey: b.keys.rkey,
                        add: 1,
                    },
                    vec![sge(&a, 0x10000 + 8 * i, 8)],
                )
            } else {
                read_wr(i, &a, 4096 * i, 3000, &b, 4096 * i)
            };
            post_ok(&mut net, &a, wr);
            // A WRITE in between does not count.
            post_ok(
                &mut net,
                &a,
                unsignaled(write_wr(100 + i, &a, 0, 10, &b, 0x20000)),
            );
        }
        let w = wait_wcs(&mut net, &a, 12, LONG);
        assert!(w.iter().all(|w| w.status == WcStatus::Success));
        // Replay the wire in order: requests out minus requests answered.
        let mut out = 0i32;
        let mut max = 0;
        for p in wire.borrow().iter() {
            if p.sent() && p.from == 0 && matches!(p.kind, OpKind::ReadRequest | OpKind::FetchAdd) {
                out += 1;
                max = max.max(out);
            }
            let answered = !p.sent()
                && p.to == 0
                && (p.kind == OpKind::AtomicAck
                    || (p.kind == OpKind::ReadResponse
                        && matches!(
                            p.opcode,
                            Opcode::RC_READ_RESPONSE_LAST | Opcode::RC_READ_RESPONSE_ONLY
                        )));
            if answered {
                out -= 1;
            }
        }
        assert_eq!(max, i32::from(limit), "limit {limit}");
        assert_eq!(out, 0);
    }
}

#[test]
fn the_window_bounds_unacknowledged_packets() {
    let (mut net, a, b) = pair_cfg(24, net5(), QpType::Rc, &ConnOpts::default(), |c| {
        c.max_inflight = 8;
        c.ack_req_every = 4;
    });
    let wire = sniff(&mut net);
    a.mem.fill_from(0, &pattern(2, 100 * 1024));
    post_ok(&mut net, &a, write_wr(1, &a, 0, 100 * 1024, &b, 0));
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);
    assert_eq!(mem(&b, 0, 100 * 1024), pattern(2, 100 * 1024));
    let mut acked = PSN_A; // next unacknowledged
    let mut max = 0;
    for p in wire.borrow().iter() {
        if p.sent() && p.from == 0 {
            max = max.max(p.psn - acked + 1);
        }
        if !p.sent() && p.to == 0 && is_ack(p) {
            acked = acked.max(p.psn + 1);
        }
    }
    assert_eq!(max, 8);
    // An ACK request at least every 4 packets.
    let reqs = sent_where(&wire, |p| from_a(p) && p.ack_req);
    assert!(reqs.len() >= 25, "{}", reqs.len());
}

#[test]
fn acks_are_coalesced() {
    let (mut net, a, b) = rc();
    let wire = sniff(&mut net);
    // 32 single-packet WRITEs leave together and arrive together.
    for i in 0..32 {
        let wr = write_wr(i, &a, 0, 100, &b, 100 * i);
        post_ok(&mut net, &a, if i == 31 { wr } else { unsignaled(wr) });
    }
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(31, WcStatus::Success)]);
    let asked = sent_where(&wire, |p| from_a(p) && p.ack_req).len();
    let acks = sent_where(&wire, |p| from_b(p) && is_ack(p));
    assert_eq!(asked, 32, "each message asks for an ACK");
    assert_eq!(acks.len(), 1, "one ACK stands for all: {acks:?}");
    assert_eq!(acks[0].psn, PSN_A + 31);
}

#[test]
fn ack_requests_every_n_packets_of_a_long_message() {
    let (mut net, a, b) = pair_cfg(25, net5(), QpType::Rc, &ConnOpts::default(), |c| {
        c.ack_req_every = 32
    });
    let wire = sniff(&mut net);
    post_ok(&mut net, &a, write_wr(1, &a, 0, 100 * 1024, &b, 0));
    wait_wcs(&mut net, &a, 1, LONG);
    let asked: Vec<u32> = sent_where(&wire, |p| from_a(p) && p.ack_req)
        .iter()
        .map(|p| p.psn - PSN_A)
        .collect();
    assert_eq!(asked, vec![31, 63, 95, 99]);
    assert!(sent_where(&wire, |p| from_b(p) && is_ack(p)).len() <= 4);
}

fn credits_of(p: &Pkt) -> Option<u32> {
    match p.syndrome {
        Some(Syndrome::Ack { credits }) => aeth::credits_from_code(credits),
        _ => None,
    }
}

#[test]
fn credits_hold_sends_the_responder_cannot_take() {
    let o = ConnOpts {
        min_rnr_timer: 1,
        ..Default::default()
    };
    let (mut net, a, b) = pair(26, net5(), QpType::Rc, &o);
    let wire = sniff(&mut net);
    recv(&mut net, &b, 100, 0, 100);
    recv(&mut net, &b, 101, 100, 100);
    post_ok(&mut net, &a, send_wr(1, &a, 0, 10));
    wait_wcs(&mut net, &a, 1, LONG);
    // The ACK advertised the one receive left.
    let acks = sent_where(&wire, |p| from_b(p) && is_ack(p));
    assert_eq!(credits_of(&acks[0]), Some(1));
    for i in 2..=6 {
        post_ok(&mut net, &a, send_wr(i, &a, 0, 10));
    }
    run_for(&mut net, Duration::from_millis(1));
    // SEND 2 used the credit; the ACK for it said 0; from then on only SEND 3
    // goes, alone, probing (and getting RNR NAKs).
    let sends: Vec<u32> = sent_where(&wire, |p| from_a(p) && p.is(OpKind::Send))
        .iter()
        .map(|p| p.psn - PSN_A)
        .collect();
    assert!(sends.len() > 10, "the probe repeats: {sends:?}");
    assert_eq!(&sends[..2], &[0, 1]);
    assert!(sends[2..].iter().all(|&p| p == 2), "{sends:?}");
    let acks = sent_where(&wire, |p| from_b(p) && is_ack(p) && !p.is_nak());
    assert_eq!(credits_of(&acks[1]), Some(0));
    assert!(qp_counters(&net, &b).rnr_naks_sent > 5);
    assert_eq!(qp_counters(&net, &a).seq_naks_rcvd, 0);
    // Three more receives: 3 goes through; the ACK grants 2 more at once.
    for i in 0..3 {
        recv(&mut net, &b, 102 + i, 200 + 100 * i, 100);
    }
    let w = wait_wcs(&mut net, &a, 3, LONG);
    assert_eq!(
        statuses(&w),
        vec![
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success)
        ]
    );
    // Waiting for credits is not an error: 6 still waits for a receive.
    recv(&mut net, &b, 105, 500, 100);
    recv(&mut net, &b, 106, 600, 100);
    let w = wait_wcs(&mut net, &a, 2, LONG);
    assert_eq!(
        statuses(&w),
        vec![(5, WcStatus::Success), (6, WcStatus::Success)]
    );
    let r = poll(&mut net, &b);
    assert_eq!(
        statuses(&r),
        (100..106)
            .map(|i| (i, WcStatus::Success))
            .collect::<Vec<_>>()
    );
}

#[test]
fn srq_responders_advertise_no_credit_limit() {
    let mut net = SimNet::new(2, 27, net5());
    let a = make_side(&mut net, 0, QpType::Rc);
    let bpd_cq = {
        let e = &mut net.nodes[1];
        let pd = e.alloc_pd();
        (pd, e.create_cq(64).unwrap())
    };
    let e = &mut net.nodes[1];
    let srq = e
        .create_srq(
            bpd_cq.0,
            SrqInit {
                max_wr: 64,
                max_sge: 2,
                limit: 0,
            },
        )
        .unwrap();
    let bmem = std::sync::Arc::new(VecMemory::new(1 << 16));
    let bkeys = e
        .reg_mr(bpd_cq.0, 0x5000_0000, all_access(), bmem.clone())
        .unwrap();
    let bqpn = e
        .create_qp(QpInit {
            pd: bpd_cq.0,
            qp_type: QpType::Rc,
            send_cq: bpd_cq.1,
            recv_cq: bpd_cq.1,
            srq: Some(srq),
            cap: qp_cap(),
            sq_sig_all: false,
        })
        .unwrap();
    let b = Side {
        node: 1,
        pd: bpd_cq.0,
        cq: bpd_cq.1,
        qpn: bqpn,
        mem: bmem,
        keys: bkeys,
        base: 0x5000_0000,
    };
    let o = ConnOpts::default();
    bring_up(&mut net, &a, &b, o.psn_a, o.psn_b, &o, QpType::Rc);
    bring_up(&mut net, &b, &a, o.psn_b, o.psn_a, &o, QpType::Rc);
    // Posting to the QP itself is refused.
    assert!(net.nodes[1]
        .post_recv(
            b.qpn,
            &RecvWr {
                wr_id: 1,
                sg_list: vec![]
            }
        )
        .is_err());
    let wire = sniff(&mut net);
    for i in 0..4 {
        net.nodes[1]
            .post_srq_recv(
                srq,
                &RecvWr {
                    wr_id: 50 + i,
                    sg_list: vec![Sge {
                        addr: b.base + 100 * i,
                        length: 100,
                        lkey: b.keys.lkey,
                    }],
                },
            )
            .unwrap();
    }
    for i in 0..4 {
        a.mem.fill_from(10 * i as usize, &pattern(i as u8, 10));
        post_ok(&mut net, &a, send_wr(i, &a, 10 * i, 10));
    }
    wait_wcs(&mut net, &a, 4, LONG);
    let acks = sent_where(&wire, |p| from_b(p) && is_ack(p));
    assert!(acks.iter().all(|p| p.syndrome
        == Some(Syndrome::Ack {
            credits: aeth::CREDITS_INVALID
        })));
    let r = poll(&mut net, &b);
    assert_eq!(
        statuses(&r),
        (0..4)
            .map(|i| (50 + i, WcStatus::Success))
            .collect::<Vec<_>>()
    );
    for i in 0..4usize {
        assert_eq!(mem(&b, 100 * i, 10), pattern(i as u8, 10));
    }
}

#[test]
fn psns_wrap_around() {
    let o = ConnOpts {
        psn_a: 0xFF_FFF8,
        psn_b: 0xFF_FFFE,
        ..Default::default()
    };
    let (mut net, a, b) = pair(28, net5(), QpType::Rc, &o);
    // Lose the packet with PSN 2 (after the wrap) once, and one READ response
    // after the wrap too.
    let wire = drop_nth(&mut net, 0, |p| {
        p.psn == 2 && (from_a(p) || p.is(OpKind::ReadResponse))
    });
    a.mem.fill_from(0, &pattern(3, 20 * 1024));
    post_ok(&mut net, &a, write_wr(1, &a, 0, 20 * 1024, &b, 0));
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);
    assert_eq!(mem(&b, 0, 20 * 1024), pattern(3, 20 * 1024));
    let psns: Vec<u32> = sent_where(&wire, from_a).iter().map(|p| p.psn).collect();
    assert_eq!(
        psns[..10],
        [
            0xFF_FFF8, 0xFF_FFF9, 0xFF_FFFA, 0xFF_FFFB, 0xFF_FFFC, 0xFF_FFFD, 0xFF_FFFE, 0xFF_FFFF,
            0, 1
        ]
    );
    assert_eq!(qp_counters(&net, &a).seq_naks_rcvd, 1);
    // b reads across its own wrap.
    b.mem.fill_from(0x40000, &pattern(4, 8 * 1024));
    let drop_resp = drop_nth(&mut net, 0, |p| {
        from_a(p) && p.is(OpKind::ReadResponse) && p.psn == 2
    });
    post_ok(&mut net, &b, read_wr(7, &b, 0x40000, 8 * 1024, &a, 0x40000));
    a.mem.fill_from(0x40000, &pattern(5, 8 * 1024));
    let w = wait_wcs(&mut net, &b, 1, LONG);
    assert_eq!(statuses(&w), vec![(7, WcStatus::Success)]);
    assert_eq!(mem(&b, 0x40000, 8 * 1024), pattern(5, 8 * 1024));
    let resp: Vec<u32> = sent_where(&drop_resp, |p| from_a(p) && p.is(OpKind::ReadResponse))
        .iter()
        .map(|p| p.psn)
        .collect();
    assert_eq!(resp[..8], [0xFF_FFFE, 0xFF_FFFF, 0, 1, 2, 3, 4, 5]);
    assert!(resp[8..].starts_with(&[2, 3, 4, 5]), "{resp:?}");
}

// ----- regressions for completer bugs found by the simulation -----

#[test]
fn an_ack_for_a_wqe_being_retransmitted_completes_it() {
    // Regression: an ACK covering the WQE the requester had just rewound
    // into (a sequence NAK and a reordered later ACK handled in the same
    // batch) did not complete it but moved una past the send PSN; the QP
    // then believed 2^24 packets were in flight and stalled until
    // RETRY_EXC_ERR.
    let (mut net, a, b) = rc();
    net.set_partition(1, 0, true); // b's own answers are lost
    a.mem.fill_from(0, &pattern(6, 4096));
    post_ok(&mut net, &a, write_wr(1, &a, 0, 4096, &b, 0));
    run_for(&mut net, Duration::from_micros(100));
    assert_eq!(mem(&b, 0, 4096), pattern(6, 4096), "b has the WRITE");
    let aeth = |syndrome| {
        Headers::Aeth(AethRepr {
            syndrome,
            msn: softrdma_wire::Msn::new(1),
        })
    };
    // A NAK for the first PSN, then the ACK for the last, back to back.
    forge(
        &mut net,
        &b,
        &a,
        BthRepr::new(Opcode::RC_ACK, a.qpn.raw(), Psn::new(PSN_A)),
        aeth(Syndrome::Nak(NakCode::PsnSequenceError)),
        &[],
    );
    forge(
        &mut net,
        &b,
        &a,
        BthRepr::new(Opcode::RC_ACK, a.qpn.raw(), Psn::new(PSN_A + 3)),
        aeth(Syndrome::Ack { credits: 31 }),
        &[],
    );
    assert_eq!(statuses(&poll(&mut net, &a)), vec![(1, WcStatus::Success)]);
    net.set_partition(1, 0, false);
    let wire = sniff(&mut net);
    let t0 = net.now;
    post_ok(&mut net, &a, write_wr(2, &a, 0, 100, &b, 8192));
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(2, WcStatus::Success)]);
    assert!(
        net.now - t0 < Duration::from_micros(100),
        "took {:?}",
        net.now - t0
    );
    assert_eq!(qp_counters(&net, &a).timeouts, 0);
    // Nothing of WR 1 was sent again; WR 2 has the next PSN.
    let psns: Vec<u32> = sent_where(&wire, from_a).iter().map(|p| p.psn).collect();
    assert_eq!(psns, vec![PSN_A + 4]);
}

#[test]
fn a_stale_nak_is_ignored() {
    // Regression: a sequence NAK for una - 1 (overtaken by the ACK that
    // followed it) rewound into completed work and re-used its PSNs.
    let (mut net, a, b) = rc();
    post_ok(&mut net, &a, write_wr(1, &a, 0, 10, &b, 0));
    wait_wcs(&mut net, &a, 1, LONG);
    let wire = sniff(&mut net);
    for syndrome in [
        Syndrome::Nak(NakCode::PsnSequenceError),
        Syndrome::RnrNak { timer: 20 },
        Syndrome::Nak(NakCode::RemoteAccessError),
    ] {
        forge(
            &mut net,
            &b,
            &a,
            BthRepr::new(Opcode::RC_ACK, a.qpn.raw(), Psn::new(PSN_A)),
            Headers::Aeth(AethRepr {
                syndrome,
                msn: softrdma_wire::Msn::new(1),
            }),
            &[],
        );
    }
    settle(&mut net);
    assert!(sent_where(&wire, from_a).is_empty(), "{:?}", wire.borrow());
    assert_eq!(net.nodes[0].qp_state(a.qpn), Some(QpState::Rts));
    a.mem.fill_from(0, &pattern(7, 10));
    post_ok(&mut net, &a, write_wr(2, &a, 0, 10, &b, 100));
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(2, WcStatus::Success)]);
    assert_eq!(sent_where(&wire, from_a)[0].psn, PSN_A + 1, "PSN re-used");
    assert_eq!(mem(&b, 100, 10), pattern(7, 10));
}

#[test]
fn a_stale_duplicate_read_does_not_use_up_responder_resources() {
    // Regression: each duplicate READ queued responses that counted against
    // max_dest_rd_atomic, so a legal READ right behind a stale duplicate
    // was refused with an invalid-request NAK.
    let o = ConnOpts {
        rd_atomic: 1,
        ..Default::default()
    };
    let (mut net, a, b) = pair(29, net5(), QpType::Rc, &o);
    b.mem.fill_from(0, &pattern(8, 2048));
    let wire = sniff(&mut net);
    post_ok(&mut net, &a, read_wr(1, &a, 0, 1024, &b, 0));
    wait_wcs(&mut net, &a, 1, LONG);
    let old = sent_where(&wire, from_a).remove(0);
    // Hold the next READ's request, then deliver the old one and it together.
    let held = tap(&mut net, |p| {
        if p.from == 0 {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    post_ok(&mut net, &a, read_wr(2, &a, 4096, 1024, &b, 1024));
    net.step();
    let new = sent_where(&held, from_a).remove(0);
    net.set_tap(None);
    inject(&mut net, 1, old.ep, &old.bytes);
    inject(&mut net, 1, new.ep, &new.bytes);
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(2, WcStatus::Success)]);
    assert_eq!(mem(&a, 4096, 1024), pattern(8, 2048)[1024..].to_vec());
    assert_eq!(qp_counters(&net, &b).error_naks_sent, 0);
}

#[test]
fn uc_completes_on_transmission_even_if_nothing_arrives() {
    let (mut net, a, b) = pair(30, net5(), QpType::Uc, &ConnOpts::default());
    net.set_partition(0, 1, true);
    recv(&mut net, &b, 9, 0, 100);
    post_ok(&mut net, &a, send_wr(1, &a, 0, 10));
    post_ok(&mut net, &a, write_wr(2, &a, 0, 10, &b, 0));
    let w = wait_wcs(&mut net, &a, 2, LONG);
    assert_eq!(
        statuses(&w),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    settle(&mut net);
    assert!(poll(&mut net, &b).is_empty());
}

#[test]
fn naks_beyond_a_read_missing_its_responses_do_not_spend_retries() {
    // A READ's responses are held back while the responder, past the READ,
    // keeps NAKing later requests that arrive out of order. Those NAKs show
    // a live responder: they must not use up the transport retries.
    let o = ConnOpts {
        retry_cnt: 2,
        ..Default::default()
    };
    let (mut net, a, b) = pair(61, net5(), QpType::Rc, &o);
    b.mem.fill_from(0, &pattern(9, 4096));
    let held = tap(&mut net, |p| {
        if p.from == 1 && p.is(OpKind::ReadResponse) {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    post_ok(&mut net, &a, read_wr(1, &a, 0, 4096, &b, 0)); // PSNs +0..+3
    post_ok(&mut net, &a, write_wr(2, &a, 0, 10, &b, 8192)); // +4
    run_for(&mut net, Duration::from_micros(50));
    let aeth = |psn| {
        (
            BthRepr::new(Opcode::RC_ACK, a.qpn.raw(), Psn::new(psn)),
            Headers::Aeth(AethRepr {
                syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                msn: softrdma_wire::Msn::new(1),
            }),
        )
    };
    for _ in 0..6 {
        let (bth, h) = aeth(PSN_A + 4);
        forge(&mut net, &b, &a, bth, h, &[]);
        run_for(&mut net, Duration::from_micros(20));
    }
    assert!(poll(&mut net, &a).is_empty(), "gave up on a live responder");
    assert_eq!(net.nodes[0].qp_state(a.qpn), Some(QpState::Rts));
    // The READ is asked for again after each; once responses get through,
    // everything completes.
    assert!(sent_where(&held, |p| from_a(p) && p.is(OpKind::ReadRequest)).len() >= 2);
    net.set_tap(None);
    let w = wait_wcs(&mut net, &a, 2, LONG);
    assert_eq!(
        statuses(&w),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(mem(&a, 0, 4096), pattern(9, 4096));
    // A NAK of una itself still counts: three of them exhaust retry_cnt 2.
    let (mut net, a, b) = pair(62, net5(), QpType::Rc, &o);
    net.set_partition(1, 0, true);
    post_ok(&mut net, &a, write_wr(1, &a, 0, 10, &b, 0));
    run_for(&mut net, Duration::from_micros(50));
    for i in 0..3 {
        assert!(poll(&mut net, &a).is_empty(), "failed after {i} NAKs");
        forge(
            &mut net,
            &b,
            &a,
            BthRepr::new(Opcode::RC_ACK, a.qpn.raw(), Psn::new(PSN_A)),
            Headers::Aeth(AethRepr {
                syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                msn: softrdma_wire::Msn::new(1),
            }),
            &[],
        );
    }
    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![(1, WcStatus::RetryExcErr)]
    );
}
