#!/usr/bin/env bash
# The AF_XDP port against the UDP port and sockperf, on one veth pair
# between two network namespaces (docs/xdp.md, docs/performance.md). In
# each of ROUNDS rounds (3) the three run alternately; the table shows
# medians and ratios against the UDP port measured in the same run:
#
#   8 B write_lat (half round trip, t_typical): goal AF_XDP <= 0.7 x UDP
#   1 MiB write_bw (GB/s):                      goal AF_XDP >= 1.5 x UDP
#   8 B message rate (write_bw -s 8, Mpps):     goal AF_XDP >= 3 x UDP
#   sockperf UDP ping-pong (64 B) and throughput (64 B, --mps=max) over the
#   same veth, for reference.
#
# Needs root (namespaces, XDP). The server is pinned to CPU 0, the client to
# CPU 1; every command is bounded by `timeout`; the namespaces are removed
# at the end. Environment: SOFTRDMA=binary (default: built here), ROUNDS=3,
# MTU=1500 (the veth's; at most 3800 for the AF_XDP port's frames),
# SOFTRDMA_XDP_MODE / SOFTRDMA_XDP_POLL (passed on), KEEP=1 keeps the raw
# outputs.

set -u
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
MTU=${MTU:-1500}
SRV_CPU=0
CLI_CPU=1
WORK=$(mktemp -d /tmp/softrdma-xdp.XXXXXX)
NS_A=srxdpbench-a-$$
NS_B=srxdpbench-b-$$
VA=srxb$$a
VB=srxb$$b
IP_A=10.213.0.1
IP_B=10.213.0.2
PORT=$((20000 + RANDOM % 20000))

log() { printf '%s\n' "$*" >&2; }
have() { command -v "$1" >/dev/null 2>&1; }

[ "$(id -u)" = 0 ] || { log "bench/xdp.sh needs root (network namespaces, XDP)"; exit 1; }
if [ -z "${SOFTRDMA:-}" ]; then
    log "building softrdma (cargo build --release -p softrdma-cli)"
    cargo build --release -q -p softrdma-cli || exit 1
    SOFTRDMA="${CARGO_TARGET_DIR:-target}/release/softrdma"
fi
SOFTRDMA=$(realpath "$SOFTRDMA")
[ -x "$SOFTRDMA" ] || { log "no softrdma binary at $SOFTRDMA"; exit 1; }

SRV_PID=
stop_server() {
    if [ -n "$SRV_PID" ]; then
        kill "$SRV_PID" 2>/dev/null
        wait "$SRV_PID" 2>/dev/null
        SRV_PID=
    fi
}
cleanup() {
    stop_server
    ip netns del "$NS_A" 2>/dev/null
    ip netns del "$NS_B" 2>/dev/null
    if [ "${KEEP:-0}" = 1 ]; then log "raw outputs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$NS_A" && ip netns add "$NS_B" || exit 1
ip link add "$VA" netns "$NS_A" mtu "$MTU" type veth peer name "$VB" netns "$NS_B" mtu "$MTU" || exit 1
ip -n "$NS_A" addr add $IP_A/24 dev "$VA"
ip -n "$NS_B" addr add $IP_B/24 dev "$VB"
for n in "$NS_A:$VA" "$NS_B:$VB"; do
    ip -n "${n%%:*}" link set lo up
    ip -n "${n%%:*}" link set "${n#*:}" up
done

# pair NAME "server command" "client command": server in namespace b on
# SRV_CPU, client in namespace a on CLI_CPU; client output in $WORK/NAME.out.
pair() {
    local name=$1 srv=$2 cli=$3
    ip netns exec "$NS_B" taskset -c $SRV_CPU timeout 90 sh -c "exec $srv" >"$WORK/$name.srv" 2>&1 &
    SRV_PID=$!
    sleep 0.7
    ip netns exec "$NS_A" taskset -c $CLI_CPU timeout 60 sh -c "exec $cli" >"$WORK/$name.out" 2>&1
    local rc=$?
    sleep 0.2
    stop_server
    return $rc
}

record() { [ -n "$2" ] && printf '%s\n' "$2" >>"$WORK/$1.vals"; }
median() {
    [ -s "$WORK/$1.vals" ] || { echo ""; return; }
    sort -g "$WORK/$1.vals" | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else printf "%.4f\n", (v[NR/2]+v[NR/2+1])/2}'
}
sr_lat() { awk '/^ #bytes/ {getline; print $5; exit}' "$1"; }                            # t_typical (usec)
sr_bw() { awk '/^ #bytes/ {getline; printf "%.3f\n", $4*1048576/1e9; exit}' "$1"; }      # GB/s
sr_rate() { awk '/^ #bytes/ {getline; printf "%.4f\n", $5; exit}' "$1"; }                # Mpps
sp_lat() { sed 's/\x1b\[[0-9;]*m//g' "$1" | awk '/percentile 50.000 =/ {print $NF}'; }
sp_rate() { sed 's/\x1b\[[0-9;]*m//g' "$1" | awk '/Message Rate is/ {printf "%.4f\n", $(NF-1)/1e6}' | tail -1; }

dev() { # dev IP KIND IFACE
    if [ "$2" = xdp ]; then echo "srx0=$1@xdp:$3"; else echo "srx0=$1"; fi
}

round() {
    local r=$1 k
    log "round $r/$ROUNDS"
    for k in udp xdp; do
        PORT=$((PORT + 1))
        local S="$SOFTRDMA --device $(dev $IP_B $k $VB) perf"
        local C="$SOFTRDMA --device $(dev $IP_A $k $VA) perf"
        pair "lat_$k.$r" "$S write_lat --server -p $PORT --transport udp" \
            "$C write_lat $IP_B -p $PORT -s 8 -n 20000 --transport udp" &&
            record "lat_$k" "$(sr_lat "$WORK/lat_$k.$r.out")"
        PORT=$((PORT + 1))
        pair "bw_$k.$r" "$S write_bw --server -p $PORT --transport udp" \
            "$C write_bw $IP_B -p $PORT -s 1048576 -n 500 --transport udp" &&
            record "bw_$k" "$(sr_bw "$WORK/bw_$k.$r.out")"
        PORT=$((PORT + 1))
        pair "rate_$k.$r" "$S write_bw --server -p $PORT --transport udp" \
            "$C write_bw $IP_B -p $PORT -s 8 -n 200000 --transport udp" &&
            record "rate_$k" "$(sr_rate "$WORK/rate_$k.$r.out")"
    done
    if have sockperf; then
        PORT=$((PORT + 1))
        pair "sp_lat.$r" "sockperf server -i $IP_B -p $PORT --nonblocked" \
            "sockperf ping-pong -i $IP_B -p $PORT --nonblocked -m 64 -t 3"
        record sp_lat "$(sp_lat "$WORK/sp_lat.$r.out")"
        PORT=$((PORT + 1))
        pair "sp_rate.$r" "sockperf server -i $IP_B -p $PORT" \
            "sockperf throughput -i $IP_B -p $PORT -m 64 --mps=max -t 3"
        record sp_rate "$(sp_rate "$WORK/sp_rate.$r.out")"
    fi
}

for r in $(seq 1 "$ROUNDS"); do round "$r"; done

MODE=$(grep -ho 'AF_XDP on [^ ]* queue [0-9]* ([^)]*)' "$WORK"/*xdp*.out "$WORK"/*xdp*.srv 2>/dev/null | sed 's/.*(\(.*\))/\1/' | sort -u | paste -sd';')
ratio() { # ratio A B -> A/B
    if [ -n "$1" ] && [ -n "$2" ]; then awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a/b; else print "-"}'; else echo "-"; fi
}
goal() { # goal VALUE OP LIMIT
    [ "$1" = "-" ] && { echo "n/a"; return; }
    awk -v v="$1" -v l="$3" -v op="$2" 'BEGIN {ok = (op == "le") ? v <= l : v >= l; print ok ? "met" : "NOT met"}'
}
L_U=$(median lat_udp); L_X=$(median lat_xdp); L_S=$(median sp_lat)
B_U=$(median bw_udp); B_X=$(median bw_xdp)
R_U=$(median rate_udp); R_X=$(median rate_xdp); R_S=$(median sp_rate)
LR=$(ratio "$L_X" "$L_U"); BR=$(ratio "$B_X" "$B_U"); RR=$(ratio "$R_X" "$R_U")

printf '\nAF_XDP port vs UDP port on one veth pair (MTU %s), %s rounds, medians\n' "$MTU" "$ROUNDS"
printf 'AF_XDP mode: %s\n' "${MODE:-unknown}"
printf '%-28s %10s %10s %10s %8s  %s\n' "test" "AF_XDP" "UDP port" "sockperf" "XDP/UDP" "goal"
printf '%-28s %10s %10s %10s %8s  %s\n' "8 B write_lat (us)" "${L_X:--}" "${L_U:--}" "${L_S:--}" "$LR" "<= 0.7: $(goal "$LR" le 0.7)"
printf '%-28s %10s %10s %10s %8s  %s\n' "1 MiB write_bw (GB/s)" "${B_X:--}" "${B_U:--}" "-" "$BR" ">= 1.5: $(goal "$BR" ge 1.5)"
printf '%-28s %10s %10s %10s %8s  %s\n' "8 B msg rate (Mpps)" "${R_X:--}" "${R_U:--}" "${R_S:--}" "$RR" ">= 3: $(goal "$RR" ge 3)"
printf '(sockperf: 64 B UDP ping-pong p50 one-way and 64 B throughput, over the same veth)\n'
