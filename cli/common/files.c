/*
 * The programs' file helpers (cli/common/files.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/publish.h"
#include "cli/common/files.h"

bool dg__cli_join(char *buf, size_t size, const char *dir, const char *name)
{
	int n = snprintf(buf, size, "%s/%s", dir, name);
	return n >= 0 && (size_t)n < size;
}

static dg_status io_fail(char *err, size_t esz, const char *path, int e)
{
	snprintf(err, esz, "%s: %s", path, strerror(e));
	return e == ENOMEM ? DG_ERR_NOMEM : DG_ERR_IO;
}

dg_status dg__cli_write_file(const char *path, const void *data, size_t size, char *err, size_t esz)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return io_fail(err, esz, path, errno);
	if (dg__publish_fd_write(fd, data, size) != 0 || fsync(fd) != 0) {
		int e = errno;
		close(fd);
		unlink(path);
		return io_fail(err, esz, path, e);
	}
	if (close(fd) != 0) {
		int e = errno;
		unlink(path);
		return io_fail(err, esz, path, e);
	}
	return DG_OK;
}

dg_status dg__cli_read_file(const char *path, size_t max, uint8_t **out,
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

void dg__cli_remove_tree(const char *path)
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
				dg__cli_remove_tree(sub);
		}
		if (d)
			closedir(d);
		rmdir(path);
	} else {
		unlink(path);
	}
}

dg_status dg__cli_mkdirs(const char *path, char *top, size_t size, char *err,
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
			dg__cli_rmdirs(buf, top);
			return io_fail(err, esz, buf, e);
		}
		*p = c;
		if (!c)
			return DG_OK;
	}
}

void dg__cli_rmdirs(const char *path, const char *top)
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
