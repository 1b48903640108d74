//! A shared receive queue: one server takes the SENDs of several RC
//! clients from one pool of receive buffers, refilled in batches when the
//! SRQ's limit event says the pool runs low.
//!
//! ```text
//! cargo run -p softrdma --example srq_server
//! ```
//!
//! Both ends live in this process on two loopback devices. The server's QPs
//! (one per client) are created with `QpBuilder::srq`, so their receives come
//! from the SRQ; a completion names the QP it arrived on (`qp_num`) and the
//! buffer (`wr_id`, here the slot index). A buffer is not posted again at
//! once: the server keeps it until `SrqLimitReached` (an asynchronous
//! event, `ibv_get_async_event`) reports fewer than `LIMIT` receives left,
//! then posts every free buffer and arms the limit again (it fires once per
//! arming, as on hardware).

use std::time::{Duration, Instant};

use softrdma::{
    AccessFlags, ConnectOptions, Context, DeviceConfig, Event, QpType, RecvWr, SendOp, SendWr,
    WcOpcode,
};

const CLIENTS: usize = 3;
const MESSAGES: usize = 20;
const SLOTS: usize = 32;
const SLOT: usize = 64;
const LIMIT: u32 = 8;
const TIMEOUT: Duration = Duration::from_secs(20);

/// What the server saw.
#[derive(Debug)]
pub struct Report {
    /// The messages of each client, in arrival order.
    pub received: Vec<Vec<String>>,
    /// How many times the SRQ limit event fired (and the pool was refilled).
    pub refills: usize,
}

/// Runs `CLIENTS` clients of `MESSAGES` SENDs each against one SRQ server.
pub fn run(cfg: &DeviceConfig) -> softrdma::Result<Report> {
    let (server, client) = (Context::open_with(cfg)?, Context::open_with(cfg)?);
    let (spd, cpd) = (server.alloc_pd()?, client.alloc_pd()?);
    let scq = server.create_cq(256)?;
    let ccq = client.create_cq(256)?;
    let pool = spd.alloc_mr(SLOTS * SLOT, AccessFlags::LOCAL_WRITE)?;
    let srq = spd.create_srq(SLOTS as u32, 1)?;
    let post = |slot: usize| {
        srq.post_recv(&RecvWr {
            wr_id: slot as u64,
            sg_list: vec![pool.sge((slot * SLOT) as u64, SLOT as u32)],
        })
    };
    // The pool is full before any client connects.
    for slot in 0..SLOTS {
        post(slot)?;
    }
    srq.arm_limit(LIMIT)?;

    let o = ConnectOptions::default();
    let mut pairs = Vec::new();
    for _ in 0..CLIENTS {
        let sqp = spd.create_qp(QpType::Rc, &scq, &scq).srq(&srq).build()?;
        let cqp = cpd.create_qp(QpType::Rc, &ccq, &ccq).build()?;
        sqp.connect(&cqp.endpoint(), &o)?;
        cqp.connect(&sqp.endpoint(), &o)?;
        pairs.push((sqp, cqp));
    }
    // Each client sends its messages from buffers of its own.
    let out = cpd.alloc_mr(CLIENTS * MESSAGES * SLOT, AccessFlags::LOCAL_WRITE)?;
    for m in 0..MESSAGES {
        for (c, (_, cqp)) in pairs.iter().enumerate() {
            let text = format!("client {c} message {m}");
            let off = (c * MESSAGES + m) * SLOT;
            out.write(off, text.as_bytes())?;
            let sge = out.sge(off as u64, text.len() as u32);
            cqp.post_send(&SendWr::new(off as u64, SendOp::Send, vec![sge]))?;
        }
    }

    let mut report = Report {
        received: vec![Vec::new(); CLIENTS],
        refills: 0,
    };
    let (mut free, mut wcs, mut sends_done) = (Vec::new(), Vec::new(), 0);
    let deadline = Instant::now() + TIMEOUT;
    let total = CLIENTS * MESSAGES;
    while report.received.iter().map(Vec::len).sum::<usize>() < total || sends_done < total {
        if Instant::now() > deadline {
            return Err(softrdma::Error::Timeout(format!(
                "srq_server: {} of {total} messages, {sends_done} sends completed",
                report.received.iter().map(Vec::len).sum::<usize>()
            )));
        }
        wcs.clear();
        scq.poll(&mut wcs, 64)?;
        for wc in &wcs {
            if !wc.status.is_ok() {
                return Err(softrdma::Error::Completion(wc.status, wc.wr_id));
            }
            assert_eq!(wc.opcode, WcOpcode::Recv);
            let slot = wc.wr_id as usize;
            let mut text = vec![0; wc.byte_len as usize];
            pool.read(slot * SLOT, &mut text)?;
            // qp_num says which connection the buffer was taken for.
            let c = pairs
                .iter()
                .position(|(sqp, _)| sqp.qpn() == wc.qp_num)
                .expect("a completion of one of our QPs");
            report.received[c].push(String::from_utf8_lossy(&text).into_owned());
            free.push(slot);
        }
        wcs.clear();
        ccq.poll(&mut wcs, 64)?;
        for wc in &wcs {
            if !wc.status.is_ok() {
                return Err(softrdma::Error::Completion(wc.status, wc.wr_id));
            }
            sends_done += 1;
        }
        while let Some(ev) = server.poll_async_event() {
            if let Event::SrqLimitReached { srq: h } = ev {
                assert_eq!(h, srq.handle());
                for slot in free.drain(..) {
                    post(slot)?;
                }
                srq.arm_limit(LIMIT)?;
                report.refills += 1;
            }
        }
    }
    Ok(report)
}

fn main() {
    match run(&DeviceConfig::default_loopback()) {
        Ok(r) => {
            for (c, msgs) in r.received.iter().enumerate() {
                println!(
                    "client {c}: {} messages, last {:?}",
                    msgs.len(),
                    msgs.last()
                );
            }
            println!("pool refilled {} times", r.refills);
        }
        Err(e) => {
            eprintln!("srq_server: {e}");
            std::process::exit(1);
        }
    }
}
