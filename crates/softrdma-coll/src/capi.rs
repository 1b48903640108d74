//! The C API (`include/softrdma_coll.h`, `libsoftrdma_coll.so`): a thin
//! `extern "C"` surface over [`Communicator`]. Every value from the caller
//! is checked (null pointers, codes, alignment, overlap) and every failure
//! is a -1 with the reason in `softrdma_coll_last_error`; a panic inside
//! is caught at the boundary and reported the same way.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::net::{SocketAddr, ToSocketAddrs};
use std::panic::{catch_unwind, AssertUnwindSafe};

use half::{bf16, f16};

use crate::{Algorithm, Communicator, Config, DataType, Element, ReduceOp, Rendezvous};

/// The communicator behind the C handle.
pub struct CollComm(Communicator);

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: String) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

/// Runs `f`, turning its error (or a panic) into -1 and the error text.
fn guard(f: impl FnOnce() -> Result<(), String>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            set_error(e);
            -1
        }
        Err(_) => {
            set_error("internal error (panic caught at the C boundary)".into());
            -1
        }
    }
}

/// The string at `p` (None when null).
///
/// # Safety
/// `p` is null or points to a NUL-terminated string.
unsafe fn opt_str(p: *const c_char, what: &str) -> Result<Option<String>, String> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null, and the caller promises a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(|s| Some(s.to_string()))
        .map_err(|_| format!("{what} is not UTF-8"))
}

fn addr(s: &str, what: &str) -> Result<SocketAddr, String> {
    s.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("{what} {s:?} is not HOST:PORT"))
}

fn dtype(code: c_int) -> Result<DataType, String> {
    usize::try_from(code)
        .ok()
        .and_then(|i| DataType::ALL.get(i).copied())
        .ok_or_else(|| format!("data type code {code} (0..=6)"))
}

fn op(code: c_int) -> Result<ReduceOp, String> {
    usize::try_from(code)
        .ok()
        .and_then(|i| ReduceOp::ALL.get(i).copied())
        .ok_or_else(|| format!("operator code {code} (0..=4)"))
}

fn comm_mut<'a>(c: *mut CollComm) -> Result<&'a mut Communicator, String> {
    // SAFETY: the handle is null or one softrdma_coll_init returned and
    // softrdma_coll_finalize has not freed; the C caller uses it from one
    // thread at a time (as the header says of every call on a handle).
    unsafe { c.as_mut() }
        .map(|c| &mut c.0)
        .ok_or_else(|| "null communicator".to_string())
}

fn comm_ref<'a>(c: *const CollComm) -> Option<&'a Communicator> {
    // SAFETY: as in `comm_mut`, shared.
    unsafe { c.as_ref() }.map(|c| &c.0)
}

fn check_ptr<T>(p: *const c_void, count: usize, what: &str) -> Result<(), String> {
    if count == 0 {
        return Ok(());
    }
    if p.is_null() {
        return Err(format!("{what} is null"));
    }
    if !(p as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Err(format!(
            "{what} is not aligned to {} bytes",
            std::mem::align_of::<T>()
        ));
    }
    count
        .checked_mul(std::mem::size_of::<T>())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| format!("{count} elements overflow"))?;
    Ok(())
}

fn all_reduce_t<T: Element>(
    c: &mut Communicator,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    o: ReduceOp,
) -> Result<(), String> {
    check_ptr::<T>(recv, count, "recv")?;
    let in_place = send.is_null() || std::ptr::eq(send, recv as *const c_void);
    if !in_place {
        check_ptr::<T>(send, count, "send")?;
        let bytes = count * std::mem::size_of::<T>();
        let (s, r) = (send as usize, recv as usize);
        if s < r + bytes && r < s + bytes {
            return Err("send and recv partly overlap".into());
        }
    }
    if count == 0 {
        return Ok(());
    }
    // SAFETY: recv is non-null, aligned for T, and the caller promises
    // `count` writable elements there; every bit pattern is a valid T
    // (Element is sealed to plain numbers).
    let r = unsafe { std::slice::from_raw_parts_mut(recv.cast::<T>(), count) };
    if in_place {
        c.all_reduce_in_place(r, o).map_err(|e| e.to_string())
    } else {
        // SAFETY: send is non-null, aligned, `count` readable elements
        // that do not overlap `r` (checked above).
        let s = unsafe { std::slice::from_raw_parts(send.cast::<T>(), count) };
        c.all_reduce(s, r, o).map_err(|e| e.to_string())
    }
}

fn broadcast_t<T: Element>(
    c: &mut Communicator,
    buf: *mut c_void,
    count: usize,
    root: usize,
) -> Result<(), String> {
    check_ptr::<T>(buf, count, "buf")?;
    if count == 0 {
        return c.broadcast::<T>(&mut [], root).map_err(|e| e.to_string());
    }
    // SAFETY: non-null, aligned, `count` writable elements (the caller's
    // promise); every bit pattern is a valid T.
    let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<T>(), count) };
    c.broadcast(b, root).map_err(|e| e.to_string())
}

macro_rules! by_type {
    ($d:expr, $f:ident, $($a:expr),*) => {
        match $d {
            DataType::F32 => $f::<f32>($($a),*),
            DataType::F64 => $f::<f64>($($a),*),
            DataType::F16 => $f::<f16>($($a),*),
            DataType::Bf16 => $f::<bf16>($($a),*),
            DataType::I32 => $f::<i32>($($a),*),
            DataType::I64 => $f::<i64>($($a),*),
            DataType::U8 => $f::<u8>($($a),*),
        }
    };
}

/// `softrdma_coll_init`: see the header.
///
/// # Safety
/// `rendezvous` and `aggd` are null or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn softrdma_coll_init(
    rank: c_int,
    size: c_int,
    rendezvous: *const c_char,
    aggd: *const c_char,
) -> *mut CollComm {
    let mut out = std::ptr::null_mut();
    guard(|| {
        // SAFETY: the caller's promise on both strings.
        let (rdv, agg) = unsafe { (opt_str(rendezvous, "rendezvous")?, opt_str(aggd, "aggd")?) };
        let mut cfg = Config::default().with_env().map_err(|e| e.to_string())?;
        if let Some(a) = agg {
            cfg.aggd = Some(addr(&a, "aggd")?);
        }
        let c = if rank < 0 {
            Communicator::from_env(cfg)
        } else {
            let (r, n) = (
                rank as usize,
                usize::try_from(size).map_err(|_| format!("size {size}"))?,
            );
            let rdv = rdv.ok_or("rank given but no rendezvous")?;
            Communicator::new(r, n, Rendezvous::Addr(addr(&rdv, "rendezvous")?), cfg)
        }
        .map_err(|e| e.to_string())?;
        out = Box::into_raw(Box::new(CollComm(c)));
        Ok(())
    });
    out
}

/// `softrdma_coll_finalize`: see the header.
///
/// # Safety
/// `comm` is null or a handle from `softrdma_coll_init` not yet finalized.
#[no_mangle]
pub unsafe extern "C" fn softrdma_coll_finalize(comm: *mut CollComm) {
    if !comm.is_null() {
        // SAFETY: the caller's promise: a live handle from Box::into_raw.
        let b = unsafe { Box::from_raw(comm) };
        let _ = catch_unwind(AssertUnwindSafe(move || drop(b)));
    }
}

/// This rank (-1 for a null handle).
#[no_mangle]
pub extern "C" fn softrdma_coll_rank(comm: *const CollComm) -> c_int {
    comm_ref(comm).map_or(-1, |c| c.rank() as c_int)
}

/// The world size (-1 for a null handle).
#[no_mangle]
pub extern "C" fn softrdma_coll_size(comm: *const CollComm) -> c_int {
    comm_ref(comm).map_or(-1, |c| c.size() as c_int)
}

/// 1 when in-network all-reduces go to the service.
#[no_mangle]
pub extern "C" fn softrdma_coll_in_network(comm: *const CollComm) -> c_int {
    comm_ref(comm).map_or(0, |c| c.in_network() as c_int)
}

/// `softrdma_coll_set_algorithm`: see the header.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn softrdma_coll_set_algorithm(
    comm: *mut CollComm,
    name: *const c_char,
) -> c_int {
    guard(|| {
        let c = comm_mut(comm)?;
        // SAFETY: the caller's promise on `name`.
        let a: Option<Algorithm> = unsafe { opt_str(name, "name")? }
            .map(|s| s.parse())
            .transpose()?;
        c.set_algorithm(a);
        Ok(())
    })
}

/// `softrdma_coll_all_reduce`: see the header.
///
/// # Safety
/// `send` (unless null) and `recv` point to `count` elements of `dtype`.
#[no_mangle]
pub unsafe extern "C" fn softrdma_coll_all_reduce(
    comm: *mut CollComm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype_code: c_int,
    op_code: c_int,
) -> c_int {
    guard(|| {
        let c = comm_mut(comm)?;
        let (d, o) = (dtype(dtype_code)?, op(op_code)?);
        by_type!(d, all_reduce_t, c, send, recv, count, o)
    })
}

/// `softrdma_coll_broadcast`: see the header.
///
/// # Safety
/// `buf` points to `count` elements of `dtype`.
#[no_mangle]
pub unsafe extern "C" fn softrdma_coll_broadcast(
    comm: *mut CollComm,
    buf: *mut c_void,
    count: usize,
    dtype_code: c_int,
    root: c_int,
) -> c_int {
    guard(|| {
        let c = comm_mut(comm)?;
        let d = dtype(dtype_code)?;
        let root = usize::try_from(root).map_err(|_| format!("root {root}"))?;
        by_type!(d, broadcast_t, c, buf, count, root)
    })
}

/// Waits until every rank has entered.
#[no_mangle]
pub extern "C" fn softrdma_coll_barrier(comm: *mut CollComm) -> c_int {
    guard(|| comm_mut(comm)?.barrier().map_err(|e| e.to_string()))
}

/// The last failure's text on this thread ("" when none).
#[no_mangle]
pub extern "C" fn softrdma_coll_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}
