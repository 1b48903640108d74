//! emit -> parse round trips for every opcode of the table, at the boundaries
//! (PSN wrap, zero-length and max-MTU payloads, every pad count, 24-bit QPNs,
//! every flag bit), and as a property over arbitrary headers and payloads.

mod common;

use std::net::{IpAddr, SocketAddr};

use common::{all_syndromes, ep4, ep6, Fields, Rng};
use proptest::prelude::*;
use softrdma_wire::packet::{
    self, emit_around, emit_in_place, packet_len, pad_for, payload_offset,
};
use softrdma_wire::{
    bth, frame, icrc, AethRepr, BthRepr, Endpoints, HeaderLayout, Headers, Msn, Opcode, PacketRepr,
    Psn, OPCODE_TABLE,
};

const MTU: usize = 4096;

/// Emits `repr` between `ep`, checks the length, the ICRC and the bytes of
/// the pad, and returns the packet.
fn emit_checked(repr: &PacketRepr<'_>, ep: &Endpoints) -> Vec<u8> {
    let mut buf = vec![0xA5u8; repr.buffer_len() + 7];
    let n = repr.emit(&mut buf, ep).expect("emit");
    assert_eq!(n, repr.buffer_len());
    assert_eq!(n, packet_len(&repr.headers, repr.payload.len()));
    assert_eq!(n % 4, 0, "RoCEv2 packets are a multiple of 4 bytes");
    assert!(
        buf[n..].iter().all(|&b| b == 0xA5),
        "emit wrote past its length"
    );
    buf.truncate(n);
    let pad = pad_for(repr.payload.len());
    let pay_end = payload_offset(&repr.headers) + repr.payload.len();
    assert!(
        buf[pay_end..pay_end + pad].iter().all(|&b| b == 0),
        "pad bytes are zero"
    );
    assert_eq!((buf[1] >> 4) & 3, pad as u8, "BTH.PadCnt");
    icrc::verify(ep, &buf).expect("ICRC of an emitted packet verifies");
    buf
}

/// parse(emit(x)) == x for both address families, plus the IP framing.
fn assert_round_trip(repr: &PacketRepr<'_>, ctx: &str) {
    for ep in [ep4(), ep6()] {
        let wire = emit_checked(repr, &ep);
        let back = PacketRepr::parse(&wire).expect("parse of an emitted packet");
        assert_eq!(&back, repr, "{ctx}");
        // Through a built IP packet: the real-capture ICRC path agrees.
        let ip = frame::build_ip(ep.src, ep.dst, &wire, &Default::default()).unwrap();
        let (stored, computed) = icrc::over_ip_packet(&ip).unwrap();
        assert_eq!(stored, computed, "{ctx}");
        let found = frame::parse_ip(&ip).unwrap();
        assert_eq!((found.src, found.dst), (ep.src, ep.dst));
        assert_eq!(found.udp_payload, &wire[..]);
    }
}

fn repr_for<'a>(
    code: u8,
    bth_proto: &BthRepr,
    fields: &Fields,
    payload: &'a [u8],
) -> PacketRepr<'a> {
    let op = Opcode::from_u8(code).unwrap();
    let info = op.info();
    let payload = if info.has_payload { payload } else { &[] };
    PacketRepr {
        bth: BthRepr {
            opcode: op,
            pad_count: pad_for(payload.len()) as u8,
            ..*bth_proto
        },
        headers: fields.headers(info.layout),
        payload,
    }
}

struct Scenario {
    name: &'static str,
    bth: BthRepr,
    fields: Fields,
}

fn scenarios() -> Vec<Scenario> {
    let min = BthRepr {
        opcode: Opcode::RC_SEND_ONLY,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        pkey: 0,
        fecn: false,
        becn: false,
        dest_qp: 0,
        ack_req: false,
        psn: Psn::new(0),
    };
    let max = BthRepr {
        solicited: true,
        mig_req: true,
        pkey: 0xFFFF,
        fecn: true,
        becn: true,
        dest_qp: 0xFF_FFFF,
        ack_req: true,
        psn: Psn::new(0xFF_FFFF),
        ..min
    };
    let mut r = Rng::new(0x5EED);
    vec![
        Scenario {
            name: "all zero",
            bth: min,
            fields: Fields::zero(),
        },
        Scenario {
            name: "all max, every flag, PSN 0xFFFFFF, QPN 0xFFFFFF",
            bth: max,
            fields: Fields::max(),
        },
        Scenario {
            name: "PSN wrapped to 0 after 0xFFFFFF",
            bth: BthRepr {
                psn: Psn::new(0xFF_FFFF).next(),
                dest_qp: 1,
                ..max
            },
            fields: Fields::random(&mut r),
        },
        Scenario {
            name: "random",
            bth: BthRepr {
                pkey: 0x8001,
                dest_qp: 0x12_3456,
                psn: Psn::new(0x7F_FFFF),
                fecn: true,
                ack_req: true,
                ..min
            },
            fields: Fields::random(&mut r),
        },
    ]
}

#[test]
fn every_opcode_round_trips_at_the_boundaries() {
    let mut r = Rng::new(1);
    let big = r.bytes(MTU);
    // Zero-length, every pad count (1..=3 and 0), and the max MTU payload.
    let lens = [0usize, 1, 2, 3, 4, 5, 6, 7, MTU - 3, MTU - 1, MTU];
    let mut count = 0;
    for info in OPCODE_TABLE {
        for sc in scenarios() {
            for &len in &lens {
                if !info.has_payload && len != 0 {
                    continue;
                }
                let repr = repr_for(info.code, &sc.bth, &sc.fields, &big[..len]);
                let ctx = format!("{} len {len}: {}", info.name, sc.name);
                assert_round_trip(&repr, &ctx);
                count += 1;
            }
        }
    }
    let with_payload = OPCODE_TABLE.iter().filter(|i| i.has_payload).count();
    // RC, UC, UD, CNP, and XRC's 23 (RC's twins).
    assert_eq!(OPCODE_TABLE.len(), 38 + 23);
    assert_eq!(with_payload, 32 + 18);
    // 50 opcodes with payload x 4 scenarios x 11 lengths + 11 without x 4.
    assert_eq!(count, 50 * 4 * 11 + 11 * 4);
}

#[test]
fn xrceth_sits_after_the_bth_and_before_the_other_headers() {
    let ep = Endpoints::new(
        "10.0.0.1:49152".parse().unwrap(),
        "10.0.0.2:4791".parse().unwrap(),
    );
    let reth = softrdma_wire::RethRepr {
        va: 0x1122_3344_5566_7788,
        rkey: 0xA1B2_C3D4,
        dma_len: 8,
    };
    let data = [7u8; 8];
    let p = PacketRepr {
        bth: BthRepr::new(Opcode::XRC_WRITE_ONLY_IMM, 0x42, Psn::new(9)),
        headers: Headers::XrcRethImm(0xAB_CDEF, reth, 0xDEAD_BEEF),
        payload: &data,
    };
    let wire = emit_checked(&p, &ep);
    // BTH (12), XRCETH (reserved byte, 24-bit SRQ number), RETH, ImmDt.
    assert_eq!(wire[0], 0xAB);
    assert_eq!(&wire[12..16], &[0, 0xAB, 0xCD, 0xEF]);
    assert_eq!(&wire[16..24], &0x1122_3344_5566_7788u64.to_be_bytes());
    assert_eq!(&wire[24..28], &0xA1B2_C3D4u32.to_be_bytes());
    assert_eq!(&wire[32..36], &0xDEAD_BEEFu32.to_be_bytes());
    assert_eq!(&wire[36..44], &data);
    let back = PacketRepr::parse(&wire).unwrap();
    assert_eq!(back, p);
    assert_eq!(back.headers.xrc_srqn(), Some(0xAB_CDEF));
    assert_eq!(back.headers.reth(), Some(reth));
    assert_eq!(back.headers.imm(), Some(0xDEAD_BEEF));
    assert_eq!(
        back.headers.without_xrceth(),
        Headers::RethImm(reth, 0xDEAD_BEEF)
    );
    // The reserved byte is ignored on receipt.
    let mut odd = wire.clone();
    odd[12] = 0xFF;
    assert_eq!(
        PacketRepr::parse(&odd).unwrap().headers.xrc_srqn(),
        Some(0xAB_CDEF)
    );
    // The view reads and writes the same bytes.
    let mut b = [0xFFu8; 4];
    let mut v = softrdma_wire::small::XrcEth::new_unchecked(&mut b[..]);
    v.set_srq_num(0x12_3456);
    assert_eq!(v.srq_num(), 0x12_3456);
    assert_eq!(b, [0, 0x12, 0x34, 0x56]);
    assert!(softrdma_wire::small::XrcEth::new_checked(&b[..3]).is_err());
    // A 25-bit SRQ number is refused, not truncated.
    let bad = PacketRepr {
        headers: Headers::Xrc(0x100_0000),
        bth: BthRepr::new(Opcode::XRC_SEND_ONLY, 1, Psn::new(0)),
        payload: &[],
    };
    let mut buf = vec![0u8; bad.buffer_len()];
    assert!(bad.emit(&mut buf, &ep).is_err());
    // An XRC request cut inside its XRCETH names it.
    let send = PacketRepr {
        bth: BthRepr::new(Opcode::XRC_SEND_ONLY, 1, Psn::new(0)),
        headers: Headers::Xrc(5),
        payload: &[],
    };
    let w = emit_checked(&send, &ep);
    assert!(PacketRepr::parse(&w[..14]).is_err());
    // Responses carry no XRCETH: an XRC ACK is RC's AETH alone.
    assert_eq!(
        Opcode::XRC_ACK.info().layout,
        softrdma_wire::HeaderLayout::Aeth
    );
}

#[test]
fn psn_wrap_on_the_wire() {
    let ep = ep4();
    let mut psn = Psn::new(0xFF_FFFE);
    let mut seen = Vec::new();
    for _ in 0..4 {
        let repr = PacketRepr {
            bth: BthRepr::new(Opcode::RC_SEND_MIDDLE, 7, psn),
            headers: Headers::None,
            payload: &[],
        };
        let wire = emit_checked(&repr, &ep);
        assert_eq!(&wire[9..12], &psn.value().to_be_bytes()[1..]);
        seen.push(PacketRepr::parse(&wire).unwrap().bth.psn.value());
        psn = psn.next();
    }
    assert_eq!(seen, [0xFF_FFFE, 0xFF_FFFF, 0, 1]);
}

#[test]
fn pad_counts_one_to_three_on_the_wire() {
    for (len, pad) in [(0usize, 0u8), (1, 3), (2, 2), (3, 1), (4, 0), (4093, 3)] {
        let payload = vec![0x5Au8; len];
        let repr = PacketRepr {
            bth: BthRepr {
                pad_count: pad,
                ..BthRepr::new(Opcode::UC_SEND_ONLY, 0xD3, Psn::new(5))
            },
            headers: Headers::None,
            payload: &payload,
        };
        let wire = emit_checked(&repr, &ep6());
        assert_eq!(wire.len(), 12 + len + usize::from(pad) + 4);
        assert_eq!(PacketRepr::parse(&wire).unwrap().bth.pad_count, pad);
    }
}

#[test]
fn every_flag_bit_lands_where_the_spec_says() {
    let base = BthRepr {
        pkey: 0,
        ..BthRepr::new(Opcode::RC_SEND_ONLY, 0, Psn::new(0))
    };
    type SetFlag = fn(&mut BthRepr);
    let cases: [(SetFlag, usize, u8); 5] = [
        (|b| b.solicited = true, 1, 0x80),
        (|b| b.mig_req = true, 1, 0x40),
        (|b| b.fecn = true, 4, 0x80),
        (|b| b.becn = true, 4, 0x40),
        (|b| b.ack_req = true, 8, 0x80),
    ];
    for (set, byte, bit) in cases {
        let mut b = base;
        set(&mut b);
        let repr = PacketRepr {
            bth: b,
            headers: Headers::None,
            payload: &[],
        };
        let wire = emit_checked(&repr, &ep4());
        let mut want = [0u8; 12];
        want[0] = 0x04;
        want[byte] = bit;
        assert_eq!(&wire[..12], &want, "flag in byte {byte} bit {bit:#x}");
        assert_eq!(PacketRepr::parse(&wire).unwrap(), repr);
    }
}

#[test]
fn every_valid_syndrome_round_trips() {
    let syndromes = all_syndromes();
    // 32 ACK credit codes + 32 RNR timer codes + 5 NAK codes.
    assert_eq!(syndromes.len(), 32 + 32 + 5);
    for s in syndromes {
        for op in [Opcode::RC_ACK, Opcode::RC_READ_RESPONSE_ONLY] {
            let repr = PacketRepr {
                bth: BthRepr::new(op, 0xFF_FFFF, Psn::new(0xFF_FFFF)),
                headers: Headers::Aeth(AethRepr {
                    syndrome: s,
                    msn: Msn::new(0xFF_FFFF),
                }),
                payload: &[],
            };
            assert_round_trip(&repr, &format!("{s:?}"));
        }
    }
}

#[test]
fn emit_in_place_matches_emit() {
    let mut r = Rng::new(7);
    let payload = r.bytes(1001);
    let headers = Fields::random(&mut r).headers(HeaderLayout::RethImm);
    let b = BthRepr::new(Opcode::RC_WRITE_ONLY_IMM, 0xAB_CDEF, Psn::new(3));
    let repr = PacketRepr {
        bth: BthRepr { pad_count: 3, ..b },
        headers,
        payload: &payload,
    };
    let via_emit = emit_checked(&repr, &ep4());
    let mut buf = vec![0u8; packet::packet_len(&headers, payload.len())];
    let off = payload_offset(&headers);
    buf[off..off + payload.len()].copy_from_slice(&payload);
    // pad_count in the BthRepr is ignored: 0 here, 3 on the wire.
    let n = emit_in_place(&b, &headers, &mut buf, payload.len(), &ep4()).unwrap();
    assert_eq!(n, buf.len());
    assert_eq!(buf, via_emit);
}

/// A packet emitted around a hole, its ICRC taken over the payload where
/// it lies (as a slice and by address), is the packet `emit_in_place`
/// builds once the payload is put in the hole: every layout with a
/// payload, every pad count, up to a full MTU, IPv4 and IPv6.
#[test]
fn emit_around_matches_emit_in_place() {
    let mut r = Rng::new(11);
    let cases = [
        (Opcode::RC_WRITE_FIRST, HeaderLayout::Reth),
        (Opcode::RC_WRITE_MIDDLE, HeaderLayout::None),
        (Opcode::RC_WRITE_LAST_IMM, HeaderLayout::Imm),
        (Opcode::RC_WRITE_ONLY_IMM, HeaderLayout::RethImm),
        (Opcode::RC_SEND_LAST_INV, HeaderLayout::Ieth),
        (Opcode::UD_SEND_ONLY_IMM, HeaderLayout::DethImm),
    ];
    for (opcode, layout) in cases {
        for len in [0usize, 1, 2, 3, 4, 255, 256, 300, 511, 512, 1001, 4093, MTU] {
            for ep in [ep4(), ep6()] {
                let payload = r.bytes(len);
                let headers = Fields::random(&mut r).headers(layout);
                let b = BthRepr::new(opcode, 0x12_3456, Psn::new(r.next_u32()));
                let n = packet_len(&headers, len);
                let off = payload_offset(&headers);
                let mut want = vec![0u8; n];
                want[off..off + len].copy_from_slice(&payload);
                emit_in_place(&b, &headers, &mut want, len, &ep).unwrap();
                for by_address in [false, true] {
                    let mut got = vec![0x5Au8; n + 3];
                    let m = emit_around(&b, &headers, &mut got, len, &ep, |crc, head| {
                        if by_address {
                            // SAFETY: the payload vector is readable for `len` bytes.
                            unsafe { icrc::crc32_raw(crc, head, payload.as_ptr(), len) }
                        } else {
                            icrc::crc32(crc, head, &payload)
                        }
                    })
                    .unwrap();
                    assert_eq!(m, n);
                    assert!(
                        got[off..off + len].iter().all(|&x| x == 0x5A),
                        "hole untouched"
                    );
                    assert!(
                        got[n..].iter().all(|&x| x == 0x5A),
                        "nothing past the packet"
                    );
                    got[off..off + len].copy_from_slice(&payload);
                    got.truncate(n);
                    assert_eq!(
                        got, want,
                        "{opcode:?} len {len} {ep:?} by address {by_address}"
                    );
                }
            }
        }
    }
}

#[test]
fn largest_ipv4_packet_emits_and_one_more_byte_fails() {
    // The UDP payload may be at most 65535 - 20 (IPv4) - 8 (UDP) = 65507
    // bytes, and a RoCE packet is a multiple of 4: 65504.
    let max_udp = (65535 - 20 - 8) / 4 * 4;
    let payload_len = max_udp - bth::HEADER_LEN - icrc::ICRC_LEN;
    let payload = vec![1u8; payload_len];
    let repr = PacketRepr {
        bth: BthRepr::new(Opcode::RC_SEND_ONLY, 1, Psn::new(1)),
        headers: Headers::None,
        payload: &payload,
    };
    let wire = emit_checked(&repr, &ep4());
    assert_eq!(wire.len(), max_udp);
    let payload = vec![1u8; payload_len + 1];
    let repr = PacketRepr {
        payload: &payload,
        ..repr
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    let err = repr.emit(&mut buf, &ep4()).unwrap_err();
    assert!(err.to_string().contains("IPv4.total length"), "{err}");
}

// ---------------------------------------------------------------------------
// Property tests.

fn arb_syndrome() -> impl Strategy<Value = softrdma_wire::Syndrome> {
    use softrdma_wire::{NakCode, Syndrome};
    prop_oneof![
        (0u8..32).prop_map(|credits| Syndrome::Ack { credits }),
        (0u8..32).prop_map(|timer| Syndrome::RnrNak { timer }),
        (0u8..5).prop_map(|c| Syndrome::Nak(NakCode::from_value(c).unwrap())),
    ]
}

prop_compose! {
    fn arb_bth()(
        idx in 0..OPCODE_TABLE.len(),
        flags in any::<[bool; 5]>(),
        pkey in any::<u16>(),
        dest_qp in 0..=0xFF_FFFFu32,
        psn in 0..=0xFF_FFFFu32,
    ) -> BthRepr {
        BthRepr {
            opcode: Opcode::from_u8(OPCODE_TABLE[idx].code).unwrap(),
            solicited: flags[0],
            mig_req: flags[1],
            pad_count: 0,
            pkey,
            fecn: flags[2],
            becn: flags[3],
            dest_qp,
            ack_req: flags[4],
            psn: Psn::new(psn),
        }
    }
}

prop_compose! {
    fn arb_fields()(
        va in any::<u64>(),
        rkey in any::<u32>(),
        dma_len in any::<u32>(),
        imm in any::<u32>(),
        syndrome in arb_syndrome(),
        msn in 0..=0xFF_FFFFu32,
        atomic in any::<[u64; 3]>(),
        qkey in any::<u32>(),
        src_qp in 0..=0xFF_FFFFu32,
    ) -> Fields {
        Fields {
            va, rkey, dma_len, imm, syndrome, msn: Msn::new(msn),
            orig: atomic[0], swap_add: atomic[1], compare: atomic[2],
            qkey, src_qp,
        }
    }
}

fn arb_endpoints_v4() -> impl Strategy<Value = Endpoints> {
    (
        any::<[u8; 4]>(),
        any::<[u8; 4]>(),
        any::<u16>(),
        any::<u16>(),
    )
        .prop_map(|(s, d, sp, dp)| {
            Endpoints::new(
                SocketAddr::new(IpAddr::from(s), sp),
                SocketAddr::new(IpAddr::from(d), dp),
            )
        })
}

fn arb_endpoints_v6() -> impl Strategy<Value = Endpoints> {
    (
        any::<[u8; 16]>(),
        any::<[u8; 16]>(),
        any::<u16>(),
        any::<u16>(),
    )
        .prop_map(|(s, d, sp, dp)| {
            Endpoints::new(
                SocketAddr::new(IpAddr::from(s), sp),
                SocketAddr::new(IpAddr::from(d), dp),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn prop_parse_emit_round_trip(
        bth in arb_bth(),
        fields in arb_fields(),
        payload in prop::collection::vec(any::<u8>(), 0..=MTU),
        ep4 in arb_endpoints_v4(),
        ep6 in arb_endpoints_v6(),
    ) {
        let repr = repr_for(bth.opcode.value(), &bth, &fields, &payload);
        for ep in [ep4, ep6] {
            let mut buf = vec![0u8; repr.buffer_len()];
            let n = repr.emit(&mut buf, &ep).unwrap();
            prop_assert_eq!(n, buf.len());
            prop_assert_eq!(PacketRepr::parse(&buf).unwrap(), repr);
            prop_assert!(icrc::verify(&ep, &buf).is_ok());
            // The same packet inside a whole Ethernet frame, found again and
            // checked over the real IP header.
            let f = frame::build_frame(ep.src, ep.dst, &buf, &Default::default()).unwrap();
            let ip = frame::ip_of_ethernet(&f).unwrap();
            let (stored, computed) = icrc::over_ip_packet(ip).unwrap();
            prop_assert_eq!(stored, computed);
            let found = frame::parse_ip(ip).unwrap();
            prop_assert_eq!(found.src, ep.src);
            prop_assert_eq!(found.dst, ep.dst);
            prop_assert_eq!(found.udp_payload, &buf[..]);
        }
    }

    #[test]
    fn prop_psn_arithmetic_matches_the_wire(psn in 0..=0xFF_FFFFu32, n in 0..=0x1FF_FFFFu32) {
        let p = Psn::new(psn).add(n);
        let repr = PacketRepr {
            bth: BthRepr::new(Opcode::RC_SEND_FIRST, 1, p),
            headers: Headers::None,
            payload: &[],
        };
        let mut buf = [0u8; 16];
        repr.emit(&mut buf, &ep4()).unwrap();
        let back = PacketRepr::parse(&buf).unwrap().bth.psn;
        prop_assert_eq!(back.value(), psn.wrapping_add(n) & 0xFF_FFFF);
        prop_assert_eq!(back.distance_from(Psn::new(psn)), n & 0xFF_FFFF);
    }
}
