//! Fault injection (1% loss, 1% reordering, 0.5% duplication, 0.1%
//! corruption) on both devices: a 64 MiB stream of WRITEs and SENDs
//! arrives with every byte intact, and the counters show the recovery
//! (retransmissions, NAKs, duplicates, ICRC errors). Two devices in one
//! process, over RoCEv2/UDP on loopback and over the shared-memory rings:
//! faults wrap every port, and they turn the direct path off (they act on
//! packets), so over shared memory every byte goes through the rings.

mod common;

use std::time::{Duration, Instant};

use common::*;
use softrdma::shm::Transport;
use softrdma::*;

#[test]
fn lossy_reordering_duplicating_corrupting_udp_delivers_64_mib_intact() {
    faulty_stream(Transport::Udp);
}

#[test]
fn lossy_reordering_duplicating_corrupting_shm_delivers_64_mib_intact() {
    faulty_stream(Transport::Shm);
}

fn faulty_stream(transport: Transport) {
    const CHUNK: usize = 2 << 20;
    const CHUNKS: usize = 32; // 16 WRITEs and 16 SENDs, interleaved: 64 MiB
    const TOTAL: usize = CHUNK * CHUNKS;
    let spec = |seed| FaultSpec {
        loss: 0.01,
        reorder: 0.01,
        dup: 0.005,
        corrupt: 0.001,
        seed,
        ..Default::default()
    };
    let cfg = |seed| udp_loopback().transport(transport).fault(spec(seed));
    let a = Context::open_with(&cfg(11)).unwrap();
    let b = Context::open_with(&cfg(12)).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let src = pa.alloc_mr(TOTAL, access()).unwrap();
    let dst = pb.alloc_mr(TOTAL, access()).unwrap();
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb = pb.create_qp(QpType::Rc, &cb, &cb).build().unwrap();
    // A short ACK timeout (4.096 µs × 2^12 ≈ 17 ms) so tail losses recover fast.
    let o = ConnectOptions {
        timeout: 12,
        ..Default::default()
    };
    qa.connect(&qb.endpoint(), &o).unwrap();
    qb.connect(&qa.endpoint(), &o).unwrap();

    let data = pattern(64, TOTAL);
    src.write(0, &data).unwrap();
    let r = dst.remote();
    // Even chunks are WRITEs to their own place; odd chunks are SENDs into
    // receive buffers at the same place, so the whole region must end up
    // equal to the source.
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
    let took = start.elapsed();
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
    assert_eq!(diff(&got, &data), None, "64 MiB arrived intact");

    let (ka, kb) = (a.counters(), b.counters());
    let (da, db) = (a.driver_counters(), b.driver_counters());
    let (sa, sb) = (a.shm_counters(), b.shm_counters());
    eprintln!(
        "{transport:?}: 64 MiB in {took:?}\nrequester {ka:?}\n{da:?}\n{sa:?}\nresponder {kb:?}\n{db:?}\n{sb:?}"
    );
    match transport {
        Transport::Shm => assert!(
            sa.tx_packets > 0 && sb.rx_packets > 0,
            "the packets crossed the rings: {sa:?} {sb:?}"
        ),
        _ => assert_eq!(sa.tx_packets + sb.tx_packets, 0, "UDP only"),
    }
    assert_eq!(da.direct_ops, 0, "faults turn the direct path off");
    assert!(
        da.faults_injected > 0 && db.faults_injected > 0,
        "faults on both ends"
    );
    assert!(ka.retransmits > 0, "the requester retransmitted: {ka:?}");
    assert!(
        ka.seq_naks_rcvd + ka.timeouts > 0,
        "losses were noticed by NAK or timeout: {ka:?}"
    );
    assert!(kb.seq_naks_sent > 0 && kb.out_of_sequence > 0, "{kb:?}");
    assert!(
        kb.duplicates > 0,
        "duplicates were seen and dropped: {kb:?}"
    );
    assert!(
        kb.icrc_errors + ka.icrc_errors > 0,
        "corrupted packets were caught by their ICRC"
    );
    assert!(took < Duration::from_secs(30), "took {took:?}");
}
