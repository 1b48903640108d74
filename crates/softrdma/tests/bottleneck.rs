//! Congestion on a real kernel bottleneck (issue 19): `bench/bottleneck.sh`
//! with three senders for four seconds each (goodput from the second on), once without congestion
//! control and once with DCQCN, through a tbf-shaped 1 Gbit/s veth marked
//! by the phantom-queue tc-BPF program, DCQCN's line rate that of the
//! bottleneck (the bench's default). Asserts that the qdisc drops more
//! than 0.1 % of packets without DCQCN and, with it, at most 1 % and a
//! tenth of that (the bench's goal, 0.1 %, is met in docs/transport.md's
//! runs), that no sender starves with DCQCN (shares within 50 % of fair),
//! and that the capture taken
//! on the receiver's veth holds CE-marked packets and CNPs, every ICRC
//! right, tshark-clean, each CNP laid out as the ConnectX-4 Lx's
//! (`../shared/captures/cx4lx-cnp.pcap`).
//!
//! Needs root, iproute2 (tc), tcpdump and bc; skipped (saying why)
//! otherwise, and under SOFTRDMA_STRICT_TESTS (CI) that fails instead.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

fn examples_dir() -> PathBuf {
    // target/<profile>/deps/bottleneck-… → target/<profile>/examples
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("examples")
}

/// The row of `mode` in the bench's table, split into cells.
fn row<'a>(table: &'a str, mode: &str) -> Vec<&'a str> {
    table
        .lines()
        .find(|l| l.starts_with(&format!("| {mode} |")))
        .unwrap_or_else(|| panic!("no {mode} row in\n{table}"))
        .split('|')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

fn percent(cell: &str) -> f64 {
    cell.trim_end_matches('%').trim().parse().unwrap()
}

/// The RoCE payload (after UDP) and IPv4 TOS of every frame of `pcap`.
fn roce_frames(pcap: &Path) -> Vec<(u8, Vec<u8>)> {
    let mut r = softrdma_pcap::CaptureReader::open(pcap).unwrap();
    let mut v = Vec::new();
    while let Some(f) = r.next_frame().unwrap() {
        let ip = f.ip().unwrap();
        assert_eq!(ip[0] >> 4, 4, "IPv4");
        let hdr = usize::from(ip[0] & 0xF) * 4;
        v.push((ip[1], ip[hdr + 8..].to_vec()));
    }
    v
}

#[test]
fn dcqcn_keeps_a_kernel_bottleneck_from_dropping() {
    if let Some(why) = netns_unavailable() {
        return skip("bottleneck", &why);
    }
    for tool in ["tc", "tcpdump", "bc"] {
        if which(tool).is_none() {
            return skip("bottleneck", &format!("{tool} is not installed"));
        }
    }
    let ex = examples_dir();
    if !ex.join("sr_udp_goodput").exists() || !ex.join("ecn_marker").exists() {
        let target = ex.parent().unwrap().parent().unwrap();
        let out = run_bounded(
            Command::new(env!("CARGO"))
                .args(["build", "--release", "-p", "softrdma"])
                .args(["--example", "sr_udp_goodput", "--example", "ecn_marker"])
                .env("CARGO_TARGET_DIR", target),
            Duration::from_secs(900),
        );
        assert!(
            out.status.success(),
            "building the examples: {}",
            out.stderr
        );
    }
    let dir = TempDir::new("bottleneck");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/bottleneck.sh");
    let out = run_bounded(
        Command::new("bash")
            .arg(&script)
            .args(["3", "4"])
            .env("EX", &ex)
            .env("CAPTURE", dir.path("")),
        Duration::from_secs(120),
    );
    eprintln!("{}\n{}", out.stdout, out.stderr);
    assert!(out.status.success(), "bench/bottleneck.sh failed");

    let fixed = row(&out.stdout, "fixed");
    let dcqcn = row(&out.stdout, "dcqcn");
    // Cells: mode, per-sender, total, share, sent, dropped, drop rate, …
    assert!(
        percent(fixed[6]) > 0.1,
        "without DCQCN the bottleneck drops more than 0.1 %: {fixed:?}"
    );
    // The bench's goal is 0.1 %; on two shared cores a sender's paced
    // bursts leave late (a run under load gave 0.153 % against 23 %
    // without), so the test asserts the contrast: at most 1 %, and a tenth
    // of what the fixed window loses at most.
    assert!(
        percent(dcqcn[6]) <= 1.0 && percent(dcqcn[6]) * 10.0 <= percent(fixed[6]),
        "with DCQCN it drops at most 1 % and a tenth of the fixed window's: {dcqcn:?} vs {fixed:?}"
    );
    // The bench's goal is 20 %; seven processes on two shared cores make
    // a four-second share noisy (runs gave 0.4–25 %), so the test only
    // catches a starved sender.
    assert!(
        percent(dcqcn[3]) <= 50.0,
        "shares within 50 % of fair: {dcqcn:?}"
    );
    let cnps: u64 = dcqcn[10].split('/').next().unwrap().trim().parse().unwrap();
    assert!(cnps > 0, "the receivers sent CNPs: {dcqcn:?}");

    let pcap = dir.path("bottleneck-dcqcn.pcap");
    let check = check_capture(&pcap);
    assert!(check.frames > 0, "the capture has frames");
    assert!(check.icrc_bad.is_empty(), "bad ICRCs: {:?}", check.icrc_bad);
    if which("tshark").is_some() {
        tshark_check(&pcap);
    } else {
        skip("bottleneck (tshark part)", "tshark is not installed");
    }
    let frames = roce_frames(&pcap);
    let ce = frames.iter().filter(|(tos, _)| tos & 3 == 3).count();
    let ours: Vec<&Vec<u8>> = frames
        .iter()
        .filter(|(_, p)| p[0] == 0x81)
        .map(|(_, p)| p)
        .collect();
    assert!(ce > 0, "CE-marked packets in the capture");
    assert!(!ours.is_empty(), "CNPs in the capture");
    let hw = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/captures/cx4lx-cnp.pcap");
    if hw.exists() {
        let theirs = &roce_frames(&hw)[0].1;
        for cnp in &ours {
            assert_eq!(cnp.len(), theirs.len(), "BTH, 16 reserved bytes, ICRC");
            // All but the destination QP (bytes 5–7) and the ICRC.
            assert_eq!(
                cnp[..5],
                theirs[..5],
                "ours {cnp:02x?}\ntheirs {theirs:02x?}"
            );
            assert_eq!(
                cnp[8..28],
                theirs[8..28],
                "ours {cnp:02x?}\ntheirs {theirs:02x?}"
            );
        }
    } else {
        skip(
            "bottleneck (CNP layout)",
            &format!("{} not found", hw.display()),
        );
    }
}
