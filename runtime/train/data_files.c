/*
 * What a --data names (dragon/data.h dg_corpus_open_with): a list or a
 * glob of llm.c shards, a folder of tokens, a file; each file opened as
 * only a regular file is (base/file.h), its header checked, its size held
 * to what the header or its format says, then mapped read-only (a byte
 * file is read whole, as it always was); and which files validate.
 */
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/msg.h"
#include "runtime/train/data_int.h"

/* A growing list of paths (owned). */
typedef struct names {
	char **v;
	int n, cap;
} names;

static void names_free(names *l)
{
	for (int i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
	memset(l, 0, sizeof(*l));
}

static dg_status names_add(names *l, const char *p, size_t len, char *msg, size_t size)
{
	if (l->n == l->cap) {
		int cap = l->cap ? 2 * l->cap : 8;
		char **v = realloc(l->v, (size_t)cap * sizeof(*v));
		if (!v)
			return dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory (a list of %d files)", l->n);
		l->v = v;
		l->cap = cap;
	}
	char *s = malloc(len + 1);
	if (!s)
		return dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory");
	memcpy(s, p, len);
	s[len] = '\0';
	l->v[l->n++] = s;
	return DG_OK;
}

static bool has(const names *l, const char *p)
{
	for (int i = 0; i < l->n; i++)
		if (strcmp(l->v[i], p) == 0)
			return true;
	return false;
}

static bool is_glob(const char *s)
{
	return strpbrk(s, "*?[") != NULL;
}

/* The files pat matches, sorted by name, appended to l (those already in
 * it skipped). None: DG_ERR_NOT_FOUND naming pat when must, else DG_OK. */
static dg_status expand(names *l, const char *pat, bool must, char *msg, size_t size)
{
	glob_t g;
	int r = glob(pat, 0, NULL, &g);
	if (r == GLOB_NOMATCH) {
		globfree(&g);
		return must ? dg__msgf(DG_ERR_NOT_FOUND, msg, size, "%s: no file matches", pat) : DG_OK;
	}
	if (r) {
		globfree(&g);
		return dg__msgf(r == GLOB_NOSPACE ? DG_ERR_NOMEM : DG_ERR_IO, msg, size, "%s: %s", pat,
				r == GLOB_NOSPACE ? "out of memory" : "a folder it reads cannot be listed");
	}
	dg_status st = DG_OK;
	for (size_t i = 0; i < g.gl_pathc && !st; i++)
		if (!has(l, g.gl_pathv[i]))
			st = names_add(l, g.gl_pathv[i], strlen(g.gl_pathv[i]), msg, size);
	globfree(&g);
	return st;
}

/* The first n characters of s into buf with glob(3)'s special ones
 * escaped, so a folder named "a[1]" is matched as itself. */
static const char *escaped(char *buf, size_t size, const char *s, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n && s[i] && k + 2 < size; i++) {
		if (strchr("*?[]\\", s[i]))
			buf[k++] = '\\';
		buf[k++] = s[i];
	}
	buf[k] = '\0';
	return buf;
}

static const char *base_of(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

static bool ends_with(const char *s, const char *tail)
{
	size_t n = strlen(s), m = strlen(tail);
	return n >= m && strcmp(s + n - m, tail) == 0;
}

/* The split llm.c's name gives a shard: 1 validate (*_val_*.bin), 0 train
 * (*_train_*.bin), -1 neither. */
static int shard_role(const char *path)
{
	const char *b = base_of(path);
	if (!ends_with(b, ".bin"))
		return -1;
	return strstr(b, "_val_") ? 1 : strstr(b, "_train_") ? 0 : -1;
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Maps f's file (fp, n bytes) read-only; closes fp. */
static dg_status map_file(dg__corpus_file *f, FILE *fp, uint64_t n, char *msg, size_t size)
{
	void *m = NULL;
	if (n > 0) {
		m = mmap(NULL, (size_t)n, PROT_READ, MAP_PRIVATE, fileno(fp), 0);
		if (m == MAP_FAILED) {
			int e = errno;
			fclose(fp);
			return dg__msgf(e == ENOMEM ? DG_ERR_NOMEM : DG_ERR_IO, msg, size, "%s: mapping %llu bytes: %s",
					f->path, (unsigned long long)n, strerror(e));
		}
		madvise(m, (size_t)n, MADV_WILLNEED); /* advice: its failure changes nothing */
	}
	fclose(fp);
	f->map = m;
	f->map_bytes = (size_t)n;
	f->tok = m ? (const uint8_t *)m + f->off : NULL;
	return DG_OK;
}

/* An llm.c shard: its header checked (magic, version, count), its size
 * the header's count of uint16 tokens after it, exactly. */
static dg_status open_shard(dg__corpus_file *f, char *msg, size_t size)
{
	FILE *fp;
	uint64_t n;
	uint8_t h[DG_SHARD_HEADER_BYTES];
	dg_status st = dg__file_open_regular(f->path, &fp, &n, msg, size);
	if (st)
		return st;
	size_t got = fread(h, 1, n < sizeof(h) ? (size_t)n : sizeof(h), fp);
	if (got != (n < sizeof(h) ? (size_t)n : sizeof(h))) {
		int e = ferror(fp) ? errno : EIO;
		fclose(fp);
		return dg__msgf(DG_ERR_IO, msg, size, "%s: reading its header: %s", f->path, strerror(e));
	}
	const char *what = NULL;
	char why[200];
	uint64_t at = 0;
	if (n >= 4 && le32(h) != DG_SHARD_MAGIC) {
		snprintf(why, sizeof(why), "magic %u, not llm.c's %d: not a token shard", le32(h), DG_SHARD_MAGIC);
		what = why, at = 0;
	} else if (n >= 8 && le32(h + 4) != DG_SHARD_VERSION) {
		snprintf(why, sizeof(why), "version %d: dragon reads llm.c's version %d (uint16 tokens)",
			 (int32_t)le32(h + 4), DG_SHARD_VERSION);
		what = why, at = 4;
	} else if (n < DG_SHARD_HEADER_BYTES) {
		snprintf(why, sizeof(why), "truncated: %llu bytes, short of the %d-byte header (256 int32)",
			 (unsigned long long)n, DG_SHARD_HEADER_BYTES);
		what = why, at = n;
	} else if ((int32_t)le32(h + 8) < 0) {
		snprintf(why, sizeof(why), "token count %d: negative", (int32_t)le32(h + 8));
		what = why, at = 8;
	}
	if (what) {
		fclose(fp);
		return dg__msgf(DG_ERR_CORRUPT, msg, size, "%s: byte offset %llu: %s", f->path, (unsigned long long)at,
				what);
	}
	uint64_t count = le32(h + 8), want = DG_SHARD_HEADER_BYTES + 2 * count;
	if (n != want) {
		fclose(fp);
		if (n < want)
			return dg__msgf(DG_ERR_CORRUPT, msg, size,
					"%s: byte offset %llu: truncated: the header (byte offset 8) counts %llu tokens, "
					"%llu bytes with the header, and the file ends here",
					f->path, (unsigned long long)n, (unsigned long long)count,
					(unsigned long long)want);
		return dg__msgf(DG_ERR_CORRUPT, msg, size,
				"%s: byte offset %llu: %llu bytes past the %llu tokens the header (byte offset 8) counts",
				f->path, (unsigned long long)want, (unsigned long long)(n - want),
				(unsigned long long)count);
	}
	f->off = DG_SHARD_HEADER_BYTES;
	f->width = 2;
	f->n = (size_t)count;
	return map_file(f, fp, n, msg, size);
}

/* Raw uint16 tokens: an even size. */
static dg_status open_raw(dg__corpus_file *f, char *msg, size_t size)
{
	FILE *fp;
	uint64_t n;
	dg_status st = dg__file_open_regular(f->path, &fp, &n, msg, size);
	if (st)
		return st;
	if (n % 2) {
		fclose(fp);
		return dg__msgf(DG_ERR_CORRUPT, msg, size,
				"%s: byte offset %llu: truncated: %llu bytes, an odd count, so its last uint16 token "
				"is cut short",
				f->path, (unsigned long long)(n - 1), (unsigned long long)n);
	}
	f->off = 0;
	f->width = 2;
	f->n = (size_t)(n / 2);
	return map_file(f, fp, n, msg, size);
}

/* A byte file, read whole into c->bytes. */
static dg_status open_bytes(dg_corpus *c, dg__corpus_file *f, char *msg, size_t size)
{
	FILE *fp;
	uint64_t n;
	dg_status st = dg__file_open_regular(f->path, &fp, &n, msg, size);
	if (st)
		return st;
	if (n >= SIZE_MAX || !(c->bytes = malloc((size_t)n + 1))) {
		fclose(fp);
		return dg__msgf(DG_ERR_NOMEM, msg, size, "%s: %llu bytes: out of memory", f->path,
				(unsigned long long)n);
	}
	size_t got = fread(c->bytes, 1, (size_t)n, fp);
	fclose(fp);
	if (got != (size_t)n)
		return dg__msgf(DG_ERR_IO, msg, size, "%s: read %zu of %zu bytes", f->path, got, (size_t)n);
	f->tok = c->bytes;
	f->n = (size_t)n;
	f->width = 1;
	return DG_OK;
}

/* Whether path is a regular file that starts with llm.c's shard magic
 * (a path that cannot be opened: no; its opening says why later). */
static bool starts_as_shard(const char *path)
{
	FILE *fp;
	uint64_t n;
	char m[8];
	uint8_t h[4];
	if (dg__file_open_regular(path, &fp, &n, m, sizeof(m)))
		return false;
	bool yes = n >= 4 && fread(h, 1, 4, fp) == 4 && le32(h) == DG_SHARD_MAGIC;
	fclose(fp);
	return yes;
}

static bool is_file(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* dir/name into buf. */
static const char *join(char *buf, size_t size, const char *dir, size_t dir_len, const char *name)
{
	snprintf(buf, size, "%.*s%s%s", (int)dir_len, dir, dir_len ? "/" : "", name);
	return buf;
}

/* What data names: the files of each split (val empty: the 90/10 split),
 * the kind, and how the split was made. */
typedef struct resolved {
	names train, val;
	dg_corpus_kind kind;
	char split[160];
} resolved;

/* Given shards g (roles by name): which validate. */
static dg_status shard_split(resolved *r, names *g, char *msg, size_t size)
{
	int nval = 0, ntrain = 0;
	dg_status st = DG_OK;
	for (int i = 0; i < g->n; i++)
		nval += shard_role(g->v[i]) == 1, ntrain += shard_role(g->v[i]) == 0;
	if (nval > 0 && nval < g->n) { /* both given */
		for (int i = 0; i < g->n && !st; i++)
			st = names_add(shard_role(g->v[i]) == 1 ? &r->val : &r->train, g->v[i], strlen(g->v[i]), msg,
				       size);
		snprintf(r->split, sizeof(r->split), "the %d *_val_* shard%s given", nval, nval == 1 ? "" : "s");
		return st;
	}
	r->train = *g;
	memset(g, 0, sizeof(*g));
	if (nval == 0 && ntrain > 0) { /* the val shards beside the train ones */
		char pat[8500], pre[8400];
		for (int i = 0; i < r->train.n && !st; i++) {
			const char *p = r->train.v[i], *b = base_of(p), *t = strstr(b, "_train_");
			if (shard_role(p) != 0)
				continue;
			snprintf(pat, sizeof(pat), "%s_val_*.bin", escaped(pre, sizeof(pre), p, (size_t)(t - p)));
			st = expand(&r->val, pat, false, msg, size);
		}
		if (!st && r->val.n)
			snprintf(r->split, sizeof(r->split), "the %d *_val_* shard%s beside the train ones", r->val.n,
				 r->val.n == 1 ? "" : "s");
	}
	return st;
}

/* A folder: train.bin (and val.bin), else llm.c's shards in it. */
static dg_status resolve_dir(resolved *r, const char *dir, char *msg, size_t size)
{
	char p[8600];
	size_t dl = strlen(dir);
	while (dl > 1 && dir[dl - 1] == '/')
		dl--;
	if (is_file(join(p, sizeof(p), dir, dl, "train.bin"))) {
		r->kind = DG_CORPUS_KIND_TOKENS;
		dg_status st = names_add(&r->train, p, strlen(p), msg, size);
		if (!st && is_file(join(p, sizeof(p), dir, dl, "val.bin"))) {
			st = names_add(&r->val, p, strlen(p), msg, size);
			snprintf(r->split, sizeof(r->split), "val.bin");
		}
		return st;
	}
	names g = { 0 };
	char e[8400];
	escaped(e, sizeof(e), dir, dl);
	dg_status st = expand(&g, join(p, sizeof(p), e, strlen(e), "*_train_*.bin"), false, msg, size);
	if (!st)
		st = expand(&g, join(p, sizeof(p), e, strlen(e), "*_val_*.bin"), false, msg, size);
	if (!st && g.n == 0)
		st = dg__msgf(DG_ERR_IO, msg, size,
			      "%s: a directory, not a regular file (nor a folder of tokens: train.bin and val.bin, "
			      "or llm.c's *_train_*.bin shards)",
			      dir);
	r->kind = DG_CORPUS_KIND_SHARDS;
	if (!st)
		st = shard_split(r, &g, msg, size);
	names_free(&g);
	return st;
}

static dg_status resolve(resolved *r, const char *data, int vocab, char *msg, size_t size)
{
	dg_status st = DG_OK;
	struct stat sb;
	const bool there = lstat(data, &sb) == 0; /* a path that is there is itself, whatever its characters */
	if (!there && (strchr(data, ',') || is_glob(data))) { /* a list of shards */
		names g = { 0 };
		for (const char *p = data; !st;) {
			size_t n = strcspn(p, ",");
			char item[4200];
			if (n == 0 || n >= sizeof(item)) {
				st = dg__msgf(DG_ERR_INVALID_ARG, msg, size,
					      "%s: %s item in the list of shards (paths or globs, comma-separated)", data,
					      n ? "too long an" : "an empty");
				break;
			}
			memcpy(item, p, n);
			item[n] = '\0';
			st = is_glob(item) ? expand(&g, item, true, msg, size) : names_add(&g, item, n, msg, size);
			if (!p[n])
				break;
			p += n + 1;
		}
		r->kind = DG_CORPUS_KIND_SHARDS;
		if (!st)
			st = shard_split(r, &g, msg, size);
		names_free(&g);
		return st;
	}
	if (there && stat(data, &sb) == 0 && S_ISDIR(sb.st_mode))
		return resolve_dir(r, data, msg, size);
	if (shard_role(data) >= 0 || starts_as_shard(data)) {
		names g = { 0 };
		r->kind = DG_CORPUS_KIND_SHARDS;
		st = names_add(&g, data, strlen(data), msg, size);
		if (!st)
			st = shard_split(r, &g, msg, size);
		names_free(&g);
		return st;
	}
	r->kind = vocab && vocab != 256 ? DG_CORPUS_KIND_TOKENS : DG_CORPUS_KIND_BYTES;
	st = names_add(&r->train, data, strlen(data), msg, size);
	if (!st && r->kind == DG_CORPUS_KIND_TOKENS && strcmp(base_of(data), "train.bin") == 0) {
		char p[4200];
		snprintf(p, sizeof(p), "%.*sval.bin", (int)(base_of(data) - data), data);
		if (is_file(p)) {
			st = names_add(&r->val, p, strlen(p), msg, size);
			snprintf(r->split, sizeof(r->split), "val.bin");
		}
	}
	return st;
}

void dg__corpus_files_close(struct dg_corpus_files *fs)
{
	if (!fs)
		return;
	for (int i = 0; i < fs->n; i++) {
		if (fs->f[i].map)
			munmap(fs->f[i].map, fs->f[i].map_bytes);
		free(fs->f[i].path);
	}
	free(fs);
}

dg_status dg__corpus_files_open(dg_corpus *c, const char *data, int vocab, char *msg, size_t size)
{
	if (vocab && (vocab < 2 || vocab > DG_CORPUS_MAX_VOCAB))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "vocab=%d: must be 2 to %d (uint16 tokens)", vocab,
				DG_CORPUS_MAX_VOCAB);
	resolved r = { 0 };
	snprintf(r.split, sizeof(r.split), "the last 10%%");
	dg_status st = resolve(&r, data, vocab, msg, size);
	if (!st && r.kind == DG_CORPUS_KIND_TOKENS && !vocab)
		st = dg__msgf(DG_ERR_INVALID_ARG, msg, size,
			      "%s: raw uint16 tokens: give their vocabulary (--vocab V; GPT-2's tokens: 50257, or "
			      "50304 padded as llm.c pads it)",
			      r.train.n ? r.train.v[0] : data);
	const int n = r.train.n + r.val.n;
	struct dg_corpus_files *fs = NULL;
	if (!st && !(fs = calloc(1, sizeof(*fs) + (size_t)n * sizeof(fs->f[0]))))
		st = dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory");
	for (int i = 0; !st && i < n; i++) {
		dg__corpus_file *f = &fs->f[i];
		names *l = i < r.train.n ? &r.train : &r.val;
		int k = i < r.train.n ? i : i - r.train.n;
		f->path = l->v[k];
		l->v[k] = NULL; /* fs owns it now */
		fs->n = i + 1;
		f->role = r.val.n == 0 ? 2 : i < r.train.n ? 0 : 1;
		st = r.kind == DG_CORPUS_KIND_SHARDS   ? open_shard(f, msg, size)
		     : r.kind == DG_CORPUS_KIND_TOKENS ? open_raw(f, msg, size)
						       : open_bytes(c, f, msg, size);
	}
	if (!st) {
		size_t at = 0, train = 0;
		uint64_t bytes = 0;
		for (int i = 0; i < n; i++) {
			fs->f[i].start = at;
			at += fs->f[i].n;
			train += fs->f[i].role != 1 ? fs->f[i].n : 0;
			bytes += fs->f[i].off + (uint64_t)fs->f[i].n * fs->f[i].width;
		}
		c->files = fs;
		c->kind = (int)r.kind;
		c->vocab = r.kind == DG_CORPUS_KIND_BYTES ? 256 : vocab ? vocab : DG_SHARD_VOCAB;
		c->len = at;
		c->train_len = r.val.n ? train : at - at / 10;
		c->n_files = n;
		c->n_val_files = r.val.n;
		c->file_bytes = bytes;
		snprintf(c->split, sizeof(c->split), "%s", r.split);
		snprintf(c->path, sizeof(c->path), "%s", data);
	} else {
		dg__corpus_files_close(fs);
	}
	names_free(&r.train);
	names_free(&r.val);
	return st;
}
