//! `softrdma perf reg_mr` on small sizes (the 1 GiB run is for
//! docs/performance.md, not CI): its three tables parse, every figure is
//! positive, and the plot is an SVG with a line per kind. What the tables
//! must show is checked where it is a fact, not a speed: an ODP
//! registration does not grow with the size the way a pinned one does.

mod common;

use common::*;

/// The numeric rows under the line that starts with `head`.
fn table(out: &str, head: &str) -> Vec<Vec<f64>> {
    let mut lines = out.lines().skip_while(|l| !l.starts_with(head)).skip(2);
    let mut rows = Vec::new();
    for l in lines.by_ref() {
        let cells: Option<Vec<f64>> = l
            .split_whitespace()
            .map(|w| w.trim_end_matches('%').parse().ok())
            .collect();
        match cells {
            Some(c) if !c.is_empty() => rows.push(c),
            _ => break,
        }
    }
    rows
}

#[test]
fn reg_mr_tables_and_plot() {
    let svg = tmp("reg_mr.svg");
    let _ = std::fs::remove_file(&svg);
    let r = softrdma(&[
        "perf",
        "reg_mr",
        "--max-size",
        "4M",
        "--iters",
        "5",
        "--transfers",
        "10",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let reg = table(&r.stdout, "Registration and deregistration time");
    let sizes: Vec<f64> = reg.iter().map(|r| r[0]).collect();
    assert_eq!(
        sizes,
        [4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0],
        "{}",
        r.stdout
    );
    for row in &reg {
        assert_eq!(row.len(), 8, "{row:?}");
        assert!(row[2..].iter().all(|&v| v > 0.0), "{row:?}");
    }
    // Pinning faults in 1024 pages at 4 MiB; ODP does nothing at any size.
    let (small, big) = (&reg[0], &reg[5]);
    assert!(big[2] > small[2], "pinned grows: {small:?} {big:?}");
    assert!(
        big[6] < big[2],
        "ODP registers 4 MiB faster than pinning: {big:?}"
    );
    let touch = table(&r.stdout, "RDMA WRITE into untouched memory");
    assert_eq!(touch.len(), 3, "{}", r.stdout);
    assert!(touch
        .iter()
        .all(|row| row.len() == 9 && row[1] > 0.0 && row[5] > 0.0));
    // The fact behind ODP's first-touch cost: a WRITE into untouched ODP
    // memory faults its pages in (16 at 64 KiB), the same WRITE again
    // faults nothing, and a pinned region was faulted in at registration.
    let r64 = &touch[1];
    assert!(
        r64[3] >= 16.0,
        "ODP first touch faults 16 pages in: {r64:?}"
    );
    assert!(r64[7] < 16.0, "pinned: no first-touch faults: {r64:?}");
    let xfer = table(&r.stdout, "Register per transfer vs a reused pool");
    assert_eq!(xfer.len(), 3, "{}", r.stdout);
    assert!(xfer.iter().all(|row| row.len() == 6 && row[1] > 0.0));
    let text = std::fs::read_to_string(&svg).expect("the plot was written");
    assert!(
        text.starts_with("<svg") && text.contains("odp ibv_reg_mr"),
        "{text:.200}"
    );
    assert!(
        text.matches("<polyline").count() >= 6,
        "a line per kind and verb"
    );
}
