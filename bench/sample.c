/*
 * sample — the time of a token decoded from a state on the GPU
 * (runtime/train/gpu_decode.c), by context and batch.
 *
 * The 25M model of --preset (bf16 by default: D 256, H 4, N 8192, 6
 * layers; weights from seed 1, scaled as a trained model's so a ReLU keeps
 * about a quarter of its inputs) as a decoder of B rows; each row placed
 * at position `context` (its state holds what a prefill of that many
 * tokens would leave: a state's content does not change a token's work,
 * which is the same at every position), then --warmup tokens, then
 * --tokens tokens timed on the host, each dg__model_decode of one token a
 * row (its logits read back: what `dragon sample` waits for). A row:
 * {context, batch, ms_per_token (a step: one token for every row),
 * tokens_per_s (batch / a step's time)}. Contexts 512, 4096, 16384, 65536;
 * batches 1 and 64 (--batches). JSON to --out (and stdout).
 *
 * Usage: sample [--preset P] [--tokens N] [--warmup N] [--batches 1,64] [--out FILE]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "dragon/dragon.h"
#include "runtime/train/gpu_model_int.h"
#include "runtime/train/model_int.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const int contexts[] = { 512, 4096, 16384, 65536 };

int main(int argc, char **argv)
{
	const char *preset = "bf16", *out_path = NULL, *batches = "1,64";
	int tokens = 100, warmup = 10;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--preset") && i + 1 < argc)
			preset = argv[++i];
		else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
			tokens = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
			warmup = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--batches") && i + 1 < argc)
			batches = argv[++i];
		else if (!strcmp(argv[i], "--out") && i + 1 < argc)
			out_path = argv[++i];
		else {
			fprintf(stderr,
				"usage: sample [--preset P] [--tokens N] [--warmup N] [--batches 1,64] [--out FILE]\n");
			return 2;
		}
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
	cJSON *doc = cJSON_CreateObject(), *rows = cJSON_CreateArray();
	cJSON_AddStringToObject(doc, "device", info.name);
	cJSON_AddStringToObject(doc, "preset", preset);
	cJSON_AddNumberToObject(doc, "layers", c.layers);
	cJSON_AddNumberToObject(doc, "embd", c.embd);
	cJSON_AddNumberToObject(doc, "heads", c.heads);
	cJSON_AddNumberToObject(doc, "neurons", c.neurons);
	cJSON_AddNumberToObject(doc, "tokens", tokens);
	cJSON_AddItemToObject(doc, "rows", rows);
	int code = 0;
	for (const char *b = batches; *b && !code;) {
		int B = atoi(b);
		const char *comma = strchr(b, ',');
		b = comma ? comma + 1 : b + strlen(b);
		if (B < 1)
			continue;
		dg_model *m = NULL;
		if ((st = dg__model_decoder_create(dev, w, B, &m))) {
			fprintf(stderr, "sample: a decoder of %d rows: %s\n", B, dg_device_errmsg(dev));
			code = 1;
			break;
		}
		int32_t *tok = calloc((size_t)B, sizeof(int32_t));
		float *z = malloc((size_t)B * c.vocab * sizeof(float));
		for (size_t ci = 0; ci < sizeof(contexts) / sizeof(contexts[0]) && !code; ci++) {
			for (int r = 0; r < B; r++) {
				m->pos[r] = contexts[ci];
				tok[r] = (int32_t)('a' + r % 26);
			}
			double t0 = 0;
			for (int k = 0; k < warmup + tokens && !st; k++) {
				if (k == warmup)
					t0 = now_s();
				st = dg__model_decode(m, tok, 1, false, z);
				for (int r = 0; r < B && !st; r++) { /* greedy: the next token */
					int best = 0;
					for (int v = 1; v < c.vocab; v++)
						if (z[(size_t)r * c.vocab + v] > z[(size_t)r * c.vocab + best])
							best = v;
					tok[r] = best;
				}
			}
			if (st) {
				fprintf(stderr, "sample: batch %d context %d: %s\n", B, contexts[ci], dg_device_errmsg(dev));
				code = 1;
				break;
			}
			double ms = (now_s() - t0) / tokens * 1e3;
			cJSON *row = cJSON_CreateObject();
			cJSON_AddNumberToObject(row, "context", contexts[ci]);
			cJSON_AddNumberToObject(row, "batch", B);
			cJSON_AddNumberToObject(row, "ms_per_token", ms);
			cJSON_AddNumberToObject(row, "tokens_per_s", B / (ms * 1e-3));
			cJSON_AddItemToArray(rows, row);
			fprintf(stderr, "sample %s: batch %d context %d: %.3f ms a step, %.0f tokens/s\n", preset, B,
				contexts[ci], ms, B / (ms * 1e-3));
		}
		free(tok);
		free(z);
		dg_model_destroy(m);
	}
	char *text = cJSON_Print(doc);
	if (text) {
		printf("%s\n", text);
		if (out_path) {
			FILE *f = fopen(out_path, "w");
			if (!f || fprintf(f, "%s\n", text) < 0) {
				fprintf(stderr, "sample: cannot write %s\n", out_path);
				code = 1;
			}
			if (f)
				fclose(f);
		}
	}
	free(text);
	cJSON_Delete(doc);
	dg_model_weights_destroy(w);
	dg_device_close(dev);
	return code;
}
