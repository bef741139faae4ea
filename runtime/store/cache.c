/*
 * dragon — the on-disk kernel cache (contract: include/dragon/cache.h,
 * entry layout: runtime/store/cache_int.h).
 *
 * A handle holds the root path and one directory descriptor per subfolder;
 * every file operation is relative to those (openat, renameat, ...), so
 * paths never need rebuilding and a long root cannot overflow a buffer.
 *
 * Why readers never see a bad entry:
 *  - an entry is only ever created by renaming a fully written and fsync'd
 *    temp file over kernels/<key>.dgk (base/publish.h); rename is atomic,
 *    so the name refers to a complete old file or a complete new one,
 *    never to a partial one;
 *  - a writer that dies leaves only tmp/<key>.dgk.tmp.<pid>.<hex>, which
 *    no reader opens; gc removes such files once they are a minute old;
 *  - whatever else happens to a file (disk error, a person editing it,
 *    truncation), a reader checks every header field and the checksum
 *    before handing bytes out, and quarantines the file otherwise.
 * Why concurrent builders build once: get_or_build takes an exclusive flock
 * on locks/<key>.lock and looks again before building, so the second
 * process finds the first one's entry. The kernel drops the lock when its
 * holder dies. Reading an entry, quarantine, the lock and eviction are in
 * runtime/store/cache_entry.c; stat, verify, gc and clear in cache_admin.c.
 */
#include "dragon/cache.h"

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/store/cache_int.h"
#include "base/publish.h"
#include "base/sha256.h"

void (*dg__cache_test_after_partial_write)(void);

#define DEFAULT_MAX_BYTES ((uint64_t)1 << 30)
#define HDR DG__CACHE_HEADER_SIZE


/* Reason of the last failed dg_cache_open on this thread (no handle then). */
static _Thread_local char open_errmsg[1024];


/* ---- small helpers --------------------------------------------------- */

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}




static dg_status key_check(dg_cache *c, const char *key)
{
	if (!key)
		return dg__cache_fail(c, DG_ERR_INVALID_ARG,
				      "cache key is NULL; pass the 64-hex-digit "
				      "SHA-256 of the entry's inputs");
	if (!dg__cache_key_valid(key))
		return dg__cache_fail(c, DG_ERR_INVALID_ARG,
				      "cache key \"%.80s\" is not 64 lowercase "
				      "hex digits; pass a SHA-256 in lowercase "
				      "hex", key);
	return DG_OK;
}


/* ---- open / close ---------------------------------------------------- */

static char *strip_dup(const char *s)
{
	size_t n = strlen(s);
	char *p;

	while (n > 1 && s[n - 1] == '/')
		n--;
	p = malloc(n + 1);
	if (p) {
		memcpy(p, s, n);
		p[n] = '\0';
	}
	return p;
}

static char *join(const char *a, const char *b)
{
	size_t na = strlen(a), nb = strlen(b);
	char *p = malloc(na + nb + 2);

	if (p)
		snprintf(p, na + nb + 2, "%s/%s", a, b);
	return p;
}

/* opts->dir, $DRAGON_CACHE_DIR, $XDG_CACHE_HOME/dragon, ~/.cache/dragon.
 * Empty variables count as unset; a relative $XDG_CACHE_HOME is ignored,
 * as the XDG base-directory spec asks. */
static dg_status root_choose(dg_cache *c, const dg_cache_opts *opts)
{
	const char *v;
	char *home, *cache_dir;

	if (opts && opts->dir && opts->dir[0])
		c->root = strip_dup(opts->dir);
	else if ((v = getenv("DRAGON_CACHE_DIR")) && v[0])
		c->root = strip_dup(v);
	else if ((v = getenv("XDG_CACHE_HOME")) && v[0] == '/')
		c->root = join(v, "dragon");
	else {
		struct passwd pw, *res = NULL;
		char buf[4096];

		v = getenv("HOME");
		if ((!v || !v[0]) &&
		    getpwuid_r(getuid(), &pw, buf, sizeof(buf), &res) == 0 && res)
			v = res->pw_dir;
		if (!v || !v[0])
			return dg__cache_fail(c, DG_ERR_INVALID_ARG,
					      "no cache folder: $HOME is not "
					      "set and the user has no home; "
					      "set DRAGON_CACHE_DIR");
		home = strip_dup(v);
		cache_dir = home ? join(home, ".cache") : NULL;
		c->root = cache_dir ? join(cache_dir, "dragon") : NULL;
		free(home);
		free(cache_dir);
	}
	if (!c->root)
		return dg__cache_fail(c, DG_ERR_NOMEM,
				      "out of memory opening the cache");
	return DG_OK;
}

/* Decimal digits only (no sign, space or suffix), no overflow, not 0. */
static bool parse_bytes(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (!*s)
		return false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return false;
		if (v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
			return false;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*out = v;
	return v > 0;
}

static dg_status cap_choose(dg_cache *c, const dg_cache_opts *opts)
{
	const char *v = getenv("DRAGON_CACHE_MAX_BYTES");

	if (opts && opts->max_bytes)
		c->max_bytes = opts->max_bytes;
	else if (v && v[0]) {
		if (!parse_bytes(v, &c->max_bytes))
			return dg__cache_fail(c, DG_ERR_INVALID_ARG,
					      "DRAGON_CACHE_MAX_BYTES=\"%.64s\" "
					      "is not a positive decimal number "
					      "of bytes (e.g. 1073741824); fix "
					      "or unset it", v);
	} else
		c->max_bytes = DEFAULT_MAX_BYTES;
	return DG_OK;
}

/* mkdir -p path, mode 0755. */
static dg_status mkdir_p(dg_cache *c, const char *path)
{
	char *p = strdup(path);
	struct stat sb;

	if (!p)
		return dg__cache_fail(c, DG_ERR_NOMEM,
				      "out of memory opening the cache");
	for (char *s = p + 1;; s++) {
		if (*s != '/' && *s != '\0')
			continue;
		char saved = *s;
		*s = '\0';
		int e = mkdir(p, 0755) < 0 ? errno : 0;
		if (e && e != EEXIST &&
		    !(stat(p, &sb) == 0 && S_ISDIR(sb.st_mode))) {
			dg_status st = dg__cache_fail(
				c, DG_ERR_IO, "cannot create cache folder %s: "
				"%s; set DRAGON_CACHE_DIR to a writable folder",
				p, strerror(e));
			free(p);
			return st;
		}
		*s = saved;
		if (!saved)
			break;
	}
	free(p);
	return DG_OK;
}

/* Opens the root and its folders, making them unless no_create (then one
 * that is missing is DG_ERR_NOT_FOUND). */
static dg_status dirs_open(dg_cache *c, bool no_create)
{
	dg_status st = no_create ? DG_OK : mkdir_p(c, c->root);

	if (st)
		return st;
	c->root_fd = open(c->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (c->root_fd < 0)
		return dg__cache_fail(c, no_create && errno == ENOENT ? DG_ERR_NOT_FOUND
								      : DG_ERR_IO,
				      "cannot open cache folder %s: %s%s", c->root,
				      strerror(errno),
				      no_create ? "" : "; set DRAGON_CACHE_DIR to a "
						       "writable folder");
	for (int d = 0; d < DG__CACHE_NDIRS; d++) {
		const char *sub = dg__cache_subdir_name[d];

		if (!no_create && mkdirat(c->root_fd, sub, 0755) < 0 && errno != EEXIST)
			return dg__cache_fail(c, DG_ERR_IO, "cannot create "
					      "%s/%s: %s", c->root, sub,
					      strerror(errno));
		c->dfd[d] = openat(c->root_fd, sub,
				   O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (c->dfd[d] < 0)
			return dg__cache_fail(c, no_create && errno == ENOENT
						      ? DG_ERR_NOT_FOUND : DG_ERR_IO,
					      "cannot open %s/%s: %s", c->root, sub,
					      strerror(errno));
	}
	return DG_OK;
}

dg_status dg_cache_open(dg_cache **out, const dg_cache_opts *opts)
{
	dg_cache *c;
	dg_status st;

	if (!out) {
		snprintf(open_errmsg, sizeof(open_errmsg),
			 "dg_cache_open: out is NULL");
		return DG_ERR_INVALID_ARG;
	}
	*out = NULL;
	c = calloc(1, sizeof(*c));
	if (!c) {
		snprintf(open_errmsg, sizeof(open_errmsg),
			 "out of memory opening the cache");
		return DG_ERR_NOMEM;
	}
	c->root_fd = -1;
	for (int d = 0; d < DG__CACHE_NDIRS; d++)
		c->dfd[d] = -1;

	st = root_choose(c, opts);
	if (!st)
		st = cap_choose(c, opts);
	if (!st)
		st = dirs_open(c, opts && opts->no_create);
	if (st) {
		memcpy(open_errmsg, c->errmsg, sizeof(open_errmsg));
		dg_cache_close(c);
		return st;
	}
	open_errmsg[0] = '\0';
	*out = c;
	return DG_OK;
}

void dg_cache_close(dg_cache *cache)
{
	if (!cache)
		return;
	for (int d = 0; d < DG__CACHE_NDIRS; d++)
		if (cache->dfd[d] >= 0)
			close(cache->dfd[d]);
	if (cache->root_fd >= 0)
		close(cache->root_fd);
	free(cache->root);
	free(cache);
}

/* NULL: the reason the last dg_cache_open on this thread failed. */
const char *dg_cache_errmsg(const dg_cache *cache)
{
	return cache ? cache->errmsg : open_errmsg;
}

const char *dg_cache_root(const dg_cache *cache)
{
	return cache ? cache->root : "";
}

void dg_cache_blob_free(dg_cache_blob *blob)
{
	if (!blob)
		return;
	free(blob->image);
	free(blob->meta);
	blob->image = NULL;
	blob->image_size = 0;
	blob->meta = NULL;
}

/* ---- reading and quarantining entries -------------------------------- */


dg_status dg_cache_get(dg_cache *cache, const char *key, dg_cache_blob *out)
{
	char name[DG_CACHE_KEY_LEN + 5], why[256], res[512];
	struct stat seen;
	dg_status st;

	if (!cache)
		return DG_ERR_INVALID_ARG;
	cache->errmsg[0] = '\0';
	if (!out)
		return dg__cache_fail(cache, DG_ERR_INVALID_ARG,
				      "dg_cache_get: out is NULL");
	memset(out, 0, sizeof(*out));
	st = key_check(cache, key);
	if (st)
		return st;
	snprintf(name, sizeof(name), "%s.dgk", key);
	st = dg__cache_entry_read(cache, name, key, true, out, why, sizeof(why),
				  &seen);
	if (st == DG_ERR_NOT_FOUND)
		return dg__cache_fail(cache, st, "no cache entry kernels/%s in "
				      "%s", name, cache->root);
	if (st == DG_ERR_CORRUPT) {
		dg__cache_quarantine(cache, name, &seen, res, sizeof(res));
		return dg__cache_fail(cache, DG_ERR_NOT_FOUND, "cache entry "
				      "kernels/%s in %s: %s (%s); it will be "
				      "rebuilt", name, cache->root, why, res);
	}
	return st;
}

/* ---- publishing and eviction ----------------------------------------- */

typedef struct span {
	const uint8_t *p;
	size_t n;
} span;

/* Writes bytes [from, to) of the concatenation of spans. */
static dg_status write_spans(dg__publish *p, const span *s, int ns, size_t from, size_t to)
{
	size_t base = 0;
	dg_status st = DG_OK;

	for (int i = 0; i < ns && !st; base += s[i].n, i++) {
		size_t lo = from > base ? from - base : 0;
		size_t hi = to - base < s[i].n ? to - base : s[i].n;
		if (to <= base)
			break;
		if (lo < hi)
			st = dg__publish_write(p, s[i].p + lo, hi - lo, NULL, 0);
	}
	return st;
}

/* What each step of a publish is called in the cache's messages. */
static const char *const step_names[] = {
	[DG__PUBLISH_CREATE] = "open",
	[DG__PUBLISH_WRITE] = "write",
	[DG__PUBLISH_FSYNC] = "fsync",
	[DG__PUBLISH_CLOSE] = "close",
	[DG__PUBLISH_RENAME] = "rename into kernels/",
};

/* Publishes tmp/<key>.dgk.tmp.<pid>.<hex> as kernels/<key>.dgk
 * (base/publish.h: write, fsync, rename, fsync of kernels/). */
static dg_status entry_publish(dg_cache *c, const char *key,
			       const uint8_t *image, size_t isz,
			       const char *meta, size_t msz)
{
	char name[DG_CACHE_KEY_LEN + 5];
	uint8_t h[HDR], sum[32];
	dg__sha256 s;
	dg__publish p;

	dg__sha256_init(&s);
	dg__sha256_update(&s, image, isz);
	dg__sha256_update(&s, meta, msz);
	dg__sha256_final(&s, sum);
	memset(h, 0, sizeof(h));
	memcpy(h, DG__CACHE_MAGIC, 8);
	put_le32(h + DG__CACHE_OFF_VERSION, DG__CACHE_VERSION);
	put_le32(h + DG__CACHE_OFF_HSIZE, HDR);
	memcpy(h + DG__CACHE_OFF_KEY, key, DG_CACHE_KEY_LEN);
	put_le64(h + DG__CACHE_OFF_IMAGE_SIZE, isz);
	put_le64(h + DG__CACHE_OFF_META_SIZE, msz);
	memcpy(h + DG__CACHE_OFF_SUM, sum, 32);

	snprintf(name, sizeof(name), "%s.dgk", key);
	const span sp[3] = {
		{ h, HDR }, { image, isz }, { (const uint8_t *)meta, msz },
	};
	size_t total = HDR + isz + msz;
	dg_status st = dg__publish_begin_at(&p, c->dfd[DG__CACHE_TMP], c->dfd[DG__CACHE_KERNELS],
					    name, 0644, NULL, 0);
	if (!st)
		st = write_spans(&p, sp, 3, 0, total / 2);
	if (!st && dg__cache_test_after_partial_write)
		dg__cache_test_after_partial_write();
	if (!st)
		st = write_spans(&p, sp, 3, total / 2, total);
	if (!st)
		st = dg__publish_commit(&p, NULL, 0);
	if (!st)
		return DG_OK;
	if (p.failed == DG__PUBLISH_SYNC_DIR)
		return dg__cache_fail(c, DG_ERR_IO, "%s/kernels: fsync: %s; "
				      "the entry for %s may not survive a "
				      "power loss", c->root, strerror(p.err),
				      key);
	if (p.failed == DG__PUBLISH_CREATE && p.err == EEXIST)
		return dg__cache_fail(c, DG_ERR_IO, "%s/tmp: no free temp file "
				      "name; nothing was published", c->root);
	return dg__cache_fail(c, DG_ERR_IO, "%s/tmp/%s: %s: %s; nothing was "
			      "published", c->root, p.tmp,
			      p.failed ? step_names[p.failed] : "publish",
			      p.failed ? strerror(p.err) : dg_status_str(st));
}

dg_status dg_cache_put(dg_cache *cache, const char *key, const uint8_t *image,
		       size_t image_size, const char *meta)
{
	char name[DG_CACHE_KEY_LEN + 5];
	dg_status st;

	if (!cache)
		return DG_ERR_INVALID_ARG;
	cache->errmsg[0] = '\0';
	st = key_check(cache, key);
	if (st)
		return st;
	if (!image && image_size)
		return dg__cache_fail(cache, DG_ERR_INVALID_ARG,
				      "dg_cache_put: image is NULL but "
				      "image_size is %zu", image_size);
	if (!meta)
		meta = "";
	st = entry_publish(cache, key, image, image_size, meta, strlen(meta));
	if (st)
		return st;
	/* Eviction is housekeeping: the entry is published whatever happens
	 * here, and the next put or gc tries again. */
	snprintf(name, sizeof(name), "%s.dgk", key);
	dg__cache_evict(cache, cache->max_bytes, name, NULL);
	cache->errmsg[0] = '\0';
	return DG_OK;
}

/* ---- get_or_build ---------------------------------------------------- */

dg_status dg_cache_get_or_build(dg_cache *cache, const char *key,
				dg_cache_build_fn build, void *user,
				dg_cache_blob *out, bool *hit)
{
	char why[sizeof(cache->errmsg)] = ""; /* why the cache was bypassed */
	uint8_t *image = NULL;
	size_t size = 0;
	char *meta = NULL;
	dg_status st;
	int lock = -1;

	if (hit)
		*hit = false;
	if (!cache)
		return DG_ERR_INVALID_ARG;
	cache->errmsg[0] = '\0';
	if (!out || !build)
		return dg__cache_fail(cache, DG_ERR_INVALID_ARG,
				      "dg_cache_get_or_build: out and build "
				      "must not be NULL");
	st = dg_cache_get(cache, key, out);
	if (st != DG_ERR_NOT_FOUND)
		goto out_hit; /* a hit, a bad key or an i/o error */
	/* The cache is an optimisation: one we cannot lock (read-only, full)
	 * still builds, and at worst processes build the key once each. */
	if (dg__cache_lock_take(cache, key, &lock)) {
		snprintf(why, sizeof(why), "%s", cache->errmsg);
	} else {
		/* Another process may have built it while we waited. */
		st = dg_cache_get(cache, key, out);
		if (st != DG_ERR_NOT_FOUND)
			goto out_hit;
	}

	cache->errmsg[0] = '\0';
	st = build(user, &image, &size, &meta);
	if (st) {
		/* What the builder set on failure is its own business. */
		dg__cache_fail(cache, st, "building cache entry %s failed (%s); "
			       "nothing was published; the builder's own "
			       "state has the reason", key, dg_status_str(st));
		goto out_unlock;
	}
	if (!image && size) {
		free(meta);
		st = dg__cache_fail(cache, DG_ERR_INTERNAL, "the builder of "
				    "cache entry %s returned DG_OK, a NULL "
				    "image and size %zu", key, size);
		goto out_unlock;
	}
	/* Neither a failed publish nor a missing lock fails the call: the
	 * caller gets the bytes it asked for, the message says why the cache
	 * did not help. */
	if (dg_cache_put(cache, key, image, size, meta)) {
		snprintf(why, sizeof(why), "%s", cache->errmsg);
		dg__cache_fail(cache, DG_OK, "cache entry %s was built and "
			       "returned but could not be stored: %s", key,
			       why);
	} else if (why[0]) {
		dg__cache_fail(cache, DG_OK, "cache entry %s was built and "
			       "stored without its build lock: %s", key, why);
	}
	if (!image)
		image = malloc(1);
	if (!meta)
		meta = calloc(1, 1);
	if (!image || !meta) {
		free(image);
		free(meta);
		st = dg__cache_fail(cache, DG_ERR_NOMEM, "out of memory "
				    "returning cache entry %s", key);
		goto out_unlock;
	}
	out->image = image; /* the bytes just built */
	out->image_size = size;
	out->meta = meta;
	goto out_unlock;

out_hit:
	if (!st && hit)
		*hit = true;
out_unlock:
	if (lock >= 0)
		close(lock); /* releases the flock */
	return st;
}
