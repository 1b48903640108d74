//! The code of docs/api.md, compiled and run. Every ```rust block of that
//! file must appear here verbatim (indentation aside), which
//! `api_md_code_is_compiled_here` checks; the other tests run it.

mod common;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use softrdma::cm::{self, ConnInfo};
use softrdma::rdma_cm::{CmEvent, ConnId, ConnParam, PortSpace};
use softrdma::{
    AccessFlags, CompChannel, ConnectOptions, Context, Cq, DeviceConfig, Event, FaultSpec, Mr, Mw,
    MwBind, MwType, Pd, Qp, QpState, QpType, RecvWr, RemoteRegion, SendFlags, SendOp, SendWr,
    UdDest, WcFlags, WcOpcode, WcStatus, WorkCompletion, GRH_LEN,
};

type Result<T> = softrdma::Result<T>;

// doc: open
fn open() -> Result<(Context, Context)> {
    // The default device: the first of SOFTRDMA_DEVICES, else `srx0` on the
    // first free 127.0.0.N (so every process gets its own address).
    let ctx = Context::open_default()?;
    let port = ctx.query_port();
    println!(
        "{} at {} (GID {}), active MTU {} on a {}-byte link",
        ctx.name(),
        ctx.addr(),
        ctx.gid(),
        port.active_mtu.bytes(),
        port.link_mtu
    );
    // Or configured in code: a name and an address (the address is the GID).
    let cfg = DeviceConfig::new("srx1", "127.0.0.201:4791".parse().unwrap());
    let ctx2 = Context::open_with(&cfg)?;
    Ok((ctx, ctx2))
}

// doc: objects
fn objects(ctx: &Context) -> Result<(Cq, Mr, Qp)> {
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(256)?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    // The region owns its (page-aligned, zeroed) memory. Peers write it at
    // any time, so the safe API copies: Mr::write, Mr::read, Mr::read_u64.
    let mr = pd.alloc_mr(1 << 20, access)?;
    mr.write(0, b"hello")?;
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq) // send CQ, receive CQ
        .max_send_wr(256)
        .max_recv_wr(256)
        .max_inline_data(128)
        .build()?;
    assert_eq!(qp.state(), QpState::Reset);
    Ok((cq, mr, qp))
}

// doc: cm
/// Server side: waits for a client on `listener`, connects the QP to it.
fn serve(listener: &TcpListener, qp: &Qp, mr: &Mr) -> Result<(TcpStream, RemoteRegion)> {
    let mine = ConnInfo {
        endpoint: qp.endpoint(),
        region: Some(mr.remote()),
    };
    let (stream, peer) = cm::accept(listener, &mine)?;
    qp.connect(&peer.endpoint, &ConnectOptions::default())?;
    Ok((stream, peer.region.expect("the client offers a region")))
}

/// Client side: reaches the server (retrying while it starts) and connects.
fn join(server: SocketAddr, qp: &Qp, mr: &Mr) -> Result<(TcpStream, RemoteRegion)> {
    let mine = ConnInfo {
        endpoint: qp.endpoint(),
        region: Some(mr.remote()),
    };
    let (stream, peer) = cm::connect(server, &mine, Duration::from_secs(10))?;
    qp.connect(&peer.endpoint, &ConnectOptions::default())?;
    Ok((stream, peer.region.expect("the server offers a region")))
}

// doc: post
fn post_and_poll(qp: &Qp, cq: &Cq, mr: &Mr, remote: &RemoteRegion) -> Result<()> {
    // RDMA WRITE "hello" to offset 4096 of the peer's region, then READ it
    // back into our offset 8192.
    let write = SendOp::Write {
        remote_addr: remote.at(4096),
        rkey: remote.rkey,
    };
    qp.post_send(&SendWr::new(1, write, vec![mr.sge(0, 5)]))?;
    let read = SendOp::Read {
        remote_addr: remote.at(4096),
        rkey: remote.rkey,
    };
    qp.post_send(&SendWr::new(2, read, vec![mr.sge(8192, 5)]))?;
    // ibv_poll_cq: never blocks (it also runs the progress engine).
    let mut wcs = Vec::new();
    while wcs.len() < 2 {
        cq.poll(&mut wcs, 16)?;
    }
    assert!(wcs.iter().all(|wc| wc.status == WcStatus::Success));
    let mut back = [0u8; 5];
    mr.read(8192, &mut back)?;
    assert_eq!(&back, b"hello");
    Ok(())
}

// doc: send
fn send_recv(sender: &Qp, receiver: &Qp, send_mr: &Mr, recv_mr: &Mr, recv_cq: &Cq) -> Result<()> {
    // A receive must be posted before the SEND arrives (RC retries with
    // RNR NAKs until one is, up to rnr_retry).
    receiver.post_recv(&RecvWr {
        wr_id: 7,
        sg_list: vec![recv_mr.sge(0, 4096)],
    })?;
    let send = SendOp::SendWithImm { imm: 0x1234 };
    sender.post_send(&SendWr::new(3, send, vec![send_mr.sge(0, 5)]))?;
    // Cq::wait polls (spinning briefly, then napping) up to a timeout;
    // wait_ok also turns an error status into Err.
    let wc = recv_cq.wait_ok(Duration::from_secs(5))?;
    assert_eq!((wc.wr_id, wc.opcode, wc.byte_len), (7, WcOpcode::Recv, 5));
    assert!(wc.wc_flags.contains(WcFlags::WITH_IMM) && wc.imm_data == 0x1234);
    Ok(())
}

// doc: epoll
fn channel_cq(ctx: &Context) -> Result<(CompChannel, Cq)> {
    let channel = ctx.create_comp_channel()?;
    let cq = ctx.create_cq_with_channel(64, &channel)?;
    cq.req_notify(false)?; // arm: the next completion signals the channel
    Ok((channel, cq))
}

/// Sleeps in epoll until the channel fires, then drains the CQ.
fn wait_with_epoll(channel: &CompChannel, cq: &Cq) -> Result<Vec<WorkCompletion>> {
    // SAFETY (all blocks): plain epoll calls on our own descriptors.
    let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 0,
    };
    unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, channel.fd(), &mut ev) };
    let mut wcs = Vec::new();
    while wcs.is_empty() {
        if unsafe { libc::epoll_wait(epfd, &mut ev, 1, 5000) } <= 0 {
            break; // timed out
        }
        // ibv_get_cq_event; Duration::ZERO: do not block if the event was taken.
        if channel.get_event(Some(Duration::ZERO)).is_ok() {
            cq.req_notify(false)?; // re-arm first, then drain: nothing is missed
            cq.poll(&mut wcs, 64)?;
        }
    }
    unsafe { libc::close(epfd) };
    Ok(wcs)
}

// doc: ud
fn ud(a: &Context, b: &Context) -> Result<Vec<u8>> {
    let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    let (ca, cb) = (a.create_cq(16)?, b.create_cq(16)?);
    let (ma, mb) = (
        pa.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?,
        pb.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?,
    );
    let qa = pa.create_qp(QpType::Ud, &ca, &ca).build()?;
    let qb = pb.create_qp(QpType::Ud, &cb, &cb).build()?;
    qa.ready_ud()?; // RESET -> INIT -> RTR -> RTS with the QP's Q_Key
    qb.ready_ud()?;
    // Every UD receive starts with 40 bytes of GRH.
    qb.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: vec![mb.sge(0, (GRH_LEN + 1024) as u32)],
    })?;
    let dest = qb.endpoint(); // GID, QP number, Q_Key: what b publishes
    let ah = pa.create_ah(dest.gid)?;
    ma.write(0, b"datagram")?;
    let mut wr = SendWr::new(1, SendOp::Send, vec![ma.sge(0, 8)]);
    wr.ud = Some(UdDest {
        ah: ah.handle(),
        remote_qpn: dest.qpn,
        remote_qkey: dest.qkey,
    });
    qa.post_send(&wr)?;
    let wc = cb.wait_ok(Duration::from_secs(5))?;
    assert!(wc.wc_flags.contains(WcFlags::GRH));
    assert_eq!((wc.src_qp, wc.sgid), (qa.qpn(), a.gid()));
    let mut payload = vec![0; wc.byte_len as usize - GRH_LEN];
    mb.read(GRH_LEN, &mut payload)?;
    Ok(payload)
}

// doc: srq
fn srq(ctx: &Context) -> Result<()> {
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64)?;
    let mr = pd.alloc_mr(64 * 1024, AccessFlags::LOCAL_WRITE)?;
    let srq = pd.create_srq(64, 1)?; // max_wr, max_sge
    for i in 0..16 {
        srq.post_recv(&RecvWr {
            wr_id: i,
            sg_list: vec![mr.sge(i * 4096, 4096)],
        })?;
    }
    // An SrqLimitReached async event when fewer than 4 remain.
    srq.arm_limit(4)?;
    // Any number of QPs take their receives from it.
    let qp1 = pd.create_qp(QpType::Rc, &cq, &cq).srq(&srq).build()?;
    let qp2 = pd.create_qp(QpType::Rc, &cq, &cq).srq(&srq).build()?;
    assert_ne!(qp1.qpn(), qp2.qpn());
    Ok(())
}

// doc: teardown
fn teardown(ctx: &Context) -> Result<()> {
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16)?;
    let qp = pd.create_qp(QpType::Rc, &cq, &cq).build()?;
    // The QP uses the CQ: refused, and the CQ comes back.
    let (cq, err) = cq.destroy().unwrap_err();
    assert_eq!(err.errno(), softrdma::errno::EBUSY);
    qp.destroy().map_err(|(_, e)| e)?;
    cq.destroy().map_err(|(_, e)| e)?;
    pd.dealloc().map_err(|(_, e)| e)?;
    Ok(())
}

// doc: counters
fn counters(ctx: &Context, qp: &Qp) {
    let c = ctx.counters(); // the device, like `rdma statistic`
    println!(
        "tx {} rx {} retransmits {} timeouts {} seq NAKs {}/{} duplicates {} ICRC errors {}",
        c.tx_packets,
        c.rx_packets,
        c.retransmits,
        c.timeouts,
        c.seq_naks_sent,
        c.seq_naks_rcvd,
        c.duplicates,
        c.icrc_errors
    );
    for (name, value) in qp.counters().fields() {
        if value > 0 {
            println!("  QP {:#x} {name} = {value}", qp.qpn());
        }
    }
    println!("driver: {:?}", ctx.driver_counters());
    // QP errors, CQ overruns, SRQ limits: ibv_get_async_event.
    while let Some(ev) = ctx.poll_async_event() {
        if let Event::QpFatal { qpn } = ev {
            eprintln!("QP {qpn:#x} went to the error state");
        }
    }
}

// doc: capture
fn capture_and_faults(dir: &std::path::Path) -> Result<Context> {
    let cfg = DeviceConfig::default_loopback()
        // Every packet sent and received, as a classic pcap (Ethernet).
        .capture(dir.join("srx0.pcap"))
        // Faults on receive: 1% loss, 1% reordering, 0.5% duplicates.
        .fault(FaultSpec {
            loss: 0.01,
            reorder: 0.01,
            dup: 0.005,
            corrupt: 0.0,
            seed: 7,
            ..Default::default()
        });
    // The same from the environment, for any program:
    // SOFTRDMA_CAPTURE=srx0.pcap SOFTRDMA_FAULT=loss=0.01,reorder=0.01,dup=0.005
    let spec: FaultSpec = "loss=0.01,reorder=0.01,dup=0.005,seed=7".parse()?;
    assert_eq!(Some(spec), cfg.fault);
    Context::open_with(&cfg)
}
// doc: end

// doc: rdma_cm
/// Server: waits (10 s at most) for a connection request on `port` and
/// accepts it on `qp`, which the CM moves to RTS.
fn cm_serve(ctx: &Context, port: u16, qp: &Qp) -> Result<Option<ConnId>> {
    let cm = ctx.cm();
    cm.listen(PortSpace::Tcp, port)?;
    match cm.get_event(Duration::from_secs(10))? {
        Some(CmEvent::ConnectRequest { conn, .. }) => {
            cm.accept(conn, qp, &ConnParam::default())?;
            Ok(Some(conn))
        }
        _ => Ok(None),
    }
}

/// Client: connects `qp` to the listener at `server` (its address and
/// port); true once established.
fn cm_join(ctx: &Context, server: SocketAddr, qp: &Qp) -> Result<bool> {
    let cm = ctx.cm();
    let conn = cm.connect(qp, server, &ConnParam::default())?;
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < end {
        match cm.get_event(Duration::from_millis(100))? {
            Some(CmEvent::Established { conn: c }) if c == conn => return Ok(true),
            Some(CmEvent::Rejected { .. } | CmEvent::Unreachable { .. }) => return Ok(false),
            _ => {}
        }
    }
    Ok(false)
}

// doc: receives first
/// Server side with its first receive posted before the client can send.
fn serve_ready(listener: &TcpListener, qp: &Qp, mr: &Mr) -> Result<TcpStream> {
    let opts = ConnectOptions::default();
    qp.init(&opts)?; // RESET -> INIT: the QP takes receives from here on
    qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: vec![mr.sge(0, 4096)],
    })?;
    let mine = ConnInfo {
        endpoint: qp.endpoint(),
        region: Some(mr.remote()),
    };
    let (stream, peer) = cm::accept(listener, &mine)?;
    qp.connect(&peer.endpoint, &opts)?; // carries on from INIT: RTR, then RTS
    Ok(stream)
}
// doc: end

#[test]
fn tour_receives_before_connect() {
    let a = Context::open_with(&common::udp_loopback()).unwrap();
    let b = Context::open_with(&common::udp_loopback()).unwrap();
    let (ca, ma, qa) = objects(&a).unwrap();
    let (cb, mb, qb) = objects(&b).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::scope(|s| {
        let server = s.spawn(|| serve_ready(&listener, &qb, &mb));
        // The client SENDs the moment it is connected (UC would lose the
        // message if the server's receive came later).
        join(addr, &qa, &ma).unwrap();
        qa.post_send(&SendWr::new(9, SendOp::Send, vec![ma.sge(0, 5)]))
            .unwrap();
        assert_eq!(ca.wait_ok(Duration::from_secs(10)).unwrap().wr_id, 9);
        server.join().unwrap().unwrap();
    });
    let wc = cb.wait_ok(Duration::from_secs(10)).unwrap();
    assert_eq!((wc.wr_id, wc.byte_len), (1, 5));
    assert_eq!(read(&mb, 0, 5), b"hello");
    assert_eq!(
        qb.counters().rnr_naks_sent,
        0,
        "the receive was there first"
    );
}

// doc: windows
/// Lends a peer 4 KiB of `mr` (registered with MW_BIND) through a memory
/// window it may only write: the region's own rkey never leaves.
fn lend_window(pd: &Pd, qp: &Qp, cq: &Cq, mr: &Mr) -> Result<(Mw, RemoteRegion)> {
    let mw = pd.alloc_mw(MwType::Two)?;
    let bind = MwBind {
        mr: Some(mr.lkey()),
        addr: mr.addr() + 4096,
        length: 4096,
        access: AccessFlags::REMOTE_WRITE,
    };
    // Runs in its turn in qp's send queue; the window then belongs to qp.
    let rkey = qp.bind_mw(&mw, 1, SendFlags::SIGNALED, bind)?;
    let wc = cq.wait_ok(Duration::from_secs(10))?;
    assert_eq!(wc.opcode, WcOpcode::BindMw);
    let lent = RemoteRegion {
        addr: bind.addr,
        rkey,
        len: 4096,
    };
    Ok((mw, lent))
}

/// Takes the window back: the peer's WRITEs through it now fail with
/// REM_ACCESS_ERR. (The peer can hand it back itself with a SEND with
/// invalidate, `SendOp::SendWithInv { invalidate_rkey }`.)
fn take_back(qp: &Qp, cq: &Cq, lent: &RemoteRegion) -> Result<()> {
    let inv = SendOp::LocalInv { rkey: lent.rkey };
    qp.post_send(&SendWr::new(2, inv, vec![]))?;
    let wc = cq.wait_ok(Duration::from_secs(10))?;
    assert_eq!(wc.opcode, WcOpcode::LocalInv);
    Ok(())
}
// doc: end

#[test]
fn tour_memory_windows() {
    let a = Context::open_with(&common::udp_loopback()).unwrap();
    let b = Context::open_with(&common::udp_loopback()).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let ma = pa.alloc_mr(8192, all).unwrap();
    let mb = pb.alloc_mr(8192, all | AccessFlags::MW_BIND).unwrap();
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb = pb.create_qp(QpType::Rc, &cb, &cb).build().unwrap();
    qa.connect(&qb.endpoint(), &ConnectOptions::default())
        .unwrap();
    qb.connect(&qa.endpoint(), &ConnectOptions::default())
        .unwrap();
    let (_mw, lent) = lend_window(&pb, &qb, &cb, &mb).unwrap();
    ma.write(0, b"lent").unwrap();
    let write = SendOp::Write {
        remote_addr: lent.at(100),
        rkey: lent.rkey,
    };
    qa.post_send(&SendWr::new(3, write, vec![ma.sge(0, 4)]))
        .unwrap();
    ca.wait_ok(Duration::from_secs(10)).unwrap();
    assert_eq!(read(&mb, 4096 + 100, 4), b"lent");
    take_back(&qb, &cb, &lent).unwrap();
    qa.post_send(&SendWr::new(4, write, vec![ma.sge(0, 4)]))
        .unwrap();
    let wc = ca.wait(1, Duration::from_secs(10)).unwrap()[0];
    assert_eq!(wc.status, WcStatus::RemAccessErr);
}

/// Each ```rust block of docs/api.md appears in this file.
#[test]
fn api_md_code_is_compiled_here() {
    let norm = |s: &str| -> Vec<String> {
        s.lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    };
    let here = norm(include_str!("api_tour.rs"));
    let md = include_str!("../../../docs/api.md");
    let mut blocks = 0;
    let mut rest = md;
    while let Some(i) = rest.find("```rust\n") {
        let body = &rest[i + 8..];
        let end = body.find("```").expect("unterminated code block");
        let block = norm(&body[..end]);
        assert!(
            here.windows(block.len()).any(|w| w == block.as_slice()),
            "this docs/api.md block is not in tests/api_tour.rs:\n{}",
            &body[..end]
        );
        blocks += 1;
        rest = &body[end + 3..];
    }
    assert!(blocks >= 8, "only {blocks} rust blocks in docs/api.md");
}

#[test]
fn tour_open_objects() {
    let (ctx, ctx2) = open().unwrap();
    assert_eq!(ctx2.name(), "srx1");
    assert_ne!(ctx.addr(), ctx2.addr());
    let (_cq, mr, qp) = objects(&ctx).unwrap();
    assert_eq!(read(&mr, 0, 5), b"hello");
    counters(&ctx, &qp);
    srq(&ctx).unwrap();
}

fn read(mr: &Mr, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    mr.read(off, &mut v).unwrap();
    v
}

#[test]
fn tour_cm_post_send_epoll() {
    let a = Context::open_with(&common::udp_loopback()).unwrap();
    let b = Context::open_with(&common::udp_loopback()).unwrap();
    let (ca, ma, qa) = objects(&a).unwrap();
    let (cb, mb, qb) = objects(&b).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (server, client) = std::thread::scope(|s| {
        let server = s.spawn(|| serve(&listener, &qb, &mb));
        let client = join(addr, &qa, &ma);
        if client.is_err() {
            // Unblock the server's accept so the test fails instead of hanging.
            let _ = TcpStream::connect(addr);
        }
        (server.join().unwrap(), client)
    });
    let (_s1, region_of_a) = server.unwrap();
    let (_s2, region_of_b) = client.unwrap();
    assert_eq!(region_of_a, ma.remote());
    assert_eq!(region_of_b, mb.remote());
    assert_eq!(qa.state(), QpState::Rts);

    post_and_poll(&qa, &ca, &ma, &region_of_b).unwrap();
    assert_eq!(read(&mb, 4096, 5), b"hello");
    send_recv(&qa, &qb, &ma, &mb, &cb).unwrap();
    assert_eq!(ca.wait_ok(Duration::from_secs(5)).unwrap().wr_id, 3);
    counters(&a, &qa);

    // A completion arrives while a thread sleeps in epoll.
    let (channel, ecq) = channel_cq(&b).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let qa2 = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb2 = pb.create_qp(QpType::Rc, &ecq, &ecq).build().unwrap();
    qa2.connect(&qb2.endpoint(), &ConnectOptions::default())
        .unwrap();
    qb2.connect(&qa2.endpoint(), &ConnectOptions::default())
        .unwrap();
    let mb2 = pb.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let start = std::time::Instant::now();
    let wcs = std::thread::scope(|s| {
        let waiter = s.spawn(|| wait_with_epoll(&channel, &ecq));
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !waiter.is_finished(),
            "epoll returned with nothing to report"
        );
        qb2.post_recv(&RecvWr {
            wr_id: 42,
            sg_list: vec![mb2.sge(0, 64)],
        })
        .unwrap();
        let ma2 = pa.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        qa2.post_send(&SendWr::new(5, SendOp::Send, vec![ma2.sge(0, 10)]))
            .unwrap();
        ca.wait_ok(Duration::from_secs(5)).unwrap();
        waiter.join().unwrap().unwrap()
    });
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!((wcs[0].wr_id, wcs[0].status), (42, WcStatus::Success));
}

#[test]
fn tour_teardown() {
    let ctx = Context::open_with(&common::udp_loopback()).unwrap();
    teardown(&ctx).unwrap();
    assert!(ctx.qp_numbers().is_empty(), "the QP is gone");
}

#[test]
fn tour_ud() {
    let a = Context::open_with(&common::udp_loopback()).unwrap();
    let b = Context::open_with(&common::udp_loopback()).unwrap();
    assert_eq!(ud(&a, &b).unwrap(), b"datagram");
}

#[test]
fn tour_capture_and_faults() {
    let dir = common::TempDir::new("tour");
    let ctx = capture_and_faults(&dir.0).unwrap();
    drop(ctx);
    let cap = common::check_capture(&dir.0.join("srx0.pcap"));
    assert_eq!(cap.frames, 0);
}

#[test]
fn tour_rdma_cm() {
    let a = Context::open_with(&common::udp_loopback()).unwrap();
    let b = Context::open_with(&common::udp_loopback()).unwrap();
    let (_ca, _ma, qa) = objects(&a).unwrap();
    let (_cb, _mb, qb) = objects(&b).unwrap();
    let server = SocketAddr::new(b.addr().ip(), 7473);
    let (accepted, joined) = std::thread::scope(|s| {
        let srv = s.spawn(|| cm_serve(&b, 7473, &qb));
        // The listener is up before the REQ leaves (one sooner is rejected).
        std::thread::sleep(Duration::from_millis(200));
        let joined = cm_join(&a, server, &qa);
        (srv.join().unwrap(), joined)
    });
    assert!(accepted.unwrap().is_some(), "the server took a request");
    assert!(joined.unwrap(), "the client is connected");
    assert_eq!((qa.state(), qb.state()), (QpState::Rts, QpState::Rts));
}
