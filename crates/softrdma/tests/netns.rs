//! Two "hosts": network namespaces joined by a veth pair with MTU 1500, so
//! the active (and path) MTU is 1024. Each peer is this test binary started
//! with `ip netns exec`, its device configured by SOFTRDMA_DEVICES with the
//! namespace's address; they exchange QPs through `softrdma::cm` over TCP
//! across the veth and run the whole operation matrix. The namespaces (and
//! the veth with them) are removed at the end, also on failure.
//!
//! Needs root and iproute2; skipped (saying why) otherwise, and under
//! SOFTRDMA_STRICT_TESTS (CI) that fails instead.
//!
//! The cases run from one test, in parallel threads (as cargo's harness
//! would run them), each in namespaces of its own unique names; the test
//! counts the cases that really ran to the end and asserts that all did,
//! so a case can never pass by being skipped.

mod common;

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;

/// Cases that ran to the end (not skipped).
static RAN: AtomicUsize = AtomicUsize::new(0);

/// Every namespace case, run at once; all must have run.
#[test]
fn namespace_cases_all_run() {
    if let Some(why) = netns_unavailable() {
        return skip("netns", &why);
    }
    let cases: [(&str, fn()); 2] = [
        (
            "every_operation_between_two_namespaces_over_veth_mtu_1500",
            every_operation_between_two_namespaces_over_veth_mtu_1500,
        ),
        (
            "ipv6_between_two_processes_on_loopback",
            ipv6_between_two_processes_on_loopback,
        ),
    ];
    let threads: Vec<_> = cases
        .iter()
        .map(|&(name, f)| {
            (
                name,
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn(f)
                    .unwrap(),
            )
        })
        .collect();
    let mut failed = Vec::new();
    for (name, t) in threads {
        if t.join().is_err() {
            failed.push(name);
        }
    }
    assert!(failed.is_empty(), "namespace cases failed: {failed:?}");
    let ran = RAN.load(Ordering::SeqCst);
    eprintln!("netns: {ran} of {} cases ran", cases.len());
    assert_eq!(ran, cases.len(), "every namespace case ran (none skipped)");
}

/// Entry point of the re-executed peers; returns at once in a normal run.
#[test]
fn peer() {
    let Some(role) = role() else { return };
    match role.as_str() {
        "responder" | "requester" => matrix_peer(&role),
        other => panic!("unknown role {other}"),
    }
}

fn every_operation_between_two_namespaces_over_veth_mtu_1500() {
    let dir = TempDir::new("netns");
    let ns = Netns::new("veth", &["a", "b"]);
    let x = std::process::id() % 250 + 1;
    let (ip_a, ip_b) = (format!("10.77.{x}.1"), format!("10.77.{x}.2"));
    ns.veth(0, 1, 1500, &format!("{ip_a}/24"), &format!("{ip_b}/24"));

    let mut responder = ns.self_command(1, "peer", "responder");
    responder
        .env("SOFTRDMA_DEVICES", format!("srx0={ip_b}"))
        .env(CM_ENV, format!("listen:{ip_b}:18515"))
        .env(EXPECT_MTU_ENV, "1024");
    let mut responder = Peer::spawn("responder (netns b)", responder, &dir);
    let mut requester = ns.self_command(0, "peer", "requester");
    requester
        .env("SOFTRDMA_DEVICES", format!("srx0={ip_a}"))
        .env(CM_ENV, format!("connect:{ip_b}:18515"))
        .env(EXPECT_MTU_ENV, "1024")
        .env(PLAN_ENV, "full");
    let mut requester = Peer::spawn("requester (netns a)", requester, &dir);

    expect_all_success(
        &mut [&mut requester, &mut responder],
        Duration::from_secs(300),
    );
    let log = requester.log();
    eprintln!("{log}");
    assert!(
        log.contains("Mtu1024") && log.contains(" cases in "),
        "the requester ran on a 1024-byte MTU:\n{log}"
    );
    RAN.fetch_add(1, Ordering::SeqCst);
}

/// IPv6: two processes on loopback, one device on `::1`, the other on a
/// second loopback address. Hosts rarely have two IPv6 loopback addresses
/// (and peers share port 4791, so they need two), so the test makes a
/// namespace whose `lo` has `::1` and `fd77::2` and runs both peers there.
fn ipv6_between_two_processes_on_loopback() {
    let dir = TempDir::new("ipv6");
    let ns = Netns::new("v6", &[""]);
    ip(&[
        "-6",
        "-n",
        &ns.names[0],
        "addr",
        "add",
        "fd77::2/128",
        "dev",
        "lo",
        "nodad",
    ]);

    // The wire inside the namespace, judged like IPv4's in tests/wire.rs
    // (and like there, with per-packet sends: tcpdump on lo would record a
    // GSO send as the one buffer the kernel passes along).
    let mut dump = match which("tcpdump") {
        None => Err("tcpdump is not installed".to_string()),
        Some(_) => Tcpdump::start(
            Some(&ns.names[0]),
            "lo",
            "udp port 4791",
            dir.path("lo6.pcap"),
        ),
    };

    let mut responder = ns.self_command(0, "peer", "responder");
    responder
        .env("SOFTRDMA_DEVICES", "srx6=[::1]:4791")
        .env("SOFTRDMA_GSO", "0")
        .env(CM_ENV, "listen:[::1]:18515")
        .env(EXPECT_MTU_ENV, "4096");
    let mut responder = Peer::spawn("responder (::1)", responder, &dir);
    let mut requester = ns.self_command(0, "peer", "requester");
    requester
        .env("SOFTRDMA_DEVICES", "srx6=[fd77::2]:4791")
        .env("SOFTRDMA_GSO", "0")
        .env(CM_ENV, "connect:[::1]:18515")
        .env(EXPECT_MTU_ENV, "4096")
        .env(PLAN_ENV, "small");
    let mut requester = Peer::spawn("requester (fd77::2)", requester, &dir);

    expect_all_success(
        &mut [&mut requester, &mut responder],
        Duration::from_secs(120),
    );
    let log = requester.log();
    assert!(
        log.contains("requester on [fd77::2]:4791") && log.contains(" cases in "),
        "{log}"
    );

    // The exchange ran: the case counts even when tcpdump may not capture.
    RAN.fetch_add(1, Ordering::SeqCst);
    let dump = match dump.as_mut() {
        Ok(d) => d,
        Err(why) => return skip("ipv6/tcpdump", why),
    };
    eprintln!("tcpdump: {:?}", dump.stop());
    let cap = check_capture(&dump.file);
    let (a, b): (IpAddr, IpAddr) = ("::1".parse().unwrap(), "fd77::2".parse().unwrap());
    assert!(
        cap.flows.contains(&(a, b)) && cap.flows.contains(&(b, a)),
        "IPv6 both ways: {cap:?}"
    );
    assert!(
        cap.icrc_bad.is_empty(),
        "bad ICRC in frames {:?}",
        cap.icrc_bad
    );
    if let (Some(checker), Some(_)) = (icrc_checker(), which("python3")) {
        let (ok, bad) = run_icrc_checker(&checker, &dump.file);
        assert_eq!((ok, bad), (cap.frames, 0), "icrc-check on the IPv6 capture");
    }
    if which("tshark").is_some() {
        assert_eq!(tshark_check(&dump.file).len() as u64, cap.frames);
    }
    eprintln!("IPv6 capture: {} frames, all ICRCs good", cap.frames);
}
