/* proof.h: what every rxe proof in this folder shares: a setup failure exits 2, and a
 * queue pair is brought to RTS against another on the same port (RoCE: a global route to
 * the port's own GID), with both PSNs 0, every retry without end and remote writes allowed.
 * Included by the proofs; each still builds with one line: cc -O2 -o x x.c -libverbs */
#ifndef RVERBS_PROOF_H
#define RVERBS_PROOF_H
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what) { perror(what); exit(2); }

static inline void connect_qp(struct ibv_qp *qp, uint32_t dqpn, union ibv_gid *gid, int gidx) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT; a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR; a.path_mtu = IBV_MTU_1024; a.dest_qp_num = dqpn;
	a.rq_psn = 0; a.max_dest_rd_atomic = 1; a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1; a.ah_attr.grh.dgid = *gid; a.ah_attr.grh.sgid_index = gidx;
	a.ah_attr.grh.hop_limit = 1; a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS; a.timeout = 14; a.retry_cnt = 7; a.rnr_retry = 7; a.sq_psn = 0;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("RTS");
}

/* Opens the device named by argv[1] (rxe0 if none) and sets *gidx to argv[2] (1 if none:
 * the port's RoCE v2 GID on rxe); exits 2 if there is no such device. */
static inline struct ibv_context *open_device(int argc, char **argv, int *gidx) {
	const char *name = argc > 1 ? argv[1] : "rxe0";
	*gidx = argc > 2 ? atoi(argv[2]) : 1;
	int n; struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = NULL;
	for (int i = 0; list && i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name)) ctx = ibv_open_device(list[i]);
	if (!ctx) { fprintf(stderr, "no device %s\n", name); exit(2); }
	return ctx;
}

/* An RC queue pair of 16 requests each way, one entry each, on the given queues. */
static inline struct ibv_qp *make_rc_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = scq; a.recv_cq = rcq; a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = 16; a.cap.max_recv_wr = 16;
	a.cap.max_send_sge = 1; a.cap.max_recv_sge = 1;
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	if (!qp) die("ibv_create_qp");
	return qp;
}

#endif
