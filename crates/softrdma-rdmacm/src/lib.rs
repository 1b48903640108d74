//! # softrdma-rdmacm: a drop-in `librdmacm.so.1`
//!
//! This crate builds `librdmacm.so` (SONAME `librdmacm.so.1`, rdma-core
//! v44's symbol versions RDMACM_1.0 … RDMACM_1.3, `libibverbs.so.1`
//! NEEDED). It holds no RDMA state: a Rust cdylib carries its own copy of
//! every crate it links, so a librdmacm linking `softrdma` would have
//! devices and QPs other than the ones the program's libibverbs.so.1 made.
//! The rdma_cm therefore lives in softrdma's libibverbs.so.1 (module
//! `rdmacm` of softrdma-ibverbs), exported there under private names
//! `softrdma_rdmacm_<rdma-core name>`; each symbol here is a trampoline
//! that jumps to it, found once with `dlsym(RTLD_DEFAULT, …)`. A name that
//! libibverbs does not provide (multicast, SRQs, … — or every
//! name, when the program's libibverbs is not softrdma's) gets a stub that
//! sets errno to ENOSYS and returns -1 (NULL for the functions returning
//! a pointer). See docs/rdmacm.md.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

mod generated {
    include!(concat!(env!("OUT_DIR"), "/trampolines.rs"));
}
use generated::{COUNT, NAMES};

/// The prefix of the implementations' names in libibverbs.so.1.
pub const PREFIX: &str = "softrdma_rdmacm_";

/// Per symbol of librdmacm.map (in its order): where its trampoline jumps,
/// 0 until the first call resolves it. Read by the trampolines' assembly.
static SLOTS: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];

/// Returns (and caches) the address symbol `i` forwards to. Called by the
/// trampolines with the caller's argument registers saved, so it may call
/// anything; it must not unwind (it cannot panic: indexes are in range by
/// construction, and an out-of-range one gets the error stub).
extern "C" fn resolve(i: u32) -> usize {
    let Some(&(name, returns_pointer)) = NAMES.get(i as usize) else {
        return stub_minus_one as *const () as usize;
    };
    let target = lookup(name).unwrap_or_else(|| {
        warn_once(name);
        if returns_pointer {
            stub_null as *const () as usize
        } else {
            stub_minus_one as *const () as usize
        }
    });
    SLOTS[i as usize].store(target, Ordering::Release);
    target
}

/// `softrdma_rdmacm_<name>` in the process (softrdma's libibverbs.so.1).
fn lookup(name: &str) -> Option<usize> {
    let c = CString::new(format!("{PREFIX}{name}")).ok()?;
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads
    // the name.
    let p: *mut c_void = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) };
    (!p.is_null()).then_some(p as usize)
}

/// Says once per process why calls fail when the program's libibverbs is
/// not softrdma's; names each unimplemented function under
/// SOFTRDMA_IBV_DEBUG.
fn warn_once(name: &str) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if lookup("rdma_create_id").is_none() {
            eprintln!(
                "softrdma librdmacm: the libibverbs.so.1 loaded in this process is not \
                 softrdma's (no {PREFIX}* symbols); every rdma_* call fails with ENOSYS"
            );
        }
    });
    if std::env::var_os("SOFTRDMA_IBV_DEBUG").is_some_and(|v| v != "0") {
        eprintln!("softrdma librdmacm: {name} is not implemented (ENOSYS)");
    }
}

fn set_enosys() {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = libc::ENOSYS }
}

/// What an unimplemented function returns: -1 (as int, ssize_t or off_t)
/// with errno ENOSYS. The caller's arguments are ignored, which the C ABI
/// allows; for `void` functions the value is unused.
extern "C" fn stub_minus_one() -> i64 {
    set_enosys();
    -1
}

/// The stub of the functions that return a pointer: NULL, errno ENOSYS.
extern "C" fn stub_null() -> *mut c_void {
    set_enosys();
    std::ptr::null_mut()
}
