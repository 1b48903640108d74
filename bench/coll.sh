#!/usr/bin/env bash
# softrdma coll all_reduce_perf against Open MPI's MPI_Allreduce, in one run
# on this machine, 2 ranks, float sum, 8 B .. 64 MiB (x4 steps by default):
#   softrdma over the same-host path (shm) and over RoCEv2/UDP, each with
#   the cost model's choice;
#   Open MPI (bench/mpi_allreduce.c, built with mpicc) with its tuned
#   component's algorithm forced (--mca coll_tuned_use_dynamic_rules 1
#   --mca coll_tuned_allreduce_algorithm N: 0 default decision, 3 recursive
#   doubling, 4 ring, 6 Rabenseifner) over vader (shared memory) and over
#   tcp (loopback).
# Prints each table, then per size: softrdma shm busbw against the best
# vader algorithm, softrdma udp against the best tcp one, and the ratios
# (time ratios for sizes below 1 MiB, busbw ratios from 1 MiB up).
# Draws the busbw curves to $SVG (default docs/coll-busbw.svg).
#
# Environment: SOFTRDMA=path of the softrdma binary (default: built here
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

for t in shm udp; do
    run "softrdma-$t" "$SOFTRDMA" coll all_reduce_perf --ranks "$RANKS" --transport "$t" \
        -b "$MIN" -e "$MAX" -f "$STEP" -n "$ITERS" -w "$WARM"
done

# size -> time (us) and busbw, per table: softrdma in-place columns 9/11,
# MPI's columns 2/4 (0-based).
python3 - "$OUT" "${MPI[@]}" <<'PY'
import sys, os
out, mpi = sys.argv[1], sys.argv[2:]
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
PY

CMP=(--compare "softrdma udp=$OUT/softrdma-udp.txt")
for m in "${MPI[@]}"; do CMP+=(--compare "$m=$OUT/$m.txt"); done
"$SOFTRDMA" coll all_reduce_perf --plot-only --svg "$SVG" \
    --compare "softrdma shm=$OUT/softrdma-shm.txt" "${CMP[@]}" && echo "# plot: $SVG"
