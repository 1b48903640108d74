//! The capture reader: classic pcap in both byte orders and resolutions,
//! pcapng with several sections, interfaces, timestamp resolutions and
//! skipped blocks, cooked link types, errors that name the problem, the
//! real captures in shared/, and a cross-check against editcap.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{classic, Ng};
use softrdma_pcap::{CaptureReader, Error, Format, Frame, LinkType, PcapWriter};
use softrdma_wire::frame::parse_ip;
use softrdma_wire::icrc;

fn read_err(bytes: &[u8]) -> Error {
    match CaptureReader::from_bytes(bytes) {
        Err(e) => e,
        Ok(r) => r
            .collect::<Result<Vec<_>, _>>()
            .expect_err("the file should not read cleanly"),
    }
}

const IPV4: [u8; 20] = [
    0x45, 0, 0, 20, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
];

#[test]
fn classic_all_four_magics() {
    for big in [false, true] {
        for nanos in [false, true] {
            let frac = if nanos { 123_456_789 } else { 123_456 };
            let f = classic(big, nanos, 101, &[(7, frac, &IPV4), (8, 0, &[1, 2])]);
            let mut r = CaptureReader::from_bytes(&f).unwrap();
            assert_eq!(
                r.format(),
                Format::Pcap {
                    big_endian: big,
                    nanos
                }
            );
            assert_eq!(r.link_type(), Some(LinkType::RAW));
            let a = r.next().unwrap().unwrap();
            let want = if nanos {
                Duration::new(7, 123_456_789)
            } else {
                Duration::new(7, 123_456_000)
            };
            assert_eq!(a.timestamp, Some(want), "big={big} nanos={nanos}");
            assert_eq!(a.number, 1);
            assert_eq!(a.data, IPV4);
            assert_eq!(a.ip().unwrap(), &IPV4);
            let b = r.next().unwrap().unwrap();
            assert_eq!((b.number, b.data.as_slice()), (2, &[1u8, 2][..]));
            assert!(r.next().is_none());
        }
    }
}

#[test]
fn pcapng_sections_interfaces_and_block_kinds() {
    let mut sll2 = vec![0x08, 0x00];
    sll2.extend_from_slice(&[0u8; 18]);
    sll2.extend_from_slice(&IPV4);
    let mut sll = vec![0u8; 14];
    sll.extend_from_slice(&[0x08, 0x00]);
    sll.extend_from_slice(&IPV4);

    let mut ng = Ng::new(false);
    ng.idb(1, None, None) // Ethernet, microseconds
        .idb(276, Some(9), Some(-2)) // SLL2, nanoseconds, 2 s earlier
        .block(4, &[0, 0, 0, 0]) // name resolution: skipped
        .epb(1, 5_000_000_123, &sll2)
        .block(0x0000_0BAD, b"custom block") // unknown: skipped
        .spb(&[0xEE; 14]) // interface 0
        .block(5, &[0u8; 20]); // interface statistics: skipped
    ng.section(true) // a big-endian section: interfaces start afresh
        .idb(113, Some(0x80 | 10), Some(100)) // SLL, 1/1024 s units
        .idb(101, Some(3), None) // raw IP, milliseconds
        .epb(0, 2048 + 512, &sll)
        .pb(1, 1_500, &IPV4)
        .epb(1, 42, &IPV4);
    let mut r = CaptureReader::from_bytes(&ng.out).unwrap();
    assert_eq!(r.format(), Format::Pcapng);
    let frames = r.by_ref().collect::<Result<Vec<_>, _>>().unwrap();
    assert_eq!(frames.len(), 5);
    assert_eq!(r.offset(), ng.out.len() as u64);

    let f = &frames[0];
    assert_eq!((f.number, f.interface), (1, 1));
    assert_eq!(f.link_type, LinkType::LINUX_SLL2);
    assert_eq!(f.timestamp, Some(Duration::new(3, 123)));
    assert_eq!(f.orig_len, sll2.len() as u32 + 100);
    assert_eq!(f.ip().unwrap(), &IPV4);

    let f = &frames[1];
    assert_eq!((f.number, f.interface), (2, 0));
    assert_eq!(f.link_type, LinkType::ETHERNET);
    assert_eq!(f.timestamp, None, "simple packet blocks carry no time");
    assert_eq!(f.data, [0xEE; 14]);

    let f = &frames[2];
    assert_eq!(f.link_type, LinkType::LINUX_SLL);
    assert_eq!(
        f.timestamp,
        Some(Duration::from_millis(2500) + Duration::from_secs(100))
    );
    assert_eq!(f.ip().unwrap(), &IPV4);

    let f = &frames[3];
    assert_eq!((f.number, f.interface), (4, 1));
    assert_eq!(f.link_type, LinkType::RAW);
    assert_eq!(f.timestamp, Some(Duration::from_millis(1500)));
    assert_eq!(f.data, IPV4);

    let f = &frames[4];
    assert_eq!(f.timestamp, Some(Duration::from_millis(42)));
}

#[test]
fn errors_name_what_is_wrong() {
    let msg = |b: &[u8]| read_err(b).to_string();

    assert_eq!(
        msg(&[]),
        "file cut short in file header at byte 0: need 4 bytes, have 0"
    );
    assert_eq!(
        msg(b"GIF89a.."),
        "not a pcap or pcapng file: it starts with 47 49 46 38"
    );
    let good = classic(false, false, 1, &[(1, 0, &IPV4)]);
    assert_eq!(
        msg(&good[..10]),
        "file cut short in pcap file header at byte 0: need 24 bytes, have 10"
    );
    assert_eq!(
        msg(&good[..24 + 9]),
        "file cut short in pcap record header at byte 24: need 16 bytes, have 9"
    );
    assert_eq!(
        msg(&good[..good.len() - 1]),
        "file cut short in pcap record data at byte 24: need 36 bytes, have 35"
    );
    let mut v3 = good.clone();
    v3[4] = 3;
    assert!(
        msg(&v3).contains("unsupported pcap version 3.4"),
        "{}",
        msg(&v3)
    );
    let mut huge = good.clone();
    huge[24 + 8..24 + 12].copy_from_slice(&0x7FFF_FFFFu32.to_le_bytes());
    assert!(msg(&huge).contains("claims 2147483647 captured bytes"));

    // pcapng
    let mut ng = Ng::new(false);
    ng.idb(1, None, None).epb(0, 0, &IPV4);
    let good = ng.out.clone();
    let mut bad_bom = good.clone();
    bad_bom[8] = 0x99;
    assert!(
        msg(&bad_bom).contains("byte-order magic"),
        "{}",
        msg(&bad_bom)
    );
    let mut bad_trailer = good.clone();
    let n = bad_trailer.len();
    bad_trailer[n - 4] ^= 0x10;
    let m = msg(&bad_trailer);
    assert!(
        m.contains("block of type 0x6") && m.contains("trailing length"),
        "{m}"
    );
    let mut odd = good.clone();
    let shb_len = u32::from_le_bytes([good[4], good[5], good[6], good[7]]) as usize;
    let idb = shb_len;
    odd[idb + 4] += 1;
    assert!(msg(&odd).contains("not a multiple of 4"), "{}", msg(&odd));
    // The last block (the EPB) starts where the SHB and IDB end.
    let idb_len = u32::from_le_bytes([good[idb + 4], good[idb + 5], good[idb + 6], good[idb + 7]]);
    let epb = idb + idb_len as usize;
    let epb_len = good.len() - epb;
    assert_eq!(
        msg(&good[..good.len() - 10]),
        format!(
            "file cut short in pcapng block at byte {epb}: need {epb_len} bytes, have {}",
            epb_len - 10
        )
    );
    assert_eq!(
        msg(&good[..good.len() - 2]),
        format!(
            "file cut short in pcapng block at byte {epb}: need {epb_len} bytes, have {}",
            epb_len - 2
        )
    );
    let mut ng = Ng::new(false);
    ng.idb(1, None, None).epb(3, 0, &IPV4);
    assert_eq!(
        msg(&ng.out).split(": ").nth(1).unwrap(),
        "packet refers to interface 3, but only 1 interface(s) are described"
    );
    let mut ng = Ng::new(true);
    ng.idb(1, Some(90), None);
    assert!(msg(&ng.out).contains("if_tsresol 0x5a"), "{}", msg(&ng.out));
}

#[test]
fn iteration_stops_after_an_error() {
    let good = classic(false, false, 1, &[(1, 0, &IPV4), (2, 0, &IPV4)]);
    let mut r = CaptureReader::from_bytes(&good[..good.len() - 3]).unwrap();
    assert!(r.next().unwrap().is_ok());
    assert!(r.next().unwrap().is_err());
    assert!(r.next().is_none());
}

fn shared() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/captures");
    if p.is_dir() {
        Some(p)
    } else {
        assert!(std::env::var_os("SOFTRDMA_STRICT_TESTS").is_none(), "an outside tool or file this test needs is missing, and SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping");
        eprintln!("skipping: {} not present", p.display());
        None
    }
}

fn captures(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for d in [dir.to_path_buf(), dir.join("rxe")] {
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                if e.path().extension().is_some_and(|x| x == "pcap") {
                    v.push(e.path());
                }
            }
        }
    }
    v.sort();
    v
}

#[test]
fn real_captures_read_and_their_icrcs_check_out() {
    let Some(dir) = shared() else { return };
    let files = captures(&dir);
    assert!(files.len() >= 8, "{files:?}");
    for path in files {
        let mut roce = 0;
        for f in CaptureReader::open(&path).unwrap() {
            let f = f.unwrap();
            assert_eq!(f.link_type, LinkType::ETHERNET);
            let Ok(ip) = f.ip() else { continue };
            let Ok(udp) = parse_ip(ip) else { continue };
            if udp.dst.port() != 4791 {
                continue;
            }
            let (s, c) = icrc::over_ip_packet(udp.ip_packet).unwrap();
            assert_eq!(s, c, "{} frame {}", path.display(), f.number);
            roce += 1;
        }
        assert!(roce > 0, "{} has no RoCE frame", path.display());
    }
}

#[test]
fn editcap_pcapng_conversion_reads_the_same() {
    let Some(dir) = shared() else { return };
    let ok = Command::new("editcap")
        .arg("-h")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(std::env::var_os("SOFTRDMA_STRICT_TESTS").is_none(), "an outside tool or file this test needs is missing, and SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping");
        eprintln!("skipping: editcap (tshark package) not installed");
        return;
    }
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("softrdma-pcap");
    std::fs::create_dir_all(&out_dir).unwrap();
    // A real file and one written by PcapWriter.
    let ours = out_dir.join("ours.pcap");
    {
        let src = "10.1.1.1:49999".parse().unwrap();
        let dst = "10.1.1.2:4791".parse().unwrap();
        let mut w = PcapWriter::create(&ours).unwrap();
        for i in 0..3 {
            w.write_roce(
                Duration::new(1_600_000_000 + i, 250_000 * i as u32),
                src,
                dst,
                &common::roce_payload(src, dst, i as u32),
            )
            .unwrap();
        }
    }
    for (name, pcap) in [("real", dir.join("rxe/write_bw.pcap")), ("ours", ours)] {
        let ng = out_dir.join(format!("{name}.pcapng"));
        let st = Command::new("editcap")
            .args(["-F", "pcapng"])
            .arg(&pcap)
            .arg(&ng)
            .status()
            .unwrap();
        assert!(st.success());
        let a: Vec<Frame> = CaptureReader::open(&pcap)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let mut r = CaptureReader::open(&ng).unwrap();
        assert_eq!(r.format(), Format::Pcapng);
        let b: Vec<Frame> = r.by_ref().collect::<Result<_, _>>().unwrap();
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.data, y.data, "{name} frame {}", x.number);
            assert_eq!(x.timestamp, y.timestamp, "{name} frame {}", x.number);
            assert_eq!(x.link_type, y.link_type);
            assert_eq!(x.orig_len, y.orig_len);
        }
    }
}
