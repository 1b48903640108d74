//! Memory windows through the Rust API, over UDP and over shared memory:
//! a window's rkey reaches its range with its rights (the region itself is
//! granted to the peer, so the same-host direct path is live beside it),
//! and an unbind, a local invalidation, a SEND with invalidate and a
//! dealloc each take that access away with the status hardware gives.

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
    _a: Context,
    _b: Context,
    ma: Mr,
    mb: Mr,
    pb: Pd,
    ca: Cq,
    cb: Cq,
    qa: Qp,
    qb: Qp,
}

fn pair(transport: Transport) -> Pair {
    let a = Context::open_with(&DeviceConfig::default_loopback().transport(transport)).unwrap();
    let b = Context::open_with(&DeviceConfig::default_loopback().transport(transport)).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let ma = pa.alloc_mr(1 << 16, all()).unwrap();
    let mb = pb.alloc_mr(1 << 16, all() | AccessFlags::MW_BIND).unwrap();
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb = pb.create_qp(QpType::Rc, &cb, &cb).build().unwrap();
    let fast = ConnectOptions {
        timeout: 10,
        retry_cnt: 2,
        ..Default::default()
    };
    qa.connect(&qb.endpoint(), &fast).unwrap();
    qb.connect(&qa.endpoint(), &fast).unwrap();
    Pair {
        _a: a,
        _b: b,
        ma,
        mb,
        pb,
        ca,
        cb,
        qa,
        qb,
    }
}

fn bind(mb: &Mr, off: u64, len: u64, access: AccessFlags) -> MwBind {
    MwBind {
        mr: Some(mb.lkey()),
        addr: mb.addr() + off,
        length: len,
        access,
    }
}

fn write(p: &Pair, wr_id: u64, va: u64, rkey: Rkey, len: u32) -> WorkCompletion {
    p.qa.post_send(&SendWr::new(
        wr_id,
        SendOp::Write {
            remote_addr: va,
            rkey,
        },
        vec![p.ma.sge(0, len)],
    ))
    .unwrap();
    p.ca.wait(1, T).unwrap()[0]
}

fn transports() -> [Transport; 2] {
    [Transport::Udp, Transport::Shm]
}

#[test]
fn type1_window_bind_write_and_unbind() {
    for t in transports() {
        let p = pair(t);
        let mw = p.pb.alloc_mw(MwType::One).unwrap();
        let first = mw.rkey();
        let rkey =
            p.qb.bind_mw(
                &mw,
                1,
                SendFlags::SIGNALED,
                bind(&p.mb, 0x100, 0x200, all()),
            )
            .unwrap();
        assert_eq!(rkey, next_rkey(first));
        let wc = p.cb.wait_ok(T).unwrap();
        assert_eq!((wc.wr_id, wc.opcode), (1, WcOpcode::BindMw));
        assert_eq!(mw.rkey(), rkey);
        assert!(mw.is_bound());
        p.ma.write(0, b"through a window").unwrap();
        let wc = write(&p, 2, p.mb.addr() + 0x180, rkey, 16);
        assert_eq!(wc.status, WcStatus::Success, "{t:?}");
        let mut got = [0u8; 16];
        p.mb.read(0x180, &mut got).unwrap();
        assert_eq!(&got, b"through a window");
        // The region's own rkey still works beside it.
        let wc = write(&p, 3, p.mb.addr(), p.mb.rkey(), 16);
        assert_eq!(wc.status, WcStatus::Success);
        // Unbind (zero length): the window's rkey reaches nothing.
        let unbound =
            p.qb.bind_mw(
                &mw,
                4,
                SendFlags::SIGNALED,
                MwBind {
                    mr: None,
                    addr: 0,
                    length: 0,
                    access: AccessFlags::empty(),
                },
            )
            .unwrap();
        p.cb.wait_ok(T).unwrap();
        assert!(!mw.is_bound());
        let wc = write(&p, 5, p.mb.addr() + 0x180, unbound, 8);
        assert_eq!(wc.status, WcStatus::RemAccessErr, "{t:?}");
    }
}

#[test]
fn type2_window_local_and_remote_invalidation_and_dealloc() {
    for t in transports() {
        for how in ["local", "remote", "dealloc"] {
            let p = pair(t);
            let mw = p.pb.alloc_mw(MwType::Two).unwrap();
            let rkey = next_rkey(mw.rkey());
            let wr = SendWr::new(
                1,
                SendOp::BindMw {
                    mw: mw.handle(),
                    rkey,
                    bind: bind(&p.mb, 0, 4096, AccessFlags::REMOTE_WRITE),
                },
                vec![],
            );
            p.qb.post_send(&wr).unwrap();
            assert_eq!(p.cb.wait_ok(T).unwrap().opcode, WcOpcode::BindMw);
            assert_eq!(write(&p, 2, p.mb.addr(), rkey, 8).status, WcStatus::Success);
            match how {
                "local" => {
                    p.qb.post_send(&SendWr::new(3, SendOp::LocalInv { rkey }, vec![]))
                        .unwrap();
                    assert_eq!(p.cb.wait_ok(T).unwrap().opcode, WcOpcode::LocalInv);
                }
                "remote" => {
                    p.qb.post_recv(&RecvWr {
                        wr_id: 4,
                        sg_list: vec![p.mb.sge(0x8000, 64)],
                    })
                    .unwrap();
                    p.qa.post_send(&SendWr::new(
                        5,
                        SendOp::SendWithInv {
                            invalidate_rkey: rkey,
                        },
                        vec![],
                    ))
                    .unwrap();
                    p.ca.wait_ok(T).unwrap();
                    let r = p.cb.wait_ok(T).unwrap();
                    assert!(r.wc_flags.contains(WcFlags::WITH_INV));
                    assert_eq!(r.imm_data, rkey.raw());
                }
                _ => mw.dealloc().unwrap(),
            }
            let before = p.mb.to_vec();
            let wc = write(&p, 6, p.mb.addr(), rkey, 8);
            assert_eq!(wc.status, WcStatus::RemAccessErr, "{t:?} {how}");
            assert_eq!(p.mb.to_vec(), before);
        }
    }
}

#[test]
fn device_reports_memory_windows() {
    let b = Context::open_with(&DeviceConfig::default_loopback()).unwrap();
    assert!(b.query_device().max_mw > 0);
    let pd = b.alloc_pd().unwrap();
    let mw = pd.alloc_mw(MwType::Two).unwrap();
    assert_eq!(mw.mw_type(), MwType::Two);
    assert!(!mw.is_bound());
    // The PD is in use while the window lives.
    let (pd, e) = pd.dealloc().unwrap_err();
    assert_eq!(e.errno(), errno::EBUSY);
    drop(mw);
    pd.dealloc().unwrap();
    let _ = b;
}
