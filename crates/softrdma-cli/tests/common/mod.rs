//! Shared helpers of the `softrdma` command tests: running the binary,
//! locating shared/, building captures (one frame of every opcode, pcapng
//! and cooked re-encodings), and checking for external tools.

#![allow(dead_code)]

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use softrdma_pcap::{CaptureReader, Frame, LinkType, PcapWriter};
use softrdma_wire::{
    AethRepr, AtomicEthRepr, BthRepr, DethRepr, Endpoints, HeaderLayout, Headers, Msn, NakCode,
    OpKind, Opcode, PacketRepr, Position, Psn, RethRepr, Syndrome, Transport, OPCODE_TABLE,
};

/// Result of one `softrdma` run.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn softrdma(args: &[&str]) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(args)
        .output()
        .expect("run softrdma");
    Run {
        code: status.code().expect("softrdma killed by a signal"),
        stdout: String::from_utf8(stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// Serialises the runs of [`softrdma_bounded`] in one test binary: each
/// `softrdma perf` already keeps two processes busy.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds the test binary's one run slot (see [`softrdma_bounded`]) for a
/// test that starts its own `softrdma` processes.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `softrdma ARGS` without the caller's device settings
/// (`SOFTRDMA_DEVICES`, `_FAULT`, `_TRANSPORT`), one at a time, killing it
/// after 90 s.
pub fn softrdma_bounded(args: &[&str]) -> Run {
    let _one = one_at_a_time();
    let mut child = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(args)
        .env_remove("SOFTRDMA_DEVICES")
        .env_remove("SOFTRDMA_FAULT")
        .env_remove("SOFTRDMA_TRANSPORT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start softrdma");
    let t_out = read_all(child.stdout.take().unwrap());
    let t_err = read_all(child.stderr.take().unwrap());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("softrdma {args:?} did not finish in 90 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        code: status.code().unwrap_or(-1),
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}

/// Reads a child's pipe to the end on its own thread, so that neither
/// pipe can fill and stall the child.
fn read_all(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// The rows of a perftest-style result table: the numbers of each line
/// after the heading that starts with " #bytes", up to the closing rule.
pub fn perf_rows(out: &str) -> (String, Vec<Vec<f64>>) {
    let mut lines = out.lines();
    let head = lines
        .by_ref()
        .find(|l| l.starts_with(" #bytes"))
        .unwrap_or_else(|| panic!("no result table in:\n{out}"))
        .to_string();
    let rows = lines
        .take_while(|l| !l.starts_with("---"))
        .map(|l| {
            l.split_whitespace()
                .map(|w| {
                    w.parse()
                        .unwrap_or_else(|_| panic!("not a number {w:?} in {l:?}"))
                })
                .collect()
        })
        .collect();
    (head, rows)
}

pub fn decode(path: &Path) -> Run {
    softrdma(&["decode", path.to_str().unwrap()])
}

pub fn decode_json(path: &Path) -> (Run, Vec<serde_json::Value>) {
    let r = softrdma(&["decode", "--json", path.to_str().unwrap()]);
    let v = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    (r, v)
}

/// shared/ next to the repository, or `None` (after saying so) when absent.
pub fn shared() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    if p.join("captures").is_dir() {
        Some(p)
    } else {
        assert!(std::env::var_os("SOFTRDMA_STRICT_TESTS").is_none(), "an outside tool or file this test needs is missing, and SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping");
        eprintln!("skipping: {} not present", p.display());
        None
    }
}

/// A scratch file path under the target directory.
pub fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("softrdma-cli");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// True when `tool` runs.
pub fn have(tool: &str, arg: &str) -> bool {
    Command::new(tool)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// One emitted RoCEv2 packet and what it should decode to.
#[derive(Debug, Clone)]
pub struct Emitted {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub bth: BthRepr,
    pub headers: Headers,
    pub payload: Vec<u8>,
    /// The UDP payload as emitted (with pad and ICRC).
    pub bytes: Vec<u8>,
}

impl Emitted {
    pub fn pad(&self) -> u8 {
        ((4 - self.payload.len() % 4) % 4) as u8
    }
}

fn headers_for(info_layout: HeaderLayout, kind: OpKind, code: u8, i: u32) -> Headers {
    let reth = RethRepr {
        va: 0x0123_4567_89AB_CD00 + u64::from(i),
        rkey: 0xDEAD_0000 | i,
        dma_len: 0x0001_0000 + i,
    };
    let msn = Msn::new(0xABC_DE0 + i);
    let deth = DethRepr {
        qkey: 0x8001_0000 | i,
        src_qp: 0x0A_BC00 | i,
    };
    let imm = 0xC0DE_0000 | i;
    match info_layout {
        HeaderLayout::None => Headers::None,
        HeaderLayout::Imm => Headers::Imm(imm),
        HeaderLayout::Ieth => Headers::Ieth(0x1E7B_0000 | i),
        HeaderLayout::Reth => Headers::Reth(reth),
        HeaderLayout::RethImm => Headers::RethImm(reth, imm),
        HeaderLayout::Aeth => {
            let syndrome = match code {
                0x0D => Syndrome::Ack { credits: 5 },
                0x0F => Syndrome::Ack { credits: 0x1F },
                0x10 => Syndrome::Ack { credits: 0 },
                _ => Syndrome::RnrNak { timer: 14 },
            };
            Headers::Aeth(AethRepr { syndrome, msn })
        }
        HeaderLayout::AtomicAck => Headers::AtomicAck(
            AethRepr {
                syndrome: Syndrome::Ack { credits: 3 },
                msn,
            },
            0xFEDC_BA98_7654_3210,
        ),
        HeaderLayout::Atomic => Headers::Atomic(AtomicEthRepr {
            va: 0x7F00_0000_1000 + 8 * u64::from(i),
            rkey: 0x0A70_0000 | i,
            swap_add: if kind == OpKind::FetchAdd {
                0x0102_0304_0506_0708
            } else {
                0x1111_2222_3333_4444
            },
            compare: if kind == OpKind::FetchAdd {
                0
            } else {
                0x5555_6666_7777_8888
            },
        }),
        HeaderLayout::Deth => Headers::Deth(deth),
        HeaderLayout::DethImm => Headers::DethImm(deth, imm),
        HeaderLayout::Cnp => Headers::Cnp,
        // An XRC request: an XRCETH, then the RC request's headers.
        HeaderLayout::Xrc
        | HeaderLayout::XrcImm
        | HeaderLayout::XrcIeth
        | HeaderLayout::XrcReth
        | HeaderLayout::XrcRethImm
        | HeaderLayout::XrcAtomic => {
            headers_for(info_layout.without_xrceth(), kind, code & 0x1F, i)
                .with_xrceth(0x5C_0000 | i)
                .unwrap()
        }
    }
}

fn emit(
    src: SocketAddr,
    dst: SocketAddr,
    bth: BthRepr,
    headers: Headers,
    payload: Vec<u8>,
) -> Emitted {
    let p = PacketRepr {
        bth,
        headers,
        payload: &payload,
    };
    let mut bytes = vec![0u8; p.buffer_len()];
    let n = p.emit(&mut bytes, &Endpoints::new(src, dst)).unwrap();
    assert_eq!(n, bytes.len());
    let mut bth = bth;
    bth.pad_count = ((4 - payload.len() % 4) % 4) as u8;
    Emitted {
        src,
        dst,
        bth,
        headers,
        payload,
        bytes,
    }
}

/// One packet of every opcode in [`OPCODE_TABLE`] with distinctive field
/// values (PSNs crossing the 2^24 wrap, every pad count), then extra ACKs
/// covering every NAK code and RNR timers, then two IPv6 packets.
pub fn every_opcode() -> Vec<Emitted> {
    let mut out = Vec::new();
    for (i, info) in OPCODE_TABLE.iter().enumerate() {
        let i = i as u32;
        let op = Opcode::from_u8(info.code).unwrap();
        let src: SocketAddr = format!("10.0.0.1:{}", 0xC000 + i).parse().unwrap();
        let dst: SocketAddr = "10.0.0.2:4791".parse().unwrap();
        let mut bth = BthRepr::new(op, 0x10_0000 | (i * 0x0101), Psn::new(0xFF_FFF0).add(i));
        bth.ack_req = i & 1 == 0;
        if info.has_imm && info.transport != Transport::Ud {
            bth.solicited = true;
        }
        if info.transport == Transport::Cnp {
            bth.becn = true;
            bth.psn = Psn::new(0);
        }
        let payload: Vec<u8> = if info.has_payload {
            // At least 16 bytes: Wireshark 4.0's RPC-over-RDMA heuristic
            // reads 16 bytes of every RC SEND payload and calls shorter
            // ones malformed.
            (0..16 + i % 4).map(|k| (0x40 + k + i) as u8).collect()
        } else {
            Vec::new()
        };
        let headers = headers_for(info.layout, info.kind, info.code, i);
        out.push(emit(src, dst, bth, headers, payload));
    }
    let n = out.len() as u32;
    let extra = [
        Syndrome::Ack { credits: 0x1F },
        Syndrome::RnrNak { timer: 0 },
        Syndrome::RnrNak { timer: 31 },
        Syndrome::Nak(NakCode::PsnSequenceError),
        Syndrome::Nak(NakCode::InvalidRequest),
        Syndrome::Nak(NakCode::RemoteAccessError),
        Syndrome::Nak(NakCode::RemoteOperationalError),
        Syndrome::Nak(NakCode::InvalidRdRequest),
    ];
    for (k, syndrome) in extra.into_iter().enumerate() {
        let i = n + k as u32;
        // Responses go to port 4791 too; the source port is flow entropy.
        let src: SocketAddr = format!("10.0.0.2:{}", 0xC000 + i).parse().unwrap();
        let dst: SocketAddr = "10.0.0.1:4791".parse().unwrap();
        let bth = BthRepr::new(Opcode::RC_ACK, 0x20_0000 | i, Psn::new(0xFF_FFFF).add(i));
        let headers = Headers::Aeth(AethRepr {
            syndrome,
            msn: Msn::new(0xFF_FFF0 + k as u32),
        });
        out.push(emit(src, dst, bth, headers, Vec::new()));
    }
    let src: SocketAddr = "[fd00::1]:49999".parse().unwrap();
    let dst: SocketAddr = "[fd00::2]:4791".parse().unwrap();
    let op = Opcode::find(
        Transport::Rc,
        OpKind::Write,
        Position::Only,
        HeaderLayout::RethImm,
    )
    .unwrap();
    let mut bth = BthRepr::new(op, 0x77, Psn::new(1));
    bth.ack_req = true;
    let headers = headers_for(HeaderLayout::RethImm, OpKind::Write, op.value(), 99);
    out.push(emit(src, dst, bth, headers, b"over IPv6".to_vec()));
    let bth = BthRepr::new(Opcode::UD_SEND_ONLY_IMM, 0x78, Psn::new(2));
    let headers = headers_for(HeaderLayout::DethImm, OpKind::Send, 0x65, 100);
    out.push(emit(src, dst, bth, headers, vec![0x5A; 256]));
    out
}

/// Frame `k` (0-based) is stamped at 1.7e9 s + k ms.
pub fn stamp(k: usize) -> Duration {
    Duration::new(1_700_000_000, 0) + Duration::from_millis(k as u64)
}

/// Writes packets with [`PcapWriter::write_roce`].
pub fn write_pcap(path: &Path, packets: &[Emitted]) {
    let mut w = PcapWriter::create(path).unwrap();
    for (k, p) in packets.iter().enumerate() {
        w.write_roce(stamp(k), p.src, p.dst, &p.bytes).unwrap();
    }
    w.flush().unwrap();
}

pub fn read_frames(path: &Path) -> Vec<Frame> {
    CaptureReader::open(path)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// A classic pcap (little-endian, microseconds) of `link` frames.
pub fn classic_pcap(link: LinkType, frames: &[(Duration, Vec<u8>)]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&0xA1B2_C3D4u32.to_le_bytes());
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&4u16.to_le_bytes());
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&65535u32.to_le_bytes());
    f.extend_from_slice(&link.value().to_le_bytes());
    for (ts, data) in frames {
        f.extend_from_slice(&(ts.as_secs() as u32).to_le_bytes());
        f.extend_from_slice(&ts.subsec_micros().to_le_bytes());
        f.extend_from_slice(&(data.len() as u32).to_le_bytes());
        f.extend_from_slice(&(data.len() as u32).to_le_bytes());
        f.extend_from_slice(data);
    }
    f
}

/// The same frames as pcapng (big-endian when `big`), nanosecond resolution.
pub fn pcapng(link: LinkType, frames: &[(Duration, Vec<u8>)], big: bool) -> Vec<u8> {
    let u16b = |v: u16| {
        if big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    let u32b = |v: u32| {
        if big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    let mut out = Vec::new();
    let mut block = |t: u32, body: &[u8]| {
        let mut body = body.to_vec();
        body.resize((body.len() + 3) & !3, 0);
        let total = 12 + body.len() as u32;
        out.extend_from_slice(&u32b(t));
        out.extend_from_slice(&u32b(total));
        out.extend_from_slice(&body);
        out.extend_from_slice(&u32b(total));
    };
    let mut shb = Vec::new();
    shb.extend_from_slice(&u32b(0x1A2B_3C4D));
    shb.extend_from_slice(&u16b(1));
    shb.extend_from_slice(&u16b(0));
    shb.extend_from_slice(&[0xFF; 8]);
    block(0x0A0D_0D0A, &shb);
    let mut idb = Vec::new();
    idb.extend_from_slice(&u16b(link.value() as u16));
    idb.extend_from_slice(&[0, 0]);
    idb.extend_from_slice(&u32b(0));
    idb.extend_from_slice(&u16b(9)); // if_tsresol = 10^-9
    idb.extend_from_slice(&u16b(1));
    idb.extend_from_slice(&[9, 0, 0, 0]);
    idb.extend_from_slice(&[0, 0, 0, 0]);
    block(1, &idb);
    for (ts, data) in frames {
        let t = ts.as_nanos() as u64;
        let mut epb = Vec::new();
        epb.extend_from_slice(&u32b(0));
        epb.extend_from_slice(&u32b((t >> 32) as u32));
        epb.extend_from_slice(&u32b(t as u32));
        epb.extend_from_slice(&u32b(data.len() as u32));
        epb.extend_from_slice(&u32b(data.len() as u32));
        epb.extend_from_slice(data);
        block(6, &epb);
    }
    out
}

/// An Ethernet frame re-encapsulated as Linux cooked capture v1.
pub fn to_sll(eth: &[u8]) -> Vec<u8> {
    let mut f = vec![0, 4, 0, 1, 0, 6];
    f.extend_from_slice(&eth[6..12]);
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&eth[12..]);
    f
}

/// An Ethernet frame re-encapsulated as Linux cooked capture v2.
pub fn to_sll2(eth: &[u8]) -> Vec<u8> {
    let mut f = eth[12..14].to_vec();
    f.extend_from_slice(&[0, 0, 0, 0, 0, 3, 0, 1, 4, 6]);
    f.extend_from_slice(&eth[6..12]);
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&eth[14..]);
    f
}

/// Parses a tshark number: `0x…` hex or decimal.
pub fn num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap_or_else(|e| panic!("{s}: {e}")),
        None => s.parse().unwrap_or_else(|e| panic!("{s:?}: {e}")),
    }
}
