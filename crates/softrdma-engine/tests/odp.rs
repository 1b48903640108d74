//! On-demand paging in the engine: every read, write and atomic asks the
//! region to resolve exactly the bytes it touches first
//! (`RegionMemory::resolve`), and a page that cannot be resolved fails the
//! access with the status real ODP hardware gives — a remote access error
//! for a peer, a local protection error for a local SGE — without the
//! memory being touched.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use softrdma_engine::sim::NetConfig;
use softrdma_engine::*;

const PAGE: usize = 4096;

/// A region of four pages whose third page is "not mapped": resolving it
/// fails, and touching it (which the engine must never do) panics.
struct Holey {
    bytes: VecMemory,
    resolved: AtomicU64,
}

impl Holey {
    fn new() -> Self {
        Holey {
            bytes: VecMemory::new(4 * PAGE),
            resolved: AtomicU64::new(0),
        }
    }
    fn hole(offset: usize, len: usize) -> bool {
        offset < 3 * PAGE && offset + len > 2 * PAGE
    }
    fn check(&self, offset: usize, len: usize) {
        assert!(!Self::hole(offset, len), "engine touched an unmapped page");
    }
}

impl RegionMemory for Holey {
    fn len(&self) -> usize {
        self.bytes.len()
    }
    fn resolve(&self, offset: usize, len: usize, _write: bool) -> bool {
        self.resolved.fetch_add(1, Ordering::Relaxed);
        !Self::hole(offset, len)
    }
    fn read(&self, offset: usize, dst: &mut [u8]) {
        self.check(offset, dst.len());
        self.bytes.read(offset, dst)
    }
    fn write(&self, offset: usize, src: &[u8]) {
        self.check(offset, src.len());
        self.bytes.write(offset, src)
    }
    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> u64 {
        self.check(offset, 8);
        self.bytes.compare_swap(offset, compare, swap)
    }
    fn fetch_add(&self, offset: usize, add: u64) -> u64 {
        self.check(offset, 8);
        self.bytes.fetch_add(offset, add)
    }
}

const IOVA: u64 = 0x7000_0000;

fn odp_region(net: &mut SimNet, s: &Side) -> (Arc<Holey>, MrKeys) {
    let m = Arc::new(Holey::new());
    let k = net.nodes[s.node]
        .reg_mr(s.pd, IOVA, all_access() | AccessFlags::ON_DEMAND, m.clone())
        .unwrap();
    (m, k)
}

use softrdma_engine::sim::SimNet;

fn status_of(net: &mut SimNet, a: &Side, wr: SendWr) -> WcStatus {
    post_ok(net, a, wr);
    let wcs = wait_wcs(net, a, 1, Duration::from_secs(5));
    assert_eq!(wcs.len(), 1, "one completion");
    wcs[0].status
}

#[test]
fn remote_access_to_an_unresolvable_page_is_a_remote_access_error() {
    let ops = [
        ("write", 0u8),
        ("write across the hole", 1),
        ("read", 2),
        ("fetch_add", 3),
    ];
    for (what, op) in ops {
        let (mut net, a, b) = pair(1, NetConfig::perfect(), QpType::Rc, &ConnOpts::default());
        let (m, k) = odp_region(&mut net, &b);
        let mk = |remote_addr: u64, len: u32| -> SendWr {
            let s = vec![sge(&a, 0, len)];
            let op = match op {
                0 | 1 => SendOp::Write {
                    remote_addr,
                    rkey: k.rkey,
                },
                2 => SendOp::Read {
                    remote_addr,
                    rkey: k.rkey,
                },
                _ => SendOp::FetchAdd {
                    remote_addr,
                    rkey: k.rkey,
                    add: 1,
                },
            };
            SendWr::new(7, op, s)
        };
        let len = if op == 3 { 8 } else { PAGE as u32 };
        // A mapped page first: the access works and resolves its bytes.
        assert_eq!(
            status_of(&mut net, &a, mk(IOVA + PAGE as u64, len)),
            WcStatus::Success,
            "{what} to a mapped page"
        );
        assert!(m.resolved.load(Ordering::Relaxed) > 0, "{what} resolved");
        // Then the hole (or a range that runs into it).
        let at = if op == 1 {
            IOVA + PAGE as u64 + 64
        } else {
            IOVA + 2 * PAGE as u64
        };
        assert_eq!(
            status_of(&mut net, &a, mk(at, len)),
            WcStatus::RemAccessErr,
            "{what} to an unmapped page"
        );
    }
}

#[test]
fn local_sge_on_an_unresolvable_page_is_a_local_protection_error() {
    let (mut net, a, b) = pair(2, NetConfig::perfect(), QpType::Rc, &ConnOpts::default());
    let (_m, k) = odp_region(&mut net, &a);
    let wr = |addr: u64| {
        SendWr::new(
            9,
            SendOp::Write {
                remote_addr: b.base,
                rkey: b.keys.rkey,
            },
            vec![Sge {
                addr,
                length: 256,
                lkey: k.lkey,
            }],
        )
    };
    assert_eq!(status_of(&mut net, &a, wr(IOVA)), WcStatus::Success);
    assert_eq!(
        status_of(&mut net, &a, wr(IOVA + 2 * PAGE as u64)),
        WcStatus::LocProtErr
    );
}
