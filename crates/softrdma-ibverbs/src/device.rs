//! Devices and contexts: `ibv_get_device_list`, `ibv_open_device`, the
//! query verbs, GIDs and P_Keys, asynchronous events, and the small
//! process-wide helpers (sysfs, fork).
//!
//! The device list comes from softrdma's configuration (SOFTRDMA_DEVICES or
//! the default loopback device `srx0`) and is built on first use, never in
//! a constructor: provider libraries that perftest links call into this
//! library while it is still being loaded. Listing devices opens nothing;
//! a device binds its UDP socket and starts its progress thread when
//! `ibv_open_device` opens it.

use std::ffi::{c_char, c_int, c_void, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::ptr::{self, null_mut};
use std::sync::{Mutex, OnceLock};

use softrdma::per_process::{lock_here, PerProcess};
use softrdma::{Context, DeviceConfig};

use crate::abi::*;
use crate::convert;
use crate::ffi::{self, guard};
use crate::objects::{self, Chan, Ctx, Dev, Objects};
use crate::verbs;

/// The device list, built once per process (addresses of leaked [`Dev`]s).
fn devices() -> Result<&'static [usize], c_int> {
    static LIST: OnceLock<Result<Vec<usize>, c_int>> = OnceLock::new();
    LIST.get_or_init(|| match softrdma::devices() {
        Ok(cfgs) => Ok(cfgs
            .into_iter()
            .enumerate()
            .map(|(i, cfg)| objects::leak(new_dev(i as i32, cfg)) as usize)
            .collect()),
        Err(e) => {
            eprintln!("softrdma: {e}");
            Err(e.errno())
        }
    })
    .as_ref()
    .map(|v| v.as_slice())
    .map_err(|e| *e)
}

fn copy_str(dst: &mut [c_char], s: &str) {
    let n = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
}

/// `ibv_device.dev_name` of every softrdma device: clients that check
/// `/dev/infiniband/<dev_name>` find `/dev/infiniband/softrdma`.
pub const DEV_NODE_NAME: &str = "softrdma";

fn new_dev(index: i32, cfg: DeviceConfig) -> Dev {
    let mut ibv = ibv_device {
        _ops: [null_mut(); 2],
        node_type: IBV_NODE_CA,
        transport_type: IBV_TRANSPORT_IB,
        name: [0; 64],
        dev_name: [0; 64],
        dev_path: [0; 256],
        ibdev_path: [0; 256],
    };
    copy_str(&mut ibv.name, &cfg.name);
    // dev_name names the node under /dev/infiniband a device is opened
    // through (rdma-core: uverbsN). softrdma opens none, so every device
    // names one shared stand-in that never collides with a real uverbsN:
    // UCX uses a device only when /dev/infiniband/<dev_name> is a character
    // device the user can read and write (docs/ecosystem.md).
    copy_str(&mut ibv.dev_name, DEV_NODE_NAME);
    copy_str(
        &mut ibv.dev_path,
        &format!("/sys/class/infiniband_verbs/uverbs{index}"),
    );
    copy_str(
        &mut ibv.ibdev_path,
        &format!("/sys/class/infiniband/{}", cfg.name),
    );
    // A locally administered, name-derived GUID (FNV-1a of the name): stable
    // across runs without opening the device.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in cfg.name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    let guid = 0x0250_5600_0000_0000 | (h & 0x00FF_FFFF_FFFF);
    Dev {
        ibv,
        cfg,
        index,
        guid_be: guid.to_be(),
        open: Mutex::new(PerProcess::new(None)),
    }
}

/// # Safety
/// `device` must come from this library's device list.
unsafe fn dev<'a>(device: *mut ibv_device) -> Option<&'a Dev> {
    // SAFETY: Dev is repr(C) with the ibv_device first, and devices are
    // never freed; NULL is rejected.
    unsafe { device.cast::<Dev>().as_ref() }
}

/// Returns the NULL-terminated device array (calloc'ed, freed by
/// `ibv_free_device_list`).
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    guard(null_mut(), || {
        let list = match devices() {
            Ok(l) => l,
            Err(e) => {
                ffi::set_errno(e);
                return null_mut();
            }
        };
        // SAFETY: calloc of n+1 pointers; checked for NULL below.
        let arr = unsafe { libc::calloc(list.len() + 1, std::mem::size_of::<usize>()) }
            .cast::<*mut ibv_device>();
        if arr.is_null() {
            ffi::set_errno(libc::ENOMEM);
            return null_mut();
        }
        for (i, d) in list.iter().enumerate() {
            // SAFETY: i < len + 1, inside the allocation.
            unsafe { *arr.add(i) = *d as *mut ibv_device };
        }
        if !num_devices.is_null() {
            // SAFETY: the caller passes a valid int pointer or NULL.
            unsafe { *num_devices = list.len() as c_int };
        }
        arr
    })
}

pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: list came from ibv_get_device_list's calloc (or is NULL).
    guard((), || unsafe { libc::free(list.cast()) })
}

pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    // SAFETY: a device from the list (or NULL), the libibverbs contract.
    guard(ptr::null(), || match unsafe { dev(device) } {
        Some(d) => d.ibv.name.as_ptr(),
        None => ptr::null(),
    })
}

pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    // SAFETY: a device from the list (or NULL), the libibverbs contract.
    guard(0, || unsafe { dev(device) }.map_or(0, |d| d.guid_be))
}

pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    // SAFETY: a device from the list (or NULL), the libibverbs contract.
    guard(-1, || unsafe { dev(device) }.map_or(-1, |d| d.index))
}

/// Opens the device: binds its UDP socket and starts its progress thread.
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    guard(null_mut(), || {
        // SAFETY: a device from the list (or NULL), the libibverbs contract.
        let Some(d) = (unsafe { dev(device) }) else {
            ffi::fail_with("ibv_open_device", libc::EINVAL, "NULL device");
            return null_mut();
        };
        let (ctx, fresh) = match open_shared(d) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("softrdma: cannot open device {}: {e}", d.cfg.name);
                ffi::set_errno(e.errno());
                return null_mut();
            }
        };
        let async_fd = ctx.async_fd();
        // A fresh fd is blocking, as a kernel uverbs fd is. The contexts of
        // one open device share their async fd (and its file status
        // flags), so a later open must not undo the O_NONBLOCK a program
        // set on it: UCX makes its context's fd non-blocking, then its
        // rdmacm transport makes librdmacm open the device again, and a
        // blocking fd left its async thread blocked in
        // ibv_get_async_event for good (ucp_cleanup then waits for it).
        if fresh {
            ffi::set_blocking(async_fd);
        }
        let c = objects::leak(Ctx {
            vctx: new_vctx(device, async_fd),
            dev: ctx,
            objs: Mutex::new(Objects::default()),
            pending_events: Mutex::new(Default::default()),
        });
        // SAFETY: just allocated.
        add_context(d, unsafe { &(*c).dev }, c as usize);
        // SAFETY: just allocated, live until ibv_close_device.
        unsafe { (*c).as_ibv() }
    })
}

/// The device's soft HCA: the one another context of this process has
/// open, or a newly opened one. rdma-core's test suite, for one, puts both
/// ends of a connection on two contexts of one device and addresses the
/// peer by its own GID, which only works if both are the same HCA.
/// The device's HCA: the one its open contexts share, or a new one
/// (`true`: its async fd is new too).
fn open_shared(d: &Dev) -> softrdma::Result<(Context, bool)> {
    // Never the HCA of the parent of a forked process (`lock_here`).
    let open = lock_here(&d.open);
    if let Some((c, _)) = open.as_ref() {
        return Ok((c.clone(), false));
    }
    Ok((Context::open_with(&d.cfg)?, true))
}

/// Records an open context of `d` (with the HCA it opened).
fn add_context(d: &Dev, dev: &Context, ctx: usize) {
    let mut open = lock_here(&d.open);
    open.get_or_insert_with(|| (dev.clone(), Vec::new()))
        .1
        .push(ctx);
}

/// At `ibv_close_device`: the last context lets the HCA go (it closes once
/// the objects that hold it are gone too).
fn close_shared(d: &Dev, ctx: usize) {
    let mut open = lock_here(&d.open);
    if let Some((_, ctxs)) = open.as_mut() {
        ctxs.retain(|&c| c != ctx);
        if ctxs.is_empty() {
            **open = None;
        }
    }
}

/// Hands an async event to the other context of `c`'s device whose object
/// `find` names, if any. Under the device's lock, so that context cannot be
/// freed meanwhile (`ibv_close_device` leaves the list under it first).
fn hand_to_sibling(c: &Ctx, find: impl Fn(&Ctx) -> Option<*mut c_void>, event_type: u32) {
    // SAFETY: a context's device pointer is its Dev from the list.
    let Some(d) = (unsafe { dev(c.vctx.context.device) }) else {
        return;
    };
    let open = lock_here(&d.open);
    let me = c as *const Ctx as usize;
    for &a in open.iter().flat_map(|(_, v)| v).filter(|&&a| a != me) {
        // SAFETY: an open context of the device: it leaves this list (under
        // the lock held here) before it is freed.
        let other = unsafe { &*(a as *const Ctx) };
        if let Some(element) = find(other) {
            other
                .pending_events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_back(ibv_async_event {
                    element,
                    event_type,
                });
            return;
        }
    }
}

/// The context's `cmd_fd`: rdma-core's is the kernel's uverbs file; here an
/// fd of `/dev/null` the context owns (closed with it), so that a program
/// that dups or polls it gets a valid descriptor — and `ibv_import_device`
/// of it a clean EOPNOTSUPP. -1 if it cannot be opened.
fn context_fd() -> c_int {
    // SAFETY: a NUL-terminated path; no pointer is kept.
    unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) }
}

fn new_vctx(device: *mut ibv_device, async_fd: c_int) -> verbs_context {
    let n = null_mut();
    verbs_context {
        query_port: Some(query_port_ex),
        advise_mr: verbs::advise_mr as *mut c_void,
        alloc_null_mr: n,
        read_counters: n,
        attach_counters_point_flow: n,
        create_counters: n,
        destroy_counters: n,
        reg_dm_mr: crate::dm::reg_dm_mr as *mut c_void,
        alloc_dm: crate::dm::alloc_dm as *mut c_void,
        free_dm: crate::dm::free_dm as *mut c_void,
        modify_flow_action_esp: n,
        destroy_flow_action: n,
        create_flow_action_esp: n,
        modify_qp_rate_limit: n,
        alloc_parent_domain: crate::domains::alloc_parent_domain as *mut c_void,
        dealloc_td: crate::domains::dealloc_td as *mut c_void,
        alloc_td: crate::domains::alloc_td as *mut c_void,
        modify_cq: n,
        post_srq_ops: n,
        destroy_rwq_ind_table: n,
        create_rwq_ind_table: n,
        destroy_wq: n,
        modify_wq: n,
        create_wq: n,
        query_rt_values: n,
        create_cq_ex: crate::cq_ex::create_cq_ex as *mut c_void,
        priv_: n,
        query_device_ex: Some(query_device_ex),
        ibv_destroy_flow: n,
        abi_placeholder2: n,
        ibv_create_flow: n,
        abi_placeholder1: n,
        open_qp: n,
        create_qp_ex: crate::qp_ex::create_qp_ex as *mut c_void,
        get_srq_num: crate::xrc::get_srq_num as *mut c_void,
        create_srq_ex: crate::xrc::create_srq_ex as *mut c_void,
        open_xrcd: crate::xrc::open_xrcd as *mut c_void,
        close_xrcd: crate::xrc::close_xrcd as *mut c_void,
        abi_placeholder3: 0,
        sz: std::mem::size_of::<verbs_context>(),
        context: ibv_context {
            device,
            ops: ibv_context_ops {
                _compat_query_device: n,
                _compat_query_port: n,
                _compat_alloc_pd: n,
                _compat_dealloc_pd: n,
                _compat_reg_mr: n,
                _compat_rereg_mr: n,
                _compat_dereg_mr: n,
                alloc_mw: Some(crate::mw::alloc_mw),
                bind_mw: Some(crate::mw::bind_mw),
                dealloc_mw: Some(crate::mw::dealloc_mw),
                _compat_create_cq: n,
                poll_cq: Some(verbs::poll_cq),
                req_notify_cq: Some(verbs::req_notify_cq),
                _compat_cq_event: n,
                _compat_resize_cq: n,
                _compat_destroy_cq: n,
                _compat_create_srq: n,
                _compat_modify_srq: n,
                _compat_query_srq: n,
                _compat_destroy_srq: n,
                post_srq_recv: Some(verbs::post_srq_recv),
                _compat_create_qp: n,
                _compat_query_qp: n,
                _compat_modify_qp: n,
                _compat_destroy_qp: n,
                post_send: Some(verbs::post_send),
                post_recv: Some(verbs::post_recv),
                _compat_create_ah: n,
                _compat_destroy_ah: n,
                _compat_attach_mcast: n,
                _compat_detach_mcast: n,
                _compat_async_event: n,
            },
            cmd_fd: context_fd(),
            async_fd,
            num_comp_vectors: 1,
            mutex: objects::new_mutex(),
            abi_compat: VERBS_ABI_IS_EXTENDED,
        },
    }
}

/// Closes the device. Objects the program left open on it are destroyed,
/// as the kernel does for rdma-core (their C structs stay allocated, and
/// verbs on them fail with EINVAL); the device's socket and thread go away
/// with its last context.
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    guard(libc::EIO, || {
        if context.is_null() {
            return ffi::fail_with("ibv_close_device", libc::EINVAL, "NULL context");
        }
        // SAFETY: a live context from ibv_open_device, freed exactly once
        // here, after the objects the program left open on it.
        unsafe {
            let c = Ctx::from_ptr(context);
            c.release_objects();
            if let Some(d) = dev(c.vctx.context.device) {
                close_shared(d, c as *const Ctx as usize);
            }
            if c.vctx.context.cmd_fd >= 0 {
                libc::close(c.vctx.context.cmd_fd);
            }
            objects::free(c as *const Ctx as *mut Ctx);
        }
        0
    })
}

/// `ibv_query_device`.
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    guard(libc::EIO, || {
        if context.is_null() || attr.is_null() {
            return ffi::fail_with("ibv_query_device", libc::EINVAL, "NULL argument");
        }
        // SAFETY: live context; attr points to a writable ibv_device_attr.
        unsafe {
            let c = Ctx::from_ptr(context);
            attr.write(convert::device_attr(&c.dev.query_device()));
        }
        0
    })
}

/// Fills `odp_caps` of `ex` (`struct ibv_odp_caps`, at [`ODP_CAPS_AT`]).
fn odp_caps(ex: &mut ibv_device_attr_ex, caps: &softrdma::OdpCaps) {
    let at = ODP_CAPS_AT;
    ex._caps[at..at + 8].copy_from_slice(&caps.general_caps.to_ne_bytes());
    for (i, v) in [caps.rc_odp_caps, caps.uc_odp_caps, caps.ud_odp_caps]
        .into_iter()
        .enumerate()
    {
        let o = at + 8 + 4 * i;
        ex._caps[o..o + 4].copy_from_slice(&v.to_ne_bytes());
    }
    // XRC is RC's transport: its regions are reached as RC's are.
    let x = XRC_ODP_CAPS_AT;
    ex._caps[x..x + 4].copy_from_slice(&caps.rc_odp_caps.to_ne_bytes());
}

/// The `query_device_ex` slot of the verbs_context (`ibv_query_device_ex`).
unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    _input: *const c_void,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        if context.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        if attr_size < std::mem::size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        // SAFETY: live context; attr is writable for attr_size bytes (the
        // caller's struct), of which we write at most our struct's size.
        unsafe {
            let c = Ctx::from_ptr(context);
            let mut ex = ibv_device_attr_ex {
                orig_attr: convert::device_attr(&c.dev.query_device()),
                comp_mask: 0,
                _caps: [0; 160],
                phys_port_cnt_ex: 1,
            };
            odp_caps(&mut ex, &c.dev.odp_caps());
            ex._caps[MAX_DM_SIZE_AT..MAX_DM_SIZE_AT + 8]
                .copy_from_slice(&crate::dm::MAX_DM_SIZE.to_ne_bytes());
            let n = attr_size.min(std::mem::size_of::<ibv_device_attr_ex>());
            ptr::write_bytes(attr.cast::<u8>(), 0, attr_size);
            ptr::copy_nonoverlapping(
                (&ex as *const ibv_device_attr_ex).cast::<u8>(),
                attr.cast(),
                n,
            );
        }
        0
    })
}

fn port_attr(c: &Ctx, port: u8) -> Result<ibv_port_attr, c_int> {
    if port != 1 {
        return Err(ffi::fail_with(
            "ibv_query_port",
            libc::EINVAL,
            &format!("port {port} does not exist (softrdma devices have port 1)"),
        ));
    }
    Ok(convert::port_attr(&c.dev.query_port()))
}

/// The `query_port` slot of the verbs_context: what `ibv_query_port()`
/// in a program compiled against rdma-core's header calls.
unsafe extern "C" fn query_port_ex(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    attr_len: usize,
) -> c_int {
    guard(libc::EIO, || {
        if context.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: live context; attr is writable for attr_len bytes.
        unsafe {
            let a = match port_attr(Ctx::from_ptr(context), port) {
                Ok(a) => a,
                Err(e) => return e,
            };
            let n = attr_len.min(std::mem::size_of::<ibv_port_attr>());
            ptr::write_bytes(attr.cast::<u8>(), 0, attr_len);
            ptr::copy_nonoverlapping((&a as *const ibv_port_attr).cast::<u8>(), attr.cast(), n);
        }
        0
    })
}

/// The exported `ibv_query_port`: fills the 48-byte compat struct only.
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: forwarded; old callers pass at least the compat struct.
    unsafe { query_port_ex(context, port, attr, COMPAT_PORT_ATTR_LEN) }
}

fn check_gid(c: &Ctx, port: u32, index: u32, verb: &str) -> Result<[u8; 16], c_int> {
    let gids = c.dev.query_port().gid_tbl_len;
    if port != 1 || index >= gids {
        return Err(ffi::fail_with(
            verb,
            libc::EINVAL,
            &format!("no GID {index} on port {port} (port 1 has {gids})"),
        ));
    }
    Ok(c.dev.gid().0)
}

/// `ibv_query_gid`: GID 0 is the device's IP address (IPv4-mapped for IPv4).
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard(-1, || {
        if context.is_null() || gid.is_null() || index < 0 {
            ffi::set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: live context; gid is writable.
        unsafe {
            match check_gid(
                Ctx::from_ptr(context),
                port.into(),
                index as u32,
                "ibv_query_gid",
            ) {
                Ok(raw) => {
                    gid.write(ibv_gid::from_raw(raw));
                    0
                }
                Err(_) => -1,
            }
        }
    })
}

/// `ibv_query_gid_type` (provider-private): every GID is RoCE v2.
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port: u8,
    index: u32,
    gid_type: *mut u32,
) -> c_int {
    guard(-1, || {
        if context.is_null() || gid_type.is_null() {
            ffi::set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: live context; gid_type is writable.
        unsafe {
            match check_gid(
                Ctx::from_ptr(context),
                port.into(),
                index,
                "ibv_query_gid_type",
            ) {
                Ok(_) => {
                    gid_type.write(IBV_GID_TYPE_SYSFS_ROCE_V2);
                    0
                }
                Err(_) => -1,
            }
        }
    })
}

fn gid_entry(c: &Ctx, port: u32, index: u32) -> Result<ibv_gid_entry, c_int> {
    let raw = check_gid(c, port, index, "ibv_query_gid_ex")?;
    Ok(ibv_gid_entry {
        gid: ibv_gid::from_raw(raw),
        gid_index: index,
        port_num: port,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: 0,
    })
}

/// `ibv_query_gid_ex`.
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        if context.is_null() || entry.is_null() || flags != 0 {
            return ffi::fail_with("ibv_query_gid_ex", libc::EINVAL, "bad argument");
        }
        if entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return ffi::fail_with("ibv_query_gid_ex", libc::EINVAL, "entry_size too small");
        }
        // SAFETY: live context; entry is writable.
        unsafe {
            match gid_entry(Ctx::from_ptr(context), port, index) {
                Ok(e) => {
                    entry.write(e);
                    0
                }
                Err(e) => e,
            }
        }
    })
}

/// `ibv_query_gid_table`: the one GID of port 1.
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    guard(-(libc::EIO as isize), || {
        if context.is_null() || flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as isize);
        }
        if max_entries == 0 || entries.is_null() {
            return -(libc::EINVAL as isize);
        }
        // SAFETY: live context; entries[0] is writable (max_entries >= 1).
        unsafe {
            match gid_entry(Ctx::from_ptr(context), 1, 0) {
                Ok(e) => {
                    entries.write(e);
                    1
                }
                Err(e) => -(e as isize),
            }
        }
    })
}

/// `ibv_query_pkey`: the one P_Key is the default 0xFFFF.
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    guard(-1, || {
        if context.is_null() || pkey.is_null() || port != 1 || index != 0 {
            ffi::set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: pkey is writable.
        unsafe { pkey.write(0xFFFF) };
        0
    })
}

/// `ibv_get_pkey_index`.
pub unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut ibv_context,
    port: u8,
    pkey: u16,
) -> c_int {
    guard(-1, || {
        if context.is_null() || port != 1 || pkey != 0xFFFF {
            ffi::set_errno(libc::ENOENT);
            return -1;
        }
        0
    })
}

/// `ibv_get_async_event`: blocks on `context->async_fd` unless the
/// application made it non-blocking (then EAGAIN).
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    guard(-1, || {
        if context.is_null() || event.is_null() {
            ffi::set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: live context.
        let c = unsafe { Ctx::from_ptr(context) };
        let fd = c.dev.async_fd();
        loop {
            // The fd is drained before the queue is looked at, so an event
            // queued (and signalled) after the look is never missed; in
            // blocking mode too, or a program that polls the fd (UCX's
            // async thread) would find it readable again after taking the
            // last event, call again and block for good.
            let nonblocking = ffi::is_nonblocking(fd);
            if nonblocking || ffi::wait_readable(fd, 0) {
                ffi::drain_eventfd(fd);
            }
            if let Some(ev) = next_async_event(c) {
                // More waiting: the fd stays readable, as the kernel's does
                // while events are queued.
                if let Some(more) = next_async_event(c) {
                    c.pending_events
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_front(more);
                    ffi::signal_eventfd(fd);
                }
                // SAFETY: event is writable.
                unsafe { event.write(ev) };
                return 0;
            }
            if nonblocking {
                ffi::set_errno(libc::EAGAIN);
                return -1;
            }
            if ffi::wait_readable(fd, 100) {
                ffi::drain_eventfd(fd);
            }
        }
    })
}

/// The next async event about a live object of this context (events about
/// objects destroyed since are dropped). The contexts of one device share
/// its event queue: an event about another context's object is handed to
/// that context, which finds it at its next look (its wait polls every
/// 100 ms).
fn next_async_event(c: &Ctx) -> Option<ibv_async_event> {
    if let Some(ev) = c
        .pending_events
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .pop_front()
    {
        return Some(ev);
    }
    while let Some(ev) = c.dev.poll_async_event() {
        let Some((kind, obj)) = convert::async_event(&ev) else {
            continue;
        };
        let find = |x: &Ctx| {
            x.lookup(|o| match obj {
                convert::EventObject::Cq(h) => o.cqs.get(&h).copied(),
                convert::EventObject::Qp(h) => o.qps.get(&h).copied(),
                convert::EventObject::Srq(h) => o.srqs.get(&h).copied(),
            })
        };
        if let Some(element) = find(c) {
            return Some(ibv_async_event {
                element,
                event_type: kind,
            });
        }
        hand_to_sibling(c, find, kind);
    }
    None
}

/// `ibv_ack_async_event`: nothing to do. rdma-core counts acknowledgements
/// so that destroying an object waits for its events; here an event about
/// an object destroyed before it was read is dropped instead.
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    guard((), || {
        let _ = event;
    })
}

/// `ibv_create_comp_channel`.
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard(null_mut(), || {
        if context.is_null() {
            ffi::set_errno(libc::EINVAL);
            return null_mut();
        }
        // SAFETY: live context.
        let c = unsafe { Ctx::from_ptr(context) };
        match c.dev.create_comp_channel() {
            Ok(ch) => {
                let fd = ch.fd();
                ffi::set_blocking(fd);
                let p = objects::leak(Chan {
                    ibv: ibv_comp_channel {
                        context,
                        fd,
                        refcnt: 0,
                    },
                    ch: Some(ch),
                });
                c.objects().chans.insert(p as usize);
                p.cast()
            }
            Err(e) => {
                ffi::fail("ibv_create_comp_channel", &e);
                null_mut()
            }
        }
    })
}

/// `ibv_destroy_comp_channel`: EBUSY while CQs use it.
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    guard(libc::EIO, || {
        if channel.is_null() {
            return ffi::fail_with("ibv_destroy_comp_channel", libc::EINVAL, "NULL channel");
        }
        // SAFETY: a live channel from ibv_create_comp_channel.
        unsafe {
            if (*channel).refcnt > 0 {
                return ffi::fail_with(
                    "ibv_destroy_comp_channel",
                    libc::EBUSY,
                    "CQs still use the channel",
                );
            }
            Ctx::from_ptr((*channel).context)
                .objects()
                .chans
                .remove(&(channel as usize));
            objects::free(channel.cast::<Chan>());
        }
        0
    })
}

// ----- process-wide helpers -----

/// `ibv_fork_init`: nothing to do, registered memory is not pinned for DMA.
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: fork is always safe (IBV_FORK_UNNEEDED).
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    IBV_FORK_UNNEEDED
}

pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_get_sysfs_path`.
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// `ibv_read_sysfs_file`: reads `dir/file` into `buf` (NUL-terminated,
/// trailing newline removed); -1 when it does not exist, as for the
/// made-up sysfs paths of softrdma devices.
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    guard(-1, || {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            ffi::set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: NUL-terminated strings from the caller.
        let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let path = std::path::Path::new(OsStr::from_bytes(d.to_bytes()))
            .join(OsStr::from_bytes(f.to_bytes()));
        match std::fs::read(&path) {
            Ok(mut data) => {
                data.truncate(size - 1);
                if data.last() == Some(&b'\n') {
                    data.pop();
                }
                // SAFETY: buf is writable for `size` bytes; we write data.len() + 1 <= size.
                unsafe {
                    ptr::copy_nonoverlapping(data.as_ptr(), buf.cast::<u8>(), data.len());
                    *buf.add(data.len()) = 0;
                }
                data.len() as c_int
            }
            Err(e) => {
                ffi::set_errno(e.raw_os_error().unwrap_or(libc::ENOENT));
                -1
            }
        }
    })
}
