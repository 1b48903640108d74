#!/bin/sh
# two-hosts.sh COMMAND [ARG...]: runs COMMAND on "host a" of two hosts made
# of network namespaces joined by a veth pair (MTU 1500), without root:
#   host a: 10.77.0.1 on eco0 (COMMAND runs here)
#   host b: 10.77.0.2 on eco1
# Each has its own loopback; between them is the veth only. Meant for
# Open MPI's mpirun (docs/ecosystem.md):
#   $SOFTRDMA_HOST_AGENT is an rsh agent (--mca plm_rsh_agent) that runs a
#   command on host 10.77.0.2 (entering b's network namespace, with
#   SOFTRDMA_DEVICES=srx0=10.77.0.2) or 10.77.0.1 (here, srx0=10.77.0.1);
#   SOFTRDMA_DEVICES is srx0=10.77.0.1 for COMMAND itself.
#
# What it does: a new user namespace (unshare -r: root inside, nobody
# outside) with a new network namespace (host a); a process sleeping in a
# second network namespace is host b; the veth is made in a and one end
# moved to b. Everything else (files, /dev, processes, IPC) is shared, so
# run it inside interop/ecosystem/devnode.sh for UCX. Both namespaces end
# with COMMAND.
set -eu
if [ "$#" -eq 0 ]; then
    echo "usage: $0 COMMAND [ARG...]" >&2
    exit 2
fi
exec unshare --user --map-root-user --net --fork sh -eu -c '
    ip link set lo up
    unshare --net sh -c "ip link set lo up; exec sleep 100000" &
    b=$!
    trap "kill $b 2>/dev/null" EXIT
    i=0
    while [ "$(readlink /proc/$b/ns/net)" = "$(readlink /proc/self/ns/net)" ] && [ $i -lt 100 ]; do
        sleep 0.05; i=$((i + 1))
    done
    ip link add eco0 mtu 1500 type veth peer name eco1 mtu 1500
    ip link set eco1 netns "$b"
    ip addr add 10.77.0.1/24 dev eco0
    ip link set eco0 up
    nsenter --net=/proc/$b/ns/net ip addr add 10.77.0.2/24 dev eco1
    nsenter --net=/proc/$b/ns/net ip link set eco1 up
    agent=$(mktemp "${TMPDIR:-/tmp}/softrdma-agent.XXXXXX")
    cat > "$agent" <<AGENT
#!/bin/sh
# rsh agent: \$1 is the host, the rest the command (a shell string).
host=\$1; shift
case "\$host" in
    10.77.0.2|b) exec nsenter --net=/proc/$b/ns/net env SOFTRDMA_DEVICES=srx0=10.77.0.2 sh -c "\$*" ;;
    10.77.0.1|a) exec env SOFTRDMA_DEVICES=srx0=10.77.0.1 sh -c "\$*" ;;
    *) echo "softrdma two-hosts agent: no host \$host" >&2; exit 255 ;;
esac
AGENT
    chmod +x "$agent"
    trap "kill $b 2>/dev/null; rm -f $agent" EXIT
    SOFTRDMA_HOST_AGENT=$agent SOFTRDMA_DEVICES=srx0=10.77.0.1 "$@"
' two-hosts "$@"
