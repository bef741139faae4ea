/*
 * Opening a user's file for reading, refusing what is not a regular file
 * without blocking (base/file.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/msg.h"

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
