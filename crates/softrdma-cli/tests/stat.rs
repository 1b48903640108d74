//! `softrdma stat` against devices open in this test process: their
//! counters must appear, be positive after traffic, and disappear when the
//! devices close; sockets of dead processes are cleaned up.

use std::process::Command;
use std::time::Duration;

use softrdma::{
    AccessFlags, ConnectOptions, Context, DeviceConfig, FaultSpec, QpType, RecvWr, SendOp, SendWr,
};

fn stat(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .arg("stat")
        .args(args)
        .output()
        .expect("run softrdma stat");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn stat_shows_counters_of_running_devices() {
    // One test in this binary: setting the environment is safe here.
    let dir = std::env::temp_dir().join(format!("softrdma-stat-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var("SOFTRDMA_RUN_DIR", &dir);

    let cfg = DeviceConfig::default_loopback().transport(softrdma::shm::Transport::Udp);
    let a = Context::open_with(&cfg).unwrap();
    // Loss into b: the selective-repeat QPs below recover through SACKs,
    // and their counters show it.
    let lossy = FaultSpec {
        loss: 0.1,
        reorder: 0.0,
        dup: 0.0,
        corrupt: 0.0,
        seed: 7,
        ..Default::default()
    };
    let b = Context::open_with(&cfg.clone().fault(lossy)).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let ma = pa.alloc_mr(1 << 16, access).unwrap();
    let mb = pb.alloc_mr(1 << 16, access).unwrap();
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().unwrap();
    let qb = pb.create_qp(QpType::Rc, &cb, &cb).build().unwrap();
    let agreed = qa.query_ece().unwrap().agree(qb.query_ece().unwrap());
    qa.set_ece(agreed).unwrap();
    qb.set_ece(agreed).unwrap();
    let o = ConnectOptions {
        timeout: 10,
        ..Default::default()
    };
    qa.connect(&qb.endpoint(), &o).unwrap();
    qb.connect(&qa.endpoint(), &o).unwrap();
    let t = Duration::from_secs(10);
    let rb = mb.remote();
    for i in 0..10 {
        qa.post_send(&SendWr::new(
            i,
            SendOp::Write {
                remote_addr: rb.addr,
                rkey: rb.rkey,
            },
            vec![ma.sge(0, 9000)],
        ))
        .unwrap();
        ca.wait_ok(t).unwrap();
    }
    qb.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: vec![mb.sge(0, 100)],
    })
    .unwrap();
    qa.post_send(&SendWr::new(99, SendOp::Send, vec![ma.sge(0, 100)]))
        .unwrap();
    ca.wait_ok(t).unwrap();
    cb.wait_ok(t).unwrap();

    // A socket left by a process that is gone, and one nobody listens on.
    std::fs::create_dir_all(&dir).unwrap();
    let dead = dir.join("stats-srx9-999999999-0.sock");
    std::fs::write(&dead, b"").unwrap();
    let refused = dir.join(format!("stats-srx8-{}-77.sock", std::process::id()));
    drop(std::os::unix::net::UnixListener::bind(&refused).unwrap());

    let (code, out, err) = stat(&["--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    let mine: Vec<&serde_json::Value> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["pid"] == std::process::id())
        .collect();
    assert_eq!(mine.len(), 2, "{out}");
    for d in &mine {
        assert_eq!(d["device"], "srx0");
        assert_eq!(d["softrdma_stats"], 1);
        for k in ["tx_packets", "rx_packets", "tx_bytes", "rx_bytes"] {
            assert!(d["counters"][k].as_u64().unwrap() > 0, "{k}: {d}");
        }
        assert_eq!(d["counters"]["icrc_errors"], 0);
        assert!(d["driver"]["send_errors"].is_u64(), "{d}");
        let qps = d["qps"].as_array().unwrap();
        assert_eq!(qps.len(), 1, "{d}");
        assert_eq!(qps[0]["type"], "RC");
        assert_eq!(qps[0]["state"], "RTS");
        assert!(
            qps[0]["counters"]["tx_packets"].as_u64().unwrap() > 0,
            "{d}"
        );
        assert_eq!(qps[0]["selective_repeat"], true, "{d}");
        for k in ["rate_cuts", "rate_bps", "cnps_asked"] {
            assert!(qps[0]["congestion"][k].is_u64(), "{k}: {d}");
        }
    }
    // What selective repeat did about the loss: packets held out of order
    // at b, and only the missing ones sent again by a.
    let sum = |k: &str| -> u64 {
        mine.iter()
            .map(|d| d["counters"][k].as_u64().unwrap())
            .sum()
    };
    assert!(sum("ooo_held") > 0 && sum("sr_retransmits") > 0, "{out}");
    let (code, text, err) = stat(&[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains("selective-repeat:") && text.contains("ooo_held"),
        "{text}"
    );
    eprintln!("{text}");
    let sender = mine
        .iter()
        .find(|d| d["addr"] == a.addr().to_string())
        .expect("device a listed");
    // 10 WRITEs of 3 packets each, and one SEND.
    assert!(
        sender["counters"]["tx_packets"].as_u64().unwrap() >= 31,
        "{sender}"
    );
    assert!(!dead.exists(), "the dead process's socket was removed");
    assert!(!refused.exists(), "the refusing socket was removed");

    // --device names the devices to show: a third device, srxf, alone.
    let mut fcfg = DeviceConfig::default_loopback().transport(softrdma::shm::Transport::Udp);
    fcfg.name = "srxf".into();
    let f = Context::open_with(&fcfg).unwrap();
    let (code, out, err) = stat(&["--json", "--device", "srxf=auto"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let names: Vec<&serde_json::Value> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["device"])
        .collect();
    assert_eq!(names, ["srxf"], "{out}");
    drop(f);

    let (code, text, _) = stat(&[]);
    assert_eq!(code, 0);
    let pid = std::process::id();
    assert!(text.contains(&format!("srx0 pid {pid} (")), "{text}");
    assert!(text.contains("    device: tx_packets "), "{text}");
    assert!(
        text.contains(" RC RTS selective-repeat: tx_packets "),
        "{text}"
    );

    drop((qa, qb, ma, mb, ca, cb, pa, pb, a, b));
    let (_, out, _) = stat(&["--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(
        v["devices"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["pid"] != pid),
        "closed devices are gone: {out}"
    );
    let (_, text, _) = stat(&[]);
    assert!(text.contains("no softrdma devices open"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
