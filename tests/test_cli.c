/*
 * dragon-gen end to end: the binary at $DRAGON_GEN (set by ctest) is run
 * with posix_spawn, stdout and stderr captured, each test with its own
 * cache folder ($DRAGON_CACHE_DIR) and output folder (cli_helpers.h), so
 * tests never share state or touch the user's cache.
 *
 * What is proved here: the CLI's manners (--help everywhere, exit codes
 * 0/1/2, one-line errors naming the flag and the value, a JSON object for
 * a --json failure), the spec set's rules (combinations an op refuses are
 * left out, all refused is a usage error), render of one spec and of its
 * plan, the cache commands and list against the op table. Builds live in
 * test_cli_build.c.
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
	const char *cmds[] = { "build", "render", "list", "cache", "inspect", "tune" };

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

/* The spec flags' help is the op table's: every op is named, and the
 * default set is described by its size, not by a list of ops, in build's
 * help alone. */
Test(cli, help_text_follows_the_op_table)
{
	sandbox sb;
	run r;
	char want[128];

	sandbox_init(&sb);
	gen(&sb, &r, "build", "--help", NULL);
	cr_assert_eq(r.code, 0);
	for (int op = 0; op < DG_OP__COUNT; op++)
		cr_expect(strstr(r.out, dg_op_name((dg_op)op)) != NULL, "--help lacks op %s",
			  dg_op_name((dg_op)op));
	snprintf(want, sizeof(want), "the default build set, %d specs", DG__SPECSET_DEFAULT_SIZE);
	cr_expect(strstr(r.out, want) != NULL, "--help should say '%s': %s", want, r.out);
	/* every format a spec field takes (i32 token ids are no spec's format) */
	unsigned fmts = 0;
	for (int op = 0; op < DG_OP__COUNT; op++) {
		const dg_op_info *row = dg_op_info_of((dg_op)op);
		fmts |= row->weight_fmts | row->act_fmts | row->out_fmts | row->src_fmts;
	}
	cr_expect_eq(fmts & DG_FMT_BIT(DG_FMT_I32), 0u);
	for (int f = 0; f < DG_FMT__COUNT; f++)
		if (fmts & DG_FMT_BIT(f))
			cr_expect(strstr(r.out, dg_fmt_name((dg_fmt)f)) != NULL, "--help lacks format %s",
				  dg_fmt_name((dg_fmt)f));
	run_free(&r);
	/* only build makes the default set of no spec flag: render needs one
	 * kernel, tune tunes its BDH set (their help once said otherwise) */
	gen(&sb, &r, "render", "--help", NULL);
	cr_assert_eq(r.code, 0);
	cr_expect(strstr(r.out, "default build set") == NULL, "render --help: %s", r.out);
	run_free(&r);
	gen(&sb, &r, "tune", "--help", NULL);
	cr_assert_eq(r.code, 0);
	cr_expect(strstr(r.out, "default build set") == NULL, "tune --help: %s", r.out);
	cr_expect(strstr(r.out, "Without spec flags the ops of a") != NULL, "%s",
		  r.out);
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
	gen(&sb, &r, "render", "--op", "pack_i8x4", "--plan", "--canonical", NULL);
	expect_one_line_error(&r, 2, "--canonical and --plan");
	run_free(&r);
	gen(&sb, &r, "build", "-j", "0", "--out", sb.out, NULL);
	expect_one_line_error(&r, 2, "-j 0");
	run_free(&r);
	gen(&sb, &r, "build", "--no-cache", "--cache-dir", sb.cache, NULL);
	expect_one_line_error(&r, 2, "--no-cache");
	run_free(&r);
	gen(&sb, &r, "build", "--op", "pack_i8x4", "--device", "NVIDIA H200", "--out", sb.out, NULL);
	expect_one_line_error(&r, 2, "--sm");
	run_free(&r);
	gen(&sb, &r, "build", "--op", "pack_i8x4", "--device", "none", "--sm", "90", "--out",
	    sb.out, NULL);
	expect_one_line_error(&r, 2, "--device none");
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
 * and the spec field, the same from every command that takes spec flags
 * (build before any compile or folder), wherever the library finds it:
 * the parser, the op table, NVRTC's arch range, the template's plan. */
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
		{ "--out-format", "uint8pos", "lowrank_fwd", "--out-format uint8pos: out=uint8pos: needs relu", NULL, NULL },
		{ "--latent", "8190", "lowrank_fwd", "--latent 8190: latent=8190",
		  "--out-format", "uint8pos" },
		{ "--latent", "256,,512", "lowrank_fwd", "--latent '256,,512': empty item", NULL, NULL },
		/* the op table (the old template-only rule of the ternary pack) */
		{ "--embd", "8", "pack_ternary", "--embd 8: embd=8", NULL, NULL },
		{ "--out-format", "int8", "decoder_fwd", "--out-format int8: out=int8: op decoder_fwd takes one of f32|bf16", NULL, NULL },
		/* the template's plan */
		{ "--tile", "48x64x64/2x2/2", "lowrank_fwd", "--tile 48x64x64/2x2/2: tile=48x64x64/2x2/2: BM and BN", NULL, NULL },
		/* NVRTC's arch range */
		{ "--arch", "sm_50", "pack_i8x4", "--arch sm_50: arch=sm_50: NVRTC", NULL, NULL },
	};
	const char *cmds[] = { "render", "build", "inspect", "tune" };
	sandbox sb;
	run r;

	sandbox_init(&sb);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *op = strcmp(cases[i].flag, "--op") == 0 ? "--heads" : "--op";
		const char *opv = strcmp(cases[i].flag, "--op") == 0 ? "4" : cases[i].op;
		for (size_t c = 0; c < sizeof(cmds) / sizeof(cmds[0]); c++) {
			const char *cmd = cmds[c];
			/* tune refuses --tile whatever its value (it picks tiles) */
			if (strcmp(cmd, "tune") == 0 && strcmp(cases[i].flag, "--tile") == 0)
				continue;
			/* an option of the command first; a NULL xflag ends the list early */
			const char *o1 = strcmp(cmd, "render") == 0 ? "--canonical"
					 : strcmp(cmd, "build") == 0  ? "--out"
					 : strcmp(cmd, "inspect") == 0 ? "--device"
								       : "--budget";
			const char *o2 = strcmp(cmd, "render") == 0 ? "-v"
					 : strcmp(cmd, "build") == 0  ? sb.out
					 : strcmp(cmd, "inspect") == 0 ? "none"
								       : "5";
			if (strcmp(cmd, "render") == 0)
				gen(&sb, &r, cmd, o1, op, opv, cases[i].flag, cases[i].value,
				    cases[i].xflag, cases[i].xvalue, NULL);
			else
				gen(&sb, &r, cmd, o1, o2, op, opv, cases[i].flag, cases[i].value,
				    cases[i].xflag, cases[i].xvalue, NULL);
			expect_one_line_error(&r, 2, cases[i].want);
			cr_expect_str_empty(r.out, "%s: %s", cmd, r.out);
			run_free(&r);
		}
	}
	cr_expect_not(exists(sb.out), "a refused build must not create the out folder");
	sandbox_fini(&sb);
}

/* Combinations an op's rules refuse are left out and counted, in one
 * line on stderr; nothing left is a usage error. No compile: inspect
 * expands and plans as build does. */
Test(cli, spec_set_leaves_out_what_the_ops_refuse)
{
	sandbox sb;
	run r;

	sandbox_init(&sb);
	/* decoder_fwd writes floats only: its int8 is left out */
	gen(&sb, &r, "inspect", "--json", "--device", "none", "--op", "lowrank_fwd,decoder_fwd",
	    "--out-format", "int8,bf16", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	cr_expect_eq(cJSON_GetArraySize(j), 3, "%s", r.out);
	cJSON_Delete(j);
	cr_expect_str_eq(r.err, "dragon-gen: left out 1 combination the ops' rules refuse; first: "
				"--out-format int8: out=int8: op decoder_fwd takes one of f32|bf16\n");
	run_free(&r);
	/* three refused: decoder_fwd int8 and uint8pos, lowrank_fwd uint8pos
	 * without relu; the first named is the first in product order */
	gen(&sb, &r, "inspect", "--json", "--device", "none", "--op", "decoder_fwd,lowrank_fwd",
	    "--out-format", "int8,uint8pos", "--relu", "none,0", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	j = parse_json(r.out);
	cr_expect_eq(cJSON_GetArraySize(j), 3, "%s", r.out);
	cJSON_Delete(j);
	expect_one_line_error(&r, 0, "left out 3 combinations the ops' rules refuse; first: --out-format int8: out=int8");
	run_free(&r);
	/* the template's plan refuses a tile: left out beside auto */
	gen(&sb, &r, "inspect", "--json", "--device", "none", "--op", "lowrank_fwd", "--tile",
	    "auto,48x64x64/2x2/2", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	j = parse_json(r.out);
	cr_expect_eq(cJSON_GetArraySize(j), 1, "%s", r.out);
	cJSON_Delete(j);
	expect_one_line_error(&r, 0, "left out 1 combination the ops' rules refuse; first: --tile 48x64x64/2x2/2: tile=48x64x64/2x2/2: BM and BN must be");
	run_free(&r);
	/* everything refused: a usage error naming the first */
	gen(&sb, &r, "inspect", "--device", "none", "--op", "lowrank_fwd", "--latent",
	    "8190,8194", NULL);
	expect_one_line_error(&r, 2, "--latent 8190: latent=8190: must be a multiple of 4 (codes are packed four to a word along it) (the ops' rules refuse all 2 combinations)");
	cr_expect_str_empty(r.out);
	run_free(&r);
	/* a value no op of the product takes at all is refused at once */
	gen(&sb, &r, "inspect", "--device", "none", "--op", "decoder_fwd", "--out-format",
	    "bf16,int8", NULL);
	expect_one_line_error(&r, 2, "--out-format int8: out=int8: op decoder_fwd takes one of f32|bf16");
	cr_expect_str_empty(r.out);
	run_free(&r);
	/* render: 2 out x 2 relu - 1 (uint8pos, none) = 3 */
	gen(&sb, &r, "render", "--op", "lowrank_fwd", "--out-format", "int8,uint8pos", "--relu",
	    "none,0", NULL);
	expect_one_line_error(&r, 2, "render takes one spec; got 3");
	run_free(&r);
	/* duplicates collapse: --op a,a and a repeated flag are one spec */
	gen(&sb, &r, "render", "--canonical", "--op", "pack_i8x4,pack_i8x4", "--latent", "256",
	    "--latent", "256", NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	cr_expect(strncmp(r.out, "arch=sm_90;embd=256;latent=256;op=pack_i8x4;tile=t", 50) == 0,
		  "%s", r.out);
	run_free(&r);
	sandbox_fini(&sb);
}

/* ---- --json failures ---------------------------------------------------------- */

/* stdout is one JSON object naming the error, its status and the exit. */
static void expect_json_error(const run *r, int code, const char *status, const char *want)
{
	expect_one_line_error(r, code, want);
	cJSON *j = parse_json(r->out);
	cr_assert(cJSON_IsObject(j), "%s", r->out);
	const cJSON *e = cJSON_GetObjectItem(j, "error"), *s = cJSON_GetObjectItem(j, "status");
	cr_expect(cJSON_IsString(e) && strstr(e->valuestring, want), "error: %s", r->out);
	cr_expect(cJSON_IsString(s) && strcmp(s->valuestring, status) == 0, "status: %s", r->out);
	cr_expect_eq(num(j, "exit"), code, "%s", r->out);
	/* the message is stderr's line, without the prefix */
	if (cJSON_IsString(e))
		cr_expect(strstr(r->err, e->valuestring) != NULL, "%s vs %s", r->err, r->out);
	cJSON_Delete(j);
}

Test(cli, json_failures_print_an_object)
{
	sandbox sb;
	run r;
	char missing[700];

	sandbox_init(&sb);
	snprintf(missing, sizeof(missing), "%s/nothing-here", sb.root);
	gen(&sb, &r, "build", "--frob", "--json", NULL);
	expect_json_error(&r, 2, "invalid argument", "build has no flag --frob");
	run_free(&r);
	gen(&sb, &r, "build", "--json", "--op", "pack_i8x4", "--arch", "sm_50", "--out", sb.out,
	    NULL);
	expect_json_error(&r, 2, "invalid spec", "--arch sm_50: arch=sm_50");
	run_free(&r);
	gen(&sb, &r, "inspect", missing, "--json", NULL);
	expect_json_error(&r, 1, "not found", "manifest.json");
	run_free(&r);
	gen(&sb, &r, "inspect", "--json", "--op", "decoder_fwd", "--out-format", "int8", NULL);
	expect_json_error(&r, 2, "invalid spec", "--out-format int8: out=int8");
	run_free(&r);
	gen(&sb, &r, "list", "--json", "extra", NULL);
	expect_json_error(&r, 2, "invalid argument", "list takes no arguments");
	run_free(&r);
	gen(&sb, &r, "cache", "stat", "--json", "--max-bytes", "5", NULL);
	expect_json_error(&r, 2, "invalid argument", "--max-bytes applies to gc only");
	run_free(&r);
	/* after "--" it is not the flag */
	gen(&sb, &r, "inspect", "--", "--json", NULL);
	cr_expect_eq(r.code, 1);
	cr_expect_str_empty(r.out, "%s", r.out);
	run_free(&r);
	cr_expect_not(exists(sb.out));
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
	cr_expect(strstr(c.out, "tile=auto") == NULL, "the tile is resolved: %s", c.out);
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

/* Every op renders on its defaults (decoder_fwd writes bf16 and relu_mask
 * has relu=0 by default: the op table's), and a bare flag works. */
Test(cli, render_every_op_on_its_defaults)
{
	sandbox sb;
	run r;

	sandbox_init(&sb);
	for (int op = 0; op < DG_OP__COUNT; op++) {
		gen(&sb, &r, "render", "--op", dg_op_name((dg_op)op), NULL);
		cr_expect_eq(r.code, 0, "render --op %s: %s", dg_op_name((dg_op)op), r.err);
		cr_expect(strstr(r.out, "extern \"C\"") != NULL, "%s", dg_op_name((dg_op)op));
		run_free(&r);
	}
	gen(&sb, &r, "render", "--canonical", "--op", "decoder_fwd", NULL);
	cr_expect(strstr(r.out, "out=bf16;"), "%s", r.out);
	run_free(&r);
	gen(&sb, &r, "render", "--canonical", "--op", "relu_mask", NULL);
	cr_expect(strstr(r.out, "relu=0;"), "%s", r.out);
	run_free(&r);
	sandbox_fini(&sb);
}

/* The value of "name:" in render --plan's text. */
static void plan_value(const char *text, const char *name, char *out, size_t size)
{
	char key[32];
	snprintf(key, sizeof(key), "\n%s:", name);
	char *buf = malloc(strlen(text) + 2);
	sprintf(buf, "\n%s", text);
	const char *p = strstr(buf, key);
	out[0] = '\0';
	if (p) {
		p += strlen(key);
		while (*p == ' ')
			p++;
		snprintf(out, size, "%.*s", (int)strcspn(p, "\n"), p);
	}
	free(buf);
}

Test(cli, render_plan)
{
	sandbox sb;
	run r, c;
	char spec[DG_SPEC_TEXT_MAX], tile[64], arch[32], path[64], entry[256], want[128];

	sandbox_init(&sb);
	gen(&sb, &r, "render", "--plan", "--op", "decoder_fwd", "--latent", "256", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	gen(&sb, &c, "render", "--canonical", "--op", "decoder_fwd", "--latent", "256", NULL);
	cr_assert_eq(c.code, 0, "%s", c.err);
	plan_value(r.out, "spec", spec, sizeof(spec));
	plan_value(r.out, "tile", tile, sizeof(tile));
	plan_value(r.out, "arch", arch, sizeof(arch));
	plan_value(r.out, "path", path, sizeof(path));
	plan_value(r.out, "entry", entry, sizeof(entry));
	c.out[strcspn(c.out, "\n")] = '\0';
	cr_expect_str_eq(spec, c.out, "--plan's spec is --canonical's: %s", r.out);
	snprintf(want, sizeof(want), ";tile=%s;", tile);
	cr_expect(tile[0] && strcmp(tile, "auto") != 0 && strstr(spec, want), "%s", r.out);
	cr_expect_str_eq(arch, "sm_90", "%s", r.out);
	cr_expect(path[0], "%s", r.out);
	int threads = 0, smem = -1;
	char name[128] = "";
	cr_expect_eq(sscanf(entry, "%127s threads %d smem %d", name, &threads, &smem), 3, "%s",
		     r.out);
	cr_expect_str_eq(name, "dg_decoder_fwd");
	cr_expect(threads >= 32 && threads <= 1024 && smem >= 0, "%s", entry);
	/* the decoder has two entries (the GEMM and its output pass) */
	cr_expect_eq(count_lines(r.out), 7, "%s", r.out);
	cr_expect_str_empty(r.err);
	run_free(&c);
	run_free(&r);
	sandbox_fini(&sb);
}

/* An arch NVRTC cannot target: exit 2 with one message, render or build. */
Test(cli, arch_nvrtc_cannot_target_is_usage)
{
	sandbox sb;
	run r, b;

	sandbox_init(&sb);
	gen(&sb, &r, "render", "--op", "lowrank_fwd", "--arch", "sm_50", NULL);
	expect_one_line_error(&r, 2, "--arch sm_50: arch=sm_50: NVRTC ");
	cr_expect_str_empty(r.out);
	gen(&sb, &b, "build", "--op", "lowrank_fwd", "--arch", "sm_50", "--out", sb.out, NULL);
	expect_one_line_error(&b, 2, "--arch sm_50: arch=sm_50: NVRTC ");
	cr_expect_str_eq(b.err, r.err, "one wording");
	cr_expect_not(exists(sb.out));
	run_free(&b);
	run_free(&r);
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

/* No cache command creates the cache it was asked about. */
Test(cli, cache_commands_leave_a_missing_cache_missing)
{
	sandbox sb;
	run r;
	const char *acts[] = { "stat", "verify", "gc", "clear" };

	sandbox_init(&sb);
	cr_assert_not(exists(sb.cache));
	for (size_t i = 0; i < sizeof(acts) / sizeof(acts[0]); i++) {
		gen(&sb, &r, "cache", acts[i], NULL);
		cr_expect_eq(r.code, 0, "cache %s: %s", acts[i], r.err);
		cr_expect(strstr(r.out, "no kernel cache") != NULL, "cache %s: %s", acts[i], r.out);
		cr_expect(strstr(r.out, sb.cache) != NULL, "names the folder: %s", r.out);
		run_free(&r);
		cr_expect_not(exists(sb.cache), "cache %s created the cache", acts[i]);
	}
	gen(&sb, &r, "cache", "stat", "--json", NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	cr_expect(cJSON_IsFalse(cJSON_GetObjectItem(j, "exists")), "%s", r.out);
	cr_expect_eq(num(j, "entries"), 0);
	cJSON_Delete(j);
	run_free(&r);
	cr_expect_not(exists(sb.cache));
	sandbox_fini(&sb);
}

Test(cli, cache_commands)
{
	sandbox sb;
	run r;

	sandbox_init(&sb);
	gen_ok(&sb, "build", "--op", "pack_i8x4,unpack_i8x4", "--latent", "256", "--out", sb.out,
	       NULL);
	gen(&sb, &r, "cache", "stat", "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(j, "exists")), "%s", r.out);
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
	cr_expect_null(cJSON_GetObjectItem(j, "error"), "one JSON document: the report");
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

/* Combinations of op's build lists, read off the op table here the way
 * its comment describes them ("key=v1,v2;key=v"; "" is the defaults). */
static size_t build_product(dg_op op)
{
	const char *b = dg_op_info_of(op)->build;
	size_t p = 1;
	while (b && *b) {
		size_t len = strcspn(b, ";"), n = 1;
		for (size_t i = 0; i < len; i++)
			n += b[i] == ',';
		p *= n;
		b += len + (b[len] == ';');
	}
	return p;
}

static bool in_string_array(const cJSON *a, const char *s)
{
	const cJSON *v;
	cJSON_ArrayForEach(v, a)
		if (cJSON_IsString(v) && strcmp(v->valuestring, s) == 0)
			return true;
	return false;
}

Test(cli, list_reads_the_op_table)
{
	sandbox sb;
	run r;

	sandbox_init(&sb);
	gen(&sb, &r, "list", "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_expect_str_empty(r.err, "the default set leaves nothing out: %s", r.err);
	cJSON *j = parse_json(r.out);
	const cJSON *ops = cJSON_GetObjectItem(j, "ops"), *o;
	cr_assert_eq(cJSON_GetArraySize(ops), DG_OP__COUNT);
	int i = 0;
	size_t total = 0;
	const cJSON *ds = cJSON_GetObjectItem(j, "default_set");
	cJSON_ArrayForEach(o, ops) {
		const dg_op_info *row = dg_op_info_of((dg_op)i);
		const char *name = dg_op_name((dg_op)i);
		cr_expect_str_eq(cJSON_GetObjectItem(o, "name")->valuestring, name);
		cr_expect_str_eq(cJSON_GetObjectItem(o, "family")->valuestring, row->family);
		cr_expect_str_eq(cJSON_GetObjectItem(o, "about")->valuestring, row->about);
		cr_expect_str_eq(cJSON_GetObjectItem(o, "tile")->valuestring,
				 row->tile == DG_TILE_GEMM ? "gemm" : "threads", "%s", name);
		/* the fields it reads, each format field with exactly its formats */
		const cJSON *fields = cJSON_GetObjectItem(o, "fields"), *fl;
		int n_fields = 0;
		for (unsigned m = row->fields; m; m &= m - 1)
			n_fields++;
		cr_expect_eq(cJSON_GetArraySize(fields), n_fields, "%s", name);
		cJSON_ArrayForEach(fl, fields) {
			const char *key = cJSON_GetObjectItem(fl, "key")->valuestring;
			unsigned mask = strcmp(key, "weight") == 0 ? row->weight_fmts
					: strcmp(key, "act") == 0  ? row->act_fmts
					: strcmp(key, "out") == 0  ? row->out_fmts
					: strcmp(key, "src") == 0  ? row->src_fmts
								   : 0;
			const cJSON *fm = cJSON_GetObjectItem(fl, "formats");
			cr_expect_eq(fm != NULL, mask != 0, "%s.%s", name, key);
			for (int f = 0; f < DG_FMT__COUNT && fm; f++)
				cr_expect_eq(in_string_array(fm, dg_fmt_name((dg_fmt)f)),
					     (mask & DG_FMT_BIT(f)) != 0, "%s.%s %s", name, key,
					     dg_fmt_name((dg_fmt)f));
		}
		/* every op is in the default set, as often as its build lists say */
		size_t want = build_product((dg_op)i);
		cr_expect_gt(want, 0);
		cr_expect_eq(num(cJSON_GetObjectItem(ds, "per_op"), name), (double)want, "%s", name);
		total += want;
		i++;
	}
	cr_expect_eq(total, DG__SPECSET_DEFAULT_SIZE, "DG__SPECSET_DEFAULT_SIZE is stale");
	cr_expect_eq(num(ds, "size"), DG__SPECSET_DEFAULT_SIZE);
	cr_expect_eq(num(ds, "dropped"), 0);
	cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(ds, "specs")),
		     DG__SPECSET_DEFAULT_SIZE);
	cJSON_Delete(j);
	run_free(&r);
	gen(&sb, &r, "list", NULL);
	cr_expect_eq(r.code, 0);
	for (int op = 0; op < DG_OP__COUNT; op++)
		cr_expect(strstr(r.out, dg_op_info_of((dg_op)op)->about) != NULL, "%s",
			  dg_op_name((dg_op)op));
	cr_expect(strstr(r.out, "--out-format") && strstr(r.out, "ternary"), "%s", r.out);
	run_free(&r);
	sandbox_fini(&sb);
}
