/*
 * dragon — collectives across GPUs (NCCL), for data-parallel training.
 *
 * NCCL is opened like the driver: dlopen'd through one door the first
 * time it is needed (never at load time), so a machine without it runs
 * everything single-GPU and only a multi-GPU call says it is missing. The
 * library is looked for at $DRAGON_NCCL (a file), then as libnccl.so.2 on
 * the loader's path, then in $CUDA_HOME/lib64, $CUDA_HOME/lib,
 * /usr/local/cuda/lib64 and /usr/local/cuda/lib (the toolkit ships it).
 *
 * A dg_comm is one rank of a communicator over world ranks (one GPU a
 * rank), made from a unique id that rank 0 creates and hands to the others
 * (dragon/dist.h's rendezvous carries it). Its all-reduce runs on the
 * calling thread's stream of the device (dg_device_set_stream), so it is
 * ordered with dragon's kernels and is captured into a CUDA graph with
 * them.
 */
#ifndef DRAGON_COMM_H
#define DRAGON_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "fmt.h"
#include "runtime.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DG_COMM_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

/* NCCL's version (2.28.9 is 22809) and where it was loaded from (path may
 * be NULL). DG_ERR_UNSUPPORTED naming where it looked when there is none. */
DG_API dg_status dg_nccl_version(int *version, char *path, size_t path_size, char *msg, size_t msg_size);

/* A new unique id (rank 0 makes it; the others receive it). No GPU
 * needed. */
DG_API dg_status dg_comm_unique_id(uint8_t id[DG_COMM_ID_BYTES], char *msg, size_t msg_size);

typedef struct dg_comm dg_comm;

/* Rank `rank` of `world` on dev, from rank 0's id: blocks until every
 * rank has joined (NCCL's init). Errors on dev's message. */
DG_API dg_status dg_comm_create(dg_device *dev, const uint8_t id[DG_COMM_ID_BYTES], int world, int rank,
				dg_comm **out);
/* Ends it; after an error or when another rank failed, abort (no wait
 * for the others). NULL is fine. */
DG_API void dg_comm_destroy(dg_comm *c, int abort);

/* In place: buf's count values of fmt (f32 | bf16) summed over the ranks,
 * divided by the world size when average; queued on the calling thread's
 * stream. */
DG_API dg_status dg_comm_allreduce(dg_comm *c, dg_dptr buf, size_t count, dg_fmt fmt, int average);
/* An error a rank's collectives hit asynchronously (a peer gone), as a
 * status and a message on the device; DG_OK when none. */
DG_API dg_status dg_comm_check(dg_comm *c);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_COMM_H */
