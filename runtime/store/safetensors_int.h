/*
 * What the safetensors reader and writer share (runtime/store/).
 */
#ifndef DG_RUNTIME_STORE_SAFETENSORS_INT_H
#define DG_RUNTIME_STORE_SAFETENSORS_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "dragon/safetensors.h"

typedef struct dg__st_meta {
	char *key, *value;
} dg__st_meta;

/* numel · dtype size into *out; false on overflow past 2^62 bytes. */
bool dg__st_tensor_bytes(dg_st_dtype d, int ndim, const int64_t *shape, uint64_t *out);

#endif
