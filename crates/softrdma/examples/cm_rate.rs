//! Connection setup rate: how many RC connections per second two devices
//! make and tear down through the IB connection manager (REQ, REP, RTU,
//! then DREQ, DREP), next to softrdma's own TCP exchange
//! (`softrdma::cm`: a text line each way, then RESET→RTS by hand) — the
//! figure `cmtime` reports for rdma_cm.
//!
//! ```text
//! cargo run --release -p softrdma --example cm_rate [-- CONNECTIONS]   # 1000
//! ```
//!
//! Both ends run in this process on two loopback devices (UDP), one thread
//! each; every wait is bounded. Each connection gets a fresh QP on both
//! sides, destroyed after its disconnect (timewait keeps only the CM's
//! record).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use softrdma::cm::{self, ConnInfo};
use softrdma::rdma_cm::{CmEvent, ConnParam, PortSpace};
use softrdma::{ConnectOptions, Context, DeviceConfig, Pd, Qp, QpType};

const PORT: u16 = 7472;
const TIMEOUT: Duration = Duration::from_secs(20);

fn device() -> softrdma::Result<Context> {
    let c = DeviceConfig::default_loopback().transport(softrdma::shm::Transport::Udp);
    Context::open_with(&c)
}

fn new_qp(pd: &Pd, cq: &softrdma::Cq) -> softrdma::Result<Qp> {
    pd.create_qp(QpType::Rc, cq, cq).build()
}

/// The next event `want` takes, within TIMEOUT.
fn wait(
    cm: &softrdma::rdma_cm::Cm,
    want: impl Fn(&CmEvent<SocketAddr>) -> bool,
) -> softrdma::Result<CmEvent<SocketAddr>> {
    let end = Instant::now() + TIMEOUT;
    while Instant::now() < end {
        if let Some(ev) = cm.get_event(Duration::from_millis(50))? {
            if want(&ev) {
                return Ok(ev);
            }
        }
    }
    Err(softrdma::Error::Timeout("a CM event".into()))
}

/// `n` connections through the IB CM; returns the time they took.
fn ib_cm(n: u32) -> softrdma::Result<Duration> {
    let (server, client) = (device()?, device()?);
    let ip = server.addr().ip();
    server.cm().listen(PortSpace::Tcp, PORT)?;
    let t = std::thread::spawn(move || -> softrdma::Result<()> {
        let (pd, cq) = (server.alloc_pd()?, server.create_cq(4)?);
        let cm = server.cm();
        for _ in 0..n {
            let qp = new_qp(&pd, &cq)?;
            let CmEvent::ConnectRequest { conn, .. } =
                wait(&cm, |e| matches!(e, CmEvent::ConnectRequest { .. }))?
            else {
                unreachable!()
            };
            cm.accept(conn, &qp, &ConnParam::default())?;
            wait(
                &cm,
                |e| matches!(e, CmEvent::Disconnected { conn: c, .. } if *c == conn),
            )?;
            cm.disconnect(conn, &[])?;
        }
        Ok(())
    });
    let (pd, cq) = (client.alloc_pd()?, client.create_cq(4)?);
    let cm = client.cm();
    let start = Instant::now();
    for _ in 0..n {
        let qp = new_qp(&pd, &cq)?;
        let conn = cm.connect(&qp, SocketAddr::new(ip, PORT), &ConnParam::default())?;
        wait(
            &cm,
            |e| matches!(e, CmEvent::Established { conn: c } if *c == conn),
        )?;
        cm.disconnect(conn, &[])?;
        wait(
            &cm,
            |e| matches!(e, CmEvent::Disconnected { conn: c, .. } if *c == conn),
        )?;
    }
    let took = start.elapsed();
    t.join().expect("the server thread")?;
    Ok(took)
}

/// `n` connections through softrdma's TCP exchange; returns the time they took.
fn tcp_exchange(n: u32) -> softrdma::Result<Duration> {
    let (server, client) = (device()?, device()?);
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| softrdma::Error::Io(e.to_string()))?;
    let addr = listener
        .local_addr()
        .map_err(|e| softrdma::Error::Io(e.to_string()))?;
    let (ready, go) = mpsc::channel();
    let t = std::thread::spawn(move || -> softrdma::Result<()> {
        let (pd, cq) = (server.alloc_pd()?, server.create_cq(4)?);
        ready.send(()).ok();
        for _ in 0..n {
            let qp = new_qp(&pd, &cq)?;
            let mine = ConnInfo {
                endpoint: qp.endpoint(),
                region: None,
            };
            let (_s, peer) = cm::accept(&listener, &mine)?;
            qp.connect(&peer.endpoint, &ConnectOptions::default())?;
        }
        Ok(())
    });
    go.recv_timeout(TIMEOUT).ok();
    let (pd, cq) = (client.alloc_pd()?, client.create_cq(4)?);
    let start = Instant::now();
    for _ in 0..n {
        let qp = new_qp(&pd, &cq)?;
        let mine = ConnInfo {
            endpoint: qp.endpoint(),
            region: None,
        };
        let (s, peer): (TcpStream, ConnInfo) = cm::connect(addr, &mine, TIMEOUT)?;
        qp.connect(&peer.endpoint, &ConnectOptions::default())?;
        drop(s);
    }
    let took = start.elapsed();
    t.join().expect("the server thread")?;
    Ok(took)
}

fn main() -> softrdma::Result<()> {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let cm = ib_cm(n)?;
    let tcp = tcp_exchange(n)?;
    let rate = |d: Duration| f64::from(n) / d.as_secs_f64();
    println!("connections: {n} (each: connect, established, disconnect; fresh QPs)");
    println!(
        "IB CM (REQ/REP/RTU + DREQ/DREP on QP1): {:.3} s, {:.0} connects/s, {:.1} µs each",
        cm.as_secs_f64(),
        rate(cm),
        cm.as_secs_f64() * 1e6 / f64::from(n)
    );
    println!(
        "softrdma TCP exchange (connect, one line each way, no teardown exchange): {:.3} s, {:.0} connects/s, {:.1} µs each",
        tcp.as_secs_f64(),
        rate(tcp),
        tcp.as_secs_f64() * 1e6 / f64::from(n)
    );
    println!(
        "ratio IB CM / TCP exchange (connects/s): {:.2}",
        rate(cm) / rate(tcp)
    );
    Ok(())
}
