/* next_poll: does the device's extended completion queue hand back every completion exactly
 * once, in order, when polled the way ibv_create_cq_ex(3) says: ibv_start_poll, ibv_next_poll
 * until it returns ENOENT, then ibv_end_poll ("If an error code is given, end_poll should
 * still be called")? On one device, queue pair to queue pair (loopback through the port),
 * signaled RDMA writes whose wr_ids are 1, 2, 3, ...
 *
 *   cc -O2 -o next_poll next_poll.c -libverbs && ./next_poll rxe0 1
 *
 * Four cases, each on a fresh queue and queue pair pair; in each, 2 writes are posted, let
 * complete (1 s), and polled, then 3 more the same way:
 *   A documented:  start_poll, next_poll until ENOENT, end_poll.
 *   B early end:   start_poll, next_poll that finds a completion, end_poll (the batch ends
 *                  while completions remain), then the same for the rest; next_poll only
 *                  where a completion is known to wait (start_poll, end_poll for a last
 *                  one), so no next_poll finds the queue empty.
 *   C one by one:  start_poll, end_poll per completion, never next_poll (what rverbs does).
 *   D no end:      start_poll, next_poll until ENOENT, no end_poll (not the documented
 *                  protocol; printed to show what the device's next_poll does on its own).
 * Prints, per case, the wr_ids (and statuses) polled; after the expected ones it keeps
 * polling for 0.5 s, so a phantom or stale completion shows, and a lost one shows as missing.
 * Exit status 0 when A, B and C each gave 1..5 exactly once and in order, 1 when one did not
 * (the device is wrong), 2 on a setup failure. D does not count toward the status.
 * rverbs keeps this as evidence for polling one completion per batch (core/src/verbs/cq_ex.rs). */
#include <infiniband/verbs.h>
#include "proof.h"
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

#define MAXGOT 64
struct got { int n; uint64_t id[MAXGOT]; int status[MAXGOT]; };

static void take(struct got *g, struct ibv_cq_ex *cq) {
	if (g->n < MAXGOT) { g->id[g->n] = cq->wr_id; g->status[g->n] = cq->status; }
	g->n++;
}

/* One poll of the case's kind; returns how many completions it took. */
static int poll_once(char mode, struct ibv_cq_ex *cq, struct got *g, int posted) {
	struct ibv_poll_cq_attr attr = { 0 };
	int before = g->n;
	if (ibv_start_poll(cq, &attr)) return 0; /* ENOENT: no end_poll */
	take(g, cq);
	switch (mode) {
	case 'A':
		while (g->n < MAXGOT && ibv_next_poll(cq) == 0) take(g, cq);
		ibv_end_poll(cq);
		break;
	case 'B':
		/* next_poll only while another written completion is known to wait (all were
		 * let complete before polling), so it finds one; then the batch ends with
		 * completions left in the queue. A next_poll that finds none is case A's. */
		if (posted - g->n >= 1) {
			if (ibv_next_poll(cq) == 0) take(g, cq);
			else printf("B: next_poll found nothing where a completion was due\n");
		}
		ibv_end_poll(cq);
		break;
	case 'C':
		ibv_end_poll(cq);
		break;
	case 'D':
		while (g->n < MAXGOT && ibv_next_poll(cq) == 0) take(g, cq);
		if (g->n >= MAXGOT) ibv_end_poll(cq);
		break;
	}
	return g->n - before;
}

/* Polls until `want` more completions came or 5 s passed, then 0.5 s more for extras. */
static void collect(char mode, struct ibv_cq_ex *cq, struct got *g, int want) {
	int target = g->n + want;
	double t0 = now();
	while (g->n < target && g->n < MAXGOT && now() - t0 < 5.0) poll_once(mode, cq, g, target);
	t0 = now();
	while (g->n < MAXGOT && now() - t0 < 0.5) poll_once(mode, cq, g, target);
}

static void post_writes(struct ibv_qp *qp, uint64_t first, int count, char *src, struct ibv_mr *smr,
			char *dst, struct ibv_mr *dmr) {
	for (int i = 0; i < count; i++) {
		struct ibv_sge sge = { (uintptr_t)src, 8, smr->lkey };
		struct ibv_send_wr wr, *bad;
		memset(&wr, 0, sizeof wr);
		wr.wr_id = first + i; wr.opcode = IBV_WR_RDMA_WRITE; wr.sg_list = &sge; wr.num_sge = 1;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.rdma.remote_addr = (uintptr_t)dst; wr.wr.rdma.rkey = dmr->rkey;
		if (ibv_post_send(qp, &wr, &bad)) die("ibv_post_send");
	}
}

int main(int argc, char **argv) {
	int gidx;
	struct ibv_context *ctx = open_device(argc, argv, &gidx);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd) die("ibv_alloc_pd");
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, gidx, &gid)) die("ibv_query_gid");
	static char src[64], dst[64];
	memset(src, 'A', sizeof src);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!smr || !dmr) die("ibv_reg_mr");

	const char modes[4] = { 'A', 'B', 'C', 'D' };
	const char *what[4] = { "start, next until ENOENT, end (documented)",
				"start, next finding one, end (early end)",
				"start, end per completion (rverbs)",
				"start, next until ENOENT, no end (not documented)" };
	int bad = 0;
	for (int c = 0; c < 4; c++) {
		struct ibv_cq_init_attr_ex ca;
		memset(&ca, 0, sizeof ca);
		ca.cqe = 16;
		ca.wc_flags = IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_STANDARD_FLAGS;
		struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &ca);
		if (!cq) die("ibv_create_cq_ex");
		struct ibv_qp *a = make_rc_qp(pd, ibv_cq_ex_to_cq(cq), ibv_cq_ex_to_cq(cq)),
		              *b = make_rc_qp(pd, ibv_cq_ex_to_cq(cq), ibv_cq_ex_to_cq(cq));
		connect_qp(a, b->qp_num, &gid, gidx);
		connect_qp(b, a->qp_num, &gid, gidx);
		struct got g = { 0 };
		post_writes(a, 1, 2, src, smr, dst, dmr);
		sleep(1); /* both written: the first batch finds two and then an empty queue */
		collect(modes[c], cq, &g, 2);
		int after_first = g.n;
		post_writes(a, 3, 3, src, smr, dst, dmr);
		sleep(1);
		collect(modes[c], cq, &g, 3);
		int ok = g.n == 5;
		for (int i = 0; ok && i < 5; i++) ok = g.id[i] == (uint64_t)(i + 1) && g.status[i] == IBV_WC_SUCCESS;
		printf("%c %-50s %s: %d polled (%d after the first 2 posted):", modes[c], what[c],
		       ok ? "right" : "WRONG", g.n, after_first);
		for (int i = 0; i < g.n && i < MAXGOT; i++)
			printf(" %llu%s", (unsigned long long)g.id[i],
			       g.status[i] == IBV_WC_SUCCESS ? "" : "!");
		if (g.n >= MAXGOT) printf(" ... (stopped at %d)", MAXGOT);
		printf("\n");
		if (!ok && modes[c] != 'D') bad = 1;
		/* The queue of a wrong case may be unusable: leave it (and its pairs) behind. */
	}
	printf("(a wr_id followed by ! had a status other than success)\n");
	return bad;
}
