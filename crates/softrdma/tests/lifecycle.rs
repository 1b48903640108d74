//! The API a binding builds on (the C library uses nothing else): destroys
//! that can be refused and hand the object back, SRQs created with their
//! limit armed, QPs created from a whole `QpCap`, receive lists, and the
//! one teardown of a QP that same-host peers had been granted memory
//! through.

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

fn device(transport: Transport) -> Context {
    let mut cfg = DeviceConfig::default_loopback().transport(transport);
    cfg.capture = None;
    cfg.fault = None;
    Context::open_with(&cfg).unwrap()
}

/// Connects two RC QPs with a short retry timeout (4 ms, 2 retries).
fn connect(qa: &Qp, qb: &Qp) {
    let fast = ConnectOptions {
        timeout: 10,
        retry_cnt: 2,
        ..Default::default()
    };
    qa.connect(&qb.endpoint(), &fast).unwrap();
    qb.connect(&qa.endpoint(), &fast).unwrap();
}

fn send(qp: &Qp, mr: &Mr, wr_id: u64, offset: u64, len: u32) {
    qp.post_send(&SendWr::new(wr_id, SendOp::Send, vec![mr.sge(offset, len)]))
        .unwrap();
}

fn recv(wr_id: u64, sge: Sge) -> RecvWr {
    RecvWr {
        wr_id,
        sg_list: vec![sge],
    }
}

fn is_busy(e: &Error) -> bool {
    e.errno() == errno::EBUSY && matches!(e, Error::Verbs(VerbsError::Busy(_)))
}

#[test]
fn refused_destroys_hand_back_objects_that_still_work() {
    let (a, b) = (device(Transport::Udp), device(Transport::Udp));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let (ma, mb) = (
        pa.alloc_mr(4096, all()).unwrap(),
        pb.alloc_mr(4096, all()).unwrap(),
    );
    let srq = pb.create_srq(16, 1).unwrap();
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb = pb
        .create_qp(QpType::Rc, &cb, &cb)
        .srq(&srq)
        .build()
        .unwrap();
    connect(&qa, &qb);

    // In use: each destroy is refused with EBUSY and gives the object back.
    let (pb, e) = pb.dealloc().unwrap_err();
    assert!(is_busy(&e), "{e:?}");
    let (cb, e) = cb.destroy().unwrap_err();
    assert!(is_busy(&e), "{e:?}");
    let (srq, e) = srq.destroy().unwrap_err();
    assert!(is_busy(&e), "{e:?}");

    // What came back carries traffic as before.
    srq.post_recv(&recv(5, mb.sge(0, 64))).unwrap();
    ma.write(0, b"still here").unwrap();
    send(&qa, &ma, 1, 0, 10);
    assert_eq!(ca.wait_ok(T).unwrap().wr_id, 1);
    let wc = cb.wait_ok(T).unwrap();
    assert_eq!((wc.wr_id, wc.byte_len), (5, 10));
    let mut got = [0u8; 10];
    mb.read(0, &mut got).unwrap();
    assert_eq!(&got, b"still here");

    // Once the QP is gone, everything it used can go, in order.
    let qpn = qb.qpn();
    qb.destroy().unwrap();
    assert!(!b.qp_numbers().contains(&qpn), "QP {qpn:#x} destroyed");
    srq.destroy().unwrap();
    cb.destroy().unwrap();
    // The MR still holds the PD.
    let (pb, e) = pb.dealloc().unwrap_err();
    assert!(is_busy(&e), "{e:?}");
    drop(mb);
    pb.dealloc().unwrap();
}

#[test]
fn an_address_handle_holds_its_pd_until_destroyed() {
    let a = device(Transport::Udp);
    let pd = a.alloc_pd().unwrap();
    let ah = pd.create_ah(a.gid()).unwrap();
    let (pd, e) = pd.dealloc().unwrap_err();
    assert!(is_busy(&e), "{e:?}");
    ah.destroy().unwrap();
    pd.dealloc().unwrap();
}

#[test]
fn a_refused_cq_destroy_keeps_its_channel() {
    let (a, b) = (device(Transport::Udp), device(Transport::Udp));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let ca = a.create_cq(16).unwrap();
    let channel = b.create_comp_channel().unwrap();
    let cb = b.create_cq_with_channel(16, &channel).unwrap();
    let (ma, mb) = (
        pa.alloc_mr(4096, all()).unwrap(),
        pb.alloc_mr(4096, all()).unwrap(),
    );
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb = pb.create_qp(QpType::Rc, &cb, &cb).build().unwrap();
    connect(&qa, &qb);
    let (cb, e) = cb.destroy().unwrap_err();
    assert!(is_busy(&e), "{e:?}");

    cb.req_notify(false).unwrap();
    qb.post_recv(&recv(9, mb.sge(0, 64))).unwrap();
    send(&qa, &ma, 1, 0, 8);
    assert_eq!(channel.get_event(Some(T)).unwrap(), cb.handle());
    assert_eq!(cb.wait_ok(T).unwrap().wr_id, 9);
}

#[test]
fn an_srq_created_with_a_limit_raises_the_limit_event() {
    let (a, b) = (device(Transport::Udp), device(Transport::Udp));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let (ma, mb) = (
        pa.alloc_mr(4096, all()).unwrap(),
        pb.alloc_mr(16 * 256, all()).unwrap(),
    );
    let srq = pb
        .create_srq_with(SrqInit {
            max_wr: 16,
            max_sge: 2,
            limit: 3,
        })
        .unwrap();
    assert_eq!((srq.max_wr(), srq.max_sge()), (16, 2));
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb = pb
        .create_qp(QpType::Rc, &cb, &cb)
        .srq(&srq)
        .build()
        .unwrap();
    connect(&qa, &qb);
    let wrs: Vec<RecvWr> = (0..4).map(|i| recv(i, mb.sge(i * 256, 256))).collect();
    assert_eq!(srq.post_recv_list(&wrs), Ok(4));

    // 4 posted, limit 3: nothing until the second receive is taken.
    send(&qa, &ma, 1, 0, 16);
    cb.wait_ok(T).unwrap();
    let limit_event = |ctx: &Context| {
        std::iter::from_fn(|| ctx.poll_async_event())
            .any(|ev| ev == Event::SrqLimitReached { srq: srq.handle() })
    };
    assert!(!limit_event(&b), "4 → 3 receives: not below the limit");
    send(&qa, &ma, 2, 0, 16);
    cb.wait_ok(T).unwrap();
    assert!(limit_event(&b), "3 → 2 receives: below the limit of 3");
}

#[test]
fn a_qp_built_from_a_whole_cap_reports_what_it_got() {
    let a = device(Transport::Udp);
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(64).unwrap();
    let asked = QpCap {
        max_send_wr: 10,
        max_recv_wr: 7,
        max_send_sge: 3,
        max_recv_sge: 2,
        max_inline_data: 100,
    };
    let qp = pd
        .create_qp(QpType::Uc, &cq, &cq)
        .cap(asked)
        .sq_sig_all(true)
        .build()
        .unwrap();
    let got = qp.cap();
    assert!(got.max_send_wr >= asked.max_send_wr && got.max_recv_wr >= asked.max_recv_wr);
    assert!(got.max_send_sge >= asked.max_send_sge && got.max_recv_sge >= asked.max_recv_sge);
    assert!(got.max_inline_data >= asked.max_inline_data);
    assert!(qp.sq_sig_all());
    assert_eq!(qp.qp_type(), QpType::Uc);
    let attr = qp.query().unwrap();
    assert_eq!((attr.cap, attr.qp_state), (got, QpState::Reset));

    // A cap over the device's limits is refused with EINVAL.
    let too_many = QpCap {
        max_send_sge: a.query_device().max_sge + 1,
        ..asked
    };
    let e = pd
        .create_qp(QpType::Uc, &cq, &cq)
        .cap(too_many)
        .build()
        .unwrap_err();
    assert_eq!(e.errno(), errno::EINVAL, "{e}");
}

#[test]
fn modify_takes_any_attributes_and_query_returns_them() {
    let (a, b) = (device(Transport::Udp), device(Transport::Udp));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(8).unwrap(), b.create_cq(8).unwrap());
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb = pb.create_qp(QpType::Rc, &cb, &cb).build().unwrap();
    connect(&qa, &qb);
    // RTS → RTS with a new retry count and RNR timer.
    let attr = QpAttr {
        qp_state: QpState::Rts,
        min_rnr_timer: 5,
        ..Default::default()
    };
    qa.modify(&attr, AttrMask::STATE | AttrMask::MIN_RNR_TIMER)
        .unwrap();
    let got = qa.query().unwrap();
    assert_eq!((got.qp_state, got.min_rnr_timer), (QpState::Rts, 5));
    assert_eq!(got.dest_qp_num, qb.qpn());
    assert_eq!(got.rq_psn, Psn::new(qb.endpoint().psn));
    // A transition that does not exist changes nothing.
    let back = QpAttr {
        qp_state: QpState::Init,
        ..Default::default()
    };
    let e = qa.modify(&back, AttrMask::STATE).unwrap_err();
    assert_eq!(e.errno(), errno::EINVAL, "{e}");
    assert_eq!(qa.state(), QpState::Rts);
}

#[test]
fn a_receive_list_posts_in_order_and_stops_at_the_first_refusal() {
    let (a, b) = (device(Transport::Udp), device(Transport::Udp));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let (ma, mb) = (
        pa.alloc_mr(4096, all()).unwrap(),
        pb.alloc_mr(64 * 1024, all()).unwrap(),
    );
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb = pb
        .create_qp(QpType::Rc, &cb, &cb)
        .max_recv_wr(4)
        .max_recv_sge(1)
        .build()
        .unwrap();
    assert!(qb.cap().max_recv_wr < 200);
    connect(&qa, &qb);

    // The second WR has more SGEs than the QP takes: the first is posted,
    // and nothing after the second is even taken from the iterator.
    let mut taken = 0;
    let too_many = (0..=qb.cap().max_recv_sge as u64)
        .map(|i| mb.sge(i * 8, 8))
        .collect();
    let list = [
        recv(10, mb.sge(0, 256)),
        RecvWr {
            wr_id: 11,
            sg_list: too_many,
        },
        recv(12, mb.sge(768, 256)),
    ];
    let (at, e) = qb
        .post_recv_list(list.iter().inspect(|_| taken += 1))
        .unwrap_err();
    assert_eq!((at, e.errno(), taken), (1, errno::EINVAL, 2), "{e}");

    // Room for the rest of the queue, then ENOMEM at the WR past it.
    let room = qb.cap().max_recv_wr as u64 - 1;
    let more: Vec<RecvWr> = (0..room + 1)
        .map(|i| recv(20 + i, mb.sge(256 * (i + 1), 256)))
        .collect();
    let (at, e) = qb.post_recv_list(&more).unwrap_err();
    assert_eq!((at as u64, e.errno()), (room, errno::ENOMEM), "{e}");

    // The receives that were posted are consumed in list order.
    for i in 0..=room {
        send(&qa, &ma, i, 0, 4);
    }
    let ids: Vec<u64> = cb
        .wait(room as usize + 1, T)
        .unwrap()
        .iter()
        .map(|wc| {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            wc.wr_id
        })
        .collect();
    let expected: Vec<u64> = std::iter::once(10).chain(20..20 + room).collect();
    assert_eq!(ids, expected);
}

/// Reads 8 bytes of `mb` through `qp` until one goes direct: the target
/// granted `mb` to this QP (the first operations ask for the grant and go
/// through the target's engine).
fn warm(ctx: &Context, qp: &Qp, cq: &Cq, scratch: &Mr, mb: &Mr) {
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
        if ctx.driver_counters().direct_ops > before {
            return;
        }
        assert!(t0.elapsed() < T, "no grant for {mb:?} after {i} READs");
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn destroying_the_target_qp_takes_back_what_it_granted() {
    let (a, b) = (device(Transport::Shm), device(Transport::Shm));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let ma = pa.alloc_mr(4096, all()).unwrap();
    let mb = pb.alloc_mr(4096, all()).unwrap();
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb = pb.create_qp(QpType::Rc, &cb, &cb).build().unwrap();
    connect(&qa, &qb);
    warm(&a, &qa, &ca, &ma, &mb);
    let direct = a.driver_counters().direct_ops;

    qb.destroy().unwrap();
    ma.write(0, &[0x77; 64]).unwrap();
    let write = SendOp::Write {
        remote_addr: mb.addr() + 1024,
        rkey: mb.rkey(),
    };
    qa.post_send(&SendWr::new(1, write, vec![ma.sge(0, 64)]))
        .unwrap();
    let wc = ca.wait(1, T).unwrap()[0];
    assert_eq!(wc.status, WcStatus::RetryExcErr, "{wc:?}");
    assert_eq!(
        a.driver_counters().direct_ops,
        direct,
        "nothing done directly through the destroyed QP's grant"
    );
    assert!(
        mb.to_vec()[1024..1088].iter().all(|&b| b == 0),
        "the target is untouched"
    );
}

#[test]
fn connect_goes_in_steps_and_takes_receives_posted_in_init() {
    let (a, b) = (device(Transport::Udp), device(Transport::Udp));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let (ma, mb) = (
        pa.alloc_mr(4096, all()).unwrap(),
        pb.alloc_mr(4096, all()).unwrap(),
    );
    // UC: a SEND that finds no receive is dropped, so the receive must be
    // there before the peer can send.
    let qa = pa.create_qp(QpType::Uc, &ca, &ca).build().unwrap();
    let qb = pb.create_qp(QpType::Uc, &cb, &cb).build().unwrap();
    let o = ConnectOptions::default();
    qa.init(&o).unwrap();
    assert_eq!(qa.state(), QpState::Init);
    qa.post_recv(&recv(1, ma.sge(0, 64))).unwrap();
    // The receive side stops at RTR; the sender goes all the way.
    qa.connect_until(&qb.endpoint(), &o, QpState::Rtr).unwrap();
    assert_eq!(qa.state(), QpState::Rtr);
    qb.connect(&qa.endpoint(), &o).unwrap();
    mb.write(0, b"posted in INIT").unwrap();
    send(&qb, &mb, 2, 0, 14);
    assert_eq!(cb.wait_ok(T).unwrap().wr_id, 2);
    let wc = ca.wait_ok(T).unwrap();
    assert_eq!((wc.wr_id, wc.opcode, wc.byte_len), (1, WcOpcode::Recv, 14));
    let mut got = [0u8; 14];
    ma.read(0, &mut got).unwrap();
    assert_eq!(&got, b"posted in INIT");
    // connect carries on from RTR; then a sends too.
    qa.connect(&qb.endpoint(), &o).unwrap();
    assert_eq!(qa.state(), QpState::Rts);
    qb.post_recv(&recv(3, mb.sge(1024, 64))).unwrap();
    ma.write(100, b"back").unwrap();
    send(&qa, &ma, 4, 100, 4);
    assert_eq!(ca.wait_ok(T).unwrap().wr_id, 4);
    assert_eq!(cb.wait_ok(T).unwrap().byte_len, 4);
    // A connected QP, or a goal that is no connect step, is refused and
    // changes nothing.
    let e = qa.connect(&qb.endpoint(), &o).unwrap_err();
    assert!(
        matches!(e, Error::Config(ref m) if m.contains("Rts")),
        "{e}"
    );
    assert_eq!(qa.state(), QpState::Rts);
    let fresh = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let e = fresh
        .connect_until(&qb.endpoint(), &o, QpState::Sqd)
        .unwrap_err();
    assert_eq!(e.errno(), errno::EINVAL);
    assert_eq!(fresh.state(), QpState::Reset);
    // Stopping at INIT takes nothing from the peer's endpoint.
    fresh
        .connect_until(&qb.endpoint(), &o, QpState::Init)
        .unwrap();
    assert_eq!(fresh.state(), QpState::Init);
}

/// Whether `fd` is readable right now.
fn readable(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

/// Two CQs on one channel, both with an event pending: the channel's fd
/// stays readable until the last event is taken, as ibverbs' does. A
/// program that polls the fd and takes one event per readable poll (Gloo's
/// device thread, in O_NONBLOCK mode) would otherwise never hear of the
/// second CQ again.
#[test]
fn a_channel_fd_stays_readable_while_events_pend() {
    let (a, b) = (device(Transport::Udp), device(Transport::Udp));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let ca = a.create_cq(16).unwrap();
    let channel = b.create_comp_channel().unwrap();
    let cb1 = b.create_cq_with_channel(16, &channel).unwrap();
    let cb2 = b.create_cq_with_channel(16, &channel).unwrap();
    let (ma, mb) = (
        pa.alloc_mr(4096, all()).unwrap(),
        pb.alloc_mr(4096, all()).unwrap(),
    );
    let qa1 = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qa2 = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb1 = pb.create_qp(QpType::Rc, &cb1, &cb1).build().unwrap();
    let qb2 = pb.create_qp(QpType::Rc, &cb2, &cb2).build().unwrap();
    connect(&qa1, &qb1);
    connect(&qa2, &qb2);
    cb1.req_notify(false).unwrap();
    cb2.req_notify(false).unwrap();
    qb1.post_recv(&recv(1, mb.sge(0, 64))).unwrap();
    qb2.post_recv(&recv(2, mb.sge(64, 64))).unwrap();
    send(&qa1, &ma, 11, 0, 8);
    send(&qa2, &ma, 12, 0, 8);
    // Both completions in, so both events raised (both CQs were armed).
    assert_eq!(cb1.wait_ok(T).unwrap().wr_id, 1);
    assert_eq!(cb2.wait_ok(T).unwrap().wr_id, 2);

    assert!(readable(channel.fd()), "two events pend");
    let first = channel.take_event().expect("the first event");
    assert!(
        readable(channel.fd()),
        "one event still pends: the fd must stay readable"
    );
    let second = channel.take_event().expect("the second event");
    let mut got = [first.raw(), second.raw()];
    got.sort_unstable();
    let mut want = [cb1.handle().raw(), cb2.handle().raw()];
    want.sort_unstable();
    assert_eq!(got, want, "one event per CQ");
    assert!(!readable(channel.fd()), "no event left: the fd is cleared");
    assert!(channel.take_event().is_none());
}
