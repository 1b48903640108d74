//! `Engine::rereg_mr` (`ibv_rereg_mr`): new rights, PD or memory under the
//! same keys, all or nothing; and a QP reset forgets its completions.

mod common;
use std::sync::Arc;

use common::*;
use softrdma_engine::*;

fn rc() -> (softrdma_engine::sim::SimNet, Side, Side) {
    pair(81, net5(), QpType::Rc, &ConnOpts::default())
}

#[test]
fn rereg_keeps_the_keys_and_applies_the_new_rights() {
    let (mut net, a, b) = rc();
    b.mem.write(0, &[7; 16]);
    // Without remote write, a peer's WRITE under the same rkey is refused.
    net.nodes[1]
        .rereg_mr(b.keys.lkey, None, Some(AccessFlags::LOCAL_WRITE), None)
        .unwrap();
    a.mem.write(0, &[1; 16]);
    post_ok(&mut net, &a, write_wr(1, &a, 0, 16, &b, 0));
    let wcs = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&wcs), [(1, WcStatus::RemAccessErr)]);
    assert_eq!(mem(&b, 0, 16), [7; 16], "the target stays untouched");
    assert_eq!(
        net.nodes[1].mr_access(b.keys.lkey),
        Some(AccessFlags::LOCAL_WRITE)
    );
}

#[test]
fn rereg_gives_new_memory_under_the_same_keys() {
    let (mut net, a, b) = rc();
    let fresh = Arc::new(VecMemory::new(4096));
    net.nodes[1]
        .rereg_mr(b.keys.lkey, None, None, Some((0x5000, fresh.clone())))
        .unwrap();
    let (iova, len, keys) = net.nodes[1].mr_info(b.keys.lkey).unwrap();
    assert_eq!((iova, len, keys), (0x5000, 4096, b.keys));
    a.mem.write(0, &[9; 32]);
    let wr = SendWr::new(
        2,
        SendOp::Write {
            remote_addr: 0x5000 + 100,
            rkey: b.keys.rkey,
        },
        vec![sge(&a, 0, 32)],
    );
    post_ok(&mut net, &a, with_flags(wr, SendFlags::SIGNALED));
    let wcs = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&wcs), [(2, WcStatus::Success)]);
    assert_eq!(&fresh.snapshot()[100..132], &[9; 32]);
    assert_eq!(mem(&b, 100, 32), [0; 32], "the old memory is not written");
}

#[test]
fn a_refused_rereg_changes_nothing() {
    let (mut net, _a, b) = rc();
    let e = &mut net.nodes[1];
    let before = (e.mr_info(b.keys.lkey), e.mr_access(b.keys.lkey));
    // Remote write without local write, and a PD that does not exist.
    let r = e.rereg_mr(b.keys.lkey, None, Some(AccessFlags::REMOTE_WRITE), None);
    assert_eq!(r.unwrap_err().errno(), errno::EINVAL);
    let bogus = PdHandle::from_raw(0xdead);
    let fresh: Arc<dyn RegionMemory> = Arc::new(VecMemory::new(64));
    let r = e.rereg_mr(b.keys.lkey, Some(bogus), None, Some((0, fresh)));
    assert!(r.is_err());
    assert_eq!(before, (e.mr_info(b.keys.lkey), e.mr_access(b.keys.lkey)));
    // Moving to another PD moves the PD reference to it.
    let pd2 = e.alloc_pd();
    e.rereg_mr(b.keys.lkey, Some(pd2), None, None).unwrap();
    assert_eq!(e.dealloc_pd(pd2).unwrap_err().errno(), errno::EBUSY);
}

#[test]
fn reset_forgets_the_qps_completions() {
    let (mut net, a, _b) = rc();
    recv(&mut net, &a, 5, 0, 64);
    let e = &mut net.nodes[0];
    let err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    e.modify_qp(net.now, a.qpn, &err, AttrMask::STATE).unwrap();
    settle(&mut net);
    assert_eq!(statuses(&poll(&mut net, &a)), [(5, WcStatus::WrFlushErr)]);
    // Another flushed receive, left in the CQ.
    recv(&mut net, &a, 6, 0, 64);
    settle(&mut net);
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..Default::default()
    };
    let e = &mut net.nodes[0];
    e.modify_qp(net.now, a.qpn, &reset, AttrMask::STATE)
        .unwrap();
    assert!(
        poll(&mut net, &a).is_empty(),
        "the flushed receive went with the reset"
    );
}
