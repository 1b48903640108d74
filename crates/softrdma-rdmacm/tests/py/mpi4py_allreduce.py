"""mpi4py: an MPI_Allreduce (sum) of 1 MiB of float32 over every rank,
checked element by element. Rank k contributes (k + 1) * (i % 1000) + k
to element i, so element i must be n(n+1)/2 * (i % 1000) + n(n-1)/2, which
float32 holds exactly. Prints "mpi4py_allreduce: ok ranks=N ms=X" on rank 0
and exits 0 only when every rank's result is right. No numpy: the buffers
are array('f') objects, which mpi4py takes as buffers."""

import sys
import time
from array import array

from mpi4py import MPI

N = 1024 * 1024 // 4

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()

send = array("f", ((rank + 1) * (i % 1000) + rank for i in range(N)))
recv = array("f", bytes(4 * N))
comm.Barrier()
t0 = time.perf_counter()
comm.Allreduce([send, MPI.FLOAT], [recv, MPI.FLOAT], op=MPI.SUM)
ms = (time.perf_counter() - t0) * 1e3

a = size * (size + 1) // 2
b = size * (size - 1) // 2
bad = next((i for i in range(N) if recv[i] != a * (i % 1000) + b), None)
if bad is not None:
    print(f"mpi4py_allreduce: rank {rank} element {bad}: {recv[bad]}, want {a * (bad % 1000) + b}",
          file=sys.stderr)
worst = comm.allreduce(0 if bad is None else 1, op=MPI.MAX)
if rank == 0:
    print(f"mpi4py_allreduce: {'ok' if worst == 0 else 'FAILED'} ranks={size} ms={ms:.2f}")
sys.exit(0 if worst == 0 else 1)
