/*
 * SHA-256 (FIPS 180-4): cache keys and entry checksums.
 */
#ifndef DG_RUNTIME_SHA256_H
#define DG_RUNTIME_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dg__sha256 {
	uint32_t h[8];
	uint64_t len;      /* bytes hashed so far */
	uint8_t buf[64];   /* pending partial block */
	size_t nbuf;
} dg__sha256;

void dg__sha256_init(dg__sha256 *s);
void dg__sha256_update(dg__sha256 *s, const void *data, size_t n);
void dg__sha256_final(dg__sha256 *s, uint8_t digest[32]);
/* One-shot. */
void dg__sha256_digest(const void *data, size_t n, uint8_t digest[32]);
/* Whether the blocks are compressed on the CPU's SHA extensions (x86's
 * SHA-NI, found by CPUID at the first call), about ten times faster. */
bool dg__sha256_accelerated(void);
/* Tests: true compresses on the portable code from now on; false asks
 * the CPU again. The digests are the same either way. */
void dg__sha256_set_portable(bool portable);
/* 64 lowercase hex digits + NUL into hex (65 bytes). */
void dg__sha256_hex(const uint8_t digest[32], char hex[65]);

#endif
