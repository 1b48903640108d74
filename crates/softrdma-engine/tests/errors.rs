//! Every error completion, provoked the way hardware would see it, with the
//! QP state, events and memory checked afterwards.

mod common;
use std::time::Duration;

use common::*;
use softrdma_engine::sim::{NetConfig, SimNet};
use softrdma_engine::*;
use softrdma_wire::{AethRepr, BthRepr, Headers, Opcode, Psn, Syndrome};

fn rc() -> (SimNet, Side, Side) {
    pair(11, net5(), QpType::Rc, &ConnOpts::default())
}

/// After a fatal error on `s`: the QP is in ERR and an async event says so.
fn assert_fatal(net: &mut SimNet, s: &Side) {
    assert_eq!(net.nodes[s.node].qp_state(s.qpn), Some(QpState::Err));
    assert!(
        events(net, s.node).contains(&Event::QpFatal { qpn: s.qpn }),
        "no QpFatal event for QP {:#x}",
        s.qpn
    );
}

/// Runs a single WR on a fresh RC pair and returns its completion (after
/// the network settled), with the pair for further checks.
fn one_rc(wr: impl FnOnce(&Side, &Side) -> SendWr) -> (SimNet, Side, Side, WorkCompletion) {
    let (mut net, a, b) = rc();
    a.mem.fill_from(0, &pattern(1, 4096));
    let wr = wr(&a, &b);
    post_ok(&mut net, &a, wr);
    settle(&mut net);
    let wcs = poll(&mut net, &a);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    (net, a, b, wcs[0])
}

// ----- LOC_LEN_ERR -----

#[test]
fn loc_len_err_receive_buffer_too_small_for_a_send() {
    let (mut net, a, b) = rc();
    recv(&mut net, &b, 7, 0, 100);
    recv(&mut net, &b, 8, 1000, 100);
    post_ok(&mut net, &a, send_wr(1, &a, 0, 101));
    post_ok(&mut net, &a, send_wr(2, &a, 0, 10));
    settle(&mut net);
    // The receiver: the WQE completes with a local length error, the QP
    // fails and flushes the rest.
    let r = poll(&mut net, &b);
    assert_eq!(
        statuses(&r),
        vec![(7, WcStatus::LocLenErr), (8, WcStatus::WrFlushErr)]
    );
    assert_fatal(&mut net, &b);
    // The sender: the responder's invalid-request NAK.
    let s = poll(&mut net, &a);
    assert_eq!(
        statuses(&s),
        vec![(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)]
    );
    assert_fatal(&mut net, &a);
}

#[test]
fn loc_len_err_ud_send_larger_than_the_mtu() {
    let mut net = SimNet::new(2, 12, NetConfig::perfect());
    let a = make_side(&mut net, 0, QpType::Ud);
    let b = make_side(&mut net, 1, QpType::Ud);
    let o = ConnOpts::default();
    bring_up(&mut net, &a, &b, 1, 1, &o, QpType::Ud);
    bring_up(&mut net, &b, &a, 1, 1, &o, QpType::Ud);
    recv(&mut net, &b, 5, 0, 8192);
    let ah = net.nodes[0].create_ah(a.pd, av_for(1)).unwrap();
    let wire = sniff(&mut net);
    let mut w = send_wr(1, &a, 0, 4097);
    w.ud = Some(UdDest {
        ah,
        remote_qpn: b.qpn,
        remote_qkey: 0x1111_2222,
    });
    post_ok(&mut net, &a, w);
    settle(&mut net);
    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![(1, WcStatus::LocLenErr)]
    );
    assert!(
        sent_where(&wire, |_| true).is_empty(),
        "nothing may be sent"
    );
    assert!(poll(&mut net, &b).is_empty());
    // At exactly the MTU it goes.
    let now = net.now;
    net.nodes[0]
        .modify_qp(
            now,
            a.qpn,
            &QpAttr {
                qp_state: QpState::Rts,
                ..Default::default()
            },
            AttrMask::STATE,
        )
        .unwrap();
    let mut w = send_wr(2, &a, 0, 4096);
    w.ud = Some(UdDest {
        ah,
        remote_qpn: b.qpn,
        remote_qkey: 0x1111_2222,
    });
    post_ok(&mut net, &a, w);
    settle(&mut net);
    assert_eq!(statuses(&poll(&mut net, &a)), vec![(2, WcStatus::Success)]);
    let r = poll(&mut net, &b);
    assert_eq!(r[0].byte_len, 4096 + GRH_LEN as u32);
}

#[test]
fn loc_len_err_ud_receive_too_small() {
    let mut net = SimNet::new(2, 13, NetConfig::perfect());
    let a = make_side(&mut net, 0, QpType::Ud);
    let b = make_side(&mut net, 1, QpType::Ud);
    let o = ConnOpts::default();
    bring_up(&mut net, &a, &b, 1, 1, &o, QpType::Ud);
    bring_up(&mut net, &b, &a, 1, 1, &o, QpType::Ud);
    // Room for the payload but not for the GRH in front of it.
    recv(&mut net, &b, 5, 0, 100);
    recv(&mut net, &b, 6, 200, 140);
    let ah = net.nodes[0].create_ah(a.pd, av_for(1)).unwrap();
    for id in [1, 2] {
        let mut w = send_wr(id, &a, 0, 100);
        w.ud = Some(UdDest {
            ah,
            remote_qpn: b.qpn,
            remote_qkey: 0x1111_2222,
        });
        post_ok(&mut net, &a, w);
    }
    settle(&mut net);
    assert_eq!(
        statuses(&poll(&mut net, &b)),
        vec![(5, WcStatus::LocLenErr), (6, WcStatus::Success)]
    );
    // UD receive errors do not stop the QP.
    assert_eq!(net.nodes[1].qp_state(b.qpn), Some(QpState::Rts));
}

// ----- LOC_PROT_ERR -----

#[test]
fn loc_prot_err_bad_lkey() {
    let (mut net, a, _b, wc) = one_rc(|a, b| {
        let mut w = write_wr(1, a, 0, 100, b, 0);
        w.sg_list[0].lkey = Lkey::from_raw(a.keys.lkey.raw().wrapping_add(1));
        w
    });
    assert_eq!(wc.status, WcStatus::LocProtErr);
    assert_fatal(&mut net, &a);
}

#[test]
fn loc_prot_err_sge_outside_the_region() {
    for (off, len) in [(REGION as u64 - 10, 11u32), (u64::MAX - a_base_guard(), 1)] {
        let (mut net, a, _b, wc) = one_rc(|a, b| {
            let mut w = write_wr(1, a, 0, len, b, 0);
            w.sg_list[0].addr = a.base.wrapping_add(off);
            w
        });
        assert_eq!(wc.status, WcStatus::LocProtErr, "offset {off}");
        assert_fatal(&mut net, &a);
    }
    // An SGE just before the region.
    let (_, _, _, wc) = one_rc(|a, b| {
        let mut w = write_wr(1, a, 0, 4, b, 0);
        w.sg_list[0].addr = a.base - 1;
        w
    });
    assert_eq!(wc.status, WcStatus::LocProtErr);
}

fn a_base_guard() -> u64 {
    // Far past the region: addr + len must not wrap into it.
    0x1000
}

#[test]
fn loc_prot_err_read_into_a_region_without_local_write() {
    let (mut net, a, b) = rc();
    let (ro, ro_keys) = extra_mr(&mut net, &a, a.pd, 0x9000_0000, 4096, AccessFlags::empty());
    b.mem.fill_from(0, &pattern(2, 64));
    let wr = SendWr::new(
        1,
        SendOp::Read {
            remote_addr: b.base,
            rkey: b.keys.rkey,
        },
        vec![Sge {
            addr: 0x9000_0000,
            length: 64,
            lkey: ro_keys.lkey,
        }],
    );
    post_ok(&mut net, &a, wr);
    settle(&mut net);
    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![(1, WcStatus::LocProtErr)]
    );
    assert!(ro.snapshot().iter().all(|&x| x == 0));
    // The same region can be the source of a WRITE (local read is always allowed).
    let (mut net, a, b) = rc();
    let (ro, ro_keys) = extra_mr(&mut net, &a, a.pd, 0x9000_0000, 4096, AccessFlags::empty());
    ro.fill_from(0, &pattern(3, 64));
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote_addr: b.base,
            rkey: b.keys.rkey,
        },
        vec![Sge {
            addr: 0x9000_0000,
            length: 64,
            lkey: ro_keys.lkey,
        }],
    );
    post_ok(&mut net, &a, wr);
    settle(&mut net);
    assert_eq!(statuses(&poll(&mut net, &a)), vec![(1, WcStatus::Success)]);
    assert_eq!(mem(&b, 0, 64), pattern(3, 64));
}

#[test]
fn loc_prot_err_region_of_another_pd() {
    let (mut net, a, b) = rc();
    let pd2 = net.nodes[0].alloc_pd();
    let (_m, k) = extra_mr(&mut net, &a, pd2, 0x9000_0000, 4096, all_access());
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote_addr: b.base,
            rkey: b.keys.rkey,
        },
        vec![Sge {
            addr: 0x9000_0000,
            length: 8,
            lkey: k.lkey,
        }],
    );
    post_ok(&mut net, &a, wr);
    settle(&mut net);
    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![(1, WcStatus::LocProtErr)]
    );
}

// ----- LOC_QP_OP_ERR -----

#[test]
fn loc_qp_op_err_ud_address_handle_of_another_pd_or_destroyed() {
    let mut net = SimNet::new(2, 14, NetConfig::perfect());
    let a = make_side(&mut net, 0, QpType::Ud);
    let b = make_side(&mut net, 1, QpType::Ud);
    let o = ConnOpts::default();
    bring_up(&mut net, &a, &b, 1, 1, &o, QpType::Ud);
    bring_up(&mut net, &b, &a, 1, 1, &o, QpType::Ud);
    recv(&mut net, &b, 5, 0, 8192);
    let pd2 = net.nodes[0].alloc_pd();
    let foreign = net.nodes[0].create_ah(pd2, av_for(1)).unwrap();
    let gone = net.nodes[0].create_ah(a.pd, av_for(1)).unwrap();
    net.nodes[0].destroy_ah(gone).unwrap();
    let wire = sniff(&mut net);
    for (id, ah) in [(1, foreign), (2, gone)] {
        let mut w = send_wr(id, &a, 0, 10);
        w.ud = Some(UdDest {
            ah,
            remote_qpn: b.qpn,
            remote_qkey: 0x1111_2222,
        });
        post_ok(&mut net, &a, w);
        settle(&mut net);
        assert_eq!(
            statuses(&poll(&mut net, &a)),
            vec![(id, WcStatus::LocQpOpErr)]
        );
        assert_eq!(net.nodes[0].qp_state(a.qpn), Some(QpState::Sqe));
        let now = net.now;
        net.nodes[0]
            .modify_qp(
                now,
                a.qpn,
                &QpAttr {
                    qp_state: QpState::Rts,
                    ..Default::default()
                },
                AttrMask::STATE,
            )
            .unwrap();
    }
    assert!(sent_where(&wire, |_| true).is_empty());
    assert!(poll(&mut net, &b).is_empty());
}

// ----- REM_INV_REQ_ERR -----

#[test]
fn rem_inv_req_err_misaligned_atomic() {
    for op in ["cas", "faa"] {
        let (mut net, a, b) = rc();
        b.mem.fill_from(0, &[7u8; 32]);
        let remote_addr = b.base + 4;
        let sop = if op == "cas" {
            SendOp::CompareSwap {
                remote_addr,
                rkey: b.keys.rkey,
                compare: 0,
                swap: 1,
            }
        } else {
            SendOp::FetchAdd {
                remote_addr,
                rkey: b.keys.rkey,
                add: 1,
            }
        };
        post_ok(&mut net, &a, SendWr::new(1, sop, vec![sge(&a, 0, 8)]));
        settle(&mut net);
        assert_eq!(
            statuses(&poll(&mut net, &a)),
            vec![(1, WcStatus::RemInvReqErr)]
        );
        assert_eq!(mem(&b, 0, 32), vec![7u8; 32], "memory must be untouched");
        assert_fatal(&mut net, &a);
        assert_fatal(&mut net, &b);
    }
}

// ----- REM_ACCESS_ERR -----

/// Runs `op` against `b`'s memory and expects REM_ACCESS_ERR with the
/// target region untouched.
fn expect_rem_access(
    name: &str,
    setup: impl FnOnce(&mut SimNet, &Side, &Side) -> (u64, Rkey),
    op: impl Fn(u64, Rkey) -> SendOp,
) {
    let (mut net, a, b) = rc();
    b.mem.fill_from(0, &[0xAB; 256]);
    a.mem.fill_from(0, &[0xCD; 256]);
    let (addr, rkey) = setup(&mut net, &a, &b);
    post_ok(
        &mut net,
        &a,
        SendWr::new(1, op(addr, rkey), vec![sge(&a, 0, 8)]),
    );
    post_ok(&mut net, &a, send_wr(2, &a, 0, 8));
    settle(&mut net);
    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)],
        "{name}"
    );
    assert_eq!(mem(&b, 0, 256), vec![0xAB; 256], "{name}: target touched");
    assert_eq!(mem(&a, 0, 8), vec![0xCD; 8], "{name}: local buffer touched");
    assert_fatal(&mut net, &a);
    assert_fatal(&mut net, &b);
}

/// Builds a remote operation on (address, rkey).
type MakeOp = fn(u64, Rkey) -> SendOp;

fn ops() -> Vec<(&'static str, MakeOp)> {
    vec![
        ("WRITE", |remote_addr, rkey| SendOp::Write {
            remote_addr,
            rkey,
        }),
        ("READ", |remote_addr, rkey| SendOp::Read {
            remote_addr,
            rkey,
        }),
        ("FETCH_ADD", |remote_addr, rkey| SendOp::FetchAdd {
            remote_addr,
            rkey,
            add: 1,
        }),
        ("CMP_SWAP", |remote_addr, rkey| SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare: 0xABAB_ABAB_ABAB_ABAB,
            swap: 0,
        }),
    ]
}

#[test]
fn rem_access_err_bad_rkey_and_out_of_bounds() {
    for (name, op) in ops() {
        expect_rem_access(
            &format!("{name} bad rkey"),
            |_, _, b| (b.base, Rkey::from_raw(b.keys.rkey.raw() ^ 1)),
            op,
        );
        expect_rem_access(
            &format!("{name} past the end"),
            |_, _, b| (b.base + REGION as u64, b.keys.rkey),
            op,
        );
        // 8 bytes that start inside and end outside (atomics must stay aligned).
        let across = if name == "WRITE" || name == "READ" {
            4
        } else {
            0
        };
        if across > 0 {
            expect_rem_access(
                &format!("{name} across the end"),
                |_, _, b| (b.base + REGION as u64 - across, b.keys.rkey),
                op,
            );
        }
        expect_rem_access(
            &format!("{name} before the start"),
            |_, _, b| (b.base - 8, b.keys.rkey),
            op,
        );
        // The local key is not a remote key.
        expect_rem_access(
            &format!("{name} lkey as rkey"),
            |_, _, b| (b.base, Rkey::from_raw(b.keys.lkey.raw())),
            op,
        );
    }
}

/// Posts `op` from `a` on a second region of `b` (IOVA 0x7700_0000, 4 KiB,
/// `access`, in `b`'s PD or a new one) after `prepare` (e.g. deregistration);
/// returns the completion status. When it is not a success, the region must
/// not have been accessed at all after `prepare`.
fn op_on_extra_region(
    name: &str,
    op: MakeOp,
    other_pd: bool,
    access: AccessFlags,
    prepare: impl FnOnce(&mut SimNet, MrKeys),
) -> WcStatus {
    let (mut net, a, b) = rc();
    let pd = if other_pd {
        net.nodes[1].alloc_pd()
    } else {
        b.pd
    };
    let (m, k) = extra_mr(&mut net, &b, pd, 0x7700_0000, 4096, access);
    m.fill_from(0, &[0xAB; 64]);
    prepare(&mut net, k);
    let accesses = m.accesses();
    post_ok(
        &mut net,
        &a,
        SendWr::new(1, op(0x7700_0000, k.rkey), vec![sge(&a, 0, 8)]),
    );
    settle(&mut net);
    let wcs = poll(&mut net, &a);
    assert_eq!(wcs.len(), 1, "{name}: {wcs:?}");
    if wcs[0].status != WcStatus::Success {
        assert_eq!(m.accesses(), accesses, "{name}: the region was touched");
        assert_eq!(&m.snapshot()[..64], &[0xAB; 64][..], "{name}");
    }
    wcs[0].status
}

#[test]
fn rem_access_err_missing_rights_on_the_region() {
    let want = [
        ("WRITE", AccessFlags::REMOTE_WRITE),
        ("READ", AccessFlags::REMOTE_READ),
        ("FETCH_ADD", AccessFlags::REMOTE_ATOMIC),
        ("CMP_SWAP", AccessFlags::REMOTE_ATOMIC),
    ];
    for ((name, op), (_, needed)) in ops().into_iter().zip(want) {
        // A region with every right but the one needed; with it, it works.
        let all = all_access();
        let access = AccessFlags::from_bits_retain(all.bits() & !needed.bits());
        let status = op_on_extra_region(name, op, false, access, |_, _| {});
        assert_eq!(status, WcStatus::RemAccessErr, "{name}");
        let status = op_on_extra_region(name, op, false, all, |_, _| {});
        assert_eq!(status, WcStatus::Success, "{name}");
    }
}

#[test]
fn rem_access_err_missing_rights_on_the_qp() {
    let want = [
        ("WRITE", AccessFlags::REMOTE_WRITE),
        ("READ", AccessFlags::REMOTE_READ),
        ("FETCH_ADD", AccessFlags::REMOTE_ATOMIC),
        ("CMP_SWAP", AccessFlags::REMOTE_ATOMIC),
    ];
    for ((name, op), (_, needed)) in ops().into_iter().zip(want) {
        expect_rem_access(
            &format!("{name} without the QP right"),
            |net, _, b| {
                let all = all_access();
                let now = net.now;
                net.nodes[b.node]
                    .modify_qp(
                        now,
                        b.qpn,
                        &QpAttr {
                            qp_state: QpState::Rts,
                            qp_access_flags: AccessFlags::from_bits_retain(
                                all.bits() & !needed.bits(),
                            ),
                            ..Default::default()
                        },
                        AttrMask::STATE | AttrMask::ACCESS_FLAGS,
                    )
                    .unwrap();
                (b.base, b.keys.rkey)
            },
            op,
        );
    }
}

#[test]
fn rem_access_err_region_of_another_pd() {
    for (name, op) in ops() {
        let status = op_on_extra_region(name, op, true, all_access(), |_, _| {});
        assert_eq!(status, WcStatus::RemAccessErr, "{name}");
    }
}

#[test]
fn rem_access_err_deregistered_region() {
    for (name, op) in ops() {
        let dereg = |net: &mut SimNet, k: MrKeys| net.nodes[1].dereg_mr(k.lkey).unwrap();
        let status = op_on_extra_region(name, op, false, all_access(), dereg);
        assert_eq!(status, WcStatus::RemAccessErr, "{name}");
    }
}

#[test]
fn deregistering_during_a_read_stops_the_responses() {
    // A READ of 64 KiB from a region deregistered after the responder sent
    // its first responses: no byte is read after dereg_mr returns, and the
    // requester gets REM_ACCESS_ERR.
    let (mut net, a, b) = rc();
    let (m, k) = extra_mr(&mut net, &b, b.pd, 0x7700_0000, 65536, all_access());
    m.fill_from(0, &pattern(4, 65536));
    // Take the READ request off the wire and drive b by hand.
    let wire = tap(&mut net, |p| {
        if p.from == 0 {
            softrdma_engine::sim::Verdict::Drop
        } else {
            softrdma_engine::sim::Verdict::Pass
        }
    });
    post_ok(
        &mut net,
        &a,
        SendWr::new(
            1,
            SendOp::Read {
                remote_addr: 0x7700_0000,
                rkey: k.rkey,
            },
            vec![sge(&a, 0, 65536)],
        ),
    );
    net.step();
    let req = sent_where(&wire, |p| p.from == 0)[0].clone();
    net.set_tap(None);
    inject(&mut net, 1, req.ep, &req.bytes);
    let now = net.now;
    let mut buf = vec![0u8; 9000];
    for _ in 0..3 {
        let t = net.nodes[1].poll_transmit(now, &mut buf).unwrap();
        let p = softrdma_wire::PacketRepr::parse(&buf[..t.len]).unwrap();
        assert_eq!(
            p.bth.opcode.info().kind,
            softrdma_wire::OpKind::ReadResponse
        );
        inject(&mut net, 0, t.endpoints, &buf[..t.len]);
    }
    let before = m.accesses();
    assert_eq!(before, 3, "one access per response sent");
    net.nodes[1].dereg_mr(k.lkey).unwrap();
    // The next packet is a remote access error NAK, and nothing else follows.
    let t = net.nodes[1].poll_transmit(now, &mut buf).unwrap();
    let p = softrdma_wire::PacketRepr::parse(&buf[..t.len]).unwrap();
    assert_eq!(
        p.headers.aeth().unwrap().syndrome,
        Syndrome::Nak(softrdma_wire::NakCode::RemoteAccessError)
    );
    inject(&mut net, 0, t.endpoints, &buf[..t.len]);
    assert!(net.nodes[1].poll_transmit(now, &mut buf).is_none());
    settle(&mut net);
    assert_eq!(m.accesses(), before, "read after dereg_mr");
    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![(1, WcStatus::RemAccessErr)]
    );
    // What arrived before the error was placed; nothing after it.
    assert_eq!(mem(&a, 0, 3 * 1024), pattern(4, 3 * 1024));
    assert!(mem(&a, 3 * 1024, 1024).iter().all(|&x| x == 0));
    assert_fatal(&mut net, &b);
}

// ----- REM_OP_ERR -----

#[test]
fn rem_op_err_receive_wqe_with_a_bad_lkey() {
    let (mut net, a, b) = rc();
    net.nodes[1]
        .post_recv(
            b.qpn,
            &RecvWr {
                wr_id: 9,
                sg_list: vec![Sge {
                    addr: b.base,
                    length: 100,
                    lkey: Lkey::from_raw(0xDEAD_BEEF),
                }],
            },
        )
        .unwrap();
    post_ok(&mut net, &a, send_wr(1, &a, 0, 50));
    settle(&mut net);
    assert_eq!(statuses(&poll(&mut net, &a)), vec![(1, WcStatus::RemOpErr)]);
    assert_eq!(
        statuses(&poll(&mut net, &b)),
        vec![(9, WcStatus::LocProtErr)]
    );
    assert_fatal(&mut net, &a);
    assert_fatal(&mut net, &b);
}

// ----- RETRY_EXC_ERR -----

#[test]
fn retry_exc_err_on_a_partitioned_link_after_timeout_times_retries() {
    for retry_cnt in [0u8, 2, 7] {
        let o = ConnOpts {
            timeout: 10, // 4.194304 ms
            retry_cnt,
            ..Default::default()
        };
        let (mut net, a, b) = pair(16, net5(), QpType::Rc, &o);
        net.set_partition(0, 1, true);
        let t0 = net.now;
        post_ok(&mut net, &a, write_wr(1, &a, 0, 100, &b, 0));
        post_ok(&mut net, &a, send_wr(2, &a, 0, 10));
        let w = wait_wcs(&mut net, &a, 2, LONG);
        let took = net.now - t0;
        assert_eq!(
            statuses(&w),
            vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
        );
        let t = local_ack_timeout(10).unwrap();
        let want = t * (u32::from(retry_cnt) + 1);
        assert!(
            took >= want && took < want + Duration::from_micros(100),
            "retry_cnt {retry_cnt}: failed after {took:?}, expected {want:?}"
        );
        let c = qp_counters(&net, &a);
        assert_eq!(c.timeouts, u64::from(retry_cnt) + 1);
        assert_eq!(
            c.retransmits,
            2 * u64::from(retry_cnt),
            "both WRs resent each time"
        );
        assert_fatal(&mut net, &a);
    }
}

#[test]
fn a_healed_partition_within_the_budget_loses_nothing() {
    let o = ConnOpts {
        timeout: 10,
        retry_cnt: 3,
        ..Default::default()
    };
    let (mut net, a, b) = pair(17, net5(), QpType::Rc, &o);
    net.set_partition(0, 1, true);
    a.mem.fill_from(0, &pattern(6, 5000));
    post_ok(&mut net, &a, write_wr(1, &a, 0, 5000, &b, 0));
    // The first three tries (at 0, T and 2T) are lost; the fourth, at 3T,
    // with the last retry, gets through.
    run_for(&mut net, local_ack_timeout(10).unwrap() * 5 / 2);
    net.set_partition(0, 1, false);
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);
    assert_eq!(mem(&b, 0, 5000), pattern(6, 5000));
    assert_eq!(qp_counters(&net, &a).timeouts, 3);
}

// ----- RNR_RETRY_EXC_ERR -----

#[test]
fn rnr_retry_exc_err_without_a_receive() {
    for rnr_retry in [0u8, 3] {
        let o = ConnOpts {
            rnr_retry,
            min_rnr_timer: 14, // 1.28 ms
            ..Default::default()
        };
        let (mut net, a, b) = pair(18, net5(), QpType::Rc, &o);
        let t0 = net.now;
        post_ok(&mut net, &a, send_wr(1, &a, 0, 10));
        let w = wait_wcs(&mut net, &a, 1, LONG);
        assert_eq!(statuses(&w), vec![(1, WcStatus::RnrRetryExcErr)]);
        let took = net.now - t0;
        let waits = Duration::from_micros(1280) * u32::from(rnr_retry);
        assert!(
            took >= waits && took < waits + Duration::from_micros(100),
            "rnr_retry {rnr_retry}: took {took:?}"
        );
        assert_eq!(
            qp_counters(&net, &a).rnr_naks_rcvd,
            u64::from(rnr_retry) + 1
        );
        assert_eq!(
            qp_counters(&net, &b).rnr_naks_sent,
            u64::from(rnr_retry) + 1
        );
        assert_fatal(&mut net, &a);
        // The responder is fine: RNR is not an error there.
        assert_eq!(net.nodes[1].qp_state(b.qpn), Some(QpState::Rts));
    }
}

#[test]
fn rnr_retry_7_waits_for_a_receive_however_long() {
    let o = ConnOpts {
        rnr_retry: 7,
        min_rnr_timer: 14,
        ..Default::default()
    };
    let (mut net, a, b) = pair(19, net5(), QpType::Rc, &o);
    a.mem.fill_from(0, &pattern(8, 3000));
    // Several SENDs queued behind the first: their packets must not spend
    // transport retries while the responder has no receive.
    for i in 0..4 {
        post_ok(&mut net, &a, send_wr(i, &a, 0, 3000));
    }
    run_for(&mut net, Duration::from_secs(2));
    assert!(poll(&mut net, &a).is_empty());
    assert!(qp_counters(&net, &a).rnr_naks_rcvd > 1000);
    assert_eq!(net.nodes[0].qp_state(a.qpn), Some(QpState::Rts));
    for i in 0..4 {
        recv(&mut net, &b, 100 + i, 4000 * i, 3000);
    }
    let w = wait_wcs(&mut net, &a, 4, LONG);
    assert_eq!(
        statuses(&w),
        (0..4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    let r = poll(&mut net, &b);
    assert_eq!(r.len(), 4);
    for i in 0..4 {
        assert_eq!(mem(&b, 4000 * i as usize, 3000), pattern(8, 3000));
    }
    assert_eq!(
        qp_counters(&net, &a).seq_naks_rcvd,
        0,
        "no sequence NAKs behind an RNR NAK"
    );
}

// ----- WR_FLUSH_ERR (besides the cases above) -----

#[test]
fn wr_flush_err_for_everything_behind_an_error() {
    let (mut net, a, b) = rc();
    let mut bad = write_wr(2, &a, 0, 10, &b, 0);
    bad.sg_list[0].lkey = Lkey::from_raw(bad.sg_list[0].lkey.raw() ^ 1);
    post_ok(&mut net, &a, write_wr(1, &a, 0, 10, &b, 0));
    post_ok(&mut net, &a, bad);
    post_ok(&mut net, &a, unsignaled(write_wr(3, &a, 0, 10, &b, 0)));
    post_ok(&mut net, &a, read_wr(4, &a, 0, 10, &b, 0));
    recv(&mut net, &a, 5, 0, 10);
    settle(&mut net);
    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::LocProtErr),
            (3, WcStatus::WrFlushErr),
            (4, WcStatus::WrFlushErr),
            (5, WcStatus::WrFlushErr),
        ]
    );
}

/// A QP that fails because its responder refused the peer's request
/// flushes its own outstanding WRs, and the peer may already have executed
/// them: a flush says nothing about the remote side. Here `a`'s WRITE_WITH_IMM
/// and a later WRITE into its target reach `b` in the same instant as `b`'s
/// READ past the end of `a`'s region reaches `a`: `a` goes to ERR and
/// flushes both, while `b` has placed both and completed the receive (the
/// case of simulation seed 90035607).
#[test]
fn wrs_flushed_by_a_responder_error_may_already_have_run_at_the_peer() {
    let (mut net, a, b) = rc();
    a.mem.fill_from(0, &pattern(1, 1024));
    a.mem.fill_from(3000, &pattern(2, 8));
    recv(&mut net, &b, 7, 0, 64);
    let imm_write = SendWr::new(
        1,
        SendOp::WriteWithImm {
            remote_addr: b.base,
            rkey: b.keys.rkey,
            imm: 0x33,
        },
        vec![sge(&a, 0, 1024)],
    );
    post_ok(&mut net, &a, imm_write);
    post_ok(&mut net, &a, write_wr(2, &a, 3000, 8, &b, 100));
    let past_the_end = read_wr(9, &b, 0, 16, &a, REGION as u64 - 8);
    post_ok(&mut net, &b, past_the_end);
    settle(&mut net);

    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)],
        "a's QP failed before any ACK came back"
    );
    assert_fatal(&mut net, &a);
    let at_b = poll(&mut net, &b);
    let receive = at_b.iter().find(|w| w.wr_id == 7).expect("no receive at b");
    assert_eq!(
        (
            receive.status,
            receive.opcode,
            receive.byte_len,
            receive.imm_data
        ),
        (WcStatus::Success, WcOpcode::RecvRdmaWithImm, 1024, 0x33),
        "b placed the whole WRITE_WITH_IMM"
    );
    assert!(
        at_b.iter()
            .any(|w| w.wr_id == 9 && w.status == WcStatus::RemAccessErr),
        "b's READ was refused: {at_b:?}"
    );
    let mut want = pattern(1, 1024);
    want[100..108].copy_from_slice(&pattern(2, 8));
    assert_eq!(
        mem(&b, 0, 1024),
        want,
        "b holds the WRITE_WITH_IMM's data, overwritten by the later WRITE"
    );
}

// ----- BAD_RESP_ERR -----

#[test]
fn bad_resp_err_atomic_ack_for_a_write() {
    let (mut net, a, b) = rc();
    // b's answers never reach a: only the forged one does.
    net.set_partition(1, 0, true);
    post_ok(&mut net, &a, write_wr(1, &a, 0, 10, &b, 0));
    post_ok(&mut net, &a, write_wr(2, &a, 0, 10, &b, 0));
    run_for(&mut net, Duration::from_micros(100));
    let psn = ConnOpts::default().psn_a; // the first WR's PSN
    forge(
        &mut net,
        &b,
        &a,
        BthRepr::new(Opcode::RC_ATOMIC_ACK, a.qpn.raw(), Psn::new(psn)),
        Headers::AtomicAck(
            AethRepr {
                syndrome: Syndrome::Ack { credits: 31 },
                msn: softrdma_wire::Msn::new(1),
            },
            0x1234,
        ),
        &[],
    );
    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![(1, WcStatus::BadRespErr), (2, WcStatus::WrFlushErr)]
    );
    assert_fatal(&mut net, &a);
}

#[test]
fn bad_resp_err_read_response_of_the_wrong_size() {
    let (mut net, a, b) = rc();
    net.set_partition(1, 0, true);
    post_ok(&mut net, &a, read_wr(1, &a, 0, 100, &b, 0));
    run_for(&mut net, Duration::from_micros(100));
    let psn = ConnOpts::default().psn_a;
    forge(
        &mut net,
        &b,
        &a,
        BthRepr::new(Opcode::RC_READ_RESPONSE_ONLY, a.qpn.raw(), Psn::new(psn)),
        Headers::Aeth(AethRepr {
            syndrome: Syndrome::Ack { credits: 31 },
            msn: softrdma_wire::Msn::new(1),
        }),
        &[0u8; 60],
    );
    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![(1, WcStatus::BadRespErr)]
    );
    assert!(mem(&a, 0, 100).iter().all(|&x| x == 0), "nothing placed");
}

#[test]
fn forged_responses_for_unsent_psns_are_dropped() {
    let (mut net, a, b) = rc();
    net.set_partition(1, 0, true);
    post_ok(&mut net, &a, write_wr(1, &a, 0, 10, &b, 0));
    run_for(&mut net, Duration::from_micros(100));
    let psn = ConnOpts::default().psn_a;
    // An ACK for a PSN never sent is ignored, as is one with a bad ICRC.
    forge(
        &mut net,
        &b,
        &a,
        BthRepr::new(Opcode::RC_ACK, a.qpn.raw(), Psn::new(psn + 5)),
        Headers::Aeth(AethRepr {
            syndrome: Syndrome::Ack { credits: 31 },
            msn: softrdma_wire::Msn::new(1),
        }),
        &[],
    );
    assert!(poll(&mut net, &a).is_empty());
    assert_eq!(net.nodes[0].qp_state(a.qpn), Some(QpState::Rts));
    net.set_partition(1, 0, false);
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);
}

#[test]
fn an_error_nak_that_overtakes_a_reads_response_fails_the_right_wr() {
    // READ, then a WRITE with a bad rkey. The READ's response is held back
    // and arrives after the NAK for the WRITE: the READ still succeeds with
    // its data, and the WRITE (not the READ) gets REM_ACCESS_ERR.
    let (mut net, a, b) = rc();
    b.mem.fill_from(0, &pattern(5, 100));
    let held = tap(&mut net, |p| {
        if p.from == 1 && p.kind == softrdma_wire::OpKind::ReadResponse {
            softrdma_engine::sim::Verdict::Drop
        } else {
            softrdma_engine::sim::Verdict::Pass
        }
    });
    post_ok(&mut net, &a, read_wr(1, &a, 0, 100, &b, 0));
    let mut bad = write_wr(2, &a, 0, 10, &b, 0);
    if let SendOp::Write { rkey, .. } = &mut bad.op {
        *rkey = Rkey::from_raw(rkey.raw() ^ 0x0F0F);
    }
    post_ok(&mut net, &a, bad);
    post_ok(&mut net, &a, send_wr(3, &a, 0, 10));
    run_for(&mut net, Duration::from_millis(1));
    // The NAK arrived, the READ's response did not: nothing completes yet
    // (the READ is asked for again, which a responder in ERR ignores).
    assert_eq!(qp_counters(&net, &b).error_naks_sent, 1);
    assert!(poll(&mut net, &a).is_empty());
    let resp = sent_where(&held, |p| {
        p.from == 1 && p.kind == softrdma_wire::OpKind::ReadResponse
    })
    .remove(0);
    net.set_tap(None);
    inject(&mut net, 0, resp.ep, &resp.bytes);
    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::RemAccessErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(mem(&a, 0, 100), pattern(5, 100));
    assert_fatal(&mut net, &a);
}

#[test]
fn an_error_nak_after_a_lost_read_response_ends_in_retry_exc() {
    // The same, but the READ's response is lost for good: the responder is
    // in ERR and will not answer again, so the READ (the oldest WR) runs out
    // of retries; nothing claims success.
    let o = ConnOpts {
        timeout: 8,
        retry_cnt: 2,
        ..Default::default()
    };
    let (mut net, a, b) = pair(41, net5(), QpType::Rc, &o);
    drop_nth(&mut net, 0, |p| {
        p.from == 1 && p.kind == softrdma_wire::OpKind::ReadResponse
    });
    post_ok(&mut net, &a, read_wr(1, &a, 0, 100, &b, 0));
    let mut bad = write_wr(2, &a, 0, 10, &b, 0);
    if let SendOp::Write { rkey, .. } = &mut bad.op {
        *rkey = Rkey::from_raw(rkey.raw() ^ 0x0F0F);
    }
    post_ok(&mut net, &a, bad);
    settle(&mut net);
    assert_eq!(
        statuses(&poll(&mut net, &a)),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
}
