#!/bin/sh
# devnode.sh COMMAND [ARG...]: runs COMMAND where /dev/infiniband/softrdma
# exists, without root and without changing the host.
#
# Why: UCX (uct_ib_device_is_accessible in src/uct/ib/base/ib_md.c) uses a
# verbs device only if "/dev/infiniband/" + ibv_device.dev_name is a
# character device this user may read and write. softrdma's devices are
# opened through no kernel node, so the drop-in libibverbs names one shared
# stand-in, dev_name "softrdma", and nothing ever opens it.
#
# What it does, exactly: in a new user and mount namespace (unshare -rm;
# needs unprivileged user namespaces, Debian's default) it mounts a tmpfs
# over /dev holding the same entries as the host's /dev (each bind-mounted,
# /dev/shm and /dev/pts included, so shared memory and terminals are the
# host's), plus /dev/infiniband/softrdma, a bind mount of /dev/null; then
# it enters a second user namespace that maps the caller's own uid and gid
# back, so COMMAND runs as the caller (not as a namespace root) with the
# same files, network, processes and IPC as everyone else. Nothing outside
# the two namespaces changes, and they end with COMMAND.
#
# The alternative without a wrapper is a one-time root step on the host:
#     install -d -m 0755 /dev/infiniband
#     ln -s /dev/null /dev/infiniband/softrdma
# (a tmpfiles.d line "L /dev/infiniband/softrdma - - - - /dev/null" makes it
# survive reboots). See docs/ecosystem.md.
set -eu
if [ "$#" -eq 0 ]; then
    echo "usage: $0 COMMAND [ARG...]" >&2
    exit 2
fi
if [ -c /dev/infiniband/softrdma ] && [ -r /dev/infiniband/softrdma ] && [ -w /dev/infiniband/softrdma ]; then
    exec "$@"
fi
uid=$(id -u)
gid=$(id -g)
export SOFTRDMA_DEVNODE_UID="$uid" SOFTRDMA_DEVNODE_GID="$gid"
exec unshare --user --map-root-user --mount --propagation private sh -eu -c '
    old=$(mktemp -d "${TMPDIR:-/tmp}/softrdma-dev.XXXXXX")
    mount --rbind /dev "$old"
    mount -t tmpfs -o mode=0755 softrdma-dev /dev
    for e in "$old"/* "$old"/.[!.]*; do
        [ -e "$e" ] || [ -L "$e" ] || continue
        n=${e#"$old"/}
        if [ -L "$e" ]; then
            cp -P "$e" "/dev/$n"
        elif [ -d "$e" ]; then
            mkdir "/dev/$n" && mount --rbind "$e" "/dev/$n"
        else
            : > "/dev/$n" && mount --bind "$e" "/dev/$n"
        fi
    done
    umount -l "$old"
    rmdir "$old"
    mkdir -p /dev/infiniband
    : > /dev/infiniband/softrdma
    mount --bind /dev/null /dev/infiniband/softrdma
    exec unshare --user --map-user="$SOFTRDMA_DEVNODE_UID" --map-group="$SOFTRDMA_DEVNODE_GID" -- "$@"
' devnode "$@"
