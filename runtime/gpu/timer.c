/*
 * The timer (dragon/runtime.h): CUDA events around each call, the L2
 * flushed before every rep by a write outside the events, quantiles of the
 * reps. The tuner's sweeps and the bench time with it.
 */
#include <math.h>
#include <stdlib.h>

#include "runtime/gpu/gpu_int.h"

#define DEFAULT_WARMUP 3
#define DEFAULT_REPS 25
#define DEFAULT_MAX_REPS 1000
#define MIN_FLUSH ((size_t)256 << 20)

struct dg_timer {
	dg_device *dev;
	int max_reps;
	dg_event **ev0, **ev1;
	double *us;
	dg_dptr flush;
	size_t flush_bytes;
};

void dg_timer_destroy(dg_timer *t)
{
	if (!t)
		return;
	for (int i = 0; i < t->max_reps; i++) {
		if (t->ev0)
			dg_event_destroy(t->ev0[i]);
		if (t->ev1)
			dg_event_destroy(t->ev1[i]);
	}
	free(t->ev0);
	free(t->ev1);
	free(t->us);
	(void)dg_free(t->dev, t->flush);
	free(t);
}

dg_status dg_timer_create(dg_device *dev, int max_reps, dg_timer **out)
{
	dg_device_info info;

	if (!out)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_timer_create: out is NULL");
	*out = NULL;
	dg_status st = dg_device_info_get(dev, &info);
	if (st)
		return st;
	dg_timer *t = calloc(1, sizeof(*t));
	if (!t)
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	t->dev = dev;
	t->max_reps = max_reps > 0 ? max_reps : DEFAULT_MAX_REPS;
	t->ev0 = calloc((size_t)t->max_reps, sizeof(*t->ev0));
	t->ev1 = calloc((size_t)t->max_reps, sizeof(*t->ev1));
	t->us = calloc((size_t)t->max_reps, sizeof(*t->us));
	if (!t->ev0 || !t->ev1 || !t->us) {
		dg_timer_destroy(t);
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	}
	for (int i = 0; i < t->max_reps && !st; i++) {
		st = dg_event_create(dev, &t->ev0[i]);
		if (!st)
			st = dg_event_create(dev, &t->ev1[i]);
	}
	t->flush_bytes = (size_t)info.l2_bytes * 4;
	if (t->flush_bytes < MIN_FLUSH)
		t->flush_bytes = MIN_FLUSH;
	if (!st)
		st = dg_malloc(dev, t->flush_bytes, &t->flush);
	if (st) {
		dg_timer_destroy(t);
		return st;
	}
	*out = t;
	return DG_OK;
}

size_t dg_timer_flush_bytes(const dg_timer *t)
{
	return t ? t->flush_bytes : 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Linear interpolation between order statistics (v sorted, n >= 1). */
static double quantile(const double *v, int n, double q)
{
	double pos = q * (n - 1);
	int lo = (int)floor(pos);
	int hi = lo + 1 < n ? lo + 1 : lo;
	return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

dg_status dg_timer_run(dg_timer *t, const dg_timer_opts *opts, dg_timed_fn fn, void *user,
		       dg_timing *out)
{
	if (!t || !fn || !out)
		return t ? dg__dev_fail(t->dev, DG_ERR_INVALID_ARG, "dg_timer_run: %s is NULL",
					!fn ? "fn" : "out")
			 : DG_ERR_INVALID_ARG;
	int warmup = opts && opts->warmup ? opts->warmup : DEFAULT_WARMUP;
	int reps = opts && opts->reps > 0 ? opts->reps : DEFAULT_REPS;
	bool flush = !(opts && opts->warm_l2);
	if (reps > t->max_reps)
		return dg__dev_fail(t->dev, DG_ERR_INVALID_ARG,
				    "dg_timer_run: %d reps, the timer holds %d (make it larger)", reps,
				    t->max_reps);
	dg_status st = DG_OK;
	for (int i = 0; i < warmup && !st; i++)
		st = fn(user);
	for (int i = 0; i < reps && !st; i++) {
		if (flush)
			st = dg_memset8(t->dev, t->flush, (uint8_t)i, t->flush_bytes);
		if (!st)
			st = dg_event_record(t->ev0[i]);
		if (!st)
			st = fn(user);
		if (!st)
			st = dg_event_record(t->ev1[i]);
	}
	if (!st)
		st = dg_event_synchronize(t->ev1[reps - 1]);
	for (int i = 0; i < reps && !st; i++) {
		float ms = 0;
		st = dg_event_elapsed_ms(t->ev0[i], t->ev1[i], &ms);
		t->us[i] = (double)ms * 1e3;
	}
	if (st)
		return st;
	qsort(t->us, (size_t)reps, sizeof(double), cmp_double);
	out->median_us = quantile(t->us, reps, 0.5);
	out->p10_us = quantile(t->us, reps, 0.1);
	out->p90_us = quantile(t->us, reps, 0.9);
	out->min_us = t->us[0];
	out->reps = reps;
	return DG_OK;
}
