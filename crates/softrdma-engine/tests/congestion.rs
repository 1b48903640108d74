//! The congestion-control seam: a controller chosen through
//! `EngineConfig::congestion` decides when requests go out and which ECN
//! codepoint packets carry, and hears of ACKs, ECN marks and CNPs. (That
//! the default controller leaves the wire as it was is `wire_digest`.)

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use softrdma_engine::*;
use softrdma_wire::{Ecn, OpKind, Opcode, PacketRepr, Psn};

/// What the test controllers were told.
#[derive(Debug, Default)]
struct Log {
    sent: Vec<(Instant, u32)>,
    acked: u32,
    ce: u32,
    cnps: u32,
}

/// A window of `window` PSNs; each request no sooner than `gap` after the
/// previous one; packets marked `ecn`; CE marks answered with CNPs.
#[derive(Debug)]
struct TestCc {
    window: u32,
    gap: Duration,
    ecn: Ecn,
    last_sent: Option<Instant>,
    log: Arc<Mutex<Log>>,
}

impl CongestionControl for TestCc {
    fn window(&self) -> u32 {
        self.window
    }

    fn can_send(&self, now: Instant, inflight: u32, _bytes: usize) -> SendVerdict {
        if inflight >= self.window {
            return SendVerdict::Blocked;
        }
        match self.last_sent {
            Some(t) if now < t + self.gap => SendVerdict::NotBefore(t + self.gap),
            _ => SendVerdict::Now,
        }
    }

    fn on_sent(&mut self, now: Instant, sent: &SentPacket) {
        self.last_sent = Some(now);
        self.log.lock().unwrap().sent.push((now, sent.psn.value()));
    }

    fn on_ack(&mut self, _now: Instant, _first: Psn, count: u32) {
        self.log.lock().unwrap().acked += count;
    }

    fn on_ecn(&mut self, _now: Instant, ecn: Ecn) -> EcnAction {
        if ecn == Ecn::Ce {
            self.log.lock().unwrap().ce += 1;
            return EcnAction::SendCnp;
        }
        EcnAction::None
    }

    fn on_cnp(&mut self, _now: Instant) {
        self.log.lock().unwrap().cnps += 1;
    }

    fn ecn_to_send(&self) -> Ecn {
        self.ecn
    }
}

fn config(window: u32, gap: Duration, ecn: Ecn, log: &Arc<Mutex<Log>>) -> CongestionConfig {
    let log = log.clone();
    CongestionConfig::custom(move |qp| {
        Box::new(TestCc {
            window: window.min(qp.max_inflight),
            gap,
            ecn,
            last_sent: None,
            log: log.clone(),
        })
    })
}

/// One 8 KiB WRITE (8 packets at MTU 1024) from a to b; returns the wire.
fn write_8k(cc: Option<CongestionConfig>) -> (Vec<Pkt>, Side, Side, Vec<WorkCompletion>) {
    let (mut net, a, b) = pair_cfg(7, net5(), QpType::Rc, &ConnOpts::default(), |c| {
        if let Some(cc) = &cc {
            c.congestion = cc.clone();
        }
    });
    let wire = sniff(&mut net);
    let data = pattern(3, 8192);
    a.mem.write(0, &data);
    post_ok(&mut net, &a, write_wr(1, &a, 0, 8192, &b, 0x4000));
    let wcs = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(mem(&b, 0x4000, 8192), data, "the WRITE landed intact");
    let w = wire.borrow().clone();
    (w, a, b, wcs)
}

fn requests_sent(wire: &[Pkt]) -> Vec<Pkt> {
    wire.iter()
        .filter(|p| p.sent() && p.from == 0 && p.is(OpKind::Write))
        .cloned()
        .collect()
}

#[test]
fn a_window_of_one_sends_one_packet_per_round_trip() {
    // The default window sends the whole message at once, asking for one ACK.
    let (wire, ..) = write_8k(None);
    let reqs = requests_sent(&wire);
    assert_eq!(reqs.len(), 8);
    assert!(reqs.iter().all(|p| p.now == reqs[0].now), "one burst");
    assert_eq!(reqs.iter().filter(|p| p.ack_req).count(), 1);

    let log = Arc::new(Mutex::new(Log::default()));
    let (wire, _a, _b, wcs) = write_8k(Some(config(1, Duration::ZERO, Ecn::NotEct, &log)));
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    let reqs = requests_sent(&wire);
    assert_eq!(reqs.len(), 8, "no packet sent twice");
    // Each packet fills the window, so each asks for the ACK that lets the
    // next one go: one round trip (two 5 µs hops) apart.
    assert!(reqs.iter().all(|p| p.ack_req));
    for pair in reqs.windows(2) {
        assert!(pair[1].now - pair[0].now >= Duration::from_micros(10));
        let acked_between = wire.iter().any(|p| {
            !p.sent()
                && p.to == 0
                && p.is(OpKind::Ack)
                && p.now >= pair[0].now
                && p.now <= pair[1].now
        });
        assert!(
            acked_between,
            "PSN {} went before {} was acknowledged",
            pair[1].psn, pair[0].psn
        );
    }
    let l = log.lock().unwrap();
    assert_eq!(l.sent.len(), 8);
    assert_eq!(l.acked, 8, "the controller heard of every PSN acknowledged");
}

#[test]
fn a_not_before_paces_the_requests() {
    let log = Arc::new(Mutex::new(Log::default()));
    let gap = Duration::from_micros(25);
    let (wire, ..) = write_8k(Some(config(256, gap, Ecn::NotEct, &log)));
    let reqs = requests_sent(&wire);
    assert_eq!(reqs.len(), 8);
    for pair in reqs.windows(2) {
        assert_eq!(
            pair[1].now - pair[0].now,
            gap,
            "paced by the timer, to the nanosecond"
        );
    }
    // Only the last packet asks for an ACK: the window is not what held them.
    assert_eq!(reqs.iter().filter(|p| p.ack_req).count(), 1);
}

#[test]
fn ecn_marks_packets_and_ce_is_answered_with_a_cnp() {
    let log_a = Arc::new(Mutex::new(Log::default()));
    let log_b = Arc::new(Mutex::new(Log::default()));
    let (cfg_a, cfg_b) = (
        config(256, Duration::ZERO, Ecn::Ect0, &log_a),
        config(256, Duration::ZERO, Ecn::Ect0, &log_b),
    );
    let (mut net, a, b) = pair_cfg(9, net5(), QpType::Rc, &ConnOpts::default(), |c| {
        c.congestion = if c.local == sim::node_addr(0) {
            cfg_a.clone()
        } else {
            cfg_b.clone()
        };
    });
    let data = pattern(5, 100);
    a.mem.write(0, &data);
    post_ok(&mut net, &a, write_wr(1, &a, 0, 100, &b, 0));
    // Drive the two engines by hand: the simulator does not carry ECN.
    let now = net.now;
    let mut buf = vec![0u8; 4200];
    let t = net.nodes[0]
        .poll_transmit(now, &mut buf)
        .expect("the WRITE");
    assert_eq!(t.ecn, Ecn::Ect0, "the controller picks the codepoint");
    let meta = RxMeta {
        ecn: Ecn::Ce,
        group: None,
    };
    net.nodes[1].handle_packet_meta(now, t.endpoints, meta, &buf[..t.len]);
    assert_eq!(mem(&b, 0, 100), data);
    assert_eq!(log_b.lock().unwrap().ce, 1);
    assert_eq!(net.nodes[1].counters().ecn_ce_rcvd, 1);
    // b answers with a CNP to a's QP, then the ACK.
    let cnp = net.nodes[1].poll_transmit(now, &mut buf).expect("a CNP");
    let p = PacketRepr::parse(&buf[..cnp.len]).unwrap();
    assert_eq!(p.bth.opcode, Opcode::CNP);
    assert_eq!(p.bth.dest_qp, a.qpn.raw());
    assert!(p.bth.becn);
    net.nodes[0].handle_packet(now, cnp.endpoints, &buf[..cnp.len]);
    assert_eq!(
        log_a.lock().unwrap().cnps,
        1,
        "a's controller heard the CNP"
    );
    assert_eq!(net.nodes[0].counters().cnp_rcvd, 1);
    assert_eq!(net.nodes[0].qp_counters(a.qpn).unwrap().cnp_rcvd, 1);
    let ack = net.nodes[1].poll_transmit(now, &mut buf).expect("the ACK");
    assert_eq!(ack.ecn, Ecn::Ect0);
    net.nodes[0].handle_packet(now, ack.endpoints, &buf[..ack.len]);
    let mut wcs = Vec::new();
    net.nodes[0].poll_cq(a.cq, 4, &mut wcs).unwrap();
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    assert_eq!(log_a.lock().unwrap().acked, 1);
    // One CE mark, one CNP: nothing more to send.
    assert!(net.nodes[1].poll_transmit(now, &mut buf).is_none());
}

#[test]
fn a_cnp_from_another_host_is_ignored() {
    let log = Arc::new(Mutex::new(Log::default()));
    let cc = config(256, Duration::ZERO, Ecn::NotEct, &log);
    let (mut net, a, _b) = pair_cfg(11, net5(), QpType::Rc, &ConnOpts::default(), |c| {
        c.congestion = cc.clone();
    });
    let mut bth = softrdma_wire::BthRepr::new(Opcode::CNP, a.qpn.raw(), Psn::new(0));
    bth.becn = true;
    let stranger = std::net::SocketAddr::new("127.0.10.9".parse().unwrap(), 4791);
    let ep = softrdma_wire::Endpoints::new(stranger, sim::node_addr(0));
    let mut buf = vec![0u8; 128];
    let n =
        softrdma_wire::packet::emit_in_place(&bth, &softrdma_wire::Headers::Cnp, &mut buf, 0, &ep)
            .unwrap();
    inject(&mut net, 0, ep, &buf[..n]);
    assert_eq!(net.nodes[0].counters().cnp_rcvd, 1, "counted by the device");
    assert_eq!(log.lock().unwrap().cnps, 0, "but not the QP's business");
}
