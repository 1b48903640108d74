/* The rsocket calls of the drop-in librdmacm, their data path and their
 * error paths, as sockets give them: one process, a listener and a client
 * on its one device (the client thread connects to the listener's port),
 * without rdma-core's headers (the declarations of <rdma/rsocket.h> are
 * written out). Prints "ok <what>" per check, "FAIL <what>" and exits 1
 * on a failure. Usage: rsocket_checks DEVICE_IP PORT */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

int rsocket(int, int, int);
int rbind(int, const struct sockaddr *, socklen_t);
int rlisten(int, int);
int raccept(int, struct sockaddr *, socklen_t *);
int rconnect(int, const struct sockaddr *, socklen_t);
int rshutdown(int, int);
int rclose(int);
ssize_t rrecv(int, void *, size_t, int);
ssize_t rsend(int, const void *, size_t, int);
ssize_t rsendto(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
int rpoll(struct pollfd *, nfds_t, int);
int rgetpeername(int, struct sockaddr *, socklen_t *);
int rgetsockname(int, struct sockaddr *, socklen_t *);
int rsetsockopt(int, int, int, const void *, socklen_t);
int rgetsockopt(int, int, int, void *, socklen_t *);
int rfcntl(int, int, ...);
off_t riomap(int, void *, size_t, int, int, off_t);
int riounmap(int, void *, size_t);
size_t riowrite(int, const void *, size_t, off_t, int);

#define SOL_RDMA 0x10000
#define RDMA_INLINE 2

static int failed;

static void check(int cond, const char *what)
{
    printf("%s %s\n", cond ? "ok" : "FAIL", what);
    fflush(stdout);
    if (!cond)
        failed = 1;
}

static int fails_with(long ret, int err) { return ret == -1 && errno == err; }

static struct sockaddr_in sin_of(const char *ip, int port)
{
    struct sockaddr_in s;
    memset(&s, 0, sizeof s);
    s.sin_family = AF_INET;
    s.sin_port = htons(port);
    inet_pton(AF_INET, ip, &s.sin_addr);
    return s;
}

static const char *ip;
static int port;
static int listener;

static void *connect_thread(void *arg)
{
    int *out = arg;
    struct sockaddr_in a = sin_of(ip, port);
    int s = rsocket(AF_INET, SOCK_STREAM, 0);
    *out = (s >= 0 && rconnect(s, (struct sockaddr *) &a, sizeof a) == 0) ? s : -1;
    return NULL;
}

/* A connected pair: (accepted, client). */
static void pair(int *srv, int *cli)
{
    pthread_t t;
    struct sockaddr_in peer;
    socklen_t len = sizeof peer;
    pthread_create(&t, NULL, connect_thread, cli);
    *srv = raccept(listener, (struct sockaddr *) &peer, &len);
    pthread_join(t, NULL);
    check(*srv >= 0 && *cli >= 0, "a pair connects (raccept, rconnect)");
    check(len == sizeof peer && peer.sin_family == AF_INET, "raccept gives the peer's address");
}

static void pattern(unsigned char *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char) (i * 131 + seed + (i >> 8));
}

/* Receives exactly n bytes (blocking calls). */
static ssize_t recv_all(int s, unsigned char *b, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = rrecv(s, b + got, n - got, 0);
        if (k <= 0)
            return k;
        got += k;
    }
    return got;
}

static void *send_thread(void *arg)
{
    int *s = arg;
    size_t n = 1 << 20;
    unsigned char *b = malloc(n);
    pattern(b, n, 7);
    ssize_t k = rsend(*s, b, n, 0);
    free(b);
    *s = (k == (ssize_t) n);
    return NULL;
}

int main(int argc, char **argv)
{
    char byte = 'x', buf[64];
    ip = argc > 1 ? argv[1] : "127.0.0.1";
    port = argc > 2 ? atoi(argv[2]) : 7480;
    struct sockaddr_in a = sin_of(ip, port), b;
    socklen_t len;
    int val, srv, cli;

    /* Not sockets of this library. */
    check(fails_with(rsend(12345, &byte, 1, 0), EBADF), "rsend on an unknown fd: EBADF");
    check(fails_with(rrecv(-1, buf, 1, 0), EBADF), "rrecv on -1: EBADF");
    check(fails_with(rclose(12345), EBADF), "rclose of an unknown fd: EBADF");
    check(fails_with(rshutdown(12345, SHUT_RDWR), EBADF), "rshutdown of an unknown fd: EBADF");
    check(fails_with(rsocket(AF_INET, SOCK_DGRAM, 0), ENOTSUP), "datagram rsocket: ENOTSUP");
    check(fails_with(rsocket(AF_UNIX, SOCK_STREAM, 0), ENOTSUP), "AF_UNIX rsocket: ENOTSUP");

    /* Before connecting. */
    int s = rsocket(AF_INET, SOCK_STREAM, 0);
    check(s >= 0, "rsocket");
    check(fails_with(rsend(s, &byte, 1, 0), ENOTCONN), "rsend unconnected: ENOTCONN");
    check(fails_with(rrecv(s, buf, 1, 0), ENOTCONN), "rrecv unconnected: ENOTCONN");
    len = sizeof val;
    check(fails_with(rgetsockopt(s, SOL_SOCKET, SO_TYPE, &val, &len), ENOTSUP), "unknown option: ENOTSUP");
    val = 1 << 16;
    check(rsetsockopt(s, SOL_SOCKET, SO_RCVBUF, &val, sizeof val) == 0, "SO_RCVBUF set");
    len = sizeof val;
    check(rgetsockopt(s, SOL_SOCKET, SO_RCVBUF, &val, &len) == 0 && val == 1 << 17, "SO_RCVBUF doubled, as Linux");
    /* No listener on this port of a device that exists: refused at once. */
    struct sockaddr_in none = sin_of(ip, port + 1);
    check(fails_with(rconnect(s, (struct sockaddr *) &none, sizeof none), ECONNREFUSED), "rconnect, no listener: ECONNREFUSED");
    len = sizeof val;
    check(rgetsockopt(s, SOL_SOCKET, SO_ERROR, &val, &len) == 0 && val == ECONNREFUSED, "SO_ERROR says ECONNREFUSED");
    check(rclose(s) == 0, "rclose after a refusal");

    listener = rsocket(AF_INET, SOCK_STREAM, 0);
    val = 1;
    check(rsetsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &val, sizeof val) == 0, "SO_REUSEADDR");
    check(rbind(listener, (struct sockaddr *) &a, sizeof a) == 0, "rbind");
    check(rlisten(listener, 4) == 0, "rlisten");
    check(rfcntl(listener, F_SETFL, O_NONBLOCK) == 0 && (rfcntl(listener, F_GETFL) & O_NONBLOCK), "rfcntl O_NONBLOCK");
    check(fails_with(raccept(listener, NULL, NULL), EAGAIN), "raccept, nothing pending, non-blocking: EAGAIN");
    struct pollfd lp = { .fd = listener, .events = POLLIN };
    check(rpoll(&lp, 1, 50) == 0, "rpoll on an idle listener times out (50 ms)");
    rfcntl(listener, F_SETFL, 0);

    pair(&srv, &cli);
    len = sizeof b;
    check(rgetsockname(cli, (struct sockaddr *) &b, &len) == 0 && b.sin_addr.s_addr == a.sin_addr.s_addr, "rgetsockname");
    len = sizeof b;
    check(rgetpeername(cli, (struct sockaddr *) &b, &len) == 0 && b.sin_port == htons(port), "rgetpeername: the listener's port");
    check(fails_with(rrecv(srv, buf, 1, MSG_DONTWAIT), EAGAIN), "rrecv MSG_DONTWAIT, no data: EAGAIN");
    struct pollfd p = { .fd = srv, .events = POLLIN };
    check(rpoll(&p, 1, 30) == 0 && p.revents == 0, "rpoll, no data: times out");
    p.events = POLLOUT;
    check(rpoll(&p, 1, 1000) == 1 && (p.revents & POLLOUT), "rpoll: writable");
    val = 0;
    check(fails_with(rsetsockopt(cli, SOL_RDMA, RDMA_INLINE, &val, sizeof val), EINVAL), "SOL_RDMA option once connected: EINVAL");
    check(fails_with(rsendto(cli, &byte, 1, 0, (struct sockaddr *) &a, sizeof a), EISCONN), "rsendto with an address: EISCONN");

    /* Data: 1 MiB one way (a thread sends), checked byte for byte. */
    size_t n = 1 << 20;
    unsigned char *got = malloc(n), *want = malloc(n);
    pattern(want, n, 7);
    pthread_t t;
    int sender = cli;
    pthread_create(&t, NULL, send_thread, &sender);
    ssize_t k = rrecv(srv, got, 100, MSG_PEEK);
    check(k > 0 && memcmp(got, want, k) == 0, "MSG_PEEK sees the first bytes");
    k = rrecv(srv, got, n, MSG_WAITALL);
    pthread_join(t, NULL);
    check(sender == 1, "rsend of 1 MiB sent it all");
    check(k == (ssize_t) n && memcmp(got, want, n) == 0, "MSG_WAITALL: 1 MiB intact");

    /* The other way, readiness first. */
    check(rsend(srv, "ping", 4, 0) == 4, "rsend 4 bytes");
    p.fd = cli;
    p.events = POLLIN;
    check(rpoll(&p, 1, 5000) == 1 && (p.revents & POLLIN), "rpoll: readable once data came");
    check(rrecv(cli, buf, sizeof buf, 0) == 4 && memcmp(buf, "ping", 4) == 0, "rrecv the 4 bytes");

    /* A non-blocking sender fills the receiver's ring: EAGAIN. */
    rfcntl(cli, F_SETFL, O_NONBLOCK);
    size_t sent = 0;
    int again = 0;
    for (int i = 0; i < 100000 && !again; i++) {
        /* The stream is the pattern's first 64 KiB over and over. */
        k = rsend(cli, want + sent % 65536, 65536 - sent % 65536, 0);
        if (k > 0)
            sent += k;
        else if (k == -1 && (errno == EAGAIN || errno == EWOULDBLOCK))
            again = 1;
        else
            break;
    }
    check(again && sent > 0, "non-blocking rsend, peer not reading: EAGAIN once its ring is full");
    rfcntl(cli, F_SETFL, 0);
    /* Drain what was sent, checking it byte for byte. */
    size_t left = sent, bad = 0;
    while (left > 0) {
        size_t want_n = left < 65536 ? left : 65536;
        size_t off = (sent - left) % 65536;
        size_t chunk = want_n < 65536 - off ? want_n : 65536 - off;
        k = rrecv(srv, got, chunk, MSG_WAITALL);
        if (k != (ssize_t) chunk) {
            bad = 1;
            break;
        }
        if (memcmp(got, want + off, chunk))
            bad = 1;
        left -= chunk;
    }
    check(!bad, "what the non-blocking sender sent arrives intact");

    /* riomap / riowrite errors. */
    check(fails_with(riomap(cli, buf, sizeof buf, PROT_READ, 0, 0), EINVAL), "riomap PROT_READ: EINVAL");
    check(fails_with((long) riowrite(cli, buf, 8, 0, 0), EINVAL), "riowrite with no mapping: EINVAL");
    check(fails_with(riounmap(cli, buf, sizeof buf), EINVAL), "riounmap of nothing mapped: EINVAL");

    /* Half close: the client shuts writing; the server reads end of
     * stream and can still send. */
    check(rsend(cli, "last", 4, 0) == 4, "rsend before shutdown");
    check(rshutdown(cli, SHUT_WR) == 0, "rshutdown SHUT_WR");
    check(fails_with(rsend(cli, &byte, 1, 0), EPIPE), "rsend after SHUT_WR: EPIPE");
    check(recv_all(srv, (unsigned char *) buf, 4) == 4 && memcmp(buf, "last", 4) == 0, "data before the shutdown arrives");
    check(rrecv(srv, buf, sizeof buf, 0) == 0, "then end of stream (0)");
    check(rsend(srv, "back", 4, 0) == 4, "the other direction still sends");
    check(recv_all(cli, (unsigned char *) buf, 4) == 4 && memcmp(buf, "back", 4) == 0, "and the half-closed side reads it");

    /* Full close of one side. */
    check(rclose(srv) == 0, "rclose");
    p.fd = cli;
    p.events = POLLIN;
    check(rpoll(&p, 1, 5000) == 1 && (p.revents & (POLLHUP | POLLIN)), "rpoll after the peer closed: hang-up");
    check(rrecv(cli, buf, sizeof buf, 0) == 0, "rrecv after the peer closed: 0");
    check(fails_with(rsend(cli, &byte, 1, 0), EPIPE), "rsend after the peer closed: EPIPE");
    check(rclose(cli) == 0, "rclose the other");
    check(fails_with(rsend(cli, &byte, 1, 0), EBADF), "rsend on a closed rsocket: EBADF");

    /* A second pair on the same listener, closed from the client side. */
    pair(&srv, &cli);
    check(rsend(cli, "x", 1, 0) == 1 && rrecv(srv, buf, 1, 0) == 1 && buf[0] == 'x', "second pair moves data");
    check(rclose(cli) == 0 && rrecv(srv, buf, 1, 0) == 0, "server reads end of stream after the client's rclose");
    check(rclose(srv) == 0 && rclose(listener) == 0, "rclose the rest");

    free(got);
    free(want);
    printf(failed ? "FAILED\n" : "ALL OK\n");
    return failed;
}
