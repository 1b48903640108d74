//! A UD datagram server: one UD QP answers requests from any number of
//! clients, replying to whoever sent each one — no connections, no
//! multicast.
//!
//! ```text
//! cargo run -p softrdma --example ud_server
//! ```
//!
//! The server publishes one endpoint (GID, QP number, Q_Key). A request's
//! completion says who sent it: the sender's GID (`sgid`, from the GRH) and
//! QP number (`src_qp`). The server makes an address handle for each new
//! GID (and keeps it: creating one per reply would be wasteful), and
//! replies to `src_qp` with the Q_Key every QP of the service uses. Each
//! receive buffer starts with the 40-byte GRH. Here the server runs in a
//! thread and three clients, on another device, send `REQUESTS` requests
//! each; the server answers each with the text upper-cased.

use std::collections::hash_map::{Entry, HashMap};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use softrdma::{
    AccessFlags, Ah, Context, DeviceConfig, Gid, QpEndpoint, QpType, RecvWr, SendOp, SendWr,
    UdDest, WcOpcode, GRH_LEN,
};

/// The Q_Key of the service: the server and its clients all use it.
const QKEY: u32 = 0x5eed_0001;
const CLIENTS: usize = 3;
const REQUESTS: usize = 10;
const RECVS: usize = 16;
const SLOT: usize = GRH_LEN + 256;
const TIMEOUT: Duration = Duration::from_secs(20);

/// Serves `total` requests, then returns how many distinct peers it saw.
fn serve(
    cfg: &DeviceConfig,
    total: usize,
    publish: mpsc::Sender<QpEndpoint>,
) -> softrdma::Result<usize> {
    let ctx = Context::open_with(cfg)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(2 * RECVS as u32)?;
    let mr = pd.alloc_mr(2 * RECVS * SLOT, AccessFlags::LOCAL_WRITE)?;
    let mut qp = pd
        .create_qp(QpType::Ud, &cq, &cq)
        .max_recv_wr(RECVS as u32)
        .build()?;
    qp.set_qkey(QKEY);
    qp.ready_ud()?;
    // Receive slots [0, RECVS); reply buffers [RECVS, 2 RECVS), one per slot.
    let post = |slot: usize| {
        qp.post_recv(&RecvWr {
            wr_id: slot as u64,
            sg_list: vec![mr.sge((slot * SLOT) as u64, SLOT as u32)],
        })
    };
    for slot in 0..RECVS {
        post(slot)?;
    }
    publish
        .send(qp.endpoint())
        .expect("the clients wait for it");

    let mut ahs: HashMap<Gid, Ah> = HashMap::new();
    let (mut answered, mut sent, mut wcs) = (0, 0, Vec::new());
    let deadline = Instant::now() + TIMEOUT;
    // Until every request is answered and every reply has left.
    while answered < total || sent < total {
        if Instant::now() > deadline {
            return Err(softrdma::Error::Timeout(format!(
                "ud_server: {answered} of {total} requests answered, {sent} replies sent"
            )));
        }
        wcs.clear();
        cq.poll(&mut wcs, 16)?;
        for wc in &wcs {
            if !wc.status.is_ok() {
                return Err(softrdma::Error::Completion(wc.status, wc.wr_id));
            }
            if wc.opcode != WcOpcode::Recv {
                sent += 1; // a reply went out
                continue;
            }
            let slot = wc.wr_id as usize;
            let mut request = vec![0; wc.byte_len as usize - GRH_LEN];
            mr.read(slot * SLOT + GRH_LEN, &mut request)?;
            post(slot)?; // the slot is free again
            let reply = request.to_ascii_uppercase();
            let at = (RECVS + slot) * SLOT;
            mr.write(at, &reply)?;
            let ah = match ahs.entry(wc.sgid) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => e.insert(pd.create_ah(wc.sgid)?),
            };
            let mut wr = SendWr::new(
                slot as u64,
                SendOp::Send,
                vec![mr.sge(at as u64, reply.len() as u32)],
            );
            wr.ud = Some(UdDest {
                ah: ah.handle(),
                remote_qpn: wc.src_qp,
                remote_qkey: QKEY,
            });
            qp.post_send(&wr)?;
            answered += 1;
        }
    }
    Ok(ahs.len())
}

/// One client: sends its requests one at a time; returns the replies.
fn ask(ctx: &Context, server: &QpEndpoint, who: usize) -> softrdma::Result<Vec<String>> {
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(8)?;
    let mr = pd.alloc_mr(2 * SLOT, AccessFlags::LOCAL_WRITE)?;
    let mut qp = pd.create_qp(QpType::Ud, &cq, &cq).build()?;
    qp.set_qkey(QKEY);
    qp.ready_ud()?;
    let ah = pd.create_ah(server.gid)?;
    let mut replies = Vec::new();
    for i in 0..REQUESTS {
        // The receive for the reply goes in before the request goes out.
        qp.post_recv(&RecvWr {
            wr_id: 0,
            sg_list: vec![mr.sge(SLOT as u64, SLOT as u32)],
        })?;
        let text = format!("request {i} from client {who}");
        mr.write(0, text.as_bytes())?;
        let mut wr = SendWr::new(1, SendOp::Send, vec![mr.sge(0, text.len() as u32)]);
        wr.ud = Some(UdDest {
            ah: ah.handle(),
            remote_qpn: server.qpn,
            remote_qkey: server.qkey,
        });
        qp.post_send(&wr)?;
        for wc in cq.wait(2, TIMEOUT)? {
            if !wc.status.is_ok() {
                return Err(softrdma::Error::Completion(wc.status, wc.wr_id));
            }
            if wc.opcode == WcOpcode::Recv {
                assert_eq!((wc.src_qp, wc.sgid), (server.qpn, server.gid));
                let mut b = vec![0; wc.byte_len as usize - GRH_LEN];
                mr.read(SLOT + GRH_LEN, &mut b)?;
                replies.push(String::from_utf8_lossy(&b).into_owned());
            }
        }
    }
    Ok(replies)
}

/// Runs the server and `CLIENTS` clients; returns each client's replies
/// and the number of peers (GIDs) the server made address handles for.
pub fn run(cfg: &DeviceConfig) -> softrdma::Result<(Vec<Vec<String>>, usize)> {
    let (publish, endpoint) = mpsc::channel();
    std::thread::scope(|s| {
        let server = s.spawn(|| serve(cfg, CLIENTS * REQUESTS, publish));
        let clients = (|| {
            let ep = endpoint
                .recv_timeout(TIMEOUT)
                .map_err(|_| softrdma::Error::Timeout("the server's endpoint".into()))?;
            // All clients on one device: one GID, several QPs.
            let ctx = Context::open_with(cfg)?;
            let asks: Vec<_> = (0..CLIENTS)
                .map(|who| {
                    let (ctx, ep) = (ctx.clone(), ep);
                    s.spawn(move || ask(&ctx, &ep, who))
                })
                .collect();
            asks.into_iter()
                .map(|h| h.join().expect("a client thread does not panic"))
                .collect::<softrdma::Result<Vec<_>>>()
        })();
        let peers = server.join().expect("the server thread does not panic");
        Ok((clients?, peers?))
    })
}

fn main() {
    match run(&DeviceConfig::default_loopback()) {
        Ok((replies, peers)) => {
            for (who, r) in replies.iter().enumerate() {
                println!("client {who}: {} replies, last {:?}", r.len(), r.last());
            }
            println!("the server answered {peers} peer device(s)");
        }
        Err(e) => {
            eprintln!("ud_server: {e}");
            std::process::exit(1);
        }
    }
}
