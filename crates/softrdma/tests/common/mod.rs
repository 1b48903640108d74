//! Shared harness of the softrdma integration tests.
//!
//! * Peer processes: a test binary re-executes itself
//!   (`<exe> peer --exact --nocapture`) with `SOFTRDMA_TEST_ROLE` set; the
//!   `peer` test of each binary returns at once when that variable is absent.
//!   [`Peer`] kills its child on drop and prints the child's log when the
//!   test fails.
//! * A control channel ([`Ctl`], one text line per message over the TCP
//!   stream `softrdma::cm` connected) in strict request/response order.
//! * [`Side`]: a device with a PD, CQs, one MR and one RC, UC and UD QP,
//!   connected to the peer's through `softrdma::cm::exchange`.
//! * The operation matrix ([`Case`], [`run_requester`], [`run_responder`]):
//!   the requester drives, the responder prepares its memory and receive
//!   queue and verifies what arrived byte for byte.
//! * [`Netns`]: network namespaces joined by a veth pair, removed on drop.
//!
//! Every wait is bounded.

#![allow(dead_code)]

use std::fmt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use softrdma::cm::{self, ConnInfo};
use softrdma::*;
use std::result::Result;

/// Role of a re-executed test binary.
pub const ROLE_ENV: &str = "SOFTRDMA_TEST_ROLE";
/// How a peer reaches the control channel: `listen:ADDR` or `connect:ADDR`.
pub const CM_ENV: &str = "SOFTRDMA_TEST_CM";
/// Which operation plan a requester peer runs (`full`, `wire`, `small`,
/// `faults`).
pub const PLAN_ENV: &str = "SOFTRDMA_TEST_PLAN";
/// Active MTU (bytes) a peer must find on its port.
pub const EXPECT_MTU_ENV: &str = "SOFTRDMA_TEST_EXPECT_MTU";

/// Longest wait for one operation (16 MiB in a debug build on a busy machine).
pub const OP_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for one control message.
pub const CTL_TIMEOUT: Duration = Duration::from_secs(90);
/// Bytes after each message that must stay untouched.
pub const GUARD: usize = 64;
/// What untouched memory holds.
pub const FILL: u8 = 0xA5;
/// Largest message of the matrix.
pub const MAX_SIZE: usize = 16 << 20;

pub fn access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// The default loopback device forced onto RoCEv2/UDP (same-host peers
/// would otherwise use shared memory), without environment overrides.
pub fn udp_loopback() -> DeviceConfig {
    let mut c = DeviceConfig::default_loopback().transport(softrdma::shm::Transport::Udp);
    c.capture = None;
    c.fault = None;
    c
}

/// The role this process was started with, if it is a peer.
pub fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok().filter(|r| !r.is_empty())
}

/// True when running as root (namespaces, tcpdump).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The path of `prog` if it is on PATH (or in the sbin directories).
pub fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|d| Path::new(d).join(prog))
        .find(|p| p.is_file());
    found
}

/// Prints why a test does not run (shown with --nocapture and on CI logs).
/// Under `SOFTRDMA_STRICT_TESTS` (set by CI) nothing may be skipped: it panics.
pub fn skip(test: &str, why: &str) {
    assert!(
        std::env::var_os("SOFTRDMA_STRICT_TESTS").is_none(),
        "{test} cannot run ({why}), and SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping"
    );
    eprintln!("SKIPPED {test}: {why}");
    println!("SKIPPED {test}: {why}");
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let p =
            std::env::temp_dir().join(format!("softrdma-{tag}-{}-{nanos:x}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("SOFTRDMA_TEST_KEEP").is_some() {
            eprintln!("keeping {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Arguments that make this test binary run only its `test` function.
pub fn self_args(test: &str) -> Vec<String> {
    vec![
        test.into(),
        "--exact".into(),
        "--nocapture".into(),
        "--test-threads=1".into(),
    ]
}

/// This test binary, running only `test`, as `role` (over RoCEv2/UDP).
pub fn self_command(test: &str, role: &str) -> Command {
    self_command_over(test, role, "udp")
}

/// This test binary, running only `test`, as `role`, with its devices on
/// `transport` (`udp`, `shm` or `auto`).
pub fn self_command_over(test: &str, role: &str, transport: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(self_args(test)).env(ROLE_ENV, role);
    hermetic(&mut c);
    c.env("SOFTRDMA_TRANSPORT", transport);
    c
}

/// The default loopback device on the shared-memory transport.
pub fn shm_loopback() -> DeviceConfig {
    let mut c = DeviceConfig::default_loopback().transport(softrdma::shm::Transport::Shm);
    c.capture = None;
    c.fault = None;
    c
}

/// Removes the softrdma settings a developer's environment may hold, so a
/// peer sees only what its test sets.
pub fn hermetic(c: &mut Command) {
    for v in [
        "SOFTRDMA_DEVICES",
        "SOFTRDMA_FAULT",
        "SOFTRDMA_CAPTURE",
        PLAN_ENV,
        EXPECT_MTU_ENV,
    ] {
        c.env_remove(v);
    }
}

/// A child process: killed (SIGKILL) and reaped on drop; its output goes to
/// a log file printed when the test fails.
pub struct Peer {
    name: String,
    child: Option<Child>,
    status: Option<ExitStatus>,
    log: PathBuf,
}

impl Peer {
    pub fn spawn(name: &str, mut cmd: Command, dir: &TempDir) -> Peer {
        let log = dir.path(&format!("{name}.log"));
        let f = std::fs::File::create(&log).unwrap();
        cmd.stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Peer {
            name: name.into(),
            child: Some(child),
            status: None,
            log,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The exit status if the child has ended.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(s)) = c.try_wait() {
                    self.status = Some(s);
                }
            }
        }
        self.status
    }

    /// Waits up to `timeout` for the child to end; kills it and panics
    /// (with its log) if it does not.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.try_status() {
                return s;
            }
            if start.elapsed() > timeout {
                self.signal(libc::SIGKILL);
                let _ = self.child.as_mut().map(|c| c.wait());
                panic!(
                    "{} did not finish within {timeout:?}; its output:\n{}",
                    self.name,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for the child and panics (with its log) unless it succeeded.
    pub fn expect_success(&mut self, timeout: Duration) {
        let s = self.wait(timeout);
        assert!(
            s.success(),
            "{} failed ({s}); its output:\n{}",
            self.name,
            self.log()
        );
    }

    /// Sends a signal to the child (if it still runs).
    pub fn signal(&mut self, sig: i32) {
        if self.try_status().is_none() {
            // SAFETY: kill has no pointer arguments; the pid is our child's,
            // which is not reaped yet (try_status), so it cannot be reused.
            unsafe { libc::kill(self.pid(), sig) };
        }
    }

    fn check_alive_or_timeout(&mut self, timeout: Duration) {
        if self.try_status().is_none() {
            panic!(
                "{} did not finish within {timeout:?}; its output:\n{}",
                self.name,
                self.log()
            );
        }
    }

    /// Panics with the child's log when it has ended (a peer that died early).
    pub fn check_alive(&mut self) {
        if let Some(s) = self.try_status() {
            panic!(
                "{} exited early ({s}); its output:\n{}",
                self.name,
                self.log()
            );
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if self.try_status().is_none() {
            self.signal(libc::SIGKILL);
            if let Some(c) = self.child.as_mut() {
                let _ = c.wait();
            }
        }
        if std::thread::panicking() {
            eprintln!("---- output of {} ----\n{}", self.name, self.log());
        }
    }
}

/// Waits for every peer to succeed; fails as soon as one fails (the others
/// are then killed on drop) or `timeout` passes.
pub fn expect_all_success(peers: &mut [&mut Peer], timeout: Duration) {
    let start = Instant::now();
    loop {
        let mut running = 0;
        for p in peers.iter_mut() {
            match p.try_status() {
                Some(s) if !s.success() => {
                    panic!("{} failed ({s}); its output:\n{}", p.name, p.log())
                }
                Some(_) => {}
                None => running += 1,
            }
        }
        if running == 0 {
            return;
        }
        if start.elapsed() > timeout {
            for p in peers.iter_mut() {
                p.check_alive_or_timeout(timeout);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What a bounded command run produced.
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` to completion, killing it after `timeout` (then panics).
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> Output {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let base = std::env::temp_dir().join(format!("softrdma-cmd-{}-{n}", std::process::id()));
    let (out, err) = (base.with_extension("out"), base.with_extension("err"));
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let read = |p: &Path| {
        let t = String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
        let _ = std::fs::remove_file(p);
        t
    };
    Output {
        status,
        stdout: read(&out),
        stderr: read(&err),
    }
}

/// The control channel: one line per message, strictly alternating.
pub struct Ctl {
    pub stream: TcpStream,
}

impl Ctl {
    pub fn new(stream: TcpStream) -> Ctl {
        stream.set_read_timeout(Some(CTL_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Ctl { stream }
    }

    pub fn send(&mut self, msg: &str) {
        self.stream
            .write_all(format!("{msg}\n").as_bytes())
            .unwrap_or_else(|e| panic!("control channel: cannot send {msg:?}: {e}"));
    }

    pub fn recv(&mut self) -> String {
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        loop {
            match self.stream.read(&mut b) {
                Ok(0) => panic!(
                    "control channel closed by the peer (after {:?})",
                    String::from_utf8_lossy(&line)
                ),
                Ok(_) if b[0] == b'\n' => break,
                Ok(_) => line.push(b[0]),
                Err(e) => panic!("control channel: {e}"),
            }
        }
        String::from_utf8(line).unwrap()
    }

    /// Receives and checks a message.
    pub fn expect(&mut self, want: &str) {
        let got = self.recv();
        assert_eq!(got, want, "unexpected control message");
    }
}

/// Accepts one connection within `timeout`, failing early if `peer` dies.
pub fn accept_bounded(
    l: &TcpListener,
    timeout: Duration,
    mut peer: Option<&mut Peer>,
) -> TcpStream {
    l.set_nonblocking(true).unwrap();
    let start = Instant::now();
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                return s;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept: {e}"),
        }
        if let Some(p) = peer.as_deref_mut() {
            p.check_alive();
        }
        assert!(
            start.elapsed() < timeout,
            "no peer connected within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The control stream of a peer process, as `SOFTRDMA_TEST_CM` says.
pub fn peer_stream() -> TcpStream {
    let spec = std::env::var(CM_ENV).expect("SOFTRDMA_TEST_CM is not set");
    if let Some(a) = spec.strip_prefix("listen:") {
        let l = TcpListener::bind(a).unwrap_or_else(|e| panic!("listen on {a}: {e}"));
        accept_bounded(&l, Duration::from_secs(30), None)
    } else if let Some(a) = spec.strip_prefix("connect:") {
        let addr: SocketAddr = a.parse().unwrap();
        let start = Instant::now();
        loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(s) => return s,
                Err(e) if start.elapsed() > Duration::from_secs(30) => {
                    panic!("cannot connect to {addr}: {e}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    } else {
        panic!("bad {CM_ENV}={spec:?}")
    }
}

/// Checks the port's active MTU when the parent asked for it.
pub fn check_expected_mtu(ctx: &Context) {
    if let Ok(m) = std::env::var(EXPECT_MTU_ENV) {
        let want: u32 = m.parse().unwrap();
        let port = ctx.query_port();
        assert_eq!(
            port.active_mtu.bytes(),
            want,
            "active MTU of {} (link MTU {})",
            ctx.addr(),
            port.link_mtu
        );
    }
}

/// One end of the matrix: a device, its verbs objects, and a QP of each type.
pub struct Side {
    pub rc: Qp,
    pub uc: Qp,
    pub ud: Qp,
    pub scq: Cq,
    pub rcq: Cq,
    pub mr: Mr,
    pub pd: Pd,
    pub ctx: Context,
}

/// What the peer told us, connected.
pub struct Remote {
    pub rc: QpEndpoint,
    pub uc: QpEndpoint,
    pub ud: QpEndpoint,
    pub region: RemoteRegion,
    pub ah: Ah,
    /// Path MTU in bytes (the smaller of both ends).
    pub mtu: usize,
}

impl Side {
    pub fn open(ctx: Context, mr_len: usize) -> Side {
        let pd = ctx.alloc_pd().unwrap();
        let scq = ctx.create_cq(512).unwrap();
        let rcq = ctx.create_cq(512).unwrap();
        let mr = pd.alloc_mr(mr_len, access()).unwrap();
        let rc = pd.create_qp(QpType::Rc, &scq, &rcq).build().unwrap();
        let uc = pd.create_qp(QpType::Uc, &scq, &rcq).build().unwrap();
        let ud = pd.create_qp(QpType::Ud, &scq, &rcq).build().unwrap();
        Side {
            rc,
            uc,
            ud,
            scq,
            rcq,
            mr,
            pd,
            ctx,
        }
    }

    /// Exchanges QPs and region with the peer through `softrdma::cm` and
    /// brings all three QPs to RTS.
    pub fn connect(&self, stream: &mut TcpStream, o: &ConnectOptions) -> Remote {
        let ex = |s: &mut TcpStream, qp: &Qp, region: Option<RemoteRegion>| {
            cm::exchange(
                s,
                &ConnInfo {
                    endpoint: qp.endpoint(),
                    region,
                },
            )
            .unwrap()
        };
        let rc = ex(stream, &self.rc, Some(self.mr.remote()));
        let uc = ex(stream, &self.uc, None);
        let ud = ex(stream, &self.ud, None);
        self.rc.connect(&rc.endpoint, o).unwrap();
        self.uc.connect(&uc.endpoint, o).unwrap();
        self.ud.ready_ud().unwrap();
        let ah = self.pd.create_ah(ud.endpoint.gid).unwrap();
        let mtu = rc
            .endpoint
            .mtu
            .bytes()
            .min(self.ctx.query_port().active_mtu.bytes()) as usize;
        Remote {
            rc: rc.endpoint,
            uc: uc.endpoint,
            ud: ud.endpoint,
            region: rc.region.expect("the peer offered its region"),
            ah,
            mtu,
        }
    }

    pub fn qp(&self, k: Kind) -> &Qp {
        match k {
            Kind::Rc => &self.rc,
            Kind::Uc => &self.uc,
            Kind::Ud => &self.ud,
        }
    }
}

/// Deterministic test data: `len` bytes from `seed` (xorshift64).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// `None` when equal, else a description of the first difference.
pub fn diff(got: &[u8], want: &[u8]) -> Option<String> {
    if got == want {
        return None;
    }
    if got.len() != want.len() {
        return Some(format!("length {} instead of {}", got.len(), want.len()));
    }
    let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
    let bad = got.iter().zip(want).filter(|(a, b)| a != b).count();
    Some(format!(
        "{bad} of {} bytes differ, first at offset {i}: {:#04x} instead of {:#04x}",
        want.len(),
        got[i],
        want[i]
    ))
}

/// Reads `len` bytes of a region.
pub fn read_mr(mr: &Mr, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(offset, &mut v).unwrap();
    v
}

/// QP types of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Rc,
    Uc,
    Ud,
}

/// Operations of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    CmpSwap,
    FetchAdd,
}

/// One operation of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    pub id: u32,
    pub kind: Kind,
    pub op: Op,
    pub size: usize,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?} {:?} {}", self.id, self.kind, self.op, self.size)
    }
}

impl FromStr for Case {
    type Err = String;
    fn from_str(s: &str) -> Result<Case, String> {
        let v: Vec<&str> = s.split_whitespace().collect();
        let [id, kind, op, size] = v[..] else {
            return Err(format!("bad case {s:?}"));
        };
        let kind = match kind {
            "Rc" => Kind::Rc,
            "Uc" => Kind::Uc,
            "Ud" => Kind::Ud,
            _ => return Err(format!("bad kind {kind:?}")),
        };
        let op = match op {
            "Send" => Op::Send,
            "SendImm" => Op::SendImm,
            "Write" => Op::Write,
            "WriteImm" => Op::WriteImm,
            "Read" => Op::Read,
            "CmpSwap" => Op::CmpSwap,
            "FetchAdd" => Op::FetchAdd,
            _ => return Err(format!("bad op {op:?}")),
        };
        Ok(Case {
            id: id.parse().map_err(|_| "bad id")?,
            kind,
            op,
            size: size.parse().map_err(|_| "bad size")?,
        })
    }
}

impl Case {
    fn seed(&self) -> u64 {
        0x5EED_0000 + u64::from(self.id)
    }
    fn imm(&self) -> u32 {
        0xA000_0000 | self.id
    }
    /// (initial value, first operand, second operand) of an atomic case.
    fn atomic_values(&self) -> (u64, u64, u64) {
        let v0 = 0x0123_4567_89AB_CDEF ^ u64::from(self.id);
        match self.op {
            // Swap in v1, then a compare that no longer matches.
            Op::CmpSwap => (v0, 0xFEDC_BA98_7654_3210, 0x1111),
            // Add, then add an amount that wraps around.
            _ => (v0, 5, u64::MAX - 2),
        }
    }
}

/// Every operation on every QP type that supports it, at 0, 1, MTU-1, MTU,
/// MTU+1 bytes, 1 MiB and 16 MiB (UD: up to the MTU); atomics on 8 bytes.
pub fn full_plan(mtu: usize) -> Vec<Case> {
    let sizes = [0, 1, mtu - 1, mtu, mtu + 1, 1 << 20, MAX_SIZE];
    let mut v = Vec::new();
    let mut add = |kind, op, size| {
        let id = v.len() as u32;
        v.push(Case { id, kind, op, size })
    };
    for op in [Op::Send, Op::SendImm, Op::Write, Op::WriteImm, Op::Read] {
        for s in sizes {
            add(Kind::Rc, op, s);
        }
    }
    add(Kind::Rc, Op::CmpSwap, 8);
    add(Kind::Rc, Op::FetchAdd, 8);
    for op in [Op::Send, Op::SendImm, Op::Write, Op::WriteImm] {
        for s in sizes {
            add(Kind::Uc, op, s);
        }
    }
    for op in [Op::Send, Op::SendImm] {
        for s in [0, 1, mtu - 1, mtu] {
            add(Kind::Ud, op, s);
        }
    }
    v
}

/// A short plan that still shows every opcode on the wire: single- and
/// multi-packet messages of each kind, READ responses, atomics, UC and UD.
pub fn wire_plan(mtu: usize) -> Vec<Case> {
    let multi = 2 * mtu + 1; // FIRST, MIDDLE, LAST
    let mut v = Vec::new();
    let mut add = |kind, op, size| {
        let id = v.len() as u32;
        v.push(Case { id, kind, op, size })
    };
    for op in [Op::Send, Op::SendImm, Op::Write, Op::WriteImm, Op::Read] {
        add(Kind::Rc, op, 0);
        add(Kind::Rc, op, 1);
        add(Kind::Rc, op, multi);
    }
    add(Kind::Rc, Op::CmpSwap, 8);
    add(Kind::Rc, Op::FetchAdd, 8);
    for op in [Op::Send, Op::SendImm, Op::Write, Op::WriteImm] {
        add(Kind::Uc, op, 1);
        add(Kind::Uc, op, multi);
    }
    add(Kind::Ud, Op::Send, 0);
    add(Kind::Ud, Op::Send, 1);
    add(Kind::Ud, Op::SendImm, mtu);
    v
}

/// The plan a requester peer runs.
pub fn plan_from_env(mtu: usize) -> Vec<Case> {
    match std::env::var(PLAN_ENV).as_deref() {
        Ok("wire") => wire_plan(mtu),
        Ok("small") => full_plan(mtu)
            .into_iter()
            .filter(|c| c.size <= 1 << 20)
            .collect(),
        // Under injected loss and reordering: every RC case (the transport
        // recovers), and the unreliable ones only up to a few packets (a
        // UC or UD message with any packet lost or out of order is lost as
        // a whole, by design, so a 1 MiB one would rarely arrive).
        Ok("faults") => full_plan(mtu)
            .into_iter()
            .filter(|c| matches!(c.kind, Kind::Rc) || c.size <= 4 * mtu)
            .collect(),
        _ => full_plan(mtu),
    }
}

fn sges(mr: &Mr, offset: u64, len: usize) -> Vec<Sge> {
    if len == 0 {
        vec![]
    } else {
        vec![mr.sge(offset, len as u32)]
    }
}

fn wait_one(cq: &Cq, what: &str) -> WorkCompletion {
    match cq.wait(1, OP_TIMEOUT) {
        Ok(mut v) => v.remove(0),
        Err(e) => panic!("{what}: {e}"),
    }
}

fn post_and_wait(side: &Side, qp: &Qp, wr: &SendWr, c: &Case) -> WorkCompletion {
    qp.post_send(wr)
        .unwrap_or_else(|e| panic!("case {c}: post_send: {e}"));
    let wc = wait_one(&side.scq, &format!("case {c}: send completion"));
    assert_eq!(
        (wc.wr_id, wc.status),
        (wr.wr_id, WcStatus::Success),
        "case {c}: {wc:?}; QP {:?}; device {:?} {:?}",
        qp.counters(),
        side.ctx.counters(),
        side.ctx.driver_counters()
    );
    assert_eq!(wc.opcode, wr.op.wc_opcode(), "case {c}: {wc:?}");
    wc
}

/// Requester side of a plan: for each case, asks the responder to prepare,
/// posts the operation, checks its completion (and READ/atomic results
/// here), then asks the responder to verify what it got.
pub fn run_requester(side: &Side, remote: &Remote, ctl: &mut Ctl, plan: &[Case]) {
    let t0 = Instant::now();
    for c in plan {
        let started = Instant::now();
        ctl.send(&format!("case {c}"));
        ctl.expect(&format!("ready {}", c.id));
        let mut attempt = 1;
        loop {
            run_case(side, remote, c);
            ctl.send(&format!("check {}", c.id));
            let r = ctl.recv();
            // UC and UD are unreliable: a message the receiver's socket
            // buffer had no room for is gone. Send it again (bounded); what
            // does arrive must be intact.
            if r.starts_with(&format!("lost {}", c.id)) && attempt < UNRELIABLE_ATTEMPTS {
                eprintln!("case {c}: attempt {attempt}: {r}; sending it again");
                attempt += 1;
                continue;
            }
            assert_eq!(r, format!("ok {}", c.id), "case {c}: responder says {r}");
            break;
        }
        if started.elapsed() > Duration::from_millis(500) {
            eprintln!("case {c}: {:?}", started.elapsed());
        }
    }
    ctl.send("done");
    ctl.expect("bye");
    eprintln!("{} cases in {:?}", plan.len(), t0.elapsed());
}

fn run_case(side: &Side, remote: &Remote, c: &Case) {
    let n = c.size;
    let mr = &side.mr;
    let qp = side.qp(c.kind);
    let r = &remote.region;
    let id = u64::from(c.id);
    match c.op {
        Op::Send | Op::SendImm | Op::Write | Op::WriteImm => {
            mr.write(0, &pattern(c.seed(), n)).unwrap();
            let op = match c.op {
                Op::Send => SendOp::Send,
                Op::SendImm => SendOp::SendWithImm { imm: c.imm() },
                Op::Write => SendOp::Write {
                    remote_addr: r.addr,
                    rkey: r.rkey,
                },
                _ => SendOp::WriteWithImm {
                    remote_addr: r.addr,
                    rkey: r.rkey,
                    imm: c.imm(),
                },
            };
            let mut wr = SendWr::new(id, op, sges(mr, 0, n));
            if c.kind == Kind::Ud {
                wr.ud = Some(UdDest {
                    ah: remote.ah.handle(),
                    remote_qpn: remote.ud.qpn,
                    remote_qkey: remote.ud.qkey,
                });
            }
            let wc = post_and_wait(side, qp, &wr, c);
            let _ = wc;
        }
        Op::Read => {
            mr.write(0, &vec![FILL; n + GUARD]).unwrap();
            let wr = SendWr::new(
                id,
                SendOp::Read {
                    remote_addr: r.addr,
                    rkey: r.rkey,
                },
                sges(mr, 0, n),
            );
            let wc = post_and_wait(side, qp, &wr, c);
            assert_eq!(wc.byte_len as usize, n, "case {c}: READ byte_len");
            let got = read_mr(mr, 0, n + GUARD);
            if let Some(d) = diff(&got[..n], &pattern(c.seed(), n)) {
                panic!("case {c}: READ data: {d}");
            }
            assert!(
                got[n..].iter().all(|&b| b == FILL),
                "case {c}: READ wrote past the {n} bytes asked for"
            );
        }
        Op::CmpSwap | Op::FetchAdd => {
            let (v0, a, b) = c.atomic_values();
            let ops = if c.op == Op::CmpSwap {
                // Matches (swaps in a), then does not match (returns a).
                [
                    SendOp::CompareSwap {
                        remote_addr: r.addr,
                        rkey: r.rkey,
                        compare: v0,
                        swap: a,
                    },
                    SendOp::CompareSwap {
                        remote_addr: r.addr,
                        rkey: r.rkey,
                        compare: v0,
                        swap: b,
                    },
                ]
            } else {
                [
                    SendOp::FetchAdd {
                        remote_addr: r.addr,
                        rkey: r.rkey,
                        add: a,
                    },
                    SendOp::FetchAdd {
                        remote_addr: r.addr,
                        rkey: r.rkey,
                        add: b,
                    },
                ]
            };
            let want = if c.op == Op::CmpSwap {
                [v0, a]
            } else {
                [v0, v0.wrapping_add(a)]
            };
            for (i, op) in ops.into_iter().enumerate() {
                mr.write(0, &[FILL; 16]).unwrap();
                post_and_wait(side, qp, &SendWr::new(id, op, sges(mr, 0, 8)), c);
                let got = mr.read_u64(0).unwrap();
                assert_eq!(
                    got, want[i],
                    "case {c}: atomic #{i} returned {got:#x}, not {:#x}",
                    want[i]
                );
                assert!(
                    read_mr(mr, 8, 8).iter().all(|&b| b == FILL),
                    "case {c}: atomic result wider than 8 bytes"
                );
            }
        }
    }
}

/// Responder side: serves cases until `done`.
pub fn run_responder(side: &Side, remote: &Remote, ctl: &mut Ctl) {
    loop {
        let msg = ctl.recv();
        if msg == "done" {
            ctl.send("bye");
            return;
        }
        let c: Case = msg
            .strip_prefix("case ")
            .unwrap_or_else(|| panic!("unexpected {msg:?}"))
            .parse()
            .unwrap();
        prepare(side, &c);
        ctl.send(&format!("ready {}", c.id));
        loop {
            ctl.expect(&format!("check {}", c.id));
            match verify(side, remote, &c) {
                Ok(()) => ctl.send(&format!("ok {}", c.id)),
                Err(e) if e.starts_with(LOST) => {
                    ctl.send(&format!("lost {}: {e}", c.id));
                    continue;
                }
                Err(e) => {
                    let e = format!(
                        "{e}; responder counters {:?} {:?}",
                        side.ctx.counters(),
                        side.ctx.driver_counters()
                    );
                    ctl.send(&format!("FAIL {}: {e}", c.id));
                    panic!("case {c}: {e}");
                }
            }
            break;
        }
    }
}

/// How often a UC/UD message is sent before its loss fails the test.
pub const UNRELIABLE_ATTEMPTS: u32 = 8;
/// How long a UC/UD receiver waits before calling a message lost (the
/// sender has completed: all of it is on the wire or in our socket buffer).
pub const UNRELIABLE_WAIT: Duration = Duration::from_secs(2);
/// Marks an error that is a lost UC/UD message rather than a failure.
const LOST: &str = "LOST";

fn recv_len(c: &Case) -> usize {
    if c.kind == Kind::Ud {
        GRH_LEN + c.size + GUARD
    } else {
        c.size + GUARD
    }
}

fn prepare(side: &Side, c: &Case) {
    let mr = &side.mr;
    let qp = side.qp(c.kind);
    match c.op {
        Op::Send | Op::SendImm | Op::Write | Op::WriteImm => {
            mr.write(0, &vec![FILL; recv_len(c)]).unwrap();
        }
        Op::Read => mr.write(0, &pattern(c.seed(), c.size)).unwrap(),
        Op::CmpSwap | Op::FetchAdd => {
            mr.write(0, &c.atomic_values().0.to_ne_bytes()).unwrap();
            mr.write(8, &[FILL; 8]).unwrap();
        }
    }
    match c.op {
        Op::Send | Op::SendImm => qp
            .post_recv(&RecvWr {
                wr_id: u64::from(c.id),
                sg_list: sges(mr, 0, recv_len(c)),
            })
            .unwrap(),
        // A WRITE with immediate consumes a receive WR (no buffer needed).
        Op::WriteImm => qp
            .post_recv(&RecvWr {
                wr_id: u64::from(c.id),
                sg_list: vec![],
            })
            .unwrap(),
        _ => {}
    }
}

fn check_data(mr: &Mr, at: usize, c: &Case) -> Result<(), String> {
    let n = c.size;
    let got = read_mr(mr, at, n + GUARD);
    if let Some(d) = diff(&got[..n], &pattern(c.seed(), n)) {
        return Err(format!("data: {d}"));
    }
    if let Some(i) = got[n..].iter().position(|&b| b != FILL) {
        return Err(format!("byte {} after the message was written", i));
    }
    Ok(())
}

fn verify(side: &Side, remote: &Remote, c: &Case) -> Result<(), String> {
    let mr = &side.mr;
    let n = c.size;
    match c.op {
        Op::Send | Op::SendImm | Op::WriteImm => {
            let unreliable = c.kind != Kind::Rc;
            let wait = if unreliable {
                UNRELIABLE_WAIT
            } else {
                OP_TIMEOUT
            };
            let wc = match side.rcq.wait(1, wait) {
                Ok(mut v) => v.remove(0),
                Err(e) if unreliable => return Err(format!("{LOST}: no receive completion: {e}")),
                Err(e) => return Err(format!("receive completion: {e}")),
            };
            let want_op = if c.op == Op::WriteImm {
                WcOpcode::RecvRdmaWithImm
            } else {
                WcOpcode::Recv
            };
            let ud = c.kind == Kind::Ud;
            let want_len = if ud { GRH_LEN + n } else { n };
            if (wc.wr_id, wc.status, wc.opcode, wc.byte_len as usize)
                != (u64::from(c.id), WcStatus::Success, want_op, want_len)
            {
                return Err(format!("receive completion {wc:?}"));
            }
            if wc.qp_num != side.qp(c.kind).qpn() {
                return Err(format!("completion for QP {:#x}: {wc:?}", wc.qp_num));
            }
            let imm = c.op != Op::Send;
            if wc.wc_flags.contains(WcFlags::WITH_IMM) != imm || (imm && wc.imm_data != c.imm()) {
                return Err(format!("immediate data wrong: {wc:?}"));
            }
            if ud
                && (!wc.wc_flags.contains(WcFlags::GRH)
                    || wc.src_qp != remote.ud.qpn
                    || wc.sgid != remote.ud.gid)
            {
                return Err(format!("UD source/GRH wrong: {wc:?}"));
            }
            if c.op == Op::WriteImm {
                check_data(mr, 0, c)
            } else {
                check_data(mr, if ud { GRH_LEN } else { 0 }, c)
            }
        }
        Op::Write => {
            // RC: placed before the requester saw its ACK. UC: the requester
            // completes on transmission, so give the packets time to land.
            let start = Instant::now();
            loop {
                match check_data(mr, 0, c) {
                    Ok(()) => return Ok(()),
                    Err(e) if c.kind == Kind::Rc => return Err(e),
                    Err(e) if start.elapsed() > UNRELIABLE_WAIT => {
                        return Err(format!("{LOST}: {e}"))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        }
        Op::Read => {
            if let Some(d) = diff(&read_mr(mr, 0, n), &pattern(c.seed(), n)) {
                return Err(format!("READ changed the source: {d}"));
            }
            Ok(())
        }
        Op::CmpSwap | Op::FetchAdd => {
            let (v0, a, b) = c.atomic_values();
            let want = if c.op == Op::CmpSwap {
                a
            } else {
                v0.wrapping_add(a).wrapping_add(b)
            };
            let got = mr.read_u64(0).map_err(|e| e.to_string())?;
            if got != want {
                return Err(format!("counter is {got:#x}, not {want:#x}"));
            }
            if read_mr(mr, 8, 8).iter().any(|&b| b != FILL) {
                return Err("atomic wrote past its 8 bytes".into());
            }
            Ok(())
        }
    }
}

/// Region size of a matrix side.
pub const SIDE_MR_LEN: usize = MAX_SIZE + 4096;

/// The requester or responder role of a peer process: opens the default
/// device (SOFTRDMA_DEVICES), connects over SOFTRDMA_TEST_CM and serves or
/// runs the plan.
pub fn matrix_peer(role: &str) {
    let ctx = Context::open_default().unwrap();
    eprintln!(
        "{role} on {} ({:?})",
        ctx.addr(),
        ctx.query_port().active_mtu
    );
    check_expected_mtu(&ctx);
    let side = Side::open(ctx, SIDE_MR_LEN);
    let mut stream = peer_stream();
    let remote = side.connect(&mut stream, &ConnectOptions::default());
    let mut ctl = Ctl::new(stream);
    let run = std::panic::AssertUnwindSafe(|| match role {
        "responder" => run_responder(&side, &remote, &mut ctl),
        "requester" => {
            let plan = plan_from_env(remote.mtu);
            run_requester(&side, &remote, &mut ctl, &plan)
        }
        _ => unreachable!(),
    });
    if let Err(e) = std::panic::catch_unwind(run) {
        // What this end saw, for the post-mortem.
        eprintln!(
            "{role} failed; device {:?} {:?}",
            side.ctx.counters(),
            side.ctx.driver_counters()
        );
        for q in [&side.rc, &side.uc, &side.ud] {
            eprintln!("{role} QP {q:?} {:?}: {:?}", q.state(), q.counters());
        }
        std::panic::resume_unwind(e);
    }
    let c = side.ctx.counters();
    eprintln!("{role} counters: {c:?}");
    assert_eq!(c.icrc_errors, 0, "ICRC errors");
    assert_eq!(c.malformed, 0, "malformed packets");
}

mod netns;
#[allow(unused_imports)]
pub use netns::{ip, netns_unavailable, Netns};

impl Netns {
    /// This test binary, running only `test` as `role`, inside namespace `i`
    /// (over RoCEv2/UDP: a shared-memory link would bypass the veth).
    pub fn self_command(&self, i: usize, test: &str, role: &str) -> Command {
        let mut c = self.exec(i, std::env::current_exe().unwrap());
        c.args(self_args(test)).env(ROLE_ENV, role);
        hermetic(&mut c);
        c.env("SOFTRDMA_TRANSPORT", "udp");
        c
    }
}

/// `tcpdump -w FILE -U` running until [`Tcpdump::stop`] (killed on drop).
pub struct Tcpdump {
    child: Option<Child>,
    pub file: PathBuf,
    stderr: std::sync::mpsc::Receiver<String>,
    log: Vec<String>,
}

impl Tcpdump {
    /// Starts capturing on `iface` (inside namespace `ns` if given) and
    /// waits (bounded) until tcpdump says it is listening.
    /// `Err` (a reason to skip) when tcpdump may not capture here (no
    /// CAP_NET_RAW); panics on other failures.
    pub fn start(
        ns: Option<&str>,
        iface: &str,
        filter: &str,
        file: PathBuf,
    ) -> Result<Tcpdump, String> {
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "tcpdump"]);
                c
            }
            None => Command::new("tcpdump"),
        };
        // -Z root: do not drop privileges before opening the file.
        // --immediate-mode: hand each packet over at once instead of when a
        // capture block fills or times out (which SIGINT would cut short).
        cmd.args([
            "-i",
            iface,
            "-n",
            "-U",
            "--immediate-mode",
            "-B",
            "65536", // KiB of capture buffer: keep up with bursts
            "-Z",
            "root",
            "-s",
            "0",
            "-w",
        ])
        .arg(&file)
        .arg(filter)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("cannot start tcpdump");
        let err = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut t = Tcpdump {
            child: Some(child),
            file,
            stderr: rx,
            log: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match t.stderr.recv_timeout(left) {
                Ok(l) => {
                    let ready = l.contains("listening on");
                    t.log.push(l);
                    if ready {
                        return Ok(t);
                    }
                }
                Err(_)
                    if t.log
                        .iter()
                        .any(|l| l.contains("ermission") || l.contains("not permitted")) =>
                {
                    return Err(format!("tcpdump may not capture here: {:?}", t.log))
                }
                Err(_) => panic!("tcpdump did not start listening: {:?}", t.log),
            }
        }
    }

    /// Stops the capture (SIGINT, bounded wait) and returns tcpdump's messages.
    pub fn stop(&mut self) -> Vec<String> {
        // Let the file settle: no growth for 200 ms (at most 3 s).
        let size = |f: &Path| std::fs::metadata(f).map_or(0, |m| m.len());
        let (start, mut last, mut since) = (Instant::now(), size(&self.file), Instant::now());
        while start.elapsed() < Duration::from_secs(3)
            && since.elapsed() < Duration::from_millis(200)
        {
            std::thread::sleep(Duration::from_millis(20));
            let now = size(&self.file);
            if now != last {
                (last, since) = (now, Instant::now());
            }
        }
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill has no pointer arguments; `c` is our unreaped child.
            unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
            let start = Instant::now();
            loop {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                if start.elapsed() > Duration::from_secs(10) {
                    let _ = c.kill();
                    let _ = c.wait();
                    panic!("tcpdump did not stop on SIGINT: {:?}", self.log);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        while let Ok(l) = self.stderr.recv_timeout(Duration::from_millis(200)) {
            self.log.push(l);
        }
        self.log.clone()
    }
}

impl Drop for Tcpdump {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The ICRC checker of the shared tools, if present.
pub fn icrc_checker() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/icrc-check.py");
    p.is_file().then_some(p)
}

/// Runs the shared ICRC checker on `pcap`: (ok, bad).
pub fn run_icrc_checker(checker: &Path, pcap: &Path) -> (u64, u64) {
    let out = run_bounded(
        Command::new("python3").arg(checker).arg(pcap),
        Duration::from_secs(120),
    );
    let text = out.stdout;
    assert!(out.status.success(), "icrc-check failed: {text}");
    // Last line: "FILE: N ok, M bad".
    let last = text.lines().last().unwrap_or_default();
    let nums: Vec<u64> = last
        .rsplit(": ")
        .next()
        .unwrap_or_default()
        .split(", ")
        .filter_map(|p| p.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(nums.len(), 2, "unexpected icrc-check output {last:?}");
    if nums[1] != 0 {
        let bad: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("BAD"))
            .take(10)
            .collect();
        eprintln!("icrc-check: bad frames: {bad:#?}");
    }
    (nums[0], nums[1])
}

/// Wireshark 4.0 payload heuristics that claim any SEND payload and throw
/// on short ones: RPC-over-RDMA (on 0- and 1-byte RC SENDs) and Mellanox
/// EoIB (on 0-byte UD SENDs) flag such frames "[Malformed Packet]" while the
/// InfiniBand layers dissect cleanly. Tests judge the IB layers with these
/// switched off (after checking they are the only complaint).
pub const TSHARK_QUIET: [&str; 4] = [
    "--disable-heuristic",
    "rpcrdma_infiniband",
    "--disable-heuristic",
    "mellanox_eoib",
];
/// What `frame.protocols` ends with for frames those heuristics claim.
pub const TSHARK_NOISY_LAYERS: [&str; 2] = [":rpcordma", ":infiniband.eoib"];

/// tshark's verdict on `pcap`: panics on a malformed frame (other than the
/// heuristics' complaints above); returns the BTH opcode of every frame.
pub fn tshark_check(pcap: &Path) -> Vec<u8> {
    let noisy = tshark(
        pcap,
        &[
            "-Y",
            "_ws.malformed",
            "-T",
            "fields",
            "-e",
            "frame.protocols",
        ],
    );
    for l in noisy.lines() {
        assert!(
            TSHARK_NOISY_LAYERS.iter().any(|n| l.trim().ends_with(n)),
            "tshark: malformed frame, protocols {l}"
        );
    }
    let malformed = tshark(
        pcap,
        &[&TSHARK_QUIET[..], &["-Y", "_ws.malformed"]].concat(),
    );
    assert!(malformed.trim().is_empty(), "tshark: {malformed}");
    let ops = tshark(
        pcap,
        &[
            &TSHARK_QUIET[..],
            &["-T", "fields", "-e", "infiniband.bth.opcode"],
        ]
        .concat(),
    );
    ops.lines()
        .map(|l| {
            l.trim()
                .parse()
                .unwrap_or_else(|_| panic!("tshark: opcode {l:?}"))
        })
        .collect()
}

/// Runs tshark on `pcap` with `args`; its output.
pub fn tshark(pcap: &Path, args: &[&str]) -> String {
    let out = run_bounded(
        Command::new("tshark").arg("-r").arg(pcap).args(args),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "tshark {args:?}: {}", out.stderr);
    out.stdout
}

/// What a pcap holds, judged with softrdma-pcap and the wire crate's ICRC.
#[derive(Debug, Default)]
pub struct CaptureCheck {
    pub frames: u64,
    pub icrc_ok: u64,
    pub icrc_bad: Vec<u64>,
    /// (source IP, destination IP) pairs seen.
    pub flows: std::collections::BTreeSet<(std::net::IpAddr, std::net::IpAddr)>,
    /// BTH opcodes seen.
    pub opcodes: std::collections::BTreeSet<u8>,
}

/// Reads every frame of `path` and checks its ICRC over the real IP packet.
pub fn check_capture(path: &Path) -> CaptureCheck {
    use std::net::IpAddr;
    let mut r = softrdma_pcap::CaptureReader::open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut c = CaptureCheck::default();
    while let Some(f) = r.next_frame().unwrap() {
        c.frames += 1;
        let ip = f
            .ip()
            .unwrap_or_else(|e| panic!("frame {}: {e:?}", f.number));
        let (src, dst, hdr): (IpAddr, IpAddr, usize) = match ip[0] >> 4 {
            4 => (
                <[u8; 4]>::try_from(&ip[12..16]).unwrap().into(),
                <[u8; 4]>::try_from(&ip[16..20]).unwrap().into(),
                usize::from(ip[0] & 0xF) * 4,
            ),
            _ => (
                <[u8; 16]>::try_from(&ip[8..24]).unwrap().into(),
                <[u8; 16]>::try_from(&ip[24..40]).unwrap().into(),
                40,
            ),
        };
        c.flows.insert((src, dst));
        c.opcodes.insert(ip[hdr + 8]);
        match softrdma_wire::icrc::over_ip_packet(ip) {
            Ok((stored, computed)) if stored == computed => c.icrc_ok += 1,
            _ => c.icrc_bad.push(f.number),
        }
    }
    c
}

/// The opcodes a [`wire_plan`] run puts on the wire.
pub fn wire_plan_opcodes() -> Vec<u8> {
    let mut v: Vec<u8> = (0x00..=0x14).collect(); // RC: every SEND/WRITE/READ/ACK/atomic
    v.extend(0x20..=0x2B); // UC SEND and WRITE, all positions
    v.extend([0x64, 0x65]); // UD SEND_ONLY(_IMM)
    v
}

/// A peer that opens the default device, connects over the control stream,
/// says "ready" and waits to be killed (the tests of a peer's death).
pub fn serve_until_killed() {
    let ctx = Context::open_default().unwrap();
    let side = Side::open(ctx, 1 << 20);
    let mut stream = peer_stream();
    let _remote = side.connect(&mut stream, &ConnectOptions::default());
    let mut ctl = Ctl::new(stream);
    ctl.send("ready");
    let m = ctl.recv();
    panic!("the peer was not killed (got {m:?})");
}
