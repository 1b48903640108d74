//! The verbs calls themselves: what post_send refuses at once (EINVAL,
//! ENOMEM) versus what fails later as an error completion, inline data,
//! and object lifetimes (busy PDs and CQs, destroyed QPs).

mod common;
use common::*;
use softrdma_engine::*;

fn rc() -> (softrdma_engine::sim::SimNet, Side, Side) {
    pair(51, net5(), QpType::Rc, &ConnOpts::default())
}

fn einval(r: softrdma_engine::Result<()>, what: &str) -> String {
    let e = r.expect_err(what);
    assert_eq!(e.errno(), errno::EINVAL, "{what}: {e}");
    e.to_string()
}

#[test]
fn post_send_refuses_malformed_requests_at_once() {
    let (mut net, a, b) = rc();
    // Too many SGEs.
    let wr = SendWr::new(1, SendOp::Send, vec![sge(&a, 0, 1); 9]);
    let m = einval(post(&mut net, &a, &wr), "num_sge");
    assert!(m.contains("max_send_sge"), "{m}");
    // Atomics need exactly one 8-byte SGE.
    for sg in [vec![sge(&a, 0, 4)], vec![sge(&a, 0, 4), sge(&a, 4, 4)]] {
        let wr = SendWr::new(
            1,
            SendOp::FetchAdd {
                remote_addr: b.base,
                rkey: b.keys.rkey,
                add: 1,
            },
            sg,
        );
        einval(post(&mut net, &a, &wr), "atomic SGE");
    }
    // Inline data above the QP's inline room: 64 asked, and 8 SGEs give
    // 128 (16 bytes an SGE, as rxe and mlx5 size a send WQE).
    let wr = with_flags(send_wr(1, &a, 0, 129), SendFlags::INLINE);
    let m = einval(post(&mut net, &a, &wr), "inline size");
    assert!(m.contains("max_inline_data"), "{m}");
    // Nothing was queued by the refused posts.
    settle(&mut net);
    assert!(poll(&mut net, &a).is_empty());
}

#[test]
fn operations_a_transport_lacks_are_refused() {
    let (mut net, a, b) = pair(52, net5(), QpType::Uc, &ConnOpts::default());
    for op in [
        SendOp::Read {
            remote_addr: b.base,
            rkey: b.keys.rkey,
        },
        SendOp::FetchAdd {
            remote_addr: b.base,
            rkey: b.keys.rkey,
            add: 1,
        },
    ] {
        let m = einval(
            post(&mut net, &a, &SendWr::new(1, op, vec![sge(&a, 0, 8)])),
            "UC READ/atomic",
        );
        assert!(m.contains("UC"), "{m}");
    }
    let mut net = softrdma_engine::sim::SimNet::new(2, 53, net5());
    let u = make_side(&mut net, 0, QpType::Ud);
    let v = make_side(&mut net, 1, QpType::Ud);
    let o = ConnOpts::default();
    bring_up(&mut net, &u, &v, 1, 1, &o, QpType::Ud);
    let m = einval(
        post(&mut net, &u, &write_wr(1, &u, 0, 8, &v, 0)),
        "UD WRITE",
    );
    assert!(m.contains("UD"), "{m}");
    // A UD send without a destination.
    einval(post(&mut net, &u, &send_wr(1, &u, 0, 8)), "UD without ud");
}

#[test]
fn a_full_send_queue_is_enomem() {
    let (mut net, a, b) = rc();
    net.set_partition(0, 1, true);
    for i in 0..1024 {
        post_ok(&mut net, &a, unsignaled(write_wr(i, &a, 0, 8, &b, 0)));
    }
    let e = post(&mut net, &a, &write_wr(1024, &a, 0, 8, &b, 0)).unwrap_err();
    assert_eq!(e.errno(), errno::ENOMEM, "{e}");
    for i in 0..1024 {
        recv(&mut net, &a, i, 0, 8);
    }
    let e = net.nodes[0]
        .post_recv(
            a.qpn,
            &RecvWr {
                wr_id: 0,
                sg_list: vec![],
            },
        )
        .unwrap_err();
    assert_eq!(e.errno(), errno::ENOMEM, "{e}");
}

#[test]
fn inline_data_is_copied_when_posted() {
    let (mut net, a, b) = rc();
    recv(&mut net, &b, 9, 0, 100);
    a.mem.fill_from(0, &pattern(1, 60));
    post_ok(
        &mut net,
        &a,
        with_flags(send_wr(1, &a, 0, 60), SendFlags::INLINE),
    );
    // The application reuses the buffer right after posting.
    a.mem.fill_from(0, &[0; 60]);
    settle(&mut net);
    assert_eq!(statuses(&poll(&mut net, &a)), vec![(1, WcStatus::Success)]);
    assert_eq!(statuses(&poll(&mut net, &b)), vec![(9, WcStatus::Success)]);
    assert_eq!(mem(&b, 0, 60), pattern(1, 60));
    // post_send_inline takes the bytes directly.
    let now = net.now;
    net.nodes[0]
        .post_send_inline(
            now,
            a.qpn,
            &SendWr::new(
                2,
                SendOp::Write {
                    remote_addr: b.base + 500,
                    rkey: b.keys.rkey,
                },
                vec![],
            ),
            &pattern(2, 64),
        )
        .unwrap();
    settle(&mut net);
    assert_eq!(statuses(&poll(&mut net, &a)), vec![(2, WcStatus::Success)]);
    assert_eq!(mem(&b, 500, 64), pattern(2, 64));
    assert!(net.nodes[0]
        .post_send_inline(
            now,
            a.qpn,
            &SendWr::new(3, SendOp::Send, vec![]),
            &pattern(2, 129),
        )
        .is_err());
    // What the QP really has is what query_qp reports.
    let (_, init) = net.nodes[0].query_qp(a.qpn).unwrap();
    assert_eq!(init.cap.max_inline_data, 128);
}

#[test]
fn objects_in_use_cannot_be_destroyed() {
    let (mut net, a, _b) = rc();
    let e = &mut net.nodes[0];
    assert_eq!(e.dealloc_pd(a.pd).unwrap_err().errno(), errno::EBUSY);
    assert_eq!(e.destroy_cq(a.cq).unwrap_err().errno(), errno::EBUSY);
    // Registration rules: remote write or atomic needs local write.
    let m = std::sync::Arc::new(VecMemory::new(64));
    for bad in [AccessFlags::REMOTE_WRITE, AccessFlags::REMOTE_ATOMIC] {
        assert_eq!(
            e.reg_mr(a.pd, 0x1000, bad, m.clone()).unwrap_err().errno(),
            errno::EINVAL
        );
    }
    assert!(e
        .reg_mr(a.pd, u64::MAX - 10, AccessFlags::LOCAL_WRITE, m.clone())
        .is_err());
    // Destroying the QP, then the MR, frees the CQ and the PD.
    e.destroy_qp(a.qpn).unwrap();
    assert_eq!(e.qp_state(a.qpn), None);
    e.dereg_mr(a.keys.lkey).unwrap();
    assert!(e.dereg_mr(a.keys.lkey).is_err());
    e.destroy_cq(a.cq).unwrap();
    e.dealloc_pd(a.pd).unwrap();
}

#[test]
fn packets_for_a_destroyed_qp_are_dropped() {
    let (mut net, a, b) = rc();
    post_ok(&mut net, &a, write_wr(1, &a, 0, 8, &b, 0));
    net.nodes[1].destroy_qp(b.qpn).unwrap();
    let before = net.nodes[1].counters().dropped;
    run_for(&mut net, std::time::Duration::from_micros(100));
    assert_eq!(net.nodes[1].counters().dropped, before + 1);
    assert!(poll(&mut net, &a).is_empty());
}

#[test]
fn sends_and_receives_scatter_and_gather_over_many_sges() {
    let (mut net, a, b) = rc();
    // 8 source pieces (one empty) into 5 receive pieces.
    let data = pattern(3, 5000);
    let lens = [700u32, 1, 0, 1300, 999, 1000, 500, 500];
    let mut off = 0u64;
    let mut sg = Vec::new();
    for (i, &l) in lens.iter().enumerate() {
        let at = 10_000 * i as u64 + 3;
        a.mem.fill_from(
            at as usize,
            &data[off as usize..(off + u64::from(l)) as usize],
        );
        sg.push(sge(&a, at, l));
        off += u64::from(l);
    }
    let rl = [1u32, 2047, 1000, 1, 1951];
    let rsg: Vec<Sge> = rl
        .iter()
        .enumerate()
        .map(|(i, &l)| sge(&b, 20_000 * i as u64 + 7, l))
        .collect();
    net.nodes[1]
        .post_recv(
            b.qpn,
            &RecvWr {
                wr_id: 9,
                sg_list: rsg,
            },
        )
        .unwrap();
    post_ok(&mut net, &a, SendWr::new(1, SendOp::Send, sg.clone()));
    settle(&mut net);
    let r = poll(&mut net, &b);
    assert_eq!(statuses(&r), vec![(9, WcStatus::Success)]);
    assert_eq!(r[0].byte_len, 5000);
    let mut got = Vec::new();
    for (i, &l) in rl.iter().enumerate() {
        got.extend(mem(&b, 20_000 * i + 7, l as usize));
    }
    assert_eq!(got, data);
    // And a READ scattering back into the same 8 pieces.
    b.mem.fill_from(300_000, &pattern(4, 5000));
    for s in &sg {
        let o = (s.addr - a.base) as usize;
        a.mem.fill_from(o, &vec![0; s.length as usize]);
    }
    post_ok(
        &mut net,
        &a,
        SendWr::new(
            2,
            SendOp::Read {
                remote_addr: b.base + 300_000,
                rkey: b.keys.rkey,
            },
            sg.clone(),
        ),
    );
    settle(&mut net);
    assert_eq!(poll(&mut net, &a)[1].status, WcStatus::Success);
    let mut got = Vec::new();
    for s in &sg {
        got.extend(mem(&a, (s.addr - a.base) as usize, s.length as usize));
    }
    assert_eq!(got, pattern(4, 5000));
}
