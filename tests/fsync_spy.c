/*
 * Preloaded into a program under test (LD_PRELOAD), it notes each fsync
 * and rename the program makes, in order, one line each appended to the
 * file $DG_FSYNC_SPY:
 *   fsync <dev>:<ino>
 *   rename <from> <to>
 * and then does it. tests/test_cli_publish.c reads the lines back to see
 * that what a program publishes reaches the disk in the right order.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static void note(const char *line, int n)
{
	const char *path = getenv("DG_FSYNC_SPY");
	if (!path || n <= 0)
		return;
	int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	ssize_t w = write(fd, line, (size_t)n); /* one write a line: O_APPEND keeps lines whole */
	(void)w;
	close(fd);
}

int fsync(int fd)
{
	struct stat sb;
	char line[128];
	if (fstat(fd, &sb) == 0)
		note(line, snprintf(line, sizeof(line), "fsync %llu:%llu\n", (unsigned long long)sb.st_dev,
				    (unsigned long long)sb.st_ino));
	return (int)syscall(SYS_fsync, fd);
}

static void note_rename(int from_dir, const char *from, int to_dir, const char *to)
{
	char line[16384];
	/* relative names of a folder descriptor are noted as they are */
	(void)from_dir;
	(void)to_dir;
	int n = snprintf(line, sizeof(line), "rename %s %s\n", from, to);
	if (n > 0 && n < (int)sizeof(line))
		note(line, n);
}

int rename(const char *from, const char *to)
{
	static int (*real)(const char *, const char *);
	if (!real)
		real = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
	note_rename(AT_FDCWD, from, AT_FDCWD, to);
	return real(from, to);
}

int renameat(int from_dir, const char *from, int to_dir, const char *to)
{
	static int (*real)(int, const char *, int, const char *);
	if (!real)
		real = (int (*)(int, const char *, int, const char *))dlsym(RTLD_NEXT, "renameat");
	note_rename(from_dir, from, to_dir, to);
	return real(from_dir, from, to_dir, to);
}
