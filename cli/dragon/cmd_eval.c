/*
 * dragon eval — the mean loss of a weights file over K batches of held-out
 * bytes, on the GPU model when there is a device (else, or with --cpu,
 * the CPU model), and optionally every weight's gradient of the first
 * batch as a safetensors file named as the weights.
 *
 * The config comes from the file's metadata (dg_model_config_read: what
 * dg_model_weights_save writes); a file without it (PyTorch's, say) needs
 * --layers --embd --heads --neurons, which also override the metadata.
 * --preset swaps the recipe, never the shapes. Eval runs without dropout.
 * The file is checked as every reader of weights checks it
 * (dg_model_file_check: its seal, its kind, finite values); --grads
 * never names --model or --data.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/common/cli.h"
#include "cli/common/files.h"
#include "cli/common/progress.h"
#include "cli/common/scan.h"
#include "cli/dragon/cmd.h"
#include "cli/dragon/device.h"
#include "cli/dragon/eval_data.h"
#include "dragon/model.h"
#include "dragon/runtime.h"

static const char help_text[] =
	"usage: dragon eval --model M.safetensors [--data D] [--preset P] [--batch B]\n"
	"                   [--time T] [--seed S] [--batches K] [--grads OUT.safetensors]\n"
	"                   [--cpu] [--json] [--layers L --embd D --heads H --neurons N]\n\n"
	"The mean cross-entropy loss (and perplexity) of the model's weights over K\n"
	"batches of B rows of T tokens, the targets the next tokens.\n\n"
	"  --model M       weights as dg_model_weights_save writes them (the reference's\n"
	"                  names, F32), or a checkpoint; the config is read from the\n"
	"                  file's metadata. A damaged file (its seal, file_sha256, not\n"
	"                  its SHA-256) or weights that are not finite are refused\n"
	"  --layers L, --embd D, --heads H, --neurons N\n"
	"                  the config's shapes, for a file without dragon's metadata\n"
	"                  (all four then), or overriding it\n"
	"  --preset P      the recipe: f32, bf16, w8a8, bitnet (default: the file's, else\n"
	"                  f32); the shapes stay the file's\n"
	"  --data D        a corpus as `dragon train --data` reads it: a file of bytes\n"
	"                  (its last 10% the validation split), llm.c's token shards\n"
	"                  (their *_val_* shards), a folder of train.bin and val.bin;\n"
	"                  a plain file is uint16 tokens for a model whose vocabulary\n"
	"                  is not 256, and every token must be below it. Rows start at\n"
	"                  offsets of the validation split drawn from --seed. Without\n"
	"                  it: a built-in deterministic batch of random bytes\n"
	"  --batch B       rows a batch (default 8)\n"
	"  --time T        tokens a row (default 512, capped to the split of --data)\n"
	"  --batches K     batches (default 8)\n"
	"  --seed S        the data's offsets or bytes (default 0)\n"
	"  --grads OUT     write every weight's gradient of the first batch to OUT\n"
	"                  (safetensors, the weights' names, written atomically, of\n"
	"                  kind gradients: no reader of weights takes it); OUT is\n"
	"                  never --model or --data\n"
	"  --cpu           the CPU model even with a GPU (f32, w8a8, bitnet)\n"
	"  --json          one JSON object on stdout instead of the text\n\n"
	"Runs on GPU 0 when there is one, else on the CPU model, which runs f32, w8a8\n"
	"and bitnet (fake-quantized: the GPU's quantizers, dequantized); bf16 needs an\n"
	"NVIDIA GPU.\n"
	"Output: model, preset, device, data, batches and tokens, loss and perplexity,\n"
	"time (seconds of the evaluation: model set-up and batches, not file reading).\n"
	"JSON keys: model, config{layers,embd,heads,neurons,vocab}, preset, device\n"
	"(\"gpu\"|\"cpu\"), device_name, data (path or \"builtin\"), data_bytes, split_bytes,\n"
	"split_tokens, "
	"seed, batch, time, batches, tokens, loss, perplexity, losses[], wall_s, grads.\n"
	"Exit status: 0 ok, 1 failure (a file, a tensor, the data, the device), 2 usage.\n";

enum {
	O_MODEL = 1, O_DATA, O_PRESET, O_BATCH, O_TIME, O_SEED, O_BATCHES, O_GRADS, O_CPU,
	O_JSON, O_LAYERS, O_EMBD, O_HEADS, O_NEURONS, O_HELP,
};

static const dg__cli_opt opts[] = {
	{ "model", 'm', true, O_MODEL },     { "data", 'd', true, O_DATA },
	{ "preset", 'p', true, O_PRESET },   { "batch", 'b', true, O_BATCH },
	{ "time", 't', true, O_TIME },       { "seed", 's', true, O_SEED },
	{ "batches", 'k', true, O_BATCHES }, { "grads", 0, true, O_GRADS },
	{ "cpu", 0, false, O_CPU },          { "json", 0, false, O_JSON },
	{ "layers", 0, true, O_LAYERS },     { "embd", 0, true, O_EMBD },
	{ "heads", 0, true, O_HEADS },       { "neurons", 0, true, O_NEURONS },
	{ "help", 'h', false, O_HELP },      { NULL, 0, false, 0 },
};

typedef struct eval_args {
	const char *model, *data, *preset, *grads;
	uint64_t batch, time, seed, batches;
	uint64_t shape[4]; /* layers, embd, heads, neurons; 0 not given */
	bool cpu, json, time_given;
} eval_args;

static const char *const shape_flags[4] = { "--layers", "--embd", "--heads", "--neurons" };

/* 0 parsed, -1 --help printed, else the exit code (reported). */
static int parse(int argc, char **argv, eval_args *a)
{
	dg__cli_scan_state s;
	const char *v;
	int id;

	memset(a, 0, sizeof(*a));
	a->batch = 8;
	a->batches = 8;
	dg__cli_scan_init(&s, argc, argv, "eval");
	while ((id = dg__cli_scan(&s, opts, &v)) != DG__CLI_SCAN_END) {
		bool ok = true;
		switch (id) {
		case DG__CLI_SCAN_ERROR:
			return DG__CLI_USAGE;
		case DG__CLI_SCAN_ARG:
			return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
					   "eval takes no argument '%s' (the model is --model M); see `dragon eval --help`",
					   v);
		case O_HELP:
			fputs(help_text, stdout);
			return -1;
		case O_MODEL: a->model = v; break;
		case O_DATA: a->data = v; break;
		case O_PRESET: a->preset = v; break;
		case O_GRADS: a->grads = v; break;
		case O_CPU: a->cpu = true; break;
		case O_JSON: a->json = true; break;
		case O_BATCH: ok = dg__cli_parse_u64("--batch", v, 1, 1 << 16, &a->batch); break;
		case O_TIME:
			ok = dg__cli_parse_u64("--time", v, 1, 1 << 20, &a->time);
			a->time_given = true;
			break;
		case O_SEED: ok = dg__cli_parse_u64("--seed", v, 0, UINT64_MAX, &a->seed); break;
		case O_BATCHES: ok = dg__cli_parse_u64("--batches", v, 1, 1 << 20, &a->batches); break;
		case O_LAYERS: case O_EMBD: case O_HEADS: case O_NEURONS:
			ok = dg__cli_parse_u64(shape_flags[id - O_LAYERS], v, 1, 1 << 20,
					       &a->shape[id - O_LAYERS]);
			break;
		}
		if (!ok)
			return DG__CLI_USAGE;
	}
	if (!a->model)
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "eval: --model is required (a weights .safetensors file); see `dragon eval --help`");
	/* an output never overwrites an input: gradients over the model would
	 * replace it (its AdamW state too) with what loads as no weights */
	const char *in[2] = { a->model, a->data }, *in_flag[2] = { "--model", "--data" };
	for (int i = 0; a->grads && i < 2; i++)
		if (in[i] && dg__cli_same_file(a->grads, in[i]))
			return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
					   "--grads %s: the same file as %s %s; the gradients go to a file of their own",
					   a->grads, in_flag[i], in[i]);
	if (a->batch * (a->time ? a->time : 512) > (1u << 26))
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "--batch %llu --time %llu: at most 2^26 tokens a batch",
				   (unsigned long long)a->batch, (unsigned long long)a->time);
	return 0;
}


/* The config: the file's metadata, the shape flags over it, the preset's
 * recipe. Returns the exit code (reported). */
static int config_of(const eval_args *a, dg_model_config *c)
{
	char msg[1024];
	struct stat sb;
	if (stat(a->model, &sb) != 0)
		return dg__cli_err(DG__CLI_FAIL, errno == ENOENT ? DG_ERR_NOT_FOUND : DG_ERR_IO,
				   "--model %s: %s", a->model, strerror(errno));
	bool all_shapes = a->shape[0] && a->shape[1] && a->shape[2] && a->shape[3];
	dg_status st = dg_model_config_read(a->model, c, msg, sizeof(msg));
	if (st == DG_ERR_NOT_FOUND && all_shapes)
		st = dg_model_preset("f32", c, msg, sizeof(msg));
	if (st == DG_ERR_NOT_FOUND)
		return dg__cli_err(DG__CLI_FAIL, st,
				   "%s; give its shapes with --layers, --embd, --heads and --neurons",
				   msg);
	if (st)
		return dg__cli_err(DG__CLI_FAIL, st, "%s", msg);
	int *dst[4] = { &c->layers, &c->embd, &c->heads, &c->neurons };
	for (int i = 0; i < 4; i++)
		if (a->shape[i])
			*dst[i] = (int)a->shape[i];
	if (a->preset) {
		dg_model_config p;
		if ((st = dg_model_preset(a->preset, &p, msg, sizeof(msg))))
			return dg__cli_err(DG__CLI_USAGE, st, "--preset %s", msg);
		p.layers = c->layers, p.embd = c->embd, p.heads = c->heads;
		p.neurons = c->neurons, p.vocab = c->vocab;
		*c = p;
	}
	if ((st = dg_model_config_check(c, msg, sizeof(msg))))
		return dg__cli_err(DG__CLI_USAGE, st, "config: %s", msg);
	return DG__CLI_OK;
}

static void report_text(const eval_args *a, const dg_model_config *c, const char *dev_name,
			bool gpu, const dg__eval_data *d, int b, int t, double loss, double secs)
{
	int k = (int)a->batches;
	printf("model:   %s (layers %d, embd %d, heads %d, neurons %d, vocab %d)\n", a->model,
	       c->layers, c->embd, c->heads, c->neurons, c->vocab);
	printf("preset:  %s\n", c->preset);
	printf("device:  %s%s\n", gpu ? "gpu 0: " : "", dev_name);
	if (d->builtin)
		printf("data:    built-in deterministic batch (random bytes of seed %llu; no corpus yet)\n",
		       (unsigned long long)a->seed);
	else if (d->corpus->kind == DG_CORPUS_KIND_BYTES)
		printf("data:    %s (%llu bytes; validation split: the last %zu, offsets of seed %llu)\n",
		       a->data, (unsigned long long)d->file_size, d->len, (unsigned long long)a->seed);
	else
		printf("data:    %s (%zu tokens in %d file%s; validation split: %s, %zu tokens, offsets of seed %llu)\n",
		       a->data, d->corpus->len, d->corpus->n_files, d->corpus->n_files == 1 ? "" : "s",
		       d->corpus->split, d->len, (unsigned long long)a->seed);
	printf("batches: %d of %dx%d (%lld tokens)\n", k, b, t, (long long)k * b * t);
	printf("loss:    %.6f (perplexity %.3f)\n", loss, exp(loss));
	printf("time:    %.3f s\n", secs);
	if (a->grads)
		printf("grads:   %s (first batch)\n", a->grads);
}

static int report_json(const eval_args *a, const dg_model_config *c, const char *dev_name,
		       bool gpu, const dg__eval_data *d, int b, int t, double loss,
		       const double *losses, double secs)
{
	cJSON *j = cJSON_CreateObject(), *cfg = cJSON_CreateObject(), *ls = cJSON_CreateArray();
	if (!j || !cfg || !ls) {
		cJSON_Delete(j), cJSON_Delete(cfg), cJSON_Delete(ls);
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "out of memory");
	}
	cJSON_AddStringToObject(j, "model", a->model);
	cJSON_AddNumberToObject(cfg, "layers", c->layers);
	cJSON_AddNumberToObject(cfg, "embd", c->embd);
	cJSON_AddNumberToObject(cfg, "heads", c->heads);
	cJSON_AddNumberToObject(cfg, "neurons", c->neurons);
	cJSON_AddNumberToObject(cfg, "vocab", c->vocab);
	cJSON_AddItemToObject(j, "config", cfg);
	cJSON_AddStringToObject(j, "preset", c->preset);
	cJSON_AddStringToObject(j, "device", gpu ? "gpu" : "cpu");
	cJSON_AddStringToObject(j, "device_name", dev_name);
	cJSON_AddStringToObject(j, "data", d->builtin ? "builtin" : a->data);
	if (d->builtin)
		cJSON_AddNullToObject(j, "data_bytes");
	else
		cJSON_AddNumberToObject(j, "data_bytes", (double)d->file_size);
	cJSON_AddNumberToObject(j, "split_bytes",
				(double)d->len * (d->corpus && d->corpus->kind != DG_CORPUS_KIND_BYTES ? 2 : 1));
	cJSON_AddNumberToObject(j, "split_tokens", (double)d->len);
	cJSON_AddNumberToObject(j, "seed", (double)a->seed);
	cJSON_AddNumberToObject(j, "batch", b);
	cJSON_AddNumberToObject(j, "time", t);
	cJSON_AddNumberToObject(j, "batches", (double)a->batches);
	cJSON_AddNumberToObject(j, "tokens", (double)a->batches * b * t);
	cJSON_AddNumberToObject(j, "loss", loss);
	cJSON_AddNumberToObject(j, "perplexity", exp(loss));
	for (uint64_t k = 0; k < a->batches; k++)
		cJSON_AddItemToArray(ls, cJSON_CreateNumber(losses[k]));
	cJSON_AddItemToObject(j, "losses", ls);
	cJSON_AddNumberToObject(j, "wall_s", secs);
	if (a->grads)
		cJSON_AddStringToObject(j, "grads", a->grads);
	else
		cJSON_AddNullToObject(j, "grads");
	return dg__cli_json_print(j);
}

int dg__cli_cmd_eval(int argc, char **argv)
{
	eval_args a;
	dg_model_config c;
	dg_device *dev = NULL;
	dg_model *m = NULL;
	dg_model_weights *w = NULL, *g = NULL;
	dg__eval_data d = { 0 };
	int32_t *idx = NULL, *tgt = NULL;
	double *losses = NULL;
	char msg[1024], dev_name[200];
	dg_status st;

	int code = parse(argc, argv, &a);
	if (code)
		return code < 0 ? DG__CLI_OK : code;
	if ((code = config_of(&a, &c)))
		return code;
	if ((st = dg_model_weights_load(&c, a.model, &w, msg, sizeof(msg))))
		return dg__cli_err(DG__CLI_FAIL, st, "%s", msg);
	int b = (int)a.batch, t = (int)a.time, k_all = (int)a.batches;
	if (a.data) {
		st = dg__eval_data_open(&d, a.data, c.vocab, &t, a.seed, msg, sizeof(msg)); /* t 0: capped */
	} else {
		t = t ? t : 512;
		st = dg__eval_data_builtin(&d, k_all, b, t, a.seed, msg, sizeof(msg));
	}
	if (st) {
		code = dg__cli_err(DG__CLI_FAIL, st, "%s", msg);
		goto out;
	}
	if ((code = dg__cli_device_of(a.cpu, &c, 0, &dev, dev_name, sizeof(dev_name), NULL)))
		goto out;
	idx = malloc((size_t)b * (size_t)t * sizeof(*idx));
	tgt = malloc((size_t)b * (size_t)t * sizeof(*tgt));
	losses = calloc((size_t)k_all, sizeof(*losses));
	if (!idx || !tgt || !losses) {
		code = dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "out of memory (batch %dx%d)", b, t);
		goto out;
	}
	if (a.grads && (st = dg_model_weights_create(&c, 0, &g, msg, sizeof(msg)))) {
		code = dg__cli_err(DG__CLI_FAIL, st, "--grads: %s", msg);
		goto out;
	}
	double t0 = dg__cli_now_s(), sum = 0;
	if (dev && (st = dg_model_create(dev, w, b, t, &m))) {
		code = dg__cli_err(DG__CLI_FAIL, st, "GPU model: %s", dg_device_errmsg(dev));
		goto out;
	}
	bool tty = isatty(STDERR_FILENO) == 1, shown = false;
	for (int k = 0; k < k_all; k++) {
		dg__eval_data_batch(&d, k, b, t, idx, tgt);
		dg_model_batch batch = { .idx = idx, .targets = tgt, .b = b, .t = t,
					 .seed = a.seed, .step = 0, .train = false };
		dg_model_weights *gk = k == 0 ? g : NULL;
		st = m ? dg_model_step(m, &batch, &losses[k], gk)
		       : dg_model_cpu_step(w, &batch, &losses[k], gk, msg, sizeof(msg));
		if (st) {
			if (shown)
				fputs("\r\033[K", stderr);
			code = dg__cli_err(DG__CLI_FAIL, st, "batch %d: %s", k,
					   m ? dg_device_errmsg(dev) : msg);
			goto out;
		}
		sum += losses[k];
		if (tty && dg__cli_now_s() - t0 > 1.0) {
			fprintf(stderr, "\r\033[Kdragon eval: batch %d/%d", k + 1, k_all);
			shown = true;
		}
	}
	if (shown)
		fputs("\r\033[K", stderr);
	double secs = dg__cli_now_s() - t0, loss = sum / k_all;
	if (g && (st = dg_model_grads_save(g, a.grads, msg, sizeof(msg)))) {
		code = dg__cli_err(DG__CLI_FAIL, st, "--grads %s", msg);
		goto out;
	}
	if (a.json)
		code = report_json(&a, &c, dev_name, dev != NULL, &d, b, t, loss, losses, secs);
	else
		report_text(&a, &c, dev_name, dev != NULL, &d, b, t, loss, secs);
out:
	dg_model_destroy(m);
	dg_device_close(dev);
	dg_model_weights_destroy(w);
	dg_model_weights_destroy(g);
	dg__eval_data_close(&d);
	free(idx);
	free(tgt);
	free(losses);
	return code;
}
