/*
 * The attention's form as a record of the tuning DB
 * (runtime/tunedb/form.c, runtime/tunedb/db.c), no GPU needed:
 *   - a record made from measured rows names the chunked form from the
 *     smallest T at which it wins there and at every larger T, its chunk
 *     by T, and reads back through the DB: the chunk at any T (below the
 *     crossover the quadratic form; a chunk that does not divide T the
 *     largest multiple of 64 below it that does);
 *   - a record whose quadratic form wins at the largest T names none;
 *   - malformed records are skipped with a message naming the file and
 *     the field, records of another device or shape are not used;
 *   - the step's kernels listed ahead of the model (dg__gm_step_specs,
 *     what model creation compiles at once) take the record's form, so
 *     the kernels compiled first are the ones the step runs.
 * (No record is built in yet: bench/attention --form both --record makes
 * one on a device, into runtime/tunedb/records/.)
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/tune.h"
#include "helpers.h"
#include "runtime/train/gpu_model_int.h"
#include "runtime/tunedb/form.h"

#define DEV "NVIDIA H200"

static dg_tune_db *open_db(const char *path, const char *device, int sm)
{
	dg_tune_db *db = NULL;
	dg_tune_db_opts o;
	memset(&o, 0, sizeof(o));
	o.path = path;
	o.device = device;
	o.sm = sm;
	cr_assert_eq(dg_tune_db_open(&db, &o), DG_OK);
	return db;
}

/* The chunk the DB gives the 25M shape at T (-1: no record). */
static int chunk_at(const dg_tune_db *db, int t)
{
	int c = -1;
	if (!dg__tune_db_attn_chunk(db, DEV, 90, 4, 8192, 256, DG_FMT_BF16, t, &c, NULL))
		return -1;
	return c;
}

Test(tune_form, measured_rows_make_the_choice_the_db_serves)
{
	/* the quadratic form wins to T 4096, loses from 8192 on; at 65536
	 * only the chunked form ran (the quadratic one did not fit) */
	const dg__attn_form_row rows[] = {
		{ 1, 16384, 256, 71.0, 19.1 }, { 8, 512, 256, 1.31, 4.25 }, { 1, 4096, 256, 4.50, 4.77 },
		{ 1, 8192, 256, 18.2, 9.6 },   { 1, 32768, 512, 280.0, 33.0 }, { 1, 65536, 512, 0, 64.2 },
		{ 2, 2048, 256, 2.64, 4.70 },
	};
	char *text = dg__attn_form_make(DEV, 90, 4, 8192, 256, DG_FMT_BF16, "2026-12-05",
					rows, (int)(sizeof(rows) / sizeof(rows[0])));
	cr_assert_not_null(text);
	dg__attn_form f;
	char msg[512];
	cr_assert_eq(dg__attn_form_parse(text, strlen(text), "made", &f, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(f.n, 2);
	cr_assert(f.from_t[0] == 8192 && f.chunk[0] == 256 && f.from_t[1] == 32768 && f.chunk[1] == 512);
	free(f.path);

	char *dir = dg_test_tmpdir();
	dg_test_write_file(dir, "attention_form-25m-nvidia-h200-sm90.json", text);
	dg_tune_db *db = open_db(dir, DEV, 90);
	cr_assert_eq(dg_tune_db_n_problems(db), 0, "%s", dg_tune_db_problem(db, 0));
	cr_assert_eq(chunk_at(db, 512), 0);
	cr_assert_eq(chunk_at(db, 4096), 0);
	cr_assert_eq(chunk_at(db, 8192), 256);
	cr_assert_eq(chunk_at(db, 16384), 256);
	cr_assert_eq(chunk_at(db, 8256), 192, "8256 = 64 * 129: 192 is the largest multiple of 64 up to 256 dividing it");
	cr_assert_eq(chunk_at(db, 65536), 512);
	cr_assert_eq(chunk_at(db, 32832), 192, "32832 = 64 * 513: 512, 448, ..., 256 do not divide it, 192 does");
	int c = 7;
	const char *why = NULL;
	cr_assert_eq(dg__tune_db_attn_chunk(db, DEV, 90, 4, 8192, 256, DG_FMT_BF16, 8193, &c, &why), true);
	cr_assert_eq(c, 0, "an odd T: no chunk divides it, the quadratic form");
	cr_assert(why && strstr(why, "attention_form-25m"), "%s", why ? why : "(null)");
	/* another shape, format or device: no record */
	cr_assert_eq(dg__tune_db_attn_chunk(db, DEV, 90, 8, 4096, 512, DG_FMT_BF16, 8192, &c, NULL), false);
	cr_assert_eq(dg__tune_db_attn_chunk(db, DEV, 90, 4, 8192, 256, DG_FMT_F32, 8192, &c, NULL), false);
	cr_assert_eq(dg__tune_db_attn_chunk(db, "NVIDIA H100", 90, 4, 8192, 256, DG_FMT_BF16, 8192, &c, NULL),
		     false);
	dg_tune_db_close(db);
	/* a DB of another device keeps no form of this one */
	dg_tune_db *builtin = open_db("builtin", "NVIDIA H100", 90);
	db = open_db(dir, "NVIDIA H100", 90);
	cr_assert_eq(chunk_at(db, 8192), -1);
	cr_assert_eq(dg_tune_db_n_other_device(db), dg_tune_db_n_other_device(builtin) + 1);
	dg_tune_db_close(db);
	dg_tune_db_close(builtin);
	free(text);
	dg_test_rmtree(dir);
}

/* A DB of one record made from rows (the 25M shape on DEV), in a new
 * folder *dir as file. */
static dg_tune_db *db_of_rows(const dg__attn_form_row *rows, int n, const char *file, char **dir)
{
	char *text = dg__attn_form_make(DEV, 90, 4, 8192, 256, DG_FMT_BF16, "2026-12-05", rows, n);
	cr_assert_not_null(text);
	*dir = dg_test_tmpdir();
	dg_test_write_file(*dir, file, text);
	free(text);
	return open_db(*dir, DEV, 90);
}

Test(tune_form, the_quadratic_form_winning_at_the_largest_t_names_no_chunk)
{
	const dg__attn_form_row rows[] = { { 1, 4096, 256, 4.5, 4.7 }, { 1, 8192, 256, 9.0, 8.0 },
					   { 1, 16384, 256, 15.0, 16.0 } };
	char *dir;
	dg_tune_db *db = db_of_rows(rows, 3, "attention_form-x.json", &dir);
	cr_assert_eq(chunk_at(db, 8192), 0);
	cr_assert_eq(chunk_at(db, 65536), 0);
	dg_tune_db_close(db);
	dg_test_rmtree(dir);
}

Test(tune_form, malformed_records_are_skipped_naming_the_field)
{
	static const struct {
		const char *json, *says;
	} bad[] = {
		{ "{\"format\": 1, \"kind\": \"attention_form\"", "not valid JSON" },
		{ "{\"format\": 2, \"kind\": \"attention_form\"}", "format" },
		{ "{\"format\": 1, \"kind\": \"tiles\"}", "kind" },
		{ "{\"format\": 1, \"kind\": \"attention_form\", \"heads\": 4, \"latent\": 8192, \"embd\": 256, "
		  "\"act\": \"bf17\", \"date\": \"2026-12-05\"}",
		  "act" },
		{ "{\"format\": 1, \"kind\": \"attention_form\", \"heads\": 4, \"latent\": 8192, \"embd\": 256, "
		  "\"act\": \"bf16\", \"date\": \"2026-12-05\", \"device\": {\"name\": \"" DEV "\", \"sm\": 90}, "
		  "\"forms\": [{\"from_t\": 8192, \"chunk\": 100}]}",
		  "forms[0].chunk" },
		{ "{\"format\": 1, \"kind\": \"attention_form\", \"heads\": 4, \"latent\": 8192, \"embd\": 256, "
		  "\"act\": \"bf16\", \"date\": \"2026-12-05\", \"device\": {\"name\": \"" DEV "\", \"sm\": 90}, "
		  "\"forms\": [{\"from_t\": 8192, \"chunk\": 256}, {\"from_t\": 8192, \"chunk\": 512}]}",
		  "forms[1].from_t" },
		{ "{\"format\": 1, \"kind\": \"attention_form\", \"heads\": 4, \"latent\": 8192, \"embd\": 256, "
		  "\"act\": \"bf16\", \"date\": \"2026-12-05\", \"device\": 3, \"forms\": []}",
		  "device" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *dir = dg_test_tmpdir(), name[64];
		snprintf(name, sizeof(name), "attention_form-bad%zu.json", i);
		dg_test_write_file(dir, name, bad[i].json);
		dg_tune_db *db = open_db(dir, DEV, 90);
		cr_assert_eq(dg_tune_db_n_problems(db), 1, "record %zu", i);
		const char *p = dg_tune_db_problem(db, 0);
		cr_assert(strstr(p, name) && strstr(p, bad[i].says), "record %zu: %s", i, p);
		cr_assert_eq(chunk_at(db, 16384), -1);
		dg_tune_db_close(db);
		dg_test_rmtree(dir);
	}
}

static dg_status count_chunk_ops(void *user, const dg_spec *s)
{
	int *n = user;
	n[0] += s->op == DG_OP_ATTENTION_CHUNK_STATE;
	n[1] += s->op == DG_OP_ATTENTION_SCORES; /* the chunked form's intra-chunk scores too */
	return DG_OK;
}

/* At T 4096 the built-in rule takes the quadratic form; a record that
 * names chunk 256 from T 4096 on turns the listing to the chunked form
 * for its device, and not for another. */
Test(tune_form, the_step_listing_takes_the_record_form)
{
	const dg__attn_form_row rows[] = { { 2, 2048, 256, 2.0, 3.0 }, { 1, 4096, 256, 5.0, 4.0 },
					   { 1, 16384, 256, 70.0, 19.0 } };
	char *dir;
	dg_tune_db *db = db_of_rows(rows, 3, "attention_form-25m.json", &dir);
	cr_assert_eq(chunk_at(db, 4096), 256);
	dg_model_config c = dg_test_model("w8a8", 2, 256, 4, 8192);
	char msg[512];
	int none[2] = { 0, 0 }, rec[2] = { 0, 0 }, other[2] = { 0, 0 };
	cr_assert_eq(dg__gm_step_specs(&c, 1, 4096, 90, NULL, NULL, count_chunk_ops, none, msg, sizeof(msg)), DG_OK,
		     "%s", msg);
	cr_assert_eq(dg__gm_step_specs(&c, 1, 4096, 90, db, DEV, count_chunk_ops, rec, msg, sizeof(msg)), DG_OK, "%s",
		     msg);
	cr_assert_eq(dg__gm_step_specs(&c, 1, 4096, 90, db, "NVIDIA H100", count_chunk_ops, other, msg, sizeof(msg)),
		     DG_OK, "%s", msg);
	cr_expect(none[0] == 0 && none[1] > 0, "the built-in rule: quadratic at T 4096 (%d chunk states)", none[0]);
	cr_expect(rec[0] > 0, "the record: chunked at T 4096 (%d chunk states)", rec[0]);
	cr_expect(other[0] == 0, "another device: the built-in rule (%d chunk states)", other[0]);
	dg_tune_db_close(db);
	dg_test_rmtree(dir);
}
