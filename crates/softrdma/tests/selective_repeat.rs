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
        ..Default::default()
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

/// The RC ACKs of `path`'s frames as (UDP payload length, whether the
/// bytes after the AETH begin with the SACK extension's magic "SR").
fn acks_in(path: &std::path::Path) -> Vec<(usize, bool)> {
    let mut r = softrdma_pcap::CaptureReader::open(path).unwrap();
    let mut acks = Vec::new();
    while let Some(f) = r.next_frame().unwrap() {
        let ip = f.ip().unwrap();
        let hdr = usize::from(ip[0] & 0xF) * 4;
        let udp = &ip[hdr + 8..];
        if udp[0] == 0x11 {
            // BTH 12, AETH 4, then the ICRC (4) — or the extension first.
            acks.push((udp.len(), udp.get(16..18) == Some(&[0x53, 0x52][..])));
        }
    }
    acks
}

/// Interop (issue 19): a QP whose options were never set is plain RoCEv2
/// go-back-N on the wire, byte for byte what rxe and hardware expect. Both
/// ends of a lossy transfer are captured: on the default QP every ACK is
/// exactly BTH + AETH + ICRC (20 bytes) and none carries the SACK
/// extension, and the loss drew go-back-N's sequence NAKs; the same
/// transfer between QPs that agreed to selective repeat does put SACKs on
/// the wire (so the check sees the extension when it is there).
#[test]
fn default_qps_put_no_wire_extension_in_a_capture() {
    const LEN: usize = 4 << 20;
    let dir = TempDir::new("sr-capture");
    for sr in [false, true] {
        let spec = |seed| FaultSpec {
            loss: 0.02,
            reorder: 0.0,
            dup: 0.0,
            corrupt: 0.0,
            seed,
            ..Default::default()
        };
        let (pa, pb) = (
            dir.path(&format!("a-{sr}.pcap")),
            dir.path(&format!("b-{sr}.pcap")),
        );
        let a = Context::open_with(&udp_loopback().fault(spec(31)).capture(&pa)).unwrap();
        let b = Context::open_with(&udp_loopback().fault(spec(32)).capture(&pb)).unwrap();
        let (da, db) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
        let src = da.alloc_mr(LEN, access()).unwrap();
        let dst = db.alloc_mr(LEN, access()).unwrap();
        let qa = da.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
        let qb = db.create_qp(QpType::Rc, &cb, &cb).build().unwrap();
        if sr {
            let agreed = qa.query_ece().unwrap().agree(qb.query_ece().unwrap());
            qa.set_ece(agreed).unwrap();
            qb.set_ece(agreed).unwrap();
        }
        let o = ConnectOptions {
            timeout: 12,
            ..Default::default()
        };
        qa.connect(&qb.endpoint(), &o).unwrap();
        qb.connect(&qa.endpoint(), &o).unwrap();
        let data = pattern(77, LEN);
        src.write(0, &data).unwrap();
        let r = dst.remote();
        const CHUNK: usize = 256 << 10;
        for i in 0..LEN / CHUNK {
            let off = (i * CHUNK) as u64;
            let op = SendOp::Write {
                remote_addr: r.at(off),
                rkey: r.rkey,
            };
            qa.post_send(&SendWr::new(i as u64, op, vec![src.sge(off, CHUNK as u32)]))
                .unwrap();
        }
        for wc in ca.wait(LEN / CHUNK, Duration::from_secs(60)).unwrap() {
            assert_eq!(wc.status, WcStatus::Success, "sr={sr}: {wc:?}");
        }
        assert_eq!(diff(&read_mr(&dst, 0, LEN), &data), None, "sr={sr}");
        let kb = qb.counters();
        drop((qa, qb, src, dst, ca, cb, da, db, a, b)); // closes the captures
        let acks = acks_in(&pb);
        assert!(!acks.is_empty(), "sr={sr}: no ACK captured");
        let sacks = acks.iter().filter(|a| a.1).count();
        if sr {
            assert!(sacks > 0, "selective repeat puts SACKs on the wire: {kb:?}");
        } else {
            assert!(
                acks.iter().all(|&(len, sack)| len == 20 && !sack),
                "a default QP's ACKs are plain RoCEv2: {:?}",
                acks.iter()
                    .filter(|a| a.0 != 20)
                    .take(5)
                    .collect::<Vec<_>>()
            );
            assert!(kb.seq_naks_sent > 0, "the loss drew go-back-N NAKs: {kb:?}");
            assert_eq!(kb.ooo_held, 0, "{kb:?}");
        }
        let c = check_capture(&pb);
        assert!(c.icrc_bad.is_empty(), "sr={sr}: {c:?}");
        eprintln!(
            "sr={sr}: {} ACKs captured, {sacks} with a SACK; {} frames",
            acks.len(),
            c.frames
        );
    }
}
