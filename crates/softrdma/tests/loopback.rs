//! Two devices in one process on loopback: every operation end to end over real UDP.

use std::time::Duration;

use softrdma::*;

const T: Duration = Duration::from_secs(10);

fn access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

#[test]
fn rc_operations_over_udp() {
    let a = Context::open_with(&DeviceConfig::default_loopback()).unwrap();
    let b = Context::open_with(&DeviceConfig::default_loopback()).unwrap();
    assert_ne!(
        a.addr(),
        b.addr(),
        "each device gets its own loopback address"
    );
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let ma = pa.alloc_mr(1 << 20, access()).unwrap();
    let mb = pb.alloc_mr(1 << 20, access()).unwrap();
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb = pb.create_qp(QpType::Rc, &cb, &cb).build().unwrap();
    qa.connect(&qb.endpoint(), &ConnectOptions::default())
        .unwrap();
    qb.connect(&qa.endpoint(), &ConnectOptions::default())
        .unwrap();

    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + 3) as u8).collect();
    ma.write(0, &data).unwrap();
    let rb = mb.remote();
    qa.post_send(&SendWr::new(
        1,
        SendOp::Write {
            remote_addr: rb.at(100),
            rkey: rb.rkey,
        },
        vec![ma.sge(0, data.len() as u32)],
    ))
    .unwrap();
    let wc = ca.wait_ok(T).unwrap();
    assert_eq!(wc.wr_id, 1);
    let mut got = vec![0u8; data.len()];
    mb.read(100, &mut got).unwrap();
    assert!(got == data, "WRITE data intact");

    qa.post_send(&SendWr::new(
        2,
        SendOp::Read {
            remote_addr: rb.at(100),
            rkey: rb.rkey,
        },
        vec![ma.sge(500_000, data.len() as u32)],
    ))
    .unwrap();
    ca.wait_ok(T).unwrap();
    ma.read(500_000, &mut got).unwrap();
    assert!(got == data, "READ data intact");

    qb.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: vec![mb.sge(800_000, 8192)],
    })
    .unwrap();
    qa.post_send(&SendWr::new(
        3,
        SendOp::SendWithImm { imm: 0x1234_5678 },
        vec![ma.sge(0, 5000)],
    ))
    .unwrap();
    let r = cb.wait_ok(T).unwrap();
    assert_eq!((r.wr_id, r.byte_len, r.imm_data), (9, 5000, 0x1234_5678));
    ca.wait_ok(T).unwrap();

    let before = mb.read_u64(0).unwrap();
    qa.post_send(&SendWr::new(
        4,
        SendOp::FetchAdd {
            remote_addr: rb.at(0),
            rkey: rb.rkey,
            add: 5,
        },
        vec![ma.sge(900_000, 8)],
    ))
    .unwrap();
    ca.wait_ok(T).unwrap();
    assert_eq!(
        ma.read_u64(900_000).unwrap(),
        before,
        "FETCH_ADD returns the old value"
    );
    assert_eq!(
        mb.read_u64(0).unwrap(),
        before.wrapping_add(5),
        "and adds to the target"
    );
    assert!(a.counters().tx_packets > 0 && b.counters().rx_packets > 0);
    assert_eq!(b.counters().icrc_errors, 0);
}
