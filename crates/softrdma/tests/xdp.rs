//! The AF_XDP port (docs/xdp.md) between two network-namespace "hosts"
//! joined by a veth pair (MTU 1500, so the active MTU is 1024): the whole
//! operation matrix (every operation, RC/UC/UD, sizes to 16 MiB) with both
//! ends on AF_XDP, again with loss and reordering injected, an AF_XDP
//! device against a UDP-port device over IPv4 and IPv6 with the veth
//! captured (tcpdump on the UDP end, which sees the AF_XDP end's frames as
//! they arrive; tshark must find nothing malformed, the ICRCs must hold,
//! also by ../shared/tools/icrc-check.py), the XDP program gone from the
//! interface after its process is killed with SIGKILL, and the errors that
//! name what is missing.
//!
//! Each peer is this test binary started with `ip netns exec`, its device
//! configured by SOFTRDMA_DEVICES (`name=IP@xdp:IFACE`). Needs root and
//! iproute2 (and a kernel with AF_XDP); skipped, saying why, otherwise, and
//! under SOFTRDMA_STRICT_TESTS (CI) that fails instead. As in netns.rs, the
//! cases run in parallel threads from one test that counts the cases that
//! ran to the end. One case runs generic XDP and busy-poll mode against
//! native XDP and wake-up mode.

mod common;

use std::net::IpAddr;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;

static RAN: AtomicUsize = AtomicUsize::new(0);

#[test]
fn xdp_cases_all_run() {
    if let Some(why) = netns_unavailable() {
        return skip("xdp", &why);
    }
    let cases: [(&str, fn()); 7] = [
        ("generic_xdp_and_busy_poll", generic_xdp_and_busy_poll),
        (
            "every_operation_both_ends_on_af_xdp",
            every_operation_both_ends_on_af_xdp,
        ),
        (
            "loss_and_reordering_over_af_xdp",
            loss_and_reordering_over_af_xdp,
        ),
        ("af_xdp_against_udp_ipv4_captured", || {
            af_xdp_against_udp_captured(false)
        }),
        ("af_xdp_against_udp_ipv6_captured", || {
            af_xdp_against_udp_captured(true)
        }),
        (
            "sigkill_leaves_no_xdp_program",
            sigkill_leaves_no_xdp_program,
        ),
        ("errors_name_what_is_missing", errors_name_what_is_missing),
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
    assert!(failed.is_empty(), "AF_XDP cases failed: {failed:?}");
    let ran = RAN.load(Ordering::SeqCst);
    eprintln!("xdp: {ran} of {} cases ran", cases.len());
    assert_eq!(ran, cases.len(), "every AF_XDP case ran (none skipped)");
}

/// Entry point of the re-executed peers; returns at once in a normal run.
#[test]
fn peer() {
    let Some(role) = role() else { return };
    match role.as_str() {
        "responder" | "requester" => matrix_peer(&role),
        "hold" => {
            // Opens the device, says so, and waits to be killed.
            let ctx = softrdma::Context::open_default().unwrap();
            println!("holding {}", ctx.addr());
            std::thread::sleep(Duration::from_secs(120));
        }
        "open" => match softrdma::Context::open_default() {
            Ok(ctx) => println!("opened {}", ctx.addr()),
            Err(e) => println!("cannot open: {e}"),
        },
        other => panic!("unknown role {other}"),
    }
}

/// Two namespaces joined by a veth: (namespaces, interface a, interface b,
/// address a, address b).
fn hosts(kind: &str, v6: bool) -> (Netns, String, String, String, String) {
    let ns = Netns::new(kind, &["a", "b"]);
    let x = std::process::id() % 250 + 1;
    let n = ns
        .tag()
        .rsplit('-')
        .next()
        .unwrap_or("0")
        .parse::<u32>()
        .unwrap_or(0)
        % 250;
    let (a, b, plen) = if v6 {
        (
            format!("fd78:{x:x}:{n:x}::1"),
            format!("fd78:{x:x}:{n:x}::2"),
            64,
        )
    } else {
        (
            format!("10.{}.{x}.1", 100 + n),
            format!("10.{}.{x}.2", 100 + n),
            24,
        )
    };
    ns.veth(0, 1, 1500, &format!("{a}/{plen}"), &format!("{b}/{plen}"));
    let (va, vb) = ns.veth_names();
    (ns, va, vb, a, b)
}

fn dev(ip: &str, iface: Option<&str>) -> String {
    let ip = if ip.contains(':') {
        format!("[{ip}]:4791")
    } else {
        ip.to_string()
    };
    match iface {
        Some(i) => format!("srx0={ip}@xdp:{i}"),
        None => format!("srx0={ip}"),
    }
}

fn cm_addr(ip: &str) -> String {
    if ip.contains(':') {
        format!("[{ip}]:18515")
    } else {
        format!("{ip}:18515")
    }
}

/// Runs the matrix between a responder in namespace b and a requester in
/// namespace a; returns the requester's log.
#[allow(clippy::too_many_arguments)]
fn run_matrix(
    ns: &Netns,
    dir: &TempDir,
    dev_a: &str,
    dev_b: &str,
    ip_b: &str,
    plan: &str,
    fault: Option<&str>,
    timeout: Duration,
) -> (String, String) {
    let mut responder = ns.self_command(1, "peer", "responder");
    responder
        .env("SOFTRDMA_DEVICES", dev_b)
        .env(CM_ENV, format!("listen:{}", cm_addr(ip_b)))
        .env(EXPECT_MTU_ENV, "1024");
    let mut requester = ns.self_command(0, "peer", "requester");
    requester
        .env("SOFTRDMA_DEVICES", dev_a)
        .env(CM_ENV, format!("connect:{}", cm_addr(ip_b)))
        .env(EXPECT_MTU_ENV, "1024")
        .env(PLAN_ENV, plan);
    if let Some(f) = fault {
        responder.env("SOFTRDMA_FAULT", f);
        requester.env("SOFTRDMA_FAULT", f);
    }
    let mut responder = Peer::spawn("responder (netns b)", responder, dir);
    let mut requester = Peer::spawn("requester (netns a)", requester, dir);
    expect_all_success(&mut [&mut requester, &mut responder], timeout);
    (requester.log(), responder.log())
}

fn assert_on_xdp(log: &str, iface: &str) {
    assert!(
        log.contains(&format!("AF_XDP on {iface} queue 0 (")),
        "the peer ran on AF_XDP on {iface}:\n{log}"
    );
}

fn every_operation_both_ends_on_af_xdp() {
    let dir = TempDir::new("xdp-matrix");
    let (ns, va, vb, a, b) = hosts("xdpm", false);
    let (req, resp) = run_matrix(
        &ns,
        &dir,
        &dev(&a, Some(&va)),
        &dev(&b, Some(&vb)),
        &b,
        "full",
        None,
        Duration::from_secs(300),
    );
    assert_on_xdp(&req, &va);
    assert_on_xdp(&resp, &vb);
    assert!(
        req.contains("Mtu1024") && req.contains(" cases in "),
        "the requester ran the matrix on a 1024-byte MTU:\n{req}"
    );
    eprintln!(
        "{}",
        req.lines()
            .filter(|l| l.contains("AF_XDP") || l.contains(" cases in "))
            .collect::<Vec<_>>()
            .join("\n")
    );
    RAN.fetch_add(1, Ordering::SeqCst);
}

/// The other modes: the requester on generic (SKB) XDP in busy-poll mode,
/// the responder on native XDP in wake-up mode.
fn generic_xdp_and_busy_poll() {
    let dir = TempDir::new("xdp-modes");
    let (ns, va, vb, a, b) = hosts("xdpg", false);
    let mut responder = ns.self_command(1, "peer", "responder");
    responder
        .env("SOFTRDMA_DEVICES", dev(&b, Some(&vb)))
        .env(CM_ENV, format!("listen:{}", cm_addr(&b)))
        .env(EXPECT_MTU_ENV, "1024");
    let mut requester = ns.self_command(0, "peer", "requester");
    requester
        .env("SOFTRDMA_DEVICES", dev(&a, Some(&va)))
        .env("SOFTRDMA_XDP_MODE", "generic")
        .env("SOFTRDMA_XDP_POLL", "busy")
        .env(CM_ENV, format!("connect:{}", cm_addr(&b)))
        .env(EXPECT_MTU_ENV, "1024")
        .env(PLAN_ENV, "small");
    let mut responder = Peer::spawn("responder (netns b)", responder, &dir);
    let mut requester = Peer::spawn("requester (netns a)", requester, &dir);
    expect_all_success(
        &mut [&mut requester, &mut responder],
        Duration::from_secs(300),
    );
    let (req, resp) = (requester.log(), responder.log());
    assert!(
        req.contains(&format!(
            "AF_XDP on {va} queue 0 (generic XDP, copy mode, busy-poll)"
        )),
        "{req}"
    );
    assert!(resp.contains("(native XDP, copy mode, wake-up)"), "{resp}");
    assert!(req.contains(" cases in "), "{req}");
    RAN.fetch_add(1, Ordering::SeqCst);
}

/// The matrix with packets lost and reordered on receive at both ends
/// (0.2 % each): every RC case, sizes to 16 MiB (each 16 MiB message meets
/// some 60 faults), and UC and UD up to four packets (an unreliable message
/// with a packet lost or out of order is lost whole, so a 1 MiB one would
/// rarely arrive, over any port: the `faults` plan).
fn loss_and_reordering_over_af_xdp() {
    let dir = TempDir::new("xdp-faults");
    let (ns, va, vb, a, b) = hosts("xdpf", false);
    let (req, resp) = run_matrix(
        &ns,
        &dir,
        &dev(&a, Some(&va)),
        &dev(&b, Some(&vb)),
        &b,
        "faults",
        Some("loss=0.002,reorder=0.002"),
        Duration::from_secs(400),
    );
    assert_on_xdp(&req, &va);
    assert_on_xdp(&resp, &vb);
    assert!(req.contains(" cases in "), "{req}");
    // The faults happened and were recovered from: retransmissions.
    let retransmits: u64 = [&req, &resp]
        .iter()
        .filter_map(|l| l.lines().find(|l| l.contains(" counters: ")))
        .filter_map(|l| l.split("retransmits: ").nth(1))
        .filter_map(|t| {
            t.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    eprintln!("loss and reordering over AF_XDP: {retransmits} retransmissions, every case passed");
    assert!(
        retransmits > 0,
        "faults were injected and recovered from:\n{req}\n{resp}"
    );
    RAN.fetch_add(1, Ordering::SeqCst);
}

/// An AF_XDP device in namespace a against a UDP-port device in b, the
/// veth captured on b's side.
fn af_xdp_against_udp_captured(v6: bool) {
    let dir = TempDir::new(if v6 { "xdp-v6" } else { "xdp-v4" });
    let (ns, va, vb, a, b) = hosts(if v6 { "xdp6" } else { "xdp4" }, v6);
    let mut dump = match which("tcpdump") {
        None => Err("tcpdump is not installed".to_string()),
        Some(_) => Tcpdump::start(
            Some(&ns.names[1]),
            &vb,
            "udp port 4791",
            dir.path("veth.pcap"),
        ),
    };
    let (req, _) = run_matrix(
        &ns,
        &dir,
        &dev(&a, Some(&va)),
        &dev(&b, None),
        &b,
        if v6 { "wire" } else { "small" },
        None,
        Duration::from_secs(300),
    );
    assert_on_xdp(&req, &va);
    assert!(req.contains(" cases in "), "{req}");
    RAN.fetch_add(1, Ordering::SeqCst);
    let dump = match dump.as_mut() {
        Ok(d) => d,
        Err(why) => return skip("xdp/tcpdump", why),
    };
    eprintln!("tcpdump: {:?}", dump.stop());
    let cap = check_capture(&dump.file);
    let (a, b): (IpAddr, IpAddr) = (a.parse().unwrap(), b.parse().unwrap());
    assert!(
        cap.flows.contains(&(a, b)) && cap.flows.contains(&(b, a)),
        "both ways on the veth: {cap:?}"
    );
    assert!(
        cap.icrc_bad.is_empty(),
        "bad ICRC in frames {:?}",
        cap.icrc_bad
    );
    match (icrc_checker(), which("python3")) {
        (Some(checker), Some(_)) => {
            let (ok, bad) = run_icrc_checker(&checker, &dump.file);
            assert_eq!((ok, bad), (cap.frames, 0), "icrc-check on the veth capture");
        }
        _ => skip(
            "xdp/icrc-check",
            "../shared/tools/icrc-check.py or python3 is missing",
        ),
    }
    match which("tshark") {
        Some(_) => assert_eq!(tshark_check(&dump.file).len() as u64, cap.frames),
        None => skip("xdp/tshark", "tshark is not installed"),
    }
    eprintln!(
        "AF_XDP/UDP {} capture: {} frames, all ICRCs good",
        if v6 { "IPv6" } else { "IPv4" },
        cap.frames
    );
}

fn xdp_attached(ns: &str, iface: &str) -> bool {
    let out = Command::new("ip")
        .args(["-n", ns, "-d", "link", "show", "dev", iface])
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    s.contains("prog/xdp") || s.contains("xdpgeneric") || s.contains(" xdp ")
}

fn sigkill_leaves_no_xdp_program() {
    let dir = TempDir::new("xdp-kill");
    let (ns, va, _vb, a, _b) = hosts("xdpk", false);
    assert!(!xdp_attached(&ns.names[0], &va), "no program before");
    let mut hold = ns.self_command(0, "peer", "hold");
    hold.env("SOFTRDMA_DEVICES", dev(&a, Some(&va)));
    let mut hold = Peer::spawn("holder", hold, &dir);
    let t0 = Instant::now();
    while !hold.log().contains("holding") {
        assert!(hold.try_status().is_none(), "holder ended:\n{}", hold.log());
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "holder never opened:\n{}",
            hold.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        xdp_attached(&ns.names[0], &va),
        "the program is attached while the device is open"
    );
    hold.signal(libc::SIGKILL);
    let _ = hold.wait(Duration::from_secs(30));
    let t0 = Instant::now();
    while xdp_attached(&ns.names[0], &va) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "an XDP program is still attached to {va} 10 s after SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "SIGKILL: XDP program gone from {va} after {:?}",
        t0.elapsed()
    );
    RAN.fetch_add(1, Ordering::SeqCst);
}

/// A driver mode the interface lacks and a missing capability are named;
/// `@xdp-or-udp` falls back to UDP instead.
fn errors_name_what_is_missing() {
    let dir = TempDir::new("xdp-errors");
    let (ns, va, _vb, a, _b) = hosts("xdpe", false);
    let run = |name: &str, devs: String, envs: &[(&str, &str)], prefix: &[&str]| {
        let mut c = ns.exec(0, prefix.first().copied().unwrap_or("env"));
        c.args(prefix.iter().skip(1));
        c.arg(std::env::current_exe().unwrap())
            .args(self_args("peer"))
            .env(ROLE_ENV, "open")
            .env("SOFTRDMA_TRANSPORT", "udp")
            .env("SOFTRDMA_DEVICES", devs);
        for (k, v) in envs {
            c.env(k, v);
        }
        let mut p = Peer::spawn(name, c, &dir);
        let _ = p.wait(Duration::from_secs(60));
        p.log()
    };
    // loopback has no native XDP driver.
    let log = run(
        "lo-native",
        "srx0=127.0.0.1@xdp:lo".into(),
        &[("SOFTRDMA_XDP_MODE", "native")],
        &[],
    );
    assert!(
        log.contains("cannot open") && log.contains("driver cannot run XDP"),
        "native XDP on lo is refused, naming the driver:\n{log}"
    );
    let log = run("no-iface", "srx0=127.0.0.1@xdp:nosuch0".into(), &[], &[]);
    assert!(log.contains("no interface \"nosuch0\""), "{log}");
    // Without capabilities (setpriv from util-linux drops them all).
    match which("setpriv") {
        None => skip("xdp/capabilities", "setpriv (util-linux) is not installed"),
        Some(_) => {
            let drop_caps = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"];
            let log = run("no-caps", dev(&a, Some(&va)), &[], &drop_caps);
            assert!(
                log.contains("cannot open")
                    && log.contains("CAP_NET_RAW")
                    && log.contains("CAP_BPF"),
                "the missing capabilities are named:\n{log}"
            );
            let fallback = dev(&a, Some(&va)).replace("@xdp:", "@xdp-or-udp:");
            let log = run("no-caps-fallback", fallback, &[], &drop_caps);
            assert!(
                log.contains("falling back to the UDP port") && log.contains("opened"),
                "@xdp-or-udp falls back:\n{log}"
            );
        }
    }
    RAN.fetch_add(1, Ordering::SeqCst);
}
