//! `softrdma decode` on real captures, on damaged frames, on non-RoCE
//! traffic, on pcapng and Linux cooked re-encodings, and with `--json`.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{
    classic_pcap, decode, decode_json, every_opcode, have, pcapng, read_frames, shared, softrdma,
    stamp, tmp, to_sll, to_sll2, write_pcap,
};
use softrdma_pcap::{LinkType, PcapWriter};
use softrdma_wire::frame::{build_frame, parse_ip, FrameOptions};
use softrdma_wire::{icrc, BthRepr, Endpoints, Headers, Opcode, PacketRepr, Psn, RethRepr};

fn real_captures(shared: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for d in [shared.join("captures"), shared.join("captures/rxe")] {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "pcap") {
                v.push(e.path());
            }
        }
    }
    v.sort();
    v
}

fn summary_counts(line: &str) -> [u64; 5] {
    // "N RoCEv2 frames: A ICRC ok, B ICRC bad, C malformed, D other frames skipped"
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(nums.len(), 6, "{line}"); // the 2 of RoCEv2 counts too
    assert!(line.contains(" RoCEv2 frames: "), "{line}");
    [nums[0], nums[2], nums[3], nums[4], nums[5]]
}

#[test]
fn every_real_capture_decodes_with_good_icrcs() {
    let Some(shared) = shared() else { return };
    let files = real_captures(&shared);
    assert!(files.len() >= 8, "{files:?}");
    for f in files {
        let r = decode(&f);
        assert_eq!(r.code, 0, "{}: {}\n{}", f.display(), r.stderr, r.stdout);
        let lines: Vec<&str> = r.stdout.lines().collect();
        let last = lines.last().unwrap();
        let [roce, ok, bad, malformed, _other] = summary_counts(last);
        assert!(roce > 0, "{}: {last}", f.display());
        assert_eq!(
            (ok, bad, malformed),
            (roce, 0, 0),
            "{}: {last}",
            f.display()
        );
        assert_eq!(lines.len() as u64, roce + 1);
        for l in &lines[..lines.len() - 1] {
            assert!(l.ends_with("  ICRC ok"), "{}: {l}", f.display());
        }
    }
}

#[test]
fn real_rxe_frames_decode_to_their_known_fields() {
    let Some(shared) = shared() else { return };
    let c = shared.join("captures");

    let r = decode(&c.join("rxe-rc-read-request.pcap"));
    assert_eq!(
        r.stdout.lines().next().unwrap(),
        "    1  192.168.56.129:57236 → 192.168.56.131:4791  RC RDMA_READ_REQUEST  \
         qp=0x000011 psn=5557091 ackreq=1  va=0x7fee260fb000 rkey=0x2b8 dmalen=65536  ICRC ok"
    );

    let (r, j) = decode_json(&c.join("uc-send-only-pad2.pcap"));
    assert_eq!(r.code, 0);
    let f = &j[0];
    assert_eq!(f["opcode_name"], "UC_SEND_ONLY");
    assert_eq!(f["transport"], "UC");
    assert_eq!(f["pad"], 2);
    assert_eq!(f["dest_qp"], 0xd3);
    assert_eq!(f["psn"], 13_571_856);
    assert_eq!(f["status"], "ok");
    let text = decode(&c.join("uc-send-only-pad2.pcap")).stdout;
    assert!(text.contains("UC SEND_ONLY  qp=0x0000d3") && text.contains(" pad=2  ICRC ok"));

    let text = decode(&c.join("cx4lx-cnp.pcap")).stdout;
    assert!(
        text.starts_with("    1  10.0.17.1:0 → 10.0.18.1:4791  CNP  qp=0x000118 psn=0"),
        "{text}"
    );

    // rxe READ: requests carry RETH, first/last responses an AETH.
    let (r, j) = decode_json(&c.join("rxe/read_bw.pcap"));
    assert_eq!(r.code, 0);
    let req = j
        .iter()
        .find(|f| f["opcode_name"] == "RC_RDMA_READ_REQUEST")
        .unwrap();
    assert_eq!(req["frame"], 20);
    assert_eq!(req["reth"]["va"], 0x55d4_54c4_f000u64);
    assert_eq!(req["reth"]["rkey"], 0x848);
    assert_eq!(req["reth"]["dma_len"], 4096);
    assert_eq!(req["psn"], 14_614_926);
    assert_eq!(req["ack_req"], true);
    let first = j
        .iter()
        .find(|f| f["opcode_name"] == "RC_RDMA_READ_RESPONSE_FIRST")
        .unwrap();
    assert_eq!(first["aeth"]["kind"], "ACK");
    assert_eq!(first["aeth"]["msn"], 1);
    assert_eq!(first["payload_len"], 1024);

    // rxe atomics: FETCH_ADD then ATOMIC_ACKNOWLEDGE with the original value.
    let (_, j) = decode_json(&c.join("rxe/atomic_fadd.pcap"));
    let fa = j
        .iter()
        .find(|f| f["opcode_name"] == "RC_FETCH_ADD")
        .unwrap();
    assert_eq!(fa["atomic"]["swap_add"], 1);
    let ack = j
        .iter()
        .find(|f| f["opcode_name"] == "RC_ATOMIC_ACKNOWLEDGE")
        .unwrap();
    assert_eq!(ack["psn"], fa["psn"]);
    assert!(ack["atomic_ack_orig"].is_u64());

    let (_, j) = decode_json(&c.join("rxe/ud_pingpong.pcap"));
    let ud = &j[0];
    assert_eq!(ud["opcode_name"], "UD_SEND_ONLY");
    assert_eq!(ud["deth"]["qkey"], 0x1111_1111);
    assert_eq!(ud["deth"]["src_qp"], 0x12);
}

fn write_request(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let data = [0x33u8; 32];
    let p = PacketRepr {
        bth: BthRepr::new(Opcode::RC_WRITE_ONLY, 0x42, Psn::new(100)),
        headers: Headers::Reth(RethRepr {
            va: 0x1000,
            rkey: 0x77,
            dma_len: 32,
        }),
        payload: &data,
    };
    let mut b = vec![0u8; p.buffer_len()];
    p.emit(&mut b, &Endpoints::new(src, dst)).unwrap();
    b
}

fn eps() -> (SocketAddr, SocketAddr) {
    (
        "10.9.0.1:49200".parse().unwrap(),
        "10.9.0.2:4791".parse().unwrap(),
    )
}

#[test]
fn a_flipped_payload_bit_is_an_icrc_mismatch() {
    let (src, dst) = eps();
    let good = write_request(src, dst);
    let mut bad = good.clone();
    bad[12 + 16 + 5] ^= 0x08; // a payload bit
    let path = tmp("flipped.pcap");
    {
        let mut w = PcapWriter::create(&path).unwrap();
        w.write_roce(stamp(0), src, dst, &good).unwrap();
        w.write_roce(stamp(1), src, dst, &bad).unwrap();
    }
    let frame = softrdma_pcap::roce_frame(src, dst, &bad).unwrap();
    let (stored, computed) = icrc::over_ip_packet(&frame[14..]).unwrap();
    assert_ne!(stored, computed);

    let r = decode(&path);
    assert_eq!(r.code, 1, "{}", r.stdout);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(lines[0].ends_with("  ICRC ok"), "{}", lines[0]);
    assert!(
        lines[1].ends_with(&format!(
            "  ICRC BAD (got {stored:#010x}, want {computed:#010x})"
        )),
        "{}",
        lines[1]
    );
    assert!(lines[1].contains("RC RDMA_WRITE_ONLY  qp=0x000042 psn=100"));
    assert_eq!(
        lines[2],
        "2 RoCEv2 frames: 1 ICRC ok, 1 ICRC bad, 0 malformed, 0 other frames skipped"
    );

    let (r, j) = decode_json(&path);
    assert_eq!(r.code, 1);
    assert_eq!(j[1]["status"], "bad");
    assert_eq!(j[1]["icrc_ok"], false);
    assert_eq!(j[1]["icrc"]["stored"], stored);
    assert_eq!(j[1]["icrc"]["computed"], computed);
    assert_eq!(j[2]["icrc_bad"], 1);
}

#[test]
fn truncated_roce_frames_are_malformed_with_the_reason() {
    let (src, dst) = eps();
    let good = write_request(src, dst);
    let path = tmp("truncated.pcap");
    let frame = softrdma_pcap::roce_frame(src, dst, &good).unwrap();
    {
        let mut w = PcapWriter::create(&path).unwrap();
        // 1: UDP/IP lengths consistent, but the RoCE packet stops inside the RETH.
        w.write_roce(stamp(0), src, dst, &good[..20]).unwrap();
        // 2: the capture cut the frame short (IP total length > bytes present).
        w.write_frame(stamp(1), &frame[..60]).unwrap();
        // 3: fine.
        w.write_roce(stamp(2), src, dst, &good).unwrap();
        // 4: unknown opcode (RD).
        let mut rd = good.clone();
        rd[0] = 0x4A;
        w.write_roce(stamp(3), src, dst, &rd).unwrap();
    }
    let r = decode(&path);
    assert_eq!(r.code, 1, "{}", r.stdout);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines[0],
        "    1  10.9.0.1:49200 → 10.9.0.2:4791  MALFORMED: truncated RETH: need 16 bytes, have 8"
    );
    assert_eq!(
        lines[1],
        "    2  10.9.0.1:49200 → 10.9.0.2:4791  MALFORMED: \
         IP.total length says 92 bytes but 46 are present"
    );
    assert!(lines[2].ends_with("ICRC ok"));
    assert!(
        lines[3].ends_with("MALFORMED: unknown opcode 0x4a"),
        "{}",
        lines[3]
    );
    assert_eq!(
        lines[4],
        "4 RoCEv2 frames: 1 ICRC ok, 0 ICRC bad, 3 malformed, 0 other frames skipped"
    );
    let (_, j) = decode_json(&path);
    assert_eq!(j[0]["status"], "malformed");
    assert_eq!(j[0]["error"], "truncated RETH: need 16 bytes, have 8");
    assert!(j[0].get("opcode").is_none());
    assert_eq!(j[4]["malformed"], 3);
}

#[test]
fn non_roce_frames_are_skipped_and_counted() {
    let (src, dst) = eps();
    let path = tmp("mixed.pcap");
    let opts = FrameOptions::default();
    {
        let mut w = PcapWriter::create(&path).unwrap();
        // DNS query over UDP/53.
        let dns = build_frame(
            "10.9.0.1:53000".parse().unwrap(),
            "10.9.0.53:53".parse().unwrap(),
            b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00",
            &opts,
        )
        .unwrap();
        w.write_frame(stamp(0), &dns).unwrap();
        w.write_roce(stamp(1), src, dst, &write_request(src, dst))
            .unwrap();
        // ARP.
        let mut arp = vec![0xFF; 6];
        arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
        arp.extend_from_slice(&[0u8; 28]);
        w.write_frame(stamp(2), &arp).unwrap();
        // TCP.
        let mut tcp = dns.clone();
        tcp[14 + 9] = 6;
        w.write_frame(stamp(3), &tcp).unwrap();
        // A response from port 4791 to an ephemeral port is RoCE too.
        let back = (dst.ip(), 4791).into();
        let to: SocketAddr = (src.ip(), 50000).into();
        w.write_roce(stamp(4), back, to, &write_request(back, to))
            .unwrap();
    }
    let r = decode(&path);
    assert_eq!(r.code, 0, "{}", r.stdout);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", r.stdout);
    assert!(lines[0].starts_with("    2  10.9.0.1:49200 → 10.9.0.2:4791  RC RDMA_WRITE_ONLY"));
    assert!(lines[1].starts_with("    5  10.9.0.2:4791 → 10.9.0.1:50000  RC RDMA_WRITE_ONLY"));
    assert!(lines[1].ends_with("ICRC ok"));
    assert_eq!(
        lines[2],
        "2 RoCEv2 frames: 2 ICRC ok, 0 ICRC bad, 0 malformed, 3 other frames skipped"
    );
}

#[test]
fn unreadable_files_exit_2() {
    let r = softrdma(&["decode", "/nonexistent/x.pcap"]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("cannot read /nonexistent/x.pcap"),
        "{}",
        r.stderr
    );
    assert!(r.stdout.is_empty());

    let junk = tmp("junk.pcap");
    std::fs::write(&junk, b"this is not a capture file").unwrap();
    let r = decode(&junk);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("not a pcap or pcapng file"),
        "{}",
        r.stderr
    );

    // A capture cut short inside its last record: the frames before it are
    // decoded, the problem is reported, and the exit status is 2.
    let (src, dst) = eps();
    let path = tmp("cut.pcap");
    {
        let mut w = PcapWriter::create(&path).unwrap();
        w.write_roce(stamp(0), src, dst, &write_request(src, dst))
            .unwrap();
        w.write_roce(stamp(1), src, dst, &write_request(src, dst))
            .unwrap();
    }
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 7]).unwrap();
    let r = decode(&path);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("file cut short in pcap record data"),
        "{}",
        r.stderr
    );
    assert!(r.stdout.ends_with(
        "1 RoCEv2 frames: 1 ICRC ok, 0 ICRC bad, 0 malformed, 0 other frames skipped\n"
    ));
    let (_, j) = decode_json(&path);
    assert!(j.last().unwrap()["error"]
        .as_str()
        .unwrap()
        .contains("cut short"));

    let r = softrdma(&["decode"]);
    assert_eq!(r.code, 2, "usage errors exit 2 too");
}

/// The decode output with the file name left out (it is not printed anyway).
fn output(path: &Path) -> (i32, String) {
    let r = decode(path);
    (r.code, r.stdout)
}

/// Converts a capture to pcapng with Wireshark's editcap.
fn editcap_pcapng(src: &Path, name: &str) -> PathBuf {
    let ng = tmp(name);
    let ok = Command::new("editcap")
        .args(["-F", "pcapng"])
        .arg(src)
        .arg(&ng)
        .status()
        .unwrap()
        .success();
    assert!(ok, "editcap failed on {}", src.display());
    ng
}

#[test]
fn pcapng_and_cooked_captures_decode_like_pcap() {
    let packets = every_opcode();
    let pcap = tmp("formats.pcap");
    write_pcap(&pcap, &packets);
    let want = output(&pcap);
    assert_eq!(want.0, 0);
    let frames: Vec<(Duration, Vec<u8>)> = read_frames(&pcap)
        .into_iter()
        .map(|f| (f.timestamp.unwrap(), f.data))
        .collect();
    let raw: Vec<_> = frames.iter().map(|(t, d)| (*t, d[14..].to_vec())).collect();
    let sll: Vec<_> = frames.iter().map(|(t, d)| (*t, to_sll(d))).collect();
    let sll2: Vec<_> = frames.iter().map(|(t, d)| (*t, to_sll2(d))).collect();
    let variants: Vec<(&str, Vec<u8>)> = vec![
        ("le.pcapng", pcapng(LinkType::ETHERNET, &frames, false)),
        ("be.pcapng", pcapng(LinkType::ETHERNET, &frames, true)),
        ("raw.pcap", classic_pcap(LinkType::RAW, &raw)),
        ("sll.pcap", classic_pcap(LinkType::LINUX_SLL, &sll)),
        ("sll2.pcap", classic_pcap(LinkType::LINUX_SLL2, &sll2)),
        ("sll2.pcapng", pcapng(LinkType::LINUX_SLL2, &sll2, false)),
    ];
    for (name, bytes) in variants {
        let p = tmp(&format!("formats-{name}"));
        std::fs::write(&p, bytes).unwrap();
        assert_eq!(output(&p), want, "{name}");
        let (_, j) = decode_json(&p);
        assert_eq!(j[0]["time_ns"], stamp(0).as_nanos() as u64, "{name}");
    }

    if have("editcap", "-h") {
        let ng = editcap_pcapng(&pcap, "editcap-ours.pcapng");
        assert_eq!(output(&ng), want);
        if let Some(shared) = shared() {
            let src = shared.join("captures/rxe/write_bw.pcap");
            let ng = editcap_pcapng(&src, "editcap-write_bw.pcapng");
            assert_eq!(output(&ng), output(&src));
        }
    } else {
        eprintln!("skipping the editcap part: editcap (tshark package) not installed");
    }
}

#[test]
fn json_lines_all_parse_and_carry_the_fields() {
    let packets = every_opcode();
    let path = tmp("json.pcap");
    write_pcap(&path, &packets);
    let (r, j) = decode_json(&path);
    assert_eq!(r.code, 0);
    assert!(r.stderr.is_empty(), "{}", r.stderr);
    assert_eq!(j.len(), packets.len() + 1);
    for (k, v) in j[..packets.len()].iter().enumerate() {
        assert!(v.is_object());
        assert_eq!(v["type"], "frame");
        assert_eq!(v["frame"], k + 1);
        for key in [
            "time_ns",
            "src",
            "dst",
            "status",
            "transport",
            "opcode",
            "opcode_name",
            "dest_qp",
            "psn",
            "ack_req",
            "pad",
            "payload_len",
            "icrc",
            "icrc_ok",
        ] {
            assert!(v.get(key).is_some(), "frame {} lacks {key}: {v}", k + 1);
        }
    }
    let s = &j[packets.len()];
    assert_eq!(s["type"], "summary");
    for key in [
        "roce_frames",
        "icrc_ok",
        "icrc_bad",
        "malformed",
        "other_frames",
    ] {
        assert!(s[key].is_u64(), "{key}: {s}");
    }
    assert!(s.get("error").is_none());

    // Real traffic too.
    if let Some(shared) = shared() {
        let (r, j) = decode_json(&shared.join("captures/rxe/rc_pingpong.pcap"));
        assert_eq!(r.code, 0);
        let s = j.last().unwrap();
        assert_eq!(s["roce_frames"], j.len() - 1);
        assert_eq!(s["icrc_ok"], j.len() - 1);
        assert!(s["other_frames"].as_u64().unwrap() > 0, "TCP setup traffic");
        let f = &j[0];
        let udp_check = f["src"].as_str().unwrap().parse::<SocketAddr>().is_ok();
        assert!(udp_check);
    }
}

#[test]
fn wire_frames_in_the_capture_are_what_parse_ip_sees() {
    // Guards the test helpers: PcapWriter frames parse back to the emitted bytes.
    let packets = every_opcode();
    let path = tmp("helpers.pcap");
    write_pcap(&path, &packets);
    for (f, p) in read_frames(&path).iter().zip(&packets) {
        let udp = parse_ip(f.ip().unwrap()).unwrap();
        assert_eq!(udp.udp_payload, &p.bytes[..]);
        assert_eq!((udp.src, udp.dst), (p.src, p.dst));
    }
}
