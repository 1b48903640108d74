/* mpi_check.c: a ping-pong between ranks 0 and 1 and an MPI_Allreduce of
 * 1 MiB of float32 over every rank, each result checked element by element.
 * Prints "mpi_check: ok ranks=N pingpong_us=X allreduce_ms=Y" on rank 0 and
 * exits 0 only when every rank's data is right. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PP_ITERS 200
#define PP_BYTES 4096
#define AR_FLOATS (1024 * 1024 / 4)
#define AR_ROUNDS 3

int main(int argc, char **argv)
{
    int rank, size, bad = 0, i, r;
    double t0, pp_us = 0, ar_ms = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    /* Ping-pong: rank 0 sends a patterned buffer, rank 1 checks it and
     * sends it back with every byte incremented, rank 0 checks that. */
    if (size >= 2 && rank < 2) {
        unsigned char *buf = malloc(PP_BYTES);
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        for (i = 0; i < PP_ITERS && !bad; i++) {
            int j;
            if (rank == 0) {
                for (j = 0; j < PP_BYTES; j++)
                    buf[j] = (unsigned char)(i + j);
                MPI_Send(buf, PP_BYTES, MPI_BYTE, 1, i, MPI_COMM_WORLD);
                MPI_Recv(buf, PP_BYTES, MPI_BYTE, 1, i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                for (j = 0; j < PP_BYTES; j++)
                    if (buf[j] != (unsigned char)(i + j + 1)) {
                        fprintf(stderr, "mpi_check: pingpong %d byte %d: %u\n", i, j, buf[j]);
                        bad = 1;
                        break;
                    }
            } else {
                MPI_Recv(buf, PP_BYTES, MPI_BYTE, 0, i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                for (j = 0; j < PP_BYTES; j++) {
                    if (buf[j] != (unsigned char)(i + j)) {
                        fprintf(stderr, "mpi_check: rank 1 pingpong %d byte %d: %u\n", i, j, buf[j]);
                        bad = 1;
                    }
                    buf[j]++;
                }
                MPI_Send(buf, PP_BYTES, MPI_BYTE, 0, i, MPI_COMM_WORLD);
            }
        }
        pp_us = (MPI_Wtime() - t0) * 1e6 / PP_ITERS / 2;
        free(buf);
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
    }

    /* Allreduce: rank k contributes (k + 1) * (i % 1000) + k to element i,
     * so element i must be sum_k of that, exactly representable in float32. */
    {
        float *in = malloc(AR_FLOATS * sizeof(float));
        float *out = malloc(AR_FLOATS * sizeof(float));
        for (r = 0; r < AR_ROUNDS && !bad; r++) {
            for (i = 0; i < AR_FLOATS; i++)
                in[i] = (float)((rank + 1) * (i % 1000) + rank + r);
            memset(out, 0xff, AR_FLOATS * sizeof(float));
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
            MPI_Allreduce(in, out, AR_FLOATS, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            ar_ms += (MPI_Wtime() - t0) * 1e3;
            for (i = 0; i < AR_FLOATS; i++) {
                float want = (float)((size * (size + 1) / 2) * (i % 1000) +
                                     size * (size - 1) / 2 + size * r);
                if (out[i] != want) {
                    fprintf(stderr, "mpi_check: rank %d allreduce %d element %d: %g, want %g\n",
                            rank, r, i, out[i], want);
                    bad = 1;
                    break;
                }
            }
        }
        free(in);
        free(out);
    }

    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
        printf("mpi_check: %s ranks=%d pingpong_us=%.2f allreduce_ms=%.2f\n",
               bad ? "FAILED" : "ok", size, pp_us, ar_ms / AR_ROUNDS);
    MPI_Finalize();
    return bad ? 1 : 0;
}
