//! UD multicast through the Rust API over the host's IP multicast: three
//! devices on loopback, two receiving QPs on one and one on another; each
//! gets every datagram sent to the group, a detached QP stops receiving,
//! a wrong Q_Key is dropped. Over the UDP transport and the same-host one.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use softrdma::{
    AccessFlags, Context, DeviceConfig, Gid, Mr, Qp, QpType, RecvWr, SendOp, SendWr, UdDest,
    WorkCompletion, GRH_LEN,
};

fn gid(g: Ipv4Addr) -> Gid {
    Gid::from_ip(IpAddr::V4(g))
}

struct Rx {
    qp: Qp,
    cq: softrdma::Cq,
    mr: Mr,
}

fn rx(ctx: &Context) -> Rx {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let mr = pd.alloc_mr(64 * 1024, AccessFlags::LOCAL_WRITE).unwrap();
    let qp = pd.create_qp(QpType::Ud, &cq, &cq).build().unwrap();
    qp.ready_ud().unwrap();
    for i in 0..8 {
        qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: vec![mr.sge(i * 4096, 4096)],
        })
        .unwrap();
    }
    // The PD lives as long as its objects need it.
    std::mem::forget(pd);
    Rx { qp, cq, mr }
}

fn wait_one(r: &Rx, timeout: Duration) -> Option<WorkCompletion> {
    let end = Instant::now() + timeout;
    let mut out = Vec::new();
    while Instant::now() < end {
        r.cq.poll(&mut out, 4).unwrap();
        if let Some(w) = out.pop() {
            assert!(out.is_empty(), "one completion at a time");
            return Some(w);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

fn run(transport: softrdma::shm::Transport, group: Ipv4Addr, base: u8) {
    let cfg = |i: u8| {
        let mut c = DeviceConfig::new(
            format!("mc{i}"),
            format!("127.0.{base}.{i}:4791").parse().unwrap(),
        )
        .transport(transport);
        c.capture = None;
        c.fault = None;
        c
    };
    let (a, b, c) = (
        Context::open_with(&cfg(1)).unwrap(),
        Context::open_with(&cfg(2)).unwrap(),
        Context::open_with(&cfg(3)).unwrap(),
    );
    let attr = b.query_device();
    assert!(attr.max_mcast_grp > 0 && attr.max_mcast_qp_attach > 0);
    assert!(attr.max_total_mcast_qp_attach >= attr.max_mcast_qp_attach);
    let r = [rx(&b), rx(&b), rx(&c)];
    for x in &r {
        x.qp.attach_mcast(gid(group)).unwrap();
    }
    // The sender: a UD QP of its own, not attached.
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(64).unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let tx = pd.create_qp(QpType::Ud, &cq, &cq).build().unwrap();
    tx.ready_ud().unwrap();
    let ah = pd.create_ah(gid(group)).unwrap();
    let qkey = r[0].qp.endpoint().qkey;
    let send = |seed: u8, len: usize, qkey: u32| {
        let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(seed)).collect();
        mr.write(0, &data).unwrap();
        let mut wr = SendWr::new(u64::from(seed), SendOp::Send, vec![mr.sge(0, len as u32)]);
        wr.ud = Some(UdDest {
            ah: ah.handle(),
            remote_qpn: softrdma::Qpn::from_raw(softrdma::MCAST_QPN),
            remote_qkey: qkey,
        });
        tx.post_send(&wr).unwrap();
        let wc = cq.wait_ok(Duration::from_secs(5)).unwrap();
        assert_eq!(wc.wr_id, u64::from(seed));
        data
    };
    let check = |x: &Rx, data: &[u8], timeout: Duration| {
        let w = wait_one(x, timeout).expect("the group's datagram");
        assert_eq!(w.status, softrdma::WcStatus::Success);
        assert_eq!(w.byte_len as usize, GRH_LEN + data.len());
        assert_eq!(w.src_qp, tx.qpn());
        let mut got = vec![0; data.len()];
        x.mr.read(w.wr_id as usize * 4096 + GRH_LEN, &mut got)
            .unwrap();
        assert_eq!(got, data);
    };
    // Every attached QP gets each datagram (a few, in case the kernel's
    // group membership takes a moment: the first is retried).
    let d = send(3, 1000, qkey);
    for x in &r {
        check(x, &d, Duration::from_secs(5));
    }
    let d = send(5, 64, qkey);
    for x in &r {
        check(x, &d, Duration::from_secs(5));
    }
    // A wrong Q_Key: nobody gets it.
    send(7, 64, qkey ^ 1);
    let end = Instant::now() + Duration::from_secs(5);
    while (b.counters().qkey_violations < 2 || c.counters().qkey_violations < 1)
        && Instant::now() < end
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(b.counters().qkey_violations, 2, "both QPs of b dropped it");
    assert_eq!(c.counters().qkey_violations, 1);
    // r[1] leaves the group.
    r[1].qp.detach_mcast(gid(group)).unwrap();
    let e = r[1].qp.detach_mcast(gid(group)).unwrap_err();
    assert_eq!(e.errno(), softrdma::errno::EINVAL);
    let d = send(9, 300, qkey);
    check(&r[0], &d, Duration::from_secs(5));
    check(&r[2], &d, Duration::from_secs(5));
    assert!(wait_one(&r[1], Duration::from_millis(200)).is_none());
    for x in [&r[0], &r[2]] {
        assert!(
            wait_one(x, Duration::from_millis(50)).is_none(),
            "the wrong Q_Key's"
        );
    }
    // Refusals as the kernel's: an RC QP, a unicast GID.
    let rc = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    assert_eq!(
        rc.attach_mcast(gid(group)).unwrap_err().errno(),
        softrdma::errno::EINVAL
    );
    let uni = gid(Ipv4Addr::new(127, 0, base, 2));
    assert_eq!(
        tx.attach_mcast(uni).unwrap_err().errno(),
        softrdma::errno::EINVAL
    );
}

#[test]
fn every_member_gets_each_datagram_over_udp() {
    run(
        softrdma::shm::Transport::Udp,
        Ipv4Addr::new(239, 1, 2, 1),
        231,
    );
}

#[test]
fn every_member_gets_each_datagram_over_shared_memory() {
    run(
        softrdma::shm::Transport::Shm,
        Ipv4Addr::new(239, 1, 2, 2),
        232,
    );
}
