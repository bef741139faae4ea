/*
 * Codegen: the Lua sandbox (errors name template file:line, runaway loops
 * and memory hogs are stopped, no io/os, every module the op table names
 * loads at create), the host's checks of what a template answers, the
 * templates' plans (a tile refused with its rule, an auto tile resolved,
 * the arch-specific move of dg_codegen_plan_for), rendering of every
 * valid combination with the real templates, and the template hash: over
 * the files sorted by name and length-prefixed, so a copy of templates/
 * hashes as the embedded set.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "base/embedded.h"
#include "dragon/codegen.h"
#include "helpers.h"

static char *tpl_dir(const char *dragon_lua, const char *helper_lua)
{
	return dg_test_template_dir(dragon_lua, helper_lua);
}

static dg_status render_with(const char *dir, dg_codegen **cg, dg_source **src)
{
	dg_codegen_opts o = { .template_dir = dir };
	dg_status st = dg_codegen_create(cg, &o);
	if (st)
		return st;
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	return dg_codegen_render(*cg, &s, src);
}

/* dragon.lua with a plan that resolves an auto tile to 128x128x64/2x4/4 (a
 * thread count for element-wise ops) and the given render body. */
#define PLAN_OK                                                                          \
	"local function plan(spec)\n"                                                    \
	"  local t = spec.tile\n"                                                        \
	"  if t.bm == 0 and t.threads == 0 then\n"                                       \
	"    if spec.module == 'lowrank' then t = { bm = 128, bn = 128, bk = 64, wm = 2, wn = 4, stages = 4, threads = 0 }\n" \
	"    else t = { bm = 0, bn = 0, bk = 0, wm = 0, wn = 0, stages = 0, threads = 256 } end\n" \
	"  end\n"                                                                        \
	"  return { tile = t, path = 'test', name = 'k.cu', entries = { { name = 'k', threads = 128, smem = 1024 } } }\n" \
	"end\n"
#define TPL(render_body) PLAN_OK "return { plan = plan, render = function(spec)\n" render_body "end }\n"

static const char *ok_body = TPL("  return '// ' .. spec.canonical .. '\\n'\n");

Test(codegen_sandbox, minimal_template_renders)
{
	char *dir = tpl_dir(ok_body, NULL);
	dg_codegen *cg = NULL;
	dg_source *src = NULL;
	cr_assert_eq(render_with(dir, &cg, &src), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert(strstr(src->text, "op=lowrank_fwd;"));
	cr_assert(strstr(src->text, "tile=128x128x64/2x4/4;"), "tile must be resolved: %s", src->text);
	cr_assert(strncmp(src->text + 3, src->canonical, strlen(src->canonical)) == 0, "%s", src->text);
	cr_assert_str_eq(src->name, "k.cu");
	cr_assert_eq(src->n_entries, 1);
	cr_assert_str_eq(src->entries[0], "k");
	cr_assert_eq(src->block_threads[0], 128);
	cr_assert_eq(src->dyn_smem[0], 1024);
	cr_assert_str_eq(dg_codegen_template_origin(cg), dir);
	cr_assert_eq(strlen(dg_codegen_template_hash(cg)), 64);
	dg_source_destroy(src);
	dg_codegen_destroy(cg);
	dg_test_rmtree(dir);
}

Test(codegen_sandbox, runtime_error_names_file_and_line)
{
	char *dir = tpl_dir("local h = require('helper')\n"
			    "return { plan = function(spec) return h.go(spec) end,\n"
			    "  render = function(spec) return 'x' end }\n",
			    "local M = {}\n"
			    "function M.go(spec)\n"
			    "  error('latent too big for this tile')\n"
			    "end\n"
			    "return M\n");
	dg_codegen *cg = NULL;
	dg_source *src = NULL;
	cr_assert_eq(render_with(dir, &cg, &src), DG_ERR_TEMPLATE);
	cr_assert_null(src);
	const char *m = dg_codegen_errmsg(cg);
	cr_assert(strncmp(m, "templates/helper.lua:3: latent too big", 38) == 0, "got: %s", m);
	cr_assert(strstr(m, "traceback"), "a traceback follows: %s", m);
	/* a plan that raises is a template bug, not a refusal */
	dg_spec s;
	dg_plan p;
	dg_spec_init(&s, DG_OP_PACK_I8X4);
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_TEMPLATE);
	dg_codegen_destroy(cg);
	dg_test_rmtree(dir);

	/* the same in render, after a plan that worked */
	dir = tpl_dir(PLAN_OK "local h = require('helper')\n"
			      "return { plan = plan, render = function(spec) return h.go(spec) end }\n",
		      "local M = {}\n"
		      "function M.go(spec)\n"
		      "  error('no such path')\n"
		      "end\n"
		      "return M\n");
	cr_assert_eq(render_with(dir, &cg, &src), DG_ERR_TEMPLATE);
	cr_assert(strncmp(dg_codegen_errmsg(cg), "templates/helper.lua:3: no such path", 36) == 0,
		  "got: %s", dg_codegen_errmsg(cg));
	dg_codegen_destroy(cg);
	dg_test_rmtree(dir);
}

Test(codegen_sandbox, a_refusal_is_a_spec_error_with_its_message)
{
	char *dir = tpl_dir("return { plan = function(spec) return nil, 'tile=auto: no tile fits latent=' .. spec.latent end,\n"
			    "  render = function(spec) return 'x' end }\n",
			    NULL);
	dg_codegen *cg = NULL;
	dg_source *src = NULL;
	cr_assert_eq(render_with(dir, &cg, &src), DG_ERR_INVALID_SPEC);
	cr_assert_str_eq(dg_codegen_errmsg(cg), "tile=auto: no tile fits latent=8192");
	cr_assert_null(src);
	dg_codegen_destroy(cg);
	dg_test_rmtree(dir);
}

Test(codegen_sandbox, syntax_error_fails_at_create_with_location)
{
	char *dir = tpl_dir("return { render = function(spec)\n  return 'x' +\nend }\n", NULL);
	dg_codegen_opts o = { .template_dir = dir };
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, &o), DG_ERR_TEMPLATE);
	cr_assert_not_null(cg, "the handle carries the message");
	cr_assert(strstr(dg_codegen_errmsg(cg), "templates/dragon.lua:3:"), "got: %s",
		  dg_codegen_errmsg(cg));
	/* and later calls fail the same way */
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	dg_source *src = NULL;
	dg_plan p;
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_ERR_TEMPLATE);
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_TEMPLATE);
	cr_assert(strstr(dg_codegen_errmsg(cg), "templates/dragon.lua:3:"));
	dg_codegen_destroy(cg);
	dg_test_rmtree(dir);
}

Test(codegen_sandbox, a_module_that_does_not_load_fails_at_create)
{
	char *dir = tpl_dir(ok_body, NULL);
	dg_test_write_file(dir, "decoder.lua", "local M = {}\nM.x = = 1\nreturn M\n");
	dg_codegen_opts o = { .template_dir = dir };
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, &o), DG_ERR_TEMPLATE);
	cr_assert(strstr(dg_codegen_errmsg(cg), "templates/decoder.lua:2:"), "got: %s",
		  dg_codegen_errmsg(cg));
	dg_codegen_destroy(cg);
	dg_test_rmtree(dir);
	/* a module the op table names that is missing */
	dir = tpl_dir(ok_body, NULL);
	char path[1024];
	snprintf(path, sizeof(path), "%s/grad.lua", dir);
	cr_assert_eq(unlink(path), 0);
	o.template_dir = dir;
	cr_assert_eq(dg_codegen_create(&cg, &o), DG_ERR_TEMPLATE);
	cr_assert(strstr(dg_codegen_errmsg(cg), "templates/grad.lua"), "got: %s", dg_codegen_errmsg(cg));
	dg_codegen_destroy(cg);
	dg_test_rmtree(dir);
}

Test(codegen_sandbox, runaway_loop_hits_the_instruction_budget)
{
	char *dir = tpl_dir(TPL("  local i = 0\n  while true do i = i + 1 end\n"), NULL);
	dg_codegen_opts o = { .template_dir = dir, .instr_limit = 2000000 };
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, &o), DG_OK, "%s", dg_codegen_errmsg(cg));
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	dg_source *src = NULL;
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_ERR_TEMPLATE);
	/* line 11: PLAN_OK is 8 lines, then "return {", then the body */
	cr_assert(strstr(dg_codegen_errmsg(cg), "templates/dragon.lua:11:"), "%s", dg_codegen_errmsg(cg));
	cr_assert(strstr(dg_codegen_errmsg(cg), "instruction budget"), "%s", dg_codegen_errmsg(cg));
	dg_codegen_destroy(cg);
	dg_test_rmtree(dir);
}

Test(codegen_sandbox, memory_cap_stops_a_hog)
{
	char *dir = tpl_dir(TPL("  local t = {}\n  for i = 1, 1e9 do t[i] = string.rep('x', 1000) .. i end\n"),
			    NULL);
	dg_codegen_opts o = { .template_dir = dir, .mem_limit = 8 << 20, .instr_limit = 1000000000L };
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, &o), DG_OK, "%s", dg_codegen_errmsg(cg));
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	dg_source *src = NULL;
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_ERR_NOMEM, "%s", dg_codegen_errmsg(cg));
	/* the state is still usable afterwards (the hog's garbage is freed) */
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_ERR_NOMEM);
	dg_plan p;
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	dg_codegen_destroy(cg);
	dg_test_rmtree(dir);
}

Test(codegen_sandbox, no_io_os_load_or_dump)
{
	const char *probes[] = { "io.open('/etc/passwd')", "os.execute('true')",
				 "load('return 1')", "dofile('/etc/passwd')",
				 "string.dump(print)", "package.loadlib('x','y')",
				 "debug.getinfo(1)", "require('../x')",
				 "require('nosuchmodule')" };
	for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
		char body[1024];
		snprintf(body, sizeof(body),
			 PLAN_OK "return { plan = plan, render = function(spec)\n  local x = %s\n  return 'x'\nend }\n",
			 probes[i]);
		char *dir = tpl_dir(body, NULL);
		dg_codegen *cg = NULL;
		dg_source *src = NULL;
		cr_assert_eq(render_with(dir, &cg, &src), DG_ERR_TEMPLATE, "%s was allowed", probes[i]);
		cr_assert(strstr(dg_codegen_errmsg(cg), "templates/dragon.lua:10:"), "%s: %s",
			  probes[i], dg_codegen_errmsg(cg));
		dg_codegen_destroy(cg);
		dg_test_rmtree(dir);
	}
}

/* What the host itself checks of a plan and a render (a template set of
 * its own, without the real dragon.lua's checks). */
Test(codegen_sandbox, bad_return_values_are_reported)
{
#define RET(plan_ret, render_ret)                                                        \
	"return { plan = function(spec) return " plan_ret " end,\n"                     \
	"  render = function(spec) return " render_ret " end }\n"
#define GOOD_TILE "{ bm = 64, bn = 64, bk = 64, wm = 2, wn = 2, stages = 2, threads = 0 }"
#define ENTRIES "{ { name = 'k', threads = 64 } }"
	const char *bodies[] = {
		RET("{ tile = " GOOD_TILE ", path = 'p', name = 'k.cu', entries = " ENTRIES " }", "42"),
		RET("{ tile = " GOOD_TILE ", path = 'p', name = 'k.cu', entries = " ENTRIES " }", "nil"),
		RET("{ tile = " GOOD_TILE ", path = 'p', name = 'k.cu', entries = {} }", "'x'"),
		RET("{ tile = " GOOD_TILE ", path = 'p', name = 'k.cu', entries = { { name = 1 } } }", "'x'"),
		RET("{ tile = " GOOD_TILE ", path = 'p', entries = " ENTRIES " }", "'x'"),
		RET("{ tile = " GOOD_TILE ", path = 42, name = 'k.cu', entries = " ENTRIES " }", "'x'"),
		RET("{ tile = " GOOD_TILE ", path = 'p', name = 'k.cu', entries = { "
		    "{ name = 'a' }, { name = 'b' }, { name = 'c' }, { name = 'd' }, { name = 'e' }, "
		    "{ name = 'f' }, { name = 'g' }, { name = 'h' }, { name = 'i' } } }", "'x'"),
		/* the tile the plan resolves must still be of the op's kind */
		RET("{ tile = { bm = 0, bn = 0, bk = 0, wm = 0, wn = 0, stages = 0, threads = 256 }, "
		    "path = 'p', name = 'k.cu', entries = " ENTRIES " }", "'x'"),
		/* and not left auto */
		RET("{ tile = { bm = 0, bn = 0, bk = 0, wm = 0, wn = 0, stages = 0, threads = 0 }, "
		    "path = 'p', name = 'k.cu', entries = " ENTRIES " }", "'x'"),
		/* an arch-specific path on a portable target */
		RET("{ tile = " GOOD_TILE ", arch_specific = true, path = 'p', name = 'k.cu', entries = " ENTRIES " }",
		    "'x'"),
		/* a refusal without a message, and a plan that is not a table:
		 * the host checks what dragon.lua returns, not only dragon.lua */
		RET("nil", "'x'"),
		RET("nil, 42", "'x'"),
		RET("7", "'x'"),
		"return { render = function(spec) return 'x' end }\n",
		"return { }\n",
		"return 5\n",
	};
#undef RET
	for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
		char *dir = tpl_dir(bodies[i], NULL);
		dg_codegen *cg = NULL;
		dg_source *src = NULL;
		cr_assert_eq(render_with(dir, &cg, &src), DG_ERR_TEMPLATE, "case %zu accepted: %s", i,
			     dg_codegen_errmsg(cg));
		cr_assert(dg_codegen_errmsg(cg)[0]);
		cr_assert_null(src);
		dg_codegen_destroy(cg);
		dg_test_rmtree(dir);
	}
}

/* The real dragon.lua checks the shape of every module's plan: a copy of
 * the templates whose pack module answers badly. */
Test(codegen_sandbox, dragon_lua_checks_each_modules_plan)
{
	const char *plans[] = {
		"return { tile = { bm = 0, bn = 0, bk = 0, wm = 0, wn = 0, stages = 0, threads = 'x' }, path = 'p', "
		"name = 'k.cu', entries = { { name = 'k', threads = 64 } } }",
		"return { tile = { bm = 0, bn = 0, bk = 0, wm = 0, wn = 0, stages = 0, threads = 256 }, path = 'p', "
		"name = 'k.cu', entries = { { name = 'k', threads = 2048 } } }",
		"return nil",
		"return 7",
	};
	const char *want[] = { "tile.threads=x must be a non-negative integer", "entries[1] must be",
			       "plan returned nil without a message", "must return { tile, path, name, entries }" };
	for (size_t i = 0; i < sizeof(plans) / sizeof(plans[0]); i++) {
		char *dir = dg_test_tmpdir();
		char cmd[2048];
		snprintf(cmd, sizeof(cmd), "cp %s/templates/*.lua %s/", DG_SOURCE_DIR, dir);
		cr_assert_eq(system(cmd), 0);
		char body[1024];
		snprintf(body, sizeof(body),
			 "return { plan = function(spec) %s end, render = function(spec, p) return 'x' end }\n",
			 plans[i]);
		dg_test_write_file(dir, "pack.lua", body);
		dg_codegen_opts o = { .template_dir = dir };
		dg_codegen *cg = NULL;
		cr_assert_eq(dg_codegen_create(&cg, &o), DG_OK, "%s", dg_codegen_errmsg(cg));
		dg_spec s;
		dg_plan p;
		dg_spec_init(&s, DG_OP_PACK_I8X4);
		cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_TEMPLATE, "case %zu accepted", i);
		cr_assert(strstr(dg_codegen_errmsg(cg), "templates/pack.lua: plan"), "case %zu: %s", i,
			  dg_codegen_errmsg(cg));
		cr_assert(strstr(dg_codegen_errmsg(cg), want[i]), "case %zu: %s", i, dg_codegen_errmsg(cg));
		/* the other modules still plan */
		dg_spec_init(&s, DG_OP_LOWRANK_FWD);
		cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
		dg_codegen_destroy(cg);
		dg_test_rmtree(dir);
	}
}

Test(codegen_sandbox, missing_folder_is_an_io_error)
{
	dg_codegen_opts o = { .template_dir = "/nonexistent/dragon-templates" };
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, &o), DG_ERR_IO);
	cr_assert(strstr(dg_codegen_errmsg(cg), "/nonexistent/dragon-templates"));
	dg_codegen_destroy(cg);
	dg_codegen_destroy(NULL);
	dg_source_destroy(NULL);
}

Test(codegen_sandbox, env_override_and_hash_tracks_content)
{
	char *a = tpl_dir(ok_body, NULL);
	char *b = tpl_dir(ok_body, "-- one more file\nreturn {}\n");
	setenv("DRAGON_TEMPLATE_DIR", a, 1);
	dg_codegen *ca = NULL, *cb = NULL, *cc = NULL;
	cr_assert_eq(dg_codegen_create(&ca, NULL), DG_OK);
	cr_assert_str_eq(dg_codegen_template_origin(ca), a);
	setenv("DRAGON_TEMPLATE_DIR", b, 1);
	cr_assert_eq(dg_codegen_create(&cb, NULL), DG_OK);
	cr_assert_str_neq(dg_codegen_template_hash(ca), dg_codegen_template_hash(cb));
	unsetenv("DRAGON_TEMPLATE_DIR");
	cr_assert_eq(dg_codegen_create(&cc, NULL), DG_OK);
	cr_assert_str_eq(dg_codegen_template_origin(cc), "embedded");
	dg_codegen_destroy(ca);
	dg_codegen_destroy(cb);
	dg_codegen_destroy(cc);
	dg_test_rmtree(a);
	dg_test_rmtree(b);
}

/* The set's hash is over its files sorted by name, each length-prefixed:
 * two orders of one set agree, and sets that differ only in where one
 * file's name or bytes end do not. The value is the format's, worked out
 * apart (Python: sha256 of <Q 2, then <Q 5 "a.lua" <Q 2 "yz", then
 * <Q 5 "b.lua" <Q 1 "x", each <Q an 8-byte little-endian length). */
Test(codegen_sandbox, set_hash_is_over_sorted_length_prefixed_files)
{
	const unsigned char yz[] = "yz", x[] = "x", c[] = "c", bc[] = "bc", none[] = "";
	const dg__embedded_file ab[] = { { "a.lua", yz, 2 }, { "b.lua", x, 1 } };
	const dg__embedded_file ba[] = { { "b.lua", x, 1 }, { "a.lua", yz, 2 } };
	char h1[65], h2[65], h3[65];
	cr_assert_eq(dg__embedded_hash(ab, 2, h1), DG_OK);
	cr_assert_eq(dg__embedded_hash(ba, 2, h2), DG_OK);
	cr_assert_str_eq(h1, h2, "the order of the files changed the hash");
	cr_assert_str_eq(h1, "e34dedf66ca80814d80aa7182eb88df298251a0cbb64e25bd94c12f4d8c01745");
	cr_assert_eq(dg__embedded_hash(NULL, 0, h3), DG_OK);
	cr_assert_str_eq(h3, "af5570f5a1810b7af78caf4bc70a660f0df51e42baf91d4de5b2328de0e83dfc");

	/* "ab" + "c" against "a" + "bc"; one file "a" + "" against none */
	const dg__embedded_file s1[] = { { "ab", c, 1 } }, s2[] = { { "a", bc, 2 } };
	const dg__embedded_file s3[] = { { "a", none, 0 } };
	cr_assert_eq(dg__embedded_hash(s1, 1, h1), DG_OK);
	cr_assert_eq(dg__embedded_hash(s2, 1, h2), DG_OK);
	cr_assert_str_neq(h1, h2);
	cr_assert_eq(dg__embedded_hash(s3, 1, h1), DG_OK);
	cr_assert_str_neq(h1, h3);
	/* the same name twice: the order of their bytes does not show either */
	const dg__embedded_file d1[] = { { "a", c, 1 }, { "a", bc, 2 } };
	const dg__embedded_file d2[] = { { "a", bc, 2 }, { "a", c, 1 } };
	cr_assert_eq(dg__embedded_hash(d1, 2, h1), DG_OK);
	cr_assert_eq(dg__embedded_hash(d2, 2, h2), DG_OK);
	cr_assert_str_eq(h1, h2);
}

/* A folder holding the same files as the embedded set (made in reverse
 * name order) is the same template set: the same hash, so the same cache
 * keys and bundles the stock library loads, by opts and by the
 * environment alike. */
Test(codegen_templates, a_copy_of_templates_hashes_as_the_embedded_set)
{
	char *dir = dg_test_templates_copy();
	dg_codegen *emb = NULL, *by_opts = NULL, *by_env = NULL;
	unsetenv("DRAGON_TEMPLATE_DIR");
	cr_assert_eq(dg_codegen_create(&emb, NULL), DG_OK, "%s", dg_codegen_errmsg(emb));
	dg_codegen_opts o = { .template_dir = dir };
	cr_assert_eq(dg_codegen_create(&by_opts, &o), DG_OK, "%s", dg_codegen_errmsg(by_opts));
	setenv("DRAGON_TEMPLATE_DIR", dir, 1);
	cr_assert_eq(dg_codegen_create(&by_env, NULL), DG_OK, "%s", dg_codegen_errmsg(by_env));
	unsetenv("DRAGON_TEMPLATE_DIR");
	cr_assert_str_eq(dg_codegen_template_origin(emb), "embedded");
	cr_assert_str_eq(dg_codegen_template_origin(by_env), dir);
	cr_assert_str_eq(dg_codegen_template_hash(by_opts), dg_codegen_template_hash(emb),
			 "a byte-identical copy of templates/ hashes apart from the embedded set");
	cr_assert_str_eq(dg_codegen_template_hash(by_env), dg_codegen_template_hash(emb));
	dg_codegen_destroy(emb);
	dg_codegen_destroy(by_opts);
	dg_codegen_destroy(by_env);

	/* one byte more in one file is another set */
	char path[1100];
	snprintf(path, sizeof(path), "%s/step.lua", dir);
	FILE *f = fopen(path, "ab");
	cr_assert_not_null(f);
	fputc('\n', f);
	cr_assert_eq(fclose(f), 0);
	cr_assert_eq(dg_codegen_create(&emb, NULL), DG_OK);
	cr_assert_eq(dg_codegen_create(&by_opts, &o), DG_OK, "%s", dg_codegen_errmsg(by_opts));
	cr_assert_str_neq(dg_codegen_template_hash(by_opts), dg_codegen_template_hash(emb));
	dg_codegen_destroy(emb);
	dg_codegen_destroy(by_opts);
	dg_test_rmtree(dir);
}

Test(codegen_sandbox, invalid_spec_is_refused_before_lua)
{
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	s.latent = 8190;
	dg_source *src = NULL;
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_codegen_errmsg(cg), "latent=8190"));
	cr_assert_eq(dg_codegen_render(cg, NULL, &src), DG_ERR_INVALID_ARG);
	dg_codegen_destroy(cg);
}

/* ---- plans: the template's rules for a tile ------------------------------- */

/* text parses and validates, but its template refuses the tile with want;
 * the message starts with "tile=<the tile>: " and render refuses it too. */
static void plan_refuses(dg_codegen *cg, const char *text, const char *want)
{
	dg_spec s = dg_test_spec_parse(text);
	dg_plan p;
	dg_source *src = (dg_source *)0x1;
	char head[96], tb[64];

	cr_assert_eq(dg_spec_validate(&s, NULL, 0), DG_OK, "%s", text);
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC, "%s was planned", text);
	const char *m = dg_codegen_errmsg(cg);
	dg_tile_to_string(&s.tile, tb, sizeof(tb));
	snprintf(head, sizeof(head), "tile=%s: ", tb);
	cr_assert(strncmp(m, head, strlen(head)) == 0, "%s: '%s' does not start with '%s'", text, m, head);
	cr_assert(strstr(m, want), "%s: '%s' lacks '%s'", text, m, want);
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_ERR_INVALID_SPEC, "%s was rendered", text);
	cr_assert_null(src);
	cr_assert(strstr(dg_codegen_errmsg(cg), want), "render: %s", dg_codegen_errmsg(cg));
}

Test(codegen_plan, refuses_tiles_it_cannot_run)
{
	dg_codegen *cg = dg_test_codegen();
	plan_refuses(cg, "op=lowrank_fwd;tile=48x64x64/2x2/2", "BM and BN must be powers of two from 16 to 256");
	plan_refuses(cg, "op=lowrank_fwd;tile=64x64x64/2x2/2;embd=96", "BK=64 must divide embd=96");
	plan_refuses(cg, "op=lowrank_fwd;tile=64x64x16/2x2/2;weight=sign1", "BK must be a multiple of 32");
	plan_refuses(cg, "op=lowrank_fwd;tile=64x64x64/3x2/2", "WM and WN");
	plan_refuses(cg, "op=lowrank_fwd;tile=256x256x64/1x1/2", "outputs per thread");
	plan_refuses(cg, "op=lowrank_fwd;tile=128x128x128/4x4/2;weight=f32;act=f32", "shared memory");
	plan_refuses(cg, "op=lowrank_fwd;tile=64x64x64/2x2/5", "stages");
	plan_refuses(cg, "op=quantize_act;tile=t100", "multiple of 32");
	plan_refuses(cg, "op=pack_i8x4;tile=t2048", "between 32 and 1024");
	plan_refuses(cg, "op=quantize_weight;tile=t16", "between 32 and 1024");
	plan_refuses(cg, "op=pack_ternary;tile=t48", "multiple of 32");
	/* asked again, the cached refusal says the same */
	plan_refuses(cg, "op=lowrank_fwd;tile=48x64x64/2x2/2", "BM and BN must be powers of two from 16 to 256");
	dg_codegen_destroy(cg);
}

Test(codegen_plan, invalid_specs_and_arguments)
{
	dg_codegen *cg = dg_test_codegen();
	dg_spec s;
	dg_plan p;
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	s.latent = 8190;
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_codegen_errmsg(cg), "latent=8190: must be a multiple of 4"), "%s",
		  dg_codegen_errmsg(cg));
	cr_assert_eq(dg_codegen_plan(cg, NULL, &p), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_codegen_plan(cg, &s, NULL), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_codegen_plan(NULL, &s, &p), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_codegen_plan_for(cg, NULL, 90, &p), DG_ERR_INVALID_ARG);
	dg_codegen_destroy(cg);
}

/* Plans a spec, then the plan's own spec: a resolved tile plans to itself. */
static dg_plan plan_twice(dg_codegen *cg, const dg_spec *s)
{
	dg_plan p, q;
	char c[DG_SPEC_TEXT_MAX], m[512];

	cr_assert_eq(dg_spec_to_string(s, c, sizeof(c)), DG_OK);
	cr_assert_eq(dg_codegen_plan(cg, s, &p), DG_OK, "%s: %s", c, dg_codegen_errmsg(cg));
	cr_assert_not(dg_tile_is_auto(&p.spec.tile), "%s: tile left auto", c);
	cr_assert_eq(dg_spec_validate(&p.spec, m, sizeof(m)), DG_OK, "%s: %s", p.canonical, m);
	char pc[DG_SPEC_TEXT_MAX];
	cr_assert_eq(dg_spec_to_string(&p.spec, pc, sizeof(pc)), DG_OK);
	cr_assert_str_eq(pc, p.canonical);
	cr_assert_eq(dg_codegen_plan(cg, &p.spec, &q), DG_OK, "%s: %s", p.canonical, dg_codegen_errmsg(cg));
	cr_assert_str_eq(q.canonical, p.canonical);
	cr_assert_str_eq(q.path, p.path);
	cr_assert_str_eq(q.program, p.program);
	cr_assert_eq(q.needs_arch_specific, p.needs_arch_specific);
	cr_assert_eq(q.n_entries, p.n_entries, "%s", p.canonical);
	for (int i = 0; i < p.n_entries; i++) {
		cr_assert_str_eq(q.entries[i].name, p.entries[i].name);
		cr_assert_eq(q.entries[i].threads, p.entries[i].threads, "%s", p.canonical);
		cr_assert_eq(q.entries[i].smem, p.entries[i].smem, "%s", p.canonical);
	}
	if (p.needs_arch_specific)
		cr_assert(p.spec.arch_specific, "%s: an arch-specific path on a portable target", p.canonical);
	return p;
}

/* An auto tile becomes the template's default for every format pair, embd
 * and arch, and that default plans again to the same kernel. */
Test(codegen_plan, auto_tile_resolves_for_every_format)
{
	const dg_fmt w[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_TERNARY, DG_FMT_SIGN1 };
	const dg_fmt a[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_INT4, DG_FMT_UINT8POS };
	const int embd[] = { 32, 64, 96, 256, 4096 };
	const int arch[][2] = { { 80, 0 }, { 90, 0 }, { 90, 1 } };
	const dg_op ops[] = { DG_OP_LOWRANK_FWD, DG_OP_RELU_MASK, DG_OP_DECODER_FWD };
	dg_codegen *cg = dg_test_codegen();
	int n = 0;
	for (size_t o = 0; o < 3; o++)
		for (int i = 0; i < 5; i++)
			for (int j = 0; j < 5; j++)
				for (int e = 0; e < 5; e++)
					for (int r = 0; r < 3; r++) {
						dg_spec s;
						dg_spec_init(&s, ops[o]);
						s.weight = w[i];
						s.act = a[j];
						s.embd = embd[e];
						s.arch = arch[r][0];
						s.arch_specific = arch[r][1];
						if (dg_spec_validate(&s, NULL, 0))
							continue; /* e.g. embd=96 with sign1 */
						plan_twice(cg, &s);
						n++;
					}
	cr_assert_gt(n, 800);
	for (int i = 0; i < DG_OP__COUNT; i++) {
		dg_spec s;
		dg_spec_init(&s, (dg_op)i);
		plan_twice(cg, &s);
	}
	dg_codegen_destroy(cg);
}

Test(codegen_plan, plan_for_moves_an_auto_tile_to_the_arch_specific_target)
{
	dg_codegen *cg = dg_test_codegen();
	dg_plan p;
	dg_spec s = dg_test_spec_parse("op=lowrank_fwd;weight=ternary;relu=0");
	/* on the spec's own arch, sm_90: the warpgroup path of sm_90a */
	cr_assert_eq(dg_codegen_plan_for(cg, &s, 90, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert(p.spec.arch_specific && p.needs_arch_specific, "%s", p.canonical);
	cr_assert_str_eq(p.path, "wgmma");
	dg_plan q;
	cr_assert_eq(dg_codegen_plan_for(cg, &s, 0, &q), DG_OK);
	cr_assert_str_eq(q.canonical, p.canonical, "device_sm 0 is the spec's arch");
	/* the plain plan stays portable */
	cr_assert_eq(dg_codegen_plan(cg, &s, &q), DG_OK);
	cr_assert_not(q.spec.arch_specific);
	cr_assert_not(q.needs_arch_specific);
	cr_assert_str_neq(q.path, "wgmma");
	/* another device's SM, an explicit tile, an arch without "a": plan as is */
	cr_assert_eq(dg_codegen_plan_for(cg, &s, 100, &q), DG_OK);
	cr_assert_not(q.spec.arch_specific);
	dg_spec t = dg_test_spec_parse("op=lowrank_fwd;weight=ternary;relu=0;tile=64x64x64/2x2/2");
	cr_assert_eq(dg_codegen_plan_for(cg, &t, 90, &q), DG_OK);
	cr_assert_not(q.spec.arch_specific);
	cr_assert(strstr(q.canonical, "tile=64x64x64/2x2/2;"));
	dg_spec u = dg_test_spec_parse("op=lowrank_fwd;arch=sm_80");
	cr_assert_eq(dg_codegen_plan_for(cg, &u, 80, &q), DG_OK);
	cr_assert_not(q.spec.arch_specific);
	/* an op whose default on sm_90a takes no warpgroup path stays portable */
	dg_spec g = dg_test_spec_parse("op=lowrank_grad_input");
	cr_assert_eq(dg_codegen_plan_for(cg, &g, 90, &q), DG_OK);
	cr_assert_not(q.spec.arch_specific, "%s", q.canonical);
	dg_spec e = dg_test_spec_parse("op=pack_i8x4");
	cr_assert_eq(dg_codegen_plan_for(cg, &e, 90, &q), DG_OK);
	cr_assert_not(q.spec.arch_specific, "%s", q.canonical);
	dg_codegen_destroy(cg);
}

/* bf16 × bf16 projections: an auto tile on an sm_90 device moves to the
 * sm_90a warpgroup path (the bf16 preset's projections: the
 * warp-specialized form, "wgmma bf16 tma"; "wgmma bf16" at a resident
 * tile); the portable plan, relu_mask and shapes the path refuses stay
 * fp32. */
Test(codegen_plan, bf16_projection_takes_the_warpgroup_path)
{
	dg_codegen *cg = dg_test_codegen();
	dg_plan p;
	dg_spec s = dg_test_spec_parse("op=lowrank_fwd;weight=bf16;act=bf16;out=bf16;relu=0");
	cr_assert_eq(dg_codegen_plan_for(cg, &s, 90, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert(p.spec.arch_specific && p.needs_arch_specific, "%s", p.canonical);
	cr_assert_str_eq(p.path, "wgmma bf16 tma");
	cr_assert(strstr(p.canonical, "tile=128x128x64/8x1/6;"), "%s", p.canonical);
	cr_assert_eq(p.entries[0].threads, 384);
	dg_spec r = s;
	r.tile = (dg_tile){ 128, 64, 64, 8, 1, 2, 0 };
	r.arch = 90;
	r.arch_specific = true;
	cr_assert_eq(dg_codegen_plan(cg, &r, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, "wgmma bf16");
	cr_assert_eq(p.entries[0].threads, 256);
	cr_assert_eq(p.entries[0].smem, 256 * 2 * (128 + 3 * 64));
	s.in_heads = 4;
	cr_assert_eq(dg_codegen_plan_for(cg, &s, 90, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, "wgmma bf16 tma");
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK);
	cr_assert_str_eq(p.path, "fp32");
	dg_spec m = dg_test_spec_parse("op=relu_mask;weight=bf16;act=bf16;relu=0;arch=sm_90a");
	cr_assert_eq(dg_codegen_plan(cg, &m, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, "fp32");
	dg_spec o = dg_test_spec_parse("op=lowrank_fwd;weight=bf16;act=bf16;out=bf16;relu=0;latent=200;arch=sm_90a");
	cr_assert_eq(dg_codegen_plan(cg, &o, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, "fp32", "%s", p.canonical);
	dg_codegen_destroy(cg);
}

/* A warpgroup tile (BM = 16·WM, WN = 1) takes wgmma on sm_90a only. */
Test(codegen_plan, paths_follow_the_tile_and_the_target)
{
	dg_codegen *cg = dg_test_codegen();
	dg_plan p;
	dg_spec s = dg_test_spec_parse("op=lowrank_fwd;tile=128x64x64/8x1/2;arch=sm_90a");
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, "wgmma");
	cr_assert(p.needs_arch_specific);
	s = dg_test_spec_parse("op=lowrank_fwd;tile=128x64x64/8x1/2");
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, "mma.sync");
	cr_assert_not(p.needs_arch_specific);
	s = dg_test_spec_parse("op=lowrank_fwd;arch=sm_75");
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK);
	cr_assert_str_eq(p.path, "dp4a");
	s = dg_test_spec_parse("op=lowrank_fwd;weight=f32;act=f32");
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK);
	cr_assert_str_eq(p.path, "fp32");
	s = dg_test_spec_parse("op=lowrank_grad_input");
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK);
	cr_assert_str_eq(p.path, "mma.sync bf16");
	s = dg_test_spec_parse("op=lowrank_grad_input;arch=sm_75");
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK);
	cr_assert_str_eq(p.path, "fp32");
	s = dg_test_spec_parse("op=quantize_act");
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK);
	cr_assert_str_eq(p.path, "element-wise");
	cr_assert_str_eq(p.program, "quantize_act.cu");
	cr_assert_eq(p.n_entries, 3);
	cr_assert_str_eq(p.entries[0].name, "dg_quantize_act_absum");
	dg_codegen_destroy(cg);
}

/* ---- the real templates ------------------------------------------------- */

static void check_rendered(dg_codegen *cg, const dg_spec *s)
{
	dg_source *src = NULL;
	dg_status st = dg_codegen_render(cg, s, &src);
	cr_assert_eq(st, DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert(strstr(src->text, "generated by dragon"), "banner missing");
	cr_assert(strstr(src->text, "do not edit"), "banner missing");
	cr_assert(strstr(src->text, src->canonical), "canonical spec missing from the source");
	cr_assert_eq(strlen(src->text), src->len);
	cr_assert_geq(src->n_entries, 1);
	for (int i = 0; i < src->n_entries; i++)
		cr_assert(strstr(src->text, src->entries[i]), "entry %s not in source",
			  src->entries[i]);
	dg_source_destroy(src);
}

Test(codegen_templates, every_valid_combination_renders)
{
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK, "%s", dg_codegen_errmsg(cg));
	dg_spec_list list;
	dg_test_all_specs(&list);
	cr_assert_gt(list.n, 500);
	for (size_t i = 0; i < list.n; i++)
		check_rendered(cg, &list.specs[i]);
	free(list.specs);
	dg_codegen_destroy(cg);
}

Test(codegen_templates, rendering_is_deterministic)
{
	dg_codegen *a = NULL, *b = NULL;
	cr_assert_eq(dg_codegen_create(&a, NULL), DG_OK);
	cr_assert_eq(dg_codegen_create(&b, NULL), DG_OK);
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	s.weight = DG_FMT_TERNARY;
	s.relu = true;
	s.relu_thr = 0.25f;
	dg_source *x = NULL, *y = NULL, *z = NULL;
	cr_assert_eq(dg_codegen_render(a, &s, &x), DG_OK);
	cr_assert_eq(dg_codegen_render(b, &s, &y), DG_OK);
	cr_assert_eq(dg_codegen_render(a, &s, &z), DG_OK);
	cr_assert_str_eq(x->text, y->text);
	cr_assert_str_eq(x->text, z->text);
	cr_assert_str_eq(dg_codegen_template_hash(a), dg_codegen_template_hash(b));
	/* a different threshold is a different kernel */
	s.relu_thr = 0.5f;
	dg_source *w = NULL;
	cr_assert_eq(dg_codegen_render(a, &s, &w), DG_OK);
	cr_assert_str_neq(x->text, w->text);
	dg_source_destroy(x);
	dg_source_destroy(y);
	dg_source_destroy(z);
	dg_source_destroy(w);
	dg_codegen_destroy(a);
	dg_codegen_destroy(b);
}
