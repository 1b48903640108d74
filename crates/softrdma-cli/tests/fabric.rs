//! `softrdma fabric`: a committed scenario with `--json` and `--report`,
//! and a bad scenario refused with a reason.

mod common;

use common::{softrdma, tmp};

#[test]
fn runs_a_scenario_and_writes_json_and_the_html_report() {
    let scenario = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../softrdma-fabric/scenarios/small_permutation.json"
    );
    let (json, html) = (tmp("fabric-out.json"), tmp("fabric-out.html"));
    let r = softrdma(&[
        "fabric",
        "--sample-us",
        "5",
        "--json",
        json.to_str().unwrap(),
        "--report",
        html.to_str().unwrap(),
        scenario,
    ]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("16 hosts, 16 messages"), "{}", r.stdout);
    assert!(r.stdout.contains("M events/s"), "{}", r.stdout);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v[0]["completed"], true);
    assert_eq!(v[0]["params"]["link_layer"], "pfc");
    let h = std::fs::read_to_string(&html).unwrap();
    assert!(h.contains("<svg") && h.contains("Switch queues over time"));
}

#[test]
fn a_bad_scenario_is_refused_with_a_reason() {
    let bad = tmp("fabric-bad.json");
    std::fs::write(
        &bad,
        r#"{"topology":{"tiers":2,"k":4,"link_gbps":100},
            "link_layer":{"kind":"lossy"},
            "workload":{"kind":"all_reduce","algorithm":"sharp","bytes":8}}"#,
    )
    .unwrap();
    let r = softrdma(&["fabric", bad.to_str().unwrap()]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("lossless"), "{}", r.stderr);
}
