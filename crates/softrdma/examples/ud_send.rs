//! Unreliable datagrams: SENDs through an address handle; every receive
//! starts with the 40-byte GRH, then the payload.
//!
//! ```text
//! cargo run -p softrdma --example ud_send
//! ```
//!
//! Both ends live in this process on two loopback devices. A UD QP needs no
//! connection: a sender names the destination per WR (address handle for the
//! peer's GID, its QP number and Q_Key).

use std::time::Duration;

use softrdma::{
    AccessFlags, Context, DeviceConfig, QpType, RecvWr, SendOp, SendWr, UdDest, WcFlags, GRH_LEN,
};

const TIMEOUT: Duration = Duration::from_secs(10);
const SLOT: usize = GRH_LEN + 256;

/// Sends a few datagrams; returns what arrived (payloads without the GRH).
pub fn run(cfg: &DeviceConfig) -> softrdma::Result<Vec<Vec<u8>>> {
    let messages = ["hello", "from", "a UD QP", "with immediate data"];
    let (tx, rx) = (Context::open_with(cfg)?, Context::open_with(cfg)?);
    let (tpd, rpd) = (tx.alloc_pd()?, rx.alloc_pd()?);
    let (tcq, rcq) = (tx.create_cq(16)?, rx.create_cq(16)?);
    let tmr = tpd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
    let rmr = rpd.alloc_mr(SLOT * messages.len(), AccessFlags::LOCAL_WRITE)?;
    let tqp = tpd.create_qp(QpType::Ud, &tcq, &tcq).build()?;
    let rqp = rpd.create_qp(QpType::Ud, &rcq, &rcq).build()?;
    tqp.ready_ud()?;
    rqp.ready_ud()?;

    // Receives first (a datagram with no receive posted is dropped).
    for i in 0..messages.len() {
        let sge = rmr.sge((i * SLOT) as u64, SLOT as u32);
        rqp.post_recv(&RecvWr {
            wr_id: i as u64,
            sg_list: vec![sge],
        })?;
    }
    // What the receiver would publish: GID, QP number, Q_Key.
    let dest = rqp.endpoint();
    let ah = tpd.create_ah(dest.gid)?;
    for (i, m) in messages.iter().enumerate() {
        tmr.write(0, m.as_bytes())?;
        let op = if i == 3 {
            SendOp::SendWithImm { imm: 0x1234_5678 }
        } else {
            SendOp::Send
        };
        let mut wr = SendWr::new(i as u64, op, vec![tmr.sge(0, m.len() as u32)]);
        wr.ud = Some(UdDest {
            ah: ah.handle(),
            remote_qpn: dest.qpn,
            remote_qkey: dest.qkey,
        });
        tqp.post_send(&wr)?;
        tcq.wait_ok(TIMEOUT)?;
    }
    let mut got = Vec::new();
    for wc in rcq.wait(messages.len(), TIMEOUT)? {
        if !wc.status.is_ok() {
            return Err(softrdma::Error::Completion(wc.status, wc.wr_id));
        }
        // The buffer holds the GRH (40 bytes), then the payload.
        let len = wc.byte_len as usize - GRH_LEN;
        let mut payload = vec![0; len];
        rmr.read(wc.wr_id as usize * SLOT + GRH_LEN, &mut payload)?;
        let imm = wc
            .wc_flags
            .contains(WcFlags::WITH_IMM)
            .then_some(wc.imm_data);
        println!(
            "from QP {:#x} at {}: {:?} (imm {imm:x?})",
            wc.src_qp,
            wc.sgid,
            String::from_utf8_lossy(&payload)
        );
        got.push(payload);
    }
    Ok(got)
}

fn main() {
    if let Err(e) = run(&DeviceConfig::default_loopback()) {
        eprintln!("ud_send: {e}");
        std::process::exit(1);
    }
}
