//! Every `Error` variant, provoked by a real malformed buffer, and its
//! Display message naming the header and field at fault.

mod common;

use std::net::{Ipv4Addr, SocketAddr};

use common::{ep4, ep6, Fields, Rng};
use softrdma_wire::{
    aeth, atomic_eth, bth, frame, icrc, reth, small, AethRepr, AtomicEthRepr, BthRepr, DethRepr,
    Endpoints, Error, HeaderLayout, Headers, Msn, Opcode, PacketRepr, Psn, RethRepr, Syndrome,
    OPCODE_TABLE,
};

/// Emits a valid packet of opcode `code` with `payload_len` payload bytes.
fn valid(code: u8, payload_len: usize) -> Vec<u8> {
    let op = Opcode::from_u8(code).unwrap();
    let mut r = Rng::new(u64::from(code));
    let payload = if op.info().has_payload {
        r.bytes(payload_len)
    } else {
        Vec::new()
    };
    let repr = PacketRepr {
        bth: BthRepr::new(op, 0x11, Psn::new(5)),
        headers: Fields::random(&mut r).headers(op.info().layout),
        payload: &payload,
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf, &ep4()).unwrap();
    buf
}

fn valid_ip4(code: u8, payload_len: usize) -> Vec<u8> {
    let ep = ep4();
    frame::build_ip(
        ep.src,
        ep.dst,
        &valid(code, payload_len),
        &Default::default(),
    )
    .unwrap()
}

fn valid_ip6(code: u8, payload_len: usize) -> Vec<u8> {
    let ep = ep6();
    frame::build_ip(
        ep.src,
        ep.dst,
        &valid(code, payload_len),
        &Default::default(),
    )
    .unwrap()
}

/// Asserts that the error's message contains every one of `parts`.
#[track_caller]
fn says(err: Error, parts: &[&str]) -> Error {
    let msg = err.to_string();
    for p in parts {
        assert!(msg.contains(p), "{msg:?} does not mention {p:?}");
    }
    err
}

// --- Truncated --------------------------------------------------------------

#[test]
fn truncated_bth() {
    let b = valid(0x04, 0);
    for len in 0..bth::HEADER_LEN {
        let e = PacketRepr::parse(&b[..len]).unwrap_err();
        assert_eq!(
            e,
            Error::Truncated {
                header: "BTH",
                need: 12,
                have: len
            }
        );
        says(e, &["truncated BTH", "need 12", &format!("have {len}")]);
    }
}

#[test]
fn truncated_extension_header_is_named_for_every_layout() {
    // (layout, name of the header cut short, and the header's own offset).
    let cases = [
        (HeaderLayout::Imm, "ImmDt", 0),
        (HeaderLayout::Ieth, "IETH", 0),
        (HeaderLayout::Reth, "RETH", 0),
        (HeaderLayout::RethImm, "RETH", 0),
        (HeaderLayout::RethImm, "ImmDt", 16),
        (HeaderLayout::Aeth, "AETH", 0),
        (HeaderLayout::AtomicAck, "AETH", 0),
        (HeaderLayout::AtomicAck, "AtomicAckETH", 4),
        (HeaderLayout::Atomic, "AtomicETH", 0),
        (HeaderLayout::Deth, "DETH", 0),
        (HeaderLayout::DethImm, "DETH", 0),
        (HeaderLayout::DethImm, "ImmDt", 8),
        (HeaderLayout::Cnp, "CNP", 0),
    ];
    let mut layouts_seen = std::collections::HashSet::new();
    for info in OPCODE_TABLE {
        for &(layout, header, at) in &cases {
            if info.layout != layout {
                continue;
            }
            layouts_seen.insert(format!("{layout:?}"));
            let b = valid(info.code, 8);
            let start = bth::HEADER_LEN + at;
            let end = bth::HEADER_LEN
                + if at == 0 && header != "CNP" {
                    header_len(header)
                } else {
                    layout.len()
                };
            // Cut anywhere inside this header.
            for cut in start..end {
                let e = PacketRepr::parse(&b[..cut]).unwrap_err();
                match e {
                    Error::Truncated {
                        header: h, have, ..
                    } => {
                        assert_eq!(h, header, "{} cut at {cut}", info.name);
                        assert_eq!(have, cut - start);
                    }
                    other => panic!("{} cut at {cut}: {other:?}", info.name),
                }
                says(e, &[&format!("truncated {header}:")]);
            }
        }
    }
    assert_eq!(layouts_seen.len(), 10, "every layout with headers");
}

fn header_len(name: &str) -> usize {
    match name {
        "ImmDt" => small::IMMDT_LEN,
        "IETH" => small::IETH_LEN,
        "RETH" => reth::HEADER_LEN,
        "AETH" => aeth::HEADER_LEN,
        "AtomicETH" => atomic_eth::HEADER_LEN,
        "DETH" => small::DETH_LEN,
        _ => unreachable!(),
    }
}

#[test]
fn truncated_icrc() {
    // Headers complete, but fewer than 4 bytes left for the ICRC.
    let b = valid(0x0A, 0); // WRITE_ONLY: BTH + RETH + ICRC = 32
    for cut in 28..32 {
        let e = PacketRepr::parse(&b[..cut]).unwrap_err();
        assert_eq!(
            e,
            Error::Truncated {
                header: "ICRC",
                need: 32,
                have: cut
            }
        );
        says(e, &["truncated ICRC"]);
    }
    says(
        icrc::verify(&ep4(), &b[..15]).unwrap_err(),
        &["truncated ICRC"],
    );
    says(icrc::stored(&b[..3]).unwrap_err(), &["truncated ICRC"]);
}

#[test]
fn truncated_views() {
    let b = [0u8; 40];
    says(
        bth::Packet::new_checked(&b[..11]).unwrap_err(),
        &["truncated BTH"],
    );
    says(
        reth::Packet::new_checked(&b[..15]).unwrap_err(),
        &["truncated RETH"],
    );
    says(
        aeth::Packet::new_checked(&b[..3]).unwrap_err(),
        &["truncated AETH"],
    );
    says(
        atomic_eth::Packet::new_checked(&b[..27]).unwrap_err(),
        &["truncated AtomicETH"],
    );
    says(DethRepr::parse(&b[..7]).unwrap_err(), &["truncated DETH"]);
    says(
        small::parse_immdt(&b[..3]).unwrap_err(),
        &["truncated ImmDt"],
    );
    says(small::parse_ieth(&b[..3]).unwrap_err(), &["truncated IETH"]);
    says(
        small::parse_atomic_ack_eth(&b[..7]).unwrap_err(),
        &["truncated AtomicAckETH"],
    );
    // Repr::parse re-checks a view built unchecked.
    says(
        BthRepr::parse(&bth::Packet::new_unchecked(&b[..5])).unwrap_err(),
        &["truncated BTH"],
    );
    says(
        RethRepr::parse(&reth::Packet::new_unchecked(&b[..5])).unwrap_err(),
        &["truncated RETH"],
    );
    says(
        AethRepr::parse(&aeth::Packet::new_unchecked(&b[..2])).unwrap_err(),
        &["truncated AETH"],
    );
    says(
        AtomicEthRepr::parse(&atomic_eth::Packet::new_unchecked(&b[..20])).unwrap_err(),
        &["truncated AtomicETH"],
    );
}

#[test]
fn truncated_ip_and_ethernet() {
    says(frame::parse_ip(&[]).unwrap_err(), &["truncated IP"]);
    says(icrc::over_ip_packet(&[]).unwrap_err(), &["truncated IP"]);
    let ip4 = valid_ip4(0x04, 4);
    says(
        frame::parse_ip(&ip4[..19]).unwrap_err(),
        &["truncated IPv4"],
    );
    says(
        icrc::over_ip_packet(&ip4[..19]).unwrap_err(),
        &["truncated IPv4"],
    );
    let ip6 = valid_ip6(0x04, 4);
    says(
        frame::parse_ip(&ip6[..39]).unwrap_err(),
        &["truncated IPv6"],
    );
    says(
        icrc::over_ip_packet(&ip6[..39]).unwrap_err(),
        &["truncated IPv6"],
    );
    // An IP packet whose UDP payload is too short to be RoCE.
    let mut short = ip4[..20 + 8 + 12].to_vec();
    short[2..4].copy_from_slice(&40u16.to_be_bytes());
    says(
        icrc::over_ip_packet(&short).unwrap_err(),
        &["truncated RoCEv2 packet", "need 44", "have 40"],
    );
    says(
        frame::ip_of_ethernet(&[0u8; 13]).unwrap_err(),
        &["truncated Ethernet"],
    );
    let mut tagged = vec![0u8; 14];
    tagged[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
    says(
        frame::ip_of_ethernet(&tagged).unwrap_err(),
        &["truncated 802.1Q tag"],
    );
}

// --- BTH fields -------------------------------------------------------------

#[test]
fn unknown_opcode() {
    let mut b = valid(0x04, 4);
    for code in [0x15u8, 0x18, 0x2C, 0x40, 0x41, 0x63, 0x66, 0x80, 0x82, 0xFF] {
        b[0] = code;
        let e = PacketRepr::parse(&b).unwrap_err();
        assert_eq!(e, Error::UnknownOpcode(code));
        says(e, &[&format!("unknown opcode 0x{code:02x}")]);
    }
    b[0] = 0x40;
    says(PacketRepr::parse(&b).unwrap_err(), &["unknown opcode 0x40"]);
}

#[test]
fn bad_transport_version() {
    let mut b = valid(0x04, 4);
    for tver in 1..16u8 {
        b[1] = (b[1] & 0xF0) | tver;
        let e = PacketRepr::parse(&b).unwrap_err();
        assert_eq!(e, Error::BadTransportVersion(tver));
        says(e, &["BTH.TVer", &format!("is {tver}")]);
    }
}

// --- Pad and payload --------------------------------------------------------

#[test]
fn pad_exceeds_payload() {
    // SEND_ONLY with 2 payload bytes: pad 2 on the wire, 4 bytes in the body.
    let mut b = valid(0x04, 2);
    assert_eq!((b[1] >> 4) & 3, 2);
    // Drop the body entirely but keep pad 3: 0 bytes for 3 pad bytes.
    let mut short = b[..12].to_vec();
    short[1] |= 0x30;
    short.extend_from_slice(&[0; 2]);
    short.extend_from_slice(&[0; 4]); // "ICRC"
    let e = PacketRepr::parse(&short).unwrap_err();
    assert_eq!(e, Error::PadExceedsPayload { pad: 3, payload: 2 });
    says(e, &["pad count 3 exceeds", "2 payload bytes"]);
    // Pad 1..3 with fewer body bytes than the pad.
    for pad in 1..=3u8 {
        for body in 0..usize::from(pad) {
            let mut p = b[..12].to_vec();
            p[1] = (p[1] & 0xCF) | (pad << 4);
            p.extend_from_slice(&vec![0u8; body + 4]);
            let e = PacketRepr::parse(&p).unwrap_err();
            assert_eq!(e, Error::PadExceedsPayload { pad, payload: body });
            says(e, &[&format!("pad count {pad} exceeds")]);
        }
    }
    // A pad count on an opcode that carries no payload at all (ACK).
    let mut ack = valid(0x11, 0);
    ack[1] |= 0x10;
    let e = PacketRepr::parse(&ack).unwrap_err();
    assert_eq!(e, Error::PadExceedsPayload { pad: 1, payload: 0 });
    says(e, &["pad count 1 exceeds the 0 payload bytes"]);
    // The pad bytes are accepted when there are enough of them.
    b[1] = (b[1] & 0xCF) | 0x30;
    assert_eq!(PacketRepr::parse(&b).unwrap().payload.len(), 1);
}

#[test]
fn unexpected_payload() {
    // An RC ACK's bytes after the AETH must be one well-formed SACK
    // extension (`sack`): anything else is refused, naming it.
    let b = valid(0x11, 0);
    let mut p = b[..b.len() - 4].to_vec();
    p.extend_from_slice(&[1, 2, 3, 4]);
    p.extend_from_slice(&b[b.len() - 4..]);
    let e = PacketRepr::parse(&p).unwrap_err();
    assert!(
        matches!(
            e,
            Error::BadField {
                header: "SACK",
                field: "magic",
                ..
            }
        ),
        "{e:?}"
    );
    let mut p = b[..b.len() - 4].to_vec();
    p.extend_from_slice(&[0x53, 0x52, 1, 1, 0x40, 0, 0, 0]);
    p.extend_from_slice(&b[b.len() - 4..]);
    let ok = PacketRepr::parse(&p).unwrap();
    let sack = softrdma_wire::SackRepr::parse(ok.payload).unwrap();
    assert_eq!(sack.held().collect::<Vec<_>>(), vec![1]);
    for info in OPCODE_TABLE
        .iter()
        .filter(|i| !i.has_payload && i.code != 0x11)
    {
        let b = valid(info.code, 0);
        let mut p = b[..b.len() - 4].to_vec();
        p.extend_from_slice(&[1, 2, 3, 4]); // a payload...
        p.extend_from_slice(&b[b.len() - 4..]); // ...then the ICRC
        let e = PacketRepr::parse(&p).unwrap_err();
        assert_eq!(
            e,
            Error::UnexpectedPayload {
                opcode: info.code,
                len: 4
            }
        );
        says(
            e,
            &[
                &format!("opcode 0x{:02x}", info.code),
                "carries no payload but 4 bytes follow",
            ],
        );
        // Emitting a payload with such an opcode is refused too.
        let headers = Fields::zero().headers(info.layout);
        let repr = PacketRepr {
            bth: BthRepr::new(Opcode::from_u8(info.code).unwrap(), 1, Psn::new(1)),
            headers,
            payload: &[9; 8],
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        says(
            repr.emit(&mut buf, &ep4()).unwrap_err(),
            &["carries no payload but 8 bytes"],
        );
    }
}

// --- ICRC -------------------------------------------------------------------

#[test]
fn icrc_mismatch() {
    let b = valid(0x0A, 100);
    icrc::verify(&ep4(), &b).unwrap();
    for i in [0usize, 13, 40, b.len() - 1] {
        let mut c = b.clone();
        c[i] ^= 0x01;
        let e = icrc::verify(&ep4(), &c).unwrap_err();
        assert!(matches!(e, Error::IcrcMismatch { .. }));
        says(e, &["ICRC mismatch", "got 0x", "want 0x"]);
    }
    // The right bytes verified between the wrong endpoints.
    says(
        icrc::verify(&ep4().reversed(), &b).unwrap_err(),
        &["ICRC mismatch"],
    );
    // An IPv4 packet checked as if it went over IPv6.
    says(icrc::verify(&ep6(), &b).unwrap_err(), &["ICRC mismatch"]);
    // The stored value is reported as "got".
    let got = icrc::stored(&b).unwrap();
    let mut c = b.clone();
    c[20] ^= 0x80;
    match icrc::verify(&ep4(), &c).unwrap_err() {
        Error::IcrcMismatch { got: g, want } => {
            assert_eq!(g, got);
            assert_ne!(want, got);
        }
        e => panic!("{e:?}"),
    }
}

// --- Emit-side errors -------------------------------------------------------

#[test]
fn headers_do_not_match_opcode() {
    let mut buf = [0u8; 128];
    for info in OPCODE_TABLE {
        for other in [
            Headers::None,
            Headers::Imm(1),
            Headers::Reth(RethRepr::default()),
            Headers::Cnp,
        ] {
            if other.layout() == info.layout {
                continue;
            }
            let repr = PacketRepr {
                bth: BthRepr::new(Opcode::from_u8(info.code).unwrap(), 1, Psn::new(1)),
                headers: other,
                payload: &[],
            };
            let e = repr.emit(&mut buf, &ep4()).unwrap_err();
            assert_eq!(e, Error::HeadersDoNotMatchOpcode { opcode: info.code });
            says(
                e,
                &[
                    "extension headers do not match",
                    &format!("opcode 0x{:02x}", info.code),
                ],
            );
        }
    }
}

#[test]
fn buffer_too_small() {
    let payload = [7u8; 5];
    let repr = PacketRepr {
        bth: BthRepr::new(Opcode::RC_WRITE_ONLY, 1, Psn::new(1)),
        headers: Headers::Reth(RethRepr::default()),
        payload: &payload,
    };
    let need = 12 + 16 + 5 + 3 + 4;
    assert_eq!(repr.buffer_len(), need);
    let mut buf = vec![0u8; need - 1];
    let e = repr.emit(&mut buf, &ep4()).unwrap_err();
    assert_eq!(
        e,
        Error::BufferTooSmall {
            need,
            have: need - 1
        }
    );
    says(e, &["buffer too small", "need 40", "have 39"]);
    let e = softrdma_wire::packet::emit_in_place(
        &repr.bth,
        &repr.headers,
        &mut buf,
        payload.len(),
        &ep4(),
    )
    .unwrap_err();
    assert_eq!(
        e,
        Error::BufferTooSmall {
            need,
            have: need - 1
        }
    );
}

// --- Field values -----------------------------------------------------------

#[test]
fn bad_field_reserved_aeth_syndrome() {
    let mut b = valid(0x11, 0);
    for syn in [0x40u8, 0x45, 0x65, 0x7F, 0x80, 0xA0, 0xFF] {
        b[12] = syn;
        let e = PacketRepr::parse(&b).unwrap_err();
        assert_eq!(
            e,
            Error::BadField {
                header: "AETH",
                field: "syndrome",
                value: syn.into()
            }
        );
        says(e, &["AETH.syndrome", &format!("{syn:#x}")]);
    }
}

#[test]
fn bad_field_on_emit() {
    let mut buf = [0u8; 64];
    // A 25-bit destination QPN.
    let mut b = BthRepr::new(Opcode::RC_SEND_ONLY, 1, Psn::new(1));
    b.dest_qp = 0x100_0000;
    let repr = PacketRepr {
        bth: b,
        headers: Headers::None,
        payload: &[],
    };
    says(
        repr.emit(&mut buf, &ep4()).unwrap_err(),
        &["BTH.DestQP", "0x1000000"],
    );
    // A 25-bit DETH source QPN.
    let repr = PacketRepr {
        bth: BthRepr::new(Opcode::UD_SEND_ONLY, 1, Psn::new(1)),
        headers: Headers::Deth(DethRepr {
            qkey: 1,
            src_qp: 0x100_0001,
        }),
        payload: &[],
    };
    says(
        repr.emit(&mut buf, &ep4()).unwrap_err(),
        &["DETH.SrcQP", "0x1000001"],
    );
    // An AETH credit count or RNR timer that does not fit in 5 bits.
    for syndrome in [
        Syndrome::Ack { credits: 0x20 },
        Syndrome::RnrNak { timer: 0xFF },
    ] {
        let repr = PacketRepr {
            bth: BthRepr::new(Opcode::RC_ACK, 1, Psn::new(1)),
            headers: Headers::Aeth(AethRepr {
                syndrome,
                msn: Msn::new(1),
            }),
            payload: &[],
        };
        says(repr.emit(&mut buf, &ep4()).unwrap_err(), &["AETH.syndrome"]);
    }
}

#[test]
fn bad_field_ip_header() {
    let mut ip = valid_ip4(0x04, 4);
    ip[0] = 0x44; // IHL 4 words = 16 bytes
    says(frame::parse_ip(&ip).unwrap_err(), &["IPv4.IHL", "0x4"]);
    says(icrc::over_ip_packet(&ip).unwrap_err(), &["IPv4.IHL", "0x4"]);
    ip[0] = 0x55; // version 5
    says(frame::parse_ip(&ip).unwrap_err(), &["IP.version", "0x5"]);
}

// --- Not RoCE ---------------------------------------------------------------

#[test]
fn not_roce() {
    let mut ip = valid_ip4(0x04, 4);
    ip[9] = 6; // TCP
    says(
        frame::parse_ip(&ip).unwrap_err(),
        &["not a RoCEv2 packet", "IPv4 protocol is not UDP"],
    );
    says(
        icrc::over_ip_packet(&ip).unwrap_err(),
        &["IPv4 protocol is not UDP"],
    );
    let mut ip = valid_ip4(0x04, 4);
    ip[6] = 0x20; // MF: a fragment
    says(frame::parse_ip(&ip).unwrap_err(), &["IPv4 fragment"]);
    let mut ip6 = valid_ip6(0x04, 4);
    ip6[6] = 58; // ICMPv6
    says(
        frame::parse_ip(&ip6).unwrap_err(),
        &["IPv6 next header is not UDP"],
    );
    says(
        icrc::over_ip_packet(&ip6).unwrap_err(),
        &["IPv6 next header is not UDP"],
    );
    let mut ip = valid_ip4(0x04, 4);
    ip[0] = 0x75;
    says(
        icrc::over_ip_packet(&ip).unwrap_err(),
        &["IP version is neither 4 nor 6"],
    );
    let ep = ep4();
    let mut f = frame::build_frame(ep.src, ep.dst, &valid(0x04, 4), &Default::default()).unwrap();
    f[12..14].copy_from_slice(&0x0806u16.to_be_bytes()); // ARP
    says(
        frame::ip_of_ethernet(&f).unwrap_err(),
        &["EtherType is neither IPv4 nor IPv6"],
    );
    // Mixed address families cannot be one path.
    let mixed = Endpoints::new(ep4().src, ep6().dst);
    let b = valid(0x04, 4);
    says(
        icrc::compute(&mixed, &b[..b.len() - 4]).unwrap_err(),
        &["address families differ"],
    );
    says(
        frame::build_ip(mixed.src, mixed.dst, &b, &Default::default()).unwrap_err(),
        &["address families differ"],
    );
}

// --- Lengths ----------------------------------------------------------------

#[test]
fn bad_length() {
    let ip = valid_ip4(0x04, 4);
    // IP total length beyond the bytes captured.
    let mut long = ip.clone();
    let total = ip.len() as u16 + 1;
    long[2..4].copy_from_slice(&total.to_be_bytes());
    let e = frame::parse_ip(&long).unwrap_err();
    assert_eq!(
        e,
        Error::BadLength {
            header: "IP",
            field: "total length",
            value: ip.len() + 1,
            have: ip.len()
        }
    );
    says(e, &["IP.total length says", "are present"]);
    says(
        icrc::over_ip_packet(&long).unwrap_err(),
        &["IP.total length"],
    );
    // IP total length smaller than IP + UDP headers.
    let mut tiny = ip.clone();
    tiny[2..4].copy_from_slice(&27u16.to_be_bytes());
    says(
        frame::parse_ip(&tiny).unwrap_err(),
        &["IP.total length says 27"],
    );
    // UDP length beyond the IP packet, and below the UDP header.
    for udp_len in [ip.len() as u16 - 20 + 1, 7] {
        let mut bad = ip.clone();
        bad[24..26].copy_from_slice(&udp_len.to_be_bytes());
        says(
            frame::parse_ip(&bad).unwrap_err(),
            &[&format!("UDP.length says {udp_len} bytes")],
        );
    }
    // IPv6 payload length beyond the buffer.
    let mut ip6 = valid_ip6(0x04, 4);
    let pl = (ip6.len() - 40 + 4) as u16;
    ip6[4..6].copy_from_slice(&pl.to_be_bytes());
    says(frame::parse_ip(&ip6).unwrap_err(), &["IP.total length"]);
    // Packets too large for one IP datagram.
    let huge = vec![0u8; 65536];
    let src = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 1);
    says(
        frame::build_ip(src, src, &huge, &Default::default()).unwrap_err(),
        &["UDP.length says 65544"],
    );
    says(
        frame::build_ip(src, src, &huge[..65510], &Default::default()).unwrap_err(),
        &["IPv4.total length"],
    );
    let mut b = valid(0x04, 0);
    b.resize(70_000, 0);
    says(
        icrc::compute(&ep4(), &b).unwrap_err(),
        &["IPv4.total length"],
    );
    says(
        icrc::compute(&ep6(), &b).unwrap_err(),
        &["IPv6.payload length"],
    );
}

/// Every variant of `Error` is covered above; this match fails to compile
/// when a variant is added, as a reminder to add a test for it.
#[allow(dead_code)]
fn all_variants_are_tested(e: Error) {
    match e {
        Error::Truncated { .. }
        | Error::UnknownOpcode(_)
        | Error::BadTransportVersion(_)
        | Error::PadExceedsPayload { .. }
        | Error::UnexpectedPayload { .. }
        | Error::IcrcMismatch { .. }
        | Error::HeadersDoNotMatchOpcode { .. }
        | Error::BufferTooSmall { .. }
        | Error::BadField { .. }
        | Error::NotRoce(_)
        | Error::BadLength { .. } => {}
    }
}

#[test]
fn error_is_std_error() {
    let e: Box<dyn std::error::Error> = Box::new(Error::UnknownOpcode(0x40));
    assert_eq!(e.to_string(), "unknown opcode 0x40");
}

/// Every prefix of a CM MAD is refused with a `Truncated` error naming the
/// MAD (or, for the common-header view, the header), never a panic.
#[test]
fn truncated_mads() {
    use softrdma_wire::mad::{Mad, MAD_LEN};
    use softrdma_wire::{CmMad, CmMessage};
    let mut r = common::Rng::new(5);
    for id in common::cm::ATTRIBUTES {
        let full = CmMad::send(1, common::cm::random_message(&mut r, id))
            .to_bytes()
            .unwrap();
        for len in 0..MAD_LEN {
            assert_eq!(
                CmMad::parse(&full[..len]).unwrap_err(),
                Error::Truncated {
                    header: "MAD",
                    need: MAD_LEN,
                    have: len
                }
            );
            let view = Mad::new_checked(&full[..len]);
            assert_eq!(view.is_ok(), len >= 24, "{len}");
            if len > 24 {
                assert!(matches!(
                    CmMessage::parse(id, &full[24..len]).unwrap_err(),
                    Error::Truncated { need: 232, .. }
                ));
            }
        }
    }
}
