/*
 * Tests for runtime/sha256.c, runtime/cache.c and runtime/cache_admin.c:
 * SHA-256 vectors, the entry format, hits and misses, corruption (each a
 * quarantined miss; repeated quarantines keep every copy), a writer killed
 * mid-write, eight processes building one key, LRU eviction,
 * stat/verify/gc/clear and the list of bad entries, root and cap selection,
 * the open-failure message, builder failure, and a cache that cannot store
 * what was built (still returned).
 *
 * Every test gets a fresh root from mkdtemp under /tmp (removed by the
 * fixture) and a clean environment for the cache variables.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dragon/cache.h"
#include "runtime/cache_int.h"
#include "runtime/sha256.h"

static char root[256]; /* this test's temp folder */

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

static void setup(void)
{
	unsetenv("DRAGON_CACHE_DIR");
	unsetenv("DRAGON_CACHE_MAX_BYTES");
	unsetenv("XDG_CACHE_HOME");
	strcpy(root, "/tmp/dg_test_cache.XXXXXX");
	cr_assert_not_null(mkdtemp(root));
}

static void teardown(void)
{
	rm_tree(root);
}

TestSuite(cache, .init = setup, .fini = teardown, .timeout = 120);

/* ---- helpers ----------------------------------------------------------- */

/* Key number i: the hex SHA-256 of "key-<i>". */
static void key_of(int i, char key[65])
{
	char text[32];
	uint8_t d[32];

	snprintf(text, sizeof(text), "key-%d", i);
	dg__sha256_digest(text, strlen(text), d);
	dg__sha256_hex(d, key);
}

static dg_cache *open_at(const char *dir, uint64_t max_bytes)
{
	dg_cache_opts o = { .dir = dir, .max_bytes = max_bytes };
	dg_cache *c = NULL;
	dg_status st = dg_cache_open(&c, &o);

	cr_assert_eq(st, DG_OK, "open %s: %s", dir, dg_cache_errmsg(NULL));
	cr_assert_not_null(c);
	return c;
}

static void sub_path(char *out, size_t n, const char *sub, const char *name)
{
	snprintf(out, n, "%s/%s/%s", root, sub, name);
}

static void entry_path(char *out, size_t n, const char *key)
{
	char name[80];
	snprintf(name, sizeof(name), "%s.dgk", key);
	sub_path(out, n, "kernels", name);
}

static bool exists(const char *path)
{
	struct stat sb;
	return lstat(path, &sb) == 0;
}

static bool entry_exists(const char *key)
{
	char p[512];
	entry_path(p, sizeof(p), key);
	return exists(p);
}

/* Names in <root>/<sub> (not . and ..); the first into first (may be NULL). */
static int count_dir(const char *sub, char *first, size_t n)
{
	char p[512];
	int count = 0;
	DIR *d;
	struct dirent *de;

	snprintf(p, sizeof(p), "%s/%s", root, sub);
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

static uint8_t *file_read(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long len;

	cr_assert_not_null(f, "fopen %s", path);
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)len + 1);
	cr_assert_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
	fclose(f);
	*n = (size_t)len;
	return buf;
}

static void file_write(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "fopen %s", path);
	cr_assert_eq(fwrite(p, 1, n, f), n);
	cr_assert_eq(fclose(f), 0);
}

static void flip_byte(const char *path, size_t off)
{
	size_t n;
	uint8_t *b = file_read(path, &n);

	cr_assert_lt(off, n);
	b[off] ^= 0x5a;
	file_write(path, b, n);
	free(b);
}

static void set_mtime(const char *path, time_t t)
{
	struct timespec ts[2] = { { .tv_sec = t }, { .tv_sec = t } };
	cr_assert_eq(utimensat(AT_FDCWD, path, ts, 0), 0, "utimensat %s", path);
}

static off_t file_size(const char *path)
{
	struct stat sb;
	cr_assert_eq(stat(path, &sb), 0, "stat %s", path);
	return sb.st_size;
}

/* A deterministic test image of n bytes holding every byte value. */
static uint8_t *make_image(size_t n, int seed)
{
	uint8_t *p = malloc(n ? n : 1);
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 31 + (size_t)seed * 7 + 1);
	return p;
}

static void expect_hit(dg_cache *c, const char *key, const uint8_t *image,
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

static void expect_miss(dg_cache *c, const char *key)
{
	dg_cache_blob b;
	dg_status st = dg_cache_get(c, key, &b);

	cr_assert_eq(st, DG_ERR_NOT_FOUND, "get: %s (%s)", dg_status_str(st),
		     dg_cache_errmsg(c));
	cr_assert_null(b.image);
	cr_assert_null(b.meta);
	cr_assert_neq(dg_cache_errmsg(c)[0], '\0');
}

/* ---- SHA-256 ----------------------------------------------------------- */

static void expect_hex(const void *data, size_t n, const char *want)
{
	uint8_t d[32];
	char hex[65];

	dg__sha256_digest(data, n, d);
	dg__sha256_hex(d, hex);
	cr_assert_str_eq(hex, want, "sha256 of %zu bytes", n);
}

Test(sha256, nist_vectors)
{
	expect_hex("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	expect_hex("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
	expect_hex(m448, strlen(m448), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
	const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
	expect_hex(m896, strlen(m896), "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

Test(sha256, million_a)
{
	const char *want = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
	char *a = malloc(1000000);
	uint8_t d[32];
	char hex[65];
	dg__sha256 s;

	memset(a, 'a', 1000000);
	expect_hex(a, 1000000, want);
	dg__sha256_init(&s); /* and in odd-sized pieces */
	for (size_t off = 0; off < 1000000; off += 997)
		dg__sha256_update(&s, a + off, off + 997 > 1000000 ? 1000000 - off : 997);
	dg__sha256_final(&s, d);
	dg__sha256_hex(d, hex);
	cr_assert_str_eq(hex, want);
	free(a);
}

Test(sha256, padding_boundaries)
{
	/* Lengths around the 55/56/64-byte padding edges (from Python's
	 * hashlib). */
	static const struct { size_t n; const char *hex; } v[] = {
		{ 55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318" },
		{ 56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a" },
		{ 63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34" },
		{ 64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb" },
		{ 65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0" },
		{ 119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb" },
		{ 120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c" },
	};
	char a[128];

	memset(a, 'a', sizeof(a));
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		expect_hex(a, v[i].n, v[i].hex);
}

Test(sha256, incremental_every_split)
{
	/* bytes (i*31+7) mod 256, i < 200; digest from Python's hashlib */
	const char *want = "44cae5223d431caed4a9e32271d6abf17c3f2f4abac45fcdb48a99fcc6072a09";
	uint8_t m[200], d[32];
	char hex[65];
	dg__sha256 s;

	for (int i = 0; i < 200; i++)
		m[i] = (uint8_t)(i * 31 + 7);
	expect_hex(m, 200, want);
	for (size_t i = 0; i <= 200; i++) {
		for (size_t j = i; j <= 200; j++) {
			dg__sha256_init(&s);
			dg__sha256_update(&s, m, i);
			dg__sha256_update(&s, m + i, j - i);
			dg__sha256_update(&s, m + j, 200 - j);
			dg__sha256_final(&s, d);
			dg__sha256_hex(d, hex);
			cr_assert_str_eq(hex, want, "split at %zu, %zu", i, j);
		}
	}
	dg__sha256_init(&s);
	for (int i = 0; i < 200; i++)
		dg__sha256_update(&s, m + i, 1);
	dg__sha256_update(&s, NULL, 0);
	dg__sha256_final(&s, d);
	dg__sha256_hex(d, hex);
	cr_assert_str_eq(hex, want, "byte at a time");
}

/* ---- basic use --------------------------------------------------------- */

Test(cache, miss_put_hit_and_format)
{
	const char *meta = "{\"arch\":\"sm_90\",\"op\":\"lowrank\"}";
	size_t n = 1000, fsz, msz = strlen(meta);
	uint8_t *img = make_image(n, 1), *f, sum[32];
	char key[65], p[512];
	dg__sha256 s;
	dg_cache *c = open_at(root, 0);

	key_of(1, key);
	cr_assert_str_eq(dg_cache_root(c), root);
	expect_miss(c, key);
	cr_assert_eq(dg_cache_put(c, key, img, n, meta), DG_OK, "%s",
		     dg_cache_errmsg(c));
	expect_hit(c, key, img, n, meta);

	/* The bytes on disk are the documented layout. */
	entry_path(p, sizeof(p), key);
	f = file_read(p, &fsz);
	cr_assert_eq(fsz, DG__CACHE_HEADER_SIZE + n + msz);
	cr_assert_eq(memcmp(f, "DGKCACHE", 8), 0);
	cr_assert_eq(memcmp(f + 8, "\x01\x00\x00\x00", 4), 0);
	cr_assert_eq(memcmp(f + 12, "\x80\x00\x00\x00", 4), 0);
	cr_assert_eq(memcmp(f + 16, key, 64), 0);
	cr_assert_eq(memcmp(f + 80, "\xe8\x03\x00\x00\x00\x00\x00\x00", 8), 0);
	cr_assert_eq(f[88], msz);
	cr_assert_eq(memcmp(f + 89, "\0\0\0\0\0\0\0", 7), 0);
	dg__sha256_init(&s);
	dg__sha256_update(&s, img, n);
	dg__sha256_update(&s, meta, msz);
	dg__sha256_final(&s, sum);
	cr_assert_eq(memcmp(f + 96, sum, 32), 0);
	cr_assert_eq(memcmp(f + 128, img, n), 0);
	cr_assert_eq(memcmp(f + 128 + n, meta, msz), 0);
	free(f);

	/* Another handle on the same root sees it; no temp files remain. */
	dg_cache *c2 = open_at(root, 0);
	expect_hit(c2, key, img, n, meta);
	cr_assert_eq(count_dir("tmp", NULL, 0), 0);
	cr_assert_eq(count_dir("kernels", NULL, 0), 1);

	/* An empty image and NULL meta round-trip as 0 bytes and "". */
	key_of(2, key);
	cr_assert_eq(dg_cache_put(c, key, NULL, 0, NULL), DG_OK);
	expect_hit(c, key, (const uint8_t *)"", 0, "");
	dg_cache_close(c2);
	dg_cache_close(c);
	free(img);
}

Test(cache, folders_created)
{
	char p[512];
	struct stat sb;
	static const char *sub[] = { "kernels", "quarantine", "locks", "tmp" };

	snprintf(p, sizeof(p), "%s/deep/er/cache", root);
	dg_cache *c = open_at(p, 0);
	for (int i = 0; i < 4; i++) {
		snprintf(p, sizeof(p), "%s/deep/er/cache/%s", root, sub[i]);
		cr_assert_eq(stat(p, &sb), 0, "%s missing", p);
		cr_assert(S_ISDIR(sb.st_mode));
	}
	dg_cache_close(c);
}

static int build_calls;

static dg_status build_counting(void *user, uint8_t **image, size_t *size,
				char **meta)
{
	(void)user;
	build_calls++;
	*image = (uint8_t *)strdup("image");
	*size = 5;
	*meta = strdup("{}");
	return DG_OK;
}

Test(cache, invalid_keys)
{
	char k63[64], k65[66], upper[65], nonhex[65], slash[65], nl[66];
	const char *bad[] = { "", k63, k65, upper, nonhex, slash, nl };
	dg_cache_blob b;
	bool hit;
	dg_cache *c = open_at(root, 0);

	memset(k63, 'a', 63); k63[63] = 0;
	memset(k65, 'a', 65); k65[65] = 0;
	key_of(1, upper); upper[10] = 'A';
	key_of(1, nonhex); nonhex[63] = 'g';
	key_of(1, slash); slash[0] = '.'; slash[1] = '.'; slash[2] = '/';
	key_of(1, nl); nl[64] = '\n'; nl[65] = 0;

	cr_assert_eq(dg_cache_get(c, NULL, &b), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_cache_errmsg(c), "key"));
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cr_assert_eq(dg_cache_get(c, bad[i], &b), DG_ERR_INVALID_ARG, "get \"%s\"", bad[i]);
		cr_assert(strstr(dg_cache_errmsg(c), "64 lowercase hex"), "%s", dg_cache_errmsg(c));
		cr_assert_eq(dg_cache_put(c, bad[i], (const uint8_t *)"x", 1, "{}"),
			     DG_ERR_INVALID_ARG, "put \"%s\"", bad[i]);
		cr_assert(strstr(dg_cache_errmsg(c), "key"));
		cr_assert_eq(dg_cache_get_or_build(c, bad[i], build_counting, NULL, &b, &hit),
			     DG_ERR_INVALID_ARG);
	}
	cr_assert_eq(build_calls, 0);
	cr_assert_eq(count_dir("kernels", NULL, 0), 0);
	cr_assert_eq(count_dir("tmp", NULL, 0), 0);
	cr_assert_eq(count_dir("locks", NULL, 0), 0);
	dg_cache_close(c);
}

Test(cache, overwrite)
{
	char key[65];
	uint8_t *a = make_image(300, 1), *b = make_image(700, 2);
	dg_cache *c = open_at(root, 0);

	key_of(1, key);
	cr_assert_eq(dg_cache_put(c, key, a, 300, "{\"v\":1}"), DG_OK);
	expect_hit(c, key, a, 300, "{\"v\":1}");
	cr_assert_eq(dg_cache_put(c, key, b, 700, "{\"v\":2}"), DG_OK);
	expect_hit(c, key, b, 700, "{\"v\":2}");
	cr_assert_eq(count_dir("kernels", NULL, 0), 1);
	cr_assert_eq(count_dir("tmp", NULL, 0), 0);
	dg_cache_close(c);
	free(a);
	free(b);
}

Test(cache, put_failure_removes_temp)
{
	char key[65], p[512];
	dg_cache *c = open_at(root, 0);

	key_of(1, key);
	entry_path(p, sizeof(p), key);
	/* A folder where the entry goes: the rename must fail. */
	cr_assert_eq(mkdir(p, 0755), 0);
	cr_assert_eq(dg_cache_put(c, key, (const uint8_t *)"abc", 3, "{}"), DG_ERR_IO);
	cr_assert(strstr(dg_cache_errmsg(c), "/tmp/"), "%s", dg_cache_errmsg(c));
	cr_assert(strstr(dg_cache_errmsg(c), "rename"), "%s", dg_cache_errmsg(c));
	cr_assert_eq(count_dir("tmp", NULL, 0), 0);
	cr_assert_eq(rmdir(p), 0);
	cr_assert_eq(dg_cache_put(c, key, (const uint8_t *)"abc", 3, "{}"), DG_OK);
	expect_hit(c, key, (const uint8_t *)"abc", 3, "{}");
	dg_cache_close(c);
}

/* ---- corruption ---------------------------------------------------------- */

enum damage { FLIP, TRUNCATE, EMPTY, APPEND, WRONG_NAME };

static void empty_dir(const char *sub)
{
	char p[512], name[300];

	while (count_dir(sub, name, sizeof(name)) > 0) {
		snprintf(p, sizeof(p), "%s/%s/%.200s", root, sub, name);
		cr_assert_eq(unlink(p), 0, "unlink %s", p);
	}
}

/*
 * Puts an entry, damages its file, and checks: a miss, the file moved to
 * an emptied quarantine/, the message says so (and why, when not NULL),
 * and a new put then hits.
 */
static void damage_case(dg_cache *c, enum damage how, size_t arg,
			const char *why)
{
	const char *meta = "{\"k\":\"v\"}";
	size_t n = 256, fsz;
	uint8_t *img = make_image(n, 3), *f;
	char key[65], other[65], p[512], q[512], first[300];

	key_of(7, key);
	key_of(8, other);
	empty_dir("quarantine");
	cr_assert_eq(dg_cache_put(c, key, img, n, meta), DG_OK);
	entry_path(p, sizeof(p), key);
	switch (how) {
	case FLIP:
		flip_byte(p, arg);
		break;
	case TRUNCATE:
		cr_assert_eq(truncate(p, (off_t)arg), 0);
		break;
	case EMPTY:
		cr_assert_eq(truncate(p, 0), 0);
		break;
	case APPEND:
		f = file_read(p, &fsz);
		f[fsz] = 'x';
		file_write(p, f, fsz + 1);
		free(f);
		break;
	case WRONG_NAME:
		/* key's bytes under other's name */
		entry_path(q, sizeof(q), other);
		cr_assert_eq(rename(p, q), 0);
		expect_miss(c, other);
		cr_assert(strstr(dg_cache_errmsg(c), "moved to quarantine/"), "%s", dg_cache_errmsg(c));
		cr_assert(strstr(dg_cache_errmsg(c), "not the key in its name"), "%s",
			  dg_cache_errmsg(c));
		cr_assert(!entry_exists(other));
		cr_assert_eq(count_dir("quarantine", first, sizeof(first)), 1);
		cr_assert_eq(dg_cache_put(c, other, img, n, meta), DG_OK);
		expect_hit(c, other, img, n, meta);
		free(img);
		return;
	}
	expect_miss(c, key);
	cr_assert(strstr(dg_cache_errmsg(c), "moved to quarantine/"), "%s", dg_cache_errmsg(c));
	if (why)
		cr_assert(strstr(dg_cache_errmsg(c), why), "want \"%s\" in: %s", why,
			  dg_cache_errmsg(c));
	cr_assert(!entry_exists(key), "damaged entry still in kernels/");
	cr_assert_eq(count_dir("quarantine", NULL, 0), 1);
	/* A miss again (nothing left), then the rebuilt entry hits. */
	expect_miss(c, key);
	cr_assert_eq(count_dir("quarantine", NULL, 0), 1);
	cr_assert_eq(dg_cache_put(c, key, img, n, meta), DG_OK);
	expect_hit(c, key, img, n, meta);
	free(img);
}

Test(cache, corrupt_image_byte)
{
	char first[300], key[65];
	dg_cache *c = open_at(root, 0);

	damage_case(c, FLIP, DG__CACHE_HEADER_SIZE + 10, "checksum mismatch");
	/* quarantine/<key>.<unix-time>.<pid>.<seq>.dgk */
	key_of(7, key);
	cr_assert_eq(count_dir("quarantine", first, sizeof(first)), 1);
	cr_assert_eq(strncmp(first, key, 64), 0, "%s", first);
	char mid[64];
	snprintf(mid, sizeof(mid), ".%ld.", (long)getpid());
	cr_assert(strstr(first, mid), "%s", first);
	cr_assert(strcmp(first + strlen(first) - 4, ".dgk") == 0, "%s", first);
	dg_cache_close(c);
}

Test(cache, corrupt_meta_byte)
{
	dg_cache *c = open_at(root, 0);
	/* the last byte of the file is the meta's last */
	damage_case(c, FLIP, DG__CACHE_HEADER_SIZE + 256 + 8, "checksum mismatch");
	dg_cache_close(c);
}

Test(cache, corrupt_every_header_byte)
{
	dg_cache *c = open_at(root, 0);
	for (size_t off = 0; off < DG__CACHE_HEADER_SIZE; off++)
		damage_case(c, FLIP, off, NULL);
	dg_cache_close(c);
}

Test(cache, corrupt_truncated)
{
	dg_cache *c = open_at(root, 0);
	damage_case(c, TRUNCATE, DG__CACHE_HEADER_SIZE + 256 + 8, "do not match the file size");
	damage_case(c, TRUNCATE, 60, "shorter than the 128-byte header");
	damage_case(c, TRUNCATE, DG__CACHE_HEADER_SIZE, "do not match");
	dg_cache_close(c);
}

Test(cache, corrupt_empty_file)
{
	dg_cache *c = open_at(root, 0);
	damage_case(c, EMPTY, 0, "0 bytes");
	dg_cache_close(c);
}

Test(cache, corrupt_trailing_garbage)
{
	dg_cache *c = open_at(root, 0);
	damage_case(c, APPEND, 0, "do not match");
	dg_cache_close(c);
}

Test(cache, corrupt_key_mismatch)
{
	dg_cache *c = open_at(root, 0);
	damage_case(c, WRONG_NAME, 0, NULL);
	char key[65];
	key_of(8, key);
	cr_assert(!entry_exists(key) || count_dir("kernels", NULL, 0) == 1);
	dg_cache_close(c);
}

Test(cache, corrupt_entry_rebuilt_by_get_or_build)
{
	char key[65], p[512];
	dg_cache_blob b;
	bool hit = true;
	dg_cache *c = open_at(root, 0);

	key_of(1, key);
	cr_assert_eq(dg_cache_put(c, key, (const uint8_t *)"image", 5, "{}"), DG_OK);
	entry_path(p, sizeof(p), key);
	flip_byte(p, DG__CACHE_HEADER_SIZE + 1);
	cr_assert_eq(dg_cache_get_or_build(c, key, build_counting, NULL, &b, &hit), DG_OK);
	cr_assert_eq(build_calls, 1);
	cr_assert(!hit);
	cr_assert_eq(count_dir("quarantine", NULL, 0), 1);
	dg_cache_blob_free(&b);
	expect_hit(c, key, (const uint8_t *)"image", 5, "{}");
	dg_cache_close(c);
}

/*
 * Quarantining one key again and again within a second keeps every copy:
 * names carry a per-process sequence number, not only the second and pid.
 * Each damaged copy has its own size, so the sizes show which survived.
 */
Test(cache, quarantine_same_second_keeps_every_copy)
{
	enum { COPIES = 3 };
	char key[65], p[1024], prefix[160], name[300];
	time_t t0 = 0, t1 = 1;
	dg_cache *c = open_at(root, 0);

	key_of(7, key);
	for (int attempt = 0; attempt < 5 && t0 != t1; attempt++) {
		empty_dir("quarantine");
		t0 = time(NULL);
		for (int i = 0; i < COPIES; i++) {
			uint8_t *img = make_image(100 * (size_t)(i + 1), i);
			cr_assert_eq(dg_cache_put(c, key, img, 100 * (size_t)(i + 1), "{}"),
				     DG_OK);
			free(img);
			entry_path(p, sizeof(p), key);
			flip_byte(p, DG__CACHE_HEADER_SIZE + 1);
			expect_miss(c, key);
		}
		t1 = time(NULL);
	}
	cr_assert_eq(t0, t1, "could not quarantine %d copies within a second", COPIES);
	cr_assert_eq(count_dir("quarantine", NULL, 0), COPIES);

	/* <key>.<t0>.<pid>.<seq>.dgk, one per damaged size */
	bool seen[COPIES] = { false };
	DIR *d;
	struct dirent *de;
	snprintf(prefix, sizeof(prefix), "%s.%lld.%ld.", key, (long long)t0,
		 (long)getpid());
	snprintf(p, sizeof(p), "%s/quarantine", root);
	cr_assert_not_null(d = opendir(p));
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(name, sizeof(name), "%s", de->d_name);
		cr_assert_eq(strncmp(name, prefix, strlen(prefix)), 0, "%s", name);
		sub_path(p, sizeof(p), "quarantine", name);
		off_t image = file_size(p) - (off_t)DG__CACHE_HEADER_SIZE - 2;
		cr_assert(image % 100 == 0 && image >= 100 && image <= 100 * COPIES,
			  "%s: %lld", name, (long long)image);
		seen[image / 100 - 1] = true;
	}
	closedir(d);
	for (int i = 0; i < COPIES; i++)
		cr_assert(seen[i], "copy %d lost", i);
	dg_cache_close(c);
}

/* ---- a writer killed mid-write ------------------------------------------- */

static void die_now(void)
{
	raise(SIGKILL);
}

Test(cache, killed_mid_write)
{
	char key[65], tname[300], p[1024], pidpart[32];
	uint8_t *img = make_image(4096, 5);
	const char *meta = "{\"crash\":true}";
	dg_cache_stats s;
	uint64_t removed = 99;
	int status;
	pid_t pid;

	key_of(3, key);
	pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		dg_cache *cc = NULL;
		dg_cache_opts o = { .dir = root };
		if (dg_cache_open(&cc, &o))
			_exit(3);
		dg__cache_test_after_partial_write = die_now;
		dg_cache_put(cc, key, img, 4096, meta);
		_exit(4); /* not reached if the hook ran */
	}
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
		  "child was not killed in the hook (status %d)", status);

	dg_cache *c = open_at(root, 0);
	expect_miss(c, key);
	cr_assert_eq(count_dir("kernels", NULL, 0), 0);
	cr_assert_eq(count_dir("quarantine", NULL, 0), 0);
	cr_assert_eq(count_dir("tmp", tname, sizeof(tname)), 1);
	/* tmp/<key>.<pid>.<random>.tmp, half written */
	snprintf(pidpart, sizeof(pidpart), ".%ld.", (long)pid);
	cr_assert_eq(strncmp(tname, key, 64), 0, "%s", tname);
	cr_assert(strstr(tname, pidpart), "%s", tname);
	cr_assert(strstr(tname, ".tmp"), "%s", tname);
	sub_path(p, sizeof(p), "tmp", tname);
	cr_assert_eq(file_size(p),
		     (off_t)((DG__CACHE_HEADER_SIZE + 4096 + strlen(meta)) / 2));

	cr_assert_eq(dg_cache_stat(c, &s), DG_OK);
	cr_assert_eq(s.temp_files, 1);
	cr_assert_eq(s.entries, 0);
	/* A fresh temp file may belong to a live writer: gc keeps it. */
	cr_assert_eq(dg_cache_gc(c, 0, &removed), DG_OK);
	cr_assert_eq(removed, 0);
	cr_assert(exists(p));
	set_mtime(p, time(NULL) - 120);
	cr_assert_eq(dg_cache_gc(c, 0, &removed), DG_OK);
	cr_assert_eq(removed, 1);
	cr_assert(!exists(p));
	cr_assert_eq(dg_cache_stat(c, &s), DG_OK);
	cr_assert_eq(s.temp_files, 0);

	cr_assert_eq(dg_cache_put(c, key, img, 4096, meta), DG_OK);
	expect_hit(c, key, img, 4096, meta);
	dg_cache_close(c);
	free(img);
}

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
	dg_cache_opts o = { .dir = root };
	char key[65];
	dg__sha256 s;

	key_of(42, key);
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

	snprintf(counter, sizeof(counter), "%s/builds.txt", root);
	key_of(42, key);
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
	char *builds = (char *)file_read(counter, &n);
	builds[n] = '\0';
	int nl = 0;
	for (size_t i = 0; i < n; i++)
		nl += builds[i] == '\n';
	cr_assert_eq(nl, 1, "builds: %s", builds);
	cr_assert_eq(count_dir("kernels", NULL, 0), 1);
	cr_assert_eq(count_dir("tmp", NULL, 0), 0);

	dg_cache *c = open_at(root, 0);
	dg_cache_blob b;
	char want[64];
	cr_assert_eq(dg_cache_get(c, key, &b), DG_OK);
	snprintf(want, sizeof(want), "image built by pid %ld", strtol(builds, NULL, 10));
	cr_assert_str_eq((char *)b.image, want);
	dg_cache_blob_free(&b);
	dg_cache_close(c);
	free(builds);
}

/* ---- eviction ------------------------------------------------------------- */

#define EV_IMAGE 1000
#define EV_SIZE (DG__CACHE_HEADER_SIZE + EV_IMAGE + 2) /* meta "{}" */

static void ev_put(dg_cache *c, int i)
{
	char key[65];
	uint8_t *img = make_image(EV_IMAGE, i);

	key_of(i, key);
	cr_assert_eq(dg_cache_put(c, key, img, EV_IMAGE, "{}"), DG_OK, "%s",
		     dg_cache_errmsg(c));
	free(img);
}

static void ev_mtime(int i, time_t t)
{
	char key[65], p[512];

	key_of(i, key);
	entry_path(p, sizeof(p), key);
	set_mtime(p, t);
}

static bool ev_has(int i)
{
	char key[65];
	key_of(i, key);
	return entry_exists(key);
}

Test(cache, eviction_lru)
{
	time_t now = time(NULL);
	dg_cache *big = open_at(root, 0);
	dg_cache *small = open_at(root, 3 * EV_SIZE);

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
	key_of(3, key);
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
		key_of(idx[i], ks[i]);
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
	dg_cache *big = open_at(root, 0);
	dg_cache *tiny = open_at(root, 1);

	for (int i = 0; i < 3; i++)
		ev_put(big, i);
	ev_put(tiny, 9); /* larger than the cap by itself */
	cr_assert(ev_has(9));
	cr_assert(!ev_has(0) && !ev_has(1) && !ev_has(2));
	char key[65];
	uint8_t *img = make_image(EV_IMAGE, 9);
	key_of(9, key);
	expect_hit(tiny, key, img, EV_IMAGE, "{}");
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
	dg_cache *c = open_at(root, 0);

	for (int i = 0; i < 3; i++)
		ev_put(c, i);
	key_of(3, key);
	cr_assert_eq(dg_cache_get_or_build(c, key, build_counting, NULL, &b, &hit),
		     DG_OK);
	dg_cache_blob_free(&b);
	uint64_t k3size = DG__CACHE_HEADER_SIZE + 5 + 2;
	key_of(1, key);
	entry_path(p, sizeof(p), key);
	flip_byte(p, DG__CACHE_HEADER_SIZE + 500);
	sub_path(p, sizeof(p), "tmp", "old.tmp");
	file_write(p, "x", 1);
	set_mtime(p, now - 120);
	sub_path(p, sizeof(p), "tmp", "fresh.tmp");
	file_write(p, "y", 1);
	sub_path(p, sizeof(p), "quarantine", "q.dgk");
	file_write(p, "z", 1);

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
	cr_assert(!entry_exists(key));
	cr_assert_eq(dg_cache_stat(c, &s), DG_OK);
	cr_assert_eq(s.entries, 3);
	cr_assert_eq(s.quarantined, 2);
	cr_assert_eq(dg_cache_verify(c, &v), DG_OK);
	cr_assert_eq(v.checked, 3);
	cr_assert_eq(v.bad, 0);

	/* gc: the old temp and the 2 quarantined files; the fresh temp stays;
	 * an idle lock file goes, a held one stays. */
	key_of(0, key);
	snprintf(lockp, sizeof(lockp), "%s/locks/%s.lock", root, key);
	int lfd = open(lockp, O_RDONLY | O_CREAT, 0644);
	cr_assert_geq(lfd, 0);
	cr_assert_eq(flock(lfd, LOCK_EX), 0);
	cr_assert_eq(count_dir("locks", NULL, 0), 2);
	cr_assert_eq(dg_cache_gc(c, 0, &removed), DG_OK, "%s", dg_cache_errmsg(c));
	cr_assert_eq(removed, 3);
	cr_assert_eq(count_dir("locks", NULL, 0), 1);
	cr_assert(exists(lockp), "a held lock file was removed");
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
	cr_assert_eq(count_dir("locks", NULL, 0), 0);
	expect_miss(c, key);
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
	dg_cache *c = open_at(root, 0);

	for (int i = 0; i < 4; i++)
		ev_put(c, i);
	key_of(1, key);
	entry_path(p, sizeof(p), key);
	flip_byte(p, DG__CACHE_HEADER_SIZE + 500);
	key_of(2, key);
	entry_path(p, sizeof(p), key);
	cr_assert_eq(truncate(p, 60), 0);
	sub_path(p, sizeof(p), "kernels", "junk.dgk");
	file_write(p, "x", 1);

	cr_assert_eq(dg_cache_verify_each(c, collect_bad, &bad, &v), DG_OK, "%s",
		     dg_cache_errmsg(c));
	cr_assert_eq(v.checked, 5);
	cr_assert_eq(v.ok, 2);
	cr_assert_eq(v.bad, 3);
	cr_assert_eq(bad.n, 3, "%s", bad.text);
	key_of(1, key);
	expect_reason(&bad, key, "checksum mismatch");
	key_of(2, key);
	expect_reason(&bad, key, "shorter than the 128-byte header");
	expect_reason(&bad, "junk.dgk", "file name is not");
	for (int i = 0; i < 4; i += 3) {
		key_of(i, key);
		cr_assert_null(strstr(bad.text, key), "good entry %d reported:\n%s", i,
			       bad.text);
	}
	cr_assert_eq(count_dir("quarantine", NULL, 0), 3);
	cr_assert_eq(count_dir("kernels", NULL, 0), 2);

	/* Nothing left to report; a NULL callback is allowed. */
	memset(&bad, 0, sizeof(bad));
	cr_assert_eq(dg_cache_verify_each(c, collect_bad, &bad, &v), DG_OK);
	cr_assert_eq(v.checked, 2);
	cr_assert_eq(v.bad, 0);
	cr_assert_eq(bad.n, 0);
	key_of(3, key);
	entry_path(p, sizeof(p), key);
	flip_byte(p, DG__CACHE_HEADER_SIZE);
	cr_assert_eq(dg_cache_verify_each(c, NULL, NULL, &v), DG_OK);
	cr_assert_eq(v.bad, 1);
	cr_assert_eq(count_dir("quarantine", NULL, 0), 4);
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

	snprintf(a, sizeof(a), "%s/env/dir", root);
	snprintf(o, sizeof(o), "%s/opts", root);
	snprintf(x, sizeof(x), "%s/xdg", root);
	snprintf(h, sizeof(h), "%s/home", root);
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
	snprintf(slash, sizeof(slash), "%s/trail//", root);
	setenv("DRAGON_CACHE_DIR", slash, 1);
	snprintf(want, sizeof(want), "%s/trail", root);
	expect_root(want);
}

Test(cache, root_not_a_folder)
{
	char f[300];
	dg_cache_opts opts = { .dir = f };
	dg_cache *c = (dg_cache *)&opts;

	snprintf(f, sizeof(f), "%s/afile", root);
	file_write(f, "x", 1);
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

	snprintf(f, sizeof(f), "%s/afile", root);
	file_write(f, "x", 1);
	cr_assert_eq(dg_cache_open(&c, &opts), DG_ERR_IO);
	cr_assert(strstr(dg_cache_errmsg(NULL), f), "%s", dg_cache_errmsg(NULL));
	cr_assert_eq(pthread_create(&th, NULL, errmsg_on_new_thread, other), 0);
	cr_assert_eq(pthread_join(th, NULL), 0);
	cr_assert_str_eq(other, "");
	cr_assert(strstr(dg_cache_errmsg(NULL), f), "the failure was lost");

	c = open_at(root, 0);
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
	dg_cache_opts opts = { .dir = root };
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

Test(cache, builder_failure_publishes_nothing)
{
	char key[65];
	dg_cache_blob b;
	bool hit = true;
	int calls = 0;
	dg_cache *c = open_at(root, 0);

	key_of(1, key);
	cr_assert_eq(dg_cache_get_or_build(c, key, build_fail, &calls, &b, &hit),
		     DG_ERR_COMPILE);
	cr_assert_eq(calls, 1);
	cr_assert(!hit);
	cr_assert_null(b.image);
	cr_assert(strstr(dg_cache_errmsg(c), "nothing was published"), "%s",
		  dg_cache_errmsg(c));
	cr_assert_eq(count_dir("kernels", NULL, 0), 0);
	cr_assert_eq(count_dir("tmp", NULL, 0), 0);
	expect_miss(c, key);

	cr_assert_eq(dg_cache_get_or_build(c, key, build_null_image, NULL, &b, &hit),
		     DG_ERR_INTERNAL);
	cr_assert_eq(count_dir("kernels", NULL, 0), 0);

	/* A good builder: built once, then served from disk. */
	cr_assert_eq(dg_cache_get_or_build(c, key, build_counting, NULL, &b, &hit), DG_OK);
	cr_assert(!hit);
	cr_assert_eq(build_calls, 1);
	cr_assert_eq(b.image_size, 5);
	cr_assert_eq(memcmp(b.image, "image", 5), 0);
	cr_assert_str_eq(b.meta, "{}");
	dg_cache_blob_free(&b);
	cr_assert_eq(dg_cache_get_or_build(c, key, build_counting, NULL, &b, &hit), DG_OK);
	cr_assert(hit);
	cr_assert_eq(build_calls, 1);
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
	dg_cache_blob b;
	bool hit = true;
	dg_cache *c = open_at(root, 0);

	key_of(1, key);
	cr_assert_eq(dg_cache_get_or_build(c, key, build_fail_dirty, NULL, &b, &hit),
		     DG_ERR_COMPILE);
	cr_assert(!hit);
	cr_assert_null(b.image);
	cr_assert_null(b.meta);
	cr_assert_eq(count_dir("kernels", NULL, 0), 0);
	cr_assert_eq(count_dir("tmp", NULL, 0), 0);
	dg_cache_close(c);
}

/* Empties <root>/<sub>, a folder the open handle has open, and replaces it
 * with a regular file: the handle's folder is gone, so nothing can be
 * created in it (what a read-only or vanished cache folder looks like to a
 * writer). */
static void break_subdir(const char *sub)
{
	char p[512];

	empty_dir(sub);
	snprintf(p, sizeof(p), "%s/%s", root, sub);
	cr_assert_eq(rmdir(p), 0, "rmdir %s: %s", p, strerror(errno));
	file_write(p, "not a folder", 12);
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
	dg_cache *c = open_at(root, 0);

	key_of(1, key);
	break_subdir("kernels");
	cr_assert_eq(dg_cache_get_or_build(c, key, build_counting, NULL, &b, &hit),
		     DG_OK, "%s", dg_cache_errmsg(c));
	expect_built(&b, hit);
	cr_assert_eq(build_calls, 1);
	dg_cache_blob_free(&b);
	cr_assert(strstr(dg_cache_errmsg(c), "could not be stored"), "%s",
		  dg_cache_errmsg(c));
	cr_assert(strstr(dg_cache_errmsg(c), key), "%s", dg_cache_errmsg(c));
	cr_assert(strstr(dg_cache_errmsg(c), "rename"), "%s", dg_cache_errmsg(c));
	cr_assert(strstr(dg_cache_errmsg(c), "nothing was published"), "%s",
		  dg_cache_errmsg(c));
	cr_assert_eq(count_dir("tmp", NULL, 0), 0);
	cr_assert_eq(count_dir("quarantine", NULL, 0), 0);

	/* Nothing was kept: the next call builds again. */
	cr_assert_eq(dg_cache_get_or_build(c, key, build_counting, NULL, &b, &hit),
		     DG_OK);
	expect_built(&b, hit);
	cr_assert_eq(build_calls, 2);
	dg_cache_blob_free(&b);
	dg_cache_close(c);

	/* A cache that works again stores it, and says nothing. */
	char p[512];
	snprintf(p, sizeof(p), "%s/kernels", root);
	cr_assert_eq(unlink(p), 0);
	c = open_at(root, 0);
	cr_assert_eq(dg_cache_get_or_build(c, key, build_counting, NULL, &b, &hit),
		     DG_OK);
	expect_built(&b, hit);
	cr_assert_str_eq(dg_cache_errmsg(c), "");
	dg_cache_blob_free(&b);
	cr_assert(entry_exists(key));
	cr_assert_eq(build_calls, 3);
	dg_cache_close(c);
}

static dg_status build_big(void *user, uint8_t **image, size_t *size,
			   char **meta)
{
	(void)user;
	*image = make_image(8192, 4);
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
	uint8_t *want = make_image(8192, 4);
	dg_cache *c = open_at(root, 0);

	key_of(2, key);
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
	cr_assert_eq(count_dir("kernels", NULL, 0), 0);
	cr_assert_eq(count_dir("tmp", NULL, 0), 0);
	expect_miss(c, key);
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
	dg_cache *c = open_at(root, 0);

	key_of(1, key);
	break_subdir("locks");
	cr_assert_eq(dg_cache_get_or_build(c, key, build_counting, NULL, &b, &hit),
		     DG_OK, "%s", dg_cache_errmsg(c));
	expect_built(&b, hit);
	dg_cache_blob_free(&b);
	cr_assert(strstr(dg_cache_errmsg(c), "without its build lock"), "%s",
		  dg_cache_errmsg(c));
	cr_assert(strstr(dg_cache_errmsg(c), "/locks/"), "%s", dg_cache_errmsg(c));
	cr_assert(entry_exists(key));
	cr_assert_eq(dg_cache_get_or_build(c, key, build_counting, NULL, &b, &hit),
		     DG_OK);
	cr_assert(hit);
	cr_assert_eq(build_calls, 1);
	dg_cache_blob_free(&b);

	/* Neither lock nor publish: a read-only cache. */
	key_of(2, key);
	break_subdir("kernels");
	cr_assert_eq(dg_cache_get_or_build(c, key, build_counting, NULL, &b, &hit),
		     DG_OK, "%s", dg_cache_errmsg(c));
	expect_built(&b, hit);
	cr_assert_eq(build_calls, 2);
	dg_cache_blob_free(&b);
	cr_assert(strstr(dg_cache_errmsg(c), "could not be stored"), "%s",
		  dg_cache_errmsg(c));
	cr_assert_eq(count_dir("tmp", NULL, 0), 0);
	dg_cache_close(c);
}

Test(cache, null_handles)
{
	dg_cache_blob b = { 0 };
	uint64_t removed = 5;

	dg_cache_close(NULL);
	dg_cache_blob_free(NULL);
	dg_cache_blob_free(&b);
	cr_assert_null(b.image);
	cr_assert_not_null(dg_cache_errmsg(NULL));
	cr_assert_str_eq(dg_cache_root(NULL), "");
	cr_assert_eq(dg_cache_open(NULL, NULL), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_cache_get(NULL, "", &b), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_cache_put(NULL, "", NULL, 0, NULL), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_cache_gc(NULL, 0, &removed), DG_ERR_INVALID_ARG);
	cr_assert_eq(removed, 0);
	cr_assert_eq(dg_cache_clear(NULL, NULL), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_cache_verify_each(NULL, NULL, NULL, NULL), DG_ERR_INVALID_ARG);

	dg_cache *c = open_at(root, 0);
	cr_assert_eq(dg_cache_get(c, "", NULL), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_cache_stat(c, NULL), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_cache_verify(c, NULL), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_cache_verify_each(c, NULL, NULL, NULL), DG_ERR_INVALID_ARG);
	char key[65];
	key_of(1, key);
	cr_assert_eq(dg_cache_put(c, key, NULL, 3, "{}"), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_cache_errmsg(c), "image is NULL"), "%s", dg_cache_errmsg(c));
	cr_assert_eq(count_dir("kernels", NULL, 0), 0);
	dg_cache_close(c);
}
