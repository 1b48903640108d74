//! Two softrdma devices in one process over loopback UDP: RDMA WRITE
//! latency (8 B ping-pong through memory polling is the perf tool's job;
//! here: post + completion round trip) and bandwidth (1 MiB WRITEs, a window
//! of 8 outstanding). Prints figures; run with `cargo bench -p softrdma`.

use std::time::{Duration, Instant};

use softrdma::*;

fn access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

fn main() {
    let a = Context::open_with(&DeviceConfig::default_loopback()).expect("open a");
    let b = Context::open_with(&DeviceConfig::default_loopback()).expect("open b");
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(1024).unwrap(), b.create_cq(1024).unwrap());
    let size = 1 << 20;
    let ma = pa.alloc_mr(size, access()).unwrap();
    let mb = pb.alloc_mr(size, access()).unwrap();
    let qa = pa
        .create_qp(QpType::Rc, &ca, &ca)
        .max_send_wr(256)
        .build()
        .unwrap();
    let qb = pb
        .create_qp(QpType::Rc, &cb, &cb)
        .max_send_wr(256)
        .build()
        .unwrap();
    qa.connect(&qb.endpoint(), &ConnectOptions::default())
        .unwrap();
    qb.connect(&qa.endpoint(), &ConnectOptions::default())
        .unwrap();
    let rb = mb.remote();
    let t = Duration::from_secs(30);

    // Latency: one 8-byte WRITE, wait for its completion (a full round trip: data + ACK).
    let iters = 2000;
    let mut lat = Vec::with_capacity(iters);
    for i in 0..iters {
        let s = Instant::now();
        qa.post_send(&SendWr::new(
            i as u64,
            SendOp::Write {
                remote_addr: rb.addr,
                rkey: rb.rkey,
            },
            vec![ma.sge(0, 8)],
        ))
        .unwrap();
        ca.wait_ok(t).unwrap();
        lat.push(s.elapsed());
    }
    lat.sort();
    println!(
        "write 8 B post->completion RTT: median {:.2} us, p99 {:.2} us ({iters} iterations)",
        lat[iters / 2].as_secs_f64() * 1e6,
        lat[iters * 99 / 100].as_secs_f64() * 1e6
    );

    // Bandwidth: 1 MiB WRITEs, 8 in flight.
    let n = 256usize;
    let window = 8;
    let start = Instant::now();
    let mut posted = 0;
    let mut done = 0;
    while done < n {
        while posted < n && posted - done < window {
            qa.post_send(&SendWr::new(
                posted as u64,
                SendOp::Write {
                    remote_addr: rb.addr,
                    rkey: rb.rkey,
                },
                vec![ma.sge(0, size as u32)],
            ))
            .unwrap();
            posted += 1;
        }
        ca.wait_ok(t).unwrap();
        done += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = (n * size) as f64;
    println!(
        "write 1 MiB x {n}: {:.1} MB/s ({:.2} GB/s)",
        bytes / secs / 1e6,
        bytes / secs / 1e9
    );
    let c = a.counters();
    println!(
        "requester: tx {} packets, {} retransmits, {} timeouts, {} seq NAKs received",
        c.tx_packets, c.retransmits, c.timeouts, c.seq_naks_rcvd
    );
    let c = b.counters();
    println!(
        "responder: rx {} packets, {} out of sequence, {} duplicates, driver {:?}",
        c.rx_packets,
        c.out_of_sequence,
        c.duplicates,
        b.driver_counters()
    );
}
