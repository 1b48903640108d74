//! Selective repeat over real RoCEv2/UDP (issue 19): two devices on
//! loopback, faults on both (1 % loss, 1 % reordering, 0.5 % duplication,
//! 0.1 % corruption), QPs that agreed to selective repeat through
//! `query_ece`/`set_ece` before connecting. A 32 MiB stream of WRITEs and
//! SENDs arrives intact, and the counters show selective recovery: single
//! packets sent again, requests held out of order, no sequence NAK.

mod common;

use std::time::{Duration, Instant};

use common::*;
use softrdma::*;

#[test]
fn selective_repeat_over_lossy_udp_delivers_32_mib_intact() {
    const CHUNK: usize = 1 << 20;
    const CHUNKS: usize = 32;
    const TOTAL: usize = CHUNK * CHUNKS;
    let spec = |seed| FaultSpec {
        loss: 0.01,
        reorder: 0.01,
        dup: 0.005,
        corrupt: 0.001,
        seed,
    };
    let a = Context::open_with(&udp_loopback().fault(spec(21))).unwrap();
    let b = Context::open_with(&udp_loopback().fault(spec(22))).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let src = pa.alloc_mr(TOTAL, access()).unwrap();
    let dst = pb.alloc_mr(TOTAL, access()).unwrap();
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb = pb.create_qp(QpType::Rc, &cb, &cb).build().unwrap();
    // ECE: each end's offer, agreed, set on both before RTR.
    let agreed = qa.query_ece().unwrap().agree(qb.query_ece().unwrap());
    assert!(agreed.selective_repeat());
    qa.set_ece(agreed).unwrap();
    qb.set_ece(agreed).unwrap();
    let o = ConnectOptions {
        timeout: 12,
        ..Default::default()
    };
    qa.connect(&qb.endpoint(), &o).unwrap();
    qb.connect(&qa.endpoint(), &o).unwrap();
    assert_eq!(
        qa.set_ece(agreed).unwrap_err().errno(),
        errno::EINVAL,
        "after RTR"
    );

    let data = pattern(65, TOTAL);
    src.write(0, &data).unwrap();
    let r = dst.remote();
    for i in (1..CHUNKS).step_by(2) {
        qb.post_recv(&RecvWr {
            wr_id: i as u64,
            sg_list: vec![dst.sge((i * CHUNK) as u64, CHUNK as u32)],
        })
        .unwrap();
    }
    let start = Instant::now();
    for i in 0..CHUNKS {
        let off = (i * CHUNK) as u64;
        let op = if i % 2 == 0 {
            SendOp::Write {
                remote_addr: r.at(off),
                rkey: r.rkey,
            }
        } else {
            SendOp::Send
        };
        qa.post_send(&SendWr::new(i as u64, op, vec![src.sge(off, CHUNK as u32)]))
            .unwrap();
    }
    let limit = Duration::from_secs(60);
    let sent = ca.wait(CHUNKS, limit).unwrap();
    let recvd = cb.wait(CHUNKS / 2, limit - start.elapsed()).unwrap();
    for (i, wc) in sent.iter().enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status),
            (i as u64, WcStatus::Success),
            "{wc:?}"
        );
    }
    for (k, wc) in recvd.iter().enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len as usize),
            ((2 * k + 1) as u64, WcStatus::Success, CHUNK),
            "{wc:?}"
        );
    }
    let got = read_mr(&dst, 0, TOTAL);
    assert_eq!(diff(&got, &data), None, "32 MiB arrived intact");
    let (ka, kb) = (qa.counters(), qb.counters());
    eprintln!("requester {ka:?}\nresponder {kb:?}");
    assert!(ka.sr_retransmits > 0, "{ka:?}");
    assert!(kb.ooo_held > 0, "{kb:?}");
    assert_eq!(
        kb.seq_naks_sent, 0,
        "selective repeat sends no sequence NAK"
    );
}
