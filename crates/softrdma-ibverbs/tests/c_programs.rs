//! C programs against Debian's `<infiniband/verbs.h>` (libibverbs-dev) on
//! softrdma's library:
//!
//! * `tests/c/verbs_checks.c`, compiled here with `cc` and linked with
//!   `-libverbs` against this library, checks error paths and corner
//!   cases (bad rkey → REM_ACCESS_ERR, posting in the wrong state, invalid
//!   modify_qp masks → EINVAL, CQ overrun → IBV_EVENT_CQ_ERR, deregistering
//!   a region in use, completion channels with poll and O_NONBLOCK, UD with
//!   its GRH, SRQ limit events, unsupported verbs);
//! * `tests/c/bad_counts.c`, built the same way, hands the library bad
//!   counts (num_sge over the queue's limit with a one-element array, a
//!   bad WR in a chain, lists longer than the queue or cyclic, inline data
//!   over max_inline_data, poll_cq with num_entries -1, caps over the
//!   device's limits) and checks each errno and `bad_wr`, and that nothing
//!   past a count or a failing WR is read;
//! * `tests/c/odp.c`: on-demand paging — the odp_caps of
//!   ibv_query_device_ex, explicit and implicit ODP regions whose pages the
//!   accesses (or ibv_advise_mr) resolve, data checked, a WRITE to an
//!   unmapped page → REM_ACCESS_ERR, pinned registration of unmapped
//!   memory → EFAULT;
//! * `tests/c/domains.c`: device memory (copies, a zero-based region an
//!   RDMA WRITE fills, free refused while it exists), thread and parent
//!   domains (used where a PD goes, EBUSY for what they use);
//! * `tests/c/mw.c`: memory windows — the device's window caps, types 1
//!   and 2 bound with `ibv_bind_mw`, an IBV_WR_BIND_MW work request and
//!   `ibv_wr_bind_mw`, WRITEs through a window (data checked; outside it
//!   REM_ACCESS_ERR), IBV_WR_LOCAL_INV, SEND with invalidate, dealloc,
//!   and IBV_WC_MW_BIND_ERR for a region without MW_BIND;
//! * `tests/c/ibv_mw_pingpong.c`: memory windows between two processes
//!   (server binds, client WRITEs through the window and invalidates it
//!   with a SEND with invalidate, or the server unbinds a type-1 window;
//!   then a WRITE through the dead rkey gets REM_ACCESS_ERR), both types,
//!   over UDP and shared memory; the same program runs against rxe in
//!   interop/rxe;
//! * `tests/c/ece.c`: `ibv_query_ece`/`ibv_set_ece` — the selective-repeat
//!   offer, the negotiation before RTR with data moved over the agreed
//!   QPs, and every refusal's errno;
//! * `ibv_rc_pingpong`, and the programs, under valgrind's memcheck:
//!   no invalid reads or writes anywhere, this library included.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// Compiles `tests/c/<name>.c` against this library; `None` (the test
/// skips, saying why) without `cc` or `<infiniband/verbs.h>`.
fn compile(name: &str) -> Option<PathBuf> {
    if !have(&["cc"]) {
        return None;
    }
    if !std::path::Path::new("/usr/include/infiniband/verbs.h").exists() {
        assert!(std::env::var_os("SOFTRDMA_STRICT_TESTS").is_none(), "an outside tool or file this test needs is missing, and SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping");
        eprintln!("SKIPPED: <infiniband/verbs.h> not installed (Debian: libibverbs-dev)");
        return None;
    }
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let exe = lib_dir().join(name);
    let o = Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror", "-O1", "-g", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-L")
        .arg(lib_dir())
        .arg("-libverbs")
        .output()
        .expect("cc runs");
    assert!(
        o.status.success(),
        "cc {name}.c failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    Some(exe)
}

fn run_checks(exe: &Path, transport: &str, load: Load) {
    let o = run(
        softrdma_cmd(&exe.to_string_lossy(), &[], load, transport),
        Duration::from_secs(120),
    );
    let fails: Vec<&str> = o.stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert!(
        o.ok && fails.is_empty(),
        "verbs_checks ({transport}, {load:?}) exit {:?} timed_out {}:\n{}\n{}",
        o.code,
        o.timed_out,
        o.stdout,
        o.stderr
    );
    let passed = o.stdout.lines().filter(|l| l.starts_with("PASS")).count();
    for want in [
        "PASS bad_rkey_rem_access_err",
        "PASS post_send_in_reset",
        "PASS modify_missing_attrs_einval",
        "PASS cq_overrun_async_event",
        "PASS write_to_deregistered_rem_access_err",
        "PASS wr_with_deregistered_lkey_loc_prot_err",
        "PASS ud_send_recv_with_grh",
        "PASS ud_wc_roce_fields",
        "PASS send_with_imm",
        "PASS get_cq_event_blocking",
        "PASS srq_limit_reached_event",
    ] {
        assert!(o.stdout.contains(want), "{want} missing:\n{}", o.stdout);
    }
    assert!(passed >= 60, "only {passed} checks ran:\n{}", o.stdout);
}

#[test]
fn verbs_checks_c_program() {
    let _g = serial();
    let Some(exe) = compile("verbs_checks") else {
        return;
    };
    // The program was linked against this library: its imports carry
    // rdma-core's versions, as if it had been built on a real system.
    run_checks(&exe, "udp", Load::LibraryPath);
    run_checks(&exe, "auto", Load::LibraryPath);
}

#[test]
fn rc_pingpong_under_valgrind() {
    let _g = serial();
    if !have(&["valgrind", "ibv_rc_pingpong"]) {
        return;
    }
    let port = 19601u16;
    let p = port.to_string();
    let vg = |client: bool| {
        let mut args = vec![
            "--error-exitcode=97",
            "--leak-check=no",
            "--errors-for-leak-kinds=none",
            "ibv_rc_pingpong",
            "-d",
            "srx0",
            "-g",
            "0",
            "-p",
            &p,
            "-n",
            "20",
        ];
        if client {
            args.push("127.0.0.1");
        }
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        softrdma_cmd("valgrind", &refs, Load::LibraryPath, "udp")
    };
    let (s, c) = run_pair(vg(false), vg(true), port, Duration::from_secs(300));
    for (side, o) in [("server", &s), ("client", &c)] {
        let text = o.text();
        assert!(
            !text.contains("Invalid read") && !text.contains("Invalid write"),
            "valgrind {side}: invalid memory access:\n{text}"
        );
        assert!(
            o.ok && o.stdout.contains("20 iters in"),
            "valgrind {side}: exit {:?} (97 = memcheck errors), timed_out {}:\n{text}",
            o.code,
            o.timed_out
        );
        assert!(
            text.contains("ERROR SUMMARY: 0 errors"),
            "valgrind {side}: memcheck reported errors:\n{text}"
        );
    }
}

/// Runs C program `name` under valgrind memcheck over UDP; fails on any
/// invalid access or memcheck error. `None` when a tool is missing (the
/// helpers say so, and fail under strict mode).
fn under_valgrind(name: &str) -> Option<Output> {
    if !have(&["valgrind"]) {
        return None;
    }
    let exe = compile(name)?.to_string_lossy().into_owned();
    let o = run(
        softrdma_cmd(
            "valgrind",
            &["--error-exitcode=97", "--leak-check=no", &exe],
            Load::LibraryPath,
            "udp",
        ),
        Duration::from_secs(300),
    );
    let text = o.text();
    assert!(
        !text.contains("Invalid read") && !text.contains("Invalid write"),
        "valgrind {name}: invalid memory access:\n{text}"
    );
    assert!(
        text.contains("ERROR SUMMARY: 0 errors"),
        "valgrind {name}: exit {:?} (97 = memcheck errors), timed_out {}:\n{text}",
        o.code,
        o.timed_out
    );
    Some(o)
}

#[test]
fn verbs_checks_under_valgrind() {
    let _g = serial();
    let Some(o) = under_valgrind("verbs_checks") else {
        return;
    };
    assert!(
        o.ok && o.stdout.contains("0 failures"),
        "valgrind verbs_checks: exit {:?}:\n{}",
        o.code,
        o.text()
    );
}

/// `tests/c/mw.c` under memcheck: the window verbs read only what the
/// program gave them (`ibv_mw_bind`, the WR's bind_mw member, the MR).
#[test]
fn mw_under_valgrind() {
    let _g = serial();
    let Some(o) = under_valgrind("mw") else {
        return;
    };
    let passed = o.stdout.lines().filter(|l| l.starts_with("PASS")).count();
    assert!(
        o.ok && passed == MW_CHECKS,
        "valgrind mw: exit {:?}, {passed} passed:\n{}",
        o.code,
        o.text()
    );
}

/// Every check `tests/c/bad_counts.c` makes, by name: each must PASS.
const BAD_COUNTS: &[&str] = &[
    "small_qp_caps",
    "send_num_sge_1000_einval",
    "send_num_sge_one_over_einval",
    "send_num_sge_negative_einval",
    "send_num_sge_int_max_einval",
    "send_null_sg_list_einval",
    "send_refused_wrs_not_posted",
    "send_null_bad_wr_einval",
    "send_empty_list_einval",
    "send_null_args_not_posted",
    "send_chain_second_bad_einval",
    "send_chain_first_posted",
    "send_chain_third_not_posted",
    "send_next_of_failing_wr_not_followed",
    "send_list_longer_than_queue_enomem",
    "send_list_longer_than_queue_rest_posted",
    "send_cyclic_list_enomem",
    "send_cyclic_list_queue_full_posted",
    "send_inline_one_over_einval",
    "send_inline_huge_einval",
    "send_inline_at_limit_ok",
    "send_after_refusals_ok",
    "recv_num_sge_1000_einval",
    "recv_num_sge_too_many_einval",
    "recv_num_sge_negative_einval",
    "recv_null_sg_list_einval",
    "recv_null_bad_wr_einval",
    "recv_empty_list_einval",
    "recv_refused_wrs_not_posted",
    "recv_chain_second_bad_einval",
    "recv_next_of_failing_wr_not_followed",
    "recv_chain_only_first_posted",
    "recv_cyclic_list_enomem",
    "recv_cyclic_list_queue_full_flushed",
    "srq_num_sge_1000_einval",
    "srq_num_sge_too_many_einval",
    "srq_null_sg_list_einval",
    "srq_null_bad_wr_einval",
    "srq_empty_list_ok",
    "srq_chain_second_bad_einval",
    "srq_chain_only_first_posted",
    "recv_on_srq_qp_einval",
    "poll_cq_negative_returns_0",
    "poll_cq_int_min_returns_0",
    "poll_cq_zero_returns_0",
    "poll_cq_negative_null_wc_returns_0",
    "poll_cq_nonpositive_writes_nothing",
    "poll_cq_null_wc_einval",
    "poll_cq_after_refusals_finds_completion",
    "create_qp_send_sge_over_device_einval",
    "create_qp_recv_sge_over_device_einval",
    "create_qp_send_wr_over_device_einval",
    "create_qp_recv_wr_over_device_einval",
    "create_qp_send_sge_huge_einval",
    "create_qp_inline_huge_einval",
    "create_cq_negative_einval",
    "create_cq_zero_einval",
    "create_cq_over_device_einval",
    "create_srq_wr_over_device_einval",
    "create_srq_sge_over_device_einval",
];

/// The bad_counts program's output: it exited 0 (no crash: a signal has no
/// exit code), no check failed, and every check ran and passed.
fn assert_bad_counts(o: &Output, what: &str) {
    let fails: Vec<&str> = o.stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert!(
        o.ok && fails.is_empty() && o.stdout.contains("\n0 failures\n"),
        "bad_counts ({what}) exit {:?} (none: killed by a signal) timed_out {}:\n{}\n{}",
        o.code,
        o.timed_out,
        o.stdout,
        o.stderr
    );
    for name in BAD_COUNTS {
        assert!(
            o.stdout.lines().any(|l| l == format!("PASS {name}")),
            "bad_counts ({what}): PASS {name} missing:\n{}",
            o.stdout
        );
    }
}

#[test]
fn odp_c_program() {
    let _g = serial();
    let Some(exe) = compile("odp") else {
        return;
    };
    for transport in ["udp", "auto"] {
        let o = run(
            softrdma_cmd(&exe.to_string_lossy(), &[], Load::LibraryPath, transport),
            Duration::from_secs(120),
        );
        let passed = o.stdout.lines().filter(|l| l.starts_with("PASS")).count();
        assert!(
            o.ok && passed == 13 && !o.stdout.contains("FAIL"),
            "odp ({transport}) exit {:?}, {passed} passed:\n{}\n{}",
            o.code,
            o.stdout,
            o.stderr
        );
    }
}

/// The checks `tests/c/mw.c` makes.
const MW_CHECKS: usize = 21;

#[test]
fn mw_c_program() {
    let _g = serial();
    let Some(exe) = compile("mw") else {
        return;
    };
    for transport in ["udp", "auto"] {
        let o = run(
            softrdma_cmd(&exe.to_string_lossy(), &[], Load::LibraryPath, transport),
            Duration::from_secs(120),
        );
        let passed = o.stdout.lines().filter(|l| l.starts_with("PASS")).count();
        assert!(
            o.ok && passed == MW_CHECKS && !o.stdout.contains("FAIL"),
            "mw ({transport}) exit {:?}, {passed} passed:\n{}\n{}",
            o.code,
            o.stdout,
            o.stderr
        );
    }
}

#[test]
fn mw_pingpong_two_processes() {
    let _g = serial();
    let Some(exe) = compile("ibv_mw_pingpong") else {
        return;
    };
    let exe = exe.to_string_lossy().into_owned();
    let mut port = 18731u16;
    for transport in ["udp", "auto"] {
        for t in ["1", "2"] {
            port += 1;
            let p = port.to_string();
            let args = ["-p", &p, "-n", "5", "-s", "8192", "-c", "-t", t];
            let (s, c) = pair(&exe, &args, port, transport, Duration::from_secs(120));
            assert_both_ok(&format!("ibv_mw_pingpong -t {t} ({transport})"), &s, &c);
            for want in [
                "PASS binds",
                "PASS data_through_window",
                "PASS dead_window_wrote_nothing",
            ] {
                assert!(s.stdout.contains(want), "{want} missing:\n{}", s.stdout);
            }
            assert!(
                c.stdout
                    .contains("PASS write_through_dead_window_rem_access_err"),
                "{}",
                c.stdout
            );
        }
    }
}

#[test]
fn ece_c_program() {
    let _g = serial();
    let Some(exe) = compile("ece") else {
        return;
    };
    for transport in ["udp", "auto"] {
        let o = run(
            softrdma_cmd(&exe.to_string_lossy(), &[], Load::LibraryPath, transport),
            Duration::from_secs(120),
        );
        let passed = o.stdout.lines().filter(|l| l.starts_with("PASS")).count();
        assert!(
            o.ok && passed == 12 && !o.stdout.contains("FAIL"),
            "ece ({transport}) exit {:?}, {passed} passed:\n{}\n{}",
            o.code,
            o.stdout,
            o.stderr
        );
    }
}

#[test]
fn bad_counts_c_program() {
    let _g = serial();
    let Some(exe) = compile("bad_counts") else {
        return;
    };
    for transport in ["udp", "auto"] {
        let o = run(
            softrdma_cmd(&exe.to_string_lossy(), &[], Load::LibraryPath, transport),
            Duration::from_secs(120),
        );
        assert_bad_counts(&o, transport);
    }
}

#[test]
fn bad_counts_under_valgrind() {
    let _g = serial();
    let Some(o) = under_valgrind("bad_counts") else {
        return;
    };
    assert_bad_counts(&o, "valgrind, udp");
}

/// The checks `tests/c/domains.c` makes: each must PASS.
const DOMAINS_CHECKS: usize = 22;

fn assert_domains(o: &Output, what: &str) {
    let passed = o.stdout.lines().filter(|l| l.starts_with("PASS")).count();
    assert!(
        o.ok && passed == DOMAINS_CHECKS && !o.stdout.contains("FAIL"),
        "domains ({what}) exit {:?}, {passed} of {DOMAINS_CHECKS} passed:\n{}\n{}",
        o.code,
        o.stdout,
        o.stderr
    );
}

#[test]
fn domains_c_program() {
    let _g = serial();
    let Some(exe) = compile("domains") else {
        return;
    };
    for transport in ["udp", "auto"] {
        let o = run(
            softrdma_cmd(&exe.to_string_lossy(), &[], Load::LibraryPath, transport),
            Duration::from_secs(120),
        );
        assert_domains(&o, transport);
    }
}

#[test]
fn domains_under_valgrind() {
    let _g = serial();
    let Some(o) = under_valgrind("domains") else {
        return;
    };
    assert_domains(&o, "valgrind, udp");
}
