/*
 * mw.c - memory windows through softrdma's libibverbs, as a C program built
 * against Debian's <infiniband/verbs.h> sees them: the device's window
 * capabilities, ibv_alloc_mw of types 1 and 2 (and a type that does not
 * exist), ibv_bind_mw of a type-1 window through the QP's send queue
 * (IBV_WC_BIND_MW, the rkey's key byte moved on), a type-2 bind posted as
 * an IBV_WR_BIND_MW work request and through ibv_wr_bind_mw of the
 * extended QP, WRITEs through a window's rkey (data checked byte for byte;
 * outside its range or without its right: IBV_WC_REM_ACCESS_ERR, nothing
 * written), IBV_WR_LOCAL_INV, SEND with invalidate (IBV_WC_WITH_INV and
 * the invalidated rkey at the receiver), a bind to a region without
 * IBV_ACCESS_MW_BIND (IBV_WC_MW_BIND_ERR) and ibv_dealloc_mw. Run by
 * tests/c_programs.rs; each check prints "PASS <name>" or
 * "FAIL <name>: <why>"; the exit status is the number of failures.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define QP_WR 16
#define INLINE_MAX 0
#define SIDE_MR_ACCESS (ALL_ACCESS | IBV_ACCESS_MW_BIND)
#include "harness.h"



static void connect_pair(struct side *a, struct side *b, struct ibv_qp **qa,
			 struct ibv_qp **qb)
{
	*qa = small_qp(a, NULL, NULL, NULL);
	*qb = small_qp(b, NULL, NULL, NULL);
	if (to_init(*qa) || to_init(*qb))
		DIE("RESET->INIT");
	if (to_rtr(*qa, a, &b->gid, (*qb)->qp_num) ||
	    to_rtr(*qb, b, &a->gid, (*qa)->qp_num))
		DIE("INIT->RTR");
	if (to_rts(*qa) || to_rts(*qb))
		DIE("RTR->RTS");
}

/* Polls one completion of cq (or dies). */
static struct ibv_wc poll_one(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	long end = now_ms() + 20000;
	int n;

	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && now_ms() < end)
		;
	if (n != 1)
		DIE("no completion");
	return wc;
}

/* A signaled WRITE of len bytes from a's buffer to raddr/rkey: its status. */
static int write_to(struct side *a, struct ibv_qp *qa, uint32_t len,
		    uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)a->buf, .length = len,
			       .lkey = a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(qa, &wr, &bad))
		DIE("ibv_post_send WRITE");
	return poll_one(a->cq).status;
}

/* Posts a type-2 bind of mw over [off, off + len) of b's buffer. */
static uint32_t post_bind2(struct side *b, struct ibv_qp *qb,
			   struct ibv_mw *mw, struct ibv_mr *mr, size_t off,
			   size_t len, unsigned access, int *status)
{
	struct ibv_send_wr wr = { .wr_id = 21, .opcode = IBV_WR_BIND_MW,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;

	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info.mr = mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)(b->buf + off);
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = access;
	if (ibv_post_send(qb, &wr, &bad))
		DIE("ibv_post_send BIND_MW");
	wc = poll_one(b->cq);
	*status = wc.opcode == IBV_WC_BIND_MW ? (int)wc.status : -1;
	return wr.bind_mw.rkey;
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_device_attr attr;
	struct side a, b;
	struct ibv_qp *qa, *qb;
	struct ibv_mw *mw, *mw2;
	struct ibv_mw_bind bind;
	struct ibv_wc wc;
	struct ibv_mr *nobind;
	uint32_t old, rkey;
	int n = 0, rc, st;
	size_t i;

	setvbuf(stdout, NULL, _IOLBF, 0);
	list = ibv_get_device_list(&n);
	if (!list || n < 1)
		DIE("no devices");
	open_side(list[0], &a);
	open_side(list[0], &b);
	for (i = 0; i < 65536; i++)
		a.buf[i] = (char)(i * 7 + 3);

	rc = ibv_query_device(a.ctx, &attr);
	CHECK("device_caps_mem_window",
	      rc == 0 && attr.max_mw > 0 &&
		      (attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW) &&
		      (attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B),
	      "rc %d max_mw %d flags %#x", rc, attr.max_mw,
	      attr.device_cap_flags);
	errno = 0;
	mw = ibv_alloc_mw(b.pd, (enum ibv_mw_type)3);
	CHECK("alloc_mw_type3_einval", !mw && errno == EINVAL, "mw %p errno %d",
	      (void *)mw, errno);

	/* Type 1: ibv_bind_mw, a WRITE inside and one past the window. */
	connect_pair(&a, &b, &qa, &qb);
	mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_1);
	if (!mw)
		DIE("ibv_alloc_mw type 1");
	CHECK("alloc_mw_type1", mw->type == IBV_MW_TYPE_1 && mw->pd == b.pd,
	      "type %d", mw->type);
	old = mw->rkey;
	bind = (struct ibv_mw_bind){
		.wr_id = 11, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = b.mr, .addr = (uintptr_t)(b.buf + 4096),
			       .length = 8192,
			       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE |
						  IBV_ACCESS_REMOTE_READ },
	};
	rc = ibv_bind_mw(qb, mw, &bind);
	wc = poll_one(b.cq);
	CHECK("bind_mw_type1",
	      rc == 0 && wc.status == IBV_WC_SUCCESS &&
		      wc.opcode == IBV_WC_BIND_MW && wc.wr_id == 11 &&
		      mw->rkey == ibv_inc_rkey(old),
	      "rc %d status %d opcode %d rkey %#x old %#x", rc, wc.status,
	      wc.opcode, mw->rkey, old);
	rc = write_to(&a, qa, 4096, (uintptr_t)(b.buf + 8192), mw->rkey);
	CHECK("write_through_type1_window",
	      rc == IBV_WC_SUCCESS && !memcmp(b.buf + 8192, a.buf, 4096),
	      "status %d", rc);
	memset(b.buf, 0, 65536);
	rc = write_to(&a, qa, 64, (uintptr_t)(b.buf + 4096 + 8192 - 32),
		      mw->rkey);
	CHECK("write_past_window_rem_access_err",
	      rc == IBV_WC_REM_ACCESS_ERR && b.buf[4096 + 8192 - 32] == 0,
	      "status %d", rc);
	bind.bind_info.mr = b.mr;
	{
		struct ibv_mw *t2 = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
		CHECK("bind_mw_type2_einval", t2 && ibv_bind_mw(qb, t2, &bind) == EINVAL,
		      "the header's ibv_bind_mw takes type 1 only");
		if (t2)
			ibv_dealloc_mw(t2);
	}
	CHECK("dealloc_mw_type1", ibv_dealloc_mw(mw) == 0, "dealloc");
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);

	/* Type 2 through IBV_WR_BIND_MW, then IBV_WR_LOCAL_INV. */
	connect_pair(&a, &b, &qa, &qb);
	mw2 = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
	if (!mw2)
		DIE("ibv_alloc_mw type 2");
	rkey = post_bind2(&b, qb, mw2, b.mr, 0, 4096, IBV_ACCESS_REMOTE_WRITE,
			  &st);
	CHECK("bind_mw_type2_wr", st == IBV_WC_SUCCESS, "status %d", st);
	rc = write_to(&a, qa, 4096, (uintptr_t)b.buf, rkey);
	CHECK("write_through_type2_window",
	      rc == IBV_WC_SUCCESS && !memcmp(b.buf, a.buf, 4096),
	      "status %d", rc);
	{
		struct ibv_send_wr wr = { .wr_id = 31, .opcode = IBV_WR_LOCAL_INV,
					  .send_flags = IBV_SEND_SIGNALED },
				   *bad;
		wr.invalidate_rkey = rkey;
		if (ibv_post_send(qb, &wr, &bad))
			DIE("ibv_post_send LOCAL_INV");
		wc = poll_one(b.cq);
		CHECK("local_inv",
		      wc.status == IBV_WC_SUCCESS &&
			      wc.opcode == IBV_WC_LOCAL_INV,
		      "status %d opcode %d", wc.status, wc.opcode);
	}
	rc = write_to(&a, qa, 8, (uintptr_t)b.buf, rkey);
	CHECK("write_after_local_inv_rem_access_err",
	      rc == IBV_WC_REM_ACCESS_ERR, "status %d", rc);
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);

	/* Type 2 again (it is free), invalidated by a SEND with invalidate. */
	connect_pair(&a, &b, &qa, &qb);
	mw2->rkey = rkey;
	rkey = post_bind2(&b, qb, mw2, b.mr, 0, 4096, IBV_ACCESS_REMOTE_WRITE,
			  &st);
	CHECK("rebind_after_invalidation", st == IBV_WC_SUCCESS, "status %d", st);
	{
		struct ibv_sge rs = { .addr = (uintptr_t)(b.buf + 32768),
				      .length = 64, .lkey = b.mr->lkey };
		struct ibv_recv_wr r = { .wr_id = 41, .sg_list = &rs,
					 .num_sge = 1 }, *rbad;
		struct ibv_sge ss = { .addr = (uintptr_t)a.buf, .length = 16,
				      .lkey = a.mr->lkey };
		struct ibv_send_wr s = { .wr_id = 42, .sg_list = &ss,
					 .num_sge = 1,
					 .opcode = IBV_WR_SEND_WITH_INV,
					 .send_flags = IBV_SEND_SIGNALED },
				   *sbad;
		s.invalidate_rkey = rkey;
		if (ibv_post_recv(qb, &r, &rbad) || ibv_post_send(qa, &s, &sbad))
			DIE("post SEND_WITH_INV");
		wc = poll_one(a.cq);
		CHECK("send_with_inv_sent", wc.status == IBV_WC_SUCCESS,
		      "status %d", wc.status);
		wc = poll_one(b.cq);
		CHECK("send_with_inv_received",
		      wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
			      (wc.wc_flags & IBV_WC_WITH_INV) &&
			      wc.invalidated_rkey == rkey && wc.byte_len == 16 &&
			      !memcmp(b.buf + 32768, a.buf, 16),
		      "status %d flags %#x rkey %#x", wc.status, wc.wc_flags,
		      wc.invalidated_rkey);
	}
	rc = write_to(&a, qa, 8, (uintptr_t)b.buf, rkey);
	CHECK("write_after_send_with_inv_rem_access_err",
	      rc == IBV_WC_REM_ACCESS_ERR, "status %d", rc);
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);

	/* ibv_wr_bind_mw of the extended QP, then ibv_dealloc_mw. */
	{
		struct ibv_qp_init_attr_ex xa = {
			.send_cq = b.cq, .recv_cq = b.cq,
			.cap = { .max_send_wr = QP_WR, .max_recv_wr = QP_WR,
				 .max_send_sge = 1, .max_recv_sge = 1 },
			.qp_type = IBV_QPT_RC, .sq_sig_all = 1,
			.comp_mask = IBV_QP_INIT_ATTR_PD |
				     IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
			.pd = b.pd,
			.send_ops_flags = IBV_QP_EX_WITH_BIND_MW |
					  IBV_QP_EX_WITH_LOCAL_INV |
					  IBV_QP_EX_WITH_RDMA_WRITE,
		};
		struct ibv_mw_bind_info info = {
			.mr = b.mr, .addr = (uintptr_t)(b.buf + 16384),
			.length = 4096,
			.mw_access_flags = IBV_ACCESS_REMOTE_WRITE,
		};
		struct ibv_qp_ex *qx;

		qa = small_qp(&a, NULL, NULL, NULL);
		qb = ibv_create_qp_ex(b.ctx, &xa);
		if (!qb)
			DIE("ibv_create_qp_ex with BIND_MW");
		if (to_init(qa) || to_init(qb) ||
		    to_rtr(qa, &a, &b.gid, qb->qp_num) ||
		    to_rtr(qb, &b, &a.gid, qa->qp_num) || to_rts(qa) ||
		    to_rts(qb))
			DIE("connect the extended QP");
		qx = ibv_qp_to_qp_ex(qb);
		mw2->rkey = rkey;
		rkey = ibv_inc_rkey(rkey);
		ibv_wr_start(qx);
		qx->wr_id = 51;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_bind_mw(qx, mw2, rkey, &info);
		rc = ibv_wr_complete(qx);
		wc = poll_one(b.cq);
		CHECK("wr_bind_mw",
		      rc == 0 && wc.status == IBV_WC_SUCCESS &&
			      wc.opcode == IBV_WC_BIND_MW && wc.wr_id == 51,
		      "rc %d status %d opcode %d", rc, wc.status, wc.opcode);
		rc = write_to(&a, qa, 4096, (uintptr_t)(b.buf + 16384), rkey);
		CHECK("write_through_wr_bound_window",
		      rc == IBV_WC_SUCCESS &&
			      !memcmp(b.buf + 16384, a.buf, 4096),
		      "status %d", rc);
		CHECK("dealloc_mw_type2", ibv_dealloc_mw(mw2) == 0, "dealloc");
		rc = write_to(&a, qa, 8, (uintptr_t)(b.buf + 16384), rkey);
		CHECK("write_after_dealloc_rem_access_err",
		      rc == IBV_WC_REM_ACCESS_ERR, "status %d", rc);
		ibv_destroy_qp(qa);
		ibv_destroy_qp(qb);
	}

	/* A bind to a region registered without IBV_ACCESS_MW_BIND. */
	connect_pair(&a, &b, &qa, &qb);
	nobind = ibv_reg_mr(b.pd, b.buf, 4096, ALL_ACCESS);
	mw2 = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
	if (!nobind || !mw2)
		DIE("reg_mr / alloc_mw");
	post_bind2(&b, qb, mw2, nobind, 0, 4096, IBV_ACCESS_REMOTE_WRITE, &st);
	CHECK("bind_without_mw_bind_access_mw_bind_err",
	      st == IBV_WC_MW_BIND_ERR, "status %d", st);
	ibv_dealloc_mw(mw2);
	ibv_dereg_mr(nobind);
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);

	printf("%d failures\n", failures);
	return failures;
}
