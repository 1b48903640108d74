//! Atomics on a remote counter: FETCH_AND_ADD from two QPs, then
//! CMP_AND_SWAP used as a lock (one that succeeds, one that does not).
//!
//! ```text
//! cargo run -p softrdma --example atomic_counter
//! ```
//!
//! Both ends live in this process on two loopback devices. The counter is an
//! 8-byte word in the target's region; each atomic returns the value it found.

use std::time::Duration;

use softrdma::{
    AccessFlags, ConnectOptions, Context, DeviceConfig, QpType, SendOp, SendWr, WcStatus,
};

const ADDS_PER_QP: u64 = 50;
const TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the atomics; returns the counter's final value.
pub fn run(cfg: &DeviceConfig) -> softrdma::Result<u64> {
    let (me, target) = (Context::open_with(cfg)?, Context::open_with(cfg)?);
    let (pd, tpd) = (me.alloc_pd()?, target.alloc_pd()?);
    let (cq, tcq) = (me.create_cq(256)?, target.create_cq(16)?);
    let counter = tpd.alloc_mr(8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)?;
    // Each atomic writes the value it found into 8 bytes of this region.
    let results = pd.alloc_mr(8 * 256, AccessFlags::LOCAL_WRITE)?;
    let mut qps = Vec::new();
    for _ in 0..2 {
        let qp = pd.create_qp(QpType::Rc, &cq, &cq).build()?;
        let tqp = tpd.create_qp(QpType::Rc, &tcq, &tcq).build()?;
        qp.connect(&tqp.endpoint(), &ConnectOptions::default())?;
        tqp.connect(&qp.endpoint(), &ConnectOptions::default())?;
        qps.push((qp, tqp));
    }
    let c = counter.remote();

    // FETCH_AND_ADD 1, from both QPs at once, all outstanding together.
    let n = 2 * ADDS_PER_QP;
    for i in 0..n {
        let (qp, _) = &qps[(i % 2) as usize];
        let op = SendOp::FetchAdd {
            remote_addr: c.addr,
            rkey: c.rkey,
            add: 1,
        };
        qp.post_send(&SendWr::new(i, op, vec![results.sge(8 * i, 8)]))?;
    }
    let wcs = cq.wait(n as usize, TIMEOUT)?;
    if let Some(bad) = wcs.iter().find(|w| w.status != WcStatus::Success) {
        return Err(softrdma::Error::Completion(bad.status, bad.wr_id));
    }
    // Every add saw a different value: 0, 1, …, n-1 in some order.
    let mut seen: Vec<u64> = (0..n as usize)
        .map(|i| results.read_u64(8 * i))
        .collect::<Result<_, _>>()?;
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..n).collect::<Vec<_>>(),
        "each FETCH_AND_ADD saw its own value"
    );
    println!(
        "{n} FETCH_AND_ADDs from 2 QPs: counter = {}",
        counter.read_u64(0)?
    );

    // CMP_AND_SWAP as a lock: swap in a marker if the value is still n.
    let (qp, _) = &qps[0];
    for (id, compare) in [(1000, n), (1001, n)] {
        let op = SendOp::CompareSwap {
            remote_addr: c.addr,
            rkey: c.rkey,
            compare,
            swap: 0xDEAD_BEEF,
        };
        qp.post_send(&SendWr::new(id, op, vec![results.sge(0, 8)]))?;
        cq.wait_ok(TIMEOUT)?;
        let found = results.read_u64(0)?;
        let won = found == compare;
        println!(
            "CMP_AND_SWAP(compare {compare}, swap 0xdeadbeef) found {found:#x}: {}",
            if won { "swapped" } else { "not swapped" }
        );
    }
    let end = counter.read_u64(0)?;
    println!("counter = {end:#x}");
    Ok(end)
}

fn main() {
    if let Err(e) = run(&DeviceConfig::default_loopback()) {
        eprintln!("atomic_counter: {e}");
        std::process::exit(1);
    }
}
