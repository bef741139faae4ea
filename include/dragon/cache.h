/*
 * dragon — the on-disk kernel cache: where it is, what it holds, checking
 * and trimming it. The JIT (dragon/jit.h) reads and writes its entries.
 *
 * Root: opts->dir, else $DRAGON_CACHE_DIR, else $XDG_CACHE_HOME/dragon,
 * else ~/.cache/dragon. Entries live in <root>/kernels/<key>.dgk, one file
 * each: a fixed header (magic, format version, key, payload sizes, SHA-256
 * of the payload), then the binary image, then a metadata JSON document.
 *
 * Safety:
 *  - writers publish by temp file + fsync + rename, so a reader sees a whole
 *    entry or none; a process killed mid-write leaves only a temp file,
 *    which is never read and which gc removes;
 *  - every read verifies the header and checksum; a bad entry is moved to
 *    <root>/quarantine/ and reported as a miss, never loaded;
 *  - the JIT serializes builders of one key with an advisory
 *    lock (<root>/locks/<key>.lock, released by the kernel if the holder
 *    dies), so concurrent processes build a key once and all return the
 *    bytes of the one published entry;
 *  - size is capped (opts->max_bytes, else $DRAGON_CACHE_MAX_BYTES, else
 *    1 GiB): after each put the least recently used entries are evicted.
 *    Use is recorded by dragon itself: a hit sets the entry's mtime;
 *  - the cache is an optimisation: the JIT returns what it built even
 *    when the cache cannot store it (read-only or full disk).
 */
#ifndef DRAGON_CACHE_H
#define DRAGON_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Keys are 64 lowercase hex digits (a SHA-256). */
#define DG_CACHE_KEY_LEN 64

typedef struct dg_cache dg_cache;

typedef struct dg_cache_opts {
	const char *dir;    /* NULL: the environment default above */
	uint64_t max_bytes; /* 0: $DRAGON_CACHE_MAX_BYTES, else 1 GiB */
	bool no_create;     /* open only a cache that exists: make no folder */
} dg_cache_opts;

typedef struct dg_cache_stats {
	uint64_t entries;
	uint64_t bytes;       /* sum of entry file sizes */
	uint64_t max_bytes;
	uint64_t quarantined; /* files in quarantine/ */
	uint64_t temp_files;  /* unpublished temp files (crashed writers) */
} dg_cache_stats;

typedef struct dg_cache_verify_report {
	uint64_t checked;
	uint64_t ok;
	uint64_t bad; /* each moved to quarantine/ */
} dg_cache_verify_report;

/* Creates the root folders if needed. opts may be NULL. *out is the new
 * handle (free with dg_cache_close), NULL on failure: then
 * dg_cache_errmsg(NULL) says why. With opts->no_create nothing is made:
 * a root, or one of its folders, that does not exist is DG_ERR_NOT_FOUND
 * (a tool can look at a cache without creating one). */
DG_API dg_status dg_cache_open(dg_cache **out, const dg_cache_opts *opts);
/* Accepts NULL. */
DG_API void dg_cache_close(dg_cache *cache);
/*
 * The message of the handle's last call: "" after a success (or why a
 * built entry could not be kept); valid until the handle's next call.
 * NULL: why the last dg_cache_open on this thread failed ("" if it
 * succeeded); valid until this thread's next dg_cache_open. Never NULL.
 */
DG_API const char *dg_cache_errmsg(const dg_cache *cache);
DG_API const char *dg_cache_root(const dg_cache *cache);

DG_API dg_status dg_cache_stat(dg_cache *cache, dg_cache_stats *out);
/* Reads every entry; moves bad ones to quarantine/. */
DG_API dg_status dg_cache_verify(dg_cache *cache, dg_cache_verify_report *out);
/*
 * Told of each bad file dg_cache_verify_each found, after it was moved to
 * quarantine/. key: the entry's key, or for a file in kernels/ whose name is
 * not <key>.dgk, that file name. reason: what is wrong and where the file
 * went, e.g. "checksum mismatch; moved to quarantine/<name>". Both are
 * valid during the call only.
 */
typedef void (*dg_cache_verify_fn)(void *user, const char *key,
				   const char *reason);
/* dg_cache_verify that also calls cb(user, ...) (cb may be NULL) for each
 * bad file, so a tool can list them. */
DG_API dg_status dg_cache_verify_each(dg_cache *cache, dg_cache_verify_fn cb,
				      void *user, dg_cache_verify_report *out);
/* Removes temp files older than a minute and the quarantine, then evicts
 * least recently used entries down to max_bytes (0: the cache's cap).
 * *removed (may be NULL) counts files removed. */
DG_API dg_status dg_cache_gc(dg_cache *cache, uint64_t max_bytes, uint64_t *removed);
/* Removes every entry, temp file and quarantined file. */
DG_API dg_status dg_cache_clear(dg_cache *cache, uint64_t *removed);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_CACHE_H */
