/*
 * Tests for dg_cache_get_or_build (runtime/store/cache.c): eight processes asking
 * for one key build it once; a failing builder publishes nothing and its
 * outputs are not touched; a cache that cannot lock or store what was built
 * (a vanished folder, a full disk) still returns it and says why. Fixture
 * and helpers: tests/cache_helpers.h.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache_helpers.h"
#include "dragon/cache.h"
#include "base/sha256.h"
#include "runtime/store/cache_io.h"

TestSuite(cache, .init = ch_setup, .fini = ch_teardown);

/* ---- eight processes, one key -------------------------------------------- */

/* Sleeps 50 ms, appends its pid to the counter file, returns bytes that
 * name its pid. */
static dg_status build_slow(void *user, uint8_t **image, size_t *size,
			    char **meta)
{
	const char *counter = user;
	struct timespec ts = { .tv_nsec = 50 * 1000 * 1000 };
	char line[32], m[128];
	size_t n = 2048;
	int fd;

	nanosleep(&ts, NULL);
	fd = open(counter, O_WRONLY | O_APPEND | O_CREAT, 0644);
	if (fd < 0)
		return DG_ERR_IO;
	int len = snprintf(line, sizeof(line), "%ld\n", (long)getpid());
	if (write(fd, line, (size_t)len) != len) {
		close(fd);
		return DG_ERR_IO;
	}
	close(fd);
	*image = malloc(n);
	memset(*image, 0xab, n);
	snprintf((char *)*image, n, "image built by pid %ld", (long)getpid());
	*size = n;
	snprintf(m, sizeof(m), "{\"builder_pid\":%ld}", (long)getpid());
	*meta = strdup(m);
	return DG_OK;
}

static int child_build(int go_fd, int res_fd, const char *counter)
{
	char c1, line[80];
	uint8_t d[32];
	char hex[65];
	dg_cache_blob b;
	bool hit = false;
	dg_cache *c = NULL;
	dg_cache_opts o = { .dir = ch_root };
	char key[65];
	dg__sha256 s;

	ch_key_of(42, key);
	if (dg_cache_open(&c, &o))
		return 2;
	if (read(go_fd, &c1, 1) != 0) /* blocks until the parent says go */
		return 3;
	if (dg_cache_get_or_build(c, key, build_slow, (void *)counter, &b, &hit))
		return 4;
	dg__sha256_init(&s);
	dg__sha256_update(&s, b.image, b.image_size);
	dg__sha256_update(&s, b.meta, strlen(b.meta));
	dg__sha256_final(&s, d);
	dg__sha256_hex(d, hex);
	int len = snprintf(line, sizeof(line), "%s %d\n", hex, hit ? 1 : 0);
	/* one write < PIPE_BUF: atomic */
	if (write(res_fd, line, (size_t)len) != len)
		return 5;
	dg_cache_blob_free(&b);
	dg_cache_close(c);
	return 0;
}

Test(cache, eight_processes_build_once)
{
	enum { N = 8 };
	int go[2], res[2], status, hits = 0, lines = 0;
	pid_t pids[N];
	char counter[512], key[65], buf[4096], first_hex[65] = "";
	size_t got = 0;
	ssize_t r;

	snprintf(counter, sizeof(counter), "%s/builds.txt", ch_root);
	ch_key_of(42, key);
	cr_assert_eq(pipe(go), 0);
	cr_assert_eq(pipe(res), 0);
	for (int i = 0; i < N; i++) {
		pids[i] = fork();
		cr_assert_neq(pids[i], -1);
		if (pids[i] == 0) {
			close(go[1]);
			close(res[0]);
			_exit(child_build(go[0], res[1], counter));
		}
	}
	close(go[0]);
	close(res[1]);
	close(go[1]); /* all children start at once */
	while ((r = read(res[0], buf + got, sizeof(buf) - 1 - got)) > 0)
		got += (size_t)r;
	buf[got] = '\0';
	close(res[0]);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(waitpid(pids[i], &status, 0), pids[i]);
		cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
			  "child %d failed (status %d)", i, status);
	}

	for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
		char hex[65];
		int hit;
		cr_assert_eq(sscanf(line, "%64s %d", hex, &hit), 2, "%s", line);
		if (!first_hex[0])
			strcpy(first_hex, hex);
		cr_assert_str_eq(hex, first_hex, "children got different bytes");
		hits += hit;
		lines++;
	}
	cr_assert_eq(lines, N);
	cr_assert_eq(hits, N - 1, "%d of %d were hits", hits, N);

	/* Exactly one build, one entry, holding that builder's pid. */
	size_t n;
	char *builds = (char *)ch_file_read(counter, &n);
	builds[n] = '\0';
	int nl = 0;
	for (size_t i = 0; i < n; i++)
		nl += builds[i] == '\n';
	cr_assert_eq(nl, 1, "builds: %s", builds);
	cr_assert_eq(ch_count_dir("kernels", NULL, 0), 1);
	cr_assert_eq(ch_count_dir("tmp", NULL, 0), 0);

	dg_cache *c = ch_open_at(ch_root, 0);
	dg_cache_blob b;
	char want[64];
	cr_assert_eq(dg_cache_get(c, key, &b), DG_OK);
	snprintf(want, sizeof(want), "image built by pid %ld", strtol(builds, NULL, 10));
	cr_assert_str_eq((char *)b.image, want);
	dg_cache_blob_free(&b);
	dg_cache_close(c);
	free(builds);
}

/* ---- builders ------------------------------------------------------------- */

static dg_status build_fail(void *user, uint8_t **image, size_t *size,
			    char **meta)
{
	(void)image;
	(void)size;
	(void)meta;
	(*(int *)user)++;
	return DG_ERR_COMPILE;
}

static dg_status build_null_image(void *user, uint8_t **image, size_t *size,
				  char **meta)
{
	(void)user;
	*image = NULL;
	*size = 5;
	*meta = strdup("{}");
	return DG_OK;
}

/* get_or_build with a builder that fails (or returns nonsense) gives want,
 * no hit and no bytes, and leaves nothing in kernels/ or tmp/. */
static void expect_build_fails(dg_cache *c, const char *key,
			       dg_cache_build_fn build, void *user,
			       dg_status want)
{
	dg_cache_blob b;
	bool hit = true;

	cr_assert_eq(dg_cache_get_or_build(c, key, build, user, &b, &hit), want,
		     "%s", dg_cache_errmsg(c));
	cr_assert(!hit);
	cr_assert_null(b.image);
	cr_assert_null(b.meta);
	cr_assert_eq(ch_count_dir("kernels", NULL, 0), 0);
	cr_assert_eq(ch_count_dir("tmp", NULL, 0), 0);
}

Test(cache, builder_failure_publishes_nothing)
{
	char key[65];
	dg_cache_blob b;
	bool hit = true;
	int calls = 0;
	dg_cache *c = ch_open_at(ch_root, 0);

	ch_key_of(1, key);
	expect_build_fails(c, key, build_fail, &calls, DG_ERR_COMPILE);
	cr_assert_eq(calls, 1);
	cr_assert(strstr(dg_cache_errmsg(c), "nothing was published"), "%s",
		  dg_cache_errmsg(c));
	ch_expect_miss(c, key);
	expect_build_fails(c, key, build_null_image, NULL, DG_ERR_INTERNAL);

	/* A good builder: built once, then served from disk. */
	cr_assert_eq(dg_cache_get_or_build(c, key, ch_build_counting, NULL, &b, &hit), DG_OK);
	cr_assert(!hit);
	cr_assert_eq(ch_build_calls, 1);
	cr_assert_eq(b.image_size, 5);
	cr_assert_eq(memcmp(b.image, "image", 5), 0);
	cr_assert_str_eq(b.meta, "{}");
	dg_cache_blob_free(&b);
	cr_assert_eq(dg_cache_get_or_build(c, key, ch_build_counting, NULL, &b, &hit), DG_OK);
	cr_assert(hit);
	cr_assert_eq(ch_build_calls, 1);
	cr_assert_eq(memcmp(b.image, "image", 5), 0);
	dg_cache_blob_free(&b);
	dg_cache_close(c);
}

/* Fails after setting its outputs to memory that is not the heap's and a
 * size far beyond it: a cache that freed or read them would crash. */
static uint8_t not_heap[8];

static dg_status build_fail_dirty(void *user, uint8_t **image, size_t *size,
				  char **meta)
{
	(void)user;
	*image = not_heap;
	*size = (size_t)1 << 30;
	*meta = (char *)not_heap;
	return DG_ERR_COMPILE;
}

Test(cache, builder_failure_outputs_untouched)
{
	char key[65];
	dg_cache *c = ch_open_at(ch_root, 0);

	ch_key_of(1, key);
	expect_build_fails(c, key, build_fail_dirty, NULL, DG_ERR_COMPILE);
	dg_cache_close(c);
}

/* Empties <root>/<sub>, a folder the open handle has open, and replaces it
 * with a regular file: the handle's folder is gone, so nothing can be
 * created in it (what a read-only or vanished cache folder looks like to a
 * writer). */
static void break_subdir(const char *sub)
{
	char p[512];

	ch_empty_dir(sub);
	snprintf(p, sizeof(p), "%s/%s", ch_root, sub);
	cr_assert_eq(rmdir(p), 0, "rmdir %s: %s", p, strerror(errno));
	ch_file_write(p, "not a folder", 12);
}

static void expect_built(const dg_cache_blob *b, bool hit)
{
	cr_assert(!hit);
	cr_assert_eq(b->image_size, 5);
	cr_assert_not_null(b->image);
	cr_assert_eq(memcmp(b->image, "image", 5), 0);
	cr_assert_str_eq(b->meta, "{}");
}

Test(cache, unpublishable_build_still_returned)
{
	char key[65];
	dg_cache_blob b;
	bool hit = true;
	dg_cache *c = ch_open_at(ch_root, 0);

	ch_key_of(1, key);
	break_subdir("kernels");
	cr_assert_eq(dg_cache_get_or_build(c, key, ch_build_counting, NULL, &b, &hit),
		     DG_OK, "%s", dg_cache_errmsg(c));
	expect_built(&b, hit);
	cr_assert_eq(ch_build_calls, 1);
	dg_cache_blob_free(&b);
	cr_assert(strstr(dg_cache_errmsg(c), "could not be stored"), "%s",
		  dg_cache_errmsg(c));
	cr_assert(strstr(dg_cache_errmsg(c), key), "%s", dg_cache_errmsg(c));
	cr_assert(strstr(dg_cache_errmsg(c), "rename"), "%s", dg_cache_errmsg(c));
	cr_assert(strstr(dg_cache_errmsg(c), "nothing was published"), "%s",
		  dg_cache_errmsg(c));
	cr_assert_eq(ch_count_dir("tmp", NULL, 0), 0);
	cr_assert_eq(ch_count_dir("quarantine", NULL, 0), 0);

	/* Nothing was kept: the next call builds again. */
	cr_assert_eq(dg_cache_get_or_build(c, key, ch_build_counting, NULL, &b, &hit),
		     DG_OK);
	expect_built(&b, hit);
	cr_assert_eq(ch_build_calls, 2);
	dg_cache_blob_free(&b);
	dg_cache_close(c);

	/* A cache that works again stores it, and says nothing. */
	char p[512];
	snprintf(p, sizeof(p), "%s/kernels", ch_root);
	cr_assert_eq(unlink(p), 0);
	c = ch_open_at(ch_root, 0);
	cr_assert_eq(dg_cache_get_or_build(c, key, ch_build_counting, NULL, &b, &hit),
		     DG_OK);
	expect_built(&b, hit);
	cr_assert_str_eq(dg_cache_errmsg(c), "");
	dg_cache_blob_free(&b);
	cr_assert(ch_entry_exists(key));
	cr_assert_eq(ch_build_calls, 3);
	dg_cache_close(c);
}

static dg_status build_big(void *user, uint8_t **image, size_t *size,
			   char **meta)
{
	(void)user;
	*image = ch_make_image(8192, 4);
	*size = 8192;
	*meta = strdup("{\"big\":true}");
	return DG_OK;
}

/* A full disk, as a file size limit: the temp file's writes fail. */
Test(cache, disk_full_build_still_returned)
{
	char key[65];
	dg_cache_blob b;
	bool hit = true;
	struct rlimit old, lim;
	uint8_t *want = ch_make_image(8192, 4);
	dg_cache *c = ch_open_at(ch_root, 0);

	ch_key_of(2, key);
	cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
	lim = old;
	lim.rlim_cur = 1024;
	cr_assert_neq(signal(SIGXFSZ, SIG_IGN), SIG_ERR);
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
	dg_status st = dg_cache_get_or_build(c, key, build_big, NULL, &b, &hit);
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);

	cr_assert_eq(st, DG_OK, "%s", dg_cache_errmsg(c));
	cr_assert(!hit);
	cr_assert_eq(b.image_size, 8192);
	cr_assert_eq(memcmp(b.image, want, 8192), 0);
	cr_assert_str_eq(b.meta, "{\"big\":true}");
	dg_cache_blob_free(&b);
	cr_assert(strstr(dg_cache_errmsg(c), "write"), "%s", dg_cache_errmsg(c));
	cr_assert(strstr(dg_cache_errmsg(c), "nothing was published"), "%s",
		  dg_cache_errmsg(c));
	cr_assert_eq(ch_count_dir("kernels", NULL, 0), 0);
	cr_assert_eq(ch_count_dir("tmp", NULL, 0), 0);
	ch_expect_miss(c, key);
	free(want);
	dg_cache_close(c);
}

/* No lock can be taken: the entry is still built (and stored when it can
 * be), and the message says what happened. */
Test(cache, unlockable_cache_still_builds)
{
	char key[65];
	dg_cache_blob b;
	bool hit = true;
	dg_cache *c = ch_open_at(ch_root, 0);

	ch_key_of(1, key);
	break_subdir("locks");
	cr_assert_eq(dg_cache_get_or_build(c, key, ch_build_counting, NULL, &b, &hit),
		     DG_OK, "%s", dg_cache_errmsg(c));
	expect_built(&b, hit);
	dg_cache_blob_free(&b);
	cr_assert(strstr(dg_cache_errmsg(c), "without its build lock"), "%s",
		  dg_cache_errmsg(c));
	cr_assert(strstr(dg_cache_errmsg(c), "/locks/"), "%s", dg_cache_errmsg(c));
	cr_assert(ch_entry_exists(key));
	cr_assert_eq(dg_cache_get_or_build(c, key, ch_build_counting, NULL, &b, &hit),
		     DG_OK);
	cr_assert(hit);
	cr_assert_eq(ch_build_calls, 1);
	dg_cache_blob_free(&b);

	/* Neither lock nor publish: a read-only cache. */
	ch_key_of(2, key);
	break_subdir("kernels");
	cr_assert_eq(dg_cache_get_or_build(c, key, ch_build_counting, NULL, &b, &hit),
		     DG_OK, "%s", dg_cache_errmsg(c));
	expect_built(&b, hit);
	cr_assert_eq(ch_build_calls, 2);
	dg_cache_blob_free(&b);
	cr_assert(strstr(dg_cache_errmsg(c), "could not be stored"), "%s",
		  dg_cache_errmsg(c));
	cr_assert_eq(ch_count_dir("tmp", NULL, 0), 0);
	dg_cache_close(c);
}
