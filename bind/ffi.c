/*
 * The flat door of dragon/ffi.h: specs as handles, every op through the
 * ops' one generic call (the op table's tensor order, dg__op_call's
 * scalars), and the BDH model with its buffers handed out by address.
 * A layer above training: it only translates, every check and message is
 * the layers' below.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/msg.h"
#include "dragon/codegen.h"
#include "dragon/jit.h"
#include "dragon/ffi.h"
#include "dragon/manifest.h"
#include "dragon/tensor.h"
#include "dragon/tune.h"
#include "runtime/ops/ops_int.h"
#include "runtime/train/model_int.h"

int dg_ffi_version(void)
{
	return DG_FFI_VERSION;
}

/* ---- specs ------------------------------------------------------------------ */

dg_status dg_ffi_spec_parse(const char *text, dg_spec **out, char *msg, size_t msg_size)
{
	if (!text || !out)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_ffi_spec_parse: NULL argument");
	*out = NULL;
	dg_spec *s = malloc(sizeof(*s));
	if (!s)
		return dg__msgf(DG_ERR_NOMEM, msg, msg_size, "out of memory");
	dg_status st = dg_spec_parse(text, s, msg, msg_size);
	if (st) {
		free(s);
		return st;
	}
	*out = s;
	return DG_OK;
}

void dg_ffi_spec_destroy(dg_spec *s)
{
	free(s);
}

dg_status dg_ffi_spec_text(const dg_spec *s, char *buf, size_t size)
{
	return s ? dg_spec_to_string(s, buf, size) : DG_ERR_INVALID_ARG;
}

dg_status dg_ffi_spec_plan(const dg_spec *s, int32_t device_sm, char *path, size_t path_size, char *canonical,
			   size_t canonical_size, char *msg, size_t msg_size)
{
	if (!s)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_ffi_spec_plan: NULL spec");
	dg_codegen *cg = NULL;
	dg_status st = dg_codegen_create(&cg, NULL);
	if (st) {
		dg__msgf(st, msg, msg_size, "%s", cg ? dg_codegen_errmsg(cg) : "dg_codegen_create failed");
		dg_codegen_destroy(cg);
		return st;
	}
	dg_plan plan;
	st = dg_codegen_plan_for(cg, s, device_sm, &plan);
	if (st) {
		dg__msgf(st, msg, msg_size, "%s", dg_codegen_errmsg(cg));
	} else {
		if (path && path_size)
			snprintf(path, path_size, "%s", plan.path);
		if (canonical && canonical_size)
			snprintf(canonical, canonical_size, "%s", plan.canonical);
	}
	dg_codegen_destroy(cg);
	return st;
}

dg_status dg_ffi_spec_compile(const dg_spec *s, int32_t device_sm, int32_t *cache_hit, char *msg,
			      size_t msg_size)
{
	if (!s)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_ffi_spec_compile: NULL spec");
	dg_ctx *ctx = NULL;
	dg_status st = dg_ctx_create(&ctx, NULL);
	dg_plan plan;
	if (!st && (st = dg_codegen_plan_for(dg_ctx_codegen(ctx), s, device_sm, &plan)))
		dg__msgf(st, msg, msg_size, "%s", dg_codegen_errmsg(dg_ctx_codegen(ctx)));
	else if (st)
		dg__msgf(st, msg, msg_size, "%s", ctx ? dg_ctx_errmsg(ctx) : "dg_ctx_create failed");
	dg_binary *bin = NULL;
	if (!st && (st = dg_jit_compile(ctx, &plan.spec, &bin)))
		dg__msgf(st, msg, msg_size, "%s", dg_ctx_errmsg(ctx));
	if (!st && cache_hit)
		*cache_hit = bin->cache_hit;
	dg_binary_destroy(bin);
	dg_ctx_destroy(ctx);
	return st;
}

/* ---- ops --------------------------------------------------------------------- */

dg_status dg_ffi_op_args(const dg_spec *s, int64_t b, int64_t t, int64_t r, dg_ffi_tensor *out,
			 int32_t *output, int32_t *optional, int32_t *n, char *msg, size_t msg_size)
{
	if (!s || !out || !n)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_ffi_op_args: NULL argument");
	*n = 0;
	const dg_op_info *info = dg_op_info_of(s->op);
	if (!info)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, msg_size, "dg_ffi_op_args: no such op");
	int k = 0;
	for (int i = 0; i < info->n_args; i++) {
		if (!dg_op_arg_used(s, i))
			continue;
		const dg_op_arg *a = &info->args[i];
		dg_ffi_tensor *o = &out[k];
		memset(o, 0, sizeof(*o));
		o->name = a->name;
		o->fmt = (int32_t)dg_op_arg_fmt(s, a->fmt);
		o->ndim = a->ndim;
		for (int d = 0; d < a->ndim; d++) {
			const dg_dim dd = a->dims[d];
			int64_t e = dg_op_dim_extent(s, dd, b, t, r);
			if ((dd == DG_DIM_B || dd == DG_DIM_T || dd == DG_DIM_R) && e < 1)
				return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
						"%s: %s's %s is %lld: must be at least 1", dg_op_name(s->op), a->name,
						dd == DG_DIM_B ? "B" : dd == DG_DIM_T ? "T" : "R", (long long)e);
			o->shape[d] = e;
		}
		if (output)
			output[k] = a->output;
		if (optional)
			optional[k] = a->optional;
		k++;
	}
	*n = k;
	return DG_OK;
}

/* The generic call of s's op from the caller's tensors (n: the used ones,
 * in order) and options, into c (tensors into ts). */
static dg_status call_of(const dg_spec *s, const dg_ffi_tensor *t, int32_t n, const dg_ffi_opts *o,
			 dg_tensor ts[DG_OP_MAX_ARGS], dg__op_call *c, char *msg, size_t msg_size)
{
	memset(c, 0, sizeof(*c));
	const dg_op_info *info = s ? dg_op_info_of(s->op) : NULL;
	if (!info)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, msg_size, "dg_ffi_op: no spec or no such op");
	int used = 0;
	for (int i = 0; i < info->n_args; i++)
		used += dg_op_arg_used(s, i);
	if (n != used || (n && !t)) {
		char names[256] = "";
		for (int i = 0, k = 0; i < info->n_args; i++)
			if (dg_op_arg_used(s, i)) {
				size_t len = strlen(names);
				snprintf(names + len, sizeof(names) - len, "%s%s", k++ ? ", " : "", info->args[i].name);
			}
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "%s takes %d tensors (%s), got %d",
				dg_op_name(s->op), used, names, (int)n);
	}
	for (int i = 0, k = 0; i < info->n_args; i++) {
		if (!dg_op_arg_used(s, i))
			continue;
		const dg_ffi_tensor *f = &t[k++];
		if (!f->data && info->args[i].optional)
			continue;
		if (f->ndim < 1 || f->ndim > DG_TENSOR_MAX_DIMS)
			return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "%s: %d dimensions: must be 1 to %d",
					f->name ? f->name : info->args[i].name, (int)f->ndim, DG_TENSOR_MAX_DIMS);
		if (f->fmt < 0 || f->fmt >= DG_FMT__COUNT)
			return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "%s: format %d: no such format",
					f->name ? f->name : info->args[i].name, (int)f->fmt);
		dg_tensor *d = &ts[i];
		memset(d, 0, sizeof(*d));
		d->name = f->name ? f->name : info->args[i].name;
		d->fmt = (dg_fmt)f->fmt;
		d->ndim = f->ndim;
		for (int j = 0; j < f->ndim; j++) {
			d->shape[j] = f->shape[j];
			d->stride[j] = f->stride[j];
		}
		d->data = f->data;
		d->scale = f->scale;
		c->t[i] = d;
	}
	if (o) {
		c->ws.ptr = o->ws;
		c->ws.bytes = o->ws_bytes;
		c->absum = o->absum;
		c->splits = o->splits;
		c->accumulate = o->accumulate != 0;
		c->unpack = o->unpack != 0;
		c->backward = o->backward != 0;
		c->eps = o->eps;
		c->bad = o->bad;
		c->grad_scale = o->grad_scale;
		c->p = o->p;
		c->seed = o->seed;
		c->step = o->step;
		c->layer = o->layer;
		c->step_at = o->step_at;
		c->elem0 = o->elem0;
		c->ctl = o->ctl;
		c->copy = o->copy;
		c->decay = o->decay != 0;
	}
	return DG_OK;
}

dg_status dg_ffi_op_check(const dg_spec *s, const dg_ffi_tensor *t, int32_t n, const dg_ffi_opts *o,
			  char *msg, size_t msg_size)
{
	dg_tensor ts[DG_OP_MAX_ARGS];
	dg__op_call c;
	dg_status st = call_of(s, t, n, o, ts, &c, msg, msg_size);
	/* the op's whole check, its family's rules too: what the run refuses
	 * for the tensors or options, this does */
	return st ? st : dg__op_check_call(s, &c, msg, msg_size);
}

/* A failure: its message m on dev (when there is one) and into msg. */
static dg_status fail_both(dg_device *dev, dg_status st, const char *m, char *msg, size_t msg_size)
{
	if (dev)
		dg__dev_fail_msg(dev, st, m);
	return dg__msgf(st, msg, msg_size, "%s", m);
}

dg_status dg_ffi_op_prepare(dg_device *dev, const dg_spec *s, const dg_ffi_tensor *t, int32_t n,
			    const dg_ffi_opts *o, dg_prepared **out, char *msg, size_t msg_size)
{
	char m[512];
	if (out)
		*out = NULL;
	if (!dev || !s || !out) {
		snprintf(m, sizeof(m), "dg_ffi_op_prepare: %s is NULL", !dev ? "dev" : !s ? "spec" : "out");
		return fail_both(dev, DG_ERR_INVALID_ARG, m, msg, msg_size);
	}
	dg_tensor ts[DG_OP_MAX_ARGS];
	dg__op_call c;
	dg_status st = call_of(s, t, n, o, ts, &c, m, sizeof(m));
	if (st)
		return fail_both(dev, st, m, msg, msg_size);
	dg_prepared *p = malloc(sizeof(*p));
	if (!p)
		return fail_both(dev, DG_ERR_NOMEM, "dg_ffi_op_prepare: out of memory", msg, msg_size);
	if ((st = dg__prepare(dev, s, &c, p))) {
		free(p);
		return dg__msgf(st, msg, msg_size, "%s", dg_device_errmsg(dev));
	}
	p->heap = true; /* dg_prepared_destroy frees it */
	*out = p;
	return DG_OK;
}

dg_status dg_ffi_prepared_run(const dg_prepared *p, const dg_ffi_tensor *t, int32_t n, const dg_ffi_opts *o,
			      char *msg, size_t msg_size)
{
	char m[512];
	if (!p)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_ffi_prepared_run: the prepared op is NULL");
	dg_tensor ts[DG_OP_MAX_ARGS];
	dg__op_call c;
	dg_status st = call_of(&p->spec, t, n, o, ts, &c, m, sizeof(m));
	if (st)
		return fail_both(p->dev, st, m, msg, msg_size);
	st = dg__prepared_launch(p, &c);
	return st ? dg__msgf(st, msg, msg_size, "%s", dg_device_errmsg(p->dev)) : DG_OK;
}

/* ---- the model ------------------------------------------------------------------ */

struct dg_ffi_model {
	dg_device *dev;            /* NULL: the CPU model */
	dg_model_config c;
	int b, t;
	dg_model_weights *w;       /* the CPU model's masters (a GPU model's initial ones) */
	dg_model_weights *g;       /* the CPU model's gradients */
	dg_model *gm;              /* the GPU model */
	float loss;                /* the CPU model's last loss */
	dg_model_cpu_pass *pass;   /* the CPU model's last forward, or NULL */
	dg_model_batch last;       /* the last forward's batch (seed, step, train, b, t) */
	bool forward;              /* a forward ran (its hidden state is there) */
	bool targets;              /* it had targets (a loss) */
	bool backward;             /* its backward may run */
	dg_model_state *state;     /* the CPU model's decoder state, or NULL */
	int state_rows;            /* its rows */
};

dg_status dg_ffi_model_create(dg_device *dev, const char *preset, const dg_ffi_model_sizes *sz, int32_t b,
			      int32_t t, uint64_t seed, dg_ffi_model **out, char *msg, size_t msg_size)
{
	if (!preset || !out)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_ffi_model_create: NULL argument");
	*out = NULL;
	dg_model_config c;
	dg_status st = dg_model_preset(preset, &c, msg, msg_size);
	if (st)
		return st;
	if (sz) {
		if (sz->layers)
			c.layers = sz->layers;
		if (sz->embd)
			c.embd = sz->embd;
		if (sz->heads)
			c.heads = sz->heads;
		if (sz->neurons)
			c.neurons = sz->neurons;
		if (sz->vocab)
			c.vocab = sz->vocab;
		if (sz->dropout >= 0)
			c.dropout = sz->dropout;
	}
	if ((st = dg_model_config_check(&c, msg, msg_size)))
		return st;
	if (b < 1 || t < 1)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "batch %dx%d: B and T must be at least 1", (int)b,
				(int)t);
	if (!dev && !dg_model_cpu_runs(&c))
		return dg__msgf(DG_ERR_UNSUPPORTED, msg, msg_size,
				"preset %s: the CPU model runs f32, w8a8 and bitnet only (this one needs a GPU)",
				preset);
	dg_ffi_model *m = calloc(1, sizeof(*m));
	if (!m)
		return dg__msgf(DG_ERR_NOMEM, msg, msg_size, "out of memory");
	m->dev = dev;
	m->c = c;
	m->b = b;
	m->t = t;
	st = dg_model_weights_create(&c, seed, &m->w, msg, msg_size);
	if (!st && !dev)
		st = dg_model_weights_create(&c, seed, &m->g, msg, msg_size);
	if (!st && dev) {
		st = dg_model_create(dev, m->w, b, t, &m->gm);
		if (st)
			snprintf(msg, msg_size, "%s", dg_device_errmsg(dev));
		dg_model_weights_destroy(m->w); /* the masters live on the device */
		m->w = NULL;
	}
	if (st) {
		dg_ffi_model_destroy(m);
		return st;
	}
	*out = m;
	return DG_OK;
}

void dg_ffi_model_destroy(dg_ffi_model *m)
{
	if (!m)
		return;
	dg_model_destroy(m->gm);
	dg_model_cpu_pass_destroy(m->pass);
	dg_model_state_destroy(m->state);
	dg_model_weights_destroy(m->w);
	dg_model_weights_destroy(m->g);
	free(m);
}

const dg_model_config *dg_ffi_model_config(const dg_ffi_model *m)
{
	return m ? &m->c : NULL;
}

dg_status dg_ffi_model_param(const dg_ffi_model *m, int32_t p, const char **name, int32_t *ndim,
			     int64_t shape[3], uint64_t *master, uint64_t *grad)
{
	if (!m || p < 0 || p >= DG_MODEL_N_PARAMS)
		return DG_ERR_INVALID_ARG;
	int nd = 0;
	int64_t sh[3] = { 0, 0, 0 };
	dg_model_param_shape(&m->c, (dg_model_param)p, &nd, sh);
	if (name)
		*name = dg_model_param_name((dg_model_param)p);
	if (ndim)
		*ndim = nd;
	if (shape)
		memcpy(shape, sh, sizeof(sh));
	dg_dptr mp = 0, gp = 0;
	if (m->gm) {
		dg_status st = dg_model_param_buffers(m->gm, (dg_model_param)p, &mp, &gp);
		if (st)
			return st;
	} else {
		mp = (uint64_t)(uintptr_t)m->w->params[p];
		gp = (uint64_t)(uintptr_t)m->g->params[p];
	}
	if (master)
		*master = mp;
	if (grad)
		*grad = gp;
	return DG_OK;
}

uint64_t dg_ffi_model_loss(const dg_ffi_model *m)
{
	if (!m)
		return 0;
	return m->gm ? dg_model_loss_addr(m->gm) : (uint64_t)(uintptr_t)&m->loss;
}

uint64_t dg_ffi_model_bad(const dg_ffi_model *m)
{
	return m && m->gm ? dg_model_bad_addr(m->gm) : 0;
}

dg_status dg_ffi_model_run(dg_ffi_model *m, uint64_t idx, uint64_t targets, int32_t tokens_on_device,
			   uint64_t seed, uint32_t step, int32_t train, int32_t backward, char *msg,
			   size_t msg_size)
{
	if (!m || !idx || !targets)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_ffi_model_run: NULL argument");
	dg_model_batch bt = { .idx = tokens_on_device ? NULL : (const int32_t *)(uintptr_t)idx,
			      .targets = tokens_on_device ? NULL : (const int32_t *)(uintptr_t)targets,
			      .b = m->b,
			      .t = m->t,
			      .seed = seed,
			      .step = step,
			      .train = train != 0 };
	/* whatever the last forward kept is spent */
	dg_model_cpu_pass_destroy(m->pass);
	m->pass = NULL;
	m->forward = m->backward = false;
	if (!m->gm) {
		if (tokens_on_device)
			return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
					"tokens on a device: this model runs on the CPU");
		double loss = 0;
		dg_status st = dg_model_cpu_step(m->w, &bt, &loss, backward ? m->g : NULL, msg, msg_size);
		if (!st)
			m->loss = (float)loss;
		return st;
	}
	dg_status st = dg_model_sync_copies(m->gm);
	if (!st)
		st = tokens_on_device ? dg_model_run_device(m->gm, &bt, idx, targets, backward != 0)
				      : dg_model_run(m->gm, &bt, backward != 0);
	if (st)
		snprintf(msg, msg_size, "%s", dg_device_errmsg(m->dev));
	return st;
}

dg_status dg_ffi_model_forward(dg_ffi_model *m, uint64_t idx, uint64_t targets, int32_t b, int32_t t,
			       int32_t tokens_on_device, uint64_t seed, uint32_t step, int32_t train, char *msg,
			       size_t msg_size)
{
	if (!m || !idx)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_ffi_model_forward: NULL argument");
	if (b < 1 || t < 1)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "batch %dx%d: B and T must be at least 1", (int)b,
				(int)t);
	dg_model_batch bt = { .idx = tokens_on_device ? NULL : (const int32_t *)(uintptr_t)idx,
			      .targets = tokens_on_device ? NULL : (const int32_t *)(uintptr_t)targets,
			      .b = b,
			      .t = t,
			      .seed = seed,
			      .step = step,
			      .train = train != 0 };
	dg_model_cpu_pass_destroy(m->pass);
	m->pass = NULL;
	m->forward = m->backward = false;
	dg_status st;
	if (!m->gm) {
		if (tokens_on_device)
			return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
					"tokens on a device: this model runs on the CPU");
		double loss = 0;
		st = dg_model_cpu_forward(m->w, &bt, &loss, &m->pass, msg, msg_size);
		if (st)
			return st;
		m->loss = (float)loss;
	} else {
		if (!targets)
			return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
					"targets 0: a GPU model's forward needs targets (ones outside the vocabulary, "
					"on the device, add nothing)");
		st = dg_model_sync_copies(m->gm);
		if (!st)
			st = tokens_on_device ? dg_model_run_device(m->gm, &bt, idx, targets, false)
					      : dg_model_run(m->gm, &bt, false);
		if (st) {
			snprintf(msg, msg_size, "%s", dg_device_errmsg(m->dev));
			return st;
		}
	}
	bt.idx = bt.targets = NULL; /* the caller's: not kept */
	m->last = bt;
	m->forward = true;
	m->targets = m->backward = targets != 0;
	return DG_OK;
}

dg_status dg_ffi_model_backward(dg_ffi_model *m, char *msg, size_t msg_size)
{
	if (!m)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_ffi_model_backward: NULL argument");
	if (!m->backward)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "%s",
				!m->forward    ? "no forward to run the backward of (dg_ffi_model_forward first)"
				: !m->targets ? "the last forward had no targets: it has no backward"
					      : "the last forward's backward has run already (run the forward again)");
	m->backward = false;
	if (!m->gm)
		return dg_model_cpu_backward(m->pass, m->g, msg, msg_size);
	dg_status st = dg_model_run_backward(m->gm, &m->last);
	if (st)
		snprintf(msg, msg_size, "%s", dg_device_errmsg(m->dev));
	return st;
}

dg_status dg_ffi_model_logits(dg_ffi_model *m, uint64_t idx, int32_t pos, uint64_t out, char *msg,
			      size_t msg_size)
{
	if (!m || !idx || !out)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_ffi_model_logits: NULL argument");
	dg_model_batch bt = { .idx = (const int32_t *)(uintptr_t)idx, .b = m->b, .t = m->t };
	float *z = (float *)(uintptr_t)out;
	if (!m->gm)
		return dg_model_cpu_logits(m->w, &bt, pos, z, msg, msg_size);
	dg_status st = dg_model_sync_copies(m->gm);
	if (!st)
		st = dg_model_logits(m->gm, &bt, pos, z);
	if (st)
		snprintf(msg, msg_size, "%s", dg_device_errmsg(m->dev));
	return st;
}

dg_status dg_ffi_model_decode(dg_ffi_model *m, uint64_t tokens, int32_t rows, int32_t n, int32_t restart,
			      uint64_t out, char *msg, size_t msg_size)
{
	if (!m || !tokens || !out)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_ffi_model_decode: NULL argument");
	if (rows < 1 || n < 1 || (!restart && n != 1))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"%d rows of %d tokens: at least 1 of each, and 1 token a row without restart",
				rows, n);
	if (!restart && (!m->state || m->state_rows != rows))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"no state of %d rows to continue: restart it with the prompts first", rows);
	const int32_t *tok = (const int32_t *)(uintptr_t)tokens;
	float *z = (float *)(uintptr_t)out;
	dg_status st = DG_OK;
	if (restart && m->state && (m->gm || m->state_rows != rows)) {
		dg_model_state_destroy(m->state);
		m->state = NULL;
	}
	/* a GPU model's decoder is made from its masters as they are now
	 * (read back into a host copy; the copy follows the queued work) */
	if (m->gm && !m->state && !m->w && (st = dg__model_weights_alloc(&m->c, &m->w, msg, msg_size)))
		return st;
	for (int p = 0; m->gm && !m->state && p < DG_MODEL_N_PARAMS && !st; p++) {
		dg_dptr mp = 0, gp = 0;
		int nd;
		int64_t sh[3];
		size_t bytes = (size_t)dg_model_param_shape(&m->c, (dg_model_param)p, &nd, sh) * sizeof(float);
		st = dg_model_param_buffers(m->gm, (dg_model_param)p, &mp, &gp);
		if (!st)
			st = dg_memcpy_dtoh(m->dev, m->w->params[p], mp, bytes);
		if (st)
			return dg__msgf(st, msg, msg_size, "the masters: %s", dg_device_errmsg(m->dev));
	}
	if (!m->state && (st = dg_model_state_create(m->dev, m->w, rows, &m->state, msg, msg_size)))
		return st;
	m->state_rows = rows;
	return dg_model_decode(m->state, -1, tok, n, restart != 0, z, msg, msg_size);
}

dg_status dg_ffi_model_hidden(const dg_ffi_model *m, uint64_t *addr, int32_t *fmt, int64_t shape[3])
{
	if (!m || !m->forward)
		return DG_ERR_INVALID_ARG;
	uint64_t a;
	dg_fmt f = DG_FMT_F32;
	int b = m->b, t = m->t;
	if (m->gm)
		a = dg_model_hidden_addr(m->gm, &f);
	else
		a = (uint64_t)(uintptr_t)dg_model_cpu_pass_hidden(m->pass, &b, &t);
	if (addr)
		*addr = a;
	if (fmt)
		*fmt = (int32_t)f;
	if (shape) {
		shape[0] = b;
		shape[1] = t;
		shape[2] = m->c.embd;
	}
	return DG_OK;
}

/* ---- bundles ------------------------------------------------------------------- */

#define MAX_KERNEL_FILE ((size_t)256 << 20) /* what the bundle loader reads */

dg_status dg_ffi_bundle_build(const char *out, const char *const *specs, int32_t n_specs,
			      const char *device, int32_t sm, int32_t jobs, const char *cache_dir,
			      int32_t no_cache, const char *tune_db, int32_t tuned,
			      dg_ffi_bundle_summary *summary, char *msg, size_t msg_size)
{
	dg_ffi_bundle_summary local;
	dg_bundle_summary sum;
	dg_spec *list = NULL;
	dg_tune_db *db = NULL;
	dg_status st = DG_OK;
	char why[4096];

	if (!summary)
		summary = &local;
	memset(summary, 0, sizeof(*summary));
	memset(&sum, 0, sizeof(sum));
	summary->step = DG_BUNDLE_STEP_ARGS;
	if (n_specs < 0 || (n_specs > 0 && !specs))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"dg_ffi_bundle_build: %d specs and %s list", (int)n_specs,
				specs ? "a" : "no");
	if (specs) {
		list = calloc(n_specs > 0 ? (size_t)n_specs : 1, sizeof(*list));
		if (!list)
			return dg__msgf(DG_ERR_NOMEM, msg, msg_size, "out of memory");
		for (int32_t i = 0; i < n_specs && !st; i++) {
			if (!specs[i])
				st = dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "specs[%d]: NULL", (int)i);
			else if ((st = dg_spec_parse(specs[i], &list[i], why, sizeof(why))))
				dg__msgf(st, msg, msg_size, "specs[%d]: %s", (int)i, why);
		}
	}
	if (!st && tune_db) {
		dg_tune_db_opts o;
		memset(&o, 0, sizeof(o));
		o.path = tune_db;
		if ((st = dg_tune_db_open(&db, &o)))
			dg__msgf(st, msg, msg_size, "out of memory reading the tuning DB");
	}
	if (!st) {
		dg_ctx_opts jit;
		memset(&jit, 0, sizeof(jit));
		jit.cache_dir = cache_dir;
		jit.no_cache = no_cache != 0;
		dg_bundle_opts o;
		memset(&o, 0, sizeof(o));
		o.out = out;
		o.specs = list;
		o.n_specs = specs ? (size_t)n_specs : 0;
		o.jobs = jobs;
		o.jit = &jit;
		o.tune_db = db;
		o.device = device;
		o.sm = sm;
		o.tuned = tuned != 0;
		st = dg_bundle_build(&o, &sum, msg, msg_size);
		summary->specs = (int64_t)sum.specs;
		summary->dropped = (int64_t)sum.dropped;
		summary->kernels = (int64_t)sum.kernels;
		summary->cache_hits = (int64_t)sum.cache_hits;
		summary->wall_ms = sum.wall_ms;
		summary->jobs = sum.jobs;
		summary->sm = sum.sm;
		summary->step = (int32_t)sum.step;
		snprintf(summary->device, sizeof(summary->device), "%s", sum.device);
		snprintf(summary->failed, sizeof(summary->failed), "%s", sum.failed);
	}
	dg_tune_db_close(db);
	free(list);
	return st;
}

/* n specs' canonical texts, each with a '\n', into buf (see ffi.h). */
static dg_status spec_lines(const char *const *texts, size_t n, char *buf, uint64_t size,
			    uint64_t *needed, int32_t *count, char *msg, size_t msg_size)
{
	uint64_t need = 1;
	for (size_t i = 0; i < n; i++)
		need += strlen(texts[i]) + 1;
	if (needed)
		*needed = need;
	if (count)
		*count = (int32_t)n;
	if (!buf || size < need)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"%llu bytes hold the %zu specs, the buffer has %llu",
				(unsigned long long)need, n, (unsigned long long)(buf ? size : 0));
	size_t at = 0;
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(texts[i]);
		memcpy(buf + at, texts[i], len);
		at += len;
		buf[at++] = '\n';
	}
	buf[at] = '\0';
	if (msg && msg_size)
		msg[0] = '\0';
	return DG_OK;
}

dg_status dg_ffi_bundle_default_specs(char *buf, uint64_t size, uint64_t *needed, int32_t *n,
				      char *msg, size_t msg_size)
{
	dg_spec *specs = NULL;
	size_t count = 0;

	dg_status st = dg_bundle_default_specs(&specs, &count, msg, msg_size);
	if (st)
		return st;
	char (*texts)[DG_SPEC_TEXT_MAX] = calloc(count ? count : 1, sizeof(*texts));
	const char **ptrs = calloc(count ? count : 1, sizeof(*ptrs));
	if (!texts || !ptrs) {
		st = dg__msgf(DG_ERR_NOMEM, msg, msg_size, "out of memory");
	} else {
		for (size_t i = 0; i < count; i++) {
			dg_spec_to_string(&specs[i], texts[i], sizeof(texts[i]));
			ptrs[i] = texts[i];
		}
		st = spec_lines(ptrs, count, buf, size, needed, n, msg, msg_size);
	}
	free(ptrs);
	free(texts);
	free(specs);
	return st;
}

dg_status dg_ffi_bundle_check(const char *dir, char *buf, uint64_t size, uint64_t *needed, int32_t *n,
			      char *msg, size_t msg_size)
{
	dg_manifest *m = NULL;
	char path[4096], why[1024];

	if (!dir)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_ffi_bundle_check: NULL folder");
	dg_status st = dg_manifest_load(dir, &m, msg, msg_size);
	if (st)
		return st;
	const char **specs = calloc(m->n_kernels ? m->n_kernels : 1, sizeof(*specs));
	if (!specs)
		st = dg__msgf(DG_ERR_NOMEM, msg, msg_size, "out of memory");
	for (size_t i = 0; i < m->n_kernels && !st; i++) {
		const dg_manifest_kernel *k = &m->kernels[i];
		uint8_t *bytes = NULL;
		size_t len = 0;
		specs[i] = k->spec;
		if (!dg__file_join(path, sizeof(path), dir, k->file)) {
			st = dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "%s: path too long", dir);
			break;
		}
		st = dg__file_read(path, MAX_KERNEL_FILE, &bytes, &len, why, sizeof(why));
		if (st)
			dg__msgf(st, msg, msg_size, "%s (listed in %s): %s", k->file, DG_MANIFEST_FILE, why);
		else if ((st = dg_manifest_kernel_verify(k, bytes, len, why, sizeof(why))))
			dg__msgf(st, msg, msg_size, "%s: %s", path, why);
		free(bytes);
	}
	if (!st)
		st = spec_lines(specs, m->n_kernels, buf, size, needed, n, msg, msg_size);
	free(specs);
	dg_manifest_destroy(m);
	return st;
}
