//! RC ping-pong: SEND/RECV round trips over a reliable connection, with the
//! QPs exchanged over TCP by `softrdma::cm` (like `ibv_rc_pingpong`).
//!
//! ```text
//! cargo run -p softrdma --example rc_pingpong                      # both ends here
//! cargo run -p softrdma --example rc_pingpong -- server [PORT]     # waits on TCP PORT (18515)
//! cargo run -p softrdma --example rc_pingpong -- client HOST[:PORT]
//! ```
//!
//! Options after the mode: `--iters N` (1000), `--size BYTES` (64). The server
//! and client use the default device: SOFTRDMA_DEVICES, else `srx0` on the
//! first free 127.0.0.N. With no arguments both ends run in this process, on
//! two loopback devices, connected through a TCP socket on 127.0.0.1.

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use softrdma::cm::{self, ConnInfo};
use softrdma::{
    AccessFlags, ConnectOptions, Context, DeviceConfig, QpType, RecvWr, SendOp, SendWr, WcOpcode,
};

const PORT: u16 = 18515;
const TIMEOUT: Duration = Duration::from_secs(10);

/// One end of the ping-pong over a connected TCP `stream`. The client sends
/// the pings; the server answers each with a pong. Returns the time taken.
pub fn pingpong(
    ctx: &Context,
    stream: &mut TcpStream,
    client: bool,
    iters: u32,
    size: u32,
) -> softrdma::Result<Duration> {
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16)?;
    // [0, size): what we send; [size, 2 size): where we receive.
    let mr = pd.alloc_mr(2 * size as usize, AccessFlags::LOCAL_WRITE)?;
    let qp = pd.create_qp(QpType::Rc, &cq, &cq).build()?;
    let peer = cm::exchange(
        stream,
        &ConnInfo {
            endpoint: qp.endpoint(),
            region: None,
        },
    )?;
    qp.connect(&peer.endpoint, &ConnectOptions::default())?;
    let recv = RecvWr {
        wr_id: 0,
        sg_list: vec![mr.sge(size.into(), size)],
    };
    qp.post_recv(&recv)?;
    cm::sync(stream)?; // both ends are connected and have a receive posted

    let send = SendWr::new(1, SendOp::Send, vec![mr.sge(0, size)]);
    let start = Instant::now();
    let (mut to_send, mut sent, mut received) = (iters, 0, 0);
    if client {
        qp.post_send(&send)?;
        to_send -= 1;
    }
    while sent < iters || received < iters {
        let wc = cq.wait(1, TIMEOUT)?.remove(0);
        if !wc.status.is_ok() {
            return Err(softrdma::Error::Completion(wc.status, wc.wr_id));
        }
        if wc.opcode == WcOpcode::Send {
            sent += 1;
            continue;
        }
        received += 1;
        if received < iters {
            qp.post_recv(&recv)?; // before answering: the next message needs it
        }
        if to_send > 0 {
            qp.post_send(&send)?;
            to_send -= 1;
        }
    }
    Ok(start.elapsed())
}

/// Both ends in this process: a server thread and a client, each on its own
/// loopback device. Returns the client's time.
pub fn run_local(cfg: &DeviceConfig, iters: u32, size: u32) -> softrdma::Result<Duration> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io)?;
    let addr = listener.local_addr().map_err(io)?;
    let server_cfg = cfg.clone();
    let server = std::thread::spawn(move || -> softrdma::Result<Duration> {
        let ctx = Context::open_with(&server_cfg)?;
        let (mut s, _) = listener.accept().map_err(io)?;
        pingpong(&ctx, &mut s, false, iters, size)
    });
    let ctx = Context::open_with(cfg)?;
    let mut s = TcpStream::connect(addr).map_err(io)?;
    let t = pingpong(&ctx, &mut s, true, iters, size);
    drop(s); // unblocks a server still waiting for us
    let st = server.join().expect("server thread panicked");
    let t = t?;
    st?;
    Ok(t)
}

fn io(e: std::io::Error) -> softrdma::Error {
    softrdma::Error::Io(e.to_string())
}

fn server(port: u16, iters: u32, size: u32) -> softrdma::Result<Duration> {
    let ctx = Context::open_default()?;
    let l = TcpListener::bind(("0.0.0.0", port)).map_err(io)?;
    println!(
        "{} at {}: waiting on TCP port {port}",
        ctx.name(),
        ctx.addr()
    );
    let (mut s, _) = l.accept().map_err(io)?;
    pingpong(&ctx, &mut s, false, iters, size)
}

fn client(host: &str, iters: u32, size: u32) -> softrdma::Result<Duration> {
    let addr = if host.contains(':') && !host.ends_with(']') {
        host.to_string()
    } else {
        format!("{host}:{PORT}")
    };
    let ctx = Context::open_default()?;
    let start = Instant::now();
    let mut s = loop {
        match TcpStream::connect(addr.as_str()) {
            Ok(s) => break s,
            // The server may still be starting.
            Err(_) if start.elapsed() < TIMEOUT => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => return Err(softrdma::Error::Io(format!("{addr}: {e}"))),
        }
    };
    pingpong(&ctx, &mut s, true, iters, size)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str, default: u32| {
        let i = args.iter().position(|a| a == name);
        i.and_then(|i| args.get(i + 1)?.parse().ok())
            .unwrap_or(default)
    };
    let (iters, size) = (opt("--iters", 1000), opt("--size", 64));
    let arg1 = args.get(1).filter(|a| !a.starts_with("--"));
    let r = match args.first().map(String::as_str) {
        None | Some("--iters" | "--size") => {
            run_local(&DeviceConfig::default_loopback(), iters, size)
        }
        Some("server") => server(
            arg1.and_then(|p| p.parse().ok()).unwrap_or(PORT),
            iters,
            size,
        ),
        Some("client") => client(arg1.map_or("127.0.0.1", |h| h.as_str()), iters, size),
        Some(other) => {
            eprintln!("usage: rc_pingpong [server [PORT] | client HOST[:PORT]] [--iters N] [--size BYTES]; not {other:?}");
            std::process::exit(2);
        }
    };
    match r {
        Ok(t) => println!(
            "{iters} round trips of {size} bytes in {t:.2?}: {:.2?} each",
            t / iters
        ),
        Err(e) => {
            eprintln!("rc_pingpong: {e}");
            std::process::exit(1);
        }
    }
}
