/*
 * Token corpora (dragon/data.h dg_corpus_open_with; runtime/train/
 * data_files.c, data_scan.c):
 *   - llm.c's shards: one read whole (its tokens, 90/10 split, vocab 50304
 *     by default); several as a glob, a comma list and a folder, in name
 *     order, rows running from one file into the next; the *_val_* shards
 *     beside the *_train_* ones validate, or the ones given among them;
 *     val shards alone split 90/10;
 *   - raw uint16 tokens: a folder's train.bin and val.bin, a train.bin
 *     naming its val.bin, any file with a vocab other than 256 (90/10), a
 *     plain file without one is bytes, a folder of train.bin without a
 *     vocab is refused saying to give it;
 *   - refusals naming the file and the byte offset: a shard cut short (its
 *     header's count past its bytes, a header shorter than 1024 bytes),
 *     bytes past the count, a bad magic, a bad version, a token not below
 *     the vocabulary (the first in file order, across the scan's pieces of
 *     2^24 tokens), an odd-sized raw file; the bad file of a list named; a
 *     glob of no file; a vocab out of range; nothing handed out;
 *   - the digest: the same files the same digest however named (glob,
 *     list, folder), another token or another split another one; a byte
 *     corpus's is its file's SHA-256, as before.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dragon/data.h"
#include "helpers.h"

static char msg[1024];

/* dir/name: an llm.c shard of n tokens, token i = first + i (% 65536),
 * with the header's magic, version and count as given (count < 0: n). */
static void shard(const char *dir, const char *name, int n, int first, int magic, int version, int count)
{
	char path[700];
	cr_assert_lt(snprintf(path, sizeof(path), "%s/%s", dir, name), (int)sizeof(path), "%s/%s: too long", dir, name);
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "%s", path);
	int32_t h[256] = { 0 };
	h[0] = magic, h[1] = version, h[2] = count < 0 ? n : count;
	for (int i = 0; i < 256; i++) /* little-endian, whatever the host */
		for (int b = 0; b < 4; b++)
			fputc((int)((uint32_t)h[i] >> (8 * b)) & 0xff, f);
	for (int i = 0; i < n; i++) {
		unsigned t = (unsigned)(first + i) & 0xffff;
		fputc((int)(t & 0xff), f);
		fputc((int)(t >> 8), f);
	}
	fclose(f);
}

static void good_shard(const char *dir, const char *name, int n, int first)
{
	shard(dir, name, n, first, DG_SHARD_MAGIC, DG_SHARD_VERSION, -1);
}

/* dir/name: n raw uint16 tokens first + i, then `odd` more bytes. */
static void raw(const char *dir, const char *name, int n, int first, int odd)
{
	char path[700];
	cr_assert_lt(snprintf(path, sizeof(path), "%s/%s", dir, name), (int)sizeof(path), "%s/%s: too long", dir, name);
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "%s", path);
	for (int i = 0; i < n; i++) {
		unsigned t = (unsigned)(first + i) & 0xffff;
		fputc((int)(t & 0xff), f);
		fputc((int)(t >> 8), f);
	}
	for (int i = 0; i < odd; i++)
		fputc(7, f);
	fclose(f);
}

/* Patches the uint16 token at index i of dir/name (a header of hdr bytes
 * before the tokens) to v. */
static void set_token(const char *dir, const char *name, long hdr, long i, unsigned v)
{
	char path[700];
	cr_assert_lt(snprintf(path, sizeof(path), "%s/%s", dir, name), (int)sizeof(path), "%s/%s: too long", dir, name);
	FILE *f = fopen(path, "r+b");
	cr_assert_not_null(f, "%s", path);
	cr_assert_eq(fseek(f, hdr + 2 * i, SEEK_SET), 0);
	fputc((int)(v & 0xff), f);
	fputc((int)(v >> 8), f);
	fclose(f);
}

static dg_corpus *open_ok(const char *data, int vocab)
{
	dg_corpus *c = NULL;
	dg_corpus_opts o = { .vocab = vocab };
	cr_assert_eq(dg_corpus_open_with(data, &o, &c, msg, sizeof(msg)), DG_OK, "%s: %s", data, msg);
	return c;
}

/* data is refused with st, the message naming each of want[] (NULL-ended). */
static void refused(const char *data, int vocab, dg_status st, const char *const *want)
{
	dg_corpus *c = (dg_corpus *)&msg; /* not NULL: the refusal must clear it */
	dg_corpus_opts o = { .vocab = vocab };
	cr_assert_eq(dg_corpus_open_with(data, &o, &c, msg, sizeof(msg)), st, "%s: %s", data, msg);
	for (int i = 0; want[i]; i++)
		cr_assert(strstr(msg, want[i]), "%s: '%s' lacks '%s'", data, msg, want[i]);
	cr_assert(strchr(msg, '\n') == NULL, "%s", msg);
	cr_assert_null(c);
}

/* Every row of 50 batches of both splits: consecutive tokens (each the
 * one before + 1), targets the next ones, rows inside their split's
 * tokens [lo, hi] of each split. */
static void rows_consecutive(const dg_corpus *c, int lo0, int hi0, int lo1, int hi1)
{
	enum { B = 4, T = 16 };
	int32_t idx[B * T], tgt[B * T];
	cr_assert_eq(dg_corpus_check(c, T, msg, sizeof(msg)), DG_OK, "%s", msg);
	for (int val = 0; val < 2; val++) {
		dg_rng r;
		dg_rng_seed(&r, 11 + (uint64_t)val);
		for (int k = 0; k < 50; k++) {
			dg_corpus_batch(c, val, &r, B, T, idx, tgt);
			for (int i = 0; i < B * T; i++) {
				int j = i % T;
				cr_assert_eq(tgt[i], idx[i] + 1, "row %d, %d: %d then %d", i / T, j, idx[i], tgt[i]);
				if (j)
					cr_assert_eq(idx[i], idx[i - 1] + 1);
				cr_assert(idx[i] >= (val ? lo1 : lo0) && tgt[i] <= (val ? hi1 : hi0),
					  "split %d: token %d, %d outside %d..%d", val, idx[i], tgt[i], val ? lo1 : lo0,
					  val ? hi1 : hi0);
			}
		}
	}
}

Test(data_tokens, one_shard)
{
	char *dir = dg_test_tmpdir(), path[700];
	good_shard(dir, "one.bin", 1000, 49000); /* tokens 49000..49999 */
	snprintf(path, sizeof(path), "%s/one.bin", dir);
	dg_corpus *c = open_ok(path, 0);
	cr_assert_eq(c->kind, DG_CORPUS_KIND_SHARDS);
	cr_assert_eq(c->vocab, DG_SHARD_VOCAB);
	cr_assert_eq(c->len, 1000);
	cr_assert_eq(c->train_len, 900);
	cr_assert_eq(c->n_val_files, 0);
	cr_assert_null(c->bytes);
	cr_assert_eq(c->file_bytes, 1024 + 2000);
	cr_assert_str_eq(c->split, "the last 10%");
	rows_consecutive(c, 49000, 49899, 49900, 49999);
	dg_corpus_close(c);
	dg_test_rmtree(dir);
}

Test(data_tokens, shards_as_a_glob_a_list_and_a_folder)
{
	char *dir = dg_test_tmpdir(), data[2400], d2[2400];
	/* train tokens 0..899 over three files, val 1000..1099 */
	good_shard(dir, "tiny_train_000002.bin", 300, 300);
	good_shard(dir, "tiny_train_000001.bin", 300, 0);
	good_shard(dir, "tiny_train_000003.bin", 300, 600);
	good_shard(dir, "tiny_val_000000.bin", 100, 1000);
	char hex[4][65];

	snprintf(data, sizeof(data), "%s/tiny_train_*.bin", dir); /* the val shard found beside */
	dg_corpus *c = open_ok(data, 0);
	cr_assert_eq(c->n_files, 4);
	cr_assert_eq(c->n_val_files, 1);
	cr_assert_eq(c->len, 1000);
	cr_assert_eq(c->train_len, 900);
	cr_assert(strstr(c->split, "1 *_val_* shard beside the train ones"), "%s", c->split);
	rows_consecutive(c, 0, 899, 1000, 1099); /* rows cross from file to file in name order */
	cr_assert_eq(dg_corpus_digest(c, hex[0], msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_corpus_close(c);

	/* a list, the val shard among them */
	snprintf(data, sizeof(data), "%s/tiny_train_000001.bin,%s/tiny_train_00000[23].bin,%s/tiny_val_000000.bin",
		 dir, dir, dir);
	c = open_ok(data, 0);
	cr_assert_eq(c->n_val_files, 1);
	cr_assert_eq(c->train_len, 900);
	cr_assert(strstr(c->split, "given"), "%s", c->split);
	rows_consecutive(c, 0, 899, 1000, 1099);
	cr_assert_eq(dg_corpus_digest(c, hex[1], msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_corpus_close(c);

	/* the folder */
	c = open_ok(dir, 0);
	cr_assert_eq(c->n_files, 4);
	cr_assert_eq(c->n_val_files, 1);
	cr_assert_eq(dg_corpus_digest(c, hex[2], msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_corpus_close(c);
	cr_assert_str_eq(hex[0], hex[1]);
	cr_assert_str_eq(hex[0], hex[2]);

	/* one train shard: its val shard beside it */
	snprintf(data, sizeof(data), "%s/tiny_train_000002.bin", dir);
	c = open_ok(data, 0);
	cr_assert_eq(c->n_files, 2);
	cr_assert_eq(c->train_len, 300);
	rows_consecutive(c, 300, 599, 1000, 1099);
	dg_corpus_close(c);

	/* the val shard alone: 90/10 of it, another split, another digest */
	snprintf(data, sizeof(data), "%s/tiny_val_000000.bin", dir);
	c = open_ok(data, 0);
	cr_assert_eq(c->n_val_files, 0);
	cr_assert_eq(c->train_len, 90);
	cr_assert_eq(dg_corpus_digest(c, hex[3], msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_str_neq(hex[3], hex[0]);
	dg_corpus_close(c);

	/* another val token: another digest */
	set_token(dir, "tiny_val_000000.bin", DG_SHARD_HEADER_BYTES, 99, 7);
	snprintf(d2, sizeof(d2), "%s/tiny_train_*.bin", dir);
	c = open_ok(d2, 0);
	cr_assert_eq(dg_corpus_digest(c, hex[1], msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_str_neq(hex[1], hex[0], "a changed val token kept the digest");
	dg_corpus_close(c);
	dg_test_rmtree(dir);
}

/* A folder whose name glob(3) would read as a pattern is found as itself. */
Test(data_tokens, a_folder_named_like_a_pattern)
{
	char *top = dg_test_tmpdir(), dir[700], data[800];
	snprintf(dir, sizeof(dir), "%s/a[1]*", top);
	cr_assert_eq(mkdir(dir, 0700), 0);
	good_shard(dir, "x_train_000001.bin", 200, 0);
	good_shard(dir, "x_val_000000.bin", 50, 300);
	dg_corpus *c = open_ok(dir, 0);
	cr_assert_eq(c->n_files, 2);
	cr_assert_eq(c->n_val_files, 1);
	dg_corpus_close(c);
	snprintf(data, sizeof(data), "%s/x_train_000001.bin", dir);
	c = open_ok(data, 0);
	cr_assert_eq(c->n_val_files, 1, "the val shard beside it");
	rows_consecutive(c, 0, 199, 300, 349);
	dg_corpus_close(c);
	dg_test_rmtree(top);
}

Test(data_tokens, raw_uint16_tokens)
{
	char *dir = dg_test_tmpdir(), data[700];
	raw(dir, "train.bin", 500, 100, 0); /* tokens 100..599 */
	raw(dir, "val.bin", 100, 700, 0);   /* 700..799 */
	dg_corpus *c = open_ok(dir, 1000);
	cr_assert_eq(c->kind, DG_CORPUS_KIND_TOKENS);
	cr_assert_eq(c->vocab, 1000);
	cr_assert_eq(c->len, 600);
	cr_assert_eq(c->train_len, 500);
	cr_assert_str_eq(c->split, "val.bin");
	rows_consecutive(c, 100, 599, 700, 799);
	dg_corpus_close(c);
	/* train.bin named: its val.bin beside it */
	snprintf(data, sizeof(data), "%s/train.bin", dir);
	c = open_ok(data, 1000);
	cr_assert_eq(c->n_val_files, 1);
	cr_assert_eq(c->train_len, 500);
	dg_corpus_close(c);
	/* another file: 90/10 */
	raw(dir, "tokens.u16", 1000, 0, 0);
	snprintf(data, sizeof(data), "%s/tokens.u16", dir);
	c = open_ok(data, 1000);
	cr_assert_eq(c->len, 1000);
	cr_assert_eq(c->train_len, 900);
	rows_consecutive(c, 0, 899, 900, 999);
	dg_corpus_close(c);
	/* without a vocab (or with 256) a plain file is bytes */
	c = open_ok(data, 0);
	cr_assert_eq(c->kind, DG_CORPUS_KIND_BYTES);
	cr_assert_eq(c->len, 2000);
	cr_assert_eq(c->vocab, 256);
	dg_corpus_close(c);
	c = open_ok(data, 256);
	cr_assert_eq(c->kind, DG_CORPUS_KIND_BYTES);
	dg_corpus_close(c);
	/* a folder of raw tokens says nothing of its vocabulary */
	refused(dir, 0, DG_ERR_INVALID_ARG, (const char *const[]){ "train.bin", "raw uint16 tokens", "--vocab", NULL });
	dg_test_rmtree(dir);
}

Test(data_tokens, refusals_name_the_file_and_the_offset)
{
	char *dir = dg_test_tmpdir(), data[2400];
#define AT(name) (snprintf(data, sizeof(data), "%s/%s", dir, name), data)
	/* the header counts 1000 tokens, the file holds 500 */
	shard(dir, "cut_train_000000.bin", 500, 0, DG_SHARD_MAGIC, DG_SHARD_VERSION, 1000);
	refused(AT("cut_train_000000.bin"), 0, DG_ERR_CORRUPT,
		(const char *const[]){ data, "byte offset 2024: truncated", "counts 1000 tokens", NULL });
	/* 100 bytes: a header cut short (named as llm.c names its shards) */
	raw(dir, "short_train_000000.bin", 0, 0, 0);
	FILE *f = fopen(AT("short_train_000000.bin"), "wb");
	cr_assert_not_null(f);
	const uint8_t h[12] = { 0x88, 0xd8, 0x34, 0x01, 1, 0, 0, 0, 5, 0, 0, 0 }; /* 20240520, 1, 5 */
	fwrite(h, 1, sizeof(h), f);
	for (int i = 12; i < 100; i++)
		fputc(0, f);
	fclose(f);
	refused(data, 0, DG_ERR_CORRUPT, (const char *const[]){ data, "byte offset 100: truncated", NULL });
	/* bytes past the count */
	shard(dir, "long.bin", 20, 0, DG_SHARD_MAGIC, DG_SHARD_VERSION, 10);
	refused(AT("long.bin"), 0, DG_ERR_CORRUPT,
		(const char *const[]){ data, "byte offset 1044: 20 bytes past the 10 tokens", NULL });
	/* a bad magic, a bad version */
	shard(dir, "magic_val_000000.bin", 10, 0, 20240521, DG_SHARD_VERSION, -1);
	refused(AT("magic_val_000000.bin"), 0, DG_ERR_CORRUPT,
		(const char *const[]){ data, "byte offset 0: magic 20240521, not llm.c's 20240520", NULL });
	shard(dir, "v2.bin", 10, 0, DG_SHARD_MAGIC, 2, -1);
	refused(AT("v2.bin"), 0, DG_ERR_CORRUPT, (const char *const[]){ data, "byte offset 4: version 2", NULL });
	/* a token past the vocabulary: 1024 + 2·37 */
	good_shard(dir, "tok.bin", 100, 0);
	set_token(dir, "tok.bin", DG_SHARD_HEADER_BYTES, 37, 60000);
	refused(AT("tok.bin"), 0, DG_ERR_CORRUPT,
		(const char *const[]){ data, "byte offset 1098: token 60000 is outside the vocabulary 0..50303", NULL });
	/* below 65536 it is in the vocabulary */
	dg_corpus *c = open_ok(data, 65536);
	dg_corpus_close(c);
	good_shard(dir, "ok.bin", 100, 0); /* tokens 0..99: 99 at 1024 + 2·99 */
	refused(AT("ok.bin"), 99, DG_ERR_CORRUPT,
		(const char *const[]){ data, "byte offset 1222: token 99 is outside the vocabulary 0..98", NULL });
	/* raw: token 512 at index 512 past a vocab of 512, an odd size */
	raw(dir, "r.u16", 600, 0, 0);
	refused(AT("r.u16"), 512, DG_ERR_CORRUPT, (const char *const[]){ data, "byte offset 1024: token 512", NULL });
	raw(dir, "odd.u16", 500, 0, 1);
	refused(AT("odd.u16"), 512, DG_ERR_CORRUPT,
		(const char *const[]){ data, "byte offset 1000: truncated: 1001 bytes, an odd count", NULL });
	/* in a list, the bad file is the one named */
	char bad[700];
	snprintf(bad, sizeof(bad), "%s/v2.bin", dir);
	snprintf(data, sizeof(data), "%s/ok.bin,%s", dir, bad);
	refused(data, 0, DG_ERR_CORRUPT, (const char *const[]){ bad, "byte offset 4: version 2", NULL });
	/* every file of a list is a shard */
	snprintf(data, sizeof(data), "%s/ok.bin,%s/odd.u16", dir, dir);
	refused(data, 0, DG_ERR_CORRUPT, (const char *const[]){ "odd.u16: byte offset 0: magic", NULL });
	snprintf(data, sizeof(data), "%s/nothing_*.bin", dir);
	refused(data, 0, DG_ERR_NOT_FOUND, (const char *const[]){ data, "no file matches", NULL });
	snprintf(data, sizeof(data), "%s/ok.bin,,%s/ok.bin", dir, dir);
	refused(data, 0, DG_ERR_INVALID_ARG, (const char *const[]){ "an empty item", NULL });
	refused(AT("ok.bin"), 70000, DG_ERR_INVALID_ARG, (const char *const[]){ "vocab=70000", NULL });
	refused(AT("missing.bin"), 0, DG_ERR_NOT_FOUND, (const char *const[]){ data, NULL });
#undef AT
	dg_test_rmtree(dir);
}

/* Past one piece of the scan (2^24 tokens): the first bad token in file
 * order is the one named, whichever thread met it; the digest of pieces
 * is the same for the same tokens. */
Test(data_tokens, the_scan_across_pieces, .timeout = 60)
{
	char *dir = dg_test_tmpdir(), data[1500];
	const int n = (1 << 24) + 100;
	raw(dir, "a.u16", n, 0, 0);
	raw(dir, "b.u16", 1000, 0, 0);
	snprintf(data, sizeof(data), "%s/a.u16", dir);
	dg_corpus *c = open_ok(data, 65536);
	char h1[65], h2[65];
	cr_assert_eq(dg_corpus_digest(c, h1, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_corpus_close(c);
	c = open_ok(data, 65536);
	cr_assert_eq(dg_corpus_digest(c, h2, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_str_eq(h1, h2);
	dg_corpus_close(c);
	/* tokens i % 65536: with vocab 65535, token 65535 at i = 65535 first */
	refused(data, 65535, DG_ERR_CORRUPT, (const char *const[]){ "byte offset 131070: token 65535", NULL });
	/* only past the first piece */
	for (long i = 0; i < n; i++)
		if (i % 65536 == 65535)
			set_token(dir, "a.u16", 0, i, 1);
	set_token(dir, "a.u16", 0, (1 << 24) + 3, 65535);
	refused(data, 65535, DG_ERR_CORRUPT, (const char *const[]){ "byte offset 33554438: token 65535", NULL });
	dg_test_rmtree(dir);
}

Test(data_tokens, a_byte_corpus_digest_is_its_sha256)
{
	char *dir = dg_test_tmpdir(), path[700], hex[65];
	dg_test_write_file(dir, "abc.txt", "abc");
	snprintf(path, sizeof(path), "%s/abc.txt", dir);
	dg_corpus *c = open_ok(path, 0);
	cr_assert_eq(c->kind, DG_CORPUS_KIND_BYTES);
	cr_assert_eq(dg_corpus_digest(c, hex, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	dg_corpus_close(c);
	dg_test_rmtree(dir);
}
