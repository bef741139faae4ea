/*
 * A run's data (dragon/data.h, runtime/train/data.c):
 *   - the split: the first len − len/10 bytes train, the rest validate;
 *   - batches: rows inside their split, targets the next bytes, the same
 *     batches from the same RNG state (so a resumed run's position is its
 *     RNG state), other ones from another seed, validation rows starting
 *     in the validation split;
 *   - a split too short for a row is refused naming the split and the bytes
 *     needed; a missing file names it; a directory, a FIFO, a socket or a
 *     device is refused naming the path and what it is, before reading
 *     and without waiting on the FIFO;
 *   - the built-in corpus: $DRAGON_CORPUS missing says how to set it up,
 *     the wrong bytes are refused by digest; where data/shakespeare.txt or
 *     .gpu/corpus/shakespeare.txt is set up (scripts/corpus.sh), it loads
 *     with its 5,057,198 bytes, else "skipped: no corpus" (a failure
 *     under DRAGON_REQUIRE_DEPS=1, as scripts/test.sh runs it).
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "dragon/data.h"
#include "helpers.h"

/* A file of n bytes, byte i = i % 251, in a fresh folder. */
static char *file_of(size_t n)
{
	static char path[512];
	snprintf(path, sizeof(path), "%s/corpus.bin", dg_test_tmpdir());
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	for (size_t i = 0; i < n; i++)
		fputc((int)(i % 251), f);
	fclose(f);
	return path;
}

Test(data, split_and_batches)
{
	char msg[512];
	dg_corpus *c;
	cr_assert_eq(dg_corpus_open(file_of(1005), &c, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(c->len, 1005);
	cr_assert_eq(c->train_len, 905);
	cr_assert_eq(dg_corpus_check(c, 16, msg, sizeof(msg)), DG_OK, "%s", msg);
	enum { B = 4, T = 16 };
	int32_t idx[B * T], tgt[B * T], idx2[B * T], tgt2[B * T];
	for (int val = 0; val < 2; val++) {
		dg_rng r, r2;
		dg_rng_seed(&r, 3);
		dg_rng_seed(&r2, 3);
		for (int k = 0; k < 50; k++) {
			dg_corpus_batch(c, val, &r, B, T, idx, tgt);
			dg_corpus_batch(c, val, &r2, B, T, idx2, tgt2);
			cr_assert_eq(memcmp(idx, idx2, sizeof(idx)), 0);
			for (int row = 0; row < B; row++) {
				/* consecutive bytes (i % 251), each target the next one */
				for (int j = 0; j < T; j++) {
					cr_assert_eq(tgt[row * T + j], (idx[row * T + j] + 1) % 251);
					if (j)
						cr_assert_eq(idx[row * T + j], (idx[row * T + j - 1] + 1) % 251);
				}
			}
		}
		cr_assert_eq(r.state, r2.state);
	}
	/* val rows come from the last 100 bytes: offsets 905.. (bytes 905 % 251 = 152 ..) */
	dg_rng r;
	dg_rng_seed(&r, 1);
	for (int k = 0; k < 200; k++) {
		dg_corpus_batch(c, true, &r, 1, T, idx, tgt);
		int b0 = idx[0];
		bool in_val = false;
		for (size_t o = 905; o + T < 1005; o++)
			in_val |= (int)(o % 251) == b0;
		cr_assert(in_val, "a validation row starts at byte value %d", b0);
	}
	/* another seed, other batches */
	dg_rng a, b;
	dg_rng_seed(&a, 1);
	dg_rng_seed(&b, 2);
	dg_corpus_batch(c, false, &a, B, T, idx, tgt);
	dg_corpus_batch(c, false, &b, B, T, idx2, tgt2);
	cr_assert_neq(memcmp(idx, idx2, sizeof(idx)), 0);
	dg_corpus_close(c);
}

Test(data, too_short_and_missing)
{
	char msg[512];
	dg_corpus *c;
	cr_assert_eq(dg_corpus_open(file_of(100), &c, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_corpus_check(c, 9, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_corpus_check(c, 10, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "validation split (the last 10%) is 10 bytes; rows of 10 tokens need 11"), "%s", msg);
	cr_assert_eq(dg_corpus_check(c, 100, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "train split"), "%s", msg);
	dg_corpus_close(c);
	cr_assert_eq(dg_corpus_open("/nonexistent/corpus.txt", &c, msg, sizeof(msg)), DG_ERR_NOT_FOUND);
	cr_assert(strstr(msg, "/nonexistent/corpus.txt"), "%s", msg);
	cr_assert_null(c);
}

/* path is refused as `what` ("a directory"), naming it, and nothing is
 * handed out. */
static void expect_not_a_file(const char *path, const char *what)
{
	char msg[1024], want[1100];
	dg_corpus *c = (dg_corpus *)&msg; /* not NULL: the refusal must clear it */
	cr_assert_eq(dg_corpus_open(path, &c, msg, sizeof(msg)), DG_ERR_IO, "%s: %s", path, msg);
	snprintf(want, sizeof(want), "%s: %s, not a regular file", path, what);
	cr_assert(strstr(msg, want) == msg, "want '%s', got '%s'", want, msg);
	cr_assert(strchr(msg, '\n') == NULL, "%s", msg);
	cr_assert_null(c);
}

/* Only a regular file is a corpus: a directory once said "9223372036854775807
 * bytes: out of memory" (ftell of a directory) and a FIFO waited forever
 * for a writer (the timeout fails that). */
Test(data, only_a_regular_file_is_read, .timeout = 20)
{
	char *dir = dg_test_tmpdir(), path[600];
	expect_not_a_file(dir, "a directory");
	snprintf(path, sizeof(path), "%s/fifo", dir);
	cr_assert_eq(mkfifo(path, 0600), 0);
	expect_not_a_file(path, "a FIFO (named pipe)");
	snprintf(path, sizeof(path), "%s/sock", dir);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	cr_assert_lt(strlen(path), sizeof(sa.sun_path));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	expect_not_a_file(path, "a socket");
	close(fd);
	expect_not_a_file("/dev/null", "a character device");
	dg_test_rmtree(dir);
}

Test(data, builtin_corpus)
{
	char msg[512];
	dg_corpus *c = NULL;
	const char *old = getenv("DRAGON_CORPUS");
	char *keep = old ? strdup(old) : NULL;
	setenv("DRAGON_CORPUS", "/nonexistent/shakespeare.txt", 1);
	cr_assert_eq(dg_corpus_builtin(&c, msg, sizeof(msg)), DG_ERR_NOT_FOUND);
	cr_assert(strstr(msg, "run scripts/corpus.sh"), "%s", msg);
	setenv("DRAGON_CORPUS", file_of(2000), 1);
	cr_assert_eq(dg_corpus_builtin(&c, msg, sizeof(msg)), DG_ERR_CORRUPT);
	cr_assert(strstr(msg, "not the built-in corpus") && strstr(msg, DG_CORPUS_SHA256), "%s", msg);
	cr_assert_null(c);
	/* the real one, where it is set up */
	static const char *const where[] = { DG_SOURCE_DIR "/data/shakespeare.txt",
					     DG_SOURCE_DIR "/.gpu/corpus/shakespeare.txt" };
	const char *found = NULL;
	for (int i = 0; i < 2 && !found; i++)
		if (access(where[i], R_OK) == 0)
			found = where[i];
	if (dg_test_need(found != NULL, "no corpus (scripts/corpus.sh sets it up)",
			 "no data/shakespeare.txt: scripts/test.sh sets it up (scripts/corpus.sh)")) {
		setenv("DRAGON_CORPUS", found, 1);
		cr_assert_eq(dg_corpus_builtin(&c, msg, sizeof(msg)), DG_OK, "%s", msg);
		cr_assert_eq(c->len, DG_CORPUS_BYTES);
		cr_assert_eq(c->train_len, DG_CORPUS_BYTES - DG_CORPUS_BYTES / 10);
		cr_assert_eq(dg_corpus_check(c, 512, msg, sizeof(msg)), DG_OK, "%s", msg);
		dg_corpus_close(c);
	}
	if (keep)
		setenv("DRAGON_CORPUS", keep, 1);
	else
		unsetenv("DRAGON_CORPUS");
	free(keep);
}
