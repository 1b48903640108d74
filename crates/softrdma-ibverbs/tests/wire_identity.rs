//! Wire identity: the same perftest runs, captured, must put the same
//! packets on the wire as the code they were recorded with.
//!
//! Each case runs an unmodified Debian perftest pair over UDP with
//! `SOFTRDMA_CAPTURE` on the client and reduces its capture to the
//! signature of every stream (requests and responses of each direction):
//! opcodes, PSNs relative to the first of the direction, AckReq bits,
//! payload lengths, and each ACK's syndrome, PSN and MSN — which is the
//! ACK coalescing. Keys, QPNs, addresses and ICRCs differ from run to run
//! and are left out. The cases are chosen so that timing cannot change
//! the signature: ping-pongs, and streams with one message in flight.
//! Retransmissions (a packet equal to one already seen in its stream) are
//! left out too: whether the last ACK of a run reaches a peer that is
//! already exiting is timing, not the transport.
//!
//! `tests/fixtures/wire/*.sig` were recorded from the code before the
//! device core and the transport seams (commit 55e4627) with
//! `SOFTRDMA_WIRE_RECORD=1 cargo test -p softrdma-ibverbs --test wire_identity`.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use softrdma_pcap::CaptureReader;
use softrdma_wire::{frame, Headers, PacketRepr, Syndrome};

const T: Duration = Duration::from_secs(120);

/// One perftest run whose signature is compared.
struct Case {
    name: &'static str,
    tool: &'static str,
    args: &'static [&'static str],
    port: u16,
}

const CASES: &[Case] = &[
    Case {
        name: "write_lat_8",
        tool: "ib_write_lat",
        args: &["-n", "200", "-s", "8"],
        port: 19701,
    },
    Case {
        name: "write_lat_10000",
        tool: "ib_write_lat",
        args: &["-n", "50", "-s", "10000"],
        port: 19702,
    },
    Case {
        name: "send_lat_64",
        tool: "ib_send_lat",
        args: &["-n", "200", "-s", "64"],
        port: 19703,
    },
    Case {
        name: "read_lat_9000",
        tool: "ib_read_lat",
        args: &["-n", "100", "-s", "9000"],
        port: 19704,
    },
    Case {
        name: "write_bw_t1_65536",
        tool: "ib_write_bw",
        args: &["-n", "100", "-s", "65536", "-t", "1"],
        port: 19706,
    },
    Case {
        name: "send_bw_t1_16384",
        tool: "ib_send_bw",
        args: &["-n", "100", "-s", "16384", "-t", "1"],
        port: 19707,
    },
    Case {
        name: "atomic_lat",
        tool: "ib_atomic_lat",
        args: &["-n", "100"],
        port: 19705,
    },
];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/wire")
        .join(format!("{name}.sig"))
}

/// The token of one packet in its stream.
fn token(p: &PacketRepr<'_>, base: u32) -> String {
    let b = &p.bth;
    let rel = b.psn.value().wrapping_sub(base) & 0xFF_FFFF;
    let mut t = format!("{} psn+{rel} len {}", b.opcode.name(), p.payload.len());
    if b.ack_req {
        t.push_str(" A");
    }
    let aeth = match p.headers {
        Headers::Aeth(a) | Headers::AtomicAck(a, _) => Some(a),
        _ => None,
    };
    if let Some(a) = aeth {
        let s = match a.syndrome {
            Syndrome::Ack { .. } => "ack".to_string(),
            Syndrome::RnrNak { timer } => format!("rnr {timer}"),
            Syndrome::Nak(c) => format!("nak {c:?}"),
        };
        t.push_str(&format!(" [{s} msn {}]", a.msn.value()));
    }
    t
}

/// Streams of a capture: "c>s requests", "s>c responses", ... → tokens.
fn signature(pcap: &Path, client: SocketAddr) -> BTreeMap<String, Vec<String>> {
    let reader = CaptureReader::open(pcap).expect("open the capture");
    // The first request PSN of each direction: requests count from it,
    // and the responses to them as well.
    let mut base: BTreeMap<bool, u32> = BTreeMap::new();
    let mut streams: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut seen: BTreeMap<String, std::collections::HashSet<String>> = BTreeMap::new();
    for f in reader {
        let f = f.expect("a readable frame");
        let ip = f.ip().expect("an IP frame");
        let udp = frame::parse_ip(ip).expect("a UDP datagram");
        let Ok(p) = PacketRepr::parse(udp.udp_payload) else {
            panic!("frame {}: not a RoCEv2 packet", f.number);
        };
        let from_client = udp.src.ip() == client.ip();
        let info = p.bth.opcode.info();
        // Responses travel opposite to the requests they answer.
        let req_dir = if info.is_request {
            from_client
        } else {
            !from_client
        };
        let b = *base.entry(req_dir).or_insert(p.bth.psn.value());
        let dir = if from_client { "c>s" } else { "s>c" };
        let class = if info.is_request {
            "requests"
        } else {
            "responses"
        };
        let t = token(&p, b);
        let seen = seen.entry(format!("{dir} {class}")).or_default();
        // A packet seen before is a retransmission (or the ACK of one): when
        // the last ACK of a run is lost to the exiting peer is timing.
        if seen.insert(t.clone()) {
            streams.entry(format!("{dir} {class}")).or_default().push(t);
        }
    }
    streams
}

fn render(sig: &BTreeMap<String, Vec<String>>) -> String {
    let mut out = String::new();
    for (stream, toks) in sig {
        out.push_str(&format!("== {stream} ({} packets)\n", toks.len()));
        for t in toks {
            out.push_str(t);
            out.push('\n');
        }
    }
    out
}

/// The first line where two signatures differ, with a little context.
fn first_difference(want: &str, got: &str) -> String {
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let i = w
        .iter()
        .zip(&g)
        .position(|(a, b)| a != b)
        .unwrap_or(w.len().min(g.len()));
    let from = i.saturating_sub(3);
    format!(
        "line {}:\n  recorded: {:?}\n  now:      {:?}",
        i + 1,
        &w[from..(i + 3).min(w.len())],
        &g[from..(i + 3).min(g.len())]
    )
}

fn run_case(case: &Case) -> String {
    let dir = std::env::temp_dir().join(format!(
        "softrdma-wire-identity-{}-{}",
        std::process::id(),
        case.name
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cap = dir.join("client.pcap");
    let _ = std::fs::remove_file(&cap);
    let p = case.port.to_string();
    let mut args = vec!["-d", "srx0", "-p", &p];
    args.extend_from_slice(case.args);
    let mut cargs = args.clone();
    cargs.push("127.0.0.1");
    let server = softrdma_cmd(case.tool, &args, Load::LibraryPath, "udp");
    let mut client = softrdma_cmd(case.tool, &cargs, Load::LibraryPath, "udp");
    // Fixed device addresses, so the capture says which side sent what.
    let mut server = server;
    server.env("SOFTRDMA_DEVICES", "srx0=127.0.0.61");
    client
        .env("SOFTRDMA_DEVICES", "srx0=127.0.0.62")
        .env("SOFTRDMA_CAPTURE", &cap);
    let (s, c) = run_pair(server, client, case.port, T);
    assert_both_ok(&format!("{} {}", case.tool, args.join(" ")), &s, &c);
    let sig = render(&signature(&cap, "127.0.0.62:4791".parse().unwrap()));
    let _ = std::fs::remove_dir_all(&dir);
    sig
}

#[test]
fn perftest_runs_put_the_recorded_packets_on_the_wire() {
    let tools: Vec<&str> = CASES.iter().map(|c| c.tool).collect();
    if !have(&tools) {
        return;
    }
    let _g = serial();
    let record = std::env::var_os("SOFTRDMA_WIRE_RECORD").is_some();
    let mut failures = Vec::new();
    for case in CASES {
        let got = run_case(case);
        let path = fixture(case.name);
        if record {
            std::fs::write(&path, &got).expect("write the fixture");
            eprintln!("recorded {}", path.display());
            continue;
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (record it first)", path.display()));
        if want != got {
            failures.push(format!(
                "{} ({} {:?}): {}",
                case.name,
                case.tool,
                case.args,
                first_difference(&want, &got)
            ));
        } else {
            eprintln!("{}: {} lines identical", case.name, got.lines().count());
        }
    }
    assert!(
        failures.is_empty(),
        "wire changed:\n{}",
        failures.join("\n")
    );
}

#[test]
fn a_changed_stream_is_caught() {
    // The comparison itself: one changed token is reported with its line.
    let want = "== c>s requests (2 packets)\nRC_RDMA_WRITE_ONLY psn+0 len 8 A\nRC_RDMA_WRITE_ONLY psn+1 len 8 A\n";
    let got = want.replace("psn+1 len 8 A", "psn+1 len 8");
    assert_ne!(want, got);
    let d = first_difference(want, &got);
    assert!(d.starts_with("line 3:"), "{d}");
}
