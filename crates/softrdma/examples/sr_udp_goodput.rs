//! One side of a RoCEv2/UDP goodput run, go-back-N or selective repeat
//! (issue 19): `scripts/sr_netns_bench.sh` starts a server in one network
//! namespace and a client in another, joined by a veth with `tc netem`
//! delay, with `SOFTRDMA_FAULT` loss on both devices (each device from
//! `SOFTRDMA_DEVICES`). The two exchange their QPs over TCP
//! (`softrdma::cm`); with `--sr` both set the selective-repeat ECE option
//! before connecting (the agreement is the command line's). The client
//! streams 64 KiB RDMA WRITEs, 32 outstanding, and prints one line:
//! `mode=… mib=… secs=… gbps=… retransmits=… sr_retransmits=… timeouts=…`.
//!
//! `sr_udp_goodput server ADDR:PORT [--sr]` /
//! `sr_udp_goodput client ADDR:PORT MIB [--sr]`

use std::net::TcpListener;
use std::time::{Duration, Instant};

use softrdma::cm::{self, ConnInfo};
use softrdma::*;

const MSG: usize = 64 << 10;
const SLOTS: usize = 64;
const DEPTH: usize = 32;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let role = args.first().map(String::as_str).unwrap_or("");
    let addr = args.get(1).cloned().unwrap_or_default();
    let sr = args.iter().any(|a| a == "--sr");
    let ctx = Context::open_default()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(1024)?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = pd.alloc_mr(MSG * SLOTS, access)?;
    let qp = pd.create_qp(QpType::Rc, &cq, &cq).build()?;
    if sr {
        let ece = qp.query_ece()?;
        qp.set_ece(ece.agree(Ece::SUPPORTED))?;
    }
    let mine = ConnInfo {
        endpoint: qp.endpoint(),
        region: Some(mr.remote()),
    };
    let o = ConnectOptions {
        timeout: 10,
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
            Ok(())
        }
        "client" => {
            let mib: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(256);
            let (mut s, theirs) = cm::connect(addr.as_str(), &mine, Duration::from_secs(20))?;
            qp.connect(&theirs.endpoint, &o)?;
            cm::sync(&mut s)?;
            let r = theirs.region.expect("the server offered its region");
            let msgs = mib * (1 << 20) / MSG;
            let (mut posted, mut done) = (0usize, 0usize);
            let t0 = Instant::now();
            while done < msgs {
                while posted < msgs && posted - done < DEPTH {
                    let off = ((posted % SLOTS) * MSG) as u64;
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
            let secs = t0.elapsed().as_secs_f64();
            let c = qp.counters();
            println!(
                "mode={} mib={mib} secs={secs:.3} gbps={:.3} retransmits={} sr_retransmits={} timeouts={} mtu={}",
                if sr { "sr" } else { "gbn" },
                (msgs * MSG) as f64 * 8.0 / secs / 1e9,
                c.retransmits,
                c.sr_retransmits,
                c.timeouts,
                qp.endpoint().mtu.bytes(),
            );
            cm::sync(&mut s)?;
            Ok(())
        }
        _ => Err(Error::Config(
            "usage: sr_udp_goodput server|client ADDR:PORT [MIB] [--sr]".into(),
        )),
    }
}
