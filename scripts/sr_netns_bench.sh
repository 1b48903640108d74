#!/bin/sh
# Goodput over real RoCEv2/UDP under loss, go-back-N vs selective repeat
# (issue 19). Two network namespaces joined by a veth (MTU 9000, so 4 KiB
# RoCE MTU) with `tc netem delay` on both ends (default 50 us each way:
# 100 us RTT) or, when the kernel has no netem, the same delay added by
# the fault injector on receive (SOFTRDMA_FAULT delay_us), SOFTRDMA_FAULT
# loss on both devices; one client streaming 64 KiB WRITEs
# (crates/softrdma/examples/sr_udp_goodput.rs) over UDP (never the
# same-host shared-memory transport). Prints a markdown table. Needs root
# and iproute2.
#
#   scripts/sr_netns_bench.sh [MIB] [DELAY_US]
#
# TIMEOUT=T sets the local ACK timeout exponent (default 10: 4.2 ms).
# DEPTH=N sets the WRITEs the client keeps outstanding (default 32).
# LOSSES="0 0.01" picks the loss rates (default "0 0.001 0.01 0.05"; the
# first is the reference of the ratios). REPEAT=N runs each cell N times,
# go-back-N and selective repeat alternating, and prints the median run
# (by goodput) with the range of the N goodputs after it: a single run of
# a few hundred milliseconds swings by 1.5x on a shared 2-core VM.
set -eu
MIB=${1:-256}
DELAY=${2:-50}
TIMEOUT=${TIMEOUT:-10}
DEPTH=${DEPTH:-32}
# PIN=1: the server on CPU 1 and the client on CPU 0 (taskset), so that
# the scheduler does not move the two processes' threads between cores
# from run to run.
PIN_SERVER=""; PIN_CLIENT=""
if [ "${PIN:-0}" = 1 ]; then PIN_SERVER="taskset -c 1"; PIN_CLIENT="taskset -c 0"; fi
BIN=${CARGO_TARGET_DIR:-target}/release/examples/sr_udp_goodput
[ -x "$BIN" ] || cargo build --release -p softrdma --example sr_udp_goodput
A=srbench-a-$$
B=srbench-b-$$
WORK=$(mktemp -d /tmp/sr-netns-bench.XXXXXX)
cleanup() { ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM
ip netns add "$A"
ip netns add "$B"
ip link add va-$$ type veth peer name vb-$$
ip link set va-$$ netns "$A"
ip link set vb-$$ netns "$B"
ip -n "$A" addr add 10.78.0.1/24 dev va-$$
ip -n "$B" addr add 10.78.0.2/24 dev vb-$$
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set va-$$ mtu 9000 up
ip -n "$B" link set vb-$$ mtu 9000 up
# netem may be missing from the kernel (sch_netem): then the fault
# injector adds the delay on receive, and the table says so.
fdelay=""
if ip netns exec "$A" tc qdisc add dev va-$$ root netem delay ${DELAY}us limit 100000 2>/dev/null &&
   ip netns exec "$B" tc qdisc add dev vb-$$ root netem delay ${DELAY}us limit 100000 2>/dev/null; then
  delay_note="netem ${DELAY} us each way"
else
  fdelay=",delay_us=${DELAY}"
  delay_note="no netem in this kernel: ${DELAY} us each way added by SOFTRDMA_FAULT delay_us on receive"
fi

run() { # loss mode
  flag=""; [ "$2" = sr ] && flag=--sr
  port=$((18600 + $$ % 1000))
  SOFTRDMA_TRANSPORT=udp SOFTRDMA_DEVICES=srx0=10.78.0.2 SOFTRDMA_FAULT="loss=$1,seed=2$fdelay" \
    ip netns exec "$B" $PIN_SERVER "$BIN" server 10.78.0.2:$port $flag --timeout "$TIMEOUT" &
  srv=$!
  out=$(SOFTRDMA_TRANSPORT=udp SOFTRDMA_DEVICES=srx0=10.78.0.1 SOFTRDMA_FAULT="loss=$1,seed=1$fdelay" \
    ip netns exec "$A" $PIN_CLIENT "$BIN" client 10.78.0.2:$port "$MIB" $flag --timeout "$TIMEOUT" --depth "$DEPTH")
  wait $srv
  echo "$out"
}
field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }

echo "# RoCEv2/UDP between two namespaces, veth MTU 9000, ${delay_note}, SOFTRDMA_FAULT loss on both devices, local ACK timeout $TIMEOUT, ${MIB} MiB of 64 KiB WRITEs per run, ${DEPTH} outstanding${PIN_CLIENT:+, pinned: client CPU 0, server CPU 1}"
echo
echo "| loss | go-back-N Gb/s | GBN / lossless | GBN retransmits (timeouts) | selective repeat Gb/s | SR / lossless | SR retransmits (timeouts) |"
echo "|---|---|---|---|---|---|---|"
g0=""; s0=""
REPEAT=${REPEAT:-1}
# The median of a cell's runs by goodput (its whole output line), and the
# goodputs' range when there was more than one run.
median() { sort -t= -k5 -n | awk -v n="$REPEAT" 'NR == int((n + 1) / 2) { print }'; }
range() { [ "$REPEAT" -gt 1 ] && tr ' ' '\n' | sed -n 's/^gbps=//p' | sort -n | sed -n '1p;$p' | paste -sd- | sed 's/^/ [/;s/$/]/'; true; }
LOSSES=${LOSSES:-0 0.001 0.01 0.05}
# Rounds of every cell, so that a slow spell of the machine falls on all
# loss rates alike rather than on one.
k=0
while [ "$k" -lt "$REPEAT" ]; do
  for loss in $LOSSES; do
    run $loss gbn | grep '^mode=' >>"$WORK/gbn.$loss"
    run $loss sr | grep '^mode=' >>"$WORK/sr.$loss"
  done
  k=$((k + 1))
done
for loss in $LOSSES; do
  g=$(median <"$WORK/gbn.$loss"); s=$(median <"$WORK/sr.$loss")
  gg=$(field "$g" gbps); sg=$(field "$s" gbps)
  [ -z "$g0" ] && g0=$gg && s0=$sg
  printf '| %s %% | %s%s | %.3f | %s (%s) | %s%s | %.3f | %s (%s) |\n' \
    "$(echo "$loss*100" | bc -l | sed 's/\.\?0*$//;s/^\./0./;s/^$/0/')" "$gg" "$(range <"$WORK/gbn.$loss")" "$(echo "$gg/$g0" | bc -l)" \
    "$(field "$g" retransmits)" "$(field "$g" timeouts)" \
    "$sg" "$(range <"$WORK/sr.$loss")" "$(echo "$sg/$s0" | bc -l)" "$(field "$s" retransmits)" "$(field "$s" timeouts)"
done
