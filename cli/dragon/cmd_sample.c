/*
 * dragon sample — text from a checkpoint of `dragon train`: the prompt,
 * then N bytes, each drawn from the model's distribution of the next byte
 * given the bytes before it, with a temperature and top-k, from a seeded
 * stream (the same seed, the same text; dragon/sample.h draws). A model of
 * another vocabulary than bytes reads its prompt as token ids and prints
 * token ids, space-separated.
 *
 * The model decodes from a state (dragon/model.h dg_model_state), on the
 * GPU or the CPU: the prompt is consumed once, then each byte costs the
 * same at any position, and the context is every byte before it (no
 * window; --time is kept for the command lines that give it, and checked,
 * but no longer bounds the context).
 *
 * Recipes: the GPU model runs the checkpoint's; the CPU model (no GPU, or
 * --cpu) runs f32, w8a8 and bitnet, and a recipe it does not run (bf16,
 * seed) with the f32 one on the same f32 masters, saying so on stderr:
 * bf16's rounding is what the GPU adds to those weights, so the text
 * differs from the GPU's in its draws, not in kind.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/common/cli.h"
#include "cli/common/scan.h"
#include "cli/dragon/cmd.h"
#include "cli/dragon/device.h"
#include "dragon/checkpoint.h"
#include "dragon/model.h"
#include "dragon/rng.h"
#include "dragon/sample.h"

static const char help_text[] =
	"usage: dragon sample CKPT|DIR [--prompt TEXT | --prompt-ids ID,...] [--length N]\n"
	"                     [--temperature X] [--top-k K] [--seed S] [--time T] [--cpu]\n\n"
	"Generates bytes from a checkpoint of `dragon train`: the prompt, then N bytes,\n"
	"each drawn from the model's distribution of the next byte given all the\n"
	"bytes before it (the model keeps a state: a byte costs the same at any\n"
	"length, and there is no window). A model whose vocabulary is\n"
	"not bytes (256) generates token ids: its prompt is given as ids, and it\n"
	"prints the prompt's ids and each id drawn, space-separated, on one line.\n\n"
	"  CKPT|DIR          a checkpoint (ckpt-<step>.safetensors), or a run's folder:\n"
	"                    its newest checkpoint\n"
	"  --prompt TEXT     the text to continue (default none: the model starts after\n"
	"                    a newline, which is not printed)\n"
	"  --prompt-ids L    the prompt as token ids, comma-separated (each below the\n"
	"                    vocabulary); a model of token ids needs one (llm.c's GPT-2\n"
	"                    shards: 50256, end of text, starts a document)\n"
	"  --length N        bytes (tokens) to generate after the prompt (200)\n"
	"  --temperature X   divides the logits (0.8); 0 takes the most likely byte\n"
	"                    each time (greedy)\n"
	"  --top-k K         draw among the K most likely bytes (40; 0 all)\n"
	"  --seed S          the draws (1337): the same seed, the same text\n"
	"  --time T          accepted for older command lines; the context is the\n"
	"                    whole text\n"
	"  --cpu             the CPU model even with a GPU (it runs f32, w8a8 and\n"
	"                    bitnet; a bf16 checkpoint runs with f32 arithmetic on its\n"
	"                    weights, said on stderr)\n\n"
	"Runs on GPU 0 when there is one. Prints the prompt, then each byte as it is\n"
	"drawn, raw, to stdout (token ids: in decimal, a space between, a newline at\n"
	"the end).\n"
	"Exit status: 0 ok, 1 failure (the checkpoint, the device), 2 usage.\n";

enum { O_PROMPT = 1, O_LENGTH, O_TEMP, O_TOPK, O_SEED, O_TIME, O_CPU, O_HELP, O_PROMPT_IDS };

static const dg__cli_opt opts[] = {
	{ "prompt", 'p', true, O_PROMPT },   { "length", 'n', true, O_LENGTH },
	{ "temperature", 0, true, O_TEMP },  { "top-k", 'k', true, O_TOPK },
	{ "seed", 's', true, O_SEED },       { "time", 't', true, O_TIME },
	{ "cpu", 0, false, O_CPU },          { "help", 'h', false, O_HELP },
	{ "prompt-ids", 0, true, O_PROMPT_IDS }, { NULL, 0, false, 0 },
};

typedef struct sample_args {
	const char *path, *prompt;
	const char *prompt_ids; /* --prompt-ids, as given; NULL none */
	uint64_t length, top_k, seed, time; /* time 0: the checkpoint's */
	double temperature;
	bool cpu;
} sample_args;

/* 0 parsed, -1 --help printed, else the exit code (reported). */
static int parse(int argc, char **argv, sample_args *a)
{
	dg__cli_scan_state s;
	const char *v;
	int id;

	memset(a, 0, sizeof(*a));
	a->prompt = "";
	a->length = 200;
	a->temperature = 0.8;
	a->top_k = 40;
	a->seed = 1337;
	dg__cli_scan_init(&s, argc, argv, "sample");
	while ((id = dg__cli_scan(&s, opts, &v)) != DG__CLI_SCAN_END) {
		bool ok = true;
		switch (id) {
		case DG__CLI_SCAN_ERROR:
			return DG__CLI_USAGE;
		case DG__CLI_SCAN_ARG:
			if (a->path)
				return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
						   "sample takes one checkpoint or folder, not also '%s'; see `dragon sample --help`",
						   v);
			a->path = v;
			break;
		case O_HELP:
			fputs(help_text, stdout);
			return -1;
		case O_PROMPT: a->prompt = v; break;
		case O_PROMPT_IDS: a->prompt_ids = v; break;
		case O_CPU: a->cpu = true; break;
		case O_LENGTH: ok = dg__cli_parse_u64("--length", v, 0, 1u << 30, &a->length); break;
		case O_TOPK: ok = dg__cli_parse_u64("--top-k", v, 0, 1u << 20, &a->top_k); break;
		case O_SEED: ok = dg__cli_parse_u64("--seed", v, 0, UINT64_MAX, &a->seed); break;
		case O_TIME: ok = dg__cli_parse_u64("--time", v, 1, 1u << 20, &a->time); break;
		case O_TEMP: {
			char *end;
			errno = 0;
			a->temperature = strtod(v, &end);
			if (errno || end == v || *end || !isfinite(a->temperature) || a->temperature < 0)
				return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
						   "--temperature %s: not a number >= 0", v);
			break;
		}
		}
		if (!ok)
			return DG__CLI_USAGE;
	}
	if (!a->path)
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "sample: name a checkpoint or a run's folder; see `dragon sample --help`");
	if (a->prompt_ids && a->prompt[0])
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "--prompt and --prompt-ids: give the prompt one way, as text or as token ids");
	return 0;
}

/* The checkpoint a path names: itself, or a folder's newest. Returns the
 * exit code (reported). */
static int resolve(const char *path, char *out, size_t size)
{
	struct stat sb;
	char msg[1024];
	if (stat(path, &sb) != 0)
		return dg__cli_err(DG__CLI_FAIL, errno == ENOENT ? DG_ERR_NOT_FOUND : DG_ERR_IO,
				   "%s: %s (a checkpoint, or the folder of a `dragon train` run)", path,
				   strerror(errno));
	if (!S_ISDIR(sb.st_mode)) {
		snprintf(out, size, "%s", path);
		return DG__CLI_OK;
	}
	int64_t latest = -1;
	dg_status st = dg_checkpoint_prune(path, 0, &latest, msg, sizeof(msg)); /* keeps all */
	if (st)
		return dg__cli_err(DG__CLI_FAIL, st, "%s", msg);
	if (latest < 0)
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOT_FOUND,
				   "%s: no checkpoint (ckpt-*.safetensors) in it; `dragon train --out %s` writes them",
				   path, path);
	dg_checkpoint_path(path, latest, out, size);
	return DG__CLI_OK;
}

/* c with the f32 recipe (the same shapes, dropout and thresholds). */
static dg_model_config as_f32(const dg_model_config *c)
{
	dg_model_config f, r = *c;
	char msg[256];
	if (dg_model_preset("f32", &f, msg, sizeof(msg)) == DG_OK) {
		r.encoder = f.encoder, r.encoder_v = f.encoder_v, r.decoder = f.decoder;
		r.precision = f.precision;
		snprintf(r.preset, sizeof(r.preset), "%s", f.preset);
	}
	return r;
}

/* What generates: a decoder of one row, on the GPU or the CPU. */
typedef struct gen {
	dg_model_state *state;
} gen;

/* The logits after the prompt's n tokens (prefill), or after one more
 * token (n 1), from the state, into z. */
static int state_logits(gen *g, const int32_t *tok, int n, bool prefill, float *z)
{
	char msg[1024];
	dg_status st = dg_model_decode(g->state, -1, tok, n, prefill, z, msg, sizeof(msg));
	return st ? dg__cli_err(DG__CLI_FAIL, st, "%s", msg) : DG__CLI_OK;
}

/* The prompt's token ids (--prompt-ids "1,2,3") into *out (malloc'd),
 * each below v; *n how many. Returns the exit code (reported). */
static int parse_ids(const char *s, int v, int32_t **out, int *n)
{
	size_t cap = 1;
	for (const char *p = s; *p; p++)
		cap += *p == ',';
	int32_t *ids = malloc(cap * sizeof(*ids));
	if (!ids)
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "out of memory");
	int k = 0;
	for (const char *p = s;; k++) {
		char *end;
		errno = 0;
		long long x = strtoll(p, &end, 10);
		if (errno || end == p || (*end && *end != ',') || x < 0 || x >= v) {
			free(ids);
			return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
					   "--prompt-ids %s: id %d (from '%.20s') is not a token id of the vocabulary 0..%d "
					   "(comma-separated ids)",
					   s, k + 1, p, v - 1);
		}
		ids[k] = (int32_t)x;
		if (!*end)
			break;
		p = end + 1;
	}
	*out = ids;
	*n = k + 1;
	return DG__CLI_OK;
}

/* Prints token t: a byte raw, or an id (a space before all but the first). */
static void put_token(int32_t t, bool ids, bool *first)
{
	if (ids)
		printf(*first ? "%d" : " %d", (int)t);
	else
		fputc(t, stdout);
	*first = false;
}

/* The prompt's tokens for a model of vocabulary V into *out (malloc'd,
 * *n of them): --prompt-ids, else --prompt's bytes (a byte model only).
 * Returns the exit code (reported). */
static int prompt_of(const sample_args *a, int V, int32_t **out, int *n)
{
	if (a->prompt_ids)
		return parse_ids(a->prompt_ids, V, out, n);
	if (V != 256)
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "%s a vocabulary of %d, token ids, not bytes: give the prompt as ids with "
				   "--prompt-ids ID,... (llm.c's GPT-2 shards: 50256, end of text, starts a document)",
				   a->prompt[0] ? "--prompt TEXT: the model reads" : "the model reads", V);
	int plen = (int)strlen(a->prompt);
	int32_t *p = malloc(((size_t)plen + 1) * sizeof(*p));
	if (!p)
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "out of memory");
	for (int i = 0; i < plen; i++)
		p[i] = (unsigned char)a->prompt[i];
	*out = p;
	*n = plen;
	return DG__CLI_OK;
}

/* Prints the prompt (plen tokens), then a.length tokens as they are
 * drawn: bytes raw for a vocabulary of 256, else ids. */
static int generate(gen *g, const sample_args *a, int V, const int32_t *prompt, int plen)
{
	const bool ids = V != 256;
	int code = DG__CLI_OK;
	/* the context: the prompt (a newline without one), consumed once */
	int32_t *ctx = malloc(((size_t)plen + 1) * sizeof(int32_t));
	float *z = malloc((size_t)V * sizeof(float));
	if (!ctx || !z) {
		free(ctx);
		free(z);
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "out of memory");
	}
	int n = 0;
	if (plen == 0)
		ctx[n++] = '\n';
	for (int i = 0; i < plen; i++)
		ctx[n++] = prompt[i];
	bool first = true;
	for (int i = 0; i < plen; i++)
		put_token(prompt[i], ids, &first);
	fflush(stdout);
	dg_rng r;
	dg_rng_seed(&r, a->seed);
	char msg[1024];
	for (uint64_t i = 0; i < a->length && !code && !ferror(stdout); i++) {
		code = i == 0 ? state_logits(g, ctx, n, true, z) : state_logits(g, &ctx[n - 1], 1, false, z);
		if (code)
			break;
		for (int v = 0; v < V && !code; v++)
			if (!isfinite(z[v]))
				code = dg__cli_err(DG__CLI_FAIL, DG_ERR_NUMERIC,
						   "the logits after %d %s are not finite (logit %d is %g): the weights have diverged",
						   (int)(plen + i), ids ? "tokens" : "bytes", v, (double)z[v]);
		if (code)
			break;
		int32_t next;
		dg_status st = dg_sample_draw(z, V, a->temperature, (int)a->top_k, &r, &next, msg, sizeof(msg));
		if (st) {
			code = dg__cli_err(DG__CLI_FAIL, st, "%s", msg);
			break;
		}
		put_token(next, ids, &first);
		fflush(stdout);
		ctx[0] = next; /* the state holds the context: the last token alone */
		n = 1;
	}
	if (ids && !first)
		putchar('\n');
	else if (isatty(1))
		fputc('\n', stderr); /* the shell's prompt on a line of its own */
	free(ctx);
	free(z);
	return code;
}

int dg__cli_cmd_sample(int argc, char **argv)
{
	sample_args a;
	int code = parse(argc, argv, &a);
	if (code)
		return code < 0 ? DG__CLI_OK : code;
	char path[4200], msg[1024], dev_name[256];
	if ((code = resolve(a.path, path, sizeof(path))))
		return code;
	dg_train_state *s = NULL;
	dg_status st = dg_checkpoint_load(path, &s, msg, sizeof(msg));
	if (st)
		return dg__cli_err(DG__CLI_FAIL, st, "%s", msg);
	dg_model_weights *w = s->weights;
	const int V = w->config.vocab;
	int32_t *prompt = NULL;
	int plen = 0;
	if ((code = prompt_of(&a, V, &prompt, &plen))) {
		dg_train_state_destroy(s);
		return code;
	}
	/* the device: a recipe the CPU model does not run is not a reason to
	 * refuse it (the CPU then runs it as f32) */
	bool cpu_runs = dg_model_cpu_runs(&w->config);
	dg_model_config probe = cpu_runs ? w->config : as_f32(&w->config);
	dg_device *dev = NULL;
	if ((code = dg__cli_device_of(a.cpu, &probe, 0, &dev, dev_name, sizeof(dev_name), NULL))) {
		free(prompt);
		dg_train_state_destroy(s);
		return code;
	}
	if (!dev && !cpu_runs) {
		fprintf(stderr,
			"dragon: note: the CPU model does not run the %s recipe; sampling with f32 arithmetic on the same weights (a GPU runs %s)\n",
			w->config.preset, w->config.preset);
		w->config = probe;
	}
	gen g = { 0 };
	dg_status made = dg_model_state_create(dev, w, 1, &g.state, msg, sizeof(msg));
	if (made)
		code = dg__cli_err(DG__CLI_FAIL, made, "%s", msg);
	if (!code && isatty(2))
		fprintf(stderr, "dragon: sampling %s (step %lld, %s) on %s, the whole text as context\n", path,
			(long long)s->step, w->config.preset, dev ? dev_name : "the CPU");
	if (!code)
		code = generate(&g, &a, V, prompt, plen);
	dg_model_state_destroy(g.state);
	free(prompt);
	dg_device_close(dev);
	dg_train_state_destroy(s);
	return code;
}
