#!/bin/sh
# One command per TCP connection from the harness: a line
# "run|start|wait|kill <job> <base64 shell command or timeout>".
#   run   CMD      run now, print its output, then "@@rc=N"
#   start JOB CMD  run in the background, output to /tmp/jobs/JOB.out
#   wait  JOB SECS wait for JOB (up to SECS), print its output, then "@@rc=N"
#                  (rc 124 and a kill when it ran out of time)
#   poll  JOB      "@@rc=N" with its output once JOB ended, "@@running" before
#   kill  JOB      end JOB and its children
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
kill_tree() {
    for c in $(awk -v p="$1" '$4==p{print $1}' /proc/[0-9]*/stat 2>/dev/null); do
        kill_tree "$c"
    done
    kill -9 "$1" 2>/dev/null
}
read -r verb job arg
case "$verb" in
poll)
    if [ -f "/tmp/jobs/$job.rc" ]; then
        cat "/tmp/jobs/$job.out"
        echo "@@rc=$(cat "/tmp/jobs/$job.rc")"
    else
        echo "@@running"
    fi
    ;;
kill)
    [ -f "/tmp/jobs/$job.pid" ] && kill_tree "$(cat "/tmp/jobs/$job.pid")"
    echo "@@rc=0"
    ;;
run)
    cmd=$(echo "$job" | base64 -d)
    sh -c "$cmd" </dev/null 2>&1
    echo "@@rc=$?"
    ;;
start)
    cmd=$(echo "$arg" | base64 -d)
    rm -f "/tmp/jobs/$job.rc"
    # The subshell must not keep the connection (our stdout) open.
    ( sh -c "$cmd" >"/tmp/jobs/$job.out" 2>&1; echo $? >"/tmp/jobs/$job.rc" ) </dev/null >/dev/null 2>&1 &
    echo $! >"/tmp/jobs/$job.pid"
    echo "@@rc=0"
    ;;
wait)
    n=0
    lim=$(( ${arg:-60} * 10 ))
    while [ ! -f "/tmp/jobs/$job.rc" ] && [ $n -lt $lim ]; do
        sleep 0.1; n=$((n + 1))
    done
    if [ ! -f "/tmp/jobs/$job.rc" ]; then
        kill_tree "$(cat "/tmp/jobs/$job.pid")"
        cat "/tmp/jobs/$job.out"
        echo "@@rc=124"
    else
        cat "/tmp/jobs/$job.out"
        echo "@@rc=$(cat "/tmp/jobs/$job.rc")"
    fi
    ;;
*)
    echo "agent: unknown verb $verb"
    echo "@@rc=2"
    ;;
esac
