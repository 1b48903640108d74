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
use softrdma_wire::cm::{attr, CmPath, Ece, RejReason, RepRepr, ReqRepr, TransportType};
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
                q.vendor_id = 0x53_5201;
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
                p.vendor_id = 0x53_5201;
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

/// The ECE options the REQ and REP carry (softrdma's vendor ID and its
/// selective-repeat bit, plus a high bit, so every byte is seen).
const ECE_OPTIONS: u32 = 0x8000_0001;

fn mad_of(m: &CmMessage, tid: u64) -> CmMad {
    let mut mad = CmMad::send(tid, *m);
    if m.attribute_id() == attr::CLASS_PORT_INFO {
        mad.header = MadRepr::cm(method::GET_RESP, tid, attr::CLASS_PORT_INFO);
    }
    if let CmMessage::Req(ReqRepr { vendor_id, .. }) | CmMessage::Rep(RepRepr { vendor_id, .. }) =
        *m
    {
        mad.set_ece(Ece {
            vendor_id,
            options: ECE_OPTIONS,
        })
        .unwrap();
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

/// Fields every frame must have, and the string-valued ones of the REQ.
const COMMON: &[&str] = &[
    "infiniband.bth.destqp",
    "infiniband.deth.q_key",
    "infiniband.mad.mgmtclass",
    "infiniband.mad.method",
    "infiniband.mad.attributeid",
    "infiniband.mad.attributemodifier",
    "_ws.malformed",
    "_ws.expert.severity",
    "_ws.col.Info",
    "infiniband.cm.req.prim_localgid_ipv4",
    "infiniband.cm.req.prim_remotegid_ipv4",
    "infiniband.cm.req.ip_cm.sip4",
    "infiniband.cm.req.ip_cm.dip4",
];

/// Every numeric field Wireshark decodes for `m`, with the value we put in.
fn expected(m: &CmMessage) -> Vec<(&'static str, u64)> {
    fn u(v: impl Into<u64>) -> u64 {
        v.into()
    }
    let b = |v: bool| u64::from(v);
    match m {
        CmMessage::Req(q) => {
            let p = &q.primary_path;
            vec![
                ("infiniband.cm.req", u(q.local_comm_id)),
                ("infiniband.cm.req.serviceid", q.service_id),
                ("infiniband.cm.req.localcaguid", q.local_ca_guid),
                ("infiniband.cm.req.localqkey", u(q.local_qkey)),
                ("infiniband.cm.req.localqpn", u(q.local_qpn)),
                ("infiniband.cm.req.responderres", u(q.responder_resources)),
                ("infiniband.cm.req.localeecn", u(q.local_eecn)),
                ("infiniband.cm.req.initdepth", u(q.initiator_depth)),
                ("infiniband.cm.req.remoteeecn", u(q.remote_eecn)),
                (
                    "infiniband.cm.req.remoteresptout",
                    u(q.remote_cm_response_timeout),
                ),
                ("infiniband.cm.req.transpsvctype", q.transport as u64),
                (
                    "infiniband.cm.req.e2eflowctrl",
                    b(q.end_to_end_flow_control),
                ),
                ("infiniband.cm.req.startpsn", u(q.starting_psn.value())),
                (
                    "infiniband.cm.req.localresptout",
                    u(q.local_cm_response_timeout),
                ),
                ("infiniband.cm.req.retrcount", u(q.retry_count)),
                ("infiniband.cm.req.pkey", u(q.pkey)),
                ("infiniband.cm.req.pppmtu", u(q.path_mtu)),
                ("infiniband.cm.req.rdcexist", b(q.rdc_exists)),
                ("infiniband.cm.req.rnrretrcount", u(q.rnr_retry_count)),
                ("infiniband.cm.req.maxcmretr", u(q.max_cm_retries)),
                ("infiniband.cm.req.srq", b(q.srq)),
                ("infiniband.cm.req.ext_transport", u(q.extended_transport)),
                ("infiniband.cm.req.prim_locallid", u(p.local_lid)),
                ("infiniband.cm.req.prim_remotelid", u(p.remote_lid)),
                // Not compared: the flow label and packet rate (bytes 88..91).
                // Wireshark 4.0 misreads that word: it shows the top 12 bits of the
                // label and takes the rate from byte 88, while the kernel's
                // table (CM_REQ_PRIMARY_FLOW_LABEL at 88, 20 bits; _PACKET_RATE at
                // 91, bits 2..7) is what we follow: req_fields_sit_at_their_spec_offsets
                // in tests/cm.rs pins those bytes. Traffic class (92) onwards agree.
                ("infiniband.cm.req.prim_tfcclass", u(p.traffic_class)),
                ("infiniband.cm.req.prim_hoplim", u(p.hop_limit)),
                ("infiniband.cm.req.prim_sl", u(p.sl)),
                ("infiniband.cm.req.prim_subnetlocal", b(p.subnet_local)),
                (
                    "infiniband.cm.req.prim_localacktout",
                    u(p.local_ack_timeout),
                ),
                ("infiniband.cm.req.ip_cm.sport", 40001),
            ]
        }
        CmMessage::Rep(p) => vec![
            ("infiniband.cm.rep", u(p.local_comm_id)),
            ("infiniband.cm.rep.remotecommid", u(p.remote_comm_id)),
            ("infiniband.cm.rep.localqkey", u(p.local_qkey)),
            ("infiniband.cm.rep.localqpn", u(p.local_qpn)),
            ("infiniband.cm.rep.localeecn", u(p.local_eecn)),
            ("infiniband.cm.rep.startpsn", u(p.starting_psn.value())),
            ("infiniband.cm.rep.respres", u(p.responder_resources)),
            ("infiniband.cm.rep.initdepth", u(p.initiator_depth)),
            ("infiniband.cm.rep.tgtackdelay", u(p.target_ack_delay)),
            ("infiniband.cm.rep.failoveracc", u(p.failover_accepted)),
            (
                "infiniband.cm.rep.e2eflowctrl",
                b(p.end_to_end_flow_control),
            ),
            ("infiniband.cm.rep.rnrretrcount", u(p.rnr_retry_count)),
            ("infiniband.cm.rep.srq", b(p.srq)),
            ("infiniband.cm.rep.localcaguid", p.local_ca_guid),
        ],
        CmMessage::Rtu(m) => vec![
            ("infiniband.cm.rtu.localcommid", u(m.local_comm_id)),
            ("infiniband.cm.rtu.remotecommid", u(m.remote_comm_id)),
        ],
        CmMessage::Rej(j) => vec![
            ("infiniband.cm.rej.localcommid", u(j.local_comm_id)),
            ("infiniband.cm.rej.remotecommid", u(j.remote_comm_id)),
            ("infiniband.cm.rej.msgrej", j.message_rejected as u64),
            ("infiniband.cm.rej.rejinfolen", u(j.reject_info_len)),
            ("infiniband.cm.rej.reason", u(j.reason.code())),
        ],
        CmMessage::Dreq(d) => vec![
            ("infiniband.cm.dreq.localcommid", u(d.local_comm_id)),
            ("infiniband.cm.dreq.remotecommid", u(d.remote_comm_id)),
            ("infiniband.cm.req.remoteqpneecn", u(d.remote_qpn)),
        ],
        CmMessage::Drep(d) => vec![
            ("infiniband.cm.drsp.localcommid", u(d.local_comm_id)),
            ("infiniband.cm.drsp.remotecommid", u(d.remote_comm_id)),
        ],
        // Wireshark 4.0 names these but does not break them down.
        _ => vec![],
    }
}

/// Every field asked of tshark: the common ones, then each message's.
fn all_fields(msgs: &[CmMessage]) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = COMMON.to_vec();
    for m in msgs {
        for (f, _) in expected(m) {
            if !v.contains(&f) {
                v.push(f);
            }
        }
    }
    v
}

fn tshark_fields(path: &Path, fields: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.args([
        "-r",
        path.to_str().unwrap(),
        "-T",
        "fields",
        "-E",
        "separator=/t",
    ]);
    for f in fields {
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

/// One tshark output line, by field name.
struct Row<'a> {
    names: &'a [&'static str],
    values: &'a [String],
}

fn field<'a>(row: &Row<'a>, name: &str) -> &'a str {
    &row.values[row.names.iter().position(|f| *f == name).unwrap()]
}

/// A numeric field as tshark prints it (hex with 0x, or decimal), `None` if absent.
fn num(row: &Row<'_>, name: &str) -> Option<u64> {
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
    let names = all_fields(&msgs);
    let rows = tshark_fields(&path, &names);
    assert_eq!(rows.len(), msgs.len());
    for (m, values) in msgs.iter().zip(&rows) {
        let row = &Row {
            names: &names,
            values,
        };
        let id = m.attribute_id();
        let ctx = format!("attribute {id:#06x}: {values:?}");
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
        // ECE's options travel in the AttributeModifier of REQ and REP
        // (their vendor ID in bytes Wireshark shows as reserved).
        let want_mod = match m {
            CmMessage::Req(_) | CmMessage::Rep(_) => ECE_OPTIONS,
            _ => 0,
        };
        assert_eq!(
            num(row, "infiniband.mad.attributemodifier"),
            Some(want_mod.into()),
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

/// The message-specific fields: every one Wireshark 4.0 decodes (it breaks
/// down REQ, REP, RTU, REJ, DREQ and DREP) must hold the value put in.
fn check_message(m: &CmMessage, row: &Row<'_>, ctx: &str) {
    for (name, want) in expected(m) {
        assert_eq!(num(row, name), Some(want), "{name} in {ctx}");
    }
    if matches!(m, CmMessage::Req(_)) {
        let f = |name| field(row, name);
        assert_eq!(
            f("infiniband.cm.req.prim_localgid_ipv4"),
            CLIENT.to_string(),
            "{ctx}"
        );
        assert_eq!(
            f("infiniband.cm.req.prim_remotegid_ipv4"),
            SERVER.to_string(),
            "{ctx}"
        );
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
