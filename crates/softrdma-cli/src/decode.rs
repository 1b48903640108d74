//! `softrdma decode FILE`: one line (or JSON object) per RoCEv2 frame of a
//! capture, with every header field an engineer looks at and the verdict of
//! the invariant CRC, then a summary.
//!
//! A frame is RoCEv2 when it carries UDP to or from port 4791. The ICRC is
//! recomputed over the IP packet as captured ([`icrc::over_ip_packet`]), so
//! captures of any sender check out whatever IP ID and flags it used.

use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;
use softrdma_pcap::{CaptureReader, Frame};
use softrdma_wire::aeth::{credits_from_code, rnr_timer_micros};
use softrdma_wire::frame::{parse_ip, ROCE_PORT};
use softrdma_wire::{icrc, AethRepr, Headers, OpKind, PacketRepr, Syndrome};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Capture file: classic pcap or pcapng; Ethernet, raw IP or Linux
    /// cooked (SLL/SLL2) link types.
    pub file: PathBuf,
    /// Print one JSON object per RoCEv2 frame and a final summary object,
    /// one per line, instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Counts for the summary line.
#[derive(Debug, Default, Serialize)]
struct Summary {
    roce_frames: u64,
    icrc_ok: u64,
    icrc_bad: u64,
    malformed: u64,
    other_frames: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct RethJson {
    va: u64,
    rkey: u32,
    dma_len: u32,
}

#[derive(Debug, Serialize)]
struct AethJson {
    /// The raw syndrome byte.
    syndrome: u8,
    /// `ACK`, `RNR_NAK` or `NAK`.
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    credits: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rnr_timer: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nak_code: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nak: Option<&'static str>,
    msn: u32,
}

#[derive(Debug, Serialize)]
struct AtomicJson {
    va: u64,
    rkey: u32,
    swap_add: u64,
    compare: u64,
}

#[derive(Debug, Serialize)]
struct DethJson {
    qkey: u32,
    src_qp: u32,
}

#[derive(Debug, Serialize)]
struct IcrcJson {
    stored: u32,
    computed: u32,
}

/// Everything decoded from one well-formed RoCEv2 frame.
#[derive(Debug, Serialize)]
struct Decoded {
    transport: &'static str,
    opcode: u8,
    opcode_name: &'static str,
    dest_qp: u32,
    psn: u32,
    ack_req: bool,
    solicited: bool,
    mig_req: bool,
    pad: u8,
    pkey: u16,
    fecn: bool,
    becn: bool,
    payload_len: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    xrc_srqn: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reth: Option<RethJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aeth: Option<AethJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    atomic: Option<AtomicJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    atomic_ack_orig: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    imm: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ieth: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deth: Option<DethJson>,
    icrc: IcrcJson,
    icrc_ok: bool,
    /// Set for CMP_SWAP/FETCH_ADD to print the right field names.
    #[serde(skip)]
    kind: Option<OpKind>,
}

/// One RoCEv2 frame's line.
#[derive(Debug, Serialize)]
struct Record {
    #[serde(rename = "type")]
    ty: &'static str,
    frame: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    time_ns: Option<u128>,
    src: String,
    dst: String,
    /// `ok`, `bad` (ICRC mismatch) or `malformed`.
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    decoded: Option<Decoded>,
}

/// Finds the UDP endpoints of an IP packet leniently (without trusting its
/// length fields) so that a cut-short RoCEv2 frame is still recognised as
/// one. Returns `None` for anything that is not an unfragmented-at-offset-0
/// UDP packet with readable ports.
fn udp_endpoints(ip: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    let (src, dst, udp) = match ip.first()? >> 4 {
        4 => {
            let ihl = usize::from(ip.first()? & 0xF) * 4;
            if ip.len() < 20 || ihl < 20 || ip[9] != 17 {
                return None;
            }
            if u16::from_be_bytes([ip[6], ip[7]]) & 0x1FFF != 0 {
                return None; // a later fragment has no UDP header
            }
            let s = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
            let d = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
            (IpAddr::V4(s), IpAddr::V4(d), ip.get(ihl..)?)
        }
        6 => {
            if ip.len() < 40 || ip[6] != 17 {
                return None;
            }
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&ip[8..24]);
            d.copy_from_slice(&ip[24..40]);
            (
                IpAddr::V6(Ipv6Addr::from(s)),
                IpAddr::V6(Ipv6Addr::from(d)),
                &ip[40..],
            )
        }
        _ => return None,
    };
    if udp.len() < 4 {
        return None;
    }
    let sp = u16::from_be_bytes([udp[0], udp[1]]);
    let dp = u16::from_be_bytes([udp[2], udp[3]]);
    Some((SocketAddr::new(src, sp), SocketAddr::new(dst, dp)))
}

fn aeth_json(a: &AethRepr) -> AethJson {
    let syndrome = a.syndrome.to_byte();
    let mut j = AethJson {
        syndrome,
        kind: "ACK",
        credits: None,
        rnr_timer: None,
        nak_code: None,
        nak: None,
        msn: a.msn.value(),
    };
    match a.syndrome {
        Syndrome::Ack { credits } => j.credits = Some(credits),
        Syndrome::RnrNak { timer } => {
            j.kind = "RNR_NAK";
            j.rnr_timer = Some(timer);
        }
        Syndrome::Nak(code) => {
            j.kind = "NAK";
            j.nak_code = Some(code.value());
            j.nak = Some(code.name());
        }
    }
    j
}

/// Decodes a RoCEv2 IP packet. `Err` holds the reason it is malformed.
fn decode_roce(ip: &[u8]) -> Result<Decoded, String> {
    let udp = parse_ip(ip).map_err(|e| e.to_string())?;
    let p = PacketRepr::parse(udp.udp_payload).map_err(|e| e.to_string())?;
    let (stored, computed) = icrc::over_ip_packet(udp.ip_packet).map_err(|e| e.to_string())?;
    let info = p.bth.opcode.info();
    let mut d = Decoded {
        transport: info.transport.name(),
        opcode: info.code,
        opcode_name: info.name,
        dest_qp: p.bth.dest_qp,
        psn: p.bth.psn.value(),
        ack_req: p.bth.ack_req,
        solicited: p.bth.solicited,
        mig_req: p.bth.mig_req,
        pad: p.bth.pad_count,
        pkey: p.bth.pkey,
        fecn: p.bth.fecn,
        becn: p.bth.becn,
        payload_len: p.payload.len(),
        xrc_srqn: p.headers.xrc_srqn(),
        reth: None,
        aeth: None,
        atomic: None,
        atomic_ack_orig: None,
        imm: None,
        ieth: None,
        deth: None,
        icrc: IcrcJson { stored, computed },
        icrc_ok: stored == computed,
        kind: Some(info.kind),
    };
    // An XRC request's XRCETH is reported above; the rest is RC's headers.
    match p.headers.without_xrceth() {
        Headers::None | Headers::Cnp => {}
        Headers::Imm(i) => d.imm = Some(i),
        Headers::Ieth(k) => d.ieth = Some(k),
        Headers::Reth(r) | Headers::RethImm(r, _) => {
            d.reth = Some(RethJson {
                va: r.va,
                rkey: r.rkey,
                dma_len: r.dma_len,
            })
        }
        Headers::Aeth(a) => d.aeth = Some(aeth_json(&a)),
        Headers::AtomicAck(a, orig) => {
            d.aeth = Some(aeth_json(&a));
            d.atomic_ack_orig = Some(orig);
        }
        Headers::Atomic(a) => {
            d.atomic = Some(AtomicJson {
                va: a.va,
                rkey: a.rkey,
                swap_add: a.swap_add,
                compare: a.compare,
            })
        }
        Headers::Deth(x) | Headers::DethImm(x, _) => {
            d.deth = Some(DethJson {
                qkey: x.qkey,
                src_qp: x.src_qp,
            })
        }
        // `without_xrceth` leaves none of these.
        Headers::Xrc(_)
        | Headers::XrcImm(..)
        | Headers::XrcIeth(..)
        | Headers::XrcReth(..)
        | Headers::XrcRethImm(..)
        | Headers::XrcAtomic(..) => {}
    }
    if let Some(i) = p.headers.imm() {
        d.imm = Some(i);
    }
    Ok(d)
}

/// The opcode name without its transport prefix (`RDMA_WRITE_ONLY` for
/// `RC_RDMA_WRITE_ONLY`).
fn short_name<'a>(transport: &str, name: &'a str) -> &'a str {
    name.strip_prefix(transport)
        .and_then(|n| n.strip_prefix('_'))
        .unwrap_or(name)
}

fn rnr_timer_text(code: u8) -> String {
    let us = rnr_timer_micros(code);
    format!("{}.{:02} ms", us / 1000, (us % 1000) / 10)
}

fn aeth_text(a: &AethJson) -> String {
    let what = match a.kind {
        "ACK" => match a.credits.and_then(credits_from_code) {
            Some(n) => format!("ACK(credits={n})"),
            None => "ACK(credits=invalid)".to_string(),
        },
        "RNR_NAK" => {
            let t = a.rnr_timer.unwrap_or(0);
            format!("RNR_NAK(timer={t}: {})", rnr_timer_text(t))
        }
        _ => format!("NAK({})", a.nak.unwrap_or("?")),
    };
    format!("{what} msn={}", a.msn)
}

/// The text line of a record (without the trailing newline).
fn text_line(r: &Record) -> String {
    let mut s = format!("{:>5}  {} → {}  ", r.frame, r.src, r.dst);
    let Some(d) = &r.decoded else {
        s.push_str("MALFORMED: ");
        s.push_str(r.error.as_deref().unwrap_or("?"));
        return s;
    };
    let op = short_name(d.transport, d.opcode_name);
    if op == d.transport {
        s.push_str(op);
    } else {
        s.push_str(&format!("{} {}", d.transport, op));
    }
    s.push_str(&format!(
        "  qp={:#08x} psn={} ackreq={}",
        d.dest_qp,
        d.psn,
        u8::from(d.ack_req)
    ));
    for (set, name) in [
        (d.solicited, "se"),
        (d.mig_req, "migreq"),
        (d.fecn, "fecn"),
        (d.becn, "becn"),
    ] {
        if set {
            s.push(' ');
            s.push_str(name);
        }
    }
    if d.pkey != 0xFFFF {
        s.push_str(&format!(" pkey={:#06x}", d.pkey));
    }
    let mut fields = Vec::new();
    if let Some(x) = &d.reth {
        fields.push(format!(
            "va={:#x} rkey={:#x} dmalen={}",
            x.va, x.rkey, x.dma_len
        ));
    }
    if let Some(x) = &d.atomic {
        fields.push(format!("va={:#x} rkey={:#x}", x.va, x.rkey));
        if d.kind == Some(OpKind::FetchAdd) {
            fields.push(format!("add={:#x}", x.swap_add));
        } else {
            fields.push(format!("swap={:#x} compare={:#x}", x.swap_add, x.compare));
        }
    }
    if let Some(x) = d.xrc_srqn {
        fields.push(format!("xrc_srqn={x:#x}"));
    }
    if let Some(x) = &d.aeth {
        fields.push(aeth_text(x));
    }
    if let Some(x) = d.atomic_ack_orig {
        fields.push(format!("orig={x:#x}"));
    }
    if let Some(x) = &d.deth {
        fields.push(format!("qkey={:#010x} srcqp={:#08x}", x.qkey, x.src_qp));
    }
    if let Some(x) = d.imm {
        fields.push(format!("imm={x:#010x}"));
    }
    if let Some(x) = d.ieth {
        fields.push(format!("inv_rkey={x:#x}"));
    }
    if d.payload_len > 0 || d.pad > 0 || opcode_has_payload(d.opcode) {
        let mut p = format!("payload={}", d.payload_len);
        if d.pad > 0 {
            p.push_str(&format!(" pad={}", d.pad));
        }
        fields.push(p);
    }
    for f in fields {
        s.push_str("  ");
        s.push_str(&f);
    }
    if d.icrc_ok {
        s.push_str("  ICRC ok");
    } else {
        s.push_str(&format!(
            "  ICRC BAD (got {:#010x}, want {:#010x})",
            d.icrc.stored, d.icrc.computed
        ));
    }
    s
}

fn opcode_has_payload(code: u8) -> bool {
    softrdma_wire::Opcode::from_u8(code).is_some_and(|o| o.info().has_payload)
}

fn summary_line(s: &Summary) -> String {
    format!(
        "{} RoCEv2 frames: {} ICRC ok, {} ICRC bad, {} malformed, {} other frames skipped",
        s.roce_frames, s.icrc_ok, s.icrc_bad, s.malformed, s.other_frames
    )
}

/// Classifies one frame: `None` when it is not RoCEv2.
fn record_of(frame: &Frame) -> Option<Record> {
    let ip = frame.ip().ok()?;
    let (src, dst) = udp_endpoints(ip)?;
    if src.port() != ROCE_PORT && dst.port() != ROCE_PORT {
        return None;
    }
    let (status, error, decoded) = match decode_roce(ip) {
        Ok(d) => (if d.icrc_ok { "ok" } else { "bad" }, None, Some(d)),
        Err(e) => ("malformed", Some(e), None),
    };
    Some(Record {
        ty: "frame",
        frame: frame.number,
        time_ns: frame.timestamp.map(|t| t.as_nanos()),
        src: src.to_string(),
        dst: dst.to_string(),
        status,
        error,
        decoded,
    })
}

fn emit(out: &mut impl Write, json: bool, r: &Record) -> io::Result<()> {
    if json {
        serde_json::to_writer(&mut *out, r)?;
        out.write_all(b"\n")
    } else {
        writeln!(out, "{}", text_line(r))
    }
}

fn emit_summary(out: &mut impl Write, json: bool, s: &Summary) -> io::Result<()> {
    if json {
        #[derive(Serialize)]
        struct Wrapped<'a> {
            #[serde(rename = "type")]
            ty: &'static str,
            #[serde(flatten)]
            summary: &'a Summary,
        }
        serde_json::to_writer(
            &mut *out,
            &Wrapped {
                ty: "summary",
                summary: s,
            },
        )?;
        out.write_all(b"\n")
    } else {
        writeln!(out, "{}", summary_line(s))
    }
}

/// Runs `softrdma decode`.
pub fn run(args: &Args) -> ExitCode {
    let name = args.file.display();
    let reader = match CaptureReader::open(&args.file) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("softrdma decode: cannot read {name}: {e}");
            return ExitCode::from(2);
        }
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut sum = Summary::default();
    let result = (|| -> io::Result<()> {
        for frame in reader {
            let frame = match frame {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("softrdma decode: {name}: {e}");
                    sum.error = Some(e.to_string());
                    break;
                }
            };
            let Some(r) = record_of(&frame) else {
                sum.other_frames += 1;
                continue;
            };
            sum.roce_frames += 1;
            match r.status {
                "ok" => sum.icrc_ok += 1,
                "bad" => sum.icrc_bad += 1,
                _ => sum.malformed += 1,
            }
            emit(&mut out, args.json, &r)?;
        }
        emit_summary(&mut out, args.json, &sum)?;
        out.flush()
    })();
    if let Err(e) = result {
        if e.kind() != io::ErrorKind::BrokenPipe {
            eprintln!("softrdma decode: writing output: {e}");
            return ExitCode::from(2);
        }
    }
    if sum.error.is_some() {
        ExitCode::from(2)
    } else if sum.icrc_bad > 0 || sum.malformed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rnr_timer_formatting() {
        assert_eq!(rnr_timer_text(0), "655.36 ms");
        assert_eq!(rnr_timer_text(1), "0.01 ms");
        assert_eq!(rnr_timer_text(14), "1.28 ms");
    }

    #[test]
    fn short_names() {
        assert_eq!(short_name("RC", "RC_RDMA_WRITE_ONLY"), "RDMA_WRITE_ONLY");
        assert_eq!(short_name("CNP", "CNP"), "CNP");
        assert_eq!(short_name("UD", "UD_SEND_ONLY"), "SEND_ONLY");
    }

    #[test]
    fn random_ip_packets_never_panic() {
        // xorshift64*: deterministic, no dependency.
        let mut x: u64 = 0x0DEC_0DE5_EED5;
        let mut next = || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        };
        let base = softrdma_pcap::roce_frame(
            "10.0.0.1:49152".parse().unwrap(),
            "10.0.0.2:4791".parse().unwrap(),
            &[0u8; 40],
        )
        .unwrap()[14..]
            .to_vec();
        for _ in 0..20_000 {
            let mut ip = base.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() % ip.len() as u64) as usize;
                match next() % 3 {
                    0 => ip[at] ^= 1 << (next() % 8),
                    1 => ip[at] = next() as u8,
                    _ => ip.truncate(at),
                }
                if ip.is_empty() {
                    break;
                }
            }
            if udp_endpoints(&ip).is_some() {
                let _ = decode_roce(&ip).map(|d| d.icrc_ok);
            }
        }
    }

    #[test]
    fn lenient_endpoints_survive_cut_packets() {
        let mut ip = vec![0x45, 0, 0, 200, 0, 0, 0x40, 0, 64, 17, 0, 0];
        ip.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        ip.extend_from_slice(&[0xC0, 0x00, 0x12, 0xB7]);
        let (s, d) = udp_endpoints(&ip).unwrap();
        assert_eq!(s.to_string(), "10.0.0.1:49152");
        assert_eq!(d.port(), ROCE_PORT);
        assert!(udp_endpoints(&ip[..22]).is_none());
        ip[9] = 6;
        assert!(udp_endpoints(&ip).is_none());
    }
}
