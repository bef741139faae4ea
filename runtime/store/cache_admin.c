/*
 * dragon — disk cache maintenance: stat, verify, gc, clear, LRU eviction,
 * quarantine and the lock files (contract: include/dragon/cache.h; the
 * handle and the helpers shared with runtime/store/cache.c: runtime/cache_int.h).
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

/* One file found in a subfolder. */
typedef struct dir_ent {
	char name[256];
	uint64_t size;
	struct timespec mtime;
	dev_t dev;
	ino_t ino;
} dir_ent;

static bool has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* An entry's file name is <key>.dgk: true for "<64 hex>.dgk". */
static bool name_is_entry(const char *name)
{
	char key[DG_CACHE_KEY_LEN + 1];

	if (strlen(name) != DG_CACHE_KEY_LEN + 4 || !has_suffix(name, ".dgk"))
		return false;
	memcpy(key, name, DG_CACHE_KEY_LEN);
	key[DG_CACHE_KEY_LEN] = '\0';
	return dg__cache_key_valid(key);
}

static int cmp_timespec(struct timespec a, struct timespec b)
{
	if (a.tv_sec != b.tv_sec)
		return a.tv_sec < b.tv_sec ? -1 : 1;
	if (a.tv_nsec != b.tv_nsec)
		return a.tv_nsec < b.tv_nsec ? -1 : 1;
	return 0;
}

/*
 * Lists the regular files of subfolder d whose names end in suffix (NULL:
 * all). *out is malloc'd (caller frees), *n entries. Files that vanish
 * while listing are skipped: other processes may be evicting.
 */
static dg_status dir_list(dg_cache *c, int d, const char *suffix,
			  dir_ent **out, size_t *n)
{
	const char *sub = dg__cache_subdir_name[d];
	dir_ent *v = NULL, *grown;
	size_t len = 0, cap = 0;
	int fd;
	DIR *dir;
	struct dirent *de;

	*out = NULL;
	*n = 0;
	/* A fresh open file description, so each listing starts at 0. */
	fd = openat(c->dfd[d], ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || !(dir = fdopendir(fd))) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return dg__cache_fail(c, DG_ERR_IO, "%s/%s: cannot list: %s",
				      c->root, sub, strerror(e));
	}
	while ((errno = 0, de = readdir(dir))) {
		struct stat sb;

		if (de->d_name[0] == '.' || strlen(de->d_name) >= sizeof(v->name))
			continue;
		if (suffix && !has_suffix(de->d_name, suffix))
			continue;
		if (fstatat(c->dfd[d], de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISREG(sb.st_mode))
			continue;
		if (len == cap) {
			cap = cap ? 2 * cap : 64;
			grown = realloc(v, cap * sizeof(*v));
			if (!grown) {
				free(v);
				closedir(dir);
				return dg__cache_fail(c, DG_ERR_NOMEM,
						      "out of memory listing "
						      "%s/%s", c->root, sub);
			}
			v = grown;
		}
		strcpy(v[len].name, de->d_name);
		v[len].size = (uint64_t)sb.st_size;
		v[len].mtime = sb.st_mtim;
		v[len].dev = sb.st_dev;
		v[len].ino = sb.st_ino;
		len++;
	}
	if (errno) {
		int e = errno;
		free(v);
		closedir(dir);
		return dg__cache_fail(c, DG_ERR_IO, "%s/%s: cannot list: %s",
				      c->root, sub, strerror(e));
	}
	closedir(dir);
	*out = v;
	*n = len;
	return DG_OK;
}

/* ---- quarantine and lock files ---------------------------------------- */

/* Makes quarantine names unique within this process; the pid in the name
 * makes them unique across processes. */
static atomic_ulong quarantine_seq;

/* See cache_int.h. */
void dg__cache_quarantine(dg_cache *c, const char *name,
			  const struct stat *seen, char *res, size_t reslen)
{
	char qname[256 + 96];
	struct stat now;
	size_t stem = strlen(name);

	if (has_suffix(name, ".dgk"))
		stem -= 4;
	if (fstatat(c->dfd[DG__CACHE_KERNELS], name, &now,
		    AT_SYMLINK_NOFOLLOW) < 0 ||
	    (seen->st_ino && (now.st_ino != seen->st_ino ||
			      now.st_dev != seen->st_dev))) {
		snprintf(res, reslen, "already replaced or removed by another "
			 "process");
		return;
	}
	snprintf(qname, sizeof(qname), "%.*s.%lld.%ld.%lu.dgk", (int)stem, name,
		 (long long)time(NULL), (long)getpid(),
		 atomic_fetch_add(&quarantine_seq, 1));
	if (renameat(c->dfd[DG__CACHE_KERNELS], name,
		     c->dfd[DG__CACHE_QUARANTINE], qname) < 0)
		snprintf(res, reslen, "could not move it to quarantine/: %s; "
			 "it was not loaded", strerror(errno));
	else
		snprintf(res, reslen, "moved to quarantine/%s", qname);
}

/* See cache_int.h. */
dg_status dg__cache_lock_take(dg_cache *c, const char *key, int *fd)
{
	char name[DG_CACHE_KEY_LEN + 6];
	int d = c->dfd[DG__CACHE_LOCKS];
	struct stat held, now;

	snprintf(name, sizeof(name), "%s.lock", key);
	for (;;) {
		int f = openat(d, name,
			       O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
		if (f < 0)
			return dg__cache_fail(c, DG_ERR_IO, "%s/locks/%s: open: "
					      "%s", c->root, name,
					      strerror(errno));
		while (flock(f, LOCK_EX) < 0) {
			if (errno != EINTR) {
				int e = errno;
				close(f);
				return dg__cache_fail(c, DG_ERR_IO, "%s/locks/"
						      "%s: flock: %s", c->root,
						      name, strerror(e));
			}
		}
		/* gc may have unlinked the file between our open and flock;
		 * then the lock guards nothing: take the new file's. */
		if (fstat(f, &held) == 0 &&
		    fstatat(d, name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
		    held.st_ino == now.st_ino && held.st_dev == now.st_dev) {
			*fd = f;
			return DG_OK;
		}
		close(f);
	}
}

/* Removes lock files nobody holds. Housekeeping only: not counted. */
static dg_status remove_idle_locks(dg_cache *c)
{
	int d = c->dfd[DG__CACHE_LOCKS];
	dir_ent *v;
	size_t n;
	dg_status st = dir_list(c, DG__CACHE_LOCKS, ".lock", &v, &n);

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

static int cmp_lru(const void *pa, const void *pb)
{
	const dir_ent *a = pa, *b = pb;
	int t = cmp_timespec(a->mtime, b->mtime);

	return t ? t : strcmp(a->name, b->name);
}

/* See cache_int.h. */
dg_status dg__cache_evict(dg_cache *c, uint64_t cap, const char *keep,
			  uint64_t *removed)
{
	dir_ent *v;
	size_t n;
	uint64_t total = 0;
	dg_status st = dir_list(c, DG__CACHE_KERNELS, ".dgk", &v, &n);

	if (st)
		return st;
	for (size_t i = 0; i < n; i++)
		total += v[i].size;
	if (n > 1) /* v is NULL when n is 0 */
		qsort(v, n, sizeof(*v), cmp_lru);
	for (size_t i = 0; i < n && total > cap; i++) {
		struct stat sb;

		if (keep && strcmp(v[i].name, keep) == 0)
			continue;
		if (fstatat(c->dfd[DG__CACHE_KERNELS], v[i].name, &sb,
			    AT_SYMLINK_NOFOLLOW) < 0) {
			total -= v[i].size; /* someone else removed it */
			continue;
		}
		if (sb.st_ino != v[i].ino || sb.st_dev != v[i].dev ||
		    cmp_timespec(sb.st_mtim, v[i].mtime) != 0)
			continue;
		if (unlinkat(c->dfd[DG__CACHE_KERNELS], v[i].name, 0) < 0 &&
		    errno != ENOENT) {
			st = dg__cache_fail(c, DG_ERR_IO, "%s/kernels/%s: "
					    "cannot evict: %s", c->root,
					    v[i].name, strerror(errno));
			break;
		}
		total -= v[i].size;
		if (removed)
			(*removed)++;
	}
	free(v);
	return st;
}

/* ---- stat, verify, gc, clear ------------------------------------------ */

static dg_status count_files(dg_cache *c, int d, const char *suffix,
			     uint64_t *count, uint64_t *bytes)
{
	dir_ent *v;
	size_t n;
	dg_status st = dir_list(c, d, suffix, &v, &n);

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
	dir_ent *v;
	size_t n;
	dg_status st;

	if (!cache)
		return DG_ERR_INVALID_ARG;
	cache->errmsg[0] = '\0';
	if (!out)
		return dg__cache_fail(cache, DG_ERR_INVALID_ARG,
				      "dg_cache_verify: out is NULL");
	memset(out, 0, sizeof(*out));
	st = dir_list(cache, DG__CACHE_KERNELS, ".dgk", &v, &n);
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
	dir_ent *v;
	size_t n;
	dg_status st = dir_list(c, d, NULL, &v, &n);

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
