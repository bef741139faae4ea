/*
 * launch — the host time of one op launch, on a GPU.
 *
 *   eager:    the op's one call (dg_lowrank_fwd): every check, the spec's
 *             text and hash, the kernel's lookup, the geometry, the launch;
 *   prepared: dg_prepared_launch of the op prepared once (dg_prepare): the
 *             tensors compared with the prepared ones, the parameters put
 *             in place, the launch;
 *   kernel:   dg_kernel_launch of the kernel fetched once, its parameters
 *             made by hand: the driver's launch and the geometry's checks,
 *             the floor of the two above;
 *   ffi:      the foreign callers' one call through dragon/ffi.h: the
 *             descriptors prepared (dg_ffi_op_prepare), launched, destroyed;
 *   ffi_prepared: dg_ffi_prepared_run of the op prepared once through the
 *             door (dg_ffi_op_prepare): what the PyTorch ops launch.
 *
 * Each way launches --batch calls back to back (fewer than the driver's
 * queue holds, so the host never waits for the GPU), timed on the host,
 * then waits for them; the figure is the median over --reps batches of the
 * batch's time / --batch, in µs. The op: lowrank_fwd at one token
 * (B = T = 1, bf16, the BDH encoder's H 4, E 256, L 8192), a kernel of a
 * few µs. JSON to --out (and stdout).
 *
 * Usage: launch [--batch N] [--reps N] [--out FILE]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "dragon/dragon.h"
#include "runtime/gpu/gpu_int.h" /* dg_kernel_launch: the floor */

#define SPEC_TEXT                                                             \
	"op=lowrank_fwd;weight=bf16;act=bf16;out=bf16;relu=1;heads=4;"       \
	"in_heads=1;embd=256;latent=8192"

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

enum way { EAGER, PREPARED, KERNEL, FFI, FFI_PREPARED, N_WAYS };
static const char *const way_name[N_WAYS] = { "eager", "prepared", "kernel", "ffi", "ffi_prepared" };

typedef struct setup {
	dg_device *dev;
	dg_spec spec;
	dg_tensor x, w, out;
	dg_lowrank_fwd_args args;
	dg_prepared *prep, *ffi_prep;
	dg_ffi_tensor ft[3];
	dg_kernel *k;
	dg_launch l;
	dg_dptr xp, wp, op, zero;
	int B, T;
} setup;

/* One call through the door: prepare, launch, destroy. */
static dg_status ffi_once(setup *s)
{
	dg_prepared *p = NULL;
	dg_status st = dg_ffi_op_prepare(s->dev, &s->spec, s->ft, 3, NULL, &p, NULL, 0);
	if (!st)
		st = dg_ffi_prepared_run(p, s->ft, 3, NULL, NULL, 0);
	dg_prepared_destroy(p);
	return st;
}

static dg_status launch_once(setup *s, enum way way)
{
	switch (way) {
	case EAGER:
		return dg_lowrank_fwd(s->dev, &s->spec, &s->args);
	case PREPARED:
		return dg_prepared_launch(s->prep, &s->args);
	case FFI:
		return ffi_once(s);
	case FFI_PREPARED:
		return dg_ffi_prepared_run(s->ffi_prep, s->ft, 3, NULL, NULL, 0);
	default: {
		void *a[] = { &s->xp, &s->wp, &s->zero, &s->zero, &s->op, &s->zero, &s->zero,
			      &s->B, &s->T };
		return dg_kernel_launch(s->dev, s->k, &s->l, a);
	}
	}
}

int main(int argc, char **argv)
{
	int batch = 200, reps = 50;
	const char *out_path = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--batch") && i + 1 < argc)
			batch = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			reps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--out") && i + 1 < argc)
			out_path = argv[++i];
		else {
			fprintf(stderr, "usage: launch [--batch N] [--reps N] [--out FILE]\n");
			return 2;
		}
	}
	if (batch < 1 || batch > 1000 || reps < 1) {
		fprintf(stderr, "launch: --batch 1..1000, --reps at least 1\n");
		return 2;
	}

	setup s;
	memset(&s, 0, sizeof(s));
	dg_status st = dg_device_open(&s.dev, NULL);
	if (st) {
		printf("skipped: no CUDA device (%s)\n", s.dev ? dg_device_errmsg(s.dev) : dg_status_str(st));
		dg_device_close(s.dev);
		return 0;
	}
	char msg[512];
	if ((st = dg_spec_parse(SPEC_TEXT, &s.spec, msg, sizeof(msg)))) {
		fprintf(stderr, "launch: %s\n", msg);
		return 1;
	}
	s.B = s.T = 1;
	const int H = 4, E = 256, L = 8192;
	size_t xb = (size_t)E * 2, wb = (size_t)H * L * E * 2, ob = (size_t)H * L * 2;
	if ((st = dg_malloc(s.dev, xb, &s.xp)) || (st = dg_malloc(s.dev, wb, &s.wp)) ||
	    (st = dg_malloc(s.dev, ob, &s.op)) || (st = dg_memset8(s.dev, s.xp, 0, xb)) ||
	    (st = dg_memset8(s.dev, s.wp, 0, wb))) {
		fprintf(stderr, "launch: %s\n", dg_device_errmsg(s.dev));
		return 1;
	}
	s.x = dg_tensor_4d("x", DG_FMT_BF16, s.xp, 1, 1, 1, E);
	s.w = dg_tensor_3d("w", DG_FMT_BF16, s.wp, H, L, E);
	s.out = dg_tensor_4d("out", DG_FMT_BF16, s.op, 1, H, 1, L);
	s.args = (dg_lowrank_fwd_args){ .x = &s.x, .w = &s.w, .out = &s.out };
	s.ft[0] = (dg_ffi_tensor){ .name = "x", .fmt = DG_FMT_BF16, .ndim = 4, .shape = { 1, 1, 1, E },
				   .data = s.xp };
	s.ft[1] = (dg_ffi_tensor){ .name = "w", .fmt = DG_FMT_BF16, .ndim = 3, .shape = { H, L, E },
				   .data = s.wp };
	s.ft[2] = (dg_ffi_tensor){ .name = "out", .fmt = DG_FMT_BF16, .ndim = 4, .shape = { 1, H, 1, L },
				   .data = s.op };
	if ((st = dg_prepare(s.dev, &s.spec, &s.args, &s.prep)) ||
	    (st = dg_ffi_op_prepare(s.dev, &s.spec, s.ft, 3, NULL, &s.ffi_prep, NULL, 0)) ||
	    (st = dg_kernel_get(s.dev, &s.spec, "dg_lowrank_fwd", &s.k))) {
		fprintf(stderr, "launch: %s\n", dg_device_errmsg(s.dev));
		return 1;
	}
	/* the kernel's own geometry, as the op would launch it: the grid of
	 * the prepared op's one launch is not public, so a small grid stride */
	s.l = (dg_launch){ { 132, 1, 1 }, { 0, 0, 0 }, 0 };

	double per[N_WAYS];
	double *t = malloc(sizeof(double) * (size_t)reps);
	if (!t)
		return 1;
	for (int w = 0; w < N_WAYS; w++) {
		for (int r = -2; r < reps; r++) { /* two batches of warm-up */
			double t0 = now_us();
			for (int i = 0; i < batch && !st; i++)
				st = launch_once(&s, (enum way)w);
			double t1 = now_us();
			if (!st)
				st = dg_device_sync(s.dev);
			if (st) {
				fprintf(stderr, "launch: %s: %s\n", way_name[w], dg_device_errmsg(s.dev));
				return 1;
			}
			if (r >= 0)
				t[r] = (t1 - t0) / batch;
		}
		per[w] = median(t, reps);
	}
	free(t);

	dg_device_info info;
	(void)dg_device_info_get(s.dev, &info);
	cJSON *doc = cJSON_CreateObject();
	cJSON_AddStringToObject(doc, "device", info.name);
	cJSON_AddStringToObject(doc, "spec", SPEC_TEXT);
	cJSON_AddNumberToObject(doc, "batch", batch);
	cJSON_AddNumberToObject(doc, "reps", reps);
	cJSON *rows = cJSON_AddObjectToObject(doc, "host_us_per_launch");
	for (int w = 0; w < N_WAYS; w++)
		cJSON_AddNumberToObject(rows, way_name[w], per[w]);
	cJSON_AddNumberToObject(doc, "eager_over_prepared", per[EAGER] / per[PREPARED]);
	cJSON_AddNumberToObject(doc, "ffi_over_ffi_prepared", per[FFI] / per[FFI_PREPARED]);
	char *text = cJSON_Print(doc);
	printf("launch: host µs a launch: eager %.2f, prepared %.2f, kernel %.2f, ffi %.2f, ffi_prepared %.2f\n%s\n",
	       per[EAGER], per[PREPARED], per[KERNEL], per[FFI], per[FFI_PREPARED], text ? text : "");
	if (out_path && text) {
		FILE *f = fopen(out_path, "w");
		if (!f || fputs(text, f) == EOF || fclose(f)) {
			fprintf(stderr, "launch: cannot write %s\n", out_path);
			return 1;
		}
	}
	free(text);
	cJSON_Delete(doc);
	dg_prepared_destroy(s.prep);
	dg_prepared_destroy(s.ffi_prep);
	dg_free(s.dev, s.op);
	dg_free(s.dev, s.wp);
	dg_free(s.dev, s.xp);
	dg_device_close(s.dev);
	return 0;
}
