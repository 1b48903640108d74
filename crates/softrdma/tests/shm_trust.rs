//! The same-host path against peers that cannot be trusted: processes
//! that die in the middle of direct operations, many processes linking to
//! each other at once, and other users (a squatted run directory, a
//! connection from another uid). This test binary re-executes itself for
//! each peer (`SOFTRDMA_TEST_ROLE`).

mod common;

use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use softrdma::*;

/// Entry point of the re-executed peers; returns at once in a normal run.
#[test]
fn peer() {
    let Some(role) = role() else { return };
    match role.as_str() {
        "target" => serve_until_killed(),
        "mesh" => mesh_member(),
        "squat_victim" => squat_victim(),
        "uid_victim" => uid_victim(),
        "uid_attacker" => uid_attacker(),
        other => panic!("unknown role {other}"),
    }
}

// ----- a peer killed in the middle of direct operations -----

#[derive(Clone, Copy, Debug)]
enum OpKind {
    Write,
    Read,
    FetchAdd,
}

fn op(kind: OpKind, r: RemoteRegion) -> SendOp {
    match kind {
        OpKind::Write => SendOp::Write {
            remote_addr: r.addr,
            rkey: r.rkey,
        },
        OpKind::Read => SendOp::Read {
            remote_addr: r.addr,
            rkey: r.rkey,
        },
        OpKind::FetchAdd => SendOp::FetchAdd {
            remote_addr: r.addr,
            rkey: r.rkey,
            add: 1,
        },
    }
}

/// Streams `kind` operations to a same-host target, directly in its memory,
/// kills it with SIGKILL and checks that the survivor's operations then end
/// with RETRY_EXC_ERR within (retry_cnt + 1) ACK timeouts, as over UDP,
/// and that direct operations stop: nothing more lands in the dead
/// process's pages once its link is seen gone.
fn kill_during(kind: OpKind) {
    let dir = TempDir::new("shmkill");
    let side = Side::open(Context::open_with(&shm_loopback()).unwrap(), 1 << 20);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cmd = self_command_over("peer", "target", "shm");
    cmd.env(CM_ENV, format!("connect:{}", l.local_addr().unwrap()));
    let mut peer = Peer::spawn("target", cmd, &dir);
    let mut stream = accept_bounded(&l, Duration::from_secs(30), Some(&mut peer));
    // timeout 12: 4.096 µs × 2^12 ≈ 16.8 ms per try; 3 retries.
    let o = ConnectOptions {
        timeout: 12,
        retry_cnt: 3,
        ..Default::default()
    };
    let budget = Duration::from_nanos(4096 << o.timeout) * (u32::from(o.retry_cnt) + 1);
    let remote = side.connect(&mut stream, &o);
    let mut ctl = Ctl::new(stream);
    ctl.expect("ready");
    let len = if matches!(kind, OpKind::FetchAdd) {
        8
    } else {
        4096
    };
    let post_one = |id: u64| {
        let wr = SendWr::new(id, op(kind, remote.region), vec![side.mr.sge(0, len)]);
        side.rc.post_send(&wr).unwrap();
        side.scq.wait(1, OP_TIMEOUT).unwrap()[0]
    };
    // Until the target granted its region: operations go direct.
    let t0 = Instant::now();
    let mut id = 0;
    while side.ctx.driver_counters().direct_ops == 0 {
        assert_eq!(post_one(id).status, WcStatus::Success);
        id += 1;
        assert!(t0.elapsed() < Duration::from_secs(10), "never went direct");
    }
    for _ in 0..100 {
        assert_eq!(post_one(id).status, WcStatus::Success);
        id += 1;
    }
    peer.signal(libc::SIGKILL);
    let killed = Instant::now();
    let status = peer.wait(Duration::from_secs(10));
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    let direct_at_kill = side.ctx.driver_counters().direct_ops;
    // Keep posting: some may still go direct until the link is seen gone
    // (the background thread wakes on the dead peer's socket); then the
    // engine carries them, and they fail as over UDP.
    let mut last_direct = killed;
    let (failed, posted) = loop {
        let posted = Instant::now();
        let before = side.ctx.driver_counters().direct_ops;
        let wc = post_one(id);
        id += 1;
        if wc.status != WcStatus::Success {
            break (wc, posted);
        }
        if side.ctx.driver_counters().direct_ops > before {
            last_direct = Instant::now();
        }
        assert!(
            killed.elapsed() < budget * 2,
            "{kind:?}: still succeeding {:?} after the kill",
            killed.elapsed()
        );
    };
    let (took, own) = (killed.elapsed(), posted.elapsed());
    assert_eq!(failed.status, WcStatus::RetryExcErr, "{kind:?}: {failed:?}");
    // Its own wait is the retry budget (as over UDP), on a loaded machine
    // with some slack; before it, no operation waited at all.
    assert!(
        own >= budget && own < budget + Duration::from_secs(1),
        "{kind:?}: RETRY_EXC_ERR {own:?} after its post; the budget is {budget:?}"
    );
    let direct_after = side.ctx.driver_counters().direct_ops - direct_at_kill;
    let window = last_direct - killed;
    // Noticed well within one retry budget even on a loaded machine (a
    // few ms here, idle: no direct operation after the kill at all).
    assert!(
        window < budget,
        "{kind:?}: direct operations went on for {window:?} after the kill ({direct_after} of them)"
    );
    let flushed = post_one(id);
    assert_eq!(flushed.status, WcStatus::WrFlushErr, "{flushed:?}");
    eprintln!(
        "{kind:?}: RETRY_EXC_ERR {own:?} after its post, {took:?} after the kill \
         (budget {budget:?}), {direct_after} direct operations in the {window:?} after the kill"
    );
}

#[test]
fn a_peer_killed_during_direct_writes_is_noticed_within_the_timeout_budget() {
    kill_during(OpKind::Write);
}

#[test]
fn a_peer_killed_during_direct_reads_is_noticed_within_the_timeout_budget() {
    kill_during(OpKind::Read);
}

#[test]
fn a_peer_killed_during_direct_atomics_is_noticed_within_the_timeout_budget() {
    kill_during(OpKind::FetchAdd);
}

// ----- many processes linking to each other at the same moment -----

const MESH: usize = 8;
const MESH_QKEY: u32 = 0x5EED;

/// Waits (bounded) until `path` exists, then returns its contents.
fn wait_file(path: &Path, limit: Duration) -> String {
    let t0 = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s;
            }
        }
        assert!(t0.elapsed() < limit, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// One of MESH processes: publishes its UD QP, waits for the others and a
/// common start, sends one message to each (each first packet makes a
/// link, all at once), and reports how long until it had every message.
fn mesh_member() {
    let dir = PathBuf::from(std::env::var("SOFTRDMA_TEST_DIR").unwrap());
    let me: usize = std::env::var("SOFTRDMA_TEST_INDEX")
        .unwrap()
        .parse()
        .unwrap();
    let ctx = Context::open_with(&shm_loopback()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let mr = pd.alloc_mr(64 * 1024, AccessFlags::LOCAL_WRITE).unwrap();
    let mut qp = pd.create_qp(QpType::Ud, &cq, &cq).build().unwrap();
    qp.set_qkey(MESH_QKEY);
    qp.ready_ud().unwrap();
    for i in 0..MESH as u64 {
        qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: vec![mr.sge(i * 1024, 1024)],
        })
        .unwrap();
    }
    let gid = ctx.gid();
    let line = format!("{} {}\n", hex(&gid.0), qp.qpn());
    std::fs::write(dir.join(format!("member-{me}")), line).unwrap();
    let go = wait_file(&dir.join("go"), Duration::from_secs(60));
    let start_ns: u128 = go.trim().parse().unwrap();
    let mut peers = Vec::new();
    for i in (0..MESH).filter(|&i| i != me) {
        let s = wait_file(&dir.join(format!("member-{i}")), Duration::from_secs(5));
        let mut it = s.split_whitespace();
        let gid = Gid(unhex(it.next().unwrap()));
        let qpn = Qpn::from_raw(it.next().unwrap().parse().unwrap());
        peers.push((pd.create_ah(gid).unwrap(), qpn));
    }
    // Everyone starts at the same instant.
    while now_ns() < start_ns {
        std::thread::sleep(Duration::from_micros(100));
    }
    let t0 = Instant::now();
    mr.write(60 * 1024, &[me as u8; 64]).unwrap();
    for (i, (ah, qpn)) in peers.iter().enumerate() {
        let wr = ud_wr(100 + i as u64, mr.sge(60 * 1024, 64), ah, *qpn, MESH_QKEY);
        qp.post_send(&wr).unwrap();
    }
    let mut got = 0;
    let mut sent = 0;
    while got < MESH - 1 || sent < MESH - 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "member {me}: {got} messages and {sent} send completions after 10 s"
        );
        if let Some(wc) = cq.poll_one().unwrap() {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            if wc.opcode == WcOpcode::Send {
                sent += 1;
            } else {
                got += 1;
            }
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let took = t0.elapsed();
    let c = ctx.shm_counters();
    println!(
        "member {me}: linked and heard from all in {took:?} (links {}, refused {})",
        c.links, c.links_refused
    );
    assert!(c.links >= (MESH - 1) as u64, "{c:?}");
    assert!(
        took < Duration::from_secs(1),
        "member {me}: {took:?} to link with all"
    );
    std::fs::write(
        dir.join(format!("done-{me}")),
        format!("{}\n", took.as_micros()),
    )
    .unwrap();
}

/// A UD SEND of `sge` to QP `qpn` behind `ah`.
fn ud_wr(wr_id: u64, sge: Sge, ah: &Ah, qpn: Qpn, qkey: u32) -> SendWr {
    let mut wr = SendWr::new(wr_id, SendOp::Send, vec![sge]);
    wr.ud = Some(UdDest {
        ah: ah.handle(),
        remote_qpn: qpn,
        remote_qkey: qkey,
    });
    wr
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

#[test]
fn eight_processes_link_to_each_other_at_once_within_a_second() {
    let dir = TempDir::new("mesh");
    let mut members: Vec<Peer> = (0..MESH)
        .map(|i| {
            let mut cmd = self_command_over("peer", "mesh", "shm");
            cmd.env("SOFTRDMA_TEST_DIR", &dir.0)
                .env("SOFTRDMA_TEST_INDEX", i.to_string());
            Peer::spawn(&format!("mesh-{i}"), cmd, &dir)
        })
        .collect();
    for i in 0..MESH {
        wait_file(&dir.path(&format!("member-{i}")), Duration::from_secs(60));
    }
    let go = now_ns() + 300_000_000;
    std::fs::write(dir.path("go.tmp"), format!("{go}\n")).unwrap();
    std::fs::rename(dir.path("go.tmp"), dir.path("go")).unwrap();
    let mut refs: Vec<&mut Peer> = members.iter_mut().collect();
    expect_all_success(&mut refs, Duration::from_secs(60));
    let times: Vec<u64> = (0..MESH)
        .map(|i| {
            let s = std::fs::read_to_string(dir.path(&format!("done-{i}"))).unwrap();
            s.trim().parse().unwrap()
        })
        .collect();
    eprintln!("µs from the common start to all links and messages, per member: {times:?}");
    assert!(times.iter().all(|&t| t < 1_000_000), "{times:?}");
}

// ----- other users -----

/// An unprivileged user for the cross-user tests: `nobody`, or one made
/// with `useradd` when there is none.
fn other_user() -> (u32, u32) {
    let find = || {
        let text = std::fs::read_to_string("/etc/passwd").ok()?;
        text.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 3 && (f[0] == "nobody" || f[0] == "softrdma-test"))
                .then(|| (f[2].parse().ok(), f[3].parse().ok()))
                .and_then(|(u, g)| Some((u?, g?)))
        })
    };
    if let Some(ug) = find() {
        return ug;
    }
    let ok = std::process::Command::new("useradd")
        .args(["--system", "--no-create-home", "softrdma-test"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "no unprivileged user and useradd failed");
    find().expect("the user just added")
}

/// Whether the cross-user tests can run here (they need root to act as two
/// users). Under `SOFTRDMA_STRICT_TESTS` (CI) they must.
fn cross_user_possible(test: &str) -> bool {
    if is_root() {
        return true;
    }
    assert!(
        std::env::var_os("SOFTRDMA_STRICT_TESTS").is_none(),
        "{test} needs root (CI runs as root): it plays two users"
    );
    skip(test, "needs root to play two users");
    false
}

fn chown(path: &Path, (uid, gid): (u32, u32)) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; no other pointers.
    assert_eq!(
        unsafe { libc::chown(c.as_ptr(), uid, gid) },
        0,
        "chown {}",
        path.display()
    );
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Opens a device with the run directory of the environment and reports
/// what happened (the parent owns that directory's other user).
fn squat_victim() {
    let transport = std::env::var("SOFTRDMA_TRANSPORT").unwrap();
    match Context::open_default() {
        Err(e) => println!("OPEN FAILED: {e}"),
        Ok(ctx) => {
            // Reach for the planted socket's address: a UD message to it.
            let dst: std::net::SocketAddr = std::env::var("SOFTRDMA_TEST_PLANTED")
                .unwrap()
                .parse()
                .unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(8).unwrap();
            let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
            let mut qp = pd.create_qp(QpType::Ud, &cq, &cq).build().unwrap();
            qp.set_qkey(1);
            qp.ready_ud().unwrap();
            let ah = pd.create_ah(Gid::from_ip(dst.ip())).unwrap();
            let wr = ud_wr(1, mr.sge(0, 16), &ah, Qpn::from_raw(0x12), 1);
            qp.post_send(&wr).unwrap();
            let _ = cq.wait(1, Duration::from_secs(5));
            println!(
                "OPENED over {transport}: shm links {}",
                ctx.shm_counters().links
            );
        }
    }
}

#[test]
fn a_squatted_run_directory_is_refused_and_nothing_is_exposed() {
    let test = "a_squatted_run_directory_is_refused_and_nothing_is_exposed";
    if !cross_user_possible(test) {
        return;
    }
    let other = other_user();
    let dir = TempDir::new("squat");
    chmod(&dir.0, 0o755);
    let squat = dir.path("run");
    std::fs::create_dir(&squat).unwrap();
    chown(&squat, other);
    chmod(&squat, 0o777);
    // The other user listens where the victim's peer would be.
    let planted: std::net::SocketAddr = "127.0.0.213:4791".parse().unwrap();
    let sock = squat.join("dev-127.0.0.213-4791.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    listener.set_nonblocking(true).unwrap();
    chown(&sock, other);
    chmod(&sock, 0o777);
    for transport in ["shm", "auto"] {
        let mut cmd = self_command_over("peer", "squat_victim", transport);
        cmd.env("SOFTRDMA_RUN_DIR", &squat)
            .env("SOFTRDMA_TEST_PLANTED", planted.to_string());
        let mut p = Peer::spawn(&format!("squat-{transport}"), cmd, &dir);
        p.expect_success(Duration::from_secs(60));
        let log = p.log();
        if transport == "shm" {
            assert!(log.contains("OPEN FAILED"), "{log}");
            assert!(
                log.contains(&squat.display().to_string())
                    && log.contains(&format!("uid {}", other.0)),
                "the error names the path and its owner: {log}"
            );
        } else {
            assert!(log.contains("OPENED over auto: shm links 0"), "{log}");
            assert!(log.contains("over UDP only"), "a warning says why: {log}");
        }
    }
    assert!(
        listener.accept().is_err(),
        "the victim connected to the other user's socket"
    );
}

/// Opens a shm device in its own run directory, then loosens the
/// directory and socket permissions (as a careless admin might), so that
/// another user can connect, and reports what the link check did.
fn uid_victim() {
    let dir = PathBuf::from(std::env::var("SOFTRDMA_TEST_DIR").unwrap());
    let ctx = Context::open_with(&shm_loopback()).unwrap();
    let run = softrdma::stats::run_dir();
    let sock = std::fs::read_dir(&run)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            // Not its lock file (dev-*.lock), which the directory may list first.
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with("dev-") && n.ends_with(".sock")
            })
        })
        .expect("the device's socket");
    chmod(&run, 0o711);
    chmod(&sock, 0o666);
    std::fs::write(dir.join("socket"), format!("{}\n", sock.display())).unwrap();
    let _ = wait_file(&dir.join("attacked"), Duration::from_secs(60));
    // Let progress see whatever the attacker left.
    let t0 = Instant::now();
    while ctx.shm_counters().links_refused == 0 && t0.elapsed() < Duration::from_secs(5) {
        ctx.progress();
        std::thread::sleep(Duration::from_millis(5));
    }
    let c = ctx.shm_counters();
    println!("VICTIM links {} refused {}", c.links, c.links_refused);
}

/// As another user: connects to the victim's socket and sends a well-formed
/// hello with a sealed memfd and an eventfd; passes if the victim sends
/// nothing back (no welcome, no descriptor) and closes.
fn uid_attacker() {
    let path = std::env::var("SOFTRDMA_TEST_SOCKET").unwrap();
    let s = std::os::unix::net::UnixStream::connect(path.trim()).expect("connect");
    let (memfd, efd) = hostile_fds();
    let mut hello = [0u8; 64];
    hello[..4].copy_from_slice(b"SRDL");
    hello[4..6].copy_from_slice(&2u16.to_le_bytes());
    hello[6..8].copy_from_slice(&1u16.to_le_bytes());
    let ip = std::net::Ipv4Addr::new(127, 0, 0, 99)
        .to_ipv6_mapped()
        .octets();
    hello[8..24].copy_from_slice(&ip);
    hello[24..26].copy_from_slice(&4791u16.to_be_bytes());
    // The victim may have refused (and closed) already: then the send fails.
    if !send_with_fds(s.as_raw_fd(), &hello, &[memfd.as_raw_fd(), efd.as_raw_fd()]) {
        println!(
            "ATTACKER: refused before the hello ({})",
            std::io::Error::last_os_error()
        );
        return;
    }
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut b = [0u8; 128];
    use std::io::Read;
    match (&s).read(&mut b) {
        Ok(0) => println!("ATTACKER: closed without an answer"),
        Ok(n) => panic!("ATTACKER: the victim answered {n} bytes"),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
            println!("ATTACKER: reset without an answer")
        }
        Err(e) => println!("ATTACKER: no answer ({e})"),
    }
}

/// A sealed memfd the size of a link segment could be, and an eventfd.
fn hostile_fds() -> (OwnedFd, OwnedFd) {
    // SAFETY: plain system calls with valid arguments; results checked.
    unsafe {
        let m = libc::memfd_create(c"attacker".as_ptr(), libc::MFD_ALLOW_SEALING);
        assert!(m >= 0);
        assert_eq!(libc::ftruncate(m, 1 << 20), 0);
        libc::fcntl(
            m,
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
        );
        let e = libc::eventfd(0, 0);
        assert!(e >= 0);
        (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(e))
    }
}

/// Sends `data` with `fds`; false when the send failed.
fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> bool {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: pure computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: an all-zero msghdr is valid; the fields used are set below,
    // the control buffer holds one header with `fds`.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as usize;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
        libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) > 0
    }
}

#[test]
fn a_connection_from_another_user_is_refused() {
    let test = "a_connection_from_another_user_is_refused";
    if !cross_user_possible(test) {
        return;
    }
    let other = other_user();
    let dir = TempDir::new("uid");
    chmod(&dir.0, 0o777);
    let run = dir.path("run");
    let mut cmd = self_command_over("peer", "uid_victim", "shm");
    cmd.env("SOFTRDMA_RUN_DIR", &run)
        .env("SOFTRDMA_TEST_DIR", &dir.0);
    let mut victim = Peer::spawn("uid-victim", cmd, &dir);
    let sock = wait_file(&dir.path("socket"), Duration::from_secs(60));
    // The attacker runs a copy of this binary any user may execute.
    let exe = dir.path("attacker-bin");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    chmod(&exe, 0o755);
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(self_args("peer"))
        .env(ROLE_ENV, "uid_attacker")
        .env("SOFTRDMA_TEST_SOCKET", sock.trim())
        .uid(other.0)
        .gid(other.1);
    hermetic(&mut cmd);
    // A copy just written can be "busy" for a moment: a child another test
    // thread forks meanwhile holds its descriptor until that child execs.
    for _ in 0..100 {
        match std::fs::File::open(&exe).and_then(|_| {
            std::process::Command::new(&exe)
                .arg("--list")
                .stdout(std::process::Stdio::null())
                .status()
        }) {
            Ok(_) => break,
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("cannot run the attacker's copy: {e}"),
        }
    }
    let mut attacker = Peer::spawn("uid-attacker", cmd, &dir);
    attacker.expect_success(Duration::from_secs(60));
    assert!(attacker.log().contains("ATTACKER: "), "{}", attacker.log());
    std::fs::write(dir.path("attacked"), "1\n").unwrap();
    victim.expect_success(Duration::from_secs(60));
    let log = victim.log();
    assert!(log.contains("VICTIM links 0 refused 1"), "{log}");
    assert!(
        log.contains("not as this user"),
        "the refusal names the other user: {log}"
    );
}
