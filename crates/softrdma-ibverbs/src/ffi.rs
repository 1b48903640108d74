//! The boundary with C: panics never cross it, errno is set the way
//! libibverbs sets it, the library's objects are found again from the
//! pointers handed to the application, and the few system calls on file
//! descriptors (fcntl, poll, read) that completion channels and the async
//! event fd need.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

/// Runs `f`; if it panics, reports the panic (the default hook already
/// printed it), sets errno to EIO and returns `on_panic` instead of
/// unwinding into C.
pub fn guard<R>(on_panic: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// Sets the calling thread's errno.
pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot,
    // valid for the thread's lifetime.
    unsafe { *libc::__errno_location() = e }
}

/// True when SOFTRDMA_IBV_DEBUG is set: failing verbs then print why.
fn debug() -> bool {
    static DEBUG: OnceLock<bool> = OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var_os("SOFTRDMA_IBV_DEBUG").is_some_and(|v| v != "0"))
}

/// A verb failed: sets errno, prints the reason under SOFTRDMA_IBV_DEBUG,
/// and returns the errno (what most verbs return).
pub fn fail(verb: &str, e: &softrdma::Error) -> c_int {
    fail_with(verb, e.errno(), &e.to_string())
}

/// Like [`fail`] for a failure that is only an errno and a message.
pub fn fail_with(verb: &str, errno: c_int, why: &str) -> c_int {
    if debug() {
        eprintln!("softrdma: {verb}: {why} (errno {errno})");
    }
    set_errno(errno);
    errno
}

/// True when the application put `fd` in non-blocking mode.
pub fn is_nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL takes no pointer argument.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// Clears O_NONBLOCK: completion channel and async event fds start out
/// blocking, as with rdma-core, so that the application's own fcntl tells
/// `ibv_get_cq_event` / `ibv_get_async_event` whether to block.
pub fn set_blocking(fd: c_int) {
    // SAFETY: F_GETFL/F_SETFL take integer arguments only.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
}

/// Waits up to `ms` milliseconds for `fd` to become readable.
pub fn wait_readable(fd: c_int, ms: c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n > 0 && p.revents & libc::POLLIN != 0
}

/// Reads (and so clears) an eventfd's counter. Only called when the fd is
/// readable or non-blocking, so it does not block.
pub fn drain_eventfd(fd: c_int) {
    let mut v = 0u64;
    // SAFETY: reads at most 8 bytes into a live u64.
    let _ = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

/// Adds one to an eventfd's counter (makes it readable).
pub fn signal_eventfd(fd: c_int) {
    let v = 1u64;
    // SAFETY: writes 8 bytes from a live u64.
    let _ = unsafe { libc::write(fd, (&v as *const u64).cast(), 8) };
}
