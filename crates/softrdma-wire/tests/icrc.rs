//! The invariant CRC: known answers from an independent implementation
//! (`shared/tools/icrc-check.py`), every RoCE frame of the real captures in
//! `shared/captures`, and single-bit flips over every byte of emitted packets
//! (covered bytes are detected, masked ones are not).

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use common::{ep4, ep6, Fields, Rng};
use softrdma_wire::frame::{self, FrameOptions};
use softrdma_wire::{
    icrc, AethRepr, AtomicEthRepr, BthRepr, DethRepr, Endpoints, Headers, Msn, Opcode, PacketRepr,
    Psn, RethRepr, Syndrome, OPCODE_TABLE,
};

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

// ---------------------------------------------------------------------------
// Known answers. The expected bytes are written from the spec; the ICRCs were
// computed with shared/tools/icrc-check.py (zlib.crc32 over the masked
// headers), not with this crate.

/// RC WRITE_ONLY, SE, QPN 0x000102, AckReq, PSN 0x030405, RETH
/// 0x1122334455667788 / 0x99AABBCC / 5, payload "hello" + 3 pad bytes.
fn known_packet() -> PacketRepr<'static> {
    let mut bth = BthRepr::new(Opcode::RC_WRITE_ONLY, 0x000102, Psn::new(0x030405));
    bth.solicited = true;
    bth.ack_req = true;
    bth.pad_count = 3;
    PacketRepr {
        bth,
        headers: Headers::Reth(RethRepr {
            va: 0x1122_3344_5566_7788,
            rkey: 0x99AA_BBCC,
            dma_len: 5,
        }),
        payload: b"hello",
    }
}

const KNOWN_BODY: &str = "0ab0ffff 00000102 80030405
    1122334455667788 99aabbcc 00000005
    68656c6c6f 000000";

#[test]
fn known_answer_ipv4() {
    let repr = known_packet();
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf, &ep4()).unwrap();
    let mut want = hex(KNOWN_BODY);
    want.extend_from_slice(&hex("222d097e")); // LSB first on the wire
    assert_eq!(buf, want);
    assert_eq!(icrc::stored(&buf).unwrap(), 0x7e09_2d22);
    icrc::verify(&ep4(), &buf).unwrap();
}

#[test]
fn known_answer_ipv6() {
    let repr = known_packet();
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf, &ep6()).unwrap();
    let mut want = hex(KNOWN_BODY);
    want.extend_from_slice(&hex("535573bb"));
    assert_eq!(buf, want);
    icrc::verify(&ep6(), &buf).unwrap();
}

#[test]
fn known_answer_ipv4_with_options_id_and_tos() {
    // IHL 6 (one word of NOP options), TOS 0xB8, ID 0xBEEF, no DF, TTL 7, a
    // junk header checksum: the real-packet path covers ID, flags and options.
    let mut ip = hex("46b80048beef00000711abcdc0a80a01c0a80a0201010100
         c12312b700300000");
    ip.extend_from_slice(&hex(KNOWN_BODY));
    ip.extend_from_slice(&hex("964396c6"));
    let (stored, computed) = icrc::over_ip_packet(&ip).unwrap();
    assert_eq!(stored, computed);
    assert_eq!(computed, 0xc696_4396);
    let found = frame::parse_ip(&ip).unwrap();
    assert_eq!(found.src, ep4().src);
    assert_eq!(found.dst, ep4().dst);
    assert_eq!(
        PacketRepr::parse(found.udp_payload).unwrap(),
        known_packet()
    );
    // The synthesized header (ID 0, DF, no options) gives a different ICRC.
    assert!(icrc::verify(&ep4(), found.udp_payload).is_err());
}

// ---------------------------------------------------------------------------
// Real captures.

/// `<workspace root>/../shared`, when present.
fn shared_dir() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    p.join("captures").is_dir().then_some(p)
}

/// Frames of a classic pcap file (either byte order, us or ns timestamps),
/// with its link type.
fn read_pcap(path: &Path) -> (u32, Vec<Vec<u8>>) {
    let d = std::fs::read(path).unwrap();
    assert!(d.len() >= 24, "{}: short pcap header", path.display());
    let le = match d[..4] {
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => true,
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => false,
        _ => panic!("{}: not a classic pcap file", path.display()),
    };
    let u32_at = |o: usize| {
        let b = [d[o], d[o + 1], d[o + 2], d[o + 3]];
        if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    let linktype = u32_at(20);
    let mut frames = Vec::new();
    let mut off = 24;
    while off + 16 <= d.len() {
        let incl = u32_at(off + 8) as usize;
        let start = off + 16;
        assert!(start + incl <= d.len(), "{}: cut record", path.display());
        frames.push(d[start..start + incl].to_vec());
        off = start + incl;
    }
    assert_eq!(off, d.len(), "{}: trailing bytes", path.display());
    (linktype, frames)
}

/// One RoCE frame of a capture, after all generic checks passed.
struct Roce {
    src: SocketAddr,
    dst: SocketAddr,
    udp_payload: Vec<u8>,
    /// Our own ICRC was checked against the real header with the ID zeroed.
    own_icrc_checked: bool,
}

impl Roce {
    fn repr(&self) -> PacketRepr<'_> {
        PacketRepr::parse(&self.udp_payload).unwrap()
    }
}

/// Reads every UDP/4791 frame of `file` (relative to shared/captures) and
/// checks it: stored ICRC == computed over the real IP header, parses, and
/// re-emits to the same bytes.
fn roce_frames(shared: &Path, file: &str) -> Vec<Roce> {
    let path = shared.join("captures").join(file);
    let (linktype, frames) = read_pcap(&path);
    assert_eq!(linktype, 1, "{file}: Ethernet captures");
    let mut out = Vec::new();
    for (n, f) in frames.iter().enumerate() {
        let n = n + 1;
        let ip = match frame::ip_of_ethernet(f) {
            Ok(ip) => ip,
            Err(_) => continue,
        };
        let Ok(found) = frame::parse_ip(ip) else {
            continue; // TCP connection setup of the perftest tools
        };
        if found.dst.port() != frame::ROCE_PORT {
            continue;
        }
        let (stored, computed) = icrc::over_ip_packet(found.ip_packet)
            .unwrap_or_else(|e| panic!("{file} frame {n}: {e}"));
        assert_eq!(
            stored, computed,
            "{file} frame {n}: ICRC stored {stored:#010x} computed {computed:#010x}"
        );
        let repr = PacketRepr::parse(found.udp_payload)
            .unwrap_or_else(|e| panic!("{file} frame {n}: {e}"));

        // Our emitter writes the same bytes (headers, payload, pad)...
        let ep = Endpoints::new(found.src, found.dst);
        let mut again = vec![0u8; repr.buffer_len()];
        repr.emit(&mut again, &ep).unwrap();
        let body = found.udp_payload.len() - icrc::ICRC_LEN;
        assert_eq!(again.len(), found.udp_payload.len(), "{file} frame {n}");
        assert_eq!(again[..body], found.udp_payload[..body], "{file} frame {n}");
        // ...and its ICRC is the one of the real IP header with the IP ID set
        // to 0, which is what the transport sends (IHL 5, DF, ID 0).
        let ip = found.ip_packet;
        let own_icrc_checked = ip[0] == 0x45 && ip[6] & 0xBF == 0 && ip[7] == 0;
        if own_icrc_checked {
            let mut zeroed = ip.to_vec();
            zeroed[4] = 0;
            zeroed[5] = 0;
            zeroed[6] = 0x40;
            let (_, want) = icrc::over_ip_packet(&zeroed).unwrap();
            assert_eq!(icrc::stored(&again).unwrap(), want, "{file} frame {n}");
        }
        out.push(Roce {
            src: found.src,
            dst: found.dst,
            udp_payload: found.udp_payload.to_vec(),
            own_icrc_checked,
        });
    }
    assert!(!out.is_empty(), "{file}: no RoCE frames");
    out
}

/// The RoCE frames of one of the shipped captures: all of them are IPv4
/// without options, with DF set, so our own ICRC was checked on each.
fn shipped(shared: &Path, file: &str) -> Vec<Roce> {
    let f = roce_frames(shared, file);
    assert!(f.iter().all(|r| r.own_icrc_checked), "{file}");
    assert!(f.iter().all(|r| r.dst.port() == frame::ROCE_PORT));
    f
}

fn opcode_counts(frames: &[Roce]) -> Vec<(u8, usize)> {
    let mut m = std::collections::BTreeMap::new();
    for f in frames {
        *m.entry(f.udp_payload[0]).or_insert(0) += 1;
    }
    m.into_iter().collect()
}

#[test]
fn real_captures() {
    let Some(shared) = shared_dir() else {
        eprintln!(
            "skipping real_captures: {} not found",
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../../shared/captures")
                .display()
        );
        return;
    };
    let mut total = 0;

    // Mellanox ConnectX-4 Lx CNP: BECN set, 16 reserved bytes.
    let f = shipped(&shared, "cx4lx-cnp.pcap");
    assert_eq!(f.len(), 1);
    let r = f[0].repr();
    assert_eq!(r.bth.opcode, Opcode::CNP);
    assert_eq!(r.bth.dest_qp, 0x118);
    assert!(r.bth.becn && !r.bth.fecn);
    assert_eq!(r.headers, Headers::Cnp);
    assert!(r.payload.is_empty());
    total += f.len();

    // UC SEND Only with pad count 2.
    let f = shipped(&shared, "uc-send-only-pad2.pcap");
    assert_eq!(f.len(), 1);
    let r = f[0].repr();
    assert_eq!(r.bth.opcode.value(), 0x24);
    assert_eq!(r.bth.opcode, Opcode::UC_SEND_ONLY);
    assert_eq!(r.bth.pad_count, 2);
    assert_eq!(r.bth.pkey, 0xFFFF);
    assert_eq!(r.bth.dest_qp, 0xD3);
    assert_eq!(r.bth.psn, Psn::new(0xCF_1710));
    assert_eq!(r.headers, Headers::None);
    assert_eq!(r.payload.len(), 36 - 12 - 2 - 4);
    assert_eq!(&r.payload[..4], &[0x46, 0x30, 0x81, 0x8b]);
    assert_eq!(f[0].src.port(), 0xC000);
    total += f.len();

    // RC RDMA READ Request from Linux Soft-RoCE.
    let f = shipped(&shared, "rxe-rc-read-request.pcap");
    assert_eq!(f.len(), 1);
    let r = f[0].repr();
    assert_eq!(r.bth.opcode, Opcode::RC_READ_REQUEST);
    assert_eq!(r.bth.dest_qp, 0x11);
    assert_eq!(r.bth.psn, Psn::new(0x54_CB63));
    assert!(r.bth.ack_req);
    assert_eq!(
        r.headers,
        Headers::Reth(RethRepr {
            va: 0x7FEE_260F_B000,
            rkey: 0x2B8,
            dma_len: 0x1_0000
        })
    );
    total += f.len();

    // rxe perftest / ibv_*_pingpong captures.
    let f = shipped(&shared, "rxe/atomic_fadd.pcap");
    assert_eq!(opcode_counts(&f), [(0x12, 5), (0x14, 5)]);
    let req = f.iter().find(|x| x.udp_payload[0] == 0x14).unwrap().repr();
    assert_eq!(
        req.headers,
        Headers::Atomic(AtomicEthRepr {
            va: 0x55ED_2B6D_6000,
            rkey: 0x986,
            swap_add: 1,
            compare: 0
        })
    );
    assert_eq!((req.bth.dest_qp, req.bth.psn), (0x18, Psn::new(0x24_F5CB)));
    let ack = f.iter().find(|x| x.udp_payload[0] == 0x12).unwrap().repr();
    assert_eq!(
        ack.headers,
        Headers::AtomicAck(
            AethRepr {
                syndrome: Syndrome::Ack { credits: 0x1F },
                msn: Msn::new(1)
            },
            0x8E8D_919D_BD75_D1B7
        )
    );
    assert_eq!(
        ack.bth.psn, req.bth.psn,
        "the ACK carries the request's PSN"
    );
    total += f.len();

    let f = shipped(&shared, "rxe/rc_pingpong.pcap");
    assert_eq!(
        opcode_counts(&f),
        [(0x00, 10), (0x01, 20), (0x02, 10), (0x11, 10)]
    );
    for x in &f {
        let r = x.repr();
        if r.bth.opcode.info().has_payload {
            assert_eq!(r.payload.len(), 1024, "path MTU 1024");
        }
    }
    total += f.len();

    let f = shipped(&shared, "rxe/read_bw.pcap");
    assert_eq!(
        opcode_counts(&f),
        [(0x0C, 5), (0x0D, 5), (0x0E, 10), (0x0F, 5)]
    );
    total += f.len();

    let f = shipped(&shared, "rxe/ud_pingpong.pcap");
    assert_eq!(opcode_counts(&f), [(0x64, 10)]);
    let r = f[0].repr();
    assert_eq!(
        r.headers.deth(),
        Some(DethRepr {
            qkey: 0x1111_1111,
            src_qp: 0x12
        })
    );
    assert_eq!(r.payload.len(), 512);
    total += f.len();

    let f = shipped(&shared, "rxe/write_bw.pcap");
    assert_eq!(
        opcode_counts(&f),
        [(0x06, 5), (0x07, 10), (0x08, 5), (0x11, 5)]
    );
    total += f.len();

    // Same count as `icrc-check.py` reports over these files.
    assert_eq!(total, 123);
}

#[test]
fn every_capture_in_shared_passes() {
    // Any capture added to shared/captures later is checked as well (its
    // frames must pass the same generic checks).
    let Some(shared) = shared_dir() else {
        eprintln!("skipping every_capture_in_shared_passes: shared/captures not found");
        return;
    };
    let mut files = Vec::new();
    for dir in ["captures", "captures/rxe"] {
        let Ok(rd) = std::fs::read_dir(shared.join(dir)) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "pcap") {
                let rel = p.strip_prefix(shared.join("captures")).unwrap();
                files.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    files.sort();
    assert!(files.len() >= 8, "{files:?}");
    let total: usize = files.iter().map(|f| roce_frames(&shared, f).len()).sum();
    assert!(total >= 123);
}

// ---------------------------------------------------------------------------
// Single bit flips.

/// Byte offsets (in the IP packet) whose bits the ICRC masks.
fn masked_bits(ip: &[u8], byte: usize, bit: u8) -> bool {
    let v6 = ip[0] >> 4 == 6;
    let ip_len = if v6 { 40 } else { 20 };
    let udp_ck = [ip_len + 6, ip_len + 7];
    let bth_fb = ip_len + 8 + 4;
    if udp_ck.contains(&byte) || byte == bth_fb {
        return true;
    }
    if v6 {
        // Traffic class (low nibble of byte 0 and high nibble of byte 1),
        // flow label, hop limit.
        (byte == 0 && bit < 4) || (1..=3).contains(&byte) || byte == 7
    } else {
        // TOS (DSCP + ECN), TTL, header checksum.
        matches!(byte, 1 | 8 | 10 | 11)
    }
}

fn detected(ip: &[u8]) -> bool {
    !matches!(icrc::over_ip_packet(ip), Ok((s, c)) if s == c)
}

#[test]
fn single_bit_flips() {
    let mut r = Rng::new(99);
    let mut covered = 0usize;
    let mut masked = 0usize;
    for info in OPCODE_TABLE {
        let op = Opcode::from_u8(info.code).unwrap();
        // 5 bytes of payload: 3 pad bytes follow.
        let payload = if info.has_payload { r.bytes(5) } else { vec![] };
        let repr = PacketRepr {
            bth: BthRepr::new(op, r.next_u32(), Psn::new(r.next_u32())),
            headers: Fields::random(&mut r).headers(info.layout),
            payload: &payload,
        };
        for ep in [ep4(), ep6()] {
            let mut udp = vec![0u8; repr.buffer_len()];
            repr.emit(&mut udp, &ep).unwrap();
            let ip = frame::build_ip(ep.src, ep.dst, &udp, &FrameOptions::default()).unwrap();
            assert!(!detected(&ip), "{}: intact packet", info.name);
            let mut c = ip.clone();
            for byte in 0..ip.len() {
                for bit in 0..8u8 {
                    c[byte] ^= 1 << bit;
                    let d = detected(&c);
                    if masked_bits(&ip, byte, bit) {
                        assert!(!d, "{} {ep:?}: masked byte {byte} bit {bit}", info.name);
                        masked += 1;
                    } else {
                        assert!(d, "{} {ep:?}: byte {byte} bit {bit} undetected", info.name);
                        covered += 1;
                    }
                    c[byte] ^= 1 << bit;
                }
            }
        }
    }
    // IPv4: 4 masked bytes, IPv6: 4.5 masked bytes; UDP checksum and BTH
    // byte 4 in both; 61 opcodes (38, and XRC's 23).
    assert_eq!(masked, 61 * ((4 + 3) * 8 + (4 * 8 + 4 + 3 * 8)));
    // At least the BTH, UDP ports/length and addresses of every packet.
    assert!(covered > 61 * (20 + 12 + 32 + 8 + 8) * 8, "{covered}");
}

#[test]
fn masked_fields_can_take_any_value() {
    // Senders and switches rewrite these in flight: the ICRC must not care.
    let repr = known_packet();
    for ep in [ep4(), ep6()] {
        let mut udp = vec![0u8; repr.buffer_len()];
        repr.emit(&mut udp, &ep).unwrap();
        for (tos, ttl) in [(0u8, 64u8), (0xFF, 1), (0x03, 255), (0xB8, 0)] {
            let opts = FrameOptions {
                tos,
                ttl,
                ..Default::default()
            };
            let mut ip = frame::build_ip(ep.src, ep.dst, &udp, &opts).unwrap();
            assert!(!detected(&ip));
            // FECN/BECN and the six reserved bits, all at once.
            let bth4 = if ep.src.is_ipv4() { 20 } else { 40 } + 8 + 4;
            ip[bth4] = 0xFF;
            assert!(!detected(&ip));
            let parsed = frame::parse_ip(&ip).unwrap();
            let back = PacketRepr::parse(parsed.udp_payload).unwrap();
            assert!(back.bth.fecn && back.bth.becn);
        }
    }
}
