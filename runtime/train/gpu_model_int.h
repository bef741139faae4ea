/*
 * The GPU model's private parts (runtime/train/gpu_model.c creates, plans
 * and runs it; runtime/train/gpu_nodes.c runs its tape's nodes on the GPU
 * ops): the handle, and what the two files share of each other.
 */
#ifndef DG_RUNTIME_TRAIN_GPU_MODEL_INT_H
#define DG_RUNTIME_TRAIN_GPU_MODEL_INT_H

#include "dragon/model.h"
#include "dragon/ops.h"
#include "runtime/ops/ops_int.h"
#include "runtime/train/bdh_tape.h"
#include "runtime/train/model_int.h"

#define FAKE_BASE ((dg_dptr)1 << 20) /* sizing: any aligned non-zero address */

struct dg_model {
	dg_device *dev;
	dg_model_config c;
	int B, T, H, D, N, V;
	int sm;                     /* the device's SM architecture (90: sm_90), 0 unknown */
	int failed_node;            /* listing the specs (dg__gm_step_specs): the node that failed */
	/* listing the specs (no device): the tuning DB and the device name
	 * whose attention_form record decides the attention's form, as the
	 * device's own does for a model (NULL: the built-in rule) */
	const dg_tune_db *list_db;
	const char *list_device;
	dg_fmt act;
	bool lowbit;
	bool bf16_grads;            /* low-bit on sm_90: bf16 gradient GEMM operands */
	bool dec_gate;              /* bf16 activations on sm_90: decoder_gate_bwd */
	bool warm;                  /* the step's kernels were compiled at once (warm_kernels) */
	/* dg_model_create's seconds, by part (dg__gm_create_times): the
	 * kernels compiled at once, the plans built (the nodes prepared, the
	 * kernels a compile missed built one by one), the arenas allocated,
	 * the weights uploaded and converted */
	double compile_s, plan_s, alloc_s, upload_s;
	bool keep_qr;               /* RoPE(xs) saved by the attention's forward
				     * (dg__bdh_target): where the plan fits */
	bool attn_turn;             /* DRAGON_ATTN_TURN=1: the attention's
				     * backward RoPEs xs on grad_xs's stages
				     * (its persistent form, rope=load), so
				     * nothing keeps or makes RoPE(xs) for it
				     * (keep_qr off): its memory without its
				     * pass (gpu_model.c attn_turns) */
	bool recompute;             /* xs and ys made again by the backward, not
				     * saved (dg__bdh_target): where the plan
				     * would not fit otherwise */
	bool recompute_ys;          /* ys alone made again (dg__bdh_target):
				     * where saving both would not fit, saving
				     * xs does */
	bool proj_rope;             /* with keep_qr (the quadratic form, bf16 on
				     * sm_90): the encoder's projection writes
				     * RoPE(xs) into the kept qr (lowrank_fwd
				     * epi=rope) and the attention makes no RoPE
				     * pass (DRAGON_PROJ_ROPE=1) */
	bool gate_tma;              /* DEC_GATE by decoder_gate_bwd's persistent
				     * form (bf16 on sm_90, N % 8 == 0, D % 64
				     * == 0; not DRAGON_GATE_TMA=0) */
	bool gate_ys;               /* where it applies (not DRAGON_GATE_YS=0):
				     * ys, where it is made again, made inside
				     * DEC_GATE (dg__bdh_target gate_ys) */
	size_t budget;              /* DRAGON_MEMORY's bytes (0: none): the
				     * plans fit under it as under the
				     * device's free memory */
	int attn_chunk;             /* the attention's chunked form, its chunk C
				     * (gpu_model.c attn_chunk_for), or 0: the
				     * quadratic form */
	bool stack_pgrads;          /* the encoders' weight gradients over every
				     * layer's stacked rows (dg__bdh_target):
				     * gpu_model.c pgrads_stackable, where the
				     * plan fits */
	dg__tape t;
	struct dg__op_exec *ex;     /* each node's ops, prepared while sizing */
	dg__bdh_ids id;
	int qw_ws;                  /* quantize_weight's workspace (a per-tensor scale), or -1 */
	bool sizing;                /* build: buffers at placeholder addresses */
	dg_dptr *fake;              /* sizing: each root buffer's placeholder
				     * address, [n_fake] the workspaces': the
				     * buffers laid end to end, none sharing a
				     * byte, whatever their sizes */
	int n_fake;
	dg_dptr base[DG__B__COUNT]; /* arena bases (FAKE_BASE while sizing) */
	dg_dptr alloc[DG__B__COUNT];
	dg_dptr step_at;            /* 0, or the dropout's step on the device (a
				     * training step's control block): the gate
				     * nodes pass it, their batch's step then 0 */
	dg_dptr grad_scale_at;      /* 0, or the loss scaler's S on the device
				     * (the control block's loss_scale), or
				     * 1/K (accumulation): the loss's backward
				     * multiplies by it */
	int accum;                  /* K: micro-batches a training step (1) */
	int micro;                  /* the micro-batch running: > 0 adds to the
				     * weight gradients (0 outside a training step) */
	bool last;                  /* the step's last micro-batch (or none): the
				     * execution-layout gradients go to the masters'
				     * layout (true outside a training step) */
	/* decoding from a state (gpu_decode.c: a model of (b, 1) whose
	 * attention node runs attention_step), else false and 0 */
	bool decode;
	dg_dptr state;              /* (layers, B, H, N, D) f32: each layer's S */
	dg_dptr pos_d;              /* (2B) 4-byte words: each row's position this
				     * token (B) f32, then its token (B) i32 — what
				     * a token uploads, in one copy */
	dg_dptr freq_d;             /* (N) f32: RoPE's frequencies (dg_ref_rope_freq) */
	int64_t *pos;               /* (B) host: each row's consumed tokens */
	const dg_model *shares;     /* a prefill's window model (dg__gm_create_window):
				     * the decoder whose state, positions,
				     * frequencies and parameters it uses, else NULL */
	struct dg__gm_decode *dc;   /* a decoder's per-token parts (gpu_decode.c) */
	void (*dc_free)(dg_model *m); /* frees dc (set with it: destroy calls it) */
	struct dg__gm_train *tr;    /* training on the device (gpu_train.c), or NULL */
	void (*tr_free)(dg_model *m); /* frees tr (set with it: destroy calls it) */
};

/* dg_model_create's model (decode false), or a decoder of b rows (decode
 * true: t 1, a token a row; its forward alone planned; its state, positions and RoPE frequencies allocated
 * first, so its attention nodes are sized as attention_step). warmed: the
 * step's kernels are loaded already (a joined dg__gm_warm_start), so none
 * is listed and looked up at once again. */
dg_status dg__gm_create(dg_device *dev, const dg_model_weights *w, int b, int t, int accum, bool decode,
		       bool warmed, dg_model **out);
/* A prefill's window model of decoder dec (gpu_decode.c): planned for (dec's
 * B, t) as a decoder, its attention nodes consuming t tokens a row at once
 * (attention_step's window), on dec's state, positions, RoPE frequencies
 * and parameter arena (used in place, not copied); its execution copies
 * made from those parameters on the device. dec outlives it. */
dg_status dg__gm_create_window(dg_device *dev, const dg_model *dec, int t, dg_model **out);

/* The batch's checks and its upload: tokens, targets, the bad flag reset. */
dg_status dg__gm_upload(dg_model *m, const dg_model_batch *bt);
/* Execution copy k (dragon/model.h dg_proj) from its master on the
 * device. */
dg_status dg__gm_make_copy(dg_model *m, dg_proj k);


/* A buffer's device address (a distinct placeholder while sizing); the
 * buffer as a tensor of its format and shape, its scale attached. */
dg_dptr dg__gm_addr(const dg_model *m, int id);
dg_tensor dg__gm_tn(const dg_model *m, int id);

/* Specs: an op's with the model's shape, device arch and activations'
 * formats (base), normalized (op); dequantize's (codes of act with the
 * granularity g, to bf16); projection which's recipe (which: a
 * dragon/model.h dg_proj). */
dg_spec dg__gm_base_spec(const dg_model *m, dg_op op);
dg_spec dg__gm_op_spec(const dg_model *m, dg_op op);
dg_spec dg__gm_dequant_spec(const dg_model *m, dg_fmt act, dg_scale_gran g);
const dg_proj_recipe *dg__gm_recipe(const dg_model *m, dg_proj which);

/* One node on the device; sizing (need non-NULL): *need gets its
 * workspace bytes and its kernels are prepared, nothing launched. */
dg_status dg__gm_run_node(dg_model *m, const dg__tnode *nd, const dg_model_batch *bt, size_t *need);

/*
 * Every op spec the GPU model of c at (b, t) on a device of SM
 * architecture sm would prepare — each node's, the execution copies'
 * (transpose, quantize, dequantize, pack) and the optimizer's — handed to
 * sink in node order (repeats included), without a device: nothing is
 * compiled, allocated or launched. What a compile test asks to know that
 * a shape's step generates and compiles. db and device (either may be
 * NULL: the built-in rule) name the tuning DB and the device whose
 * attention_form record decides the attention's form, as dg_model_create
 * on that device reads it (runtime/tunedb/form.h). The first status sink
 * returns that is not DG_OK stops it and is returned; msg names a
 * refusal of the config.
 */
/* The sizing pass's placeholder addresses (dg__gm_addr while m->sizing):
 * every root buffer of m's tape so far at its own bytes, laid end to end
 * from FAKE_BASE in tape order (256-byte aligned, a 256-byte gap between),
 * and the workspaces' placeholder past them all (m->fake[m->n_fake]).
 * DG_ERR_NOMEM. */
dg_status dg__gm_fake_layout(dg_model *m);

dg_status dg__gm_step_specs(const dg_model_config *c, int b, int t, int sm, const dg_tune_db *db, const char *device,
			    dg_status (*sink)(void *user, const dg_spec *spec), void *user, char *msg,
			    size_t msg_size);

#endif
