/*
 * The tape's buffers, nodes and arena plan (runtime/train/tape.h).
 */
#include "runtime/train/tape.h"

#include <stdlib.h>
#include <string.h>

#define ALIGN 256

const char *dg__nkind_name(dg__nkind k)
{
	static const char *const names[DG__N__COUNT] = {
		[DG__N_EMBED] = "embed",	 [DG__N_LN] = "layernorm",
		[DG__N_PROJ] = "projection",	 [DG__N_ATTN] = "attention",
		[DG__N_GATE] = "gate",		 [DG__N_DEC] = "decoder",
		[DG__N_RESID_LN] = "resid_ln",	 [DG__N_CE] = "lm_head+ce",
		[DG__N_QUANT] = "quantize_act",	 [DG__N_GATE_Q] = "gate_quant",
		[DG__N_CE_BWD] = "lm_head+ce bwd",
		[DG__N_LN_BWD] = "layernorm bwd", [DG__N_DEC_IN] = "decoder grad_input",
		[DG__N_GATE_BWD] = "gate bwd",	 [DG__N_PROJ_IN] = "projection grad_input",
		[DG__N_ATTN_BWD] = "attention bwd", [DG__N_ADD3] = "add3",
		[DG__N_PROJ_W] = "projection grad_weight", [DG__N_DEC_W] = "decoder grad_weight",
		[DG__N_EMBED_BWD] = "embed bwd", [DG__N_TO_MASTER] = "to master layout",
		[DG__N_DEQUANT] = "dequantize", [DG__N_DEC_GATE] = "decoder grad_input + gate bwd",
	};
	return (unsigned)k < DG__N__COUNT && names[k] ? names[k] : "?";
}

static size_t align_up(size_t n)
{
	return (n + ALIGN - 1) / ALIGN * ALIGN;
}

void dg__tape_init(dg__tape *t, const dg_model_config *c, int B, int T)
{
	memset(t, 0, sizeof(*t));
	if (c)
		t->config = *c;
	t->B = B;
	t->T = T;
}

void dg__tape_free(dg__tape *t)
{
	free(t->bufs);
	free(t->nodes);
	memset(t, 0, sizeof(*t));
}

static bool grow(void **p, int *cap, int need, size_t elem)
{
	if (need <= *cap)
		return true;
	int n = *cap ? *cap * 2 : 64;
	while (n < need)
		n *= 2;
	void *q = realloc(*p, (size_t)n * elem);
	if (!q)
		return false;
	*p = q;
	*cap = n;
	return true;
}

static int add_buf(dg__tape *t, const char *name, dg_fmt fmt, dg__bucket bucket, int ndim,
		   const int64_t *shape)
{
	if (ndim < 1 || ndim > 4 || !grow((void **)&t->bufs, &t->cap_bufs, t->n_bufs + 1,
					  sizeof(*t->bufs))) {
		t->oom = true;
		return -1;
	}
	dg__tbuf *b = &t->bufs[t->n_bufs];
	memset(b, 0, sizeof(*b));
	strncpy(b->name, name, sizeof(b->name) - 1);
	b->fmt = fmt;
	b->ndim = ndim;
	int64_t n = 1;
	for (int i = 0; i < ndim; i++) {
		b->shape[i] = shape[i];
		n *= shape[i];
	}
	b->bytes = dg_fmt_row_bytes(fmt, n);
	b->bucket = bucket;
	b->parent = -1;
	b->scale = -1;
	b->first = b->last = -1;
	return t->n_bufs++;
}

int dg__tape_buf(dg__tape *t, const char *name, dg_fmt fmt, dg__bucket bucket, int ndim,
		 const int64_t *shape)
{
	return add_buf(t, name, fmt, bucket, ndim, shape);
}

int dg__tape_view(dg__tape *t, int parent, int i, int n, const char *name, int ndim,
		  const int64_t *shape)
{
	if (parent < 0 || parent >= t->n_bufs || n < 1 || i < 0 || i >= n) {
		t->oom = true;
		return -1;
	}
	const dg__tbuf p = t->bufs[parent]; /* add_buf may move the array */
	int id = add_buf(t, name, p.fmt, p.bucket, ndim, shape);
	if (id < 0)
		return -1;
	dg__tbuf *b = &t->bufs[id];
	if (b->bytes * (size_t)n != p.bytes) {
		t->oom = true; /* a misshapen view: the builder's bug, refused by plan */
		return -1;
	}
	b->parent = parent;
	b->view_off = b->bytes * (size_t)i;
	return id;
}

int dg__tape_node(dg__tape *t, dg__nkind kind, int layer, const int *in, int n_in,
		  const int *out, int n_out, int arg)
{
	if (n_in > DG__TAPE_IN || n_out > DG__TAPE_OUT ||
	    !grow((void **)&t->nodes, &t->cap_nodes, t->n_nodes + 1, sizeof(*t->nodes))) {
		t->oom = true;
		return -1;
	}
	dg__tnode *nd = &t->nodes[t->n_nodes];
	memset(nd, 0, sizeof(*nd));
	nd->kind = kind;
	nd->layer = layer;
	nd->arg = arg;
	nd->ws = -1;
	/* the backward's kinds, and any node after one (a forward kind the
	 * backward runs again: bdh_tape.c's recompute) */
	nd->backward = kind >= DG__N_CE_BWD || (t->n_nodes > 0 && t->nodes[t->n_nodes - 1].backward);
	for (int i = 0; i < DG__TAPE_IN; i++)
		nd->in[i] = i < n_in ? in[i] : -1;
	for (int i = 0; i < DG__TAPE_OUT; i++)
		nd->out[i] = i < n_out ? out[i] : -1;
	if (!nd->backward)
		t->n_forward = t->n_nodes + 1;
	return t->n_nodes++;
}

void dg__tape_set_scale(dg__tape *t, int codes, int scale)
{
	if (codes >= 0 && codes < t->n_bufs)
		t->bufs[codes].scale = scale;
}

static int root(const dg__tape *t, int id)
{
	while (t->bufs[id].parent >= 0)
		id = t->bufs[id].parent;
	return id;
}

static void touch(dg__tape *t, int id, int node)
{
	if (id < 0 || id >= t->n_bufs)
		return;
	dg__tbuf *b = &t->bufs[root(t, id)];
	if (b->first < 0 || node < b->first)
		b->first = node;
	if (node > b->last)
		b->last = node;
	if (t->bufs[id].scale >= 0 && t->bufs[id].scale != id)
		touch(t, t->bufs[id].scale, node); /* codes carry their scales */
}

int dg__tape_root(const dg__tape *t, int id)
{
	return root(t, id);
}

dg__bucket dg__tape_arena_of(const dg__tape *t, int id)
{
	dg__bucket k = t->bufs[root(t, id)].bucket;
	return k == DG__B_TEMP || k == DG__B_WORKSPACE ? DG__B_SAVED : k;
}

size_t dg__tape_offset(const dg__tape *t, int id)
{
	size_t off = 0;
	while (t->bufs[id].parent >= 0) {
		off += t->bufs[id].view_off;
		id = t->bufs[id].parent;
	}
	return off + t->bufs[id].offset;
}

static int by_size_desc(const void *a, const void *b, void *ctx)
{
	const dg__tape *t = ctx;
	size_t x = t->bufs[*(const int *)a].bytes, y = t->bufs[*(const int *)b].bytes;
	if (x != y)
		return x > y ? -1 : 1;
	return *(const int *)a - *(const int *)b; /* a fixed order among equals */
}

/* qsort with a context, by insertion (the tape has a few hundred buffers). */
static void sort_ids(int *ids, int n, const dg__tape *t)
{
	for (int i = 1; i < n; i++) {
		int v = ids[i], j = i - 1;
		while (j >= 0 && by_size_desc(&ids[j], &v, (void *)t) > 0) {
			ids[j + 1] = ids[j];
			j--;
		}
		ids[j + 1] = v;
	}
}

dg_status dg__tape_plan(dg__tape *t)
{
	if (t->oom)
		return DG_ERR_NOMEM;
	for (int i = 0; i < t->n_bufs; i++)
		t->bufs[i].first = t->bufs[i].last = -1;
	for (int n = 0; n < t->n_nodes; n++) {
		const dg__tnode *nd = &t->nodes[n];
		for (int i = 0; i < DG__TAPE_IN; i++)
			touch(t, nd->in[i], n);
		for (int i = 0; i < DG__TAPE_OUT; i++)
			touch(t, nd->out[i], n);
		touch(t, nd->ws, n);
	}
	memset(t->arena, 0, sizeof(t->arena));
	int *ids = malloc(sizeof(int) * (size_t)(t->n_bufs + 1));
	int *placed = malloc(sizeof(int) * (size_t)(t->n_bufs + 1));
	if (!ids || !placed) {
		free(ids);
		free(placed);
		return DG_ERR_NOMEM;
	}
	/* the whole-step buckets: packed in declaration order */
	for (int i = 0; i < t->n_bufs; i++) {
		dg__tbuf *b = &t->bufs[i];
		if (b->parent >= 0 || dg__tape_arena_of(t, i) == DG__B_SAVED)
			continue;
		b->offset = t->arena[b->bucket];
		t->arena[b->bucket] += align_up(b->bytes);
	}
	/* the activation arena: greedy by size over lifetimes */
	int n = 0, np = 0;
	for (int i = 0; i < t->n_bufs; i++)
		if (t->bufs[i].parent < 0 && dg__tape_arena_of(t, i) == DG__B_SAVED &&
		    t->bufs[i].first >= 0)
			ids[n++] = i;
	sort_ids(ids, n, t);
	size_t top = 0;
	for (int k = 0; k < n; k++) {
		dg__tbuf *b = &t->bufs[ids[k]];
		size_t need = align_up(b->bytes), off = 0;
		/* the lowest gap among the placed buffers it overlaps in time:
		 * try 0 and the end of each such buffer, keep the lowest that fits */
		bool found = false;
		size_t best = 0;
		for (int c = -1; c < np; c++) {
			size_t cand = c < 0 ? 0 : t->bufs[placed[c]].offset +
							   align_up(t->bufs[placed[c]].bytes);
			bool ok = true;
			for (int j = 0; j < np && ok; j++) {
				const dg__tbuf *o = &t->bufs[placed[j]];
				bool in_time = !(o->last < b->first || b->last < o->first);
				bool in_space = cand < o->offset + align_up(o->bytes) &&
						o->offset < cand + need;
				ok = !(in_time && in_space);
			}
			if (ok && (!found || cand < best)) {
				best = cand;
				found = true;
			}
		}
		off = best;
		b->offset = off;
		placed[np++] = ids[k];
		if (off + need > top)
			top = off + need;
	}
	t->arena[DG__B_SAVED] = top;
	free(ids);
	free(placed);
	t->planned = true;
	return DG_OK;
}

void dg__tape_report(const dg__tape *t, dg_model_memory *m)
{
	memset(m, 0, sizeof(*m));
	for (int i = 0; i < t->n_bufs; i++) {
		const dg__tbuf *b = &t->bufs[i];
		if (b->parent >= 0)
			continue;
		size_t k = align_up(b->bytes);
		switch (b->bucket) {
		case DG__B_PARAMS:
			m->params += k;
			break;
		case DG__B_LOWBIT:
			m->lowbit += k;
			break;
		case DG__B_GRADS:
			m->grads += k;
			break;
		case DG__B_SAVED:
			m->saved += k;
			break;
		case DG__B_TEMP:
			m->temp += k;
			break;
		default:
			m->workspace += k;
			break;
		}
	}
	m->activations = t->arena[DG__B_SAVED];
	m->total = t->arena[DG__B_PARAMS] + t->arena[DG__B_LOWBIT] + t->arena[DG__B_GRADS] +
		   m->activations;
}
