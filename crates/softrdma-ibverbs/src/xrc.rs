//! XRC: the `open_xrcd`, `close_xrcd`, `create_srq_ex` and `get_srq_num`
//! slots of `struct verbs_context`, which the header's inline
//! `ibv_open_xrcd`, `ibv_close_xrcd`, `ibv_create_srq_ex` and
//! `ibv_get_srq_num` call, and the XRC_RECV QP `ibv_create_qp_ex` makes
//! ([`create_tgt_qp`]). Each is softrdma's XRC API ([`softrdma::Xrcd`],
//! [`softrdma::Pd::create_xrc_srq`], [`softrdma::Srq::srq_num`]); the
//! engine's rules decide which SRQ a request may reach (docs/engine.md).
//!
//! A domain opened with a file (`IBV_XRCD_INIT_ATTR_FD`) is the one domain
//! of that file (its device and inode) in this context, as the kernel
//! keeps one per inode: opening it again gives the same `ibv_xrcd`, which
//! closes when every opener closed it. Without `O_CREAT` the file must have
//! a domain already, and `O_EXCL` refuses one that has (EINVAL, as the
//! kernel). A domain is the process's own: another process opening the
//! same file gets a domain of its own (there is no kernel object to share).

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;
use std::sync::Mutex;

use softrdma::SrqInit;

use crate::abi::*;
use crate::ffi::{fail, fail_with, guard};
use crate::objects::{self, Ctx, Pd, Srq};
use crate::verbs::{ctx_of, live};

/// `struct ibv_xrcd`.
#[repr(C)]
pub struct ibv_xrcd {
    pub context: *mut ibv_context,
}

/// `struct ibv_xrcd_init_attr`.
#[repr(C)]
pub struct ibv_xrcd_init_attr {
    pub comp_mask: u32,
    pub fd: c_int,
    pub oflags: c_int,
}

/// `struct ibv_srq_init_attr_ex`.
#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
    pub comp_mask: u32,
    pub srq_type: c_uint,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut ibv_xrcd,
    pub cq: *mut ibv_cq,
    /// `struct ibv_tm_cap` (max_num_tags, max_ops).
    pub tm_cap: [u32; 2],
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<ibv_xrcd_init_attr>() == 12);
    assert!(offset_of!(ibv_srq_init_attr_ex, comp_mask) == 20);
    assert!(offset_of!(ibv_srq_init_attr_ex, srq_type) == 24);
    assert!(offset_of!(ibv_srq_init_attr_ex, pd) == 32);
    assert!(offset_of!(ibv_srq_init_attr_ex, xrcd) == 40);
    assert!(offset_of!(ibv_srq_init_attr_ex, cq) == 48);
    assert!(size_of::<ibv_srq_init_attr_ex>() == 64);
};

pub const IBV_XRCD_INIT_ATTR_FD: u32 = 1 << 0;
pub const IBV_XRCD_INIT_ATTR_OFLAGS: u32 = 1 << 1;
const XRCD_INIT_ATTR_RESERVED: u32 = 1 << 2;

pub const IBV_SRQ_INIT_ATTR_TYPE: u32 = 1 << 0;
pub const IBV_SRQ_INIT_ATTR_PD: u32 = 1 << 1;
pub const IBV_SRQ_INIT_ATTR_XRCD: u32 = 1 << 2;
pub const IBV_SRQ_INIT_ATTR_CQ: u32 = 1 << 3;
pub const IBV_SRQ_INIT_ATTR_TM: u32 = 1 << 4;

pub const IBV_SRQT_BASIC: c_uint = 0;
pub const IBV_SRQT_XRC: c_uint = 1;

/// What stands behind an `ibv_xrcd`.
#[repr(C)]
pub struct Xrcd {
    pub ibv: ibv_xrcd,
    pub xrcd: Option<softrdma::Xrcd>,
    /// The file's (device, inode) when it was opened with one.
    pub file: Option<(u64, u64)>,
    /// Openers not yet closed (1 without a file).
    pub refs: u32,
}

/// The domains of files, per context: (device, inode) → the `Xrcd`'s
/// address. One lock for every context (opening domains is rare).
static FILE_DOMAINS: Mutex<Vec<(usize, FileDomains)>> = Mutex::new(Vec::new());

/// One context's domains of files: (device, inode) → the `Xrcd`'s address.
type FileDomains = HashMap<(u64, u64), usize>;

fn with_files<R>(ctx: &Ctx, f: impl FnOnce(&mut FileDomains) -> R) -> R {
    let key = ctx as *const Ctx as usize;
    let mut all = FILE_DOMAINS.lock().unwrap_or_else(|e| e.into_inner());
    let i = match all.iter().position(|(k, _)| *k == key) {
        Some(i) => i,
        None => {
            all.push((key, HashMap::new()));
            all.len() - 1
        }
    };
    f(&mut all[i].1)
}

/// The (device, inode) of an open file descriptor.
fn file_id(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: fstat writes only into `st`, which is large enough; a bad fd
    // is an error return.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return None;
        }
        Some((st.st_dev, st.st_ino))
    }
}

/// `ibv_open_xrcd` (the `open_xrcd` slot).
pub unsafe extern "C" fn open_xrcd(
    context: *mut ibv_context,
    attr: *mut ibv_xrcd_init_attr,
) -> *mut ibv_xrcd {
    const VERB: &str = "ibv_open_xrcd";
    guard(null_mut(), || {
        if context.is_null() || attr.is_null() {
            fail_with(VERB, libc::EINVAL, "NULL context or attributes");
            return null_mut();
        }
        // SAFETY: a live context of this library; attr is readable.
        let (c, a) = unsafe { (Ctx::from_ptr(context), &*attr) };
        if a.comp_mask & !(IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS) != 0
            || a.comp_mask & XRCD_INIT_ATTR_RESERVED != 0
        {
            fail_with(VERB, libc::EINVAL, "unknown comp_mask bits");
            return null_mut();
        }
        let oflags = if a.comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS != 0 {
            a.oflags
        } else {
            0
        };
        let fd = if a.comp_mask & IBV_XRCD_INIT_ATTR_FD != 0 {
            a.fd
        } else {
            -1
        };
        let file = if fd >= 0 {
            match file_id(fd) {
                Some(id) => Some(id),
                None => {
                    fail_with(VERB, libc::EBADF, &format!("fd {fd} is not open"));
                    return null_mut();
                }
            }
        } else {
            None
        };
        if let Some(id) = file {
            let existing = with_files(c, |m| m.get(&id).copied());
            if let Some(addr) = existing {
                if oflags & libc::O_EXCL != 0 {
                    fail_with(VERB, libc::EINVAL, "O_EXCL: the file has a domain");
                    return null_mut();
                }
                let x = addr as *mut Xrcd;
                // SAFETY: a live Xrcd of this context (removed from the map
                // before it is freed).
                unsafe { (*x).refs += 1 };
                return x.cast();
            }
        }
        if oflags & libc::O_CREAT == 0 {
            // The kernel: no domain for this inode and no O_CREAT (or no
            // file at all) is EINVAL.
            fail_with(VERB, libc::EINVAL, "no domain to open and no O_CREAT");
            return null_mut();
        }
        let soft = match c.dev.open_xrcd() {
            Ok(x) => x,
            Err(e) => {
                fail(VERB, &e);
                return null_mut();
            }
        };
        let x = objects::leak(Xrcd {
            ibv: ibv_xrcd {
                context: c.as_ibv(),
            },
            xrcd: Some(soft),
            file,
            refs: 1,
        });
        if let Some(id) = file {
            with_files(c, |m| m.insert(id, x as usize));
        }
        x.cast()
    })
}

/// `ibv_close_xrcd` (the `close_xrcd` slot): the last close of a domain
/// closes it (EBUSY while XRC SRQs or XRC_RECV QPs are in it).
pub unsafe extern "C" fn close_xrcd(xrcd: *mut ibv_xrcd) -> c_int {
    const VERB: &str = "ibv_close_xrcd";
    guard(libc::EIO, || {
        if xrcd.is_null() {
            return fail_with(VERB, libc::EINVAL, "NULL xrcd");
        }
        let x = xrcd.cast::<Xrcd>();
        // SAFETY: a live Xrcd of this library, not used by another thread
        // while it closes (the libibverbs contract).
        unsafe {
            if (*x).refs > 1 {
                (*x).refs -= 1;
                return 0;
            }
            let c = ctx_of(xrcd);
            let Some(soft) = (*x).xrcd.take() else {
                return fail_with(VERB, libc::EINVAL, "the domain was closed");
            };
            if let Err((soft, e)) = soft.close() {
                (*x).xrcd = Some(soft);
                return fail(VERB, &e);
            }
            if let Some(id) = (*x).file {
                with_files(c, |m| m.remove(&id));
            }
            objects::free(x);
        }
        0
    })
}

/// The softrdma domain behind an `ibv_xrcd`.
///
/// # Safety
/// `xrcd` is NULL or a live domain of this library.
pub(crate) unsafe fn soft_xrcd<'a>(
    verb: &str,
    xrcd: *mut ibv_xrcd,
) -> Result<&'a softrdma::Xrcd, c_int> {
    if xrcd.is_null() {
        return Err(fail_with(verb, libc::EINVAL, "NULL xrcd"));
    }
    // SAFETY: per the contract.
    live(verb, unsafe { &(*xrcd.cast::<Xrcd>()).xrcd })
}

/// `ibv_create_srq_ex` (the `create_srq_ex` slot): a basic SRQ as
/// `ibv_create_srq` makes, or (IBV_SRQT_XRC) an XRC SRQ with its PD, XRC
/// domain and CQ, all required (EINVAL without). Tag-matching SRQs are
/// EOPNOTSUPP (an mlx5 offload).
pub unsafe extern "C" fn create_srq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    const VERB: &str = "ibv_create_srq_ex";
    guard(null_mut(), || {
        if context.is_null() || attr.is_null() {
            fail_with(VERB, libc::EINVAL, "NULL context or attributes");
            return null_mut();
        }
        // SAFETY: a live context; attr is readable.
        let (c, a) = unsafe { (Ctx::from_ptr(context), &*attr) };
        let known = IBV_SRQ_INIT_ATTR_TYPE
            | IBV_SRQ_INIT_ATTR_PD
            | IBV_SRQ_INIT_ATTR_XRCD
            | IBV_SRQ_INIT_ATTR_CQ
            | IBV_SRQ_INIT_ATTR_TM;
        if a.comp_mask & !known != 0 {
            fail_with(VERB, libc::EINVAL, "unknown comp_mask bits");
            return null_mut();
        }
        let srq_type = if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 {
            a.srq_type
        } else {
            IBV_SRQT_BASIC
        };
        if srq_type != IBV_SRQT_BASIC && srq_type != IBV_SRQT_XRC {
            fail_with(
                VERB,
                libc::EOPNOTSUPP,
                &format!("SRQ type {srq_type} (softrdma has BASIC and XRC)"),
            );
            return null_mut();
        }
        if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
            fail_with(VERB, libc::EINVAL, "an SRQ needs a PD");
            return null_mut();
        }
        let pd = a.pd;
        // SAFETY: a live PD of this library (per the verb's contract).
        let Ok(p) = (unsafe { (*pd.cast::<Pd>()).soft(VERB) }) else {
            return null_mut();
        };
        let init = SrqInit {
            max_wr: a.attr.max_wr,
            max_sge: a.attr.max_sge,
            limit: a.attr.srq_limit,
        };
        let r = if srq_type == IBV_SRQT_XRC {
            let want = IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
            if a.comp_mask & want != want || a.cq.is_null() {
                fail_with(
                    VERB,
                    libc::EINVAL,
                    "an XRC SRQ needs an XRC domain and a CQ",
                );
                return null_mut();
            }
            // SAFETY: NULL or live objects of this library.
            let found = unsafe { (soft_xrcd(VERB, a.xrcd), crate::verbs::soft_cq(VERB, a.cq)) };
            let (Ok(x), Ok(cq)) = found else {
                return null_mut();
            };
            p.create_xrc_srq(x, cq, init)
        } else {
            p.create_srq_with(init)
        };
        match r {
            Ok(soft) => {
                let handle = soft.handle();
                let srq = objects::leak(Srq {
                    ibv: ibv_srq {
                        context: c.as_ibv(),
                        srq_context: a.srq_context,
                        pd,
                        handle: handle.raw(),
                        mutex: objects::new_mutex(),
                        cond: objects::new_cond(),
                        events_completed: 0,
                    },
                    srq: Some(soft),
                    attr: Mutex::new(a.attr),
                });
                c.objects().srqs.insert(handle.raw(), srq as usize);
                srq.cast()
            }
            Err(e) => {
                fail(VERB, &e);
                null_mut()
            }
        }
    })
}

/// `ibv_get_srq_num` (the `get_srq_num` slot): the number an XRC SRQ is
/// named by in XRC send WRs; EINVAL for a basic SRQ.
pub unsafe extern "C" fn get_srq_num(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int {
    const VERB: &str = "ibv_get_srq_num";
    guard(libc::EIO, || {
        if srq.is_null() || srq_num.is_null() {
            return fail_with(VERB, libc::EINVAL, "NULL argument");
        }
        // SAFETY: a live Srq of this library; srq_num is writable.
        unsafe {
            let soft = match live(VERB, &(*srq.cast::<Srq>()).srq) {
                Ok(s) => s,
                Err(n) => return n,
            };
            match soft.srq_num() {
                Ok(n) => {
                    srq_num.write(n);
                    0
                }
                Err(e) => fail(VERB, &e),
            }
        }
    })
}

/// The XRC_RECV QP of `ibv_create_qp_ex` (IBV_QP_INIT_ATTR_XRCD): an XRC
/// target in `xrcd`, with no PD, CQ or queues of its own.
///
/// # Safety
/// `context` is a live context of this library, `a` readable and writable,
/// its `xrcd` NULL or a live domain.
pub(crate) unsafe fn create_tgt_qp(
    context: *mut ibv_context,
    a: &mut crate::qp_ex::ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    const VERB: &str = "ibv_create_qp_ex";
    // SAFETY: per the contract.
    let (c, x) = unsafe { (Ctx::from_ptr(context), soft_xrcd(VERB, a.xrcd.cast())) };
    let Ok(x) = x else {
        return null_mut();
    };
    let soft = match x.create_tgt_qp() {
        Ok(q) => q,
        Err(e) => {
            fail(VERB, &e);
            return null_mut();
        }
    };
    a.cap = crate::convert::cap_to_c(&soft.cap());
    let qpn = soft.qpn();
    let qp = objects::leak(objects::Qp {
        ibv: ibv_qp {
            context: c.as_ibv(),
            qp_context: a.qp_context,
            pd: null_mut(),
            send_cq: null_mut(),
            recv_cq: null_mut(),
            srq: null_mut(),
            handle: qpn.raw(),
            qp_num: qpn.raw(),
            state: 0,
            qp_type: a.qp_type,
            mutex: objects::new_mutex(),
            cond: objects::new_cond(),
            events_completed: 0,
        },
        ex: crate::qp_ex::QpExTail::none(),
        qp: Some(soft),
        pending: Default::default(),
    });
    c.objects().qps.insert(qpn.raw(), qp as usize);
    qp.cast()
}
