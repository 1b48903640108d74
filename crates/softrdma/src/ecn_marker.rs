//! Loads and attaches the phantom-queue ECN marker (`ecn_marker_prog.rs`)
//! on an interface's egress, for test networks whose kernel has no
//! ECN-marking qdisc (issue 19's bottleneck bench). The program is a
//! `BPF_PROG_TYPE_SCHED_CLS` direct-action program, attached through a tcx
//! link (`BPF_LINK_CREATE`, `BPF_TCX_EGRESS`, Linux 6.6 and later): it runs
//! where a clsact egress filter would, before the device's root qdisc.
//! Dropping the [`EcnMarker`] detaches it. Needs CAP_BPF and CAP_NET_ADMIN
//! (root).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::ecn_marker_prog::{program, STATE_LEN};
use crate::xsk::{bpf, ifindex, owned, prog_load, put_u32};

const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_int = 1;
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_EGRESS: u32 = 47;

/// What the marker has done so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MarkerCounters {
    /// Packets that went through it.
    pub seen: u64,
    /// ECN-capable IPv4 packets it set CE on.
    pub marked: u64,
    /// The virtual queue now (bytes; as of the last packet).
    pub virtual_queue: u64,
}

/// An attached marker; dropping it detaches the program.
#[derive(Debug)]
pub struct EcnMarker {
    map: OwnedFd,
    _prog: OwnedFd,
    _link: OwnedFd,
}

impl EcnMarker {
    /// Attaches a marker on `iface`'s egress whose virtual queue drains at
    /// `drain_bps` and which marks ECT packets CE while it holds more than
    /// `threshold` bytes.
    pub fn attach(iface: &str, drain_bps: u64, threshold: u32) -> io::Result<EcnMarker> {
        let idx = ifindex(iface).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("no interface {iface:?}"))
        })?;
        let map = create_state_map()?;
        let prog = load(map.as_raw_fd(), drain_bps, threshold)?;
        let mut a = [0u64; 18];
        put_u32(&mut a, 0, prog.as_raw_fd() as u32);
        put_u32(&mut a, 4, idx);
        put_u32(&mut a, 8, BPF_TCX_EGRESS);
        let link = bpf(BPF_LINK_CREATE, &mut a).map(owned).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("BPF_LINK_CREATE (tcx egress on {iface}, Linux 6.6+): {e}"),
            )
        })?;
        Ok(EcnMarker {
            map,
            _prog: prog,
            _link: link,
        })
    }

    /// The counters in the program's state.
    pub fn counters(&self) -> io::Result<MarkerCounters> {
        let key = 0u32;
        let mut v = [0u64; (STATE_LEN / 8) as usize];
        let mut a = [0u64; 18];
        put_u32(&mut a, 0, self.map.as_raw_fd() as u32);
        a[1] = &key as *const u32 as u64;
        a[2] = v.as_mut_ptr() as u64;
        bpf(BPF_MAP_LOOKUP_ELEM, &mut a)?;
        Ok(MarkerCounters {
            virtual_queue: v[0],
            seen: v[2],
            marked: v[3],
        })
    }
}

fn create_state_map() -> io::Result<OwnedFd> {
    let mut a = [0u64; 18];
    put_u32(&mut a, 0, BPF_MAP_TYPE_ARRAY);
    put_u32(&mut a, 4, 4); // key size
    put_u32(&mut a, 8, STATE_LEN); // value size
    put_u32(&mut a, 12, 1); // one entry
    bpf(BPF_MAP_CREATE, &mut a)
        .map(owned)
        .map_err(|e| io::Error::new(e.kind(), format!("BPF_MAP_CREATE (array): {e}")))
}

fn load(map: RawFd, drain_bps: u64, threshold: u32) -> io::Result<OwnedFd> {
    let insns = program(map, drain_bps, threshold);
    prog_load(BPF_PROG_TYPE_SCHED_CLS, None, &insns, b"softrdma_hull")
        .map_err(|e| io::Error::new(e.kind(), format!("BPF_PROG_LOAD (tc marker): {e}")))
}
