/*
 * dragon — a flat door for foreign callers (Python's ctypes, Julia's
 * ccall, ...): every op of the op table through one call, and the BDH
 * model with its weights and gradients where a framework can alias them.
 *
 * Nothing here has a layout a caller must guess: tensors and options are
 * plain structs of fixed-size fields (dg_ffi_tensor, dg_ffi_opts, no
 * enums, no bools), specs and models are opaque handles, and a version
 * number says which layout this is (dg_ffi_version). The op door is the
 * one every typed op of dragon/ops.h is turned into: an op's tensors in
 * the op table's order (dg_ffi_op_args lists them, with the formats and
 * shapes the spec gives them at a call's B, T or R, so a caller allocates
 * outputs from it), its scalars in dg_ffi_opts, the checks and messages
 * the typed ops have. Work goes to the calling thread's stream
 * (dg_device_set_stream: PyTorch's current stream, say). A caller that
 * runs an op again and again with tensors of one shape prepares it once
 * (dg_ffi_op_prepare) and launches the handle (dg_ffi_prepared_run): the
 * checks, the kernel lookup and the launches' layout are then done once,
 * a launch only compares the call's tensors with the prepared ones.
 *
 * The model: dg_ffi_model is a BDH model of a preset at a batch shape, on
 * a device or (dev NULL) the CPU model. Its f32 masters and gradients are
 * its own memory, handed out by address (device addresses on the GPU,
 * host pointers on the CPU) for a framework to wrap without a copy
 * (DLPack): the framework's optimizer updates the masters in place, and
 * the next run remakes the execution copies (codes, scales, layouts)
 * from them before its forward.
 */
#ifndef DRAGON_FFI_H
#define DRAGON_FFI_H

#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "model.h"
#include "ops.h"
#include "runtime.h"
#include "spec.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The layout of the structs and calls below; a caller checks it at load
 * (2: dg_ffi_opts's elem0 at its end; 3: the model's forward and backward
 * as two calls, dg_ffi_model_forward, dg_ffi_model_backward,
 * dg_ffi_model_hidden; dg_corpus's token corpora, and dg_ffi_model_logits;
 * 4: bundles, dg_ffi_bundle_build, dg_ffi_bundle_default_specs,
 * dg_ffi_bundle_check;
 * 5: dg_ffi_spec_destroy, dg_corpus_close, in place of dg_ffi_spec_free,
 * dg_corpus_destroy;
 * 6: prepared ops, dg_ffi_op_prepare and dg_ffi_prepared_run, a prepared
 * op's dg_prepared_workspace in place of dg_ffi_op_workspace, and of
 * dg_ffi_op_run: a prepare, its launches, a destroy;
 * dg_ffi_model_decode). */
#define DG_FFI_VERSION 6
DG_API int dg_ffi_version(void);

/* A tensor: dg_tensor with fixed-size fields. fmt is a dg_fmt value
 * (dg_fmt_from_name gives it), stride in elements (all 0: contiguous),
 * name for messages (may be NULL: the op table's name is used). */
typedef struct dg_ffi_tensor {
	const char *name;
	int32_t fmt;
	int32_t ndim;
	int64_t shape[4];
	int64_t stride[4];
	uint64_t data;
	uint64_t scale;
} dg_ffi_tensor;

/* The non-tensor arguments of an op call (dragon/ops.h names what each op
 * reads; zero is every default). */
typedef struct dg_ffi_opts {
	uint64_t ws, ws_bytes;   /* workspace (dg_prepared_workspace sizes it) */
	uint64_t absum;          /* lowrank_fwd: += Σ|y| into this float, or 0 */
	uint64_t bad;            /* embed_fwd, lmhead_ce: int32 flag, or 0 */
	uint64_t grad_scale;     /* lmhead_ce: device float dlogits are scaled by, or 0 */
	uint64_t step_at;        /* gate ops: device uint32 added to step, or 0 */
	uint64_t ctl, copy;      /* adamw_update: control block, bf16 copy of p */
	uint64_t seed;           /* gate ops: dropout seed */
	float eps;               /* layernorm_fwd, resid_ln_fwd */
	float p;                 /* gate ops: dropout probability */
	uint32_t step, layer;    /* gate ops */
	int32_t splits;          /* lowrank_grad_input: 0 the runtime's choice */
	int32_t accumulate;      /* grad_weight ops, embed_bwd, the norms' bwd, lmhead_ce */
	int32_t unpack;          /* pack ops: packed → codes */
	int32_t backward;        /* lmhead_ce: dx and dw too */
	int32_t decay;           /* adamw_update */
	int32_t reserved;
	uint64_t elem0;          /* gate ops: added to each element's index before
				  * its draw (a rank's row0·H·T·L), or 0 */
} dg_ffi_opts;

/* ---- specs ------------------------------------------------------------------ */

/* Parses spec text (dg_spec_parse's rules, the op's defaults for what is
 * left out) into a new handle; destroy it with dg_ffi_spec_destroy. */
DG_API dg_status dg_ffi_spec_parse(const char *text, dg_spec **out, char *msg, size_t msg_size);
DG_API void dg_ffi_spec_destroy(dg_spec *s); /* NULL is fine */
/* The canonical text (DG_SPEC_TEXT_MAX is always enough). */
DG_API dg_status dg_ffi_spec_text(const dg_spec *s, char *buf, size_t size);

/* The template's plan of s on a device of SM device_sm (90 for an H200;
 * 0: the spec's own arch), as the runtime asks it before compiling: the
 * path ("wgmma", "mma.sync", "simt", ...) into path, the canonical text
 * with the tile resolved into canonical (either may be NULL). A spec the
 * template refuses is DG_ERR_INVALID_SPEC with its one line. No device
 * needed. */
DG_API dg_status dg_ffi_spec_plan(const dg_spec *s, int32_t device_sm, char *path, size_t path_size,
				  char *canonical, size_t canonical_size, char *msg, size_t msg_size);

/* Compiles the kernel of s's plan on a device of SM device_sm with NVRTC
 * into the JIT's disk cache (what the first launch on such a device would
 * compile when no tuning record names another tile); no device needed.
 * *cache_hit (may be NULL): it was there already. A compile error is
 * DG_ERR_COMPILE with the start of NVRTC's log. */
DG_API dg_status dg_ffi_spec_compile(const dg_spec *s, int32_t device_sm, int32_t *cache_hit, char *msg,
				     size_t msg_size);

/* ---- ops --------------------------------------------------------------------- */

/*
 * The tensors a call of s's op takes, in the op table's order, those the
 * spec's epilogue uses only (dg_op_arg_used): into out[] (at most
 * DG_OP_MAX_ARGS), *n how many; output[i] 1 for the ones the op writes
 * (an in-place one included), optional[i] 1 for those a call may leave
 * out. Each gets its name, format and shape with B, T and R (the call's
 * sizes) filled in; an argument of any shape (the quantizers') has ndim
 * 0. data and scale are 0. B, T or R below 1 where the op has them is
 * DG_ERR_INVALID_ARG.
 */
DG_API dg_status dg_ffi_op_args(const dg_spec *s, int64_t b, int64_t t, int64_t r, dg_ffi_tensor *out,
				int32_t *output, int32_t *optional, int32_t *n, char *msg, size_t msg_size);

/* The checks of a call without a device: the tensors (n of them, in
 * dg_ffi_op_args's order; data 0 where an optional one is left out)
 * against the spec, one line naming the tensor on failure. */
DG_API dg_status dg_ffi_op_check(const dg_spec *s, const dg_ffi_tensor *t, int32_t n,
				 const dg_ffi_opts *o, char *msg, size_t msg_size);
/*
 * A prepared op (dragon/ops.h's dg_prepared) from a call's tensors and
 * options (dg_ffi_op_check's): the whole check (one line naming
 * the tensor), the kernels fetched, the launches laid out, into *out.
 * Data pointers need only pass the checks: a launch gives its own. Its
 * workspace is dg_prepared_workspace(*out) bytes; dg_prepared_destroy
 * frees it. It holds no device memory, and may be launched from any
 * thread while dev is open. Failures are in msg and on dev; a call that
 * is right but has no device to run on is the device's failure
 * (DG_ERR_NO_DEVICE, ...), a wrong one is refused first
 * (DG_ERR_INVALID_ARG, DG_ERR_INVALID_SPEC), device or not.
 */
DG_API dg_status dg_ffi_op_prepare(dg_device *dev, const dg_spec *s, const dg_ffi_tensor *t, int32_t n,
				   const dg_ffi_opts *o, dg_prepared **out, char *msg, size_t msg_size);
/*
 * Launches prepared op p on the calling thread's stream with this call's
 * tensors (n of them, dg_ffi_op_args's order) and options: each tensor
 * must have the prepared one's format and shape (contiguous), its data
 * and scale pointers are checked, the workspace against
 * dg_prepared_workspace, opts' splits, unpack and backward against the
 * prepared ones; the other scalars and optional pointers are this call's.
 * Nothing else is checked or looked up. A mismatch is DG_ERR_INVALID_ARG
 * naming the tensor (prepare again for another shape); failures are in
 * msg and on the device.
 */
DG_API dg_status dg_ffi_prepared_run(const dg_prepared *p, const dg_ffi_tensor *t, int32_t n,
				     const dg_ffi_opts *o, char *msg, size_t msg_size);

/* ---- the model ------------------------------------------------------------------ */

typedef struct dg_ffi_model dg_ffi_model;

/* The sizes of a model; 0 keeps the preset's. */
typedef struct dg_ffi_model_sizes {
	int32_t layers, embd, heads, neurons, vocab;
	float dropout; /* < 0 keeps the preset's */
} dg_ffi_model_sizes;

/*
 * A BDH model of `preset` (dg_model_preset) with sizes (NULL: the 25M
 * ones), weights initialized from seed as the reference does, for
 * batches of (b, t): on dev, or on the CPU (dev NULL; the recipes
 * dg_model_cpu_runs takes).
 */
DG_API dg_status dg_ffi_model_create(dg_device *dev, const char *preset, const dg_ffi_model_sizes *sizes,
				     int32_t b, int32_t t, uint64_t seed, dg_ffi_model **out, char *msg,
				     size_t msg_size);
DG_API void dg_ffi_model_destroy(dg_ffi_model *m); /* NULL is fine */
/* The config (its preset, recipe and sizes). */
DG_API const dg_model_config *dg_ffi_model_config(const dg_ffi_model *m);

/* Param p (dg_model_param order): its reference name, shape, and the
 * addresses of its f32 master and gradient (device addresses on a GPU
 * model, host pointers on the CPU one). */
DG_API dg_status dg_ffi_model_param(const dg_ffi_model *m, int32_t p, const char **name, int32_t *ndim,
				    int64_t shape[3], uint64_t *master, uint64_t *grad);
/* Where the last run's loss (one f32) is: a device address, or a host
 * pointer on the CPU model. */
DG_API uint64_t dg_ffi_model_loss(const dg_ffi_model *m);

/*
 * One forward (backward: and backward, the gradients overwritten) of a
 * batch of the model's (b, t): the execution copies remade from the
 * masters first (they may have changed), then the nodes queued on the
 * calling thread's stream (the CPU model runs it before returning).
 * idx, targets: (b, t) int32 tokens on the host (checked there against
 * the vocabulary) or, tokens_on_device 1, device addresses (copied on
 * the stream; a token outside the vocabulary then makes its row harmless
 * and sets the flag at dg_ffi_model_bad). seed, step: the dropout's;
 * train 0 turns it off.
 */
DG_API dg_status dg_ffi_model_run(dg_ffi_model *m, uint64_t idx, uint64_t targets, int32_t tokens_on_device,
				  uint64_t seed, uint32_t step, int32_t train, int32_t backward, char *msg,
				  size_t msg_size);
/* A GPU model's int32 flag a device-side run sets on a bad token (0 on
 * the CPU model). */
DG_API uint64_t dg_ffi_model_bad(const dg_ffi_model *m);

/*
 * The forward alone of a batch of (b, t), its activations kept for
 * dg_ffi_model_backward: what dg_ffi_model_run does before its backward,
 * the loss at dg_ffi_model_loss. The CPU model runs any (b, t); a GPU
 * model the (b, t) it was made for (a caller with a smaller batch pads
 * it: a target outside the vocabulary, on the device, adds nothing to
 * the loss or to a gradient but counts in the mean's rows, and sets the
 * flag at dg_ffi_model_bad). targets 0: no loss, the forward up to the
 * last hidden state (for the logits; the CPU model only, which then
 * leaves the loss out; it has no backward).
 */
DG_API dg_status dg_ffi_model_forward(dg_ffi_model *m, uint64_t idx, uint64_t targets, int32_t b, int32_t t,
				      int32_t tokens_on_device, uint64_t seed, uint32_t step, int32_t train,
				      char *msg, size_t msg_size);
/*
 * The backward of the last forward (dg_ffi_model_forward), queued on the
 * calling thread's stream: the gradients overwritten. Once a forward:
 * DG_ERR_INVALID_ARG saying why when there is none to run (no forward,
 * its backward run already, a forward without targets, or a
 * dg_ffi_model_run since).
 */
DG_API dg_status dg_ffi_model_backward(dg_ffi_model *m, char *msg, size_t msg_size);
/*
 * The last forward's last hidden state x_final: its address (a device
 * address on a GPU model, a host pointer on the CPU one), format (dg_fmt:
 * f32, or bf16 for a GPU model of a bf16 or low-bit recipe) and shape
 * (b, t, D) at the forward's (b, t) (the GPU model's own). Valid until
 * the next forward, run or backward. DG_ERR_INVALID_ARG when no forward
 * ran.
 */
DG_API dg_status dg_ffi_model_hidden(const dg_ffi_model *m, uint64_t *addr, int32_t *fmt, int64_t shape[3]);
/*
 * The logits at position pos of every row of a batch of the model's
 * (b, t): idx, (b, t) int32 tokens on the host, each checked against the
 * vocabulary; out, (b, V) f32 on the host, row r at out + r·V. The forward
 * alone, dropout off, from the masters as they are now (a GPU model's
 * execution copies remade first); synchronizes (dg_model_cpu_logits,
 * dg_model_logits). The model is causal: a row's logits at pos depend on
 * its tokens 0..pos only.
 */
DG_API dg_status dg_ffi_model_logits(dg_ffi_model *m, uint64_t idx, int32_t pos, uint64_t out, char *msg,
				     size_t msg_size);

/*
 * Decoding from a state (dragon/model.h dg_model_state, dg_model_decode):
 * the context is every token so far, no window, and a token costs the
 * same at any position. restart 1: a decoder of `rows` rows (on the
 * model's device: made from its masters as they are now, read back; on
 * the CPU: reading them), row r started with its n tokens, tokens + r·n
 * ((rows, n) int32 on the host); restart 0: one more token a row (n 1,
 * tokens (rows)) to the decoder made last. out: (rows, V) f32 on the
 * host, the logits after each row's last token, row r at out + r·V.
 * DG_ERR_INVALID_ARG naming what is wrong (a token outside the
 * vocabulary, no decoder to continue).
 */
DG_API dg_status dg_ffi_model_decode(dg_ffi_model *m, uint64_t tokens, int32_t rows, int32_t n,
				     int32_t restart, uint64_t out, char *msg, size_t msg_size);

/* ---- bundles ------------------------------------------------------------------- */

/* What a build made, or where it failed (dg_bundle_summary). */
typedef struct dg_ffi_bundle_summary {
	int64_t specs, dropped, kernels, cache_hits;
	double wall_ms;
	int32_t jobs, sm;
	int32_t step;     /* a dg_bundle_step: 0 when nothing failed */
	int32_t reserved;
	char device[128]; /* the device the bundle is for; "" none */
	char failed[DG_SPEC_TEXT_MAX]; /* a kernel that failed: its spec */
} dg_ffi_bundle_summary;

/*
 * dg_bundle_build into the folder out: n_specs spec texts (dg_spec_parse's
 * rules; specs NULL: the default build set; a text that does not parse is
 * DG_ERR_INVALID_SPEC "specs[i]: ..."); device NULL: for each spec's SM
 * the one device the tuning records name, "": none, else a name with its
 * sm; jobs 0: the online CPUs; cache_dir NULL: the cache's default;
 * no_cache 1: compile everything, touch no cache; tune_db: the records (a
 * file, a folder, "builtin", "none"; NULL: $DRAGON_TUNE_DB, else the
 * cache's tune/, the built-in records below); tuned 1: copy the records
 * used into the bundle. summary may be NULL.
 */
DG_API dg_status dg_ffi_bundle_build(const char *out, const char *const *specs, int32_t n_specs,
			      const char *device, int32_t sm, int32_t jobs, const char *cache_dir,
			      int32_t no_cache, const char *tune_db, int32_t tuned,
			      dg_ffi_bundle_summary *summary, char *msg, size_t msg_size);

/* The default build set (dg_bundle_default_specs): its canonical texts,
 * each followed by '\n', into buf (size bytes, NUL-terminated), *n how
 * many. *needed gets the bytes that takes with its NUL: a buf too small
 * is DG_ERR_INVALID_ARG, and the caller calls again with that size. */
DG_API dg_status dg_ffi_bundle_default_specs(char *buf, uint64_t size, uint64_t *needed, int32_t *n,
				      char *msg, size_t msg_size);

/* A bundle folder through the library's reader: dir/manifest.json read
 * (dg_manifest_load) and every file it lists checked against it
 * (dg_manifest_kernel_verify: size, SHA-256, the cubin's SM). Its
 * kernels' specs, each followed by '\n', into buf as above. One line
 * naming the file on failure: DG_ERR_NOT_FOUND (no manifest, a missing
 * file), DG_ERR_PARSE, DG_ERR_CORRUPT, DG_ERR_UNSUPPORTED. */
DG_API dg_status dg_ffi_bundle_check(const char *dir, char *buf, uint64_t size, uint64_t *needed, int32_t *n,
			      char *msg, size_t msg_size);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_FFI_H */
