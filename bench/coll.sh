#!/usr/bin/env bash
# softrdma coll all_reduce_perf against Open MPI's MPI_Allreduce, in one run
# on this machine, 2 ranks, float sum, 8 B .. 64 MiB (x4 steps by default):
#   softrdma over the same-host path (shm) and over RoCEv2/UDP, each with
#   the cost model's choice;
#   Open MPI (bench/mpi_allreduce.c, built with mpicc) with its tuned
#   component's algorithm forced (--mca coll_tuned_use_dynamic_rules 1
#   --mca coll_tuned_allreduce_algorithm N: 0 default decision, 3 recursive
#   doubling, 4 ring, 6 Rabenseifner) over vader (shared memory) and over
#   tcp (loopback);
#   Gloo (bench/gloo_allreduce.cc, built with g++ against Debian's
#   libgloo-dev): its TCP transport, and its ibverbs transport on softrdma's
#   drop-in libibverbs.so.1 (LIBDIR, default built here) over the same-host
#   path and over UDP, ring and halving-doubling in turn (2 ranks only).
# Prints each table, then per size: softrdma shm busbw against the best
# vader algorithm, softrdma udp against the best tcp one, and the ratios
# (time ratios for sizes below 1 MiB, busbw ratios from 1 MiB up).
# Draws the busbw curves to $SVG (default docs/coll-busbw.svg).
# Then in-network aggregation against the best host algorithm at
# AGG_RANKS ranks (default "8 16", processes on this host, same-host path):
# a `softrdma aggd` per run, 8 B latency and 16 MiB busbw, ring, rhd and
# tree forced in turn for the host's best (AGG_ITERS=10 iterations,
# SOFTRDMA_COLL_SPIN=${AGG_SPIN:-200}: the ranks oversubscribe the cores).
# And the physical floor: one core's memcpy bandwidth at 64 MiB (cc).
#
# Environment: AGG_RANKS="" skips the in-network part; SOFTRDMA=path of the softrdma binary (default: built here
# with cargo build --release), MIN=8 MAX=67108864 STEP=4 ITERS=20 WARM=5,
# RANKS=2, SVG=docs/coll-busbw.svg, KEEP=1 keeps the raw outputs.
# Installs nothing; without mpicc/mpirun (Debian: openmpi-bin
# libopenmpi-dev) the MPI rows say so.

set -u
cd "$(dirname "$0")/.."

MIN=${MIN:-8}
MAX=${MAX:-67108864}
STEP=${STEP:-4}
ITERS=${ITERS:-20}
WARM=${WARM:-5}
RANKS=${RANKS:-2}
SVG=${SVG:-docs/coll-busbw.svg}
OUT=$(mktemp -d /tmp/softrdma-coll-bench.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$OUT"' EXIT

if [ -z "${SOFTRDMA:-}" ]; then
    cargo build --release -q -p softrdma-cli || exit 2
    SOFTRDMA=${CARGO_TARGET_DIR:-target}/release/softrdma
fi

echo "# $(date -u +%FT%TZ) $(uname -n), $(nproc) cores, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $RANKS ranks, float sum, $MIN..$MAX bytes x$STEP, $ITERS iterations after $WARM warm-up"

run() { # label, command...
    local label=$1; shift
    echo "## $label"
    timeout 600 "$@" >"$OUT/$label.txt" 2>"$OUT/$label.err" || echo "# $label failed: $(tail -2 "$OUT/$label.err")"
    grep -v '^#' "$OUT/$label.txt" | sed 's/^/  /'
}

MPI=()
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
    mpicc -O2 -o "$OUT/mpi_allreduce" bench/mpi_allreduce.c || exit 2
    MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np "$RANKS" --mca pml ob1)
    for btl in vader tcp; do
        for alg in 0 3 4 6; do
            run "mpi-$btl-$alg" "${MPIRUN[@]}" --mca btl "self,$btl" \
                --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm "$alg" \
                "$OUT/mpi_allreduce" "$MIN" "$MAX" "$STEP" "$ITERS" "$WARM"
            MPI+=("mpi-$btl-$alg")
        done
    done
else
    echo "# Open MPI (mpicc, mpirun) not installed: no MPI rows"
fi

# Gloo (Debian libgloo-dev, bench/gloo_allreduce.cc): its TCP transport,
# and its ibverbs transport on softrdma's drop-in libibverbs.so.1 over the
# same-host path and over UDP; ring (AllreduceRingChunked) and halving-
# doubling in turn, the best per size reported.
GLOO=()
gloo() { # label, algo, transport, env...
    local label=$1 algo=$2 transport=$3; shift 3
    local store="$OUT/store-$label"
    mkdir -p "$store"
    echo "## $label"
    env "$@" timeout 600 "$OUT/gloo_allreduce" 1 "$RANKS" "$store" "$transport" "$algo" \
        "$MIN" "$MAX" "$STEP" "$ITERS" "$WARM" >/dev/null 2>"$OUT/$label.err1" &
    local peer=$!
    env "$@" timeout 600 "$OUT/gloo_allreduce" 0 "$RANKS" "$store" "$transport" "$algo" \
        "$MIN" "$MAX" "$STEP" "$ITERS" "$WARM" >"$OUT/$label.txt" 2>"$OUT/$label.err" ||
        echo "# $label failed: $(tail -2 "$OUT/$label.err")"
    wait "$peer" || echo "# $label: rank 1 failed: $(tail -2 "$OUT/$label.err1")"
    sed 's/^/  /' "$OUT/$label.txt"
    GLOO+=("$label")
}
if [ "$RANKS" = 2 ] && command -v g++ >/dev/null && [ -e /usr/include/gloo/allreduce_ring_chunked.h ]; then
    if g++ -O2 -o "$OUT/gloo_allreduce" bench/gloo_allreduce.cc -lgloo; then
        if [ -z "${LIBDIR:-}" ]; then
            cargo build --release -q -p softrdma-ibverbs || exit 2
            LIBDIR=$OUT/lib
            mkdir -p "$LIBDIR"
            ln -sf "$(realpath "${CARGO_TARGET_DIR:-target}/release/libibverbs.so")" "$LIBDIR/libibverbs.so.1"
        fi
        for algo in ring hd; do
            gloo "gloo-tcp-$algo" "$algo" tcp
            for t in shm udp; do
                gloo "gloo-ibverbs-$t-$algo" "$algo" ibverbs LD_LIBRARY_PATH="$LIBDIR" SOFTRDMA_TRANSPORT="$t"
            done
        done
    fi
else
    echo "# Gloo (g++, libgloo-dev) not installed, or RANKS is not 2: no Gloo rows"
fi

for t in shm udp; do
    run "softrdma-$t" "$SOFTRDMA" coll all_reduce_perf --ranks "$RANKS" --transport "$t" \
        -b "$MIN" -e "$MAX" -f "$STEP" -n "$ITERS" -w "$WARM"
done

# size -> time (us) and busbw, per table: softrdma in-place columns 9/11,
# MPI's columns 2/4 (0-based).
python3 - "$OUT" "${MPI[@]}" "${GLOO[@]}" <<'PY'
import sys, os
out = sys.argv[1]
mpi = [a for a in sys.argv[2:] if a.startswith("mpi-")]
gloo = [a for a in sys.argv[2:] if a.startswith("gloo-")]
def table(name):
    rows = {}
    p = os.path.join(out, name + ".txt")
    if not os.path.exists(p):
        return rows
    for line in open(p):
        f = line.split()
        if not f or f[0].startswith("#"):
            continue
        try:
            if len(f) >= 12:
                rows[int(f[0])] = (float(f[9]), float(f[11]), f[13] if len(f) > 13 else "")
            else:
                rows[int(f[0])] = (float(f[2]), float(f[4]), "")
        except ValueError:
            pass
    return rows
names = {"0": "default", "3": "recursive doubling", "4": "ring", "6": "rabenseifner"}
for t, btl in (("shm", "vader"), ("udp", "tcp")):
    ours = table("softrdma-" + t)
    peers = {m: table(m) for m in mpi if m.startswith("mpi-" + btl + "-")}
    print(f"\nsoftrdma {t} vs Open MPI {btl} (best tuned algorithm per size)")
    print(f"{'size':>10} {'softrdma us':>12} {'busbw':>7} {'algo':>5} | {'MPI best us':>11} {'busbw':>7} {'algorithm':>18} | ratio")
    for size in sorted(ours):
        tm, bw, alg = ours[size]
        cands = [(p[size], m) for m, p in peers.items() if size in p]
        if not cands:
            print(f"{size:>10} {tm:>12.2f} {bw:>7.2f} {alg:>5} | {'-':>11}")
            continue
        if size < 1 << 20:
            (pt, pb, _), m = min(cands, key=lambda c: c[0][0])
            ratio = f"time {tm / pt:.2f}x"
        else:
            (pt, pb, _), m = max(cands, key=lambda c: c[0][1])
            ratio = f"busbw {bw / pb:.2f}x" if pb > 0 else "-"
        print(f"{size:>10} {tm:>12.2f} {bw:>7.2f} {alg:>5} | {pt:>11.2f} {pb:>7.2f} {names[m.rsplit('-',1)[1]]:>18} | {ratio}")
# Gloo: the best of ring and halving-doubling per size, per transport.
if gloo:
    def best(prefix, size):
        cands = [(table(g)[size], g.rsplit("-", 1)[1]) for g in gloo
                 if g.startswith(prefix) and size in table(g)]
        if not cands:
            return None
        key = (lambda c: -c[0][1]) if size >= 1 << 20 else (lambda c: c[0][0])
        return min(cands, key=key)
    for t in ("shm", "udp"):
        ours = table("softrdma-" + t)
        print(f"\nsoftrdma {t} vs Gloo (best of ring and halving-doubling per size)")
        print(f"{'size':>10} {'softrdma us':>12} {'busbw':>7} | {'Gloo tcp us':>11} {'busbw':>7} | "
              f"{'Gloo ibverbs/softrdma ' + t + ' us':>31} {'busbw':>7} | ratio to the better Gloo")
        for size in sorted(ours):
            tm, bw, _ = ours[size]
            g_tcp = best("gloo-tcp-", size)
            g_ib = best(f"gloo-ibverbs-{t}-", size)
            cell = lambda g: f"{g[0][0]:>11.2f} {g[0][1]:>7.2f}" if g else f"{'-':>11} {'-':>7}"
            cell_ib = f"{g_ib[0][0]:>31.2f} {g_ib[0][1]:>7.2f}" if g_ib else f"{'-':>31} {'-':>7}"
            both = [g for g in (g_tcp, g_ib) if g]
            if not both:
                ratio = "-"
            elif size < 1 << 20:
                ratio = f"time {tm / min(g[0][0] for g in both):.2f}x"
            else:
                ratio = f"busbw {bw / max(g[0][1] for g in both):.2f}x"
            print(f"{size:>10} {tm:>12.2f} {bw:>7.2f} | {cell(g_tcp)} | {cell_ib} | {ratio}")
PY

CMP=(--compare "softrdma udp=$OUT/softrdma-udp.txt")
for m in "${MPI[@]}" "${GLOO[@]}"; do CMP+=(--compare "$m=$OUT/$m.txt"); done
"$SOFTRDMA" coll all_reduce_perf --plot-only --svg "$SVG" \
    --compare "softrdma shm=$OUT/softrdma-shm.txt" "${CMP[@]}" && echo "# plot: $SVG"

# The physical floor: memcpy of 64 MiB on one core.
cat >"$OUT/memcpy.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
int main(void) {
    size_t n = 64u << 20; char *a = malloc(n), *b = malloc(n); double best = 1e9;
    if (!a || !b) return 2;
    memset(a, 1, n); memset(b, 2, n);
    for (int i = 0; i < 10; i++) {
        struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
        memcpy(b, a, n); clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
        if (s < best) best = s; a[i] = b[n - 1 - i];
    }
    printf("\n# memcpy floor: 64 MiB copied at %.2f GB/s (one core, best of 10)\n", n / best / 1e9);
    return 0;
}
C
if cc -O2 -o "$OUT/memcpy" "$OUT/memcpy.c"; then "$OUT/memcpy"; else echo "# memcpy floor: no C compiler"; fi

AGG_RANKS=${AGG_RANKS-8 16}
AGG_ITERS=${AGG_ITERS:-10}
BIG=16777216
for n in $AGG_RANKS; do
    echo
    echo "## in-network aggregation vs host, $n ranks (8 B latency, 16 MiB busbw)"
    "$SOFTRDMA" aggd --listen 127.0.0.1:0 --transport shm --spin "${AGG_SPIN:-200}" >"$OUT/aggd-$n.addr" 2>"$OUT/aggd-$n.err" &
    AGGPID=$!
    for _ in $(seq 50); do grep -q listening "$OUT/aggd-$n.addr" && break; sleep 0.1; done
    AGGADDR=$(sed -n 's/^aggd listening on //p' "$OUT/aggd-$n.addr")
    for alg in innetwork ring rhd tree; do
        extra=()
        [ "$alg" = innetwork ] && extra=(--aggd "$AGGADDR")
        SOFTRDMA_COLL_SPIN=${AGG_SPIN:-200} timeout 600 "$SOFTRDMA" coll all_reduce_perf --ranks "$n" \
            --transport shm -b 8 -e "$BIG" -f $((BIG / 8)) -n "$AGG_ITERS" -w 2 -z 1 --algo "$alg" "${extra[@]}" \
            >"$OUT/agg-$n-$alg.txt" 2>"$OUT/agg-$n-$alg.err" || echo "# $alg at $n ranks failed: $(tail -2 "$OUT/agg-$n-$alg.err")"
    done
    kill "$AGGPID" 2>/dev/null; wait "$AGGPID" 2>/dev/null
    python3 - "$OUT" "$n" <<'PY'
import sys, os
out, n = sys.argv[1], sys.argv[2]
def rows(alg):
    r = {}
    p = os.path.join(out, f"agg-{n}-{alg}.txt")
    if os.path.exists(p):
        for line in open(p):
            f = line.split()
            if len(f) >= 13 and not f[0].startswith("#"):
                try:
                    # -z 1: size count type redop root - - - - time algbw busbw #wrong algo
                    r[int(f[0])] = (float(f[9]), float(f[11]), int(f[12]), f[13] if len(f) > 13 else "")
                except ValueError:
                    pass
    return r
t = {a: rows(a) for a in ("innetwork", "ring", "rhd", "tree")}
for size, what in ((8, "time us"), (16777216, "busbw GB/s")):
    k = 0 if size == 8 else 1
    host = [(v[size][k], a) for a, v in t.items() if a != "innetwork" and size in v]
    best = (min if k == 0 else max)(host) if host else None
    inn = t["innetwork"].get(size)
    line = f"{size:>9} B {what:>10}: in-network "
    line += f"{inn[k]:.2f} (algo {inn[3]}, #wrong {inn[2]})" if inn else "-"
    line += f" | best host {best[0]:.2f} ({best[1]})" if best else " | host -"
    line += "  [" + ", ".join(f"{a} {v[size][k]:.2f}" for a, v in t.items() if size in v) + "]"
    print(line)
PY
done
