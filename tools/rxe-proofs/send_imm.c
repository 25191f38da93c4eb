/* send_imm: does the device flag the SENDER's completion of a send or RDMA write with
 * immediate IBV_WC_WITH_IMM? ibv_poll_cq(3) defines IBV_WC_WITH_IMM (and imm_data) for
 * receive completions only. On one device, queue pair to queue pair (loopback through the
 * port), a receive posted at the target for each request.
 *
 *   cc -O2 -o send_imm send_imm.c -libverbs && ./send_imm rxe0 1
 *
 * Prints one line per request (IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE_WITH_IMM) and side
 * (the sender's completion, polled with ibv_poll_cq from the sender's own queue, and the
 * target's receive completion): status, opcode, wc_flags and imm_data (as stored, network
 * order). Exit status 0 when no sender completion has IBV_WC_WITH_IMM, 1 when one has (the
 * device sets a flag the man page defines only for receives), 2 on a setup failure (also
 * when a request or its receive does not complete successfully).
 * rverbs keeps this as evidence for reading the immediate of receives only
 * (core/src/verbs/cq.rs). */
#include <infiniband/verbs.h>
#include "proof.h"
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct ibv_wc wait_one(struct ibv_cq *cq, const char *what) {
	struct ibv_wc wc;
	for (long spins = 0; spins < 200000000L; spins++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0) die("ibv_poll_cq");
		if (n == 1) return wc;
	}
	fprintf(stderr, "no completion: %s\n", what);
	exit(2);
}

static void show(const char *req, const char *side, const struct ibv_wc *wc) {
	printf("%-26s %-8s status %-8s opcode %3d wc_flags 0x%02x%s imm_data 0x%08x\n", req, side,
	       ibv_wc_status_str(wc->status), wc->opcode, wc->wc_flags,
	       wc->wc_flags & IBV_WC_WITH_IMM ? " (WITH_IMM)" : "           ", wc->imm_data);
}

int main(int argc, char **argv) {
	int gidx;
	struct ibv_context *ctx = open_device(argc, argv, &gidx);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	/* Separate queues, so a completion's side is the queue it came from. */
	struct ibv_cq *scq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_cq *rcq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!pd || !scq || !rcq) die("pd/cq");
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, gidx, &gid)) die("ibv_query_gid");
	static char src[64], dst[64], rbuf[64];
	memset(src, 'A', sizeof src);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *rmr = ibv_reg_mr(pd, rbuf, sizeof rbuf, IBV_ACCESS_LOCAL_WRITE);
	if (!smr || !dmr || !rmr) die("ibv_reg_mr");
	struct ibv_qp *a = make_rc_qp(pd, scq, scq), *b = make_rc_qp(pd, rcq, rcq);
	connect_qp(a, b->qp_num, &gid, gidx);
	connect_qp(b, a->qp_num, &gid, gidx);

	const char *reqs[2] = { "IBV_WR_SEND_WITH_IMM", "IBV_WR_RDMA_WRITE_WITH_IMM" };
	int bad = 0;
	for (int c = 0; c < 2; c++) {
		struct ibv_sge rsge = { (uintptr_t)rbuf, sizeof rbuf, rmr->lkey };
		struct ibv_recv_wr rwr, *rbad;
		memset(&rwr, 0, sizeof rwr);
		rwr.wr_id = 100 + c; rwr.sg_list = &rsge; rwr.num_sge = 1;
		if (ibv_post_recv(b, &rwr, &rbad)) die("ibv_post_recv");
		struct ibv_sge sge = { (uintptr_t)src, 8, smr->lkey };
		struct ibv_send_wr wr, *sbad;
		memset(&wr, 0, sizeof wr);
		wr.wr_id = c; wr.sg_list = &sge; wr.num_sge = 1; wr.send_flags = IBV_SEND_SIGNALED;
		wr.imm_data = htonl(0x11223344u + c);
		if (c == 0) {
			wr.opcode = IBV_WR_SEND_WITH_IMM;
		} else {
			wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
			wr.wr.rdma.remote_addr = (uintptr_t)dst; wr.wr.rdma.rkey = dmr->rkey;
		}
		if (ibv_post_send(a, &wr, &sbad)) die("ibv_post_send");
		struct ibv_wc swc = wait_one(scq, "sender"), rwc = wait_one(rcq, "receiver");
		show(reqs[c], "sender", &swc);
		show(reqs[c], "receiver", &rwc);
		if (swc.status != IBV_WC_SUCCESS || rwc.status != IBV_WC_SUCCESS) {
			fprintf(stderr, "a request failed: setup\n");
			return 2;
		}
		if (swc.wc_flags & IBV_WC_WITH_IMM) bad = 1;
	}
	return bad;
}
