//! softrdma-interop-peer: the host side of the rxe interop harness
//! (interop/rxe/run.sh), written against softrdma's Rust API only.
//!
//! It speaks perftest's out-of-band TCP exchange (perftest 4.5, protocol
//! version "6.06": version string, cycle buffer and cache line sizes, MTU,
//! then fixed 108-byte `lid:out_reads:qpn:psn:rkey:vaddr:gid:srqn` records)
//! and runs the data phase of ib_write_lat, ib_send_lat, ib_read_lat,
//! ib_atomic_lat, ib_write_bw and ib_read_bw the way perftest does, so an
//! unmodified perftest on Linux rxe (or any RoCE NIC) can be its peer, as
//! server or as client. That proves wire interoperability independently of
//! the libibverbs drop-in library.
//!
//! ```text
//! softrdma-interop-peer perftest TEST (--server | --client HOST) [-p PORT]
//!     [-s SIZE] [-n ITERS] [-A FETCH_AND_ADD|CMP_AND_SWAP] [-d DEVICE]
//! ```
//! The device comes from SOFTRDMA_DEVICES (default srx0); SOFTRDMA_CAPTURE
//! and SOFTRDMA_FAULT apply. The last line printed is
//! `RESULT key=value ...`; the exit status is 0 only when the test ran and
//! every data check passed.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use softrdma::{
    AccessFlags, AhAttr, AttrMask, ConnectOptions, Context, Cq, Gid, Mr, Mtu, Qp, QpAttr, QpState,
    QpType, Qpn, RecvWr, Rkey, SendFlags, SendOp, SendWr, WorkCompletion,
};
use softrdma_wire::Psn;

/// The perftest version we announce (perftest 4.5-0.x sends "6.06").
const VERSION: &str = "6.06";
/// perftest's default cycle buffer (a page) and cache line sizes.
const CYCLE_BUFFER: u32 = 4096;
const CACHE_LINE: u32 = 64;
/// Outstanding READ/atomic operations we accept as responder.
const OUT_READS: u32 = 16;
/// Send queue depth of the bandwidth tests (perftest's default tx depth).
const TX_DEPTH: usize = 128;
/// How long any single wait may take before the test fails.
const WAIT: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Test {
    WriteLat,
    SendLat,
    ReadLat,
    AtomicLat,
    WriteBw,
    ReadBw,
}

impl Test {
    fn parse(s: &str) -> Option<Test> {
        Some(match s.trim_start_matches("ib_") {
            "write_lat" => Test::WriteLat,
            "send_lat" => Test::SendLat,
            "read_lat" => Test::ReadLat,
            "atomic_lat" => Test::AtomicLat,
            "write_bw" => Test::WriteBw,
            "read_bw" => Test::ReadBw,
            _ => return None,
        })
    }
    fn name(self) -> &'static str {
        match self {
            Test::WriteLat => "ib_write_lat",
            Test::SendLat => "ib_send_lat",
            Test::ReadLat => "ib_read_lat",
            Test::AtomicLat => "ib_atomic_lat",
            Test::WriteBw => "ib_write_bw",
            Test::ReadBw => "ib_read_bw",
        }
    }
    /// Access the remote needs to our buffer (as perftest registers it).
    fn access(self) -> AccessFlags {
        AccessFlags::LOCAL_WRITE
            | match self {
                Test::WriteLat | Test::WriteBw => AccessFlags::REMOTE_WRITE,
                Test::ReadLat | Test::ReadBw => AccessFlags::REMOTE_READ,
                Test::AtomicLat => AccessFlags::REMOTE_ATOMIC,
                Test::SendLat => AccessFlags::empty(),
            }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Atomic {
    FetchAdd,
    CmpSwap,
}

#[derive(Debug, Clone)]
struct Opts {
    test: Test,
    client: Option<String>,
    port: u16,
    size: u32,
    iters: u64,
    atomic: Atomic,
    device: String,
    /// Local ACK timeout exponent (perftest's `-u`): 4.096 µs × 2^n per try.
    qp_timeout: u8,
}

fn usage() -> String {
    "usage: softrdma-interop-peer perftest TEST (--server | --client HOST) [-p PORT] [-s SIZE] \
     [-n ITERS] [-A FETCH_AND_ADD|CMP_AND_SWAP] [-d DEVICE] [-u QP_TIMEOUT]\n\
     TEST: write_lat send_lat read_lat atomic_lat write_bw read_bw (ib_ prefix optional)"
        .into()
}

fn parse_args(args: &[String]) -> Result<Opts, String> {
    let mut it = args.iter();
    if it.next().map(String::as_str) != Some("perftest") {
        return Err(usage());
    }
    let test = it.next().and_then(|t| Test::parse(t)).ok_or_else(usage)?;
    let mut o = Opts {
        test,
        client: None,
        port: 18515,
        size: if test == Test::AtomicLat { 8 } else { 2 },
        iters: 1000,
        atomic: Atomic::FetchAdd,
        device: "srx0".into(),
        qp_timeout: ConnectOptions::default().timeout,
    };
    let mut server = false;
    while let Some(a) = it.next() {
        let mut val = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value\n{}", usage()))
        };
        match a.as_str() {
            "--server" => server = true,
            "--client" => o.client = Some(val("--client")?),
            "-p" | "--port" => o.port = val("-p")?.parse().map_err(|e| format!("-p: {e}"))?,
            "-s" | "--size" => o.size = val("-s")?.parse().map_err(|e| format!("-s: {e}"))?,
            "-n" | "--iters" => o.iters = val("-n")?.parse().map_err(|e| format!("-n: {e}"))?,
            "-d" | "--device" => o.device = val("-d")?,
            "-u" | "--qp-timeout" => {
                o.qp_timeout = match val("-u")?.parse() {
                    Ok(t @ 1..=31) => t,
                    _ => return Err("-u: the ACK timeout exponent is 1..31".into()),
                }
            }
            "-A" | "--atomic_type" => {
                o.atomic = match val("-A")?.as_str() {
                    "FETCH_AND_ADD" => Atomic::FetchAdd,
                    "CMP_AND_SWAP" => Atomic::CmpSwap,
                    x => return Err(format!("-A {x}: FETCH_AND_ADD or CMP_AND_SWAP")),
                }
            }
            x => return Err(format!("unknown argument {x}\n{}", usage())),
        }
    }
    if server == o.client.is_some() {
        return Err(format!(
            "give exactly one of --server, --client HOST\n{}",
            usage()
        ));
    }
    if o.test == Test::AtomicLat {
        o.size = 8;
    }
    if o.size == 0 || o.iters == 0 {
        return Err("size and iterations must be positive".into());
    }
    Ok(o)
}

type Res<T> = Result<T, String>;

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// One side of perftest's socket exchange. The client writes first and
/// then reads, the server the other way round, for every exchanged item.
struct Exchange {
    sock: TcpStream,
    client: bool,
}

impl Exchange {
    fn xchg(&mut self, mine: &[u8], what: &str) -> Res<Vec<u8>> {
        let mut theirs = vec![0u8; mine.len()];
        if self.client {
            // perftest reads each item with one read() of exactly its size:
            // always send an item in one write.
            self.sock.write_all(mine).map_err(err(what))?;
            self.sock.read_exact(&mut theirs).map_err(err(what))?;
        } else {
            self.sock.read_exact(&mut theirs).map_err(err(what))?;
            self.sock.write_all(mine).map_err(err(what))?;
        }
        Ok(theirs)
    }
}

/// perftest's `struct pingpong_dest` as exchanged.
#[derive(Debug, Clone, Copy, Default)]
struct Dest {
    lid: u32,
    out_reads: u32,
    qpn: Qpn,
    psn: u32,
    rkey: Rkey,
    vaddr: u64,
    gid: [u8; 16],
    srqn: u32,
}

/// KEY_MSG_SIZE_GID: the record with a GID, NUL included.
const KEY_MSG_SIZE_GID: usize = 108;

impl Dest {
    fn to_msg(self) -> [u8; KEY_MSG_SIZE_GID] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn.raw(),
            self.psn,
            self.rkey.raw(),
            self.vaddr
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut m = [0u8; KEY_MSG_SIZE_GID];
        let n = s.len().min(KEY_MSG_SIZE_GID - 1);
        m[..n].copy_from_slice(&s.as_bytes()[..n]);
        m
    }

    fn from_msg(m: &[u8]) -> Res<Dest> {
        let end = m.iter().position(|&b| b == 0).unwrap_or(m.len());
        let s = std::str::from_utf8(&m[..end]).map_err(err("perftest record"))?;
        let f: Vec<&str> = s.split(':').collect();
        if f.len() < 23 {
            return Err(format!(
                "perftest record {s:?} has {} fields, want 23",
                f.len()
            ));
        }
        let hex = |i: usize| {
            u64::from_str_radix(f[i], 16)
                .map_err(|e| format!("perftest record {s:?}: field {i} {:?}: {e}", f[i]))
        };
        let mut gid = [0u8; 16];
        for (k, g) in gid.iter_mut().enumerate() {
            *g = hex(6 + k)? as u8;
        }
        Ok(Dest {
            lid: hex(0)? as u32,
            out_reads: hex(1)? as u32,
            qpn: Qpn::from_raw(hex(2)? as u32),
            psn: hex(3)? as u32,
            rkey: Rkey::from_raw(hex(4)? as u32),
            vaddr: hex(5)?,
            gid,
            srqn: hex(22)? as u32,
        })
    }
}

struct Session {
    ex: Exchange,
    me: Dest,
    rem: Dest,
}

impl Session {
    fn hand_shake(&mut self) -> Res<()> {
        let theirs = self.ex.xchg(&self.me.to_msg(), "perftest handshake")?;
        self.rem = Dest::from_msg(&theirs)?;
        Ok(())
    }
    fn hand_shakes(&mut self, n: usize) -> Res<()> {
        for _ in 0..n {
            self.hand_shake()?;
        }
        Ok(())
    }
    /// ctx_close_connection: a last handshake, then "done" (NUL included).
    fn close(&mut self) -> Res<()> {
        self.hand_shake()?;
        let _ = self.ex.sock.write_all(b"done\0");
        Ok(())
    }
    /// xchg_bw_reports: size, iters, peak, average, message rate.
    fn xchg_bw_reports(&mut self, bw: &BwReport) -> Res<BwReport> {
        let size = self.ex.xchg(&bw.size.to_be_bytes(), "bw report")?;
        let iters = self.ex.xchg(&bw.iters.to_be_bytes(), "bw report")?;
        let peak = self
            .ex
            .xchg(&bw.peak.to_bits().to_be_bytes(), "bw report")?;
        let avg = self.ex.xchg(&bw.avg.to_bits().to_be_bytes(), "bw report")?;
        let rate = self
            .ex
            .xchg(&bw.msg_rate.to_bits().to_be_bytes(), "bw report")?;
        let u = |v: Vec<u8>| u64::from_be_bytes(v.try_into().unwrap_or([0; 8]));
        Ok(BwReport {
            size: u(size),
            iters: u(iters),
            peak: f64::from_bits(u(peak)),
            avg: f64::from_bits(u(avg)),
            msg_rate: f64::from_bits(u(rate)),
        })
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct BwReport {
    size: u64,
    iters: u64,
    peak: f64,
    avg: f64,
    msg_rate: f64,
}

/// Buffers: the part peers may access (advertised) and a local part.
struct Bufs {
    mr: Mr,
    /// Offset of the advertised (remote-accessible) area.
    remote_off: u64,
    /// Length of each area.
    area: u64,
}

impl Bufs {
    fn local(&self, off: u64, len: u32) -> softrdma::Sge {
        self.mr.sge(off, len)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match parse_args(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softrdma-interop-peer: FAILED: {e}");
            println!("RESULT status=fail error={:?}", e);
            ExitCode::from(1)
        }
    }
}

fn run(o: Opts) -> Res<()> {
    let ctx = Context::open(&o.device).map_err(err("open device"))?;
    let res = body(&o, &ctx);
    let c = ctx.counters();
    let d = ctx.driver_counters();
    let mut line = String::from("COUNTERS");
    for (k, v) in c.fields() {
        line.push_str(&format!(" {k}={v}"));
    }
    line.push_str(&format!(
        " faults_injected={} direct_ops={} send_errors={}",
        d.faults_injected, d.direct_ops, d.send_errors
    ));
    println!("{line}");
    res
}

fn body(o: &Opts, ctx: &Context) -> Res<()> {
    let o = o.clone();
    let role = if o.client.is_some() {
        "client"
    } else {
        "server"
    };
    println!(
        "softrdma-interop-peer: {} {} on {} ({}), size {} iters {}",
        o.test.name(),
        role,
        ctx.name(),
        ctx.addr(),
        o.size,
        o.iters
    );

    // The socket connection first, as perftest does.
    let sock = match &o.client {
        Some(host) => {
            let start = Instant::now();
            loop {
                match TcpStream::connect((host.as_str(), o.port)) {
                    Ok(s) => break s,
                    Err(e) if start.elapsed() < WAIT => {
                        let _ = e;
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(e) => return Err(format!("connect {host}:{}: {e}", o.port)),
                }
            }
        }
        None => {
            let l = TcpListener::bind(("0.0.0.0", o.port)).map_err(err("listen"))?;
            println!(
                "softrdma-interop-peer: waiting for client on port {}",
                o.port
            );
            l.accept().map_err(err("accept"))?.0
        }
    };
    sock.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(err("socket"))?;
    let _ = sock.set_nodelay(true);
    let mut ex = Exchange {
        sock,
        client: o.client.is_some(),
    };

    // exchange_versions, check_sys_data, check_mtu.
    let mut v = [0u8; 16];
    v[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
    let rv = ex.xchg(&v, "version exchange")?;
    let rem_version =
        String::from_utf8_lossy(&rv[..rv.iter().position(|&b| b == 0).unwrap_or(16)]).to_string();
    let rem_vf: f64 = rem_version.parse().unwrap_or(0.0);
    if rem_vf < 5.70 {
        return Err(format!(
            "peer perftest version {rem_version:?} is older than 5.70"
        ));
    }
    let rcb = ex.xchg(&CYCLE_BUFFER.to_be_bytes(), "cycle buffer exchange")?;
    let rcl = ex.xchg(&CACHE_LINE.to_be_bytes(), "cache line exchange")?;
    let cycle_buffer = CYCLE_BUFFER.max(u32::from_be_bytes(rcb.try_into().unwrap()));
    let _cache_line = CACHE_LINE.max(u32::from_be_bytes(rcl.try_into().unwrap()));
    let my_mtu = ctx.query_port().active_mtu;
    let mine = format!("{}\0", my_mtu.to_ibv());
    let rm = ex.xchg(&mine.as_bytes()[..2], "MTU exchange")?;
    let rem_mtu_v: u32 = String::from_utf8_lossy(&rm)
        .trim_end_matches('\0')
        .parse()
        .unwrap_or(0);
    let mtu = match Mtu::from_ibv(rem_mtu_v) {
        Some(r) if r.bytes() < my_mtu.bytes() => r,
        _ => my_mtu,
    };
    println!(
        "softrdma-interop-peer: peer perftest {rem_version}, path MTU {} (ours {}, theirs {})",
        mtu.bytes(),
        my_mtu.bytes(),
        rem_mtu_v
    );

    // Resources: one RC QP, one CQ, one region with a local and an
    // advertised area, each at least a cycle buffer.
    let pd = ctx.alloc_pd().map_err(err("alloc_pd"))?;
    let cq = ctx.create_cq(1024).map_err(err("create_cq"))?;
    let area = u64::from(o.size.max(cycle_buffer)).next_multiple_of(4096) * 2;
    let len = (area * 2) as usize;
    let mr = pd.alloc_mr(len, o.test.access()).map_err(err("alloc_mr"))?;
    let bufs = Bufs {
        mr,
        remote_off: area,
        area,
    };
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq)
        .max_send_wr(TX_DEPTH as u32 * 2)
        .max_recv_wr(1024)
        .max_send_sge(1)
        .max_recv_sge(1)
        .build()
        .map_err(err("create_qp"))?;
    let ep = qp.endpoint();
    let me = Dest {
        lid: 0,
        out_reads: OUT_READS,
        qpn: qp.qpn(),
        psn: ep.psn,
        rkey: bufs.mr.rkey(),
        vaddr: bufs.mr.addr() + bufs.remote_off,
        gid: ctx.gid().0,
        srqn: 0,
    };
    let mut s = Session {
        ex,
        me,
        rem: Dest::default(),
    };
    let server = o.client.is_none();

    // Handshakes before the QP is connected (the first one tells us the peer).
    let pre = match o.test {
        Test::SendLat | Test::WriteBw | Test::ReadBw => 1,
        _ => 2,
    };
    s.hand_shakes(pre)?;
    let rem = s.rem;
    if rem.gid[..12] != [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
        return Err(format!(
            "peer GID {} is not an IPv4-mapped RoCE v2 GID",
            std::net::Ipv6Addr::from(rem.gid)
        ));
    }
    println!(
        "softrdma-interop-peer: local  QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x} GID {}",
        s.me.qpn,
        s.me.psn,
        s.me.rkey,
        s.me.vaddr,
        std::net::Ipv6Addr::from(s.me.gid)
    );
    println!(
        "softrdma-interop-peer: remote QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x} GID {} out_reads {}",
        rem.qpn,
        rem.psn,
        rem.rkey,
        rem.vaddr,
        std::net::Ipv6Addr::from(rem.gid),
        rem.out_reads
    );
    connect(&qp, &rem, mtu, ep.psn, o.qp_timeout)?;

    let res = match o.test {
        Test::WriteLat => {
            s.hand_shakes(2)?;
            let lat = write_lat(&qp, &cq, &bufs, &s.rem, &o, server)?;
            report_lat(
                &o,
                role,
                mtu,
                &lat,
                "last byte of every WRITE seen in order",
            );
            Ok(())
        }
        Test::SendLat => {
            s.hand_shakes(2)?;
            // Post receives before the sync handshake (as perftest does),
            // so the peer's first SEND finds one.
            let rx = o.iters.min(512);
            for i in 0..rx {
                post_recv(&qp, &bufs, i, o.size)?;
            }
            s.hand_shakes(1)?;
            let lat = send_lat(&qp, &cq, &bufs, &o, server, rx)?;
            s.close()?;
            report_lat(
                &o,
                role,
                mtu,
                &lat,
                "every receive completed with byte_len = size",
            );
            Ok(())
        }
        Test::ReadLat | Test::AtomicLat => {
            s.hand_shakes(2)?;
            if server {
                if o.test == Test::AtomicLat {
                    bufs.mr
                        .write(bufs.remote_off as usize, &0u64.to_ne_bytes())
                        .map_err(err("init"))?;
                } else {
                    fill_pattern(&bufs)?;
                }
                // The client runs its loop against our memory; we wait in
                // the closing handshake, as perftest's server does.
                s.close()?;
                let check = if o.test == Test::AtomicLat {
                    let v = bufs
                        .mr
                        .read_u64(bufs.remote_off as usize)
                        .map_err(err("read"))?;
                    // FETCH_AND_ADD adds 1 per iteration. perftest's
                    // CMP_AND_SWAP compares with 0 and swaps in 0, so the
                    // target stays 0; this peer's own client chains swaps
                    // (0→1→…→iters).
                    let ok = match o.atomic {
                        Atomic::FetchAdd => v == o.iters,
                        Atomic::CmpSwap => v == 0 || v == o.iters,
                    };
                    if !ok {
                        return Err(format!(
                            "after {} {:?} the target (initially 0) holds {v}",
                            o.iters, o.atomic
                        ));
                    }
                    format!("target value {v} after {} {:?} from 0", o.iters, o.atomic)
                } else {
                    "passive server".into()
                };
                println!(
                    "RESULT status=ok test={} role=server size={} iters={} mtu={} check={:?}",
                    o.test.name(),
                    o.size,
                    o.iters,
                    mtu.bytes(),
                    check
                );
                Ok(())
            } else {
                let (lat, check) = if o.test == Test::ReadLat {
                    read_lat(&qp, &cq, &bufs, &s.rem, &o)?
                } else {
                    atomic_lat(&qp, &cq, &bufs, &s.rem, &o)?
                };
                s.close()?;
                report_lat(&o, role, mtu, &lat, &check);
                Ok(())
            }
        }
        Test::WriteBw | Test::ReadBw => {
            s.hand_shakes(2)?;
            if server {
                if o.test == Test::ReadBw {
                    fill_pattern(&bufs)?;
                }
                s.hand_shake()?;
                let theirs = s.xchg_bw_reports(&BwReport::default())?;
                s.close()?;
                let written = if o.test == Test::WriteBw {
                    let mut b = vec![0u8; o.size as usize];
                    bufs.mr
                        .read(bufs.remote_off as usize, &mut b)
                        .map_err(err("read"))?;
                    if b.iter().all(|&x| x == 0) {
                        return Err("the client's WRITEs left our buffer all zero".into());
                    }
                    "buffer written"
                } else {
                    "passive server"
                };
                println!(
                    "RESULT status=ok test={} role=server size={} iters={} mtu={} peer_bw_avg_MBps={:.2} check={:?}",
                    o.test.name(),
                    theirs.size,
                    theirs.iters,
                    mtu.bytes(),
                    theirs.avg,
                    written
                );
                Ok(())
            } else {
                let (bw, check) = bw(&qp, &cq, &bufs, &s.rem, &o)?;
                s.hand_shake()?;
                let _ = s.xchg_bw_reports(&bw)?;
                s.close()?;
                println!(
                    "RESULT status=ok test={} role=client size={} iters={} mtu={} bw_avg_MBps={:.2} bw_peak_MBps={:.2} msg_rate_Mpps={:.4} check={:?}",
                    o.test.name(),
                    o.size,
                    o.iters,
                    mtu.bytes(),
                    bw.avg,
                    bw.peak,
                    bw.msg_rate,
                    check
                );
                Ok(())
            }
        }
    };
    drop(s);
    res
}

/// RESET→INIT→RTR→RTS the way perftest's ctx_connect does: our responder
/// resources (max_dest_rd_atomic) are what we advertised, our initiator
/// depth (max_rd_atomic) is what the peer advertised.
/// The retry counts are the most the 3-bit fields hold (7; an RNR retry of 7
/// is unbounded), so a starved TCG guest costs time, not the connection;
/// `timeout` is the ACK timeout exponent of `-u`.
fn connect(qp: &Qp, rem: &Dest, mtu: Mtu, psn: u32, timeout: u8) -> Res<()> {
    let d = ConnectOptions::default();
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        pkey_index: 0,
        qp_access_flags: d.access,
        ..Default::default()
    };
    qp.modify(
        &a,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .map_err(err("modify QP to INIT"))?;
    a.qp_state = QpState::Rtr;
    a.path_mtu = mtu;
    a.dest_qp_num = rem.qpn;
    a.rq_psn = Psn::new(rem.psn);
    a.ah_attr = AhAttr {
        dgid: Gid(rem.gid),
        is_global: true,
        port_num: 1,
        hop_limit: 64,
        ..Default::default()
    };
    a.max_dest_rd_atomic = OUT_READS as u8;
    a.min_rnr_timer = d.min_rnr_timer;
    qp.modify(
        &a,
        AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER,
    )
    .map_err(err("modify QP to RTR"))?;
    a.qp_state = QpState::Rts;
    a.sq_psn = Psn::new(psn);
    a.timeout = timeout;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = rem.out_reads.clamp(1, OUT_READS) as u8;
    qp.modify(
        &a,
        AttrMask::STATE
            | AttrMask::SQ_PSN
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC,
    )
    .map_err(err("modify QP to RTS"))
}

fn fill_pattern(b: &Bufs) -> Res<()> {
    let v: Vec<u8> = (0..b.area).map(|i| (i * 131 + 7) as u8).collect();
    b.mr.write(b.remote_off as usize, &v).map_err(err("fill"))
}

fn post_recv(qp: &Qp, b: &Bufs, id: u64, size: u32) -> Res<()> {
    qp.post_recv(&RecvWr {
        wr_id: id,
        sg_list: vec![b.mr.sge(b.remote_off, size)],
    })
    .map_err(err("post_recv"))
}

fn wait_one(cq: &Cq) -> Res<WorkCompletion> {
    let wc = cq
        .wait(1, WAIT)
        .map_err(err("wait for completion"))?
        .remove(0);
    if !wc.status.is_ok() {
        return Err(format!(
            "work request {} completed with {:?} (vendor_err {})",
            wc.wr_id, wc.status, wc.vendor_err
        ));
    }
    Ok(wc)
}

/// perftest-style latency samples: one-way time = round trip / 2 for the
/// ping-pong tests, the full completion time for READ/atomic.
struct Lat {
    samples_us: Vec<f64>,
}

fn report_lat(o: &Opts, role: &str, mtu: Mtu, l: &Lat, check: &str) {
    let mut v = l.samples_us.clone();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let n = v.len().max(1);
    let pick = |q: f64| {
        v.get(((n as f64 * q) as usize).min(n - 1))
            .copied()
            .unwrap_or(0.0)
    };
    let avg = v.iter().sum::<f64>() / n as f64;
    println!(
        "RESULT status=ok test={} role={role} size={} iters={} mtu={} t_min_us={:.2} t_typical_us={:.2} t_avg_us={:.2} t_p99_us={:.2} t_max_us={:.2} check={:?}",
        o.test.name(),
        o.size,
        o.iters,
        mtu.bytes(),
        pick(0.0),
        pick(0.5),
        avg,
        pick(0.99),
        v.last().copied().unwrap_or(0.0),
        check
    );
}

/// ib_write_lat: both sides WRITE `size` bytes into the other's buffer and
/// spin on its last byte, which carries the iteration count. The server
/// sends first.
fn write_lat(qp: &Qp, cq: &Cq, b: &Bufs, rem: &Dest, o: &Opts, server: bool) -> Res<Lat> {
    let size = o.size as u64;
    let post_off = size - 1;
    let poll_ptr = unsafe_ptr(b, b.remote_off + size - 1);
    let (mut scnt, mut ccnt, mut rcnt) = (0u64, 0u64, 0u64);
    let mut posted = Vec::with_capacity(o.iters as usize);
    while scnt < o.iters || ccnt < o.iters || rcnt < o.iters {
        if rcnt < o.iters && !(scnt < 1 && server) {
            rcnt += 1;
            let want = rcnt as u8;
            let start = Instant::now();
            let mut spins = 0u32;
            // SAFETY: poll_ptr points into our registered region (alive for
            // this function); the peer writes it through the device, so we
            // read it with a volatile load, as perftest does.
            while unsafe { std::ptr::read_volatile(poll_ptr) } != want {
                spins += 1;
                if spins.is_multiple_of(1024) {
                    if start.elapsed() > WAIT {
                        return Err(format!(
                            "iteration {rcnt}: the peer's WRITE never set the last byte to {want}"
                        ));
                    }
                    std::thread::yield_now();
                }
                std::hint::spin_loop();
            }
        }
        if scnt < o.iters {
            scnt += 1;
            b.mr.write(post_off as usize, &[scnt as u8])
                .map_err(err("write"))?;
            posted.push(Instant::now());
            qp.post_send(&SendWr::new(
                scnt,
                SendOp::Write {
                    remote_addr: rem.vaddr,
                    rkey: rem.rkey,
                },
                vec![b.local(0, o.size)],
            ))
            .map_err(err("post WRITE"))?;
        }
        if ccnt < o.iters {
            wait_one(cq)?;
            ccnt += 1;
        }
    }
    // perftest reports half the time between consecutive posts.
    let samples_us = posted
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e6 / 2.0)
        .collect();
    Ok(Lat { samples_us })
}

fn unsafe_ptr(b: &Bufs, off: u64) -> *const u8 {
    assert!(off < b.mr.len() as u64);
    // SAFETY: in bounds of the region (checked above).
    unsafe { b.mr.as_ptr().add(off as usize) }
}

/// ib_send_lat: SEND ping-pong; the client sends first.
fn send_lat(qp: &Qp, cq: &Cq, b: &Bufs, o: &Opts, server: bool, rx: u64) -> Res<Lat> {
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut posted = Vec::with_capacity(o.iters as usize);
    let mut pending: Vec<WorkCompletion> = Vec::new();
    // Receive and send completions share the CQ: take the next one of a kind.
    let next = |recv: bool, pending: &mut Vec<WorkCompletion>| -> Res<WorkCompletion> {
        loop {
            if let Some(i) = pending
                .iter()
                .position(|w| matches!(w.opcode, softrdma::WcOpcode::Recv) == recv)
            {
                return Ok(pending.remove(i));
            }
            pending.push(wait_one(cq)?);
        }
    };
    while scnt < o.iters || rcnt < o.iters {
        // The client sends first: it receives only after its first send.
        if rcnt < o.iters && (server || scnt >= 1) {
            let wc = next(true, &mut pending)?;
            if wc.byte_len != o.size {
                return Err(format!(
                    "receive {rcnt}: byte_len {} but the peer sends {}",
                    wc.byte_len, o.size
                ));
            }
            rcnt += 1;
            if rcnt + rx <= o.iters {
                post_recv(qp, b, rcnt + rx, o.size)?;
            }
        }
        if scnt < o.iters {
            scnt += 1;
            posted.push(Instant::now());
            qp.post_send(&SendWr::new(scnt, SendOp::Send, vec![b.local(0, o.size)]))
                .map_err(err("post SEND"))?;
            next(false, &mut pending)?;
        }
    }
    let samples_us = posted
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e6 / 2.0)
        .collect();
    Ok(Lat { samples_us })
}

/// ib_read_lat client: READ `size` bytes of the server's buffer, one at a
/// time. The server's buffer does not change, so every READ must bring the
/// same bytes.
fn read_lat(qp: &Qp, cq: &Cq, b: &Bufs, rem: &Dest, o: &Opts) -> Res<(Lat, String)> {
    let mut samples_us = Vec::with_capacity(o.iters as usize);
    let mut first: Option<Vec<u8>> = None;
    let mut got = vec![0u8; o.size as usize];
    for i in 0..o.iters {
        let t = Instant::now();
        qp.post_send(&SendWr::new(
            i,
            SendOp::Read {
                remote_addr: rem.vaddr,
                rkey: rem.rkey,
            },
            vec![b.local(0, o.size)],
        ))
        .map_err(err("post READ"))?;
        wait_one(cq)?;
        samples_us.push(t.elapsed().as_secs_f64() * 1e6);
        b.mr.read(0, &mut got).map_err(err("read"))?;
        match &first {
            None => first = Some(got.clone()),
            Some(f) if *f != got => {
                return Err(format!("READ {i} brought different bytes than READ 0"))
            }
            _ => {}
        }
        b.mr.write(0, &vec![0u8; o.size as usize])
            .map_err(err("clear"))?;
    }
    Ok((
        Lat { samples_us },
        format!("all {} READs returned the same {} bytes", o.iters, o.size),
    ))
}

/// ib_atomic_lat client. FETCH_AND_ADD adds 1 (as perftest) and each
/// returned value must be the previous one + 1; CMP_AND_SWAP chains
/// compare = last value, swap = last + 1, so from the second one on every
/// swap must succeed.
fn atomic_lat(qp: &Qp, cq: &Cq, b: &Bufs, rem: &Dest, o: &Opts) -> Res<(Lat, String)> {
    let mut samples_us = Vec::with_capacity(o.iters as usize);
    let mut prev: Option<u64> = None;
    let mut expect = 0u64;
    for i in 0..o.iters {
        let op = match o.atomic {
            Atomic::FetchAdd => SendOp::FetchAdd {
                remote_addr: rem.vaddr,
                rkey: rem.rkey,
                add: 1,
            },
            Atomic::CmpSwap => SendOp::CompareSwap {
                remote_addr: rem.vaddr,
                rkey: rem.rkey,
                compare: expect,
                swap: expect.wrapping_add(1),
            },
        };
        let t = Instant::now();
        qp.post_send(&SendWr::new(i, op, vec![b.local(0, 8)]))
            .map_err(err("post atomic"))?;
        wait_one(cq)?;
        samples_us.push(t.elapsed().as_secs_f64() * 1e6);
        let v = b.mr.read_u64(0).map_err(err("read"))?;
        match o.atomic {
            Atomic::FetchAdd => {
                if let Some(p) = prev {
                    if v != p.wrapping_add(1) {
                        return Err(format!(
                            "FETCH_ADD {i} returned {v}, want {}",
                            p.wrapping_add(1)
                        ));
                    }
                }
                prev = Some(v);
            }
            Atomic::CmpSwap => {
                if v == expect {
                    expect = expect.wrapping_add(1);
                } else if i == 0 {
                    // The target held an unknown (random) value: start from it.
                    expect = v;
                } else {
                    return Err(format!(
                        "CMP_SWAP {i} found {v} where the previous swap left {expect}"
                    ));
                }
            }
        }
    }
    Ok((
        Lat { samples_us },
        format!("{} {:?} results consecutive", o.iters, o.atomic),
    ))
}

/// ib_write_bw / ib_read_bw client: keep TX_DEPTH operations of `size`
/// bytes in flight to the peer's buffer.
fn bw(qp: &Qp, cq: &Cq, b: &Bufs, rem: &Dest, o: &Opts) -> Res<(BwReport, String)> {
    let read = o.test == Test::ReadBw;
    let slots = (b.area / u64::from(o.size)).clamp(1, TX_DEPTH as u64);
    let depth = if read { TX_DEPTH.min(64) } else { TX_DEPTH } as u64;
    if !read {
        let v: Vec<u8> = (0..b.area).map(|i| (i * 37 + 1) as u8).collect();
        b.mr.write(0, &v).map_err(err("fill"))?;
    }
    let (mut posted, mut done) = (0u64, 0u64);
    let mut reference: Option<Vec<u8>> = None;
    let mut got = vec![0u8; o.size as usize];
    let mut checked = 0u64;
    let start = Instant::now();
    let mut last = start;
    let mut peak = 0f64;
    let mut out = Vec::with_capacity(64);
    while done < o.iters {
        while posted < o.iters && posted - done < depth {
            let slot = posted % slots;
            let op = if read {
                SendOp::Read {
                    remote_addr: rem.vaddr,
                    rkey: rem.rkey,
                }
            } else {
                SendOp::Write {
                    remote_addr: rem.vaddr,
                    rkey: rem.rkey,
                }
            };
            let mut wr = SendWr::new(posted, op, vec![b.local(slot * u64::from(o.size), o.size)]);
            wr.flags = SendFlags::SIGNALED;
            qp.post_send(&wr).map_err(err("post"))?;
            posted += 1;
        }
        out.clear();
        cq.poll(&mut out, 64).map_err(err("poll_cq"))?;
        if out.is_empty() {
            if last.elapsed() > WAIT {
                return Err(format!("{done} of {} completions after {WAIT:?}", o.iters));
            }
            std::hint::spin_loop();
            continue;
        }
        for wc in &out {
            if !wc.status.is_ok() {
                return Err(format!(
                    "work request {} completed with {:?} (vendor_err {})",
                    wc.wr_id, wc.status, wc.vendor_err
                ));
            }
            if read && (wc.wr_id % 16 == 0 || wc.wr_id + 1 == o.iters) {
                let slot = wc.wr_id % slots;
                b.mr.read((slot * u64::from(o.size)) as usize, &mut got)
                    .map_err(err("read"))?;
                match &reference {
                    None => reference = Some(got.clone()),
                    Some(r) if *r != got => {
                        return Err(format!(
                            "READ {} brought different bytes than the first",
                            wc.wr_id
                        ))
                    }
                    _ => {}
                }
                checked += 1;
            }
        }
        let now = Instant::now();
        let dt = (now - last).as_secs_f64();
        if dt > 0.0 {
            peak = peak.max(out.len() as f64 * f64::from(o.size) / dt / 1048576.0);
        }
        last = now;
        done += out.len() as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    let avg = (o.iters * u64::from(o.size)) as f64 / secs / 1048576.0;
    let report = BwReport {
        size: u64::from(o.size),
        iters: o.iters,
        peak: peak.max(avg),
        avg,
        msg_rate: o.iters as f64 / secs / 1e6,
    };
    let check = if read {
        format!("{checked} sampled READs returned the same {} bytes", o.size)
    } else {
        format!("{} WRITEs completed", o.iters)
    };
    Ok((report, check))
}
