//! Process-wide state that a child made by fork(2) starts afresh.
//!
//! A child inherits a copy of its parent's memory but none of its other
//! threads: a device the parent had open has no progress thread in the
//! child, and its locks may be held by a parent thread that did not come
//! along (a child that used its parent's device hung in
//! `ibv_query_device_ex`; rdma-core's test suite forks). Tables that share
//! devices or name them (open devices, rdma_cm's contexts, ids and
//! listeners) are kept in a [`PerProcess`] and read through [`lock_here`],
//! which empties them in a process other than the one that filled them.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

/// A value and the process it belongs to.
#[derive(Debug, Default)]
pub struct PerProcess<T> {
    pid: u32,
    v: T,
}

impl<T> PerProcess<T> {
    /// `v`, not yet claimed by a process (the first [`lock_here`] does).
    pub const fn new(v: T) -> Self {
        PerProcess { pid: 0, v }
    }
}

impl<T> Deref for PerProcess<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.v
    }
}

impl<T> DerefMut for PerProcess<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.v
    }
}

/// Locks `m`; in a process other than the one that filled it, first
/// replaces the value with `T::default()`. The old value is forgotten,
/// never dropped: dropping a parent's device would run its teardown, which
/// takes the locks that may be held for good in the child.
pub fn lock_here<T: Default>(m: &Mutex<PerProcess<T>>) -> MutexGuard<'_, PerProcess<T>> {
    let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    if g.pid != pid {
        std::mem::forget(std::mem::take(&mut g.v));
        g.pid = pid;
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_process_finds_it_empty() {
        let m = Mutex::new(PerProcess::new(Vec::new()));
        lock_here(&m).push(1);
        assert_eq!(
            **lock_here(&m),
            vec![1],
            "the same process keeps its entries"
        );
        // As a forked child sees it: filled by another pid.
        m.lock().unwrap().pid = std::process::id().wrapping_add(1);
        assert!(lock_here(&m).is_empty(), "a child starts afresh");
    }
}
