/*
 * Codegen: the Lua sandbox (errors name template file:line, runaway loops
 * and memory hogs are stopped, no io/os), and rendering of every valid
 * combination with the real templates.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "dragon/codegen.h"
#include "helpers.h"

/* A template folder holding one dragon.lua (and optional helper.lua). */
static char *tpl_dir(const char *dragon_lua, const char *helper_lua)
{
	char *dir = dg_test_tmpdir();
	dg_test_write_file(dir, "dragon.lua", dragon_lua);
	if (helper_lua)
		dg_test_write_file(dir, "helper.lua", helper_lua);
	return dir;
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

static const char *ok_body =
	"return { render = function(spec)\n"
	"  return '// ' .. spec.canonical .. '\\n', {'k'}, 'k.cu'\n"
	"end }\n";

Test(codegen_sandbox, minimal_template_renders)
{
	char *dir = tpl_dir(ok_body, NULL);
	dg_codegen *cg = NULL;
	dg_source *src = NULL;
	cr_assert_eq(render_with(dir, &cg, &src), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert(strstr(src->text, "op=lowrank_fwd;"));
	cr_assert(strstr(src->text, "tile=128x128x64/2x4/4;"), "tile must be resolved: %s", src->text);
	cr_assert_str_eq(src->name, "k.cu");
	cr_assert_eq(src->n_entries, 1);
	cr_assert_str_eq(src->entries[0], "k");
	cr_assert_str_eq(dg_codegen_template_origin(cg), dir);
	cr_assert_eq(strlen(dg_codegen_template_hash(cg)), 64);
	dg_source_destroy(src);
	dg_codegen_destroy(cg);
	dg_test_rmtree(dir);
}

Test(codegen_sandbox, runtime_error_names_file_and_line)
{
	char *dir = tpl_dir("local h = require('helper')\n"
			    "return { render = function(spec) return h.go(spec) end }\n",
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
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_ERR_TEMPLATE);
	dg_codegen_destroy(cg);
	dg_test_rmtree(dir);
}

Test(codegen_sandbox, runaway_loop_hits_the_instruction_budget)
{
	char *dir = tpl_dir("return { render = function(spec)\n"
			    "  local i = 0\n  while true do i = i + 1 end\nend }\n",
			    NULL);
	dg_codegen_opts o = { .template_dir = dir, .instr_limit = 2000000 };
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, &o), DG_OK);
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	dg_source *src = NULL;
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_ERR_TEMPLATE);
	cr_assert(strstr(dg_codegen_errmsg(cg), "templates/dragon.lua:3:"), "%s", dg_codegen_errmsg(cg));
	cr_assert(strstr(dg_codegen_errmsg(cg), "instruction budget"), "%s", dg_codegen_errmsg(cg));
	dg_codegen_destroy(cg);
	dg_test_rmtree(dir);
}

Test(codegen_sandbox, memory_cap_stops_a_hog)
{
	char *dir = tpl_dir("return { render = function(spec)\n"
			    "  local t = {}\n  for i = 1, 1e9 do t[i] = string.rep('x', 1000) .. i end\nend }\n",
			    NULL);
	dg_codegen_opts o = { .template_dir = dir, .mem_limit = 8 << 20, .instr_limit = 1000000000L };
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, &o), DG_OK);
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	dg_source *src = NULL;
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_ERR_NOMEM, "%s", dg_codegen_errmsg(cg));
	/* the state is still usable afterwards (the hog's garbage is freed) */
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_ERR_NOMEM);
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
		char body[512];
		snprintf(body, sizeof(body),
			 "return { render = function(spec)\n  local x = %s\n  return 'x', {'k'}, 'k.cu'\nend }\n",
			 probes[i]);
		char *dir = tpl_dir(body, NULL);
		dg_codegen *cg = NULL;
		dg_source *src = NULL;
		cr_assert_eq(render_with(dir, &cg, &src), DG_ERR_TEMPLATE, "%s was allowed", probes[i]);
		cr_assert(strstr(dg_codegen_errmsg(cg), "templates/dragon.lua:2:"), "%s: %s",
			  probes[i], dg_codegen_errmsg(cg));
		dg_codegen_destroy(cg);
		dg_test_rmtree(dir);
	}
}

Test(codegen_sandbox, bad_return_values_are_reported)
{
	const char *bodies[] = {
		"return { render = function(spec) return 42, {'k'}, 'k.cu' end }\n",
		"return { render = function(spec) return 'x', 'k', 'k.cu' end }\n",
		"return { render = function(spec) return 'x', {}, 'k.cu' end }\n",
		"return { render = function(spec) return 'x', {1}, 'k.cu' end }\n",
		"return { render = function(spec) return 'x', {'k'} end }\n",
		"return { }\n",
		"return 5\n",
	};
	for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
		char *dir = tpl_dir(bodies[i], NULL);
		dg_codegen *cg = NULL;
		dg_source *src = NULL;
		cr_assert_eq(render_with(dir, &cg, &src), DG_ERR_TEMPLATE, "case %zu accepted", i);
		cr_assert(dg_codegen_errmsg(cg)[0]);
		cr_assert_null(src);
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

Test(codegen_templates, every_valid_combination_renders, .timeout = 300)
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
