//! `Engine::poll_change`: every change a driver publishing QPs and regions
//! must follow, in order, and a bounded queue when nobody asks.

mod common;
use std::sync::Arc;

use common::*;
use softrdma_engine::sim::SimNet;
use softrdma_engine::*;

fn drain(e: &mut Engine) -> Vec<ResourceChange> {
    std::iter::from_fn(|| e.poll_change()).collect()
}

#[test]
fn changes_come_out_in_order() {
    let mut net = SimNet::new(2, 5, net5());
    let a = make_side(&mut net, 0, QpType::Rc);
    let b = make_side(&mut net, 1, QpType::Rc);
    let e = &mut net.nodes[0];
    assert_eq!(
        drain(e),
        [ResourceChange::MrRegistered { rkey: a.keys.rkey }]
    );
    let o = ConnOpts::default();
    bring_up(&mut net, &a, &b, o.psn_a, o.psn_b, &o, QpType::Rc);
    let e = &mut net.nodes[0];
    let modified = ResourceChange::QpModified { qpn: a.qpn };
    assert_eq!(drain(e), [modified; 3], "INIT, RTR, RTS");
    // A refused modify changes nothing.
    let bad = QpAttr {
        qp_state: QpState::Rtr,
        ..Default::default()
    };
    assert!(e.modify_qp(net.now, a.qpn, &bad, AttrMask::STATE).is_err());
    let e = &mut net.nodes[0];
    assert_eq!(drain(e), []);
    e.destroy_qp(a.qpn).unwrap();
    e.dereg_mr(a.keys.lkey).unwrap();
    assert_eq!(
        drain(e),
        [
            ResourceChange::QpDestroyed { qpn: a.qpn },
            ResourceChange::MrDeregistered { rkey: a.keys.rkey }
        ]
    );
}

#[test]
fn an_unread_queue_collapses_to_lost() {
    let mut net = SimNet::new(1, 6, net5());
    let e = &mut net.nodes[0];
    let pd = e.alloc_pd();
    for _ in 0..1000 {
        let k = e
            .reg_mr(
                pd,
                0x1000,
                AccessFlags::LOCAL_WRITE,
                Arc::new(VecMemory::new(64)),
            )
            .unwrap();
        e.dereg_mr(k.lkey).unwrap();
    }
    assert_eq!(drain(e), [ResourceChange::Lost]);
    let k = e
        .reg_mr(
            pd,
            0x1000,
            AccessFlags::LOCAL_WRITE,
            Arc::new(VecMemory::new(64)),
        )
        .unwrap();
    assert_eq!(drain(e), [ResourceChange::MrRegistered { rkey: k.rkey }]);
}
