/*
 * sample — the time of a token decoded from a state on the GPU
 * (runtime/train/gpu_decode.c, what dg_model_state_create and
 * dg_model_decode run on a device), by context and batch.
 *
 * The 25M model of --preset (bf16 by default: D 256, H 4, N 8192, 6
 * layers; weights from seed 1, scaled as a trained model's so a ReLU keeps
 * about a quarter of its inputs) as a decoder of B rows
 * (dg__model_decoder_create: the decoder behind dg_model_state_create,
 * whose rows' positions the bench can set). Each row is placed at position
 * `context` without a prefill: a token's work does not depend on the
 * state's content (the state stays as created, zeros) nor on its position
 * (RoPE's phase is computed, not looked up), so a token at position
 * 65536 costs what it costs after a prefill of 65536 tokens. Then
 * --warmup tokens, then --tokens tokens timed on the host, each
 * dg__model_decode of one token a row (what dg_model_decode runs: one
 * upload, the token's work replayed as one CUDA graph — --graph off runs
 * it op by op instead — the logits computed on the device and read
 * back) and the next token picked greedily on the host (what `dragon
 * sample` waits for). A row: {context, batch, ms_per_token (a step: one
 * token for every row), tokens_per_s (batch / a step's time), forward_ms
 * (the same forward alone, --tokens of them queued back to back then one
 * sync: no read-back, no logits on the host; ms_per_token − forward_ms is
 * the host's share), breakdown (the forward's nodes one at a time,
 * dg_model_profile: [{what, count, ms}] by kind)}. Contexts 512, 4096, 16384, 65536 (--contexts);
 * batches 1 and 64 (--batches). One JSON document to --out (and stdout).
 *
 * Usage: sample [--preset P] [--tokens N] [--warmup N] [--batches 1,64]
 *               [--contexts 512,4096,16384,65536] [--graph on|off] [--out FILE]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "bench/bench_common.h"
#include "dragon/dragon.h"
#include "runtime/train/gpu_model_int.h"
#include "runtime/train/model_int.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define MAX_LIST 16

typedef struct sample_run {
	dg_device *dev;
	const dg_model_config *c;
	const char *preset;
	int tokens, warmup;
	bool graph;
} sample_run;

/* The rows of decoder m (B rows) at each context into rows; false (the
 * device's message on stderr) at the first failure. */
static bool run_contexts(const sample_run *r, dg_model *m, int B, const int *contexts, int n, cJSON *rows)
{
	const int V = r->c->vocab;
	int32_t *tok = calloc((size_t)B, sizeof(int32_t)), *tgt = calloc((size_t)B, sizeof(int32_t));
	float *z = malloc((size_t)B * V * sizeof(float));
	dg_status st = tok && tgt && z ? DG_OK : DG_ERR_NOMEM;
	st = dg__model_decode_graph(m, r->graph);
	for (int ci = 0; ci < n && !st; ci++) {
		for (int i = 0; i < B; i++) {
			m->pos[i] = contexts[ci];
			tok[i] = (int32_t)('a' + i % 26);
		}
		double t0 = 0;
		for (int k = 0; k < r->warmup + r->tokens && !st; k++) {
			if (k == r->warmup)
				t0 = now_s();
			st = dg__model_decode(m, tok, 1, false, z);
			for (int i = 0; i < B && !st; i++) { /* greedy: the next token */
				int best = 0;
				for (int v = 1; v < V; v++)
					if (z[(size_t)i * V + v] > z[(size_t)i * V + best])
						best = v;
				tok[i] = best;
			}
		}
		double ms = (now_s() - t0) / r->tokens * 1e3;
		/* the forward alone, at the positions the tokens reached */
		dg_model_batch bt = { .idx = tok, .targets = tgt, .b = B, .t = 1 };
		double t1 = now_s();
		for (int k = 0; k < r->tokens && !st; k++)
			st = dg_model_run(m, &bt, false);
		if (!st)
			st = dg_device_sync(r->dev);
		double fwd = (now_s() - t1) / r->tokens * 1e3;
		/* where a token's time goes: each node alone (dg_model_profile,
		 * an event pair a node), summed by kind */
		dg_model_time nt[48];
		int nn = 0;
		if (st)
			break;
		if (dg_model_profile(m, &bt, nt, (int)(sizeof(nt) / sizeof(nt[0])), &nn)) {
			fprintf(stderr, "sample: batch %d context %d: no breakdown: %s\n", B, contexts[ci],
				dg_device_errmsg(r->dev));
			nn = -1;
		}
		cJSON *row = cJSON_CreateObject();
		cJSON_AddNumberToObject(row, "context", contexts[ci]);
		cJSON_AddNumberToObject(row, "batch", B);
		cJSON_AddNumberToObject(row, "ms_per_token", ms);
		cJSON_AddNumberToObject(row, "tokens_per_s", B / (ms * 1e-3));
		cJSON_AddNumberToObject(row, "forward_ms", fwd);
		if (nn >= 0)
			cJSON_AddItemToObject(row, "breakdown", bc_breakdown(nt, nn));
		for (int i = 0; i < nn; i++)
			fprintf(stderr, "sample %s: batch %d context %d: %-32s %3d %8.4f ms\n", r->preset, B, contexts[ci],
				nt[i].what, nt[i].count, nt[i].ms);
		cJSON_AddItemToArray(rows, row);
		fprintf(stderr, "sample %s: batch %d context %d: %.3f ms a step (the forward alone %.3f), %.0f tokens/s\n",
			r->preset, B, contexts[ci], ms, fwd, B / (ms * 1e-3));
	}
	if (st)
		fprintf(stderr, "sample: batch %d: %s\n", B,
			st == DG_ERR_NOMEM && !(tok && tgt && z) ? "out of host memory" : dg_device_errmsg(r->dev));
	free(tok);
	free(tgt);
	free(z);
	return !st;
}

/* A prompt of each length in prompts through decoder m (B rows, restarted),
 * timed on the host to the logits after it: rows {batch, prompt, window,
 * prefill_ms, tokens_per_s} into out; false at the first failure. A first
 * call of a window and two tokens makes the window model (its kernels
 * loaded) outside the time. */
static bool run_prefill(const sample_run *r, dg_model *m, int B, const int *prompts, int n, cJSON *out)
{
	const int V = r->c->vocab, P = dg__model_decode_window(m);
	int most = 0;
	for (int i = 0; i < n; i++)
		most = prompts[i] > most ? prompts[i] : most;
	most = most > P + 2 ? most : P + 2;
	int32_t *tok = malloc((size_t)B * most * sizeof(int32_t));
	float *z = malloc((size_t)B * V * sizeof(float));
	dg_status st = tok && z ? DG_OK : DG_ERR_NOMEM;
	for (int64_t i = 0; !st && i < (int64_t)B * most; i++)
		tok[i] = (int32_t)('a' + (i * 7) % 26);
	if (!st)
		st = dg__model_decode(m, tok, P + 2, true, z);
	for (int pi = 0; pi < n && !st; pi++) {
		const int L = prompts[pi];
		double t0 = now_s();
		st = dg__model_decode(m, tok, L, true, z);
		double ms = (now_s() - t0) * 1e3;
		if (st)
			break;
		cJSON *row = cJSON_CreateObject();
		cJSON_AddNumberToObject(row, "batch", B);
		cJSON_AddNumberToObject(row, "prompt", L);
		cJSON_AddNumberToObject(row, "window", P);
		cJSON_AddNumberToObject(row, "prefill_ms", ms);
		cJSON_AddNumberToObject(row, "tokens_per_s", (double)B * L / (ms * 1e-3));
		cJSON_AddItemToArray(out, row);
		fprintf(stderr, "sample %s: batch %d: a prompt of %d tokens a row in %.1f ms (windows of %d), %.0f tokens/s\n",
			r->preset, B, L, ms, P, (double)B * L / (ms * 1e-3));
	}
	if (st)
		fprintf(stderr, "sample: prefill, batch %d: %s\n", B,
			st == DG_ERR_NOMEM && !(tok && z) ? "out of host memory" : dg_device_errmsg(r->dev));
	free(tok);
	free(z);
	return !st;
}

static void add_notes(cJSON *doc)
{
	static const char *const notes[] = {
		"a token a row from the decoder's state (gpu_decode.c: what dg_model_state_create and "
		"dg_model_decode run on a device), one dg__model_decode call a token: positions and tokens "
		"uploaded in one copy, the token's work replayed as one CUDA graph (graph: false runs it op by "
		"op), the logits computed on the device and read back; the next token picked on the host",
		"contexts reached by setting each row's position, no prefill: the state stays as created (zeros); "
		"a token's work does not depend on the state's content or its position",
		"ms_per_token: host time of a step (one token for every row); tokens_per_s = batch / that",
		"forward_ms: the same forward op by op (dg_model_run, --tokens queued, one sync, its loss node "
		"too): no read-back, no logits; with the graph, ms_per_token may be below it",
		"breakdown: the forward's nodes one at a time between two events each (dg_model_profile), "
		"summed by kind: each includes its launch's latency, so they sum to more than forward_ms",
		"prefill: a prompt of `prompt` tokens a row (--prefill) from an empty state to the logits after "
		"it, one dg__model_decode call: windows of `window` tokens a row (DRAGON_PREFILL_WINDOW), the "
		"rest a token at a time; host time; tokens_per_s = batch * prompt / that",
	};
	cJSON *n = cJSON_AddArrayToObject(doc, "notes");
	for (size_t i = 0; i < sizeof(notes) / sizeof(notes[0]); i++)
		cJSON_AddItemToArray(n, cJSON_CreateString(notes[i]));
}

static int usage(void)
{
	fprintf(stderr, "usage: sample [--preset P] [--tokens N] [--warmup N] [--batches 1,64] "
			"[--contexts 512,4096,16384,65536] [--prefill 4096,65536] [--graph on|off] [--out FILE]\n");
	return 2;
}

int main(int argc, char **argv)
{
	const char *preset = "bf16", *out_path = NULL;
	int tokens = 100, warmup = 10, batches[MAX_LIST] = { 1, 64 }, nb = 2,
	    contexts[MAX_LIST] = { 512, 4096, 16384, 65536 }, nc = 4, prefill[MAX_LIST] = { 4096, 65536 }, np = 2;
	bool graph = true;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		bool ok = true;
		if (!v)
			return usage();
		if (!strcmp(a, "--preset"))
			preset = v;
		else if (!strcmp(a, "--tokens"))
			tokens = atoi(v);
		else if (!strcmp(a, "--warmup"))
			warmup = atoi(v);
		else if (!strcmp(a, "--batches"))
			ok = (nb = bc_parse_ints(v, batches, MAX_LIST, 1, 1 << 16)) > 0;
		else if (!strcmp(a, "--contexts"))
			ok = (nc = bc_parse_ints(v, contexts, MAX_LIST, 0, 1 << 24)) > 0;
		else if (!strcmp(a, "--prefill"))
			ok = (np = bc_parse_ints(v, prefill, MAX_LIST, 0, 1 << 20)) > 0;
		else if (!strcmp(a, "--graph"))
			ok = (graph = !strcmp(v, "on")) || !strcmp(v, "off");
		else if (!strcmp(a, "--out"))
			out_path = v;
		else
			ok = false;
		if (!ok)
			return usage();
		i++;
	}
	if (tokens < 1 || warmup < 0) {
		fprintf(stderr, "sample: --tokens at least 1, --warmup at least 0\n");
		return 2;
	}
	dg_device *dev = NULL;
	dg_status st = dg_device_open(&dev, NULL);
	if (st) {
		printf("skipped: no CUDA device (%s)\n", dev ? dg_device_errmsg(dev) : dg_status_str(st));
		dg_device_close(dev);
		return 0;
	}
	char msg[512];
	dg_model_config c;
	dg_model_weights *w = NULL;
	if ((st = dg_model_preset(preset, &c, msg, sizeof(msg))) ||
	    (st = dg_model_weights_create(&c, 1, &w, msg, sizeof(msg)))) {
		fprintf(stderr, "sample: %s\n", msg);
		dg_device_close(dev);
		return 1;
	}
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		int64_t n = dg_model_param_shape(&c, (dg_model_param)p, &nd, sh);
		for (int64_t i = 0; i < n; i++)
			w->params[p][i] *= 25.0f;
	}
	dg_device_info info;
	dg_device_info_get(dev, &info);
	cJSON *doc = bc_doc("sample", &info), *rows = cJSON_CreateArray();
	cJSON_AddStringToObject(doc, "preset", preset);
	cJSON_AddNumberToObject(doc, "layers", c.layers);
	cJSON_AddNumberToObject(doc, "embd", c.embd);
	cJSON_AddNumberToObject(doc, "heads", c.heads);
	cJSON_AddNumberToObject(doc, "neurons", c.neurons);
	cJSON_AddNumberToObject(doc, "tokens", tokens);
	cJSON_AddNumberToObject(doc, "warmup", warmup);
	cJSON_AddBoolToObject(doc, "graph", graph);
	add_notes(doc);
	cJSON_AddItemToObject(doc, "rows", rows);
	cJSON *pre = cJSON_AddArrayToObject(doc, "prefill");
	sample_run r = { .dev = dev, .c = &c, .preset = preset, .tokens = tokens, .warmup = warmup, .graph = graph };
	int code = 0;
	for (int bi = 0; bi < nb && !code; bi++) {
		dg_model *m = NULL;
		if (dg__model_decoder_create(dev, w, batches[bi], &m)) {
			fprintf(stderr, "sample: a decoder of %d rows: %s\n", batches[bi], dg_device_errmsg(dev));
			code = 1;
		} else if (!run_contexts(&r, m, batches[bi], contexts, nc, rows) ||
			   (prefill[0] > 0 && !run_prefill(&r, m, batches[bi], prefill, np, pre))) {
			code = 1;
		}
		dg_model_destroy(m);
	}
	if (bc_write("sample", doc, out_path, true))
		code = 1;
	cJSON_Delete(doc);
	dg_model_weights_destroy(w);
	dg_device_close(dev);
	return code;
}
