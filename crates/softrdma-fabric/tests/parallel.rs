//! A fabric split into parts (`partitions`) that run side by side: the
//! same results on one thread or many, close to the whole fabric's, and
//! whole when a split cannot look ahead. Small fabrics (well under a
//! second each in release).

use softrdma_fabric::report::run_threads;
use softrdma_fabric::{Report, Scenario};

fn scenario(json: &str) -> Scenario {
    Scenario::from_json(json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

fn go(json: &str, threads: usize) -> Report {
    let r = run_threads(&scenario(json), 0, threads).unwrap();
    assert!(r.completed, "did not complete:\n{}", r.summary());
    assert_eq!(r.totals.failed_wrs, 0);
    r
}

/// The report without the figures of the simulator's own speed.
fn results(r: &Report) -> serde_json::Value {
    let mut v = serde_json::to_value(r).unwrap();
    for k in ["wall_s", "events_per_s", "peak_rss_mb", "threads"] {
        v[k] = serde_json::Value::Null;
    }
    v
}

/// 128 hosts in 8 pods (three tiers, k = 8), split in 4 parts, with
/// traffic between every part.
fn split(parts: usize, link_layer: &str, transport: &str, workload: &str) -> String {
    format!(
        r#"{{"seed":3,"partitions":{parts},
            "topology":{{"tiers":3,"k":8,"link_gbps":100,"cable_ns":50,"switch_ns":300}},
            "link_layer":{{{link_layer}}},
            "transport":{{{transport}}},
            "workload":{workload}}}"#
    )
}

/// Five senders in other pods to host 0, and a victim flow beside them.
const INCAST: &str = r#"{"kind":"flows","flows":[
    {"src":40,"dst":0,"bytes":600000},{"src":60,"dst":0,"bytes":600000},
    {"src":80,"dst":0,"bytes":600000},{"src":100,"dst":0,"bytes":600000},
    {"src":127,"dst":0,"bytes":600000},{"src":70,"dst":1,"bytes":300000}]}"#;

fn cases(parts: usize) -> Vec<(&'static str, String)> {
    vec![
        (
            "PFC with DCQCN and 0.5 % loss, selective repeat",
            split(
                parts,
                r#""kind":"pfc","ecn":{"kmin_bytes":20000,"kmax_bytes":200000,"pmax":0.2},"loss":{"rate":0.005,"links":"all"}"#,
                r#""recovery":"selective_repeat","dcqcn":true,"timeout":14"#,
                INCAST,
            ),
        ),
        (
            "IB credits, incast",
            split(parts, r#""kind":"ib_credit""#, "", INCAST),
        ),
        (
            "lossy Ethernet, sprayed permutation",
            split(
                parts,
                r#""kind":"lossy","loss":{"rate":0.002,"links":"all"}"#,
                r#""recovery":"go_back_n""#,
                r#"{"kind":"permutation","bytes":200000}"#,
            ),
        ),
        (
            "recursive-doubling all-reduce, 500 ns hosts",
            split(
                parts,
                r#""kind":"ib_credit""#,
                r#""host_ns":500"#,
                r#"{"kind":"all_reduce","algorithm":"recursive_doubling","bytes":262144}"#,
            ),
        ),
    ]
}

#[test]
fn a_split_fabric_gives_the_same_results_on_one_thread_or_many() {
    for (name, json) in cases(4) {
        let one = go(&json, 1);
        assert_eq!(one.partitions, 4, "{name}: {}", one.whole_because);
        for threads in [2, 4] {
            let many = go(&json, threads);
            assert_eq!(many.threads, threads, "{name}");
            assert_eq!(results(&one), results(&many), "{name}, {threads} threads");
        }
    }
}

#[test]
fn a_split_fabric_does_what_the_whole_one_does() {
    for (name, json) in cases(4) {
        let split = go(&json, 2);
        let whole = go(&json.replace(r#""partitions":4"#, r#""partitions":1"#), 1);
        assert_eq!(whole.partitions, 1);
        let (a, b) = (split.makespan_us, whole.makespan_us);
        // Without loss only the order of simultaneous events differs; with
        // it, each part draws its own losses.
        let lossy = json.contains("loss");
        let bound = if lossy { 0.15 } else { 0.01 };
        assert!(
            (a - b).abs() <= bound * b,
            "{name}: makespan {a} µs split, {b} µs whole"
        );
        if !lossy {
            let (s, w) = (&split.totals, &whole.totals);
            assert_eq!(s.packets_delivered, w.packets_delivered, "{name}");
            assert_eq!(s.retransmits + w.retransmits, 0, "{name}");
        }
        let pauses = |r: &Report| r.totals.pause_frames > 0;
        assert_eq!(pauses(&split), pauses(&whole), "{name}: PFC");
        if name.starts_with("PFC") {
            // Pauses, marks and CNPs crossed between parts.
            let t = &split.totals;
            assert!(
                t.pause_frames > 0 && t.ecn_marked > 0 && t.cnps > 0,
                "{t:?}"
            );
            assert!(t.sr_retransmits > 0 && t.drops_corruption > 0, "{t:?}");
            let paused_core = split
                .links
                .iter()
                .any(|l| l.from.starts_with("core") && l.pause_us > 0.0);
            assert!(paused_core, "a core link paused");
        }
    }
}

#[test]
fn a_fabric_that_cannot_look_ahead_runs_whole() {
    // With 0 ns cables, credits going back to another part would be due
    // at once there.
    let json = split(2, r#""kind":"ib_credit""#, "", INCAST)
        .replace(r#""cable_ns":50"#, r#""cable_ns":0"#);
    let r = go(&json, 2);
    assert_eq!(r.partitions, 1);
    assert!(r.whole_because.contains("0 ns"), "{}", r.whole_because);
    assert!(r.summary().contains("ran whole:"));
    // In-network aggregation keeps one state for the tree.
    let json = split(
        2,
        r#""kind":"ib_credit""#,
        r#""host_ns":500"#,
        r#"{"kind":"all_reduce","algorithm":"sharp","bytes":65536}"#,
    );
    let r = go(&json, 2);
    assert_eq!(r.partitions, 1);
    assert!(
        r.whole_because.contains("aggregation"),
        "{}",
        r.whole_because
    );
}

#[test]
fn partitions_out_of_range_are_refused() {
    for parts in [0, 65] {
        let json = split(parts, r#""kind":"ib_credit""#, "", INCAST);
        let e = Scenario::from_json(&json)
            .and_then(|s| run_threads(&s, 0, 1).map(|_| ()))
            .unwrap_err();
        assert!(e.contains("partitions must be 1..=64"), "{e}");
    }
}
