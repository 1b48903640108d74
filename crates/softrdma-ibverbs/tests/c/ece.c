/*
 * ece.c - ibv_query_ece / ibv_set_ece through softrdma's libibverbs, as a
 * C program built against Debian's <infiniband/verbs.h> sees them: a fresh
 * RC QP offers softrdma's vendor ID (0x00535201) with the selective-repeat
 * option (bit 0); two QPs agree on the common options, set them before
 * RTR, read them back, and move data both ways with every byte checked;
 * setting options off reads back 0 (plain go-back-N); vendor 0 is
 * EOPNOTSUPP as in rdma-core; another vendor, an unknown option bit, a
 * comp_mask, a UD QP and a QP past INIT are EINVAL. Run by
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

#define SOFTRDMA_VENDOR 0x00535201u
#define ECE_SELECTIVE_REPEAT 1u

#define QP_WR 16
#define INLINE_MAX 0
#define PAGE 4096
#include "harness.h"


/* Posts one signaled WR on qp and returns its completion status. */
static int one(struct ibv_qp *qp, struct ibv_cq *cq, enum ibv_wr_opcode op,
	       void *laddr, uint32_t lkey, uint32_t len, uint64_t raddr,
	       uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)laddr, .length = len,
			       .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;
	long end = now_ms() + 20000;
	int n;

	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.compare_add = 5;
		wr.wr.atomic.rkey = rkey;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	if (ibv_post_send(qp, &wr, &bad))
		DIE("ibv_post_send");
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && now_ms() < end)
		;
	if (n != 1)
		DIE("no completion");
	return wc.status;
}


/* One side's offer and the other's: the common options of one vendor. */
static struct ibv_ece agree(struct ibv_ece mine, struct ibv_ece theirs)
{
	struct ibv_ece e = { 0 };

	if (mine.vendor_id && mine.vendor_id == theirs.vendor_id) {
		e.vendor_id = mine.vendor_id;
		e.options = mine.options & theirs.options;
	}
	return e;
}

int main(void)
{
	struct ibv_device **list;
	struct side a, b;
	struct ibv_qp *qa, *qb, *q, *ud;
	struct ibv_ece ea, eb, e, got;
	struct ibv_qp_init_attr ua = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UD,
	};
	int n = 0, rc, st1, st2;
	size_t i;

	setvbuf(stdout, NULL, _IOLBF, 0);
	list = ibv_get_device_list(&n);
	if (!list || n < 1)
		DIE("no devices");
	open_side(list[0], &a);
	open_side(list[0], &b);

	qa = small_qp(&a, NULL, NULL, NULL);
	qb = small_qp(&b, NULL, NULL, NULL);
	memset(&ea, 0xff, sizeof(ea));
	rc = ibv_query_ece(qa, &ea);
	CHECK("ece_query_offers_selective_repeat",
	      rc == 0 && ea.vendor_id == SOFTRDMA_VENDOR &&
		      (ea.options & ECE_SELECTIVE_REPEAT) && ea.comp_mask == 0,
	      "rc %d vendor %#x options %#x comp_mask %#x", rc, ea.vendor_id,
	      ea.options, ea.comp_mask);
	if (ibv_query_ece(qb, &eb))
		DIE("ibv_query_ece");

	/* Errors, on a QP of their own. */
	q = small_qp(&a, NULL, NULL, NULL);
	e = (struct ibv_ece){ .vendor_id = 0, .options = 1 };
	rc = ibv_set_ece(q, &e);
	CHECK("ece_vendor_0_eopnotsupp", rc == EOPNOTSUPP, "rc %d", rc);
	e = (struct ibv_ece){ .vendor_id = 0x0002c9, .options = 1 };
	rc = ibv_set_ece(q, &e);
	CHECK("ece_other_vendor_einval", rc == EINVAL, "rc %d", rc);
	e = (struct ibv_ece){ .vendor_id = SOFTRDMA_VENDOR, .options = 0x80 };
	rc = ibv_set_ece(q, &e);
	CHECK("ece_unknown_option_einval", rc == EINVAL, "rc %d", rc);
	e = (struct ibv_ece){ .vendor_id = SOFTRDMA_VENDOR, .options = 1,
			      .comp_mask = 1 };
	rc = ibv_set_ece(q, &e);
	CHECK("ece_comp_mask_einval", rc == EINVAL, "rc %d", rc);
	e = (struct ibv_ece){ .vendor_id = SOFTRDMA_VENDOR, .options = 0 };
	rc = ibv_set_ece(q, &e);
	memset(&got, 0xff, sizeof(got));
	CHECK("ece_off_reads_back_0",
	      rc == 0 && ibv_query_ece(q, &got) == 0 &&
		      got.vendor_id == SOFTRDMA_VENDOR && got.options == 0,
	      "rc %d vendor %#x options %#x", rc, got.vendor_id, got.options);
	ua.send_cq = ua.recv_cq = a.cq;
	ud = ibv_create_qp(a.pd, &ua);
	if (!ud)
		DIE("ibv_create_qp UD");
	e = (struct ibv_ece){ .vendor_id = SOFTRDMA_VENDOR, .options = 1 };
	rc = ibv_set_ece(ud, &e);
	CHECK("ece_ud_einval", rc == EINVAL, "rc %d", rc);
	rc = ibv_set_ece(ud, NULL);
	CHECK("ece_null_einval", rc == EINVAL, "rc %d", rc);

	/* The negotiation: both offers, agreed, set in RESET, read back. */
	e = agree(ea, eb);
	rc = ibv_set_ece(qa, &e);
	st1 = rc;
	e = agree(eb, ea);
	rc = ibv_set_ece(qb, &e);
	memset(&got, 0, sizeof(got));
	st2 = ibv_query_ece(qa, &got);
	CHECK("ece_agreed_and_set",
	      st1 == 0 && rc == 0 && st2 == 0 &&
		      got.vendor_id == SOFTRDMA_VENDOR &&
		      got.options == ECE_SELECTIVE_REPEAT,
	      "set %d/%d query %d vendor %#x options %#x", st1, rc, st2,
	      got.vendor_id, got.options);
	if (to_init(qa) || to_init(qb))
		DIE("RESET->INIT");
	if (to_rtr(qa, &a, &b.gid, qb->qp_num) ||
	    to_rtr(qb, &b, &a.gid, qa->qp_num))
		DIE("INIT->RTR");
	if (to_rts(qa) || to_rts(qb))
		DIE("RTR->RTS");
	e = (struct ibv_ece){ .vendor_id = SOFTRDMA_VENDOR, .options = 0 };
	rc = ibv_set_ece(qa, &e);
	CHECK("ece_after_rtr_einval", rc == EINVAL, "rc %d", rc);

	/* Data both ways over the selective-repeat QPs. */
	for (i = 0; i < 65536; i++) {
		a.buf[i] = (char)(i * 7 + 3);
		b.buf[i] = 0;
	}
	st1 = one(qa, a.cq, IBV_WR_RDMA_WRITE, a.buf, a.mr->lkey, 65536,
		  (uintptr_t)b.buf, b.mr->rkey);
	CHECK("ece_sr_write_64k",
	      st1 == IBV_WC_SUCCESS && memcmp(a.buf, b.buf, 65536) == 0,
	      "status %d", st1);
	memset(a.buf, 0, 65536);
	st2 = one(qa, a.cq, IBV_WR_RDMA_READ, a.buf, a.mr->lkey, 65536,
		  (uintptr_t)b.buf, b.mr->rkey);
	for (i = 0; i < 65536 && a.buf[i] == (char)(i * 7 + 3); i++)
		;
	CHECK("ece_sr_read_64k", st2 == IBV_WC_SUCCESS && i == 65536,
	      "status %d, first bad byte %zu", st2, i);

	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	ibv_destroy_qp(q);
	ibv_destroy_qp(ud);
	ibv_free_device_list(list);
	return failures;
}
