/*
 * Publishing a file whole (base/publish.h): temp file beside it, write,
 * fsync, rename, fsync of the folder; on failure the temp file goes.
 */
#define _GNU_SOURCE /* fopencookie */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/msg.h"
#include "base/publish.h"

static const char *const step_names[] = {
	[DG__PUBLISH_NONE] = "nothing",
	[DG__PUBLISH_CREATE] = "create the temp file",
	[DG__PUBLISH_WRITE] = "write",
	[DG__PUBLISH_FSYNC] = "fsync",
	[DG__PUBLISH_CLOSE] = "close",
	[DG__PUBLISH_RENAME] = "rename the temp file over it",
	[DG__PUBLISH_SYNC_DIR] = "fsync the folder",
};

const char *dg__publish_step_str(dg__publish_step s)
{
	return (unsigned)s < sizeof(step_names) / sizeof(step_names[0]) ? step_names[s] : "?";
}

int dg__publish_fd_write(int fd, const void *data, size_t size)
{
	const unsigned char *p = data;

	while (size) {
		ssize_t k = write(fd, p, size);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -1;
		if (k == 0) {
			errno = ENOSPC; /* no progress and no errno: a full disk */
			return -1;
		}
		p += k;
		size -= (size_t)k;
	}
	return 0;
}

static int fsync_retry(int fd)
{
	int r;

	do
		r = fsync(fd);
	while (r < 0 && errno == EINTR);
	return r;
}

/* fsync of an open folder: 0, or -1 with errno (EINVAL, a file system
 * that cannot sync a folder, counts as done). */
static int sync_dir_fd(int dfd)
{
	return fsync_retry(dfd) < 0 && errno != EINVAL ? -1 : 0;
}

/* The folder part of path ("." for a bare name, "/" for one at the root). */
static void dir_of(const char *path, char *dir, size_t size)
{
	const char *slash = strrchr(path, '/');

	if (!slash)
		snprintf(dir, size, ".");
	else if (slash == path)
		snprintf(dir, size, "/");
	else
		snprintf(dir, size, "%.*s", (int)(slash - path), path);
}

dg_status dg__publish_sync_dir(const char *dir, char *msg, size_t msg_size)
{
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (dfd < 0)
		return DG_OK; /* nothing to sync it through (no read permission) */
	int r = sync_dir_fd(dfd), e = errno;
	close(dfd);
	if (r < 0)
		return dg__msgf(DG_ERR_IO, msg, msg_size, "%s: fsync the folder: %s (errno %d)", dir,
				strerror(e), e);
	return DG_OK;
}

/* A temp name no other publisher of this process or another one picks:
 * the pid, a counter of this process, and random bits (O_EXCL makes it
 * sure; a clash only costs a retry). */
static unsigned long long temp_tag(void)
{
	static atomic_uint counter;
	uint64_t r;
	unsigned c = atomic_fetch_add(&counter, 1) & 0xfff;

	if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		r = (uint64_t)ts.tv_nsec * 2654435761u ^ (uint64_t)ts.tv_sec;
	}
	/* the counter in the top hex digits, so one process's names differ
	 * even if the random bits repeat */
	return ((unsigned long long)c << 52) | (r & ((1ull << 52) - 1));
}

/* The failure of step s with errno e: the temp file (if any) removed, the
 * message as publish.h says. */
static dg_status fail(dg__publish *p, dg__publish_step s, int e, char *msg, size_t msg_size)
{
	p->failed = s;
	p->err = e;
	if (p->stream) {
		fclose(p->stream); /* closes fd */
		p->stream = NULL;
		p->fd = -1;
	} else if (p->fd >= 0) {
		close(p->fd);
		p->fd = -1;
	}
	if (s == DG__PUBLISH_CREATE)
		return dg__msgf(DG_ERR_IO, msg, msg_size, "%s: %s %s: %s (errno %d); the file is as it was",
				p->dst, dg__publish_step_str(s), p->tmp, strerror(e), e);
	bool kept = unlinkat(p->tmp_dir, p->tmp, 0) != 0 && errno != ENOENT;
	return dg__msgf(DG_ERR_IO, msg, msg_size,
			"%s: %s: %s (errno %d); the file is as it was, and its temp file %s %s", p->dst,
			dg__publish_step_str(s), strerror(e), e, p->tmp,
			kept ? "could not be removed" : "is removed");
}

static dg_status begin(dg__publish *p, mode_t mode, char *msg, size_t msg_size)
{
	int e = EEXIST;

	for (int i = 0; i < 16 && p->fd < 0; i++) {
		int n = snprintf(p->tmp, sizeof(p->tmp), "%s.tmp.%ld.%llx", p->dst, (long)getpid(),
				 temp_tag());
		if (n < 0 || (size_t)n >= sizeof(p->tmp))
			return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "%s: path too long", p->dst);
		p->fd = openat(p->tmp_dir, p->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
		if (p->fd < 0 && (e = errno) != EEXIST)
			break;
	}
	if (p->fd < 0)
		return fail(p, DG__PUBLISH_CREATE, e, msg, msg_size);
	return DG_OK;
}

static dg_status init(dg__publish *p, const char *name, char *msg, size_t msg_size)
{
	p->fd = -1;
	p->stream = NULL;
	p->failed = DG__PUBLISH_NONE;
	p->err = 0;
	p->tmp[0] = '\0';
	if (!name || !name[0])
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "publish: no file name");
	size_t n = strlen(name);
	if (n >= sizeof(p->dst))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "%.200s...: path too long (%zu bytes, at most %d)",
				name, n, DG__PUBLISH_PATH_MAX - 1);
	memcpy(p->dst, name, n + 1);
	return DG_OK;
}

dg_status dg__publish_begin(dg__publish *p, const char *path, mode_t mode, char *msg,
			    size_t msg_size)
{
	p->tmp_dir = p->dst_dir = AT_FDCWD;
	p->dir_given = false;
	dg_status st = init(p, path, msg, msg_size);
	return st ? st : begin(p, mode, msg, msg_size);
}

dg_status dg__publish_begin_at(dg__publish *p, int tmp_dir, int dst_dir, const char *name,
			       mode_t mode, char *msg, size_t msg_size)
{
	p->tmp_dir = tmp_dir;
	p->dst_dir = dst_dir;
	p->dir_given = true;
	dg_status st = init(p, name, msg, msg_size);
	return st ? st : begin(p, mode, msg, msg_size);
}

dg_status dg__publish_write(dg__publish *p, const void *data, size_t size, char *msg,
			    size_t msg_size)
{
	if (dg__publish_fd_write(p->fd, data, size) < 0)
		return fail(p, DG__PUBLISH_WRITE, errno, msg, msg_size);
	return DG_OK;
}

/* The stream's writes go to fd through dg__publish_fd_write, and the
 * first failure's errno is kept in p->err for the commit to report (a
 * plain stdio stream forgets it by then). */
static ssize_t stream_write(void *cookie, const char *buf, size_t size)
{
	dg__publish *p = cookie;
	if (dg__publish_fd_write(p->fd, buf, size) < 0) {
		if (!p->err)
			p->err = errno;
		return -1;
	}
	return (ssize_t)size;
}

static int stream_close(void *cookie)
{
	dg__publish *p = cookie;
	return close(p->fd);
}

FILE *dg__publish_stream(dg__publish *p)
{
	if (!p->stream && p->fd >= 0)
		p->stream = fopencookie(p, "w", (cookie_io_functions_t){ .write = stream_write,
									 .close = stream_close });
	return p->stream;
}

dg_status dg__publish_commit(dg__publish *p, char *msg, size_t msg_size)
{
	if (p->fd < 0)
		return dg__msgf(DG_ERR_INTERNAL, msg, msg_size, "%s: commit without an open temp file",
				p->dst);
	if (p->stream && (fflush(p->stream) != 0 || ferror(p->stream)))
		return fail(p, DG__PUBLISH_WRITE, p->err ? p->err : EIO, msg, msg_size);
	/* a delayed write error (a full disk, NFS) shows at fsync or close */
	if (fsync_retry(p->fd) < 0)
		return fail(p, DG__PUBLISH_FSYNC, errno, msg, msg_size);
	int r = p->stream ? fclose(p->stream) : close(p->fd);
	p->stream = NULL;
	p->fd = -1;
	if (r != 0)
		return fail(p, DG__PUBLISH_CLOSE, errno, msg, msg_size);
	if (renameat(p->tmp_dir, p->tmp, p->dst_dir, p->dst) != 0)
		return fail(p, DG__PUBLISH_RENAME, errno, msg, msg_size);
	/* the rename itself is durable once the folder is synced */
	char dir[DG__PUBLISH_PATH_MAX] = "";
	int e = 0;
	if (p->dir_given) {
		if (sync_dir_fd(p->dst_dir) < 0)
			e = errno;
	} else {
		dir_of(p->dst, dir, sizeof(dir));
		int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) { /* else nothing to sync it through (no read permission) */
			if (sync_dir_fd(dfd) < 0)
				e = errno;
			close(dfd);
		}
	}
	if (e) {
		p->failed = DG__PUBLISH_SYNC_DIR;
		p->err = e;
		return dg__msgf(DG_ERR_IO, msg, msg_size,
				"%s: fsync the folder%s%s: %s (errno %d); the file is in place but may not "
				"survive a power loss",
				p->dst, dir[0] ? " " : "", dir, strerror(e), e);
	}
	return DG_OK;
}

bool dg__publish_temp_of(const char *name, size_t *target_len, long *pid)
{
	const char *t = NULL;
	for (const char *q = strstr(name, ".tmp."); q; q = strstr(q + 1, ".tmp."))
		t = q; /* the last ".tmp.": a target's own name may hold one */
	if (!t || t == name)
		return false;
	const char *d = t + 5, *dot = strchr(d, '.');
	if (!dot || dot == d || !dot[1])
		return false;
	long v = 0;
	for (const char *c = d; c < dot; c++) {
		if (*c < '0' || *c > '9' || v > LONG_MAX / 10 - 9)
			return false;
		v = v * 10 + (*c - '0');
	}
	for (const char *c = dot + 1; *c; c++)
		if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
			return false;
	if (target_len)
		*target_len = (size_t)(t - name);
	if (pid)
		*pid = v;
	return true;
}

void dg__publish_abort(dg__publish *p)
{
	if (p->fd < 0)
		return;
	if (p->stream)
		fclose(p->stream);
	else
		close(p->fd);
	p->stream = NULL;
	p->fd = -1;
	unlinkat(p->tmp_dir, p->tmp, 0);
}

dg_status dg__publish_file(const char *path, const void *data, size_t size, char *msg,
			   size_t msg_size)
{
	dg__publish p;
	dg_status st = dg__publish_begin(&p, path, 0644, msg, msg_size);

	if (!st)
		st = dg__publish_write(&p, data, size, msg, msg_size);
	if (!st)
		st = dg__publish_commit(&p, msg, msg_size);
	return st;
}
