/*
 * SHA-256, written from FIPS 180-4 (§4.1.2 functions, §4.2.2 constants,
 * §5.1.1 padding, §5.3.3 initial value, §6.2.2 computation).
 *
 * Used for cache keys and for the checksum of every cache entry, so it must
 * be exact on every length; the tests check the NIST vectors and incremental
 * updates split at every offset. Byte order is handled explicitly (big-endian
 * words per the standard), so the result does not depend on the host.
 * On an x86 CPU with the SHA extensions the blocks are compressed by them
 * (compress_ni, chosen by CPUID once), the same digests about ten times
 * faster: checkpoints, bundles and a token corpus's gigabytes are hashed
 * with it; the tests hold it to the portable code at every length.
 */
#include "base/sha256.h"

#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define DG_SHA_NI 1
#endif

/* §4.2.2: first 32 bits of the fractional parts of the cube roots of the
 * first 64 primes. */
static const uint32_t k[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
	0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
	0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
	0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
	0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
	0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
	0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
	0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
	0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr(uint32_t x, unsigned n)
{
	return (x >> n) | (x << (32 - n));
}

static uint32_t load_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static void store_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* §6.2.2: one 512-bit block into the running hash value. */
static void compress(uint32_t h[8], const uint8_t block[64])
{
	uint32_t w[64]; /* message schedule W_0..W_63 */

	for (int t = 0; t < 16; t++)
		w[t] = load_be32(block + 4 * t);
	for (int t = 16; t < 64; t++) {
		uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^
			      (w[t - 15] >> 3);
		uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^
			      (w[t - 2] >> 10);
		w[t] = s1 + w[t - 7] + s0 + w[t - 16];
	}

	uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
	uint32_t e = h[4], f = h[5], g = h[6], hh = h[7];
	for (int t = 0; t < 64; t++) {
		uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
		uint32_t ch = (e & f) ^ (~e & g);
		uint32_t t1 = hh + S1 + ch + k[t] + w[t];
		uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
		uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
		uint32_t t2 = S0 + maj;
		hh = g;
		g = f;
		f = e;
		e = d + t1;
		d = c;
		c = b;
		b = a;
		a = t1 + t2;
	}
	h[0] += a;
	h[1] += b;
	h[2] += c;
	h[3] += d;
	h[4] += e;
	h[5] += f;
	h[6] += g;
	h[7] += hh;
}

#ifdef DG_SHA_NI
/*
 * The same compression on x86's SHA extensions (Intel SDM: SHA256RNDS2,
 * SHA256MSG1, SHA256MSG2), n blocks at p, about ten times the portable
 * one's speed. The instructions keep the state as two vectors, (A, B, E,
 * F) and (C, D, G, H), A and C in the top lanes; a round pair takes two
 * words of W + K from the low half of a vector. W is made four words at a
 * time: W[t..t+3] = MSG2(MSG1(W[t-16..t-13], W[t-12..t-9]) + W[t-7..t-4],
 * W[t-4..t-1]), which adds σ0, W[t-16], W[t-7] and σ1.
 */
__attribute__((target("sha,sse4.1,ssse3"))) static void compress_ni(uint32_t h[8], const uint8_t *p,
								    size_t n)
{
	/* each 32-bit word's bytes reversed: the message is big-endian */
	const __m128i be = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
	__m128i abcd = _mm_loadu_si128((const __m128i *)(const void *)h);
	__m128i efgh = _mm_loadu_si128((const __m128i *)(const void *)(h + 4));
	__m128i badc = _mm_shuffle_epi32(abcd, 0xB1);             /* b a d c */
	__m128i hgfe = _mm_shuffle_epi32(efgh, 0x1B);             /* h g f e */
	__m128i abef = _mm_alignr_epi8(badc, hgfe, 8);            /* f e b a */
	__m128i cdgh = _mm_blend_epi16(hgfe, badc, 0xF0);         /* h g d c */
	for (; n > 0; n--, p += 64) {
		const __m128i abef0 = abef, cdgh0 = cdgh;
		__m128i w[4];
		for (int i = 0; i < 16; i++) {
			if (i < 4) {
				w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i)), be);
			} else {
				__m128i t = _mm_sha256msg1_epu32(w[(i - 4) & 3], w[(i - 3) & 3]);
				t = _mm_add_epi32(t, _mm_alignr_epi8(w[(i - 1) & 3], w[(i - 2) & 3], 4));
				w[i & 3] = _mm_sha256msg2_epu32(t, w[(i - 1) & 3]);
			}
			__m128i wk = _mm_add_epi32(w[i & 3], _mm_loadu_si128((const __m128i *)(const void *)(k + 4 * i)));
			cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);      /* rounds 4i, 4i+1 */
			wk = _mm_shuffle_epi32(wk, 0x0E);
			abef = _mm_sha256rnds2_epu32(abef, cdgh, wk);      /* 4i+2, 4i+3 */
		}
		abef = _mm_add_epi32(abef, abef0);
		cdgh = _mm_add_epi32(cdgh, cdgh0);
	}
	__m128i feba = _mm_shuffle_epi32(abef, 0x1B);             /* a b e f */
	__m128i ghcd = _mm_shuffle_epi32(cdgh, 0xB1);             /* g h c d */
	_mm_storeu_si128((__m128i *)(void *)h, _mm_blend_epi16(feba, ghcd, 0xF0));          /* a b c d */
	_mm_storeu_si128((__m128i *)(void *)(h + 4), _mm_alignr_epi8(ghcd, feba, 8));       /* e f g h */
}

/* Whether this CPU has the SHA extensions (and SSSE3, SSE4.1): CPUID
 * leaf 7 EBX bit 29, leaf 1 ECX bits 9 and 19. */
static bool cpu_has_sha(void)
{
	unsigned a, b, c, d;
	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 9)) || !(c & (1u << 19)))
		return false;
	return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 29));
}
#endif

/* -1 not asked yet, 0 portable, 1 the SHA extensions */
static atomic_int use_ni = -1;

bool dg__sha256_accelerated(void)
{
	int u = atomic_load_explicit(&use_ni, memory_order_relaxed);
	if (u < 0) {
#ifdef DG_SHA_NI
		u = cpu_has_sha();
#else
		u = 0;
#endif
		atomic_store_explicit(&use_ni, u, memory_order_relaxed);
	}
	return u == 1;
}

void dg__sha256_set_portable(bool portable)
{
	atomic_store_explicit(&use_ni, portable ? 0 : -1, memory_order_relaxed);
}

/* n whole blocks at p into h. */
static void blocks(uint32_t h[8], const uint8_t *p, size_t n)
{
#ifdef DG_SHA_NI
	if (dg__sha256_accelerated()) {
		compress_ni(h, p, n);
		return;
	}
#endif
	for (; n > 0; n--, p += 64)
		compress(h, p);
}

void dg__sha256_init(dg__sha256 *s)
{
	/* §5.3.3: first 32 bits of the fractional parts of the square roots
	 * of the first 8 primes. */
	static const uint32_t h0[8] = {
		0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
		0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
	};
	memcpy(s->h, h0, sizeof(h0));
	s->len = 0;
	s->nbuf = 0;
}

void dg__sha256_update(dg__sha256 *s, const void *data, size_t n)
{
	const uint8_t *p = data;

	if (n == 0)
		return; /* data may be NULL */
	s->len += n;
	if (s->nbuf > 0) {
		size_t take = 64 - s->nbuf;
		if (take > n)
			take = n;
		memcpy(s->buf + s->nbuf, p, take);
		s->nbuf += take;
		p += take;
		n -= take;
		if (s->nbuf < 64)
			return;
		blocks(s->h, s->buf, 1);
		s->nbuf = 0;
	}
	blocks(s->h, p, n / 64);
	p += n / 64 * 64;
	n %= 64;
	if (n > 0) {
		memcpy(s->buf, p, n);
		s->nbuf = n;
	}
}

void dg__sha256_final(dg__sha256 *s, uint8_t digest[32])
{
	/* §5.1.1: a 1 bit, zeros to 448 mod 512, then the length in bits as
	 * a 64-bit big-endian integer. */
	uint64_t bits = s->len * 8;

	s->buf[s->nbuf++] = 0x80;
	if (s->nbuf > 56) {
		memset(s->buf + s->nbuf, 0, 64 - s->nbuf);
		blocks(s->h, s->buf, 1);
		s->nbuf = 0;
	}
	memset(s->buf + s->nbuf, 0, 56 - s->nbuf);
	store_be32(s->buf + 56, (uint32_t)(bits >> 32));
	store_be32(s->buf + 60, (uint32_t)bits);
	blocks(s->h, s->buf, 1);

	for (int i = 0; i < 8; i++)
		store_be32(digest + 4 * i, s->h[i]);
	memset(s, 0, sizeof(*s)); /* no use after final without init */
}

void dg__sha256_digest(const void *data, size_t n, uint8_t digest[32])
{
	dg__sha256 s;

	dg__sha256_init(&s);
	dg__sha256_update(&s, data, n);
	dg__sha256_final(&s, digest);
}

void dg__sha256_hex(const uint8_t digest[32], char hex[65])
{
	static const char xd[] = "0123456789abcdef";

	for (int i = 0; i < 32; i++) {
		hex[2 * i] = xd[digest[i] >> 4];
		hex[2 * i + 1] = xd[digest[i] & 15];
	}
	hex[64] = '\0';
}
