//! UD multicast in the engine: every QP attached to a group receives each
//! datagram sent to it (DQPN 0xFFFFFF, the group's IP as destination), a
//! detached QP stops receiving, a wrong Q_Key is dropped, and the verbs
//! refuse what the kernel refuses.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use common::*;
use softrdma_engine::sim::SimNet;
use softrdma_engine::*;

const GROUP: Ipv4Addr = Ipv4Addr::new(239, 1, 1, 1);

fn group_gid() -> Gid {
    Gid::from_ip(IpAddr::V4(GROUP))
}

/// Node 0 sends; node 1 has two UD QPs, node 2 one.
fn setup() -> (SimNet, Side, [Side; 3]) {
    let mut net = SimNet::new(3, 41, net5());
    let o = ConnOpts::default();
    let tx = make_side(&mut net, 0, QpType::Ud);
    let r = [
        make_side(&mut net, 1, QpType::Ud),
        make_side(&mut net, 1, QpType::Ud),
        make_side(&mut net, 2, QpType::Ud),
    ];
    bring_up(&mut net, &tx, &tx, 1, 1, &o, QpType::Ud);
    for s in &r {
        bring_up(&mut net, s, s, 1, 1, &o, QpType::Ud);
    }
    (net, tx, r)
}

/// Sends `len` bytes of `pattern(seed)` from `tx` to the group with
/// `qkey`, and returns the datagram as it left (to be handed to each
/// member, as the network would).
fn send_to_group(net: &mut SimNet, tx: &Side, seed: u8, len: u32, qkey: u32) -> Sent {
    tx.mem.fill_from(0, &pattern(seed, len as usize));
    let ah = net.nodes[0]
        .create_ah(
            tx.pd,
            AhAttr {
                dgid: group_gid(),
                is_global: true,
                hop_limit: 1,
                port_num: 1,
                ..Default::default()
            },
        )
        .unwrap();
    let mut wr = send_wr(u64::from(seed), tx, 0, len);
    wr.flags = SendFlags::SIGNALED;
    wr.ud = Some(UdDest {
        ah,
        remote_qpn: Qpn::from_raw(MCAST_QPN),
        remote_qkey: qkey,
    });
    post_ok(net, tx, wr);
    // Taken from the sender as it leaves (the simulated network routes to
    // nodes only; the test is the network that copies it to each member).
    let now = net.now;
    let mut buf = vec![0u8; 9000];
    let t = net.nodes[0]
        .poll_transmit(now, &mut buf)
        .expect("a datagram");
    assert!(net.nodes[0].poll_transmit(now, &mut buf).is_none());
    let w = poll(net, tx);
    assert_eq!(statuses(&w), vec![(u64::from(seed), WcStatus::Success)]);
    let pkt = softrdma_wire::PacketRepr::parse(&buf[..t.len]).unwrap();
    assert_eq!(pkt.bth.dest_qp, MCAST_QPN);
    Sent {
        ep: t.endpoints,
        bytes: buf[..t.len].to_vec(),
    }
}

struct Sent {
    ep: softrdma_wire::Endpoints,
    bytes: Vec<u8>,
}

fn deliver(net: &mut SimNet, node: usize, p: &Sent) {
    assert_eq!(p.ep.dst, SocketAddr::new(IpAddr::V4(GROUP), 4791));
    inject(net, node, p.ep, &p.bytes);
}

#[test]
fn every_attached_qp_gets_each_datagram_and_a_detached_one_stops() {
    let (mut net, tx, r) = setup();
    for s in &r {
        recv(&mut net, s, 100, 0, 4096);
        recv(&mut net, s, 101, 4096, 4096);
    }
    assert_eq!(net.nodes[1].attach_mcast(r[0].qpn, group_gid()), Ok(true));
    assert_eq!(net.nodes[1].attach_mcast(r[1].qpn, group_gid()), Ok(false));
    // Attaching twice is no error (the kernel's rule).
    assert_eq!(net.nodes[1].attach_mcast(r[1].qpn, group_gid()), Ok(false));
    assert_eq!(net.nodes[2].attach_mcast(r[2].qpn, group_gid()), Ok(true));
    let groups: Vec<_> = net.nodes[1].mcast_groups().collect();
    assert_eq!(groups, vec![IpAddr::V4(GROUP)]);

    let p = send_to_group(&mut net, &tx, 7, 300, 0x1111_2222);
    // On the wire: the group as destination IP, DQPN 0xFFFFFF.
    assert_eq!(p.ep.dst.ip(), IpAddr::V4(GROUP));
    deliver(&mut net, 1, &p);
    deliver(&mut net, 2, &p);
    for s in &r {
        let w = poll(&mut net, s);
        assert_eq!(statuses(&w), vec![(100, WcStatus::Success)]);
        assert_eq!(w[0].byte_len as usize, GRH_LEN + 300);
        assert_eq!(w[0].src_qp, tx.qpn);
        // The GRH space holds the IPv4 header (RoCEv2): its destination
        // is the group.
        assert_eq!(mem(s, 20 + 16, 4), GROUP.octets().to_vec());
        assert_eq!(mem(s, GRH_LEN, 300), pattern(7, 300));
    }

    // r[1] leaves: it gets nothing more; r[0] and r[2] still do.
    assert_eq!(net.nodes[1].detach_mcast(r[1].qpn, group_gid()), Ok(false));
    let e = net.nodes[1]
        .detach_mcast(r[1].qpn, group_gid())
        .unwrap_err();
    assert_eq!(e.errno(), errno::EINVAL);
    let p = send_to_group(&mut net, &tx, 8, 200, 0x1111_2222);
    deliver(&mut net, 1, &p);
    deliver(&mut net, 2, &p);
    for s in [&r[0], &r[2]] {
        let w = poll(&mut net, s);
        assert_eq!(statuses(&w), vec![(101, WcStatus::Success)]);
        assert_eq!(mem(s, 4096 + GRH_LEN, 200), pattern(8, 200));
    }
    assert!(poll(&mut net, &r[1]).is_empty());
    assert_eq!(mem(&r[1], 4096 + GRH_LEN, 200), vec![0; 200]);

    // The last QP of node 1 leaves: the group is gone from the device.
    assert_eq!(net.nodes[1].detach_mcast(r[0].qpn, group_gid()), Ok(true));
    assert_eq!(net.nodes[1].mcast_groups().count(), 0);
    // A destroyed QP leaves its groups.
    net.nodes[2].destroy_qp(r[2].qpn).unwrap();
    assert_eq!(net.nodes[2].mcast_groups().count(), 0);
}

#[test]
fn a_wrong_qkey_is_dropped_and_counted() {
    let (mut net, tx, r) = setup();
    recv(&mut net, &r[0], 100, 0, 4096);
    net.nodes[1].attach_mcast(r[0].qpn, group_gid()).unwrap();
    let p = send_to_group(&mut net, &tx, 9, 64, 0x0BAD_0BAD);
    deliver(&mut net, 1, &p);
    assert!(poll(&mut net, &r[0]).is_empty());
    assert_eq!(qp_counters(&net, &r[0]).qkey_violations, 1);
    // The receive is still there for a datagram with the right key.
    let p = send_to_group(&mut net, &tx, 10, 64, 0x1111_2222);
    deliver(&mut net, 1, &p);
    assert_eq!(
        statuses(&poll(&mut net, &r[0])),
        vec![(100, WcStatus::Success)]
    );
}

#[test]
fn a_group_datagram_nobody_attached_to_and_mismatched_addressing_are_dropped() {
    let (mut net, tx, r) = setup();
    recv(&mut net, &r[0], 100, 0, 4096);
    let p = send_to_group(&mut net, &tx, 11, 64, 0x1111_2222);
    let before = net.nodes[1].counters().dropped;
    deliver(&mut net, 1, &p);
    assert!(poll(&mut net, &r[0]).is_empty());
    assert_eq!(net.nodes[1].counters().dropped, before + 1);
    // DQPN 0xFFFFFF sent to the device's unicast address: dropped, even
    // with the QP attached.
    net.nodes[1].attach_mcast(r[0].qpn, group_gid()).unwrap();
    let mut ep = p.ep;
    ep.dst = softrdma_engine::sim::node_addr(1);
    let mut bytes = p.bytes.clone();
    softrdma_wire::icrc::seal(&ep, &mut bytes).unwrap();
    inject(&mut net, 1, ep, &bytes);
    assert!(poll(&mut net, &r[0]).is_empty());
    assert_eq!(net.nodes[1].counters().dropped, before + 2);
}

#[test]
fn attach_refuses_what_the_kernel_refuses() {
    let (mut net, _tx, r) = setup();
    let rc = make_side(&mut net, 1, QpType::Rc);
    let e = net.nodes[1].attach_mcast(rc.qpn, group_gid()).unwrap_err();
    assert_eq!(e.errno(), errno::EINVAL, "{e}");
    let unicast = Gid::from_ip(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
    let e = net.nodes[1].attach_mcast(r[0].qpn, unicast).unwrap_err();
    assert_eq!(e.errno(), errno::EINVAL, "{e}");
    let e = net.nodes[1].detach_mcast(r[0].qpn, unicast).unwrap_err();
    assert_eq!(e.errno(), errno::EINVAL, "{e}");
    // IPv6 ff00::/8 is a multicast GID too.
    let v6: Gid = Gid::from([0xFF, 0x0E, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    assert_eq!(net.nodes[1].attach_mcast(r[0].qpn, v6), Ok(true));
    // Past max_mcast_grp: ENOMEM.
    for i in 1..MAX_MCAST_GRP as u32 {
        let g = Gid::from_ip(IpAddr::V4(Ipv4Addr::from(0xEF02_0000 + i)));
        net.nodes[1].attach_mcast(r[0].qpn, g).unwrap();
    }
    let e = net.nodes[1]
        .attach_mcast(r[0].qpn, group_gid())
        .unwrap_err();
    assert_eq!(e.errno(), errno::ENOMEM, "{e}");
    let e = net.nodes[1]
        .attach_mcast(Qpn::from_raw(0x00AB_CDEF), group_gid())
        .unwrap_err();
    assert_eq!(e.errno(), errno::EINVAL);
}
