//! End-to-end basics over a perfect simulated network.

mod common;
use common::*;
use softrdma_engine::sim::NetConfig;
use softrdma_engine::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(5);

#[test]
fn rc_write_read_send_atomic() {
    let (mut net, a, b) = pair(1, NetConfig::perfect(), QpType::Rc, &ConnOpts::default());
    let data = pattern(7, 10_000);
    a.mem.fill_from(0, &data);
    let now = net.now;
    // WRITE 10000 bytes from a[0..] to b[4096..]
    net.nodes[0]
        .post_send(
            now,
            a.qpn,
            &SendWr::new(
                1,
                SendOp::Write {
                    remote_addr: b.base + 4096,
                    rkey: b.keys.rkey,
                },
                vec![sge(&a, 0, 10_000)],
            ),
        )
        .unwrap();
    let wcs = wait_wcs(&mut net, &a, 1, T);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(wcs[0].opcode, WcOpcode::RdmaWrite);
    assert_eq!(&b.mem.snapshot()[4096..4096 + 10_000], &data[..]);

    // READ it back into a[200_000..]
    let now = net.now;
    net.nodes[0]
        .post_send(
            now,
            a.qpn,
            &SendWr::new(
                2,
                SendOp::Read {
                    remote_addr: b.base + 4096,
                    rkey: b.keys.rkey,
                },
                vec![sge(&a, 200_000, 10_000)],
            ),
        )
        .unwrap();
    let wcs = wait_wcs(&mut net, &a, 1, T);
    assert_eq!(wcs[0].status, WcStatus::Success, "{wcs:?}");
    assert_eq!(wcs[0].byte_len, 10_000);
    assert_eq!(&a.mem.snapshot()[200_000..210_000], &data[..]);

    // SEND with immediate into a posted receive
    net.nodes[1]
        .post_recv(
            b.qpn,
            &RecvWr {
                wr_id: 77,
                sg_list: vec![sge(&b, 500_000, 4000)],
            },
        )
        .unwrap();
    let now = net.now;
    net.nodes[0]
        .post_send(
            now,
            a.qpn,
            &SendWr::new(
                3,
                SendOp::SendWithImm { imm: 0xabcd },
                vec![sge(&a, 0, 3000)],
            ),
        )
        .unwrap();
    let wcs = wait_wcs(&mut net, &b, 1, T);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(wcs[0].wr_id, 77);
    assert_eq!(wcs[0].byte_len, 3000);
    assert_eq!(wcs[0].imm_data, 0xabcd);
    assert!(wcs[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(&b.mem.snapshot()[500_000..503_000], &data[..3000]);
    let wcs = wait_wcs(&mut net, &a, 1, T);
    assert_eq!(wcs[0].wr_id, 3);

    // FETCH_ADD and CMP_SWAP
    b.mem.fill_from(8, &5u64.to_ne_bytes());
    let now = net.now;
    net.nodes[0]
        .post_send(
            now,
            a.qpn,
            &SendWr::new(
                4,
                SendOp::FetchAdd {
                    remote_addr: b.base + 8,
                    rkey: b.keys.rkey,
                    add: 10,
                },
                vec![sge(&a, 300_000, 8)],
            ),
        )
        .unwrap();
    net.nodes[0]
        .post_send(
            now,
            a.qpn,
            &SendWr::new(
                5,
                SendOp::CompareSwap {
                    remote_addr: b.base + 8,
                    rkey: b.keys.rkey,
                    compare: 15,
                    swap: 99,
                },
                vec![sge(&a, 300_008, 8)],
            ),
        )
        .unwrap();
    let wcs = wait_wcs(&mut net, &a, 2, T);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(4, WcStatus::Success), (5, WcStatus::Success)]
    );
    let snap = a.mem.snapshot();
    assert_eq!(
        u64::from_ne_bytes(snap[300_000..300_008].try_into().unwrap()),
        5
    );
    assert_eq!(
        u64::from_ne_bytes(snap[300_008..300_016].try_into().unwrap()),
        15
    );
    assert_eq!(
        u64::from_ne_bytes(b.mem.snapshot()[8..16].try_into().unwrap()),
        99
    );
}
