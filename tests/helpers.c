/* Test helpers: see helpers.h. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "helpers.h"

#include "dragon/fmt.h"

char *dg_test_tmpdir(void)
{
	const char *base = getenv("TMPDIR");
	char tmpl[512];
	snprintf(tmpl, sizeof(tmpl), "%s/dragon-test-XXXXXX",
		 base && *base ? base : "/tmp");
	char *dir = mkdtemp(tmpl);
	cr_assert_not_null(dir, "mkdtemp %s failed", tmpl);
	char *copy = strdup(dir);
	cr_assert_not_null(copy);
	return copy;
}

void dg_test_write_file(const char *dir, const char *name, const char *text)
{
	char path[1024];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "cannot write %s", path);
	size_t n = strlen(text);
	cr_assert_eq(fwrite(text, 1, n, f), n);
	cr_assert_eq(fclose(f), 0);
}

char *dg_test_template_dir(const char *dragon_lua, const char *helper_lua)
{
	char *dir = dg_test_tmpdir();
	for (int i = 0; i < DG_OP__COUNT; i++) {
		char name[64];
		snprintf(name, sizeof(name), "%s.lua", dg_op_info_of((dg_op)i)->module);
		dg_test_write_file(dir, name, "return {}\n");
	}
	dg_test_write_file(dir, "dragon.lua", dragon_lua);
	if (helper_lua)
		dg_test_write_file(dir, "helper.lua", helper_lua);
	return dir;
}

static int lua_file(const struct dirent *e)
{
	size_t n = strlen(e->d_name);
	return n > 4 && e->d_name[0] != '.' && strcmp(e->d_name + n - 4, ".lua") == 0;
}

char *dg_test_templates_copy(void)
{
	char *dir = dg_test_tmpdir();
	struct dirent **names;
	int n = scandir(DG_SOURCE_DIR "/templates", &names, lua_file, alphasort);
	cr_assert_gt(n, 1, "no templates in %s/templates", DG_SOURCE_DIR);
	for (int i = n - 1; i >= 0; i--) {
		char from[1024], to[1024], buf[65536];
		snprintf(from, sizeof(from), "%s/templates/%s", DG_SOURCE_DIR, names[i]->d_name);
		snprintf(to, sizeof(to), "%s/%s", dir, names[i]->d_name);
		FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
		cr_assert(in && out, "copying %s to %s", from, to);
		size_t got;
		while ((got = fread(buf, 1, sizeof(buf), in)) > 0)
			cr_assert_eq(fwrite(buf, 1, got, out), got);
		cr_assert_not(ferror(in));
		fclose(in);
		cr_assert_eq(fclose(out), 0);
		free(names[i]);
	}
	free(names);
	return dir;
}

static int rm_one(const char *path, const struct stat *sb, int flag,
		  struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

void dg_test_rmtree(char *path)
{
	if (!path)
		return;
	nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	free(path);
}

int dg_test_quick(void)
{
	const char *q = getenv("DRAGON_TEST_QUICK");
	return q && *q && strcmp(q, "0") != 0;
}

int dg_test_need(int here, const char *what, const char *fix)
{
	if (here)
		return 1;
	const char *req = getenv("DRAGON_REQUIRE_DEPS");
	cr_assert(!(req && *req && strcmp(req, "0") != 0),
		  "%s (DRAGON_REQUIRE_DEPS=1: not a skip): %s", what, fix);
	printf("skipped: %s\n", what);
	return 0;
}

static void push(dg_spec_list *l, size_t *cap, const dg_spec *s)
{
	if (l->n == *cap) {
		*cap = *cap ? *cap * 2 : 64;
		l->specs = realloc(l->specs, *cap * sizeof(*s));
		cr_assert_not_null(l->specs);
	}
	l->specs[l->n++] = *s;
}

void dg_test_all_specs(dg_spec_list *out)
{
	const dg_fmt w[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_TERNARY, DG_FMT_SIGN1 };
	const dg_fmt a[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_INT4, DG_FMT_UINT8POS };
	const dg_fmt o[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_UINT8POS };
	const dg_fmt q[] = { DG_FMT_INT8, DG_FMT_INT4, DG_FMT_UINT8POS };
	const int relu[] = { -1, 0, 1 }; /* none, 0, 0.25 */
	size_t cap = 0;
	dg_spec s;

	out->specs = NULL;
	out->n = 0;
	for (int i = 0; i < 5; i++)
		for (int j = 0; j < 5; j++)
			for (int r = 0; r < 3; r++)
				for (int k = 0; k < 4; k++)
					for (int h = 0; h < 2; h++) {
						dg_spec_init(&s, DG_OP_LOWRANK_FWD);
						s.weight = w[i];
						s.act = a[j];
						s.relu = relu[r] >= 0;
						s.relu_thr = relu[r] > 0 ? 0.25f : 0.0f;
						s.out = o[k];
						s.in_heads = h ? 4 : 1;
						if (dg_spec_validate(&s, NULL, 0) == DG_OK)
							push(out, &cap, &s);
					}
	for (int i = 0; i < 2; i++)
		for (int j = 0; j < 3; j++) {
			dg_spec_init(&s, DG_OP_QUANTIZE_ACT);
			s.src = i ? DG_FMT_BF16 : DG_FMT_F32;
			s.act = q[j];
			push(out, &cap, &s);
		}
	dg_spec_init(&s, DG_OP_PACK_I8X4);
	push(out, &cap, &s);
	dg_spec_init(&s, DG_OP_UNPACK_I8X4);
	push(out, &cap, &s);
}

dg_model_config dg_test_model(const char *preset, int layers, int embd, int heads, int neurons)
{
	dg_model_config c;
	char msg[256];
	cr_assert_eq(dg_model_preset(preset, &c, msg, sizeof(msg)), DG_OK, "%s", msg);
	if (layers)
		c.layers = layers;
	c.embd = embd;
	c.heads = heads;
	c.neurons = neurons;
	return c;
}

dg_model_config dg_test_tiny_model(const char *preset)
{
	return dg_test_model(preset, 2, 32, 2, 64);
}

size_t dg_test_numel(const dg_model_config *c, int p)
{
	int nd;
	int64_t sh[3];
	return (size_t)dg_model_param_shape(c, (dg_model_param)p, &nd, sh);
}

dg_model_weights *dg_test_tiny_weights(const char *preset, uint64_t seed, float scale)
{
	dg_model_config c = dg_test_tiny_model(preset);
	char msg[512];
	dg_model_weights *w;
	cr_assert_eq(dg_model_weights_create(&c, seed, &w, msg, sizeof(msg)), DG_OK, "%s", msg);
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		size_t n = dg_test_numel(&c, p);
		for (size_t i = 0; i < n; i++)
			w->params[p][i] *= scale;
	}
	return w;
}

int dg_test_argmax(const float *z, int n)
{
	int best = 0;
	for (int i = 1; i < n; i++)
		if (z[i] > z[best])
			best = i;
	return best;
}

dg_corpus *dg_test_corpus(const char *text, size_t n, size_t stride)
{
	char path[512], msg[256];
	size_t len = strlen(text);
	snprintf(path, sizeof(path), "%s/text.txt", dg_test_tmpdir());
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	for (size_t i = 0; i < n; i++)
		fputc(text[(i * stride) % len], f);
	fclose(f);
	dg_corpus *c;
	cr_assert_eq(dg_corpus_open(path, &c, msg, sizeof(msg)), DG_OK, "%s", msg);
	return c;
}

char *dg_test_log_untimed(const char *dir, int *lines)
{
	char path[600], line[1024];
	snprintf(path, sizeof(path), "%s/log.jsonl", dir);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	size_t cap = 1 << 16, n = 0;
	char *out = calloc(cap, 1);
	int count = 0;
	while (fgets(line, sizeof(line), f)) {
		char *cut = strstr(line, ", \"tokens_per_s\"");
		cr_assert_not_null(cut, "%s", line);
		*cut = '\0';
		n += (size_t)snprintf(out + n, cap - n, "%s\n", line);
		count++;
	}
	fclose(f);
	if (lines)
		*lines = count;
	return out;
}

dg_train_state *dg_test_checkpoint_at(const char *dir, int64_t step)
{
	char msg[512], path[600];
	dg_checkpoint_path(dir, step, path, sizeof(path));
	dg_train_state *s;
	cr_assert_eq(dg_checkpoint_load(path, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	return s;
}

dg_train_opts dg_test_tiny_opts(const char *dir, int64_t steps)
{
	dg_train_opts o;
	dg_train_defaults(&o, steps);
	o.model = dg_test_tiny_model("f32");
	o.time = 16;
	o.opt.lr = 3e-3f;
	o.out_dir = dir;
	return o;
}

void dg_test_expect_same_state(const dg_train_state *a, const dg_train_state *b)
{
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		size_t n = dg_test_numel(&a->weights->config, p) * 4;
		cr_expect_eq(memcmp(a->weights->params[p], b->weights->params[p], n), 0, "weights %d", p);
		cr_expect_eq(memcmp(a->m[p], b->m[p], n), 0, "adamw.m %d", p);
		cr_expect_eq(memcmp(a->v[p], b->v[p], n), 0, "adamw.v %d", p);
	}
}

dg_train_state *dg_test_train_state(const dg_model_config *c, const dg_adamw_config *o)
{
	char msg[256];
	dg_model_weights *w;
	cr_assert_eq(dg_model_weights_create(c, 5, &w, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_train_state *s;
	cr_assert_eq(dg_train_state_create(w, 42, o, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_model_weights_destroy(w);
	dg_rng r;
	dg_rng_seed(&r, 9);
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++)
		for (size_t i = 0; i < dg_test_numel(c, p); i++) {
			s->m[p][i] = dg_rng_uniform(&r, -1, 1) * 1e-3f;
			s->v[p][i] = dg_rng_uniform(&r, 0, 1) * 1e-6f;
		}
	return s;
}

void *dg_test_read_bytes(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "cannot read %s", path);
	fseek(f, 0, SEEK_END);
	size_t len = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc(len + 1);
	cr_assert_not_null(b);
	cr_assert_eq(fread(b, 1, len, f), len);
	b[len] = '\0';
	fclose(f);
	if (n)
		*n = len;
	return b;
}

void dg_test_write_bytes(const char *path, const void *b, size_t n)
{
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "cannot write %s", path);
	cr_assert_eq(fwrite(b, 1, n, f), n);
	cr_assert_eq(fclose(f), 0);
}

const char *dg_test_far_step(void *u, const char *key, const char *val)
{
	(void)u;
	return strcmp(key, "step") ? val : "999999999999";
}

dg_safetensors_writer *dg_test_rewrite(const dg_safetensors *f, const char *skip, dg_test_meta_fn edit,
				       void *u)
{
	char msg[512];
	dg_safetensors_writer *w;
	cr_assert_eq(dg_safetensors_writer_create(&w), DG_OK);
	for (size_t i = 0; i < dg_safetensors_count(f); i++) {
		const dg_st_tensor *t = dg_safetensors_at(f, i);
		if (skip && !strcmp(t->name, skip))
			continue;
		cr_assert_eq(dg_safetensors_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, msg,
						       sizeof(msg)), DG_OK, "%s", msg);
	}
	for (size_t i = 0; i < dg_safetensors_meta_count(f); i++) {
		const char *key, *val;
		cr_assert(dg_safetensors_meta_at(f, i, &key, &val));
		if (edit && !(val = edit(u, key, val)))
			continue;
		cr_assert_eq(dg_safetensors_writer_meta(w, key, val, msg, sizeof(msg)), DG_OK, "%s", msg);
	}
	return w;
}

void dg_test_expect_row_bytes(void)
{
	static const struct {
		dg_fmt fmt;
		int64_t n;
		size_t bytes;
	} rows[] = {
		{ DG_FMT_F32, 5, 20 },      { DG_FMT_BF16, 5, 10 },     { DG_FMT_INT8, 8, 8 },
		{ DG_FMT_INT8, 6, 0 },      /* not whole i8x4 words */ { DG_FMT_UINT8POS, 4, 4 },
		{ DG_FMT_INT4, 12, 12 },    { DG_FMT_TERNARY, 32, 8 }, { DG_FMT_TERNARY, 24, 0 },
		{ DG_FMT_SIGN1, 64, 8 },    { DG_FMT_SIGN1, 48, 0 },   { DG_FMT_F32, -1, 0 },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		cr_assert_eq(dg_fmt_row_bytes(rows[i].fmt, rows[i].n), rows[i].bytes, "%s × %lld",
			     dg_fmt_name(rows[i].fmt), (long long)rows[i].n);
}

dg_spec dg_test_spec_parse(const char *text)
{
	dg_spec s;
	char msg[512];
	cr_assert_eq(dg_spec_parse(text, &s, msg, sizeof(msg)), DG_OK, "%s: %s", text, msg);
	return s;
}

dg_codegen *dg_test_codegen(void)
{
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK, "%s", dg_codegen_errmsg(cg));
	return cg;
}

dg_spec dg_test_dequantize_spec(dg_fmt act, dg_fmt out, dg_scale_gran g, int threads)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_DEQUANTIZE);
	s.act = act;
	s.out = out;
	s.ascale = g;
	s.tile.threads = threads;
	return s;
}

dg_spec dg_test_spec_sized(dg_op op, int H, int E, int N)
{
	dg_spec s;
	dg_spec_init(&s, op);
	s.heads = H;
	s.embd = E;
	s.latent = N;
	return s;
}

void *dg_test_sparse_pairs(dg_rng *r, dg_fmt f, size_t n, float zero)
{
	void *p = malloc(n * (f == DG_FMT_BF16 ? 2 : 4) + 4);
	cr_assert(p, "out of memory");
	for (size_t i = 0; i + 1 < n; i += 2) {
		float a = dg_rng_uniform(r, -1.0f, 1.0f), b = dg_rng_uniform(r, -1.0f, 1.0f);
		if (a < zero)
			a = b = 0.0f;
		if (f == DG_FMT_BF16) {
			((uint16_t *)p)[i] = dg_f32_to_bf16(a);
			((uint16_t *)p)[i + 1] = dg_f32_to_bf16(b);
		} else {
			((float *)p)[i] = a;
			((float *)p)[i + 1] = b;
		}
	}
	return p;
}

int64_t dg_test_dim_extent(const dg_spec *s, dg_dim d, int64_t b, int64_t t, int64_t r)
{
	switch (d) {
	case DG_DIM_B:
		return b;
	case DG_DIM_T:
		return t;
	case DG_DIM_R:
		return r;
	case DG_DIM_H:
		return s->heads;
	case DG_DIM_HIN:
		return s->in_heads;
	case DG_DIM_D:
		return s->embd;
	case DG_DIM_N:
		return s->latent;
	case DG_DIM_HN:
		return (int64_t)s->heads * s->latent;
	case DG_DIM_V:
		return s->vocab;
	case DG_DIM_C:
		return s->chunk;
	case DG_DIM_S:
		return s->chunk > 0 ? 2 * (int64_t)s->latent * (t / s->chunk) : 0;
	default:
		return 1;
	}
}
