//! One side of a RoCEv2/UDP goodput run, go-back-N or selective repeat
//! (issue 19): `scripts/sr_netns_bench.sh` starts a server in one network
//! namespace and a client in another, joined by a veth with `tc netem`
//! delay, with `SOFTRDMA_FAULT` loss on both devices (each device from
//! `SOFTRDMA_DEVICES`). The two exchange their QPs over TCP
//! (`softrdma::cm`); with `--sr` both set the selective-repeat ECE option
//! before connecting (the agreement is the command line's). The client
//! streams 64 KiB RDMA WRITEs, 32 outstanding (`--depth N`), and prints one line:
//! `mode=… mib=… secs=… gbps=… retransmits=… sr_retransmits=… timeouts=…`.
//! With `--secs S` the client streams for S seconds instead of MIB MiB
//! (the congestion bench, `bench/bottleneck.sh`, runs several at once);
//! the server prints its device's `ecn_ce_rcvd=… cnp_sent=… rx_packets=…
//! tx_packets=… ooo_held=… duplicates=…` as it leaves. `SOFTRDMA_CC` chooses the congestion control.
//!
//! `sr_udp_goodput server ADDR:PORT [--sr]` /
//! `sr_udp_goodput client ADDR:PORT MIB [--sr] [--depth N] [--secs S [--warmup W]]` (both take
//! `--timeout T`, the local ACK timeout exponent, default 10: 4.2 ms)

use std::net::TcpListener;
use std::time::{Duration, Instant};

use softrdma::cm::{self, ConnInfo};
use softrdma::*;

const MSG: usize = 64 << 10;
/// The regions hold this many messages (16 MiB); the client writes the
/// first twice-the-depth of them round and round.
const SLOTS: usize = 256;
/// WRITEs outstanding unless `--depth` says otherwise.
const DEPTH: usize = 32;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let role = args.first().map(String::as_str).unwrap_or("");
    let addr = args.get(1).cloned().unwrap_or_default();
    let sr = args.iter().any(|a| a == "--sr");
    let secs_limit: Option<f64> = args
        .iter()
        .position(|a| a == "--secs")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok());
    // `--warmup W`: with `--secs`, goodput counts what completes after the
    // first W seconds only (senders started one after another settle).
    let warmup: f64 = args
        .iter()
        .position(|a| a == "--warmup")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    // `--depth N`: WRITEs outstanding (1 to SLOTS; ib_write_bw's default
    // tx depth is 128). Completions come in order, so a hole at the
    // head holds up every WRITE behind it: the depth is how much a sender
    // can keep in flight while one packet is resent.
    let depth: usize = args
        .iter()
        .position(|a| a == "--depth")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .filter(|d| (1..=SLOTS).contains(d))
        .unwrap_or(DEPTH);
    let ctx = Context::open_default()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(1024)?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = pd.alloc_mr(MSG * SLOTS, access)?;
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq)
        .max_send_wr(SLOTS as u32)
        .build()?;
    if sr {
        let ece = qp.query_ece()?;
        qp.set_ece(ece.agree(Ece::SUPPORTED))?;
    }
    let mine = ConnInfo {
        endpoint: qp.endpoint(),
        region: Some(mr.remote()),
    };
    // `--timeout T`: the local ACK timeout exponent (4.096 µs × 2^T).
    let timeout: u8 = args
        .iter()
        .position(|a| a == "--timeout")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .filter(|t| *t <= 31)
        .unwrap_or(10);
    let o = ConnectOptions {
        timeout,
        ..Default::default()
    };
    match role {
        "server" => {
            let l = TcpListener::bind(&addr).map_err(|e| Error::Io(e.to_string()))?;
            let (mut s, theirs) = cm::accept(&l, &mine)?;
            qp.connect(&theirs.endpoint, &o)?;
            cm::sync(&mut s)?;
            // The client says when it is done.
            cm::sync(&mut s)?;
            let c = ctx.counters();
            println!(
                "ecn_ce_rcvd={} cnp_sent={} rx_packets={} tx_packets={} ooo_held={} duplicates={}",
                c.ecn_ce_rcvd, c.cnp_sent, c.rx_packets, c.tx_packets, c.ooo_held, c.duplicates
            );
            Ok(())
        }
        "client" => {
            let mib: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(256);
            let (mut s, theirs) = cm::connect(addr.as_str(), &mine, Duration::from_secs(20))?;
            qp.connect(&theirs.endpoint, &o)?;
            cm::sync(&mut s)?;
            let r = theirs.region.expect("the server offered its region");
            let mut msgs = if secs_limit.is_some() {
                usize::MAX
            } else {
                mib * (1 << 20) / MSG
            };
            let (mut posted, mut done) = (0usize, 0usize);
            // Twice the depth of slots in use (no slot is rewritten while
            // a WRITE to it is in flight), so the bytes touched, and the
            // caches' share, grow with the depth only.
            let ring = (2 * depth).min(SLOTS);
            let t0 = Instant::now();
            let mut warm: Option<(usize, Instant)> = (warmup <= 0.0).then_some((0, t0));
            while done < msgs {
                if warm.is_none() && t0.elapsed().as_secs_f64() >= warmup {
                    warm = Some((done, Instant::now()));
                }
                if let Some(l) = secs_limit {
                    if msgs == usize::MAX && t0.elapsed().as_secs_f64() >= l {
                        msgs = posted;
                    }
                }
                while posted < msgs && posted - done < depth {
                    let off = ((posted % ring) * MSG) as u64;
                    let op = SendOp::Write {
                        remote_addr: r.at(off),
                        rkey: r.rkey,
                    };
                    qp.post_send(&SendWr::new(
                        posted as u64,
                        op,
                        vec![mr.sge(off, MSG as u32)],
                    ))?;
                    posted += 1;
                }
                if done == msgs {
                    break;
                }
                let wcs = cq.wait(1, Duration::from_secs(60))?;
                for w in &wcs {
                    if w.status != WcStatus::Success {
                        return Err(Error::Io(format!(
                            "WRITE {} failed: {:?}",
                            w.wr_id, w.status
                        )));
                    }
                }
                done += wcs.len();
            }
            let (done0, tw) = warm.unwrap_or((0, t0));
            let secs = tw.elapsed().as_secs_f64();
            let msgs = msgs - done0;
            let c = qp.counters();
            let d = ctx.counters();
            println!(
                "mode={} mib={} secs={secs:.3} gbps={:.3} retransmits={} sr_retransmits={} timeouts={} mtu={} cnp_rcvd={}",
                if sr { "sr" } else { "gbn" },
                (msgs * MSG) >> 20,
                (msgs * MSG) as f64 * 8.0 / secs / 1e9,
                c.retransmits,
                c.sr_retransmits,
                c.timeouts,
                qp.endpoint().mtu.bytes(),
                d.cnp_rcvd,
            );
            cm::sync(&mut s)?;
            Ok(())
        }
        _ => Err(Error::Config(
            "usage: sr_udp_goodput server|client ADDR:PORT [MIB] [--sr]".into(),
        )),
    }
}
