/*
 * base/publish.h: a file appears whole or not at all, and survives a
 * power loss once published.
 *
 *  - dg__publish_file writes, replaces, leaves no temp file, and fsyncs
 *    the file and its folder (fsync is watched: this program's own fsync
 *    stands in front of the C library's, for libdragon's calls too);
 *  - failures: a folder that is not there, a path through a file, a folder
 *    the writer may not write, a file-size limit (EFBIG with
 *    SIGXFSZ ignored), a full tmpfs (ENOSPC, where a mount namespace can be
 *    had), a target that is a folder (the rename): DG_ERR_IO naming the
 *    path, the step and errno, the temp file removed, the old file as it
 *    was;
 *  - a streaming publish: through fd, through a stdio stream, aborted;
 *  - processes and threads publishing one path while a reader reads it:
 *    every read is one whole version, and no temp file is left;
 *  - a training run's log, rewritten on resume (runtime/train/run_dir.c),
 *    goes through it: the folder is synced too.
 */
#define _GNU_SOURCE /* unshare, CLONE_NEWNS */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "base/publish.h"
#include "helpers.h"
#include "runtime/train/run_dir.h"

/* ---- fsync, watched ------------------------------------------------------------ */

static pthread_mutex_t spy_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
	dev_t dev;
	ino_t ino;
} synced[4096];
static int n_synced;

/* Stands in front of the C library's fsync (libdragon's calls land here):
 * notes what was synced, then syncs it. */
int fsync(int fd)
{
	struct stat sb;
	if (fstat(fd, &sb) == 0) {
		pthread_mutex_lock(&spy_mu);
		if (n_synced < (int)(sizeof(synced) / sizeof(synced[0]))) {
			synced[n_synced].dev = sb.st_dev;
			synced[n_synced].ino = sb.st_ino;
			n_synced++;
		}
		pthread_mutex_unlock(&spy_mu);
	}
	return (int)syscall(SYS_fsync, fd);
}

/* Whether the file or folder now at path was fsync'd (by inode: the
 * temp file that became it counts). */
static bool was_synced(const char *path)
{
	struct stat sb;
	bool yes = false;
	cr_assert_eq(stat(path, &sb), 0, "%s: %s", path, strerror(errno));
	pthread_mutex_lock(&spy_mu);
	for (int i = 0; i < n_synced && !yes; i++)
		yes = synced[i].dev == sb.st_dev && synced[i].ino == sb.st_ino;
	pthread_mutex_unlock(&spy_mu);
	return yes;
}

static void spy_reset(void)
{
	pthread_mutex_lock(&spy_mu);
	n_synced = 0;
	pthread_mutex_unlock(&spy_mu);
}

/* ---- helpers ------------------------------------------------------------------- */

static char *bytes_of(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 1 << 16, len = 0;
	char *b = malloc(cap + 1);
	cr_assert_not_null(b);
	for (size_t k; (k = fread(b + len, 1, cap - len, f)) > 0;) {
		len += k;
		if (len == cap) {
			cap *= 2;
			b = realloc(b, cap + 1);
			cr_assert_not_null(b);
		}
	}
	fclose(f);
	b[len] = '\0';
	*n = len;
	return b;
}

/* The names in dir, sorted, joined by spaces. */
static void names_in(const char *dir, char *out, size_t size)
{
	struct dirent **v;
	int n = scandir(dir, &v, NULL, alphasort);
	cr_assert_geq(n, 0, "%s: %s", dir, strerror(errno));
	size_t at = 0;
	out[0] = '\0';
	for (int i = 0; i < n; i++) {
		if (strcmp(v[i]->d_name, ".") && strcmp(v[i]->d_name, ".."))
			at += (size_t)snprintf(out + at, at < size ? size - at : 0, "%s%s", at ? " " : "",
					       v[i]->d_name);
		free(v[i]);
	}
	free(v);
}

static void expect_names(const char *dir, const char *want)
{
	char got[4096];
	names_in(dir, got, sizeof(got));
	cr_expect_str_eq(got, want, "%s holds \"%s\", not \"%s\" (a temp file left?)", dir, got, want);
}

static void expect_text(const char *path, const char *want)
{
	size_t n;
	char *got = bytes_of(path, &n);
	cr_assert_not_null(got, "%s: %s", path, strerror(errno));
	cr_expect_str_eq(got, want, "%s", path);
	free(got);
}

/* n bytes of 'b' (malloc'd) */
static char *filled(size_t n)
{
	char *b = malloc(n);
	cr_assert_not_null(b);
	memset(b, 'b', n);
	return b;
}

static void put(const char *path, const char *text)
{
	char msg[1024];
	cr_assert_eq(dg__publish_file(path, text, strlen(text), msg, sizeof(msg)), DG_OK, "%s", msg);
}

/* ---- publishing ------------------------------------------------------------------ */

Test(publish, a_file_appears_whole_and_its_folder_is_synced)
{
	char *dir = dg_test_tmpdir(), path[1024];
	snprintf(path, sizeof(path), "%s/f.json", dir);
	spy_reset();
	put(path, "one");
	expect_text(path, "one");
	expect_names(dir, "f.json");
	cr_expect(was_synced(path), "the file was not fsync'd");
	cr_expect(was_synced(dir), "its folder was not fsync'd");
	struct stat sb;
	mode_t um = umask(0);
	umask(um);
	cr_assert_eq(stat(path, &sb), 0);
	cr_expect_eq(sb.st_mode & 0777, 0644 & ~um, "mode %o", sb.st_mode & 0777);

	/* a replacement, shorter than the first: nothing of it is left */
	put(path, "2");
	expect_text(path, "2");
	expect_names(dir, "f.json");
	/* nothing at all is a file too */
	put(path, "");
	expect_text(path, "");
	dg_test_rmtree(dir);
}

Test(publish, a_bare_name_publishes_into_the_working_folder)
{
	char *dir = dg_test_tmpdir(), was[1024];
	cr_assert_not_null(getcwd(was, sizeof(was)));
	cr_assert_eq(chdir(dir), 0);
	spy_reset();
	put("bare", "x");
	expect_text("bare", "x");
	cr_expect(was_synced("."), "the working folder was not fsync'd");
	cr_assert_eq(chdir(was), 0);
	dg_test_rmtree(dir);
}

Test(publish, the_temp_file_names_its_target_and_writer)
{
	char *dir = dg_test_tmpdir(), path[1024], msg[512];
	snprintf(path, sizeof(path), "%s/ckpt.tmp.7.ab.safetensors", dir); /* ".tmp." in its own name */
	dg__publish p;
	cr_assert_eq(dg__publish_begin(&p, path, 0644, msg, sizeof(msg)), DG_OK, "%s", msg);
	const char *base = strrchr(p.tmp, '/') + 1;
	size_t n = 0;
	long pid = 0;
	cr_assert(dg__publish_temp_of(base, &n, &pid), "%s", base);
	cr_expect_eq(n, strlen("ckpt.tmp.7.ab.safetensors"), "%s", base);
	cr_expect_eq(pid, (long)getpid(), "%s", base);
	/* two publishes of one path at once never share a temp file */
	dg__publish q;
	cr_assert_eq(dg__publish_begin(&q, path, 0644, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_expect_str_neq(p.tmp, q.tmp);
	dg__publish_abort(&q);
	dg__publish_abort(&p);
	dg__publish_abort(&p); /* twice: nothing */
	expect_names(dir, "");
	dg_test_rmtree(dir);
}

/* ---- failures ----------------------------------------------------------------------- */

/* msg starts "<path>: <step>: <strerror(e)> (errno e)" */
static void expect_msg(const char *msg, const char *path, const char *step, int e)
{
	char want[2048];
	snprintf(want, sizeof(want), "%s: %s", path, step);
	cr_expect(strncmp(msg, want, strlen(want)) == 0, "\"%s\" does not start \"%s\"", msg, want);
	snprintf(want, sizeof(want), ": %s (errno %d)", strerror(e), e);
	cr_expect(strstr(msg, want), "\"%s\" does not say \"%s\"", msg, want);
	cr_expect(strstr(msg, "the file is as it was"), "%s", msg);
}

Test(publish, a_folder_that_is_not_there_is_named_with_errno)
{
	char *dir = dg_test_tmpdir(), path[1024], msg[2048];
	snprintf(path, sizeof(path), "%s/none/f", dir);
	cr_assert_eq(dg__publish_file(path, "x", 1, msg, sizeof(msg)), DG_ERR_IO);
	expect_msg(msg, path, "create the temp file", ENOENT);
	/* through a file */
	snprintf(path, sizeof(path), "%s/file", dir);
	put(path, "x");
	snprintf(path, sizeof(path), "%s/file/f", dir);
	cr_assert_eq(dg__publish_file(path, "x", 1, msg, sizeof(msg)), DG_ERR_IO);
	expect_msg(msg, path, "create the temp file", ENOTDIR);
	expect_names(dir, "file");
	dg_test_rmtree(dir);
}

/* A folder the writer may not write: as root, the publish runs in a child
 * that has become nobody (root writes any folder). */
Test(publish, an_unwritable_folder_keeps_the_old_file)
{
	char *dir = dg_test_tmpdir(), path[1024], msg[2048] = "";
	snprintf(path, sizeof(path), "%s/f", dir);
	put(path, "old");
	cr_assert_eq(chmod(dir, 0555), 0);
	int fds[2];
	cr_assert_eq(pipe(fds), 0);
	pid_t kid = fork();
	cr_assert_geq(kid, 0);
	if (kid == 0) {
		close(fds[0]);
		if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
			_exit(2);
		dg_status st = dg__publish_file(path, "new", 3, msg, sizeof(msg));
		ssize_t w = write(fds[1], msg, strlen(msg) + 1);
		_exit(w > 0 && st == DG_ERR_IO ? 0 : 1);
	}
	close(fds[1]);
	ssize_t n = read(fds[0], msg, sizeof(msg) - 1);
	close(fds[0]);
	msg[n > 0 ? n : 0] = '\0';
	int status;
	cr_assert_eq(waitpid(kid, &status, 0), kid);
	cr_assert_eq(chmod(dir, 0755), 0);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d: %s", status, msg);
	expect_msg(msg, path, "create the temp file", EACCES);
	expect_text(path, "old");
	expect_names(dir, "f");
	dg_test_rmtree(dir);
}

Test(publish, a_file_size_limit_fails_the_write_and_removes_the_temp_file)
{
	char *dir = dg_test_tmpdir(), path[1024], msg[2048];
	snprintf(path, sizeof(path), "%s/big", dir);
	put(path, "old");
	size_t n = 1 << 16;
	char *big = filled(n);
	struct rlimit was, lim;
	cr_assert_eq(getrlimit(RLIMIT_FSIZE, &was), 0);
	lim = was;
	lim.rlim_cur = n / 4;
	void (*xfsz)(int) = signal(SIGXFSZ, SIG_IGN);
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
	dg_status st = dg__publish_file(path, big, n, msg, sizeof(msg));
	/* the same through a stdio stream: the error shows at the commit */
	char spath[1024], smsg[2048];
	snprintf(spath, sizeof(spath), "%s/streamed", dir);
	dg__publish p;
	dg_status sst = dg__publish_begin(&p, spath, 0644, smsg, sizeof(smsg));
	FILE *f = sst ? NULL : dg__publish_stream(&p);
	if (f) {
		fwrite(big, 1, n, f);
		sst = dg__publish_commit(&p, smsg, sizeof(smsg));
	}
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &was), 0);
	signal(SIGXFSZ, xfsz);
	free(big);

	cr_assert_eq(st, DG_ERR_IO, "%s", msg);
	expect_msg(msg, path, "write", EFBIG);
	cr_expect(strstr(msg, "is removed"), "%s", msg);
	expect_text(path, "old");
	cr_assert_not_null(f);
	cr_assert_eq(sst, DG_ERR_IO, "%s", smsg);
	expect_msg(smsg, spath, "write", EFBIG);
	expect_names(dir, "big");
	dg_test_rmtree(dir);
}

Test(publish, a_full_disk_fails_the_write_and_frees_its_space)
{
	char *dir = dg_test_tmpdir(), path[1024], msg[2048];
	/* a tmpfs of 64 KiB of our own, where a mount namespace can be had */
	if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
	    mount("tmpfs", dir, "tmpfs", 0, "size=64k") != 0) {
		int e = errno;
		dg_test_rmtree(dir);
		cr_skip_test("no tmpfs of our own here (%s): the file-size limit test stands in", strerror(e));
	}
	snprintf(path, sizeof(path), "%s/f", dir);
	put(path, "old");
	size_t n = 1 << 17;
	char *big = filled(n);
	cr_assert_eq(dg__publish_file(path, big, n, msg, sizeof(msg)), DG_ERR_IO);
	expect_msg(msg, path, "write", ENOSPC);
	cr_expect(strstr(msg, "is removed"), "%s", msg);
	expect_text(path, "old");
	expect_names(dir, "f");
	/* the space the temp file took is free again */
	cr_assert_eq(dg__publish_file(path, big, n / 4, msg, sizeof(msg)), DG_OK, "%s", msg);
	free(big);
	umount(dir);
	dg_test_rmtree(dir);
}

Test(publish, a_folder_in_the_way_fails_the_rename)
{
	char *dir = dg_test_tmpdir(), path[1024], inner[1100], msg[2048];
	snprintf(path, sizeof(path), "%s/sub", dir);
	cr_assert_eq(mkdir(path, 0755), 0);
	snprintf(inner, sizeof(inner), "%s/keep", path);
	put(inner, "kept");
	cr_assert_eq(dg__publish_file(path, "x", 1, msg, sizeof(msg)), DG_ERR_IO);
	expect_msg(msg, path, "rename the temp file over it", EISDIR);
	cr_expect(strstr(msg, "is removed"), "%s", msg);
	expect_text(inner, "kept");
	expect_names(dir, "sub");
	dg_test_rmtree(dir);
}

Test(publish, a_path_too_long_is_refused)
{
	char path[DG__PUBLISH_PATH_MAX + 8], msg[512];
	memset(path, 'a', sizeof(path) - 1);
	path[sizeof(path) - 1] = '\0';
	cr_expect_eq(dg__publish_file(path, "x", 1, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_expect(strstr(msg, "path too long"), "%s", msg);
}

/* ---- streaming -------------------------------------------------------------------- */

Test(publish, a_stream_commits_whole_and_an_abort_leaves_the_old_file)
{
	char *dir = dg_test_tmpdir(), path[1024], msg[2048];
	snprintf(path, sizeof(path), "%s/log", dir);
	put(path, "old\n");

	dg__publish p;
	cr_assert_eq(dg__publish_begin(&p, path, 0600, msg, sizeof(msg)), DG_OK, "%s", msg);
	FILE *f = dg__publish_stream(&p);
	cr_assert_not_null(f);
	cr_assert_eq(dg__publish_stream(&p), f, "one stream a publish");
	for (int i = 0; i < 1000; i++)
		fprintf(f, "line %d\n", i);
	expect_text(path, "old\n"); /* nothing shows before the commit */
	spy_reset();
	cr_assert_eq(dg__publish_commit(&p, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_expect(was_synced(path) && was_synced(dir));
	size_t n;
	char *got = bytes_of(path, &n);
	cr_assert(got && strncmp(got, "line 0\nline 1\n", 14) == 0 && strstr(got, "line 999\n"), "%s", got);
	free(got);
	struct stat sb;
	cr_assert_eq(stat(path, &sb), 0);
	cr_expect_eq(sb.st_mode & 0077, 0, "mode %o", sb.st_mode & 0777);
	dg__publish_abort(&p); /* after a commit: nothing */
	cr_assert_eq(stat(path, &sb), 0);

	/* through fd, then aborted */
	cr_assert_eq(dg__publish_begin(&p, path, 0644, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg__publish_write(&p, "new", 3, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(write(p.fd, "er", 2), 2);
	dg__publish_abort(&p);
	got = bytes_of(path, &n);
	cr_expect(got && strncmp(got, "line 0\n", 7) == 0, "%s", got);
	free(got);
	expect_names(dir, "log");
	dg_test_rmtree(dir);
}

/* ---- concurrency ---------------------------------------------------------------- */

#define VBYTES (64 << 10)
#define WRITERS 4
#define VERSIONS 40

/* Version v (1..255): VBYTES + v bytes, every one v. */
static dg_status put_version(const char *path, unsigned v, char *msg, size_t size)
{
	size_t n = VBYTES + v;
	unsigned char *b = malloc(n);
	if (!b)
		return DG_ERR_NOMEM;
	memset(b, (int)v, n);
	dg_status st = dg__publish_file(path, b, n, msg, size);
	free(b);
	return st;
}

/* Whether path now holds one whole version (or nothing yet). */
static bool whole(const char *path, unsigned *v)
{
	size_t n;
	unsigned char *b = (unsigned char *)bytes_of(path, &n);
	if (!b)
		return errno == ENOENT;
	bool ok = n > VBYTES && n - VBYTES == b[0];
	for (size_t i = 1; ok && i < n; i++)
		ok = b[i] == b[0];
	*v = b[0];
	free(b);
	return ok;
}

Test(publish, processes_publishing_one_path_leave_one_whole_version, .timeout = 120)
{
	char *dir = dg_test_tmpdir(), path[1024];
	snprintf(path, sizeof(path), "%s/shared", dir);
	pid_t kids[WRITERS];
	for (int w = 0; w < WRITERS; w++) {
		kids[w] = fork();
		cr_assert_geq(kids[w], 0);
		if (kids[w] == 0) {
			char msg[2048];
			for (unsigned i = 0; i < VERSIONS; i++)
				if (put_version(path, 1 + (unsigned)w * VERSIONS + i, msg, sizeof(msg)))
					_exit(1);
			_exit(0);
		}
	}
	int reads = 0, done = 0, status;
	unsigned v = 0;
	while (done < WRITERS) {
		cr_assert(whole(path, &v), "a read saw a part of a version (first byte %u)", v);
		reads++;
		for (int w = 0; w < WRITERS; w++)
			if (kids[w] > 0 && waitpid(kids[w], &status, WNOHANG) == kids[w]) {
				cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer %d failed", w);
				kids[w] = 0;
				done++;
			}
	}
	cr_assert(whole(path, &v) && v >= 1, "the last version is not whole");
	cr_log_info("%d reads, all whole", reads);
	expect_names(dir, "shared");
	dg_test_rmtree(dir);
}

typedef struct writer {
	const char *path;
	unsigned first;
	atomic_int *finished; /* writers done */
	dg_status st;
	char msg[2048];
} writer;

static void *write_versions(void *arg)
{
	writer *w = arg;
	for (unsigned i = 0; i < VERSIONS && !w->st; i++)
		w->st = put_version(w->path, w->first + i, w->msg, sizeof(w->msg));
	atomic_fetch_add(w->finished, 1);
	return NULL;
}

Test(publish, threads_publishing_one_path_leave_one_whole_version, .timeout = 120)
{
	char *dir = dg_test_tmpdir(), path[1024];
	snprintf(path, sizeof(path), "%s/shared", dir);
	pthread_t th[WRITERS];
	writer w[WRITERS];
	atomic_int finished = 0;
	for (int i = 0; i < WRITERS; i++) {
		w[i] = (writer){ .path = path, .first = 1 + (unsigned)i * VERSIONS, .finished = &finished };
		cr_assert_eq(pthread_create(&th[i], NULL, write_versions, &w[i]), 0);
	}
	unsigned v;
	int reads = 0;
	while (atomic_load(&finished) < WRITERS) {
		cr_assert(whole(path, &v), "a read saw a part of a version (first byte %u)", v);
		reads++;
	}
	cr_log_info("%d reads, all whole", reads);
	for (int i = 0; i < WRITERS; i++) {
		pthread_join(th[i], NULL);
		cr_expect_eq(w[i].st, DG_OK, "%s", w[i].msg);
	}
	cr_assert(whole(path, &v) && v >= 1);
	expect_names(dir, "shared");
	dg_test_rmtree(dir);
}

/* ---- the writers that go through it ---------------------------------------------- */

/* A resume that drops lines rewrites log.jsonl whole and syncs its folder,
 * so the repaired log survives a power loss; setting the last line's
 * validation loss likewise. */
Test(publish, a_training_log_rewritten_on_resume_is_synced_with_its_folder)
{
	char *dir = dg_test_tmpdir(), path[1024], msg[2048];
	snprintf(path, sizeof(path), "%s/log.jsonl", dir);
	dg_test_write_file(dir, "log.jsonl", "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3}\n");
	bool no_val = false;
	spy_reset();
	cr_assert_eq(dg__rundir_log_repair(path, 2, NULL, NULL, &no_val, msg, sizeof(msg)), DG_OK, "%s", msg);
	expect_text(path, "{\"step\": 1}\n{\"step\": 2}\n");
	cr_expect(no_val);
	cr_expect(was_synced(path), "the log was not fsync'd");
	cr_expect(was_synced(dir), "the log's folder was not fsync'd");
	expect_names(dir, "log.jsonl");

	spy_reset();
	cr_assert_eq(dg__rundir_log_set_val(path, 2, 1.5, msg, sizeof(msg)), DG_OK, "%s", msg);
	expect_text(path, "{\"step\": 1}\n{\"step\": 2, \"val_loss\": 1.5}\n");
	cr_expect(was_synced(path) && was_synced(dir), "the log or its folder was not fsync'd");
	expect_names(dir, "log.jsonl");
	dg_test_rmtree(dir);
}
