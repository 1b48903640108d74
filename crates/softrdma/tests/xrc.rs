//! XRC through the Rust API, over UDP and over shared memory: an initiator
//! QP on one context sends to two XRC SRQs of one domain on the other
//! through one target QP (each WR names its SRQ), WRITE/READ/atomics reach
//! the SRQ's PD's region, and the domain and SRQ numbers follow
//! rdma-core's rules.

use std::time::Duration;

use softrdma::shm::Transport;
use softrdma::*;

const T: Duration = Duration::from_secs(10);

fn all() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

fn run(transport: Transport) {
    let a = Context::open_with(&DeviceConfig::default_loopback().transport(transport)).unwrap();
    let b = Context::open_with(&DeviceConfig::default_loopback().transport(transport)).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let ma = pa.alloc_mr(1 << 16, all()).unwrap();
    let mb = pb.alloc_mr(1 << 16, all()).unwrap();
    let xrcd = b.open_xrcd().unwrap();
    let init = SrqInit {
        max_wr: 16,
        max_sge: 1,
        limit: 0,
    };
    let srq1 = pb.create_xrc_srq(&xrcd, &cb, init).unwrap();
    let srq2 = pb.create_xrc_srq(&xrcd, &cb, init).unwrap();
    let (n1, n2) = (srq1.srq_num().unwrap(), srq2.srq_num().unwrap());
    assert_ne!(n1, n2);
    assert!(pb.create_srq(4, 1).unwrap().srq_num().is_err());
    let ini = pa.create_qp(QpType::XrcIni, &ca, &ca).build().unwrap();
    let tgt = xrcd.create_tgt_qp().unwrap();
    assert_eq!(tgt.qp_type(), QpType::XrcTgt);
    let o = ConnectOptions {
        timeout: 10,
        retry_cnt: 2,
        ..Default::default()
    };
    tgt.connect(&ini.endpoint(), &o).unwrap();
    ini.connect(&tgt.endpoint(), &o).unwrap();
    srq1.post_recv(&RecvWr {
        wr_id: 11,
        sg_list: vec![mb.sge(0, 256)],
    })
    .unwrap();
    srq2.post_recv(&RecvWr {
        wr_id: 22,
        sg_list: vec![mb.sge(256, 256)],
    })
    .unwrap();
    ma.write(0, b"to the second SRQ").unwrap();
    ma.write(64, b"to the first SRQ").unwrap();
    for (wr_id, off, len, n) in [(1u64, 0u64, 17u32, n2), (2, 64, 16, n1)] {
        let mut wr = SendWr::new(wr_id, SendOp::Send, vec![ma.sge(off, len)]);
        wr.xrc_srqn = Some(n);
        ini.post_send(&wr).unwrap();
    }
    let wcs = ca.wait(2, T).unwrap();
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let rx = cb.wait(2, T).unwrap();
    let mut ids: Vec<(u64, u32)> = rx.iter().map(|w| (w.wr_id, w.byte_len)).collect();
    ids.sort();
    assert_eq!(ids, vec![(11, 16), (22, 17)]);
    assert!(rx
        .iter()
        .all(|w| w.status == WcStatus::Success && w.qp_num == tgt.qpn()));
    assert_eq!(rd(&mb, 0, 16), b"to the first SRQ");
    assert_eq!(rd(&mb, 256, 17), b"to the second SRQ");
    // WRITE, READ and a fetch-and-add through the target, into the SRQ's PD.
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    ma.write(0x1000, &data).unwrap();
    mb.write(0x8000, &5u64.to_le_bytes()).unwrap();
    let wrs = [
        SendWr::new(
            3,
            SendOp::Write {
                remote_addr: mb.addr() + 0x2000,
                rkey: mb.rkey(),
            },
            vec![ma.sge(0x1000, 3000)],
        ),
        SendWr::new(
            4,
            SendOp::Read {
                remote_addr: mb.addr() + 0x2000,
                rkey: mb.rkey(),
            },
            vec![ma.sge(0x4000, 3000)],
        ),
        SendWr::new(
            5,
            SendOp::FetchAdd {
                remote_addr: mb.addr() + 0x8000,
                rkey: mb.rkey(),
                add: 3,
            },
            vec![ma.sge(0x9000, 8)],
        ),
    ];
    for mut wr in wrs {
        wr.xrc_srqn = Some(n1);
        ini.post_send(&wr).unwrap();
    }
    let wcs = ca.wait(3, T).unwrap();
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert_eq!(rd(&mb, 0x2000, 3000), data);
    assert_eq!(rd(&ma, 0x4000, 3000), data);
    assert_eq!(rd(&ma, 0x9000, 8), 5u64.to_le_bytes());
    assert_eq!(rd(&mb, 0x8000, 8), 8u64.to_le_bytes());
    // A WR without its SRQ number is refused at post time.
    let wr = SendWr::new(6, SendOp::Send, vec![ma.sge(0, 8)]);
    assert!(ini.post_send(&wr).is_err());
    // The domain is EBUSY while its SRQs and target QP exist.
    let xrcd = match xrcd.close() {
        Err((x, e)) => {
            assert_eq!(e.errno(), libc_ebusy(), "{e:?}");
            x
        }
        Ok(()) => panic!("closed a busy XRC domain"),
    };
    drop(tgt);
    drop(srq1);
    drop(srq2);
    xrcd.close().map_err(|(_, e)| e).unwrap();
}

fn rd(m: &Mr, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    m.read(off, &mut v).unwrap();
    v
}

fn libc_ebusy() -> i32 {
    16
}

#[test]
fn xrc_over_udp() {
    run(Transport::Udp);
}

#[test]
fn xrc_over_shm() {
    run(Transport::Shm);
}
