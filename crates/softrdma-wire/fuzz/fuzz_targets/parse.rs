//! cargo-fuzz target: arbitrary bytes as a RoCEv2 UDP payload
//! (`PacketRepr::parse`, ICRC), as an IP packet (`frame::parse_ip`,
//! `icrc::over_ip_packet`) and as an Ethernet frame.
//!
//! Run with `cargo +nightly fuzz run parse` from `crates/softrdma-wire`.

#![no_main]

use libfuzzer_sys::fuzz_target;

mod exercise;

fuzz_target!(|data: &[u8]| {
    let mut reached = exercise::Reached::default();
    exercise::exercise(data, &mut reached);
});
