/*
 * What the model's files share (runtime/train/): the kind of recipe the
 * step's tape serves.
 */
#ifndef DG_RUNTIME_TRAIN_MODEL_INT_H
#define DG_RUNTIME_TRAIN_MODEL_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "dragon/checkpoint.h"
#include "dragon/model.h"
#include "runtime/store/safetensors.h"

/* Projection p's recipe in c (dragon/model.h dg_proj), and the
 * projection's name: "encoder", "encoder_v", "decoder". */
const dg_proj_recipe *dg__proj_recipe(const dg_model_config *c, dg_proj p);
const char *dg__proj_name(dg_proj p);

/* NULL when c's recipe is the low-bit kind the tape serves — every
 * projection's weights and activations integer, the activations a scale
 * a token (absmax): one scale a layer cannot serve the weight gradient's
 * one GEMM over all layers — else why not, naming the field, in buf. */
const char *dg__model_lowbit_why(const dg_model_config *c, char *buf, size_t size);

/* The CPU model's recipes (cpu_model.c): NULL when it runs c's (*lowbit:
 * fake-quantized integer weights and activations), else why not. */
const char *dg__cpu_recipe(const dg_model_config *c, bool *lowbit);

/* An on/off environment variable of the models (DRAGON_PRECOMPILE,
 * DRAGON_KEEP_QR, DRAGON_STACK_PGRADS, DRAGON_RECOMPUTE): 1 when it is
 * "1", 0 when "0", else -1 (unset or anything else: the model decides). */
int dg__env_switch(const char *name);
/* DRAGON_RECOMPUTE: what the step's backward makes again instead of
 * saving (dg__bdh_target): DG__REC_NONE for "0", DG__REC_YS for "ys" (the
 * encoder_v's output alone), DG__REC_ALL for "1" or "all" (xs and ys),
 * else DG__REC_AUTO (unset or anything else: the model decides by the
 * memory it has). */
typedef enum dg__rec_mode { DG__REC_AUTO = -1, DG__REC_NONE, DG__REC_YS, DG__REC_ALL } dg__rec_mode;
dg__rec_mode dg__recompute_env(void);
/* DRAGON_MEMORY: the device memory a model's plan may take, AdamW's
 * moments included — bytes, or a number with K, M, G or T (powers of
 * 1024; "GiB", "GB" and "G" alike), e.g. 4G or 3.5GiB: *bytes, 0 when
 * unset or empty. DG_ERR_INVALID_ARG with why naming the variable and
 * what it holds when it is not a positive size. */
dg_status dg__memory_budget(size_t *bytes, char *why, size_t why_size);
/* The CPU model's execution copies of w's projections into exec[k] (f32,
 * H·N·D each): the encoders (H, N, D), the decoder (D, H·N), each
 * replaced by its recipe's dequantized codes when lowbit. */
/* A float spec of op at heads H, embd D, latent N (cpu_model.c). */
dg_spec dg__cpu_fspec(dg_op op, int H, int D, int N, int in_heads, float thr, bool relu);
dg_status dg__cpu_exec_copies(const dg_model_weights *w, bool lowbit, float *const exec[DG_PROJ__COUNT]);

/* The GPU model's step kernels for (c, b, t) compiled and loaded on dev
 * on a thread of its own, started now (runtime/train/gpu_model.c): what
 * dg_model_create would compile first, done while the caller draws or
 * loads the weights. NULL when DRAGON_PRECOMPILE=0 or no thread could be
 * made (dg_model_create compiles them then). dg__gm_warm_join waits for it
 * and frees it (NULL is fine: 0), giving the seconds it waited; call it
 * before dev is closed. dg__model_create_warmed is dg_model_create_accum
 * after a join: it neither lists nor looks up the step's kernels again. */
typedef struct dg__gm_warm dg__gm_warm;
dg__gm_warm *dg__gm_warm_start(dg_device *dev, const dg_model_config *c, int b, int t);
double dg__gm_warm_join(dg__gm_warm *w);
dg_status dg__model_create_warmed(dg_device *dev, const dg_model_weights *w, int b, int t, int accum,
				  dg_model **out);

/* dg_model_create's seconds by part (0 for a NULL model): the step's
 * kernels compiled at once, the plans built (the nodes prepared: what the
 * compile missed is built there), the arenas allocated, the weights
 * uploaded and converted into their execution copies. */
void dg__gm_create_times(const dg_model *m, double *compile_s, double *plan_s, double *alloc_s, double *upload_s);

/* The plan's memory-for-time choices (dg_train_result's; all false for a
 * NULL model). */
void dg__gm_plan_modes(const dg_model *m, bool *keep_qr, bool *stack_pgrads, bool *recompute, bool *recompute_ys,
		       int *attn_chunk);

/* Decoding from a state on the GPU (gpu_decode.c): a model of w for b
 * rows of one token, each layer's attention state (L·b·H·N·D f32) on the
 * device; dg__model_decode consumes n tokens a row (tokens (b, n), row r
 * at tokens + r·n), restart: every row emptied first, and gives the
 * (b, V) logits after each row's last (as dg_model_logits gives them).
 * Errors: the device's message. The model is destroyed by
 * dg_model_destroy. */
dg_status dg__model_decoder_create(dg_device *dev, const dg_model_weights *w, int b, dg_model **out);
dg_status dg__model_decode(dg_model *m, const int32_t *tokens, int n, bool restart, float *logits);
/* Whether decoder m replays its token's work as one CUDA graph (on, the
 * default: captured at its second token) or runs it op by op (off): the
 * same kernels and addresses, so the same logits bit for bit. */
dg_status dg__model_decode_graph(dg_model *m, bool on);
/* P: the tokens a row decoder m's prompts go by at once (gpu_decode.c),
 * 0 for none (every token one at a time, or not a decoder). */
int dg__model_decode_window(const dg_model *m);

/* Weights of c, every value zero (storage to fill: a checkpoint's, a
 * gradient's), without dg_model_weights_create's random init. */
dg_status dg__model_weights_alloc(const dg_model_config *c, dg_model_weights **out, char *msg,
				  size_t size);

/* Adds w's tensors (the reference's names, F32) and its config's metadata
 * (layers, embd, heads, neurons, vocab, preset: what dg_model_config_read
 * reads) to sw: dg_model_weights_save's file, and a checkpoint's part. */
dg_status dg__model_weights_add(dg_safetensors_writer *sw, const dg_model_weights *w, char *msg,
				size_t size);

/* dg_train_state_create, the state taking *w's arrays instead of a copy
 * (*w NULL after, on success): a 1B-parameter model's 4 GB copy and its
 * page faults were a second or more of the time to a run's first step. */
dg_status dg__train_state_adopt(dg_model_weights **w, uint64_t seed, const dg_adamw_config *opt,
				dg_train_state **out, char *msg, size_t msg_size);

/* The metadata a dragon file of weights says itself with: its seal (the
 * file's SHA-256, runtime/store/safetensors.h) and its kind. Files saved before
 * they were written have neither. */
#define DG__SEAL_KEY "file_sha256"
#define DG__KIND_KEY "kind"
#define DG__KIND_WEIGHTS "weights"       /* dg_model_weights_save */
#define DG__KIND_CHECKPOINT "checkpoint" /* dg_checkpoint_save */
#define DG__KIND_GRADIENTS "gradients"   /* dg_model_grads_save */

/* What every reader of a file of weights checks first (model_file.c):
 * its seal when it has one (else the data_sha256 of a file saved before
 * seals, when it has one), DG_ERR_CORRUPT "<path>: damaged: ..." when the
 * bytes do not hash to it or a file that names its kind has none; its
 * kind, DG_ERR_PARSE for a gradients file or one unknown; and every F32
 * value of its weights (the reference's names) and AdamW moments
 * ("adamw.m.<name>", "adamw.v.<name>"): finite, a second moment >= 0,
 * else DG_ERR_NUMERIC naming the tensor and the first bad index. */
dg_status dg__model_file_check(const dg_safetensors *f, const char *path, char *msg, size_t size);
/* The door of every reader of weights: the file at path (or n bytes,
 * called name) read as safetensors, then dg__model_file_check'ed, into
 * *out (free it with dg_safetensors_destroy; NULL on failure). A file that
 * is not safetensors is DG_ERR_PARSE "<name>: damaged (or not
 * safetensors): <what>"; a missing or unreadable one DG_ERR_NOT_FOUND or
 * DG_ERR_IO. */
dg_status dg__model_file_load(const char *path, dg_safetensors **out, char *msg, size_t size);
dg_status dg__model_file_parse(const void *bytes, size_t n, const char *name, dg_safetensors **out,
			       char *msg, size_t size);

/* dg_model_config_read of a parsed file (path names it in messages); the
 * caller has checked it (dg__model_file_check). */
dg_status dg__model_config_of(const dg_safetensors *f, const char *path, dg_model_config *out,
			      char *msg, size_t size);

/* ---- the model behind dragon/ffi.h ------------------------------------------
 * What the FFI door's model (bind/ffi.c) is made of: the CPU model's step
 * in two calls and the GPU model's buffers by address, for a framework
 * that owns the optimizer and the autograd. */

/*
 * The step in two halves, as a framework's autograd calls them: the
 * forward of batch with every activation kept in a pass, then, later,
 * the backward from it. forward then backward computes what
 * dg_model_cpu_step does, bit for bit. The pass owns copies of what it
 * reads (the masters, the tokens and targets, the config): w and the
 * batch's arrays may go once forward returns; its stop flag is read
 * during the forward only.
 *
 * forward: *loss the loss (0 without targets). batch->targets NULL: the
 * forward up to x_final without the loss (a logits forward), which has
 * no backward. A new pass into *out (destroy it with
 * dg_model_cpu_pass_destroy), NULL on failure.
 * backward: the gradient of every weight into grads (overwritten; w's
 * config); once a pass (DG_ERR_INVALID_ARG saying why a second time or
 * after a forward without targets).
 * hidden: the pass's last hidden state x_final, (B, T, D) f32 (the
 * pass's memory, valid until its backward runs or it is destroyed); *b, *t
 * (may be NULL) its batch's B and T.
 */
typedef struct dg_model_cpu_pass dg_model_cpu_pass;
dg_status dg_model_cpu_forward(const dg_model_weights *w, const dg_model_batch *batch, double *loss,
			       dg_model_cpu_pass **out, char *msg, size_t msg_size);
dg_status dg_model_cpu_backward(dg_model_cpu_pass *p, dg_model_weights *grads, char *msg, size_t msg_size);
const float *dg_model_cpu_pass_hidden(const dg_model_cpu_pass *p, int *b, int *t);
void dg_model_cpu_pass_destroy(dg_model_cpu_pass *p); /* NULL is fine */

/* The backward nodes alone, queued on the calling thread's stream: the
 * backward of the forward dg_model_run or dg_model_run_device (backward
 * false) ran last with batch's seed, step and train, the gradients
 * overwritten. The caller guarantees that nothing ran on m between the
 * two (the activations the backward reads are the arenas' as that
 * forward left them). */
dg_status dg_model_run_backward(dg_model *m, const dg_model_batch *batch);
/* The last hidden state x_final of the last forward, (B, 1, T, D) at the
 * model's (B, T), on the device, in *fmt (the activations': f32 or bf16;
 * may be NULL). Valid until the next run's backward or forward. */
dg_dptr dg_model_hidden_addr(const dg_model *m, dg_fmt *fmt);

/* ---- the model under a framework's optimizer -------------------------------
 * A framework (PyTorch, through dragon/ffi.h) that owns the optimizer
 * aliases the model's own buffers: the f32 masters it updates in place,
 * the gradients a backward writes, the loss. After it has changed the
 * masters, dg_model_sync_copies remakes what the kernels read from them
 * (the layouts, the codes and scales of a low-bit recipe, the bf16
 * decoder copy) on the calling thread's stream. */

/* Param p's master and gradient on the device (f32, the param's shape). */
dg_status dg_model_param_buffers(const dg_model *m, dg_model_param p, dg_dptr *master,
				 dg_dptr *grad);
/* The device float the last run's loss is in, and the int32 flag a token
 * outside the vocabulary sets (dg_model_run_device). */
dg_dptr dg_model_loss_addr(const dg_model *m);
dg_dptr dg_model_bad_addr(const dg_model *m);
/* The execution copies remade from the masters on the device, queued. */
dg_status dg_model_sync_copies(dg_model *m);
/* dg_model_run with the tokens and targets ((b, t) int32) on the device:
 * copied on the stream, not checked on the host (a bad token makes its
 * row harmless and sets the flag at dg_model_bad_addr, which the caller
 * reads when it reads the loss). batch's idx and targets are ignored; its
 * b, t, seed, step and train are used. */
dg_status dg_model_run_device(dg_model *m, const dg_model_batch *batch, dg_dptr idx, dg_dptr targets,
			      bool backward);

/* A bench's measure of the step's tail alone — the gradients' norm, AdamW
 * on every master, the execution copies remade — on the gradients the
 * model holds: reps tails run eagerly between two events, *ms the mean.
 * Each is an update of the masters and moments (not a training step's:
 * call it on a model whose training does not matter). */
dg_status dg_model_optim_time(dg_model *m, int reps, double *ms);

#endif
