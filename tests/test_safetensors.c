/*
 * Tests of the safetensors reader and writer (runtime/store/safetensors.c):
 * a round trip of every dtype, the layout the reference writer also makes
 * (8-aligned data), files PyTorch wrote (bytes built here by hand, as
 * safetensors.torch.save_file lays them out), a refusal with the field
 * named for every way a header can lie, and seals (a file's SHA-256 in
 * its own metadata) that cover every byte but their own.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/store/safetensors.h"
#include "helpers.h"

/* A file of one header text and n data bytes (0x5a each). */
static void *file_of(const char *header, size_t data, size_t *size)
{
	size_t hn = strlen(header);
	unsigned char *b = malloc(8 + hn + data + 1);
	cr_assert(b);
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)((uint64_t)hn >> (8 * i));
	memcpy(b + 8, header, hn);
	memset(b + 8 + hn, 0x5a, data);
	*size = 8 + hn + data;
	return b;
}

/* Parses header + data and expects a refusal whose message holds want. */
static void refused(const char *header, size_t data, const char *want)
{
	char msg[1024] = "";
	size_t size;
	void *b = file_of(header, data, &size);
	dg_safetensors *f = (dg_safetensors *)1;
	dg_status st = dg_safetensors_parse(b, size, "t.safetensors", &f, msg, sizeof(msg));
	free(b);
	cr_assert_eq(st, DG_ERR_PARSE, "accepted: %s", header);
	cr_assert_null(f);
	cr_assert(strstr(msg, want), "for %s\n  got: %s\n  want: %s", header, msg, want);
	cr_assert(strncmp(msg, "t.safetensors: ", 15) == 0, "%s", msg);
}

static dg_safetensors *parsed(const char *header, size_t data)
{
	char msg[1024] = "";
	size_t size;
	void *b = file_of(header, data, &size);
	dg_safetensors *f = NULL;
	dg_status st = dg_safetensors_parse(b, size, "t.safetensors", &f, msg, sizeof(msg));
	free(b);
	cr_assert_eq(st, DG_OK, "%s: %s", header, msg);
	return f;
}

Test(safetensors, round_trip_every_dtype)
{
	char msg[512];
	dg_safetensors_writer *w;
	cr_assert_eq(dg_safetensors_writer_create(&w), DG_OK);
	unsigned char data[64];
	for (int i = 0; i < 64; i++)
		data[i] = (unsigned char)(i * 37 + 1);
	for (int d = 0; d < DG_ST__COUNT; d++) {
		char name[32];
		int64_t shape[2] = { 2, (int64_t)(8 / dg_st_dtype_size((dg_st_dtype)d)) };
		snprintf(name, sizeof(name), "t%d.%s", d, dg_st_dtype_name((dg_st_dtype)d));
		cr_assert_eq(dg_safetensors_writer_add(w, name, (dg_st_dtype)d, 2, shape, data, msg,
						       sizeof(msg)),
			     DG_OK, "%s", msg);
	}
	int64_t none[1] = { 0 };
	cr_assert_eq(dg_safetensors_writer_add(w, "empty", DG_ST_F32, 1, none, NULL, msg, sizeof(msg)),
		     DG_OK, "%s", msg);
	cr_assert_eq(dg_safetensors_writer_add(w, "scalar", DG_ST_F32, 0, NULL, data, msg, sizeof(msg)),
		     DG_OK, "%s", msg);
	cr_assert_eq(dg_safetensors_writer_meta(w, "step", "12", msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_safetensors_writer_meta(w, "step", "13", msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_safetensors_writer_meta(w, "config", "{\"layers\": 6}", msg, sizeof(msg)), DG_OK);
	void *bytes;
	size_t size;
	cr_assert_eq(dg_safetensors_writer_bytes(w, &bytes, &size, msg, sizeof(msg)), DG_OK);
	uint64_t hn = 0;
	for (int i = 7; i >= 0; i--)
		hn = (hn << 8) | ((unsigned char *)bytes)[i];
	cr_assert_eq(hn % 8, 0, "the data starts 8-aligned");
	dg_safetensors *f;
	cr_assert_eq(dg_safetensors_parse(bytes, size, NULL, &f, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_safetensors_count(f), DG_ST__COUNT + 2);
	for (int d = 0; d < DG_ST__COUNT; d++) {
		const dg_st_tensor *t = dg_safetensors_at(f, (size_t)d);
		cr_assert_eq(t->dtype, (dg_st_dtype)d);
		cr_assert_eq(t->ndim, 2);
		cr_assert_eq(t->bytes, 16);
		cr_assert_eq(memcmp(t->data, data, 16), 0, "%s", t->name);
	}
	cr_assert_eq(dg_safetensors_find(f, "empty")->bytes, 0);
	cr_assert_eq(dg_safetensors_find(f, "scalar")->ndim, 0);
	cr_assert_eq(dg_safetensors_find(f, "scalar")->bytes, 4);
	cr_assert_str_eq(dg_safetensors_meta(f, "step"), "13");
	cr_assert_str_eq(dg_safetensors_meta(f, "config"), "{\"layers\": 6}");
	cr_assert_null(dg_safetensors_meta(f, "nope"));
	cr_assert_null(dg_safetensors_find(f, "nope"));

	/* what reads writes back to the same bytes */
	dg_safetensors_writer *w2;
	cr_assert_eq(dg_safetensors_writer_create(&w2), DG_OK);
	const char *k, *v;
	for (size_t i = 0; dg_safetensors_meta_at(f, i, &k, &v); i++)
		cr_assert_eq(dg_safetensors_writer_meta(w2, k, v, msg, sizeof(msg)), DG_OK);
	for (size_t i = 0; i < dg_safetensors_count(f); i++) {
		const dg_st_tensor *t = dg_safetensors_at(f, i);
		cr_assert_eq(dg_safetensors_writer_add(w2, t->name, t->dtype, t->ndim, t->shape, t->data,
						       msg, sizeof(msg)),
			     DG_OK);
	}
	void *bytes2;
	size_t size2;
	cr_assert_eq(dg_safetensors_writer_bytes(w2, &bytes2, &size2, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(size2, size);
	cr_assert_eq(memcmp(bytes, bytes2, size), 0);
	free(bytes);
	free(bytes2);
	dg_safetensors_destroy(f);
	dg_safetensors_writer_destroy(w);
	dg_safetensors_writer_destroy(w2);
}

Test(safetensors, reads_what_pytorch_writes)
{
	/* save_file's layout: sorted by dtype size then name, spaces to 8 bytes */
	const char *h = "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],"
			"\"data_offsets\":[0,16]},\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]}}  ";
	dg_safetensors *f = parsed(h, 22);
	const dg_st_tensor *t;
	char msg[512];
	int64_t s22[2] = { 2, 2 }, s3[1] = { 3 };
	cr_assert_eq(dg_safetensors_expect(f, "a", DG_ST_F32, 2, s22, &t, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_safetensors_expect(f, "b", DG_ST_BF16, 1, s3, &t, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(t->bytes, 6);
	cr_assert_eq(dg_safetensors_expect(f, "b", DG_ST_F32, 1, s3, &t, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_str_eq(msg, "b: expected F32 [3], got BF16 [3]");
	cr_assert_eq(dg_safetensors_expect(f, "a", DG_ST_F32, 2, (int64_t[]){ 2, 3 }, &t, msg, sizeof(msg)),
		     DG_ERR_INVALID_ARG);
	cr_assert_str_eq(msg, "a: expected F32 [2, 3], got F32 [2, 2]");
	cr_assert_eq(dg_safetensors_expect(f, "encoder", DG_ST_F32, 1, s3, &t, msg, sizeof(msg)),
		     DG_ERR_NOT_FOUND);
	cr_assert(strstr(msg, "encoder: missing") && strstr(msg, "holds a, b"), "%s", msg);
	cr_assert_str_eq(dg_safetensors_meta(f, "format"), "pt");
	dg_safetensors_destroy(f);
}

Test(safetensors, refuses_what_a_header_can_lie_about)
{
	refused("[1]", 0, "must start with '{'");
	refused("{\"a\":", 0, "invalid JSON");
	refused("{}x", 0, "text after the JSON object");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 2, "truncated");
	refused("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "a.dtype: expected one of");
	refused("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "a.dtype: missing");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "a.shape[0]: expected a non-negative integer");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "a.shape[0]");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "at most 8");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "a.data_offsets: [0, 4] is 4 bytes; F32 of that shape takes 8");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "begin <= end");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "a.data_offsets");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, "a.x: unknown field");
	refused("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "a.dtype: given twice");
	/* a duplicated key pointing one name at another's bytes */
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		"\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "a: given twice");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		"\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "an overlap");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "a hole");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "cover 4 bytes of data, the file holds 8");
	refused("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "name is empty");
	refused("{\"__metadata__\":{\"a\":1}}", 0, "__metadata__.a: expected a string");
	refused("{\"__metadata__\":[]}", 0, "__metadata__: expected an object");
	refused("{\"a\u00e9\xff\":1}", 0, "invalid UTF-8");
	refused("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\\u0000");
	/* a shape whose size overflows */
	refused("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, "overflows");

	/* the length field itself */
	char msg[256];
	dg_safetensors *f;
	unsigned char tiny[4] = { 0 };
	cr_assert_eq(dg_safetensors_parse(tiny, 4, "t", &f, msg, sizeof(msg)), DG_ERR_PARSE);
	cr_assert(strstr(msg, "8-byte header length"), "%s", msg);
	unsigned char huge[16] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}' };
	cr_assert_eq(dg_safetensors_parse(huge, 16, "t", &f, msg, sizeof(msg)), DG_ERR_PARSE);
	cr_assert(strstr(msg, "at most"), "%s", msg);
}

Test(safetensors, writer_refuses_bad_tensors)
{
	char msg[256];
	dg_safetensors_writer *w;
	float x = 1;
	cr_assert_eq(dg_safetensors_writer_create(&w), DG_OK);
	cr_assert_eq(dg_safetensors_writer_add(w, "a", DG_ST_F32, 0, NULL, &x, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_safetensors_writer_add(w, "a", DG_ST_F32, 0, NULL, &x, msg, sizeof(msg)),
		     DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "added twice"), "%s", msg);
	cr_assert_eq(dg_safetensors_writer_add(w, "__metadata__", DG_ST_F32, 0, NULL, &x, msg, sizeof(msg)),
		     DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_safetensors_writer_add(w, "n", DG_ST_F32, 1, (int64_t[]){ -2 }, &x, msg, sizeof(msg)),
		     DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "negative"), "%s", msg);
	cr_assert_eq(dg_safetensors_writer_add(w, "d", DG_ST_F32, 1, (int64_t[]){ 2 }, NULL, msg, sizeof(msg)),
		     DG_ERR_INVALID_ARG);
	dg_safetensors_writer_destroy(w);
}

Test(safetensors, save_is_atomic_and_keeps_the_old_file_on_failure)
{
	char msg[512], path[4096];
	char *dir = dg_test_tmpdir();
	dg_safetensors_writer *w;
	float x[2] = { 1, 2 };
	cr_assert_eq(dg_safetensors_writer_create(&w), DG_OK);
	cr_assert_eq(dg_safetensors_writer_add(w, "x", DG_ST_F32, 1, (int64_t[]){ 2 }, x, msg, sizeof(msg)), DG_OK);
	snprintf(path, sizeof(path), "%s/m.safetensors", dir);
	cr_assert_eq(dg_safetensors_writer_save(w, path, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_safetensors *f;
	cr_assert_eq(dg_safetensors_load(path, &f, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(((const float *)dg_safetensors_find(f, "x")->data)[1], 2.0f);
	dg_safetensors_destroy(f);
	/* a save that cannot publish (the target is a folder) leaves no temp
	 * file behind and the folder's file as it was */
	char sub[4096];
	snprintf(sub, sizeof(sub), "%s/sub", dir);
	cr_assert_eq(mkdir(sub, 0755), 0);
	cr_assert_eq(dg_safetensors_writer_save(w, sub, msg, sizeof(msg)), DG_ERR_IO);
	cr_assert(strstr(msg, "rename"), "%s", msg);
	char cmd[8300];
	snprintf(cmd, sizeof(cmd), "test $(ls '%s' | wc -l) -eq 2", dir);
	cr_assert_eq(system(cmd), 0, "a temp file was left in %s", dir);
	cr_assert_eq(dg_safetensors_load(path, &f, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_safetensors_destroy(f);
	cr_assert_eq(dg_safetensors_load("/nonexistent/x.safetensors", &f, msg, sizeof(msg)),
		     DG_ERR_NOT_FOUND);
	dg_safetensors_writer_destroy(w);
	dg_test_rmtree(dir);
}

/* A sealed file: its seal is the SHA-256 of the file with the 64 digits
 * written as '0' (checked here by hand), it still reads as plain
 * safetensors, and every one of its bytes, the seal's own aside, is
 * covered; a seal written otherwise than the writer writes it (an escaped
 * key, not 64 hex digits) is refused, a file without one is NOT_FOUND. */
Test(safetensors, a_seal_covers_every_byte)
{
	char msg[512];
	dg_safetensors_writer *w;
	cr_assert_eq(dg_safetensors_writer_create(&w), DG_OK);
	const float x[3] = { 1.0f, -2.0f, 0.5f };
	const int64_t sh[1] = { 3 };
	cr_assert_eq(dg_safetensors_writer_add(w, "x", DG_ST_F32, 1, sh, x, msg, sizeof(msg)), DG_OK);
	/* a tensor named as the key: its text is "seal":{, not "seal":" */
	cr_assert_eq(dg_safetensors_writer_add(w, "seal", DG_ST_F32, 1, sh, x, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_safetensors_writer_meta(w, "step", "30", msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_safetensors_writer_meta(w, "seal", "given, replaced", msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_safetensors_writer_seal(w, "bad key", msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_safetensors_writer_seal(w, "seal", msg, sizeof(msg)), DG_OK, "%s", msg);
	void *bytes;
	size_t n;
	cr_assert_eq(dg_safetensors_writer_bytes(w, &bytes, &n, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_safetensors_writer_destroy(w);
	unsigned char *b = bytes;
	dg_safetensors *f;
	cr_assert_eq(dg_safetensors_parse(b, n, "s", &f, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_safetensors_seal_check(f, "seal", msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_safetensors_seal_check(f, "step2", msg, sizeof(msg)), DG_ERR_NOT_FOUND);
	const char *seal = dg_safetensors_meta(f, "seal");
	cr_assert(seal && strlen(seal) == 64, "%s", seal ? seal : "(none)");
	char *at = strstr((char *)b + 8, "\"seal\":\"");
	cr_assert(at && memcmp(at + 8, seal, 64) == 0);
	/* the seal by hand: sha256sum of the file with the digits zeroed */
	if (system("command -v sha256sum >/dev/null 2>&1") == 0) {
		char *dir = dg_test_tmpdir(), path[512], cmd[700], got[65] = "";
		snprintf(path, sizeof(path), "%s/zeroed", dir);
		unsigned char *z = malloc(n);
		memcpy(z, b, n);
		memset(z + (at + 8 - (char *)b), '0', 64);
		FILE *fp = fopen(path, "wb");
		cr_assert_eq(fwrite(z, 1, n, fp), n);
		fclose(fp);
		free(z);
		snprintf(cmd, sizeof(cmd), "sha256sum '%s'", path);
		FILE *pp = popen(cmd, "r");
		cr_assert_eq(fscanf(pp, "%64s", got), 1);
		pclose(pp);
		cr_assert_str_eq(got, seal);
		dg_test_rmtree(dir);
	}
	dg_safetensors_destroy(f);
	/* every bit of every byte but the seal's own: refused when it parses */
	size_t seal_at = (size_t)(at + 8 - (char *)b);
	for (size_t i = 0; i < n; i++) {
		if (i >= seal_at && i < seal_at + 64)
			continue;
		for (int bit = 0; bit < 8; bit++) {
			b[i] ^= (unsigned char)(1u << bit);
			if (dg_safetensors_parse(b, n, "s", &f, msg, sizeof(msg)) == DG_OK) {
				dg_status st = dg_safetensors_seal_check(f, "seal", msg, sizeof(msg));
				cr_assert(st == DG_ERR_CORRUPT || st == DG_ERR_NOT_FOUND, "byte %zu bit %d: %d", i, bit, st);
				if (st == DG_ERR_CORRUPT)
					cr_assert(msg[0], "no message");
				dg_safetensors_destroy(f);
			}
			b[i] ^= (unsigned char)(1u << bit);
		}
	}
	free(b);

	/* written otherwise: an escaped key, a value that is not hex */
	static const char *const others[2] = {
		"{\"__metadata__\":{\"se\\u0061l\":\"0000000000000000000000000000000000000000000000000000000000000000\"},"
		"\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
		"{\"__metadata__\":{\"seal\":\"XYZ\"},\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
	};
	static const char *const want[2] = { "not written as a sealed file writes it", "is not a SHA-256" };
	for (int k = 0; k < 2; k++) {
		size_t size;
		void *fb = file_of(others[k], 1, &size);
		cr_assert_eq(dg_safetensors_parse(fb, size, "o", &f, msg, sizeof(msg)), DG_OK, "%s", msg);
		cr_assert_eq(dg_safetensors_seal_check(f, "seal", msg, sizeof(msg)), DG_ERR_CORRUPT);
		cr_assert(strstr(msg, want[k]), "%s", msg);
		dg_safetensors_destroy(f);
		free(fb);
	}
}

/* Without a seal, every metadata pair is written, an empty key too (the
 * seal's key is empty then: it must not drop the pair named so). */
Test(safetensors, no_seal_keeps_every_pair)
{
	char msg[256];
	dg_safetensors_writer *w;
	cr_assert_eq(dg_safetensors_writer_create(&w), DG_OK);
	cr_assert_eq(dg_safetensors_writer_meta(w, "", "v", msg, sizeof(msg)), DG_OK);
	void *bytes;
	size_t n;
	cr_assert_eq(dg_safetensors_writer_bytes(w, &bytes, &n, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_safetensors_writer_destroy(w);
	dg_safetensors *f;
	cr_assert_eq(dg_safetensors_parse(bytes, n, "e", &f, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_safetensors_meta_count(f), 1u);
	cr_assert_str_eq(dg_safetensors_meta(f, ""), "v");
	dg_safetensors_destroy(f);
	free(bytes);
}
