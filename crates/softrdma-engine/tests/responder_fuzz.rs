//! A bounded, deterministic fuzz run of the responder in the normal suite:
//! the same harness as the cargo-fuzz target in `fuzz/` (shared source),
//! fed by a seeded generator instead of libFuzzer. Inputs are random command
//! streams (which the harness turns mostly into valid-ICRC packets with
//! chosen opcodes, header fields and payloads, plus whole messages, mutated
//! and raw packets) and byte-level mutations of earlier inputs. At least
//! 20,000 packets go to the responder; nothing may panic, and every memory
//! access must stay inside a registered region and be permitted by the
//! region's and the QP's access rights (the checks live in the harness).
//!
//! A failing input is printed in hex; feed it to the fuzz target or to
//! `replay_hex` below to reproduce it.

#[path = "../fuzz/fuzz_targets/harness.rs"]
mod harness;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use harness::{Harness, Reached};

/// Packets the bounded run delivers at least.
const PACKETS: u64 = 20_000;

/// SplitMix64, so the run is the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

fn random_input(r: &mut Rng) -> Vec<u8> {
    let len = 200 + r.below(3000) as usize;
    (0..len).map(|_| r.byte()).collect()
}

/// Byte-level mutations in the manner of libFuzzer's.
fn mutate(r: &mut Rng, base: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + r.below(8) {
        if v.is_empty() {
            v.push(r.byte());
        }
        let at = r.below(v.len() as u64) as usize;
        match r.below(6) {
            0 => v[at] ^= 1 << r.below(8),
            1 => v[at] = r.byte(),
            2 => {
                let n = r.below(16) as usize;
                let b = r.byte();
                v.splice(at..at, vec![b; n]);
            }
            3 => {
                let end = (at + r.below(32) as usize).min(v.len());
                v.drain(at..end);
            }
            4 => {
                // Copy a chunk from elsewhere (repeats commands).
                let from = r.below(v.len() as u64) as usize;
                let n = (r.below(64) as usize).min(v.len() - from);
                let chunk = v[from..from + n].to_vec();
                v.splice(at..at, chunk);
            }
            _ => v[at] = [0, 0xFF, 0x7F, 0x80, 1][r.below(5) as usize],
        }
    }
    v
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

fn run_checked(data: &[u8], total: &mut Reached) {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut h = Harness::new();
        h.run(data);
        h.reached
    }));
    match r {
        Ok(got) => add(total, &got),
        Err(e) => {
            eprintln!("failing input ({} bytes): {}", data.len(), hex(data));
            std::panic::resume_unwind(e);
        }
    }
}

fn add(t: &mut Reached, r: &Reached) {
    macro_rules! sum {
        ($($f:ident),*) => {$( t.$f += r.$f; )*};
    }
    sum!(
        commands,
        packets,
        valid_packets,
        remote_writes,
        recv_writes,
        atomics,
        reads,
        transmitted,
        acks,
        seq_naks,
        rnr_naks,
        error_naks,
        read_responses,
        atomic_acks,
        recv_ok,
        recv_err,
        qp_errors,
        resets,
        multi_packet_messages,
        deregs
    );
}

#[test]
fn responder_fuzz_bounded() {
    let start = Instant::now();
    let mut r = Rng(0x5EED_F022);
    let mut total = Reached::default();
    let mut corpus: Vec<Vec<u8>> = Vec::new();
    let mut inputs = 0;
    while total.packets < PACKETS {
        let input = if corpus.is_empty() || r.below(2) == 0 {
            random_input(&mut r)
        } else {
            let base = &corpus[r.below(corpus.len() as u64) as usize];
            mutate(&mut r, base)
        };
        run_checked(&input, &mut total);
        if corpus.len() < 64 {
            corpus.push(input);
        } else {
            let at = r.below(64) as usize;
            corpus[at] = input;
        }
        inputs += 1;
    }
    eprintln!("{inputs} inputs in {:.2?}: {total:#?}", start.elapsed());
    // The run must have reached execution of every kind, not just parsing.
    let t = &total;
    // Floors are about a third of what the fixed seed reaches today.
    let floors = [
        ("valid packets", t.valid_packets, PACKETS / 2),
        ("remote writes", t.remote_writes, 100),
        ("receive writes", t.recv_writes, 500),
        ("atomics", t.atomics, 20),
        ("READ response reads", t.reads, 20),
        ("ACKs", t.acks, 200),
        ("sequence NAKs", t.seq_naks, 100),
        ("RNR NAKs", t.rnr_naks, 5),
        ("error NAKs", t.error_naks, 400),
        ("atomic ACKs", t.atomic_acks, 20),
        ("successful receives", t.recv_ok, 300),
        ("failed or flushed receives", t.recv_err, 1000),
        ("multi-packet messages", t.multi_packet_messages, 300),
        ("deregistrations", t.deregs, 30),
    ];
    for (what, got, floor) in floors {
        assert!(
            got >= floor,
            "only {got} {what} (want >= {floor}): {total:#?}"
        );
    }
}

/// Replays one input given as hex in `SOFTRDMA_FUZZ_INPUT` (as printed by a
/// failure above, or a libFuzzer artifact converted with `xxd -p`).
#[test]
fn replay_hex() {
    let Ok(h) = std::env::var("SOFTRDMA_FUZZ_INPUT") else {
        return;
    };
    let h: String = h.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    let data: Vec<u8> = (0..h.len() / 2)
        .map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let mut total = Reached::default();
    run_checked(&data, &mut total);
    eprintln!("{total:#?}");
}

/// Edge inputs: empty, all zeros (every default choice), all 0xFF.
#[test]
fn responder_fuzz_edge_inputs() {
    let mut total = Reached::default();
    for input in [
        vec![],
        vec![0u8; 4096],
        vec![0xFFu8; 4096],
        vec![0x80u8; 4096],
    ] {
        run_checked(&input, &mut total);
    }
}
