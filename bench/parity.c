/*
 * parity — the GPU model against the project's PyTorch version, preset by
 * preset: tools/bdh_torch.py dump writes weights, a batch, the loss and
 * every gradient (for a low-bit preset, fake-quantized with dragon's
 * quantizers and straight-through gradients: --quant); dragon's GPU step
 * on the same weights and batch is compared with it.
 *
 *   parity [--presets f32,bf16,w8a8,bitnet] [--size tiny|small|25m]
 *          [--batch B] [--time T] [--torch CMD] [--double] [--out FILE]
 *
 * --double: PyTorch's step in float64 (bdh_torch.py dump --double) on the
 * same f32 weights, so the numbers are dragon's distance from the exact
 * step rather than from another f32 summation order.
 *
 * JSON: {"device", "size", "B", "T", "<preset>": {"loss_rel": x,
 * "loss": dragon's, "loss_torch": PyTorch's, "grads": {"<param>": ‖dragon
 * − torch‖ / ‖torch‖, ...}}, ...}. The f32 and bf16 presets are held to
 * PyTorch's f32 math, the low-bit ones to its fake-quant mode of the same
 * recipe. Exit 0 when every preset ran (the numbers are the judgement:
 * tests/test_gpu_model.c holds the bounds).
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "dragon/dragon.h"
#include "dragon/model.h"
#include "runtime/store/safetensors.h"

static int meta_int(const dg_safetensors *f, const char *k)
{
	const char *v = dg_safetensors_meta(f, k);
	return v ? atoi(v) : 0;
}

static double rel_err(const float *a, const void *b_bytes, int64_t n)
{
	double num = 0, den = 0;
	for (int64_t i = 0; i < n; i++) {
		float b;
		memcpy(&b, (const char *)b_bytes + 4 * i, 4);
		num += ((double)a[i] - b) * ((double)a[i] - b);
		den += (double)b * b;
	}
	return sqrt(num / (den > 0 ? den : 1));
}

/* One preset against a fresh dump; NULL with a message on failure. */
static cJSON *one(dg_device *dev, const char *torch, const char *preset, const char *size, int B,
		  int T, bool dbl, char *err, size_t esz)
{
	char path[256], cmd[1024], msg[1024];
	snprintf(path, sizeof(path), "/tmp/dragon-parity-%d-%s.safetensors", (int)getpid(), preset);
	bool quant = strcmp(preset, "f32") != 0 && strcmp(preset, "bf16") != 0;
	snprintf(cmd, sizeof(cmd), "%s dump --out %s --size %s --batch %d --time %d --seed 3 --scale 20%s%s%s",
		 torch, path, size, B, T, quant ? " --quant " : "", quant ? preset : "", dbl ? " --double" : "");
	if (system(cmd) != 0) {
		snprintf(err, esz, "%s failed", cmd);
		return NULL;
	}
	dg_safetensors *f = NULL;
	dg_model_config c;
	dg_model_weights *w = NULL, *g = NULL;
	dg_model *m = NULL;
	cJSON *r = NULL;
	if (dg_safetensors_load(path, &f, msg, sizeof(msg)) || dg_model_preset(preset, &c, msg, sizeof(msg)))
		goto fail;
	c.layers = meta_int(f, "layers");
	c.embd = meta_int(f, "embd");
	c.heads = meta_int(f, "heads");
	c.neurons = meta_int(f, "neurons");
	c.vocab = meta_int(f, "vocab");
	if (dg_model_weights_load(&c, path, &w, msg, sizeof(msg)) ||
	    dg_model_weights_create(&c, 0, &g, msg, sizeof(msg)))
		goto fail;
	const dg_st_tensor *it = dg_safetensors_find(f, "idx"), *tt = dg_safetensors_find(f, "targets"),
			   *lt = dg_safetensors_find(f, "loss");
	if (!it || !tt || !lt) {
		snprintf(msg, sizeof(msg), "the dump lacks idx, targets or loss");
		goto fail;
	}
	int32_t *idx = malloc((size_t)B * T * 4), *tgt = malloc((size_t)B * T * 4);
	memcpy(idx, it->data, (size_t)B * T * 4);
	memcpy(tgt, tt->data, (size_t)B * T * 4);
	double want, loss = 0;
	memcpy(&want, lt->data, sizeof(want));
	dg_model_batch bt = { .idx = idx, .targets = tgt, .b = B, .t = T };
	dg_status st = dg_model_create(dev, w, B, T, &m);
	if (!st)
		st = dg_model_step(m, &bt, &loss, g);
	free(idx);
	free(tgt);
	if (st) {
		snprintf(msg, sizeof(msg), "%s", dg_device_errmsg(dev));
		goto fail;
	}
	r = cJSON_CreateObject();
	cJSON_AddNumberToObject(r, "loss_rel", fabs(loss - want) / fabs(want));
	cJSON_AddNumberToObject(r, "loss", loss);
	cJSON_AddNumberToObject(r, "loss_torch", want);
	cJSON *gr = cJSON_AddObjectToObject(r, "grads");
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		char name[64];
		int nd;
		int64_t sh[3];
		int64_t n = dg_model_param_shape(&c, (dg_model_param)p, &nd, sh);
		snprintf(name, sizeof(name), "grad.%s", dg_model_param_name((dg_model_param)p));
		const dg_st_tensor *gt = dg_safetensors_find(f, name);
		if (gt)
			cJSON_AddNumberToObject(gr, dg_model_param_name((dg_model_param)p),
						rel_err(g->params[p], gt->data, n));
	}
	goto done;
fail:
	snprintf(err, esz, "%s: %s", preset, msg);
done:
	dg_model_destroy(m);
	dg_model_weights_destroy(w);
	dg_model_weights_destroy(g);
	dg_safetensors_destroy(f);
	unlink(path);
	return r;
}

int main(int argc, char **argv)
{
	const char *presets = "f32,bf16,w8a8,bitnet", *size = "small", *out = NULL;
	const char *torch = "python3 " DG_SOURCE_DIR "/tools/bdh_torch.py";
	int B = 2, T = 64;
	bool dbl = false;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--presets") && v)
			presets = argv[++i];
		else if (!strcmp(a, "--size") && v)
			size = argv[++i];
		else if (!strcmp(a, "--batch") && v)
			B = atoi(argv[++i]);
		else if (!strcmp(a, "--time") && v)
			T = atoi(argv[++i]);
		else if (!strcmp(a, "--torch") && v)
			torch = argv[++i];
		else if (!strcmp(a, "--out") && v)
			out = argv[++i];
		else if (!strcmp(a, "--double"))
			dbl = true;
		else {
			fprintf(stderr, "usage: parity [--presets LIST] [--size tiny|small|25m] [--batch B] "
					"[--time T] [--torch CMD] [--double] [--out FILE]\n");
			return 2;
		}
	}
	dg_device *dev = NULL;
	if (dg_device_open(&dev, NULL)) {
		fprintf(stderr, "parity: no GPU: %s\n", dev ? dg_device_errmsg(dev) : "no device");
		return 1;
	}
	dg_device_info info;
	dg_device_info_get(dev, &info);
	cJSON *doc = cJSON_CreateObject();
	cJSON_AddStringToObject(doc, "device", info.name);
	cJSON_AddStringToObject(doc, "size", size);
	cJSON_AddNumberToObject(doc, "B", B);
	cJSON_AddStringToObject(doc, "torch_precision", dbl ? "f64" : "f32");
	cJSON_AddNumberToObject(doc, "T", T);
	int rc = 0;
	char list[256], err[2048];
	snprintf(list, sizeof(list), "%s", presets);
	for (char *p = strtok(list, ","); p; p = strtok(NULL, ",")) {
		cJSON *r = one(dev, torch, p, size, B, T, dbl, err, sizeof(err));
		if (!r) {
			fprintf(stderr, "parity: %s\n", err);
			r = cJSON_CreateObject();
			cJSON_AddStringToObject(r, "error", err);
			rc = 1;
		}
		cJSON_AddItemToObject(doc, p, r);
	}
	dg_device_close(dev);
	char *text = cJSON_Print(doc);
	printf("%s\n", text);
	if (out) {
		FILE *o = fopen(out, "w");
		if (!o || fputs(text, o) < 0 || fclose(o))
			rc = 1;
	}
	free(text);
	cJSON_Delete(doc);
	return rc;
}
