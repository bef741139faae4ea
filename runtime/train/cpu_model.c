/*
 * The BDH model on the CPU references (dragon/model.h dg_model_cpu_step):
 * the forward dragon/model.h writes, every layer's activations kept, and
 * the backward in reverse — the oracle the GPU model is checked against,
 * and a model CI can check by finite differences at tiny sizes.
 *
 * It runs the step's tape (runtime/train/bdh_tape.c, the one the GPU
 * model runs) on host arenas planned from it, each node by the references
 * that check the GPU kernels (dg_ref_lowrank_fwd, dg_ref_decoder_fwd and
 * their gradients, ...), on the execution layouts the kernels read: the
 * encoders as (H, N, D), K-major along D, the decoder as (D, H·N). The
 * masters keep the reference's layouts ([H, D, N] and [H·N, D]); the copies
 * are made once a step, as the optimizer will write the low-bit copies,
 * and the weight gradients are turned back. The layers share their
 * weights, so each weight's gradient is one GEMM over every layer's rows.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/msg.h"
#include "dragon/model.h"
#include "runtime/ref/ref_ops.h"
#include "dragon/spec.h"
#include "runtime/train/bdh_tape.h"
#include "runtime/train/model_int.h"

/* The step's context: the tape, its host arenas and the batch. */
typedef struct step {
	const dg_model_config *c;
	const dg_model_batch *batch;
	dg__tape t;
	dg__bdh_ids id;
	int B, T, H, D, N, V;
	int64_t bt;
	bool lowbit; /* a low-bit recipe, fake-quantized (dequantized f32) */
	char *arena[DG__B__COUNT];
	double loss;
} step;

static float *F(step *s, int id)
{
	return (float *)(s->arena[dg__tape_arena_of(&s->t, id)] + dg__tape_offset(&s->t, id));
}

static int32_t *I(step *s, int id)
{
	return (int32_t *)F(s, id);
}

/* The gate's first element in the global batch's (B,H,T,N) tensor: a
 * data-parallel rank draws the masks of its rows there (dg_model_batch). */
static uint64_t elem0_of(const step *s)
{
	return (uint64_t)s->batch->row0 * (uint64_t)s->H * (uint64_t)s->T * (uint64_t)s->N;
}

/* enc [H, D, N] → (H, N, D); dec [H·N, D] → (D, H·N); and back. */
static void to_hnd(const float *src, float *dst, int H, int D, int N)
{
	for (int h = 0; h < H; h++)
		for (int d = 0; d < D; d++)
			for (int n = 0; n < N; n++)
				dst[((int64_t)h * N + n) * D + d] = src[((int64_t)h * D + d) * N + n];
}

static void from_hnd(const float *src, float *dst, int H, int D, int N)
{
	for (int h = 0; h < H; h++)
		for (int d = 0; d < D; d++)
			for (int n = 0; n < N; n++)
				dst[((int64_t)h * D + d) * N + n] = src[((int64_t)h * N + n) * D + d];
}

static void transpose(const float *src, float *dst, int64_t rows, int64_t cols)
{
	for (int64_t r = 0; r < rows; r++)
		for (int64_t c = 0; c < cols; c++)
			dst[c * rows + r] = src[r * cols + c];
}

/* A float spec of op at heads H, embd D, latent N (the CPU model's and
 * its decoder's: every op f32, relu with its threshold or none). */
dg_spec dg__cpu_fspec(dg_op op, int H, int D, int N, int in_heads, float thr, bool relu)
{
	dg_spec sp;
	dg_spec_init(&sp, op);
	sp.heads = H;
	sp.in_heads = in_heads;
	sp.embd = D;
	sp.latent = N;
	sp.weight = DG_FMT_F32;
	sp.act = DG_FMT_F32;
	sp.out = DG_FMT_F32;
	sp.relu = relu;
	sp.relu_thr = relu ? thr : 0.0f;
	return sp;
}

/* A float spec of op for the step's shape. */
static dg_spec fspec(const step *s, dg_op op, int in_heads, float thr, bool relu)
{
	return dg__cpu_fspec(op, (int)s->H, (int)s->D, (int)s->N, in_heads, thr, relu);
}

/* Rows of a buffer of last dimension d. */
static int64_t rows_of(const step *s, int id, int d)
{
	const dg__tbuf *b = &s->t.bufs[id];
	int64_t n = 1;
	for (int i = 0; i < b->ndim; i++)
		n *= b->shape[i];
	return n / d;
}

/* B of a buffer (B', H, T, ·): the stacked ones have layers·B. */
static int batch_of(const step *s, int id)
{
	return (int)s->t.bufs[id].shape[0];
}

static dg_status run_node(step *s, const dg__tnode *nd, char *msg, size_t size)
{
	const dg_model_config *c = s->c;
	const dg_model_batch *bt = s->batch;
	const int *in = nd->in, *out = nd->out;
	const float eps = c->ln_eps;
	int64_t bad = 0;
	dg_status st = DG_OK;

	switch (nd->kind) {
	case DG__N_EMBED:
		st = dg_ref_embed_fwd(F(s, in[0]), s->V, s->D, I(s, in[1]), s->bt, F(s, out[0]), &bad);
		if (st)
			return dg__msgf(st, msg, size, "idx[%lld] = %d: outside the vocabulary 0..%d",
					(long long)bad, bt->idx[bad], s->V - 1);
		return DG_OK;
	case DG__N_LN:
		dg_ref_layernorm_fwd(F(s, in[0]), rows_of(s, in[0], s->D), s->D, eps, F(s, out[0]),
				     NULL, F(s, out[1]));
		return DG_OK;
	case DG__N_PROJ: {
		const bool v = nd->arg == DG_PROJ_ENCODER_V; /* else the encoder */
		dg_spec sp = fspec(s, DG_OP_LOWRANK_FWD, v ? s->H : 1, v ? c->thr_y : c->thr_x, true);
		dg_ref_lowrank_args a = { .x = F(s, in[0]), .w = F(s, in[1]), .sa = 1, .sw = 1,
					  .so = 1, .out = F(s, out[0]), .batch = s->B, .time = s->T };
		return dg_ref_lowrank_fwd(&sp, &a);
	}
	case DG__N_ATTN: {
		int64_t bh = (int64_t)s->B * s->H;
		float *qr = F(s, out[1]);
		dg_ref_rope_fwd(F(s, in[0]), F(s, in[2]), F(s, in[3]), bh, s->T, s->N, qr);
		dg_ref_attention_fwd(qr, F(s, in[1]), s->B, s->H, s->T, s->N, s->D, F(s, out[0]));
		return DG_OK;
	}
	case DG__N_GATE:
		dg_ref_gate_fwd(F(s, in[0]), F(s, in[1]), s->bt * s->H * s->N,
				bt->train ? c->dropout : 0.0f, bt->seed, bt->step, (uint32_t)nd->layer, elem0_of(s),
				F(s, out[0]));
		return DG_OK;
	case DG__N_DEC: {
		dg_spec sp = fspec(s, DG_OP_DECODER_FWD, 1, 0, false);
		dg_ref_decoder_args a = { .y = F(s, in[0]), .w = F(s, in[1]), .sa = 1, .sw = 1,
					  .out = F(s, out[0]), .batch = s->B, .time = s->T };
		return dg_ref_decoder_fwd(&sp, &a);
	}
	case DG__N_RESID_LN: {
		float *sum = malloc((size_t)s->bt * s->D * sizeof(float) + 4);
		if (!sum)
			return DG_ERR_NOMEM;
		const float *x = F(s, in[0]), *y = F(s, in[1]);
		for (int64_t i = 0; i < s->bt * s->D; i++)
			sum[i] = x[i] + y[i];
		dg_ref_layernorm_fwd(sum, s->bt, s->D, eps, F(s, out[0]), NULL, F(s, out[1]));
		free(sum);
		return DG_OK;
	}
	case DG__N_CE:
		st = dg_ref_lmhead_ce(F(s, in[0]), F(s, in[1]), I(s, in[2]), s->bt, s->D, s->V, &s->loss,
				      NULL, NULL, false, &bad);
		if (st)
			return dg__msgf(st, msg, size, "targets[%lld] = %d: outside the vocabulary 0..%d",
					(long long)bad, bt->targets[bad], s->V - 1);
		*F(s, out[0]) = (float)s->loss;
		return DG_OK;
	case DG__N_QUANT: {
		/* fake quantization: the recipe's codes a scale a token,
		 * dequantized (x (B,1,T,D) a token (b,t); a (B,H,T,D) a row
		 * (b,h,t); xy (B,H,T,N) a token (b,t) over every head) */
		const dg_proj_recipe *r = dg__proj_recipe(c, nd->arg);
		size_t Bq = (size_t)s->B, G = 1, C = (size_t)s->D;
		if (nd->arg == DG_PROJ_ENCODER_V)
			Bq *= (size_t)s->H;
		if (nd->arg == DG_PROJ_DECODER) {
			G = (size_t)s->H;
			C = (size_t)s->N;
		}
		size_t n = Bq * G * (size_t)s->T * C;
		uint8_t *q = malloc(n + 1);
		float *sc = malloc(Bq * (size_t)s->T * sizeof(float) + 4);
		if (!q || !sc) {
			free(q);
			free(sc);
			return DG_ERR_NOMEM;
		}
		const float *x = F(s, in[0]);
		st = dg_ref_quantize_act_rows(DG_FMT_F32, r->act, x, Bq, G, (size_t)s->T, C, q, sc);
		float *o = F(s, out[0]);
		for (size_t b = 0; !st && b < Bq; b++)
			for (size_t g = 0; g < G; g++)
				for (size_t t = 0; t < (size_t)s->T; t++) {
					size_t base = ((b * G + g) * (size_t)s->T + t) * C;
					float sv = sc[b * (size_t)s->T + t];
					for (size_t k = 0; k < C; k++) {
						int code = r->act == DG_FMT_UINT8POS ? q[base + k]
										     : (int8_t)q[base + k];
						o[base + k] = (float)code * sv;
					}
				}
		free(q);
		free(sc);
		return st;
	}
	case DG__N_CE_BWD: {
		double l;
		return dg_ref_lmhead_ce(F(s, in[0]), F(s, in[1]), I(s, in[2]), s->bt, s->D, s->V, &l,
					F(s, out[0]), F(s, out[1]), false, NULL);
	}
	case DG__N_LN_BWD:
		dg_ref_layernorm_bwd(F(s, in[0]), F(s, in[1]), F(s, in[2]), rows_of(s, in[0], s->D),
				     s->D, F(s, out[0]), false);
		return DG_OK;
	case DG__N_DEC_IN: {
		dg_spec sp = fspec(s, DG_OP_DECODER_GRAD_INPUT, 1, 0, false);
		return dg_ref_decoder_grad_input(&sp, F(s, in[0]), F(s, in[1]), 1, F(s, out[0]), s->B,
						 s->T);
	}
	case DG__N_GATE_BWD: {
		int64_t n = s->bt * s->H * s->N;
		float *dys = F(s, out[1]);
		const float *ys = F(s, in[2]);
		dg_ref_gate_bwd(F(s, in[0]), F(s, in[1]), ys, n, bt->train ? c->dropout : 0.0f,
				bt->seed, bt->step, (uint32_t)nd->layer, elem0_of(s), F(s, out[0]), dys);
		for (int64_t i = 0; i < n; i++) /* ys = relu(a·enc_v − t_y): its mask */
			if (!(ys[i] > 0.0f))
				dys[i] = 0.0f;
		return DG_OK;
	}
	case DG__N_PROJ_IN: {
		dg_spec sp = fspec(s, DG_OP_LOWRANK_GRAD_INPUT, nd->arg == DG_PROJ_ENCODER_V ? s->H : 1, 0,
				   false);
		return dg_ref_lowrank_grad_input(&sp, F(s, in[0]), F(s, in[1]), 1, F(s, out[0]), s->B,
						 s->T);
	}
	case DG__N_ATTN_BWD: {
		int64_t n = s->bt * s->H * s->N;
		float *dqr = malloc((size_t)n * sizeof(float) + 4), *dr = malloc((size_t)n * sizeof(float) + 4);
		if (!dqr || !dr) {
			free(dqr);
			free(dr);
			return DG_ERR_NOMEM;
		}
		dg_ref_attention_bwd(F(s, in[0]), F(s, in[1]), F(s, in[2]), s->B, s->H, s->T, s->N,
				     s->D, dqr, F(s, out[1]));
		dg_ref_rope_bwd(dqr, F(s, s->id.cos), F(s, s->id.sin), (int64_t)s->B * s->H, s->T,
				s->N, dr);
		/* xs = relu(x·enc − t_x) feeds the gate and RoPE: both gradients, masked */
		float *dxs = F(s, out[0]);
		const float *xs = F(s, in[3]);
		for (int64_t i = 0; i < n; i++)
			dxs[i] = xs[i] > 0.0f ? dxs[i] + dr[i] : 0.0f;
		free(dqr);
		free(dr);
		return DG_OK;
	}
	case DG__N_ADD3: {
		const float *a = F(s, in[0]), *b = F(s, in[1]), *d = F(s, in[2]);
		float *o = F(s, out[0]);
		for (int64_t i = 0; i < s->bt * s->D; i++)
			o[i] = a[i] + b[i] + d[i];
		return DG_OK;
	}
	case DG__N_PROJ_W: {
		/* a layer's share: the backward's first writes, the others add */
		dg_spec sp = fspec(s, DG_OP_LOWRANK_GRAD_WEIGHT, nd->arg == DG_PROJ_ENCODER_V ? s->H : 1, 0,
				   false);
		const bool adds = dg__bdh_grad_adds(&s->t, nd);
		const int64_t n = (int64_t)s->H * s->N * s->D;
		float *o = F(s, out[0]), *part = adds ? malloc((size_t)n * sizeof(float)) : o;
		if (!part)
			return dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory");
		dg_status gs = dg_ref_lowrank_grad_weight(&sp, F(s, in[0]), F(s, in[1]), 1, part,
							  batch_of(s, in[0]), s->T);
		for (int64_t i = 0; adds && !gs && i < n; i++)
			o[i] += part[i];
		if (adds)
			free(part);
		return gs;
	}
	case DG__N_DEC_W: {
		dg_spec sp = fspec(s, DG_OP_DECODER_GRAD_WEIGHT, 1, 0, false);
		return dg_ref_decoder_grad_weight(&sp, F(s, in[0]), F(s, in[1]), 1, F(s, out[0]),
						  batch_of(s, in[0]), s->T);
	}
	case DG__N_EMBED_BWD: {
		int64_t nv = (int64_t)s->V * s->D;
		float *g = F(s, out[0]);
		memset(g, 0, (size_t)nv * sizeof(float));
		dg_ref_embed_bwd(F(s, in[0]), s->D, I(s, in[1]), s->bt, g);
		return DG_OK;
	}
	case DG__N_TO_MASTER:
		if (nd->arg == DG_PARAM_DECODER)
			transpose(F(s, in[0]), F(s, out[0]), s->D, (int64_t)s->H * s->N);
		else
			from_hnd(F(s, in[0]), F(s, out[0]), s->H, s->D, s->N);
		return DG_OK;
	default:
		return dg__msgf(DG_ERR_INTERNAL, msg, size, "cpu model: node kind %d has no CPU form",
				(int)nd->kind);
	}
}

/* The recipes the CPU model runs: f32, or a low-bit one fake-quantized
 * (integer weights, integer activations a scale a token: the GPU's); NULL,
 * else why not. */
static const char *cpu_recipe(const dg_model_config *c, bool *lowbit)
{
	char why[256];
	bool f32 = true, ints = dg__model_lowbit_why(c, why, sizeof(why)) == NULL;
	for (int i = 0; i < DG_PROJ__COUNT; i++) {
		const dg_proj_recipe *r = dg__proj_recipe(c, i);
		f32 = f32 && r->weight == DG_FMT_F32 && r->act == DG_FMT_F32;
	}
	*lowbit = !f32 && ints;
	if (f32 || ints)
		return NULL;
	return "the CPU model runs f32 recipes and integer ones with activations a scale a token "
	       "(fake-quantized); others on the GPU";
}

/* The CPU model's tape target: f32 throughout, the recipe's fake-quantized
 * codes (lowbit), and recompute only when DRAGON_RECOMPUTE asks for it,
 * 1 (xs and ys) or ys (memory is no constraint here; the switch lets the
 * tests compare the forms). */
static dg__bdh_target cpu_target(bool lowbit)
{
	const dg__rec_mode rec = dg__recompute_env();
	return (dg__bdh_target){ .gpu = false, .act = DG_FMT_F32, .lowbit = lowbit,
				 .recompute = rec == DG__REC_ALL, .recompute_ys = rec == DG__REC_YS };
}

/* Execution copy w of projection k (f32, the kernels' layout) replaced
 * by its recipe's dequantized codes: int8 a scale a channel (a row), else
 * a scale a tensor (runtime/ref/ref_ops.h's quantizers). */
static dg_status fake_weight(const dg_model_config *c, dg_proj k, float *w)
{
	const dg_proj_recipe *r = dg__proj_recipe(c, k);
	const int H = c->heads, D = c->embd, N = c->neurons;
	size_t cols = k == DG_PROJ_DECODER ? (size_t)H * N : (size_t)D;
	size_t n = (size_t)H * N * D, rows = n / cols;
	int8_t *q = malloc(n + 1);
	float *sc = malloc(rows * sizeof(float) + 4);
	dg_status st = q && sc ? DG_OK : DG_ERR_NOMEM;
	if (!st && r->wscale == DG_SCALE_CHANNEL)
		st = dg_ref_quantize_weight_rows(r->weight, w, rows, cols, q, sc);
	else if (!st) {
		st = dg_ref_quantize_weight(r->weight, w, n, q, sc);
		for (size_t i = 1; i < rows; i++)
			sc[i] = sc[0];
	}
	for (size_t i = 0; !st && i < n; i++)
		w[i] = (float)q[i] * sc[i / cols];
	free(q);
	free(sc);
	return st;
}

const char *dg__cpu_recipe(const dg_model_config *c, bool *lowbit)
{
	return cpu_recipe(c, lowbit);
}

dg_status dg__cpu_exec_copies(const dg_model_weights *w, bool lowbit, float *const exec[DG_PROJ__COUNT])
{
	const dg_model_config *c = &w->config;
	const int H = c->heads, D = c->embd, N = c->neurons;
	to_hnd(w->params[DG_PARAM_ENCODER], exec[DG_PROJ_ENCODER], H, D, N);
	to_hnd(w->params[DG_PARAM_ENCODER_V], exec[DG_PROJ_ENCODER_V], H, D, N);
	transpose(w->params[DG_PARAM_DECODER], exec[DG_PROJ_DECODER], (int64_t)H * N, D);
	dg_status st = DG_OK;
	for (int k = 0; lowbit && k < DG_PROJ__COUNT && !st; k++)
		st = fake_weight(c, (dg_proj)k, exec[k]);
	return st;
}

bool dg_model_cpu_runs(const dg_model_config *c)
{
	bool lowbit;
	return c && !cpu_recipe(c, &lowbit);
}

static void step_free(step *s)
{
	for (int k = 0; k < DG__B__COUNT; k++)
		free(s->arena[k]);
	dg__tape_free(&s->t);
}

dg_status dg_model_cpu_memory(const dg_model_config *c, int b, int t, dg_model_memory *out,
			      char *msg, size_t size)
{
	dg__tape tp;
	dg__bdh_ids id;
	dg_status st;

	if (!c || !out)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_model_cpu_memory: NULL argument");
	if ((st = dg_model_config_check(c, msg, size)))
		return st;
	if (b < 1 || t < 1)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "batch %dx%d: B and T must be at least 1",
				b, t);
	dg__tape_init(&tp, c, b, t);
	bool lowbit = false;
	if (cpu_recipe(c, &lowbit))
		lowbit = false;
	const dg__bdh_target tg = cpu_target(lowbit);
	st = dg__bdh_tape_build(&tp, &id, &tg);
	if (!st)
		st = dg__tape_plan(&tp);
	if (!st)
		dg__tape_report(&tp, out);
	dg__tape_free(&tp);
	return st ? dg__msgf(st, msg, size, "the step's tape: %s", dg_status_str(st)) : DG_OK;
}

/* The bytes this process may still allocate, and where that figure is
 * from: $DRAGON_CPU_MEMORY, else MemAvailable (or the free pages), the
 * cgroup v2 limit's room when less. 0: unknown (nothing is refused). */
static double mem_available(const char **from)
{
	const char *env = getenv("DRAGON_CPU_MEMORY");
	if (env && *env) {
		char *end;
		errno = 0;
		unsigned long long v = strtoull(env, &end, 10);
		if (!errno && end != env && !*end && env[0] != '-') {
			*from = "$DRAGON_CPU_MEMORY";
			return (double)v;
		}
	}
	double avail = 0;
	unsigned long long kb = 0, max = 0, cur = 0;
	char line[256];
	FILE *f = fopen("/proc/meminfo", "r");
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
			avail = 1024.0 * (double)kb;
			*from = "MemAvailable";
			break;
		}
	if (f)
		fclose(f);
	if (avail <= 0) {
		long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
		if (pages > 0 && page > 0) {
			avail = (double)pages * (double)page;
			*from = "free memory";
		}
	}
	FILE *m = fopen("/sys/fs/cgroup/memory.max", "r"), *c = fopen("/sys/fs/cgroup/memory.current", "r");
	if (m && c && fscanf(m, "%llu", &max) == 1 && fscanf(c, "%llu", &cur) == 1) {
		double room = max > cur ? (double)(max - cur) : 0.0;
		if (avail <= 0 || room < avail) {
			avail = room;
			*from = "the cgroup's memory.max";
		}
	}
	if (m)
		fclose(m);
	if (c)
		fclose(c);
	return avail;
}

/* n bytes as "12.3 GB" (decimal units). */
static const char *bytes_str(double n, char *buf, size_t size)
{
	static const char *const unit[] = { "B", "kB", "MB", "GB", "TB", "PB", "EB" };
	int u = 0;
	while (n >= 1000.0 && u < 6) {
		n /= 1000.0;
		u++;
	}
	snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", n, unit[u]);
	return buf;
}

dg_status dg_model_cpu_fits(const dg_model_config *c, int b, int t, int copies, size_t *need, char *msg,
			    size_t size)
{
	if (need)
		*need = 0;
	if (!c)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_model_cpu_fits: NULL argument");
	dg_status st = dg_model_config_check(c, msg, size);
	if (st)
		return st;
	if (b < 1 || t < 1)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "batch %dx%d: B and T must be at least 1", b, t);
	/* in double: a shape past what the tape's sizes count is refused
	 * before it is planned */
	const double L = c->layers, D = c->embd, H = c->heads, N = c->neurons, V = c->vocab, B = b, T = t;
	const double n = B * T * H * N; /* a (B, H, T, N) activation's elements */
	const double params = 4.0 * (V * D * 2 + 2 * H * D * N + H * N * D);
	const double scratch[] = {
		2 * 4 * n + 8 * (T * T + T * (N + D)), /* the attention backward: dqr, dr; (T, T) scores */
		4 * L * n + 8 * D * H * N,             /* the decoder's weight gradient: every layer's xy */
		n + 4 * B * H * T,                     /* an activation's codes and scales */
		8 * V * (D + 1),                       /* the loss's logits and lm_head gradient */
	};
	double most = 0;
	int big = 0;
	for (int i = 0; i < (int)(sizeof(scratch) / sizeof(scratch[0])); i++)
		if (scratch[i] > most) {
			most = scratch[i];
			big = i;
		}
	double arenas = 4 * params + 4 * 8 * L * n; /* the bound past which the plan is not asked */
	if (arenas < 0x1p52) {
		dg_model_memory m;
		if ((st = dg_model_cpu_memory(c, b, t, &m, msg, size)))
			return st;
		arenas = (double)m.total;
	}
	const double own = params * (copies > 0 ? copies : 0);
	const double total = arenas + most + own;
	if (need)
		*need = total < 0x1p63 ? (size_t)total : SIZE_MAX;
	const char *from = "";
	const double avail = mem_available(&from);
	if (avail <= 0 || total <= avail)
		return DG_OK;
	static const char *const what[] = { "the attention backward's (T, T) scores",
					    "the decoder's weight gradient over every layer",
					    "an activation's quantized codes", "the loss's logits" };
	char a[32], s1[32], s2[32], s3[32], s4[32];
	const bool scr = most >= arenas && most >= own;
	return dg__msgf(DG_ERR_NOMEM, msg, size,
			"the CPU model at batch %d x time %d (layers %d, embd %d, heads %d, neurons %d) needs about "
			"%s: %s the step's arenas, %s %s, %s the weights' copies; %s is available (%s): use a "
			"smaller --batch, --time or --neurons%s",
			b, t, c->layers, c->embd, c->heads, c->neurons, bytes_str(total, s1, sizeof(s1)),
			bytes_str(arenas, s2, sizeof(s2)), bytes_str(most, s3, sizeof(s3)), what[big],
			bytes_str(own, s4, sizeof(s4)), bytes_str(avail, a, sizeof(a)), from,
			scr && big == 0 ? " (the scores grow as T squared)" : "");
}

/* Checks w and batch, records the tape, allocates its arenas and fills
 * the masters, their execution copies, the batch and the RoPE tables into
 * s (step_free frees it, on failure too). The batch's targets may be NULL
 * (the logits read none): then they are neither checked nor copied. */
static dg_status step_open(step *s, const dg_model_weights *w, const dg_model_batch *batch,
			   const char *fn, char *msg, size_t size)
{
	dg_status st;

	memset(s, 0, sizeof(*s));
	if (!w || !batch || !batch->idx)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "%s: NULL argument", fn);
	const dg_model_config *c = &w->config;
	if ((st = dg_model_config_check(c, msg, size)))
		return st;
	const char *no = cpu_recipe(c, &s->lowbit);
	if (no)
		return dg__msgf(DG_ERR_UNSUPPORTED, msg, size, "preset %s: %s",
				c->preset[0] ? c->preset : "(custom)", no);
	if (batch->b < 1 || batch->t < 1)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "batch %dx%d: B and T must be at least 1",
				batch->b, batch->t);
	s->c = c;
	s->batch = batch;
	s->B = batch->b, s->T = batch->t, s->H = c->heads, s->D = c->embd, s->N = c->neurons, s->V = c->vocab;
	s->bt = (int64_t)s->B * s->T;
	for (int64_t i = 0; batch->targets && i < s->bt; i++)
		if (batch->targets[i] < 0 || batch->targets[i] >= s->V)
			return dg__msgf(DG_ERR_INVALID_ARG, msg, size,
					"targets[%lld] = %d: outside the vocabulary 0..%d", (long long)i,
					batch->targets[i], s->V - 1);
	dg__tape_init(&s->t, c, s->B, s->T);
	const dg__bdh_target tg = cpu_target(s->lowbit);
	st = dg__bdh_tape_build(&s->t, &s->id, &tg);
	if (!st)
		st = dg__tape_plan(&s->t);
	for (int k = 0; !st && k < DG__B__COUNT; k++)
		if (s->t.arena[k] && !(s->arena[k] = calloc(1, s->t.arena[k])))
			st = DG_ERR_NOMEM;
	if (st)
		return dg__msgf(st, msg, size, "the step's tape and arenas: %s", dg_status_str(st));
	/* the masters, their execution copies, the batch, the RoPE tables */
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++)
		memcpy(F(s, s->id.params[p]), w->params[p], s->t.bufs[s->id.params[p]].bytes);
	float *const exec[DG_PROJ__COUNT] = { F(s, s->id.exec[DG_PROJ_ENCODER]),
					      F(s, s->id.exec[DG_PROJ_ENCODER_V]),
					      F(s, s->id.exec[DG_PROJ_DECODER]) };
	st = dg__cpu_exec_copies(w, s->lowbit, exec);
	memcpy(I(s, s->id.tokens), batch->idx, (size_t)s->bt * sizeof(int32_t));
	if (batch->targets)
		memcpy(I(s, s->id.targets), batch->targets, (size_t)s->bt * sizeof(int32_t));
	dg_ref_rope_table(s->T, s->N, F(s, s->id.cos), F(s, s->id.sin));
	return st ? dg__msgf(st, msg, size, "the execution copies: %s", dg_status_str(st)) : DG_OK;
}

/* Nodes [start, end) of s's tape, those of kind `skip` left out; before
 * each, the batch's stop flag. */
static dg_status step_run(step *s, int start, int end, int skip, char *msg, size_t size)
{
	dg_status st = DG_OK;
	const volatile sig_atomic_t *stop = s->batch->stop;
	for (int n = start; n < end && !st; n++) {
		if ((int)s->t.nodes[n].kind == skip)
			continue;
		if (stop && *stop)
			return dg__msgf(DG_ERR_INTERRUPTED, msg, size, "stopped before the step's op %d of %d (%s)",
					n + 1, end, dg__nkind_name(s->t.nodes[n].kind));
		st = run_node(s, &s->t.nodes[n], msg, size);
		if (st && !(msg && msg[0]))
			dg__msgf(st, msg, size, "a reference refused the model's shapes (%s)",
				 dg_status_str(st));
	}
	return st;
}

dg_status dg_model_cpu_step(const dg_model_weights *w, const dg_model_batch *batch,
			    double *loss, dg_model_weights *grads, char *msg, size_t size)
{
	step s;
	if (!loss || (batch && !batch->targets)) {
		memset(&s, 0, sizeof(s));
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_model_cpu_step: NULL argument");
	}
	dg_status st = step_open(&s, w, batch, "dg_model_cpu_step", msg, size);
	if (!st)
		st = step_run(&s, 0, grads ? s.t.n_nodes : s.t.n_forward, -1, msg, size);
	if (!st) {
		*loss = s.loss;
		if (grads)
			for (int p = 0; p < DG_MODEL_N_PARAMS; p++)
				memcpy(grads->params[p], F(&s, s.id.grads[p]), s.t.bufs[s.id.grads[p]].bytes);
	}
	step_free(&s);
	return st;
}

dg_status dg_model_cpu_logits(const dg_model_weights *w, const dg_model_batch *batch, int pos,
			      float *out, char *msg, size_t size)
{
	step s;
	if (!out || (batch && (pos < 0 || pos >= batch->t))) {
		memset(&s, 0, sizeof(s));
		if (!out)
			return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_model_cpu_logits: NULL argument");
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "pos %d: outside the batch's positions 0..%d",
				pos, batch->t - 1);
	}
	/* the forward without dropout, up to x_final (the loss left out) */
	dg_model_batch b = batch ? *batch : (dg_model_batch){ 0 };
	b.train = false;
	dg_status st = step_open(&s, w, batch ? &b : NULL, "dg_model_cpu_logits", msg, size);
	if (!st)
		st = step_run(&s, 0, s.t.n_forward, DG__N_CE, msg, size);
	/* x_final (B,1,T,D) at pos · lm_head [D, V], summed in double as the
	 * loss's reference sums them */
	const float *lm = st ? NULL : F(&s, s.id.params[DG_PARAM_LM_HEAD]);
	for (int r = 0; lm && r < s.B; r++) {
		const float *x = F(&s, s.id.x_final) + ((int64_t)r * s.T + pos) * s.D;
		for (int v = 0; v < s.V; v++) {
			double z = 0.0;
			for (int k = 0; k < s.D; k++)
				z += (double)x[k] * lm[(int64_t)k * s.V + v];
			out[(int64_t)r * s.V + v] = (float)z;
		}
	}
	step_free(&s);
	return st;
}

/* ---- the step in two halves ----------------------------------------------- */

struct dg_model_cpu_pass {
	step s;
	dg_model_config c;    /* the weights' config (s.c points here) */
	dg_model_batch batch; /* the forward's (s.batch points here): its tokens
			       * the arena's, its stop flag NULL */
	bool backward;        /* the backward may run: a forward with targets,
			       * its backward not run yet */
};

dg_status dg_model_cpu_forward(const dg_model_weights *w, const dg_model_batch *batch, double *loss,
			       dg_model_cpu_pass **out, char *msg, size_t size)
{
	if (!w || !batch || !batch->idx || !out)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_model_cpu_forward: NULL argument");
	*out = NULL;
	dg_model_cpu_pass *p = calloc(1, sizeof(*p));
	if (!p)
		return dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory");
	p->c = w->config;
	p->batch = *batch;
	dg_status st = step_open(&p->s, w, &p->batch, "dg_model_cpu_forward", msg, size);
	if (!st) {
		p->s.c = &p->c;
		st = step_run(&p->s, 0, p->s.t.n_forward, batch->targets ? -1 : DG__N_CE, msg, size);
	}
	if (st) {
		dg_model_cpu_pass_destroy(p);
		return st;
	}
	/* from here on the pass reads its own copies: the caller's tokens and
	 * stop flag may go */
	p->batch.idx = I(&p->s, p->s.id.tokens);
	p->batch.targets = batch->targets ? I(&p->s, p->s.id.targets) : NULL;
	p->batch.stop = NULL;
	p->backward = batch->targets != NULL;
	if (loss)
		*loss = batch->targets ? p->s.loss : 0.0;
	*out = p;
	return DG_OK;
}

dg_status dg_model_cpu_backward(dg_model_cpu_pass *p, dg_model_weights *grads, char *msg, size_t size)
{
	if (!p || !grads)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_model_cpu_backward: NULL argument");
	if (!p->backward)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "%s",
				p->batch.targets ? "the pass's backward has run already (run its forward again)"
						 : "a forward without targets has no backward (no loss)");
	if (grads->config.heads != p->c.heads || grads->config.embd != p->c.embd ||
	    grads->config.neurons != p->c.neurons || grads->config.vocab != p->c.vocab)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_model_cpu_backward: grads of another config");
	dg_status st = step_run(&p->s, p->s.t.n_forward, p->s.t.n_nodes, -1, msg, size);
	p->backward = false; /* run or failed half-way: the gradient arena is spent */
	if (st)
		return st;
	for (int q = 0; q < DG_MODEL_N_PARAMS; q++)
		memcpy(grads->params[q], F(&p->s, p->s.id.grads[q]), p->s.t.bufs[p->s.id.grads[q]].bytes);
	return DG_OK;
}

const float *dg_model_cpu_pass_hidden(const dg_model_cpu_pass *p, int *b, int *t)
{
	if (!p)
		return NULL;
	if (b)
		*b = p->s.B;
	if (t)
		*t = p->s.T;
	return (const float *)(p->s.arena[dg__tape_arena_of(&p->s.t, p->s.id.x_final)] +
			       dg__tape_offset(&p->s.t, p->s.id.x_final));
}

void dg_model_cpu_pass_destroy(dg_model_cpu_pass *p)
{
	if (!p)
		return;
	step_free(&p->s);
	free(p);
}
