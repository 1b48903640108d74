//! `cargo bench -p softrdma-wire`: ICRC throughput (GB/s) by packet size,
//! and parse/emit rates (packets/s) of a 4 KiB RC RDMA WRITE_ONLY packet.
//!
//! It prints the CPU's flags first, then one table of `icrc::compute` at
//! 64 B to 4 KiB on every CRC-32 path this CPU supports (each forced in
//! turn with `crc32::force`, so that one machine measures what CPUs
//! without AVX-512 or without VPCLMULQDQ run), next to `crc32fast` alone
//! over the same bytes, as GB/s and ratios to it. The remaining cases run
//! on the native path (or the one `SOFTRDMA_CRC32` names).
//!
//! A small self-contained harness (no bench framework, so no extra
//! dependencies): each case is calibrated to 2 ms batches and the best of 60
//! is reported: short batches, so that some fall between the other work on a
//! shared machine, and the best one is the figure least disturbed by that
//! load. Run without `--bench` (as `cargo test --benches`
//! does) it only smoke-tests each case once.

use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use softrdma_wire::packet::{emit_in_place, payload_offset};
use softrdma_wire::{
    crc32, frame, icrc, BthRepr, Endpoints, Headers, Opcode, PacketRepr, Psn, RethRepr,
};

const BATCH: Duration = Duration::from_millis(2);
const BATCHES: usize = 60;

struct Bench {
    full: bool,
    filter: Option<String>,
}

impl Bench {
    /// Seconds per call of `f`: best of `BATCHES` calibrated batches.
    fn time<F: FnMut()>(&self, name: &str, mut f: F) -> Option<f64> {
        if self.filter.as_deref().is_some_and(|p| !name.contains(p)) {
            return None;
        }
        if !self.full {
            f();
            return None;
        }
        // Calibrate: double the iteration count until a batch takes BATCH.
        let mut iters = 1u64;
        loop {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            if t.elapsed() >= BATCH / 4 {
                let per = t.elapsed().as_secs_f64() / iters as f64;
                iters = ((BATCH.as_secs_f64() / per) as u64).max(1);
                break;
            }
            iters *= 2;
        }
        let mut best = f64::INFINITY;
        for _ in 0..BATCHES {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            best = best.min(t.elapsed().as_secs_f64() / iters as f64);
        }
        Some(best)
    }

    fn throughput<F: FnMut()>(&self, name: &str, bytes: usize, f: F) {
        if let Some(s) = self.time(name, f) {
            println!(
                "{name:<44} {:>9.1} ns  {:>7.2} GB/s  {:>6.2} Mpkt/s",
                s * 1e9,
                bytes as f64 / s / 1e9,
                1e-6 / s
            );
        }
    }
}

fn ep4() -> Endpoints {
    Endpoints::new(
        SocketAddr::new(Ipv4Addr::new(10, 0, 0, 1).into(), 0xC000),
        SocketAddr::new(Ipv4Addr::new(10, 0, 0, 2).into(), frame::ROCE_PORT),
    )
}

fn ep6() -> Endpoints {
    Endpoints::new(
        SocketAddr::new(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).into(), 0xC000),
        SocketAddr::new(
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2).into(),
            frame::ROCE_PORT,
        ),
    )
}

fn write_only(payload: &[u8]) -> PacketRepr<'_> {
    PacketRepr {
        bth: BthRepr::new(Opcode::RC_WRITE_ONLY, 0x11, Psn::new(0x12_3456)),
        headers: Headers::Reth(RethRepr {
            va: 0x7f00_0000_1000,
            rkey: 0x1234,
            dma_len: payload.len() as u32,
        }),
        payload,
    }
}

/// `icrc::compute` at the packet sizes the goals name, on every path this
/// CPU supports (forced in turn), next to `crc32fast` over the same bytes,
/// in interleaved rounds (best of each): one table, one run.
fn icrc_by_path(b: &Bench, data: &[u8]) {
    const SIZES: [usize; 4] = [64, 1024, 2048, 4096];
    let native = crc32::active();
    let paths: Vec<crc32::Path> = crc32::Path::ALL
        .into_iter()
        .filter(|p| p.supported())
        .collect();
    // Rows: crc32fast, crc32fast in updates under 2 KiB, then the paths.
    let rows = 2 + 2 * paths.len();
    let mut best = vec![[f64::INFINITY; SIZES.len()]; rows];
    for _ in 0..if b.full { 3 } else { 1 } {
        for (j, &size) in SIZES.iter().enumerate() {
            let body = &data[..size];
            let mut t = vec![
                b.time(&format!("icrc table: crc32fast {size} B"), || {
                    let mut h = crc32fast::Hasher::new();
                    h.update(black_box(body));
                    black_box(h.finalize());
                }),
                b.time(&format!("icrc table: crc32fast chunked {size} B"), || {
                    let mut h = crc32fast::Hasher::new();
                    for c in black_box(body).chunks(1366) {
                        h.update(c);
                    }
                    black_box(h.finalize());
                }),
            ];
            for &p in &paths {
                crc32::force(p);
                t.push(
                    b.time(&format!("icrc table: icrc::compute {size} B {p}"), || {
                        black_box(icrc::compute(black_box(&ep4()), black_box(body)).unwrap());
                    }),
                );
            }
            let head = [0x5Au8; 40];
            for &p in &paths {
                crc32::force(p);
                t.push(
                    b.time(&format!("icrc table: icrc::crc32 {size} B {p}"), || {
                        black_box(icrc::crc32(0x2144_DF1C, black_box(&head), black_box(body)));
                    }),
                );
            }
            crc32::force(native);
            for (row, s) in t.into_iter().enumerate() {
                if let Some(s) = s {
                    best[row][j] = best[row][j].min(s);
                }
            }
        }
    }
    if !b.full || best.iter().flatten().all(|t| t.is_infinite()) {
        return;
    }
    println!();
    println!("GB/s by size; ratio = GB/s / crc32fast alone's over the same bytes");
    print!("{:<52}", "case");
    for s in SIZES {
        print!(" {:>14}", format!("{s} B"));
    }
    println!();
    let names: Vec<String> = [
        "crc32fast alone (its own kernel pick)".to_string(),
        "crc32fast in < 2 KiB updates (its AVX2 kernel)".to_string(),
    ]
    .into_iter()
    .chain(
        paths
            .iter()
            .map(|p| format!("icrc::compute IPv4, path {p}"))
            .chain(
                paths
                    .iter()
                    .map(|p| format!("icrc::crc32, 40 B head ready, {p}")),
            ),
    )
    .collect();
    for (row, name) in names.iter().enumerate() {
        print!("{name:<52}");
        for (j, &size) in SIZES.iter().enumerate() {
            let gbs = size as f64 / best[row][j] / 1e9;
            let ratio = best[0][j] / best[row][j];
            if ratio.is_finite() {
                print!(" {gbs:>6.2} ({ratio:>4.2}x)");
            } else {
                print!(" {:>14}", format!("{gbs:.2}"));
            }
        }
        println!();
    }
    println!(
        "(the 2nd row is what crc32fast runs on an AVX2-only CPU at 2 and 4 KiB: below 2 KiB \
         per update it takes its AVX2 kernel, at and above it its AVX-512 one where there is one)"
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let b = Bench {
        full: args.iter().any(|a| a == "--bench"),
        filter: args.iter().find(|a| !a.starts_with('-')).cloned(),
    };
    if b.full {
        println!("CPU: {}", softrdma_wire::crc32::cpu_flags());
        println!(
            "CRC-32 path: {} (detected: {}; SOFTRDMA_CRC32 forces one)",
            crc32::active(),
            crc32::Path::detect()
        );
    }

    let data: Vec<u8> = (0..65536u32)
        .map(|i| i.wrapping_mul(2_654_435_761) as u8)
        .collect();
    icrc_by_path(&b, &data);
    let native = crc32::active();

    if b.full {
        println!();
        println!(
            "{:<44} {:>12}  {:>12}  {:>13}",
            "case (native path)", "time/op", "throughput", "rate"
        );
    }
    // ICRC over a whole UDP payload (BTH .. pad) of each size. The largest
    // is the biggest RoCE packet an IPv4 datagram can carry.
    for &size in &[256usize, 16384, 65504 - 4] {
        let body = &data[..size];
        let name = format!("icrc::compute IPv4 {size} B ({native})");
        b.throughput(&name, size, || {
            black_box(icrc::compute(black_box(&ep4()), black_box(body)).unwrap());
        });
    }
    let body = &data[..4096];
    b.throughput("icrc::compute IPv6 4096 B", 4096, || {
        black_box(icrc::compute(black_box(&ep6()), black_box(body)).unwrap());
    });
    b.throughput("crc32fast alone 65500 B (reference)", 65500, || {
        let mut h = crc32fast::Hasher::new();
        h.update(black_box(&data[..65500]));
        black_box(h.finalize());
    });

    // A 4 KiB RDMA WRITE_ONLY: 12 + 16 + 4096 + 4 = 4128 bytes.
    let payload = &data[..4096];
    let repr = write_only(payload);
    let len = repr.buffer_len();
    let mut buf = vec![0u8; len];
    repr.emit(&mut buf, &ep4()).unwrap();
    let ip = frame::build_ip(ep4().src, ep4().dst, &buf, &Default::default()).unwrap();

    b.throughput("icrc::verify 4 KiB WRITE_ONLY", len, || {
        icrc::verify(black_box(&ep4()), black_box(&buf)).unwrap();
    });
    b.throughput("icrc::over_ip_packet 4 KiB WRITE_ONLY", len, || {
        black_box(icrc::over_ip_packet(black_box(&ip)).unwrap());
    });
    b.throughput("PacketRepr::parse 4 KiB WRITE_ONLY (no ICRC)", len, || {
        black_box(PacketRepr::parse(black_box(&buf)).unwrap());
    });
    b.throughput("parse + icrc::verify 4 KiB WRITE_ONLY", len, || {
        let p = PacketRepr::parse(black_box(&buf)).unwrap();
        icrc::verify(&ep4(), &buf).unwrap();
        black_box(p);
    });
    let mut out = vec![0u8; len];
    b.throughput("PacketRepr::emit 4 KiB WRITE_ONLY (copy+ICRC)", len, || {
        black_box(black_box(&repr).emit(&mut out, &ep4()).unwrap());
    });
    let headers = repr.headers;
    let off = payload_offset(&headers);
    out[off..off + payload.len()].copy_from_slice(payload);
    b.throughput("emit_in_place 4 KiB WRITE_ONLY (ICRC)", len, || {
        let n = emit_in_place(black_box(&repr.bth), &headers, &mut out, 4096, &ep4()).unwrap();
        black_box(n);
    });
    let frame_opts = Default::default();
    b.throughput("frame::build_frame 4 KiB (capture path)", len, || {
        black_box(frame::build_frame(ep4().src, ep4().dst, black_box(&buf), &frame_opts).unwrap());
    });

    // Small packets: per-packet overhead dominates.
    let ack = PacketRepr {
        bth: BthRepr::new(Opcode::RC_ACK, 0x11, Psn::new(1)),
        headers: Headers::Aeth(softrdma_wire::AethRepr {
            syndrome: softrdma_wire::Syndrome::Ack { credits: 0x1F },
            msn: softrdma_wire::Msn::new(1),
        }),
        payload: &[],
    };
    let mut ack_buf = [0u8; 20];
    ack.emit(&mut ack_buf, &ep4()).unwrap();
    b.throughput("PacketRepr::emit ACK (20 B)", 20, || {
        black_box(black_box(&ack).emit(&mut ack_buf, &ep4()).unwrap());
    });
    b.throughput("parse + icrc::verify ACK (20 B)", 20, || {
        let p = PacketRepr::parse(black_box(&ack_buf)).unwrap();
        icrc::verify(&ep4(), &ack_buf).unwrap();
        black_box(p);
    });
    if !b.full {
        println!("wire bench: smoke run ok (pass --bench, as `cargo bench` does, to measure)");
    }
}
