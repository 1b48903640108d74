//! One-sided RDMA: WRITE a buffer into a peer's memory, READ it back, compare.
//!
//! ```text
//! cargo run -p softrdma --example write_read
//! SOFTRDMA_TRANSPORT=udp cargo run -p softrdma --example write_read   # RoCEv2 packets on lo
//! ```
//!
//! Both ends live in this process on two loopback devices (each binds UDP
//! port 4791 on its own 127.0.0.N). The peer never posts anything: one-sided
//! operations only need its region's address and rkey.

use std::time::Duration;

use softrdma::{AccessFlags, ConnectOptions, Context, DeviceConfig, QpType, SendOp, SendWr};

const LEN: usize = 1 << 20;
const TIMEOUT: Duration = Duration::from_secs(10);

/// Writes `LEN` bytes to a second device, reads them back and checks them.
/// Returns the bytes that went each way.
pub fn run(cfg: &DeviceConfig) -> softrdma::Result<usize> {
    let (local, remote) = (Context::open_with(cfg)?, Context::open_with(cfg)?);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let (lpd, rpd) = (local.alloc_pd()?, remote.alloc_pd()?);
    let (lcq, rcq) = (local.create_cq(16)?, remote.create_cq(16)?);
    // Local: the data at [0, LEN), the read-back at [LEN, 2 LEN).
    let lmr = lpd.alloc_mr(2 * LEN, access)?;
    let rmr = rpd.alloc_mr(LEN, access)?;
    let lqp = lpd.create_qp(QpType::Rc, &lcq, &lcq).build()?;
    let rqp = rpd.create_qp(QpType::Rc, &rcq, &rcq).build()?;
    // In one process there is nothing to exchange: connect both ends directly.
    lqp.connect(&rqp.endpoint(), &ConnectOptions::default())?;
    rqp.connect(&lqp.endpoint(), &ConnectOptions::default())?;

    let data: Vec<u8> = (0..LEN).map(|i| (i * 31 % 251) as u8).collect();
    lmr.write(0, &data)?;
    let target = rmr.remote(); // what a peer would send you: addr, rkey, len
    let write = SendOp::Write {
        remote_addr: target.addr,
        rkey: target.rkey,
    };
    lqp.post_send(&SendWr::new(1, write, vec![lmr.sge(0, LEN as u32)]))?;
    lcq.wait_ok(TIMEOUT)?;
    println!(
        "WRITE {LEN} bytes to {} (rkey {:#x})",
        remote.addr(),
        target.rkey
    );

    let read = SendOp::Read {
        remote_addr: target.addr,
        rkey: target.rkey,
    };
    lqp.post_send(&SendWr::new(2, read, vec![lmr.sge(LEN as u64, LEN as u32)]))?;
    lcq.wait_ok(TIMEOUT)?;
    let mut back = vec![0u8; LEN];
    lmr.read(LEN, &mut back)?;
    if back != data || rmr.to_vec() != data {
        return Err(softrdma::Error::Io("data read back differs".into()));
    }
    println!("READ {LEN} bytes back from {}: identical", remote.addr());
    Ok(LEN)
}

fn main() {
    if let Err(e) = run(&DeviceConfig::default_loopback()) {
        eprintln!("write_read: {e}");
        std::process::exit(1);
    }
}
