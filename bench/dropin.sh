#!/usr/bin/env bash
# Unmodified programs against softrdma's own tool, on the same machine in
# the same minutes: Debian's perftest on the drop-in libibverbs.so.1 and
# `softrdma perf`, alternated ROUNDS times (5), medians.
#
#   8 B latency: ib_write_lat -s 8 vs softrdma perf write_lat -s 8, per
#     transport (udp, shm).  Goal: ib_write_lat <= 1.2 x softrdma perf.
#   8 B message rate: ib_write_bw -s 8 MsgRate vs softrdma perf write_bw -s 8
#     (no goal; the figure RDMA users quote after latency).
#
# Needs Debian's perftest (apt-get install perftest). Servers are pinned to
# CPU 0 and clients to CPU 1, every command is bounded by `timeout`.
# Environment: SOFTRDMA=path of the softrdma binary, LIBIBVERBS=path of
# libibverbs.so (default: both built here with cargo build --release),
# ROUNDS=5, KEEP=1 keeps the raw outputs.

set -u
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-5}
BENCH=dropin
. bench/lib.sh
need ib_write_lat ib_write_bw "apt-get install perftest"
build_dropin
# perftest and softrdma perf print the same rows.
lat() { awk '$1 == 8 && NF >= 6 {print $5; exit}' "$1"; }   # t_typical
rate() { awk '$1 == 8 && NF >= 5 {print $5; exit}' "$1"; }  # MsgRate [Mpps]

for r in $(seq 1 "$ROUNDS"); do
    log "round $r/$ROUNDS"
    for tr in udp shm; do
        PORT=$((PORT + 1))
        pair "ib_lat.$tr.$r" $tr "ib_write_lat -d srx0 -p $PORT -s 8 -n 20000" \
            "ib_write_lat -d srx0 -p $PORT -s 8 -n 20000 127.0.0.1"
        record "ib_lat_$tr" "$(lat "$WORK/ib_lat.$tr.$r.out")"
        PORT=$((PORT + 1))
        pair "sr_lat.$tr.$r" $tr "$SOFTRDMA perf write_lat --server -p $PORT --transport $tr" \
            "$SOFTRDMA perf write_lat 127.0.0.1 -p $PORT -s 8 -n 20000 --transport $tr"
        record "sr_lat_$tr" "$(lat "$WORK/sr_lat.$tr.$r.out")"
        PORT=$((PORT + 1))
        pair "ib_rate.$tr.$r" $tr "ib_write_bw -d srx0 -p $PORT -s 8 -n 200000" \
            "ib_write_bw -d srx0 -p $PORT -s 8 -n 200000 127.0.0.1"
        record "ib_rate_$tr" "$(rate "$WORK/ib_rate.$tr.$r.out")"
        PORT=$((PORT + 1))
        pair "sr_rate.$tr.$r" $tr "$SOFTRDMA perf write_bw --server -p $PORT --transport $tr" \
            "$SOFTRDMA perf write_bw 127.0.0.1 -p $PORT -s 8 -n 200000 --transport $tr"
        record "sr_rate_$tr" "$(rate "$WORK/sr_rate.$tr.$r.out")"
    done
done

ratio() { if [ -n "$1" ] && [ -n "$2" ]; then awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a/b; else print "–"}'; else echo "–"; fi; }
goal() { [ "$1" = "–" ] && { echo "–"; return; }; awk -v r="$1" -v l="$3" -v op="$2" 'BEGIN {ok = (op == "le") ? (r <= l) : (r >= l); print (ok ? "met" : "not met")}'; }
echo
echo "Medians of $ROUNDS alternated rounds; servers on CPU 0, clients on CPU 1."
echo
echo "| transport | measure | ib_* on the drop-in | softrdma perf | ratio | goal |"
echo "|---|---|---|---|---|---|"
for tr in udp shm; do
    a=$(median "ib_lat_$tr"); b=$(median "sr_lat_$tr"); q=$(ratio "$a" "$b")
    echo "| $tr | 8 B write latency, t_typical | ${a:-–} µs | ${b:-–} µs | $q | ≤ 1.2: $(goal "$q" le 1.2) |"
    a=$(median "ib_rate_$tr"); b=$(median "sr_rate_$tr")
    echo "| $tr | 8 B write message rate | ${a:-–} Mpps | ${b:-–} Mpps | $(ratio "$a" "$b") | – |"
done
