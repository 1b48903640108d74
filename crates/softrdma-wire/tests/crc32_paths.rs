//! Every CRC-32 path this CPU supports, forced in turn (`crc32::force`),
//! gives the same ICRCs: known answers from an independent implementation
//! (`shared/tools/icrc-check.py`, zlib's CRC), and `crc32fast` over every
//! length up to 4200 bytes at shifting alignments and head lengths.
//!
//! One test function, so that forcing the process-wide path races with
//! nothing (this file is its own test binary).

mod common;

use common::{ep4, ep6};
use softrdma_wire::crc32::{self, Path};
use softrdma_wire::{frame, icrc, BthRepr, Endpoints, Headers, Opcode, PacketRepr, Psn, RethRepr};

/// RC WRITE_ONLY to QPN 0x000102, PSN 0x030405, `n` payload bytes `i*7+3`.
fn write_only(payload: &[u8]) -> PacketRepr<'_> {
    PacketRepr {
        bth: BthRepr::new(Opcode::RC_WRITE_ONLY, 0x000102, Psn::new(0x030405)),
        headers: Headers::Reth(RethRepr {
            va: 0x1122_3344_5566_7788,
            rkey: 0x99AA_BBCC,
            dma_len: payload.len() as u32,
        }),
        payload,
    }
}

/// ICRCs computed by `shared/tools/icrc-check.py` (zlib.crc32 over the
/// masked IP packet), not by this crate: (payload length, IPv4, IPv6).
const KNOWN: [(usize, u32, u32); 3] = [
    (1024, 0xa1dc_5139, 0x8f41_96b0),
    (2052, 0x6a4a_c220, 0xef1a_1dc7),
    (4096, 0x8b02_c700, 0x59b9_25cb),
];

fn known_answers(path: Path) {
    for (n, want4, want6) in KNOWN {
        let payload: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
        let repr = write_only(&payload);
        for (ep, want) in [(ep4(), want4), (ep6(), want6)] {
            let mut buf = vec![0u8; repr.buffer_len()];
            repr.emit(&mut buf, &ep).unwrap();
            assert_eq!(icrc::stored(&buf).unwrap(), want, "{path} {n} {ep:?}");
            icrc::verify(&ep, &buf).unwrap();
            let ip = frame::build_ip(ep.src, ep.dst, &buf, &Default::default()).unwrap();
            assert_eq!(
                icrc::over_ip_packet(&ip).unwrap(),
                (want, want),
                "{path} {n}"
            );
        }
    }
}

/// The ICRC over the masked IP and UDP headers a RoCE sender emits, by
/// `crc32fast` alone: the pseudo-header rebuilt here from the real header.
fn reference_icrc(ep: &Endpoints, body: &[u8]) -> u32 {
    let mut pkt = body.to_vec();
    pkt.extend([0; 4]); // the ICRC's place, counted in the lengths
    let ip = frame::build_ip(ep.src, ep.dst, &pkt, &Default::default()).unwrap();
    let mut m = ip[..ip.len() - 4].to_vec();
    let udp = if ep.src.is_ipv4() {
        m[1] = 0xFF; // TOS
        m[8] = 0xFF; // TTL
        m[10] = 0xFF; // checksum
        m[11] = 0xFF;
        20
    } else {
        m[0] |= 0x0F; // traffic class and flow label
        m[1] = 0xFF;
        m[2] = 0xFF;
        m[3] = 0xFF;
        m[7] = 0xFF; // hop limit
        40
    };
    m[udp + 6] = 0xFF; // UDP checksum
    m[udp + 7] = 0xFF;
    m[udp + 8 + 4] = 0xFF; // BTH byte 4
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xFF; 8]);
    h.update(&m);
    h.finalize()
}

fn matches_crc32fast(path: Path, data: &[u8]) {
    let heads = [0, 1, 3, 4, 40, 60, 88, 256, 300];
    for len in 12..=4200 {
        let align = (len * 5) % 64;
        let d = &data[align..align + len];
        let ep = if len % 2 == 0 { ep4() } else { ep6() };
        assert_eq!(
            icrc::compute(&ep, d).unwrap(),
            reference_icrc(&ep, d),
            "{path}: icrc::compute, {len} bytes at alignment {align}"
        );
        let head = heads[len % heads.len()].min(len);
        let init = (len as u32).wrapping_mul(0x9E37_79B9);
        let mut want = crc32fast::Hasher::new_with_initial(init);
        want.update(d);
        let want = want.finalize();
        assert_eq!(
            icrc::crc32(init, &d[..head], &d[head..]),
            want,
            "{path} {len}"
        );
        // SAFETY: a slice is readable for its length.
        let raw = unsafe { icrc::crc32_raw(init, &d[..head], d[head..].as_ptr(), len - head) };
        assert_eq!(raw, want, "{path}: crc32_raw, {len} bytes, head {head}");
    }
}

#[test]
fn every_path_gives_the_same_icrcs() {
    let native = crc32::active();
    let data: Vec<u8> = (0..4300u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut tried = Vec::new();
    for path in Path::ALL {
        if !crc32::force(path) {
            assert!(!path.supported());
            continue;
        }
        assert_eq!(crc32::active(), path);
        known_answers(path);
        matches_crc32fast(path, &data);
        tried.push(path);
    }
    assert!(crc32::force(native));
    eprintln!("paths tested on this CPU: {tried:?} (native {native})");
    assert!(tried.contains(&Path::Portable) && tried.contains(&Path::detect()));
}
