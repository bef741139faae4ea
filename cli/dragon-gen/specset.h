/*
 * dragon-gen — spec flags → a set of specs: the flags as options of a
 * command, their --help text, and the stderr line about what the product
 * left out. The product itself, its rules and the default build set are
 * the library's (runtime/store/specset.h). Private to cli/dragon-gen/.
 */
#ifndef DG_GEN_SPECSET_H
#define DG_GEN_SPECSET_H

#include <stdbool.h>
#include <stdio.h>

#include "cli/common/scan.h"
#include "runtime/store/specset.h"

/* Option ids of the spec flags in a command's dg__cli_opt table are
 * DG__SPEC_OPT_BASE + dg__spec_flag; DG__SPEC_OPTS expands to the entries. */
#define DG__SPEC_OPT_BASE 1000
#define DG__SF_OPT(e, flag, key, field) { flag, 0, true, DG__SPEC_OPT_BASE + DG__SF_##e },
#define DG__SPEC_OPTS DG__SPEC_FLAG_LIST(DG__SF_OPT)

/* The spec flags' part of a --help text, derived from the op table and
 * the format table (the ops, the formats each flag takes), and with
 * default_set what no spec flag means: the default build set (build's;
 * render needs one kernel and tune has a set of its own). */
void dg__specset_help(FILE *to, bool default_set);

/* Records one occurrence of spec flag `id` (an option id from
 * DG__SPEC_OPTS); false when out of memory (reported). */
bool dg__spec_flags_add(dg__spec_flags *f, int id, const char *value);

/* The one stderr line about what was left out ("left out 3 combinations
 * the ops' rules refuse; first: --out-format uint8pos: ..."); nothing when
 * nothing was. */
void dg__specset_note_dropped(const dg__specset *set);

#endif
