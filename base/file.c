/*
 * Opening a user's file for reading, refusing what is not a regular file
 * without blocking; a staging writer's files and folders (base/file.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/msg.h"
#include "base/publish.h"

/* "a directory", "a FIFO"...: what a non-regular mode is */
static const char *kind_of(mode_t m)
{
	return S_ISDIR(m)    ? "a directory"
	       : S_ISFIFO(m) ? "a FIFO (named pipe)"
	       : S_ISSOCK(m) ? "a socket"
	       : S_ISCHR(m)  ? "a character device"
	       : S_ISBLK(m)  ? "a block device"
			     : "not a plain file";
}

static dg_status not_regular(const char *path, mode_t m, char *msg, size_t msg_size)
{
	return dg__msgf(DG_ERR_IO, msg, msg_size, "%s: %s, not a regular file: give a file's path", path,
			kind_of(m));
}

dg_status dg__file_open_regular(const char *path, FILE **out, uint64_t *size, char *msg,
				size_t msg_size)
{
	struct stat sb;

	*out = NULL;
	*size = 0;
	/* O_NONBLOCK: opening a FIFO does not wait for a writer (it is then
	 * refused below); O_NOCTTY: a terminal never becomes ours */
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		/* a socket does not open (ENXIO): say what it is */
		if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
			return not_regular(path, sb.st_mode, msg, msg_size);
		return dg__msgf(e == ENOENT ? DG_ERR_NOT_FOUND : DG_ERR_IO, msg, msg_size, "%s: %s", path,
				strerror(e));
	}
	if (fstat(fd, &sb) != 0) {
		int e = errno;
		close(fd);
		return dg__msgf(DG_ERR_IO, msg, msg_size, "%s: %s", path, strerror(e));
	}
	if (!S_ISREG(sb.st_mode)) {
		close(fd);
		return not_regular(path, sb.st_mode, msg, msg_size);
	}
	int fl = fcntl(fd, F_GETFL);
	FILE *f = fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0 ? NULL : fdopen(fd, "rb");
	if (!f) {
		int e = errno;
		close(fd);
		return dg__msgf(e == ENOMEM ? DG_ERR_NOMEM : DG_ERR_IO, msg, msg_size, "%s: %s", path,
				strerror(e));
	}
	*out = f;
	*size = (uint64_t)sb.st_size;
	return DG_OK;
}

/* ---- a staging writer's files and folders ----------------------------------- */

bool dg__file_join(char *buf, size_t size, const char *dir, const char *name)
{
	int n = snprintf(buf, size, "%s/%s", dir, name);
	return n >= 0 && (size_t)n < size;
}

static dg_status io_fail(char *msg, size_t msg_size, const char *path, int e)
{
	return dg__msgf(e == ENOMEM ? DG_ERR_NOMEM : DG_ERR_IO, msg, msg_size, "%s: %s", path,
			strerror(e));
}

dg_status dg__file_write(const char *path, const void *data, size_t size, char *msg,
			 size_t msg_size)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return io_fail(msg, msg_size, path, errno);
	if (dg__publish_fd_write(fd, data, size) != 0 || fsync(fd) != 0) {
		int e = errno;
		close(fd);
		unlink(path);
		return io_fail(msg, msg_size, path, e);
	}
	if (close(fd) != 0) {
		int e = errno;
		unlink(path);
		return io_fail(msg, msg_size, path, e);
	}
	return DG_OK;
}

dg_status dg__file_read(const char *path, size_t max, uint8_t **out, size_t *size, char *msg,
			size_t msg_size)
{
	struct stat sb;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		io_fail(msg, msg_size, path, e);
		return e == ENOENT ? DG_ERR_NOT_FOUND : DG_ERR_IO;
	}
	dg_status st = DG_OK;
	uint8_t *buf = NULL;
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
		st = dg__msgf(DG_ERR_IO, msg, msg_size, "%s: not a regular file", path);
		goto out;
	}
	if ((uint64_t)sb.st_size > max) {
		st = dg__msgf(DG_ERR_IO, msg, msg_size, "%s: %lld bytes, more than %zu", path,
			      (long long)sb.st_size, max);
		goto out;
	}
	buf = malloc((size_t)sb.st_size + 1);
	if (!buf) {
		st = io_fail(msg, msg_size, path, ENOMEM);
		goto out;
	}
	size_t got = 0;
	while (got < (size_t)sb.st_size) {
		ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			st = io_fail(msg, msg_size, path, r < 0 ? errno : EIO);
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

void dg__file_remove_tree(const char *path)
{
	struct stat sb;
	if (lstat(path, &sb) != 0)
		return;
	if (S_ISDIR(sb.st_mode)) {
		DIR *d = opendir(path);
		struct dirent *e;
		while (d && (e = readdir(d))) {
			if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
				continue;
			char sub[4096];
			if (dg__file_join(sub, sizeof(sub), path, e->d_name))
				dg__file_remove_tree(sub);
		}
		if (d)
			closedir(d);
		rmdir(path);
	} else {
		unlink(path);
	}
}

dg_status dg__file_mkdirs(const char *path, char *top, size_t size, char *msg, size_t msg_size)
{
	char buf[4096];
	struct stat sb;

	top[0] = '\0';
	int n = snprintf(buf, sizeof(buf), "%s", path);
	if (n <= 0 || (size_t)n >= sizeof(buf))
		return io_fail(msg, msg_size, path, ENAMETOOLONG);
	while (n > 1 && buf[n - 1] == '/')
		buf[--n] = '\0';
	if (stat(buf, &sb) == 0)
		return S_ISDIR(sb.st_mode) ? DG_OK : io_fail(msg, msg_size, path, ENOTDIR);
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
			dg__file_rmdirs(buf, top);
			return io_fail(msg, msg_size, buf, e);
		}
		*p = c;
		if (!c)
			return DG_OK;
	}
}

void dg__file_rmdirs(const char *path, const char *top)
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
