//! Packets from senders that use non-zero IPv4 IDs (Linux rxe) are accepted
//! only when the engine is told to recover the ID, and counted as such.

mod common;
use common::*;
use softrdma_engine::sim::NetConfig;
use softrdma_engine::*;
use softrdma_wire::{icrc, Endpoints};

fn run(recover: bool) -> (Vec<u8>, Counters) {
    let (mut net, a, b) = pair(3, NetConfig::perfect(), QpType::Rc, &ConnOpts::default());
    a.mem.fill_from(0, &[0x3C; 64]);
    let now = net.now;
    net.nodes[0]
        .post_send(
            now,
            a.qpn,
            &SendWr::new(
                1,
                SendOp::Write {
                    remote_addr: b.base,
                    rkey: b.keys.rkey,
                },
                vec![sge(&a, 0, 64)],
            ),
        )
        .unwrap();
    let mut buf = vec![0u8; 9000];
    let t = net.nodes[0]
        .poll_transmit(now, &mut buf)
        .expect("a WRITE packet");
    let mut pkt = buf[..t.len].to_vec();
    // Reseal as a sender with IP ID 0xF686 would have.
    let ep: Endpoints = t.endpoints;
    let n = pkt.len();
    let crc = icrc::compute_with_ipv4_id(&ep, &pkt[..n - 4], 0xF686).unwrap();
    pkt[n - 4..].copy_from_slice(&crc.to_le_bytes());
    net.nodes[1].set_recover_ipv4_id(recover);
    net.nodes[1].handle_packet(now, ep, &pkt);
    (b.mem.snapshot()[..64].to_vec(), *net.nodes[1].counters())
}

#[test]
fn non_zero_ip_id_is_dropped_without_recovery() {
    let (mem, c) = run(false);
    assert_eq!(mem, vec![0u8; 64]);
    assert_eq!((c.icrc_errors, c.icrc_ip_id_recovered), (1, 0));
}

#[test]
fn non_zero_ip_id_is_recovered_when_enabled() {
    let (mem, c) = run(true);
    assert_eq!(mem, vec![0x3C; 64]);
    assert_eq!((c.icrc_errors, c.icrc_ip_id_recovered), (0, 1));
}
