//! The grant fence, on one word per grant slot (`grant.rs`): the granter's
//! state bits and the count of the peer's operations inside the region.
//!
//! Both sides only ever change the word with read-modify-writes, so every
//! change is in the word's one modification order and each side reads the
//! latest: an operation that enters either sees the revocation (and backs
//! off) or is counted before it (and the revocation waits for it to
//! leave). No store-load pair on two locations is involved, so the
//! protocol holds with acquire/release orderings alone — which is also
//! what lets `tests/grant_fence.rs` model-check it with loom (loom does
//! not model `SeqCst` loads and stores). The acquire of the final count
//! the revocation reads pairs with each operation's release when it
//! leaves: whatever an operation did inside happens before what the
//! granter does after the wait (punching the region out).
//!
//! This file is also compiled by `tests/grant_fence.rs` over loom's
//! atomics: it names its atomics through `super::fence_atomic`.

use super::fence_atomic::{AtomicU32, Ordering};

/// The slot holds a grant (set by the granter).
pub const VALID: u32 = 1 << 31;
/// The grant was taken back (set by the granter).
pub const REVOKED: u32 = 1 << 30;
/// The count of operations inside.
pub const COUNT: u32 = REVOKED - 1;

/// Enters the region of a slot: true when it held a grant not revoked; the
/// caller must then [`leave`]. A count a peer left at its limit keeps
/// everyone out rather than wrapping into the state bits.
pub fn enter(ctl: &AtomicU32) -> bool {
    let prev = ctl.fetch_add(1, Ordering::AcqRel);
    if prev & (VALID | REVOKED) == VALID && prev & COUNT < COUNT - 1 {
        return true;
    }
    ctl.fetch_sub(1, Ordering::Release);
    false
}

/// Leaves the region entered with [`enter`].
pub fn leave(ctl: &AtomicU32) {
    ctl.fetch_sub(1, Ordering::Release);
}

/// Marks a slot valid for a new grant, if no operation is inside it:
/// false otherwise (the slot is not to be reused yet).
pub fn validate(ctl: &AtomicU32) -> bool {
    let mut v = ctl.load(Ordering::Acquire);
    loop {
        if v & COUNT != 0 {
            return false;
        }
        match ctl.compare_exchange(v, VALID, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(now) => v = now,
        }
    }
}

/// Takes a slot's grant back: no operation can enter it any more.
pub fn revoke(ctl: &AtomicU32) {
    let mut v = ctl.load(Ordering::Acquire);
    loop {
        let next = (v & COUNT) | REVOKED;
        match ctl.compare_exchange(v, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(now) => v = now,
        }
    }
}

/// The operations still inside a slot.
pub fn inside(ctl: &AtomicU32) -> u32 {
    ctl.load(Ordering::Acquire) & COUNT
}
