//! The pitfalls of docs/tutorial.md, provoked one at a time, each printing
//! the exact status, state or error softrdma reports:
//!
//! ```text
//! cargo run -q --release -p softrdma --example tutorial_pitfalls -- states
//! cargo run -q --release -p softrdma --example tutorial_pitfalls -- wire
//! cargo run -q --release -p softrdma --example tutorial_pitfalls -- psn
//! cargo run -q --release -p softrdma --example tutorial_pitfalls -- rnr
//! cargo run -q --release -p softrdma --example tutorial_pitfalls -- rkey
//! cargo run -q --release -p softrdma --example tutorial_pitfalls -- odp
//! ```
//!
//! Both ends live in this process on two loopback devices, over RoCEv2/UDP
//! (so `SOFTRDMA_CAPTURE=file.pcap` records every packet).

use std::time::Duration;

use softrdma::shm::Transport;
use softrdma::{
    AccessFlags, AttrMask, ConnectOptions, Context, Cq, DeviceConfig, Mr, Pd, Psn, Qp, QpAttr,
    QpState, QpType, RecvWr, SendOp, SendWr, WcStatus,
};

const T: Duration = Duration::from_secs(10);

/// One end: device, PD, CQ, a 64 KiB region, an RC QP.
pub struct End {
    pub ctx: Context,
    pub pd: Pd,
    pub cq: Cq,
    pub mr: Mr,
    pub qp: Qp,
}

/// The first end (`a`) records to SOFTRDMA_CAPTURE when it is set (both
/// directions pass through it); the second does not, so that the two do
/// not write the same file.
fn end() -> softrdma::Result<End> {
    end_with(true)
}

fn end_with(capture: bool) -> softrdma::Result<End> {
    let mut cfg = DeviceConfig::default_loopback();
    cfg.transport = Transport::Udp;
    if !capture {
        cfg.capture = None;
    }
    let ctx = Context::open_with(&cfg)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16)?;
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = pd.alloc_mr(65536, access)?;
    let qp = pd.create_qp(QpType::Rc, &cq, &cq).build()?;
    Ok(End {
        ctx,
        pd,
        cq,
        mr,
        qp,
    })
}

fn write_to(a: &End, b: &End, rkey: softrdma::Rkey) -> softrdma::Result<()> {
    a.qp.post_send(&SendWr::new(
        1,
        SendOp::Write {
            remote_addr: b.mr.addr(),
            rkey,
        },
        vec![a.mr.sge(0, 4096)],
    ))
}

/// The status of the next completion on `cq`.
fn status(cq: &Cq) -> softrdma::Result<WcStatus> {
    Ok(cq.wait(1, T)?[0].status)
}

fn show(what: &str, s: WcStatus) {
    println!("{what}: {s:?} ({s})");
}

/// One of each operation, each waited for, so that a capture shows them
/// in order: an 8 KiB WRITE (two packets at MTU 4096), an 8 KiB READ, a
/// FETCH_AND_ADD and a SEND into a posted receive.
pub fn wire() -> softrdma::Result<()> {
    let (a, b) = (end()?, end_with(false)?);
    a.qp.connect(&b.qp.endpoint(), &ConnectOptions::default())?;
    b.qp.connect(&a.qp.endpoint(), &ConnectOptions::default())?;
    let (addr, rkey) = (b.mr.addr(), b.mr.rkey());
    let ops = [
        (
            "RDMA WRITE",
            SendOp::Write {
                remote_addr: addr,
                rkey,
            },
            8192,
        ),
        (
            "RDMA READ",
            SendOp::Read {
                remote_addr: addr,
                rkey,
            },
            8192,
        ),
        (
            "FETCH_AND_ADD",
            SendOp::FetchAdd {
                remote_addr: addr + 16384,
                rkey,
                add: 1,
            },
            8,
        ),
        ("SEND", SendOp::Send, 64),
    ];
    b.qp.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: vec![b.mr.sge(32768, 64)],
    })?;
    for (i, (what, op, len)) in ops.into_iter().enumerate() {
        a.qp.post_send(&SendWr::new(i as u64, op, vec![a.mr.sge(0, len)]))?;
        show(&format!("{what} {len} bytes"), status(&a.cq)?);
    }
    show("the SEND's receive on B", status(&b.cq)?);
    Ok(())
}

/// A skipped transition is refused and changes nothing; then the right order.
pub fn states() -> softrdma::Result<()> {
    let (a, b) = (end()?, end_with(false)?);
    println!("QP {:#x}: {:?}", a.qp.qpn().raw(), a.qp.state());
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..Default::default()
    };
    match a.qp.modify(&rtr, AttrMask::STATE) {
        Err(e) => println!("RESET -> RTR: refused, errno {}: {e}", e.errno()),
        Ok(()) => println!("RESET -> RTR: accepted (wrong)"),
    }
    println!("QP {:#x}: {:?}", a.qp.qpn().raw(), a.qp.state());
    // The same steps Qp::connect takes, one at a time.
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE,
        ..Default::default()
    };
    a.qp.modify(&init, AttrMask::STATE)
        .map(|()| println!("RESET -> INIT with only STATE: accepted (wrong)"))
        .unwrap_or_else(|e| {
            println!(
                "RESET -> INIT with only STATE: refused, errno {}: {e}",
                e.errno()
            )
        });
    a.qp.connect(&b.qp.endpoint(), &ConnectOptions::default())?;
    b.qp.connect(&a.qp.endpoint(), &ConnectOptions::default())?;
    println!("after connect(): {:?}", a.qp.state());
    write_to(&a, &b, b.mr.rkey())?;
    show("WRITE 4096 bytes", status(&a.cq)?);
    Ok(())
}

/// The responder expects another PSN than the requester starts at: the
/// requester's packets are out of sequence, it retries until retry_cnt is
/// spent and fails with RETRY_EXC_ERR.
pub fn psn() -> softrdma::Result<()> {
    let (a, b) = (end()?, end_with(false)?);
    let fast = ConnectOptions {
        timeout: 8, // 4.096 us * 2^8 = 1 ms
        retry_cnt: 2,
        ..Default::default()
    };
    a.qp.connect(&b.qp.endpoint(), &fast)?;
    let mut wrong = a.qp.endpoint();
    wrong.psn = Psn::new(wrong.psn).add(1000).value();
    b.qp.connect(&wrong, &fast)?;
    println!(
        "A sends from PSN {:#08x}; B expects {:#08x}",
        a.qp.endpoint().psn,
        wrong.psn
    );
    write_to(&a, &b, b.mr.rkey())?;
    show("WRITE", status(&a.cq)?);
    let (ca, cb) = (a.qp.counters(), b.qp.counters());
    println!(
        "A: retransmits {} timeouts {}; B: seq_naks_sent {} duplicates {}",
        ca.retransmits, ca.timeouts, cb.seq_naks_sent, cb.duplicates
    );
    println!("A's QP: {:?}", a.qp.state());
    Ok(())
}

/// A SEND with no receive posted: RNR NAKs; with rnr_retry 0 the send
/// fails at once, with rnr_retry 7 (retry forever) it waits for the receive.
pub fn rnr() -> softrdma::Result<()> {
    for rnr_retry in [0u8, 7] {
        let (a, b) = (end()?, end_with(false)?);
        let o = ConnectOptions {
            rnr_retry,
            min_rnr_timer: 1, // 0.01 ms
            ..Default::default()
        };
        a.qp.connect(&b.qp.endpoint(), &o)?;
        b.qp.connect(&a.qp.endpoint(), &o)?;
        a.qp.post_send(&SendWr::new(7, SendOp::Send, vec![a.mr.sge(0, 64)]))?;
        if rnr_retry == 7 {
            // The receive comes late: the sender keeps retrying until then.
            std::thread::sleep(Duration::from_millis(50));
            b.qp.post_recv(&RecvWr {
                wr_id: 8,
                sg_list: vec![b.mr.sge(0, 64)],
            })?;
        }
        show(&format!("SEND with rnr_retry {rnr_retry}"), status(&a.cq)?);
        let (ca, cb) = (a.qp.counters(), b.qp.counters());
        println!(
            "  A: rnr_naks_rcvd {}; B: rnr_naks_sent {}",
            ca.rnr_naks_rcvd, cb.rnr_naks_sent
        );
    }
    Ok(())
}

/// A wrong rkey: REM_ACCESS_ERR, both QPs in ERR; what follows is flushed;
/// ERR -> RTS is refused; ERR -> RESET -> INIT -> RTR -> RTS recovers.
pub fn rkey() -> softrdma::Result<()> {
    let (a, b) = (end()?, end_with(false)?);
    a.qp.connect(&b.qp.endpoint(), &ConnectOptions::default())?;
    b.qp.connect(&a.qp.endpoint(), &ConnectOptions::default())?;
    let bad = softrdma::Rkey::from_raw(b.mr.rkey().raw() ^ 0x10);
    write_to(&a, &b, bad)?;
    show("WRITE with a wrong rkey", status(&a.cq)?);
    println!("A's QP: {:?}; B's QP: {:?}", a.qp.state(), b.qp.state());
    write_to(&a, &b, b.mr.rkey())?;
    show("next WRITE", status(&a.cq)?);
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..Default::default()
    };
    match a.qp.modify(&rts, AttrMask::STATE) {
        Err(e) => println!("ERR -> RTS: refused, errno {}: {e}", e.errno()),
        Ok(()) => println!("ERR -> RTS: accepted (wrong)"),
    }
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..Default::default()
    };
    for q in [&a.qp, &b.qp] {
        q.modify(&reset, AttrMask::STATE)?;
    }
    println!("ERR -> RESET: {:?}", a.qp.state());
    a.qp.connect(&b.qp.endpoint(), &ConnectOptions::default())?;
    b.qp.connect(&a.qp.endpoint(), &ConnectOptions::default())?;
    println!("RESET -> INIT -> RTR -> RTS: {:?}", a.qp.state());
    write_to(&a, &b, b.mr.rkey())?;
    show("WRITE with the right rkey", status(&a.cq)?);
    Ok(())
}

/// On-demand paging: an implicit ODP region covers the whole address
/// space; a WRITE to a mapped page works, to an unmapped one fails with
/// REM_ACCESS_ERR (never a crash).
pub fn odp() -> softrdma::Result<()> {
    let (a, b) = (end()?, end_with(false)?);
    a.qp.connect(&b.qp.endpoint(), &ConnectOptions::default())?;
    b.qp.connect(&a.qp.endpoint(), &ConnectOptions::default())?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    // SAFETY: the peer (this program) may write any writable memory of it.
    let imp = unsafe { b.pd.register_implicit_odp(access)? };
    println!(
        "implicit ODP region: addr {:#x} len {:#x}",
        imp.addr(),
        imp.len()
    );
    let target = vec![0u8; 8192];
    let write = |addr: u64| -> softrdma::Result<WcStatus> {
        a.qp.post_send(&SendWr::new(
            1,
            SendOp::Write {
                remote_addr: addr,
                rkey: imp.rkey(),
            },
            vec![a.mr.sge(0, 64)],
        ))?;
        status(&a.cq)
    };
    show("WRITE to a Vec of the peer", write(target.as_ptr() as u64)?);
    // Page 0 is never mapped in a Linux process.
    show("WRITE to address 0x10", write(0x10)?);
    Ok(())
}

fn main() {
    let which = std::env::args().nth(1).unwrap_or_default();
    let r = match which.as_str() {
        "states" => states(),
        "psn" => psn(),
        "rnr" => rnr(),
        "rkey" => rkey(),
        "odp" => odp(),
        "wire" => wire(),
        _ => {
            eprintln!("usage: tutorial_pitfalls states|wire|psn|rnr|rkey|odp");
            std::process::exit(2);
        }
    };
    if let Err(e) = r {
        eprintln!("tutorial_pitfalls {which}: {e}");
        std::process::exit(1);
    }
}
