/*
 * Bundle manifest reader/writer and the cubin check.
 *
 * The manifest reader (format 2: template hash, device and SM, each
 * kernel's entries with their launch info) is fed one malformed document
 * per field and must answer DG_ERR_PARSE naming that field; format 1 is
 * refused with the fix (rebuild); the writer's output must read back
 * to the same model and the same text. dg_cubin_check is run on a real
 * NVRTC cubin (for its SM: ok; another SM, truncations, foreign bytes: not),
 * every truncation of which goes through an exact-size buffer so ASan sees
 * any read past the end.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/cubin.h"
#include "dragon/jit.h"
#include "dragon/manifest.h"
#include "helpers.h"

#define KEY_A "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define KEY_B "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"

/* Canonical text of op's default spec. */
static void canon_of(dg_op op, char *buf)
{
	dg_spec s;
	dg_spec_init(&s, op);
	cr_assert_eq(dg_spec_to_string(&s, buf, DG_SPEC_TEXT_MAX), DG_OK);
}

static void fill_kernel(dg_manifest_kernel *k, dg_op op, const char *key,
			const char *file, int n_entries)
{
	memset(k, 0, sizeof(*k));
	canon_of(op, k->spec);
	snprintf(k->key, sizeof(k->key), "%s", key);
	k->file = strdup(file);
	k->entries = calloc((size_t)n_entries, sizeof(char *));
	k->threads = calloc((size_t)n_entries, sizeof(int));
	k->smem = calloc((size_t)n_entries, sizeof(int));
	for (int i = 0; i < n_entries; i++) {
		char e[32];
		snprintf(e, sizeof(e), "dg_entry_%d", i);
		k->entries[i] = strdup(e);
		k->threads[i] = 32 << i;
		k->smem[i] = i * 98304;
	}
	k->n_entries = n_entries;
	k->arch = 90;
	k->compile_ms = 123.456789012345;
	k->size = 9007199254740992ull; /* 2^53: the largest exact size */
	snprintf(k->sha256, sizeof(k->sha256), "%s", KEY_B);
}

static dg_manifest *sample(void)
{
	dg_manifest *m = calloc(1, sizeof(*m));
	m->format = DG_MANIFEST_FORMAT;
	m->generator_version = strdup("0.1.0");
	snprintf(m->template_hash, sizeof(m->template_hash), "%s", KEY_B);
	m->nvrtc_version = strdup("13.0");
	m->device = strdup("NVIDIA H200");
	m->sm = 90;
	m->created = strdup("2025-01-31T12:00:00Z");
	m->n_kernels = 2;
	m->kernels = calloc(2, sizeof(*m->kernels));
	fill_kernel(&m->kernels[0], DG_OP_LOWRANK_FWD, KEY_A,
		    "lowrank_fwd-0123456789abcdef.cubin", 1);
	fill_kernel(&m->kernels[1], DG_OP_PACK_I8X4, KEY_B,
		    "pack_i8x4-fedcba9876543210.ptx", 3);
	m->kernels[1].ptx = true;
	m->kernels[1].cache_hit = true;
	m->kernels[1].arch = 120;
	m->kernels[1].size = 0;
	m->kernels[1].compile_ms = 0;
	return m;
}

Test(manifest, round_trip)
{
	dg_manifest *m = sample(), *back = NULL;
	char *json = NULL, *again = NULL, msg[256];

	cr_assert_eq(dg_manifest_to_json(m, &json, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_manifest_parse(json, strlen(json), &back, msg, sizeof(msg)),
		     DG_OK, "%s\n%s", msg, json);
	cr_assert_eq(back->format, 2);
	cr_assert_str_eq(back->generator_version, "0.1.0");
	cr_assert_str_eq(back->template_hash, KEY_B);
	cr_assert_str_eq(back->device, "NVIDIA H200");
	cr_assert_eq(back->sm, 90);
	cr_assert_str_eq(back->nvrtc_version, "13.0");
	cr_assert_str_eq(back->created, "2025-01-31T12:00:00Z");
	cr_assert_eq(back->n_kernels, 2);
	for (size_t i = 0; i < 2; i++) {
		const dg_manifest_kernel *a = &m->kernels[i], *b = &back->kernels[i];
		cr_assert_str_eq(a->spec, b->spec);
		cr_assert_str_eq(a->key, b->key);
		cr_assert_str_eq(a->file, b->file);
		cr_assert_eq(a->n_entries, b->n_entries);
		for (int e = 0; e < a->n_entries; e++) {
			cr_assert_str_eq(a->entries[e], b->entries[e]);
			cr_assert_eq(a->threads[e], b->threads[e]);
			cr_assert_eq(a->smem[e], b->smem[e]);
		}
		cr_assert_eq(a->arch, b->arch);
		cr_assert_eq(a->ptx, b->ptx);
		cr_assert_eq(a->compile_ms, b->compile_ms, "compile_ms must be exact");
		cr_assert_eq(a->cache_hit, b->cache_hit);
		cr_assert_eq(a->size, b->size);
		cr_assert_str_eq(a->sha256, b->sha256);
	}
	cr_assert_eq(dg_manifest_to_json(back, &again, msg, sizeof(msg)), DG_OK);
	cr_assert_str_eq(json, again, "writing what was read must give the same text");
	free(json);
	free(again);
	dg_manifest_destroy(back);
	/* built for no device: "" and 0 */
	free(m->device);
	m->device = strdup("");
	m->sm = 0;
	cr_assert_eq(dg_manifest_to_json(m, &json, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_manifest_parse(json, strlen(json), &back, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_str_eq(back->device, "");
	cr_assert_eq(back->sm, 0);
	free(json);
	dg_manifest_destroy(m);
	dg_manifest_destroy(back);
	dg_manifest_destroy(NULL);
}

Test(manifest, writer_refuses_what_cannot_be_read_back)
{
	dg_manifest *m = sample();
	char *json = (char *)1, msg[256];

	m->kernels[0].compile_ms = INFINITY;
	cr_assert_eq(dg_manifest_to_json(m, &json, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_null(json);
	m->kernels[0].compile_ms = 1;
	free(m->device);
	m->device = NULL;
	cr_assert_eq(dg_manifest_to_json(m, &json, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	m->device = strdup("");
	free(m->created);
	m->created = NULL;
	cr_assert_eq(dg_manifest_to_json(m, &json, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	m->created = strdup("2025-01-31T12:00:00Z");
	memset(m->template_hash, 'a', sizeof(m->template_hash)); /* no terminator */
	cr_assert_eq(dg_manifest_to_json(m, &json, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "template_hash"), "%s", msg);
	dg_manifest_destroy(m);
}

/* ---- malformed documents ------------------------------------------------- */

#define N_TOP 7 /* members of the top object before "kernels" */

/* A valid one-kernel manifest with one raw JSON value replaced (or the
 * member removed when value is NULL). field "" leaves it whole. */
static char *doc(const char *field, const char *value)
{
	char spec[DG_SPEC_TEXT_MAX], specq[DG_SPEC_TEXT_MAX + 2];
	canon_of(DG_OP_PACK_I8X4, spec);
	snprintf(specq, sizeof(specq), "\"%s\"", spec);
	struct { const char *name, *val; } f[] = {
		{ "format", "2" },
		{ "generator_version", "\"0.1.0\"" },
		{ "template_hash", "\"" KEY_B "\"" },
		{ "nvrtc_version", "\"13.0\"" },
		{ "created", "\"2025-01-31T12:00:00Z\"" },
		{ "device", "\"NVIDIA H200\"" },
		{ "sm", "90" },
		{ "spec", specq },
		{ "key", "\"" KEY_A "\"" },
		{ "file", "\"pack_i8x4-0123456789abcdef.cubin\"" },
		{ "entries", "[{\"name\": \"dg_pack_i8x4\", \"threads\": 256, \"smem\": 0}]" },
		{ "arch", "90" },
		{ "ptx", "false" },
		{ "compile_ms", "12.5" },
		{ "cache_hit", "false" },
		{ "size", "3440" },
		{ "sha256", "\"" KEY_B "\"" },
	};
	size_t nf = sizeof(f) / sizeof(f[0]);
	char *out = malloc(8192);
	size_t n = 0;
	bool first = true;
	n += (size_t)snprintf(out + n, 8192 - n, "{");
	for (size_t i = 0; i < nf; i++) {
		const char *v = strcmp(f[i].name, field) == 0 ? value : f[i].val;
		if (i == N_TOP) { /* the kernel's members start here */
			n += (size_t)snprintf(out + n, 8192 - n, "%s\"kernels\": [{",
					      first ? "" : ", ");
			first = true;
		}
		if (v) {
			n += (size_t)snprintf(out + n, 8192 - n, "%s\"%s\": %s",
					      first ? "" : ", ", f[i].name, v);
			first = false;
		}
	}
	snprintf(out + n, 8192 - n, "}]}");
	return out;
}

static void expect_parse_error(const char *json, size_t len, const char *want)
{
	dg_manifest *m = (dg_manifest *)1;
	char msg[512] = "";
	dg_status st = dg_manifest_parse(json, len, &m, msg, sizeof(msg));
	cr_expect_eq(st, DG_ERR_PARSE, "want DG_ERR_PARSE for %.300s, got %s", json,
		     dg_status_str(st));
	cr_expect_null(m);
	cr_expect(strstr(msg, want) != NULL, "message '%s' should contain '%s' (input %.300s)",
		  msg, want, json);
	if (st == DG_OK && m != (dg_manifest *)1)
		dg_manifest_destroy(m);
}

static void expect_field_error(const char *field, const char *value,
			       const char *want)
{
	char *j = doc(field, value);
	expect_parse_error(j, strlen(j), want);
	free(j);
}

Test(manifest, base_document_parses)
{
	char *j = doc("", NULL), msg[256];
	dg_manifest *m = NULL;
	cr_assert_eq(dg_manifest_parse(j, strlen(j), &m, msg, sizeof(msg)), DG_OK,
		     "%s\n%s", msg, j);
	cr_assert_eq(m->n_kernels, 1);
	cr_assert_str_eq(m->kernels[0].entries[0], "dg_pack_i8x4");
	cr_assert_eq(m->kernels[0].threads[0], 256);
	cr_assert_eq(m->kernels[0].smem[0], 0);
	cr_assert_str_eq(m->template_hash, KEY_B);
	cr_assert_str_eq(m->device, "NVIDIA H200");
	cr_assert_eq(m->sm, 90);
	cr_assert_eq(m->kernels[0].size, 3440);
	dg_manifest_destroy(m);
	free(j);
}

Test(manifest, missing_fields_are_named)
{
	const char *names[] = { "format", "generator_version", "template_hash",
				"nvrtc_version", "created", "device", "sm",
				"spec", "key", "file", "entries",
				"arch", "ptx", "compile_ms", "cache_hit", "size",
				"sha256" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char want[64];
		snprintf(want, sizeof(want), "%s%s: missing", i >= N_TOP ? "kernels[0]." : "",
			 names[i]);
		expect_field_error(names[i], NULL, want);
	}
	/* each member of an entry */
	expect_field_error("entries", "[{\"threads\": 256, \"smem\": 0}]", "kernels[0].entries[0].name: missing");
	expect_field_error("entries", "[{\"name\": \"k\", \"smem\": 0}]", "kernels[0].entries[0].threads: missing");
	expect_field_error("entries", "[{\"name\": \"k\", \"threads\": 256}]", "kernels[0].entries[0].smem: missing");
}

Test(manifest, wrong_types_are_named)
{
	expect_field_error("format", "\"1\"", "format: expected a number");
	expect_field_error("generator_version", "5", "generator_version: expected a string");
	expect_field_error("created", "null", "created: expected a string");
	expect_field_error("spec", "{}", "kernels[0].spec: expected a string");
	expect_field_error("key", "[]", "kernels[0].key: expected a string");
	expect_field_error("template_hash", "7", "template_hash: expected a string");
	expect_field_error("device", "null", "device: expected a string");
	expect_field_error("sm", "\"90\"", "sm: expected a number");
	expect_field_error("entries", "\"dg_x\"", "kernels[0].entries: expected an array of { name, threads, smem }");
	expect_field_error("entries", "[\"dg_x\"]", "kernels[0].entries[0]: expected an object { name, threads, smem }");
	expect_field_error("entries", "[7]", "kernels[0].entries[0]: expected an object");
	expect_field_error("entries", "[{\"name\": 7, \"threads\": 256, \"smem\": 0}]",
			   "kernels[0].entries[0].name: expected a string");
	expect_field_error("entries", "[{\"name\": \"k\", \"threads\": \"256\", \"smem\": 0}]",
			   "kernels[0].entries[0].threads: expected a number");
	expect_field_error("entries", "[{\"name\": \"k\", \"threads\": 256, \"smem\": false}]",
			   "kernels[0].entries[0].smem: expected a number");
	expect_field_error("arch", "\"sm_90\"", "kernels[0].arch: expected a number");
	expect_field_error("ptx", "\"no\"", "kernels[0].ptx: expected true or false");
	expect_field_error("cache_hit", "1", "kernels[0].cache_hit: expected true or false");
	expect_field_error("size", "\"3440\"", "kernels[0].size: expected a number");
	expect_parse_error("[]", 2, "manifest: expected a JSON object");
#define TOP "{\"format\":2,\"generator_version\":\"a\",\"template_hash\":\"" KEY_A "\",\"nvrtc_version\":\"b\"," \
	    "\"created\":\"c\",\"device\":\"\",\"sm\":0,"
	const char *obj = TOP "\"kernels\":{}}";
	expect_parse_error(obj, strlen(obj), "kernels: expected an array");
	const char *num3 = TOP "\"kernels\":[3]}";
	expect_parse_error(num3, strlen(num3), "kernels[0]: expected an object");
	const char *none = TOP "\"kernels\":[]}";
	dg_manifest *m = NULL;
	char msg[256];
	cr_assert_eq(dg_manifest_parse(none, strlen(none), &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(m->n_kernels, 0);
	dg_manifest_destroy(m);
#undef TOP
}

Test(manifest, bad_values_are_named)
{
	/* format 1 (entries as names, no launch info): made by an older
	 * dragon-gen, whose kernels this library would not launch the same way */
	expect_field_error("format", "1",
			   "format: version 1 is not supported (this dragon reads 2); rebuild the bundle with this dragon-gen");
	expect_field_error("format", "3", "format: version 3 is not supported");
	expect_field_error("format", "1.5", "format: expected an integer");
	expect_field_error("template_hash", "\"" KEY_A "0\"", "template_hash: expected 64 lowercase hex digits");
	expect_field_error("template_hash", "\"0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef\"",
			   "template_hash: expected 64 lowercase hex digits");
	expect_field_error("device", "\"tab\\there\"", "device: expected a string of 1 to 255 printable");
	expect_field_error("sm", "1000", "sm: expected an integer from 0 to 999");
	expect_field_error("sm", "-1", "sm: expected an integer");
	expect_field_error("sm", "90.5", "sm: expected an integer");
	expect_field_error("format", "1e400", "format: expected an integer");
	expect_field_error("key", "\"0123\"", "kernels[0].key: expected 64 lowercase hex digits");
	expect_field_error("key", "\"" "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef" "\"",
			   "kernels[0].key: expected 64 lowercase hex digits");
	expect_field_error("key", "\"" "g123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" "\"",
			   "kernels[0].key: expected 64 lowercase hex digits");
	expect_field_error("sha256", "\"" KEY_A "0\"", "kernels[0].sha256: expected 64 lowercase hex digits");
	expect_field_error("spec", "\"op=pack_i8x4\"", "kernels[0].spec: not in canonical form");
	expect_field_error("spec", "\"op=nope;\"", "kernels[0].spec: op=nope");
	expect_field_error("spec", "\"arch=sm_90;embd=256;latent=8191;op=lowrank_fwd;\"",
			   "kernels[0].spec:");
	expect_field_error("file", "\"../evil.cubin\"", "kernels[0].file: expected a plain file name");
	expect_field_error("file", "\"a/b.cubin\"", "kernels[0].file: expected a plain file name");
	expect_field_error("file", "\".hidden\"", "kernels[0].file: expected a plain file name");
	expect_field_error("file", "\"\"", "kernels[0].file: expected a plain file name");
	expect_field_error("file", "\"nul\\u0000.cubin\"", "\\u0000 at line 1");
	expect_field_error("file", "\"nul\\\\u0000.cubin\"", "kernels[0].file: expected a plain");
	expect_field_error("entries", "[]", "kernels[0].entries: expected 1 to 64 entries, got 0");
	expect_field_error("entries",
			   "[{\"name\": \"ok\", \"threads\": 32, \"smem\": 0}, {\"name\": \"1bad\", \"threads\": 32, \"smem\": 0}]",
			   "kernels[0].entries[1].name: expected a C identifier");
	expect_field_error("entries", "[{\"name\": \"k\", \"threads\": 0, \"smem\": 0}]",
			   "kernels[0].entries[0].threads: expected an integer from 1 to 1024");
	expect_field_error("entries", "[{\"name\": \"k\", \"threads\": 1025, \"smem\": 0}]",
			   "kernels[0].entries[0].threads: expected an integer from 1 to 1024");
	expect_field_error("entries", "[{\"name\": \"k\", \"threads\": 64.5, \"smem\": 0}]",
			   "kernels[0].entries[0].threads: expected an integer");
	expect_field_error("entries", "[{\"name\": \"k\", \"threads\": 64, \"smem\": -1}]",
			   "kernels[0].entries[0].smem: expected an integer");
	expect_field_error("entries", "[{\"name\": \"k\", \"threads\": 64, \"smem\": 0, \"smem\": 1}]",
			   "kernels[0].entries[0].smem: given twice");
	expect_field_error("arch", "90.5", "kernels[0].arch: expected an integer");
	expect_field_error("arch", "-1", "kernels[0].arch: expected an integer");
	expect_field_error("arch", "1e300", "kernels[0].arch: expected an integer");
	expect_field_error("size", "-1", "kernels[0].size: expected an integer");
	expect_field_error("size", "1e300", "kernels[0].size: expected an integer");
	expect_field_error("size", "18446744073709551616", "kernels[0].size: expected an integer");
	expect_field_error("compile_ms", "1e999", "kernels[0].compile_ms: expected a number");
	expect_field_error("compile_ms", "-3", "kernels[0].compile_ms: expected a number");
	expect_field_error("created", "\"tab\\there\"", "created: expected a string of 1 to 255 printable");
}

Test(manifest, duplicates_are_refused)
{
	char *j = doc("", NULL);
	/* "format" twice at the top */
	char *two = malloc(strlen(j) + 32);
	sprintf(two, "{\"format\": 2, %s", j + 1);
	expect_parse_error(two, strlen(two), "format: given twice");
	free(two);
	/* "arch" twice in a kernel */
	char *k = doc("arch", "90, \"arch\": 80");
	expect_parse_error(k, strlen(k), "kernels[0].arch: given twice");
	free(k);
	/* the same kernel listed twice: same key, then same file */
	char *obj = strstr(j, "[{") + 1;
	size_t olen = strlen(obj) - 2; /* drop "]}" */
	char *dup = malloc(strlen(j) + olen + 8);
	sprintf(dup, "%.*s%.*s, %.*s]}", (int)(obj - j), j, (int)olen, obj, (int)olen, obj);
	expect_parse_error(dup, strlen(dup), "kernels[1].key: same as kernels[0].key");
	char *p = strstr(strstr(dup, "}, {"), KEY_A);
	memcpy(p, KEY_B, 64);
	expect_parse_error(dup, strlen(dup), "kernels[1].file: same as kernels[0].file");
	free(dup);
	free(j);
}

Test(manifest, broken_text_is_refused)
{
	char *j = doc("", NULL);
	size_t n = strlen(j);
	for (size_t cut = 0; cut < n; cut += 7) {
		char *t = malloc(cut ? cut : 1); /* exact size: ASan sees overreads */
		memcpy(t, j, cut);
		expect_parse_error(t, cut, cut ? "manifest: invalid JSON" : "manifest");
		free(t);
	}
	expect_parse_error(j, n - 1, "(truncated?)");
	char *nul = strdup(j);
	nul[10] = '\0';
	expect_parse_error(nul, n, "NUL byte at offset 10");
	free(nul);
	char *tail = malloc(n + 4);
	memcpy(tail, j, n);
	memcpy(tail + n, " x", 3);
	expect_parse_error(tail, n + 2, "text after the JSON value");
	free(tail);
	size_t depth = 100000;
	char *deep = malloc(2 * depth);
	memset(deep, '[', depth);
	memset(deep + depth, ']', depth);
	expect_parse_error(deep, 2 * depth, "manifest");
	free(deep);
	free(j);
}

Test(manifest, unknown_members_are_ignored)
{
	char *j = doc("arch", "90, \"future\": {\"x\": [1, 2]}");
	dg_manifest *m = NULL;
	char msg[256];
	cr_assert_eq(dg_manifest_parse(j, strlen(j), &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_manifest_destroy(m);
	free(j);
}

Test(manifest, load_names_the_path)
{
	char *dir = dg_test_tmpdir(), msg[1024];
	dg_manifest *m = NULL;

	cr_assert_eq(dg_manifest_load(dir, &m, msg, sizeof(msg)), DG_ERR_NOT_FOUND);
	cr_assert(strstr(msg, "manifest.json") != NULL, "%s", msg);
	dg_test_write_file(dir, "manifest.json", "{\"format\": 7}");
	cr_assert_eq(dg_manifest_load(dir, &m, msg, sizeof(msg)), DG_ERR_PARSE);
	cr_assert(strstr(msg, "/manifest.json: format: version 7") != NULL, "%s", msg);
	char *j = doc("", NULL);
	dg_test_write_file(dir, "manifest.json", j);
	cr_assert_eq(dg_manifest_load(dir, &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(m->n_kernels, 1);
	dg_manifest_destroy(m);
	free(j);
	dg_test_rmtree(dir);
}

/* ---- cubins ---------------------------------------------------------------- */

/* A real cubin for sm_90 through NVRTC (no cache, no GPU needed). */
static dg_binary *real_cubin(void)
{
	dg_ctx_opts o = { .no_cache = true };
	dg_ctx *ctx = NULL;
	dg_binary *bin = NULL;
	dg_spec s;

	cr_assert_eq(dg_ctx_create(&ctx, &o), DG_OK, "%s", dg_ctx_errmsg(ctx));
	dg_spec_init(&s, DG_OP_PACK_I8X4);
	s.arch = 90;
	cr_assert_eq(dg_jit_compile(ctx, &s, &bin), DG_OK, "%s", dg_ctx_errmsg(ctx));
	dg_ctx_destroy(ctx);
	cr_assert_not(bin->is_ptx);
	cr_assert_eq(bin->arch, 90);
	return bin;
}

static dg_status check_copy(const uint8_t *img, size_t n, int arch, char *msg,
			    size_t msz)
{
	uint8_t *c = malloc(n ? n : 1);
	memcpy(c, img, n);
	dg_status st = dg_cubin_check(c, n, arch, msg, msz);
	free(c);
	return st;
}

Test(cubin, real_nvrtc_cubin)
{
	dg_binary *bin = real_cubin();
	char msg[256];

	cr_assert_eq(dg_cubin_check(bin->image, bin->image_size, 90, msg, sizeof(msg)),
		     DG_OK, "%s", msg);
	cr_assert_eq(dg_cubin_check(bin->image, bin->image_size, 80, msg, sizeof(msg)),
		     DG_ERR_UNSUPPORTED);
	cr_assert(strstr(msg, "targets sm_90") && strstr(msg, "expected sm_80"), "%s", msg);
	cr_assert_eq(dg_cubin_check(bin->image, bin->image_size, 100, NULL, 0),
		     DG_ERR_UNSUPPORTED);
	dg_binary_destroy(bin);
}

Test(cubin, truncations_fail_and_never_overread)
{
	dg_binary *bin = real_cubin();
	char msg[256];
	size_t n = bin->image_size;

	const size_t must_fail[] = { 0, 3, 4, 40, 63, 64, 100, n / 2, n - 1 };
	for (size_t i = 0; i < sizeof(must_fail) / sizeof(must_fail[0]); i++) {
		dg_status st = check_copy(bin->image, must_fail[i], 90, msg, sizeof(msg));
		cr_expect_eq(st, DG_ERR_CORRUPT, "%zu of %zu bytes: %s", must_fail[i], n,
			     dg_status_str(st));
	}
	for (size_t cut = 0; cut <= n; cut++) {
		dg_status st = check_copy(bin->image, cut, 90, msg, sizeof(msg));
		/* NVRTC ends a cubin with its program header table, so every
		 * proper prefix cuts a table or a section short. */
		cr_assert_eq(st, cut == n ? DG_OK : DG_ERR_CORRUPT,
			     "%zu-byte prefix of a %zu-byte cubin: %s", cut, n,
			     dg_status_str(st));
	}
	check_copy(bin->image, 63, 90, msg, sizeof(msg));
	cr_assert(strstr(msg, "truncated") != NULL, "%s", msg);
	dg_binary_destroy(bin);
}

Test(cubin, foreign_bytes_fail)
{
	dg_binary *bin = real_cubin();
	char msg[256];
	const char text[] = "hello, this is not an ELF file at all, but it is long enough for a header";

	cr_assert_eq(check_copy((const uint8_t *)text, sizeof(text), 90, msg, sizeof(msg)),
		     DG_ERR_CORRUPT);
	cr_assert(strstr(msg, "not an ELF") != NULL, "%s", msg);
	uint8_t *c = malloc(bin->image_size);
	memcpy(c, bin->image, bin->image_size);
	c[18] = 62; /* EM_X86_64 */
	cr_assert_eq(dg_cubin_check(c, bin->image_size, 90, msg, sizeof(msg)), DG_ERR_CORRUPT);
	cr_assert(strstr(msg, "EM_CUDA") != NULL, "%s", msg);
	memcpy(c, bin->image, bin->image_size);
	c[4] = 1; /* ELFCLASS32 */
	cr_assert_eq(dg_cubin_check(c, bin->image_size, 90, msg, sizeof(msg)), DG_ERR_CORRUPT);
	memcpy(c, bin->image, bin->image_size);
	c[5] = 2; /* big-endian */
	cr_assert_eq(dg_cubin_check(c, bin->image_size, 90, msg, sizeof(msg)), DG_ERR_CORRUPT);
	memcpy(c, bin->image, bin->image_size);
	c[40] = 0xff; c[41] = 0xff; c[42] = 0xff; /* e_shoff far past the end */
	cr_assert_eq(dg_cubin_check(c, bin->image_size, 90, msg, sizeof(msg)), DG_ERR_CORRUPT);
	memcpy(c, bin->image, bin->image_size);
	for (int i = 40; i < 48; i++)
		c[i] = 0xff; /* e_shoff near 2^64: offset + size must not wrap */
	cr_assert_eq(dg_cubin_check(c, bin->image_size, 90, msg, sizeof(msg)), DG_ERR_CORRUPT);
	cr_assert_eq(dg_cubin_check(NULL, 10, 90, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_cubin_check(bin->image, bin->image_size, 0, msg, sizeof(msg)),
		     DG_ERR_INVALID_ARG);
	free(c);
	dg_binary_destroy(bin);
}

/* CUDA <= 12 cubins (ELF ABI 7) keep the SM in the low byte of e_flags. */
Test(cubin, old_flag_layout)
{
	dg_binary *bin = real_cubin();
	uint8_t *c = malloc(bin->image_size);
	char msg[256];

	memcpy(c, bin->image, bin->image_size);
	c[7] = 0x33;
	c[8] = 7;
	const uint8_t flags90[4] = { 0x5a, 0x05, 0x5a, 0x00 }; /* 0x005a055a */
	memcpy(c + 48, flags90, 4);
	cr_assert_eq(dg_cubin_check(c, bin->image_size, 90, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_cubin_check(c, bin->image_size, 5, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	c[48] = 80;
	cr_assert_eq(dg_cubin_check(c, bin->image_size, 90, msg, sizeof(msg)),
		     DG_ERR_UNSUPPORTED);
	cr_assert(strstr(msg, "targets sm_80") != NULL, "%s", msg);
	free(c);
	dg_binary_destroy(bin);
}

Test(cubin, manifest_kernel_verify)
{
	dg_binary *bin = real_cubin();
	dg_manifest_kernel k;
	char msg[256];

	memset(&k, 0, sizeof(k));
	k.arch = 90;
	dg_manifest_kernel_hash(&k, bin->image, bin->image_size);
	cr_assert_eq(k.size, bin->image_size);
	cr_assert_eq(dg_manifest_kernel_verify(&k, bin->image, bin->image_size, msg,
					       sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_manifest_kernel_verify(&k, bin->image, bin->image_size - 1, msg,
					       sizeof(msg)), DG_ERR_CORRUPT);
	cr_assert(strstr(msg, "truncated") != NULL, "%s", msg);
	bin->image[bin->image_size / 2] ^= 1;
	cr_assert_eq(dg_manifest_kernel_verify(&k, bin->image, bin->image_size, msg,
					       sizeof(msg)), DG_ERR_CORRUPT);
	cr_assert(strstr(msg, "SHA-256") != NULL, "%s", msg);
	bin->image[bin->image_size / 2] ^= 1;
	k.arch = 80;
	cr_assert_eq(dg_manifest_kernel_verify(&k, bin->image, bin->image_size, msg,
					       sizeof(msg)), DG_ERR_UNSUPPORTED);
	dg_binary_destroy(bin);
}
