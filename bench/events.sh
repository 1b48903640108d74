#!/usr/bin/env bash
# Completion events against polling, on the same machine in the same
# minutes: each latency test with and without `-e` (the program sleeps on
# its completion channel instead of polling the CQ), per transport (udp,
# shm), alternated ROUNDS times (5), medians, and the ratio events/polling.
#
#   softrdma perf send_lat -s 8 [-e]     (t_typical, us)
#   ib_send_lat -s 8 [-e]                (Debian's perftest on the drop-in)
#   ibv_rc_pingpong -s 8 [-e]            (usec/iter: a whole round trip)
#
# Goal: -e within 3 x polling. An event costs the sleeping program one
# wake-up (the packet wakes the waiting thread itself, which runs the
# device's progress); where one wake-up costs more than twice a polled
# round trip (shm on a VM: a wake-up is 5-50 us, a polled ping-pong 1-3
# us), the goal cannot hold and the figure says by how much.
#
# Needs Debian's perftest and ibverbs-utils. Servers are pinned to CPU 0 and
# clients to CPU 1, every command is bounded by `timeout`. Environment:
# SOFTRDMA=path of the softrdma binary, LIBIBVERBS=path of libibverbs.so
# (default: both built here with cargo build --release), ROUNDS=5, N=5000
# iterations, KEEP=1 keeps the raw outputs.

set -u
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-5}
N=${N:-5000}
BENCH=events
. bench/lib.sh
need ib_send_lat ibv_rc_pingpong "apt-get install perftest ibverbs-utils"
build_dropin
lat() { awk '$1 == 8 && NF >= 6 {print $5; exit}' "$1"; }          # t_typical
iter() { awk '/usec\/iter/ {print $(NF-1); exit}' "$1"; }          # ibv_rc_pingpong

for r in $(seq 1 "$ROUNDS"); do
    log "round $r/$ROUNDS"
    for tr in udp shm; do
        for e in poll events; do
            flag=; [ $e = events ] && flag=-e
            PORT=$((PORT + 1))
            pair "sr.$tr.$e.$r" $tr "$SOFTRDMA perf send_lat --server -p $PORT --transport $tr $flag" \
                "$SOFTRDMA perf send_lat 127.0.0.1 -p $PORT -s 8 -n $N --transport $tr $flag"
            record "sr_${tr}_$e" "$(lat "$WORK/sr.$tr.$e.$r.out")"
            PORT=$((PORT + 1))
            pair "ib.$tr.$e.$r" $tr "ib_send_lat -d srx0 -p $PORT -s 8 -n $N $flag" \
                "ib_send_lat -d srx0 -p $PORT -s 8 -n $N $flag 127.0.0.1"
            record "ib_${tr}_$e" "$(lat "$WORK/ib.$tr.$e.$r.out")"
            PORT=$((PORT + 1))
            pair "pp.$tr.$e.$r" $tr "ibv_rc_pingpong -g 0 -p $PORT -s 8 -n $N $flag" \
                "ibv_rc_pingpong -g 0 -p $PORT -s 8 -n $N $flag 127.0.0.1"
            record "pp_${tr}_$e" "$(iter "$WORK/pp.$tr.$e.$r.out")"
        done
    done
done

printf '\n%-34s %-5s %12s %12s %9s\n' "test (8 B)" path "polling" "events (-e)" "ratio"
for t in sr ib pp; do
    case $t in
        sr) name="softrdma perf send_lat (us)" ;;
        ib) name="ib_send_lat, drop-in (us)" ;;
        pp) name="ibv_rc_pingpong (usec/iter)" ;;
    esac
    for tr in udp shm; do
        p=$(median "${t}_${tr}_poll")
        e=$(median "${t}_${tr}_events")
        ratio=$(awk -v p="$p" -v e="$e" 'BEGIN { if (p > 0 && e > 0) printf "%.2f", e / p; else print "-" }')
        printf '%-34s %-5s %12s %12s %9s\n' "$name" "$tr" "${p:--}" "${e:--}" "$ratio"
    done
done
printf '\nmedians of %s rounds, %s iterations each; goal: ratio <= 3\n' "$ROUNDS" "$N"
