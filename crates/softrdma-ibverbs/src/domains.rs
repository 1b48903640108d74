//! Thread domains (`ibv_alloc_td`) and parent domains
//! (`ibv_alloc_parent_domain`).
//!
//! On hardware a thread domain tells the provider that one thread drives
//! the objects of a parent domain, so it may give them a doorbell of their
//! own and drop their locks; a parent domain is a PD with such a thread
//! domain and, optionally, allocators for the provider's queue buffers.
//! softrdma keeps its queues in the engine, not in buffers the program
//! could place, and its locks are the device's, so neither changes what it
//! does: a thread domain is a handle, and a parent domain is the PD it was
//! made from under another pointer. The allocators (and `pd_context`) are
//! checked for a pair but never called, which the verbs allow: they are offered
//! to the provider, not promised to be used. What the verbs do check is
//! kept: a parent domain needs a PD of the same context, its thread domain
//! must be of that context too, and neither the PD nor the thread domain
//! can go while a parent domain uses it (EBUSY).

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::abi::*;
use crate::ffi::{fail_with, guard};
use crate::objects::{self, Pd};
use crate::verbs::ctx_of;

/// `struct ibv_td`.
#[repr(C)]
pub struct ibv_td {
    pub context: *mut ibv_context,
}

/// `struct ibv_td_init_attr`.
#[repr(C)]
pub struct ibv_td_init_attr {
    pub comp_mask: u32,
}

/// `struct ibv_parent_domain_init_attr`.
#[repr(C)]
pub struct ibv_parent_domain_init_attr {
    pub pd: *mut ibv_pd,
    pub td: *mut ibv_td,
    pub comp_mask: u32,
    pub alloc: *mut c_void,
    pub free: *mut c_void,
    pub pd_context: *mut c_void,
}
const _: () = assert!(std::mem::size_of::<ibv_parent_domain_init_attr>() == 48);

/// `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`, `_PD_CONTEXT`.
const PD_ATTR_ALLOCATORS: u32 = 1 << 0;
const PD_ATTR_PD_CONTEXT: u32 = 1 << 1;

/// A thread domain, and the parent domains that use it.
#[repr(C)]
pub struct Td {
    pub ibv: ibv_td,
    users: AtomicU32,
}

/// What makes a [`Pd`] a parent domain.
pub struct ParentDomain {
    /// The PD it was made from (its `children` counts this domain).
    pub of: *mut Pd,
    /// Its thread domain, or NULL (its `users` counts this domain).
    pub td: *mut Td,
}

/// The `alloc_td` slot of the verbs_context (`ibv_alloc_td`).
pub unsafe extern "C" fn alloc_td(
    context: *mut ibv_context,
    attr: *mut ibv_td_init_attr,
) -> *mut ibv_td {
    const VERB: &str = "ibv_alloc_td";
    guard(null_mut(), || {
        if context.is_null() || attr.is_null() {
            fail_with(VERB, libc::EINVAL, "NULL context or attributes");
            return null_mut();
        }
        // SAFETY: readable attributes (the verb's contract).
        let mask = unsafe { (*attr).comp_mask };
        if mask != 0 {
            fail_with(
                VERB,
                libc::EINVAL,
                &format!("comp_mask {mask:#x}: no bit is defined"),
            );
            return null_mut();
        }
        objects::leak(Td {
            ibv: ibv_td { context },
            users: AtomicU32::new(0),
        })
        .cast()
    })
}

/// The `dealloc_td` slot (`ibv_dealloc_td`): EBUSY while a parent domain
/// uses it.
pub unsafe extern "C" fn dealloc_td(td: *mut ibv_td) -> c_int {
    guard(libc::EIO, || {
        if td.is_null() {
            return fail_with("ibv_dealloc_td", libc::EINVAL, "NULL td");
        }
        let t = td.cast::<Td>();
        // SAFETY: a live thread domain of this library (the contract).
        if unsafe { (*t).users.load(Ordering::Acquire) } > 0 {
            return fail_with("ibv_dealloc_td", libc::EBUSY, "a parent domain uses it");
        }
        // SAFETY: as above, freed once.
        unsafe { objects::free(t) };
        0
    })
}

/// The `alloc_parent_domain` slot (`ibv_alloc_parent_domain`).
pub unsafe extern "C" fn alloc_parent_domain(
    context: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    const VERB: &str = "ibv_alloc_parent_domain";
    guard(null_mut(), || {
        if context.is_null() || attr.is_null() {
            fail_with(VERB, libc::EINVAL, "NULL context or attributes");
            return null_mut();
        }
        // SAFETY: readable attributes (the verb's contract).
        let a = unsafe { &*attr };
        match check_domain_attr(context, a) {
            // SAFETY: checked live PD and TD of this context.
            Ok(()) => unsafe { new_domain(context, a) },
            Err(why) => {
                fail_with(VERB, libc::EINVAL, &why);
                null_mut()
            }
        }
    })
}

/// What `ibv_alloc_parent_domain` refuses (EINVAL), as rdma-core's
/// providers do: unknown mask bits, no PD, a PD that is itself a parent
/// domain, a PD or thread domain of another context, one allocator
/// without the other.
fn check_domain_attr(
    context: *mut ibv_context,
    a: &ibv_parent_domain_init_attr,
) -> Result<(), String> {
    if a.comp_mask & !(PD_ATTR_ALLOCATORS | PD_ATTR_PD_CONTEXT) != 0 {
        return Err(format!("comp_mask {:#x} has unknown bits", a.comp_mask));
    }
    if a.pd.is_null() {
        return Err("pd is NULL: a parent domain is made from a PD".into());
    }
    // SAFETY: a live PD of this library (the verb's contract).
    let p = unsafe { &*a.pd.cast::<Pd>() };
    if p.domain.is_some() {
        return Err("pd is a parent domain; give the PD it was made from".into());
    }
    if p.ibv.context != context {
        return Err("pd belongs to another context".into());
    }
    // SAFETY: a live thread domain of this library, when not NULL.
    if !a.td.is_null() && unsafe { (*a.td).context } != context {
        return Err("td belongs to another context".into());
    }
    if a.comp_mask & PD_ATTR_ALLOCATORS != 0 && (a.alloc.is_null() != a.free.is_null()) {
        return Err("IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS needs both alloc and free".into());
    }
    Ok(())
}

/// # Safety
/// `a` passed [`check_domain_attr`] for `context`.
unsafe fn new_domain(context: *mut ibv_context, a: &ibv_parent_domain_init_attr) -> *mut ibv_pd {
    let of = a.pd.cast::<Pd>();
    let td = a.td.cast::<Td>();
    // SAFETY: live objects, per the contract.
    unsafe {
        (*of).children.fetch_add(1, Ordering::AcqRel);
        if !td.is_null() {
            (*td).users.fetch_add(1, Ordering::AcqRel);
        }
    }
    let d = objects::leak(Pd {
        ibv: ibv_pd {
            context,
            // SAFETY: a live PD.
            handle: unsafe { (*of).ibv.handle },
        },
        pd: None,
        domain: Some(ParentDomain { of, td }),
        children: AtomicU32::new(0),
    });
    // SAFETY: a live context.
    unsafe { ctx_of(d).objects().pds.insert(d as usize) };
    d.cast()
}

/// `ibv_dealloc_pd` of a parent domain: frees it and releases its PD and
/// thread domain.
///
/// # Safety
/// `d` is a live parent domain of this library.
pub unsafe fn dealloc_domain(d: *mut Pd) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        if let Some(dom) = &(*d).domain {
            (*dom.of).children.fetch_sub(1, Ordering::AcqRel);
            if !dom.td.is_null() {
                (*dom.td).users.fetch_sub(1, Ordering::AcqRel);
            }
        }
        ctx_of(d).objects().pds.remove(&(d as usize));
        objects::free(d);
    }
    0
}
