//! Event channels and the events queued on them.
//!
//! A channel's fd is an eventfd in semaphore mode: each queued event adds
//! one, each event taken reads one (under the queue's lock), so the fd is
//! readable exactly while events wait — what programs that `poll` the fd
//! before `rdma_get_cm_event` (rping, ucmatose) rely on.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::Mutex;

use super::abi::*;
use crate::ffi;

/// An `rdma_event_channel`.
#[repr(C)]
pub struct Channel {
    pub c: rdma_event_channel,
    q: Mutex<VecDeque<Box<Event>>>,
}

/// An `rdma_cm_event` handed to the application, with the private data
/// its `param` points to.
#[repr(C)]
pub struct Event {
    pub c: rdma_cm_event,
    data: Vec<u8>,
}

/// What an event says, before it is queued.
pub struct EventData {
    pub kind: u32,
    pub status: c_int,
    pub listen_id: *mut rdma_cm_id,
    pub private_data: Vec<u8>,
    /// The event's `param` (its private data pointer is set on queueing).
    pub param: Param,
}

/// Which member of the event's `param` union it fills.
pub enum Param {
    /// Only the private data, in `param.conn`.
    None,
    /// A connection request's parameters (RC/UC).
    Conn(rdma_conn_param),
    /// A UD id's: the SIDR request, or the resolved QP (ESTABLISHED).
    Ud(rdma_ud_param),
}

fn empty_conn() -> rdma_conn_param {
    rdma_conn_param {
        private_data: std::ptr::null(),
        private_data_len: 0,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 0,
        retry_count: 0,
        rnr_retry_count: 0,
        srq: 0,
        qp_num: 0,
    }
}

impl Channel {
    /// A new channel, leaked (freed by [`Channel::destroy`]).
    pub fn create() -> Result<*mut Channel, c_int> {
        // SAFETY: eventfd takes no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EMFILE));
        }
        Ok(crate::objects::leak(Channel {
            c: rdma_event_channel { fd },
            q: Mutex::new(VecDeque::new()),
        }))
    }

    /// The channel behind an application's pointer.
    ///
    /// # Safety
    /// `p` is NULL or a live channel of this module.
    pub unsafe fn from_ptr<'a>(p: *mut rdma_event_channel) -> Option<&'a Channel> {
        // SAFETY: per the contract; repr(C) with the C struct first.
        unsafe { p.cast::<Channel>().as_ref() }
    }

    /// Frees the channel, the events still queued and its fd.
    ///
    /// # Safety
    /// `p` is a live channel of this module, used by nothing else.
    pub unsafe fn destroy(p: *mut rdma_event_channel) {
        // SAFETY: per the contract, made by `create` (leak).
        let ch = unsafe { Box::from_raw(p.cast::<Channel>()) };
        // SAFETY: the channel's own fd, closed once.
        unsafe { libc::close(ch.c.fd) };
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Box<Event>>> {
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Queues an event for `id` on `channel` (dropped when the id has none).
pub fn push(channel: *mut rdma_event_channel, id: *mut rdma_cm_id, d: EventData) {
    // SAFETY: an id's channel is live while the id is.
    let Some(ch) = (unsafe { Channel::from_ptr(channel) }) else {
        return;
    };
    let ud = matches!(d.param, Param::Ud(_));
    let param = match d.param {
        Param::None => rdma_cm_event_param { conn: empty_conn() },
        Param::Conn(conn) => rdma_cm_event_param { conn },
        Param::Ud(ud) => rdma_cm_event_param { ud },
    };
    let mut ev = Box::new(Event {
        c: rdma_cm_event {
            id,
            listen_id: d.listen_id,
            event: d.kind,
            status: d.status,
            param,
        },
        data: d.private_data,
    });
    if !ev.data.is_empty() {
        let len = ev.data.len().min(255) as u8;
        let data = ev.data.as_ptr().cast();
        if ud {
            // SAFETY: `ud` is the variant just written.
            let p = unsafe { &mut ev.c.param.ud };
            (p.private_data, p.private_data_len) = (data, len);
        } else {
            // SAFETY: `conn` is the variant just written.
            let p = unsafe { &mut ev.c.param.conn };
            (p.private_data, p.private_data_len) = (data, len);
        }
    }
    let mut q = ch.queue();
    q.push_back(ev);
    let one = 1u64;
    // SAFETY: writes 8 bytes from a live u64 to the channel's eventfd.
    let _ = unsafe { libc::write(ch.c.fd, (&one as *const u64).cast(), 8) };
}

/// Takes the next event of `channel`, waiting for one unless the
/// application made its fd non-blocking (EAGAIN) or `block` is false.
pub fn pop(channel: *mut rdma_event_channel, block: bool) -> Result<*mut rdma_cm_event, c_int> {
    // SAFETY: the caller passes a live channel (validated non-NULL).
    let ch = unsafe { Channel::from_ptr(channel) }.ok_or(libc::EINVAL)?;
    loop {
        {
            let mut q = ch.queue();
            if let Some(ev) = q.pop_front() {
                // The count is at least one (one per queued event): this
                // read does not block.
                ffi::drain_eventfd(ch.c.fd);
                return Ok(Box::into_raw(ev).cast());
            }
        }
        if !block || ffi::is_nonblocking(ch.c.fd) {
            return Err(libc::EAGAIN);
        }
        ffi::wait_readable(ch.c.fd, -1);
    }
}

/// Frees an event handed out by [`pop`].
pub fn free(ev: *mut rdma_cm_event) {
    if ev.is_null() {
        return;
    }
    // SAFETY: events handed out are leaked `Box<Event>`s (repr(C), the C
    // struct first), freed once (the rdma_ack_cm_event contract).
    drop(unsafe { Box::from_raw(ev.cast::<Event>()) });
}

/// Frees every event still queued for `id` (it is being destroyed).
pub fn forget(channel: *mut rdma_event_channel, id: *mut rdma_cm_id) {
    // SAFETY: an id's channel is live while the id is.
    let Some(ch) = (unsafe { Channel::from_ptr(channel) }) else {
        return;
    };
    let mut q = ch.queue();
    let before = q.len();
    q.retain(|e| e.c.id != id);
    for _ in q.len()..before {
        ffi::drain_eventfd(ch.c.fd);
    }
}
