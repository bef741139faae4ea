/*
 * Fixture and helpers shared by the disk cache suites; see
 * tests/cache_helpers.h.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_helpers.h"
#include "helpers.h"
#include "base/sha256.h"
#include "runtime/store/cache_io.h"

char ch_root[256];

static void rm_tree(const char *path)
{
	struct stat sb;
	DIR *d;
	struct dirent *de;
	char sub[1024];

	if (lstat(path, &sb) < 0)
		return;
	if (S_ISDIR(sb.st_mode) && (d = opendir(path))) {
		while ((de = readdir(d))) {
			if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
				continue;
			snprintf(sub, sizeof(sub), "%s/%s", path, de->d_name);
			rm_tree(sub);
		}
		closedir(d);
		rmdir(path);
	} else {
		unlink(path);
	}
}

void ch_setup(void)
{
	unsetenv("DRAGON_CACHE_DIR");
	unsetenv("DRAGON_CACHE_MAX_BYTES");
	unsetenv("XDG_CACHE_HOME");
	strcpy(ch_root, "/tmp/dg_test_cache.XXXXXX");
	cr_assert_not_null(mkdtemp(ch_root));
}

void ch_teardown(void)
{
	rm_tree(ch_root);
}

void ch_key_of(int i, char key[65])
{
	char text[32];
	uint8_t d[32];

	snprintf(text, sizeof(text), "key-%d", i);
	dg__sha256_digest(text, strlen(text), d);
	dg__sha256_hex(d, key);
}

dg_cache *ch_open_at(const char *dir, uint64_t max_bytes)
{
	dg_cache_opts o = { .dir = dir, .max_bytes = max_bytes };
	dg_cache *c = NULL;
	dg_status st = dg_cache_open(&c, &o);

	cr_assert_eq(st, DG_OK, "open %s: %s", dir, dg_cache_errmsg(NULL));
	cr_assert_not_null(c);
	return c;
}

void ch_sub_path(char *out, size_t n, const char *sub, const char *name)
{
	snprintf(out, n, "%s/%s/%s", ch_root, sub, name);
}

void ch_entry_path(char *out, size_t n, const char *key)
{
	char name[80];
	snprintf(name, sizeof(name), "%s.dgk", key);
	ch_sub_path(out, n, "kernels", name);
}

bool ch_exists(const char *path)
{
	struct stat sb;
	return lstat(path, &sb) == 0;
}

bool ch_entry_exists(const char *key)
{
	char p[512];
	ch_entry_path(p, sizeof(p), key);
	return ch_exists(p);
}

int ch_count_dir(const char *sub, char *first, size_t n)
{
	char p[512];
	int count = 0;
	DIR *d;
	struct dirent *de;

	snprintf(p, sizeof(p), "%s/%s", ch_root, sub);
	d = opendir(p);
	cr_assert_not_null(d, "opendir %s", p);
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (count++ == 0 && first)
			snprintf(first, n, "%s", de->d_name);
	}
	closedir(d);
	return count;
}

uint8_t *ch_file_read(const char *path, size_t *n)
{
	return dg_test_read_bytes(path, n);
}

void ch_file_write(const char *path, const void *p, size_t n)
{
	dg_test_write_bytes(path, p, n);
}

void ch_flip_byte(const char *path, size_t off)
{
	size_t n;
	uint8_t *b = ch_file_read(path, &n);

	cr_assert_lt(off, n);
	b[off] ^= 0x5a;
	ch_file_write(path, b, n);
	free(b);
}

void ch_set_mtime(const char *path, time_t t)
{
	struct timespec ts[2] = { { .tv_sec = t }, { .tv_sec = t } };
	cr_assert_eq(utimensat(AT_FDCWD, path, ts, 0), 0, "utimensat %s", path);
}

off_t ch_file_size(const char *path)
{
	struct stat sb;
	cr_assert_eq(stat(path, &sb), 0, "stat %s", path);
	return sb.st_size;
}

uint8_t *ch_make_image(size_t n, int seed)
{
	uint8_t *p = malloc(n ? n : 1);
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 31 + (size_t)seed * 7 + 1);
	return p;
}

void ch_expect_hit(dg_cache *c, const char *key, const uint8_t *image,
		   size_t n, const char *meta)
{
	dg_cache_blob b;
	dg_status st = dg_cache_get(c, key, &b);

	cr_assert_eq(st, DG_OK, "get: %s", dg_cache_errmsg(c));
	cr_assert_eq(b.image_size, n);
	cr_assert_not_null(b.image);
	cr_assert_eq(memcmp(b.image, image, n), 0, "image bytes differ");
	cr_assert_str_eq(b.meta, meta);
	dg_cache_blob_free(&b);
}

void ch_expect_miss(dg_cache *c, const char *key)
{
	dg_cache_blob b;
	dg_status st = dg_cache_get(c, key, &b);

	cr_assert_eq(st, DG_ERR_NOT_FOUND, "get: %s (%s)", dg_status_str(st),
		     dg_cache_errmsg(c));
	cr_assert_null(b.image);
	cr_assert_null(b.meta);
	cr_assert_neq(dg_cache_errmsg(c)[0], '\0');
}

int ch_build_calls;

dg_status ch_build_counting(void *user, uint8_t **image, size_t *size,
			    char **meta)
{
	(void)user;
	ch_build_calls++;
	*image = (uint8_t *)strdup("image");
	*size = 5;
	*meta = strdup("{}");
	return DG_OK;
}

void ch_empty_dir(const char *sub)
{
	char p[512], name[300];

	while (ch_count_dir(sub, name, sizeof(name)) > 0) {
		snprintf(p, sizeof(p), "%s/%s/%.200s", ch_root, sub, name);
		cr_assert_eq(unlink(p), 0, "unlink %s", p);
	}
}
