/*
 * safetensors files: the tensor file format PyTorch, JAX and the Hugging
 * Face tools read (safetensors.torch.load_file), in which dragon keeps
 * model weights and checkpoints (dragon/model.h, dragon/checkpoint.h read
 * and write them). Private to the library, its tests and its benches.
 *
 *   8 bytes     N, little-endian u64: the header's length
 *   N bytes     a JSON object, '{' first, padded with spaces:
 *               { "__metadata__": { "key": "value", ... },          (optional)
 *                 "name": { "dtype": "F32", "shape": [4, 256, 8192],
 *                           "data_offsets": [begin, end] }, ... }
 *   the rest    the tensors' bytes, row-major, little-endian; offsets are
 *               relative to the byte after the header
 *
 * The reader treats a file as hostile: the header is at most 100 MiB,
 * valid UTF-8 JSON that starts with '{'; every tensor has exactly the
 * three fields, a known dtype, a shape of at most DG_SAFETENSORS_MAX_DIMS
 * non-negative extents whose product times the dtype's size is its byte
 * range (no overflow); names are unique and not empty; the ranges tile the
 * data area exactly (no hole, no overlap, nothing left over) — which also
 * defeats duplicated keys that point one name at another's bytes — and the
 * metadata maps strings to strings. Every refusal names the field:
 * "model.safetensors: encoder.shape[2]: expected a non-negative integer".
 *
 * The writer lays tensors out in the order they were added, pads the
 * header with spaces to a multiple of 8 bytes (so the data is 8-aligned,
 * as the reference writer does), and publishes the file atomically: a
 * temp file in the same folder, fsync, rename over the target, fsync of
 * the folder — a crash leaves the old file or the new one, never half.
 *
 * A sealed file carries its own SHA-256 in its metadata: under a key K
 * (letters, digits, '_', '.'), 64 lowercase hex digits, the SHA-256 of
 * the whole file — length, header, padding, data — as it is with those
 * 64 digits written as '0'. The writer writes the pair as "K":"<hex>"
 * (no space, no escape), the one place a reader looks for it, so a seal
 * covers every byte of the file but its own 64 and the file stays a
 * plain safetensors file for every other reader.
 */
#ifndef DG_RUNTIME_STORE_SAFETENSORS_H
#define DG_RUNTIME_STORE_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/status.h"

#define DG_SAFETENSORS_MAX_DIMS 8
#define DG_SAFETENSORS_MAX_HEADER ((uint64_t)100 << 20)

/* X(enum, text, bytes an element) */
#define DG_SAFETENSORS_DTYPES(X)                                              \
	X(DG_ST_F64, "F64", 8)                                                \
	X(DG_ST_F32, "F32", 4)                                                \
	X(DG_ST_F16, "F16", 2)                                                \
	X(DG_ST_BF16, "BF16", 2)                                              \
	X(DG_ST_I64, "I64", 8)                                                \
	X(DG_ST_I32, "I32", 4)                                                \
	X(DG_ST_I16, "I16", 2)                                                \
	X(DG_ST_I8, "I8", 1)                                                  \
	X(DG_ST_U64, "U64", 8)                                                \
	X(DG_ST_U32, "U32", 4)                                                \
	X(DG_ST_U16, "U16", 2)                                                \
	X(DG_ST_U8, "U8", 1)                                                  \
	X(DG_ST_BOOL, "BOOL", 1)                                              \
	X(DG_ST_F8_E4M3, "F8_E4M3", 1)                                        \
	X(DG_ST_F8_E5M2, "F8_E5M2", 1)

typedef enum dg_st_dtype {
#define DG__ST_ENUM(e, s, n) e,
	DG_SAFETENSORS_DTYPES(DG__ST_ENUM)
#undef DG__ST_ENUM
	DG_ST__COUNT
} dg_st_dtype;

const char *dg_st_dtype_name(dg_st_dtype d); /* "F32"; "?" outside the enum */
size_t dg_st_dtype_size(dg_st_dtype d);      /* bytes an element; 0 outside */

typedef struct dg_st_tensor {
	const char *name;
	dg_st_dtype dtype;
	int ndim;
	int64_t shape[DG_SAFETENSORS_MAX_DIMS];
	uint64_t bytes;   /* numel · dtype size */
	const void *data; /* inside the file's copy; unaligned in general */
} dg_st_tensor;

/* ---- reading ---------------------------------------------------------------- */

typedef struct dg_safetensors dg_safetensors;

/*
 * Parses size bytes (copied: the caller keeps its buffer). name (may be
 * NULL) is how messages call the input, usually its path. DG_ERR_PARSE
 * with one line naming the field on anything malformed; DG_ERR_NOMEM.
 * On failure *out is NULL; on success free it with dg_safetensors_destroy.
 */
dg_status dg_safetensors_parse(const void *bytes, size_t size, const char *name,
			       dg_safetensors **out, char *msg, size_t msg_size);
/* Reads and parses a file. DG_ERR_NOT_FOUND, DG_ERR_IO, DG_ERR_PARSE. */
dg_status dg_safetensors_load(const char *path, dg_safetensors **out, char *msg,
			      size_t msg_size);
void dg_safetensors_destroy(dg_safetensors *f); /* NULL is fine */

/* The tensors, in file order (by offset). */
size_t dg_safetensors_count(const dg_safetensors *f);
const dg_st_tensor *dg_safetensors_at(const dg_safetensors *f, size_t i);
/* The tensor named name, or NULL. */
const dg_st_tensor *dg_safetensors_find(const dg_safetensors *f, const char *name);
/* The metadata: value of key or NULL; and every pair by index. */
const char *dg_safetensors_meta(const dg_safetensors *f, const char *key);
size_t dg_safetensors_meta_count(const dg_safetensors *f);
bool dg_safetensors_meta_at(const dg_safetensors *f, size_t i, const char **key,
			    const char **value);

/* The SHA-256 (64 lowercase hex digits and a NUL) of f's data section:
 * every tensor's bytes as stored, what `tail -c +<9 + N>` gives. */
void dg_safetensors_data_sha256(const dg_safetensors *f, char hex[65]);

/*
 * Checks f's seal under key (see above): DG_OK when the file's bytes hash
 * to it; DG_ERR_NOT_FOUND when f has no metadata key; DG_ERR_CORRUPT when
 * they hash otherwise, or the value is not 64 lowercase hex digits
 * written as "key":"<hex>" once in the header. msg says which, without
 * the file's name (the caller names the file).
 */
dg_status dg_safetensors_seal_check(const dg_safetensors *f, const char *key, char *msg,
				    size_t msg_size);

/*
 * Checks that tensor `name` exists with dtype and exactly the shape given
 * (ndim extents), and returns it: one line in msg otherwise, naming the
 * tensor, e.g. "encoder: expected F32 [4, 256, 8192], got F32 [4, 8192, 256]"
 * or "decoder: missing (the file holds embed.weight, encoder, ...)".
 */
dg_status dg_safetensors_expect(const dg_safetensors *f, const char *name, dg_st_dtype dtype,
				int ndim, const int64_t *shape, const dg_st_tensor **out,
				char *msg, size_t msg_size);

/* ---- writing ---------------------------------------------------------------- */

typedef struct dg_safetensors_writer dg_safetensors_writer;

dg_status dg_safetensors_writer_create(dg_safetensors_writer **out);
void dg_safetensors_writer_destroy(dg_safetensors_writer *w); /* NULL is fine */
/* Adds a tensor; data (numel · dtype size bytes) is copied. A name given
 * twice, an empty one or "__metadata__" is DG_ERR_INVALID_ARG. */
dg_status dg_safetensors_writer_add(dg_safetensors_writer *w, const char *name,
				    dg_st_dtype dtype, int ndim, const int64_t *shape,
				    const void *data, char *msg, size_t msg_size);
/* Sets a metadata pair (a key given again replaces its value). */
dg_status dg_safetensors_writer_meta(dg_safetensors_writer *w, const char *key,
				     const char *value, char *msg, size_t msg_size);
/* Seals the file under metadata key (see above): every file the writer
 * makes from then on carries its SHA-256 there, in place of any value
 * dg_safetensors_writer_meta gave key. A key of other characters than
 * letters, digits, '_' and '.' is DG_ERR_INVALID_ARG. */
dg_status dg_safetensors_writer_seal(dg_safetensors_writer *w, const char *key, char *msg,
				     size_t msg_size);
/* The whole file in memory (malloc'd *out of *size bytes; free it). */
dg_status dg_safetensors_writer_bytes(const dg_safetensors_writer *w, void **out,
				      size_t *size, char *msg, size_t msg_size);
/* Writes the file atomically (see above) through the temp file
 * "<path>.tmp.<writer's pid>.<hex>". DG_ERR_IO names the file, the step
 * that failed (create, write, fsync, close, rename) and errno; the temp
 * file is then removed and the previous file at path, if any, is left as
 * it was. A writer killed midway leaves its temp file behind (see
 * dg_safetensors_temp_of). */
dg_status dg_safetensors_writer_save(const dg_safetensors_writer *w, const char *path,
				     char *msg, size_t msg_size);
/* Whether the file name `name` (no folder) is a save's temp file: then
 * its first *target_len characters are the target's name and *pid the
 * writer's process id (either may be NULL). */
bool dg_safetensors_temp_of(const char *name, size_t *target_len, long *pid);

#endif /* DG_RUNTIME_STORE_SAFETENSORS_H */
