/* Two ranks through the C API: rank, size and rendezvous from
 * SOFTRDMA_COLL_RANK/_SIZE/_ADDR; f32 and i64 all-reduces checked, a bad
 * type code refused with a reason. Prints "ok RANK" on success. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "softrdma_coll.h"

int main(void) {
    softrdma_coll_comm *c = softrdma_coll_init(-1, 0, NULL, NULL);
    if (!c) {
        fprintf(stderr, "init: %s\n", softrdma_coll_last_error());
        return 2;
    }
    int r = softrdma_coll_rank(c), n = softrdma_coll_size(c);
    enum { N = 100003 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    int64_t *z = malloc(N * sizeof *z);
    for (int i = 0; i < N; i++) {
        x[i] = (float)((i * 7 + r * 3) % 13);
        z[i] = (int64_t)i * 1000003 + r;
    }
    if (softrdma_coll_all_reduce(c, x, y, N, SOFTRDMA_COLL_F32, SOFTRDMA_COLL_SUM) ||
        softrdma_coll_all_reduce(c, NULL, z, N, SOFTRDMA_COLL_I64, SOFTRDMA_COLL_MAX)) {
        fprintf(stderr, "all_reduce: %s\n", softrdma_coll_last_error());
        return 1;
    }
    for (int i = 0; i < N; i++) {
        float want = 0;
        for (int q = 0; q < n; q++) want += (float)((i * 7 + q * 3) % 13);
        if (y[i] != want || z[i] != (int64_t)i * 1000003 + (n - 1)) {
            fprintf(stderr, "rank %d element %d: %g %lld\n", r, i, y[i], (long long)z[i]);
            return 1;
        }
    }
    if (softrdma_coll_all_reduce(c, x, y, N, 42, SOFTRDMA_COLL_SUM) != -1 ||
        !strstr(softrdma_coll_last_error(), "data type")) {
        fprintf(stderr, "a bad type code was not refused\n");
        return 1;
    }
    if (softrdma_coll_barrier(c)) return 1;
    softrdma_coll_finalize(c);
    printf("ok %d\n", r);
    return 0;
}
