/*
 * dragon — disk cache maintenance: stat, verify, gc, clear, and the idle
 * lock files (contract: include/dragon/cache.h; the handle and the helpers
 * shared with runtime/store/cache.c: runtime/store/cache_int.h, defined in
 * runtime/store/cache_entry.c).
 *
 * Everything here works through a listing of one subfolder, and other
 * processes may add, use, replace or remove files while it is worked
 * through: a file that vanished is skipped, never an error, and eviction
 * and quarantine check that a name still refers to the file they looked at
 * before they act on it.
 *
 * Lock files are here on both sides, because the two only work together:
 * get_or_build holds an exclusive flock on locks/<key>.lock while it builds
 * (dg__cache_lock_take); gc and clear unlink lock files nobody holds
 * (remove_idle_locks), only while holding the lock themselves. A locker may
 * thus end up holding a file that was unlinked between its open and its
 * flock, so after the flock it checks that the name still refers to the
 * file it locked, and otherwise locks the new one.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dragon/cache.h"
#include "runtime/store/cache_int.h"



/* An entry's file name is <key>.dgk: true for "<64 hex>.dgk". */
static bool name_is_entry(const char *name)
{
	char key[DG_CACHE_KEY_LEN + 1];

	if (strlen(name) != DG_CACHE_KEY_LEN + 4 || !dg__cache_has_suffix(name, ".dgk"))
		return false;
	memcpy(key, name, DG_CACHE_KEY_LEN);
	key[DG_CACHE_KEY_LEN] = '\0';
	return dg__cache_key_valid(key);
}



/* ---- quarantine and lock files ---------------------------------------- */




/* Removes lock files nobody holds. Housekeeping only: not counted. */
static dg_status remove_idle_locks(dg_cache *c)
{
	int d = c->dfd[DG__CACHE_LOCKS];
	dg__cache_file *v;
	size_t n;
	dg_status st = dg__cache_dir_list(c, DG__CACHE_LOCKS, ".lock", &v, &n);

	if (st)
		return st;
	for (size_t i = 0; i < n; i++) {
		struct stat held, now;
		int f = openat(d, v[i].name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		if (f < 0)
			continue;
		/* Unlink only while holding the lock and only the file we
		 * hold; dg__cache_lock_take re-checks the name after its
		 * flock. */
		if (flock(f, LOCK_EX | LOCK_NB) == 0 && fstat(f, &held) == 0 &&
		    fstatat(d, v[i].name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
		    held.st_ino == now.st_ino && held.st_dev == now.st_dev)
			unlinkat(d, v[i].name, 0);
		close(f);
	}
	free(v);
	return DG_OK;
}

/* ---- eviction --------------------------------------------------------- */



/* ---- stat, verify, gc, clear ------------------------------------------ */

static dg_status count_files(dg_cache *c, int d, const char *suffix,
			     uint64_t *count, uint64_t *bytes)
{
	dg__cache_file *v;
	size_t n;
	dg_status st = dg__cache_dir_list(c, d, suffix, &v, &n);

	if (st)
		return st;
	*count = n;
	if (bytes) {
		*bytes = 0;
		for (size_t i = 0; i < n; i++)
			*bytes += v[i].size;
	}
	free(v);
	return DG_OK;
}

dg_status dg_cache_stat(dg_cache *cache, dg_cache_stats *out)
{
	dg_status st;

	if (!cache)
		return DG_ERR_INVALID_ARG;
	cache->errmsg[0] = '\0';
	if (!out)
		return dg__cache_fail(cache, DG_ERR_INVALID_ARG,
				      "dg_cache_stat: out is NULL");
	memset(out, 0, sizeof(*out));
	out->max_bytes = cache->max_bytes;
	st = count_files(cache, DG__CACHE_KERNELS, ".dgk", &out->entries,
			 &out->bytes);
	if (!st)
		st = count_files(cache, DG__CACHE_QUARANTINE, NULL,
				 &out->quarantined, NULL);
	if (!st)
		st = count_files(cache, DG__CACHE_TMP, NULL, &out->temp_files,
				 NULL);
	return st;
}

dg_status dg_cache_verify_each(dg_cache *cache, dg_cache_verify_fn cb,
			       void *user, dg_cache_verify_report *out)
{
	char key[DG_CACHE_KEY_LEN + 1], why[256], res[512];
	char reason[sizeof(why) + sizeof(res) + 2]; /* why; res */
	dg_cache_blob blob;
	struct stat seen;
	dg__cache_file *v;
	size_t n;
	dg_status st;

	if (!cache)
		return DG_ERR_INVALID_ARG;
	cache->errmsg[0] = '\0';
	if (!out)
		return dg__cache_fail(cache, DG_ERR_INVALID_ARG,
				      "dg_cache_verify: out is NULL");
	memset(out, 0, sizeof(*out));
	st = dg__cache_dir_list(cache, DG__CACHE_KERNELS, ".dgk", &v, &n);
	if (st)
		return st;
	for (size_t i = 0; i < n; i++) {
		const char *name = v[i].name, *who = name;

		if (!name_is_entry(name)) {
			/* Never read by get; not ours to keep either. */
			memset(&seen, 0, sizeof(seen));
			seen.st_ino = v[i].ino;
			seen.st_dev = v[i].dev;
			snprintf(why, sizeof(why), "file name is not "
				 "<64 lowercase hex digits>.dgk");
			st = DG_ERR_CORRUPT;
		} else {
			memcpy(key, name, DG_CACHE_KEY_LEN);
			key[DG_CACHE_KEY_LEN] = '\0';
			who = key;
			st = dg__cache_entry_read(cache, name, key, false,
						  &blob, why, sizeof(why),
						  &seen);
		}
		if (st == DG_ERR_NOT_FOUND)
			continue; /* evicted meanwhile */
		if (st != DG_OK && st != DG_ERR_CORRUPT)
			break;
		out->checked++;
		if (st == DG_OK) {
			dg_cache_blob_free(&blob);
			out->ok++;
		} else {
			dg__cache_quarantine(cache, name, &seen, res,
					     sizeof(res));
			out->bad++;
			snprintf(reason, sizeof(reason), "%s; %s", why, res);
			if (cb)
				cb(user, who, reason);
		}
		st = DG_OK;
	}
	free(v);
	return st;
}

dg_status dg_cache_verify(dg_cache *cache, dg_cache_verify_report *out)
{
	return dg_cache_verify_each(cache, NULL, NULL, out);
}

/* Removes every regular file of subfolder d, or only those whose mtime is
 * at or before older_than (when not NULL). */
static dg_status remove_files(dg_cache *c, int d, const time_t *older_than,
			      uint64_t *removed)
{
	dg__cache_file *v;
	size_t n;
	dg_status st = dg__cache_dir_list(c, d, NULL, &v, &n);

	if (st)
		return st;
	for (size_t i = 0; i < n; i++) {
		if (older_than && v[i].mtime.tv_sec > *older_than)
			continue;
		if (unlinkat(c->dfd[d], v[i].name, 0) == 0)
			(*removed)++;
		else if (errno != ENOENT) {
			st = dg__cache_fail(c, DG_ERR_IO, "%s/%s/%s: cannot "
					    "remove: %s", c->root,
					    dg__cache_subdir_name[d],
					    v[i].name, strerror(errno));
			break;
		}
	}
	free(v);
	return st;
}

dg_status dg_cache_gc(dg_cache *cache, uint64_t max_bytes, uint64_t *removed)
{
	uint64_t count = 0;
	time_t limit = time(NULL) - DG__CACHE_TEMP_MAX_AGE_S;
	dg_status st;

	if (removed)
		*removed = 0;
	if (!cache)
		return DG_ERR_INVALID_ARG;
	cache->errmsg[0] = '\0';
	st = remove_files(cache, DG__CACHE_TMP, &limit, &count);
	if (!st)
		st = remove_files(cache, DG__CACHE_QUARANTINE, NULL, &count);
	if (!st)
		st = remove_idle_locks(cache);
	if (!st)
		st = dg__cache_evict(cache,
				     max_bytes ? max_bytes : cache->max_bytes,
				     NULL, &count);
	if (removed)
		*removed = count;
	return st;
}

dg_status dg_cache_clear(dg_cache *cache, uint64_t *removed)
{
	uint64_t count = 0;
	dg_status st;

	if (removed)
		*removed = 0;
	if (!cache)
		return DG_ERR_INVALID_ARG;
	cache->errmsg[0] = '\0';
	st = remove_files(cache, DG__CACHE_KERNELS, NULL, &count);
	if (!st)
		st = remove_files(cache, DG__CACHE_TMP, NULL, &count);
	if (!st)
		st = remove_files(cache, DG__CACHE_QUARANTINE, NULL, &count);
	if (!st)
		st = remove_idle_locks(cache);
	if (removed)
		*removed = count;
	return st;
}
