/*
 * dragon-gen tune, inspect's tile line and build --tuned, end to end (see
 * test_cli.c for the sandbox). No GPU needed: tune is run with
 * CUDA_VISIBLE_DEVICES empty, so it meets "no device" on any machine;
 * inspect and build read the built-in H200 records, and a hand-written
 * record through DRAGON_TUNE_DB above them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include "helpers.h"

#include "cli_helpers.h"

/* A record written by hand, as a user merging machines might: the spec is
 * lowrank_fwd ternary x int8 -> int8, relu=0, at the BDH shape; the
 * winner 64x128x64/2x2/2 is no heuristic default. */
static const char RECORD[] =
	"{\n"
	"  \"format\": 1,\n"
	"  \"spec\": \"act=int8;arch=sm_90;embd=256;heads=4;in_heads=1;latent=8192;op=lowrank_fwd;out=int8;relu=0;tile=auto;weight=ternary;\",\n"
	"  \"device\": { \"name\": \"NVIDIA H200\", \"sm\": 90, \"sm_count\": 132,\n"
	"              \"driver_version\": 13000, \"nvrtc_version\": \"13.0\" },\n"
	"  \"generator_version\": \"0.1.0\",\n"
	"  \"date\": \"2026-12-01T10:00:00Z\",\n"
	"  \"rows\": 4096, \"check_rows\": 64, \"warmup\": 3, \"reps\": 25,\n"
	"  \"tie_band\": 0.02, \"budget_s\": 60, \"elapsed_s\": 31.5,\n"
	"  \"budget_exhausted\": false,\n"
	"  \"candidates\": [\n"
	"    { \"tile\": \"128x128x64/2x4/4\", \"arch\": \"sm_90\", \"state\": \"timed\",\n"
	"      \"median_us\": 281.0, \"p10_us\": 279.0, \"p90_us\": 290.0, \"reps\": 25 },\n"
	"    { \"tile\": \"64x128x64/2x2/2\", \"arch\": \"sm_90\", \"state\": \"timed\",\n"
	"      \"median_us\": 240.0, \"p10_us\": 238.0, \"p90_us\": 245.0, \"reps\": 25 },\n"
	"    { \"tile\": \"256x128x128/4x4/4\", \"arch\": \"sm_90a\", \"state\": \"rejected\",\n"
	"      \"reason\": \"needs 262144 bytes of shared memory\" }\n"
	"  ],\n"
	"  \"winner\": { \"tile\": \"64x128x64/2x2/2\", \"arch\": \"sm_90\", \"median_us\": 240.0 }\n"
	"}\n";

#define SPEC_FLAGS "--op", "lowrank_fwd", "--weight", "ternary", "--relu", "0"

/* sb.root/db with the record (and, if junk, a broken file). */
static void make_db(const sandbox *sb, char *dir, size_t size, bool junk)
{
	snprintf(dir, size, "%s/db", sb->root);
	cr_assert_eq(mkdir(dir, 0755), 0);
	dg_test_write_file(dir, "h200.json", RECORD);
	if (junk)
		dg_test_write_file(dir, "broken.json", "{ \"format\": 1, \"spec\": \"op=lowrank_fwd");
}

Test(cli_tune, help_and_usage_errors)
{
	sandbox sb;
	run r;

	sandbox_init(&sb);
	gen(&sb, &r, "tune", "--help", NULL);
	cr_expect_eq(r.code, 0);
	cr_expect_eq(strncmp(r.out, "usage: dragon-gen tune", 22), 0, "%s", r.out);
	cr_expect(strstr(r.out, "--budget"), "%s", r.out);
	cr_expect_str_empty(r.err);
	run_free(&r);
	gen(&sb, &r, "help", "tune", NULL);
	cr_expect_eq(r.code, 0);
	run_free(&r);
	gen(&sb, &r, "--help", NULL);
	cr_expect(strstr(r.out, "tune "), "%s", r.out);
	run_free(&r);

	gen(&sb, &r, "tune", "--tile", "64x64x64/2x2/2", NULL);
	expect_one_line_error(&r, 2, "--tile");
	run_free(&r);
	gen(&sb, &r, "tune", "--budget", "0", NULL);
	expect_one_line_error(&r, 2, "--budget");
	run_free(&r);
	gen(&sb, &r, "tune", "--op", "lowrank_frob", NULL);
	expect_one_line_error(&r, 2, "lowrank_frob");
	run_free(&r);
	gen(&sb, &r, "tune", "extra", NULL);
	expect_one_line_error(&r, 2, "'extra'");
	run_free(&r);
	sandbox_fini(&sb);
}

Test(cli_tune, without_a_gpu_fails_cleanly)
{
	sandbox sb;
	run r;

	sandbox_init(&sb);
	setenv("CUDA_VISIBLE_DEVICES", "", 1);
	gen(&sb, &r, "tune", SPEC_FLAGS, "--budget", "5", NULL);
	expect_one_line_error(&r, 1, "no CUDA device");
	cr_expect_str_empty(r.out);
	run_free(&r);
	/* the default set too; --json answers with the error as an object */
	gen(&sb, &r, "tune", "--json", NULL);
	expect_one_line_error(&r, 1, "no CUDA device");
	cJSON *j = parse_json(r.out);
	cr_expect_str_eq(cJSON_GetObjectItem(j, "status")->valuestring, "no CUDA device");
	cr_expect_eq(num(j, "exit"), 1);
	cr_expect(strstr(cJSON_GetObjectItem(j, "error")->valuestring, "no CUDA device"), "%s",
		  r.out);
	cJSON_Delete(j);
	run_free(&r);
	unsetenv("CUDA_VISIBLE_DEVICES");
	sandbox_fini(&sb);
}

Test(cli_tune, inspect_says_template_default_or_tuned)
{
	sandbox sb;
	run r;
	char dir[700], rec[800];

	sandbox_init(&sb);
	unsetenv("DRAGON_TUNE_DB");
	/* no records of the user's: the H200's built-in one, on sm_90a */
	gen(&sb, &r, "inspect", SPEC_FLAGS, NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	cr_expect(strstr(r.out, "for:  NVIDIA H200 (sm_90)"), "%s", r.out);
	cr_expect(strstr(r.out, "tile: 128x64x64/8x1/2 on the arch-specific target (tuned: "
				"built-in:lowrank_fwd-eb0f52d9a0e89df6-nvidia-h200-sm90.json)"),
		  "%s", r.out);
	cr_expect(strstr(r.out, "spec: act=int8;arch=sm_90;"), "%s", r.out);
	cr_expect(strstr(r.out, "runs: act=int8;arch=sm_90a;"), "%s", r.out);
	cr_expect_not(exists(sb.cache), "inspect made the cache folder");
	run_free(&r);
	/* no records at all: the template's default, saying so */
	gen(&sb, &r, "inspect", SPEC_FLAGS, "--tune-db", "none", NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	cr_expect(strstr(r.out, "(template default: no tuning DB)"), "%s", r.out);
	run_free(&r);
	gen(&sb, &r, "inspect", SPEC_FLAGS, "--device", "none", NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	cr_expect(strstr(r.out, "for:  no device"), "%s", r.out);
	cr_expect(strstr(r.out, "(template default: no device named"), "%s", r.out);
	run_free(&r);

	/* a hand-written record (and a broken file beside it) wins over the
	 * built-in one */
	make_db(&sb, dir, sizeof(dir), true);
	snprintf(rec, sizeof(rec), "%s/h200.json", dir);
	setenv("DRAGON_TUNE_DB", dir, 1);
	gen(&sb, &r, "inspect", SPEC_FLAGS, NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	char want[1000];
	snprintf(want, sizeof(want), "tile: 64x128x64/2x2/2 (tuned: %s)", rec);
	cr_expect(strstr(r.out, want), "want '%s' in: %s", want, r.out);
	cr_expect(strstr(r.out, "runs: act=int8;arch=sm_90;") &&
			  strstr(r.out, "tile=64x128x64/2x2/2;"),
		  "%s", r.out);
	cr_expect(strstr(r.err, "broken.json"), "the broken record is reported: %s", r.err);
	run_free(&r);

	/* another spec: no record for it */
	gen(&sb, &r, "inspect", "--op", "lowrank_fwd", "--weight", "int8", NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	cr_expect(strstr(r.out, "(template default: no record for NVIDIA H200 (sm_90)"), "%s",
		  r.out);
	run_free(&r);

	/* another device, named */
	gen(&sb, &r, "inspect", SPEC_FLAGS, "--device", "NVIDIA A100", "--sm", "80", NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	cr_expect(strstr(r.out, "template default: no record for NVIDIA A100 (sm_80)"), "%s",
		  r.out);
	run_free(&r);
	gen(&sb, &r, "inspect", SPEC_FLAGS, "--device", "NVIDIA A100", NULL);
	expect_one_line_error(&r, 2, "--sm");
	run_free(&r);

	/* --json */
	gen(&sb, &r, "inspect", SPEC_FLAGS, "--json", NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	cr_assert(cJSON_IsArray(j) && cJSON_GetArraySize(j) == 1);
	cJSON *o = cJSON_GetArrayItem(j, 0);
	cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(o, "tuned")));
	cr_expect_str_eq(cJSON_GetObjectItem(o, "tile")->valuestring, "64x128x64/2x2/2");
	cr_expect_str_eq(cJSON_GetObjectItem(o, "record")->valuestring, rec);
	cr_expect_str_eq(cJSON_GetObjectItem(o, "device")->valuestring, "NVIDIA H200");
	cJSON_Delete(j);
	run_free(&r);

	/* --tune-db beats the environment */
	gen(&sb, &r, "inspect", SPEC_FLAGS, "--tune-db", "none", NULL);
	cr_expect(strstr(r.out, "template default"), "%s", r.out);
	run_free(&r);
	unsetenv("DRAGON_TUNE_DB");
	sandbox_fini(&sb);
}

Test(cli_tune, build_tuned_bundles_the_record)
{
	sandbox sb;
	run r;
	char dir[700], path[900];

	sandbox_init(&sb);
	make_db(&sb, dir, sizeof(dir), false);
	gen_ok(&sb, "build", SPEC_FLAGS, "--out", sb.out, "--tuned", "--tune-db", dir, "-q",
	       NULL);
	snprintf(path, sizeof(path), "%s/tune/h200.json", sb.out);
	cr_expect(exists(path), "the record is not in the bundle: %s", listing(sb.out));
	snprintf(path, sizeof(path), "%s/manifest.json", sb.out);
	char *text = slurp(path, NULL);
	cJSON *m = parse_json(text);
	cJSON *k = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "kernels"), 0);
	cr_expect(strstr(cJSON_GetObjectItem(k, "spec")->valuestring, "tile=64x128x64/2x2/2;"),
		  "%s", cJSON_GetObjectItem(k, "spec")->valuestring);
	cJSON *t = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "tuning"), 0);
	cr_assert_not_null(t, "%s", text);
	cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(t, "tuned")));
	cr_expect_str_eq(cJSON_GetObjectItem(t, "record")->valuestring, "tune/h200.json");
	cJSON_Delete(m);
	free(text);
	/* and inspect still passes the bundle */
	gen(&sb, &r, "inspect", sb.out, NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	run_free(&r);
	/* without --tuned the kernel is the same (the records resolve every
	 * build), and the bundle's records go */
	gen_ok(&sb, "build", SPEC_FLAGS, "--out", sb.out, "--tune-db", dir, "-q", NULL);
	snprintf(path, sizeof(path), "%s/manifest.json", sb.out);
	text = slurp(path, NULL);
	cr_expect(strstr(text, "tile=64x128x64/2x2/2;"), "%s", text);
	cr_expect(strstr(text, "\"tuning\"") == NULL, "%s", text);
	free(text);
	snprintf(path, sizeof(path), "%s/tune/h200.json", sb.out);
	cr_expect_not(exists(path), "the record of the old bundle stayed");
	/* --device without --sm is a usage error */
	gen(&sb, &r, "build", SPEC_FLAGS, "--out", sb.out, "--device", "x", NULL);
	expect_one_line_error(&r, 2, "--sm");
	run_free(&r);
	sandbox_fini(&sb);
}
