/*
 * The BDH model's config, presets and weights (dragon/model.h): the
 * recipes by name, the checks a config passes, the reference's parameter
 * names and shapes, initialization, and weights in safetensors files.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/msg.h"
#include "base/pool.h"
#include "base/size.h"
#include "dragon/model.h"
#include "dragon/rng.h"
#include "runtime/store/safetensors.h"
#include "runtime/train/model_int.h"

static dg_proj_recipe recipe(dg_fmt weight, dg_fmt act, dg_scale_gran ws, dg_scale_gran as)
{
	dg_proj_recipe r = { weight, act, ws, as, false };
	return r;
}

dg_status dg_model_preset(const char *name, dg_model_config *c, char *msg, size_t msg_size)
{
	memset(c, 0, sizeof(*c));
	c->layers = 6;
	c->embd = 256;
	c->heads = 4;
	c->neurons = 8192;
	c->vocab = 256;
	c->dropout = 0.1f;
	c->ln_eps = 1e-5f;
	c->save = DG_SAVE_DEVICE;
	c->precision = DG_FMT_F32;
	dg_proj_recipe fp = recipe(DG_FMT_F32, DG_FMT_F32, DG_SCALE_TENSOR, DG_SCALE_TENSOR);
	if (!name || strcmp(name, "f32") == 0) {
		c->encoder = c->encoder_v = c->decoder = fp;
	} else if (strcmp(name, "bf16") == 0) {
		c->encoder = c->encoder_v = c->decoder =
			recipe(DG_FMT_BF16, DG_FMT_BF16, DG_SCALE_TENSOR, DG_SCALE_TENSOR);
		c->precision = DG_FMT_BF16;
	} else if (strcmp(name, "w8a8") == 0) {
		c->encoder = c->encoder_v = recipe(DG_FMT_INT8, DG_FMT_INT8, DG_SCALE_CHANNEL, DG_SCALE_TOKEN);
		/* the decoder reads the gate's post-ReLU product: unsigned codes */
		c->decoder = recipe(DG_FMT_INT8, DG_FMT_UINT8POS, DG_SCALE_CHANNEL, DG_SCALE_TOKEN);
		c->precision = DG_FMT_BF16;
	} else if (strcmp(name, "bitnet") == 0) {
		c->encoder = c->encoder_v = recipe(DG_FMT_TERNARY, DG_FMT_INT8, DG_SCALE_TENSOR, DG_SCALE_TOKEN);
		c->decoder = recipe(DG_FMT_TERNARY, DG_FMT_UINT8POS, DG_SCALE_TENSOR, DG_SCALE_TOKEN);
		c->precision = DG_FMT_BF16;
	} else if (strcmp(name, "seed") == 0) {
		c->encoder = c->encoder_v = recipe(DG_FMT_INT8, DG_FMT_INT8, DG_SCALE_TENSOR, DG_SCALE_TENSOR);
		c->decoder = recipe(DG_FMT_INT8, DG_FMT_UINT8POS, DG_SCALE_TENSOR, DG_SCALE_TENSOR);
		c->encoder.absmean = c->encoder_v.absmean = c->decoder.absmean = true;
		c->precision = DG_FMT_BF16;
	} else {
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"preset %s: unknown; presets are f32, bf16, w8a8, bitnet, seed", name);
	}
	snprintf(c->preset, sizeof(c->preset), "%s", name ? name : "f32");
	return DG_OK;
}

static dg_status check_recipe(const char *what, const dg_proj_recipe *r, char *msg, size_t size)
{
	unsigned w_ok = DG_FMT_BIT(DG_FMT_F32) | DG_FMT_BIT(DG_FMT_BF16) | DG_FMT_BIT(DG_FMT_INT8) |
			DG_FMT_BIT(DG_FMT_TERNARY) | DG_FMT_BIT(DG_FMT_SIGN1);
	unsigned a_ok = DG_FMT_BIT(DG_FMT_F32) | DG_FMT_BIT(DG_FMT_BF16) | DG_FMT_BIT(DG_FMT_INT8) |
			DG_FMT_BIT(DG_FMT_INT4) | DG_FMT_BIT(DG_FMT_UINT8POS);
	char fl[96];
	if ((unsigned)r->weight >= DG_FMT__COUNT || !(w_ok & DG_FMT_BIT(r->weight)))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "%s.weight=%s: one of %s", what,
				dg_fmt_name(r->weight), dg_fmt_list(w_ok, fl, sizeof(fl)));
	if ((unsigned)r->act >= DG_FMT__COUNT || !(a_ok & DG_FMT_BIT(r->act)))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "%s.act=%s: one of %s", what,
				dg_fmt_name(r->act), dg_fmt_list(a_ok, fl, sizeof(fl)));
	if (r->wscale == DG_SCALE_TOKEN)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size,
				"%s.wscale=token: a weight's scale is per tensor or per output channel", what);
	if (r->ascale == DG_SCALE_CHANNEL)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size,
				"%s.ascale=channel: an activation's scale is per tensor or per token", what);
	return DG_OK;
}

dg_status dg_model_config_check(const dg_model_config *c, char *msg, size_t size)
{
	dg_status st;

	if (!c)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "config is NULL");
	if (c->layers < 1 || c->layers > 256)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "layers=%d: must be 1 to 256", c->layers);
	if (c->heads < 1 || c->heads > 64)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "heads=%d: must be 1 to 64", c->heads);
	if (c->embd < 4 || c->embd > 65536 || c->embd % 4)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size,
				"embd=%d: must be a multiple of 4 from 4 to 65536", c->embd);
	if (c->neurons < 4 || c->neurons > DG_MODEL_MAX_NEURONS || c->neurons % 4)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size,
				"neurons=%d: must be a multiple of 4 (RoPE pairs, packed codes) up to %d a head",
				c->neurons, DG_MODEL_MAX_NEURONS);
	/* K = H·N: the decoder's reduction, a row of its copies (int32 counts
	 * of a head's rows in the kernels) */
	if ((int64_t)c->heads * c->neurons > DG_MODEL_MAX_HN)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size,
				"heads=%d, neurons=%d: H·N = %lld, the decoder's K, must be at most 2^20 (%d)",
				c->heads, c->neurons, (long long)c->heads * c->neurons, DG_MODEL_MAX_HN);
	if (c->vocab < 2 || c->vocab > DG_MODEL_MAX_VOCAB)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "vocab=%d: must be 2 to %d (the kernels' token ids)",
				c->vocab, DG_MODEL_MAX_VOCAB);
	if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dropout=%g: must be in [0, 1)",
				(double)c->dropout);
	if (!isfinite(c->thr_x) || !isfinite(c->thr_y))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "thr_x, thr_y: must be finite");
	if (!(c->ln_eps > 0.0f))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "ln_eps=%g: must be positive",
				(double)c->ln_eps);
	if ((st = check_recipe("encoder", &c->encoder, msg, size)) ||
	    (st = check_recipe("encoder_v", &c->encoder_v, msg, size)) ||
	    (st = check_recipe("decoder", &c->decoder, msg, size)))
		return st;
	if (c->precision != DG_FMT_F32 && c->precision != DG_FMT_BF16)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "precision=%s: f32 or bf16",
				dg_fmt_name(c->precision));
	return DG_OK;
}

/* ---- parameters ---------------------------------------------------------------- */

int64_t dg_model_param_shape(const dg_model_config *c, dg_model_param p, int *ndim,
			     int64_t shape[3])
{
	int64_t H = c->heads, D = c->embd, N = c->neurons, V = c->vocab;
	switch (p) {
	case DG_PARAM_EMBED:
		*ndim = 2, shape[0] = V, shape[1] = D;
		return V * D;
	case DG_PARAM_ENCODER:
	case DG_PARAM_ENCODER_V:
		*ndim = 3, shape[0] = H, shape[1] = D, shape[2] = N;
		return H * D * N;
	case DG_PARAM_DECODER:
		*ndim = 2, shape[0] = H * N, shape[1] = D;
		return H * N * D;
	case DG_PARAM_LM_HEAD:
		*ndim = 2, shape[0] = D, shape[1] = V;
		return D * V;
	}
	*ndim = 0;
	return 0;
}

double dg_model_flops_per_token(const dg_model_config *c, int t)
{
	const double L = c->layers, D = c->embd, H = c->heads, N = c->neurons, V = c->vocab;
	const double keys = t > 1 ? (double)(t - 1) / 2 : 0; /* a query's, on average */
	const double layer = 2 * D * H * N       /* encoder */
			     + 2 * D * H * N     /* encoder_v */
			     + 2 * H * N * D     /* decoder */
			     + 2 * H * N * keys  /* qr·qrᵀ */
			     + 2 * H * D * keys; /* scores·x */
	const double forward = L * layer + 2 * D * V; /* + lm_head */
	return 3 * forward;                           /* the backward: twice the forward */
}

void dg_model_weights_destroy(dg_model_weights *w)
{
	if (!w)
		return;
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++)
		free(w->params[p]);
	free(w);
}

dg_status dg__model_weights_alloc(const dg_model_config *c, dg_model_weights **out, char *msg,
				  size_t size)
{
	dg_status st = dg_model_config_check(c, msg, size);
	if (st)
		return st;
	dg_model_weights *w = calloc(1, sizeof(*w));
	if (!w)
		return dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory");
	w->config = *c;
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		int64_t n = dg_model_param_shape(c, (dg_model_param)p, &nd, sh);
		w->params[p] = calloc((size_t)n, sizeof(float));
		if (!w->params[p]) {
			dg_model_weights_destroy(w);
			return dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory: %s (%lld floats)",
					dg_model_param_name((dg_model_param)p), (long long)n);
		}
	}
	*out = w;
	return DG_OK;
}

int dg__env_switch(const char *name)
{
	const char *e = getenv(name);
	if (e && strcmp(e, "1") == 0)
		return 1;
	return e && strcmp(e, "0") == 0 ? 0 : -1;
}

dg_status dg__memory_budget(size_t *bytes, char *why, size_t why_size)
{
	*bytes = 0;
	const char *e = getenv("DRAGON_MEMORY");
	if (!e || !*e)
		return DG_OK;
	if (dg__parse_size(e, bytes) == DG_OK)
		return DG_OK;
	*bytes = 0;
	return dg__msgf(DG_ERR_INVALID_ARG, why, why_size,
			"DRAGON_MEMORY=%s: not a size (bytes, or a number with K, M, G or T: 4G, 3.5GiB)", e);
}

dg__rec_mode dg__recompute_env(void)
{
	const char *e = getenv("DRAGON_RECOMPUTE");
	if (!e)
		return DG__REC_AUTO;
	if (strcmp(e, "0") == 0)
		return DG__REC_NONE;
	if (strcmp(e, "ys") == 0)
		return DG__REC_YS;
	return strcmp(e, "1") == 0 || strcmp(e, "all") == 0 ? DG__REC_ALL : DG__REC_AUTO;
}

/* ---- the initial weights: normal(0, 0.02), on every core ----------------
 *
 * By Box-Muller, two values a pair of draws of splitmix64 seeded with the
 * seed: the parameters in order, parameter p's pair k (values 2k, 2k + 1;
 * the last pair of an odd count keeps one) taking the stream's pairs from
 * where the parameters before it ended. splitmix64's state after j draws is
 * seed + j·γ, so a pair's draws are computed where it lies: the threads
 * take chunks of pairs, and every value is the same bits as one thread
 * drawing in order (1.0B parameters: 23 s on one core). */
#define INIT_CHUNK (1 << 16) /* pairs a chunk */
#define INIT_THREADS_MAX 64
#define SPLITMIX_GAMMA 0x9e3779b97f4a7c15ull

typedef struct init_work {
	dg_model_weights *w;
	uint64_t seed;
	int64_t n[DG_MODEL_N_PARAMS];     /* values of each parameter */
	int64_t first[DG_MODEL_N_PARAMS]; /* its first pair in the stream */
	int64_t chunks[DG_MODEL_N_PARAMS + 1]; /* chunks before parameter p */
	_Atomic int64_t next;             /* the next chunk to take */
} init_work;

static void init_chunk(const init_work *iw, int p, int64_t k0, int64_t k1)
{
	float *v = iw->w->params[p];
	const int64_t n = iw->n[p];
	dg_rng rng = { .state = iw->seed + 2 * (uint64_t)(iw->first[p] + k0) * SPLITMIX_GAMMA };
	for (int64_t k = k0; k < k1; k++) {
		double u1 = ((double)(dg_rng_u64(&rng) >> 11) + 1.0) / 9007199254740993.0;
		double u2 = (double)(dg_rng_u64(&rng) >> 11) / 9007199254740992.0;
		double r = sqrt(-2.0 * log(u1)), a = 2.0 * M_PI * u2;
		v[2 * k] = (float)(0.02 * r * cos(a));
		if (2 * k + 1 < n)
			v[2 * k + 1] = (float)(0.02 * r * sin(a));
	}
}

static void *init_worker(void *arg)
{
	init_work *iw = arg;
	const int64_t total = iw->chunks[DG_MODEL_N_PARAMS];
	for (int64_t c; (c = atomic_fetch_add(&iw->next, 1)) < total;) {
		int p = 0;
		while (iw->chunks[p + 1] <= c)
			p++;
		const int64_t pairs = (iw->n[p] + 1) / 2, k0 = (c - iw->chunks[p]) * INIT_CHUNK;
		init_chunk(iw, p, k0, k0 + INIT_CHUNK < pairs ? k0 + INIT_CHUNK : pairs);
	}
	return NULL;
}

dg_status dg_model_weights_create(const dg_model_config *c, uint64_t seed,
				  dg_model_weights **out, char *msg, size_t size)
{
	dg_model_weights *w;
	dg_status st = dg__model_weights_alloc(c, &w, msg, size);
	if (st)
		return st;
	init_work iw = { .w = w, .seed = seed };
	atomic_init(&iw.next, 0);
	int64_t pairs = 0;
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		iw.n[p] = dg_model_param_shape(c, (dg_model_param)p, &nd, sh);
		iw.first[p] = pairs;
		pairs += (iw.n[p] + 1) / 2;
		iw.chunks[p + 1] = iw.chunks[p] + ((iw.n[p] + 1) / 2 + INIT_CHUNK - 1) / INIT_CHUNK;
	}
	int64_t n = dg__pool_cores(INIT_THREADS_MAX);
	dg__pool_run(init_worker, &iw, (int)(n < iw.chunks[DG_MODEL_N_PARAMS] ? n : iw.chunks[DG_MODEL_N_PARAMS]));
	*out = w;
	return DG_OK;
}

dg_status dg_model_weights_load(const dg_model_config *c, const char *path,
				dg_model_weights **out, char *msg, size_t size)
{
	dg_safetensors *f = NULL;
	dg_model_weights *w = NULL;
	const dg_st_tensor *t[DG_MODEL_N_PARAMS];
	char why[1024];

	*out = NULL;
	dg_status st = dg__model_file_load(path, &f, msg, size);
	if (st)
		return st;
	st = dg_model_config_check(c, msg, size);
	/* every tensor there and of c's shape before c's storage is made: a
	 * config of the header's cannot ask for more than the file holds */
	for (int p = 0; !st && p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		dg_model_param_shape(c, (dg_model_param)p, &nd, sh);
		st = dg_safetensors_expect(f, dg_model_param_name((dg_model_param)p), DG_ST_F32, nd, sh, &t[p], why, sizeof(why));
		if (st)
			dg__msgf(st, msg, size, "%s: %s", path, why);
	}
	if (!st)
		st = dg__model_weights_alloc(c, &w, msg, size);
	for (int p = 0; !st && p < DG_MODEL_N_PARAMS; p++)
		memcpy(w->params[p], t[p]->data, (size_t)t[p]->bytes);
	dg_safetensors_destroy(f);
	if (st) {
		dg_model_weights_destroy(w);
		return st;
	}
	*out = w;
	return DG_OK;
}

dg_status dg__model_weights_add(dg_safetensors_writer *sw, const dg_model_weights *w, char *msg,
				size_t size)
{
	char text[32];
	dg_status st = DG_OK;
	const dg_model_config *c = &w->config;
	for (int p = 0; !st && p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		dg_model_param_shape(c, (dg_model_param)p, &nd, sh);
		st = dg_safetensors_writer_add(sw, dg_model_param_name((dg_model_param)p), DG_ST_F32, nd, sh, w->params[p], msg,
					       size);
	}
	const struct {
		const char *k;
		int v;
	} ints[] = { { "layers", c->layers }, { "embd", c->embd }, { "heads", c->heads },
		     { "neurons", c->neurons }, { "vocab", c->vocab } };
	for (size_t i = 0; !st && i < sizeof(ints) / sizeof(ints[0]); i++) {
		snprintf(text, sizeof(text), "%d", ints[i].v);
		st = dg_safetensors_writer_meta(sw, ints[i].k, text, msg, size);
	}
	if (!st && c->preset[0])
		st = dg_safetensors_writer_meta(sw, "preset", c->preset, msg, size);
	return st;
}

/* w's file of kind (weights, gradients): its tensors, its config, its
 * kind and its seal, written atomically. */
static dg_status save_as(const dg_model_weights *w, const char *path, const char *kind, char *msg,
			 size_t size)
{
	if (!w || !path)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "saving weights: NULL argument");
	dg_safetensors_writer *sw;
	dg_status st = dg_safetensors_writer_create(&sw);
	if (st)
		return dg__msgf(st, msg, size, "out of memory");
	st = dg__model_weights_add(sw, w, msg, size);
	if (!st)
		st = dg_safetensors_writer_meta(sw, DG__KIND_KEY, kind, msg, size);
	if (!st)
		st = dg_safetensors_writer_seal(sw, DG__SEAL_KEY, msg, size);
	if (!st)
		st = dg_safetensors_writer_save(sw, path, msg, size);
	dg_safetensors_writer_destroy(sw);
	return st;
}

dg_status dg_model_weights_save(const dg_model_weights *w, const char *path, char *msg,
				size_t size)
{
	return save_as(w, path, DG__KIND_WEIGHTS, msg, size);
}

dg_status dg_model_grads_save(const dg_model_weights *g, const char *path, char *msg, size_t size)
{
	return save_as(g, path, DG__KIND_GRADIENTS, msg, size);
}

/* The integer metadata value of key into *v: 1 done, 0 absent, -1 not
 * an integer (reported). */
static int meta_int(const dg_safetensors *f, const char *path, const char *key, int *v,
		    char *msg, size_t size)
{
	const char *text = dg_safetensors_meta(f, key);
	if (!text)
		return 0;
	char *end;
	long x = strtol(text, &end, 10);
	if (!*text || *end || x < 0 || x > (1L << 30)) {
		dg__msgf(DG_ERR_PARSE, msg, size, "%s: metadata %s=\"%s\": expected an integer", path,
			 key, text);
		return -1;
	}
	*v = (int)x;
	return 1;
}

dg_status dg_model_config_read(const char *path, dg_model_config *out, char *msg, size_t size)
{
	dg_safetensors *f = NULL;
	dg_status st = dg__model_file_load(path, &f, msg, size);
	if (!st)
		st = dg__model_config_of(f, path, out, msg, size);
	dg_safetensors_destroy(f);
	return st;
}

dg_status dg__model_config_of(const dg_safetensors *f, const char *path, dg_model_config *out,
			      char *msg, size_t size)
{
	const char *preset = dg_safetensors_meta(f, "preset");
	char why[256];
	dg_status st = dg_model_preset(preset ? preset : "f32", out, why, sizeof(why));
	if (st)
		return dg__msgf(DG_ERR_PARSE, msg, size, "%s: metadata preset: %s", path, why);
	struct {
		const char *k;
		int *v;
		bool required;
	} ints[] = { { "layers", &out->layers, true }, { "embd", &out->embd, true },
		     { "heads", &out->heads, true }, { "neurons", &out->neurons, true },
		     { "vocab", &out->vocab, false } };
	char missing[64] = "";
	for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
		int got = meta_int(f, path, ints[i].k, ints[i].v, msg, size);
		if (got < 0)
			return DG_ERR_PARSE;
		if (!got && ints[i].required) {
			size_t n = strlen(missing);
			snprintf(missing + n, sizeof(missing) - n, "%s%s", n ? ", " : "", ints[i].k);
		}
	}
	if (missing[0])
		return dg__msgf(DG_ERR_NOT_FOUND, msg, size,
				"%s: no dragon config in its metadata (missing %s)", path, missing);
	if ((st = dg_model_config_check(out, why, sizeof(why))))
		return dg__msgf(DG_ERR_PARSE, msg, size, "%s: metadata: %s", path, why);
	return DG_OK;
}

const dg_proj_recipe *dg__proj_recipe(const dg_model_config *c, dg_proj p)
{
	return p == DG_PROJ_ENCODER ? &c->encoder : p == DG_PROJ_ENCODER_V ? &c->encoder_v : &c->decoder;
}

const char *dg__proj_name(dg_proj p)
{
	return p == DG_PROJ_ENCODER ? "encoder" : p == DG_PROJ_ENCODER_V ? "encoder_v" : "decoder";
}

const char *dg__model_lowbit_why(const dg_model_config *c, char *buf, size_t size)
{
	for (int i = 0; i < DG_PROJ__COUNT; i++) {
		const dg_proj_recipe *r = dg__proj_recipe(c, i);
		if (!dg_fmt_is_code(r->weight) || !dg_fmt_is_code(r->act)) {
			snprintf(buf, size, "%s: weight=%s act=%s: a recipe is all float (f32, bf16) or all integer",
				 dg__proj_name(i), dg_fmt_name(r->weight), dg_fmt_name(r->act));
			return buf;
		}
		if (r->ascale != DG_SCALE_TOKEN || r->absmean) {
			snprintf(buf, size, "%s.ascale=%s: the GPU model quantizes activations a scale a token (absmax)",
				 dg__proj_name(i), dg_scale_name(r->ascale));
			return buf;
		}
	}
	return NULL;
}
