//! Grants: the regions of one device that a same-host peer may reach
//! directly, and the fence that takes them back.
//!
//! A peer never maps anything of ours it was not granted. To reach a
//! region directly it asks (`GRANT_REQUEST`: the rkey, its QP, our QP, the
//! right), and the first operations go through our engine meanwhile. We
//! check the request with the engine's rules (`Engine::check_grant`: our QP
//! is connected to that peer and QP, in a state that takes requests, has
//! the right; the region has the key, the PD and the right) and answer with
//! the region's own memfd (`segment.rs`) and its facts, or refuse.
//!
//! Each direction of a link has a table of [`GRANT_SLOTS`] entries in the
//! link's shared segment, written by the granter: a control word (the
//! granter's state bits and the count of the peer's operations inside the
//! region, `fence.rs`), a generation and the rkey. An operation enters by
//! incrementing the count with a read-modify-write that also reads the
//! state, then checks the generation and rkey of its grant; a revocation
//! sets the revoked bit with a read-modify-write of the same word, then
//! waits (bounded) until the count is zero. On one word, every change is
//! in one modification order: once the wait ends no operation that saw
//! the grant valid is still inside. Deregistration then punches the
//! segment out, so even a peer that ignores the fence reaches nothing but
//! zeros.
//!
//! Grants are taken back when the region is deregistered, and when our QP
//! no longer passes the QP checks (a modify, an error, destroy). A grant
//! does not move the region's pages: a peer keeps its mapping until the
//! region is deregistered (docs/shm.md, trust model).

use softrdma_engine::{Qpn, Rkey};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::fence;
use crate::linkmsg::{Grant, GRANT_SLOTS};

/// Bytes of one direction's table.
pub const TABLE_LEN: usize = GRANT_SLOTS as usize * ENTRY;
const ENTRY: usize = 16;

/// How long a revocation waits for operations inside the region to leave.
pub const REVOKE_WAIT: Duration = Duration::from_millis(200);
/// After a refusal (or while a request is unanswered), how long before the
/// same rkey is asked for again.
pub const ASK_AGAIN: Duration = Duration::from_millis(50);

/// One direction's grant table in a link's shared segment (a zero entry is
/// free): per slot, the control word of `fence.rs`, a spare word, the
/// generation and the rkey.
#[derive(Clone, Copy)]
pub struct Table {
    base: *mut u8,
}

// SAFETY: the table is shared memory reached only through atomics.
unsafe impl Send for Table {}
// SAFETY: as above.
unsafe impl Sync for Table {}

impl Table {
    /// # Safety
    /// `base` points to [`TABLE_LEN`] bytes of a live shared mapping,
    /// 4-aligned, that outlives every use of the table.
    pub unsafe fn new(base: *mut u8) -> Table {
        Table { base }
    }

    fn word(&self, slot: u32, i: usize) -> &AtomicU32 {
        let s = (slot % GRANT_SLOTS) as usize;
        // SAFETY: the slot is reduced into the table and `i < 4`, so the
        // word lies inside the mapping `new` was given; 4-aligned.
        unsafe { AtomicU32::from_ptr(self.base.add(s * ENTRY + (i & 3) * 4).cast()) }
    }
    fn ctl(&self, slot: u32) -> &AtomicU32 {
        self.word(slot, 0)
    }
    fn gen(&self, slot: u32) -> &AtomicU32 {
        self.word(slot, 2)
    }
    fn rkey(&self, slot: u32) -> &AtomicU32 {
        self.word(slot, 3)
    }
}

/// A grant this device gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutGrant {
    pub rkey: Rkey,
    pub target_qpn: Qpn,
    /// The peer's QP and the right it asked for (to check the grant again).
    pub requester_qpn: Qpn,
    pub access: u32,
    /// The region's and the QP's access flags as granted: a grant stands
    /// only while both are still what the peer was told.
    pub region_access: u32,
    pub qp_access: u32,
    pub slot: u32,
    pub gen: u32,
}

/// The grants this device gave over one link (it writes their table).
pub struct OutGrants {
    table: Table,
    given: Vec<Option<OutGrant>>,
    next_gen: u32,
}

impl OutGrants {
    pub fn new(table: Table) -> Self {
        OutGrants {
            table,
            given: vec![None; GRANT_SLOTS as usize],
            next_gen: 1,
        }
    }

    /// Grants what `req` asks, telling the peer `facts` (the region's and
    /// the QP's access flags); the same grant again if it stands. `None`
    /// when every slot is taken.
    pub fn give(
        &mut self,
        req: &crate::linkmsg::GrantRequest,
        (region_access, qp_access): (u32, u32),
    ) -> Option<OutGrant> {
        let (rkey, target_qpn) = (req.rkey, req.target_qpn);
        if let Some(g) = self.given.iter().flatten().find(|g| {
            g.rkey == rkey
                && g.target_qpn == target_qpn
                && g.requester_qpn == req.requester_qpn
                && (g.region_access, g.qp_access) == (region_access, qp_access)
        }) {
            return Some(*g);
        }
        // A slot with an operation still inside (or whose count the peer
        // left non-zero) is not reused.
        let t = &self.table;
        let gen = self.next_gen;
        let slot = (0..GRANT_SLOTS).find(|&s| {
            if self.given[s as usize].is_some() || fence::inside(t.ctl(s)) != 0 {
                return false;
            }
            // No operation can enter before `validate` marks the slot.
            t.rkey(s).store(rkey.raw(), Ordering::Release);
            t.gen(s).store(gen, Ordering::Release);
            fence::validate(t.ctl(s))
        })?;
        self.next_gen = self.next_gen.wrapping_add(1).max(1);
        let g = OutGrant {
            rkey,
            target_qpn,
            requester_qpn: req.requester_qpn,
            access: req.access,
            region_access,
            qp_access,
            slot,
            gen,
        };
        self.given[slot as usize] = Some(g);
        Some(g)
    }

    /// Revokes every grant `which` selects; returns their slots, for
    /// [`OutGrants::wait_left`].
    pub fn revoke(&mut self, mut which: impl FnMut(&OutGrant) -> bool) -> Vec<u32> {
        let mut slots = Vec::new();
        for e in self.given.iter_mut() {
            if let Some(g) = e.filter(|g| which(g)) {
                fence::revoke(self.table.ctl(g.slot));
                slots.push(g.slot);
                *e = None;
            }
        }
        slots
    }

    /// The grants standing.
    pub fn standing(&self) -> impl Iterator<Item = &OutGrant> {
        self.given.iter().flatten()
    }

    /// Waits until no operation is inside the revoked `slots`, until
    /// `deadline`. False when one still is then (a peer stalled or gone
    /// mid-operation, or one that lies about its count).
    pub fn wait_left(&self, slots: &[u32], deadline: Instant) -> bool {
        loop {
            if slots.iter().all(|&s| fence::inside(self.table.ctl(s)) == 0) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::yield_now();
        }
    }
}

/// A region of the peer granted to this device, mapped here.
pub struct InGrant {
    pub grant: Grant,
    map: *mut u8,
    map_len: usize,
}

// SAFETY: the mapping is shared memory reached by raw copies and atomics.
unsafe impl Send for InGrant {}

impl InGrant {
    /// Checks a grant and its memfd (sealed, large enough) and maps it.
    pub fn install(grant: Grant, fd: &OwnedFd) -> Result<InGrant, String> {
        let size = crate::sys::fd_size(fd.as_raw_fd()).map_err(|e| e.to_string())?;
        crate::linkmsg::check_grant_fits(&grant, size)?;
        crate::shm::check_sealed_memfd(fd, size as usize)?;
        let map = crate::sys::map_shared(fd.as_raw_fd(), size as usize)
            .map_err(|e| format!("cannot map a granted region: {e}"))?;
        Ok(InGrant {
            grant,
            map,
            map_len: size as usize,
        })
    }

    /// The address of `len` bytes at `off` in the region, when inside it.
    pub fn ptr(&self, off: u64, len: u64) -> Option<*mut u8> {
        let end = off.checked_add(len)?;
        if end > self.grant.len {
            return None;
        }
        let at = self.grant.offset.checked_add(off)?;
        // Inside the mapping: `offset + len <= map_len` was checked at install.
        // SAFETY: `at + len <= grant.offset + grant.len <= map_len`.
        Some(unsafe { self.map.add(at as usize) })
    }
}

impl Drop for InGrant {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `install` mapped, once.
        unsafe { libc::munmap(self.map.cast(), self.map_len) };
    }
}

/// The grants this device holds over one link.
pub struct InGrants {
    table: Table,
    /// By (rkey, the granter's QP): a grant is for one QP pair.
    by_key: crate::keymap::KeyMap<(Rkey, Qpn), InGrant>,
    /// Requests unanswered or refused, with when they were made.
    asked: crate::keymap::KeyMap<(Rkey, Qpn), Instant>,
    /// Requests refused, with when.
    refusals: crate::keymap::KeyMap<(Rkey, Qpn), Instant>,
}

/// An operation inside a granted region: holds the peer's fence.
pub struct Inside<'a> {
    table: Table,
    slot: u32,
    pub grant: &'a InGrant,
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        fence::leave(self.table.ctl(self.slot));
    }
}

/// Why no operation can enter a region directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotGranted {
    /// No grant for the rkey (ask for one).
    Missing,
    /// The grant was taken back (forget it).
    Revoked,
}

impl InGrants {
    pub fn new(table: Table) -> Self {
        InGrants {
            table,
            by_key: Default::default(),
            asked: Default::default(),
            refusals: Default::default(),
        }
    }

    /// Enters the region granted under `rkey` through the peer's QP `qpn`.
    pub fn enter(&self, rkey: Rkey, qpn: Qpn) -> Result<Inside<'_>, NotGranted> {
        let g = self.by_key.get(&(rkey, qpn)).ok_or(NotGranted::Missing)?;
        let (t, slot) = (self.table, g.grant.slot);
        if !fence::enter(t.ctl(slot)) {
            return Err(NotGranted::Revoked);
        }
        // The slot may hold another grant now: this one's generation?
        if t.gen(slot).load(Ordering::Acquire) != g.grant.gen
            || t.rkey(slot).load(Ordering::Acquire) != rkey.raw()
        {
            fence::leave(t.ctl(slot));
            return Err(NotGranted::Revoked);
        }
        Ok(Inside {
            table: t,
            slot,
            grant: g,
        })
    }

    /// Forgets a grant found revoked (unmapping its region).
    pub fn forget(&mut self, rkey: Rkey, qpn: Qpn) {
        self.by_key.remove(&(rkey, qpn));
    }

    /// True when `rkey` through `qpn` may be asked for now (and notes that it is).
    pub fn ask(&mut self, rkey: Rkey, qpn: Qpn) -> bool {
        let now = Instant::now();
        if self
            .asked
            .get(&(rkey, qpn))
            .is_some_and(|t| now.duration_since(*t) < ASK_AGAIN)
        {
            return false;
        }
        // Bounded: requests a peer never answers do not pile up.
        if self.asked.len() >= 4096 {
            self.asked.retain(|_, t| now.duration_since(*t) < ASK_AGAIN);
        }
        self.asked.insert((rkey, qpn), now);
        true
    }

    /// Installs a grant received with its memfd.
    pub fn install(&mut self, g: Grant, fd: &OwnedFd) -> Result<(), String> {
        if self.by_key.len() >= 4 * GRANT_SLOTS as usize {
            return Err("more grants than the peer's table holds".into());
        }
        let ig = InGrant::install(g, fd)?;
        self.asked.remove(&(g.rkey, g.target_qpn));
        self.refusals.remove(&(g.rkey, g.target_qpn));
        self.by_key.insert((g.rkey, g.target_qpn), ig);
        Ok(())
    }

    /// Grants held.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.by_key.len()
    }

    /// Forgets every grant and request (tests that ask again at once).
    #[cfg(test)]
    pub fn forget_all(&mut self) {
        self.by_key.clear();
        self.asked.clear();
        self.refusals.clear();
    }

    /// Notes a refusal: the rkey is not asked for again for a while.
    pub fn refused(&mut self, rkey: Rkey, qpn: Qpn) {
        let now = Instant::now();
        self.asked.insert((rkey, qpn), now);
        if self.refusals.len() >= 4096 {
            self.refusals
                .retain(|_, t| now.duration_since(*t) < ASK_AGAIN);
        }
        self.refusals.insert((rkey, qpn), now);
        self.by_key.remove(&(rkey, qpn));
    }

    /// True when `rkey` through `qpn` was refused lately.
    pub fn was_refused(&self, rkey: Rkey, qpn: Qpn) -> bool {
        self.refusals
            .get(&(rkey, qpn))
            .is_some_and(|t| t.elapsed() < ASK_AGAIN)
    }
}

/// The two tables of a link segment that starts at `base` with `rings`
/// bytes of rings: (this device's grants, the peer's), by who made the link.
///
/// # Safety
/// `base` points to a live shared mapping of at least `rings + 2 *
/// TABLE_LEN` bytes, `rings` a multiple of 4, outliving both tables.
pub unsafe fn tables(base: *mut u8, rings: usize, made_here: bool) -> (Table, Table) {
    // SAFETY: both tables lie inside the mapping (contract).
    let (a, b) = unsafe {
        (
            Table::new(base.add(rings)),
            Table::new(base.add(rings + TABLE_LEN)),
        )
    };
    if made_here {
        (a, b)
    } else {
        (b, a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_engine::PdHandle;

    fn table_mem() -> Vec<u32> {
        vec![0u32; TABLE_LEN / 4]
    }

    fn grant(slot: u32, gen: u32, rkey: Rkey) -> Grant {
        Grant {
            rkey,
            target_qpn: Qpn::from_raw(5),
            slot,
            gen,
            pd: PdHandle::from_raw(1),
            access: 0xf,
            qp_access: 0xe,
            iova: 0x1000,
            len: 4096,
            offset: 0,
        }
    }

    #[test]
    fn a_revoked_grant_lets_nothing_in_and_revocation_waits_for_those_inside() {
        let mut mem = table_mem();
        // SAFETY: the vector holds TABLE_LEN bytes, 4-aligned, for the test.
        let t = unsafe { Table::new(mem.as_mut_ptr().cast()) };
        let mut out = OutGrants::new(t);
        let req = crate::linkmsg::GrantRequest {
            rkey: Rkey::from_raw(0x77),
            requester_qpn: Qpn::from_raw(3),
            target_qpn: Qpn::from_raw(5),
            access: 2,
        };
        let g = out.give(&req, (0xf, 0xe)).unwrap();
        assert_eq!(out.give(&req, (0xf, 0xe)), Some(g), "the same grant again");
        let seg = crate::segment::Segment::alloc(4096).unwrap();
        // SAFETY: a fresh descriptor of the segment's memfd.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(libc::dup(seg.fd())) };
        let mut inn = InGrants::new(t);
        inn.install(grant(g.slot, g.gen, Rkey::from_raw(0x77)), &fd)
            .unwrap();
        let inside = inn
            .enter(Rkey::from_raw(0x77), Qpn::from_raw(5))
            .expect("valid grant");
        let slots = out.revoke(|x| x.rkey == Rkey::from_raw(0x77));
        assert!(!out.wait_left(&slots, Instant::now() + Duration::from_millis(5)));
        drop(inside);
        assert!(out.wait_left(&slots, Instant::now()));
        assert_eq!(
            inn.enter(Rkey::from_raw(0x77), Qpn::from_raw(5)).err(),
            Some(NotGranted::Revoked)
        );
        assert_eq!(
            inn.enter(Rkey::from_raw(0x78), Qpn::from_raw(5)).err(),
            Some(NotGranted::Missing)
        );
        // A new grant in the slot has a new generation: the old one stays out.
        let g2 = out.give(&req, (0xf, 0xe)).unwrap();
        assert_ne!(g2.gen, g.gen);
        assert_eq!(
            inn.enter(Rkey::from_raw(0x77), Qpn::from_raw(5)).err(),
            Some(NotGranted::Revoked)
        );
    }

    #[test]
    fn a_grant_must_fit_its_segment() {
        use crate::linkmsg::{check_grant_fits as check_fits, MAX_SEGMENT};
        let g = grant(0, 1, Rkey::from_raw(1));
        assert!(check_fits(&g, 4096).is_ok());
        assert!(check_fits(&g, 4095).is_err());
        assert!(check_fits(&Grant { offset: 1, ..g }, 4096).is_err());
        assert!(check_fits(
            &Grant {
                offset: u64::MAX,
                ..g
            },
            4096
        )
        .is_err());
        assert!(check_fits(&g, 0).is_err());
        assert!(check_fits(&g, MAX_SEGMENT + 1).is_err());
    }

    #[test]
    fn pointers_stay_inside_the_region() {
        let seg = crate::segment::Segment::alloc(8192).unwrap();
        // SAFETY: a fresh descriptor of the segment's memfd.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(libc::dup(seg.fd())) };
        let g = Grant {
            offset: 4096,
            len: 4096,
            ..grant(0, 1, Rkey::from_raw(1))
        };
        let ig = InGrant::install(g, &fd).unwrap();
        assert!(ig.ptr(0, 4096).is_some());
        assert!(ig.ptr(1, 4096).is_none());
        assert!(ig.ptr(u64::MAX, 2).is_none());
        assert!(ig.ptr(4096, 0).is_some());
        assert!(ig.ptr(4097, 0).is_none());
    }
}
