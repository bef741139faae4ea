/*
 * dragon — a training run's state and its checkpoints.
 *
 * A checkpoint is one safetensors file:
 *   - the f32 master weights under the reference's names and shapes
 *     (embed.weight, encoder, encoder_v, decoder, lm_head), so PyTorch's
 *     safetensors.torch.load_file gives a state dict the project's PyTorch
 *     model loads (the other tensors are extra keys to leave out);
 *   - AdamW's moments as "adamw.m.<name>" and "adamw.v.<name>", F32, the
 *     weight's shape;
 *   - metadata: the model's config (as dg_model_weights_save writes it:
 *     layers, embd, heads, neurons, vocab, preset) and dropout; the run's
 *     step, seed, data position and data RNG state (decimal), its tokens
 *     a row ("time", the context it trained at; absent from files saved
 *     before it was written, which load with time 0), its rows a step
 *     ("batch"), its micro-batches a step ("accum", gradient accumulation;
 *     absent from files saved before it was written, which load with 0,
 *     and written only when above 1) and its corpus's digest ("corpus_sha256", hex,
 *     dg_corpus_digest: a byte corpus's SHA-256; both
 *     absent from older files, which load with 0 and ""), and the
 *     optimizer's hyper-parameters (%.9g: each float reads back exactly);
 *     "loss_scale": "dynamic" or "off", and with it dynamic its state,
 *     "loss_scale.value" (S, %.9g), "loss_scale.good_steps" and
 *     "loss_scale.growth_interval" (files saved before the scaler was
 *     written lack them all and load as "off");
 *     "format": "dragon-checkpoint-2", "kind": "checkpoint", and
 *     "file_sha256", the file's seal: the SHA-256 (hex) of the whole file
 *     — header, metadata and tensors — as it is with these 64 digits
 *     written as '0' (docs/formats.md), so a flipped bit anywhere in
 *     it, a step or an RNG state as much as a weight, is refused.
 * It is written atomically (temp file, fsync, rename, directory
 * fsync), so a crash or a full disk leaves the
 * previous file as it was. A file whose tensors or metadata are missing,
 * misshapen or unparsable is refused, naming what; so is one whose
 * weights or moments are not finite (a second moment negative), though
 * its seal holds (dg_model_file_check: every reader checks the same).
 *
 * Older files: a "dragon-checkpoint-1" (saved before seals) still loads,
 * so a run saved then can be resumed, sampled and evaluated; its
 * "data_sha256" (the SHA-256 of its tensors' bytes alone; absent from the
 * oldest, which load unchecked) is checked, its metadata only for form
 * and sense (a step past the run's steps is refused). Its next checkpoint
 * is a sealed one.
 */
#ifndef DRAGON_CHECKPOINT_H
#define DRAGON_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "model.h"
#include "optim.h"
#include "rng.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_train_state {
	dg_model_weights *weights;          /* the masters (owned), config inside */
	float *m[DG_MODEL_N_PARAMS];        /* AdamW's moments, the params' shapes (owned) */
	float *v[DG_MODEL_N_PARAMS];
	int64_t step;                       /* optimizer steps done */
	uint64_t seed;                      /* the run's seed (batches, dropout) */
	dg_rng data_rng;                    /* the batch stream's state after data_pos batches */
	uint64_t data_pos;                  /* batches drawn so far */
	int time;                           /* T, tokens a row it trains at; 0: unknown */
	int batch;                          /* B, rows a step (all ranks'); 0: unknown */
	int accum;                          /* micro-batches of B rows a step (--accum); 0: unknown (1) */
	char corpus_sha256[65];             /* the corpus's digest (hex, dg_corpus_digest); "": unknown */
	dg_adamw_config opt;
	dg_loss_scaler scaler;              /* the loss scaler after `step` steps (off: S 1) */
} dg_train_state;

/* A run's state at step 0: a copy of w, zero moments, the data RNG
 * seeded with seed. Free with dg_train_state_destroy (NULL is fine). */
DG_API dg_status dg_train_state_create(const dg_model_weights *w, uint64_t seed, const dg_adamw_config *opt,
				       dg_train_state **out, char *msg, size_t msg_size);
DG_API void dg_train_state_destroy(dg_train_state *s);

/* Writes s to path atomically. DG_ERR_IO names the file, the step that
 * failed and errno (a full disk: "write: No space left on device"); the
 * temp file is then removed and the previous file at path is as it was. */
DG_API dg_status dg_checkpoint_save(const dg_train_state *s, const char *path, char *msg, size_t msg_size);

/* The file dg_checkpoint_save writes, in memory (malloc'd *out of *size
 * bytes; free it). */
DG_API dg_status dg_checkpoint_bytes(const dg_train_state *s, void **out, size_t *size, char *msg,
				     size_t msg_size);

/* Reads a checkpoint (a new state in *out), after the checks of every
 * reader of weights (dg_model_file_check). DG_ERR_NOT_FOUND / DG_ERR_IO
 * for the file; DG_ERR_CORRUPT "<path>: damaged: ..." when its bytes do
 * not hash to its seal (a flipped bit anywhere), or a sealed format lacks
 * its seal; DG_ERR_NUMERIC naming the tensor and index of a weight or
 * moment that is not finite, or a negative second moment; DG_ERR_PARSE
 * naming the tensor or key that is missing, misshapen or not a number (a
 * truncated file, a damaged header), a step past the run's steps, or a
 * file that is not a checkpoint (weights, gradients). Every message names
 * the file. */
DG_API dg_status dg_checkpoint_load(const char *path, dg_train_state **out, char *msg, size_t msg_size);
/* dg_checkpoint_load of size bytes in memory; name says them in messages. */
DG_API dg_status dg_checkpoint_parse(const void *bytes, size_t size, const char *name, dg_train_state **out,
				     char *msg, size_t msg_size);

/* Whether a run of config c, optimizer opt and loss scaler mode
 * loss_scale (DG_LOSS_SCALE_OFF / _DYNAMIC) may resume from s: OK, or
 * DG_ERR_INVALID_ARG naming the first field that differs ("heads: the
 * checkpoint's 4, this run's 8"; "loss_scale: the checkpoint's off, this
 * run's dynamic"). */
DG_API dg_status dg_checkpoint_match(const dg_train_state *s, const dg_model_config *c,
				     const dg_adamw_config *opt, uint32_t loss_scale, char *msg,
				     size_t msg_size);

/* The checkpoint file of step in dir: "<dir>/ckpt-<step, 8 digits>.safetensors". */
DG_API void dg_checkpoint_path(const char *dir, int64_t step, char *out, size_t size);

/* Keeps the `keep` newest checkpoints of dir (by step), removing older
 * ckpt-*.safetensors files, and removes the temp files of checkpoint
 * saves that died midway (ckpt-*.safetensors.tmp.<pid>.*, whose process
 * is gone or is this one: call it between saves); other files are left
 * alone. keep < 1 keeps all the checkpoints. *latest (may be NULL) gets
 * the newest checkpoint's step, or -1; temp files never count. */
DG_API dg_status dg_checkpoint_prune(const char *dir, int keep, int64_t *latest, char *msg, size_t msg_size);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_CHECKPOINT_H */
