/*
 * dragon — the cache's files: reading and verifying one entry, the listing
 * of a subfolder, quarantine, the per-key lock and LRU eviction. These are
 * the pieces the get/put side (runtime/store/cache.c) and the maintenance
 * side (runtime/store/cache_admin.c) share; neither is called from here.
 *
 * Other processes may add, use, replace or remove files while a listing is
 * worked through: a file that vanished is skipped, never an error, and
 * eviction and quarantine check that a name still refers to the file they
 * looked at before they act on it. The lock protocol is described in
 * cache_admin.c, whose gc and clear remove idle lock files.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/sha256.h"
#include "dragon/cache.h"
#include "runtime/store/cache_int.h"

#define HDR DG__CACHE_HEADER_SIZE

/* Makes quarantine names unique within this process; the pid in the name
 * makes them unique across processes. */
static atomic_ulong quarantine_seq;

const char *const dg__cache_subdir_name[DG__CACHE_NDIRS] = {
	"kernels", "quarantine", "locks", "tmp",
};


dg_status dg__cache_fail(dg_cache *c, dg_status st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->errmsg, sizeof(c->errmsg), fmt, ap);
	va_end(ap);
	return st;
}

static uint32_t get_le32(const uint8_t *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint64_t get_le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

bool dg__cache_key_valid(const char *key)
{
	size_t i;

	for (i = 0; i < DG_CACHE_KEY_LEN; i++) {
		char ch = key[i];
		if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
			return false; /* also stops at a NUL */
	}
	return key[i] == '\0';
}

/* Reads exactly n bytes; returns n, fewer at end of file, or -1 (errno). */
static ssize_t read_full(int fd, void *buf, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = read(fd, (uint8_t *)buf + got, n - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

/* See cache_int.h. */
dg_status dg__cache_entry_read(dg_cache *c, const char *name, const char *key,
			       bool touch, dg_cache_blob *out, char *why,
			       size_t whylen, struct stat *seen)
{
	uint8_t h[HDR], sum[32], want[32];
	uint64_t isz, msz, fsz;
	uint8_t *image = NULL;
	char *meta = NULL;
	dg_status st = DG_ERR_CORRUPT;
	ssize_t r = 0;
	int fd;

	memset(seen, 0, sizeof(*seen));
	fd = openat(c->dfd[DG__CACHE_KERNELS], name,
		    O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		if (errno == ENOENT)
			return DG_ERR_NOT_FOUND;
		if (errno == ELOOP) {
			fstatat(c->dfd[DG__CACHE_KERNELS], name, seen,
				AT_SYMLINK_NOFOLLOW);
			snprintf(why, whylen, "is a symbolic link");
			return DG_ERR_CORRUPT;
		}
		return dg__cache_fail(c, DG_ERR_IO, "%s/kernels/%s: open: %s",
				      c->root, name, strerror(errno));
	}
	if (fstat(fd, seen) < 0) {
		st = dg__cache_fail(c, DG_ERR_IO, "%s/kernels/%s: fstat: %s",
				    c->root, name, strerror(errno));
		goto out_close;
	}
	fsz = (uint64_t)seen->st_size;
	if (!S_ISREG(seen->st_mode)) {
		snprintf(why, whylen, "not a regular file");
		goto out_close;
	}
	if (fsz < HDR) {
		snprintf(why, whylen, "%llu bytes, shorter than the %u-byte "
			 "header", (unsigned long long)fsz, HDR);
		goto out_close;
	}
	if ((r = read_full(fd, h, HDR)) != (ssize_t)HDR)
		goto out_short;
	isz = get_le64(h + DG__CACHE_OFF_IMAGE_SIZE);
	msz = get_le64(h + DG__CACHE_OFF_META_SIZE);
	if (memcmp(h, DG__CACHE_MAGIC, 8) != 0) {
		snprintf(why, whylen, "bad magic (not a dragon cache entry)");
		goto out_close;
	}
	if (get_le32(h + DG__CACHE_OFF_VERSION) != DG__CACHE_VERSION) {
		snprintf(why, whylen, "format version %u, expected %u",
			 get_le32(h + DG__CACHE_OFF_VERSION), DG__CACHE_VERSION);
		goto out_close;
	}
	if (get_le32(h + DG__CACHE_OFF_HSIZE) != HDR) {
		snprintf(why, whylen, "header size %u, expected %u",
			 get_le32(h + DG__CACHE_OFF_HSIZE), HDR);
		goto out_close;
	}
	if (memcmp(h + DG__CACHE_OFF_KEY, key, DG_CACHE_KEY_LEN) != 0) {
		char other[DG_CACHE_KEY_LEN + 1];
		for (int i = 0; i < DG_CACHE_KEY_LEN; i++) {
			uint8_t ch = h[DG__CACHE_OFF_KEY + i];
			other[i] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
		}
		other[DG_CACHE_KEY_LEN] = '\0';
		snprintf(why, whylen, "holds key %s, not the key in its name",
			 other);
		goto out_close;
	}
	if (isz > fsz - HDR || msz != fsz - HDR - isz || msz >= SIZE_MAX) {
		snprintf(why, whylen, "header sizes (image %llu + meta %llu) "
			 "do not match the file size %llu",
			 (unsigned long long)isz, (unsigned long long)msz,
			 (unsigned long long)fsz);
		goto out_close;
	}
	image = malloc(isz ? (size_t)isz : 1);
	meta = malloc((size_t)msz + 1);
	if (!image || !meta) {
		st = dg__cache_fail(c, DG_ERR_NOMEM, "out of memory reading "
				    "%s/kernels/%s (%llu bytes)", c->root, name,
				    (unsigned long long)fsz);
		goto out_free;
	}
	if ((r = read_full(fd, image, (size_t)isz)) != (ssize_t)isz ||
	    (r = read_full(fd, meta, (size_t)msz)) != (ssize_t)msz)
		goto out_short;
	meta[msz] = '\0';
	{
		dg__sha256 s;
		dg__sha256_init(&s);
		dg__sha256_update(&s, image, (size_t)isz);
		dg__sha256_update(&s, meta, (size_t)msz);
		dg__sha256_final(&s, sum);
	}
	memcpy(want, h + DG__CACHE_OFF_SUM, 32);
	if (memcmp(sum, want, 32) != 0) {
		snprintf(why, whylen, "checksum mismatch");
		goto out_free;
	}
	if (memchr(meta, '\0', (size_t)msz)) {
		snprintf(why, whylen, "metadata holds a NUL byte");
		goto out_free;
	}
	if (touch) {
		/* Record the use for LRU eviction. Best effort: a read-only
		 * cache still serves hits. */
		const struct timespec ts[2] = {
			{ .tv_nsec = UTIME_OMIT }, { .tv_nsec = UTIME_NOW },
		};
		futimens(fd, ts);
	}
	close(fd);
	out->image = image;
	out->image_size = (size_t)isz;
	out->meta = meta;
	return DG_OK;

out_short:
	if (r < 0) {
		st = dg__cache_fail(c, DG_ERR_IO, "%s/kernels/%s: read: %s",
				    c->root, name, strerror(errno));
		goto out_free;
	}
	snprintf(why, whylen, "shorter than its size while reading");
out_free:
	free(image);
	free(meta);
out_close:
	close(fd);
	return st;
}

bool dg__cache_has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && strcmp(s + n - m, suffix) == 0;
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
dg_status dg__cache_dir_list(dg_cache *c, int d, const char *suffix,
			  dg__cache_file **out, size_t *n)
{
	const char *sub = dg__cache_subdir_name[d];
	dg__cache_file *v = NULL, *grown;
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
		if (suffix && !dg__cache_has_suffix(de->d_name, suffix))
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

/* See cache_int.h. */
void dg__cache_quarantine(dg_cache *c, const char *name,
			  const struct stat *seen, char *res, size_t reslen)
{
	char qname[256 + 96];
	struct stat now;
	size_t stem = strlen(name);

	if (dg__cache_has_suffix(name, ".dgk"))
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

static int cmp_lru(const void *pa, const void *pb)
{
	const dg__cache_file *a = pa, *b = pb;
	int t = cmp_timespec(a->mtime, b->mtime);

	return t ? t : strcmp(a->name, b->name);
}

/* See cache_int.h. */
dg_status dg__cache_evict(dg_cache *c, uint64_t cap, const char *keep,
			  uint64_t *removed)
{
	dg__cache_file *v;
	size_t n;
	uint64_t total = 0;
	dg_status st = dg__cache_dir_list(c, DG__CACHE_KERNELS, ".dgk", &v, &n);

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
