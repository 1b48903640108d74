//! The direct path applies the engine's rules, not a copy of them: a local
//! SGE whose end wraps around the address space (in a region registered at
//! iova 0) once passed the driver's own check and copied the 8 bytes in
//! front of the region; now it is refused as the packet path refuses it,
//! with LOC_PROT_ERR and nothing copied either way.

use std::time::Duration;

use softrdma::shm::Transport;
use softrdma::*;

const T: Duration = Duration::from_secs(10);

fn all() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

fn open(transport: Transport) -> Context {
    Context::open_with(&DeviceConfig::default_loopback().transport(transport)).unwrap()
}

#[test]
fn a_wrapping_local_sge_is_a_local_protection_error() {
    for (transport, read) in [
        (Transport::Udp, false),
        (Transport::Udp, true),
        (Transport::Shm, false),
        (Transport::Shm, true),
    ] {
        let (a, b) = (open(transport), open(transport));
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
        let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
        let qb = pb.create_qp(QpType::Rc, &cb, &cb).build().unwrap();
        let fast = ConnectOptions {
            timeout: 10,
            retry_cnt: 2,
            ..Default::default()
        };
        qa.connect(&qb.endpoint(), &fast).unwrap();
        qb.connect(&qa.endpoint(), &fast).unwrap();
        let mb = pb.alloc_mr(4096, all()).unwrap();
        mb.write(0, &[0x11; 64]).unwrap();
        // Caller memory: 8 secret bytes, then the region, registered at iova 0.
        let mut buf = vec![0u8; 8192];
        buf[4088..4096].copy_from_slice(b"SECRET!!");
        buf[4096..].fill(0x22);
        // SAFETY: `buf` outlives `ma` (dropped first, below) and is not
        // otherwise touched while registered.
        let ma = unsafe { pa.register_raw(buf.as_mut_ptr().add(4096), 4096, 0, all()) }.unwrap();
        let sge = Sge {
            addr: u64::MAX - 7,
            length: 16,
            lkey: ma.lkey(),
        };
        let rb = mb.remote();
        let op = if read {
            SendOp::Read {
                remote_addr: rb.at(0),
                rkey: rb.rkey,
            }
        } else {
            SendOp::Write {
                remote_addr: rb.at(0),
                rkey: rb.rkey,
            }
        };
        qa.post_send(&SendWr::new(1, op, vec![sge])).unwrap();
        let wcs = ca.wait(1, T).unwrap();
        assert_eq!(wcs[0].status, WcStatus::LocProtErr, "read {read}");
        assert_eq!(a.driver_counters().direct_ops, 0, "read {read}");
        let mut got = [0u8; 64];
        mb.read(0, &mut got).unwrap();
        assert_eq!(got, [0x11; 64], "read {read}: the target changed");
        drop(ma);
        assert_eq!(&buf[4088..4096], b"SECRET!!", "read {read}");
        assert!(buf[4096..].iter().all(|&x| x == 0x22), "read {read}");
    }
}
