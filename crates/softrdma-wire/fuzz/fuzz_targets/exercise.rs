//! One input, every parser: the body shared by the cargo-fuzz target
//! (`fuzz_targets/parse.rs`) and the bounded no-panic test of the normal
//! suite (`tests/no_panic.rs`), so the fuzz body is compiled and run by
//! `cargo test` on stable even where cargo-fuzz (nightly) is not available.
//!
//! Besides "never panics", it asserts a few cross-checks that must hold for
//! any input:
//! - a packet that parses re-emits to bytes that parse to the same repr and
//!   carry a valid ICRC;
//! - for an IP header exactly as a RoCE sender emits it (IPv4 IHL 5, DF, ID
//!   0; or IPv6), the ICRC over the real header (`over_ip_packet`) equals the
//!   one over the synthesized header (`compute`).

#![allow(dead_code)] // the fuzz target does not read the counters

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use softrdma_wire::{
    aeth, atomic_eth, bth, frame, icrc, reth, small, AethRepr, AtomicEthRepr, BthRepr, DethRepr,
    Endpoints, Opcode, PacketRepr, RethRepr, Syndrome,
};

/// How far inputs got, so a bounded run can show it was not vacuous.
#[derive(Debug, Default, Clone, Copy)]
pub struct Reached {
    /// `PacketRepr::parse` succeeded.
    pub packet_ok: u64,
    /// `icrc::verify` succeeded.
    pub icrc_ok: u64,
    /// `frame::parse_ip` succeeded.
    pub ip_ok: u64,
    /// `icrc::over_ip_packet` found stored == computed.
    pub ip_icrc_match: u64,
    /// The synthesized-header ICRC was compared with the real-header one.
    pub differential: u64,
    /// `frame::ip_of_ethernet` succeeded.
    pub eth_ok: u64,
}

fn ep4() -> Endpoints {
    Endpoints::new(
        SocketAddr::new(Ipv4Addr::new(10, 0, 0, 1).into(), 0xC000),
        SocketAddr::new(Ipv4Addr::new(10, 0, 0, 2).into(), frame::ROCE_PORT),
    )
}

fn ep6() -> Endpoints {
    Endpoints::new(
        SocketAddr::new(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1).into(), 0xC001),
        SocketAddr::new(
            Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2).into(),
            frame::ROCE_PORT,
        ),
    )
}

/// Feeds `data` to every parser of the crate, read as a UDP payload, as an
/// IP packet and as an Ethernet frame, and to every header view.
pub fn exercise(data: &[u8], reached: &mut Reached) {
    udp_payload(data, &ep4(), reached);
    let _ = icrc::verify(&ep6(), data);
    ip_packet(data, reached);
    if let Ok(ip) = frame::ip_of_ethernet(data) {
        reached.eth_ok += 1;
        ip_packet(ip, reached);
    }
    views(data);
    if data.len() > bth::HEADER_LEN {
        views(&data[bth::HEADER_LEN..]);
    }
    // The same bytes as the UDP payload of a well-formed IP packet, so the
    // ICRC paths see arbitrary RoCE payloads behind a valid header.
    let ep = if data.first().is_some_and(|b| b & 1 == 0) {
        ep4()
    } else {
        ep6()
    };
    if let Ok(ip) = frame::build_ip(ep.src, ep.dst, data, &Default::default()) {
        ip_packet(&ip, reached);
    }
}

fn udp_payload(b: &[u8], ep: &Endpoints, reached: &mut Reached) {
    let _ = icrc::stored(b);
    if icrc::verify(ep, b).is_ok() {
        reached.icrc_ok += 1;
    }
    let Ok(repr) = PacketRepr::parse(b) else {
        return;
    };
    reached.packet_ok += 1;
    assert!(repr.payload.len() + repr.headers.len() + bth::HEADER_LEN + icrc::ICRC_LEN <= b.len());
    assert!(repr.bth.pad_count <= 3);
    let mut buf = vec![0u8; repr.buffer_len()];
    // Emitting only fails when the packet is too big for one IP datagram.
    if let Ok(n) = repr.emit(&mut buf, ep) {
        assert_eq!(n, buf.len());
        let again = PacketRepr::parse(&buf).expect("a re-emitted packet parses");
        // The pad count is re-derived from the payload length on emit.
        let mut want = repr;
        want.bth.pad_count = again.bth.pad_count;
        assert_eq!(again, want);
        icrc::verify(ep, &buf).expect("a re-emitted packet has a valid ICRC");
    }
}

fn ip_packet(b: &[u8], reached: &mut Reached) {
    let over = icrc::over_ip_packet(b);
    let Ok(ipu) = frame::parse_ip(b) else {
        return;
    };
    reached.ip_ok += 1;
    assert!(ipu.ip_packet.len() <= b.len());
    assert!(ipu.udp_payload.len() + frame::UDP_LEN <= ipu.ip_packet.len());
    let ep = Endpoints::new(ipu.src, ipu.dst);
    udp_payload(ipu.udp_payload, &ep, reached);
    if let Ok((stored, computed)) = over {
        if stored == computed {
            reached.ip_icrc_match += 1;
        }
        // Differential check between the two ICRC implementations, on the
        // headers `compute` synthesizes.
        let ip = ipu.ip_packet;
        let udp_len = ipu.udp_payload.len() + frame::UDP_LEN;
        let as_sent = match ip[0] >> 4 {
            4 => ip[0] == 0x45 && ip[4..8] == [0, 0, 0x40, 0] && ip.len() == 20 + udp_len,
            _ => ip.len() == 40 + udp_len,
        };
        if as_sent && ipu.udp_payload.len() >= bth::HEADER_LEN + icrc::ICRC_LEN {
            reached.differential += 1;
            let body = &ipu.udp_payload[..ipu.udp_payload.len() - icrc::ICRC_LEN];
            assert_eq!(icrc::compute(&ep, body), Ok(computed));
            assert_eq!(icrc::stored(ipu.udp_payload), Ok(stored));
        }
    }
}

fn views(b: &[u8]) {
    if let Ok(p) = bth::Packet::new_checked(b) {
        let _ = BthRepr::parse(&p);
        let _ = (
            p.opcode_raw(),
            p.solicited(),
            p.mig_req(),
            p.pad_count(),
            p.tver(),
        );
        let _ = (
            p.pkey(),
            p.fecn(),
            p.becn(),
            p.dest_qp(),
            p.ack_req(),
            p.psn(),
        );
    }
    if let Ok(p) = reth::Packet::new_checked(b) {
        let _ = RethRepr::parse(&p);
    }
    if let Ok(p) = aeth::Packet::new_checked(b) {
        let _ = AethRepr::parse(&p);
        let _ = (p.syndrome_raw(), p.msn());
    }
    if let Ok(p) = atomic_eth::Packet::new_checked(b) {
        let _ = AtomicEthRepr::parse(&p);
    }
    let _ = small::parse_immdt(b);
    let _ = small::parse_ieth(b);
    let _ = small::parse_atomic_ack_eth(b);
    let _ = DethRepr::parse(b);
    if let Some(&first) = b.first() {
        let _ = Opcode::from_u8(first).map(|o| (o.info(), o.name()));
        let _ = Syndrome::from_byte(first);
        let _ = aeth::rnr_timer_micros(first);
        let _ = aeth::credits_from_code(first);
    }
}
