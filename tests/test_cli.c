/*
 * dragon-gen end to end: the binary at $DRAGON_GEN (set by ctest) is run
 * with posix_spawn, stdout and stderr captured, each test with its own
 * cache folder ($DRAGON_CACHE_DIR) and output folder, so tests never share
 * state or touch the user's cache.
 *
 * What is proved: the CLI's manners (--help everywhere, exit codes 0/1/2,
 * one-line errors naming the flag and the value), render of one spec,
 * builds whose every file passes the cubin check and whose second run is
 * all cache hits, atomicity of a failed or interrupted build, the cache
 * and inspect commands, and the size of the default set.
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

#include "codegen/gen/specset.h"
#include "dragon/cubin.h"
#include "dragon/manifest.h"
#include "helpers.h"

extern char **environ;

typedef struct run {
	int code;   /* exit status, or 128 + signal */
	char *out;  /* stdout, NUL-terminated */
	char *err;  /* stderr */
} run;

typedef struct sandbox {
	char *root;      /* temp folder, removed at the end */
	char cache[600]; /* root/cache: DRAGON_CACHE_DIR */
	char out[600];   /* root/out: the bundle folder (not created) */
	const char *template_dir; /* DRAGON_TEMPLATE_DIR, or NULL for none */
} sandbox;

static void sandbox_init(sandbox *sb)
{
	memset(sb, 0, sizeof(*sb));
	sb->root = dg_test_tmpdir();
	snprintf(sb->cache, sizeof(sb->cache), "%s/cache", sb->root);
	snprintf(sb->out, sizeof(sb->out), "%s/out", sb->root);
}

static void sandbox_fini(sandbox *sb)
{
	dg_test_rmtree(sb->root);
}

static const char *gen_path(void)
{
	const char *p = getenv("DRAGON_GEN");
	cr_assert(p && *p, "DRAGON_GEN is not set (run through ctest)");
	return p;
}

static char *slurp(const char *path, size_t *size)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "cannot read %s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc((size_t)n + 1);
	cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	buf[n] = '\0';
	fclose(f);
	if (size)
		*size = (size_t)n;
	return buf;
}

/* The environment with our two variables replaced. */
static char **child_env(const sandbox *sb)
{
	size_t n = 0;
	while (environ[n])
		n++;
	char **env = calloc(n + 3, sizeof(char *));
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (strncmp(environ[i], "DRAGON_CACHE_DIR=", 17) != 0 &&
		    strncmp(environ[i], "DRAGON_TEMPLATE_DIR=", 20) != 0)
			env[k++] = environ[i];
	static char cache[700], tmpl[700];
	snprintf(cache, sizeof(cache), "DRAGON_CACHE_DIR=%s", sb->cache);
	env[k++] = cache;
	if (sb->template_dir) {
		snprintf(tmpl, sizeof(tmpl), "DRAGON_TEMPLATE_DIR=%s", sb->template_dir);
		env[k++] = tmpl;
	}
	return env;
}

/* Starts dragon-gen with argv (NULL-terminated, without the program);
 * stdout and stderr go to files in the sandbox. */
static pid_t spawn_gen(const sandbox *sb, const char *const *args)
{
	char *argv[64];
	char outp[700], errp[700];
	int n = 0;

	argv[n++] = (char *)gen_path();
	for (; args[n - 1]; n++) {
		cr_assert_lt(n, 63);
		argv[n] = (char *)args[n - 1];
	}
	argv[n] = NULL;
	snprintf(outp, sizeof(outp), "%s/stdout", sb->root);
	snprintf(errp, sizeof(errp), "%s/stderr", sb->root);
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	posix_spawn_file_actions_addopen(&fa, 2, errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	char **env = child_env(sb);
	pid_t pid;
	int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, env);
	cr_assert_eq(rc, 0, "posix_spawn %s: %s", argv[0], strerror(rc));
	posix_spawn_file_actions_destroy(&fa);
	free(env);
	return pid;
}

static void collect(const sandbox *sb, pid_t pid, run *r)
{
	char path[700];
	int status;

	cr_assert_eq(waitpid(pid, &status, 0), pid);
	r->code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	snprintf(path, sizeof(path), "%s/stdout", sb->root);
	r->out = slurp(path, NULL);
	snprintf(path, sizeof(path), "%s/stderr", sb->root);
	r->err = slurp(path, NULL);
}

static void run_free(run *r)
{
	free(r->out);
	free(r->err);
	memset(r, 0, sizeof(*r));
}

/* gen(&sb, &r, "build", "--op", "x", NULL) */
static void gen(const sandbox *sb, run *r, ...)
{
	const char *args[64];
	va_list ap;
	int n = 0;

	va_start(ap, r);
	while ((args[n] = va_arg(ap, const char *)))
		cr_assert_lt(++n, 63);
	va_end(ap);
	collect(sb, spawn_gen(sb, args), r);
}

static int count_lines(const char *s)
{
	int n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* A usage or failure message: exactly one line, "dragon-gen: ...". */
static void expect_one_line_error(const run *r, int code, const char *want)
{
	cr_expect_eq(r->code, code, "exit %d, want %d; stderr: %s", r->code, code, r->err);
	cr_expect_eq(count_lines(r->err), 1, "stderr should be one line: '%s'", r->err);
	cr_expect_eq(strncmp(r->err, "dragon-gen: ", 12), 0, "stderr: %s", r->err);
	cr_expect(strstr(r->err, want) != NULL, "stderr '%s' should name '%s'", r->err, want);
}

static bool exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

static int not_dots(const struct dirent *e)
{
	return strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
}

/* Names in dir (hidden ones too), sorted, joined by '\n' ("" if dir is
 * missing). */
static char *listing(const char *dir)
{
	struct dirent **names;
	int n = scandir(dir, &names, not_dots, alphasort);
	char *out = calloc(1, 1);
	size_t len = 0;
	for (int i = 0; i < n; i++) {
		size_t l = strlen(names[i]->d_name);
		out = realloc(out, len + l + 2);
		memcpy(out + len, names[i]->d_name, l);
		len += l;
		out[len++] = '\n';
		out[len] = '\0';
		free(names[i]);
	}
	if (n > 0)
		free(names);
	return out;
}

static cJSON *parse_json(const char *text)
{
	cJSON *j = cJSON_Parse(text);
	cr_assert_not_null(j, "stdout is not JSON: %.500s", text);
	return j;
}

static double num(const cJSON *obj, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
	cr_assert(cJSON_IsNumber(v), "'%s' is not a number", name);
	return v->valuedouble;
}

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

/* ---- build + inspect -------------------------------------------------------- */

/* Loads sb->out's manifest and checks every file as a user would. */
static dg_manifest *check_bundle(const sandbox *sb, size_t want_kernels)
{
	dg_manifest *m = NULL;
	char msg[1024], path[1024];

	cr_assert_eq(dg_manifest_load(sb->out, &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(m->n_kernels, want_kernels);
	for (size_t i = 0; i < m->n_kernels; i++) {
		const dg_manifest_kernel *k = &m->kernels[i];
		size_t size;
		snprintf(path, sizeof(path), "%s/%s", sb->out, k->file);
		cr_assert(exists(path), "%s is listed but missing", path);
		char *bytes = slurp(path, &size);
		cr_expect_not(k->ptx);
		cr_expect_eq(dg_cubin_check(bytes, size, k->arch, msg, sizeof(msg)), DG_OK,
			     "%s: %s", k->file, msg);
		cr_expect_eq(dg_manifest_kernel_verify(k, bytes, size, msg, sizeof(msg)),
			     DG_OK, "%s: %s", k->file, msg);
		cr_expect_gt(k->n_entries, 0);
		char prefix[64];
		snprintf(prefix, sizeof(prefix), "%.*s-%.16s.cubin",
			 (int)strcspn(k->file, "-"), k->file, k->key);
		cr_expect_str_eq(k->file, prefix, "file is named <op>-<key16>.cubin");
		free(bytes);
	}
	char *names = listing(sb->out);
	cr_expect(strstr(names, ".dragon-build.") == NULL, "temp folder left: %s", names);
	free(names);
	return m;
}

Test(cli, build_product_then_all_cache_hits)
{
	sandbox sb;
	run r;

	sandbox_init(&sb);
	gen(&sb, &r, "build", "--op", "lowrank_fwd", "--weight", "int8,ternary", "--relu",
	    "none,0", "--latent", "256", "-j2", "--out", sb.out, "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	const cJSON *ks = cJSON_GetObjectItem(j, "kernels");
	cr_assert_eq(cJSON_GetArraySize(ks), 4);
	cr_expect_eq(num(cJSON_GetObjectItem(j, "timing"), "kernels"), 4);
	cr_expect(strstr(r.err, "built 4 kernels") != NULL, "summary line: %s", r.err);
	cr_expect_eq(count_lines(r.err), 1, "quiet when not a TTY: %s", r.err);
	cJSON_Delete(j);
	run_free(&r);
	dg_manifest *m = check_bundle(&sb, 4);
	for (size_t i = 0; i < 4; i++)
		cr_expect(strstr(m->kernels[i].spec, "latent=256;") != NULL);
	dg_manifest_destroy(m);

	gen(&sb, &r, "build", "--op", "lowrank_fwd", "--weight", "int8,ternary", "--relu",
	    "none,0", "--latent", "256", "-j2", "--out", sb.out, "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	j = parse_json(r.out);
	cr_expect_eq(num(cJSON_GetObjectItem(j, "timing"), "cache_hits"), 4,
		     "second build must be all cache hits");
	const cJSON *k;
	cJSON_ArrayForEach(k, cJSON_GetObjectItem(j, "kernels"))
		cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(k, "cache_hit")));
	cJSON_Delete(j);
	run_free(&r);
	dg_manifest_destroy(check_bundle(&sb, 4));
	sandbox_fini(&sb);
}

Test(cli, inspect_good_and_truncated_bundle)
{
	sandbox sb;
	run r;
	char path[1024], msg[512];

	sandbox_init(&sb);
	gen(&sb, &r, "build", "--op", "pack_i8x4,unpack_i8x4", "--out", sb.out, "-q", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_expect_str_empty(r.err, "-q: %s", r.err);
	run_free(&r);
	gen(&sb, &r, "inspect", sb.out, NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	cr_expect(strstr(r.out, "2 kernels ok") != NULL, "%s", r.out);
	run_free(&r);
	gen(&sb, &r, "inspect", sb.out, "--json", NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(j, "ok")));
	cJSON_Delete(j);
	run_free(&r);

	dg_manifest *m = NULL;
	cr_assert_eq(dg_manifest_load(sb.out, &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	snprintf(path, sizeof(path), "%s/%s", sb.out, m->kernels[1].file);
	cr_assert_eq(truncate(path, (off_t)m->kernels[1].size / 2), 0);
	gen(&sb, &r, "inspect", sb.out, NULL);
	cr_expect_eq(r.code, 1, "a truncated cubin must fail inspect");
	cr_expect(strstr(r.err, m->kernels[1].file) != NULL, "names the file: %s", r.err);
	cr_expect(strstr(r.err, "truncated") != NULL, "%s", r.err);
	cr_expect(strstr(r.err, m->kernels[0].file) == NULL, "the good file is not named");
	run_free(&r);
	unlink(path);
	gen(&sb, &r, "inspect", sb.out, NULL);
	cr_expect_eq(r.code, 1);
	cr_expect(strstr(r.err, "missing") != NULL, "%s", r.err);
	run_free(&r);
	snprintf(path, sizeof(path), "%s/manifest.json", sb.out);
	unlink(path);
	gen(&sb, &r, "inspect", sb.out, NULL);
	expect_one_line_error(&r, 1, "manifest.json");
	run_free(&r);
	dg_manifest_destroy(m);
	sandbox_fini(&sb);
}

/* A copy of templates/ in the sandbox with lowrank.lua broken: `mode` 0
 * fails when the module loads (line 1), 1 when it renders (the line after
 * `function M.render`, returned in *line), 2 renders CUDA that NVRTC
 * refuses (an #error appended to the source). */
static void broken_templates(const sandbox *sb, char *dir, size_t size, int mode,
			     int *line)
{
	char cmd[8192], path[4096];

	snprintf(dir, size, "%s/templates-%d", sb->root, mode);
	snprintf(cmd, sizeof(cmd), "cp -r '%s/templates' '%s'", DG_SOURCE_DIR, dir);
	cr_assert_eq(system(cmd), 0);
	snprintf(path, sizeof(path), "%s/lowrank.lua", dir);
	char *orig = slurp(path, NULL);
	const char *bad = "error(\"broken on purpose\")\n";
	size_t at = 0;
	*line = 1;
	if (mode == 2) {
		char *ret = strstr(orig, "\nreturn M");
		cr_assert_not_null(ret, "lowrank.lua does not end with `return M`");
		at = (size_t)(ret + 1 - orig);
		bad = "local render = M.render\n"
		      "function M.render(spec)\n"
		      "  local s, e, n = render(spec)\n"
		      "  return s .. \"\\n#error broken on purpose\\n\", e, n\n"
		      "end\n";
	}
	if (mode == 1) {
		char *fn = strstr(orig, "\nfunction M.render(");
		cr_assert_not_null(fn, "lowrank.lua has no `function M.render(`");
		at = (size_t)(strchr(fn + 1, '\n') + 1 - orig);
		for (size_t i = 0; i < at; i++)
			*line += orig[i] == '\n';
	}
	char *out = malloc(strlen(orig) + strlen(bad) + 1);
	sprintf(out, "%.*s%s%s", (int)at, orig, bad, orig + at);
	dg_test_write_file(dir, "lowrank.lua", out);
	free(out);
	free(orig);
}

/* A template that fails, on load or on render: exit 1, the message names
 * the template file and line, and the out folder is exactly as it was. */
Test(cli, failed_build_leaves_out_dir_alone)
{
	sandbox sb;
	run r;
	char tmpl[3][700], want[64], mpath[800];
	int line[3];

	sandbox_init(&sb);
	for (int mode = 0; mode < 3; mode++)
		broken_templates(&sb, tmpl[mode], sizeof(tmpl[mode]), mode, &line[mode]);

	/* an out folder with an earlier bundle in it */
	gen(&sb, &r, "build", "--op", "pack_i8x4", "--out", sb.out, NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	run_free(&r);
	dg_test_write_file(sb.out, "keep.txt", "mine");
	char *before = listing(sb.out);
	snprintf(mpath, sizeof(mpath), "%s/manifest.json", sb.out);
	char *manifest_before = slurp(mpath, NULL);

	for (int mode = 0; mode < 3; mode++) {
		sb.template_dir = tmpl[mode];
		/* pack and quantize compile fine first (-j1), lowrank fails:
		 * nothing may land */
		gen(&sb, &r, "build", "--op", "pack_i8x4,quantize_act,lowrank_fwd", "-j1",
		    "--out", sb.out, "--latent", "512", NULL);
		if (mode < 2)
			snprintf(want, sizeof(want), "templates/lowrank.lua:%d: broken on purpose",
				 line[mode]);
		else
			snprintf(want, sizeof(want), "compile error in ");
		expect_one_line_error(&r, 1, want);
		cr_expect(strstr(r.err, "broken on purpose") != NULL, "%s", r.err);
		if (mode >= 1)
			cr_expect(strstr(r.err, "run `dragon-gen render --op lowrank_fwd --latent 512`"),
				  "a render failure points at render: %s", r.err);
		run_free(&r);
		char *after = listing(sb.out);
		cr_expect_str_eq(after, before, "the out folder changed (mode %d)", mode);
		char *manifest_after = slurp(mpath, NULL);
		cr_expect_str_eq(manifest_after, manifest_before);
		free(after);
		free(manifest_after);
	}

	/* out folders that did not exist are not left behind, parents included */
	char fresh[800], nested[900];
	snprintf(fresh, sizeof(fresh), "%s/fresh", sb.root);
	snprintf(nested, sizeof(nested), "%s/a/b/", fresh);
	gen(&sb, &r, "build", "--op", "lowrank_fwd", "--out", nested, NULL);
	cr_expect_eq(r.code, 1);
	cr_expect_not(exists(fresh), "a failed build must not leave the folders it made");
	run_free(&r);
	free(before);
	free(manifest_before);
	sandbox_fini(&sb);
}

/* SIGINT in the middle: the temp folder goes, nothing is published. */
Test(cli, interrupted_build_leaves_nothing)
{
	sandbox sb;
	run r;
	const char *args[] = { "build", "--no-cache", "-j1", "--out", NULL, "--op", "lowrank_fwd",
			       "--weight", "f32,bf16,int8,ternary,sign1", "--in-heads", "1,4",
			       "--latent", "256", NULL };

	sandbox_init(&sb);
	args[4] = sb.out;
	pid_t pid = spawn_gen(&sb, args);
	/* wait until the first kernel file sits in the temp folder */
	bool seen = false;
	for (int i = 0; i < 6000 && !seen; i++) {
		char *names = listing(sb.out);
		char *t = strstr(names, ".dragon-build.");
		if (t) {
			char tmp[1024];
			snprintf(tmp, sizeof(tmp), "%s/%.*s", sb.out, (int)strcspn(t, "\n"), t);
			char *inner = listing(tmp);
			seen = strstr(inner, ".cubin") != NULL;
			free(inner);
		}
		free(names);
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	cr_assert(seen, "the build never wrote a kernel into its temp folder");
	kill(pid, SIGINT);
	collect(&sb, pid, &r);
	cr_expect_eq(r.code, 128 + SIGINT, "exit like an interrupted program: %d (%s)", r.code,
		     r.err);
	cr_expect(strstr(r.err, "interrupted") != NULL, "%s", r.err);
	char *names = listing(sb.out);
	cr_expect_str_empty(names, "an interrupted build left: %s", names);
	free(names);
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
Test(cli, default_set_builds, .timeout = 1100)
{
	sandbox sb;
	run r;

	if (dg_test_quick())
		cr_skip_test("DRAGON_TEST_QUICK: the default-set build is covered by the full run");
	sandbox_init(&sb);
	gen(&sb, &r, "build", "-j2", "--out", sb.out, "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "kernels")),
		     DG__SPECSET_DEFAULT_SIZE);
	cr_expect_eq(num(cJSON_GetObjectItem(j, "timing"), "dropped"), 10);
	cJSON_Delete(j);
	run_free(&r);
	dg_manifest_destroy(check_bundle(&sb, DG__SPECSET_DEFAULT_SIZE));
	sandbox_fini(&sb);
}
