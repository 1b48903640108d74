# Shared by the bench scripts (sourced, not run): a work directory that
# goes at exit (KEEP=1 keeps it), the softrdma binary and drop-in
# libraries, one server at a time, pinned and bounded pairs, medians.
#
# The sourcing script sets BENCH (its name) first; after sourcing it has
# WORK, PORT (a random base), log, need, build_dropin, pair, record,
# median and stop_server.

WORK=$(mktemp -d "/tmp/softrdma-${BENCH:?set BENCH before sourcing bench/lib.sh}.XXXXXX")
PORT=$((20000 + RANDOM % 20000))
log() { printf '%s\n' "$*" >&2; }

# need TOOL... "apt-get hint": exits when a tool is missing.
need() {
    local hint=${!#} t
    for t in "${@:1:$#-1}"; do
        command -v "$t" >/dev/null || { log "$t is missing ($hint)"; exit 1; }
    done
}

# build_dropin: SOFTRDMA and LIBIBVERBS (built here with cargo build
# --release unless both are given), and LIBRDMACM beside LIBIBVERBS;
# WORK gets libibverbs.so.1 and librdmacm.so.1 for LD_LIBRARY_PATH.
build_dropin() {
    if [ -z "${SOFTRDMA:-}" ] || [ -z "${LIBIBVERBS:-}" ]; then
        log "building softrdma and the drop-in libraries (cargo build --release)"
        cargo build --release -q -p softrdma-cli -p softrdma-ibverbs -p softrdma-rdmacm || exit 1
        SOFTRDMA=${SOFTRDMA:-${CARGO_TARGET_DIR:-target}/release/softrdma}
        LIBIBVERBS=${LIBIBVERBS:-${CARGO_TARGET_DIR:-target}/release/libibverbs.so}
    fi
    LIBRDMACM=${LIBRDMACM:-$(dirname "$LIBIBVERBS")/librdmacm.so}
    ln -s "$(realpath "$LIBIBVERBS")" "$WORK/libibverbs.so.1"
    [ -f "$LIBRDMACM" ] && ln -s "$(realpath "$LIBRDMACM")" "$WORK/librdmacm.so.1"
    return 0
}

SRV_PID=
stop_server() { [ -n "$SRV_PID" ] && { kill "$SRV_PID" 2>/dev/null; wait "$SRV_PID" 2>/dev/null; SRV_PID=; }; }
cleanup() { stop_server; if [ "${KEEP:-0}" = 1 ]; then log "raw outputs in $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# pair NAME TRANSPORT "server command" "client command": the server on
# CPU 0 (90 s at most), the client on CPU 1 (60 s), both on the drop-in;
# outputs in $WORK/NAME.srv and $WORK/NAME.out.
pair() {
    local name=$1 tr=$2
    env -u SOFTRDMA_DEVICES SOFTRDMA_TRANSPORT="$tr" LD_LIBRARY_PATH="$WORK" \
        taskset -c 0 timeout 90 sh -c "exec $3" >"$WORK/$name.srv" 2>&1 &
    SRV_PID=$!
    sleep 0.5
    env -u SOFTRDMA_DEVICES SOFTRDMA_TRANSPORT="$tr" LD_LIBRARY_PATH="$WORK" \
        taskset -c 1 timeout 60 sh -c "exec $4" >"$WORK/$name.out" 2>&1
    sleep 0.2
    stop_server
}

# record KEY VALUE (nothing when VALUE is empty); median KEY.
record() { [ -n "$2" ] && printf '%s\n' "$2" >>"$WORK/$1.vals"; }
median() {
    [ -s "$WORK/$1.vals" ] || { echo ""; return; }
    sort -g "$WORK/$1.vals" | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else printf "%.4f\n", (v[NR/2]+v[NR/2+1])/2}'
}
