#!/bin/bash
# Congestion on a real kernel bottleneck (issue 19): N sender namespaces
# and one receiver namespace on a bridge in a "switch" namespace, the
# switch's port to the receiver shaped by the kernel (tbf, a tail-dropping
# queue) and, since this kernel has no RED/fq_codel, ECN-marked by the
# phantom-queue tc-BPF program (crates/softrdma/src/ecn_marker_prog.rs,
# HULL: a virtual queue draining at 95 % of the shaped rate, CE above a
# threshold). Each sender streams 64 KiB RDMA WRITEs over RoCEv2/UDP for
# SECS seconds (crates/softrdma/examples/sr_udp_goodput.rs) to its own
# server process on the receiver, once with the fixed window (no
# congestion control) and once with DCQCN (SOFTRDMA_CC). Prints a markdown
# table: per-sender goodput, the qdisc's sent/dropped packets (the whole
# run, and after the first WARMUP seconds: DCQCN starts every flow at its
# line rate, so the start overflows the queue once) and its backlog
# sampled every 20 ms, marks, CNPs, retransmissions. With
# CAPTURE=DIR it keeps a capture of CE-marked packets and CNPs taken on the
# receiver's veth during the DCQCN run (DIR/bottleneck-dcqcn.pcap). Root
# and iproute2 (tc) needed; tcpdump for CAPTURE.
#
#   bench/bottleneck.sh [SENDERS=3] [SECS=5] [RATE_MBIT=1000] [MODES="fixed dcqcn"]
set -eu
N=${1:-3}
SECS=${2:-5}
RATE=${3:-1000}
MODES=${4:-fixed dcqcn}
DRAIN=$((RATE * 95 / 100))
THRESH=${THRESH:-16000}
# DCQCN's line rate: the senders' own links, as fast as the bottleneck's
# (an incast between hosts with equal links). veth has no rate of its
# own; a higher figure (2 Gb/s, the earlier default) lets each sender
# start, and recover, at twice what the bottleneck drains, and on an idle
# machine the tbf queue then overflowed (2.5-3.1 % dropped).
LINE_GBPS=${LINE_GBPS:-$(awk "BEGIN { print $RATE / 1000 }")}
LIMIT=${LIMIT:-256kb}
TIMEOUT=${TIMEOUT:-14}
WARMUP=${WARMUP:-1}
DCQCN=${DCQCN:-dcqcn} # or dcqcn-hpcc (the ns-3 HPCC parameters)
EX=${EX:-${CARGO_TARGET_DIR:-target}/release/examples}
[ -x "$EX/sr_udp_goodput" ] && [ -x "$EX/ecn_marker" ] ||
    cargo build --release -q -p softrdma --example sr_udp_goodput --example ecn_marker
[ "$(id -u)" = 0 ] || { echo "bench/bottleneck.sh needs root (network namespaces, tc, BPF)" >&2; exit 1; }
[ "$N" -ge 1 ] && [ "$N" -le 8 ] || { echo "SENDERS is 1 to 8" >&2; exit 1; }

T=bn$$
SW=$T-sw
R=$T-r
WORK=$(mktemp -d /tmp/softrdma-bottleneck.XXXXXX)
cleanup() {
    exec 3>&- 2>/dev/null || true
    for ns in $(ip netns list | awk '{print $1}' | grep "^$T-"); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

ip netns add "$SW"
ip netns add "$R"
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
ip -n "$SW" link add rport mtu 9000 type veth peer name e0 netns "$R" mtu 9000
ip -n "$SW" link set rport master br0 up
ip -n "$R" link set lo up
ip -n "$R" link set e0 up
for i in $(seq 1 "$N"); do
    ip netns add "$T-h$i"
    ip -n "$SW" link add "h$i" mtu 9000 type veth peer name e0 netns "$T-h$i" mtu 9000
    ip -n "$SW" link set "h$i" master br0 up
    ip -n "$T-h$i" link set lo up
    ip -n "$T-h$i" addr add "10.79.0.$i/24" dev e0
    ip -n "$T-h$i" link set e0 up
    ip -n "$R" addr add "10.79.0.$((100 + i))/24" dev e0
done
# The bottleneck: the switch's port to the receiver.
qdisc() {
    ip netns exec "$SW" tc qdisc del dev rport root 2>/dev/null || true
    ip netns exec "$SW" tc qdisc add dev rport root tbf rate "${RATE}mbit" burst 64kb limit "$LIMIT"
}
sleep 0.2

sent_of() { echo "$1" | sed -n 's/.*Sent [0-9]* bytes \([0-9]*\) pkt.*/\1/p'; }
dropped_of() { echo "$1" | sed -n 's/.*dropped \([0-9]*\),.*/\1/p'; }
field() { v=$(echo "$1" | tr " " "\n" | sed -n "s/^$2=//p" | head -1); echo "${v:-0}"; }

run() { # mode → one table row
    local mode=$1 cc=fixed port=$((18700 + $$ % 500)) i
    [ "$mode" = dcqcn ] && cc="$DCQCN:$LINE_GBPS"
    qdisc
    rm -f "$WORK/fifo"
    mkfifo "$WORK/fifo"
    ip netns exec "$SW" "$EX/ecn_marker" rport "$DRAIN" "$THRESH" <"$WORK/fifo" >"$WORK/marker.$mode" &
    local marker=$!
    exec 3>"$WORK/fifo"
    sleep 0.3
    local cap=""
    if [ -n "${CAPTURE:-}" ] && [ "$mode" = dcqcn ]; then
        mkdir -p "$CAPTURE"
        # CE-marked packets and CNPs (BTH opcode 0x81), full length.
        ip netns exec "$R" tcpdump -i e0 -s 0 -U -c "${CAP_PACKETS:-400}" -w "$CAPTURE/bottleneck-dcqcn.pcap" \
            'udp port 4791 and (ip[1] & 3 = 3 or udp[8] = 0x81)' 2>/dev/null &
        cap=$!
        sleep 0.5
    fi
    local pids=""
    for i in $(seq 1 "$N"); do
        SOFTRDMA_TRANSPORT=udp SOFTRDMA_DEVICES="srx0=10.79.0.$((100 + i))" SOFTRDMA_CC=$cc \
            ip netns exec "$R" "$EX/sr_udp_goodput" server "10.79.0.$((100 + i)):$((port + i))" --timeout "$TIMEOUT" >"$WORK/srv.$mode.$i" &
        pids="$pids $!"
    done
    sleep 0.3
    for i in $(seq 1 "$N"); do
        SOFTRDMA_TRANSPORT=udp SOFTRDMA_DEVICES="srx0=10.79.0.$i" SOFTRDMA_CC=$cc \
            ip netns exec "$T-h$i" "$EX/sr_udp_goodput" client "10.79.0.$((100 + i)):$((port + i))" 0 --secs "$SECS" --warmup "$WARMUP" --timeout "$TIMEOUT" \
            >"$WORK/cli.$mode.$i" 2>&1 &
        pids="$pids $!"
    done
    # The backlog, every 20 ms while the senders run (bounded).
    # The counters as the warm-up ends, for the steady state's drop rate.
    : >"$WORK/backlog.$mode"
    local k st t0 warm=""
    t0=$(date +%s%N)
    for k in $(seq 1 $((SECS * 50))); do
        st=$(ip netns exec "$SW" tc -s qdisc show dev rport)
        echo "$st" | sed -n 's/.*backlog \([0-9]*\)b.*/\1/p' >>"$WORK/backlog.$mode"
        [ -z "$warm" ] && [ $(($(date +%s%N) - t0)) -ge $((WARMUP * 1000000000)) ] && warm=$st
        sleep 0.02
        kill -0 $pids 2>/dev/null || break
    done
    for i in $pids; do wait "$i" || true; done
    exec 3>&-
    wait "$marker" || true
    [ -n "$cap" ] && { kill "$cap" 2>/dev/null || true; wait "$cap" 2>/dev/null || true; }
    st=$(ip netns exec "$SW" tc -s qdisc show dev rport)
    echo "$st" >"$WORK/qdisc.$mode"
    local sent drop wsent wdrop
    sent=$(sent_of "$st")
    drop=$(dropped_of "$st")
    wsent=$((sent - $(sent_of "${warm:-$st}")))
    wdrop=$((drop - $(dropped_of "${warm:-$st}")))
    local per="" tot=0 mn="" mx=0 rt=0 to=0 cnpr=0 ce=0 cnps=0 g
    for i in $(seq 1 "$N"); do
        c=$(cat "$WORK/cli.$mode.$i")
        s=$(cat "$WORK/srv.$mode.$i")
        g=$(field "$c" gbps)
        [ -n "$g" ] || { echo "sender $i failed: $c" >&2; g=0; }
        per="$per${per:+ / }$g"
        tot=$(echo "$tot + $g" | bc -l)
        [ -z "$mn" ] || [ "$(echo "$g < $mn" | bc)" = 1 ] && mn=$g
        [ "$(echo "$g > $mx" | bc)" = 1 ] && mx=$g
        rt=$((rt + $(field "$c" retransmits)))
        to=$((to + $(field "$c" timeouts)))
        cnpr=$((cnpr + $(field "$c" cnp_rcvd)))
        ce=$((ce + $(field "$s" ecn_ce_rcvd)))
        cnps=$((cnps + $(field "$s" cnp_sent)))
    done
    local fair dev bmax bmean marked
    fair=$(echo "$tot / $N" | bc -l)
    dev=$(echo "m = ($mx - $fair) / $fair; n = ($fair - $mn) / $fair; if (n > m) m = n; m * 100" | bc -l)
    bmax=$(sort -n "$WORK/backlog.$mode" | tail -1)
    bmean=$(awk '{s += $1; n++} END {if (n) printf "%.0f", s / n; else print 0}' "$WORK/backlog.$mode")
    marked=$(field "$(cat "$WORK/marker.$mode")" marked)
    printf '| %s | %s | %.3f | %.1f %% | %s | %s | %.3f %% | %.1f / %.1f | %s | %s | %s / %s | %s (%s) | %s of %s, %.3f %% |\n' \
        "$mode" "$per" "$tot" "$dev" "$sent" "$drop" "$(echo "100 * $drop / ($sent + $drop)" | bc -l)" \
        "$(echo "$bmax / 1024" | bc -l)" "$(echo "$bmean / 1024" | bc -l)" "$marked" "$ce" "$cnps" "$cnpr" "$rt" "$to" \
        "$wdrop" "$((wsent + wdrop))" "$(echo "100 * $wdrop / ($wsent + $wdrop + 1)" | bc -l)"
    [ "${VERBOSE:-0}" = 1 ] && { cat "$WORK/qdisc.$mode" >&2; cat "$WORK"/cli."$mode".* "$WORK"/srv."$mode".* >&2; }
    return 0
}

echo "# $N senders → 1 receiver, RoCEv2/UDP, 64 KiB WRITEs for ${SECS} s each (goodput after the first ${WARMUP} s); bottleneck tbf ${RATE} Mbit/s limit $LIMIT;"
echo "# phantom-queue marker draining at ${DRAIN} Mbit/s, CE above ${THRESH} B; SOFTRDMA_CC=$DCQCN:${LINE_GBPS} (Gb/s line rate)"
echo
echo "| congestion control | per-sender Gb/s | total Gb/s | worst share off fair | qdisc sent pkts | qdisc dropped | drop rate | backlog max / mean KiB (20 ms samples) | CE marked | CE received | CNPs sent / received | retransmits (timeouts) | dropped after the warm-up |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for m in $MODES; do run "$m"; done
if [ "${VERBOSE:-0}" = 1 ]; then for m in $MODES; do echo "## tc -s qdisc after $m" >&2; cat "$WORK/qdisc.$m" >&2; done; fi
