//! Device memory: `ibv_alloc_dm`, `ibv_memcpy_to_dm`/`_from_dm`,
//! `ibv_reg_dm_mr`, `ibv_free_dm`.
//!
//! On a NIC, device memory is a small on-chip SRAM (ConnectX's MEMIC:
//! 128–256 KiB) that the program fills through the PCI BAR and that RDMA
//! reaches without a trip to host memory. softrdma's "chip" is this
//! process, so its device memory is a page-aligned anonymous mapping per
//! allocation, from a pool of [`MAX_DM_SIZE`] bytes per device; what the
//! verbs promise is kept: copies in and out in 4-byte units within the
//! allocation (EINVAL otherwise, as mlx5 requires), regions over it that
//! are zero-based (their addresses are offsets into the DM, from 0), and
//! no freeing while a region uses it (EBUSY).

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;
use std::sync::{Arc, Mutex};

use crate::abi::*;
use crate::ffi::{fail_with, guard};
use crate::objects::{self, Mr, Pd};
use crate::verbs::ctx_of;

/// Device memory per device: what `max_dm_size` reports and what all
/// live allocations of a device may add up to (mlx5's MEMIC size).
pub const MAX_DM_SIZE: u64 = 256 * 1024;
/// Copies to and from device memory move 4-byte words: offsets and
/// lengths must be multiples of this.
const DM_WORD: u64 = 4;
/// The largest alignment an allocation can ask for (`log_align_req`):
/// a page, which every allocation has.
const MAX_LOG_ALIGN: u32 = 12;

/// `struct ibv_alloc_dm_attr`.
#[repr(C)]
pub struct ibv_alloc_dm_attr {
    pub length: usize,
    pub log_align_req: u32,
    pub comp_mask: u32,
}

/// `struct ibv_dm`.
#[repr(C)]
pub struct ibv_dm {
    pub context: *mut ibv_context,
    pub memcpy_to_dm: unsafe extern "C" fn(*mut ibv_dm, u64, *const c_void, usize) -> c_int,
    pub memcpy_from_dm: unsafe extern "C" fn(*mut c_void, *mut ibv_dm, u64, usize) -> c_int,
    pub comp_mask: u32,
    pub handle: u32,
}
const _: () = assert!(std::mem::size_of::<ibv_dm>() == 32);

/// Bytes of device memory in use, per device (its `ibv_device` address).
static IN_USE: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());

/// One allocation's memory: unmapped, and given back to its device's
/// pool, when the DM and every region over it are gone.
pub struct DmBuf {
    ptr: *mut u8,
    len: usize,
    device: usize,
}

// SAFETY: the mapping is plain memory owned by this value; the verbs
// contract makes the program serialise its own accesses to it.
unsafe impl Send for DmBuf {}
// SAFETY: as above.
unsafe impl Sync for DmBuf {}

impl Drop for DmBuf {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `len` bytes, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
        release(self.device, self.len as u64);
    }
}

/// A device memory allocation.
#[repr(C)]
pub struct Dm {
    pub ibv: ibv_dm,
    buf: Arc<DmBuf>,
    /// What the program asked for (the mapping is rounded up to pages).
    len: u64,
}

/// Takes `len` bytes from `device`'s pool, or says how much is left.
fn reserve(device: usize, len: u64) -> Result<(), u64> {
    let mut use_ = IN_USE.lock().unwrap_or_else(|e| e.into_inner());
    let i = match use_.iter().position(|e| e.0 == device) {
        Some(i) => i,
        None => {
            use_.push((device, 0));
            use_.len() - 1
        }
    };
    let left = MAX_DM_SIZE - use_[i].1;
    if len > left {
        return Err(left);
    }
    use_[i].1 += len;
    Ok(())
}

/// The `alloc_dm` slot of the verbs_context (`ibv_alloc_dm`).
pub unsafe extern "C" fn alloc_dm(
    context: *mut ibv_context,
    attr: *mut ibv_alloc_dm_attr,
) -> *mut ibv_dm {
    const VERB: &str = "ibv_alloc_dm";
    guard(null_mut(), || {
        if context.is_null() || attr.is_null() {
            fail_with(VERB, libc::EINVAL, "NULL context or attributes");
            return null_mut();
        }
        // SAFETY: readable attributes (the verb's contract).
        let a = unsafe { &*attr };
        if a.comp_mask != 0 {
            let why = format!("comp_mask {:#x}: no bit is defined", a.comp_mask);
            fail_with(VERB, libc::EINVAL, &why);
            return null_mut();
        }
        if a.length == 0 || a.length as u64 > MAX_DM_SIZE || a.log_align_req > MAX_LOG_ALIGN {
            let why = format!(
                "length {} (give 1 to max_dm_size {MAX_DM_SIZE}) or log_align_req {} (at most {MAX_LOG_ALIGN})",
                a.length, a.log_align_req
            );
            fail_with(VERB, libc::EINVAL, &why);
            return null_mut();
        }
        // SAFETY: a live context (the contract).
        let device = unsafe { (*context).device } as usize;
        // SAFETY: as above.
        match unsafe { new_dm(context, device, a.length) } {
            Ok(dm) => dm.cast(),
            Err((errno, why)) => {
                fail_with(VERB, errno, &why);
                null_mut()
            }
        }
    })
}

/// # Safety
/// `context` is live and `device` is its device's address.
unsafe fn new_dm(
    context: *mut ibv_context,
    device: usize,
    len: usize,
) -> Result<*mut Dm, (c_int, String)> {
    let page = 4096;
    let mapped = len.div_ceil(page) * page;
    reserve(device, mapped as u64).map_err(|left| {
        (
            libc::ENOMEM,
            format!("{len} bytes asked, {left} of the device's {MAX_DM_SIZE} left"),
        )
    })?;
    // SAFETY: a new private anonymous mapping; no pointer argument.
    let p = unsafe {
        libc::mmap(
            null_mut(),
            mapped,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    let buf = DmBuf {
        ptr: p.cast(),
        len: mapped,
        device,
    };
    if p == libc::MAP_FAILED {
        // Nothing to unmap: give the reservation back without the drop.
        std::mem::forget(buf);
        release(device, mapped as u64);
        return Err((libc::ENOMEM, std::io::Error::last_os_error().to_string()));
    }
    Ok(objects::leak(Dm {
        ibv: ibv_dm {
            context,
            memcpy_to_dm,
            memcpy_from_dm,
            comp_mask: 0,
            handle: 0,
        },
        buf: Arc::new(buf),
        len: len as u64,
    }))
}

/// Gives `len` bytes back to `device`'s pool.
fn release(device: usize, len: u64) {
    let mut use_ = IN_USE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = use_.iter_mut().find(|e| e.0 == device) {
        e.1 = e.1.saturating_sub(len);
    }
}

/// `offset..offset+len` inside `dm`, in whole words: the host range, or
/// EINVAL.
fn dm_range(dm: &Dm, offset: u64, len: usize, verb: &str) -> Result<*mut u8, c_int> {
    let end = offset.checked_add(len as u64);
    if !offset.is_multiple_of(DM_WORD)
        || !(len as u64).is_multiple_of(DM_WORD)
        || end.is_none_or(|e| e > dm.len)
    {
        let why = format!(
            "offset {offset} and length {len} must be multiples of {DM_WORD} within the {} bytes allocated",
            dm.len
        );
        return Err(fail_with(verb, libc::EINVAL, &why));
    }
    // SAFETY: offset + len <= dm.len <= the mapping's length.
    Ok(unsafe { dm.buf.ptr.add(offset as usize) })
}

/// `ibv_memcpy_to_dm` (through `dm->memcpy_to_dm`).
unsafe extern "C" fn memcpy_to_dm(
    dm: *mut ibv_dm,
    offset: u64,
    host: *const c_void,
    len: usize,
) -> c_int {
    const VERB: &str = "ibv_memcpy_to_dm";
    guard(libc::EIO, || {
        if dm.is_null() || (host.is_null() && len > 0) {
            return fail_with(VERB, libc::EINVAL, "NULL dm or host address");
        }
        // SAFETY: a live DM (the contract).
        let d = unsafe { &*dm.cast::<Dm>() };
        match dm_range(d, offset, len, VERB) {
            // SAFETY: `host` holds `len` readable bytes (the contract);
            // `to` is inside the DM.
            Ok(to) => unsafe {
                std::ptr::copy(host.cast::<u8>(), to, len);
                0
            },
            Err(e) => e,
        }
    })
}

/// `ibv_memcpy_from_dm` (through `dm->memcpy_from_dm`).
unsafe extern "C" fn memcpy_from_dm(
    host: *mut c_void,
    dm: *mut ibv_dm,
    offset: u64,
    len: usize,
) -> c_int {
    const VERB: &str = "ibv_memcpy_from_dm";
    guard(libc::EIO, || {
        if dm.is_null() || (host.is_null() && len > 0) {
            return fail_with(VERB, libc::EINVAL, "NULL dm or host address");
        }
        // SAFETY: a live DM (the contract).
        let d = unsafe { &*dm.cast::<Dm>() };
        match dm_range(d, offset, len, VERB) {
            // SAFETY: `host` has room for `len` bytes (the contract);
            // `from` is inside the DM.
            Ok(from) => unsafe {
                std::ptr::copy(from, host.cast::<u8>(), len);
                0
            },
            Err(e) => e,
        }
    })
}

/// The `free_dm` slot (`ibv_free_dm`): EBUSY while a region uses it.
pub unsafe extern "C" fn free_dm(dm: *mut ibv_dm) -> c_int {
    guard(libc::EIO, || {
        if dm.is_null() {
            return fail_with("ibv_free_dm", libc::EINVAL, "NULL dm");
        }
        let d = dm.cast::<Dm>();
        // SAFETY: a live DM (the contract).
        if Arc::strong_count(unsafe { &(*d).buf }) > 1 {
            return fail_with("ibv_free_dm", libc::EBUSY, "a memory region uses it");
        }
        // SAFETY: as above, freed once; the mapping goes with it.
        unsafe { objects::free(d) };
        0
    })
}

/// The `reg_dm_mr` slot (`ibv_reg_dm_mr`): a zero-based region over
/// `length` bytes of `dm` from `offset`.
pub unsafe extern "C" fn reg_dm_mr(
    pd: *mut ibv_pd,
    dm: *mut ibv_dm,
    offset: u64,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    const VERB: &str = "ibv_reg_dm_mr";
    guard(null_mut(), || {
        if pd.is_null() || dm.is_null() {
            fail_with(VERB, libc::EINVAL, "NULL pd or dm");
            return null_mut();
        }
        if access & IBV_ACCESS_ZERO_BASED == 0 {
            let why = "device memory regions are zero-based: add IBV_ACCESS_ZERO_BASED";
            fail_with(VERB, libc::EINVAL, why);
            return null_mut();
        }
        // SAFETY: live PD and DM (the contract).
        let (p, d) = unsafe { (&*pd.cast::<Pd>(), &*dm.cast::<Dm>()) };
        if offset.checked_add(length as u64).is_none_or(|e| e > d.len) {
            let why = format!(
                "offset {offset} + length {length} is beyond the {} bytes of the DM",
                d.len
            );
            fail_with(VERB, libc::EINVAL, &why);
            return null_mut();
        }
        // SAFETY: the range lies in the DM's mapping, which the region
        // keeps alive (its `dm`) until it is deregistered.
        unsafe { register_over(pd, p, d, offset, length, access) }
    })
}

/// # Safety
/// `offset..offset+length` lies inside `d`.
unsafe fn register_over(
    pd: *mut ibv_pd,
    p: &Pd,
    d: &Dm,
    offset: u64,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    const VERB: &str = "ibv_reg_dm_mr";
    let Ok(soft) = p.soft(VERB) else {
        return null_mut();
    };
    let (rights, _) = crate::verbs::access_flags(access as c_int);
    // SAFETY: inside the mapping (the contract); the region holds the
    // mapping alive below, so the memory outlives the registration.
    let r = unsafe {
        let at = d.buf.ptr.add(offset as usize);
        soft.register_raw_shared(at, length, 0, rights)
    };
    match r {
        Ok(mr) => {
            let m = objects::leak(Mr {
                ibv: ibv_mr {
                    context: p.ibv.context,
                    pd,
                    addr: null_mut(),
                    length,
                    handle: mr.lkey().raw(),
                    lkey: mr.lkey().raw(),
                    rkey: mr.rkey().raw(),
                },
                mr: Some(mr),
                dm: Some(d.buf.clone()),
            });
            // SAFETY: a live PD.
            unsafe { ctx_of(pd).objects().mrs.insert(m as usize) };
            m.cast()
        }
        Err(e) => {
            fail_with(VERB, e.errno(), &e.to_string());
            null_mut()
        }
    }
}
