"""Run under mpirun (2 ranks): all-reduces through the Python binding,
checked against mpi4py's MPI allreduce of the same data. With $AGGD set,
also through that aggregation service. Exits non-zero on any mismatch."""

import os
import sys
from array import array

from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import softrdma_coll as sc  # noqa: E402

world = MPI.COMM_WORLD
r, n = world.Get_rank(), world.Get_size()
aggd = os.environ.get("AGGD") or None
comm = sc.Communicator.from_mpi4py(world, aggd=aggd)
assert (comm.rank, comm.size) == (r, n), (comm.rank, comm.size)

def check(name, got, want):
    if list(got) != list(want):
        print(f"rank {r}: {name}: got {list(got)[:8]}... want {list(want)[:8]}...", flush=True)
        sys.exit(1)

algos = [None, "ring", "rhd", "tree"] + (["innetwork"] if aggd else [])
for alg in algos:
    comm.set_algorithm(alg)
    for count in (1, 7, 1031, 100_003):
        x = array("f", ((i * 7 + r * 3) % 13 for i in range(count)))
        # mpi4py's reference on the same numbers (small integers: exact in f32).
        ref = array("f", [0.0] * count)
        world.Allreduce(x, ref, op=MPI.SUM)
        out = array("f", [0.0] * count)
        comm.all_reduce(x, out=out)
        check(f"f32 sum {alg} n={count} out of place", out, ref)
        comm.all_reduce(x)
        check(f"f32 sum {alg} n={count} in place", x, ref)
        y = array("q", ((i * 31 + r * 1_000_003) for i in range(count)))
        ref = array("q", [0] * count)
        world.Allreduce(y, ref, op=MPI.MAX)
        comm.all_reduce(y, op=sc.MAX)
        check(f"i64 max {alg} n={count}", y, ref)
b = array("d", [float(i) if r == 1 else -1.0 for i in range(257)])
comm.broadcast(b, root=1)
check("f64 broadcast", b, [float(i) for i in range(257)])
comm.barrier()
try:
    comm.all_reduce(array("f", [1.0]), op=99)
    print(f"rank {r}: a bad operator was accepted", flush=True)
    sys.exit(1)
except sc.Error as e:
    assert "operator" in str(e), e
if aggd and not comm.in_network:
    print(f"rank {r}: not through the service", flush=True)
    sys.exit(1)
comm.close()
print(f"rank {r} of {n}: ok ({'with' if aggd else 'without'} the aggregation service)", flush=True)
