/*
 * bad_counts.c - every count a C caller hands softrdma's libibverbs is
 * checked before the array it describes is read. Compiled against Debian's
 * <infiniband/verbs.h> and run (also under valgrind) by tests/c_programs.rs.
 *
 * The lists and arrays here are exactly as long as a correct caller would
 * make them, on the heap where valgrind sees every byte past their end, and
 * the pointer after a failing WR is poisoned: a library that read past a
 * count or followed a list past the failing WR crashes or is reported.
 * Each check prints "PASS <name>" or "FAIL <name>: <why>"; the exit status
 * is the number of failures.
 *
 * The errnos and bad_wr are those of rdma-core's rxe provider: EINVAL for a
 * num_sge above the queue's limit, negative, or with a NULL sg_list, for
 * inline data longer than max_inline_data, for a NULL bad_wr, and for an
 * empty list (ibv_post_send, ibv_post_recv); ENOMEM at the first WR past
 * what the queue holds; *bad_wr is the failing WR, NULL on success.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A next pointer that must never be followed. */
#define POISON_SEND ((struct ibv_send_wr *)(uintptr_t)0x10)
#define POISON_RECV ((struct ibv_recv_wr *)(uintptr_t)0x10)

/* The small queues the checks run against. */
#define QP_WR 4
#define INLINE_MAX 16
#include "harness.h"

/*
 * Polls until `want` completions came or `timeout_ms` passed, then keeps
 * polling for `extra_ms` to catch any that should not exist. Returns the
 * number seen; their wr_ids and statuses go to ids[] and st[] (room for
 * 16).
 */
static int drain(struct ibv_cq *cq, int want, int timeout_ms, int extra_ms,
		 uint64_t *ids, int *st)
{
	long end = now_ms() + timeout_ms;
	long extra_end = -1;
	int got = 0;

	for (;;) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(cq, 1, &wc);
		long t = now_ms();

		if (n < 0)
			DIE("ibv_poll_cq returned %d", n);
		if (n == 1) {
			if (got < 16) {
				ids[got] = wc.wr_id;
				st[got] = wc.status;
			}
			got++;
		}
		if (got >= want && extra_end < 0)
			extra_end = t + extra_ms;
		if (extra_end >= 0 && t >= extra_end)
			break;
		if (extra_end < 0 && t >= end)
			break;
	}
	return got;
}

static void write_wr(struct ibv_send_wr *wr, struct ibv_sge *sge,
		     struct side *a, struct side *b, size_t off, uint32_t len,
		     uint64_t wr_id)
{
	*sge = (struct ibv_sge){ .addr = (uintptr_t)(a->buf + off),
				 .length = len, .lkey = a->mr->lkey };
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = wr_id;
	wr->sg_list = sge;
	wr->num_sge = 1;
	wr->opcode = IBV_WR_RDMA_WRITE;
	wr->send_flags = IBV_SEND_SIGNALED;
	wr->wr.rdma.remote_addr = (uintptr_t)(b->buf + off);
	wr->wr.rdma.rkey = b->mr->rkey;
}

/* One SGE on the heap, nothing after it. */
static struct ibv_sge *one_sge(struct side *s, size_t off, uint32_t len)
{
	struct ibv_sge *sge = malloc(sizeof(*sge));
	if (!sge)
		DIE("malloc");
	*sge = (struct ibv_sge){ .addr = (uintptr_t)(s->buf + off),
				 .length = len, .lkey = s->mr->lkey };
	return sge;
}

static void check_send(struct side *a, struct side *b, struct ibv_qp *qa,
		       const struct ibv_qp_cap *cap)
{
	struct ibv_sge *heap_sge = one_sge(a, 0, 8);
	struct ibv_send_wr *wr = calloc(1, sizeof(*wr)), *bad;
	struct ibv_send_wr chain[3], *longer;
	struct ibv_sge sges[3], *lsges;
	uint64_t ids[16];
	int st[16];
	int rc, n, i, k;
	char *inl;

	/* num_sge 1000 with a one-element array: EINVAL, nothing read. */
	write_wr(wr, heap_sge, a, b, 0, 8, 10);
	wr->sg_list = heap_sge;
	wr->num_sge = 1000;
	wr->next = POISON_SEND;
	bad = POISON_SEND;
	rc = ibv_post_send(qa, wr, &bad);
	CHECK("send_num_sge_1000_einval", rc == EINVAL && bad == wr,
	      "rc %d bad %p wr %p", rc, (void *)bad, (void *)wr);
	wr->num_sge = cap->max_send_sge + 1;
	rc = ibv_post_send(qa, wr, &bad);
	CHECK("send_num_sge_one_over_einval", rc == EINVAL && bad == wr,
	      "rc %d num_sge %d", rc, wr->num_sge);
	wr->num_sge = -1;
	rc = ibv_post_send(qa, wr, &bad);
	CHECK("send_num_sge_negative_einval", rc == EINVAL && bad == wr,
	      "rc %d", rc);
	wr->num_sge = INT_MAX;
	rc = ibv_post_send(qa, wr, &bad);
	CHECK("send_num_sge_int_max_einval", rc == EINVAL && bad == wr,
	      "rc %d", rc);
	wr->num_sge = 1;
	wr->sg_list = NULL;
	rc = ibv_post_send(qa, wr, &bad);
	CHECK("send_null_sg_list_einval", rc == EINVAL && bad == wr, "rc %d",
	      rc);
	n = drain(a->cq, 0, 0, 100, ids, st);
	CHECK("send_refused_wrs_not_posted", n == 0, "%d completions", n);

	/* NULL bad_wr and an empty list: EINVAL (as rxe). */
	write_wr(wr, heap_sge, a, b, 0, 8, 11);
	rc = ibv_post_send(qa, wr, NULL);
	CHECK("send_null_bad_wr_einval", rc == EINVAL, "rc %d", rc);
	bad = POISON_SEND;
	rc = ibv_post_send(qa, NULL, &bad);
	CHECK("send_empty_list_einval", rc == EINVAL && bad == NULL,
	      "rc %d bad %p", rc, (void *)bad);
	n = drain(a->cq, 0, 0, 100, ids, st);
	CHECK("send_null_args_not_posted", n == 0, "%d completions", n);

	/* Three WRs, the second bad: the first is posted and runs, bad_wr is
	 * the second, the third is not posted. */
	memcpy(a->buf + 256, "first", 6);
	memcpy(a->buf + 512, "third", 6);
	write_wr(&chain[0], &sges[0], a, b, 256, 6, 20);
	write_wr(&chain[1], &sges[1], a, b, 384, 6, 21);
	write_wr(&chain[2], &sges[2], a, b, 512, 6, 22);
	chain[1].sg_list = heap_sge;
	chain[1].num_sge = 1000;
	chain[0].next = &chain[1];
	chain[1].next = &chain[2];
	bad = NULL;
	rc = ibv_post_send(qa, &chain[0], &bad);
	CHECK("send_chain_second_bad_einval", rc == EINVAL && bad == &chain[1],
	      "rc %d bad %p second %p", rc, (void *)bad, (void *)&chain[1]);
	n = drain(a->cq, 1, 5000, 300, ids, st);
	CHECK("send_chain_first_posted",
	      n == 1 && ids[0] == 20 && st[0] == IBV_WC_SUCCESS &&
		      memcmp(b->buf + 256, "first", 6) == 0,
	      "%d completions, first wr_id %llu status %d", n,
	      (unsigned long long)ids[0], st[0]);
	CHECK("send_chain_third_not_posted", b->buf[512] == 0,
	      "third WRITE landed");

	/* The failing WR's next pointer is never followed. */
	write_wr(wr, heap_sge, a, b, 0, 8, 23);
	wr->num_sge = 1000;
	wr->next = POISON_SEND;
	rc = ibv_post_send(qa, wr, &bad);
	CHECK("send_next_of_failing_wr_not_followed",
	      rc == EINVAL && bad == wr, "rc %d", rc);

	/* A list longer than the send queue: ENOMEM at the first WR it
	 * cannot hold, the ones before it posted. */
	k = (int)cap->max_send_wr;
	longer = calloc(k + 2, sizeof(*longer));
	lsges = calloc(k + 2, sizeof(*lsges));
	for (i = 0; i < k + 2; i++) {
		write_wr(&longer[i], &lsges[i], a, b, 1024 + 64 * i, 8,
			 100 + i);
		longer[i].next = i + 1 < k + 2 ? &longer[i + 1] : NULL;
	}
	bad = NULL;
	rc = ibv_post_send(qa, longer, &bad);
	CHECK("send_list_longer_than_queue_enomem",
	      rc == ENOMEM && bad == &longer[k],
	      "rc %d bad is WR %ld of %d (queue %d)", rc,
	      bad ? (long)(bad - longer) : -1L, k + 2, k);
	n = drain(a->cq, k, 5000, 300, ids, st);
	CHECK("send_list_longer_than_queue_rest_posted",
	      n == k && ids[0] == 100 && ids[k - 1] == (uint64_t)(99 + k),
	      "%d completions of %d", n, k);

	/* A list that loops back on itself ends the same way. */
	write_wr(wr, heap_sge, a, b, 0, 8, 30);
	wr->next = wr;
	bad = NULL;
	rc = ibv_post_send(qa, wr, &bad);
	CHECK("send_cyclic_list_enomem", rc == ENOMEM && bad == wr, "rc %d",
	      rc);
	n = drain(a->cq, k, 5000, 300, ids, st);
	CHECK("send_cyclic_list_queue_full_posted", n == k,
	      "%d completions of %d", n, k);

	/* Inline data longer than max_inline_data: EINVAL before a byte is
	 * copied, even when the SGE claims far more than its buffer. */
	inl = malloc(cap->max_inline_data + 1);
	memset(inl, 'i', cap->max_inline_data + 1);
	write_wr(wr, heap_sge, a, b, 2048, 0, 40);
	heap_sge->addr = (uintptr_t)inl;
	heap_sge->length = cap->max_inline_data + 1;
	heap_sge->lkey = 0;
	wr->send_flags |= IBV_SEND_INLINE;
	wr->next = POISON_SEND;
	rc = ibv_post_send(qa, wr, &bad);
	CHECK("send_inline_one_over_einval", rc == EINVAL && bad == wr,
	      "rc %d (max_inline_data %u)", rc, cap->max_inline_data);
	heap_sge->length = 1u << 30;
	rc = ibv_post_send(qa, wr, &bad);
	CHECK("send_inline_huge_einval", rc == EINVAL && bad == wr, "rc %d",
	      rc);
	heap_sge->length = cap->max_inline_data;
	wr->next = NULL;
	bad = POISON_SEND;
	rc = ibv_post_send(qa, wr, &bad);
	n = drain(a->cq, 1, 5000, 100, ids, st);
	CHECK("send_inline_at_limit_ok",
	      rc == 0 && bad == NULL && n == 1 && st[0] == IBV_WC_SUCCESS &&
		      b->buf[2048] == 'i' &&
		      b->buf[2048 + cap->max_inline_data - 1] == 'i' &&
		      b->buf[2048 + cap->max_inline_data] == 0,
	      "rc %d bad %p completions %d", rc, (void *)bad, n);

	/* The QP still works. */
	write_wr(wr, heap_sge, a, b, 4096, 8, 50);
	rc = ibv_post_send(qa, wr, &bad);
	n = drain(a->cq, 1, 5000, 0, ids, st);
	CHECK("send_after_refusals_ok",
	      rc == 0 && n == 1 && ids[0] == 50 && st[0] == IBV_WC_SUCCESS,
	      "rc %d completions %d", rc, n);

	free(inl);
	free(longer);
	free(lsges);
	free(wr);
	free(heap_sge);
}

static void recv_wr(struct ibv_recv_wr *wr, struct ibv_sge *sge,
		    uint64_t wr_id)
{
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = wr_id;
	wr->sg_list = sge;
	wr->num_sge = 1;
}

/* Posts chains of valid receives to a queue that already holds `held`:
 * ENOMEM at WR (QP_WR - held), which proves how many it held. */
static int refill_fails_at(struct ibv_qp *qp, struct ibv_srq *srq,
			   struct ibv_sge *sge)
{
	struct ibv_recv_wr c[QP_WR + 1], *bad = NULL;
	int i, rc;

	for (i = 0; i <= QP_WR; i++) {
		recv_wr(&c[i], sge, 200 + i);
		c[i].next = i < QP_WR ? &c[i + 1] : NULL;
	}
	rc = qp ? ibv_post_recv(qp, c, &bad) : ibv_post_srq_recv(srq, c, &bad);
	if (rc != ENOMEM || !bad)
		return -1 - rc;
	return (int)(bad - c);
}

static void check_recv(struct side *a)
{
	struct ibv_sge *heap_sge = one_sge(a, 8192, 64);
	struct ibv_recv_wr *wr = calloc(1, sizeof(*wr)), *bad;
	struct ibv_recv_wr chain[3];
	struct ibv_qp *qp, *cyc;
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	struct ibv_cq *cq;
	uint64_t ids[16];
	int st[16];
	int rc, n;

	qp = small_qp(a, NULL, NULL, NULL);
	if (to_init(qp))
		DIE("RESET->INIT");

	recv_wr(wr, heap_sge, 1);
	wr->num_sge = 1000;
	wr->next = POISON_RECV;
	bad = POISON_RECV;
	rc = ibv_post_recv(qp, wr, &bad);
	CHECK("recv_num_sge_1000_einval", rc == EINVAL && bad == wr,
	      "rc %d bad %p wr %p", rc, (void *)bad, (void *)wr);
	wr->num_sge = 2;
	rc = ibv_post_recv(qp, wr, &bad);
	CHECK("recv_num_sge_too_many_einval", rc == EINVAL && bad == wr,
	      "rc %d", rc);
	wr->num_sge = -5;
	rc = ibv_post_recv(qp, wr, &bad);
	CHECK("recv_num_sge_negative_einval", rc == EINVAL && bad == wr,
	      "rc %d", rc);
	wr->num_sge = 1;
	wr->sg_list = NULL;
	rc = ibv_post_recv(qp, wr, &bad);
	CHECK("recv_null_sg_list_einval", rc == EINVAL && bad == wr, "rc %d",
	      rc);
	wr->sg_list = heap_sge;
	wr->next = NULL;
	rc = ibv_post_recv(qp, wr, NULL);
	CHECK("recv_null_bad_wr_einval", rc == EINVAL, "rc %d", rc);
	bad = POISON_RECV;
	rc = ibv_post_recv(qp, NULL, &bad);
	CHECK("recv_empty_list_einval", rc == EINVAL && bad == NULL,
	      "rc %d bad %p", rc, (void *)bad);
	/* Nothing was posted: the queue still takes QP_WR. */
	n = refill_fails_at(qp, NULL, heap_sge);
	CHECK("recv_refused_wrs_not_posted", n == QP_WR, "ENOMEM at %d", n);
	ibv_destroy_qp(qp);

	/* Three WRs, the second with too many SGEs. */
	qp = small_qp(a, NULL, NULL, NULL);
	if (to_init(qp))
		DIE("RESET->INIT");
	recv_wr(&chain[0], heap_sge, 10);
	recv_wr(&chain[1], heap_sge, 11);
	recv_wr(&chain[2], heap_sge, 12);
	chain[1].num_sge = 1000;
	chain[0].next = &chain[1];
	chain[1].next = &chain[2];
	bad = NULL;
	rc = ibv_post_recv(qp, chain, &bad);
	CHECK("recv_chain_second_bad_einval", rc == EINVAL && bad == &chain[1],
	      "rc %d bad %p second %p", rc, (void *)bad, (void *)&chain[1]);
	chain[1].next = POISON_RECV;
	rc = ibv_post_recv(qp, &chain[1], &bad);
	CHECK("recv_next_of_failing_wr_not_followed",
	      rc == EINVAL && bad == &chain[1], "rc %d", rc);
	n = refill_fails_at(qp, NULL, heap_sge);
	CHECK("recv_chain_only_first_posted", n == QP_WR - 1, "ENOMEM at %d",
	      n);
	ibv_destroy_qp(qp);

	/* A cyclic list on a QP in ERR, where every receive completes at once
	 * with a flush: it still ends at the queue's size. */
	cq = ibv_create_cq(a->ctx, 16, NULL, NULL, 0);
	if (!cq)
		DIE("ibv_create_cq");
	cyc = small_qp(a, cq, NULL, NULL);
	if (to_init(cyc) || ibv_modify_qp(cyc, &err, IBV_QP_STATE))
		DIE("->ERR");
	recv_wr(wr, heap_sge, 7);
	wr->next = wr;
	bad = NULL;
	rc = ibv_post_recv(cyc, wr, &bad);
	CHECK("recv_cyclic_list_enomem", rc == ENOMEM && bad == wr, "rc %d",
	      rc);
	n = drain(cq, QP_WR, 2000, 100, ids, st);
	CHECK("recv_cyclic_list_queue_full_flushed",
	      n == QP_WR && st[0] == IBV_WC_WR_FLUSH_ERR,
	      "%d completions of %d", n, QP_WR);
	ibv_destroy_qp(cyc);
	ibv_destroy_cq(cq);

	free(wr);
	free(heap_sge);
}

static void check_srq(struct side *a)
{
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = QP_WR,
						  .max_sge = 1 } };
	struct ibv_sge *heap_sge = one_sge(a, 12288, 64);
	struct ibv_recv_wr *wr = calloc(1, sizeof(*wr)), *bad;
	struct ibv_recv_wr chain[3];
	struct ibv_srq *srq = ibv_create_srq(a->pd, &sa);
	struct ibv_qp *qp;
	int rc, n;

	if (!srq)
		DIE("ibv_create_srq");
	recv_wr(wr, heap_sge, 1);
	wr->num_sge = 1000;
	wr->next = POISON_RECV;
	bad = POISON_RECV;
	rc = ibv_post_srq_recv(srq, wr, &bad);
	CHECK("srq_num_sge_1000_einval", rc == EINVAL && bad == wr,
	      "rc %d bad %p", rc, (void *)bad);
	wr->num_sge = 2;
	rc = ibv_post_srq_recv(srq, wr, &bad);
	CHECK("srq_num_sge_too_many_einval", rc == EINVAL && bad == wr,
	      "rc %d", rc);
	wr->num_sge = 1;
	wr->sg_list = NULL;
	rc = ibv_post_srq_recv(srq, wr, &bad);
	CHECK("srq_null_sg_list_einval", rc == EINVAL && bad == wr, "rc %d",
	      rc);
	wr->sg_list = heap_sge;
	wr->next = NULL;
	rc = ibv_post_srq_recv(srq, wr, NULL);
	CHECK("srq_null_bad_wr_einval", rc == EINVAL, "rc %d", rc);
	bad = POISON_RECV;
	rc = ibv_post_srq_recv(srq, NULL, &bad);
	CHECK("srq_empty_list_ok", rc == 0 && bad == NULL, "rc %d bad %p", rc,
	      (void *)bad);

	recv_wr(&chain[0], heap_sge, 10);
	recv_wr(&chain[1], heap_sge, 11);
	recv_wr(&chain[2], heap_sge, 12);
	chain[1].num_sge = 1000;
	chain[0].next = &chain[1];
	chain[1].next = &chain[2];
	rc = ibv_post_srq_recv(srq, chain, &bad);
	CHECK("srq_chain_second_bad_einval", rc == EINVAL && bad == &chain[1],
	      "rc %d", rc);
	n = refill_fails_at(NULL, srq, heap_sge);
	CHECK("srq_chain_only_first_posted", n == QP_WR - 1, "ENOMEM at %d",
	      n);

	/* A QP with an SRQ takes no receives of its own. */
	qp = small_qp(a, NULL, srq, NULL);
	if (to_init(qp))
		DIE("RESET->INIT");
	bad = NULL;
	rc = ibv_post_recv(qp, wr, &bad);
	CHECK("recv_on_srq_qp_einval", rc == EINVAL && bad == wr, "rc %d",
	      rc);
	ibv_destroy_qp(qp);
	ibv_destroy_srq(srq);
	free(wr);
	free(heap_sge);
}

static void check_poll(struct side *a)
{
	struct ibv_cq *cq = ibv_create_cq(a->ctx, 8, NULL, NULL, 0);
	struct ibv_qp *qp;
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	struct ibv_sge sge = { .addr = (uintptr_t)a->buf, .length = 8,
			       .lkey = a->mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 77, .sg_list = &sge,
				   .num_sge = 1 },
			   *rbad;
	struct ibv_wc wc[4];
	int rc, i, untouched;

	if (!cq)
		DIE("ibv_create_cq");
	/* One completion waiting: a receive flushed on a QP in ERR. */
	qp = small_qp(a, cq, NULL, NULL);
	if (to_init(qp) || ibv_modify_qp(qp, &err, IBV_QP_STATE))
		DIE("->ERR");
	if (ibv_post_recv(qp, &rwr, &rbad))
		DIE("ibv_post_recv");

	memset(wc, 0xa5, sizeof(wc));
	rc = ibv_poll_cq(cq, -1, wc);
	CHECK("poll_cq_negative_returns_0", rc == 0, "rc %d", rc);
	rc = ibv_poll_cq(cq, INT_MIN, wc);
	CHECK("poll_cq_int_min_returns_0", rc == 0, "rc %d", rc);
	rc = ibv_poll_cq(cq, 0, wc);
	CHECK("poll_cq_zero_returns_0", rc == 0, "rc %d", rc);
	rc = ibv_poll_cq(cq, -1, NULL);
	CHECK("poll_cq_negative_null_wc_returns_0", rc == 0, "rc %d", rc);
	untouched = 1;
	for (i = 0; i < (int)sizeof(wc); i++)
		untouched &= ((unsigned char *)wc)[i] == 0xa5;
	CHECK("poll_cq_nonpositive_writes_nothing", untouched,
	      "wc array written");
	rc = ibv_poll_cq(cq, 1, NULL);
	CHECK("poll_cq_null_wc_einval", rc == -EINVAL, "rc %d", rc);
	/* The completion is still there, and only it is written. */
	rc = ibv_poll_cq(cq, 4, wc);
	untouched = 1;
	for (i = sizeof(wc[0]); i < (int)sizeof(wc); i++)
		untouched &= ((unsigned char *)wc)[i] == 0xa5;
	CHECK("poll_cq_after_refusals_finds_completion",
	      rc == 1 && wc[0].wr_id == 77 &&
		      wc[0].status == IBV_WC_WR_FLUSH_ERR && untouched,
	      "rc %d wr_id %llu", rc, (unsigned long long)wc[0].wr_id);
	ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
}

static void check_create_limits(struct side *a)
{
	struct ibv_device_attr d;
	struct ibv_qp_init_attr base = {
		.send_cq = a->cq, .recv_cq = a->cq,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp_init_attr q;
	struct ibv_srq_init_attr s;
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	struct ibv_srq *srq;

	if (ibv_query_device(a->ctx, &d))
		DIE("ibv_query_device");

#define QP_REFUSED(name, field, value)                                         \
	do {                                                                   \
		q = base;                                                      \
		q.cap.field = (value);                                         \
		errno = 0;                                                     \
		qp = ibv_create_qp(a->pd, &q);                                 \
		CHECK(name, qp == NULL && errno == EINVAL, "qp %p errno %d",   \
		      (void *)qp, errno);                                      \
		if (qp)                                                        \
			ibv_destroy_qp(qp);                                    \
	} while (0)

	QP_REFUSED("create_qp_send_sge_over_device_einval", max_send_sge,
		   (uint32_t)d.max_sge + 1);
	QP_REFUSED("create_qp_recv_sge_over_device_einval", max_recv_sge,
		   (uint32_t)d.max_sge + 1);
	QP_REFUSED("create_qp_send_wr_over_device_einval", max_send_wr,
		   (uint32_t)d.max_qp_wr + 1);
	QP_REFUSED("create_qp_recv_wr_over_device_einval", max_recv_wr,
		   (uint32_t)d.max_qp_wr + 1);
	QP_REFUSED("create_qp_send_sge_huge_einval", max_send_sge, UINT32_MAX);
	QP_REFUSED("create_qp_inline_huge_einval", max_inline_data, 1u << 30);

	errno = 0;
	cq = ibv_create_cq(a->ctx, -1, NULL, NULL, 0);
	CHECK("create_cq_negative_einval", cq == NULL && errno == EINVAL,
	      "errno %d", errno);
	errno = 0;
	cq = ibv_create_cq(a->ctx, 0, NULL, NULL, 0);
	CHECK("create_cq_zero_einval", cq == NULL && errno == EINVAL,
	      "errno %d", errno);
	errno = 0;
	cq = ibv_create_cq(a->ctx, d.max_cqe + 1, NULL, NULL, 0);
	CHECK("create_cq_over_device_einval", cq == NULL && errno == EINVAL,
	      "errno %d", errno);

	memset(&s, 0, sizeof(s));
	s.attr.max_wr = (uint32_t)d.max_srq_wr + 1;
	s.attr.max_sge = 1;
	errno = 0;
	srq = ibv_create_srq(a->pd, &s);
	CHECK("create_srq_wr_over_device_einval", srq == NULL && errno == EINVAL,
	      "errno %d", errno);
	s.attr.max_wr = 1;
	s.attr.max_sge = (uint32_t)d.max_srq_sge + 1;
	errno = 0;
	srq = ibv_create_srq(a->pd, &s);
	CHECK("create_srq_sge_over_device_einval",
	      srq == NULL && errno == EINVAL, "errno %d", errno);
}

int main(void)
{
	struct ibv_device **list;
	struct side a, b;
	struct ibv_qp *qa, *qb;
	struct ibv_qp_cap cap;
	int n = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	list = ibv_get_device_list(&n);
	if (!list || n < 1)
		DIE("no devices");
	open_side(list[0], &a);
	open_side(list[0], &b);

	/* A connected RC pair whose requester has the small queues. */
	qa = small_qp(&a, NULL, NULL, &cap);
	{
		struct ibv_qp_init_attr big = {
			.send_cq = b.cq, .recv_cq = b.cq,
			.cap = { .max_send_wr = 16, .max_recv_wr = 16,
				 .max_send_sge = 2, .max_recv_sge = 2 },
			.qp_type = IBV_QPT_RC,
		};
		qb = ibv_create_qp(b.pd, &big);
		if (!qb)
			DIE("ibv_create_qp");
	}
	if (to_init(qa) || to_init(qb))
		DIE("RESET->INIT");
	if (to_rtr(qa, &a, &b.gid, qb->qp_num) ||
	    to_rtr(qb, &b, &a.gid, qa->qp_num))
		DIE("INIT->RTR");
	if (to_rts(qa) || to_rts(qb))
		DIE("RTR->RTS");
	CHECK("small_qp_caps",
	      cap.max_send_sge == 1 && cap.max_recv_sge == 1 &&
		      cap.max_send_wr == QP_WR &&
		      cap.max_inline_data == INLINE_MAX,
	      "send_sge %u recv_sge %u send_wr %u inline %u", cap.max_send_sge,
	      cap.max_recv_sge, cap.max_send_wr, cap.max_inline_data);

	check_send(&a, &b, qa, &cap);
	check_recv(&a);
	check_srq(&a);
	check_poll(&a);
	check_create_limits(&a);

	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	ibv_free_device_list(list);
	printf("%d failures\n", failures);
	return failures;
}
