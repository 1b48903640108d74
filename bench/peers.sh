#!/usr/bin/env bash
# softrdma against its peers (../shared/reference/peers.md), in one run on
# this machine: the peers and softrdma run alternately, ROUNDS times (3),
# and the table shows medians and ratios. Every server is pinned to CPU 0
# and every client to CPU 1, every command is bounded by `timeout`, and
# every server is ended by its PID.
#
# Installs nothing. Peers that are missing are reported as such; on Debian:
#   apt-get install -y ucx-utils libfabric-bin sockperf
#
# Environment: SOFTRDMA=path of the softrdma binary (default: built here
# with cargo build --release), ROUNDS=3, KEEP=1 keeps the raw outputs.
#
# Rows:
#   UDP 8 B latency (half round trip): softrdma write_lat --transport udp
#     vs sockperf UDP busy-poll ping-pong (64 B, its usual size) and
#     fi_pingpong udp dgram / net msg (8 B).  Goal: <= 1.25 x sockperf.
#   UDP 1 MiB bandwidth: softrdma write_bw --transport udp vs fi_pingpong net
#     msg (1 MiB ping-pong).  Goal: >= 1.0 x fi_pingpong.
#   shm 8 B latency / 1 MiB bandwidth: softrdma --transport shm vs UCX
#     ucp_put_lat / ucp_put_bw over posix shared memory, and fi_pingpong shm.
#     Goals: <= 1.0 x ucp_put_lat, >= 0.9 x ucp_put_bw.
#   UDP 8 B message rate: softrdma write_bw -s 8 --transport udp (MsgRate) vs
#     sockperf throughput -m 64 --mps=max (the sender's rate: one system call
#     per message).  Goal: >= 2.0 x sockperf.
#   shm 8 B message rate: softrdma write_bw -s 8 --transport shm vs UCX
#     ucp_put_bw -s 8 (overall message rate).  Goal: >= 0.8 x UCX.
#   shm 8 B READ and fetch-and-add, per operation: softrdma read_lat /
#     atomic_lat vs UCX ucp_get / ucp_fadd (no goal; same run for reference).
#   shm floor: bench/shm_floor.c (built with cc when there is one), a raw
#     8-byte store-and-spin ping-pong between two processes, no library.
#   UDP floors: bench/udp_floor.c, busy-poll ping-pongs with one datagram
#     per turn (sockperf's pattern) and with the two an RC WRITE turn needs
#     (WRITE + ACK as one GSO send, one GRO receive), no RoCE processing.

set -u
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
SRV_CPU=0
CLI_CPU=1
WORK=$(mktemp -d /tmp/softrdma-peers.XXXXXX)
# A random base, so that a second run (or anything else on 47xxx) does not collide.
PORT=$((20000 + RANDOM % 20000))

log() { printf '%s\n' "$*" >&2; }
have() { command -v "$1" >/dev/null 2>&1; }
next_port() { PORT=$((PORT + 1)); }

if [ -z "${SOFTRDMA:-}" ]; then
    log "building softrdma (cargo build --release -p softrdma-cli)"
    cargo build --release -q -p softrdma-cli || exit 1
    SOFTRDMA="${CARGO_TARGET_DIR:-target}/release/softrdma"
fi
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
    if [ "${KEEP:-0}" = 1 ]; then log "raw outputs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# pair NAME SERVER_TIMEOUT CLIENT_TIMEOUT "server command" "client command"
# Runs the server pinned to SRV_CPU in the background, then the client
# pinned to CLI_CPU; the client's output goes to $WORK/NAME.out.
pair() {
    local name=$1 st=$2 ct=$3 srv=$4 cli=$5
    env taskset -c $SRV_CPU timeout "$st" sh -c "exec $srv" >"$WORK/$name.srv" 2>&1 &
    SRV_PID=$!
    sleep 0.5
    env taskset -c $CLI_CPU timeout "$ct" sh -c "exec $cli" >"$WORK/$name.out" 2>&1
    local rc=$?
    sleep 0.2
    stop_server
    return $rc
}

# Values are appended, one per round, to $WORK/KEY.vals.
record() { [ -n "$2" ] && printf '%s\n' "$2" >>"$WORK/$1.vals"; }
median() {
    [ -s "$WORK/$1.vals" ] || { echo ""; return; }
    sort -g "$WORK/$1.vals" | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else printf "%.4f\n", (v[NR/2]+v[NR/2+1])/2}'
}

# Parsers.
sr_lat() { awk '/^ #bytes/ {getline; print $5, $6; exit}' "$1"; }        # t_typical t_avg (usec)
sr_bw() { awk '/^ #bytes/ {getline; printf "%.3f\n", $4*1048576/1e9; exit}' "$1"; }  # GB/s
sp_lat() {
    local p50 avg
    p50=$(sed 's/\x1b\[[0-9;]*m//g' "$1" | awk '/percentile 50.000 =/ {print $NF}')
    avg=$(sed 's/\x1b\[[0-9;]*m//g' "$1" | sed -n 's/.*avg-latency=\([0-9.]*\).*/\1/p' | tail -1)
    echo "$p50 $avg"
}
fi_lat() { awk 'NF>=8 && $1 ~ /^[0-9]/ {v=$7} END {print v}' "$1"; }    # usec/xfer (one way)
fi_bw() { awk 'NF>=8 && $1 ~ /^[0-9]/ {v=$6} END {if (v!="") printf "%.3f\n", v/1000}' "$1"; }  # MB/s (10^6) -> GB/s
ucx_lat() { awk '$1 ~ /^[0-9]+$/ && NF>=8 {print $2, $3; exit}' "$1"; } # 50%ile average (usec)
sr_rate() { awk '/^ #bytes/ {getline; printf "%.4f\n", $5; exit}' "$1"; }  # MsgRate [Mpps]
sp_rate() { sed 's/\x1b\[[0-9;]*m//g' "$1" | awk '/Message Rate is/ {printf "%.4f\n", $(NF-1)/1e6}' | tail -1; }  # M msg/s
ucx_rate() { awk '$1 ~ /^[0-9]+$/ && NF>=8 {printf "%.4f\n", $NF/1e6; exit}' "$1"; }  # overall msg/s -> M msg/s
ucx_bw() { awk '$1 ~ /^[0-9]+$/ && NF>=8 {printf "%.3f\n", $5*1048576/1e9; exit}' "$1"; }  # MiB/s -> GB/s

round() {
    local r=$1 v
    log "round $r/$ROUNDS"

    # --- UDP, 8 B latency ---
    next_port
    if pair "sr_udp_lat.$r" 60 40 "$SOFTRDMA perf write_lat --server -p $PORT --transport udp" \
        "$SOFTRDMA perf write_lat 127.0.0.1 -p $PORT -s 8 -n 20000 --transport udp"; then
        v=$(sr_lat "$WORK/sr_udp_lat.$r.out"); record sr_udp_lat_med "${v% *}"; record sr_udp_lat_avg "${v#* }"
    fi
    if [ -x "$WORK/udp_floor" ]; then
        next_port; next_port
        record udp_floor1 "$(taskset -c $SRV_CPU,$CLI_CPU timeout 30 "$WORK/udp_floor" 1 $PORT | awk '/one-way/ {print $2}')"
        next_port; next_port
        record udp_floor2 "$(taskset -c $SRV_CPU,$CLI_CPU timeout 30 "$WORK/udp_floor" 2 $PORT | awk '/one-way/ {print $2}')"
    fi
    if have sockperf; then
        next_port
        pair "sp_udp.$r" 30 20 "sockperf server -i 127.0.0.1 -p $PORT --nonblocked" \
            "sockperf ping-pong -i 127.0.0.1 -p $PORT --nonblocked -m 64 -t 3"
        v=$(sp_lat "$WORK/sp_udp.$r.out"); record sp_udp_med "${v% *}"; record sp_udp_avg "${v#* }"
    fi
    if have fi_pingpong; then
        next_port
        pair "fi_udp.$r" 40 30 "fi_pingpong -p udp -e dgram -d lo -S 8 -I 10000 -B $PORT" \
            "fi_pingpong -p udp -e dgram -d lo -S 8 -I 10000 -P $PORT 127.0.0.1"
        record fi_udp_lat "$(fi_lat "$WORK/fi_udp.$r.out")"
        next_port
        pair "fi_net_lat.$r" 40 30 "fi_pingpong -p net -e msg -d lo -S 8 -I 10000 -B $PORT" \
            "fi_pingpong -p net -e msg -d lo -S 8 -I 10000 -P $PORT 127.0.0.1"
        record fi_net_lat "$(fi_lat "$WORK/fi_net_lat.$r.out")"
    fi

    # --- UDP, 1 MiB bandwidth ---
    next_port
    if pair "sr_udp_bw.$r" 90 60 "$SOFTRDMA perf write_bw --server -p $PORT --transport udp" \
        "$SOFTRDMA perf write_bw 127.0.0.1 -p $PORT -s 1048576 -n 2000 --transport udp"; then
        record sr_udp_bw "$(sr_bw "$WORK/sr_udp_bw.$r.out")"
    fi
    if have fi_pingpong; then
        next_port
        pair "fi_net_bw.$r" 60 45 "fi_pingpong -p net -e msg -d lo -S 1048576 -I 1000 -B $PORT" \
            "fi_pingpong -p net -e msg -d lo -S 1048576 -I 1000 -P $PORT 127.0.0.1"
        record fi_net_bw "$(fi_bw "$WORK/fi_net_bw.$r.out")"
    fi

    # --- UDP, 8 B message rate ---
    next_port
    if pair "sr_udp_rate.$r" 90 60 "$SOFTRDMA perf write_bw --server -p $PORT --transport udp" \
        "$SOFTRDMA perf write_bw 127.0.0.1 -p $PORT -s 8 -n 300000 --transport udp"; then
        record sr_udp_rate "$(sr_rate "$WORK/sr_udp_rate.$r.out")"
    fi
    if have sockperf; then
        next_port
        pair "sp_rate.$r" 30 20 "sockperf server -i 127.0.0.1 -p $PORT" \
            "sockperf throughput -i 127.0.0.1 -p $PORT -m 64 --mps=max -t 3"
        record sp_rate "$(sp_rate "$WORK/sp_rate.$r.out")"
    fi

    # --- shared memory ---
    if [ -x "$WORK/shm_floor" ]; then
        record shm_floor "$(timeout 30 "$WORK/shm_floor" 1000000 | awk '/one-way/ {print $2}')"
    fi
    next_port
    if pair "sr_shm_lat.$r" 60 40 "$SOFTRDMA perf write_lat --server -p $PORT --transport shm" \
        "$SOFTRDMA perf write_lat 127.0.0.1 -p $PORT -s 8 -n 100000 --transport shm"; then
        v=$(sr_lat "$WORK/sr_shm_lat.$r.out"); record sr_shm_lat_med "${v% *}"; record sr_shm_lat_avg "${v#* }"
    fi
    for t in read atomic; do
        next_port
        if pair "sr_shm_$t.$r" 60 40 "$SOFTRDMA perf ${t}_lat --server -p $PORT --transport shm" \
            "$SOFTRDMA perf ${t}_lat 127.0.0.1 -p $PORT -s 8 -n 100000 --transport shm"; then
            v=$(sr_lat "$WORK/sr_shm_$t.$r.out"); record "sr_shm_${t}_med" "${v% *}"
        fi
    done
    next_port
    if pair "sr_shm_bw.$r" 90 60 "$SOFTRDMA perf write_bw --server -p $PORT --transport shm" \
        "$SOFTRDMA perf write_bw 127.0.0.1 -p $PORT -s 1048576 -n 5000 --transport shm"; then
        record sr_shm_bw "$(sr_bw "$WORK/sr_shm_bw.$r.out")"
    fi
    next_port
    if pair "sr_shm_rate.$r" 90 60 "$SOFTRDMA perf write_bw --server -p $PORT --transport shm" \
        "$SOFTRDMA perf write_bw 127.0.0.1 -p $PORT -s 8 -n 3000000 --transport shm"; then
        record sr_shm_rate "$(sr_rate "$WORK/sr_shm_rate.$r.out")"
    fi
    if have ucx_perftest; then
        next_port
        pair "ucx_rate.$r" 45 30 "env UCX_TLS=posix,self ucx_perftest -p $PORT -c $SRV_CPU" \
            "env UCX_TLS=posix,self ucx_perftest 127.0.0.1 -p $PORT -c $CLI_CPU -t ucp_put_bw -s 8 -n 3000000 -w 100000 -f"
        record ucx_rate "$(ucx_rate "$WORK/ucx_rate.$r.out")"
        next_port
        pair "ucx_lat.$r" 45 30 "env UCX_TLS=posix,self ucx_perftest -p $PORT -c $SRV_CPU" \
            "env UCX_TLS=posix,self ucx_perftest 127.0.0.1 -p $PORT -c $CLI_CPU -t ucp_put_lat -s 8 -n 1000000 -w 100000 -f"
        v=$(ucx_lat "$WORK/ucx_lat.$r.out"); record ucx_lat_med "${v% *}"; record ucx_lat_avg "${v#* }"
        next_port
        pair "ucx_bw.$r" 45 30 "env UCX_TLS=posix,self ucx_perftest -p $PORT -c $SRV_CPU" \
            "env UCX_TLS=posix,self ucx_perftest 127.0.0.1 -p $PORT -c $CLI_CPU -t ucp_put_bw -s 1048576 -n 5000 -w 500 -f"
        record ucx_bw "$(ucx_bw "$WORK/ucx_bw.$r.out")"
        for t in get fadd; do
            next_port
            pair "ucx_$t.$r" 45 30 "env UCX_TLS=posix,self ucx_perftest -p $PORT -c $SRV_CPU" \
                "env UCX_TLS=posix,self ucx_perftest 127.0.0.1 -p $PORT -c $CLI_CPU -t ucp_$t -s 8 -n 1000000 -w 100000 -f"
            v=$(ucx_lat "$WORK/ucx_$t.$r.out"); record "ucx_${t}_med" "${v% *}"
        done
    fi
    if have fi_pingpong; then
        next_port
        pair "fi_shm_lat.$r" 40 30 "fi_pingpong -p shm -e rdm -S 8 -I 10000 -B $PORT" \
            "fi_pingpong -p shm -e rdm -S 8 -I 10000 -P $PORT 127.0.0.1"
        record fi_shm_lat "$(fi_lat "$WORK/fi_shm_lat.$r.out")"
        next_port
        pair "fi_shm_bw.$r" 60 45 "fi_pingpong -p shm -e rdm -S 1048576 -I 1000 -B $PORT" \
            "fi_pingpong -p shm -e rdm -S 1048576 -I 1000 -P $PORT 127.0.0.1"
        record fi_shm_bw "$(fi_bw "$WORK/fi_shm_bw.$r.out")"
    fi
}

if have cc; then
    cc -O2 -o "$WORK/shm_floor" bench/shm_floor.c || log "bench/shm_floor.c did not build"
    cc -O2 -o "$WORK/udp_floor" bench/udp_floor.c || log "bench/udp_floor.c did not build"
fi

for r in $(seq 1 "$ROUNDS"); do round "$r"; done

# --- the table ---
ratio() { # a b -> a/b with 2 decimals, or "–"
    if [ -n "$1" ] && [ -n "$2" ]; then awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a/b; else print "–"}'; else echo "–"; fi
}
val() { if [ -n "$1" ]; then echo "$1 $2"; else echo "not measured"; fi }
goal() { # ratio op limit
    [ "$1" = "–" ] && { echo "–"; return; }
    awk -v r="$1" -v l="$3" -v op="$2" 'BEGIN {ok = (op == "le") ? (r <= l) : (r >= l); print (ok ? "met" : "not met")}'
}

SRL=$(median sr_udp_lat_med); SRLA=$(median sr_udp_lat_avg)
SPL=$(median sp_udp_med); SPLA=$(median sp_udp_avg)
FUL=$(median fi_udp_lat); FNL=$(median fi_net_lat)
SRB=$(median sr_udp_bw); FNB=$(median fi_net_bw)
UF1=$(median udp_floor1); UF2=$(median udp_floor2)
SSL=$(median sr_shm_lat_med); SSLA=$(median sr_shm_lat_avg); SSB=$(median sr_shm_bw)
UL=$(median ucx_lat_med); ULA=$(median ucx_lat_avg); UB=$(median ucx_bw)
FSL=$(median fi_shm_lat); FSB=$(median fi_shm_bw)
SRR=$(median sr_shm_read_med); SRA=$(median sr_shm_atomic_med)
SUR=$(median sr_udp_rate); SPR=$(median sp_rate); SSR=$(median sr_shm_rate); UR=$(median ucx_rate)
UG=$(median ucx_get_med); UF=$(median ucx_fadd_med); SF=$(median shm_floor)
miss() { have "$1" || echo " ($1 not installed)"; }

R1=$(ratio "$SRL" "$SPL"); R1A=$(ratio "$SRLA" "$SPLA"); R5=$(ratio "$SRB" "$FNB")
R6=$(ratio "$SSL" "$UL"); R7=$(ratio "$SSB" "$UB")
echo
echo "Medians of $ROUNDS rounds; server on CPU $SRV_CPU, client on CPU $CLI_CPU; latency is half a round trip."
echo
echo "| path | measure | softrdma | peer | peer value | softrdma / peer | goal |"
echo "|---|---|---|---|---|---|---|"
echo "| UDP | 8 B latency, median | $(val "$SRL" µs) | sockperf UDP busy-poll (64 B), median$(miss sockperf) | $(val "$SPL" µs) | $R1 | ≤ 1.25: $(goal "$R1" le 1.25) |"
echo "| UDP | 8 B latency, average | $(val "$SRLA" µs) | sockperf UDP busy-poll (64 B), average | $(val "$SPLA" µs) | $R1A | ≤ 1.25: $(goal "$R1A" le 1.25) |"
echo "| UDP | 8 B latency | $(val "$SRL" µs) | fi_pingpong udp dgram (average)$(miss fi_pingpong) | $(val "$FUL" µs) | $(ratio "$SRL" "$FUL") | – |"
echo "| UDP | 8 B latency | $(val "$SRL" µs) | fi_pingpong net msg (average) | $(val "$FNL" µs) | $(ratio "$SRL" "$FNL") | – |"
echo "| UDP | 8 B latency | $(val "$SRL" µs) | floor, one datagram per turn, bench/udp_floor.c 1 (average)$(have cc || echo ' (no cc)') | $(val "$UF1" µs) | $(ratio "$SRL" "$UF1") | – |"
echo "| UDP | 8 B latency | $(val "$SRL" µs) | floor, WRITE + ACK per turn (GSO), bench/udp_floor.c 2 (average) | $(val "$UF2" µs) | $(ratio "$SRL" "$UF2") | – |"
echo "| UDP | (floors) 8 B latency | $(val "$UF2" µs) | floor with WRITE + ACK against sockperf, median | $(val "$SPL" µs) | $(ratio "$UF2" "$SPL") | – |"
echo "| UDP | 1 MiB bandwidth | $(val "$SRB" GB/s) | fi_pingpong net msg 1 MiB | $(val "$FNB" GB/s) | $R5 | ≥ 1.0: $(goal "$R5" ge 1.0) |"
echo "| UDP | 8 B message rate | $(val "$SUR" Mpps) | sockperf throughput (64 B, --mps=max), sender's rate | $(val "$SPR" M/s) | $(ratio "$SUR" "$SPR") | ≥ 2.0: $(goal "$(ratio "$SUR" "$SPR")" ge 2.0) |"
echo "| shm | 8 B message rate | $(val "$SSR" Mpps) | UCX ucp_put_bw posix 8 B, overall | $(val "$UR" M/s) | $(ratio "$SSR" "$UR") | ≥ 0.8: $(goal "$(ratio "$SSR" "$UR")" ge 0.8) |"
echo "| shm | 8 B latency, median | $(val "$SSL" µs) | UCX ucp_put_lat posix, median$(miss ucx_perftest) | $(val "$UL" µs) | $R6 | ≤ 1.0: $(goal "$R6" le 1.0) |"
echo "| shm | 8 B latency, average | $(val "$SSLA" µs) | UCX ucp_put_lat posix, average | $(val "$ULA" µs) | $(ratio "$SSLA" "$ULA") | – |"
echo "| shm | 8 B latency | $(val "$SSL" µs) | fi_pingpong shm rdm (average) | $(val "$FSL" µs) | $(ratio "$SSL" "$FSL") | – |"
echo "| shm | 8 B latency | $(val "$SSL" µs) | raw store-and-spin floor, bench/shm_floor.c (average)$(have cc || echo ' (no cc)') | $(val "$SF" µs) | $(ratio "$SSL" "$SF") | – |"
echo "| shm | (UCX) 8 B latency | $(val "$UL" µs) | the same floor | $(val "$SF" µs) | $(ratio "$UL" "$SF") | – |"
echo "| shm | 1 MiB bandwidth | $(val "$SSB" GB/s) | UCX ucp_put_bw posix | $(val "$UB" GB/s) | $R7 | ≥ 0.9: $(goal "$R7" ge 0.9) |"
echo "| shm | 1 MiB bandwidth | $(val "$SSB" GB/s) | fi_pingpong shm rdm 1 MiB | $(val "$FSB" GB/s) | $(ratio "$SSB" "$FSB") | – |"
echo "| shm | 8 B READ, per operation, median | $(val "$SRR" µs) | UCX ucp_get posix (8 B), median | $(val "$UG" µs) | $(ratio "$SRR" "$UG") | – |"
echo "| shm | 8 B fetch-and-add, per operation, median | $(val "$SRA" µs) | UCX ucp_fadd posix, median | $(val "$UF" µs) | $(ratio "$SRA" "$UF") | – |"
echo
echo "softrdma: median = perftest's t_typical, average = t_avg; bandwidth = BW average (perftest's MB = 2^20 B, shown here in GB = 10^9 B)."
echo "fi_pingpong: usec/xfer and MB/sec (10^6 B) of a ping-pong; UCX: 50%ile and average, MB/s (2^20 B) converted to GB/s."
