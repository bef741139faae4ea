/*
 * Test helpers shared by the Criterion suites: temp folders, files, and the
 * list of every valid spec combination.
 */
#ifndef DG_TESTS_HELPERS_H
#define DG_TESTS_HELPERS_H

#include <stddef.h>
#include <stdint.h>

#include "dragon/checkpoint.h"
#include "dragon/codegen.h"
#include "dragon/data.h"
#include "dragon/model.h"
#include "dragon/rng.h"
#include "dragon/spec.h"
#include "dragon/train.h"
#include "runtime/store/safetensors.h"

/* A fresh folder under $TMPDIR (or /tmp); malloc'd path, never NULL (a
 * failure fails the test). */
char *dg_test_tmpdir(void);
/* Writes dir/name with text; fails the test on error. */
void dg_test_write_file(const char *dir, const char *name, const char *text);
/* rm -rf path, then frees it. */
void dg_test_rmtree(char *path);

/* A template folder for dragon_lua: dragon.lua, helper.lua (when
 * helper_lua is not NULL) and a stub module ("return {}") for every module
 * the op table names, which codegen loads at create. dg_test_rmtree it. */
char *dg_test_template_dir(const char *dragon_lua, const char *helper_lua);

/* A fresh folder holding a byte-identical copy of the source tree's
 * templates (every .lua), created in reverse name order (the order a folder
 * lists them in is then not the sorted one on most file systems).
 * dg_test_rmtree it. */
char *dg_test_templates_copy(void);

typedef struct dg_spec_list {
	dg_spec *specs; /* malloc'd */
	size_t n;
} dg_spec_list;

/*
 * Every valid combination at heads 4, embd 256, latent 8192:
 * lowrank_fwd weight × act × relu {none, 0, 0.25} × out × in_heads {1, 4},
 * quantize_act src × act, pack_i8x4, unpack_i8x4.
 */
void dg_test_all_specs(dg_spec_list *out);

/* true when DRAGON_TEST_QUICK is set: suites cut the slowest exhaustive
 * loops to a deterministic sample (used by the sanitizer run). */
int dg_test_quick(void);

/* dg_fmt_row_bytes of each format on whole and partial words (a partial
 * one: 0), and of a negative count (0). */
void dg_test_expect_row_bytes(void);

/* The spec of text (dg_spec_parse); a failure fails the test, naming text
 * and the parser's message. */
dg_spec dg_test_spec_parse(const char *text);
/* A code generator of the built-in templates (dg_codegen_create); a
 * failure fails the test. */
dg_codegen *dg_test_codegen(void);

/* dequantize of act codes (a scale each: ascale g) into out, at threads
 * a block (0: the template's). */
dg_spec dg_test_dequantize_spec(dg_fmt act, dg_fmt out, dg_scale_gran g, int threads);

/* dg_spec_init's spec of op at H heads, embd E and latent N: the sizes
 * the suites' specs set first. */
dg_spec dg_test_spec_sized(dg_op op, int H, int E, int N);
/* n values (n even) of f32 or bf16 storage f, uniform in [-1, 1) from r,
 * both of a pair 0 where its first draw is below `zero` (whole zero pairs,
 * as a ReLU's xs give RoPE); malloc'd, asserted. */
void *dg_test_sparse_pairs(dg_rng *r, dg_fmt f, size_t n, float zero);

/* The extent of dimension d of an op's argument at spec s, the batch b,
 * time t and rows r given: the suites' own statement of the op table's
 * rule (independent of dg_op_dim_extent). */
int64_t dg_test_dim_extent(const dg_spec *s, dg_dim d, int64_t b, int64_t t, int64_t r);

/* preset's config (a failure fails the test) at these sizes (layers 0:
 * the preset's). */
dg_model_config dg_test_model(const char *preset, int layers, int embd, int heads, int neurons);
/* The tiny model the suites train and check: dg_test_model at 2 layers,
 * embd 32, 2 heads, 64 neurons. */
dg_model_config dg_test_tiny_model(const char *preset);

/* Values in parameter p of a model of config c. */
size_t dg_test_numel(const dg_model_config *c, int p);
/* Weights of dg_test_tiny_model(preset) drawn from seed, every value of
 * every parameter times scale (25: the peaked logits and sparse
 * activations of a trained model). */
dg_model_weights *dg_test_tiny_weights(const char *preset, uint64_t seed, float scale);
/* The index of the largest of z[0..n) (the first of equals). */
int dg_test_argmax(const float *z, int n);
/* A training state some steps in: weights of c from seed 5, the state
 * from seed 42 with optimizer o, and random moments (m in ±1e-3, v in
 * [0, 1e-6)) from a dg_rng of seed 9; the counters are the caller's. */
dg_train_state *dg_test_train_state(const dg_model_config *c, const dg_adamw_config *o);

/* A corpus (dg_corpus_open) of a fresh file of n bytes in the test's
 * temporary folder, byte i text[(i·stride) % strlen(text)]. */
dg_corpus *dg_test_corpus(const char *text, size_t n, size_t stride);
/* The lines of dir/log.jsonl, each cut where its timing fields start
 * (", \"tokens_per_s\"", which every line has), malloc'd; *lines (lines
 * may be NULL) their count. */
char *dg_test_log_untimed(const char *dir, int *lines);
/* The state of dir's checkpoint of step step (a failure fails the test). */
dg_train_state *dg_test_checkpoint_at(const char *dir, int64_t step);

/* dg_train_defaults for steps with the f32 tiny model (dg_test_tiny_model),
 * T 16, lr 3e-3, writing into dir. */
dg_train_opts dg_test_tiny_opts(const char *dir, int64_t steps);

/* Checkpoint states a and b of one config hold the same bytes: every
 * parameter's weights and both AdamW moments (m, v). */
void dg_test_expect_same_state(const dg_train_state *a, const dg_train_state *b);

/* The bytes of the file at path (malloc'd, a NUL past them; *n their
 * count, n may be NULL); a failure fails the test. */
void *dg_test_read_bytes(const char *path, size_t *n);
/* path := n bytes of b (written and closed); a failure fails the test. */
void dg_test_write_bytes(const char *path, const void *b, size_t n);

/* What dg_test_rewrite writes for metadata key (its value val): a value,
 * or NULL to leave the key out. */
typedef const char *(*dg_test_meta_fn)(void *u, const char *key, const char *val);

/* A writer (dg_safetensors_writer_destroy it) holding f's tensors but the
 * one named skip (NULL: none) and its metadata through edit (NULL: as it
 * is), in f's order; the caller seals and saves it. A failure fails the
 * test. */
/* A dg_test_meta_fn: step 999999999999 (far past any run's), the rest
 * as it is. */
const char *dg_test_far_step(void *u, const char *key, const char *val);
dg_safetensors_writer *dg_test_rewrite(const dg_safetensors *f, const char *skip, dg_test_meta_fn edit,
				       void *u);

/* Whether a part of a test that needs something besides the build (torch,
 * the corpus) runs: true when `here`. Otherwise it prints "skipped:
 * <what>" and returns false; but with DRAGON_REQUIRE_DEPS=1 (the test
 * command, scripts/test.sh, sets it after installing them) the test
 * fails naming what is missing and `fix`. No GPU is not such a thing. */
int dg_test_need(int here, const char *what, const char *fix);

#endif
