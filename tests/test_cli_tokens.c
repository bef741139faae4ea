/*
 * `dragon train`, `eval` and `sample` on token corpora (the binary at
 * $DRAGON), the CPU model at a tiny shape on a cycle of 64 tokens spread
 * over the vocabulary (the top id among them):
 *   - raw uint16 tokens with --vocab 512: a run whose loss falls, its
 *     checkpoint of vocab 512;
 *   - llm.c's shards as a glob (the val shard beside the train ones), the
 *     default vocab 50304: --stop-at then --resume, the loss falling over
 *     the run, the checkpoint's corpus digest the corpus's (its shards and
 *     split); a resume after a val shard changed refused naming the data;
 *     eval over the val shard; sample printing ids (the prompt's, then
 *     --length drawn, space-separated, one line), the same for the same
 *     seed, greedy the argmax of the library's logits; a text prompt, no
 *     prompt and an id past the vocabulary refused (exit 2);
 *   - refusals before a step runs, one line naming the file and the byte
 *     offset (exit 1): a shard cut short, an odd raw file, a token past
 *     --vocab; a folder of train.bin without --vocab, --vocab past 65536
 *     and --vocab on the built-in bytes are usage errors (exit 2).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include "cli_helpers.h"
#include "dragon/checkpoint.h"
#include "dragon/data.h"
#include "dragon/model.h"

#define TINY "--cpu", "--preset", "f32", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64", \
	     "--batch", "2", "--time", "16", "--eval-batches", "1", "--seed", "3", "--lr", "0.01"

/* Token i of the cycle over a vocabulary of v: 64 ids spread over it,
 * v − 1 first. */
static unsigned cyc(long i, unsigned v)
{
	long k = i % 64;
	return k == 0 ? v - 1 : (unsigned)((k * 7919 + 13) % (v - 1));
}

/* path: n tokens of the cycle (from token first), a shard's header first
 * when shard; its token at index bad set to bad_v when bad >= 0. */
static void tokens(const char *path, long n, long first, unsigned v, bool shard, long bad, unsigned bad_v)
{
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "%s", path);
	if (shard) {
		uint32_t h[256] = { DG_SHARD_MAGIC, DG_SHARD_VERSION, (uint32_t)n };
		for (int i = 0; i < 256; i++)
			for (int b = 0; b < 4; b++)
				fputc((int)(h[i] >> (8 * b)) & 0xff, f);
	}
	for (long i = 0; i < n; i++) {
		unsigned t = i == bad ? bad_v : cyc(first + i, v);
		fputc((int)(t & 0xff), f);
		fputc((int)(t >> 8), f);
	}
	fclose(f);
}

/* The train losses of dir's log, in order (at most cap). */
static int losses(const char *dir, double *out, int cap)
{
	char path[700];
	size_t n;
	snprintf(path, sizeof(path), "%s/log.jsonl", dir);
	char *s = slurp(path, &n);
	cr_assert_not_null(s, "%s", path);
	int k = 0;
	for (char *line = strtok(s, "\n"); line && k < cap; line = strtok(NULL, "\n")) {
		cJSON *j = parse_json(line);
		out[k++] = num(j, "train_loss");
		cJSON_Delete(j);
	}
	free(s);
	return k;
}

/* The mean of the first three losses against the last three's: falling
 * by at least `by`. */
static void falls(const char *dir, int steps, double by)
{
	double l[64];
	cr_assert_eq(losses(dir, l, 64), steps);
	double a = (l[0] + l[1] + l[2]) / 3, b = (l[steps - 1] + l[steps - 2] + l[steps - 3]) / 3;
	printf("%s: loss %.4f -> %.4f\n", dir, a, b);
	cr_expect(b < a - by, "%s: the loss went from %.4f to %.4f", dir, a, b);
}

static dg_train_state *load(const char *ckpt)
{
	char msg[1024];
	dg_train_state *s = NULL;
	cr_assert_eq(dg_checkpoint_load(ckpt, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	return s;
}

/* The train run r trained out to step `steps` at vocab V: it exited 0,
 * its JSON says the vocab (and steps_run steps run, unless -1), the loss
 * falls (falls, by), and its checkpoint of step `steps` (its path into
 * ckpt, 800 bytes) has the vocab; that checkpoint's state. */
static dg_train_state *trained(run *r, const char *out, int steps, double by, int vocab, int steps_run, char *ckpt)
{
	cr_assert_eq(r->code, 0, "%s", r->err);
	cJSON *j = parse_json(r->out);
	cr_expect_eq(num(j, "vocab"), vocab);
	if (steps_run >= 0)
		cr_expect_eq(num(j, "steps"), steps_run);
	cJSON_Delete(j);
	run_free(r);
	falls(out, steps, by);
	snprintf(ckpt, 800, "%s/ckpt-%08d.safetensors", out, steps);
	dg_train_state *s = load(ckpt);
	cr_expect_eq(s->weights->config.vocab, vocab);
	return s;
}

Test(cli_tokens, raw_tokens_at_vocab_512)
{
	sandbox sb;
	run r;
	char data[700], out[700], ckpt[800];
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(&sb);
	snprintf(data, sizeof(data), "%s/tokens.u16", sb.root);
	tokens(data, 20000, 0, 512, false, -1, 0);
	snprintf(out, sizeof(out), "%s/run", sb.root);
	gen(&sb, &r, "train", TINY, "--steps", "12", "--eval-every", "12", "--data", data, "--vocab", "512", "--out",
	    out, "--json", NULL);
	dg_train_state_destroy(trained(&r, out, 12, 1.0, 512, -1, ckpt));
	sandbox_fini(&sb);
}

/* The greedy ids after ctx (n of them): argmax of the CPU model's logits,
 * k times. */
static void greedy(const dg_train_state *s, const int32_t *ctx, int n, int k, int32_t *out)
{
	char msg[1024];
	const int V = s->weights->config.vocab;
	int32_t all[64];
	float *z = malloc((size_t)V * sizeof(float));
	cr_assert(z && n + k <= 16);
	memcpy(all, ctx, (size_t)n * sizeof(int32_t));
	for (int i = 0; i < k; i++) {
		dg_model_batch b = { .idx = all, .b = 1, .t = n + i };
		cr_assert_eq(dg_model_cpu_logits(s->weights, &b, n + i - 1, z, msg, sizeof(msg)), DG_OK, "%s", msg);
		int best = 0;
		for (int v = 1; v < V; v++)
			if (z[v] > z[best])
				best = v;
		all[n + i] = out[i] = best;
	}
	free(z);
}

Test(cli_tokens, llmc_shards_train_resume_eval_and_sample)
{
	sandbox sb;
	run r, r2;
	char p[700], glob[700], out[700], ckpt[800];
	const unsigned V = DG_SHARD_VOCAB;
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(&sb);
	snprintf(p, sizeof(p), "%s/tok_train_000001.bin", sb.root);
	tokens(p, 3000, 0, V, true, -1, 0);
	snprintf(p, sizeof(p), "%s/tok_train_000002.bin", sb.root);
	tokens(p, 3000, 3000, V, true, -1, 0);
	snprintf(p, sizeof(p), "%s/tok_val_000000.bin", sb.root);
	tokens(p, 1000, 17, V, true, -1, 0);
	snprintf(glob, sizeof(glob), "%s/tok_train_*.bin", sb.root);
	snprintf(out, sizeof(out), "%s/run", sb.root);

	/* stopped at 5, resumed to 10: the shards' digest held */
	gen_ok(&sb, "train", TINY, "--steps", "10", "--eval-every", "5", "--data", glob, "--out", out, "--stop-at",
	       "5", NULL);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--eval-every", "5", "--data", glob, "--out", out, "--resume",
	    "--json", NULL);
	dg_train_state *s = trained(&r, out, 10, 0.5, (int)V, 5, ckpt);
	char msg[1024], hex[65];
	dg_corpus *c = NULL;
	cr_assert_eq(dg_corpus_open(glob, &c, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(c->n_val_files, 1);
	cr_assert_eq(dg_corpus_digest(c, hex, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_expect_str_eq(s->corpus_sha256, hex);
	dg_corpus_close(c);

	/* eval: the val shard's tokens */
	gen(&sb, &r, "eval", "--model", ckpt, "--data", glob, "--cpu", "--batch", "2", "--time", "16", "--batches",
	    "2", "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	cr_expect_eq(num(j, "split_tokens"), 1000);
	cr_expect(isfinite(num(j, "loss")) && num(j, "loss") > 0, "%s", r.out);
	cJSON_Delete(j);
	run_free(&r);

	/* sample: ids, one line; the same seed, the same ids */
	gen(&sb, &r, "sample", out, "--cpu", "--prompt-ids", "50303,7", "--length", "6", "--seed", "1", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_assert_eq(count_lines(r.out), 1, "%s", r.out);
	cr_assert_eq(strncmp(r.out, "50303 7 ", 8), 0, "%s", r.out);
	gen(&sb, &r2, "sample", out, "--cpu", "--prompt-ids", "50303,7", "--length", "6", "--seed", "1", NULL);
	cr_assert(r2.code == 0 && strcmp(r.out, r2.out) == 0, "%s | %s", r.out, r2.out);
	run_free(&r2);
	int n = 0;
	for (char *t = strtok(r.out, " \n"); t; t = strtok(NULL, " \n"), n++) {
		char *end;
		long id = strtol(t, &end, 10);
		cr_assert(*end == '\0' && id >= 0 && id < (long)V, "'%s' is not an id below %u", t, V);
	}
	cr_assert_eq(n, 8, "%d ids printed", n);
	run_free(&r);
	/* greedy: the library's argmax */
	gen(&sb, &r, "sample", ckpt, "--cpu", "--prompt-ids", "50303,7", "--length", "4", "--temperature", "0", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	int32_t ctx[2] = { 50303, 7 }, g[4];
	greedy(s, ctx, 2, 4, g);
	char want[128];
	snprintf(want, sizeof(want), "50303 7 %d %d %d %d\n", g[0], g[1], g[2], g[3]);
	cr_expect_str_eq(r.out, want);
	run_free(&r);
	dg_train_state_destroy(s);
	gen(&sb, &r, "sample", out, "--cpu", "--prompt", "hi", NULL);
	expect_one_line_error(&r, 2, "--prompt TEXT: the model reads a vocabulary of 50304, token ids");
	run_free(&r);
	gen(&sb, &r, "sample", out, "--cpu", NULL);
	expect_one_line_error(&r, 2, "--prompt-ids");
	run_free(&r);
	gen(&sb, &r, "sample", out, "--cpu", "--prompt-ids", "3,50304", NULL);
	expect_one_line_error(&r, 2, "--prompt-ids 3,50304: id 2");
	run_free(&r);

	/* another val shard: another corpus, a resume refused naming it */
	snprintf(out, sizeof(out), "%s/run2", sb.root);
	gen_ok(&sb, "train", TINY, "--steps", "4", "--eval-every", "2", "--data", glob, "--out", out, "--stop-at",
	       "2", NULL);
	snprintf(p, sizeof(p), "%s/tok_val_000000.bin", sb.root);
	tokens(p, 1000, 18, V, true, -1, 0);
	gen(&sb, &r, "train", TINY, "--steps", "4", "--eval-every", "2", "--data", glob, "--out", out, "--resume",
	    NULL);
	expect_one_line_error(&r, 2, "cannot resume: data: the checkpoint's corpus has SHA-256");
	run_free(&r);
	sandbox_fini(&sb);
}

Test(cli_tokens, bad_token_files_are_refused_before_a_step)
{
	sandbox sb;
	run r;
	char p[700], out[700];
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(&sb);
	snprintf(out, sizeof(out), "%s/run", sb.root);
	/* a shard whose header counts more tokens than it holds */
	snprintf(p, sizeof(p), "%s/cut_train_000000.bin", sb.root);
	tokens(p, 3000, 0, 50304, true, -1, 0);
	FILE *f = fopen(p, "r+b");
	cr_assert_not_null(f);
	cr_assert_eq(fseek(f, 8, SEEK_SET), 0);
	fputc(0xb9, f), fputc(0x0b, f); /* 3001 */
	fclose(f);
	gen(&sb, &r, "train", TINY, "--steps", "2", "--data", p, "--out", out, NULL);
	expect_one_line_error(&r, 1, "cut_train_000000.bin: byte offset 7024: truncated");
	cr_expect(!exists(out), "a refused run made %s", out);
	run_free(&r);
	/* a raw file of an odd size; a token past --vocab */
	snprintf(p, sizeof(p), "%s/odd.u16", sb.root);
	tokens(p, 3000, 0, 512, false, -1, 0);
	f = fopen(p, "ab");
	cr_assert_not_null(f);
	fputc(1, f);
	fclose(f);
	gen(&sb, &r, "train", TINY, "--steps", "2", "--data", p, "--vocab", "512", "--out", out, NULL);
	expect_one_line_error(&r, 1, "odd.u16: byte offset 6000: truncated");
	run_free(&r);
	snprintf(p, sizeof(p), "%s/big.u16", sb.root);
	tokens(p, 3000, 0, 512, false, 2500, 512);
	gen(&sb, &r, "train", TINY, "--steps", "2", "--data", p, "--vocab", "512", "--out", out, NULL);
	expect_one_line_error(&r, 1, "big.u16: byte offset 5000: token 512 is outside the vocabulary 0..511");
	run_free(&r);
	/* eval holds the data to the model's vocabulary too */
	snprintf(p, sizeof(p), "%s/ok.u16", sb.root);
	tokens(p, 3000, 0, 512, false, -1, 0);
	gen_ok(&sb, "train", TINY, "--steps", "1", "--data", p, "--vocab", "512", "--out", out, NULL);
	char ckpt[800];
	snprintf(ckpt, sizeof(ckpt), "%s/ckpt-00000001.safetensors", out);
	snprintf(p, sizeof(p), "%s/cut_train_000000.bin", sb.root);
	tokens(p, 3000, 0, 50304, true, -1, 0);
	gen(&sb, &r, "eval", "--model", ckpt, "--data", p, "--cpu", "--batch", "2", "--time", "16", NULL);
	expect_one_line_error(&r, 1, "is outside the vocabulary 0..511");
	run_free(&r);
	/* usage: raw tokens without a vocabulary, a vocabulary past uint16's */
	char dir[600];
	snprintf(dir, sizeof(dir), "%.500s/nano", sb.root);
	cr_assert_eq(mkdir(dir, 0700), 0);
	snprintf(p, sizeof(p), "%s/train.bin", dir);
	tokens(p, 3000, 0, 512, false, -1, 0);
	gen(&sb, &r, "train", TINY, "--steps", "2", "--data", dir, "--out", out, NULL);
	expect_one_line_error(&r, 2, "train.bin: raw uint16 tokens: give their vocabulary (--vocab V");
	run_free(&r);
	gen(&sb, &r, "train", TINY, "--steps", "2", "--data", dir, "--vocab", "65537", "--out", out, NULL);
	expect_one_line_error(&r, 2, "--vocab");
	run_free(&r);
	gen(&sb, &r, "train", TINY, "--steps", "2", "--vocab", "512", "--out", out, NULL);
	expect_one_line_error(&r, 2, "--vocab 512: the built-in corpus is bytes");
	run_free(&r);
	sandbox_fini(&sb);
}
