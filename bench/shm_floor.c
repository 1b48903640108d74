/*
 * The floor of a same-host 8-byte ping-pong on this machine: two processes
 * (pinned to CPU 0 and CPU 1) share one memfd mapping; each stores 8 bytes
 * into the other's receive slot and spins on its own, as UCX's put_lat
 * does over posix shared memory, with no library in between. It prints the
 * average one-way latency (half the round trip) in microseconds.
 *
 * bench/peers.sh builds it with `cc -O2` when a compiler is present and
 * runs it beside softrdma and its peers, so the shared-memory rows can be
 * read against what the hardware allows.
 *
 * usage: shm_floor [ITERATIONS]
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    long warm = n / 10;
    int fd = memfd_create("shm_floor", 0);
    if (fd < 0 || ftruncate(fd, 3 * 4096) != 0) {
        perror("memfd");
        return 1;
    }
    uint8_t *m = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    /* Receive slots on separate pages, the polled byte last, as perftest lays them out. */
    volatile uint8_t *slot[2] = {m + 4096, m + 2 * 4096};
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    int me = child == 0 ? 0 : 1; /* 0 answers, 1 starts and measures */
    pin(me);
    volatile uint8_t *mine = slot[me], *theirs = slot[1 - me];
    double t0 = 0;
    for (long i = 1; i <= n + warm; i++) {
        uint8_t k = (uint8_t)i;
        uint64_t v = (uint64_t)k << 56;
        if (me == 0)
            while (mine[7] != k)
                ;
        if (me == 1 && i == warm + 1)
            t0 = now_ns();
        memcpy((void *)theirs, &v, 8);
        if (me == 1)
            while (mine[7] != k)
                ;
    }
    if (me == 1) {
        printf("one-way %.3f us\n", (now_ns() - t0) / n / 2 / 1000);
        waitpid(child, NULL, 0);
    }
    return 0;
}
