/*
 * dragon — the BDH model: its config and recipes, its weights as the
 * reference names them, and its forward and backward.
 *
 * BDH: L layers sharing one set of weights; embd D, heads H, N neurons a
 * head, a vocabulary of V (bytes by default). The letters are the
 * model's (docs/formats.md, "Dimensions").
 *
 *   x = LN(embed[idx])                              (B,1,T,D)
 *   per layer:
 *     xs  = relu(x·encoder − t_x)                   (B,H,T,N)
 *     qr  = RoPE(xs)
 *     att = tril(qr·qrᵀ, −1)·x                       (B,H,T,D)
 *     ys  = relu(LN(att)·encoder_v − t_y)           (B,H,T,N)
 *     xy  = dropout(xs·ys)
 *     y   = LN(xy (B,1,T,H·N)·decoder)              (B,1,T,D)
 *     x   = LN(x + y)
 *   loss = cross_entropy(x·lm_head, targets)
 *
 * Weights, as the reference (pathwaycom/bdh bdh.py) names and shapes them,
 * f32 masters: embed.weight [V, D], encoder [H, D, N], encoder_v [H, D, N],
 * decoder [H·N, D], lm_head [D, V]; init normal(0, 0.02).
 *
 * A recipe says, per projection (encoder, encoder_v, decoder), the weight
 * and activation formats and the granularity of their scales; the
 * presets are f32 (parity), bf16, w8a8 (int8 weights per output channel,
 * int8 activations per token), bitnet (ternary weights, int8 activations
 * per token) and seed (per-tensor absmean scales, kept for comparison).
 */
#ifndef DRAGON_MODEL_H
#define DRAGON_MODEL_H

#include <signal.h> /* sig_atomic_t */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "fmt.h"
#include "optim.h"
#include "runtime.h" /* dg_device */
#include "spec.h"    /* dg_scale_gran */
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dg_save_mode {
	DG_SAVE_DEVICE,    /* saved activations as codes on the device */
	DG_SAVE_HOST,      /* offloaded to host memory */
	DG_SAVE_RECOMPUTE, /* recomputed from each layer's input */
} dg_save_mode;

/* One projection's recipe. */
typedef struct dg_proj_recipe {
	dg_fmt weight;        /* f32 | bf16 | int8 | ternary | sign1 */
	dg_fmt act;           /* f32 | bf16 | int8 | int4 | uint8pos */
	dg_scale_gran wscale; /* tensor | channel */
	dg_scale_gran ascale; /* tensor | token */
	bool absmean;         /* the seed's scales: 2·mean|·|/qmax, not absmax */
} dg_proj_recipe;

/* The model's three projections, in the order dg_model_config holds their
 * recipes: the index of a projection's recipe, of its weight's execution
 * copy and of that copy's gradient. */
typedef enum dg_proj {
	DG_PROJ_ENCODER,   /* xs = relu(x·encoder − t_x), encoder [H, D, N] */
	DG_PROJ_ENCODER_V, /* ys = relu(LN(att)·encoder_v − t_y), encoder_v [H, D, N] */
	DG_PROJ_DECODER,   /* y = LN(xy·decoder), decoder [H·N, D] */
	DG_PROJ__COUNT
} dg_proj;

typedef struct dg_model_config {
	int layers;     /* 6 */
	int embd;       /* D: 256 */
	int heads;      /* H: 4 */
	int neurons;    /* N a head: 8192 */
	int vocab;      /* 256 (bytes) */
	float dropout;  /* 0.1 */
	float thr_x;    /* the ReLU thresholds: 0 */
	float thr_y;
	float ln_eps;   /* 1e-5, PyTorch's */
	dg_proj_recipe encoder, encoder_v, decoder;
	dg_save_mode save;
	dg_fmt precision; /* everything else: f32 | bf16 */
	char preset[16];  /* the preset it came from, "" if none */
} dg_model_config;

/* The 25M defaults with preset `name` (f32, bf16, w8a8, bitnet, seed).
 * DG_ERR_INVALID_ARG with the list of presets when the name is unknown. */
DG_API dg_status dg_model_preset(const char *name, dg_model_config *out, char *msg, size_t msg_size);

/* The shapes a config may take: layers 1..256, heads 1..64, embd a
 * multiple of 4 up to 65536 (the GPU's kernels then plan their tiles and
 * refuse, by field, a width they cannot serve: a layer norm's row, for
 * one), neurons a multiple of 4 up to DG_MODEL_MAX_NEURONS a head, H·N up
 * to DG_MODEL_MAX_HN, vocab 2..DG_MODEL_MAX_VOCAB. */
#define DG_MODEL_MAX_NEURONS 65536
#define DG_MODEL_MAX_HN (1 << 20)
#define DG_MODEL_MAX_VOCAB 65536

/* Checks a config: sizes, formats, granularities; one line naming the
 * field on failure ("neurons=100: must be a multiple of 4 ..."). */
DG_API dg_status dg_model_config_check(const dg_model_config *c, char *msg, size_t msg_size);

/* ---- weights ------------------------------------------------------------- */

/* The weights' names and shapes of a config, in a fixed order. */
#define DG_MODEL_N_PARAMS 5
typedef enum dg_model_param {
	DG_PARAM_EMBED,     /* "embed.weight" [V, D] */
	DG_PARAM_ENCODER,   /* "encoder"      [H, D, N] */
	DG_PARAM_ENCODER_V, /* "encoder_v"    [H, D, N] */
	DG_PARAM_DECODER,   /* "decoder"      [H·N, D] */
	DG_PARAM_LM_HEAD,   /* "lm_head"      [D, V] */
} dg_model_param;

DG_API const char *dg_model_param_name(dg_model_param p);
/* The param's shape (ndim, up to 3 extents); returns its element count. */
DG_API int64_t dg_model_param_shape(const dg_model_config *c, dg_model_param p, int *ndim,
				    int64_t shape[3]);

/* A model's f32 master weights on the host (a CPU model, or the staging of
 * a GPU one): params[p] holds dg_model_param_shape(c, p) floats. */
typedef struct dg_model_weights {
	dg_model_config config;
	float *params[DG_MODEL_N_PARAMS];
} dg_model_weights;

/* Weights of c, initialized as the reference: normal(0, 0.02) from seed. */
DG_API dg_status dg_model_weights_create(const dg_model_config *c, uint64_t seed,
					 dg_model_weights **out, char *msg, size_t msg_size);
DG_API void dg_model_weights_destroy(dg_model_weights *w); /* NULL is fine */
/* Reads the weights of c from a safetensors file (the reference's names,
 * shapes, F32) after dg_model_file_check's checks; a missing, misnamed or
 * misshapen tensor is refused by name. Writes them likewise (atomically),
 * with the config as metadata, "kind": "weights" and the file's seal
 * ("file_sha256": the SHA-256 of the whole file, docs/formats.md). */
DG_API dg_status dg_model_weights_load(const dg_model_config *c, const char *path,
				       dg_model_weights **out, char *msg, size_t msg_size);
DG_API dg_status dg_model_weights_save(const dg_model_weights *w, const char *path, char *msg,
				       size_t msg_size);
/* Writes gradients g (a weights' names and shapes) as dg_model_weights_save
 * does, but of "kind": "gradients", which no reader of weights takes. */
DG_API dg_status dg_model_grads_save(const dg_model_weights *g, const char *path, char *msg,
				     size_t msg_size);
/*
 * What every reader of weights (the functions here, dg_checkpoint_load,
 * the Python package's load_checkpoint) checks of a file before it uses a
 * value of it, on size bytes of it (name says it in messages):
 *   - a sealed file (metadata file_sha256, what dragon writes) hashes to
 *     its seal, and a file that names its kind is sealed; a file without a
 *     seal (saved before seals, or by another program) hashes to its
 *     data_sha256 when it has one: else DG_ERR_CORRUPT,
 *     "<name>: damaged: ...", saying how to go on;
 *   - it is not a gradients file (metadata kind: gradients) or of a kind
 *     unknown: DG_ERR_PARSE naming what it is;
 *   - every value of its F32 weights (the reference's names) and AdamW
 *     moments (adamw.m.<name>, adamw.v.<name>) is finite, and a second
 *     moment not negative: else DG_ERR_NUMERIC naming the tensor and the
 *     first bad index ("lm_head[17] is nan").
 * A file that is not safetensors (cut, or its header damaged) is
 * DG_ERR_PARSE, "<name>: damaged (or not safetensors): ..." naming the
 * field the reader refused.
 */
DG_API dg_status dg_model_file_check(const void *bytes, size_t size, const char *name, char *msg,
				     size_t msg_size);
/*
 * The config a weights file was saved with (dg_model_weights_save's
 * metadata): the recipe of its "preset" (f32 when it has none), then its
 * ints layers, embd, heads, neurons and vocab (vocab 256 when absent).
 * A file without layers, embd, heads and neurons in its metadata (one
 * PyTorch wrote, say) is DG_ERR_NOT_FOUND naming what is missing; a
 * value that is not an integer, or a config dg_model_config_check
 * refuses, DG_ERR_PARSE naming the key. Reads the whole file and checks
 * it first as dg_model_file_check does.
 */
DG_API dg_status dg_model_config_read(const char *path, dg_model_config *out, char *msg,
				      size_t msg_size);

/* ---- memory ----------------------------------------------------------------
 * What a step at (B, T) holds, by bucket, from its tape's plan, before
 * anything is allocated: each bucket's buffers counted once, and the
 * activation arena as planned (saved activations, temporaries and
 * workspaces share it, buffers whose lifetimes do not overlap reusing the
 * same bytes). */
typedef struct dg_model_memory {
	size_t params;      /* f32 master weights */
	size_t lowbit;      /* the copies the kernels read (codes, scales, layouts) */
	size_t grads;       /* parameter gradients */
	size_t saved;       /* activations the backward reads (no reuse) */
	size_t temp;        /* activation gradients and scratch (no reuse) */
	size_t workspace;   /* the ops' workspaces (no reuse) */
	size_t activations; /* the planned arena of the three above */
	size_t total;       /* params + lowbit + grads + activations */
} dg_model_memory;

/* The plan of the CPU model's step (dg_model_cpu_step) at (B, T). */
DG_API dg_status dg_model_cpu_memory(const dg_model_config *c, int b, int t, dg_model_memory *out,
				     char *msg, size_t msg_size);

/*
 * Whether the CPU model's training step at (B, T) fits in this machine's
 * memory, before anything is allocated: its peak — the plan's total
 * (dg_model_cpu_memory), the scratch its ops allocate beside the arenas
 * (the largest, the attention backward's (T, T) f64 scores) and `copies`
 * more f32 copies of the weights the caller holds (a trainer: masters,
 * two moments, gradients, the init) — against the memory available:
 * $DRAGON_CPU_MEMORY bytes when set, else the kernel's MemAvailable, or
 * the cgroup's room when that is less. DG_ERR_NOMEM naming the estimate,
 * its largest part, what is available and the fix (a smaller --batch,
 * --time or --neurons); DG_ERR_INVALID_ARG for a config or batch
 * dg_model_cpu_memory refuses. *need (may be NULL): the estimate, bytes
 * (SIZE_MAX past what a size_t counts).
 */
DG_API dg_status dg_model_cpu_fits(const dg_model_config *c, int b, int t, int copies, size_t *need,
				   char *msg, size_t msg_size);

/* ---- work -------------------------------------------------------------------
 * The FLOPs a token of a training step costs at block size t: the
 * matmuls of the forward, counted as 2 a multiply-add, and the backward
 * as twice the forward (each matmul's input and weight gradients):
 *
 *   forward = L · ( 2·D·H·N        encoder      x·encoder
 *                 + 2·D·H·N        encoder_v    LN(att)·encoder_v
 *                 + 2·H·N·D        decoder      xy·decoder
 *                 + 2·H·N·(t−1)/2  scores       qr·qrᵀ, the strict lower
 *                                               triangle: (t−1)/2 keys a
 *                                               query on average
 *                 + 2·H·D·(t−1)/2  scores·x )
 *           + 2·D·V                lm_head
 *   a token = 3 · forward
 *
 * The embedding's lookup, the norms, ReLUs, RoPE, dropout and the loss
 * are left out (no matmul; a few percent at most). Times tokens a second
 * it is the FLOP/s a run achieves, over the device's peak its MFU. The
 * recipe does not change the count: a low-bit matmul does the same work.
 * t < 1 counts as 1 (no attention). */
DG_API double dg_model_flops_per_token(const dg_model_config *c, int t);

/* ---- the model on the CPU -------------------------------------------------
 * The whole forward and backward on the CPU references (dragon/ref.h):
 * what the GPU model is checked against, and a model CI can run at tiny
 * sizes. Recipes: f32, and w8a8 and bitnet fake-quantized (dg_model_cpu_runs). */

typedef struct dg_model_batch {
	const int32_t *idx;     /* (B, T) tokens */
	const int32_t *targets; /* (B, T) next tokens */
	int b, t;
	uint64_t seed;          /* dropout */
	uint32_t step;
	bool train;             /* dropout on */
	/* data parallel: the batch's first row in the global batch (0
	 * alone). The dropout of element i of a (B,H,T,N) activation is drawn
	 * as element i + row0·H·T·N of the global batch's, so N ranks running
	 * rows row0 .. row0 + b − 1 each draw the masks of one process
	 * running it all. */
	uint32_t row0;
	/* NULL, or a flag the CPU model looks at between the step's ops:
	 * once set, dg_model_cpu_step returns DG_ERR_INTERRUPTED with nothing
	 * written to grads that the caller may use (the GPU model ignores it) */
	const volatile sig_atomic_t *stop;
	/* gradient accumulation (a model of dg_model_create_accum, K > 1):
	 * which micro-batch of the training step this is, 0..K−1, in order
	 * (dg_model_train_step); 0 otherwise */
	int micro;
} dg_model_batch;

/*
 * The loss of batch, and (grads non-NULL) the gradient of every weight
 * into grads->params (overwritten; grads must have w's config). A token
 * or target outside the vocabulary is DG_ERR_INVALID_ARG naming its
 * position, before anything is computed.
 */
/* Whether the CPU model runs c's recipe: f32, or integer weights and
 * activations a scale a token (w8a8, bitnet: fake-quantized with the GPU's
 * quantizers, dequantized f32, straight-through gradients); not bf16 or
 * the per-tensor seed recipe. */
DG_API bool dg_model_cpu_runs(const dg_model_config *c);

DG_API dg_status dg_model_cpu_step(const dg_model_weights *w, const dg_model_batch *batch,
				   double *loss, dg_model_weights *grads, char *msg, size_t msg_size);

/*
 * The logits of position pos of every row: the forward alone, dropout off
 * whatever batch->train says, then the last hidden state at pos times
 * lm_head (summed in double, as the loss sums them) into out, (B, V) f32,
 * row b at out + b·V. log_softmax(out)[targets] averaged over every
 * position is the step's loss. batch->targets may be NULL (none is read).
 * The model is causal: a position's logits depend on the tokens at and
 * before it only, so a context shorter than T may be padded after pos
 * with any tokens. pos outside 0..T−1 is DG_ERR_INVALID_ARG.
 */
DG_API dg_status dg_model_cpu_logits(const dg_model_weights *w, const dg_model_batch *batch, int pos,
				     float *out, char *msg, size_t msg_size);

/* ---- decoding from a state --------------------------------------------------
 * With no softmax, BDH's attention is linear attention (Q = K = qr, V =
 * x): o_t = qr_t·S_{t−1}, S_t = S_{t−1} + qr_tᵀ x_t, RoPE a rotation at
 * the token's own position. A decoder state holds, for each of its batch
 * rows (one sequence a row), every layer's S (H × N × D f32 a layer: 201
 * MB a row at 25M) and the row's position (the tokens it has consumed): a
 * prompt is consumed once and each next token then costs the same
 * whatever the context's length, with no window. The logits equal the
 * full forward's over the whole context (dg_model_cpu_logits,
 * dg_model_logits; dropout off) up to the rounding of the f32 state and
 * of the two forms' sums. */
typedef struct dg_model_state dg_model_state;

/* A decoder of w for batch rows, every row empty (position 0): on dev
 * (its state on the device, w's weights uploaded now; the recipes of
 * dg_model_create), or on the CPU (dev NULL: the recipes of
 * dg_model_cpu_runs, w's weights read at each call, so w must outlive the
 * state). Errors name what and why in msg (the device's message too). */
DG_API dg_status dg_model_state_create(dg_device *dev, const dg_model_weights *w, int batch,
				       dg_model_state **out, char *msg, size_t msg_size);
DG_API void dg_model_state_destroy(dg_model_state *s); /* NULL is fine */
/*
 * Consumes n tokens (n >= 1) and gives the logits after the last. row −1:
 * every row, tokens (rows, n) (row r at tokens + r·n), logits (rows, V)
 * (row r at logits + r·V); row r alone (the CPU decoder only): tokens (n),
 * logits (V). restart: the rows emptied first (a new prompt); else the
 * tokens follow what the rows hold (each row at its own position). The
 * CPU decoder takes a prompt in chunks. A token outside the vocabulary is
 * DG_ERR_INVALID_ARG naming its index, before the state changes. On a
 * device a token is one small upload (positions and tokens) and one CUDA
 * graph replay (captured at the state's second token), its logits made on
 * the device — dg_model_logits's host double sums bit for bit — and read
 * back once, after the last.
 */
DG_API dg_status dg_model_decode(dg_model_state *s, int row, const int32_t *tokens, int n, bool restart,
				 float *logits, char *msg, size_t msg_size);

/* ---- the model on the GPU -------------------------------------------------
 * The same tape as the CPU model, run by the GPU ops on arenas planned once
 * for batches of (b, t): every buffer, copy and workspace is allocated by
 * dg_model_create and nothing after, so the pointers are the same every
 * step. The masters stay f32; the execution copies (the layouts and, for
 * a low-bit recipe, the codes and scales the kernels read) are made from
 * them by dg_model_set_weights. Recipes: float (f32, bf16), and the
 * low-bit ones with activations a scale a token (w8a8, bitnet). */
typedef struct dg_model dg_model;

/* What a model of c at (b, t) on dev would allocate, by bucket, without
 * allocating it (the ops' workspaces are the device's tiles'). A plan
 * larger than the device's free memory even without the workspaces is
 * reported without them (no kernel is prepared for a step that cannot
 * run). */
DG_API dg_status dg_model_plan(dg_device *dev, const dg_model_config *c, int b, int t,
			       dg_model_memory *out);
/* A model of w's config on dev for batches of (b, t), w's weights
 * uploaded. Errors: the device's message (dg_device_errmsg). */
DG_API dg_status dg_model_create(dg_device *dev, const dg_model_weights *w, int b, int t,
				 dg_model **out);
/* As dg_model_create, for steps of accum micro-batches of (b, t) each
 * (dg_model_train_step with batch->micro; accum 1: dg_model_create): the projections'
 * execution-layout weight gradients then live in the gradients' arena,
 * summed from micro-batch to micro-batch, instead of the step's
 * temporaries. accum 1..1024. */
DG_API dg_status dg_model_create_accum(dg_device *dev, const dg_model_weights *w, int b, int t, int accum,
				       dg_model **out);
DG_API void dg_model_destroy(dg_model *m); /* NULL is fine */
/* Uploads w (the model's config) and remakes the execution copies. */
DG_API dg_status dg_model_set_weights(dg_model *m, const dg_model_weights *w);
DG_API void dg_model_memory_of(const dg_model *m, dg_model_memory *out);
/* As dg_model_cpu_step, on the GPU: batch must be (b, t); grads (host,
 * the model's config) NULL for the loss alone. Synchronizes (it returns
 * the loss). */
DG_API dg_status dg_model_step(dg_model *m, const dg_model_batch *batch, double *loss,
			       dg_model_weights *grads);
/* As dg_model_cpu_logits, on the GPU: batch must be (b, t). The forward
 * nodes run on the device; x_final's rows at pos (bf16 ones converted
 * exactly) and lm_head's f32 master are read back and multiplied on the
 * host in double. Synchronizes. */
DG_API dg_status dg_model_logits(dg_model *m, const dg_model_batch *batch, int pos, float *out);
/* Where a step's time goes: one step (forward and backward) with each node
 * timed alone (events around it, the stream drained between nodes), the
 * times summed by what the nodes do ("projection", "attention bwd", ...),
 * in the order they first run; at most cap rows into out, *n how many. */
typedef struct dg_model_time {
	const char *what;
	int count;   /* nodes of that kind in the step */
	double ms;   /* their time together */
} dg_model_time;
DG_API dg_status dg_model_profile(dg_model *m, const dg_model_batch *batch, dg_model_time *out, int cap,
				  int *n);

/* The step's nodes alone, queued on the calling thread's stream: the
 * batch uploaded, the forward and (backward) the backward; no wait, no
 * read-back (what a bench times and a training loop builds on). */
DG_API dg_status dg_model_run(dg_model *m, const dg_model_batch *batch, bool backward);

/* ---- training on the GPU ----------------------------------------------------
 * AdamW beside the model (dragon/optim.h): its moments on the device, the
 * step's scalars in a control block on the device (dg_adamw_ctl), one
 * step = forward, backward, the gradients' global norm and clip factor,
 * the update of every master (all are matrices: each decays) and the
 * execution copies remade from them, all on the device, nothing read
 * back but the loss and the norm. With graph, the second step captures
 * the first's work into a CUDA graph and every step after replays it:
 * the host copies the batch and the control block in (two small copies)
 * and launches one graph. Every replay first checks that the buffers the
 * graph was captured with are the model's (a capture is redone if not).
 * The losses and norms come back asynchronously into page-locked memory,
 * a ring of DG_MODEL_TRAIN_RING steps. */
#define DG_MODEL_TRAIN_RING 8

/* Attaches AdamW c to m: its moments allocated on the device, zeros or
 * (m1, v1 non-NULL: a resumed run's) the host's, one array a param in
 * dg_model_param order. graph: capture the step (see above). ls: the
 * loss scaler (dragon/optim.h dg_loss_scaler: its mode, interval and
 * state, a fresh one's or a resumed run's), or NULL for none; its state
 * then lives on the device, updated by each step. Again on a model that
 * has them: the moments, c and the scaler replaced (the graph kept unless
 * the scaler is turned on or off). */
DG_API dg_status dg_model_optim_init(dg_model *m, const dg_adamw_config *c, float *const *m1,
				     float *const *v1, bool graph, const dg_loss_scaler *ls);
/* Data parallel (dragon/train.h dg_train_world): each step's gradients
 * and loss averaged over comm's ranks (NCCL all-reduce, captured with the
 * step) before the norm; NULL: alone. */
struct dg_comm;
DG_API dg_status dg_model_optim_comm(dg_model *m, struct dg_comm *comm);
/* Queues training step t (0-based) of batch (b, t as planned; its seed is
 * the dropout's, its step ignored: t is) at learning rate lr, on the
 * calling thread's stream; returns without waiting.
 *
 * Gradient accumulation (a model of dg_model_create_accum with K > 1):
 * batch->micro = i (0..K−1, in order, each with the same t and lr) queues
 * micro-batch i of training step t. Each runs the forward and the backward
 * of its (b, t) batch with the loss's gradient times 1/K, micro-batch 0
 * writing the weight gradients and the others adding to them; the last one
 * then runs the norm, the update and the copies, so the step is the one of
 * a batch of the K micro-batches' rows up to the sums' order (give
 * micro-batch i the row0 of its rows in that batch for the same dropout
 * masks). The reported loss is the mean of the K losses. Each micro-batch
 * index replays its own captured graph (the dropout's first element is
 * baked into it). With the loss scaler on, K must be 1
 * (DG_ERR_UNSUPPORTED: the loss's gradient is S, not S/K). */
DG_API dg_status dg_model_train_step(dg_model *m, const dg_model_batch *batch, int64_t t, float lr);
/* The loss and the gradient norm (unscaled) of queued step t (one of the
 * last DG_MODEL_TRAIN_RING), waiting for that step only; *skipped (may be
 * NULL): the update was skipped because the norm is not finite; *ls (may
 * be NULL): the loss scaler after step t (its scale the next step's; S 1
 * and mode off without one). */
DG_API dg_status dg_model_train_result(dg_model *m, int64_t t, double *loss, double *norm, bool *skipped,
				       dg_loss_scaler *ls);
/* The masters into w and the moments into m1, v1 (host arrays of each
 * param's size; either may be NULL), waiting for the queued steps. */
DG_API dg_status dg_model_optim_get(dg_model *m, dg_model_weights *w, float *const *m1, float *const *v1);
/* Whether the model's steps replay a captured graph now. */
DG_API bool dg_model_graph_live(const dg_model *m);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_MODEL_H */
