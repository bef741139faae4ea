/*
 * CPU references of the pack family: the three storage packings of codes
 * (i8x4 words along the reduction axis, ternary 16 codes a word, sign1 32),
 * and their unpacking, on the layouts the kernels read (dragon/spec.h,
 * dragon/ref.h). Nothing here allocates; bad pointers, sizes and formats
 * give DG_ERR_INVALID_ARG and leave the outputs untouched.
 */
#include "runtime/ref/ref_ops.h"

#include <stdint.h>
#include <string.h>

#include "runtime/ref/ref_int.h"

/* --- packing ------------------------------------------------------------- */

/* a·b·c fits in size_t (all > 0). */
static int size3_ok(size_t a, size_t b, size_t c)
{
	if (b > SIZE_MAX / c)
		return 0;
	return a <= SIZE_MAX / (b * c);
}

static int32_t word_from_bytes(const uint8_t b[4])
{
	uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 |
		     (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
	int32_t w;

	memcpy(&w, &u, sizeof(w));
	return w;
}

dg_status dg_ref_pack_i8x4(const int8_t *codes, int32_t *packed, size_t rows,
			   int k, int c)
{
	size_t K, C;

	if (!codes || !packed || k <= 0 || k % 4 || c <= 0)
		return DG_ERR_INVALID_ARG;
	K = (size_t)k;
	C = (size_t)c;
	if (rows && !size3_ok(rows, K, C))
		return DG_ERR_INVALID_ARG;
	for (size_t r = 0; r < rows; r++) {
		const int8_t *src = codes + r * K * C;   /* (K, C) */
		int32_t *dst = packed + r * C * (K / 4); /* (C, K/4) */

		for (size_t j = 0; j < C; j++) {
			for (size_t k4 = 0; k4 < K / 4; k4++) {
				uint8_t b[4];

				for (size_t l = 0; l < 4; l++)
					b[l] = (uint8_t)src[(4 * k4 + l) * C + j];
				dst[j * (K / 4) + k4] = word_from_bytes(b);
			}
		}
	}
	return DG_OK;
}

dg_status dg_ref_unpack_i8x4(const int32_t *packed, int8_t *codes,
			     size_t rows, int k, int c)
{
	size_t K, C;

	if (!codes || !packed || k <= 0 || k % 4 || c <= 0)
		return DG_ERR_INVALID_ARG;
	K = (size_t)k;
	C = (size_t)c;
	if (rows && !size3_ok(rows, K, C))
		return DG_ERR_INVALID_ARG;
	for (size_t r = 0; r < rows; r++) {
		const int32_t *src = packed + r * C * (K / 4); /* (C, K/4) */
		int8_t *dst = codes + r * K * C;               /* (K, C) */

		for (size_t j = 0; j < C; j++) {
			for (size_t k4 = 0; k4 < K / 4; k4++) {
				uint32_t u;

				memcpy(&u, &src[j * (K / 4) + k4], sizeof(u));
				for (size_t l = 0; l < 4; l++) {
					uint8_t b = (uint8_t)(u >> (8 * l));
					int8_t s;

					memcpy(&s, &b, 1);
					dst[(4 * k4 + l) * C + j] = s;
				}
			}
		}
	}
	return DG_OK;
}

dg_status dg_ref_pack_ternary(const int8_t *codes, uint32_t *words,
			      size_t rows, int k)
{
	size_t n;

	if (!codes || !words || k <= 0 || k % 16)
		return DG_ERR_INVALID_ARG;
	if (rows > SIZE_MAX / (size_t)k)
		return DG_ERR_INVALID_ARG;
	n = rows * (size_t)k;
	for (size_t i = 0; i < n; i++)
		if (codes[i] < -1 || codes[i] > 1)
			return DG_ERR_INVALID_ARG;
	/* Rows of k codes are contiguous and k % 16 == 0, so packing the
	 * flat sequence is packing each row. */
	for (size_t i = 0; i < n / 16; i++) {
		uint32_t u = 0;

		for (unsigned j = 0; j < 16; j++) {
			int8_t v = codes[16 * i + j];
			uint32_t bits = v == 1 ? 1u : v == -1 ? 3u : 0u;

			u |= bits << (2 * j);
		}
		words[i] = u;
	}
	return DG_OK;
}

dg_status dg_ref_pack_sign1(const int8_t *codes, uint32_t *words, size_t rows,
			    int k)
{
	size_t n;

	if (!codes || !words || k <= 0 || k % 32)
		return DG_ERR_INVALID_ARG;
	if (rows > SIZE_MAX / (size_t)k)
		return DG_ERR_INVALID_ARG;
	n = rows * (size_t)k;
	for (size_t i = 0; i < n; i++)
		if (codes[i] != 1 && codes[i] != -1)
			return DG_ERR_INVALID_ARG;
	for (size_t i = 0; i < n / 32; i++) {
		uint32_t u = 0;

		for (unsigned j = 0; j < 32; j++)
			if (codes[32 * i + j] == 1)
				u |= 1u << j;
		words[i] = u;
	}
	return DG_OK;
}
