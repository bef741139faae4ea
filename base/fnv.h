/*
 * FNV-1a, 64 bits, of a string: the hash of the in-memory maps keyed by
 * canonical spec text (the kernel map, the tuning DB) and of record file
 * names. Not for anything that must resist collisions on purpose.
 */
#ifndef DG_FNV_H
#define DG_FNV_H

#include <stdint.h>

static inline uint64_t dg__fnv1a(const char *s)
{
	uint64_t h = 1469598103934665603ull;

	for (; *s; s++) {
		h ^= (unsigned char)*s;
		h *= 1099511628211ull;
	}
	return h;
}

#endif /* DG_FNV_H */
