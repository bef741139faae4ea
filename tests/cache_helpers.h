/*
 * Fixture and helpers shared by the disk cache suites (tests/test_cache.c,
 * tests/test_cache_build.c, tests/test_cache_admin.c). Names start with
 * ch_ (cache helpers).
 *
 * Every test gets a fresh root from mkdtemp under /tmp (removed by the
 * fixture) and a clean environment for the cache variables:
 *
 *   TestSuite(cache, .init = ch_setup, .fini = ch_teardown, .timeout = 120);
 *
 * Every helper fails the test on an error it meets.
 */
#ifndef DG_TESTS_CACHE_HELPERS_H
#define DG_TESTS_CACHE_HELPERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "dragon/cache.h"

extern char ch_root[256]; /* this test's temp folder */

void ch_setup(void);
void ch_teardown(void);

/* Key number i: the hex SHA-256 of "key-<i>". */
void ch_key_of(int i, char key[65]);
/* A handle on dir with the given cap (0: the default). */
dg_cache *ch_open_at(const char *dir, uint64_t max_bytes);

/* <root>/<sub>/<name>, and <root>/kernels/<key>.dgk. */
void ch_sub_path(char *out, size_t n, const char *sub, const char *name);
void ch_entry_path(char *out, size_t n, const char *key);
bool ch_exists(const char *path);
bool ch_entry_exists(const char *key);
/* Names in <root>/<sub> (not . and ..); the first into first (may be NULL). */
int ch_count_dir(const char *sub, char *first, size_t n);
/* Removes every file in <root>/<sub>. */
void ch_empty_dir(const char *sub);

/* The whole file, malloc'd with one spare byte past *n. */
uint8_t *ch_file_read(const char *path, size_t *n);
void ch_file_write(const char *path, const void *p, size_t n);
/* XORs the byte at off with 0x5a. */
void ch_flip_byte(const char *path, size_t off);
void ch_set_mtime(const char *path, time_t t);
off_t ch_file_size(const char *path);

/* A deterministic test image of n bytes holding every byte value;
 * malloc'd. */
uint8_t *ch_make_image(size_t n, int seed);

/* get hits with exactly these bytes and meta. */
void ch_expect_hit(dg_cache *c, const char *key, const uint8_t *image,
		   size_t n, const char *meta);
/* get misses: DG_ERR_NOT_FOUND, NULL outputs, a message. */
void ch_expect_miss(dg_cache *c, const char *key);

/* A builder of image "image" and meta "{}" that counts its calls in
 * ch_build_calls (0 at the start of each test: Criterion forks each). */
extern int ch_build_calls;
dg_status ch_build_counting(void *user, uint8_t **image, size_t *size,
			    char **meta);

#endif
