# A forked child gets a soft HCA of its own (rdma-core's test suite runs
# its rdma_cm tests in processes forked from one that already has the
# device open). The parent opens the device and keeps it busy enough to
# have its progress thread running, then forks ROUNDS children; each
# opens the device, queries it, makes a PD, a CQ and an RC QP, and
# compares its GID with the parent's: the same GID would mean the
# parent's HCA, whose progress thread and locks the child does not have.
#
# Usage: fork_child.py DEVICE ROUNDS. Prints "ok <what>" / "FAIL <what>"
# and exits 1 on a failure.

import os
import sys

from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.pd import PD
from pyverbs.qp import QP, QPCap, QPInitAttr
import pyverbs.enums as e

dev, rounds = sys.argv[1], int(sys.argv[2])
parent = Context(name=dev)
parent_gid = str(parent.query_gid(1, 0))
ppd = PD(parent)
pcq = CQ(parent, 16)
pqp = QP(ppd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=pcq, rcq=pcq, cap=QPCap(4, 4, 1, 1)))
print(f"ok parent gid {parent_gid} qpn {pqp.qp_num}", flush=True)

failures = 0
for i in range(rounds):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            c = Context(name=dev)
            c.query_device()
            gid = str(c.query_gid(1, 0))
            pd = PD(c)
            cq = CQ(c, 16)
            qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(4, 4, 1, 1)))
            if gid == parent_gid:
                print(f"FAIL child {i}: the parent's HCA (gid {gid})", flush=True)
                code = 1
            else:
                print(f"ok child {i}: own HCA, gid {gid}, qpn {qp.qp_num}", flush=True)
        except Exception as ex:
            print(f"FAIL child {i}: {ex}", flush=True)
            code = 1
        os._exit(code)
    # The parent keeps its own device in use meanwhile.
    parent.query_device()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        failures += 1
print(f"ok parent still answers: {parent.query_device().fw_version!r}", flush=True)
print("ALL OK" if failures == 0 else f"FAIL {failures} children", flush=True)
sys.exit(1 if failures else 0)
