//! The in-network aggregation service: all-reduces through it against the
//! reference for 1–8 ranks (every type and operator, bit-exact: the
//! service folds ranks in the reference's order), under 1 % loss and
//! reordering, with the service process killed mid-run (the host
//! fallback completes, results still right) and with a rank killed (the
//! others get an error, no hang).

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma::shm::Transport;
use softrdma::{DeviceConfig, FaultSpec};
use softrdma_coll::{
    bf16, f16, serve_aggd, AggdConfig, Algorithm, Communicator, Config, Element, ReduceOp,
};

mod common;
use common::{device, input, world, world_with};

fn config(dev: DeviceConfig, aggd: SocketAddr) -> Config {
    Config {
        device: dev,
        chunk: Some(4096),
        depth: 4,
        timeout: Duration::from_secs(60),
        deterministic: true,
        cost: None,
        algorithm: Some(Algorithm::InNetwork),
        spin: 16,
        aggd: Some(aggd),
        agg_timeout: Duration::from_secs(20),
    }
}

/// A service in this process (a thread), stopped when dropped.
struct Service {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    h: Option<std::thread::JoinHandle<()>>,
}

impl Service {
    fn start(dev: DeviceConfig, timeout: Duration) -> Service {
        Self::start_spin(dev, timeout, 16)
    }

    fn start_spin(dev: DeviceConfig, timeout: Duration, spin: u32) -> Service {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let cfg = AggdConfig {
            device: dev,
            timeout,
            spin,
            verbose: true,
        };
        let s = stop.clone();
        let h = std::thread::spawn(move || serve_aggd(l, cfg, s).expect("aggd"));
        Service {
            addr,
            stop,
            h: Some(h),
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.h.take() {
            let _ = h.join();
        }
    }
}

/// The left fold over ranks 0, 1, …: the service's order, so every type
/// (floats too) must match bit for bit.
fn reference<T: Element>(n: usize, len: usize, op: ReduceOp, salt: u64) -> Vec<T> {
    let mut acc = input::<T>(0, len, op, salt);
    for q in 1..n {
        for (a, b) in acc.iter_mut().zip(input::<T>(q, len, op, salt)) {
            *a = T::combine(op, *a, b);
        }
    }
    if op == ReduceOp::Avg {
        for a in &mut acc {
            *a = a.div_n(n);
        }
    }
    acc
}

fn bits<T: Element>(v: &[T]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| format!("{x:?},").into_bytes())
        .collect()
}

fn check_type<T: Element>(c: &mut Communicator, sizes: &[usize], ops: &[ReduceOp]) {
    let n = c.size();
    for &len in sizes {
        for &op in ops {
            let salt = len as u64 * 31 + op as u64;
            let mine = input::<T>(c.rank(), len, op, salt);
            let want = reference::<T>(n, len, op, salt);
            let mut out = vec![T::default(); len];
            c.all_reduce(&mine, &mut out, op).unwrap();
            let what = format!("{:?} {op} n={n} len={len}", T::DTYPE);
            assert!(bits(&out) == bits(&want), "{what}: out of place differs");
            let mut buf = mine.clone();
            c.all_reduce_in_place(&mut buf, op).unwrap();
            assert!(bits(&buf) == bits(&want), "{what}: in place differs");
        }
    }
}

fn every_type(c: &mut Communicator, sizes: &[usize]) {
    let ops = ReduceOp::ALL;
    check_type::<f32>(c, sizes, &ops);
    check_type::<f64>(c, sizes, &ops);
    check_type::<f16>(c, sizes, &ops);
    check_type::<bf16>(c, sizes, &ops);
    check_type::<i32>(c, sizes, &ops);
    check_type::<i64>(c, sizes, &ops);
    check_type::<u8>(c, sizes, &ops);
}

#[test]
fn through_the_service_every_type_and_op_bit_exact_1_to_8_ranks() {
    let svc = Service::start(device(Transport::Shm, None), Duration::from_secs(30));
    for n in 1..=8 {
        let cfg = config(device(Transport::Shm, None), svc.addr);
        let res = world(n, &cfg, |c| {
            assert_eq!(c.in_network(), n > 1, "{}", c.aggd_status());
            every_type(c, &[1, 7, 1031, 5003]);
            c.in_network()
        });
        // No rank fell back: every all-reduce went through the service.
        assert!(res.iter().all(|&x| x == (n > 1)), "n={n}: {res:?}");
    }
}

#[test]
fn through_the_service_udp_with_one_percent_loss_and_reordering() {
    let fault = FaultSpec {
        loss: 0.01,
        reorder: 0.01,
        dup: 0.0,
        corrupt: 0.0,
        seed: 5,
        ..Default::default()
    };
    let svc = Service::start(device(Transport::Udp, Some(fault)), Duration::from_secs(30));
    for n in [2, 3, 5] {
        let cfg = config(device(Transport::Udp, Some(fault)), svc.addr);
        let res = world(n, &cfg, |c| {
            check_type::<f32>(c, &[1, 1031, 20_011], &[ReduceOp::Sum, ReduceOp::Avg]);
            check_type::<i32>(c, &[7, 20_011], &[ReduceOp::Sum, ReduceOp::Prod]);
            check_type::<bf16>(c, &[257], &[ReduceOp::Max]);
            let d = c.context().driver_counters();
            let e = c.context().counters();
            (
                c.in_network(),
                d.faults_injected,
                e.retransmits + e.seq_naks_rcvd,
            )
        });
        assert!(res.iter().all(|x| x.0), "n={n}: a rank fell back: {res:?}");
        let faults: u64 = res.iter().map(|x| x.1).sum();
        let recovered: u64 = res.iter().map(|x| x.2).sum();
        eprintln!(
            "n={n}: {faults} faults injected at the ranks, {recovered} retransmissions and NAKs"
        );
        assert!(
            faults > 0 && recovered > 0,
            "no faults took effect: {res:?}"
        );
    }
}

#[test]
fn the_service_killed_mid_run_the_host_fallback_completes_correctly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_softrdma-aggd"))
        .args(["--listen", "127.0.0.1:0", "--spin", "16"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start softrdma-aggd");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: SocketAddr = line
        .trim()
        .strip_prefix("aggd listening on ")
        .unwrap_or_else(|| panic!("aggd said {line:?}"))
        .parse()
        .unwrap();
    let pid = child.id();
    let killed = Arc::new(AtomicBool::new(false));
    let done = std::sync::atomic::AtomicUsize::new(0);
    let n = 4;
    let len = 262_147; // 1 MiB of f32, 256 slots of 4 KiB
    let mut cfg = config(device(Transport::Shm, None), addr);
    cfg.agg_timeout = Duration::from_secs(2);
    let t = Instant::now();
    let res = std::thread::scope(|s| {
        let k = killed.clone();
        let d = &done;
        s.spawn(move || {
            // Kill once the ranks are well into their loop (bounded wait).
            let t = Instant::now();
            while d.load(Ordering::Relaxed) < 2 && t.elapsed() < Duration::from_secs(60) {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(20));
            // SIGKILL, as a crash: no goodbye on any connection.
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            k.store(true, Ordering::Relaxed);
        });
        world(n, &cfg, |c| {
            assert!(c.in_network(), "{}", c.aggd_status());
            let (mut via_service, mut after) = (0u32, 0u32);
            for i in 0..400u64 {
                let was = c.in_network();
                let mine = input::<f32>(c.rank(), len, ReduceOp::Sum, i);
                let mut out = vec![0f32; len];
                c.all_reduce(&mine, &mut out, ReduceOp::Sum).unwrap();
                let want = reference::<f32>(n, len, ReduceOp::Sum, i);
                if c.in_network() {
                    assert!(bits(&out) == bits(&want), "op {i} through the service");
                } else {
                    // The host algorithm sums in its own order: within the bound.
                    for (j, (g, w)) in out.iter().zip(&want).enumerate() {
                        assert!(
                            (g - w).abs() <= 1e-5 * 16.0,
                            "op {i} element {j}: {g} vs {w}"
                        );
                    }
                }
                if was {
                    via_service += 1;
                }
                if c.rank() == 0 {
                    done.fetch_add(1, Ordering::Relaxed);
                }
                if !c.in_network() {
                    after += 1;
                    if after >= 3 {
                        break;
                    }
                }
            }
            (via_service, after, c.aggd_status().to_string())
        })
    });
    let _ = child.wait();
    assert!(killed.load(Ordering::Relaxed));
    for (r, (via, after, why)) in res.iter().enumerate() {
        eprintln!("rank {r}: {via} ops began through the service, {after} on the host: {why}");
        assert!(*via > 0, "rank {r}: nothing went through the service");
        assert!(
            *after >= 3,
            "rank {r}: the service outlived the run ({why})"
        );
        assert!(why.contains("fallback"), "rank {r}: {why}");
    }
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn a_killed_rank_gives_the_others_an_error_not_a_hang() {
    let svc = Service::start(device(Transport::Udp, None), Duration::from_secs(2));
    let mut cfg = config(device(Transport::Udp, None), svc.addr);
    cfg.agg_timeout = Duration::from_secs(2);
    cfg.timeout = Duration::from_secs(3);
    let t = Instant::now();
    let res = world(4, &cfg, |c| -> Result<(), String> {
        let mut v = vec![1.0f32; 100_000];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        assert!(v.iter().all(|&x| x == 4.0));
        assert!(c.in_network());
        if c.rank() == 2 {
            return Ok(()); // dies: its communicator and its link to the service go
        }
        std::thread::sleep(Duration::from_millis(100));
        match c.all_reduce_in_place(&mut v, ReduceOp::Sum) {
            Err(e) => Err(format!("failed: {e}")),
            Ok(()) => Ok(()),
        }
    });
    eprintln!("{res:?}");
    assert_eq!(res[2], Ok(()));
    for (r, x) in res.iter().enumerate() {
        if r != 2 {
            assert!(
                matches!(x, Err(e) if e.starts_with("failed")),
                "rank {r}: {x:?}"
            );
        }
    }
    assert!(
        t.elapsed() < Duration::from_secs(40),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn no_service_at_the_address_means_host_algorithms_and_right_results() {
    // A port nobody listens on: joining fails at once, every rank agrees,
    // and "innetwork" all-reduces run on the host.
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead);
    let res = world(3, &config(device(Transport::Shm, None), addr), |c| {
        let status = c.aggd_status().to_string();
        let was = c.in_network();
        let mine = input::<i64>(c.rank(), 1031, ReduceOp::Sum, 3);
        let mut out = vec![0i64; 1031];
        c.all_reduce(&mine, &mut out, ReduceOp::Sum).unwrap();
        assert_eq!(out, reference::<i64>(3, 1031, ReduceOp::Sum, 3));
        (was, status)
    });
    for (was, status) in res {
        assert!(!was, "joined a service that is not there: {status}");
        assert!(status.contains(&addr.to_string()), "{status}");
    }
}

#[test]
fn a_service_configured_on_some_ranks_only_is_used_by_none() {
    let svc = Service::start(device(Transport::Shm, None), Duration::from_secs(30));
    let with = config(device(Transport::Shm, None), svc.addr);
    let mut without = with.clone();
    without.aggd = None;
    let t = Instant::now();
    let res = world_with(vec![with, without.clone(), without], |c| {
        let was = c.in_network();
        let mine = input::<i32>(c.rank(), 5003, ReduceOp::Max, 1);
        let mut out = vec![0i32; 5003];
        c.all_reduce(&mine, &mut out, ReduceOp::Max).unwrap();
        assert_eq!(out, reference::<i32>(3, 5003, ReduceOp::Max, 1));
        (was, c.aggd_status().to_string())
    });
    assert!(res.iter().all(|r| !r.0), "{res:?}");
    assert!(res[0].1.contains("not configured on every rank"), "{res:?}");
    // Agreed before anyone joined: no wait for a job that cannot form.
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "took {:?}",
        t.elapsed()
    );
}
