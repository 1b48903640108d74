/*
 * domains.c - device memory, thread domains and parent domains through
 * softrdma's libibverbs, as a C program built against Debian's
 * <infiniband/verbs.h> sees them: max_dm_size in ibv_query_device_ex, DM
 * copies in 4-byte words within the allocation (EINVAL otherwise), a
 * zero-based region over DM that an RDMA WRITE fills (data checked with
 * ibv_memcpy_from_dm), ibv_free_dm refused (EBUSY) while that region
 * exists, a parent domain used where a PD goes (a region, a QP), and the
 * PD and thread domain under it refused (EBUSY) until it goes. rdma-core's
 * own tests (test_device.DMTest, test_mr.DeviceMemory*, test_parent_domain)
 * cover the rest, in tests/pyverbs.rs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

static int wait_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	long end = now_ms() + 20000;
	int n;

	while ((n = ibv_poll_cq(cq, 1, wc)) == 0 && now_ms() < end)
		;
	return n == 1 ? 0 : -1;
}

static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq, .recv_cq = cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC, .sq_sig_all = 1,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &a);

	if (!qp)
		DIE("ibv_create_qp");
	return qp;
}

static void check_dm(struct side *a, struct side *b, struct ibv_qp *qa,
		     uint64_t max_dm)
{
	struct ibv_alloc_dm_attr da = { .length = 4096 };
	struct ibv_dm *dm;
	struct ibv_mr *dmr;
	struct ibv_sge sge;
	struct ibv_send_wr wr = { 0 }, *bad;
	struct ibv_wc wc;
	uint32_t words[4] = { 0 }, got[256];
	int i, rc;

	CHECK("max_dm_size reported", max_dm >= 4096, "max_dm_size %llu",
	      (unsigned long long)max_dm);
	da.length = max_dm + 1;
	errno = 0;
	CHECK("alloc_dm over max_dm_size refused",
	      !ibv_alloc_dm(b->ctx, &da) && errno == EINVAL, "errno %d", errno);
	da.length = 4096;
	da.comp_mask = 8;
	errno = 0;
	CHECK("alloc_dm with an unknown comp_mask refused",
	      !ibv_alloc_dm(b->ctx, &da) && errno == EINVAL, "errno %d", errno);
	da.comp_mask = 0;
	dm = ibv_alloc_dm(b->ctx, &da);
	if (!dm)
		DIE("ibv_alloc_dm");
	rc = ibv_memcpy_to_dm(dm, 2, words, 4);
	CHECK("memcpy_to_dm at an unaligned offset refused", rc == EINVAL, "rc %d", rc);
	rc = ibv_memcpy_to_dm(dm, 4096 - 4, words, 8);
	CHECK("memcpy_to_dm past the end refused", rc == EINVAL, "rc %d", rc);
	rc = ibv_memcpy_from_dm(words, dm, 0, 6);
	CHECK("memcpy_from_dm of an unaligned length refused", rc == EINVAL, "rc %d", rc);

	errno = 0;
	CHECK("reg_dm_mr without ZERO_BASED refused",
	      !ibv_reg_dm_mr(b->pd, dm, 0, 1024, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL,
	      "errno %d", errno);
	errno = 0;
	CHECK("reg_dm_mr past the DM refused",
	      !ibv_reg_dm_mr(b->pd, dm, 4, 4096, IBV_ACCESS_ZERO_BASED | ALL_ACCESS) &&
		      errno == EINVAL,
	      "errno %d", errno);
	dmr = ibv_reg_dm_mr(b->pd, dm, 1024, 1024, IBV_ACCESS_ZERO_BASED | ALL_ACCESS);
	if (!dmr)
		DIE("ibv_reg_dm_mr");

	/* An RDMA WRITE into the DM region, addressed from 0 (zero-based). */
	for (i = 0; i < 256; i++)
		((uint32_t *)a->buf)[i] = 0xd0000000u + i;
	sge = (struct ibv_sge){ .addr = (uintptr_t)a->buf, .length = 1024, .lkey = a->mr->lkey };
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.wr.rdma.remote_addr = 0;
	wr.wr.rdma.rkey = dmr->rkey;
	if (ibv_post_send(qa, &wr, &bad))
		DIE("ibv_post_send");
	rc = wait_one(a->cq, &wc);
	CHECK("WRITE into a zero-based DM region completes",
	      rc == 0 && wc.status == IBV_WC_SUCCESS, "rc %d status %s", rc,
	      rc ? "-" : ibv_wc_status_str(wc.status));
	rc = ibv_memcpy_from_dm(got, dm, 1024, sizeof(got));
	CHECK("the WRITE's data is in the DM",
	      rc == 0 && !memcmp(got, a->buf, sizeof(got)), "rc %d, got[0] %#x", rc, got[0]);

	rc = ibv_free_dm(dm);
	CHECK("free_dm while a region uses it is EBUSY", rc == EBUSY, "rc %d", rc);
	if (ibv_dereg_mr(dmr))
		DIE("ibv_dereg_mr");
	rc = ibv_free_dm(dm);
	CHECK("free_dm after the region went", rc == 0, "rc %d", rc);
}

static void check_domains(struct side *a)
{
	struct ibv_td_init_attr ta = { 0 };
	struct ibv_parent_domain_init_attr pa = { 0 };
	struct ibv_td *td;
	struct ibv_pd *pd = ibv_alloc_pd(a->ctx), *parent;
	struct ibv_mr *mr;
	struct ibv_qp *qp;
	int rc;

	if (!pd)
		DIE("ibv_alloc_pd");
	ta.comp_mask = 1;
	errno = 0;
	CHECK("alloc_td with an unknown comp_mask refused",
	      !ibv_alloc_td(a->ctx, &ta) && errno == EINVAL, "errno %d", errno);
	ta.comp_mask = 0;
	td = ibv_alloc_td(a->ctx, &ta);
	if (!td)
		DIE("ibv_alloc_td");
	errno = 0;
	CHECK("parent domain without a PD refused",
	      !ibv_alloc_parent_domain(a->ctx, &pa) && errno == EINVAL, "errno %d", errno);
	pa.pd = pd;
	pa.td = td;
	parent = ibv_alloc_parent_domain(a->ctx, &pa);
	if (!parent)
		DIE("ibv_alloc_parent_domain");
	pa.pd = parent;
	errno = 0;
	CHECK("parent domain of a parent domain refused",
	      !ibv_alloc_parent_domain(a->ctx, &pa) && errno == EINVAL, "errno %d", errno);

	mr = ibv_reg_mr(parent, a->buf + 8192, 4096, ALL_ACCESS);
	CHECK("a region in a parent domain", mr != NULL, "errno %d", errno);
	qp = rc_qp(parent, a->cq);
	CHECK("a QP in a parent domain", qp != NULL, "errno %d", errno);

	rc = ibv_dealloc_pd(pd);
	CHECK("dealloc_pd under a parent domain is EBUSY", rc == EBUSY, "rc %d", rc);
	rc = ibv_dealloc_td(td);
	CHECK("dealloc_td under a parent domain is EBUSY", rc == EBUSY, "rc %d", rc);
	if (ibv_destroy_qp(qp) || ibv_dereg_mr(mr))
		DIE("destroy the QP and region");
	rc = ibv_dealloc_pd(parent);
	CHECK("dealloc_pd of the parent domain", rc == 0, "rc %d", rc);
	rc = ibv_dealloc_td(td);
	CHECK("dealloc_td once the parent domain went", rc == 0, "rc %d", rc);
	rc = ibv_dealloc_pd(pd);
	CHECK("dealloc_pd once the parent domain went", rc == 0, "rc %d", rc);
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_device_attr_ex attr;
	struct side a, b;
	struct ibv_qp *qa, *qb;

	if (!list || !list[0])
		DIE("no device");
	open_side(list[0], &a);
	open_side(list[0], &b);
	if (ibv_query_device_ex(a.ctx, NULL, &attr))
		DIE("ibv_query_device_ex");
	qa = rc_qp(a.pd, a.cq);
	qb = rc_qp(b.pd, b.cq);
	if (to_init(qa) || to_init(qb) || to_rtr(qa, &a, &b.gid, qb->qp_num) ||
	    to_rtr(qb, &b, &a.gid, qa->qp_num) || to_rts(qa) || to_rts(qb))
		DIE("connect");
	check_dm(&a, &b, qa, attr.max_dm_size);
	check_domains(&a);
	printf("%d failures\n", failures);
	return failures;
}
