/*
 * The random stream of test and benchmark data (dragon/rng.h).
 */
#include <string.h>

#include "dragon/rng.h"

void dg_rng_seed(dg_rng *r, uint64_t seed)
{
	r->state = seed;
}

uint64_t dg_rng_u64(dg_rng *r)
{
	uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

float dg_rng_uniform(dg_rng *r, float lo, float hi)
{
	double u = (double)(dg_rng_u64(r) >> 11) / 9007199254740992.0; /* [0, 1) */
	return (float)(lo + (hi - lo) * u);
}

int dg_rng_int(dg_rng *r, int lo, int hi)
{
	uint64_t span = (uint64_t)((int64_t)hi - lo + 1);
	return (int)((int64_t)lo + (int64_t)(dg_rng_u64(r) % span));
}

void dg_rng_fill(dg_rng *r, dg_fmt f, void *p, size_t n)
{
	uint8_t *b = p;

	switch (f) {
	case DG_FMT_F32:
		for (size_t i = 0; i < n; i++)
			((float *)p)[i] = dg_rng_uniform(r, -1.0f, 1.0f);
		return;
	case DG_FMT_BF16:
		for (size_t i = 0; i < n; i++)
			((uint16_t *)p)[i] = dg_f32_to_bf16(dg_rng_uniform(r, -1.0f, 1.0f));
		return;
	case DG_FMT_TERNARY:
		memset(p, 0, n / 4);
		for (size_t i = 0; i < n; i++) {
			uint64_t c = dg_rng_u64(r) % 3; /* 0, +1 (01), -1 (11) */
			((uint32_t *)p)[i / 16] |= (uint32_t)(c == 0 ? 0 : c == 1 ? 1 : 3)
						   << (2 * (i % 16));
		}
		return;
	case DG_FMT_SIGN1:
		for (size_t i = 0; i < n / 32; i++)
			((uint32_t *)p)[i] = (uint32_t)dg_rng_u64(r);
		return;
	case DG_FMT_INT4:
		for (size_t i = 0; i < n; i++)
			b[i] = (uint8_t)(int8_t)dg_rng_int(r, -7, 7);
		return;
	case DG_FMT_UINT8POS:
		for (size_t i = 0; i < n; i++)
			b[i] = (uint8_t)dg_rng_int(r, 0, 255);
		return;
	case DG_FMT_I32: /* token ids of the byte vocabulary (the default vocab) */
		for (size_t i = 0; i < n; i++)
			((int32_t *)p)[i] = dg_rng_int(r, 0, 255);
		return;
	default:
		for (size_t i = 0; i < n; i++)
			b[i] = (uint8_t)(int8_t)dg_rng_int(r, -127, 127);
		return;
	}
}

/* ---- Philox4x32-10 ---------------------------------------------------------- */

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void dg_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
	uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
	uint32_t k0 = key[0], k1 = key[1];

	for (int r = 0; r < 10; r++) {
		uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
		uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
		uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
		c0 = hi1 ^ c1 ^ k0;
		c1 = lo1;
		c2 = hi0 ^ c3 ^ k1;
		c3 = lo0;
		k0 += PHILOX_W0;
		k1 += PHILOX_W1;
	}
	out[0] = c0;
	out[1] = c1;
	out[2] = c2;
	out[3] = c3;
}

uint32_t dg_dropout_threshold(float p)
{
	if (!(p > 0.0f))
		return 0;
	if (!(p < 1.0f))
		return 65536u;
	return (uint32_t)((double)p * 65536.0);
}

bool dg_dropout_keep(uint64_t seed, uint32_t step, uint32_t layer, uint64_t i, float p)
{
	uint32_t t = dg_dropout_threshold(p);
	if (t == 0)
		return true;
	uint64_t q = i >> 3;
	const uint32_t ctr[4] = { (uint32_t)q, (uint32_t)(q >> 32), step, layer };
	const uint32_t key[2] = { (uint32_t)seed, (uint32_t)(seed >> 32) };
	uint32_t out[4];
	dg_philox4x32(ctr, key, out);
	return ((out[(i >> 1) & 3] >> (16 * (i & 1))) & 0xffffu) >= t;
}
