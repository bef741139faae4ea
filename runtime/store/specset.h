/*
 * Spec sets: lists of spec values → the checked product of specs, and the
 * default build set.
 *
 * Each spec flag (--op --heads --in-heads --embd --latent --weight --act
 * --out-format --relu --src --tile --arch) takes a comma-separated list; a
 * repeated flag adds to its list. The set is the Cartesian product of the
 * lists, per op: a flag applies to the ops that read it (the op table's
 * fields) and is ignored for the others, but a flag no op of the product
 * reads is a usage error. Fields without a flag keep the op's defaults
 * (dg_spec_init); --op defaults to every op.
 *
 * Each combination is checked as the library would: dg_spec_set, then
 * dg_spec_validate (the op table's rules), NVRTC's arch range
 * (dg_jit_check_arch), then the template's plan (dg_codegen_plan). A
 * combination an op's rules or its template refuse is left out of the
 * product and counted (so `--op lowrank_fwd,decoder_fwd --out-format
 * int8,bf16` reads naturally: decoder_fwd writes floats only); only when
 * nothing at all remains is it a usage error, naming the flag, the value
 * and the first reason. A value no op of the product accepts (a typo, a
 * format no op takes), an arch NVRTC cannot target and a flag no op reads
 * are usage errors at once. The result is normalized and deduplicated by
 * canonical text, in product order.
 *
 * With no spec flag at all the set is the default build set: for every op
 * the product of its op-table `build` lists (dg_op_info.build), at the
 * op's default shape — every kernel of a BDH training step, forward and
 * backward (dg_bundle_default_specs, dg_bundle_build without a list). It
 * obeys exactly the rules a user's flags do.
 *
 * The values come as the programs' spec flags give them (dragon-gen's
 * build, render, list, inspect and tune), and messages name them so
 * ("--latent 8190: ..."). Private to the library and its CLIs.
 */
#ifndef DG_STORE_SPECSET_H
#define DG_STORE_SPECSET_H

#include <stdbool.h>
#include <stddef.h>

#include "dragon/codegen.h"
#include "dragon/spec.h"

/* Size of the default build set: the products of the op table's build
 * lists (checked by tests/test_cli.c against `dragon-gen list`, and
 * against dg__specset_default_size). */
#define DG__SPECSET_DEFAULT_SIZE 107
/* Largest product we expand (a typo such as a 10^6-long list is refused). */
#define DG__SPECSET_MAX 65536

/* The spec flags, in the order the product is expanded (op outermost). */
#define DG__SPEC_FLAG_LIST(X)                                                 \
	X(OP, "op", "op", 0)                                                  \
	X(HEADS, "heads", "heads", DG_FIELD_HEADS)                            \
	X(IN_HEADS, "in-heads", "in_heads", DG_FIELD_IN_HEADS)                \
	X(EMBD, "embd", "embd", DG_FIELD_EMBD)                                \
	X(LATENT, "latent", "latent", DG_FIELD_LATENT)                        \
	X(VOCAB, "vocab", "vocab", DG_FIELD_VOCAB)                            \
	X(CHUNK, "chunk", "chunk", DG_FIELD_CHUNK)                            \
	X(WEIGHT, "weight", "weight", DG_FIELD_WEIGHT)                        \
	X(ACT, "act", "act", DG_FIELD_ACT)                                    \
	X(OUT, "out-format", "out", DG_FIELD_OUT)                             \
	X(RELU, "relu", "relu", DG_FIELD_RELU)                                \
	X(SRC, "src", "src", DG_FIELD_SRC)                                    \
	X(ASCALE, "ascale", "ascale", DG_FIELD_ASCALE)                        \
	X(WSCALE, "wscale", "wscale", DG_FIELD_WSCALE)                        \
	X(ROPE, "rope", "rope", DG_FIELD_ROPE)                                \
	X(EPI, "epi", "epi", DG_FIELD_EPI)                                    \
	X(TILE, "tile", "tile", DG_FIELD_TILE)                                \
	X(ARCH, "arch", "arch", DG_FIELD_ARCH)

typedef enum dg__spec_flag {
#define DG__SF_ENUM(e, flag, key, field) DG__SF_##e,
	DG__SPEC_FLAG_LIST(DG__SF_ENUM)
#undef DG__SF_ENUM
	DG__SF__COUNT
} dg__spec_flag;

/* Flag name without "--" ("in-heads"), spec key ("in_heads") and the
 * dg_field it sets (0 for op) of spec flag f. */
const char *dg__spec_flag_name(dg__spec_flag f);
const char *dg__spec_flag_key(dg__spec_flag f);
unsigned dg__spec_flag_field(dg__spec_flag f);

/* Raw flag values as given (joined with ',' when a flag repeats). */
typedef struct dg__spec_flags {
	char *val[DG__SF__COUNT]; /* malloc'd, or NULL if not given */
} dg__spec_flags;

/* Records one occurrence of spec flag f (its value joined to the earlier
 * ones with ','); false when out of memory. */
bool dg__spec_flags_put(dg__spec_flags *f, dg__spec_flag flag, const char *value);
bool dg__spec_flags_any(const dg__spec_flags *f);
void dg__spec_flags_free(dg__spec_flags *f);

typedef struct dg__specset {
	dg_spec *specs;   /* n of them, normalized, distinct */
	char **canonical; /* their canonical texts (tile as given) */
	size_t n;
	size_t combinations; /* the product's size, before anything was left out */
	size_t dropped;   /* combinations the ops' rules refuse, left out */
	char first_drop[1024]; /* "--latent 8190: latent=8190: must be ..." */
} dg__specset;

/*
 * Expands f (or the default build set when no flag is given) into *out,
 * planning each combination on cg. On failure returns the status with a
 * one-line message: DG_ERR_INVALID_SPEC naming the flag and value, e.g.
 * "--latent 8190: latent=8190: must be a multiple of 4 (...)"; a
 * template's failure (DG_ERR_TEMPLATE, with cg's message); DG_ERR_NOMEM.
 */
dg_status dg__specset_expand(dg_codegen *cg, const dg__spec_flags *f, dg__specset *out,
			     char *msg, size_t msg_size);
void dg__specset_free(dg__specset *set);

/* The line about what was left out ("left out 3 combinations the ops'
 * rules refuse; first: --out-format uint8pos: ...") into buf; false (buf
 * "") when nothing was. */
bool dg__specset_dropped_line(const dg__specset *set, char *buf, size_t size);

/* The size of the default build set before planning: the sum over ops of
 * the products of their build lists (no template is asked). */
size_t dg__specset_default_size(void);

/* The fields of spec that differ from its op's defaults, as flags:
 * "--weight ternary --relu 0" ("" for the defaults). */
void dg__spec_flags_of(const dg_spec *spec, char *buf, size_t size);

#endif /* DG_STORE_SPECSET_H */
