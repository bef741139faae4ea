/*
 * What the safetensors reader and writer share (runtime/store/).
 */
#ifndef DG_RUNTIME_STORE_SAFETENSORS_INT_H
#define DG_RUNTIME_STORE_SAFETENSORS_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/store/safetensors.h"

typedef struct dg__st_meta {
	char *key, *value;
} dg__st_meta;

/* numel · dtype size into *out; false on overflow past 2^62 bytes. */
bool dg__st_tensor_bytes(dg_st_dtype d, int ndim, const int64_t *shape, uint64_t *out);

/* The offset in header text h (n bytes) of the seal's 64 digits under
 * key: the text after the one `"key":"` of h, followed by 64 bytes and a
 * '"'. False when that text is not in h exactly once. A JSON string
 * cannot hold an unescaped '"', so the text is never inside a name or a
 * value: found once, it is the key's own pair. */
bool dg__st_seal_at(const char *h, size_t n, const char *key, size_t *at);

#endif
