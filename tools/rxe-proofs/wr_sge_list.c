/* wr_sge_list: does the device's ibv_wr_set_sge_list / ibv_wr_set_inline_data_list write
 * what a request with two entries names? Compared with the same request through
 * ibv_post_send, on one device, queue pair to queue pair (loopback through the port).
 *
 *   cc -O2 -o wr_sge_list wr_sge_list.c -libverbs && ./wr_sge_list rxe0 1
 *
 * Prints one line per case (legacy sge list, extended sge list, legacy inline list,
 * extended inline list): the completion's status and whether the 12 bytes written are the
 * two entries' 8 + 4 bytes (of unequal length, so a device that sums the first entry's
 * length twice shows), with nothing past them. Exit status 0 when every case wrote
 * what it named, 1 when some case did not (the device is wrong), 2 on a setup failure.
 * rverbs keeps this as evidence for working around rxe (core/src/verbs/send_ex.rs). */
#include <infiniband/verbs.h>
#include "proof.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct ibv_qp *make_qp(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq) {
	struct ibv_qp_init_attr_ex a;
	memset(&a, 0, sizeof a);
	a.send_cq = cq; a.recv_cq = cq; a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = 16; a.cap.max_recv_wr = 16;
	a.cap.max_send_sge = 2; a.cap.max_recv_sge = 1; a.cap.max_inline_data = 64;
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	a.pd = pd;
	a.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &a);
	if (!qp) die("ibv_create_qp_ex");
	return qp;
}

static int wait_one(struct ibv_cq *cq, const char **status) {
	struct ibv_wc wc;
	for (long spins = 0; spins < 200000000L; spins++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0) die("ibv_poll_cq");
		if (n == 1) { *status = ibv_wc_status_str(wc.status); return wc.status == IBV_WC_SUCCESS; }
	}
	*status = "no completion";
	return 0;
}

int main(int argc, char **argv) {
	int gidx;
	struct ibv_context *ctx = open_device(argc, argv, &gidx);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!pd || !cq) die("pd/cq");
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, gidx, &gid)) die("ibv_query_gid");

	static char src[128], dst[4][64];
	memset(src, 'A', 8); memset(src + 64, 'B', 8); /* the second entry names 4 of them */
	struct ibv_mr *smr = ibv_reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!smr || !dmr) die("ibv_reg_mr");
	struct ibv_sge sges[2] = {
		{ (uintptr_t)src, 8, smr->lkey }, { (uintptr_t)(src + 64), 4, smr->lkey } };
	struct ibv_data_buf bufs[2] = { { src, 8 }, { src + 64, 4 } };
	const char *cases[4] = { "legacy ibv_post_send, 2 sges", "extended ibv_wr_set_sge_list, 2 sges",
				 "legacy ibv_post_send inline, 2 sges", "extended ibv_wr_set_inline_data_list, 2 bufs" };
	int bad = 0;
	for (int c = 0; c < 4; c++) {
		/* A fresh pair of queue pairs per case: a case that fails leaves its pair in error. */
		struct ibv_qp *a = make_qp(ctx, pd, cq), *b = make_qp(ctx, pd, cq);
		connect_qp(a, b->qp_num, &gid, gidx);
		connect_qp(b, a->qp_num, &gid, gidx);
		struct ibv_qp_ex *ax = ibv_qp_to_qp_ex(a);
		if (!ax) die("ibv_qp_to_qp_ex");
		uint64_t raddr = (uintptr_t)dst[c];
		int rc;
		if (c % 2 == 0) {
			struct ibv_send_wr wr, *badwr;
			memset(&wr, 0, sizeof wr);
			wr.wr_id = c; wr.opcode = IBV_WR_RDMA_WRITE; wr.sg_list = sges; wr.num_sge = 2;
			wr.send_flags = IBV_SEND_SIGNALED | (c == 2 ? IBV_SEND_INLINE : 0);
			wr.wr.rdma.remote_addr = raddr; wr.wr.rdma.rkey = dmr->rkey;
			rc = ibv_post_send(a, &wr, &badwr);
		} else {
			ibv_wr_start(ax);
			ax->wr_id = c; ax->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_rdma_write(ax, dmr->rkey, raddr);
			if (c == 1) ibv_wr_set_sge_list(ax, 2, sges);
			else ibv_wr_set_inline_data_list(ax, 2, bufs);
			rc = ibv_wr_complete(ax);
		}
		const char *status = "not posted";
		int ok = rc == 0 && wait_one(cq, &status);
		char want[12]; memset(want, 'A', 8); memset(want + 8, 'B', 4);
		int bytes_ok = !memcmp(dst[c], want, 12);
		for (int i = 12; i < 64; i++) bytes_ok &= dst[c][i] == 0;
		printf("%-46s post %d, completion %-8s bytes %s (\"%.16s\")\n", cases[c], rc,
		       status, bytes_ok ? "right" : "WRONG", dst[c]);
		if (!ok || !bytes_ok) bad = 1;
	}
	return bad;
}
