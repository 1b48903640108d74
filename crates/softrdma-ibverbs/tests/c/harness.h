/*
 * harness.h - what every C test program here shares: the PASS/FAIL
 * reporting (each check prints "PASS <name>" or "FAIL <name>: <why>"; a
 * program's exit status is its number of failures), one device "side"
 * (context, PD, CQ, a 64 KiB region with every access), and the moves of
 * an RC QP from RESET to RTS. A program that uses small_qp defines
 * QP_WR and INLINE_MAX (its queue sizes) before including this file, and
 * may define SIDE_MR_ACCESS (the region's access flags).
 */
#ifndef SOFTRDMA_TEST_HARNESS_H
#define SOFTRDMA_TEST_HARNESS_H

#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

#define ALL_ACCESS                                                             \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |                    \
	 IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

/* The access of a side's region; a program may define its own first. */
#ifndef SIDE_MR_ACCESS
#define SIDE_MR_ACCESS ALL_ACCESS
#endif


struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	char *buf;
	struct ibv_mr *mr;
	union ibv_gid gid;
	enum ibv_mtu mtu;
};

static inline long now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static inline void open_side(struct ibv_device *dev, struct side *s)
{
	struct ibv_port_attr port;

	memset(s, 0, sizeof(*s));
	s->ctx = ibv_open_device(dev);
	if (!s->ctx)
		DIE("ibv_open_device");
	s->pd = ibv_alloc_pd(s->ctx);
	if (!s->pd)
		DIE("ibv_alloc_pd");
	s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
	if (!s->cq)
		DIE("ibv_create_cq");
	s->buf = aligned_alloc(4096, 65536);
	memset(s->buf, 0, 65536);
	s->mr = ibv_reg_mr(s->pd, s->buf, 65536, SIDE_MR_ACCESS);
	if (!s->mr)
		DIE("ibv_reg_mr");
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		DIE("ibv_query_gid");
	if (ibv_query_port(s->ctx, 1, &port))
		DIE("ibv_query_port");
	s->mtu = port.active_mtu;
}

#if defined(QP_WR) && defined(INLINE_MAX)
/* A QP whose every queue is small: QP_WR WRs, one SGE, INLINE_MAX bytes. */

static inline struct ibv_qp *small_qp(struct side *s, struct ibv_cq *cq,
			       struct ibv_srq *srq, struct ibv_qp_cap *cap)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq ? cq : s->cq,
		.recv_cq = cq ? cq : s->cq,
		.srq = srq,
		.cap = { .max_send_wr = QP_WR, .max_recv_wr = QP_WR,
			 .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = INLINE_MAX },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	struct ibv_qp *qp = ibv_create_qp(s->pd, &a);
	if (!qp)
		DIE("ibv_create_qp");
	if (cap)
		*cap = a.cap;
	return qp;
}
#endif

static inline int to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = ALL_ACCESS,
	};
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				     IBV_QP_ACCESS_FLAGS);
}

static inline int to_rtr(struct ibv_qp *qp, struct side *me, union ibv_gid *dgid,
		  uint32_t dqpn)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = me->mtu,
		.dest_qp_num = dqpn,
		.rq_psn = 0,
		.max_dest_rd_atomic = 4,
		.min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = *dgid, .sgid_index = 0,
				      .hop_limit = 64 } },
	};
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				     IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_MIN_RNR_TIMER);
}

static inline int to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTS,
		.sq_psn = 0,
		.timeout = 14,
		.retry_cnt = 7,
		.rnr_retry = 7,
		.max_rd_atomic = 4,
	};
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
				     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

#endif
