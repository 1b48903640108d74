#!/usr/bin/env bash
# The HPC stack on softrdma's drop-in libibverbs.so.1 and librdmacm.so.1,
# next to the same client over its own shared-memory or TCP transport, in
# one run on this machine (docs/ecosystem.md). Each row runs ROUNDS times
# (default 3), the rows alternating within a round; the table shows the
# median of the rounds and its ratio to the client's own transport.
#
#   UCX ucx_perftest: ucp_put_lat and ucp_am_lat 8 B (median, us),
#     ucp_put_bw 64 KiB (MB/s): softrdma rc_verbs,ud_verbs over UDP and over
#     shm, softrdma ud_verbs over UDP; UCX posix (shared memory) and tcp.
#   Open MPI, tests/c/mpi_check.c on 2 ranks: 4 KiB ping-pong (half round
#     trip, us) and 1 MiB float32 MPI_Allreduce (ms): pml ucx on softrdma
#     over UDP and over shm; pml ob1 with btl vader (shared memory) and tcp.
#   libfabric fi_pingpong, 1000 transfers (usec/xfer as it prints): 4 KiB
#     verbs rdm on softrdma over UDP vs tcp;ofi_rxm rdm; 1 KiB verbs dgram
#     vs the udp provider's dgram (at most an MTU).
#
# Servers are pinned to CPU 0 and clients to CPU 1; every command is bounded
# by `timeout` and run in a process group of its own that is killed after.
# UCX runs under interop/ecosystem/devnode.sh (UCX's /dev/infiniband check).
# Installs nothing; missing clients are reported. On Debian:
#   apt-get install -y ucx-utils libfabric-bin openmpi-bin libopenmpi-dev
# Environment: ROUNDS=3; LIBDIR=a directory holding libibverbs.so.1 and
# librdmacm.so.1 (default: built here with cargo build --release); KEEP=1
# keeps the raw outputs.

set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
ROUNDS=${ROUNDS:-3}
WORK=$(mktemp -d /tmp/softrdma-ecosystem.XXXXXX)
PORT=$((20000 + RANDOM % 20000))
DEVNODE=$ROOT/interop/ecosystem/devnode.sh

log() { printf '%s\n' "$*" >&2; }
have() { command -v "$1" >/dev/null 2>&1; }
next_port() { PORT=$((PORT + 1)); }
cleanup() {
    if [ "${KEEP:-0}" = 1 ]; then log "raw outputs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -z "${LIBDIR:-}" ]; then
    log "building the drop-ins (cargo build --release -p softrdma-ibverbs -p softrdma-rdmacm)"
    cargo build --release -q -p softrdma-ibverbs -p softrdma-rdmacm || exit 1
    T=${CARGO_TARGET_DIR:-$ROOT/target}/release
    LIBDIR=$WORK/lib
    mkdir -p "$LIBDIR"
    ln -s "$T/libibverbs.so" "$LIBDIR/libibverbs.so.1"
    ln -s "$T/librdmacm.so" "$LIBDIR/librdmacm.so.1"
fi
SOFT="env LD_LIBRARY_PATH=$LIBDIR UCX_NET_DEVICES=srx0:1"

# bounded CPU SECONDS OUT "command": runs command pinned to CPU in a process
# group of its own (setsid), killed whole after SECONDS; output to OUT.
bounded() {
    local cpu=$1 secs=$2 out=$3 cmd=$4
    setsid taskset -c "$cpu" timeout -s KILL "$secs" sh -c "exec $cmd" >"$out" 2>&1
}

# pair NAME "server command" "client command": the client's output is
# $WORK/NAME.out; the server's process group is killed after the client.
pair() {
    local name=$1 srv=$2 cli=$3 pid
    setsid taskset -c 0 timeout -s KILL 60 sh -c "exec $srv" >"$WORK/$name.srv" 2>&1 &
    pid=$!
    sleep 0.7
    bounded 1 45 "$WORK/$name.out" "$cli"
    sleep 0.3
    kill -KILL -- "-$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}

# Medians per row: record ROW VALUE appends; median ROW prints.
record() { [ -n "$2" ] && printf '%s\n' "$2" >>"$WORK/rows.$1"; }
median() {
    [ -s "$WORK/rows.$1" ] || { echo "-"; return; }
    sort -g "$WORK/rows.$1" | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'
}
ratio() {
    local a b
    a=$(median "$1")
    b=$(median "$2")
    if [ "$a" = "-" ] || [ "$b" = "-" ]; then echo "-"; else awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f", a / b}'; fi
}

# ucx_perftest's -f line: iterations, 50%ile, average, overall (us), MB/s avg, overall, ...
ucx_median() { awk '$1 ~ /^[0-9]+$/ && NF>=8 {print $2; exit}' "$1"; }
ucx_mbs() { awk '$1 ~ /^[0-9]+$/ && NF>=8 {print $6; exit}' "$1"; }
ucx_row() {   # ucx_row ROW ENV TEST SIZE WRAP
    local row=$1 envs=$2 test=$3 size=$4 wrap=$5 n=20000
    [ "$test" = ucp_put_bw ] && n=2000
    next_port
    pair "$row.$r" "$envs $wrap ucx_perftest -p $PORT" \
        "$envs $wrap ucx_perftest 127.0.0.1 -p $PORT -t $test -s $size -n $n -w 100 -f"
    if [ "$test" = ucp_put_bw ]; then
        record "$row" "$(ucx_mbs "$WORK/$row.$r.out")"
    else
        record "$row" "$(ucx_median "$WORK/$row.$r.out")"
    fi
}

MPI_CHECK=
if have mpicc && have mpirun; then
    MPI_CHECK=$WORK/mpi_check
    mpicc -O2 -o "$MPI_CHECK" crates/softrdma-rdmacm/tests/c/mpi_check.c || MPI_CHECK=
fi
mpi_row() {   # mpi_row ROW "env" "mca args"
    local row=$1 envs=$2 mca=$3 out=$WORK/$1.$r.out
    # Two ranks on two CPUs, one each (no --oversubscribe: that makes idle
    # ranks yield, which measures the machine's other load).
    setsid timeout -s KILL 120 sh -c "exec $envs mpirun --allow-run-as-root -np 2 --bind-to core $mca $MPI_CHECK" >"$out" 2>&1
    record "$row.pp" "$(sed -n 's/^mpi_check: ok .*pingpong_us=\([0-9.]*\).*/\1/p' "$out")"
    record "$row.ar" "$(sed -n 's/^mpi_check: ok .*allreduce_ms=\([0-9.]*\).*/\1/p' "$out")"
}

fi_row() {   # fi_row ROW "env" "provider" EP SIZE
    local row=$1 envs=$2 prov=$3 ep=$4 size=$5
    next_port
    pair "$row.$r" "$envs fi_pingpong -p '$prov' -e $ep -S $size -I 1000 -B $PORT" \
        "$envs fi_pingpong -p '$prov' -e $ep -S $size -I 1000 -P $PORT 127.0.0.1"
    record "$row" "$(awk '$1 ~ /^[0-9]+k?$/ && $3 ~ /^=/ {print $7; exit}' "$WORK/$row.$r.out")"
}

for r in $(seq 1 "$ROUNDS"); do
    log "round $r/$ROUNDS"
    if have ucx_perftest; then
        for t in ucp_put_lat:8 ucp_am_lat:8 ucp_put_bw:65536; do
            test=${t%%:*} size=${t##*:}
            ucx_row "ucx.$test.rc_udp" "$SOFT UCX_TLS=rc_verbs,ud_verbs SOFTRDMA_TRANSPORT=udp" "$test" "$size" "$DEVNODE"
            ucx_row "ucx.$test.rc_shm" "$SOFT UCX_TLS=rc_verbs,ud_verbs SOFTRDMA_TRANSPORT=shm" "$test" "$size" "$DEVNODE"
            ucx_row "ucx.$test.ud_udp" "$SOFT UCX_TLS=ud_verbs SOFTRDMA_TRANSPORT=udp" "$test" "$size" "$DEVNODE"
            ucx_row "ucx.$test.posix" "env UCX_TLS=posix,self" "$test" "$size" ""
            ucx_row "ucx.$test.tcp" "env UCX_TLS=tcp,self UCX_NET_DEVICES=lo" "$test" "$size" ""
        done
    fi
    if [ -n "$MPI_CHECK" ]; then
        mpi_row mpi.ucx_udp "$SOFT SOFTRDMA_TRANSPORT=udp $DEVNODE" "--mca pml ucx --mca btl self -x UCX_TLS=rc_verbs,ud_verbs -x UCX_NET_DEVICES -x LD_LIBRARY_PATH -x SOFTRDMA_TRANSPORT"
        mpi_row mpi.ucx_shm "$SOFT SOFTRDMA_TRANSPORT=auto $DEVNODE" "--mca pml ucx --mca btl self -x UCX_TLS=rc_verbs,ud_verbs -x UCX_NET_DEVICES -x LD_LIBRARY_PATH -x SOFTRDMA_TRANSPORT"
        mpi_row mpi.vader "env" "--mca pml ob1 --mca btl self,vader"
        mpi_row mpi.tcp "env" "--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo"
    fi
    if have fi_pingpong; then
        fi_row fi.verbs_rdm "$SOFT SOFTRDMA_TRANSPORT=udp" verbs rdm 4096
        fi_row fi.verbs_dgram "$SOFT SOFTRDMA_TRANSPORT=udp" verbs dgram 1024
        fi_row fi.tcp_rdm "env" "tcp;ofi_rxm" rdm 4096
        # The udp provider's datagrams are at most an Ethernet MTU.
        fi_row fi.udp_dgram "env" udp dgram 1024
    fi
done

printf '\n%-44s %12s %12s\n' "client, transport, measure" "median" "vs own"
row() { printf '%-44s %12s %12s\n' "$1" "$(median "$2")" "${3:+$(ratio "$2" "$3")}"; }
for t in ucp_put_lat ucp_am_lat ucp_put_bw; do
    unit="us (median)"
    [ "$t" = ucp_put_bw ] && unit="MB/s, 64 KiB"
    echo "UCX $t, $unit"
    row "  softrdma rc_verbs, UDP" "ucx.$t.rc_udp" "ucx.$t.tcp"
    row "  softrdma rc_verbs, shm" "ucx.$t.rc_shm" "ucx.$t.posix"
    row "  softrdma ud_verbs, UDP" "ucx.$t.ud_udp" "ucx.$t.tcp"
    row "  UCX posix (shared memory)" "ucx.$t.posix" ""
    row "  UCX tcp (loopback)" "ucx.$t.tcp" ""
done
echo "Open MPI 2 ranks, 4 KiB ping-pong us (half round trip)"
row "  pml ucx on softrdma, UDP" mpi.ucx_udp.pp mpi.tcp.pp
row "  pml ucx on softrdma, shm" mpi.ucx_shm.pp mpi.vader.pp
row "  pml ob1 btl vader" mpi.vader.pp ""
row "  pml ob1 btl tcp" mpi.tcp.pp ""
echo "Open MPI 2 ranks, 1 MiB float32 MPI_Allreduce ms"
row "  pml ucx on softrdma, UDP" mpi.ucx_udp.ar mpi.tcp.ar
row "  pml ucx on softrdma, shm" mpi.ucx_shm.ar mpi.vader.ar
row "  pml ob1 btl vader" mpi.vader.ar ""
row "  pml ob1 btl tcp" mpi.tcp.ar ""
echo "libfabric fi_pingpong, usec/xfer"
row "  verbs rdm (ofi_rxd) on softrdma, UDP, 4 KiB" fi.verbs_rdm fi.tcp_rdm
row "  tcp;ofi_rxm rdm, 4 KiB" fi.tcp_rdm ""
row "  verbs dgram on softrdma, UDP, 1 KiB" fi.verbs_dgram fi.udp_dgram
row "  udp dgram, 1 KiB" fi.udp_dgram ""
echo "(vs own: softrdma's figure / the client's own transport's; for latencies lower is better, for MB/s higher)"
