/*
 * The winner of a sweep. Timing noise of a few percent would make the
 * fastest candidate change from sweep to sweep; so every candidate within
 * a tie band of the fastest median counts as tied, and among those the
 * simplest tile wins, by a total order that does not look at the times:
 * fewer threads a block, fewer stages, less shared memory, the portable
 * target before the arch-specific one, then the tile text. Two sweeps
 * whose figures differ by less than the band pick the same tile.
 */
#include <math.h>
#include <string.h>

#include "runtime/tunedb/choose.h"

static int tile_threads(const dg_tile *t)
{
	return t->threads ? t->threads : t->wm * t->wn * 32;
}

/* < 0 when a is simpler than b. */
static int simpler(const dg_tune_cand *a, const dg_tune_cand *b)
{
	char ta[64], tb[64];
	int d;

	d = tile_threads(&a->tile) - tile_threads(&b->tile);
	if (d)
		return d;
	d = a->tile.stages - b->tile.stages;
	if (d)
		return d;
	d = (a->smem > b->smem) - (a->smem < b->smem);
	if (d)
		return d;
	d = (int)a->arch_specific - (int)b->arch_specific;
	if (d)
		return d;
	dg_tile_to_string(&a->tile, ta, sizeof(ta));
	dg_tile_to_string(&b->tile, tb, sizeof(tb));
	return strcmp(ta, tb);
}

static bool timed(const dg_tune_cand *c)
{
	return c->state == DG_TUNE_TIMED && isfinite(c->median_us) &&
	       c->median_us >= 0;
}

int dg_tune_choose(const dg_tune_cand *cands, size_t n, double band)
{
	int fastest = -1, best = -1;

	if (!cands)
		return -1;
	if (!(band > 0))
		band = 0;
	for (size_t i = 0; i < n; i++)
		if (timed(&cands[i]) &&
		    (fastest < 0 || cands[i].median_us < cands[fastest].median_us))
			fastest = (int)i;
	if (fastest < 0)
		return -1;
	double limit = cands[fastest].median_us * (1.0 + band);
	for (size_t i = 0; i < n; i++) {
		if (!timed(&cands[i]) || cands[i].median_us > limit)
			continue;
		if (best < 0 || simpler(&cands[i], &cands[best]) < 0)
			best = (int)i;
	}
	return best;
}
