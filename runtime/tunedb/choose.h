/*
 * The tuner's chooser (runtime/tunedb/choose.c): the rule that names a
 * sweep's winner (autotune/sweep.c), on figures alone, no device needed.
 * Private to the library and its tests.
 */
#ifndef DG_RUNTIME_TUNEDB_CHOOSE_H
#define DG_RUNTIME_TUNEDB_CHOOSE_H

#include <stddef.h>

#include "dragon/tune.h"

/*
 * The winner among the TIMED candidates of cands (n of them): the fastest
 * median m, then among every candidate with median <= m·(1 + band) the
 * simplest: fewer threads a block (the tile's warps·32 or threads), then
 * fewer stages, then less shared memory (the recorded figure), then the
 * portable target before the arch-specific one, then the smaller tile
 * text (strcmp). Returns its index, or -1 when none was timed. band < 0
 * is taken as 0.
 */
int dg_tune_choose(const dg_tune_cand *cands, size_t n, double band);

#endif /* DG_RUNTIME_TUNEDB_CHOOSE_H */
