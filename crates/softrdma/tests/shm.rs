//! The same-host path: direct one-sided operations by the initiator, SEND
//! through shared-memory rings, and every way of reaching memory one must
//! not, each rejected with the status hardware gives and the target
//! untouched — over UDP and shared memory alike, through the engine's one
//! rule book.

use std::time::Duration;

use softrdma::shm::Transport;
use softrdma::*;

const T: Duration = Duration::from_secs(10);

fn all() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

struct Pair {
    a: Context,
    b: Context,
    pa: Pd,
    pb: Pd,
    ca: Cq,
    cb: Cq,
    qa: Qp,
    qb: Qp,
}

fn pair(transport: Transport, b_access: AccessFlags) -> Pair {
    let a = Context::open_with(&DeviceConfig::default_loopback().transport(transport)).unwrap();
    let b = Context::open_with(&DeviceConfig::default_loopback().transport(transport)).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb = pb.create_qp(QpType::Rc, &cb, &cb).build().unwrap();
    connect(&qa, &qb, b_access);
    Pair {
        a,
        b,
        pa,
        pb,
        ca,
        cb,
        qa,
        qb,
    }
}

/// Connects two RC QPs (short retry timeout); `qb` grants `b_access`.
fn connect(qa: &Qp, qb: &Qp, b_access: AccessFlags) {
    let fast = ConnectOptions {
        timeout: 10,
        retry_cnt: 2,
        ..Default::default()
    };
    qa.connect(&qb.endpoint(), &fast).unwrap();
    let b = ConnectOptions {
        access: b_access,
        ..fast
    };
    qb.connect(&qa.endpoint(), &b).unwrap();
}

/// Reads 8 bytes of `mb` through `qp` into a scratch region of `pd` until
/// one goes direct: the target has granted `mb` to this QP (the first
/// operations on a region go through the target's engine while the grant
/// is asked for). Returns the initiator's direct operations so far.
fn granted(ctx: &Context, pd: &Pd, qp: &Qp, cq: &Cq, mb: &Mr) -> u64 {
    let scratch = pd.alloc_mr(4096, all()).unwrap();
    let t0 = std::time::Instant::now();
    for i in 0.. {
        let before = ctx.driver_counters().direct_ops;
        let read = SendOp::Read {
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
        };
        qp.post_send(&SendWr::new(900 + i, read, vec![scratch.sge(0, 8)]))
            .unwrap();
        assert_eq!(cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
        let after = ctx.driver_counters().direct_ops;
        if after > before {
            return after;
        }
        assert!(t0.elapsed() < T, "no grant for {mb:?} after {i} READs");
        std::thread::sleep(Duration::from_micros(200));
    }
    unreachable!()
}

/// [`granted`] through the pair's first QP.
fn warm(p: &Pair, mb: &Mr) -> u64 {
    granted(&p.a, &p.pa, &p.qa, &p.ca, mb)
}

#[test]
fn one_sided_operations_are_direct_copies() {
    let p = pair(Transport::Shm, all());
    let ma = p.pa.alloc_mr(1 << 20, all()).unwrap();
    let mb = p.pb.alloc_mr(1 << 20, all()).unwrap();
    let direct0 = warm(&p, &mb);
    let packets0 = p.a.counters().tx_packets;
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    ma.write(8, &data).unwrap();
    let rb = mb.remote();
    // Two SGEs, unaligned offsets.
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote_addr: rb.at(3),
            rkey: rb.rkey,
        },
        vec![ma.sge(8, 40_000), ma.sge(40_008, 60_000)],
    );
    p.qa.post_send(&wr).unwrap();
    assert_eq!(p.ca.wait_ok(T).unwrap().byte_len, 100_000);
    let mut got = vec![0u8; data.len()];
    mb.read(3, &mut got).unwrap();
    assert!(got == data);
    p.qa.post_send(&SendWr::new(
        2,
        SendOp::Read {
            remote_addr: rb.at(3),
            rkey: rb.rkey,
        },
        vec![ma.sge(500_000, 100_000)],
    ))
    .unwrap();
    p.ca.wait_ok(T).unwrap();
    ma.read(500_000, &mut got).unwrap();
    assert!(got == data);
    mb.write(4096, &40u64.to_ne_bytes()).unwrap();
    p.qa.post_send(&SendWr::new(
        3,
        SendOp::FetchAdd {
            remote_addr: rb.at(4096),
            rkey: rb.rkey,
            add: 2,
        },
        vec![ma.sge(0, 8)],
    ))
    .unwrap();
    p.qa.post_send(&SendWr::new(
        4,
        SendOp::CompareSwap {
            remote_addr: rb.at(4096),
            rkey: rb.rkey,
            compare: 42,
            swap: 7,
        },
        vec![ma.sge(8, 8)],
    ))
    .unwrap();
    let wcs = p.ca.wait(2, T).unwrap();
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(ma.read_u64(0).unwrap(), 40);
    assert_eq!(ma.read_u64(8).unwrap(), 42);
    assert_eq!(mb.read_u64(4096).unwrap(), 7);
    assert_eq!(
        p.a.driver_counters().direct_ops - direct0,
        4,
        "all four went the direct way"
    );
    assert_eq!(p.a.counters().tx_packets, packets0, "no packet was needed");
}

#[test]
fn sends_travel_through_rings() {
    let p = pair(Transport::Shm, all());
    let ma = p.pa.alloc_mr(1 << 16, all()).unwrap();
    let mb = p.pb.alloc_mr(1 << 16, all()).unwrap();
    ma.write(0, &[7u8; 9000]).unwrap();
    p.qb.post_recv(&RecvWr {
        wr_id: 5,
        sg_list: vec![mb.sge(0, 10_000)],
    })
    .unwrap();
    p.qa.post_send(&SendWr::new(
        1,
        SendOp::SendWithImm { imm: 99 },
        vec![ma.sge(0, 9000)],
    ))
    .unwrap();
    let r = p.cb.wait_ok(T).unwrap();
    assert_eq!((r.byte_len, r.imm_data), (9000, 99));
    assert_eq!(mb.to_vec()[..9000], [7u8; 9000]);
    p.ca.wait_ok(T).unwrap();
    let s = p.a.shm_counters();
    assert!(s.tx_packets >= 3 && s.links >= 1, "{s:?}");
    assert_eq!(p.a.driver_counters().send_errors, 0);
}

/// Runs one WRITE that must fail with REM_ACCESS_ERR and leave `mb` untouched.
fn expect_access_error(p: &Pair, ma: &Mr, mb: &Mr, remote_addr: u64, rkey: Rkey, len: u32) {
    let sge = ma.sge(0, len);
    expect_write_error(p, sge, mb, remote_addr, rkey, WcStatus::RemAccessErr);
}

/// Runs one WRITE from `sge` that must complete with `status`, leave `mb`
/// untouched and the QP in ERR.
fn expect_write_error(p: &Pair, sge: Sge, mb: &Mr, remote_addr: u64, rkey: Rkey, status: WcStatus) {
    let before = mb.to_vec();
    p.qa.post_send(&SendWr::new(
        9,
        SendOp::Write { remote_addr, rkey },
        vec![sge],
    ))
    .unwrap();
    let wc = p.ca.wait(1, T).unwrap()[0];
    assert_eq!(wc.status, status, "{wc:?}");
    assert!(mb.to_vec() == before, "target memory untouched");
    assert_eq!(p.qa.state(), QpState::Err);
}

#[test]
fn wrong_rkey_is_rejected() {
    // The same violation over both transports: one rule book.
    for transport in [Transport::Udp, Transport::Shm] {
        let p = pair(transport, all());
        let ma = p.pa.alloc_mr(4096, all()).unwrap();
        ma.write(0, &[0xAB; 4096]).unwrap();
        let mb = p.pb.alloc_mr(4096, all()).unwrap();
        expect_access_error(
            &p,
            &ma,
            &mb,
            mb.addr(),
            Rkey::from_raw(mb.rkey().raw() ^ 0x5A5A),
            64,
        );
    }
}

#[test]
fn out_of_bounds_is_rejected() {
    // The same violation over both transports: one rule book.
    for transport in [Transport::Udp, Transport::Shm] {
        let p = pair(transport, all());
        let ma = p.pa.alloc_mr(8192, all()).unwrap();
        ma.write(0, &[0xAB; 8192]).unwrap();
        let mb = p.pb.alloc_mr(4096, all()).unwrap();
        expect_access_error(&p, &ma, &mb, mb.addr() + 4000, mb.rkey(), 200);
    }
}

#[test]
fn missing_region_access_flag_is_rejected() {
    // The same violation over both transports: one rule book.
    for transport in [Transport::Udp, Transport::Shm] {
        let p = pair(transport, all());
        let ma = p.pa.alloc_mr(4096, all()).unwrap();
        ma.write(0, &[0xAB; 4096]).unwrap();
        let mb =
            p.pb.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
                .unwrap();
        expect_access_error(&p, &ma, &mb, mb.addr(), mb.rkey(), 64);
    }
}

#[test]
fn missing_qp_access_flag_is_rejected() {
    // The same violation over both transports: one rule book.
    for transport in [Transport::Udp, Transport::Shm] {
        let p = pair(
            transport,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        );
        let ma = p.pa.alloc_mr(4096, all()).unwrap();
        ma.write(0, &[0xAB; 4096]).unwrap();
        let mb = p.pb.alloc_mr(4096, all()).unwrap();
        expect_access_error(&p, &ma, &mb, mb.addr(), mb.rkey(), 64);
    }
}

#[test]
fn other_protection_domain_is_rejected() {
    // The same violation over both transports: one rule book.
    for transport in [Transport::Udp, Transport::Shm] {
        let p = pair(transport, all());
        let ma = p.pa.alloc_mr(4096, all()).unwrap();
        ma.write(0, &[0xAB; 4096]).unwrap();
        let other_pd = p.b.alloc_pd().unwrap();
        let mb = other_pd.alloc_mr(4096, all()).unwrap();
        expect_access_error(&p, &ma, &mb, mb.addr(), mb.rkey(), 64);
    }
}

/// The target deregisters a region the initiator has just written to
/// directly: the next WRITE with its rkey fails and touches nothing.
#[test]
fn deregistered_region_is_rejected() {
    // The same violation over both transports: one rule book.
    for transport in [Transport::Udp, Transport::Shm] {
        let p = pair(transport, all());
        let ma = p.pa.alloc_mr(4096, all()).unwrap();
        ma.write(0, &[0xAB; 4096]).unwrap();
        let keep = p.pb.alloc_mr(4096, all()).unwrap();
        let mb = p.pb.alloc_mr(4096, all()).unwrap();
        let (addr, rkey) = (mb.addr(), mb.rkey());
        for i in 0..2 {
            let wc = write_once(&p, &ma, i, addr, rkey, 64);
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        }
        drop(mb);
        expect_access_error(&p, &ma, &keep, addr, rkey, 64);
    }
}

/// A WRITE of `len` bytes from `ma` at 0 to `remote_addr` through `qp`
/// (whose send CQ is `cq`), and its completion.
fn write_on(
    qp: &Qp,
    cq: &Cq,
    ma: &Mr,
    wr_id: u64,
    (remote_addr, rkey): (u64, Rkey),
    len: u32,
) -> WorkCompletion {
    let op = SendOp::Write { remote_addr, rkey };
    qp.post_send(&SendWr::new(wr_id, op, vec![ma.sge(0, len)]))
        .unwrap();
    cq.wait(1, T).unwrap()[0]
}

/// [`write_on`] through the pair's first QP.
fn write_once(
    p: &Pair,
    ma: &Mr,
    wr_id: u64,
    remote_addr: u64,
    rkey: Rkey,
    len: u32,
) -> WorkCompletion {
    write_on(&p.qa, &p.ca, ma, wr_id, (remote_addr, rkey), len)
}

/// After a first direct operation the initiator reuses what it looked up
/// (QP, local region, link, target slot); every change made since must
/// still be seen: another target region, the target's deregistration, the
/// local region's deregistration, the QP leaving RTS.
#[test]
fn repeated_operations_see_every_change_in_between() {
    let p = pair(Transport::Shm, all());
    let ma = p.pa.alloc_mr(4096, all()).unwrap();
    ma.write(0, &[0x11; 4096]).unwrap();
    let mb = p.pb.alloc_mr(4096, all()).unwrap();
    let mb2 = p.pb.alloc_mr(4096, all()).unwrap();
    warm(&p, &mb2);
    let direct0 = warm(&p, &mb);
    for i in 0..3 {
        let wc = write_once(&p, &ma, i, mb.addr() + 64 * i, mb.rkey(), 64);
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
    assert_eq!(mb.to_vec()[..192], [0x11; 192]);
    // Another target region through the same QP and local region.
    let wc = write_once(&p, &ma, 10, mb2.addr() + 8, mb2.rkey(), 32);
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    assert_eq!(mb2.to_vec()[8..40], [0x11; 32]);
    assert_eq!(mb2.to_vec()[40], 0, "nothing past the WRITE");
    assert_eq!(p.a.driver_counters().direct_ops - direct0, 4);

    // The local region deregistered: its lkey is refused by the local side.
    let ma2 = p.pa.alloc_mr(4096, all()).unwrap();
    ma2.write(0, &[0x22; 4096]).unwrap();
    let wc = write_once(&p, &ma2, 20, mb.addr(), mb.rkey(), 16);
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    let stale = ma2.sge(0, 16);
    drop(ma2);
    let (addr, rkey) = (mb.addr() + 1024, mb.rkey());
    expect_write_error(&p, stale, &mb, addr, rkey, WcStatus::LocProtErr);
}

/// A WRITE posted right behind a SEND (which the engine carries) must not
/// overtake it by going direct, even though the QP's earlier WRITEs did.
/// Whether the SEND is still unacknowledged when the WRITE is posted is
/// the peer's timing (its ACK may come at once): the scenario repeats until
/// the WRITE was posted behind it, and every round must complete in order.
#[test]
fn a_write_posted_behind_a_send_completes_after_it() {
    let p = pair(Transport::Shm, all());
    let ma = p.pa.alloc_mr(4096, all()).unwrap();
    ma.write(0, &[0x33; 4096]).unwrap();
    let mb = p.pb.alloc_mr(4096, all()).unwrap();
    warm(&p, &mb);
    let wc = write_once(&p, &ma, 1, mb.addr(), mb.rkey(), 64);
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    let mut queued_behind = 0;
    for round in 0..20u64 {
        mb.write(1024, &[0; 2048]).unwrap();
        p.qb.post_recv(&RecvWr {
            wr_id: 7,
            sg_list: vec![mb.sge(1024, 256)],
        })
        .unwrap();
        let (send_id, write_id) = (100 + 2 * round, 101 + 2 * round);
        p.qa.post_send(&SendWr::new(send_id, SendOp::Send, vec![ma.sge(0, 256)]))
            .unwrap();
        let direct0 = p.a.driver_counters().direct_ops;
        p.qa.post_send(&SendWr::new(
            write_id,
            SendOp::Write {
                remote_addr: mb.addr() + 2048,
                rkey: mb.rkey(),
            },
            vec![ma.sge(0, 128)],
        ))
        .unwrap();
        if p.a.driver_counters().direct_ops == direct0 {
            queued_behind += 1;
        }
        let wcs = p.ca.wait(2, T).unwrap();
        let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
        assert_eq!(
            got,
            [
                (send_id, WcStatus::Success, WcOpcode::Send),
                (write_id, WcStatus::Success, WcOpcode::RdmaWrite)
            ],
            "round {round}"
        );
        assert_eq!(p.cb.wait_ok(T).unwrap().byte_len, 256);
        let m = mb.to_vec();
        assert!(
            m[1024..1280] == [0x33; 256],
            "round {round}: the SEND's bytes"
        );
        assert!(
            m[2048..2176] == [0x33; 128],
            "round {round}: the WRITE's bytes"
        );
        if queued_behind > 0 {
            return;
        }
    }
    panic!("in 20 rounds the SEND was always acknowledged before the WRITE was posted");
}

/// Two QPs of one device alternate: each keeps to its own destination and
/// rights (the second's target QP grants no remote write).
#[test]
fn each_qp_keeps_its_own_route() {
    let p = pair(Transport::Shm, all());
    let qa2 = p.pa.create_qp(QpType::Rc, &p.ca, &p.ca).build().unwrap();
    let qb2 = p.pb.create_qp(QpType::Rc, &p.cb, &p.cb).build().unwrap();
    connect(&qa2, &qb2, AccessFlags::REMOTE_READ);
    let ma = p.pa.alloc_mr(4096, all()).unwrap();
    ma.write(0, &[0x55; 4096]).unwrap();
    let mb = p.pb.alloc_mr(4096, all()).unwrap();
    granted(&p.a, &p.pa, &qa2, &p.ca, &mb);
    let direct0 = warm(&p, &mb);
    let write = |qp: &Qp, wr_id: u64, off: u64| {
        write_on(qp, &p.ca, &ma, wr_id, (mb.addr() + off, mb.rkey()), 64)
    };
    assert_eq!(write(&p.qa, 1, 0).status, WcStatus::Success);
    // Reading through the second QP works; writing does not.
    let read = SendOp::Read {
        remote_addr: mb.addr(),
        rkey: mb.rkey(),
    };
    qa2.post_send(&SendWr::new(2, read, vec![ma.sge(1024, 64)]))
        .unwrap();
    assert_eq!(p.ca.wait(1, T).unwrap()[0].status, WcStatus::Success);
    assert_eq!(write(&p.qa, 3, 64).status, WcStatus::Success);
    let before = mb.to_vec();
    assert_eq!(write(&qa2, 4, 512).status, WcStatus::RemAccessErr);
    assert!(
        mb.to_vec() == before,
        "nothing written through the read-only QP"
    );
    assert_eq!(write(&p.qa, 5, 128).status, WcStatus::Success);
    assert_eq!(mb.to_vec()[..192], [0x55; 192]);
    assert_eq!(p.a.driver_counters().direct_ops - direct0, 4);
}

#[test]
fn a_qp_that_left_rts_after_direct_writes_executes_nothing() {
    let p = pair(Transport::Shm, all());
    let ma = p.pa.alloc_mr(4096, all()).unwrap();
    ma.write(0, &[0x44; 4096]).unwrap();
    let mb = p.pb.alloc_mr(4096, all()).unwrap();
    let direct0 = warm(&p, &mb);
    let wc = write_once(&p, &ma, 1, mb.addr(), mb.rkey(), 64);
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    p.qa.modify(&attr, AttrMask::STATE).unwrap();
    let wc = write_once(&p, &ma, 2, mb.addr() + 512, mb.rkey(), 64);
    assert_eq!(wc.status, WcStatus::WrFlushErr, "{wc:?}");
    assert_eq!(mb.to_vec()[512], 0, "nothing written after leaving RTS");
    assert_eq!(p.a.driver_counters().direct_ops - direct0, 1);
}

/// Caller memory that cannot move into a segment is never handed to a
/// peer: WRITE, READ and atomics on it go through the target's engine.
#[test]
fn caller_memory_left_in_place_is_reached_through_the_engine() {
    let p = pair(Transport::Shm, all());
    let ma = p.pa.alloc_mr(1 << 16, all()).unwrap();
    let mut target = vec![0u8; 1 << 16];
    let tp = target.as_mut_ptr();
    // SAFETY: `target` outlives the region (dropped at the end of the test, after `mb`).
    let mb = unsafe { p.pb.register_raw(tp, target.len(), tp as u64, all()) }.unwrap();
    ma.write(0, &[0x5C; 5000]).unwrap();
    let rb = mb.remote();
    for round in 0..3 {
        write_5000_at_100(&p, &ma, &mb);
        assert_eq!(mb.to_vec()[100..5100], [0x5C; 5000]);
        p.qa.post_send(&SendWr::new(
            2,
            SendOp::Read {
                remote_addr: rb.at(100),
                rkey: rb.rkey,
            },
            vec![ma.sge(10_000, 5000)],
        ))
        .unwrap();
        p.ca.wait_ok(T).unwrap();
        assert_eq!(ma.to_vec()[10_000..15_000], [0x5C; 5000]);
        fetch_add_10_at_8(&p, &ma, &mb, 3);
        ma.write(0, &[0x5C; 8]).unwrap();
        // Time for a grant, were there one to give.
        std::thread::sleep(Duration::from_millis(2 * round));
    }
    assert_eq!(p.a.driver_counters().direct_ops, 0, "nothing went direct");
    drop(mb);
    drop(target);
}

/// WRITE 1: `ma[0..5000]` to `mb[100..5100]`.
fn write_5000_at_100(p: &Pair, ma: &Mr, mb: &Mr) {
    let rb = mb.remote();
    p.qa.post_send(&SendWr::new(
        1,
        SendOp::Write {
            remote_addr: rb.at(100),
            rkey: rb.rkey,
        },
        vec![ma.sge(0, 5000)],
    ))
    .unwrap();
    p.ca.wait_ok(T).unwrap();
}

/// With 1 at `mb[8]`: FETCH_ADD 10 there, the old value into `ma[0..8]`.
fn fetch_add_10_at_8(p: &Pair, ma: &Mr, mb: &Mr, wr_id: u64) {
    let rb = mb.remote();
    mb.write(8, &1u64.to_ne_bytes()).unwrap();
    p.qa.post_send(&SendWr::new(
        wr_id,
        SendOp::FetchAdd {
            remote_addr: rb.at(8),
            rkey: rb.rkey,
            add: 10,
        },
        vec![ma.sge(0, 8)],
    ))
    .unwrap();
    p.ca.wait_ok(T).unwrap();
    assert_eq!(ma.read_u64(0).unwrap(), 1);
    assert_eq!(mb.read_u64(8).unwrap(), 11);
}

/// True when /proc/self/maps shows a region segment mapped at `addr`.
fn segment_mapped_at(addr: usize) -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .any(|l| {
            let (s, e) = l.split_once(' ').unwrap().0.split_once('-').unwrap();
            let (s, e) = (
                usize::from_str_radix(s, 16).unwrap(),
                usize::from_str_radix(e, 16).unwrap(),
            );
            s <= addr && addr < e && l.contains("softrdma-region")
        })
}

#[test]
fn caller_memory_moves_into_a_segment_while_registered() {
    let p = pair(Transport::Shm, all());
    let ma = p.pa.alloc_mr(1 << 16, all()).unwrap();
    let layout = std::alloc::Layout::from_size_align(1 << 16, 4096).unwrap();
    // SAFETY: a non-zero size; freed at the end with the same layout.
    let tp = unsafe { std::alloc::alloc(layout) };
    assert!(!tp.is_null());
    // SAFETY: tp is valid for 64 KiB; bytes are accessed by raw pointer only.
    let byte = |i: usize| unsafe { std::ptr::read_volatile(tp.add(i)) };
    // SAFETY: as above.
    unsafe { std::ptr::write_bytes(tp, 0xA7, 1 << 16) };
    // SAFETY: the memory outlives the region (freed after `mb` is dropped)
    // and no other thread touches it.
    let mb = unsafe { p.pb.register_raw_shared(tp, 1 << 16, tp as u64, all()) }.unwrap();
    assert!(
        segment_mapped_at(tp as usize),
        "page-aligned heap memory moved"
    );
    assert_eq!(byte(0), 0xA7, "contents kept");
    assert_eq!(byte((1 << 16) - 1), 0xA7);
    ma.write(0, &[0x5C; 5000]).unwrap();
    let direct0 = warm(&p, &mb);
    let rx0 = p.b.counters().rx_packets;
    write_5000_at_100(&p, &ma, &mb);
    assert_eq!(
        (byte(99), byte(100), byte(5099), byte(5100)),
        (0xA7, 0x5C, 0x5C, 0xA7)
    );
    // Atomics on it are direct CPU atomics now.
    fetch_add_10_at_8(&p, &ma, &mb, 2);
    assert_eq!(p.a.driver_counters().direct_ops - direct0, 2);
    assert_eq!(
        p.b.counters().rx_packets,
        rx0,
        "nothing went through the rings"
    );
    // A second registration inside it does not move again (its pages are
    // the first one's segment): peers reach it through the engine.
    // SAFETY: as above.
    let inner = unsafe {
        p.pb.register_raw_shared(tp.add(4096), 8192, tp as u64 + 4096, all())
    }
    .unwrap();
    drop(mb);
    assert!(
        !segment_mapped_at(tp as usize),
        "private again after the dereg of the region that moved it"
    );
    drop(inner);
    assert_eq!(
        (byte(99), byte(100), byte(5099), byte(5100)),
        (0xA7, 0x5C, 0x5C, 0xA7)
    );
    assert_eq!(byte(8), 11, "contents kept");
    // SAFETY: as above.
    let odd = unsafe {
        p.pb.register_raw_shared(tp.add(1), 5000, tp as u64 + 1, all())
    }
    .unwrap();
    assert!(!segment_mapped_at(tp as usize), "partial pages stay");
    let ro = odd.remote();
    p.qa.post_send(&SendWr::new(
        3,
        SendOp::Write {
            remote_addr: ro.at(0),
            rkey: ro.rkey,
        },
        vec![ma.sge(0, 16)],
    ))
    .unwrap();
    p.ca.wait_ok(T).unwrap();
    assert_eq!(
        (byte(0), byte(1), byte(16), byte(17)),
        (0xA7, 1, 0x5C, 0xA7),
        "ma's first 16 bytes (the fetched 1, then 0x5C) at offset 1"
    );
    drop(odd);
    // SAFETY: allocated above with this layout; no region uses it any more.
    unsafe { std::alloc::dealloc(tp, layout) };
}

#[test]
fn udp_transport_never_uses_shared_memory() {
    let p = pair(Transport::Udp, all());
    let ma = p.pa.alloc_mr(4096, all()).unwrap();
    let mb = p.pb.alloc_mr(4096, all()).unwrap();
    p.qa.post_send(&SendWr::new(
        1,
        SendOp::Write {
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
        },
        vec![ma.sge(0, 64)],
    ))
    .unwrap();
    p.ca.wait_ok(T).unwrap();
    assert_eq!(p.a.driver_counters().direct_ops, 0);
    assert_eq!(p.a.shm_counters().tx_packets, 0);
    assert!(p.a.counters().tx_packets > 0);
    let _ = (&p.b, &p.cb, &p.qb);
}

/// A device at a fixed address opened twice in one process: two contexts
/// on the same device (as rdma-core gives), each usable, the device open
/// until the last one goes.
#[test]
fn a_device_opened_twice_gives_two_contexts_on_it() {
    // Peers talk on port 4791; a free address far from the ones
    // `default_loopback` hands out (from 127.0.0.1 up).
    let addr = (2..200u8)
        .rev()
        .map(|n| std::net::SocketAddr::from(([127, 0, 0, n], 4791)))
        .find(|a| std::net::UdpSocket::bind(a).is_ok())
        .unwrap();
    let cfg = DeviceConfig::new("twice", addr).transport(Transport::Udp);
    let first = Context::open_with(&cfg).unwrap();
    let second = Context::open_with(&cfg).expect("the second open succeeds");
    assert_eq!(first.addr(), second.addr());
    let peer =
        Context::open_with(&DeviceConfig::default_loopback().transport(Transport::Udp)).unwrap();
    let (pp, cp) = (peer.alloc_pd().unwrap(), peer.create_cq(16).unwrap());
    let mp = pp.alloc_mr(4096, all()).unwrap();
    drop(first);
    // The device stays open for the second context.
    let (p2, c2) = (second.alloc_pd().unwrap(), second.create_cq(16).unwrap());
    let q2 = p2.create_qp(QpType::Rc, &c2, &c2).build().unwrap();
    let qp = pp.create_qp(QpType::Rc, &cp, &cp).build().unwrap();
    connect(&q2, &qp, all());
    let m2 = p2.alloc_mr(4096, all()).unwrap();
    m2.write(0, &[0x77; 64]).unwrap();
    assert_eq!(
        write_on(&q2, &c2, &m2, 1, (mp.addr(), mp.rkey()), 64).status,
        WcStatus::Success
    );
    assert_eq!(mp.to_vec()[..64], [0x77; 64]);
}
