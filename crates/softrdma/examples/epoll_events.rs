//! Completion channels with epoll: an event-driven echo server that
//! sleeps in `epoll_wait` until its completion channel fires, as an
//! `ibv_get_cq_event` loop (or an async runtime's reactor) does.
//!
//! ```text
//! cargo run -p softrdma --example epoll_events
//! ```
//!
//! The server's send and receive CQs share one channel; its fd is in an
//! epoll set. Each wake-up: take the event (`get_event` names the CQ), re-arm
//! that CQ (`req_notify`), then drain it — re-arming before draining is what
//! makes sure no completion is missed. The client, in another thread, sends
//! `ROUNDS` messages and waits for each echo.

use std::os::fd::RawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use softrdma::{
    AccessFlags, ConnectOptions, Context, DeviceConfig, QpEndpoint, QpType, RecvWr, SendOp, SendWr,
    WcOpcode,
};

const SIZE: usize = 64;
const TIMEOUT: Duration = Duration::from_secs(20);

/// What the server did.
#[derive(Debug, PartialEq, Eq)]
pub struct Report {
    /// Messages echoed back.
    pub echoed: usize,
    /// Times `epoll_wait` returned with the channel readable.
    pub wakeups: usize,
}

/// An epoll set holding one fd. The only unsafe code of the example.
struct Epoll(RawFd);

impl Epoll {
    fn watching(fd: RawFd) -> std::io::Result<Epoll> {
        // SAFETY: epoll_create1 takes no pointers.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let ep = Epoll(ep);
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call.
        if unsafe { libc::epoll_ctl(ep.0, libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(ep)
    }

    /// True when the fd became readable within `timeout`.
    fn wait(&self, timeout: Duration) -> std::io::Result<bool> {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: room for exactly the one event we ask for.
        let n = unsafe { libc::epoll_wait(self.0, &mut ev, 1, ms) };
        match n {
            n if n > 0 => Ok(true),
            0 => Ok(false),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
        }
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(self.0) };
    }
}

fn io(e: std::io::Error) -> softrdma::Error {
    softrdma::Error::Io(e.to_string())
}

/// The server: echoes `rounds` messages, sleeping in epoll between them.
fn serve(
    cfg: &DeviceConfig,
    rounds: usize,
    mine: mpsc::Sender<QpEndpoint>,
    theirs: mpsc::Receiver<QpEndpoint>,
) -> softrdma::Result<Report> {
    let ctx = Context::open_with(cfg)?;
    let pd = ctx.alloc_pd()?;
    let channel = ctx.create_comp_channel()?;
    let send_cq = ctx.create_cq_with_channel(16, &channel)?;
    let recv_cq = ctx.create_cq_with_channel(16, &channel)?;
    // Armed before anything can complete: arming does not signal for
    // completions already in the CQ (after a late arm, poll once).
    send_cq.req_notify(false)?;
    recv_cq.req_notify(false)?;
    let mr = pd.alloc_mr(2 * SIZE, AccessFlags::LOCAL_WRITE)?;
    let qp = pd.create_qp(QpType::Rc, &send_cq, &recv_cq).build()?;
    let o = ConnectOptions::default();
    // The receive goes in while the QP is in INIT, before the client knows
    // where to send.
    qp.init(&o)?;
    let recv = RecvWr {
        wr_id: 0,
        sg_list: vec![mr.sge(0, SIZE as u32)],
    };
    qp.post_recv(&recv)?;
    mine.send(qp.endpoint()).expect("the client waits for it");
    let peer = theirs
        .recv_timeout(TIMEOUT)
        .map_err(|_| softrdma::Error::Timeout("the client's endpoint".into()))?;
    qp.connect(&peer, &o)?;

    let epoll = Epoll::watching(channel.fd()).map_err(io)?;
    let mut report = Report {
        echoed: 0,
        wakeups: 0,
    };
    let deadline = Instant::now() + TIMEOUT;
    let mut wcs = Vec::new();
    while report.echoed < rounds {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(softrdma::Error::Timeout(format!(
                "epoll_events: {} of {rounds} echoed",
                report.echoed
            )));
        }
        if !epoll.wait(left).map_err(io)? {
            continue;
        }
        report.wakeups += 1;
        // The fd stays readable while events are pending: take them all
        // (`get_event` with no wait also clears the fd once none is left).
        while let Ok(cq) = channel.get_event(Some(Duration::ZERO)) {
            let cq = if cq == recv_cq.handle() {
                &recv_cq
            } else {
                &send_cq
            };
            cq.req_notify(false)?; // re-arm first, then drain
            wcs.clear();
            cq.poll(&mut wcs, 16)?;
            for wc in &wcs {
                if !wc.status.is_ok() {
                    return Err(softrdma::Error::Completion(wc.status, wc.wr_id));
                }
                match wc.opcode {
                    WcOpcode::Recv => {
                        // Echo from the second half, receive again in the first.
                        let mut msg = vec![0; wc.byte_len as usize];
                        mr.read(0, &mut msg)?;
                        mr.write(SIZE, &msg)?;
                        qp.post_recv(&recv)?;
                        let sge = mr.sge(SIZE as u64, msg.len() as u32);
                        qp.post_send(&SendWr::new(1, SendOp::Send, vec![sge]))?;
                    }
                    _ => report.echoed += 1,
                }
            }
        }
    }
    Ok(report)
}

/// The client: sends `rounds` messages, each after the previous echo.
fn client(
    cfg: &DeviceConfig,
    rounds: usize,
    mine: mpsc::Sender<QpEndpoint>,
    theirs: mpsc::Receiver<QpEndpoint>,
) -> softrdma::Result<Vec<String>> {
    let ctx = Context::open_with(cfg)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16)?;
    let mr = pd.alloc_mr(2 * SIZE, AccessFlags::LOCAL_WRITE)?;
    let qp = pd.create_qp(QpType::Rc, &cq, &cq).build()?;
    let o = ConnectOptions::default();
    qp.init(&o)?;
    let recv = RecvWr {
        wr_id: 0,
        sg_list: vec![mr.sge(SIZE as u64, SIZE as u32)],
    };
    qp.post_recv(&recv)?;
    let peer = theirs
        .recv_timeout(TIMEOUT)
        .map_err(|_| softrdma::Error::Timeout("the server's endpoint".into()))?;
    mine.send(qp.endpoint()).expect("the server waits for it");
    qp.connect(&peer, &o)?;
    let mut echoes = Vec::new();
    for i in 0..rounds {
        let text = format!("ping {i}");
        mr.write(0, text.as_bytes())?;
        let sge = mr.sge(0, text.len() as u32);
        qp.post_send(&SendWr::new(1, SendOp::Send, vec![sge]))?;
        // One send and one receive completion, in either order.
        let mut back = None;
        for wc in cq.wait(2, TIMEOUT)? {
            if !wc.status.is_ok() {
                return Err(softrdma::Error::Completion(wc.status, wc.wr_id));
            }
            if wc.opcode == WcOpcode::Recv {
                let mut b = vec![0; wc.byte_len as usize];
                mr.read(SIZE, &mut b)?;
                back = Some(String::from_utf8_lossy(&b).into_owned());
            }
        }
        qp.post_recv(&recv)?;
        echoes.push(back.ok_or_else(|| softrdma::Error::Timeout("no echo".into()))?);
    }
    Ok(echoes)
}

/// Runs the server and a client for `rounds` round trips; returns the
/// server's report and what the client got back.
pub fn run(cfg: &DeviceConfig, rounds: usize) -> softrdma::Result<(Report, Vec<String>)> {
    let (to_client, from_server) = mpsc::channel();
    let (to_server, from_client) = mpsc::channel();
    std::thread::scope(|s| {
        let server = s.spawn(|| serve(cfg, rounds, to_client, from_client));
        let echoes = client(cfg, rounds, to_server, from_server);
        let report = server.join().expect("the server thread does not panic");
        Ok((report?, echoes?))
    })
}

fn main() {
    match run(&DeviceConfig::default_loopback(), 100) {
        Ok((r, echoes)) => println!(
            "{} echoes (last {:?}), {} epoll wake-ups",
            r.echoed,
            echoes.last(),
            r.wakeups
        ),
        Err(e) => {
            eprintln!("epoll_events: {e}");
            std::process::exit(1);
        }
    }
}
