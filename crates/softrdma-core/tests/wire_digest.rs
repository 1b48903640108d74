//! The wire does not change behind a refactoring: for a fixed set of
//! simulation seeds (every mode, RC/UC/UD, loss, cuts, RNR, SQD, held
//! ACKs, large messages), a digest of every packet the engines transmit —
//! its bytes, the virtual instant, the sending and receiving nodes and the
//! UDP endpoints — must equal the digest recorded from the code before the
//! transport was split into send records, completer, congestion control and
//! named timers (main at 55e4627). Same packets, PSNs, AckReq bits, ACK
//! coalescing and timings, packet for packet.
//!
//! The nodes are bare engines (`SimNet<Engine>`): this pins the engine's
//! transport. It lives here, beside the simulation suite whose harness it
//! shares (`tests/sim/`), because that harness also drives device cores.
//!
//! A change that is meant to alter the wire (a new default congestion
//! controller, selective repeat) re-records the table:
//! `SOFTRDMA_WIRE_DIGEST_PRINT=1 cargo test --release -p softrdma-core --test wire_digest -- --nocapture`
//! prints it.

mod sim;

use sim::run_seed_digest;
use softrdma_engine::Engine;

/// One line per seed: `seed digest packets` (the FNV-1a digest of every
/// transmitted packet, in hex, and how many there were), recorded from
/// main at 55e4627.
const EXPECTED: &str = include_str!("wire_digest.txt");

/// The seeds: the first 256 of the suite's fixed blocks (every mode,
/// 1 MiB messages, held ACKs, SQD, poisoned WRs among them) plus the
/// regression seeds.
fn seeds() -> Vec<u64> {
    let mut v: Vec<u64> = (0..256).collect();
    v.extend([90035607, 90002262, 90015614, 90007567, 90075929]);
    v
}

fn expected() -> Vec<(u64, u64, u64)> {
    EXPECTED
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 3, "bad line in wire_digest.txt: {l}");
            let hash = u64::from_str_radix(f[1].trim_start_matches("0x"), 16).expect("hex digest");
            (
                f[0].parse().expect("seed"),
                hash,
                f[2].parse().expect("count"),
            )
        })
        .collect()
}

#[test]
fn wire_is_unchanged() {
    let print = std::env::var_os("SOFTRDMA_WIRE_DIGEST_PRINT").is_some();
    // An unoptimised build checks every 8th seed (the simulation is ~10x
    // slower there); --release checks them all.
    let step = if cfg!(debug_assertions) && !print {
        8
    } else {
        1
    };
    let mut got = Vec::new();
    for seed in seeds().into_iter().step_by(step) {
        let (r, d) = run_seed_digest::<Engine>(seed);
        if let Err(e) = r {
            panic!("seed {seed} failed: {e}");
        }
        assert!(d.packets > 0, "seed {seed} sent nothing");
        got.push((seed, d.hash, d.packets));
    }
    if print {
        for (s, h, n) in &got {
            println!("{s} {h:#018x} {n}");
        }
        return;
    }
    let table: Vec<_> = expected().into_iter().step_by(step).collect();
    assert_eq!(got.len(), table.len(), "the seed list and the table differ");
    let mut diffs = Vec::new();
    for (g, e) in got.iter().zip(&table) {
        assert_eq!(g.0, e.0, "the seed list and the table differ");
        if g != e {
            diffs.push(format!(
                "seed {}: digest {:#018x} over {} packets, recorded {:#018x} over {}",
                g.0, g.1, g.2, e.1, e.2
            ));
        }
    }
    assert!(
        diffs.is_empty(),
        "the wire changed for {} seeds:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}
