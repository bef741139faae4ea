/*
 * dragon — just-in-time compilation: spec → cubin, through the disk cache.
 *
 * dg_jit_compile renders the spec's template, derives the cache key (SHA-256
 * of generator version, template hash, canonical spec, rendered source,
 * NVRTC version, compile options and arch), and returns the cached binary or
 * compiles it with NVRTC and publishes it. No GPU is needed for any of this;
 * loading and launching live in the runtime (later in this header).
 *
 * A dg_ctx is used by one thread at a time; make one per thread.
 */
#ifndef DRAGON_JIT_H
#define DRAGON_JIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache.h"
#include "codegen.h"
#include "export.h"
#include "spec.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_ctx dg_ctx;

typedef struct dg_ctx_opts {
	const char *cache_dir;    /* NULL: the cache's environment default */
	uint64_t cache_max_bytes; /* 0: the cache's default */
	const char *template_dir; /* NULL: $DRAGON_TEMPLATE_DIR, else embedded */
	bool no_cache;            /* compile every time, touch no disk */
} dg_ctx_opts;

/* A compiled kernel. Owned by the caller: dg_binary_destroy. */
typedef struct dg_binary {
	uint8_t *image;    /* cubin (ELF), or PTX text when is_ptx */
	size_t image_size;
	bool is_ptx;       /* the arch was past what NVRTC emits SASS for */
	int arch;          /* SM version the image targets (90) */
	bool arch_specific;
	char key[DG_CACHE_KEY_LEN + 1];
	char canonical[DG_SPEC_TEXT_MAX];
	char **entries;    /* kernel entry points, n_entries */
	int n_entries;
	int *block_threads; /* per entry, from the template; 0: not given */
	int *dyn_smem;      /* per entry, dynamic shared memory bytes; 0: none */
	char *log;         /* NVRTC log, kept even on success ("" if none) */
	char *meta;        /* the cache entry's metadata JSON */
	double compile_ms; /* NVRTC time when it was built */
	bool cache_hit;
} dg_binary;

/* opts may be NULL. Like sqlite3_open, a failure other than DG_ERR_NOMEM
 * and DG_ERR_INVALID_ARG still sets *out to a handle whose errmsg says why
 * (templates that do not load, a cache folder that cannot be made); every
 * later call on it fails the same way. Destroy it in either case. */
DG_API dg_status dg_ctx_create(dg_ctx **out, const dg_ctx_opts *opts);
DG_API void dg_ctx_destroy(dg_ctx *ctx);
/* Message of the last failure on ctx; valid until the next call on it. */
DG_API const char *dg_ctx_errmsg(const dg_ctx *ctx);
DG_API dg_codegen *dg_ctx_codegen(dg_ctx *ctx);
DG_API dg_cache *dg_ctx_cache(dg_ctx *ctx); /* NULL when no_cache */

DG_API dg_status dg_jit_compile(dg_ctx *ctx, const dg_spec *spec, dg_binary **out);
DG_API void dg_binary_destroy(dg_binary *bin);

/* The cache key dg_jit_compile would use for spec (it renders, compiles
 * nothing), and the canonical text of what renders (the tile resolved):
 * `dragon-gen inspect` holds a bundle's keys against its specs with it.
 * key: DG_CACHE_KEY_LEN + 1 bytes; canonical (may be NULL):
 * DG_SPEC_TEXT_MAX. */
DG_API dg_status dg_jit_key(dg_ctx *ctx, const dg_spec *spec, char *key, char *canonical);

/* Whether this NVRTC can target arch (sm_<arch>, "a" when arch_specific):
 * DG_OK, or DG_ERR_INVALID_SPEC with one line in msg naming the range it
 * targets ("arch=sm_50: NVRTC 13.0 targets sm_75 to sm_121; ..."). */
DG_API dg_status dg_jit_check_arch(int arch, bool arch_specific, char *msg, size_t msg_size);

/* NVRTC's version as "13.0"; the SM versions it emits SASS for. */
DG_API const char *dg_nvrtc_version(void);
/* Writes up to max archs (ascending) into archs; returns how many NVRTC
 * supports (0 if NVRTC failed). */
DG_API int dg_nvrtc_archs(int *archs, int max);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_JIT_H */
