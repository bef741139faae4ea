/*
 * dragon's shared helpers (util.h): errors, option scanning, JSON errors.
 * An error is one line on stderr that starts with "dragon:".
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/dragon/util.h"

static int first_line_len(const char *s)
{
	const char *nl = strchr(s, '\n');
	size_t n = nl ? (size_t)(nl - s) : strlen(s);
	return n > 4096 ? 4096 : (int)n;
}

/* --json mode: the first error, kept for dg__cli_json_finish. */
static struct {
	bool on, printed, have;
	dg_status st;
	char msg[4096];
} json_err;

int dg__cli_err(int code, dg_status st, const char *fmt, ...)
{
	char buf[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	int n = first_line_len(buf);
	if (json_err.on && !json_err.have) {
		snprintf(json_err.msg, sizeof(json_err.msg), "%.*s", n, buf);
		json_err.st = st ? st : (code == DG__CLI_FAIL ? DG_ERR_INTERNAL : DG_ERR_INVALID_ARG);
		json_err.have = true;
	}
	fprintf(stderr, "dragon: %.*s\n", n, buf);
	return code;
}

/* ---- option scanner --------------------------------------------------------- */

void dg__cli_scan_init(dg__cli_scan_state *s, int argc, char **argv, const char *cmd)
{
	s->argc = argc;
	s->argv = argv;
	s->i = 1;
	s->only_args = false;
	s->cmd = cmd;
}

static int scan_error(const dg__cli_scan_state *s, const char *fmt, const char *what)
{
	char m[512];
	snprintf(m, sizeof(m), fmt, what);
	dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "%s %s; see `dragon %s --help`", s->cmd, m,
		    s->cmd);
	return DG__CLI_SCAN_ERROR;
}

int dg__cli_scan(dg__cli_scan_state *s, const dg__cli_opt *opts, const char **arg)
{
	*arg = NULL;
	if (s->i >= s->argc)
		return DG__CLI_SCAN_END;
	const char *a = s->argv[s->i++];
	if (s->only_args || a[0] != '-' || a[1] == '\0') {
		*arg = a;
		return DG__CLI_SCAN_ARG;
	}
	if (strcmp(a, "--") == 0) {
		s->only_args = true;
		return dg__cli_scan(s, opts, arg);
	}
	const dg__cli_opt *o = NULL;
	const char *val = NULL;
	if (a[1] == '-') {
		const char *name = a + 2, *eq = strchr(name, '=');
		size_t n = eq ? (size_t)(eq - name) : strlen(name);
		for (const dg__cli_opt *p = opts; p->id; p++)
			if (p->name && strlen(p->name) == n && strncmp(p->name, name, n) == 0)
				o = p;
		if (!o)
			return scan_error(s, "has no flag %s", a);
		if (eq) {
			if (!o->has_arg)
				return scan_error(s, "flag %s takes no value", a);
			val = eq + 1;
		}
	} else {
		for (const dg__cli_opt *p = opts; p->id; p++)
			if (p->short_name && p->short_name == a[1])
				o = p;
		if (!o || (!o->has_arg && a[2]))
			return scan_error(s, "has no flag %s", a);
		if (a[2])
			val = a + 2;
	}
	if (o->has_arg && !val) {
		if (s->i >= s->argc)
			return scan_error(s, "flag %s needs a value", a);
		val = s->argv[s->i++];
	}
	*arg = val;
	return o->id;
}

bool dg__cli_parse_u64(const char *flag, const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end = NULL;
	errno = 0;
	unsigned long long x = v[0] >= '0' && v[0] <= '9' ? strtoull(v, &end, 10) : 0;
	if (v[0] < '0' || v[0] > '9' || errno || *end || x < lo || x > hi) {
		dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
			    "%s %s: expected a whole number from %llu to %llu", flag, v,
			    (unsigned long long)lo, (unsigned long long)hi);
		return false;
	}
	*out = x;
	return true;
}

double dg__cli_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* p's canonical path into out (PATH_MAX bytes): its real path, or its
 * folder's and its name; false when neither resolves. */
static bool canonical(const char *p, char *out)
{
	if (realpath(p, out))
		return true;
	char dir[PATH_MAX], real[PATH_MAX];
	const char *slash = strrchr(p, '/'), *name = slash ? slash + 1 : p;
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == p)
		snprintf(dir, sizeof(dir), "/");
	else
		snprintf(dir, sizeof(dir), "%.*s", (int)(slash - p), p);
	if (!*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || !realpath(dir, real))
		return false;
	int n = snprintf(out, PATH_MAX, "%s/%s", strcmp(real, "/") == 0 ? "" : real, name);
	return n > 0 && n < PATH_MAX;
}

bool dg__cli_same_file(const char *a, const char *b)
{
	struct stat sa, sb;
	if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
		return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
	char ca[PATH_MAX], cb[PATH_MAX];
	if (canonical(a, ca) && canonical(b, cb))
		return strcmp(ca, cb) == 0;
	return strcmp(a, b) == 0;
}

/* ---- JSON ------------------------------------------------------------------- */

int dg__cli_json_print(cJSON *j)
{
	char *text = j ? cJSON_Print(j) : NULL;
	cJSON_Delete(j);
	if (!text)
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "out of memory printing JSON");
	fputs(text, stdout);
	fputc('\n', stdout);
	cJSON_free(text);
	json_err.printed = true;
	return DG__CLI_OK;
}

void dg__cli_json_mode(bool on)
{
	json_err.on = on;
}

void dg__cli_json_finish(int code)
{
	if (!json_err.on || json_err.printed || code == DG__CLI_OK)
		return;
	cJSON *j = cJSON_CreateObject();
	if (!j)
		return;
	dg_status st = json_err.have ? json_err.st
				     : code == DG__CLI_USAGE ? DG_ERR_INVALID_ARG : DG_ERR_INTERNAL;
	cJSON_AddStringToObject(j, "error", json_err.have ? json_err.msg : "failed");
	cJSON_AddStringToObject(j, "status", dg_status_str(st));
	cJSON_AddNumberToObject(j, "exit", code);
	json_err.on = false;
	dg__cli_json_print(j);
}

/* The device: opened (*dev) unless --cpu or there is none; a recipe the
 * CPU model cannot run without one is refused. Returns the exit code. */
int dg__cli_device_of(bool cpu, const dg_model_config *c, int ordinal, dg_device **dev, char *name,
		      size_t size, const char *next)
{
	char why[512] = "";
	int n = 0;
	*dev = NULL;
	snprintf(name, size, "cpu");
	if (cpu) {
		if (!dg_model_cpu_runs(c))
			return dg__cli_err(DG__CLI_USAGE, DG_ERR_UNSUPPORTED,
					   "--preset %s --cpu: the CPU model runs f32 and the integer recipes (w8a8, bitnet, fake-quantized); %s needs an NVIDIA GPU",
					   c->preset, c->preset);
		return DG__CLI_OK;
	}
	dg_status st = dg_device_count(&n, why, sizeof(why));
	if (st)
		return dg__cli_err(DG__CLI_FAIL, st, "counting CUDA devices: %s", why);
	if (n == 0) {
		if (!dg_model_cpu_runs(c))
			return dg__cli_err(DG__CLI_FAIL, DG_ERR_NO_DEVICE,
					   "preset %s needs an NVIDIA GPU, and there is none (%s); %s", c->preset,
					   why[0] ? why : "no device",
					   next ? next : "the CPU model runs f32, w8a8 and bitnet");
		if (next)
			fprintf(stderr, "dragon: note: no NVIDIA GPU here (%s); running on the CPU model\n",
				why[0] ? why : "no device");
		return DG__CLI_OK;
	}
	if (ordinal >= n)
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NO_DEVICE, "GPU %d: this machine has %d", ordinal, n);
	dg_device_opts o = { .ordinal = ordinal, .jit = NULL };
	st = dg_device_open(dev, &o);
	if (st) {
		int code = dg__cli_err(DG__CLI_FAIL, st, "opening GPU %d: %s", ordinal,
				       *dev ? dg_device_errmsg(*dev) : dg_status_str(st));
		dg_device_close(*dev);
		*dev = NULL;
		return code;
	}
	dg_device_info info;
	if (dg_device_info_get(*dev, &info) == DG_OK)
		snprintf(name, size, "%s (sm_%d)", info.name, info.sm);
	else
		snprintf(name, size, "GPU %d", ordinal);
	return DG__CLI_OK;
}
