//! DCQCN (issue 19) on an ECN-marking bottleneck in the simulator: two
//! senders write to one receiver through a switch port with a bounded
//! queue and RED marking. With DCQCN every packet is ECN-capable, the
//! receiver answers CE marks with CNPs, the senders cut their rates, and
//! the queue neither fills nor drops; without it the same load drops at
//! the queue's tail. (`examples/dcqcn_incast.rs` prints the figures.)

mod common;
use std::time::Duration;

use common::*;
use softrdma_engine::sim::{ecn_red, node_addr, LinkConfig, NetConfig, SimNet};
use softrdma_engine::*;
use softrdma_wire::Ecn;

const RATE: u64 = 10_000_000_000;

struct Result {
    drops_after_warm: u64,
    max_queue_after_warm: usize,
    cnps: u64,
    cuts: u64,
    completed: Vec<u64>,
    not_ect_requests: u64,
}

/// `ect`: the controller sends ECN-capable packets (DCQCN does, TIMELY not).
fn incast(cc: Option<CongestionConfig>, ect: bool) -> Result {
    let cfgs = (0..3).map(|i| {
        let mut c = EngineConfig::new(node_addr(i));
        c.seed = 77 + i as u64;
        if let Some(cc) = &cc {
            c.congestion = cc.clone();
        }
        c
    });
    let mut net = SimNet::with_configs(
        cfgs,
        5,
        NetConfig {
            delay: Duration::ZERO,
            ..NetConfig::perfect()
        },
    );
    let host = LinkConfig::ethernet(RATE, Duration::from_micros(1));
    let switch = LinkConfig {
        queue_bytes: Some(512 << 10),
        ..host
    };
    let up: Vec<_> = (0..3).map(|_| net.add_link(host)).collect();
    let down: Vec<_> = (0..3).map(|_| net.add_link(switch)).collect();
    for (a, &u) in up.iter().enumerate() {
        for (b, &d) in down.iter().enumerate().filter(|&(b, _)| b != a) {
            net.set_route(a, b, &[u, d]);
        }
    }
    net.set_ecn_hook(down[2], Some(ecn_red(5_000, 200_000, 0.01, 1)));
    let wire = sniff(&mut net);
    let o = ConnOpts {
        mtu: Mtu::Mtu4096,
        timeout: 8,
        ..ConnOpts::default()
    };
    let mut pairs = Vec::new();
    for s in 0..2 {
        let a = make_side(&mut net, s, QpType::Rc);
        let b = make_side(&mut net, 2, QpType::Rc);
        bring_up(&mut net, &a, &b, o.psn_a, o.psn_b, &o, QpType::Rc);
        bring_up(&mut net, &b, &a, o.psn_b, o.psn_a, &o, QpType::Rc);
        pairs.push((a, b));
    }
    let warm = net.now + Duration::from_millis(2);
    let end = net.now + Duration::from_millis(6);
    let (mut posted, mut done) = ([0u64; 2], [0u64; 2]);
    let mut drops_at_warm = None;
    let mut max_queue = 0;
    while net.now < end {
        for (s, (a, b)) in pairs.iter().enumerate() {
            while posted[s] - done[s] < 8 {
                let slot = posted[s] % 8;
                post_ok(
                    &mut net,
                    a,
                    write_wr(posted[s], a, slot * 65536, 65536, b, slot * 65536),
                );
                posted[s] += 1;
            }
        }
        assert!(net.step());
        for (s, (a, _)) in pairs.iter().enumerate() {
            for w in poll(&mut net, a) {
                assert_eq!(w.status, WcStatus::Success);
                done[s] += 1;
            }
        }
        if net.now >= warm {
            drops_at_warm.get_or_insert(net.link_stats(down[2]).tail_drops);
            max_queue = max_queue.max(net.queued_bytes(down[2]));
        }
    }
    // Every packet the QPs sent left ECN-capable (or CE-marked on the way).
    let not_ect_requests = wire
        .borrow()
        .iter()
        .filter(|p| p.sent() && p.ecn == Ecn::NotEct)
        .count() as u64;
    let ce_seen = wire
        .borrow()
        .iter()
        .filter(|p| !p.sent() && p.ecn == Ecn::Ce)
        .count() as u64;
    assert_eq!(ce_seen > 0, ect, "CE marks only on ECN-capable traffic");
    Result {
        drops_after_warm: net.link_stats(down[2]).tail_drops - drops_at_warm.unwrap(),
        max_queue_after_warm: max_queue,
        cnps: net.nodes[2].counters().cnp_sent,
        cuts: (0..2)
            .map(|s| {
                net.nodes[s]
                    .qp_congestion(pairs[s].0.qpn)
                    .unwrap()
                    .rate_cuts
            })
            .sum(),
        completed: done.to_vec(),
        not_ect_requests,
    }
}

#[test]
fn dcqcn_keeps_the_bottleneck_queue_short_and_lossless() {
    let without = incast(None, false);
    let with = incast(Some(CongestionConfig::dcqcn(DcqcnParams::new(RATE))), true);
    assert!(
        without.drops_after_warm > 100,
        "without: {} drops",
        without.drops_after_warm
    );
    assert!(
        without.max_queue_after_warm > 400 << 10,
        "without: queue {}",
        without.max_queue_after_warm
    );
    assert_eq!((without.cnps, without.cuts), (0, 0));
    assert_eq!(with.drops_after_warm, 0);
    assert!(
        with.max_queue_after_warm < 100 << 10,
        "with: queue {}",
        with.max_queue_after_warm
    );
    assert!(
        with.cnps > 0 && with.cuts > 0,
        "with: {} CNPs, {} cuts",
        with.cnps,
        with.cuts
    );
    // Both senders got through, within 20 % of each other.
    let (a, b) = (with.completed[0] as f64, with.completed[1] as f64);
    assert!(a.min(b) / a.max(b) > 0.8, "shares {:?}", with.completed);
    assert_eq!(with.not_ect_requests, 0, "DCQCN sends every packet ECT(0)");
    eprintln!(
        "DCQCN: queue {} B, completed {:?}; without: queue {} B, {} drops, completed {:?}",
        with.max_queue_after_warm,
        with.completed,
        without.max_queue_after_warm,
        without.drops_after_warm,
        without.completed
    );
    assert!(without.not_ect_requests > 0);
}

/// The second controller through the same seam: TIMELY, from RTTs alone,
/// on the same bottleneck (which marks nothing it sends, NotEct).
#[test]
fn timely_keeps_the_bottleneck_queue_short_without_ecn() {
    let without = incast(None, false);
    let p = TimelyParams::new(RATE, Duration::from_micros(10));
    let with = incast(Some(CongestionConfig::timely(p)), false);
    assert!(
        without.drops_after_warm > 100,
        "without: {} drops",
        without.drops_after_warm
    );
    assert_eq!(with.drops_after_warm, 0);
    assert!(
        with.max_queue_after_warm < 200 << 10,
        "with: queue {}",
        with.max_queue_after_warm
    );
    assert!(
        with.cuts > 0 && with.cnps == 0,
        "with: {} cuts, {} CNPs",
        with.cuts,
        with.cnps
    );
    let (a, b) = (with.completed[0] as f64, with.completed[1] as f64);
    assert!(a.min(b) / a.max(b) > 0.8, "shares {:?}", with.completed);
    eprintln!(
        "TIMELY: queue {} B, completed {:?}; without: queue {} B, {} drops, completed {:?}",
        with.max_queue_after_warm,
        with.completed,
        without.max_queue_after_warm,
        without.drops_after_warm,
        without.completed
    );
}

/// The UDP payload of the first frame of a classic little-endian pcap of
/// Ethernet frames carrying IPv4, and that frame's IP packet.
fn first_roce_frame(path: &std::path::Path) -> (Vec<u8>, Vec<u8>) {
    let d = std::fs::read(path).unwrap();
    assert_eq!(&d[..4], &[0xd4, 0xc3, 0xb2, 0xa1], "little-endian pcap");
    let incl = u32::from_le_bytes(d[24 + 8..24 + 12].try_into().unwrap()) as usize;
    let frame = &d[24 + 16..24 + 16 + incl];
    assert_eq!(&frame[12..14], &[0x08, 0x00], "IPv4 over Ethernet");
    let ip = &frame[14..];
    let hdr = usize::from(ip[0] & 0xF) * 4;
    (ip[hdr + 8..].to_vec(), ip.to_vec())
}

/// Our CNP against the one a Mellanox ConnectX-4 Lx sent
/// (`../shared/captures/cx4lx-cnp.pcap`, issue 19): the notification point
/// of a DCQCN engine that receives a CE-marked request answers with a CNP
/// whose 32 bytes of RoCEv2 payload are the NIC's, byte for byte, except
/// the destination QP. Put into the NIC's own IP and UDP headers with its
/// QP number, ours gets the NIC's ICRC: every byte the ICRC covers is the
/// same. (What differs lies outside the RoCE payload: the ConnectX sends
/// its CNPs from UDP port 0 with DSCP 48 (CS6) and ECT(0); softrdma sends
/// them from the QP's flow port with the QP's ECN and DSCP 0.)
#[test]
fn our_cnp_is_the_connectx_cnp_byte_for_byte() {
    let cap = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/captures/cx4lx-cnp.pcap");
    if !cap.exists() {
        eprintln!("skipping: {} not found", cap.display());
        return;
    }
    let (theirs, their_ip) = first_roce_frame(&cap);
    assert_eq!(theirs.len(), 12 + 16 + 4, "BTH, 16 reserved bytes, ICRC");

    let (mut net, a, b) = pair_cfg(
        91,
        NetConfig::perfect(),
        QpType::Rc,
        &ConnOpts::default(),
        |c| c.congestion = CongestionConfig::dcqcn(DcqcnParams::new(RATE)),
    );
    let now = net.now;
    net.nodes[0]
        .post_send(now, a.qpn, &write_wr(1, &a, 0, 64, &b, 0))
        .unwrap();
    let mut buf = vec![0u8; 9000];
    let mut reqs = Vec::new();
    while let Some(t) = net.nodes[0].poll_transmit(now, &mut buf) {
        reqs.push((t.endpoints, buf[..t.len].to_vec()));
    }
    assert_eq!(reqs.len(), 1);
    let ce = RxMeta {
        ecn: Ecn::Ce,
        group: None,
    };
    net.nodes[1].handle_packet_meta(now, reqs[0].0, ce, &reqs[0].1);
    let mut cnp = None;
    while let Some(t) = net.nodes[1].poll_transmit(now, &mut buf) {
        if buf[0] == 0x81 {
            cnp = Some(buf[..t.len].to_vec());
        }
    }
    let ours = cnp.expect("a CE-marked request draws a CNP");
    assert_eq!(
        ours.len(),
        theirs.len(),
        "ours {ours:02x?}\ntheirs {theirs:02x?}"
    );
    let qpn = a.qpn.raw().to_be_bytes();
    assert_eq!(&ours[5..8], &qpn[1..], "to the requester's QP");
    // Opcode, flags, P_Key, FECN/BECN byte; AckReq byte and PSN; the 16
    // reserved bytes.
    assert_eq!(
        ours[..5],
        theirs[..5],
        "ours {ours:02x?}\ntheirs {theirs:02x?}"
    );
    assert_eq!(
        ours[8..28],
        theirs[8..28],
        "ours {ours:02x?}\ntheirs {theirs:02x?}"
    );
    // Into the NIC's packet with the NIC's QP: the NIC's ICRC.
    let mut ip = their_ip.clone();
    let at = ip.len() - theirs.len();
    ip[at..at + 28].copy_from_slice(&ours[..28]);
    ip[at + 5..at + 8].copy_from_slice(&theirs[5..8]);
    let (stored, computed) = softrdma_wire::icrc::over_ip_packet(&ip).unwrap();
    assert_eq!(computed, stored, "the ICRC over our bytes is the NIC's");
    assert_eq!(ip, their_ip, "the whole packet is the NIC's");
}
