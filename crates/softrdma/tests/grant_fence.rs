//! A model check, with loom, of the grant fence (`src/fence.rs`, compiled
//! here over loom's atomics): every interleaving of a peer's operation
//! with the granter's revocation and reuse of the slot, under the C11
//! memory model. The region's bytes are a loom cell, so an access of the
//! peer that the revocation's wait does not order before the granter's
//! next use of the bytes is reported as a data race.

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

mod fence_atomic {
    pub use loom::sync::atomic::{AtomicU32, Ordering};
}
#[path = "../src/fence.rs"]
#[allow(dead_code)]
mod fence;

use fence_atomic::AtomicU32;

struct Slot {
    ctl: AtomicU32,
    region: UnsafeCell<u64>,
}

/// The peer enters, writes the region, leaves; the granter revokes, waits
/// until nobody is inside, then reuses the bytes (the punch): the model
/// finds no interleaving where the two touch the region unordered, nor one
/// where the peer enters after the revocation.
#[test]
fn no_operation_outlives_the_revocation_that_waited_for_it() {
    loom::model(|| {
        let slot = Arc::new(Slot {
            ctl: AtomicU32::new(0),
            region: UnsafeCell::new(0),
        });
        assert!(fence::validate(&slot.ctl));
        let peer = {
            let slot = slot.clone();
            thread::spawn(move || {
                if fence::enter(&slot.ctl) {
                    // SAFETY (loom checks it): inside the fence.
                    slot.region.with_mut(|p| unsafe { *p += 1 });
                    fence::leave(&slot.ctl);
                    true
                } else {
                    false
                }
            })
        };
        fence::revoke(&slot.ctl);
        while fence::inside(&slot.ctl) != 0 {
            thread::yield_now();
        }
        // The granter's own use of the bytes after the wait.
        slot.region.with_mut(|p| unsafe { *p = 100 });
        let entered = peer.join().unwrap();
        // After the revocation nobody gets in.
        assert!(!fence::enter(&slot.ctl));
        let v = slot.region.with(|p| unsafe { *p });
        assert_eq!(v, 100, "entered {entered}: the peer wrote after the wait");
    });
}

/// A slot is reused only once nobody is inside: a stale operation that
/// entered under the old grant keeps `validate` from succeeding until it
/// has left.
#[test]
fn a_slot_is_not_revalidated_while_an_operation_is_inside() {
    loom::model(|| {
        let ctl = Arc::new(AtomicU32::new(0));
        assert!(fence::validate(&ctl));
        assert!(fence::enter(&ctl));
        fence::revoke(&ctl);
        let other = {
            let ctl = ctl.clone();
            thread::spawn(move || fence::validate(&ctl))
        };
        let revalidated = other.join().unwrap();
        assert!(!revalidated, "reused with an operation inside");
        fence::leave(&ctl);
        assert!(fence::validate(&ctl));
        assert!(fence::enter(&ctl));
        fence::leave(&ctl);
    });
}

/// A count a peer left at its limit keeps everyone out instead of wrapping
/// into the state bits.
#[test]
fn a_count_at_its_limit_lets_nobody_in() {
    loom::model(|| {
        let ctl = AtomicU32::new(fence::VALID | (fence::COUNT - 1));
        assert!(!fence::enter(&ctl));
        assert_eq!(fence::inside(&ctl), fence::COUNT - 1);
    });
}
