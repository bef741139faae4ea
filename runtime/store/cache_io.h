/*
 * The disk cache's reads and writes (runtime/store/cache.c): what the JIT
 * (runtime/store/jit.c) and the cache's own files do with its entries.
 * dragon/cache.h says how they are kept safe. Private to the library and
 * its tests.
 */
#ifndef DG_RUNTIME_STORE_CACHE_IO_H
#define DG_RUNTIME_STORE_CACHE_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/cache.h"
#include "dragon/status.h"

/* One entry's contents. Owned by the caller: dg_cache_blob_free. */
typedef struct dg_cache_blob {
	uint8_t *image; /* binary image (cubin or PTX), image_size bytes */
	size_t image_size;
	char *meta; /* metadata JSON, NUL-terminated */
} dg_cache_blob;

/*
 * Builds a missing entry: on success sets *image (malloc'd, size *size) and
 * *meta (malloc'd JSON text, or NULL for ""); the cache takes ownership. On
 * failure returns a status and leaves a message in the caller's own state;
 * nothing is published, and *image and *meta are neither read nor freed:
 * the builder frees whatever it allocated before returning an error.
 */
typedef dg_status (*dg_cache_build_fn)(void *user, uint8_t **image,
				       size_t *size, char **meta);

/* DG_OK and *out filled on a hit; DG_ERR_NOT_FOUND on a miss (a corrupt
 * entry is quarantined and counts as a miss). */
dg_status dg_cache_get(dg_cache *cache, const char *key, dg_cache_blob *out);

/* Publishes an entry atomically (replacing any), then evicts down to the
 * cap. The newest entry is never evicted. */
dg_status dg_cache_put(dg_cache *cache, const char *key, const uint8_t *image,
		       size_t image_size, const char *meta);

/*
 * Get, else take the key's lock, get again, else build and put. *hit (may be
 * NULL) tells whether the bytes came from disk. *out is filled on DG_OK
 * (free with dg_cache_blob_free).
 *
 * The cache is an optimisation, so a cache that cannot keep the result
 * does not fail the call: if the key's lock cannot be taken, the entry is
 * built without it; if the built entry cannot be published (read-only or
 * full disk), the built bytes are still returned with DG_OK and *hit false,
 * nothing is published, and dg_cache_errmsg(cache) says why (it is "" when
 * the cache worked). A builder failure is returned as the builder's status.
 */
dg_status dg_cache_get_or_build(dg_cache *cache, const char *key,
				dg_cache_build_fn build, void *user,
				dg_cache_blob *out, bool *hit);

void dg_cache_blob_free(dg_cache_blob *blob);

#endif /* DG_RUNTIME_STORE_CACHE_IO_H */
