/*
 * The bundle manifest: model, strict JSON reader, writer, loader.
 *
 * A manifest is read by tools that then open the files it names and hand
 * their bytes to a GPU driver, so the reader trusts nothing: every field is
 * type- and range-checked, a file must be a plain name inside the bundle,
 * keys and files are unique, and every failure names the field
 * ("kernels[3].key: expected 64 lowercase hex digits"). It is a fuzz target
 * (tests/fuzz/fuzz_manifest.c): no input may crash it, leak, or parse into
 * something that does not write back and read again the same.
 *
 * The file checks (size, SHA-256, cubin header) live here too, so a bundle
 * is written and verified by one piece of code.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "base/msg.h"
#include "dragon/cubin.h"
#include "dragon/manifest.h"
#include "base/sha256.h"

#define MAX_SAFE_INT 9007199254740992.0 /* 2^53: integers a double holds */

static dg_status nomem(char *msg, size_t size)
{
	return dg__msgf(DG_ERR_NOMEM, msg, size,
			"out of memory reading the manifest");
}

void dg_manifest_destroy(dg_manifest *m)
{
	if (!m)
		return;
	for (size_t i = 0; m->kernels && i < m->n_kernels; i++) {
		dg_manifest_kernel *k = &m->kernels[i];
		free(k->file);
		for (int e = 0; k->entries && e < k->n_entries; e++)
			free(k->entries[e]);
		free(k->entries);
		free(k->threads);
		free(k->smem);
	}
	free(m->kernels);
	free(m->generator_version);
	free(m->device);
	free(m->nvrtc_version);
	free(m->created);
	free(m);
}

/* ---- field checks ----------------------------------------------------------- */

/* The members of one object that we know, found in a single pass so a
 * known name given twice is caught (cJSON keeps duplicates; GetObjectItem
 * would silently take the first). */
#define MAX_FIELDS 12

typedef struct fields {
	const char *const *names;
	size_t n;
	const cJSON *item[MAX_FIELDS];
} fields;

static dg_status collect(const cJSON *obj, fields *f, const char *path,
			 char *msg, size_t size)
{
	memset(f->item, 0, sizeof(f->item));
	for (const cJSON *c = obj->child; c; c = c->next) {
		if (!c->string)
			continue;
		for (size_t i = 0; i < f->n; i++) {
			if (strcmp(c->string, f->names[i]) != 0)
				continue;
			if (f->item[i])
				return dg__msgf(DG_ERR_PARSE, msg, size,
						"%s%s: given twice", path,
						f->names[i]);
			f->item[i] = c;
		}
	}
	return DG_OK;
}

static const cJSON *field(const fields *f, const char *name)
{
	for (size_t i = 0; i < f->n; i++)
		if (strcmp(f->names[i], name) == 0)
			return f->item[i];
	return NULL;
}

typedef enum str_kind {
	STR_TEXT,  /* printable ASCII */
	STR_FILE,  /* plain file name: [A-Za-z0-9._+-], not starting with '.' */
	STR_IDENT, /* C identifier */
	STR_HEX64, /* 64 lowercase hex digits */
} str_kind;

static bool str_ok(const char *s, str_kind kind)
{
	size_t n = strlen(s);

	if (kind == STR_HEX64) {
		if (n != DG_CACHE_KEY_LEN)
			return false;
		for (size_t i = 0; i < n; i++)
			if (!isdigit((unsigned char)s[i]) &&
			    !(s[i] >= 'a' && s[i] <= 'f'))
				return false;
		return true;
	}
	if (n == 0 || n > DG_MANIFEST_MAX_NAME)
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		bool ok = kind == STR_TEXT ? c >= 0x20 && c < 0x7f
			: kind == STR_FILE ? isalnum(c) || c == '.' || c == '_' ||
						     c == '-' || c == '+'
					   : isalnum(c) || c == '_';
		if (!ok || c > 0x7f)
			return false;
	}
	if (kind == STR_FILE && s[0] == '.')
		return false;
	if (kind == STR_IDENT && isdigit((unsigned char)s[0]))
		return false;
	return true;
}

static const char *const str_expect[] = {
	[STR_TEXT] = "expected a string of 1 to 255 printable ASCII characters",
	[STR_FILE] = "expected a plain file name (letters, digits, . _ + -; not starting with '.'; no '/')",
	[STR_IDENT] = "expected a C identifier",
	[STR_HEX64] = "expected 64 lowercase hex digits",
};

static dg_status get_str(const cJSON *it, const char *path, const char *name,
			 str_kind kind, const char **out, char *msg,
			 size_t size)
{
	if (!it)
		return dg__msgf(DG_ERR_PARSE, msg, size, "%s%s: missing", path,
				name);
	if (!cJSON_IsString(it) || !it->valuestring)
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"%s%s: expected a string", path, name);
	if (!str_ok(it->valuestring, kind))
		return dg__msgf(DG_ERR_PARSE, msg, size, "%s%s: %s", path, name,
				str_expect[kind]);
	*out = it->valuestring;
	return DG_OK;
}

static dg_status dup_str(const cJSON *it, const char *path, const char *name,
			 str_kind kind, char **out, char *msg, size_t size)
{
	const char *s = NULL;
	dg_status st = get_str(it, path, name, kind, &s, msg, size);
	if (st)
		return st;
	*out = strdup(s);
	return *out ? DG_OK : nomem(msg, size);
}

static dg_status get_num(const cJSON *it, const char *path, const char *name,
			 double lo, double hi, bool integer, double *out,
			 char *msg, size_t size)
{
	if (!it)
		return dg__msgf(DG_ERR_PARSE, msg, size, "%s%s: missing", path,
				name);
	if (!cJSON_IsNumber(it))
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"%s%s: expected a number", path, name);
	double v = it->valuedouble;
	if (!isfinite(v) || v < lo || v > hi || (integer && v != floor(v)))
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"%s%s: expected %s from %.17g to %.17g", path,
				name, integer ? "an integer" : "a number", lo,
				hi);
	*out = v;
	return DG_OK;
}

static dg_status get_bool(const cJSON *it, const char *path, const char *name,
			  bool *out, char *msg, size_t size)
{
	if (!it)
		return dg__msgf(DG_ERR_PARSE, msg, size, "%s%s: missing", path,
				name);
	if (!cJSON_IsBool(it))
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"%s%s: expected true or false", path, name);
	*out = cJSON_IsTrue(it);
	return DG_OK;
}

/* ---- reader ---------------------------------------------------------------- */

static const char *const kernel_names[] = {
	"spec", "key", "file", "entries", "arch", "ptx",
	"compile_ms", "cache_hit", "size", "sha256",
};

static dg_status parse_spec(const cJSON *it, const char *path,
			    dg_manifest_kernel *k, char *msg, size_t size)
{
	const char *text;
	char why[256], canon[DG_SPEC_TEXT_MAX];
	dg_spec spec;
	dg_status st = get_str(it, path, "spec", STR_TEXT, &text, msg, size);

	if (st)
		return st;
	if (strlen(text) >= sizeof(k->spec))
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"%sspec: longer than %d characters", path,
				DG_SPEC_TEXT_MAX - 1);
	if (dg_spec_parse(text, &spec, why, sizeof(why)))
		return dg__msgf(DG_ERR_PARSE, msg, size, "%sspec: %s", path,
				why);
	if (dg_spec_to_string(&spec, canon, sizeof(canon)) ||
	    strcmp(canon, text) != 0)
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"%sspec: not in canonical form; expected \"%s\"",
				path, canon);
	memcpy(k->spec, text, strlen(text) + 1);
	return DG_OK;
}

static const char *const entry_names[] = { "name", "threads", "smem" };

static dg_status parse_entries(const cJSON *it, const char *path,
			       dg_manifest_kernel *k, char *msg, size_t size)
{
	char epath[96];
	double v;

	if (!it)
		return dg__msgf(DG_ERR_PARSE, msg, size, "%sentries: missing",
				path);
	if (!cJSON_IsArray(it))
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"%sentries: expected an array of { name, threads, smem }", path);
	int n = cJSON_GetArraySize(it);
	if (n < 1 || n > DG_MANIFEST_MAX_ENTRIES)
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"%sentries: expected 1 to %d entries, got %d",
				path, DG_MANIFEST_MAX_ENTRIES, n);
	k->entries = calloc((size_t)n, sizeof(*k->entries));
	k->threads = calloc((size_t)n, sizeof(*k->threads));
	k->smem = calloc((size_t)n, sizeof(*k->smem));
	if (!k->entries || !k->threads || !k->smem)
		return nomem(msg, size);
	int i = 0;
	for (const cJSON *e = it->child; e; e = e->next, i++) {
		fields f = { entry_names, sizeof(entry_names) / sizeof(entry_names[0]), { 0 } };
		dg_status st;
		snprintf(epath, sizeof(epath), "%sentries[%d].", path, i);
		if (!cJSON_IsObject(e))
			return dg__msgf(DG_ERR_PARSE, msg, size,
					"%sentries[%d]: expected an object { name, threads, smem }",
					path, i);
		if ((st = collect(e, &f, epath, msg, size)))
			return st;
		st = dup_str(field(&f, "name"), epath, "name", STR_IDENT, &k->entries[i], msg, size);
		if (st)
			return st;
		k->n_entries = i + 1;
		if ((st = get_num(field(&f, "threads"), epath, "threads", 1, 1024, true, &v, msg,
				  size)))
			return st;
		k->threads[i] = (int)v;
		if ((st = get_num(field(&f, "smem"), epath, "smem", 0, 1 << 30, true, &v, msg,
				  size)))
			return st;
		k->smem[i] = (int)v;
	}
	return DG_OK;
}

static dg_status parse_kernel(const cJSON *obj, size_t idx,
			      dg_manifest_kernel *k, char *msg, size_t size)
{
	char path[48];
	fields f = { kernel_names, sizeof(kernel_names) / sizeof(kernel_names[0]),
		     { 0 } };
	const char *s;
	double v;
	dg_status st;

	snprintf(path, sizeof(path), "kernels[%zu].", idx);
	if (!cJSON_IsObject(obj))
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"kernels[%zu]: expected an object", idx);
	if ((st = collect(obj, &f, path, msg, size)))
		return st;
	if ((st = parse_spec(field(&f, "spec"), path, k, msg, size)))
		return st;
	if ((st = get_str(field(&f, "key"), path, "key", STR_HEX64, &s, msg,
			  size)))
		return st;
	memcpy(k->key, s, DG_CACHE_KEY_LEN + 1);
	if ((st = dup_str(field(&f, "file"), path, "file", STR_FILE, &k->file,
			  msg, size)))
		return st;
	if ((st = parse_entries(field(&f, "entries"), path, k, msg, size)))
		return st;
	if ((st = get_num(field(&f, "arch"), path, "arch", 10, 999, true, &v,
			  msg, size)))
		return st;
	k->arch = (int)v;
	if ((st = get_bool(field(&f, "ptx"), path, "ptx", &k->ptx, msg, size)))
		return st;
	if ((st = get_num(field(&f, "compile_ms"), path, "compile_ms", 0, 1e12,
			  false, &k->compile_ms, msg, size)))
		return st;
	if ((st = get_bool(field(&f, "cache_hit"), path, "cache_hit",
			   &k->cache_hit, msg, size)))
		return st;
	if ((st = get_num(field(&f, "size"), path, "size", 0, MAX_SAFE_INT, true,
			  &v, msg, size)))
		return st;
	k->size = (uint64_t)v;
	if ((st = get_str(field(&f, "sha256"), path, "sha256", STR_HEX64, &s,
			  msg, size)))
		return st;
	memcpy(k->sha256, s, DG_CACHE_KEY_LEN + 1);
	return DG_OK;
}

typedef struct named {
	const char *s;
	size_t i;
} named;

static int cmp_named(const void *a, const void *b)
{
	const named *x = a, *y = b;
	int c = strcmp(x->s, y->s);
	return c ? c : (x->i > y->i) - (x->i < y->i);
}

/* Two kernels with one key (or one file) would make the bundle ambiguous.
 * Sorting keeps this O(n log n) for large manifests. */
static dg_status check_unique(const dg_manifest *m, bool by_file, char *msg,
			      size_t size)
{
	const char *name = by_file ? "file" : "key";

	if (m->n_kernels < 2)
		return DG_OK;
	named *v = malloc(m->n_kernels * sizeof(*v));
	if (!v)
		return nomem(msg, size);
	for (size_t i = 0; i < m->n_kernels; i++)
		v[i] = (named){ by_file ? m->kernels[i].file : m->kernels[i].key,
				i };
	qsort(v, m->n_kernels, sizeof(*v), cmp_named);
	dg_status st = DG_OK;
	for (size_t i = 1; i < m->n_kernels; i++) {
		if (strcmp(v[i - 1].s, v[i].s) == 0) {
			st = dg__msgf(DG_ERR_PARSE, msg, size,
				      "kernels[%zu].%s: same as kernels[%zu].%s",
				      v[i].i, name, v[i - 1].i, name);
			break;
		}
	}
	free(v);
	return st;
}

static const char *const top_names[] = {
	"format", "generator_version", "template_hash", "nvrtc_version", "created",
	"device", "sm", "kernels",
};

static dg_status parse_root(const cJSON *root, dg_manifest *m, char *msg,
			    size_t size)
{
	fields f = { top_names, sizeof(top_names) / sizeof(top_names[0]), { 0 } };
	double v;
	dg_status st;

	if (!cJSON_IsObject(root))
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"manifest: expected a JSON object");
	if ((st = collect(root, &f, "", msg, size)))
		return st;
	const cJSON *fmt = field(&f, "format");
	if (!fmt)
		return dg__msgf(DG_ERR_PARSE, msg, size, "format: missing");
	if ((st = get_num(fmt, "", "format", 0, 1e9, true, &v, msg, size)))
		return st;
	if (v != DG_MANIFEST_FORMAT)
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"format: version %.0f is not supported (this dragon reads %d); rebuild the bundle with this dragon-gen",
				v, DG_MANIFEST_FORMAT);
	m->format = DG_MANIFEST_FORMAT;
	if ((st = dup_str(field(&f, "generator_version"), "", "generator_version",
			  STR_TEXT, &m->generator_version, msg, size)) ||
	    (st = dup_str(field(&f, "nvrtc_version"), "", "nvrtc_version",
			  STR_TEXT, &m->nvrtc_version, msg, size)) ||
	    (st = dup_str(field(&f, "created"), "", "created", STR_TEXT,
			  &m->created, msg, size)))
		return st;
	const char *th;
	if ((st = get_str(field(&f, "template_hash"), "", "template_hash", STR_HEX64, &th, msg,
			  size)))
		return st;
	memcpy(m->template_hash, th, DG_CACHE_KEY_LEN + 1);
	const cJSON *dv = field(&f, "device");
	if (!dv)
		return dg__msgf(DG_ERR_PARSE, msg, size, "device: missing");
	if (!cJSON_IsString(dv) || !dv->valuestring)
		return dg__msgf(DG_ERR_PARSE, msg, size, "device: expected a string (\"\": none)");
	if (dv->valuestring[0] && !str_ok(dv->valuestring, STR_TEXT))
		return dg__msgf(DG_ERR_PARSE, msg, size, "device: %s", str_expect[STR_TEXT]);
	m->device = strdup(dv->valuestring);
	if (!m->device)
		return nomem(msg, size);
	if ((st = get_num(field(&f, "sm"), "", "sm", 0, 999, true, &v, msg, size)))
		return st;
	m->sm = (int)v;
	const cJSON *ks = field(&f, "kernels");
	if (!ks)
		return dg__msgf(DG_ERR_PARSE, msg, size, "kernels: missing");
	if (!cJSON_IsArray(ks))
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"kernels: expected an array");
	int n = cJSON_GetArraySize(ks);
	if (n > DG_MANIFEST_MAX_KERNELS)
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"kernels: %d entries; at most %d", n,
				DG_MANIFEST_MAX_KERNELS);
	if (n > 0) {
		m->kernels = calloc((size_t)n, sizeof(*m->kernels));
		if (!m->kernels)
			return nomem(msg, size);
	}
	size_t i = 0;
	for (const cJSON *k = ks->child; k; k = k->next, i++) {
		m->n_kernels = i + 1; /* so destroy frees what is filled */
		if ((st = parse_kernel(k, i, &m->kernels[i], msg, size)))
			return st;
	}
	if ((st = check_unique(m, false, msg, size)))
		return st;
	return check_unique(m, true, msg, size);
}

/* 1-based line and column of offset off in json. */
static void locate(const char *json, size_t off, size_t *line, size_t *col)
{
	*line = 1;
	*col = 1;
	for (size_t i = 0; i < off; i++) {
		if (json[i] == '\n') {
			++*line;
			*col = 1;
		} else {
			++*col;
		}
	}
}

/* Offset of the first \u0000 escape in json, or len. cJSON decodes it to a
 * NUL that silently cuts the string short ("a\u0000b" would read as "a"),
 * so it is refused before parsing. Backslashes pair off, so "\\u0000"
 * (an escaped backslash, then text) is not one. */
static size_t find_nul_escape(const char *json, size_t len)
{
	for (size_t i = 0; i + 1 < len; i++) {
		if (json[i] != '\\')
			continue;
		if (json[i + 1] == 'u' && i + 6 <= len &&
		    memcmp(json + i + 2, "0000", 4) == 0)
			return i;
		i++; /* skip the escaped character */
	}
	return len;
}

dg_status dg_manifest_parse(const char *json, size_t len, dg_manifest **out,
			    char *msg, size_t size)
{
	const char *end = NULL;
	size_t line, col;

	if (!out)
		return DG_ERR_INVALID_ARG;
	*out = NULL;
	if (!json)
		return dg__msgf(DG_ERR_PARSE, msg, size, "manifest: no text");
	if (len > DG_MANIFEST_MAX_BYTES)
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"manifest: %zu bytes; at most %zu", len,
				DG_MANIFEST_MAX_BYTES);
	const char *nul = memchr(json, '\0', len);
	if (nul)
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"manifest: NUL byte at offset %zu; a manifest is JSON text",
				(size_t)(nul - json));
	size_t esc = find_nul_escape(json, len);
	if (esc < len) {
		locate(json, esc, &line, &col);
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"manifest: \\u0000 at line %zu, column %zu; no manifest string holds a NUL",
				line, col);
	}
	cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
	if (!root) {
		size_t off = end && end >= json && end <= json + len
				     ? (size_t)(end - json)
				     : len;
		/* A manifest ends with its closing brace; one that does not
		 * was most likely cut short. */
		size_t last = len;
		while (last > 0 && isspace((unsigned char)json[last - 1]))
			last--;
		locate(json, off, &line, &col);
		return dg__msgf(DG_ERR_PARSE, msg, size,
				"manifest: invalid JSON at line %zu, column %zu%s",
				line, col,
				last == 0 || json[last - 1] != '}' ? " (truncated?)" : "");
	}
	for (const char *p = end ? end : json + len; p < json + len; p++) {
		if (!isspace((unsigned char)*p)) {
			locate(json, (size_t)(p - json), &line, &col);
			cJSON_Delete(root);
			return dg__msgf(DG_ERR_PARSE, msg, size,
					"manifest: text after the JSON value at line %zu, column %zu",
					line, col);
		}
	}
	dg_manifest *m = calloc(1, sizeof(*m));
	if (!m) {
		cJSON_Delete(root);
		return nomem(msg, size);
	}
	dg_status st = parse_root(root, m, msg, size);
	cJSON_Delete(root);
	if (st) {
		dg_manifest_destroy(m);
		return st;
	}
	*out = m;
	return DG_OK;
}

/* ---- writer --------------------------------------------------------------- */

static dg_status inval(char *msg, size_t size, const char *what)
{
	return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "manifest: %s", what);
}

/* Numbers are written by us, not by cJSON: its printer rounds to 15
 * significant digits when that reads back "close enough", which changes
 * large sizes and compile times. Integers print exactly; doubles print
 * with 17 digits, which strtod reads back to the same bits. */
static bool add_raw_number(cJSON *o, const char *name, bool integer,
			   double v)
{
	char buf[64];
	if (integer)
		snprintf(buf, sizeof(buf), "%.0f", v);
	else
		snprintf(buf, sizeof(buf), "%.17g", v);
	return cJSON_AddRawToObject(o, name, buf) != NULL;
}

static cJSON *kernel_json(const dg_manifest_kernel *k)
{
	cJSON *o = cJSON_CreateObject();
	cJSON *e = cJSON_CreateArray();
	if (!o || !e) {
		cJSON_Delete(o);
		cJSON_Delete(e);
		return NULL;
	}
	for (int i = 0; i < k->n_entries; i++) {
		cJSON *x = cJSON_CreateObject();
		bool in = x && cJSON_AddItemToArray(e, x);
		if (x && !in)
			cJSON_Delete(x);
		if (!in || !cJSON_AddStringToObject(x, "name", k->entries[i]) ||
		    !add_raw_number(x, "threads", true, k->threads[i]) ||
		    !add_raw_number(x, "smem", true, k->smem[i])) {
			cJSON_Delete(o);
			cJSON_Delete(e); /* and the entries added to it */
			return NULL;
		}
	}
	bool ok = cJSON_AddStringToObject(o, "spec", k->spec) &&
		  cJSON_AddStringToObject(o, "key", k->key) &&
		  cJSON_AddStringToObject(o, "file", k->file) &&
		  cJSON_AddItemToObject(o, "entries", e);
	if (!ok)
		cJSON_Delete(e);
	ok = ok && add_raw_number(o, "arch", true, k->arch) &&
	     cJSON_AddBoolToObject(o, "ptx", k->ptx) &&
	     add_raw_number(o, "compile_ms", false, k->compile_ms) &&
	     cJSON_AddBoolToObject(o, "cache_hit", k->cache_hit) &&
	     add_raw_number(o, "size", true, (double)k->size) &&
	     cJSON_AddStringToObject(o, "sha256", k->sha256);
	if (!ok) {
		cJSON_Delete(o);
		return NULL;
	}
	return o;
}

static dg_status check_writable(const dg_manifest *m, char *msg, size_t size)
{
	if (!m->generator_version || !m->nvrtc_version || !m->created || !m->device)
		return inval(msg, size, "a version, device or date string is NULL");
	if (memchr(m->template_hash, '\0', sizeof(m->template_hash)) == NULL)
		return inval(msg, size, "template_hash is not a string");
	if (m->n_kernels && !m->kernels)
		return inval(msg, size, "kernels is NULL");
	for (size_t i = 0; i < m->n_kernels; i++) {
		const dg_manifest_kernel *k = &m->kernels[i];
		if (!k->file || (k->n_entries && (!k->entries || !k->threads || !k->smem)) ||
		    k->n_entries < 0 || !isfinite(k->compile_ms) ||
		    (double)k->size > MAX_SAFE_INT ||
		    memchr(k->spec, '\0', sizeof(k->spec)) == NULL ||
		    memchr(k->key, '\0', sizeof(k->key)) == NULL ||
		    memchr(k->sha256, '\0', sizeof(k->sha256)) == NULL)
			return inval(msg, size, "a kernel has a field JSON cannot hold");
		for (int e = 0; e < k->n_entries; e++)
			if (!k->entries[e])
				return inval(msg, size, "an entry name is NULL");
	}
	return DG_OK;
}

dg_status dg_manifest_to_json(const dg_manifest *m, char **out, char *msg,
			      size_t size)
{
	dg_status st;

	if (!out)
		return DG_ERR_INVALID_ARG;
	*out = NULL;
	if (!m)
		return inval(msg, size, "manifest is NULL");
	if ((st = check_writable(m, msg, size)))
		return st;
	cJSON *root = cJSON_CreateObject();
	cJSON *ks = cJSON_CreateArray();
	bool ok = root && ks &&
		  add_raw_number(root, "format", true, m->format) &&
		  cJSON_AddStringToObject(root, "generator_version",
					  m->generator_version) &&
		  cJSON_AddStringToObject(root, "template_hash", m->template_hash) &&
		  cJSON_AddStringToObject(root, "nvrtc_version", m->nvrtc_version) &&
		  cJSON_AddStringToObject(root, "created", m->created) &&
		  cJSON_AddStringToObject(root, "device", m->device) &&
		  add_raw_number(root, "sm", true, m->sm) &&
		  cJSON_AddItemToObject(root, "kernels", ks);
	if (!ok)
		cJSON_Delete(ks);
	for (size_t i = 0; ok && i < m->n_kernels; i++) {
		cJSON *k = kernel_json(&m->kernels[i]);
		ok = k && cJSON_AddItemToArray(ks, k);
	}
	char *text = ok ? cJSON_Print(root) : NULL;
	cJSON_Delete(root);
	if (!text)
		return nomem(msg, size);
	size_t n = strlen(text);
	*out = malloc(n + 2);
	if (*out) {
		memcpy(*out, text, n);
		memcpy(*out + n, "\n", 2);
	}
	cJSON_free(text);
	return *out ? DG_OK : nomem(msg, size);
}

/* ---- loader ---------------------------------------------------------------- */

dg_status dg_manifest_load(const char *dir, dg_manifest **out, char *msg,
			   size_t size)
{
	char path[4096], why[1024];
	struct stat sb;
	dg_status st = DG_OK;

	if (!out)
		return DG_ERR_INVALID_ARG;
	*out = NULL;
	if (!dir)
		return inval(msg, size, "bundle folder is NULL");
	snprintf(path, sizeof(path), "%s/%s", dir, DG_MANIFEST_FILE);
	FILE *f = fopen(path, "rb");
	if (!f) {
		int e = errno;
		return dg__msgf(e == ENOENT ? DG_ERR_NOT_FOUND : DG_ERR_IO, msg,
				size, "%s: %s%s", path, strerror(e),
				e == ENOENT ? " (not a bundle? make one with `dragon-gen build --out DIR`)"
					    : "");
	}
	char *buf = NULL;
	if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
		st = DG_ERR_IO;
		snprintf(why, sizeof(why), "not a regular file");
		goto out;
	}
	if ((uint64_t)sb.st_size > DG_MANIFEST_MAX_BYTES) {
		st = DG_ERR_PARSE;
		snprintf(why, sizeof(why), "%lld bytes; at most %zu",
			 (long long)sb.st_size, DG_MANIFEST_MAX_BYTES);
		goto out;
	}
	buf = malloc((size_t)sb.st_size + 1);
	if (!buf) {
		st = DG_ERR_NOMEM;
		snprintf(why, sizeof(why), "out of memory");
		goto out;
	}
	size_t n = fread(buf, 1, (size_t)sb.st_size, f);
	if (ferror(f) || n != (size_t)sb.st_size) {
		st = DG_ERR_IO;
		snprintf(why, sizeof(why), "read error (changed while reading?)");
		goto out;
	}
	st = dg_manifest_parse(buf, n, out, why, sizeof(why));
out:
	fclose(f);
	free(buf);
	if (st && msg && size)
		snprintf(msg, size, "%s: %s", path, why);
	return st;
}

/* ---- files ----------------------------------------------------------------- */

void dg_manifest_kernel_hash(dg_manifest_kernel *k, const void *bytes,
			     size_t size)
{
	uint8_t d[32];

	dg__sha256_digest(bytes, size, d);
	dg__sha256_hex(d, k->sha256);
	k->size = size;
}

dg_status dg_manifest_kernel_verify(const dg_manifest_kernel *k,
				    const void *bytes, size_t size, char *msg,
				    size_t msg_size)
{
	dg_manifest_kernel got;

	if (!k || (!bytes && size))
		return inval(msg, msg_size, "kernel or bytes is NULL");
	if (size != k->size)
		return dg__msgf(DG_ERR_CORRUPT, msg, msg_size,
				"%zu bytes; the manifest says %llu%s", size,
				(unsigned long long)k->size,
				size < k->size ? " (truncated?)" : "");
	dg_manifest_kernel_hash(&got, bytes ? bytes : "", size);
	if (strcmp(got.sha256, k->sha256) != 0)
		return dg__msgf(DG_ERR_CORRUPT, msg, msg_size,
				"SHA-256 %.16s... differs from the manifest's %.16s... (the file changed after the build)",
				got.sha256, k->sha256);
	if (k->ptx) {
		if (msg && msg_size)
			msg[0] = '\0';
		return DG_OK;
	}
	return dg_cubin_check(bytes, size, k->arch, msg, msg_size);
}
