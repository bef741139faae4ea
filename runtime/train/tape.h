/*
 * The tape of a training step (docs/training.md): the buffers a
 * step touches and the nodes that read and write them, forward then
 * backward, recorded once per (config, B, T) by a builder (bdh_tape.c),
 * then planned into arenas and run by a backend (the CPU references,
 * cpu_model.c; the GPU ops).
 *
 * Buffers are declared with a format, a shape and a bucket; a view is a
 * slice of a parent buffer (one layer of a stack that a weight gradient
 * reads as one GEMM over all layers). Nodes name buffers by id. The plan:
 *   - liveness: a buffer lives from the first node that touches it to the
 *     last one (a view keeps its parent alive), in tape order;
 *   - params, low-bit copies and gradients live the whole step, each
 *     bucket in an arena of its own, packed;
 *   - saved activations, temporaries and workspaces share one arena, a
 *     buffer placed at the lowest offset no buffer whose lifetime overlaps
 *     its own occupies, the largest first (greedy by size): buffers whose
 *     lifetimes do not overlap reuse the same bytes;
 *   - every offset is 256-byte aligned; nothing moves after planning, so
 *     the pointers are stable from step to step (a captured graph replays).
 * The report (dg__tape_report) gives each bucket's bytes, and the
 * activation arena's size with and without reuse, before anything is
 * allocated.
 */
#ifndef DG_RUNTIME_TRAIN_TAPE_H
#define DG_RUNTIME_TRAIN_TAPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/fmt.h"
#include "dragon/model.h"
#include "dragon/status.h"

typedef enum dg__bucket {
	DG__B_PARAMS,    /* f32 master weights */
	DG__B_LOWBIT,    /* the copies the kernels read (codes, scales, layouts) */
	DG__B_GRADS,     /* parameter gradients */
	DG__B_SAVED,     /* activations the backward reads */
	DG__B_TEMP,      /* within a node pair: activation gradients, scratch */
	DG__B_WORKSPACE, /* the ops' workspaces */
	DG__B__COUNT
} dg__bucket;

/* What a node does; the backends give each kind its meaning (cpu_model.c). */
typedef enum dg__nkind {
	/* forward */
	DG__N_EMBED,    /* out0 = table[tokens]                       in: table */
	DG__N_LN,       /* out0 = LN(in0), out1 = rstd                 */
	DG__N_PROJ,     /* out0 = relu(in0 · in1ᵀ − thr), arg: DG_PROJ_ENCODER | _ENCODER_V */
	DG__N_ATTN,     /* out0 = att, out1 = what its backward needs (qr | S); in: xs, x */
	DG__N_GATE,     /* out0 = dropout(in0 · in1), layer keys the mask */
	DG__N_DEC,      /* out0 = in0 (B,H,T,N) · in1 (D, H·N)ᵀ */
	DG__N_RESID_LN, /* out0 = LN(in0 + in1), out1 = rstd */
	DG__N_CE,       /* loss of in0 · in1 (lm_head) against the targets */
	DG__N_QUANT,    /* out0 = codes of in0 with their scales (a recipe's act),
			 * arg: the dg_proj whose input it is */
	DG__N_GATE_Q,   /* out0 = DG__N_QUANT's codes of DG__N_GATE's product of
			 * in0 and in1, in one (gate_quant: no product in
			 * memory); arg: DG_PROJ_DECODER */
	/* backward */
	DG__N_CE_BWD,      /* out0 = dx (=), out1 = d lm_head (=), out2 = the loss
			    * again; in: x, lm_head, targets */
	DG__N_LN_BWD,      /* out0 = dx (=) of dy in0, y in1, rstd in2 */
	DG__N_DEC_IN,      /* out0 = in0 (dyd) · in1 (dec) */
	DG__N_GATE_BWD,    /* out0 = dxs (=), out1 = dys·[ys > 0] (=); in: dxy, xs, ys */
	DG__N_PROJ_IN,     /* out0 = in0 (grad) · in1 (w); arg as DG__N_PROJ */
	DG__N_ATTN_BWD,    /* out0 = dxs (+=, then ·[xs > 0]), out1 = dv (=);
			    * in: datt, the forward's out1, x, xs */
	DG__N_ADD3,        /* out0 = in0 + in1 + in2 */
	DG__N_PROJ_W,      /* out0 = Σ_rows in0 (grad)ᵀ in1 (act), all layers; arg as PROJ */
	DG__N_DEC_W,       /* out0 = Σ_rows in0 (dyd)ᵀ in1 (xy), all layers */
	DG__N_EMBED_BWD,   /* out0 (d table) from in0 (d emb) and the tokens */
	DG__N_TO_MASTER,   /* out0 (a master's gradient) from in0 (its execution layout); arg: param */
	DG__N_DEQUANT,     /* out0 (bf16) = in0's codes × their scales, a float copy a
			    * gradient GEMM reads; arg as PROJ (whose input codes) */
	DG__N_DEC_GATE,    /* DEC_IN then GATE_BWD in one (decoder_gate_bwd): out0 =
			    * dxs (=), out1 = dys (=); in: dyd, dec (bf16), xs, ys */
	DG__N__COUNT
} dg__nkind;

#define DG__TAPE_IN 4
#define DG__TAPE_OUT 3

typedef struct dg__tbuf {
	char name[40];
	dg_fmt fmt;
	int ndim;
	int64_t shape[4];
	size_t bytes;
	dg__bucket bucket;
	int parent;        /* a view: the buffer it slices, else -1 */
	int scale;         /* codes: the buffer of their scale(s), else -1 */
	size_t view_off;   /* its byte offset in the parent */
	int first, last;   /* liveness, in node indices (-1: never touched) */
	size_t offset;     /* the plan: the byte offset in its bucket's arena */
} dg__tbuf;

typedef struct dg__tnode {
	dg__nkind kind;
	int layer;              /* the layer, -1 outside */
	int in[DG__TAPE_IN];    /* buffer ids, -1 unused */
	int out[DG__TAPE_OUT];
	int ws;                 /* a workspace buffer, -1 none */
	int arg;                /* kind-specific (see dg__nkind) */
	bool backward;
} dg__tnode;

typedef struct dg__tape {
	dg_model_config config;
	int B, T;
	dg__tbuf *bufs;
	int n_bufs, cap_bufs;
	dg__tnode *nodes;
	int n_nodes, cap_nodes;
	int n_forward;          /* nodes [0, n_forward) are the forward */
	bool planned;
	size_t arena[DG__B__COUNT]; /* the plan: bytes of each bucket's arena
				     * (SAVED, TEMP and WORKSPACE share the one
				     * of DG__B_SAVED; the other two are 0) */
	bool oom;               /* a declaration ran out of memory */
} dg__tape;

void dg__tape_init(dg__tape *t, const dg_model_config *c, int B, int T);
void dg__tape_free(dg__tape *t);

/* Declares a buffer (ndim 1..4); returns its id, -1 when out of memory. */
int dg__tape_buf(dg__tape *t, const char *name, dg_fmt fmt, dg__bucket bucket, int ndim,
		 const int64_t *shape);
/* Slice i of n equal slices of buffer parent (a layer of a stack), shaped
 * (ndim, shape): its bytes must be the parent's / n. */
int dg__tape_view(dg__tape *t, int parent, int i, int n, const char *name, int ndim,
		  const int64_t *shape);
/* Appends a node; returns its index (-1 out of memory). */
int dg__tape_node(dg__tape *t, dg__nkind kind, int layer, const int *in, int n_in,
		  const int *out, int n_out, int arg);

/* "proj", "attn_bwd", ...: a node kind's name (for profiles). */
const char *dg__nkind_name(dg__nkind k);

/* Gives codes buffer `codes` its scales buffer (-1: none). */
void dg__tape_set_scale(dg__tape *t, int codes, int scale);

/* Liveness and arena offsets (see the header's notes). */
dg_status dg__tape_plan(dg__tape *t);

/* Bytes of buffer id from its arena's base: the parent's offset plus the
 * view's. */
size_t dg__tape_offset(const dg__tape *t, int id);
dg__bucket dg__tape_arena_of(const dg__tape *t, int id);
/* The buffer a view slices (itself when it is none). */
int dg__tape_root(const dg__tape *t, int id);

/* Bytes by bucket (no reuse) and the shared arena's planned size. */
void dg__tape_report(const dg__tape *t, dg_model_memory *out);

#endif
