/*
 * dragon-gen — spec flags → a set of specs.
 *
 * Each spec flag (--op --heads --in-heads --embd --latent --weight --act
 * --out-format --relu --src --tile --arch) takes a comma-separated list; a
 * repeated flag adds to its list. The set is the Cartesian product of the
 * lists, per op: a flag applies to the ops that read it and is ignored for
 * the others (but a flag no op of the product reads is a usage error).
 * Fields without a flag keep the op's default (dg_spec_init); --op defaults
 * to every op. Each combination is set with dg_spec_set and validated; the
 * first invalid one is reported (naming the flag and value) and nothing is
 * built, except combinations out=uint8pos with relu=none, which are
 * dropped (so `--out-format int8,uint8pos --relu none,0` reads naturally),
 * unless every combination would be. The result is normalized and
 * deduplicated by canonical text, in product order.
 *
 * With no spec flag at all the set is the built-in default set
 * (DG__SPECSET_DEFAULT_* below): ops lowrank_fwd, quantize_act, pack_i8x4,
 * unpack_i8x4; heads 4, embd 256, latent 8192, act int8, arch sm_90;
 * in_heads {1,4}, weight {f32,bf16,int8,ternary,sign1}, relu {none,0},
 * out {f32,bf16,int8,uint8pos} (uint8pos with relu only), src {f32,bf16}:
 * 2·5·(3+4) = 70 lowrank_fwd + 2 quantize_act + 1 pack + 1 unpack = 74.
 * Private to cli/dragon-gen/.
 */
#ifndef DG_GEN_SPECSET_H
#define DG_GEN_SPECSET_H

#include <stdbool.h>
#include <stddef.h>

#include "cli/dragon-gen/util.h"
#include "dragon/spec.h"

/* Size of the built-in default set (checked by tests/test_cli.c). */
#define DG__SPECSET_DEFAULT_SIZE 74
/* Largest product we expand (a typo such as a 10^6-long list is refused). */
#define DG__SPECSET_MAX 65536

/* The spec flags, in the order the product is expanded (op outermost). */
#define DG__SPEC_FLAG_LIST(X)                                                 \
	X(OP, "op", "op", 0)                                                  \
	X(HEADS, "heads", "heads", DG_FIELD_HEADS)                            \
	X(IN_HEADS, "in-heads", "in_heads", DG_FIELD_IN_HEADS)                \
	X(EMBD, "embd", "embd", DG_FIELD_EMBD)                                \
	X(LATENT, "latent", "latent", DG_FIELD_LATENT)                        \
	X(WEIGHT, "weight", "weight", DG_FIELD_WEIGHT)                        \
	X(ACT, "act", "act", DG_FIELD_ACT)                                    \
	X(OUT, "out-format", "out", DG_FIELD_OUT)                             \
	X(RELU, "relu", "relu", DG_FIELD_RELU)                                \
	X(SRC, "src", "src", DG_FIELD_SRC)                                    \
	X(TILE, "tile", "tile", DG_FIELD_TILE)                                \
	X(ARCH, "arch", "arch", DG_FIELD_ARCH)

typedef enum dg__spec_flag {
#define DG__SF_ENUM(e, flag, key, field) DG__SF_##e,
	DG__SPEC_FLAG_LIST(DG__SF_ENUM)
#undef DG__SF_ENUM
	DG__SF__COUNT
} dg__spec_flag;

/* Option ids of the spec flags in a command's dg__gen_opt table are
 * DG__SPEC_OPT_BASE + dg__spec_flag; DG__SPEC_OPTS expands to the entries. */
#define DG__SPEC_OPT_BASE 1000
#define DG__SF_OPT(e, flag, key, field) { flag, 0, true, DG__SPEC_OPT_BASE + DG__SF_##e },
#define DG__SPEC_OPTS DG__SPEC_FLAG_LIST(DG__SF_OPT)

/* Flag name without "--" ("in-heads"), spec key ("in_heads") and the
 * dg_field it sets (0 for op) of spec flag f. */
const char *dg__spec_flag_name(dg__spec_flag f);
const char *dg__spec_flag_key(dg__spec_flag f);
unsigned dg__spec_flag_field(dg__spec_flag f);

/* The usage lines of the spec flags, for --help texts. */
extern const char dg__specset_help[];

/* Raw flag values as given (joined with ',' when a flag repeats). */
typedef struct dg__spec_flags {
	char *val[DG__SF__COUNT]; /* malloc'd, or NULL if not given */
} dg__spec_flags;

/* Records one occurrence of spec flag `id` (an option id from
 * DG__SPEC_OPTS); false when out of memory (reported). */
bool dg__spec_flags_add(dg__spec_flags *f, int id, const char *value);
bool dg__spec_flags_any(const dg__spec_flags *f);
void dg__spec_flags_free(dg__spec_flags *f);

typedef struct dg__specset {
	dg_spec *specs;   /* n of them, normalized, distinct */
	char **canonical; /* their canonical texts (tile as given) */
	size_t n;
	size_t dropped;   /* uint8pos without relu, left out */
} dg__specset;

/*
 * Expands f (or the default set when no flag is given) into *out. On
 * failure returns DG_ERR_INVALID_SPEC with a one-line message naming the
 * flag and value, e.g. "--latent 8190: latent=8190: must be a multiple of
 * 4 (...)", or DG_ERR_NOMEM.
 */
dg_status dg__specset_expand(const dg__spec_flags *f, dg__specset *out,
			     char *msg, size_t msg_size);
void dg__specset_free(dg__specset *set);

#endif
