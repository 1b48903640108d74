//! Debian's unmodified rdma-core example programs (package ibverbs-utils)
//! on softrdma: `ibv_devices`, `ibv_devinfo -v`, and the RC, UC, UD and SRQ
//! ping-pongs as server/client pairs over loopback, with busy polling and
//! with completion events (`-e`). Also checks that every libibverbs symbol
//! these programs, perftest and the provider libraries they load import
//! exists in the library with its version.
//!
//! Transport: UDP (SOFTRDMA_TRANSPORT=udp), except where a test says.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

#[test]
fn ibv_devices_lists_srx0() {
    if !have(&["ibv_devices"]) {
        return;
    }
    let o = run(
        softrdma_cmd("ibv_devices", &[], Load::LibraryPath, "udp"),
        T,
    );
    assert!(o.ok, "ibv_devices failed: {}", o.text());
    let line = o
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("srx0"))
        .unwrap_or_else(|| panic!("no srx0 in:\n{}", o.stdout));
    let guid = line.split_whitespace().nth(1).expect("a GUID column");
    assert_eq!(guid.len(), 16, "GUID {guid:?}");
    assert!(guid.chars().all(|c| c.is_ascii_hexdigit()), "GUID {guid:?}");
}

#[test]
fn ibv_devinfo_verbose() {
    if !have(&["ibv_devinfo"]) {
        return;
    }
    for load in [Load::LibraryPath, Load::Preload] {
        let o = run(softrdma_cmd("ibv_devinfo", &["-v"], load, "udp"), T);
        assert!(o.ok, "ibv_devinfo -v ({load:?}) failed: {}", o.text());
        let out = &o.stdout;
        for want in [
            "hca_id:\tsrx0",
            "transport:\t\t\tInfiniBand (0)",
            "fw_ver:\t\t\t\tsoftrdma",
            "vendor_id:\t\t\t0xffffff",
            "phys_port_cnt:\t\t\t1",
            "atomic_cap:\t\t\tATOMIC_HCA (1)",
            "state:\t\t\tPORT_ACTIVE (4)",
            "max_mtu:\t\t4096 (5)",
            "link_layer:\t\tEthernet",
            "GID[  0]:\t\t::ffff:127.0.0.",
            "RoCE v2",
        ] {
            assert!(
                out.contains(want),
                "{want:?} missing ({load:?}) from:\n{out}"
            );
        }
        let rd_atom = out
            .lines()
            .find_map(|l| l.trim().strip_prefix("max_qp_rd_atom:"))
            .and_then(|v| v.trim().parse::<u32>().ok())
            .expect("max_qp_rd_atom line");
        assert!(rd_atom > 0, "max_qp_rd_atom {rd_atom}");
        // The active MTU is the device's: 4096 on a loopback of MTU 65536.
        let active = out
            .lines()
            .find_map(|l| l.trim().strip_prefix("active_mtu:"))
            .expect("active_mtu line")
            .trim();
        assert!(
            ["256 (1)", "512 (2)", "1024 (3)", "2048 (4)", "4096 (5)"].contains(&active),
            "active_mtu {active:?}"
        );
    }
}

/// The ping-pongs take `-g 0` (RoCE needs a GID) and `-d srx0`.
fn pingpong(tool: &str, port: u16, extra: &[&str], transport: &str) {
    let _g = serial();
    let p = port.to_string();
    let mut args = vec!["-d", "srx0", "-g", "0", "-p", &p, "-n", "200"];
    args.extend_from_slice(extra);
    let (s, c) = pair(tool, &args, port, transport, T);
    let what = format!("{tool} {}", args.join(" "));
    assert_both_ok(&what, &s, &c);
    for (side, o) in [("server", &s), ("client", &c)] {
        assert!(
            o.stdout.contains("200 iters in") && o.stdout.contains("bytes in"),
            "{what}: {side} printed no result:\n{}",
            o.text()
        );
        assert!(
            o.stdout.contains("GID ::ffff:127.0.0."),
            "{what}: {side} shows no RoCE GID:\n{}",
            o.stdout
        );
    }
}

#[test]
fn ibv_rc_pingpong() {
    if have(&["ibv_rc_pingpong"]) {
        pingpong("ibv_rc_pingpong", 19401, &[], "udp");
        pingpong("ibv_rc_pingpong", 19402, &["-e"], "udp");
        pingpong(
            "ibv_rc_pingpong",
            19403,
            &["-s", "65536", "-r", "16"],
            "udp",
        );
    }
}

#[test]
fn ibv_uc_pingpong() {
    if have(&["ibv_uc_pingpong"]) {
        pingpong("ibv_uc_pingpong", 19404, &[], "udp");
        pingpong("ibv_uc_pingpong", 19405, &["-e"], "udp");
    }
}

#[test]
fn ibv_ud_pingpong() {
    if have(&["ibv_ud_pingpong"]) {
        pingpong("ibv_ud_pingpong", 19406, &[], "udp");
        pingpong("ibv_ud_pingpong", 19407, &["-e"], "udp");
    }
}

#[test]
fn ibv_srq_pingpong() {
    if have(&["ibv_srq_pingpong"]) {
        pingpong("ibv_srq_pingpong", 19408, &[], "udp");
        pingpong("ibv_srq_pingpong", 19409, &["-e"], "udp");
    }
}

/// The same programs over the same-host shared-memory transport
/// (SOFTRDMA_TRANSPORT=auto), polling: packets through rings instead of UDP.
#[test]
fn pingpongs_over_shared_memory() {
    if have(&["ibv_rc_pingpong", "ibv_ud_pingpong", "ibv_srq_pingpong"]) {
        pingpong("ibv_rc_pingpong", 19410, &[], "auto");
        pingpong("ibv_ud_pingpong", 19411, &[], "auto");
        pingpong("ibv_srq_pingpong", 19412, &[], "auto");
    }
}

/// The same programs sleeping on completion events (`-e`) over the
/// same-host transport: each completion must wake its program (an event
/// that waits for the next poll never comes: the program is asleep).
#[test]
fn pingpongs_with_events_over_shared_memory() {
    if have(&["ibv_rc_pingpong", "ibv_ud_pingpong", "ibv_srq_pingpong"]) {
        pingpong("ibv_rc_pingpong", 19413, &["-e"], "shm");
        pingpong("ibv_ud_pingpong", 19414, &["-e"], "shm");
        pingpong("ibv_srq_pingpong", 19415, &["-e"], "shm");
    }
}

/// Imported `name@VERSION` libibverbs symbols of an ELF file.
fn imports(file: &str) -> BTreeSet<String> {
    let o = Command::new("nm")
        .args(["-D", "--with-symbol-versions", "--undefined-only", file])
        .output()
        .expect("nm runs");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|s| s.contains("@IBVERBS_"))
        .map(str::to_string)
        .collect()
}

/// `name@VERSION` of the library's default-version exports.
fn exports() -> BTreeSet<String> {
    let lib = built_library();
    let o = Command::new("nm")
        .args(["-D", "--with-symbol-versions", "--defined-only"])
        .arg(&lib)
        .output()
        .expect("nm runs");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter_map(|s| s.split_once("@@").map(|(n, v)| format!("{n}@{v}")))
        .collect()
}

#[test]
fn every_imported_symbol_is_exported_with_its_version() {
    if !have(&["nm"]) {
        return;
    }
    let ours = exports();
    // The list recorded from Debian 12's binaries and libraries …
    let fixture = include_str!("fixtures/debian12-imports.txt");
    let mut wanted: BTreeSet<String> = fixture
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .collect();
    assert!(wanted.len() > 100);
    // … and whatever the installed programs and libraries import now.
    let tools = [
        "ibv_devices",
        "ibv_devinfo",
        "ibv_rc_pingpong",
        "ibv_uc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
        "ibv_xsrq_pingpong",
        "ibv_asyncwatch",
        "ib_write_lat",
        "ib_write_bw",
        "ib_read_lat",
        "ib_read_bw",
        "ib_send_lat",
        "ib_send_bw",
        "ib_atomic_lat",
        "ib_atomic_bw",
    ];
    for t in tools {
        if let Some(p) = which(t) {
            wanted.extend(imports(&p.to_string_lossy()));
        }
    }
    for lib in ["libmlx5.so.1", "libefa.so.1", "librdmacm.so.1"] {
        let p = format!("/usr/lib/x86_64-linux-gnu/{lib}");
        if std::path::Path::new(&p).exists() {
            wanted.extend(imports(&p));
        }
    }
    let missing: Vec<&String> = wanted.difference(&ours).collect();
    assert!(
        missing.is_empty(),
        "not exported with that version: {missing:?}"
    );
    // The library's own identity.
    let o = Command::new("readelf")
        .arg("-d")
        .arg(built_library())
        .output();
    if let Ok(o) = o {
        let d = String::from_utf8_lossy(&o.stdout);
        assert!(d.contains("Library soname: [libibverbs.so.1]"), "{d}");
    }
}

/// `ibv_uc_pingpong -e` over shared memory hangs in most runs: the
/// same-host link is created by the sending side (client) from the
/// application's thread, and the client's background thread, already asleep
/// in ppoll with no timer due (UC has no retransmission timer), never marks
/// the new link's receive ring "sleeping", so the server's replies never
/// wake it while the client's application blocks in ibv_get_cq_event.
/// Fixed: new links start with their receive ring marked sleeping and the
/// device's own background thread is poked to take them into account.
#[test]
fn ibv_uc_pingpong_events_over_shared_memory() {
    if have(&["ibv_uc_pingpong"]) {
        for port in 19413..19418 {
            pingpong("ibv_uc_pingpong", port, &["-e"], "auto");
        }
    }
}
