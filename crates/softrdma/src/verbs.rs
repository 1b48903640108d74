//! The public verbs objects. Each holds its [`Context`] (so the device
//! lives as long as any object does) and its engine handle, and is destroyed
//! on drop like `ibv_destroy_*`.

use std::borrow::Borrow;
use std::fmt;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use softrdma_engine::{
    AccessFlags, AhAttr, AhHandle, AttrMask, Counters, CqHandle, Ece, Engine, Event, Gid, Lkey,
    Mtu, MwBind, MwHandle, MwType, PdHandle, QpAttr, QpCap, QpInit, QpState, QpType, Qpn, RecvWr,
    RegionMemory, Rkey, SendFlags, SendOp, SendWr, Sge, SrqHandle, SrqInit, WorkCompletion,
    XrcdHandle,
};
use softrdma_wire::Psn;

use crate::config::{devices, DeviceConfig};
use crate::device::{ChannelShared, Device, DriverCounters, Lifetime};
use crate::paging::OdpRegion;
use crate::per_process::{lock_here, PerProcess};
use crate::region::{OwnedRegion, RawRegion};
use crate::segment::{Segment, SegmentRegion};
use crate::shm_port::SharedRegion;
use crate::sys::EventFd;
use crate::{Error, Result};

/// The node GUID of a device at `addr`: derived from the address, stable
/// across runs.
pub(crate) fn node_guid_of(addr: std::net::SocketAddr) -> u64 {
    let g = Gid::from_ip(addr.ip()).0;
    u64::from_be_bytes([0x02, 0x50, 0x56, 0xff, g[12], g[13], g[14], g[15]])
        ^ u64::from(addr.port())
}

/// An open device.
#[derive(Clone)]
pub struct Context {
    pub(crate) dev: Arc<Device>,
    _life: Arc<Lifetime>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.dev.name)
            .field("addr", &self.dev.addr)
            .finish()
    }
}

/// Device attributes, as `ibv_query_device` reports them (fields named as
/// in `struct ibv_device_attr`).
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    pub fw_ver: String,
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_inline_data: u32,
    pub phys_port_cnt: u8,
    /// IBV_ATOMIC_HCA (1): atomics are atomic with respect to this device.
    pub atomic_cap: u32,
    /// Memory windows the device holds; both types are offered (type 1,
    /// and type 2 in its 2B form: bound to a QP).
    pub max_mw: u32,
    /// Multicast groups the device's QPs may be attached to.
    pub max_mcast_grp: u32,
    /// QPs one group may have attached on the device.
    pub max_mcast_qp_attach: u32,
    /// Attachments on the device in all.
    pub max_total_mcast_qp_attach: u32,
}

/// Port attributes, as `ibv_query_port` reports them (fields named as in
/// `struct ibv_port_attr`).
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// 4 = ACTIVE.
    pub state: u32,
    pub max_mtu: Mtu,
    pub active_mtu: Mtu,
    pub gid_tbl_len: u32,
    pub pkey_tbl_len: u32,
    /// 2 = Ethernet (RoCE).
    pub link_layer: u8,
    pub lid: u16,
    pub active_speed: u8,
    pub active_width: u8,
    pub phys_state: u8,
    pub max_msg_sz: u32,
    /// MTU of the underlying link in bytes.
    pub link_mtu: u32,
}

impl Context {
    /// Opens the first configured device (the default loopback device `srx0`
    /// unless SOFTRDMA_DEVICES says otherwise).
    pub fn open_default() -> Result<Context> {
        let list = devices()?;
        Self::open_with(&list[0])
    }

    /// Opens the device named `name` from SOFTRDMA_DEVICES (or `srx0`).
    pub fn open(name: &str) -> Result<Context> {
        let list = devices()?;
        let cfg = list
            .iter()
            .find(|d| d.name == name)
            .ok_or_else(|| Error::NoDevice(name.into()))?;
        Self::open_with(cfg)
    }

    /// Opens a device from an explicit configuration.
    ///
    /// Opening a device at a fixed address that this process already has
    /// open gives another context on the same device, as rdma-core does
    /// (libfabric, for one, opens a device twice); it closes when the last
    /// context goes.
    pub fn open_with(cfg: &DeviceConfig) -> Result<Context> {
        /// Open devices at fixed addresses, to share (in this process
        /// only: a forked child opens its own, see [`crate::per_process`]).
        type Shared = Vec<(SocketAddr, std::sync::Weak<Lifetime>)>;
        static OPEN: Mutex<PerProcess<Shared>> = Mutex::new(PerProcess::new(Vec::new()));
        let fixed = match cfg.bind {
            crate::config::Bind::Addr(a) => Some(a),
            crate::config::Bind::AutoLoopback { .. } => None,
        };
        let mut open = lock_here(&OPEN);
        open.retain(|(_, w)| w.strong_count() > 0);
        if let Some(life) = fixed
            .and_then(|a| open.iter().find(|(b, _)| *b == a))
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(Context {
                dev: life.0.clone(),
                _life: life,
            });
        }
        let dev = Device::open(cfg)?;
        crate::stats::publish(&dev);
        let life = Arc::new(Lifetime(dev.clone()));
        if let Some(a) = fixed {
            open.push((a, Arc::downgrade(&life)));
        }
        Ok(Context { _life: life, dev })
    }

    /// Device name.
    pub fn name(&self) -> &str {
        &self.dev.name
    }

    /// UDP address of the device.
    pub fn addr(&self) -> SocketAddr {
        self.dev.addr
    }

    /// GID 0: the device's address as a RoCEv2 GID.
    pub fn gid(&self) -> Gid {
        Gid::from_ip(self.dev.addr.ip())
    }

    /// Node GUID: derived from the address, stable across runs.
    pub fn node_guid(&self) -> u64 {
        node_guid_of(self.dev.addr)
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        let l = self.dev.lock().engine.config().limits;
        DeviceAttr {
            fw_ver: format!("softrdma {}", env!("CARGO_PKG_VERSION")),
            node_guid: self.node_guid(),
            sys_image_guid: self.node_guid(),
            max_mr_size: 1 << 40,
            page_size_cap: 0xFFFF_F000,
            // Not an IEEE OUI (rxe reports the same): no vendor's
            // extensions apply, and rdma-core's test suite wants it non-zero.
            vendor_id: 0xFF_FFFF,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: softrdma_engine::MAX_QP,
            max_qp_wr: l.max_qp_wr,
            max_sge: l.max_sge,
            max_cq: 1 << 16,
            max_cqe: softrdma_engine::MAX_CQE,
            max_mr: 1 << 20,
            max_pd: 1 << 16,
            max_qp_rd_atom: u32::from(l.max_qp_rd_atom),
            max_qp_init_rd_atom: u32::from(l.max_qp_init_rd_atom),
            max_srq: 1 << 16,
            max_srq_wr: l.max_qp_wr,
            max_srq_sge: l.max_sge,
            max_inline_data: l.max_inline_data,
            phys_port_cnt: 1,
            atomic_cap: 1,
            max_mw: 1 << 16,
            max_mcast_grp: softrdma_engine::MAX_MCAST_GRP as u32,
            max_mcast_qp_attach: softrdma_engine::MAX_MCAST_QP_ATTACH as u32,
            max_total_mcast_qp_attach: softrdma_engine::MAX_TOTAL_MCAST_QP_ATTACH as u32,
        }
    }

    /// The on-demand-paging capabilities (`odp_caps` of
    /// `ibv_query_device_ex`): explicit and implicit ODP
    /// ([`Pd::register_odp`], [`Pd::register_implicit_odp`]), for every
    /// operation each transport has — every access to a region goes
    /// through the same page resolution, whoever makes it.
    pub fn odp_caps(&self) -> OdpCaps {
        use OdpCaps as C;
        OdpCaps {
            general_caps: C::SUPPORT | C::SUPPORT_IMPLICIT,
            rc_odp_caps: C::SEND | C::RECV | C::WRITE | C::READ | C::ATOMIC | C::SRQ_RECV,
            uc_odp_caps: C::SEND | C::RECV | C::WRITE | C::SRQ_RECV,
            ud_odp_caps: C::SEND | C::RECV | C::SRQ_RECV,
        }
    }

    /// `ibv_query_port` for port 1.
    pub fn query_port(&self) -> PortAttr {
        PortAttr {
            state: 4,
            max_mtu: Mtu::Mtu4096,
            active_mtu: self.dev.active_mtu,
            gid_tbl_len: 1,
            pkey_tbl_len: 1,
            link_layer: 2,
            lid: 0,
            active_speed: 32,
            active_width: 2,
            phys_state: 5,
            max_msg_sz: 1 << 31,
            link_mtu: self.dev.link_mtu,
        }
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd> {
        let handle = self.dev.with_engine(|e, _| e.alloc_pd());
        Ok(Pd {
            ctx: self.clone(),
            handle,
            destroyed: false,
        })
    }

    /// `ibv_open_xrcd` (`O_CREAT`, a new domain): an XRC domain, in which
    /// XRC SRQs ([`Pd::create_xrc_srq`]) and XRC target QPs
    /// ([`Xrcd::create_tgt_qp`]) are made.
    pub fn open_xrcd(&self) -> Result<Xrcd> {
        let handle = self.dev.with_engine(|e, _| e.alloc_xrcd());
        Ok(Xrcd {
            ctx: self.clone(),
            handle,
            destroyed: false,
        })
    }

    /// `ibv_create_cq` with room for `depth` completions.
    pub fn create_cq(&self, depth: u32) -> Result<Cq> {
        let handle = self.dev.with_engine(|e, _| e.create_cq(depth))?;
        Ok(Cq {
            ctx: self.clone(),
            handle,
            channel: None,
            destroyed: false,
        })
    }

    /// `ibv_create_cq` bound to a completion channel: once armed with
    /// [`Cq::req_notify`], its next completion makes the channel's fd
    /// readable and [`CompChannel::get_event`] names it.
    pub fn create_cq_with_channel(&self, depth: u32, channel: &CompChannel) -> Result<Cq> {
        let handle = self.dev.with_engine(|e, _| e.create_cq(depth))?;
        self.dev
            .lock()
            .channels
            .insert(handle, channel.shared.clone());
        Ok(Cq {
            ctx: self.clone(),
            handle,
            channel: Some(channel.shared.clone()),
            destroyed: false,
        })
    }

    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        let fd = EventFd::new(true).map_err(|e| Error::Io(e.to_string()))?;
        Ok(CompChannel {
            ctx: self.clone(),
            shared: Arc::new(ChannelShared {
                fd,
                ready: Mutex::new(Default::default()),
            }),
        })
    }

    /// Device counters (packets, retransmissions, NAKs, ICRC errors, …).
    pub fn counters(&self) -> Counters {
        self.dev.counters().0
    }

    /// Counters of the UDP driver itself.
    pub fn driver_counters(&self) -> DriverCounters {
        self.dev.counters().1
    }

    /// Counters of the shared-memory transport.
    pub fn shm_counters(&self) -> crate::shm::ShmCounters {
        self.dev.lock().shm().counters
    }

    /// Counters of one QP.
    pub fn qp_counters(&self, qpn: Qpn) -> Option<Counters> {
        self.dev.lock().engine.qp_counters(qpn).copied()
    }

    /// QP numbers of this device's QPs.
    pub fn qp_numbers(&self) -> Vec<Qpn> {
        self.dev.lock().engine.qp_numbers()
    }

    /// The next asynchronous event (`ibv_get_async_event` without blocking).
    pub fn poll_async_event(&self) -> Option<Event> {
        self.dev.poll_progress(
            true,
            &mut (),
            |_, _| None,
            |st, _| st.async_events.pop_front(),
        )
    }

    /// A file descriptor that becomes readable when async events may be waiting.
    pub fn async_fd(&self) -> RawFd {
        self.dev.async_fd.as_raw_fd()
    }

    /// `ibv_poll_cq` on the CQ with engine handle `cq`, for [`Cq::poll`]:
    /// the completions waiting, else progress and then those. `mark_app`
    /// says the application is polling, which keeps the background thread
    /// away from the network while it does (it takes over about 100 µs
    /// after the last marked poll).
    pub(crate) fn poll_cq(
        &self,
        cq: CqHandle,
        max: usize,
        out: &mut Vec<WorkCompletion>,
        mark_app: bool,
    ) -> softrdma_engine::Result<usize> {
        self.dev.poll_progress(
            mark_app,
            out,
            |st, out| match st.engine.poll_cq(cq, max, out) {
                Ok(0) => None,
                r => Some(r),
            },
            |st, out| st.engine.poll_cq(cq, max, out),
        )
    }

    /// Runs progress once (receive, timers, transmit) from this thread.
    pub fn progress(&self) {
        self.dev
            .poll_progress(true, &mut (), |_, _| None, |_, _| ());
    }
}

/// Where a registered region lives, for [`Pd::share`].
#[derive(Clone)]
struct Shared {
    /// Process address of the byte at `iova`.
    base: usize,
    /// The region's own segment, when same-host peers may be granted it.
    seg: Option<Arc<Segment>>,
}

/// Access rights a peer may ask for.
const REMOTE_RIGHTS: u32 =
    AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_READ.0 | AccessFlags::REMOTE_ATOMIC.0;

/// On-demand-paging capabilities (`struct ibv_odp_caps`; the bit values
/// are libibverbs').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OdpCaps {
    /// `IBV_ODP_SUPPORT*` bits.
    pub general_caps: u64,
    /// `IBV_ODP_SUPPORT_*` operation bits for RC.
    pub rc_odp_caps: u32,
    /// The same for UC.
    pub uc_odp_caps: u32,
    /// The same for UD.
    pub ud_odp_caps: u32,
}

impl OdpCaps {
    /// `IBV_ODP_SUPPORT`.
    pub const SUPPORT: u64 = 1;
    /// `IBV_ODP_SUPPORT_IMPLICIT`.
    pub const SUPPORT_IMPLICIT: u64 = 1 << 1;
    /// `IBV_ODP_SUPPORT_SEND`.
    pub const SEND: u32 = 1;
    /// `IBV_ODP_SUPPORT_RECV`.
    pub const RECV: u32 = 1 << 1;
    /// `IBV_ODP_SUPPORT_WRITE`.
    pub const WRITE: u32 = 1 << 2;
    /// `IBV_ODP_SUPPORT_READ`.
    pub const READ: u32 = 1 << 3;
    /// `IBV_ODP_SUPPORT_ATOMIC`.
    pub const ATOMIC: u32 = 1 << 4;
    /// `IBV_ODP_SUPPORT_SRQ_RECV`.
    pub const SRQ_RECV: u32 = 1 << 5;
}

/// A verbs object that its owner destroys once: explicitly, where the
/// engine may refuse (EBUSY while others still use it) and the object
/// comes back, or by a drop, which ignores that refusal (the engine then
/// keeps the resource until its users go).
trait Release: Sized {
    /// Frees the engine side, in the one teardown order of the type.
    fn release(&self) -> Result<()>;
    /// Set once an explicit destroy succeeded, so that the drop after it
    /// does nothing.
    fn destroyed(&mut self) -> &mut bool;
}

fn destroy_or_return<T: Release>(mut obj: T) -> std::result::Result<(), (T, Error)> {
    match obj.release() {
        Ok(()) => {
            *obj.destroyed() = true;
            Ok(())
        }
        Err(e) => Err((obj, e)),
    }
}

fn release_unless_destroyed<T: Release>(obj: &mut T) {
    if !*obj.destroyed() {
        let _ = obj.release();
    }
}

/// A protection domain.
pub struct Pd {
    ctx: Context,
    handle: PdHandle,
    /// Set by [`Pd::dealloc`], so that the drop after it does nothing.
    destroyed: bool,
}

impl fmt::Debug for Pd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pd({})", self.handle)
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        release_unless_destroyed(self);
    }
}

impl Release for Pd {
    fn release(&self) -> Result<()> {
        Pd::release(self)
    }

    fn destroyed(&mut self) -> &mut bool {
        &mut self.destroyed
    }
}

impl Pd {
    fn release(&self) -> Result<()> {
        let h = self.handle;
        Ok(self.ctx.dev.with_engine(|e, _| e.dealloc_pd(h))?)
    }

    /// `ibv_dealloc_pd`. While MRs, QPs, SRQs or AHs still use the PD it
    /// stays, and comes back with the error (EBUSY,
    /// [`VerbsError::Busy`](softrdma_engine::VerbsError::Busy)); dropping
    /// a PD instead ignores that error.
    pub fn dealloc(self) -> std::result::Result<(), (Pd, Error)> {
        destroy_or_return(self)
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The engine handle.
    pub fn handle(&self) -> PdHandle {
        self.handle
    }

    /// `ibv_alloc_mw`: a memory window of `mw_type` in this PD, unbound.
    /// Bind it with [`Qp::bind_mw`] (either type) or a
    /// [`SendOp::BindMw`] work request; its rkey then reaches the range
    /// the bind gave, with the bind's rights, and nothing else.
    pub fn alloc_mw(&self, mw_type: MwType) -> Result<Mw> {
        let pd = self.handle;
        let (handle, _) = self.ctx.dev.with_engine(|e, _| e.alloc_mw(pd, mw_type))?;
        Ok(Mw {
            ctx: self.ctx.clone(),
            handle,
            mw_type,
            destroyed: false,
        })
    }

    /// Allocates `len` zeroed bytes and registers them (the region owns its memory).
    pub fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<Mr> {
        // With a remote right, in a segment of its own, so that same-host
        // peers can be granted it; on the heap otherwise.
        if self.ctx.dev.direct() && access.bits() & REMOTE_RIGHTS != 0 {
            if let Ok(seg) = Segment::alloc(len) {
                let seg = Arc::new(seg);
                let addr = seg.base() as u64;
                let mem: Arc<dyn RegionMemory> = Arc::new(SegmentRegion {
                    seg: seg.clone(),
                    len,
                });
                pin(addr as usize, len, access)?;
                let mut mr = self.register(mem, addr, len, access)?;
                let shared = Shared {
                    base: addr as usize,
                    seg: Some(seg),
                };
                self.share(&mut mr, shared);
                return Ok(mr);
            }
        }
        let region = Arc::new(OwnedRegion::new(len).map_err(|e| Error::Io(e.to_string()))?);
        let addr = region.addr();
        pin(addr as usize, len, access)?;
        let mem: Arc<dyn RegionMemory> = region;
        let mut mr = self.register(mem, addr, len, access)?;
        let shared = Shared {
            base: addr as usize,
            seg: None,
        };
        self.share(&mut mr, shared);
        Ok(mr)
    }

    /// Registers caller memory at `ptr` under virtual address `iova`.
    /// Same-host peers reach it through this device's engine (it has no
    /// segment a peer could be granted); this device's own direct
    /// operations read and write it in place.
    ///
    ///
    /// Like `ibv_reg_mr` on hardware, registration pins: every page is
    /// faulted in now (`paging.rs` says what that means for a device in
    /// the process), so it costs time proportional to `len`, and memory
    /// that is not mapped — or not writable, with LOCAL_WRITE — fails with
    /// [`Error::Fault`] (EFAULT).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid for reads and writes until the returned
    /// [`Mr`] is dropped, and the caller accepts that remote peers write it
    /// concurrently (as with `ibv_reg_mr`).
    pub unsafe fn register_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr> {
        pin(ptr as usize, len, access)?;
        // SAFETY: forwarded from this function's contract.
        let mem: Arc<dyn RegionMemory> = Arc::new(unsafe { RawRegion::new(ptr, len) });
        let mut mr = self.register(mem, iova, len, access)?;
        let shared = Shared {
            base: ptr as usize,
            seg: None,
        };
        self.share(&mut mr, shared);
        Ok(mr)
    }

    /// Registers caller memory like [`Pd::register_raw`], and for same-host
    /// peers moves it into a segment of its own when it can
    /// (`segment.rs`: whole pages of private anonymous memory are
    /// remapped, in place, to shared pages holding the same bytes), so
    /// that a peer granted it does WRITEs, READs and atomics on it as plain
    /// copies and CPU atomics. Deregistration gives the pages back private
    /// memory with their current contents. What cannot move is reached
    /// through the engine, as with `register_raw`. The C library's
    /// `ibv_reg_mr` uses this.
    ///
    /// Differences the program can see: while registered, the pages are a
    /// shared mapping (a child process forked meanwhile shares them instead
    /// of getting a copy), and `/proc/self/maps` names them
    /// `/memfd:softrdma-region`.
    ///
    /// # Safety
    /// As [`Pd::register_raw`]; and no other thread writes the memory
    /// while this call runs (such a write could be lost).
    pub unsafe fn register_raw_shared(
        &self,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr> {
        if !self.ctx.dev.direct() || access.bits() & REMOTE_RIGHTS == 0 {
            // SAFETY: forwarded from this function's contract.
            return unsafe { self.register_raw(ptr, len, iova, access) };
        }
        // Pinned before anything moves, so that memory that is not
        // mapped fails here as it does in register_raw.
        pin(ptr as usize, len, access)?;
        // SAFETY: forwarded from this function's contract.
        let Some(seg) = (unsafe { Segment::adopt(ptr, len) }) else {
            // SAFETY: forwarded from this function's contract.
            return unsafe { self.register_raw(ptr, len, iova, access) };
        };
        let seg = Arc::new(seg);
        // The new mapping's pages, faulted in as the old ones were.
        pin(ptr as usize, len, access)?;
        // SAFETY: the memory stays valid (contract); it is now the
        // segment's shared pages at the same addresses.
        let mem: Arc<dyn RegionMemory> = Arc::new(unsafe { RawRegion::new(ptr, len) });
        let mut mr = self.register(mem, iova, len, access)?;
        mr.adopted = Some(seg.clone());
        let shared = Shared {
            base: ptr as usize,
            seg: Some(seg),
        };
        self.share(&mut mr, shared);
        Ok(mr)
    }

    /// Registers `len` bytes at `ptr` under `iova` with on-demand paging
    /// (`IBV_ACCESS_ON_DEMAND`, added to `access`): nothing is pinned or
    /// faulted in now, so registration costs the same at any size; each
    /// access resolves the pages it touches when it first needs them
    /// (`paging.rs`), and an access to memory that is not mapped then fails
    /// with a remote access error (or, for a local SGE, a local protection
    /// error) — never a fault. The memory need not be mapped now, and may
    /// be unmapped and mapped again while registered. Same-host peers
    /// reach it through this device's engine (it is never moved into a
    /// segment).
    ///
    /// # Safety
    /// Remote peers holding the rkey may write whatever part of the range
    /// is mapped writable, concurrently with the program (as with
    /// `ibv_reg_mr`): the caller accepts that for every byte of it.
    pub unsafe fn register_odp(
        &self,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr> {
        let mem: Arc<dyn RegionMemory> = Arc::new(OdpRegion::new(ptr as usize, len));
        self.register(mem, iova, len, access | AccessFlags::ON_DEMAND)
    }

    /// Implicit on-demand paging: one region over the whole address space
    /// (`ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND | …)`), at
    /// iova 0, so an SGE's or a peer's address is the process address.
    /// Every access is checked against the process's mappings as in
    /// [`Pd::register_odp`].
    ///
    /// # Safety
    /// As [`Pd::register_odp`], for all the memory of the process.
    pub unsafe fn register_implicit_odp(&self, access: AccessFlags) -> Result<Mr> {
        let mem: Arc<dyn RegionMemory> = Arc::new(OdpRegion::implicit());
        self.register(mem, 0, usize::MAX, access | AccessFlags::ON_DEMAND)
    }

    /// Records `mr`, when it has a segment, as a region same-host peers
    /// may be granted.
    fn share(&self, mr: &mut Mr, at: Shared) {
        share_region(&self.ctx, mr, at);
    }

    fn register(
        &self,
        mem: Arc<dyn RegionMemory>,
        addr: u64,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr> {
        let pd = self.handle;
        let m = mem.clone();
        let keys = self
            .ctx
            .dev
            .with_engine(|e, _| e.reg_mr(pd, addr, access, m))?;
        Ok(Mr {
            ctx: self.ctx.clone(),
            lkey: keys.lkey,
            rkey: keys.rkey,
            addr,
            len,
            mem,
            access,
            adopted: None,
            shared: None,
        })
    }

    /// Starts building a QP of `qp_type` using these CQs.
    pub fn create_qp<'a>(
        &'a self,
        qp_type: QpType,
        send_cq: &'a Cq,
        recv_cq: &'a Cq,
    ) -> QpBuilder<'a> {
        QpBuilder {
            pd: self,
            init: QpInit {
                pd: self.handle,
                qp_type,
                send_cq: send_cq.handle,
                recv_cq: recv_cq.handle,
                srq: None,
                cap: QpCap {
                    max_send_wr: 128,
                    max_recv_wr: 128,
                    max_send_sge: 4,
                    max_recv_sge: 4,
                    max_inline_data: 64,
                },
                sq_sig_all: false,
            },
        }
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<Srq> {
        self.create_srq_with(SrqInit {
            max_wr,
            max_sge,
            limit: 0,
        })
    }

    /// `ibv_create_srq` with every attribute of `struct ibv_srq_attr`: a
    /// nonzero `limit` arms the limit event at once (as
    /// [`Srq::arm_limit`] does later).
    pub fn create_srq_with(&self, init: SrqInit) -> Result<Srq> {
        let pd = self.handle;
        let handle = self.ctx.dev.with_engine(|e, _| e.create_srq(pd, init))?;
        Ok(Srq {
            ctx: self.ctx.clone(),
            handle,
            max_wr: init.max_wr,
            max_sge: init.max_sge,
            destroyed: false,
        })
    }

    /// `ibv_create_srq_ex` with IBV_SRQT_XRC: an SRQ in XRC domain `xrcd`
    /// whose receives complete on `cq`. XRC initiators address it by
    /// [`Srq::srq_num`] (each WR's [`SendWr::xrc_srqn`]); a target QP of the
    /// same domain delivers their SENDs into it, and their WRITEs, READs and
    /// atomics reach this PD's regions.
    pub fn create_xrc_srq(&self, xrcd: &Xrcd, cq: &Cq, init: SrqInit) -> Result<Srq> {
        let (pd, x, c) = (self.handle, xrcd.handle, cq.handle);
        let handle = self
            .ctx
            .dev
            .with_engine(|e, _| e.create_xrc_srq(pd, x, c, init))?;
        Ok(Srq {
            ctx: self.ctx.clone(),
            handle,
            max_wr: init.max_wr,
            max_sge: init.max_sge,
            destroyed: false,
        })
    }

    /// `ibv_create_ah` towards a GID.
    pub fn create_ah(&self, dgid: Gid) -> Result<Ah> {
        self.create_ah_attr(AhAttr {
            dgid,
            is_global: true,
            port_num: 1,
            hop_limit: 64,
            ..Default::default()
        })
    }

    /// `ibv_create_ah` with full attributes.
    pub fn create_ah_attr(&self, attr: AhAttr) -> Result<Ah> {
        let pd = self.handle;
        let handle = self.ctx.dev.with_engine(|e, _| e.create_ah(pd, attr))?;
        Ok(Ah {
            ctx: self.ctx.clone(),
            handle,
            destroyed: false,
        })
    }
}

/// Records `mr`, when it has a segment, as a region same-host peers of
/// `ctx`'s device may be granted.
fn share_region(ctx: &Context, mr: &mut Mr, at: Shared) {
    let mut st = ctx.dev.lock();
    if let Some(seg) = &at.seg {
        // The region's bytes start at `base`, in the segment at the
        // same distance from its start.
        let offset = (at.base - seg.base() as usize) as u64;
        st.share_region(
            mr.rkey,
            SharedRegion {
                seg: seg.clone(),
                offset,
            },
        );
        mr.shared = Some(at);
    }
}

/// Pins `len` bytes at `addr` for a region with `access`
/// ([`crate::paging::populate`]; writable when the region is).
fn pin(addr: usize, len: usize, access: AccessFlags) -> Result<()> {
    let write = access.contains(AccessFlags::LOCAL_WRITE);
    crate::paging::populate(addr, len, write).map_err(|e| {
        Error::Fault(format!(
            "reg_mr: cannot pin {len} bytes at {addr:#x}{}: {e}",
            if access.contains(AccessFlags::LOCAL_WRITE) {
                " for writing"
            } else {
                ""
            }
        ))
    })
}

/// A registered memory region.
pub struct Mr {
    ctx: Context,
    lkey: Lkey,
    rkey: Rkey,
    addr: u64,
    len: usize,
    mem: Arc<dyn RegionMemory>,
    access: AccessFlags,
    /// The segment caller memory moved into, given back at deregistration.
    adopted: Option<Arc<Segment>>,
    /// How same-host peers may be granted it (its segment), to publish it
    /// again after [`Mr::rereg`].
    shared: Option<Shared>,
}

impl fmt::Debug for Mr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Mr(addr={:#x} len={} lkey={:#x} rkey={:#x})",
            self.addr, self.len, self.lkey, self.rkey
        )
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        let k = self.lkey;
        // Deregistration takes the grants back (the core follows the
        // engine's change) and waits (bounded) until no same-host peer is
        // inside the region, before the call returns. The segment, when the
        // last reference to it goes, punches its memory out: a peer's
        // mapping then reaches nothing, whatever it does.
        let _ = self.ctx.dev.with_engine(|e, _| e.dereg_mr(k));
        self.adopted = None;
    }
}

/// `ibv_inc_rkey`: the same window index (upper 24 bits) with the next
/// key byte — the rkey a bind gives a window whose rkey is `rkey`.
pub const fn next_rkey(rkey: Rkey) -> Rkey {
    let r = rkey.raw();
    Rkey::from_raw((r & !0xff) | (r.wrapping_add(1) & 0xff))
}

/// A memory window (`ibv_alloc_mw`): a remote key for part of a region,
/// with rights of its own, that the owner binds, moves and invalidates
/// without touching the region. Deallocated on drop.
pub struct Mw {
    ctx: Context,
    handle: MwHandle,
    mw_type: MwType,
    destroyed: bool,
}

impl fmt::Debug for Mw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mw({:#x} {:?})", self.handle, self.mw_type)
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        release_unless_destroyed(self);
    }
}

impl Release for Mw {
    fn release(&self) -> Result<()> {
        let h = self.handle;
        Ok(self.ctx.dev.with_engine(|e, _| e.dealloc_mw(h))?)
    }

    fn destroyed(&mut self) -> &mut bool {
        &mut self.destroyed
    }
}

impl Mw {
    /// The engine handle (the window's 24-bit index).
    pub fn handle(&self) -> MwHandle {
        self.handle
    }

    /// Type 1 or 2.
    pub fn mw_type(&self) -> MwType {
        self.mw_type
    }

    /// The window's rkey now (the last bind's, once one has executed).
    pub fn rkey(&self) -> Rkey {
        let h = self.handle;
        self.ctx
            .dev
            .with_engine(|e, _| e.mw_info(h))
            .map_or(Rkey::default(), |(k, _)| k)
    }

    /// Whether a bind gave it a range (type 2: and it was not invalidated since).
    pub fn is_bound(&self) -> bool {
        let h = self.handle;
        self.ctx
            .dev
            .with_engine(|e, _| e.mw_info(h))
            .is_some_and(|(_, b)| b)
    }

    /// `ibv_dealloc_mw`: its rkeys reach nothing from now on. (The device
    /// never refuses it; a failure hands the window back with the error,
    /// as every destroy does.)
    pub fn dealloc(self) -> std::result::Result<(), (Mw, Error)> {
        destroy_or_return(self)
    }
}

/// Where a peer's region is: what a one-sided operation needs to know.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteRegion {
    pub addr: u64,
    pub rkey: Rkey,
    pub len: u64,
}

impl RemoteRegion {
    /// The virtual address `offset` bytes in.
    pub fn at(&self, offset: u64) -> u64 {
        self.addr.wrapping_add(offset)
    }
}

impl fmt::Display for RemoteRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "addr={:#x} rkey={:#x} len={}",
            self.addr, self.rkey, self.len
        )
    }
}

impl FromStr for RemoteRegion {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let mut r = RemoteRegion::default();
        let mut seen = 0;
        for kv in s.split_whitespace() {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| Error::Config(format!("region field {kv:?} is not key=value")))?;
            match k {
                "addr" => r.addr = parse_num(k, v)?,
                "rkey" => r.rkey = Rkey::from_raw(parse_num(k, v)? as u32),
                "len" => r.len = parse_num(k, v)?,
                _ => continue,
            }
            seen += 1;
        }
        if seen != 3 {
            return Err(Error::Config(format!(
                "region {s:?} needs addr, rkey and len"
            )));
        }
        Ok(r)
    }
}

fn parse_num(k: &str, v: &str) -> Result<u64> {
    let r = match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => v.parse(),
    };
    r.map_err(|_| Error::Config(format!("field {k}={v:?} is not a number")))
}

impl Mr {
    /// `ibv_rereg_mr` without a new translation: moves the region to `pd`
    /// and/or gives it new access rights (what is `None` stays), keeping
    /// its keys and memory. A refused change (access rules as for
    /// registration, a PD of another device) changes nothing. Grants that
    /// same-host peers hold on it are taken back first (they reach it
    /// through the engine until granted again under the new rules).
    pub fn rereg(&mut self, pd: Option<&Pd>, access: Option<AccessFlags>) -> Result<()> {
        // SAFETY: no new translation, so nothing to promise about memory.
        unsafe { self.rereg_raw(pd, access, None) }
    }

    /// `ibv_rereg_mr`, also with a new translation: caller memory at
    /// `ptr..ptr+len` under virtual address `iova` replaces the region's
    /// memory (memory the region owned is freed). The keys stay; work
    /// requests and peers' operations see either the old or the new region
    /// whole. Moved into a segment of its own for same-host peers, as
    /// [`Pd::register_raw_shared`] does, when it can.
    ///
    /// # Safety
    /// For a new translation, as [`Pd::register_raw_shared`] for that
    /// memory.
    pub unsafe fn rereg_raw(
        &mut self,
        pd: Option<&Pd>,
        access: Option<AccessFlags>,
        translation: Option<(*mut u8, usize, u64)>,
    ) -> Result<()> {
        if let Some(p) = pd {
            if !Arc::ptr_eq(&p.ctx.dev, &self.ctx.dev) {
                return Err(Error::Verbs(softrdma_engine::VerbsError::InvalidArgument(
                    "rereg_mr: the new PD is on another device".into(),
                )));
            }
        }
        let lkey = self.lkey;
        let pd_handle = pd.map(|p| p.handle);
        let Some((ptr, len, iova)) = translation else {
            self.ctx
                .dev
                .with_engine(|e, _| e.rereg_mr(lkey, pd_handle, access, None))?;
            // The engine's change took the old publication back: publish
            // the region again.
            if let Some(at) = self.shared.take() {
                let ctx = self.ctx.clone();
                share_region(&ctx, self, at);
            }
            return Ok(());
        };
        let remote = access.is_some_and(|a| a.bits() & REMOTE_RIGHTS != 0)
            || (access.is_none() && self.has_remote_rights());
        // SAFETY: forwarded from this function's contract.
        let seg = if self.ctx.dev.direct() && remote {
            unsafe { Segment::adopt(ptr, len) }.map(Arc::new)
        } else {
            None
        };
        // SAFETY: forwarded from this function's contract (the memory
        // stays valid; adopted, it is the segment's pages at the same
        // addresses).
        let mem: Arc<dyn RegionMemory> = Arc::new(unsafe { RawRegion::new(ptr, len) });
        let m = mem.clone();
        // On failure `seg` drops here, giving the pages back.
        self.ctx
            .dev
            .with_engine(|e, _| e.rereg_mr(lkey, pd_handle, access, Some((iova, m))))?;
        // The engine now reaches only the new memory and took the grants on
        // the old back: the old memory and its segment can go.
        self.mem = mem;
        self.addr = iova;
        self.len = len;
        self.shared = None;
        self.adopted = seg.clone();
        if seg.is_some() {
            let ctx = self.ctx.clone();
            share_region(
                &ctx,
                self,
                Shared {
                    base: ptr as usize,
                    seg,
                },
            );
        }
        Ok(())
    }

    /// Whether the engine's region has a remote right.
    fn has_remote_rights(&self) -> bool {
        let k = self.lkey;
        self.ctx
            .dev
            .with_engine(|e, _| e.mr_access(k))
            .is_some_and(|a| a.bits() & REMOTE_RIGHTS != 0)
    }

    /// Local key.
    pub fn lkey(&self) -> Lkey {
        self.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> Rkey {
        self.rkey
    }
    /// Virtual address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// An SGE over `len` bytes at `offset`.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr + offset,
            length: len,
            lkey: self.lkey,
        }
    }
    /// What a peer needs to reach this region.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.addr,
            rkey: self.rkey,
            len: self.len as u64,
        }
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_some_and(|e| e <= self.len) {
            Ok(())
        } else {
            Err(Error::Verbs(softrdma_engine::VerbsError::InvalidArgument(
                format!(
                    "offset {offset} + length {len} is outside the {}-byte region",
                    self.len
                ),
            )))
        }
    }

    /// True for an on-demand-paging region ([`Pd::register_odp`]).
    pub fn is_odp(&self) -> bool {
        self.access.contains(AccessFlags::ON_DEMAND)
    }

    /// `ibv_advise_mr` with `IBV_ADVISE_MR_ADVICE_PREFETCH` (or, with
    /// `write`, `_PREFETCH_WRITE`): resolves the pages of the `len` bytes at
    /// virtual address `addr` now, so that the accesses that follow pay no
    /// first-touch cost. Outside the region: EINVAL; memory that is not
    /// mapped (or not writable, for `write`): EFAULT. A pinned region's
    /// pages are all present already: nothing to do.
    pub fn prefetch(&self, addr: u64, len: usize, write: bool) -> Result<()> {
        let off =
            softrdma_engine::rules::range_offset(self.addr, self.len as u64, addr, len as u64)
                .ok_or_else(|| {
                    Error::Verbs(softrdma_engine::VerbsError::InvalidArgument(format!(
                        "advise_mr: {len} bytes at {addr:#x} are outside the region"
                    )))
                })?;
        if write && !self.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(Error::Verbs(softrdma_engine::VerbsError::InvalidArgument(
                "advise_mr: PREFETCH_WRITE on a region without LOCAL_WRITE".into(),
            )));
        }
        if !self.is_odp() || self.mem.resolve(off as usize, len, write) {
            Ok(())
        } else {
            Err(Error::Fault(format!(
                "advise_mr: {len} bytes at {addr:#x} are not mapped{}",
                if write { " writable" } else { "" }
            )))
        }
    }

    /// Copies bytes out of the region. Serialised with the device, so a
    /// remote write is seen either wholly or not at all per packet.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        let _st = self.ctx.dev.lock();
        self.mem.read(offset, dst);
        Ok(())
    }

    /// Copies bytes into the region.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())?;
        let _st = self.ctx.dev.lock();
        self.mem.write(offset, src);
        Ok(())
    }

    /// A copy of the whole region (empty for a region larger than a `Vec`
    /// can be: an implicit ODP region covers the whole address space).
    pub fn to_vec(&self) -> Vec<u8> {
        if self.len > isize::MAX as usize {
            return Vec::new();
        }
        let mut v = vec![0; self.len];
        let _ = self.read(0, &mut v);
        v
    }

    /// Reads the native-endian u64 at `offset` (atomically when aligned).
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        self.check(offset, 8)?;
        let _st = self.ctx.dev.lock();
        Ok(self.mem.fetch_add(offset, 0))
    }

    /// Raw pointer to the bytes, for zero-copy users.
    ///
    /// Remote peers may write through the device at any time; reading or
    /// writing through this pointer is a data race unless the application
    /// synchronises with its peers (as with any RDMA buffer).
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }
}

/// A completion queue.
pub struct Cq {
    ctx: Context,
    handle: CqHandle,
    /// The channel its events signal, if any (kept open while the CQ is).
    channel: Option<Arc<ChannelShared>>,
    /// Set by [`Cq::destroy`], so that the drop after it does nothing.
    destroyed: bool,
}

impl fmt::Debug for Cq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cq({})", self.handle)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        release_unless_destroyed(self);
    }
}

impl Release for Cq {
    fn release(&self) -> Result<()> {
        Cq::release(self)
    }

    fn destroyed(&mut self) -> &mut bool {
        &mut self.destroyed
    }
}

impl Cq {
    /// Destroys the CQ in the engine and, in the same critical section,
    /// unbinds its channel: no event of it is routed after.
    fn release(&self) -> Result<()> {
        let h = self.handle;
        let mut st = self.ctx.dev.lock();
        st.engine.destroy_cq(h)?;
        if self.channel.is_some() {
            st.channels.remove(&h);
        }
        Ok(())
    }

    /// `ibv_destroy_cq`. While QPs still use the CQ it stays (bound to its
    /// channel), and comes back with the error (EBUSY); dropping a CQ
    /// instead ignores that error.
    pub fn destroy(self) -> std::result::Result<(), (Cq, Error)> {
        destroy_or_return(self)
    }

    /// The engine handle (what completion channels report).
    pub fn handle(&self) -> CqHandle {
        self.handle
    }

    /// `ibv_poll_cq`: moves up to `max` completions into `out`. When the CQ
    /// is empty it first runs progress (receive, timers, transmit), which
    /// is cheap while nothing can be pending.
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize> {
        Ok(self.ctx.poll_cq(self.handle, max, out, true)?)
    }

    /// One completion, if any.
    pub fn poll_one(&self) -> Result<Option<WorkCompletion>> {
        let mut v = Vec::with_capacity(1);
        self.poll(&mut v, 1)?;
        Ok(v.pop())
    }

    /// Polls until `n` completions arrived or `timeout` passed. Spins briefly,
    /// then backs off to short sleeps so a long wait does not burn a core.
    pub fn wait(&self, n: usize, timeout: Duration) -> Result<Vec<WorkCompletion>> {
        let start = std::time::Instant::now();
        let mut out = Vec::with_capacity(n);
        let mut idle = 0u32;
        while out.len() < n {
            let before = out.len();
            self.poll(&mut out, n - before)?;
            if out.len() > before {
                idle = 0;
                continue;
            }
            if start.elapsed() > timeout {
                return Err(Error::Timeout(format!(
                    "{} of {n} completions on CQ {} after {timeout:?}",
                    out.len(),
                    self.handle
                )));
            }
            idle += 1;
            if idle > 2000 {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::hint::spin_loop();
            }
        }
        Ok(out)
    }

    /// Like [`Cq::wait`] for one completion, failing unless it succeeded.
    pub fn wait_ok(&self, timeout: Duration) -> Result<WorkCompletion> {
        let wc = self.wait(1, timeout)?.remove(0);
        if wc.status.is_ok() {
            Ok(wc)
        } else {
            Err(Error::Completion(wc.status, wc.wr_id))
        }
    }

    /// `ibv_resize_cq`: a new depth (1 … max_cqe, and no fewer than the
    /// completions waiting, which stay). Returns the depth it has now.
    pub fn resize(&self, depth: u32) -> Result<u32> {
        let h = self.handle;
        Ok(self.ctx.dev.with_engine(|e, _| e.resize_cq(h, depth))?)
    }

    /// `ibv_req_notify_cq`.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let h = self.handle;
        Ok(self
            .ctx
            .dev
            .with_engine(|e, _| e.req_notify_cq(h, solicited_only))?)
    }

    /// True once completions were lost to overflow.
    pub fn overrun(&self) -> bool {
        let h = self.handle;
        self.ctx.dev.lock().engine.cq_overrun(h)
    }
}

/// A completion channel: a file descriptor that becomes readable when an
/// armed CQ gets a completion; usable with poll/epoll.
pub struct CompChannel {
    ctx: Context,
    shared: Arc<ChannelShared>,
}

impl fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CompChannel(fd={})", self.shared.fd.as_raw_fd())
    }
}

impl CompChannel {
    /// The pollable fd.
    pub fn fd(&self) -> RawFd {
        self.shared.fd.as_raw_fd()
    }

    /// `ibv_get_cq_event`: waits for a CQ event; returns the CQ handle.
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<CqHandle> {
        let start = std::time::Instant::now();
        loop {
            // The fd is readable exactly while events are pending (as
            // ibverbs'), so a poll/epoll loop on it does not spin.
            if let Some(cq) = self.take_event() {
                return Ok(cq);
            }
            let left = match timeout {
                Some(t) => match t.checked_sub(start.elapsed()) {
                    Some(l) => Some(l),
                    None => return Err(Error::Timeout("no completion event".into())),
                },
                None => None,
            };
            self.wait(left);
        }
    }

    /// Sleeps until an event waits on this channel or `timeout` (`None`:
    /// no limit) passes; true when one waits. The sleeping thread itself
    /// is woken by the packet that completes the work (it runs the
    /// device's progress meanwhile), not by the background thread: one
    /// wake-up per event. For a program that blocks in
    /// `ibv_get_cq_event` (the C library calls this); a program waiting
    /// on [`CompChannel::fd`] with its own poll/epoll is woken by the
    /// background thread instead.
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        self.ctx.dev.wait_channel(&self.shared, timeout)
    }

    /// Takes the oldest pending event, if any (its CQ handle, [`Cq::handle`]):
    /// no wait, no progress. The fd stays readable while more events
    /// pend and is cleared when none does, as [`CompChannel::get_event`]
    /// keeps it — like ibverbs' channel fd, which a program may `poll`
    /// between calls (Gloo does, in O_NONBLOCK mode: one event per
    /// readable poll, so an fd cleared with events left would leave
    /// those CQs unserved for good). For a program that waits on
    /// [`CompChannel::fd`] itself; the C library's `ibv_get_cq_event`.
    pub fn take_event(&self) -> Option<CqHandle> {
        // Under the queue's lock, as progress pushes under it and signals
        // after: an event pushed after the drain signals again.
        let mut ready = self.shared.ready.lock().unwrap_or_else(|e| e.into_inner());
        let cq = ready.pop_front();
        if ready.is_empty() {
            self.shared.fd.drain_shared();
        }
        cq
    }
}

/// How to connect an RC or UC QP (fields as in `ibv_qp_attr`).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    pub access: AccessFlags,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    /// Path MTU; default: the smaller of both ends' MTUs.
    pub mtu: Option<Mtu>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            mtu: None,
        }
    }
}

/// What a peer needs to connect to a QP (exchanged out of band).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpEndpoint {
    pub gid: Gid,
    pub qpn: Qpn,
    pub psn: u32,
    pub mtu: Mtu,
    /// Q_Key (UD).
    pub qkey: u32,
}

impl fmt::Display for QpEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gid={} qpn={:#x} psn={:#x} mtu={} qkey={:#x}",
            std::net::Ipv6Addr::from(self.gid.0),
            self.qpn,
            self.psn,
            self.mtu.bytes(),
            self.qkey
        )
    }
}

impl FromStr for QpEndpoint {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let mut e = QpEndpoint {
            gid: Gid::default(),
            qpn: Qpn::default(),
            psn: 0,
            mtu: Mtu::Mtu1024,
            qkey: 0,
        };
        let mut seen = 0u8;
        for kv in s.split_whitespace() {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| Error::Config(format!("endpoint field {kv:?} is not key=value")))?;
            match k {
                "gid" => {
                    e.gid = v
                        .parse()
                        .map_err(|g| Error::Config(format!("endpoint gid: {g}")))?;
                    seen |= 1;
                }
                "qpn" => {
                    e.qpn = Qpn::from_raw(parse_num(k, v)? as u32 & 0xFF_FFFF);
                    seen |= 2;
                }
                "psn" => {
                    e.psn = parse_num(k, v)? as u32 & 0xFF_FFFF;
                    seen |= 4;
                }
                "mtu" => {
                    e.mtu = Mtu::from_bytes(parse_num(k, v)? as u32).ok_or_else(|| {
                        Error::Config(format!("endpoint mtu {v} is not 256..4096"))
                    })?;
                    seen |= 8;
                }
                "qkey" => e.qkey = parse_num(k, v)? as u32,
                _ => {}
            }
        }
        if seen != 15 {
            return Err(Error::Config(format!(
                "endpoint {s:?} needs gid, qpn, psn and mtu"
            )));
        }
        Ok(e)
    }
}

/// Builds a QP (`ibv_create_qp`).
pub struct QpBuilder<'a> {
    pd: &'a Pd,
    init: QpInit,
}

impl fmt::Debug for QpBuilder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QpBuilder({:?})", self.init)
    }
}

impl<'a> QpBuilder<'a> {
    /// Send queue depth.
    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.init.cap.max_send_wr = n;
        self
    }
    /// Receive queue depth.
    pub fn max_recv_wr(mut self, n: u32) -> Self {
        self.init.cap.max_recv_wr = n;
        self
    }
    /// SGEs per send WR.
    pub fn max_send_sge(mut self, n: u32) -> Self {
        self.init.cap.max_send_sge = n;
        self
    }
    /// SGEs per receive WR.
    pub fn max_recv_sge(mut self, n: u32) -> Self {
        self.init.cap.max_recv_sge = n;
        self
    }
    /// Largest inline send.
    pub fn max_inline_data(mut self, n: u32) -> Self {
        self.init.cap.max_inline_data = n;
        self
    }
    /// Every send WR completes with a CQE.
    pub fn sq_sig_all(mut self, v: bool) -> Self {
        self.init.sq_sig_all = v;
        self
    }
    /// All queue sizes at once (`struct ibv_qp_cap`).
    pub fn cap(mut self, cap: QpCap) -> Self {
        self.init.cap = cap;
        self
    }
    /// Receive from a shared receive queue.
    pub fn srq(mut self, srq: &'a Srq) -> Self {
        self.init.srq = Some(srq.handle);
        self
    }
    /// Creates the QP (in RESET). The queue sizes it got, at least those
    /// asked for, are [`Qp::cap`].
    pub fn build(self) -> Result<Qp> {
        let init = self.init;
        let ctx = self.pd.ctx.clone();
        let (qpn, cap) = ctx.dev.with_engine(|e, _| {
            let qpn = e.create_qp(init)?;
            let cap = e.query_qp(qpn).map_or(init.cap, |(_, i)| i.cap);
            Ok::<_, softrdma_engine::VerbsError>((qpn, cap))
        })?;
        let psn = random_psn();
        Ok(Qp {
            ctx,
            qpn,
            qp_type: init.qp_type,
            cap,
            sq_sig_all: init.sq_sig_all,
            psn,
            qkey: 0x1111_1111,
            destroyed: false,
        })
    }
}

/// A first send PSN for a new QP, from /dev/urandom (0 without it).
fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    u32::from_ne_bytes(b) & 0xFF_FFFF
}

/// A queue pair.
pub struct Qp {
    ctx: Context,
    qpn: Qpn,
    qp_type: QpType,
    /// Fixed at creation (no modify changes a QP's queue sizes).
    cap: QpCap,
    sq_sig_all: bool,
    psn: u32,
    qkey: u32,
    /// Set by [`Qp::destroy`], so that the drop after it does nothing.
    destroyed: bool,
}

impl fmt::Debug for Qp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Qp({:#x} {})", self.qpn, self.qp_type)
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        release_unless_destroyed(self);
    }
}

impl Release for Qp {
    fn release(&self) -> Result<()> {
        Qp::release(self)
    }

    fn destroyed(&mut self) -> &mut bool {
        &mut self.destroyed
    }
}

impl Qp {
    /// Destroys the QP, then withdraws it from same-host peers: the one
    /// teardown order of both [`Qp::destroy`] and a drop.
    fn release(&self) -> Result<()> {
        let q = self.qpn;
        self.ctx.dev.with_engine(|e, _| e.destroy_qp(q))?;
        if self.qp_type == QpType::Ud {
            // Its multicast groups were left with it.
            self.ctx.dev.groups_changed();
        }
        // The grants made through it no longer hold (the engine's rules
        // now refuse them): taken back, so no peer reaches memory through
        // a QP that is gone.
        self.ctx.dev.qp_changed(q);
        Ok(())
    }

    /// `ibv_attach_mcast`: this UD QP receives every datagram sent to the
    /// multicast group `gid` (an IPv4-mapped `::ffff:224.0.0.0/4` GID or an
    /// IPv6 `ff00::/8` one), as long as its Q_Key matches. Send to the
    /// group with an AH whose `dgid` is `gid` and remote QPN
    /// [`softrdma_engine::MCAST_QPN`]. EINVAL for another QP type or a GID
    /// that is not multicast; ENOMEM past the device's `max_mcast_grp` or
    /// `max_mcast_qp_attach`; attaching twice succeeds.
    pub fn attach_mcast(&self, gid: Gid) -> Result<()> {
        self.ctx.dev.mcast(self.qpn, gid, true)
    }

    /// `ibv_detach_mcast`: the QP stops receiving the group's datagrams
    /// (EINVAL when it was not attached).
    pub fn detach_mcast(&self, gid: Gid) -> Result<()> {
        self.ctx.dev.mcast(self.qpn, gid, false)
    }

    /// `ibv_destroy_qp`: outstanding work is discarded without
    /// completions. On failure the QP comes back with the error.
    pub fn destroy(self) -> std::result::Result<(), (Qp, Error)> {
        destroy_or_return(self)
    }

    /// The queue sizes the QP got (`ibv_qp_init_attr.cap` after
    /// `ibv_create_qp`).
    pub fn cap(&self) -> QpCap {
        self.cap
    }
    /// Whether every send WR completes with a CQE.
    pub fn sq_sig_all(&self) -> bool {
        self.sq_sig_all
    }
    /// QP number.
    pub fn qpn(&self) -> Qpn {
        self.qpn
    }
    /// QP type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        let q = self.qpn;
        self.ctx
            .dev
            .lock()
            .engine
            .qp_state(q)
            .unwrap_or(QpState::Err)
    }
    /// This QP's counters.
    pub fn counters(&self) -> Counters {
        self.ctx.qp_counters(self.qpn).unwrap_or_default()
    }
    /// What a peer needs to connect to this QP.
    pub fn endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            gid: self.ctx.gid(),
            qpn: self.qpn,
            psn: self.psn,
            mtu: self.ctx.dev.active_mtu,
            qkey: self.qkey,
        }
    }
    /// Sets the Q_Key used by [`Qp::ready_ud`] (before calling it).
    pub fn set_qkey(&mut self, qkey: u32) {
        self.qkey = qkey;
    }

    /// `ibv_modify_qp` with any attributes `mask` names, checked as the
    /// kernel checks them (every refusal is EINVAL and changes nothing).
    /// Same-host peers see the result: grants made through this QP that
    /// its new state or rights no longer allow are taken back.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        let q = self.qpn;
        self.ctx
            .dev
            .with_engine(|e, now| e.modify_qp(now, q, attr, mask))?;
        self.ctx.dev.qp_changed(q);
        Ok(())
    }

    /// `ibv_query_ece`: the ECE options this QP offers (what the engine
    /// supports, [`Ece::SUPPORTED`]) until they are set, then those set.
    /// Send it to the peer; set what both offer ([`Ece::agree`]) with
    /// [`Qp::set_ece`] on both ends before [`Qp::connect`].
    pub fn query_ece(&self) -> Result<Ece> {
        let q = self.qpn;
        Ok(self.ctx.dev.lock().engine.query_ece(q)?)
    }

    /// Whether the QP runs selective repeat: its ECE options, set with
    /// [`Qp::set_ece`] or by the CM's exchange (`ConnParam::ece`), have
    /// it on (docs/transport.md).
    pub fn selective_repeat(&self) -> bool {
        let q = self.qpn;
        self.ctx
            .dev
            .lock()
            .engine
            .qp_selective_repeat(q)
            .unwrap_or(false)
    }

    /// `ibv_set_ece`: the options both ends agreed to (selective repeat,
    /// docs/transport.md), before the QP reaches RTR; EINVAL otherwise, and
    /// for options the engine does not know or a QP that is not RC.
    pub fn set_ece(&self, ece: Ece) -> Result<()> {
        let q = self.qpn;
        self.ctx.dev.lock().engine.set_ece(q, ece)?;
        Ok(())
    }

    /// `ibv_query_qp`: every attribute, whatever a mask would name (the
    /// creation attributes are [`Qp::cap`], [`Qp::qp_type`],
    /// [`Qp::sq_sig_all`]).
    pub fn query(&self) -> Result<QpAttr> {
        let q = self.qpn;
        Ok(self.ctx.dev.lock().engine.query_qp(q)?.0)
    }

    /// RESET→INIT (RC, UC) with `o`'s access flags, port 1 and P_Key
    /// index 0. From INIT on the QP takes receives: post them now, before
    /// the peer can send, then finish with [`Qp::connect`] (which carries
    /// on from INIT).
    pub fn init(&self, o: &ConnectOptions) -> Result<()> {
        let a = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            pkey_index: 0,
            qp_access_flags: o.access,
            ..Default::default()
        };
        self.modify(
            &a,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
        )
    }

    /// Connects towards `remote` (RC, UC): RESET→INIT→RTR→RTS, from
    /// whichever of RESET, INIT or RTR the QP is in (the steps already taken,
    /// by [`Qp::init`], [`Qp::connect_until`] or [`Qp::modify`], are
    /// skipped; a QP moved to INIT elsewhere keeps its access flags).
    ///
    /// When to post receives: a SEND can arrive as soon as this QP is in
    /// RTR and the peer in RTS, so post the first receives while the QP is
    /// in RESET or INIT, before the peer learns this endpoint. RC survives
    /// a late receive (the peer retries on RNR NAKs, up to `rnr_retry`); UC
    /// drops the message.
    pub fn connect(&self, remote: &QpEndpoint, o: &ConnectOptions) -> Result<()> {
        self.connect_until(remote, o, QpState::Rts)
    }

    /// [`Qp::connect`] that stops once the QP is in `until`: INIT (to post
    /// receives before the peer's endpoint is known), RTR (a QP that only
    /// receives, or to finish later with [`Qp::connect`]) or RTS.
    /// A QP already past `until`, or in a state other than RESET, INIT or
    /// RTR, is `Error::Config` and is not changed.
    pub fn connect_until(
        &self,
        remote: &QpEndpoint,
        o: &ConnectOptions,
        until: QpState,
    ) -> Result<()> {
        let rank = |s: QpState| match s {
            QpState::Reset => Some(0),
            QpState::Init => Some(1),
            QpState::Rtr => Some(2),
            QpState::Rts => Some(3),
            _ => None,
        };
        let Some(goal) = rank(until).filter(|&g| g > 0) else {
            return Err(Error::Config(format!(
                "connect_until({until:?}): the connect steps end in INIT, RTR or RTS"
            )));
        };
        let now = self.state();
        let from = match rank(now) {
            Some(r) if r <= goal && r < 3 => r,
            _ => {
                return Err(Error::Config(format!(
                    "connect_until({until:?}) of QP {:#x} in {now:?}: it connects a QP \
                     in RESET, INIT or RTR up to INIT, RTR or RTS",
                    self.qpn
                )))
            }
        };
        if goal >= 2 {
            // Refused before any step is taken.
            self.path_mtu(remote, o)?;
        }
        if from == 0 {
            self.init(o)?;
        }
        if goal == 1 {
            return Ok(());
        }
        if from <= 1 {
            self.to_rtr(remote, o)?;
        }
        if goal == 2 {
            return Ok(());
        }
        self.to_rts(o)
    }

    /// The path MTU towards `remote`: `o.mtu`, or the smaller of both
    /// ends' MTUs. Both ends exchanged their MTUs, so a path MTU above
    /// either one (which would only show later as RemInvReqErr/WrFlushErr)
    /// is refused now.
    fn path_mtu(&self, remote: &QpEndpoint, o: &ConnectOptions) -> Result<Mtu> {
        let both = if remote.mtu.bytes() < self.ctx.dev.active_mtu.bytes() {
            remote.mtu
        } else {
            self.ctx.dev.active_mtu
        };
        if let Some(m) = o.mtu.filter(|m| m.bytes() > both.bytes()) {
            return Err(Error::Config(format!(
                "path MTU {} is larger than the MTU both ends support ({}: this port {}, the peer's {}); \
                 connect with an MTU of {} or less (or leave ConnectOptions::mtu unset)",
                m.bytes(),
                both.bytes(),
                self.ctx.dev.active_mtu.bytes(),
                remote.mtu.bytes(),
                both.bytes()
            )));
        }
        Ok(o.mtu.unwrap_or(both))
    }

    /// INIT→RTR towards `remote`.
    fn to_rtr(&self, remote: &QpEndpoint, o: &ConnectOptions) -> Result<()> {
        let mtu = self.path_mtu(remote, o)?;
        let a = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: mtu,
            dest_qp_num: remote.qpn,
            rq_psn: Psn::new(remote.psn),
            ah_attr: AhAttr {
                dgid: remote.gid,
                is_global: true,
                port_num: 1,
                hop_limit: 64,
                ..Default::default()
            },
            max_dest_rd_atomic: o.max_rd_atomic,
            min_rnr_timer: o.min_rnr_timer,
            ..Default::default()
        };
        let mut m = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN;
        // The responder's attributes: RC and the XRC target (not the
        // initiator, which has no responder).
        if matches!(self.qp_type, QpType::Rc | QpType::XrcTgt) {
            m = m | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
        }
        self.modify(&a, m)
    }

    /// RTR→RTS with this QP's send PSN.
    fn to_rts(&self, o: &ConnectOptions) -> Result<()> {
        let a = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: Psn::new(self.psn),
            timeout: o.timeout,
            retry_cnt: o.retry_cnt,
            rnr_retry: o.rnr_retry,
            max_rd_atomic: o.max_rd_atomic,
            ..Default::default()
        };
        let mut m = AttrMask::STATE | AttrMask::SQ_PSN;
        if self.qp_type == QpType::XrcTgt {
            m |= AttrMask::TIMEOUT;
        }
        if matches!(self.qp_type, QpType::Rc | QpType::XrcIni) {
            m = m
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC;
        }
        self.modify(&a, m)
    }

    /// RESET→INIT→RTR→RTS for a UD QP with its Q_Key.
    pub fn ready_ud(&self) -> Result<()> {
        let mut a = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            pkey_index: 0,
            qkey: self.qkey,
            ..Default::default()
        };
        self.modify(
            &a,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
        )?;
        a.qp_state = QpState::Rtr;
        self.modify(&a, AttrMask::STATE)?;
        a.qp_state = QpState::Rts;
        a.sq_psn = Psn::new(self.psn);
        self.modify(&a, AttrMask::STATE | AttrMask::SQ_PSN)
    }

    /// `ibv_post_send` (one WR). A WRITE, READ or atomic towards a
    /// same-host peer that granted the target region is done at once in
    /// its memory when that is exactly what the engine would do
    /// (docs/shm.md); everything else goes to the engine.
    pub fn post_send(&self, wr: &SendWr) -> Result<()> {
        let q = self.qpn;
        if self.ctx.dev.try_direct(q, wr) {
            return Ok(());
        }
        Ok(self.ctx.dev.post(q, |e, now| e.post_send(now, q, wr))?)
    }

    /// `ibv_post_send` with IBV_SEND_INLINE: `data` is copied now.
    pub fn post_send_inline(&self, wr: &SendWr, data: &[u8]) -> Result<()> {
        let q = self.qpn;
        Ok(self
            .ctx
            .dev
            .post(q, |e, now| e.post_send_inline(now, q, wr, data))?)
    }

    /// `ibv_bind_mw`: posts a bind of `mw` to what `bind` says (`length`
    /// bytes at `addr` of the region whose lkey is `mr`, with the remote
    /// rights of `access`; `mr: None` and `length` 0 unbind a type-1
    /// window), with the next key byte ([`next_rkey`] of [`Mw::rkey`]),
    /// and returns that rkey. The bind executes in its turn in the send
    /// queue and completes with
    /// [`WcOpcode::BindMw`](softrdma_engine::WcOpcode::BindMw) (signaled
    /// when `flags` says so), or with IBV_WC_MW_BIND_ERR when the rules
    /// refuse it; a type-2 window then belongs to this QP. rdma-core's
    /// `ibv_bind_mw` takes type 1 only; here a type-2 window is bound the
    /// same way (the work request rdma-core posts with IBV_WR_BIND_MW).
    pub fn bind_mw(&self, mw: &Mw, wr_id: u64, flags: SendFlags, bind: MwBind) -> Result<Rkey> {
        let rkey = next_rkey(mw.rkey());
        let wr = SendWr {
            xrc_srqn: None,
            wr_id,
            op: SendOp::BindMw {
                mw: mw.handle,
                rkey,
                bind,
            },
            sg_list: Vec::new(),
            flags,
            ud: None,
        };
        self.post_send(&wr)?;
        Ok(rkey)
    }

    /// `ibv_post_recv` (one WR).
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        let q = self.qpn;
        Ok(self.ctx.dev.with_engine(|e, _| e.post_recv(q, wr))?)
    }

    /// `ibv_post_recv` with a list: see [`post_recv_list`](Srq::post_recv_list)
    /// of [`Srq`], which takes lists the same way.
    pub fn post_recv_list<I>(&self, wrs: I) -> std::result::Result<usize, (usize, Error)>
    where
        I: IntoIterator,
        I::Item: Borrow<RecvWr>,
    {
        let q = self.qpn;
        post_recv_list(&self.ctx, wrs, |e, wr| e.post_recv(q, wr))
    }
}

/// An XRC domain (`ibv_open_xrcd`): the XRC SRQs and target QPs made in
/// it may serve each other. Closing it while any remains is EBUSY.
pub struct Xrcd {
    ctx: Context,
    handle: XrcdHandle,
    /// Set by [`Xrcd::close`], so that the drop after it does nothing.
    destroyed: bool,
}

impl fmt::Debug for Xrcd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Xrcd({})", self.handle)
    }
}

impl Drop for Xrcd {
    fn drop(&mut self) {
        release_unless_destroyed(self);
    }
}

impl Release for Xrcd {
    fn release(&self) -> Result<()> {
        let h = self.handle;
        Ok(self.ctx.dev.with_engine(|e, _| e.dealloc_xrcd(h))?)
    }

    fn destroyed(&mut self) -> &mut bool {
        &mut self.destroyed
    }
}

impl Xrcd {
    /// `ibv_close_xrcd`. While XRC SRQs or target QPs are in the domain it
    /// stays, and comes back with the error (EBUSY).
    pub fn close(self) -> std::result::Result<(), (Xrcd, Error)> {
        destroy_or_return(self)
    }

    /// The engine handle.
    pub fn handle(&self) -> XrcdHandle {
        self.handle
    }

    /// `ibv_create_qp_ex` with IBV_QPT_XRC_RECV: an XRC target QP in this
    /// domain (no PD, CQ or queues of its own). Connect it to an XRC
    /// initiator ([`QpType::XrcIni`], made by [`Pd::create_qp`]) as an RC
    /// QP is connected ([`Qp::connect`]).
    pub fn create_tgt_qp(&self) -> Result<Qp> {
        let x = self.handle;
        let qpn = self.ctx.dev.with_engine(|e, _| e.create_xrc_tgt_qp(x))?;
        Ok(Qp {
            ctx: self.ctx.clone(),
            qpn,
            qp_type: QpType::XrcTgt,
            cap: QpCap::default(),
            sq_sig_all: false,
            psn: random_psn(),
            qkey: 0x1111_1111,
            destroyed: false,
        })
    }
}

/// A shared receive queue.
pub struct Srq {
    ctx: Context,
    handle: SrqHandle,
    /// Fixed at creation (SRQs are not resized).
    max_wr: u32,
    max_sge: u32,
    /// Set by [`Srq::destroy`], so that the drop after it does nothing.
    destroyed: bool,
}

impl fmt::Debug for Srq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Srq({})", self.handle)
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        release_unless_destroyed(self);
    }
}

impl Release for Srq {
    fn release(&self) -> Result<()> {
        Srq::release(self)
    }

    fn destroyed(&mut self) -> &mut bool {
        &mut self.destroyed
    }
}

impl Srq {
    fn release(&self) -> Result<()> {
        let h = self.handle;
        Ok(self.ctx.dev.with_engine(|e, _| e.destroy_srq(h))?)
    }

    /// `ibv_destroy_srq`. While QPs still use the SRQ it stays, and comes
    /// back with the error (EBUSY); dropping an SRQ ignores that error.
    pub fn destroy(self) -> std::result::Result<(), (Srq, Error)> {
        destroy_or_return(self)
    }

    /// `ibv_post_srq_recv`.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        let h = self.handle;
        Ok(self.ctx.dev.with_engine(|e, _| e.post_srq_recv(h, wr))?)
    }

    /// `ibv_post_srq_recv` with a list: posts the WRs in order, under one
    /// lock of the device, and stops at the first one refused, returning
    /// its index with the error (the WRs before it are posted; nothing
    /// more is taken from `wrs`). `Ok` is the number posted.
    ///
    /// `wrs` may be a slice or a lazy iterator; a lazy one runs under the
    /// device's lock, so it must not call this device's API (its
    /// [`Mr::write`] and the like would wait for the lock forever).
    pub fn post_recv_list<I>(&self, wrs: I) -> std::result::Result<usize, (usize, Error)>
    where
        I: IntoIterator,
        I::Item: Borrow<RecvWr>,
    {
        let h = self.handle;
        post_recv_list(&self.ctx, wrs, |e, wr| e.post_srq_recv(h, wr))
    }

    /// `ibv_get_srq_num`: the number XRC initiators name this XRC SRQ by;
    /// EINVAL for an SRQ that is not an XRC SRQ.
    pub fn srq_num(&self) -> Result<u32> {
        let h = self.handle;
        Ok(self.ctx.dev.lock().engine.srq_num(h)?)
    }

    /// Arms the limit event (`ibv_modify_srq` with IBV_SRQ_LIMIT): an
    /// [`Event::SrqLimitReached`] when fewer than `limit` receives remain.
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        let h = self.handle;
        Ok(self.ctx.dev.with_engine(|e, _| e.arm_srq_limit(h, limit))?)
    }
    /// The engine handle.
    pub fn handle(&self) -> SrqHandle {
        self.handle
    }
    /// Most receives the SRQ holds.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }
    /// Most SGEs per receive.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }
}

/// Posts `wrs` with `post` under one lock of the device (see
/// [`Srq::post_recv_list`]).
fn post_recv_list<I>(
    ctx: &Context,
    wrs: I,
    post: impl Fn(&mut Engine, &RecvWr) -> softrdma_engine::Result<()>,
) -> std::result::Result<usize, (usize, Error)>
where
    I: IntoIterator,
    I::Item: Borrow<RecvWr>,
{
    ctx.dev.with_engine(|e, _| {
        let mut posted = 0;
        for wr in wrs {
            post(e, wr.borrow()).map_err(|err| (posted, Error::from(err)))?;
            posted += 1;
        }
        Ok(posted)
    })
}

/// An address handle (UD destinations).
pub struct Ah {
    ctx: Context,
    handle: AhHandle,
    /// Set by [`Ah::destroy`], so that the drop after it does nothing.
    destroyed: bool,
}

impl fmt::Debug for Ah {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ah({})", self.handle)
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        release_unless_destroyed(self);
    }
}

impl Release for Ah {
    fn release(&self) -> Result<()> {
        Ah::release(self)
    }

    fn destroyed(&mut self) -> &mut bool {
        &mut self.destroyed
    }
}

impl Ah {
    fn release(&self) -> Result<()> {
        let h = self.handle;
        Ok(self.ctx.dev.with_engine(|e, _| e.destroy_ah(h))?)
    }

    /// `ibv_destroy_ah`; on failure the AH comes back with the error.
    pub fn destroy(self) -> std::result::Result<(), (Ah, Error)> {
        destroy_or_return(self)
    }

    /// The engine handle, for [`UdDest::ah`](softrdma_engine::UdDest).
    pub fn handle(&self) -> AhHandle {
        self.handle
    }
}
