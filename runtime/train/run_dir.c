/*
 * A training run's folder (runtime/train/run_dir.h): mkdir -p, the lock
 * one writer holds (dg_train_lock), and the log — whole lines appended by
 * one write each, and a resume's repair of it to its checkpoint.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/msg.h"
#include "base/publish.h"
#include "runtime/train/run_dir.h"

dg_status dg__rundir_make(const char *dir, char *msg, size_t size)
{
	char p[4096];
	if (!dir || !dir[0] || strlen(dir) >= sizeof(p))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "'%s': not a folder name (empty or too long)",
				dir ? dir : "(null)");
	snprintf(p, sizeof(p), "%s", dir);
	for (char *c = p + 1;; c++) {
		bool end = *c == '\0';
		if (*c == '/' || end) {
			*c = '\0';
			if (mkdir(p, 0777) && errno != EEXIST)
				return dg__msgf(DG_ERR_IO, msg, size, "%s: mkdir: %s", p, strerror(errno));
			if (end)
				break;
			*c = '/';
		}
	}
	return DG_OK;
}

/* ---- the lock ------------------------------------------------------------------ */

dg_status dg_train_lock(const char *dir, int *fd, long *holder, char *msg, size_t size)
{
	if (holder)
		*holder = 0;
	if (!fd)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_train_lock: NULL argument");
	*fd = -1;
	dg_status st = dg__rundir_make(dir, msg, size);
	if (st)
		return st;
	char p[4200];
	snprintf(p, sizeof(p), "%s/lock", dir);
	int f = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
	if (f < 0)
		return dg__msgf(DG_ERR_IO, msg, size, "%s: %s", p, strerror(errno));
	/* a holder that lets go between our try and our question: try again */
	for (int tries = 0; tries < 3; tries++) {
		struct flock l = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0 };
		if (fcntl(f, F_SETLK, &l) == 0) {
			char t[32];
			int n = snprintf(t, sizeof(t), "%ld\n", (long)getpid());
			/* the pid inside is for people (the lock is the fcntl one):
			 * a full disk that cannot take it blocks nothing */
			bool wrote = ftruncate(f, 0) == 0 && pwrite(f, t, (size_t)n, 0) == n;
			(void)wrote;
			*fd = f;
			return DG_OK;
		}
		if (errno != EAGAIN && errno != EACCES) {
			int e = errno;
			close(f);
			return dg__msgf(DG_ERR_IO, msg, size, "%s: lock: %s", p, strerror(e));
		}
		struct flock q = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0 };
		if (fcntl(f, F_GETLK, &q) == 0 && q.l_type != F_UNLCK) {
			close(f);
			if (holder)
				*holder = (long)q.l_pid;
			return dg__msgf(DG_ERR_IO, msg, size,
					"%s: in use by another training run (pid %ld holds %s); wait for it to end, or "
					"train into another --out",
					dir, (long)q.l_pid, p);
		}
	}
	close(f);
	return dg__msgf(DG_ERR_IO, msg, size, "%s: the lock %s is taken and let go over and over; try again", dir,
			p);
}

void dg_train_unlock(int fd)
{
	if (fd >= 0)
		close(fd); /* drops the fcntl lock */
}

/* ---- the log ------------------------------------------------------------------- */

dg_status dg__rundir_log_open(const char *path, bool append, int *fd, char *msg, size_t size)
{
	*fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (append ? 0 : O_TRUNC), 0666);
	return *fd < 0 ? dg__msgf(DG_ERR_IO, msg, size, "%s: %s", path, strerror(errno)) : DG_OK;
}

dg_status dg__rundir_log_write(int fd, const char *path, const char *line, size_t n, char *msg, size_t size)
{
	const off_t at = lseek(fd, 0, SEEK_END);
	ssize_t w;
	do
		w = write(fd, line, n);
	while (w < 0 && errno == EINTR);
	if (w == (ssize_t)n)
		return DG_OK;
	const int e = w < 0 ? errno : ENOSPC;
	if (w > 0 && at >= 0 && ftruncate(fd, at) != 0)
		return dg__msgf(DG_ERR_IO, msg, size, "%s: write: %s; its last line is cut short", path, strerror(e));
	return dg__msgf(DG_ERR_IO, msg, size, "%s: write: %s", path, strerror(e));
}

static void tell(dg_train_warn warn, void *user, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void tell(dg_train_warn warn, void *user, const char *fmt, ...)
{
	if (!warn)
		return;
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	warn(buf, user);
}

/* The step of a log line (getline's: len bytes, its newline included),
 * and whether it has a val_loss; -1 when it is not a whole log line. */
static int64_t line_step(char *line, ssize_t len, bool *has_val)
{
	if (len < 2 || line[len - 1] != '\n' || (ssize_t)strlen(line) != len)
		return -1; /* cut short, or a NUL inside */
	line[len - 1] = '\0';
	cJSON *j = cJSON_ParseWithOpts(line, NULL, true);
	line[len - 1] = '\n';
	const cJSON *s = j ? cJSON_GetObjectItemCaseSensitive(j, "step") : NULL;
	int64_t step = -1;
	if (cJSON_IsObject(j) && cJSON_IsNumber(s) && s->valuedouble >= 1 && s->valuedouble < 0x1p53 &&
	    s->valuedouble == floor(s->valuedouble))
		step = (int64_t)s->valuedouble;
	*has_val = j && cJSON_GetObjectItemCaseSensitive(j, "val_loss") != NULL;
	cJSON_Delete(j);
	return step;
}

/* The log at path to be rewritten whole (base/publish.h): a stream *o on
 * its temp file, committed or aborted through pub. */
static dg_status rewrite_open(dg__publish *pub, const char *path, FILE **o, char *msg, size_t size)
{
	dg_status st = dg__publish_begin(pub, path, 0666, msg, size);
	*o = st ? NULL : dg__publish_stream(pub);
	if (!st && !*o) {
		dg__publish_abort(pub);
		st = dg__msgf(DG_ERR_NOMEM, msg, size, "%s: out of memory", path);
	}
	return st;
}

static const char *plural(long long n)
{
	return n == 1 ? "" : "s";
}

/* "step 5 is" or "steps 5-9 are". */
static const char *steps_str(int64_t a, int64_t b, char *buf, size_t size)
{
	if (a == b)
		snprintf(buf, size, "step %" PRId64 " is", a);
	else
		snprintf(buf, size, "steps %" PRId64 "-%" PRId64 " are", a, b);
	return buf;
}

dg_status dg__rundir_log_repair(const char *path, int64_t ckpt, dg_train_warn warn, void *user,
				bool *last_no_val, char *msg, size_t size)
{
	*last_no_val = false;
	FILE *f = fopen(path, "r");
	if (!f) {
		if (errno != ENOENT)
			return dg__msgf(DG_ERR_IO, msg, size, "%s: %s", path, strerror(errno));
		if (ckpt > 0)
			tell(warn, user,
			     "%s: missing; steps 1-%" PRId64 " are not in the log, which goes on from step %" PRId64,
			     path, ckpt, ckpt + 1);
		return DG_OK;
	}
	dg__publish pub;
	FILE *o;
	dg_status st = rewrite_open(&pub, path, &o, msg, size);
	if (st) {
		fclose(f);
		return st;
	}
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	long long no = 0, bad = 0, bad_at = 0, back = 0, back_at = 0, past = 0;
	int64_t last = 0, back_step = 0, back_after = 0, gap_from = 0, gap_to = 0;
	long long gaps = 0; /* runs of steps missing between two lines kept */
	bool last_val = false;
	while ((len = getline(&line, &cap, f)) > 0) {
		no++;
		bool has_val = false;
		int64_t s = line_step(line, len, &has_val);
		if (s < 0) {
			bad_at = bad++ ? bad_at : no;
			continue;
		}
		if (s > ckpt) {
			past++;
			continue;
		}
		if (s <= last) {
			if (!back++) {
				back_at = no;
				back_step = s;
				back_after = last;
			}
			continue;
		}
		if (s > last + 1 && !gaps++) {
			gap_from = last + 1;
			gap_to = s - 1;
		}
		fwrite(line, 1, (size_t)len, o);
		last = s;
		last_val = has_val;
	}
	free(line);
	bool rerr = ferror(f) != 0;
	fclose(f);
	if (rerr) {
		int e = errno;
		dg__publish_abort(&pub);
		return dg__msgf(DG_ERR_IO, msg, size, "%s: read: %s", path, strerror(e));
	}
	if (bad || back || past)
		st = dg__publish_commit(&pub, msg, size);
	else
		dg__publish_abort(&pub);
	if (st)
		return st;
	if (bad)
		tell(warn, user, "%s: dropped %lld line%s that %s not a whole log line (the first: line %lld)", path,
		     bad, plural(bad), bad == 1 ? "was" : "were", bad_at);
	if (back)
		tell(warn, user,
		     "%s: dropped %lld line%s whose step does not follow the one before (the first: line %lld, step "
		     "%" PRId64 " after step %" PRId64 "); did two runs write this folder?",
		     path, back, plural(back), back_at, back_step, back_after);
	char span[64];
	if (gaps)
		tell(warn, user, "%s: %s missing from the log%s", path, steps_str(gap_from, gap_to, span, sizeof(span)),
		     gaps > 1 ? " (and more further on)" : "");
	if (last < ckpt)
		tell(warn, user, "%s ends at step %" PRId64 " and the checkpoint is step %" PRId64 ": %s missing from the log",
		     path, last, ckpt, steps_str(last + 1, ckpt, span, sizeof(span)));
	*last_no_val = last == ckpt && ckpt > 0 && !last_val;
	return DG_OK;
}

dg_status dg__rundir_log_set_val(const char *path, int64_t step, double v, char *msg, size_t size)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return dg__msgf(DG_ERR_IO, msg, size, "%s: %s", path, strerror(errno));
	char *buf = NULL;
	long n = -1;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0)
		buf = malloc((size_t)n + 1);
	bool ok = buf && fread(buf, 1, (size_t)n, f) == (size_t)n;
	fclose(f);
	if (!ok) {
		free(buf);
		return dg__msgf(DG_ERR_IO, msg, size, "%s: cannot read it back", path);
	}
	buf[n] = '\0';
	/* the last line: [start, n), its newline at n - 1 */
	long start = n - 1;
	while (start > 0 && buf[start - 1] != '\n')
		start--;
	long long s = -1;
	char *cut = n > 0 ? strstr(buf + start, ", \"tokens_per_s\"") : NULL;
	if (!cut)
		cut = n > 1 && buf[n - 2] == '}' ? buf + n - 2 : NULL;
	if (n < 2 || buf[n - 1] != '\n' || sscanf(buf + start, "{\"step\": %lld", &s) != 1 || s != step || !cut) {
		free(buf);
		return dg__msgf(DG_ERR_INTERNAL, msg, size, "%s: its last line is not step %" PRId64, path, step);
	}
	dg__publish pub;
	FILE *o;
	dg_status st = rewrite_open(&pub, path, &o, msg, size);
	if (st) {
		free(buf);
		return st;
	}
	fwrite(buf, 1, (size_t)(cut - buf), o);
	if (isfinite(v))
		fprintf(o, ", \"val_loss\": %.9g", v);
	else
		fputs(", \"val_loss\": null", o);
	fputs(cut, o);
	free(buf);
	return dg__publish_commit(&pub, msg, size);
}
