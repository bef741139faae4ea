/*
 * A training run's state and its checkpoints (dragon/checkpoint.h): one
 * safetensors file of the masters, AdamW's moments and the run's counters,
 * sealed and written atomically, read back exactly (floats as %.9g,
 * integers in decimal) once the whole file is checked (model_file.c), and
 * pruned to the newest k in a run's folder.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/msg.h"
#include "dragon/checkpoint.h"
#include "runtime/store/safetensors.h"
#include "runtime/train/model_int.h"

#define FORMAT "dragon-checkpoint-2"   /* sealed: the whole file's SHA-256 */
#define FORMAT_1 "dragon-checkpoint-1" /* its tensors' SHA-256 alone, if any */

void dg_train_state_destroy(dg_train_state *s)
{
	if (!s)
		return;
	dg_model_weights_destroy(s->weights);
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		free(s->m[p]);
		free(s->v[p]);
	}
	free(s);
}

/* A state of config c with zero moments and the weights' storage (not
 * filled: the caller copies or reads them). */
static dg_status state_alloc(const dg_model_config *c, bool weights, dg_train_state **out, char *msg,
			     size_t size)
{
	dg_train_state *s = calloc(1, sizeof(*s));
	if (!s)
		return dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory");
	dg_status st = weights ? dg__model_weights_alloc(c, &s->weights, msg, size) : DG_OK;
	for (int p = 0; !st && p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		size_t n = (size_t)dg_model_param_shape(c, (dg_model_param)p, &nd, sh);
		s->m[p] = calloc(n ? n : 1, sizeof(float));
		s->v[p] = calloc(n ? n : 1, sizeof(float));
		if (!s->m[p] || !s->v[p])
			st = dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory");
	}
	if (st) {
		dg_train_state_destroy(s);
		return st;
	}
	*out = s;
	return DG_OK;
}

/* A state of c for seed and opt: its moments zero, its weights zero
 * (weights) or not made (NULL: the caller's to give). */
static dg_status state_new(const dg_model_config *c, bool weights, uint64_t seed, const dg_adamw_config *opt,
			   dg_train_state **out, char *msg, size_t msg_size)
{
	dg_status st = dg_adamw_check(opt, msg, msg_size);
	if (st || (st = state_alloc(c, weights, out, msg, msg_size)))
		return st;
	dg_train_state *s = *out;
	s->seed = seed;
	dg_rng_seed(&s->data_rng, seed);
	s->opt = *opt;
	dg_loss_scaler_defaults(&s->scaler, false);
	return DG_OK;
}

dg_status dg_train_state_create(const dg_model_weights *w, uint64_t seed, const dg_adamw_config *opt,
				dg_train_state **out, char *msg, size_t msg_size)
{
	if (!w || !opt || !out)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_train_state_create: NULL argument");
	*out = NULL;
	dg_status st = state_new(&w->config, true, seed, opt, out, msg, msg_size);
	if (st)
		return st;
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		size_t n = (size_t)dg_model_param_shape(&w->config, (dg_model_param)p, &nd, sh);
		memcpy((*out)->weights->params[p], w->params[p], n * sizeof(float));
	}
	return DG_OK;
}

dg_status dg__train_state_adopt(dg_model_weights **w, uint64_t seed, const dg_adamw_config *opt,
				dg_train_state **out, char *msg, size_t msg_size)
{
	if (!w || !*w || !opt || !out)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg__train_state_adopt: NULL argument");
	*out = NULL;
	dg_status st = state_new(&(*w)->config, false, seed, opt, out, msg, msg_size);
	if (st)
		return st;
	(*out)->weights = *w;
	*w = NULL;
	return DG_OK;
}

/* ---- save ---------------------------------------------------------------------- */

static dg_status meta_u64(dg_safetensors_writer *sw, const char *k, uint64_t v, char *msg, size_t size)
{
	char t[32];
	snprintf(t, sizeof(t), "%" PRIu64, v);
	return dg_safetensors_writer_meta(sw, k, t, msg, size);
}

static dg_status meta_f(dg_safetensors_writer *sw, const char *k, float v, char *msg, size_t size)
{
	char t[32];
	snprintf(t, sizeof(t), "%.9g", (double)v);
	return dg_safetensors_writer_meta(sw, k, t, msg, size);
}

/* A writer of s's checkpoint into *out (free it with
 * dg_safetensors_writer_destroy). */
static dg_status writer_of(const dg_train_state *s, dg_safetensors_writer **out, char *msg, size_t msg_size)
{
	dg_safetensors_writer *sw;
	dg_status st = dg_safetensors_writer_create(&sw);
	if (st)
		return dg__msgf(st, msg, msg_size, "out of memory");
	st = dg__model_weights_add(sw, s->weights, msg, msg_size);
	const dg_model_config *c = &s->weights->config;
	char name[64];
	for (int p = 0; !st && p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		dg_model_param_shape(c, (dg_model_param)p, &nd, sh);
		snprintf(name, sizeof(name), "adamw.m.%s", dg_model_param_name((dg_model_param)p));
		st = dg_safetensors_writer_add(sw, name, DG_ST_F32, nd, sh, s->m[p], msg, msg_size);
		snprintf(name, sizeof(name), "adamw.v.%s", dg_model_param_name((dg_model_param)p));
		if (!st)
			st = dg_safetensors_writer_add(sw, name, DG_ST_F32, nd, sh, s->v[p], msg, msg_size);
	}
	const dg_adamw_config *o = &s->opt;
	if (!st)
		st = dg_safetensors_writer_meta(sw, "format", FORMAT, msg, msg_size);
	if (!st)
		st = dg_safetensors_writer_meta(sw, DG__KIND_KEY, DG__KIND_CHECKPOINT, msg, msg_size);
	if (!st)
		st = meta_f(sw, "dropout", c->dropout, msg, msg_size);
	if (!st)
		st = meta_u64(sw, "step", (uint64_t)s->step, msg, msg_size);
	if (!st)
		st = meta_u64(sw, "seed", s->seed, msg, msg_size);
	if (!st)
		st = meta_u64(sw, "data_pos", s->data_pos, msg, msg_size);
	if (!st)
		st = meta_u64(sw, "data_rng", s->data_rng.state, msg, msg_size);
	if (!st && s->time > 0)
		st = meta_u64(sw, "time", (uint64_t)s->time, msg, msg_size);
	if (!st && s->batch > 0)
		st = meta_u64(sw, "batch", (uint64_t)s->batch, msg, msg_size);
	if (!st && s->accum > 1)
		st = meta_u64(sw, "accum", (uint64_t)s->accum, msg, msg_size);
	if (!st && s->corpus_sha256[0])
		st = dg_safetensors_writer_meta(sw, "corpus_sha256", s->corpus_sha256, msg, msg_size);
	const struct {
		const char *k;
		float v;
	} fl[] = { { "adamw.lr", o->lr }, { "adamw.beta1", o->beta1 }, { "adamw.beta2", o->beta2 },
		   { "adamw.eps", o->eps }, { "adamw.weight_decay", o->weight_decay },
		   { "adamw.clip", o->clip }, { "adamw.lr_floor", o->lr_floor } };
	for (size_t i = 0; !st && i < sizeof(fl) / sizeof(fl[0]); i++)
		st = meta_f(sw, fl[i].k, fl[i].v, msg, msg_size);
	if (!st)
		st = meta_u64(sw, "adamw.warmup", (uint64_t)o->warmup, msg, msg_size);
	if (!st)
		st = meta_u64(sw, "adamw.steps", (uint64_t)o->steps, msg, msg_size);
	const dg_loss_scaler *ls = &s->scaler;
	const bool dyn = ls->mode == DG_LOSS_SCALE_DYNAMIC;
	if (!st)
		st = dg_safetensors_writer_meta(sw, "loss_scale", dyn ? "dynamic" : "off", msg, msg_size);
	if (!st && dyn)
		st = meta_f(sw, "loss_scale.value", ls->scale, msg, msg_size);
	if (!st && dyn)
		st = meta_u64(sw, "loss_scale.good_steps", ls->good_steps, msg, msg_size);
	if (!st && dyn)
		st = meta_u64(sw, "loss_scale.growth_interval", ls->growth_interval, msg, msg_size);
	if (!st)
		st = dg_safetensors_writer_seal(sw, DG__SEAL_KEY, msg, msg_size);
	if (st) {
		dg_safetensors_writer_destroy(sw);
		return st;
	}
	*out = sw;
	return DG_OK;
}

dg_status dg_checkpoint_save(const dg_train_state *s, const char *path, char *msg, size_t msg_size)
{
	if (!s || !path)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_checkpoint_save: NULL argument");
	dg_safetensors_writer *sw;
	dg_status st = writer_of(s, &sw, msg, msg_size);
	if (st)
		return st;
	st = dg_safetensors_writer_save(sw, path, msg, msg_size);
	dg_safetensors_writer_destroy(sw);
	return st;
}

dg_status dg_checkpoint_bytes(const dg_train_state *s, void **out, size_t *size, char *msg, size_t msg_size)
{
	if (!s || !out || !size)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_checkpoint_bytes: NULL argument");
	*out = NULL;
	*size = 0;
	dg_safetensors_writer *sw;
	dg_status st = writer_of(s, &sw, msg, msg_size);
	if (st)
		return st;
	st = dg_safetensors_writer_bytes(sw, out, size, msg, msg_size);
	dg_safetensors_writer_destroy(sw);
	return st;
}

/* ---- load ---------------------------------------------------------------------- */

static dg_status read_u64(const dg_safetensors *f, const char *path, const char *k, uint64_t *v,
			  char *msg, size_t size)
{
	const char *t = dg_safetensors_meta(f, k);
	if (!t)
		return dg__msgf(DG_ERR_PARSE, msg, size, "%s: not a checkpoint: no metadata %s", path, k);
	char *end;
	errno = 0;
	unsigned long long x = strtoull(t, &end, 10);
	if (errno || end == t || *end || t[0] == '-')
		return dg__msgf(DG_ERR_PARSE, msg, size, "%s: metadata %s='%s': not an unsigned integer", path,
				k, t);
	*v = (uint64_t)x;
	return DG_OK;
}

static dg_status read_f(const dg_safetensors *f, const char *path, const char *k, float *v, char *msg,
			size_t size)
{
	const char *t = dg_safetensors_meta(f, k);
	if (!t)
		return dg__msgf(DG_ERR_PARSE, msg, size, "%s: not a checkpoint: no metadata %s", path, k);
	char *end;
	errno = 0;
	float x = strtof(t, &end);
	if (errno || end == t || *end)
		return dg__msgf(DG_ERR_PARSE, msg, size, "%s: metadata %s='%s': not a number", path, k, t);
	*v = x;
	return DG_OK;
}

/* The loss scaler's metadata: absent (an older file) is "off". */
static dg_status read_scaler(const dg_safetensors *f, const char *path, dg_loss_scaler *ls, char *msg,
			     size_t size)
{
	dg_loss_scaler_defaults(ls, false);
	const char *mode = dg_safetensors_meta(f, "loss_scale");
	if (!mode || strcmp(mode, "off") == 0)
		return DG_OK;
	if (strcmp(mode, "dynamic") != 0)
		return dg__msgf(DG_ERR_PARSE, msg, size, "%s: metadata loss_scale='%s': want dynamic or off",
				path, mode);
	uint64_t good = 0, interval = 0;
	float scale = 0;
	dg_status st = read_f(f, path, "loss_scale.value", &scale, msg, size);
	if (!st)
		st = read_u64(f, path, "loss_scale.good_steps", &good, msg, size);
	if (!st)
		st = read_u64(f, path, "loss_scale.growth_interval", &interval, msg, size);
	if (st)
		return st;
	if (!(scale > 0.0f) || !isfinite(scale) || interval < 1 || interval > UINT32_MAX || good >= interval)
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"%s: loss scaler: scale %g, good_steps %" PRIu64 ", growth_interval %" PRIu64
				": want a finite scale > 0 and 0 <= good_steps < growth_interval",
				path, (double)scale, good, interval);
	*ls = (dg_loss_scaler){ .mode = DG_LOSS_SCALE_DYNAMIC, .growth_interval = (uint32_t)interval,
				.scale = scale, .good_steps = (uint32_t)good };
	return DG_OK;
}

/* The state of file f (path names it in messages), which every reader's
 * door has checked (dg__model_file_load: the seal, the kind, the values;
 * a damaged file says so before any of its values is read). */
static dg_status state_of(const dg_safetensors *f, const char *path, dg_train_state **out, char *msg,
			  size_t msg_size)
{
	*out = NULL;
	dg_status st;
	const char *fmt_ = dg_safetensors_meta(f, "format");
	const char *kind = dg_safetensors_meta(f, DG__KIND_KEY);
	const bool v2 = fmt_ && strcmp(fmt_, FORMAT) == 0, v1 = fmt_ && strcmp(fmt_, FORMAT_1) == 0;
	if ((!v1 && !v2) || (kind && strcmp(kind, DG__KIND_CHECKPOINT) != 0))
		return dg__msgf(DG_ERR_PARSE, msg, msg_size, "%s: not a checkpoint (format '%.64s', kind '%.64s'; want '%s', '%s')",
				path, fmt_ ? fmt_ : "(none)", kind ? kind : "(none)", FORMAT, DG__KIND_CHECKPOINT);
	if (v2 && !kind) /* a sealed format names its kind; the seal is checked */
		return dg__msgf(DG_ERR_CORRUPT, msg, msg_size,
				"%s: damaged: a %s without its %s; use an intact copy, or the checkpoint before it",
				path, FORMAT, DG__KIND_KEY);
	/* its config (a missing one: not a checkpoint, so DG_ERR_PARSE) */
	dg_model_config c;
	if ((st = dg__model_config_of(f, path, &c, msg, msg_size)))
		return st == DG_ERR_NOT_FOUND ? DG_ERR_PARSE : st;
	if ((st = read_f(f, path, "dropout", &c.dropout, msg, msg_size)))
		return st;
	char why[1024];
	if ((st = dg_model_config_check(&c, why, sizeof(why))))
		return dg__msgf(DG_ERR_PARSE, msg, msg_size, "%s: metadata: %s", path, why);
	/* every tensor there and of the config's shape before the state is
	 * made: a config cannot ask for more memory than the file holds */
	const dg_st_tensor *t[DG_MODEL_N_PARAMS][3];
	char name[64];
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		dg_model_param_shape(&c, (dg_model_param)p, &nd, sh);
		for (int k = 0; k < 3; k++) {
			snprintf(name, sizeof(name), "%s%s", k == 0 ? "" : k == 1 ? "adamw.m." : "adamw.v.",
				 dg_model_param_name((dg_model_param)p));
			if (dg_safetensors_expect(f, name, DG_ST_F32, nd, sh, &t[p][k], why, sizeof(why)))
				return dg__msgf(DG_ERR_PARSE, msg, msg_size, "%s: %s", path, why);
		}
	}
	dg_train_state *s = NULL;
	if ((st = state_alloc(&c, true, &s, msg, msg_size)))
		return st;
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		float *dst[3] = { s->weights->params[p], s->m[p], s->v[p] };
		for (int k = 0; k < 3; k++)
			memcpy(dst[k], t[p][k]->data, (size_t)t[p][k]->bytes);
	}
	uint64_t u[6];
	static const char *const uk[6] = { "step", "seed", "data_pos", "data_rng", "adamw.warmup",
					   "adamw.steps" };
	for (int i = 0; !st && i < 6; i++)
		st = read_u64(f, path, uk[i], &u[i], msg, msg_size);
	dg_adamw_config *o = &s->opt;
	/* the counters: a run's steps fit int64_t (at most 2^62), and it
	 * never goes past them (dg_adamw_check sees to warmup) */
	if (!st && (u[5] > ((uint64_t)1 << 62) || u[0] > u[5]))
		st = dg__msgf(DG_ERR_PARSE, msg, msg_size,
			      "%s: metadata step=%" PRIu64 " of adamw.steps=%" PRIu64
			      ": a run's step is at most its steps, at most 2^62",
			      path, u[0], u[5]);
	if (!st) {
		s->step = (int64_t)u[0];
		s->seed = u[1];
		s->data_pos = u[2];
		s->data_rng.state = u[3];
		o->warmup = (int64_t)u[4];
		o->steps = (int64_t)u[5];
		const struct {
			const char *k;
			float *v;
		} fl[] = { { "adamw.lr", &o->lr }, { "adamw.beta1", &o->beta1 }, { "adamw.beta2", &o->beta2 },
			   { "adamw.eps", &o->eps }, { "adamw.weight_decay", &o->weight_decay },
			   { "adamw.clip", &o->clip }, { "adamw.lr_floor", &o->lr_floor } };
		for (size_t i = 0; !st && i < sizeof(fl) / sizeof(fl[0]); i++)
			st = read_f(f, path, fl[i].k, fl[i].v, msg, msg_size);
	}
	/* the run's T: optional (files saved before it was written lack it) */
	if (!st && dg_safetensors_meta(f, "time")) {
		uint64_t tt = 0;
		st = read_u64(f, path, "time", &tt, msg, msg_size);
		if (!st && (tt < 1 || tt > INT32_MAX))
			st = dg__msgf(DG_ERR_PARSE, msg, msg_size, "%s: metadata time=%" PRIu64 ": not a length",
				      path, tt);
		if (!st)
			s->time = (int)tt;
	}
	/* the run's B and corpus: optional as T */
	if (!st && dg_safetensors_meta(f, "batch")) {
		uint64_t b = 0;
		st = read_u64(f, path, "batch", &b, msg, msg_size);
		if (!st && (b < 1 || b > INT32_MAX))
			st = dg__msgf(DG_ERR_PARSE, msg, msg_size, "%s: metadata batch=%" PRIu64 ": not a batch",
				      path, b);
		if (!st)
			s->batch = (int)b;
	}
	/* the run's micro-batches a step: written when above 1 */
	if (!st && dg_safetensors_meta(f, "accum")) {
		uint64_t k = 0;
		st = read_u64(f, path, "accum", &k, msg, msg_size);
		if (!st && (k < 1 || k > INT32_MAX))
			st = dg__msgf(DG_ERR_PARSE, msg, msg_size, "%s: metadata accum=%" PRIu64 ": not a count",
				      path, k);
		if (!st)
			s->accum = (int)k;
	}
	const char *corpus = st ? NULL : dg_safetensors_meta(f, "corpus_sha256");
	if (corpus && (strlen(corpus) != 64 || strspn(corpus, "0123456789abcdef") != 64))
		st = dg__msgf(DG_ERR_PARSE, msg, msg_size, "%s: metadata corpus_sha256='%.80s': not a SHA-256",
			      path, corpus);
	else if (corpus)
		memcpy(s->corpus_sha256, corpus, 65);
	if (!st)
		st = read_scaler(f, path, &s->scaler, msg, msg_size);
	if (!st && (st = dg_adamw_check(o, why, sizeof(why))))
		st = dg__msgf(DG_ERR_PARSE, msg, msg_size, "%s: %s", path, why);
	if (st) {
		dg_train_state_destroy(s);
		return st;
	}
	*out = s;
	return DG_OK;
}

dg_status dg_checkpoint_load(const char *path, dg_train_state **out, char *msg, size_t msg_size)
{
	if (!path || !out)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_checkpoint_load: NULL argument");
	*out = NULL;
	dg_safetensors *f = NULL;
	dg_status st = dg__model_file_load(path, &f, msg, msg_size);
	if (!st) /* else the file: missing, unreadable, damaged, not weights */
		st = state_of(f, path, out, msg, msg_size);
	dg_safetensors_destroy(f);
	return st;
}

dg_status dg_checkpoint_parse(const void *bytes, size_t size, const char *name, dg_train_state **out,
			      char *msg, size_t msg_size)
{
	if (!out || (!bytes && size))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_checkpoint_parse: NULL argument");
	*out = NULL;
	if (!name)
		name = "checkpoint";
	dg_safetensors *f = NULL;
	dg_status st = dg__model_file_parse(bytes, size, name, &f, msg, msg_size);
	if (!st)
		st = state_of(f, name, out, msg, msg_size);
	dg_safetensors_destroy(f);
	return st;
}

/* ---- resume, files ------------------------------------------------------------- */

dg_status dg_checkpoint_match(const dg_train_state *s, const dg_model_config *c,
			      const dg_adamw_config *opt, uint32_t loss_scale, char *msg,
			      size_t msg_size)
{
	if (!s || !c || !opt)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_checkpoint_match: NULL argument");
	const dg_model_config *h = &s->weights->config;
	const struct {
		const char *k;
		int have, want;
	} ints[] = { { "layers", h->layers, c->layers }, { "embd", h->embd, c->embd },
		     { "heads", h->heads, c->heads }, { "neurons", h->neurons, c->neurons },
		     { "vocab", h->vocab, c->vocab } };
	for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
		if (ints[i].have != ints[i].want)
			return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
					"%s: the checkpoint's %d, this run's %d", ints[i].k, ints[i].have,
					ints[i].want);
	if (strcmp(h->preset, c->preset) != 0)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "preset: the checkpoint's '%s', this run's '%s'",
				h->preset, c->preset);
	const dg_adamw_config *o = &s->opt;
	const struct {
		const char *k;
		double have, want;
	} fl[] = { { "dropout", h->dropout, c->dropout }, { "lr", o->lr, opt->lr },
		   { "beta1", o->beta1, opt->beta1 }, { "beta2", o->beta2, opt->beta2 },
		   { "eps", o->eps, opt->eps }, { "weight_decay", o->weight_decay, opt->weight_decay },
		   { "clip", o->clip, opt->clip }, { "lr_floor", o->lr_floor, opt->lr_floor },
		   { "warmup", (double)o->warmup, (double)opt->warmup },
		   { "steps", (double)o->steps, (double)opt->steps } };
	for (size_t i = 0; i < sizeof(fl) / sizeof(fl[0]); i++)
		if (fl[i].have != fl[i].want)
			return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "%s: the checkpoint's %.9g, this run's %.9g",
					fl[i].k, fl[i].have, fl[i].want);
	if ((s->scaler.mode != DG_LOSS_SCALE_OFF) != (loss_scale != DG_LOSS_SCALE_OFF))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"loss_scale: the checkpoint's %s, this run's %s (--loss-scale)",
				s->scaler.mode ? "dynamic" : "off", loss_scale ? "dynamic" : "off");
	return DG_OK;
}

void dg_checkpoint_path(const char *dir, int64_t step, char *out, size_t size)
{
	snprintf(out, size, "%s/ckpt-%08" PRId64 ".safetensors", dir, step);
}

/* The step of a checkpoint's file name, or -1 for any other name. */
static int64_t step_of(const char *name)
{
	const char *pre = "ckpt-", *suf = ".safetensors";
	size_t n = strlen(name), lp = strlen(pre), ls = strlen(suf);
	if (n <= lp + ls || strncmp(name, pre, lp) != 0 || strcmp(name + n - ls, suf) != 0)
		return -1;
	int64_t v = 0;
	for (size_t i = lp; i < n - ls; i++) {
		if (name[i] < '0' || name[i] > '9' || v > INT64_MAX / 10 - 9)
			return -1;
		v = v * 10 + (name[i] - '0');
	}
	return v;
}

typedef struct found {
	int64_t step;   /* of the checkpoint, or of the one a temp file was for */
	bool temp;      /* a dead save's temp file */
	char name[256];
} found;

/* Whether name is the temp file of a checkpoint's save that is no longer
 * running: its writer (the pid in its name) is gone, or is this process,
 * which never prunes while it saves. A pid the system reports alive (a
 * live writer, or one the pid was reused by) keeps its file; a later
 * prune takes it. If so, its checkpoint's step into *step. */
static bool dead_temp(const char *name, int64_t *step)
{
	size_t n;
	long pid;
	char target[256];
	if (!dg_safetensors_temp_of(name, &n, &pid) || n >= sizeof(target))
		return false;
	memcpy(target, name, n);
	target[n] = '\0';
	int64_t s = step_of(target);
	if (s < 0)
		return false;
	bool dead = pid == (long)getpid() || pid <= 0 || pid > INT_MAX ||
		    (kill((pid_t)pid, 0) != 0 && errno == ESRCH);
	if (dead)
		*step = s;
	return dead;
}

static int cmp_desc(const void *a, const void *b)
{
	const found *p = a, *q = b;
	if (p->temp != q->temp)
		return p->temp - q->temp; /* temp files last */
	return (p->step < q->step) - (p->step > q->step);
}

dg_status dg_checkpoint_prune(const char *dir, int keep, int64_t *latest, char *msg, size_t msg_size)
{
	if (latest)
		*latest = -1;
	DIR *d = opendir(dir);
	if (!d)
		return dg__msgf(errno == ENOENT ? DG_ERR_NOT_FOUND : DG_ERR_IO, msg, msg_size, "%s: %s", dir,
				strerror(errno));
	found *fs = NULL;
	size_t n = 0, cap = 0;
	dg_status st = DG_OK;
	size_t temps = 0;
	for (struct dirent *e; (e = readdir(d));) {
		int64_t s = step_of(e->d_name);
		bool temp = s < 0 && dead_temp(e->d_name, &s);
		if (s < 0 || strlen(e->d_name) >= sizeof(fs->name))
			continue;
		if (n == cap) {
			size_t nc = cap ? 2 * cap : 16;
			found *nf = realloc(fs, nc * sizeof(*nf));
			if (!nf) {
				st = dg__msgf(DG_ERR_NOMEM, msg, msg_size, "out of memory");
				break;
			}
			fs = nf;
			cap = nc;
		}
		fs[n].step = s;
		fs[n].temp = temp;
		temps += temp;
		snprintf(fs[n].name, sizeof(fs[n].name), "%s", e->d_name);
		n++;
	}
	closedir(d);
	if (!st && n) {
		/* the checkpoints newest first, then the dead temp files */
		qsort(fs, n, sizeof(*fs), cmp_desc);
		size_t ckpts = n - temps;
		if (latest && ckpts)
			*latest = fs[0].step;
		char path[4096];
		/* past the newest `keep`: the older checkpoints and every temp */
		for (size_t i = keep > 0 && (size_t)keep < ckpts ? (size_t)keep : ckpts; i < n && !st; i++) {
			snprintf(path, sizeof(path), "%s/%s", dir, fs[i].name);
			if (unlink(path) && errno != ENOENT)
				st = dg__msgf(DG_ERR_IO, msg, msg_size, "%s: remove: %s", path, strerror(errno));
		}
	}
	free(fs);
	return st;
}
