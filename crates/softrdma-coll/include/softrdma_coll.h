/* softrdma_coll.h: the C API of softrdma-coll (libsoftrdma_coll.so).
 *
 * A communicator of ranks joined by softrdma RC queue pairs, and
 * all-reduce, broadcast and barrier on it. Every call returns 0 on success
 * and -1 on failure (or NULL for softrdma_coll_init); then
 * softrdma_coll_last_error() names what went wrong (the text stays valid
 * until the next call on that thread). Nothing here aborts or blocks
 * forever: every wait is bounded by SOFTRDMA_COLL_TIMEOUT_MS (60 s).
 * The environment variables of docs/collectives.md apply (SOFTRDMA_COLL_*,
 * SOFTRDMA_DEVICES, SOFTRDMA_FAULT, ...). */
#ifndef SOFTRDMA_COLL_H
#define SOFTRDMA_COLL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct softrdma_coll_comm softrdma_coll_comm;

enum softrdma_coll_dtype {
    SOFTRDMA_COLL_F32 = 0,
    SOFTRDMA_COLL_F64 = 1,
    SOFTRDMA_COLL_F16 = 2,
    SOFTRDMA_COLL_BF16 = 3,
    SOFTRDMA_COLL_I32 = 4,
    SOFTRDMA_COLL_I64 = 5,
    SOFTRDMA_COLL_U8 = 6,
};

enum softrdma_coll_op {
    SOFTRDMA_COLL_SUM = 0,
    SOFTRDMA_COLL_PROD = 1,
    SOFTRDMA_COLL_MIN = 2,
    SOFTRDMA_COLL_MAX = 3,
    SOFTRDMA_COLL_AVG = 4,
};

/* Joins `size` ranks meeting at `rendezvous` ("HOST:PORT"; rank 0 listens
 * there). rank < 0: rank, size and rendezvous from the launcher's variables
 * (mpirun's OMPI_COMM_WORLD_*, torchrun's RANK/WORLD_SIZE/MASTER_ADDR/
 * MASTER_PORT, or SOFTRDMA_COLL_RANK/_SIZE/_ADDR). `aggd`: "HOST:PORT" of an
 * aggregation service to join, or NULL (then SOFTRDMA_COLL_AGGD applies). */
softrdma_coll_comm *softrdma_coll_init(int rank, int size, const char *rendezvous,
                                       const char *aggd);
/* Leaves (waits, bounded, for this rank's last writes to be acknowledged). */
void softrdma_coll_finalize(softrdma_coll_comm *comm);

int softrdma_coll_rank(const softrdma_coll_comm *comm);
int softrdma_coll_size(const softrdma_coll_comm *comm);
/* 1 when all-reduces with the "innetwork" algorithm go to the service. */
int softrdma_coll_in_network(const softrdma_coll_comm *comm);
/* "ring", "rhd", "tree", "innetwork", or NULL for the automatic choice. */
int softrdma_coll_set_algorithm(softrdma_coll_comm *comm, const char *name);

/* Element-wise reduction of every rank's `send` (count elements) into
 * `recv`; send == recv or send == NULL: in place. Buffers must be aligned
 * for their type and not partly overlap. */
int softrdma_coll_all_reduce(softrdma_coll_comm *comm, const void *send, void *recv,
                             size_t count, int dtype, int op);
/* Root's `buf` (count elements) to every rank. */
int softrdma_coll_broadcast(softrdma_coll_comm *comm, void *buf, size_t count, int dtype,
                            int root);
int softrdma_coll_barrier(softrdma_coll_comm *comm);

const char *softrdma_coll_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
