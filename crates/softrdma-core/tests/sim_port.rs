//! Two device cores over simulated ports: RC traffic over the port's
//! queues (plain and under fault injection), and the same-host direct path
//! with its grants following the engine's resource changes.

use std::net::SocketAddr;
use std::sync::Arc;

use softrdma_core::sim_port::{HostMemory, SimHost, SimPort};
use softrdma_core::{DeviceCore, FaultSpec, Faulty, Port};
use softrdma_engine::*;
use softrdma_wire::Psn;

const LEN: usize = 1 << 16;

fn addr(i: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i], 4791))
}

fn engine(i: u8) -> Engine {
    let mut c = EngineConfig::new(addr(i));
    c.seed = u64::from(i);
    Engine::new(c)
}

fn access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

struct Side {
    cq: CqHandle,
    qpn: Qpn,
    keys: MrKeys,
    mem: Arc<HostMemory>,
    iova: u64,
}

fn side<P: Port>(c: &mut DeviceCore<P>, i: u8) -> Side {
    let e = &mut c.engine;
    let pd = e.alloc_pd();
    let cq = e.create_cq(256).unwrap();
    let mem = HostMemory::new(LEN);
    let iova = 0x1000_0000 * u64::from(i);
    let keys = e.reg_mr(pd, iova, access(), mem.clone()).unwrap();
    let cap = QpCap {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    };
    let qpn = e
        .create_qp(QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap,
            sq_sig_all: false,
        })
        .unwrap();
    Side {
        cq,
        qpn,
        keys,
        mem,
        iova,
    }
}

fn connect<P: Port>(c: &mut DeviceCore<P>, me: &Side, peer: &Side, peer_ip: u8) {
    let now = Instant(0);
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: access(),
        ..Default::default()
    };
    let m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
    c.engine.modify_qp(now, me.qpn, &a, m).unwrap();
    a.qp_state = QpState::Rtr;
    a.ah_attr = AhAttr {
        dgid: Gid::from_ip(addr(peer_ip).ip()),
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..Default::default()
    };
    a.path_mtu = Mtu::Mtu1024;
    a.dest_qp_num = peer.qpn;
    a.rq_psn = Psn::new(7);
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 1;
    let m = AttrMask::STATE
        | AttrMask::AV
        | AttrMask::PATH_MTU
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER;
    c.engine.modify_qp(now, me.qpn, &a, m).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = Psn::new(7);
    a.timeout = 10;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    let m = AttrMask::STATE
        | AttrMask::SQ_PSN
        | AttrMask::TIMEOUT
        | AttrMask::RETRY_CNT
        | AttrMask::RNR_RETRY
        | AttrMask::MAX_QP_RD_ATOMIC;
    c.engine.modify_qp(now, me.qpn, &a, m).unwrap();
}

/// Something that can hand a simulated port's sent packets over.
trait Wire: Port {
    fn sim(&mut self) -> &mut SimPort;
}
impl Wire for SimPort {
    fn sim(&mut self) -> &mut SimPort {
        self
    }
}
impl Wire for Faulty<SimPort> {
    fn sim(&mut self) -> &mut SimPort {
        self.inner_mut()
    }
}

/// Runs both cores, moving packets between their ports, for `steps`
/// rounds of 1 µs of virtual time (timers fire on the way).
fn run<P: Wire>(a: &mut DeviceCore<P>, b: &mut DeviceCore<P>, now: &mut Instant, steps: u32) {
    for _ in 0..steps {
        now.0 += 1_000;
        a.progress(*now, true);
        b.progress(*now, true);
        while let Some(p) = a.port.sim().take_sent() {
            b.port
                .sim()
                .deliver(p.endpoints.src, RxMeta::default(), p.data);
        }
        while let Some(p) = b.port.sim().take_sent() {
            a.port
                .sim()
                .deliver(p.endpoints.src, RxMeta::default(), p.data);
        }
    }
}

fn write_wr(id: u64, from: &Side, off: u64, len: u32, to: &Side) -> SendWr {
    let mut wr = SendWr::new(
        id,
        SendOp::Write {
            remote_addr: to.iova + off,
            rkey: to.keys.rkey,
        },
        vec![Sge {
            addr: from.iova + off,
            length: len,
            lkey: from.keys.lkey,
        }],
    );
    wr.flags = SendFlags::SIGNALED;
    wr
}

fn pair<P: Wire>(pa: P, pb: P) -> (DeviceCore<P>, DeviceCore<P>, Side, Side) {
    let (mut a, mut b) = (
        DeviceCore::new(engine(1), pa),
        DeviceCore::new(engine(2), pb),
    );
    let (sa, sb) = (side(&mut a, 1), side(&mut b, 2));
    connect(&mut a, &sa, &sb, 2);
    connect(&mut b, &sb, &sa, 1);
    (a, b, sa, sb)
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

fn completions<P: Port>(c: &mut DeviceCore<P>, s: &Side) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    c.engine.poll_cq(s.cq, 64, &mut out).unwrap();
    out
}

#[test]
fn rc_writes_cross_simulated_ports_intact() {
    let (mut a, mut b, sa, sb) = pair(SimPort::new(), SimPort::new());
    let data = pattern(LEN);
    sa.mem.write(0, &data);
    let mut now = Instant(0);
    for i in 0..4u64 {
        let wr = write_wr(i, &sa, i * (LEN as u64 / 4), LEN as u32 / 4, &sb);
        assert!(
            !a.try_direct(sa.qpn, &wr),
            "no same-host peers: no direct path"
        );
        a.command(now, |e, now| e.post_send(now, sa.qpn, &wr))
            .0
            .unwrap();
    }
    run(&mut a, &mut b, &mut now, 200);
    let wcs = completions(&mut a, &sa);
    assert_eq!(wcs.len(), 4);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert_eq!(sb.mem.snapshot(), data);
    assert_eq!(a.counters().direct_ops, 0);
}

#[test]
fn faults_on_a_simulated_port_are_recovered_from() {
    let spec = |seed| FaultSpec {
        loss: 0.05,
        reorder: 0.05,
        dup: 0.05,
        corrupt: 0.02,
        seed,
        ..Default::default()
    };
    let (mut a, mut b, sa, sb) = pair(
        Faulty::new(SimPort::new(), spec(3)),
        Faulty::new(SimPort::new(), spec(4)),
    );
    let data = pattern(LEN);
    sa.mem.write(0, &data);
    let mut now = Instant(0);
    let wr = write_wr(9, &sa, 0, LEN as u32, &sb);
    a.command(now, |e, now| e.post_send(now, sa.qpn, &wr))
        .0
        .unwrap();
    let mut wcs = Vec::new();
    for _ in 0..400 {
        run(&mut a, &mut b, &mut now, 100);
        wcs.extend(completions(&mut a, &sa));
        if !wcs.is_empty() {
            break;
        }
    }
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(9, WcStatus::Success)]
    );
    assert_eq!(sb.mem.snapshot(), data, "data intact");
    let (ca, cb) = (a.counters().port, b.counters().port);
    assert!(ca.faults_injected + cb.faults_injected > 0);
    assert!(a.engine.counters().retransmits > 0);
    assert!(b.engine.counters().icrc_errors > 0, "corruption caught");
}

#[test]
fn same_host_direct_path_follows_grants_and_changes() {
    let host = SimHost::new();
    let (mut a, mut b, sa, sb) = pair(
        SimPort::on_host(&host, addr(1)),
        SimPort::on_host(&host, addr(2)),
    );
    b.port
        .peers_mut()
        .unwrap()
        .share(sb.keys.rkey, sb.mem.clone());
    let data = pattern(LEN);
    sa.mem.write(0, &data);
    let mut now = Instant(0);
    // The first operation asks for the grant and goes through the engine.
    let wr = write_wr(1, &sa, 0, 4096, &sb);
    assert!(!a.try_direct(sa.qpn, &wr));
    a.command(now, |e, now| e.post_send(now, sa.qpn, &wr))
        .0
        .unwrap();
    run(&mut a, &mut b, &mut now, 50);
    assert_eq!(completions(&mut a, &sa).len(), 1);
    // The target answered in its progress: now it goes direct.
    let wr = write_wr(2, &sa, 4096, 8192, &sb);
    assert!(a.try_direct(sa.qpn, &wr), "granted: direct");
    let wcs = completions(&mut a, &sa);
    assert_eq!((wcs.len(), wcs[0].status), (1, WcStatus::Success));
    assert_eq!(sb.mem.snapshot()[..12288], data[..12288]);
    assert_eq!(a.counters().direct_ops, 1);
    // The target QP leaves RTS: the change queue takes the grant back,
    // with no call from whoever modified it.
    let err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    b.engine
        .modify_qp(now, sb.qpn, &err, AttrMask::STATE)
        .unwrap();
    b.progress(now, true);
    assert_eq!(a.port.peers_mut().unwrap().grants_held(), 0);
    let wr = write_wr(3, &sa, 0, 64, &sb);
    assert!(!a.try_direct(sa.qpn, &wr), "revoked: no direct path");
    assert_eq!(a.counters().direct_ops, 1);
}

/// `DeviceCore::post`: while its QP has two packets or more in flight, a post's packets
/// wait in the engine for the next progress (or the 32nd post), and then
/// leave in one batch; every WRITE still arrives intact and completes.
#[test]
fn posts_behind_packets_in_flight_leave_in_one_batch() {
    let (mut a, mut b, sa, sb) = pair(SimPort::new(), SimPort::new());
    let data = pattern(LEN);
    sa.mem.write(0, &data);
    let now = Instant(1_000);
    let post = |a: &mut DeviceCore<SimPort>, i: u64| {
        let wr = write_wr(i, &sa, i * 64, 64, &sb);
        a.post(now, sa.qpn, |e, now| e.post_send(now, sa.qpn, &wr))
            .0
            .unwrap();
    };
    let sent = |a: &mut DeviceCore<SimPort>| {
        let mut v = Vec::new();
        while let Some(p) = a.port.take_sent() {
            v.push(p);
        }
        v
    };
    post(&mut a, 0);
    post(&mut a, 1);
    let mut all = sent(&mut a);
    assert_eq!(
        all.len(),
        2,
        "nothing or one packet in flight: sent at once"
    );
    for i in 2..11 {
        post(&mut a, i);
    }
    assert!(
        sent(&mut a).is_empty(),
        "behind two packets in flight: deferred"
    );
    let due = a
        .next_deadline()
        .expect("a deadline for the deferred posts");
    assert!(due.0 <= now.0 + softrdma_core::DEFER_WAIT.as_nanos() as u64);
    assert!(a.run_due_timers(due));
    let batch = sent(&mut a);
    assert_eq!(batch.len(), 9, "the deferred posts, in one batch");
    all.extend(batch);
    for i in 11..11 + u64::from(softrdma_core::DEFER_POSTS) {
        post(&mut a, i);
    }
    let burst = sent(&mut a);
    assert_eq!(
        burst.len() as u32,
        softrdma_core::DEFER_POSTS,
        "the 32nd post sends them"
    );
    all.extend(burst);
    let n = 11 + u64::from(softrdma_core::DEFER_POSTS);
    let mut t = due;
    for p in all {
        b.port.deliver(p.endpoints.src, RxMeta::default(), p.data);
    }
    run(&mut a, &mut b, &mut t, 300);
    let wcs = completions(&mut a, &sa);
    assert_eq!(wcs.len() as u64, n);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let got = sb.mem.snapshot();
    assert_eq!(got[..n as usize * 64], data[..n as usize * 64]);
}
