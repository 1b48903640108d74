//! tshark as the outside judge of the CM wire format: every CM message is
//! written, inside the UD packet that carries it to QP1, into a pcap, and
//! Wireshark's InfiniBand dissector must decode each frame as that message
//! with the field values put in, with no malformed frame or expert error;
//! the ICRCs are checked by the shared stand-alone checker.
//!
//! Without tshark the test skips, unless SOFTRDMA_STRICT_TESTS is set (CI),
//! where a missing tool is a failure.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::cm::random_message;
use common::Rng;
use softrdma_wire::cm::{attr, CmPath, RejReason, TransportType};
use softrdma_wire::cma::{self, CmaHeader};
use softrdma_wire::frame::{self, FrameOptions};
use softrdma_wire::mad::{gmp_packet, method, MadRepr};
use softrdma_wire::{icrc, CmMad, CmMessage, Endpoints, Psn};

fn strict() -> bool {
    std::env::var_os("SOFTRDMA_STRICT_TESTS").is_some()
}

/// True when `tool` runs; otherwise a skip, or a failure under strict tests.
fn have(tool: &str, what: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        assert!(
            !strict(),
            "{what} is missing, and SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping"
        );
        eprintln!("skipping: {what} not available");
    }
    ok
}

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("softrdma-wire");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// A classic little-endian pcap with Ethernet link type around `frames`.
fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut out = Vec::new();
    out.extend_from_slice(&0xA1B2_C3D4u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&[0; 8]); // thiszone, sigfigs
    out.extend_from_slice(&65535u32.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
    for (i, f) in frames.iter().enumerate() {
        out.extend_from_slice(&(1_700_000_000 + i as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
    std::fs::write(path, out).unwrap();
}

const CLIENT: Ipv4Addr = Ipv4Addr::new(192, 168, 10, 1);
const SERVER: Ipv4Addr = Ipv4Addr::new(192, 168, 10, 2);
const PORT: u16 = 7471;

fn ipv4_mapped(a: Ipv4Addr) -> [u8; 16] {
    a.to_ipv6_mapped().octets()
}

/// The messages of one rdma_cm connection and its teardown, plus the other
/// attributes, with recognisable values (comm IDs 0x1000 + attribute).
fn messages() -> Vec<CmMessage> {
    let mut r = Rng::new(0x7A5);
    let mut out = Vec::new();
    for id in common::cm::ATTRIBUTES {
        let mut m = random_message(&mut r, id);
        let comm = 0x1000 + u32::from(id);
        match &mut m {
            CmMessage::Req(q) => {
                q.local_comm_id = comm;
                q.service_id = cma::service_id(cma::PS_TCP, PORT);
                q.local_qpn = 0x00_0011;
                q.starting_psn = Psn::new(0xABCDE);
                q.transport = TransportType::Rc;
                q.path_mtu = 3;
                q.primary_path = CmPath {
                    local_gid: ipv4_mapped(CLIENT),
                    remote_gid: ipv4_mapped(SERVER),
                    local_lid: 0xFFFF,
                    remote_lid: 0xFFFF,
                    ..q.primary_path
                };
                q.alternate_path = CmPath::default();
                q.sap_supported = false;
                q.private_data = [0; 92];
                let h = CmaHeader {
                    src: CLIENT.into(),
                    dst: SERVER.into(),
                    src_port: 40001,
                };
                h.emit(&mut q.private_data).unwrap();
            }
            CmMessage::Rep(p) => {
                p.local_comm_id = comm;
                p.local_qpn = 0x00_0022;
                p.starting_psn = Psn::new(0x54321);
            }
            CmMessage::Rej(j) => {
                j.local_comm_id = comm;
                j.reason = RejReason::ConsumerDefined;
            }
            CmMessage::Rtu(m) | CmMessage::Drep(m) => m.local_comm_id = comm,
            CmMessage::Dreq(d) => {
                d.local_comm_id = comm;
                d.remote_qpn = 0x00_0022;
            }
            CmMessage::Mra(m) => m.local_comm_id = comm,
            CmMessage::SidrReq(s) => s.request_id = comm,
            CmMessage::SidrRep(s) => s.request_id = comm,
            CmMessage::ClassPortInfo(_) => {}
        }
        out.push(m);
    }
    out
}

fn mad_of(m: &CmMessage, tid: u64) -> CmMad {
    let mut mad = CmMad::send(tid, *m);
    if m.attribute_id() == attr::CLASS_PORT_INFO {
        mad.header = MadRepr::cm(method::GET_RESP, tid, attr::CLASS_PORT_INFO);
    }
    mad
}

fn frames(msgs: &[CmMessage]) -> Vec<Vec<u8>> {
    let src = SocketAddr::new(CLIENT.into(), 0xC000);
    let dst = SocketAddr::new(SERVER.into(), frame::ROCE_PORT);
    let ep = Endpoints::new(src, dst);
    msgs.iter()
        .enumerate()
        .map(|(i, m)| {
            let bytes = mad_of(m, 0x100 + i as u64).to_bytes().unwrap();
            let p = gmp_packet(1, Psn::new(i as u32), &bytes);
            let mut udp = vec![0u8; p.buffer_len()];
            p.emit(&mut udp, &ep).unwrap();
            frame::build_frame(src, dst, &udp, &FrameOptions::default()).unwrap()
        })
        .collect()
}

const FIELDS: &[&str] = &[
    "infiniband.bth.destqp",
    "infiniband.deth.q_key",
    "infiniband.mad.mgmtclass",
    "infiniband.mad.method",
    "infiniband.mad.attributeid",
    "infiniband.cm.req",
    "infiniband.cm.req.serviceid",
    "infiniband.cm.req.localqpn",
    "infiniband.cm.req.startpsn",
    "infiniband.cm.req.pppmtu",
    "infiniband.cm.req.prim_localgid_ipv4",
    "infiniband.cm.req.ip_cm.sport",
    "infiniband.cm.req.ip_cm.sip4",
    "infiniband.cm.req.ip_cm.dip4",
    "infiniband.cm.rep",
    "infiniband.cm.rep.localqpn",
    "infiniband.cm.rep.startpsn",
    "infiniband.cm.rtu.localcommid",
    "infiniband.cm.rej.localcommid",
    "infiniband.cm.rej.reason",
    "infiniband.cm.dreq.localcommid",
    "infiniband.cm.req.remoteqpneecn",
    "infiniband.cm.drsp.localcommid",
    "_ws.malformed",
    "_ws.expert.severity",
    "_ws.col.Info",
];

fn tshark_fields(path: &Path) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.args([
        "-r",
        path.to_str().unwrap(),
        "-T",
        "fields",
        "-E",
        "separator=/t",
    ]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

fn field<'a>(row: &'a [String], name: &str) -> &'a str {
    &row[FIELDS.iter().position(|f| *f == name).unwrap()]
}

/// A numeric field as tshark prints it (hex with 0x, or decimal), `None` if absent.
fn num(row: &[String], name: &str) -> Option<u64> {
    let s = field(row, name);
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The name Wireshark gives each CM attribute in the Info column.
fn info_name(id: u16) -> &'static str {
    match id {
        attr::CLASS_PORT_INFO => "ClassPortInfo",
        attr::REQ => "ConnectRequest",
        attr::MRA => "MsgRcptAck",
        attr::REJ => "ConnectReject",
        attr::REP => "ConnectReply",
        attr::RTU => "ReadyToUse",
        attr::DREQ => "DisconnectRequest",
        attr::DREP => "DisconnectReply",
        attr::SIDR_REQ => "ServiceIDResReq",
        attr::SIDR_REP => "ServiceIDResReqResp",
        _ => unreachable!(),
    }
}

#[test]
fn tshark_dissects_every_cm_message() {
    if !have("tshark", "tshark") {
        return;
    }
    let msgs = messages();
    let path = tmp("cm-messages.pcap");
    write_pcap(&path, &frames(&msgs));
    let rows = tshark_fields(&path);
    assert_eq!(rows.len(), msgs.len());
    for (m, row) in msgs.iter().zip(&rows) {
        let id = m.attribute_id();
        let ctx = format!("attribute {id:#06x}: {row:?}");
        assert_eq!(num(row, "infiniband.bth.destqp"), Some(1), "{ctx}");
        assert_eq!(
            num(row, "infiniband.deth.q_key"),
            Some(0x8001_0000),
            "{ctx}"
        );
        assert_eq!(num(row, "infiniband.mad.mgmtclass"), Some(7), "{ctx}");
        let want_method = mad_of(m, 0).header.method;
        assert_eq!(
            num(row, "infiniband.mad.method"),
            Some(want_method.into()),
            "{ctx}"
        );
        assert_eq!(
            num(row, "infiniband.mad.attributeid"),
            Some(id.into()),
            "{ctx}"
        );
        assert_eq!(
            field(row, "_ws.col.Info"),
            format!("CM: {}", info_name(id)),
            "{ctx}"
        );
        assert_eq!(field(row, "_ws.malformed"), "", "{ctx}");
        assert_eq!(field(row, "_ws.expert.severity"), "", "{ctx}");
        check_message(m, row, &ctx);
    }
}

/// The message-specific fields tshark decodes (Wireshark 4.0 dissects REQ,
/// REP, RTU, REJ, DREQ and DREP; the others only by MAD header).
fn check_message(m: &CmMessage, row: &[String], ctx: &str) {
    let f = |name| field(row, name);
    let n = |name| num(row, name);
    match m {
        CmMessage::Req(q) => {
            assert_eq!(
                n("infiniband.cm.req"),
                Some(u64::from(q.local_comm_id)),
                "{ctx}"
            );
            assert_eq!(
                n("infiniband.cm.req.serviceid"),
                Some(q.service_id),
                "{ctx}"
            );
            assert_eq!(
                n("infiniband.cm.req.localqpn"),
                Some(u64::from(q.local_qpn)),
                "{ctx}"
            );
            assert_eq!(
                n("infiniband.cm.req.startpsn"),
                Some(u64::from(q.starting_psn.value())),
                "{ctx}"
            );
            assert_eq!(
                n("infiniband.cm.req.pppmtu"),
                Some(u64::from(q.path_mtu)),
                "{ctx}"
            );
            assert_eq!(
                f("infiniband.cm.req.prim_localgid_ipv4"),
                CLIENT.to_string(),
                "{ctx}"
            );
            assert_eq!(n("infiniband.cm.req.ip_cm.sport"), Some(40001), "{ctx}");
            assert_eq!(
                f("infiniband.cm.req.ip_cm.sip4"),
                CLIENT.to_string(),
                "{ctx}"
            );
            assert_eq!(
                f("infiniband.cm.req.ip_cm.dip4"),
                SERVER.to_string(),
                "{ctx}"
            );
        }
        CmMessage::Rep(p) => {
            assert_eq!(
                n("infiniband.cm.rep"),
                Some(u64::from(p.local_comm_id)),
                "{ctx}"
            );
            assert_eq!(
                n("infiniband.cm.rep.localqpn"),
                Some(u64::from(p.local_qpn)),
                "{ctx}"
            );
            assert_eq!(
                n("infiniband.cm.rep.startpsn"),
                Some(u64::from(p.starting_psn.value())),
                "{ctx}"
            );
        }
        CmMessage::Rtu(m) => {
            assert_eq!(
                n("infiniband.cm.rtu.localcommid"),
                Some(u64::from(m.local_comm_id)),
                "{ctx}"
            )
        }
        CmMessage::Rej(j) => {
            assert_eq!(
                n("infiniband.cm.rej.localcommid"),
                Some(u64::from(j.local_comm_id)),
                "{ctx}"
            );
            assert_eq!(n("infiniband.cm.rej.reason"), Some(28), "{ctx}");
        }
        CmMessage::Dreq(d) => {
            assert_eq!(
                n("infiniband.cm.dreq.localcommid"),
                Some(u64::from(d.local_comm_id)),
                "{ctx}"
            );
            assert_eq!(
                n("infiniband.cm.req.remoteqpneecn"),
                Some(u64::from(d.remote_qpn)),
                "{ctx}"
            );
        }
        CmMessage::Drep(d) => {
            assert_eq!(
                n("infiniband.cm.drsp.localcommid"),
                Some(u64::from(d.local_comm_id)),
                "{ctx}"
            )
        }
        _ => {}
    }
}

#[test]
fn every_icrc_in_the_capture_is_right() {
    let path = tmp("cm-icrc.pcap");
    let fs = frames(&messages());
    write_pcap(&path, &fs);
    assert_eq!(fs.len(), 10);
    // Our own check first: recompute from the frames as a receiver would.
    for f in &fs {
        let ip = frame::ip_of_ethernet(f).unwrap();
        let udp = frame::parse_ip(ip).unwrap();
        let (stored, computed) = icrc::over_ip_packet(udp.ip_packet).unwrap();
        assert_eq!(stored, computed);
    }
    // Then the shared stand-alone checker, written from the rxe masking rules.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/icrc-check.py");
    if !script.is_file() {
        assert!(
            !strict(),
            "{} is missing, and SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping",
            script.display()
        );
        eprintln!(
            "skipping the outside ICRC check: {} not present",
            script.display()
        );
        return;
    }
    if !have("python3", "python3") {
        return;
    }
    let out = Command::new("python3")
        .arg(&script)
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The checker reports rather than fails: read its verdict.
    let want = format!("{} ok, 0 bad", fs.len());
    assert!(text.contains(&want), "want \"{want}\":\n{text}");
}
