/*
 * CPU reference of the embedding (runtime/ref/ref_ops.h): rows of a table by token,
 * and the backward that adds the output gradient's rows back in token
 * order (deterministic, as the GPU's sorted reduction is).
 */
#include <string.h>

#include "runtime/ref/ref_int.h"

dg_status dg_ref_embed_fwd(const float *table, int vocab, int d, const int32_t *idx, int64_t n,
			   float *out, int64_t *bad)
{
	for (int64_t i = 0; i < n; i++) {
		if (idx[i] < 0 || idx[i] >= vocab) {
			if (bad)
				*bad = i;
			return DG_ERR_INVALID_ARG;
		}
		memcpy(out + i * d, table + (int64_t)idx[i] * d, (size_t)d * sizeof(float));
	}
	return DG_OK;
}

void dg_ref_embed_bwd(const float *dout, int d, const int32_t *idx, int64_t n, float *dtable)
{
	for (int64_t i = 0; i < n; i++) {
		float *row = dtable + (int64_t)idx[i] * d;
		for (int k = 0; k < d; k++)
			row[k] += dout[i * d + k];
	}
}
