#!/usr/bin/env python3
"""softrdma <-> Linux Soft-RoCE (rxe) interoperability harness.

Boots Debian's kernel in a qemu TCG guest with rdma_rxe on a tap device,
puts softrdma on the host side of that tap (all inside a network namespace
this script creates), runs a matrix of perftest / pingpong tests in both
directions, captures the bridge, checks the ICRC of every RoCE frame, prints
a table and exits non-zero on any failure. Entry point: interop/rxe/run.sh. With --capture-cm it only boots the guest
and captures its kernel CM dialling the host (capture_kernel_cm).

Environment (all optional):
  SRX_INTEROP_CACHE   cache for the kernel and initramfs
                      (default ~/.cache/softrdma-interop)
  SRX_INTEROP_OUT     results, logs and captures (default target/interop-rxe)
  SRX_INTEROP_KERNEL  kernel package version, e.g. 6.1.0-57-amd64
  SRX_INTEROP_HOST_PORT  udp (default) or xdp: the host device's port
                      (xdp: AF_XDP on br0, docs/xdp.md; captured on tap0)
  SRX_INTEROP_ONLY    regular expression: run only matching case ids
  SRX_INTEROP_ITERS   iterations of latency tests (default 200)
  SRX_INTEROP_BW_ITERS iterations of bandwidth tests (default 500)
  SRX_INTEROP_BOOT_TIMEOUT seconds the guest may take to boot (default 180)
  SRX_RUNNER_<IMPL>   command prefix of a host-side implementation, e.g.
                      SRX_RUNNER_DROPIN="env LD_LIBRARY_PATH=/x" (see RUNNERS)
"""

import base64
import ctypes
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NET = "10.213.91"  # a private /24 that exists only inside our namespace
HOST_IP, GUEST_IP, PREFIX = f"{NET}.1", f"{NET}.2", 24
LINK_MTU = 1500  # path MTU 1024, so -s 512 fits one packet and -s 4096 needs four
AGENT_PORT = 7000
RXE_OUT_READS = 16  # outstanding READ/atomics rxe advertises (its own limit: 128)
GUEST_BINS = [
    "rdma", "ibv_devinfo", "ibv_rc_pingpong", "ibv_ud_pingpong",
    "ib_send_lat", "ib_write_lat", "ib_write_bw", "ib_read_lat", "ib_read_bw",
    "ib_atomic_lat", "rping", "udaddy", "rdma_server", "rdma_client", "ucmatose",
    "rstream", "riostream",
]
# Built here from the repository (against the system's libibverbs) for
# both sides: memory windows, which no Debian tool exercises.
MW_PINGPONG_SRC = REPO / "crates/softrdma-ibverbs/tests/c/ibv_mw_pingpong.c"
RXE_PROVIDER = "/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so"
RXE_DRIVER_FILE = "/etc/libibverbs.d/rxe.driver"
LIBGCC_S = "/lib/x86_64-linux-gnu/libgcc_s.so.1"
# Roots of the guest's module set; dependencies are added from modinfo.
# rdma_ucm brings rdma_cm, ib_cm and iw_cm: the kernel CM (--capture-cm).
MODULE_ROOTS = ["crc32_generic", "virtio_pci", "virtio_net", "rdma_rxe", "rdma_ucm"]

ITERS = int(os.environ.get("SRX_INTEROP_ITERS", "200"))
BW_ITERS = int(os.environ.get("SRX_INTEROP_BW_ITERS", "500"))
BOOT_TIMEOUT = float(os.environ.get("SRX_INTEROP_BOOT_TIMEOUT", "180"))
# A case's wall-clock budget. Under TCG on a loaded host the slowest case
# takes ~15 s; a stalled guest gets the rest before the case fails.
CASE_TIMEOUT = 120
# How long a server may take to start listening (TCG under load).
LISTEN_TIMEOUT = 60
STRICT = os.environ.get("SRX_INTEROP_STRICT") == "1"  # known issues fail too
RUN_ALL = os.environ.get("SRX_INTEROP_RUN_ALL") == "1"  # run cases a probe shows blocked


class Fail(Exception):
    """A failure of the harness itself (not of one test case)."""


T0 = time.monotonic()


def log(msg):
    print(f"[interop {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


CHILDREN = []  # every long-running process we start, ended by cleanup()


def spawn(cmd, **kw):
    p = subprocess.Popen(cmd, start_new_session=True, **kw)
    CHILDREN.append(p)
    return p


def end_children():
    for p in CHILDREN:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    CHILDREN.clear()


def run(cmd, **kw):
    r = subprocess.run(cmd, **kw)
    if r.returncode:
        raise Fail(f"`{' '.join(map(str, cmd))}` exited with status {r.returncode}")
    return r


def out_of(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


# --------------------------------------------------------------------------
# Kernel and initramfs (cached)


def version_key(s):
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", s)]


def modinfo_field(ko: Path, field: str) -> str:
    data = ko.read_bytes()
    m = re.search(rb"(?:^|\0)" + field.encode() + rb"=([^\0]*)", data)
    return m.group(1).decode() if m else ""


def ensure_kernel(cache: Path) -> Path:
    """Returns a directory with vmlinuz, modules/*.ko and modules.order."""
    want = os.environ.get("SRX_INTEROP_KERNEL", "")
    have = sorted((p.parent for p in cache.glob("kernel-*/modules.order")),
                  key=lambda p: version_key(p.name))
    if want:
        have = [p for p in have if p.name == f"kernel-{want}"]
    # A cache made before a module root was added lacks it: fetch again.
    have = [p for p in have
            if set(MODULE_ROOTS) <= {l.strip()[:-3] for l in (p / "modules.order").read_text().splitlines()}]
    if have:
        return have[-1]
    if not want:
        lines = out_of(["apt-cache", "search", "--names-only",
                        r"^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$"])
        names = sorted((l.split()[0] for l in lines.splitlines() if l.strip()),
                       key=version_key)
        if not names:
            raise Fail("no linux-image-6.1.0-<N>-amd64-unsigned package in apt "
                       "(run apt-get update; is this Debian 12?)")
        want = names[-1][len("linux-image-"):-len("-unsigned")]
    pkg = f"linux-image-{want}-unsigned"
    log(f"fetching kernel package {pkg} (apt-get download)")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        tmp = Path(tmp)
        os.chmod(tmp, 0o777)  # apt's _apt user downloads into it
        run(["apt-get", "download", "-q", pkg], cwd=tmp, stdout=subprocess.DEVNULL)
        deb = next(tmp.glob("*.deb"))
        run(["dpkg", "-x", str(deb), str(tmp / "x")])
        kdir = cache / f"kernel-{want}"
        stage = Path(str(kdir) + ".tmp")
        shutil.rmtree(stage, ignore_errors=True)
        (stage / "modules").mkdir(parents=True)
        shutil.copy(next((tmp / "x/boot").glob("vmlinuz-*")), stage / "vmlinuz")
        moddir = next((tmp / "x/lib/modules").iterdir())
        kos = {}
        for ko in moddir.rglob("*.ko*"):
            kos[ko.name.split(".ko")[0].replace("-", "_")] = ko
        order, seen = [], set()

        def add(name):
            if name in seen:
                return
            seen.add(name)
            ko = kos.get(name)
            if ko is None:
                return  # built in
            for dep in filter(None, modinfo_field(ko, "depends").split(",")):
                add(dep.replace("-", "_"))
            order.append(name)

        for r in MODULE_ROOTS:
            if r not in kos:
                raise Fail(f"{pkg} has no {r} module")
            add(r)
        for name in order:
            src = kos[name]
            dst = stage / "modules" / f"{name}.ko"
            if src.name.endswith(".ko.xz"):
                import lzma
                dst.write_bytes(lzma.decompress(src.read_bytes()))
            elif src.name.endswith(".ko.zst"):
                run(["zstd", "-q", "-d", "-o", str(dst), str(src)])
            else:
                shutil.copy(src, dst)
        (stage / "modules.order").write_text("".join(f"{n}.ko\n" for n in order))
        (stage / "package").write_text(deb.name + "\n")
        shutil.rmtree(kdir, ignore_errors=True)
        stage.rename(kdir)
    log(f"kernel {want} cached in {kdir} (modules: {' '.join(order)})")
    return kdir


def ldd_deps(path: str):
    deps = []
    for line in out_of(["ldd", path]).splitlines():
        m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
        if m:
            deps.append(m.group(1))
    return deps


def build_mw_pingpong(cache: Path) -> Path:
    """ibv_mw_pingpong, compiled against the system's libibverbs (the guest
    runs it on rxe, the host on the drop-in through LD_LIBRARY_PATH)."""
    exe = cache / "ibv_mw_pingpong"
    src = MW_PINGPONG_SRC
    if not exe.exists() or exe.stat().st_mtime_ns < src.stat().st_mtime_ns:
        r = subprocess.run(["cc", "-O2", "-Wall", "-o", str(exe), str(src), "-libverbs"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise Fail(f"cc {src.name} failed (libibverbs-dev needed):\n{r.stderr}")
    return exe


def ensure_initramfs(cache: Path, kdir: Path) -> Path:
    mw_pingpong = build_mw_pingpong(cache)
    bins = []
    for b in GUEST_BINS:
        p = shutil.which(b)
        if not p:
            raise Fail(f"{b} not found on the host (packages rdma-core ibverbs-utils "
                       "perftest iproute2 are needed to build the guest)")
        bins.append(p)
    busybox = shutil.which("busybox")
    if not busybox:
        raise Fail("busybox not found (package busybox-static)")
    files = set()
    for p in bins + [RXE_PROVIDER, str(mw_pingpong)]:
        if not Path(p).exists():
            raise Fail(f"{p} missing (package ibverbs-providers)")
        files.add(p)
        files.update(ldd_deps(p))
    # glibc loads libgcc_s with dlopen when a thread exits (pthread_exit,
    # rping's CM thread): ldd does not list it.
    if Path(LIBGCC_S).exists():
        files.add(LIBGCC_S)
    if not Path(RXE_DRIVER_FILE).exists():
        raise Fail(f"{RXE_DRIVER_FILE} missing (package ibverbs-providers)")
    h = hashlib.sha256()
    for f in [HERE / "guest/init", HERE / "guest/agent.sh", kdir / "modules.order"]:
        h.update(f.read_bytes())
    for f in sorted(files | {busybox, RXE_DRIVER_FILE}):
        st = os.stat(f)
        h.update(f"{f}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    h.update(kdir.name.encode())
    out = cache / f"initrd-{h.hexdigest()[:16]}.cpio.gz"
    if out.exists():
        return out
    log(f"building initramfs {out.name}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        for d in ["bin", "sbin", "usr/bin", "usr/sbin", "usr/lib/x86_64-linux-gnu",
                  "usr/lib64", "etc/libibverbs.d", "proc", "sys", "dev", "tmp", "run",
                  "usr/lib/modules"]:
            (root / d).mkdir(parents=True, exist_ok=True)
        # Debian's merged /usr: /lib and /lib64 are links into /usr.
        os.symlink("usr/lib", root / "lib")
        os.symlink("usr/lib64", root / "lib64")

        def place(src):
            rel = src.lstrip("/")
            if rel.startswith("lib/") or rel.startswith("lib64/"):
                rel = "usr/" + rel
            dst = root / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(os.path.realpath(src), dst)  # follow links: real bytes

        for f in sorted(files - {str(mw_pingpong)}):
            place(f)
        shutil.copy(mw_pingpong, root / "usr/bin/ibv_mw_pingpong")
        place(RXE_DRIVER_FILE)
        shutil.copy(busybox, root / "bin/busybox")
        for applet in out_of([busybox, "--list"]).split():
            if applet in ("busybox",):
                continue
            link = root / "bin" / applet
            if not link.exists():
                os.symlink("busybox", link)
        for ko in (kdir / "modules").iterdir():
            shutil.copy(ko, root / "usr/lib/modules" / ko.name)
        shutil.copy(kdir / "modules.order", root / "modules.order")
        shutil.copy(HERE / "guest/init", root / "init")
        shutil.copy(HERE / "guest/agent.sh", root / "agent.sh")
        os.chmod(root / "init", 0o755)
        os.chmod(root / "agent.sh", 0o755)
        run(["mknod", "-m", "600", str(root / "dev/console"), "c", "5", "1"])
        tmpout = Path(str(out) + ".tmp")
        with open(tmpout, "wb") as f:
            find = subprocess.Popen(["find", ".", "-print0"], cwd=root, stdout=subprocess.PIPE)
            cpio = subprocess.Popen(["cpio", "--null", "-o", "-H", "newc", "--quiet"],
                                    cwd=root, stdin=find.stdout, stdout=subprocess.PIPE)
            gz = subprocess.Popen(["gzip", "-1"], stdin=cpio.stdout, stdout=f)
            find.stdout.close()
            cpio.stdout.close()
            if gz.wait() or cpio.wait() or find.wait():
                raise Fail("building the initramfs failed (cpio/gzip)")
        tmpout.rename(out)
    for old in cache.glob("initrd-*.cpio.gz"):
        if old != out:
            old.unlink()
    log(f"initramfs {out} ({out.stat().st_size // 1024} KiB)")
    return out


# --------------------------------------------------------------------------
# Host tools


def target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))


def build_host_tools():
    tools = {}
    log("cargo build --release -p softrdma-cli")
    run(["cargo", "build", "--release", "-q", "-p", "softrdma-cli"], cwd=REPO)
    tools["softrdma"] = target_dir() / "release/softrdma"
    log("cargo build --release --manifest-path interop/rxe/Cargo.toml")
    run(["cargo", "build", "--release", "-q", "--manifest-path", str(HERE / "Cargo.toml"),
         "--target-dir", str(target_dir())], cwd=REPO)
    tools["peer"] = target_dir() / "release/softrdma-interop-peer"
    # The libibverbs drop-in, once its crate exists.
    tools["dropin"] = None
    tools["dropin_note"] = "pending: drop-in library not built (crates/softrdma-ibverbs absent)"
    if (REPO / "crates/softrdma-ibverbs/Cargo.toml").exists():
        log("cargo build --release -p softrdma-ibverbs")
        r = subprocess.run(["cargo", "build", "--release", "-q", "-p", "softrdma-ibverbs"],
                           cwd=REPO)
        if r.returncode:
            tools["dropin_note"] = "fail: cargo build -p softrdma-ibverbs failed"
        else:
            rel = target_dir() / "release"
            cands = [rel / "libibverbs.so", rel / "libibverbs.so.1"]
            lib = next((c for c in cands if c.exists()), None)
            if lib is None:
                tools["dropin_note"] = ("fail: softrdma-ibverbs built but there is no "
                                        f"libibverbs.so in {rel}")
            else:
                d = target_dir() / "interop-dropin"
                d.mkdir(parents=True, exist_ok=True)
                link = d / "libibverbs.so.1"
                if link.is_symlink() or link.exists():
                    link.unlink()
                link.symlink_to(lib.resolve())
                tools["dropin"] = d
                tools["dropin_note"] = ""
                # The drop-in librdmacm.so.1 beside it (rping, ucmatose).
                log("cargo build --release -p softrdma-rdmacm")
                r = subprocess.run(["cargo", "build", "--release", "-q", "-p",
                                    "softrdma-rdmacm"], cwd=REPO)
                cm_lib = rel / "librdmacm.so"
                cm_link = d / "librdmacm.so.1"
                if cm_link.is_symlink() or cm_link.exists():
                    cm_link.unlink()
                if r.returncode == 0 and cm_lib.exists():
                    cm_link.symlink_to(cm_lib.resolve())
    # The IB CM example that speaks rdma_server/rdma_client's exchange.
    log("cargo build --release -p softrdma --example cm_ping")
    run(["cargo", "build", "--release", "-q", "-p", "softrdma", "--example", "cm_ping"],
        cwd=REPO)
    tools["cm_ping"] = target_dir() / "release/examples/cm_ping"
    # `softrdma perf`, once the CLI has it.
    helptext = subprocess.run([str(tools["softrdma"]), "--help"], capture_output=True,
                              text=True).stdout
    tools["perf"] = bool(re.search(r"^\s+perf\b", helptext, re.M))
    return tools


# --------------------------------------------------------------------------
# Network namespace


CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def setns(fd):
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise Fail(f"setns: {os.strerror(e)}")


class Netns:
    def __init__(self):
        self.name = f"srx-interop-{os.getpid()}"
        self.orig = None
        self.made = False

    def exec(self, cmd):
        return ["ip", "netns", "exec", self.name] + list(cmd)

    def up(self):
        run(["ip", "netns", "add", self.name])
        self.made = True
        sh = f"""
            set -e
            ip link set lo up
            ip link add br0 type bridge
            ip link set br0 mtu {LINK_MTU}
            ip tuntap add dev tap0 mode tap
            ip link set tap0 mtu {LINK_MTU}
            ip link set tap0 master br0
            ip addr add {HOST_IP}/{PREFIX} dev br0
            ip link set tap0 up
            ip link set br0 up
        """
        run(self.exec(["sh", "-c", sh]))
        # This process joins the namespace too, to talk to the guest agent.
        self.orig = os.open("/proc/self/ns/net", os.O_RDONLY)
        fd = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
        setns(fd)
        os.close(fd)
        log(f"namespace {self.name}: br0 {HOST_IP}/{PREFIX} mtu {LINK_MTU}, tap0 for the guest")

    def down(self):
        if self.orig is not None:
            try:
                setns(self.orig)
            except Fail:
                pass
            os.close(self.orig)
            self.orig = None
        if self.made:
            subprocess.run(["ip", "netns", "del", self.name], check=False)
            self.made = False


# --------------------------------------------------------------------------
# The guest


class Guest:
    def __init__(self, ns: Netns, kdir: Path, initrd: Path, out: Path):
        self.ns, self.kdir, self.initrd, self.out = ns, kdir, initrd, out
        self.proc = None
        self.console = out / "guest-console.log"
        self.gidx = None
        self.info = ""

    def boot(self):
        if not shutil.which("qemu-system-x86_64"):
            raise Fail("qemu-system-x86_64 not found (package qemu-system-x86)")
        self.console.unlink(missing_ok=True)
        cmd = self.ns.exec([
            "qemu-system-x86_64", "-accel", "tcg", "-m", "1024", "-smp", "1",
            "-display", "none", "-monitor", "none", "-no-reboot",
            "-serial", f"file:{self.console}",
            "-kernel", str(self.kdir / "vmlinuz"), "-initrd", str(self.initrd),
            "-append", f"console=ttyS0 quiet panic=-1 srx.ip={GUEST_IP}/{PREFIX} "
                       f"srx.mtu={LINK_MTU}",
            "-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
            "-device", "virtio-net-pci,netdev=n0,mac=52:54:00:5e:91:02",
        ])
        qlog = open(self.out / "qemu.log", "wb")
        t = time.monotonic()
        self.proc = spawn(cmd, stdin=subprocess.DEVNULL, stdout=qlog, stderr=subprocess.STDOUT)
        log(f"qemu started (pid {self.proc.pid}, TCG, 1 vCPU, 1 GiB)")
        while True:
            text = self.console.read_text(errors="replace") if self.console.exists() else ""
            m = re.search(r"srx-guest: READY (.*)", text)
            if m:
                self.info = m.group(1).strip()
                g = re.search(r"gidx=(-?\d+)", self.info)
                self.gidx = int(g.group(1)) if g else -1
                break
            if self.proc.poll() is not None:
                raise Fail("the guest could not boot: qemu exited with status "
                           f"{self.proc.returncode}\n{self.tail()}\nqemu.log: "
                           f"{(self.out / 'qemu.log').read_text(errors='replace')[-2000:]}")
            if "FATAL" in text or "Kernel panic" in text:
                raise Fail(f"the guest could not boot:\n{self.tail()}")
            if time.monotonic() - t > BOOT_TIMEOUT:
                raise Fail(f"the guest did not boot within {BOOT_TIMEOUT:.0f} s (TCG too slow "
                           f"or stuck?)\n{self.tail()}")
            time.sleep(0.2)
        boot_s = time.monotonic() - t
        if self.gidx is None or self.gidx < 0:
            raise Fail(f"rxe0 has no RoCE v2 GID for {GUEST_IP}:\n{self.tail()}")
        # The agent listens right after READY is printed.
        deadline = time.monotonic() + 30
        while True:
            try:
                rc, _ = self.run("true", timeout=10)
                if rc == 0:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise Fail(f"the guest agent on {GUEST_IP}:{AGENT_PORT} does not answer\n"
                           f"{self.tail()}")
            time.sleep(0.3)
        log(f"guest ready in {boot_s:.1f} s: {self.info}")
        return boot_s

    def tail(self, n=40):
        if not self.console.exists():
            return "(no console output)"
        lines = self.console.read_text(errors="replace").splitlines()
        return "\n".join("  guest| " + l for l in lines[-n:])

    def _call(self, line, timeout):
        with socket.create_connection((GUEST_IP, AGENT_PORT), timeout=10) as s:
            s.settimeout(timeout)
            s.sendall(line.encode() + b"\n")
            chunks = []
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
        text = b"".join(chunks).decode(errors="replace")
        m = re.search(r"@@rc=(\d+)\s*$", text)
        if not m:
            raise OSError(f"agent answer without status: {text[-500:]!r}")
        return int(m.group(1)), text[:m.start()]

    @staticmethod
    def _b64(cmd):
        return base64.b64encode(cmd.encode()).decode()

    def run(self, cmd, timeout=60):
        return self._call(f"run {self._b64(cmd)}", timeout)

    def start(self, job, cmd):
        rc, out = self._call(f"start {job} {self._b64(cmd)}", 20)
        if rc:
            raise Fail(f"guest could not start {job}: {out}")

    def wait(self, job, secs):
        return self._call(f"wait {job} {int(secs)}", secs + 30)

    def poll(self, job):
        """(rc, output) once the job ended, None while it runs."""
        with socket.create_connection((GUEST_IP, AGENT_PORT), timeout=10) as s:
            s.settimeout(30)
            s.sendall(f"poll {job}\n".encode())
            chunks = []
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
        text = b"".join(chunks).decode(errors="replace")
        if text.strip().endswith("@@running"):
            return None
        m = re.search(r"@@rc=(\d+)\s*$", text)
        if not m:
            raise OSError(f"agent answer without status: {text[-500:]!r}")
        return int(m.group(1)), text[:m.start()]

    def kill(self, job):
        self._call(f"kill {job}", 30)

    def listening(self, port):
        rc, out = self.run("netstat -ltn 2>/dev/null", timeout=20)
        return re.search(rf":{port}\s", out) is not None

    def cm_listening(self, port, secs):
        """True once an rdma_cm id listens on `port` in the guest (its
        kernel's `rdma res show cm_id`), False if none did within `secs`,
        None when the guest cannot list cm_ids."""
        t = time.monotonic()
        while True:
            rc, out = self.run("rdma res show cm_id 2>&1", timeout=20)
            if rc:
                return None
            if any("LISTEN" in l and re.search(rf":{port}\b", l) for l in out.splitlines()):
                return True
            if time.monotonic() - t > secs:
                return False
            time.sleep(0.2)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


# --------------------------------------------------------------------------
# Captures and ICRC checks


# The capture's canaries: UDP datagrams from the host to the guest's port
# 4790 (nothing listens there; the guest's ICMP answer is not UDP), which
# the capture filter also takes. One seen in the file proves tcpdump is
# capturing and writing before a case starts; one seen at the end proves
# it has written everything before it (the ring is read in order). They
# are removed from the file before any check reads it.
CANARY_PORT = 4790
CANARY_WAIT = 30  # seconds for a canary to show up (tcpdump starved of CPU)

# SRX_INTEROP_HOST_PORT=xdp puts the host's device on an AF_XDP socket on
# br0 (docs/xdp.md) instead of a UDP socket. tcpdump on br0 would not see
# the frames the XDP program takes, so the capture is then made on tap0,
# the bridge's port to the guest, which carries every frame both ways.
HOST_PORT = os.environ.get("SRX_INTEROP_HOST_PORT", "udp")
CAPTURE_IFACE = "tap0" if HOST_PORT == "xdp" else "br0"


class Capture:
    def __init__(self, ns: Netns, path: Path):
        self.path = path
        self.err = Path(str(path) + ".tcpdump.log")
        self.problem = ""
        path.unlink(missing_ok=True)
        # -Z root: Debian's tcpdump would drop to user tcpdump before opening the file.
        self.proc = spawn(
            ns.exec(["tcpdump", "-i", CAPTURE_IFACE, "-n", "-s", "2048", "-U", "--immediate-mode", "-B", "16384",
                     "-Z", "root",
                     "-w", str(path), f"udp port 4791 or udp dst port {CANARY_PORT}"]),
            stdout=subprocess.DEVNULL, stderr=open(self.err, "wb"))
        t = time.monotonic()
        while "listening on" not in self.err.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() - t > 15:
                raise Fail(f"tcpdump did not start: {self.err.read_text(errors='replace')}")
            time.sleep(0.05)
        if not self._canary_seen(0):
            self.problem = (f"capture not proven running: no canary in {CANARY_WAIT} s "
                            "after tcpdump said it was listening")

    def _canary_seen(self, before):
        """Sends canaries until the file holds more than `before` of them."""
        t = time.monotonic()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((HOST_IP, 0))
            while time.monotonic() - t < CANARY_WAIT:
                s.sendto(b"softrdma interop capture canary", (GUEST_IP, CANARY_PORT))
                end = time.monotonic() + 0.25
                while time.monotonic() < end:
                    if sum(1 for f in pcap_records(self.path) if is_canary(f)) > before:
                        return True
                    if self.proc.poll() is not None:
                        return False
                    time.sleep(0.02)
        return False

    def stop(self):
        # tcpdump does not drain its socket buffer on SIGINT: wait until it
        # wrote a canary sent after the case's last packet (then it wrote
        # every packet before it), else until the file stops growing.
        seen = sum(1 for f in pcap_records(self.path) if is_canary(f))
        if self.problem or self.proc.poll() is not None or not self._canary_seen(seen):
            last, still, t = -1, 0, time.monotonic()
            while still < 4 and time.monotonic() - t < 20:
                time.sleep(0.15)
                size = self.path.stat().st_size if self.path.exists() else 0
                still = still + 1 if size == last else 0
                last = size
            if not self.problem:
                self.problem = "the capture's closing canary never showed up"
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        strip_canaries(self.path)

    def complete(self):
        """'' when tcpdump wrote every packet its filter took, else why not."""
        if self.problem:
            return self.problem
        text = self.err.read_text(errors="replace")
        cap = re.search(r"(\d+) packets? captured", text)
        rec = re.search(r"(\d+) packets? received by filter", text)
        drop = re.search(r"(\d+) packets? dropped by kernel", text)
        if not (cap and rec and drop):
            return "tcpdump printed no statistics"
        if int(drop.group(1)) or int(cap.group(1)) != int(rec.group(1)):
            return (f"capture incomplete: tcpdump captured {cap.group(1)} of "
                    f"{rec.group(1)} packets, {drop.group(1)} dropped by the kernel")
        return ""


def pcap_records(path: Path):
    """The frames of a classic pcap (a file still being written: whole
    records only)."""
    data = path.read_bytes() if path.exists() else b""
    if len(data) < 24:
        return []
    e = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    off, res = 24, []
    while off + 16 <= len(data):
        incl = struct.unpack(e + "I", data[off + 8:off + 12])[0]
        if off + 16 + incl > len(data):
            break
        res.append(data[off + 16:off + 16 + incl])
        off += 16 + incl
    return res


def is_canary(fr: bytes) -> bool:
    """An Ethernet/IPv4/UDP frame to the canary port."""
    if len(fr) < 34 or fr[12:14] != b"\x08\x00" or fr[23] != 17:
        return False
    udp = 14 + (fr[14] & 0x0F) * 4
    return len(fr) >= udp + 4 and struct.unpack(">H", fr[udp + 2:udp + 4])[0] == CANARY_PORT


def strip_canaries(path: Path):
    """Rewrites the capture without its canary frames."""
    data = path.read_bytes() if path.exists() else b""
    if len(data) < 24:
        return
    e = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    out, off = [data[:24]], 24
    while off + 16 <= len(data):
        incl = struct.unpack(e + "I", data[off + 8:off + 12])[0]
        rec = data[off:off + 16 + incl]
        if not is_canary(rec[16:]):
            out.append(rec)
        off += 16 + incl
    path.write_bytes(b"".join(out))


def pcap_frames(path: Path):
    """(source IPv4, IP ID) of every frame of a classic pcap."""
    data = path.read_bytes() if path.exists() else b""
    if len(data) < 24:
        return []
    e = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    off, res = 24, []
    while off + 16 <= len(data):
        incl = struct.unpack(e + "I", data[off + 8:off + 12])[0]
        fr = data[off + 16:off + 16 + incl]
        off += 16 + incl
        if len(fr) >= 34 and fr[12:14] == b"\x08\x00":
            res.append((socket.inet_ntoa(fr[26:30]), struct.unpack(">H", fr[18:20])[0]))
        else:
            res.append(("?", 0))
    return res


def icrc_check(tools, pcap: Path):
    """Returns (ok, frames, from_host, from_guest, note)."""
    frames = pcap_frames(pcap)
    n = len(frames)
    fh = sum(1 for s, _ in frames if s == HOST_IP)
    fg = sum(1 for s, _ in frames if s == GUEST_IP)
    d = subprocess.run([str(tools["softrdma"]), "decode", str(pcap)], capture_output=True,
                       text=True)
    Path(str(pcap) + ".decode.txt").write_text(d.stdout + d.stderr)
    m = re.search(r"(\d+) RoCEv2 frames: (\d+) ICRC ok, (\d+) ICRC bad, (\d+) malformed",
                  d.stdout + d.stderr)
    notes = []
    ok = True
    if d.returncode != 0 or not m:
        ok = False
        notes.append(f"softrdma decode exit {d.returncode}"
                     + (f" ({m.group(3)} bad, {m.group(4)} malformed)" if m else ""))
    elif int(m.group(2)) != n:
        ok = False
        notes.append(f"softrdma decode saw {m.group(1)} RoCE frames of {n}")
    py = REPO.parent / "shared/tools/icrc-check.py"
    if py.exists():
        r = subprocess.run([sys.executable, str(py), str(pcap)], capture_output=True, text=True)
        Path(str(pcap) + ".icrc-check.txt").write_text(r.stdout + r.stderr)
        m2 = re.search(r": (\d+) ok, (\d+) bad\s*$", r.stdout)
        if not m2 or int(m2.group(2)) or int(m2.group(1)) != n:
            ok = False
            notes.append("icrc-check.py: " + (f"{m2.group(1)} ok, {m2.group(2)} bad of {n}"
                                               if m2 else f"no summary (exit {r.returncode})"))
    else:
        notes.append("icrc-check.py not found: only softrdma decode checked")
    return ok, n, fh, fg, "; ".join(notes)


# --------------------------------------------------------------------------
# Test cases


# The QP's ACK timeout exponent (perftest's -u, the peer's too), on both
# sides of every case: 4.096 µs x 2^18 = 1.07 s per try. The default (14:
# 67 ms) times 8 tries is less than a TCG guest on a busy host can stall;
# such stalls failed runs with RETRY_EXC_ERR while the guest's ACKs were
# still on their way (peer-send_lat-4096-hostsrv: the host peer gave up
# after 8 timeouts). The retry counts are the most the verbs allow (7, and
# RNR retry 7 = unbounded; perftest's and the peer's). Cases with injected
# loss use 16 (268 ms, 2.1 s over 8 tries): a lost tail packet then costs a
# quarter second, not a whole one.
QP_TIMEOUT = "18"
LOSSY_QP_TIMEOUT = "16"


SOFTRDMA_ECE_VENDOR = 0x535201  # softrdma_engine::Ece::SOFTRDMA_VENDOR
SR_OPTION = 1  # softrdma_engine::Ece::SELECTIVE_REPEAT
CM_REQ, CM_REP = 0x0010, 0x0013  # CM attribute IDs


def roce_packets(pcap: Path):
    """(source IPv4, the RoCEv2 packet from its BTH on) of every UDP/4791 frame."""
    res = []
    for fr in pcap_records(pcap):
        if len(fr) < 34 or fr[12:14] != b"\x08\x00" or fr[23] != 17:
            continue
        udp = 14 + (fr[14] & 0x0F) * 4
        if len(fr) >= udp + 8 and struct.unpack(">H", fr[udp + 2:udp + 4])[0] == 4791:
            res.append((socket.inet_ntoa(fr[26:30]), fr[udp + 8:]))
    return res


def ece_check(case, pcap: Path):
    """Problems with a case whose host offers selective repeat to rxe: the
    host's REQ must offer softrdma's ECE vendor (when it connects), rxe's
    REP must agree to no option, and no ACK may carry anything past its AETH
    (a SACK extension): go-back-N, as between any two standard ends. The
    capture must also show loss being recovered (the host's NAKs or rxe's
    resends), or the case tested nothing."""
    problems, offered, answered, acks, naks, resent = [], None, None, 0, 0, 0
    seen = set()
    for src, p in roce_packets(pcap):
        opcode, dqpn = p[0], int.from_bytes(p[5:8], "big")
        if src != HOST_IP and opcode < 0x11 and dqpn != 1:
            # An RC request or READ response from rxe: its PSN again is a resend.
            key = (dqpn, int.from_bytes(p[9:12], "big"))
            resent += key in seen
            seen.add(key)
        if opcode == 0x64 and dqpn == 1 and len(p) >= 20 + 48:
            mad = p[20:]  # after BTH and DETH
            attr = struct.unpack(">H", mad[16:18])[0]
            if attr == CM_REQ:
                vendor = int.from_bytes(mad[29:32], "big")
                if src == HOST_IP:
                    offered = vendor
                elif vendor:
                    problems.append(f"rxe's REQ offers ECE vendor {vendor:#x}")
            elif attr == CM_REP and src != HOST_IP:
                # The vendor, and the options it agrees to (AttributeModifier).
                answered = ((mad[39] << 16) | (mad[43] << 8) | mad[47],
                            struct.unpack(">I", mad[20:24])[0])
        elif opcode == 0x11 and src == HOST_IP:
            acks += 1
            naks += len(p) >= 16 and p[12] >> 5 == 0b011  # AETH syndrome: a NAK
            if len(p) != 12 + 4 + 4:
                problems.append(f"an ACK from the host is {len(p)} bytes long, not 20 "
                                "(BTH, AETH, ICRC): an extension on a go-back-N QP")
                break
    if case.server == "guest":
        if offered != SOFTRDMA_ECE_VENDOR:
            problems.append(f"the host's REQ offered ECE vendor {offered!r}, "
                            f"not softrdma's {SOFTRDMA_ECE_VENDOR:#x}")
        # rxe's side echoes the vendor with no option set (its librdmacm
        # answers with the REQ's vendor): nothing is agreed.
        if answered is None:
            problems.append("no REP from rxe in the capture")
        elif answered[1] & SR_OPTION:
            problems.append(f"rxe's REP agreed to options {answered[1]:#x} of vendor "
                            f"{answered[0]:#x}")
    if acks == 0:
        problems.append("no ACK from the host in the capture")
    if naks + resent == 0:
        problems.append("no loss recovery in the capture (no NAK from the host, "
                        "nothing resent by rxe): the case did not test loss")
    def hexes(v):
        return "none seen" if v is None else (f"{v:#x}" if isinstance(v, int) else
                                              "/".join(f"{x:#x}" for x in v))
    log(f"ECE {case.id}: the host's REQ offered {hexes(offered)}, rxe's REP answered {hexes(answered)}, {acks} ACKs "
        f"from the host ({naks} NAKs), {resent} packets resent by rxe")
    return problems


def perftest_args(tool, size, extra, lossy=False):
    iters = BW_ITERS if tool.endswith("_bw") else ITERS
    a = ["-F", "-n", str(iters), "-u", LOSSY_QP_TIMEOUT if lossy else QP_TIMEOUT]
    if tool != "ib_atomic_lat":
        a += ["-s", str(size)]
    return a + list(extra), iters


def lossy(case):
    return bool(case.env.get("SOFTRDMA_FAULT"))


class Case:
    def __init__(self, cid, tool, server, impl, size, extra=(), env=None, note="", count=10):
        self.id, self.tool, self.server, self.impl = cid, tool, server, impl
        self.size, self.extra, self.env, self.note = size, list(extra), env or {}, note
        self.count = count
        self.status, self.metric, self.detail = "", "", ""
        self.frames = self.fh = self.fg = 0
        self.guest_dead = False
        self.secs = 0.0
        self.icrc = ""

    @property
    def direction(self):
        return "guest server ← host client" if self.server == "guest" else \
            "host server ← guest client"


def build_cases(tools):
    cases = []
    perf = [
        ("ib_send_lat", [], [512, 4096]),
        ("ib_write_lat", [], [512, 4096]),
        ("ib_write_bw", [], [512, 4096]),
        ("ib_read_lat", [], [512, 4096]),
        ("ib_read_bw", [], [512, 4096]),
        ("ib_atomic_lat", ["-A", "FETCH_AND_ADD"], [8]),
        ("ib_atomic_lat", ["-A", "CMP_AND_SWAP"], [8]),
    ]
    for impl in ["peer", "dropin"]:
        for tool, extra, sizes in perf:
            for size in sizes:
                for server in ["guest", "host"]:
                    tag = tool[3:] + ("" if not extra else "-" + extra[1].lower())
                    cases.append(Case(f"{impl}-{tag}-{size}-{server}srv", tool, server, impl,
                                      size, extra))
    for tool, sizes in [("ibv_rc_pingpong", [512, 4096]), ("ibv_ud_pingpong", [512])]:
        for size in sizes:
            for server in ["guest", "host"]:
                cases.append(Case(f"dropin-{tool[4:]}-{size}-{server}srv", tool, server,
                                  "dropin", size))
    # Memory windows (both types): the guest or the host binds, the other
    # WRITEs through the window and invalidates it (SEND with invalidate
    # for type 2, an unbind for type 1), then gets REM_ACCESS_ERR.
    for t in ["1", "2"]:
        for server in ["guest", "host"]:
            cases.append(Case(f"dropin-mw_pingpong-type{t}-4096-{server}srv", "ibv_mw_pingpong",
                              server, "dropin", 4096, ["-t", t]))
    # softrdma perf against a guest perftest: its exchange is its own line
    # protocol, so it cannot pair with perftest (see docs/interop.md).
    cases.append(Case("cli-write_lat-512-guestsrv", "ib_write_lat", "guest", "cli", 512))
    # Loss: softrdma drops 1% of what it receives; rxe must recover.
    loss = {"SOFTRDMA_FAULT": "loss=0.01,seed=1"}
    for impl in ["peer", "dropin"]:
        for server in ["host", "guest"]:
            cases.append(Case(f"{impl}-write_bw-loss1%-4096-{server}srv", "ib_write_bw",
                              server, impl, 4096, env=loss, note="SOFTRDMA_FAULT loss=0.01"))
    # The connection manager against the kernel's rdma_cm: rdma-core's
    # rdma_server / rdma_client examples against softrdma's cm_ping.
    cases.append(Case("cm-rdma_server-guestsrv", "rdma_server", "guest", "cm", 16))
    cases.append(Case("cm-rdma_client-hostsrv", "rdma_client", "host", "cm", 16))
    # Debian's rping on the drop-in libibverbs + librdmacm against the
    # guest's rping over the kernel's rdma_cm: 10 validated pings each way.
    for server in ["guest", "host"]:
        cases.append(Case(f"dropin-rping-4000-{server}srv", "rping", server, "dropin", 4000))
        # ucmatose: 2 connections, 10 messages each way on each.
        cases.append(Case(f"dropin-ucmatose-{server}srv", "ucmatose", server, "dropin", 100))
        # rstream: rsockets (drop-in) against rdma-core's rsockets over the
        # kernel's rdma_cm: 100 transfers of 4 KiB each way, every byte
        # checked by rstream (-T v).
        cases.append(Case(f"dropin-rstream-4096-{server}srv", "rstream", server, "dropin", 4096))
        # riostream: riomap/riowrite (RDMA WRITEs into the peer's mapped
        # buffer, announced with an IOMAP message), 20 transfers of 10,000
        # bytes a round, 2 rounds, checked (-T v).
        cases.append(Case(f"dropin-riostream-10000-{server}srv", "riostream", server, "dropin",
                          10000))
    # Selective repeat offered to rxe, negotiated down: the host's drop-in
    # offers its ECE (SOFTRDMA_CM_ECE=1) and drops 5 % of what it receives;
    # rxe has no ECE, so the QPs must run go-back-N, byte for byte the
    # standard wire (ece_check reads the capture).
    ece = {"SOFTRDMA_CM_ECE": "1", "SOFTRDMA_FAULT": "loss=0.05,seed=3"}
    for server in ["guest", "host"]:
        cases.append(Case(f"dropin-rping-ece-loss5%-4000-{server}srv", "rping", server, "dropin",
                          4000, env=ece, note="SOFTRDMA_CM_ECE=1, SOFTRDMA_FAULT loss=0.05",
                          count=100))
    # perftest connecting its QPs with rdma_cm, softrdma serving: perftest's
    # client sends its second REQ (the test QP's) right after the control
    # connection's last exchange; a TCG guest serving has not re-created its
    # listener by then and its kernel answers REJ 8 (invalid service ID).
    # perftest then retries, but Debian's 4.5+0.17 retries with the CM ids
    # it has just destroyed and aborts in a double free (upstream fixed it
    # in 3d9d8d0, 2025-12): that direction is not run (docs/interop.md).
    cases.append(Case("dropin-write_lat-rdma_cm-512-hostsrv", "ib_write_lat", "host",
                      "dropin", 512, ["-R"]))
    # The probe goes first: softrdma as responder and requester, both ways.
    probe = next(c for c in cases if c.id == "peer-write_lat-512-hostsrv")
    cases.remove(probe)
    cases.insert(0, probe)
    only = os.environ.get("SRX_INTEROP_ONLY")
    if only:
        cases = [c for c in cases if re.search(only, c.id)]
    return cases


def host_env():
    env = dict(os.environ)
    env["SOFTRDMA_DEVICES"] = f"srx0={HOST_IP}" + ("@xdp:br0" if HOST_PORT == "xdp" else "")
    env["SOFTRDMA_TRANSPORT"] = "udp"  # the peer is another host: no same-host path
    env.pop("SOFTRDMA_FAULT", None)
    env.pop("SOFTRDMA_CAPTURE", None)
    return env


def host_command(case, tools, port, gidx_unused=None):
    """The host-side command of a case, or a string saying why it cannot run."""
    client = [] if case.server == "host" else [GUEST_IP]
    prefix = os.environ.get(f"SRX_RUNNER_{case.impl.upper()}", "").split()
    if case.impl == "peer":
        test = case.tool[3:]
        a = [str(tools["peer"]), "perftest", test, "-p", str(port)]
        a += ["--server"] if case.server == "host" else ["--client", GUEST_IP]
        if case.tool != "ib_atomic_lat":
            a += ["-s", str(case.size)]
        a += ["-n", str(BW_ITERS if case.tool.endswith("_bw") else ITERS)] + case.extra
        a += ["-u", LOSSY_QP_TIMEOUT if lossy(case) else QP_TIMEOUT]
        return prefix + a
    if case.impl == "dropin":
        if tools["dropin"] is None and not prefix:
            return tools["dropin_note"]
        pre = prefix or ["env", f"LD_LIBRARY_PATH={tools['dropin']}"]
        if case.tool == "rping":
            side = ["-s"] if case.server == "host" else ["-c", "-a", GUEST_IP]
            return pre + ["rping"] + side + rping_args(case, port)
        if case.tool == "ucmatose":
            side = [] if case.server == "host" else ["-s", GUEST_IP]
            return pre + ["ucmatose"] + side + ucmatose_args(case, port)
        if case.tool in ("rstream", "riostream"):
            side = [] if case.server == "host" else ["-s", GUEST_IP]
            return pre + [case.tool] + side + rstream_args(case, port)
        if case.tool.startswith("ibv_"):
            tool = str(tools["mw_pingpong"]) if case.tool == "ibv_mw_pingpong" else case.tool
            a = [tool, "-d", "srx0", "-g", "0", "-p", str(port), "-n", str(ITERS),
                 "-s", str(case.size), "-c"] + case.extra
        else:
            a = [case.tool, "-d", "srx0", "-x", "0", "-p", str(port)]
            a += perftest_args(case.tool, case.size, case.extra, lossy(case))[0]
        return pre + a + client
    if case.impl == "cm":
        a = [str(tools["cm_ping"])]
        a += ["server"] if case.server == "host" else ["client", GUEST_IP]
        return prefix + a + ["-p", str(port)]
    if case.impl == "cli":
        if not prefix:
            if not tools["perf"]:
                return "pending: `softrdma perf` not in the CLI yet"
            return ("n/a: `softrdma perf` exchanges QP data as softrdma-conn/1 text lines, "
                    "perftest as its binary/108-byte records: they cannot pair")
        return prefix + [case.tool[3:], "-p", str(port), "-s", str(case.size)] + client
    return f"fail: unknown implementation {case.impl}"


def rping_args(case, port):
    """rping's options on both sides: the port, the case's count of pings (10) of its size,
    verbose, validated."""
    return ["-p", str(port), "-C", str(case.count), "-S", str(case.size), "-v", "-V"]


def ucmatose_args(case, port):
    """ucmatose's options on both sides: the port, 2 connections, 10 messages of the case's size."""
    return ["-p", str(port), "-c", "2", "-C", "10", "-S", str(case.size)]


def rstream_args(case, port):
    """rstream's (and riostream's) options on both sides: the port, 100 transfers of the
    case's size (riostream: 20 a round, 2 rounds), verified."""
    if case.tool == "riostream":
        return ["-p", str(port), "-S", str(case.size), "-C", "20", "-I", "2", "-T", "v"]
    return ["-p", str(port), "-S", str(case.size), "-C", "100", "-T", "v"]


def rdma_cm_only(case):
    """Programs that listen through rdma_cm, on no TCP port."""
    return (case.impl == "cm" or case.tool in ("rping", "ucmatose", "rstream", "riostream")
            or "-R" in case.extra)


def guest_command(case, gidx, port):
    client = "" if case.server == "guest" else f" {HOST_IP}"
    if case.tool == "rping":
        side = "-s" if case.server == "guest" else f"-c -a {HOST_IP}"
        return f"rping {side} {' '.join(rping_args(case, port))}"
    if case.tool == "ucmatose":
        side = "" if case.server == "guest" else f"-s {HOST_IP} "
        return f"ucmatose {side}{' '.join(ucmatose_args(case, port))}"
    if case.tool in ("rstream", "riostream"):
        side = "" if case.server == "guest" else f"-s {HOST_IP} "
        return f"{case.tool} {side}{' '.join(rstream_args(case, port))}"
    if case.impl == "cm":
        return (f"rdma_server -p {port}" if case.server == "guest"
                else f"rdma_client -s {HOST_IP} -p {port}")
    if case.tool.startswith("ibv_"):
        extra = "".join(f" {x}" for x in case.extra)
        if case.tool == "ibv_mw_pingpong":
            # rxe passes the kernel's wc_flags through: its "with
            # invalidate" is IB_WC_WITH_INVALIDATE (1 << 2), which
            # libibverbs numbers IBV_WC_IP_CSUM_OK (docs/interop.md).
            extra += " -k"
        return (f"{case.tool} -d rxe0 -g {gidx} -p {port} -n {ITERS} -s {case.size} -c"
                f"{extra}{client}")
    args, _ = perftest_args(case.tool, case.size, case.extra, lossy(case))
    if case.tool in ("ib_read_lat", "ib_read_bw", "ib_atomic_lat"):
        # perftest sets max_rd_atomic to the out_reads the peer advertised:
        # rxe's 128 exceeds softrdma's max_qp_init_rd_atom (16) and the
        # host's modify to RTS fails (as it would on hardware with 16).
        args.append(f"-o {RXE_OUT_READS}")
    return f"{case.tool} -d rxe0 -x {gidx} -p {port} {' '.join(args)}{client}"


def parse_metric(case, text):
    """Latency (µs, typical) or bandwidth (MB/s, average) from a tool's output."""
    m = re.search(r"RESULT status=ok .*?t_typical_us=([\d.]+)", text)
    if m:
        return f"{float(m.group(1)):.2f} µs"
    m = re.search(r"RESULT status=ok .*?bw_avg_MBps=([\d.]+)", text)
    if m:
        return f"{float(m.group(1)):.2f} MB/s"
    m = re.search(r"^\s*#bytes\s+#iterations\s+(.*)$\n\s*(\d.*)$", text, re.M)
    if m:
        hdr, vals = m.group(1).split(), m.group(2).split()
        if hdr and hdr[0].startswith("t_min"):
            # bytes iters t_min t_max t_typical ...
            if len(vals) >= 5:
                return f"{float(vals[4]):.2f} µs"
        elif len(vals) >= 4:
            return f"{float(vals[3]):.2f} MB/s"
    m = re.search(r"([\d.]+) usec/iter", text)
    if m:
        return f"{float(m.group(1)):.2f} µs/iter"
    return ""


# How long a guest rdma_cm server is given to start listening.
CM_SERVER_START_SECS = 3


def wait_log_line(path, word, proc, secs=LISTEN_TIMEOUT):
    """True once the host program `proc` printed `word` into `path`."""
    t = time.monotonic()
    while time.monotonic() - t < secs:
        if proc.poll() is not None:
            return False
        if path.exists() and word in path.read_text(errors="replace"):
            return True
        time.sleep(0.1)
    return False


def wait_host_listen(ns, port, proc, secs=LISTEN_TIMEOUT):
    t = time.monotonic()
    while time.monotonic() - t < secs:
        if proc.poll() is not None:
            return False
        r = subprocess.run(ns.exec(["ss", "-Hltn", f"sport = :{port}"]), capture_output=True,
                           text=True)
        if f":{port}" in r.stdout:
            return True
        time.sleep(0.1)
    return False


def load_known_issues():
    """interop/rxe/known-issues.txt: `name: description` lines of open
    softrdma bugs that the harness recognises by their signature."""
    known = {}
    f = HERE / "known-issues.txt"
    if f.exists():
        for line in f.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#") and ":" in line:
                k, v = line.split(":", 1)
                known[k.strip()] = v.strip()
    return known


KNOWN = load_known_issues()


def known_issue(case, pcap, host_text):
    """The name of a listed known issue this failure shows the signature of."""
    if "rxe-ip-id" in KNOWN:
        # rxe sends IPv4 with DF and a non-zero IP ID (it calls
        # __ip_select_ident); softrdma's ICRC check assumes ID 0, so it drops
        # every rxe packet as an ICRC error although the wire ICRC is right.
        nonzero = sum(1 for s, ipid in pcap_frames(pcap) if s == GUEST_IP and ipid)
        m = re.search(r"\bicrc_errors=(\d+)", host_text)
        if nonzero and (m is None or int(m.group(1)) > 0):
            return "rxe-ip-id"
    return None


def run_case(case, tools, ns, guest, out, port):
    hcmd = host_command(case, tools, port)
    if isinstance(hcmd, str):
        case.status = hcmd.split(":")[0]
        case.detail = hcmd
        return
    gcmd = guest_command(case, guest.gidx, port)
    env = host_env()
    env.update(case.env)
    hlog = out / f"{case.id}.host.log"
    glog = out / f"{case.id}.guest.log"
    (out / f"{case.id}.cmd.txt").write_text(
        f"host : {' '.join(hcmd)}\n       env {case.env or ''} SOFTRDMA_DEVICES={env['SOFTRDMA_DEVICES']}\n"
        f"guest: {gcmd}\n")
    cap = Capture(ns, out / f"{case.id}.pcap")
    t = time.monotonic()
    hproc = None
    problems = []
    job = case.id.replace("%", "pc")
    hrc, grc, gout = 0, 0, ""
    try:
        if case.server == "guest" and rdma_cm_only(case):
            # rdma_cm listens on no TCP port: wait until the guest's kernel
            # lists the listening cm_id (`rdma res show cm_id`), or, where it
            # cannot say, give it the time to start (perftest measures the
            # CPU clock first: seconds under TCG).
            guest.start(job, gcmd)
            listened = guest.cm_listening(port, LISTEN_TIMEOUT)
            if listened is None:
                time.sleep(CM_SERVER_START_SECS * (3 if case.tool.startswith("ib_") else 1))
            elif not listened:
                problems.append("guest rdma_cm server never listened")
            hproc = spawn(ns.exec(hcmd), env=env, stdout=open(hlog, "wb"),
                          stderr=subprocess.STDOUT)
        elif case.server == "guest":
            guest.start(job, gcmd)
            t1 = time.monotonic()
            while not guest.listening(port):
                if time.monotonic() - t1 > LISTEN_TIMEOUT:
                    problems.append("guest server never listened")
                    break
                time.sleep(0.2)
            hproc = spawn(ns.exec(hcmd), env=env, stdout=open(hlog, "wb"),
                          stderr=subprocess.STDOUT)
        else:
            hproc = spawn(ns.exec(hcmd), env=env, stdout=open(hlog, "wb"),
                          stderr=subprocess.STDOUT)
            if case.impl == "cm":
                ready = wait_log_line(hlog, "listening", hproc)
            elif rdma_cm_only(case):
                time.sleep(CM_SERVER_START_SECS)  # rping -s prints nothing until a client comes
                ready = hproc.poll() is None
            else:
                ready = wait_host_listen(ns, port, hproc)
            if not ready:
                problems.append("host server never listened")
            guest.start(job, gcmd)
        # Wait for both; once one side failed, give the other 5 s.
        deadline = time.monotonic() + CASE_TIMEOUT
        hres = gres = None
        while hres is None or gres is None:
            if hres is None and hproc.poll() is not None:
                hres = hproc.returncode
                if hres:
                    deadline = min(deadline, time.monotonic() + 5)
            if gres is None:
                gres = guest.poll(job)
                if gres is not None and gres[0]:
                    deadline = min(deadline, time.monotonic() + 5)
            if hres is not None and gres is not None:
                break
            if time.monotonic() > deadline:
                if hres is None:
                    os.killpg(hproc.pid, signal.SIGKILL)
                    hproc.wait()
                    hres = 124
                if gres is None:
                    guest.kill(job)
                    gres = (124, guest.run(f"cat /tmp/jobs/{job}.out", timeout=30)[1])
                break
            time.sleep(0.3)
        hrc, (grc, gout) = hres, gres
    except OSError as e:
        # The guest stopped answering (hung or crashed): the case fails and
        # the guest is rebooted before the next one.
        problems.append(f"guest agent unresponsive ({e}); guest will be rebooted")
        case.guest_dead = True
    finally:
        if hproc and hproc.poll() is None:
            os.killpg(hproc.pid, signal.SIGKILL)
            hproc.wait()
        cap.stop()
    case.secs = time.monotonic() - t
    glog.write_text(gout)
    htext = hlog.read_text(errors="replace")
    if hrc:
        problems.append(f"host exit {hrc}" + (" (timeout)" if hrc == 124 else ""))
    if grc:
        problems.append(f"guest exit {grc}" + (" (timeout)" if grc == 124 else ""))
    incomplete = cap.complete()
    if incomplete:
        problems.append(incomplete)
    ok, n, fh, fg, note = icrc_check(tools, cap.path)
    case.frames, case.fh, case.fg = n, fh, fg
    case.icrc = "ok" if ok else "BAD"
    if not ok:
        problems.append("ICRC/decode: " + note)
    elif note:
        case.note = (case.note + "; " if case.note else "") + note
    if n == 0 or fh == 0 or fg == 0:
        problems.append(f"capture has {fh} frames from the host and {fg} from the guest")
    client_text, server_text = (htext, gout) if case.server == "guest" else (gout, htext)
    case.metric = parse_metric(case, client_text) or parse_metric(case, server_text)
    if case.env.get("SOFTRDMA_FAULT"):
        m = re.search(r"faults_injected=(\d+)", htext)
        if m:
            case.note += f"; {m.group(1)} packets dropped by softrdma"
            if int(m.group(1)) == 0 and n > 200:
                problems.append("loss case injected no loss")
    if case.env.get("SOFTRDMA_CM_ECE"):
        problems += ece_check(case, cap.path)
    k = known_issue(case, cap.path, htext) if problems else None
    if problems and k and not STRICT:
        case.status = "known"
        case.detail = f"known issue {k}: " + "; ".join(problems)
    elif problems:
        case.status = "FAIL"
        case.detail = "; ".join(problems)
    else:
        case.status = "ok"


def guest_selftest(guest, out):
    """rxe inside the guest talking to itself: proves the guest side alone."""
    results = []
    g = guest.gidx
    rc, o = guest.run("ibv_devinfo -d rxe0 -v", timeout=30)
    (out / "guest-ibv_devinfo.txt").write_text(o)
    ok = rc == 0 and "PORT_ACTIVE" in o
    results.append(("guest ibv_devinfo rxe0", ok, "PORT_ACTIVE" if ok else f"rc={rc}"))
    tests = [
        ("guest rxe loopback ibv_rc_pingpong -c",
         f"ibv_rc_pingpong -d rxe0 -g {g} -p 18600 -n 100 -s 4096 -c",
         f"ibv_rc_pingpong -d rxe0 -g {g} -p 18600 -n 100 -s 4096 -c 127.0.0.1"),
        ("guest rxe loopback ib_write_bw",
         f"ib_write_bw -d rxe0 -x {g} -F -p 18601 -n 200 -s 4096",
         f"ib_write_bw -d rxe0 -x {g} -F -p 18601 -n 200 -s 4096 127.0.0.1"),
    ]
    for name, srv, cli in tests:
        guest.start("self-srv", srv)
        time.sleep(1.0)
        rc, o = guest.run(cli, timeout=90)
        src, so = guest.wait("self-srv", 30)
        (out / f"guest-self-{name.split()[-2] if 'pingpong' in name else 'write_bw'}.txt"
         ).write_text(o + "\n--- server ---\n" + so)
        metric = parse_metric(None, o) if rc == 0 else ""
        results.append((name, rc == 0 and src == 0, metric or f"client rc={rc} server rc={src}"))
    return results


# How long the guest's kernel CM is watched dialling the host: its first
# REQ (or SIDR_REQ) goes at once, retries after rdma_cm's CM response
# timeout (4.096 µs * 2^20, about 4.3 s, doubled per retry by ib_cm).
CM_CAPTURE_SECS = 14


def capture_kernel_cm(ns, guest, out):
    """The guest's kernel CM dialling the host, where nothing listens: the
    REQs of `rping -c` (RC, the TCP port space) and the SIDR_REQs of
    `udaddy` (UD) exactly as Linux builds them. The pcap is the wire
    crate's fixture (crates/softrdma-wire/tests/fixtures/linux-cm.pcap,
    tests/kernel_cm.rs)."""
    cap = Capture(ns, out / "linux-cm.pcap")
    guest.start("rping", f"rping -c -a {HOST_IP} -p 7174 -C 1 -v")
    guest.start("udaddy", f"udaddy -s {HOST_IP} -c 1")  # port 7174, the UDP port space
    time.sleep(CM_CAPTURE_SECS)
    for job in ("rping", "udaddy"):
        guest.kill(job)
        ended = guest.poll(job)
        (out / f"guest-{job}.txt").write_text(ended[1] if ended else "(still running)")
    cap.stop()
    frames = pcap_frames(cap.path)
    log(f"kernel CM capture: {len(frames)} frames in {cap.path} "
        f"({sum(1 for f in frames if f[0] == GUEST_IP)} from the guest) {cap.complete()}")
    if not any(f[0] == GUEST_IP for f in frames):
        raise Fail("the guest's kernel CM sent nothing")
    return cap.path


# --------------------------------------------------------------------------


def table(cases):
    rows = [("test", "host side", "direction", "size", "result", "latency / bandwidth",
             "frames h→g/g→h (ICRC)", "time")]
    for c in cases:
        name = c.tool + (" " + " ".join(c.extra) if c.extra else "")
        if c.env:
            name += " [" + ",".join(f"{v}" for v in c.env.values()) + "]"
        impl = {"peer": "Rust API peer", "dropin": "drop-in libibverbs",
                "cli": "softrdma perf", "cm": "cm_ping (IB CM)"}[c.impl]
        frames = f"{c.fh}/{c.fg} ({c.icrc})" if c.frames else "–"
        if c.status in ("ok", "FAIL"):
            res = c.status
        elif c.status == "known":
            res = "known bug " + c.detail.split(":")[0].split()[-1]
        elif c.status == "n/a":
            res = "n/a (exchange formats differ)"
        else:
            res = c.detail
        rows.append((name, impl, c.direction, str(c.size), res, c.metric or "–", frames,
                     f"{c.secs:.1f}s" if c.secs else "–"))
    return rows


def render(rows):
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, r in enumerate(rows):
        lines.append("  ".join(x.ljust(w[i]) for i, x in enumerate(r)).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w[i] for i in range(len(w))))
    return "\n".join(lines)


def markdown(rows):
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    for r in rows[1:]:
        out.append("| " + " | ".join(x.replace("|", "\\|") for x in r) + " |")
    return "\n".join(out)


def main():
    if os.geteuid() != 0:
        print("interop/rxe: needs root (network namespace, tap device, tcpdump)",
              file=sys.stderr)
        return 2
    cache = Path(os.environ.get("SRX_INTEROP_CACHE",
                                Path.home() / ".cache/softrdma-interop"))
    out = Path(os.environ.get("SRX_INTEROP_OUT", REPO / "target/interop-rxe"))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cache.mkdir(parents=True, exist_ok=True)

    ns = Netns()
    guest = None

    def cleanup(*_):
        if guest:
            guest.stop()
        end_children()
        ns.down()

    def on_signal(sig, _frame):
        cleanup()
        sys.exit(128 + sig)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    failed = False
    summary = {}
    try:
        kdir = ensure_kernel(cache)
        initrd = ensure_initramfs(cache, kdir)
        tools = build_host_tools()
        tools["mw_pingpong"] = build_mw_pingpong(cache)
        cases = build_cases(tools)
        ns.up()
        guest = Guest(ns, kdir, initrd, out)
        summary["boot_s"] = guest.boot()
        summary["guest"] = guest.info
        if "--capture-cm" in sys.argv[1:]:
            capture_kernel_cm(ns, guest, out)
            return 0
        self_results = guest_selftest(guest, out)
        for name, ok, detail in self_results:
            log(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
            failed |= not ok
        port = 18515
        blocked = None
        for c in cases:
            port += 1
            if blocked and not RUN_ALL and not isinstance(host_command(c, tools, port), str):
                c.status = "known"
                c.detail = (f"known issue {blocked[0]}: not run, blocked "
                            f"(the probe {blocked[1]} failed on it; SRX_INTEROP_RUN_ALL=1 runs it)")
                continue
            run_case(c, tools, ns, guest, out, port)
            if c.guest_dead:
                (out / f"guest-console-before-{c.id}-reboot.log").write_text(
                    guest.console.read_text(errors="replace") if guest.console.exists() else "")
                guest.stop()
                log(f"rebooting the guest after {c.id}")
                guest.boot()
            if c is cases[0] and c.status == "known":
                # The first case is the probe: a known issue that breaks it
                # breaks every exchange; do not spend minutes timing out.
                blocked = (c.detail.split(":")[0].split()[-1], c.id)
            log(f"{c.status:7s} {c.id}: {c.metric or ''} {c.frames} frames "
                f"({c.fh} host→guest, {c.fg} guest→host) {c.secs:.1f}s "
                f"{c.detail if c.status in ('FAIL', 'known') else ''}")
            if c.status == "FAIL":
                failed = True
                gtail = guest.run("dmesg | tail -n 5", timeout=20)[1].strip()
                if gtail:
                    log("guest dmesg:\n" + "\n".join("  " + l for l in gtail.splitlines()))
        rows = table(cases)
        text = render(rows)
        print("\n" + text + "\n")
        self_md = "\n".join(f"| {n} | {'ok' if ok else 'FAIL'} | {d} |"
                            for n, ok, d in self_results)
        (out / "results.md").write_text(
            f"Guest: {summary['guest']} (boot {summary['boot_s']:.1f} s)\n\n"
            f"| guest self-test | result | detail |\n|---|---|---|\n{self_md}\n\n"
            + markdown(rows) + "\n")
        (out / "results.json").write_text(json.dumps(
            {"summary": summary, "selftest": self_results,
             "cases": [{k: v for k, v in vars(c).items()} for c in cases]}, indent=1))
        n_self_ok = sum(1 for _, ok, _ in self_results if ok)
        n_ok = sum(c.status == "ok" for c in cases) + n_self_ok
        n_fail = sum(c.status in ("FAIL", "fail") for c in cases) + len(self_results) - n_self_ok
        n_known = sum(c.status == "known" for c in cases)
        n_other = sum(c.status in ("pending", "n/a") for c in cases)
        failed |= n_fail > 0
        log(f"results in {out}/results.md; captures and logs in {out}")
        print(f"rxe interop: {n_ok} ok (including {n_self_ok} guest self-tests), {n_fail} failed, "
              f"{n_known} failing on known softrdma issues "
              f"({', '.join(sorted({c.detail.split(':')[0].split()[-1] for c in cases if c.status == 'known'})) or 'none'}), "
              f"{n_other} pending or not applicable")
        print(f"rxe-interop: {n_ok} passed, {n_fail} failed, {n_known + n_other} skipped")
    except (Fail, OSError) as e:
        print(f"\ninterop/rxe: FAILED: {e}", file=sys.stderr)
        if guest and guest.proc:
            print(guest.tail(), file=sys.stderr)
        failed = True
    finally:
        cleanup()
    log("done" + (" with FAILURES" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
