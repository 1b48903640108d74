//! No busy CPU when idle: with devices open and an RC connection up, the
//! process uses (almost) no CPU while nothing happens — also while an
//! application thread is blocked in `CompChannel::get_event`, or in poll
//! on the channel's fd after taking an event — and a blocked thread still
//! wakes up when a completion arrives.
//!
//! One test function only: tests of one binary run in parallel threads of
//! the same process, and would be counted here.

mod common;

use std::time::{Duration, Instant};

use common::*;
use softrdma::shm::Transport;
use softrdma::*;

/// User + system CPU time of the whole process (all threads).
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we pass; checked below.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let r = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(r, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU time the process uses during `f` and the wall time it takes.
fn measure(f: impl FnOnce()) -> (Duration, Duration) {
    let (c0, t0) = (cpu_time(), Instant::now());
    f();
    (cpu_time() - c0, t0.elapsed())
}

/// Less than 1% of one core.
fn assert_idle(what: &str, cpu: Duration, wall: Duration) {
    eprintln!("{what}: {cpu:?} CPU in {wall:?}");
    assert!(
        cpu * 100 < wall,
        "{what}: {cpu:?} of CPU in {wall:?} (limit 1%)"
    );
}

fn idle_with(transport: Transport) {
    let cfg = || udp_loopback().transport(transport);
    let a = Context::open_with(&cfg()).unwrap();
    let b = Context::open_with(&cfg()).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let ca = a.create_cq(16).unwrap();
    let ch = b.create_comp_channel().unwrap();
    let cb = b.create_cq_with_channel(16, &ch).unwrap();
    let ma = pa.alloc_mr(4096, access()).unwrap();
    let mb = pb.alloc_mr(4096, access()).unwrap();
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb = pb.create_qp(QpType::Rc, &cb, &cb).build().unwrap();
    qa.connect(&qb.endpoint(), &ConnectOptions::default())
        .unwrap();
    qb.connect(&qa.endpoint(), &ConnectOptions::default())
        .unwrap();
    let send = |id| {
        qb.post_recv(&RecvWr {
            wr_id: id,
            sg_list: vec![mb.sge(0, 64)],
        })
        .unwrap();
        qa.post_send(&SendWr::new(id, SendOp::Send, vec![ma.sge(0, 64)]))
            .unwrap();
    };
    // Warm up: one message each way of the connection, acknowledged.
    send(1);
    ca.wait_ok(OP_TIMEOUT).unwrap();
    cb.wait_ok(OP_TIMEOUT).unwrap();
    std::thread::sleep(Duration::from_millis(200));

    let (cpu, wall) = measure(|| std::thread::sleep(Duration::from_secs(1)));
    assert_idle(&format!("{transport:?}: idle, RC connected"), cpu, wall);

    // An application thread blocked in get_event.
    cb.req_notify(false).unwrap();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let t = Instant::now();
            let ev = ch.get_event(Some(Duration::from_secs(20)));
            (ev, t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(100));
        let (cpu, wall) = measure(|| std::thread::sleep(Duration::from_secs(1)));
        assert!(!waiter.is_finished(), "get_event returned early");
        assert_idle(
            &format!("{transport:?}: a thread blocked in get_event"),
            cpu,
            wall,
        );
        let woke = Instant::now();
        send(2);
        let (ev, _) = waiter.join().unwrap();
        assert_eq!(ev.unwrap(), cb.handle(), "the event names the CQ");
        eprintln!(
            "{transport:?}: get_event woke {:?} after the send",
            woke.elapsed()
        );
    });
    ca.wait_ok(OP_TIMEOUT).unwrap();
    assert_eq!(cb.wait_ok(OP_TIMEOUT).unwrap().wr_id, 2);

    // The channel fd in an epoll loop (docs/api.md): once the event is
    // taken, the fd must not stay readable, or the loop spins.
    cb.req_notify(false).unwrap();
    send(3);
    ca.wait_ok(OP_TIMEOUT).unwrap();
    let (cpu, wall) = measure(|| {
        let mut events = 0;
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(1) {
            let left = Duration::from_secs(1).saturating_sub(t.elapsed());
            let mut p = libc::pollfd {
                fd: ch.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut p, 1, left.as_millis() as i32) } > 0
                && ch.get_event(Some(Duration::ZERO)).is_ok()
            {
                events += 1;
                cb.req_notify(false).unwrap();
            }
        }
        assert_eq!(events, 1, "one completion, one event");
    });
    assert_idle(
        &format!("{transport:?}: an epoll-style loop on the channel fd"),
        cpu,
        wall,
    );
    assert_eq!(cb.wait_ok(OP_TIMEOUT).unwrap().wr_id, 3);
}

#[test]
fn no_busy_cpu_when_idle() {
    // RoCEv2/UDP, then the default same-host transport (shared memory).
    idle_with(Transport::Udp);
    idle_with(Transport::Auto);
}
