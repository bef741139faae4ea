/*
 * dragon — the next token drawn from a model's logits: the one rule
 * `dragon sample` and the Python package's generate share, so the same
 * logits and the same seed give the same tokens through either.
 */
#ifndef DRAGON_SAMPLE_H
#define DRAGON_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "rng.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The next token from logits z (v of them): the most likely at
 * temperature 0 (the smallest id of a tie), else a draw from
 * softmax(z / temperature) over the top_k most likely (0, or top_k >= v:
 * all), taking one dg_rng_u64 of r. The tokens are ranked by logit, ties
 * by the smaller id (a total order: the same ranking on every libc); the
 * draw is u = (dg_rng_u64(r) >> 11)·2^-53 times Σ exp((z_i − z_max) /
 * temperature) over the ranked ones, and the token is the first whose
 * running sum passes u. Into *out. DG_ERR_NUMERIC naming the first logit
 * that is not finite; DG_ERR_INVALID_ARG for v < 1, a temperature below 0
 * or top_k below 0; DG_ERR_NOMEM.
 */
DG_API dg_status dg_sample_draw(const float *z, int v, double temperature, int top_k, dg_rng *r, int32_t *out,
				char *msg, size_t msg_size);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_SAMPLE_H */
