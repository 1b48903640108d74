//! Attaches the phantom-queue ECN marker (`softrdma::ecn_marker`, HULL's
//! virtual queue as a tc-BPF program) on an interface's egress until its
//! standard input closes, then prints what it did:
//! `seen=… marked=…`. For a bottleneck bench on a kernel without an
//! ECN-marking qdisc (`bench/bottleneck.sh`). Root only.
//!
//! `ecn_marker IFACE DRAIN_MBPS THRESHOLD_BYTES`

use std::io::Read;

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let (Some(iface), Some(rate), Some(thr)) = (
        a.first(),
        a.get(1).and_then(|v| v.parse::<u64>().ok()),
        a.get(2).and_then(|v| v.parse::<u32>().ok()),
    ) else {
        eprintln!("usage: ecn_marker IFACE DRAIN_MBPS THRESHOLD_BYTES");
        std::process::exit(2);
    };
    let m = match softrdma::ecn_marker::EcnMarker::attach(iface, rate * 1_000_000, thr) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("ecn_marker: {e}");
            std::process::exit(1);
        }
    };
    println!("attached iface={iface} drain_mbps={rate} threshold={thr}");
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    match m.counters() {
        Ok(c) => println!("seen={} marked={}", c.seen, c.marked),
        Err(e) => eprintln!("ecn_marker: reading counters: {e}"),
    }
}
