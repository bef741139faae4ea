/*
 * A sweep: compile every candidate of the space in parallel, reject what
 * cannot run, check the rest against the CPU reference at a small shape,
 * time them at the real shape, choose the winner, and fill a record.
 *
 * Compiling: `jobs` threads take candidates off a counter and ask the
 * device for the candidate's kernel (dg_kernel_get): that renders,
 * compiles with NVRTC (each build on its own JIT context; NVRTC is
 * thread-safe per program) or reads the disk cache, loads the module and
 * reads each entry's registers, shared memory and thread limit from the
 * driver. A build the runtime refuses (too much shared memory, more
 * threads than the registers allow) and one dg_tune_fits refuses are
 * rejected with the reason. This phase may use 70% of the budget; the
 * rest is kept for checking and timing what compiled.
 *
 * Checking and timing run on the calling thread, one candidate at a time
 * (so timings never overlap): run at check_rows and compare; then the
 * device's timer (runtime/gpu/gpu_int.h dg_timer: warm-up calls, then reps
 * calls each after an L2 flush, events around the call; median, p10 and
 * p90). A candidate whose launch fails for a reason of its own (the op's
 * checks, its launch limits) is rejected; a failure of the device ends
 * the sweep.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "autotune/sweep_int.h"
#include "dragon/codegen.h"
#include "dragon/jit.h"
#include "dragon/autotune.h"
#include "dragon/tune.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/tunedb/choose.h"

#define COMPILE_SHARE 0.7 /* of the budget */
#define MAX_JOBS 256
#define MAX_REPS 10000

typedef struct sweep {
	dg_device *dev;
	dg_spec spec;       /* normalized, tile auto */
	dg_tune_opts o;     /* defaults filled in */
	const dg_spec *cands;
	dg_tune_cand *res;  /* parallel to cands */
	bool *loaded;       /* compiled and fits: to be checked and timed */
	size_t n;
	double t0;          /* seconds, monotonic */
	dg_tune_limits lim;
	pthread_mutex_t mu; /* next, done, the progress callback */
	size_t next, done;
} sweep;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double elapsed(const sweep *w)
{
	return now_s() - w->t0;
}

/* The first line of msg, cut to fit. */
static void set_reason(dg_tune_cand *c, const char *msg)
{
	size_t n = strcspn(msg, "\n");
	if (n >= sizeof(c->reason))
		n = sizeof(c->reason) - 1;
	memcpy(c->reason, msg, n);
	c->reason[n] = '\0';
}

static void progress(sweep *w, dg_tune_phase phase, size_t done, size_t total)
{
	if (!w->o.progress)
		return;
	double t = elapsed(w), eta = -1;
	if (done > 0 && done <= total)
		eta = t / (double)done * (double)(total - done);
	if (eta > w->o.budget_s - t)
		eta = w->o.budget_s - t > 0 ? w->o.budget_s - t : 0;
	w->o.progress(w->o.user, &w->spec, phase, done, total, eta);
}

static int tile_threads(const dg_tile *t)
{
	return t->threads ? t->threads : t->wm * t->wn * 32;
}

/* ---- compile ---------------------------------------------------------------- */

/* Compiles and loads candidate i, reads its resources; false: rejected. */
static bool compile_one(sweep *w, size_t i)
{
	const dg_spec *s = &w->cands[i];
	dg_tune_cand *c = &w->res[i];
	dg_kernel *k = NULL;
	char why[512];

	if (dg_kernel_get(w->dev, s, NULL, &k) != DG_OK) {
		set_reason(c, dg_device_errmsg(w->dev));
		c->state = DG_TUNE_REJECTED;
		return false;
	}
	for (int e = 0; e < dg_kernel_entry_count(k); e++) {
		dg_kernel_info ki;
		dg_kernel_info_get(dg_kernel_entry(k, e), &ki);
		dg_tune_resources r = {
			.threads = ki.block_threads > 0 ? ki.block_threads : tile_threads(&s->tile),
			.dyn_smem = ki.dyn_smem,
			.static_smem = ki.static_smem,
			.regs = ki.regs,
			.local_bytes = ki.local_bytes,
			.max_threads = ki.max_threads,
		};
		if (e == 0)
			c->threads = r.threads;
		if (r.dyn_smem + r.static_smem > c->smem)
			c->smem = r.dyn_smem + r.static_smem;
		if (r.regs > c->regs)
			c->regs = r.regs;
		if (r.local_bytes > c->local_bytes)
			c->local_bytes = r.local_bytes;
		if (!dg_tune_fits(&r, &w->lim, why, sizeof(why))) {
			snprintf(c->reason, sizeof(c->reason), "%.100s: %.400s", ki.entry, why);
			c->state = DG_TUNE_REJECTED;
			return false;
		}
	}
	return true;
}

static void *compile_worker(void *arg)
{
	sweep *w = arg;

	for (;;) {
		pthread_mutex_lock(&w->mu);
		size_t i = w->next;
		bool stop = i >= w->n || elapsed(w) > w->o.budget_s * COMPILE_SHARE;
		if (!stop)
			w->next++;
		pthread_mutex_unlock(&w->mu);
		if (stop)
			break;
		w->loaded[i] = compile_one(w, i);
		pthread_mutex_lock(&w->mu);
		w->done++;
		progress(w, DG_TUNE_PHASE_COMPILE, w->done, w->n);
		pthread_mutex_unlock(&w->mu);
	}
	return NULL;
}

static void compile_all(sweep *w)
{
	pthread_t th[MAX_JOBS];
	int jobs = w->o.jobs, started = 0;

	if ((size_t)jobs > w->n)
		jobs = (int)w->n;
	while (started < jobs && pthread_create(&th[started], NULL, compile_worker, w) == 0)
		started++;
	if (started == 0)
		compile_worker(w);
	for (int t = 0; t < started; t++)
		pthread_join(th[t], NULL);
	for (size_t i = w->next; i < w->n; i++) {
		w->res[i].state = DG_TUNE_SKIPPED;
		snprintf(w->res[i].reason, sizeof(w->res[i].reason),
			 "not compiled: %.0f s of the %.0f s budget go to compiling, and they ran out",
			 w->o.budget_s * COMPILE_SHARE, w->o.budget_s);
	}
}

/* ---- time ------------------------------------------------------------------- */

static bool own_fault(dg_status st)
{
	return st == DG_ERR_INVALID_ARG || st == DG_ERR_INVALID_SPEC ||
	       st == DG_ERR_UNSUPPORTED || st == DG_ERR_COMPILE;
}

typedef struct timed_call {
	dg__at_case *tc;
	const dg_spec *cand;
} timed_call;

static dg_status run_timed(void *user)
{
	timed_call *t = user;
	return dg__at_case_run(t->tc, t->cand);
}

/* Times candidate cand on the timing case into c. A status only when the
 * device failed; a refusal of the candidate rejects it. */
static dg_status time_one(sweep *w, dg_timer *t, dg__at_case *tc, const dg_spec *cand,
			  dg_tune_cand *c)
{
	timed_call call = { tc, cand };
	dg_timer_opts o = { .warmup = w->o.warmup, .reps = w->o.reps };
	dg_timing tm;
	dg_status st = dg_timer_run(t, &o, run_timed, &call, &tm);

	if (st && own_fault(st)) {
		c->state = DG_TUNE_REJECTED;
		set_reason(c, dg_device_errmsg(w->dev));
		return dg_device_sync(w->dev);
	}
	if (st)
		return st;
	c->state = DG_TUNE_TIMED;
	c->median_us = tm.median_us;
	c->p10_us = tm.p10_us;
	c->p90_us = tm.p90_us;
	c->reps = tm.reps;
	return DG_OK;
}

static dg_status check_and_time(sweep *w)
{
	dg__at_case *check = NULL, *tc = NULL;
	dg_timer *t = NULL;
	size_t todo = 0, done = 0;
	dg_status st;

	for (size_t i = 0; i < w->n; i++)
		todo += w->loaded[i];
	if (!todo)
		return DG_OK;
	progress(w, DG_TUNE_PHASE_REFERENCE, 0, 1);
	st = dg__at_case_create(w->dev, &w->spec, w->o.check_rows, true, w->o.seed, &check);
	if (!st)
		st = dg__at_case_create(w->dev, &w->spec, w->o.rows, false, w->o.seed + 1, &tc);
	if (!st)
		st = dg_timer_create(w->dev, w->o.reps, &t);
	progress(w, DG_TUNE_PHASE_REFERENCE, 1, 1);
	for (size_t i = 0; i < w->n && !st; i++) {
		dg_tune_cand *c = &w->res[i];
		char why[512];
		dg__at_verdict v = DG__AT_REFUSED;

		if (!w->loaded[i])
			continue;
		if (elapsed(w) > w->o.budget_s) {
			c->state = DG_TUNE_SKIPPED;
			snprintf(c->reason, sizeof(c->reason),
				 "compiled, but the %.0f s budget ran out before it was timed",
				 w->o.budget_s);
			continue;
		}
		st = dg__at_case_check(check, &w->cands[i], &v, why, sizeof(why));
		if (st)
			break;
		if (v != DG__AT_RIGHT) {
			c->state = v == DG__AT_WRONG ? DG_TUNE_WRONG : DG_TUNE_REJECTED;
			set_reason(c, why);
		} else {
			st = time_one(w, t, tc, &w->cands[i], c);
		}
		progress(w, DG_TUNE_PHASE_TIME, ++done, todo);
	}
	dg_timer_destroy(t);
	dg__at_case_destroy(tc);
	dg__at_case_destroy(check);
	return st;
}

/* ---- the record ------------------------------------------------------------- */

static void iso_now(char *buf, size_t size)
{
	time_t now = time(NULL);
	struct tm tm;
	gmtime_r(&now, &tm);
	strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static void fill_defaults(dg_tune_opts *o)
{
	if (!(o->budget_s > 0))
		o->budget_s = 60;
	if (o->rows <= 0)
		o->rows = 4096;
	if (o->check_rows <= 0)
		o->check_rows = 64;
	if (o->warmup <= 0)
		o->warmup = 3;
	if (o->reps <= 0)
		o->reps = 25;
	if (o->reps > MAX_REPS)
		o->reps = MAX_REPS;
	if (o->jobs <= 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		o->jobs = n > 0 ? (int)n : 1;
	}
	if (o->jobs > MAX_JOBS)
		o->jobs = MAX_JOBS;
	if (!(o->tie_band > 0))
		o->tie_band = DG_TUNE_TIE_BAND;
	if (!o->seed)
		o->seed = 0x6472616730ull;
}

dg_status dg_tune_sweep(dg_device *dev, const dg_spec *spec, const dg_tune_opts *opts,
			dg_tune_record **out)
{
	char msg[1024];
	dg_spec *cands = NULL;
	size_t n = 0;
	sweep w;
	dg_status st;

	if (out)
		*out = NULL;
	dg_device_info dinfo;
	st = dg_device_info_get(dev, &dinfo); /* the device is open */
	if (st)
		return st;
	if (!spec || !out)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_tune_sweep: %s is NULL",
				    !spec ? "spec" : "out");
	memset(&w, 0, sizeof(w));
	w.t0 = now_s();
	w.dev = dev;
	if (opts)
		w.o = *opts;
	fill_defaults(&w.o);
	const dg_device_info *info = dg__dev_info(dev);
	/* a codegen of the device's templates of our own, to plan the space
	 * (the device's contexts serve its builds) */
	dg_codegen *cg = NULL;
	const char *origin = dg_codegen_template_origin(dg_ctx_codegen(dg_device_jit(dev)));
	dg_codegen_opts co = { .template_dir = strcmp(origin, "embedded") ? origin : NULL };
	st = dg_codegen_create(&cg, &co);
	if (!st)
		st = dg_tune_space(cg, spec, info->sm, &cands, &n, msg, sizeof(msg));
	else
		snprintf(msg, sizeof(msg), "%s", dg_codegen_errmsg(cg));
	dg_codegen_destroy(cg);
	if (st)
		return dg__dev_fail(dev, st, "%s", msg);
	if (w.o.max_candidates > 0 && (size_t)w.o.max_candidates < n)
		n = (size_t)w.o.max_candidates;
	w.spec = *spec;
	memset(&w.spec.tile, 0, sizeof(w.spec.tile));
	dg_spec_normalize(&w.spec);
	w.cands = cands;
	w.n = n;
	w.lim.max_threads = info->max_block_threads;
	w.lim.smem_optin = info->smem_optin;
	w.lim.regs_per_block = info->regs_per_block;
	dg_tune_record *r = calloc(1, sizeof(*r));
	w.res = calloc(n ? n : 1, sizeof(*w.res));
	w.loaded = calloc(n ? n : 1, sizeof(*w.loaded));
	if (!r || !w.res || !w.loaded) {
		free(cands);
		free(r);
		free(w.res);
		free(w.loaded);
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	}
	for (size_t i = 0; i < n; i++) {
		w.res[i].tile = cands[i].tile;
		w.res[i].arch_specific = cands[i].arch_specific;
	}
	pthread_mutex_init(&w.mu, NULL);
	compile_all(&w);
	pthread_mutex_destroy(&w.mu);
	st = check_and_time(&w);
	free(cands);
	free(w.loaded);
	if (st) {
		free(w.res);
		free(r);
		return st; /* the message is on dev */
	}

	r->spec = w.spec;
	dg_spec_to_string(&w.spec, r->spec_text, sizeof(r->spec_text));
	snprintf(r->device.name, sizeof(r->device.name), "%s", info->name);
	r->device.sm = info->sm;
	r->device.sm_count = info->sm_count;
	r->device.driver_version = info->driver_version;
	snprintf(r->device.nvrtc_version, sizeof(r->device.nvrtc_version), "%s",
		 dg_nvrtc_version());
	snprintf(r->generator_version, sizeof(r->generator_version), "%s", DG_GENERATOR_VERSION);
	iso_now(r->date, sizeof(r->date));
	r->rows = w.o.rows;
	r->check_rows = w.o.check_rows;
	r->warmup = w.o.warmup;
	r->reps = w.o.reps;
	r->tie_band = w.o.tie_band;
	r->budget_s = w.o.budget_s;
	r->cands = w.res;
	r->n_cands = n;
	for (size_t i = 0; i < n; i++)
		r->budget_exhausted |= w.res[i].state == DG_TUNE_SKIPPED;
	r->winner = dg_tune_choose(r->cands, r->n_cands, r->tie_band);
	r->elapsed_s = elapsed(&w);
	*out = r;
	return DG_OK;
}
