/* ECE through the drop-in librdmacm: rdma_set_local_ece,
 * rdma_get_remote_ece, rdma_reject_ece, and the options the CM sets on the
 * QPs it moves. One process, a listener and a client on its one device.
 *
 * - Argument checks, as rdma-core: NULL id or ece, vendor 0, a comp_mask,
 *   and an id with a QP are EINVAL.
 * - Ids with QPs (rdma_create_qp): connected, a SEND checked byte for
 *   byte; the QPs run selective repeat exactly when EXPECT_SR is 1 (the
 *   harness sets SOFTRDMA_CM_ECE=1 for that run), read from the process's
 *   own statistics socket ("selective_repeat" of each QP).
 * - Ids without QPs (UCX's way): the client offers two options, the
 *   server reads them with rdma_get_remote_ece, answers with one, and the
 *   client reads the agreed one after CONNECT_RESPONSE.
 * - rdma_reject_ece: the client's REJECTED has status 35.
 *
 * No rdma-core rdma_cma.h (Debian packages it in librdmacm-dev): the
 * declarations are written out with rdma-core v44's x86-64 layout;
 * <infiniband/verbs.h> gives the verbs. Prints "ok <what>" per check,
 * "FAIL <what>"; exits 1 on a failure.
 * Usage: ece_cm DEVICE_IP PORT EXPECT_SR */
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

struct chan { int fd; };
struct cm_id {                  /* struct rdma_cm_id */
    struct ibv_context *verbs;
    struct chan *channel;
    void *context;
    struct ibv_qp *qp;
    struct {                    /* struct rdma_route */
        struct sockaddr_storage src, dst;
        union ibv_gid sgid, dgid;
        uint16_t pkey;
        void *path_rec;
        int num_paths;
    } route;
    int ps;
    uint8_t port_num;
    void *event;
    struct ibv_comp_channel *send_cq_channel;
    struct ibv_cq *send_cq;
    struct ibv_comp_channel *recv_cq_channel;
    struct ibv_cq *recv_cq;
    struct ibv_srq *srq;
    struct ibv_pd *pd;
    int qp_type;
};
struct conn_param {             /* struct rdma_conn_param */
    const void *private_data;
    uint8_t private_data_len, responder_resources, initiator_depth,
        flow_control, retry_count, rnr_retry_count, srq;
    uint32_t qp_num;
};
struct cm_event {               /* struct rdma_cm_event */
    struct cm_id *id, *listen_id;
    int event, status;
    struct conn_param conn;
};

struct chan *rdma_create_event_channel(void);
void rdma_destroy_event_channel(struct chan *);
int rdma_create_id(struct chan *, struct cm_id **, void *, int);
int rdma_destroy_id(struct cm_id *);
int rdma_bind_addr(struct cm_id *, struct sockaddr *);
int rdma_resolve_addr(struct cm_id *, struct sockaddr *, struct sockaddr *, int);
int rdma_resolve_route(struct cm_id *, int);
int rdma_listen(struct cm_id *, int);
int rdma_get_cm_event(struct chan *, struct cm_event **);
int rdma_ack_cm_event(struct cm_event *);
int rdma_connect(struct cm_id *, struct conn_param *);
int rdma_accept(struct cm_id *, struct conn_param *);
int rdma_establish(struct cm_id *);
int rdma_disconnect(struct cm_id *);
int rdma_create_qp(struct cm_id *, struct ibv_pd *, struct ibv_qp_init_attr *);
void rdma_destroy_qp(struct cm_id *);
int rdma_set_local_ece(struct cm_id *, struct ibv_ece *);
int rdma_get_remote_ece(struct cm_id *, struct ibv_ece *);
int rdma_reject_ece(struct cm_id *, const void *, uint8_t);

#define PS_TCP 0x0106
#define EV_ADDR_RESOLVED 0
#define EV_ROUTE_RESOLVED 2
#define EV_CONNECT_REQUEST 4
#define EV_CONNECT_RESPONSE 5
#define EV_REJECTED 8
#define EV_ESTABLISHED 9
#define EV_DISCONNECTED 10
#define VENDOR 0x00535201u
#define SR 1u

static int failed;

static void check(int cond, const char *what)
{
    printf("%s %s\n", cond ? "ok" : "FAIL", what);
    fflush(stdout);
    if (!cond)
        failed = 1;
}

static void die(const char *what)
{
    printf("FAIL %s (errno %d %s)\n", what, errno, strerror(errno));
    exit(1);
}

static int fails_with(int ret, int err) { return ret == -1 && errno == err; }

static struct sockaddr_in sin_of(const char *ip, int port)
{
    struct sockaddr_in s;
    memset(&s, 0, sizeof s);
    s.sin_family = AF_INET;
    s.sin_port = htons(port);
    inet_pton(AF_INET, ip, &s.sin_addr);
    return s;
}

/* The next event on `ch`, which must be `type` (within 20 s); its status
 * in *status if asked. Returns the event's id; the event is acked. */
static struct cm_id *expect(struct chan *ch, int type, int *status, const char *what)
{
    struct pollfd p = { .fd = ch->fd, .events = POLLIN };
    struct cm_event *ev;
    struct cm_id *id;

    if (poll(&p, 1, 20000) != 1) {
        printf("FAIL %s: no event within 20 s\n", what);
        exit(1);
    }
    if (rdma_get_cm_event(ch, &ev))
        die(what);
    if (ev->event != type) {
        printf("FAIL %s: event %d status %d, want %d\n", what, ev->event, ev->status, type);
        exit(1);
    }
    id = ev->id;
    if (status)
        *status = ev->status;
    rdma_ack_cm_event(ev);
    return id;
}

/* A listener on ip:port with its own channel. */
static struct cm_id *listener(struct chan *ch, const char *ip, int port)
{
    struct sockaddr_in a = sin_of(ip, port);
    struct cm_id *l;

    if (rdma_create_id(ch, &l, NULL, PS_TCP) || rdma_bind_addr(l, (struct sockaddr *)&a) ||
        rdma_listen(l, 4))
        die("listener");
    return l;
}

/* A client id resolved towards ip:port. */
static struct cm_id *client(struct chan *ch, const char *ip, int port)
{
    struct sockaddr_in a = sin_of(ip, port);
    struct cm_id *c;

    if (rdma_create_id(ch, &c, NULL, PS_TCP) ||
        rdma_resolve_addr(c, NULL, (struct sockaddr *)&a, 2000))
        die("client");
    expect(ch, EV_ADDR_RESOLVED, NULL, "addr resolved");
    if (rdma_resolve_route(c, 2000))
        die("resolve_route");
    expect(ch, EV_ROUTE_RESOLVED, NULL, "route resolved");
    return c;
}

static void make_qp(struct cm_id *id)
{
    struct ibv_qp_init_attr a;

    memset(&a, 0, sizeof a);
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = a.cap.max_recv_wr = 8;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    if (rdma_create_qp(id, NULL, &a))
        die("rdma_create_qp");
}

/* Whether the process's statistics say QP `qpn` runs selective repeat
 * (1), does not (0), or the QP is not found (-1). */
static int runs_sr(uint32_t qpn)
{
    static char buf[1 << 16];
    const char *dir = getenv("SOFTRDMA_RUN_DIR");
    char def[64], key[32], *at, *sr;
    struct sockaddr_un un;
    size_t n = 0;
    ssize_t r;
    int s;

    if (!dir) {
        snprintf(def, sizeof def, "/tmp/softrdma-%u", (unsigned)getuid());
        dir = def;
    }
    memset(&un, 0, sizeof un);
    un.sun_family = AF_UNIX;
    snprintf(un.sun_path, sizeof un.sun_path, "%s/stats-srx0-%d-0.sock", dir, (int)getpid());
    s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&un, sizeof un))
        die("statistics socket");
    while (n < sizeof buf - 1 && (r = read(s, buf + n, sizeof buf - 1 - n)) > 0)
        n += (size_t)r;
    close(s);
    buf[n] = 0;
    snprintf(key, sizeof key, "\"qpn\":%u,", qpn);
    at = strstr(buf, key);
    if (!at)
        return -1;
    sr = strstr(at, "\"selective_repeat\":");
    if (!sr)
        return -1;
    return strncmp(sr + 19, "true", 4) == 0;
}

static void managed(const char *ip, int port, int expect_sr)
{
    struct chan *lch = rdma_create_event_channel(), *cch = rdma_create_event_channel();
    struct cm_id *l = listener(lch, ip, port), *c = client(cch, ip, port), *s;
    struct ibv_ece e = { .vendor_id = VENDOR, .options = SR };
    struct ibv_sge sge;
    struct ibv_send_wr swr, *bad;
    struct ibv_recv_wr rwr, *rbad;
    struct ibv_wc wc;
    char *sbuf = calloc(1, 4096), *rbuf = calloc(1, 4096);
    struct ibv_mr *smr, *rmr;
    int i, n;

    make_qp(c);
    check(fails_with(rdma_set_local_ece(c, &e), EINVAL), "set_local_ece on an id with a QP: EINVAL");
    check(fails_with(rdma_get_remote_ece(c, &e), EINVAL), "get_remote_ece on an id with a QP: EINVAL");
    if (rdma_connect(c, NULL))
        die("rdma_connect");
    s = expect(lch, EV_CONNECT_REQUEST, NULL, "connect request");
    make_qp(s);
    rmr = ibv_reg_mr(s->pd, rbuf, 4096, IBV_ACCESS_LOCAL_WRITE);
    smr = ibv_reg_mr(c->pd, sbuf, 4096, IBV_ACCESS_LOCAL_WRITE);
    if (!rmr || !smr)
        die("ibv_reg_mr");
    sge = (struct ibv_sge){ .addr = (uintptr_t)rbuf, .length = 4096, .lkey = rmr->lkey };
    rwr = (struct ibv_recv_wr){ .wr_id = 2, .sg_list = &sge, .num_sge = 1 };
    if (ibv_post_recv(s->qp, &rwr, &rbad))
        die("ibv_post_recv");
    if (rdma_accept(s, NULL))
        die("rdma_accept");
    expect(cch, EV_ESTABLISHED, NULL, "client established");
    expect(lch, EV_ESTABLISHED, NULL, "server established");
    check(runs_sr(c->qp->qp_num) == expect_sr, expect_sr ? "client QP runs selective repeat"
                                                         : "client QP runs go-back-N");
    check(runs_sr(s->qp->qp_num) == expect_sr, expect_sr ? "server QP runs selective repeat"
                                                         : "server QP runs go-back-N");
    for (i = 0; i < 4096; i++)
        sbuf[i] = (char)(i * 7 + 3);
    sge = (struct ibv_sge){ .addr = (uintptr_t)sbuf, .length = 4096, .lkey = smr->lkey };
    memset(&swr, 0, sizeof swr);
    swr.wr_id = 1;
    swr.sg_list = &sge;
    swr.num_sge = 1;
    swr.opcode = IBV_WR_SEND;
    swr.send_flags = IBV_SEND_SIGNALED;
    if (ibv_post_send(c->qp, &swr, &bad))
        die("ibv_post_send");
    for (i = 0, n = 0; i < 20000 && n == 0; i++) {
        n = ibv_poll_cq(s->recv_cq, 1, &wc);
        if (!n)
            usleep(1000);
    }
    check(n == 1 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 4096 &&
              memcmp(sbuf, rbuf, 4096) == 0,
          "4 KiB SEND over the CM's QPs, every byte intact");
    rdma_disconnect(c);
    expect(lch, EV_DISCONNECTED, NULL, "server disconnected");
    rdma_disconnect(s);
    expect(cch, EV_DISCONNECTED, NULL, "client disconnected");
    ibv_dereg_mr(smr);
    ibv_dereg_mr(rmr);
    rdma_destroy_qp(c);
    rdma_destroy_qp(s);
    rdma_destroy_id(s);
    rdma_destroy_id(c);
    rdma_destroy_id(l);
    free(sbuf);
    free(rbuf);
}

static void qpless(const char *ip, int port)
{
    struct chan *lch = rdma_create_event_channel(), *cch = rdma_create_event_channel();
    struct cm_id *l = listener(lch, ip, port), *c = client(cch, ip, port), *s;
    struct ibv_ece offer = { .vendor_id = VENDOR, .options = SR | 2 };
    struct ibv_ece mine = { .vendor_id = VENDOR, .options = SR };
    struct ibv_ece got;
    struct conn_param p;
    int status;

    memset(&got, 0xAA, sizeof got);
    check(rdma_get_remote_ece(c, &got) == 0 && got.vendor_id == 0 && got.options == 0 &&
              got.comp_mask == 0,
          "get_remote_ece before any exchange: zero");
    check(rdma_set_local_ece(c, &offer) == 0, "set_local_ece on an id without a QP");
    memset(&p, 0, sizeof p);
    p.qp_num = 0x456;
    if (rdma_connect(c, &p))
        die("rdma_connect (no QP)");
    s = expect(lch, EV_CONNECT_REQUEST, NULL, "connect request (no QP)");
    check(rdma_get_remote_ece(s, &got) == 0 && got.vendor_id == VENDOR &&
              got.options == (SR | 2),
          "server reads the REQ's offer");
    check(rdma_set_local_ece(s, &mine) == 0, "server sets its answer");
    p.qp_num = 0x123;
    if (rdma_accept(s, &p))
        die("rdma_accept (no QP)");
    expect(cch, EV_CONNECT_RESPONSE, NULL, "connect response");
    check(rdma_get_remote_ece(c, &got) == 0 && got.vendor_id == VENDOR && got.options == SR,
          "client reads the REP's answer: the agreed option");
    if (rdma_establish(c))
        die("rdma_establish");
    expect(lch, EV_ESTABLISHED, NULL, "server established (no QP)");
    rdma_disconnect(c);
    expect(lch, EV_DISCONNECTED, NULL, "server disconnected (no QP)");
    rdma_disconnect(s);
    expect(cch, EV_DISCONNECTED, NULL, "client disconnected (no QP)");
    rdma_destroy_id(s);

    /* A request refused for its ECE: REJECTED with reason 35. */
    rdma_destroy_id(c);
    c = client(cch, ip, port);
    check(rdma_set_local_ece(c, &offer) == 0, "set_local_ece for the refused request");
    p.qp_num = 0x789;
    if (rdma_connect(c, &p))
        die("rdma_connect (refused)");
    s = expect(lch, EV_CONNECT_REQUEST, NULL, "connect request (refused)");
    check(rdma_reject_ece(s, "no", 2) == 0, "reject_ece");
    expect(cch, EV_REJECTED, &status, "rejected");
    check(status == 35, "REJECTED's status is 35 (vendor option not supported)");
    rdma_destroy_id(s);
    rdma_destroy_id(c);
    rdma_destroy_id(l);
    rdma_destroy_event_channel(lch);
    rdma_destroy_event_channel(cch);
}

int main(int argc, char **argv)
{
    const char *ip = argc > 1 ? argv[1] : "127.0.0.1";
    int port = argc > 2 ? atoi(argv[2]) : 7490;
    int expect_sr = argc > 3 ? atoi(argv[3]) : 0;
    struct chan *ch = rdma_create_event_channel();
    struct ibv_ece e = { .vendor_id = VENDOR, .options = SR };
    struct cm_id *id;

    if (!ch || rdma_create_id(ch, &id, NULL, PS_TCP))
        die("rdma_create_id");
    check(fails_with(rdma_set_local_ece(NULL, &e), EINVAL), "set_local_ece NULL id: EINVAL");
    check(fails_with(rdma_set_local_ece(id, NULL), EINVAL), "set_local_ece NULL ece: EINVAL");
    e.vendor_id = 0;
    check(fails_with(rdma_set_local_ece(id, &e), EINVAL), "set_local_ece vendor 0: EINVAL");
    e.vendor_id = VENDOR;
    e.comp_mask = 1;
    check(fails_with(rdma_set_local_ece(id, &e), EINVAL), "set_local_ece comp_mask: EINVAL");
    check(fails_with(rdma_get_remote_ece(NULL, &e), EINVAL), "get_remote_ece NULL id: EINVAL");
    check(fails_with(rdma_get_remote_ece(id, NULL), EINVAL), "get_remote_ece NULL ece: EINVAL");
    check(fails_with(rdma_reject_ece(id, NULL, 0), EINVAL), "reject_ece without a request: EINVAL");
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ch);

    managed(ip, port, expect_sr);
    qpless(ip, port + 1);
    printf(failed ? "FAILED\n" : "ALL OK\n");
    return failed;
}
