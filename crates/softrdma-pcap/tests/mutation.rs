//! Bounded random-mutation test: thousands of corrupted capture files must
//! give frames or errors, never a panic, a hang or a giant allocation.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use common::{classic, Ng, Rng};
use softrdma_pcap::{ip_of_frame, CaptureReader, LinkType, PcapWriter};
use softrdma_wire::frame::parse_ip;
use softrdma_wire::icrc;

const CASES: usize = 10_000;

fn seeds() -> Vec<Vec<u8>> {
    let src = "10.0.0.1:49152".parse().unwrap();
    let dst = "10.0.0.2:4791".parse().unwrap();
    let roce = common::roce_payload(src, dst, 7);
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    for i in 0..3 {
        w.write_roce(Duration::from_secs(i), src, dst, &roce)
            .unwrap();
    }
    let eth = w.into_inner().unwrap();
    let frame = softrdma_pcap::roce_frame(src, dst, &roce).unwrap();
    let ip = frame[14..].to_vec();
    let mut sll2 = vec![0x08, 0x00];
    sll2.extend_from_slice(&[0u8; 18]);
    sll2.extend_from_slice(&ip);
    let raw_be = classic(true, true, 101, &[(1, 2, &ip), (3, 4, &ip)]);
    let mut ng = Ng::new(false);
    ng.idb(1, None, None)
        .idb(276, Some(9), Some(5))
        .epb(0, 1, &frame)
        .block(4, &[1, 2, 3, 4])
        .epb(1, 2, &sll2)
        .spb(&frame);
    ng.section(true)
        .idb(101, Some(0x8A), None)
        .pb(0, 77, &ip)
        .epb(0, 78, &ip);
    vec![eth, raw_be, ng.out]
}

const INTERESTING: [u32; 14] = [
    0,
    1,
    3,
    4,
    12,
    16,
    28,
    0xFFFF,
    0x7FFF_FFFF,
    0xFFFF_FFFF,
    0x0A0D_0D0A,
    0x1A2B_3C4D,
    0x4D3C_2B1A,
    0xA1B2_C3D4,
];

fn mutate(rng: &mut Rng, mut b: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.below(4) {
        if b.is_empty() {
            b.push(rng.next() as u8);
            continue;
        }
        let at = rng.below(b.len());
        match rng.below(7) {
            0 => b[at] ^= 1 << rng.below(8),
            1 => b[at] = rng.next() as u8,
            2 => {
                let at = at & !3;
                let v = INTERESTING[rng.below(INTERESTING.len())];
                let v = if rng.below(2) == 0 {
                    v.to_le_bytes()
                } else {
                    v.to_be_bytes()
                };
                for (i, x) in v.iter().enumerate() {
                    if let Some(slot) = b.get_mut(at + i) {
                        *slot = *x;
                    }
                }
            }
            3 => b.truncate(at),
            4 => {
                let n = 1 + rng.below(8);
                for _ in 0..n {
                    b.insert(at, rng.next() as u8);
                }
            }
            5 => {
                let end = (at + 1 + rng.below(64)).min(b.len());
                let chunk = b[at..end].to_vec();
                let to = rng.below(b.len());
                b.splice(to..to, chunk);
            }
            _ => {
                let end = (at + 1 + rng.below(16)).min(b.len());
                b.drain(at..end);
            }
        }
    }
    b
}

fn exercise(bytes: &[u8]) -> usize {
    let Ok(r) = CaptureReader::from_bytes(bytes) else {
        return 0;
    };
    let mut n = 0;
    for f in r {
        let Ok(f) = f else { break };
        n += 1;
        assert!(
            n <= bytes.len() / 12 + 1,
            "more frames than the file has room for"
        );
        assert!(f.data.len() <= bytes.len());
        if let Ok(ip) = f.ip() {
            if let Ok(udp) = parse_ip(ip) {
                let _ = icrc::over_ip_packet(udp.ip_packet);
            }
        }
        let _ = f.ip().map_err(|e| e.to_string());
    }
    n
}

#[test]
fn mutated_captures_never_panic() {
    let seeds = seeds();
    for s in &seeds {
        assert!(exercise(s) >= 2, "seed must read cleanly");
    }
    let mut rng = Rng(0x5EED_F00D_CAFE_D00D);
    let mut frames = 0;
    let mut errors = 0;
    for case in 0..CASES {
        let input = mutate(&mut rng, seeds[case % seeds.len()].clone());
        let r = catch_unwind(AssertUnwindSafe(|| {
            let n = exercise(&input);
            // Also make sure every error formats.
            if let Err(e) =
                CaptureReader::from_bytes(&input).and_then(|r| r.collect::<Result<Vec<_>, _>>())
            {
                assert!(!e.to_string().is_empty());
                return (n, 1);
            }
            (n, 0)
        }));
        match r {
            Ok((n, e)) => {
                frames += n;
                errors += e;
            }
            Err(_) => panic!(
                "case {case} panicked on input {:02x?}",
                &input[..input.len().min(512)]
            ),
        }
    }
    // The mutations must actually reach both outcomes.
    assert!(errors > CASES / 10, "only {errors} errors");
    assert!(frames > CASES, "only {frames} frames");
}

#[test]
fn random_frames_of_every_link_type_never_panic() {
    let mut rng = Rng(42);
    let types = [0, 1, 12, 14, 101, 108, 113, 228, 229, 276, 147];
    for _ in 0..CASES {
        let len = rng.below(64);
        let mut f: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if len > 0 && rng.below(2) == 0 {
            f[0] = 0x45;
        }
        for t in types {
            if let Err(e) = ip_of_frame(LinkType(t), &f) {
                assert!(!e.to_string().is_empty());
            }
        }
    }
}
