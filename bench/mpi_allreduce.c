/* MPI_Allreduce timing in the layout of `softrdma coll all_reduce_perf`
 * (size, count, time in us, algbw and busbw in GB/s), float sum, from
 * MINBYTES to MAXBYTES by a factor of 2 (or STEP), ITERS timed
 * iterations after WARMUP. Used by bench/coll.sh; build with mpicc. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    long minb = argc > 1 ? atol(argv[1]) : 8;
    long maxb = argc > 2 ? atol(argv[2]) : 64L << 20;
    long step = argc > 3 ? atol(argv[3]) : 2;
    int iters = argc > 4 ? atoi(argv[4]) : 20;
    int warm = argc > 5 ? atoi(argv[5]) : 5;
    if (minb < 4 || maxb < minb || step < 2 || iters < 1 || warm < 0) {
        if (rank == 0) fprintf(stderr, "usage: mpi_allreduce MIN MAX STEP ITERS WARMUP\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long maxc = maxb / 4;
    float *in = malloc(maxc * sizeof(float)), *out = malloc(maxc * sizeof(float));
    if (!in || !out) MPI_Abort(MPI_COMM_WORLD, 2);
    for (long i = 0; i < maxc; i++) in[i] = (float)((i * 7 + rank * 3) % 13);
    long wrong_total = 0;
    for (long size = minb;; size *= step) {
        if (size > maxb) size = maxb;
        long count = size / 4;
        for (int i = 0; i < warm; i++)
            MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++)
            MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t = (MPI_Wtime() - t0) / iters, tmax;
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        long wrong = 0;
        for (long i = 0; i < count; i++) {
            float want = 0;
            for (int r = 0; r < n; r++) want += (float)((i * 7 + r * 3) % 13);
            if (out[i] != want) wrong++;
        }
        wrong_total += wrong;
        if (rank == 0) {
            double algbw = (double)(count * 4) / tmax / 1e9;
            printf("%12ld  %12ld  %10.2f  %7.2f  %7.2f  %6ld\n", count * 4, count, tmax * 1e6, algbw,
                   algbw * 2.0 * (n - 1) / n, wrong);
        }
        if (size >= maxb) break;
    }
    free(in);
    free(out);
    MPI_Finalize();
    return wrong_total != 0;
}
