//! Executing a planned direct operation inside a granted window: the only
//! raw memory access of the core.

use std::sync::atomic::{AtomicU64, Ordering};

use softrdma_engine::{DirectOp, DirectPlan, Engine};

use crate::port::Window;

/// The u64 at `p` as an atomic, when `p` is 8-aligned.
fn atomic_at<'a>(p: *mut u8) -> Option<&'a AtomicU64> {
    // SAFETY: aligned (checked); the callers pass addresses inside a live
    // window or a local region, memory reached only atomically or by raw
    // copies.
    ((p as usize) & 7 == 0).then(|| unsafe { AtomicU64::from_ptr(p.cast()) })
}

/// Executes a planned WRITE, READ or atomic inside a granted window: the
/// target's rules (`Engine::check_direct_target`) against what it granted,
/// then the copy or the CPU atomic. False when a rule refuses (the engine
/// then handles the WR and gives its completion).
pub(crate) fn execute(engine: &Engine, window: &mut Window<'_>, plan: &DirectPlan) -> bool {
    let Ok(roff) = engine.check_direct_target(plan, window) else {
        return false;
    };
    let Some(rp) = window.ptr(roff, plan.len()) else {
        return false;
    };
    let local = plan.pieces();
    let lp = |a: usize| a as *mut u8;
    match plan.op() {
        DirectOp::Write => {
            let mut r = rp;
            for &(lo, n) in local {
                // SAFETY: the source lies in our own registered region (the
                // engine's local SGE rule, on memory that offers addresses),
                // the target in the window (the target's rule and `ptr`
                // above); distinct mappings.
                unsafe {
                    std::ptr::copy_nonoverlapping(lp(lo), r, n);
                    r = r.add(n);
                }
            }
        }
        DirectOp::Read => {
            let mut r = rp;
            for &(lo, n) in local {
                // SAFETY: as above, with the roles swapped.
                unsafe {
                    std::ptr::copy_nonoverlapping(r, lp(lo), n);
                    r = r.add(n);
                }
            }
        }
        DirectOp::CompareSwap { compare, swap } => {
            // CPU atomics need the word 8-aligned in both mappings.
            let (Some(t), Some(l)) = (atomic_at(rp), atomic_at(lp(local[0].0))) else {
                return false;
            };
            let old = match t.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            };
            l.store(old, Ordering::Release);
        }
        DirectOp::FetchAdd { add } => {
            let (Some(t), Some(l)) = (atomic_at(rp), atomic_at(lp(local[0].0))) else {
                return false;
            };
            l.store(t.fetch_add(add, Ordering::SeqCst), Ordering::Release);
        }
    }
    true
}
