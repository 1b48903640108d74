//! Every collective × type × op × algorithm against a reference, for 1–8
//! ranks (threads, each with its own device) on the same-host (shm) path
//! and on RoCEv2/UDP; then under 1 % loss and reordering, a rank that
//! dies, and the deterministic mode.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use softrdma::shm::Transport;
use softrdma::{DeviceConfig, FaultSpec};
use softrdma_coll::{
    bf16, f16, Algorithm, Communicator, Config, DataType, Element, Error, ReduceOp, Rendezvous,
};

mod common;
use common::{device, input, world};

fn config(dev: DeviceConfig) -> Config {
    Config {
        device: dev,
        // Small slots so that the odd sizes below span several of them.
        chunk: Some(4096),
        depth: 4,
        timeout: Duration::from_secs(60),
        deterministic: true,
        cost: None,
        algorithm: None,
        // Up to 8 ranks share 2 cores here: yield soon.
        spin: 16,
        aggd: None,
        agg_timeout: Duration::from_secs(5),
    }
}

fn reference<T: Element>(all: &[Vec<T>], op: ReduceOp) -> Vec<T> {
    let n = all.len();
    let mut acc = all[0].clone();
    for v in &all[1..] {
        for (a, b) in acc.iter_mut().zip(v) {
            *a = T::combine(op, *a, *b);
        }
    }
    if op == ReduceOp::Avg {
        for a in &mut acc {
            *a = a.div_n(n);
        }
    }
    acc
}

fn eps(d: DataType) -> f64 {
    match d {
        DataType::F32 => 2f64.powi(-23),
        DataType::F64 => 2f64.powi(-52),
        DataType::F16 => 2f64.powi(-10),
        DataType::Bf16 => 2f64.powi(-7),
        _ => 0.0,
    }
}

/// Integers bit-exact; floats: min/max exact, sum/avg/prod within
/// (n + 1)·ε·Σ|xᵢ| (prod: (n + 1)·ε·Π|xᵢ|), the bound of n − 1 roundings
/// in any order plus the final one.
fn check<T: Element>(got: &[T], all: &[Vec<T>], op: ReduceOp, off: usize, what: &str) {
    let want = reference(all, op);
    let n = all.len() as f64;
    for (i, g) in got.iter().enumerate() {
        let j = off + i;
        let w = want[j];
        if !T::DTYPE.is_float() || matches!(op, ReduceOp::Min | ReduceOp::Max) || all.len() == 1 {
            assert!(*g == w, "{what}: element {j}: got {g:?}, want {w:?}");
            continue;
        }
        let mag = match op {
            ReduceOp::Prod => all.iter().map(|v| v[j].to_f64().abs()).product::<f64>(),
            _ => all.iter().map(|v| v[j].to_f64().abs()).sum::<f64>(),
        };
        let tol = (n + 1.0)
            * eps(T::DTYPE)
            * mag.max(1e-30)
            * if op == ReduceOp::Avg {
                1.0 / n + eps(T::DTYPE)
            } else {
                1.0
            };
        let diff = (g.to_f64() - w.to_f64()).abs();
        assert!(
            diff <= tol * 1.0001,
            "{what}: element {j}: got {g:?}, want {w:?} (|diff| {diff:e} > {tol:e})"
        );
    }
}

const SIZES: [usize; 3] = [1, 13, 1031];

fn matrix<T: Element>(c: &mut Communicator, sizes: &[usize], ops: &[ReduceOp]) {
    let (n, r) = (c.size(), c.rank());
    let ty = T::DTYPE;
    for (k, &len) in sizes.iter().enumerate() {
        let root = (len + k) % n;
        for &op in ops {
            for alg in Algorithm::ALL {
                c.set_algorithm(Some(alg));
                let tag = |coll: &str| format!("{coll} {ty} {op} {alg} n={n} rank={r} len={len}");
                let all: Vec<Vec<T>> = (0..n).map(|q| input(q, len, op, 1)).collect();
                let mut out = vec![T::default(); len];
                c.all_reduce(&all[r], &mut out, op).unwrap();
                check(&out, &all, op, 0, &tag("all_reduce"));
                let mut b = all[r].clone();
                c.all_reduce_in_place(&mut b, op).unwrap();
                check(&b, &all, op, 0, &tag("all_reduce in place"));

                let mut out = vec![T::default(); len];
                c.reduce(&all[r], &mut out, op, root).unwrap();
                if r == root {
                    check(&out, &all, op, 0, &tag("reduce"));
                }
                let mut b = all[r].clone();
                c.reduce_in_place(&mut b, op, root).unwrap();
                if r == root {
                    check(&b, &all, op, 0, &tag("reduce in place"));
                }

                if alg != Algorithm::Tree {
                    let all: Vec<Vec<T>> = (0..n).map(|q| input(q, len * n, op, 2)).collect();
                    let mut out = vec![T::default(); len];
                    c.reduce_scatter(&all[r], &mut out, op).unwrap();
                    check(&out, &all, op, r * len, &tag("reduce_scatter"));
                    let mut b = all[r].clone();
                    c.reduce_scatter_in_place(&mut b, op).unwrap();
                    check(
                        &b[r * len..(r + 1) * len],
                        &all,
                        op,
                        r * len,
                        &tag("reduce_scatter in place"),
                    );
                }
            }
        }
        for alg in Algorithm::ALL {
            c.set_algorithm(Some(alg));
            let tag = |coll: &str| format!("{coll} {ty} {alg} n={n} rank={r} len={len}");
            let all: Vec<Vec<T>> = (0..n).map(|q| input(q, len, ReduceOp::Sum, 3)).collect();
            let flat: Vec<T> = all.concat();
            if alg != Algorithm::Tree {
                let mut out = vec![T::default(); len * n];
                c.all_gather(&all[r], &mut out).unwrap();
                assert!(out == flat, "{}", tag("all_gather"));
                let mut b = vec![T::default(); len * n];
                b[r * len..(r + 1) * len].copy_from_slice(&all[r]);
                c.all_gather_in_place(&mut b).unwrap();
                assert!(b == flat, "{}", tag("all_gather in place"));
            }
            let mut b = if r == root {
                all[root].clone()
            } else {
                vec![T::default(); len]
            };
            c.broadcast(&mut b, root).unwrap();
            assert!(b == all[root], "{}", tag("broadcast"));
        }
        c.set_algorithm(None);
        // all_to_all: block j of rank q is input(q)[j·len..]
        let all: Vec<Vec<T>> = (0..n)
            .map(|q| input(q, len * n, ReduceOp::Sum, 4))
            .collect();
        let mut out = vec![T::default(); len * n];
        c.all_to_all(&all[r], &mut out).unwrap();
        for q in 0..n {
            assert!(
                out[q * len..(q + 1) * len] == all[q][r * len..(r + 1) * len],
                "all_to_all {ty} n={n} rank={r} len={len} block {q}"
            );
        }
        c.barrier().unwrap();
    }
}

fn full_matrix(c: &mut Communicator) {
    let ops = ReduceOp::ALL;
    matrix::<f32>(c, &SIZES, &ops);
    matrix::<f64>(c, &SIZES, &ops);
    matrix::<f16>(c, &SIZES, &ops);
    matrix::<bf16>(c, &SIZES, &ops);
    matrix::<i32>(c, &SIZES, &ops);
    matrix::<i64>(c, &SIZES, &ops);
    matrix::<u8>(c, &SIZES, &ops);
}

#[test]
fn every_collective_type_op_algorithm_shm_1_to_8_ranks() {
    for n in 1..=8 {
        let t = Instant::now();
        world(n, &config(device(Transport::Shm, None)), full_matrix);
        eprintln!("shm n={n}: {:?}", t.elapsed());
    }
}

#[test]
fn every_collective_type_op_algorithm_udp_1_to_8_ranks() {
    for n in 1..=8 {
        let t = Instant::now();
        world(n, &config(device(Transport::Udp, None)), full_matrix);
        eprintln!("udp n={n}: {:?}", t.elapsed());
    }
}

#[test]
fn large_vectors_span_many_slots_and_pieces() {
    // 300 000 elements: hundreds of 4 KiB slots per step, on 3 and 4 ranks.
    for n in [3, 4] {
        world(n, &config(device(Transport::Shm, None)), |c| {
            matrix::<f32>(c, &[300_007], &[ReduceOp::Sum]);
            matrix::<i64>(c, &[100_003], &[ReduceOp::Sum, ReduceOp::Max]);
        });
    }
}

#[test]
fn one_percent_loss_and_reordering() {
    let fault = FaultSpec {
        loss: 0.01,
        reorder: 0.01,
        dup: 0.0,
        corrupt: 0.0,
        seed: 11,
        ..Default::default()
    };
    for n in [2, 3, 5] {
        let res = world(n, &config(device(Transport::Udp, Some(fault))), |c| {
            matrix::<f32>(c, &[1, 1031, 20_011], &[ReduceOp::Sum, ReduceOp::Avg]);
            matrix::<i32>(c, &[7, 20_011], &[ReduceOp::Sum, ReduceOp::Prod]);
            matrix::<bf16>(c, &[257], &[ReduceOp::Max]);
            let d = c.context().driver_counters();
            let e = c.context().counters();
            (d.faults_injected, e.retransmits + e.seq_naks_rcvd)
        });
        let faults: u64 = res.iter().map(|x| x.0).sum();
        let recovered: u64 = res.iter().map(|x| x.1).sum();
        eprintln!("n={n}: {faults} faults injected, {recovered} retransmissions and NAKs");
        assert!(
            faults > 0 && recovered > 0,
            "no faults took effect: {res:?}"
        );
    }
}

#[test]
fn deterministic_mode_is_bit_identical_run_to_run() {
    let len = 50_021;
    let run = || {
        world(5, &config(device(Transport::Shm, None)), |c| {
            let mine: Vec<f32> = input(c.rank(), len, ReduceOp::Sum, 9);
            let mut outs = Vec::new();
            for alg in [
                None,
                Some(Algorithm::Ring),
                Some(Algorithm::Rhd),
                Some(Algorithm::Tree),
            ] {
                c.set_algorithm(alg);
                let mut out = vec![0f32; len];
                c.all_reduce(&mine, &mut out, ReduceOp::Sum).unwrap();
                outs.push(out.iter().map(|x| x.to_bits()).collect::<Vec<u32>>());
            }
            outs
        })
    };
    let (a, b) = (run(), run());
    assert_eq!(a, b, "two runs differ");
    for rank in &a[1..] {
        assert_eq!(rank, &a[0], "ranks hold different bits");
    }
    // The algorithms do sum in different orders: not all equal in general.
    assert!(
        a[0][1] != a[0][2] || a[0][2] != a[0][3],
        "ring, rhd and tree summed alike: the test shows nothing"
    );
}

#[test]
fn a_killed_rank_gives_the_others_an_error_not_a_hang() {
    let t = Instant::now();
    let res = world(
        4,
        &config(device(Transport::Udp, None)),
        |c| -> Result<(), String> {
            c.set_timeout(Duration::from_secs(3));
            let mut v = vec![1.0f32; 100_000];
            c.all_reduce_in_place(&mut v, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
            if c.rank() == 2 {
                return Ok(()); // dies: its communicator (QPs, device) goes away
            }
            std::thread::sleep(Duration::from_millis(100));
            for alg in Algorithm::ALL {
                c.set_algorithm(Some(alg));
                match c.all_reduce_in_place(&mut v, ReduceOp::Sum) {
                    Err(Error::Timeout(_) | Error::Peer { .. } | Error::Broken(_)) => {
                        return Err("failed".into())
                    }
                    Err(e) => return Err(format!("unexpected error {e}")),
                    Ok(()) => {}
                }
            }
            Ok(())
        },
    );
    assert_eq!(res[2], Ok(()));
    for (r, x) in res.iter().enumerate() {
        if r != 2 {
            assert_eq!(x, &Err("failed".to_string()), "rank {r}");
        }
    }
    assert!(
        t.elapsed() < Duration::from_secs(40),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn bootstrap_refuses_bad_peers() {
    use std::io::{BufRead, BufReader, Write};
    // A "rank" that says hello with the wrong world size: rank 0 refuses.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let h = std::thread::spawn(move || {
        let mut cfg = config(device(Transport::Shm, None));
        cfg.timeout = Duration::from_secs(10);
        Communicator::new(0, 2, Rendezvous::Listener(listener), cfg).map(|_| ())
    });
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"softrdma-coll/1 rank=1 size=3 chunk=4096 depth=4|addr=0x1 rkey=0x2 len=3|-|-\n")
        .unwrap();
    let err = h.join().unwrap().unwrap_err();
    assert!(
        matches!(err, Error::Bootstrap(ref m) if m.contains("world size 3")),
        "{err}"
    );
    drop(s);
    // A rank whose rendezvous never answers times out.
    let mut cfg = config(device(Transport::Shm, None));
    cfg.timeout = Duration::from_millis(500);
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead);
    let err = Communicator::new(1, 2, Rendezvous::Addr(addr), cfg).unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err}");
    let _ = BufReader::new(std::io::empty()).lines();
}

#[test]
fn launcher_variables() {
    use softrdma_coll::Launch;
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(a, _)| *a == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let l = Launch::from_vars(&env(&[
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("SOFTRDMA_COLL_ADDR", "127.0.0.1:5000"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(
        (l.rank, l.size, l.rendezvous.port(), l.source),
        (1, 2, 5000, "mpirun")
    );
    let a = Launch::from_vars(&env(&[
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("PMIX_NAMESPACE", "prterun-x-1@1"),
    ]))
    .unwrap()
    .unwrap();
    let b = Launch::from_vars(&env(&[
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("PMIX_NAMESPACE", "prterun-x-1@1"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(
        a.rendezvous, b.rendezvous,
        "ranks of one job meet at one port"
    );
    let t = Launch::from_vars(&env(&[
        ("RANK", "3"),
        ("WORLD_SIZE", "4"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(
        (t.rank, t.size, t.rendezvous.port(), t.source),
        (3, 4, 29501, "torchrun")
    );
    assert!(Launch::from_vars(&env(&[
        ("RANK", "4"),
        ("WORLD_SIZE", "4"),
        ("MASTER_ADDR", "x"),
        ("MASTER_PORT", "1")
    ]))
    .is_err());
    assert!(Launch::from_vars(&env(&[("RANK", "0"), ("WORLD_SIZE", "4")])).is_err());
    assert!(Launch::from_vars(&env(&[
        ("OMPI_COMM_WORLD_RANK", "zero"),
        ("OMPI_COMM_WORLD_SIZE", "2")
    ]))
    .is_err());
    assert!(Launch::from_vars(&env(&[])).unwrap().is_none());
}
