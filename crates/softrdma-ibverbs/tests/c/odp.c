/*
 * odp.c - on-demand paging through softrdma's libibverbs, as a C program
 * built against Debian's <infiniband/verbs.h> sees it: the ODP capability
 * bits of ibv_query_device_ex, explicit ODP regions (IBV_ACCESS_ON_DEMAND)
 * that fault nothing in at registration and whose pages the accesses (or
 * ibv_advise_mr) resolve, implicit ODP (NULL, SIZE_MAX) over the whole
 * address space, a remote access to an unmapped page answered with
 * IBV_WC_REM_ACCESS_ERR, and pinned registration of unmapped memory
 * refused with EFAULT. Data is checked byte for byte. Run by
 * tests/c_programs.rs; each check prints "PASS <name>" or
 * "FAIL <name>: <why>"; the exit status is the number of failures.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define QP_WR 16
#define INLINE_MAX 0
#include "harness.h"

#define PAGE 4096

static size_t resident(void *p, size_t pages)
{
	unsigned char v[64];
	size_t n = 0, i;

	if (pages > 64 || mincore(p, pages * PAGE, v))
		DIE("mincore");
	for (i = 0; i < pages; i++)
		n += v[i] & 1;
	return n;
}

static void *map_pages(size_t pages)
{
	void *p = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		DIE("mmap");
	return p;
}

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

int main(void)
{
	struct ibv_device **list;
	struct ibv_device_attr_ex ex;
	struct side a, b;
	struct ibv_qp *qa, *qb;
	struct ibv_mr *odp, *imp, *bad_mr;
	struct ibv_sge sge;
	char *m, *heap, *hole;
	size_t i;
	int n = 0, rc;

	setvbuf(stdout, NULL, _IOLBF, 0);
	list = ibv_get_device_list(&n);
	if (!list || n < 1)
		DIE("no devices");
	open_side(list[0], &a);
	open_side(list[0], &b);
	for (i = 0; i < 65536; i++)
		a.buf[i] = (char)(i * 7 + 3);

	memset(&ex, 0, sizeof(ex));
	rc = ibv_query_device_ex(a.ctx, NULL, &ex);
	CHECK("odp_caps",
	      rc == 0 &&
		      (ex.odp_caps.general_caps & IBV_ODP_SUPPORT) &&
		      (ex.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT) &&
		      (ex.odp_caps.per_transport_caps.rc_odp_caps &
		       (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
			IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
			IBV_ODP_SUPPORT_ATOMIC)) ==
			      (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
			       IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
			       IBV_ODP_SUPPORT_ATOMIC),
	      "rc %d general %#llx rc %#x", rc,
	      (unsigned long long)ex.odp_caps.general_caps,
	      ex.odp_caps.per_transport_caps.rc_odp_caps);

	connect_pair(&a, &b, &qa, &qb);

	/* Explicit ODP over 16 untouched pages. */
	m = map_pages(16);
	odp = ibv_reg_mr(b.pd, m, 16 * PAGE, ALL_ACCESS | IBV_ACCESS_ON_DEMAND);
	CHECK("odp_reg_faults_nothing_in", odp && resident(m, 16) == 0,
	      "mr %p resident %zu", (void *)odp, odp ? resident(m, 16) : 0);
	if (!odp)
		DIE("ibv_reg_mr ON_DEMAND");
	rc = one(qa, a.cq, IBV_WR_RDMA_WRITE, a.buf, a.mr->lkey, 3 * PAGE,
		 (uintptr_t)(m + 2 * PAGE), odp->rkey);
	CHECK("odp_write_data",
	      rc == IBV_WC_SUCCESS && !memcmp(m + 2 * PAGE, a.buf, 3 * PAGE),
	      "status %d", rc);
	CHECK("odp_write_resolved_its_pages", resident(m, 16) == 3,
	      "resident %zu", resident(m, 16));
	rc = one(qa, a.cq, IBV_WR_RDMA_READ, a.buf + 32768, a.mr->lkey,
		 3 * PAGE, (uintptr_t)(m + 2 * PAGE), odp->rkey);
	CHECK("odp_read_data",
	      rc == IBV_WC_SUCCESS && !memcmp(a.buf + 32768, a.buf, 3 * PAGE),
	      "status %d", rc);

	/* ibv_advise_mr: prefetch resolves pages ahead of the accesses. */
	sge = (struct ibv_sge){ .addr = (uintptr_t)(m + 8 * PAGE),
				.length = 4 * PAGE, .lkey = odp->lkey };
	rc = ibv_advise_mr(b.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
			   IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);
	CHECK("advise_mr_prefetch", rc == 0 && resident(m, 16) == 7,
	      "rc %d resident %zu", rc, resident(m, 16));
	sge.lkey ^= 0x5a5a;
	rc = ibv_advise_mr(b.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1);
	CHECK("advise_mr_unknown_lkey_einval", rc == EINVAL, "rc %d", rc);
	sge = (struct ibv_sge){ .addr = (uintptr_t)(m + 15 * PAGE),
				.length = 2 * PAGE, .lkey = odp->lkey };
	rc = ibv_advise_mr(b.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1);
	CHECK("advise_mr_outside_einval", rc == EINVAL, "rc %d", rc);

	/* Pinned registration of memory with a hole: EFAULT. */
	hole = map_pages(4);
	munmap(hole + PAGE, PAGE);
	errno = 0;
	bad_mr = ibv_reg_mr(b.pd, hole, 4 * PAGE, ALL_ACCESS);
	CHECK("pinned_reg_of_unmapped_efault", !bad_mr && errno == EFAULT,
	      "mr %p errno %d", (void *)bad_mr, errno);

	/* Implicit ODP: the peer names process addresses directly. */
	imp = ibv_reg_mr(b.pd, NULL, SIZE_MAX, ALL_ACCESS | IBV_ACCESS_ON_DEMAND);
	CHECK("implicit_odp_reg", imp && imp->length == SIZE_MAX,
	      "mr %p errno %d", (void *)imp, errno);
	if (!imp)
		DIE("implicit ODP");
	heap = malloc(10000);
	memset(heap, 0, 10000);
	rc = one(qa, a.cq, IBV_WR_RDMA_WRITE, a.buf + 100, a.mr->lkey, 10000,
		 (uintptr_t)heap, imp->rkey);
	CHECK("implicit_odp_write_data",
	      rc == IBV_WC_SUCCESS && !memcmp(heap, a.buf + 100, 10000),
	      "status %d", rc);
	rc = one(qa, a.cq, IBV_WR_ATOMIC_FETCH_AND_ADD, a.buf + 40960,
		 a.mr->lkey, 8, (uintptr_t)hole, imp->rkey);
	CHECK("implicit_odp_atomic",
	      rc == IBV_WC_SUCCESS && *(uint64_t *)hole == 5, "status %d", rc);
	/* A page nobody mapped: the status hardware gives, not a crash. */
	rc = one(qa, a.cq, IBV_WR_RDMA_WRITE, a.buf, a.mr->lkey, 64,
		 (uintptr_t)(hole + PAGE), imp->rkey);
	CHECK("implicit_odp_unmapped_rem_access_err",
	      rc == IBV_WC_REM_ACCESS_ERR, "status %d", rc);

	free(heap);
	ibv_dereg_mr(imp);
	ibv_dereg_mr(odp);
	printf("failures %d\n", failures);
	return failures;
}
