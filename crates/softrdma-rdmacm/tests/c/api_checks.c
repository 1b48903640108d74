/* Checks the drop-in librdmacm's answers to bad arguments, multicast joins, its ENOSYS
 * stubs and the event channel's fd, without rdma-core's headers (Debian
 * packages them in librdmacm-dev): the few declarations needed are
 * written out here, with the layout of rdma-core v44 on x86-64.
 * Prints "ok <what>" per check, "FAIL <what>" and exits 1 on a failure. */
#include <errno.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

struct chan { int fd; };
struct cm_event {          /* struct rdma_cm_event, first fields */
    void *id, *listen_id;
    int event, status;
    unsigned char param[56];
};
struct conn_param {        /* struct rdma_conn_param */
    const void *private_data;
    uint8_t private_data_len, responder_resources, initiator_depth,
        flow_control, retry_count, rnr_retry_count, srq;
    uint32_t qp_num;
};

struct chan *rdma_create_event_channel(void);
void rdma_destroy_event_channel(struct chan *);
int rdma_create_id(struct chan *, void **, void *, int);
int rdma_destroy_id(void *);
int rdma_bind_addr(void *, struct sockaddr *);
int rdma_resolve_addr(void *, struct sockaddr *, struct sockaddr *, int);
int rdma_listen(void *, int);
int rdma_get_cm_event(struct chan *, struct cm_event **);
int rdma_ack_cm_event(struct cm_event *);
int rdma_connect(void *, struct conn_param *);
int rdma_getaddrinfo(const char *, const char *, const void *, void **);
const char *rdma_event_str(int);
int rdma_join_multicast(void *, struct sockaddr *, void *);
int rdma_leave_multicast(void *, struct sockaddr *);
void **rdma_get_devices(int *);
void rdma_free_devices(void **);
int rsocket(int, int, int);
int rdma_set_option(void *, int, int, void *, size_t);
int rdma_establish(void *);
struct ah_attr {           /* struct ibv_ah_attr */
    uint8_t dgid[16];
    uint32_t flow_label;
    uint8_t sgid_index, hop_limit, traffic_class;
    uint16_t dlid;
    uint8_t sl, src_path_bits, static_rate, is_global, port_num;
};
struct qp_attr {           /* struct ibv_qp_attr */
    unsigned qp_state, cur_qp_state, path_mtu, path_mig_state;
    uint32_t qkey, rq_psn, sq_psn, dest_qp_num;
    unsigned qp_access_flags;
    uint32_t cap[5];
    struct ah_attr ah_attr, alt_ah_attr;
    uint16_t pkey_index, alt_pkey_index;
    uint8_t en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic,
        min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout;
    uint32_t rate_limit;
};
int rdma_init_qp_attr(void *, struct qp_attr *, int *);
struct srq_init {          /* struct ibv_srq_init_attr */
    void *srq_context;
    uint32_t max_wr, max_sge, srq_limit;
};
int rdma_create_srq(void *, void *, struct srq_init *);
void rdma_destroy_srq(void *);
int rdma_notify(void *, int);

#define PS_TCP 0x0106
static int failed;

static void check(int cond, const char *what)
{
    printf("%s %s\n", cond ? "ok" : "FAIL", what);
    if (!cond)
        failed = 1;
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

static int readable(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    return poll(&p, 1, 0) == 1;
}

int main(int argc, char **argv)
{
    const char *dev_ip = argc > 1 ? argv[1] : "127.0.0.1";
    struct chan *ch = rdma_create_event_channel();
    struct cm_event *ev;
    void *id, *id2, *res;
    int ret;

    check(ch != NULL && ch->fd >= 0, "channel with an fd");
    check(fails_with(rdma_create_id(ch, NULL, NULL, PS_TCP), EINVAL), "create_id NULL out: EINVAL");
    check(fails_with(rdma_create_id(ch, &id, NULL, 0x7777), EINVAL), "create_id bad port space: EINVAL");
    check(fails_with(rdma_bind_addr(NULL, NULL), EINVAL), "bind_addr NULL id: EINVAL");
    check(fails_with(rdma_get_cm_event(NULL, &ev), EINVAL), "get_cm_event NULL channel: EINVAL");
    check(fails_with(rdma_get_cm_event(ch, NULL), EINVAL), "get_cm_event NULL out: EINVAL");
    check(fails_with(rdma_ack_cm_event(NULL), EINVAL), "ack_cm_event NULL: EINVAL");
    check(fails_with(rdma_getaddrinfo(NULL, NULL, NULL, &res), EINVAL), "getaddrinfo no node, no service: EINVAL");
    check(fails_with(rdma_getaddrinfo(NULL, "7471", NULL, NULL), EINVAL), "getaddrinfo NULL out: EINVAL");
    check(strcmp(rdma_event_str(9), "RDMA_CM_EVENT_ESTABLISHED") == 0, "event_str(9)");
    check(strcmp(rdma_event_str(99), "UNKNOWN EVENT") == 0, "event_str(99)");
    check(fails_with(rdma_join_multicast(NULL, NULL, NULL), EINVAL), "join_multicast NULL: EINVAL");
    {
        /* A UD id: joins need a bound device and a multicast address;
         * MULTICAST_JOIN carries the group's MGID (::ffff:239.1.1.1),
         * QPN 0xFFFFFF, RDMA_UDP_QKEY and the join's context. */
        void *uid = NULL;
        struct cm_event *ev = NULL;
        struct sockaddr_in g = { .sin_family = AF_INET }, lo = { .sin_family = AF_INET };
        uint8_t mgid[16] = { [10] = 0xff, [11] = 0xff, [12] = 239, [13] = 1, [14] = 1, [15] = 1 };
        uint32_t qpn = 0, qkey = 0;
        void *ctx = NULL;

        inet_pton(AF_INET, "239.1.1.1", &g.sin_addr);
        inet_pton(AF_INET, "127.0.0.1", &lo.sin_addr);
        check(rdma_create_id(ch, &uid, NULL, 0x0111) == 0, "create_id UDP");
        check(fails_with(rdma_join_multicast(uid, (struct sockaddr *)&g, NULL), EINVAL),
              "join_multicast unbound: EINVAL");
        check(rdma_bind_addr(uid, (struct sockaddr *)&lo) == 0, "bind UDP id");
        check(fails_with(rdma_join_multicast(uid, (struct sockaddr *)&lo, NULL), EINVAL),
              "join_multicast unicast address: EINVAL");
        check(fails_with(rdma_leave_multicast(uid, (struct sockaddr *)&g), EADDRNOTAVAIL),
              "leave_multicast not joined: EADDRNOTAVAIL");
        check(rdma_join_multicast(uid, (struct sockaddr *)&g, &g) == 0, "join_multicast");
        check(rdma_get_cm_event(ch, &ev) == 0 && ev->event == 12, "MULTICAST_JOIN event");
        if (ev) {
            memcpy(&ctx, ev->param, sizeof ctx);
            memcpy(&qpn, ev->param + 48, 4);
            memcpy(&qkey, ev->param + 52, 4);
            check(memcmp(ev->param + 16, mgid, 16) == 0, "join: the group's MGID");
            check(qpn == 0xffffff && qkey == 0x01234567, "join: QPN 0xFFFFFF, RDMA_UDP_QKEY");
            check(ctx == (void *)&g, "join: the context in param.ud.private_data");
            rdma_ack_cm_event(ev);
        }
        check(rdma_leave_multicast(uid, (struct sockaddr *)&g) == 0, "leave_multicast");
        rdma_destroy_id(uid);
    }
    check(fails_with(rsocket(AF_INET, SOCK_DGRAM, 0), ENOTSUP), "datagram rsocket: ENOTSUP");
    {
        /* Every device's context, NULL-terminated; the count if asked. */
        int n = -1, i, all = 1;
        void **devs = rdma_get_devices(&n);
        check(devs != NULL && n >= 1, "get_devices: a list of at least one context");
        for (i = 0; devs != NULL && i < n; i++)
            all = all && devs[i] != NULL;
        check(devs != NULL && all && devs[n] == NULL, "get_devices: n contexts, then NULL");
        rdma_free_devices(devs);
        devs = rdma_get_devices(NULL);
        check(devs != NULL && devs[0] != NULL, "get_devices(NULL): the list");
        rdma_free_devices(devs);
    }

    ret = rdma_create_id(ch, &id, NULL, PS_TCP);
    check(ret == 0 && id != NULL, "create_id");
    struct sockaddr_in nodev = sin_of("192.0.2.1", 0);
    check(fails_with(rdma_bind_addr(id, (struct sockaddr *)&nodev), ENODEV), "bind to an address no device has: ENODEV");
    {
        /* A loopback address no device has binds the first device, as the
         * kernel's rdma_cm does (libfabric binds "localhost"); id->verbs
         * is the first field of struct rdma_cm_id. */
        void *lid = NULL;
        struct sockaddr_in lo = sin_of("127.0.0.99", 0);
        check(rdma_create_id(ch, &lid, NULL, PS_TCP) == 0 &&
                  rdma_bind_addr(lid, (struct sockaddr *)&lo) == 0 && *(void **)lid != NULL,
              "bind to a loopback address no device has: the first device");
        if (lid)
            rdma_destroy_id(lid);
    }
    check(fails_with(rdma_bind_addr(id, NULL), EINVAL), "bind NULL address: EINVAL");
    check(fails_with(rdma_resolve_addr(id, NULL, NULL, 100), EINVAL), "resolve_addr NULL destination: EINVAL");
    check(fails_with(rdma_connect(id, NULL), EINVAL), "connect before resolving: EINVAL");

    /* The fd is readable exactly while events wait. */
    check(!readable(ch->fd), "fd not readable before events");
    struct sockaddr_in dst = sin_of(dev_ip, 7471);
    check(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 100) == 0, "resolve_addr");
    check(readable(ch->fd), "fd readable with ADDR_RESOLVED queued");
    ev = NULL;
    check(rdma_get_cm_event(ch, &ev) == 0 && ev && ev->event == 0 && ev->status == 0 && ev->id == id,
          "ADDR_RESOLVED for the id");
    /* With a device, the id has librdmacm's per-device PD (id->pd, at byte
     * 400 of struct rdma_cm_id): UCX's rdmacm transport makes QPs in it. */
    check(*(void **)((char *)id + 400) != NULL, "a resolved id has the device's PD");
    check(rdma_ack_cm_event(ev) == 0, "ack");
    check(!readable(ch->fd), "fd not readable once taken");
    {
        /* rdma_create_srq: a basic SRQ for a TCP id, kept in id->srq (byte
         * 392); one per id; rdma_destroy_srq clears it. rdma_notify:
         * COMM_EST needs a connection, LID_CHANGE is ignored, anything
         * else is EINVAL (the kernel's ib_cm_notify). */
        struct srq_init sa = { .max_wr = 8, .max_sge = 1 };
        check(rdma_create_srq(id, NULL, &sa) == 0 && *(void **)((char *)id + 392) != NULL,
              "create_srq: a basic SRQ in id->srq");
        check(fails_with(rdma_create_srq(id, NULL, &sa), EINVAL), "a second SRQ on the id: EINVAL");
        check(fails_with(rdma_create_srq(id, NULL, NULL), EINVAL), "create_srq NULL attributes: EINVAL");
        rdma_destroy_srq(id);
        check(*(void **)((char *)id + 392) == NULL, "destroy_srq clears id->srq");
        check(fails_with(rdma_notify(id, 4), EINVAL), "notify COMM_EST unconnected: EINVAL");
        check(rdma_notify(id, 11) == 0, "notify LID_CHANGE: ignored");
        check(fails_with(rdma_notify(id, 1), EINVAL), "notify QP_FATAL: EINVAL");
    }

    {
        /* rdma_set_option: sizes checked as the kernel checks them, an
         * unknown option ENOSYS. */
        uint8_t tos = 32, to = 14, big = 40;
        int on = 1, mask = 0;
        check(rdma_set_option(id, 0, 0, &tos, 1) == 0, "set_option TOS");
        check(fails_with(rdma_set_option(id, 0, 0, &on, sizeof on), EINVAL), "set_option TOS of 4 bytes: EINVAL");
        check(rdma_set_option(id, 0, 1, &on, sizeof on) == 0, "set_option REUSEADDR");
        check(rdma_set_option(id, 0, 3, &to, 1) == 0, "set_option ACK_TIMEOUT");
        check(fails_with(rdma_set_option(id, 0, 3, &big, 1), EINVAL), "set_option ACK_TIMEOUT 40: EINVAL");
        check(fails_with(rdma_set_option(id, 0, 99, &on, sizeof on), ENOSYS), "set_option unknown: ENOSYS");
        check(fails_with(rdma_set_option(NULL, 0, 0, &tos, 1), EINVAL), "set_option NULL id: EINVAL");
        /* rdma_init_qp_attr: INIT needs no connection, RTR does. */
        struct qp_attr a;
        memset(&a, 0, sizeof a);
        a.qp_state = 1;
        a.qp_access_flags = 0xff;
        check(rdma_init_qp_attr(id, &a, &mask) == 0 && mask == (1 | 8 | 16 | 32) && a.port_num == 1 &&
                  a.pkey_index == 0 && a.qp_access_flags == 0,
              "init_qp_attr INIT: state, access (none), P_Key index, port");
        a.qp_state = 2;
        check(fails_with(rdma_init_qp_attr(id, &a, &mask), EINVAL), "init_qp_attr RTR unconnected: EINVAL");
        a.qp_state = 5;
        check(fails_with(rdma_init_qp_attr(id, &a, &mask), EINVAL), "init_qp_attr SQE: EINVAL");
        check(fails_with(rdma_init_qp_attr(NULL, &a, &mask), EINVAL), "init_qp_attr NULL id: EINVAL");
        check(fails_with(rdma_establish(id), EINVAL), "establish, nothing waiting: EINVAL");
    }

    /* Two listeners on one port: the second is EADDRINUSE. */
    struct sockaddr_in any = sin_of(dev_ip, 7480);
    check(rdma_create_id(ch, &id2, NULL, PS_TCP) == 0, "second id");
    void *id3;
    check(rdma_create_id(ch, &id3, NULL, PS_TCP) == 0, "third id");
    check(rdma_bind_addr(id2, (struct sockaddr *)&any) == 0 && rdma_listen(id2, 1) == 0, "listen");
    check(rdma_bind_addr(id3, (struct sockaddr *)&any) == 0, "bind the same port");
    check(fails_with(rdma_listen(id3, 1), EADDRINUSE), "listen on a port in use: EADDRINUSE");
    check(rdma_destroy_id(id2) == 0, "destroy the listener");
    check(rdma_listen(id3, 1) == 0, "listen once the port is free");

    check(rdma_destroy_id(id3) == 0 && rdma_destroy_id(id) == 0, "destroy ids");
    check(fails_with(rdma_destroy_id(NULL), EINVAL), "destroy_id NULL: EINVAL");
    rdma_destroy_event_channel(ch);
    return failed;
}
