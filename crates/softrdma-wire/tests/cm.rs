//! CM MADs: emit -> parse and parse -> emit round trips for every message,
//! the byte positions of the REQ's fields against the spec's table, the
//! errors for malformed MADs, and the UD packet that carries a MAD to QP1.

mod common;

use std::net::{Ipv4Addr, Ipv6Addr};

use common::cm::{random_message, req, ATTRIBUTES};
use common::{ep4, Rng};
use softrdma_wire::cm::{attr, CommIdsRepr, DreqRepr, RejRepr, ReqRepr};
use softrdma_wire::cma::{self, CmaHeader};
use softrdma_wire::mad::{self, gmp_packet, gmp_payload, method, MAD_LEN};
use softrdma_wire::{icrc, CmMad, CmMessage, Error, PacketRepr, Psn, RejReason};

#[test]
fn every_message_round_trips() {
    let mut r = Rng::new(0xC0FF_EE17);
    for round in 0..2000 {
        let id = ATTRIBUTES[round % ATTRIBUTES.len()];
        let m = CmMad::send(r.next_u64(), random_message(&mut r, id));
        let bytes = m.to_bytes().expect("emit");
        let back = CmMad::parse(&bytes).expect("parse");
        assert_eq!(back, m, "attribute {id:#x}");
        // And parse -> emit gives the same bytes back.
        assert_eq!(back.to_bytes().unwrap(), bytes, "attribute {id:#x}");
    }
}

#[test]
fn emit_writes_the_whole_mad_and_nothing_past_it() {
    let mut r = Rng::new(7);
    for id in ATTRIBUTES {
        let m = CmMad::send(1, random_message(&mut r, id));
        let mut buf = [0xA5u8; MAD_LEN + 8];
        m.emit(&mut buf).unwrap();
        assert!(buf[MAD_LEN..].iter().all(|&b| b == 0xA5));
        // Stale bytes in the buffer do not leak into reserved fields.
        assert_eq!(&buf[..MAD_LEN], &m.to_bytes().unwrap()[..]);
    }
}

/// The REQ's fields at the byte offsets of IBTA table 106 (counted from the
/// start of the MAD, so class data offset + 24).
#[test]
fn req_fields_sit_at_their_spec_offsets() {
    let mut q = req(&mut Rng::new(1));
    q.local_comm_id = 0x1122_3344;
    q.vendor_id = 0;
    q.service_id = cma::service_id(cma::PS_TCP, 7471);
    q.local_qpn = 0xABCDEF;
    q.responder_resources = 0x10;
    q.initiator_depth = 0x20;
    q.remote_cm_response_timeout = 0b10110;
    q.transport = softrdma_wire::cm::TransportType::Uc;
    q.end_to_end_flow_control = true;
    q.starting_psn = Psn::new(0x123456);
    q.local_cm_response_timeout = 0b01001;
    q.retry_count = 0b101;
    q.path_mtu = 5;
    q.rdc_exists = false;
    q.rnr_retry_count = 7;
    q.max_cm_retries = 15;
    q.primary_path.flow_label = 0xABCDE;
    q.primary_path.packet_rate = 0x3F;
    q.primary_path.sl = 0xA;
    q.primary_path.subnet_local = true;
    q.primary_path.local_ack_timeout = 0b11000;
    let b = CmMad::send(9, CmMessage::Req(q)).to_bytes().unwrap();
    let at = |o: usize| b[24 + o];
    assert_eq!(&b[24..28], &[0x11, 0x22, 0x33, 0x44]);
    assert_eq!(&b[24 + 4..24 + 8], &[0; 4], "reserved, and no ECE vendor");
    assert_eq!(&b[24 + 8..24 + 16], &[0, 0, 0, 0, 1, 6, 0x1D, 0x2F]);
    assert_eq!(&b[24 + 32..24 + 36], &[0xAB, 0xCD, 0xEF, 0x10]);
    assert_eq!(at(39), 0x20);
    assert_eq!(at(43), 0b1011_0011, "timeout 5 bits, UC, flow control");
    assert_eq!(&b[24 + 44..24 + 48], &[0x12, 0x34, 0x56, 0b0100_1101]);
    assert_eq!(at(50) >> 4, 5, "path MTU");
    assert_eq!(at(50) & 0x0F, 0b0111, "RDC 0, RNR retry 7");
    assert_eq!(at(51) >> 4, 15, "max CM retries");
    assert_eq!(&b[24 + 88..24 + 92], &[0xAB, 0xCD, 0xE0, 0x3F]);
    assert_eq!(at(94) & 0xF8, 0xA8, "SL 0xA, subnet local");
    assert_eq!(at(94) & 0x07, 0, "reserved");
    assert_eq!(at(95), 0b1100_0000);
    assert_eq!(&b[24 + 140..], &q.private_data[..]);
    assert_eq!(&b[..4], &[1, 0x07, 2, method::SEND]);
    assert_eq!(&b[16..18], &[0x00, 0x10], "AttributeID");
}

/// ECE, where the kernel's cm.c puts it: the REQ's VendorID in bytes
/// 5..8 of the class data (`CM_REQ_VENDOR_ID`), the REP's split over
/// bytes 15, 19 and 23 (`CM_REP_VENDOR_ID_H/_M/_L`, the byte after each
/// 24-bit field), the options in the AttributeModifier (`cm_format_mad_ece_hdr`);
/// the fields around them unchanged, and all of it read back.
#[test]
fn ece_sits_where_the_kernel_puts_it() {
    use softrdma_wire::cm::Ece;
    let ece = Ece {
        vendor_id: 0x53_5201,
        options: 0x8000_0001,
    };
    let mut q = req(&mut Rng::new(2));
    q.local_comm_id = 0x1122_3344;
    q.service_id = 0x0102_0304_0506_0708;
    let mut m = CmMad::send(9, CmMessage::Req(q));
    m.set_ece(ece).unwrap();
    let b = m.to_bytes().unwrap();
    assert_eq!(&b[20..24], &[0x80, 0, 0, 1], "AttributeModifier");
    assert_eq!(&b[24..32], &[0x11, 0x22, 0x33, 0x44, 0, 0x53, 0x52, 0x01]);
    assert_eq!(&b[32..40], &[1, 2, 3, 4, 5, 6, 7, 8], "ServiceID intact");
    let back = CmMad::parse(&b).unwrap();
    assert_eq!(back.ece(), Some(ece));
    assert_eq!(back, m);

    let mut p = common::cm::rep(&mut Rng::new(3));
    p.local_qpn = 0xAABBCC;
    p.local_eecn = 0xDDEEFF;
    p.starting_psn = Psn::new(0x123456);
    let mut m = CmMad::send(9, CmMessage::Rep(p));
    m.set_ece(ece).unwrap();
    let b = m.to_bytes().unwrap();
    let d = &b[24..];
    assert_eq!(&b[20..24], &[0x80, 0, 0, 1], "AttributeModifier");
    assert_eq!(&d[12..16], &[0xAA, 0xBB, 0xCC, 0x53], "QPN, VendorID high");
    assert_eq!(
        &d[16..20],
        &[0xDD, 0xEE, 0xFF, 0x52],
        "EECN, VendorID middle"
    );
    assert_eq!(&d[20..24], &[0x12, 0x34, 0x56, 0x01], "PSN, VendorID low");
    let back = CmMad::parse(&b).unwrap();
    assert_eq!(back.ece(), Some(ece));
    assert_eq!(back, m);

    // No ECE is all zero: the bytes a peer without ECE sends.
    let mut p = common::cm::rep(&mut Rng::new(3));
    p.vendor_id = 0;
    let m = CmMad::send(9, CmMessage::Rep(p));
    let b = m.to_bytes().unwrap();
    assert_eq!((b[24 + 15], b[24 + 19], b[24 + 23]), (0, 0, 0));
    assert_eq!(&b[20..24], &[0; 4]);
    assert_eq!(m.ece(), Some(Ece::default()));

    // Only REQ and REP carry it; a vendor wider than 24 bits is refused.
    let mut rtu = CmMad::send(9, random_message(&mut Rng::new(4), attr::RTU));
    assert_eq!(rtu.ece(), None);
    assert!(rtu.set_ece(ece).is_err());
    assert!(rtu.set_ece(Ece::default()).is_ok());
    let mut m = CmMad::send(9, CmMessage::Req(q));
    let wide = Ece {
        vendor_id: 0x100_0000,
        options: 0,
    };
    assert!(m.set_ece(wide).is_err());
    q.vendor_id = 0x100_0000;
    assert!(CmMad::send(9, CmMessage::Req(q)).to_bytes().is_err());
}

#[test]
fn rej_reason_and_short_messages() {
    let rej = RejRepr {
        local_comm_id: 5,
        remote_comm_id: 6,
        message_rejected: softrdma_wire::cm::MessageKind::Req,
        reject_info_len: 0,
        reason: RejReason::InvalidServiceId,
        ari: [0; 72],
        private_data: [0; 148],
    };
    let b = CmMad::send(1, CmMessage::Rej(rej)).to_bytes().unwrap();
    assert_eq!(&b[24 + 10..24 + 12], &[0, 8]);
    let dreq = DreqRepr {
        local_comm_id: 1,
        remote_comm_id: 2,
        remote_qpn: 0x000123,
        private_data: [0x5A; 220],
    };
    let b = CmMad::send(1, CmMessage::Dreq(dreq)).to_bytes().unwrap();
    assert_eq!(&b[24 + 8..24 + 12], &[0, 1, 0x23, 0]);
    assert_eq!(&b[24 + 12..], &[0x5A; 220][..]);
}

fn sample_mad() -> [u8; MAD_LEN] {
    let rtu = CommIdsRepr {
        local_comm_id: 1,
        remote_comm_id: 2,
        private_data: [0; 224],
    };
    CmMad::send(3, CmMessage::Rtu(rtu)).to_bytes().unwrap()
}

#[test]
fn malformed_mads_are_named() {
    let good = sample_mad();
    assert_eq!(
        CmMad::parse(&good[..255]).unwrap_err(),
        Error::Truncated {
            header: "MAD",
            need: 256,
            have: 255
        }
    );
    let mut long = good.to_vec();
    long.push(0);
    assert!(matches!(
        CmMad::parse(&long).unwrap_err(),
        Error::BadLength {
            header: "MAD",
            field: "length",
            value: 257,
            have: 256
        }
    ));
    let field_of = |b: &[u8]| match CmMad::parse(b).unwrap_err() {
        Error::BadField { header, field, .. } => format!("{header}.{field}"),
        e => panic!("unexpected {e:?}"),
    };
    let with = |i: usize, v: u8| {
        let mut b = good;
        b[i] = v;
        b
    };
    assert_eq!(field_of(&with(0, 2)), "MAD.BaseVersion");
    assert_eq!(field_of(&with(1, 0x03)), "MAD.MgmtClass");
    assert_eq!(field_of(&with(2, 1)), "MAD.ClassVersion");
    assert_eq!(field_of(&with(17, 0x19)), "MAD.AttributeID"); // LAP: unsupported
                                                              // Reserved enum values inside messages.
    let mut r = Rng::new(3);
    let req = CmMad::send(1, random_message(&mut r, attr::REQ))
        .to_bytes()
        .unwrap();
    // Transport service type 3 is Extended (XRC with extended type 1):
    // every 2-bit value is defined, so it parses; the CM judges the
    // extended type (softrdma-cm rejects all but XRC).
    let mut ext = req;
    ext[24 + 43] |= 0b110;
    match CmMad::parse(&ext).unwrap().message {
        softrdma_wire::cm::CmMessage::Req(q) => {
            assert_eq!(q.transport, softrdma_wire::cm::TransportType::Extended)
        }
        m => panic!("not a REQ: {m:?}"),
    }
    let rej = CmMad::send(1, random_message(&mut r, attr::REJ))
        .to_bytes()
        .unwrap();
    let mut bad = rej;
    bad[24 + 8] |= 0xC0;
    assert_eq!(field_of(&bad), "CM REJ.MessageRejected");
    let mut bad = rej;
    bad[24 + 9] = 73 << 1;
    assert!(matches!(
        CmMad::parse(&bad).unwrap_err(),
        Error::BadLength {
            header: "CM REJ",
            field: "RejectedInfoLength",
            value: 73,
            ..
        }
    ));
    let sidr = CmMad::send(1, random_message(&mut r, attr::SIDR_REP))
        .to_bytes()
        .unwrap();
    let mut bad = sidr;
    bad[24 + 4] = 6;
    assert_eq!(field_of(&bad), "CM SIDR_REP.Status");
}

#[test]
fn short_class_data_is_truncated_not_a_panic() {
    let good = sample_mad();
    for id in ATTRIBUTES {
        for len in [0, 1, 100, 231] {
            match CmMessage::parse(id, &good[24..24 + len]) {
                Err(Error::Truncated {
                    need: 232, have, ..
                }) => assert_eq!(have, len),
                other => panic!("attribute {id:#x}, {len} bytes: {other:?}"),
            }
        }
    }
}

#[test]
fn emit_refuses_values_wider_than_their_field() {
    let mut r = Rng::new(11);
    let field_of = |m: CmMessage| match CmMad::send(1, m).to_bytes().unwrap_err() {
        Error::BadField { header, field, .. } => format!("{header}.{field}"),
        e => panic!("unexpected {e:?}"),
    };
    let mut q: ReqRepr = req(&mut r);
    q.local_qpn = 1 << 24;
    assert_eq!(field_of(CmMessage::Req(q)), "CM REQ.LocalQPN");
    let mut q = req(&mut r);
    q.primary_path.flow_label = 1 << 20;
    assert_eq!(field_of(CmMessage::Req(q)), "CM REQ.FlowLabel");
    let mut q = req(&mut r);
    q.rnr_retry_count = 8;
    assert_eq!(field_of(CmMessage::Req(q)), "CM REQ.RNRRetryCount");
    let CmMessage::Rep(mut p) = random_message(&mut r, attr::REP) else {
        unreachable!()
    };
    p.local_qpn = 0x0100_0000;
    assert_eq!(field_of(CmMessage::Rep(p)), "CM REP.LocalQPN");
    // A header whose AttributeID disagrees with the message.
    let mut m = CmMad::send(1, random_message(&mut r, attr::RTU));
    m.header.attribute_id = attr::DREP;
    assert!(m.to_bytes().is_err());
    // A buffer too small for a MAD.
    let m = CmMad::send(1, random_message(&mut r, attr::RTU));
    assert_eq!(
        m.emit(&mut [0u8; 255]).unwrap_err(),
        Error::BufferTooSmall {
            need: 256,
            have: 255
        }
    );
}

#[test]
fn a_mad_travels_as_a_ud_send_to_qp1() {
    let bytes = sample_mad();
    let p = gmp_packet(1, Psn::new(42), &bytes);
    let ep = ep4();
    let mut buf = vec![0u8; p.buffer_len()];
    let n = p.emit(&mut buf, &ep).unwrap();
    // BTH 12 + DETH 8 + MAD 256 + ICRC 4, no pad.
    assert_eq!(n, 12 + 8 + 256 + 4);
    icrc::verify(&ep, &buf).unwrap();
    let back = PacketRepr::parse(&buf).unwrap();
    assert_eq!(back.bth.pkey, 0xFFFF);
    assert_eq!(back.bth.dest_qp, 1);
    let deth = back.headers.deth().unwrap();
    assert_eq!((deth.qkey, deth.src_qp), (0x8001_0000, 1));
    assert_eq!(gmp_payload(&back).unwrap(), &bytes);
    assert!(matches!(
        CmMad::parse(gmp_payload(&back).unwrap()).unwrap().message,
        CmMessage::Rtu(_)
    ));
}

#[test]
fn gmp_rules_are_checked() {
    let bytes = sample_mad();
    let field = |p: &PacketRepr<'_>| match gmp_payload(p).unwrap_err() {
        Error::BadField { field, .. } | Error::BadLength { field, .. } => field,
        e => panic!("unexpected {e:?}"),
    };
    let mut p = gmp_packet(1, Psn::new(0), &bytes);
    p.bth.dest_qp = 2;
    assert_eq!(field(&p), "DestQP");
    let mut p = gmp_packet(1, Psn::new(0), &bytes);
    if let softrdma_wire::Headers::Deth(d) = &mut p.headers {
        d.qkey = 0x1234;
    }
    assert_eq!(field(&p), "Q_Key");
    let mut p = gmp_packet(1, Psn::new(0), &bytes);
    p.payload = &bytes[..200];
    assert_eq!(field(&p), "payload");
    let mut p = gmp_packet(1, Psn::new(0), &bytes);
    p.bth.opcode = softrdma_wire::Opcode::UD_SEND_ONLY_IMM;
    assert_eq!(field(&p), "opcode");
    assert_eq!(mad::GSI_QKEY, 0x8001_0000);
}

#[test]
fn cma_header_round_trips_both_families() {
    let hs = [
        CmaHeader {
            src: Ipv4Addr::new(192, 168, 10, 1).into(),
            dst: Ipv4Addr::new(192, 168, 10, 2).into(),
            src_port: 40000,
        },
        CmaHeader {
            src: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).into(),
            dst: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2).into(),
            src_port: 1,
        },
    ];
    for h in hs {
        let mut b = [0u8; 92];
        h.emit(&mut b).unwrap();
        assert_eq!(CmaHeader::parse(&b).unwrap(), h);
    }
    let mixed = CmaHeader {
        src: Ipv4Addr::LOCALHOST.into(),
        dst: Ipv6Addr::LOCALHOST.into(),
        src_port: 1,
    };
    assert!(mixed.emit(&mut [0u8; 36]).is_err());
    let mut b = [0u8; 36];
    hs[0].emit(&mut b).unwrap();
    b[1] = 0x50;
    assert!(matches!(
        CmaHeader::parse(&b).unwrap_err(),
        Error::BadField {
            field: "ip_version",
            value: 5,
            ..
        }
    ));
    b[1] = 0x40;
    b[0] = 1;
    assert!(matches!(
        CmaHeader::parse(&b).unwrap_err(),
        Error::BadField {
            field: "version",
            ..
        }
    ));
    assert!(matches!(
        CmaHeader::parse(&b[..35]).unwrap_err(),
        Error::Truncated {
            need: 36,
            have: 35,
            ..
        }
    ));
    assert_eq!(cma::REQ_USER_DATA_LEN, 56);
}
