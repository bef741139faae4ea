/*
 * Tuning records and the tuning DB (runtime/tunedb/record.c, runtime/tunedb/db.c),
 * no GPU needed:
 *   - a record survives to_json → parse unchanged, and save → load;
 *   - malformed input (truncated, not JSON, empty, wrong types, unknown
 *     op, a winner that names no timed candidate, a non-canonical spec)
 *     is refused with a message naming the file and the field;
 *   - the DB skips bad files and records of another device without
 *     failing, merges two machines' records (newest date wins), serves
 *     the built-in H200 records below the user's (a user record of a key
 *     wins whatever its date; "builtin" keeps only them, "none" none),
 *     and resolve plans what runs and says why it used the template's
 *     default when it did.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/autotune.h"
#include "dragon/tune.h"
#include "helpers.h"
#include "runtime/tunedb/choose.h"

#define SPEC_LR "op=lowrank_fwd;weight=ternary;act=int8;out=int8;relu=0"
#define DEV "NVIDIA H200"

/* A record of spec text with candidates tiles[] (all timed, medians[]),
 * the winner chosen by the chooser. Caller destroys. */
static dg_tune_record *make(const char *spec_text, const char *device, int sm,
			    const char *date, const char *const *tiles,
			    const double *medians, size_t n)
{
	dg_tune_record *r = calloc(1, sizeof(*r));
	char msg[256];

	cr_assert_not_null(r);
	cr_assert_eq(dg_spec_parse(spec_text, &r->spec, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_spec_to_string(&r->spec, r->spec_text, sizeof(r->spec_text));
	snprintf(r->device.name, sizeof(r->device.name), "%s", device);
	r->device.sm = sm;
	r->device.sm_count = 132;
	r->device.driver_version = 13000;
	snprintf(r->device.nvrtc_version, sizeof(r->device.nvrtc_version), "13.0");
	snprintf(r->generator_version, sizeof(r->generator_version), "0.1.0");
	snprintf(r->date, sizeof(r->date), "%s", date);
	r->rows = 4096;
	r->check_rows = 64;
	r->warmup = 3;
	r->reps = 25;
	r->tie_band = 0.02;
	r->budget_s = 60;
	r->elapsed_s = 12.5;
	r->cands = calloc(n + 1, sizeof(*r->cands));
	r->n_cands = n;
	for (size_t i = 0; i < n; i++) {
		dg_spec s = r->spec;
		cr_assert_eq(dg_spec_set(&s, "tile", tiles[i], msg, sizeof(msg)), DG_OK, "%s", msg);
		r->cands[i].tile = s.tile;
		if (medians[i] < 0) {
			r->cands[i].state = DG_TUNE_REJECTED;
			snprintf(r->cands[i].reason, sizeof(r->cands[i].reason),
				 "needs 300000 bytes of shared memory");
			continue;
		}
		r->cands[i].state = DG_TUNE_TIMED;
		r->cands[i].median_us = medians[i];
		r->cands[i].p10_us = medians[i] * 0.99;
		r->cands[i].p90_us = medians[i] * 1.02;
		r->cands[i].reps = 25;
		r->cands[i].threads = r->cands[i].tile.wm * r->cands[i].tile.wn * 32;
		r->cands[i].smem = 1000 * (int)(i + 1);
		r->cands[i].regs = 96;
	}
	r->winner = dg_tune_choose(r->cands, n, r->tie_band);
	return r;
}

static char *to_json(const dg_tune_record *r)
{
	char *text = NULL, msg[256];
	cr_assert_eq(dg_tune_record_to_json(r, &text, msg, sizeof(msg)), DG_OK, "%s", msg);
	return text;
}

static void save(const dg_tune_record *r, const char *dir, const char *name)
{
	char path[1024], msg[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	cr_assert_eq(dg_tune_record_save(r, path, msg, sizeof(msg)), DG_OK, "%s", msg);
}

static const char *const TILES[3] = { "64x64x64/2x2/2", "64x128x64/2x2/2", "128x128x64/2x4/4" };

Test(tune_record, round_trip)
{
	const double med[3] = { 300.0, 250.0, -1 };
	dg_tune_record *r = make(SPEC_LR, DEV, 90, "2026-12-01T10:00:00Z", TILES, med, 3);
	r->cands[1].arch_specific = true;
	r->winner = 1;
	char *text = to_json(r);
	dg_tune_record *back = NULL;
	char msg[512];

	cr_assert_eq(dg_tune_record_parse(text, strlen(text), "mem", &back, msg, sizeof(msg)),
		     DG_OK, "%s\n%s", msg, text);
	cr_assert_str_eq(back->spec_text, r->spec_text);
	cr_assert(strstr(back->spec_text, "tile=auto"), "%s", back->spec_text);
	cr_assert_str_eq(back->device.name, DEV);
	cr_assert_eq(back->device.sm, 90);
	cr_assert_eq(back->device.sm_count, 132);
	cr_assert_str_eq(back->date, r->date);
	cr_assert_eq(back->n_cands, 3);
	cr_assert_eq(back->winner, 1);
	cr_assert(back->cands[1].arch_specific);
	cr_assert(!back->cands[0].arch_specific);
	cr_assert_eq(memcmp(&back->cands[2].tile, &r->cands[2].tile, sizeof(dg_tile)), 0);
	cr_assert_eq(back->cands[2].state, DG_TUNE_REJECTED);
	cr_assert_str_eq(back->cands[2].reason, r->cands[2].reason);
	cr_assert_float_eq(back->cands[0].median_us, 300.0, 1e-9);
	cr_assert_float_eq(back->cands[1].p90_us, r->cands[1].p90_us, 1e-9);
	cr_assert_eq(back->cands[0].reps, 25);
	cr_assert_eq(back->cands[1].smem, 2000);
	cr_assert_eq(back->rows, 4096);
	cr_assert(strstr(text, "\"arch\":\t\"sm_90a\""), "%s", text);
	/* text → record → text is a fixed point */
	char *again = to_json(back);
	cr_assert_str_eq(again, text);

	/* save → load, with the path kept */
	char *dir = dg_test_tmpdir();
	save(r, dir, "x.json");
	dg_tune_record *loaded = NULL;
	char path[1024];
	snprintf(path, sizeof(path), "%s/x.json", dir);
	cr_assert_eq(dg_tune_record_load(path, &loaded, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_str_eq(loaded->path, path);
	cr_assert_eq(loaded->winner, 1);
	char name[256];
	dg_tune_record_file_name(loaded, name, sizeof(name));
	cr_assert(strncmp(name, "lowrank_fwd-", 12) == 0, "%s", name);
	cr_assert(strstr(name, "-nvidia-h200-sm90.json"), "%s", name);
	dg_tune_record_destroy(loaded);
	dg_test_rmtree(dir);
	free(again);
	free(text);
	dg_tune_record_destroy(back);
	dg_tune_record_destroy(r);
}

/* Parses text after replacing the first `from` with `to`; expects
 * DG_ERR_PARSE and every word of want in the message. */
static void expect_bad(const char *text, const char *from, const char *to, const char *want)
{
	char buf[65536], msg[1024];
	const char *at = from ? strstr(text, from) : NULL;

	if (from)
		cr_assert_not_null(at, "'%s' not in the record", from);
	if (at)
		snprintf(buf, sizeof(buf), "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
	else
		snprintf(buf, sizeof(buf), "%s", to);
	dg_tune_record *r = NULL;
	dg_status st = dg_tune_record_parse(buf, strlen(buf), "db/rec.json", &r, msg, sizeof(msg));
	cr_expect_eq(st, DG_ERR_PARSE, "accepted (%s → %s): %s", from ? from : "", to, buf);
	cr_expect_null(r);
	cr_expect(strncmp(msg, "db/rec.json: ", 13) == 0, "message does not name the file: %s", msg);
	cr_expect(strstr(msg, want), "message '%s' lacks '%s'", msg, want);
	dg_tune_record_destroy(r);
}

Test(tune_record, malformed_is_refused_by_field)
{
	const double med[3] = { 300.0, 250.0, 400.0 };
	dg_tune_record *r = make(SPEC_LR, DEV, 90, "2026-12-01T10:00:00Z", TILES, med, 3);
	char *text = to_json(r);
	char half[65536];

	snprintf(half, sizeof(half), "%.*s", (int)(strlen(text) / 2), text);
	expect_bad(half, NULL, half, "truncated");
	expect_bad(text, NULL, "", "empty");
	expect_bad(text, NULL, "hello, world", "not valid JSON");
	expect_bad(text, NULL, "[1, 2]", "expected a JSON object");
	expect_bad(text, "\"format\":\t1", "\"format\":\t2", "format");
	expect_bad(text, "op=lowrank_fwd", "op=lowrank_frob", "spec");
	expect_bad(text, "op=lowrank_fwd", "op=lowrank_frob", "lowrank_frob");
	expect_bad(text, "\"sm\":\t90", "\"sm\":\t\"90\"", "device.sm: expected an integer");
	expect_bad(text, "\"sm\":\t90", "\"sm\":\t90.5", "device.sm");
	expect_bad(text, "\"name\":\t\"NVIDIA H200\"", "\"nome\":\t\"x\"", "device.name: missing");
	expect_bad(text, "\"median_us\":\t300", "\"median_us\":\t\"fast\"",
		   "candidates[0].median_us: expected a number");
	expect_bad(text, "\"state\":\t\"timed\"", "\"state\":\t\"great\"", "candidates[0].state");
	expect_bad(text, "\"tile\":\t\"64x64x64/2x2/2\"", "\"tile\":\t\"t256\"",
		   "candidates[0].tile");
	expect_bad(text, "\"arch\":\t\"sm_90\"", "\"arch\":\t\"sm_80\"", "candidates[0].arch");
	expect_bad(text, "\"date\":\t\"2026-12-01T10:00:00Z\"", "\"date\":\t\"yesterday\"", "date");
	expect_bad(text, "\"budget_exhausted\":\tfalse", "\"budget_exhausted\":\t0",
		   "budget_exhausted");
	expect_bad(text, "\"candidates\":\t[", "\"candidates\":\t\"many\",\n\t\"more\":\t[",
		   "candidates: expected an array");
	expect_bad(text, "\"winner\":\t{\n\t\t\"tile\":\t\"64x128x64/2x2/2\"",
		   "\"winner\":\t{\n\t\t\"tile\":\t\"128x64x64/2x2/2\"", "winner");
	/* the spec's keys out of order: not canonical */
	expect_bad(text, "\"spec\":\t\"act=int8;arch=sm_90;", "\"spec\":\t\"arch=sm_90;act=int8;",
		   "canonical");
	/* a spec with a tile */
	expect_bad(text, "tile=auto", "tile=64x64x64/2x2/2", "tile=auto");
	free(text);
	dg_tune_record_destroy(r);
}

Test(tune_record, to_json_refuses_a_bad_winner)
{
	const double med[1] = { 1.0 };
	dg_tune_record *r = make(SPEC_LR, DEV, 90, "2026-12-01T10:00:00Z", TILES, med, 1);
	char *text = NULL, msg[256];
	r->winner = 3;
	cr_assert_eq(dg_tune_record_to_json(r, &text, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_null(text);
	cr_assert(strstr(msg, "winner"), "%s", msg);
	dg_tune_record_destroy(r);
}

/* ---- the DB ------------------------------------------------------------------ */

/* dg_tune_resolve, which fails only when the spec cannot be planned. */
static void resolve(dg_codegen *cg, const dg_tune_db *db, const dg_spec *s, const char *device,
		    int sm, dg_tune_choice *ch)
{
	cr_assert_eq(dg_tune_resolve(cg, db, s, device, sm, ch), DG_OK, "%s", dg_codegen_errmsg(cg));
	/* what runs is its plan's spec */
	cr_assert(dg_spec_equal(&ch->spec, &ch->plan.spec));
	char c[DG_SPEC_TEXT_MAX];
	cr_assert_eq(dg_spec_to_string(&ch->spec, c, sizeof(c)), DG_OK);
	cr_assert_str_eq(c, ch->plan.canonical);
	cr_assert_not(dg_tile_is_auto(&ch->spec.tile));
}

/* SPEC_LR resolves (on DEV, sm 90) to the tuned record of the file named
 * record, dated date, tile 64x64x64/2x2/2; its choice. */
static dg_tune_choice expect_tuned_lr(dg_codegen *cg, const dg_tune_db *db, const char *record, const char *date)
{
	dg_spec s = dg_test_spec_parse(SPEC_LR);
	dg_tune_choice ch;
	resolve(cg, db, &s, DEV, 90, &ch);
	cr_assert(ch.tuned, "%s", ch.why);
	cr_assert(strstr(ch.record, record), "%s", ch.record);
	cr_assert_str_eq(ch.date, date);
	char tile[64];
	dg_tile_to_string(&ch.spec.tile, tile, sizeof(tile));
	cr_assert_str_eq(tile, "64x64x64/2x2/2");
	return ch;
}

/* Records built into the library for the H200 (the BDH set). */
#define N_BUILTIN 13

Test(tune_db, lookup_merge_and_fallback)
{
	char *dir = dg_test_tmpdir();
	const double a[2] = { 300.0, 200.0 }; /* machine A: 64x128 wins */
	const double b[2] = { 100.0, 200.0 }; /* machine B, newer: 64x64 wins */
	dg_tune_record *ra = make(SPEC_LR, DEV, 90, "2026-12-01T10:00:00Z", TILES, a, 2);
	dg_tune_record *rb = make(SPEC_LR, DEV, 90, "2026-12-02T09:00:00Z", TILES, b, 2);
	dg_tune_record *other = make(SPEC_LR, "NVIDIA A100", 80, "2026-12-03T00:00:00Z", TILES, a, 2);
	cr_assert_eq(ra->winner, 1);
	cr_assert_eq(rb->winner, 0);
	save(ra, dir, "a.json");
	save(rb, dir, "b.json");
	save(other, dir, "other.json");
	/* junk that must be skipped, not fatal */
	dg_test_write_file(dir, "empty.json", "");
	dg_test_write_file(dir, "junk.json", "{ \"format\": 1, \"spec\": ");
	dg_test_write_file(dir, "notjson.json", "tile=64x64");
	dg_test_write_file(dir, "types.json", "{\"format\": \"one\"}");
	dg_test_write_file(dir, "readme.txt", "not a record");

	dg_codegen *cg = dg_test_codegen();
	dg_tune_db *db = NULL;
	dg_tune_db_opts o = { .path = dir, .device = DEV, .sm = 90 };
	cr_assert_eq(dg_tune_db_open(&db, &o), DG_OK);
	/* A and B share one key, which also has a built-in record: the
	 * user's win, the other built-in ones stay */
	cr_assert_eq(dg_tune_db_size(db), N_BUILTIN, "%zu", dg_tune_db_size(db));
	cr_assert_eq(dg_tune_db_n_builtin(db), N_BUILTIN - 1);
	cr_assert_eq(dg_tune_db_n_other_device(db), 1);
	cr_assert_eq(dg_tune_db_n_problems(db), 4);
	bool saw_empty = false, saw_types = false;
	for (size_t i = 0; i < dg_tune_db_n_problems(db); i++) {
		const char *p = dg_tune_db_problem(db, i);
		saw_empty |= strstr(p, "empty.json") && strstr(p, "empty");
		saw_types |= strstr(p, "types.json") && strstr(p, "format");
	}
	cr_assert(saw_empty && saw_types);

	/* the newest record wins: B's 64x64 */
	dg_tune_choice ch = expect_tuned_lr(cg, db, "b.json", "2026-12-02T09:00:00Z");
	dg_spec s = dg_test_spec_parse(SPEC_LR);

	/* another spec: the heuristic, saying why */
	dg_spec s2 = dg_test_spec_parse("op=lowrank_fwd;weight=int8;act=int8;out=bf16");
	resolve(cg, db, &s2, DEV, 90, &ch);
	cr_assert(!ch.tuned);
	cr_assert(strstr(ch.why, "no record for " DEV " (sm_90)"), "%s", ch.why);
	dg_plan want;
	cr_assert_eq(dg_codegen_plan_for(cg, &s2, 90, &want), DG_OK);
	cr_assert(dg_spec_equal(&ch.spec, &want.spec), "%s", want.canonical);

	/* an explicit tile is kept */
	dg_spec s3 = dg_test_spec_parse(SPEC_LR ";tile=128x128x64/2x4/4");
	resolve(cg, db, &s3, DEV, 90, &ch);
	cr_assert(!ch.tuned);
	cr_assert(dg_spec_equal(&ch.spec, &s3));
	cr_assert(strstr(ch.why, "names its tile"), "%s", ch.why);

	/* a spec the template cannot plan fails, with the template's message */
	dg_spec bad = dg_test_spec_parse(SPEC_LR ";tile=48x64x64/2x2/2");
	cr_assert_eq(dg_tune_resolve(cg, db, &bad, DEV, 90, &ch), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_codegen_errmsg(cg), "BM and BN must be powers of two"), "%s",
		  dg_codegen_errmsg(cg));

	/* no DB at all */
	resolve(cg, NULL, &s, DEV, 90, &ch);
	cr_assert(!ch.tuned);
	cr_assert(strstr(ch.why, "no tuning DB"), "%s", ch.why);
	dg_tune_db_close(db);

	/* the same folder opened for the other device: its record only (the
	 * H200's built-in ones count as another device's) */
	dg_tune_db_opts o2 = { .path = dir, .device = "NVIDIA A100", .sm = 80 };
	cr_assert_eq(dg_tune_db_open(&db, &o2), DG_OK);
	cr_assert_eq(dg_tune_db_size(db), 1);
	cr_assert_eq(dg_tune_db_n_builtin(db), 0);
	cr_assert_eq(dg_tune_db_n_other_device(db), 2 + N_BUILTIN);
	resolve(cg, db, &s, DEV, 90, &ch);
	cr_assert(!ch.tuned, "a record of another device must not be used");
	dg_tune_db_close(db);

	/* unfiltered: two devices */
	dg_tune_db_opts o3 = { .path = dir };
	cr_assert_eq(dg_tune_db_open(&db, &o3), DG_OK);
	cr_assert_eq(dg_tune_db_devices(db, NULL, 0), 2);
	dg_tune_db_close(db);
	dg_codegen_destroy(cg);

	dg_tune_record_destroy(ra);
	dg_tune_record_destroy(rb);
	dg_tune_record_destroy(other);
	dg_test_rmtree(dir);
}

Test(tune_db, merge_is_independent_of_order_and_env_path_list)
{
	char *d1 = dg_test_tmpdir(), *d2 = dg_test_tmpdir();
	const double a[2] = { 300.0, 200.0 }, b[2] = { 100.0, 200.0 };
	/* the newer one in the folder listed first */
	dg_tune_record *ra = make(SPEC_LR, DEV, 90, "2026-12-05T00:00:00Z", TILES, a, 2);
	dg_tune_record *rb = make(SPEC_LR, DEV, 90, "2026-12-01T00:00:00Z", TILES, b, 2);
	save(ra, d1, "z.json");
	save(rb, d2, "a.json");
	char list[2048];
	snprintf(list, sizeof(list), "%s:%s", d1, d2);
	setenv("DRAGON_TUNE_DB", list, 1);
	dg_codegen *cg = dg_test_codegen();
	dg_tune_db *db = NULL;
	dg_tune_db_opts o = { .device = DEV, .sm = 90 };
	cr_assert_eq(dg_tune_db_open(&db, &o), DG_OK);
	cr_assert_str_eq(dg_tune_db_where(db), list);
	dg_spec s = dg_test_spec_parse(SPEC_LR);
	dg_tune_choice ch;
	resolve(cg, db, &s, DEV, 90, &ch);
	cr_assert(ch.tuned);
	cr_assert_str_eq(ch.date, "2026-12-05T00:00:00Z");
	dg_tune_db_close(db);

	/* "none" turns the DB off, built-in records included */
	setenv("DRAGON_TUNE_DB", "none", 1);
	cr_assert_eq(dg_tune_db_open(&db, &o), DG_OK);
	cr_assert_eq(dg_tune_db_size(db), 0);
	cr_assert_eq(dg_tune_db_n_builtin(db), 0);
	cr_assert_str_eq(dg_tune_db_where(db), "none");
	resolve(cg, db, &s, DEV, 90, &ch);
	cr_assert(!ch.tuned);
	cr_assert(strstr(ch.why, "no tuning DB"), "%s", ch.why);
	dg_tune_db_close(db);
	unsetenv("DRAGON_TUNE_DB");

	/* a missing folder is an empty folder, not an error: the built-in
	 * records alone */
	dg_tune_db_opts miss = { .path = "/nonexistent/dragon/tune" };
	cr_assert_eq(dg_tune_db_open(&db, &miss), DG_OK);
	cr_assert_eq(dg_tune_db_size(db), N_BUILTIN);
	cr_assert_eq(dg_tune_db_n_builtin(db), N_BUILTIN);
	cr_assert_eq(dg_tune_db_n_problems(db), 0);
	dg_tune_db_close(db);
	dg_codegen_destroy(cg);

	dg_tune_record_destroy(ra);
	dg_tune_record_destroy(rb);
	dg_test_rmtree(d1);
	dg_test_rmtree(d2);
}

Test(tune_db, stale_or_empty_winners_fall_back_with_a_reason)
{
	char *dir = dg_test_tmpdir();
	const double none[2] = { -1, -1 };
	dg_tune_record *r = make(SPEC_LR, DEV, 90, "2026-12-01T10:00:00Z", TILES, none, 2);
	cr_assert_eq(r->winner, -1);
	save(r, dir, "r.json");
	dg_codegen *cg = dg_test_codegen();
	dg_tune_db *db = NULL;
	dg_tune_db_opts o = { .path = dir, .device = DEV, .sm = 90 };
	cr_assert_eq(dg_tune_db_open(&db, &o), DG_OK);
	dg_spec s = dg_test_spec_parse(SPEC_LR);
	dg_tune_choice ch;
	resolve(cg, db, &s, DEV, 90, &ch);
	cr_assert(!ch.tuned);
	cr_assert(strstr(ch.why, "no winner"), "%s", ch.why);
	dg_tune_db_close(db);

	/* a winner its template no longer plans */
	const char *tiles[1] = { "48x64x64/2x2/2" };
	const double med[1] = { 10.0 };
	dg_tune_record *st = make(SPEC_LR, DEV, 90, "2026-12-01T10:00:00Z", tiles, med, 1);
	save(st, dir, "r.json");
	cr_assert_eq(dg_tune_db_open(&db, &o), DG_OK);
	resolve(cg, db, &s, DEV, 90, &ch);
	cr_assert(!ch.tuned);
	cr_assert(strstr(ch.why, "no longer valid") && strstr(ch.why, "BM and BN"), "%s", ch.why);
	dg_tune_db_close(db);
	dg_tune_record_destroy(st);

	/* without a DB the element-wise ops get their default threads too */
	dg_spec q = dg_test_spec_parse("op=quantize_act");
	resolve(cg, NULL, &q, DEV, 90, &ch);
	cr_assert(!ch.tuned);
	cr_assert(strstr(ch.why, "no tuning DB"), "%s", ch.why);
	cr_assert_eq(ch.spec.tile.threads, 256);
	dg_tune_record_destroy(r);
	dg_codegen_destroy(cg);
	dg_test_rmtree(dir);
}

/* The records built into the library: the H200's BDH set. */
Test(tune_db, builtin_records)
{
	dg_codegen *cg = dg_test_codegen();
	dg_tune_db *db = NULL;
	dg_tune_db_opts o = { .path = "builtin", .device = DEV, .sm = 90 };
	cr_assert_eq(dg_tune_db_open(&db, &o), DG_OK);
	cr_assert_eq(dg_tune_db_size(db), N_BUILTIN);
	cr_assert_eq(dg_tune_db_n_builtin(db), N_BUILTIN);
	cr_assert_eq(dg_tune_db_n_problems(db), 0, "%s", dg_tune_db_problem(db, 0));
	cr_assert_eq(dg_tune_db_n_other_device(db), 0);
	dg_tune_device dv[4];
	cr_assert_eq(dg_tune_db_devices(db, dv, 4), 1);
	cr_assert_str_eq(dv[0].name, DEV);
	cr_assert_eq(dv[0].sm, 90);

	/* the projection of the BDH step: the warpgroup tile on sm_90a */
	dg_spec s = dg_test_spec_parse("op=lowrank_fwd;weight=ternary;act=int8;out=int8;relu=0");
	dg_tune_choice ch;
	resolve(cg, db, &s, DEV, 90, &ch);
	cr_assert(ch.tuned, "%s", ch.why);
	char tile[64];
	dg_tile_to_string(&ch.spec.tile, tile, sizeof(tile));
	cr_assert_str_eq(tile, "128x64x64/8x1/2");
	cr_assert(ch.spec.arch_specific);
	cr_assert_eq(ch.spec.arch, 90);
	cr_assert(strstr(ch.plan.canonical, "arch=sm_90a;"), "%s", ch.plan.canonical);
	cr_assert(strncmp(ch.record, "built-in:lowrank_fwd-", 21) == 0, "%s", ch.record);
	/* every spec of the BDH set has its tuned tile, and it plans */
	dg_spec set[32];
	size_t n = dg_tune_bdh_set(set, 32);
	for (size_t i = 0; i < n; i++) {
		resolve(cg, db, &set[i], DEV, 90, &ch);
		cr_assert(ch.tuned, "%s: %s", dg_op_name(set[i].op), ch.why);
	}
	/* another device: none of them */
	resolve(cg, db, &s, "NVIDIA A100", 80, &ch);
	cr_assert(!ch.tuned);
	dg_tune_db_close(db);

	/* unfiltered, and "builtin" keeps the user's folder out */
	dg_tune_db_opts all = { .path = "builtin" };
	cr_assert_eq(dg_tune_db_open(&db, &all), DG_OK);
	cr_assert_eq(dg_tune_db_size(db), N_BUILTIN);
	cr_assert_str_eq(dg_tune_db_where(db), "builtin");
	dg_tune_db_close(db);

	/* "none": no records at all */
	dg_tune_db_opts none = { .path = "none", .device = DEV, .sm = 90 };
	cr_assert_eq(dg_tune_db_open(&db, &none), DG_OK);
	cr_assert_eq(dg_tune_db_size(db), 0);
	cr_assert_eq(dg_tune_db_n_builtin(db), 0);
	resolve(cg, db, &s, DEV, 90, &ch);
	cr_assert(!ch.tuned);
	/* without a record: the template's default on the device, which on
	 * sm_90 is the sm_90a warpgroup path too (dg_codegen_plan_for) */
	dg_plan want;
	cr_assert_eq(dg_codegen_plan_for(cg, &s, 90, &want), DG_OK);
	cr_assert_str_eq(ch.plan.canonical, want.canonical);
	dg_tune_db_close(db);
	dg_codegen_destroy(cg);
}

/* A user's record of a key wins over the built-in one, even an older one. */
Test(tune_db, a_user_record_wins_over_a_builtin_one)
{
	char *dir = dg_test_tmpdir();
	const char *tiles[2] = { "64x64x64/2x2/2", "128x128x64/2x4/4" };
	const double med[2] = { 100.0, 200.0 };
	dg_tune_record *r = make(SPEC_LR, DEV, 90, "2000-01-01T00:00:00Z", tiles, med, 2);
	save(r, dir, "old.json");
	dg_codegen *cg = dg_test_codegen();
	dg_tune_db *db = NULL;
	dg_tune_db_opts o = { .path = dir, .device = DEV, .sm = 90 };
	cr_assert_eq(dg_tune_db_open(&db, &o), DG_OK);
	cr_assert_eq(dg_tune_db_size(db), N_BUILTIN);
	cr_assert_eq(dg_tune_db_n_builtin(db), N_BUILTIN - 1);
	dg_tune_choice ch = expect_tuned_lr(cg, db, "old.json", "2000-01-01T00:00:00Z");
	cr_assert_not(ch.spec.arch_specific);
	/* the other keys still have their built-in records */
	dg_spec d = dg_test_spec_parse("op=decoder_fwd;weight=int8;act=int8;out=bf16");
	resolve(cg, db, &d, DEV, 90, &ch);
	cr_assert(ch.tuned, "%s", ch.why);
	cr_assert(strncmp(ch.record, "built-in:", 9) == 0, "%s", ch.record);
	dg_tune_db_close(db);
	dg_codegen_destroy(cg);
	dg_tune_record_destroy(r);
	dg_test_rmtree(dir);
}
