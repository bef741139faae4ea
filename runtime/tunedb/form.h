/*
 * The attention's form as a tuned choice (runtime/tunedb/form.c): which
 * form — quadratic, or chunked and its chunk C — BDH's attention takes at
 * each context length T, measured on a device for a shape and kept as a
 * record of the tuning DB beside the tiles' records.
 *
 * A record is a JSON document in a file named attention_form-*.json (in
 * the DB's folders, or built into the library from
 * runtime/tunedb/records/):
 *
 *   {"format": 1, "kind": "attention_form",
 *    "heads": H, "latent": N, "embd": D, "act": "bf16",
 *    "device": {"name": "NVIDIA H200", "sm": 90}, "date": ISO-8601 UTC,
 *    "forms": [{"from_t": 8192, "chunk": 256}, {"from_t": 32768, "chunk": 512}],
 *    "rows": [{"B", "T", "C", "quadratic_ms", "chunked_ms"}, ...]}
 *
 * forms: from_t strictly increasing; below the first the quadratic form,
 * from each from_t on its chunk (0: quadratic; else a multiple of 64 up to
 * 4096). rows: what was measured (bench/attention --record), forward plus
 * backward of one layer. A record of a key (device, sm, heads, latent,
 * embd, act) read from the user's DB wins over a built-in one, else the
 * newest date.
 */
#ifndef DG_RUNTIME_TUNEDB_FORM_H
#define DG_RUNTIME_TUNEDB_FORM_H

#include <stdbool.h>
#include <stddef.h>

#include "dragon/fmt.h"
#include "dragon/status.h"
#include "dragon/tune.h"

#define DG__FORM_MAX 16 /* forms a record */

typedef struct dg__attn_form {
	char device[128];
	int sm;
	int heads, latent, embd;
	dg_fmt act;
	char date[40];
	int n;
	int from_t[DG__FORM_MAX];
	int chunk[DG__FORM_MAX];
	char *path; /* where it was read (malloc'd) */
	bool builtin;
} dg__attn_form;

/* Whether a file of this name (a path's last part) holds a form record. */
bool dg__attn_form_file(const char *path);

/* Parses text (len bytes) read from name into *out. DG_ERR_PARSE with
 * msg naming the file and the field; DG_ERR_NOMEM. */
dg_status dg__attn_form_parse(const char *text, size_t len, const char *name, dg__attn_form *out, char *msg,
			      size_t msg_size);

/* One measured T of a record (bench/attention --record). */
typedef struct dg__attn_form_row {
	int b, t, chunk;      /* chunk: the chunked form's C */
	double quadratic_ms;  /* forward + backward of a layer; <= 0: not run */
	double chunked_ms;    /* <= 0: not run */
} dg__attn_form_row;

/*
 * A record's JSON text (malloc'd, NULL when out of memory) from measured
 * rows: the chunked form from the smallest T at which it was faster than
 * the quadratic one at that T and every larger T measured (a T where only
 * the chunked form ran, the quadratic one not fitting, counts as
 * faster), its chunk from each such row on; no forms when the quadratic
 * form won at the largest T.
 */
char *dg__attn_form_make(const char *device, int sm, int heads, int latent, int embd, dg_fmt act,
			 const char *date, const dg__attn_form_row *rows, int n);

/*
 * The chunk the attention takes at T by the DB's record of (device, sm,
 * heads, latent, embd, act): true and *chunk (0: the quadratic form; a
 * record's chunk that does not divide T becomes the largest multiple of
 * 64 below it that does, or 0 where none does) when there is one; false (*chunk untouched) when the DB
 * has no record of that key. *why (may be NULL): the record's path.
 */
bool dg__tune_db_attn_chunk(const dg_tune_db *db, const char *device, int sm, int heads, int latent, int embd,
			    dg_fmt act, int t, int *chunk, const char **why);

#endif /* DG_RUNTIME_TUNEDB_FORM_H */
