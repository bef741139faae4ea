/*
 * safetensors files (runtime/store/safetensors.h): the strict reader (the atomic
 * writer is safetensors_write.c). The reader is a fuzz target (tests/fuzz/fuzz_safetensors.c): no
 * input may crash it or parse into something that does not write back and
 * read again the same. It also checks seals (a file's SHA-256 in its own
 * metadata, runtime/store/safetensors.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/msg.h"
#include "base/sha256.h"
#include "runtime/store/safetensors.h"
#include "runtime/store/safetensors_int.h"

#define MAX_SAFE_INT 9007199254740992.0 /* 2^53 */
#define MAX_FILE ((uint64_t)1 << 40)

static const struct {
	const char *name;
	size_t size;
} dtypes[DG_ST__COUNT] = {
#define DG__ST_ROW(e, s, n) [e] = { s, n },
	DG_SAFETENSORS_DTYPES(DG__ST_ROW)
#undef DG__ST_ROW
};

const char *dg_st_dtype_name(dg_st_dtype d)
{
	return (unsigned)d < DG_ST__COUNT ? dtypes[d].name : "?";
}

size_t dg_st_dtype_size(dg_st_dtype d)
{
	return (unsigned)d < DG_ST__COUNT ? dtypes[d].size : 0;
}

static bool dtype_from(const char *s, dg_st_dtype *out)
{
	for (int i = 0; i < DG_ST__COUNT; i++) {
		if (strcmp(s, dtypes[i].name) == 0) {
			*out = (dg_st_dtype)i;
			return true;
		}
	}
	return false;
}

bool dg__st_tensor_bytes(dg_st_dtype d, int ndim, const int64_t *shape, uint64_t *out)
{
	uint64_t n = dg_st_dtype_size(d);
	for (int i = 0; i < ndim; i++) {
		uint64_t e = (uint64_t)shape[i];
		if (e && n > ((uint64_t)1 << 62) / e)
			return false;
		n *= e;
	}
	*out = n;
	return true;
}

/* ---- reading ------------------------------------------------------------------ */

struct dg_safetensors {
	unsigned char *bytes; /* the whole file */
	size_t size;
	size_t header;        /* the header's bytes (after the 8 of its length) */
	dg_st_tensor *t;      /* by offset */
	size_t n;
	dg__st_meta *meta;
	size_t n_meta;
};

void dg_safetensors_destroy(dg_safetensors *f)
{
	if (!f)
		return;
	for (size_t i = 0; i < f->n; i++)
		free((char *)f->t[i].name);
	for (size_t i = 0; i < f->n_meta; i++) {
		free(f->meta[i].key);
		free(f->meta[i].value);
	}
	free(f->t);
	free(f->meta);
	free(f->bytes);
	free(f);
}

/* Strict UTF-8 (no overlongs, no surrogates, at most U+10FFFF); *bad gets
 * the offset of the first invalid byte. */
static bool utf8_ok(const unsigned char *s, size_t n, size_t *bad)
{
	for (size_t i = 0; i < n;) {
		unsigned c = s[i];
		size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
				       : (c & 0xf8) == 0xf0 ? 4 : 0;
		if (!len || i + len > n)
			goto fail;
		unsigned cp = len == 1 ? c : c & (0xff >> (len + 1));
		for (size_t k = 1; k < len; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				goto fail;
			cp = (cp << 6) | (s[i + k] & 0x3f);
		}
		if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
		    cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			goto fail;
		i += len;
		continue;
fail:
		*bad = i;
		return false;
	}
	return true;
}

/* The offset of a \u0000 escape (which cJSON would decode into a string
 * cut short), or n. */
static size_t nul_escape(const char *s, size_t n)
{
	for (size_t i = 0; i + 1 < n; i++) {
		if (s[i] != '\\')
			continue;
		if (s[i + 1] == 'u' && i + 6 <= n && memcmp(s + i + 2, "0000", 4) == 0)
			return i;
		i++;
	}
	return n;
}

static dg_status bad(char *msg, size_t size, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));


static dg_status bad(char *msg, size_t size, const char *name, const char *fmt, ...)
{
	char what[768];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return dg__msgf(DG_ERR_PARSE, msg, size, "%s: %s", name ? name : "safetensors", what);
}

/* A JSON number that is an integer in [0, 2^53]. */
static bool json_u53(const cJSON *it, uint64_t *out)
{
	if (!cJSON_IsNumber(it))
		return false;
	double v = it->valuedouble;
	if (!isfinite(v) || v < 0 || v > MAX_SAFE_INT || v != floor(v))
		return false;
	*out = (uint64_t)v;
	return true;
}

static dg_status parse_tensor(const cJSON *o, const char *file, dg_st_tensor *t,
			      uint64_t *begin, uint64_t *end, char *msg, size_t size)
{
	const cJSON *dt = NULL, *sh = NULL, *off = NULL;
	const char *name = o->string;

	if (!cJSON_IsObject(o))
		return bad(msg, size, file, "%s: expected an object {dtype, shape, data_offsets}", name);
	for (const cJSON *c = o->child; c; c = c->next) {
		const cJSON **slot = !c->string ? NULL
				     : strcmp(c->string, "dtype") == 0 ? &dt
				     : strcmp(c->string, "shape") == 0 ? &sh
				     : strcmp(c->string, "data_offsets") == 0 ? &off
									      : NULL;
		if (!slot)
			return bad(msg, size, file, "%s.%s: unknown field (a tensor has dtype, shape and data_offsets)",
				   name, c->string ? c->string : "?");
		if (*slot)
			return bad(msg, size, file, "%s.%s: given twice", name, c->string);
		*slot = c;
	}
	if (!dt || !cJSON_IsString(dt) || !dtype_from(dt->valuestring, &t->dtype))
		return bad(msg, size, file, "%s.dtype: %s", name,
			   !dt ? "missing" : "expected one of F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, F8_E4M3, F8_E5M2");
	if (!sh || !cJSON_IsArray(sh))
		return bad(msg, size, file, "%s.shape: %s", name, !sh ? "missing" : "expected an array");
	int nd = cJSON_GetArraySize(sh);
	if (nd > DG_SAFETENSORS_MAX_DIMS)
		return bad(msg, size, file, "%s.shape: %d dimensions; at most %d", name, nd,
			   DG_SAFETENSORS_MAX_DIMS);
	t->ndim = nd;
	int i = 0;
	for (const cJSON *e = sh->child; e; e = e->next, i++) {
		uint64_t v;
		if (!json_u53(e, &v) || v > (uint64_t)INT64_MAX)
			return bad(msg, size, file, "%s.shape[%d]: expected a non-negative integer", name, i);
		t->shape[i] = (int64_t)v;
	}
	if (!off || !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
	    !json_u53(off->child, begin) || !json_u53(off->child->next, end) || *begin > *end)
		return bad(msg, size, file, "%s.data_offsets: %s", name,
			   !off ? "missing" : "expected [begin, end], integers, begin <= end");
	if (!dg__st_tensor_bytes(t->dtype, t->ndim, t->shape, &t->bytes))
		return bad(msg, size, file, "%s.shape: its size overflows", name);
	if (*end - *begin != t->bytes)
		return bad(msg, size, file,
			   "%s.data_offsets: [%llu, %llu] is %llu bytes; %s of that shape takes %llu", name,
			   (unsigned long long)*begin, (unsigned long long)*end,
			   (unsigned long long)(*end - *begin), dg_st_dtype_name(t->dtype),
			   (unsigned long long)t->bytes);
	return DG_OK;
}

typedef struct span {
	uint64_t begin, end;
	size_t i;
} span;

static int cmp_span(const void *a, const void *b)
{
	const span *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return (x->i > y->i) - (x->i < y->i);
}

static int cmp_name(const void *a, const void *b)
{
	const dg_st_tensor *const *x = a, *const *y = b;
	return strcmp((*x)->name, (*y)->name);
}

static dg_status parse_meta(const cJSON *o, const char *file, dg_safetensors *f, char *msg,
			    size_t size)
{
	if (!cJSON_IsObject(o))
		return bad(msg, size, file, "__metadata__: expected an object of strings");
	size_t n = (size_t)cJSON_GetArraySize(o);
	f->meta = calloc(n ? n : 1, sizeof(*f->meta));
	if (!f->meta)
		return dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory reading %s", file);
	for (const cJSON *c = o->child; c; c = c->next) {
		if (!c->string || !cJSON_IsString(c))
			return bad(msg, size, file, "__metadata__.%s: expected a string",
				   c->string ? c->string : "?");
		for (size_t k = 0; k < f->n_meta; k++)
			if (strcmp(f->meta[k].key, c->string) == 0)
				return bad(msg, size, file, "__metadata__.%s: given twice", c->string);
		f->meta[f->n_meta].key = strdup(c->string);
		f->meta[f->n_meta].value = strdup(c->valuestring);
		if (!f->meta[f->n_meta].key || !f->meta[f->n_meta].value) {
			free(f->meta[f->n_meta].key);
			free(f->meta[f->n_meta].value);
			return dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory reading %s", file);
		}
		f->n_meta++;
	}
	return DG_OK;
}

static dg_status parse_header(dg_safetensors *f, const cJSON *root, const char *file,
			      uint64_t data_size, uint64_t data_at, char *msg, size_t size)
{
	size_t n = 0;
	dg_status st;

	if (!cJSON_IsObject(root))
		return bad(msg, size, file, "header: expected a JSON object");
	for (const cJSON *c = root->child; c; c = c->next)
		n += !c->string || strcmp(c->string, "__metadata__") != 0;
	f->t = calloc(n ? n : 1, sizeof(*f->t));
	span *sp = calloc(n ? n : 1, sizeof(*sp));
	if (!f->t || !sp) {
		free(sp);
		return dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory reading %s", file);
	}
	bool had_meta = false;
	st = DG_OK;
	for (const cJSON *c = root->child; c && !st; c = c->next) {
		if (!c->string || !c->string[0]) {
			st = bad(msg, size, file, "header: a tensor name is empty");
		} else if (strcmp(c->string, "__metadata__") == 0) {
			if (had_meta)
				st = bad(msg, size, file, "__metadata__: given twice");
			else
				st = parse_meta(c, file, f, msg, size);
			had_meta = true;
		} else {
			dg_st_tensor *t = &f->t[f->n];
			t->name = strdup(c->string);
			if (!t->name) {
				st = dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory reading %s", file);
				break;
			}
			f->n++;
			st = parse_tensor(c, file, t, &sp[f->n - 1].begin, &sp[f->n - 1].end, msg, size);
			sp[f->n - 1].i = f->n - 1;
		}
	}
	if (!st && f->n > 1) {
		/* names unique: a duplicated key would let two names share bytes */
		const dg_st_tensor **by = malloc(f->n * sizeof(*by));
		if (!by) {
			st = dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory reading %s", file);
		} else {
			for (size_t i = 0; i < f->n; i++)
				by[i] = &f->t[i];
			qsort(by, f->n, sizeof(*by), cmp_name);
			for (size_t i = 1; i < f->n && !st; i++)
				if (strcmp(by[i - 1]->name, by[i]->name) == 0)
					st = bad(msg, size, file, "%s: given twice", by[i]->name);
			free(by);
		}
	}
	if (!st) {
		/* the ranges tile the data area: sorted, no hole, no overlap */
		qsort(sp, f->n, sizeof(*sp), cmp_span);
		uint64_t at = 0;
		for (size_t k = 0; k < f->n && !st; k++) {
			if (sp[k].begin != at)
				st = bad(msg, size, file, "%s.data_offsets: begins at %llu, but the tensors before end at %llu (%s)",
					 f->t[sp[k].i].name, (unsigned long long)sp[k].begin,
					 (unsigned long long)at, sp[k].begin > at ? "a hole" : "an overlap");
			at = sp[k].end;
		}
		if (!st && at != data_size)
			st = bad(msg, size, file, "the tensors cover %llu bytes of data, the file holds %llu%s",
				 (unsigned long long)at, (unsigned long long)data_size,
				 at > data_size ? " (truncated?)" : "");
	}
	if (!st) {
		/* order by offset, data pointers into the copy */
		dg_st_tensor *sorted = malloc((f->n ? f->n : 1) * sizeof(*sorted));
		if (!sorted) {
			st = dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory reading %s", file);
		} else {
			for (size_t k = 0; k < f->n; k++) {
				sorted[k] = f->t[sp[k].i];
				sorted[k].data = f->bytes + data_at + sp[k].begin;
			}
			free(f->t);
			f->t = sorted;
		}
	}
	free(sp);
	return st;
}

dg_status dg_safetensors_parse(const void *bytes, size_t size, const char *name,
			       dg_safetensors **out, char *msg, size_t msg_size)
{
	const unsigned char *b = bytes;
	dg_status st;

	if (!out)
		return DG_ERR_INVALID_ARG;
	*out = NULL;
	if (!bytes && size)
		return DG_ERR_INVALID_ARG;
	if (size < 8)
		return bad(msg, msg_size, name, "%zu bytes; a safetensors file starts with an 8-byte header length",
			   size);
	uint64_t hn = 0;
	for (int i = 7; i >= 0; i--)
		hn = (hn << 8) | b[i];
	if (hn > DG_SAFETENSORS_MAX_HEADER)
		return bad(msg, msg_size, name, "header length %llu; at most %llu",
			   (unsigned long long)hn, (unsigned long long)DG_SAFETENSORS_MAX_HEADER);
	if (hn > size - 8)
		return bad(msg, msg_size, name, "header length %llu, but only %zu bytes follow (truncated?)",
			   (unsigned long long)hn, size - 8);
	const char *h = (const char *)b + 8;
	size_t bad_at;
	if (hn < 2 || h[0] != '{')
		return bad(msg, msg_size, name, "header: must start with '{'");
	if (memchr(h, '\0', (size_t)hn))
		return bad(msg, msg_size, name, "header: holds a NUL byte");
	if (!utf8_ok((const unsigned char *)h, (size_t)hn, &bad_at))
		return bad(msg, msg_size, name, "header: invalid UTF-8 at byte %zu", bad_at);
	if (nul_escape(h, (size_t)hn) < hn)
		return bad(msg, msg_size, name, "header: a \\u0000 escape; no name or value holds a NUL");
	const char *end = NULL;
	cJSON *root = cJSON_ParseWithLengthOpts(h, (size_t)hn, &end, false);
	if (!root)
		return bad(msg, msg_size, name, "header: invalid JSON near byte %zu",
			   end && end >= h ? (size_t)(end - h) : 0);
	for (const char *p = end; p < h + hn; p++) {
		if (*p != ' ') {
			cJSON_Delete(root);
			return bad(msg, msg_size, name, "header: text after the JSON object at byte %zu (only spaces may pad it)",
				   (size_t)(p - h));
		}
	}
	dg_safetensors *f = calloc(1, sizeof(*f));
	if (!f || !(f->bytes = malloc(size))) {
		free(f);
		cJSON_Delete(root);
		return dg__msgf(DG_ERR_NOMEM, msg, msg_size, "out of memory reading %s",
				name ? name : "safetensors");
	}
	memcpy(f->bytes, bytes, size);
	f->size = size;
	f->header = (size_t)hn;
	st = parse_header(f, root, name, size - 8 - hn, 8 + hn, msg, msg_size);
	cJSON_Delete(root);
	if (st) {
		dg_safetensors_destroy(f);
		return st;
	}
	*out = f;
	return DG_OK;
}

dg_status dg_safetensors_load(const char *path, dg_safetensors **out, char *msg, size_t msg_size)
{
	struct stat sb;

	if (!out)
		return DG_ERR_INVALID_ARG;
	*out = NULL;
	if (!path)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "safetensors: path is NULL");
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return dg__msgf(errno == ENOENT ? DG_ERR_NOT_FOUND : DG_ERR_IO, msg, msg_size, "%s: %s",
				path, strerror(errno));
	dg_status st = DG_OK;
	unsigned char *buf = NULL;
	if (fstat(fileno(fp), &sb) || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > MAX_FILE) {
		st = dg__msgf(DG_ERR_IO, msg, msg_size, "%s: not a regular file of at most 1 TiB", path);
	} else if (!(buf = malloc((size_t)sb.st_size + 1))) {
		st = dg__msgf(DG_ERR_NOMEM, msg, msg_size, "%s: out of memory (%lld bytes)", path,
			      (long long)sb.st_size);
	} else if (fread(buf, 1, (size_t)sb.st_size, fp) != (size_t)sb.st_size) {
		st = dg__msgf(DG_ERR_IO, msg, msg_size, "%s: read error (changed while reading?)", path);
	}
	fclose(fp);
	if (!st)
		st = dg_safetensors_parse(buf, (size_t)sb.st_size, path, out, msg, msg_size);
	free(buf);
	return st;
}

size_t dg_safetensors_count(const dg_safetensors *f)
{
	return f ? f->n : 0;
}

const dg_st_tensor *dg_safetensors_at(const dg_safetensors *f, size_t i)
{
	return f && i < f->n ? &f->t[i] : NULL;
}

const dg_st_tensor *dg_safetensors_find(const dg_safetensors *f, const char *name)
{
	for (size_t i = 0; f && name && i < f->n; i++)
		if (strcmp(f->t[i].name, name) == 0)
			return &f->t[i];
	return NULL;
}

const char *dg_safetensors_meta(const dg_safetensors *f, const char *key)
{
	for (size_t i = 0; f && key && i < f->n_meta; i++)
		if (strcmp(f->meta[i].key, key) == 0)
			return f->meta[i].value;
	return NULL;
}

size_t dg_safetensors_meta_count(const dg_safetensors *f)
{
	return f ? f->n_meta : 0;
}

bool dg_safetensors_meta_at(const dg_safetensors *f, size_t i, const char **key,
			    const char **value)
{
	if (!f || i >= f->n_meta)
		return false;
	*key = f->meta[i].key;
	*value = f->meta[i].value;
	return true;
}

/* ---- seals ---------------------------------------------------------------------- */

bool dg__st_seal_at(const char *h, size_t n, const char *key, size_t *at)
{
	char pat[80];
	int k = snprintf(pat, sizeof(pat), "\"%s\":\"", key);
	if (k < 0 || (size_t)k >= sizeof(pat) || (size_t)k > n)
		return false;
	size_t found = 0, where = 0;
	for (size_t i = 0; i + (size_t)k <= n; i++) {
		if (h[i] == '"' && memcmp(h + i, pat, (size_t)k) == 0) {
			found++;
			where = i + (size_t)k;
		}
	}
	if (found != 1 || where + 65 > n || h[where + 64] != '"')
		return false;
	*at = where;
	return true;
}

void dg_safetensors_data_sha256(const dg_safetensors *f, char hex[65])
{
	uint8_t d[32];
	size_t at = 8 + f->header;
	dg__sha256_digest(f->bytes + at, f->size - at, d);
	dg__sha256_hex(d, hex);
}

dg_status dg_safetensors_seal_check(const dg_safetensors *f, const char *key, char *msg,
				    size_t msg_size)
{
	if (!f || !key)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_safetensors_seal_check: NULL argument");
	const char *want = dg_safetensors_meta(f, key);
	if (!want)
		return dg__msgf(DG_ERR_NOT_FOUND, msg, msg_size, "no metadata %s", key);
	bool hex = strlen(want) == 64;
	for (size_t i = 0; hex && i < 64; i++)
		hex = (want[i] >= '0' && want[i] <= '9') || (want[i] >= 'a' && want[i] <= 'f');
	if (!hex)
		return dg__msgf(DG_ERR_CORRUPT, msg, msg_size, "its %s '%.80s' is not a SHA-256 (64 hex digits)",
				key, want);
	size_t at;
	const char *h = (const char *)f->bytes + 8;
	if (!dg__st_seal_at(h, f->header, key, &at) || memcmp(h + at, want, 64) != 0)
		return dg__msgf(DG_ERR_CORRUPT, msg, msg_size,
				"its %s is not written as a sealed file writes it (\"%s\":\"<64 hex digits>\" once in "
				"the header)",
				key, key);
	static const char zeros[65] = "0000000000000000000000000000000000000000000000000000000000000000";
	dg__sha256 s;
	uint8_t d[32];
	char got[65];
	at += 8;
	dg__sha256_init(&s);
	dg__sha256_update(&s, f->bytes, at);
	dg__sha256_update(&s, zeros, 64);
	dg__sha256_update(&s, f->bytes + at + 64, f->size - at - 64);
	dg__sha256_final(&s, d);
	dg__sha256_hex(d, got);
	if (memcmp(got, want, 64) != 0)
		return dg__msgf(DG_ERR_CORRUPT, msg, msg_size, "its bytes hash to %.16s..., its %s says %.16s...",
				got, key, want);
	return DG_OK;
}

/* ---- expecting a tensor ------------------------------------------------------------ */

static void shape_text(char *buf, size_t size, int ndim, const int64_t *shape)
{
	size_t n = 0;
	n += (size_t)snprintf(buf, size, "[");
	for (int i = 0; i < ndim && n < size; i++)
		n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
	if (n < size)
		snprintf(buf + n, size - n, "]");
}

dg_status dg_safetensors_expect(const dg_safetensors *f, const char *name, dg_st_dtype dtype,
				int ndim, const int64_t *shape, const dg_st_tensor **out,
				char *msg, size_t msg_size)
{
	char want[160], got[160];

	if (out)
		*out = NULL;
	const dg_st_tensor *t = dg_safetensors_find(f, name);
	shape_text(want, sizeof(want), ndim, shape);
	if (!t) {
		char have[512] = "";
		size_t n = 0;
		for (size_t i = 0; f && i < f->n && n < sizeof(have); i++) {
			int w = snprintf(have + n, sizeof(have) - n, "%s%s", i ? ", " : "", f->t[i].name);
			n += w > 0 ? (size_t)w : 0;
		}
		return dg__msgf(DG_ERR_NOT_FOUND, msg, msg_size,
				"%s: missing (expected %s %s; the file holds %s)", name, dg_st_dtype_name(dtype),
				want, f && f->n ? have : "no tensors");
	}
	bool match = t->dtype == dtype && t->ndim == ndim;
	for (int i = 0; match && i < ndim; i++)
		match = t->shape[i] == shape[i];
	if (!match) {
		shape_text(got, sizeof(got), t->ndim, t->shape);
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "%s: expected %s %s, got %s %s", name,
				dg_st_dtype_name(dtype), want, dg_st_dtype_name(t->dtype), got);
	}
	if (out)
		*out = t;
	return DG_OK;
}

