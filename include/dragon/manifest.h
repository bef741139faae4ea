/*
 * dragon — the kernel bundle manifest.
 *
 * `dragon-gen build --out DIR` writes one binary per kernel into DIR and
 * DIR/manifest.json last, which describes them:
 *
 *   {
 *     "format": 2,
 *     "generator_version": "0.1.0",
 *     "template_hash": "<64 lowercase hex digits: the templates it rendered>",
 *     "nvrtc_version": "13.0",
 *     "created": "2025-01-31T12:00:00Z",
 *     "device": "NVIDIA H200", "sm": 90,
 *     "kernels": [
 *       { "spec": "act=int8;arch=sm_90a;...;tile=128x64x64/8x1/2;weight=int8;",
 *         "key": "<64 lowercase hex digits: the cache key>",
 *         "file": "lowrank_fwd-0123456789abcdef.cubin",
 *         "entries": [ { "name": "dg_lowrank_fwd", "threads": 256, "smem": 98304 } ],
 *         "arch": 90, "ptx": false,
 *         "compile_ms": 412.5, "cache_hit": false,
 *         "size": 23456,
 *         "sha256": "<64 lowercase hex digits: of the file's bytes>" }
 *     ]
 *   }
 *
 * A kernel's spec is what runs: its tile and target resolved (for the
 * device the bundle was built for: "device" and "sm", "" and 0 when built
 * for none), each entry with the block size and dynamic shared memory its
 * launch takes.
 *
 * The reader is strict about what it knows and lenient about what it does
 * not: every field above is required and checked (a spec must be in
 * canonical form, a file a plain name inside DIR, keys and files unique),
 * a known field given twice is refused, unknown fields are ignored (so a
 * later minor addition reads), and a format other than 2 is refused (format 1, the
 * one before launch info, with a message to rebuild the bundle).
 */
#ifndef DRAGON_MANIFEST_H
#define DRAGON_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache.h"
#include "export.h"
#include "spec.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DG_MANIFEST_FORMAT 2
#define DG_MANIFEST_FILE "manifest.json"
/* Limits the reader enforces (a manifest past them is refused). */
#define DG_MANIFEST_MAX_BYTES ((size_t)64 << 20)
#define DG_MANIFEST_MAX_KERNELS 100000
#define DG_MANIFEST_MAX_ENTRIES 64
#define DG_MANIFEST_MAX_NAME 255 /* file and entry names, version strings */

typedef struct dg_manifest_kernel {
	char spec[DG_SPEC_TEXT_MAX];   /* canonical spec, tile resolved */
	char key[DG_CACHE_KEY_LEN + 1]; /* cache key */
	char *file;      /* file name inside the bundle folder, no '/' */
	char **entries;  /* kernel entry points, n_entries of them */
	int *threads;    /* per entry: a block (1..1024) */
	int *smem;       /* per entry: dynamic shared memory, bytes */
	int n_entries;
	int arch;        /* SM the image targets (90) */
	bool ptx;        /* file is PTX text, not a cubin */
	double compile_ms;
	bool cache_hit;
	uint64_t size;   /* bytes of file */
	char sha256[DG_CACHE_KEY_LEN + 1]; /* of file's bytes, hex */
} dg_manifest_kernel;

/* Every pointer in a manifest is malloc'd and owned by it:
 * dg_manifest_destroy frees them all (a builder fills them the same way). */
typedef struct dg_manifest {
	int format; /* DG_MANIFEST_FORMAT */
	char *generator_version;
	char template_hash[DG_CACHE_KEY_LEN + 1];
	char *nvrtc_version;
	char *device; /* "" when built for no device */
	int sm;       /* 0 likewise */
	char *created; /* ISO-8601 UTC */
	dg_manifest_kernel *kernels;
	size_t n_kernels;
} dg_manifest;

/*
 * Parses len bytes of JSON (no NUL needed; one inside is refused). On
 * success *out is a new manifest (dg_manifest_destroy). Any malformed input
 * gives DG_ERR_PARSE and one line in msg naming the field, e.g.
 * "kernels[3].key: expected 64 lowercase hex digits"; DG_ERR_NOMEM when
 * memory runs out. *out is NULL on failure.
 */
DG_API dg_status dg_manifest_parse(const char *json, size_t len, dg_manifest **out,
				   char *msg, size_t msg_size);

/*
 * Serializes m (indented JSON text, trailing newline) into *out, malloc'd
 * and owned by the caller (free). DG_ERR_INVALID_ARG when a field would not
 * read back (NULL strings, a non-finite compile time); DG_ERR_NOMEM.
 */
DG_API dg_status dg_manifest_to_json(const dg_manifest *m, char **out, char *msg,
				     size_t msg_size);

/* Reads and parses DIR/manifest.json; messages start with that path.
 * DG_ERR_NOT_FOUND if it does not exist, DG_ERR_IO if it cannot be read. */
DG_API dg_status dg_manifest_load(const char *dir, dg_manifest **out, char *msg,
				  size_t msg_size);

DG_API void dg_manifest_destroy(dg_manifest *m);

/* Sets k->size and k->sha256 from the bytes of k's file. */
DG_API void dg_manifest_kernel_hash(dg_manifest_kernel *k, const void *bytes,
				    size_t size);

/*
 * Checks the bytes of k's file against k: the size, the SHA-256, and for a
 * cubin (not ptx) dg_cubin_check against k->arch. DG_ERR_CORRUPT (size or
 * checksum, or a broken cubin) or DG_ERR_UNSUPPORTED (a cubin for another
 * SM), with one line in msg, e.g. "3440 bytes; the manifest says 6880
 * (truncated?)".
 */
DG_API dg_status dg_manifest_kernel_verify(const dg_manifest_kernel *k,
					   const void *bytes, size_t size, char *msg,
					   size_t msg_size);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_MANIFEST_H */
