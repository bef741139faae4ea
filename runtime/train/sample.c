/*
 * The next token from a model's logits (dragon/sample.h): rank, then a
 * greedy pick or a seeded draw among the top k at a temperature.
 */
#include <math.h>
#include <stdlib.h>

#include "base/msg.h"
#include "dragon/sample.h"

typedef struct scored {
	float z;
	int32_t v;
} scored;

/* Larger logits first; ties by the smaller id (a total order: qsort's
 * result is the same on every libc). */
static int by_logit(const void *pa, const void *pb)
{
	const scored *a = pa, *b = pb;
	if (a->z != b->z)
		return a->z > b->z ? -1 : 1;
	return a->v < b->v ? -1 : a->v > b->v;
}

dg_status dg_sample_draw(const float *z, int v, double temperature, int top_k, dg_rng *r, int32_t *out,
			 char *msg, size_t msg_size)
{
	if (!z || !r || !out || v < 1 || !(temperature >= 0) || top_k < 0)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"dg_sample_draw: v=%d, temperature=%g, top_k=%d (v >= 1, temperature >= 0, top_k >= 0)",
				v, temperature, top_k);
	for (int i = 0; i < v; i++)
		if (!isfinite(z[i]))
			return dg__msgf(DG_ERR_NUMERIC, msg, msg_size,
					"logit %d is %g: the weights have diverged", i, (double)z[i]);
	scored *t = malloc((size_t)v * sizeof(*t));
	if (!t)
		return dg__msgf(DG_ERR_NOMEM, msg, msg_size, "out of memory (%d logits)", v);
	for (int i = 0; i < v; i++)
		t[i] = (scored){ z[i], i };
	qsort(t, (size_t)v, sizeof(*t), by_logit);
	int32_t pick = t[0].v;
	if (temperature > 0) {
		const int n = top_k > 0 && top_k < v ? top_k : v;
		double total = 0;
		for (int i = 0; i < n; i++)
			total += exp(((double)t[i].z - t[0].z) / temperature);
		double u = (double)(dg_rng_u64(r) >> 11) * 0x1p-53 * total;
		pick = t[n - 1].v;
		for (int i = 0; i < n; i++) {
			double p = exp(((double)t[i].z - t[0].z) / temperature);
			if (u < p) {
				pick = t[i].v;
				break;
			}
			u -= p;
		}
	}
	free(t);
	*out = pick;
	return DG_OK;
}
