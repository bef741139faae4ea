/* Helpers of the dragon-gen tests: see cli_helpers.h. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include "cli/dragon-gen/specset.h"
#include "dragon/runtime.h"
#include "dragon/checkpoint.h"
#include "dragon/cubin.h"
#include "dragon/manifest.h"
#include "helpers.h"

#include "cli_helpers.h"
extern char **environ;



void sandbox_init(sandbox *sb)
{
	memset(sb, 0, sizeof(*sb));
	sb->root = dg_test_tmpdir();
	snprintf(sb->cache, sizeof(sb->cache), "%s/cache", sb->root);
	snprintf(sb->out, sizeof(sb->out), "%s/out", sb->root);
}

void sandbox_fini(sandbox *sb)
{
	dg_test_rmtree(sb->root);
}

/* The program under test: dragon-gen unless cli_use_program says. */
static const char *prog_env = "DRAGON_GEN", *prog_prefix = "dragon-gen: ";

void cli_use_program(const char *env_var, const char *prefix)
{
	prog_env = env_var;
	prog_prefix = prefix;
}

static const char *gen_path(void)
{
	const char *p = getenv(prog_env);
	cr_assert(p && *p, "%s is not set (run through ctest)", prog_env);
	return p;
}

char *slurp(const char *path, size_t *size)
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
pid_t spawn_gen(const sandbox *sb, const char *const *args)
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
	/* the child starts with no signal blocked and SIGINT and SIGTERM at
	 * their defaults, whatever the test runner set, so the tests that
	 * signal it see what a shell's child sees (an ignored SIGXFSZ, which
	 * the full-disk test sets, is inherited) */
	posix_spawnattr_t at;
	posix_spawnattr_init(&at);
	sigset_t none, def;
	sigemptyset(&none);
	sigemptyset(&def);
	sigaddset(&def, SIGINT);
	sigaddset(&def, SIGTERM);
	posix_spawnattr_setsigmask(&at, &none);
	posix_spawnattr_setsigdefault(&at, &def);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
	char **env = child_env(sb);
	pid_t pid;
	int rc = posix_spawn(&pid, argv[0], &fa, &at, argv, env);
	cr_assert_eq(rc, 0, "posix_spawn %s: %s", argv[0], strerror(rc));
	posix_spawnattr_destroy(&at);
	posix_spawn_file_actions_destroy(&fa);
	free(env);
	return pid;
}

void collect(const sandbox *sb, pid_t pid, run *r)
{
	char path[700];
	int status;

	cr_assert_eq(waitpid(pid, &status, 0), pid);
	r->code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	snprintf(path, sizeof(path), "%s/stdout", sb->root);
	r->out = slurp(path, &r->out_len);
	snprintf(path, sizeof(path), "%s/stderr", sb->root);
	r->err = slurp(path, NULL);
}

void run_free(run *r)
{
	free(r->out);
	free(r->err);
	memset(r, 0, sizeof(*r));
}

/* Runs the program on the NULL-ended arguments of ap into r. */
static void vgen(const sandbox *sb, run *r, va_list ap)
{
	const char *args[64];
	int n = 0;

	while ((args[n] = va_arg(ap, const char *)))
		cr_assert_lt(++n, 63);
	collect(sb, spawn_gen(sb, args), r);
}

/* gen(&sb, &r, "build", "--op", "x", NULL) */
void gen(const sandbox *sb, run *r, ...)
{
	va_list ap;

	va_start(ap, r);
	vgen(sb, r, ap);
	va_end(ap);
}

void gen_ok(const sandbox *sb, ...)
{
	run r;
	va_list ap;

	va_start(ap, sb);
	vgen(sb, &r, ap);
	va_end(ap);
	cr_assert_eq(r.code, 0, "%s", r.err);
	run_free(&r);
}

int count_lines(const char *s)
{
	int n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* A usage or failure message: exactly one line, "dragon-gen: ..." (or
 * the prefix of cli_use_program). */
void expect_one_line_error(const run *r, int code, const char *want)
{
	cr_expect_eq(r->code, code, "exit %d, want %d; stderr: %s", r->code, code, r->err);
	cr_expect_eq(count_lines(r->err), 1, "stderr should be one line: '%s'", r->err);
	cr_expect_eq(strncmp(r->err, prog_prefix, strlen(prog_prefix)), 0, "stderr: %s", r->err);
	cr_expect(strstr(r->err, want) != NULL, "stderr '%s' should name '%s'", r->err, want);
}

bool exists(const char *path)
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
char *listing(const char *dir)
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

cJSON *parse_json(const char *text)
{
	cJSON *j = cJSON_Parse(text);
	cr_assert_not_null(j, "stdout is not JSON: %.500s", text);
	return j;
}

double num(const cJSON *obj, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
	cr_assert(cJSON_IsNumber(v), "'%s' is not a number", name);
	return v->valuedouble;
}


/* ---- dragon train's tests ------------------------------------------------- */

void text_file(const sandbox *sb, char *path, size_t size, size_t n)
{
	static const char t[] = "Now is the winter of our discontent made glorious summer by this sun of York. ";
	snprintf(path, size, "%s/text.txt", sb->root);
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	for (size_t i = 0; i < n; i++)
		fputc(t[i % (sizeof(t) - 1)], f);
	fclose(f);
}

void train_sandbox(sandbox *sb, char *data, size_t size, size_t n)
{
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(sb);
	text_file(sb, data, size, n);
}

char *log_text(const char *dir)
{
	char path[700];
	snprintf(path, sizeof(path), "%s/log.jsonl", dir);
	size_t n;
	char *s = slurp(path, &n);
	cr_assert_not_null(s, "%s", path);
	char *out = calloc(n + 1, 1), *o = out;
	for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) {
		char *cut = strstr(line, ", \"tokens_per_s\"");
		if (cut)
			*cut = '\0';
		o += sprintf(o, "%s\n", line);
	}
	free(s);
	return out;
}

void expect_same_log(const char *dir, const char *what, const char *straight, const char *straight_what)
{
	char *got = log_text(dir), *want = log_text(straight);
	cr_assert_str_eq(got, want, "%s:\n%s\n%s:\n%s", what, got, straight_what, want);
	free(got);
	free(want);
}

long long ckpt_step(const char *path)
{
	dg_train_state *s;
	char msg[1024];
	cr_assert_eq(dg_checkpoint_load(path, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	long long st = s->step;
	dg_train_state_destroy(s);
	return st;
}

void expect_stopped(const run *r, int sig, const char *want)
{
	char ack[64];
	snprintf(ack, sizeof(ack), "%s%s: stopping with a checkpoint (", prog_prefix, sig == SIGINT ? "SIGINT" : "SIGTERM");
	cr_expect_eq(r->code, 128 + sig, "exit %d, want %d; stderr: %s", r->code, 128 + sig, r->err);
	cr_expect_eq(count_lines(r->err), 2, "stderr should be two lines: '%s'", r->err);
	cr_expect_eq(strncmp(r->err, ack, strlen(ack)), 0, "stderr should start '%s': %s", ack, r->err);
	const char *second = strchr(r->err, '\n');
	cr_expect(second && strncmp(second + 1, prog_prefix, strlen(prog_prefix)) == 0, "stderr: %s", r->err);
	cr_expect(second && strstr(second, want) != NULL, "stderr '%s' should name '%s'", r->err, want);
}

int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	socklen_t len = sizeof(sa);
	getsockname(fd, (struct sockaddr *)&sa, &len);
	close(fd);
	return ntohs(sa.sin_port);
}

int log_lines(const char *dir)
{
	char path[700];
	snprintf(path, sizeof(path), "%s/log.jsonl", dir);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	int n = 0;
	for (int ch; (ch = fgetc(f)) != EOF;)
		n += ch == '\n';
	fclose(f);
	return n;
}

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void wait_for_lines(const char *dir, int n, pid_t pid)
{
	const double t0 = mono_s();
	while (log_lines(dir) < n) {
		int ws;
		cr_assert_eq(waitpid(pid, &ws, WNOHANG), 0, "the run ended before its log had %d lines", n);
		if (mono_s() - t0 > 120) {
			kill(pid, SIGKILL);
			waitpid(pid, &ws, 0);
			cr_assert_fail("no %d log lines in 120 s", n);
		}
		usleep(200);
	}
}

bool on_path(const char *name)
{
	const char *p = getenv("PATH");
	char dir[4096], file[4200];
	while (p && *p) {
		size_t n = strcspn(p, ":");
		snprintf(dir, sizeof(dir), "%.*s", (int)n, p);
		snprintf(file, sizeof(file), "%s/%s", n ? dir : ".", name);
		if (access(file, X_OK) == 0)
			return true;
		p += n + (p[n] == ':');
	}
	return false;
}

bool gpu_or_skip(void)
{
	char why[512] = "";
	int n = 0;
	if (dg_device_count(&n, why, sizeof(why)) == DG_OK && n > 0)
		return true;
	const char *req = getenv("DRAGON_REQUIRE_GPU");
	cr_assert(!(req && strcmp(req, "1") == 0), "DRAGON_REQUIRE_GPU=1 and no device: %s", why);
	printf("skipped: no CUDA device (%s)\n", why);
	return false;
}

bool gnuplot_or_skip(void)
{
	return dg_test_need(on_path("gnuplot"), "gnuplot is not on PATH",
			    "scripts/deps.sh installs gnuplot-nox") != 0;
}

void gen_within(const sandbox *sb, run *r, double secs, const char *const *args)
{
	pid_t pid = spawn_gen(sb, args);
	const double t0 = mono_s();
	int ws;
	while (waitpid(pid, &ws, WNOHANG) == 0) {
		if (mono_s() - t0 > secs) {
			kill(pid, SIGKILL);
			waitpid(pid, &ws, 0);
			cr_assert_fail("%s %s still ran after %g s (killed)", gen_path(), args[0], secs);
		}
		usleep(1000);
	}
	r->code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
	char path[700];
	snprintf(path, sizeof(path), "%s/stdout", sb->root);
	r->out = slurp(path, &r->out_len);
	snprintf(path, sizeof(path), "%s/stderr", sb->root);
	r->err = slurp(path, NULL);
}

void gen_fsize(const sandbox *sb, run *r, unsigned long long limit, const char *const *args)
{
	struct rlimit was, lim;
	cr_assert_eq(getrlimit(RLIMIT_FSIZE, &was), 0);
	lim = was;
	lim.rlim_cur = (rlim_t)limit;
	void (*xfsz)(int) = signal(SIGXFSZ, SIG_DFL);
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
	pid_t pid = spawn_gen(sb, args);
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &was), 0);
	signal(SIGXFSZ, xfsz);
	collect(sb, pid, r);
}
