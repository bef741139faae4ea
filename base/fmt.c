/*
 * The format table (dragon/fmt.h): one row a format, and everything that
 * asks what a format is or how much room it takes reads it.
 */
#include <stdio.h>
#include <string.h>

#include "dragon/fmt.h"

static const dg_fmt_info rows[DG_FMT__COUNT] = {
	[DG_FMT_F32] = { "f32", false, false, 0, 32, 1 },
	[DG_FMT_BF16] = { "bf16", false, false, 0, 16, 1 },
	[DG_FMT_INT8] = { "int8", true, false, 127, 8, 4 },
	[DG_FMT_TERNARY] = { "ternary", true, false, 1, 2, 16 },
	[DG_FMT_SIGN1] = { "sign1", true, false, 1, 1, 32 },
	[DG_FMT_INT4] = { "int4", true, false, 7, 8, 4 },
	[DG_FMT_UINT8POS] = { "uint8pos", true, true, 255, 8, 4 },
	[DG_FMT_I32] = { "i32", false, false, 0, 32, 1 },
};

const dg_fmt_info *dg_fmt_info_of(dg_fmt fmt)
{
	return (unsigned)fmt < DG_FMT__COUNT ? &rows[fmt] : NULL;
}

const char *dg_fmt_name(dg_fmt fmt)
{
	return (unsigned)fmt < DG_FMT__COUNT ? rows[fmt].name : "?";
}

bool dg_fmt_from_name(const char *name, dg_fmt *out)
{
	for (int i = 0; name && i < DG_FMT__COUNT; i++) {
		if (strcmp(name, rows[i].name) == 0) {
			*out = (dg_fmt)i;
			return true;
		}
	}
	return false;
}

bool dg_fmt_is_code(dg_fmt fmt)
{
	return (unsigned)fmt < DG_FMT__COUNT && rows[fmt].code;
}

int dg_fmt_per_word(dg_fmt fmt)
{
	return (unsigned)fmt < DG_FMT__COUNT ? rows[fmt].per_word : 0;
}

size_t dg_fmt_row_bytes(dg_fmt fmt, int64_t n)
{
	const dg_fmt_info *f = dg_fmt_info_of(fmt);

	if (!f || n < 0)
		return 0;
	if (f->code && n % f->per_word)
		return 0;
	return (size_t)n * (size_t)f->bits / 8;
}

const char *dg_fmt_list(unsigned mask, char *buf, size_t size)
{
	size_t n = 0;

	if (!size)
		return buf;
	buf[0] = '\0';
	for (int i = 0; i < DG_FMT__COUNT; i++) {
		if (!(mask & DG_FMT_BIT(i)))
			continue;
		int w = snprintf(buf + n, size - n, "%s%s", n ? "|" : "", rows[i].name);
		if (w < 0 || (size_t)w >= size - n)
			break;
		n += (size_t)w;
	}
	return buf;
}

uint16_t dg_f32_to_bf16(float x)
{
	uint32_t u;

	memcpy(&u, &x, sizeof(u));
	/* NaN: keep the sign and the top of the payload and set the quiet bit,
	 * so a payload that lives only in the low 16 bits does not become inf. */
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x0040u);
	/* Round half to even on the 16 bits that are dropped; a carry out of
	 * the mantissa correctly bumps the exponent (up to inf). */
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

float dg_bf16_to_f32(uint16_t x)
{
	uint32_t u = (uint32_t)x << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}
