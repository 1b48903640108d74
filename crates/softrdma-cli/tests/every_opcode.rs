//! A capture with one packet of every opcode in the table, written by
//! `PcapWriter`, decoded by `softrdma decode` (all ICRCs good, every field
//! as emitted), dissected by tshark (no malformed packet, tshark's fields
//! equal ours) and checked by the independent ICRC checker.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{decode, decode_json, every_opcode, have, num, tmp, write_pcap, Emitted};
use serde_json::Value;
use softrdma_wire::{Headers, Syndrome, Transport, OPCODE_TABLE};

fn capture(name: &str) -> (PathBuf, Vec<Emitted>) {
    let packets = every_opcode();
    let path = tmp(name);
    write_pcap(&path, &packets);
    (path, packets)
}

#[test]
fn table_is_fully_covered() {
    let packets = every_opcode();
    for info in OPCODE_TABLE {
        assert!(
            packets.iter().any(|p| p.bth.opcode.value() == info.code),
            "{}",
            info.name
        );
    }
    let pads: std::collections::BTreeSet<u8> = packets.iter().map(|p| p.pad()).collect();
    assert_eq!(pads.len(), 4, "every pad count appears");
    assert!(packets.iter().any(|p| p.bth.psn.value() == 0xFF_FFFF));
    assert!(packets.iter().any(|p| p.bth.psn.value() < 0x10));
}

fn check_aeth(j: &Value, a: &softrdma_wire::AethRepr, what: &str) {
    assert_eq!(j["syndrome"], a.syndrome.to_byte(), "{what}");
    assert_eq!(j["msn"], a.msn.value(), "{what}");
    match a.syndrome {
        Syndrome::Ack { credits } => {
            assert_eq!(j["kind"], "ACK", "{what}");
            assert_eq!(j["credits"], credits, "{what}");
        }
        Syndrome::RnrNak { timer } => {
            assert_eq!(j["kind"], "RNR_NAK", "{what}");
            assert_eq!(j["rnr_timer"], timer, "{what}");
        }
        Syndrome::Nak(code) => {
            assert_eq!(j["kind"], "NAK", "{what}");
            assert_eq!(j["nak_code"], code.value(), "{what}");
            assert_eq!(j["nak"], code.name(), "{what}");
        }
    }
}

#[test]
fn decode_reports_every_field_as_emitted() {
    let (path, packets) = capture("every-opcode-decode.pcap");
    let (run, lines) = decode_json(&path);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(lines.len(), packets.len() + 1);
    for (k, (j, p)) in lines.iter().zip(&packets).enumerate() {
        let info = p.bth.opcode.info();
        let what = format!("frame {} ({})", k + 1, info.name);
        assert_eq!(j["type"], "frame", "{what}");
        assert_eq!(j["frame"], k + 1, "{what}");
        assert_eq!(j["time_ns"], common::stamp(k).as_nanos() as u64, "{what}");
        assert_eq!(j["status"], "ok", "{what}: {j}");
        assert_eq!(j["icrc_ok"], true, "{what}");
        assert_eq!(j["icrc"]["stored"], j["icrc"]["computed"], "{what}");
        assert_eq!(j["src"], p.src.to_string(), "{what}");
        assert_eq!(j["dst"], p.dst.to_string(), "{what}");
        assert_eq!(j["transport"], info.transport.name(), "{what}");
        assert_eq!(j["opcode"], info.code, "{what}");
        assert_eq!(j["opcode_name"], info.name, "{what}");
        assert_eq!(j["dest_qp"], p.bth.dest_qp, "{what}");
        assert_eq!(j["psn"], p.bth.psn.value(), "{what}");
        assert_eq!(j["ack_req"], p.bth.ack_req, "{what}");
        assert_eq!(j["solicited"], p.bth.solicited, "{what}");
        assert_eq!(j["becn"], p.bth.becn, "{what}");
        assert_eq!(j["pkey"], p.bth.pkey, "{what}");
        assert_eq!(j["pad"], p.pad(), "{what}");
        assert_eq!(j["payload_len"], p.payload.len(), "{what}");
        match p.headers.xrc_srqn() {
            Some(n) => assert_eq!(j["xrc_srqn"], n, "{what}"),
            None => assert!(j.get("xrc_srqn").is_none(), "{what}"),
        }
        match p.headers.without_xrceth() {
            Headers::Reth(r) | Headers::RethImm(r, _) => {
                assert_eq!(j["reth"]["va"], r.va, "{what}");
                assert_eq!(j["reth"]["rkey"], r.rkey, "{what}");
                assert_eq!(j["reth"]["dma_len"], r.dma_len, "{what}");
            }
            _ => assert!(j.get("reth").is_none(), "{what}"),
        }
        match p.headers.without_xrceth() {
            Headers::Aeth(a) => check_aeth(&j["aeth"], &a, &what),
            Headers::AtomicAck(a, orig) => {
                check_aeth(&j["aeth"], &a, &what);
                assert_eq!(j["atomic_ack_orig"], orig, "{what}");
            }
            _ => assert!(j.get("aeth").is_none(), "{what}"),
        }
        match p.headers.without_xrceth() {
            Headers::Atomic(a) => {
                assert_eq!(j["atomic"]["va"], a.va, "{what}");
                assert_eq!(j["atomic"]["rkey"], a.rkey, "{what}");
                assert_eq!(j["atomic"]["swap_add"], a.swap_add, "{what}");
                assert_eq!(j["atomic"]["compare"], a.compare, "{what}");
            }
            _ => assert!(j.get("atomic").is_none(), "{what}"),
        }
        match p.headers.imm() {
            Some(i) => assert_eq!(j["imm"], i, "{what}"),
            None => assert!(j.get("imm").is_none(), "{what}"),
        }
        match p.headers.ieth() {
            Some(k) => assert_eq!(j["ieth"], k, "{what}"),
            _ => assert!(j.get("ieth").is_none(), "{what}"),
        }
        match p.headers.deth() {
            Some(d) => {
                assert_eq!(j["deth"]["qkey"], d.qkey, "{what}");
                assert_eq!(j["deth"]["src_qp"], d.src_qp, "{what}");
            }
            None => assert!(j.get("deth").is_none(), "{what}"),
        }
    }
    let s = lines.last().unwrap();
    assert_eq!(s["type"], "summary");
    assert_eq!(s["roce_frames"], packets.len());
    assert_eq!(s["icrc_ok"], packets.len());
    assert_eq!(s["icrc_bad"], 0);
    assert_eq!(s["malformed"], 0);
    assert_eq!(s["other_frames"], 0);
}

#[test]
fn decode_text_lines_show_the_key_fields() {
    let (path, packets) = capture("every-opcode-text.pcap");
    let run = decode(&path);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), packets.len() + 1);
    let line = |name: &str| -> &str {
        let k = packets
            .iter()
            .position(|p| p.bth.opcode.name() == name)
            .unwrap_or_else(|| panic!("no {name}"));
        lines[k]
    };
    for l in &lines[..packets.len()] {
        assert!(l.ends_with("  ICRC ok"), "{l}");
    }
    let l = line("RC_RDMA_READ_REQUEST");
    assert!(l.contains("  RC RDMA_READ_REQUEST  "), "{l}");
    assert!(
        l.contains("ackreq=1  va=0x123456789abcd0c rkey=0xdead000c dmalen=65548  ICRC ok"),
        "{l}"
    );
    let l = line("RC_COMPARE_SWAP");
    assert!(
        l.contains("swap=0x1111222233334444 compare=0x5555666677778888"),
        "{l}"
    );
    let l = line("RC_FETCH_ADD");
    assert!(l.contains("add=0x102030405060708  ICRC ok"), "{l}");
    let l = line("RC_ATOMIC_ACKNOWLEDGE");
    assert!(
        l.contains("ACK(credits=3) msn=11259378  orig=0xfedcba9876543210"),
        "{l}"
    );
    let l = line("RC_ACKNOWLEDGE");
    assert!(l.contains("RNR_NAK(timer=14: 1.28 ms) msn=11259377"), "{l}");
    let l = line("UD_SEND_ONLY_WITH_IMMEDIATE");
    assert!(
        l.contains("qkey=0x80010024 srcqp=0x0abc24  imm=0xc0de0024  payload=16  ICRC ok"),
        "{l}"
    );
    let l = line("RC_SEND_ONLY_WITH_INVALIDATE");
    assert!(l.contains("inv_rkey=0x1e7b0016  payload=18 pad=2"), "{l}");
    let l = line("UC_SEND_LAST_WITH_IMMEDIATE");
    assert!(l.contains(" se  imm=0xc0de001a  payload=18 pad=2"), "{l}");
    let l = line("CNP");
    assert!(l.contains("  CNP  qp=0x") && l.contains(" becn"), "{l}");
    assert!(lines.iter().any(|l| l.contains("NAK(remote access error)")));
    assert!(lines.iter().any(|l| l.contains("ACK(credits=invalid)")));
    assert!(lines
        .iter()
        .any(|l| l.contains("[fd00::1]:49999 → [fd00::2]:4791")));
    assert_eq!(
        lines[packets.len()],
        format!(
            "{n} RoCEv2 frames: {n} ICRC ok, 0 ICRC bad, 0 malformed, 0 other frames skipped",
            n = packets.len()
        )
    );
}

const TSHARK_FIELDS: [&str; 19] = [
    "infiniband.bth.opcode",
    "infiniband.bth.destqp",
    "infiniband.bth.psn",
    "infiniband.bth.a",
    "infiniband.bth.padcnt",
    "infiniband.bth.se",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.msn",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.atomicacketh.origremdt",
    "infiniband.immdt",
    "infiniband.ieth",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "_ws.malformed",
];

fn flag(s: &str) -> bool {
    match s {
        "1" | "True" => true,
        "0" | "False" => false,
        _ => panic!("not a flag: {s:?}"),
    }
}

#[test]
fn tshark_dissects_every_opcode_like_we_emitted_it() {
    if !have("tshark", "--version") {
        assert!(std::env::var_os("SOFTRDMA_STRICT_TESTS").is_none(), "an outside tool or file this test needs is missing, and SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping");
        eprintln!("skipping: tshark not installed");
        return;
    }
    let (path, packets) = capture("every-opcode-tshark.pcap");
    let mut cmd = Command::new("tshark");
    cmd.args([
        "-r",
        path.to_str().unwrap(),
        "-T",
        "fields",
        "-E",
        "separator=/t",
    ]);
    for f in TSHARK_FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), packets.len(), "{text}");
    for (k, (row, p)) in rows.iter().zip(&packets).enumerate() {
        let info = p.bth.opcode.info();
        let what = format!("frame {} ({}): {row:?}", k + 1, info.name);
        let f =
            |name: &str| -> &str { row[TSHARK_FIELDS.iter().position(|x| *x == name).unwrap()] };
        assert_eq!(f("_ws.malformed"), "", "malformed: {what}");
        assert_eq!(
            num(f("infiniband.bth.opcode")),
            u64::from(info.code),
            "{what}"
        );
        assert_eq!(
            num(f("infiniband.bth.destqp")),
            u64::from(p.bth.dest_qp),
            "{what}"
        );
        assert_eq!(
            num(f("infiniband.bth.psn")),
            u64::from(p.bth.psn.value()),
            "{what}"
        );
        assert_eq!(flag(f("infiniband.bth.a")), p.bth.ack_req, "{what}");
        assert_eq!(
            num(f("infiniband.bth.padcnt")),
            u64::from(p.pad()),
            "{what}"
        );
        assert_eq!(flag(f("infiniband.bth.se")), p.bth.solicited, "{what}");
        if info.transport == Transport::Xrc {
            // Wireshark 4.0 names the XRC opcodes but stops at the BTH:
            // it shows the XRCETH and what follows as an undissected
            // header sequence (crates/softrdma-pcap/tests/writer.rs checks
            // those bytes).
            for name in &TSHARK_FIELDS[6..18] {
                assert_eq!(f(name), "", "{name}: {what}");
            }
            continue;
        }
        if info.transport == Transport::Cnp {
            // Wireshark 4.0 shows CNP as "Unknown OpCode" and dissects only
            // the BTH; a later version may know it, but has no other header
            // to show either.
            for name in &TSHARK_FIELDS[6..18] {
                assert_eq!(f(name), "", "{name}: {what}");
            }
            continue;
        }
        // ImmDt and IETH are byte fields (hex without 0x), and tshark lists
        // them once per subtree that shows them: all copies must agree.
        let opt = |name: &str| -> Option<u64> {
            let s = f(name);
            (!s.is_empty()).then(|| {
                let vals: Vec<&str> = s.split(',').collect();
                assert!(vals.iter().all(|v| *v == vals[0]), "{name}: {what}");
                if matches!(name, "infiniband.immdt" | "infiniband.ieth") {
                    u64::from_str_radix(vals[0], 16).unwrap()
                } else {
                    num(vals[0])
                }
            })
        };
        let (va, rkey) = match p.headers {
            Headers::Reth(r) | Headers::RethImm(r, _) => (Some(r.va), Some(u64::from(r.rkey))),
            Headers::Atomic(a) => (Some(a.va), Some(u64::from(a.rkey))),
            _ => (None, None),
        };
        assert_eq!(opt("infiniband.reth.va"), va, "{what}");
        assert_eq!(opt("infiniband.reth.r_key"), rkey, "{what}");
        assert_eq!(
            opt("infiniband.reth.dmalen"),
            p.headers.reth().map(|r| u64::from(r.dma_len)),
            "{what}"
        );
        let aeth = p.headers.aeth();
        assert_eq!(
            opt("infiniband.aeth.syndrome"),
            aeth.map(|a| u64::from(a.syndrome.to_byte())),
            "{what}"
        );
        assert_eq!(
            opt("infiniband.aeth.msn"),
            aeth.map(|a| u64::from(a.msn.value())),
            "{what}"
        );
        let (swap, cmp) = match p.headers {
            Headers::Atomic(a) => (Some(a.swap_add), Some(a.compare)),
            _ => (None, None),
        };
        assert_eq!(opt("infiniband.atomiceth.swapdt"), swap, "{what}");
        assert_eq!(opt("infiniband.atomiceth.cmpdt"), cmp, "{what}");
        let orig = match p.headers {
            Headers::AtomicAck(_, o) => Some(o),
            _ => None,
        };
        assert_eq!(opt("infiniband.atomicacketh.origremdt"), orig, "{what}");
        assert_eq!(
            opt("infiniband.immdt"),
            p.headers.imm().map(u64::from),
            "{what}"
        );
        let ieth = match p.headers {
            Headers::Ieth(k) => Some(u64::from(k)),
            _ => None,
        };
        assert_eq!(opt("infiniband.ieth"), ieth, "{what}");
        let deth = p.headers.deth();
        assert_eq!(
            opt("infiniband.deth.q_key"),
            deth.map(|d| u64::from(d.qkey)),
            "{what}"
        );
        assert_eq!(
            opt("infiniband.deth.srcqp"),
            deth.map(|d| u64::from(d.src_qp)),
            "{what}"
        );
    }
    // The one-line summaries must not mention a malformed packet either.
    let out = Command::new("tshark")
        .args(["-r", path.to_str().unwrap()])
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(!summary.contains("Malformed"), "{summary}");
    assert_eq!(summary.matches("RRoCE").count(), packets.len(), "{summary}");
}

#[test]
fn independent_icrc_checker_agrees() {
    let tool = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/tools/icrc-check.py");
    if !tool.exists() {
        assert!(std::env::var_os("SOFTRDMA_STRICT_TESTS").is_none(), "an outside tool or file this test needs is missing, and SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping");
        eprintln!("skipping: {} not present", tool.display());
        return;
    }
    if !have("python3", "--version") {
        assert!(std::env::var_os("SOFTRDMA_STRICT_TESTS").is_none(), "an outside tool or file this test needs is missing, and SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping");
        eprintln!("skipping: python3 not installed");
        return;
    }
    let (path, packets) = capture("every-opcode-icrc-check.pcap");
    let out = Command::new("python3")
        .arg(&tool)
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let last = text.lines().last().unwrap();
    assert!(
        last.ends_with(&format!(": {} ok, 0 bad", packets.len())),
        "{text}"
    );
}
