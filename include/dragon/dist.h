/*
 * dragon — the ranks of a data-parallel run and their rendezvous.
 *
 * A rank learns its place from the environment every launcher sets
 * (torchrun's names): RANK, WORLD_SIZE, LOCAL_RANK (its GPU on the node),
 * MASTER_ADDR and MASTER_PORT (where rank 0 listens). None set is a world
 * of one.
 *
 * The rendezvous is plain TCP, no MPI: rank 0 listens at
 * MASTER_ADDR:MASTER_PORT, every other rank connects (retrying until the
 * timeout, so the ranks may start in any order) and says its rank. Over it
 * rank 0 hands out NCCL's unique id (dg_rdzv_bcast), and the ranks compare
 * a digest of their weights (dg_rdzv_same: every k steps, so a rank that
 * diverged is named). A rank that dies closes its connection, and the
 * next rendezvous call of every other rank fails naming it.
 */
#ifndef DRAGON_DIST_H
#define DRAGON_DIST_H

#include <stddef.h>

#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_dist {
	int rank, world, local_rank;
	char master_addr[256]; /* default 127.0.0.1 */
	int master_port;       /* default 29500 */
} dg_dist;

/* The rank's place from the environment (above); a value that is not a
 * number in range is DG_ERR_INVALID_ARG naming the variable. */
DG_API dg_status dg_dist_from_env(dg_dist *out, char *msg, size_t msg_size);

typedef struct dg_rdzv dg_rdzv;

/* Joins the world d describes, waiting at most timeout_s seconds for
 * every rank (rank 0) or for rank 0 to listen (the others). A world of
 * one joins at once. DG_ERR_IO naming the address and what failed. */
DG_API dg_status dg_rdzv_open(const dg_dist *d, double timeout_s, dg_rdzv **out, char *msg, size_t msg_size);
DG_API void dg_rdzv_close(dg_rdzv *r); /* NULL is fine */

/* n bytes of rank 0's buf into every rank's buf. */
DG_API dg_status dg_rdzv_bcast(dg_rdzv *r, void *buf, size_t n, char *msg, size_t msg_size);

/* Whether every rank's n bytes at mine equal rank 0's: DG_OK on every
 * rank, or on every rank DG_ERR_CORRUPT naming the first rank that
 * differs (what: the bytes' name for the message, "the weights' digest"). */
DG_API dg_status dg_rdzv_same(dg_rdzv *r, const void *mine, size_t n, const char *what, char *msg,
			      size_t msg_size);

/* *any on every rank: whether any rank's flag is set (a stop every rank
 * must agree on, before the same step). */
DG_API dg_status dg_rdzv_any(dg_rdzv *r, int flag, int *any, char *msg, size_t msg_size);

/* In place on every rank: the mean over the ranks of n[i] floats at
 * v[i] (i < count) and of *scalar (may be NULL), summed in rank order in
 * double on rank 0 and rounded once, so every rank gets the same bytes
 * (the CPU model's gradients and loss; a GPU run's go through NCCL). */
DG_API dg_status dg_rdzv_mean(dg_rdzv *r, float *const *v, const size_t *n, int count, double *scalar,
			      char *msg, size_t msg_size);

/* Every rank waits for every other. */
DG_API dg_status dg_rdzv_barrier(dg_rdzv *r, char *msg, size_t msg_size);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_DIST_H */
