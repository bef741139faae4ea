/*
 * The dragon program end to end (cli/dragon/): the binary at $DRAGON (set
 * by ctest) run with posix_spawn in a sandbox (cli_helpers.h), on a tiny
 * f32 model (layers 2, embd 32, heads 2, neurons 64) saved in the sandbox.
 *
 * What is proved: eval --cpu gives the loss dg_model_cpu_step gives on
 * the very batch eval documents (a --data file whose split forces the
 * offset, a longer one whose offsets the test draws from --seed as eval
 * says it does, and the built-in stream), near ln 256 for the random
 * init; --grads writes dg_model_cpu_step's gradients under the weights'
 * names; --json parses with every documented key; the errors (no
 * --model, a missing file, a misnamed tensor, a file without dragon's
 * metadata, too short a --data, a directory or FIFO as --data, a bad flag, a
 * recipe the CPU model does not run, --grads past a file-size limit) exit 2
 * or 1 with one line naming the problem, and so do a damaged file (a
 * flipped bit of a checkpoint's step, of a weight's exponent), a NaN
 * weight or a negative AdamW moment, named, and gradients given as
 * --model; --grads naming --model (or another spelling of it, a symlink
 * to it) or --data is refused with exit 2, the input intact; --cpu runs
 * each recipe its help names (f32, w8a8, bitnet) to dg_model_cpu_step's
 * loss; `dragon devices` lists
 * what the driver finds (none: exit 1 naming why). On a GPU: eval without
 * --cpu agrees with the CPU loss within 1e-5 relative (f32) — skipped
 * with "skipped: no CUDA device" otherwise, a failure under
 * DRAGON_REQUIRE_GPU=1.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include "dragon/checkpoint.h"
#include "dragon/model.h"
#include "dragon/rng.h"
#include "dragon/runtime.h"
#include "runtime/store/safetensors.h"
#include "helpers.h"

#include "cli_helpers.h"

#define LN256 5.545177444479562

/* The sandbox, the program, and sb.root/model.safetensors (seed 7). */
static dg_model_weights *setup(sandbox *sb, char *model, size_t size)
{
	char msg[512];
	dg_model_config c = dg_test_tiny_model("f32");
	dg_model_weights *w = NULL;
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(sb);
	snprintf(model, size, "%s/model.safetensors", sb->root);
	cr_assert_eq(dg_model_weights_create(&c, 7, &w, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_model_weights_save(w, model, msg, sizeof(msg)), DG_OK, "%s", msg);
	return w;
}

/* sb.root/name: n bytes of dg_rng(seed) (top 8 bits each); the bytes
 * into out (n of them) when non-NULL. */
static void write_data(const sandbox *sb, const char *name, size_t n, uint64_t seed, char *path,
		       size_t size, uint8_t *out)
{
	dg_rng r;
	uint8_t *b = malloc(n);
	dg_rng_seed(&r, seed);
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)(dg_rng_u64(&r) >> 56);
	snprintf(path, size, "%s/%s", sb->root, name);
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(b, 1, n, f), n);
	fclose(f);
	if (out)
		memcpy(out, b, n);
	free(b);
}

/* dg_model_cpu_step's loss (and grads) of w on rows starting at off[] in
 * bytes, t tokens a row. */
static double cpu_loss(const dg_model_weights *w, const uint8_t *bytes, const size_t *off, int b,
		       int t, dg_model_weights *grads)
{
	int32_t *idx = malloc(sizeof(int32_t) * (size_t)(b * t));
	int32_t *tgt = malloc(sizeof(int32_t) * (size_t)(b * t));
	for (int r = 0; r < b; r++)
		for (int i = 0; i < t; i++) {
			idx[r * t + i] = bytes[off[r] + (size_t)i];
			tgt[r * t + i] = bytes[off[r] + (size_t)i + 1];
		}
	dg_model_batch batch = { .idx = idx, .targets = tgt, .b = b, .t = t, .train = false };
	double loss = 0;
	char msg[512];
	cr_assert_eq(dg_model_cpu_step(w, &batch, &loss, grads, msg, sizeof(msg)), DG_OK, "%s", msg);
	free(idx);
	free(tgt);
	return loss;
}

/* sb.root/short.bin: 170 bytes of dg_rng(3), its split the last 17, so
 * rows of T = 16 all start at 0 whatever the seed (its path into data);
 * returns w's CPU loss of two such rows (its gradients into grads, which
 * may be NULL). */
static double short_data(const sandbox *sb, char *data, size_t size, const dg_model_weights *w,
			 dg_model_weights *grads)
{
	uint8_t bytes[170];
	write_data(sb, "short.bin", sizeof(bytes), 3, data, size, bytes);
	size_t off[2] = { 0, 0 };
	return cpu_loss(w, bytes + 153, off, 2, 16, grads);
}

/* The eval tests' start: a model (setup, its path into model) and the
 * short data file (its path into data), both strings of 700 bytes; the
 * weights, and *want their CPU loss on the data. */
static dg_model_weights *eval_setup(sandbox *sb, char *model, char *data, double *want)
{
	dg_model_weights *w = setup(sb, model, 700);
	*want = short_data(sb, data, 700, w, NULL);
	return w;
}

static const char *str(const cJSON *j, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
	cr_assert(cJSON_IsString(v), "'%s' is not a string", k);
	return v->valuestring;
}

/* A 170-byte file: its split is the last 17 bytes, so rows of T = 16 all
 * start at 0 whatever the seed. */
Test(cli_dragon, cpu_loss_is_the_cpu_models)
{
	sandbox sb;
	run r;
	char model[700], data[700];
	double want;
	dg_model_weights *w = eval_setup(&sb, model, data, &want);

	gen(&sb, &r, "eval", "--model", model, "--data", data, "--batch", "2", "--time", "16",
	    "--batches", "3", "--cpu", "--json", NULL);
	cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
	cJSON *j = parse_json(r.out);
	double loss = num(j, "loss");
	printf("eval --cpu: loss %.9g, dg_model_cpu_step %.9g\n", loss, want);
	cr_expect(fabs(loss - want) <= 1e-12 * fabs(want), "loss %.12g, want %.12g", loss, want);
	cr_expect(fabs(loss - LN256) < 0.05, "random init: loss %.6g, want about ln 256", loss);
	cr_expect(fabs(num(j, "perplexity") - exp(want)) < 1e-9 * exp(want));
	cr_expect_eq(num(j, "tokens"), 3 * 2 * 16);
	cr_expect_eq(num(j, "split_bytes"), 17);
	cr_expect_eq(num(j, "data_bytes"), 170);
	cr_expect_str_eq(str(j, "device"), "cpu");
	cJSON_Delete(j);
	run_free(&r);
	dg_model_weights_destroy(w);
	sandbox_fini(&sb);
}

/* The recipes eval --help says --cpu runs (it once said "f32 recipes
 * only" and that low-bit ones need a GPU, while w8a8 and bitnet ran):
 * w8a8 and bitnet among them, each giving dg_model_cpu_step's loss of its
 * recipe on the CPU; bf16, which the help says needs a GPU, is refused. */
Test(cli_dragon, cpu_runs_the_recipes_its_help_names)
{
	sandbox sb;
	run r;
	char model[700], data[700], list[256];
	uint8_t bytes[170];
	dg_model_weights *w = setup(&sb, model, sizeof(model));
	write_data(&sb, "short.bin", sizeof(bytes), 3, data, sizeof(data), bytes);

	gen(&sb, &r, "eval", "--help", NULL);
	cr_assert_eq(r.code, 0);
	const char *at = strstr(r.out, "--cpu           the CPU model even with a GPU (");
	cr_assert_not_null(at, "%s", r.out);
	at = strchr(at, '(') + 1;
	cr_assert(sscanf(at, "%255[^)]", list) == 1, "%s", at);
	cr_expect(strstr(r.out, "bf16 needs an") != NULL, "%s", r.out);
	run_free(&r);
	cr_assert(strstr(list, "w8a8") && strstr(list, "bitnet"), "--cpu runs w8a8 and bitnet; help: %s", list);

	size_t off[2] = { 0, 0 };
	for (char *p = strtok(list, ", "); p; p = strtok(NULL, ", ")) {
		char msg[256];
		dg_model_config c;
		cr_assert_eq(dg_model_preset(p, &c, msg, sizeof(msg)), DG_OK, "'%s': %s", p, msg);
		c.layers = w->config.layers, c.embd = w->config.embd;
		c.heads = w->config.heads, c.neurons = w->config.neurons;
		w->config = c;
		double want = cpu_loss(w, bytes + 153, off, 2, 16, NULL);
		gen(&sb, &r, "eval", "--model", model, "--data", data, "--batch", "2", "--time", "16",
		    "--batches", "1", "--cpu", "--preset", p, "--json", NULL);
		cr_assert_eq(r.code, 0, "--preset %s --cpu: exit %d: %s", p, r.code, r.err);
		cJSON *j = parse_json(r.out);
		cr_expect_str_eq(str(j, "preset"), p);
		cr_expect_str_eq(str(j, "device"), "cpu");
		cr_expect(fabs(num(j, "loss") - want) <= 1e-12 * fabs(want), "%s: loss %.12g, want %.12g", p,
			  num(j, "loss"), want);
		cJSON_Delete(j);
		run_free(&r);
	}
	gen(&sb, &r, "eval", "--model", model, "--cpu", "--preset", "bf16", NULL);
	expect_one_line_error(&r, 2, "bf16 needs an NVIDIA GPU");
	run_free(&r);
	dg_model_weights_destroy(w);
	sandbox_fini(&sb);
}

/* Offsets as eval_data.h says: dg_rng of --seed, u64 % (split − T) a row. */
Test(cli_dragon, seeded_offsets_into_the_split)
{
	sandbox sb;
	run r;
	char model[700], data[700];
	enum { N = 4000, LEN = N / 10, B = 3, T = 24 };
	static uint8_t bytes[N];
	dg_model_weights *w = setup(&sb, model, sizeof(model));
	write_data(&sb, "long.bin", N, 11, data, sizeof(data), bytes);

	dg_rng rng;
	size_t off[2][B];
	dg_rng_seed(&rng, 42);
	for (int k = 0; k < 2; k++)
		for (int b = 0; b < B; b++)
			off[k][b] = (size_t)(dg_rng_u64(&rng) % (LEN - T));
	double want = (cpu_loss(w, bytes + N - LEN, off[0], B, T, NULL) +
		       cpu_loss(w, bytes + N - LEN, off[1], B, T, NULL)) / 2;
	gen(&sb, &r, "eval", "--model", model, "--data", data, "--batch", "3", "--time", "24",
	    "--batches", "2", "--seed", "42", "--cpu", "--json", NULL);
	cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
	cJSON *j = parse_json(r.out);
	double loss = num(j, "loss");
	cr_expect(fabs(loss - want) <= 1e-12 * fabs(want), "loss %.12g, want %.12g", loss, want);
	cJSON_Delete(j);
	run_free(&r);

	/* another seed, other rows: another loss */
	gen(&sb, &r, "eval", "--model", model, "--data", data, "--batch", "3", "--time", "24",
	    "--batches", "2", "--seed", "43", "--cpu", "--json", NULL);
	cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
	j = parse_json(r.out);
	cr_expect(num(j, "loss") != loss, "seed 43 gave seed 42's loss");
	cJSON_Delete(j);
	run_free(&r);

	/* without --time: 512 capped to the split (400 bytes: T 399) */
	gen(&sb, &r, "eval", "--model", model, "--data", data, "--batch", "1", "--batches", "1",
	    "--cpu", "--json", NULL);
	cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
	j = parse_json(r.out);
	cr_expect_eq(num(j, "time"), LEN - 1);
	cJSON_Delete(j);
	run_free(&r);
	dg_model_weights_destroy(w);
	sandbox_fini(&sb);
}

/* The built-in stream and the text output. */
Test(cli_dragon, builtin_batch_and_text)
{
	sandbox sb;
	run r;
	char model[700];
	uint8_t stream[2 * 2 * 16 + 1];
	dg_model_weights *w = setup(&sb, model, sizeof(model));
	dg_rng rng;
	dg_rng_seed(&rng, 5);
	for (size_t i = 0; i < sizeof(stream); i++)
		stream[i] = (uint8_t)(dg_rng_u64(&rng) >> 56);
	size_t off0[2] = { 0, 16 }, off1[2] = { 32, 48 };
	double want = (cpu_loss(w, stream, off0, 2, 16, NULL) + cpu_loss(w, stream, off1, 2, 16, NULL)) / 2;

	gen(&sb, &r, "eval", "--model", model, "--batch", "2", "--time", "16", "--batches", "2",
	    "--seed", "5", "--cpu", NULL);
	cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
	cr_expect_str_empty(r.err);
	cr_expect(strstr(r.out, "data:    built-in deterministic batch") != NULL, "%s", r.out);
	cr_expect(strstr(r.out, "device:  cpu\n") != NULL, "%s", r.out);
	cr_expect(strstr(r.out, "preset:  f32\n") != NULL, "%s", r.out);
	cr_expect(strstr(r.out, "batches: 2 of 2x16 (64 tokens)\n") != NULL, "%s", r.out);
	cr_expect(strstr(r.out, "time:    ") != NULL, "%s", r.out);
	const char *l = strstr(r.out, "loss:    ");
	cr_assert_not_null(l, "%s", r.out);
	double loss = strtod(l + 9, NULL);
	cr_expect(fabs(loss - want) < 1e-6, "text loss %.6f, want %.9g", loss, want);
	cr_expect(strstr(l, "(perplexity ") != NULL);
	run_free(&r);
	dg_model_weights_destroy(w);
	sandbox_fini(&sb);
}

Test(cli_dragon, grads_are_the_cpu_models)
{
	sandbox sb;
	run r;
	char model[700], data[700], out[700], msg[512];
	dg_model_weights *w = setup(&sb, model, sizeof(model)), *g = NULL;
	dg_model_config c = dg_test_tiny_model("f32");
	cr_assert_eq(dg_model_weights_create(&c, 0, &g, msg, sizeof(msg)), DG_OK);
	short_data(&sb, data, sizeof(data), w, g);
	snprintf(out, sizeof(out), "%s/grads.safetensors", sb.root);

	gen(&sb, &r, "eval", "--model", model, "--data", data, "--batch", "2", "--time", "16",
	    "--batches", "2", "--cpu", "--grads", out, NULL);
	cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
	cr_expect(strstr(r.out, "grads:   ") != NULL, "%s", r.out);
	dg_safetensors *f = NULL;
	cr_assert_eq(dg_safetensors_load(out, &f, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_expect_eq(dg_safetensors_count(f), DG_MODEL_N_PARAMS);
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		const dg_st_tensor *t;
		int64_t n = dg_model_param_shape(&c, (dg_model_param)p, &nd, sh);
		const char *name = dg_model_param_name((dg_model_param)p);
		cr_assert_eq(dg_safetensors_expect(f, name, DG_ST_F32, nd, sh, &t, msg, sizeof(msg)),
			     DG_OK, "%s", msg);
		const void *got = t->data; /* unaligned in general: copied */
		float *gv = malloc((size_t)n * sizeof(float));
		memcpy(gv, got, (size_t)n * sizeof(float));
		double maxd = 0, maxg = 0;
		for (int64_t i = 0; i < n; i++) {
			maxd = fmax(maxd, fabs((double)gv[i] - g->params[p][i]));
			maxg = fmax(maxg, fabs((double)g->params[p][i]));
		}
		cr_expect(maxg > 0, "%s: the gradient is zero", name);
		cr_expect(maxd <= 1e-6 * maxg, "%s: max |diff| %.3g of max |g| %.3g", name, maxd, maxg);
		free(gv);
	}
	dg_safetensors_destroy(f);
	/* written atomically: nothing but the file is left beside it */
	char *ls = listing(sb.root);
	cr_expect(strstr(ls, ".tmp") == NULL, "%s", ls);
	free(ls);
	run_free(&r);
	dg_model_weights_destroy(w);
	dg_model_weights_destroy(g);
	sandbox_fini(&sb);
}

Test(cli_dragon, json_has_the_documented_keys)
{
	sandbox sb;
	run r;
	char model[700];
	dg_model_weights *w = setup(&sb, model, sizeof(model));
	gen(&sb, &r, "eval", "--model", model, "--batch", "1", "--time", "8", "--batches", "2",
	    "--cpu", "--json", NULL);
	cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
	cJSON *j = parse_json(r.out);
	cr_expect_str_eq(str(j, "model"), model);
	cr_expect_str_eq(str(j, "preset"), "f32");
	cr_expect_str_eq(str(j, "device"), "cpu");
	cr_expect_str_eq(str(j, "device_name"), "cpu");
	cr_expect_str_eq(str(j, "data"), "builtin");
	cr_expect(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "data_bytes")));
	cr_expect(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "grads")));
	const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(j, "config");
	cr_assert(cJSON_IsObject(cfg));
	cr_expect_eq(num(cfg, "layers"), 2);
	cr_expect_eq(num(cfg, "embd"), 32);
	cr_expect_eq(num(cfg, "heads"), 2);
	cr_expect_eq(num(cfg, "neurons"), 64);
	cr_expect_eq(num(cfg, "vocab"), 256);
	cr_expect_eq(num(j, "batch"), 1);
	cr_expect_eq(num(j, "time"), 8);
	cr_expect_eq(num(j, "batches"), 2);
	cr_expect_eq(num(j, "tokens"), 16);
	cr_expect_eq(num(j, "seed"), 0);
	cr_expect_eq(num(j, "split_bytes"), 17);
	cr_expect(num(j, "wall_s") >= 0);
	const cJSON *ls = cJSON_GetObjectItemCaseSensitive(j, "losses");
	cr_assert(cJSON_IsArray(ls) && cJSON_GetArraySize(ls) == 2);
	double mean = (cJSON_GetArrayItem(ls, 0)->valuedouble + cJSON_GetArrayItem(ls, 1)->valuedouble) / 2;
	cr_expect(fabs(mean - num(j, "loss")) < 1e-12);
	cr_expect(isfinite(num(j, "perplexity")));
	cJSON_Delete(j);
	run_free(&r);
	dg_model_weights_destroy(w);
	sandbox_fini(&sb);
}

/* ---- errors ------------------------------------------------------------------ */

/* A safetensors file of the tiny shapes, with the given decoder name and
 * (meta) dragon's config as metadata. */
static void write_odd_model(const char *path, const char *decoder_name, bool meta)
{
	dg_model_config c = dg_test_tiny_model("f32");
	dg_safetensors_writer *sw;
	char msg[512];
	cr_assert_eq(dg_safetensors_writer_create(&sw), DG_OK);
	int64_t most = 0; /* the largest tensor's elements: every one reads zeros */
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3], n = dg_model_param_shape(&c, (dg_model_param)p, &nd, sh);
		most = n > most ? n : most;
	}
	float *zeros = calloc((size_t)most, sizeof(float));
	cr_assert(zeros);
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		dg_model_param_shape(&c, (dg_model_param)p, &nd, sh);
		const char *name = p == DG_PARAM_DECODER ? decoder_name : dg_model_param_name((dg_model_param)p);
		cr_assert_eq(dg_safetensors_writer_add(sw, name, DG_ST_F32, nd, sh, zeros, msg, sizeof(msg)),
			     DG_OK, "%s", msg);
	}
	const char *kv[][2] = { { "layers", "2" }, { "embd", "32" }, { "heads", "2" }, { "neurons", "64" } };
	for (int i = 0; meta && i < 4; i++)
		cr_assert_eq(dg_safetensors_writer_meta(sw, kv[i][0], kv[i][1], msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_safetensors_writer_save(sw, path, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_safetensors_writer_destroy(sw);
	free(zeros);
}

Test(cli_dragon, errors_name_the_problem)
{
	sandbox sb;
	run r;
	char model[700], path[700], data[700];
	dg_model_weights *w = setup(&sb, model, sizeof(model));

	gen(&sb, &r, "eval", NULL);
	expect_one_line_error(&r, 2, "--model is required");
	run_free(&r);
	gen(&sb, &r, "eval", "--model", "/nonexistent/m.safetensors", "--cpu", NULL);
	expect_one_line_error(&r, 1, "/nonexistent/m.safetensors");
	run_free(&r);
	gen(&sb, &r, "eval", "--model", model, "--bogus", NULL);
	expect_one_line_error(&r, 2, "--bogus");
	run_free(&r);
	gen(&sb, &r, "eval", "--model", model, "--batch", "0", NULL);
	expect_one_line_error(&r, 2, "--batch 0");
	run_free(&r);
	gen(&sb, &r, "eval", "--model", model, "--preset", "nope", NULL);
	expect_one_line_error(&r, 2, "nope");
	run_free(&r);
	gen(&sb, &r, "eval", "--model", model, "--preset", "bf16", "--cpu", NULL);
	expect_one_line_error(&r, 2, "bf16 needs an NVIDIA GPU");
	run_free(&r);

	snprintf(path, sizeof(path), "%s/misnamed.safetensors", sb.root);
	write_odd_model(path, "decoder.weight", true);
	gen(&sb, &r, "eval", "--model", path, "--cpu", NULL);
	expect_one_line_error(&r, 1, "decoder: missing");
	run_free(&r);

	/* no metadata: refused, then served by the shape flags */
	snprintf(path, sizeof(path), "%s/bare.safetensors", sb.root);
	write_odd_model(path, "decoder", false);
	gen(&sb, &r, "eval", "--model", path, "--cpu", NULL);
	expect_one_line_error(&r, 1, "no dragon config in its metadata");
	cr_expect(strstr(r.err, "--layers") != NULL, "%s", r.err);
	run_free(&r);
	gen(&sb, &r, "eval", "--model", path, "--cpu", "--layers", "2", "--embd", "32", "--heads",
	    "2", "--neurons", "64", "--batch", "1", "--time", "8", "--batches", "1", "--json", NULL);
	cr_expect_eq(r.code, 0, "exit %d: %s", r.code, r.err);
	if (r.code == 0) {
		cJSON *j = parse_json(r.out);
		/* zero weights: uniform logits, exactly ln 256 */
		cr_expect(fabs(num(j, "loss") - LN256) < 1e-5, "%.9g", num(j, "loss"));
		cJSON_Delete(j);
	}
	run_free(&r);
	/* a shape flag the file disagrees with is refused by tensor */
	gen(&sb, &r, "eval", "--model", model, "--cpu", "--embd", "64", NULL);
	expect_one_line_error(&r, 1, "embed.weight");
	run_free(&r);

	write_data(&sb, "tiny.bin", 50, 1, data, sizeof(data), NULL);
	gen(&sb, &r, "eval", "--model", model, "--data", data, "--time", "16", "--cpu", NULL);
	expect_one_line_error(&r, 1, "50 bytes");
	cr_expect(strstr(r.err, "at least 170 bytes") != NULL, "%s", r.err);
	run_free(&r);
	gen(&sb, &r, "eval", "--model", model, "--data", "/nonexistent.bin", "--cpu", NULL);
	expect_one_line_error(&r, 1, "/nonexistent.bin");
	run_free(&r);

	/* --json: the error as an object too; 15 bytes are too short even for
	 * the capped default T (a split of 1 byte holds no row of T+1 >= 2) */
	write_data(&sb, "tinier.bin", 15, 1, data, sizeof(data), NULL);
	gen(&sb, &r, "eval", "--model", model, "--data", data, "--cpu", "--json", NULL);
	cr_expect_eq(r.code, 1);
	cJSON *j = parse_json(r.out);
	cr_expect(strstr(str(j, "error"), "too short") != NULL, "%s", r.out);
	cr_expect_eq(num(j, "exit"), 1);
	cJSON_Delete(j);
	run_free(&r);
	dg_model_weights_destroy(w);
	sandbox_fini(&sb);
}

/* eval --data naming a directory or a FIFO: one line naming the path and
 * what it is; the FIFO is never waited on (killed after 30 s here). */
Test(cli_dragon, data_that_is_not_a_file_is_refused)
{
	sandbox sb;
	run r;
	char model[700], dir[700], fifo[700], want[900];
	dg_model_weights *w = setup(&sb, model, sizeof(model));
	snprintf(dir, sizeof(dir), "%s/data.d", sb.root);
	snprintf(fifo, sizeof(fifo), "%s/data.fifo", sb.root);
	cr_assert_eq(mkdir(dir, 0700), 0);
	cr_assert_eq(mkfifo(fifo, 0600), 0);

	gen(&sb, &r, "eval", "--model", model, "--data", dir, "--cpu", NULL);
	snprintf(want, sizeof(want), "dragon: --data %s: a directory, not a regular file", dir);
	expect_one_line_error(&r, 1, want);
	run_free(&r);
	const char *args[] = { "eval", "--model", model, "--data", fifo, "--cpu", NULL };
	gen_within(&sb, &r, 30, args);
	snprintf(want, sizeof(want), "dragon: --data %s: a FIFO (named pipe), not a regular file", fifo);
	expect_one_line_error(&r, 1, want);
	run_free(&r);
	dg_model_weights_destroy(w);
	sandbox_fini(&sb);
}

/* --grads past a file-size limit (`ulimit -f`: SIGXFSZ at its default
 * action, which once killed eval without a word): exit 1, one line naming
 * the file and "too large", and no file left. */
Test(cli_dragon, grads_past_the_file_size_limit_name_the_file)
{
	sandbox sb;
	run r;
	char model[700], grads[700], want[900];
	struct stat st;
	dg_model_weights *w = setup(&sb, model, sizeof(model));
	snprintf(grads, sizeof(grads), "%s/grads.safetensors", sb.root);
	cr_assert_eq(stat(model, &st), 0);
	const char *args[] = { "eval", "--model", model, "--cpu", "--grads", grads, "--batch", "1",
			       "--time", "8", "--batches", "1", NULL };
	gen_fsize(&sb, &r, (unsigned long long)st.st_size / 2, args);
	cr_assert_neq(r.code, 128 + SIGXFSZ, "killed by SIGXFSZ: %s", r.err);
	snprintf(want, sizeof(want), "dragon: --grads %s: write: File too large", grads);
	expect_one_line_error(&r, 1, want);
	run_free(&r);
	cr_assert_not(exists(grads));
	char *names = listing(sb.root);
	cr_assert(strstr(names, ".tmp.") == NULL, "a temp file was left:\n%s", names);
	free(names);
	dg_model_weights_destroy(w);
	sandbox_fini(&sb);
}

/* bytes (n of them) into path, a new file. */
static void put(const char *path, const void *bytes, size_t n)
{
	unlink(path);
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "%s", path);
	cr_assert_eq(fwrite(bytes, 1, n, f), n);
	fclose(f);
}

/* eval reads weights as every reader does: a checkpoint whose metadata
 * or tensors have a flipped bit (the step; an exponent bit of lm_head)
 * is damaged, a NaN weight is named, gradients are not weights. */
Test(cli_dragon, damaged_or_not_finite_models_are_refused)
{
	sandbox sb;
	run r;
	char model[700], path[700], ckpt[700], msg[512];
	dg_model_weights *w = setup(&sb, model, sizeof(model));
	const char *small[] = { "--cpu", "--batch", "1", "--time", "8", "--batches", "1" };
#define SMALL small[0], small[1], small[2], small[3], small[4], small[5], small[6]
	dg_adamw_config o;
	dg_adamw_defaults(&o, 10);
	dg_train_state *s = NULL;
	cr_assert_eq(dg_train_state_create(w, 1, &o, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	s->step = 4;
	snprintf(ckpt, sizeof(ckpt), "%s/ckpt.safetensors", sb.root);
	cr_assert_eq(dg_checkpoint_save(s, ckpt, msg, sizeof(msg)), DG_OK, "%s", msg);
	gen(&sb, &r, "eval", "--model", ckpt, SMALL, NULL);
	cr_assert_eq(r.code, 0, "a checkpoint as --model: %s", r.err);
	run_free(&r);

	size_t n;
	char *bytes = slurp(ckpt, &n);
	char *at = strstr(bytes + 8, "\"step\":\"4\"");
	cr_assert_not_null(at);
	at[8] ^= 1; /* "4" -> "5" */
	snprintf(path, sizeof(path), "%s/step.safetensors", sb.root);
	put(path, bytes, n);
	at[8] ^= 1;
	free(bytes);
	gen(&sb, &r, "eval", "--model", path, SMALL, NULL);
	expect_one_line_error(&r, 1, "step.safetensors: damaged: ");
	run_free(&r);

	/* the weights file's last float is lm_head's: its exponent's top bit */
	bytes = slurp(model, &n);
	bytes[n - 1] ^= 0x40;
	snprintf(path, sizeof(path), "%s/exp.safetensors", sb.root);
	put(path, bytes, n);
	free(bytes);
	gen(&sb, &r, "eval", "--model", path, SMALL, NULL);
	expect_one_line_error(&r, 1, "exp.safetensors: damaged: ");
	run_free(&r);

	w->params[DG_PARAM_LM_HEAD][7] = NAN;
	snprintf(path, sizeof(path), "%s/nan.safetensors", sb.root);
	cr_assert_eq(dg_model_weights_save(w, path, msg, sizeof(msg)), DG_OK, "%s", msg);
	gen(&sb, &r, "eval", "--model", path, SMALL, NULL);
	expect_one_line_error(&r, 1, "nan.safetensors: lm_head[7] is nan");
	run_free(&r);
	/* in a checkpoint, a moment too (eval reads it whole) */
	s->v[DG_PARAM_DECODER][2] = -1.0f;
	cr_assert_eq(dg_checkpoint_save(s, path, msg, sizeof(msg)), DG_OK, "%s", msg);
	gen(&sb, &r, "eval", "--model", path, SMALL, NULL);
	expect_one_line_error(&r, 1, "nan.safetensors: adamw.v.decoder[2] is -1");
	run_free(&r);

	snprintf(path, sizeof(path), "%s/grads.safetensors", sb.root);
	gen_ok(&sb, "eval", "--model", model, SMALL, "--grads", path, NULL);
	gen(&sb, &r, "eval", "--model", path, SMALL, NULL);
	expect_one_line_error(&r, 1, "grads.safetensors: a gradients file");
	run_free(&r);
	dg_train_state_destroy(s);
	dg_model_weights_destroy(w);
	sandbox_fini(&sb);
#undef SMALL
}

/* --grads never overwrites an input: the model (by its path, another
 * spelling of it, a symlink to it) or the data; exit 2, the file as it
 * was. */
Test(cli_dragon, grads_never_overwrite_an_input)
{
	sandbox sb;
	run r;
	char model[700], data[700], other[700], link[700];
	dg_model_weights *w = setup(&sb, model, sizeof(model));
	write_data(&sb, "data.bin", 400, 1, data, sizeof(data), NULL);
	snprintf(other, sizeof(other), "%s/./sub/../model.safetensors", sb.root);
	snprintf(link, sizeof(link), "%s/sub", sb.root);
	cr_assert_eq(mkdir(link, 0755), 0);
	snprintf(link, sizeof(link), "%s/link.safetensors", sb.root);
	cr_assert_eq(symlink(model, link), 0);
	size_t n, n2;
	char *before = slurp(model, &n), *dbefore = slurp(data, &n2);
	const char *const grads[] = { model, other, link };
	for (int i = 0; i < 3; i++) {
		gen(&sb, &r, "eval", "--model", model, "--cpu", "--batch", "1", "--time", "8", "--batches", "1",
		    "--grads", grads[i], NULL);
		expect_one_line_error(&r, 2, "the same file as --model");
		run_free(&r);
	}
	gen(&sb, &r, "eval", "--model", model, "--data", data, "--cpu", "--batch", "1", "--time", "8",
	    "--batches", "1", "--grads", data, NULL);
	expect_one_line_error(&r, 2, "the same file as --data");
	run_free(&r);
	size_t m, m2;
	char *after = slurp(model, &m), *dafter = slurp(data, &m2);
	cr_assert(m == n && memcmp(before, after, n) == 0, "--grads changed the model");
	cr_assert(m2 == n2 && memcmp(dbefore, dafter, n2) == 0, "--grads changed the data");
	free(before), free(after), free(dbefore), free(dafter);
	/* the model still loads as it did */
	gen_ok(&sb, "eval", "--model", model, "--cpu", "--batch", "1", "--time", "8", "--batches", "1", NULL);
	dg_model_weights_destroy(w);
	sandbox_fini(&sb);
}

Test(cli_dragon, help_and_version)
{
	sandbox sb;
	run r;
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(&sb);
	gen(&sb, &r, "--help", NULL);
	cr_expect_eq(r.code, 0);
	cr_expect(strstr(r.out, "usage: dragon <command>") != NULL, "%s", r.out);
	run_free(&r);
	gen(&sb, &r, "eval", "--help", NULL);
	cr_expect_eq(r.code, 0);
	cr_expect_eq(strncmp(r.out, "usage: dragon eval", 18), 0, "%s", r.out);
	cr_expect_str_empty(r.err);
	run_free(&r);
	gen(&sb, &r, "help", "eval", NULL);
	cr_expect_eq(r.code, 0);
	cr_expect_eq(strncmp(r.out, "usage: dragon eval", 18), 0, "%s", r.out);
	run_free(&r);
	/* train --gpus N runs on more than device 0 */
	gen(&sb, &r, "devices", "--help", NULL);
	cr_expect_eq(r.code, 0);
	cr_expect(strstr(r.out, "train --gpus N on devices 0 to N-1") != NULL, "%s", r.out);
	run_free(&r);
	gen(&sb, &r, "--version", NULL);
	cr_expect_eq(r.code, 0);
	cr_expect(strncmp(r.out, "dragon 0.", 9) == 0, "%s", r.out);
	run_free(&r);
	gen(&sb, &r, "frobnicate", NULL);
	expect_one_line_error(&r, 2, "frobnicate");
	run_free(&r);
	sandbox_fini(&sb);
}

/* dragon devices: what dg_device_count finds, each device a line (a
 * JSON list with --json), or none: exit 1 naming why. */
Test(cli_dragon, devices_lists_what_the_driver_finds)
{
	sandbox sb;
	run r;
	char why[512] = "";
	int n = 0;
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(&sb);
	cr_assert_eq(dg_device_count(&n, why, sizeof(why)), DG_OK, "%s", why);
	gen(&sb, &r, "devices", NULL);
	if (n == 0) {
		expect_one_line_error(&r, 1, "no CUDA device");
		cr_expect_str_empty(r.out);
	} else {
		cr_assert_eq(r.code, 0, "%s", r.err);
		cr_expect_eq(count_lines(r.out), n, "%s", r.out);
		cr_expect(strncmp(r.out, "0: ", 3) == 0 && strstr(r.out, "(sm_"), "%s", r.out);
	}
	run_free(&r);
	gen(&sb, &r, "devices", "--json", NULL);
	cJSON *j = parse_json(r.out);
	if (n == 0) {
		cr_expect_eq(r.code, 1);
		cr_expect(strstr(str(j, "error"), "no CUDA device"), "%s", r.out);
	} else {
		cr_expect_eq(r.code, 0, "%s", r.err);
		cr_expect_eq(num(j, "count"), n);
		cJSON *d = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "devices"), 0);
		cr_assert_not_null(d, "%s", r.out);
		cr_expect(num(d, "sm") >= 50 && num(d, "memory_bytes") > 0, "%s", r.out);
	}
	cJSON_Delete(j);
	run_free(&r);
	gen(&sb, &r, "devices", "extra", NULL);
	expect_one_line_error(&r, 2, "no argument 'extra'");
	run_free(&r);
	sandbox_fini(&sb);
}

/* ---- on a GPU ----------------------------------------------------------------- */

Test(cli_dragon, gpu_agrees_with_cpu)
{
	if (!gpu_or_skip())
		cr_skip_test("skipped: no CUDA device");
	sandbox sb;
	run r;
	char model[700], data[700];
	double want;
	dg_model_weights *w = eval_setup(&sb, model, data, &want);

	gen(&sb, &r, "eval", "--model", model, "--data", data, "--batch", "2", "--time", "16",
	    "--batches", "2", "--json", NULL);
	cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
	cJSON *j = parse_json(r.out);
	double loss = num(j, "loss");
	printf("eval on %s: loss %.9g, CPU %.9g (rel %.3g)\n", str(j, "device_name"), loss, want,
	       fabs(loss - want) / fabs(want));
	cr_expect_str_eq(str(j, "device"), "gpu");
	cr_expect(fabs(loss - want) <= 1e-5 * fabs(want), "GPU loss %.9g, CPU %.9g", loss, want);
	cJSON_Delete(j);
	run_free(&r);

	/* a low-bit recipe runs there: finite, near the f32 loss */
	gen(&sb, &r, "eval", "--model", model, "--data", data, "--batch", "2", "--time", "16",
	    "--batches", "1", "--preset", "w8a8", "--json", NULL);
	cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
	j = parse_json(r.out);
	cr_expect_str_eq(str(j, "preset"), "w8a8");
	cr_expect(isfinite(num(j, "loss")) && fabs(num(j, "loss") - want) < 0.1 * want, "w8a8 %.6g",
		  num(j, "loss"));
	cJSON_Delete(j);
	run_free(&r);
	dg_model_weights_destroy(w);
	sandbox_fini(&sb);
}
