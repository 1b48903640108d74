//! On-demand paging and pinning through the Rust API, over real UDP:
//! pinned registration faults every page in (and refuses memory that is not
//! mapped, with EFAULT), an ODP registration faults nothing in, its pages
//! are resolved by the accesses that touch them (or by a prefetch), and an
//! access to memory that is not mapped fails with the status hardware gives
//! — remote access error, local protection error — instead of a fault.

use std::time::Duration;

use softrdma::*;

const T: Duration = Duration::from_secs(10);
const PAGE: usize = 4096;

fn access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// A fresh private anonymous mapping of `pages` pages, none faulted in.
fn map(pages: usize) -> *mut u8 {
    // SAFETY: a new mapping, owned by the test.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            pages * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

/// How many of the `pages` pages at `p` are resident (`mincore`).
fn resident(p: *mut u8, pages: usize) -> usize {
    let mut v = vec![0u8; pages];
    // SAFETY: reads page tables of the test's own mapping.
    assert_eq!(
        unsafe { libc::mincore(p.cast(), pages * PAGE, v.as_mut_ptr()) },
        0
    );
    v.iter().filter(|&&b| b & 1 != 0).count()
}

struct Pair {
    ca: Cq,
    qa: Qp,
    pa: Pd,
    pb: Pd,
    ma: Mr,
    mb: Mr,
    _keep: (Context, Context, Cq, Qp),
}

fn pair() -> Pair {
    let a = Context::open_with(&DeviceConfig::default_loopback()).unwrap();
    let b = Context::open_with(&DeviceConfig::default_loopback()).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let ma = pa.alloc_mr(16 * PAGE, access()).unwrap();
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb = pb.create_qp(QpType::Rc, &cb, &cb).build().unwrap();
    qa.connect(&qb.endpoint(), &ConnectOptions::default())
        .unwrap();
    qb.connect(&qa.endpoint(), &ConnectOptions::default())
        .unwrap();
    let mb = pb.alloc_mr(4 * PAGE, access()).unwrap();
    Pair {
        ca,
        qa,
        pa,
        pb,
        ma,
        mb,
        _keep: (a, b, cb, qb),
    }
}

fn status(p: &Pair, op: SendOp, sge: Sge) -> WcStatus {
    p.qa.post_send(&SendWr::new(1, op, vec![sge])).unwrap();
    let wcs = p.ca.wait(1, T).unwrap();
    wcs[0].status
}

#[test]
fn pinned_registration_faults_in_and_refuses_unmapped_memory() {
    let p = pair();
    let m = map(8);
    assert_eq!(resident(m, 8), 0);
    // SAFETY: the mapping outlives the region (dropped below).
    let mr = unsafe { p.pb.register_raw(m, 8 * PAGE, m as u64, access()) }.unwrap();
    assert_eq!(resident(m, 8), 8, "pinning faults every page in");
    drop(mr);
    // SAFETY: the test's own mapping; then nothing is registered there.
    unsafe { libc::munmap(m.add(4 * PAGE).cast(), PAGE) };
    // SAFETY: as above; registration must refuse the hole.
    let e = unsafe { p.pb.register_raw(m, 8 * PAGE, m as u64, access()) }.unwrap_err();
    assert!(matches!(e, Error::Fault(_)), "{e}");
    assert_eq!(e.errno(), 14, "EFAULT");
    // Read-only memory cannot be pinned for writing, but for reading.
    // SAFETY: the test's own mapping.
    unsafe { libc::mprotect(m.cast(), 4 * PAGE, libc::PROT_READ) };
    // SAFETY: as above.
    let e = unsafe { p.pb.register_raw(m, 4 * PAGE, m as u64, access()) }.unwrap_err();
    assert_eq!(e.errno(), 14, "EFAULT: {e}");
    // SAFETY: as above.
    let ro = unsafe {
        p.pb.register_raw(m, 4 * PAGE, m as u64, AccessFlags::REMOTE_READ)
    };
    assert!(ro.is_ok());
}

#[test]
fn explicit_odp_faults_in_only_what_is_touched() {
    let p = pair();
    let m = map(16);
    // SAFETY: the test's mapping; peers may write it.
    let odp = unsafe { p.pb.register_odp(m, 16 * PAGE, m as u64, access()) }.unwrap();
    assert!(odp.is_odp());
    assert_eq!(resident(m, 16), 0, "ODP registration faults nothing in");
    let data: Vec<u8> = (0..3 * PAGE).map(|i| (i * 13 + 1) as u8).collect();
    p.ma.write(0, &data).unwrap();
    let op = SendOp::Write {
        remote_addr: m as u64 + 2 * PAGE as u64,
        rkey: odp.rkey(),
    };
    assert_eq!(
        status(&p, op, p.ma.sge(0, data.len() as u32)),
        WcStatus::Success
    );
    assert_eq!(resident(m, 16), 3, "the WRITE resolved its three pages");
    let mut got = vec![0u8; data.len()];
    odp.read(2 * PAGE, &mut got).unwrap();
    assert!(got == data, "WRITE data intact");
    // READ back through the ODP region, into the pinned one.
    let op = SendOp::Read {
        remote_addr: m as u64 + 2 * PAGE as u64,
        rkey: odp.rkey(),
    };
    assert_eq!(
        status(&p, op, p.ma.sge(8 * PAGE as u64, data.len() as u32)),
        WcStatus::Success
    );
    let mut back = vec![0u8; data.len()];
    p.ma.read(8 * PAGE, &mut back).unwrap();
    assert!(back == data, "READ data intact");
    // A prefetch resolves pages ahead of the accesses.
    odp.prefetch(m as u64 + 10 * PAGE as u64, 4 * PAGE, true)
        .unwrap();
    assert_eq!(resident(m, 16), 7);
    // Outside the region: EINVAL.
    let e = odp
        .prefetch(m as u64 + 15 * PAGE as u64, 2 * PAGE, false)
        .unwrap_err();
    assert_eq!(e.errno(), 22);
    // SAFETY: the region is deregistered before the mapping goes.
    drop(odp);
    unsafe { libc::munmap(m.cast(), 16 * PAGE) };
}

#[test]
fn implicit_odp_answers_unmapped_memory_with_access_errors() {
    let m = map(4);
    // SAFETY: the test's own mapping: page 1 unmapped, page 2 read-only.
    unsafe {
        libc::munmap(m.add(PAGE).cast(), PAGE);
        libc::mprotect(m.add(2 * PAGE).cast(), PAGE, libc::PROT_READ);
    }
    let at = |page: usize| m as u64 + (page * PAGE) as u64;
    // op 0: WRITE, 1: READ, 2: FETCH_ADD.
    let cases: [(&str, usize, u8, WcStatus); 7] = [
        ("WRITE to a mapped page", 0, 0, WcStatus::Success),
        ("WRITE to an unmapped page", 1, 0, WcStatus::RemAccessErr),
        ("WRITE to a read-only page", 2, 0, WcStatus::RemAccessErr),
        ("READ of a read-only page", 2, 1, WcStatus::Success),
        ("READ of an unmapped page", 1, 1, WcStatus::RemAccessErr),
        ("FETCH_ADD on a mapped page", 3, 2, WcStatus::Success),
        (
            "FETCH_ADD on a read-only page",
            2,
            2,
            WcStatus::RemAccessErr,
        ),
    ];
    for (what, page, op, want) in cases {
        let p = pair();
        // SAFETY: the whole address space of this test process may be
        // written by the peer, which is this test.
        let imp = unsafe { p.pb.register_implicit_odp(access()) }.unwrap();
        assert_eq!((imp.addr(), imp.len()), (0, usize::MAX));
        assert!(imp.to_vec().is_empty(), "no copy of the address space");
        p.ma.write(0, b"implicit").unwrap();
        let (remote_addr, rkey) = (at(page), imp.rkey());
        let op = match op {
            0 => SendOp::Write { remote_addr, rkey },
            1 => SendOp::Read { remote_addr, rkey },
            _ => SendOp::FetchAdd {
                remote_addr,
                rkey,
                add: 5,
            },
        };
        assert_eq!(status(&p, op, p.ma.sge(0, 8)), want, "{what}");
    }
    let mut got = [0u8; 8];
    // SAFETY: pages 0 and 3 of the test's mapping, written by the cases.
    unsafe { std::ptr::copy_nonoverlapping(m, got.as_mut_ptr(), 8) };
    assert_eq!(&got, b"implicit");
    // SAFETY: as above.
    let word = unsafe { std::ptr::read(m.add(3 * PAGE).cast::<u64>()) };
    assert_eq!(word, 5, "FETCH_ADD added");

    // A local SGE on unmapped memory: local protection error.
    let p = pair();
    // SAFETY: as above.
    let imp = unsafe { p.pa.register_implicit_odp(access()) }.unwrap();
    let op = SendOp::Write {
        remote_addr: p.mb.addr(),
        rkey: p.mb.rkey(),
    };
    let sge = |page: usize| Sge {
        addr: at(page),
        length: 64,
        lkey: imp.lkey(),
    };
    assert_eq!(status(&p, op, sge(0)), WcStatus::Success);
    let mut got = [0u8; 8];
    p.mb.read(0, &mut got).unwrap();
    assert_eq!(&got, b"implicit", "gathered from the implicit region");
    assert_eq!(status(&p, op, sge(1)), WcStatus::LocProtErr);
}
