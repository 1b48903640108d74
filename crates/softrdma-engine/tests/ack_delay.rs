//! `EngineConfig::ack_delay_ns`: a lone positive ACK waits for a request of
//! its own QP (and then follows it out), or for the delay to pass; NAKs and
//! READ responses never wait. The engines are driven by hand here so that
//! each packet's order and time can be checked.

mod common;
use common::*;
use softrdma_engine::sim::NetConfig;
use softrdma_engine::*;
use softrdma_wire::{Endpoints, OpKind, PacketRepr, Syndrome};

const DELAY: u64 = 20_000;

fn delayed_pair() -> (softrdma_engine::sim::SimNet, Side, Side) {
    pair_cfg(
        41,
        NetConfig::perfect(),
        QpType::Rc,
        &ConnOpts::default(),
        |c| c.ack_delay_ns = DELAY,
    )
}

/// Everything `node` has to send at `now`, as (kind, syndrome, endpoints, bytes).
fn drain(
    net: &mut softrdma_engine::sim::SimNet,
    node: usize,
    now: Instant,
) -> Vec<(OpKind, Option<Syndrome>, Endpoints, Vec<u8>)> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 9000];
    while let Some(t) = net.nodes[node].poll_transmit(now, &mut buf) {
        let bytes = buf[..t.len].to_vec();
        let p = PacketRepr::parse(&bytes).expect("engine emits valid packets");
        let syn = p.headers.aeth().map(|a| a.syndrome);
        out.push((p.bth.opcode.info().kind, syn, t.endpoints, bytes.clone()));
        assert!(out.len() < 64, "node {node} keeps transmitting");
    }
    out
}

/// What `node` has to send at `now`, which must be exactly one positive ACK
/// (`what` says which, for the failure message).
fn drain_one_ack(
    net: &mut softrdma_engine::sim::SimNet,
    node: usize,
    now: Instant,
    what: &str,
) -> Vec<(OpKind, Option<Syndrome>, Endpoints, Vec<u8>)> {
    let out = drain(net, node, now);
    assert_eq!(out.len(), 1, "{what}: {out:?}");
    assert_eq!(out[0].0, OpKind::Ack, "{what}: {out:?}");
    assert!(
        matches!(out[0].1, Some(Syndrome::Ack { .. })),
        "{what}: not a positive ACK: {out:?}"
    );
    out
}

fn deliver(
    net: &mut softrdma_engine::sim::SimNet,
    node: usize,
    now: Instant,
    pkts: &[(OpKind, Option<Syndrome>, Endpoints, Vec<u8>)],
) {
    for (_, _, ep, bytes) in pkts {
        net.nodes[node].handle_packet(now, *ep, bytes);
    }
}

fn write(wr_id: u64, from: &Side, to: &Side, off: u64) -> SendWr {
    write_wr(wr_id, from, off, 8, to, off)
}

/// A WRITE from `a` to `b`, delivered: `b` holds its ACK. Returns the time.
fn write_and_hold(net: &mut softrdma_engine::sim::SimNet, a: &Side, b: &Side) -> Instant {
    let t0 = net.now;
    net.nodes[0]
        .post_send(t0, a.qpn, &write(1, a, b, 0))
        .unwrap();
    let req = drain(net, 0, t0);
    assert_eq!(req.len(), 1);
    assert_eq!(req[0].0, OpKind::Write);
    deliver(net, 1, t0, &req);
    assert!(drain(net, 1, t0).is_empty(), "the ACK must wait");
    t0
}

#[test]
fn held_ack_follows_the_answering_request() {
    let (mut net, a, b) = delayed_pair();
    // B holds its ACK: nothing to send yet, and a timer at most DELAY away.
    let t0 = write_and_hold(&mut net, &a, &b);
    let due = net.nodes[1]
        .poll_timeout()
        .expect("a timer for the held ACK");
    assert!(
        due.0 <= t0.0 + DELAY,
        "held until {due:?}, later than the delay"
    );

    // B answers with its own WRITE 1 µs later: the WRITE, then the ACK.
    let t1 = Instant(t0.0 + 1_000);
    net.nodes[1]
        .post_send(t1, b.qpn, &write(2, &b, &a, 64))
        .unwrap();
    let out = drain(&mut net, 1, t1);
    let kinds: Vec<OpKind> = out.iter().map(|p| p.0).collect();
    assert_eq!(kinds, vec![OpKind::Write, OpKind::Ack], "{out:?}");
    assert!(matches!(out[1].1, Some(Syndrome::Ack { .. })));

    // The ACK completes A's WRITE; A's ACK of B's WRITE is held in turn.
    deliver(&mut net, 0, t1, &out);
    let wcs = poll(&mut net, &a);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    assert!(drain(&mut net, 0, t1).is_empty());
}

#[test]
fn held_ack_goes_out_when_the_delay_passes() {
    let (mut net, a, b) = delayed_pair();
    let t0 = write_and_hold(&mut net, &a, &b);

    // Just before the delay: still held. At it: sent, after the timer runs.
    let early = Instant(t0.0 + DELAY - 1);
    net.nodes[1].handle_timeout(early);
    assert!(drain(&mut net, 1, early).is_empty());
    let due = Instant(t0.0 + DELAY);
    net.nodes[1].handle_timeout(due);
    let out = drain_one_ack(&mut net, 1, due, "at the delay");
    deliver(&mut net, 0, due, &out);
    assert_eq!(statuses(&poll(&mut net, &a)), vec![(1, WcStatus::Success)]);
}

#[test]
fn nak_and_read_response_do_not_wait() {
    let (mut net, a, b) = delayed_pair();
    let t0 = net.now;
    // A READ: its response goes out at once.
    net.nodes[0]
        .post_send(t0, a.qpn, &read_wr(1, &a, 128, 8, &b, 0))
        .unwrap();
    let req = drain(&mut net, 0, t0);
    deliver(&mut net, 1, t0, &req);
    let out = drain(&mut net, 1, t0);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, OpKind::ReadResponse);

    // A WRITE past the end of B's region: the NAK goes out at once.
    net.nodes[0]
        .post_send(
            t0,
            a.qpn,
            &SendWr::new(
                2,
                SendOp::Write {
                    remote_addr: b.base + b.mem.len() as u64,
                    rkey: b.keys.rkey,
                },
                vec![sge(&a, 0, 8)],
            ),
        )
        .unwrap();
    let req = drain(&mut net, 0, t0);
    deliver(&mut net, 1, t0, &req);
    let out = drain(&mut net, 1, t0);
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(
        matches!(out[0].1, Some(Syndrome::Nak(_))),
        "expected a NAK, got {out:?}"
    );
}

/// B's application got what it wanted and tears its QP down at once —
/// destroyed, reset, or moved to ERR as `rdma_disconnect` does before its
/// DREQ (libfabric's MSG endpoints close so): the ACK it owes must still go
/// out, or A's WRITE ends in RETRY_EXC_ERR against a peer that executed it.
#[test]
fn destroying_resetting_or_erroring_the_qp_sends_the_held_ack() {
    for end in [None, Some(QpState::Reset), Some(QpState::Err)] {
        let (mut net, a, b) = delayed_pair();
        let t0 = write_and_hold(&mut net, &a, &b);
        match end {
            Some(state) => {
                let attr = QpAttr {
                    qp_state: state,
                    ..Default::default()
                };
                net.nodes[1]
                    .modify_qp(t0, b.qpn, &attr, AttrMask::STATE)
                    .unwrap();
            }
            None => net.nodes[1].destroy_qp(b.qpn).unwrap(),
        }
        let out = drain_one_ack(&mut net, 1, t0, &format!("{end:?}"));
        deliver(&mut net, 0, t0, &out);
        assert_eq!(statuses(&poll(&mut net, &a)), vec![(1, WcStatus::Success)]);
        // Sent once: nothing more follows, now or when the hold would have ended.
        let later = Instant(t0.0 + DELAY);
        net.nodes[1].handle_timeout(later);
        assert!(drain(&mut net, 1, later).is_empty(), "{end:?}");
    }
}

#[test]
fn release_held_acks_sends_them_now() {
    let (mut net, a, b) = delayed_pair();
    let t0 = write_and_hold(&mut net, &a, &b);
    net.nodes[1].release_held_acks();
    drain_one_ack(&mut net, 1, t0, "released");
}

#[test]
fn without_delay_the_ack_is_immediate() {
    let (mut net, a, b) = pair(42, NetConfig::perfect(), QpType::Rc, &ConnOpts::default());
    let t0 = net.now;
    net.nodes[0]
        .post_send(t0, a.qpn, &write(1, &a, &b, 0))
        .unwrap();
    let req = drain(&mut net, 0, t0);
    deliver(&mut net, 1, t0, &req);
    drain_one_ack(&mut net, 1, t0, "no delay configured");
}

/// An ACK requested in the middle of a message (every `ack_req_every`
/// packets, or when the window fills) goes at once: the requester streams
/// and needs it to move its window. The one for the message's last packet
/// is held as usual.
#[test]
fn mid_message_ack_is_not_held() {
    let (mut net, a, b) = delayed_pair();
    let t0 = net.now;
    // 40 packets of the default 1024-byte MTU: AckReq on the 32nd and the last.
    net.nodes[0]
        .post_send(t0, a.qpn, &write_wr(1, &a, 0, 40 * 1024, &b, 0))
        .unwrap();
    let req = drain(&mut net, 0, t0);
    assert_eq!(req.len(), 40);
    let asks: Vec<usize> = req
        .iter()
        .enumerate()
        .filter(|(_, p)| PacketRepr::parse(&p.3).unwrap().bth.ack_req)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(asks, vec![31, 39]);
    deliver(&mut net, 1, t0, &req[..32]);
    drain_one_ack(&mut net, 1, t0, "the mid-message ACK goes at once");
    deliver(&mut net, 1, t0, &req[32..]);
    assert!(
        drain(&mut net, 1, t0).is_empty(),
        "the last one's ACK waits"
    );
    let due = Instant(t0.0 + DELAY);
    net.nodes[1].handle_timeout(due);
    drain_one_ack(&mut net, 1, due, "the last one's ACK at the delay");
}

/// `ack_delay_answering_only`: a QP that has sent nothing since its last
/// hold (a one-way stream's target) ACKs at once; once it has answered, its
/// next lone ACK is held and follows its next request out.
#[test]
fn answering_only_holds_for_a_qp_that_answers() {
    let (mut net, a, b) = pair_cfg(
        41,
        NetConfig::perfect(),
        QpType::Rc,
        &ConnOpts::default(),
        |c| {
            c.ack_delay_ns = DELAY;
            c.ack_delay_answering_only = true;
        },
    );
    let t0 = net.now;
    net.nodes[0]
        .post_send(t0, a.qpn, &write(1, &a, &b, 0))
        .unwrap();
    let req = drain(&mut net, 0, t0);
    deliver(&mut net, 1, t0, &req);
    let ack = drain_one_ack(&mut net, 1, t0, "B never sent: no hold");
    deliver(&mut net, 0, t0, &ack);
    assert_eq!(statuses(&poll(&mut net, &a)), vec![(1, WcStatus::Success)]);

    // B writes once; then A's next WRITE finds B answering: its ACK waits
    // for B's next WRITE and follows it.
    net.nodes[1]
        .post_send(t0, b.qpn, &write(2, &b, &a, 64))
        .unwrap();
    let out = drain(&mut net, 1, t0);
    deliver(&mut net, 0, t0, &out);
    assert!(
        drain(&mut net, 0, t0).is_empty(),
        "A answers: its ACK waits"
    );
    let t1 = Instant(t0.0 + 1_000);
    net.nodes[0]
        .post_send(t1, a.qpn, &write(3, &a, &b, 128))
        .unwrap();
    let req = drain(&mut net, 0, t1);
    assert_eq!(req.iter().filter(|p| p.0 == OpKind::Write).count(), 1);
    deliver(&mut net, 1, t1, &req);
    assert!(
        drain(&mut net, 1, t1).is_empty(),
        "B answers: the ACK waits"
    );
    net.nodes[1]
        .post_send(t1, b.qpn, &write(4, &b, &a, 192))
        .unwrap();
    let kinds: Vec<OpKind> = drain(&mut net, 1, t1).iter().map(|p| p.0).collect();
    assert_eq!(kinds, vec![OpKind::Write, OpKind::Ack]);
}
