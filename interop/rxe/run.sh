#!/usr/bin/env bash
# softrdma <-> Linux Soft-RoCE (rxe) interop: one command for users and CI.
#
#   sudo interop/rxe/run.sh
#
# Installs what it needs through apt (qemu, busybox, rdma-core tools,
# perftest, tcpdump), fetches and caches Debian's kernel (which has rdma_rxe),
# builds a tiny initramfs, boots a qemu TCG guest with rxe0 on a tap device in
# a private network namespace, runs the test matrix against softrdma on the
# host side, checks every captured frame's ICRC, prints a results table and
# exits non-zero on any failure. See docs/interop.md.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "$(id -u)" -ne 0 ]; then
    echo "interop/rxe/run.sh: needs root (network namespace, tap, tcpdump, apt)" >&2
    exit 2
fi

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v busybox >/dev/null || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v rdma >/dev/null || need+=(iproute2)
command -v ip >/dev/null || need+=(iproute2)
command -v ss >/dev/null || need+=(iproute2)
command -v tcpdump >/dev/null || need+=(tcpdump)
command -v python3 >/dev/null || need+=(python3)
command -v ibv_rc_pingpong >/dev/null || need+=(ibverbs-utils)
command -v ib_write_lat >/dev/null || need+=(perftest)
command -v rping >/dev/null || need+=(rdmacm-utils)
[ -e /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ] || need+=(ibverbs-providers)
# ibv_mw_pingpong (memory windows) is compiled here for both sides.
[ -e /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
command -v cc >/dev/null || need+=(gcc)
dpkg -s rdma-core >/dev/null 2>&1 || need+=(rdma-core)
if [ "${#need[@]}" -gt 0 ]; then
    echo "interop/rxe: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${need[@]}"
fi
if ! apt-cache show linux-image-amd64 >/dev/null 2>&1; then
    apt-get update -q
fi

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi

exec python3 interop/rxe/harness.py "$@"
