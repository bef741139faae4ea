/*
 * dragon — disk cache internals: the entry file layout and the test hook.
 * Only runtime/cache.c and tests/test_cache.c look here.
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

#endif
