/*
 * dragon-gen shared helpers: errors, option scanning, progress, files, JSON.
 *
 * The CLI's manners live here so every subcommand has the same ones: an
 * error is one line on stderr that starts with "dragon-gen:", progress is
 * drawn only for a person watching a terminal, files appear whole or not
 * at all.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/dragon-gen/util.h"

int dg__gen_exit_for(dg_status st)
{
	switch (st) {
	case DG_OK:
		return DG__GEN_OK;
	case DG_ERR_INVALID_ARG:
	case DG_ERR_INVALID_SPEC:
		return DG__GEN_USAGE;
	default:
		return DG__GEN_FAIL;
	}
}

int dg__gen_first_line_len(const char *s)
{
	const char *nl = strchr(s, '\n');
	size_t n = nl ? (size_t)(nl - s) : strlen(s);
	return n > 4096 ? 4096 : (int)n;
}

/* --json mode (util.h): the first error, kept for dg__gen_json_finish. */
static struct {
	bool on, printed, have;
	dg_status st;
	char msg[4096];
} json_err;

static void vline(const char *fmt, va_list ap)
{
	char buf[4096];
	vsnprintf(buf, sizeof(buf), fmt, ap);
	fprintf(stderr, "dragon-gen: %.*s\n", dg__gen_first_line_len(buf), buf);
}

static void verr(int code, dg_status st, const char *fmt, va_list ap)
{
	va_list copy;
	va_copy(copy, ap);
	if (json_err.on && !json_err.have) {
		char buf[4096];
		vsnprintf(buf, sizeof(buf), fmt, copy);
		snprintf(json_err.msg, sizeof(json_err.msg), "%.*s", dg__gen_first_line_len(buf),
			 buf);
		/* a usage error (2, or the scanner's, reported before its 2) */
		json_err.st = st ? st : (code == DG__GEN_FAIL ? DG_ERR_INTERNAL : DG_ERR_INVALID_ARG);
		json_err.have = true;
	}
	va_end(copy);
	vline(fmt, ap);
}

int dg__gen_err(int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	verr(code, DG_OK, fmt, ap);
	va_end(ap);
	return code;
}

int dg__gen_errs(int code, dg_status st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	verr(code, st, fmt, ap);
	va_end(ap);
	return code;
}

int dg__gen_fail(dg_status st, const char *fmt, ...)
{
	int code = dg__gen_exit_for(st);
	va_list ap;
	va_start(ap, fmt);
	verr(code, st, fmt, ap);
	va_end(ap);
	return code;
}

void dg__gen_note(bool verbose, const char *fmt, ...)
{
	if (!verbose)
		return;
	va_list ap;
	va_start(ap, fmt);
	vline(fmt, ap);
	va_end(ap);
}

/* ---- option scanner -------------------------------------------------------- */

void dg__gen_scan_init(dg__gen_scan_state *s, int argc, char **argv,
		       const char *cmd)
{
	s->argc = argc;
	s->argv = argv;
	s->i = 1;
	s->only_args = false;
	s->cmd = cmd;
}

static int scan_error(const dg__gen_scan_state *s, const char *fmt,
		      const char *what)
{
	char m[512];
	snprintf(m, sizeof(m), fmt, what);
	return dg__gen_err(DG__GEN_SCAN_ERROR, "%s %s; see `dragon-gen %s --help`",
			   s->cmd, m, s->cmd);
}

int dg__gen_scan(dg__gen_scan_state *s, const dg__gen_opt *opts,
		 const char **arg)
{
	*arg = NULL;
	if (s->i >= s->argc)
		return DG__GEN_SCAN_END;
	const char *a = s->argv[s->i++];
	if (s->only_args || a[0] != '-' || a[1] == '\0') {
		*arg = a;
		return DG__GEN_SCAN_ARG;
	}
	if (strcmp(a, "--") == 0) {
		s->only_args = true;
		return dg__gen_scan(s, opts, arg);
	}
	const dg__gen_opt *o = NULL;
	const char *val = NULL;
	if (a[1] == '-') {
		const char *name = a + 2, *eq = strchr(name, '=');
		size_t n = eq ? (size_t)(eq - name) : strlen(name);
		for (const dg__gen_opt *p = opts; p->id; p++)
			if (p->name && strlen(p->name) == n &&
			    strncmp(p->name, name, n) == 0)
				o = p;
		if (!o)
			return scan_error(s, "has no flag %s", a);
		if (eq) {
			if (!o->has_arg)
				return scan_error(s, "flag %s takes no value", a);
			val = eq + 1;
		}
	} else {
		for (const dg__gen_opt *p = opts; p->id; p++)
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

bool dg__gen_parse_u64(const char *flag, const char *v, uint64_t lo,
		       uint64_t hi, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long x = v[0] >= '0' && v[0] <= '9' ? strtoull(v, &end, 10)
							    : 0;
	if (v[0] < '0' || v[0] > '9' || errno || *end || x < lo || x > hi) {
		dg__gen_err(DG__GEN_USAGE,
			    "%s %s: expected a whole number from %llu to %llu",
			    flag, v, (unsigned long long)lo,
			    (unsigned long long)hi);
		return false;
	}
	*out = x;
	return true;
}

/* ---- progress -------------------------------------------------------------- */

double dg__gen_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void dg__gen_progress_init(dg__gen_progress *p, bool force, size_t total)
{
	memset(p, 0, sizeof(*p));
	p->tty = isatty(STDERR_FILENO) == 1;
	p->enabled = force || p->tty;
	p->t0_ms = dg__gen_now_ms();
	p->total = total;
}

void dg__gen_progress_tick(dg__gen_progress *p, size_t done, const char *what)
{
	if (!p->enabled)
		return;
	double now = dg__gen_now_ms();
	if (now - p->t0_ms < 1000.0)
		return;
	/* A terminal redraws cheaply; a log gets a line a second at most. */
	if (!p->tty && p->shown && now - p->last_ms < 1000.0)
		return;
	p->last_ms = now;
	p->shown = true;
	fprintf(stderr, "%s[%zu/%zu] %.1fs %.60s%s", p->tty ? "\r\033[K" : "",
		done, p->total, (now - p->t0_ms) / 1e3, what ? what : "",
		p->tty ? "" : "\n");
	fflush(stderr);
}

void dg__gen_progress_end(dg__gen_progress *p)
{
	if (p->enabled && p->shown && p->tty) {
		fputs("\r\033[K", stderr);
		fflush(stderr);
	}
	p->shown = false;
}

/* ---- files ------------------------------------------------------------------ */

bool dg__gen_join(char *buf, size_t size, const char *dir, const char *name)
{
	int n = snprintf(buf, size, "%s/%s", dir, name);
	return n >= 0 && (size_t)n < size;
}

static dg_status io_fail(char *err, size_t esz, const char *path, int e)
{
	snprintf(err, esz, "%s: %s", path, strerror(e));
	return e == ENOMEM ? DG_ERR_NOMEM : DG_ERR_IO;
}

/* Writes and fsyncs `path`; messages name `shown` (the file the user
 * asked for, when path is its temp file). */
static dg_status write_file(const char *path, const char *shown,
			    const void *data, size_t size, char *err, size_t esz)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return io_fail(err, esz, shown, errno);
	const char *p = data;
	size_t left = size;
	while (left) {
		ssize_t w = write(fd, p, left);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			int e = w < 0 ? errno : EIO;
			close(fd);
			unlink(path);
			return io_fail(err, esz, shown, e);
		}
		p += w;
		left -= (size_t)w;
	}
	if (fsync(fd) != 0 || close(fd) != 0) {
		int e = errno;
		unlink(path);
		return io_fail(err, esz, shown, e);
	}
	return DG_OK;
}

dg_status dg__gen_write_file(const char *path, const void *data, size_t size,
			     char *err, size_t esz)
{
	return write_file(path, path, data, size, err, esz);
}

dg_status dg__gen_read_file(const char *path, size_t max, uint8_t **out,
			    size_t *size, char *err, size_t esz)
{
	struct stat sb;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		io_fail(err, esz, path, e);
		return e == ENOENT ? DG_ERR_NOT_FOUND : DG_ERR_IO;
	}
	dg_status st = DG_OK;
	uint8_t *buf = NULL;
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
		snprintf(err, esz, "%s: not a regular file", path);
		st = DG_ERR_IO;
		goto out;
	}
	if ((uint64_t)sb.st_size > max) {
		snprintf(err, esz, "%s: %lld bytes, more than %zu", path,
			 (long long)sb.st_size, max);
		st = DG_ERR_IO;
		goto out;
	}
	buf = malloc((size_t)sb.st_size + 1);
	if (!buf) {
		st = io_fail(err, esz, path, ENOMEM);
		goto out;
	}
	size_t got = 0;
	while (got < (size_t)sb.st_size) {
		ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			st = io_fail(err, esz, path, r < 0 ? errno : EIO);
			goto out;
		}
		got += (size_t)r;
	}
	buf[got] = 0;
	*out = buf;
	*size = got;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return st;
}

void dg__gen_remove_tree(const char *path)
{
	struct stat sb;
	if (lstat(path, &sb) != 0)
		return;
	if (S_ISDIR(sb.st_mode)) {
		DIR *d = opendir(path);
		struct dirent *e;
		while (d && (e = readdir(d))) {
			if (strcmp(e->d_name, ".") == 0 ||
			    strcmp(e->d_name, "..") == 0)
				continue;
			char sub[4096];
			int n = snprintf(sub, sizeof(sub), "%s/%s", path,
					 e->d_name);
			if (n > 0 && (size_t)n < sizeof(sub))
				dg__gen_remove_tree(sub);
		}
		if (d)
			closedir(d);
		rmdir(path);
	} else {
		unlink(path);
	}
}

dg_status dg__gen_mkdirs(const char *path, char *top, size_t size, char *err,
			 size_t esz)
{
	char buf[4096];
	struct stat sb;

	top[0] = '\0';
	int n = snprintf(buf, sizeof(buf), "%s", path);
	if (n <= 0 || (size_t)n >= sizeof(buf))
		return io_fail(err, esz, path, ENAMETOOLONG);
	while (n > 1 && buf[n - 1] == '/')
		buf[--n] = '\0';
	if (stat(buf, &sb) == 0)
		return S_ISDIR(sb.st_mode) ? DG_OK : io_fail(err, esz, path, ENOTDIR);
	for (char *p = buf + 1;; p++) {
		if (*p && *p != '/')
			continue;
		char c = *p;
		*p = '\0';
		if (mkdir(buf, 0755) == 0) {
			if (!top[0])
				snprintf(top, size, "%s", buf);
		} else if (errno != EEXIST) {
			int e = errno;
			dg__gen_rmdirs(buf, top);
			return io_fail(err, esz, buf, e);
		}
		*p = c;
		if (!c)
			return DG_OK;
	}
}

void dg__gen_rmdirs(const char *path, const char *top)
{
	char buf[4096];
	size_t tl = strlen(top);

	if (!tl || snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
		return;
	/* buf shrinks to each parent in turn; stop once top is removed */
	for (size_t n = strlen(buf); n >= tl;) {
		if (strncmp(buf, top, tl) != 0 || (buf[tl] && buf[tl] != '/'))
			return;
		rmdir(buf);
		if (n == tl)
			return;
		while (n > tl && buf[n - 1] == '/')
			n--;
		while (n > tl && buf[n - 1] != '/')
			n--;
		while (n > tl && buf[n - 1] == '/')
			n--;
		buf[n] = '\0';
	}
}

/* ---- JSON ------------------------------------------------------------------- */

int dg__gen_json_print(cJSON *j)
{
	char *text = j ? cJSON_Print(j) : NULL;
	cJSON_Delete(j);
	if (!text)
		return dg__gen_errs(DG__GEN_FAIL, DG_ERR_NOMEM, "out of memory printing JSON");
	fputs(text, stdout);
	fputc('\n', stdout);
	cJSON_free(text);
	json_err.printed = true;
	return DG__GEN_OK;
}

void dg__gen_json_mode(bool on)
{
	json_err.on = on;
}

void dg__gen_json_finish(int code)
{
	if (!json_err.on || json_err.printed || code == DG__GEN_OK)
		return;
	cJSON *j = cJSON_CreateObject();
	if (!j)
		return;
	cJSON_AddStringToObject(j, "error", json_err.have ? json_err.msg : "failed");
	cJSON_AddStringToObject(j, "status",
				dg_status_str(json_err.have ? json_err.st
							    : code == DG__GEN_USAGE ? DG_ERR_INVALID_ARG
										    : DG_ERR_INTERNAL));
	cJSON_AddNumberToObject(j, "exit", code);
	json_err.on = false; /* a failure to print is reported once, as text */
	dg__gen_json_print(j);
}
