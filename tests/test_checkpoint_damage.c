/*
 * Damaged and hostile files of weights (dragon/checkpoint.h's seal,
 * dragon/model.h's dg_model_file_check), with no device, on a small
 * checkpoint (layers 1, embd 8, heads 1, neurons 8, vocab 16) saved by
 * dg_checkpoint_save and edited as bytes on disk:
 *   - every bit of its header flipped, one at a time, and a bit of every
 *     13th byte of its tensors: never loaded, always refused naming the
 *     file "damaged" (DG_ERR_CORRUPT by the seal whenever the file still
 *     parses as safetensors) — the metadata (step, RNG, data position,
 *     config) is covered as much as the tensors;
 *   - "step":"30" -> "31" in place and step=999999999999: refused, the
 *     second also when sealed again (a step past the run's steps);
 *   - a NaN or Inf weight, a NaN first moment, a negative or Inf second
 *     moment: refused by dg_checkpoint_load and dg_model_weights_load
 *     naming the tensor and the first bad index, the seal holding;
 *   - gradients (dg_model_grads_save) are refused as a checkpoint and as
 *     weights, named; a file that names its kind without its seal is
 *     damaged; a weights file's seal is checked by dg_model_weights_load
 *     and dg_model_config_read;
 *   - an unsealed dragon-checkpoint-1 (saved before seals) loads, its
 *     tensors' data_sha256 still checked.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dragon/checkpoint.h"
#include "runtime/store/safetensors.h"
#include "helpers.h"

static dg_model_config small(void)
{
	dg_model_config c = dg_test_model("f32", 1, 8, 1, 8);
	c.vocab = 16;
	return c;
}

/* A state at step 30 of 300, random moments (v >= 0). */
static dg_train_state *made(void)
{
	dg_model_config c = small();
	dg_adamw_config o;
	dg_adamw_defaults(&o, 300);
	dg_train_state *s = dg_test_train_state(&c, &o);
	s->step = 30;
	s->data_pos = 30;
	s->time = 16;
	return s;
}

/* made()'s state, saved as dir/name (that path into path, 512 bytes). */
static dg_train_state *made_saved(const char *dir, const char *name, char *path)
{
	char msg[1024];
	dg_train_state *s = made();
	snprintf(path, 512, "%s/%s", dir, name);
	cr_assert_eq(dg_checkpoint_save(s, path, msg, sizeof(msg)), DG_OK, "%s", msg);
	return s;
}

/* The offset of text in b (n bytes), which must be there once. */
static size_t find_once(const char *b, size_t n, const char *text)
{
	size_t len = strlen(text), at = 0;
	int found = 0;
	for (size_t i = 0; i + len <= n; i++)
		if (memcmp(b + i, text, len) == 0)
			at = i, found++;
	cr_assert_eq(found, 1, "%s: found %d times", text, found);
	return at;
}

/* The header's length of a safetensors file's bytes. */
static size_t header_len(const unsigned char *b)
{
	size_t hn = 0;
	for (int i = 7; i >= 0; i--)
		hn = hn << 8 | b[i];
	return hn;
}

/* dg_checkpoint_load of b (n bytes) written to path: its status; the
 * message into msg; no state may come back on a failure. */
static dg_status load_bytes(const char *path, const void *b, size_t n, char *msg, size_t size)
{
	unlink(path); /* a new file: a file truncated and rewritten may be flushed at close */
	dg_test_write_bytes(path, b, n);
	dg_train_state *s = (dg_train_state *)1;
	dg_status st = dg_checkpoint_load(path, &s, msg, size);
	if (st)
		cr_assert_null(s);
	dg_train_state_destroy(st ? NULL : s);
	return st;
}

Test(checkpoint_damage, every_bit_of_the_header_is_covered)
{
	char *dir = dg_test_tmpdir(), path[512], flip[512], msg[1024];
	dg_train_state *s = made_saved(dir, "good.safetensors", path);
	snprintf(flip, sizeof(flip), "%s/flip.safetensors", dir);
	size_t n;
	unsigned char *b = dg_test_read_bytes(path, &n);
	const size_t hn = header_len(b);
	cr_assert_lt(hn, n);
	size_t flips = 0, parsed = 0;
	const size_t step = dg_test_quick() ? 7 : 1; /* the sanitizer run: every 7th bit */
	for (size_t bit = 0; bit < (8 + hn) * 8; bit += step) {
		b[bit / 8] ^= (unsigned char)(1u << (bit % 8));
		dg_status st = load_bytes(flip, b, n, msg, sizeof(msg));
		cr_assert_neq(st, DG_OK, "bit %zu of the header flipped: loaded", bit);
		cr_assert(strstr(msg, "flip.safetensors: damaged"), "bit %zu: %s", bit, msg);
		dg_safetensors *f = NULL;
		char why[512];
		if (dg_safetensors_parse(b, n, "x", &f, why, sizeof(why)) == DG_OK) {
			cr_assert_eq(st, DG_ERR_CORRUPT, "bit %zu: %s", bit, msg);
			cr_assert(strstr(msg, "flip.safetensors: damaged: "), "bit %zu: %s", bit, msg);
			parsed++;
		}
		dg_safetensors_destroy(f);
		b[bit / 8] ^= (unsigned char)(1u << (bit % 8));
		flips++;
	}
	/* most flips of a JSON text's letters and digits still parse */
	cr_assert_gt(parsed, flips / 4, "%zu of %zu flips parsed", parsed, flips);
	for (size_t at = 8 + hn; at < n; at += 13) {
		b[at] ^= 0x40;
		cr_assert_eq(load_bytes(flip, b, n, msg, sizeof(msg)), DG_ERR_CORRUPT, "byte %zu: %s", at, msg);
		cr_assert(strstr(msg, "damaged"), "%s", msg);
		b[at] ^= 0x40;
	}
	cr_assert_eq(load_bytes(flip, b, n, msg, sizeof(msg)), DG_OK, "%s", msg);
	free(b);
	dg_train_state_destroy(s);
	dg_test_rmtree(dir);
}

Test(checkpoint_damage, a_step_edited_is_refused)
{
	char *dir = dg_test_tmpdir(), path[512], other[512], msg[1024];
	dg_train_state *s = made_saved(dir, "ck.safetensors", path), *b = NULL;
	snprintf(other, sizeof(other), "%s/edit.safetensors", dir);
	size_t n;
	char *bytes = dg_test_read_bytes(path, &n);
	/* "step":"30" -> "31": one bit */
	size_t at = find_once(bytes, n, "\"step\":\"30\"");
	bytes[at + 9] ^= 1;
	cr_assert_eq(load_bytes(other, bytes, n, msg, sizeof(msg)), DG_ERR_CORRUPT, "%s", msg);
	cr_assert(strstr(msg, "edit.safetensors: damaged: "), "%s", msg);
	bytes[at + 9] ^= 1;
	/* the seed and the data RNG's state alike */
	static const char *const keys[2] = { "\"seed\":\"42\"", "\"data_pos\":\"30\"" };
	for (int k = 0; k < 2; k++) {
		at = find_once(bytes, n, keys[k]) + strlen(keys[k]) - 2;
		bytes[at] ^= 2;
		cr_assert_eq(load_bytes(other, bytes, n, msg, sizeof(msg)), DG_ERR_CORRUPT, "%s: %s", keys[k], msg);
		bytes[at] ^= 2;
	}
	free(bytes);

	/* step=999999999999: as written in the file (the seal refuses it)
	 * and sealed again (no run goes past its steps) */
	dg_safetensors *f;
	cr_assert_eq(dg_safetensors_load(path, &f, msg, sizeof(msg)), DG_OK, "%s", msg);
	for (int seal = 0; seal < 2; seal++) {
		dg_safetensors_writer *w = dg_test_rewrite(f, NULL, dg_test_far_step, NULL);
		if (seal)
			cr_assert_eq(dg_safetensors_writer_seal(w, "file_sha256", msg, sizeof(msg)), DG_OK, "%s", msg);
		cr_assert_eq(dg_safetensors_writer_save(w, other, msg, sizeof(msg)), DG_OK, "%s", msg);
		dg_safetensors_writer_destroy(w);
		dg_status st = dg_checkpoint_load(other, &b, msg, sizeof(msg));
		cr_assert_null(b);
		if (seal) {
			cr_assert_eq(st, DG_ERR_PARSE, "%s", msg);
			cr_assert(strstr(msg, "edit.safetensors: metadata step=999999999999 of adamw.steps=300"), "%s",
				  msg);
		} else {
			cr_assert_eq(st, DG_ERR_CORRUPT, "%s", msg);
			cr_assert(strstr(msg, "edit.safetensors: damaged: "), "%s", msg);
		}
	}
	dg_safetensors_destroy(f);
	dg_train_state_destroy(s);
	dg_test_rmtree(dir);
}

Test(checkpoint_damage, values_that_are_not_finite_are_refused_by_name)
{
	const struct {
		int p, k; /* param, 0 weight 1 m 2 v */
		size_t i;
		float x;
		const char *want;
	} cases[] = {
		{ DG_PARAM_LM_HEAD, 0, 5, NAN, "lm_head[5] is nan: a weight that is not a finite number" },
		{ DG_PARAM_ENCODER, 0, 3, INFINITY, "encoder[3] is inf: a weight" },
		{ DG_PARAM_DECODER, 1, 7, NAN, "adamw.m.decoder[7] is nan: AdamW's first moment" },
		{ DG_PARAM_EMBED, 2, 2, -1e-6f, "adamw.v.embed.weight[2] is -1e-06: AdamW's second moment is never negative" },
		{ DG_PARAM_ENCODER_V, 2, 0, INFINITY, "adamw.v.encoder_v[0] is inf: AdamW's second moment" },
	};
	char *dir = dg_test_tmpdir(), path[512], wpath[512], msg[1024];
	snprintf(path, sizeof(path), "%s/nan.safetensors", dir);
	snprintf(wpath, sizeof(wpath), "%s/weights.safetensors", dir);
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		dg_train_state *s = made(), *b = (dg_train_state *)1;
		float *t = cases[c].k == 0 ? s->weights->params[cases[c].p] : cases[c].k == 1 ? s->m[cases[c].p]
											: s->v[cases[c].p];
		t[cases[c].i] = cases[c].x;
		cr_assert_eq(dg_checkpoint_save(s, path, msg, sizeof(msg)), DG_OK, "%s", msg);
		/* the seal holds, the values are refused */
		cr_assert_eq(dg_checkpoint_load(path, &b, msg, sizeof(msg)), DG_ERR_NUMERIC, "case %zu: %s", c, msg);
		cr_assert_null(b);
		cr_assert(strncmp(msg, path, strlen(path)) == 0, "%s", msg);
		cr_assert(strstr(msg, cases[c].want), "case %zu: %s", c, msg);
		if (cases[c].k == 0) { /* a weights file alike */
			dg_model_weights *w = (dg_model_weights *)1;
			cr_assert_eq(dg_model_weights_save(s->weights, wpath, msg, sizeof(msg)), DG_OK, "%s", msg);
			cr_assert_eq(dg_model_weights_load(&s->weights->config, wpath, &w, msg, sizeof(msg)),
				     DG_ERR_NUMERIC, "%s", msg);
			cr_assert_null(w);
			cr_assert(strstr(msg, cases[c].want), "%s", msg);
		}
		dg_train_state_destroy(s);
	}
	dg_test_rmtree(dir);
}

Test(checkpoint_damage, gradients_and_unsealed_kinds_are_not_weights)
{
	dg_train_state *s = made(), *b = (dg_train_state *)1;
	const dg_model_config *c = &s->weights->config;
	char *dir = dg_test_tmpdir(), path[512], msg[1024];
	snprintf(path, sizeof(path), "%s/grads.safetensors", dir);
	cr_assert_eq(dg_model_grads_save(s->weights, path, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_checkpoint_load(path, &b, msg, sizeof(msg)), DG_ERR_PARSE, "%s", msg);
	cr_assert_null(b);
	cr_assert(strstr(msg, "grads.safetensors: a gradients file"), "%s", msg);
	dg_model_weights *w = (dg_model_weights *)1;
	cr_assert_eq(dg_model_weights_load(c, path, &w, msg, sizeof(msg)), DG_ERR_PARSE, "%s", msg);
	cr_assert_null(w);
	cr_assert(strstr(msg, "grads.safetensors: a gradients file"), "%s", msg);
	dg_model_config got;
	cr_assert_eq(dg_model_config_read(path, &got, msg, sizeof(msg)), DG_ERR_PARSE, "%s", msg);
	cr_assert(strstr(msg, "a gradients file"), "%s", msg);

	/* a weights file is sealed and of kind weights: a flipped bit of its
	 * config is refused by both of its readers */
	snprintf(path, sizeof(path), "%s/weights.safetensors", dir);
	cr_assert_eq(dg_model_weights_save(s->weights, path, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_model_weights_load(c, path, &w, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_model_weights_destroy(w);
	size_t n;
	char *bytes = dg_test_read_bytes(path, &n);
	find_once(bytes, n, "\"kind\":\"weights\"");
	size_t at = find_once(bytes, n, "\"embd\":\"8\"") + 8;
	bytes[at] ^= 1; /* 8 -> 9 */
	dg_test_write_bytes(path, bytes, n);
	cr_assert_eq(dg_model_weights_load(c, path, &w, msg, sizeof(msg)), DG_ERR_CORRUPT, "%s", msg);
	cr_assert(strstr(msg, "weights.safetensors: damaged: "), "%s", msg);
	cr_assert_eq(dg_model_config_read(path, &got, msg, sizeof(msg)), DG_ERR_CORRUPT, "%s", msg);
	/* its seal's key damaged: a file that names its kind has a seal */
	bytes[at] ^= 1;
	at = find_once(bytes, n, "\"file_sha256\"");
	bytes[at + 5] ^= 1;
	dg_test_write_bytes(path, bytes, n);
	cr_assert_eq(dg_model_weights_load(c, path, &w, msg, sizeof(msg)), DG_ERR_CORRUPT, "%s", msg);
	cr_assert(strstr(msg, "weights.safetensors: damaged: it says it is dragon's weights but has no file_sha256"),
		  "%s", msg);
	free(bytes);
	dg_train_state_destroy(s);
	dg_test_rmtree(dir);
}

/* A dragon-checkpoint-1 (saved before seals: no seal, no kind, the
 * tensors' data_sha256) loads, the same state; a flipped bit of a tensor
 * is refused by its data_sha256. */
/* The metadata of a dragon-checkpoint-1: no seal, no kind. */
static const char *as_v1(void *u, const char *key, const char *val)
{
	(void)u;
	if (!strcmp(key, "file_sha256") || !strcmp(key, "kind"))
		return NULL;
	return strcmp(key, "format") ? val : "dragon-checkpoint-1";
}

Test(checkpoint_damage, an_older_checkpoint_loads_and_its_tensors_are_checked)
{
	char *dir = dg_test_tmpdir(), path[512], old[512], msg[1024];
	dg_train_state *s = made_saved(dir, "new.safetensors", path), *b = NULL;
	snprintf(old, sizeof(old), "%s/old.safetensors", dir);
	dg_safetensors *f;
	cr_assert_eq(dg_safetensors_load(path, &f, msg, sizeof(msg)), DG_OK, "%s", msg);
	char sum[65];
	dg_safetensors_data_sha256(f, sum);
	dg_safetensors_writer *w = dg_test_rewrite(f, NULL, as_v1, NULL);
	cr_assert_eq(dg_safetensors_writer_meta(w, "data_sha256", sum, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_safetensors_writer_save(w, old, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_safetensors_writer_destroy(w);
	dg_safetensors_destroy(f);
	cr_assert_eq(dg_checkpoint_load(old, &b, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(b->step, 30);
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++)
		cr_assert_eq(memcmp(b->v[p], s->v[p], dg_test_numel(&s->weights->config, p) * 4), 0);
	dg_train_state_destroy(b);
	size_t n;
	unsigned char *bytes = dg_test_read_bytes(old, &n);
	bytes[n - 3] ^= 0x40;
	cr_assert_eq(load_bytes(old, bytes, n, msg, sizeof(msg)), DG_ERR_CORRUPT, "%s", msg);
	cr_assert(strstr(msg, "old.safetensors: damaged: its tensors hash to "), "%s", msg);
	free(bytes);
	dg_train_state_destroy(s);
	dg_test_rmtree(dir);
}
