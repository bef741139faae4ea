/*
 * A real sweep on the GPU (autotune/sweep.c): one lowrank_fwd and one
 * decoder_fwd spec at a reduced shape, a few candidates, a small budget.
 * Checks that every candidate ends timed (with ordered quantiles) or with
 * a reason, that a winner is chosen and its record is written and reads
 * back, and that a fresh device (closed and reopened, so the DB is read
 * anew as in a new process) runs the spec with the tuned tile. Then the
 * events and the one timer (dg_timer: warm-up, L2 flush, quantiles) the
 * sweeps and the bench time with. Skips without a device (gh_open); fails
 * instead with DRAGON_REQUIRE_GPU=1.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/autotune.h"
#include "dragon/tune.h"
#include "gpu_helpers.h"
#include "helpers.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/tunedb/choose.h"

static const char *const SPECS[2] = {
	"op=lowrank_fwd;weight=ternary;act=int8;out=int8;relu=0",
	"op=decoder_fwd;weight=int8;act=int8;out=bf16",
};

static void on_progress(void *user, const dg_spec *spec, dg_tune_phase phase, size_t done,
			size_t total, double eta_s)
{
	int *calls = user;
	(void)spec;
	(void)phase;
	cr_assert_leq(done, total);
	cr_assert(eta_s >= -1.0);
	(*calls)++;
}

Test(gpu_tune, sweep_record_and_fresh_device)
{
	dg_device *dev = gh_open();
	char *db = dg_test_tmpdir();
	char paths[2][1200], tiles[2][64], msg[1024];
	bool specific[2];
	int calls = 0;

	setenv("DRAGON_TUNE_DB", db, 1);
	dg_tune_opts o = { .budget_s = 300, .rows = 1024, .check_rows = 32, .warmup = 1,
			   .reps = 5, .max_candidates = 4, .progress = on_progress,
			   .user = &calls };
	for (int i = 0; i < 2; i++) {
		dg_spec s;
		dg_tune_record *r = NULL;
		cr_assert_eq(dg_spec_parse(SPECS[i], &s, msg, sizeof(msg)), DG_OK, "%s", msg);
		cr_assert_eq(dg_tune_sweep(dev, &s, &o, &r), DG_OK, "%s: %s", SPECS[i],
			     dg_device_errmsg(dev));
		cr_assert_leq(r->n_cands, 4);
		cr_assert_geq(r->n_cands, 2);
		size_t timed = 0;
		for (size_t k = 0; k < r->n_cands; k++) {
			const dg_tune_cand *c = &r->cands[k];
			char t[64];
			dg_tile_to_string(&c->tile, t, sizeof(t));
			if (c->state == DG_TUNE_TIMED) {
				timed++;
				cr_assert_gt(c->median_us, 0, "%s", t);
				cr_assert_leq(c->p10_us, c->median_us);
				cr_assert_leq(c->median_us, c->p90_us);
				cr_assert_eq(c->reps, 5);
				cr_assert_gt(c->threads, 0);
			} else {
				cr_assert(c->reason[0], "%s: state %d without a reason", t, c->state);
				fprintf(stderr, "%s %s: %s\n", dg_op_name(s.op), t, c->reason);
			}
		}
		cr_assert_gt(timed, 0, "%s: nothing timed", SPECS[i]);
		cr_assert_geq(r->winner, 0);
		cr_assert_eq(r->winner, dg_tune_choose(r->cands, r->n_cands, r->tie_band));
		dg_device_info info;
		cr_assert_eq(dg_device_info_get(dev, &info), DG_OK);
		cr_assert_str_eq(r->device.name, info.name);
		cr_assert_eq(r->device.sm, info.sm);
		dg_tile_to_string(&r->cands[r->winner].tile, tiles[i], sizeof(tiles[i]));
		specific[i] = r->cands[r->winner].arch_specific;

		char name[256];
		dg_tune_record_file_name(r, name, sizeof(name));
		snprintf(paths[i], sizeof(paths[i]), "%s/%s", db, name);
		cr_assert_eq(dg_tune_record_save(r, paths[i], msg, sizeof(msg)), DG_OK, "%s", msg);
		dg_tune_record *back = NULL;
		cr_assert_eq(dg_tune_record_load(paths[i], &back, msg, sizeof(msg)), DG_OK, "%s", msg);
		cr_assert_eq(back->winner, r->winner);
		dg_tune_record_destroy(back);
		dg_tune_record_destroy(r);
	}
	cr_assert_gt(calls, 0, "no progress reported");
	gh_close(dev);

	/* a fresh device reads the DB anew and runs the tuned tiles */
	dev = gh_open();
	for (int i = 0; i < 2; i++) {
		dg_spec s;
		dg_tune_choice ch;
		char t[64];
		cr_assert_eq(dg_spec_parse(SPECS[i], &s, msg, sizeof(msg)), DG_OK, "%s", msg);
		cr_assert_eq(dg_device_tile_choice(dev, &s, &ch), DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert(ch.tuned, "%s: %s", SPECS[i], ch.why);
		cr_assert_str_eq(ch.record, paths[i]);
		dg_tile_to_string(&ch.spec.tile, t, sizeof(t));
		cr_assert_str_eq(t, tiles[i]);
		cr_assert_eq(ch.spec.arch_specific, specific[i]);

		dg_kernel *k = NULL;
		dg_kernel_info info;
		cr_assert_eq(dg_kernel_get(dev, &s, NULL, &k), DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(dg_kernel_info_get(k, &info), DG_OK);
		char want[80];
		snprintf(want, sizeof(want), "tile=%s;", tiles[i]);
		cr_assert(strstr(info.canonical, want), "%s runs %s, want %s", SPECS[i],
			  info.canonical, want);
		cr_assert(strstr(info.canonical, specific[i] ? "arch=sm_90a;" : "arch=sm_"),
			  "%s", info.canonical);
	}
	gh_close(dev);
	unsetenv("DRAGON_TUNE_DB");
	dg_test_rmtree(db);
}

/* Events time what is between them. */
Test(gpu_tune, events)
{
	dg_device *dev = gh_open();
	dg_event *a = NULL, *b = NULL;
	float ms = -1;
	dg_dptr p = gh_alloc(dev, (size_t)64 << 20);

	cr_assert_eq(dg_event_create(dev, &a), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_event_create(dev, &b), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_event_record(a), DG_OK);
	cr_assert_eq(dg_memset8(dev, p, 7, (size_t)64 << 20), DG_OK);
	cr_assert_eq(dg_event_record(b), DG_OK);
	cr_assert_eq(dg_event_synchronize(b), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_event_elapsed_ms(a, b, &ms), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert(ms > 0 && ms < 1000, "%g ms", (double)ms);
	cr_assert_eq(dg_event_elapsed_ms(a, b, NULL), DG_ERR_INVALID_ARG);
	dg_event_destroy(a);
	dg_event_destroy(b);
	dg_event_destroy(NULL);
	gh_close(dev);
}

typedef struct timed {
	dg_device *dev;
	dg_dptr p;
	size_t bytes;
	int calls;
	int fail_at; /* the call that fails (0: none) */
} timed;

static dg_status timed_memset(void *user)
{
	timed *t = user;
	if (++t->calls == t->fail_at)
		return DG_ERR_INVALID_ARG;
	return dg_memset8(t->dev, t->p, (uint8_t)t->calls, t->bytes);
}

/* The timer: warm-up calls then reps, each timed alone with its L2 flushed;
 * ordered quantiles; a bigger call takes longer; a failing call's status
 * comes back as it is; more reps than the timer holds is refused. */
Test(gpu_tune, timer)
{
	dg_device *dev = gh_open();
	dg_device_info info;
	dg_timer *tm = NULL;
	cr_assert_eq(dg_device_info_get(dev, &info), DG_OK);
	cr_assert_eq(dg_timer_create(dev, 20, &tm), DG_OK, "%s", dg_device_errmsg(dev));
	size_t flush = dg_timer_flush_bytes(tm);
	cr_assert_geq(flush, (size_t)256 << 20);
	cr_assert_geq(flush, (size_t)info.l2_bytes * 4);

	timed small = { dev, gh_alloc(dev, (size_t)64 << 20), (size_t)1 << 20, 0, 0 };
	timed big = { dev, small.p, (size_t)64 << 20, 0, 0 };
	dg_timer_opts o = { .warmup = 2, .reps = 15 };
	dg_timing a, b;
	cr_assert_eq(dg_timer_run(tm, &o, timed_memset, &small, &a), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(small.calls, 17, "2 warm-up calls and 15 reps");
	cr_assert_eq(a.reps, 15);
	cr_assert(a.min_us > 0 && a.min_us <= a.p10_us && a.p10_us <= a.median_us &&
		  a.median_us <= a.p90_us, "min %g p10 %g median %g p90 %g", a.min_us, a.p10_us,
		  a.median_us, a.p90_us);
	cr_assert_eq(dg_timer_run(tm, &o, timed_memset, &big, &b), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_gt(b.median_us, a.median_us, "64 MiB in %g us, 1 MiB in %g us", b.median_us,
		     a.median_us);

	timed bad = { dev, small.p, 4096, 0, 5 };
	cr_assert_eq(dg_timer_run(tm, &o, timed_memset, &bad, &a), DG_ERR_INVALID_ARG);
	cr_assert_eq(bad.calls, 5, "the timer stops at the failing call");
	o.reps = 21;
	cr_assert_eq(dg_timer_run(tm, &o, timed_memset, &small, &a), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "21 reps"), "%s", dg_device_errmsg(dev));
	dg_timer_destroy(tm);
	dg_timer_destroy(NULL);
	gh_close(dev);
}
