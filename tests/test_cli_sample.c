/*
 * `dragon sample` as a user runs it (the binary at $DRAGON), from a tiny
 * model trained a few steps on the CPU (the flags of test_cli_train.c's
 * TINY) on a generated text:
 *   - a run's folder and its newest checkpoint give the same text; the
 *     same seed gives the same bytes, another seed others; --length is
 *     the bytes printed after the prompt, exactly;
 *   - temperature 0 is the greedy text whatever the seed, and it is the
 *     argmax of dg_model_cpu_logits over the context the checkpoint's T
 *     keeps (the test slides it itself); --top-k 1 draws that same text;
 *     a prompt longer than T is printed whole and continued from its tail;
 *   - a bf16 checkpoint on the CPU runs as f32 on the same weights, with a
 *     note on stderr, and gives the f32 checkpoint's text;
 *   - bad flags, no checkpoint, a folder without one, a corrupt file, a
 *     weights file that is not a checkpoint, a NaN weight (named, before a
 *     byte is printed), diverged weights (a logit that is not finite), a
 *     flipped bit of the step (damaged) and a gradients file are refused
 *     with one line, exit 2 (usage) or 1 (failure).
 * On a GPU: sampling without --cpu prints the prompt and --length bytes,
 * the same for the same seed, and its greedy text is the CPU's (skipped
 * with "skipped: no CUDA device" otherwise).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/checkpoint.h"
#include "dragon/model.h"
#include "dragon/runtime.h"

#include "cli_helpers.h"

#define TINY "--cpu", "--preset", "f32", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64", \
	     "--batch", "2", "--time", "16", "--eval-every", "5", "--eval-batches", "2", "--seed", "3"

/* A run of 12 tiny steps in sb.root/run on a repeated sentence; the
 * folder into dir, its checkpoint into ckpt. */
static void trained(sandbox *sb, char *dir, char *ckpt, size_t size)
{
	static const char t[] = "Now is the winter of our discontent made glorious summer by this sun of York. ";
	char data[700];
	run r;
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(sb);
	snprintf(data, sizeof(data), "%s/text.txt", sb->root);
	FILE *f = fopen(data, "wb");
	cr_assert_not_null(f);
	for (size_t i = 0; i < 6000; i++)
		fputc(t[i % (sizeof(t) - 1)], f);
	fclose(f);
	snprintf(dir, size, "%s/run", sb->root);
	gen(sb, &r, "train", TINY, "--steps", "12", "--data", data, "--out", dir, NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	run_free(&r);
	snprintf(ckpt, size, "%s/ckpt-00000012.safetensors", dir);
	cr_assert(exists(ckpt), "%s", ckpt);
}

/* Whether two runs printed the same bytes. */
static bool same_out(const run *a, const run *b)
{
	return a->out_len == b->out_len && memcmp(a->out, b->out, a->out_len) == 0;
}

/* The greedy continuation of prompt by the library: argmax (the smallest
 * byte of a tie) of the CPU model's full forward at the last of every byte
 * so far (the CPU samples from a state: no window, the context passes the
 * checkpoint's T), n times. */
static void greedy(const char *ckpt, const char *prompt, int n, char *out)
{
	char msg[1024];
	dg_train_state *s = NULL;
	cr_assert_eq(dg_checkpoint_load(ckpt, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(s->time, 16, "the checkpoint's time");
	int len = (int)strlen(prompt);
	int32_t *all = malloc((size_t)(len + n) * sizeof(int32_t));
	float z[256];
	for (int i = 0; i < len; i++)
		all[i] = (unsigned char)prompt[i];
	for (int i = 0; i < n; i++) {
		int end = len + i, start = 0;
		dg_model_batch b = { .idx = all + start, .b = 1, .t = end - start };
		cr_assert_eq(dg_model_cpu_logits(s->weights, &b, end - start - 1, z, msg, sizeof(msg)), DG_OK,
			     "%s", msg);
		int best = 0;
		for (int v = 1; v < 256; v++)
			if (z[v] > z[best])
				best = v;
		all[end] = best;
		out[i] = (char)best;
	}
	free(all);
	dg_train_state_destroy(s);
}

Test(cli_sample, seeds_lengths_and_greedy)
{
	sandbox sb;
	run r, r2;
	char dir[700], ckpt[700];
	trained(&sb, dir, ckpt, sizeof(dir));

	/* the folder and its newest checkpoint: the same text */
	gen(&sb, &r, "sample", dir, "--cpu", "--prompt", "Now is", "--length", "57", "--seed", "5", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_assert_eq(r.out_len, 6 + 57, "printed %zu bytes", r.out_len);
	cr_assert_eq(memcmp(r.out, "Now is", 6), 0);
	gen(&sb, &r2, "sample", ckpt, "--cpu", "--prompt", "Now is", "--length", "57", "--seed", "5", NULL);
	cr_assert_eq(r2.code, 0, "%s", r2.err);
	cr_assert(same_out(&r, &r2), "the folder and its checkpoint gave different text");
	run_free(&r2);
	/* another seed: other bytes (a tiny model at 0.8 on 57 draws) */
	gen(&sb, &r2, "sample", dir, "--cpu", "--prompt", "Now is", "--length", "57", "--seed", "6", NULL);
	cr_assert_eq(r2.code, 0, "%s", r2.err);
	cr_assert(!same_out(&r, &r2), "seeds 5 and 6 gave the same text");
	run_free(&r2);
	run_free(&r);
	/* --length 0: the prompt alone; without a prompt: the bytes alone */
	gen(&sb, &r, "sample", dir, "--cpu", "--prompt", "Now is", "--length", "0", NULL);
	cr_assert(r.code == 0 && r.out_len == 6 && memcmp(r.out, "Now is", 6) == 0, "%s", r.err);
	run_free(&r);
	gen(&sb, &r, "sample", dir, "--cpu", "--length", "9", NULL);
	cr_assert(r.code == 0 && r.out_len == 9, "exit %d, %zu bytes: %s", r.code, r.out_len, r.err);
	run_free(&r);

	/* greedy: the library's argmax, whatever the seed; top-k 1 draws it */
	char want[40];
	greedy(ckpt, "Now is the winter", 40, want);
	gen(&sb, &r, "sample", dir, "--cpu", "--prompt", "Now is the winter", "--length", "40",
	    "--temperature", "0", "--seed", "1", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_assert_eq(r.out_len, 17 + 40);
	cr_assert_eq(memcmp(r.out + 17, want, 40), 0, "greedy: '%.40s', the library's '%.40s'", r.out + 17, want);
	gen(&sb, &r2, "sample", dir, "--cpu", "--prompt", "Now is the winter", "--length", "40",
	    "--temperature", "0", "--seed", "99", NULL);
	cr_assert(same_out(&r, &r2), "greedy text moved with the seed");
	run_free(&r2);
	gen(&sb, &r2, "sample", dir, "--cpu", "--prompt", "Now is the winter", "--length", "40",
	    "--temperature", "1", "--top-k", "1", "--seed", "4", NULL);
	cr_assert(same_out(&r, &r2), "--top-k 1 is not the greedy text");
	run_free(&r2);
	run_free(&r);

	/* a prompt longer than T (16): printed whole, continued from all of it */
	static const char longp[] = "made glorious summer by this sun of York. Now is the winter";
	greedy(ckpt, longp, 20, want);
	gen(&sb, &r, "sample", dir, "--cpu", "--prompt", longp, "--length", "20", "--temperature", "0", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_assert_eq(r.out_len, sizeof(longp) - 1 + 20);
	cr_assert_eq(memcmp(r.out, longp, sizeof(longp) - 1), 0);
	cr_assert_eq(memcmp(r.out + sizeof(longp) - 1, want, 20), 0, "long prompt: '%.20s', the library's '%.20s'",
		     r.out + sizeof(longp) - 1, want);
	run_free(&r);
	sandbox_fini(&sb);
}

/* A bf16 copy of the checkpoint: the CPU runs it as f32, says so, and
 * gives the f32 checkpoint's text. */
Test(cli_sample, bf16_on_the_cpu_runs_as_f32)
{
	sandbox sb;
	run r, r2;
	char dir[700], ckpt[700], bf[700], msg[1024];
	trained(&sb, dir, ckpt, sizeof(dir));
	dg_train_state *s = NULL;
	cr_assert_eq(dg_checkpoint_load(ckpt, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_model_config c = s->weights->config, b;
	cr_assert_eq(dg_model_preset("bf16", &b, msg, sizeof(msg)), DG_OK);
	b.layers = c.layers, b.embd = c.embd, b.heads = c.heads, b.neurons = c.neurons, b.vocab = c.vocab;
	b.dropout = c.dropout;
	s->weights->config = b;
	snprintf(bf, sizeof(bf), "%s/bf16.safetensors", sb.root);
	cr_assert_eq(dg_checkpoint_save(s, bf, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_train_state_destroy(s);

	gen(&sb, &r, "sample", bf, "--cpu", "--prompt", "Now", "--length", "30", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_assert(strstr(r.err, "note: the CPU model does not run the bf16 recipe"), "%s", r.err);
	cr_assert_eq(count_lines(r.err), 1, "%s", r.err);
	gen(&sb, &r2, "sample", ckpt, "--cpu", "--prompt", "Now", "--length", "30", NULL);
	cr_assert_eq(r2.code, 0, "%s", r2.err);
	cr_assert(same_out(&r, &r2), "the bf16 checkpoint on the CPU is not the f32 one's text");
	cr_assert_str_empty(r2.err);
	run_free(&r);
	run_free(&r2);
	sandbox_fini(&sb);
}

Test(cli_sample, refusals)
{
	sandbox sb;
	run r;
	char dir[700], ckpt[700], path[700], msg[1024];
	trained(&sb, dir, ckpt, sizeof(dir));
	gen(&sb, &r, "sample", NULL);
	expect_one_line_error(&r, 2, "name a checkpoint or a run's folder");
	run_free(&r);
	gen(&sb, &r, "sample", dir, ckpt, NULL);
	expect_one_line_error(&r, 2, "not also");
	run_free(&r);
	gen(&sb, &r, "sample", dir, "--length", "many", NULL);
	expect_one_line_error(&r, 2, "--length many");
	run_free(&r);
	gen(&sb, &r, "sample", dir, "--temperature", "-1", NULL);
	expect_one_line_error(&r, 2, "--temperature -1");
	run_free(&r);
	gen(&sb, &r, "sample", dir, "--top-k", "1.5", NULL);
	expect_one_line_error(&r, 2, "--top-k 1.5");
	run_free(&r);
	gen(&sb, &r, "sample", dir, "--time", "0", NULL);
	expect_one_line_error(&r, 2, "--time 0");
	run_free(&r);
	gen(&sb, &r, "sample", dir, "--frobnicate", NULL);
	expect_one_line_error(&r, 2, "--frobnicate");
	run_free(&r);
	/* no such path; a folder without checkpoints */
	gen(&sb, &r, "sample", "/nonexistent/run", "--cpu", NULL);
	expect_one_line_error(&r, 1, "/nonexistent/run");
	run_free(&r);
	gen(&sb, &r, "sample", sb.root, "--cpu", NULL);
	expect_one_line_error(&r, 1, "no checkpoint");
	run_free(&r);
	/* a truncated checkpoint; a weights file that is not a checkpoint */
	size_t n;
	char *bytes = slurp(ckpt, &n);
	snprintf(path, sizeof(path), "%s/cut.safetensors", sb.root);
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(bytes, 1, n / 2, f), n / 2);
	fclose(f);
	free(bytes);
	gen(&sb, &r, "sample", path, "--cpu", NULL);
	expect_one_line_error(&r, 1, "cut.safetensors");
	cr_assert_eq(r.out_len, 0, "a refused sample printed '%s'", r.out);
	run_free(&r);
	dg_train_state *s = NULL;
	cr_assert_eq(dg_checkpoint_load(ckpt, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	snprintf(path, sizeof(path), "%s/weights.safetensors", sb.root);
	cr_assert_eq(dg_model_weights_save(s->weights, path, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_train_state_destroy(s);
	gen(&sb, &r, "sample", path, "--cpu", NULL);
	expect_one_line_error(&r, 1, "not a checkpoint");
	run_free(&r);
	/* a weight that is not a number: refused before a byte is printed,
	 * naming the tensor and the index */
	cr_assert_eq(dg_checkpoint_load(ckpt, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	s->weights->params[DG_PARAM_LM_HEAD][3] = NAN;
	snprintf(path, sizeof(path), "%s/nan.safetensors", sb.root);
	cr_assert_eq(dg_checkpoint_save(s, path, msg, sizeof(msg)), DG_OK, "%s", msg);
	gen(&sb, &r, "sample", path, "--cpu", "--prompt", "Now", NULL);
	expect_one_line_error(&r, 1, "nan.safetensors: lm_head[3] is nan");
	cr_assert_eq(r.out_len, 0, "a refused sample printed '%s'", r.out);
	run_free(&r);
	/* diverged weights, finite but too large: a logit that is not finite
	 * stops it, named (lm_head all ±3e38, the signs random: the final
	 * norm's output, of mean 0 and variance 1, times a column overflows) */
	const int nh = s->weights->config.embd * s->weights->config.vocab;
	for (int i = 0; i < nh; i++)
		s->weights->params[DG_PARAM_LM_HEAD][i] = ((unsigned)i * 2654435761u) >> 31 ? 3e38f : -3e38f;
	cr_assert_eq(dg_checkpoint_save(s, path, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_train_state_destroy(s);
	gen(&sb, &r, "sample", path, "--cpu", "--prompt", "Now", NULL);
	expect_one_line_error(&r, 1, "are not finite (logit ");
	cr_expect(strstr(r.err, "the weights have diverged"), "%s", r.err);
	cr_expect(r.out_len == 3 && memcmp(r.out, "Now", 3) == 0, "printed %zu bytes", r.out_len);
	run_free(&r);
	/* a flipped bit of the metadata (the step): damaged, named */
	bytes = slurp(ckpt, &n);
	char *at = strstr(bytes + 8, "\"step\":\"12\"");
	cr_assert_not_null(at);
	at[9] ^= 1; /* 12 -> 13 */
	snprintf(path, sizeof(path), "%s/flip.safetensors", sb.root);
	f = fopen(path, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(bytes, 1, n, f), n);
	fclose(f);
	free(bytes);
	gen(&sb, &r, "sample", path, "--cpu", NULL);
	expect_one_line_error(&r, 1, "flip.safetensors: damaged: ");
	cr_assert_eq(r.out_len, 0, "a refused sample printed '%s'", r.out);
	run_free(&r);
	/* gradients are not a checkpoint */
	char grads[700];
	snprintf(grads, sizeof(grads), "%s/grads.safetensors", sb.root);
	gen_ok(&sb, "eval", "--model", ckpt, "--cpu", "--batch", "1", "--time", "8", "--batches", "1", "--grads",
	       grads, NULL);
	gen(&sb, &r, "sample", grads, "--cpu", NULL);
	expect_one_line_error(&r, 1, "grads.safetensors: a gradients file");
	run_free(&r);
	gen(&sb, &r, "sample", "--help", NULL);
	cr_assert_eq(r.code, 0);
	cr_assert_eq(strncmp(r.out, "usage: dragon sample", 20), 0, "%s", r.out);
	run_free(&r);
	sandbox_fini(&sb);
}

/* ---- on a GPU ----------------------------------------------------------------- */

Test(cli_sample, gpu_samples)
{
	char why[512] = "";
	int n = 0;
	if (dg_device_count(&n, why, sizeof(why)) != DG_OK || n == 0) {
		const char *req = getenv("DRAGON_REQUIRE_GPU");
		cr_assert(!(req && strcmp(req, "1") == 0), "DRAGON_REQUIRE_GPU=1 and no device: %s", why);
		printf("skipped: no CUDA device (%s)\n", why);
		cr_skip_test("skipped: no CUDA device");
	}
	sandbox sb;
	run r, r2;
	char dir[700], ckpt[700];
	trained(&sb, dir, ckpt, sizeof(dir));
	gen(&sb, &r, "sample", dir, "--prompt", "Now is", "--length", "50", "--seed", "5", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_assert(r.out_len == 56 && memcmp(r.out, "Now is", 6) == 0, "%zu bytes: %s", r.out_len, r.err);
	gen(&sb, &r2, "sample", dir, "--prompt", "Now is", "--length", "50", "--seed", "5", NULL);
	cr_assert(same_out(&r, &r2), "the same seed on the GPU gave another text");
	run_free(&r);
	run_free(&r2);
	/* greedy on the GPU is the CPU's (f32: logits 1e-5 apart, far below
	 * the gaps between a trained model's first and second bytes) while
	 * the context fits the GPU's window (T 16: the CPU's has none) */
	gen(&sb, &r, "sample", dir, "--prompt", "Now is", "--length", "10", "--temperature", "0", NULL);
	gen(&sb, &r2, "sample", dir, "--prompt", "Now is", "--length", "10", "--temperature", "0", "--cpu", NULL);
	cr_assert(r.code == 0 && r2.code == 0, "%s %s", r.err, r2.err);
	cr_expect(same_out(&r, &r2), "greedy GPU '%.*s', CPU '%.*s'", (int)r.out_len, r.out, (int)r2.out_len,
		  r2.out);
	run_free(&r);
	run_free(&r2);
	sandbox_fini(&sb);
}
