//! The same-host direct path's rules (`Engine::plan_direct`,
//! `check_direct_target`, `complete_direct`) against the packet path: every
//! WR the direct path refuses, posted normally, ends the way hardware ends
//! it, and a WR it executes completes exactly as over the network.

mod common;
use std::sync::Arc;

use common::*;
use softrdma_engine::rules::{PostSendError, RemoteDenied};
use softrdma_engine::sim::SimNet;
use softrdma_engine::*;

/// A pair whose regions offer addresses (as the driver's regions do).
fn direct_pair(qp_type: QpType) -> (SimNet, Side, Side) {
    let o = ConnOpts::default();
    let mut net = SimNet::new(2, 21, net5());
    let a = make_side_with(&mut net, 0, qp_type, VecMemory::by_reference(REGION));
    let b = make_side_with(&mut net, 1, qp_type, VecMemory::by_reference(REGION));
    bring_up(&mut net, &a, &b, o.psn_a, o.psn_b, &o, qp_type);
    bring_up(&mut net, &b, &a, o.psn_b, o.psn_a, &o, qp_type);
    (net, a, b)
}

/// A crafted view of the target: answers only for the QPN and rkeys it
/// knows, and counts what it was asked.
#[derive(Debug, Clone, Default)]
struct Peer {
    qpn: Qpn,
    qp: Option<PeerQp>,
    regions: Vec<(u32, PeerRegion)>,
    qp_asks: u32,
    region_asks: u32,
}

impl PeerView for Peer {
    fn qp(&mut self, qpn: Qpn) -> Option<PeerQp> {
        self.qp_asks += 1;
        self.qp.filter(|_| qpn == self.qpn)
    }
    fn region(&mut self, rkey: Rkey) -> Option<PeerRegion> {
        self.region_asks += 1;
        self.regions
            .iter()
            .find(|(k, _)| *k == rkey.raw())
            .map(|&(_, r)| r)
    }
}

/// What `b` would publish: its QP and its main region, as they are.
fn truthful(net: &SimNet, b: &Side) -> Peer {
    let (attr, init) = net.nodes[b.node].query_qp(b.qpn).unwrap();
    Peer {
        qpn: b.qpn,
        qp: Some(PeerQp {
            pd: init.pd,
            access: attr.qp_access_flags,
            state: attr.qp_state,
        }),
        regions: vec![(
            b.keys.rkey.raw(),
            region_of(net, b, b.keys.lkey, b.pd, all_access()),
        )],
        ..Default::default()
    }
}

fn region_of(net: &SimNet, s: &Side, lkey: Lkey, pd: PdHandle, access: AccessFlags) -> PeerRegion {
    let (iova, len, _) = net.nodes[s.node].mr_info(lkey).unwrap();
    PeerRegion {
        pd,
        access,
        iova,
        len,
    }
}

/// Registers a region of `len` bytes offering addresses on `s`'s node.
fn mr_at(
    net: &mut SimNet,
    s: &Side,
    pd: PdHandle,
    iova: u64,
    len: usize,
    access: AccessFlags,
) -> (Arc<VecMemory>, MrKeys) {
    let m = Arc::new(VecMemory::by_reference(len));
    let k = net.nodes[s.node]
        .reg_mr(pd, iova, access, m.clone())
        .unwrap();
    (m, k)
}

fn direct(
    net: &SimNet,
    a: &Side,
    wr: &SendWr,
    peer: &mut Peer,
) -> std::result::Result<u64, NotDirect> {
    let e = &net.nodes[a.node];
    let plan = e.plan_direct(a.qpn, wr)?;
    e.check_direct_target(&plan, peer)
}

/// How the same WR ends over the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    /// Its completion's status.
    Completes(WcStatus),
    /// `post_send` refuses it with this errno.
    PostFails(i32),
}

fn over_the_wire(net: &mut SimNet, a: &Side, wr: &SendWr) -> Wire {
    if let Err(e) = post(net, a, wr) {
        return Wire::PostFails(e.errno());
    }
    settle(net);
    let wcs = poll(net, a);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!(wcs[0].wr_id, wr.wr_id);
    Wire::Completes(wcs[0].status)
}

fn wr(op: SendOp, sges: Vec<Sge>) -> SendWr {
    SendWr::new(9, op, sges)
}

fn write_to(b: &Side, roff: u64) -> SendOp {
    SendOp::Write {
        remote_addr: b.base + roff,
        rkey: b.keys.rkey,
    }
}

fn read_from(b: &Side, roff: u64) -> SendOp {
    SendOp::Read {
        remote_addr: b.base + roff,
        rkey: b.keys.rkey,
    }
}

fn fetch_add_at(b: &Side, roff: u64) -> SendOp {
    SendOp::FetchAdd {
        remote_addr: b.base + roff,
        rkey: b.keys.rkey,
        add: 1,
    }
}

// ----- the wrap-around local SGE -----

#[test]
fn a_local_sge_that_wraps_around_is_refused_by_both_paths() {
    for op in ["WRITE", "READ"] {
        let (mut net, a, b) = direct_pair(QpType::Rc);
        b.mem.fill_from(0, &pattern(3, 64));
        let (_m, k) = mr_at(&mut net, &a, a.pd, 0, 4096, all_access());
        let sge = Sge {
            addr: u64::MAX - 7,
            length: 16,
            lkey: k.lkey,
        };
        let w = match op {
            "WRITE" => wr(write_to(&b, 0), vec![sge]),
            _ => wr(read_from(&b, 0), vec![sge]),
        };
        let plan = net.nodes[0].plan_direct(a.qpn, &w);
        assert_eq!(
            plan.err(),
            Some(NotDirect::LocalSge {
                index: 0,
                status: WcStatus::LocProtErr
            }),
            "{op}"
        );
        let wire = sniff(&mut net);
        assert_eq!(
            over_the_wire(&mut net, &a, &w),
            Wire::Completes(WcStatus::LocProtErr),
            "{op}"
        );
        assert!(sent_where(&wire, |p| p.from == 0).is_empty(), "{op}");
        assert_eq!(mem(&b, 0, 64), pattern(3, 64), "{op}: target changed");
    }
}

// ----- the matrix of violations -----

/// One violation: how the WR and the peer's view are made, what the direct
/// path says, and what the network gives.
struct Case {
    name: &'static str,
    qp_type: QpType,
    make: fn(&mut SimNet, &Side, &Side, &mut Peer) -> SendWr,
    direct: NotDirect,
    wire: Wire,
}

fn cases() -> Vec<Case> {
    let rc = QpType::Rc;
    vec![
        Case {
            name: "wrong rkey",
            qp_type: rc,
            make: |_, a, b, _| {
                let op = SendOp::Write {
                    remote_addr: b.base,
                    rkey: Rkey::from_raw(b.keys.rkey.raw() ^ 0x8000_0001),
                };
                wr(op, vec![sge(a, 0, 8)])
            },
            direct: NotDirect::Target(RemoteDenied::NoRegion),
            wire: Wire::Completes(WcStatus::RemAccessErr),
        },
        Case {
            name: "target region of another PD",
            qp_type: rc,
            make: |net, a, b, peer| {
                let pd2 = net.nodes[b.node].alloc_pd();
                let iova = 0x77_0000_0000;
                let (_m, k) = mr_at(net, b, pd2, iova, 4096, all_access());
                peer.regions
                    .push((k.rkey.raw(), region_of(net, b, k.lkey, pd2, all_access())));
                let op = SendOp::Write {
                    remote_addr: iova,
                    rkey: k.rkey,
                };
                wr(op, vec![sge(a, 0, 8)])
            },
            direct: NotDirect::Target(RemoteDenied::Pd),
            wire: Wire::Completes(WcStatus::RemAccessErr),
        },
        Case {
            name: "WRITE to a region without REMOTE_WRITE",
            qp_type: rc,
            make: |net, a, b, peer| {
                let acc = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
                let iova = 0x77_0000_0000;
                let (_m, k) = mr_at(net, b, b.pd, iova, 4096, acc);
                peer.regions
                    .push((k.rkey.raw(), region_of(net, b, k.lkey, b.pd, acc)));
                let op = SendOp::Write {
                    remote_addr: iova,
                    rkey: k.rkey,
                };
                wr(op, vec![sge(a, 0, 8)])
            },
            direct: NotDirect::Target(RemoteDenied::RegionAccess),
            wire: Wire::Completes(WcStatus::RemAccessErr),
        },
        Case {
            name: "READ from a region without REMOTE_READ",
            qp_type: rc,
            make: |net, a, b, peer| {
                let acc = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
                let iova = 0x77_0000_0000;
                let (_m, k) = mr_at(net, b, b.pd, iova, 4096, acc);
                peer.regions
                    .push((k.rkey.raw(), region_of(net, b, k.lkey, b.pd, acc)));
                let op = SendOp::Read {
                    remote_addr: iova,
                    rkey: k.rkey,
                };
                wr(op, vec![sge(a, 0, 8)])
            },
            direct: NotDirect::Target(RemoteDenied::RegionAccess),
            wire: Wire::Completes(WcStatus::RemAccessErr),
        },
        Case {
            name: "atomic on a region without REMOTE_ATOMIC",
            qp_type: rc,
            make: |net, a, b, peer| {
                let acc = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
                let iova = 0x77_0000_0000;
                let (_m, k) = mr_at(net, b, b.pd, iova, 4096, acc);
                peer.regions
                    .push((k.rkey.raw(), region_of(net, b, k.lkey, b.pd, acc)));
                let op = SendOp::FetchAdd {
                    remote_addr: iova,
                    rkey: k.rkey,
                    add: 1,
                };
                wr(op, vec![sge(a, 0, 8)])
            },
            direct: NotDirect::Target(RemoteDenied::RegionAccess),
            wire: Wire::Completes(WcStatus::RemAccessErr),
        },
        Case {
            name: "target QP without REMOTE_WRITE",
            qp_type: rc,
            make: |net, a, b, peer| {
                set_qp_access(net, b, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ);
                *peer = truthful(net, b);
                wr(write_to(b, 0), vec![sge(a, 0, 8)])
            },
            direct: NotDirect::Target(RemoteDenied::QpAccess),
            wire: Wire::Completes(WcStatus::RemAccessErr),
        },
        Case {
            name: "target QP without REMOTE_ATOMIC",
            qp_type: rc,
            make: |net, a, b, peer| {
                set_qp_access(net, b, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
                *peer = truthful(net, b);
                wr(fetch_add_at(b, 0), vec![sge(a, 0, 8)])
            },
            direct: NotDirect::Target(RemoteDenied::QpAccess),
            wire: Wire::Completes(WcStatus::RemAccessErr),
        },
        Case {
            name: "target QP in ERR",
            qp_type: rc,
            make: |net, a, b, peer| {
                let now = net.now;
                let attr = QpAttr {
                    qp_state: QpState::Err,
                    ..Default::default()
                };
                net.nodes[b.node]
                    .modify_qp(now, b.qpn, &attr, AttrMask::STATE)
                    .unwrap();
                *peer = truthful(net, b);
                wr(write_to(b, 0), vec![sge(a, 0, 8)])
            },
            direct: NotDirect::PeerState,
            wire: Wire::Completes(WcStatus::RetryExcErr),
        },
        Case {
            name: "target QP back in RESET",
            qp_type: rc,
            make: |net, a, b, peer| {
                let now = net.now;
                let attr = QpAttr {
                    qp_state: QpState::Reset,
                    ..Default::default()
                };
                net.nodes[b.node]
                    .modify_qp(now, b.qpn, &attr, AttrMask::STATE)
                    .unwrap();
                *peer = truthful(net, b);
                wr(write_to(b, 0), vec![sge(a, 0, 8)])
            },
            direct: NotDirect::PeerState,
            wire: Wire::Completes(WcStatus::RetryExcErr),
        },
        Case {
            name: "target QP not published",
            qp_type: rc,
            make: |net, a, b, peer| {
                // What the driver sees after the peer withdrew a QP it
                // destroyed: nothing, and the network nothing either.
                net.nodes[b.node].destroy_qp(b.qpn).unwrap();
                peer.qp = None;
                wr(write_to(b, 0), vec![sge(a, 0, 8)])
            },
            direct: NotDirect::NoPeerQp,
            wire: Wire::Completes(WcStatus::RetryExcErr),
        },
        Case {
            name: "WRITE past the end of the region",
            qp_type: rc,
            make: |_, a, b, _| wr(write_to(b, REGION as u64 - 4), vec![sge(a, 0, 8)]),
            direct: NotDirect::Target(RemoteDenied::Range),
            wire: Wire::Completes(WcStatus::RemAccessErr),
        },
        Case {
            name: "READ starting below the region",
            qp_type: rc,
            make: |_, a, b, _| {
                let op = SendOp::Read {
                    remote_addr: b.base - 8,
                    rkey: b.keys.rkey,
                };
                wr(op, vec![sge(a, 0, 16)])
            },
            direct: NotDirect::Target(RemoteDenied::Range),
            wire: Wire::Completes(WcStatus::RemAccessErr),
        },
        Case {
            name: "WRITE whose end overflows u64",
            qp_type: rc,
            make: |_, a, b, _| {
                let op = SendOp::Write {
                    remote_addr: u64::MAX - 3,
                    rkey: b.keys.rkey,
                };
                wr(op, vec![sge(a, 0, 8)])
            },
            direct: NotDirect::Target(RemoteDenied::Range),
            wire: Wire::Completes(WcStatus::RemAccessErr),
        },
        Case {
            name: "WRITE wrapping around a target region at iova 0",
            qp_type: rc,
            make: |net, a, b, peer| {
                let (_m, k) = mr_at(net, b, b.pd, 0, 4096, all_access());
                peer.regions
                    .push((k.rkey.raw(), region_of(net, b, k.lkey, b.pd, all_access())));
                let op = SendOp::Write {
                    remote_addr: u64::MAX - 7,
                    rkey: k.rkey,
                };
                wr(op, vec![sge(a, 0, 16)])
            },
            direct: NotDirect::Target(RemoteDenied::Range),
            wire: Wire::Completes(WcStatus::RemAccessErr),
        },
        Case {
            name: "atomic at a misaligned target address",
            qp_type: rc,
            make: |_, a, b, _| wr(fetch_add_at(b, 4), vec![sge(a, 0, 8)]),
            direct: NotDirect::AtomicRemoteAlign,
            wire: Wire::Completes(WcStatus::RemInvReqErr),
        },
        Case {
            name: "UC READ",
            qp_type: QpType::Uc,
            make: |_, a, b, _| wr(read_from(b, 0), vec![sge(a, 0, 8)]),
            direct: NotDirect::Post(PostSendError::OpNotSupported),
            wire: Wire::PostFails(errno::EINVAL),
        },
        Case {
            name: "UC atomic",
            qp_type: QpType::Uc,
            make: |_, a, b, _| wr(fetch_add_at(b, 0), vec![sge(a, 0, 8)]),
            direct: NotDirect::Post(PostSendError::OpNotSupported),
            wire: Wire::PostFails(errno::EINVAL),
        },
        Case {
            name: "atomic with a 4-byte SGE",
            qp_type: rc,
            make: |_, a, b, _| wr(fetch_add_at(b, 0), vec![sge(a, 0, 4)]),
            direct: NotDirect::Post(PostSendError::AtomicSges),
            wire: Wire::PostFails(errno::EINVAL),
        },
        Case {
            name: "READ into a local region without LOCAL_WRITE",
            qp_type: rc,
            make: |net, a, b, _| {
                let iova = 0x66_0000_0000;
                let (_m, k) = mr_at(net, a, a.pd, iova, 4096, AccessFlags::REMOTE_READ);
                let sge = Sge {
                    addr: iova,
                    length: 8,
                    lkey: k.lkey,
                };
                wr(read_from(b, 0), vec![sge])
            },
            direct: NotDirect::LocalSge {
                index: 0,
                status: WcStatus::LocProtErr,
            },
            wire: Wire::Completes(WcStatus::LocProtErr),
        },
        Case {
            name: "atomic result into a local region without LOCAL_WRITE",
            qp_type: rc,
            make: |net, a, b, _| {
                let iova = 0x66_0000_0000;
                let (_m, k) = mr_at(net, a, a.pd, iova, 4096, AccessFlags::empty());
                let sge = Sge {
                    addr: iova,
                    length: 8,
                    lkey: k.lkey,
                };
                wr(fetch_add_at(b, 0), vec![sge])
            },
            direct: NotDirect::LocalSge {
                index: 0,
                status: WcStatus::LocProtErr,
            },
            wire: Wire::Completes(WcStatus::LocProtErr),
        },
        Case {
            name: "local SGE of another PD (second SGE)",
            qp_type: rc,
            make: |net, a, b, _| {
                let pd2 = net.nodes[a.node].alloc_pd();
                let iova = 0x66_0000_0000;
                let (_m, k) = mr_at(net, a, pd2, iova, 4096, all_access());
                let other = Sge {
                    addr: iova,
                    length: 8,
                    lkey: k.lkey,
                };
                wr(write_to(b, 0), vec![sge(a, 0, 8), other])
            },
            direct: NotDirect::LocalSge {
                index: 1,
                status: WcStatus::LocProtErr,
            },
            wire: Wire::Completes(WcStatus::LocProtErr),
        },
        Case {
            name: "unknown lkey",
            qp_type: rc,
            make: |_, a, b, _| {
                let bad = Sge {
                    lkey: Lkey::from_raw(a.keys.lkey.raw() ^ 0x4000_0001),
                    ..sge(a, 0, 8)
                };
                wr(write_to(b, 0), vec![bad])
            },
            direct: NotDirect::LocalSge {
                index: 0,
                status: WcStatus::LocProtErr,
            },
            wire: Wire::Completes(WcStatus::LocProtErr),
        },
        Case {
            name: "local SGE past the end of its region",
            qp_type: rc,
            make: |_, a, b, _| wr(write_to(b, 0), vec![sge(a, REGION as u64 - 4, 8)]),
            direct: NotDirect::LocalSge {
                index: 0,
                status: WcStatus::LocProtErr,
            },
            wire: Wire::Completes(WcStatus::LocProtErr),
        },
    ]
}

fn set_qp_access(net: &mut SimNet, s: &Side, access: AccessFlags) {
    let now = net.now;
    let attr = QpAttr {
        qp_state: QpState::Rts,
        qp_access_flags: access,
        ..Default::default()
    };
    net.nodes[s.node]
        .modify_qp(now, s.qpn, &attr, AttrMask::STATE | AttrMask::ACCESS_FLAGS)
        .unwrap();
}

#[test]
fn every_violation_is_not_direct_and_ends_as_on_the_wire() {
    for c in cases() {
        let (mut net, a, b) = direct_pair(c.qp_type);
        let mut peer = truthful(&net, &b);
        let w = (c.make)(&mut net, &a, &b, &mut peer);
        b.mem.fill_from(0, &pattern(5, 64));
        assert_eq!(
            direct(&net, &a, &w, &mut peer),
            Err(c.direct),
            "{}: direct path",
            c.name
        );
        assert_eq!(
            over_the_wire(&mut net, &a, &w),
            c.wire,
            "{}: packet path",
            c.name
        );
        assert_eq!(mem(&b, 0, 64), pattern(5, 64), "{}: target changed", c.name);
    }
}

#[test]
fn the_same_wrs_with_the_violation_undone_go_direct() {
    // Each refusal above is the rule's doing: the plain WR passes.
    let (net, a, b) = direct_pair(QpType::Rc);
    let mut peer = truthful(&net, &b);
    for w in [
        wr(write_to(&b, 0), vec![sge(&a, 0, 8)]),
        wr(write_to(&b, REGION as u64 - 8), vec![sge(&a, 0, 8)]),
        wr(read_from(&b, 0), vec![sge(&a, 0, 16)]),
        wr(fetch_add_at(&b, 8), vec![sge(&a, 8, 8)]),
        wr(
            write_to(&b, 0),
            vec![sge(&a, 0, 8), sge(&a, 4096, 8), sge(&a, 0, 0)],
        ),
    ] {
        let off = match w.op {
            SendOp::Write { remote_addr, .. }
            | SendOp::Read { remote_addr, .. }
            | SendOp::FetchAdd { remote_addr, .. } => remote_addr - b.base,
            _ => unreachable!(),
        };
        assert_eq!(direct(&net, &a, &w, &mut peer), Ok(off), "{w:?}");
    }
}

fn region(p: &mut Peer) -> &mut PeerRegion {
    &mut p.regions[0].1
}

/// A crafted view alone decides the target checks: every field of it is
/// checked, whatever the real target is.
#[test]
fn crafted_views_are_checked_field_by_field() {
    let (net, a, b) = direct_pair(QpType::Rc);
    let w = wr(write_to(&b, 0x100), vec![sge(&a, 0, 64)]);
    let fa = wr(fetch_add_at(&b, 0x100), vec![sge(&a, 0, 8)]);
    let good = truthful(&net, &b);
    let e = &net.nodes[0];
    let check = |w: &SendWr, f: &dyn Fn(&mut Peer)| {
        let mut p = good.clone();
        f(&mut p);
        let plan = e.plan_direct(a.qpn, w).unwrap();
        e.check_direct_target(&plan, &mut p)
    };
    assert_eq!(check(&w, &|_| {}), Ok(0x100));
    for s in [QpState::Reset, QpState::Init, QpState::Err] {
        assert_eq!(
            check(&w, &|p| p.qp.as_mut().unwrap().state = s),
            Err(NotDirect::PeerState),
            "{s:?}"
        );
    }
    // The responder executes requests in RTR, RTS, SQD and SQE: so does
    // the direct path (one rule for both).
    for s in [QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Sqe] {
        assert_eq!(
            check(&w, &|p| p.qp.as_mut().unwrap().state = s),
            Ok(0x100),
            "{s:?}"
        );
    }
    assert_eq!(
        check(&w, &|p| p.qpn = Qpn::from_raw(p.qpn.raw() ^ 1)),
        Err(NotDirect::NoPeerQp),
        "asked for the wrong QPN"
    );
    assert_eq!(
        check(&w, &|p| {
            let q = p.qp.as_mut().unwrap();
            q.pd = PdHandle::from_raw(q.pd.raw() ^ 1)
        }),
        Err(NotDirect::Target(RemoteDenied::Pd))
    );
    assert_eq!(
        check(&w, &|p| p.qp.as_mut().unwrap().access =
            AccessFlags::REMOTE_READ),
        Err(NotDirect::Target(RemoteDenied::QpAccess))
    );
    assert_eq!(
        check(&w, &|p| p.regions[0].0 ^= 1),
        Err(NotDirect::Target(RemoteDenied::NoRegion)),
        "asked for the wrong rkey"
    );
    assert_eq!(
        check(&w, &|p| region(p).access = AccessFlags::REMOTE_READ),
        Err(NotDirect::Target(RemoteDenied::RegionAccess))
    );
    assert_eq!(
        check(&w, &|p| region(p).len = 0x13F),
        Err(NotDirect::Target(RemoteDenied::Range))
    );
    assert_eq!(check(&w, &|p| region(p).len = 0x140), Ok(0x100));
    assert_eq!(
        check(&w, &|p| region(p).iova = b.base + 0x101),
        Err(NotDirect::Target(RemoteDenied::Range))
    );
    // The range is checked against the region as published, with checked
    // arithmetic: a length reaching past the end of the address space does
    // not wrap; bounding the copy by what it mapped is the driver's part.
    assert_eq!(check(&w, &|p| region(p).len = u64::MAX), Ok(0x100));
    assert_eq!(
        check(&w, &|p| {
            let r = region(p);
            r.iova = u64::MAX - 0xFF;
            r.len = 0x100;
        }),
        Err(NotDirect::Target(RemoteDenied::Range))
    );
    // Atomics: the address's alignment is the rule, not the offset's.
    assert_eq!(check(&fa, &|_| {}), Ok(0x100));
    assert_eq!(
        check(&fa, &|p| region(p).iova = b.base + 4),
        Ok(0xFC),
        "an aligned address at an unaligned offset is allowed, as on the wire"
    );
}

#[test]
fn a_zero_length_access_needs_no_region_on_either_path() {
    let (mut net, a, b) = direct_pair(QpType::Rc);
    let mut peer = truthful(&net, &b);
    peer.regions.clear();
    let op = SendOp::Write {
        remote_addr: 0xDEAD_0000,
        rkey: Rkey::from_raw(0x1234_5678),
    };
    let w = wr(op, vec![sge(&a, 0, 0)]);
    assert_eq!(direct(&net, &a, &w, &mut peer), Ok(0));
    assert_eq!(peer.region_asks, 0);
    // But the QP's right it does need.
    peer.qp.as_mut().unwrap().access = AccessFlags::REMOTE_READ;
    assert_eq!(
        direct(&net, &a, &w, &mut peer),
        Err(NotDirect::Target(RemoteDenied::QpAccess))
    );
    assert_eq!(
        over_the_wire(&mut net, &a, &w),
        Wire::Completes(WcStatus::Success)
    );
}

#[test]
fn the_initiator_side_rules() {
    let (mut net, a, b) = direct_pair(QpType::Rc);
    let w = wr(write_to(&b, 0), vec![sge(&a, 0, 8)]);
    let e = &net.nodes[0];
    assert_eq!(
        e.plan_direct(Qpn::from_raw(0xFFFF), &w).err(),
        Some(NotDirect::NoQp)
    );
    let mut send = w.clone();
    send.op = SendOp::Send;
    let mut imm = w.clone();
    imm.op = SendOp::WriteWithImm {
        remote_addr: b.base,
        rkey: b.keys.rkey,
        imm: 1,
    };
    let inline = with_flags(w.clone(), SendFlags::INLINE);
    for x in [send, imm, inline] {
        assert_eq!(
            e.plan_direct(a.qpn, &x).err(),
            Some(NotDirect::NotOneSided),
            "{x:?}"
        );
    }
    let nine = wr(write_to(&b, 0), vec![sge(&a, 0, 8); 9]);
    assert_eq!(
        e.plan_direct(a.qpn, &nine).err(),
        Some(NotDirect::TooManySges)
    );
    let long = wr(write_to(&b, 0), vec![sge(&a, 0, 1 << 30); 3]);
    // Outside the region anyway; the length rule comes first.
    assert_eq!(e.plan_direct(a.qpn, &long).err(), Some(NotDirect::TooLong));
    // A region that offers no address.
    let (_m, k) = extra_mr(&mut net, &a, a.pd, 0x55_0000_0000, 4096, all_access());
    let plain = Sge {
        addr: 0x55_0000_0000,
        length: 8,
        lkey: k.lkey,
    };
    let w2 = wr(write_to(&b, 0), vec![sge(&a, 0, 8), plain]);
    assert_eq!(
        net.nodes[0].plan_direct(a.qpn, &w2).err(),
        Some(NotDirect::NoAddress { index: 1 })
    );
    // An atomic whose local word is not 8-aligned in memory: the engine
    // does it (it writes the result with a copy), the direct path does not.
    let fa = wr(fetch_add_at(&b, 0), vec![sge(&a, 4, 8)]);
    assert_eq!(
        net.nodes[0].plan_direct(a.qpn, &fa).err(),
        Some(NotDirect::AtomicLocalAlign)
    );
    assert_eq!(
        over_the_wire(&mut net, &a, &fa),
        Wire::Completes(WcStatus::Success)
    );
    // Something outstanding in the send queue: not now.
    post_ok(&mut net, &a, unsignaled(w.clone()));
    assert_eq!(
        net.nodes[0].plan_direct(a.qpn, &w).err(),
        Some(NotDirect::SendQueueBusy)
    );
    settle(&mut net);
    assert!(net.nodes[0].plan_direct(a.qpn, &w).is_ok());
    // Not RTS: SQD starts nothing new.
    let now = net.now;
    let attr = QpAttr {
        qp_state: QpState::Sqd,
        ..Default::default()
    };
    net.nodes[0]
        .modify_qp(now, a.qpn, &attr, AttrMask::STATE)
        .unwrap();
    assert_eq!(
        net.nodes[0].plan_direct(a.qpn, &w).err(),
        Some(NotDirect::State)
    );
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    net.nodes[0]
        .modify_qp(now, a.qpn, &attr, AttrMask::STATE)
        .unwrap();
    assert_eq!(
        net.nodes[0].plan_direct(a.qpn, &w).err(),
        Some(NotDirect::State)
    );
}

#[test]
fn a_plan_says_what_to_copy() {
    let (net, a, b) = direct_pair(QpType::Rc);
    let w = wr(
        write_to(&b, 0x40),
        vec![sge(&a, 0x10, 8), sge(&a, 0x2000, 100), sge(&a, 0x10, 8)],
    );
    let p = net.nodes[0].plan_direct(a.qpn, &w).unwrap();
    assert_eq!(p.qpn(), a.qpn);
    assert_eq!(p.wr_id(), 9);
    assert_eq!(p.op(), DirectOp::Write);
    assert_eq!(p.access(), AccessFlags::REMOTE_WRITE);
    assert_eq!(p.remote_addr(), b.base + 0x40);
    assert_eq!(p.rkey(), b.keys.rkey);
    assert_eq!(p.len(), 116);
    assert_eq!(p.dest_qpn(), b.qpn);
    assert_eq!(p.dest().ip(), softrdma_engine::sim::node_addr(b.node).ip());
    assert_eq!(p.qp_type(), QpType::Rc);
    let t = VEC_MEMORY_TX_BASE;
    assert_eq!(
        p.pieces(),
        &[(t + 0x10, 8), (t + 0x2000, 100), (t + 0x10, 8)]
    );
    let c = SendOp::CompareSwap {
        remote_addr: b.base,
        rkey: b.keys.rkey,
        compare: 3,
        swap: 4,
    };
    let p = net.nodes[0]
        .plan_direct(a.qpn, &wr(c, vec![sge(&a, 8, 8)]))
        .unwrap();
    assert_eq!(
        p.op(),
        DirectOp::CompareSwap {
            compare: 3,
            swap: 4
        }
    );
    assert_eq!(p.access(), AccessFlags::REMOTE_ATOMIC);
    assert_eq!(p.pieces(), &[(t + 8, 8)]);
    let p = net.nodes[0]
        .plan_direct(a.qpn, &wr(read_from(&b, 0), vec![sge(&a, 8, 8)]))
        .unwrap();
    assert_eq!(
        (p.op(), p.access()),
        (DirectOp::Read, AccessFlags::REMOTE_READ)
    );
}

// ----- completions -----

/// [`direct_pair`] with the initiator's QP created with `sq_sig_all`.
fn sig_all_pair() -> (SimNet, Side, Side) {
    let o = ConnOpts::default();
    let mut net = SimNet::new(2, 21, net5());
    let mut a = make_side_with(&mut net, 0, QpType::Rc, VecMemory::by_reference(REGION));
    let b = make_side_with(&mut net, 1, QpType::Rc, VecMemory::by_reference(REGION));
    let e = &mut net.nodes[0];
    e.destroy_qp(a.qpn).unwrap();
    a.qpn = e
        .create_qp(QpInit {
            pd: a.pd,
            qp_type: QpType::Rc,
            send_cq: a.cq,
            recv_cq: a.cq,
            srq: None,
            cap: qp_cap(),
            sq_sig_all: true,
        })
        .unwrap();
    bring_up(&mut net, &a, &b, o.psn_a, o.psn_b, &o, QpType::Rc);
    bring_up(&mut net, &b, &a, o.psn_b, o.psn_a, &o, QpType::Rc);
    (net, a, b)
}

/// Makes a WR from the initiator to the target.
type MakeWr = fn(&Side, &Side) -> SendWr;

#[test]
fn complete_direct_gives_what_the_packet_path_gives() {
    let ops: Vec<(&str, MakeWr)> = vec![
        ("WRITE", |a, b| wr(write_to(b, 0), vec![sge(a, 0, 24)])),
        ("WRITE, two SGEs", |a, b| {
            wr(write_to(b, 0), vec![sge(a, 0, 24), sge(a, 100, 1000)])
        }),
        ("WRITE, zero length", |_, b| wr(write_to(b, 0), vec![])),
        ("READ", |a, b| wr(read_from(b, 0), vec![sge(a, 0, 3000)])),
        ("CMP_SWAP", |a, b| {
            let op = SendOp::CompareSwap {
                remote_addr: b.base + 8,
                rkey: b.keys.rkey,
                compare: 0,
                swap: 7,
            };
            wr(op, vec![sge(a, 16, 8)])
        }),
        ("FETCH_ADD", |a, b| {
            wr(fetch_add_at(b, 8), vec![sge(a, 16, 8)])
        }),
    ];
    for (name, make) in ops {
        for sig_all in [false, true] {
            for signaled in [false, true] {
                let run = |direct: bool| {
                    let (mut net, a, b) = if sig_all {
                        sig_all_pair()
                    } else {
                        direct_pair(QpType::Rc)
                    };
                    let mut w = make(&a, &b);
                    if !signaled {
                        w = unsignaled(w);
                    }
                    net.nodes[0].req_notify_cq(a.cq, false).unwrap();
                    let before = net.nodes[0].qp_counters(a.qpn).unwrap().tx_bytes;
                    if direct {
                        let mut peer = truthful(&net, &b);
                        let e = &mut net.nodes[0];
                        let plan = e.plan_direct(a.qpn, &w).unwrap();
                        e.check_direct_target(&plan, &mut peer).unwrap();
                        e.complete_direct(&plan);
                        let sent = e.qp_counters(a.qpn).unwrap().tx_bytes - before;
                        let msg: u64 = w.sg_list.iter().map(|s| u64::from(s.length)).sum();
                        assert_eq!(sent, msg, "{name}: the QP counts the message");
                    } else {
                        post_ok(&mut net, &a, w);
                        settle(&mut net);
                    }
                    (poll(&mut net, &a), events(&mut net, 0))
                };
                let (wire_wcs, wire_events) = run(false);
                let (direct_wcs, direct_events) = run(true);
                let what = format!("{name}, sq_sig_all {sig_all}, signaled {signaled}");
                assert_eq!(direct_wcs, wire_wcs, "{what}");
                assert_eq!(direct_events, wire_events, "{what}");
                assert_eq!(direct_wcs.len(), usize::from(sig_all || signaled), "{what}");
                if let Some(wc) = direct_wcs.first() {
                    assert_eq!(wc.status, WcStatus::Success);
                    if name.starts_with("CMP") || name.starts_with("FETCH") {
                        assert_eq!(wc.byte_len, 8, "{what}");
                    }
                }
            }
        }
    }
}

#[test]
fn complete_direct_keeps_the_cq_rules() {
    // A full CQ overruns exactly as for a completion from the wire.
    let (mut net, a, b) = direct_pair(QpType::Rc);
    let e = &mut net.nodes[0];
    let cq = e.create_cq(1).unwrap();
    let qpn = e
        .create_qp(QpInit {
            pd: a.pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: qp_cap(),
            sq_sig_all: false,
        })
        .unwrap();
    let s = Side {
        node: 0,
        pd: a.pd,
        cq,
        qpn,
        mem: a.mem.clone(),
        keys: a.keys,
        base: a.base,
    };
    let o = ConnOpts::default();
    bring_up(&mut net, &s, &b, o.psn_a, o.psn_b, &o, QpType::Rc);
    let mut peer = truthful(&net, &b);
    let w = wr(write_to(&b, 0), vec![sge(&s, 0, 8)]);
    for _ in 0..2 {
        let e = &mut net.nodes[0];
        let plan = e.plan_direct(qpn, &w).unwrap();
        e.check_direct_target(&plan, &mut peer).unwrap();
        e.complete_direct(&plan);
    }
    assert!(net.nodes[0].cq_overrun(cq));
    assert_eq!(net.nodes[0].cq_len(cq), 1);
    assert!(events(&mut net, 0).contains(&Event::CqOverrun { cq }));
}

#[test]
fn a_plan_filled_in_place_is_used_only_once_planned() {
    let (mut net, a, b) = direct_pair(QpType::Rc);
    let mut peer = truthful(&net, &b);
    let good = wr(write_to(&b, 0), vec![sge(&a, 0, 8)]);
    let bad = wr(write_to(&b, 0), vec![sge(&a, REGION as u64, 8)]);
    let mut plan = DirectPlan::new();
    let e = &mut net.nodes[0];
    assert!(!plan.is_planned());
    assert_eq!(
        e.check_direct_target(&plan, &mut peer),
        Err(NotDirect::NotPlanned)
    );
    e.complete_direct(&plan);
    e.plan_direct_into(a.qpn, &good, &mut plan).unwrap();
    assert!(plan.is_planned());
    assert_eq!(e.check_direct_target(&plan, &mut peer), Ok(0));
    // A failed plan leaves nothing usable behind, not the previous one.
    assert!(e.plan_direct_into(a.qpn, &bad, &mut plan).is_err());
    assert!(!plan.is_planned());
    assert_eq!(
        e.check_direct_target(&plan, &mut peer),
        Err(NotDirect::NotPlanned)
    );
    e.complete_direct(&plan);
    assert!(
        poll(&mut net, &a).is_empty(),
        "an unplanned plan completes nothing"
    );
    assert_eq!(peer.qp_asks, 1);
}

#[test]
fn pieces_come_from_each_sges_own_region() {
    let (mut net, a, b) = direct_pair(QpType::Rc);
    let iova = 0x66_0000_0000;
    let (_m, k) = mr_at(&mut net, &a, a.pd, iova, 4096, all_access());
    let other = |off: u64, len: u32| Sge {
        addr: iova + off,
        length: len,
        lkey: k.lkey,
    };
    let w = wr(
        write_to(&b, 0),
        vec![sge(&a, 16, 8), other(32, 8), sge(&a, 48, 8), other(64, 0)],
    );
    let p = net.nodes[0].plan_direct(a.qpn, &w).unwrap();
    let t = VEC_MEMORY_TX_BASE;
    // Both regions pretend the same base address, so the offsets tell.
    assert_eq!(
        p.pieces(),
        &[(t + 16, 8), (t + 32, 8), (t + 48, 8), (t + 64, 0)]
    );
    // The third SGE reuses the first's region, and the checks still apply
    // to each SGE on its own.
    let w = wr(
        write_to(&b, 0),
        vec![sge(&a, 16, 8), other(32, 8), sge(&a, REGION as u64 - 4, 8)],
    );
    assert_eq!(
        net.nodes[0].plan_direct(a.qpn, &w).err(),
        Some(NotDirect::LocalSge {
            index: 2,
            status: WcStatus::LocProtErr
        })
    );
}

// ----- planning again from the last plan -----

/// `replan_direct` reuses the QP and local region the last plan found, and
/// applies every rule of the new WR: each local SGE fault the full plan
/// refuses, it refuses the same way; a WR of another shape is planned in
/// full; a valid WR gives the pieces a full plan gives.
#[test]
fn replanning_applies_every_rule_of_the_new_wr() {
    let (net, a, b) = direct_pair(QpType::Rc);
    let e = &net.nodes[a.node];
    let (m, k) = mr_at_ref(&net, &a);
    let sge = |addr: u64, length: u32| Sge {
        addr,
        length,
        lkey: k.lkey,
    };
    let good = wr(write_to(&b, 0), vec![sge(m + 64, 32)]);
    let mut last = e.plan_direct(a.qpn, &good).expect("a valid WR plans");
    let cases: Vec<(&str, SendWr)> = vec![
        (
            "wraps around",
            wr(write_to(&b, 0), vec![sge(u64::MAX - 7, 16)]),
        ),
        ("past the end", wr(write_to(&b, 0), vec![sge(m + 4090, 16)])),
        (
            "before the start",
            wr(read_from(&b, 0), vec![sge(m - 1, 8)]),
        ),
        (
            "a misaligned atomic",
            wr(fetch_add_at(&b, 0), vec![sge(m + 3, 8)]),
        ),
        (
            "an atomic of 16 bytes",
            wr(fetch_add_at(&b, 0), vec![sge(m + 8, 16)]),
        ),
        ("another lkey", {
            let mut w = wr(write_to(&b, 0), vec![sge(m, 8)]);
            w.sg_list[0].lkey = Lkey::from_raw(w.sg_list[0].lkey.raw() ^ 0x40);
            w
        }),
        ("another kind", wr(read_from(&b, 0), vec![sge(m + 8, 8)])),
        (
            "two SGEs",
            wr(write_to(&b, 0), vec![sge(m, 8), sge(m + 8, 8)]),
        ),
        ("valid again", wr(write_to(&b, 128), vec![sge(m + 100, 50)])),
    ];
    for (what, w) in cases {
        let full = e.plan_direct(a.qpn, &w);
        let mut again = last;
        let re = e.replan_direct(a.qpn, &w, &mut again);
        assert_eq!(re.err(), full.as_ref().err().copied(), "{what}");
        if let Ok(p) = full {
            assert_eq!(again.pieces(), p.pieces(), "{what}");
            assert_eq!(
                (again.op(), again.remote_addr(), again.rkey(), again.len()),
                (p.op(), p.remote_addr(), p.rkey(), p.len()),
                "{what}"
            );
            last = again;
        }
    }
    let _ = &m;
}

/// A region of `a` at its own address, all rights: (address, keys).
fn mr_at_ref(net: &SimNet, a: &Side) -> (u64, MrKeys) {
    let (addr, _, keys) = net.nodes[a.node].mr_info(a.keys.lkey).unwrap();
    (addr, keys)
}
