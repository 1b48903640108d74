#!/usr/bin/env bash
# The fabric simulator's speed against htsim's figures (measured earlier
# on this 2-vCPU machine, issue 25): the committed 1,024-host scenarios
# run one at a time, each ROUNDS times (1), whole on one thread
# (--partitions 1) and then split as committed (two parts) on two
# threads, and their figures printed:
# simulated makespan, events, wall and CPU time (perf stat task-clock when
# perf is there, else /usr/bin/time), events per second and peak RSS (the
# simulator's own summary line), and wall-time speed-up over htsim.
#
#   bench/fabric.sh                 permutation + recursive doubling
#   RING=1 bench/fabric.sh          + the 64 MiB ring on 1,024 GPUs
#   PAIR=1 bench/fabric.sh          + both scenarios at once (--threads 2)
#
# Environment: SOFTRDMA=path of the softrdma binary (default: built here
# with cargo build --release), ROUNDS=1, TIMEOUT=900 (s, per run),
# KEEP=1 keeps the raw outputs. The machine is shared: wall times move
# with its load (printed), CPU time much less.

set -u
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-1}
TIMEOUT=${TIMEOUT:-900}
BENCH=fabric
. bench/lib.sh
if [ -z "${SOFTRDMA:-}" ]; then
    log "building softrdma (cargo build --release -p softrdma-cli)"
    cargo build --release -q -p softrdma-cli || exit 1
    SOFTRDMA=${CARGO_TARGET_DIR:-target}/release/softrdma
fi
S=crates/softrdma-fabric/scenarios
PERF=
command -v perf >/dev/null && perf stat -e task-clock true >/dev/null 2>&1 && PERF=1

# run NAME HTSIM_WALL_S SCENARIO...: one run, one line of figures.
run() {
    local name=$1 htsim=$2; shift 2
    local out=$WORK/$name.out stat=$WORK/$name.stat load cpu wall
    load=$(cut -d' ' -f1 /proc/loadavg)
    local t0; t0=$(date +%s.%N)
    if [ -n "$PERF" ]; then
        timeout "$TIMEOUT" perf stat -x, -e task-clock -o "$stat" "$SOFTRDMA" fabric "$@" >"$out" 2>&1
    else
        timeout "$TIMEOUT" /usr/bin/time -f '%U %S' -o "$stat" "$SOFTRDMA" fabric "$@" >"$out" 2>&1
    fi
    local rc=$?
    wall=$(echo "$(date +%s.%N) - $t0" | bc -l)
    if [ -n "$PERF" ]; then
        cpu=$(awk -F, '/task-clock/ {printf "%.2f", $1 / 1000}' "$stat")
    else
        cpu=$(awk '{printf "%.2f", $1 + $2}' "$stat")
    fi
    [ $rc = 0 ] || log "$name: exit $rc (124: timed out after $TIMEOUT s)"
    grep -E "makespan|simulator:|NOT COMPLETED" "$out" | sed 's/^ */    /' >&2
    printf '%-34s wall %7.2f s  cpu %7.2f s  load %5s  htsim %6s s  speed-up (wall) %s\n' \
        "$name" "$wall" "$cpu" "$load" "$htsim" \
        "$(echo "scale=1; $htsim / $wall" | bc -l)x"
}

for r in $(seq 1 "$ROUNDS"); do
    log "round $r/$ROUNDS"
    for t in whole split; do
        if [ $t = whole ]; then opts="--partitions 1 --threads 1"; else opts="--threads 2"; fi
        run permutation_2MB_1024_$t 23.5 $opts $S/htsim_permutation_1024.json
        run recursive_doubling_10x1MB_1024_$t 107 $opts $S/htsim_recursive_doubling_1024.json
    done
    if [ "${PAIR:-0}" = 1 ]; then
        run both_at_once_whole_threads_2 130.5 --partitions 1 --threads 2 \
            $S/htsim_permutation_1024.json $S/htsim_recursive_doubling_1024.json
    fi
    if [ "${RING:-0}" = 1 ]; then
        run ring_64MiB_1024_whole 1800 --partitions 1 --threads 1 $S/ring_allreduce_1024_64MiB.json
        run ring_64MiB_1024_split 1800 --threads 2 $S/ring_allreduce_1024_64MiB.json
    fi
done
