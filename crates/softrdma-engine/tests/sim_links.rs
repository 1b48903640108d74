//! Scheduled link cuts and heals in the simulator: events of their own,
//! applied at their instant, before the transmissions of that instant
//! (`softrdma_engine::sim`'s module documentation states the order).

mod common;
use std::time::Duration;

use common::*;
use softrdma_engine::sim::{LinkChange, SimNet};
use softrdma_engine::*;

fn rc_pair(timeout: u8, retry_cnt: u8) -> (SimNet, Side, Side) {
    let o = ConnOpts {
        timeout,
        retry_cnt,
        ..Default::default()
    };
    pair(21, net5(), QpType::Rc, &o)
}

fn requests_delivered_to(wire: &Wire, node: usize) -> Vec<Pkt> {
    wire.borrow()
        .iter()
        .filter(|p| !p.sent() && p.to == node && p.opcode.info().is_request)
        .cloned()
        .collect()
}

/// The clock stops at a scheduled cut even when nothing else happens then,
/// and the retransmissions after it are dropped. (The simulation harness
/// once applied cuts between steps: a step ran on to the next timer, and
/// what it transmitted there got through although the cut was due before.)
#[test]
fn a_step_never_runs_past_a_scheduled_cut() {
    let (mut net, a, b) = rc_pair(10, 3);
    let timeout = local_ack_timeout(10).unwrap();
    // The first transmission is lost; the QP then waits a whole timeout.
    let wire = drop_nth(&mut net, 0, |p| p.opcode.info().is_request);
    post_ok(&mut net, &a, write_wr(1, &a, 0, 100, &b, 0));
    let cut_at = net.now + timeout / 2;
    net.schedule_link(cut_at, 0, 1, LinkChange::Cut);
    while net.now < cut_at {
        assert!(net.step(), "the cut is an event: the network is not idle");
    }
    assert_eq!(net.now, cut_at, "the step stopped at the cut");
    assert!(net.is_cut(0, 1) && !net.is_cut(1, 0));
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(1, WcStatus::RetryExcErr)]);
    assert!(
        requests_delivered_to(&wire, 1).is_empty(),
        "a request got through the cut: {:?}",
        requests_delivered_to(&wire, 1)
    );
    assert_eq!(qp_counters(&net, &a).timeouts, 4);
}

/// A cut due at the very instant of a retransmission drops it: link changes
/// come first in an instant. A cut one nanosecond later does not: the packet
/// is on the wire by then and still arrives.
#[test]
fn a_cut_takes_effect_before_the_transmissions_of_its_instant() {
    for (offset, delivered) in [(0u64, false), (1, true)] {
        let (mut net, a, b) = rc_pair(10, 1);
        let wire = drop_nth(&mut net, 0, |p| p.opcode.info().is_request);
        let sent_at = net.now;
        post_ok(&mut net, &a, write_wr(1, &a, 0, 100, &b, 0));
        let retransmit_at = sent_at + local_ack_timeout(10).unwrap();
        let cut_at = retransmit_at + Duration::from_nanos(offset);
        net.schedule_link(cut_at, 0, 1, LinkChange::Cut);
        settle(&mut net);
        let resent = sent_where(&wire, |p| p.opcode.info().is_request && p.now > sent_at);
        assert!(
            resent.iter().any(|p| p.now == retransmit_at),
            "offset {offset}: the retransmission was not at the timeout: {resent:?}"
        );
        assert_eq!(
            !requests_delivered_to(&wire, 1).is_empty(),
            delivered,
            "offset {offset} ns"
        );
    }
}

/// Cuts of one link nest: it carries packets again once every cut is healed.
#[test]
fn overlapping_cuts_of_a_link_heal_only_when_both_have() {
    let (mut net, _a, _b) = rc_pair(10, 0);
    let t0 = net.now;
    let at = |us: u64| t0 + Duration::from_micros(us);
    net.schedule_link(at(10), 0, 1, LinkChange::Cut);
    net.schedule_link(at(30), 0, 1, LinkChange::Heal);
    net.schedule_link(at(20), 0, 1, LinkChange::Cut);
    net.schedule_link(at(40), 0, 1, LinkChange::Heal);
    let mut seen = Vec::new();
    for us in [5, 10, 25, 30, 35, 40, 45] {
        net.advance_to(at(us));
        seen.push((us, net.is_cut(0, 1)));
    }
    assert_eq!(
        seen,
        vec![
            (5, false),
            (10, true),
            (25, true),
            (30, true),
            (35, true),
            (40, false),
            (45, false)
        ]
    );
    assert!(!net.is_cut(1, 0), "the other direction was never cut");
}
