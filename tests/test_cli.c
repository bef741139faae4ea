/*
 * dragon-gen end to end: the binary at $DRAGON_GEN (set by ctest) is run
 * with posix_spawn, stdout and stderr captured, each test with its own
 * cache folder ($DRAGON_CACHE_DIR) and output folder (cli_helpers.h), so
 * tests never share state or touch the user's cache.
 *
 * What is proved here: the CLI's manners (--help everywhere, exit codes
 * 0/1/2, one-line errors naming the flag and the value), render of one
 * spec, the cache commands and list. Builds live in test_cli_build.c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include "cli/dragon-gen/specset.h"
#include "dragon/cubin.h"
#include "dragon/manifest.h"
#include "helpers.h"

#include "cli_helpers.h"

/* ---- manners ------------------------------------------------------------- */

Test(cli, help_everywhere)
{
	sandbox sb;
	run r;
	const char *cmds[] = { "build", "render", "list", "cache", "inspect" };

	sandbox_init(&sb);
	gen(&sb, &r, "--help", NULL);
	cr_expect_eq(r.code, 0);
	cr_expect(strstr(r.out, "usage: dragon-gen") != NULL, "%s", r.out);
	cr_expect_str_empty(r.err);
	run_free(&r);
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		char want[64];
		snprintf(want, sizeof(want), "usage: dragon-gen %s", cmds[i]);
		gen(&sb, &r, cmds[i], "--help", NULL);
		cr_expect_eq(r.code, 0, "%s --help: exit %d", cmds[i], r.code);
		cr_expect_eq(strncmp(r.out, want, strlen(want)), 0, "%s --help: %s", cmds[i], r.out);
		cr_expect_str_empty(r.err, "%s --help wrote to stderr: %s", cmds[i], r.err);
		run_free(&r);
		gen(&sb, &r, "help", cmds[i], NULL);
		cr_expect_eq(r.code, 0);
		cr_expect_eq(strncmp(r.out, want, strlen(want)), 0);
		run_free(&r);
	}
	gen(&sb, &r, "--version", NULL);
	cr_expect_eq(r.code, 0);
	cr_expect(strstr(r.out, "dragon-gen 0.") != NULL, "%s", r.out);
	run_free(&r);
	sandbox_fini(&sb);
}

Test(cli, usage_errors_exit_2_in_one_line)
{
	sandbox sb;
	run r;

	sandbox_init(&sb);
	gen(&sb, &r, "frobnicate", NULL);
	expect_one_line_error(&r, 2, "'frobnicate'");
	run_free(&r);
	gen(&sb, &r, "--frobnicate", NULL);
	expect_one_line_error(&r, 2, "--frobnicate");
	run_free(&r);
	gen(&sb, &r, "build", "--frob", "--out", sb.out, NULL);
	expect_one_line_error(&r, 2, "--frob");
	cr_expect(strstr(r.err, "dragon-gen build --help") != NULL, "names the fix: %s", r.err);
	run_free(&r);
	gen(&sb, &r, "render", "--latent", NULL);
	expect_one_line_error(&r, 2, "--latent needs a value");
	run_free(&r);
	gen(&sb, &r, "build", "-j", "0", "--out", sb.out, NULL);
	expect_one_line_error(&r, 2, "-j 0");
	run_free(&r);
	gen(&sb, &r, "build", "--no-cache", "--cache-dir", sb.cache, NULL);
	expect_one_line_error(&r, 2, "--no-cache");
	run_free(&r);
	gen(&sb, &r, "cache", NULL);
	expect_one_line_error(&r, 2, "stat, verify, gc or clear");
	run_free(&r);
	gen(&sb, &r, "cache", "explode", NULL);
	expect_one_line_error(&r, 2, "'explode'");
	run_free(&r);
	gen(&sb, &r, "cache", "stat", "--max-bytes", "5", NULL);
	expect_one_line_error(&r, 2, "--max-bytes");
	run_free(&r);
	gen(&sb, &r, "inspect", NULL);
	expect_one_line_error(&r, 2, "inspect needs the bundle folder");
	run_free(&r);
	gen(&sb, &r, "list", "--verbose", NULL);
	expect_one_line_error(&r, 2, "--verbose");
	run_free(&r);
	gen(&sb, &r, NULL);
	cr_expect_eq(r.code, 2);
	run_free(&r);
	cr_expect_not(exists(sb.out), "a usage error must not create the out folder");
	sandbox_fini(&sb);
}

/* Each bad spec flag value: exit 2, one line naming the flag, its value
 * and the spec field; build too, before any compile or folder. */
Test(cli, bad_spec_values_name_the_field)
{
	static const struct {
		const char *flag, *value, *op, *want;
		const char *xflag, *xvalue; /* one more flag, or NULL */
	} cases[] = {
		{ "--latent", "8190", "lowrank_fwd", "--latent 8190: latent=8190: must be a multiple of 4", NULL, NULL },
		{ "--weight", "int3", "lowrank_fwd", "--weight int3: weight=int3", NULL, NULL },
		{ "--relu", "nan", "lowrank_fwd", "--relu nan: relu=nan", NULL, NULL },
		{ "--tile", "7x7", "lowrank_fwd", "--tile 7x7: tile=7x7", NULL, NULL },
		{ "--arch", "sm_20", "lowrank_fwd", "--arch sm_20: arch=sm_20", NULL, NULL },
		{ "--in-heads", "3", "lowrank_fwd", "--in-heads 3: in_heads=3", NULL, NULL },
		{ "--heads", "0", "lowrank_fwd", "--heads 0: heads=0", NULL, NULL },
		{ "--embd", "6", "lowrank_fwd", "--embd 6: embd=6", NULL, NULL },
		{ "--act", "ternary", "lowrank_fwd", "--act ternary: act=ternary", NULL, NULL },
		{ "--out-format", "int4", "lowrank_fwd", "--out-format int4: out=int4", NULL, NULL },
		{ "--src", "int8", "quantize_act", "--src int8: src=int8", NULL, NULL },
		{ "--op", "lowrank", "lowrank_fwd", "--op lowrank: op=lowrank", NULL, NULL },
		{ "--weight", "int8", "quantize_act", "--weight: none of the ops (quantize_act) reads it", NULL, NULL },
		{ "--out-format", "uint8pos", "lowrank_fwd", "out=uint8pos: needs relu", NULL, NULL },
		/* uint8pos×none is left out of a product only when that is all
		 * that is wrong with it */
		{ "--latent", "8190", "lowrank_fwd", "--latent 8190: latent=8190",
		  "--out-format", "uint8pos" },
		{ "--latent", "256,,512", "lowrank_fwd", "--latent '256,,512': empty item", NULL, NULL },
	};
	sandbox sb;
	run r;

	sandbox_init(&sb);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *op = strcmp(cases[i].flag, "--op") == 0 ? "--heads" : "--op";
		const char *opv = strcmp(cases[i].flag, "--op") == 0 ? "4" : cases[i].op;
		/* a NULL xflag ends the argument list early */
		gen(&sb, &r, "render", "--canonical", op, opv, cases[i].flag, cases[i].value,
		    cases[i].xflag, cases[i].xvalue, NULL);
		expect_one_line_error(&r, 2, cases[i].want);
		cr_expect_str_empty(r.out);
		run_free(&r);
		gen(&sb, &r, "build", "--out", sb.out, op, opv, cases[i].flag, cases[i].value,
		    cases[i].xflag, cases[i].xvalue, NULL);
		expect_one_line_error(&r, 2, cases[i].want);
		run_free(&r);
	}
	cr_expect_not(exists(sb.out), "a refused build must not create the out folder");
	sandbox_fini(&sb);
}

Test(cli, product_drops_uint8pos_without_relu)
{
	sandbox sb;
	run r;

	sandbox_init(&sb);
	/* 2 out × 2 relu - 1 (uint8pos, none) = 3; render names the size */
	gen(&sb, &r, "render", "--op", "lowrank_fwd", "--out-format", "int8,uint8pos",
	    "--relu", "none,0", NULL);
	expect_one_line_error(&r, 2, "render takes one spec; got 3");
	run_free(&r);
	/* duplicates collapse: --weight int8,int8 and a repeated flag are one spec */
	gen(&sb, &r, "render", "--canonical", "--op", "pack_i8x4,pack_i8x4", "--latent",
	    "256", "--latent", "256", NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	cr_expect_str_eq(r.out, "arch=sm_90;embd=256;latent=256;op=pack_i8x4;tile=t256;\n");
	run_free(&r);
	sandbox_fini(&sb);
}

/* ---- render -------------------------------------------------------------- */

Test(cli, render_one_spec)
{
	sandbox sb;
	run r, c;
	char file[700], *text;

	sandbox_init(&sb);
	gen(&sb, &c, "render", "--canonical", "--op", "lowrank_fwd", "--weight", "ternary",
	    "--relu", "0", "--latent", "256", NULL);
	cr_assert_eq(c.code, 0, "%s", c.err);
	cr_assert(strstr(c.out, "op=lowrank_fwd;") && strstr(c.out, "weight=ternary;") &&
		  strstr(c.out, "relu=0;") && strstr(c.out, "latent=256;"), "%s", c.out);
	c.out[strcspn(c.out, "\n")] = '\0';
	gen(&sb, &r, "render", "--op", "lowrank_fwd", "--weight", "ternary", "--relu", "0",
	    "--latent", "256", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_expect_eq(strncmp(r.out, "/*\n * generated by dragon ", 26), 0,
		     "source must start with the generated banner: %.200s", r.out);
	cr_expect(strstr(r.out, "do not edit") != NULL);
	char want[DG_SPEC_TEXT_MAX + 16];
	snprintf(want, sizeof(want), " * spec: %s\n", c.out);
	cr_expect(strstr(r.out, want) != NULL, "banner should hold '%s'", c.out);
	cr_expect(strstr(r.out, "extern \"C\"") != NULL);
	cr_expect_str_empty(r.err);
	snprintf(file, sizeof(file), "%s/k.cu", sb.root);
	run o;
	gen(&sb, &o, "render", "-o", file, "--op", "lowrank_fwd", "--weight", "ternary",
	    "--relu", "0", "--latent", "256", NULL);
	cr_assert_eq(o.code, 0, "%s", o.err);
	cr_expect_str_empty(o.out);
	text = slurp(file, NULL);
	cr_expect_str_eq(text, r.out, "-o writes what stdout shows");
	free(text);
	run_free(&o);
	run_free(&r);
	run_free(&c);
	sandbox_fini(&sb);
}

Test(cli, render_refuses_two_specs)
{
	sandbox sb;
	run r;

	sandbox_init(&sb);
	gen(&sb, &r, "render", "--op", "lowrank_fwd", "--weight", "int8,ternary", NULL);
	expect_one_line_error(&r, 2, "render takes one spec; got 2");
	cr_expect_str_empty(r.out);
	run_free(&r);
	gen(&sb, &r, "render", NULL);
	expect_one_line_error(&r, 2, "render needs spec flags");
	run_free(&r);
	sandbox_fini(&sb);
}

/* ---- cache --------------------------------------------------------------- */

Test(cli, cache_commands)
{
	sandbox sb;
	run r;

	sandbox_init(&sb);
	gen(&sb, &r, "build", "--op", "pack_i8x4,unpack_i8x4", "--out", sb.out, NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	run_free(&r);
	gen(&sb, &r, "cache", "stat", "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	cr_expect_eq(num(j, "entries"), 2);
	cr_expect_gt(num(j, "bytes"), 0);
	cr_expect_str_eq(cJSON_GetObjectItem(j, "root")->valuestring, sb.cache);
	cJSON_Delete(j);
	run_free(&r);
	gen(&sb, &r, "cache", "verify", "--json", NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	j = parse_json(r.out);
	cr_expect_eq(num(j, "checked"), 2);
	cr_expect_eq(num(j, "bad"), 0);
	cJSON_Delete(j);
	run_free(&r);

	/* flip a byte of one entry's payload: verify finds it and exits 1 */
	char kdir[800];
	snprintf(kdir, sizeof(kdir), "%s/kernels", sb.cache);
	char *names = listing(kdir);
	char entry[1024];
	snprintf(entry, sizeof(entry), "%s/%.*s", kdir, (int)strcspn(names, "\n"), names);
	free(names);
	FILE *f = fopen(entry, "r+b");
	cr_assert_not_null(f, "%s", entry);
	fseek(f, 200, SEEK_SET);
	int c = fgetc(f);
	fseek(f, 200, SEEK_SET);
	fputc(c ^ 0x55, f);
	fclose(f);
	gen(&sb, &r, "cache", "verify", "--json", NULL);
	cr_expect_eq(r.code, 1, "verify must fail on a bad entry");
	j = parse_json(r.out);
	cr_expect_eq(num(j, "bad"), 1);
	cJSON *bad = cJSON_GetObjectItem(j, "bad_entries");
	cr_expect(cJSON_GetArraySize(bad) == 1, "the bad entry is named: %s", r.out);
	cJSON *e0 = cJSON_GetArrayItem(bad, 0);
	cr_expect(e0 && cJSON_IsString(cJSON_GetObjectItem(e0, "key")) &&
		  strlen(cJSON_GetObjectItem(e0, "key")->valuestring) == 64, "%s", r.out);
	cr_expect(e0 && strstr(cJSON_GetObjectItem(e0, "reason")->valuestring, "checksum"),
		  "%s", r.out);
	cJSON_Delete(j);
	cr_expect(strstr(r.err, "quarantine") != NULL, "%s", r.err);
	run_free(&r);

	gen(&sb, &r, "cache", "stat", NULL);
	cr_expect_eq(r.code, 0);
	cr_expect(strstr(r.out, "entries:     1") != NULL, "%s", r.out);
	run_free(&r);
	gen(&sb, &r, "cache", "gc", "--max-bytes", "1", "--json", NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	run_free(&r);
	gen(&sb, &r, "cache", "clear", "--cache-dir", sb.cache, "--json", NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	run_free(&r);
	gen(&sb, &r, "cache", "stat", "--json", NULL);
	j = parse_json(r.out);
	cr_expect_eq(num(j, "entries"), 0);
	cJSON_Delete(j);
	run_free(&r);
	sandbox_fini(&sb);
}

/* ---- list and the default set --------------------------------------------- */

Test(cli, list)
{
	sandbox sb;
	run r;

	sandbox_init(&sb);
	gen(&sb, &r, "list", "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	const cJSON *ds = cJSON_GetObjectItem(j, "default_set");
	cr_expect_eq(num(ds, "size"), DG__SPECSET_DEFAULT_SIZE);
	cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(ds, "specs")),
		     DG__SPECSET_DEFAULT_SIZE);
	cr_expect_eq(num(cJSON_GetObjectItem(ds, "per_op"), "lowrank_fwd"), 70);
	cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "ops")), DG_OP__COUNT);
	cJSON_Delete(j);
	run_free(&r);
	gen(&sb, &r, "list", NULL);
	cr_expect_eq(r.code, 0);
	cr_expect(strstr(r.out, "lowrank_fwd") && strstr(r.out, "--out-format") &&
		  strstr(r.out, "ternary"), "%s", r.out);
	run_free(&r);
	sandbox_fini(&sb);
}

/* The slow one: ~74 NVRTC compiles with -j2. */
