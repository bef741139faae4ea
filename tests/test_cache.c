/*
 * Tests for base/sha256.c and the get/put side of runtime/store/cache.c:
 * SHA-256 vectors, the entry format, hits and misses, bad keys, corruption
 * (each a quarantined miss; repeated quarantines keep every copy), a writer
 * killed mid-write, and NULL handles. get_or_build is tested in
 * tests/test_cache_build.c; eviction, stat/verify/gc/clear and root
 * selection in tests/test_cache_admin.c. The fixture (a fresh root under
 * /tmp and a clean environment for each test) and the helpers the three
 * share are in tests/cache_helpers.h.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache_helpers.h"
#include "dragon/cache.h"
#include "runtime/store/cache_int.h"
#include "base/sha256.h"

TestSuite(cache, .init = ch_setup, .fini = ch_teardown);

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

/* The SHA extensions' compression (where the CPU has them) gives the
 * portable one's digests: every length to 1100 bytes of a pseudo-random
 * message, and 1 MiB at unaligned offsets; the NIST vectors above ran on
 * whichever this CPU takes, and run again here on the portable code. */
Test(sha256, accelerated_is_the_portable_digest)
{
	enum { N = 1 << 20 };
	uint8_t *m = malloc(N + 8);
	cr_assert_not_null(m);
	uint64_t x = 88172645463325252ull;
	for (size_t i = 0; i < N + 8; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		m[i] = (uint8_t)x;
	}
	printf("sha256: %s\n", dg__sha256_accelerated() ? "the CPU's SHA extensions" : "portable");
	uint8_t a[32], b[32];
	for (size_t n = 0; n <= 1100; n++) {
		dg__sha256_set_portable(false);
		dg__sha256_digest(m + n % 7, n, a);
		dg__sha256_set_portable(true);
		dg__sha256_digest(m + n % 7, n, b);
		cr_assert_eq(memcmp(a, b, 32), 0, "%zu bytes", n);
	}
	for (size_t off = 0; off < 8; off += 3) {
		dg__sha256_set_portable(false);
		dg__sha256_digest(m + off, N, a);
		dg__sha256_set_portable(true);
		dg__sha256_digest(m + off, N, b);
		cr_assert_eq(memcmp(a, b, 32), 0, "1 MiB at +%zu", off);
	}
	expect_hex("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	expect_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56,
		   "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
	dg__sha256_set_portable(false);
	free(m);
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
	uint8_t *img = ch_make_image(n, 1), *f, sum[32];
	char key[65], p[512];
	dg__sha256 s;
	dg_cache *c = ch_open_at(ch_root, 0);

	ch_key_of(1, key);
	cr_assert_str_eq(dg_cache_root(c), ch_root);
	ch_expect_miss(c, key);
	cr_assert_eq(dg_cache_put(c, key, img, n, meta), DG_OK, "%s",
		     dg_cache_errmsg(c));
	ch_expect_hit(c, key, img, n, meta);

	/* The bytes on disk are the documented layout. */
	ch_entry_path(p, sizeof(p), key);
	f = ch_file_read(p, &fsz);
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
	dg_cache *c2 = ch_open_at(ch_root, 0);
	ch_expect_hit(c2, key, img, n, meta);
	cr_assert_eq(ch_count_dir("tmp", NULL, 0), 0);
	cr_assert_eq(ch_count_dir("kernels", NULL, 0), 1);

	/* An empty image and NULL meta round-trip as 0 bytes and "". */
	ch_key_of(2, key);
	cr_assert_eq(dg_cache_put(c, key, NULL, 0, NULL), DG_OK);
	ch_expect_hit(c, key, (const uint8_t *)"", 0, "");
	dg_cache_close(c2);
	dg_cache_close(c);
	free(img);
}

Test(cache, folders_created)
{
	char p[512];
	struct stat sb;
	static const char *sub[] = { "kernels", "quarantine", "locks", "tmp" };

	snprintf(p, sizeof(p), "%s/deep/er/cache", ch_root);
	dg_cache *c = ch_open_at(p, 0);
	for (int i = 0; i < 4; i++) {
		snprintf(p, sizeof(p), "%s/deep/er/cache/%s", ch_root, sub[i]);
		cr_assert_eq(stat(p, &sb), 0, "%s missing", p);
		cr_assert(S_ISDIR(sb.st_mode));
	}
	dg_cache_close(c);
}

Test(cache, invalid_keys)
{
	char k63[64], k65[66], upper[65], nonhex[65], slash[65], nl[66];
	const char *bad[] = { "", k63, k65, upper, nonhex, slash, nl };
	dg_cache_blob b;
	bool hit;
	dg_cache *c = ch_open_at(ch_root, 0);

	memset(k63, 'a', 63); k63[63] = 0;
	memset(k65, 'a', 65); k65[65] = 0;
	ch_key_of(1, upper); upper[10] = 'A';
	ch_key_of(1, nonhex); nonhex[63] = 'g';
	ch_key_of(1, slash); slash[0] = '.'; slash[1] = '.'; slash[2] = '/';
	ch_key_of(1, nl); nl[64] = '\n'; nl[65] = 0;

	cr_assert_eq(dg_cache_get(c, NULL, &b), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_cache_errmsg(c), "key"));
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cr_assert_eq(dg_cache_get(c, bad[i], &b), DG_ERR_INVALID_ARG, "get \"%s\"", bad[i]);
		cr_assert(strstr(dg_cache_errmsg(c), "64 lowercase hex"), "%s", dg_cache_errmsg(c));
		cr_assert_eq(dg_cache_put(c, bad[i], (const uint8_t *)"x", 1, "{}"),
			     DG_ERR_INVALID_ARG, "put \"%s\"", bad[i]);
		cr_assert(strstr(dg_cache_errmsg(c), "key"));
		cr_assert_eq(dg_cache_get_or_build(c, bad[i], ch_build_counting, NULL, &b, &hit),
			     DG_ERR_INVALID_ARG);
	}
	cr_assert_eq(ch_build_calls, 0);
	cr_assert_eq(ch_count_dir("kernels", NULL, 0), 0);
	cr_assert_eq(ch_count_dir("tmp", NULL, 0), 0);
	cr_assert_eq(ch_count_dir("locks", NULL, 0), 0);
	dg_cache_close(c);
}

Test(cache, overwrite)
{
	char key[65];
	uint8_t *a = ch_make_image(300, 1), *b = ch_make_image(700, 2);
	dg_cache *c = ch_open_at(ch_root, 0);

	ch_key_of(1, key);
	cr_assert_eq(dg_cache_put(c, key, a, 300, "{\"v\":1}"), DG_OK);
	ch_expect_hit(c, key, a, 300, "{\"v\":1}");
	cr_assert_eq(dg_cache_put(c, key, b, 700, "{\"v\":2}"), DG_OK);
	ch_expect_hit(c, key, b, 700, "{\"v\":2}");
	cr_assert_eq(ch_count_dir("kernels", NULL, 0), 1);
	cr_assert_eq(ch_count_dir("tmp", NULL, 0), 0);
	dg_cache_close(c);
	free(a);
	free(b);
}

Test(cache, put_failure_removes_temp)
{
	char key[65], p[512];
	dg_cache *c = ch_open_at(ch_root, 0);

	ch_key_of(1, key);
	ch_entry_path(p, sizeof(p), key);
	/* A folder where the entry goes: the rename must fail. */
	cr_assert_eq(mkdir(p, 0755), 0);
	cr_assert_eq(dg_cache_put(c, key, (const uint8_t *)"abc", 3, "{}"), DG_ERR_IO);
	cr_assert(strstr(dg_cache_errmsg(c), "/tmp/"), "%s", dg_cache_errmsg(c));
	cr_assert(strstr(dg_cache_errmsg(c), "rename"), "%s", dg_cache_errmsg(c));
	cr_assert_eq(ch_count_dir("tmp", NULL, 0), 0);
	cr_assert_eq(rmdir(p), 0);
	cr_assert_eq(dg_cache_put(c, key, (const uint8_t *)"abc", 3, "{}"), DG_OK);
	ch_expect_hit(c, key, (const uint8_t *)"abc", 3, "{}");
	dg_cache_close(c);
}

/* ---- corruption ---------------------------------------------------------- */

enum damage { FLIP, TRUNCATE, EMPTY, APPEND, WRONG_NAME };

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
	uint8_t *img = ch_make_image(n, 3), *f;
	char key[65], other[65], p[512], q[512], first[300];

	ch_key_of(7, key);
	ch_key_of(8, other);
	ch_empty_dir("quarantine");
	cr_assert_eq(dg_cache_put(c, key, img, n, meta), DG_OK);
	ch_entry_path(p, sizeof(p), key);
	switch (how) {
	case FLIP:
		ch_flip_byte(p, arg);
		break;
	case TRUNCATE:
		cr_assert_eq(truncate(p, (off_t)arg), 0);
		break;
	case EMPTY:
		cr_assert_eq(truncate(p, 0), 0);
		break;
	case APPEND:
		f = ch_file_read(p, &fsz);
		f[fsz] = 'x';
		ch_file_write(p, f, fsz + 1);
		free(f);
		break;
	case WRONG_NAME:
		/* key's bytes under other's name */
		ch_entry_path(q, sizeof(q), other);
		cr_assert_eq(rename(p, q), 0);
		ch_expect_miss(c, other);
		cr_assert(strstr(dg_cache_errmsg(c), "moved to quarantine/"), "%s", dg_cache_errmsg(c));
		cr_assert(strstr(dg_cache_errmsg(c), "not the key in its name"), "%s",
			  dg_cache_errmsg(c));
		cr_assert(!ch_entry_exists(other));
		cr_assert_eq(ch_count_dir("quarantine", first, sizeof(first)), 1);
		cr_assert_eq(dg_cache_put(c, other, img, n, meta), DG_OK);
		ch_expect_hit(c, other, img, n, meta);
		free(img);
		return;
	}
	ch_expect_miss(c, key);
	cr_assert(strstr(dg_cache_errmsg(c), "moved to quarantine/"), "%s", dg_cache_errmsg(c));
	if (why)
		cr_assert(strstr(dg_cache_errmsg(c), why), "want \"%s\" in: %s", why,
			  dg_cache_errmsg(c));
	cr_assert(!ch_entry_exists(key), "damaged entry still in kernels/");
	cr_assert_eq(ch_count_dir("quarantine", NULL, 0), 1);
	/* A miss again (nothing left), then the rebuilt entry hits. */
	ch_expect_miss(c, key);
	cr_assert_eq(ch_count_dir("quarantine", NULL, 0), 1);
	cr_assert_eq(dg_cache_put(c, key, img, n, meta), DG_OK);
	ch_expect_hit(c, key, img, n, meta);
	free(img);
}

Test(cache, corrupt_image_byte)
{
	char first[300], key[65];
	dg_cache *c = ch_open_at(ch_root, 0);

	damage_case(c, FLIP, DG__CACHE_HEADER_SIZE + 10, "checksum mismatch");
	/* quarantine/<key>.<unix-time>.<pid>.<seq>.dgk */
	ch_key_of(7, key);
	cr_assert_eq(ch_count_dir("quarantine", first, sizeof(first)), 1);
	cr_assert_eq(strncmp(first, key, 64), 0, "%s", first);
	char mid[64];
	snprintf(mid, sizeof(mid), ".%ld.", (long)getpid());
	cr_assert(strstr(first, mid), "%s", first);
	cr_assert(strcmp(first + strlen(first) - 4, ".dgk") == 0, "%s", first);
	dg_cache_close(c);
}

Test(cache, corrupt_meta_byte)
{
	dg_cache *c = ch_open_at(ch_root, 0);
	/* the last byte of the file is the meta's last */
	damage_case(c, FLIP, DG__CACHE_HEADER_SIZE + 256 + 8, "checksum mismatch");
	dg_cache_close(c);
}

Test(cache, corrupt_every_header_byte)
{
	dg_cache *c = ch_open_at(ch_root, 0);
	for (size_t off = 0; off < DG__CACHE_HEADER_SIZE; off++)
		damage_case(c, FLIP, off, NULL);
	dg_cache_close(c);
}

Test(cache, corrupt_truncated)
{
	dg_cache *c = ch_open_at(ch_root, 0);
	damage_case(c, TRUNCATE, DG__CACHE_HEADER_SIZE + 256 + 8, "do not match the file size");
	damage_case(c, TRUNCATE, 60, "shorter than the 128-byte header");
	damage_case(c, TRUNCATE, DG__CACHE_HEADER_SIZE, "do not match");
	dg_cache_close(c);
}

Test(cache, corrupt_empty_file)
{
	dg_cache *c = ch_open_at(ch_root, 0);
	damage_case(c, EMPTY, 0, "0 bytes");
	dg_cache_close(c);
}

Test(cache, corrupt_trailing_garbage)
{
	dg_cache *c = ch_open_at(ch_root, 0);
	damage_case(c, APPEND, 0, "do not match");
	dg_cache_close(c);
}

Test(cache, corrupt_key_mismatch)
{
	dg_cache *c = ch_open_at(ch_root, 0);
	damage_case(c, WRONG_NAME, 0, NULL);
	char key[65];
	ch_key_of(8, key);
	cr_assert(!ch_entry_exists(key) || ch_count_dir("kernels", NULL, 0) == 1);
	dg_cache_close(c);
}

Test(cache, corrupt_entry_rebuilt_by_get_or_build)
{
	char key[65], p[512];
	dg_cache_blob b;
	bool hit = true;
	dg_cache *c = ch_open_at(ch_root, 0);

	ch_key_of(1, key);
	cr_assert_eq(dg_cache_put(c, key, (const uint8_t *)"image", 5, "{}"), DG_OK);
	ch_entry_path(p, sizeof(p), key);
	ch_flip_byte(p, DG__CACHE_HEADER_SIZE + 1);
	cr_assert_eq(dg_cache_get_or_build(c, key, ch_build_counting, NULL, &b, &hit), DG_OK);
	cr_assert_eq(ch_build_calls, 1);
	cr_assert(!hit);
	cr_assert_eq(ch_count_dir("quarantine", NULL, 0), 1);
	dg_cache_blob_free(&b);
	ch_expect_hit(c, key, (const uint8_t *)"image", 5, "{}");
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
	dg_cache *c = ch_open_at(ch_root, 0);

	ch_key_of(7, key);
	for (int attempt = 0; attempt < 5 && t0 != t1; attempt++) {
		ch_empty_dir("quarantine");
		t0 = time(NULL);
		for (int i = 0; i < COPIES; i++) {
			uint8_t *img = ch_make_image(100 * (size_t)(i + 1), i);
			cr_assert_eq(dg_cache_put(c, key, img, 100 * (size_t)(i + 1), "{}"),
				     DG_OK);
			free(img);
			ch_entry_path(p, sizeof(p), key);
			ch_flip_byte(p, DG__CACHE_HEADER_SIZE + 1);
			ch_expect_miss(c, key);
		}
		t1 = time(NULL);
	}
	cr_assert_eq(t0, t1, "could not quarantine %d copies within a second", COPIES);
	cr_assert_eq(ch_count_dir("quarantine", NULL, 0), COPIES);

	/* <key>.<t0>.<pid>.<seq>.dgk, one per damaged size */
	bool seen[COPIES] = { false };
	DIR *d;
	struct dirent *de;
	snprintf(prefix, sizeof(prefix), "%s.%lld.%ld.", key, (long long)t0,
		 (long)getpid());
	snprintf(p, sizeof(p), "%s/quarantine", ch_root);
	cr_assert_not_null(d = opendir(p));
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(name, sizeof(name), "%s", de->d_name);
		cr_assert_eq(strncmp(name, prefix, strlen(prefix)), 0, "%s", name);
		ch_sub_path(p, sizeof(p), "quarantine", name);
		off_t image = ch_file_size(p) - (off_t)DG__CACHE_HEADER_SIZE - 2;
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
	uint8_t *img = ch_make_image(4096, 5);
	const char *meta = "{\"crash\":true}";
	dg_cache_stats s;
	uint64_t removed = 99;
	int status;
	pid_t pid;

	ch_key_of(3, key);
	pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		dg_cache *cc = NULL;
		dg_cache_opts o = { .dir = ch_root };
		if (dg_cache_open(&cc, &o))
			_exit(3);
		dg__cache_test_after_partial_write = die_now;
		dg_cache_put(cc, key, img, 4096, meta);
		_exit(4); /* not reached if the hook ran */
	}
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
		  "child was not killed in the hook (status %d)", status);

	dg_cache *c = ch_open_at(ch_root, 0);
	ch_expect_miss(c, key);
	cr_assert_eq(ch_count_dir("kernels", NULL, 0), 0);
	cr_assert_eq(ch_count_dir("quarantine", NULL, 0), 0);
	cr_assert_eq(ch_count_dir("tmp", tname, sizeof(tname)), 1);
	/* tmp/<key>.dgk.tmp.<pid>.<hex>, half written */
	snprintf(pidpart, sizeof(pidpart), ".%ld.", (long)pid);
	cr_assert_eq(strncmp(tname, key, 64), 0, "%s", tname);
	cr_assert(strstr(tname, pidpart), "%s", tname);
	cr_assert(strstr(tname, ".tmp"), "%s", tname);
	ch_sub_path(p, sizeof(p), "tmp", tname);
	cr_assert_eq(ch_file_size(p),
		     (off_t)((DG__CACHE_HEADER_SIZE + 4096 + strlen(meta)) / 2));

	cr_assert_eq(dg_cache_stat(c, &s), DG_OK);
	cr_assert_eq(s.temp_files, 1);
	cr_assert_eq(s.entries, 0);
	/* A fresh temp file may belong to a live writer: gc keeps it. */
	cr_assert_eq(dg_cache_gc(c, 0, &removed), DG_OK);
	cr_assert_eq(removed, 0);
	cr_assert(ch_exists(p));
	ch_set_mtime(p, time(NULL) - 120);
	cr_assert_eq(dg_cache_gc(c, 0, &removed), DG_OK);
	cr_assert_eq(removed, 1);
	cr_assert(!ch_exists(p));
	cr_assert_eq(dg_cache_stat(c, &s), DG_OK);
	cr_assert_eq(s.temp_files, 0);

	cr_assert_eq(dg_cache_put(c, key, img, 4096, meta), DG_OK);
	ch_expect_hit(c, key, img, 4096, meta);
	dg_cache_close(c);
	free(img);
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

	dg_cache *c = ch_open_at(ch_root, 0);
	cr_assert_eq(dg_cache_get(c, "", NULL), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_cache_stat(c, NULL), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_cache_verify(c, NULL), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_cache_verify_each(c, NULL, NULL, NULL), DG_ERR_INVALID_ARG);
	char key[65];
	ch_key_of(1, key);
	cr_assert_eq(dg_cache_put(c, key, NULL, 3, "{}"), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_cache_errmsg(c), "image is NULL"), "%s", dg_cache_errmsg(c));
	cr_assert_eq(ch_count_dir("kernels", NULL, 0), 0);
	dg_cache_close(c);
}
