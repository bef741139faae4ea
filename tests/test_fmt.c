/*
 * The format table (dragon/fmt.h, base/fmt.c) and the templates' own table
 * (templates/formats.lua M.formats), which describes the same storage for
 * the generated code: read from the source tree and held equal field by
 * field (epw is the codes a word of a code format, 32 / bits of every
 * format; code, qmax, unsigned). Then the sizes and the bf16 conversion
 * every part of dragon uses.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/fmt.h"
#include "dragon/ref.h"
#include "helpers.h"
#include "runtime/ref/ref_ops.h"

/* One row of M.formats as the Lua text writes it. */
typedef struct lua_fmt {
	char name[32];
	int epw, qmax, size; /* -1: not given */
	int code, is_unsigned; /* -1: not given, else 0 / 1 */
} lua_fmt;

static char *read_text(const char *path)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "cannot read %s", path);
	cr_assert_eq(fseek(f, 0, SEEK_END), 0);
	long n = ftell(f);
	cr_assert_gt(n, 0);
	rewind(f);
	char *s = malloc((size_t)n + 1);
	cr_assert_not_null(s);
	cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
	s[n] = '\0';
	fclose(f);
	return s;
}

static const char *skip_space(const char *p)
{
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	return p;
}

/* Reads "key = value" pairs of one row body (up to its '}'). */
static void parse_row(const char *body, const char *end, lua_fmt *f)
{
	f->epw = f->qmax = f->size = f->code = f->is_unsigned = -1;
	const char *p = body;
	while (p < end) {
		p = skip_space(p);
		if (p >= end)
			break;
		char key[32] = "", val[64] = "";
		int k = 0, v = 0;
		while (p < end && (*p == '_' || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9')) &&
		       k < 31)
			key[k++] = *p++;
		p = skip_space(p);
		cr_assert(p < end && *p == '=', "M.formats.%s: expected key = value near '%.20s'", f->name, p);
		p = skip_space(p + 1);
		if (*p == '"') {
			p++;
			while (p < end && *p != '"' && v < 63)
				val[v++] = *p++;
			p++;
		} else {
			while (p < end && *p != ',' && *p != ' ' && *p != '\n' && v < 63)
				val[v++] = *p++;
		}
		p = skip_space(p);
		if (p < end && *p == ',')
			p++;
		if (strcmp(key, "epw") == 0)
			f->epw = atoi(val);
		else if (strcmp(key, "qmax") == 0)
			f->qmax = atoi(val);
		else if (strcmp(key, "size") == 0)
			f->size = atoi(val);
		else if (strcmp(key, "code") == 0)
			f->code = strcmp(val, "true") == 0;
		else if (strcmp(key, "unsigned") == 0)
			f->is_unsigned = strcmp(val, "true") == 0;
		else
			cr_assert(strcmp(key, "ctype") == 0, "M.formats.%s: unknown key %s", f->name, key);
	}
}

/* Every row of M.formats in templates/formats.lua. */
static int lua_formats(lua_fmt *out, int max)
{
	char path[1024];
	snprintf(path, sizeof(path), "%s/templates/formats.lua", DG_SOURCE_DIR);
	char *text = read_text(path);
	const char *p = strstr(text, "\nM.formats = {");
	cr_assert_not_null(p, "%s has no M.formats table", path);
	p = strchr(p, '{') + 1;
	int n = 0;
	for (;;) {
		p = skip_space(p);
		while (p[0] == '-' && p[1] == '-') { /* a comment line */
			p = strchr(p, '\n');
			cr_assert_not_null(p);
			p = skip_space(p);
		}
		if (*p == '}')
			break;
		cr_assert_lt(n, max, "more rows than formats");
		lua_fmt *f = &out[n++];
		int k = 0;
		memset(f, 0, sizeof(*f));
		while ((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_')
			f->name[k++] = *p++;
		p = skip_space(p);
		cr_assert(*p == '=', "M.formats: expected '=' after %s", f->name);
		p = skip_space(p + 1);
		cr_assert(*p == '{', "M.formats.%s: expected a table", f->name);
		const char *end = strchr(p, '}');
		cr_assert_not_null(end);
		parse_row(p + 1, end, f);
		p = skip_space(end + 1);
		if (*p == ',')
			p++;
	}
	free(text);
	return n;
}

Test(fmt, c_and_lua_tables_agree)
{
	lua_fmt lua[16];
	int n = lua_formats(lua, 16);
	cr_assert_eq(n, DG_FMT__COUNT, "M.formats has %d rows, dragon/fmt.h %d formats", n, DG_FMT__COUNT);
	for (int i = 0; i < DG_FMT__COUNT; i++) {
		const dg_fmt_info *c = dg_fmt_info_of((dg_fmt)i);
		const lua_fmt *l = NULL;
		for (int j = 0; j < n; j++)
			if (strcmp(lua[j].name, c->name) == 0)
				l = &lua[j];
		cr_assert_not_null(l, "M.formats has no %s", c->name);
		cr_assert_eq(l->code, c->code, "%s: code", c->name);
		cr_assert_eq(l->epw, 32 / c->bits, "%s: epw %d, 32 / bits %d", c->name, l->epw, 32 / c->bits);
		if (c->code) {
			cr_assert_eq(l->epw, c->per_word, "%s: epw %d, per_word %d", c->name, l->epw, c->per_word);
			cr_assert_eq(l->qmax, c->qmax, "%s: qmax %d and %d", c->name, l->qmax, c->qmax);
		} else {
			cr_assert_eq(c->per_word, 1, "%s", c->name);
			cr_assert_eq(c->qmax, 0, "%s", c->name);
			cr_assert_eq(l->qmax, -1, "%s: a float with a qmax", c->name);
			cr_assert_eq(l->size * 8, c->bits, "%s: size %d, bits %d", c->name, l->size, c->bits);
		}
		cr_assert_eq(l->is_unsigned == 1, c->is_unsigned, "%s: unsigned", c->name);
	}
}

Test(fmt, table_and_predicates)
{
	cr_assert_null(dg_fmt_info_of(DG_FMT__COUNT));
	cr_assert_str_eq(dg_fmt_name(DG_FMT__COUNT), "?");
	cr_assert_not(dg_fmt_is_code(DG_FMT__COUNT));
	cr_assert_eq(dg_fmt_per_word(DG_FMT__COUNT), 0);
	for (int i = 0; i < DG_FMT__COUNT; i++) {
		const dg_fmt_info *f = dg_fmt_info_of((dg_fmt)i);
		cr_assert_str_eq(f->name, dg_fmt_name((dg_fmt)i));
		cr_assert_eq(f->code, dg_fmt_is_code((dg_fmt)i));
		cr_assert_eq(f->per_word, dg_fmt_per_word((dg_fmt)i));
		cr_assert_eq(f->qmax, dg_ref_qmax((dg_fmt)i), "%s: the references' qmax", f->name);
		/* a word of codes is 32 bits, a float element its bits */
		cr_assert_eq(f->code ? f->per_word * f->bits : f->bits % 16, f->code ? 32 : 0, "%s", f->name);
	}
	char buf[96];
	cr_assert_str_eq(dg_fmt_list(DG_FMT_BIT(DG_FMT_F32) | DG_FMT_BIT(DG_FMT_SIGN1), buf, sizeof(buf)),
			 "f32|sign1");
	cr_assert_str_eq(dg_fmt_list(0, buf, sizeof(buf)), "");
	/* cut to fit: a prefix of the whole list, terminated */
	char tiny[6];
	dg_fmt_list(DG_FMT_BIT(DG_FMT_F32) | DG_FMT_BIT(DG_FMT_TERNARY), tiny, sizeof(tiny));
	cr_assert(memchr(tiny, '\0', sizeof(tiny)) != NULL);
	cr_assert(strncmp("f32|ternary", tiny, strlen(tiny)) == 0, "%s", tiny);
}

Test(fmt, row_bytes)
{
	dg_test_expect_row_bytes();
	cr_assert_eq(dg_fmt_row_bytes(DG_FMT__COUNT, 8), 0);
	cr_assert_eq(dg_fmt_row_bytes(DG_FMT_INT8, (int64_t)1 << 40), (size_t)1 << 40);
}

/* Round half to even, NaN stays NaN (quiet, sign kept), and the references
 * convert the same way. */
Test(fmt, bf16_conversion)
{
	const struct {
		uint32_t in;
		uint16_t out;
	} cases[] = {
		{ 0x3f800000u, 0x3f80 }, /* 1.0 */
		{ 0x3f808000u, 0x3f80 }, /* a tie: to the even 0x3f80 */
		{ 0x3f818000u, 0x3f82 }, /* a tie: to the even 0x3f82 */
		{ 0x3f808001u, 0x3f81 }, /* past the tie: up */
		{ 0x7f7fffffu, 0x7f80 }, /* the largest float rounds to inf */
		{ 0x80000000u, 0x8000 }, /* -0 */
		{ 0x7f800000u, 0x7f80 }, /* inf */
		{ 0x7f800001u, 0x7fc0 }, /* NaN with a low payload: quiet, not inf */
		{ 0xffc12345u, 0xffc1 }, /* negative quiet NaN */
		{ 0x00000001u, 0x0000 }, /* the smallest subnormal: to 0 */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		float x;
		memcpy(&x, &cases[i].in, sizeof(x));
		cr_assert_eq(dg_f32_to_bf16(x), cases[i].out, "0x%08x -> 0x%04x, want 0x%04x", cases[i].in,
			     dg_f32_to_bf16(x), cases[i].out);
		cr_assert_eq(dg_ref_f32_to_bf16(x), cases[i].out, "the references' conversion, 0x%08x",
			     cases[i].in);
	}
	/* every bf16 reads back to itself */
	for (uint32_t b = 0; b < 0x10000; b++) {
		float f = dg_bf16_to_f32((uint16_t)b);
		if (isnan(f))
			continue;
		cr_assert_eq(dg_f32_to_bf16(f), b, "0x%04x", b);
		cr_assert_eq(dg_ref_bf16_to_f32((uint16_t)b), f);
	}
}
