/*
 * Bundles load (runtime/gpu/bundle.c): a `dragon-gen build` folder made for
 * this device puts every kernel a process needs into the kernel map, so it
 * compiles nothing.
 *
 *   - the default BDH set, built by $DRAGON_GEN for this device (its name
 *     and SM) into a fresh cache folder, loaded by dg_device_load_bundle
 *     into a device that has no disk cache (no_cache): every kernel of the
 *     manifest is then run once through the typed ops' door with its spec
 *     as a user writes it (tile auto, the portable target), on tensors made
 *     from the op table's signature at small B·T (the call's arguments
 *     struct filled through the arguments layout) — afterwards the device
 *     has compiled nothing and read no cache, and counts the manifest's
 *     kernels as bundled; the projection and the decoder (integer paths)
 *     and the packers are bit for bit dg_ref_run's;
 *   - $DRAGON_KERNELS loads a bundle at dg_device_open, and one that does
 *     not exist fails the open by name;
 *   - a bundle with one byte of a cubin changed is refused with
 *     DG_ERR_CORRUPT naming the file, loading nothing;
 *   - a manifest whose template_hash differs from the library's is refused
 *     with DG_ERR_UNSUPPORTED.
 *
 * Skips without a device (gh_open).
 */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_helpers.h"
#include "helpers.h"
#include "runtime/ops/checks.h"
#include "runtime/ops/ops_int.h"
#include "runtime/ref/ref_ops.h"

extern char **environ;

#define ROWS 64 /* B·T of every B·T op (B 1) */

/* ---- building bundles ------------------------------------------------------ */

/* A fresh, empty cache folder for this test's process (dragon-gen and the
 * devices read $DRAGON_CACHE_DIR) and no other bundles or records. */
static char *fresh_env(void)
{
	char *cache = dg_test_tmpdir();
	setenv("DRAGON_CACHE_DIR", cache, 1);
	unsetenv("DRAGON_KERNELS");
	unsetenv("DRAGON_TUNE_DB");
	return cache;
}

/*
 * Runs `$DRAGON_GEN build --out OUT --device NAME --sm SM [extra...]` for
 * the device of info; fails the test with dragon-gen's output unless it
 * exits 0. extra: NULL-terminated spec flags, or NULL for the default set.
 */
static void gen_build(const dg_device_info *info, const char *out, const char *const *extra)
{
	const char *gen = getenv("DRAGON_GEN");
	cr_assert(gen && *gen, "DRAGON_GEN is not set (ctest sets it to the dragon-gen binary)");
	char sm[16], log[700];
	snprintf(sm, sizeof(sm), "%d", info->sm);
	snprintf(log, sizeof(log), "%s.log", out);
	const char *argv[24] = { gen, "build", "--out", out, "--device", info->name, "--sm", sm };
	int n = 8;
	for (int i = 0; extra && extra[i] && n < 23; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;

	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	posix_spawn_file_actions_adddup2(&fa, 1, 2);
	pid_t pid;
	int rc = posix_spawn(&pid, gen, &fa, NULL, (char *const *)argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	cr_assert_eq(rc, 0, "posix_spawn %s: %s", gen, strerror(rc));
	int status = 0;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		char *text = dg_test_read_bytes(log, NULL);
		cr_assert_fail("dragon-gen build --out %s --device '%s' --sm %s%s: status %d:\n%.3000s", out,
			       info->name, sm, extra ? " (spec flags)" : "", status, text);
	}
	unlink(log);
}

/* A small bundle: the one default pack_i8x4 kernel. */
static const char *const SMALL[] = { "--op", "pack_i8x4", NULL };

static dg_manifest *load_manifest(const char *dir)
{
	dg_manifest *m = NULL;
	char msg[1024];
	cr_assert_eq(dg_manifest_load(dir, &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_gt(m->n_kernels, 0);
	return m;
}

/* A device without a disk cache (a deployed job's), no bundle loaded. */
static dg_device *open_uncached(void)
{
	dg_ctx_opts jit = { .no_cache = true };
	dg_device_opts o = { .ordinal = 0, .jit = &jit };
	dg_device *dev = NULL;
	cr_assert_eq(dg_device_open(&dev, &o), DG_OK, "%s", dg_device_errmsg(dev));
	return dev;
}

static dg_device_stats stats_of(dg_device *dev)
{
	dg_device_stats st;
	cr_assert_eq(dg_device_stats_get(dev, &st), DG_OK, "%s", dg_device_errmsg(dev));
	return st;
}

/* What every test starts from: the device that holds the tensors (gh_open:
 * skips without a GPU), a fresh cache folder (fresh_env), and a bundle
 * built for that device into a fresh folder (gen_build's extra), its
 * manifest loaded. */
typedef struct fixture {
	dg_device *mem;
	char *cache, *root;
	char out[600];
	dg_device_info info;
	dg_manifest *m;
} fixture;

static void fixture_open(fixture *f, const char *const *extra)
{
	f->mem = gh_open();
	f->cache = fresh_env();
	cr_assert_eq(dg_device_info_get(f->mem, &f->info), DG_OK);
	f->root = dg_test_tmpdir();
	snprintf(f->out, sizeof(f->out), "%s/bundle", f->root);
	gen_build(&f->info, f->out, extra);
	f->m = load_manifest(f->out);
}

static void fixture_close(fixture *f)
{
	dg_manifest_destroy(f->m);
	gh_close(f->mem);
	dg_test_rmtree(f->root);
	dg_test_rmtree(f->cache);
}

/* ---- one call of any op, from the op table's signature ---------------------- */

typedef struct arg_buf {
	dg_fmt fmt;
	size_t n, bytes;
	void *host; /* inputs: the data; outputs: what came back */
	float scale;
	dg_tensor t;
} arg_buf;

typedef struct op_case {
	dg_spec spec;
	const dg_op_info *row;
	arg_buf a[DG_OP_MAX_ARGS];
	int out;
	int64_t b, t, r;
	dg_workspace ws;
} op_case;

static int64_t extent(const op_case *c, dg_dim d)
{
	switch (d) {
	case DG_DIM_B:
		return c->b;
	case DG_DIM_T:
		return c->t;
	case DG_DIM_R:
		return c->r;
	case DG_DIM_H:
		return c->spec.heads;
	case DG_DIM_HIN:
		return c->spec.in_heads;
	case DG_DIM_D:
		return c->spec.embd;
	case DG_DIM_N:
		return c->spec.latent;
	case DG_DIM_HN:
		return (int64_t)c->spec.heads * c->spec.latent;
	case DG_DIM_V:
		return c->spec.vocab;
	case DG_DIM_C:
		return c->spec.chunk;
	case DG_DIM_S:
		return c->spec.chunk > 0 ? 2 * (int64_t)c->spec.latent * (c->t / c->spec.chunk) : 0;
	default:
		return 1;
	}
}

/* Stores the n bytes of v at a layout's offset `at` (plus one; 0: the
 * struct has no such field, nothing stored). */
static void put(unsigned char *args, uint16_t at, const void *v, size_t n)
{
	if (at)
		memcpy(args + at - 1, v, n);
}

/*
 * Runs c's op on dev, or (ws_bytes non-NULL) asks for its workspace, as a
 * user's dg_<op> call does: its typed arguments struct, filled through the
 * op's row of the arguments layout (runtime/ops/args_layout.c) — the op
 * table's tensors in order (an epilogue's that the spec does not use:
 * NULL), the workspace, and the options: eps 1e-5 (the norms), backward
 * (lmhead_ce), the dropout's p 0.1, seed 1, step 2, layer 3, decay
 * (adamw_update); the rest zero — then the typed door every dg_<op> is one
 * line of. An op whose struct has no workspace needs none.
 */
static dg_status op_call(dg_device *dev, op_case *c, size_t *ws_bytes)
{
	const dg_spec *s = &c->spec;
	const dg__args_layout *l = dg__op_args_layout(s->op);
	cr_assert(l && l->size, "op %s has no arguments struct", dg_op_name(s->op));
	unsigned char *args = gh_xmalloc(l->size);
	memset(args, 0, l->size);
	for (int i = 0; i < c->row->n_args; i++) {
		const dg_tensor *t = dg_op_arg_used(s, i) ? &c->a[i].t : NULL;
		cr_assert(l->t[i].at, "%s: no field for %s", dg_op_name(s->op), c->row->args[i].name);
		put(args, l->t[i].at, &t, sizeof(t));
	}
	const float eps = 1e-5f, p = 0.1f;
	const bool yes = true;
	const uint64_t seed = 1;
	const uint32_t step = 2, layer = 3;
	put(args, l->ws, &c->ws, sizeof(c->ws));
	put(args, l->eps, &eps, sizeof(eps));
	put(args, l->backward, &yes, sizeof(yes));
	put(args, l->p, &p, sizeof(p));
	put(args, l->seed, &seed, sizeof(seed));
	put(args, l->step, &step, sizeof(step));
	put(args, l->layer, &layer, sizeof(layer));
	put(args, l->decay, &yes, sizeof(yes));
	dg_status st;
	if (ws_bytes) {
		*ws_bytes = 0;
		st = l->ws ? dg__op_typed_workspace(dev, s->op, s, args, ws_bytes) : DG_OK;
	} else {
		st = dg__op_typed_run(dev, s->op, s, args);
	}
	free(args);
	return st;
}

/* Codes a pack op reads: codes its packed format holds (random storage of
 * that format, unpacked by the reference). */
static void pack_codes(op_case *c, arg_buf *b)
{
	dg_fmt pf = c->row->pack_fmt;
	size_t rows = b->n / (size_t)c->spec.embd;
	void *words = gh_rand_storage(pf, b->n, NULL);
	dg_status st = pf == DG_FMT_TERNARY ? dg_ref_unpack_ternary(words, b->host, rows, c->spec.embd)
					    : dg_ref_unpack_sign1(words, b->host, rows, c->spec.embd);
	cr_assert_eq(st, DG_OK, "random %s storage does not unpack", dg_fmt_name(pf));
	free(words);
}

/* The tensors of spec's op at ROWS rows (B 1), R 8 for the pack ops (1 for
 * the i8x4 packs, whose rows are heads), the quantizers (16, 256); inputs
 * random, outputs 0xff, scales about 1/qmax (0.05 for ternary and sign1). */
static void case_make(op_case *c, dg_device *mem, const dg_spec *spec)
{
	memset(c, 0, sizeof(*c));
	c->spec = *spec;
	c->row = dg_op_info_of(spec->op);
	c->b = 1;
	c->t = (c->row->fields & DG_FIELD_CHUNK) ? spec->chunk : ROWS; /* a chunked op: one whole chunk */
	c->r = spec->op == DG_OP_PACK_I8X4 || spec->op == DG_OP_UNPACK_I8X4 ? 1 : 8;
	c->out = -1;
	for (int i = 0; i < c->row->n_args; i++) {
		const dg_op_arg *a = &c->row->args[i];
		arg_buf *b = &c->a[i];
		if (!dg_op_arg_used(spec, i))
			continue; /* another epilogue's argument: none */
		int64_t shape[4] = { 16, 256, 1, 1 };
		int ndim = a->ndim ? a->ndim : 2;
		for (int d = 0; d < a->ndim; d++)
			shape[d] = extent(c, a->dims[d]);
		b->fmt = dg_op_arg_fmt(spec, a->fmt);
		b->t = dg_tensor_make(a->name, b->fmt, 0, ndim, shape);
		b->n = (size_t)dg_tensor_numel(&b->t);
		b->bytes = gh_bytes(b->fmt, b->n);
		if (a->output)
			c->out = i;
		if (a->output && !((c->row->inout >> i) & 1u)) { /* in-place ones are read: random */
			b->host = gh_xmalloc(b->bytes);
			b->t.data = gh_alloc_ff(mem, b->bytes);
		} else {
			b->host = gh_rand_storage(b->fmt, b->n, NULL);
			if (c->row->pack_fmt != DG_FMT__COUNT && b->fmt == DG_FMT_INT8)
				pack_codes(c, b);
			b->t.data = gh_upload(mem, b->host, b->bytes);
		}
		if (a->scale && dg_fmt_is_code(b->fmt)) {
			const dg_fmt_info *fi = dg_fmt_info_of(b->fmt);
			b->scale = fi->per_word == 4 ? 1.0f / (float)fi->qmax : 0.05f;
			b->t.scale = gh_scalar(mem, b->scale);
			/* a scale a row (ascale=token: an input's act codes) or a
			 * channel (wscale=channel: its weight codes): the same one
			 * for each row of the last dimension, the most any op reads
			 * (the decoder's y reads B·T of them) */
			const unsigned uses = dg_spec_uses(spec->op);
			const bool token = (uses & DG_FIELD_ASCALE) && spec->ascale == DG_SCALE_TOKEN &&
					   a->fmt == DG_ARG_ACT && !a->output;
			const bool channel = (uses & DG_FIELD_WSCALE) && spec->wscale == DG_SCALE_CHANNEL &&
					     a->fmt == DG_ARG_WEIGHT && !a->output;
			if (token || channel) {
				int64_t rows = 1;
				for (int d = 0; d < ndim - 1; d++)
					rows *= shape[d];
				float *sv = gh_xmalloc((size_t)rows * sizeof(float));
				for (int64_t r = 0; r < rows; r++)
					sv[r] = b->scale;
				b->t.scale = gh_upload(mem, sv, (size_t)rows * sizeof(float));
				free(sv);
			}
		}
	}
	cr_assert_geq(c->out, 0, "%s: the op table names no output", dg_op_name(spec->op));
	/* the projection's code out scale spans the codes, some clamped */
	arg_buf *o = &c->a[c->out];
	if (spec->op == DG_OP_LOWRANK_FWD && dg_fmt_is_code(o->fmt)) {
		dg_spec fs = *spec;
		fs.out = DG_FMT_F32;
		float *y = gh_xmalloc(o->n * 4), ymax = 0;
		dg_ref_call rc = { .in = { c->a[0].host, c->a[1].host },
				   .scale = { c->a[0].scale, c->a[1].scale }, .out = y, .b = c->b,
				   .t = c->t };
		cr_assert_eq(dg_ref_run(&fs, &rc), DG_OK);
		for (size_t i = 0; i < o->n; i++)
			ymax = fmaxf(ymax, fabsf(y[i]));
		free(y);
		o->scale = ymax > 0 ? ymax / 100.0f : 1.0f;
		cr_assert_eq(dg_memcpy_htod(mem, o->t.scale, &o->scale, 4), DG_OK);
	}
}

static void case_free(op_case *c)
{
	for (int i = 0; i < DG_OP_MAX_ARGS; i++)
		free(c->a[i].host);
}

/* Ops whose result must be dg_ref_run's bit for bit here: integer codes
 * in, exact sums (the projection and the decoder), and the packers. */
static bool exact_op(const dg_spec *s)
{
	switch (s->op) {
	case DG_OP_LOWRANK_FWD:
	case DG_OP_DECODER_FWD:
		return dg_fmt_is_code(s->act) && dg_fmt_is_code(s->weight);
	case DG_OP_PACK_TERNARY:
	case DG_OP_PACK_SIGN1:
	case DG_OP_PACK_I8X4:
	case DG_OP_UNPACK_I8X4:
		return true;
	default:
		return false;
	}
}

/* Runs c on dev (its workspace allocated on mem) and checks it: ran, every
 * float output written, the quantizers' scale set, exact ops bit for bit
 * the reference. Returns whether it was compared with the reference. */
static bool case_run(op_case *c, dg_device *dev, dg_device *mem)
{
	char canon[DG_SPEC_TEXT_MAX], why[512];
	size_t need = 0;
	dg_spec_to_string(&c->spec, canon, sizeof(canon));
	cr_assert_eq(op_call(dev, c, &need), DG_OK, "%s: workspace: %s", canon, dg_device_errmsg(dev));
	c->ws = gh_workspace(mem, need);
	/* the inputs, scales and the 0xff fill went on mem's stream, the op
	 * goes on dev's: they are ordered only by waiting for mem */
	cr_assert_eq(dg_device_sync(mem), DG_OK, "%s: %s", canon, dg_device_errmsg(mem));
	cr_assert_eq(op_call(dev, c, NULL), DG_OK, "%s: %s", canon, dg_device_errmsg(dev));
	cr_assert_eq(dg_device_sync(dev), DG_OK, "%s: %s", canon, dg_device_errmsg(dev));
	arg_buf *o = &c->a[c->out];
	gh_download(mem, o->host, o->t.data, o->bytes);
	if (o->fmt == DG_FMT_F32)
		for (size_t i = 0; i < o->n; i++)
			cr_assert(!isnan(((const float *)o->host)[i]), "%s: out[%zu] never written", canon, i);
	if (o->fmt == DG_FMT_BF16)
		for (size_t i = 0; i < o->n; i++)
			cr_assert(!isnan(dg_bf16_to_f32(((const uint16_t *)o->host)[i])),
				  "%s: out[%zu] never written", canon, i);
	if (c->row->check == DG_CHECK_SCALED_CODES)
		cr_assert_gt(gh_read_scalar(mem, o->t.scale), 0.0f, "%s: no scale", canon);
	if (!exact_op(&c->spec))
		return false;
	dg_ref_call rc;
	memset(&rc, 0, sizeof(rc));
	for (int i = 0; i < c->row->n_args; i++) {
		rc.in[i] = i == c->out ? NULL : c->a[i].host;
		rc.scale[i] = c->a[i].scale;
	}
	void *want = gh_xmalloc(o->bytes);
	rc.out = want;
	rc.b = c->b;
	rc.t = c->t;
	rc.r = c->r;
	cr_assert_eq(dg_ref_run(&c->spec, &rc), DG_OK, "%s: reference", canon);
	cr_assert(dg_ref_same_bytes(o->host, want, o->bytes, why, sizeof(why)), "%s: %s", canon, why);
	free(want);
	return true;
}

/* ---- the default set ---------------------------------------------------------- */

/* No Criterion .timeout on these tests: with one on each, Criterion 2.4.1's
 * runner leaks 48 bytes now and then (LeakSanitizer fails the sanitized
 * CI run, about one run in three); ctest's --timeout bounds a hang. */
Test(gpu_bundle, default_set_runs_without_compiling)
{
	fixture f;
	fixture_open(&f, NULL);
	dg_device *mem = f.mem;
	dg_manifest *m = f.m;
	const char *out = f.out;
	cr_assert_str_eq(m->device, f.info.name);
	cr_assert_eq(m->sm, f.info.sm);

	dg_device *dev = open_uncached();
	size_t loaded = 0;
	cr_assert_eq(dg_device_load_bundle(dev, out, &loaded), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(loaded, m->n_kernels, "every kernel is this device's");
	dg_device_stats st = stats_of(dev);
	cr_assert_eq(st.bundled, m->n_kernels);
	cr_assert_eq(st.modules, m->n_kernels);
	cr_assert_eq(st.compiled + st.cached, 0);

	size_t checked = 0, projections = 0;
	for (size_t i = 0; i < m->n_kernels; i++) {
		dg_spec s;
		char msg[512];
		cr_assert_eq(dg_spec_parse(m->kernels[i].spec, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
		/* as a user writes it: the device resolves tile and target */
		memset(&s.tile, 0, sizeof(s.tile));
		s.arch_specific = false;
		op_case c;
		case_make(&c, mem, &s);
		if (case_run(&c, dev, mem)) {
			checked++;
			projections += s.op == DG_OP_LOWRANK_FWD;
		}
		dg_kernel *k = NULL;
		dg_kernel_info ki;
		cr_assert_eq(dg_kernel_get(dev, &s, NULL, &k), DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(dg_kernel_info_get(k, &ki), DG_OK);
		cr_assert_eq(ki.origin, DG_KERNEL_BUNDLED,
			     "the bundle's %s: the device ran %s, which it %s", m->kernels[i].spec,
			     ki.canonical, ki.origin == DG_KERNEL_COMPILED ? "compiled" : "read from a cache");
		case_free(&c);
	}
	st = stats_of(dev);
	cr_assert_eq(st.compiled, 0, "%zu kernels compiled", st.compiled);
	cr_assert_eq(st.cached, 0);
	cr_assert_eq(st.bundled, m->n_kernels);
	cr_assert_eq(st.modules, m->n_kernels, "no module beyond the bundle's");
	cr_assert_gt(projections, 0, "no projection compared with the reference");
	fprintf(stderr, "bundle: %zu kernels ran, %zu compared with the reference bit for bit\n",
		m->n_kernels, checked);
	dg_device_close(dev);
	fixture_close(&f);
}

/* ---- $DRAGON_KERNELS ---------------------------------------------------------- */

Test(gpu_bundle, dragon_kernels_loads_at_open)
{
	fixture f;
	fixture_open(&f, SMALL);
	dg_device *mem = f.mem;
	dg_manifest *m = f.m;
	char missing[700];

	setenv("DRAGON_KERNELS", f.out, 1);
	dg_device *dev = open_uncached();
	dg_device_stats st = stats_of(dev);
	cr_assert_eq(st.bundled, m->n_kernels, "loaded at open");
	dg_spec s;
	char msg[512];
	cr_assert_eq(dg_spec_parse(m->kernels[0].spec, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	memset(&s.tile, 0, sizeof(s.tile));
	s.arch_specific = false;
	op_case c;
	case_make(&c, mem, &s);
	cr_assert(case_run(&c, dev, mem), "pack_i8x4 is compared with the reference");
	case_free(&c);
	st = stats_of(dev);
	cr_assert_eq(st.compiled + st.cached, 0, "%zu compiled, %zu cached", st.compiled, st.cached);
	dg_device_close(dev);

	/* a folder that is not there fails the open, by name */
	snprintf(missing, sizeof(missing), "%s/no-such-bundle", f.root);
	setenv("DRAGON_KERNELS", missing, 1);
	dg_ctx_opts jit = { .no_cache = true };
	dg_device_opts o = { .ordinal = 0, .jit = &jit };
	dev = NULL;
	cr_assert_neq(dg_device_open(&dev, &o), DG_OK, "a missing $DRAGON_KERNELS folder");
	cr_assert(strstr(dg_device_errmsg(dev), missing), "%s", dg_device_errmsg(dev));
	dg_device_close(dev);
	unsetenv("DRAGON_KERNELS");
	fixture_close(&f);
}

/* ---- refused bundles ---------------------------------------------------------- */

/* f's bundle, loaded by a device without a disk cache, is refused with
 * status want and a message naming `name`: nothing of it loaded. */
static void expect_refused(fixture *f, dg_status want, const char *name)
{
	dg_device *dev = open_uncached();
	size_t loaded = 99;
	cr_assert_eq(dg_device_load_bundle(dev, f->out, &loaded), want, "%s", dg_device_errmsg(dev));
	cr_assert(strstr(dg_device_errmsg(dev), name), "names %s: %s", name, dg_device_errmsg(dev));
	cr_assert_eq(loaded, 0);
	cr_assert_eq(stats_of(dev).bundled, 0, "nothing of it loaded");
	dg_device_close(dev);
}

Test(gpu_bundle, a_changed_cubin_byte_is_refused)
{
	fixture f;
	fixture_open(&f, SMALL);
	char path[1200];
	const char *file = f.m->kernels[0].file;
	snprintf(path, sizeof(path), "%s/%s", f.out, file);
	size_t n = 0;
	char *bytes = dg_test_read_bytes(path, &n);
	cr_assert_gt(n, 64);
	bytes[n / 2] ^= 0x01; /* same size: only the checksum can tell */
	dg_test_write_bytes(path, bytes, n);
	free(bytes);
	expect_refused(&f, DG_ERR_CORRUPT, file);
	fixture_close(&f);
}

Test(gpu_bundle, other_templates_are_refused)
{
	fixture f;
	fixture_open(&f, SMALL);
	dg_manifest *m = f.m;
	char path[700], msg[1024];
	m->template_hash[0] = m->template_hash[0] == '0' ? '1' : '0';
	char *json = NULL;
	cr_assert_eq(dg_manifest_to_json(m, &json, msg, sizeof(msg)), DG_OK, "%s", msg);
	snprintf(path, sizeof(path), "%s/%s", f.out, DG_MANIFEST_FILE);
	dg_test_write_bytes(path, json, strlen(json));
	free(json);
	expect_refused(&f, DG_ERR_UNSUPPORTED, "templates");
	fixture_close(&f);
}
