//! Two processes on loopback: this test binary re-executes itself as the
//! peer (`SOFTRDMA_TEST_ROLE`), the two exchange QPs through
//! `softrdma::cm` over TCP on 127.0.0.1, and every operation runs on every
//! QP type that supports it, at every interesting size, verified byte for
//! byte on the receiving side.

mod common;

use std::net::TcpListener;
use std::time::Duration;

use common::*;
use softrdma::*;

/// Entry point of the re-executed peer; returns at once in a normal run.
#[test]
fn peer() {
    let Some(role) = role() else { return };
    match role.as_str() {
        "responder" | "requester" => matrix_peer(&role),
        "victim" => victim(),
        other => panic!("unknown role {other}"),
    }
}

/// Starts a responder peer and connects `side` to it.
fn start_responder(side: &Side, dir: &TempDir) -> (Peer, Remote, Ctl) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cmd = self_command("peer", "responder");
    cmd.env(CM_ENV, format!("connect:{}", l.local_addr().unwrap()));
    let mut peer = Peer::spawn("responder", cmd, dir);
    let mut stream = accept_bounded(&l, Duration::from_secs(30), Some(&mut peer));
    let remote = side.connect(&mut stream, &ConnectOptions::default());
    (peer, remote, Ctl::new(stream))
}

#[test]
fn every_operation_and_size_between_two_processes() {
    let dir = TempDir::new("matrix");
    let ctx = Context::open_with(&udp_loopback()).unwrap();
    let side = Side::open(ctx, SIDE_MR_LEN);
    let (mut peer, remote, mut ctl) = start_responder(&side, &dir);
    assert_ne!(
        remote.rc.gid,
        side.ctx.gid(),
        "the peer has its own address"
    );
    assert_eq!(remote.mtu, 4096, "loopback path MTU");
    let plan = full_plan(remote.mtu);
    run_requester(&side, &remote, &mut ctl, &plan);
    peer.expect_success(Duration::from_secs(30));
    let c = side.ctx.counters();
    assert_eq!((c.icrc_errors, c.malformed), (0, 0), "{c:?}");
}

/// The victim of `killed_peer_*`: connects, says ready, then waits to be killed.
fn victim() {
    let ctx = Context::open_default().unwrap();
    let side = Side::open(ctx, 1 << 20);
    let mut stream = peer_stream();
    let _remote = side.connect(&mut stream, &ConnectOptions::default());
    let mut ctl = Ctl::new(stream);
    ctl.send("ready");
    let m = ctl.recv();
    panic!("the victim was not killed (got {m:?})");
}

/// A peer killed with SIGKILL in the middle of a transfer: the survivor's
/// outstanding WRs complete, the first with RETRY_EXC_ERR and the rest with
/// WR_FLUSH_ERR, within (retry_cnt + 1) local ACK timeouts; nothing hangs.
#[test]
fn killed_peer_fails_outstanding_work_within_timeout_and_retry_count() {
    const WRS: u64 = 32;
    const LEN: u32 = 1 << 20;
    let dir = TempDir::new("kill");
    let side = Side::open(Context::open_with(&udp_loopback()).unwrap(), LEN as usize);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cmd = self_command("peer", "victim");
    cmd.env(CM_ENV, format!("connect:{}", l.local_addr().unwrap()));
    let mut peer = Peer::spawn("victim", cmd, &dir);
    let mut stream = accept_bounded(&l, Duration::from_secs(30), Some(&mut peer));
    // timeout 10: 4.096 µs × 2^10 ≈ 4.2 ms per try; 3 retries.
    let o = ConnectOptions {
        timeout: 10,
        retry_cnt: 3,
        ..Default::default()
    };
    let ack_timeout = Duration::from_nanos(4096 << 10);
    let remote = side.connect(&mut stream, &o);
    let mut ctl = Ctl::new(stream);
    ctl.expect("ready");

    let r = remote.region;
    for i in 0..WRS {
        let op = SendOp::Write {
            remote_addr: r.addr,
            rkey: r.rkey,
        };
        side.rc
            .post_send(&SendWr::new(i, op, vec![side.mr.sge(0, LEN)]))
            .unwrap();
    }
    let first = side.scq.wait_ok(OP_TIMEOUT).unwrap();
    assert_eq!(first.wr_id, 0);
    peer.signal(libc::SIGKILL);
    let killed = std::time::Instant::now();
    let status = peer.wait(Duration::from_secs(10));
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );

    // Collect the other WRs' completions, noting when the error came.
    let mut wcs = vec![first];
    let mut failed_after = None;
    while (wcs.len() as u64) < WRS {
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "only {} of {WRS} completions 10 s after the kill: {wcs:?}",
            wcs.len()
        );
        if let Some(wc) = side.scq.poll_one().unwrap() {
            if wc.status == WcStatus::RetryExcErr && failed_after.is_none() {
                failed_after = Some(killed.elapsed());
            }
            wcs.push(wc);
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..WRS).collect::<Vec<_>>(), "completions in order");
    let ok = wcs.iter().take_while(|w| w.status.is_ok()).count();
    assert!(ok < WRS as usize - 1, "the transfer was cut short: {wcs:?}");
    assert_eq!(wcs[ok].status, WcStatus::RetryExcErr, "{:?}", wcs[ok]);
    for w in &wcs[ok + 1..] {
        assert_eq!(w.status, WcStatus::WrFlushErr, "{w:?}");
    }
    let t = failed_after.unwrap();
    let bound = ack_timeout * (u32::from(o.retry_cnt) + 1);
    eprintln!(
        "{ok} WRs completed before the kill; RETRY_EXC_ERR {t:?} after it \
         (nominal {bound:?}); {:?}",
        side.rc.counters()
    );
    assert!(
        t >= ack_timeout * 2,
        "failed after {t:?}: sooner than the retries allow"
    );
    assert!(
        t <= bound + Duration::from_millis(250),
        "failed after {t:?}: later than {} tries of {ack_timeout:?} (+250 ms slack)",
        o.retry_cnt + 1
    );
    let c = side.rc.counters();
    assert!(c.timeouts >= u64::from(o.retry_cnt), "{c:?}");
    assert!(c.retransmits > 0, "{c:?}");
    assert_eq!(side.rc.state(), QpState::Err);

    // A WR posted to the dead connection is flushed at once.
    side.rc
        .post_send(&SendWr::new(
            99,
            SendOp::Write {
                remote_addr: r.addr,
                rkey: r.rkey,
            },
            vec![side.mr.sge(0, 8)],
        ))
        .unwrap();
    let wc = side.scq.wait(1, Duration::from_secs(1)).unwrap()[0];
    assert_eq!((wc.wr_id, wc.status), (99, WcStatus::WrFlushErr));
}

/// As root, the device's socket buffers go past net.core.rmem_max (SO_*FORCE):
/// a large UC/UD burst otherwise overflows them whenever the receiver lags.
#[test]
fn socket_buffers_pass_rmem_max_when_root() {
    if !is_root() || which("ss").is_none() {
        return skip("socket buffers", "needs root and ss (iproute2)");
    }
    let rmem_max: u64 = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let ctx = Context::open_with(&udp_loopback()).unwrap();
    let mut ss = std::process::Command::new("ss");
    ss.args(["-uanm", "src", &ctx.addr().to_string()]);
    let text = run_bounded(&mut ss, Duration::from_secs(30)).stdout;
    let rb: u64 = text
        .split("rb")
        .nth(1)
        .and_then(|s| s.split(',').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no receive buffer size in ss output: {text}"));
    // The kernel doubles what it is given; plain SO_RCVBUF stops at 2 × rmem_max.
    if rb <= 2 * rmem_max && rmem_max >= 8 << 20 {
        return skip("socket buffers", "rmem_max is already large");
    }
    assert!(
        rb > 2 * rmem_max,
        "receive buffer {rb} B is capped by rmem_max ({rmem_max} B): {text}"
    );
}
