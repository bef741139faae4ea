/*
 * dragon — disk cache internals: the handle, the entry file layout, the
 * helpers runtime/store/cache.c (open, get, put, get_or_build) and
 * runtime/store/cache_admin.c (stat, verify, gc, clear, eviction, quarantine,
 * lock files) share, and the test hook. Only those two files and the cache tests (tests/test_cache*.c)
 * look here.
 *
 * Entry file <root>/kernels/<key>.dgk, every integer little-endian:
 *
 *   offset  size  field
 *        0     8  magic "DGKCACHE"
 *        8     4  u32 format version (DG__CACHE_VERSION)
 *       12     4  u32 header size (DG__CACHE_HEADER_SIZE)
 *       16    64  key, 64 lowercase hex digits (equals the file name's)
 *       80     8  u64 image size
 *       88     8  u64 meta size (the JSON text, no NUL)
 *       96    32  SHA-256 of image ‖ meta
 *      128     …  image, then meta
 *
 * The header is not under the checksum, but every header field is checked
 * on its own (magic, version, size, key against the name, sizes against the
 * file size), so a change to any one header byte is detected too.
 */
#ifndef DG_RUNTIME_CACHE_INT_H
#define DG_RUNTIME_CACHE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "dragon/cache.h"
#include "runtime/store/cache_io.h"

#define DG__CACHE_MAGIC "DGKCACHE"
#define DG__CACHE_VERSION 1u
#define DG__CACHE_OFF_VERSION 8
#define DG__CACHE_OFF_HSIZE 12
#define DG__CACHE_OFF_KEY 16
#define DG__CACHE_OFF_IMAGE_SIZE 80
#define DG__CACHE_OFF_META_SIZE 88
#define DG__CACHE_OFF_SUM 96
#define DG__CACHE_HEADER_SIZE 128u

/* Temp files whose mtime is older than this belong to a writer that died;
 * gc removes them. Younger ones may belong to a live writer. */
#define DG__CACHE_TEMP_MAX_AGE_S 60

/*
 * Test hook: when non-NULL, dg_cache_put calls it after writing the first
 * half of the temp file and before the rest, the fsync and the rename, so a
 * test can kill the process there (a crash mid-write). NULL in production.
 */
extern void (*dg__cache_test_after_partial_write)(void);

/* The subfolders of the root; dg__cache_subdir_name[d] is d's name. */
enum {
	DG__CACHE_KERNELS,
	DG__CACHE_QUARANTINE,
	DG__CACHE_LOCKS,
	DG__CACHE_TMP,
	DG__CACHE_NDIRS
};
extern const char *const dg__cache_subdir_name[DG__CACHE_NDIRS];

struct dg_cache {
	char *root;               /* owned; as chosen, without trailing '/' */
	int root_fd;              /* -1 when closed */
	int dfd[DG__CACHE_NDIRS]; /* one O_DIRECTORY descriptor per subfolder */
	uint64_t max_bytes;       /* the cap */
	char errmsg[1024];        /* see dg_cache_errmsg in cache.h */
};

/* Formats the message into c->errmsg and returns st. The arguments must
 * not point into c->errmsg. */
__attribute__((format(printf, 3, 4)))
dg_status dg__cache_fail(dg_cache *c, dg_status st, const char *fmt, ...);

/* One file found in a subfolder (dg__cache_dir_list). */
typedef struct dg__cache_file {
	char name[256];
	uint64_t size;
	struct timespec mtime;
	dev_t dev;
	ino_t ino;
} dg__cache_file;

/* The files of subfolder d whose names end in suffix (NULL: any), with
 * their size, mtime and identity, into a malloc'd *out (n of them); files
 * that vanish while listed are left out. */
dg_status dg__cache_dir_list(dg_cache *c, int d, const char *suffix, dg__cache_file **out,
			     size_t *n);

bool dg__cache_has_suffix(const char *s, const char *suffix);

/* True for exactly 64 lowercase hex digits. */
bool dg__cache_key_valid(const char *key);

/*
 * Reads and verifies kernels/<name>, whose key is key. DG_OK: *out filled
 * (caller frees with dg_cache_blob_free). DG_ERR_CORRUPT: why says what is
 * wrong, *seen is the file read (for quarantine). DG_ERR_NOT_FOUND: no such
 * file. DG_ERR_IO / DG_ERR_NOMEM: message on c. touch: record the use.
 */
dg_status dg__cache_entry_read(dg_cache *c, const char *name, const char *key,
			       bool touch, dg_cache_blob *out, char *why,
			       size_t whylen, struct stat *seen);

/*
 * Moves kernels/<name> to quarantine/<stem>.<unix-time>.<pid>.<seq>.dgk
 * (seq: a per-process counter, so quarantining one key twice in a second
 * keeps both copies) unless the name now refers to another file than seen
 * (a writer replaced it with a good entry meanwhile). Writes what happened
 * into res.
 */
void dg__cache_quarantine(dg_cache *c, const char *name,
			  const struct stat *seen, char *res, size_t reslen);

/*
 * Opens and exclusively locks locks/<key>.lock into *fd (the caller closes
 * it to unlock). Blocks while another process holds it.
 */
dg_status dg__cache_lock_take(dg_cache *c, const char *key, int *fd);

/*
 * Removes least recently used entries (oldest mtime, then name) until the
 * entries total at most cap bytes, never the entry named keep (may be NULL).
 * An entry used or replaced since the listing is passed over. *removed (may
 * be NULL) is incremented per entry removed.
 */
dg_status dg__cache_evict(dg_cache *c, uint64_t cap, const char *keep,
			  uint64_t *removed);

#endif
