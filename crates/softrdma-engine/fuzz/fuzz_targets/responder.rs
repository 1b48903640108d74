//! cargo-fuzz target: arbitrary input drives a responder engine holding
//! registered memory with every mix of access flags and QPs of each type,
//! through structured packets (valid ICRC, chosen opcode, header fields and
//! payload), whole messages with defects, mutated and raw packets, receive
//! posts, clock advances, QP resets and deregistration. The harness panics
//! on any access outside a registered region or not permitted by the
//! region's and the QP's access rights (see `harness.rs`).
//!
//! Run with `cargo +nightly fuzz run responder` from `crates/softrdma-engine`.
//! The same harness runs, bounded, in `cargo test -p softrdma-engine --test
//! responder_fuzz`.

#![no_main]

use libfuzzer_sys::fuzz_target;

mod harness;

fuzz_target!(|data: &[u8]| {
    harness::run_one(data);
});
