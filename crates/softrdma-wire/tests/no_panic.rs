//! A bounded, deterministic fuzz run in the normal suite: 100,000 mutations
//! of valid packets, IP packets and Ethernet frames, plus 20,000 random
//! buffers, each handed to every parser (the same body as the cargo-fuzz
//! target in `fuzz/`). Nothing may panic, and the cross-checks in
//! `exercise` must hold.

mod common;
#[path = "../fuzz/fuzz_targets/exercise.rs"]
mod exercise;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use common::{ep4, ep6, Fields, Rng};
use exercise::{exercise, Reached};
use softrdma_wire::{frame, BthRepr, Opcode, PacketRepr, Psn, OPCODE_TABLE};

const MUTATED: usize = 100_000;
const RANDOM: usize = 20_000;

/// Valid inputs to mutate: for every opcode and a few payload sizes, the
/// UDP payload, the IPv4 and IPv6 packets, and Ethernet frames (one with a
/// VLAN tag).
fn corpus() -> Vec<Vec<u8>> {
    let mut r = Rng::new(0xC0FFEE);
    let mut out = Vec::new();
    for info in OPCODE_TABLE {
        let lens: &[usize] = if info.has_payload {
            &[0, 1, 2, 3, 61]
        } else {
            &[0]
        };
        for &len in lens {
            let op = Opcode::from_u8(info.code).unwrap();
            let payload = r.bytes(len);
            let mut bth = BthRepr::new(op, r.next_u32(), Psn::new(r.next_u32()));
            bth.ack_req = r.bool();
            let repr = PacketRepr {
                bth,
                headers: Fields::random(&mut r).headers(info.layout),
                payload: &payload,
            };
            for ep in [ep4(), ep6()] {
                let mut udp = vec![0u8; repr.buffer_len()];
                repr.emit(&mut udp, &ep).unwrap();
                let opts = Default::default();
                out.push(frame::build_ip(ep.src, ep.dst, &udp, &opts).unwrap());
                let mut f = frame::build_frame(ep.src, ep.dst, &udp, &opts).unwrap();
                out.push(f.clone());
                // 802.1Q tag, then link padding after the IP packet.
                let tag = [0x81, 0x00, 0x00, 0x05];
                f.splice(12..12, tag);
                f.extend_from_slice(&[0; 6]);
                out.push(f);
                out.push(udp);
            }
        }
    }
    out
}

const INTERESTING8: [u8; 9] = [0x00, 0x01, 0x03, 0x11, 0x45, 0x60, 0x7F, 0x80, 0xFF];

fn mutate(b: &mut Vec<u8>, r: &mut Rng) {
    let len = b.len();
    match r.below(9) {
        0 | 1 if len > 0 => {
            let i = r.below(len);
            b[i] ^= 1 << r.below(8);
        }
        2 if len > 0 => {
            let i = r.below(len);
            b[i] = r.byte();
        }
        3 if len > 0 => {
            let i = r.below(len);
            b[i] = INTERESTING8[r.below(INTERESTING8.len())];
        }
        4 if len > 0 => b.truncate(r.below(len)),
        5 => {
            let n = 1 + r.below(32);
            let extra = r.bytes(n);
            b.extend_from_slice(&extra);
        }
        6 => {
            let i = r.below(len + 1);
            b.insert(i, r.byte());
        }
        7 if len > 0 => {
            b.remove(r.below(len));
        }
        8 if len >= 2 => {
            // A 16-bit field set near the buffer length: the lengths that
            // matter (IP total, IPv6 payload, UDP length) are off by a little.
            let i = r.below(len - 1);
            let delta = r.below(64) as i64 - 32;
            let v = (len as i64 + delta).clamp(0, 0xFFFF) as u16;
            let v = [v, 0, 0xFFFF, 20, 28, 40][r.below(6)];
            b[i..i + 2].copy_from_slice(&v.to_be_bytes());
        }
        _ => {
            let i = r.below(len + 1);
            b.insert(i, 0);
        }
    }
}

fn run(buf: &[u8], reached: &mut Reached) {
    if catch_unwind(AssertUnwindSafe(|| exercise(buf, reached))).is_err() {
        panic!("input that failed ({} bytes): {:02x?}", buf.len(), buf);
    }
}

#[test]
fn random_and_mutated_buffers_never_panic() {
    let start = Instant::now();
    let seeds = corpus();
    let mut r = Rng::new(0x5EED_F022);
    let mut reached = Reached::default();
    let mut fed = 0usize;
    let mut buf = Vec::with_capacity(256);

    for _ in 0..MUTATED {
        buf.clear();
        buf.extend_from_slice(&seeds[r.below(seeds.len())]);
        for _ in 0..1 + r.below(3) {
            mutate(&mut buf, &mut r);
        }
        run(&buf, &mut reached);
        fed += 1;
    }

    for _ in 0..RANDOM {
        let len = r.below(160);
        buf.clear();
        buf.resize(len, 0);
        r.fill(&mut buf);
        // Steer a share of the random inputs past the first gate of each
        // parser: a known opcode with TVer 0, or an IP version nibble.
        if len > 1 {
            match r.below(4) {
                0 => {
                    buf[0] = OPCODE_TABLE[r.below(OPCODE_TABLE.len())].code;
                    buf[1] &= 0xF0;
                }
                1 => buf[0] = [0x45, 0x46, 0x4F, 0x60][r.below(4)],
                _ => {}
            }
        }
        run(&buf, &mut reached);
        fed += 1;
    }

    let took = start.elapsed();
    eprintln!(
        "fed {fed} buffers ({} seeds) in {took:.2?}: {reached:?}",
        seeds.len()
    );
    assert!(fed >= 100_000);
    // The run is not vacuous: mutated inputs still reach the deep paths.
    assert!(reached.packet_ok > 10_000, "{reached:?}");
    assert!(reached.icrc_ok > 1_000, "{reached:?}");
    assert!(reached.ip_ok > 10_000, "{reached:?}");
    assert!(reached.ip_icrc_match > 1_000, "{reached:?}");
    assert!(reached.differential > 10_000, "{reached:?}");
    assert!(reached.eth_ok > 1_000, "{reached:?}");
}

#[test]
fn corpus_is_valid() {
    // Every seed is accepted by the parser it was built for.
    let mut reached = Reached::default();
    for s in corpus() {
        exercise(&s, &mut reached);
    }
    let n = corpus().len() as u64;
    // Each opcode/size gives 4 seeds per address family; every one of them
    // reaches a parsed packet with a matching ICRC.
    assert_eq!(n % 8, 0);
    assert!(reached.ip_icrc_match >= n / 4 * 3, "{reached:?} of {n}");
}

/// The CM parsers on mutated CM MADs (and their class data alone, and the
/// UD packets that carry them): no panic, and whatever parses emits again
/// and parses back to the same message.
#[test]
fn mutated_cm_mads_never_panic() {
    use common::cm::{random_message, ATTRIBUTES};
    use softrdma_wire::cma::CmaHeader;
    use softrdma_wire::mad::{gmp_packet, gmp_payload};
    use softrdma_wire::{CmMad, CmMessage};

    let mut r = Rng::new(0xC3_17AD);
    let seeds: Vec<Vec<u8>> = (0..200)
        .map(|i| {
            let m = random_message(&mut r, ATTRIBUTES[i % ATTRIBUTES.len()]);
            CmMad::send(r.next_u64(), m).to_bytes().unwrap().to_vec()
        })
        .collect();
    let (mut parsed, mut fed) = (0usize, 0usize);
    let mut buf = Vec::with_capacity(300);
    for _ in 0..50_000 {
        buf.clear();
        buf.extend_from_slice(&seeds[r.below(seeds.len())]);
        for _ in 0..1 + r.below(3) {
            mutate(&mut buf, &mut r);
        }
        let ok = catch_unwind(AssertUnwindSafe(|| {
            let id = ATTRIBUTES[r.below(ATTRIBUTES.len())];
            let _ = CmMessage::parse(id, buf.get(24..).unwrap_or(&[]));
            let _ = CmaHeader::parse(buf.get(24 + 140..).unwrap_or(&buf));
            let Ok(m) = CmMad::parse(&buf) else {
                return false;
            };
            let again = m.to_bytes().expect("a parsed MAD emits");
            assert_eq!(CmMad::parse(&again).unwrap(), m);
            let p = gmp_packet(1, Psn::new(0), &again);
            let mut pkt = vec![0u8; p.buffer_len()];
            p.emit(&mut pkt, &ep4()).unwrap();
            let back = PacketRepr::parse(&pkt).unwrap();
            assert_eq!(gmp_payload(&back).unwrap(), &again);
            true
        }));
        match ok {
            Ok(p) => parsed += usize::from(p),
            Err(_) => panic!("input that failed ({} bytes): {:02x?}", buf.len(), buf),
        }
        fed += 1;
    }
    eprintln!("fed {fed} CM MADs, {parsed} parsed");
    // Not vacuous: length-preserving mutations still reach the message parsers.
    assert!(parsed > 10_000, "{parsed}");
}
