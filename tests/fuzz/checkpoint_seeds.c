/*
 * Writes fuzz_checkpoint's seeds into a folder: small files of the kinds
 * its reader meets, each a few KB so the fuzzer mutates them fast.
 *
 *   build-fuzz/tests/fuzz/checkpoint_seeds tests/fuzz/corpus/checkpoint
 *
 *   f32.safetensors           a sealed checkpoint (dragon-checkpoint-2),
 *                             f32, loss scaler off, time 8
 *   w8a8-dynamic.safetensors  w8a8, two layers and heads, the dynamic
 *                             loss scaler's state, dropout 0.1
 *   v1.safetensors            a dragon-checkpoint-1 (no seal, no kind),
 *                             its tensors' data_sha256
 *   v1-oldest.safetensors     a dragon-checkpoint-1 without data_sha256
 *                             or time
 *   weights.safetensors       a weights file (not a checkpoint)
 *   grads.safetensors         a gradients file (not weights)
 *
 * The same program always writes the same bytes (fixed seeds). Exit 0,
 * or 1 with the failure on stderr.
 */
#include <stdio.h>
#include <string.h>

#include "dragon/checkpoint.h"
#include "dragon/model.h"
#include "runtime/store/safetensors.h"

/* A state of preset at a small shape, step 3 of 10, moments of seed. */
static dg_status state(const char *preset, int layers, int embd, int heads, int neurons, int vocab,
		       dg_train_state **out, char *msg, size_t size)
{
	dg_model_config c;
	dg_status st = dg_model_preset(preset, &c, msg, size);
	if (st)
		return st;
	c.layers = layers, c.embd = embd, c.heads = heads, c.neurons = neurons, c.vocab = vocab;
	dg_model_weights *w = NULL;
	if ((st = dg_model_weights_create(&c, 7, &w, msg, size)))
		return st;
	dg_adamw_config o;
	dg_adamw_defaults(&o, 10);
	st = dg_train_state_create(w, 11, &o, out, msg, size);
	dg_model_weights_destroy(w);
	if (st)
		return st;
	dg_train_state *s = *out;
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		int64_t n = dg_model_param_shape(&c, (dg_model_param)p, &nd, sh);
		for (int64_t i = 0; i < n; i++) {
			s->m[p][i] = dg_rng_uniform(&s->data_rng, -1, 1) * 1e-3f;
			s->v[p][i] = dg_rng_uniform(&s->data_rng, 0, 1) * 1e-6f;
		}
	}
	dg_rng_seed(&s->data_rng, 11);
	s->step = 3;
	s->data_pos = 3;
	s->time = 8;
	return DG_OK;
}

/* The checkpoint at from rewritten as a dragon-checkpoint-1 into to:
 * without its seal and kind, with its tensors' data_sha256 unless
 * oldest (then without time either). */
static dg_status as_v1(const char *from, const char *to, int oldest, char *msg, size_t size)
{
	dg_safetensors *f = NULL;
	dg_safetensors_writer *w = NULL;
	dg_status st = dg_safetensors_load(from, &f, msg, size);
	if (!st)
		st = dg_safetensors_writer_create(&w);
	for (size_t i = 0; !st && i < dg_safetensors_count(f); i++) {
		const dg_st_tensor *t = dg_safetensors_at(f, i);
		st = dg_safetensors_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, msg, size);
	}
	for (size_t i = 0; !st && i < dg_safetensors_meta_count(f); i++) {
		const char *k, *v;
		dg_safetensors_meta_at(f, i, &k, &v);
		if (!strcmp(k, "file_sha256") || !strcmp(k, "kind") || (oldest && !strcmp(k, "time")))
			continue;
		st = dg_safetensors_writer_meta(w, k, strcmp(k, "format") ? v : "dragon-checkpoint-1", msg, size);
	}
	char sum[65];
	if (!st && !oldest) {
		dg_safetensors_data_sha256(f, sum);
		st = dg_safetensors_writer_meta(w, "data_sha256", sum, msg, size);
	}
	if (!st)
		st = dg_safetensors_writer_save(w, to, msg, size);
	dg_safetensors_writer_destroy(w);
	dg_safetensors_destroy(f);
	return st;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: checkpoint_seeds FOLDER\n");
		return 2;
	}
	char msg[1024] = "", path[4096], other[4096];
	dg_train_state *s = NULL;
	const char *dir = argv[1];
	snprintf(path, sizeof(path), "%s/f32.safetensors", dir);
	dg_status st = state("f32", 1, 4, 1, 4, 8, &s, msg, sizeof(msg));
	if (!st)
		st = dg_checkpoint_save(s, path, msg, sizeof(msg));
	snprintf(other, sizeof(other), "%s/weights.safetensors", dir);
	if (!st)
		st = dg_model_weights_save(s->weights, other, msg, sizeof(msg));
	snprintf(other, sizeof(other), "%s/grads.safetensors", dir);
	if (!st)
		st = dg_model_grads_save(s->weights, other, msg, sizeof(msg));
	snprintf(other, sizeof(other), "%s/v1.safetensors", dir);
	if (!st)
		st = as_v1(path, other, 0, msg, sizeof(msg));
	snprintf(other, sizeof(other), "%s/v1-oldest.safetensors", dir);
	if (!st)
		st = as_v1(path, other, 1, msg, sizeof(msg));
	dg_train_state_destroy(s);
	s = NULL;
	if (!st)
		st = state("w8a8", 2, 8, 2, 4, 8, &s, msg, sizeof(msg));
	if (!st) {
		s->weights->config.dropout = 0.1f;
		s->scaler = (dg_loss_scaler){ .mode = DG_LOSS_SCALE_DYNAMIC, .growth_interval = 2000,
					      .scale = 65536.0f, .good_steps = 3 };
		snprintf(path, sizeof(path), "%s/w8a8-dynamic.safetensors", dir);
		st = dg_checkpoint_save(s, path, msg, sizeof(msg));
	}
	dg_train_state_destroy(s);
	if (st) {
		fprintf(stderr, "checkpoint_seeds: %s\n", msg);
		return 1;
	}
	return 0;
}
