//! C programs against Debian's `<infiniband/verbs.h>` (libibverbs-dev) on
//! softrdma's library:
//!
//! * `tests/c/verbs_checks.c`, compiled here with `cc` and linked with
//!   `-libverbs` against this library, checks error paths and corner
//!   cases (bad rkey → REM_ACCESS_ERR, posting in the wrong state, invalid
//!   modify_qp masks → EINVAL, CQ overrun → IBV_EVENT_CQ_ERR, deregistering
//!   a region in use, completion channels with poll and O_NONBLOCK, UD with
//!   its GRH, SRQ limit events, unsupported verbs);
//! * `ibv_rc_pingpong`, and the checks program, under valgrind's memcheck:
//!   no invalid reads or writes anywhere, this library included.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

fn compile_checks() -> Option<PathBuf> {
    if !have(&["cc"]) {
        return None;
    }
    if !std::path::Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("SKIPPED: <infiniband/verbs.h> not installed (Debian: libibverbs-dev)");
        return None;
    }
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/verbs_checks.c");
    let exe = lib_dir().join("verbs_checks");
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
        "cc failed:\n{}",
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
    let Some(exe) = compile_checks() else { return };
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

#[test]
fn verbs_checks_under_valgrind() {
    let _g = serial();
    if !have(&["valgrind"]) {
        return;
    }
    let Some(exe) = compile_checks() else { return };
    let exe = exe.to_string_lossy().into_owned();
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
        "valgrind: invalid memory access:\n{text}"
    );
    assert!(
        o.ok && text.contains("ERROR SUMMARY: 0 errors") && o.stdout.contains("0 failures"),
        "valgrind verbs_checks: exit {:?} (97 = memcheck errors), timed_out {}:\n{text}",
        o.code,
        o.timed_out
    );
}
