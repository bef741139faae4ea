/*
 * step — forward + backward (no optimizer) of the BDH model on the GPU, for
 * each preset, beside PyTorch eager bf16 and torch.compile bf16 of the
 * project's PyTorch version (tools/bdh_torch.py bench) in the same run, each
 * node kind of the step against its floor, and the PyTorch anchor's whole
 * training step.
 *
 *   step [--presets f32,bf16,w8a8,bitnet] [--batch 8] [--time 512]
 *        [--warmup 2] [--reps 10] [--torch CMD | --no-torch]
 *        [--floor CMD | --no-floor] [--anchor CMD | --no-anchor]
 *        [--train] [--out FILE]
 *        [--layers N] [--embd D] [--heads H] [--neurons N] [--vocab V]
 *
 * The shape flags replace the 25M preset's fields in every preset (and in
 * the floor's and the anchor's shape), so the breakdown can be had at any
 * shape the model takes (bench/shapes.sh's, say).
 *
 * --train adds, a preset, the whole training step (forward, backward, the
 * gradients' norm, AdamW and the execution copies: dg_model_train_step)
 * replaying its captured graph and run eagerly: {impl, preset, mode
 * train_graph | train_eager, step_ms (the mean of --reps steps queued back
 * to back), graph_live, peak_bytes (the most device memory the model, its
 * moments and its steps held at once: dragon train's, PyTorch's
 * max_memory_allocated), plan (the memory-for-time choices, as dragon
 * train --json's, and DRAGON_MEMORY's budget when set: memory); the graph
 * row's update_ms: the step's tail alone — the norm, AdamW on every
 * master, the copies — dg_model_optim_time}. The forward + backward rows
 * carry plan too.
 *
 * dragon's rows: the median of --reps steps (dg_model_run, timed by
 * events), the peak device memory measured as the drop in free memory from
 * before dg_model_create to the lowest point during the steps (dragon
 * allocates everything at create), and the plan's estimate of it
 * (dg_model_plan), and where the time goes (dg_model_profile: each node
 * alone, summed by kind: "breakdown"). JSON: {"device": ..., "rows":
 * [{impl, preset, B, T, fwd_bwd_ms, peak_bytes, plan_bytes?, breakdown?},
 * ...]} to --out (and stdout).
 *
 * The floor (--floor, default bench/step_floor.py, run once with the
 * model's shape and B, T before the presets): each breakdown entry gains
 * floor_ms (the fastest cuBLAS bf16/fp8/int8 call of its GEMMs, or the HBM
 * time of its bytes at the measured copy bandwidth, whichever is larger,
 * summed over its nodes), floor_how (which) and ratio (ms / floor_ms); the
 * preset's row floor_ms, the sum (or floor_error, saying why not); the
 * floor's whole output is the document's "floor" ({"error": why} when it
 * did not run).
 *
 * The anchor (--anchor, default bench/torch_bdh_step.py: BDH as PyTorch
 * users write it, bf16 autocast, torch.compile, fused AdamW, clip), at the
 * same shape after dragon's rows: {impl torch.compile, preset bf16, mode
 * train, B, T, step_ms (the mean of --reps steps queued back to back),
 * peak_bytes, torch}. The --torch rows (forward + backward alone, the
 * measure of dragon's fwd_bwd_ms rows) stay beside it. A command that
 * cannot run (no python3, no torch, no GPU for it) gives a row with
 * "error": the reason, and the bench goes on.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "bench/bench_common.h"
#include "bench/step_rows.h"
#include "dragon/dragon.h"
#include "dragon/model.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/train/model_int.h"

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static cJSON *row(const char *impl, const char *preset, int B, int T, double ms, double peak)
{
	cJSON *r = cJSON_CreateObject();
	cJSON_AddStringToObject(r, "impl", impl);
	cJSON_AddStringToObject(r, "preset", preset);
	cJSON_AddNumberToObject(r, "B", B);
	cJSON_AddNumberToObject(r, "T", T);
	cJSON_AddNumberToObject(r, "fwd_bwd_ms", ms);
	cJSON_AddNumberToObject(r, "peak_bytes", peak);
	return r;
}

/* The benches' batch: B·T fixed tokens and targets (any vocab), dropout's
 * seed 1, training on; the same for the forward + backward rows and the
 * training-step rows, so they time the same work. */
static dg_model_batch bench_batch(int32_t *idx, int32_t *tgt, int B, int T, int vocab)
{
	for (int i = 0; i < B * T; i++) {
		idx[i] = (i * 131 + 7) % vocab;
		tgt[i] = (i * 71 + 3) % vocab;
	}
	dg_model_batch bt = { .idx = idx, .targets = tgt, .b = B, .t = T, .seed = 1, .train = true };
	return bt;
}

/* The shape flags: 0 keeps the preset's field. */
static struct {
	int layers, embd, heads, neurons, vocab;
} g_shape;

/* Preset `name` with the shape flags applied, checked. */
static dg_status bench_config(const char *name, dg_model_config *c, char *msg, size_t msg_size)
{
	dg_status st = dg_model_preset(name, c, msg, msg_size);
	if (st)
		return st;
	if (g_shape.layers)
		c->layers = g_shape.layers;
	if (g_shape.embd)
		c->embd = g_shape.embd;
	if (g_shape.heads)
		c->heads = g_shape.heads;
	if (g_shape.neurons)
		c->neurons = g_shape.neurons;
	if (g_shape.vocab)
		c->vocab = g_shape.vocab;
	return dg_model_config_check(c, msg, msg_size);
}

/* One preset: a row, or an error row naming why it did not run. */
/* The model's memory-for-time choices (as dragon train --json's plan),
 * and DRAGON_MEMORY's budget when one is set. */
static cJSON *plan_json(const dg_model *m)
{
	bool kq = false, spg = false, rec = false, rys = false;
	int chunk = 0;
	dg__gm_plan_modes(m, &kq, &spg, &rec, &rys, &chunk);
	cJSON *p = cJSON_CreateObject();
	cJSON_AddBoolToObject(p, "keep_qr", kq);
	cJSON_AddBoolToObject(p, "stack_pgrads", spg);
	cJSON_AddBoolToObject(p, "recompute", rec);
	cJSON_AddBoolToObject(p, "recompute_ys", rys);
	cJSON_AddNumberToObject(p, "attn_chunk", chunk);
	const char *budget = getenv("DRAGON_MEMORY");
	if (budget && *budget)
		cJSON_AddStringToObject(p, "memory", budget);
	return p;
}

static cJSON *run_preset(dg_device *dev, const char *preset, int B, int T, int warmup, int reps)
{
	char msg[512];
	dg_model_config c;
	dg_model_weights *w = NULL;
	dg_model *m = NULL;
	dg_model_memory plan;
	cJSON *r = NULL;
	size_t free0 = 0, total = 0, lowest;

	if (bench_config(preset, &c, msg, sizeof(msg)) ||
	    dg_model_weights_create(&c, 1, &w, msg, sizeof(msg)))
		goto fail_msg;
	if (dg_model_plan(dev, &c, B, T, &plan))
		goto fail_dev;
	if (dg_device_mem_info(dev, &free0, &total) || dg_model_create(dev, w, B, T, &m))
		goto fail_dev;
	lowest = free0;
	int32_t *idx = malloc((size_t)B * T * 4), *tgt = malloc((size_t)B * T * 4);
	double *ms = malloc(sizeof(double) * (size_t)(reps > 0 ? reps : 1));
	dg_event *e0 = NULL, *e1 = NULL;
	if (!idx || !tgt || !ms || dg_event_create(dev, &e0) || dg_event_create(dev, &e1)) {
		free(idx), free(tgt), free(ms);
		dg_event_destroy(e0);
		goto fail_dev;
	}
	dg_model_batch bt = bench_batch(idx, tgt, B, T, c.vocab);
	dg_status st = DG_OK;
	for (int i = 0; i < warmup && !st; i++)
		st = dg_model_run(m, &bt, true);
	if (!st)
		st = dg_device_sync(dev);
	for (int i = 0; i < reps && !st; i++) {
		bt.step = (uint32_t)i;
		st = dg_event_record(e0);
		if (!st)
			st = dg_model_run(m, &bt, true);
		if (!st)
			st = dg_event_record(e1);
		if (!st)
			st = dg_event_synchronize(e1);
		float t = 0;
		if (!st)
			st = dg_event_elapsed_ms(e0, e1, &t);
		ms[i] = t;
		size_t f = 0, tt = 0;
		if (!st && !dg_device_mem_info(dev, &f, &tt) && f < lowest)
			lowest = f;
	}
	if (!st) {
		qsort(ms, (size_t)reps, sizeof(double), cmp_double);
		r = row("dragon", preset, B, T, ms[reps / 2], (double)(free0 - lowest));
		cJSON_AddNumberToObject(r, "plan_bytes", (double)plan.total);
		cJSON_AddItemToObject(r, "plan", plan_json(m));
		cJSON_AddNumberToObject(r, "min_ms", ms[0]);
		/* where the time goes: each node alone, summed by kind */
		dg_model_time tm[32];
		int nt = 0;
		if (!dg_model_profile(m, &bt, tm, 32, &nt))
			cJSON_AddItemToObject(r, "breakdown", bc_breakdown(tm, nt));
	}
	free(idx), free(tgt), free(ms);
	dg_event_destroy(e0);
	dg_event_destroy(e1);
	if (st)
		goto fail_dev;
	dg_model_destroy(m);
	dg_model_weights_destroy(w);
	return r;
fail_dev:
	snprintf(msg, sizeof(msg), "%s", dg_device_errmsg(dev));
fail_msg:
	dg_model_destroy(m);
	dg_model_weights_destroy(w);
	r = cJSON_CreateObject();
	cJSON_AddStringToObject(r, "impl", "dragon");
	cJSON_AddStringToObject(r, "preset", preset);
	cJSON_AddStringToObject(r, "error", msg);
	fprintf(stderr, "step: %s: %s\n", preset, msg);
	return r;
}

/* A whole training step (forward, backward, the norm, AdamW, the copies)
 * of preset, queued reps times back to back after warm-up steps, graph
 * replayed or eager: the mean ms a step between events around the reps. */
static cJSON *run_train(dg_device *dev, const char *preset, int B, int T, int warmup, int reps,
			bool graph)
{
	char msg[512];
	dg_model_config c;
	dg_model_weights *w = NULL;
	dg_model *m = NULL;
	cJSON *r = NULL;
	dg_adamw_config opt;
	dg_adamw_defaults(&opt, warmup + reps);
	if (bench_config(preset, &c, msg, sizeof(msg)) ||
	    dg_model_weights_create(&c, 1, &w, msg, sizeof(msg)))
		goto fail_msg;
	/* the run's memory from here: the model, AdamW's moments, the step
	 * (as dragon train's peak_bytes, PyTorch's max_memory_allocated) */
	const size_t mem0 = dg__dev_mem_mark(dev);
	if (dg_model_create(dev, w, B, T, &m) || dg_model_optim_init(m, &opt, NULL, NULL, graph, NULL))
		goto fail_dev;
	int32_t *idx = malloc((size_t)B * T * 4), *tgt = malloc((size_t)B * T * 4);
	dg_event *e0 = NULL, *e1 = NULL;
	if (!idx || !tgt || dg_event_create(dev, &e0) || dg_event_create(dev, &e1)) {
		free(idx), free(tgt);
		dg_event_destroy(e0);
		goto fail_dev;
	}
	dg_model_batch bt = bench_batch(idx, tgt, B, T, c.vocab);
	dg_status st = DG_OK;
	int64_t t = 0;
	double loss = 0, norm = 0;
	for (; t < warmup && !st; t++)
		st = dg_model_train_step(m, &bt, t, dg_adamw_lr(&opt, t));
	if (!st)
		st = dg_device_sync(dev);
	if (!st)
		st = dg_event_record(e0);
	for (int i = 0; i < reps && !st; i++, t++)
		st = dg_model_train_step(m, &bt, t, dg_adamw_lr(&opt, t));
	if (!st)
		st = dg_event_record(e1);
	if (!st)
		st = dg_event_synchronize(e1);
	float ms = 0;
	if (!st)
		st = dg_event_elapsed_ms(e0, e1, &ms);
	if (!st)
		st = dg_model_train_result(m, t - 1, &loss, &norm, NULL, NULL);
	double tail_ms = 0;
	if (!st && graph)
		st = dg_model_optim_time(m, reps, &tail_ms);
	free(idx), free(tgt);
	dg_event_destroy(e0);
	dg_event_destroy(e1);
	if (st)
		goto fail_dev;
	r = cJSON_CreateObject();
	cJSON_AddStringToObject(r, "impl", "dragon");
	cJSON_AddStringToObject(r, "preset", preset);
	cJSON_AddStringToObject(r, "mode", graph ? "train_graph" : "train_eager");
	cJSON_AddBoolToObject(r, "graph_live", dg_model_graph_live(m));
	cJSON_AddNumberToObject(r, "B", B);
	cJSON_AddNumberToObject(r, "T", T);
	cJSON_AddNumberToObject(r, "step_ms", ms / reps);
	cJSON_AddNumberToObject(r, "last_loss", loss);
	const size_t high = dg__dev_mem_high(dev);
	cJSON_AddNumberToObject(r, "peak_bytes", (double)(high > mem0 ? high - mem0 : 0));
	cJSON_AddItemToObject(r, "plan", plan_json(m));
	if (graph) /* the norm, AdamW on every master, the execution copies: alone */
		cJSON_AddNumberToObject(r, "update_ms", tail_ms);
	fprintf(stderr, "step: %s training step (%s): %.3f ms\n", preset, graph ? "graph" : "eager", ms / reps);
	dg_model_destroy(m);
	dg_model_weights_destroy(w);
	return r;
fail_dev:
	snprintf(msg, sizeof(msg), "%s", dg_device_errmsg(dev));
fail_msg:
	dg_model_destroy(m);
	dg_model_weights_destroy(w);
	r = cJSON_CreateObject();
	cJSON_AddStringToObject(r, "impl", "dragon");
	cJSON_AddStringToObject(r, "preset", preset);
	cJSON_AddStringToObject(r, "mode", graph ? "train_graph" : "train_eager");
	cJSON_AddStringToObject(r, "error", msg);
	fprintf(stderr, "step: %s training: %s\n", preset, msg);
	return r;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: step [--presets LIST] [--batch B] [--time T] [--warmup N] [--reps N]\n"
		   "            [--torch CMD | --no-torch] [--floor CMD | --no-floor]\n"
		   "            [--anchor CMD | --no-anchor] [--train] [--out FILE]\n"
		   "            [--layers N] [--embd D] [--heads H] [--neurons N] [--vocab V]\n");
}

int main(int argc, char **argv)
{
	const char *presets = "f32,bf16,w8a8,bitnet", *out = NULL;
	const char *torch = "python3 '" DG_SOURCE_DIR "/tools/bdh_torch.py'";
	const char *floor_cmd = "python3 '" DG_SOURCE_DIR "/bench/step_floor.py'";
	const char *anchor_cmd = "python3 '" DG_SOURCE_DIR "/bench/torch_bdh_step.py'";
	int B = 8, T = 512, warmup = 2, reps = 10, use_torch = 1, train = 0, use_floor = 1, use_anchor = 1;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--presets") && v)
			presets = argv[++i];
		else if (!strcmp(a, "--batch") && v)
			B = atoi(argv[++i]);
		else if (!strcmp(a, "--time") && v)
			T = atoi(argv[++i]);
		else if (!strcmp(a, "--warmup") && v)
			warmup = atoi(argv[++i]);
		else if (!strcmp(a, "--reps") && v)
			reps = atoi(argv[++i]);
		else if (!strcmp(a, "--torch") && v)
			torch = argv[++i];
		else if (!strcmp(a, "--no-torch"))
			use_torch = 0;
		else if (!strcmp(a, "--floor") && v)
			floor_cmd = argv[++i];
		else if (!strcmp(a, "--no-floor"))
			use_floor = 0;
		else if (!strcmp(a, "--anchor") && v)
			anchor_cmd = argv[++i];
		else if (!strcmp(a, "--no-anchor"))
			use_anchor = 0;
		else if (!strcmp(a, "--layers") && v)
			g_shape.layers = atoi(argv[++i]);
		else if (!strcmp(a, "--embd") && v)
			g_shape.embd = atoi(argv[++i]);
		else if (!strcmp(a, "--heads") && v)
			g_shape.heads = atoi(argv[++i]);
		else if (!strcmp(a, "--neurons") && v)
			g_shape.neurons = atoi(argv[++i]);
		else if (!strcmp(a, "--vocab") && v)
			g_shape.vocab = atoi(argv[++i]);
		else if (!strcmp(a, "--train"))
			train = 1;
		else if (!strcmp(a, "--out") && v)
			out = argv[++i];
		else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}
	if (B < 1 || T < 1 || reps < 1 || warmup < 0) {
		fprintf(stderr, "step: --batch, --time, --reps must be at least 1\n");
		return 2;
	}
	/* the model's shape, for the floor and the anchor: the first preset's */
	char list[256], msg[256];
	snprintf(list, sizeof(list), "%s", presets);
	dg_model_config shape;
	const char *first = strtok(list, ",");
	if (bench_config(first ? first : "f32", &shape, msg, sizeof(msg)) &&
	    bench_config("f32", &shape, msg, sizeof(msg))) {
		fprintf(stderr, "step: %s\n", msg);
		return 1;
	}
	dg_device *dev = NULL;
	if (dg_device_open(&dev, NULL)) {
		fprintf(stderr, "step: no GPU: %s\n", dev ? dg_device_errmsg(dev) : "no device");
		dg_device_close(dev);
		return 1;
	}
	dg_device_info info;
	dg_device_info_get(dev, &info);
	cJSON *doc = cJSON_CreateObject(), *rows = cJSON_CreateArray(), *floor_doc = NULL;
	cJSON_AddStringToObject(doc, "device", info.name);
	cJSON_AddItemToObject(doc, "rows", rows);
	char floor_why[512] = "";
	if (use_floor) {
		floor_doc = bs_run_floor(floor_cmd, &shape, B, T, floor_why, sizeof(floor_why));
		if (floor_doc)
			cJSON_AddItemToObject(doc, "floor", floor_doc);
		else {
			cJSON *e = cJSON_AddObjectToObject(doc, "floor");
			cJSON_AddStringToObject(e, "error", floor_why);
			fprintf(stderr, "step: the floor: %s\n", floor_why);
		}
	}
	snprintf(list, sizeof(list), "%s", presets);
	for (char *p = strtok(list, ","); p; p = strtok(NULL, ",")) {
		cJSON *r = run_preset(dev, p, B, T, warmup, reps);
		bs_attach_floor(r, floor_doc, use_floor ? floor_why : NULL);
		bs_print_breakdown(r);
		cJSON_AddItemToArray(rows, r);
		if (train) {
			cJSON_AddItemToArray(rows, run_train(dev, p, B, T, warmup, reps, true));
			cJSON_AddItemToArray(rows, run_train(dev, p, B, T, warmup, reps, false));
		}
	}
	dg_device_close(dev);
	if (use_torch) {
		char cmd[1024], why[512];
		snprintf(cmd, sizeof(cmd), "%s bench --batch %d --time %d --reps %d", torch, B, T, reps);
		cJSON *lines = cJSON_CreateArray(), *r;
		bool ok = bs_run_json(cmd, lines, why, sizeof(why));
		while ((r = cJSON_DetachItemFromArray(lines, 0)))
			if (!cJSON_GetObjectItemCaseSensitive(r, "error"))
				cJSON_AddItemToArray(rows, r);
			else
				cJSON_Delete(r);
		cJSON_Delete(lines);
		if (!ok) {
			r = cJSON_CreateObject();
			cJSON_AddStringToObject(r, "impl", "torch.compile");
			cJSON_AddStringToObject(r, "preset", "bf16");
			cJSON_AddNumberToObject(r, "B", B);
			cJSON_AddNumberToObject(r, "T", T);
			cJSON_AddStringToObject(r, "error", why);
			cJSON_AddItemToArray(rows, r);
			fprintf(stderr, "step: %s: %s\n", cmd, why);
		}
	}
	if (use_anchor) {
		cJSON *a = bs_run_anchor(anchor_cmd, &shape, B, T, reps);
		bs_print_anchor(rows, a);
		cJSON_AddItemToArray(rows, a);
	}
	char *text = cJSON_Print(doc);
	printf("%s\n", text);
	if (out) {
		FILE *o = fopen(out, "w");
		if (!o || fputs(text, o) < 0 || fclose(o)) {
			fprintf(stderr, "step: cannot write %s\n", out);
			free(text);
			cJSON_Delete(doc);
			return 1;
		}
	}
	free(text);
	cJSON_Delete(doc);
	return 0;
}
