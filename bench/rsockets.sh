#!/usr/bin/env bash
# rsockets as users measure them: Debian's unmodified `rstream` on
# softrdma's drop-in librdmacm.so.1 + libibverbs.so.1 (rsockets over RC
# QPs), over UDP and the same-host path, next to the same rstream with
# `-T s` — plain sockets, the kernel's TCP over loopback — in the same run:
# the peer figure. Each row is the median of ROUNDS runs (3) of one
# latency test (64 B and 4 KiB ping-pongs, N iterations) and one bandwidth
# test (64 KiB and 1 MiB, in bursts), both ends pinned to a CPU each.
#
# rstream's columns: usec/xfer is half a round trip for the latency tests;
# Gb/sec counts the bytes of both directions.
#
# Needs rdmacm-utils (apt-get install rdmacm-utils). Every command is
# bounded by `timeout`. Environment: ROUNDS=3, N=2000, KEEP=1 keeps the raw
# outputs; SOFTRDMA and LIBIBVERBS to measure given builds.

set -u
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
N=${N:-2000}
BENCH=rsockets
. bench/lib.sh
need rstream taskset "apt-get install rdmacm-utils util-linux"
build_dropin

# The "custom" row's usec/xfer and Gb/sec.
usec() { awk '$1 == "custom" {print $NF; exit}' "$1"; }
gbps() { awk '$1 == "custom" {print $(NF-1); exit}' "$1"; }

tests=("lat 64 -S 64 -C 1 -I $N" "lat 4096 -S 4096 -C 1 -I $N"
       "bw 65536 -S 65536 -C 500 -I 1" "bw 1048576 -S 1048576 -C 50 -I 1")
for r in $(seq 1 "$ROUNDS"); do
    for t in "${tests[@]}"; do
        set -- $t
        kind=$1 size=$2
        shift 2
        for way in udp shm tcp; do
            name="$kind-$size-$way-$r"
            p=$((PORT + r))
            if [ "$way" = tcp ]; then
                pair "$name" udp "rstream -T s -b 127.0.0.1 -p $p $*" \
                    "rstream -T s -s 127.0.0.1 -p $p $*"
            else
                pair "$name" "$way" "env SOFTRDMA_DEVICES=srx0=127.0.79.1 rstream -p $p $*" \
                    "env SOFTRDMA_DEVICES=srx0=127.0.79.2 rstream -s 127.0.79.1 -p $p $*"
            fi
            if [ "$kind" = lat ]; then
                record "$kind-$size-$way" "$(usec "$WORK/$name.out")"
            else
                record "$kind-$size-$way" "$(gbps "$WORK/$name.out")"
            fi
        done
    done
done

printf '%-9s %8s %14s %14s %14s %10s %10s\n' test bytes "softrdma udp" "softrdma shm" "kernel tcp" "udp/tcp" "shm/tcp"
for t in "${tests[@]}"; do
    set -- $t
    kind=$1 size=$2
    u=$(median "$kind-$size-udp") s=$(median "$kind-$size-shm") k=$(median "$kind-$size-tcp")
    unit=$([ "$kind" = lat ] && echo "us" || echo "Gb/s")
    ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a / b}'; }
    printf '%-9s %8s %14s %14s %14s %10s %10s\n' "$kind($unit)" "$size" "${u:--}" "${s:--}" "${k:--}" \
        "$(ratio "$u" "$k")" "$(ratio "$s" "$k")"
done
