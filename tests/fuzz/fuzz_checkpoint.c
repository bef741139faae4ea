/*
 * libFuzzer target: the checkpoint reader as a whole (dg_checkpoint_parse:
 * the safetensors header, the metadata, the tensors, the seal) and the
 * check every reader of weights makes (dg_model_file_check).
 *
 * Each input is read as it is — a mutation almost always breaks the seal,
 * so this exercises the seal's check — and, when its header holds a seal
 * where the writer writes one, once more sealed again by this target's
 * own SHA-256 of it, so that mutations of the metadata and the tensors
 * reach the readers behind the seal.
 *
 * Any bytes must load or be refused with DG_ERR_PARSE, DG_ERR_CORRUPT,
 * DG_ERR_NUMERIC or DG_ERR_NOMEM and a message that names the input,
 * never crash, hang or leak. A state that loads holds what the readers
 * promise: a config dg_model_config_check takes, an optimizer
 * dg_adamw_check takes, a step within the run's steps, every weight and
 * moment finite and every second moment >= 0; dg_model_file_check takes
 * the same bytes; and written again (dg_checkpoint_bytes) it loads to the
 * same state, byte for byte.
 *
 * Seeds: tests/fuzz/corpus/checkpoint/, made by checkpoint_seeds.c.
 */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/sha256.h"
#include "dragon/checkpoint.h"
#include "dragon/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NAME "fuzz.safetensors"
#define SEAL "\"file_sha256\":\""

static size_t numel(const dg_model_config *c, int p)
{
	int nd;
	int64_t sh[3];
	return (size_t)dg_model_param_shape(c, (dg_model_param)p, &nd, sh);
}

/* A copy of data (size bytes) sealed again: its seal's 64 digits, found
 * once in its header, the SHA-256 of the copy with them '0'; NULL when
 * there is no such seal. */
static uint8_t *resealed(const uint8_t *data, size_t size)
{
	if (size < 8)
		return NULL;
	uint64_t hn = 0;
	for (int i = 7; i >= 0; i--)
		hn = hn << 8 | data[i];
	if (hn > size - 8)
		return NULL;
	const size_t k = sizeof(SEAL) - 1, end = 8 + (size_t)hn;
	size_t at = 0, found = 0;
	for (size_t i = 8; i + k <= end; i++)
		if (memcmp(data + i, SEAL, k) == 0)
			at = i + k, found++;
	if (found != 1 || at + 65 > end)
		return NULL;
	uint8_t *b = malloc(size);
	if (!b)
		return NULL;
	memcpy(b, data, size);
	memset(b + at, '0', 64);
	uint8_t d[32];
	char hex[65];
	dg__sha256_digest(b, size, d);
	dg__sha256_hex(d, hex);
	memcpy(b + at, hex, 64);
	return b;
}

/* Whether two floats have the same bits. */
static bool same_f(float x, float y)
{
	return memcmp(&x, &y, sizeof(x)) == 0;
}

static void same_state(const dg_train_state *a, const dg_train_state *b)
{
	const dg_adamw_config *o = &a->opt, *q = &b->opt;
	if (!same_f(o->lr, q->lr) || !same_f(o->beta1, q->beta1) || !same_f(o->beta2, q->beta2) ||
	    !same_f(o->eps, q->eps) || !same_f(o->weight_decay, q->weight_decay) || !same_f(o->clip, q->clip) ||
	    !same_f(o->lr_floor, q->lr_floor) || o->warmup != q->warmup || o->steps != q->steps)
		abort();
	const dg_model_config *c = &a->weights->config, *d = &b->weights->config;
	if (c->layers != d->layers || c->embd != d->embd || c->heads != d->heads || c->neurons != d->neurons ||
	    c->vocab != d->vocab || strcmp(c->preset, d->preset) || !same_f(c->dropout, d->dropout))
		abort();
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		size_t n = numel(c, p) * sizeof(float);
		if (memcmp(a->weights->params[p], b->weights->params[p], n) || memcmp(a->m[p], b->m[p], n) ||
		    memcmp(a->v[p], b->v[p], n))
			abort();
	}
	if (a->step != b->step || a->seed != b->seed || a->data_pos != b->data_pos || a->time != b->time ||
	    a->data_rng.state != b->data_rng.state || a->scaler.mode != b->scaler.mode ||
	    !same_f(a->scaler.scale, b->scaler.scale) ||
	    a->scaler.good_steps != b->scaler.good_steps || a->scaler.growth_interval != b->scaler.growth_interval)
		abort();
}

static void check_one(const uint8_t *data, size_t size)
{
	char msg[1024] = "";
	dg_train_state *s = (dg_train_state *)1;
	dg_status st = dg_checkpoint_parse(data, size, NAME, &s, msg, sizeof(msg));
	if (st) {
		if (s || !(st == DG_ERR_PARSE || st == DG_ERR_CORRUPT || st == DG_ERR_NUMERIC || st == DG_ERR_NOMEM))
			abort();
		if (st != DG_ERR_NOMEM && strncmp(msg, NAME ": ", sizeof(NAME) + 1) != 0)
			abort(); /* every refusal names the file */
		return;
	}
	const dg_model_config *c = &s->weights->config;
	if (dg_model_config_check(c, msg, sizeof(msg)) || dg_adamw_check(&s->opt, msg, sizeof(msg)) ||
	    s->step < 0 || s->step > s->opt.steps || s->time < 0)
		abort();
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++)
		for (size_t i = 0; i < numel(c, p); i++)
			if (!isfinite(s->weights->params[p][i]) || !isfinite(s->m[p][i]) || !isfinite(s->v[p][i]) ||
			    s->v[p][i] < 0.0f)
				abort();
	if (dg_model_file_check(data, size, NAME, msg, sizeof(msg)))
		abort();
	void *again = NULL;
	size_t n = 0;
	if (dg_checkpoint_bytes(s, &again, &n, msg, sizeof(msg)) == DG_OK) {
		dg_train_state *t = NULL;
		if (dg_checkpoint_parse(again, n, "again", &t, msg, sizeof(msg)))
			abort();
		same_state(s, t);
		dg_train_state_destroy(t);
		free(again);
	}
	dg_train_state_destroy(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check_one(data, size);
	uint8_t *b = resealed(data, size);
	if (b) {
		check_one(b, size);
		free(b);
	}
	return 0;
}
