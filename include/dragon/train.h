/*
 * dragon — a training run: batches of a corpus, the model's step, AdamW
 * on the f32 masters, a JSONL log, checkpoints, and resuming from them.
 *
 * On the GPU the whole step — the update and the execution copies too —
 * runs on the device (dragon/model.h "training on the GPU"), replaying one
 * captured CUDA graph from the second step on (no_graph: eagerly); the
 * host queues step t + 1 before it reads step t's loss, so the device
 * never waits for the host, except after a step that validates or
 * checkpoints (those read the device's state back).
 *
 * Step t (0-based) of a run:
 *   1. the learning rate dg_adamw_lr(opt, t); a batch of the train split
 *      drawn from the run's data RNG (dragon/data.h);
 *   2. the loss and every weight's gradient (dropout on, keyed on the
 *      run's seed and t), on the CPU model or the GPU one; with accum K >
 *      1 the batch drawn is K·B rows, run as K micro-batches of B rows
 *      whose gradients are summed, each scaled by 1/K (the loss, their
 *      mean), before one update: the step of one batch of K·B rows up to
 *      the sums' order (the same rows, the same dropout masks);
 *   3. the global gradient norm and its clip factor; a loss or norm that
 *      is not finite stops the run (DG_ERR_NUMERIC, naming the step; the
 *      last checkpoint is kept);
 *   4. AdamW on every weight (each is a matrix, so each decays);
 *   5. a log line; every eval_every steps (and at the last) the mean
 *      validation loss over eval_batches fixed batches (dropout off; the
 *      same batches every time, every run); every ckpt_every steps (and at
 *      the last, and when stop_at stops it) a checkpoint, the newest
 *      `keep` kept (ckpt_every < 0: never).
 * Before each step the run looks at *stop (when given): once it is set
 * (a SIGINT handler's flag, say), the run checkpoints the steps done
 * (unless that checkpoint is already there, or ckpt_every < 0), closes
 * the log and returns DG_ERR_INTERRUPTED, "interrupted at step N of M;
 * checkpoint <path>" (or "no checkpoint (none asked for)");
 * resuming then goes on as if nothing had happened.
 * Everything that step t reads — the weights, the moments, t, the data
 * RNG — is in the checkpoint, so a run resumed from one logs the same
 * losses, bit for bit, as one that never stopped.
 *
 * On the CPU model a lone run also looks at *stop between the ops of a
 * step (and of a validation): a long step is dropped midway, its batch
 * drawn again on resume, so the checkpoint is of the steps done; a step
 * whose validation was cut short is logged without its val_loss, which
 * the resume computes and adds to its line.
 * Files in out_dir: log.jsonl (one object a step: step, train_loss, lr,
 * grad_norm, tokens_per_s, wall_s, and val_loss where evaluated; each
 * line written whole, by one write), ckpt-<step>.safetensors
 * (dragon/checkpoint.h) and lock (dg_train_lock: one run at a time
 * writes the folder). Every checkpoint is published atomically, so a run
 * killed at any moment (kill -9 included) leaves its newest complete
 * checkpoint loadable; the temp file a killed save leaves is ignored, and
 * removed by the next run in the folder.
 * A resumed run holds the flags that shape its batches and schedule to
 * the checkpoint's: the corpus (its digest), B, T, accum and the steps, besides
 * the config and the optimizer (dg_checkpoint_match); allow_changed lets
 * the first five differ, and the run's first log line then says what
 * changed ("changed": {"batch": {"from": 8, "to": 16}, ...}). It repairs
 * the log to the checkpoint: the lines past its step dropped (an
 * interrupted run's), and, each told to the warn callback, the lines
 * that are not whole log lines or whose step does not follow the one
 * before (dropped), a missing log, and the steps missing between its
 * lines or up to the checkpoint's (which it cannot make up).
 * On the CPU model the run first holds the step's memory
 * (dg_model_cpu_fits) to what the machine has, before it allocates.
 */
#ifndef DRAGON_TRAIN_H
#define DRAGON_TRAIN_H

#include <signal.h> /* sig_atomic_t */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data.h"
#include "export.h"
#include "model.h"
#include "optim.h"
#include "runtime.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dg_rdzv; /* dragon/dist.h */
struct dg_comm; /* dragon/comm.h */

/*
 * Data parallel: this process is rank `rank` of `world` processes that run
 * the same run, each on its share of every batch: the batch (o->batch
 * rows, a multiple of world) is drawn as a lone run draws it and rank r
 * takes rows [r·B/world, (r+1)·B/world). The gradients and the loss are
 * averaged over the ranks before the norm and the update (the CPU model's
 * through the rendezvous, the GPU model's by NCCL inside its captured
 * step), so every rank's update, and so its weights, are the same, and
 * the run is the lone run at batch B up to the sums' order. Every step
 * the ranks agree on whether to stop (a signal any rank got); every
 * check_every steps (and at the end) they compare a SHA-256 of their
 * weights, and a rank that diverged stops the run naming it (DG_ERR_CORRUPT).
 * Rank 0 alone writes the log and the checkpoints; a resume reads them on
 * every rank.
 */
typedef struct dg_train_world {
	int rank, world;
	struct dg_rdzv *rdzv;  /* the ranks' rendezvous (dg_rdzv_open) */
	struct dg_comm *comm;  /* the GPU model: NCCL over the ranks; NULL on the CPU */
	int64_t check_every;   /* steps between the weights' digest checks; 0: at the end only */
} dg_train_world;

/* A resume's note to the caller (a line, no newline): what it found
 * wrong with the log and did about it. */
typedef void (*dg_train_warn)(const char *msg, void *user);

/* Where a run stands, filled as it goes (the caller may read it from a
 * signal handler: each field is written whole). */
typedef struct dg_train_result {
	int64_t first;        /* the steps done when it started (0, or the checkpoint's) */
	int64_t step;         /* the steps done now (at the end: the newest checkpoint's) */
	bool resume_refused;  /* a resume refused for a flag that differs from the
			       * checkpoint's (dg_checkpoint_match's fields, the
			       * corpus, B, T, the steps): a usage error */
	/* Time to the first step, from dg_train_run's call (0 until known):
	 * ready_s when the model is ready (the GPU: its kernels built, its
	 * memory planned and allocated, the optimizer set up), first_step_s
	 * when the first step's loss is read back (its log line). The GPU's
	 * kernels by where they came from, at ready_s: */
	double ready_s, first_step_s;
	/* ready_s's parts: weights_s to the initial weights (drawn, or read
	 * from the checkpoint) and the run's state, model_s for the GPU model
	 * (its kernels compiled, its nodes prepared, its arenas allocated and
	 * the weights uploaded: dg_model_create), optim_s for its optimizer
	 * (dg_model_optim_init: masters, moments, the captured step) */
	double weights_s, model_s, optim_s;
	/* model_s's parts: its kernels compiled at once (on the GPU they
	 * compile while the weights are drawn or read: what that left to
	 * wait for), its plans built (the nodes prepared, any kernel the
	 * compile missed built then), its arenas allocated, the weights
	 * uploaded and converted */
	double model_compile_s, model_plan_s, model_alloc_s, model_upload_s;
	size_t kernels_compiled, kernels_cached, kernels_bundled;
	/* The GPU: the most device memory the run held at once, from the
	 * model's creation to the last step reported so far: the arenas,
	 * the weights, the optimizer's state, the workspaces (what dg_malloc
	 * gave it: dg_device_stats.peak_allocated, as PyTorch's
	 * max_memory_allocated; the driver's context, modules and graphs
	 * are not counted, nor other processes'). Bytes; 0 on the CPU. */
	size_t peak_bytes;
	/* The GPU model's memory-for-time choices, each made where the step's
	 * plan fits the device's free memory (false on the CPU): keep_qr, the
	 * attention's RoPE'd queries kept for its backward; stack_pgrads, the
	 * encoders' weight gradients as one GEMM over every layer's rows;
	 * recompute, the projections' outputs made again by the backward
	 * rather than saved (taken only when the plan that saves them does
	 * not fit); recompute_ys (below) */
	bool keep_qr, stack_pgrads, recompute;
	/* The attention's form (the GPU): 0 the quadratic one, else the
	 * chunked one's chunk C (rows of T a state covers) */
	int attn_chunk;
	/* The GPU: the encoder_v's output alone made again by the backward
	 * (taken where the plan that saves both projections' outputs does
	 * not fit, or DRAGON_MEMORY's budget, and the one that saves xs does;
	 * DRAGON_RECOMPUTE=ys) */
	bool recompute_ys;
} dg_train_result;

/* The most micro-batches a step (dg_train_opts.accum). */
#define DG_TRAIN_MAX_ACCUM 1024

typedef struct dg_train_opts {
	dg_model_config model; /* the config (preset and shape) */
	int batch, time;       /* B, T: a micro-batch's rows (accum of them a step) */
	int accum;             /* gradient accumulation: micro-batches a step (1..DG_TRAIN_MAX_ACCUM; 0: 1) */
	dg_adamw_config opt;   /* opt.steps: the run's length */
	uint64_t seed;         /* weights' init, batches, dropout */
	int64_t eval_every;    /* steps between validation losses; 0: only at the end */
	int eval_batches;      /* fixed validation batches a validation loss (32) */
	int64_t ckpt_every;    /* steps between checkpoints; 0: only at the end;
				* < 0: none at all, not at the end nor when stopped
				* (a run that cannot be resumed: a benchmark's) */
	int keep;              /* checkpoints kept (3); < 1: all */
	const char *out_dir;   /* log.jsonl and the checkpoints (created) */
	bool resume;           /* continue from out_dir's newest checkpoint */
	int64_t stop_at;       /* stop after this many steps (a checkpoint first); 0: run to the end */
	dg_device *dev;        /* the GPU model on dev; NULL: the CPU model */
	bool no_graph;         /* the GPU: run each step eagerly, not a captured graph */
	/* the GPU: the dynamic loss scaler (dragon/optim.h dg_loss_scaler,
	 * from S 2^16); a step whose gradient norm overflows is skipped and
	 * logged ("skipped": true), not an error. The CPU model refuses it. */
	bool loss_scale;
	/* NULL, or a flag the caller may set at any time (from a signal
	 * handler too: the run only reads it, before each step); set, the run
	 * checkpoints and returns DG_ERR_INTERRUPTED (see above) */
	const volatile sig_atomic_t *stop;
	/* NULL: a lone run; else this process's rank of a data-parallel one */
	const dg_train_world *world;
	/* resume: the corpus, B, T and the steps (and with the steps the
	 * warmup) may differ from the checkpoint's; the change is logged */
	bool allow_changed;
	dg_train_warn warn;       /* NULL, or told the log's repairs (with warn_user) */
	void *warn_user;
	dg_train_result *result;  /* NULL, or kept up to date (see above) */
} dg_train_opts;

/* Fills o with the defaults: the 25M bf16 preset, B 8, T 512, AdamW's
 * defaults for `steps`, eval every 100 steps over 32 batches, a checkpoint
 * every 500, keep 3, out_dir "runs/latest", seed 1337. */
DG_API void dg_train_defaults(dg_train_opts *o, int64_t steps);

/* What a step reports to the caller's progress callback (may be NULL). */
typedef struct dg_train_report {
	int64_t step;        /* steps done */
	int64_t steps;       /* of the run */
	double train_loss;
	double val_loss;     /* NAN when not evaluated this step */
	float lr;
	double grad_norm;
	double tokens_per_s; /* this step's */
	double wall_s;       /* since the run (or its resumption) started */
	double flops_per_token; /* the model's, forward and backward, at T
				   (dg_model_flops_per_token): times tokens_per_s,
				   the FLOP/s achieved */
	bool skipped;        /* the loss scaler skipped this step's update */
	float loss_scale;    /* the scaler's S after the step; 0 without one */
} dg_train_report;
typedef void (*dg_train_progress)(const dg_train_report *r, void *user);

/*
 * The run folder's lock: dir (made, as mkdir -p) gets a file "lock" that
 * the caller holds (an fcntl write lock, F_SETLK: never waits) with its
 * pid written in, until dg_train_unlock(*fd) or its exit, whatever ends
 * it (the kernel drops the lock of a killed process, so a stale file
 * blocks nothing). dg_train_run takes it (rank 0); a launcher of ranks
 * takes it for them, and its rank 0 then runs under its parent's lock.
 * DG_ERR_IO when another process holds it: "<dir>: in use by another
 * training run (pid N)", *holder (may be NULL) its pid; else 0.
 */
DG_API dg_status dg_train_lock(const char *dir, int *fd, long *holder, char *msg, size_t msg_size);
DG_API void dg_train_unlock(int fd); /* -1 is fine */

/*
 * Runs (or resumes) the run o describes on corpus c. Errors name what:
 * a config the model or the optimizer refuses, a corpus too short for a
 * row of T (dg_corpus_check) or holding tokens past the model's
 * vocabulary (its vocab above the config's), a folder another run holds
 * (dg_train_lock),
 * a shape the CPU model has no memory for (DG_ERR_NOMEM), a resume
 * without a checkpoint or whose config differs (the field, both values;
 * o->result->resume_refused), a loss or gradient that is not finite
 * (DG_ERR_NUMERIC, the step; with o->loss_scale only a loss: a norm
 * that is not finite is a skipped step), a file that cannot be written (a
 * checkpoint's save names the file, errno and the step of the newest
 * checkpoint still there). DG_ERR_INTERRUPTED when *o->stop was set.
 */
DG_API dg_status dg_train_run(const dg_train_opts *o, const dg_corpus *c, dg_train_progress progress,
			      void *user, char *msg, size_t msg_size);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_TRAIN_H */
