//! The pcap writer: exact file layout, RoCE framing with a valid ICRC,
//! snap length, multi-threaded logging, and a check by tshark.

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, UNIX_EPOCH};

use softrdma_pcap::{CaptureReader, LinkType, PcapWriter, SharedPcapWriter, SNAPLEN};
use softrdma_wire::frame::{mac_for, parse_ip};
use softrdma_wire::{icrc, PacketRepr};

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("softrdma-pcap");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn addrs() -> (SocketAddr, SocketAddr) {
    (
        "192.168.7.1:49153".parse().unwrap(),
        "192.168.7.2:4791".parse().unwrap(),
    )
}

#[test]
fn file_header_and_record_layout() {
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    let ts = Duration::new(1_700_000_000, 123_456_789);
    w.write_frame(ts, &[1, 2, 3]).unwrap();
    assert_eq!(w.frames_written(), 1);
    let b = w.into_inner().unwrap();
    assert_eq!(
        b[..24],
        [
            0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 1, 0, 0,
            0
        ]
    );
    let rec = &b[24..];
    assert_eq!(rec[0..4], 1_700_000_000u32.to_le_bytes());
    assert_eq!(
        rec[4..8],
        123_456u32.to_le_bytes(),
        "microseconds, truncated"
    );
    assert_eq!(rec[8..12], 3u32.to_le_bytes());
    assert_eq!(rec[12..16], 3u32.to_le_bytes());
    assert_eq!(rec[16..], [1, 2, 3]);
}

#[test]
fn system_time_and_duration_timestamps_agree() {
    let t = UNIX_EPOCH + Duration::new(1_234_567_890, 5_000);
    let mut a = PcapWriter::new(Vec::new()).unwrap();
    a.write_frame(t, &[0]).unwrap();
    let mut b = PcapWriter::new(Vec::new()).unwrap();
    b.write_frame(Duration::new(1_234_567_890, 5_000), &[0])
        .unwrap();
    assert_eq!(a.into_inner().unwrap(), b.into_inner().unwrap());
}

#[test]
fn timestamp_past_2106_is_refused() {
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    let e = w
        .write_frame(Duration::from_secs(1 << 33), &[0])
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert_eq!(w.frames_written(), 0);
}

#[test]
fn long_frames_are_cut_to_the_snap_length() {
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    let big = vec![7u8; 70_000];
    w.write_frame(Duration::ZERO, &big).unwrap();
    let bytes = w.into_inner().unwrap();
    let f = CaptureReader::from_bytes(&bytes)
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(f.data.len(), SNAPLEN as usize);
    assert_eq!(f.orig_len, 70_000);
}

#[test]
fn write_roce_frames_carry_a_valid_icrc() {
    for (src, dst) in [
        addrs(),
        (
            "[fd00::1]:50000".parse().unwrap(),
            "[fd00::2]:4791".parse().unwrap(),
        ),
    ] {
        let payload = common::roce_payload(src, dst, 0xFF_FFFE);
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_roce(Duration::from_millis(1500), src, dst, &payload)
            .unwrap();
        let bytes = w.into_inner().unwrap();
        let f = CaptureReader::from_bytes(&bytes)
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(f.link_type, LinkType::ETHERNET);
        assert_eq!(f.timestamp, Some(Duration::from_millis(1500)));
        assert_eq!(f.data[0..6], mac_for(dst.ip()), "destination MAC");
        assert_eq!(f.data[6..12], mac_for(src.ip()), "source MAC");
        let udp = parse_ip(f.ip().unwrap()).unwrap();
        assert_eq!((udp.src, udp.dst), (src, dst));
        assert_eq!(udp.udp_payload, &payload[..]);
        let (stored, computed) = icrc::over_ip_packet(udp.ip_packet).unwrap();
        assert_eq!(stored, computed, "{src} -> {dst}");
        PacketRepr::parse(udp.udp_payload).unwrap();
    }
}

#[test]
fn shared_writer_logs_whole_frames_from_many_threads() {
    let path = tmp("threads.pcap");
    let (src, dst) = addrs();
    {
        let w = SharedPcapWriter::create(&path).unwrap();
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let w = w.clone();
                std::thread::spawn(move || {
                    for i in 0..250u32 {
                        let p = common::roce_payload(src, dst, (t << 16) | i);
                        w.write_roce(Duration::from_micros(u64::from(i)), src, dst, &p)
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(w.frames_written(), 1000);
        // No explicit flush: dropping the last clone must flush the file.
    }
    let mut seen = HashSet::new();
    for f in CaptureReader::open(&path).unwrap() {
        let f = f.unwrap();
        let udp = parse_ip(f.ip().unwrap()).unwrap();
        let p = PacketRepr::parse(udp.udp_payload).unwrap();
        let (s, c) = icrc::over_ip_packet(udp.ip_packet).unwrap();
        assert_eq!(s, c, "frame {} was interleaved with another", f.number);
        assert!(seen.insert(p.bth.psn.value()));
    }
    assert_eq!(seen.len(), 1000);
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn tshark_reads_what_the_writer_writes() {
    if !have("tshark") {
        assert!(std::env::var_os("SOFTRDMA_STRICT_TESTS").is_none(), "an outside tool or file this test needs is missing, and SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping");
        eprintln!("skipping: tshark not installed");
        return;
    }
    let path = tmp("tshark-check.pcap");
    let (src, dst) = addrs();
    let mut w = PcapWriter::create(&path).unwrap();
    let times = [
        Duration::new(1_700_000_000, 1_000),
        Duration::new(1_700_000_001, 999_999_000),
        Duration::new(1_700_000_002, 0),
    ];
    for (i, t) in times.iter().enumerate() {
        w.write_roce(*t, src, dst, &common::roce_payload(src, dst, i as u32))
            .unwrap();
    }
    drop(w);
    let out = Command::new("tshark")
        .args(["-r", path.to_str().unwrap(), "-T", "fields"])
        .args([
            "-e",
            "frame.time_epoch",
            "-e",
            "frame.len",
            "-e",
            "ip.flags.df",
        ])
        .args([
            "-e",
            "ip.id",
            "-e",
            "udp.dstport",
            "-e",
            "infiniband.bth.psn",
        ])
        .args(["-e", "_ws.malformed", "-E", "separator=/t"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    for (i, line) in lines.iter().enumerate() {
        let f: Vec<&str> = line.split('\t').collect();
        let want_ts = format!(
            "{}.{:09}",
            times[i].as_secs(),
            times[i].subsec_micros() * 1000
        );
        assert_eq!(f[0], want_ts, "{line}");
        assert_eq!(f[1], (14 + 20 + 8 + 12 + 16 + 16 + 4).to_string(), "{line}");
        assert!(f[2] == "1" || f[2] == "True", "DF set: {line}");
        assert_eq!(f[3], "0x0000", "{line}");
        assert_eq!(f[4], "4791");
        assert_eq!(f[5], i.to_string());
        assert_eq!(f[6], "", "tshark found a malformed packet: {line}");
    }
}
