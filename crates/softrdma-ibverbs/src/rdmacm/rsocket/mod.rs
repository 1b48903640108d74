//! rsockets: stream sockets over RC QPs, librdmacm's `rsocket` …
//! `riowrite`, on this module's rdma_cm ids and this library's verbs, with
//! rdma-core's protocol (formats in [`wire`]; docs/rdmacm.md, "rsockets").
//!
//! A socket is a synchronous rdma_cm id (TCP port space) whose channel's
//! fd is the socket's number, as with rdma-core. Connected, it has one RC
//! QP signalling every send, one CQ with a completion channel for both
//! queues, and three registered buffers: the send ring (plus four
//! control-message slots), the receive ring, and the target table (two
//! buffer advertisements the peer writes, then the I/O-mapping slots).
//!
//! Data moves as RDMA WRITE_WITH_IMM into the peer's receive ring, each
//! write's immediate saying `DATA | length`; the receiver hands the bytes
//! out in order. Flow control is rsockets': the receiver advertises its
//! ring half by half (an RDMA write of an `Sge` into the sender's target
//! table, immediate `SGL | credits`) and grants message credits (the
//! sequence number the sender may reach); at most four control messages
//! are in flight. A side that is done sends `CTRL | DISCONNECT` (or
//! `SHUTDOWN` for a half close).
//!
//! Every entry point takes the socket's lock; a call that must wait
//! drops it and sleeps in `poll` on the completion channel and the
//! id's event fd (1 s slices), so a thread sending and one receiving on
//! the same socket do not stop each other.

pub mod wire;

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_uint, c_void};
use std::ptr::{null_mut, read_volatile, write_volatile};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use self::wire::{ConnData, Iomap, Sge};
use super::abi::*;
use super::exports as cm;
use super::{events, Id};
use crate::abi::*;
use crate::ffi::{guard, set_errno};
use crate::{device, verbs};

/// rsockets' defaults (`def_wmem`, `def_mem`, `def_sqsize`, `def_rqsize`,
/// `def_inline`) and limits.
const DEF_MEM: u32 = 1 << 17;
const DEF_QP_SIZE: u16 = 384;
const DEF_INLINE: u16 = 64;
const QP_MIN_SIZE: u16 = 16;
const QP_MAX_SIZE: u16 = 0xFFFE;
/// Control messages in flight at most (`RS_QP_CTRL_SIZE`).
const CTRL_SLOTS: u32 = 4;
/// A send needs this much free send ring (`RS_SNDLOWAT`).
const SNDLOWAT: u32 = 2048;
/// The first chunk of a send, doubled up to the largest (`RS_OLAP_START_SIZE`,
/// `RS_MAX_TRANSFER`).
const OLAP_START: u32 = 2048;
const MAX_TRANSFER: u32 = 65536;
/// `SOL_RDMA` and its options (`<rdma/rsocket.h>`).
const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;
const RDMA_ROUTE: c_int = 4;
/// WR ids: receives carry this bit; sends carry their immediate.
const WR_RECV: u64 = 1 << 63;
/// How long shutdown and close wait for their last sends at most.
const CLOSE_WAIT: Duration = Duration::from_secs(10);
/// Access of the rings the peer writes.
const ACCESS_WRITE: c_int = 1 | 2; // LOCAL_WRITE | REMOTE_WRITE
const IBV_WC_SUCCESS: c_uint = 0;

/// Memory of one ring or table: anonymous pages (zeroed, page-aligned),
/// only ever reached through raw pointers, since the device writes it
/// while we read.
struct Buf {
    p: *mut u8,
    len: usize,
}

impl Buf {
    fn new(len: usize) -> Result<Buf, c_int> {
        let len = len.max(1);
        // SAFETY: an anonymous private mapping; no existing memory is
        // touched.
        let p = unsafe {
            libc::mmap(
                null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(libc::ENOMEM);
        }
        Ok(Buf { p: p.cast(), len })
    }

    fn addr(&self) -> u64 {
        self.p as u64
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; its MR is
        // deregistered before (Conn's drop order).
        unsafe { libc::munmap(self.p.cast(), self.len) };
    }
}

/// A mapping of riomap: its MR and the offset the peer names it by.
struct MapEntry {
    mr: *mut ibv_mr,
    offset: u64,
}

/// The data path of a connected socket.
struct Conn {
    id: *mut rdma_cm_id,
    qp: *mut ibv_qp,
    cq: *mut ibv_cq,
    ch: *mut ibv_comp_channel,
    sbuf: Buf,
    smr: *mut ibv_mr,
    rbuf: Buf,
    rmr: *mut ibv_mr,
    tbuf: Buf,
    tmr: *mut ibv_mr,
    sbuf_size: u32,
    rbuf_size: u32,
    sq_size: u16,
    rq_size: u16,
    sq_inline: u32,
    iomap_size: u32,
    // link state
    connected: bool,
    readable: bool,
    writable: bool,
    failed: bool,
    // send side
    sseq_no: u16,
    sseq_comp: u16,
    sqe_avail: u32,
    sbuf_avail: u32,
    soff: u32,
    target_sge: u32,
    remote_sgl: Sge,
    remote_sge: u32,
    remote_iomap: Sge,
    big: bool,
    ctrl_seqno: u32,
    ctrl_max: u32,
    // receive side
    rseq_no: u16,
    rseq_comp: u16,
    rbuf_avail: u32,
    rbuf_free: u32,
    roff: u32,
    rmsg: VecDeque<u32>,
    armed: bool,
    // riomap
    iomaps: Vec<Option<MapEntry>>,
    iomap_queue: VecDeque<usize>,
    local_maps: Vec<MapEntry>,
}

// SAFETY: the raw pointers are this library's verbs objects and this
// socket's own mappings, used only under the socket's lock.
unsafe impl Send for Conn {}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Init,
    Bound,
    Listening,
    Connected,
    ConnectError,
}

/// Options set before connecting (inherited by accepted sockets).
#[derive(Clone, Copy)]
struct Opts {
    sbuf_size: u32,
    rbuf_size: u32,
    sq_size: u16,
    rq_size: u16,
    sq_inline: u16,
    iomap_size: u16,
    so_opts: u64,
    tcp_opts: u64,
    ipv6_opts: u64,
    ip_tos: c_int,
    keepalive_time: c_int,
    fs_flags: c_int,
    fd_flags: c_int,
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            sbuf_size: DEF_MEM,
            rbuf_size: DEF_MEM,
            sq_size: DEF_QP_SIZE,
            rq_size: DEF_QP_SIZE,
            sq_inline: DEF_INLINE,
            iomap_size: 0,
            so_opts: 0,
            tcp_opts: 0,
            ipv6_opts: 0,
            ip_tos: 0,
            keepalive_time: 0,
            fs_flags: 0,
            fd_flags: 0,
        }
    }
}

struct Inner {
    id: *mut rdma_cm_id,
    state: State,
    err: c_int,
    o: Opts,
    c: Option<Box<Conn>>,
}

// SAFETY: `id` is a live id of this module, used only under the lock.
unsafe impl Send for Inner {}

struct Sock {
    fd: c_int,
    inner: Mutex<Inner>,
}

impl Sock {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn table() -> MutexGuard<'static, HashMap<c_int, Arc<Sock>>> {
    static T: OnceLock<Mutex<HashMap<c_int, Arc<Sock>>>> = OnceLock::new();
    T.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

fn lookup(fd: c_int) -> Result<Arc<Sock>, c_int> {
    table().get(&fd).cloned().ok_or(libc::EBADF)
}

fn last_errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .filter(|&e| e != 0)
        .unwrap_or(libc::EIO)
}

fn set_nonblock(fd: c_int, on: bool) {
    // SAFETY: fcntl on an fd this module owns, no pointers.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            let nf = if on {
                fl | libc::O_NONBLOCK
            } else {
                fl & !libc::O_NONBLOCK
            };
            libc::fcntl(fd, libc::F_SETFL, nf);
        }
    }
}

fn readable_now(fd: c_int) -> bool {
    crate::ffi::wait_readable(fd, 0)
}

/// -1 with errno for an error, the value otherwise.
fn ret_int(r: Result<c_int, c_int>) -> c_int {
    match r {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

fn ret_size(r: Result<usize, c_int>) -> isize {
    match r {
        Ok(v) => v as isize,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

// ----- the data path -----

impl Conn {
    fn half(&self) -> u32 {
        self.rbuf_size >> 1
    }

    /// Slot `i` of the target table (written by the peer).
    fn tsgl(&self, i: u32) -> Sge {
        // SAFETY: i < SGL_SIZE: within the table's first 32 bytes.
        let b: [u8; wire::SGE_LEN] = unsafe {
            read_volatile(
                self.tbuf
                    .p
                    .add(i as usize * wire::SGE_LEN)
                    .cast::<[u8; wire::SGE_LEN]>(),
            )
        };
        Sge::from_le(&b)
    }

    fn set_tsgl(&self, i: u32, s: Sge) {
        // SAFETY: as `tsgl`.
        unsafe {
            write_volatile(
                self.tbuf
                    .p
                    .add(i as usize * wire::SGE_LEN)
                    .cast::<[u8; wire::SGE_LEN]>(),
                s.to_bytes(false),
            )
        }
    }

    /// Mapping slot `i` of the target table (written by the peer).
    fn tiomap(&self, i: u32) -> Iomap {
        let at = wire::SGE_LEN * wire::SGL_SIZE as usize + i as usize * wire::IOMAP_LEN;
        // SAFETY: i < iomap_size: the table holds that many slots after the
        // two advertisements.
        let b: [u8; wire::IOMAP_LEN] =
            unsafe { read_volatile(self.tbuf.p.add(at).cast::<[u8; wire::IOMAP_LEN]>()) };
        Iomap::from_le(&b)
    }

    fn conn_data(&self) -> ConnData {
        ConnData {
            flags: wire::FLAG_IOMAP,
            credits: self.rq_size,
            target_iomap_size: wire::value_to_scale(self.iomap_size, 8) as u8,
            target_sgl: Sge {
                addr: self.tbuf.addr(),
                // SAFETY: registered in `new`, live until drop.
                key: unsafe { (*self.tmr).rkey },
                length: wire::SGL_SIZE,
            },
            data_buf: Sge {
                addr: self.rbuf.addr(),
                // SAFETY: as above.
                key: unsafe { (*self.rmr).rkey },
                length: self.half(),
            },
        }
    }

    /// The peer's connection data: where to advertise, its first buffer,
    /// its credits.
    fn save(&mut self, peer: &ConnData) -> Result<(), c_int> {
        if peer.target_sgl.length == 0 || peer.data_buf.length == 0 {
            return Err(libc::EPROTO);
        }
        self.remote_sgl = peer.target_sgl;
        self.remote_sge = 1 % peer.target_sgl.length;
        self.big = peer.peer_is_big_endian();
        let slots = peer.iomap_slots();
        if slots > 0 {
            self.remote_iomap = Sge {
                addr: peer
                    .target_sgl
                    .addr
                    .wrapping_add(wire::SGE_LEN as u64 * u64::from(peer.target_sgl.length)),
                key: peer.target_sgl.key,
                length: slots,
            };
            self.iomaps = (0..slots).map(|_| None).collect();
        }
        self.set_tsgl(0, peer.data_buf);
        self.sseq_comp = peer.credits;
        self.connected = true;
        self.readable = true;
        self.writable = true;
        Ok(())
    }

    fn post(
        &self,
        wr_id: u64,
        opcode: c_uint,
        sges: &mut [ibv_sge],
        flags: c_uint,
        imm: u32,
        remote: (u64, u32),
    ) -> Result<(), c_int> {
        // SAFETY: all-zero is a valid send WR (integers, NULL pointers).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = if sges.is_empty() {
            null_mut()
        } else {
            sges.as_mut_ptr()
        };
        wr.num_sge = sges.len() as c_int;
        wr.opcode = opcode;
        wr.send_flags = flags;
        wr.imm_data = imm.to_be();
        wr.wr.rdma = ibv_send_wr_rdma {
            remote_addr: remote.0,
            rkey: remote.1,
        };
        let mut bad = null_mut();
        // SAFETY: this socket's live QP; the WR and its SGEs live for the
        // call (inline data is copied at post time, the rest is in the
        // registered send ring).
        match unsafe { verbs::post_send(self.qp, &mut wr, &mut bad) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// An RDMA WRITE_WITH_IMM of `sges` (or nothing) to `remote`.
    fn post_write_msg(
        &self,
        sges: &mut [ibv_sge],
        msg: u32,
        flags: c_uint,
        remote: (u64, u32),
    ) -> Result<(), c_int> {
        self.post(
            u64::from(msg),
            IBV_WR_RDMA_WRITE_WITH_IMM,
            sges,
            flags,
            msg,
            remote,
        )
    }

    /// A message without data (credits only, or a control message); the
    /// address is the peer's table, valid whatever it checks.
    fn post_msg(&self, msg: u32) -> Result<(), c_int> {
        self.post_write_msg(&mut [], msg, 0, (self.remote_sgl.addr, self.remote_sgl.key))
    }

    fn post_recvs(&self, n: u32) -> Result<(), c_int> {
        for _ in 0..n {
            let mut wr = ibv_recv_wr {
                wr_id: WR_RECV,
                next: null_mut(),
                sg_list: null_mut(),
                num_sge: 0,
            };
            let mut bad = null_mut();
            // SAFETY: this socket's live QP; a WR without SGEs.
            let e = unsafe { verbs::post_recv(self.qp, &mut wr, &mut bad) };
            if e != 0 {
                return Err(e);
            }
        }
        Ok(())
    }

    fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max
    }

    /// rsockets' condition to send a data message.
    fn can_send(&self) -> bool {
        self.sqe_avail > 0
            && self.sbuf_avail >= SNDLOWAT.min(self.sbuf_size)
            && self.sseq_no != self.sseq_comp
            && self.tsgl(self.target_sge).length != 0
    }

    fn have_rdata(&self) -> bool {
        !self.rmsg.is_empty()
    }

    fn all_sends_done(&self) -> bool {
        let ctrl_in_flight = CTRL_SLOTS - (self.ctrl_max.wrapping_sub(self.ctrl_seqno));
        self.sqe_avail + ctrl_in_flight >= u32::from(self.sq_size)
    }

    /// Sends credits (and the next free half of the receive ring) when
    /// rsockets would: half the ring free, or half the credits used.
    fn update_credits(&mut self) {
        let used = (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0;
        if !((self.rbuf_avail >= self.half() || used) && self.ctrl_avail() && self.connected) {
            return;
        }
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.rseq_comp = self.rseq_no.wrapping_add(self.rq_size >> 1);
        let credits = u32::from(self.rseq_no.wrapping_add(self.rq_size));
        let msg = wire::imm(wire::OP_SGL, credits);
        let r = if self.rbuf_avail >= self.half() {
            let sge = Sge {
                addr: self.rbuf.addr() + u64::from(self.rbuf_free),
                // SAFETY: registered, live until drop.
                key: unsafe { (*self.rmr).rkey },
                length: self.half(),
            };
            let bytes = sge.to_bytes(self.big);
            let (mut ib, flags) = if self.sq_inline >= wire::SGE_LEN as u32 {
                (
                    ibv_sge {
                        addr: bytes.as_ptr() as u64,
                        length: wire::SGE_LEN as u32,
                        lkey: 0,
                    },
                    IBV_SEND_INLINE,
                )
            } else {
                // A control slot after the send ring.
                let slot = self.sbuf_size as usize
                    + wire::SGE_LEN * (self.ctrl_seqno & (CTRL_SLOTS - 1)) as usize;
                // SAFETY: the slot is within the send ring's mapping (four
                // slots follow the ring), and no send in flight uses it
                // (at most four control messages are).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        self.sbuf.p.add(slot),
                        wire::SGE_LEN,
                    )
                };
                (
                    ibv_sge {
                        addr: self.sbuf.addr() + slot as u64,
                        length: wire::SGE_LEN as u32,
                        // SAFETY: registered, live until drop.
                        lkey: unsafe { (*self.smr).lkey },
                    },
                    0,
                )
            };
            let at = self
                .remote_sgl
                .addr
                .wrapping_add(u64::from(self.remote_sge) * wire::SGE_LEN as u64);
            let r = self.post_write_msg(
                std::slice::from_mut(&mut ib),
                msg,
                flags,
                (at, self.remote_sgl.key),
            );
            self.rbuf_avail -= self.half();
            self.rbuf_free += self.half();
            if self.rbuf_free >= self.rbuf_size {
                self.rbuf_free = 0;
            }
            self.remote_sge = (self.remote_sge + 1) % self.remote_sgl.length.max(1);
            r
        } else {
            self.post_msg(msg)
        };
        if let Err(e) = r {
            self.fail(e);
        }
    }

    fn fail(&mut self, _e: c_int) {
        if self.connected {
            self.failed = true;
        }
        self.connected = false;
        self.readable = false;
        self.writable = false;
    }

    fn disconnected(&mut self) {
        self.connected = false;
        self.readable = false;
        self.writable = false;
    }

    /// Takes every completion: receives (their immediates), sends (their
    /// room back); then reposts the receives used.
    fn poll_cq(&mut self) {
        let mut wcs = [ibv_wc::default(); 32];
        let mut reposts = 0u32;
        loop {
            // SAFETY: this socket's live CQ; room for 32 completions.
            let n = unsafe { verbs::poll_cq(self.cq, wcs.len() as c_int, wcs.as_mut_ptr()) };
            if n <= 0 {
                break;
            }
            for wc in &wcs[..n as usize] {
                if wc.wr_id & WR_RECV != 0 {
                    if wc.status != IBV_WC_SUCCESS {
                        continue;
                    }
                    reposts += 1;
                    if wc.wc_flags & IBV_WC_WITH_IMM == 0 {
                        continue;
                    }
                    self.on_message(u32::from_be(wc.imm_data));
                } else {
                    let msg = wc.wr_id as u32;
                    match wire::op(msg) {
                        wire::OP_SGL => self.ctrl_max = self.ctrl_max.wrapping_add(1),
                        wire::OP_CTRL => {
                            self.ctrl_max = self.ctrl_max.wrapping_add(1);
                            if wire::data(msg) == wire::CTRL_DISCONNECT {
                                self.disconnected();
                            }
                        }
                        wire::OP_IOMAP_SGL => {
                            self.sqe_avail += 1;
                            self.sbuf_avail += wire::IOMAP_LEN as u32;
                        }
                        _ => {
                            self.sqe_avail += 1;
                            self.sbuf_avail = self.sbuf_avail.saturating_add(wire::data(msg));
                        }
                    }
                    if wc.status != IBV_WC_SUCCESS && self.connected {
                        self.fail(libc::EIO);
                    }
                }
            }
        }
        if self.connected && reposts > 0 {
            if let Err(e) = self.post_recvs(reposts) {
                self.fail(e);
            }
        }
    }

    /// One message from the peer.
    fn on_message(&mut self, msg: u32) {
        match wire::op(msg) {
            wire::OP_SGL => self.sseq_comp = wire::data(msg) as u16,
            wire::OP_IOMAP_SGL => {}
            wire::OP_CTRL => match wire::data(msg) {
                wire::CTRL_DISCONNECT => self.disconnected(),
                wire::CTRL_SHUTDOWN => {
                    if self.writable {
                        self.readable = false;
                    } else {
                        self.disconnected();
                    }
                }
                _ => {}
            },
            wire::OP_DATA => {
                let len = wire::data(msg);
                // A peer within the protocol never overfills the ring nor
                // exceeds its credits; one that does is cut off.
                if len > self.rbuf_size || self.rmsg.len() > usize::from(self.rq_size) {
                    self.fail(libc::EPROTO);
                    return;
                }
                if len > 0 {
                    self.rmsg.push_back(len);
                } else {
                    // An empty data message still counts as one.
                    self.rseq_no = self.rseq_no.wrapping_add(1);
                }
            }
            _ => {}
        }
    }

    /// Takes completion events off the channel (non-blocking) and acks
    /// them; the CQ is then unarmed.
    fn drain_cq_events(&mut self) {
        loop {
            let mut cq = null_mut();
            let mut ctx = null_mut();
            // SAFETY: this socket's live channel (non-blocking fd).
            if unsafe { verbs::ibv_get_cq_event(self.ch, &mut cq, &mut ctx) } != 0 {
                break;
            }
            // SAFETY: the CQ the event was for: ours.
            unsafe { verbs::ibv_ack_cq_events(cq, 1) };
            self.armed = false;
        }
    }

    /// The id's events once connected: DISCONNECTED ends the link.
    fn drain_cm_events(&mut self) {
        // SAFETY: the id is live while its socket is.
        let ch = unsafe { (*self.id).channel };
        while let Ok(ev) = events::pop(ch, false) {
            // SAFETY: an event just taken.
            let kind = unsafe { (*ev).event };
            if kind == RDMA_CM_EVENT_DISCONNECTED {
                self.disconnected();
            }
            events::free(ev);
        }
    }

    /// Everything the socket can do without waiting.
    fn step(&mut self) {
        self.drain_cq_events();
        self.update_credits();
        self.poll_cq();
        self.drain_cm_events();
        self.poll_cq();
        self.update_credits();
    }

    fn arm(&mut self) {
        if !self.armed {
            // SAFETY: this socket's live CQ.
            unsafe { verbs::req_notify_cq(self.cq, 0) };
            self.armed = true;
        }
    }

    /// The fds a waiter sleeps on: completions and CM events.
    fn wait_fds(&self) -> [c_int; 2] {
        // SAFETY: live channel and id.
        unsafe { [(*self.ch).fd, (*(*self.id).channel).fd] }
    }

    /// One data message of `len` bytes from `sges` into the peer's ring.
    fn write_data(&mut self, sges: &mut [ibv_sge], len: u32, flags: c_uint) -> Result<(), c_int> {
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.sbuf_avail -= len;
        let mut t = self.tsgl(self.target_sge);
        let remote = (t.addr, t.key);
        t.addr = t.addr.wrapping_add(u64::from(len));
        // The peer writes this slot: never trust it to still hold `len`.
        t.length = t.length.saturating_sub(len);
        self.set_tsgl(self.target_sge, t);
        if t.length == 0 {
            self.target_sge = (self.target_sge + 1) % wire::SGL_SIZE;
        }
        self.post_write_msg(sges, wire::imm(wire::OP_DATA, len), flags, remote)
    }

    /// Copies `src` into the send ring at its cursor: one SGE, or two
    /// when it wraps.
    fn stage(&mut self, src: &[&[u8]], len: u32) -> ([ibv_sge; 2], usize) {
        // SAFETY: registered, live until drop.
        let lkey = unsafe { (*self.smr).lkey };
        let left = self.sbuf_size - self.soff;
        let first = len.min(left);
        let mut sg = [ibv_sge::default(); 2];
        sg[0] = ibv_sge {
            addr: self.sbuf.addr() + u64::from(self.soff),
            length: first,
            lkey,
        };
        let mut n = 1;
        if len > first {
            sg[1] = ibv_sge {
                addr: self.sbuf.addr(),
                length: len - first,
                lkey,
            };
            n = 2;
        }
        // Gather the pieces into the ring.
        let mut pos = self.soff as usize;
        for piece in src {
            let mut p: &[u8] = piece;
            while !p.is_empty() {
                let room = self.sbuf_size as usize - pos;
                let k = p.len().min(room);
                // SAFETY: pos + k <= sbuf_size: inside the send ring; the
                // bytes there are not in flight (sbuf_avail counts them
                // free).
                unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), self.sbuf.p.add(pos), k) };
                pos += k;
                if pos == self.sbuf_size as usize {
                    pos = 0;
                }
                p = &p[k..];
            }
        }
        self.soff = pos as u32;
        (sg, n)
    }

    /// How much of `left` the next chunk may carry.
    fn chunk(&self, left: usize, olen: &mut u32, cap: u32) -> u32 {
        let mut x = if (*olen as usize) < left {
            let x = *olen;
            if *olen < MAX_TRANSFER {
                *olen <<= 1;
            }
            x
        } else {
            left as u32
        };
        x = x.min(self.sbuf_avail).min(cap);
        x
    }

    /// Announces the queued riomap mappings (one per call, when a send
    /// slot is free).
    fn send_one_iomap(&mut self) -> Result<(), c_int> {
        let Some(&index) = self.iomap_queue.front() else {
            return Ok(());
        };
        let Some(Some(m)) = self.iomaps.get(index) else {
            self.iomap_queue.pop_front();
            return Ok(());
        };
        // SAFETY: a live MR of this mapping.
        let mr = unsafe { &*m.mr };
        let rec = Iomap {
            offset: m.offset,
            sge: Sge {
                addr: mr.addr as u64,
                key: mr.rkey,
                length: mr.length as u32,
            },
        }
        .to_bytes(self.big);
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.sbuf_avail -= wire::IOMAP_LEN as u32;
        let at = self
            .remote_iomap
            .addr
            .wrapping_add(index as u64 * wire::IOMAP_LEN as u64);
        let msg = wire::imm(wire::OP_IOMAP_SGL, index as u32);
        let remote = (at, self.remote_iomap.key);
        let r = if self.sq_inline >= wire::IOMAP_LEN as u32 {
            let mut sg = ibv_sge {
                addr: rec.as_ptr() as u64,
                length: wire::IOMAP_LEN as u32,
                lkey: 0,
            };
            self.post_write_msg(std::slice::from_mut(&mut sg), msg, IBV_SEND_INLINE, remote)
        } else {
            let (mut sg, n) = self.stage(&[&rec], wire::IOMAP_LEN as u32);
            self.post_write_msg(&mut sg[..n], msg, 0, remote)
        };
        self.iomap_queue.pop_front();
        r
    }

    /// The peer's mapping holding `offset`.
    fn find_iomap(&self, offset: u64) -> Option<Iomap> {
        (0..self.iomap_size)
            .map(|i| self.tiomap(i))
            .find(|m| offset >= m.offset && offset < m.offset.saturating_add(m.sge.length.into()))
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // SAFETY: the socket's own objects, used by nothing else now: the
        // QP first (rdma_destroy_qp), then its CQ and channel, then the
        // MRs (their memory is unmapped after, by the Bufs).
        unsafe {
            cm::softrdma_rdmacm_rdma_destroy_qp(self.id);
            (*self.id).send_cq = null_mut();
            (*self.id).recv_cq = null_mut();
            (*self.id).send_cq_channel = null_mut();
            (*self.id).recv_cq_channel = null_mut();
            verbs::ibv_destroy_cq(self.cq);
            device::ibv_destroy_comp_channel(self.ch);
            for m in self.iomaps.iter().flatten().chain(self.local_maps.iter()) {
                verbs::ibv_dereg_mr(m.mr);
            }
            for mr in [self.smr, self.rmr, self.tmr] {
                if !mr.is_null() {
                    verbs::ibv_dereg_mr(mr);
                }
            }
        }
    }
}

/// The QP, CQ and buffers of a socket about to connect or accept, its
/// receives posted (`rs_create_ep`).
fn create_ep(id: *mut rdma_cm_id, o: &Opts) -> Result<Box<Conn>, c_int> {
    let ctx = Id::live(id).and_then(|i| i.ctx()).ok_or(libc::EINVAL)?;
    // SAFETY: a live id of this module (just checked).
    let idr = unsafe { &mut *id };
    let max = ctx.dev.query_device().max_qp_wr.min(u32::from(QP_MAX_SIZE)) as u16;
    let sq_size = o.sq_size.clamp(QP_MIN_SIZE, max.max(QP_MIN_SIZE));
    let rq_size = o.rq_size.clamp(QP_MIN_SIZE, max.max(QP_MIN_SIZE));
    // SAFETY: the id's open context.
    let ch = unsafe { device::ibv_create_comp_channel(idr.verbs) };
    if ch.is_null() {
        return Err(last_errno());
    }
    // SAFETY: a live channel.
    set_nonblock(unsafe { (*ch).fd }, true);
    let cqe = c_int::from(sq_size) + c_int::from(rq_size);
    // SAFETY: the id's context and the channel just made.
    let cq = unsafe { verbs::ibv_create_cq(idr.verbs, cqe, id.cast(), ch, 0) };
    if cq.is_null() {
        let e = last_errno();
        // SAFETY: unused channel.
        unsafe { device::ibv_destroy_comp_channel(ch) };
        return Err(e);
    }
    let mut attr = ibv_qp_init_attr {
        qp_context: null_mut(),
        send_cq: cq,
        recv_cq: cq,
        srq: null_mut(),
        cap: ibv_qp_cap {
            max_send_wr: sq_size.into(),
            max_recv_wr: rq_size.into(),
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: o.sq_inline.into(),
        },
        qp_type: IBV_QPT_RC,
        sq_sig_all: 1,
    };
    // SAFETY: a live id; the attributes' CQs are live.
    if unsafe { cm::softrdma_rdmacm_rdma_create_qp(id, null_mut(), &mut attr) } != 0 {
        let e = last_errno();
        // SAFETY: unused CQ and channel.
        unsafe {
            verbs::ibv_destroy_cq(cq);
            device::ibv_destroy_comp_channel(ch);
        }
        return Err(e);
    }
    idr.send_cq = cq;
    idr.recv_cq = cq;
    idr.send_cq_channel = ch;
    idr.recv_cq_channel = ch;
    let sbuf_size = o.sbuf_size.max(SNDLOWAT * 2);
    let rbuf_size = (o.rbuf_size.max(2 * SNDLOWAT)) & !1;
    let iomap_size = u32::from(o.iomap_size);
    let bufs = (|| {
        Ok::<_, c_int>((
            Buf::new(sbuf_size as usize + wire::SGE_LEN * CTRL_SLOTS as usize)?,
            Buf::new(rbuf_size as usize)?,
            Buf::new(
                wire::SGE_LEN * wire::SGL_SIZE as usize + wire::IOMAP_LEN * iomap_size as usize,
            )?,
        ))
    })();
    let (sbuf, rbuf, tbuf) = match bufs {
        Ok(b) => b,
        Err(e) => {
            // SAFETY: as in Conn's drop.
            unsafe {
                cm::softrdma_rdmacm_rdma_destroy_qp(id);
                verbs::ibv_destroy_cq(cq);
                device::ibv_destroy_comp_channel(ch);
            }
            return Err(e);
        }
    };
    let mut c = Box::new(Conn {
        id,
        qp: idr.qp,
        cq,
        ch,
        smr: null_mut(),
        rmr: null_mut(),
        tmr: null_mut(),
        sbuf_size,
        rbuf_size,
        sq_size,
        rq_size,
        sq_inline: attr.cap.max_inline_data,
        iomap_size,
        connected: false,
        readable: false,
        writable: false,
        failed: false,
        sseq_no: 0,
        sseq_comp: 0,
        sqe_avail: u32::from(sq_size) - CTRL_SLOTS,
        sbuf_avail: sbuf_size,
        soff: 0,
        target_sge: 0,
        remote_sgl: Sge::default(),
        remote_sge: 0,
        remote_iomap: Sge::default(),
        big: false,
        ctrl_seqno: 0,
        ctrl_max: CTRL_SLOTS,
        rseq_no: 0,
        rseq_comp: rq_size >> 1,
        rbuf_avail: rbuf_size >> 1,
        rbuf_free: rbuf_size >> 1,
        roff: 0,
        rmsg: VecDeque::new(),
        armed: false,
        iomaps: Vec::new(),
        iomap_queue: VecDeque::new(),
        local_maps: Vec::new(),
        sbuf,
        rbuf,
        tbuf,
    });
    let pd = idr.pd;
    for (buf, access, slot) in [
        (&c.sbuf, 1, 0usize), // LOCAL_WRITE
        (&c.rbuf, ACCESS_WRITE, 1),
        (&c.tbuf, ACCESS_WRITE, 2),
    ] {
        // SAFETY: the id's live PD; a mapping this Conn owns (deregistered
        // before it is unmapped).
        let mr = unsafe { verbs::ibv_reg_mr(pd, buf.p.cast(), buf.len, access) };
        if mr.is_null() {
            return Err(last_errno());
        }
        match slot {
            0 => c.smr = mr,
            1 => c.rmr = mr,
            _ => c.tmr = mr,
        }
    }
    c.post_recvs(rq_size.into())?;
    Ok(c)
}

// ----- waiting -----

/// Makes progress on `s` until `test` holds; EAGAIN at once when
/// `nonblock`, else sleeps on the completion channel and the id's fd
/// between tries (for at most `limit`, then ETIMEDOUT).
fn wait(
    s: &Sock,
    nonblock: bool,
    limit: Option<Duration>,
    test: impl Fn(&Conn) -> bool,
) -> Result<MutexGuard<'_, Inner>, c_int> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let fds = {
            let mut g = s.lock();
            let c = g.c.as_mut().ok_or(libc::ENOTCONN)?;
            c.step();
            if test(c) {
                return Ok(g);
            }
            if nonblock {
                return Err(libc::EAGAIN);
            }
            if limit.is_some_and(|l| start.elapsed() > l) {
                return Err(libc::ETIMEDOUT);
            }
            // Busy-poll briefly (the completion is often microseconds
            // away), then arm and sleep.
            if spins < 64 {
                spins += 1;
                continue;
            }
            if !c.armed {
                c.arm();
                continue;
            }
            c.wait_fds()
        };
        let mut p = fds.map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: two valid pollfds for the call.
        unsafe { libc::poll(p.as_mut_ptr(), 2, 1000) };
    }
}

// ----- the entry points -----

pub unsafe extern "C" fn softrdma_rdmacm_rsocket(
    domain: c_int,
    ty: c_int,
    protocol: c_int,
) -> c_int {
    guard(-1, || ret_int(rsocket(domain, ty, protocol)))
}

fn rsocket(domain: c_int, ty: c_int, protocol: c_int) -> Result<c_int, c_int> {
    let kind = ty & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Err(libc::ENOTSUP);
    }
    if kind != libc::SOCK_STREAM || (protocol != 0 && protocol != libc::IPPROTO_TCP) {
        // Datagram rsockets (UD QPs) are not offered.
        return Err(libc::ENOTSUP);
    }
    let mut id = null_mut();
    // SAFETY: a writable out pointer; NULL channel: a synchronous id.
    if unsafe { cm::softrdma_rdmacm_rdma_create_id(null_mut(), &mut id, null_mut(), RDMA_PS_TCP) }
        != 0
    {
        return Err(last_errno());
    }
    // SAFETY: the id just made, and its own channel.
    let fd = unsafe {
        (*id).route.addr.src_storage.ss_family = domain as u16;
        (*(*id).channel).fd
    };
    let o = Opts {
        fs_flags: if ty & libc::SOCK_NONBLOCK != 0 {
            libc::O_NONBLOCK
        } else {
            0
        },
        fd_flags: if ty & libc::SOCK_CLOEXEC != 0 {
            libc::FD_CLOEXEC
        } else {
            0
        },
        ..Opts::default()
    };
    insert(fd, id, State::Init, o, None);
    Ok(fd)
}

fn insert(fd: c_int, id: *mut rdma_cm_id, state: State, o: Opts, c: Option<Box<Conn>>) {
    let s = Arc::new(Sock {
        fd,
        inner: Mutex::new(Inner {
            id,
            state,
            err: 0,
            o,
            c,
        }),
    });
    table().insert(fd, s);
}

/// `*const sockaddr` of `len` bytes → a copy (EINVAL if too short).
///
/// # Safety
/// `addr` is NULL or readable for `len` bytes.
unsafe fn sockaddr_in(
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> Result<libc::sockaddr_storage, c_int> {
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sockaddr_in>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let n = (len as usize).min(std::mem::size_of::<libc::sockaddr_storage>());
    // SAFETY: `n` readable bytes (the contract) into a large enough struct.
    unsafe {
        std::ptr::copy_nonoverlapping(
            addr.cast::<u8>(),
            (&mut ss as *mut libc::sockaddr_storage).cast::<u8>(),
            n,
        )
    };
    Ok(ss)
}

pub unsafe extern "C" fn softrdma_rdmacm_rbind(
    fd: c_int,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> c_int {
    guard(-1, || {
        ret_int((|| {
            let s = lookup(fd)?;
            let mut g = s.lock();
            if g.state != State::Init {
                return Err(libc::EINVAL);
            }
            // SAFETY: per the contract.
            let mut ss = unsafe { sockaddr_in(addr, len) }?;
            // SAFETY: a live id; a sockaddr of ours.
            if unsafe {
                cm::softrdma_rdmacm_rdma_bind_addr(
                    g.id,
                    (&mut ss as *mut libc::sockaddr_storage).cast(),
                )
            } != 0
            {
                return Err(last_errno());
            }
            g.state = State::Bound;
            Ok(0)
        })())
    })
}

pub unsafe extern "C" fn softrdma_rdmacm_rlisten(fd: c_int, backlog: c_int) -> c_int {
    guard(-1, || {
        ret_int((|| {
            let s = lookup(fd)?;
            let mut g = s.lock();
            match g.state {
                State::Listening => return Ok(0),
                State::Init | State::Bound => {}
                _ => return Err(libc::EINVAL),
            }
            // SAFETY: a live id.
            if unsafe { cm::softrdma_rdmacm_rdma_listen(g.id, backlog) } != 0 {
                return Err(last_errno());
            }
            set_nonblock(fd, true);
            g.state = State::Listening;
            Ok(0)
        })())
    })
}

pub unsafe extern "C" fn softrdma_rdmacm_raccept(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    guard(-1, || {
        let r = accept(fd);
        if let Ok(new) = r {
            if !addr.is_null() && !len.is_null() {
                // SAFETY: per the contract.
                let _ = unsafe { getname(new, addr, len, true) };
            }
        }
        ret_int(r)
    })
}

/// The next connection request of a listener, accepted (`rs_accept`):
/// the request's connection data saved, ours in the REP.
fn accept(fd: c_int) -> Result<c_int, c_int> {
    let s = lookup(fd)?;
    loop {
        let (lid, o) = {
            let g = s.lock();
            if g.state != State::Listening {
                return Err(libc::EINVAL);
            }
            (g.id, g.o)
        };
        if !readable_now(fd) {
            if o.fs_flags & libc::O_NONBLOCK != 0 {
                return Err(libc::EAGAIN);
            }
            crate::ffi::wait_readable(fd, 1000);
            continue;
        }
        let mut id = null_mut();
        // SAFETY: a live listener; a writable out pointer.
        if unsafe { cm::softrdma_rdmacm_rdma_get_request(lid, &mut id) } != 0 {
            match last_errno() {
                libc::EAGAIN => continue,
                e => return Err(e),
            }
        }
        match accept_one(id, &o) {
            Ok(c) => {
                // SAFETY: the new id and its own channel.
                let nfd = unsafe { (*(*id).channel).fd };
                set_nonblock(nfd, true);
                insert(nfd, id, State::Connected, o, Some(c));
                return Ok(nfd);
            }
            Err(_) => {
                // A request we cannot serve is refused; wait for the next.
                // SAFETY: the new id, used by nothing else.
                unsafe {
                    cm::softrdma_rdmacm_rdma_reject(id, std::ptr::null(), 0);
                    cm::softrdma_rdmacm_rdma_destroy_id(id);
                }
            }
        }
    }
}

fn accept_one(id: *mut rdma_cm_id, o: &Opts) -> Result<Box<Conn>, c_int> {
    // SAFETY: the new id holds its CONNECT_REQUEST event.
    let (peer, mut param) = unsafe {
        let ev = (*id).event;
        if ev.is_null() {
            return Err(libc::EINVAL);
        }
        let p = (*ev).param.conn;
        let data = if p.private_data.is_null() {
            &[][..]
        } else {
            std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len.into())
        };
        (ConnData::decode(data).map_err(|_| libc::EPROTO)?, p)
    };
    let mut c = create_ep(id, o)?;
    c.save(&peer)?;
    let mine = c.conn_data().encode();
    param.private_data = mine.as_ptr().cast();
    param.private_data_len = mine.len() as u8;
    // SAFETY: a live id with its QP; the parameters live for the call.
    if unsafe { cm::softrdma_rdmacm_rdma_accept(id, &mut param) } != 0 {
        return Err(last_errno());
    }
    Ok(c)
}

pub unsafe extern "C" fn softrdma_rdmacm_rconnect(
    fd: c_int,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        let dst = unsafe { sockaddr_in(addr, len) };
        ret_int(dst.and_then(|d| connect(fd, d)))
    })
}

/// Resolves, makes the QP and buffers, and connects with our connection
/// data in the REQ; the REP's is the peer's. Completes before returning
/// (never EINPROGRESS).
fn connect(fd: c_int, mut dst: libc::sockaddr_storage) -> Result<c_int, c_int> {
    let s = lookup(fd)?;
    let mut g = s.lock();
    match g.state {
        State::Init | State::Bound => {}
        State::Connected => return Err(libc::EISCONN),
        State::ConnectError => return Err(libc::ECONNABORTED),
        State::Listening => return Err(libc::EINVAL),
    }
    let id = g.id;
    let r = (|| {
        // SAFETY: a live synchronous id; the address lives for the calls.
        unsafe {
            if cm::softrdma_rdmacm_rdma_resolve_addr(
                id,
                null_mut(),
                (&mut dst as *mut libc::sockaddr_storage).cast(),
                2000,
            ) != 0
            {
                return Err(last_errno());
            }
            if cm::softrdma_rdmacm_rdma_resolve_route(id, 2000) != 0 {
                return Err(last_errno());
            }
        }
        let mut c = create_ep(id, &g.o)?;
        let mine = c.conn_data().encode();
        let mut param = rdma_conn_param {
            private_data: mine.as_ptr().cast(),
            private_data_len: mine.len() as u8,
            responder_resources: 0,
            initiator_depth: 0,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        };
        // SAFETY: a live id with its QP; the parameters live for the call.
        if unsafe { cm::softrdma_rdmacm_rdma_connect(id, &mut param) } != 0 {
            return Err(last_errno());
        }
        // SAFETY: a synchronous id keeps its ESTABLISHED event.
        let peer = unsafe {
            let ev = (*id).event;
            if ev.is_null() {
                return Err(libc::EPROTO);
            }
            let p = (*ev).param.conn;
            let data = if p.private_data.is_null() {
                &[][..]
            } else {
                std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len.into())
            };
            ConnData::decode(data).map_err(|_| libc::ENOTSUP)?
        };
        c.save(&peer)?;
        Ok(c)
    })();
    match r {
        Ok(c) => {
            set_nonblock(fd, true);
            g.c = Some(c);
            g.state = State::Connected;
            Ok(0)
        }
        Err(e) => {
            g.state = State::ConnectError;
            g.err = e;
            Err(e)
        }
    }
}

fn nonblocking(o: &Opts, flags: c_int) -> bool {
    o.fs_flags & libc::O_NONBLOCK != 0 || flags & libc::MSG_DONTWAIT != 0
}

pub unsafe extern "C" fn softrdma_rdmacm_rrecv(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
) -> isize {
    guard(-1, || {
        if buf.is_null() && len > 0 {
            return ret_size(Err(libc::EFAULT));
        }
        // SAFETY: per the contract, `len` writable bytes.
        ret_size(unsafe { recv(fd, buf.cast(), len, flags) })
    })
}

/// Copies queued data out in order (`MSG_PEEK` leaves it), waiting for
/// some unless non-blocking; 0 at end of stream.
///
/// # Safety
/// `buf` is writable for `len` bytes.
unsafe fn recv(fd: c_int, buf: *mut u8, len: usize, flags: c_int) -> Result<usize, c_int> {
    let s = lookup(fd)?;
    let o = {
        let g = s.lock();
        if g.c.is_none() {
            return Err(libc::ENOTCONN);
        }
        g.o
    };
    let nb = nonblocking(&o, flags);
    let mut done = 0usize;
    loop {
        let mut g = match wait(&s, nb, None, |c| c.have_rdata() || !c.readable) {
            Ok(g) => g,
            Err(e) if done == 0 => return Err(e),
            Err(_) => return Ok(done),
        };
        let Some(c) = g.c.as_mut() else {
            return Err(libc::ENOTCONN);
        };
        if len == 0 {
            return Ok(0);
        }
        let peek = flags & libc::MSG_PEEK != 0;
        let mut off = c.roff;
        let mut idx = 0usize;
        while done < len && idx < c.rmsg.len() {
            let avail = c.rmsg[idx];
            let take = avail.min((len - done).min(u32::MAX as usize) as u32);
            // Copy `take` bytes from the ring at `off`, wrapping.
            let mut k = 0u32;
            while k < take {
                let run = (take - k).min(c.rbuf_size - off);
                // SAFETY: off + run <= rbuf_size: inside the ring, whose
                // bytes the completion said arrived; `buf` has room for
                // `len` bytes (the contract) and done + run <= len.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        c.rbuf.p.add(off as usize),
                        buf.add(done),
                        run as usize,
                    )
                };
                done += run as usize;
                k += run;
                off += run;
                if off == c.rbuf_size {
                    off = 0;
                }
            }
            if peek {
                idx += 1;
                continue;
            }
            c.roff = off;
            c.rbuf_avail = c.rbuf_avail.saturating_add(take);
            if take == avail {
                c.rmsg.pop_front();
                c.rseq_no = c.rseq_no.wrapping_add(1);
            } else {
                c.rmsg[0] -= take;
            }
        }
        if !peek {
            c.update_credits();
        }
        let more = flags & libc::MSG_WAITALL != 0 && !peek && c.readable;
        if done >= len || done == 0 || !more {
            return Ok(done);
        }
    }
}

pub unsafe extern "C" fn softrdma_rdmacm_rrecvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    src: *mut libc::sockaddr,
    srclen: *mut libc::socklen_t,
) -> isize {
    guard(-1, || {
        if buf.is_null() && len > 0 {
            return ret_size(Err(libc::EFAULT));
        }
        // SAFETY: per the contract.
        let r = unsafe { recv(fd, buf.cast(), len, flags) };
        if matches!(r, Ok(n) if n > 0) && !src.is_null() && !srclen.is_null() {
            // SAFETY: per the contract.
            let _ = unsafe { getname(fd, src, srclen, true) };
        }
        ret_size(r)
    })
}

pub unsafe extern "C" fn softrdma_rdmacm_rrecvmsg(
    fd: c_int,
    msg: *mut libc::msghdr,
    flags: c_int,
) -> isize {
    guard(-1, || {
        // SAFETY: per the contract, a readable msghdr.
        let Some(m) = (unsafe { msg.as_ref() }) else {
            return ret_size(Err(libc::EFAULT));
        };
        if !m.msg_control.is_null() && m.msg_controllen > 0 {
            return ret_size(Err(libc::ENOTSUP));
        }
        // SAFETY: per the contract, its iovecs readable and writable.
        ret_size(unsafe { recvv(fd, m.msg_iov, m.msg_iovlen as c_int, flags) })
    })
}

/// Fills the iovecs in order (one receive per vector while data is
/// there).
///
/// # Safety
/// `iov` holds `n` iovecs of writable memory.
unsafe fn recvv(
    fd: c_int,
    iov: *const libc::iovec,
    n: c_int,
    flags: c_int,
) -> Result<usize, c_int> {
    if n < 0 || (n > 0 && iov.is_null()) {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let v = unsafe { std::slice::from_raw_parts(iov, n as usize) };
    let mut total = 0usize;
    for (i, e) in v.iter().enumerate() {
        if e.iov_len == 0 {
            continue;
        }
        let f = if i == 0 {
            flags
        } else {
            flags | libc::MSG_DONTWAIT
        };
        // SAFETY: per the contract.
        match unsafe { recv(fd, e.iov_base.cast(), e.iov_len, f) } {
            Ok(k) => {
                total += k;
                if k < e.iov_len {
                    break;
                }
            }
            Err(e) if total == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(total)
}

pub unsafe extern "C" fn softrdma_rdmacm_rread(fd: c_int, buf: *mut c_void, n: usize) -> isize {
    // SAFETY: per the contract.
    unsafe { softrdma_rdmacm_rrecv(fd, buf, n, 0) }
}

pub unsafe extern "C" fn softrdma_rdmacm_rreadv(
    fd: c_int,
    iov: *const libc::iovec,
    n: c_int,
) -> isize {
    // SAFETY: per the contract.
    guard(-1, || ret_size(unsafe { recvv(fd, iov, n, 0) }))
}

pub unsafe extern "C" fn softrdma_rdmacm_rsend(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
) -> isize {
    guard(-1, || {
        if buf.is_null() && len > 0 {
            return ret_size(Err(libc::EFAULT));
        }
        // SAFETY: per the contract, `len` readable bytes.
        let data = unsafe { slice(buf.cast(), len) };
        ret_size(send(fd, &[data], flags, None))
    })
}

/// # Safety
/// `p` is readable for `n` bytes (or n == 0).
unsafe fn slice<'a>(p: *const u8, n: usize) -> &'a [u8] {
    if n == 0 {
        &[]
    } else {
        // SAFETY: per the contract.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

/// Sends the pieces in order as data messages (or, with `io`, as RDMA
/// WRITEs to the peer's mapping at that offset); returns how many bytes
/// went (EAGAIN / EPIPE only if none did).
fn send(fd: c_int, pieces: &[&[u8]], flags: c_int, io: Option<u64>) -> Result<usize, c_int> {
    let s = lookup(fd)?;
    let o = {
        let g = s.lock();
        if g.c.is_none() {
            return Err(libc::ENOTCONN);
        }
        g.o
    };
    let nb = nonblocking(&o, flags);
    let total: usize = pieces.iter().map(|p| p.len()).sum();
    let mut done = 0usize;
    let mut olen = OLAP_START;
    // Position in the pieces.
    let (mut pi, mut po) = (0usize, 0usize);
    let ready = |c: &Conn| c.can_send() || !c.writable;
    // The mappings riomap queued go first.
    loop {
        let pending = {
            let g = s.lock();
            g.c.as_ref().is_some_and(|c| !c.iomap_queue.is_empty())
        };
        if !pending {
            break;
        }
        let mut g = wait(&s, nb, None, ready)?;
        let c = g.c.as_mut().ok_or(libc::ENOTCONN)?;
        if !c.writable {
            return Err(libc::EPIPE);
        }
        if let Err(e) = c.send_one_iomap() {
            c.fail(e);
            return Err(e);
        }
    }
    while done < total {
        let mut g = match wait(&s, nb, None, ready) {
            Ok(g) => g,
            Err(e) if done == 0 => return Err(e),
            Err(_) => break,
        };
        let c = g.c.as_mut().ok_or(libc::ENOTCONN)?;
        if !c.writable {
            if done == 0 {
                return Err(if c.failed {
                    libc::ECONNRESET
                } else {
                    libc::EPIPE
                });
            }
            break;
        }
        let (cap, remote) = match io {
            None => (c.tsgl(c.target_sge).length, None),
            Some(base) => {
                let at = base.saturating_add(done as u64);
                let Some(m) = c.find_iomap(at) else {
                    if done == 0 {
                        return Err(libc::EINVAL);
                    }
                    break;
                };
                // `find_iomap` checked m.offset <= at < m.offset + length.
                let left = m.offset.saturating_add(m.sge.length.into()) - at;
                (
                    left.min(u64::from(u32::MAX)) as u32,
                    Some((m.sge.addr.wrapping_add(at - m.offset), m.sge.key)),
                )
            }
        };
        let x = c.chunk(total - done, &mut olen, cap);
        if x == 0 {
            continue;
        }
        // The chunk's pieces.
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2);
        let mut need = x as usize;
        while need > 0 {
            let p = &pieces[pi][po..];
            let k = p.len().min(need);
            if k > 0 {
                parts.push(&p[..k]);
            }
            need -= k;
            po += k;
            if po == pieces[pi].len() {
                pi += 1;
                po = 0;
            }
        }
        let r = if x <= c.sq_inline && parts.len() <= 2 {
            let mut sg = [ibv_sge::default(); 2];
            for (k, p) in parts.iter().enumerate() {
                sg[k] = ibv_sge {
                    addr: p.as_ptr() as u64,
                    length: p.len() as u32,
                    lkey: 0,
                };
            }
            let n = parts.len();
            match remote {
                None => c.write_data(&mut sg[..n], x, IBV_SEND_INLINE),
                Some(rm) => {
                    c.sqe_avail -= 1;
                    c.sbuf_avail -= x;
                    c.post(
                        u64::from(wire::imm(wire::OP_WRITE, x)),
                        IBV_WR_RDMA_WRITE,
                        &mut sg[..n],
                        IBV_SEND_INLINE,
                        0,
                        rm,
                    )
                }
            }
        } else {
            let (mut sg, n) = c.stage(&parts, x);
            match remote {
                None => c.write_data(&mut sg[..n], x, 0),
                Some(rm) => {
                    c.sqe_avail -= 1;
                    c.sbuf_avail -= x;
                    c.post(
                        u64::from(wire::imm(wire::OP_WRITE, x)),
                        IBV_WR_RDMA_WRITE,
                        &mut sg[..n],
                        0,
                        0,
                        rm,
                    )
                }
            }
        };
        if let Err(e) = r {
            c.fail(e);
            if done == 0 {
                return Err(e);
            }
            break;
        }
        done += x as usize;
    }
    Ok(done)
}

pub unsafe extern "C" fn softrdma_rdmacm_rsendto(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    dst: *const libc::sockaddr,
    dstlen: libc::socklen_t,
) -> isize {
    if !dst.is_null() || dstlen != 0 {
        return guard(-1, || {
            if lookup(fd).is_err() {
                return ret_size(Err(libc::EBADF));
            }
            ret_size(Err(libc::EISCONN))
        });
    }
    // SAFETY: per the contract.
    unsafe { softrdma_rdmacm_rsend(fd, buf, len, flags) }
}

/// # Safety
/// `iov` holds `n` iovecs of readable memory.
unsafe fn sendv(
    fd: c_int,
    iov: *const libc::iovec,
    n: c_int,
    flags: c_int,
) -> Result<usize, c_int> {
    if n < 0 || (n > 0 && iov.is_null()) {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let v = unsafe { std::slice::from_raw_parts(iov, n as usize) };
    let pieces: Vec<&[u8]> = v
        .iter()
        // SAFETY: per the contract.
        .map(|e| unsafe { slice(e.iov_base.cast(), e.iov_len) })
        .collect();
    send(fd, &pieces, flags, None)
}

pub unsafe extern "C" fn softrdma_rdmacm_rsendmsg(
    fd: c_int,
    msg: *const libc::msghdr,
    flags: c_int,
) -> isize {
    guard(-1, || {
        // SAFETY: per the contract.
        let Some(m) = (unsafe { msg.as_ref() }) else {
            return ret_size(Err(libc::EFAULT));
        };
        if !m.msg_control.is_null() && m.msg_controllen > 0 {
            return ret_size(Err(libc::ENOTSUP));
        }
        // SAFETY: per the contract.
        ret_size(unsafe { sendv(fd, m.msg_iov, m.msg_iovlen as c_int, flags) })
    })
}

pub unsafe extern "C" fn softrdma_rdmacm_rwrite(fd: c_int, buf: *const c_void, n: usize) -> isize {
    // SAFETY: per the contract.
    unsafe { softrdma_rdmacm_rsend(fd, buf, n, 0) }
}

pub unsafe extern "C" fn softrdma_rdmacm_rwritev(
    fd: c_int,
    iov: *const libc::iovec,
    n: c_int,
) -> isize {
    // SAFETY: per the contract.
    guard(-1, || ret_size(unsafe { sendv(fd, iov, n, 0) }))
}

// ----- readiness -----

/// A socket's poll events now, after what progress it can make.
fn revents(s: &Sock, events: i16) -> i16 {
    let mut g = s.lock();
    match g.state {
        State::Listening => {
            if events & libc::POLLIN != 0 && readable_now(s.fd) {
                libc::POLLIN
            } else {
                0
            }
        }
        State::ConnectError => (events & (libc::POLLIN | libc::POLLOUT)) | libc::POLLERR,
        State::Connected => {
            let Some(c) = g.c.as_mut() else { return 0 };
            c.step();
            let mut r = 0;
            if events & libc::POLLIN != 0 && (c.have_rdata() || !c.readable) {
                r |= libc::POLLIN;
            }
            if events & libc::POLLOUT != 0 && c.can_send() && c.writable {
                r |= libc::POLLOUT;
            }
            // Hang-up once the data that came before it is read (TCP
            // reports a peer's close as readable, never before the data):
            // rsockets reports it at once, so a reader polling between
            // chunks could see it with data still queued.
            if !c.connected && (c.failed || !c.have_rdata()) {
                r |= if c.failed {
                    libc::POLLERR
                } else {
                    libc::POLLHUP
                };
            }
            r
        }
        State::Init | State::Bound => 0,
    }
}

/// What to sleep on for a socket: arms its CQ; None if it became ready.
fn arm_fds(s: &Sock) -> Vec<c_int> {
    let mut g = s.lock();
    match g.state {
        State::Connected => match g.c.as_mut() {
            Some(c) => {
                c.arm();
                c.wait_fds().to_vec()
            }
            None => vec![],
        },
        _ => vec![s.fd],
    }
}

pub unsafe extern "C" fn softrdma_rdmacm_rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    guard(-1, || {
        if fds.is_null() && nfds > 0 {
            return ret_int(Err(libc::EFAULT));
        }
        let v = if nfds == 0 {
            &mut [][..]
        } else {
            // SAFETY: per the contract, `nfds` pollfds.
            unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) }
        };
        ret_int(rpoll(v, timeout))
    })
}

/// poll(2) over rsockets and ordinary fds together: the sockets' own
/// readiness; between tries a real poll on their completion channels,
/// event fds and the ordinary fds.
fn rpoll(fds: &mut [libc::pollfd], timeout: c_int) -> Result<c_int, c_int> {
    let start = Instant::now();
    let socks: Vec<Option<Arc<Sock>>> = fds.iter().map(|p| lookup(p.fd).ok()).collect();
    let mut spins = 0u32;
    loop {
        let mut n = 0;
        let mut plain: Vec<libc::pollfd> = Vec::new();
        for (p, s) in fds.iter_mut().zip(&socks) {
            match s {
                Some(s) => p.revents = revents(s, p.events),
                None => plain.push(libc::pollfd {
                    fd: p.fd,
                    events: p.events,
                    revents: 0,
                }),
            }
        }
        if !plain.is_empty() {
            // SAFETY: valid pollfds for the call.
            unsafe { libc::poll(plain.as_mut_ptr(), plain.len() as libc::nfds_t, 0) };
            let mut it = plain.iter();
            for (p, s) in fds.iter_mut().zip(&socks) {
                if s.is_none() {
                    p.revents = it.next().map_or(0, |q| q.revents);
                }
            }
        }
        for p in fds.iter() {
            if p.revents != 0 {
                n += 1;
            }
        }
        let elapsed = start.elapsed();
        if n > 0 || timeout == 0 {
            return Ok(n);
        }
        if timeout > 0 && elapsed >= Duration::from_millis(timeout as u64) {
            return Ok(0);
        }
        if spins < 64 {
            spins += 1;
            continue;
        }
        // Sleep on everything that can change.
        let mut wait: Vec<libc::pollfd> = Vec::new();
        for (p, s) in fds.iter().zip(&socks) {
            match s {
                Some(s) => {
                    for fd in arm_fds(s) {
                        wait.push(libc::pollfd {
                            fd,
                            events: libc::POLLIN,
                            revents: 0,
                        });
                    }
                }
                None => wait.push(libc::pollfd {
                    fd: p.fd,
                    events: p.events,
                    revents: 0,
                }),
            }
        }
        // A socket may have become ready while arming.
        let mut ready = false;
        for (p, s) in fds.iter().zip(&socks) {
            if let Some(s) = s {
                if revents(s, p.events) != 0 {
                    ready = true;
                }
            }
        }
        if ready {
            continue;
        }
        let slice = if timeout < 0 {
            1000
        } else {
            let left = timeout as u128 - elapsed.as_millis().min(timeout as u128);
            left.clamp(1, 1000) as c_int
        };
        // SAFETY: valid pollfds for the call.
        let r = unsafe { libc::poll(wait.as_mut_ptr(), wait.len() as libc::nfds_t, slice) };
        if r < 0 {
            let e = last_errno();
            if e != libc::EINTR {
                return Err(e);
            }
        }
    }
}

pub unsafe extern "C" fn softrdma_rdmacm_rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    tv: *mut libc::timeval,
) -> c_int {
    guard(-1, || {
        if !(0..=libc::FD_SETSIZE as c_int).contains(&nfds) {
            return ret_int(Err(libc::EINVAL));
        }
        let mut p: Vec<libc::pollfd> = Vec::new();
        // SAFETY: the sets are NULL or valid fd_sets (the contract); fd <
        // nfds <= FD_SETSIZE.
        unsafe {
            for fd in 0..nfds {
                let mut ev = 0;
                if !readfds.is_null() && libc::FD_ISSET(fd, readfds) {
                    ev |= libc::POLLIN;
                }
                if !writefds.is_null() && libc::FD_ISSET(fd, writefds) {
                    ev |= libc::POLLOUT;
                }
                if !exceptfds.is_null() && libc::FD_ISSET(fd, exceptfds) {
                    ev |= libc::POLLPRI;
                }
                if ev != 0 {
                    p.push(libc::pollfd {
                        fd,
                        events: ev,
                        revents: 0,
                    });
                }
            }
        }
        let timeout = if tv.is_null() {
            -1
        } else {
            // SAFETY: per the contract.
            let t = unsafe { &*tv };
            (t.tv_sec.max(0) * 1000 + t.tv_usec.max(0) / 1000).min(i64::from(c_int::MAX)) as c_int
        };
        let r = rpoll(&mut p, timeout);
        let Ok(_) = r else {
            return ret_int(r);
        };
        let mut count = 0;
        // SAFETY: as above.
        unsafe {
            for set in [readfds, writefds, exceptfds] {
                if !set.is_null() {
                    libc::FD_ZERO(set);
                }
            }
            for q in &p {
                if !readfds.is_null()
                    && q.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
                    && q.events & libc::POLLIN != 0
                {
                    libc::FD_SET(q.fd, readfds);
                    count += 1;
                }
                if !writefds.is_null()
                    && q.revents & (libc::POLLOUT | libc::POLLERR) != 0
                    && q.events & libc::POLLOUT != 0
                {
                    libc::FD_SET(q.fd, writefds);
                    count += 1;
                }
                if !exceptfds.is_null() && q.revents & libc::POLLPRI != 0 {
                    libc::FD_SET(q.fd, exceptfds);
                    count += 1;
                }
            }
        }
        count
    })
}

// ----- shutdown, close, names -----

pub unsafe extern "C" fn softrdma_rdmacm_rshutdown(fd: c_int, how: c_int) -> c_int {
    guard(-1, || ret_int(shutdown(fd, how)))
}

fn shutdown(fd: c_int, how: c_int) -> Result<c_int, c_int> {
    let s = lookup(fd)?;
    let ctrl = {
        let mut g = s.lock();
        let Some(c) = g.c.as_mut() else {
            return Err(libc::ENOTCONN);
        };
        if !c.connected {
            return Ok(0);
        }
        match how {
            libc::SHUT_RDWR => {
                c.readable = false;
                c.writable = false;
                wire::CTRL_DISCONNECT
            }
            libc::SHUT_WR => {
                c.writable = false;
                if c.readable {
                    wire::CTRL_SHUTDOWN
                } else {
                    wire::CTRL_DISCONNECT
                }
            }
            libc::SHUT_RD => {
                c.readable = false;
                if c.writable {
                    return Ok(0);
                }
                wire::CTRL_DISCONNECT
            }
            _ => return Err(libc::EINVAL),
        }
    };
    // A control slot, then the message, then every send completed.
    if let Ok(mut g) = wait(&s, false, Some(CLOSE_WAIT), |c| {
        c.ctrl_avail() || !c.connected
    }) {
        if let Some(c) = g.c.as_mut() {
            if c.connected && c.ctrl_avail() {
                c.ctrl_seqno = c.ctrl_seqno.wrapping_add(1);
                if let Err(e) = c.post_msg(wire::imm(wire::OP_CTRL, ctrl)) {
                    c.fail(e);
                }
            }
        }
    }
    drop(wait(&s, false, Some(CLOSE_WAIT), |c| {
        c.all_sends_done() || !c.connected
    }));
    Ok(0)
}

pub unsafe extern "C" fn softrdma_rdmacm_rclose(fd: c_int) -> c_int {
    guard(-1, || ret_int(close(fd)))
}

fn close(fd: c_int) -> Result<c_int, c_int> {
    let s = lookup(fd)?;
    let connected = s.lock().c.as_ref().is_some_and(|c| c.connected);
    if connected {
        let _ = shutdown(fd, libc::SHUT_RDWR);
    }
    table().remove(&fd);
    let mut g = s.lock();
    // The data path first, then the id (a DREQ to a peer still there).
    drop(g.c.take());
    let id = std::mem::replace(&mut g.id, null_mut());
    if !id.is_null() {
        // SAFETY: the socket's id, used by nothing else now.
        unsafe { cm::softrdma_rdmacm_rdma_destroy_id(id) };
    }
    Ok(0)
}

/// Copies the local or peer address of socket `fd` out.
///
/// # Safety
/// `addr` writable for `*len` bytes, `len` readable and writable.
unsafe fn getname(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
    peer: bool,
) -> Result<c_int, c_int> {
    if addr.is_null() || len.is_null() {
        return Err(libc::EFAULT);
    }
    let s = lookup(fd)?;
    let g = s.lock();
    // SAFETY: a live id.
    let route = unsafe { &(*g.id).route };
    let a = super::addr::route_addr(route, peer);
    let (ss, n) = match a {
        Some(a) => super::addr::to_c(a),
        None => {
            if peer {
                return Err(libc::ENOTCONN);
            }
            // SAFETY: all-zero is a valid sockaddr_storage.
            let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            ss.ss_family = route.addr.src_storage.ss_family;
            let n = if ss.ss_family == libc::AF_INET6 as u16 {
                std::mem::size_of::<libc::sockaddr_in6>()
            } else {
                std::mem::size_of::<libc::sockaddr_in>()
            };
            (ss, n as libc::socklen_t)
        }
    };
    // SAFETY: per the contract.
    unsafe {
        let k = (*len).min(n) as usize;
        std::ptr::copy_nonoverlapping(
            (&ss as *const libc::sockaddr_storage).cast::<u8>(),
            addr.cast::<u8>(),
            k,
        );
        *len = n;
    }
    Ok(0)
}

pub unsafe extern "C" fn softrdma_rdmacm_rgetpeername(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    // SAFETY: per the contract.
    guard(-1, || ret_int(unsafe { getname(fd, addr, len, true) }))
}

pub unsafe extern "C" fn softrdma_rdmacm_rgetsockname(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    // SAFETY: per the contract.
    guard(-1, || ret_int(unsafe { getname(fd, addr, len, false) }))
}

// ----- options -----

/// An int option value (EINVAL if shorter).
///
/// # Safety
/// `v` readable for `len` bytes.
unsafe fn int_opt(v: *const c_void, len: libc::socklen_t) -> Result<c_int, c_int> {
    if v.is_null() || (len as usize) < std::mem::size_of::<c_int>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    Ok(unsafe { std::ptr::read_unaligned(v.cast::<c_int>()) })
}

fn set_bit(bits: &mut u64, name: c_int, on: bool) {
    if (0..64).contains(&name) {
        if on {
            *bits |= 1 << name;
        } else {
            *bits &= !(1 << name);
        }
    }
}

pub unsafe extern "C" fn softrdma_rdmacm_rsetsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *const c_void,
    len: libc::socklen_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        ret_int(unsafe { setsockopt(fd, level, name, v, len) })
    })
}

/// rsockets' options: socket buffer sizes (doubled, as Linux does), the
/// RDMA queue sizes, inline size and mapping slots (before connecting),
/// and flags kept only to be read back.
///
/// # Safety
/// `v` readable for `len` bytes.
unsafe fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *const c_void,
    len: libc::socklen_t,
) -> Result<c_int, c_int> {
    let s = lookup(fd)?;
    let mut g = s.lock();
    let before_connect = matches!(g.state, State::Init | State::Bound | State::Listening);
    // SAFETY: per the contract.
    let val = || unsafe { int_opt(v, len) };
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE) => {
            let on = val()? != 0;
            set_bit(&mut g.o.so_opts, name, on);
        }
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
            let n = val()?.max(0) as u32;
            if g.c.is_none() {
                g.o.rbuf_size = n.saturating_mul(2).max(2 * SNDLOWAT);
            }
        }
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
            let n = val()?.max(0) as u32;
            if g.c.is_none() {
                g.o.sbuf_size = n.saturating_mul(2).max(2 * SNDLOWAT);
            }
        }
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            if v.is_null() || (len as usize) < std::mem::size_of::<libc::linger>() {
                return Err(libc::EINVAL);
            }
            // SAFETY: a readable linger (checked size).
            let l = unsafe { std::ptr::read_unaligned(v.cast::<libc::linger>()) };
            // Stored inverted, as rsockets: lingering is the default.
            set_bit(&mut g.o.so_opts, name, l.l_onoff == 0);
        }
        (libc::IPPROTO_IP, libc::IP_TOS) => g.o.ip_tos = val()?,
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => {
            let on = val()? != 0;
            set_bit(&mut g.o.tcp_opts, name, on);
        }
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
            let t = val()?;
            if t <= 0 {
                return Err(libc::EINVAL);
            }
            g.o.keepalive_time = t;
        }
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL | libc::TCP_MAXSEG) => {}
        (libc::IPPROTO_TCP, libc::TCP_CONGESTION) => {}
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => {
            let on = val()? != 0;
            set_bit(&mut g.o.ipv6_opts, name, on);
        }
        (SOL_RDMA, _) if !before_connect => return Err(libc::EINVAL),
        (SOL_RDMA, RDMA_SQSIZE) => g.o.sq_size = val()?.clamp(0, QP_MAX_SIZE.into()) as u16,
        (SOL_RDMA, RDMA_RQSIZE) => g.o.rq_size = val()?.clamp(0, QP_MAX_SIZE.into()) as u16,
        (SOL_RDMA, RDMA_INLINE) => g.o.sq_inline = val()?.clamp(0, QP_MAX_SIZE.into()) as u16,
        (SOL_RDMA, RDMA_IOMAPSIZE) => {
            let n = val()?.max(0) as u32;
            g.o.iomap_size = wire::scale_to_value(wire::value_to_scale(n, 8) & 0xFF, 8) as u16;
        }
        // A path record: the route is the device's RoCE port here.
        (SOL_RDMA, RDMA_ROUTE) => {}
        _ => return Err(libc::ENOTSUP),
    }
    Ok(0)
}

pub unsafe extern "C" fn softrdma_rdmacm_rgetsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *mut c_void,
    len: *mut libc::socklen_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        ret_int(unsafe { getsockopt(fd, level, name, v, len) })
    })
}

/// # Safety
/// `v` writable for `*len` bytes; `len` readable and writable.
unsafe fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *mut c_void,
    len: *mut libc::socklen_t,
) -> Result<c_int, c_int> {
    if v.is_null() || len.is_null() {
        return Err(libc::EFAULT);
    }
    let s = lookup(fd)?;
    let mut g = s.lock();
    let bit = |bits: u64| c_int::from(bits & (1 << name) != 0);
    let int = match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE) => {
            bit(g.o.so_opts)
        }
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
            g.c.as_ref().map_or(g.o.rbuf_size, |c| c.rbuf_size) as c_int
        }
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
            g.c.as_ref().map_or(g.o.sbuf_size, |c| c.sbuf_size) as c_int
        }
        (libc::SOL_SOCKET, libc::SO_ERROR) => std::mem::take(&mut g.err),
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            // SAFETY: per the contract.
            unsafe {
                if (*len as usize) < std::mem::size_of::<libc::linger>() {
                    return Err(libc::EINVAL);
                }
                let l = libc::linger {
                    l_onoff: c_int::from(g.o.so_opts & (1 << name) == 0),
                    l_linger: 0,
                };
                std::ptr::write_unaligned(v.cast::<libc::linger>(), l);
                *len = std::mem::size_of::<libc::linger>() as libc::socklen_t;
            }
            return Ok(0);
        }
        (libc::IPPROTO_IP, libc::IP_TOS) => g.o.ip_tos,
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => bit(g.o.tcp_opts),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => g.o.keepalive_time,
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL) => 1,
        (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => 2048,
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => bit(g.o.ipv6_opts),
        (SOL_RDMA, RDMA_SQSIZE) => g.c.as_ref().map_or(g.o.sq_size, |c| c.sq_size).into(),
        (SOL_RDMA, RDMA_RQSIZE) => g.c.as_ref().map_or(g.o.rq_size, |c| c.rq_size).into(),
        (SOL_RDMA, RDMA_INLINE) => {
            g.c.as_ref()
                .map_or(u32::from(g.o.sq_inline), |c| c.sq_inline) as c_int
        }
        (SOL_RDMA, RDMA_IOMAPSIZE) => g.o.iomap_size.into(),
        _ => return Err(libc::ENOTSUP),
    };
    // SAFETY: per the contract.
    unsafe {
        if (*len as usize) < std::mem::size_of::<c_int>() {
            return Err(libc::EINVAL);
        }
        std::ptr::write_unaligned(v.cast::<c_int>(), int);
        *len = std::mem::size_of::<c_int>() as libc::socklen_t;
    }
    Ok(0)
}

/// `rfcntl(fd, cmd, ...)`: the one optional argument is read as an int
/// register argument, which is where the x86-64 System V ABI (the only
/// one librdmacm.so's trampolines support) passes a variadic int.
pub unsafe extern "C" fn softrdma_rdmacm_rfcntl(fd: c_int, cmd: c_int, arg: c_int) -> c_int {
    guard(-1, || {
        ret_int((|| {
            let s = lookup(fd)?;
            let mut g = s.lock();
            match cmd {
                libc::F_GETFL => Ok(g.o.fs_flags),
                libc::F_SETFL => {
                    g.o.fs_flags = arg;
                    Ok(0)
                }
                libc::F_GETFD => Ok(g.o.fd_flags),
                libc::F_SETFD => {
                    g.o.fd_flags = arg;
                    Ok(0)
                }
                _ => Err(libc::ENOTSUP),
            }
        })())
    })
}

// ----- direct I/O -----

pub unsafe extern "C" fn softrdma_rdmacm_riomap(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    prot: c_int,
    _flags: c_int,
    offset: libc::off_t,
) -> libc::off_t {
    guard(-1, || match iomap(fd, buf, len, prot, offset) {
        Ok(o) => o,
        Err(e) => {
            set_errno(e);
            -1
        }
    })
}

/// Registers `buf` for the peer to write (PROT_WRITE: announced in one of
/// the peer's mapping slots before our next send) or for nothing
/// (PROT_NONE); `offset` -1 names it by its address.
fn iomap(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    prot: c_int,
    offset: libc::off_t,
) -> Result<libc::off_t, c_int> {
    let s = lookup(fd)?;
    let mut g = s.lock();
    let c = g.c.as_mut().ok_or(libc::EINVAL)?;
    if prot & !libc::PROT_WRITE != 0 || buf.is_null() || len == 0 || len > u32::MAX as usize {
        return Err(libc::EINVAL);
    }
    let slot = if prot & libc::PROT_WRITE != 0 {
        Some(
            c.iomaps
                .iter()
                .position(Option::is_none)
                .ok_or(libc::ENOMEM)?,
        )
    } else {
        None
    };
    let access = if slot.is_some() { ACCESS_WRITE } else { 1 };
    // SAFETY: the socket's live id and PD; `buf` is the caller's memory
    // for `len` bytes (the contract).
    let mr = unsafe { verbs::ibv_reg_mr((*c.id).pd, buf, len, access) };
    if mr.is_null() {
        return Err(last_errno());
    }
    let offset = if offset == -1 {
        buf as libc::off_t
    } else {
        offset
    };
    let e = MapEntry {
        mr,
        offset: offset as u64,
    };
    match slot {
        Some(i) => {
            c.iomaps[i] = Some(e);
            c.iomap_queue.push_back(i);
        }
        None => c.local_maps.push(e),
    }
    Ok(offset)
}

pub unsafe extern "C" fn softrdma_rdmacm_riounmap(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    guard(-1, || {
        ret_int((|| {
            let s = lookup(fd)?;
            let mut g = s.lock();
            let c = g.c.as_mut().ok_or(libc::EINVAL)?;
            // SAFETY: the mappings' live MRs.
            let is = |m: &MapEntry| unsafe { (*m.mr).addr == buf && (*m.mr).length == len };
            let mut mr = None;
            if let Some(i) = c.iomaps.iter().position(|m| m.as_ref().is_some_and(is)) {
                mr = c.iomaps[i].take().map(|m| m.mr);
                c.iomap_queue.retain(|&q| q != i);
            } else if let Some(i) = c.local_maps.iter().position(is) {
                mr = Some(c.local_maps.remove(i).mr);
            }
            let mr = mr.ok_or(libc::EINVAL)?;
            // SAFETY: the mapping's MR, no longer referenced.
            unsafe { verbs::ibv_dereg_mr(mr) };
            Ok(0)
        })())
    })
}

pub unsafe extern "C" fn softrdma_rdmacm_riowrite(
    fd: c_int,
    buf: *const c_void,
    count: usize,
    offset: libc::off_t,
    flags: c_int,
) -> isize {
    guard(-1, || {
        if buf.is_null() && count > 0 {
            return ret_size(Err(libc::EFAULT));
        }
        if offset < 0 {
            return ret_size(Err(libc::EINVAL));
        }
        // SAFETY: per the contract, `count` readable bytes.
        let data = unsafe { slice(buf.cast(), count) };
        ret_size(send(fd, &[data], flags, Some(offset as u64)))
    })
}
