/*
 * The floor of an 8-byte RDMA WRITE ping-pong over loopback UDP on this
 * machine, without any RoCE processing: two processes (pinned to CPU 0 and
 * CPU 1) busy-poll non-blocking UDP sockets, as sockperf's busy-poll
 * ping-pong does.
 *
 *   udp_floor 1 PORT  one datagram per turn (sendto + recv): what sockperf
 *                     measures;
 *   udp_floor 2 PORT  the two datagrams an RC turn needs, the WRITE (40 B:
 *                     BTH, RETH, 8 B, ICRC) and the ACK of the peer's
 *                     previous WRITE (20 B: BTH, AETH, ICRC), sent as one
 *                     UDP GSO message and received as one GRO buffer: what
 *                     softrdma does, with nothing else.
 *
 * Prints the average one-way latency (half the round trip) in microseconds.
 * bench/peers.sh builds it with `cc -O2` when a compiler is present.
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int two;
static int sock;
static struct sockaddr_in peer;
static char out[64], in[65536];

static void send_turn(void) {
    if (!two) {
        sendto(sock, out, 40, 0, (struct sockaddr *)&peer, sizeof peer);
        return;
    }
    char ctl[CMSG_SPACE(sizeof(uint16_t))];
    struct iovec v = {out, 60};
    struct msghdr h = {.msg_name = &peer, .msg_namelen = sizeof peer, .msg_iov = &v,
                       .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    struct cmsghdr *c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_UDP;
    c->cmsg_type = UDP_SEGMENT;
    c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    uint16_t seg = 40;
    memcpy(CMSG_DATA(c), &seg, sizeof seg);
    if (sendmsg(sock, &h, 0) < 0) {
        perror("sendmsg with UDP_SEGMENT");
        exit(1);
    }
}

static void recv_turn(void) {
    char ctl[64];
    struct iovec v = {in, sizeof in};
    for (;;) {
        struct msghdr h = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl,
                           .msg_controllen = sizeof ctl};
        if (recvmsg(sock, &h, MSG_DONTWAIT) > 0)
            return;
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: udp_floor 1|2 PORT [ITERATIONS]\n");
        return 2;
    }
    two = atoi(argv[1]) == 2;
    int port = atoi(argv[2]);
    long n = argc > 3 ? atol(argv[3]) : 200000;
    long warm = n / 10;
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    int me = child == 0 ? 0 : 1; /* 0 answers, 1 starts and measures */
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(me, &s);
    sched_setaffinity(0, sizeof s, &s);
    sock = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons(port + me)};
    if (bind(sock, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("bind");
        return 1;
    }
    int one = 1;
    if (two)
        setsockopt(sock, SOL_UDP, UDP_GRO, &one, sizeof one);
    peer = a;
    peer.sin_port = htons(port + 1 - me);
    if (me == 1)
        usleep(200000); /* the answering side binds first */
    double t0 = 0;
    for (long i = 0; i < n + warm; i++) {
        if (me == 1 && i == warm)
            t0 = now_ns();
        if (me == 0) {
            recv_turn();
            send_turn();
        } else {
            send_turn();
            recv_turn();
        }
    }
    if (me == 1) {
        printf("one-way %.3f us\n", (now_ns() - t0) / n / 2 / 1000);
        waitpid(child, NULL, 0);
    }
    return 0;
}
