/*
 * The programs' file helpers (cli/common/files.h).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "cli/common/files.h"

/* Join, whole files and folders are base/file.h's, the library's too. */

bool dg__cli_join(char *buf, size_t size, const char *dir, const char *name)
{
	return dg__file_join(buf, size, dir, name);
}

dg_status dg__cli_write_file(const char *path, const void *data, size_t size, char *err, size_t esz)
{
	return dg__file_write(path, data, size, err, esz);
}

dg_status dg__cli_read_file(const char *path, size_t max, uint8_t **out,
			    size_t *size, char *err, size_t esz)
{
	return dg__file_read(path, max, out, size, err, esz);
}

void dg__cli_remove_tree(const char *path)
{
	dg__file_remove_tree(path);
}

dg_status dg__cli_mkdirs(const char *path, char *top, size_t size, char *err,
			 size_t esz)
{
	return dg__file_mkdirs(path, top, size, err, esz);
}

void dg__cli_rmdirs(const char *path, const char *top)
{
	dg__file_rmdirs(path, top);
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
