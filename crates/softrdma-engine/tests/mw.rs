//! Memory windows, types 1 and 2: binds through the send queue, remote
//! access through a window's rkey (its range and rights, nothing more),
//! local invalidation, SEND with invalidate, and the statuses of every
//! refusal (IBV_WC_MW_BIND_ERR, LOC_QP_OP_ERR, REM_ACCESS_ERR,
//! REM_INV_REQ_ERR).

mod common;

use std::time::Duration;

use common::*;
use softrdma_engine::sim::NetConfig;
use softrdma_engine::*;

const T: Duration = Duration::from_secs(5);
/// Where the MW_BIND region of side B sits, and its length.
const WIN_IOVA: u64 = 0x7700_0000;
const WIN_REGION: usize = 64 * 1024;

struct Win {
    mem: std::sync::Arc<VecMemory>,
    keys: MrKeys,
}

/// A pair over a perfect network, and a region on B that windows may be bound to.
fn setup(access: AccessFlags) -> (softrdma_engine::sim::SimNet, Side, Side, Win) {
    let (mut net, a, b) = pair(7, NetConfig::perfect(), QpType::Rc, &ConnOpts::default());
    let (mem, keys) = extra_mr(&mut net, &b, b.pd, WIN_IOVA, WIN_REGION, access);
    (net, a, b, Win { mem, keys })
}

fn bindable() -> AccessFlags {
    all_access() | AccessFlags::MW_BIND
}

fn bind_wr(
    wr_id: u64,
    mw: MwHandle,
    rkey: Rkey,
    mr: &Win,
    off: u64,
    len: u64,
    access: AccessFlags,
) -> SendWr {
    SendWr::new(
        wr_id,
        SendOp::BindMw {
            mw,
            rkey,
            bind: MwBind {
                mr: Some(mr.keys.lkey),
                addr: WIN_IOVA + off,
                length: len,
                access,
            },
        },
        vec![],
    )
}

/// `ibv_inc_rkey`: the next key byte, the same index.
fn inc(rkey: Rkey) -> Rkey {
    Rkey::from_raw((rkey.raw() & !0xff) | (rkey.raw().wrapping_add(1) & 0xff))
}

fn write_to(wr_id: u64, a: &Side, len: u32, va: u64, rkey: Rkey) -> SendWr {
    SendWr::new(
        wr_id,
        SendOp::Write {
            remote_addr: va,
            rkey,
        },
        vec![sge(a, 0, len)],
    )
}

/// Posts `wr` on `s` and returns its completion.
fn one(net: &mut softrdma_engine::sim::SimNet, s: &Side, wr: SendWr) -> WorkCompletion {
    post_ok(net, s, wr);
    let wcs = wait_wcs(net, s, 1, T);
    assert_eq!(wcs.len(), 1, "no completion");
    wcs[0]
}

/// Binds a window of `mw_type` on B over `[off, off + len)` of the window
/// region with `access`, and returns the window and its rkey.
fn bound(
    net: &mut softrdma_engine::sim::SimNet,
    b: &Side,
    w: &Win,
    mw_type: MwType,
    off: u64,
    len: u64,
    access: AccessFlags,
) -> (MwHandle, Rkey) {
    let (mw, rkey0) = net.nodes[b.node].alloc_mw(b.pd, mw_type).unwrap();
    let rkey = inc(rkey0);
    let wc = one(net, b, bind_wr(1, mw, rkey, w, off, len, access));
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::BindMw, 0)
    );
    assert_eq!(net.nodes[b.node].mw_info(mw), Some((rkey, true)));
    (mw, rkey)
}

#[test]
fn a_window_reaches_its_range_with_its_rights_and_nothing_else() {
    for mw_type in [MwType::One, MwType::Two] {
        let (mut net, a, b, w) = setup(bindable());
        let rw = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let (_mw, rkey) = bound(&mut net, &b, &w, mw_type, 0x1000, 0x2000, rw);
        // Its index is its handle, its key byte the one the bind gave.
        let data = pattern(3, 3000);
        a.mem.fill_from(0, &data);
        let wc = one(
            &mut net,
            &a,
            write_to(10, &a, 3000, WIN_IOVA + 0x1800, rkey),
        );
        assert_eq!(wc.status, WcStatus::Success, "{mw_type:?}");
        assert_eq!(&w.mem.snapshot()[0x1800..0x1800 + 3000], &data[..]);
        // READ back through the window into another place of A.
        let rd = SendWr::new(
            11,
            SendOp::Read {
                remote_addr: WIN_IOVA + 0x1800,
                rkey,
            },
            vec![sge(&a, 0x8000, 3000)],
        );
        assert_eq!(one(&mut net, &a, rd).status, WcStatus::Success);
        assert_eq!(mem(&a, 0x8000, 3000), data);
        // One byte past the window: a remote access error, nothing written.
        let before = w.mem.snapshot();
        let wc = one(
            &mut net,
            &a,
            write_to(12, &a, 16, WIN_IOVA + 0x3000 - 8, rkey),
        );
        assert_eq!(wc.status, WcStatus::RemAccessErr, "{mw_type:?}");
        assert_eq!(w.mem.snapshot(), before);
    }
}

#[test]
fn a_window_without_the_right_refuses_the_operation() {
    let (mut net, a, b, w) = setup(bindable());
    let (_mw, rkey) = bound(
        &mut net,
        &b,
        &w,
        MwType::Two,
        0,
        4096,
        AccessFlags::REMOTE_READ,
    );
    let wc = one(&mut net, &a, write_to(1, &a, 8, WIN_IOVA, rkey));
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert_eq!(&w.mem.snapshot()[..8], &[0; 8]);
}

#[test]
fn a_zero_based_type2_window_is_addressed_from_zero() {
    let (mut net, a, b, w) = setup(bindable());
    let zb = AccessFlags::REMOTE_WRITE | AccessFlags::ZERO_BASED;
    let (_mw, rkey) = bound(&mut net, &b, &w, MwType::Two, 0x4000, 0x100, zb);
    a.mem.fill_from(0, &[0xAB; 16]);
    assert_eq!(
        one(&mut net, &a, write_to(1, &a, 16, 0x10, rkey)).status,
        WcStatus::Success
    );
    assert_eq!(&w.mem.snapshot()[0x4010..0x4020], &[0xAB; 16]);
    assert_eq!(
        one(&mut net, &a, write_to(2, &a, 16, 0xF8, rkey)).status,
        WcStatus::RemAccessErr
    );
}

#[test]
fn unbinding_a_type1_window_with_zero_length_takes_its_access_away() {
    let (mut net, a, b, w) = setup(bindable());
    let (mw, rkey) = bound(
        &mut net,
        &b,
        &w,
        MwType::One,
        0,
        4096,
        AccessFlags::REMOTE_WRITE,
    );
    let next = inc(rkey);
    let unbind = SendWr::new(
        2,
        SendOp::BindMw {
            mw,
            rkey: next,
            bind: MwBind {
                mr: Some(w.keys.lkey),
                addr: WIN_IOVA,
                length: 0,
                access: AccessFlags::empty(),
            },
        },
        vec![],
    );
    assert_eq!(one(&mut net, &b, unbind).status, WcStatus::Success);
    assert_eq!(net.nodes[b.node].mw_info(mw), Some((next, false)));
    // Neither the old key nor the new one reaches anything.
    let wc = one(&mut net, &a, write_to(3, &a, 8, WIN_IOVA, next));
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert_eq!(&w.mem.snapshot()[..8], &[0; 8]);
    let _ = rkey;
}

#[test]
fn local_invalidation_of_a_type2_window_and_a_rebind_with_a_new_key() {
    let (mut net, a, b, w) = setup(bindable());
    let (mw, rkey) = bound(
        &mut net,
        &b,
        &w,
        MwType::Two,
        0,
        4096,
        AccessFlags::REMOTE_WRITE,
    );
    let inv = SendWr::new(5, SendOp::LocalInv { rkey }, vec![]);
    let wc = one(&mut net, &b, inv);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::LocalInv)
    );
    assert_eq!(net.nodes[b.node].mw_info(mw), Some((rkey, false)));
    // Free again: a bind with the next key works, and only the new key reaches.
    let new = inc(rkey);
    let wc = one(
        &mut net,
        &b,
        bind_wr(6, mw, new, &w, 0, 4096, AccessFlags::REMOTE_WRITE),
    );
    assert_eq!(wc.status, WcStatus::Success);
    a.mem.fill_from(0, &[7; 8]);
    assert_eq!(
        one(&mut net, &a, write_to(7, &a, 8, WIN_IOVA, new)).status,
        WcStatus::Success
    );
    assert_eq!(&w.mem.snapshot()[..8], &[7; 8]);
    assert_eq!(
        one(&mut net, &a, write_to(8, &a, 8, WIN_IOVA, rkey)).status,
        WcStatus::RemAccessErr
    );
}

#[test]
fn send_with_invalidate_invalidates_the_window_at_the_receiver() {
    let (mut net, a, b, w) = setup(bindable());
    let (mw, rkey) = bound(
        &mut net,
        &b,
        &w,
        MwType::Two,
        0,
        4096,
        AccessFlags::REMOTE_WRITE,
    );
    recv(&mut net, &b, 40, 0, 64);
    a.mem.fill_from(0, b"invalidate!");
    let si = SendWr::new(
        41,
        SendOp::SendWithInv {
            invalidate_rkey: rkey,
        },
        vec![sge(&a, 0, 11)],
    );
    assert_eq!(one(&mut net, &a, si).status, WcStatus::Success);
    let wcs = wait_wcs(&mut net, &b, 1, T);
    assert_eq!(wcs.len(), 1);
    let r = wcs[0];
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len),
        (40, WcStatus::Success, WcOpcode::Recv, 11)
    );
    assert!(r.wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(r.imm_data, rkey.raw(), "the invalidated rkey");
    assert_eq!(mem(&b, 0, 11), b"invalidate!");
    assert_eq!(net.nodes[b.node].mw_info(mw), Some((rkey, false)));
    let wc = one(&mut net, &a, write_to(42, &a, 8, WIN_IOVA, rkey));
    assert_eq!(wc.status, WcStatus::RemAccessErr);
}

#[test]
fn a_refused_remote_invalidation_fails_both_ends() {
    // A type-1 window cannot be invalidated by a SEND with invalidate.
    let (mut net, a, b, w) = setup(bindable());
    let (mw, rkey) = bound(
        &mut net,
        &b,
        &w,
        MwType::One,
        0,
        4096,
        AccessFlags::REMOTE_WRITE,
    );
    recv(&mut net, &b, 50, 0, 64);
    let si = SendWr::new(
        51,
        SendOp::SendWithInv {
            invalidate_rkey: rkey,
        },
        vec![sge(&a, 0, 8)],
    );
    assert_eq!(one(&mut net, &a, si).status, WcStatus::RemInvReqErr);
    let wcs = wait_wcs(&mut net, &b, 1, T);
    assert_eq!(statuses(&wcs), vec![(50, WcStatus::RemInvReqErr)]);
    assert_eq!(
        net.nodes[b.node].mw_info(mw),
        Some((rkey, true)),
        "still bound"
    );
}

#[test]
fn bind_errors_complete_with_mw_bind_err_and_stop_the_qp() {
    type Case = (
        &'static str,
        AccessFlags,
        MwType,
        u64,
        u64,
        AccessFlags,
        bool,
    );
    let w_ = AccessFlags::REMOTE_WRITE;
    let cases: [Case; 5] = [
        (
            "region without MW_BIND",
            all_access(),
            MwType::One,
            0,
            64,
            w_,
            false,
        ),
        (
            "window past the region",
            bindable(),
            MwType::Two,
            0,
            WIN_REGION as u64 + 1,
            w_,
            false,
        ),
        (
            "zero-based type 1",
            bindable(),
            MwType::One,
            0,
            64,
            w_ | AccessFlags::ZERO_BASED,
            false,
        ),
        (
            "writable over a read-only region",
            AccessFlags::REMOTE_READ | AccessFlags::MW_BIND,
            MwType::One,
            0,
            64,
            w_,
            false,
        ),
        ("another index", bindable(), MwType::Two, 0, 64, w_, true),
    ];
    for (what, access, mw_type, off, len, wacc, other_index) in cases {
        let (mut net, _a, b, w) = setup(access);
        let (mw, rkey0) = net.nodes[b.node].alloc_mw(b.pd, mw_type).unwrap();
        let rkey = if other_index {
            Rkey::from_raw(rkey0.raw() ^ 0x100)
        } else {
            inc(rkey0)
        };
        post_ok(&mut net, &b, bind_wr(1, mw, rkey, &w, off, len, wacc));
        // Behind it, a WR that is flushed.
        post_ok(&mut net, &b, send_wr(2, &b, 0, 8));
        let wcs = wait_wcs(&mut net, &b, 2, T);
        assert_eq!(
            statuses(&wcs),
            vec![(1, WcStatus::MwBindErr), (2, WcStatus::WrFlushErr)],
            "{what}"
        );
        assert_eq!(wcs[0].opcode, WcOpcode::BindMw);
        assert_eq!(
            net.nodes[b.node].mw_info(mw),
            Some((rkey0, false)),
            "{what}"
        );
    }
}

#[test]
fn a_bound_type2_window_is_not_bound_again() {
    let (mut net, _a, b, w) = setup(bindable());
    let (mw, rkey) = bound(
        &mut net,
        &b,
        &w,
        MwType::Two,
        0,
        64,
        AccessFlags::REMOTE_WRITE,
    );
    let wc = one(
        &mut net,
        &b,
        bind_wr(2, mw, inc(rkey), &w, 0, 64, AccessFlags::REMOTE_WRITE),
    );
    assert_eq!(wc.status, WcStatus::MwBindErr);
    assert_eq!(net.nodes[b.node].mw_info(mw), Some((rkey, true)));
}

#[test]
fn local_invalidation_of_a_type1_window_or_an_unknown_rkey_is_a_local_qp_error() {
    for type1 in [true, false] {
        let (mut net, _a, b, w) = setup(bindable());
        let rkey = if type1 {
            bound(
                &mut net,
                &b,
                &w,
                MwType::One,
                0,
                64,
                AccessFlags::REMOTE_WRITE,
            )
            .1
        } else {
            b.keys.rkey // a region's: not a window
        };
        let wc = one(
            &mut net,
            &b,
            SendWr::new(3, SendOp::LocalInv { rkey }, vec![]),
        );
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::LocQpOpErr, WcOpcode::LocalInv)
        );
    }
}

#[test]
fn dealloc_and_dereg_take_a_windows_access_away() {
    for dealloc in [true, false] {
        let (mut net, a, b, w) = setup(bindable());
        let (mw, rkey) = bound(
            &mut net,
            &b,
            &w,
            MwType::Two,
            0,
            64,
            AccessFlags::REMOTE_WRITE,
        );
        if dealloc {
            net.nodes[b.node].dealloc_mw(mw).unwrap();
            assert_eq!(net.nodes[b.node].mw_info(mw), None);
        } else {
            net.nodes[b.node].dereg_mr(w.keys.lkey).unwrap();
            assert_eq!(net.nodes[b.node].mw_info(mw), Some((rkey, false)));
        }
        let wc = one(&mut net, &a, write_to(1, &a, 8, WIN_IOVA, rkey));
        assert_eq!(wc.status, WcStatus::RemAccessErr);
        assert_eq!(&w.mem.snapshot()[..8], &[0; 8]);
    }
}

#[test]
fn windows_hold_their_pd_and_block_a_rereg_while_bound() {
    let (mut net, _a, b, w) = setup(bindable());
    let pd = net.nodes[b.node].alloc_pd();
    let (mw, _) = net.nodes[b.node].alloc_mw(pd, MwType::One).unwrap();
    assert_eq!(
        net.nodes[b.node].dealloc_pd(pd).unwrap_err().errno(),
        errno::EBUSY
    );
    net.nodes[b.node].dealloc_mw(mw).unwrap();
    net.nodes[b.node].dealloc_pd(pd).unwrap();
    assert!(
        net.nodes[b.node].alloc_mw(pd, MwType::Two).is_err(),
        "a PD that is gone"
    );
    let (_mw, _) = bound(
        &mut net,
        &b,
        &w,
        MwType::Two,
        0,
        64,
        AccessFlags::REMOTE_WRITE,
    );
    let e = net.nodes[b.node]
        .rereg_mr(
            w.keys.lkey,
            None,
            Some(all_access() | AccessFlags::MW_BIND),
            None,
        )
        .unwrap_err();
    assert_eq!(e.errno(), errno::EBUSY);
}

#[test]
fn window_rkeys_are_random_and_never_a_regions() {
    let (mut net, _a, b, _w) = setup(bindable());
    let mut seen = std::collections::HashSet::new();
    for _ in 0..200 {
        let (mw, rkey) = net.nodes[b.node].alloc_mw(b.pd, MwType::Two).unwrap();
        assert_eq!(rkey.raw() >> 8, mw.raw());
        assert_ne!(mw.raw(), 0);
        assert_ne!(rkey, b.keys.rkey);
        assert_ne!(rkey.raw() >> 8, b.keys.rkey.raw() >> 8);
        assert!(seen.insert(mw.raw()), "index {mw} handed out twice");
    }
    // Not sequential: the indexes spread over the 24 bits.
    let max = seen.iter().max().unwrap();
    let min = seen.iter().min().unwrap();
    assert!(max - min > 1 << 20);
}
