#!/usr/bin/env bash
# Connection setup rate through rdma_cm, as users measure it: Debian's
# unmodified `cmtime -c N` (N = 1000 connections made at once on one event
# channel, then disconnected and destroyed) on softrdma's drop-in
# librdmacm.so.1 + libibverbs.so.1, over UDP and the same-host path,
# ROUNDS times (3); then the `cm_rate` example in the same run: one
# connection at a time through the IB CM and through softrdma's own TCP
# exchange (`softrdma::cm`), the peer figure the issue asks for.
#
# Physical floor: a connection is three MADs (REQ, REP, RTU) and a
# teardown two more (DREQ, DREP), each a UDP datagram through the kernel:
# about 5 x 2 system calls; on this kind of machine a loopback datagram
# round trip is ~10 us (bench/udp_floor.c), so ~25 us of system time per
# connection sequentially, less when cmtime overlaps 1000 of them.
#
# Needs rdmacm-utils (apt-get install rdmacm-utils). Every command is
# bounded by `timeout`. Environment: ROUNDS=3, N=1000, KEEP=1 keeps the
# raw outputs.

set -u
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
N=${N:-1000}
BENCH=cmrate
. bench/lib.sh
need cmtime "apt-get install rdmacm-utils"
build_dropin
log "building the cm_rate example (cargo build --release)"
cargo build --release -q -p softrdma --example cm_rate || exit 1
T=${CARGO_TARGET_DIR:-target}/release

# cmtime's "connect" row: total ms from the first connect to the last
# ESTABLISHED, for all N at once.
connect_ms() { awk '$1 == "connect" {print $3; exit}' "$1"; }
disconnect_ms() { awk '$1 == "disconnect" {print $3; exit}' "$1"; }

printf '%-6s %-5s %12s %14s %15s\n' transport round "connect ms" "connects/s" "disconnect ms"
for tr in udp shm; do
    for r in $(seq 1 "$ROUNDS"); do
        out="$WORK/$tr-$r.out"
        SOFTRDMA_TRANSPORT=$tr SOFTRDMA_DEVICES=srx0=127.0.78.1 LD_LIBRARY_PATH="$WORK" \
            timeout 120 cmtime >"$WORK/$tr-$r.srv" 2>&1 &
        SRV_PID=$!
        sleep 1
        SOFTRDMA_TRANSPORT=$tr SOFTRDMA_DEVICES=srx0=127.0.78.2 LD_LIBRARY_PATH="$WORK" \
            timeout 100 cmtime -s 127.0.78.1 -c "$N" >"$out" 2>&1
        stop_server
        if grep -q "event:" "$out"; then
            log "$tr round $r: $(grep -c 'event:' "$out") connections failed (kept in $WORK)"
            KEEP=1
        fi
        ms=$(connect_ms "$out")
        if [ -z "$ms" ]; then
            log "$tr round $r: no connect row (kept in $WORK)"
            KEEP=1
            continue
        fi
        rate=$(awk -v n="$N" -v ms="$ms" 'BEGIN {printf "%.0f", n / (ms / 1000)}')
        printf '%-6s %-5s %12s %14s %15s\n' "$tr" "$r" "$ms" "$rate" "$(disconnect_ms "$out")"
    done
done

echo
echo "one connection at a time, two devices in one process (UDP):"
timeout 300 "$T/examples/cm_rate" "$N"
