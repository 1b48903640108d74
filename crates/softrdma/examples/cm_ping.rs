//! A connection made by the IB connection manager, then one message each
//! way — the exchange of rdma-core's `rdma_server` / `rdma_client`
//! examples, so either end may be one of those (over the Linux kernel's
//! rdma_cm, as in interop/rxe) and the other this program.
//!
//! ```text
//! cargo run -p softrdma --example cm_ping                        # both ends here
//! cargo run -p softrdma --example cm_ping -- server [-p PORT]    # rdma_server (port 7471)
//! cargo run -p softrdma --example cm_ping -- client ADDR [-p PORT]
//! ```
//!
//! The server listens on PORT of the TCP port space, posts a 16-byte
//! receive, accepts, waits for the client's message, answers with its own,
//! and disconnects. The client connects, posts its receive, sends 16
//! bytes, and waits for the answer and the disconnect. Each end uses the
//! default device (SOFTRDMA_DEVICES, else `srx0` on a free 127.0.0.N) and
//! prints what it received; every wait is bounded.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use softrdma::rdma_cm::{Cm, CmEvent, ConnId, ConnParam, PortSpace};
use softrdma::{AccessFlags, Context, Cq, DeviceConfig, Mr, Qp, QpType, RecvWr, SendOp, SendWr};

const PORT: u16 = 7471;
const TIMEOUT: Duration = Duration::from_secs(20);
const MSG: u32 = 16;

struct End {
    cm: Cm,
    cq: Cq,
    mr: Mr,
    qp: Qp,
}

fn end(ctx: &Context) -> softrdma::Result<End> {
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(8)?;
    // [0, 16): what we send; [16, 32): where we receive.
    let mr = pd.alloc_mr(2 * MSG as usize, AccessFlags::LOCAL_WRITE)?;
    let qp = pd.create_qp(QpType::Rc, &cq, &cq).build()?;
    Ok(End {
        cm: ctx.cm(),
        cq,
        mr,
        qp,
    })
}

/// The next CM event that `want` takes (others are reported and skipped).
fn wait_event(
    cm: &Cm,
    what: &str,
    want: impl Fn(&CmEvent<SocketAddr>) -> bool,
) -> softrdma::Result<CmEvent<SocketAddr>> {
    let end = Instant::now() + TIMEOUT;
    while Instant::now() < end {
        match cm.get_event(Duration::from_millis(100))? {
            Some(ev) if want(&ev) => return Ok(ev),
            Some(ev) => {
                if let CmEvent::Rejected { reason, .. } = &ev {
                    return Err(softrdma::Error::Config(format!(
                        "rejected: {reason:?} while waiting for {what}"
                    )));
                }
                if matches!(ev, CmEvent::Unreachable { .. }) {
                    return Err(softrdma::Error::Timeout(format!(
                        "unreachable while waiting for {what}"
                    )));
                }
                eprintln!("cm_ping: {ev:?} while waiting for {what}");
            }
            None => {}
        }
    }
    Err(softrdma::Error::Timeout(what.into()))
}

fn post_receive(e: &End) -> softrdma::Result<()> {
    e.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: vec![e.mr.sge(MSG.into(), MSG)],
    })
}

fn send(e: &End, text: &[u8; MSG as usize]) -> softrdma::Result<()> {
    e.mr.write(0, text)?;
    e.qp.post_send(&SendWr::new(2, SendOp::Send, vec![e.mr.sge(0, MSG)]))?;
    e.cq.wait_ok(TIMEOUT).map(|_| ())
}

fn received(e: &End) -> softrdma::Result<Vec<u8>> {
    let wc = e.cq.wait_ok(TIMEOUT)?;
    let mut got = vec![0u8; wc.byte_len as usize];
    e.mr.read(MSG as usize, &mut got)?;
    Ok(got)
}

fn is_established(c: ConnId) -> impl Fn(&CmEvent<SocketAddr>) -> bool {
    move |e| matches!(e, CmEvent::Established { conn } if *conn == c)
}

fn is_disconnected(e: &CmEvent<SocketAddr>) -> bool {
    matches!(e, CmEvent::Disconnected { .. })
}

/// rdma_server's side: one connection, one message each way. Returns the
/// message received.
pub fn server(ctx: &Context, port: u16) -> softrdma::Result<Vec<u8>> {
    let e = end(ctx)?;
    e.cm.listen(PortSpace::Tcp, port)?;
    println!("cm_ping: listening on {} port {port}", ctx.addr().ip());
    let CmEvent::ConnectRequest { conn, peer, .. } =
        wait_event(&e.cm, "a connection request", |ev| {
            matches!(ev, CmEvent::ConnectRequest { .. })
        })?
    else {
        unreachable!()
    };
    e.cm.accept(conn, &e.qp, &ConnParam::default())?;
    post_receive(&e)?;
    wait_event(&e.cm, "established", is_established(conn))?;
    let got = received(&e)?;
    println!("cm_ping: {} bytes from {}", got.len(), peer.ip());
    send(&e, b"softrdma server\0")?;
    e.cm.disconnect(conn, &[])?;
    wait_event(&e.cm, "the disconnect", is_disconnected)?;
    Ok(got)
}

/// rdma_client's side. Returns the answer received.
pub fn client(ctx: &Context, addr: IpAddr, port: u16) -> softrdma::Result<Vec<u8>> {
    let e = end(ctx)?;
    let conn =
        e.cm.connect(&e.qp, SocketAddr::new(addr, port), &ConnParam::default())?;
    // The QP is in INIT once connect returns: the receive can wait there.
    post_receive(&e)?;
    wait_event(&e.cm, "established", is_established(conn))?;
    send(&e, b"softrdma client\0")?;
    let got = received(&e)?;
    println!("cm_ping: {} bytes back from {addr}", got.len());
    // rdma_server disconnects after its answer; answer its DREQ.
    if wait_event(&e.cm, "the disconnect", is_disconnected).is_ok() {
        e.cm.disconnect(conn, &[])?;
    } else {
        e.cm.disconnect(conn, &[])?;
        wait_event(&e.cm, "the disconnect", is_disconnected)?;
    }
    Ok(got)
}

/// Both ends in this process, on two devices made from `cfg`: returns what
/// the server and the client received.
pub fn run_local(cfg: &DeviceConfig, port: u16) -> softrdma::Result<(Vec<u8>, Vec<u8>)> {
    let s = Context::open_with(cfg)?;
    let c = Context::open_with(cfg)?;
    let ip = s.addr().ip();
    let t = std::thread::spawn(move || server(&s, port));
    // The listener is up before the REQ leaves (a REQ before it is rejected).
    std::thread::sleep(Duration::from_millis(200));
    let answer = client(&c, ip, port)?;
    let request = t.join().expect("the server thread")?;
    Ok((request, answer))
}

fn port_of(args: &[String]) -> u16 {
    args.iter()
        .position(|a| a == "-p")
        .and_then(|i| args.get(i + 1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(PORT)
}

fn main() -> softrdma::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let port = port_of(&args);
    match args.first().map(String::as_str) {
        Some("server") => server(&Context::open_default()?, port).map(|_| ()),
        Some("client") => {
            let addr: IpAddr = args.get(1).and_then(|a| a.parse().ok()).ok_or_else(|| {
                softrdma::Error::Config("client needs the server's IP address".into())
            })?;
            client(&Context::open_default()?, addr, port).map(|_| ())
        }
        Some(other) => Err(softrdma::Error::Config(format!(
            "unknown mode {other:?}: use server [-p PORT] or client ADDR [-p PORT]"
        ))),
        None => {
            run_local(&DeviceConfig::default_loopback(), port)?;
            println!("cm_ping: ok");
            Ok(())
        }
    }
}
