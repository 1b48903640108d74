//! A hostile same-host peer, played in code over the real link protocol:
//! crafted handshakes, and grant requests for memory verbs do not let it
//! reach. The victim must refuse, never hand over a descriptor, and keep
//! working for honest peers.

use softrdma_engine::PdHandle;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::*;
use crate::linkmsg::{GrantRequest, LinkMsg};
use crate::{AccessFlags, ConnectOptions, Context, DeviceConfig, QpType};

fn shm_device() -> Context {
    let mut c = DeviceConfig::default_loopback().transport(Transport::Shm);
    c.capture = None;
    c.fault = None;
    Context::open_with(&c).unwrap()
}

fn refused(ctx: &Context) -> u64 {
    ctx.dev.lock().shm().counters.links_refused
}

/// Runs the victim's progress until `done` or 5 s.
fn drive(ctx: &Context, mut done: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        ctx.progress();
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

fn memfd(len: usize, sealed: bool) -> OwnedFd {
    if sealed {
        return crate::sys::sealed_memfd(c"hostile", len).unwrap();
    }
    // SAFETY: plain system calls; results checked.
    unsafe {
        let fd = libc::memfd_create(c"hostile".as_ptr(), 0);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, len as libc::off_t), 0);
        OwnedFd::from_raw_fd(fd)
    }
}

fn pipe_end() -> (OwnedFd, OwnedFd) {
    let mut p = [0; 2];
    // SAFETY: pipe writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
    // SAFETY: both are fresh descriptors we own.
    unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
}

/// What the victim sent back on a crafted connection: bytes and descriptors.
fn answer(s: &UnixStream) -> (usize, usize) {
    s.set_nonblocking(true).unwrap();
    let t0 = Instant::now();
    loop {
        let mut b = [0u8; MSG_LEN + 1];
        match recv_fds(s, &mut b, 4) {
            Ok((n, fds)) => return (n, fds.len()),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    && t0.elapsed() < Duration::from_secs(3) =>
            {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(_) => return (0, 0),
        }
    }
}

#[test]
fn crafted_handshakes_are_refused_and_get_nothing() {
    let victim = shm_device();
    let path = socket_path(victim.addr());
    let hello = |addr: &str| {
        LinkMsg::Hello {
            addr: addr.parse().unwrap(),
        }
        .to_bytes()
    };
    let eventfd = || {
        // SAFETY: eventfd has no pointer arguments; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        unsafe { OwnedFd::from_raw_fd(fd) }
    };
    type Case = (&'static str, Vec<u8>, Vec<OwnedFd>);
    let mut cases: Vec<Case> = Vec::new();
    let mut bad_magic = hello("127.0.0.77:4791");
    bad_magic[0] = b'X';
    cases.push((
        "bad magic",
        bad_magic.to_vec(),
        vec![memfd(SEGMENT_LEN, true), eventfd()],
    ));
    let mut old = hello("127.0.0.77:4791");
    old[4] = 1;
    cases.push((
        "old version",
        old.to_vec(),
        vec![memfd(SEGMENT_LEN, true), eventfd()],
    ));
    let req = LinkMsg::GrantRequest(GrantRequest {
        rkey: Rkey::from_raw(1),
        requester_qpn: Qpn::from_raw(2),
        target_qpn: Qpn::from_raw(3),
        access: AccessFlags::REMOTE_READ.bits(),
    });
    cases.push((
        "a request before any hello",
        req.to_bytes().to_vec(),
        vec![],
    ));
    cases.push(("no descriptors", hello("127.0.0.77:4791").to_vec(), vec![]));
    cases.push((
        "an unsealed segment",
        hello("127.0.0.77:4791").to_vec(),
        vec![memfd(SEGMENT_LEN, false), eventfd()],
    ));
    cases.push((
        "a segment too small",
        hello("127.0.0.77:4791").to_vec(),
        vec![memfd(4096, true), eventfd()],
    ));
    let (r, w) = pipe_end();
    cases.push((
        "a pipe for an eventfd",
        hello("127.0.0.77:4791").to_vec(),
        vec![memfd(SEGMENT_LEN, true), w],
    ));
    cases.push((
        "three descriptors",
        hello("127.0.0.77:4791").to_vec(),
        vec![memfd(SEGMENT_LEN, true), eventfd(), r],
    ));
    cases.push((
        "a short message",
        hello("127.0.0.77:4791")[..20].to_vec(),
        vec![],
    ));
    cases.push(("a closed connection mid-handshake", vec![], vec![]));
    for (what, bytes, fds) in cases {
        let before = refused(&victim);
        let s = UnixStream::connect(&path).unwrap();
        if bytes.is_empty() {
            drop(s);
            assert!(
                drive(&victim, || refused(&victim) > before),
                "{what}: not refused"
            );
            continue;
        }
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let _ = send_fds(&s, &bytes, &raw);
        assert!(
            drive(&victim, || refused(&victim) > before),
            "{what}: not refused"
        );
        assert_eq!(answer(&s), (0, 0), "{what}: the victim answered");
    }
    // A peer that connects and stays silent is dropped after HELLO_WAIT,
    // and the victim answers others meanwhile.
    let before = refused(&victim);
    let silent = UnixStream::connect(&path).unwrap();
    let honest = shm_device();
    assert!(link_two(&honest, &victim), "an honest peer still links");
    assert!(
        drive(&victim, || refused(&victim) > before) || {
            std::thread::sleep(HELLO_WAIT);
            drive(&victim, || refused(&victim) > before)
        },
        "the silent connection is dropped"
    );
    let mut b = [0u8; 8];
    silent
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    assert!(
        matches!((&silent).read(&mut b), Ok(0) | Err(_)),
        "nothing sent to the silent peer"
    );
    assert_eq!(
        victim.dev.lock().shm().counters.links,
        1,
        "only the honest link"
    );
}

/// Connects an RC pair between two devices and makes a link (a WRITE
/// through the engine); true when both ends have a link.
fn link_two(a: &Context, b: &Context) -> bool {
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb = pb.create_qp(QpType::Rc, &cb, &cb).build().unwrap();
    qa.connect(&qb.endpoint(), &ConnectOptions::default())
        .unwrap();
    qb.connect(&qa.endpoint(), &ConnectOptions::default())
        .unwrap();
    let ma = pa.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mb = pb
        .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let op = crate::SendOp::Write {
        remote_addr: mb.addr(),
        rkey: mb.rkey(),
    };
    qa.post_send(&crate::SendWr::new(1, op, vec![ma.sge(0, 64)]))
        .unwrap();
    ca.wait_ok(Duration::from_secs(10)).is_ok()
        && a.dev.lock().shm().has_links()
        && b.dev.lock().shm().has_links()
}

/// A peer with a connected QP asks for regions it may not reach: one with
/// no remote right (its rkey known, as if guessed), one whose rkey it was
/// never given (guessed wrong), one with a right its QP was not given,
/// one through a QP that is not its own. Every request is refused and no
/// memfd ever reaches it; the one legitimate request is granted.
#[test]
fn grant_requests_for_memory_verbs_forbid_are_refused() {
    let victim = shm_device();
    let attacker = shm_device();
    let (pv, pa) = (victim.alloc_pd().unwrap(), attacker.alloc_pd().unwrap());
    let (cv, ca) = (
        victim.create_cq(16).unwrap(),
        attacker.create_cq(16).unwrap(),
    );
    let qv = pv.create_qp(QpType::Rc, &cv, &cv).build().unwrap();
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let no_atomics = ConnectOptions {
        access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        ..Default::default()
    };
    qa.connect(&qv.endpoint(), &ConnectOptions::default())
        .unwrap();
    qv.connect(&qa.endpoint(), &no_atomics).unwrap();
    let secret = [0x5Eu8; 4096];
    let local_only = pv.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    local_only.write(0, &secret).unwrap();
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_ATOMIC;
    let remote = pv.alloc_mr(4096, all).unwrap();
    remote.write(0, &secret).unwrap();
    let readable = pv
        .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .unwrap();
    readable.write(0, &secret).unwrap();
    // Make the link: a READ of `remote` through the engine.
    let scratch = pa.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let read = crate::SendOp::Read {
        remote_addr: remote.addr(),
        rkey: remote.rkey(),
    };
    qa.post_send(&crate::SendWr::new(1, read, vec![scratch.sge(0, 8)]))
        .unwrap();
    ca.wait_ok(Duration::from_secs(10)).unwrap();
    let link = attacker
        .dev
        .lock()
        .shm_mut()
        .peer_link(victim.addr())
        .expect("linked");
    let ask = |rkey: Rkey, target_qpn: Qpn, access: AccessFlags| {
        let req = GrantRequest {
            rkey,
            requester_qpn: qa.qpn(),
            target_qpn,
            access: access.bits(),
        };
        let mut st = attacker.dev.lock();
        st.shm_mut().links[link].inn.forget_all();
        st.shm_mut().ask_grant(link, req);
    };
    let held = || attacker.dev.lock().shm().grants_held();
    let standing = || victim.dev.lock().shm().standing_grants().len();
    // Forget the grant the READ above may have asked for.
    std::thread::sleep(Duration::from_millis(50));
    attacker.dev.lock().shm_mut().links[link].inn.forget_all();
    let w = AccessFlags::REMOTE_WRITE;
    let r = AccessFlags::REMOTE_READ;
    for (what, rkey, qpn, access) in [
        ("no remote right", local_only.rkey(), qv.qpn(), r),
        (
            "a guessed rkey",
            Rkey::from_raw(remote.rkey().raw() ^ 0x8000_0001),
            qv.qpn(),
            r,
        ),
        (
            "a right the QP lacks",
            remote.rkey(),
            qv.qpn(),
            AccessFlags::REMOTE_ATOMIC,
        ),
        ("a right the region lacks", readable.rkey(), qv.qpn(), w),
        (
            "another QP",
            remote.rkey(),
            Qpn::from_raw(qv.qpn().raw() ^ 1),
            r,
        ),
        ("two rights at once", remote.rkey(), qv.qpn(), r | w),
    ] {
        let before = standing();
        ask(rkey, qpn, access);
        for _ in 0..50 {
            victim.progress();
            attacker.progress();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(held(), 0, "{what}: the attacker holds a grant");
        assert_eq!(standing(), before, "{what}: the victim granted");
    }
    // The control: what verbs allow is granted.
    ask(remote.rkey(), qv.qpn(), r);
    assert!(
        drive(&victim, || {
            attacker.progress();
            held() == 1
        }),
        "the legitimate request was not granted"
    );
}

/// A hostile target: it listens where a device would, answers the
/// handshake, and then sends crafted grants — a region past the end of its
/// memfd, an unsealed memfd, a slot beyond the table — and a valid grant
/// for a region smaller than a WRITE. The honest
/// initiator refuses each (counted), never writes outside what it was
/// given, and its WRITEs end as hardware's would with a peer that never
/// answers: RETRY_EXC_ERR.
#[test]
fn crafted_grants_from_a_hostile_target_are_refused() {
    let honest = shm_device();
    // A free address for the pretend device, held for the whole test (its
    // UDP port bound, as a device's is): a device opened meanwhile by a
    // test on another thread takes another address, instead of replacing
    // the pretend socket with its own. Taken from the top, away from the
    // addresses `default_loopback` hands out from 127.0.0.1 up.
    let (target, _held): (SocketAddr, _) = (2..200u8)
        .rev()
        .map(|n| SocketAddr::from(([127, 0, 0, n], 4791)))
        .filter(|a| !socket_path(*a).exists())
        .find_map(|a| std::net::UdpSocket::bind(a).ok().map(|s| (a, s)))
        .unwrap();
    crate::rundir::prepare().unwrap();
    let path = socket_path(target);
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let pd = honest.alloc_pd().unwrap();
    let cq = honest.create_cq(64).unwrap();
    let qp = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    let fast = ConnectOptions {
        timeout: 8,
        retry_cnt: 1,
        ..Default::default()
    };
    let ep = crate::QpEndpoint {
        gid: crate::Gid::from_ip(target.ip()),
        qpn: Qpn::from_raw(0x4242),
        psn: 0,
        mtu: crate::Mtu::Mtu4096,
        qkey: 0,
    };
    qp.connect(&ep, &fast).unwrap();
    let mr = pd.alloc_mr(8192, AccessFlags::LOCAL_WRITE).unwrap();
    mr.write(0, &[0xC3; 8192]).unwrap();
    let (va, rkey) = (0x7000_0000u64, 0x1234u32);
    let write = |id: u64, len: u32| {
        let op = crate::SendOp::Write {
            remote_addr: va,
            rkey: Rkey::from_raw(rkey),
        };
        qp.post_send(&crate::SendWr::new(id, op, vec![mr.sge(0, len)]))
            .unwrap();
    };
    write(1, 64);
    // The handshake: read the hello, answer with a welcome. The victim
    // dials when its progress looks for new links: bounded, so that a
    // victim that never dials fails the test instead of hanging it.
    listener.set_nonblocking(true).unwrap();
    let t0 = Instant::now();
    let s = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(_) if t0.elapsed() < Duration::from_secs(10) => {
                honest.progress();
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("the victim never dialled the pretend target: {e}"),
        }
    };
    s.set_nonblocking(true).unwrap();
    let t0 = Instant::now();
    let (hello, fds) = loop {
        let mut b = [0u8; MSG_LEN + 1];
        match recv_fds(&s, &mut b, 4) {
            Ok((n, fds)) => break (LinkMsg::parse(&b[..n]).unwrap(), fds),
            Err(_) if t0.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("no hello: {e}"),
        }
    };
    assert!(matches!(hello, LinkMsg::Hello { .. }) && fds.len() == 2);
    let wake = crate::sys::EventFd::new(true).unwrap();
    send_fds(
        &s,
        &LinkMsg::Welcome { addr: target }.to_bytes(),
        &[wake.as_raw_fd()],
    )
    .unwrap();
    // Each crafted grant, answered to the next request.
    let seg = |len: usize, sealed: bool| memfd(len, sealed);
    let good = |len: u64, offset: u64, slot: u32| crate::linkmsg::Grant {
        rkey: Rkey::from_raw(rkey),
        target_qpn: Qpn::from_raw(0x4242),
        slot,
        gen: 1,
        pd: PdHandle::from_raw(1),
        access: 0xf,
        qp_access: 0xe,
        iova: va,
        len,
        offset,
    };
    let cases: Vec<(&str, Vec<u8>, OwnedFd)> = vec![
        (
            "past the end of its memfd",
            LinkMsg::Grant(good(8192, 4096, 0)).to_bytes().to_vec(),
            seg(8192, true),
        ),
        (
            "an unsealed memfd",
            LinkMsg::Grant(good(4096, 0, 0)).to_bytes().to_vec(),
            seg(4096, false),
        ),
        (
            "a slot beyond the table",
            {
                let mut b = LinkMsg::Grant(good(4096, 0, 0)).to_bytes();
                b[16..20].copy_from_slice(&300u32.to_le_bytes());
                b.to_vec()
            },
            seg(4096, true),
        ),
    ];
    // A grant needs no request to be refused: each is sent as it is.
    for (what, bytes, fd) in cases {
        let before = honest.dev.lock().shm().counters.links_refused;
        send_fds(&s, &bytes, &[fd.as_raw_fd()]).unwrap();
        assert!(
            drive(&honest, || honest.dev.lock().shm().counters.links_refused
                > before),
            "{what}: not refused"
        );
        assert_eq!(
            honest.dev.lock().shm().grants_held(),
            0,
            "{what}: installed"
        );
    }
    // A valid grant, unasked, for a second QP (its send queue empty, so
    // its WRITEs may go direct): a region of 4096 bytes. A WRITE of 64
    // lands in it; one of 8192 does not fit and goes to the engine, which
    // gets no answer.
    let qp2 = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    qp2.connect(
        &crate::QpEndpoint {
            qpn: Qpn::from_raw(0x4243),
            ..ep
        },
        &fast,
    )
    .unwrap();
    let region = seg(4096, true);
    // The granter's table is in the link segment the honest device made
    // (the hello's memfd): the test, as the acceptor, writes the second one.
    let link_seg = crate::sys::map_shared(fds[0].as_raw_fd(), SEGMENT_LEN).unwrap();
    // SAFETY: the mapping holds the whole segment, rings then both tables.
    let (t_mine, _) = unsafe { crate::grant::tables(link_seg, 2 * RING_LEN, false) };
    let mut out = crate::grant::OutGrants::new(t_mine);
    let req = GrantRequest {
        rkey: Rkey::from_raw(rkey),
        requester_qpn: qp2.qpn(),
        target_qpn: Qpn::from_raw(0x4243),
        access: AccessFlags::REMOTE_WRITE.bits(),
    };
    let g = out.give(&req, (0xf, 0xe)).unwrap();
    let grant = crate::linkmsg::Grant {
        target_qpn: Qpn::from_raw(0x4243),
        slot: g.slot,
        gen: g.gen,
        ..good(4096, 0, 0)
    };
    send_fds(&s, &LinkMsg::Grant(grant).to_bytes(), &[region.as_raw_fd()]).unwrap();
    assert!(
        drive(&honest, || honest.dev.lock().shm().grants_held() == 1),
        "the valid grant is installed"
    );
    let direct0 = honest.driver_counters().direct_ops;
    let post2 = |id: u64, len: u32| {
        let op = crate::SendOp::Write {
            remote_addr: va,
            rkey: Rkey::from_raw(rkey),
        };
        qp2.post_send(&crate::SendWr::new(id, op, vec![mr.sge(0, len)]))
            .unwrap();
    };
    post2(20, 64);
    post2(21, 8192);
    let t0 = Instant::now();
    let mut got = std::collections::HashMap::new();
    while !(got.contains_key(&20) && got.contains_key(&21)) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "completions: {got:?}"
        );
        match cq.poll_one().unwrap() {
            Some(wc) => {
                got.insert(wc.wr_id, wc.status);
            }
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    assert_eq!(
        got[&20],
        crate::WcStatus::Success,
        "the WRITE that fits went direct"
    );
    assert_eq!(
        got[&21],
        crate::WcStatus::RetryExcErr,
        "the one that does not fit did not"
    );
    assert_eq!(honest.driver_counters().direct_ops - direct0, 1);
    let m = crate::sys::map_shared(region.as_raw_fd(), 4096).unwrap();
    // SAFETY: the test's own mapping of the 4096-byte region.
    let bytes = unsafe { std::slice::from_raw_parts(m, 4096) };
    assert_eq!(bytes[..64], [0xC3; 64]);
    assert!(
        bytes[64..].iter().all(|&b| b == 0),
        "nothing past the WRITE"
    );
    drop(s);
    let _ = std::fs::remove_file(&path);
}
