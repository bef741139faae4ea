/*
 * Tests for runtime/store/cache_admin.c and for how a cache is configured: LRU
 * eviction (the newest entry is never evicted), stat/verify/gc/clear and
 * the list of bad entries, the root and the size cap from options and the
 * environment, and the per-thread message of a failed open. Fixture and
 * helpers: tests/cache_helpers.h.
 */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache_helpers.h"
#include "dragon/cache.h"
#include "runtime/store/cache_int.h"

TestSuite(cache, .init = ch_setup, .fini = ch_teardown);

/* ---- eviction ------------------------------------------------------------- */

#define EV_IMAGE 1000
#define EV_SIZE (DG__CACHE_HEADER_SIZE + EV_IMAGE + 2) /* meta "{}" */

static void ev_put(dg_cache *c, int i)
{
	char key[65];
	uint8_t *img = ch_make_image(EV_IMAGE, i);

	ch_key_of(i, key);
	cr_assert_eq(dg_cache_put(c, key, img, EV_IMAGE, "{}"), DG_OK, "%s",
		     dg_cache_errmsg(c));
	free(img);
}

static void ev_mtime(int i, time_t t)
{
	char key[65], p[512];

	ch_key_of(i, key);
	ch_entry_path(p, sizeof(p), key);
	ch_set_mtime(p, t);
}

static bool ev_has(int i)
{
	char key[65];
	ch_key_of(i, key);
	return ch_entry_exists(key);
}

Test(cache, eviction_lru)
{
	time_t now = time(NULL);
	dg_cache *big = ch_open_at(ch_root, 0);
	dg_cache *small = ch_open_at(ch_root, 3 * EV_SIZE);

	for (int i = 0; i < 4; i++)
		ev_put(big, i);
	/* Recency deliberately not in key or insertion order. */
	ev_mtime(0, now - 100);
	ev_mtime(1, now - 400);
	ev_mtime(2, now - 300);
	ev_mtime(3, now - 200);

	ev_put(small, 4); /* 5 entries, room for 3: the two oldest go */
	cr_assert(!ev_has(1) && !ev_has(2), "oldest not evicted");
	cr_assert(ev_has(0) && ev_has(3) && ev_has(4));

	/* A hit refreshes 3: now 0 is the oldest and goes instead. */
	char key[65];
	dg_cache_blob b;
	ch_key_of(3, key);
	cr_assert_eq(dg_cache_get(small, key, &b), DG_OK);
	dg_cache_blob_free(&b);
	ev_put(small, 5);
	cr_assert(!ev_has(0), "LRU entry 0 survived");
	cr_assert(ev_has(3), "the entry just hit was evicted");
	cr_assert(ev_has(4) && ev_has(5));

	/* Equal mtimes: the smaller name goes first. */
	int idx[3] = { 3, 4, 5 }, smallest = 3;
	char ks[3][65];
	for (int i = 0; i < 3; i++) {
		ch_key_of(idx[i], ks[i]);
		ev_mtime(idx[i], now - 50);
	}
	for (int i = 0; i < 3; i++)
		if (strcmp(ks[i], ks[smallest - 3]) < 0)
			smallest = idx[i];
	ev_put(small, 6);
	cr_assert(!ev_has(smallest), "tie not broken by name");
	for (int i = 3; i <= 6; i++)
		if (i != smallest)
			cr_assert(ev_has(i), "entry %d evicted", i);

	dg_cache_stats s;
	cr_assert_eq(dg_cache_stat(small, &s), DG_OK);
	cr_assert_eq(s.entries, 3);
	cr_assert_eq(s.bytes, 3 * EV_SIZE);
	dg_cache_close(small);
	dg_cache_close(big);
}

Test(cache, newest_never_evicted)
{
	dg_cache *big = ch_open_at(ch_root, 0);
	dg_cache *tiny = ch_open_at(ch_root, 1);

	for (int i = 0; i < 3; i++)
		ev_put(big, i);
	ev_put(tiny, 9); /* larger than the cap by itself */
	cr_assert(ev_has(9));
	cr_assert(!ev_has(0) && !ev_has(1) && !ev_has(2));
	char key[65];
	uint8_t *img = ch_make_image(EV_IMAGE, 9);
	ch_key_of(9, key);
	ch_expect_hit(tiny, key, img, EV_IMAGE, "{}");
	free(img);
	dg_cache_close(tiny);
	dg_cache_close(big);
}

/* ---- stat / verify / gc / clear ------------------------------------------- */

Test(cache, stat_verify_gc_clear)
{
	char key[65], p[512], lockp[512];
	dg_cache_stats s;
	dg_cache_verify_report v;
	dg_cache_blob b;
	uint64_t removed = 99;
	bool hit;
	time_t now = time(NULL);
	dg_cache *c = ch_open_at(ch_root, 0);

	for (int i = 0; i < 3; i++)
		ev_put(c, i);
	ch_key_of(3, key);
	cr_assert_eq(dg_cache_get_or_build(c, key, ch_build_counting, NULL, &b, &hit),
		     DG_OK);
	dg_cache_blob_free(&b);
	uint64_t k3size = DG__CACHE_HEADER_SIZE + 5 + 2;
	ch_key_of(1, key);
	ch_entry_path(p, sizeof(p), key);
	ch_flip_byte(p, DG__CACHE_HEADER_SIZE + 500);
	ch_sub_path(p, sizeof(p), "tmp", "old.tmp");
	ch_file_write(p, "x", 1);
	ch_set_mtime(p, now - 120);
	ch_sub_path(p, sizeof(p), "tmp", "fresh.tmp");
	ch_file_write(p, "y", 1);
	ch_sub_path(p, sizeof(p), "quarantine", "q.dgk");
	ch_file_write(p, "z", 1);

	cr_assert_eq(dg_cache_stat(c, &s), DG_OK);
	cr_assert_eq(s.entries, 4);
	cr_assert_eq(s.bytes, 3 * EV_SIZE + k3size);
	cr_assert_eq(s.max_bytes, (uint64_t)1 << 30);
	cr_assert_eq(s.temp_files, 2);
	cr_assert_eq(s.quarantined, 1);

	cr_assert_eq(dg_cache_verify(c, &v), DG_OK);
	cr_assert_eq(v.checked, 4);
	cr_assert_eq(v.ok, 3);
	cr_assert_eq(v.bad, 1);
	cr_assert(!ch_entry_exists(key));
	cr_assert_eq(dg_cache_stat(c, &s), DG_OK);
	cr_assert_eq(s.entries, 3);
	cr_assert_eq(s.quarantined, 2);
	cr_assert_eq(dg_cache_verify(c, &v), DG_OK);
	cr_assert_eq(v.checked, 3);
	cr_assert_eq(v.bad, 0);

	/* gc: the old temp and the 2 quarantined files; the fresh temp stays;
	 * an idle lock file goes, a held one stays. */
	ch_key_of(0, key);
	snprintf(lockp, sizeof(lockp), "%s/locks/%s.lock", ch_root, key);
	int lfd = open(lockp, O_RDONLY | O_CREAT, 0644);
	cr_assert_geq(lfd, 0);
	cr_assert_eq(flock(lfd, LOCK_EX), 0);
	cr_assert_eq(ch_count_dir("locks", NULL, 0), 2);
	cr_assert_eq(dg_cache_gc(c, 0, &removed), DG_OK, "%s", dg_cache_errmsg(c));
	cr_assert_eq(removed, 3);
	cr_assert_eq(ch_count_dir("locks", NULL, 0), 1);
	cr_assert(ch_exists(lockp), "a held lock file was removed");
	close(lfd);
	cr_assert_eq(dg_cache_stat(c, &s), DG_OK);
	cr_assert_eq(s.entries, 3);
	cr_assert_eq(s.temp_files, 1);
	cr_assert_eq(s.quarantined, 0);

	/* gc to a smaller cap evicts the least recently used. */
	ev_mtime(0, now - 30);
	ev_mtime(2, now - 20);
	cr_assert_eq(dg_cache_gc(c, EV_SIZE + k3size, &removed), DG_OK);
	cr_assert_eq(removed, 1);
	cr_assert(!ev_has(0) && ev_has(2) && ev_has(3));

	cr_assert_eq(dg_cache_clear(c, &removed), DG_OK);
	cr_assert_eq(removed, 3); /* 2 entries + the fresh temp */
	cr_assert_eq(dg_cache_stat(c, &s), DG_OK);
	cr_assert_eq(s.entries, 0);
	cr_assert_eq(s.bytes, 0);
	cr_assert_eq(s.temp_files, 0);
	cr_assert_eq(s.quarantined, 0);
	cr_assert_eq(ch_count_dir("locks", NULL, 0), 0);
	ch_expect_miss(c, key);
	dg_cache_close(c);
}

/* What dg_cache_verify_each reports, one "key|reason" line per bad file. */
typedef struct bad_list {
	int n;
	char text[4096];
} bad_list;

static void collect_bad(void *user, const char *key, const char *reason)
{
	bad_list *b = user;
	size_t len = strlen(b->text);

	b->n++;
	snprintf(b->text + len, sizeof(b->text) - len, "%s|%s\n", key, reason);
}

/* The line of bad_list b for key (which must be there), or fails. */
static const char *bad_line(const bad_list *b, const char *key)
{
	char want[80];
	const char *line;

	snprintf(want, sizeof(want), "%s|", key);
	line = strstr(b->text, want);
	cr_assert_not_null(line, "%s not reported in:\n%s", key, b->text);
	cr_assert(line == b->text || line[-1] == '\n', "%s", b->text);
	return line;
}

static void expect_reason(const bad_list *b, const char *key, const char *why)
{
	const char *line = bad_line(b, key), *end = strchr(line, '\n');
	const char *hit = strstr(line, why), *moved = strstr(line, "moved to quarantine/");

	cr_assert(hit && hit < end, "want \"%s\" for %s in:\n%s", why, key, b->text);
	cr_assert(moved && moved < end, "no quarantine for %s in:\n%s", key, b->text);
}

Test(cache, verify_each_names_bad_entries)
{
	char key[65], p[512];
	dg_cache_verify_report v;
	bad_list bad = { 0 };
	dg_cache *c = ch_open_at(ch_root, 0);

	for (int i = 0; i < 4; i++)
		ev_put(c, i);
	ch_key_of(1, key);
	ch_entry_path(p, sizeof(p), key);
	ch_flip_byte(p, DG__CACHE_HEADER_SIZE + 500);
	ch_key_of(2, key);
	ch_entry_path(p, sizeof(p), key);
	cr_assert_eq(truncate(p, 60), 0);
	ch_sub_path(p, sizeof(p), "kernels", "junk.dgk");
	ch_file_write(p, "x", 1);

	cr_assert_eq(dg_cache_verify_each(c, collect_bad, &bad, &v), DG_OK, "%s",
		     dg_cache_errmsg(c));
	cr_assert_eq(v.checked, 5);
	cr_assert_eq(v.ok, 2);
	cr_assert_eq(v.bad, 3);
	cr_assert_eq(bad.n, 3, "%s", bad.text);
	ch_key_of(1, key);
	expect_reason(&bad, key, "checksum mismatch");
	ch_key_of(2, key);
	expect_reason(&bad, key, "shorter than the 128-byte header");
	expect_reason(&bad, "junk.dgk", "file name is not");
	for (int i = 0; i < 4; i += 3) {
		ch_key_of(i, key);
		cr_assert_null(strstr(bad.text, key), "good entry %d reported:\n%s", i,
			       bad.text);
	}
	cr_assert_eq(ch_count_dir("quarantine", NULL, 0), 3);
	cr_assert_eq(ch_count_dir("kernels", NULL, 0), 2);

	/* Nothing left to report; a NULL callback is allowed. */
	memset(&bad, 0, sizeof(bad));
	cr_assert_eq(dg_cache_verify_each(c, collect_bad, &bad, &v), DG_OK);
	cr_assert_eq(v.checked, 2);
	cr_assert_eq(v.bad, 0);
	cr_assert_eq(bad.n, 0);
	ch_key_of(3, key);
	ch_entry_path(p, sizeof(p), key);
	ch_flip_byte(p, DG__CACHE_HEADER_SIZE);
	cr_assert_eq(dg_cache_verify_each(c, NULL, NULL, &v), DG_OK);
	cr_assert_eq(v.bad, 1);
	cr_assert_eq(ch_count_dir("quarantine", NULL, 0), 4);
	dg_cache_close(c);
}

/* ---- root and cap selection ---------------------------------------------- */

static void expect_root(const char *want)
{
	char p[512];
	struct stat sb;
	dg_cache *c = NULL;

	cr_assert_eq(dg_cache_open(&c, NULL), DG_OK, "%s", dg_cache_errmsg(NULL));
	cr_assert_str_eq(dg_cache_root(c), want);
	snprintf(p, sizeof(p), "%s/kernels", want);
	cr_assert_eq(stat(p, &sb), 0);
	dg_cache_close(c);
}

Test(cache, root_selection)
{
	char a[300], o[300], x[300], h[300];
	dg_cache_opts opts = { .dir = o };
	dg_cache *c = NULL;

	snprintf(a, sizeof(a), "%s/env/dir", ch_root);
	snprintf(o, sizeof(o), "%s/opts", ch_root);
	snprintf(x, sizeof(x), "%s/xdg", ch_root);
	snprintf(h, sizeof(h), "%s/home", ch_root);
	setenv("HOME", h, 1);
	setenv("XDG_CACHE_HOME", x, 1);
	setenv("DRAGON_CACHE_DIR", a, 1);
	expect_root(a);

	cr_assert_eq(dg_cache_open(&c, &opts), DG_OK);
	cr_assert_str_eq(dg_cache_root(c), o);
	dg_cache_close(c);

	char want[400];
	unsetenv("DRAGON_CACHE_DIR");
	snprintf(want, sizeof(want), "%s/dragon", x);
	expect_root(want);

	setenv("DRAGON_CACHE_DIR", "", 1); /* empty counts as unset */
	expect_root(want);

	setenv("XDG_CACHE_HOME", "relative/path", 1); /* ignored (XDG spec) */
	snprintf(want, sizeof(want), "%s/.cache/dragon", h);
	expect_root(want);
	unsetenv("XDG_CACHE_HOME");
	expect_root(want);

	char slash[400]; /* trailing slashes are dropped */
	snprintf(slash, sizeof(slash), "%s/trail//", ch_root);
	setenv("DRAGON_CACHE_DIR", slash, 1);
	snprintf(want, sizeof(want), "%s/trail", ch_root);
	expect_root(want);
}

Test(cache, root_not_a_folder)
{
	char f[300];
	dg_cache_opts opts = { .dir = f };
	dg_cache *c = (dg_cache *)&opts;

	snprintf(f, sizeof(f), "%s/afile", ch_root);
	ch_file_write(f, "x", 1);
	cr_assert_eq(dg_cache_open(&c, &opts), DG_ERR_IO);
	cr_assert_null(c);
	cr_assert(strstr(dg_cache_errmsg(NULL), f), "%s", dg_cache_errmsg(NULL));
	cr_assert(strstr(dg_cache_errmsg(NULL), "DRAGON_CACHE_DIR"));
}

static void *errmsg_on_new_thread(void *arg)
{
	snprintf(arg, 1024, "%s", dg_cache_errmsg(NULL));
	return NULL;
}

/* dg_cache_errmsg(NULL) is this thread's last open failure: another thread
 * does not see it, and a successful open clears it. */
Test(cache, open_errmsg_is_per_thread)
{
	char f[300], other[1024] = "unset";
	dg_cache_opts opts = { .dir = f };
	dg_cache *c = NULL;
	pthread_t th;

	snprintf(f, sizeof(f), "%s/afile", ch_root);
	ch_file_write(f, "x", 1);
	cr_assert_eq(dg_cache_open(&c, &opts), DG_ERR_IO);
	cr_assert(strstr(dg_cache_errmsg(NULL), f), "%s", dg_cache_errmsg(NULL));
	cr_assert_eq(pthread_create(&th, NULL, errmsg_on_new_thread, other), 0);
	cr_assert_eq(pthread_join(th, NULL), 0);
	cr_assert_str_eq(other, "");
	cr_assert(strstr(dg_cache_errmsg(NULL), f), "the failure was lost");

	c = ch_open_at(ch_root, 0);
	cr_assert_str_eq(dg_cache_errmsg(NULL), "");
	cr_assert_str_eq(dg_cache_errmsg(c), "");
	dg_cache_close(c);
}

Test(cache, max_bytes_selection)
{
	static const char *bad[] = {
		"abc", "12x", " 12", "12 ", "-5", "+5", "0", "1e9", "0x100",
		"18446744073709551616",
	};
	dg_cache_opts opts = { .dir = ch_root };
	dg_cache_stats s;
	dg_cache *c = NULL;

	cr_assert_eq(dg_cache_open(&c, &opts), DG_OK);
	cr_assert_eq(dg_cache_stat(c, &s), DG_OK);
	cr_assert_eq(s.max_bytes, (uint64_t)1 << 30);
	dg_cache_close(c);

	setenv("DRAGON_CACHE_MAX_BYTES", "4096", 1);
	cr_assert_eq(dg_cache_open(&c, &opts), DG_OK);
	cr_assert_eq(dg_cache_stat(c, &s), DG_OK);
	cr_assert_eq(s.max_bytes, 4096);
	dg_cache_close(c);

	setenv("DRAGON_CACHE_MAX_BYTES", "18446744073709551615", 1);
	cr_assert_eq(dg_cache_open(&c, &opts), DG_OK);
	cr_assert_eq(dg_cache_stat(c, &s), DG_OK);
	cr_assert_eq(s.max_bytes, UINT64_MAX);
	dg_cache_close(c);

	opts.max_bytes = 777; /* opts win, even over bad text */
	setenv("DRAGON_CACHE_MAX_BYTES", "junk", 1);
	cr_assert_eq(dg_cache_open(&c, &opts), DG_OK);
	cr_assert_eq(dg_cache_stat(c, &s), DG_OK);
	cr_assert_eq(s.max_bytes, 777);
	dg_cache_close(c);
	opts.max_bytes = 0;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("DRAGON_CACHE_MAX_BYTES", bad[i], 1);
		c = (dg_cache *)&opts;
		cr_assert_eq(dg_cache_open(&c, &opts), DG_ERR_INVALID_ARG, "\"%s\"", bad[i]);
		cr_assert_null(c);
		cr_assert(strstr(dg_cache_errmsg(NULL), "DRAGON_CACHE_MAX_BYTES"), "%s",
			  dg_cache_errmsg(NULL));
	}
}
