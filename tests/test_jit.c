/*
 * JIT: render → key → cache → NVRTC, without a GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include <cjson/cJSON.h>

#include "dragon/jit.h"
#include "helpers.h"
#include "base/sha256.h"

static dg_ctx *make_ctx(const char *cache_dir, const char *tpl_dir)
{
	dg_ctx_opts o = { .cache_dir = cache_dir, .template_dir = tpl_dir };
	dg_ctx *ctx = NULL;
	dg_status st = dg_ctx_create(&ctx, &o);
	cr_assert_eq(st, DG_OK, "ctx: %s", dg_ctx_errmsg(ctx));
	return ctx;
}

static dg_spec ternary_spec(void)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	s.weight = DG_FMT_TERNARY;
	s.relu = true;
	s.out = DG_FMT_UINT8POS;
	s.latent = 256;
	return s;
}

Test(jit, miss_then_hit_in_a_fresh_context)
{
	char *dir = dg_test_tmpdir();
	dg_spec s = ternary_spec();
	dg_ctx *a = make_ctx(dir, NULL);
	dg_binary *b1 = NULL, *b2 = NULL;
	cr_assert_eq(dg_jit_compile(a, &s, &b1), DG_OK, "%s", dg_ctx_errmsg(a));
	cr_assert_not(b1->cache_hit);
	cr_assert_not(b1->is_ptx);
	cr_assert_eq(b1->arch, 90);
	cr_assert(b1->image_size > 64 && memcmp(b1->image, "\177ELF", 4) == 0);
	cr_assert_eq(strlen(b1->key), 64);
	cr_assert(strstr(b1->canonical, "weight=ternary;"));
	cr_assert(strstr(b1->canonical, "tile=128x128x64/2x4/4;"), "tile resolved: %s", b1->canonical);
	cr_assert_geq(b1->n_entries, 1);
	cr_assert_gt(b1->compile_ms, 0.0);
	cr_assert_not_null(b1->log);

	dg_ctx *b = make_ctx(dir, NULL);
	cr_assert_eq(dg_jit_compile(b, &s, &b2), DG_OK, "%s", dg_ctx_errmsg(b));
	cr_assert(b2->cache_hit);
	cr_assert_str_eq(b1->key, b2->key);
	cr_assert_eq(b1->image_size, b2->image_size);
	cr_assert(memcmp(b1->image, b2->image, b1->image_size) == 0);
	cr_assert_eq(b1->n_entries, b2->n_entries);
	cr_assert_str_eq(b1->entries[0], b2->entries[0]);
	cr_assert_float_eq(b1->compile_ms, b2->compile_ms, 1e-9);

	cJSON *m = cJSON_Parse(b2->meta);
	cr_assert_not_null(m);
	cr_assert_str_eq(cJSON_GetObjectItem(m, "spec")->valuestring, b1->canonical);
	cr_assert_str_eq(cJSON_GetObjectItem(m, "nvrtc_version")->valuestring, dg_nvrtc_version());
	cJSON_Delete(m);

	dg_binary_destroy(b1);
	dg_binary_destroy(b2);
	dg_ctx_destroy(a);
	dg_ctx_destroy(b);
	dg_test_rmtree(dir);
}

Test(jit, key_covers_spec_arch_and_templates)
{
	char *dir = dg_test_tmpdir();
	dg_ctx *ctx = make_ctx(dir, NULL);
	dg_spec s = ternary_spec();
	dg_binary *a = NULL, *b = NULL, *c = NULL;
	cr_assert_eq(dg_jit_compile(ctx, &s, &a), DG_OK, "%s", dg_ctx_errmsg(ctx));
	s.relu_thr = 0.5f;
	cr_assert_eq(dg_jit_compile(ctx, &s, &b), DG_OK);
	cr_assert_str_neq(a->key, b->key);
	s.relu_thr = 0.0f;
	s.arch_specific = true;
	cr_assert_eq(dg_jit_compile(ctx, &s, &c), DG_OK, "%s", dg_ctx_errmsg(ctx));
	cr_assert_str_neq(a->key, c->key);
	dg_binary_destroy(a);
	dg_binary_destroy(b);
	dg_binary_destroy(c);
	dg_ctx_destroy(ctx);

	/* A template edit changes the key: copy the templates, append a comment. */
	char *tpl = dg_test_tmpdir();
	char cmd[2048];
	snprintf(cmd, sizeof(cmd), "cp %s/templates/*.lua %s/ && echo '-- edited' >> %s/formats.lua",
		 DG_SOURCE_DIR, tpl, tpl);
	cr_assert_eq(system(cmd), 0);
	dg_ctx *e = make_ctx(dir, tpl);
	dg_ctx *f = make_ctx(dir, NULL);
	dg_binary *x = NULL, *y = NULL;
	s.arch_specific = false;
	cr_assert_eq(dg_jit_compile(e, &s, &x), DG_OK, "%s", dg_ctx_errmsg(e));
	cr_assert_eq(dg_jit_compile(f, &s, &y), DG_OK, "%s", dg_ctx_errmsg(f));
	cr_assert_str_neq(x->key, y->key);
	cr_assert_not(x->cache_hit);
	dg_binary_destroy(x);
	dg_binary_destroy(y);
	dg_ctx_destroy(e);
	dg_ctx_destroy(f);
	dg_test_rmtree(tpl);
	dg_test_rmtree(dir);
}

/* dg_jit_key is the key dg_jit_compile uses, computed without compiling:
 * the cache stays empty, and the canonical text has the tile resolved. */
Test(jit, key_without_compiling)
{
	char *dir = dg_test_tmpdir();
	dg_ctx *ctx = make_ctx(dir, NULL);
	dg_spec s = ternary_spec();
	char key[DG_CACHE_KEY_LEN + 1], canonical[DG_SPEC_TEXT_MAX];
	cr_assert_eq(dg_jit_key(ctx, &s, key, canonical), DG_OK, "%s", dg_ctx_errmsg(ctx));
	cr_assert_eq(strlen(key), 64);
	cr_assert(strstr(canonical, "tile=128x128x64/2x4/4;"), "%s", canonical);
	dg_cache_stats st;
	cr_assert_eq(dg_cache_stat(dg_ctx_cache(ctx), &st), DG_OK);
	cr_assert_eq(st.entries, 0, "dg_jit_key compiled something");
	dg_binary *b = NULL;
	cr_assert_eq(dg_jit_compile(ctx, &s, &b), DG_OK, "%s", dg_ctx_errmsg(ctx));
	cr_assert_str_eq(b->key, key);
	cr_assert_str_eq(b->canonical, canonical);
	/* the resolved spec has the same key as its auto form */
	dg_spec r;
	char m[256];
	cr_assert_eq(dg_spec_parse(canonical, &r, m, sizeof(m)), DG_OK, "%s", m);
	char key2[DG_CACHE_KEY_LEN + 1];
	cr_assert_eq(dg_jit_key(ctx, &r, key2, NULL), DG_OK);
	cr_assert_str_eq(key2, key);
	/* another spec, another key; an invalid one is refused by name */
	s.relu_thr = 0.5f;
	cr_assert_eq(dg_jit_key(ctx, &s, key2, NULL), DG_OK);
	cr_assert_str_neq(key2, key);
	s.latent = 8190;
	cr_assert_eq(dg_jit_key(ctx, &s, key2, NULL), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_ctx_errmsg(ctx), "latent=8190"), "%s", dg_ctx_errmsg(ctx));
	cr_assert_eq(dg_jit_key(ctx, NULL, key2, NULL), DG_ERR_INVALID_ARG);
	dg_binary_destroy(b);
	dg_ctx_destroy(ctx);
	dg_test_rmtree(dir);
}

/* Like sqlite3_open, a context whose templates do not load is still handed
 * out, carrying the reason; every call on it fails the same way. */
Test(jit, a_failed_context_is_handed_out_with_its_message)
{
	dg_ctx_opts o = { .no_cache = true, .template_dir = "/nonexistent/dragon-templates" };
	dg_ctx *ctx = NULL;
	cr_assert_eq(dg_ctx_create(&ctx, &o), DG_ERR_IO);
	cr_assert_not_null(ctx);
	cr_assert(strstr(dg_ctx_errmsg(ctx), "/nonexistent/dragon-templates"), "%s", dg_ctx_errmsg(ctx));
	dg_spec s = ternary_spec();
	dg_binary *b = NULL;
	cr_assert_eq(dg_jit_compile(ctx, &s, &b), DG_ERR_IO);
	cr_assert_null(b);
	char key[DG_CACHE_KEY_LEN + 1];
	cr_assert_eq(dg_jit_key(ctx, &s, key, NULL), DG_ERR_IO);
	cr_assert(strstr(dg_ctx_errmsg(ctx), "/nonexistent/dragon-templates"));
	dg_ctx_destroy(ctx);
}

Test(jit, no_cache_touches_no_disk)
{
	dg_ctx_opts o = { .no_cache = true };
	dg_ctx *ctx = NULL;
	cr_assert_eq(dg_ctx_create(&ctx, &o), DG_OK);
	cr_assert_null(dg_ctx_cache(ctx));
	dg_spec s;
	dg_spec_init(&s, DG_OP_QUANTIZE_ACT);
	dg_binary *b = NULL;
	cr_assert_eq(dg_jit_compile(ctx, &s, &b), DG_OK, "%s", dg_ctx_errmsg(ctx));
	cr_assert_not(b->cache_hit);
	cr_assert_geq(b->n_entries, 1);
	dg_binary_destroy(b);
	dg_ctx_destroy(ctx);
}

Test(jit, newer_arch_gets_ptx)
{
	char *dir = dg_test_tmpdir();
	dg_ctx *ctx = make_ctx(dir, NULL);
	dg_spec s;
	dg_spec_init(&s, DG_OP_PACK_I8X4);
	s.arch = 190;
	dg_binary *b = NULL;
	cr_assert_eq(dg_jit_compile(ctx, &s, &b), DG_OK, "%s", dg_ctx_errmsg(ctx));
	cr_assert(b->is_ptx);
	cr_assert(strstr((const char *)b->image, ".target sm_"), "PTX text expected");
	dg_binary_destroy(b);
	dg_ctx_destroy(ctx);
	dg_test_rmtree(dir);
}

Test(jit, errors_name_the_problem_and_leave_nothing)
{
	char *dir = dg_test_tmpdir();
	dg_ctx *ctx = make_ctx(dir, NULL);
	dg_spec s = ternary_spec();
	s.embd = 40;
	dg_binary *b = (dg_binary *)0x1;
	cr_assert_eq(dg_jit_compile(ctx, &s, &b), DG_ERR_INVALID_SPEC);
	cr_assert_null(b);
	cr_assert(strstr(dg_ctx_errmsg(ctx), "embd=40"), "%s", dg_ctx_errmsg(ctx));
	s = ternary_spec();
	s.arch = 52;
	cr_assert_eq(dg_jit_compile(ctx, &s, &b), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_ctx_errmsg(ctx), "arch=sm_52"), "%s", dg_ctx_errmsg(ctx));
	dg_cache_stats st;
	cr_assert_eq(dg_cache_stat(dg_ctx_cache(ctx), &st), DG_OK);
	cr_assert_eq(st.entries, 0);
	cr_assert_eq(dg_jit_compile(NULL, &s, &b), DG_ERR_INVALID_ARG);
	dg_ctx_destroy(ctx);
	dg_ctx_destroy(NULL);
	dg_binary_destroy(NULL);
	dg_test_rmtree(dir);
}

Test(jit, corrupt_entry_is_rebuilt)
{
	char *dir = dg_test_tmpdir();
	dg_ctx *ctx = make_ctx(dir, NULL);
	dg_spec s = ternary_spec();
	dg_binary *a = NULL, *b = NULL;
	cr_assert_eq(dg_jit_compile(ctx, &s, &a), DG_OK, "%s", dg_ctx_errmsg(ctx));
	char path[1024];
	snprintf(path, sizeof(path), "%s/kernels/%s.dgk", dir, a->key);
	FILE *f = fopen(path, "r+b");
	cr_assert_not_null(f, "entry file %s", path);
	fseek(f, 300, SEEK_SET);
	int c = fgetc(f);
	fseek(f, 300, SEEK_SET);
	fputc(c ^ 0x40, f);
	fclose(f);
	cr_assert_eq(dg_jit_compile(ctx, &s, &b), DG_OK, "%s", dg_ctx_errmsg(ctx));
	cr_assert_not(b->cache_hit, "a corrupt entry must never be loaded");
	cr_assert_eq(a->image_size, b->image_size);
	cr_assert(memcmp(a->image, b->image, a->image_size) == 0);
	dg_cache_stats st;
	cr_assert_eq(dg_cache_stat(dg_ctx_cache(ctx), &st), DG_OK);
	cr_assert_eq(st.quarantined, 1);
	cr_assert_eq(st.entries, 1);
	dg_binary_destroy(a);
	dg_binary_destroy(b);
	dg_ctx_destroy(ctx);
	dg_test_rmtree(dir);
}

/* Eight processes JIT one spec into one empty cache at once: NVRTC runs
 * once, one entry is published, and every process holds the same bytes. */
Test(jit, eight_processes_one_spec_one_build)
{
	char *dir = dg_test_tmpdir();
	dg_spec s = ternary_spec();
	int fd[2];
	cr_assert_eq(pipe(fd), 0);
	pid_t pids[8];
	for (int i = 0; i < 8; i++) {
		pids[i] = fork();
		cr_assert_geq(pids[i], 0);
		if (pids[i] == 0) {
			close(fd[0]);
			dg_ctx_opts o = { .cache_dir = dir };
			dg_ctx *ctx = NULL;
			dg_binary *b = NULL;
			char line[80] = "error\n";
			if (dg_ctx_create(&ctx, &o) == DG_OK && dg_jit_compile(ctx, &s, &b) == DG_OK) {
				uint8_t d[32];
				char hex[65];
				dg__sha256_digest(b->image, b->image_size, d);
				dg__sha256_hex(d, hex);
				snprintf(line, sizeof(line), "%c %s\n", b->cache_hit ? 'h' : 'm', hex);
			}
			if (write(fd[1], line, strlen(line)) < 0)
				_exit(2);
			_exit(0);
		}
	}
	close(fd[1]);
	char buf[8 * 80 + 1] = { 0 };
	size_t n = 0;
	ssize_t r;
	while ((r = read(fd[0], buf + n, sizeof(buf) - 1 - n)) > 0)
		n += (size_t)r;
	close(fd[0]);
	for (int i = 0; i < 8; i++) {
		int status;
		waitpid(pids[i], &status, 0);
		cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	int misses = 0, lines = 0;
	char first[65] = "";
	for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
		cr_assert(strlen(line) == 66, "child failed: %s", line);
		lines++;
		misses += line[0] == 'm';
		if (!first[0])
			snprintf(first, sizeof(first), "%s", line + 2);
		cr_assert_str_eq(line + 2, first, "every process gets the same bytes");
	}
	cr_assert_eq(lines, 8);
	cr_assert_eq(misses, 1, "NVRTC must run once, ran %d times", misses);
	dg_cache *c = NULL;
	dg_cache_opts co = { .dir = dir };
	cr_assert_eq(dg_cache_open(&c, &co), DG_OK);
	dg_cache_stats st;
	cr_assert_eq(dg_cache_stat(c, &st), DG_OK);
	cr_assert_eq(st.entries, 1);
	cr_assert_eq(st.temp_files, 0);
	dg_cache_close(c);
	dg_test_rmtree(dir);
}
