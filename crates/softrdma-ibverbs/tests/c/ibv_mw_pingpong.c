/*
 * ibv_mw_pingpong.c - memory windows between two processes, in the style of
 * rdma-core's ibv_rc_pingpong (same options: -d -g -p -n -s -c, and the
 * server's host name for the client), so that it runs on any libibverbs:
 * softrdma's drop-in, and rxe in the interop guest (interop/rxe).
 *
 * The server owns a buffer registered with LOCAL_WRITE | MW_BIND only (no
 * remote right: only a window can let the peer in). Each round it binds a
 * memory window over the buffer (type 2: an IBV_WR_BIND_MW work request;
 * -t 1: ibv_bind_mw of a type-1 window) with REMOTE_WRITE and a new key,
 * and tells the client the window's rkey over TCP. The client RDMA WRITEs
 * the round's pattern through it, then (type 2) a SEND with invalidate of
 * that rkey, or (type 1) a plain SEND; the server checks the receive
 * (IBV_WC_WITH_INV and the invalidated rkey for type 2), with -c the
 * data, and (type 1) unbinds the window with a zero-length bind. After the
 * last round the client WRITEs once more through the dead rkey and must get
 * IBV_WC_REM_ACCESS_ERR, and the server's buffer must be unchanged.
 * Prints "PASS <check>" / "FAIL <check>: why"; exit status 0 when all pass.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int failures;

#define CHECK(name, cond, ...)                                                 \
	do {                                                                   \
		if (cond) {                                                    \
			printf("PASS %s\n", name);                             \
		} else {                                                       \
			printf("FAIL %s: ", name);                             \
			printf(__VA_ARGS__);                                   \
			printf("\n");                                          \
			failures++;                                            \
		}                                                              \
		fflush(stdout);                                                \
	} while (0)

#define DIE(...)                                                               \
	do {                                                                   \
		printf("FAIL setup: ");                                        \
		printf(__VA_ARGS__);                                           \
		printf(" (errno %d %s)\n", errno, strerror(errno));            \
		exit(100);                                                     \
	} while (0)

struct dest {
	uint32_t qpn, psn;
	union ibv_gid gid;
};

static long now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static struct ibv_wc poll_one(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	long end = now_ms() + 60000;
	int n;

	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && now_ms() < end)
		;
	if (n != 1)
		DIE("no completion in 60 s");
	return wc;
}

static void send_line(int fd, const char *s)
{
	size_t n = strlen(s);

	if (write(fd, s, n) != (ssize_t)n)
		DIE("tcp write");
}

/* Reads one '\n'-terminated line (at most cap - 1 bytes) from fd. */
static void recv_line(int fd, char *buf, size_t cap)
{
	size_t n = 0;

	while (n + 1 < cap) {
		ssize_t r = read(fd, buf + n, 1);
		if (r != 1)
			DIE("tcp read");
		if (buf[n++] == '\n')
			break;
	}
	buf[n] = 0;
}

static int tcp_connect(const char *host, int port)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM },
			*res;
	char p[16];
	int fd, i;

	snprintf(p, sizeof(p), "%d", port);
	if (getaddrinfo(host, p, &hints, &res))
		DIE("getaddrinfo %s", host);
	for (i = 0; i < 600; i++) {
		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd >= 0 && !connect(fd, res->ai_addr, res->ai_addrlen))
			break;
		if (fd >= 0)
			close(fd);
		fd = -1;
		usleep(100000);
	}
	freeaddrinfo(res);
	if (fd < 0)
		DIE("connect %s:%d", host, port);
	return fd;
}

static int tcp_accept(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_port = htons(port),
				 .sin_addr.s_addr = INADDR_ANY };
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0), fd;

	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 1))
		DIE("listen on %d", port);
	fd = accept(l, NULL, NULL);
	close(l);
	if (fd < 0)
		DIE("accept");
	return fd;
}

static void put_dest(int fd, const struct dest *d)
{
	char line[128], *p;
	int i;

	p = line + sprintf(line, "%06x:%06x:", d->qpn, d->psn);
	for (i = 0; i < 16; i++)
		p += sprintf(p, "%02x", d->gid.raw[i]);
	strcpy(p, "\n");
	send_line(fd, line);
}

static void get_dest(int fd, struct dest *d)
{
	char line[128], hex[33];
	unsigned int b;
	int i;

	recv_line(fd, line, sizeof(line));
	if (sscanf(line, "%x:%x:%32s", &d->qpn, &d->psn, hex) != 3 ||
	    strlen(hex) != 32)
		DIE("bad peer line %s", line);
	for (i = 0; i < 16; i++) {
		sscanf(hex + 2 * i, "%2x", &b);
		d->gid.raw[i] = (uint8_t)b;
	}
}

static void connect_qp(struct ibv_qp *qp, int gidx, enum ibv_mtu mtu,
		       const struct dest *me, const struct dest *peer)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = mtu,
		.dest_qp_num = peer->qpn,
		.rq_psn = peer->psn,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = peer->gid, .sgid_index = gidx,
				      .hop_limit = 64 } },
	};

	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC |
				  IBV_QP_MIN_RNR_TIMER))
		DIE("modify to RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = me->psn;
	a.timeout = 18;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
				  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				  IBV_QP_MAX_QP_RD_ATOMIC))
		DIE("modify to RTS");
}

static void fill(char *buf, size_t n, int round)
{
	size_t i;

	for (i = 0; i < n; i++)
		buf[i] = (char)(i * 13 + round * 7 + 1);
}

static int post_write(struct ibv_qp *qp, struct ibv_mr *mr, char *buf,
		      size_t n, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = (uint32_t)n,
			       .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

int main(int argc, char **argv)
{
	const char *devname = NULL, *server = NULL;
	int port = 18515, gidx = 0, iters = 10, check = 0, type = 2, c, i, n;
	/* -k: the receive's "with invalidate" flag is the kernel's
	 * IB_WC_WITH_INVALIDATE (1 << 2), as rxe reports it (its provider
	 * passes the kernel's flags through; libibverbs' IBV_WC_WITH_INV is
	 * 1 << 3, and 1 << 2 is IBV_WC_IP_CSUM_OK). */
	unsigned int with_inv = IBV_WC_WITH_INV;
	size_t size = 4096;
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	struct ibv_port_attr pa;
	struct dest me, peer;
	char *buf, *ref, line[128];
	int fd;

	while ((c = getopt(argc, argv, "d:g:p:n:s:ct:k")) != -1) {
		switch (c) {
		case 'd': devname = optarg; break;
		case 'g': gidx = atoi(optarg); break;
		case 'p': port = atoi(optarg); break;
		case 'n': iters = atoi(optarg); break;
		case 's': size = strtoul(optarg, NULL, 0); break;
		case 'c': check = 1; break;
		case 't': type = atoi(optarg); break;
		case 'k': with_inv = 1 << 2; break;
		default:
			fprintf(stderr, "usage: %s [-d dev] [-g gid index] [-p port] [-n rounds] "
				"[-s size] [-c] [-t 1|2] [-k] [server]\n", argv[0]);
			return 2;
		}
	}
	if (optind < argc)
		server = argv[optind];
	if (iters < 1)
		iters = 1;
	if (iters > 20)
		iters = 20; /* every round is a few round trips over TCP */
	setvbuf(stdout, NULL, _IOLBF, 0);
	list = ibv_get_device_list(&n);
	for (i = 0; list && i < n && !ctx; i++)
		if (!devname || !strcmp(ibv_get_device_name(list[i]), devname))
			ctx = ibv_open_device(list[i]);
	if (!ctx)
		DIE("no device %s", devname ? devname : "");
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	buf = aligned_alloc(4096, (size + 4095) / 4096 * 4096);
	ref = malloc(size);
	if (!pd || !cq || !buf || !ref)
		DIE("pd/cq/buffer");
	memset(buf, 0, size);
	/* The server's buffer has no remote right of its own. */
	mr = ibv_reg_mr(pd, buf, size,
			IBV_ACCESS_LOCAL_WRITE |
				(server ? 0 : IBV_ACCESS_MW_BIND));
	if (!mr)
		DIE("ibv_reg_mr");
	{
		struct ibv_qp_init_attr qa = {
			.send_cq = cq, .recv_cq = cq,
			.cap = { .max_send_wr = 8, .max_recv_wr = 8,
				 .max_send_sge = 1, .max_recv_sge = 1 },
			.qp_type = IBV_QPT_RC,
		};
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT,
					 .port_num = 1,
					 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
		qp = ibv_create_qp(pd, &qa);
		if (!qp || ibv_modify_qp(qp, &a,
					 IBV_QP_STATE | IBV_QP_PKEY_INDEX |
						 IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
			DIE("QP to INIT");
	}
	if (ibv_query_port(ctx, 1, &pa) || ibv_query_gid(ctx, 1, gidx, &me.gid))
		DIE("query port/gid");
	me.qpn = qp->qp_num;
	srand48(getpid() * time(NULL));
	me.psn = lrand48() & 0xffffff;
	fd = server ? tcp_connect(server, port) : tcp_accept(port);
	put_dest(fd, &me);
	get_dest(fd, &peer);
	connect_qp(qp, gidx, pa.active_mtu, &me, &peer);
	printf("%s: type-%d window, %d rounds of %zu bytes, QP %#x -> %#x\n",
	       server ? "client" : "server", type, iters, size, me.qpn, peer.qpn);

	if (!server) {
		struct ibv_mw *mw = ibv_alloc_mw(pd, type == 1 ? IBV_MW_TYPE_1
							      : IBV_MW_TYPE_2);
		uint32_t rkey = 0;
		int r, ok, ok_bind = 1, ok_inv = 1, ok_data = 1;

		if (!mw)
			DIE("ibv_alloc_mw type %d", type);
		for (r = 0; r < iters; r++) {
			struct ibv_recv_wr rw = { .wr_id = 3, .num_sge = 0 }, *rbad;
			struct ibv_wc wc;

			if (ibv_post_recv(qp, &rw, &rbad))
				DIE("ibv_post_recv");
			if (type == 1) {
				struct ibv_mw_bind b = {
					.wr_id = 2, .send_flags = IBV_SEND_SIGNALED,
					.bind_info = { .mr = mr, .addr = (uintptr_t)buf,
						       .length = size,
						       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE },
				};
				if (ibv_bind_mw(qp, mw, &b))
					DIE("ibv_bind_mw");
				rkey = mw->rkey;
			} else {
				struct ibv_send_wr w = { .wr_id = 2, .opcode = IBV_WR_BIND_MW,
							 .send_flags = IBV_SEND_SIGNALED },
						   *bad;
				w.bind_mw.mw = mw;
				w.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
				w.bind_mw.bind_info.mr = mr;
				w.bind_mw.bind_info.addr = (uintptr_t)buf;
				w.bind_mw.bind_info.length = size;
				w.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
				if (ibv_post_send(qp, &w, &bad))
					DIE("ibv_post_send BIND_MW");
				rkey = w.bind_mw.rkey;
			}
			wc = poll_one(cq);
			ok_bind &= wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW;
			/* A type-2 bind leaves mw->rkey to the application; rxe
			 * names the window by it in the next bind. */
			if (type == 2 && wc.status == IBV_WC_SUCCESS)
				mw->rkey = rkey;
			snprintf(line, sizeof(line), "%08x:%016llx\n", rkey,
				 (unsigned long long)(uintptr_t)buf);
			send_line(fd, line);
			wc = poll_one(cq); /* the client's SEND (with invalidate) */
			if (type == 2)
				ok = wc.status == IBV_WC_SUCCESS &&
				     (wc.wc_flags & with_inv) &&
				     wc.invalidated_rkey == rkey;
			else
				ok = wc.status == IBV_WC_SUCCESS &&
				     !(wc.wc_flags & with_inv);
			if (!ok)
				printf("round %d: receive status %d opcode %d flags %#x "
				       "invalidated_rkey %#x (window %#x)\n",
				       r, wc.status, wc.opcode, wc.wc_flags,
				       wc.invalidated_rkey, rkey);
			ok_inv &= ok;
			fill(ref, size, r);
			if (check)
				ok_data &= !memcmp(buf, ref, size);
			if (type == 1) {
				/* Unbind: a zero-length bind. It names the region
				 * (as rdma-core's own test does): rxe's provider
				 * reads bind_info.mr->lkey even for length 0, and
				 * crashes on NULL. */
				struct ibv_mw_bind b = {
					.wr_id = 4, .send_flags = IBV_SEND_SIGNALED,
					.bind_info = { .mr = mr, .addr = (uintptr_t)buf },
				};
				if (ibv_bind_mw(qp, mw, &b))
					DIE("ibv_bind_mw (unbind)");
				wc = poll_one(cq);
				ok_bind &= wc.status == IBV_WC_SUCCESS;
			}
			send_line(fd, "invalidated\n");
		}
		CHECK("binds", ok_bind, "a bind failed");
		CHECK(type == 2 ? "send_with_invalidate_received" : "send_received",
		      ok_inv, "receive status or invalidated rkey wrong");
		if (check)
			CHECK("data_through_window", ok_data, "data differs");
		recv_line(fd, line, sizeof(line)); /* the client's last WRITE done */
		CHECK("dead_window_wrote_nothing", !memcmp(buf, ref, size),
		      "the buffer changed after the window was invalidated");
		CHECK("client_saw_rem_access_err", !strcmp(line, "rem_access_err\n"),
		      "client says %s", line);
		ibv_dealloc_mw(mw);
	} else {
		uint32_t rkey = 0;
		unsigned long long addr = 0;
		int r, ok_w = 1, ok_s = 1;
		struct ibv_wc wc;

		for (r = 0; r < iters; r++) {
			struct ibv_send_wr s = { .wr_id = 5, .num_sge = 0,
						 .send_flags = IBV_SEND_SIGNALED },
					   *bad;

			recv_line(fd, line, sizeof(line));
			if (sscanf(line, "%x:%llx", &rkey, &addr) != 2)
				DIE("bad window line %s", line);
			fill(buf, size, r);
			if (post_write(qp, mr, buf, size, addr, rkey))
				DIE("ibv_post_send WRITE");
			wc = poll_one(cq);
			ok_w &= wc.status == IBV_WC_SUCCESS;
			if (wc.status != IBV_WC_SUCCESS)
				printf("round %d: WRITE status %s\n", r,
				       ibv_wc_status_str(wc.status));
			s.opcode = type == 2 ? IBV_WR_SEND_WITH_INV : IBV_WR_SEND;
			s.invalidate_rkey = rkey;
			if (ibv_post_send(qp, &s, &bad))
				DIE("ibv_post_send SEND");
			wc = poll_one(cq);
			ok_s &= wc.status == IBV_WC_SUCCESS;
			recv_line(fd, line, sizeof(line)); /* invalidated */
		}
		CHECK("writes_through_window", ok_w, "a WRITE failed");
		CHECK(type == 2 ? "send_with_invalidate" : "send", ok_s, "a SEND failed");
		fill(buf, size, 99);
		if (post_write(qp, mr, buf, size, addr, rkey))
			DIE("ibv_post_send WRITE");
		wc = poll_one(cq);
		CHECK("write_through_dead_window_rem_access_err",
		      wc.status == IBV_WC_REM_ACCESS_ERR, "status %s",
		      ibv_wc_status_str(wc.status));
		send_line(fd, wc.status == IBV_WC_REM_ACCESS_ERR ? "rem_access_err\n"
								 : "other\n");
	}
	close(fd);
	printf("%d failures\n", failures);
	return failures ? 1 : 0;
}
