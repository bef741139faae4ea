/*
 * jit_latency — what the JIT costs a user.
 *
 *   cold: render + NVRTC + cache write, into an empty cache (a fresh cache
 *         folder per repetition, in this process);
 *   warm: a fresh process that creates a context and asks for the same spec:
 *         plan, cache lookup, checksum verify, binary in memory (process
 *         start and exit excluded; timed inside the child).
 *
 * "spec" is the spec as asked (an auto tile), "kernel_spec" what compiled
 * (the template's default tile; no GPU, so no tuning record applies).
 *
 * Medians of --reps repetitions, written as JSON (--out FILE, default
 * stdout too). Usage: jit_latency [--spec TEXT] [--reps N] [--out FILE]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "dragon/dragon.h"

#define DEFAULT_SPEC                                                          \
	"op=lowrank_fwd;weight=ternary;act=int8;out=int8;relu=0;heads=4;"     \
	"in_heads=1;embd=256;latent=8192"

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The spec as it compiled (tile resolved by its template), from a cold run. */
static char kernel_spec[DG_SPEC_TEXT_MAX];

/* One JIT request; returns ms, or a negative number on failure. Like
 * sqlite3_open, dg_ctx_create hands out a handle that says why it failed. */
static double jit_once(const char *cache_dir, const dg_spec *spec, bool want_hit)
{
	dg_ctx_opts o = { .cache_dir = cache_dir };
	dg_ctx *ctx = NULL;
	dg_binary *bin = NULL;
	double t0 = now_ms();
	dg_status st = dg_ctx_create(&ctx, &o);
	if (st == DG_OK)
		st = dg_jit_compile(ctx, spec, &bin);
	double ms = now_ms() - t0;
	if (st) {
		fprintf(stderr, "jit_latency: %s: %s\n", dg_status_str(st),
			ctx ? dg_ctx_errmsg(ctx) : "out of memory");
		ms = -1;
	} else if (bin->cache_hit != want_hit) {
		fprintf(stderr, "jit_latency: expected a cache %s\n", want_hit ? "hit" : "miss");
		ms = -1;
	} else if (!want_hit) {
		snprintf(kernel_spec, sizeof(kernel_spec), "%s", bin->canonical);
	}
	dg_binary_destroy(bin);
	dg_ctx_destroy(ctx);
	return ms;
}

/* Runs one warm request in a fresh process; the child writes its time. */
static double warm_in_child(const char *self, const char *cache_dir,
			    const char *spec_text)
{
	int fd[2];
	if (pipe(fd))
		return -1;
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		dup2(fd[1], STDOUT_FILENO);
		close(fd[0]);
		execl(self, self, "--child-warm", cache_dir, spec_text, (char *)NULL);
		_exit(127);
	}
	close(fd[1]);
	char buf[64] = { 0 };
	ssize_t n = read(fd[0], buf, sizeof(buf) - 1);
	close(fd[0]);
	int status;
	waitpid(pid, &status, 0);
	if (n <= 0 || !WIFEXITED(status) || WEXITSTATUS(status))
		return -1;
	return atof(buf);
}

static int usage(void)
{
	fprintf(stderr, "usage: jit_latency [--spec TEXT] [--reps N] [--out FILE]\n");
	return 2;
}

int main(int argc, char **argv)
{
	const char *spec_text = DEFAULT_SPEC, *out_path = NULL;
	int reps = 5;
	char msg[512];
	dg_spec spec;

	if (argc == 4 && strcmp(argv[1], "--child-warm") == 0) {
		if (dg_spec_parse(argv[3], &spec, msg, sizeof(msg)))
			return 1;
		double ms = jit_once(argv[2], &spec, true);
		printf("%.6f\n", ms);
		return ms < 0;
	}
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--spec") == 0 && i + 1 < argc)
			spec_text = argv[++i];
		else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
			reps = atoi(argv[++i]);
		else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
			out_path = argv[++i];
		else
			return usage();
	}
	if (reps < 1 || reps > 1000)
		return usage();
	if (dg_spec_parse(spec_text, &spec, msg, sizeof(msg))) {
		fprintf(stderr, "jit_latency: --spec: %s\n", msg);
		return 2;
	}
	double *cold = calloc((size_t)reps, sizeof(double));
	double *warm = calloc((size_t)reps * 2, sizeof(double));
	char last_dir[256] = "";
	if (!cold || !warm)
		return 1;
	for (int i = 0; i < reps; i++) {
		char tmpl[] = "/tmp/dragon-bench-XXXXXX";
		char *dir = mkdtemp(tmpl);
		if (!dir)
			return 1;
		cold[i] = jit_once(dir, &spec, false);
		if (cold[i] < 0)
			return 1;
		if (last_dir[0]) {
			char cmd[600];
			snprintf(cmd, sizeof(cmd), "rm -rf '%s'", last_dir);
			if (system(cmd))
				fprintf(stderr, "jit_latency: could not remove %s\n", last_dir);
		}
		snprintf(last_dir, sizeof(last_dir), "%s", dir);
	}
	int nwarm = reps * 2;
	for (int i = 0; i < nwarm; i++) {
		warm[i] = warm_in_child("/proc/self/exe", last_dir, spec_text);
		if (warm[i] < 0) {
			fprintf(stderr, "jit_latency: warm run failed\n");
			return 1;
		}
	}
	char canonical[DG_SPEC_TEXT_MAX];
	dg_spec_to_string(&spec, canonical, sizeof(canonical));
	double cold_med = median(cold, reps), warm_med = median(warm, nwarm);

	cJSON *j = cJSON_CreateObject();
	char host[256] = "";
	gethostname(host, sizeof(host) - 1);
	time_t now = time(NULL);
	char date[32];
	strftime(date, sizeof(date), "%Y-%m-%d", gmtime(&now));
	cJSON_AddStringToObject(j, "bench", "jit_latency");
	cJSON_AddStringToObject(j, "date", date);
	cJSON_AddNumberToObject(j, "cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
	cJSON_AddStringToObject(j, "nvrtc_version", dg_nvrtc_version());
	cJSON_AddStringToObject(j, "spec", canonical);
	cJSON_AddStringToObject(j, "kernel_spec", kernel_spec);
	cJSON_AddNumberToObject(j, "reps_cold", reps);
	cJSON_AddNumberToObject(j, "reps_warm", nwarm);
	cJSON_AddNumberToObject(j, "cold_ms_median", cold_med);
	cJSON_AddNumberToObject(j, "cold_ms_min", cold[0]);
	cJSON_AddNumberToObject(j, "cold_ms_max", cold[reps - 1]);
	cJSON_AddNumberToObject(j, "warm_ms_median", warm_med);
	cJSON_AddNumberToObject(j, "warm_ms_min", warm[0]);
	cJSON_AddNumberToObject(j, "warm_ms_max", warm[nwarm - 1]);
	cJSON_AddNumberToObject(j, "speedup", cold_med / warm_med);
	char *text = cJSON_Print(j);
	printf("%-24s %10s %10s %10s\n", "jit_latency", "median", "min", "max");
	printf("%-24s %8.2f ms %7.2f ms %7.2f ms\n", "cold (render+nvrtc+put)", cold_med, cold[0], cold[reps - 1]);
	printf("%-24s %8.3f ms %7.3f ms %7.3f ms\n", "warm (fresh process)", warm_med, warm[0], warm[nwarm - 1]);
	if (out_path) {
		FILE *f = fopen(out_path, "w");
		if (!f || fprintf(f, "%s\n", text) < 0 || fclose(f)) {
			fprintf(stderr, "jit_latency: cannot write %s\n", out_path);
			return 1;
		}
	} else {
		printf("%s\n", text);
	}
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", last_dir);
	if (system(cmd))
		fprintf(stderr, "jit_latency: could not remove %s\n", last_dir);
	cJSON_free(text);
	cJSON_Delete(j);
	free(cold);
	free(warm);
	return 0;
}
