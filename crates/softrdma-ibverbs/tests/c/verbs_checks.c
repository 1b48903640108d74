/*
 * verbs_checks.c - error paths and corner cases of softrdma's libibverbs,
 * compiled against Debian's <infiniband/verbs.h> and run by
 * tests/c_programs.rs with softrdma's library found first.
 *
 * One process opens the first device twice (two contexts on one HCA, as on
 * hardware: one GID, which the QPs of both reach each other at) and
 * connects QPs between them.
 * Every check prints "PASS <name>" or "FAIL <name>: <why>"; the exit status
 * is the number of failures.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

/* Polls one completion; 0 on success, -1 on timeout. */
static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc, int timeout_ms)
{
	long end = now_ms() + timeout_ms;
	while (now_ms() < end) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n < 0)
			DIE("ibv_poll_cq returned %d", n);
		if (n == 1)
			return 0;
	}
	return -1;
}

static struct ibv_qp *make_qp(struct side *s, enum ibv_qp_type type,
			      struct ibv_cq *cq)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq ? cq : s->cq,
		.recv_cq = cq ? cq : s->cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 2, .max_recv_sge = 2,
			 .max_inline_data = 64 },
		.qp_type = type,
		.sq_sig_all = 1,
	};
	struct ibv_qp *qp = ibv_create_qp(s->pd, &a);
	if (!qp)
		DIE("ibv_create_qp");
	return qp;
}

static void rc_pair(struct side *a, struct side *b, struct ibv_qp **qa,
		    struct ibv_qp **qb)
{
	*qa = make_qp(a, IBV_QPT_RC, NULL);
	*qb = make_qp(b, IBV_QPT_RC, NULL);
	if (to_init(*qa) || to_init(*qb))
		DIE("RESET->INIT");
	if (to_rtr(*qa, a, &b->gid, (*qb)->qp_num) ||
	    to_rtr(*qb, b, &a->gid, (*qa)->qp_num))
		DIE("INIT->RTR");
	if (to_rts(*qa) || to_rts(*qb))
		DIE("RTR->RTS");
}

static int post_rdma(struct ibv_qp *qp, enum ibv_wr_opcode op, void *laddr,
		     uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey,
		     uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)laddr, .length = len,
			       .lkey = lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad = NULL;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

static void check_queries(struct side *a)
{
	struct ibv_device_attr_ex dx;
	struct ibv_port_attr port;
	union ibv_gid g;
	int rc;

	rc = ibv_query_device_ex(a->ctx, NULL, &dx);
	CHECK("query_device_ex", rc == 0 && dx.orig_attr.max_qp_rd_atom > 0 &&
					 dx.orig_attr.phys_port_cnt == 1 &&
					 dx.orig_attr.vendor_id == 0xffffff,
	      "rc %d rd_atom %d ports %d", rc, dx.orig_attr.max_qp_rd_atom,
	      dx.orig_attr.phys_port_cnt);
	rc = ibv_query_port(a->ctx, 1, &port);
	CHECK("query_port", rc == 0 && port.state == IBV_PORT_ACTIVE &&
				    port.link_layer == IBV_LINK_LAYER_ETHERNET &&
				    port.gid_tbl_len >= 1,
	      "rc %d state %d link %d", rc, port.state, port.link_layer);
	rc = ibv_query_port(a->ctx, 2, &port);
	CHECK("query_port_bad_port", rc == EINVAL, "rc %d", rc);
	rc = ibv_query_gid(a->ctx, 1, 0, &g);
	CHECK("query_gid_roce_v4_mapped",
	      rc == 0 && g.raw[10] == 0xff && g.raw[11] == 0xff &&
		      g.raw[12] == 127,
	      "rc %d", rc);
	rc = ibv_query_gid(a->ctx, 1, 5, &g);
	CHECK("query_gid_bad_index", rc != 0, "rc %d", rc);
}

static void check_wrong_state(struct side *a)
{
	struct ibv_qp *qp = make_qp(a, IBV_QPT_RC, NULL);
	struct ibv_sge sge = { .addr = (uintptr_t)a->buf, .length = 8,
			       .lkey = a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED },
			   *bad = NULL;
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 },
			   *rbad = NULL;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	int rc;

	rc = ibv_post_send(qp, &wr, &bad);
	CHECK("post_send_in_reset", rc == EINVAL && bad == &wr,
	      "rc %d bad %p", rc, (void *)bad);
	rc = ibv_post_recv(qp, &rwr, &rbad);
	CHECK("post_recv_in_reset", rc != 0 && rbad == &rwr, "rc %d", rc);
	if (to_init(qp))
		DIE("RESET->INIT");
	bad = NULL;
	rc = ibv_post_send(qp, &wr, &bad);
	CHECK("post_send_in_init", rc == EINVAL && bad == &wr, "rc %d", rc);
	rc = ibv_query_qp(qp, &qa, IBV_QP_STATE, &qi);
	CHECK("query_qp_state", rc == 0 && qa.qp_state == IBV_QPS_INIT &&
					qp->state == IBV_QPS_INIT &&
					qi.qp_type == IBV_QPT_RC &&
					qi.cap.max_send_wr >= 16,
	      "rc %d state %d", rc, qa.qp_state);
	ibv_destroy_qp(qp);
}

static void check_modify_masks(struct side *a, struct side *b)
{
	struct ibv_qp *qp = make_qp(a, IBV_QPT_RC, NULL);
	struct ibv_qp_attr attr;
	int rc;

	/* RESET->INIT without the required PKEY_INDEX | PORT | ACCESS_FLAGS. */
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_INIT;
	errno = 0;
	rc = ibv_modify_qp(qp, &attr, IBV_QP_STATE);
	CHECK("modify_missing_attrs_einval", rc == EINVAL && errno == EINVAL,
	      "rc %d errno %d", rc, errno);
	/* RESET->RTS does not exist. */
	attr.qp_state = IBV_QPS_RTS;
	rc = ibv_modify_qp(qp, &attr, IBV_QP_STATE);
	CHECK("modify_bad_transition_einval", rc == EINVAL, "rc %d", rc);
	/* RESET->INIT with an attribute that transition does not take. */
	attr.qp_state = IBV_QPS_INIT;
	attr.port_num = 1;
	attr.qp_access_flags = ALL_ACCESS;
	attr.sq_psn = 5;
	rc = ibv_modify_qp(qp, &attr,
			   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS | IBV_QP_SQ_PSN);
	CHECK("modify_unexpected_attr_einval", rc == EINVAL, "rc %d", rc);
	/* A bad port number. */
	attr.port_num = 9;
	rc = ibv_modify_qp(qp, &attr,
			   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS);
	CHECK("modify_bad_port_einval", rc == EINVAL, "rc %d", rc);
	/* The QP is still in RESET: the failed calls changed nothing. */
	CHECK("modify_failed_keeps_state", qp->state == IBV_QPS_RESET,
	      "state %d", qp->state);
	rc = to_init(qp);
	CHECK("modify_reset_to_init", rc == 0 && qp->state == IBV_QPS_INIT,
	      "rc %d", rc);
	/* INIT->RTR for RC without the address vector. */
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = IBV_MTU_1024;
	attr.dest_qp_num = 1;
	rc = ibv_modify_qp(qp, &attr,
			   IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				   IBV_QP_MIN_RNR_TIMER);
	CHECK("modify_rtr_without_av_einval", rc == EINVAL, "rc %d", rc);
	/* On RoCE an AV needs a GRH: no GID, no path. */
	attr.ah_attr.is_global = 0;
	attr.ah_attr.dlid = 1;
	attr.ah_attr.port_num = 1;
	rc = ibv_modify_qp(qp, &attr,
			   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				   IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				   IBV_QP_MAX_DEST_RD_ATOMIC |
				   IBV_QP_MIN_RNR_TIMER);
	CHECK("modify_rtr_lid_only_av_einval", rc == EINVAL, "rc %d", rc);
	(void)b;
	ibv_destroy_qp(qp);
}

static void check_bad_rkey(struct side *a, struct side *b)
{
	struct ibv_qp *qa, *qb;
	struct ibv_wc wc;
	int rc;

	rc_pair(a, b, &qa, &qb);
	strcpy(a->buf, "hello");
	rc = post_rdma(qa, IBV_WR_RDMA_WRITE, a->buf, 8, a->mr->lkey,
		       (uintptr_t)b->buf, b->mr->rkey ^ 0x5a5a00, 7);
	CHECK("bad_rkey_post_accepted", rc == 0, "rc %d", rc);
	rc = poll_one(a->cq, &wc, 5000);
	CHECK("bad_rkey_rem_access_err",
	      rc == 0 && wc.status == IBV_WC_REM_ACCESS_ERR && wc.wr_id == 7,
	      "rc %d status %d (%s)", rc, wc.status,
	      ibv_wc_status_str(wc.status));
	CHECK("bad_rkey_target_untouched", b->buf[0] == 0, "byte %d",
	      b->buf[0]);
	/* The requester QP is now in the error state: later WRs flush. */
	rc = post_rdma(qa, IBV_WR_RDMA_WRITE, a->buf, 8, a->mr->lkey,
		       (uintptr_t)b->buf, b->mr->rkey, 8);
	if (rc == 0)
		rc = poll_one(a->cq, &wc, 5000);
	CHECK("after_error_wr_flushed",
	      rc == 0 && wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == 8,
	      "rc %d status %d", rc, wc.status);
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	/* Drain the responder side's CQ of anything left. */
	while (ibv_poll_cq(b->cq, 1, &wc) > 0)
		;
}

static void check_data_path(struct side *a, struct side *b)
{
	struct ibv_qp *qa, *qb;
	struct ibv_wc wc;
	uint64_t *target = (uint64_t *)(b->buf + 4096);
	uint64_t *result = (uint64_t *)(a->buf + 8192);
	int rc;

	rc_pair(a, b, &qa, &qb);

	/* WRITE then READ back. */
	memcpy(a->buf, "softrdma-write", 15);
	rc = post_rdma(qa, IBV_WR_RDMA_WRITE, a->buf, 15, a->mr->lkey,
		       (uintptr_t)b->buf + 100, b->mr->rkey, 1);
	rc = rc ? rc : poll_one(a->cq, &wc, 5000);
	CHECK("rdma_write", rc == 0 && wc.status == IBV_WC_SUCCESS &&
				    wc.opcode == IBV_WC_RDMA_WRITE &&
				    memcmp(b->buf + 100, "softrdma-write", 15) == 0,
	      "rc %d status %d", rc, wc.status);
	rc = post_rdma(qa, IBV_WR_RDMA_READ, a->buf + 1000, 15, a->mr->lkey,
		       (uintptr_t)b->buf + 100, b->mr->rkey, 2);
	rc = rc ? rc : poll_one(a->cq, &wc, 5000);
	CHECK("rdma_read", rc == 0 && wc.status == IBV_WC_SUCCESS &&
				   wc.opcode == IBV_WC_RDMA_READ &&
				   wc.byte_len == 15 &&
				   memcmp(a->buf + 1000, "softrdma-write", 15) == 0,
	      "rc %d status %d", rc, wc.status);

	/* Atomics: fetch-and-add returns the old value, compare-and-swap swaps. */
	*target = 40;
	{
		struct ibv_sge sge = { .addr = (uintptr_t)result, .length = 8,
				       .lkey = a->mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 3, .sg_list = &sge,
					  .num_sge = 1,
					  .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
					  .send_flags = IBV_SEND_SIGNALED },
				   *bad;
		wr.wr.atomic.remote_addr = (uintptr_t)target;
		wr.wr.atomic.rkey = b->mr->rkey;
		wr.wr.atomic.compare_add = 2;
		rc = ibv_post_send(qa, &wr, &bad);
		rc = rc ? rc : poll_one(a->cq, &wc, 5000);
		CHECK("atomic_fetch_add",
		      rc == 0 && wc.status == IBV_WC_SUCCESS &&
			      wc.opcode == IBV_WC_FETCH_ADD && *result == 40 &&
			      *target == 42,
		      "rc %d status %d old %llu new %llu", rc, wc.status,
		      (unsigned long long)*result,
		      (unsigned long long)*target);
		wr.wr_id = 4;
		wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
		wr.wr.atomic.compare_add = 42;
		wr.wr.atomic.swap = 7;
		rc = ibv_post_send(qa, &wr, &bad);
		rc = rc ? rc : poll_one(a->cq, &wc, 5000);
		CHECK("atomic_cmp_swap",
		      rc == 0 && wc.status == IBV_WC_SUCCESS &&
			      wc.opcode == IBV_WC_COMP_SWAP && *result == 42 &&
			      *target == 7,
		      "rc %d status %d old %llu new %llu", rc, wc.status,
		      (unsigned long long)*result,
		      (unsigned long long)*target);
	}

	/* SEND with immediate: __be32 in network order on both ends. */
	{
		struct ibv_sge rs = { .addr = (uintptr_t)b->buf + 2048,
				      .length = 64, .lkey = b->mr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 50, .sg_list = &rs,
					   .num_sge = 1 },
				   *rbad;
		struct ibv_sge ss = { .addr = (uintptr_t)a->buf, .length = 5,
				      .lkey = a->mr->lkey };
		struct ibv_send_wr swr = { .wr_id = 5, .sg_list = &ss,
					   .num_sge = 1,
					   .opcode = IBV_WR_SEND_WITH_IMM,
					   .send_flags = IBV_SEND_SIGNALED,
					   .imm_data = htonl(0x12345678) },
				   *sbad;
		struct ibv_wc rwc;

		memcpy(a->buf, "imm!!", 5);
		rc = ibv_post_recv(qb, &rwr, &rbad);
		rc = rc ? rc : ibv_post_send(qa, &swr, &sbad);
		rc = rc ? rc : poll_one(a->cq, &wc, 5000);
		rc = rc ? rc : poll_one(b->cq, &rwc, 5000);
		CHECK("send_with_imm",
		      rc == 0 && rwc.status == IBV_WC_SUCCESS &&
			      rwc.opcode == IBV_WC_RECV &&
			      (rwc.wc_flags & IBV_WC_WITH_IMM) &&
			      rwc.imm_data == htonl(0x12345678) &&
			      rwc.byte_len == 5 && rwc.wr_id == 50 &&
			      rwc.qp_num == qb->qp_num &&
			      memcmp(b->buf + 2048, "imm!!", 5) == 0,
		      "rc %d status %d flags %#x imm %#x len %u", rc,
		      rwc.status, rwc.wc_flags, ntohl(rwc.imm_data),
		      rwc.byte_len);
		/* An inline SEND from memory that is not registered at all. */
		{
			char on_stack[16] = "inline-data";
			struct ibv_sge is = { .addr = (uintptr_t)on_stack,
					      .length = 12, .lkey = 0 };
			struct ibv_send_wr iwr = {
				.wr_id = 6, .sg_list = &is, .num_sge = 1,
				.opcode = IBV_WR_SEND,
				.send_flags = IBV_SEND_SIGNALED |
					      IBV_SEND_INLINE,
			};
			struct ibv_qp_attr qattr;
			struct ibv_qp_init_attr qinit;

			ibv_query_qp(qa, &qattr, IBV_QP_CAP, &qinit);
			rwr.wr_id = 51;
			rc = ibv_post_recv(qb, &rwr, &rbad);
			rc = rc ? rc : ibv_post_send(qa, &iwr, &sbad);
			/* The bytes are copied at post time. */
			memset(on_stack, 0, sizeof(on_stack));
			rc = rc ? rc : poll_one(a->cq, &wc, 5000);
			rc = rc ? rc : poll_one(b->cq, &rwc, 5000);
			CHECK("send_inline",
			      rc == 0 && qinit.cap.max_inline_data >= 12 &&
				      rwc.status == IBV_WC_SUCCESS &&
				      memcmp(b->buf + 2048, "inline-data",
					     12) == 0,
			      "rc %d status %d cap %u", rc, rwc.status,
			      qinit.cap.max_inline_data);
			/* More than max_inline_data is refused at post. */
			is.length = 65;
			iwr.sg_list = &is;
			rc = ibv_post_send(qa, &iwr, &sbad);
			CHECK("send_inline_over_cap_einval",
			      rc == EINVAL && sbad == &iwr, "rc %d", rc);
		}
	}
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
}

static struct ibv_qp *ud_qp(struct side *s)
{
	struct ibv_qp *qp = make_qp(s, IBV_QPT_UD, NULL);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0,
				 .port_num = 1, .qkey = 0x11111111 };

	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				  IBV_QP_QKEY))
		DIE("UD RESET->INIT");
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		DIE("UD INIT->RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		DIE("UD RTR->RTS");
	return qp;
}

/* RoCEv2 receive buffers start with the request's IP header: IPv6 in the
 * 40 bytes, or IPv4 in their last 20 (as mlx5 and rxe do). */
static int grh_source_is(const char *buf, const union ibv_gid *gid)
{
	const unsigned char *b = (const unsigned char *)buf;

	if ((b[0] >> 4) == 6)
		return memcmp(b + 8, gid->raw, 16) == 0;
	return (b[20] >> 4) == 4 && memcmp(b + 32, gid->raw + 12, 4) == 0;
}

static void check_ud(struct side *a, struct side *b)
{
	struct ibv_qp *qa = ud_qp(a), *qb = ud_qp(b);
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
				  .grh = { .dgid = b->gid, .hop_limit = 64 } };
	struct ibv_ah *ah = ibv_create_ah(a->pd, &aa), *back;
	char *rbuf = b->buf + 8192;
	struct ibv_sge rs = { .addr = (uintptr_t)rbuf, .length = 40 + 64,
			      .lkey = b->mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 60, .sg_list = &rs, .num_sge = 1 },
			   *rbad;
	struct ibv_sge ss = { .addr = (uintptr_t)a->buf, .length = 6,
			      .lkey = a->mr->lkey };
	struct ibv_send_wr swr = { .wr_id = 61, .sg_list = &ss, .num_sge = 1,
				   .opcode = IBV_WR_SEND_WITH_IMM,
				   .send_flags = IBV_SEND_SIGNALED,
				   .imm_data = htonl(0xCAFEF00D) },
			   *sbad;
	struct ibv_wc wc, rwc;
	struct ibv_grh *grh = (struct ibv_grh *)rbuf;
	int rc;

	if (!ah)
		DIE("ibv_create_ah");
	memcpy(a->buf, "ud-msg", 6);
	swr.wr.ud.ah = ah;
	swr.wr.ud.remote_qpn = qb->qp_num;
	swr.wr.ud.remote_qkey = 0x11111111;
	rc = ibv_post_recv(qb, &rwr, &rbad);
	rc = rc ? rc : ibv_post_send(qa, &swr, &sbad);
	rc = rc ? rc : poll_one(a->cq, &wc, 5000);
	rc = rc ? rc : poll_one(b->cq, &rwc, 5000);
	CHECK("ud_send_recv_with_grh",
	      rc == 0 && rwc.status == IBV_WC_SUCCESS &&
		      rwc.byte_len == 40 + 6 &&
		      (rwc.wc_flags & IBV_WC_GRH) &&
		      (rwc.wc_flags & IBV_WC_WITH_IMM) &&
		      rwc.imm_data == htonl(0xCAFEF00D) &&
		      rwc.src_qp == qa->qp_num &&
		      grh_source_is(rbuf, &a->gid) &&
		      memcmp(rbuf + 40, "ud-msg", 6) == 0,
	      "rc %d status %d len %u flags %#x src_qp %u", rc, rwc.status,
	      rwc.byte_len, rwc.wc_flags, rwc.src_qp);
	/* RoCE completion fields as ConnectX fills them: sl is the packet's
	 * network-header type (mlx5: 2 IPv4, 1 IPv6), no LIDs, P_Key index 0;
	 * a send completion carries none of it. */
	CHECK("ud_wc_roce_fields",
	      rwc.sl == (((unsigned char *)rbuf)[20] >> 4 == 4 ? 2 : 1) &&
		      (((unsigned char *)rbuf)[20] >> 4 == 4 ||
		       ((unsigned char *)rbuf)[0] >> 4 == 6) &&
		      rwc.slid == 0 && rwc.pkey_index == 0 &&
		      rwc.dlid_path_bits == 0 && wc.sl == 0 &&
		      !(wc.wc_flags & IBV_WC_GRH),
	      "recv sl %u slid %u pkey_index %u dlid_path_bits %u; send sl %u flags %#x",
	      rwc.sl, rwc.slid, rwc.pkey_index, rwc.dlid_path_bits, wc.sl,
	      wc.wc_flags);
	back = ibv_create_ah_from_wc(b->pd, &rwc, grh, 1);
	CHECK("create_ah_from_wc", back != NULL, "errno %d", errno);
	if (back) {
		/* Reply along the path the receive came from. */
		struct ibv_sge rs2 = { .addr = (uintptr_t)a->buf + 8192,
				       .length = 40 + 64, .lkey = a->mr->lkey };
		struct ibv_recv_wr rwr2 = { .wr_id = 62, .sg_list = &rs2,
					    .num_sge = 1 };
		struct ibv_sge ss2 = { .addr = (uintptr_t)b->buf, .length = 3,
				       .lkey = b->mr->lkey };
		struct ibv_send_wr swr2 = { .wr_id = 63, .sg_list = &ss2,
					    .num_sge = 1, .opcode = IBV_WR_SEND,
					    .send_flags = IBV_SEND_SIGNALED };
		swr2.wr.ud.ah = back;
		swr2.wr.ud.remote_qpn = rwc.src_qp;
		swr2.wr.ud.remote_qkey = 0x11111111;
		rc = ibv_post_recv(qa, &rwr2, &rbad);
		rc = rc ? rc : ibv_post_send(qb, &swr2, &sbad);
		rc = rc ? rc : poll_one(b->cq, &wc, 5000);
		rc = rc ? rc : poll_one(a->cq, &rwc, 5000);
		CHECK("ud_reply_via_ah_from_wc",
		      rc == 0 && rwc.status == IBV_WC_SUCCESS &&
			      rwc.byte_len == 43 && rwc.wr_id == 62,
		      "rc %d status %d len %u", rc, rwc.status, rwc.byte_len);
		ibv_destroy_ah(back);
	}
	/* UD cannot do RDMA. */
	rc = post_rdma(qa, IBV_WR_RDMA_WRITE, a->buf, 8, a->mr->lkey,
		       (uintptr_t)b->buf, b->mr->rkey, 64);
	CHECK("ud_rdma_write_einval", rc == EINVAL, "rc %d", rc);
	ibv_destroy_ah(ah);
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
}

static void check_dereg_in_use(struct ibv_device *dev, struct side *a,
			       struct side *b)
{
	struct ibv_qp *qa, *qb;
	struct ibv_wc wc;
	struct ibv_mr *tmp;
	char *mem = aligned_alloc(4096, 4096);
	uint32_t rkey, lkey;
	int rc;

	(void)dev;
	memset(mem, 0, 4096);
	rc_pair(a, b, &qa, &qb);
	/* Target side: a region the peer knows the rkey of, deregistered. */
	tmp = ibv_reg_mr(b->pd, mem, 4096, ALL_ACCESS);
	if (!tmp)
		DIE("ibv_reg_mr");
	rkey = tmp->rkey;
	rc = ibv_dereg_mr(tmp);
	CHECK("dereg_target_mr", rc == 0, "rc %d", rc);
	rc = post_rdma(qa, IBV_WR_RDMA_WRITE, a->buf, 8, a->mr->lkey,
		       (uintptr_t)mem, rkey, 9);
	rc = rc ? rc : poll_one(a->cq, &wc, 5000);
	CHECK("write_to_deregistered_rem_access_err",
	      rc == 0 && wc.status == IBV_WC_REM_ACCESS_ERR,
	      "rc %d status %d", rc, wc.status);
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	while (ibv_poll_cq(b->cq, 1, &wc) > 0)
		;

	/* Local side: post a WRITE from a region, then deregister it while
	 * the WR may still be queued. softrdma deregisters at once; the WR
	 * either completed before or fails with a local protection error. */
	rc_pair(a, b, &qa, &qb);
	tmp = ibv_reg_mr(a->pd, mem, 4096, ALL_ACCESS);
	if (!tmp)
		DIE("ibv_reg_mr");
	lkey = tmp->lkey;
	rc = post_rdma(qa, IBV_WR_RDMA_WRITE, mem, 64, lkey, (uintptr_t)b->buf,
		       b->mr->rkey, 10);
	rc = rc ? rc : ibv_dereg_mr(tmp);
	CHECK("dereg_while_wr_queued_returns_0", rc == 0, "rc %d", rc);
	rc = poll_one(a->cq, &wc, 5000);
	CHECK("queued_wr_completes_or_loc_prot_err",
	      rc == 0 && (wc.status == IBV_WC_SUCCESS ||
			  wc.status == IBV_WC_LOC_PROT_ERR),
	      "rc %d status %d", rc, wc.status);
	/* A fresh QP: a WR naming the dead lkey fails locally. */
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	while (ibv_poll_cq(b->cq, 1, &wc) > 0)
		;
	rc_pair(a, b, &qa, &qb);
	rc = post_rdma(qa, IBV_WR_RDMA_WRITE, mem, 64, lkey, (uintptr_t)b->buf,
		       b->mr->rkey, 11);
	rc = rc ? rc : poll_one(a->cq, &wc, 5000);
	CHECK("wr_with_deregistered_lkey_loc_prot_err",
	      rc == 0 && wc.status == IBV_WC_LOC_PROT_ERR && wc.wr_id == 11,
	      "rc %d status %d", rc, wc.status);
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	while (ibv_poll_cq(b->cq, 1, &wc) > 0)
		;
	free(mem);
}

static void check_cq_overrun(struct side *a)
{
	struct ibv_cq *small = ibv_create_cq(a->ctx, 2, NULL, NULL, 0);
	struct ibv_qp *qp;
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_ERR };
	struct ibv_async_event ev;
	struct ibv_sge sge = { .addr = (uintptr_t)a->buf, .length = 8,
			       .lkey = a->mr->lkey };
	struct ibv_recv_wr rwr = { .sg_list = &sge, .num_sge = 1 }, *bad;
	int flags, rc, i, got = 0;
	long end;

	if (!small)
		DIE("ibv_create_cq(2)");
	qp = make_qp(a, IBV_QPT_RC, small);
	if (to_init(qp) || ibv_modify_qp(qp, &attr, IBV_QP_STATE))
		DIE("to ERR");
	/* Receives posted to a QP in ERR complete at once, flushed: eight of
	 * them overrun a CQ with room for two. */
	for (i = 0; i < 8; i++) {
		rwr.wr_id = 100 + i;
		ibv_post_recv(qp, &rwr, &bad);
	}
	flags = fcntl(a->ctx->async_fd, F_GETFL);
	fcntl(a->ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
	end = now_ms() + 5000;
	while (now_ms() < end) {
		rc = ibv_get_async_event(a->ctx, &ev);
		if (rc == 0) {
			if (ev.event_type == IBV_EVENT_CQ_ERR &&
			    ev.element.cq == small)
				got = 1;
			ibv_ack_async_event(&ev);
			if (got)
				break;
		} else if (errno != EAGAIN) {
			break;
		} else {
			struct pollfd p = { .fd = a->ctx->async_fd,
					    .events = POLLIN };
			poll(&p, 1, 100);
		}
	}
	CHECK("cq_overrun_async_event", got,
	      "no IBV_EVENT_CQ_ERR for the overrun CQ");
	rc = ibv_get_async_event(a->ctx, &ev);
	CHECK("async_event_nonblocking_eagain", rc == -1 && errno == EAGAIN,
	      "rc %d errno %d (type %d)", rc, errno,
	      rc == 0 ? (int)ev.event_type : -1);
	fcntl(a->ctx->async_fd, F_SETFL, flags);
	rc = ibv_destroy_cq(small);
	CHECK("destroy_cq_in_use_ebusy", rc == EBUSY, "rc %d", rc);
	ibv_destroy_qp(qp);
	rc = ibv_destroy_cq(small);
	CHECK("destroy_cq", rc == 0, "rc %d", rc);
}

static void check_channel(struct side *a, struct side *b)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(a->ctx);
	struct ibv_cq *cq, *ev_cq = NULL;
	struct ibv_qp *qa, *qb;
	void *ev_ctx = NULL;
	struct ibv_wc wc;
	struct pollfd p;
	int flags, rc;

	if (!ch)
		DIE("ibv_create_comp_channel");
	cq = ibv_create_cq(a->ctx, 16, (void *)0xfeed, ch, 0);
	if (!cq)
		DIE("ibv_create_cq with channel");
	rc = ibv_destroy_comp_channel(ch);
	CHECK("destroy_channel_in_use_ebusy", rc == EBUSY, "rc %d", rc);
	flags = fcntl(ch->fd, F_GETFL);
	fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK);
	rc = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
	CHECK("cq_event_nonblocking_eagain", rc == -1 && errno == EAGAIN,
	      "rc %d errno %d", rc, errno);

	qa = make_qp(a, IBV_QPT_RC, cq);
	qb = make_qp(b, IBV_QPT_RC, NULL);
	if (to_init(qa) || to_init(qb) ||
	    to_rtr(qa, a, &b->gid, qb->qp_num) ||
	    to_rtr(qb, b, &a->gid, qa->qp_num) || to_rts(qa) || to_rts(qb))
		DIE("connect");
	rc = ibv_req_notify_cq(cq, 0);
	CHECK("req_notify_cq", rc == 0, "rc %d", rc);
	rc = post_rdma(qa, IBV_WR_RDMA_WRITE, a->buf, 8, a->mr->lkey,
		       (uintptr_t)b->buf, b->mr->rkey, 20);
	p.fd = ch->fd;
	p.events = POLLIN;
	p.revents = 0;
	rc = rc ? rc : (poll(&p, 1, 5000) == 1 ? 0 : -1);
	CHECK("channel_fd_pollable", rc == 0 && (p.revents & POLLIN),
	      "rc %d revents %#x", rc, p.revents);
	rc = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
	CHECK("get_cq_event", rc == 0 && ev_cq == cq && ev_ctx == (void *)0xfeed,
	      "rc %d cq %p ctx %p", rc, (void *)ev_cq, ev_ctx);
	ibv_ack_cq_events(cq, 1);
	rc = poll_one(cq, &wc, 5000);
	CHECK("event_then_poll", rc == 0 && wc.wr_id == 20 &&
					 wc.status == IBV_WC_SUCCESS,
	      "rc %d status %d", rc, wc.status);
	/* Blocking mode again: an armed CQ's next completion wakes a
	 * blocked ibv_get_cq_event. */
	fcntl(ch->fd, F_SETFL, flags);
	ibv_req_notify_cq(cq, 0);
	post_rdma(qa, IBV_WR_RDMA_WRITE, a->buf, 8, a->mr->lkey,
		  (uintptr_t)b->buf, b->mr->rkey, 21);
	rc = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
	CHECK("get_cq_event_blocking", rc == 0 && ev_cq == cq, "rc %d", rc);
	ibv_ack_cq_events(cq, 1);
	poll_one(cq, &wc, 5000);
	CHECK("ack_counts_events", cq->comp_events_completed == 2, "%u",
	      cq->comp_events_completed);
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	rc = ibv_destroy_cq(cq);
	rc = rc ? rc : ibv_destroy_comp_channel(ch);
	CHECK("destroy_cq_and_channel", rc == 0, "rc %d", rc);
}

static void check_srq_limit(struct side *a, struct side *b)
{
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 16, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(b->pd, &si);
	struct ibv_srq_attr sa = { .srq_limit = 2 };
	struct ibv_qp_init_attr qi = {
		.send_cq = b->cq, .recv_cq = b->cq, .srq = NULL,
		.cap = { .max_send_wr = 4, .max_send_sge = 1 },
		.qp_type = IBV_QPT_RC, .sq_sig_all = 1,
	};
	struct ibv_sge sge = { .length = 64, .lkey = b->mr->lkey };
	struct ibv_recv_wr rwr = { .sg_list = &sge, .num_sge = 1 }, *rbad;
	struct ibv_qp *qa, *qb;
	struct ibv_async_event ev;
	struct ibv_wc wc;
	int i, rc, got = 0, flags;
	long end;

	if (!srq)
		DIE("ibv_create_srq");
	qi.srq = srq;
	qb = ibv_create_qp(b->pd, &qi);
	qa = make_qp(a, IBV_QPT_RC, NULL);
	if (!qb || to_init(qa) || to_init(qb) ||
	    to_rtr(qa, a, &b->gid, qb->qp_num) ||
	    to_rtr(qb, b, &a->gid, qa->qp_num) || to_rts(qa) || to_rts(qb))
		DIE("SRQ connect");
	for (i = 0; i < 4; i++) {
		sge.addr = (uintptr_t)b->buf + 4096 + 64 * i;
		rwr.wr_id = 200 + i;
		if (ibv_post_srq_recv(srq, &rwr, &rbad))
			DIE("ibv_post_srq_recv");
	}
	rc = ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT);
	CHECK("modify_srq_limit", rc == 0, "rc %d", rc);
	rc = ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR);
	CHECK("modify_srq_resize_refused", rc != 0, "rc %d", rc);
	for (i = 0; i < 3; i++) {
		struct ibv_sge ss = { .addr = (uintptr_t)a->buf, .length = 4,
				      .lkey = a->mr->lkey };
		struct ibv_send_wr swr = { .wr_id = 300 + i, .sg_list = &ss,
					   .num_sge = 1, .opcode = IBV_WR_SEND,
					   .send_flags = IBV_SEND_SIGNALED },
				   *sbad;
		ibv_post_send(qa, &swr, &sbad);
		poll_one(a->cq, &wc, 5000);
	}
	for (i = 0; i < 3; i++)
		poll_one(b->cq, &wc, 5000);
	flags = fcntl(b->ctx->async_fd, F_GETFL);
	fcntl(b->ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
	end = now_ms() + 5000;
	while (now_ms() < end && !got) {
		rc = ibv_get_async_event(b->ctx, &ev);
		if (rc == 0) {
			got = ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED &&
			      ev.element.srq == srq;
			ibv_ack_async_event(&ev);
		} else {
			usleep(1000);
		}
	}
	fcntl(b->ctx->async_fd, F_SETFL, flags);
	CHECK("srq_limit_reached_event", got, "no IBV_EVENT_SRQ_LIMIT_REACHED");
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	rc = ibv_destroy_srq(srq);
	CHECK("destroy_srq", rc == 0, "rc %d", rc);
	while (ibv_poll_cq(b->cq, 1, &wc) > 0)
		;
}

static void check_unsupported(struct side *a)
{
	struct ibv_cq_init_attr_ex cx = { .cqe = 4 };
	struct ibv_mr *mr;
	struct ibv_qp *qp;
	int rc;

	errno = 0;
	CHECK("alloc_mw_bad_type_einval",
	      ibv_alloc_mw(a->pd, (enum ibv_mw_type)3) == NULL && errno == EINVAL,
	      "errno %d", errno);
	{
		/* Extended CQs: standard fields yes, timestamps no. */
		struct ibv_poll_cq_attr pa = { 0 };
		struct ibv_cq_ex *cq;

		cx.wc_flags = IBV_WC_STANDARD_FLAGS;
		cq = ibv_create_cq_ex(a->ctx, &cx);
		CHECK("create_cq_ex", cq != NULL, "errno %d", errno);
		if (cq) {
			rc = ibv_start_poll(cq, &pa);
			CHECK("cq_ex_empty_enoent", rc == ENOENT, "rc %d", rc);
			rc = ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
			CHECK("destroy_cq_ex", rc == 0, "rc %d", rc);
		}
		cx.wc_flags |= IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
		errno = 0;
		CHECK("create_cq_ex_timestamp_eopnotsupp",
		      ibv_create_cq_ex(a->ctx, &cx) == NULL &&
			      errno == EOPNOTSUPP,
		      "errno %d", errno);
	}
	{
		/* Extended QPs: TSO is refused (no segmentation offload). */
		struct ibv_qp_init_attr_ex xa = {
			.send_cq = a->cq, .recv_cq = a->cq,
			.cap = { .max_send_wr = 1, .max_recv_wr = 1,
				 .max_send_sge = 1, .max_recv_sge = 1 },
			.qp_type = IBV_QPT_RC,
			.comp_mask = IBV_QP_INIT_ATTR_PD |
				     IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
			.pd = a->pd,
			.send_ops_flags = IBV_QP_EX_WITH_SEND |
					  IBV_QP_EX_WITH_TSO,
		};
		errno = 0;
		CHECK("create_qp_ex_tso_eopnotsupp",
		      ibv_create_qp_ex(a->ctx, &xa) == NULL &&
			      errno == EOPNOTSUPP,
		      "errno %d", errno);
		xa.send_ops_flags = IBV_QP_EX_WITH_SEND;
		qp = ibv_create_qp_ex(a->ctx, &xa);
		CHECK("create_qp_ex_send", qp && ibv_qp_to_qp_ex(qp),
		      "errno %d", errno);
		if (qp) {
			/* A builder call without a WR started fails the list. */
			struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(qp);

			ibv_wr_start(qx);
			ibv_wr_set_sge(qx, 0, 0, 0);
			rc = ibv_wr_complete(qx);
			CHECK("wr_complete_without_wr_einval", rc == EINVAL,
			      "rc %d", rc);
			ibv_destroy_qp(qp);
		}
	}
	qp = make_qp(a, IBV_QPT_RC, NULL);
	errno = 0;
	CHECK("qp_to_qp_ex_null", ibv_qp_to_qp_ex(qp) == NULL,
	      "returned a qp_ex");
	ibv_destroy_qp(qp);
	{
		struct ibv_qp_init_attr xa = {
			.send_cq = a->cq, .recv_cq = a->cq,
			.cap = { .max_send_wr = 1, .max_recv_wr = 1,
				 .max_send_sge = 1, .max_recv_sge = 1 },
			.qp_type = IBV_QPT_RAW_PACKET,
		};
		errno = 0;
		CHECK("raw_packet_qp_refused",
		      ibv_create_qp(a->pd, &xa) == NULL && errno == EOPNOTSUPP,
		      "errno %d", errno);
	}
	rc = ibv_attach_mcast(NULL, NULL, 0);
	CHECK("attach_mcast_null_einval", rc == EINVAL, "rc %d", rc);
	{
		/* ::ffff:239.1.1.9 and ::ffff:127.0.0.9 */
		union ibv_gid mg = { .raw = { [10] = 0xff, [11] = 0xff,
					      [12] = 239, [13] = 1, [14] = 1,
					      [15] = 9 } };
		union ibv_gid ug = { .raw = { [10] = 0xff, [11] = 0xff,
					      [12] = 127, [15] = 9 } };
		struct ibv_device_attr da;
		struct ibv_qp *ud = make_qp(a, IBV_QPT_UD, NULL);
		struct ibv_qp *rcq = make_qp(a, IBV_QPT_RC, NULL);

		CHECK("query_device_mcast_limits",
		      ibv_query_device(a->ctx, &da) == 0 &&
		      da.max_mcast_grp > 0 && da.max_mcast_qp_attach > 0 &&
		      da.max_total_mcast_qp_attach >= da.max_mcast_qp_attach,
		      "max_mcast_grp %d", da.max_mcast_grp);
		rc = ibv_attach_mcast(rcq, &mg, 0);
		CHECK("attach_mcast_rc_einval", rc == EINVAL, "rc %d", rc);
		rc = ibv_attach_mcast(ud, &ug, 0);
		CHECK("attach_mcast_unicast_einval", rc == EINVAL, "rc %d", rc);
		rc = ibv_attach_mcast(ud, &mg, 0);
		CHECK("attach_mcast_ud", rc == 0, "rc %d", rc);
		rc = ibv_attach_mcast(ud, &mg, 0);
		CHECK("attach_mcast_twice_ok", rc == 0, "rc %d", rc);
		rc = ibv_detach_mcast(ud, &mg, 0);
		CHECK("detach_mcast", rc == 0, "rc %d", rc);
		rc = ibv_detach_mcast(ud, &mg, 0);
		CHECK("detach_mcast_not_attached_einval", rc == EINVAL,
		      "rc %d", rc);
		ibv_destroy_qp(ud);
		ibv_destroy_qp(rcq);
	}
	/* Optional access bits (here RELAXED_ORDERING) go through
	 * ibv_reg_mr_iova2 and are ignored. */
	mr = ibv_reg_mr(a->pd, a->buf, 4096,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
	CHECK("reg_mr_optional_bits_masked", mr != NULL, "errno %d", errno);
	if (mr)
		ibv_dereg_mr(mr);
	errno = 0;
	mr = ibv_reg_mr(a->pd, a->buf, 4096, IBV_ACCESS_REMOTE_WRITE);
	CHECK("reg_mr_remote_write_needs_local_write",
	      mr == NULL && errno == EINVAL, "errno %d", errno);
	rc = ibv_dealloc_pd(a->pd);
	CHECK("dealloc_pd_in_use_ebusy", rc == EBUSY, "rc %d", rc);
}

/* UCX makes its context's async fd non-blocking, then its rdmacm
 * transport has librdmacm open the device again: that later open must
 * leave the flag alone (the contexts of one softrdma device share the fd),
 * or UCX's async thread blocks in ibv_get_async_event for good. */
static void check_reopen_keeps_nonblocking(struct ibv_device *dev, struct side *a)
{
	struct ibv_async_event ev;
	struct ibv_context *again;
	int flags, rc;

	flags = fcntl(a->ctx->async_fd, F_GETFL);
	fcntl(a->ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
	again = ibv_open_device(dev);
	if (!again)
		DIE("ibv_open_device (again)");
	CHECK("reopen_keeps_async_fd_nonblocking",
	      fcntl(a->ctx->async_fd, F_GETFL) & O_NONBLOCK, "flags %#x",
	      fcntl(a->ctx->async_fd, F_GETFL));
	rc = ibv_get_async_event(a->ctx, &ev);
	CHECK("reopen_async_event_still_eagain", rc == -1 && errno == EAGAIN,
	      "rc %d errno %d", rc, errno);
	ibv_close_device(again);
	fcntl(a->ctx->async_fd, F_SETFL, flags);
}

int main(void)
{
	struct ibv_device **list;
	struct side a, b;
	int n = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	list = ibv_get_device_list(&n);
	if (!list || n < 1)
		DIE("no devices");
	CHECK("device_name", strcmp(ibv_get_device_name(list[0]), "srx0") == 0,
	      "%s", ibv_get_device_name(list[0]));
	open_side(list[0], &a);
	open_side(list[0], &b);
	CHECK("two_opens_one_hca", a.ctx != b.ctx &&
					  memcmp(&a.gid, &b.gid, 16) == 0,
	      "two contexts of one device have different GIDs");

	check_queries(&a);
	check_wrong_state(&a);
	check_modify_masks(&a, &b);
	check_data_path(&a, &b);
	check_ud(&a, &b);
	check_bad_rkey(&a, &b);
	check_dereg_in_use(list[0], &a, &b);
	check_cq_overrun(&a);
	check_channel(&a, &b);
	check_srq_limit(&a, &b);
	check_unsupported(&a);
	check_reopen_keeps_nonblocking(list[0], &a);

	ibv_free_device_list(list);
	printf("%d failures\n", failures);
	return failures;
}
